package httplimit

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
)

// fakeClock is Now and Sleep for a Transport: a sleep advances the time at once, and is
// recorded.
type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	slept []time.Duration
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Now().Truncate(time.Second)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slept = append(c.slept, d)
	c.now = c.now.Add(d)
	return nil
}

func (c *fakeClock) sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.slept)
}

// script is a Limiter that answers its results in turn, then admits.
type script struct {
	mu      sync.Mutex
	results []client.Result
	err     error
	keys    []string
}

func (s *script) Allow(_ context.Context, key string, _ client.Limit) (client.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = append(s.keys, key)
	if s.err != nil {
		return client.Result{}, s.err
	}
	if len(s.results) == 0 {
		return client.Result{Allowed: true, Limit: 10, Remaining: 5}, nil
	}
	r := s.results[0]
	s.results = s.results[1:]
	return r, nil
}

// upstream is an API that answers its statuses in turn (then 200), with the Retry-After
// each gets, and records the bodies it was sent.
type upstream struct {
	mu       sync.Mutex
	statuses []int
	retry    []string
	bodies   []string
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	defer u.mu.Unlock()
	u.bodies = append(u.bodies, string(b))
	status := http.StatusOK
	if len(u.statuses) > 0 {
		status = u.statuses[0]
		u.statuses = u.statuses[1:]
		if ra := u.retry[0]; ra != "" {
			w.Header().Set("Retry-After", ra)
		}
		u.retry = u.retry[1:]
	}
	w.WriteHeader(status)
	io.WriteString(w, http.StatusText(status))
}

func (u *upstream) requests() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.bodies)
}

// trackedBody records that it was closed.
type trackedBody struct {
	io.Reader
	closed bool
}

func (b *trackedBody) Close() error { b.closed = true; return nil }

