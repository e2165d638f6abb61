package decide

import (
	"sync"
	"sync/atomic"
	"time"
)

// Clock reads the two times the quota values need, in Unix nanoseconds.
type Clock struct {
	// Now is the clock of a reset sent as a Unix time: coarse, a tick ahead.
	Now func() int64
	// Wall is exact: the Calendar window holding now. The coarse clock, a tick ahead, would put
	// a call made just before a window's end in the next window.
	Wall func() int64
}

// NewClock is now's Clock, or without now (nil) the coarse clock and time.Now.
func NewClock(now func() time.Time) Clock {
	if now != nil {
		f := func() int64 { return now().UnixNano() }
		return Clock{Now: f, Wall: f}
	}
	return Clock{Now: coarseNanos, Wall: func() int64 { return time.Now().UnixNano() }}
}

// coarseTick is how often the coarse clock reads the wall clock.
const coarseTick = 100 * time.Millisecond

// coarse is the default clock of a reset sent as a Unix time: the wall time, read by one
// goroutine every coarseTick for the whole process. Reading the clock on each request (60 to
// 70ns on a virtual machine without a fast clock source) was a tenth of the middleware's whole
// cost, for a value in whole seconds.
var coarse struct {
	once  sync.Once
	nanos atomic.Int64 // Unix nanoseconds of the last tick
}

// CoarseNanos is the Unix time in nanoseconds, up to a tick (100ms) ahead: a reset computed
// from it is never before the true one, at most a tick later, unless the goroutine is held up
// longer than a tick (a starved process), when it can be early by the excess. The goroutine is
// started by the first call, and lives as long as the process (a goroutine-leak checker in
// tests sees it: give a clock of your own there).
func CoarseNanos() int64 { return coarseNanos() }

func coarseNanos() int64 {
	coarse.once.Do(func() {
		coarse.nanos.Store(time.Now().UnixNano())
		go func() {
			// The clock read when the tick is received, not the tick's own time: a goroutine
			// that ran late would store a time already stale by its delay.
			for range time.Tick(coarseTick) {
				coarse.nanos.Store(time.Now().UnixNano())
			}
		}()
	})
	return coarse.nanos.Load() + int64(coarseTick)
}

// Hold waits d, and reports false if done is closed first.
func Hold(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}
