package client_test

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/rlfn/rlfn/client"
)

// replyClient answers every command with one reply. Its builder is mock.Client's, which is
// valkey-go's own; gomock's expectations are left out because matching a call costs more than
// the client does.
type replyClient struct {
	*mock.Client
	reply valkey.ValkeyResult
}

func (c replyClient) Do(context.Context, valkey.Completed) valkey.ValkeyResult { return c.reply }

func (c replyClient) DoMulti(_ context.Context, cmds ...valkey.Completed) []valkey.ValkeyResult {
	res := make([]valkey.ValkeyResult, len(cmds))
	for i := range res {
		res[i] = c.reply
	}
	return res
}

// BenchmarkAllow is the client's own cost per decision: validation, key, command, decoding.
// A real valkey-go client recycles each command after Do; this one cannot (the pool is
// internal), so the numbers include building one command from scratch (BenchmarkBuilder).
func BenchmarkAllow(b *testing.B) {
	benchmarkAllow(b, newLimiter(b, replyClient{mock.NewClient(nil), mock.Result(ints(1, 100, 99, 0, 1000, 0))}, client.Options{}))
}

// BenchmarkAllowRequestContext is BenchmarkAllow with a context that can be canceled, as an
// HTTP request's: the call then gets a timer of its own, so that a cancel ends it at once.
func BenchmarkAllowRequestContext(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	benchmarkAllowCtx(b, ctx, newLimiter(b, replyClient{mock.NewClient(nil), mock.Result(ints(1, 100, 99, 0, 1000, 0))}, client.Options{}))
}

// BenchmarkAllowMetrics is BenchmarkAllow recording metrics with the OpenTelemetry SDK.
func BenchmarkAllowMetrics(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	benchmarkAllow(b, newLimiter(b, replyClient{mock.NewClient(nil), mock.Result(ints(1, 100, 99, 0, 1000, 0))}, client.Options{
		MeterProvider: mp,
	}))
}

var benchLimits = []client.Limit{
	client.FixedWindow{Limit: 100, Window: time.Minute},
	client.SlidingLog{Limit: 100, Window: time.Minute},
	client.SlidingWindow{Limit: 100, Window: time.Minute},
	client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second},
	client.LeakyBucket{Capacity: 100, Rate: 10, Period: time.Second, Mode: client.Shape},
}

func benchName(l client.Limit) string { return client.KeyOf("", "", l)[len("{%}:"):] }

func benchmarkAllow(b *testing.B, lim *client.Limiter) {
	benchmarkAllowCtx(b, context.Background(), lim)
}

func benchmarkAllowCtx(b *testing.B, ctx context.Context, lim *client.Limiter) {
	for _, l := range benchLimits {
		b.Run(benchName(l), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := lim.Allow(ctx, "user:42", l); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkBuilder is the part of BenchmarkAllow a real client recycles: one command built
// from constant strings.
func BenchmarkBuilder(b *testing.B) {
	vk := mock.NewClient(nil)
	b.ReportAllocs()
	for b.Loop() {
		_ = vk.B().Fcall().Function("rl_token_bucket").Numkeys(1).Key("rl:{user:42}:token_bucket").
			Arg("100", "10", "1000", "1").Build()
	}
}

// BenchmarkLocalFallback is the cost of a decision made by the local fallback, the breaker
// open: one key, then 10000 keys from parallel goroutines (the store's shards at work).
func BenchmarkLocalFallback(b *testing.B) {
	vk := replyClient{mock.NewClient(nil), mock.ErrorResult(context.DeadlineExceeded)}
	ctx := context.Background()
	openLimiter := func(b *testing.B) *client.Limiter {
		lim := newLimiter(b, vk, client.Options{
			Fallback:        client.LocalFallback,
			Instances:       4,
			BreakerFailures: 1,
			BreakerCooldown: time.Hour,
		})
		if r, err := lim.Allow(ctx, "open", benchLimits[0]); err != nil || r.Source != client.FromFallback {
			b.Fatalf("the breaker did not open: %+v, %v", r, err)
		}
		return lim
	}
	for _, l := range benchLimits {
		b.Run(benchName(l), func(b *testing.B) {
			lim := openLimiter(b)
			b.ReportAllocs()
			for b.Loop() {
				if r, err := lim.Allow(ctx, "user:42", l); err != nil || r.Source != client.FromFallback {
					b.Fatal(r, err)
				}
			}
		})
	}
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
	}
	for _, l := range benchLimits {
		b.Run(benchName(l)+"/parallel_10000_keys", func(b *testing.B) {
			lim := openLimiter(b)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					if r, err := lim.Allow(ctx, keys[i%len(keys)], l); err != nil || r.Source != client.FromFallback {
						b.Fatal(r, err)
					}
					i += 7
				}
			})
		})
	}
}

// BenchmarkLeasedHotKey is the cost of a decision served from a leased budget, 64 goroutines
// on one key (RunParallel with 32 per GOMAXPROCS on 2): what the budget's locks cost when every
// caller wants the same key. The reply admits every batch, so nearly every call is a local hit.
func BenchmarkLeasedHotKey(b *testing.B) {
	lim := newLimiter(b, replyClient{mock.NewClient(nil), mock.Result(ints(1, 1_000_000, 999_000, 0, 1000, 0))}, client.Options{
		BudgetBatch: 256,
		BudgetAge:   time.Minute,
	})
	defer lim.Close(context.Background())
	limit := client.Limit(client.TokenBucket{Capacity: 1_000_000, Rate: 1, Period: time.Hour})
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(64 / max(1, runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if r, err := lim.Allow(ctx, "hot", limit); err != nil || !r.Allowed {
				b.Fatal(r, err)
			}
		}
	})
}

// BenchmarkAllowColdKeys is the cost of a decision on keys that never get a leased budget
// (10,000 principals in turn, none called twice within a quarter of the budgets' maximum age),
// with leased budgets and without: what the budgets cost the spread case, whose every call
// goes to the server anyway. The reply is a mock's, so only the client's work is measured.
func BenchmarkAllowColdKeys(b *testing.B) {
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
	}
	limit := client.Limit(client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second})
	ctx := context.Background()
	leased := client.Options{BudgetBatch: 256, BudgetAge: time.Millisecond}
	for _, tc := range []struct {
		name string
		opts client.Options
		hot  int // keys made hot first, so that the shards hold budgets, as in the spread case
	}{
		{"per_call", client.Options{}, 0},
		// a key's calls are 10,000 calls apart, far more than a quarter of 1ms
		{"leased", leased, 0},
		// the spread case against a server: random arrivals make a few keys look hot now and
		// then (about 1,000 budgets in 200,000 calls), and nearly every shard holds one
		{"leased_among_budgets", leased, 1000},
	} {
		b.Run(tc.name, func(b *testing.B) {
			lim := newLimiter(b, replyClient{mock.NewClient(nil), mock.Result(ints(1, 100, 99, 0, 1000, 0))}, tc.opts)
			defer lim.Close(ctx)
			for i := range tc.hot {
				// three calls in a row: the third makes the key's budget
				for range 3 {
					if _, err := lim.Allow(ctx, "hot:"+strconv.Itoa(i), limit); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if r, err := lim.Allow(ctx, keys[i%len(keys)], limit); err != nil || r.Source == client.FromLease {
					b.Fatal(r, err)
				}
				i++
			}
		})
	}
}
