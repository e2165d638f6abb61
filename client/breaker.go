package client

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/rlfn/rlfn/versions"
)

// breakerState is where a circuit breaker stands.
type breakerState int32

const (
	// closed: calls go to the server; consecutive failures are counted.
	closed breakerState = iota
	// open: no call goes to the server until the cooldown has passed since it opened.
	open
	// halfOpen: one call, the probe, is on its way to the server; the others are not sent.
	halfOpen
)

func (s breakerState) String() string {
	switch s {
	case closed:
		return "closed"
	case open:
		return "open"
	case halfOpen:
		return "half_open"
	}
	return "unknown"
}

// breaker is a circuit breaker, a pure state machine: it never reads a clock itself, every
// method that needs the time is given it (nanoseconds on any monotonic scale), so tests drive
// it with a fake clock.
//
// The closed state, where a healthy server keeps it, costs one atomic load per call and one
// more per success; the open state, where a dead server keeps it, costs two atomic loads and a
// clock reading, and the probe is chosen by a compare-and-swap: neither takes a lock, so the
// calls of a dead node do not queue on a mutex. Only transitions (opening, closing) take it.
type breaker struct {
	threshold int64 // consecutive failures that open it
	cooldown  int64 // nanoseconds from opening to the probe

	state    atomic.Int32 // a breakerState
	failures atomic.Int64 // consecutive failures while closed
	openedAt atomic.Int64 // when it last opened: stored before the state that reads it

	mu sync.Mutex // serializes transitions

	degradedState // what the Limiter's notices know of its node (notice.go)

	// old is set when the shard's node answered that its library is older than a call needs:
	// calls that need more are decided by the Fallback without asking it, but for one call a
	// cooldown (as the breaker's probe), so that a node still on 1.0.0 costs one refused call
	// and one version lookup a cooldown, not two round trips per decision (and one each per
	// call in flight when it is first found), and a deploy is seen within a cooldown.
	old atomic.Pointer[oldLibrary]
}

// oldLibrary is a breaker's memory of its node's library being too old.
type oldLibrary struct {
	err   *VersionError
	until int64
}

// tooOld returns the error its node answered a call that needed a newer library, for a call
// that needs want, unless the node's release has it (a node on 1.1.0 serves 1.1 calls while
// it refuses 1.2 ones), or that was a cooldown ago or more: then one call, the first to get
// here, goes to the node again (the memory moves a cooldown on for the others), and nil lets
// it.
func (b *breaker) tooOld(now int64, want string) *VersionError {
	o := b.old.Load()
	switch {
	case o == nil:
		return nil
	case o.err.Version != "" && versions.Valid(o.err.Version) && versions.Compare(o.err.Version, want) >= 0:
		return nil
	case now < o.until:
		return o.err
	case b.old.CompareAndSwap(o, &oldLibrary{err: o.err, until: now + b.cooldown}):
		return nil
	}
	return o.err
}

// forgetOld learns from a call that needed want and succeeded: the node runs want at least.
// When that is as much as the call it refused needed, it is forgotten (a deploy reached it);
// else the memory keeps that the node runs want, so that tooOld lets those calls through (a
// 1.0 node that refused a 1.2 call and was then upgraded to 1.1 serves 1.1 calls at once).
func (b *breaker) forgetOld(want string) {
	o := b.old.Load()
	switch {
	case o == nil:
	case versions.Compare(want, o.err.Want) >= 0:
		b.old.CompareAndSwap(o, nil)
	case o.err.Version == "" || !versions.Valid(o.err.Version) || versions.Compare(o.err.Version, want) < 0:
		e := *o.err
		e.Version = want
		b.old.CompareAndSwap(o, &oldLibrary{err: &e, until: o.until})
	}
}

func newBreaker(threshold int, cooldown time.Duration) *breaker {
	return &breaker{threshold: int64(threshold), cooldown: int64(cooldown)}
}

func (b *breaker) current() breakerState { return breakerState(b.state.Load()) }

// acquire reports whether a call may go to the server, and whether it is the probe, the one
// call of the half-open state. now is read only when the breaker is not closed.
func (b *breaker) acquire(now func() int64) (pass, probe bool) {
	switch b.current() {
	case closed:
		return true, false
	case open:
		// openedAt is stored before the state: an open state read here has its time.
		at := b.openedAt.Load()
		if now()-at >= b.cooldown && b.state.CompareAndSwap(int32(open), int32(halfOpen)) {
			if b.openedAt.Load() == at {
				return true, true
			}
			// Between the load and the swap another call probed, failed and opened it again:
			// its cooldown runs from then. The half-open state is this call's, so it alone
			// may put it back.
			b.state.Store(int32(open))
		}
	}
	return false, false
}

// success records a call the server answered. Only the probe closes an open breaker: a call
// sent before the breaker opened says nothing about the server now. It returns the state
// entered, or -1 for none.
func (b *breaker) success(probe bool) breakerState {
	if !probe {
		// Load before Store: a healthy server makes every call a success, and a store on
		// every call would bounce the cache line between cores.
		if b.failures.Load() != 0 {
			b.failures.Store(0)
		}
		return -1
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures.Store(0)
	b.state.Store(int32(closed))
	return closed
}

// failure records a call the server did not answer (or answered with a failure) at now. The
// probe's failure opens the breaker again for a full cooldown. It returns the state entered,
// or -1 for none.
func (b *breaker) failure(probe bool, now int64) breakerState {
	if !probe && b.failures.Add(1) < b.threshold {
		return -1
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !probe && b.current() != closed {
		// Another call opened it already; the cooldown runs from then.
		return -1
	}
	b.openedAt.Store(now)
	b.failures.Store(0)
	b.state.Store(int32(open))
	return open
}

// release returns the probe's slot without a verdict (its caller gave up): the breaker is open
// again with its old opening time, so the next call probes at once.
func (b *breaker) release(probe bool) breakerState {
	if !probe {
		return -1
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.state.Store(int32(open))
	return open
}

// retryAfter is when a call could next reach the server: the time left until the probe when
// open (at least a millisecond, as the probe may fail), the cooldown otherwise.
func (b *breaker) retryAfter(now int64) time.Duration {
	if b.current() == closed {
		return time.Duration(b.cooldown)
	}
	return max(time.Duration(b.openedAt.Load()+b.cooldown-now), time.Millisecond)
}
