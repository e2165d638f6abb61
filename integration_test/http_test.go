package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/httplimit"
	"github.com/rlfn/rlfn/internal/harness"
)

// httpValkey starts a Valkey 8 of the test's own with the library loaded, and returns a client
// of it.
func httpValkey(t *testing.T) (*harness.Server, valkey.Client) {
	t.Helper()
	s := harness.StartValkey(t)
	c := s.Client(t)
	if err := load(ctx5s(t), c); err != nil {
		t.Fatal(err)
	}
	return s, c
}

// limitedServer serves "ok" behind the middleware over real HTTP on 127.0.0.1, every request
// counted against the key in its X-Key header.
func limitedServer(t *testing.T, lim httplimit.Decider, opts httplimit.Options, next http.Handler) *httptest.Server {
	t.Helper()
	opts.Key = func(r *http.Request) (string, error) { return r.Header.Get("X-Key"), nil }
	m, err := httplimit.New(lim, opts)
	if err != nil {
		t.Fatal(err)
	}
	if next == nil {
		next = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	}
	srv := httptest.NewServer(m.Handler(next))
	t.Cleanup(srv.Close)
	return srv
}

type response struct {
	status int
	header http.Header
	body   string
}

// get makes one GET with the key in X-Key, as the tests' key functions read it.
func get(t *testing.T, url, key string) response {
	t.Helper()
	return send(t, http.MethodGet, url, "", "X-Key: "+key)
}

// headerInt reads an integer header, failing the test when it is absent or not an integer.
func headerInt(t *testing.T, r response, name string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(r.header.Get(name), 10, 64)
	if err != nil {
		t.Fatalf("%s: %q: %v (headers %v)", name, r.header.Get(name), err, r.header)
	}
	return v
}

// rateLimitT reads the t of the RateLimit header's first item.
func rateLimitT(t *testing.T, r response) int64 {
	t.Helper()
	v := r.header.Get("RateLimit")
	_, after, ok := strings.Cut(v, ";t=")
	if !ok {
		t.Fatalf("RateLimit %q has no t", v)
	}
	if i := strings.IndexAny(after, ",;"); i >= 0 {
		after = after[:i]
	}
	n, err := strconv.ParseInt(after, 10, 64)
	if err != nil {
		t.Fatalf("RateLimit %q: %v", v, err)
	}
	return n
}

// checkUnixReset checks that X-RateLimit-Reset is the Unix time, in seconds, delta seconds
// from when the response was made: a reset read from the middleware's clock (up to a tick,
// 100ms, ahead) and rounded up, less a now that Unix() rounds down, is from delta - 1 (read a
// moment later) to delta + 2 (now at .95: .95 + .1 crosses a second, and the round-ups add
// one). A delta sent for a Unix time would be 1.8e9 off.
func checkUnixReset(t *testing.T, r response, delta int64) {
	t.Helper()
	got := headerInt(t, r, "X-RateLimit-Reset") - time.Now().Unix()
	if got < delta-1 || got > delta+2 {
		t.Errorf("X-RateLimit-Reset is %d seconds from now, want %d (a Unix time): %v", got, delta, r.header)
	}
}

