package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"
)

// tickResolution is how much later than its deadline a call may be cut off: the calls whose
// deadlines fall in one tick share one timer.
const tickResolution = time.Millisecond

// deadlines gives calls their deadline at a fraction of context.WithTimeout's cost (a timer,
// a channel and four allocations, about a microsecond, more than the rest of a call): the
// calls whose deadlines fall in one millisecond share one timer and one Done channel, so a
// call costs one small allocation.
type deadlines struct {
	cur atomic.Pointer[tick]
}

// tick is a shared deadline: done is closed at `at`.
type tick struct {
	n    int64     // at, in tickResolutions since clockBase
	at   time.Time // carries a monotonic reading, as clockBase does
	done chan struct{}
	// bg is context.Background with this tick's deadline, shared by the calls made with
	// context.Background (or TODO), which carries no value: they cost no allocation.
	bg *deadlineCtx

	// The calls with a cancelable context whose deadline is this tick, canceled when it
	// fires: one timer for them all instead of one each (context.WithDeadline's), about
	// half of such a call's cost of a deadline. A call that ends first frees its slot, which
	// the tick's next call takes: the list is as long as the most calls in flight at once,
	// and is made as long as the previous tick's at once (hint), so that it seldom grows.
	mu    sync.Mutex
	fired bool
	slots []watchSlot
	free  int // the first free slot, -1 for none; each free slot names the next
	hint  int
	used  atomic.Int32 // len(slots), for the next tick's hint
}

// watchSlot is a watched call's cancel, or a free slot (cancel nil).
type watchSlot struct {
	cancel context.CancelCauseFunc
	next   int
}

// errTickDeadline is the cause a tick cancels its calls with: their context's Err is then
// context.DeadlineExceeded (see cancelableCtx), not Canceled, which the caller's cancel is.
var errTickDeadline = fmt.Errorf("client: the Limiter's deadline: %w", context.DeadlineExceeded)

// watch cancels cancel with errTickDeadline when t fires (at once if it has), and returns
// the slot that unwatch frees.
func (t *tick) watch(cancel context.CancelCauseFunc) int {
	t.mu.Lock()
	if t.fired {
		t.mu.Unlock()
		cancel(errTickDeadline)
		return -1
	}
	if t.slots == nil {
		t.slots, t.free = make([]watchSlot, 0, max(8, t.hint)), -1
	}
	slot := t.free
	if slot >= 0 {
		t.free = t.slots[slot].next
		t.slots[slot].cancel = cancel
	} else {
		slot = len(t.slots)
		t.slots = append(t.slots, watchSlot{cancel: cancel})
		t.used.Store(int32(len(t.slots)))
	}
	t.mu.Unlock()
	return slot
}

// unwatch frees a slot of watch's, so that the tick holds no call that has ended.
func (t *tick) unwatch(slot int) {
	if slot < 0 {
		return
	}
	t.mu.Lock()
	if !t.fired {
		t.slots[slot] = watchSlot{next: t.free}
		t.free = slot
	}
	t.mu.Unlock()
}

// over reports whether t has fired.
func (t *tick) over() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// fire closes done and cancels the calls watched.
func (t *tick) fire() {
	close(t.done)
	t.mu.Lock()
	t.fired = true
	slots := t.slots
	t.slots = nil
	t.mu.Unlock()
	for _, s := range slots {
		if s.cancel != nil {
			s.cancel(errTickDeadline)
		}
	}
}

// after returns the tick that ends d after now (since clockBase), rounded up to
// tickResolution.
func (ds *deadlines) after(now, d time.Duration) *tick {
	n := int64((now + d + tickResolution - 1) / tickResolution)
	t := ds.cur.Load()
	if t != nil && t.n == n {
		return t
	}
	nt := &tick{n: n, at: clockBase.Add(time.Duration(n) * tickResolution), done: make(chan struct{})}
	if t != nil {
		nt.hint = int(t.used.Load())
	}
	nt.bg = &deadlineCtx{Context: context.Background(), t: nt}
	time.AfterFunc(time.Duration(n)*tickResolution-now, nt.fire)
	// Another call may have installed a tick meanwhile: both are correct, this one only cost
	// a timer.
	ds.cur.CompareAndSwap(t, nt)
	return nt
}

// deadlineCtx is the caller's context with a tick's deadline. Its Done is the tick's alone, so
// it is only used for a caller's context that cannot be canceled (Done is nil, as
// context.Background's): a cancelable one gets a cancelableCtx.
type deadlineCtx struct {
	context.Context // the caller's: its values and its Err
	t               *tick
}

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.t.at, true }

