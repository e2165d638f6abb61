package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go/mock"

	"github.com/rlfn/rlfn/client"
)

// The status a handler ends with, however it answers.
func TestOutcomeStatus(t *testing.T) {
	for _, tt := range []struct {
		name    string
		handler func(w http.ResponseWriter)
		want    int
	}{
		{"nothing written", func(http.ResponseWriter) {}, 200},
		{"a write", func(w http.ResponseWriter) { w.Write([]byte("x")) }, 200},
		{"WriteHeader", func(w http.ResponseWriter) { w.WriteHeader(404); w.WriteHeader(500) }, 404},
		{"an error handler", func(w http.ResponseWriter) { http.Error(w, "no", 503) }, 503},
		{"informational first", func(w http.ResponseWriter) { w.WriteHeader(103); w.WriteHeader(401) }, 401},
		{"flushed", func(w http.ResponseWriter) { w.(http.Flusher).Flush(); w.WriteHeader(500) }, 200},
		{"through ResponseController", func(w http.ResponseWriter) {
			http.NewResponseController(w).Flush()
		}, 200},
	} {
		ow := &outcomeWriter{ResponseWriter: httptest.NewRecorder()}
		tt.handler(ow)
		if got := ow.outcome(); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
	ow := &outcomeWriter{hijacked: true}
	if got := ow.outcome(); got != http.StatusSwitchingProtocols {
		t.Errorf("hijacked: %d, want 101", got)
	}
}

// settleLimiter is a Limiter that settles, recording what.
type settleLimiter struct {
	constant
	refunds, charges int64
}

func (s *settleLimiter) AllowAll(context.Context, []client.Rule) (client.Result, error) {
	return s.res, nil
}
func (s *settleLimiter) AllowN(_ context.Context, _ string, _ client.Limit, n int64) (client.Result, error) {
	s.charges += n
	return client.Result{Allowed: true}, nil
}
func (s *settleLimiter) PeekN(context.Context, string, client.Limit, int64) (client.Result, error) {
	return s.res, nil
}
func (s *settleLimiter) Refund(_ context.Context, _ string, _ client.Limit, n int64) (client.Result, error) {
	s.refunds += n
	return client.Result{}, nil
}

// A handler's panic is settled as a 500, then goes on.
func TestOutcomePanicSettles(t *testing.T) {
	lim := &settleLimiter{constant: constant{client.Result{Allowed: true, Limit: 5, Remaining: 4}}}
	m, err := New(lim, Options{Key: RemoteIP, Policy: func(*http.Request) Policy {
		return Policy{Name: "api", Limit: tokenBucket, Outcome: &Outcome{Count: Successes}}
	}})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("recovered %v, want the handler's panic passed on", v)
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}()
	if lim.refunds != 1 {
		t.Errorf("%d refunded, want the unit of a request that failed", lim.refunds)
	}
}

// New refuses a policy whose outcome the Limiter cannot settle, a check first without a limit
// to peek, and a unit that needs escaping.
func TestOutcomeRefused(t *testing.T) {
	for _, tt := range []struct {
		name string
		lim  Decider
		p    Policy
		want error
	}{
		{"no settler", &constant{}, Policy{Limit: tokenBucket, Outcome: &Outcome{}}, ErrNoSettler},
		{"check first alone", &settleLimiter{}, Policy{Concurrency: &client.Concurrency{Limit: 1, Lease: 1e9}, Outcome: &Outcome{CheckFirst: true}}, nil},
		{"unit", &constant{}, Policy{Limit: tokenBucket, Unit: "to kens"}, nil},
		{"cost without a multi decider", &constant{}, Policy{Limit: tokenBucket, Cost: func(*http.Request) int64 { return 2 }}, ErrNoMultiDecider},
	} {
		_, err := New(tt.lim, Options{Key: RemoteIP, Policy: func(*http.Request) Policy { return tt.p }, Policies: []Policy{tt.p}})
		var ce *ConfigError
		var pe *PolicyError
		if !errors.As(err, &ce) || tt.want != nil && !errors.Is(err, tt.want) || tt.want == nil && !errors.As(err, &pe) {
			t.Errorf("%s: %v, want a *ConfigError of %v", tt.name, err, tt.want)
		}
	}
}

