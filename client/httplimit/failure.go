package httplimit

import (
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rlfn/rlfn/client"
)

// failure is why a request was left without a decision, which decides its answer and its log
// line.
type failure uint8

const (
	// unavailable: the limiter could not decide (its server unreachable, a deadline passed, an
	// open circuit, a library absent or too old). A *client.Limiter returns these only under
	// client.ReturnError; its other policies decide such a request themselves. Answered
	// Options.ErrorStatus, 503 by default, or served with Options.FailOpen.
	unavailable failure = iota
	// misconfigured: a limit that cannot be valid (a bad Policy, a Limit the client refuses, a
	// key holding foreign state, a Limiter that cannot serve the Policy). No retry helps until
	// the service is fixed: answered 500 always, FailOpen or not.
	misconfigured
	// refusedKey: the request's principal is empty or longer than the Limiter takes: the
	// client's fault, answered 400.
	refusedKey
	// notRefunded: a decision across keys stands, but refunds it owed failed (logged only).
	notRefunded
	// shadowKey: the key of a shadow limit failed; the request is served (logged only).
	shadowKey
	// shadowFailed: a shadow decision failed; the request was served (logged only).
	shadowFailed
	// unreleased: a lease's release failed after the request; the lease expires by itself
	// (logged only).
	unreleased
)

// ErrEmptyKey is the error of a Key (Options.Key or an AlsoLimit's) that returned "": no principal
// to count the request against. An enforced limit answers it 400; a shadow limit passes it to
// Options.OnError in a *ShadowKeyError.
var ErrEmptyKey = errors.New("httplimit: the key is empty")

// classify is the failure of an error that left a request without a decision.
func classify(err error) failure {
	var (
		ke  *client.KeyError
		pe  *PolicyError
		le  *client.LimitError
		lib *client.LibraryError
	)
	switch {
	case errors.As(err, &ke) || errors.Is(err, ErrEmptyKey):
		return refusedKey
	case errors.As(err, &pe) || errors.As(err, &le) || errors.As(err, &lib) ||
		errors.Is(err, ErrNoMultiDecider) || errors.Is(err, ErrNoAcquirer):
		return misconfigured
	}
	return unavailable
}

// decisionStands reports an error that comes with a decision to answer: a
// *client.CompensationError alone, which AllowAll returns beside a denial whose Result stands
// (the refunds it owed failed; the limits not refunded are stricter for a while, never more
// permissive). Joined to any other error (the decision itself failed), it is an error like
// the others.
func decisionStands(err error) bool {
	switch e := err.(type) {
	case nil:
		return false
	case *client.CompensationError:
		return true
	case interface{ Unwrap() []error }:
		errs := e.Unwrap()
		for _, err := range errs {
			if !decisionStands(err) {
				return false
			}
		}
		return len(errs) > 0
	case interface{ Unwrap() error }:
		return decisionStands(e.Unwrap())
	}
	return false
}

// The bodies of the responses the middleware writes without a decision.
const (
	bodyMisconfigured = "rate limit misconfigured"
	bodyUnavailable   = "rate limiter unavailable"
	bodyMissingKey    = "missing key"
	bodyUnreadableKey = "missing or unreadable key"
	bodyKeyTooLong    = "key too long"
)

// failed answers a request the limiter (or the Policy) left without a decision because of
// err, and reports err; policy is the route's Name.
func (m *Middleware) failed(w http.ResponseWriter, r *http.Request, next http.Handler, policy string, err error) {
	kind := classify(err)
	m.report(r, kind, policy, err)
	switch kind {
	case refusedKey:
		m.badKey(w, keyReason(err))
	case misconfigured:
		m.write(w, http.StatusInternalServerError, body{Error: bodyMisconfigured, RetryAfterMs: -1})
	default:
		if m.opts.FailOpen {
			next.ServeHTTP(w, r)
			return
		}
		m.write(w, m.opts.ErrorStatus, body{Error: bodyUnavailable, RetryAfterMs: -1})
	}
}

// keyReason is the body of a 400 for a key the Limiter refused.
func keyReason(err error) string {
	var ke *client.KeyError
	if errors.As(err, &ke) && ke.Len > 0 {
		return bodyKeyTooLong
	}
	return bodyMissingKey
}

// badKey answers 400: the request names no principal the limits can count it against.
func (m *Middleware) badKey(w http.ResponseWriter, reason string) {
	m.write(w, http.StatusBadRequest, body{Error: reason, RetryAfterMs: -1})
}

// report passes err to Options.OnError, or logs it.
func (m *Middleware) report(r *http.Request, kind failure, policy string, err error) {
	if m.opts.OnError != nil {
		m.opts.OnError(r, err)
		return
	}
	m.log.log(r, kind, policy, err)
}

// logMessages are the default log's lines, by failure.
var logMessages = [...]string{
	unavailable:   "httplimit: no rate-limit decision",
	misconfigured: "httplimit: rate limit misconfigured, answered 500",
	refusedKey:    "httplimit: key refused, answered 400",
	notRefunded:   "httplimit: decision answered, but refunds it owed failed",
	shadowKey:     "httplimit: key of a shadow limit failed, request served",
	shadowFailed:  "httplimit: shadow decision failed, request served",
	unreleased:    "httplimit: lease not released, it expires at its end",
}

// maxThrottles bounds the throttles of an errorLog: policy names come from the service's code,
// but a Policy function may make them up per request.
const maxThrottles = 256

// errorLog logs the errors that left requests without a decision, at most one a second per
// failure and, for a misconfigured route, per policy: a dead server's errors share one line a
// second, and one route's mistake never hides another's. Atomics rather than a mutex on the
// path: with the server gone, every request of the service comes through here.
type errorLog struct {
	every     time.Duration
	throttles sync.Map // logKey -> *throttle
	n         atomic.Int64
}

type logKey struct {
	kind   failure
	policy string
}

type throttle struct {
	last       atomic.Int64 // Unix nanoseconds of the last error logged; 0 before the first
	suppressed atomic.Int64 // errors not logged since
}

func (l *errorLog) throttle(k logKey) *throttle {
	if v, ok := l.throttles.Load(k); ok {
		return v.(*throttle)
	}
	if l.n.Load() >= maxThrottles {
		k.policy = "" // every further route shares one
	}
	v, loaded := l.throttles.LoadOrStore(k, &throttle{})
	if !loaded {
		l.n.Add(1)
	}
	return v.(*throttle)
}

func (l *errorLog) log(r *http.Request, kind failure, policy string, err error) {
	k := logKey{kind: kind}
	if kind == misconfigured {
		k.policy = policy
	}
	t := l.throttle(k)
	now := time.Now().UnixNano()
	last := t.last.Load()
	if last != 0 && now-last < int64(l.every) || !t.last.CompareAndSwap(last, now) {
		t.suppressed.Add(1)
		return
	}
	args := []any{"err", err, "path", r.URL.Path, "errors_not_logged", t.suppressed.Swap(0)}
	if policy != "" {
		args = append(args, "policy", policy)
	}
	slog.Default().ErrorContext(r.Context(), logMessages[kind], args...)
}
