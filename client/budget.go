package client

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rlfn/rlfn/internal/keys"
)

// Leased budgets (Options.BudgetBatch): a hot key's admissions served from batches of units the
// server admitted in one call. The bounds they keep are stated in the package documentation.

const (
	// budgetShards spreads the budgets over mutexes, as localShards does the fallback's state.
	budgetShards = 64
	// budgetKeys bounds how many keys hold a budget (parked units or the demand that sizes the
	// next batch): about 200 bytes each.
	budgetKeys = 100_000
)

// budgets is a Limiter's leased budgets, one per key, limit and reserve.
type budgets struct {
	maxBatch int64
	maxAge   int64 // ns
	seed     maphash.Seed
	perShard int

	// rw is held shared by every batch in flight and every refund of parked units, and alone
	// by Close while it marks the budgets closed: once Close holds it, no batch is on its
	// way, and none parks units after it.
	rw     sync.RWMutex
	closed bool
	isShut atomic.Bool    // closed, read without rw by the calls that hand out parked units
	wg     sync.WaitGroup // refunds started by batches, waited for by Close

	shards [budgetShards]budgetShard
}

type budgetShard struct {
	mu        sync.RWMutex
	m         map[string]*budget
	nextSweep int64
	held      [recentSlots]uint16     // budgets in m by slot of recent (see budget.slot), under mu
	recent    [recentSlots]recentCall // keys without a budget, by hash: two keys may share a slot
	_         [64]byte                // keeps the next shard's mutex off this one's slots' cache line
}

// hold counts a budget added to sh.m at slot; sh.mu is held.
func (sh *budgetShard) hold(slot uint16) {
	sh.held[slot]++
	sh.recent[slot].w.Or(budgetBit)
}

// drop forgets b, which sh.m holds at k; sh.mu and b.mu are held.
func (sh *budgetShard) drop(k string, b *budget) {
	b.dead = true
	delete(sh.m, k)
	if sh.held[b.slot]--; sh.held[b.slot] == 0 {
		sh.recent[b.slot].w.And(^uint64(budgetBit))
	}
}

// holds reports whether slot's word says it holds a budget (see budgetBit).
func (sh *budgetShard) holds(slot uint16) bool {
	return sh.recent[slot].w.Load()&budgetBit != 0
}

// recentSlots is the size of a shard's table of recent calls: 64 x 256 slots of 8 bytes, small
// enough to stay in the processor's cache, which a cold key's call would otherwise miss.
const recentSlots = 256

// recentCall is the last call of a key without a budget, and whether one came quickly before
// it, in one word read and written without the shard's lock, which only the call that makes a
// key hot takes: calls on cold keys, the spread case's every call, would otherwise queue for the
// 64 shards' locks. Two calls racing on a slot keep one's word: a key then gets a budget a call
// late, which changes how it is batched, never what the server admits.
//
// The word is the key's tag (the upper half of its hash; 0 for none) in its upper 32 bits, the
// time of the call in units of recentUnit modulo 2^30 in the next 30 (wrapping every 18
// minutes: a key called again that much later may count as called quickly, a budget a call
// early), budgetBit, and the bit that tells a call came quickly before it.
type recentCall struct{ w atomic.Uint64 }

// budgetBit in a slot's word says that the slot holds a budget (held is not 0): only then does
// a call look for its key's budget in the shard's map, under its read lock. In the spread case,
// where random arrivals make a few keys hot now and then, nearly every shard holds a budget:
// without the bit, nearly every call took its shard's read lock (two atomic adds on a cache line
// both cores write) and hashed its key again for the map, for nothing; and the bit is in the
// word that the call reads anyway, not a cache miss of its own.
//
// The calls that write the word without the lock keep the bit as they read it, so that it may
// be lost, when a budget is added meanwhile, or come back, when the last is dropped meanwhile.
// Lost, the budget's calls miss it and go to the server, as without leased budgets, until one of
// them, quick again, finds it under the lock and sets the bit again; back, a call finds no budget
// in the map, and clears it.
const budgetBit = 2

// recentUnit is the time unit of the table of recent calls: 1.024µs (a quarter of the smallest
// maxAge is 244 of them).
const recentUnit = 10 // bits

func recentWord(h uint64, now int64, quick bool) uint64 {
	w := h&^(1<<32-1) | uint64(uint32(now>>recentUnit))<<2&(1<<32-1)
	if quick {
		w |= 1
	}
	return w
}

