package httplimit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// fake is a Limiter that answers what it is told and records what it was asked.
type fake struct {
	res  client.Result
	each []client.Result // AllowAllEach's
	err  error
	// forbidEach makes AllowAllEach panic: a test that wants AllowAll alone
	forbidEach bool

	mu    sync.Mutex
	calls []call
}

type call struct {
	key   string
	limit client.Limit
}

func (f *fake) Allow(_ context.Context, key string, limit client.Limit) (client.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{key, limit})
	return f.res, f.err
}

// AllowAll records each rule as a call, and answers res (whose Rule names the one deciding).
func (f *fake) AllowAll(_ context.Context, rules []client.Rule) (client.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range rules {
		f.calls = append(f.calls, call{r.Key, r.Limit})
	}
	return f.res, f.err
}

// AllowAllEach records each rule as a call, and answers res and each.
func (f *fake) AllowAllEach(ctx context.Context, rules []client.Rule, n int64) (client.Result, []client.Result, error) {
	if n != 1 {
		panic("httplimit takes one unit a request")
	}
	if f.forbidEach {
		panic("AllowAllEach called where the state of each limit is not wanted")
	}
	res, err := f.AllowAll(ctx, rules)
	return res, f.each, err
}

// now is the fixed clock of the golden responses: X-RateLimit-Reset is a Unix time from it.
func now() time.Time { return time.Unix(1_800_000_000, 250_000_000) }

var (
	tokenBucket = client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second}
	hourly      = client.SlidingWindow{Limit: 1000, Window: time.Hour}
	daily       = client.FixedWindow{Limit: 5000, Window: 24 * time.Hour}
	shape       = client.LeakyBucket{Capacity: 10, Rate: 20, Period: time.Second, Mode: client.Shape}
	monthly     = client.Calendar{Limit: 10_000, Period: client.Month}
	penalized   = client.FixedWindow{Limit: 5, Window: time.Minute, Penalty: 15 * time.Minute}
	errDown     = errors.New("client: rl_token_bucket: dial tcp 127.0.0.1:6379: connect: connection refused")
)

// mustLoad is a zone of the system's tzdata, which the integration tests read too; a host
// without it fails here, saying which zone is missing.
func mustLoad(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return loc
}

func constKey(k string) func(*http.Request) (string, error) {
	return func(*http.Request) (string, error) { return k, nil }
}

// served is the next handler of every test: it marks the responses it wrote.
var served = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Served", "yes")
	fmt.Fprintln(w, "hello")
})

// dump is a response as the golden file holds it: status, sorted headers, body.
func dump(rec *httptest.ResponseRecorder) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d\n", rec.Code)
	h := rec.Result().Header
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range h {
			if !yield(k) {
				return
			}
		}
	}) {
		fmt.Fprintf(&b, "%s: %s\n", k, strings.Join(h[k], ", "))
	}
	fmt.Fprintf(&b, "\n%s", rec.Body.String())
	return b.String()
}

