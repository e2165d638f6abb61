package integration_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
)

// countingClient records the FCALLs a Limiter sends: the function and its cost argument.
type countingClient struct {
	valkey.Client
	mu    sync.Mutex
	calls []fcallSeen
}

type fcallSeen struct {
	fn   string
	cost int64
}

// costArg is where each algorithm's cost is in FCALL fn numkeys key args...
var costArg = map[string]int{
	"fixed_window": 6, "sliding_window": 6, "sliding_log": 6, "token_bucket": 7, "leaky_bucket": 7,
}

func (c *countingClient) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	if args := cmd.Commands(); len(args) > 4 && (args[0] == "FCALL" || args[0] == "FCALL_RO") {
		seen := fcallSeen{fn: args[1]}
		for alg, i := range costArg {
			if (args[1] == "rl_"+alg || args[1] == "rl_"+alg+"_refund") && i < len(args) {
				seen.cost, _ = strconv.ParseInt(args[i], 10, 64)
			}
		}
		c.mu.Lock()
		c.calls = append(c.calls, seen)
		c.mu.Unlock()
	}
	return c.Client.Do(ctx, cmd)
}

// count is how many calls of fn were sent, and the largest cost among them.
func (c *countingClient) count(fn string) (n int, maxCost int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.calls {
		if s.fn == fn {
			n++
			maxCost = max(maxCost, s.cost)
		}
	}
	return n, maxCost
}

// leasedLimits are the limits leased budgets serve, each with a limit of units L, a window or
// a refill so slow that a test's units all count against one window or one bucket.
func leasedLimits(l int64) []struct {
	name  string
	limit client.Limit
} {
	return []struct {
		name  string
		limit client.Limit
	}{
		{"fixed_window", client.FixedWindow{Limit: l, Window: time.Minute}},
		{"sliding_window", client.SlidingWindow{Limit: l, Window: time.Minute}},
		{"token_bucket", client.TokenBucket{Capacity: l, Rate: 1, Period: time.Hour}},
		{"leaky_bucket", client.LeakyBucket{Capacity: l, Rate: 1, Period: time.Hour}},
		// a UTC day whose window ends half a day from now, far from the test
		{"calendar", client.Calendar{Limit: l, Period: client.Day, Anchor: time.Now().UTC().Add(12 * time.Hour)}},
	}
}

// used is how many units key's limiter counts at the server: the limit less what a peek of
// cost 0 finds admissible (the limits of leasedLimits have no reserve).
func used(t testing.TB, c valkey.Client, key string, limit client.Limit) int64 {
	t.Helper()
	r, err := harness.NewLimiter(t, c, slowMachine).PeekN(ctx5s(t), key, limit, 0)
	if err != nil {
		t.Fatalf("peek: %v", err)
	}
	return r.Limit - r.Remaining
}