func TestTransport(t *testing.T) {
	shaped := client.LeakyBucket{Capacity: 10, Rate: 5, Period: time.Second, Mode: client.Shape}
	const http429 = http.StatusTooManyRequests
	tests := []struct {
		name       string
		limiter    *script
		opts       TransportOptions
		statuses   []int
		retry      []string // the Retry-After of each status; "date+Ns" is an HTTP-date N seconds after the clock's start
		method     string
		body       string // sent with a GetBody unless noGetBody
		noGetBody  bool
		header     map[string]string
		deadline   time.Duration // from the clock's start; 0: none
		wantStatus int
		wantErr    string // a substring; "" for none
		wantSleeps []time.Duration
		wantSent   int      // requests the upstream got
		wantKeys   int      // decisions asked of the limiter
		wantBodies []string // what the upstream got, when set
	}{
		{
			name:       "admitted at once",
			limiter:    &script{},
			wantStatus: 200, wantSent: 1, wantKeys: 1,
		},
		{
			name:       "shape: waits the Delay",
			limiter:    &script{results: []client.Result{{Allowed: true, Delay: 300 * time.Millisecond}}},
			opts:       TransportOptions{Limit: shaped},
			wantStatus: 200, wantSleeps: []time.Duration{300 * time.Millisecond}, wantSent: 1, wantKeys: 1,
		},
		{
			name:       "token bucket: waits RetryAfter, asks again",
			limiter:    &script{results: []client.Result{{RetryAfter: 2 * time.Second}}},
			wantStatus: 200, wantSleeps: []time.Duration{2 * time.Second}, wantSent: 1, wantKeys: 2,
		},
		{
			name:     "token bucket: a wait past the deadline fails at once",
			limiter:  &script{results: []client.Result{{RetryAfter: 10 * time.Second}}},
			deadline: 5 * time.Second,
			wantErr:  "passes the request's deadline", wantKeys: 1,
		},
		{
			name:     "shape: a Delay past the deadline fails at once",
			limiter:  &script{results: []client.Result{{Allowed: true, Delay: 6 * time.Second}}},
			deadline: 5 * time.Second,
			wantErr:  "passes the request's deadline", wantKeys: 1,
		},
		{
			name:    "a wait over MaxWait fails",
			limiter: &script{results: []client.Result{{RetryAfter: 2 * time.Minute}}},
			wantErr: "longer than MaxWait", wantKeys: 1,
		},
		{
			name:    "a cost above the limit fails",
			limiter: &script{results: []client.Result{{RetryAfter: client.Never}}},
			wantErr: "admits no request", wantKeys: 1,
		},
		{
			name:    "a limiter error fails before sending",
			limiter: &script{err: errDown},
			wantErr: "connection refused", wantKeys: 1,
		},
		{
			name:     "429 with Retry-After seconds: sent again after it, with jitter, paced again",
			limiter:  &script{},
			statuses: []int{http429}, retry: []string{"3"},
			wantStatus: 200, wantSleeps: []time.Duration{3*time.Second + 300*time.Millisecond}, wantSent: 2, wantKeys: 2,
		},
		{
			name:     "429 with an HTTP-date",
			limiter:  &script{},
			statuses: []int{http429}, retry: []string{"date+10s"},
			wantStatus: 200, wantSleeps: []time.Duration{11 * time.Second}, wantSent: 2, wantKeys: 2,
		},
		{
			name:     "429 with a date in the past: a jitter's wait",
			limiter:  &script{},
			statuses: []int{http429}, retry: []string{"date+-10s"},
			wantStatus: 200, wantSleeps: []time.Duration{100 * time.Millisecond}, wantSent: 2, wantKeys: 2,
		},
		{
			name:     "429 with Retry-After 0: a jitter's wait",
			limiter:  &script{},
			statuses: []int{http429}, retry: []string{"0"},
			wantStatus: 200, wantSleeps: []time.Duration{100 * time.Millisecond}, wantSent: 2, wantKeys: 2,
		},
		{
			name:     "the retry budget spent: the last 429 returned",
			limiter:  &script{},
			opts:     TransportOptions{MaxRetries: 2},
			statuses: []int{http429, http429, http429, http429}, retry: []string{"1", "1", "1", "1"},
			wantStatus: 429, wantSleeps: []time.Duration{1100 * time.Millisecond, 1100 * time.Millisecond}, wantSent: 3, wantKeys: 3,
		},
		{
			name:     "retries off",
			limiter:  &script{},
			opts:     TransportOptions{MaxRetries: -1},
			statuses: []int{http429}, retry: []string{"1"},
			wantStatus: 429, wantSent: 1, wantKeys: 1,
		},
		{
			name:     "no jitter",
			limiter:  &script{},
			opts:     TransportOptions{Jitter: -1},
			statuses: []int{http429}, retry: []string{"1"},
			wantStatus: 200, wantSleeps: []time.Duration{time.Second}, wantSent: 2, wantKeys: 2,
		},
		{
			name:     "429 without Retry-After: returned",
			limiter:  &script{},
			statuses: []int{http429}, retry: []string{""},
			wantStatus: 429, wantSent: 1, wantKeys: 1,
		},
		{
			name:     "429 with a garbage Retry-After: returned",
			limiter:  &script{},
			statuses: []int{http429}, retry: []string{"soon"},
			wantStatus: 429, wantSent: 1, wantKeys: 1,
		},
		{
			name:     "a Retry-After past the deadline: returned at once",
			limiter:  &script{},
			statuses: []int{http429}, retry: []string{"30"},
			deadline:   10 * time.Second,
			wantStatus: 429, wantSent: 1, wantKeys: 1,
		},
		{
			name:       "refused with no wait: asks again, never sends unadmitted",
			limiter:    &script{results: []client.Result{{RetryAfter: 0}}},
			wantStatus: 200, wantSleeps: []time.Duration{time.Millisecond}, wantSent: 1, wantKeys: 2,
		},
		{
			name:     "a Retry-After that fits the deadline: its jitter is cut at it",
			limiter:  &script{},
			statuses: []int{http429}, retry: []string{"1"},
			deadline:   1050 * time.Millisecond,
			wantStatus: 200, wantSleeps: []time.Duration{1050 * time.Millisecond}, wantSent: 2, wantKeys: 2,
		},
		{
			name:     "a Retry-After of MaxWait: its jitter is cut at it",
			limiter:  &script{},
			opts:     TransportOptions{MaxWait: time.Second},
			statuses: []int{http429}, retry: []string{"1"},
			wantStatus: 200, wantSleeps: []time.Duration{time.Second}, wantSent: 2, wantKeys: 2,
		},
		{
			name:     "a Retry-After over MaxWait: returned at once",
			limiter:  &script{},
			statuses: []int{http429}, retry: []string{"3600"},
			wantStatus: 429, wantSent: 1, wantKeys: 1,
		},
		{
			name:     "a Retry-After of the largest duration: returned at once",
			limiter:  &script{},
			statuses: []int{http429}, retry: []string{"9223372036854775807"},
			wantStatus: 429, wantSent: 1, wantKeys: 1,
		},
		{
			name:    "POST is not replayed",
			limiter: &script{},
			method:  "POST", body: "order",
			statuses: []int{http429}, retry: []string{"1"},
			wantStatus: 429, wantSent: 1, wantKeys: 1,
		},
		{
			name:    "POST with an Idempotency-Key is, its body made again",
			limiter: &script{},
			method:  "POST", body: "order", header: map[string]string{"Idempotency-Key": "abc"},
			statuses: []int{http429}, retry: []string{"1"},
			wantStatus: 200, wantSleeps: []time.Duration{1100 * time.Millisecond}, wantSent: 2, wantKeys: 2,
			wantBodies: []string{"order", "order"},
		},
		{
			name:    "PUT with a body and a GetBody is replayed",
			limiter: &script{},
			method:  "PUT", body: "doc",
			statuses: []int{http429}, retry: []string{"1"},
			wantStatus: 200, wantSleeps: []time.Duration{1100 * time.Millisecond}, wantSent: 2, wantKeys: 2,
			wantBodies: []string{"doc", "doc"},
		},
		{
			name:    "PUT with a body and no GetBody is not",
			limiter: &script{},
			method:  "PUT", body: "doc", noGetBody: true,
			statuses: []int{http429}, retry: []string{"1"},
			wantStatus: 429, wantSent: 1, wantKeys: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newFakeClock()
			up := &upstream{statuses: tt.statuses}
			for _, r := range tt.retry {
				if d, ok := strings.CutPrefix(r, "date+"); ok {
					dur, err := time.ParseDuration(d)
					if err != nil {
						t.Fatal(err)
					}
					r = clock.Now().Add(dur).UTC().Format(http.TimeFormat)
				}
				up.retry = append(up.retry, r)
			}
			srv := httptest.NewServer(up)
			defer srv.Close()
			opts := tt.opts
			if opts.Limit == nil {
				opts.Limit = tokenBucket
			}
			opts.Now, opts.Sleep = clock.Now, clock.Sleep
			opts.Rand = func() float64 { return 0.5 }
			tr, err := NewTransport(nil, tt.limiter, opts)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if tt.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, clock.Now().Add(tt.deadline))
				defer cancel()
			}
			method := tt.method
			if method == "" {
				method = "GET"
			}
			body := &trackedBody{Reader: strings.NewReader(tt.body)}
			req, err := http.NewRequestWithContext(ctx, method, srv.URL+"/v1", nil)
			if err != nil {
				t.Fatal(err)
			}
			if tt.body != "" {
				req.Body, req.ContentLength = body, int64(len(tt.body))
				if !tt.noGetBody {
					req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(tt.body)), nil }
				}
			}
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			resp, err := tr.RoundTrip(req)
			if resp != nil {
				defer resp.Body.Close()
			}
			switch {
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one with %q", err, tt.wantErr)
			case tt.wantErr == "" && err != nil:
				t.Fatal(err)
			case tt.wantErr == "" && resp.StatusCode != tt.wantStatus:
				t.Errorf("status %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			if tt.wantErr != "" && tt.body != "" && !body.closed {
				t.Error("the body of a request not sent was not closed")
			}
			if resp != nil {
				if b, _ := io.ReadAll(resp.Body); string(b) != http.StatusText(tt.wantStatus) {
					t.Errorf("body %q, want the last response's", b)
				}
			}
			if got := clock.sleeps(); !slices.Equal(got, tt.wantSleeps) {
				t.Errorf("slept %v, want %v", got, tt.wantSleeps)
			}
			if got := up.requests(); got != tt.wantSent {
				t.Errorf("the upstream got %d requests, want %d", got, tt.wantSent)
			}
			if len(tt.limiter.keys) != tt.wantKeys || tt.wantKeys > 0 && tt.limiter.keys[0] != strings.TrimPrefix(srv.URL, "http://") {
				t.Errorf("limiter asked for %q, want %d decisions of the host", tt.limiter.keys, tt.wantKeys)
			}
			if tt.wantBodies != nil && !slices.Equal(up.bodies, tt.wantBodies) {
				t.Errorf("upstream bodies %q, want %q", up.bodies, tt.wantBodies)
			}
		})
	}
}

