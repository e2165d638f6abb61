package client_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"
	"go.uber.org/mock/gomock"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/override"
)

// storeClient is replyClient with an overrides store of version 1, a base of one hash that
// holds store: the head (HGET, HGETALL), the base (HSCAN, in one page), an empty delta and log,
// as a server would answer (DoCache as Do: the Limiter's background reads are not what these
// measure).
type storeClient struct {
	replyClient
	store map[string]string
}

func (c storeClient) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	args := cmd.Commands()
	switch args[0] {
	case "HGET":
		return mock.Result(mock.ValkeyString("1"))
	case "HGETALL":
		return mock.Result(mock.ValkeyMap(map[string]valkey.ValkeyMessage{
			"version": mock.ValkeyString("1"), "gen": mock.ValkeyString("g"), "shards": mock.ValkeyString("1")}))
	case "HSCAN":
		var page []valkey.ValkeyMessage
		if args[1] == override.ShardKey("rl:", "g", 0) {
			for k, v := range c.store {
				page = append(page, mock.ValkeyString(k), mock.ValkeyString(v))
			}
		}
		return mock.Result(mock.ValkeyArray(mock.ValkeyString("0"), mock.ValkeyArray(page...)))
	case "XRANGE":
		return mock.Result(mock.ValkeyArray())
	case "EXISTS":
		return mock.Result(mock.ValkeyInt64(0))
	}
	return c.reply
}

func (c storeClient) DoCache(ctx context.Context, cmd valkey.Cacheable, _ time.Duration) valkey.ValkeyResult {
	return c.Do(ctx, valkey.Completed(cmd))
}

// overrideStore is a store of n overrides of the token bucket: n-1 exact keys cust:<i>, and
// the pattern cust:*.
func overrideStore(n int) map[string]string {
	store := map[string]string{}
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("cust:%d", i)
		if i == n-1 {
			key = "cust:*"
		}
		o := override.Override{Policy: override.Policy{Algorithm: "token_bucket"}, Key: key,
			Limit: override.Fields{Capacity: 500, Rate: 50, Period: "1s"}}
		store[override.FieldOf(o.ID())] = override.Encode(o)
	}
	return store
}

func storeLimiter(t testing.TB, n int) *client.Limiter {
	t.Helper()
	vk := storeClient{replyClient{mock.NewClient(nil), mock.Result(ints(1, 100, 99, 0, 1000, 0))}, overrideStore(n)}
	lim := newLimiter(t, vk, client.Options{Overrides: true})
	if err := lim.SyncOverrides(context.Background()); err != nil {
		t.Fatal(err)
	}
	return lim
}

// TestOverrideDecision: a decision under an override sends the override's limit, says so in
// Result.Override, and keeps the code's Name.
func TestOverrideDecision(t *testing.T) {
	lim := storeLimiter(t, 3) // cust:0, cust:1, cust:*
	code := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}
	for _, tt := range []struct {
		key, from string
	}{{"cust:0", "cust:0"}, {"cust:9", "cust:*"}, {"user:1", ""}} {
		res, err := lim.Allow(context.Background(), tt.key, code)
		if err != nil {
			t.Fatal(err)
		}
		from := ""
		if res.Override != nil {
			from = res.Override.Key
			if tb, ok := res.Override.Limit.(client.TokenBucket); !ok || tb.Capacity != 500 || tb.Rate != 50 || tb.Period != time.Second {
				t.Errorf("%s: Override.Limit = %#v", tt.key, res.Override.Limit)
			}
		}
		if from != tt.from {
			t.Errorf("%s: override %q, want %q", tt.key, from, tt.from)
		}
	}
	if err := newLimiter(t, replyClient{mock.NewClient(nil), okReply}, client.Options{}).SyncOverrides(context.Background()); err != client.ErrNoOverrides {
		t.Errorf("SyncOverrides without Options.Overrides: %v", err)
	}
}

