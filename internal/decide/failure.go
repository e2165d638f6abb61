package decide

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rlfn/rlfn/client"
)

// Failure is why a call was left without a decision, which decides its answer and its log
// line.
type Failure uint8

const (
	// Unavailable: the limiter could not decide (its server unreachable, a deadline passed, an
	// open circuit, a library absent or too old). A *client.Limiter returns these only under
	// client.ReturnError; its other policies decide such a call themselves.
	Unavailable Failure = iota
	// Misconfigured: a limit that cannot be valid (a bad policy, a Limit the client refuses, a
	// key holding foreign state, a Limiter that cannot serve the policy). No retry helps until
	// the service is fixed, and failing open would hide the bug.
	Misconfigured
	// RefusedKey: the call's principal is empty or longer than the Limiter takes: the caller's
	// fault.
	RefusedKey
	// ShadowKey: the key of a shadow limit failed; the call is served (logged only).
	ShadowKey
	// ShadowFailed: a shadow decision failed; the call was served (logged only).
	ShadowFailed
	// Unreleased: a lease's release failed after the call; the lease expires by itself
	// (logged only).
	Unreleased
	// Unsettled: the settlement of a call counted by its outcome (a refund, or a charge)
	// failed; it is not retried (logged only).
	Unsettled
)

// Classify is the failure of an error that left a call without a decision; emptyKey is the
// caller's error of an empty key, and misconfigured reports its own errors of a policy it
// cannot serve.
func Classify(err, emptyKey error, misconfigured func(error) bool) Failure {
	var (
		ke  *client.KeyError
		le  *client.LimitError
		lib *client.LibraryError
	)
	switch {
	case errors.As(err, &ke) || errors.Is(err, emptyKey):
		return RefusedKey
	case misconfigured(err) || errors.As(err, &le) || errors.As(err, &lib):
		return Misconfigured
	}
	return Unavailable
}

// maxThrottles bounds the throttles of an ErrorLog: policy names come from the service's code,
// but a policy function may make them up per call.
const maxThrottles = 256

// ErrorLog logs the errors that left calls without a decision, at most one a second per
// failure and, for a misconfigured policy, per policy: a dead server's errors share one line a
// second, and one route's mistake never hides another's. Atomics rather than a mutex on the
// path: with the server gone, every call of the service comes through here. Set its fields
// before the first Log.
type ErrorLog struct {
	Every  time.Duration // the least time between two lines of one kind
	Prefix string        // the package's, e.g. "httplimit: "
	// Logger receives the lines. Default (nil): slog.Default() when a line is written.
	Logger *slog.Logger
	// Messages are the lines by Failure, after Prefix. Default (nil): HTTPMessages.
	Messages  *[Unsettled + 1]string
	throttles sync.Map // logKey -> *throttle
	n         atomic.Int64
}

// HTTPMessages are the lines of an ErrorLog, by failure, after its prefix, as net/http
// answers them.
var HTTPMessages = [Unsettled + 1]string{
	Unavailable:   "no rate-limit decision",
	Misconfigured: "rate limit misconfigured, answered 500",
	RefusedKey:    "key refused, answered 400",
	ShadowKey:     "key of a shadow limit failed, request served",
	ShadowFailed:  "shadow decision failed, request served",
	Unreleased:    "lease not released, it expires at its end",
	Unsettled:     "settlement by outcome failed, not retried",
}

type logKey struct {
	kind   Failure
	policy string
}

type throttle struct {
	last       atomic.Int64 // Unix nanoseconds of the last error logged; 0 before the first
	suppressed atomic.Int64 // errors not logged since
}

func (l *ErrorLog) throttle(k logKey) *throttle {
	if v, ok := l.throttles.Load(k); ok {
		return v.(*throttle)
	}
	if l.n.Load() >= maxThrottles {
		k.policy = "" // every further policy shares one
	}
	v, loaded := l.throttles.LoadOrStore(k, &throttle{})
	if !loaded {
		l.n.Add(1)
	}
	return v.(*throttle)
}

// Log logs err, of a call whose where (the request's path, the gRPC method) is what, unless
// its kind logged less than a second ago.
func (l *ErrorLog) Log(ctx context.Context, kind Failure, policy string, err error, where, what string) {
	k := logKey{kind: kind}
	if kind == Misconfigured {
		k.policy = policy
	}
	t := l.throttle(k)
	now := time.Now().UnixNano()
	last := t.last.Load()
	if last != 0 && now-last < int64(l.Every) || !t.last.CompareAndSwap(last, now) {
		t.suppressed.Add(1)
		return
	}
	args := []any{"err", err, where, what, "errors_not_logged", t.suppressed.Swap(0)}
	if policy != "" {
		args = append(args, "policy", policy)
	}
	msgs := &HTTPMessages
	if l.Messages != nil {
		msgs = l.Messages
	}
	log := l.Logger
	if log == nil {
		log = slog.Default()
	}
	log.ErrorContext(ctx, l.Prefix+msgs[kind], args...)
}
