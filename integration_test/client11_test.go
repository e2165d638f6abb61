package integration_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/versions"
)

// A reserve is left to critical calls: others stop Reserve units short of the limit.
func TestClientReserve(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		crit := client.Critical(ctx)
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		key := keyFor(t)
		limit := client.TokenBucket{Capacity: 5, Rate: 1, Period: time.Hour, Reserve: 2}
		for i := range 3 {
			if r, err := lim.Allow(ctx, key, limit); err != nil || !r.Allowed || r.Remaining != int64(2-i) {
				t.Fatalf("call %d: %+v, %v", i+1, r, err)
			}
		}
		if r, err := lim.Allow(ctx, key, limit); err != nil || r.Allowed || r.RetryAfter <= 0 {
			t.Fatalf("the reserve was given to a normal call: %+v, %v", r, err)
		}
		if r, err := lim.Peek(crit, key, limit); err != nil || !r.Allowed || r.Remaining != 2 {
			t.Fatalf("critical peek: %+v, %v", r, err)
		}
		for i := range 2 {
			if r, err := lim.Allow(crit, key, limit); err != nil || !r.Allowed {
				t.Fatalf("critical call %d: %+v, %v", i+1, r, err)
			}
		}
		if r, err := lim.Allow(crit, key, limit); err != nil || r.Allowed {
			t.Fatalf("over the limit: %+v, %v", r, err)
		}
	})
}

// A refund gives units back, so that the same units are admitted again, on every algorithm.
func TestClientRefund(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		for _, l := range clientLimits {
			t.Run(l.name, func(t *testing.T) {
				ctx := ctx5s(t)
				key := keyFor(t)
				if l.windowed {
					roomInWindow(t, tg.c, 60_000, 2*time.Second)
				}
				if r, err := lim.AllowN(ctx, key, l.limit, 3); err != nil || !r.Allowed {
					t.Fatalf("charge: %+v, %v", r, err)
				}
				r, err := lim.Refund(ctx, key, l.limit, 2)
				if err != nil || !r.Allowed || r.Remaining != 2 || r.Source == client.FromFallback {
					t.Fatalf("refund: %+v, %v; want 2 remaining", r, err)
				}
				if r, err := lim.AllowN(ctx, key, l.limit, 2); err != nil || !r.Allowed || r.Remaining != 0 {
					t.Fatalf("after the refund: %+v, %v", r, err)
				}
				if r, err := lim.Refund(ctx, keyFor(t), l.limit, 5); err != nil || r.Remaining != 3 {
					t.Fatalf("refund of an absent key: %+v, %v", r, err)
				}
			})
		}
	})
}

// Leases: a slot per holder up to the limit, renewal, release, expiry.
func TestClientLeases(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		key := keyFor(t)
		c := client.Concurrency{Limit: 3, Lease: 10 * time.Second}
		var leases []*client.Lease
		for i := range 3 {
			le, r, err := lim.Acquire(ctx, key, c)
			if err != nil || le == nil || !r.Allowed || r.Remaining != int64(2-i) {
				t.Fatalf("acquire %d: %+v, %v", i+1, r, err)
			}
			leases = append(leases, le)
		}
		if le, r, err := lim.Acquire(ctx, key, c); err != nil || le != nil || r.Allowed || r.RetryAfter <= 0 {
			t.Fatalf("a 4th holder: %+v, %v", r, err)
		}
		if r, err := leases[0].Renew(ctx); err != nil || !r.Allowed {
			t.Fatalf("renew: %+v, %v", r, err)
		}
		if r, err := leases[1].Release(ctx); err != nil || !r.Allowed || r.Remaining != 1 {
			t.Fatalf("release: %+v, %v", r, err)
		}
		if r, err := leases[1].Release(ctx); err != nil || r.Allowed {
			t.Fatalf("a second release: %+v, %v", r, err)
		}
		if le, r, err := lim.Acquire(ctx, key, c); err != nil || le == nil || !r.Allowed {
			t.Fatalf("acquire after a release: %+v, %v", r, err)
		}

		// a short lease expires, and frees its slot
		short := client.Concurrency{Limit: 1, Lease: 200 * time.Millisecond}
		skey := keyFor(t)
		le, r, err := lim.Acquire(ctx, skey, short)
		if err != nil || !r.Allowed {
			t.Fatalf("short lease: %+v, %v", r, err)
		}
		if _, r, err := lim.Acquire(ctx, skey, short); err != nil || r.Allowed {
			t.Fatalf("second holder of a held slot: %+v, %v", r, err)
		}
		time.Sleep(300 * time.Millisecond)
		if r, err := le.Release(ctx); err != nil || r.Allowed {
			t.Fatalf("release of an expired lease: %+v, %v", r, err)
		}
		if _, r, err := lim.Acquire(ctx, skey, short); err != nil || !r.Allowed {
			t.Fatalf("after expiry: %+v, %v", r, err)
		}
	})
}