// Three Limiters (three processes) and 48 goroutines hammer one key with twice its limit in
// calls; a fourth Limiter is killed mid-batch (its connection closed, no Close). The server's
// own count proves that no unit was admitted beyond the limit: it equals what was admitted
// plus what is parked, and the killed Limiter's parked units are lost (under-admission),
// never handed out. Close then returns every parked unit.
func TestLeasedBudgetsNeverOverAdmit(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, l := range leasedLimits(600) {
			t.Run(l.name, func(t *testing.T) {
				const limit, callers = 600, 48
				key := keyFor(t)
				roomInWindow(t, tg.c, 60_000, 20*time.Second)
				ctx := ctx5s(t)
				opts := client.Options{Deadline: slowDeadline, Fallback: client.ReturnError, BudgetBatch: 16, BudgetAge: time.Minute}

				// The killed one: a connection of its own, closed after it parked units.
				kc, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{clientAddr(t, tg)}, DisableCache: true})
				if err != nil {
					t.Fatal(err)
				}
				killed := harness.NewLimiter(t, kc, opts)
				var killedAdmitted int64
				for i := 0; i < 40 && killed.Parked() == 0; i++ {
					var wg sync.WaitGroup
					var n atomic.Int64
					for range 8 {
						wg.Go(func() {
							r, err := killed.Allow(ctx, key, l.limit)
							if err != nil {
								t.Error(err)
							} else if r.Allowed {
								n.Add(1)
							}
						})
					}
					wg.Wait()
					killedAdmitted += n.Load()
				}
				lost := killed.Parked()
				if lost == 0 {
					t.Fatal("the Limiter to kill parked nothing: 40 rounds of 8 concurrent calls took no batch")
				}
				kc.Close()

				lims := []*client.Limiter{harness.NewLimiter(t, tg.c, opts), harness.NewLimiter(t, tg.c, opts), harness.NewLimiter(t, tg.c, opts)}
				var admitted, denied atomic.Int64
				var wg sync.WaitGroup
				for g := range callers {
					lim := lims[g%len(lims)]
					wg.Go(func() {
						for range 2 * limit / callers {
							r, err := lim.Allow(ctx, key, l.limit)
							switch {
							case err != nil:
								t.Error(err)
								return
							case r.Allowed:
								admitted.Add(1)
							default:
								denied.Add(1)
							}
						}
					})
				}
				wg.Wait()
				total := admitted.Load() + killedAdmitted
				var parked int64
				for _, lim := range lims {
					parked += lim.Parked()
				}
				t.Logf("admitted %d (%d by the killed Limiter), denied %d, parked %d, lost %d",
					total, killedAdmitted, denied.Load(), parked, lost)
				if total > limit {
					t.Fatalf("admitted %d, over the limit of %d", total, limit)
				}
				if u := used(t, tg.c, key, l.limit); u != total+parked+lost {
					t.Fatalf("the server counts %d units, want admitted %d + parked %d + lost %d", u, total, parked, lost)
				}
				if total+parked+lost != limit {
					t.Fatalf("admitted %d + parked %d + lost %d, want the whole limit %d taken by twice as many calls",
						total, parked, lost, limit)
				}
				for _, lim := range lims {
					if err := lim.Close(ctx); err != nil {
						t.Fatal(err)
					}
					if p := lim.Parked(); p != 0 {
						t.Fatalf("%d units parked after Close", p)
					}
				}
				if u := used(t, tg.c, key, l.limit); u != total+lost {
					t.Fatalf("after Close the server counts %d units, want admitted %d + lost %d", u, total, lost)
				}
			})
		}
	})
}

// clientAddr is an address a new client can start from to reach tg: a standalone server, or
// any node of a cluster, from which the client discovers the others.
func clientAddr(t testing.TB, tg *target) string {
	t.Helper()
	for addr := range tg.c.Nodes() {
		return addr
	}
	t.Fatal("the target's client knows no node")
	return ""
}

// hot runs n calls of limit on key from 16 goroutines, and returns how many were admitted.
func hot(t testing.TB, lim *client.Limiter, key string, limit client.Limit, n int) int64 {
	t.Helper()
	ctx := ctx5s(t)
	var admitted atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				r, err := lim.Allow(ctx, key, limit)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return admitted.Load()
}

// Close gives the parked units back (the server's count drops to what was admitted), and the
// calls after it go to the server, one per decision.
func TestLeasedBudgetsClose(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, l := range leasedLimits(10_000) {
			t.Run(l.name, func(t *testing.T) {
				key := keyFor(t)
				roomInWindow(t, tg.c, 60_000, 10*time.Second)
				ctx := ctx5s(t)
				cc := &countingClient{Client: tg.c}
				lim := harness.NewLimiter(t, cc, client.Options{
					Deadline:    slowDeadline,
					Fallback:    client.ReturnError,
					BudgetBatch: 32,
					BudgetAge:   time.Minute,
				})
				admitted := hot(t, lim, key, l.limit, 2000)
				for i := 0; i < 100 && lim.Parked() == 0; i++ {
					admitted += hot(t, lim, key, l.limit, 1)
				}
				parked := lim.Parked()
				fn := "rl_" + l.name
				calls, _ := cc.count(fn)
				t.Logf("%d admitted with %d calls, %d parked", admitted, calls, parked)
				if admitted < 2000 || parked == 0 || parked > 31 {
					t.Fatalf("admitted %d, %d parked: want all admitted and 1 to 31 parked", admitted, parked)
				}
				if calls >= 1000 {
					t.Fatalf("%d calls to the server for 2000 hot decisions: leased budgets took no batch", calls)
				}
				if u := used(t, tg.c, key, l.limit); u != admitted+parked {
					t.Fatalf("the server counts %d, want admitted %d + parked %d", u, admitted, parked)
				}
				if err := lim.Close(ctx); err != nil {
					t.Fatal(err)
				}
				if n, _ := cc.count(fn + "_refund"); n != 1 {
					t.Fatalf("Close sent %d refunds for one parked budget, want 1", n)
				}
				if u := used(t, tg.c, key, l.limit); u != admitted {
					t.Fatalf("after Close the server counts %d, want the %d admitted", u, admitted)
				}
				before, _ := cc.count(fn)
				for range 5 {
					if r, err := lim.Allow(ctx, key, l.limit); err != nil || !r.Allowed || r.Source == client.FromLease {
						t.Fatalf("after Close: %+v, %v", r, err)
					}
				}
				if after, maxCost := cc.count(fn); after-before != 5 || maxCost > 32 {
					t.Fatalf("5 calls after Close sent %d (largest cost %d), want 5 of cost 1", after-before, maxCost)
				}
				if u := used(t, tg.c, key, l.limit); u != admitted+5 {
					t.Fatalf("the server counts %d, want %d", u, admitted+5)
				}
				if err := lim.Close(ctx); err != nil {
					t.Fatalf("a second Close: %v", err)
				}
			})
		}
	})
}

