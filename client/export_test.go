package client

import (
	"context"
	"time"

	"github.com/rlfn/rlfn/internal/keys"
)

// WithClock is o with the Limiter's clock (Unix nanoseconds) replaced, so that the breaker's
// cooldown and the local limiters' windows run on a fake clock.
func WithClock(o Options, now func() int64) Options {
	o.clock = now
	return o
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

// KeyOf is Limiter.Key under prefix, escaped as Options.Prefix is: the key tests walk every
// prefix, the empty one included, without a Limiter each.
func KeyOf(prefix, key string, l Limit) string {
	s := l.spec()
	return string(keys.Append(nil, string(keys.AppendEscaped(nil, prefix)), key, s.alg.name, s.name))
}

// ReplyError is the error of a reply out of contract, for the tests that check one is.
type ReplyError = replyError

// Before13 makes the Limiter believe that key's node runs library 1.2.0, as a node that refused
// rl_multi's replies makes it for a cooldown: AllowAllEach then peeks each limit, as on such a
// node, for the tests of that path.
func (l *Limiter) Before13(key string) {
	ve := &VersionError{Node: "127.0.0.1:6379", Version: "1.2.0", Want: "1.3.0", Function: "rl_multi replies"}
	l.breakerOf(key).old.Store(&oldLibrary{err: ve, until: l.clock() + int64(time.Hour)})
}
