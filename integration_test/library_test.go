package integration_test

import (
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// limiter is one algorithm configured so that its limit (or capacity) is limit; slow
// configurations refill so little during a test that counts are exact.
type limiter struct {
	name     string // test name
	fn       string // function name
	windowed bool   // aligned windows: tests align to a window start
	args     func(limit, cost int64) []string
}

func windowArgs(windowMs int64) func(limit, cost int64) []string {
	return func(limit, cost int64) []string { return itoa(limit, windowMs, cost) }
}

func bucketArgs(rate, periodMs int64, mode ...string) func(limit, cost int64) []string {
	return func(limit, cost int64) []string {
		return append(itoa(limit, rate, periodMs, cost), mode...)
	}
}

// slow limiters: nothing refills or slides out within a test.
var slow = []limiter{
	{"fixed_window", "rl_fixed_window", true, windowArgs(60_000)},
	{"sliding_log", "rl_sliding_log", false, windowArgs(60_000)},
	{"sliding_window", "rl_sliding_window", true, windowArgs(60_000)},
	{"token_bucket", "rl_token_bucket", false, bucketArgs(1, 600_000)},
	{"leaky_police", "rl_leaky_bucket", false, bucketArgs(1, 600_000, "police")},
	{"leaky_shape", "rl_leaky_bucket", false, bucketArgs(1, 600_000, "shape")},
}

// fast limiters: windows and refills of a few hundred milliseconds, for timing tests.
var fast = []limiter{
	{"fixed_window", "rl_fixed_window", true, windowArgs(300)},
	{"sliding_log", "rl_sliding_log", false, windowArgs(300)},
	{"sliding_window", "rl_sliding_window", true, windowArgs(300)},
	{"token_bucket", "rl_token_bucket", false, bucketArgs(10, 1000)},
	{"leaky_police", "rl_leaky_bucket", false, bucketArgs(10, 1000, "police")},
	{"leaky_shape", "rl_leaky_bucket", false, bucketArgs(10, 1000, "shape")},
}

func TestAdmitsUpToLimit(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, l := range slow {
			t.Run(l.name, func(t *testing.T) {
				key := keyFor(t)
				if l.windowed {
					roomInWindow(t, tg.c, 60_000, time.Second)
				}
				const limit = 5
				for i := int64(1); i <= limit; i++ {
					r := fcall(t, tg.c, l.fn, key, l.args(limit, 1)...)
					if !r.Allowed || r.Limit != limit || r.Remaining != limit-i || r.RetryAfter != 0 || r.ResetAfter <= 0 {
						t.Fatalf("call %d: %v, want allowed with remaining %d", i, r, limit-i)
					}
				}
				for i := 0; i < 2; i++ {
					r := fcall(t, tg.c, l.fn, key, l.args(limit, 1)...)
					if r.Allowed || r.Remaining != 0 || r.RetryAfter <= 0 || r.ResetAfter <= 0 || r.Delay != 0 {
						t.Fatalf("call over the limit: %v, want denied with a retry", r)
					}
				}
			})
		}
	})
}

func TestCost(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, l := range slow {
			t.Run(l.name, func(t *testing.T) {
				key := keyFor(t)
				if l.windowed {
					roomInWindow(t, tg.c, 60_000, time.Second)
				}
				const limit = 10
				// cost 0 on a fresh limiter is admitted and writes nothing
				if r := fcall(t, tg.c, l.fn, key, l.args(limit, 0)...); !r.Allowed || r.Remaining != limit || r.ResetAfter != 0 {
					t.Fatalf("cost 0: %v", r)
				}
				if s := snap(t, tg.c, key); s.exists {
					t.Fatal("cost 0 created the key")
				}
				if r := fcall(t, tg.c, l.fn, key, l.args(limit, 4)...); !r.Allowed || r.Remaining != 6 {
					t.Fatalf("cost 4: %v, want remaining 6", r)
				}
				before := snap(t, tg.c, key)
				if r := fcall(t, tg.c, l.fn, key, l.args(limit, 7)...); r.Allowed || r.Remaining != 6 || r.RetryAfter <= 0 {
					t.Fatalf("cost 7 of 6 left: %v, want denied with remaining 6", r)
				}
				if r := fcall(t, tg.c, l.fn, key, l.args(limit, limit+1)...); r.Allowed || r.RetryAfter != -1 || r.Remaining != 6 {
					t.Fatalf("cost above the limit: %v, want denied with retry -1", r)
				}
				if after := snap(t, tg.c, key); after != before {
					t.Fatal("a denied call changed the state")
				}
				if r := fcall(t, tg.c, l.fn, key, l.args(limit, 6)...); !r.Allowed || r.Remaining != 0 {
					t.Fatalf("cost 6 of 6 left: %v, want admitted with remaining 0", r)
				}
			})
		}
	})
}

