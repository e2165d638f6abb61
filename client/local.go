package client

import (
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// The local fallback: in-process limiters of the library's algorithms, each admitting a share
// of its limit, for the calls the server cannot decide. Times are Unix nanoseconds from the
// Limiter's clock, and windows are aligned to the Unix epoch as the server aligns them.

const (
	// localShards spreads the fallback's state over mutexes, so that goroutines deciding for
	// different keys rarely wait for one another.
	localShards = 64
	// logSlots is the resolution of a local sliding log: it keeps one count per 1/logSlots of
	// its window rather than one entry per unit, so its memory is bounded whatever the limit.
	logSlots = 16
	// sweepEvery is how often a shard that receives new keys drops its expired ones.
	sweepEvery = int64(time.Second)
	// evictSample is how many entries a full shard looks at to evict the one expiring first.
	evictSample = 8
)

// localState is one key's state. Which fields mean what depends on the algorithm: a window's
// start and counts, or a bucket's time and level.
type localState struct {
	created int64 // when the first local decision made it (ns, the Limiter's clock)
	expires int64 // when the state is back to its initial value; the entry is dead from then
	t       int64 // fixed and sliding window: window start (ms); buckets: time of level (ns)
	a, b    int64 // fixed window: count in a; sliding window: previous in a, current in b
	level   float64
	log     []logSlot        // sliding log, oldest first
	leases  map[string]int64 // concurrency: each holder's expiry (ns)
}

// logSlot counts the units a sliding log admitted during one slot of its window.
type logSlot struct {
	slot int64 // start of the slot (ms) / slot width
	n    int64
}

// localStore holds the local limiters' state, bounded: each shard holds at most perShard keys.
type localStore struct {
	seed     maphash.Seed
	perShard int
	// keys counts the keys held, expired ones included until swept, so that a call the server
	// decided looks for local state to drop only while there is some.
	keys   atomic.Int64
	shards [localShards]localShard
}

type localShard struct {
	mu        sync.Mutex
	m         map[string]*localState
	nextSweep int64
	_         [40]byte // keeps two shards' mutexes off one cache line
}

func newLocalStore(maxKeys int) *localStore {
	s := &localStore{seed: maphash.MakeSeed(), perShard: max(1, (maxKeys+localShards-1)/localShards)}
	for i := range s.shards {
		s.shards[i].m = map[string]*localState{}
	}
	return s
}

// len is the number of keys held, expired ones included until swept.
func (s *localStore) len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// used reports whether the store holds any key.
func (s *localStore) used() bool { return s.keys.Load() != 0 }

// drop forgets key (as the server names it): the server decided it, and its state is the
// truth. Only key's: in a cluster with a shard down, the server keeps deciding the other
// shards' keys while the dead shard's keys are still decided here. The other keys' state is
// left to expire, so drop also sweeps key's shard when its sweep is due.
//
// sent is when the server's call was sent: a call sent before the local state began (in
// flight when the outage started, answered late) says nothing of what happened since, and
// dropping the state on it would hand the key a second local budget.
func (s *localStore) drop(key []byte, sent, now int64) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if st, ok := sh.m[string(key)]; ok && st.created < sent {
		delete(sh.m, string(key))
		s.keys.Add(-1)
	}
	if now >= sh.nextSweep {
		s.sweep(sh, now)
	}
}

func (s *localStore) shard(key []byte) *localShard {
	return &s.shards[maphash.Bytes(s.seed, key)%localShards]
}

// sweep drops sh's expired keys; sh.mu is held.
func (s *localStore) sweep(sh *localShard, now int64) {
	n := len(sh.m)
	for k, v := range sh.m {
		if v.expires <= now {
			delete(sh.m, k)
		}
	}
	s.keys.Add(int64(len(sh.m) - n))
	sh.nextSweep = now + sweepEvery
}

// decide runs c on key's local limiter (key as the server names it) with limits divided by
// instances. A peek (write false) neither changes nor creates state.
func (s *localStore) decide(key []byte, c call, instances, now int64, write bool) Result {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st := sh.m[string(key)] // no allocation: the conversion is only for the lookup
	if st != nil && st.expires <= now {
		*st = localState{created: now, log: st.log[:0]}
	}
	reserve := localReserve(c.reserve, c.limit, instances)
	if st == nil {
		if !write {
			var zero localState
			return c.alg.local.decide(&zero, c.params, c.cost, reserve, instances, now, false)
		}
		st = &localState{created: now}
		res := c.alg.local.decide(st, c.params, c.cost, reserve, instances, now, true)
		if st.expires > now {
			s.insert(sh, string(key), st, now)
		}
		return res
	}
	return c.alg.local.decide(st, c.params, c.cost, reserve, instances, now, write)
}

