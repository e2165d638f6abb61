package httplimit

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/decide"
)

// Defaults of TransportOptions: 3 retries, waits of at most a minute, up to 20% of jitter.
const (
	DefaultMaxRetries = decide.DefaultMaxRetries
	DefaultMaxWait    = decide.DefaultMaxWait
	DefaultJitter     = decide.DefaultJitter
)

// TransportOptions configures NewTransport. Limit is required.
type TransportOptions struct {
	// Limit paces the requests: a client.LeakyBucket in client.Shape mode spaces them evenly
	// across every instance that shares the key (each request waits its Delay); any other
	// limit admits bursts and makes a request it refuses wait its RetryAfter, then asks again.
	// Required.
	Limit client.Limit
	// Key returns the principal a request is paced under. Default (nil): the request's host
	// (URL.Host), one budget per API called. An error fails the request before it is sent.
	Key func(r *http.Request) (string, error)
	// MaxRetries is how many times one request answered 429 Too Many Requests is sent again,
	// after its Retry-After. Default (0): DefaultMaxRetries, 3; negative: none.
	MaxRetries int
	// MaxWait is the longest a request waits, for the limiter or for a Retry-After: a longer
	// wait fails it (the limiter's) or returns the 429 as it is (the server's). A wait that
	// would pass the request's context deadline is never started either. A shaped request
	// failed so keeps its place in the leaky bucket (the server admitted it): size Capacity
	// so that it drains within MaxWait. Default (0): DefaultMaxWait, one minute.
	MaxWait time.Duration
	// Jitter spreads the retries of a fleet throttled at once: a Retry-After of d is waited
	// d plus a random share, up to Jitter, of d (of one second when d is shorter), never less
	// than the server asked, nor past MaxWait or the deadline when the wait asked fits. From 0
	// to 1. Default (0): DefaultJitter, 0.2; negative: none.
	Jitter float64

	// Now, Sleep and Rand are the clock, the wait and the random source, for tests. Sleep
	// returns ctx's error when it ends first. Defaults (nil): time.Now, a timer, math/rand/v2.
	Now   func() time.Time
	Sleep func(ctx context.Context, d time.Duration) error
	Rand  func() float64
}

// Transport is an http.RoundTripper that paces the requests it sends through a limiter and
// sends a request answered 429 again after its Retry-After, for services that call
// rate-limited APIs. Only a request that can be replayed is sent again: one of an idempotent
// method (GET, HEAD, OPTIONS, TRACE, PUT, DELETE) or with an Idempotency-Key header, and
// with no body or a GetBody to make it again. Each attempt is paced. It is safe for
// concurrent use.
//
// The limiter's errors fail the request before it is sent, unless its Policy decides: a
// *client.Limiter's default, client.LocalFallback, paces it in-process while the server
// cannot; client.FailOpen sends it unpaced.
type Transport struct {
	base  http.RoundTripper
	lim   Decider
	opts  TransportOptions
	pacer decide.Pacer
}

var _ http.RoundTripper = (*Transport)(nil)

// WaitError is the error of a request the limiter would hold longer than it may wait.
type WaitError struct {
	Key    string
	Wait   time.Duration // what the limiter asked; client.Never when no wait admits it
	Reason string        // e.g. "passes the request's deadline"
}

func (e *WaitError) Error() string {
	wait := "forever"
	if e.Wait != client.Never {
		wait = e.Wait.String()
	}
	return fmt.Sprintf("httplimit: rate limit of %q: a wait of %s %s", e.Key, wait, e.Reason)
}

