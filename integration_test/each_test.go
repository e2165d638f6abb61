package integration_test

import (
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
)

// AllowAllEach reports every rule's own limiter: rules of one principal (one rl_multi, the
// others' state read by peeks pipelined behind it) and of several (a call each, the admitted
// ones refunded when another denies, reported as the refund left them).
func TestClientAllowAllEach(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		base := keyFor(t)
		burst := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour}
		hourly := client.FixedWindow{Limit: 3, Window: time.Hour, Name: "hourly"}
		ip := client.SlidingLog{Limit: 100, Window: time.Hour}
		rules := []client.Rule{
			{Key: base + ":user", Limit: burst},
			{Key: base + ":user", Limit: hourly},
			{Key: base + ":ip", Limit: ip},
		}
		type want struct {
			allowed   bool
			remaining int64
		}
		check := func(call string, each []client.Result, wants []want) {
			t.Helper()
			if len(each) != len(rules) {
				t.Fatalf("%s: %d results, want %d", call, len(each), len(rules))
			}
			for i, w := range wants {
				e := each[i]
				if e.Allowed != w.allowed || e.Remaining != w.remaining || e.Limit != rules[i].Limit.Quota().Limit ||
					e.Rule != i || e.Source == client.FromFallback || e.ResetAfter <= 0 {
					t.Errorf("%s: rule %d: %+v; want allowed %v, remaining %d, limit %d", call, i, e, w.allowed, w.remaining, rules[i].Limit.Quota().Limit)
				}
			}
		}
		for i := range int64(3) {
			res, each, err := lim.AllowAllEach(ctx, rules, 1)
			if err != nil || !res.Allowed || res.Rule != 1 || res.Remaining != 2-i {
				t.Fatalf("call %d: %+v, %v; want admitted, hourly binding", i+1, res, err)
			}
			check("admitted", each, []want{{true, 9 - i}, {true, 2 - i}, {true, 99 - i}})
			if d := each[1].ResetAfter; d > time.Hour {
				t.Errorf("hourly's own reset %v, above its window", d)
			}
		}
		// hourly denies: nothing consumed anywhere, ip's unit refunded
		res, each, err := lim.AllowAllEach(ctx, rules, 1)
		if err != nil || res.Allowed || res.Rule != 1 || res.RetryAfter <= 0 {
			t.Fatalf("call 4: %+v, %v; want denied by hourly", res, err)
		}
		check("denied", each, []want{{true, 7}, {false, 0}, {true, 97}})
		if each[1].RetryAfter != res.RetryAfter {
			t.Errorf("hourly's own wait %v, the decision's %v", each[1].RetryAfter, res.RetryAfter)
		}
		for i, w := range []int64{7, 0, 97} {
			if p, err := lim.Peek(ctx, rules[i].Key, rules[i].Limit); err != nil || p.Remaining != w {
				t.Errorf("rule %d after the denial: %+v, %v; want %d remaining", i, p, err, w)
			}
		}
		// AllowAll decides the same way
		if r, err := lim.AllowAll(ctx, rules); err != nil || r.Allowed || r.Rule != 1 {
			t.Errorf("AllowAll: %+v, %v", r, err)
		}
	})
}

// Each rule takes its own cost: "60 requests and 100 tokens per hour" for one principal (one
// rl_multi) and a shared tokens pool across principals (a call each, refunded by its own cost
// when another denies). Nothing is taken when the tokens refuse.
func TestClientCostPerRule(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		base := keyFor(t)
		requests := client.FixedWindow{Limit: 60, Window: time.Hour}
		tokens := client.TokenBucket{Capacity: 100, Rate: 1, Period: time.Hour, Name: "tokens"}
		pool := client.SlidingLog{Limit: 1000, Window: time.Hour}
		for _, tc := range []struct {
			name  string
			rules []client.Rule
		}{
			{"one key", []client.Rule{{Key: base + ":a", Limit: requests}, {Key: base + ":a", Limit: tokens, Cost: 40}}},
			{"across keys", []client.Rule{{Key: base + ":b", Limit: requests}, {Key: base + ":b", Limit: tokens, Cost: 40}, {Key: base + ":pool", Limit: pool, Cost: 40}}},
		} {
			rules := tc.rules
			left := func(i int) int64 {
				t.Helper()
				p, err := lim.Peek(ctx, rules[i].Key, rules[i].Limit)
				if err != nil {
					t.Fatal(err)
				}
				return p.Remaining
			}
			for call, want := range []int64{60, 20} {
				res, err := lim.AllowAll(ctx, rules)
				if err != nil || !res.Allowed || res.Source != client.FromServer {
					t.Fatalf("%s: call %d: %+v, %v; want admitted by the server", tc.name, call+1, res, err)
				}
				if got := left(1); got != want && got != want+1 { // a token may refill meanwhile
					t.Fatalf("%s: call %d: tokens %d left, want %d", tc.name, call+1, got, want)
				}
			}
			res, err := lim.AllowAll(ctx, rules)
			if err != nil || res.Allowed || res.Rule != 1 || res.RetryAfter <= 0 {
				t.Fatalf("%s: call 3: %+v, %v; want denied by the tokens", tc.name, res, err)
			}
			if got := left(0); got != 58 {
				t.Errorf("%s: requests %d left after the denial, want 58 (1 per admitted call)", tc.name, got)
			}
			if len(rules) == 3 {
				if got := left(2); got != 1000-80 {
					t.Errorf("%s: the pool has %d left, want 920 (40 per admitted call, the denied one refunded)", tc.name, got)
				}
			}
			// a cost above its own limit is never admitted, whatever the others
			big := append([]client.Rule{}, rules...)
			big[1].Cost = 101
			if res, err := lim.PeekAll(ctx, big); err != nil || res.Allowed || res.RetryAfter != client.Never || res.Rule != 1 {
				t.Errorf("%s: cost 101 of 100 tokens: %+v, %v; want Never by rule 1", tc.name, res, err)
			}
		}
	})
}
