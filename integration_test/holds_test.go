package integration_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
)

// Holds and meters through the client (library 1.3.0): what each method takes and gives back,
// read from the limiter itself by peeks.

// holdKeyOf is the hold key of key's limit, as docs/library.md "Keys" composes it.
func holdKeyOf(lim *client.Limiter, key string, l client.Limit) string {
	k := lim.Key(key, l)
	i := strings.Index(k, "}:")
	return k[:i+2] + "holds:" + k[i+2:]
}

func heldLeft(t testing.TB, lim *client.Limiter, key string, l client.Limit) int64 {
	t.Helper()
	r, err := lim.PeekN(ctx5s(t), key, l, 0)
	if err != nil {
		t.Fatal(err)
	}
	return r.Remaining
}

// A Hold takes its estimate, Add takes more (all or nothing: a denied Add takes nothing and
// the hold keeps what it held), Settle gives back the difference or takes the extra as far as
// the limit has room; then the hold is done. One rule (rl_hold), two of one Key (rl_multi with
// hold groups), and two Keys side by side.
func TestClientHold(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		fw := client.FixedWindow{Limit: 100, Window: 100_000_000_000 * time.Millisecond}
		tb := client.TokenBucket{Capacity: 1000, Rate: 1, Period: time.Hour}
		a, b := keyFor(t), keyFor(t)
		for _, tc := range []struct {
			name  string
			rules []client.Rule
		}{
			{"one rule", []client.Rule{{Key: a + "1", Limit: fw, Cost: 30}}},
			{"one key", []client.Rule{{Key: a + "2", Limit: fw, Cost: 30}, {Key: a + "2", Limit: tb, Cost: 30}}},
			{"two keys", []client.Rule{{Key: a + "3", Limit: fw, Cost: 30}, {Key: b + "3", Limit: tb, Cost: 30}}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				left := func() []int64 {
					out := make([]int64, len(tc.rules))
					for i, r := range tc.rules {
						out[i] = r.Limit.Quota().Limit - heldLeft(t, lim, r.Key, r.Limit)
					}
					return out
				}
				want := func(what string, charged ...int64) {
					t.Helper()
					got := left()
					for i := range got {
						if got[i] != charged[i] {
							t.Fatalf("%s: charged %v, want %v", what, got, charged)
						}
					}
				}
				n := len(tc.rules)
				each := func(v int64) []int64 {
					out := make([]int64, n)
					for i := range out {
						out[i] = v
					}
					return out
				}
				h, res, err := lim.Hold(ctx, tc.rules, client.HoldOptions{TTL: time.Minute})
				if err != nil || !res.Allowed || h == nil || res.Source != client.FromServer {
					t.Fatalf("hold: %v, %+v, %v", h, res, err)
				}
				want("the hold", each(30)...)
				if e := time.Until(h.Expires()); e < 50*time.Second || e > time.Minute+time.Second {
					t.Errorf("expires in %s, want about a minute", e)
				}
				if s := snap(t, tg.c, holdKeyOf(lim, tc.rules[0].Key, tc.rules[0].Limit)); !s.exists {
					t.Errorf("no hold key %s", holdKeyOf(lim, tc.rules[0].Key, tc.rules[0].Limit))
				}
				if r, err := h.Add(ctx, each(20)); err != nil || !r.Allowed {
					t.Fatalf("add 20: %+v, %v", r, err)
				}
				want("add 20", each(50)...)
				// the fixed window has 50 left: 60 more is denied, nothing taken anywhere
				if r, err := h.Add(ctx, each(60)); err != nil || r.Allowed || r.Rule != 0 || r.Remaining != 50 {
					t.Fatalf("add 60 with 50 left: %+v, %v", r, err)
				}
				want("a denied add", each(50)...)
				if got := h.Held(); got[0] != 50 || got[n-1] != 50 {
					t.Fatalf("held %v after a denied add, want 50 each", got)
				}
				// below on the first rule (10 back), above on the last (its extra fits)
				actual := each(40)
				if n > 1 {
					actual[n-1] = 70
				}
				r, err := h.Settle(ctx, actual)
				if err != nil || !r.Allowed {
					t.Fatalf("settle %v: %+v, %v", actual, r, err)
				}
				want("the settle", actual...)
				if _, err := h.Settle(ctx, actual); !errors.Is(err, client.ErrHoldSettled) {
					t.Errorf("a second settle: %v", err)
				}
				if _, err := h.Add(ctx, each(1)); !errors.Is(err, client.ErrHoldSettled) {
					t.Errorf("an add after the settle: %v", err)
				}
				if s := snap(t, tg.c, holdKeyOf(lim, tc.rules[0].Key, tc.rules[0].Limit)); s.exists {
					t.Errorf("the hold key outlived its last hold")
				}
				// an extra that does not fit is cut to the room left; equal leaves it as it is
				h, _, err = lim.Hold(ctx, tc.rules, client.HoldOptions{TTL: time.Minute})
				if err != nil || h == nil {
					t.Fatal(err)
				}
				room := 100 - actual[0] - 30
				if r, err := h.Settle(ctx, each(30+room+5)); err != nil || r.Allowed || r.Remaining != 0 {
					t.Fatalf("settle beyond the room: %+v, %v", r, err)
				}
				if got := left()[0]; got != 100 {
					t.Fatalf("charged %d after an extra cut to the room, want the whole 100", got)
				}
				if lim.Key(tc.rules[n-1].Key, tb) == lim.Key(tc.rules[n-1].Key, tc.rules[n-1].Limit) {
					h, _, err = lim.Hold(ctx, tc.rules[n-1:], client.HoldOptions{TTL: time.Minute})
					before := left()[n-1]
					if err != nil || h == nil {
						t.Fatal(err)
					}
					if r, err := h.Settle(ctx, []int64{30}); err != nil || !r.Allowed || left()[n-1] != before {
						t.Fatalf("settle equal: %+v, %v; charged %d, want %d", r, err, left()[n-1], before)
					}
				}
			})
		}
	})
}

