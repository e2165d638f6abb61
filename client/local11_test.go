package client

import (
	"fmt"
	"testing"
	"time"
)

// Local limiters keep the reserve from non-critical calls, refund as the library does, and
// hold leases as a semaphore of the local share.
func TestLocal11(t *testing.T) {
	type step struct {
		op      string // allow, critical, refund
		cost    int64
		allowed bool
		remain  int64
	}
	tests := []struct {
		name  string
		limit Limit
		steps []step
	}{
		{"fixed window", FixedWindow{Limit: 5, Window: time.Hour, Reserve: 2}, []step{
			{"allow", 3, true, 0}, {"allow", 1, false, 0}, {"critical", 2, true, 0}, {"critical", 1, false, 0},
			// a refund's Remaining has no reserve: a refund takes none
			{"refund", 4, true, 4}, {"allow", 2, true, 0}, {"allow", 1, false, 0}, {"critical", 1, true, 1},
		}},
		{"sliding window", SlidingWindow{Limit: 5, Window: time.Hour, Reserve: 2}, []step{
			{"allow", 3, true, 0}, {"allow", 1, false, 0}, {"critical", 2, true, 0}, {"refund", 9, true, 5},
		}},
		{"sliding log", SlidingLog{Limit: 5, Window: time.Hour, Reserve: 2}, []step{
			{"allow", 3, true, 0}, {"allow", 1, false, 0}, {"critical", 2, true, 0}, {"refund", 1, true, 1}, {"refund", 9, true, 5},
		}},
		{"token bucket", TokenBucket{Capacity: 5, Rate: 1, Period: time.Hour, Reserve: 2}, []step{
			{"allow", 3, true, 0}, {"allow", 1, false, 0}, {"critical", 2, true, 0}, {"refund", 2, true, 2}, {"refund", 9, true, 5},
		}},
		{"leaky bucket", LeakyBucket{Capacity: 5, Rate: 1, Period: time.Hour, Reserve: 5}, []step{
			// a reserve of the whole capacity refuses every cost from 1 up
			{"allow", 0, true, 0}, {"allow", 1, false, 0}, {"critical", 5, true, 0}, {"refund", 5, true, 5},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newLocalStore(10)
			for i, st := range tt.steps {
				c := callOf(tt.limit, st.cost)
				var got Result
				switch st.op {
				case "allow":
					c.reserve = c.params.reserve
					got = s.decide([]byte("k"), c, 1, epoch, true)
				case "critical":
					got = s.decide([]byte("k"), c, 1, epoch, true)
				case "refund":
					got = s.refund([]byte("k"), c, 1, epoch)
				}
				if got.Allowed != st.allowed || got.Remaining != st.remain {
					t.Fatalf("step %d (%s %d): %+v; want allowed %v, remaining %d", i, st.op, st.cost, got, st.allowed, st.remain)
				}
			}
		})
	}
}

func TestLocalConcurrency(t *testing.T) {
	s := newLocalStore(10)
	c := Concurrency{Limit: 8, Lease: time.Second, Reserve: 1}
	acquire := func(id string, critical bool, at time.Duration) Result {
		cl := call{spec: c.spec(id), cost: 1}
		if !critical {
			cl.reserve = 1
		}
		return s.decide([]byte("k"), cl, 2, epoch+int64(at), true) // a share of 4, a reserve of 1
	}
	for i, id := range []string{"a", "b", "c"} {
		if r := acquire(id, false, 0); !r.Allowed || r.Limit != 4 || r.Remaining != 2-int64(i) {
			t.Fatalf("%s: %+v", id, r)
		}
	}
	if r := acquire("d", false, 0); r.Allowed || r.RetryAfter != time.Second {
		t.Fatalf("d without the reserve: %+v", r)
	}
	if r := acquire("a", false, 500*time.Millisecond); !r.Allowed {
		t.Fatalf("a renewal is always admitted: %+v", r)
	}
	if r := acquire("d", true, 500*time.Millisecond); !r.Allowed {
		t.Fatalf("d, critical: %+v", r)
	}
	if r := s.refund([]byte("k"), call{spec: c.spec("b")}, 2, epoch+int64(600*time.Millisecond)); !r.Allowed || r.Remaining != 1 {
		t.Fatalf("release b: %+v", r)
	}
	if r := s.refund([]byte("k"), call{spec: c.spec("b")}, 2, epoch+int64(600*time.Millisecond)); r.Allowed {
		t.Fatalf("b released twice: %+v", r)
	}
	// c expired at 1s; a (renewed) holds until 1.5s
	if r := acquire("e", false, 1100*time.Millisecond); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("e after c expired: %+v", r)
	}
}

// A denied local acquire finds its wait in the time of a sort: it holds its shard's mutex,
// and with every slot of a large share taken, every call is denied (an O(n²) sort of 70000
// leases took seconds).
func TestLocalConcurrencyDeniedQuickly(t *testing.T) {
	const n = 70000
	st := &localState{leases: make(map[string]int64, n), expires: epoch + int64(time.Hour)}
	for i := range n {
		st.leases[fmt.Sprint(i)] = epoch + int64(time.Second) + int64(n-i)
	}
	p := Concurrency{Limit: n, Lease: time.Second}.spec("new").params
	start := time.Now()
	r := localConcurrency{}.decide(st, p, 1, 0, 1, epoch, true)
	if took := time.Since(start); took > time.Second {
		t.Errorf("a denial took %s", took)
	}
	if r.Allowed || r.RetryAfter != time.Second+1 {
		t.Errorf("%+v, want denied until the first lease ends", r)
	}
}

func TestBinding(t *testing.T) {
	ok := func(rem int64, reset, delay time.Duration) Result {
		return Result{Allowed: true, Remaining: rem, ResetAfter: reset, Delay: delay}
	}
	no := func(retry time.Duration) Result { return Result{RetryAfter: retry, ResetAfter: time.Second, Delay: 0} }
	tests := []struct {
		give  []Result
		want  int
		reset time.Duration
		delay time.Duration
	}{
		{[]Result{ok(5, time.Second, 0), ok(2, time.Minute, time.Millisecond), ok(2, 0, 0)}, 1, time.Minute, time.Millisecond},
		{[]Result{ok(5, 0, time.Second), no(time.Second), no(time.Minute), no(time.Minute)}, 2, time.Second, 0},
		{[]Result{no(time.Hour), no(Never), ok(0, 0, 0)}, 1, time.Second, 0},
	}
	for i, tt := range tests {
		r, b := binding(tt.give)
		if b != tt.want || r.ResetAfter != tt.reset || r.Delay != tt.delay || r.Allowed != tt.give[tt.want].Allowed {
			t.Errorf("case %d: %+v at %d; want %d, reset %s, delay %s", i, r, b, tt.want, tt.reset, tt.delay)
		}
	}
}
