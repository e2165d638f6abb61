package integration_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/internal/override"
)

// cachingClient is a client of tg's servers with client-side caching on (valkey-go's
// default), as a service's: the shared targets' clients turn it off.
func cachingClient(t testing.TB, tg *target) valkey.Client {
	t.Helper()
	var addrs []string
	for addr := range tg.c.Nodes() {
		addrs = append(addrs, addr)
	}
	slices.Sort(addrs)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: addrs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// ovrEnv is one test's overrides: a prefix of its own (the store is per prefix, and the
// targets are shared), a Limiter that obeys them, and the store rlfn writes.
type ovrEnv struct {
	prefix string
	vk     valkey.Client
	lim    *client.Limiter
	store  *override.Store
}

func newOvrEnv(t testing.TB, tg *target, o client.Options) *ovrEnv {
	t.Helper()
	e := &ovrEnv{prefix: keyFor(t) + ":", vk: cachingClient(t, tg)}
	o.Prefix, o.Overrides = e.prefix, true
	if o.Fallback == 0 {
		o.Fallback = client.ReturnError
	}
	if o.Deadline == 0 {
		o.Deadline = slowMachine.Deadline
	}
	e.lim = harness.NewLimiter(t, e.vk, o)
	e.store = override.NewStore(tg.c, e.prefix)
	return e
}

// set writes overrides as rlfn does, and waits until the Limiter decides with them.
func (e *ovrEnv) set(t testing.TB, os ...override.Override) {
	t.Helper()
	var changes []override.Change
	for _, o := range os {
		changes = append(changes, override.Change{Op: override.Add, New: &o})
	}
	e.apply(t, changes)
}

func (e *ovrEnv) remove(t testing.TB, ids ...override.ID) {
	t.Helper()
	var changes []override.Change
	for _, id := range ids {
		changes = append(changes, override.Change{Op: override.Remove, Old: &override.Override{Policy: id.Policy, Key: id.Key}})
	}
	e.apply(t, changes)
}

func (e *ovrEnv) apply(t testing.TB, changes []override.Change) {
	t.Helper()
	v, err := e.store.Apply(ctx5s(t), changes, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The change reaches the Limiter on its own (the test of that is TestOverridePropagates);
	// here each step must start from it.
	if err := e.lim.SyncOverrides(ctx5s(t)); err != nil {
		t.Fatal(err)
	}
	if got := e.lim.OverridesVersion(); got != v {
		t.Fatalf("the Limiter decides with version %q after SyncOverrides, the store is at %q", got, v)
	}
}

func tbOverride(key string, capacity int64) override.Override {
	return override.Override{Policy: override.Policy{Algorithm: "token_bucket"}, Key: key,
		Limit: override.Fields{Capacity: capacity, Rate: 1, Period: "1h"}}
}

// TestOverrideApplies: an override replaces the code's limit of its key, or of the keys its
// pattern matches, by precedence (exact, then the longest prefix); Result.Override says which;
// another limit of the key (another algorithm, or Name) keeps the code's; removed or ended,
// the code's limit is back, on the state the override left.
func TestOverrideApplies(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		e := newOvrEnv(t, tg, client.Options{})
		ctx := ctx5s(t)
		code := client.Limit(client.TokenBucket{Capacity: 2, Rate: 1, Period: time.Hour})
		named := client.Limit(client.TokenBucket{Capacity: 2, Rate: 1, Period: time.Hour, Name: "api"})
		if err := e.lim.SyncOverrides(ctx); err != nil {
			t.Fatal(err)
		}
		e.set(t, tbOverride("user:42", 10), tbOverride("user:*", 5), tbOverride("user:4*", 7))
		for _, tt := range []struct {
			key, from string
			limit     client.Limit
			want      int64
		}{
			{"user:42", "user:42", code, 10},
			{"user:43", "user:4*", code, 7},
			{"user:5", "user:*", code, 5},
			{"svc:1", "", code, 2},
			{"user:42", "", named, 2}, // another policy: token_bucket:api
		} {
			res, err := e.lim.Allow(ctx, tt.key, tt.limit)
			if err != nil {
				t.Fatal(err)
			}
			from := ""
			if res.Override != nil {
				from = res.Override.Key
				if q := res.Override.Limit.Quota(); q.Limit != tt.want {
					t.Errorf("%s: Override.Limit %+v, want capacity %d", tt.key, res.Override.Limit, tt.want)
				}
			}
			if from != tt.from || res.Limit != tt.want || !res.Allowed || res.Remaining != tt.want-1 {
				t.Errorf("%s (%s): %+v, override %q; want limit %d from %q", tt.key, tt.limit.(client.TokenBucket).Name, res, from, tt.want, tt.from)
			}
		}
		// Peek and Refund see it too.
		if res, err := e.lim.Peek(ctx, "user:42", code); err != nil || res.Limit != 10 || res.Override == nil {
			t.Errorf("Peek under an override: %+v, %v", res, err)
		}
		if res, err := e.lim.Refund(ctx, "user:42", code, 100); err != nil || res.Limit != 10 || res.Remaining != 10 || res.Override == nil {
			t.Errorf("Refund under an override: %+v, %v (a refund fills up to the override's capacity)", res, err)
		}
		// AllowAll: each rule its own; the binding result names the deciding rule's.
		res, each, err := e.lim.AllowAllEach(ctx, []client.Rule{{Key: "user:42", Limit: code}, {Key: "svc:1", Limit: code}}, 1)
		if err != nil || each[0].Override == nil || each[0].Override.Key != "user:42" || each[1].Override != nil ||
			res.Rule != 1 || res.Override != nil {
			t.Errorf("AllowAllEach: %+v %+v, %v", res, each, err)
		}

		// Removed: the code's limit, on the state the override left (9 taken of 10: the
		// bucket is fuller than 2, and admits 2 at most).
		e.remove(t, override.ID{Policy: override.Policy{Algorithm: "token_bucket"}, Key: "user:42"})
		res, err = e.lim.Allow(ctx, "user:42", code)
		if err != nil || res.Override == nil || res.Override.Key != "user:4*" || res.Limit != 7 {
			t.Errorf("user:42 with its exact override removed: %+v, %v; want user:4*'s", res, err)
		}
		e.remove(t, override.ID{Policy: override.Policy{Algorithm: "token_bucket"}, Key: "user:4*"},
			override.ID{Policy: override.Policy{Algorithm: "token_bucket"}, Key: "user:*"})
		res, err = e.lim.Allow(ctx, "user:42", code)
		if err != nil || res.Override != nil || res.Limit != 2 {
			t.Errorf("user:42 with every override removed: %+v, %v; want the code's capacity 2", res, err)
		}

		// An override with an end: in force until then, the code's after.
		o := tbOverride("end:1", 50)
		o.Until = time.Now().Add(1500 * time.Millisecond)
		e.set(t, o)
		if res, err := e.lim.Allow(ctx, "end:1", code); err != nil || res.Limit != 50 || !res.Override.Until.Equal(o.Until) {
			t.Errorf("before its end: %+v, %v", res, err)
		}
		time.Sleep(time.Until(o.Until) + 10*time.Millisecond)
		if res, err := e.lim.Allow(ctx, "end:1", code); err != nil || res.Limit != 2 || res.Override != nil {
			t.Errorf("after its end: %+v, %v; want the code's", res, err)
		}
	})
}

