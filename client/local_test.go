package client

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

// lstep is one call on a local limiter: at a time since an aligned epoch, of cost, and what it
// decides.
type lstep struct {
	at   time.Duration
	cost int64
	peek bool
	want Result
}

// epoch is a time aligned to every window the tests use.
const epoch = int64(1_700_000_000_000) * int64(time.Millisecond)

// Each local limiter admits exactly its share, denies with the server's RetryAfter, and
// refills or rolls its windows with the clock.
func TestLocalLimiters(t *testing.T) {
	tests := []struct {
		name      string
		limit     Limit
		instances int64
		steps     []lstep
	}{
		{
			name: "fixed window: limit 10 over 4 instances admits 2", limit: FixedWindow{Limit: 10, Window: time.Second}, instances: 4,
			steps: []lstep{
				{at: 0, cost: 1, want: Result{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: time.Second}},
				{at: 100 * time.Millisecond, cost: 1, want: Result{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 900 * time.Millisecond}},
				{at: 200 * time.Millisecond, cost: 1, want: Result{Limit: 2, RetryAfter: 800 * time.Millisecond, ResetAfter: 800 * time.Millisecond}},
				{at: 200 * time.Millisecond, cost: 1, peek: true, want: Result{Limit: 2, RetryAfter: 800 * time.Millisecond, ResetAfter: 800 * time.Millisecond}},
				{at: 200 * time.Millisecond, cost: 3, want: Result{Limit: 2, RetryAfter: Never, ResetAfter: 800 * time.Millisecond}},
				// the next window starts empty
				{at: time.Second, cost: 1, peek: true, want: Result{Allowed: true, Limit: 2, Remaining: 2}},
				{at: time.Second, cost: 2, want: Result{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: time.Second}},
			},
		},
		{
			name: "fixed window: the share is at least 1", limit: FixedWindow{Limit: 3, Window: time.Second}, instances: 10,
			steps: []lstep{
				{at: 0, cost: 1, want: Result{Allowed: true, Limit: 1, Remaining: 0, ResetAfter: time.Second}},
				{at: 0, cost: 1, want: Result{Limit: 1, RetryAfter: time.Second, ResetAfter: time.Second}},
			},
		},
		{
			name: "sliding window: the previous window weighs less as it slides", limit: SlidingWindow{Limit: 8, Window: time.Second}, instances: 2,
			steps: []lstep{
				{at: 0, cost: 4, want: Result{Allowed: true, Limit: 4, Remaining: 0, ResetAfter: 2 * time.Second}},
				// the current 4 weigh fully until the next window, then 3/4 at 250ms into it
				{at: 500 * time.Millisecond, cost: 1, want: Result{Limit: 4, RetryAfter: 750 * time.Millisecond, ResetAfter: 1500 * time.Millisecond}},
				{at: 1250 * time.Millisecond, cost: 1, want: Result{Allowed: true, Limit: 4, Remaining: 0, ResetAfter: 1750 * time.Millisecond}},
				// 3 + 1 > 4 until the previous 4 weigh 2, at 500ms
				{at: 1250 * time.Millisecond, cost: 1, want: Result{Limit: 4, RetryAfter: 250 * time.Millisecond, ResetAfter: 1750 * time.Millisecond}},
				{at: 1500 * time.Millisecond, cost: 1, want: Result{Allowed: true, Limit: 4, Remaining: 0, ResetAfter: 1500 * time.Millisecond}},
				{at: 1500 * time.Millisecond, cost: 5, peek: true, want: Result{Limit: 4, RetryAfter: Never, ResetAfter: 1500 * time.Millisecond}},
				// two windows on, nothing counts
				{at: 3 * time.Second, cost: 4, peek: true, want: Result{Allowed: true, Limit: 4, Remaining: 4}},
			},
		},
		{
			name: "sliding log: units leave when their sixteenth of the window does", limit: SlidingLog{Limit: 4, Window: 1600 * time.Millisecond}, instances: 1,
			steps: []lstep{
				{at: 0, cost: 2, want: Result{Allowed: true, Limit: 4, Remaining: 2, ResetAfter: 1700 * time.Millisecond}},
				{at: 250 * time.Millisecond, cost: 2, want: Result{Allowed: true, Limit: 4, Remaining: 0, ResetAfter: 1650 * time.Millisecond}},
				{at: 1000 * time.Millisecond, cost: 1, want: Result{Limit: 4, RetryAfter: 700 * time.Millisecond, ResetAfter: 900 * time.Millisecond}},
				{at: 1000 * time.Millisecond, cost: 3, want: Result{Limit: 4, RetryAfter: 900 * time.Millisecond, ResetAfter: 900 * time.Millisecond}},
				{at: 1000 * time.Millisecond, cost: 5, want: Result{Limit: 4, RetryAfter: Never, ResetAfter: 900 * time.Millisecond}},
				{at: 1699 * time.Millisecond, cost: 1, peek: true, want: Result{Limit: 4, RetryAfter: time.Millisecond, ResetAfter: 201 * time.Millisecond}},
				{at: 1700 * time.Millisecond, cost: 2, want: Result{Allowed: true, Limit: 4, Remaining: 0, ResetAfter: 1700 * time.Millisecond}},
			},
		},
		{
			name: "token bucket: capacity and rate shared by 2", limit: TokenBucket{Capacity: 10, Rate: 5, Period: time.Second}, instances: 2,
			steps: []lstep{
				{at: 0, cost: 5, want: Result{Allowed: true, Limit: 5, Remaining: 0, ResetAfter: 2 * time.Second}},
				// 5 tokens per 2s: one every 400ms
				{at: 0, cost: 1, want: Result{Limit: 5, RetryAfter: 400 * time.Millisecond, ResetAfter: 2 * time.Second}},
				{at: 400 * time.Millisecond, cost: 1, want: Result{Allowed: true, Limit: 5, Remaining: 0, ResetAfter: 2 * time.Second}},
				{at: 1200 * time.Millisecond, cost: 2, peek: true, want: Result{Allowed: true, Limit: 5, Remaining: 2, ResetAfter: 1200 * time.Millisecond}},
				{at: 1200 * time.Millisecond, cost: 6, want: Result{Limit: 5, Remaining: 2, RetryAfter: Never, ResetAfter: 1200 * time.Millisecond}},
				{at: 10 * time.Second, cost: 5, peek: true, want: Result{Allowed: true, Limit: 5, Remaining: 5}},
			},
		},
		{
			name: "leaky bucket police", limit: LeakyBucket{Capacity: 2, Rate: 1, Period: time.Second}, instances: 1,
			steps: []lstep{
				{at: 0, cost: 1, want: Result{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: time.Second}},
				{at: 0, cost: 1, want: Result{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 2 * time.Second}},
				{at: 500 * time.Millisecond, cost: 1, want: Result{Limit: 2, RetryAfter: 500 * time.Millisecond, ResetAfter: 1500 * time.Millisecond}},
				{at: time.Second, cost: 1, want: Result{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 2 * time.Second}},
			},
		},
		{
			name: "leaky bucket shape spaces calls", limit: LeakyBucket{Capacity: 3, Rate: 1, Period: time.Second, Mode: Shape}, instances: 1,
			steps: []lstep{
				{at: 0, cost: 1, want: Result{Allowed: true, Limit: 3, Remaining: 2, ResetAfter: time.Second}},
				{at: 0, cost: 1, want: Result{Allowed: true, Limit: 3, Remaining: 1, ResetAfter: 2 * time.Second, Delay: time.Second}},
				{at: 0, cost: 1, peek: true, want: Result{Allowed: true, Limit: 3, Remaining: 1, ResetAfter: 2 * time.Second, Delay: 2 * time.Second}},
				{at: 0, cost: 1, want: Result{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: 3 * time.Second, Delay: 2 * time.Second}},
				{at: 0, cost: 1, want: Result{Limit: 3, RetryAfter: time.Second, ResetAfter: 3 * time.Second}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newLocalStore(10)
			c := callOf(tt.limit, 0)
			for i, st := range tt.steps {
				c.cost = st.cost
				st.want.Source = FromFallback
				got := s.decide([]byte("k"), c, tt.instances, epoch+int64(st.at), !st.peek)
				if got != st.want {
					t.Fatalf("step %d (at %s, cost %d, peek %v):\n got %+v\nwant %+v", i, st.at, st.cost, st.peek, got, st.want)
				}
			}
		})
	}
}

// A peek creates no state, and an expired state is forgotten.
func TestLocalStoreHoldsOnlyLiveState(t *testing.T) {
	s := newLocalStore(100_000)
	c := callOf(FixedWindow{Limit: 1, Window: time.Second}, 1)
	s.decide([]byte("peeked"), c, 1, epoch, false)
	if n := s.len(); n != 0 {
		t.Fatalf("a peek left %d keys", n)
	}
	for i := range 50 {
		s.decide(fmt.Appendf(nil, "k%d", i), c, 1, epoch, true)
	}
	if n := s.len(); n != 50 {
		t.Fatalf("%d keys, want 50", n)
	}
	// Two seconds on, those windows have ended: new keys land in every shard, and the first in
	// each sweeps it.
	ms := callOf(FixedWindow{Limit: 1, Window: time.Millisecond}, 1)
	for i := range 1000 {
		s.decide(fmt.Appendf(nil, "new%d", i), ms, 1, epoch+int64(2*time.Second), true)
	}
	if n := s.len(); n != 1000 {
		t.Fatalf("%d keys, want the 1000 live ones", n)
	}
	for i := range 1000 {
		s.decide(fmt.Appendf(nil, "newer%d", i), ms, 1, epoch+int64(4*time.Second), true)
	}
	if n := s.len(); n != 1000 {
		t.Fatalf("%d keys, want the 1000 live ones", n)
	}
}

// However many keys, the store holds at most its bound.
func TestLocalStoreIsBounded(t *testing.T) {
	for _, give := range []int{1, 64, 1000} {
		s := newLocalStore(give)
		c := callOf(TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour}, 1)
		for i := range 20_000 {
			s.decide(fmt.Appendf(nil, "k%d", i), c, 1, epoch+int64(i), true)
		}
		bound := localShards * ((give + localShards - 1) / localShards)
		if n := s.len(); n > bound || n < bound/2 {
			t.Errorf("LocalKeys %d: %d keys held, want at most %d (and most of them)", give, n, bound)
		}
	}
}