// refund gives c.cost units back to key's local limiter (for concurrency: releases c.id's
// lease), and answers with its state after.
func (s *localStore) refund(key []byte, c call, instances, now int64) Result {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st := sh.m[string(key)]
	if st == nil || st.expires <= now {
		var zero localState
		return c.alg.local.refund(&zero, c.params, c.cost, instances, now)
	}
	return c.alg.local.refund(st, c.params, c.cost, instances, now)
}

// localReserve is a reserve's local part: reserve / instances rounded up, so that critical
// callers keep some of every share, and at most the share itself.
func localReserve(reserve, limit, instances int64) int64 {
	if reserve == 0 {
		return 0
	}
	return min((reserve+instances-1)/instances, share(limit, instances))
}

// insert adds a key, first making room: expired keys go once per sweepEvery; a shard still
// full evicts, of a few keys, the one whose state expires first (the closest to its initial
// state anyway, or expired already). A full shard is not swept on every insert: full of live
// state, it would scan all its keys each time for nothing.
func (s *localStore) insert(sh *localShard, key string, st *localState, now int64) {
	if now >= sh.nextSweep {
		s.sweep(sh, now)
	}
	if len(sh.m) >= s.perShard {
		var victim string
		soonest := int64(math.MaxInt64)
		n := 0
		for k, v := range sh.m {
			if v.expires < soonest {
				victim, soonest = k, v.expires
			}
			if n++; n == evictSample {
				break
			}
		}
		delete(sh.m, victim)
		s.keys.Add(-1)
	}
	sh.m[key] = st
	s.keys.Add(1)
}

// share is a limit's local part: v / instances rounded down, so that the instances together
// never admit more than the limit, and at least 1, so that every instance admits something.
func share(v, instances int64) int64 {
	return max(1, v/instances)
}

// localAlgorithm is an algorithm's in-process equivalent. Times are Unix nanoseconds.
type localAlgorithm interface {
	// decide judges cost + reserve against st at now, and consumes cost when it admits and
	// write is set. Limits are divided by instances.
	decide(st *localState, p params, cost, reserve, instances, now int64, write bool) Result
	// refund gives back n units as far as st still holds them and answers with the state
	// after (Allowed, no RetryAfter, no Delay), as the library's refunds do.
	refund(st *localState, p params, n, instances, now int64) Result
}

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }

// refunded is a refund's reply: the state after it, as a peek of cost 0 sees it.
func refunded(a localAlgorithm, st *localState, p params, instances, now int64) Result {
	r := a.decide(st, p, 0, 0, instances, now, false)
	r.Allowed, r.RetryAfter, r.Delay = true, 0, 0
	return r
}

// localFixedWindow is rl_fixed_window: at most limit units per aligned window of windowMs.
type localFixedWindow struct{}

func (localFixedWindow) decide(st *localState, p params, cost, reserve, instances, now int64, write bool) Result {
	nowMs := now / int64(time.Millisecond)
	start := nowMs - nowMs%p.ms
	return decideWindow(st, share(p.limit, instances), cost, reserve, start, start+p.ms, now, write)
}

// decideWindow is a fixed window's decision at now (ns) in the window [start, end) (ms), the
// fixed window's aligned one or a calendar's: at most limit units in it.
func decideWindow(st *localState, limit, cost, reserve, start, end, now int64, write bool) Result {
	need := cost + reserve
	resetNs := end*int64(time.Millisecond) - now
	var count int64
	if st.t == start {
		count = st.a
	}
	// a limit lowered since the count was taken may be below it
	r := Result{Limit: limit, Remaining: max(0, limit-count-reserve), Source: FromFallback}
	if count > 0 {
		r.ResetAfter = time.Duration(resetNs)
	}
	switch {
	case need > limit:
		r.RetryAfter = Never
		return r
	case count+need > limit:
		r.RetryAfter = time.Duration(resetNs)
		return r
	}
	r.Allowed = true
	if write && cost > 0 {
		st.t, st.a = start, count+cost
		st.expires = end * int64(time.Millisecond)
		r.Remaining = max(0, limit-st.a-reserve)
		r.ResetAfter = time.Duration(resetNs)
	}
	return r
}