// TestOverrideLiveState: a lowered limit meets state counted under the higher one. Never
// over the new limit: a token bucket fuller than its new capacity admits at most the new
// capacity, and one emptier than the new capacity allows is empty, refilling at the new rate;
// a window, log or leaky bucket that counted more than its new limit denies until
// enough has expired or leaked; a concurrency limit lowered below its live leases refuses new
// holders until enough leases end, while a holder's renewal keeps its slot. A raised limit
// admits at once what the new limit leaves.
func TestOverrideLiveState(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		e := newOvrEnv(t, tg, client.Options{})
		ctx := ctx5s(t)
		for _, tt := range []struct {
			name   string
			code   client.Limit
			fields override.Fields
			used   int64 // taken under the code's limit first
			admits int64 // then admitted under the override, at most
			denial time.Duration
		}{
			// a bucket's state is the units it took and has not refilled: 1 taken of 10 (9
			// tokens, fuller than the new capacity) leaves 3 - 1 = 2; 6 taken, none
			{"token_bucket", client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour},
				override.Fields{Capacity: 3, Rate: 1, Period: "1h"}, 1, 2, 0},
			{"token_bucket", client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour, Name: "over"},
				override.Fields{Capacity: 3, Rate: 1, Period: "1h"}, 6, 0, 0},
			{"fixed_window", client.FixedWindow{Limit: 10, Window: time.Hour},
				override.Fields{Limit: 3, Window: override.Duration(time.Hour)}, 5, 0, 0},
			{"sliding_log", client.SlidingLog{Limit: 10, Window: time.Hour},
				override.Fields{Limit: 3, Window: override.Duration(time.Hour)}, 5, 0, 0},
			{"sliding_window", client.SlidingWindow{Limit: 10, Window: time.Hour},
				override.Fields{Limit: 3, Window: override.Duration(time.Hour)}, 5, 0, 0},
			{"leaky_bucket", client.LeakyBucket{Capacity: 10, Rate: 1, Period: time.Hour},
				override.Fields{Capacity: 3, Rate: 1, Period: "1h"}, 5, 0, 0},
			{"leaky_bucket", client.LeakyBucket{Capacity: 10, Rate: 1, Period: time.Hour, Mode: client.Shape, Name: "shape"},
				override.Fields{Capacity: 3, Rate: 1, Period: "1h", Mode: "shape"}, 5, 0, 0},
			{"calendar", client.Calendar{Limit: 10, Period: client.Year},
				override.Fields{Limit: 3, Period: "year"}, 5, 0, 0},
			// raised: 5 of 10 used, the override's 20 leaves 15
			{"fixed_window", client.FixedWindow{Limit: 10, Window: time.Hour, Name: "raised"},
				override.Fields{Limit: 20, Window: override.Duration(time.Hour)}, 5, 15, 0},
			{"token_bucket", client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour, Name: "raised"},
				override.Fields{Capacity: 20, Rate: 1, Period: "1h"}, 6, 14, 0},
		} {
			key := keyFor(t)
			name := ""
			switch l := tt.code.(type) {
			case client.LeakyBucket:
				name = l.Name
			case client.FixedWindow:
				name = l.Name
			case client.TokenBucket:
				name = l.Name
			}
			for i := int64(0); i < tt.used; i++ {
				if res, err := e.lim.Allow(ctx, key, tt.code); err != nil || !res.Allowed {
					t.Fatalf("%s: call %d under the code's limit: %+v, %v", tt.name, i, res, err)
				}
			}
			e.set(t, override.Override{Policy: override.Policy{Algorithm: tt.name, Name: name}, Key: key, Limit: tt.fields})
			var admitted int64
			for i := 0; i < 30; i++ {
				res, err := e.lim.Allow(ctx, key, tt.code)
				if err != nil {
					t.Fatal(err)
				}
				if res.Override == nil {
					t.Fatalf("%s %s: decided without the override: %+v", tt.name, name, res)
				}
				if !res.Allowed {
					if res.RetryAfter <= 0 {
						t.Errorf("%s %s: a denial with RetryAfter %s", tt.name, name, res.RetryAfter)
					}
					break
				}
				admitted++
			}
			if admitted != tt.admits {
				t.Errorf("%s %s: %d used of the code's limit, then the override admits %d, want %d", tt.name, name, tt.used, admitted, tt.admits)
			}
		}

		// A bucket emptier than its new capacity allows is empty, no more: the units taken
		// beyond the new capacity are forgotten, so it admits again once one unit has
		// refilled at the new rate (250ms), not once all those taken have (the library caps
		// the state at the new capacity). 6 taken of 10, then a capacity of 3 refilling one
		// per 250ms: denied for at most 250ms, full within 750ms.
		{
			key := keyFor(t)
			code := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour, Name: "refill"}
			for i := range 6 {
				if res, err := e.lim.Allow(ctx, key, code); err != nil || !res.Allowed {
					t.Fatalf("refill: call %d under the code's limit: %+v, %v", i, res, err)
				}
			}
			e.set(t, override.Override{Policy: override.Policy{Algorithm: "token_bucket", Name: "refill"}, Key: key,
				Limit: override.Fields{Capacity: 3, Rate: 1, Period: "250ms"}})
			res, err := e.lim.Allow(ctx, key, code)
			if err != nil || res.Allowed || res.Override == nil || res.Remaining != 0 ||
				res.RetryAfter <= 0 || res.RetryAfter > 250*time.Millisecond || res.ResetAfter > 750*time.Millisecond {
				t.Fatalf("6 taken of 10, then a capacity of 3 at 1 per 250ms: %+v, %v; want denied for at most one token's 250ms, full within 750ms", res, err)
			}
			time.Sleep(res.RetryAfter + 20*time.Millisecond)
			if res, err := e.lim.Allow(ctx, key, code); err != nil || !res.Allowed || res.Limit != 3 {
				t.Errorf("refill: once one token refilled: %+v, %v; want admitted", res, err)
			}
		}

		// Concurrency: 3 leases under a limit of 5; lowered to 2, a new holder is refused,
		// the holders' renewals keep their slots; once 2 are released, a slot is free again
		// (3 - 2 = 1 held, 1 free under 2).
		key := keyFor(t)
		code := client.Concurrency{Limit: 5, Lease: time.Minute}
		var leases []*client.Lease
		for i := 0; i < 3; i++ {
			le, res, err := e.lim.Acquire(ctx, key, code)
			if err != nil || !res.Allowed {
				t.Fatalf("lease %d: %+v, %v", i, res, err)
			}
			leases = append(leases, le)
		}
		e.set(t, override.Override{Policy: override.Policy{Algorithm: "concurrency"}, Key: key,
			Limit: override.Fields{Limit: 2, Lease: override.Duration(time.Minute)}})
		if le, res, err := e.lim.Acquire(ctx, key, code); err != nil || res.Allowed || le != nil || res.Limit != 2 || res.Override == nil || res.Override.Slots != 2 {
			t.Errorf("a new holder with 3 leases live under a lowered limit of 2: %+v, %v; want denied", res, err)
		}
		if res, err := leases[0].Renew(ctx); err != nil || !res.Allowed {
			t.Errorf("a holder's renewal under the lowered limit: %+v, %v; want admitted (it keeps its slot)", res, err)
		}
		for _, le := range leases[:2] {
			if _, err := le.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if le, res, err := e.lim.Acquire(ctx, key, code); err != nil || !res.Allowed || res.Remaining != 0 {
			t.Errorf("1 lease live under 2: %+v, %v; want admitted, none left", res, err)
		} else {
			le.Release(ctx)
		}
		leases[2].Release(ctx)
	})
}

