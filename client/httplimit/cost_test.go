package httplimit

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
)

// A cost computed from what the request sent (Example_tokens' X-Max-Tokens) that no limit takes
// is the request's fault: 400 "invalid cost", no decision, nothing reported or logged as a
// misconfiguration. A limit in shadow whose cost is invalid is left out, and the request
// served.
func TestBadCostIsTheRequests(t *testing.T) {
	buf := logTo(t)
	header := func(r *http.Request) int64 {
		n, err := strconv.ParseInt(r.Header.Get("X-Max-Tokens"), 10, 64)
		if err != nil {
			return -1
		}
		return n
	}
	tokens := client.TokenBucket{Capacity: 150_000, Rate: 150_000, Period: time.Minute}
	for _, tt := range []struct {
		name      string
		give      string // X-Max-Tokens
		policy    Policy
		wantCode  int
		wantRules int // the rules decided
	}{
		{name: "negative, an AlsoLimit's", give: "-5", wantCode: 400,
			policy: Policy{Name: "requests", Limit: hourly, Also: []AlsoLimit{{Name: "tokens", Cost: header, SameKey: true, Limit: tokens}}}},
		{name: "unreadable, the Policy's", give: "lots", wantCode: 400,
			policy: Policy{Name: "tokens", Limit: tokens, Cost: header}},
		{name: "above the library's bound", give: "1000000000000000", wantCode: 400,
			policy: Policy{Name: "tokens", Limit: tokens, Cost: header}},
		{name: "the bound itself", give: "999999999999999", wantCode: 200, wantRules: 1,
			policy: Policy{Name: "tokens", Limit: tokens, Cost: header}},
		{name: "negative, a shadow limit's", give: "-5", wantCode: 200, wantRules: 1,
			policy: Policy{Name: "requests", Limit: hourly, Also: []AlsoLimit{{Name: "tokens", Cost: header, SameKey: true, Limit: tokens, Shadow: true}}}},
		{name: "negative, a policy in shadow", give: "-5", wantCode: 200,
			policy: Policy{Name: "tokens", Limit: tokens, Cost: header, Shadow: true}},
		{name: "a good cost", give: "1200", wantCode: 200, wantRules: 2,
			policy: Policy{Name: "requests", Limit: hourly, Also: []AlsoLimit{{Name: "tokens", Cost: header, SameKey: true, Limit: tokens}}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lim := &fake{res: client.Result{Allowed: true, Limit: 1000, Remaining: 999}}
			var reported []error
			m := mustNew(t, lim, Options{Key: constKey("org-7"), Policy: func(*http.Request) Policy { return tt.policy },
				OnError: func(_ *http.Request, err error) { reported = append(reported, err) }})
			r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
			r.Header.Set("X-Max-Tokens", tt.give)
			rec := httptest.NewRecorder()
			m.Handler(served).ServeHTTP(rec, r)
			m.shadows.Wait()
			if rec.Code != tt.wantCode {
				t.Fatalf("status %d, want %d:\n%s", rec.Code, tt.wantCode, dump(rec))
			}
			if tt.wantCode == 400 && rec.Body.String() != `{"error":"invalid cost"}`+"\n" {
				t.Errorf("body %q", rec.Body)
			}
			lim.mu.Lock()
			n := len(lim.calls)
			lim.mu.Unlock()
			if n != tt.wantRules || len(reported) > 0 {
				t.Errorf("%d rules decided, reported %v; want %d, nothing", n, reported, tt.wantRules)
			}
		})
	}
	// The default OnError, for the Example's request: a 400 and no log line.
	m := mustNew(t, &fake{}, Options{Key: constKey("org-7"), Policy: func(*http.Request) Policy {
		return Policy{Name: "tokens", Limit: tokens, Cost: header}
	}})
	r := httptest.NewRequest("POST", "/", nil)
	r.Header.Set("X-Max-Tokens", "-5")
	rec := httptest.NewRecorder()
	m.Handler(served).ServeHTTP(rec, r)
	if rec.Code != 400 || buf.Len() != 0 {
		t.Errorf("status %d, logged %q; want 400 and nothing", rec.Code, buf)
	}
	// The problem details of it.
	m = mustNew(t, &fake{}, Options{Key: constKey("org-7"), ProblemJSON: true, Policy: func(*http.Request) Policy {
		return Policy{Name: "tokens", Limit: tokens, Cost: header}
	}})
	rec = httptest.NewRecorder()
	m.Handler(served).ServeHTTP(rec, r)
	if rec.Code != 400 || !strings.Contains(rec.Body.String(), `"detail":"invalid cost"`) {
		t.Errorf("problem details: %d %s", rec.Code, rec.Body)
	}
}
