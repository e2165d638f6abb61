package integration_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// What release 1.3.0 adds: holds (rl_hold, rl_hold_settle, the hold group of rl_multi) and
// every group's reply from one rl_multi (docs/library.md, Release 1.3.0).

// flags13 are the functions 1.3.0 adds, with their flags.
var flags13 = map[string][]string{
	"rl_hold":        nil,
	"rl_hold_settle": nil,
}

// holdReply is rl_hold's and rl_hold_settle's answer: the limiter's six integers, then the
// units the hold holds (or charged, for a settle) and the time until it expires.
type holdReply struct {
	reply
	Held      int64
	ExpiresIn int64
}

func (h holdReply) String() string {
	return fmt.Sprintf("%v held=%d expires_in=%d", h.reply, h.Held, h.ExpiresIn)
}

func decodeInts(res valkey.ValkeyResult) ([]int64, error) {
	arr, err := res.ToArray()
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(arr))
	for i, m := range arr {
		if out[i], err = m.AsInt64(); err != nil {
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
	}
	return out, nil
}

func tryHold(c valkey.Client, fn string, keys []string, args ...string) (holdReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := decodeInts(c.Do(ctx, c.B().Fcall().Function(fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()))
	if err != nil {
		return holdReply{}, err
	}
	if len(n) != 8 || n[0] != 0 && n[0] != 1 {
		return holdReply{}, fmt.Errorf("%s reply %v, want 8 integers", fn, n)
	}
	return holdReply{reply{n[0] == 1, n[1], n[2], n[3], n[4], n[5]}, n[6], n[7]}, nil
}

// hold takes cost of the group's limit under id (the group's own cost is replaced).
func hold(t testing.TB, c valkey.Client, keys []string, g []string, id string, ttlMs int64, keep bool) holdReply {
	t.Helper()
	k := "0"
	if keep {
		k = "1"
	}
	h, err := tryHold(c, "rl_hold", keys, append(append([]string{}, g...), id, itoa(ttlMs)[0], k)...)
	if err != nil {
		t.Fatalf("rl_hold %v %v %s: %v", keys, g, id, err)
	}
	return h
}

func settle(t testing.TB, c valkey.Client, keys []string, g []string, id string) holdReply {
	t.Helper()
	h, err := tryHold(c, "rl_hold_settle", keys, append(append([]string{}, g...), id)...)
	if err != nil {
		t.Fatalf("rl_hold_settle %v %v %s: %v", keys, g, id, err)
	}
	return h
}

// holdable is every algorithm a hold takes, as a limiter of the tests (slow refills, minute
// windows) and its rl_multi group.
type holdable struct {
	limiter
	group func(limit, cost, reserve int64) []string
}

func holdables(nowMs int64) []holdable {
	var out []holdable
	for _, l := range slow {
		if l.name == "sliding_log" {
			continue
		}
		out = append(out, holdable{l, func(limit, cost, reserve int64) []string { return group(l, limit, cost, reserve) }})
	}
	b := boundsAround(nowMs, 3_600_000, 2, 1_000)
	cal := limiter{"calendar", "rl_calendar", false, func(limit, cost int64) []string { return calArgs(limit, b, cost) }}
	return append(out, holdable{cal, func(limit, cost, reserve int64) []string { return calGroup(limit, b, cost, reserve) }})
}

// holdKeys returns a limiter's key and its hold key, in one slot.
func holdKeys(t testing.TB) []string {
	base := keyFor(t)
	return []string{"{" + base + "}:lim", "{" + base + "}:holds"}
}

func TestFunctions13AndFlags(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		flags := functionFlags(t, tg.c)
		for fn, w := range flags13 {
			got, ok := flags[fn]
			if !ok {
				t.Errorf("%s is not registered", fn)
				continue
			}
			sort.Strings(got)
			if strings.Join(got, ",") != strings.Join(w, ",") {
				t.Errorf("%s flags %v, want %v", fn, got, w)
			}
		}
		// both write: a replica refuses them (a cluster's replica redirects: MOVED)
		keys := holdKeys(t)
		g := group(fixedSlow, 10, 1, 0)
		hold(t, tg.c, keys, g, "a", 60_000, false) // the replica is found by a key it holds
		rep := tg.replicaFor(t, keys[0])
		waitReplicated(t, rep, keys[1])
		// rl_multi_peek reads a hold group on a replica (FCALL_RO), with every reply
		n, err := decodeInts(rep.do(rep.c.B().FcallRo().Function("rl_multi_peek").Numkeys(2).Key(keys...).
			Arg(append(append([]string{}, g...), "hold", "a", "60000", "0", "replies")...).Build()))
		if err != nil || len(n) != 19 || n[0] != 1 || n[7+6+2] != 1 {
			t.Fatalf("rl_multi_peek of a held limit on the replica: %v, %v; want the hold's 1 unit", n, err)
		}
		for _, c := range []struct {
			fn   string
			args []string
		}{
			{"rl_hold", append(append([]string{}, g...), "a", "1000", "0")},
			{"rl_hold_settle", append(append([]string{}, g...), "a")},
		} {
			err := rep.do(rep.c.B().Fcall().Function(c.fn).Numkeys(2).Key(keys...).Arg(c.args...).Build()).Error()
			if err == nil || !strings.Contains(err.Error(), "READONLY") && !strings.HasPrefix(err.Error(), "MOVED ") {
				t.Errorf("%s on a replica: %v, want READONLY or MOVED", c.fn, err)
			}
		}
	})
}

