package integration_test

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// Calendar windows (release 1.2.0). The server's clock cannot be moved, so every test reads
// TIME first and chooses the boundaries around it: "now is in the second window" means
// boundaries placed so that it is.

// bounds is a calendar's b1 < b2 < b3 < b4.
type bounds [4]int64

// boundsAround returns three windows of w ms with now (server ms) `at` ms into window `in`
// (1, 2 or 3).
func boundsAround(nowMs, w int64, in int, at int64) bounds {
	start := nowMs - at - int64(in-1)*w
	return bounds{start, start + w, start + 2*w, start + 3*w}
}

// calArgs is rl_calendar's ARGV; with a reserve, the optional trailing one.
func calArgs(limit int64, b bounds, cost int64, reserve ...int64) []string {
	return itoa(append([]int64{limit, b[0], b[1], b[2], b[3], cost}, reserve...)...)
}

// calGroup is a calendar group of rl_multi: all eight items.
func calGroup(limit int64, b bounds, cost, reserve int64) []string {
	return append([]string{"calendar"}, calArgs(limit, b, cost, reserve)...)
}

// serverMs is the server's TIME in whole milliseconds, rounded down, as the library counts.
func serverMs(t testing.TB, c valkey.Client) int64 { return serverNow(t, c) / 1000 }

// fixedState is the fixed window's (and the calendar's) state: start and count.
func fixedState(start, count int64) string { return packed(float64(start), float64(count)) }

func value(t testing.TB, c valkey.Client, key string) string {
	t.Helper()
	v, err := do(t, c, c.B().Get().Key(key).Build()).ToString()
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	return v
}

// checkCalendarKey holds a calendar key to its contract: the fixed window's format with the
// decided window's start and the count, expiring exactly at the window's end.
func checkCalendarKey(t testing.TB, c valkey.Client, key string, start, stop, count int64) {
	t.Helper()
	s := snap(t, c, key)
	if !s.exists {
		t.Fatalf("%s: no state, want window %d with %d", key, start, count)
	}
	if got := value(t, c, key); got != fixedState(start, count) {
		t.Fatalf("%s holds %x, want window %d with %d (%x)", key, got, start, count, fixedState(start, count))
	}
	if s.expiry != stop {
		t.Fatalf("%s expires at %d, want the window's end %d", key, s.expiry, stop)
	}
}

// calReset checks a reset_after (or retry_after) that runs to stop from a decision made at a
// server time in [t0, t1].
func calReset(t testing.TB, what string, got, stop, t0, t1 int64) {
	t.Helper()
	within(t, what, got, stop-t1, stop-t0)
}

// The call decides in the window that holds now, whichever of the three it is, in the fixed
// window's state format, and the key expires at that window's end.
func TestCalendarPicksTheWindowHoldingNow(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for in := 1; in <= 3; in++ {
			key := keyFor(t)
			t0 := serverMs(t, tg.c)
			// windows of 60s, now 10s into window `in`; windows of unequal lengths too
			b := boundsAround(t0, 60_000, in, 10_000)
			if in == 2 {
				b[0] -= 5_000     // a longer first window
				b[3] += 3_600_000 // a longer third one
			}
			start, stop := b[in-1], b[in]
			r, sent, received := timed(func() reply { return fcall(t, tg.c, "rl_calendar", key, calArgs(5, b, 2)...) })
			t1 := serverMs(t, tg.c)
			if !r.Allowed || r.Limit != 5 || r.Remaining != 3 || r.RetryAfter != 0 || r.Delay != 0 {
				t.Fatalf("window %d: %v, want admitted with 3 left", in, r)
			}
			calReset(t, "reset_after", r.ResetAfter, stop, t0, t1)
			checkCalendarKey(t, tg.c, key, start, stop, 2)
			checkTTL(t, tg.c, key, r, sent, received)
			if p := fcallRO(t, tg.c, "rl_calendar_peek", key, calArgs(5, b, 3)...); !p.Allowed || p.Remaining != 3 {
				t.Fatalf("window %d: peek %v, want 3 left", in, p)
			}
		}
	})
}

