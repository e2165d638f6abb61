package integration_test

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

func leaseArgs(limit, leaseMs int64, id string, reserve ...int64) []string {
	args := append(itoa(limit, leaseMs), id)
	return append(args, itoa(reserve...)...)
}

// leases reads a concurrency key: each member's score (ms), the marker ” included.
func leases(t testing.TB, c valkey.Client, key string) map[string]int64 {
	t.Helper()
	vals, err := do(t, c, c.B().Zrange().Key(key).Min("0").Max("-1").Withscores().Build()).AsZScores()
	if err != nil {
		t.Fatalf("ZRANGE %s: %v", key, err)
	}
	out := map[string]int64{}
	for _, v := range vals {
		out[v.Member] = int64(v.Score)
	}
	return out
}

// lastLease is the expiry of the lease that ends last.
func lastLease(ls map[string]int64) int64 {
	var last int64
	for _, e := range ls {
		last = max(last, e)
	}
	return last
}

// checkLeaseKey holds a concurrency key to its contract: the marker, and an expiry at the
// last lease's, which the reply's reset_after_ms names.
func checkLeaseKey(t testing.TB, c valkey.Client, key string, r reply, sent, received time.Time) {
	t.Helper()
	ls := leases(t, c, key)
	if m, ok := ls[""]; !ok || m != 0 {
		t.Fatalf("%s holds %v: no marker '' scored 0", key, ls)
	}
	if exp := snap(t, c, key).expiry; exp != lastLease(ls) {
		t.Fatalf("%s expires at %d, its last lease at %d", key, exp, lastLease(ls))
	}
	checkTTL(t, c, key, r, sent, received)
	// a lease ends up to 1 ms early, never late
	within(t, "reset_after", r.ResetAfter, lastLease(ls)-received.UnixMilli()-1, lastLease(ls)-sent.UnixMilli()+1)
}