// A hold takes its units as the limiter call with the same arguments does (the same reply and,
// for windows, the same state bytes and expiry), adds to a live hold, and a settle gives back
// the difference or takes the extra as far as the limit has room.
func TestHoldTakesAddsAndSettles(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		roomInWindow(t, tg.c, 60_000, 15*time.Second)
		for _, h := range holdables(serverMs(t, tg.c)) {
			t.Run(h.name, func(t *testing.T) {
				const limit = 100
				keys := holdKeys(t)
				twin := keys[0] + ":twin"
				r := hold(t, tg.c, keys, h.group(limit, 30, 0), "s1", 600_000, false)
				p := fcall(t, tg.c, h.fn, twin, h.args(limit, 30)...)
				if !r.Allowed || r.Remaining != p.Remaining || r.Limit != limit || r.Held != 30 || r.ExpiresIn <= 0 || r.ExpiresIn > 600_000 {
					t.Fatalf("hold 30: %v; the limiter call answers %v", r, p)
				}
				if h.windowed || h.name == "calendar" {
					a, b := snap(t, tg.c, keys[0]), snap(t, tg.c, twin)
					if a.dump != b.dump || a.expiry != b.expiry {
						t.Fatalf("the hold wrote %+v, the limiter call %+v", a, b)
					}
				}
				if ttl := do(t, tg.c, tg.c.B().Pexpiretime().Key(keys[1]).Build()); ttl.Error() != nil {
					t.Fatal(ttl.Error())
				} else if exp, _ := ttl.AsInt64(); exp <= 0 {
					t.Fatalf("the hold key expires at %d", exp)
				}
				r = hold(t, tg.c, keys, h.group(limit, 20, 0), "s1", 600_000, false)
				if !r.Allowed || r.Remaining != 50 || r.Held != 50 {
					t.Fatalf("add 20: %v", r)
				}
				// an add that does not fit is refused, and the hold keeps its units
				r = hold(t, tg.c, keys, h.group(limit, 51, 0), "s1", 600_000, false)
				if r.Allowed || r.Remaining != 50 || r.Held != 50 {
					t.Fatalf("add 51 of 50 left: %v", r)
				}
				s := settle(t, tg.c, keys, h.group(limit, 35, 0), "s1")
				if !s.Allowed || s.Remaining != 65 || s.Held != 35 || s.ExpiresIn != 0 {
					t.Fatalf("settle 35 of 50: %v", s)
				}
				if snap(t, tg.c, keys[1]).exists {
					t.Fatal("the settle of the last hold left its hold key")
				}
				s = settle(t, tg.c, keys, h.group(limit, 35, 0), "s1")
				if s.Allowed || s.Remaining != 65 || s.Held != 0 || s.ExpiresIn != -1 {
					t.Fatalf("a second settle: %v, want nothing charged, expires -1", s)
				}
				// an extra that fits, then one that does not
				hold(t, tg.c, keys, h.group(limit, 10, 0), "s2", 600_000, false)
				if s := settle(t, tg.c, keys, h.group(limit, 25, 0), "s2"); !s.Allowed || s.Remaining != 40 || s.Held != 25 {
					t.Fatalf("settle 25 of 10: %v", s)
				}
				hold(t, tg.c, keys, h.group(limit, 10, 0), "s3", 600_000, false)
				fcall(t, tg.c, h.fn, keys[0], h.args(limit, 25)...) // 5 left
				if s := settle(t, tg.c, keys, h.group(limit, 30, 0), "s3"); s.Allowed || s.Remaining != 0 || s.Held != 15 {
					t.Fatalf("settle 30 of 10 with 5 left: %v, want 15 charged", s)
				}
				if p := fcall(t, tg.c, h.fn+"_peek", keys[0], h.args(limit, 0)...); p.Remaining != 0 {
					t.Fatalf("after the settles: %v", p)
				}
			})
		}
	})
}