// A window boundary crossed between the caller computing its boundaries and the server
// deciding, both ways: the caller's clock a little ahead (it passes as the middle window one
// that the server has not reached) and a little behind (the server has left the caller's
// middle window). The server's clock picks the window, and callers whose middle windows differ
// by one share one count: no window is split, doubled or skipped.
func TestCalendarClockSkew(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		const w = 10_000
		t0 := serverMs(t, tg.c)
		key := keyFor(t)
		// the server is 3s into window W; behind: the caller's middle window is the one before
		// W; ahead: the one after W
		behind := boundsAround(t0, w, 3, 3_000)
		ahead := boundsAround(t0, w, 1, 3_000)
		if behind[2] != ahead[0] {
			t.Fatalf("the windows differ: %v %v", behind, ahead)
		}
		start, stop := behind[2], behind[3]
		for i, b := range []bounds{behind, ahead, behind, ahead} {
			r := fcall(t, tg.c, "rl_calendar", key, calArgs(4, b, 1)...)
			if !r.Allowed || r.Remaining != int64(3-i) {
				t.Fatalf("call %d: %v, want admitted with %d left: one count for both callers", i, r, 3-i)
			}
			checkCalendarKey(t, tg.c, key, start, stop, int64(i+1))
		}
		for _, b := range []bounds{behind, ahead} {
			if r := fcall(t, tg.c, "rl_calendar", key, calArgs(4, b, 1)...); r.Allowed || r.Remaining != 0 {
				t.Fatalf("the fifth unit: %v, want denied", r)
			}
		}

		// A boundary crossed after the caller computed it: the middle window ends 150ms after
		// TIME, the call runs 300ms later, in the third window.
		for attempt := 1; ; attempt++ {
			t0 := serverMs(t, tg.c)
			b := boundsAround(t0, w, 2, w-150)
			key := keyFor(t)
			time.Sleep(300 * time.Millisecond)
			r := fcall(t, tg.c, "rl_calendar", key, calArgs(4, b, 1)...)
			t1 := serverMs(t, tg.c)
			if t1 >= b[3] {
				if attempt == 3 {
					t.Fatal("the machine is too slow: 3 attempts took longer than a window")
				}
				continue
			}
			if !r.Allowed || r.Remaining != 3 {
				t.Fatalf("after the boundary: %v", r)
			}
			calReset(t, "reset_after", r.ResetAfter, b[3], t0+300, t1)
			checkCalendarKey(t, tg.c, key, b[2], b[3], 1)
			break
		}

		// A window that starts while a caller is using the previous one: its count is the
		// previous window's until b2, a fresh window's after (the key holds the ended window
		// until a call replaces it or it expires).
		t0 = serverMs(t, tg.c)
		b := boundsAround(t0, w, 1, w-1_000)
		key = keyFor(t)
		if r := fcall(t, tg.c, "rl_calendar", key, calArgs(2, b, 2)...); !r.Allowed || r.Remaining != 0 {
			t.Fatalf("before b2: %v", r)
		}
		if r := fcall(t, tg.c, "rl_calendar", key, calArgs(2, b, 1)...); r.Allowed {
			t.Fatalf("before b2, the window full: %v", r)
		} else if serverMs(t, tg.c) < b[1] {
			calReset(t, "retry_after", r.RetryAfter, b[1], t0, b[1])
		}
		// keep the ended window in the key: it must count as empty all the same
		do(t, tg.c, tg.c.B().Pexpire().Key(key).Milliseconds(60_000).Build())
		time.Sleep(time.Duration(b[1]-serverMs(t, tg.c)+5) * time.Millisecond)
		if r := fcall(t, tg.c, "rl_calendar", key, calArgs(2, b, 2)...); !r.Allowed || r.Remaining != 0 {
			t.Fatalf("after b2: %v, want a fresh window", r)
		}
		checkCalendarKey(t, tg.c, key, b[1], b[2], 2)
	})
}

var nowInMessage = regexp.MustCompile(`now (\d+)`)

