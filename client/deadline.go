package client

import (
	"context"
	"sync/atomic"
	"time"
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
	nt.bg = &deadlineCtx{Context: context.Background(), t: nt}
	time.AfterFunc(time.Duration(n)*tickResolution-now, func() { close(nt.done) })
	// Another call may have installed a tick meanwhile: both are correct, this one only cost
	// a timer.
	ds.cur.CompareAndSwap(t, nt)
	return nt
}

// deadlineCtx is the caller's context with a tick's deadline. Its Done is the tick's alone, so
// it is only used for a caller's context that cannot be canceled (Done is nil, as
// context.Background's): watching a cancelable one too would take a goroutine, and
// withDeadline gives such a context WithDeadline's, which ends the call at once when canceled.
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
	select {
	case <-c.t.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// withDeadline returns ctx bounded by the Limiter's deadline: ctx itself when its own deadline
// comes first. A call whose caller cancels ctx ends at once, with context.Canceled; a context
// that cannot be canceled gets the cheap shared tick instead of a timer of its own. The
// returned function releases the context's timer.
func (l *Limiter) withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	now := time.Since(clockBase)
	if d, ok := ctx.Deadline(); ok && d.Sub(clockBase) <= now+l.deadline {
		return hiddenDeadline{ctx}, noCancel
	}
	if ctx.Done() != nil {
		dctx, cancel := context.WithDeadline(ctx, clockBase.Add(now+l.deadline))
		return hiddenDeadline{dctx}, cancel
	}
	t := l.deadlines.after(now, l.deadline)
	if ctx == context.Background() || ctx == context.TODO() {
		return t.bg, noCancel
	}
	return &deadlineCtx{Context: ctx, t: t}, noCancel
}

func noCancel() {}

// hiddenDeadline is a cancelable context that reports no deadline, for valkey-go: a lone call
// (no other in flight on its connection) whose context has a deadline is sent synchronously,
// bounded by that deadline set on the connection, and its context's Done is not watched, so a
// cancel would not end it. Without a deadline, valkey-go queues the call and returns at Done,
// which fires at the deadline and at the caller's cancel alike, and Err tells which.
type hiddenDeadline struct{ context.Context }

func (hiddenDeadline) Deadline() (time.Time, bool) { return time.Time{}, false }
