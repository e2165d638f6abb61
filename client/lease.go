package client

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// Concurrency caps how many leases on one key are held at once: how many requests of a
// principal are in flight (library 1.1.0). Every lease expires after Lease unless renewed, so
// a holder that crashes never keeps a slot.
type Concurrency struct {
	Limit   int64         // slots, 1 to 999999999999999
	Lease   time.Duration // how long a lease lasts unless renewed: whole milliseconds, 1ms to 10^11ms
	Reserve int64         // 0 to Limit, default 0 (none): slots only critical callers may take; a renewal is always admitted
	Name    string        // default "": the key without a name; set, a second concurrency limit for one principal (see Limit)
}

// Validate reports, as a *LimitError, why the library would refuse this limit.
func (c Concurrency) Validate() error {
	if err := checkInt("Concurrency.Limit", c.Limit, 1, maxInt); err != nil {
		return err
	}
	if _, err := milliseconds("Concurrency.Lease", c.Lease); err != nil {
		return err
	}
	return checkInt("Concurrency.Reserve", c.Reserve, 0, c.Limit)
}

func (c Concurrency) spec(id string) spec {
	return spec{concurrencyAlg, params{limit: c.Limit, ms: c.Lease.Milliseconds(), reserve: c.Reserve, name: c.Name, id: id}}
}

// maxLeaseID is the longest lease holder id the library takes, in bytes.
const maxLeaseID = 128

// Lease is one holder's slot in a Concurrency limit. Its methods are safe for concurrent use:
// a Renew running when Release is called finishes first, and one called after it is refused.
type Lease struct {
	lim   *Limiter
	key   string
	limit Concurrency
	id    string
	label string // the name of its decisions in metrics, spans and log lines, when given apart from the context

	mu       sync.RWMutex // Renew holds it shared, Release alone: no renewal overtakes the release
	released bool
}

// ErrLeaseReleased is returned by Renew of a Lease already released: a renewal would take a
// new slot for a holder that is done, and leak it until it expires.
var ErrLeaseReleased = errors.New("client: lease already released")

// ID is the lease holder's id.
func (le *Lease) ID() string { return le.id }

// Renew extends the lease to Lease from now. If it had expired and its slot was taken, it is
// denied (the holder lost its slot); if it had expired and a slot is free, it takes it again
// (under the Reserve, unless ctx is Critical). A renewal of a held lease is always admitted.
// After Release, it returns ErrLeaseReleased.
func (le *Lease) Renew(ctx context.Context) (Result, error) {
	le.mu.RLock()
	defer le.mu.RUnlock()
	if le.released {
		return Result{}, ErrLeaseReleased
	}
	c := call{spec: le.limit.spec(le.id), cost: 1}
	c.label = le.label
	le.lim.override(&c, le.key)
	c.judgeReserve(ctx)
	return le.lim.run(ctx, opAcquire, le.key, c)
}

// Release frees the lease's slot: Allowed reports whether it still held one (false when it had
// expired, or was released already). Remaining is the free slots after it. A release is not
// retried; one that fails may be called again. Once one has succeeded, the Lease is done:
// Renew returns ErrLeaseReleased.
//
// The slot is owed whatever became of the work: Release runs even when ctx is canceled or
// past its deadline (defer lease.Release(r.Context()) frees the slot of a request whose client
// went away), bounded by the Limiter's deadline (Options.Deadline) alone.
func (le *Lease) Release(ctx context.Context) (Result, error) {
	le.mu.Lock()
	defer le.mu.Unlock()
	ctx = context.WithoutCancel(ctx)
	c := call{spec: le.limit.spec(le.id), cost: 1}
	c.label = le.label
	le.lim.override(&c, le.key)
	res, err := le.lim.run(ctx, opRelease, le.key, c)
	le.released = le.released || err == nil
	return res, err
}

// localConcurrency is rl_concurrency: a semaphore of Limit / instances slots, each held by one
// id until it expires.
type localConcurrency struct{}

// live drops the expired leases; it returns the free slots.
func (localConcurrency) live(st *localState, limit, now int64) int64 {
	for id, exp := range st.leases {
		if exp <= now {
			delete(st.leases, id)
		}
	}
	return limit - int64(len(st.leases))
}

// lastExpiry is when the last lease ends (ns), or now without one.
func (localConcurrency) lastExpiry(st *localState, now int64) int64 {
	last := now
	for _, exp := range st.leases {
		last = max(last, exp)
	}
	return last
}

func (a localConcurrency) decide(st *localState, p params, cost, reserve, instances, now int64, write bool) Result {
	limit := share(p.limit, instances)
	free := a.live(st, limit, now)
	_, held := st.leases[p.id]
	r := Result{Limit: limit, Remaining: max(0, free-reserve), Source: FromFallback}
	if !held && 1+reserve > free {
		r.ResetAfter = time.Duration(a.lastExpiry(st, now) - now)
		if 1+reserve > limit {
			r.RetryAfter = Never
			return r
		}
		// the wait until enough leases have expired for 1 + reserve slots to be free
		need := 1 + reserve - free
		exps := make([]int64, 0, len(st.leases))
		for _, exp := range st.leases {
			exps = append(exps, exp)
		}
		slices.Sort(exps)
		r.RetryAfter = time.Duration(exps[need-1] - now)
		return r
	}
	r.Allowed = true
	if write {
		if st.leases == nil {
			st.leases = map[string]int64{}
		}
		st.leases[p.id] = now + p.ms*int64(time.Millisecond)
		st.expires = a.lastExpiry(st, now)
		if !held {
			free--
		}
		r.Remaining = max(0, free-reserve)
	}
	r.ResetAfter = time.Duration(a.lastExpiry(st, now) - now)
	return r
}

// refund releases p.id's lease.
func (a localConcurrency) refund(st *localState, p params, _, instances, now int64) Result {
	limit := share(p.limit, instances)
	free := a.live(st, limit, now)
	_, held := st.leases[p.id]
	if held {
		delete(st.leases, p.id)
		free++
		st.expires = a.lastExpiry(st, now)
	}
	return Result{Allowed: held, Limit: limit, Remaining: free, ResetAfter: time.Duration(a.lastExpiry(st, now) - now), Source: FromFallback}
}