// exhaust calls until denied and returns the denial and the client-clock bounds of when the
// server decided it.
func exhaust(t *testing.T, c valkey.Client, l limiter, key string, limit int64) (r reply, sent, received time.Time) {
	t.Helper()
	for i := int64(0); i <= limit+1; i++ {
		sent = time.Now()
		r = fcall(t, c, l.fn, key, l.args(limit, 1)...)
		received = time.Now()
		if !r.Allowed {
			return r, sent, received
		}
	}
	t.Fatalf("%d calls were all admitted with limit %d", limit+2, limit)
	return
}

func TestRetryAfterIsExact(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, l := range fast {
			t.Run(l.name, func(t *testing.T) {
				t.Parallel()
				// A loaded machine can delay a call past the instant it was meant to test; such
				// an attempt proves nothing and is repeated on a fresh limiter.
				for attempt := 1; attempt <= 5; attempt++ {
					if retryAfterAttempt(t, tg, l) {
						return
					}
					t.Logf("attempt %d: a call meant for before retry_after ran after it; again", attempt)
				}
				t.Fatal("5 attempts, none with its calls on time: the machine is too loaded to test timing")
			})
		}
	})
}

// retryAfterAttempt exhausts a limiter, checks that a call 10ms before retry_after is denied
// and one after it admitted, and reports whether the early calls ran in time to count.
func retryAfterAttempt(t *testing.T, tg *target, l limiter) (conclusive bool) {
	t.Helper()
	key := keyFor(t)
	const limit = 3
	if l.windowed {
		atWindowStart(t, tg.c, 300)
	}
	if l.fn == "rl_sliding_log" {
		// spread the log so that entries leave one by one
		fcall(t, tg.c, l.fn, key, l.args(limit, 1)...)
		time.Sleep(100 * time.Millisecond)
	}
	denied, sent, received := exhaust(t, tg.c, l, key, limit)
	retry := time.Duration(denied.RetryAfter) * time.Millisecond
	if retry < 20*time.Millisecond {
		t.Fatalf("retry_after %v too short to test: %v", retry, denied)
	}
	// The server decided at or after sent: until sent+retry it must deny. A call that
	// returned before that deadline certainly ran before it.
	deadline := sent.Add(retry)
	time.Sleep(time.Until(deadline.Add(-10 * time.Millisecond)))
	p := fcallRO(t, tg.c, l.fn+"_peek", key, l.args(limit, 1)...)
	r := fcall(t, tg.c, l.fn, key, l.args(limit, 1)...)
	if !time.Now().Before(deadline) {
		return false
	}
	if p.Allowed || r.Allowed {
		t.Fatalf("admitted 10ms before retry_after %v: peek %v, call %v", retry, p, r)
	}
	// The server decided the denial by received: from received+retry it must admit.
	time.Sleep(time.Until(received.Add(retry)))
	if r := fcall(t, tg.c, l.fn, key, l.args(limit, 1)...); !r.Allowed {
		t.Fatalf("denied after waiting retry_after %v: %v", retry, r)
	}
	return true
}