// Bad input is a typed error before any call: nothing is taken.
func TestClientHoldRefusesBadInput(t *testing.T) {
	tg := servers(t)[0]
	ctx := ctx5s(t)
	lim := harness.NewLimiter(t, tg.c, slowMachine)
	key := keyFor(t)
	fw := client.FixedWindow{Limit: 10, Window: time.Hour}
	ok := []client.Rule{{Key: key, Limit: fw}}
	many := make([]client.Rule, 9)
	for i := range many {
		many[i] = client.Rule{Key: key, Limit: client.FixedWindow{Limit: 10, Window: time.Hour, Name: string(rune('a' + i))}}
	}
	minute := client.HoldOptions{TTL: time.Minute}
	for _, tc := range []struct {
		name  string
		call  func() error
		field string
	}{
		{"no ttl", func() error { _, _, err := lim.Hold(ctx, ok, client.HoldOptions{}); return err }, "HoldOptions.TTL"},
		{"ttl in µs", func() error {
			_, _, err := lim.Hold(ctx, ok, client.HoldOptions{TTL: 1500 * time.Microsecond})
			return err
		}, "HoldOptions.TTL"},
		{"a long id", func() error {
			_, _, err := lim.Hold(ctx, ok, client.HoldOptions{TTL: time.Second, ID: strings.Repeat("x", 129)})
			return err
		}, "HoldOptions.ID"},
		{"a sliding log", func() error {
			_, _, err := lim.Hold(ctx, []client.Rule{{Key: key, Limit: client.SlidingLog{Limit: 5, Window: time.Second}}}, minute)
			return err
		}, "rules[0].Limit"},
		{"9 rules of a key", func() error { _, _, err := lim.Hold(ctx, many, minute); return err }, "rules[8].Limit"},
		{"no rules", func() error { _, _, err := lim.Hold(ctx, nil, minute); return err }, "rules"},
		{"a meter of nothing", func() error {
			_, _, err := lim.Meter(ctx, ok, client.MeterOptions{Hold: minute, PerUnit: []int64{0}})
			return err
		}, "MeterOptions.PerUnit"},
		{"a meter's per unit", func() error {
			_, _, err := lim.Meter(ctx, ok, client.MeterOptions{Hold: minute, PerUnit: []int64{1, 1}})
			return err
		}, "MeterOptions.PerUnit"},
		{"a meter's base", func() error {
			_, _, err := lim.Meter(ctx, ok, client.MeterOptions{Hold: minute, PerUnit: []int64{1}, Base: []int64{-1}})
			return err
		}, "MeterOptions.Base[0]"},
	} {
		var le *client.LimitError
		if err := tc.call(); !errors.As(err, &le) || le.Field != tc.field {
			t.Errorf("%s: %v, want a *LimitError of %s", tc.name, err, tc.field)
		}
	}
	h, _, err := lim.Hold(ctx, ok, minute)
	if err != nil || h == nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"add of 2 costs":    func() error { _, err := h.Add(ctx, []int64{1, 1}); return err },
		"a negative add":    func() error { _, err := h.Add(ctx, []int64{-1}); return err },
		"settle of none":    func() error { _, err := h.Settle(ctx, nil); return err },
		"a negative settle": func() error { _, err := h.Settle(ctx, []int64{-3}); return err },
	} {
		var le *client.LimitError
		if err := call(); !errors.As(err, &le) {
			t.Errorf("%s: %v, want a *LimitError", name, err)
		}
	}
	if got := heldLeft(t, lim, key, fw); got != 9 {
		t.Fatalf("%d left after bad calls, want 9 (the hold's 1)", got)
	}
	if _, err := h.Settle(ctx, []int64{0}); err != nil {
		t.Fatal(err)
	}
}