// TestOverrideNoServerCommand: with overrides on and set, decisions under load send nothing
// to the server but their FCALLs: the store's GET and HGETALL are counted by the server's
// commandstats while 8 goroutines make 4000 decisions after the Limiter read them: none.
func TestOverrideNoServerCommand(t *testing.T) {
	tg := servers(t)[0] // one standalone Valkey: commandstats are per node
	e := newOvrEnv(t, tg, client.Options{})
	e.set(t, tbOverride("hot:*", 1_000_000))
	limit := client.Limit(client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour})
	// SyncOverrides read the server; the first read through the cache fills it
	runLoad(t, e.lim, 1, 10, "hot:", limit)
	time.Sleep(10 * time.Millisecond)
	runLoad(t, e.lim, 1, 10, "hot:", limit)
	before := commandCounts(t, tg.c)
	decisions := runLoad(t, e.lim, 8, 500, "hot:", limit)
	after := commandCounts(t, tg.c)
	gets, hgetalls, fcalls := after["hget"]-before["hget"], after["hgetall"]-before["hgetall"], after["fcall"]-before["fcall"]
	t.Logf("%d decisions: %d FCALL, %d HGET, %d HGETALL", decisions, fcalls, gets, hgetalls)
	if fcalls != decisions || gets > 0 || hgetalls > 0 {
		t.Errorf("%d decisions sent %d FCALL, %d HGET, %d HGETALL; want one FCALL per decision, and no read of the store (its version is in the client's cache)", decisions, fcalls, gets, hgetalls)
	}
}

