package httplimit

import (
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/decide"
)

// failure is why a request was left without a decision, which decides its answer and its log
// line (decide.Failure says what each means). unavailable is answered Options.ErrorStatus, 503
// by default, or served with Options.FailOpen; misconfigured 500 always, FailOpen or not;
// refusedKey 400; the others are logged only.
type failure = decide.Failure

const (
	unavailable   = decide.Unavailable
	misconfigured = decide.Misconfigured
	refusedKey    = decide.RefusedKey
	shadowKey     = decide.ShadowKey
	shadowFailed  = decide.ShadowFailed
	unreleased    = decide.Unreleased
	unsettled     = decide.Unsettled
)

// ErrEmptyKey is the error of a Key (Options.Key or an AlsoLimit's) that returned "": no principal
// to count the request against. An enforced limit answers it 400; a shadow limit passes it to
// Options.OnError in a *ShadowKeyError.
var ErrEmptyKey = errors.New("httplimit: the key is empty")

// classify is the failure of an error that left a request without a decision.
func classify(err error) failure {
	return decide.Classify(err, ErrEmptyKey, func(err error) bool {
		var pe *PolicyError
		return errors.As(err, &pe) || errors.Is(err, ErrNoMultiDecider) || errors.Is(err, ErrNoAcquirer) || errors.Is(err, ErrNoSettler)
	})
}

// The bodies of the responses the middleware writes without a decision.
const (
	bodyMisconfigured = "rate limit misconfigured"
	bodyUnavailable   = "rate limiter unavailable"
	bodyMissingKey    = "missing key"
	bodyUnreadableKey = "missing or unreadable key"
	bodyKeyTooLong    = "key too long"
	bodyBadCost       = "invalid cost"
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

// badCost answers 400: a Cost function computed a cost no limit takes from what the request
// sent (see Policy.Cost). It is the request's fault, so nothing is reported.
func (m *Middleware) badCost(w http.ResponseWriter) {
	m.write(w, http.StatusBadRequest, body{Error: bodyBadCost, RetryAfterMs: -1})
}

// report passes err to Options.OnError, or logs it.
func (m *Middleware) report(r *http.Request, kind failure, policy string, err error) {
	if m.opts.OnError != nil {
		m.opts.OnError(r, err)
		return
	}
	m.log.log(r, kind, policy, err)
}

// errorLog is the default OnError: decide.ErrorLog, throttled every every.
type errorLog struct {
	every  time.Duration
	logger *slog.Logger
	once   sync.Once
	l      decide.ErrorLog
}

func (l *errorLog) log(r *http.Request, kind failure, policy string, err error) {
	l.once.Do(func() { l.l.Every, l.l.Prefix, l.l.Logger = l.every, "httplimit: ", l.logger })
	l.l.Log(r.Context(), kind, policy, err, "path", r.URL.Path)
}