func TestConcurrencyLeases(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		key := keyFor(t)
		const limit, lease = 3, 60_000
		acquire := func(id string, reserve ...int64) (reply, time.Time, time.Time) {
			return timed(func() reply { return fcall(t, tg.c, "rl_concurrency", key, leaseArgs(limit, lease, id, reserve...)...) })
		}
		release := func(id string) reply {
			r := fcall(t, tg.c, "rl_concurrency_release", key, leaseArgs(limit, lease, id)...)
			if r.Limit != limit || r.RetryAfter != 0 || r.Delay != 0 {
				t.Fatalf("release %s: %v, want retry 0 and delay 0", id, r)
			}
			return r
		}

		// a peek on a fresh key writes nothing
		if p := fcallRO(t, tg.c, "rl_concurrency_peek", key, leaseArgs(limit, lease, "a")...); !p.Allowed || p.Remaining != limit || p.ResetAfter != 0 {
			t.Fatalf("peek on a fresh key: %v", p)
		}
		if snap(t, tg.c, key).exists {
			t.Fatal("a peek created the key")
		}
		for i, id := range []string{"a", "b", "c"} {
			r, sent, received := acquire(id)
			if !r.Allowed || r.Remaining != limit-int64(i)-1 || r.RetryAfter != 0 || r.Delay != 0 {
				t.Fatalf("acquire %s: %v, want admitted with remaining %d", id, r, limit-i-1)
			}
			checkLeaseKey(t, tg.c, key, r, sent, received)
			time.Sleep(5 * time.Millisecond) // leases that end one after the other
		}
		before := snap(t, tg.c, key)
		held := leases(t, tg.c, key)
		// a new holder waits for the earliest lease (a's) to expire
		for _, ro := range []bool{true, false} {
			fn := "rl_concurrency"
			if ro {
				fn += "_peek"
			}
			before := serverNow(t, tg.c) / 1000
			r, err := tryCall(tg.c, ro, fn, key, leaseArgs(limit, lease, "d")...)
			after := serverNow(t, tg.c) / 1000
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed || r.Remaining != 0 || r.Delay != 0 {
				t.Fatalf("%s by a fourth holder: %v, want denied", fn, r)
			}
			within(t, fn+" retry_after", r.RetryAfter, held["a"]-after, held["a"]-before)
			within(t, fn+" reset_after", r.ResetAfter, held["c"]-after, held["c"]-before)
		}
		if p := fcallRO(t, tg.c, "rl_concurrency_peek", key, leaseArgs(limit, lease, "a", limit)...); !p.Allowed || p.Remaining != 0 {
			t.Fatalf("peek by a holder with reserve = limit: %v, want admitted", p)
		}
		if snap(t, tg.c, key) != before {
			t.Fatal("a denied acquire or a peek changed the state")
		}

		// a holder renews, reserve or not, and takes no second slot
		time.Sleep(5 * time.Millisecond)
		r, sent, received := acquire("a", limit)
		if !r.Allowed || r.Remaining != 0 || r.RetryAfter != 0 {
			t.Fatalf("renewal with reserve = limit: %v, want admitted", r)
		}
		checkLeaseKey(t, tg.c, key, r, sent, received)
		renewed := leases(t, tg.c, key)
		if len(renewed) != 4 || renewed["a"] <= held["a"] || renewed["b"] != held["b"] {
			t.Fatalf("after a's renewal: %v, was %v", renewed, held)
		}
		if lastLease(renewed) != renewed["a"] {
			t.Fatalf("a's renewed lease is not the last: %v", renewed)
		}

		// release: 1 for a held slot, 0 for one already released or unknown
		if r := release("b"); !r.Allowed || r.Remaining != 1 {
			t.Fatalf("release b: %v, want 1 with 1 free slot", r)
		}
		if r := release("b"); r.Allowed || r.Remaining != 1 {
			t.Fatalf("release b again: %v, want 0 with 1 free slot", r)
		}
		if r := release("nobody"); r.Allowed || r.Remaining != 1 {
			t.Fatalf("release of an unknown id: %v, want 0", r)
		}
		// with 1 free slot, reserve 1 keeps it from new holders
		if r, _, _ := acquire("d", 1); r.Allowed || r.Remaining != 0 || r.RetryAfter <= 0 {
			t.Fatalf("a new holder with reserve 1 and 1 free slot: %v, want denied", r)
		}
		if r, _, _ := acquire("d"); !r.Allowed || r.Remaining != 0 {
			t.Fatalf("a new holder without reserve: %v, want the free slot", r)
		}
		if r, _, _ := acquire("e", limit); r.Allowed || r.RetryAfter != -1 {
			t.Fatalf("a new holder with reserve = limit: %v, want denied with retry -1", r)
		}
		for i, id := range []string{"a", "c", "d"} {
			before := serverNow(t, tg.c) / 1000
			r := release(id)
			after := serverNow(t, tg.c) / 1000
			if !r.Allowed || r.Remaining != int64(i)+1 {
				t.Fatalf("release %s: %v, want 1 with %d free", id, r, i+1)
			}
			if id == "d" {
				if r.ResetAfter != 0 || snap(t, tg.c, key).exists {
					t.Fatalf("the last release: %v, key exists %v: want it deleted", r, snap(t, tg.c, key).exists)
				}
			} else {
				// a's renewed lease was the last: releasing it makes another the last
				ls := leases(t, tg.c, key)
				within(t, "reset_after after releasing "+id, r.ResetAfter, lastLease(ls)-after, lastLease(ls)-before)
				if exp := snap(t, tg.c, key).expiry; exp != lastLease(ls) {
					t.Fatalf("after releasing %s the key expires at %d, its last lease at %d", id, exp, lastLease(ls))
				}
			}
		}
		if r := release("a"); r != (reply{Limit: limit, Remaining: limit}) {
			t.Fatalf("release on an absent key: %v", r)
		}
		if snap(t, tg.c, key).exists {
			t.Fatal("a release on an absent key wrote it")
		}
	})
}

// A lease expires on its own: its slot frees, its holder's release answers 0, and the key
// goes with its last lease; a call that finds only expired leases deletes the key.
func TestConcurrencyLeaseExpiry(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		const limit = 2
		for attempt := 1; ; attempt++ {
			if leaseExpiryAttempt(t, tg, limit) {
				return
			}
			if attempt == 5 {
				t.Fatal("5 attempts, none with its calls on time: the machine is too loaded to test timing")
			}
			t.Logf("attempt %d: a call meant for before a lease's end ran after it; again", attempt)
		}
	})
}

