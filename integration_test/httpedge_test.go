package integration_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/httplimit"
	"github.com/rlfn/rlfn/internal/harness"
)

// edgeServer serves "ok" behind m over real HTTP on 127.0.0.1.
func edgeServer(t *testing.T, lim httplimit.Decider, opts httplimit.Options) *httptest.Server {
	t.Helper()
	m, err := httplimit.New(lim, opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })))
	t.Cleanup(srv.Close)
	return srv
}

// send makes one request with the given headers, as "Name: value" pairs.
func send(t *testing.T, method, url, body string, headers ...string) response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Add(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{resp.StatusCode, resp.Header, string(b)}
}

// The login pattern over real HTTP, on every server (the three keys in three cluster slots):
// an attempt counts against (IP, user), IP and user, all or nothing; the client's address is
// what the trusted proxy (the test, on 127.0.0.1) forwarded; the quota is hidden.
func TestHTTPLogin(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		run := strings.NewReplacer("/", "-", ":", "-").Replace(keyFor(t)) // a fresh principal space per run
		ips, err := httplimit.NewClientIP(httplimit.ClientIPOptions{TrustedProxies: []string{"127.0.0.1"}})
		if err != nil {
			t.Fatal(err)
		}
		user := func(r *http.Request) (string, error) {
			if u := r.PostFormValue("user"); u != "" {
				return run + ":" + u, nil
			}
			return "", errors.New("no user")
		}
		ipUser := client.FixedWindow{Limit: 3, Window: time.Hour}
		perIP := client.SlidingWindow{Limit: 5, Window: time.Hour}
		perUser := client.SlidingWindow{Limit: 4, Window: time.Hour}
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		srv := edgeServer(t, lim, httplimit.Options{
			Key: func(r *http.Request) (string, error) {
				ip, err := ips.Key(r)
				if err != nil {
					return "", err
				}
				u, err := user(r)
				return run + ":" + ip + " " + u, err
			},
			Policy: func(*http.Request) httplimit.Policy {
				return httplimit.Policy{Name: "login", Limit: ipUser, HideQuota: true, Also: []httplimit.AlsoLimit{
					{Name: "login-ip", Limit: perIP, Key: func(r *http.Request) (string, error) {
						ip, err := ips.Key(r)
						return run + ":" + ip, err
					}},
					{Name: "login-user", Limit: perUser, Key: user},
				}}
			},
		})
		attempt := func(ip, who string) response {
			t.Helper()
			return send(t, "POST", srv.URL+"/login", "user="+who+"&password=x",
				"Content-Type: application/x-www-form-urlencoded",
				"X-Forwarded-For: 203.0.113.250, "+ip) // the first entry is the client's own: never read
		}
		check := func(step string, r response, want int) {
			t.Helper()
			if r.status != want {
				t.Fatalf("%s: %d %q, want %d", step, r.status, r.body, want)
			}
			for k := range r.header {
				if strings.HasPrefix(strings.ToLower(k), "ratelimit") || strings.HasPrefix(strings.ToLower(k), "x-ratelimit") {
					t.Errorf("%s: %s sent on a route that hides its quota", step, k)
				}
			}
			if want == http.StatusTooManyRequests {
				if r.body != `{"error":"rate limited"}`+"\n" || headerInt(t, r, "Retry-After") < 1 {
					t.Errorf("%s: body %q, Retry-After %q; want the generic body and a Retry-After", step, r.body, r.header.Get("Retry-After"))
				}
			}
		}
		// (IP, user): 3 attempts of alice from A, the 4th refused
		for i := range 3 {
			check(fmt.Sprintf("alice from A, attempt %d", i+1), attempt("198.51.100.1", "alice"), 200)
		}
		check("alice from A, attempt 4", attempt("198.51.100.1", "alice"), 429)
		// per IP: A has 3 attempts counted (the refused one took nothing): bob gets 2 more
		check("bob from A, 1", attempt("198.51.100.1", "bob"), 200)
		check("bob from A, 2", attempt("198.51.100.1", "bob"), 200)
		check("bob from A, 3: A's 6th", attempt("198.51.100.1", "bob"), 429)
		// all or nothing: the refused attempts took nothing from bob's or alice's own limits
		peek := func(key string, l client.Limit) int64 {
			t.Helper()
			res, err := lim.PeekAll(ctx5s(t), []client.Rule{{Key: key, Limit: l}})
			if err != nil {
				t.Fatal(err)
			}
			return res.Remaining
		}
		if got := peek("login-user:"+run+":bob", perUser); got != 2 {
			t.Errorf("bob's per-user limit has %d left, want 2 (two admitted attempts)", got)
		}
		if got := peek("login-user:"+run+":alice", perUser); got != 1 {
			t.Errorf("alice's per-user limit has %d left, want 1", got)
		}
		// per user: alice has 3; one more from B, then her 5th from C is refused
		check("alice from B", attempt("198.51.100.2", "alice"), 200)
		check("alice from C: her 5th", attempt("[2001:db8:7:7::1]", "alice"), 429)
		// and C's other attempts are its own
		check("carol from C", attempt("2001:db8:7:7::2", "carol"), 200) // the same /64 as above
		if got := peek("login-ip:"+run+":2001:db8:7:7::/64", perIP); got != 4 {
			t.Errorf("C's /64 has %d left, want 4: one admitted attempt", got)
		}
	})
}

