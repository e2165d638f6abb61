package httplimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/rlfn/rlfn/client"
)

// Limiter is what the middleware needs of a *client.Limiter, so that any decision maker (a
// fake in tests, a wrapper that records decisions) can stand in for it.
type Limiter interface {
	Allow(ctx context.Context, key string, limit client.Limit) (client.Result, error)
}

var _ Limiter = (*client.Limiter)(nil)

// DefaultMaxDelay is Options.MaxDelay when it is zero.
const DefaultMaxDelay = time.Second

// DefaultPolicyName is Policy.Name when it is empty.
const DefaultPolicyName = "default"

// Policy is the limit a request is counted against.
type Policy struct {
	// Name names the policy in the RateLimit headers and scopes its state: requests with the
	// same Name and key share one limiter, so two routes with their own Names have their own
	// budgets, and two with one Name share it. Letters, digits, '_', '.' and '-' only.
	// Default (empty): DefaultPolicyName, "default".
	Name string
	// Limit is the limiter's configuration, e.g. client.TokenBucket{...}. Default (nil): the
	// request is not rate-limited: no call, no rate-limit headers.
	Limit client.Limit
	// Concurrency, when not nil, caps the requests of one key in flight at once: the request
	// holds a lease of it (library 1.1.0) from after Limit admits it until the next handler
	// returns, or panics. Make Lease longer than the longest request: the lease is not renewed,
	// and one that expires frees its slot early. A request refused a slot is answered 429 with
	// Retry-After (the unit Limit took stays taken). The Limiter must be a *client.Limiter (or
	// implement Acquirer). Default (nil): no concurrency limit.
	Concurrency *client.Concurrency
	// Critical marks the route's requests critical (client.Critical): they may use the Reserve
	// of Limit and of Concurrency, which other routes leave to them. Default: false.
	Critical bool
}

// Acquirer is what a Policy with Concurrency needs of the Limiter, as *client.Limiter has it.
type Acquirer interface {
	Acquire(ctx context.Context, key string, c client.Concurrency) (*client.Lease, client.Result, error)
}

var _ Acquirer = (*client.Limiter)(nil)

// ErrNoAcquirer is passed to Options.OnError when a Policy has a Concurrency and the Limiter
// cannot take leases (it does not implement Acquirer).
var ErrNoAcquirer = errors.New("httplimit: Policy.Concurrency needs a Limiter that implements Acquirer, such as *client.Limiter")

// Options configures a Middleware. Key and Policy are required.
type Options struct {
	// Key returns the principal a request is counted against: a user ID, an API key, the
	// client's IP (see RemoteIP). Any string is safe: the client escapes it. An error answers
	// 400 Bad Request without a decision, because a request that cannot be attributed would
	// otherwise be served unlimited. Required.
	Key func(r *http.Request) (string, error)
	// Policy returns the limit of a request: per route, per tier. Required.
	Policy func(r *http.Request) Policy
	// MaxDelay is the longest a request admitted with a delay (a LeakyBucket in Shape mode) is
	// held before the next handler runs; a longer delay is answered 429. Default (zero):
	// DefaultMaxDelay, one second. A request whose context ends first is answered 503.
	MaxDelay time.Duration
	// ErrorStatus is the status answered when the limiter returns an error, from 400 to 599,
	// e.g. http.StatusServiceUnavailable to fail closed. Default (zero): the request is served
	// (fail open), without rate-limit headers.
	ErrorStatus int
	// OnError is called with each error of the limiter, before ErrorStatus applies; it must be
	// safe for concurrent use. A request whose context ended during the decision (its client
	// went away) is neither reported nor answered. Default (nil): the error is logged with slog.Default(), at most
	// once a second (with a count of the errors not logged), so a dead server does not flood
	// the log.
	OnError func(r *http.Request, err error)
}

// OptionError reports Options that cannot work, found by New.
type OptionError struct {
	Field  string // e.g. "Key"
	Reason string // e.g. "is required"
}

