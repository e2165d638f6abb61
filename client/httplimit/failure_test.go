package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/rlfn/rlfn/client"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		give error
		want failure
	}{
		{errDown, unavailable},
		{client.ErrCircuitOpen, unavailable},
		{client.ErrNotLoaded, unavailable},
		{&client.VersionError{Node: "n", Version: "1.0.0", Want: "1.1.0"}, unavailable},
		{context.DeadlineExceeded, unavailable},
		{fmt.Errorf("client: rl_fixed_window: reply out of contract: 4 elements, want 6"), unavailable},
		{&client.KeyError{Len: 600, Max: 512}, refusedKey},
		{&client.KeyError{Max: 512}, refusedKey},
		{ErrEmptyKey, refusedKey},
		{&PolicyError{Name: "my api", Reason: nameReason}, misconfigured},
		{&client.LimitError{Field: "TokenBucket.Capacity", Reason: "must be from 1"}, misconfigured},
		{fmt.Errorf("wrapped: %w", &client.LimitError{Field: "rules[1].Limit", Reason: "must not be nil"}), misconfigured},
		{&client.LibraryError{Function: "rl_fixed_window", Message: "key holds a list"}, misconfigured},
		{ErrNoMultiDecider, misconfigured},
		{ErrNoAcquirer, misconfigured},
	}
	for _, tt := range tests {
		if got := classify(tt.give); got != tt.want {
			t.Errorf("classify(%v) = %d, want %d", tt.give, got, tt.want)
		}
	}
}

// A Key that returns "" is no key: an enforced limit answers 400 "missing key" without asking
// the limiter (which would count every such request under "name:"), a shadow limit reports
// ErrEmptyKey and serves.
func TestEmptyKey(t *testing.T) {
	tests := []struct {
		name       string
		key        string
		policy     Policy
		wantStatus int
		wantShadow string // the policy of the *ShadowKeyError
	}{
		{name: "Options.Key", key: "", policy: Policy{Name: "api", Limit: tokenBucket}, wantStatus: 400},
		{name: "an AlsoLimit's Key", key: "k",
			policy:     Policy{Name: "api", Limit: tokenBucket, Also: []AlsoLimit{{Name: "ip", Limit: hourly, Key: constKey("")}}},
			wantStatus: 400},
		{name: "a shadow AlsoLimit's Key", key: "k",
			policy:     Policy{Name: "api", Limit: tokenBucket, Also: []AlsoLimit{{Name: "ip", Limit: hourly, Key: constKey(""), Shadow: true}}},
			wantStatus: 200, wantShadow: "ip"},
		{name: "a route in shadow", key: "", policy: Policy{Name: "api", Limit: tokenBucket, Shadow: true},
			wantStatus: 200, wantShadow: "api"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := &byName{results: map[string]client.Result{"api": admits, "ip": admits}}
			var mu sync.Mutex
			var errs []error
			m := mustNew(t, lim, Options{
				Key:     constKey(tt.key),
				Policy:  func(*http.Request) Policy { return tt.policy },
				OnError: func(_ *http.Request, err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() },
			})
			rec := httptest.NewRecorder()
			m.Handler(served).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			m.shadows.Wait()
			if rec.Code != tt.wantStatus {
				t.Errorf("status %d, want %d", rec.Code, tt.wantStatus)
			}
			if tt.wantStatus == 400 && (rec.Body.String() != `{"error":"missing key"}`+"\n" || len(lim.called()) != 0) {
				t.Errorf("body %q, keys decided %q; want missing key, none", rec.Body, lim.called())
			}
			var ske *ShadowKeyError
			switch {
			case tt.wantShadow == "" && len(errs) > 0:
				t.Errorf("OnError(%v), want none", errs)
			case tt.wantShadow != "" && (len(errs) != 1 || !errors.As(errs[0], &ske) || ske.Policy != tt.wantShadow || !errors.Is(errs[0], ErrEmptyKey)):
				t.Errorf("OnError(%v), want a *ShadowKeyError of %q with ErrEmptyKey", errs, tt.wantShadow)
			}
		})
	}
}

// A refused key reaches the default log (a service whose keys are all too long answers every
// request 400, which someone must see); so does a misconfigured route, with what is wrong.
func TestDefaultLogSaysWhatIsWrong(t *testing.T) {
	buf := logTo(t)
	tests := []struct {
		err    error
		policy Policy
		want   string
	}{
		{&client.KeyError{Len: 1 << 20, Max: 512}, Policy{Name: "api", Limit: tokenBucket}, `key refused, answered 400" err="client: the key is 1048576 bytes`},
		{nil, Policy{Name: "my api", Limit: tokenBucket}, `rate limit misconfigured, answered 500" err="httplimit: policy \"my api\": want letters`},
		{&client.LimitError{Field: "TokenBucket.Capacity", Reason: "must be from 1 to 999999999999999, got 0"}, Policy{Name: "zero", Limit: client.TokenBucket{}},
			`rate limit misconfigured, answered 500" err="client: TokenBucket.Capacity must be from 1 to 999999999999999, got 0"`},
	}
	for _, tt := range tests {
		buf.Reset()
		m := mustNew(t, &fake{err: tt.err}, Options{Policy: func(*http.Request) Policy { return tt.policy }, FailOpen: true})
		rec := httptest.NewRecorder()
		m.Handler(served).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if rec.Code == http.StatusOK || !strings.Contains(buf.String(), tt.want) {
			t.Errorf("status %d, log %q; want refused, and a line holding %s", rec.Code, buf, tt.want)
		}
	}
}