// A full store makes room by evicting from a sample, and sweeps only on schedule: a shard full
// of live state is not scanned on every new key (BenchmarkLocalStoreFull), and stays bounded.
func TestLocalStoreFullSweepsOnSchedule(t *testing.T) {
	const perShard = 4
	s := newLocalStore(localShards * perShard)
	live := callOf(TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour}, 1)
	for i := range 10_000 {
		s.decide(fmt.Appendf(nil, "live%d", i), live, 1, epoch, true)
	}
	// Half a second on, before any sweep is due, more new keys arrive.
	for i := range 10_000 {
		s.decide(fmt.Appendf(nil, "later%d", i), live, 1, epoch+int64(500*time.Millisecond), true)
	}
	for i := range s.shards {
		sh := &s.shards[i]
		if len(sh.m) > perShard {
			t.Fatalf("shard %d holds %d keys, want at most %d", i, len(sh.m), perShard)
		}
		if want := epoch + sweepEvery; sh.nextSweep != want {
			t.Fatalf("shard %d next sweep at %+dns, want at %+dns: a full shard was swept off schedule", i, sh.nextSweep-epoch, want-epoch)
		}
	}
	if n, held := s.keys.Load(), s.len(); n != int64(held) || held != localShards*perShard {
		t.Fatalf("%d keys counted, %d held; want %d", n, held, localShards*perShard)
	}
}

