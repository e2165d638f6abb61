package integration_test

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// A refund gives back units up to what the state holds, replies with the limiter after it,
// keeps the TTL rule, writes nothing on an absent key and deletes a key it brings back to the
// initial state.
func TestRefund(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, l := range slow {
			t.Run(l.name, func(t *testing.T) {
				key := keyFor(t)
				if l.windowed {
					roomInWindow(t, tg.c, 60_000, 2*time.Second)
				}
				const limit = 10
				refund := func(n int64) (reply, time.Time, time.Time) {
					r, sent, received := timed(func() reply { return fcall(t, tg.c, refundFn(l), key, l.args(limit, n)...) })
					if !r.Allowed || r.Limit != limit || r.RetryAfter != 0 || r.Delay != 0 {
						t.Fatalf("refund %d: %v, want allowed 1, retry 0, delay 0", n, r)
					}
					return r, sent, received
				}
				fresh := reply{Allowed: true, Limit: limit, Remaining: limit}

				if r, _, _ := refund(3); r != fresh {
					t.Fatalf("refund on an absent key: %v, want %v", r, fresh)
				}
				if snap(t, tg.c, key).exists {
					t.Fatal("a refund on an absent key wrote it")
				}

				if r := fcall(t, tg.c, l.fn, key, l.args(limit, 6)...); !r.Allowed || r.Remaining != 4 {
					t.Fatalf("cost 6: %v", r)
				}
				r, sent, received := refund(2)
				if r.Remaining != 6 || r.ResetAfter <= 0 {
					t.Fatalf("refund 2 of 6 taken: %v, want remaining 6", r)
				}
				checkTTL(t, tg.c, key, r, sent, received)
				if p := fcallRO(t, tg.c, l.fn+"_peek", key, l.args(limit, 6)...); !p.Allowed || p.Remaining != 6 {
					t.Fatalf("peek after the refund: %v, want 6 admissible", p)
				}

				before := snap(t, tg.c, key)
				if r, _, _ := refund(0); r.Remaining != 6 {
					t.Fatalf("refund 0: %v", r)
				}
				if snap(t, tg.c, key) != before {
					t.Fatal("a refund of 0 changed the state")
				}

				// more than the state holds: capped, and back to the initial state
				if r, _, _ := refund(999_999_999_999_999); r != fresh {
					t.Fatalf("refund of more than was taken: %v, want %v", r, fresh)
				}
				if snap(t, tg.c, key).exists {
					t.Fatal("a refund back to the initial state kept the key")
				}

				// exactly what was taken: the initial state again
				fcall(t, tg.c, l.fn, key, l.args(limit, 3)...)
				if r, _, _ := refund(3); r != fresh {
					t.Fatalf("refund of all that was taken: %v, want %v", r, fresh)
				}
				if snap(t, tg.c, key).exists {
					t.Fatal("a refund back to the initial state kept the key")
				}

				// a refund never makes a limiter more permissive than a fresh one
				fcall(t, tg.c, l.fn, key, l.args(limit, 10)...)
				refund(4)
				if r := fcall(t, tg.c, l.fn, key, l.args(limit, 5)...); r.Allowed {
					t.Fatalf("cost 5 with 4 refunded: %v, want denied", r)
				}
				if r := fcall(t, tg.c, l.fn, key, l.args(limit, 4)...); !r.Allowed || r.Remaining != 0 {
					t.Fatalf("cost 4 with 4 refunded: %v, want admitted", r)
				}
			})
		}
	})
}

