package integration_test

import (
	"context"
	"testing"
	"time"
)

// A call with a reserve is admitted only while cost + reserve fit, consumes only cost, and
// tells the caller what it (not a critical caller) could still take.
func TestReserve(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, l := range slow {
			t.Run(l.name, func(t *testing.T) {
				key := keyFor(t)
				if l.windowed {
					roomInWindow(t, tg.c, 60_000, 2*time.Second)
				}
				const limit = 10
				call := func(cost, reserve int64) reply {
					return fcall(t, tg.c, l.fn, key, withReserve(l.args(limit, cost), reserve)...)
				}
				peek := func(cost, reserve int64) reply {
					return fcallRO(t, tg.c, l.fn+"_peek", key, withReserve(l.args(limit, cost), reserve)...)
				}

				// reserve = limit refuses every cost from 1 up, forever; cost 0 still fits
				for _, r := range []reply{peek(1, limit), call(1, limit)} {
					if r.Allowed || r.RetryAfter != -1 || r.Remaining != 0 || r.Limit != limit {
						t.Fatalf("cost 1 with reserve = limit: %v, want denied with retry -1, remaining 0", r)
					}
				}
				if r := call(0, limit); !r.Allowed || r.Remaining != 0 || r.RetryAfter != 0 {
					t.Fatalf("cost 0 with reserve = limit on a fresh limiter: %v, want admitted with remaining 0", r)
				}
				// cost + reserve above the limit
				if r := call(5, 6); r.Allowed || r.RetryAfter != -1 || r.Remaining != 4 {
					t.Fatalf("cost 5 + reserve 6 of 10: %v, want denied with retry -1, remaining 4", r)
				}
				if snap(t, tg.c, key).exists {
					t.Fatal("calls that consumed nothing created the key")
				}

				// a caller that leaves 3 takes while 3 stay
				if r := call(1, 3); !r.Allowed || r.Remaining != 6 || r.RetryAfter != 0 {
					t.Fatalf("cost 1 reserve 3: %v, want admitted with remaining 6", r)
				}
				if p := peek(6, 3); !p.Allowed || p.Remaining != 6 {
					t.Fatalf("peek cost 6 reserve 3 with 9 left: %v, want admitted with remaining 6", p)
				}
				if r := call(6, 3); !r.Allowed || r.Remaining != 0 {
					t.Fatalf("cost 6 reserve 3 with 9 left: %v, want admitted with remaining 0", r)
				}
				// 3 left: the reserve is not for this caller
				before := snap(t, tg.c, key)
				for _, c := range []struct{ cost, reserve, remaining int64 }{
					{1, 3, 0},
					{0, 4, 0}, // a cost-0 call with a reserve can be denied
					{3, 1, 2},
					{2, 2, 1},
				} {
					for _, r := range []reply{peek(c.cost, c.reserve), call(c.cost, c.reserve)} {
						if r.Allowed || r.Remaining != c.remaining || r.RetryAfter <= 0 || r.Delay != 0 || r.ResetAfter <= 0 {
							t.Fatalf("cost %d reserve %d with 3 left: %v, want denied with remaining %d and a retry",
								c.cost, c.reserve, r, c.remaining)
						}
					}
				}
				if after := snap(t, tg.c, key); after != before {
					t.Fatal("denied calls with a reserve changed the state")
				}
				if r := call(0, 3); !r.Allowed || r.Remaining != 0 {
					t.Fatalf("cost 0 reserve 3 with 3 left: %v, want admitted", r)
				}
				if r := call(2, 1); !r.Allowed || r.Remaining != 0 {
					t.Fatalf("cost 2 reserve 1 with 3 left: %v, want admitted with remaining 0", r)
				}
				// the critical caller (reserve 0) takes the last unit
				if r := call(1, 0); !r.Allowed || r.Remaining != 0 {
					t.Fatalf("the critical caller: %v, want the last unit admitted", r)
				}
				if r := call(0, 1); r.Allowed || r.Remaining != 0 || r.RetryAfter <= 0 {
					t.Fatalf("cost 0 reserve 1 on an exhausted limiter: %v, want denied", r)
				}
			})
		}
	})
}

// reserve 0 is the 1.0 call: the same reply, call for call, on two keys with one history.
func TestReserveZeroIsThe10Call(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, l := range slow {
			t.Run(l.name, func(t *testing.T) {
				keys := tagKeys(t, 2)
				if l.windowed {
					roomInWindow(t, tg.c, 60_000, 2*time.Second)
				}
				const limit = 10
				for _, cost := range []int64{0, 4, 7, 11, 6, 1, 0} {
					for _, fn := range []string{l.fn + "_peek", l.fn} {
						ro := fn != l.fn
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						res := tg.c.DoMulti(ctx,
							fcallCmd(tg.c, ro, fn, keys[0], l.args(limit, cost)...),
							fcallCmd(tg.c, ro, fn, keys[1], withReserve(l.args(limit, cost), 0)...))
						cancel()
						a, err := decode(res[0])
						if err != nil {
							t.Fatal(err)
						}
						b, err := decode(res[1])
						if err != nil {
							t.Fatal(err)
						}
						// The two keys' calls run a little apart, and a loaded machine can spread
						// them by milliseconds: times are compared within 50ms (a unit here is
						// worth 600s or a whole window, so a wrong decision is far off).
						near := func(x, y int64) bool { return x-y <= 50 && y-x <= 50 }
						if a.Allowed != b.Allowed || a.Limit != b.Limit || a.Remaining != b.Remaining ||
							!near(a.RetryAfter, b.RetryAfter) || (a.RetryAfter == -1) != (b.RetryAfter == -1) ||
							!near(a.ResetAfter, b.ResetAfter) || !near(a.Delay, b.Delay) {
							t.Fatalf("%s cost %d: without a reserve %v, with reserve 0 %v", fn, cost, a, b)
						}
					}
				}
			})
		}
	})
}