// Now before b1 or at/after b4 is RLERR holding now, b1 and b4 in milliseconds, for the call,
// its peek, its refund and rl_multi's calendar group, and nothing is written.
func TestCalendarStaleBoundaries(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		keys := tagKeys(t, 2)
		t0 := serverMs(t, tg.c)
		live := boundsAround(t0, 60_000, 2, 1_000)
		fcall(t, tg.c, "rl_calendar", keys[0], calArgs(10, live, 3)...)
		fcall(t, tg.c, fixedSlow.fn, keys[1], fixedSlow.args(10, 3)...)
		before := snaps(t, tg.c, keys)
		for _, c := range []struct {
			name string
			b    bounds
		}{
			{"ended", boundsAround(t0, 1_000, 3, 2_000)},                // b4 = now - 1000
			{"ends now", boundsAround(t0-1, 1, 3, 0)},                   // b4 = now at TIME
			{"in the future", boundsAround(t0+60_000, 1_000, 1, 0)},     // b1 = now + 60s
			{"a day off", boundsAround(t0-86_400_000, 3_600_000, 2, 0)}, // a clock a day behind
		} {
			calls := []struct {
				fn  string
				run func() error
			}{
				{"rl_calendar", func() error {
					_, err := tryCall(tg.c, false, "rl_calendar", keys[0], calArgs(10, c.b, 1)...)
					return err
				}},
				{"rl_calendar", func() error {
					_, err := tryCall(tg.c, false, "rl_calendar", keys[0], calArgs(10, c.b, 0, 2)...)
					return err
				}},
				{"rl_calendar_peek", func() error {
					_, err := tryCall(tg.c, true, "rl_calendar_peek", keys[0], calArgs(10, c.b, 1)...)
					return err
				}},
				{"rl_calendar_refund", func() error {
					_, err := tryCall(tg.c, false, "rl_calendar_refund", keys[0], calArgs(10, c.b, 3)...)
					return err
				}},
				{"rl_multi", func() error {
					_, err := tryMulti(tg.c, false, "rl_multi", []string{keys[1], keys[0]}, append(group(fixedSlow, 10, 1, 0), calGroup(10, c.b, 1, 0)...))
					return err
				}},
				{"rl_multi_peek", func() error {
					_, err := tryMulti(tg.c, true, "rl_multi_peek", keys, append(calGroup(10, c.b, 1, 0), group(fixedSlow, 10, 1, 0)...))
					return err
				}},
			}
			for _, call := range calls {
				err := call.run()
				t1 := serverMs(t, tg.c)
				if !isRLERR(err) || !strings.HasPrefix(err.Error(), "RLERR "+call.fn+":") {
					t.Fatalf("%s: %s: got %v, want RLERR %s: ...", c.name, call.fn, err, call.fn)
				}
				msg := err.Error()
				m := nowInMessage.FindStringSubmatch(msg)
				if m == nil {
					t.Fatalf("%s: %s: %q does not hold now", c.name, call.fn, msg)
				}
				now, _ := strconv.ParseInt(m[1], 10, 64)
				within(t, c.name+": now in the message", now, t0, t1)
				for _, b := range []int64{c.b[0], c.b[3]} {
					if !strings.Contains(msg, strconv.FormatInt(b, 10)) {
						t.Fatalf("%s: %s: %q does not hold b1 and b4 %v", c.name, call.fn, msg, c.b)
					}
				}
				sameSnaps(t, tg.c, keys, before, c.name+": "+call.fn)
			}
		}
		// and on an absent key, nothing is created
		fresh := keyFor(t)
		if _, err := tryCall(tg.c, false, "rl_calendar", fresh, calArgs(10, boundsAround(t0, 1_000, 3, 2_000), 1)...); !isRLERR(err) {
			t.Fatalf("stale boundaries on an absent key: %v", err)
		}
		if snap(t, tg.c, fresh).exists {
			t.Fatal("stale boundaries wrote an absent key")
		}
	})
}