// multi records the rules of the decisions it makes.
type multi struct {
	constant
	rules []client.Rule
}

func (m *multi) AllowAll(_ context.Context, rules []client.Rule) (client.Result, error) {
	m.rules = rules
	return m.res, nil
}

// A Policy's Cost is its limit's cost in the one decision, and its Unit the item's qu.
func TestPolicyCost(t *testing.T) {
	lim := &multi{constant: constant{client.Result{Allowed: true, Limit: 100, Remaining: 95}}}
	m, err := New(lim, Options{Key: RemoteIP, Policy: func(*http.Request) Policy {
		return Policy{Name: "bytes", Limit: tokenBucket, Unit: "bytes", Cost: func(r *http.Request) int64 { return r.ContentLength }}
	}})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequest("POST", "/", nil)
	r.ContentLength = 5
	m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(w, r)
	if len(lim.rules) != 1 || lim.rules[0].Cost != 5 {
		t.Errorf("rules %v, want one of cost 5", lim.rules)
	}
	if got := w.Header().Get("RateLimit-Policy"); got != `"bytes";q=100;w=10;qu="bytes"` {
		t.Errorf("RateLimit-Policy %q", got)
	}
}

// An AlsoLimit with SameKey is counted on the Policy's key, in the one decision with the
// Policy's Limit; one without keeps the key of its own, as before; a refusal names the limit
// that refused.
func TestSameKey(t *testing.T) {
	tokens := client.TokenBucket{Capacity: 150_000, Rate: 150_000, Period: time.Minute}
	lim := &multi{constant: constant{client.Result{Allowed: true, Limit: 60, Remaining: 59}}}
	m, err := New(lim, Options{Key: constKey("org7"), Policy: func(*http.Request) Policy {
		return Policy{Name: "requests", Limit: hourly, Also: []AlsoLimit{
			{Name: "tokens", Limit: tokens, SameKey: true, Unit: "tokens", Cost: func(*http.Request) int64 { return 1200 }},
			{Name: "daily", Limit: daily},
		}}
	}})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	got := make([]string, len(lim.rules))
	for i, r := range lim.rules {
		got[i] = fmt.Sprint(r.Key, " ", r.Cost)
	}
	if want := "[requests:org7 0 requests:org7 1200 daily:org7 0]"; fmt.Sprint(got) != want {
		t.Errorf("rules %v, want %s", got, want)
	}
	if got := w.Header().Get("RateLimit-Policy"); got != `"requests";q=60;w=3600, "tokens";q=150000;w=60;qu="tokens", "daily";q=5000;w=86400` {
		t.Errorf("RateLimit-Policy %q", got)
	}
}

// A policy Options.Policy makes up per request, whose SameKey limit would be the Policy's own
// limiter, is a configuration mistake the client refuses before any call: answered 500, the
// *client.LimitError to OnError.
func TestSameKeyOneLimiterAtRequestTime(t *testing.T) {
	lim, err := client.New(mock.NewClient(nil), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got error
	m, err := New(lim, Options{Key: constKey("org7"),
		Policy: func(*http.Request) Policy {
			return Policy{Name: "requests", Limit: tokenBucket, Also: []AlsoLimit{{Name: "tokens", Limit: tokenBucket, SameKey: true}}}
		},
		OnError: func(_ *http.Request, err error) { got = err },
	})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("served") })).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	var le *client.LimitError
	if w.Code != http.StatusInternalServerError || !errors.As(got, &le) {
		t.Errorf("%d, OnError got %v; want 500 and a *client.LimitError", w.Code, got)
	}
}