// A wait whose context ends is cut short with the context's error.
func TestTransportWaitCanceled(t *testing.T) {
	tr, err := NewTransport(nil, &script{results: []client.Result{{RetryAfter: 10 * time.Second}}}, TransportOptions{Limit: tokenBucket})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	// no deadline the transport can see ahead: a cancel, not a timeout
	ctx, cancel2 := context.WithCancel(context.WithoutCancel(ctx))
	time.AfterFunc(20*time.Millisecond, cancel2)
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://127.0.0.1:1/", nil)
	start := time.Now()
	_, err = tr.RoundTrip(req)
	if !errors.Is(err, context.Canceled) || time.Since(start) > 5*time.Second {
		t.Fatalf("error %v after %s, want context.Canceled promptly", err, time.Since(start))
	}
}

// The jitter is never negative and at most Jitter of the wait (of a second, below one).
func TestTransportJitter(t *testing.T) {
	for _, r := range []float64{0, 0.5, 0.999999} {
		tr, err := NewTransport(nil, &script{}, TransportOptions{Limit: tokenBucket, Jitter: 0.5, Rand: func() float64 { return r }})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range []time.Duration{0, 200 * time.Millisecond, 4 * time.Second} {
			j := tr.jitter(d)
			if j < 0 || j > time.Duration(0.5*float64(max(d, time.Second))) {
				t.Errorf("rand %g, wait %s: jitter %s", r, d, j)
			}
		}
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		give   string
		want   time.Duration
		wantOK bool
	}{
		{"0", 0, true},
		{"120", 2 * time.Minute, true},
		{" 5 ", 5 * time.Second, true},
		{"Mon, 23 Nov 2026 12:00:30 GMT", 30 * time.Second, true},
		{"Monday, 23-Nov-26 12:01:00 GMT", time.Minute, true}, // RFC 850
		{"Mon Nov 23 12:00:10 2026", 10 * time.Second, true},  // asctime
		{"Mon, 23 Nov 2026 11:00:00 GMT", 0, true},            // past
		{"99999999999999999999", 0, false},
		{"9223372036854775807", client.Never, true},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"", 0, false},
		{"tomorrow", 0, false},
	}
	for _, tt := range tests {
		got, ok := retryAfter(tt.give, now)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("retryAfter(%q) = %s, %v; want %s, %v", tt.give, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestNewTransportRefuses(t *testing.T) {
	tests := []struct {
		name      string
		lim       Decider
		give      TransportOptions
		wantField string
	}{
		{"no limiter", nil, TransportOptions{Limit: tokenBucket}, "Limiter"},
		{"nil *client.Limiter", (*client.Limiter)(nil), TransportOptions{Limit: tokenBucket}, "Limiter"},
		{"no limit", &script{}, TransportOptions{}, "TransportOptions.Limit"},
		{"invalid limit", &script{}, TransportOptions{Limit: client.TokenBucket{Capacity: 1, Period: time.Second}}, "TransportOptions.Limit"},
		{"negative MaxWait", &script{}, TransportOptions{Limit: tokenBucket, MaxWait: -1}, "TransportOptions.MaxWait"},
		{"Jitter above 1", &script{}, TransportOptions{Limit: tokenBucket, Jitter: 1.5}, "TransportOptions.Jitter"},
	}
	for _, tt := range tests {
		_, err := NewTransport(nil, tt.lim, tt.give)
		var oe *ConfigError
		if !errors.As(err, &oe) || oe.Field != tt.wantField {
			t.Errorf("%s: got %v, want an *ConfigError for %s", tt.name, err, tt.wantField)
		}
	}
}

// A 429 is read and closed before its request is sent again, so the retry goes out on the
// same connection instead of opening one per attempt.
func TestTransportReusesTheConnection(t *testing.T) {
	up := &upstream{statuses: []int{http.StatusTooManyRequests}, retry: []string{"0"}}
	srv := httptest.NewUnstartedServer(up)
	var mu sync.Mutex
	conns := 0
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			conns++
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	clock := newFakeClock()
	tr, err := NewTransport(base, &script{}, TransportOptions{Limit: tokenBucket, Now: clock.Now, Sleep: clock.Sleep})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", srv.URL, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if resp.StatusCode != 200 || up.requests() != 2 || conns != 1 {
		t.Errorf("status %d after %d requests on %d connections; want 200 after 2 on 1", resp.StatusCode, up.requests(), conns)
	}
}