// Within its window a calendar is a fixed window: the limit, reserve, denials that consume
// nothing, retry_after until the window's end (-1 when cost + reserve > limit), reset_after
// until its end while it holds units and 0 when not, the TTL rule after every call.
func TestCalendarDecides(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		key := keyFor(t)
		t0 := serverMs(t, tg.c)
		b := boundsAround(t0, 3_600_000, 2, 1_000)
		start, stop := b[1], b[2]
		call := func(fn string, args []string) (reply, int64) {
			t.Helper()
			r, sent, received := timed(func() reply { return fcall(t, tg.c, fn, key, args...) })
			checkTTL(t, tg.c, key, r, sent, received)
			return r, serverMs(t, tg.c)
		}
		// cost 0 on an absent key: admitted, nothing written, reset 0
		if r, _ := call("rl_calendar", calArgs(5, b, 0)); !r.Allowed || r.Remaining != 5 || r.ResetAfter != 0 || snap(t, tg.c, key).exists {
			t.Fatalf("cost 0 on an absent key: %v", r)
		}
		if p := fcallRO(t, tg.c, "rl_calendar_peek", key, calArgs(5, b, 1)...); p != (reply{true, 5, 5, 0, 0, 0}) {
			t.Fatalf("peek on an absent key: %v", p)
		}
		if r, _ := call("rl_calendar", calArgs(5, b, 3)); !r.Allowed || r.Remaining != 2 {
			t.Fatalf("cost 3: %v", r)
		}
		before := snap(t, tg.c, key)
		for _, c := range []struct {
			name          string
			args          []string
			remaining     int64
			never         bool
			peekRemaining int64
		}{
			{"cost 3 of 2 left", calArgs(5, b, 3), 2, false, 2},
			{"cost 1 with reserve 2", calArgs(5, b, 1, 2), 0, false, 0},
			{"cost 6 of limit 5", calArgs(5, b, 6), 2, true, 2},
			{"cost 4 with reserve 2", calArgs(5, b, 4, 2), 0, true, 0},
			{"cost 0 with reserve 5", calArgs(5, b, 0, 5), 0, false, 0},
		} {
			r, t1 := call("rl_calendar", c.args)
			if r.Allowed || r.Limit != 5 || r.Remaining != c.remaining || r.Delay != 0 {
				t.Fatalf("%s: %v, want denied with %d left", c.name, r, c.remaining)
			}
			if c.never {
				if r.RetryAfter != -1 {
					t.Fatalf("%s: retry %d, want -1", c.name, r.RetryAfter)
				}
			} else {
				calReset(t, c.name+": retry_after", r.RetryAfter, stop, t0, t1)
			}
			calReset(t, c.name+": reset_after", r.ResetAfter, stop, t0, t1)
			if snap(t, tg.c, key) != before {
				t.Fatalf("%s: a denied call changed the state", c.name)
			}
			p := fcallRO(t, tg.c, "rl_calendar_peek", key, c.args...)
			if p.Allowed || p.Remaining != c.peekRemaining || p.RetryAfter != r.RetryAfter && !(p.RetryAfter > 0 && r.RetryAfter > 0) {
				t.Fatalf("%s: peek %v, call %v", c.name, p, r)
			}
		}
		if r, _ := call("rl_calendar", calArgs(5, b, 1, 1)); !r.Allowed || r.Remaining != 0 {
			t.Fatalf("cost 1 with reserve 1 of 2 left: %v, want admitted with 0 left for this caller", r)
		}
		checkCalendarKey(t, tg.c, key, start, stop, 4)
		if r, _ := call("rl_calendar", calArgs(5, b, 1)); !r.Allowed || r.Remaining != 0 {
			t.Fatalf("the last unit, reserve 0: %v", r)
		}
		// a lowered limit: remaining never below 0, and even cost 0 is denied (as the fixed
		// window does)
		if r, _ := call("rl_calendar", calArgs(3, b, 0)); r.Allowed || r.Remaining != 0 || r.RetryAfter <= 0 {
			t.Fatalf("a limit lowered below the count: %v", r)
		}
		checkCalendarKey(t, tg.c, key, start, stop, 5)
	})
}

