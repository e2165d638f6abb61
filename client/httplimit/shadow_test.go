package httplimit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/rlfn/rlfn/client"
)

// byName is a Limiter that answers each key by the policy name before its ':', as the server
// would answer distinct limiters, and AllowAll as client.AllowAll picks its binding Result.
type byName struct {
	mu      sync.Mutex
	results map[string]client.Result
	keys    []string
}

func (b *byName) Allow(_ context.Context, key string, _ client.Limit) (client.Result, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.keys = append(b.keys, key)
	name, _, _ := strings.Cut(key, ":")
	res, ok := b.results[name]
	if !ok {
		return client.Result{}, fmt.Errorf("no result for %q", name)
	}
	return res, nil
}

func (b *byName) AllowAll(ctx context.Context, rules []client.Rule) (client.Result, error) {
	var bind client.Result
	for i, r := range rules {
		res, err := b.Allow(ctx, r.Key, r.Limit)
		if err != nil {
			return client.Result{}, err
		}
		res.Rule = i
		switch {
		case i == 0:
			bind = res
		case !res.Allowed && (bind.Allowed || res.RetryAfter > bind.RetryAfter):
			bind = res
		case bind.Allowed && res.Allowed && res.Remaining < bind.Remaining:
			bind = res
		}
	}
	return bind, nil
}

func (b *byName) called() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Sorted(slices.Values(b.keys))
}

var (
	admits = client.Result{Allowed: true, Limit: 100, Remaining: 50, ResetAfter: time.Second}
	denies = client.Result{Limit: 10, RetryAfter: 2 * time.Second, ResetAfter: 5 * time.Second}
)

// wouldDeny reads MetricWouldDeny's count by policy.
func wouldDeny(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != MetricWouldDeny {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				v, _ := dp.Attributes.Value("rlfn.policy")
				got[v.AsString()] += dp.Value
			}
		}
	}
	return got
}