func (e *OptionError) Error() string { return "httplimit: Options." + e.Field + " " + e.Reason }

// PolicyError reports a Policy.Name the middleware refuses. It is passed to Options.OnError
// and answered like a limiter error: a misconfigured route must not take the service down.
type PolicyError struct {
	Name string
}

func (e *PolicyError) Error() string {
	return fmt.Sprintf("httplimit: policy name %q: want letters, digits, '_', '.' or '-'", e.Name)
}

// Middleware rate-limits the requests of the handlers it wraps. It is safe for concurrent use.
type Middleware struct {
	lim     Limiter
	opts    Options
	onError func(r *http.Request, err error)
}

// New returns a Middleware that asks lim for a decision on every request.
func New(lim Limiter, opts Options) (*Middleware, error) {
	if l, ok := lim.(*client.Limiter); ok && l == nil {
		lim = nil // a typed nil: every request would panic
	}
	switch {
	case lim == nil:
		return nil, &OptionError{Field: "Limiter", Reason: "is required"}
	case opts.Key == nil:
		return nil, &OptionError{Field: "Key", Reason: "is required"}
	case opts.Policy == nil:
		return nil, &OptionError{Field: "Policy", Reason: "is required"}
	case opts.MaxDelay < 0:
		return nil, &OptionError{Field: "MaxDelay", Reason: "must not be negative, got " + opts.MaxDelay.String()}
	case opts.ErrorStatus != 0 && (opts.ErrorStatus < 400 || opts.ErrorStatus > 599):
		return nil, &OptionError{Field: "ErrorStatus", Reason: fmt.Sprintf("must be 0 or from 400 to 599, got %d", opts.ErrorStatus)}
	}
	if opts.MaxDelay == 0 {
		opts.MaxDelay = DefaultMaxDelay
	}
	m := &Middleware{lim: lim, opts: opts, onError: opts.OnError}
	if m.onError == nil {
		m.onError = (&errorLog{every: time.Second}).log
	}
	return m, nil
}

// Handler returns next behind the rate limit. Its signature makes m.Handler usable wherever a
// func(http.Handler) http.Handler middleware is.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	p := m.opts.Policy(r)
	if p.Limit == nil && p.Concurrency == nil {
		next.ServeHTTP(w, r)
		return
	}
	if p.Name == "" {
		p.Name = DefaultPolicyName
	}
	if !validName(p.Name) {
		m.failed(w, r, next, &PolicyError{Name: p.Name})
		return
	}
	key, err := m.opts.Key(r)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, body{Error: "bad request", RetryAfterMs: -1})
		return
	}
	ctx := r.Context()
	if p.Critical {
		ctx = client.Critical(ctx)
	}
	// The name cannot contain ':', so "name:key" is injective.
	key = p.Name + ":" + key
	if p.Limit == nil {
		m.concurrent(ctx, w, r, next, p, key)
		return
	}
	res, err := m.lim.Allow(ctx, key, p.Limit)
	if err != nil {
		if r.Context().Err() != nil {
			// The client went away (or the server is shutting down): nobody reads an answer,
			// and the limiter did not fail.
			return
		}
		m.failed(w, r, next, err)
		return
	}
	h := w.Header()
	switch {
	case !res.Allowed:
		setHeaders(h, p, res, res.RetryAfter, true)
		deny(w, p.Name, res.RetryAfter)
	case res.Delay > m.opts.MaxDelay:
		// The server has counted this request (its unit is in the queue) and it is refused all
		// the same, as promised. A request made later waits behind that unit too: the delay it
		// would get is within MaxDelay once Delay plus one unit's leak time has passed down to
		// MaxDelay.
		wait := res.Delay + unitLeak(p.Limit) - m.opts.MaxDelay
		setHeaders(h, p, res, wait, true)
		deny(w, p.Name, wait)
	default:
		setHeaders(h, p, res, 0, false)
		if res.Delay > 0 && !hold(r.Context(), res.Delay) {
			writeJSON(w, http.StatusServiceUnavailable, body{Error: "request ended while delayed by the rate limit", Policy: p.Name, RetryAfterMs: -1})
			return
		}
		if p.Concurrency != nil {
			m.concurrent(ctx, w, r, next, p, key)
			return
		}
		next.ServeHTTP(w, r)
	}
}