// A key called less often than once per maxAge is decided by exactly one call per decision,
// of cost 1, and parks nothing: as without leased budgets. So are many keys called once.
func TestLeasedBudgetsColdKeys(t *testing.T) {
	tg := servers(t)[0]
	ctx := ctx5s(t)
	cc := &countingClient{Client: tg.c}
	lim := harness.NewLimiter(t, cc, client.Options{
		Deadline:    slowDeadline,
		Fallback:    client.ReturnError,
		BudgetBatch: 64,
		BudgetAge:   5 * time.Millisecond,
	})
	limit := client.TokenBucket{Capacity: 1000, Rate: 1000, Period: time.Second}
	key := keyFor(t)
	for i := range 20 {
		if r, err := lim.Allow(ctx, key, limit); err != nil || !r.Allowed || r.Source == client.FromLease {
			t.Fatalf("call %d: %+v, %v", i, r, err)
		}
		if p := lim.Parked(); p != 0 {
			t.Fatalf("call %d parked %d units", i, p)
		}
		time.Sleep(10 * time.Millisecond) // more than maxAge: the key stays cold
	}
	for i := range 200 {
		if r, err := lim.Allow(ctx, keyFor(t)+strconv.Itoa(i), limit); err != nil || !r.Allowed {
			t.Fatalf("key %d: %+v, %v", i, r, err)
		}
	}
	if n, maxCost := cc.count("rl_token_bucket"); n != 220 || maxCost != 1 {
		t.Fatalf("220 cold decisions sent %d calls, the largest of cost %d: want 220 of cost 1", n, maxCost)
	}
	if n, _ := cc.count("rl_token_bucket_refund"); n != 0 || lim.Parked() != 0 {
		t.Fatalf("cold keys: %d refunds, %d parked, want none", n, lim.Parked())
	}
}