// since is how long ago (ns, to recentUnit) the call recorded in w came, if w is h's.
func (r *recentCall) since(w, h uint64, now int64) (time.Duration, bool) {
	if w>>32 != h>>32 {
		return 0, false
	}
	units := (uint32(now>>recentUnit)<<2 - uint32(w)&^3) >> 2
	return time.Duration(units) << recentUnit, true
}

// budget is one key's: its parked units and what sizes its next batch.
type budget struct {
	mu   sync.Mutex
	key  string // the caller's key and the limit, for the refunds
	spec spec
	slot uint16 // its key's slot of its shard's recent

	dead     bool          // removed from its shard: a caller that finds it so looks again
	fetching bool          // a call is taking a batch
	wake     chan struct{} // made by the first call that waits for that batch, closed after it

	units     int64 // parked: taken from the server, not handed out yet
	k         int64 // the next batch, for a call of cost 1 (1 to maxBatch)
	fetched   int64 // when the last admitted batch was sent (ns); 0 after a denial
	expires   int64 // parked units are handed out before this (ns)
	refundBy  int64 // and given back only before this (ns; windows, see refundable)
	limit     int64 // the server's Limit, Remaining and ResetAfter for the last batch
	remaining int64
	resetAt   int64 // ns
	timer     *time.Timer
}

func newBudgets(maxBatch int64, maxAge time.Duration) *budgets {
	bs := &budgets{maxBatch: maxBatch, maxAge: int64(maxAge), seed: maphash.MakeSeed(),
		perShard: (budgetKeys + budgetShards - 1) / budgetShards}
	for i := range bs.shards {
		bs.shards[i].m = map[string]*budget{}
	}
	return bs
}

// leasable reports whether c may be served from a leased budget: an admission of at least one
// unit of a window counter or a policing bucket, judged with its limit's reserve. A sliding
// log would lose its exactness, Shape mode its spacing (a Delay per request); a Critical call
// on a limit with a reserve goes to the server, because a batch taken without the reserve
// would park units of the reserve in this process, out of reach of other processes' critical
// calls. A limit with a Penalty goes to the server too: its block is decided with it there.
func (c *call) leasable() bool {
	switch {
	case c.cost < 1 || c.reserve != c.params.reserve || c.penalty > 0:
		return false
	case c.alg == leakyBucketAlg:
		return c.params.mode == Police
	}
	return c.alg == fixedWindowAlg || c.alg == slidingWindowAlg || c.alg == tokenBucketAlg || c.alg == calendarAlg
}

// stateKey appends what tells budgets and denials apart: the server key, whose length it
// returns too, then the limit's numbers, the reserve, the penalty and a calendar's window (a
// changed limit is another budget, and its denials another's).
func (l *Limiter) stateKey(buf []byte, key string, c call) ([]byte, int) {
	buf = keys.Append(buf, l.prefix, key, c.alg.name, c.name)
	n := len(buf)
	buf = append(buf, 0)
	// in binary: only compared, never read, and five decimal numbers took a third of the time
	for _, v := range [...]int64{c.limit, c.rate, c.ms, int64(c.mode), c.reserve, c.penalty, c.bounds[1]} {
		buf = binary.LittleEndian.AppendUint64(buf, uint64(v))
	}
	return buf, n
}

