package client

import (
	"context"
	"errors"
	"os"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/internal/keys"

	"github.com/rlfn/rlfn/internal/needs"
)

// resilience is what keeps a Limiter deciding when its server cannot: a circuit breaker per
// node (breaker.go, nodes.go), what decides in its place (the Fallback), and for
// LocalFallback the in-process limiters (local.go).
type resilience struct {
	breakers  *breakers
	fallback  Fallback
	local     *localStore // LocalFallback only
	instances int64       // Options.Instances, LocalFallback's share of each limit
}

// wants is the library release c needs for op beyond 1.0.0, or "" for none: 1.2.0 for a
// calendar, a block and a Penalty; 1.1.0 for a reserve, a refund, a concurrency lease, or a
// call that must be refundable.
func wants(op operation, c call) string {
	switch {
	case c.alg.since == needs.V12 || c.penalty > 0 && (op == opAllow || op == opPeek):
		return needs.V12
	case op == opRefund || op == opRelease || c.alg == concurrencyAlg || c.refundable || c.reserve > 0:
		return needs.V11
	}
	return ""
}

// needs names what of library 1.1.0 c relies on for op, for a *VersionError: the function, its
// reserve argument, or the refund that AllowAll may have to make.
func (c *call) needs(op operation) string {
	switch {
	case c.refundable:
		return c.alg.refund
	case c.sendsReserve(op) && c.alg != concurrencyAlg:
		return c.function(op) + " reserve"
	}
	return c.function(op)
}

// forCall is the *VersionError a breaker remembered (another call's) as the error of a call
// that needs what, of release want.
func forCall(err error, what, want string) error {
	ve, ok := err.(*VersionError)
	if !ok || ve.Function == what && ve.Want == want {
		return err
	}
	v := *ve
	v.Function, v.Want = what, want
	return &v
}

// fail applies the Fallback to a call the server could not decide; b is the call's server key
// and clock reading, when made.
func (l *Limiter) fail(ctx context.Context, op operation, key string, c call, b built, kind errKind, err error) (Result, error) {
	if kind == kindVersion && op == opAllow && c.refundable && c.reserve == 0 && c.alg.since == needs.V10 && c.penalty == 0 && l.fallback != ReturnError {
		// The node can decide this limit, only not refundably: AllowAll does (decideAcross,
		// olderNode), rather than the Fallback. (ReturnError wants the error: the decision
		// would not be all or nothing as asked.)
		return Result{}, err
	}
	l.tel.countError(ctx, c.alg.id, op, kind)
	l.fellBack(ctx, key, &c, kind)
	if l.fallback == ReturnError {
		return Result{}, err
	}
	r := l.fallbackResult(op, key, c, b)
	l.tel.decided(ctx, l.tel.series(ctx, c.alg.id, &c.spec), op, r, fallbackSrc[l.fallback])
	return r, nil
}

// fallbackResult is the decision of the Limiter's Fallback (not ReturnError) on c, with the
// call's server key and clock reading when it made them (b), else its own.
func (l *Limiter) fallbackResult(op operation, key string, c call, b built) Result {
	if b.now == 0 {
		b.now = l.clock()
	}
	limit, need := c.limit, c.cost+c.reserve
	giveBack := op == opRefund || op == opRelease
	var r Result
	switch l.fallback {
	case FailOpen:
		r = Result{Allowed: true, Limit: limit, Remaining: max(0, limit-need), Source: FromFallback}
		switch {
		case giveBack:
			r.Remaining = limit
		case need > limit:
			r = Result{Limit: limit, Remaining: max(0, limit-c.reserve), RetryAfter: Never, Source: FromFallback}
		}
	case FailClosed:
		wait := l.breakerOf(key).retryAfter(b.now)
		r = Result{Limit: limit, RetryAfter: wait, ResetAfter: wait, Source: FromFallback}
		switch {
		case giveBack:
			r = Result{Allowed: true, Limit: limit, Source: FromFallback}
		case need > limit:
			r.RetryAfter = Never
		}
	case LocalFallback:
		var kb [192]byte
		if b.key == nil {
			b.key = keys.Append(kb[:0], l.prefix, key, c.alg.name, c.name)
		}
		if giveBack {
			r = l.local.refund(b.key, c, l.instances, b.now)
		} else {
			r = l.local.decide(b.key, c, l.instances, b.now, op != opPeek)
		}
	}
	return r
}

// classify tells what err means; ctx is the caller's.
func classify(ctx context.Context, err error) errKind {
	var le *LibraryError
	var re *replyError
	var ve *VersionError
	switch {
	case errors.As(err, &le):
		return kindLibrary
	case errors.As(err, &ve) && ve.Version != "":
		return kindVersion
	case errors.Is(err, ErrNotLoaded):
		return kindNotLoaded
	case errors.As(err, &re):
		return kindReply
	case errors.Is(ctx.Err(), context.Canceled):
		return kindCanceled
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return kindTimeout
	}
	// replyErr wraps the server's error, and IsValkeyErr does not unwrap
	var vke *valkey.ValkeyError
	if errors.As(err, &vke) {
		if vke.IsClusterDown() || vke.IsTryAgain() {
			return kindClusterDown
		}
		return kindServer
	}
	return kindUnreachable
}