// A client that is not a trusted proxy cannot spread its attempts over addresses it makes up
// in X-Forwarded-For or Forwarded: every request is counted against its own address.
func TestHTTPClientIPSpoofing(t *testing.T) {
	_, vk := httpValkey(t)
	ips, err := httplimit.NewClientIP(httplimit.ClientIPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("spoof%d", time.Now().UnixNano())
	srv := edgeServer(t, harness.NewLimiter(t, vk, slowMachine), httplimit.Options{
		Key: ips.Key,
		Policy: func(*http.Request) httplimit.Policy {
			return httplimit.Policy{Name: name, Limit: client.FixedWindow{Limit: 3, Window: time.Hour}}
		},
	})
	for i := range 5 {
		fake := fmt.Sprintf("203.0.113.%d", i+1)
		r := send(t, "GET", srv.URL, "", "X-Forwarded-For: "+fake, "X-Forwarded-For: 10.0.0.1", `Forwarded: for="`+fake+`"`)
		want := http.StatusOK
		if i >= 3 {
			want = http.StatusTooManyRequests
		}
		if r.status != want || r.header.Get("X-RateLimit-Remaining") != fmt.Sprint(max(0, 2-i)) {
			t.Fatalf("request %d claiming %s: %d, remaining %q; want %d: counted against 127.0.0.1", i+1, fake, r.status, r.header.Get("X-RateLimit-Remaining"), want)
		}
	}
}

// Behind a trusted proxy (the test, on 127.0.0.1), what a client wrote itself is left of what
// the proxy appended and never read, however it is written: made-up addresses in front, an
// unclosed quote meant to swallow the proxy's Forwarded element (a proxy that appends to the
// client's header line, as "$http_forwarded, for=..." does, sends it so). Every request is
// counted against the address the proxy appended.
func TestHTTPClientIPSpoofingBehindProxy(t *testing.T) {
	_, vk := httpValkey(t)
	lim := harness.NewLimiter(t, vk, slowMachine)
	for _, tt := range []struct {
		header string
		value  func(fake string) string
		want   string // the key the requests are counted against
	}{
		{"X-Forwarded-For", func(fake string) string { return fake + ", 10.9.9.9, 198.51.100.9" }, "198.51.100.9"},
		{"Forwarded", func(fake string) string { return `for="` + fake + `, for=198.51.100.9` }, "198.51.100.9"},
		{"Forwarded", func(fake string) string { return `for=` + fake + `;by=", for="[2001:db8:9:9::1]:4711"` }, "2001:db8:9:9::/64"},
	} {
		ips, err := httplimit.NewClientIP(httplimit.ClientIPOptions{TrustedProxies: []string{"127.0.0.1"}, Header: tt.header})
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("proxied%d", time.Now().UnixNano())
		limit := client.FixedWindow{Limit: 3, Window: time.Hour}
		srv := edgeServer(t, lim, httplimit.Options{
			Key: ips.Key,
			Policy: func(*http.Request) httplimit.Policy {
				return httplimit.Policy{Name: name, Limit: limit}
			},
		})
		for i := range 5 {
			v := tt.value(fmt.Sprintf("203.0.113.%d", i+1))
			r := send(t, "GET", srv.URL, "", tt.header+": "+v)
			want := http.StatusOK
			if i >= 3 {
				want = http.StatusTooManyRequests
			}
			if r.status != want || r.header.Get("X-RateLimit-Remaining") != fmt.Sprint(max(0, 2-i)) {
				t.Fatalf("%s: %s: request %d: %d, remaining %q; want %d: counted against the proxy's entry", tt.header, v, i+1, r.status, r.header.Get("X-RateLimit-Remaining"), want)
			}
		}
		// the count is the appended address's, not the proxy's own (a parser that gave up)
		for key, left := range map[string]int64{tt.want: 0, "127.0.0.1": 3} {
			if res, err := lim.Peek(ctx5s(t), name+":"+key, limit); err != nil || res.Remaining != left {
				t.Errorf("%s: %s has %d left (%v), want %d", tt.header, key, res.Remaining, err, left)
			}
		}
	}
}

// Several limits on one route over real HTTP: every one in RateLimit-Policy and in RateLimit,
// the one that decided first, and in the X-RateLimit-* triple; a refusal by either; the
// problem+json body names the violated policy.
func TestHTTPSeveralLimits(t *testing.T) {
	_, vk := httpValkey(t)
	burst := client.TokenBucket{Capacity: 3, Rate: 1, Period: time.Hour}
	hourly := client.SlidingWindow{Limit: 4, Window: time.Hour}
	srv := edgeServer(t, harness.NewLimiter(t, vk, slowMachine), httplimit.Options{
		Key: func(r *http.Request) (string, error) { return r.Header.Get("X-Key"), nil },
		Policy: func(r *http.Request) httplimit.Policy {
			return httplimit.Policy{Name: "burst", Limit: burst, Also: []httplimit.AlsoLimit{{Name: "hourly", Limit: hourly}}}
		},
		ProblemJSON: true,
	})
	key := keyFor(t)
	want := []struct {
		status    int
		policy    string
		rateLimit string // a regular expression: the first t is checked apart
		remaining string
	}{
		// the bucket has fewer left: it binds
		{200, `"burst";q=3;w=10800, "hourly";q=4;w=3600`, `^"burst";r=2;t=\d+, "hourly";r=3;t=\d+$`, "2"},
		{200, `"burst";q=3;w=10800, "hourly";q=4;w=3600`, `^"burst";r=1;t=\d+, "hourly";r=2;t=\d+$`, "1"},
		{200, `"burst";q=3;w=10800, "hourly";q=4;w=3600`, `^"burst";r=0;t=\d+, "hourly";r=1;t=\d+$`, "0"},
		// the bucket is empty: it refuses, for about an hour (one token per hour); the hourly
		// window counted nothing
		{429, `"burst";q=3;w=10800, "hourly";q=4;w=3600`, `^"burst";r=0;t=\d+, "hourly";r=1;t=\d+$`, "0"},
	}
	for i, w := range want {
		r := get(t, srv.URL, key)
		if r.status != w.status || r.header.Get("RateLimit-Policy") != w.policy ||
			!regexp.MustCompile(w.rateLimit).MatchString(r.header.Get("RateLimit")) || r.header.Get("X-RateLimit-Remaining") != w.remaining {
			t.Fatalf("request %d: %d %v %q; want %d, %s, %s", i+1, r.status, r.header, r.body, w.status, w.policy, w.rateLimit)
		}
		checkUnixReset(t, r, rateLimitT(t, r))
		if r.status == http.StatusTooManyRequests {
			var p struct {
				Type     string   `json:"type"`
				Status   int      `json:"status"`
				Violated []string `json:"violated-policies"`
			}
			if err := json.Unmarshal([]byte(r.body), &p); err != nil || r.header.Get("Content-Type") != "application/problem+json" ||
				p.Type != httplimit.ProblemQuotaExceeded || p.Status != 429 || !slices.Equal(p.Violated, []string{"burst"}) {
				t.Errorf("429 body %q (%s), %v; want the quota-exceeded problem naming burst", r.body, r.header.Get("Content-Type"), err)
			}
			if ra := headerInt(t, r, "Retry-After"); ra < 3500 || ra > 3600 {
				t.Errorf("Retry-After %d, want about an hour", ra)
			}
		}
	}
	// The hourly window binds when it has fewer left: a second key, with its own limits, whose
	// hourly window has been used by three requests of another route sharing its Name.
	key2 := keyFor(t)
	lim := harness.NewLimiter(t, vk, slowMachine)
	for range 3 {
		if res, err := lim.Allow(ctx5s(t), "hourly:"+key2, hourly); err != nil || !res.Allowed {
			t.Fatal(res, err)
		}
	}
	r := get(t, srv.URL, key2)
	if r.status != 200 || !strings.HasPrefix(r.header.Get("RateLimit-Policy"), `"hourly";q=4;w=3600, "burst"`) || r.header.Get("X-RateLimit-Remaining") != "0" ||
		!regexp.MustCompile(`^"hourly";r=0;t=\d+, "burst";r=2;t=\d+$`).MatchString(r.header.Get("RateLimit")) {
		t.Fatalf("hourly binding: %d %v", r.status, r.header)
	}
	r = get(t, srv.URL, key2)
	if r.status != 429 || !strings.Contains(r.body, `"violated-policies":["hourly"]`) ||
		!regexp.MustCompile(`^"hourly";r=0;t=\d+, "burst";r=2;t=\d+$`).MatchString(r.header.Get("RateLimit")) {
		t.Fatalf("hourly refusing: %d %v %q", r.status, r.header, r.body)
	}
	// all or nothing: the refused request took nothing from the bucket (3 - 1 left = 2)
	if res, err := lim.Peek(ctx5s(t), "burst:"+key2, burst); err != nil || res.Remaining != 2 {
		t.Errorf("burst after the hourly refusal: %+v, %v; want 2 left", res, err)
	}
}

// collectWouldDeny reads rlfn.httplimit.would_deny by policy.
func collectWouldDeny(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == httplimit.MetricWouldDeny {
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					v, _ := dp.Attributes.Value("rlfn.policy")
					got[v.AsString()] += dp.Value
				}
			}
		}
	}
	return got
}