// Every kind of decision gets the status, headers and body the package documents; the whole
// set is checked against testdata/responses.golden (go test -update rewrites it).
func TestResponses(t *testing.T) {
	berlinDay := client.Calendar{Limit: 100, Period: client.Day, Anchor: time.Date(2026, 1, 1, 0, 0, 0, 0, mustLoad("Europe/Berlin"))}
	tests := []struct {
		name      string
		give      client.Result
		giveErr   error
		policy    Policy
		opts      Options
		keyErr    error
		keyNone   bool // Options.Key answers ""
		wantCalls int
		wantErr   bool // OnError was called
		wantKeys  []string
		giveEach  []client.Result
		// wantNoEach: the middleware must not ask for each limit's state (AllowAll, not
		// AllowAllEach)
		wantNoEach bool
	}{
		{
			name:      "allowed",
			give:      client.Result{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: 100 * time.Millisecond},
			policy:    Policy{Name: "api", Limit: tokenBucket},
			wantCalls: 1,
		},
		{
			name:      "allowed, default policy name",
			give:      client.Result{Allowed: true, Limit: 100, Remaining: 0, ResetAfter: 10 * time.Second},
			policy:    Policy{Limit: tokenBucket},
			wantCalls: 1,
		},
		{
			name:      "denied",
			give:      client.Result{Allowed: false, Limit: 100, Remaining: 0, RetryAfter: 1501 * time.Millisecond, ResetAfter: 10 * time.Second},
			policy:    Policy{Name: "api", Limit: tokenBucket},
			wantCalls: 1,
		},
		{
			name:      "denied, never admitted",
			give:      client.Result{Allowed: false, Limit: 100, Remaining: 40, RetryAfter: client.Never, ResetAfter: 6 * time.Second},
			policy:    Policy{Name: "api", Limit: tokenBucket},
			wantCalls: 1,
		},
		{
			name:      "shape, delay within MaxDelay",
			give:      client.Result{Allowed: true, Limit: 10, Remaining: 8, ResetAfter: 100 * time.Millisecond, Delay: 20 * time.Millisecond},
			policy:    Policy{Name: "shaped", Limit: shape},
			opts:      Options{MaxDelay: 200 * time.Millisecond},
			wantCalls: 1,
		},
		{
			name:      "shape, delay above MaxDelay",
			give:      client.Result{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 500 * time.Millisecond, Delay: 450 * time.Millisecond},
			policy:    Policy{Name: "shaped", Limit: shape},
			opts:      Options{MaxDelay: 200 * time.Millisecond},
			wantCalls: 1,
		},
		{
			name:      "shape, delay above the default MaxDelay",
			give:      client.Result{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 3500 * time.Millisecond, Delay: 3 * time.Second},
			policy:    Policy{Name: "shaped", Limit: shape},
			wantCalls: 1,
		},
		{
			name:      "limiter error, 503 by default",
			giveErr:   errDown,
			policy:    Policy{Name: "api", Limit: tokenBucket},
			wantCalls: 1,
			wantErr:   true,
		},
		{
			name:      "limiter error, FailOpen: served",
			giveErr:   errDown,
			policy:    Policy{Name: "api", Limit: tokenBucket},
			opts:      Options{FailOpen: true},
			wantCalls: 1,
			wantErr:   true,
		},
		{
			name:      "limiter error, ErrorStatus 429",
			giveErr:   errDown,
			policy:    Policy{Name: "api", Limit: tokenBucket},
			opts:      Options{ErrorStatus: http.StatusTooManyRequests},
			wantCalls: 1,
			wantErr:   true,
		},
		{
			name:      "limit refused by the client: 500",
			giveErr:   &client.LimitError{Field: "TokenBucket.Rate", Reason: "must be from 1 to 999999999999999, got 0"},
			policy:    Policy{Name: "api", Limit: client.TokenBucket{Capacity: 1, Period: time.Second}},
			wantCalls: 1,
			wantErr:   true,
		},
		{
			name:      "limit refused by the client, FailOpen: 500 all the same",
			giveErr:   &client.LimitError{Field: "TokenBucket.Capacity", Reason: "must be from 1 to 999999999999999, got 0"},
			policy:    Policy{Name: "api", Limit: client.TokenBucket{Rate: 1, Period: time.Second}},
			opts:      Options{FailOpen: true},
			wantCalls: 1,
			wantErr:   true,
		},
		{
			name:      "foreign state in the key, FailOpen: 500",
			giveErr:   &client.LibraryError{Function: "rl_token_bucket", Message: "rl_token_bucket: key 'x' holds a string of 3 bytes"},
			policy:    Policy{Name: "api", Limit: tokenBucket},
			opts:      Options{FailOpen: true},
			wantCalls: 1,
			wantErr:   true,
		},
		{
			name:      "key too long for the limiter: 400",
			giveErr:   &client.KeyError{Len: 1 << 20, Max: 512},
			policy:    Policy{Name: "api", Limit: tokenBucket},
			opts:      Options{FailOpen: true},
			wantCalls: 1,
			wantErr:   true,
		},
		{
			name:      "key too long for the limiter, problem+json",
			giveErr:   &client.KeyError{Len: 1 << 20, Max: 512},
			policy:    Policy{Name: "api", Limit: tokenBucket},
			opts:      Options{ProblemJSON: true},
			wantCalls: 1,
			wantErr:   true,
		},
		{
			name:    "bad policy name: 500",
			policy:  Policy{Name: "a:b", Limit: tokenBucket},
			wantErr: true,
		},
		{
			name:    "bad policy name, FailOpen: 500 all the same",
			policy:  Policy{Name: "my api", Limit: tokenBucket},
			opts:    Options{FailOpen: true},
			wantErr: true,
		},
		{
			name:   "key error",
			policy: Policy{Name: "api", Limit: tokenBucket},
			keyErr: errors.New("no API key"),
		},
		{
			name:    "empty key",
			policy:  Policy{Name: "api", Limit: tokenBucket},
			keyNone: true,
		},
		{
			name:   "no limit",
			policy: Policy{Name: "health"},
		},
		{
			name:      "allowed, X-RateLimit-Reset in delta seconds",
			give:      client.Result{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: 1100 * time.Millisecond},
			policy:    Policy{Name: "api", Limit: tokenBucket},
			opts:      Options{Reset: ResetDelta},
			wantCalls: 1,
		},
		{
			name:      "denied, X-RateLimit-Reset in delta seconds",
			give:      client.Result{Allowed: false, Limit: 100, Remaining: 0, RetryAfter: 1501 * time.Millisecond, ResetAfter: 10 * time.Second},
			policy:    Policy{Name: "api", Limit: tokenBucket},
			opts:      Options{Reset: ResetDelta},
			wantCalls: 1,
		},
		{
			name:      "denied, no X-RateLimit-Reset",
			give:      client.Result{Allowed: false, Limit: 100, Remaining: 0, RetryAfter: 1501 * time.Millisecond, ResetAfter: 10 * time.Second},
			policy:    Policy{Name: "api", Limit: tokenBucket},
			opts:      Options{Reset: ResetNone},
			wantCalls: 1,
		},
		{
			name:      "several limits, allowed, the second binding",
			give:      client.Result{Allowed: true, Limit: 1000, Remaining: 3, ResetAfter: time.Hour, Rule: 1},
			policy:    Policy{Name: "second", Limit: tokenBucket, Also: []AlsoLimit{{Name: "hour", Limit: hourly}, {Name: "day", Limit: daily}}},
			wantCalls: 3,
			wantKeys:  []string{"second:user:42", "hour:user:42", "day:user:42"},
		},
		{
			name:      "several limits, denied by the third",
			give:      client.Result{Allowed: false, Limit: 5000, Remaining: 0, RetryAfter: 3 * time.Hour, ResetAfter: 20 * time.Hour, Rule: 2},
			policy:    Policy{Name: "second", Limit: tokenBucket, Also: []AlsoLimit{{Name: "hour", Limit: hourly}, {Name: "day", Limit: daily}}},
			wantCalls: 3,
			wantKeys:  []string{"second:user:42", "hour:user:42", "day:user:42"},
		},
		{
			name: "several limits, each reported, allowed, the second binding",
			give: client.Result{Allowed: true, Limit: 1000, Remaining: 3, ResetAfter: 20 * time.Hour, Rule: 1},
			giveEach: []client.Result{
				{Allowed: true, Limit: 100, Remaining: 80, ResetAfter: 2 * time.Second},
				{Allowed: true, Limit: 1000, Remaining: 3, ResetAfter: 3599 * time.Second, Rule: 1},
				{Allowed: true, Limit: 5000, Remaining: 4000, ResetAfter: 20 * time.Hour, Rule: 2},
			},
			policy:    Policy{Name: "second", Limit: tokenBucket, Also: []AlsoLimit{{Name: "hour", Limit: hourly}, {Name: "day", Limit: daily}}},
			wantCalls: 3,
		},
		{
			name: "several limits, each reported, denied by the third, the first refunded",
			give: client.Result{Allowed: false, Limit: 5000, Remaining: 0, RetryAfter: 3 * time.Hour, ResetAfter: 20 * time.Hour, Rule: 2},
			giveEach: []client.Result{
				{Allowed: true, Limit: 100, Remaining: 100, ResetAfter: 0},
				{Allowed: false, Limit: 1000, Remaining: 0, RetryAfter: 1500 * time.Millisecond, ResetAfter: time.Hour, Rule: 1},
				{Allowed: false, Limit: 5000, Remaining: 0, RetryAfter: 3 * time.Hour, ResetAfter: 20 * time.Hour, Rule: 2},
			},
			policy:    Policy{Name: "second", Limit: tokenBucket, Also: []AlsoLimit{{Name: "hour", Limit: hourly}, {Name: "day", Limit: daily}}},
			wantCalls: 3,
		},
		{
			name: "several limits, each reported, one unread, one never admits",
			give: client.Result{Allowed: false, Limit: 100, Remaining: 2, RetryAfter: 500 * time.Millisecond, ResetAfter: 20 * time.Hour},
			giveEach: []client.Result{
				{Allowed: false, Limit: 100, Remaining: 2, RetryAfter: 500 * time.Millisecond, ResetAfter: 9 * time.Second},
				{},
				{Allowed: false, Limit: 5000, Remaining: 7, RetryAfter: client.Never, ResetAfter: 20 * time.Hour, Rule: 2},
			},
			policy:    Policy{Name: "second", Limit: tokenBucket, Also: []AlsoLimit{{Name: "hour", Limit: hourly}, {Name: "day", Limit: daily}}},
			wantCalls: 3,
		},
		{
			name: "several limits, hidden quota: no state read",
			give: client.Result{Allowed: false, Limit: 5, Remaining: 0, RetryAfter: 30 * time.Second, ResetAfter: time.Minute, Rule: 1},
			giveEach: []client.Result{
				{Allowed: true, Limit: 100, Remaining: 80, ResetAfter: 2 * time.Second},
				{Allowed: false, Limit: 5, Remaining: 0, RetryAfter: 30 * time.Second, ResetAfter: time.Minute, Rule: 1},
			},
			policy:     Policy{Name: "login", Limit: tokenBucket, HideQuota: true, Also: []AlsoLimit{{Name: "ip", Limit: hourly, Key: constKey("10.0.0.1")}}},
			wantCalls:  2,
			wantNoEach: true,
		},
		{
			name:      "several limits, keys of their own",
			give:      client.Result{Allowed: true, Limit: 100, Remaining: 50, ResetAfter: time.Minute},
			policy:    Policy{Name: "ip-user", Limit: tokenBucket, Also: []AlsoLimit{{Name: "ip", Limit: hourly, Key: constKey("10.0.0.1")}}},
			wantCalls: 2,
			wantKeys:  []string{"ip-user:user:42", "ip:10.0.0.1"},
		},
		{
			name:    "several limits, a rule's key error",
			policy:  Policy{Name: "ip-user", Limit: tokenBucket, Also: []AlsoLimit{{Name: "ip", Limit: hourly, Key: func(*http.Request) (string, error) { return "", errors.New("no IP") }}}},
			wantErr: false,
		},
		{
			name:    "several limits, a rule's empty key",
			policy:  Policy{Name: "ip-user", Limit: tokenBucket, Also: []AlsoLimit{{Name: "ip", Limit: hourly, Key: constKey("")}}},
			wantErr: false,
		},
		{
			name:    "several limits, two of one name: 500",
			policy:  Policy{Name: "a", Limit: tokenBucket, Also: []AlsoLimit{{Name: "b", Limit: hourly}, {Name: "b", Limit: daily}}},
			wantErr: true,
		},
		{
			name:    "several limits, a rule without a limit, FailOpen: 500",
			policy:  Policy{Name: "a", Limit: tokenBucket, Also: []AlsoLimit{{Name: "b"}}},
			opts:    Options{FailOpen: true},
			wantErr: true,
		},
		{
			name:      "hidden quota, allowed",
			give:      client.Result{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: time.Minute},
			policy:    Policy{Name: "login", Limit: tokenBucket, HideQuota: true},
			wantCalls: 1,
		},
		{
			name:      "hidden quota, denied",
			give:      client.Result{Allowed: false, Limit: 5, Remaining: 0, RetryAfter: 30 * time.Second, ResetAfter: time.Minute},
			policy:    Policy{Name: "login", Limit: tokenBucket, HideQuota: true},
			wantCalls: 1,
		},
		{
			name:      "hidden quota, denied, problem+json",
			give:      client.Result{Allowed: false, Limit: 5, Remaining: 0, RetryAfter: 30 * time.Second, ResetAfter: time.Minute},
			policy:    Policy{Name: "login", Limit: tokenBucket, HideQuota: true},
			opts:      Options{ProblemJSON: true},
			wantCalls: 1,
		},
		{
			name:      "denied, problem+json",
			give:      client.Result{Allowed: false, Limit: 100, Remaining: 0, RetryAfter: 1501 * time.Millisecond, ResetAfter: 10 * time.Second},
			policy:    Policy{Name: "api", Limit: tokenBucket},
			opts:      Options{ProblemJSON: true},
			wantCalls: 1,
		},
		{
			name:      "denied, never admitted, problem+json",
			give:      client.Result{Allowed: false, Limit: 100, Remaining: 40, RetryAfter: client.Never, ResetAfter: 6 * time.Second},
			policy:    Policy{Name: "api", Limit: tokenBucket},
			opts:      Options{ProblemJSON: true},
			wantCalls: 1,
		},
		{
			name:   "key error, problem+json",
			policy: Policy{Name: "api", Limit: tokenBucket},
			opts:   Options{ProblemJSON: true},
			keyErr: errors.New("no API key"),
		},
		{
			name:      "limiter error, ErrorStatus 503, problem+json",
			giveErr:   errDown,
			policy:    Policy{Name: "api", Limit: tokenBucket},
			opts:      Options{ErrorStatus: http.StatusServiceUnavailable, ProblemJSON: true},
			wantCalls: 1,
			wantErr:   true,
		},
		{
			name:      "shadow route, would deny: served without headers",
			give:      client.Result{Allowed: false, Limit: 100, Remaining: 0, RetryAfter: 1501 * time.Millisecond, ResetAfter: 10 * time.Second},
			policy:    Policy{Name: "api", Limit: tokenBucket, Shadow: true},
			wantCalls: 1,
		},
		{
			name:      "EnforcePercent 1, the key outside it: served in shadow",
			give:      client.Result{Allowed: false, Limit: 100, Remaining: 0, RetryAfter: 1501 * time.Millisecond, ResetAfter: 10 * time.Second},
			policy:    Policy{Name: "api", Limit: tokenBucket, EnforcePercent: 1}, // "user:42" hashes above 1
			wantCalls: 1,
		},
		{
			name:    "EnforcePercent 101: 500",
			policy:  Policy{Name: "api", Limit: tokenBucket, EnforcePercent: 101},
			wantErr: true,
		},
		{
			// the block's reply says limit 0: the headers say the policy's quota, r=0
			name:      "blocked",
			give:      client.Result{Blocked: true, RetryAfter: 899_001 * time.Millisecond, ResetAfter: 899_001 * time.Millisecond},
			policy:    Policy{Name: "login", Limit: penalized},
			wantCalls: 1,
		},
		{
			name:      "blocked, problem+json",
			give:      client.Result{Blocked: true, RetryAfter: 899_001 * time.Millisecond, ResetAfter: 899_001 * time.Millisecond},
			policy:    Policy{Name: "login", Limit: penalized},
			opts:      Options{ProblemJSON: true},
			wantCalls: 1,
		},
		{
			name:      "blocked, hidden quota: Retry-After alone",
			give:      client.Result{Blocked: true, RetryAfter: 899_001 * time.Millisecond, ResetAfter: 899_001 * time.Millisecond},
			policy:    Policy{Name: "login", Limit: penalized, HideQuota: true},
			wantCalls: 1,
		},
		{
			name:      "blocked, hidden quota, problem+json",
			give:      client.Result{Blocked: true, RetryAfter: 899_001 * time.Millisecond, ResetAfter: 899_001 * time.Millisecond},
			policy:    Policy{Name: "login", Limit: penalized, HideQuota: true},
			opts:      Options{ProblemJSON: true},
			wantCalls: 1,
		},
		{
			name: "blocked, several limits: each its own state, the deciding one r=0",
			give: client.Result{Blocked: true, RetryAfter: 600 * time.Second, ResetAfter: 600 * time.Second, Rule: 1},
			giveEach: []client.Result{
				{Allowed: true, Limit: 100, Remaining: 97, ResetAfter: 300 * time.Millisecond},
				{Allowed: true, Limit: 5, Remaining: 3, ResetAfter: 40 * time.Second},
			},
			policy:    Policy{Name: "user", Limit: tokenBucket, Also: []AlsoLimit{{Name: "ip", Limit: penalized, Key: constKey("10.0.0.1")}}},
			wantCalls: 2,
		},
		{
			// Europe/Berlin's day: 2027-01-14T23:00Z to 2027-01-15T23:00Z; now is 08:00:00.25Z
			name:      "calendar, allowed: w the day, t to its end",
			give:      client.Result{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: 53_999_750 * time.Millisecond},
			policy:    Policy{Name: "daily", Limit: berlinDay},
			wantCalls: 1,
		},
		{
			name:      "calendar, a window with no units: t to its end all the same",
			give:      client.Result{Allowed: false, Limit: 100, Remaining: 0, RetryAfter: client.Never},
			policy:    Policy{Name: "daily", Limit: berlinDay},
			wantCalls: 1,
		},
		{
			name:      "calendar, denied: t the wait, to the window's end",
			give:      client.Result{Allowed: false, Limit: 100, Remaining: 0, RetryAfter: 53_999_750 * time.Millisecond, ResetAfter: 53_999_750 * time.Millisecond},
			policy:    Policy{Name: "daily", Limit: berlinDay},
			wantCalls: 1,
		},
	}
	var out strings.Builder
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := &fake{res: tt.give, err: tt.giveErr, each: tt.giveEach}
			if tt.wantNoEach {
				lim.each = nil
				lim.forbidEach = true
			}
			var errs []error
			opts := tt.opts
			opts.Key = func(*http.Request) (string, error) {
				if tt.keyNone {
					return "", nil
				}
				return "user:42", tt.keyErr
			}
			opts.Policy = func(*http.Request) Policy { return tt.policy }
			opts.OnError = func(_ *http.Request, err error) { errs = append(errs, err) }
			opts.Now = now
			m, err := New(lim, opts)
			if err != nil {
				t.Fatal(err)
			}
			rec := httptest.NewRecorder()
			m.Handler(served).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			m.shadows.Wait() // the shadow decisions run on after the response

			if len(lim.calls) != tt.wantCalls {
				t.Fatalf("%d calls to the limiter, want %d", len(lim.calls), tt.wantCalls)
			}
			for i, k := range tt.wantKeys {
				if lim.calls[i].key != k {
					t.Errorf("call %d with key %q, want %q", i, lim.calls[i].key, k)
				}
			}
			if tt.wantCalls == 1 {
				name := tt.policy.Name
				if name == "" {
					name = DefaultPolicyName
				}
				if c := lim.calls[0]; c.key != name+":user:42" || c.limit != tt.policy.Limit {
					t.Errorf("limiter called with %q, %#v; want %q, %#v", c.key, c.limit, name+":user:42", tt.policy.Limit)
				}
			}
			if (len(errs) > 0) != tt.wantErr {
				t.Errorf("OnError got %v, want an error: %v", errs, tt.wantErr)
			}
			if tt.giveErr != nil && (len(errs) != 1 || errs[0] != tt.giveErr) {
				t.Errorf("OnError got %v, want exactly the limiter's error", errs)
			}
			if ct := rec.Header().Get("Content-Type"); (ct == "application/json" || ct == "application/problem+json") && !json.Valid(rec.Body.Bytes()) {
				t.Errorf("body is not JSON: %q", rec.Body)
			}
			fmt.Fprintf(&out, "=== %s\n%s\n", tt.name, dump(rec))
		})
	}
	golden(t, "responses.golden", out.String())
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("responses differ from %s (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// A request admitted with a delay reaches the next handler no sooner than the delay.
func TestHoldsForDelay(t *testing.T) {
	const delay = 50 * time.Millisecond
	lim := &fake{res: client.Result{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: time.Second, Delay: delay}}
	var reached time.Duration
	start := time.Now()
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = time.Since(start) })
	m := mustNew(t, lim, Options{MaxDelay: 10 * time.Second})
	rec := httptest.NewRecorder()
	m.Handler(next).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	// held for the delay, not for MaxDelay; the upper bound is generous for a loaded machine
	if rec.Code != http.StatusOK || reached < delay || reached > 2*time.Second {
		t.Fatalf("status %d, next handler reached after %s; want 200 after %s (under 2s)", rec.Code, reached, delay)
	}
}