// A refund takes units off the current window's count, not below 0, replies as 1.1's refunds
// do, leaves an absent key absent and deletes a key it empties.
func TestCalendarRefund(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		key := keyFor(t)
		t0 := serverMs(t, tg.c)
		b := boundsAround(t0, 60_000, 3, 5_000)
		refund := func(n int64) reply {
			t.Helper()
			r, sent, received := timed(func() reply { return fcall(t, tg.c, "rl_calendar_refund", key, calArgs(10, b, n)...) })
			if !r.Allowed || r.Limit != 10 || r.RetryAfter != 0 || r.Delay != 0 {
				t.Fatalf("refund %d: %v", n, r)
			}
			checkTTL(t, tg.c, key, r, sent, received)
			return r
		}
		if r := refund(3); r != (reply{true, 10, 10, 0, 0, 0}) || snap(t, tg.c, key).exists {
			t.Fatalf("refund on an absent key: %v", r)
		}
		fcall(t, tg.c, "rl_calendar", key, calArgs(10, b, 6)...)
		if r := refund(2); r.Remaining != 6 {
			t.Fatalf("refund 2 of 6: %v", r)
		}
		checkCalendarKey(t, tg.c, key, b[2], b[3], 4)
		before := snap(t, tg.c, key)
		if r := refund(0); r.Remaining != 6 || snap(t, tg.c, key) != before {
			t.Fatalf("refund 0: %v", r)
		}
		if r := refund(999999999999999); r != (reply{true, 10, 10, 0, 0, 0}) || snap(t, tg.c, key).exists {
			t.Fatalf("refund of more than the count: %v, want the key deleted", r)
		}
	})
}

// A key whose window_start_ms is not the current window's holds another window (ended, or
// computed from other boundaries): it counts as empty, the peek leaves it, and every writing
// call replaces or deletes it, whatever its outcome. A fixed window's state is read by the
// same rules.
func TestCalendarOtherWindow(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		t0 := serverMs(t, tg.c)
		b := boundsAround(t0, 3_600_000, 2, 1_000)
		start, stop := b[1], b[2]
		// a window of other boundaries that has not ended (another time zone's day), and one
		// that ended, both alive for an hour
		for _, other := range []int64{start + 1_800_000, start - 3_600_000, 0} {
			holding := func(t *testing.T) []string {
				keys := tagKeys(t, 2)
				do(t, tg.c, tg.c.B().Set().Key(keys[0]).Value(fixedState(other, 7)).PxMilliseconds(3_600_000).Build())
				return keys
			}
			t.Run(strconv.FormatInt(other-start, 10), func(t *testing.T) {
				keys := holding(t)
				before := snap(t, tg.c, keys[0])
				if p := fcallRO(t, tg.c, "rl_calendar_peek", keys[0], calArgs(8, b, 8)...); !p.Allowed || p.Remaining != 8 || p.ResetAfter != 0 {
					t.Fatalf("peek: %v, want an empty window", p)
				}
				if m := multi(t, tg.c, true, keys, calGroup(8, b, 8, 0), group(fixedSlow, 10, 1, 0)); !m.Allowed || m.Binding != 1 || m.Remaining != 8 {
					t.Fatalf("rl_multi_peek: %v", m)
				}
				if snap(t, tg.c, keys[0]) != before {
					t.Fatal("a peek changed the key")
				}
				// admitted: replaced
				if r := fcall(t, tg.c, "rl_calendar", keys[0], calArgs(8, b, 2)...); !r.Allowed || r.Remaining != 6 {
					t.Fatalf("rl_calendar: %v", r)
				}
				checkCalendarKey(t, tg.c, keys[0], start, stop, 2)

				// denied (cost above the limit), cost 0, refund: deleted
				for _, c := range []struct {
					fn   string
					args []string
				}{
					{"rl_calendar", calArgs(8, b, 9)},
					{"rl_calendar", calArgs(8, b, 0)},
					{"rl_calendar_refund", calArgs(8, b, 1)},
				} {
					keys := holding(t)
					r := fcall(t, tg.c, c.fn, keys[0], c.args...)
					if r.Remaining != 8 || r.ResetAfter != 0 || snap(t, tg.c, keys[0]).exists {
						t.Fatalf("%s %v: %v, the key exists: %v; want it deleted", c.fn, c.args, r, snap(t, tg.c, keys[0]).exists)
					}
				}
				// rl_multi admitted: replaced; denied by another limit: deleted
				keys = holding(t)
				if m := multi(t, tg.c, false, keys, calGroup(8, b, 3, 0), group(fixedSlow, 10, 1, 0)); !m.Allowed || m.Binding != 1 || m.Remaining != 5 {
					t.Fatalf("rl_multi: %v", m)
				}
				checkCalendarKey(t, tg.c, keys[0], start, stop, 3)
				keys = holding(t)
				if m := multi(t, tg.c, false, keys, calGroup(8, b, 3, 0), group(fixedSlow, 10, 11, 0)); m.Allowed || m.Binding != 2 {
					t.Fatalf("rl_multi denied by the fixed window: %v", m)
				}
				if snap(t, tg.c, keys[0]).exists {
					t.Fatal("a denied rl_multi kept the other window")
				}
			})
		}

		// a fixed window's state, its window the calendar's current one, is read as its count
		key := keyFor(t)
		roomInWindow(t, tg.c, 60_000, time.Second)
		t0 = serverMs(t, tg.c)
		aligned := boundsAround(t0, 60_000, 2, t0%60_000)
		fcall(t, tg.c, fixedSlow.fn, key, fixedSlow.args(10, 4)...)
		if r := fcall(t, tg.c, "rl_calendar", key, calArgs(10, aligned, 1)...); !r.Allowed || r.Remaining != 5 {
			t.Fatalf("rl_calendar on a fixed window's state: %v, want its 4 counted", r)
		}
		checkCalendarKey(t, tg.c, key, aligned[1], aligned[2], 5)
	})
}