// Shadow limits over real HTTP against a real limiter: counted, never refusing, never shown;
// the dial enforces the route for its share of keys, the same keys on every request.
func TestHTTPShadow(t *testing.T) {
	_, vk := httpValkey(t)
	reader := sdkmetric.NewManualReader()
	var mu sync.Mutex
	denied := map[string]int{}
	suffix := fmt.Sprint(time.Now().UnixNano())
	srv := edgeServer(t, harness.NewLimiter(t, vk, slowMachine), httplimit.Options{
		Key: func(r *http.Request) (string, error) { return r.Header.Get("X-Key"), nil },
		Policy: func(r *http.Request) httplimit.Policy {
			switch r.URL.Path {
			case "/rule":
				return httplimit.Policy{Name: "api" + suffix, Limit: client.TokenBucket{Capacity: 100, Rate: 1, Period: time.Second},
					Also: []httplimit.AlsoLimit{{Name: "new" + suffix, Shadow: true, Limit: client.FixedWindow{Limit: 2, Window: time.Hour}}}}
			case "/route":
				return httplimit.Policy{Name: "route" + suffix, Shadow: true, Limit: client.FixedWindow{Limit: 2, Window: time.Hour}}
			}
			return httplimit.Policy{Name: "dial" + suffix, EnforcePercent: 50, Limit: client.FixedWindow{Limit: 1, Window: time.Hour}}
		},
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		OnShadowDeny: func(_ *http.Request, policy string) {
			mu.Lock()
			defer mu.Unlock()
			denied[policy]++
		},
	})
	key := keyFor(t)
	for i := range 5 {
		r := get(t, srv.URL+"/rule", key)
		if r.status != 200 || r.header.Get("RateLimit-Policy") != fmt.Sprintf(`"api%s";q=100;w=100`, suffix) {
			t.Fatalf("/rule request %d: %d %v", i+1, r.status, r.header)
		}
		r = get(t, srv.URL+"/route", key)
		if r.status != 200 || r.header.Get("RateLimit-Policy") != "" || r.header.Get("RateLimit") != "" {
			t.Fatalf("/route request %d: %d %v", i+1, r.status, r.header)
		}
	}
	// The dial: each key's second request is refused if the key is enforced, served if not.
	enforced, shadowed := 0, 0
	for i := range 20 {
		k := fmt.Sprintf("user-%d", i)
		if r := get(t, srv.URL+"/dial", k); r.status != 200 {
			t.Fatalf("/dial %s, first: %d", k, r.status)
		}
		r := get(t, srv.URL+"/dial", k)
		switch {
		case r.status == 429 && r.header.Get("RateLimit") != "":
			enforced++
		case r.status == 200 && r.header.Get("RateLimit") == "":
			shadowed++
		default:
			t.Fatalf("/dial %s, second: %d %v", k, r.status, r.header)
		}
		// the same decision again
		if again := get(t, srv.URL+"/dial", k); again.status != r.status {
			t.Fatalf("/dial %s: %d then %d: the dial must hold a key in or out", k, r.status, again.status)
		}
	}
	if enforced == 0 || shadowed == 0 {
		t.Errorf("at 50%%, %d keys enforced and %d in shadow of 20", enforced, shadowed)
	}
	// The shadow decisions run on after their responses: wait for the last of them (at most
	// 10s, far beyond a limiter call's deadline), then check the counts exactly.
	wantDenied := 3 + 3 + 2*shadowed
	for stop := time.Now().Add(10 * time.Second); time.Now().Before(stop); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := 0
		for _, c := range denied {
			n += c
		}
		mu.Unlock()
		if n >= wantDenied {
			break
		}
	}
	want := map[string]int64{"new" + suffix: 3, "route" + suffix: 3, "dial" + suffix: int64(2 * shadowed)}
	if got := collectWouldDeny(t, reader); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s: %v, want %v", httplimit.MetricWouldDeny, got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(denied) != fmt.Sprint(map[string]int{"new" + suffix: 3, "route" + suffix: 3, "dial" + suffix: 2 * shadowed}) {
		t.Errorf("OnShadowDeny: %v", denied)
	}
}