func (a localFixedWindow) refund(st *localState, p params, n, instances, now int64) Result {
	nowMs := now / int64(time.Millisecond)
	if st.t == nowMs-nowMs%p.ms {
		st.a = max(0, st.a-n)
	}
	return refunded(a, st, p, instances, now)
}

// localSlidingWindow is rl_sliding_window, in the same integer arithmetic (units * ms): admits
// while prev * (window - elapsed) / window + curr + cost <= limit.
type localSlidingWindow struct{}

func (localSlidingWindow) decide(st *localState, p params, cost, reserve, instances, now int64, write bool) Result {
	limit, window := share(p.limit, instances), p.ms
	need := cost + reserve
	nowMs := now / int64(time.Millisecond)
	start := nowMs - nowMs%window
	elapsed := nowMs - start
	var prev, curr int64
	switch st.t {
	case start:
		prev, curr = st.a, st.b
	case start - window:
		prev = st.b
	}
	room := limit*window - prev*(window-elapsed) - curr*window
	whole := func(room int64) int64 { return max(0, room-reserve*window) / window }
	r := Result{Limit: limit, Remaining: whole(room), Source: FromFallback}
	switch {
	case curr > 0:
		r.ResetAfter = ms(start + 2*window - nowMs)
	case prev > 0:
		r.ResetAfter = ms(start + window - nowMs)
	}
	if need > limit {
		r.RetryAfter = Never
		return r
	}
	if need*window > room {
		// The first elapsed e of this window whose weight of prev admits; failing that, the
		// first of the next window, where curr becomes the previous count.
		target := int64(-1)
		if left := (limit - curr - need) * window; left >= 0 && prev > 0 {
			if e := window - left/prev; e < window {
				target = start + e
			}
		}
		if target < 0 {
			e := int64(0)
			if curr > 0 {
				e = max(0, window-(limit-need)*window/curr)
			}
			target = start + window + e
		}
		r.RetryAfter = ms(target - nowMs)
		return r
	}
	r.Allowed = true
	if write && cost > 0 {
		st.t, st.a, st.b = start, prev, curr+cost
		st.expires = (start + 2*window) * int64(time.Millisecond)
		r.Remaining = whole(room - cost*window)
		r.ResetAfter = ms(start + 2*window - nowMs)
	}
	return r
}

func (a localSlidingWindow) refund(st *localState, p params, n, instances, now int64) Result {
	nowMs := now / int64(time.Millisecond)
	if st.t == nowMs-nowMs%p.ms {
		st.b = max(0, st.b-n)
	}
	return refunded(a, st, p, instances, now)
}

// localSlidingLog is rl_sliding_log with admissions counted per slot of window/logSlots
// (rounded up to whole milliseconds, so that at most logSlots slots and the current one are
// live) rather than per unit: a unit leaves the window when its slot's end does, up to a slot
// later than on the server, so the local log never admits more than limit units in any span
// of window.
type localSlidingLog struct{}

func (localSlidingLog) decide(st *localState, p params, cost, reserve, instances, now int64, write bool) Result {
	limit, window := share(p.limit, instances), p.ms
	need := cost + reserve
	nowMs := now / int64(time.Millisecond)
	width := (window + logSlots - 1) / logSlots
	slot := nowMs / width
	leaves := func(s int64) int64 { return (s+1)*width + window } // ms at which a slot's units leave
	drop := 0
	for drop < len(st.log) && leaves(st.log[drop].slot) <= nowMs {
		drop++
	}
	live := st.log[drop:]
	var count int64
	for _, e := range live {
		count += e.n
	}
	r := Result{Limit: limit, Remaining: max(0, limit-count-reserve), Source: FromFallback}
	if len(live) > 0 {
		r.ResetAfter = ms(leaves(live[len(live)-1].slot) - nowMs)
	}
	if need > limit {
		r.RetryAfter = Never
		return r
	}
	if count+need > limit {
		// the (count + need - limit)-th oldest unit must leave first
		k := count + need - limit
		for _, e := range live {
			if k -= e.n; k <= 0 {
				r.RetryAfter = ms(leaves(e.slot) - nowMs)
				break
			}
		}
		return r
	}
	r.Allowed = true
	if write && cost > 0 {
		if drop > 0 {
			st.log = append(st.log[:0], live...)
		}
		if n := len(st.log); n > 0 && st.log[n-1].slot == slot {
			st.log[n-1].n += cost
		} else {
			if st.log == nil {
				st.log = make([]logSlot, 0, logSlots+1) // all it can need: append would double to 32
			}
			st.log = append(st.log, logSlot{slot: slot, n: cost})
		}
		st.expires = leaves(slot) * int64(time.Millisecond)
		r.Remaining = max(0, limit-count-cost-reserve)
		r.ResetAfter = ms(leaves(slot) - nowMs)
	}
	return r
}