// 64 goroutines taking and releasing leases never hold more than the limit at once.
func TestClientLeasesConcurrent(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		key := keyFor(t)
		c := client.Concurrency{Limit: 5, Lease: 30 * time.Second}
		var held, most, admitted atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for range 64 {
			wg.Go(func() {
				ctx := context.Background()
				for range 10 {
					le, r, err := lim.Acquire(ctx, key, c)
					if err != nil {
						errs <- err
						return
					}
					if !r.Allowed {
						continue
					}
					admitted.Add(1)
					n := held.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(time.Millisecond)
					held.Add(-1)
					if _, err := le.Release(ctx); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if most.Load() > 5 || admitted.Load() == 0 {
			t.Fatalf("%d leases held at once (limit 5), %d admitted", most.Load(), admitted.Load())
		}
	})
}

// One principal's limits are decided in one rl_multi, all or nothing; the Result names the
// limit that denied, and the others consumed nothing.
func TestClientAllowAllSamePrincipal(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		key := keyFor(t)
		perSecond := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour}
		hourly := client.TokenBucket{Capacity: 3, Rate: 1, Period: time.Hour, Name: "hourly"}
		rules := []client.Rule{{Key: key, Limit: perSecond}, {Key: key, Limit: hourly}}
		for i := range 3 {
			r, err := lim.AllowAll(ctx, rules)
			if err != nil || !r.Allowed || r.Rule != 1 || r.Remaining != int64(2-i) {
				t.Fatalf("call %d: %+v, %v", i+1, r, err)
			}
		}
		r, err := lim.AllowAll(ctx, rules)
		if err != nil || r.Allowed || r.Rule != 1 || r.Limit != 3 {
			t.Fatalf("call 4: %+v, %v; want denied by rule 1", r, err)
		}
		if p, err := lim.Peek(ctx, key, perSecond); err != nil || p.Remaining != 7 {
			t.Fatalf("the other limit consumed: %+v, %v", p, err)
		}
		if p, err := lim.PeekAll(ctx, rules); err != nil || p.Allowed || p.Rule != 1 {
			t.Fatalf("peek all: %+v, %v", p, err)
		}
	})
}

// The login triple: (IP, user), IP and user are three principals, decided side by side; a
// denial by one leaves the others as they were.
func TestClientAllowAllCrossPrincipal(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		base := keyFor(t)
		ipUser, ip, user := base+":ip:user", base+":ip", base+":user"
		rules := []client.Rule{
			{Key: ipUser, Limit: client.SlidingLog{Limit: 5, Window: time.Hour}},
			{Key: ip, Limit: client.TokenBucket{Capacity: 20, Rate: 1, Period: time.Hour}},
			{Key: user, Limit: client.TokenBucket{Capacity: 2, Rate: 1, Period: time.Hour}},
		}
		for i := range 2 {
			if r, err := lim.AllowAll(ctx, rules); err != nil || !r.Allowed {
				t.Fatalf("login %d: %+v, %v", i+1, r, err)
			}
		}
		for range 3 {
			r, err := lim.AllowAll(ctx, rules)
			if err != nil || r.Allowed || r.Rule != 2 {
				t.Fatalf("login over the user's limit: %+v, %v; want denied by rule 2", r, err)
			}
		}
		for i, want := range []int64{3, 18, 0} {
			if p, err := lim.Peek(ctx, rules[i].Key, rules[i].Limit); err != nil || p.Remaining != want {
				t.Errorf("rule %d after the denials: %+v, %v; want %d remaining", i, p, err, want)
			}
		}
	})
}