// A token bucket over real HTTP: a burst of Capacity requests served with the RateLimit
// headers counting down, the next one refused 429 with a Retry-After that, waited out,
// admits the request after it.
func TestHTTPTokenBucket(t *testing.T) {
	_, vk := httpValkey(t)
	limit := client.TokenBucket{Capacity: 3, Rate: 1, Period: 2 * time.Second}
	srv := limitedServer(t, harness.NewLimiter(t, vk, slowMachine), httplimit.Options{
		Policy: func(*http.Request) httplimit.Policy { return httplimit.Policy{Name: "burst", Limit: limit} },
	}, nil)
	key := keyFor(t)

	start := time.Now()
	for i := int64(1); i <= 3; i++ {
		r := get(t, srv.URL, key)
		if r.status != http.StatusOK || r.body != "ok" {
			t.Fatalf("request %d: %d %q", i, r.status, r.body)
		}
		// Capacity 3 refilled 1 per 2s: w = 6. After i tokens, the bucket is full again in
		// 2i seconds, less the time since the first request, rounded up.
		reset := rateLimitT(t, r)
		if i*2-reset < 0 || time.Duration(i*2-reset)*time.Second > time.Since(start)+time.Second {
			t.Errorf("request %d: RateLimit t=%d, want about %d", i, reset, 2*i)
		}
		checkUnixReset(t, r, reset)
		want := map[string]string{
			"RateLimit-Policy":      `"burst";q=3;w=6`,
			"RateLimit":             fmt.Sprintf(`"burst";r=%d;t=%d`, 3-i, reset),
			"X-RateLimit-Limit":     "3",
			"X-RateLimit-Remaining": strconv.FormatInt(3-i, 10),
		}
		for name, v := range want {
			if got := r.header.Get(name); got != v {
				t.Errorf("request %d: %s: %q, want %q", i, name, got, v)
			}
		}
	}

	r := get(t, srv.URL, key)
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("request 4: %d %q, want 429", r.status, r.body)
	}
	retry := headerInt(t, r, "Retry-After")
	var b struct {
		Error        string `json:"error"`
		Policy       string `json:"policy"`
		RetryAfterMs *int64 `json:"retry_after_ms"`
	}
	if err := json.Unmarshal([]byte(r.body), &b); err != nil {
		t.Fatalf("429 body %q: %v", r.body, err)
	}
	if retry < 1 || retry > 2 || b.Error != "rate limited" || b.Policy != "burst" || b.RetryAfterMs == nil ||
		*b.RetryAfterMs <= 0 || *b.RetryAfterMs > 2000 || (*b.RetryAfterMs+999)/1000 != retry {
		t.Fatalf("request 4: Retry-After %d, body %q; want 1 or 2 seconds, the body's milliseconds rounded up", retry, r.body)
	}
	if got, want := r.header.Get("RateLimit"), fmt.Sprintf(`"burst";r=0;t=%d`, retry); got != want {
		t.Errorf("request 4: RateLimit %q, want %q (t no later than Retry-After)", got, want)
	}
	if r.header.Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("request 4: legacy headers %v", r.header)
	}
	checkUnixReset(t, r, retry)

	time.Sleep(time.Duration(retry) * time.Second)
	if r := get(t, srv.URL, key); r.status != http.StatusOK || r.header.Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("after waiting Retry-After (%ds): %d %v, want 200 with one token taken", retry, r.status, r.header)
	}
}

// decision is what the server decided about one request, and when the next handler ran.
type decision struct {
	res     client.Result
	decided time.Time
	reached time.Time // zero if the next handler never ran
}

type traceKey struct{}

// recorder is a Limiter that notes each decision of the real limiter in the request's trace.
type recorder struct{ lim *client.Limiter }

func (rc recorder) Allow(ctx context.Context, key string, limit client.Limit) (client.Result, error) {
	res, err := rc.lim.Allow(ctx, key, limit)
	if d, ok := ctx.Value(traceKey{}).(*decision); ok {
		d.res, d.decided = res, time.Now()
	}
	return res, err
}

// A leaky bucket in shape mode over real HTTP: a burst of concurrent requests is spread out,
// each held for the delay the server gave it (no less, and not much more), and a delay above
// MaxDelay is answered 429 with the excess as Retry-After.
func TestHTTPShape(t *testing.T) {
	_, vk := httpValkey(t)
	// One unit leaks every 500ms: a burst of 6 gets delays of about 0, 0.5, 1, 1.5, 2s (or is
	// refused once the 5 places are taken); MaxDelay 1.2s serves the first three.
	limit := client.LeakyBucket{Capacity: 5, Rate: 2, Period: time.Second, Mode: client.Shape}
	const maxDelay = 1200 * time.Millisecond

	var mu sync.Mutex
	traces := map[string]*decision{}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Context().Value(traceKey{}).(*decision).reached = time.Now()
		io.WriteString(w, "ok")
	})
	m, err := httplimit.New(recorder{harness.NewLimiter(t, vk, slowMachine)}, httplimit.Options{
		Key:      func(r *http.Request) (string, error) { return r.Header.Get("X-Key"), nil },
		Policy:   func(*http.Request) httplimit.Policy { return httplimit.Policy{Name: "upload", Limit: limit} },
		MaxDelay: maxDelay,
	})
	if err != nil {
		t.Fatal(err)
	}
	limited := m.Handler(next)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d := &decision{}
		id := r.Header.Get("X-Id")
		mu.Lock()
		traces[id] = d
		mu.Unlock()
		limited.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), traceKey{}, d)))
	}))
	t.Cleanup(srv.Close)

	key := keyFor(t)
	const n = 6
	responses := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req, err := http.NewRequest("GET", srv.URL, nil)
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set("X-Key", key)
			req.Header.Set("X-Id", strconv.Itoa(i))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			responses[i] = response{resp.StatusCode, resp.Header, string(b)}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	var held, overMax int
	for i, r := range responses {
		d := traces[strconv.Itoa(i)]
		res := d.res
		switch {
		case !res.Allowed:
			if r.status != http.StatusTooManyRequests || !d.reached.IsZero() {
				t.Errorf("request %d denied (%+v): status %d, reached handler %v", i, res, r.status, !d.reached.IsZero())
			}
		case res.Delay > maxDelay:
			overMax++
			// The refused request's own unit (500ms) must leak out too.
			want := int64(math.Ceil((res.Delay + 500*time.Millisecond - maxDelay).Seconds()))
			if r.status != http.StatusTooManyRequests || headerInt(t, r, "Retry-After") != want || !d.reached.IsZero() {
				t.Errorf("request %d: delay %s above MaxDelay: status %d, Retry-After %q, reached handler %v; want 429, %d",
					i, res.Delay, r.status, r.header.Get("Retry-After"), !d.reached.IsZero(), want)
			}
		default:
			if r.status != http.StatusOK || d.reached.IsZero() {
				t.Fatalf("request %d: delay %s: status %d; want 200", i, res.Delay, r.status)
			}
			if res.Delay > 0 {
				held++
			}
			// A timer never fires early; the upper bound only catches a hold that ignores
			// the delay altogether.
			if h := d.reached.Sub(d.decided); h < res.Delay || h > res.Delay+time.Second {
				t.Errorf("request %d: held %s for a delay of %s", i, h, res.Delay)
			}
			if got := r.header.Get("RateLimit-Policy"); got != `"upload";q=5;w=3` {
				t.Errorf("request %d: RateLimit-Policy %q", i, got)
			}
		}
	}
	if held == 0 || overMax == 0 {
		t.Errorf("%d requests held, %d refused for a delay above MaxDelay; want some of each: %+v", held, overMax, responses)
	}
}

