package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
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
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/internal/keys"
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
	leased  *client.Limiter // lim with leased budgets
	rr      *redis_rate.Limiter
}

// The leased budgets of the benchmarks: batches of up to 256 units (what 64 callers on one key
// take in a few round trips), handed out within 50ms.
const (
	leaseBatch = 256
	leaseAge   = 50 * time.Millisecond
)

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
	lim := harness.NewLimiter(b, vk, client.Options{Deadline: time.Minute})
	leased := harness.NewLimiter(b, vk, client.Options{Deadline: time.Minute, BudgetBatch: leaseBatch, BudgetAge: leaseAge})
	b.Cleanup(func() { leased.Close(context.Background()) })
	e := &throughputEnv{callers: callers, vk: vk, lim: lim, leased: leased, rr: redis_rate.NewLimiter(rdb)}
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
	ks := make([]string, principals)
	for i := range ks {
		ks[i] = keys.Compose("rl:", principalKeys[i], "fixed_window", "") + ":incr"
	}
	return ks
}()

func (e *throughputEnv) rlfn(name string, limit client.Limit) contender {
	return rlfnOn(e.lim, name, limit)
}

// rlfnOn is a contender that calls lim.
func rlfnOn(lim *client.Limiter, name string, limit client.Limit) contender {
	return contender{name, "fcall", func(ctx context.Context, p int) error {
		res, err := lim.Allow(ctx, principalKeys[p], limit)
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

// valkeyFcall is the floor of any client of the library on valkey-go: the FCALL that
// rlfn_background sends (the same function, key and arguments, strings built beforehand), its
// reply read as rlfn reads it, with none of rlfn's own work (validation, key, breaker,
// deadline, decoding into a Result). Its client CPU against INCR's is what the command and its
// reply cost valkey-go, and the server's slower answer costs it in batching; against rlfn's,
// what rlfn's own code costs.
func (e *throughputEnv) valkeyFcall() contender {
	args := []string{strconv.Itoa(perSecond), strconv.Itoa(perSecond), "1000", "1"}
	return contender{"valkey_fcall", "fcall", func(ctx context.Context, p int) error {
		arr, err := e.vk.Do(ctx, e.vk.B().Fcall().Function("rl_token_bucket").Numkeys(1).
			Key(bucketKeys[p]).Arg(args...).Build()).ToArray()
		if err == nil && len(arr) < 6 {
			err = fmt.Errorf("valkey_fcall: %d elements", len(arr))
		}
		return err
	}}
}

// bucketKeys are the keys rlfn's token bucket gives the principals.
var bucketKeys = func() []string {
	ks := make([]string, principals)
	for i := range ks {
		ks[i] = keys.Compose("rl:", principalKeys[i], "token_bucket", "")
	}
	return ks
}()

func (e *throughputEnv) incr() contender {
	return contender{"incr", "incr", func(ctx context.Context, p int) error {
		return e.vk.Do(ctx, e.vk.B().Incr().Key(incrKeys[p]).Build()).Error()
	}}
}

// BenchmarkThroughput runs rlfn's Allow (a token bucket through client.New on valkey-go),
// go-redis/redis_rate's Allow, and a plain INCR through valkey-go side by side against one
// Valkey 8, each from 64 goroutines (RLFN_BENCH_CALLERS) over 10,000 principals. Targets: rlfn
// at least 2x redis_rate's ops/s and 0.8x INCR's, and client CPU per decision at most 1.2x
// INCR's (docs/performance.md has the figures). rlfn_leased is the same token bucket with leased budgets, which
// must not be slower when no key is hot.
func BenchmarkThroughput(b *testing.B) {
	e := newThroughputEnv(b)
	bucket := client.TokenBucket{Capacity: perSecond, Rate: perSecond, Period: time.Second}
	background := rlfnOn(e.lim, "rlfn_background", bucket)
	op := background.op
	background.op = func(_ context.Context, p int) error { return op(context.Background(), p) }
	runContenders(b, e, []contender{
		e.rlfn("rlfn_token_bucket", bucket),
		// a context that cannot be canceled costs no timer: see client.Options.Deadline
		background,
		rlfnOn(e.leased, "rlfn_leased", bucket),
		e.redisRate(),
		e.valkeyFcall(),
		e.incr(),
	})
}

// BenchmarkHotKey is one key called from 64 goroutines (RLFN_BENCH_CALLERS), every decision
// admitted: rlfn with one call per decision, rlfn with leased budgets, and redis_rate. Target:
// leased budgets at least 10x one call per decision. Besides parallel's figures, the
// rlfn contenders report over-admitted: the decisions admitted beyond what the server counts as
// taken once the Limiter is closed (every parked unit given back), which must be 0.
func BenchmarkHotKey(b *testing.B) {
	e := newThroughputEnv(b)
	// the longest window, so that no run spans two
	limit := client.FixedWindow{Limit: 999_999_999_999_999, Window: 100_000_000_000 * time.Millisecond}
	var run atomic.Int64
	for _, c := range []struct {
		name string
		opts client.Options
	}{{"rlfn_per_call", client.Options{Deadline: time.Minute}}, {"rlfn_leased", client.Options{Deadline: time.Minute, BudgetBatch: leaseBatch, BudgetAge: leaseAge}}} {
		b.Run(c.name, func(b *testing.B) {
			// A Limiter of this round's own, closed after it, so that the server's count is
			// this key's admitted decisions exactly.
			lim := harness.NewLimiter(b, e.vk, c.opts)
			key := fmt.Sprintf("hot:%d", run.Add(1))
			var admitted atomic.Int64
			e.parallel(b, contender{c.name, "fcall", func(ctx context.Context, _ int) error {
				res, err := lim.Allow(ctx, key, limit)
				if err == nil && !res.Allowed {
					err = fmt.Errorf("%s denied: %+v", key, res)
				}
				if err == nil {
					admitted.Add(1)
				}
				return err
			}})
			used := func() int64 {
				r, err := e.lim.PeekN(b.Context(), key, limit, 0)
				if err != nil {
					b.Fatal(err)
				}
				return r.Limit - r.Remaining
			}
			// (parked units age out meanwhile: only after Close is the count exact)
			if err := lim.Close(b.Context()); err != nil {
				b.Fatal(err)
			}
			over := admitted.Load() - used()
			b.ReportMetric(float64(max(0, over)), "over-admitted")
			if over != 0 {
				b.Errorf("after Close the server counts %d units, %d admitted", admitted.Load()-over, admitted.Load())
			}
		})
	}
	b.Run("redis_rate", func(b *testing.B) {
		key := fmt.Sprintf("hot:%d", run.Add(1))
		e.parallel(b, contender{"redis_rate", "evalsha", func(ctx context.Context, _ int) error {
			res, err := e.rr.Allow(ctx, key, redis_rate.PerSecond(perSecond))
			if err == nil && res.Allowed == 0 {
				err = fmt.Errorf("redis_rate: %s denied: %+v", key, res)
			}
			return err
		}})
	})
}

// BenchmarkSharedBucket is four Limiters with leased budgets (four service instances) sharing
// one hot token bucket that admits far less than the demand: 64 goroutines, each sending its
// calls to one instance, then the next every 1000 calls, so that demand shifts between them.
// It reports the admitted decisions against the exact allowance (Capacity + Rate x the run's
// duration, measured by this process: at least what the server could admit), as
// admitted/allowance (1 would be exact, below 1 the under-admission) and over-allowance (must
// be 0).
func BenchmarkSharedBucket(b *testing.B) {
	e := newThroughputEnv(b)
	const capacity, rate = 1000, 20_000 // per second
	var run atomic.Int64
	lims := make([]*client.Limiter, 4)
	for i := range lims {
		lims[i] = harness.NewLimiter(b, e.vk, client.Options{Deadline: time.Minute, BudgetBatch: leaseBatch, BudgetAge: leaseAge})
		b.Cleanup(func() { lims[i].Close(context.Background()) })
	}
	limit := client.TokenBucket{Capacity: capacity, Rate: rate, Period: time.Second}
	b.Run("four_instances", func(b *testing.B) {
		key := fmt.Sprintf("shared:%d", run.Add(1))
		var admitted, calls atomic.Int64
		start := time.Now()
		e.parallel(b, contender{"four_instances", "fcall", func(ctx context.Context, p int) error {
			n := calls.Add(1)
			lim := lims[(int64(p)+n/1000)%int64(len(lims))]
			res, err := lim.Allow(ctx, key, limit)
			if err == nil && res.Allowed {
				admitted.Add(1)
			}
			return err
		}})
		allowance := capacity + rate*time.Since(start).Seconds()
		b.ReportMetric(float64(admitted.Load())/allowance, "admitted/allowance")
		b.ReportMetric(max(0, float64(admitted.Load())-allowance), "over-allowance")
		if float64(admitted.Load()) > allowance {
			b.Errorf("admitted %d, over the allowance of %.0f", admitted.Load(), allowance)
		}
	})
}

// BenchmarkUnderAttack is one key, exhausted, called from 64 goroutines: with one call per
// decision, and with the denial cache, which answers the denials within their RetryAfter
// without the server. Its server-calls/s is what the attack costs the server.
func BenchmarkUnderAttack(b *testing.B) {
	e := newThroughputEnv(b)
	cached := harness.NewLimiter(b, e.vk, client.Options{Deadline: time.Minute, DenialCache: 10_000})
	limit := client.TokenBucket{Capacity: 10, Rate: 10, Period: time.Second}
	var run atomic.Int64
	for _, c := range []struct {
		name string
		lim  *client.Limiter
	}{{"per_call", e.lim}, {"denial_cache", cached}} {
		b.Run(c.name, func(b *testing.B) {
			key := fmt.Sprintf("attacked:%d", run.Add(1))
			e.parallel(b, contender{c.name, "fcall", func(ctx context.Context, _ int) error {
				_, err := c.lim.Allow(ctx, key, limit)
				return err
			}})
		})
	}
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
//   - client-cpu-µs/op: this process's CPU time per call, client-sys-µs/op the kernel's part;
//   - client-reads/op, client-writes/op, client-write-B/op: its read and write system calls
//     and the bytes it wrote, per call.
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
	clientUser0, clientSys0 := clientCPU()
	reads0, writes0, wbytes0 := syscalls()
	var mem0, mem1 runtime.MemStats
	runtime.ReadMemStats(&mem0)

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
			// Each goroutine is a request with a cancelable context of its own, as a server
			// gives each request: one context shared by all 64 would make the child context
			// of every call (rlfn's deadline) wait for its parent's lock, which no server sees.
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
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
	runtime.ReadMemStats(&mem1)
	if failed.Load() {
		return
	}
	clientUser1, clientSys1 := clientCPU()
	reads1, writes1, wbytes1 := syscalls()
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
	b.ReportMetric(micros(clientUser1-clientUser0+clientSys1-clientSys0)/n, "client-cpu-µs/op")
	b.ReportMetric(micros(clientSys1-clientSys0)/n, "client-sys-µs/op")
	// Every allocation of this process during the run, the goroutines' latency slices aside
	// (a few growths each): the client's, valkey-go's and the contender's, per decision.
	b.ReportMetric(float64(mem1.Mallocs-mem0.Mallocs)/n, "client-allocs/op")
	if reads0 >= 0 && reads1 >= 0 {
		// valkey-go's auto-pipelining writes the commands queued meanwhile in one write and
		// reads every reply that has arrived in one read: the fewer commands per syscall, the
		// more the client's CPU goes to the kernel.
		b.ReportMetric(float64(reads1-reads0)/n, "client-reads/op")
		b.ReportMetric(float64(writes1-writes0)/n, "client-writes/op")
		b.ReportMetric(float64(wbytes1-wbytes0)/n, "client-write-B/op")
	}
	b.ReportMetric(float64(st.Calls)/n, "server-calls/op")
	b.ReportMetric(float64(st.Calls)/b.Elapsed().Seconds(), "server-calls/s")
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

// clientCPU is the CPU time this process has used, user and system (the kernel's share,
// which on loopback includes delivering what it writes to the server's socket).
func clientCPU() (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// syscalls is how many read and write system calls this process has made and how many bytes
// it wrote (every thread's, from /proc/self/io), or -1s where the system does not tell.
func syscalls() (reads, writes, written int64) {
	reads, writes, written = -1, -1, -1
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return
	}
	for line := range strings.Lines(string(b)) {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ": ")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue
		}
		switch name {
		case "syscr":
			reads = n
		case "syscw":
			writes = n
		case "wchar":
			written = n
		}
	}
	return
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