func leaseExpiryAttempt(t *testing.T, tg *target, limit int64) (conclusive bool) {
	key := keyFor(t)
	start := time.Now()
	a := fcall(t, tg.c, "rl_concurrency", key, leaseArgs(limit, 200, "a")...)
	b := fcall(t, tg.c, "rl_concurrency", key, leaseArgs(limit, 400, "b")...)
	c := fcall(t, tg.c, "rl_concurrency", key, leaseArgs(limit, 200, "c")...)
	cReceived := time.Now()
	if time.Since(start) > 150*time.Millisecond {
		return false
	}
	if !a.Allowed || !b.Allowed || c.Allowed || c.RetryAfter > 200 || c.RetryAfter < 200-time.Since(start).Milliseconds()-1 {
		t.Fatalf("a %v, b %v, c %v: want a and b admitted, c denied until a's lease ends", a, b, c)
	}
	// the server counted retry_after from before cReceived
	time.Sleep(time.Until(cReceived.Add(time.Duration(c.RetryAfter+2) * time.Millisecond)))
	if r := fcall(t, tg.c, "rl_concurrency", key, leaseArgs(limit, 60_000, "c")...); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("after a's lease ended: %v, want c admitted", r)
	}
	if r := fcall(t, tg.c, "rl_concurrency_release", key, leaseArgs(limit, 200, "a")...); r.Allowed {
		t.Fatalf("release of an expired lease: %v, want 0", r)
	}
	if ls := leases(t, tg.c, key); len(ls) != 3 {
		t.Fatalf("leases %v: want the marker, b and c", ls)
	}
	if r := fcall(t, tg.c, "rl_concurrency_release", key, leaseArgs(limit, 200, "c")...); !r.Allowed || r.Remaining != 1 {
		t.Fatalf("release c: %v", r)
	}
	// b's lease is the last: the key expires with it
	bEnd := leases(t, tg.c, key)["b"]
	if exp := snap(t, tg.c, key).expiry; exp != bEnd {
		t.Fatalf("the key expires at %d, b's lease at %d", exp, bEnd)
	}
	time.Sleep(time.Until(time.UnixMilli(bEnd + 5)))
	if snap(t, tg.c, key).exists {
		t.Fatal("the key outlived its last lease")
	}

	// leases that ended in a key kept alive (a restored backup, a slow expiry) are dropped
	for _, fn := range []string{"rl_concurrency_peek", "rl_concurrency", "rl_concurrency_release"} {
		key := keyFor(t) + fn
		ended := float64(serverNow(t, tg.c)/1000 - 1000)
		zsetOf(0.0, "", ended, "a")(t, tg.c, key)
		if err := do(t, tg.c, tg.c.B().Pexpire().Key(key).Milliseconds(60_000).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		r := fcall(t, tg.c, fn, key, leaseArgs(limit, 60_000, "b")...)
		switch fn {
		case "rl_concurrency_peek":
			if !r.Allowed || r.Remaining != limit || r.ResetAfter != 0 {
				t.Fatalf("peek over an ended lease: %v, want a fresh limiter's answer", r)
			}
		case "rl_concurrency":
			if !r.Allowed || r.Remaining != limit-1 || leases(t, tg.c, key)["a"] != 0 {
				t.Fatalf("acquire over an ended lease: %v, leases %v: want b alone", r, leases(t, tg.c, key))
			}
			continue
		case "rl_concurrency_release":
			if r.Allowed || r.Remaining != limit || r.ResetAfter != 0 {
				t.Fatalf("release over an ended lease: %v, want 0 with every slot free", r)
			}
			if snap(t, tg.c, key).exists {
				t.Fatal("a release that found only ended leases kept the key")
			}
		}
	}
	return true
}

// 64 callers racing for 10 slots never hold more than 10.
func TestConcurrencyNoOverAdmission(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		const limit, workers = 10, 64
		t.Run("acquire", func(t *testing.T) {
			key := keyFor(t)
			var admitted atomic.Int64
			race(t, workers, func(w int) error {
				r, err := tryCall(tg.c, false, "rl_concurrency", key, leaseArgs(limit, 60_000, "w"+strconv.Itoa(w))...)
				if r.Allowed {
					admitted.Add(1)
				}
				return err
			})
			if got := admitted.Load(); got != limit {
				t.Fatalf("%d callers took %d slots of %d", workers, got, limit)
			}
			if ls := leases(t, tg.c, key); len(ls) != limit+1 {
				t.Fatalf("%d leases stored, want %d and the marker", len(ls)-1, limit)
			}
		})
		t.Run("acquire_release", func(t *testing.T) {
			key := keyFor(t)
			var inFlight, most, admitted atomic.Int64
			race(t, workers, func(w int) error {
				id := "w" + strconv.Itoa(w)
				for i := 0; i < 10; i++ {
					r, err := tryCall(tg.c, false, "rl_concurrency", key, leaseArgs(limit, 60_000, id)...)
					if err != nil || !r.Allowed {
						if err != nil {
							return err
						}
						continue
					}
					// counted after the server admitted and uncounted before it releases: never
					// more than the server holds
					n := inFlight.Add(1)
					admitted.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(time.Millisecond)
					inFlight.Add(-1)
					r, err = tryCall(tg.c, false, "rl_concurrency_release", key, leaseArgs(limit, 60_000, id)...)
					if err != nil {
						return err
					}
					if !r.Allowed {
						return fmt.Errorf("%s released a lease it held: %v", id, r)
					}
				}
				return nil
			})
			if m := most.Load(); m > limit {
				t.Fatalf("%d holders at once, limit %d", m, limit)
			}
			if admitted.Load() < limit {
				t.Fatalf("only %d admissions in %d calls", admitted.Load(), workers*10)
			}
			if snap(t, tg.c, key).exists {
				t.Fatalf("every lease released, the key remains: %v", leases(t, tg.c, key))
			}
		})
	})
}

// race runs f on n goroutines at once and fails the test with the first error.
func race(t *testing.T, n int, f func(w int) error) {
	t.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, n)
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if err := f(w); err != nil {
				errs <- err
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