// arrivals is an upstream API that records when each request arrived, answering 429 with
// Retry-After: 1 to the first one when told to.
type arrivals struct {
	mu      sync.Mutex
	at      []time.Time
	refuse1 bool
}

func (a *arrivals) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.at = append(a.at, time.Now())
	if a.refuse1 && len(a.at) == 1 {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	io.WriteString(w, "ok")
}

func (a *arrivals) times() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.at)
}

// Transport over real HTTP against a real Valkey: two "instances" sharing one shaped leaky
// bucket space their calls to the API out between them; a token bucket's wait that would
// pass the deadline fails at once; a 429 is sent again after its Retry-After.
func TestHTTPTransport(t *testing.T) {
	_, vk := httpValkey(t)
	lim := harness.NewLimiter(t, vk, slowMachine)
	key := keyFor(t)
	keyOf := func(*http.Request) (string, error) { return key, nil }

	t.Run("shaped across instances", func(t *testing.T) {
		up := &arrivals{}
		srv := httptest.NewServer(up)
		defer srv.Close()
		shaped := client.LeakyBucket{Capacity: 20, Rate: 10, Period: time.Second, Mode: client.Shape, Name: "shape"}
		var wg sync.WaitGroup
		for range 2 {
			tr, err := httplimit.NewTransport(nil, lim, httplimit.TransportOptions{Limit: shaped, Key: keyOf})
			if err != nil {
				t.Fatal(err)
			}
			api := &http.Client{Transport: tr}
			for range 4 {
				wg.Go(func() {
					resp, err := api.Get(srv.URL)
					if err != nil {
						t.Error(err)
						return
					}
					resp.Body.Close()
				})
			}
		}
		wg.Wait()
		at := up.times()
		slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
		// 8 requests leaving 100ms apart span at least 700ms (less the library's millisecond
		// rounding); load only stretches it.
		if len(at) != 8 || at[7].Sub(at[0]) < 690*time.Millisecond {
			t.Fatalf("%d requests arrived over %s, want 8 over 700ms at least", len(at), at[len(at)-1].Sub(at[0]))
		}
	})

	t.Run("token bucket: a wait past the deadline fails at once", func(t *testing.T) {
		up := &arrivals{}
		srv := httptest.NewServer(up)
		defer srv.Close()
		bucket := client.TokenBucket{Capacity: 2, Rate: 1, Period: time.Minute, Name: "bucket"}
		tr, err := httplimit.NewTransport(nil, lim, httplimit.TransportOptions{Limit: bucket, Key: keyOf})
		if err != nil {
			t.Fatal(err)
		}
		api := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		for i := range 3 {
			resp, err := api.Get(srv.URL)
			var we *httplimit.WaitError
			switch {
			case i < 2 && err != nil:
				t.Fatalf("request %d: %v", i+1, err)
			case i < 2:
				resp.Body.Close()
			case !errors.As(err, &we) || we.Wait < 55*time.Second || !strings.Contains(err.Error(), "deadline"):
				t.Fatalf("request 3: %v, want a *WaitError of about a minute, past the deadline", err)
			}
		}
		if n := len(up.times()); n != 2 {
			t.Errorf("the API got %d requests, want 2", n)
		}
	})

	t.Run("429 sent again after Retry-After", func(t *testing.T) {
		up := &arrivals{refuse1: true}
		srv := httptest.NewServer(up)
		defer srv.Close()
		tr, err := httplimit.NewTransport(nil, lim, httplimit.TransportOptions{
			Limit: client.TokenBucket{Capacity: 10, Rate: 10, Period: time.Second, Name: "retry"}, Key: keyOf})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		at := up.times()
		if resp.StatusCode != 200 || string(b) != "ok" || len(at) != 2 || at[1].Sub(at[0]) < time.Second {
			t.Fatalf("%d %q after %d requests (%v); want 200 from the second, a second or more after the first", resp.StatusCode, b, len(at), at)
		}
	})
}