// An expired hold's units are back at the next call given its hold key (here 100 ms after it
// expired), and stay charged when it was made so; calls without the hold key count them until
// then.
func TestHoldExpires(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		roomInWindow(t, tg.c, 60_000, 10*time.Second)
		for _, h := range holdables(serverMs(t, tg.c)) {
			t.Run(h.name, func(t *testing.T) {
				// an attempt whose three holds took longer than the short ones' ttl (a loaded
				// machine) proves nothing: the last call swept the first: try again
				for attempt := 1; !holdExpiryAttempt(t, tg, h); attempt++ {
					if attempt == 5 {
						t.Fatal("5 attempts too slow to tell: the holds expired before they were all taken")
					}
				}
			})
		}
	})
}

func holdExpiryAttempt(t *testing.T, tg *target, h holdable) (conclusive bool) {
	const limit, ttl = 100, 300
	keys := holdKeys(t)
	hold(t, tg.c, keys, h.group(limit, 10, 0), "live", 600_000, false)
	hold(t, tg.c, keys, h.group(limit, 40, 0), "gone", ttl, false)
	hold(t, tg.c, keys, h.group(limit, 25, 0), "kept", ttl, true)
	if n, err := do(t, tg.c, tg.c.B().Hlen().Key(keys[1]).Build()).AsInt64(); err != nil || n != 4 {
		t.Logf("the hold key has %d fields (%v) after three holds: too slow, trying again", n, err)
		return false
	}
	time.Sleep((ttl + 100) * time.Millisecond)
	if p := fcall(t, tg.c, h.fn+"_peek", keys[0], h.args(limit, 0)...); p.Remaining != 25 {
		t.Fatalf("before any call with the hold key: %v, want the 75 still charged", p)
	}
	r := hold(t, tg.c, keys, h.group(limit, 0, 0), "probe", 1_000, false)
	if r.Remaining != 65 || r.Held != 0 {
		t.Fatalf("the next hold call: %v, want 40 given back, 25 kept, 10 live", r)
	}
	n, err := do(t, tg.c, tg.c.B().Hlen().Key(keys[1]).Build()).AsInt64()
	if err != nil || n != 2 {
		t.Fatalf("the hold key has %d fields, %v: want the marker and the live hold", n, err)
	}
	if s := settle(t, tg.c, keys, h.group(limit, 0, 0), "gone"); s.Allowed || s.ExpiresIn != -1 {
		t.Fatalf("the settle of an expired hold: %v", s)
	}
	return true
}