// refund removes up to n of the newest units.
func (a localSlidingLog) refund(st *localState, p params, n, instances, now int64) Result {
	for i := len(st.log) - 1; i >= 0 && n > 0; i-- {
		take := min(n, st.log[i].n)
		st.log[i].n -= take
		n -= take
		if st.log[i].n == 0 {
			st.log = st.log[:i]
		}
	}
	return refunded(a, st, p, instances, now)
}

// localBucket is the token bucket (the level is the tokens missing from a full bucket) and the
// leaky bucket (the level is what the bucket holds), sharing the library's core: capacity is
// divided by instances as a window's limit is, and the rate is kept whole over a period
// instances times as long, so no rate rounds down to nothing. The level is a float64: exact
// for whole units, and a fallback need not be exact to the nanosecond in between.
type localBucket struct {
	leaky bool // a leaky bucket: in Shape mode, an admitted call has a Delay
}

func (b localBucket) decide(st *localState, p params, cost, reserve, instances, now int64, write bool) Result {
	capacity, rate := share(p.limit, instances), p.rate
	need := cost + reserve
	periodNs := float64(p.ms) * float64(time.Millisecond) * float64(instances)
	// drain is the time the level x takes to drain; the product first, so that round numbers
	// stay exact.
	drain := func(x float64) time.Duration { return duration(x * periodNs / float64(rate)) }
	level := b.level(st, capacity, rate, periodNs, now)
	left := func(level float64) int64 { return max(0, int64(float64(capacity)-level)-reserve) }
	r := Result{Limit: capacity, Remaining: left(level), Source: FromFallback, ResetAfter: drain(level)}
	if need > capacity {
		r.RetryAfter = Never
		return r
	}
	if level+float64(need) > float64(capacity) {
		r.RetryAfter = drain(level + float64(need) - float64(capacity))
		return r
	}
	r.Allowed = true
	if b.leaky && p.mode == Shape {
		// this call leaves once the level ahead of it has drained
		r.Delay = drain(level)
	}
	if write && cost > 0 {
		level += float64(cost)
		st.t, st.level = now, level
		r.ResetAfter = drain(level)
		st.expires = now + int64(r.ResetAfter)
		r.Remaining = left(level)
	}
	return r
}

// level is the bucket's level at now.
func (localBucket) level(st *localState, capacity, rate int64, periodNs float64, now int64) float64 {
	level := 0.0
	if st.expires > now {
		level = min(st.level, float64(capacity)) // a lowered capacity keeps at most a full bucket
		if elapsed := now - st.t; elapsed > 0 {
			level = max(0, level-float64(elapsed)*float64(rate)/periodNs)
		}
	}
	return level
}

// refund lowers the level by n (for a token bucket: adds n tokens), not below empty (full).
func (b localBucket) refund(st *localState, p params, n, instances, now int64) Result {
	capacity := share(p.limit, instances)
	periodNs := float64(p.ms) * float64(time.Millisecond) * float64(instances)
	if level := b.level(st, capacity, p.rate, periodNs, now); level > 0 {
		st.t, st.level = now, max(0, level-float64(n))
		st.expires = now + int64(duration(st.level*periodNs/float64(p.rate)))
	}
	return refunded(b, st, p, instances, now)
}

// duration rounds ns up to a Duration, short of Never.
func duration(ns float64) time.Duration {
	if ns >= float64(Never-1) {
		return Never - 1
	}
	return time.Duration(math.Ceil(ns))
}