// NewTransport returns a Transport sending through base (http.DefaultTransport when nil),
// or an *ConfigError naming what opts got wrong.
func NewTransport(base http.RoundTripper, lim Decider, opts TransportOptions) (*Transport, error) {
	if l, ok := lim.(*client.Limiter); ok && l == nil {
		lim = nil
	}
	switch {
	case lim == nil:
		return nil, &ConfigError{Field: "Limiter", Reason: "is required"}
	case opts.Limit == nil:
		return nil, &ConfigError{Field: "TransportOptions.Limit", Reason: "is required"}
	case opts.MaxWait < 0:
		return nil, &ConfigError{Field: "TransportOptions.MaxWait", Reason: "must not be negative, got " + opts.MaxWait.String()}
	case opts.Jitter > 1:
		return nil, &ConfigError{Field: "TransportOptions.Jitter", Reason: fmt.Sprintf("must be at most 1, got %g", opts.Jitter)}
	}
	if err := opts.Limit.Validate(); err != nil {
		return nil, &ConfigError{Field: "TransportOptions.Limit", Reason: err.Error()}
	}
	if base == nil {
		base = http.DefaultTransport
	}
	if opts.Key == nil {
		opts.Key = func(r *http.Request) (string, error) { return r.URL.Host, nil }
	}
	opts.MaxRetries = decide.Retries(opts.MaxRetries)
	return &Transport{base: base, lim: lim, opts: opts, pacer: decide.NewPacer(lim, opts.Limit,
		opts.MaxWait, opts.Jitter, opts.Now, opts.Sleep, opts.Rand)}, nil
}

// RoundTrip paces req, sends it, and sends it again after a 429's Retry-After while the
// retry budget lasts.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	key, err := t.opts.Key(req)
	if err != nil {
		closeBody(req)
		return nil, fmt.Errorf("httplimit: Transport key: %w", err)
	}
	replay := replayable(req)
	for attempt := 0; ; attempt++ {
		if err := t.pace(ctx, key); err != nil {
			closeBody(req)
			return nil, err
		}
		resp, err := t.base.RoundTrip(req)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests || attempt >= t.opts.MaxRetries || !replay {
			return resp, err
		}
		wait, ok := retryAfter(resp.Header.Get("Retry-After"), t.pacer.Now())
		if !ok {
			return resp, nil // the server said nothing of when: its answer stands
		}
		// The jitter stops at MaxWait and at the deadline: the server's wait fits, and a
		// retry within it is worth more than a 429 returned for the sake of spreading.
		wait, ok = t.pacer.RetryWait(ctx, wait, time.Second)
		if !ok {
			return resp, nil
		}
		next, err := rewind(req)
		if err != nil {
			return resp, nil // the body cannot be made again: the 429 stands
		}
		// Read a little of the body so that the connection can be reused, then let it go.
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		if err := t.pacer.Sleep(ctx, wait); err != nil {
			closeBody(next)
			return nil, fmt.Errorf("httplimit: waiting out Retry-After: %w", err)
		}
		req = next
	}
}

// pace waits until the limiter admits a request of key, within ctx.
func (t *Transport) pace(ctx context.Context, key string) error {
	wait, reason, slept, err := t.pacer.Pace(ctx, key)
	switch {
	case slept:
		return fmt.Errorf("httplimit: waiting for the rate limit of %q: %w", key, err)
	case err != nil:
		return fmt.Errorf("httplimit: Transport: %w", err)
	case reason != "":
		return &WaitError{Key: key, Wait: wait, Reason: reason}
	}
	return nil
}

// jitter is the random share added to a wait of d.
func (t *Transport) jitter(d time.Duration) time.Duration { return t.pacer.JitterOf(d, time.Second) }

// retryAfter reads a Retry-After: delay-seconds or an HTTP-date (RFC 9110, section 10.2.3).
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		s, err := strconv.ParseUint(v, 10, 63)
		if err != nil {
			return 0, false
		}
		if s > uint64(client.Never/time.Second) {
			return client.Never, true
		}
		return time.Duration(s) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(at.Sub(now), 0), true
}

// replayable reports whether req may be sent again: an idempotent method, or an
// Idempotency-Key, as net/http retries; and a body that can be made again.
func replayable(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
	default:
		if _, ok := req.Header["Idempotency-Key"]; !ok {
			if _, ok := req.Header["X-Idempotency-Key"]; !ok {
				return false
			}
		}
	}
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// rewind is req to send again, with a new body from GetBody.
func rewind(req *http.Request) (*http.Request, error) {
	next := req.Clone(req.Context())
	if req.Body != nil && req.Body != http.NoBody {
		body, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		next.Body = body
	}
	return next, nil
}

// closeBody closes the body of a request that will not be sent: a RoundTripper must close
// it, even on an error.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}