// TestOverrideAllocations: the lookup adds no allocation to a decision.
func TestOverrideAllocations(t *testing.T) {
	plain := newLimiter(t, replyClient{mock.NewClient(nil), okReply}, client.Options{})
	lim := storeLimiter(t, 100)
	limit := client.Limit(client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second})
	ctx := context.Background()
	base := testing.AllocsPerRun(200, func() { plain.Allow(ctx, "cust:7", limit) })
	for _, key := range []string{"cust:7", "cust:x", "user:1"} {
		if n := testing.AllocsPerRun(200, func() { lim.Allow(ctx, key, limit) }); n > base {
			t.Errorf("Allow(%s) under overrides: %v allocations, %v without", key, n, base)
		}
	}
}

// BenchmarkAllowOverrides is BenchmarkAllow's token bucket with Options.Overrides: the store
// empty, then holding 10000 overrides of the bucket (one of them a pattern), for a key that
// has its own, one that only the pattern matches, and a limit no override names. Compare with
// BenchmarkAllow/token_bucket (benchstat, see docs/overrides.md).
func BenchmarkAllowOverrides(b *testing.B) {
	limit := client.Limit(client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second})
	other := client.Limit(client.FixedWindow{Limit: 100, Window: time.Minute})
	for _, tt := range []struct {
		name  string
		n     int
		key   string
		limit client.Limit
	}{
		{"empty", 0, "user:42", limit},
		{"exact", 10000, "cust:42", limit},
		{"exact_of_10", 10, "cust:4", limit},
		{"pattern", 10000, "cust:x", limit},
		{"other_limit", 10000, "cust:42", other},
	} {
		b.Run(tt.name, func(b *testing.B) {
			lim := storeLimiter(b, tt.n)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := lim.Allow(ctx, tt.key, tt.limit); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkOverrideMemory reports the heap a Limiter holds per override (B/override), with
// 100000 overrides of keys like cust:12345.
func BenchmarkOverrideMemory(b *testing.B) {
	const n = 1_000_000
	store := overrideStore(n)
	var per float64
	for b.Loop() {
		vk := storeClient{replyClient{mock.NewClient(nil), okReply}, store}
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		lim := newLimiter(b, vk, client.Options{Overrides: true})
		if err := lim.SyncOverrides(context.Background()); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		per = float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(lim)
	}
	b.ReportMetric(per, "B/override")
}

// TestResetCommand: Reset sends one DEL of the principal's keys: every unnamed limiter's
// (not its block), or the limits given.
func TestResetCommand(t *testing.T) {
	ctrl := gomock.NewController(t)
	vk := mock.NewClient(ctrl)
	lim := newLimiter(t, vk, client.Options{})
	vk.EXPECT().Do(gomock.Any(), mock.Match("DEL", "rl:{u:1}:fixed_window", "rl:{u:1}:sliding_log", "rl:{u:1}:sliding_window",
		"rl:{u:1}:token_bucket", "rl:{u:1}:leaky_bucket", "rl:{u:1}:concurrency", "rl:{u:1}:calendar")).Return(mock.Result(mock.ValkeyInt64(2)))
	if n, err := lim.Reset(context.Background(), "u:1"); err != nil || n != 2 {
		t.Errorf("Reset = %d, %v", n, err)
	}
	vk.EXPECT().Do(gomock.Any(), mock.Match("DEL", "rl:{u:1}:fixed_window:hourly")).Return(mock.Result(mock.ValkeyInt64(1)))
	if n, err := lim.Reset(context.Background(), "u:1", client.FixedWindow{Limit: 1, Window: time.Hour, Name: "hourly"}); err != nil || n != 1 {
		t.Errorf("Reset(hourly) = %d, %v", n, err)
	}
	var ke *client.KeyError
	if _, err := lim.Reset(context.Background(), ""); !errors.As(err, &ke) {
		t.Errorf("Reset of an empty key: %v, want a *KeyError", err)
	}
}

// TestApplyCommands: a small change is one MULTI of the delta's HSET (a removal: the value
// ""), the version's HINCRBY and the log's XADD, all in the slot of {%overrides}; a plan's
// apply WATCHes the head and checks its version first.
func TestApplyCommands(t *testing.T) {
	ctrl := gomock.NewController(t)
	vk := mock.NewClient(ctrl)
	store := override.NewStore(vk, "rl:")
	a := override.Override{Policy: override.Policy{Algorithm: "fixed_window"}, Key: "a", Limit: override.Fields{Limit: 1, Window: override.Duration(time.Hour)}}
	b := a
	b.Key = "b"
	d := mock.NewDedicatedClient(ctrl)
	vk.EXPECT().Dedicated(gomock.Any()).DoAndReturn(func(fn func(valkey.DedicatedClient) error) error { return fn(d) })
	fa, va, fb := override.FieldOf(a.ID()), override.Encode(a), override.FieldOf(b.ID())
	gomock.InOrder(
		d.EXPECT().DoMulti(gomock.Any(),
			mock.Match("WATCH", "rl:{%overrides}:head"),
			mock.Match("HGETALL", "rl:{%overrides}:head"),
			mock.Match("HLEN", "rl:{%overrides}:delta"),
		).Return([]valkey.ValkeyResult{
			mock.Result(mock.ValkeyString("OK")),
			mock.Result(mock.ValkeyMap(map[string]valkey.ValkeyMessage{"version": mock.ValkeyString("4"), "gen": mock.ValkeyString("g"), "shards": mock.ValkeyString("16")})),
			mock.Result(mock.ValkeyInt64(3)),
		}),
		d.EXPECT().DoMulti(gomock.Any(),
			mock.Match("MULTI"),
			mock.Match("HSET", "rl:{%overrides}:delta", fa, va, fb, ""),
			mock.Match("HINCRBY", "rl:{%overrides}:head", "version", "1"),
			mock.Match("XADD", "rl:{%overrides}:log", "MAXLEN", "~", "1000", "5-1", fa, va, fb, ""),
			mock.Match("EXEC"),
		).Return([]valkey.ValkeyResult{
			mock.Result(mock.ValkeyString("OK")), mock.Result(mock.ValkeyString("QUEUED")), mock.Result(mock.ValkeyString("QUEUED")),
			mock.Result(mock.ValkeyString("QUEUED")),
			mock.Result(mock.ValkeyArray(mock.ValkeyInt64(2), mock.ValkeyInt64(5), mock.ValkeyString("5-1"))),
		}),
	)
	v := "4"
	got, err := store.Apply(context.Background(), []override.Change{{Op: override.Add, New: &a}, {Op: override.Remove, Old: &b}}, &v)
	if err != nil || got != "5" {
		t.Errorf("Apply = %q, %v; want version 5", got, err)
	}
}

// readCounter is storeClient whose head's version is always ahead of what the log leads to,
// so that the background reader reads the server at every check (never settling into a
// poll a second), and which counts the reads.
type readCounter struct {
	storeClient
	reads *atomic.Int64
}

func (c readCounter) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	c.reads.Add(1)
	if cmd.Commands()[0] == "HGET" {
		return mock.Result(mock.ValkeyString("2"))
	}
	return c.storeClient.Do(ctx, cmd)
}

func (c readCounter) DoCache(ctx context.Context, cmd valkey.Cacheable, _ time.Duration) valkey.ValkeyResult {
	return c.Do(ctx, valkey.Completed(cmd))
}

// TestOverrideReaderStopsOnClose: Close stops the overrides' background reader, while the
// Limiter is still reachable: no read of the store follows Close's return.
func TestOverrideReaderStopsOnClose(t *testing.T) {
	reads := &atomic.Int64{}
	vk := readCounter{storeClient{replyClient{mock.NewClient(nil), okReply}, overrideStore(3)}, reads}
	lim := newLimiter(t, vk, client.Options{Overrides: true})
	for reads.Load() < 20 { // the reader runs: it reads every few milliseconds
		time.Sleep(time.Millisecond)
	}
	if err := lim.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	n := reads.Load()
	time.Sleep(200 * time.Millisecond) // a hundred of the reader's checks
	if got := reads.Load(); got != n {
		t.Errorf("%d reads of the store after Close returned, want none", got-n)
	}
	runtime.KeepAlive(lim)
	if err := lim.SyncOverrides(context.Background()); err != nil {
		t.Errorf("SyncOverrides after Close: %v", err)
	}
	if v := lim.OverridesVersion(); v != "1" {
		t.Errorf("OverridesVersion after Close = %q, want 1", v)
	}
}