// A limit lowered below what a key has used leaves nothing: Remaining is 0, never negative.
func TestLocalLoweredLimit(t *testing.T) {
	tests := []struct {
		name       string
		give, then Limit
	}{
		{"fixed window", FixedWindow{Limit: 10, Window: time.Second}, FixedWindow{Limit: 5, Window: time.Second}},
		{"sliding window", SlidingWindow{Limit: 10, Window: time.Second}, SlidingWindow{Limit: 5, Window: time.Second}},
		{"sliding log", SlidingLog{Limit: 10, Window: time.Second}, SlidingLog{Limit: 5, Window: time.Second}},
		{"token bucket", TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}, TokenBucket{Capacity: 5, Rate: 1, Period: time.Second}},
		{"leaky bucket", LeakyBucket{Capacity: 10, Rate: 1, Period: time.Second}, LeakyBucket{Capacity: 5, Rate: 1, Period: time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newLocalStore(10)
			if got := s.decide([]byte("k"), callOf(tt.give, 8), 1, epoch, true); !got.Allowed {
				t.Fatalf("8 of 10: %+v", got)
			}
			for _, write := range []bool{false, true} {
				got := s.decide([]byte("k"), callOf(tt.then, 1), 1, epoch, write)
				if got.Allowed || got.Remaining != 0 || got.Limit != 5 {
					t.Errorf("limit lowered to 5 (write %v): %+v; want denied, Remaining 0", write, got)
				}
			}
		})
	}
}