func (c *deadlineCtx) Done() <-chan struct{} { return c.t.done }

func (c *deadlineCtx) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if c.t.over() {
		return context.DeadlineExceeded
	}
	return nil
}

// withDeadline returns ctx bounded by the Limiter's deadline: ctx itself when its own deadline
// comes first. A call whose caller cancels ctx ends at once, with context.Canceled; a context
// that cannot be canceled gets the cheap shared tick, a cancelable one a child canceled by the
// tick. The returned release frees what the context holds once the call has ended. now is
// time.Since(clockBase) if the caller read it, else 0.
func (l *Limiter) withDeadline(ctx context.Context, now time.Duration) (context.Context, release) {
	if now <= 0 {
		now = time.Since(clockBase)
	}
	d, hasDeadline := ctx.Deadline()
	if hasDeadline && d.Sub(clockBase) <= now+l.deadline {
		return hiddenDeadline{ctx}, release{}
	}
	t := l.deadlines.after(now, l.deadline)
	if ctx.Done() != nil {
		// context.WithCancelCause and the tick's timer, rather than context.WithDeadline's
		// timer of its own: 4 allocations instead of 6, and half the time.
		cctx, cancel := context.WithCancelCause(ctx)
		rel := release{t: t, slot: t.watch(cancel), cancel: cancel}
		if !hasDeadline {
			// No deadline to hide (see hiddenDeadline): valkey-go gets the child itself, and
			// the call one allocation less than with cancelableCtx (a request's context has
			// none, as a rule). Its Err is then Canceled when the tick fires: result says it
			// as the deadline's.
			rel.bare = cctx
			return cctx, rel
		}
		return cancelableCtx{cctx, t}, rel
	}
	if ctx == context.Background() || ctx == context.TODO() {
		return t.bg, release{}
	}
	return &deadlineCtx{Context: ctx, t: t}, release{}
}

// release ends a call's context from withDeadline: a value, not a func, so that it costs no
// allocation.
type release struct {
	t      *tick
	slot   int
	cancel context.CancelCauseFunc
	bare   context.Context // the context of the call, when it is cancel's child without a wrapper
}

// result is valkey-go's reply to a call on the context withDeadline returned: with the error
// of a bare context that the tick canceled (context.Canceled) changed to
// context.DeadlineExceeded, as cancelableCtx's Err says it, and as a caller's own cancel is
// not.
func (r release) result(res valkey.ValkeyResult) valkey.ValkeyResult {
	if r.bare == nil {
		return res
	}
	if err := res.Error(); err != nil && errors.Is(err, context.Canceled) && context.Cause(r.bare) == errTickDeadline {
		return valkey.NewErrorResult(context.DeadlineExceeded)
	}
	return res
}

// wrapped is ctx, the context withDeadline returned, as further calls of its caller get it: a
// bare child wrapped as cancelableCtx, whose Err says DeadlineExceeded when the tick fired, so
// that valkey-go returns that (see result). For the rare calls after a failed one, such as the
// version check: the wrapper costs an allocation.
func (r release) wrapped(ctx context.Context) context.Context {
	if r.bare == nil {
		return ctx
	}
	return cancelableCtx{r.bare, r.t}
}

func (r release) release() {
	if r.cancel != nil {
		r.t.unwatch(r.slot)
		r.cancel(nil)
	}
}

// hiddenDeadline is a cancelable context that reports no deadline, for valkey-go: a lone call
// (no other in flight on its connection) whose context has a deadline is sent synchronously,
// bounded by that deadline set on the connection, and its context's Done is not watched, so a
// cancel would not end it. Without a deadline, valkey-go queues the call and returns at Done,
// which fires at the deadline and at the caller's cancel alike, and Err tells which.
type hiddenDeadline struct{ context.Context }

func (hiddenDeadline) Deadline() (time.Time, bool) { return time.Time{}, false }

// cancelableCtx is a cancelable caller's context with a deadline later than the Limiter's,
// for a call, canceled by the caller and by its tick, whose deadline it hides from valkey-go as
// hiddenDeadline does. Its Err is context.DeadlineExceeded once the tick has canceled it, as a
// deadline's.
type cancelableCtx struct {
	context.Context // context.WithCancelCause's child of the caller's
	t               *tick
}

func (cancelableCtx) Deadline() (time.Time, bool) { return time.Time{}, false }

func (c cancelableCtx) Err() error {
	err := c.Context.Err()
	if err != nil && context.Cause(c.Context) == errTickDeadline {
		return context.DeadlineExceeded
	}
	return err
}
