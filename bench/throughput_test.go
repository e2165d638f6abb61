package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/integration_test/harness"
)

// The throughput load: defaultCallers concurrent goroutines (RLFN_BENCH_CALLERS), each
// decision for a principal drawn at random from principals, under limits so large that every
// decision is admitted (the write path, the same one for every contender).
const (
	defaultCallers = 64
	principals     = 10000
	perSecond      = 1_000_000
)

// contender is one way of making a call per request.
type contender struct {
	name string
	stat string // the INFO commandstats entry its calls are counted under
	op   func(ctx context.Context, principal int) error
}

// throughputEnv is one Valkey 8 of the benchmark's own, with a client of each kind.
type throughputEnv struct {
	callers int
	vk      valkey.Client
	lim     *client.Limiter
	rr      *redis_rate.Limiter
}

// newThroughputEnv starts a Valkey 8 through the harness (in Docker, on 127.0.0.1; it skips
// without Docker, fails under CI=true) and connects:
//
//   - valkey-go with its defaults, as a service would have it: one client multiplexing every
//     goroutine over 2^PipelineMultiplex connections (2 with GOMAXPROCS 2, 4 from GOMAXPROCS
//     4), auto-pipelining concurrent calls into shared writes. RLFN_BENCH_FLUSH_DELAY sets its
//     MaxFlushDelay (e.g. 20us), RLFN_BENCH_MULTIPLEX its PipelineMultiplex (-1: one
//     connection), to see what they change;
//   - go-redis with a PoolSize of one per caller: one command in flight per connection and a connection
//     for each goroutine, its best case (its default pool, 10 per GOMAXPROCS, would queue
//     goroutines for a connection).
func newThroughputEnv(b *testing.B) *throughputEnv {
	callers := envInt(b, "RLFN_BENCH_CALLERS", defaultCallers)
	if callers < 1 {
		b.Fatalf("RLFN_BENCH_CALLERS=%d: want at least 1", callers)
	}
	opt := valkey.ClientOption{
		DisableCache: true, // no CLIENT TRACKING: the server does no tracking work
	}
	if v := os.Getenv("RLFN_BENCH_FLUSH_DELAY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("RLFN_BENCH_FLUSH_DELAY=%q: %v", v, err)
		}
		opt.MaxFlushDelay = d
	}
	if v := os.Getenv("RLFN_BENCH_MULTIPLEX"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			b.Fatalf("RLFN_BENCH_MULTIPLEX=%q: %v", v, err)
		}
		opt.PipelineMultiplex = n
	}

	s := harness.StartValkey(b)
	ctx := b.Context()
	opt.InitAddress = []string{s.Addr}
	vk, err := valkey.NewClient(opt)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(vk.Close)
	if err := vk.Do(ctx, vk.B().FunctionLoad().Replace().FunctionCode(functions.Source).Build()).Error(); err != nil {
		b.Fatalf("FUNCTION LOAD: %v", err)
	}
	rdb := redis.NewClient(&redis.Options{
		Addr:            s.Addr,
		Protocol:        3,
		DisableIdentity: true,
		PoolSize:        callers,
		MinIdleConns:    callers,
	})
	b.Cleanup(func() { rdb.Close() })
	// A deadline far beyond the client's default (100ms), which a call's tail can reach on a
	// loaded machine: this measures throughput, not the deadline, and still pays the cost of
	// setting one on every call.
	lim := client.New(vk, client.WithDeadline(time.Minute))
	e := &throughputEnv{callers: callers, vk: vk, lim: lim, rr: redis_rate.NewLimiter(rdb)}
	// Load redis_rate's script, so that every measured call is one EVALSHA.
	if _, err := e.rr.Allow(ctx, "warmup", redis_rate.PerSecond(perSecond)); err != nil {
		b.Fatalf("redis_rate warm-up: %v", err)
	}
	return e
}

