package client

import (
	"hash/maphash"
	"math"
	"strconv"
	"testing"
	"time"
)

func TestNextBatch(t *testing.T) {
	const maxAge, maxBatch = int64(100 * time.Millisecond), 64
	ms := int64(time.Millisecond)
	tests := []struct {
		name            string
		k, fetched, now int64
		want            int64
	}{
		{"first batch", 1, 0, 5 * ms, 1},
		{"denied since", 32, 0, 5 * ms, 1},
		{"hot: used up within a quarter", 4, 1000 * ms, 1010 * ms, 8},
		{"hot at a quarter exactly", 4, 1000 * ms, 1025 * ms, 8},
		{"capped at maxBatch", 64, 1000 * ms, 1001 * ms, 64},
		{"doubling stops at maxBatch", 40, 1000 * ms, 1001 * ms, 64},
		{"warm: kept", 16, 1000 * ms, 1040 * ms, 16},
		{"cooling: halved", 16, 1000 * ms, 1060 * ms, 8},
		{"halving stops at 1", 1, 1000 * ms, 1090 * ms, 1},
		{"cold: maxAge passed", 64, 1000 * ms, 1101 * ms, 1},
	}
	for _, tt := range tests {
		if got := nextBatch(tt.k, tt.fetched, tt.now, maxAge, maxBatch); got != tt.want {
			t.Errorf("%s: nextBatch(%d, %d, %d) = %d, want %d", tt.name, tt.k, tt.fetched, tt.now, got, tt.want)
		}
	}
}

func TestLifetime(t *testing.T) {
	bs := newBudgets(64, 100*time.Millisecond)
	const sent = int64(1_000_000_000)
	ms := int64(time.Millisecond)
	deadline := 10 * time.Millisecond
	tests := []struct {
		name         string
		alg          *algorithm
		windowMs     int64
		reset        time.Duration
		wantExpires  int64
		wantRefundBy int64
	}{
		{"token bucket: maxAge, refund any time", tokenBucketAlg, 0, time.Hour, sent + 100*ms, math.MaxInt64},
		{"leaky bucket", leakyBucketAlg, 0, time.Second, sent + 100*ms, math.MaxInt64},
		{"fixed window ending late: maxAge", fixedWindowAlg, 60_000, 30 * time.Second, sent + 100*ms, sent + 30_000*ms - ms - 10*ms},
		{"fixed window ending first", fixedWindowAlg, 1000, 50 * time.Millisecond, sent + 49*ms, sent + 39*ms},
		{"fixed window ending now: no refund", fixedWindowAlg, 1000, time.Millisecond, sent, sent - 10*ms},
		{"sliding window: reset is the next window's end", slidingWindowAlg, 1000, 1050 * time.Millisecond, sent + 49*ms, sent + 39*ms},
		{"sliding window ending late", slidingWindowAlg, 60_000, 90 * time.Second, sent + 100*ms, sent + 30_000*ms - ms - 10*ms},
	}
	for _, tt := range tests {
		e, r := bs.lifetime(tt.alg, tt.windowMs, sent, tt.reset, deadline)
		if e != tt.wantExpires || r != tt.wantRefundBy {
			t.Errorf("%s: lifetime = (%d, %d) after sent, want (%d, %d)", tt.name, e-sent, r-sent, tt.wantExpires-sent, tt.wantRefundBy-sent)
		}
	}
}