// A limit in shadow is decided on every request and its denial counted (metric and
// OnShadowDeny), but the request is served, and the headers show only the enforced limits.
func TestShadow(t *testing.T) {
	tests := []struct {
		name        string
		policy      Policy
		results     map[string]client.Result
		wantStatus  int
		wantPolicy  string // RateLimit-Policy; "" for none
		wantDenied  []string
		wantKeys    []string
		wantServed  bool
		wantMetrics map[string]int64
	}{
		{
			name:        "route in shadow, would deny",
			policy:      Policy{Name: "api", Limit: tokenBucket, Shadow: true},
			results:     map[string]client.Result{"api": denies},
			wantStatus:  200,
			wantDenied:  []string{"api"},
			wantKeys:    []string{"api:k"},
			wantServed:  true,
			wantMetrics: map[string]int64{"api": 1},
		},
		{
			name:        "route in shadow, admits",
			policy:      Policy{Name: "api", Limit: tokenBucket, Shadow: true},
			results:     map[string]client.Result{"api": admits},
			wantStatus:  200,
			wantKeys:    []string{"api:k"},
			wantServed:  true,
			wantMetrics: map[string]int64{},
		},
		{
			name: "new rule in shadow would deny, the enforced one admits",
			policy: Policy{Name: "api", Limit: tokenBucket,
				Also: []AlsoLimit{{Name: "new", Limit: hourly, Shadow: true}}},
			results:     map[string]client.Result{"api": admits, "new": denies},
			wantStatus:  200,
			wantPolicy:  `"api";q=100;w=10`,
			wantDenied:  []string{"new"},
			wantKeys:    []string{"api:k", "new:k"},
			wantServed:  true,
			wantMetrics: map[string]int64{"new": 1},
		},
		{
			name: "two rules in shadow, one would deny: it is named",
			policy: Policy{Name: "api", Limit: tokenBucket, Also: []AlsoLimit{
				{Name: "new1", Limit: hourly, Shadow: true}, {Name: "new2", Limit: daily, Shadow: true}}},
			results:     map[string]client.Result{"api": admits, "new1": admits, "new2": denies},
			wantStatus:  200,
			wantPolicy:  `"api";q=100;w=10`,
			wantDenied:  []string{"new2"},
			wantKeys:    []string{"api:k", "new1:k", "new2:k"},
			wantServed:  true,
			wantMetrics: map[string]int64{"new2": 1},
		},
		{
			name: "the enforced limit denies: refused, the shadow one still decided",
			policy: Policy{Name: "api", Limit: tokenBucket,
				Also: []AlsoLimit{{Name: "new", Limit: hourly, Shadow: true}}},
			results:     map[string]client.Result{"api": denies, "new": admits},
			wantStatus:  429,
			wantPolicy:  `"api";q=10;w=10`,
			wantKeys:    []string{"api:k", "new:k"},
			wantMetrics: map[string]int64{},
		},
		{
			name:        "every key enforced at 100",
			policy:      Policy{Name: "api", Limit: tokenBucket, EnforcePercent: 100},
			results:     map[string]client.Result{"api": denies},
			wantStatus:  429,
			wantPolicy:  `"api";q=10;w=10`,
			wantKeys:    []string{"api:k"},
			wantMetrics: map[string]int64{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reader := sdkmetric.NewManualReader()
			lim := &byName{results: tt.results}
			var mu sync.Mutex
			var denied []string
			servedReq := false
			m := mustNew(t, lim, Options{
				Policy:        func(*http.Request) Policy { return tt.policy },
				MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
				OnShadowDeny: func(_ *http.Request, policy string) {
					mu.Lock()
					defer mu.Unlock()
					denied = append(denied, policy)
				},
				OnError: func(_ *http.Request, err error) { t.Errorf("OnError(%v)", err) },
			})
			next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { servedReq = true })
			rec := httptest.NewRecorder()
			m.Handler(next).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			m.shadows.Wait() // the shadow decisions run on after the response
			mu.Lock()
			defer mu.Unlock()
			if rec.Code != tt.wantStatus || servedReq != tt.wantServed {
				t.Errorf("status %d, served %v; want %d, %v", rec.Code, servedReq, tt.wantStatus, tt.wantServed)
			}
			if got := rec.Header().Get("RateLimit-Policy"); got != tt.wantPolicy {
				t.Errorf("RateLimit-Policy %q, want %q", got, tt.wantPolicy)
			}
			if tt.wantPolicy == "" && (rec.Header().Get("RateLimit") != "" || rec.Header().Get("X-RateLimit-Limit") != "") {
				t.Errorf("headers of a limit in shadow: %v", rec.Header())
			}
			if !slices.Equal(denied, tt.wantDenied) {
				t.Errorf("OnShadowDeny got %q, want %q", denied, tt.wantDenied)
			}
			if got := lim.called(); !slices.Equal(got, tt.wantKeys) {
				t.Errorf("keys decided %q, want %q", got, tt.wantKeys)
			}
			if got := wouldDeny(t, reader); fmt.Sprint(got) != fmt.Sprint(tt.wantMetrics) {
				t.Errorf("%s: %v, want %v", MetricWouldDeny, got, tt.wantMetrics)
			}
		})
	}
}

// The dial enforces about its share of keys, the same keys every time, and raising it only
// adds keys.
func TestEnforced(t *testing.T) {
	const keys = 20000
	prev := map[int]bool{}
	for _, percent := range []int{1, 10, 50, 90, 100} {
		n := 0
		for i := range keys {
			k := fmt.Sprintf("user:%d", i)
			in := enforced(k, percent)
			if in != enforced(k, percent) {
				t.Fatalf("%s: not deterministic", k)
			}
			if prev[i] && !in {
				t.Fatalf("%s enforced below %d%%, not at it", k, percent)
			}
			prev[i] = in
			if in {
				n++
			}
		}
		// a binomial share: 4 standard deviations at most is 2.8% of 20000 at 50%
		if want := keys * percent / 100; n < want-600 || n > want+600 {
			t.Errorf("%d%%: %d of %d keys enforced, want about %d", percent, n, keys, want)
		}
	}
	if enforced("user:42", 1) {
		t.Error(`"user:42" is enforced at 1%: TestResponses's shadow case needs a key outside it`)
	}
}