// Bad arguments and foreign hold keys are RLERR naming the function, and change nothing.
func TestHoldRefusesBadCalls(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		roomInWindow(t, tg.c, 60_000, 5*time.Second)
		keys := holdKeys(t)
		g := group(fixedSlow, 10, 1, 0)
		hold(t, tg.c, keys, g, "live", 600_000, false)
		with := func(extra ...string) []string { return append(append([]string{}, g...), extra...) }
		bad := []struct {
			fn   string
			keys []string
			args []string
		}{
			{"rl_hold", keys[:1], with("a", "1000", "0")},
			{"rl_hold", []string{keys[0], keys[0]}, with("a", "1000", "0")},
			{"rl_hold", append(keys, keys[0]+":x"), with("a", "1000", "0")},
			{"rl_hold", keys, with("a", "1000")},
			{"rl_hold", keys, with("a", "1000", "0", "x")},
			{"rl_hold", keys, with("", "1000", "0")},
			{"rl_hold", keys, with(strings.Repeat("x", 129), "1000", "0")},
			{"rl_hold", keys, with("a", "0", "0")},
			{"rl_hold", keys, with("a", "100000000001", "0")},
			{"rl_hold", keys, with("a", "-1", "0")},
			{"rl_hold", keys, with("a", "1000", "2")},
			{"rl_hold", keys, with("a", "1000", "yes")},
			{"rl_hold", keys, append(group(limiter{fn: "rl_sliding_log", args: windowArgs(60_000)}, 10, 1, 0), "a", "1000", "0")},
			{"rl_hold", keys, []string{"block", "1000", "a", "1000", "0"}},
			{"rl_hold", keys, []string{"hold", "a", "1000", "0"}},
			{"rl_hold", keys, append(group(fixedSlow, 10, 1, 11), "a", "1000", "0")},
			{"rl_hold", keys, append(group(fixedSlow, 0, 1, 0), "a", "1000", "0")},
			{"rl_hold", keys, []string{"fixed_window", "10", "60000"}},
			{"rl_hold", keys, nil},
			{"rl_hold_settle", keys, with()},
			{"rl_hold_settle", keys, with("a", "x")},
			{"rl_hold_settle", keys, with("")},
			{"rl_hold_settle", keys[:1], with("a")},
			{"rl_multi", keys, with("hold", "a", "1000")},
			{"rl_multi", keys, with("hold", "a", "1000", "2")},
			{"rl_multi", keys, with("hold", "", "1000", "0")},
			{"rl_multi", keys, with("hold", "a", "0", "0")},
			{"rl_multi", []string{keys[1], keys[0]}, append([]string{"hold", "a", "1000", "0"}, g...)},
			{"rl_multi", keys, append(group(limiter{fn: "rl_sliding_log", args: windowArgs(60_000)}, 10, 1, 0), "hold", "a", "1000", "0")},
			{"rl_multi", keys, []string{"block", "0", "hold", "a", "1000", "0"}},
			{"rl_multi", keys[:1], with("replies", "replies")},
			{"rl_multi", keys[:1], with("REPLIES")},
			{"rl_multi", keys[:1], with("")},
			{"rl_multi_peek", keys[:1], with("all")},
		}
		before := snaps(t, tg.c, keys)
		for _, bc := range bad {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := tg.c.Do(ctx, tg.c.B().Fcall().Function(bc.fn).Numkeys(int64(len(bc.keys))).Key(bc.keys...).Arg(bc.args...).Build()).Error()
			cancel()
			if !isRLERR(err) || !namesFunction(err, bc.fn) {
				t.Errorf("%s %v %v: got %v, want RLERR %s...", bc.fn, bc.keys, bc.args, err, bc.fn)
			}
			sameSnaps(t, tg.c, keys, before, fmt.Sprintf("%s %v", bc.fn, bc.args))
		}

		// a hold key holding anything but holds, and a hold key given to a limiter
		nan := math.NaN()
		others := append(holders(),
			holder{"a hash without the marker", "", hashOf("a", packed(1, 1, 1, 0))},
			holder{"a marker of 8 bytes", "", hashOf("", packed(1))},
			holder{"a marker at 10^14", "", hashOf("", packed(1e14, 1))},
			holder{"a marker of NaN", "", hashOf("", packed(nan, 1))},
			holder{"a hold of 24 bytes", "", hashOf("", packed(1, 1), "a", packed(1, 1, 1))},
			holder{"a hold of 1.5 units", "", hashOf("", packed(1, 1), "a", packed(1, 1, 1.5, 0))},
			holder{"a hold expiring after its horizon", "", hashOf("", packed(1, 1), "a", packed(2, 1, 1, 0))},
			holder{"a hold kept 2", "", hashOf("", packed(1, 1), "a", packed(1, 1, 1, 2))},
		)
		for _, h := range others {
			hk := foreignKey() // named in full by the error
			lim := "{" + hk + "}:lim"
			h.make(t, tg.c, hk)
			fcall(t, tg.c, "rl_fixed_window", lim, "10", "60000", "1")
			before := snaps(t, tg.c, []string{lim, hk})
			for _, c := range []struct {
				fn   string
				args []string
			}{
				{"rl_hold", with("a", "1000", "0")},
				{"rl_hold_settle", with("a")},
				{"rl_multi", with("hold", "a", "1000", "0")},
				{"rl_multi_peek", with("hold", "a", "1000", "0")},
			} {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := tg.c.Do(ctx, tg.c.B().Fcall().Function(c.fn).Numkeys(2).Key(lim, hk).Arg(c.args...).Build()).Error()
				cancel()
				if want := fmt.Sprintf("RLERR %s: key '%s'", c.fn, hk); err == nil || !strings.HasPrefix(err.Error(), want) {
					t.Errorf("%s on %s: %v, want %s...", c.fn, h.name, err, want)
				}
				sameSnaps(t, tg.c, []string{lim, hk}, before, c.fn+" on "+h.name)
			}
		}
		// the limiter functions refuse a hold key
		for _, f := range families {
			for _, fn := range f.fns {
				_, err := tryCall(tg.c, strings.HasSuffix(fn, "_peek"), fn, keys[1], f.args...)
				if want := fmt.Sprintf("RLERR %s: key '", fn); err == nil || !strings.HasPrefix(err.Error(), want) {
					t.Errorf("%s on a hold key: %v, want %s...", fn, err, want)
				}
			}
		}
		sameSnaps(t, tg.c, keys, before, "the limiter functions")
	})
}