func TestResetAfterMatchesTTL(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, l := range fast {
			t.Run(l.name, func(t *testing.T) {
				t.Parallel()
				key := keyFor(t)
				const limit = 3
				fcall(t, tg.c, l.fn, key, l.args(limit, 1)...)
				sent := time.Now()
				r := fcall(t, tg.c, l.fn, key, l.args(limit, 1)...)
				received := time.Now()
				if r.ResetAfter <= 0 {
					t.Fatalf("reset_after %d after two admitted calls", r.ResetAfter)
				}
				// The server decided at some instant between sent and received (one clock on
				// this host): the key must expire no earlier than that instant plus
				// reset_after, and at most the millisecond PXAT rounds up later.
				exp := snap(t, tg.c, key).expiry
				if lo := sent.UnixMilli() + r.ResetAfter; exp < lo {
					t.Fatalf("the key expires at %d, before the call's earliest time + reset_after %d", exp, lo)
				}
				if hi := received.UnixMilli() + r.ResetAfter + 2; exp > hi {
					t.Fatalf("the key expires at %d, after the call's latest time + reset_after + 1ms %d", exp, hi)
				}
				reset := time.Duration(r.ResetAfter) * time.Millisecond
				if reset > 20*time.Millisecond {
					deadline := sent.Add(reset)
					time.Sleep(time.Until(deadline.Add(-15 * time.Millisecond)))
					if s := snap(t, tg.c, key); !s.exists && time.Now().Before(deadline) {
						t.Fatalf("the key expired before reset_after %v", reset)
					}
				}
				time.Sleep(time.Until(received.Add(reset + 2*time.Millisecond)))
				if s := snap(t, tg.c, key); s.exists {
					t.Fatalf("the key outlived reset_after %v", reset)
				}
				p := fcallRO(t, tg.c, l.fn+"_peek", key, l.args(limit, limit)...)
				if !p.Allowed || p.Remaining != limit || p.ResetAfter != 0 {
					t.Fatalf("after reset_after the limiter is not back to its initial state: %v", p)
				}
			})
		}
	})
}

// The fixed window admits up to twice its limit across a window boundary: that is the
// algorithm, not a bug, and this test documents it.
func TestFixedWindowBoundaryBurst(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		// A loaded machine can stretch the calls over more than a window; such an attempt
		// proves nothing and is repeated on a fresh key.
		for attempt := 1; attempt <= 5; attempt++ {
			if boundaryBurstAttempt(t, tg) {
				return
			}
			t.Logf("attempt %d: the calls spread over more than a window; again", attempt)
		}
		t.Fatal("5 attempts, none within one window: the machine is too loaded to test timing")
	})
}

func boundaryBurstAttempt(t *testing.T, tg *target) (conclusive bool) {
	t.Helper()
	key := keyFor(t)
	const limit, window = 5, 500
	nowMs := serverNow(t, tg.c) / 1000
	// the last 40ms of a window
	wait := window - nowMs%window - 40
	if wait < 0 {
		wait += window
	}
	time.Sleep(time.Duration(wait) * time.Millisecond)
	start := time.Now()
	admitted := 0
	for i := 0; i < limit+1; i++ {
		if fcall(t, tg.c, "rl_fixed_window", key, itoa(limit, window, 1)...).Allowed {
			admitted++
		}
	}
	// The count belongs to its window, whatever the key's expiry: a state that outlives
	// its window (a slow expiry, a restored backup) must not carry over.
	if err := do(t, tg.c, tg.c.B().Pexpire().Key(key).Milliseconds(60_000).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	atWindowStart(t, tg.c, window)
	for i := 0; i < limit+1; i++ {
		if fcall(t, tg.c, "rl_fixed_window", key, itoa(limit, window, 1)...).Allowed {
			admitted++
		}
	}
	if time.Since(start) > window*time.Millisecond {
		return false
	}
	if admitted != 2*limit {
		t.Fatalf("admitted %d within one window, want the documented boundary burst of %d", admitted, 2*limit)
	}
	return true
}

// The sliding log never admits more than limit units in any window_ms span, whatever the
// timing of the calls: each admission's server time, as the log stores it, proves it.
func TestSlidingLogIsExact(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		key := keyFor(t)
		const limit, window = 4, 200
		var admitted []int64 // server microseconds
		deadline := time.Now().Add(time.Second)
		for i := 0; time.Now().Before(deadline); i++ {
			if fcall(t, tg.c, "rl_sliding_log", key, itoa(limit, window, 1)...).Allowed {
				s := zscores(t, tg.c, key)
				admitted = append(admitted, s[len(s)-1])
			}
			time.Sleep(time.Duration(i%7) * time.Millisecond)
		}
		for i, at := range admitted {
			n := 0
			for _, before := range admitted[:i+1] {
				if before > at-window*1000 {
					n++
				}
			}
			if n > limit {
				t.Fatalf("%d units admitted in the %dms before %d", n, window, at)
			}
		}
		// a second of calls with a 200ms window: close to 5 windows' worth, not fewer
		if len(admitted) < 4*limit {
			t.Fatalf("only %d calls admitted in a second: the log does not slide", len(admitted))
		}
	})
}