// A request whose context ends while it is held is answered 503, promptly, and never reaches
// the next handler.
func TestHoldEndsWithContext(t *testing.T) {
	lim := &fake{res: client.Result{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: time.Hour, Delay: 50 * time.Minute}}
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("next handler reached") })
	m := mustNew(t, lim, Options{MaxDelay: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	rec := httptest.NewRecorder()
	start := time.Now()
	m.Handler(next).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	if took := time.Since(start); took > 20*time.Millisecond+2*time.Second {
		t.Errorf("returned after %s, long after the context ended", took)
	}
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("RateLimit") == "" {
		t.Errorf("status %d, headers %v; want 503 with the rate-limit headers", rec.Code, rec.Header())
	}
}

// A request its client cancelled while the limiter decided is not a limiter failure: nothing
// is reported to OnError and nothing is answered (the client is gone).
func TestCancelledRequestIsNoFailure(t *testing.T) {
	lim := &fake{err: fmt.Errorf("client: rl_token_bucket: %w", context.Canceled)}
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("next handler reached") })
	m := mustNew(t, lim, Options{
		Policy:      func(*http.Request) Policy { return Policy{Limit: tokenBucket} },
		ErrorStatus: http.StatusServiceUnavailable,
		OnError:     func(_ *http.Request, err error) { t.Errorf("OnError(%v)", err) },
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := httptest.NewRecorder()
	m.Handler(next).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	if rec.Code != http.StatusOK || rec.Body.Len() != 0 || len(lim.calls) != 1 {
		t.Errorf("status %d, body %q, %d calls; want nothing written after the one call", rec.Code, rec.Body, len(lim.calls))
	}
}

func mustNew(t testing.TB, lim Decider, opts Options) *Middleware {
	t.Helper()
	if opts.Key == nil {
		opts.Key = func(*http.Request) (string, error) { return "k", nil }
	}
	if opts.Policy == nil {
		opts.Policy = func(*http.Request) Policy { return Policy{Name: "p", Limit: shape} }
	}
	m, err := New(lim, opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestWindow(t *testing.T) {
	tests := []struct {
		give   client.Limit
		want   int64
		wantOK bool
	}{
		{client.FixedWindow{Limit: 100, Window: time.Minute}, 60, true},
		{&client.FixedWindow{Limit: 100, Window: time.Minute}, 60, true},
		{client.SlidingLog{Limit: 10, Window: 1500 * time.Millisecond}, 2, true},
		{client.SlidingWindow{Limit: 10, Window: time.Millisecond}, 1, true},
		{client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second}, 10, true},
		{client.TokenBucket{Capacity: 10, Rate: 3, Period: time.Second}, 4, true},
		{&client.TokenBucket{Capacity: 1, Rate: 1000, Period: time.Millisecond}, 1, true},
		{client.LeakyBucket{Capacity: 3, Rate: 1, Period: 2 * time.Second, Mode: client.Shape}, 6, true},
		// the largest time.Duration, rounded up
		{client.LeakyBucket{Capacity: 999999999999999, Rate: 1, Period: 100000000000 * time.Millisecond}, 9223372037, true},
		{client.TokenBucket{Capacity: 1, Rate: 0, Period: time.Second}, 0, false},
		{client.FixedWindow{Limit: 1}, 0, false},
	}
	for _, tt := range tests {
		got, ok := window(tt.give)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("window(%#v) = %d, %v; want %d, %v", tt.give, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestUnitLeak(t *testing.T) {
	tests := []struct {
		give client.Limit
		want time.Duration
	}{
		{client.LeakyBucket{Capacity: 5, Rate: 2, Period: time.Second, Mode: client.Shape}, 500 * time.Millisecond},
		{&client.LeakyBucket{Capacity: 5, Rate: 3, Period: time.Millisecond}, 333334 * time.Nanosecond},
		{client.LeakyBucket{Capacity: 5, Rate: 3, Period: time.Second}, 333333334 * time.Nanosecond},
		{client.TokenBucket{Capacity: 5, Rate: 2, Period: time.Second}, 0},
		{client.LeakyBucket{Capacity: 5, Period: time.Second}, 0},
	}
	for _, tt := range tests {
		if got := unitLeak(tt.give); got != tt.want {
			t.Errorf("unitLeak(%#v) = %s, want %s", tt.give, got, tt.want)
		}
	}
}

func TestSeconds(t *testing.T) {
	tests := []struct {
		give time.Duration
		want string
	}{
		{0, "0"},
		{-time.Second, "0"},
		{time.Millisecond, "1"},
		{time.Second, "1"},
		{time.Second + time.Millisecond, "2"},
		{90 * time.Second, "90"},
	}
	for _, tt := range tests {
		if got := string(appendSeconds(nil, tt.give)); got != tt.want {
			t.Errorf("seconds(%s) = %s, want %s", tt.give, got, tt.want)
		}
	}
}

func TestNewRefusesOptions(t *testing.T) {
	key := func(*http.Request) (string, error) { return "", nil }
	policy := func(*http.Request) Policy { return Policy{} }
	tests := []struct {
		name      string
		lim       Decider
		give      Options
		wantField string
	}{
		{"no limiter", nil, Options{Key: key, Policy: policy}, "Limiter"},
		{"nil *client.Limiter", (*client.Limiter)(nil), Options{Key: key, Policy: policy}, "Limiter"},
		{"no key", &fake{}, Options{Policy: policy}, "Key"},
		{"no policy", &fake{}, Options{Key: key}, "Policy"},
		{"negative MaxDelay", &fake{}, Options{Key: key, Policy: policy, MaxDelay: -1}, "MaxDelay"},
		{"ErrorStatus 200", &fake{}, Options{Key: key, Policy: policy, ErrorStatus: 200}, "ErrorStatus"},
		{"ErrorStatus 600", &fake{}, Options{Key: key, Policy: policy, ErrorStatus: 600}, "ErrorStatus"},
		{"ErrorStatus and FailOpen", &fake{}, Options{Key: key, Policy: policy, ErrorStatus: 503, FailOpen: true}, "ErrorStatus"},
		{"Reset 3", &fake{}, Options{Key: key, Policy: policy, Reset: ResetNone + 1}, "Reset"},
	}
	for _, tt := range tests {
		_, err := New(tt.lim, tt.give)
		var oe *ConfigError
		if !errors.As(err, &oe) || oe.Field != tt.wantField || !strings.HasPrefix(err.Error(), "httplimit: ") {
			t.Errorf("%s: got %v, want an *ConfigError for %s", tt.name, err, tt.wantField)
		}
	}
}

func TestRemoteIP(t *testing.T) {
	tests := []struct {
		give    string
		want    string
		wantErr bool
	}{
		{"127.0.0.1:1234", "127.0.0.1", false},
		{"[::1]:80", "::1", false},
		{"nonsense", "", true},
	}
	for _, tt := range tests {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tt.give
		got, err := RemoteIP(r)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("RemoteIP(%q) = %q, %v", tt.give, got, err)
		}
	}
}

// logTo makes slog.Default write text to a buffer for the test.
func logTo(t *testing.T) *bytes.Buffer {
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	return &buf
}

// The default OnError logs the first error, holds back the next ones within the interval, and
// reports how many it held back with the next error it logs.
func TestErrorLogIsThrottled(t *testing.T) {
	buf := logTo(t)
	l := &errorLog{every: 50 * time.Millisecond}
	r := httptest.NewRequest("GET", "/x", nil)
	for range 3 {
		l.log(r, unavailable, "api", errDown)
	}
	if n := strings.Count(buf.String(), "\n"); n != 1 {
		t.Fatalf("%d lines logged for 3 errors within the interval, want 1:\n%s", n, buf)
	}
	time.Sleep(60 * time.Millisecond)
	l.log(r, unavailable, "other", errDown)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "errors_not_logged=2") || !strings.Contains(lines[1], "connection refused") {
		t.Fatalf("after the interval: %q; want a second line with errors_not_logged=2", lines)
	}
}

// A misconfigured route is logged with what is wrong, and a dead server's flood of errors or
// another route's mistake does not hide it: each misconfigured policy has its own throttle.
func TestErrorLogMisconfigured(t *testing.T) {
	buf := logTo(t)
	l := &errorLog{every: time.Hour}
	r := httptest.NewRequest("GET", "/x", nil)
	bad := &PolicyError{Name: "my api", Reason: nameReason}
	zero := &client.LimitError{Field: "TokenBucket.Capacity", Reason: "must be from 1 to 999999999999999, got 0"}
	for range 3 {
		l.log(r, unavailable, "api", errDown)
		l.log(r, misconfigured, "my api", bad)
		l.log(r, misconfigured, "bucket", zero)
		l.log(r, refusedKey, "api", &client.KeyError{Len: 1 << 20, Max: 512})
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{
		"no rate-limit decision",
		`rate limit misconfigured, answered 500" err="httplimit: policy \"my api\": want letters`,
		`rate limit misconfigured, answered 500" err="client: TokenBucket.Capacity must be from 1`,
		`key refused, answered 400" err="client: the key is 1048576 bytes`,
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf)
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) {
			t.Errorf("line %d: %s\nwant it to hold %s", i, lines[i], w)
		}
	}
	if !strings.Contains(lines[2], "policy=bucket") {
		t.Errorf("the log line does not name the policy: %s", lines[2])
	}
}

// BenchmarkMiddleware is the middleware's own cost per request around a decision that takes
// no time: policy, key, headers, and the 429 body when denied.
func BenchmarkMiddleware(b *testing.B) {
	for _, bb := range []struct {
		name string
		res  client.Result
	}{
		{"allowed", client.Result{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: 100 * time.Millisecond}},
		{"denied", client.Result{Limit: 100, RetryAfter: 1500 * time.Millisecond, ResetAfter: 10 * time.Second}},
	} {
		b.Run(bb.name, func(b *testing.B) {
			m, err := New(&constant{bb.res}, Options{
				Key:    RemoteIP,
				Policy: func(*http.Request) Policy { return Policy{Name: "api", Limit: tokenBucket} },
			})
			if err != nil {
				b.Fatal(err)
			}
			h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			r := httptest.NewRequest("GET", "/", nil)
			w := discard{http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				h.ServeHTTP(w, r)
			}
		})
	}
}

// constant is a Limiter that answers one Result, recording nothing.
type constant struct{ res client.Result }

func (c *constant) Allow(context.Context, string, client.Limit) (client.Result, error) {
	return c.res, nil
}

// discard is a ResponseWriter that keeps nothing but its header map.
type discard struct{ h http.Header }

func (d discard) Header() http.Header       { return d.h }
func (discard) Write(p []byte) (int, error) { return len(p), nil }
func (discard) WriteHeader(int)             {}

// A handler after the middleware may add to its headers without changing the others: the
// values share one array, each capped at its own element.
func TestHeadersAddIndependently(t *testing.T) {
	lim := &fake{res: client.Result{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: time.Second}}
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		for _, k := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining"} {
			w.Header().Add(k, `"other";q=1`)
		}
	})
	rec := httptest.NewRecorder()
	mustNew(t, lim, Options{Reset: ResetDelta}).Handler(next).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	h := rec.Result().Header
	want := http.Header{
		"Ratelimit-Policy":      {`"p";q=100;w=1`, `"other";q=1`},
		"Ratelimit":             {`"p";r=99;t=1`, `"other";q=1`},
		"X-Ratelimit-Limit":     {"100", `"other";q=1`},
		"X-Ratelimit-Remaining": {"99", `"other";q=1`},
		"X-Ratelimit-Reset":     {"1"},
	}
	for k, v := range want {
		if !slices.Equal(h[k], v) {
			t.Errorf("%s: %q, want %q", k, h[k], v)
		}
	}
}