// principalKeys are the principals' names, built once so that no contender pays for them.
var principalKeys = func() []string {
	keys := make([]string, principals)
	for i := range keys {
		keys[i] = fmt.Sprintf("p:%05d", i)
	}
	return keys
}()

// incrKeys are INCR's keys: each principal in the braces rlfn puts it in, so the keys are as
// long as rlfn's and spread alike.
var incrKeys = func() []string {
	keys := make([]string, principals)
	for i := range keys {
		keys[i] = client.Key("rl:", principalKeys[i], client.FixedWindow{}) + ":incr"
	}
	return keys
}()

func (e *throughputEnv) rlfn(name string, limit client.Limit) contender {
	return contender{name, "fcall", func(ctx context.Context, p int) error {
		res, err := e.lim.Allow(ctx, principalKeys[p], limit)
		if err == nil && !res.Allowed {
			err = fmt.Errorf("rlfn: %s denied: %+v", principalKeys[p], res)
		}
		return err
	}}
}

func (e *throughputEnv) redisRate() contender {
	return contender{"redis_rate", "evalsha", func(ctx context.Context, p int) error {
		res, err := e.rr.Allow(ctx, principalKeys[p], redis_rate.PerSecond(perSecond))
		if err == nil && res.Allowed == 0 {
			err = fmt.Errorf("redis_rate: %s denied: %+v", principalKeys[p], res)
		}
		return err
	}}
}

func (e *throughputEnv) incr() contender {
	return contender{"incr", "incr", func(ctx context.Context, p int) error {
		return e.vk.Do(ctx, e.vk.B().Incr().Key(incrKeys[p]).Build()).Error()
	}}
}

// BenchmarkThroughput runs rlfn's Allow (a token bucket through client.New on valkey-go),
// go-redis/redis_rate's Allow, and a plain INCR through valkey-go side by side against one
// Valkey 8, each from 64 goroutines (RLFN_BENCH_CALLERS) over 10,000 principals. Targets (issue 4): rlfn at least
// 1.5x redis_rate's ops/s and 0.8x INCR's.
func BenchmarkThroughput(b *testing.B) {
	e := newThroughputEnv(b)
	runContenders(b, e, []contender{
		e.rlfn("rlfn_token_bucket", client.TokenBucket{Capacity: perSecond, Rate: perSecond, Period: time.Second}),
		e.redisRate(),
		e.incr(),
	})
}

// BenchmarkThroughputAlgorithms is BenchmarkThroughput for every limiter of the library.
func BenchmarkThroughputAlgorithms(b *testing.B) {
	e := newThroughputEnv(b)
	runContenders(b, e, []contender{
		e.rlfn("fixed_window", client.FixedWindow{Limit: perSecond, Window: time.Second}),
		// The log keeps an entry per unit, so its limit is at most 100000; a run adds a few
		// entries per principal.
		e.rlfn("sliding_log", client.SlidingLog{Limit: 100000, Window: time.Second}),
		e.rlfn("sliding_window", client.SlidingWindow{Limit: perSecond, Window: time.Second}),
		e.rlfn("token_bucket", client.TokenBucket{Capacity: perSecond, Rate: perSecond, Period: time.Second}),
		e.rlfn("leaky_bucket_police", client.LeakyBucket{Capacity: perSecond, Rate: perSecond, Period: time.Second}),
		e.rlfn("leaky_bucket_shape", client.LeakyBucket{Capacity: perSecond, Rate: perSecond, Period: time.Second, Mode: client.Shape}),
	})
}

func runContenders(b *testing.B, e *throughputEnv, contenders []contender) {
	for _, c := range contenders {
		b.Run(c.name, func(b *testing.B) { e.parallel(b, c) })
	}
}

