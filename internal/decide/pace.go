package decide

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/rlfn/rlfn/client"
)

// Pacer paces a service's own outgoing calls through a limit, and bounds the waits of a retry
// after the server said when: httplimit.Transport's and grpclimit's client interceptors.
type Pacer struct {
	Lim     Decider
	Limit   client.Limit
	MaxWait time.Duration
	Jitter  float64 // 0 to 1: the largest random share added to a server's wait
	Now     func() time.Time
	Sleep   func(ctx context.Context, d time.Duration) error
	Rand    func() float64
}

// The defaults of pacing and retries, which httplimit's Transport and grpclimit's Client export
// as their own.
const (
	DefaultMaxRetries = 3
	DefaultMaxWait    = time.Minute
	DefaultJitter     = 0.2
)

// NewPacer is the Pacer of a transport's options as given, the zero values their defaults:
// MaxWait DefaultMaxWait, Jitter DefaultJitter (negative: none), the real clock, sleep and
// randomness. The caller has refused what cannot be valid (a negative MaxWait, a Jitter above 1).
func NewPacer(lim Decider, limit client.Limit, maxWait time.Duration, jitter float64, now func() time.Time,
	sleep func(context.Context, time.Duration) error, rnd func() float64) Pacer {
	p := Pacer{Lim: lim, Limit: limit, MaxWait: maxWait, Jitter: jitter, Now: now, Sleep: sleep, Rand: rnd}
	if p.MaxWait == 0 {
		p.MaxWait = DefaultMaxWait
	}
	switch {
	case p.Jitter == 0:
		p.Jitter = DefaultJitter
	case p.Jitter < 0:
		p.Jitter = 0
	}
	if p.Now == nil {
		p.Now = time.Now
	}
	if p.Sleep == nil {
		p.Sleep = Sleep
	}
	if p.Rand == nil {
		p.Rand = rand.Float64
	}
	return p
}

// Retries is a MaxRetries option as given: 0 is DefaultMaxRetries, a negative one none.
func Retries(n int) int {
	switch {
	case n == 0:
		return DefaultMaxRetries
	case n < 0:
		return 0
	}
	return n
}

// Sleep waits d, or returns ctx's error when it ends first.
func Sleep(ctx context.Context, d time.Duration) error {
	if Hold(ctx.Done(), d) {
		return nil
	}
	return ctx.Err()
}

// Pace waits until the limiter admits a call of key, within ctx. A wait it will not start
// (longer than MaxWait, past ctx's deadline, or forever) is returned with the reason, for the
// caller's error; err is the limiter's (slept false) or the wait's (slept true).
func (p *Pacer) Pace(ctx context.Context, key string) (wait time.Duration, reason string, slept bool, err error) {
	for {
		res, err := p.Lim.Allow(ctx, key, p.Limit)
		if err != nil {
			return 0, "", false, err
		}
		wait := res.Delay
		if !res.Allowed {
			// A refusal is never a licence to send, even one whose wait rounded to nothing.
			wait = max(res.RetryAfter, time.Millisecond)
		}
		if wait <= 0 {
			return 0, "", false, nil
		}
		switch {
		case wait == client.Never:
			return wait, "admits no request: its cost is above the limit", false, nil
		case wait > p.MaxWait:
			return wait, "is longer than MaxWait " + p.MaxWait.String(), false, nil
		case !p.MayWait(ctx, wait):
			return wait, "passes the request's deadline", false, nil
		}
		if err := p.Sleep(ctx, wait); err != nil {
			return wait, "", true, err
		}
		if res.Allowed {
			return 0, "", false, nil // admitted with a delay, now served
		}
	}
}

// MayWait reports whether a wait of d fits within MaxWait and ctx's deadline.
func (p *Pacer) MayWait(ctx context.Context, d time.Duration) bool {
	if d > p.MaxWait {
		return false
	}
	deadline, ok := ctx.Deadline()
	return !ok || !p.Now().Add(d).After(deadline)
}

// Room is the longest wait within MaxWait and ctx's deadline.
func (p *Pacer) Room(ctx context.Context) time.Duration {
	if deadline, ok := ctx.Deadline(); ok {
		return min(p.MaxWait, deadline.Sub(p.Now()))
	}
	return p.MaxWait
}

// JitterOf is the random share added to a wait of d: up to Jitter of d, or of floor when d is
// shorter (a wait said in whole seconds spreads over at least one).
func (p *Pacer) JitterOf(d, floor time.Duration) time.Duration {
	return time.Duration(p.Rand() * p.Jitter * float64(max(d, floor)))
}

// RetryWait is the wait before retrying after a server asked for d: d plus its jitter, cut at
// the room left (MaxWait, the deadline) so that a retry within the server's wait is worth more
// than spreading; ok is false when d itself does not fit.
func (p *Pacer) RetryWait(ctx context.Context, d, floor time.Duration) (time.Duration, bool) {
	if !p.MayWait(ctx, d) {
		return 0, false // also keeps the jitter's sum from overflowing
	}
	return min(d+p.JitterOf(d, floor), p.Room(ctx)), true
}
