package client

import (
	"context"
	"time"
)

// WithClock replaces the Limiter's clock (Unix nanoseconds) in tests, so that the breaker's
// cooldown and the local limiters' windows run on a fake clock.
func WithClock(now func() int64) Option {
	return func(o *options) { o.clock, o.fakeClock = now, true }
}

// LocalKeys is how many keys the Limiter's local fallback holds.
func (l *Limiter) LocalKeys() int { return l.local.len() }

// SlotsKnown reports whether a cluster Limiter has read the cluster's slots.
func (l *Limiter) SlotsKnown() bool { return l.breakers.table.Load() != nil }

// KeySlot is the hash slot of key's state keys.
var KeySlot = keySlot

// CallDeadline is the deadline of a call's context as valkey-go gets it: a cancelable one
// hides it from valkey-go (see hiddenDeadline), and this reads it anyway. A cancelable
// caller's context without a deadline gets a bare child, which reports none: the tick cancels
// it.
func CallDeadline(ctx context.Context) (time.Time, bool) {
	switch c := ctx.(type) {
	case hiddenDeadline:
		return c.Context.Deadline()
	case cancelableCtx:
		return c.t.at, true
	}
	return ctx.Deadline()
}