// get returns sk's budget, or nil for a cold key, decided by one call as without leased
// budgets, and when the shard is full of budgets in use.
//
// A key gets a budget once three of its calls came each within a quarter of maxAge of the one
// before: most keys never do, and cost a slot of a table with no allocation, rather than a
// budget (with its key, its timer) made and swept again for every call. now is the clock if
// the caller read it, else 0: then get reads it only for a key without a budget, and returns
// it (else 0), for the call that then goes to the server.
func (bs *budgets) get(sk []byte, key string, c call, now int64, clock func() int64) (*budget, int64) {
	h := maphash.Bytes(bs.seed, sk)
	sh := &bs.shards[h%budgetShards]
	slot := uint16((h / budgetShards) % recentSlots)
	r := &sh.recent[slot]
	w := r.w.Load()
	if w&budgetBit != 0 {
		// a hot key's calls only read the map: they share the lock
		sh.mu.RLock()
		b := sh.m[string(sk)]
		gone := b == nil && sh.held[slot] == 0
		sh.mu.RUnlock()
		if b != nil {
			return b, 0
		}
		if gone {
			r.w.And(^uint64(budgetBit))
			w &^= budgetBit
		}
	}
	// A budget made meanwhile, which the word did not show yet, is missed by this call only: it
	// goes to the server, as without leased budgets.
	if now == 0 {
		// the clock only for a key without a budget: a hit reads it once, under its budget's lock
		now = clock()
	}
	ago, ok := r.since(w, h, now)
	switch {
	case !ok || int64(ago) > bs.maxAge/4:
		r.w.Store(recentWord(h, now, false) | w&budgetBit)
		return nil, now
	case w&1 == 0:
		r.w.Store(recentWord(h, now, true) | w&budgetBit)
		return nil, now
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if b := sh.m[string(sk)]; b != nil {
		r.w.Or(budgetBit) // lost (see budgetBit)
		return b, 0
	}
	r.w.Store(budgetBit) // the key's calls look for its budget from now on
	if now >= sh.nextSweep {
		bs.sweep(sh, now)
	}
	if len(sh.m) >= bs.perShard && !bs.evict(sh, now) {
		return nil, now
	}
	// as if the last call had been a batch of one: the next one doubles (see nextBatch)
	b := &budget{key: key, spec: c.spec, slot: slot, k: 1, fetched: now - int64(ago)}
	sh.m[string(sk)] = b
	sh.hold(slot)
	return b, 0
}

// idle reports a budget that holds nothing and whose demand is forgotten: its next batch
// would be of one unit anyway. b.mu is held.
func (bs *budgets) idle(b *budget, now int64) bool {
	return !b.fetching && b.units == 0 && now-b.fetched > bs.maxAge
}

// sweep drops sh's idle budgets; sh.mu is held. A budget's lock is taken under its shard's,
// never the other way round.
func (bs *budgets) sweep(sh *budgetShard, now int64) {
	for k, b := range sh.m {
		b.mu.Lock()
		if bs.idle(b, now) {
			sh.drop(k, b)
		}
		b.mu.Unlock()
	}
	sh.nextSweep = now + sweepEvery
}

// evict makes room in a full shard by dropping, of a few budgets, one that holds no unit and
// takes no batch; sh.mu is held. It reports false when it found none.
func (bs *budgets) evict(sh *budgetShard, now int64) bool {
	n := 0
	for k, b := range sh.m {
		b.mu.Lock()
		free := !b.fetching && b.units == 0
		if free {
			sh.drop(k, b)
		}
		b.mu.Unlock()
		if free {
			return true
		}
		if n++; n == evictSample {
			return false
		}
	}
	return false
}

// allowLeased decides c (see leasable) from key's budget: a parked unit when there is one,
// else a batch from the server. now is the clock read by the caller, or 0.
func (l *Limiter) allowLeased(ctx context.Context, sk []byte, n int, key string, c call, now int64) (Result, error) {
	bs := l.near.budgets
	b, now := bs.get(sk, key, c, now, l.clock)
	if b == nil {
		return l.decide(ctx, opAllow, key, c, built{key: sk[:n], now: now})
	}
	// A call that waits for another call's batch keeps the Limiter's deadline from its first
	// wait: waited (nil until then) ends the waits, and a call of its own after them gets what
	// is left of it (sctx), so that waiting and calling take one deadline at most together.
	var waited *tick
	sctx := ctx
	timedOut := func() (Result, error) {
		// as when a call of its own times out: the Fallback decides
		return l.fail(ctx, opAllow, key, c, built{}, kindTimeout, replyErr(c.alg.fn, context.DeadlineExceeded))
	}
	for {
		b.mu.Lock()
		// read under the lock, never before: a batch must not be handed out past its expiry,
		// however long the lock took
		now := l.clock()
		switch {
		case b.dead:
			b.mu.Unlock()
			if b, now = bs.get(sk, key, c, 0, l.clock); b == nil {
				if waited != nil && waited.over() {
					return timedOut()
				}
				return l.decide(sctx, opAllow, key, c, built{key: sk[:n], now: now})
			}
			continue
		case b.units >= c.cost && now < b.expires:
			b.units -= c.cost
			r := Result{Allowed: true, Limit: b.limit, Remaining: b.remaining + b.units,
				ResetAfter: time.Duration(max(0, b.resetAt-now)), Source: FromLease}
			b.mu.Unlock()
			l.tel.decided(ctx, l.tel.series(ctx, c.alg.id, &c.spec), opAllow, r, srcLeased)
			return r, nil
		case b.fetching && b.k == 1:
			// A batch of one unit parks nothing: the key is cold or denied, and its calls go to
			// the server side by side, as without leased budgets.
			b.mu.Unlock()
			if waited != nil && waited.over() {
				return timedOut()
			}
			return l.decide(sctx, opAllow, key, c, built{})
		case b.fetching:
			// One batch at a time per budget: the calls that come meanwhile wait for it, rather
			// than each taking a batch of its own and parking more than maxBatch.
			if b.wake == nil {
				b.wake = make(chan struct{})
			}
			wake := b.wake
			b.mu.Unlock()
			if waited == nil {
				waited = l.deadlines.after(time.Since(clockBase), l.deadline)
				var cancel context.CancelFunc
				sctx, cancel = context.WithDeadline(ctx, waited.at)
				defer cancel()
			}
			select {
			case <-wake:
			case <-ctx.Done():
				return Result{}, ctx.Err()
			case <-waited.done:
				return timedOut()
			}
			if d := l.near.denials; d != nil {
				// the batch was denied: its denial answers the calls that waited for it
				if r, ok := d.get(sk, n, c.cost, l.clock()); ok {
					l.tel.countCached(ctx, c, r)
					return r, nil
				}
			}
			continue
		}
		if waited != nil && waited.over() {
			b.mu.Unlock()
			return timedOut()
		}
		b.fetching = true
		b.mu.Unlock()
		return l.fetch(sctx, b, c)
	}
}

// fetch takes a batch for a call of c on b, which it marked as fetching.
func (l *Limiter) fetch(ctx context.Context, b *budget, c call) (Result, error) {
	bs := l.near.budgets
	bs.rw.RLock()
	defer bs.rw.RUnlock()
	if bs.closed {
		b.mu.Lock()
		b.endFetch()
		b.mu.Unlock()
		return l.decide(ctx, opAllow, b.key, c, built{})
	}

	b.mu.Lock()
	sent := l.clock()
	// The parked units: usable by this call, or too old to hand out and to be given back
	// before staleBy.
	var have, stale int64
	staleBy := b.refundBy
	if sent < b.expires {
		have = b.units
	} else {
		stale = b.units
	}
	b.units = 0
	b.k = nextBatch(b.k, b.fetched, sent, bs.maxAge, bs.maxBatch)
	// this call's cost, less the parked units it uses, and the units that will be parked
	cc := c
	cc.cost, cc.extra = c.cost-have, b.k-1
	// No more than the limit could ever admit with the call, nor than the last batch left at
	// the server: a batch the server must deny costs a call for nothing.
	cc.extra = max(0, min(cc.extra, c.limit-c.reserve-cc.cost))
	if b.fetched != 0 {
		cc.extra = min(cc.extra, b.remaining)
	}
	b.mu.Unlock()
	res, err := l.decide(ctx, opAllow, b.key, cc, built{})
	batch := err == nil && res.Source != FromFallback && res.Allowed
	if err == nil && res.Source != FromFallback && !res.Allowed && cc.extra > 0 {
		// Denied with the batch: the exact call, so that a limited key is decided as without
		// leased budgets.
		cc.extra = 0
		res, err = l.decide(ctx, opAllow, b.key, cc, built{})
	}
	now := l.clock()

	b.mu.Lock()
	var parked int64
	switch {
	case batch:
		parked = cc.extra
		b.fetched = sent
		b.limit, b.remaining = res.Limit, res.Remaining
		b.resetAt = sent + int64(res.ResetAfter)
		b.expires, b.refundBy = bs.lifetime(c.alg, c.ms, sent, res.ResetAfter, l.deadline)
		if parked > 0 && now < b.expires {
			b.units = parked
			b.schedule(l, time.Duration(b.expires-now))
		} else {
			// its window ends: given back only while a refund can reach the window
			stale += parked
			staleBy = min(staleBy, b.refundBy)
		}
		res.Remaining += parked
	case err == nil && res.Source != FromFallback:
		// Denied: the limit is exhausted, and the parked units are better back on the server,
		// where any process can take them. The key is cold again.
		b.k, b.fetched = 1, 0
		stale += have
	default:
		// The server could not decide (the Fallback did), or the call failed: the parked units
		// stay for the calls that come, and the next batch is of one unit.
		b.k, b.fetched = 1, 0
		if res.Allowed && err == nil {
			// the Fallback admitted the rest of the cost: the call used these units too
			have = 0
		}
		if now < b.expires {
			b.units += have
		} else {
			// aged out during the call: no longer handed out, and its timer, fired during
			// the call, left them to this
			stale += have
		}
	}
	b.endFetch()
	b.mu.Unlock()

	if m := l.tel.meter(); m != nil && batch && cc.extra > 0 {
		m.batches.Add(ctx, 1, m.algOpts[c.alg.id]...)
		m.units.Add(ctx, cc.extra, m.algOpts[c.alg.id]...)
	}
	if stale > 0 && now < staleBy {
		// Not on this call's time; Close waits for it (wg.Add under rw, before Close's Wait).
		bs.wg.Add(1)
		go func() {
			defer bs.wg.Done()
			l.refundParked(context.Background(), b.key, b.spec, stale)
		}()
	}
	return res, err
}

// endFetch ends b's batch and wakes the calls waiting for it; b.mu is held.
func (b *budget) endFetch() {
	b.fetching = false
	if b.wake != nil {
		close(b.wake)
		b.wake = nil
	}
}

// nextBatch sizes a budget's next batch (for a call of cost 1) from its last one, of k units
// sent at fetched (0: none, or denied since), now that it is used up: it doubles, up to max,
// when the last one lasted at most a quarter of maxAge (twice as many units should then last at
// most half of it, and be handed out well before they age out); it halves when it lasted more
// than half; and it is one unit, as without leased budgets, when the key has been cold for
// maxAge, or was denied. So a key called less often than once per maxAge is decided by exactly
// one call per decision, and parks nothing.
func nextBatch(k, fetched, now, maxAge, maxBatch int64) int64 {
	lasted := now - fetched
	switch {
	case fetched == 0 || lasted > maxAge:
		return 1
	case lasted <= maxAge/4:
		return min(2*k, maxBatch)
	case lasted > maxAge/2:
		return max(1, k/2)
	}
	return k
}

// lifetime is when a batch sent at sent (ns, the Limiter's clock) stops being handed out, and
// until when its parked units may be given back, from its Result's ResetAfter.
//
// A bucket's units are handed out for maxAge and given back at any time: a refund adds tokens
// up to the capacity (or drains the leaky level down to empty), exactly undoing the batch's
// surplus. A window's units are handed out until the window they were counted in ends, if that
// comes first: the server counted them there, so the window's limit holds. Its end is derived
// from the batch's ResetAfter (the window's end for a fixed window, the next window's for a
// sliding one), measured from when the batch was sent, before the server ran it, and less a
// millisecond for the server's rounding up: never later than the true end. The server takes a
// window's refund off the window current when the refund runs, so a refund that ran in the next
// window would free units that window never counted: parked units are given back only until
// the Limiter's deadline before the window's end (a refund sent later is let go: its units come
// back with the next window, for a fixed one, or weigh a little longer, for a sliding one).
func (bs *budgets) lifetime(alg *algorithm, windowMs, sent int64, reset, deadline time.Duration) (expires, refundBy int64) {
	expires, refundBy = sent+bs.maxAge, math.MaxInt64
	var end time.Duration // from sent to the end of the window
	switch alg {
	case fixedWindowAlg, calendarAlg:
		end = reset - time.Millisecond
	case slidingWindowAlg:
		end = reset - time.Duration(windowMs)*time.Millisecond - time.Millisecond
	default:
		return expires, refundBy
	}
	return min(expires, sent+int64(end)), sent + int64(end-deadline)
}

// schedule gives b's parked units back after d, unless a later batch or a call has taken them
// first; b.mu is held.
func (b *budget) schedule(l *Limiter, d time.Duration) {
	if b.timer == nil {
		b.timer = time.AfterFunc(d, func() { l.ageOut(b) })
		return
	}
	b.timer.Reset(d)
}

// ageOut gives back b's parked units once they are too old to hand out.
func (l *Limiter) ageOut(b *budget) {
	bs := l.near.budgets
	bs.rw.RLock()
	defer bs.rw.RUnlock()
	if bs.closed {
		return // Close took them
	}
	b.mu.Lock()
	now := l.clock()
	if b.fetching || b.units == 0 || now < b.expires {
		// a batch in flight will see them; none left; or a later batch's, with its own timer
		b.mu.Unlock()
		return
	}
	n := b.units
	b.units = 0
	by := b.refundBy
	b.mu.Unlock()
	if now < by {
		l.refundParked(context.Background(), b.key, b.spec, n)
	}
}

// refundParked gives n parked units back to the server. Under ReturnError a refund that fails
// loses them: the limit under-admits until the state forgets them, never over-admits.
func (l *Limiter) refundParked(ctx context.Context, key string, sp spec, n int64) error {
	// route drops the key's cached denials once the refund is made
	if _, err := l.route(ctx, opRefund, key, call{spec: sp, cost: n}); err != nil {
		return err
	}
	if m := l.tel.meter(); m != nil {
		m.refunded.Add(ctx, n, m.algOpts[sp.alg.id]...)
	}
	return nil
}

// Close gives every unit parked by leased budgets (Options.BudgetBatch) back to the server, and
// waits for the batches and refunds in flight. From then on, every call goes to the server,
// one per decision, as without leased budgets and the denial cache; Close does not close the
// valkey.Client, which the caller owns. A second Close returns nil at once.
//
// A refund that fails or that ctx cuts short loses its units: the limit under-admits them,
// for at most the batch's maximum age or until its window ends, never over-admits. Close
// returns the refunds' errors, joined. A Limiter without leased budgets parks nothing: its
// Close only stops the denial cache.
//
// Close also tries once more, within ctx, the refunds that decisions across keys owe
// (OwedRefunds): those that fail are counted as lost and logged, as ever (see AllowAllN).
//
// With Options.Overrides, Close stops the overrides' background reader (a load under way is
// cut short) and waits for it within ctx; decisions keep the overrides last read, and
// SyncOverrides still reads them on demand.
//
// Close settles, within ctx, every Hold and Meter taken through the Limiter and not settled yet:
// a Meter at what it used (Meter.Close), any other Hold as its expiry would, only sooner: given
// back, or with Keep charged at what it holds. So no unit stays charged past a hold's expiry
// because its process closed (a settle that fails leaves that hold to its expiry). Their errors
// are joined to the others. Holds taken after Close are not settled by it.
func (l *Limiter) Close(ctx context.Context) error {
	if l.top != nil {
		l.top.close()
	}
	if l.ovr != nil {
		l.ovr.close(ctx)
	}
	holdsErr := l.closeHolds(ctx)
	l.flushOwed(ctx)
	if l.near == nil {
		return holdsErr
	}
	if d := l.near.denials; d != nil {
		d.shut.Store(true)
	}
	bs := l.near.budgets
	if bs == nil {
		return holdsErr
	}
	bs.rw.Lock()
	already := bs.closed
	bs.closed = true
	bs.isShut.Store(true)
	bs.rw.Unlock()
	if already {
		return holdsErr
	}
	bs.wg.Wait()
	type parked struct {
		b  *budget
		n  int64
		by int64
	}
	var all []parked
	for i := range bs.shards {
		sh := &bs.shards[i]
		sh.mu.Lock()
		for _, b := range sh.m {
			b.mu.Lock()
			if b.units > 0 {
				all = append(all, parked{b, b.units, b.refundBy})
				b.units = 0
			}
			if b.timer != nil {
				b.timer.Stop()
			}
			b.mu.Unlock()
		}
		sh.mu.Unlock()
	}
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	now := l.clock()
	for i, p := range all {
		if now >= p.by {
			continue // a window's, too close to its end to be given back (see lifetime)
		}
		wg.Go(func() { errs[i] = l.refundParked(ctx, p.b.key, p.b.spec, p.n) })
	}
	wg.Wait()
	return errors.Join(append(errs, holdsErr)...)
}

// Parked is how many units leased budgets hold in this process right now: taken from the
// server, not handed out yet (Options.BudgetBatch). Zero without leased budgets.
func (l *Limiter) Parked() int64 {
	if l.near == nil || l.near.budgets == nil {
		return 0
	}
	bs := l.near.budgets
	var n int64
	for i := range bs.shards {
		sh := &bs.shards[i]
		sh.mu.Lock()
		for _, b := range sh.m {
			b.mu.Lock()
			n += b.units
			b.mu.Unlock()
		}
		sh.mu.Unlock()
	}
	return n
}