// concurrent serves the request holding a lease of p.Concurrency, released when next returns
// or panics.
func (m *Middleware) concurrent(ctx context.Context, w http.ResponseWriter, r *http.Request, next http.Handler, p Policy, key string) {
	acq, ok := m.lim.(Acquirer)
	if !ok {
		m.failed(w, r, next, ErrNoAcquirer)
		return
	}
	lease, res, err := acq.Acquire(ctx, key, *p.Concurrency)
	if err != nil {
		if r.Context().Err() != nil {
			return
		}
		m.failed(w, r, next, err)
		return
	}
	if !res.Allowed {
		if res.RetryAfter != client.Never {
			w.Header()["Retry-After"] = []string{string(appendSeconds(nil, res.RetryAfter))}
		}
		deny(w, p.Name, res.RetryAfter)
		return
	}
	defer func() {
		// The request's context may be over (the client went away): the slot is owed anyway.
		if _, err := lease.Release(context.WithoutCancel(r.Context())); err != nil {
			m.onError(r, err)
		}
	}()
	next.ServeHTTP(w, r)
}

// unitLeak is how long one unit takes to leak out of a leaky bucket; zero for every other
// limit.
func unitLeak(l client.Limit) time.Duration { return l.Quota().Leak }

// hold waits d, and reports false if ctx ends first.
func hold(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// failed handles a request the middleware could not decide on.
func (m *Middleware) failed(w http.ResponseWriter, r *http.Request, next http.Handler, err error) {
	m.onError(r, err)
	if m.opts.ErrorStatus == 0 {
		next.ServeHTTP(w, r)
		return
	}
	writeJSON(w, m.opts.ErrorStatus, body{Error: "rate limiter unavailable", RetryAfterMs: -1})
}

// deny answers 429; setHeaders has set Retry-After.
func deny(w http.ResponseWriter, policy string, wait time.Duration) {
	b := body{Error: "rate limited", Policy: policy, RetryAfterMs: -1}
	if wait != client.Never {
		b.RetryAfterMs = wait.Milliseconds()
		if wait%time.Millisecond != 0 {
			b.RetryAfterMs++
		}
	}
	writeJSON(w, http.StatusTooManyRequests, b)
}

func validName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// RemoteIP is a Key function that counts requests per client IP address, as the connection
// reports it (Request.RemoteAddr). Behind a proxy every request has the proxy's address: use a
// Key that reads the header your proxy sets, and trust it only from the proxy.
func RemoteIP(r *http.Request) (string, error) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return "", fmt.Errorf("httplimit: RemoteAddr %q: %w", r.RemoteAddr, err)
	}
	return host, nil
}

// errorLog logs limiter errors, at most one per interval. Atomics rather than a mutex: with
// the server gone, every request of the service comes through here.
type errorLog struct {
	every      time.Duration
	last       atomic.Int64 // Unix nanoseconds of the last error logged; 0 before the first
	suppressed atomic.Int64 // errors not logged since
}

func (l *errorLog) log(r *http.Request, err error) {
	now := time.Now().UnixNano()
	last := l.last.Load()
	if last != 0 && now-last < int64(l.every) || !l.last.CompareAndSwap(last, now) {
		l.suppressed.Add(1)
		return
	}
	slog.Default().ErrorContext(r.Context(), "httplimit: no rate-limit decision", "err", err,
		"path", r.URL.Path, "errors_not_logged", l.suppressed.Swap(0))
}