// An unsettled hold expires: without Keep its units come back by the sweep of the next call
// that names its hold key (here another hold of the same limit), within its TTL and 100 ms;
// with Keep they stay charged.
func TestClientHoldExpires(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		fw := client.FixedWindow{Limit: 100, Window: 100_000_000_000 * time.Millisecond}
		for _, keep := range []bool{false, true} {
			key := keyFor(t)
			rules := []client.Rule{{Key: key, Limit: fw, Cost: 40}}
			h, _, err := lim.Hold(ctx, rules, client.HoldOptions{TTL: 200 * time.Millisecond, Keep: keep})
			if err != nil || h == nil {
				t.Fatal(err)
			}
			time.Sleep(time.Until(h.Expires()) + 100*time.Millisecond)
			// a later call with the hold key sweeps it
			p, _, err := lim.Hold(ctx, []client.Rule{{Key: key, Limit: fw, Cost: 1}}, client.HoldOptions{TTL: time.Minute})
			if err != nil || p == nil {
				t.Fatal(err)
			}
			want := int64(99)
			if keep {
				want = 59
			}
			if got := heldLeft(t, lim, key, fw); got != want {
				t.Errorf("keep %t: %d left after the expiry, want %d", keep, got, want)
			}
			// the expired hold settles nothing
			if r, err := h.Settle(ctx, []int64{40}); err != nil || r.Allowed {
				t.Errorf("keep %t: settle after the expiry: %+v, %v", keep, r, err)
			}
			if got := heldLeft(t, lim, key, fw); got != want {
				t.Errorf("keep %t: %d left after a late settle, want %d", keep, got, want)
			}
			if _, err := p.Settle(ctx, []int64{0}); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// A stream of 4,000 units with an estimate of 500 costs the server 5 calls: the hold, three
// batches (500, 1,000, 2,000) and the settle; with a request count beside the tokens (one Key,
// rl_multi), the settle is two calls in one round trip. Counted by the server
// (INFO commandstats), on a server of its own.
func TestClientMeterCalls(t *testing.T) {
	for _, s := range standalones {
		t.Run(s.name, func(t *testing.T) {
			c := s.start(t).Client(t)
			loadCode(t, c, sourceOf13(t))
			ctx := ctx5s(t)
			lim := harness.NewLimiter(t, c, slowMachine)
			tokens := client.FixedWindow{Limit: 1_000_000, Window: time.Hour, Name: "tokens"}
			requests := client.FixedWindow{Limit: 1000, Window: time.Hour, Name: "requests"}
			for _, tc := range []struct {
				name  string
				rules func(key string) []client.Rule
				per   []int64
				want  int64
			}{
				{"tokens", func(k string) []client.Rule { return []client.Rule{{Key: k, Limit: tokens, Cost: 500}} }, []int64{1}, 5},
				{"tokens and requests", func(k string) []client.Rule {
					return []client.Rule{{Key: k, Limit: requests, Cost: 1}, {Key: k, Limit: tokens, Cost: 500}}
				}, []int64{0, 1}, 6},
			} {
				key := keyFor(t)
				before := commandCalls(t, c, "fcall").Calls
				m, res, err := lim.Meter(ctx, tc.rules(key), client.MeterOptions{Hold: client.HoldOptions{TTL: time.Minute}, PerUnit: tc.per})
				if err != nil || !res.Allowed {
					t.Fatalf("%s: %+v, %v", tc.name, res, err)
				}
				for range 400 {
					if ok, err := m.Take(ctx, 10); !ok || err != nil {
						t.Fatalf("%s: take: %t, %v", tc.name, ok, err)
					}
				}
				if err := m.Close(ctx); err != nil {
					t.Fatal(err)
				}
				calls := commandCalls(t, c, "fcall").Calls - before
				t.Logf("%s: 4,000 units, estimate 500: %d calls, granted %d", tc.name, calls, m.Granted())
				if calls != tc.want || m.Used() != 4000 {
					t.Errorf("%s: %d calls for %d units, want %d", tc.name, calls, m.Used(), tc.want)
				}
				if got := 1_000_000 - heldLeft(t, lim, key, tokens); got != 4000 {
					t.Errorf("%s: %d tokens charged, want the 4,000 used", tc.name, got)
				}
			}
		})
	}
}

// A node that runs 1.2.0 answers every hold with the *VersionError naming it and 1.3.0 (rl_hold,
// a hold group), before anything is taken; under LocalFallback its holds are the Fallback's.
func TestClientHoldOn12(t *testing.T) {
	s := harness.StartValkey(t)
	c := s.Client(t)
	loadCode(t, c, release(t, "1.2.0").Code)
	ctx := ctx5s(t)
	fw := client.FixedWindow{Limit: 10, Window: time.Hour}
	tb := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour}
	key := keyFor(t)
	lim := harness.NewLimiter(t, c, slowMachine)
	for name, rules := range map[string][]client.Rule{
		"rl_hold":       {{Key: key, Limit: fw}},
		"rl_multi hold": {{Key: key, Limit: fw}, {Key: key, Limit: tb}},
	} {
		h, _, err := lim.Hold(ctx, rules, client.HoldOptions{TTL: time.Minute})
		var ve *client.VersionError
		if h != nil || !errors.As(err, &ve) || ve.Node != s.Addr || ve.Version != "1.2.0" || ve.Want != "1.3.0" || ve.Function != name {
			t.Errorf("%s on 1.2.0: %v, %v; want the VersionError of %s", name, h, err, s.Addr)
		}
	}
	if got := heldLeft(t, lim, key, fw); got != 10 {
		t.Errorf("%d left after refused holds, want 10", got)
	}
	local := harness.NewLimiter(t, c, client.Options{Deadline: slowDeadline, Fallback: client.LocalFallback})
	h, res, err := local.Hold(ctx, []client.Rule{{Key: key, Limit: fw, Cost: 4}}, client.HoldOptions{TTL: time.Minute})
	if err != nil || h == nil || res.Source != client.FromFallback || res.Remaining != 6 {
		t.Fatalf("a hold under LocalFallback on 1.2.0: %v, %+v, %v", h, res, err)
	}
	if r, err := h.Settle(ctx, []int64{1}); err != nil || r.Remaining != 9 {
		t.Errorf("its settle: %+v, %v; want 9 left locally", r, err)
	}
	if got := heldLeft(t, lim, key, fw); got != 10 {
		t.Errorf("the server's limiter moved: %d left", got)
	}
}

// When the server is gone, LocalFallback holds and meters in its local limiters: a meter
// streams within the local share and no further, and its settle gives the rest back locally.
func TestClientHoldLocalFallback(t *testing.T) {
	s := harness.StartValkey(t)
	c := s.Client(t)
	loadCode(t, c, sourceOf13(t))
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := ctx5s(t)
	lim := harness.NewLimiter(t, c, client.Options{Deadline: 100 * time.Millisecond, Fallback: client.LocalFallback})
	fw := client.FixedWindow{Limit: 1000, Window: time.Hour}
	key := keyFor(t)
	m, res, err := lim.Meter(ctx, []client.Rule{{Key: key, Limit: fw, Cost: 100}}, client.MeterOptions{Hold: client.HoldOptions{TTL: time.Minute}, PerUnit: []int64{1}})
	if err != nil || m == nil || res.Source != client.FromFallback {
		t.Fatalf("a meter with the server gone: %v, %+v, %v", m, res, err)
	}
	took := int64(0)
	for {
		ok, err := m.Take(ctx, 30)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		took += 30
	}
	if took > 1000 || m.Granted() != 1000 || took < 970 {
		t.Fatalf("streamed %d with %d granted, want up to the local 1,000", took, m.Granted())
	}
	if _, err := m.Settle(ctx, []int64{500}); err != nil {
		t.Fatal(err)
	}
	if r, err := lim.Peek(ctx, key, fw); err != nil || r.Source != client.FromFallback || r.Remaining != 500 {
		t.Errorf("after the settle at 500: %+v, %v; want 500 left locally", r, err)
	}
}

// Limiter.Close settles the holds and meters nobody settled: a meter at what it used, a hold as
// its expiry would (given back; with Keep, charged).
func TestClientCloseSettlesHolds(t *testing.T) {
	tg := servers(t)[0]
	ctx := ctx5s(t)
	lim := harness.NewLimiter(t, tg.c, slowMachine)
	fw := client.FixedWindow{Limit: 1000, Window: 100_000_000_000 * time.Millisecond}
	k1, k2, k3 := keyFor(t), keyFor(t), keyFor(t)
	m, _, err := lim.Meter(ctx, []client.Rule{{Key: k1, Limit: fw, Cost: 100}}, client.MeterOptions{Hold: client.HoldOptions{TTL: time.Minute}, PerUnit: []int64{2}, Base: []int64{10}})
	if err != nil || m == nil {
		t.Fatal(err)
	}
	if ok, err := m.Take(ctx, 7); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if _, _, err := lim.Hold(ctx, []client.Rule{{Key: k2, Limit: fw, Cost: 50}}, client.HoldOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := lim.Hold(ctx, []client.Rule{{Key: k3, Limit: fw, Cost: 50}}, client.HoldOptions{TTL: time.Minute, Keep: true}); err != nil {
		t.Fatal(err)
	}
	if err := lim.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]int64{k1: 1000 - 10 - 7*2, k2: 1000, k3: 950} {
		if got := heldLeft(t, lim, key, fw); got != want {
			t.Errorf("%d left after Close, want %d", got, want)
		}
	}
	if _, err := m.Take(ctx, 1); !errors.Is(err, client.ErrHoldSettled) {
		t.Errorf("a take after Close: %v", err)
	}
}

// HoldEach and MeterEach report every rule's limiter from the hold's own calls (one Key: one
// rl_multi with replies; two Keys: a call each), as AllowAllEach does; a meter cut by its
// second rule says so (Result().Rule).
func TestClientHoldEach(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		big := client.FixedWindow{Limit: 1000, Window: time.Hour, Name: "big"}
		small := client.TokenBucket{Capacity: 100, Rate: 1, Period: time.Hour, Name: "small"}
		a, b := keyFor(t), keyFor(t)
		for _, rules := range [][]client.Rule{
			{{Key: a, Limit: big, Cost: 30}, {Key: a, Limit: small, Cost: 30}},
			{{Key: b + "1", Limit: big, Cost: 30}, {Key: b + "2", Limit: small, Cost: 30}},
		} {
			h, res, each, err := lim.HoldEach(ctx, rules, client.HoldOptions{TTL: time.Minute})
			if err != nil || !res.Allowed || len(each) != 2 {
				t.Fatalf("%+v, %v, %v", res, each, err)
			}
			if each[0].Limit != 1000 || each[0].Remaining != 970 || each[1].Limit != 100 || each[1].Remaining != 70 || each[1].Rule != 1 || res.Rule != 1 {
				t.Errorf("each %+v, binding %+v; want 970 of 1000, 70 of 100", each, res)
			}
			if _, err := h.Settle(ctx, []int64{30, 30}); err != nil {
				t.Fatal(err)
			}
			// the small limit has 70 left: a hold of 80 on it is denied, each says both
			_, res, each, err = lim.HoldEach(ctx, []client.Rule{{Key: rules[0].Key, Limit: big, Cost: 80}, {Key: rules[1].Key, Limit: small, Cost: 80}}, client.HoldOptions{TTL: time.Minute})
			if err != nil || res.Allowed || res.Rule != 1 || len(each) != 2 || each[0].Remaining != 970 || each[1].Allowed || each[1].Remaining != 70 {
				t.Errorf("a denied hold: %+v, each %+v, %v", res, each, err)
			}
			m, res, each, err := lim.MeterEach(ctx, rules, client.MeterOptions{Hold: client.HoldOptions{TTL: time.Minute}, PerUnit: []int64{1, 1}, Batch: 10})
			if err != nil || !res.Allowed || len(each) != 2 || each[0].Remaining != 940 || each[1].Remaining != 40 {
				t.Fatalf("meter: %+v, each %+v, %v", res, each, err)
			}
			n := int64(0)
			for {
				ok, err := m.Take(ctx, 1)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					break
				}
				n++
			}
			if r := m.Result(); n != 70 || r.Allowed || r.Rule != 1 || r.Limit != 100 {
				t.Errorf("took %d of the 70 the small limit had; Result %+v, want its refusal", n, r)
			}
			if err := m.Close(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// An Add across Keys that one Key refuses is undone on the others so that their holds count
// exactly what their limits hold for them: a process that dies before it settles gives back, at
// the holds' expiry, what it held, once, not the refused Add's units a second time (which
// would free another holder's units).
func TestClientHoldRefusedAddAcrossKeys(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		fw := client.FixedWindow{Limit: 100, Window: 100_000_000_000 * time.Millisecond}
		tb := client.TokenBucket{Capacity: 1000, Rate: 1, Period: time.Hour}
		small := client.FixedWindow{Limit: 50, Window: 100_000_000_000 * time.Millisecond}
		a, b := keyFor(t), keyFor(t)
		keysA := []string{lim.Key(a, fw), holdKeyOf(lim, a, fw)}
		// another holder's 20 units on a's window
		if res, err := lim.AllowN(ctx, a, fw, 20); err != nil || !res.Allowed {
			t.Fatal(res, err)
		}
		rules := []client.Rule{{Key: a, Limit: fw, Cost: 30}, {Key: a, Limit: tb, Cost: 30}, {Key: b, Limit: small, Cost: 30}}
		h, res, err := lim.Hold(ctx, rules, client.HoldOptions{TTL: time.Second})
		if err != nil || !res.Allowed {
			t.Fatal(res, err)
		}
		// b has 20 left: an Add of 30 there is refused, a's 10 and 10 are undone
		if res, err := h.Add(ctx, []int64{10, 10, 30}); err != nil || res.Allowed || res.Rule != 2 {
			t.Fatalf("the add: %+v, %v", res, err)
		}
		if charged, held := sample(t, tg.c, keysA); charged != 50 || held != 30 {
			t.Fatalf("after the refused add, a's window: %d charged, its hold %d; want 50 (20 + the hold's 30), 30", charged, held)
		}
		if got := 1000 - heldLeft(t, lim, a, tb); got != 30 {
			t.Errorf("a's bucket: %d taken, want the hold's 30", got)
		}
		if got := h.Held(); got[0] != 30 || got[1] != 30 || got[2] != 30 {
			t.Errorf("held %v, want 30 each", got)
		}
		// the process dies: its holds expire, a later hold sweeps them, giving back 30, once
		time.Sleep(1100 * time.Millisecond)
		h2, _, err := lim.Hold(ctx, rules[:1], client.HoldOptions{TTL: time.Minute, ID: "sweeper"})
		if err != nil || h2 == nil {
			t.Fatal(err)
		}
		if charged, held := sample(t, tg.c, keysA); charged != 20+30 || held != 30 {
			t.Errorf("after the expiry, a's window: %d charged, %d held; want the other holder's 20 and the sweeper's 30", charged, held)
		}
		if _, err := h2.Settle(ctx, []int64{0}); err != nil {
			t.Fatal(err)
		}
		// a hold that settles instead bills its actual amounts
		h, _, err = lim.Hold(ctx, rules, client.HoldOptions{TTL: time.Minute})
		if err != nil || h == nil {
			t.Fatal(err)
		}
		if res, err := h.Add(ctx, []int64{10, 10, 30}); err != nil || res.Allowed {
			t.Fatalf("the add: %+v, %v", res, err)
		}
		if res, err := h.Add(ctx, []int64{5, 5, 5}); err != nil || !res.Allowed {
			t.Fatalf("an add that fits: %+v, %v", res, err)
		}
		if _, err := h.Settle(ctx, []int64{25, 25, 25}); err != nil {
			t.Fatal(err)
		}
		if charged, held := sample(t, tg.c, keysA); charged != 20+25 || held != 0 {
			t.Errorf("after the settle, a's window: %d charged, %d held; want 45, 0", charged, held)
		}
		if got := 1000 - heldLeft(t, lim, a, tb); got != 25 {
			t.Errorf("a's bucket: %d taken, want 25 (the first hold's 30 came back at its expiry)", got)
		}
	})
}