// parallel runs c from e.callers goroutines until b.N calls are made. Besides ns/op (wall time
// divided by calls: the inverse of the throughput), it reports
//
//   - ops/s, and the p50 and p99 latency of one call, in µs;
//   - server-cpu-µs/op: the server process's CPU time (INFO cpu) per call, and
//     server-cmd-µs/op: the part of it spent inside the command (INFO commandstats usec per
//     call), the rest being reading, parsing and replying;
//   - client-cpu-µs/op: this process's CPU time per call.
//
// When client and server share the machine's cores, the CPU figures say which one limits
// the throughput.
func (e *throughputEnv) parallel(b *testing.B, c contender) {
	ctx := b.Context()
	if err := e.vk.Do(ctx, e.vk.B().ConfigResetstat().Build()).Error(); err != nil {
		b.Fatal(err)
	}
	serverCPU0, err := e.serverCPU(ctx)
	if err != nil {
		b.Fatal(err)
	}
	clientCPU0 := clientCPU()

	var (
		mu        sync.Mutex
		latencies = make([]time.Duration, 0, b.N)
		calls     atomic.Int64
		failed    atomic.Bool
		wg        sync.WaitGroup
	)
	b.ResetTimer()
	// Exactly e.callers goroutines (RunParallel would round them to a multiple of GOMAXPROCS),
	// sharing b.N calls.
	for range e.callers {
		wg.Go(func() {
			// Each goroutine keeps its own latencies (a shared slice would serialise them) and
			// draws principals from the runtime's per-thread generator (no lock).
			local := make([]time.Duration, 0, b.N/e.callers+1)
			for calls.Add(1) <= int64(b.N) {
				p := rand.IntN(principals)
				start := time.Now()
				err := c.op(ctx, p)
				local = append(local, time.Since(start))
				if err != nil && !failed.Swap(true) {
					b.Error(err)
				}
			}
			mu.Lock()
			latencies = append(latencies, local...)
			mu.Unlock()
		})
	}
	wg.Wait()
	b.StopTimer()
	if failed.Load() {
		return
	}
	clientCPU1 := clientCPU()
	serverCPU1, err := e.serverCPU(ctx)
	if err != nil {
		b.Fatal(err)
	}
	st, err := harness.CommandStats(ctx, e.vk, c.stat)
	if err != nil {
		b.Fatal(err)
	}
	n := float64(b.N)
	slices.Sort(latencies)
	b.ReportMetric(n/b.Elapsed().Seconds(), "ops/s")
	b.ReportMetric(micros(percentile(latencies, 0.50)), "p50-µs")
	b.ReportMetric(micros(percentile(latencies, 0.99)), "p99-µs")
	b.ReportMetric(micros(serverCPU1-serverCPU0)/n, "server-cpu-µs/op")
	b.ReportMetric(float64(st.Usec)/float64(max(st.Calls, 1)), "server-cmd-µs/op")
	b.ReportMetric(micros(clientCPU1-clientCPU0)/n, "client-cpu-µs/op")
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// percentile of sorted latencies, by the nearest-rank method.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// serverCPU is the CPU time (user and system) the server process has used, from INFO cpu.
func (e *throughputEnv) serverCPU(ctx context.Context) (time.Duration, error) {
	info, err := harness.Info(ctx, e.vk, "cpu")
	if err != nil {
		return 0, err
	}
	var total float64
	for _, f := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(info[f], 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu %s: %q: %w", f, info[f], err)
		}
		total += v
	}
	return time.Duration(total * float64(time.Second)), nil
}

// clientCPU is the CPU time (user and system) this process has used.
func clientCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func TestPercentile(t *testing.T) {
	var hundred []time.Duration
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, time.Duration(i))
	}
	tests := []struct {
		give []time.Duration
		q    float64
		want time.Duration
	}{
		{nil, 0.5, 0},
		{[]time.Duration{7}, 0.99, 7},
		{hundred, 0.50, 50},
		{hundred, 0.99, 99},
		{hundred, 1, 100},
		{hundred, 0, 1},
	}
	for _, tt := range tests {
		if got := percentile(tt.give, tt.q); got != tt.want {
			t.Errorf("percentile(%d values, %v) = %d, want %d", len(tt.give), tt.q, got, tt.want)
		}
	}
}