// hashOf makes a hash of field, value pairs.
func hashOf(fv ...string) func(testing.TB, valkey.Client, string) {
	return func(t testing.TB, c valkey.Client, key string) {
		t.Helper()
		cmd := c.B().Hset().Key(key).FieldValue()
		for i := 0; i < len(fv); i += 2 {
			cmd = cmd.FieldValue(fv[i], fv[i+1])
		}
		if err := do(t, c, cmd.Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
}

// Several limits held together in one rl_multi, all or nothing, and every group's reply.
func TestMultiHoldsAndReplies(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		roomInWindow(t, tg.c, 60_000, 10*time.Second)
		base := "{" + keyFor(t) + "}"
		keys := []string{base + ":tb", base + ":holds:tb", base + ":fw", base + ":holds:fw", base + ":block"}
		call := func(fn string, tbCost, fwCost int64, id string) []int64 {
			t.Helper()
			args := append(group(tokenSlow, 1000, tbCost, 0), "hold", id, "600000", "0")
			args = append(append(args, group(fixedSlow, 100, fwCost, 0)...), "hold", id, "600000", "1")
			args = append(append(args, blockGroup(0)...), "replies")
			n, err := decodeInts(do(t, tg.c, tg.c.B().Fcall().Function(fn).Numkeys(5).Key(keys...).Arg(args...).Build()))
			if err != nil || len(n) != 7+5*6 {
				t.Fatalf("%s: %v, %v: want 37 integers", fn, n, err)
			}
			return n
		}
		n := call("rl_multi", 300, 30, "r1")
		// binding: the fixed window (70 left of 100, fewer than the bucket's 700)
		if n[0] != 1 || n[6] != 3 || n[2] != 70 {
			t.Fatalf("rl_multi: %v", n)
		}
		want := func(i int, w ...int64) {
			t.Helper()
			got := n[7+(i-1)*6 : 7+i*6]
			for j := range w {
				if w[j] >= 0 && got[j] != w[j] {
					t.Fatalf("group %d: %v, want %v (-1: any)", i, got, w)
				}
			}
		}
		want(1, 1, 1000, 700, 0, -1, 0)
		want(2, 1, 0, 300, 0, -1, 0)
		want(3, 1, 100, 70, 0, -1, 0)
		want(4, 1, 0, 30, 0, -1, 0)
		want(5, 1, 0, 0, 0, 0, 0)
		// a denial takes nothing and changes no hold; every limit's reply is as it is
		before := snaps(t, tg.c, keys)
		n = call("rl_multi", 10, 71, "r1")
		if n[0] != 0 || n[6] != 3 {
			t.Fatalf("rl_multi over the limit: %v", n)
		}
		want(1, 1, 1000, 700, 0, -1, 0)
		want(2, 1, 0, 300, 0, -1, 0)
		want(3, 0, 100, 70, -1, -1, 0)
		want(4, 1, 0, 30, 0, -1, 0)
		sameSnaps(t, tg.c, keys, before, "a denied rl_multi with holds")
		// adds to both holds together, then the peek reads them
		call("rl_multi", 100, 10, "r1")
		n = call("rl_multi_peek", 1, 1, "r1")
		want(2, 1, 0, 400, 0, -1, 0)
		want(4, 1, 0, 40, 0, -1, 0)
		// each limit is settled on its own
		if s := settle(t, tg.c, keys[:2], group(tokenSlow, 1000, 100, 0), "r1"); !s.Allowed || s.Held != 100 {
			t.Fatalf("settle the bucket: %v", s)
		}
		if s := settle(t, tg.c, keys[2:4], group(fixedSlow, 100, 40, 0), "r1"); !s.Allowed || s.Held != 40 || s.Remaining != 60 {
			t.Fatalf("settle the window: %v", s)
		}
		// without replies, rl_multi answers its seven integers as in 1.2.0
		if m := multi(t, tg.c, false, keys[2:3], group(fixedSlow, 100, 1, 0)); !m.Allowed || m.Remaining != 59 {
			t.Fatalf("rl_multi without replies: %v", m)
		}
	})
}