// The sliding window takes a refund off the current window only: units counted in the
// previous window keep weighing until it slides out.
func TestRefundSlidingWindowKeepsThePreviousWindow(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		const limit, window = 10, 2000
		args := windowArgs(window)
		for attempt := 1; attempt <= 5; attempt++ {
			key := keyFor(t)
			atWindowStart(t, tg.c, window)
			start := serverNow(t, tg.c) / 1000
			start -= start % window
			fcall(t, tg.c, "rl_sliding_window", key, args(limit, 4)...)
			atWindowStart(t, tg.c, window)
			fcall(t, tg.c, "rl_sliding_window", key, args(limit, 2)...)
			r, sent, received := timed(func() reply {
				return fcall(t, tg.c, "rl_sliding_window_refund", key, args(limit, 5)...)
			})
			state := stateDoubles(t, tg.c, key)
			if serverNow(t, tg.c)/1000 >= start+2*window {
				t.Logf("attempt %d: the calls spread over more than a window; again", attempt)
				continue
			}
			if len(state) != 3 || state[0] != float64(start+window) || state[1] != 4 || state[2] != 0 {
				t.Fatalf("state after refunding 5 of 2 in this window: %v, want {%d 4 0}", state, start+window)
			}
			// 4 units weigh (window - elapsed) / window: 6 to 9 left, the key kept until they stop
			if !r.Allowed || r.Remaining < 6 || r.Remaining > 9 || r.RetryAfter != 0 || r.ResetAfter <= 0 || r.ResetAfter > window {
				t.Fatalf("refund: %v, want remaining 6..9 and a reset within the window", r)
			}
			checkTTL(t, tg.c, key, r, sent, received)
			return
		}
		t.Fatal("5 attempts, none within one window: the machine is too loaded")
	})
}

// stateDoubles reads a string state as the little-endian doubles it packs.
func stateDoubles(t testing.TB, c valkey.Client, key string) []float64 {
	t.Helper()
	s, err := do(t, c, c.B().Get().Key(key).Build()).ToString()
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	out := make([]float64, len(s)/8)
	for i := range out {
		out[i] = math.Float64frombits(binary.LittleEndian.Uint64([]byte(s[8*i : 8*i+8])))
	}
	return out
}

// The sliding log gives back its newest entries, the most recent admissions, and expires
// with the newest entry left.
func TestRefundSlidingLogRemovesTheNewest(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		key := keyFor(t)
		const limit = 10
		args := windowArgs(60_000)
		fcall(t, tg.c, "rl_sliding_log", key, args(limit, 3)...)
		time.Sleep(20 * time.Millisecond)
		fcall(t, tg.c, "rl_sliding_log", key, args(limit, 3)...)
		scores := zscores(t, tg.c, key)
		if len(scores) != 6 || scores[0] != scores[2] || scores[3] != scores[5] || scores[2] >= scores[3] {
			t.Fatalf("log %v, want 3 entries then 3 later ones", scores)
		}
		r, sent, received := timed(func() reply { return fcall(t, tg.c, "rl_sliding_log_refund", key, args(limit, 4)...) })
		if !r.Allowed || r.Remaining != 8 || r.RetryAfter != 0 || r.Delay != 0 {
			t.Fatalf("refund 4 of 6: %v, want remaining 8", r)
		}
		if got := zscores(t, tg.c, key); len(got) != 2 || got[0] != scores[0] || got[1] != scores[0] {
			t.Fatalf("log after refunding 4: %v, want 2 of the oldest entries %d", got, scores[0])
		}
		checkTTL(t, tg.c, key, r, sent, received)
		// the key expires when the newest entry left leaves the window, to the millisecond
		if exp, want := snap(t, tg.c, key).expiry, ceilDiv(scores[0]+60_000_000, 1000); exp != want {
			t.Fatalf("the key expires at %d, want %d (the oldest entries' end)", exp, want)
		}
	})
}

// A shaping leaky bucket's refund lowers the queue: later callers wait less.
func TestRefundShortensShapeDelays(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		key := keyFor(t)
		const limit = 10
		args := bucketArgs(1, 600_000, "shape") // one unit leaks every 600s
		start := time.Now()
		fcall(t, tg.c, "rl_leaky_bucket", key, args(limit, 1)...)
		if r := fcall(t, tg.c, "rl_leaky_bucket", key, args(limit, 1)...); !r.Allowed || r.Delay < 590_000 || r.Delay > 600_000 {
			t.Fatalf("the second call: %v, want a delay of about 600s", r)
		}
		if r := fcall(t, tg.c, "rl_leaky_bucket_refund", key, args(limit, 1)...); !r.Allowed || r.Remaining != 9 || r.Delay != 0 {
			t.Fatalf("refund 1 of 2: %v, want remaining 9", r)
		}
		r := fcall(t, tg.c, "rl_leaky_bucket", key, args(limit, 1)...)
		elapsed := time.Since(start).Milliseconds()
		if !r.Allowed || r.Delay > 600_000 || r.Delay < 600_000-elapsed-1 {
			t.Fatalf("after the refund: %v, want one unit ahead (600s less %dms), not two", r, elapsed)
		}
	})
}