// runLoad makes n decisions from each of g goroutines on keys prefix+i, and returns how many
// were made.
func runLoad(t testing.TB, lim *client.Limiter, g, n int, prefix string, limit client.Limit) int64 {
	t.Helper()
	errs := make(chan error, g)
	for i := 0; i < g; i++ {
		go func() {
			for j := 0; j < n; j++ {
				res, err := lim.Allow(context.Background(), fmt.Sprintf("%s%d", prefix, i), limit)
				if err == nil && res.Override == nil {
					err = fmt.Errorf("a decision without the override: %+v", res)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for i := 0; i < g; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	return int64(g * n)
}

// commandCounts is INFO commandstats' calls per command, lower case: hget and hgetall (the
// store's reads: the library never runs them), fcall.
func commandCounts(t testing.TB, c valkey.Client) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, cmd := range []string{"hget", "hgetall", "fcall"} {
		st, err := harness.CommandStats(ctx5s(t), c, cmd)
		if err != nil {
			t.Fatal(err)
		}
		out[cmd] = st.Calls
	}
	return out
}

// TestOverrideStoreUnreadable: when the store cannot be read, the Limiter keeps the last
// overrides it read (and says so in rlfn.client.overrides.errors), and decides as ever (its
// Fallback, here the local one, under the override's limit); a Limiter that never read them
// decides with the code's limits. Its own Valkey, which the test stops.
func TestOverrideStoreUnreadable(t *testing.T) {
	s := harness.StartValkey(t)
	vk := s.Client(t)
	if err := load(ctx5s(t), vk); err != nil {
		t.Fatal(err)
	}
	reader := newMetricReader()
	lim := harness.NewLimiter(t, vk, client.Options{Overrides: true, Deadline: time.Second, MeterProvider: reader.provider})
	store := override.NewStore(vk, "rl:")
	o := tbOverride("cust:42", 100)
	if _, err := store.Apply(ctx5s(t), []override.Change{{Op: override.Add, New: &o}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := lim.SyncOverrides(ctx5s(t)); err != nil {
		t.Fatal(err)
	}
	limit := client.Limit(client.TokenBucket{Capacity: 2, Rate: 1, Period: time.Hour})
	if err := s.Stop(ctx5s(t)); err != nil {
		t.Fatal(err)
	}
	if err := lim.SyncOverrides(ctx5s(t)); err == nil {
		t.Error("SyncOverrides with the server stopped: no error")
	}
	for i := 0; i < 3; i++ {
		res, err := lim.Allow(ctx5s(t), "cust:42", limit)
		if err != nil || res.Source != client.FromFallback || res.Override == nil || res.Override.Key != "cust:42" || res.Limit != 100 {
			t.Errorf("a decision with the store gone: %+v, %v; want the local fallback under the last override (100)", res, err)
		}
	}
	if n := reader.sum(t, "rlfn.client.overrides.errors"); n < 1 {
		t.Errorf("rlfn.client.overrides.errors = %d after a failed read, want at least 1", n)
	}
	fresh := harness.NewLimiter(t, vk, client.Options{Overrides: true, Deadline: time.Second})
	if res, err := fresh.Allow(ctx5s(t), "cust:42", limit); err != nil || res.Override != nil || res.Limit != 2 {
		t.Errorf("a Limiter that never read the store, with the server gone: %+v, %v; want the code's limit", res, err)
	}
}

// TestOverrideWithoutCache: over a client without client-side caching, the Limiter reads the
// store's version once a second, not once per decision (nor once a millisecond).
func TestOverrideWithoutCache(t *testing.T) {
	tg := servers(t)[0]
	prefix := keyFor(t) + ":"
	lim := harness.NewLimiter(t, tg.c, client.Options{Prefix: prefix, Overrides: true, Fallback: client.ReturnError})
	limit := client.Limit(client.FixedWindow{Limit: 1_000_000, Window: time.Hour})
	before := commandCounts(t, tg.c)
	start := time.Now()
	var n int
	for time.Since(start) < 500*time.Millisecond {
		if _, err := lim.Allow(ctx5s(t), prefix+"k", limit); err != nil {
			t.Fatal(err)
		}
		n++
	}
	after := commandCounts(t, tg.c)
	gets := after["hget"] - before["hget"]
	t.Logf("%d decisions in 500ms without client-side caching: %d HGET", n, gets)
	// the first read, overrideMisses (10) reads a millisecond apart, then one a second
	if gets > 13 {
		t.Errorf("%d decisions in 500ms over a client without caching sent %d HGET, want at most 13", n, gets)
	}
}

// TestOverridePropagates: a change written while a Limiter decides under load reaches it on
// its own (the server's invalidation), within 5 seconds at worst; and after the Limiter's
// connections are killed, a later change reaches it too (it reconnects, and reads again).
// How fast it is measured by BenchmarkOverridePropagation.
func TestOverridePropagates(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		e := newOvrEnv(t, tg, client.Options{})
		limit := client.Limit(client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour})
		if err := e.lim.SyncOverrides(ctx5s(t)); err != nil {
			t.Fatal(err)
		}
		stop := backgroundLoad(e.lim, "bg:", limit)
		defer stop()
		for i, kill := range []bool{false, true} {
			if kill {
				killClients(t, tg)
			}
			key := fmt.Sprintf("p:%d", i)
			o := tbOverride(key, int64(100+i))
			if _, err := e.store.Apply(ctx5s(t), []override.Change{{Op: override.Add, New: &o}}, nil); err != nil {
				t.Fatal(err)
			}
			if d, ok := waitOverride(e.lim, key, limit, 5*time.Second); !ok {
				t.Errorf("kill %v: the change was not seen within 5s", kill)
			} else {
				t.Logf("kill %v: seen after %s", kill, d)
			}
		}
	})
}

// backgroundLoad decides on keys prefix+0..3 from 4 goroutines until stopped.
func backgroundLoad(lim *client.Limiter, prefix string, limit client.Limit) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	for i := 0; i < 4; i++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for ctx.Err() == nil {
				lim.Allow(ctx, fmt.Sprintf("%s%d", prefix, i), limit)
			}
		}()
	}
	return func() {
		cancel()
		for i := 0; i < 4; i++ {
			<-done
		}
	}
}