// A local sliding log keeps at most logSlots+1 counts whatever its window: the slot width is
// rounded up, so at most logSlots whole slots and the current one are live.
func TestLocalSlidingLogSlots(t *testing.T) {
	for _, window := range []time.Duration{time.Millisecond, 15 * time.Millisecond, 16 * time.Millisecond,
		17 * time.Millisecond, 31 * time.Millisecond, 33 * time.Millisecond, time.Second + time.Millisecond} {
		s := newLocalStore(10)
		c := callOf(SlidingLog{Limit: maxLog, Window: window}, 1)
		for i := range 3 * window.Milliseconds() {
			if got := s.decide([]byte("k"), c, 1, epoch+i*int64(time.Millisecond), true); !got.Allowed {
				t.Fatalf("window %s, call %d denied: %+v", window, i, got)
			}
			if st := s.shard([]byte("k")).m["k"]; len(st.log) > logSlots+1 || cap(st.log) > logSlots+1 {
				t.Fatalf("window %s, after %dms: %d counts (capacity %d), want at most %d", window, i, len(st.log), cap(st.log), logSlots+1)
			}
		}
	}
}

func TestShare(t *testing.T) {
	tests := []struct {
		v, instances, want int64
	}{
		{100, 1, 100},
		{100, 3, 33},
		{100, 100, 1},
		{3, 10, 1},
		{1, 1000000, 1},
	}
	for _, tt := range tests {
		if got := share(tt.v, tt.instances); got != tt.want {
			t.Errorf("share(%d, %d) = %d, want %d", tt.v, tt.instances, got, tt.want)
		}
	}
}

// BenchmarkLocalStoreFull is the cost of a new key in a store full of live state (the default
// bound, 100000 keys of token buckets an hour long): each one evicts another.
func BenchmarkLocalStoreFull(b *testing.B) {
	s := newLocalStore(defaultLocalKeys)
	c := callOf(TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour}, 1)
	bound := localShards * ((defaultLocalKeys + localShards - 1) / localShards)
	for i := range bound * 2 {
		s.decide(fmt.Appendf(nil, "fill%d", i), c, 1, epoch, true)
	}
	key := []byte("new")
	b.ReportAllocs()
	i := int64(0)
	for b.Loop() {
		s.decide(strconv.AppendInt(key[:3], i, 10), c, 1, epoch, true)
		i++
	}
}

// TestDropIgnoresStragglers: a server decision on a call sent before the key's local state
// began (in flight when the outage started) must not hand the key a second local budget.
func TestDropIgnoresStragglers(t *testing.T) {
	s := newLocalStore(10)
	c := callOf(FixedWindow{Limit: 5, Window: time.Hour}, 1)
	key := []byte("k")
	const t0 = epoch + int64(time.Minute)
	for range 5 {
		if r := s.decide(key, c, 1, t0, true); !r.Allowed {
			t.Fatalf("local share not admitted: %+v", r)
		}
	}
	s.drop(key, t0-1, t0+1) // sent before the local state began: a straggler
	if r := s.decide(key, c, 1, t0+2, true); r.Allowed {
		t.Fatalf("a straggler's answer reset the local state: %+v admitted a 6th", r)
	}
	s.drop(key, t0+3, t0+4) // sent after: the server decides the key again
	if r := s.decide(key, c, 1, t0+5, true); !r.Allowed {
		t.Fatalf("the server's decision did not drop the local state: %+v", r)
	}
}

// callOf is a call of limit with cost, and no reserve.
func callOf(limit Limit, cost int64) call { return call{spec: limit.spec(), cost: cost} }
