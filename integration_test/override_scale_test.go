package integration_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/internal/override"
)

// BenchmarkOverrideScale measures the overrides at a real SaaS's size: a store of
// RLFN_OVERRIDES overrides (1,000,000 unless set), written as rlfn override apply writes a
// file that large (a new base, by batches, flipped to at once), then 8 Limiters, each with a
// valkey client of its own (goroutine-separated, in this process), 4 deciding without pause
// and 4 idle, while one override changes each iteration (as rlfn override set does, a second
// apart). It reports:
//
//   - write-s: the whole store's write; start-first-s: the first Limiter's load (New and
//     SyncOverrides) with every override in force, start-max-s the slowest of the 8 (each
//     later one loads beside those already running); B/override: the heap the 8 Limiters
//     hold, per override each;
//
//   - busy-p50-ms, busy-p99-ms, busy-max-ms: from the change's write returning to every busy
//     Limiter's index holding it (what its next decision decides with);
//
//   - idle-stale: idle Limiters whose first decision, 100 ms after a change, did not carry it
//     (want 0);
//
//   - fallback: decisions of the busy Limiters decided by the Fallback or failed (want 0),
//     of decisions; control-fallback of control-decisions: the same for a Limiter without
//     overrides deciding beside them (a loaded host's decisions past their Deadline);
//
//   - reads/decision: the store's reads (HGET, HGETALL, HSCAN, HMGET, XRANGE: the library
//     runs none of them) per decision, from the servers' INFO commandstats;
//
//   - slow: commands of the override path in the servers' SLOWLOG at a 1 ms threshold,
//     start-up loads and the write included (want 0; each is logged with b.Log).
//
//     go test ./integration_test -run '^$' -bench OverrideScale -benchtime 60x -timeout 30m
func BenchmarkOverrideScale(b *testing.B) {
	n := 1_000_000
	if s := os.Getenv("RLFN_OVERRIDES"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	for _, tg := range servers(b) {
		if tg.name == "redis7.0" && os.Getenv("RLFN_OVERRIDES_REDIS") == "" {
			continue // the same commands; set RLFN_OVERRIDES_REDIS=1 to measure it too
		}
		b.Run(tg.name, func(b *testing.B) { overrideScale(b, tg, n) })
	}
}

func overrideScale(b *testing.B, tg *target, n int) {
	prefix := keyFor(b) + ":"
	nodes := tg.c.Nodes()
	for _, c := range nodes {
		_ = do(b, c, c.B().ConfigSet().ParameterValue().ParameterValue("slowlog-log-slower-than", "1000").Build()).Error()
		_ = do(b, c, c.B().SlowlogReset().Build()).Error()
	}
	b.Cleanup(func() {
		for _, c := range nodes {
			_ = do(b, c, c.B().ConfigSet().ParameterValue().ParameterValue("slowlog-log-slower-than", "10000").Build()).Error()
		}
	})

	all := make([]override.Override, n)
	for i := range all {
		all[i] = override.Override{Policy: override.Policy{Algorithm: "token_bucket"}, Key: fmt.Sprintf("cust:%d", i),
			Limit: override.Fields{Capacity: 100 + int64(i%50), Rate: 10, Period: "1s"}, Note: "bulk"}
	}
	store := override.NewStore(tg.c, prefix)
	start := time.Now()
	if _, err := store.Replace(context.Background(), all, ""); err != nil {
		b.Fatal(err)
	}
	write := time.Since(start)
	all = nil
	b.Cleanup(func() {
		h, err := store.ReadHead(context.Background())
		if err == nil && h.Gen != "" {
			for i := 0; i < h.Shards; i++ {
				_ = tg.c.Do(context.Background(), tg.c.B().Unlink().Key(override.ShardKey(prefix, h.Gen, i)).Build()).Error()
			}
		}
		_ = tg.c.Do(context.Background(), tg.c.B().Unlink().Key(override.HeadKey(prefix), override.DeltaKey(prefix), override.LogKey(prefix)).Build()).Error()
	})

	limit := client.Limit(client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour})
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	const procs, busy = 8, 4
	lims := make([]*client.Limiter, procs)
	starts := make([]time.Duration, procs)
	// one after another, as processes start on machines of their own: each load has the
	// cores this one has (two, shared with whatever else runs)
	for i := range lims {
		func() {
			vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: slices.Collect(func(yield func(string) bool) {
				for a := range nodes {
					if !yield(a) {
						return
					}
				}
			})})
			if err != nil {
				b.Error(err)
				return
			}
			b.Cleanup(vk.Close)
			t0 := time.Now()
			lim := harness.NewLimiter(b, vk, client.Options{Prefix: prefix, Overrides: true, Fallback: client.FailOpen})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			if err := lim.SyncOverrides(ctx); err != nil {
				b.Error(err)
				return
			}
			starts[i], lims[i] = time.Since(t0), lim
		}()
	}
	if b.Failed() {
		b.FailNow()
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	perOverride := float64(after.HeapAlloc-before.HeapAlloc) / float64(n) / procs

	reads := func() (r, fcalls int64) {
		for _, c := range nodes {
			text, _ := do(b, c, c.B().Info().Section("commandstats").Build()).ToString()
			for _, line := range strings.Split(text, "\n") {
				name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
				if !ok {
					continue
				}
				calls, _ := strconv.ParseInt(strings.Split(rest, ",")[0], 10, 64)
				switch strings.TrimPrefix(name, "cmdstat_") {
				case "hget", "hgetall", "hscan", "hmget", "xrange":
					r += calls
				case "fcall":
					fcalls += calls
				}
			}
		}
		return r, fcalls
	}

	ctx, cancel := context.WithCancel(context.Background())
	var decisions, fallback atomic.Int64
	var load sync.WaitGroup
	for i := 0; i < busy; i++ {
		load.Add(1)
		go func() {
			defer load.Done()
			for j := 0; ctx.Err() == nil; j++ {
				res, err := lims[i].Allow(ctx, fmt.Sprintf("cust:%d", j%n), limit)
				if ctx.Err() != nil {
					return
				}
				decisions.Add(1)
				if err != nil || res.Source == client.FromFallback {
					fallback.Add(1)
				}
			}
		}()
	}
	// a control: a Limiter without overrides deciding beside them, so that fallbacks the
	// machine causes (a decision past its Deadline on a loaded host) are told from others
	var controlFallback, controlDecisions atomic.Int64
	{
		vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: slices.Collect(func(yield func(string) bool) {
			for a := range nodes {
				if !yield(a) {
					return
				}
			}
		})})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(vk.Close)
		plain := harness.NewLimiter(b, vk, client.Options{Prefix: prefix, Fallback: client.FailOpen})
		load.Add(1)
		go func() {
			defer load.Done()
			for j := 0; ctx.Err() == nil; j++ {
				res, err := plain.Allow(ctx, fmt.Sprintf("cust:%d", j%n), limit)
				if ctx.Err() != nil {
					return
				}
				controlDecisions.Add(1)
				if err != nil || res.Source == client.FromFallback {
					controlFallback.Add(1)
				}
			}
		}()
	}
	readsBefore, _ := reads()
	decisionsBefore := decisions.Load()

	var took []time.Duration
	stale := 0
	i := 0
	for b.Loop() {
		i++
		b.StopTimer()
		time.Sleep(time.Second - 100*time.Millisecond) // one change a second
		b.StartTimer()
		key := fmt.Sprintf("cust:%d", (i*7919)%n)
		o := override.Override{Policy: override.Policy{Algorithm: "token_bucket"}, Key: key,
			Limit: override.Fields{Capacity: 1000 + int64(i), Rate: 10, Period: "1s"}, Note: "change"}
		if _, err := store.Apply(context.Background(), []override.Change{{Op: override.Update, New: &o}}, nil); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		want := int64(1000 + i)
		carries := func(lim *client.Limiter) bool {
			res, err := lim.Peek(context.Background(), key, limit)
			return err == nil && res.Override != nil && res.Override.Limit.Quota().Limit == want
		}
		var worst time.Duration
		for _, lim := range lims[:busy] {
			v := override.VersionNumber(lim.OverridesVersion())
			for ; ; v = override.VersionNumber(lim.OverridesVersion()) {
				if v >= int64(i)+1 || time.Since(t0) > 10*time.Second {
					break
				}
				time.Sleep(200 * time.Microsecond)
			}
			worst = max(worst, time.Since(t0))
			if !carries(lim) {
				b.Errorf("change %d: a busy Limiter at its version does not decide with it", i)
			}
		}
		took = append(took, worst)
		time.Sleep(100*time.Millisecond - time.Since(t0))
		for _, lim := range lims[busy:] {
			if !carries(lim) {
				stale++
			}
		}
	}
	b.StopTimer()
	readsAfter, _ := reads()
	dec := decisions.Load() - decisionsBefore
	cancel()
	load.Wait()

	slow := 0
	for addr, c := range nodes {
		entries, _ := do(b, c, c.B().SlowlogGet().Count(1000).Build()).ToArray()
		for _, e := range entries {
			fields, _ := e.ToArray()
			if len(fields) < 4 {
				continue
			}
			us, _ := fields[2].AsInt64()
			args, _ := fields[3].AsStrSlice()
			if len(args) > 1 && strings.Contains(strings.Join(args[1:min(3, len(args))], " "), "%overrides") {
				slow++
				b.Logf("SLOWLOG %s: %d µs: %.80s", addr, us, strings.Join(args, " "))
			}
		}
	}
	slices.Sort(took)
	first := starts[0]
	slices.Sort(starts)
	starts[0] = first
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(write.Seconds(), "write-s")
	b.ReportMetric(starts[0].Seconds(), "start-first-s")
	b.ReportMetric(slices.Max(starts).Seconds(), "start-max-s")
	b.ReportMetric(perOverride, "B/override")
	b.ReportMetric(ms(took[len(took)/2]), "busy-p50-ms")
	b.ReportMetric(ms(took[len(took)*99/100]), "busy-p99-ms")
	b.ReportMetric(ms(took[len(took)-1]), "busy-max-ms")
	b.ReportMetric(float64(stale), "idle-stale")
	b.ReportMetric(float64(fallback.Load()), "fallback")
	b.ReportMetric(float64(dec), "decisions")
	b.ReportMetric(float64(controlFallback.Load()), "control-fallback")
	b.ReportMetric(float64(controlDecisions.Load()), "control-decisions")
	b.ReportMetric(float64(readsAfter-readsBefore)/float64(max(dec, 1)), "reads/decision")
	b.ReportMetric(float64(slow), "slow")
	b.Logf("%d overrides, %d changes, %d decisions, %d store reads", n, len(took), dec, readsAfter-readsBefore)
	runtime.KeepAlive(lims)
}