// waitOverride peeks key until a decision names an override, up to max; it returns how long
// that took.
func waitOverride(lim *client.Limiter, key string, limit client.Limit, max time.Duration) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < max {
		res, err := lim.Peek(context.Background(), key, limit)
		if err == nil && res.Override != nil {
			return time.Since(start), true
		}
		time.Sleep(50 * time.Microsecond)
	}
	return 0, false
}

// killClients kills the connections of tg's primaries that track keys for client-side
// caching (CLIENT LIST flag t): the caching Limiters', whose tracking drops with them.
func killClients(t testing.TB, tg *target) {
	t.Helper()
	for addr, n := range tg.c.Nodes() {
		list, err := n.Do(ctx5s(t), n.B().ClientList().Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		killed := 0
		for _, line := range strings.Split(list, "\n") {
			var id int64
			var flags string
			for _, f := range strings.Fields(line) {
				if v, ok := strings.CutPrefix(f, "id="); ok {
					fmt.Sscan(v, &id)
				}
				if v, ok := strings.CutPrefix(f, "flags="); ok {
					flags = v
				}
			}
			if id == 0 || !strings.Contains(flags, "t") {
				continue
			}
			if err := n.Do(ctx5s(t), n.B().ClientKill().Id(id).Build()).Error(); err != nil && !strings.Contains(err.Error(), "No such client") {
				t.Fatalf("%s: CLIENT KILL ID %d: %v", addr, id, err)
			}
			killed++
		}
		t.Logf("%s: killed %d tracking connections", addr, killed)
	}
}

// metricReader collects a Limiter's metrics on demand.
type metricReader struct {
	reader   *sdkmetric.ManualReader
	provider *sdkmetric.MeterProvider
}

func newMetricReader() *metricReader {
	r := sdkmetric.NewManualReader()
	return &metricReader{reader: r, provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))}
}