// The default clock of X-RateLimit-Reset is never behind time.Now, and at most a tick (and
// a scheduling delay) ahead of it.
func TestCoarseClock(t *testing.T) {
	for range 5 {
		before := time.Now().UnixNano()
		got := coarseNanos()
		after := time.Now().UnixNano()
		// the goroutine may be late to tick on a loaded machine: a second is generous
		if got < before || got > after+int64(time.Second) {
			t.Fatalf("coarseNanos %d, want from %d to %d plus a tick", got, before, after)
		}
		time.Sleep(30 * time.Millisecond)
	}
}

func TestAppendUnix(t *testing.T) {
	const s = int64(time.Second)
	tests := []struct {
		now  int64
		d    time.Duration
		want string
	}{
		{1_800_000_000 * s, 0, "1800000000"},
		{1_800_000_000 * s, time.Nanosecond, "1800000001"},
		{1_800_000_000*s + 1, 0, "1800000001"},
		{1_800_000_000*s + 250_000_000, 750 * time.Millisecond, "1800000001"},
		{1_800_000_000*s + 250_000_000, 751 * time.Millisecond, "1800000002"},
		{1_800_000_000 * s, -time.Second, "1800000000"},
	}
	for _, tt := range tests {
		if got := string(appendUnix(nil, tt.now, tt.d)); got != tt.want {
			t.Errorf("appendUnix(%d, %s) = %s, want %s", tt.now, tt.d, got, tt.want)
		}
	}
}