// The batch grows while the key is hot, never beyond maxBatch, so that a process parks at
// most maxBatch - 1 units of a key; a denied key goes back to exact calls of its cost.
func TestLeasedBudgetsBatchBound(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		const maxBatch = 8
		ctx := ctx5s(t)
		cc := &countingClient{Client: tg.c}
		lim := harness.NewLimiter(t, cc, client.Options{
			Deadline:    slowDeadline,
			Fallback:    client.ReturnError,
			BudgetBatch: maxBatch,
			BudgetAge:   time.Minute,
		})
		limit := client.TokenBucket{Capacity: 3000, Rate: 1, Period: time.Hour}
		key := keyFor(t)
		stop := make(chan struct{})
		var most atomic.Int64
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if p := lim.Parked(); p > most.Load() {
					most.Store(p)
				}
				time.Sleep(50 * time.Microsecond)
			}
		})
		admitted := hot(t, lim, key, limit, 4000)
		close(stop)
		wg.Wait()
		n, maxCost := cc.count("rl_token_bucket")
		t.Logf("%d admitted, %d calls, largest batch %d, most parked seen %d", admitted, n, maxCost, most.Load())
		if maxCost != maxBatch {
			t.Fatalf("largest batch %d, want it to grow to maxBatch %d", maxCost, maxBatch)
		}
		if most.Load() > maxBatch-1 {
			t.Fatalf("%d units parked at once, want at most %d", most.Load(), maxBatch-1)
		}
		if admitted != 3000 {
			t.Fatalf("admitted %d, want the capacity 3000", admitted)
		}
		if p := lim.Parked(); p != 0 {
			t.Fatalf("%d units parked on an exhausted bucket", p)
		}
		// denied: the next calls are exact, of cost 1
		before := len(cc.calls)
		for range 3 {
			if r, err := lim.Allow(ctx, key, limit); err != nil || r.Allowed {
				t.Fatalf("exhausted: %+v, %v", r, err)
			}
		}
		cc.mu.Lock()
		for _, c := range cc.calls[before:] {
			if c.cost != 1 {
				t.Errorf("a denied key sent %s of cost %d, want 1", c.fn, c.cost)
			}
		}
		if len(cc.calls)-before != 3 {
			t.Errorf("3 denied calls sent %d commands, want 3", len(cc.calls)-before)
		}
		cc.mu.Unlock()
		if err := lim.Close(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// A batch never asks for more than the limit could admit: a small limit under a hot key is
// taken whole, by batches no larger than it.
func TestLeasedBudgetsSmallLimit(t *testing.T) {
	tg := servers(t)[0]
	cc := &countingClient{Client: tg.c}
	lim := harness.NewLimiter(t, cc, client.Options{
		Deadline:    slowDeadline,
		Fallback:    client.ReturnError,
		BudgetBatch: 64,
		BudgetAge:   time.Minute,
	})
	limit := client.TokenBucket{Capacity: 5, Rate: 1, Period: time.Hour, Reserve: 1}
	key := keyFor(t)
	admitted := hot(t, lim, key, limit, 400)
	n, maxCost := cc.count("rl_token_bucket")
	t.Logf("%d admitted with %d calls, largest batch %d", admitted, n, maxCost)
	if admitted+lim.Parked() != 4 || maxCost > 4 {
		t.Fatalf("admitted %d + parked %d, largest batch %d: want the 4 units above the reserve, in batches of at most 4",
			admitted, lim.Parked(), maxCost)
	}
	if err := lim.Close(ctx5s(t)); err != nil {
		t.Fatal(err)
	}
}

// The reserve stays at the server: batches are judged with it, and critical calls, never
// batched, still get it while other calls' units are parked.
func TestLeasedBudgetsReserve(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		cc := &countingClient{Client: tg.c}
		lim := harness.NewLimiter(t, cc, client.Options{
			Deadline:    slowDeadline,
			Fallback:    client.ReturnError,
			BudgetBatch: 64,
			BudgetAge:   time.Minute,
		})
		limit := client.TokenBucket{Capacity: 20, Rate: 1, Period: time.Hour, Reserve: 3}
		key := keyFor(t)
		admitted := hot(t, lim, key, limit, 200)
		if admitted+lim.Parked() != 17 {
			t.Fatalf("admitted %d + parked %d, want the 17 units above the reserve", admitted, lim.Parked())
		}
		crit := client.Critical(ctx)
		before, _ := cc.count("rl_token_bucket")
		for i := range 3 {
			if r, err := lim.Allow(crit, key, limit); err != nil || !r.Allowed || r.Source == client.FromLease {
				t.Fatalf("critical call %d: %+v, %v; want the reserve, from the server", i, r, err)
			}
		}
		if r, err := lim.Allow(crit, key, limit); err != nil || r.Allowed {
			t.Fatalf("a 4th critical call: %+v, %v; want denied", r, err)
		}
		if after, _ := cc.count("rl_token_bucket"); after-before != 4 {
			t.Fatalf("4 critical calls sent %d calls, want 4", after-before)
		}
		if err := lim.Close(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// Parked units are given back when they age out (maxAge), and a fixed window's batch is not
// handed out past its window, nor refunded into the next one.
func TestLeasedBudgetsAgeOut(t *testing.T) {
	tg := servers(t)[0]
	t.Run("max_age", func(t *testing.T) {
		cc := &countingClient{Client: tg.c}
		lim := harness.NewLimiter(t, cc, client.Options{
			Deadline:    slowDeadline,
			Fallback:    client.ReturnError,
			BudgetBatch: 32,
			BudgetAge:   100 * time.Millisecond,
		})
		limit := client.TokenBucket{Capacity: 10_000, Rate: 1, Period: time.Hour}
		key := keyFor(t)
		var admitted int64
		for i := 0; i < 20 && lim.Parked() == 0; i++ {
			admitted += hot(t, lim, key, limit, 100)
		}
		if lim.Parked() == 0 {
			t.Fatal("2000 hot calls parked nothing")
		}
		time.Sleep(300 * time.Millisecond)
		if p := lim.Parked(); p != 0 {
			t.Fatalf("%d units parked after 3 times maxAge", p)
		}
		if n, _ := cc.count("rl_token_bucket_refund"); n != 1 {
			t.Fatalf("%d refunds, want 1", n)
		}
		if u := used(t, tg.c, key, limit); u != admitted {
			t.Fatalf("the server counts %d, want the %d admitted", u, admitted)
		}
		// no unit older than maxAge is handed out: the next call is the server's
		if r, err := lim.Allow(ctx5s(t), key, limit); err != nil || !r.Allowed || r.Source == client.FromLease {
			t.Fatalf("after maxAge: %+v, %v; want decided by the server", r, err)
		}
	})
	t.Run("window_end", func(t *testing.T) {
		const window = 1000
		cc := &countingClient{Client: tg.c}
		lim := harness.NewLimiter(t, cc, client.Options{
			Deadline:    slowDeadline,
			Fallback:    client.ReturnError,
			BudgetBatch: 32,
			BudgetAge:   time.Minute,
		})
		limit := client.FixedWindow{Limit: 10_000, Window: window * time.Millisecond}
		key := keyFor(t)
		atWindowStart(t, tg.c, window)
		admitted := hot(t, lim, key, limit, 500)
		parked := lim.Parked()
		if parked == 0 {
			t.Fatal("500 hot calls parked nothing")
		}
		if u := used(t, tg.c, key, limit); u != admitted+parked {
			t.Fatalf("the server counts %d, want %d + %d", u, admitted, parked)
		}
		atWindowStart(t, tg.c, window)
		before, _ := cc.count("rl_fixed_window")
		r, err := lim.Allow(ctx5s(t), key, limit)
		if err != nil || !r.Allowed || r.Source == client.FromLease {
			t.Fatalf("first call of the next window: %+v, %v; want it decided by the server", r, err)
		}
		if after, _ := cc.count("rl_fixed_window"); after != before+1 {
			t.Fatal("the first call of the next window sent no call: a unit of the last window was handed out")
		}
		if n, _ := cc.count("rl_fixed_window_refund"); n != 0 {
			t.Fatalf("%d refunds of a window's units: they would land in the next window", n)
		}
		if u, p := used(t, tg.c, key, limit), lim.Parked(); u != 1+p {
			t.Fatalf("the new window counts %d, want the 1 unit just admitted and the %d parked", u, p)
		}
		if err := lim.Close(ctx5s(t)); err != nil {
			t.Fatal(err)
		}
	})
}

// The metrics count the batches, the units they took, the units refunded and, as decisions
// of source leased, the local hits: together with the server's admissions, every decision.
func TestLeasedBudgetsMetrics(t *testing.T) {
	tg := servers(t)[0]
	reader := sdkmetric.NewManualReader()
	lim := harness.NewLimiter(t, tg.c, client.Options{
		Deadline:      slowDeadline,
		Fallback:      client.ReturnError,
		BudgetBatch:   32,
		BudgetAge:     time.Minute,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
	})
	limit := client.TokenBucket{Capacity: 100_000, Rate: 1, Period: time.Hour}
	key := keyFor(t)
	admitted := hot(t, lim, key, limit, 1000)
	for i := 0; i < 100 && lim.Parked() == 0; i++ {
		admitted += hot(t, lim, key, limit, 1)
	}
	parked := lim.Parked()
	if err := lim.Close(ctx5s(t)); err != nil {
		t.Fatal(err)
	}
	sum := func(name string, match func(attribute.Set) bool) int64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != name {
					continue
				}
				for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
					if match == nil || match(p.Attributes) {
						n += p.Value
					}
				}
			}
		}
		return n
	}
	is := func(k, v string) func(attribute.Set) bool {
		return func(s attribute.Set) bool { got, _ := s.Value(attribute.Key(k)); return got.AsString() == v }
	}
	allowedFrom := func(src string) int64 {
		return sum("rlfn.client.decisions", func(s attribute.Set) bool {
			return is("rlfn.source", src)(s) && is("rlfn.outcome", "allowed")(s) && is("rlfn.operation", "allow")(s)
		})
	}
	hits, server := allowedFrom("leased"), allowedFrom("server")
	batches, units := sum("rlfn.client.leased.batches", nil), sum("rlfn.client.leased.units", nil)
	refunded := sum("rlfn.client.leased.refunded", is("rlfn.algorithm", "token_bucket"))
	t.Logf("%d admitted: %d hits, %d by the server; %d batches of %d units; %d parked, %d refunded",
		admitted, hits, server, batches, units, parked, refunded)
	if hits+server != admitted || hits == 0 || batches == 0 {
		t.Fatalf("%d hits + %d server admissions, want the %d admitted, with some hits", hits, server, admitted)
	}
	if units != hits+parked {
		t.Fatalf("batches took %d units beyond their calls, want %d handed out + %d parked", units, hits, parked)
	}
	if refunded != parked {
		t.Fatalf("%d refunded, want the %d parked at Close", refunded, parked)
	}
}