// 200 holders share a budget of 10,000 units, each holding an estimate, adding as it streams
// and settling with what it used: at no sampled instant does the limiter hold more than the
// budget, or its live holds more than it charged, and in the end what it charged is exactly
// the sum of the settlements, which is at most the budget.
func TestHoldBudgetUnderConcurrency(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		const budget, holders = 10_000, 200
		// a window of 10^11 ms: the budget never resets during the test
		const window = 100_000_000_000
		keys := holdKeys(t)
		g := func(cost int64) []string {
			return group(limiter{fn: "rl_fixed_window", args: windowArgs(window)}, budget, cost, 0)
		}
		var settled, cut, calls atomic.Int64
		stopSampling := sampleBudget(t, tg.c, keys, budget)
		var wg sync.WaitGroup
		errs := make(chan error, holders)
		for w := range holders {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 33))
				for s := 0; ; s++ {
					id := fmt.Sprintf("w%d-%d", w, s)
					want := 20 + rng.Int64N(100) // what the stream would use
					r, err := tryHold(tg.c, "rl_hold", keys, append(g(20), id, "600000", "0")...)
					calls.Add(1)
					if err != nil {
						errs <- err
						return
					}
					if !r.Allowed {
						return // the budget is spent
					}
					used := int64(20)
					for used < want {
						step := min(10, want-used)
						r, err = tryHold(tg.c, "rl_hold", keys, append(g(step), id, "600000", "0")...)
						calls.Add(1)
						if err != nil {
							errs <- err
							return
						}
						if !r.Allowed {
							cut.Add(1)
							break // the stream is cut where the budget ends
						}
						used += step
					}
					// reported usage: sometimes less than held (the last chunk unused)
					actual := used - rng.Int64N(10)
					s, err := tryHold(tg.c, "rl_hold_settle", keys, append(g(actual), id)...)
					calls.Add(1)
					if err != nil {
						errs <- err
						return
					}
					if !s.Allowed || s.Held != actual {
						errs <- fmt.Errorf("settle %s of %d: %v", id, actual, s)
						return
					}
					settled.Add(actual)
				}
			})
		}
		wg.Wait()
		samples, worst := stopSampling()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		charged, held := sample(t, tg.c, keys)
		t.Logf("%d holders, %d calls: %d units settled, %d charged, %d held at the end, %d streams cut, %d samples, at most %d charged",
			holders, calls.Load(), settled.Load(), charged, held, cut.Load(), samples, worst)
		if held != 0 || charged != settled.Load() || charged > budget {
			t.Fatalf("in the end: %d charged, %d held, %d settled; budget %d", charged, held, settled.Load(), budget)
		}
		if charged < budget/2 {
			t.Fatalf("the holders stopped with %d of %d charged", charged, budget)
		}
	})
}

// sampleBudget samples a budget's keys (sample) again and again until the returned stop is
// called, and fails the test on any sample with more charged than the budget or more held than
// charged; stop says how many samples it took and the most it saw charged.
func sampleBudget(t testing.TB, c valkey.Client, keys []string, budget int64) (stop func() (samples, worst int64)) {
	done := make(chan struct{})
	var samples, worst int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			charged, held := sample(t, c, keys)
			samples++
			if charged > budget || held > charged {
				t.Errorf("sampled: %d charged, %d held, budget %d", charged, held, budget)
			}
			worst = max(worst, charged)
		}
	})
	return func() (int64, int64) {
		close(done)
		wg.Wait()
		return samples, worst
	}
}

// sample reads, atomically (one script), a fixed window's count and the units its holds hold.
func sample(t testing.TB, c valkey.Client, keys []string) (charged, held int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const read = "return {redis.call('GET', KEYS[1]) or '', redis.call('HGETALL', KEYS[2])}"
	arr, err := c.Do(ctx, c.B().Eval().Script(read).Numkeys(2).Key(keys...).Build()).ToArray()
	if err != nil || len(arr) != 2 {
		t.Fatalf("sample: %v", err)
	}
	v, err := arr[0].ToString()
	if err != nil {
		t.Fatal(err)
	}
	if v != "" {
		var f [2]float64
		unpackDoubles(t, v, f[:])
		charged = int64(f[1])
	}
	kv, err := arr[1].AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	for f, v := range m {
		if f == "" {
			continue
		}
		var rec [4]float64
		unpackDoubles(t, v, rec[:])
		held += int64(rec[2])
	}
	return charged, held
}

func unpackDoubles(t testing.TB, v string, out []float64) {
	t.Helper()
	if len(v) != 8*len(out) {
		t.Fatalf("%d bytes, want %d doubles", len(v), len(out))
	}
	for i := range out {
		var u uint64
		for j := 7; j >= 0; j-- {
			u = u<<8 | uint64(v[8*i+j])
		}
		out[i] = math.Float64frombits(u)
	}
}