// retry_after is the wait until cost + reserve fits, checked against each algorithm's
// arithmetic with the server's clock.
func TestReserveRetryAfter(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		const limit = 10
		t.Run("fixed_window", func(t *testing.T) {
			key := keyFor(t)
			roomInWindow(t, tg.c, 60_000, 2*time.Second)
			args := windowArgs(60_000)
			fcall(t, tg.c, "rl_fixed_window", key, args(limit, 8)...)
			before := serverNow(t, tg.c) / 1000
			r := fcall(t, tg.c, "rl_fixed_window", key, withReserve(args(limit, 1), 2)...)
			after := serverNow(t, tg.c) / 1000
			if r.Allowed || r.RetryAfter != r.ResetAfter {
				t.Fatalf("%v: want denied until the window ends", r)
			}
			end := before - before%60_000 + 60_000
			within(t, "retry_after", r.RetryAfter, end-after, end-before)
		})
		t.Run("sliding_window", func(t *testing.T) {
			key := keyFor(t)
			roomInWindow(t, tg.c, 60_000, 2*time.Second)
			args := windowArgs(60_000)
			fcall(t, tg.c, "rl_sliding_window", key, args(limit, 8)...)
			for _, c := range []struct{ cost, reserve int64 }{{1, 2}, {2, 4}} {
				before := serverNow(t, tg.c) / 1000
				r := fcall(t, tg.c, "rl_sliding_window", key, withReserve(args(limit, c.cost), c.reserve)...)
				after := serverNow(t, tg.c) / 1000
				// In the next window the 8 units weigh 8 * (window - e) / window: need fits once
				// e >= window - (limit - need) * window / 8.
				need := c.cost + c.reserve
				e := 60_000 - (limit-need)*60_000/8
				target := before - before%60_000 + 60_000 + e
				if r.Allowed {
					t.Fatalf("cost %d reserve %d: %v, want denied", c.cost, c.reserve, r)
				}
				within(t, "retry_after", r.RetryAfter, target-after, target-before)
			}
		})
		t.Run("sliding_log", func(t *testing.T) {
			key := keyFor(t)
			args := windowArgs(60_000)
			fcall(t, tg.c, "rl_sliding_log", key, args(limit, 4)...)
			time.Sleep(30 * time.Millisecond)
			fcall(t, tg.c, "rl_sliding_log", key, args(limit, 4)...)
			scores := zscores(t, tg.c, key) // microseconds, oldest first
			for _, c := range []struct{ cost, reserve int64 }{{1, 2}, {1, 4}, {1, 6}, {2, 6}} {
				// the (8 + need - limit)-th oldest entry must leave the window
				k := 8 + c.cost + c.reserve - limit
				leaves := scores[k-1] + 60_000_000
				before := serverNow(t, tg.c)
				r := fcall(t, tg.c, "rl_sliding_log", key, withReserve(args(limit, c.cost), c.reserve)...)
				after := serverNow(t, tg.c)
				if r.Allowed {
					t.Fatalf("cost %d reserve %d: %v, want denied", c.cost, c.reserve, r)
				}
				within(t, "retry_after", r.RetryAfter, ceilDiv(leaves-after, 1000), ceilDiv(leaves-before, 1000))
			}
		})
		for _, l := range slow[3:] {
			t.Run(l.name, func(t *testing.T) {
				key := keyFor(t)
				// one unit per 600s: 8 taken leave 2, and each unit more takes 600s to come
				before0 := serverNow(t, tg.c)
				fcall(t, tg.c, l.fn, key, l.args(limit, 8)...)
				after0 := serverNow(t, tg.c)
				for _, c := range []struct{ cost, reserve int64 }{{1, 2}, {1, 4}, {3, 3}} {
					before := serverNow(t, tg.c)
					r := fcall(t, tg.c, l.fn, key, withReserve(l.args(limit, c.cost), c.reserve)...)
					after := serverNow(t, tg.c)
					if r.Allowed {
						t.Fatalf("cost %d reserve %d: %v, want denied", c.cost, c.reserve, r)
					}
					units := c.cost + c.reserve - 2
					wait := units * 600_000_000 // microseconds, less what leaked since the 8 were taken
					within(t, "retry_after", r.RetryAfter, ceilDiv(wait-(after-before0), 1000), ceilDiv(wait-(before-after0), 1000))
				}
			})
		}
	})
}