func zscores(t testing.TB, c valkey.Client, key string) []int64 {
	t.Helper()
	vals, err := do(t, c, c.B().Zrange().Key(key).Min("0").Max("-1").Withscores().Build()).AsZScores()
	if err != nil {
		t.Fatalf("ZRANGE %s: %v", key, err)
	}
	out := make([]int64, len(vals))
	for i, v := range vals {
		out[i] = int64(v.Score)
	}
	return out
}

func TestShapeDelaysAreSpacedByTheLeakInterval(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		key := keyFor(t)
		// 10 per second: one unit leaks every 100ms
		args := itoa(5, 10, 1000, 1)
		args = append(args, "shape")
		start := time.Now()
		for i := int64(0); i < 5; i++ {
			r := fcall(t, tg.c, "rl_leaky_bucket", key, args...)
			elapsed := time.Since(start).Milliseconds()
			want := i * 100
			if !r.Allowed || r.Delay > want || r.Delay < want-elapsed-1 {
				t.Fatalf("call %d after %dms: %v, want admitted with delay %dms", i, elapsed, r, want)
			}
		}
		sent := time.Now()
		r := fcall(t, tg.c, "rl_leaky_bucket", key, args...)
		if r.Allowed || r.RetryAfter > 100 || r.RetryAfter < 100-time.Since(start).Milliseconds()-1 {
			t.Fatalf("a full queue: %v, want denied with retry_after about 100ms", r)
		}
		received := time.Now()
		wait := time.Duration(r.RetryAfter) * time.Millisecond
		time.Sleep(time.Until(received.Add(wait)))
		// At retry_after four units are queued ahead: 400ms, less however late this call is.
		// The server counted retry_after from a moment between sent and received, so by its
		// clock this call is at most time.Since(sent + retry_after) late.
		r = fcall(t, tg.c, "rl_leaky_bucket", key, args...)
		if late := time.Since(sent.Add(wait)).Milliseconds(); !r.Allowed || r.Delay > 400 || r.Delay < 400-late-1 {
			t.Fatalf("after retry_after: %v, want admitted at the back of the queue, delay 400ms less %dms late", r, late)
		}
		// police mode admits the same calls without a delay
		pkey := keyFor(t) + ":police"
		pargs := append(itoa(5, 10, 1000, 1), "police")
		for i := 0; i < 5; i++ {
			if r := fcall(t, tg.c, "rl_leaky_bucket", pkey, pargs...); !r.Allowed || r.Delay != 0 {
				t.Fatalf("police call %d: %v", i, r)
			}
		}
		if r := fcall(t, tg.c, "rl_leaky_bucket", pkey, pargs...); r.Allowed {
			t.Fatalf("police overflow admitted: %v", r)
		}
	})
}