// A rollback from 1.3.0 to 1.2.0 keeps every limiter that holds charged, exactly: 1.2.0 reads
// it as 1.3.0 does, the holds' units stay charged (1.2.0 has no sweep), 1.2.0 refuses the hold
// functions, the hold group and replies, and leaves the hold keys as they were; 1.3.0 loaded
// again sweeps them.
func TestRollbackTo12KeepsHolds(t *testing.T) {
	v12 := release(t, "1.2.0")
	for _, s := range standalones {
		t.Run(s.name, func(t *testing.T) {
			c := s.start(t).Client(t)
			roomInWindow(t, c, 60_000, 5*time.Second)
			loadCode(t, c, sourceOf13(t))
			const limit = 100
			var all []string
			type held struct {
				h    holdable
				keys []string
			}
			var hs []held
			for _, h := range holdables(serverMs(t, c)) {
				keys := holdKeys(t)
				hold(t, c, keys, h.group(limit, 30, 0), "gone", 800, false)
				hold(t, c, keys, h.group(limit, 20, 0), "live", 600_000, false)
				hs = append(hs, held{h, keys})
				all = append(all, keys...)
			}
			read := func() []reply {
				var out []reply
				for _, x := range hs {
					out = append(out, fcall(t, c, x.h.fn+"_peek", x.keys[0], x.h.args(limit, 1)...))
				}
				return out
			}
			dumps := snaps(t, c, all)
			by13 := read()
			loadCode(t, c, v12.Code)
			by12 := read()
			sameSnaps(t, c, all, dumps, "the peeks of both releases")
			for i, a := range by13 {
				if b := by12[i]; b.Allowed != a.Allowed || b.Remaining != a.Remaining || b.Remaining != 50 {
					t.Errorf("%s: 1.3.0 reads %v, 1.2.0 reads %v", hs[i].h.name, a, b)
				}
			}
			x := hs[0]
			for _, c2 := range []struct {
				fn   string
				args []string
				want string
			}{
				{"rl_hold", append(x.h.group(limit, 1, 0), "a", "1000", "0"), "Function not found"},
				{"rl_hold_settle", append(x.h.group(limit, 1, 0), "a"), "Function not found"},
				{"rl_multi", append(x.h.group(limit, 1, 0), "hold", "a", "1000", "0"), "RLERR rl_multi: group 2: unknown algorithm 'hold'"},
				{"rl_multi", append(x.h.group(limit, 1, 0), "replies"), "RLERR rl_multi: "},
			} {
				keys := x.keys
				if c2.fn == "rl_multi" && len(c2.args) == len(x.h.group(limit, 1, 0))+1 {
					keys = keys[:1]
				}
				err := do(t, c, c.B().Fcall().Function(c2.fn).Numkeys(int64(len(keys))).Key(keys...).Arg(c2.args...).Build()).Error()
				if err == nil || !strings.Contains(err.Error(), c2.want) {
					t.Errorf("1.2.0: %s: %v, want %q", c2.fn, err, c2.want)
				}
			}
			sameSnaps(t, c, all, dumps, "1.2.0's refusals")
			// 1.2.0 takes exactly the 50 left, holds and all
			for _, x := range hs {
				if r := fcall(t, c, x.h.fn, x.keys[0], x.h.args(limit, 51)...); r.Allowed {
					t.Errorf("%s: 1.2.0 admitted 51 of 50 left", x.h.name)
				}
			}
			// back to 1.3.0 after the short holds expired: the sweep gives their units back
			time.Sleep(900 * time.Millisecond)
			loadCode(t, c, sourceOf13(t))
			for _, x := range hs {
				if r := hold(t, c, x.keys, x.h.group(limit, 0, 0), "probe", 1000, false); r.Remaining != 80 {
					t.Errorf("%s: 1.3.0 again: %v, want the expired hold's 30 back", x.h.name, r)
				}
			}
		})
	}
}

// sourceOf13 is release 1.3.0's code, as versions/ pins it.
func sourceOf13(t *testing.T) string {
	t.Helper()
	return release(t, "1.3.0").Code
}

// holdKeyState is a hold key as read in one script: its marker, its holds' records and its
// expiry (PEXPIRETIME).
type holdKeyState struct {
	next, until, expiry int64
	holds               map[string][4]int64 // expires_ms, horizon_ms, held, keep
}