// sum is the counter name's total over every attribute set.
func (m *metricReader) sum(t testing.TB, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, met := range sm.Metrics {
			if met.Name == name {
				for _, p := range met.Data.(metricdata.Sum[int64]).DataPoints {
					n += p.Value
				}
			}
		}
	}
	return n
}

// TestOverrideIdleFresh: a Limiter that decides nothing becomes current on its own, through
// the server's invalidation of its cached version and its background reader: its first
// decision after a change, however long it was idle, carries the change.
func TestOverrideIdleFresh(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		e := newOvrEnv(t, tg, client.Options{})
		if err := e.lim.SyncOverrides(ctx5s(t)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond) // idle
		o := tbOverride("idle", 77)
		v, err := e.store.Apply(ctx5s(t), []override.Change{{Op: override.Add, New: &o}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for e.lim.OverridesVersion() != v && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		limit := client.Limit(client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour})
		res, err := e.lim.Peek(ctx5s(t), "idle", limit)
		if err != nil || res.Override == nil || res.Limit != 77 {
			t.Errorf("the first decision of an idle Limiter after a change: %+v, %v; want the override of 77 (its version %q, the store's %q)", res, err, e.lim.OverridesVersion(), v)
		}
	})
}

// TestOverrideRebase: a change larger than the delta takes writes a new base; a Limiter follows
// it (a reload by pages), then the small changes after it (the log), and the old base's keys
// are gone. Under --if-version semantics, a base planned from an old version writes nothing.
func TestOverrideRebase(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		e := newOvrEnv(t, tg, client.Options{})
		e.set(t, tbOverride("first", 5))
		var changes []override.Change
		for i := 0; i < override.MaxDelta+50; i++ {
			o := tbOverride(fmt.Sprintf("bulk:%d", i), int64(100+i))
			changes = append(changes, override.Change{Op: override.Add, New: &o})
		}
		e.apply(t, changes)
		before, err := e.store.ReadHead(ctx5s(t))
		if err != nil || before.Gen == "" {
			t.Fatalf("no base after %d changes: %+v, %v", len(changes), before, err)
		}
		limit := client.Limit(client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour})
		for key, want := range map[string]int64{"first": 5, "bulk:0": 100, "bulk:249": 349} {
			if res, err := e.lim.Peek(ctx5s(t), key, limit); err != nil || res.Limit != want {
				t.Errorf("%s after a new base: limit %d, %v; want %d", key, res.Limit, err, want)
			}
		}
		// a change of one override, but larger than a log entry takes, writes a new base too
		big := tbOverride("big", 7)
		big.Note = strings.Repeat("n", override.MaxDeltaBytes)
		e.apply(t, []override.Change{{Op: override.Add, New: &big}})
		if h, err := e.store.ReadHead(ctx5s(t)); err != nil || h.Gen == before.Gen {
			t.Errorf("a change of %d bytes: base %q, %v; want a new base", override.MaxDeltaBytes, h.Gen, err)
		}
		if res, err := e.lim.Peek(ctx5s(t), "big", limit); err != nil || res.Limit != 7 {
			t.Errorf("big after its new base: limit %d, %v; want 7", res.Limit, err)
		}
		e.remove(t, override.ID{Policy: override.Policy{Algorithm: "token_bucket"}, Key: "first"})
		if res, err := e.lim.Peek(ctx5s(t), "first", limit); err != nil || res.Override != nil {
			t.Errorf("first after its removal: %+v, %v", res, err)
		}
		all := []override.Override{tbOverride("only", 9)}
		if _, err := e.store.Replace(ctx5s(t), all, before.Version); !errors.Is(err, override.ErrChanged) {
			t.Errorf("a new base planned from version %s, the store past it: %v, want ErrChanged", before.Version, err)
		}
		now, _ := e.store.ReadHead(ctx5s(t))
		if _, err := e.store.Replace(ctx5s(t), all, now.Version); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < now.Shards; i++ {
			if n, _ := do(t, tg.c, tg.c.B().Exists().Key(override.ShardKey(e.prefix, now.Gen, i)).Build()).AsInt64(); n != 0 {
				t.Errorf("the old base's hash %d is still there", i)
			}
		}
		if err := e.lim.SyncOverrides(ctx5s(t)); err != nil {
			t.Fatal(err)
		}
		if res, err := e.lim.Peek(ctx5s(t), "bulk:0", limit); err != nil || res.Override != nil {
			t.Errorf("bulk:0 after a base without it: %+v, %v", res, err)
		}
		if res, err := e.lim.Peek(ctx5s(t), "only", limit); err != nil || res.Limit != 9 {
			t.Errorf("only: %+v, %v", res, err)
		}
	})
}