func TestPeekChangesNothing(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, l := range slow {
			t.Run(l.name, func(t *testing.T) {
				key := keyFor(t)
				if l.windowed {
					roomInWindow(t, tg.c, 60_000, time.Second)
				}
				const limit = 5
				if p := fcallRO(t, tg.c, l.fn+"_peek", key, l.args(limit, 1)...); !p.Allowed || p.Remaining != limit || p.ResetAfter != 0 {
					t.Fatalf("peek on a fresh limiter: %v", p)
				}
				if snap(t, tg.c, key).exists {
					t.Fatal("a peek created the key")
				}
				first := fcall(t, tg.c, l.fn, key, l.args(limit, 2)...)
				before := snap(t, tg.c, key)
				for _, cost := range []int64{0, 1, 3, 4, limit + 1} {
					p := fcallRO(t, tg.c, l.fn+"_peek", key, l.args(limit, cost)...)
					if p.Remaining != first.Remaining || p.Allowed != (cost <= 3) {
						t.Fatalf("peek cost %d: %v after %v", cost, p, first)
					}
					// peeks may also be called with FCALL
					fcall(t, tg.c, l.fn+"_peek", key, l.args(limit, cost)...)
				}
				if after := snap(t, tg.c, key); after != before {
					t.Fatal("peeks changed the state")
				}
				if r := fcall(t, tg.c, l.fn, key, l.args(limit, 3)...); !r.Allowed || r.Remaining != 0 {
					t.Fatalf("after peeks: %v, want the 3 left admitted", r)
				}
			})
		}
	})
}

func TestPeekRunsOnAReplica(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, l := range slow {
			t.Run(l.name, func(t *testing.T) {
				key := keyFor(t)
				if l.windowed {
					roomInWindow(t, tg.c, 60_000, 2*time.Second)
				}
				const limit = 5
				first := fcall(t, tg.c, l.fn, key, l.args(limit, 2)...)
				rep := tg.replicaFor(t, key)
				waitReplicated(t, rep, key)
				p, err := rep.peek(l.fn+"_peek", key, l.args(limit, 1)...)
				if err != nil {
					t.Fatalf("FCALL_RO on the replica %s: %v", rep.addr, err)
				}
				if !p.Allowed || p.Remaining != first.Remaining {
					t.Fatalf("replica peek %v after %v", p, first)
				}
				if _, err := rep.peek(l.fn, key, l.args(limit, 1)...); err == nil {
					t.Fatal("FCALL_RO of a writing limiter was accepted")
				}
				if _, err := rep.call(l.fn, key, l.args(limit, 1)...); err == nil {
					t.Fatal("a replica accepted a writing limiter")
				}
			})
		}
	})
}

func TestVersionAndFlags(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		v, err := do(t, tg.c, tg.c.B().FcallRo().Function("rl_version").Numkeys(0).Build()).ToString()
		if err != nil || v != workingVersion(t) {
			t.Fatalf("rl_version = %q, %v; want %s", v, err, workingVersion(t))
		}
		flags := functionFlags(t, tg.c)
		want := map[string][]string{
			"rl_version":             {"allow-stale", "no-writes"},
			"rl_multi":               nil,
			"rl_multi_peek":          {"no-writes"},
			"rl_concurrency":         nil,
			"rl_concurrency_peek":    {"no-writes"},
			"rl_concurrency_release": nil,
		}
		for _, l := range slow {
			want[l.fn] = nil
			want[l.fn+"_peek"] = []string{"no-writes"}
			want[l.fn+"_refund"] = nil
		}
		for fn, w := range want {
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
		// 1.2.0's and 1.3.0's functions: library12_state_test.go, library13_test.go
		if len(flags) != len(want)+len(flags12)+len(flags13) {
			t.Errorf("registered %d functions, want %d", len(flags), len(want)+len(flags12)+len(flags13))
		}
	})
}

// Many clients on one key never get more than the limit between them.
func TestNoOverAdmissionUnderConcurrency(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, l := range slow {
			t.Run(l.name, func(t *testing.T) {
				key := keyFor(t)
				if l.windowed {
					roomInWindow(t, tg.c, 60_000, 10*time.Second)
				}
				const limit, workers, each = 300, 64, 10
				var admitted atomic.Int64
				var wg sync.WaitGroup
				errs := make(chan error, workers)
				for w := 0; w < workers; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := 0; i < each; i++ {
							r, err := tryCall(tg.c, false, l.fn, key, l.args(limit, 1)...)
							if err != nil {
								errs <- err
								return
							}
							if r.Allowed {
								admitted.Add(1)
							}
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
				if got := admitted.Load(); got != limit {
					t.Fatalf("%d goroutines admitted %d, limit %d", workers, got, limit)
				}
			})
		}
	})
}