// Several enforced limits need a Limiter with AllowAll: without one, the route is
// misconfigured, answered 500 with ErrNoMultiDecider, FailOpen or not.
func TestNoMultiLimiter(t *testing.T) {
	var errs []error
	m := mustNew(t, &constant{admits}, Options{
		Policy: func(*http.Request) Policy {
			return Policy{Name: "a", Limit: tokenBucket, Also: []AlsoLimit{{Name: "b", Limit: hourly}}}
		},
		OnError:  func(_ *http.Request, err error) { errs = append(errs, err) },
		FailOpen: true,
	})
	served := false
	rec := httptest.NewRecorder()
	m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served = true })).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if served || rec.Code != http.StatusInternalServerError || len(errs) != 1 || errs[0] != ErrNoMultiDecider {
		t.Errorf("served %v, status %d, OnError %v; want 500 and ErrNoMultiDecider", served, rec.Code, errs)
	}
}

// constantMulti is a constant that also answers AllowAll.
type constantMulti struct{ constant }

func (c *constantMulti) AllowAll(context.Context, []client.Rule) (client.Result, error) {
	return c.res, nil
}

// BenchmarkSeveralLimits is the middleware's cost with three limits on a route (the login
// pattern's shape) and with one enforced beside one in shadow, around decisions that take no
// time.
func BenchmarkSeveralLimits(b *testing.B) {
	for _, bb := range []struct {
		name   string
		policy Policy
	}{
		{"three", Policy{Name: "login", Limit: tokenBucket, Also: []AlsoLimit{
			{Name: "login-ip", Limit: hourly, Key: constKey("198.51.100.7")},
			{Name: "login-user", Limit: daily, Key: constKey("alice")}}}},
		{"shadow", Policy{Name: "api", Limit: tokenBucket, Also: []AlsoLimit{{Name: "new", Limit: hourly, Shadow: true}}}},
	} {
		b.Run(bb.name, func(b *testing.B) {
			m := mustNew(b, &constantMulti{constant{admits}}, Options{
				Key:    RemoteIP,
				Policy: func(*http.Request) Policy { return bb.policy },
			})
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

// BenchmarkClientIPKey is the cost of keying a request that came through two trusted proxies.
func BenchmarkClientIPKey(b *testing.B) {
	c, err := NewClientIP(ClientIPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		b.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.0.0.2:40000"
	r.Header.Set("X-Forwarded-For", "203.0.113.66, 2001:db8:1:2::7, 10.0.0.3")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Key(r); err != nil {
			b.Fatal(err)
		}
	}
}

// blocking is a Limiter whose decisions wait until release is closed, then deny.
type blocking struct {
	started chan struct{}
	release chan struct{}
}

func (b *blocking) Allow(context.Context, string, client.Limit) (client.Result, error) {
	b.started <- struct{}{}
	<-b.release
	return denies, nil
}

// The response does not wait for the shadow decision: a roll-out must add no latency, not
// even a dead server's deadline. The decision still ends, and is counted.
func TestShadowDoesNotHoldTheResponse(t *testing.T) {
	lim := &blocking{started: make(chan struct{}, 1), release: make(chan struct{})}
	denied := make(chan string, 1)
	m := mustNew(t, lim, Options{
		Policy:       func(*http.Request) Policy { return Policy{Name: "api", Limit: tokenBucket, Shadow: true} },
		OnShadowDeny: func(_ *http.Request, policy string) { denied <- policy },
	})
	done := make(chan *httptest.ResponseRecorder)
	go func() {
		rec := httptest.NewRecorder()
		m.Handler(served).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		done <- rec
	}()
	<-lim.started
	select {
	case rec := <-done:
		if rec.Code != 200 || rec.Header().Get("X-Served") != "yes" {
			t.Errorf("status %d, headers %v: want the request served", rec.Code, rec.Header())
		}
	case <-time.After(10 * time.Second):
		close(lim.release)
		t.Fatal("the response waited for the shadow decision")
	}
	close(lim.release)
	m.shadows.Wait()
	if got := <-denied; got != "api" {
		t.Errorf("OnShadowDeny(%q), want api", got)
	}
}

// A panic in a shadow decision (here OnShadowDeny's) is on a goroutine of the middleware's,
// where nothing else would recover it: it would end the process. It is recovered.
func TestShadowPanicIsRecovered(t *testing.T) {
	var logged bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	defer slog.SetDefault(prev)
	m := mustNew(t, &constant{denies}, Options{
		Policy:       func(*http.Request) Policy { return Policy{Name: "api", Limit: tokenBucket, Shadow: true} },
		OnShadowDeny: func(*http.Request, string) { panic("callback bug") },
	})
	rec := httptest.NewRecorder()
	m.Handler(served).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	m.shadows.Wait()
	if rec.Code != 200 || !strings.Contains(logged.String(), "callback bug") {
		t.Errorf("status %d, log %q: want served and the panic logged", rec.Code, logged.String())
	}
}

// A Key that only shadow limits need never refuses the request: its error goes to OnError as
// a *ShadowKeyError and that limit is left out; an enforced limit's Key error answers 400.
func TestShadowKeyError(t *testing.T) {
	bad := func(*http.Request) (string, error) { return "", errors.New("no user") }
	tests := []struct {
		name       string
		key        func(*http.Request) (string, error)
		policy     Policy
		wantStatus int
		wantErr    string // the policy of the *ShadowKeyError; "" for none
		wantKeys   []string
	}{
		{name: "a shadow rule's key", key: constKey("k"),
			policy:     Policy{Name: "api", Limit: tokenBucket, Also: []AlsoLimit{{Name: "user", Limit: hourly, Key: bad, Shadow: true}}},
			wantStatus: 200, wantErr: "user", wantKeys: []string{"api:k"}},
		{name: "an enforced rule's key", key: constKey("k"),
			policy:     Policy{Name: "api", Limit: tokenBucket, Also: []AlsoLimit{{Name: "user", Limit: hourly, Key: bad}}},
			wantStatus: 400},
		{name: "a route in shadow: Options.Key", key: bad,
			policy:     Policy{Name: "api", Limit: tokenBucket, Shadow: true},
			wantStatus: 200, wantErr: "api"},
		{name: "a route in shadow with Concurrency: Options.Key", key: bad,
			policy:     Policy{Name: "api", Limit: tokenBucket, Shadow: true, Concurrency: &client.Concurrency{Limit: 1, Lease: time.Second}},
			wantStatus: 400},
		{name: "the dial: Options.Key decides the share, so its error refuses", key: bad,
			policy:     Policy{Name: "api", Limit: tokenBucket, EnforcePercent: 50},
			wantStatus: 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := &byName{results: map[string]client.Result{"api": admits, "user": admits}}
			var errs []error
			var mu sync.Mutex
			m := mustNew(t, lim, Options{
				Key:    tt.key,
				Policy: func(*http.Request) Policy { return tt.policy },
				OnError: func(_ *http.Request, err error) {
					mu.Lock()
					defer mu.Unlock()
					errs = append(errs, err)
				},
			})
			rec := httptest.NewRecorder()
			m.Handler(served).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			m.shadows.Wait()
			if rec.Code != tt.wantStatus {
				t.Errorf("status %d, want %d", rec.Code, tt.wantStatus)
			}
			var ske *ShadowKeyError
			switch {
			case tt.wantErr == "" && len(errs) > 0:
				t.Errorf("OnError(%v), want none", errs)
			case tt.wantErr != "" && (len(errs) != 1 || !errors.As(errs[0], &ske) || ske.Policy != tt.wantErr || ske.Err.Error() != "no user"):
				t.Errorf("OnError(%v), want a *ShadowKeyError of %q", errs, tt.wantErr)
			}
			if got := lim.called(); !slices.Equal(got, tt.wantKeys) {
				t.Errorf("keys decided %q, want %q", got, tt.wantKeys)
			}
		})
	}
}