// Against a node running 1.0.0, a call that needs a 1.1 feature is left to the policy:
// ReturnError returns a *VersionError naming the node and the feature, FailOpen admits and the
// local fallback decides, both locally; the node is asked once, not again on every call until a
// breaker cooldown has passed. 1.0 calls keep being decided by the node, and so is AllowAll
// across keys, one key at a time with 1.0's own calls, never with no limit.
func TestClientVersionErrorOn10(t *testing.T) {
	old, ok := versions.Embedded().Find("1.0.0")
	if !ok {
		t.Fatal("no release 1.0.0")
	}
	s := harness.StartValkey(t)
	loadCode(t, s.Client(t), old.Code)
	vk := s.Client(t)
	for _, p := range []client.Fallback{client.ReturnError, client.FailOpen, client.LocalFallback} {
		t.Run(p.String(), func(t *testing.T) {
			ctx := ctx5s(t)
			lim := harness.NewLimiter(t, vk, client.Options{Deadline: slowDeadline, Fallback: p})
			tb := client.TokenBucket{Capacity: 5, Rate: 1, Period: time.Hour}
			k := keyFor(t)
			if r, err := lim.Allow(ctx, k, tb); err != nil || !r.Allowed || r.Source == client.FromFallback {
				t.Fatalf("a 1.0 call: %+v, %v", r, err)
			}
			reserved := tb
			reserved.Reserve = 1
			// in this order: the first is the one the node refuses, the others are decided
			// from the breaker's memory of it
			calls := []struct {
				what string
				call func() (client.Result, error)
			}{
				{"rl_token_bucket reserve", func() (client.Result, error) { return lim.Allow(ctx, k, reserved) }},
				{"rl_token_bucket_refund", func() (client.Result, error) { return lim.Refund(ctx, k, tb, 1) }},
				{"rl_concurrency", func() (client.Result, error) {
					_, r, err := lim.Acquire(ctx, k+":conc", client.Concurrency{Limit: 1, Lease: time.Second})
					return r, err
				}},
				{"rl_multi", func() (client.Result, error) {
					return lim.AllowAll(ctx, []client.Rule{{Key: k, Limit: tb}, {Key: k, Limit: client.FixedWindow{Limit: 1, Window: time.Second}}})
				}},
			}
			fcalls := commandCalls(t, vk, "fcall").Calls
			for _, c := range calls {
				r, err := c.call()
				var ve *client.VersionError
				switch p {
				case client.ReturnError:
					if !errors.As(err, &ve) || ve.Node != s.Addr || ve.Version != "1.0.0" || ve.Want != "1.1.0" || ve.Function != c.what {
						t.Errorf("%s: got %v, want a *VersionError naming %s and %s", c.what, err, s.Addr, c.what)
					}
				case client.FailOpen:
					if err != nil || r.Source != client.FromFallback || (c.what != "rl_token_bucket_refund" && !r.Allowed) {
						t.Errorf("%s: %+v, %v; want admitted locally", c.what, r, err)
					}
				case client.LocalFallback:
					if err != nil || r.Source != client.FromFallback || (c.what != "rl_token_bucket_refund" && !r.Allowed) {
						t.Errorf("%s: %+v, %v; want decided (here admitted) locally", c.what, r, err)
					}
				}
			}
			// the reserve reached the node (refused there, before it took anything); the others
			// were decided without a round trip
			if n := commandCalls(t, vk, "fcall").Calls - fcalls; n != 1 {
				t.Errorf("the node ran %d FCALL for %d calls that need 1.1.0, want 1", n, len(calls))
			}
			if r, err := lim.Peek(ctx, k, tb); err != nil || r.Source == client.FromFallback || r.Remaining != 4 {
				t.Errorf("the calls the node could not decide took from its token bucket: %+v, %v", r, err)
			}

			// AllowAll across keys: 1.0 cannot refund, so each key is decided by the node with
			// 1.0's own call, one after the other; ReturnError wants the error instead (the
			// decision would not be all or nothing), with nothing taken.
			other := client.SlidingLog{Limit: 1, Window: time.Minute}
			across := []client.Rule{{Key: k, Limit: tb}, {Key: k + ":other", Limit: other}}
			if p == client.ReturnError {
				var ve *client.VersionError
				if _, err := lim.AllowAll(ctx, across); !errors.As(err, &ve) || ve.Function != "rl_token_bucket_refund" && ve.Function != "rl_sliding_log_refund" {
					t.Errorf("AllowAll across keys: %v; want a *VersionError naming a refund", err)
				}
				if r, err := lim.Peek(ctx, k, tb); err != nil || r.Remaining != 4 {
					t.Errorf("AllowAll across keys under ReturnError took from the token bucket: %+v, %v", r, err)
				}
				return
			}
			if r, err := lim.AllowAll(ctx, across); err != nil || !r.Allowed || r.Source == client.FromFallback {
				t.Errorf("AllowAll across keys: %+v, %v; want admitted by the node", r, err)
			}
			if r, err := lim.Peek(ctx, k, tb); err != nil || r.Remaining != 3 {
				t.Errorf("AllowAll across keys: the token bucket %+v, %v; want 3 remaining", r, err)
			}
			if r, err := lim.Peek(ctx, k+":other", other); err != nil || r.Remaining != 0 {
				t.Errorf("AllowAll across keys: the sliding log %+v, %v; want 0 remaining", r, err)
			}
			// the sliding log denies the next: by the node, and the token bucket's unit, if
			// it took one first, stays taken (stricter, never more permissive)
			if r, err := lim.AllowAll(ctx, across); err != nil || r.Allowed || r.Source == client.FromFallback || r.Rule != 1 {
				t.Errorf("AllowAll across keys over the log's limit: %+v, %v; want denied by the node, rule 1", r, err)
			}
			if r, err := lim.Peek(ctx, k, tb); err != nil || r.Remaining > 3 || r.Remaining < 2 {
				t.Errorf("after a denial across keys: the token bucket %+v, %v; want 3 or 2 remaining", r, err)
			}
			if r, err := lim.Allow(client.Critical(ctx), k, reserved); err != nil || !r.Allowed || r.Source == client.FromFallback {
				t.Errorf("a critical call sends no reserve, so 1.0 serves it: %+v, %v", r, err)
			}
		})
	}
	var ve *client.VersionError
	if err := harness.NewLimiter(t, vk, slowMachine).CheckVersion(ctx5s(t), "1.1.0"); !errors.As(err, &ve) || ve.Node != s.Addr {
		t.Errorf("CheckVersion: got %v", err)
	}
	if err := harness.NewLimiter(t, vk, slowMachine).Check(ctx5s(t)); err != nil {
		t.Errorf("Check: %v", err)
	}
}