// A calendar group in rl_multi: all or nothing, the binding limit, its window's reset.
func TestCalendarInMulti(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		roomInWindow(t, tg.c, 60_000, 2*time.Second)
		keys := tagKeys(t, 2)
		t0 := serverMs(t, tg.c)
		b := boundsAround(t0, 86_400_000, 2, 3_600_000) // a day, an hour in
		gs := func(cost, reserve int64) [][]string {
			return [][]string{group(fixedSlow, 10, cost, 0), calGroup(4, b, cost, reserve)}
		}
		m := multi(t, tg.c, false, keys, gs(3, 0)...)
		t1 := serverMs(t, tg.c)
		if !m.Allowed || m.Binding != 2 || m.Remaining != 1 {
			t.Fatalf("cost 3: %v, want admitted, bound by the calendar's 1 left", m)
		}
		calReset(t, "reset_after", m.ResetAfter, b[2], t0, t1)
		checkCalendarKey(t, tg.c, keys[1], b[1], b[2], 3)
		before := snaps(t, tg.c, keys)
		for _, ro := range []bool{true, false} {
			m := multi(t, tg.c, ro, keys, gs(2, 0)...)
			t1 := serverMs(t, tg.c)
			if m.Allowed || m.Binding != 2 || m.Remaining != 1 || m.Delay != 0 {
				t.Fatalf("peek %v: cost 2 of 1 left: %v", ro, m)
			}
			calReset(t, "retry_after", m.RetryAfter, b[2], t0, t1)
			if m := multi(t, tg.c, ro, keys, gs(1, 1)...); m.Allowed || m.Binding != 2 {
				t.Fatalf("peek %v: reserve 1: %v", ro, m)
			}
		}
		sameSnaps(t, tg.c, keys, before, "a denied rl_multi")
		if p := fcallRO(t, tg.c, fixedSlow.fn+"_peek", keys[0], fixedSlow.args(10, 0)...); p.Remaining != 7 {
			t.Fatalf("the fixed window after rl_multi: %v", p)
		}
	})
}