func readHoldKey(t testing.TB, c valkey.Client, key string) holdKeyState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const read = "return {redis.call('PEXPIRETIME', KEYS[1]), redis.call('HGETALL', KEYS[1])}"
	arr, err := c.Do(ctx, c.B().Eval().Script(read).Numkeys(1).Key(key).Build()).ToArray()
	if err != nil || len(arr) != 2 {
		t.Fatalf("read %s: %v", key, err)
	}
	s := holdKeyState{holds: map[string][4]int64{}}
	if s.expiry, err = arr[0].AsInt64(); err != nil {
		t.Fatal(err)
	}
	kv, err := arr[1].AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i] == "" {
			var m [2]float64
			unpackDoubles(t, kv[i+1], m[:])
			s.next, s.until = int64(m[0]), int64(m[1])
			continue
		}
		var r [4]float64
		unpackDoubles(t, kv[i+1], r[:])
		s.holds[kv[i]] = [4]int64{int64(r[0]), int64(r[1]), int64(r[2]), int64(r[3])}
	}
	return s
}

// The marker of a hold key, through rl_hold and a hold group of rl_multi: next_ms moves to a
// hold's expiry only when that is earlier, and a sweep sets it to the earliest expiry of the
// holds it leaves; until_ms, the key's expiry, moves only when a horizon passes it, to that
// horizon + 1000 ms, and never back (docs/library.md, State of holds). The calls that need not
// write the marker skip it, and this holds them to what it must say.
func TestHoldMarker(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, viaMulti := range []bool{false, true} {
			name := "rl_hold"
			if viaMulti {
				name = "rl_multi"
			}
			t.Run(name, func(t *testing.T) {
				const limit = 100
				keys := holdKeys(t)
				take := func(id string, cost, ttlMs int64) {
					t.Helper()
					if !viaMulti {
						if r := hold(t, tg.c, keys, group(tokenSlow, limit, cost, 0), id, ttlMs, false); !r.Allowed {
							t.Fatalf("hold %s: %v", id, r)
						}
						return
					}
					args := append(group(tokenSlow, limit, cost, 0), "hold", id, itoa(ttlMs)[0], "0")
					if m := multi(t, tg.c, false, keys, args); !m.Allowed {
						t.Fatalf("rl_multi hold %s: %v", id, m)
					}
				}
				read := func(what string) holdKeyState {
					t.Helper()
					s := readHoldKey(t, tg.c, keys[1])
					if s.expiry != s.until {
						t.Fatalf("after %s: the key expires at %d, its marker says %d", what, s.expiry, s.until)
					}
					return s
				}
				// a bucket refilling one token in 10 minutes: each unit held moves the horizon
				take("a", 1, 600_000)
				s := read("a")
				a := s.holds["a"]
				if s.next != a[0] || s.until != a[1]+1000 {
					t.Fatalf("after a: marker (%d, %d), hold a %v: want (its expiry, its horizon + 1000)", s.next, s.until, a)
				}
				take("b", 1, 1_200_000)
				s = read("b")
				b := s.holds["b"]
				if b[1] <= a[1] || s.next != a[0] || s.until != b[1]+1000 {
					t.Fatalf("after b: marker (%d, %d), a %v, b %v: want (a's expiry, b's horizon + 1000)", s.next, s.until, a, b)
				}
				take("c", 1, 300)
				s = read("c")
				c := s.holds["c"]
				if s.next != c[0] || s.until != c[1]+1000 {
					t.Fatalf("after c: marker (%d, %d), c %v: want (c's expiry, c's horizon + 1000)", s.next, s.until, c)
				}
				until := s.until
				time.Sleep(400 * time.Millisecond)
				// renews b: the sweep removes c, gives its unit back, and next_ms becomes a's
				// expiry, the earliest left; b's horizon is now before until_ms, which stays
				take("b", 0, 1_200_000)
				s = read("the sweep")
				if _, ok := s.holds["c"]; ok || len(s.holds) != 2 {
					t.Fatalf("after the sweep: holds %v, want a and b", s.holds)
				}
				if s.next != a[0] || s.until != until || s.holds["b"][1] > until {
					t.Fatalf("after the sweep: marker (%d, %d), holds %v: want (a's expiry %d, %d)", s.next, s.until, s.holds, a[0], until)
				}
				// a settle removes a without a sweep: next_ms may stay before the earliest
				// expiry, until_ms never moves back
				settle(t, tg.c, keys, group(tokenSlow, limit, 1, 0), "a")
				s = read("the settle")
				if len(s.holds) != 1 || s.next > s.holds["b"][0] || s.until != until {
					t.Fatalf("after the settle of a: marker (%d, %d), holds %v", s.next, s.until, s.holds)
				}
			})
		}
	})
}