// With the server gone, each new call is decided by the policy, within the deadline.
func TestClient11ServerGone(t *testing.T) {
	s := harness.StartValkey(t)
	vk := s.Client(t)
	ctx := ctx5s(t)
	if err := load(ctx, vk); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	tb := client.TokenBucket{Capacity: 8, Rate: 1, Period: time.Hour, Reserve: 2}
	conc := client.Concurrency{Limit: 8, Lease: time.Minute}
	rules := []client.Rule{{Key: "a", Limit: tb}, {Key: "a", Limit: client.FixedWindow{Limit: 8, Window: time.Hour}}, {Key: "b", Limit: tb}}
	for _, p := range []client.Fallback{client.ReturnError, client.FailOpen, client.FailClosed, client.LocalFallback} {
		t.Run(p.String(), func(t *testing.T) {
			lim := harness.NewLimiter(t, vk, client.Options{Fallback: p, Deadline: failDeadline, Instances: 2})
			type out struct {
				r   client.Result
				err error
			}
			// in this order: the local reserve's count below takes the refund after the charge
			// (a map's order, random, ran the refund first one run in a few)
			run := []struct {
				name string
				f    func() out
			}{
				{"reserve", func() out { r, err := lim.AllowN(ctx, "k", tb, 2); return out{r, err} }},
				{"refund", func() out { r, err := lim.Refund(ctx, "k", tb, 1); return out{r, err} }},
				{"acquire", func() out { _, r, err := lim.Acquire(ctx, "k", conc); return out{r, err} }},
				{"all", func() out { r, err := lim.AllowAll(ctx, rules); return out{r, err} }},
			}
			for _, c := range run {
				name := c.name
				start := time.Now()
				o := c.f()
				if took := time.Since(start); took > 2*(failDeadline+slack) {
					t.Errorf("%s took %s", name, took)
				}
				switch p {
				case client.ReturnError:
					if o.err == nil {
						t.Errorf("%s: %+v, want an error", name, o.r)
					}
				case client.FailOpen:
					if o.err != nil || !o.r.Allowed || o.r.Source != client.FromFallback {
						t.Errorf("%s: %+v, %v; want a local admission", name, o.r, o.err)
					}
				case client.FailClosed:
					if want := name == "refund"; o.err != nil || o.r.Allowed != want || o.r.Source != client.FromFallback {
						t.Errorf("%s: %+v, %v; want local, allowed %v", name, o.r, o.err, want)
					}
				case client.LocalFallback:
					if o.err != nil || !o.r.Allowed || o.r.Source != client.FromFallback {
						t.Errorf("%s: %+v, %v; want a local admission", name, o.r, o.err)
					}
				}
			}
			if p != client.LocalFallback {
				return
			}
			// the local share is 4 with a local reserve of 1: 2 taken, 1 refunded, then 2 more
			// and nothing beyond the reserve
			if r, err := lim.AllowN(ctx, "k", tb, 2); err != nil || !r.Allowed || r.Remaining != 0 {
				t.Errorf("local reserve: %+v, %v", r, err)
			}
			if r, err := lim.Allow(ctx, "k", tb); err != nil || r.Allowed {
				t.Errorf("local reserve given away: %+v, %v", r, err)
			}
			if r, err := lim.Allow(client.Critical(ctx), "k", tb); err != nil || !r.Allowed {
				t.Errorf("local critical call: %+v, %v", r, err)
			}
			for i := range 4 {
				_, r, err := lim.Acquire(ctx, "c", conc)
				if err != nil || r.Allowed != (i < 4) {
					t.Errorf("local lease %d: %+v, %v", i+1, r, err)
				}
			}
			if _, r, err := lim.Acquire(ctx, "c", conc); err != nil || r.Allowed {
				t.Errorf("a 5th local lease of a share of 4: %+v, %v", r, err)
			}
		})
	}
}