// With the server gone and a Limiter that returns the error (ReturnError), the middleware
// serves requests without rate-limit headers when it was told to (FailOpen), or answers
// ErrorStatus; once the
// server is back (and the library redeployed), decisions and headers return.
func TestHTTPServerGone(t *testing.T) {
	s, vk := httpValkey(t)
	limit := client.TokenBucket{Capacity: 10, Rate: 10, Period: time.Second}
	policy := func(*http.Request) httplimit.Policy { return httplimit.Policy{Name: "api", Limit: limit} }
	var errs sync.Map
	onError := func(r *http.Request, err error) { errs.Store(r.URL.Path, err) }
	open := limitedServer(t, harness.NewLimiter(t, vk, client.Options{Deadline: slowDeadline, Fallback: client.ReturnError}), httplimit.Options{Policy: policy, OnError: onError, FailOpen: true}, nil)
	closed := limitedServer(t, harness.NewLimiter(t, vk, client.Options{Deadline: slowDeadline, Fallback: client.ReturnError}), httplimit.Options{Policy: policy, OnError: onError,
		ErrorStatus: http.StatusServiceUnavailable}, nil)
	key := keyFor(t)

	if r := get(t, open.URL, key); r.status != http.StatusOK || r.header.Get("RateLimit") == "" {
		t.Fatalf("server up: %d %v", r.status, r.header)
	}
	if err := s.Stop(ctx5s(t)); err != nil {
		t.Fatal(err)
	}
	if r := get(t, open.URL+"/open", key); r.status != http.StatusOK || r.body != "ok" || r.header.Get("RateLimit") != "" {
		t.Errorf("server gone, fail open: %d %q %v; want 200 without rate-limit headers", r.status, r.body, r.header)
	}
	if r := get(t, closed.URL+"/closed", key); r.status != http.StatusServiceUnavailable || r.body == "ok" {
		t.Errorf("server gone, ErrorStatus 503: %d %q", r.status, r.body)
	}
	for _, path := range []string{"/open", "/closed"} {
		if _, ok := errs.Load(path); !ok {
			t.Errorf("%s: OnError not called", path)
		}
	}

	if err := s.Start(ctx5s(t)); err != nil {
		t.Fatal(err)
	}
	// A restarted server has lost its functions: until a deploy, every call is ErrNotLoaded.
	var r response
	deadline := time.Now().Add(10 * time.Second)
	for ; time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		errs.Delete("/again")
		r = get(t, closed.URL+"/again", key)
		if err, _ := errs.Load("/again"); err != nil && err.(error) == client.ErrNotLoaded {
			break
		}
	}
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("server back without the library: %d, want 503 (ErrNotLoaded)", r.status)
	}
	// The restart may have broken another of vk's connections than the one the limiter just
	// used: the first command on it answers EOF and valkey-go reconnects, so retry.
	ctx := ctx5s(t)
	for err := load(ctx, vk); err != nil; err = load(ctx, vk) {
		if ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := get(t, closed.URL, key); r.status != http.StatusOK || r.header.Get("RateLimit") != `"api";r=9;t=1` {
		t.Errorf("library redeployed: %d %v; want 200 with a fresh bucket's headers", r.status, r.header)
	}
}