// A Calendar's headers describe the window that holds now by Options.Now: w its length (23
// hours on the day clocks go forward), t and X-RateLimit-Reset its end, whether or not the
// reply had a reset (a window that holds no units has none).
func TestCalendarHeaders(t *testing.T) {
	// Sunday 29 March 2026 in Berlin: 00:00 CET is 2026-03-28T23:00Z, the next midnight CEST
	// 2026-03-29T22:00Z, 23 hours later. Now is 12:00:00.5Z: 9h59m59.5s to the end.
	at := time.Date(2026, 3, 29, 12, 0, 0, 500_000_000, time.UTC)
	end := time.Date(2026, 3, 29, 22, 0, 0, 0, time.UTC)
	day := client.Calendar{Limit: 10, Period: client.Day, Anchor: time.Date(2026, 1, 1, 0, 0, 0, 0, mustLoad("Europe/Berlin"))}
	type embedded struct{ client.Calendar }
	tests := []struct {
		name   string
		policy Policy
		reset  ResetFormat
		give   client.Result
		each   []client.Result
		at     time.Time // default: at
		want   http.Header
	}{
		{
			// docs/http.md's: 25 hours, and 14.5 of them left at 9:30
			name:   "New York, the day clocks go back",
			policy: Policy{Name: "daily", Limit: client.Calendar{Limit: 1000, Period: client.Day, Anchor: time.Date(2026, 1, 1, 0, 0, 0, 0, mustLoad("America/New_York"))}},
			give:   client.Result{Allowed: true, Limit: 1000, Remaining: 999},
			at:     time.Date(2026, 11, 1, 9, 30, 0, 0, mustLoad("America/New_York")),
			want: http.Header{
				"Ratelimit-Policy": {`"daily";q=1000;w=90000`},
				"Ratelimit":        {`"daily";r=999;t=52200`},
			},
		},
		{
			// the server's clock a little behind: the headers say the window's end all the same
			name:   "the window's end, not the reply's reset",
			policy: Policy{Name: "d", Limit: day},
			give:   client.Result{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: end.Sub(at) + 2*time.Second},
			want: http.Header{
				"Ratelimit-Policy":  {`"d";q=10;w=82800`},
				"Ratelimit":         {`"d";r=9;t=36000`},
				"X-Ratelimit-Reset": {strconv.FormatInt(end.Unix(), 10)},
			},
		},
		{
			name:   "no reset in the reply: the window's end",
			policy: Policy{Name: "d", Limit: &day},
			reset:  ResetDelta,
			give:   client.Result{Allowed: true, Limit: 10, Remaining: 10},
			want: http.Header{
				"Ratelimit-Policy":  {`"d";q=10;w=82800`},
				"Ratelimit":         {`"d";r=10;t=36000`},
				"X-Ratelimit-Reset": {"36000"},
			},
		},
		{
			name:   "a caller's type that embeds a Calendar",
			policy: Policy{Name: "d", Limit: embedded{day}},
			give:   client.Result{Allowed: true, Limit: 10, Remaining: 10},
			want: http.Header{
				"Ratelimit-Policy":  {`"d";q=10;w=82800`},
				"Ratelimit":         {`"d";r=10;t=36000`},
				"X-Ratelimit-Reset": {strconv.FormatInt(end.Unix(), 10)},
			},
		},
		{
			name:   "an AlsoLimit's calendar, its window empty: its t the window's end",
			policy: Policy{Name: "api", Limit: tokenBucket, Also: []AlsoLimit{{Name: "d", Limit: day}}},
			give:   client.Result{Allowed: false, Limit: 100, RetryAfter: 1500 * time.Millisecond, ResetAfter: 10 * time.Second},
			each: []client.Result{
				{Allowed: false, Limit: 100, RetryAfter: 1500 * time.Millisecond, ResetAfter: 10 * time.Second},
				{Allowed: true, Limit: 10, Remaining: 10},
			},
			want: http.Header{
				"Ratelimit-Policy":  {`"api";q=100;w=10, "d";q=10;w=82800`},
				"Ratelimit":         {`"api";r=0;t=2, "d";r=10;t=36000`},
				"X-Ratelimit-Reset": {strconv.FormatInt(at.Unix()+2, 10)},
				"Retry-After":       {"2"},
			},
		},
		{
			name:   "blocked by a calendar's penalty: t the block's",
			policy: Policy{Name: "d", Limit: client.Calendar{Limit: 10, Period: client.Day, Anchor: day.Anchor, Penalty: time.Hour}},
			give:   client.Result{Blocked: true, RetryAfter: 30 * time.Minute, ResetAfter: 30 * time.Minute},
			want: http.Header{
				"Ratelimit-Policy":      {`"d";q=10;w=82800`},
				"Ratelimit":             {`"d";r=0;t=1800`},
				"X-Ratelimit-Limit":     {"10"},
				"X-Ratelimit-Remaining": {"0"},
				"X-Ratelimit-Reset":     {strconv.FormatInt(at.Unix()+1801, 10)},
				"Retry-After":           {"1800"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := &fake{res: tt.give, each: tt.each}
			m := mustNew(t, lim, Options{
				Key:    constKey("k"),
				Policy: func(*http.Request) Policy { return tt.policy },
				Reset:  tt.reset,
				Now: func() time.Time {
					if !tt.at.IsZero() {
						return tt.at
					}
					return at
				},
			})
			rec := httptest.NewRecorder()
			m.Handler(served).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			for k, v := range tt.want {
				if got := rec.Result().Header[k]; !slices.Equal(got, v) {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
			}
		})
	}
}

// A blocked decision's body says so, unless the quota is hidden; a denial by a limit does not.
func TestBlockedBody(t *testing.T) {
	for _, tt := range []struct {
		name    string
		give    client.Result
		hide    bool
		problem bool
		want    bool
	}{
		{"blocked", client.Result{Blocked: true, RetryAfter: time.Minute}, false, false, true},
		{"blocked, problem+json", client.Result{Blocked: true, RetryAfter: time.Minute}, false, true, true},
		{"blocked, hidden", client.Result{Blocked: true, RetryAfter: time.Minute}, true, false, false},
		{"blocked, hidden, problem+json", client.Result{Blocked: true, RetryAfter: time.Minute}, true, true, false},
		{"denied by the limit", client.Result{Limit: 5, RetryAfter: time.Minute}, false, false, false},
		{"denied by the limit, problem+json", client.Result{Limit: 5, RetryAfter: time.Minute}, false, true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := mustNew(t, &fake{res: tt.give}, Options{
				Key:         constKey("k"),
				Policy:      func(*http.Request) Policy { return Policy{Name: "p", Limit: penalized, HideQuota: tt.hide} },
				ProblemJSON: tt.problem,
				Now:         now, // TestCoarseClock starts the coarse clock itself
			})
			rec := httptest.NewRecorder()
			m.Handler(served).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			var b struct {
				Blocked bool `json:"blocked"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if rec.Code != http.StatusTooManyRequests || b.Blocked != tt.want || rec.Header().Get("Retry-After") != "60" {
				t.Errorf("%d %v %q: want 429, Retry-After 60, blocked %t", rec.Code, rec.Header(), rec.Body, tt.want)
			}
		})
	}
}