func TestLeasable(t *testing.T) {
	tests := []struct {
		name     string
		limit    Limit
		cost     int64
		critical bool
		want     bool
	}{
		{"fixed window", FixedWindow{Limit: 10, Window: time.Second}, 1, false, true},
		{"sliding window", SlidingWindow{Limit: 10, Window: time.Second}, 3, false, true},
		{"token bucket", TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}, 1, false, true},
		{"leaky bucket police", LeakyBucket{Capacity: 10, Rate: 1, Period: time.Second}, 1, false, true},
		{"leaky bucket shape", LeakyBucket{Capacity: 10, Rate: 1, Period: time.Second, Mode: Shape}, 1, false, false},
		{"sliding log", SlidingLog{Limit: 10, Window: time.Second}, 1, false, false},
		{"cost 0", TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}, 0, false, false},
		{"critical with a reserve", TokenBucket{Capacity: 10, Rate: 1, Period: time.Second, Reserve: 2}, 1, true, false},
		{"not critical with a reserve", TokenBucket{Capacity: 10, Rate: 1, Period: time.Second, Reserve: 2}, 1, false, true},
		{"critical without a reserve", TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}, 1, true, true},
	}
	for _, tt := range tests {
		c := call{spec: tt.limit.spec(), cost: tt.cost}
		if !tt.critical {
			c.reserve = c.params.reserve
		}
		if got := c.leasable(); got != tt.want {
			t.Errorf("%s: leasable = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestRecentWord(t *testing.T) {
	const h, other = uint64(0xabcdef01_23456789), uint64(0x12345678_23456789)
	const unit = int64(1) << recentUnit
	base := int64(1_700_000_000) * int64(time.Second)
	tests := []struct {
		name      string
		h         uint64
		at, now   int64
		quick     bool
		wantOK    bool
		wantSince time.Duration
	}{
		{"same key, same instant", h, base, base, false, true, 0},
		{"same key, 1ms later", h, base, base + int64(time.Millisecond), true, true, time.Duration(int64(time.Millisecond) / unit * unit)},
		{"another key in the slot", other, base, base + 5, false, false, 0},
		// the time field wraps every 2^30 units: the difference still comes out right
		{"across a wrap", h, (1<<30 - 3) * unit, (1<<30 + 7) * unit, false, true, time.Duration(10 * unit)},
		{"empty slot", h, 0, base, false, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r recentCall
			if tt.name != "empty slot" {
				r.w.Store(recentWord(h, tt.at, tt.quick))
			}
			w := r.w.Load()
			got, ok := r.since(w, tt.h, tt.now)
			if ok != tt.wantOK || got != tt.wantSince {
				t.Errorf("since = %v, %v; want %v, %v", got, ok, tt.wantSince, tt.wantOK)
			}
			if w != 0 && (w&1 == 1) != tt.quick {
				t.Errorf("quick bit of %#x, want %v", w, tt.quick)
			}
		})
	}
}

// TestBudgetSlots checks that a call finds its key's budget through the shard's slots, which
// tell a call not to look in the shard's map, and that a budget swept away frees its slot only
// when no other budget holds it.
func TestBudgetSlots(t *testing.T) {
	const maxAge = int64(100 * time.Millisecond)
	bs := newBudgets(64, time.Duration(maxAge))
	c := call{spec: TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}.spec(), cost: 1}
	where := func(sk string) (*budgetShard, uint16) {
		h := maphash.Bytes(bs.seed, []byte(sk))
		return &bs.shards[h%budgetShards], uint16((h / budgetShards) % recentSlots)
	}
	// two keys in one slot of one shard
	first := "k0"
	sh, slot := where(first)
	var second string
	for i := 1; second == ""; i++ {
		if s, n := where("k" + strconv.Itoa(i)); s == sh && n == slot {
			second = "k" + strconv.Itoa(i)
		}
	}
	now := int64(time.Hour)
	clock := func() int64 { return now }
	hot := func(sk string) *budget {
		t.Helper()
		var b *budget
		for range 3 { // three calls within a quarter of maxAge: the third makes the budget
			now += int64(time.Millisecond)
			b, _ = bs.get([]byte(sk), sk, c, 0, clock)
		}
		if b == nil {
			t.Fatalf("%s: no budget after three quick calls", sk)
		}
		return b
	}
	b1 := hot(first)
	if !sh.holds(slot) {
		t.Fatal("the slot of a key with a budget does not hold one")
	}
	now += int64(time.Millisecond)
	if got, _ := bs.get([]byte(first), first, c, 0, clock); got != b1 {
		t.Fatalf("the next call found %p, want its budget %p", got, b1)
	}
	b2 := hot(second)
	now += int64(time.Millisecond)
	if got, _ := bs.get([]byte(second), second, c, 0, clock); got != b2 {
		t.Fatalf("the second key's call found %p, want its budget %p", got, b2)
	}

	// a cold call's store lost the bit: the key's calls miss its budget until a quick one
	// finds it under the lock
	sh.recent[slot].w.And(^uint64(budgetBit))
	if got := hot(first); got != b1 || !sh.holds(slot) {
		t.Fatalf("after the bit was lost: found %p, want %p; slot held %v, want true", got, b1, sh.holds(slot))
	}

	// the first key's budget busy, the second's idle: the sweep drops the second alone
	b1.fetching = true
	now += 2 * maxAge
	sh.mu.Lock()
	bs.sweep(sh, now)
	sh.mu.Unlock()
	if !b2.dead || b1.dead || !sh.holds(slot) {
		t.Fatalf("after the first sweep: dead %v, %v (want false, true), slot held %v (want true)", b1.dead, b2.dead, sh.holds(slot))
	}
	b1.fetching = false
	sh.mu.Lock()
	bs.sweep(sh, now)
	sh.mu.Unlock()
	if !b1.dead || sh.holds(slot) {
		t.Fatalf("after the second sweep: dead %v (want true), slot held %v (want false)", b1.dead, sh.holds(slot))
	}

	// a cold call's store brought the bit back: the next call finds no budget, and clears it
	sh.recent[slot].w.Or(budgetBit)
	now += int64(time.Millisecond)
	if got, _ := bs.get([]byte(first), first, c, 0, clock); got != nil || sh.holds(slot) {
		t.Fatalf("after the bit came back: found %p, want none; slot held %v, want false", got, sh.holds(slot))
	}
}
