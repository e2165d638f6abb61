package integration_test

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/httplimit"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/versions"
)

// The middleware never stops limiting silently: the situations in which a service on
// client/httplimit went on serving with no limit, each on a real server.

// stopServer serves "ok" behind a middleware of opts over real HTTP on 127.0.0.1. Its
// MaxHeaderBytes lets a request with a 1 MiB header reach the middleware, as a proxy that
// allows one would pass it on.
func stopServer(t *testing.T, lim httplimit.Decider, opts httplimit.Options) (*httptest.Server, *httplimit.Middleware) {
	t.Helper()
	m, err := httplimit.New(lim, opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok")
	})))
	srv.Config.MaxHeaderBytes = 4 << 20
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, m
}

// userKey keys requests by their X-User header.
func userKey(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }

// perUserPerIP is the README's route: a per-user limit and a per-IP one, the client's address
// what the trusted proxy (the test, on 127.0.0.1) forwarded.
func perUserPerIP(t *testing.T, name string, user, ip client.Limit) httplimit.Policy {
	t.Helper()
	ips, err := httplimit.NewClientIP(httplimit.ClientIPOptions{TrustedProxies: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	return httplimit.Policy{Name: name, Limit: user, Also: []httplimit.AlsoLimit{{Name: name + "-ip", Key: ips.Key, Limit: ip}}}
}

func usedMemory(t *testing.T, c valkey.Client) int64 {
	t.Helper()
	info, err := harness.Info(ctx5s(t), c, "memory")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(info["used_memory"], 10, 64)
	if err != nil {
		t.Fatalf("used_memory %q: %v", info["used_memory"], err)
	}
	return n
}

// A node that still runs library 1.0.0 (before an upgrade, or after a rollback) under a
// per-user + per-IP route: every request is decided, the per-user limit exactly, by the node,
// and Check says at start-up that the route needs 1.1.0.
func TestHTTPStopOldLibrary(t *testing.T) {
	s := harness.StartValkey(t)
	vk := s.Client(t)
	old, ok := versions.Embedded().Find("1.0.0")
	if !ok {
		t.Fatal("no release 1.0.0")
	}
	if err := vk.Do(ctx5s(t), vk.B().FunctionLoad().Replace().FunctionCode(old.Code).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	perUser := client.SlidingLog{Limit: 5, Window: time.Hour}
	perIP := client.SlidingWindow{Limit: 1000, Window: time.Hour}
	policy := perUserPerIP(t, "api", perUser, perIP)
	srv, m := stopServer(t, harness.NewLimiter(t, vk, asShipped), httplimit.Options{
		Key:      userKey,
		Policy:   func(*http.Request) httplimit.Policy { return policy },
		Policies: []httplimit.Policy{policy},
	})

	err := m.Check(ctx5s(t))
	t.Logf("Check: %v", err)
	var re *httplimit.ReleaseError
	var ve *client.VersionError
	if !errors.As(err, &re) || re.Release != "1.1.0" || len(re.Policies) != 1 || re.Policies[0] != "api" ||
		!errors.As(err, &ve) || ve.Node != s.Addr || ve.Version != "1.0.0" {
		t.Errorf("Check: %v; want policy \"api\" needing 1.1.0, node %s running 1.0.0", err, s.Addr)
	}

	user := strings.NewReplacer(":", "-", "/", "-").Replace(keyFor(t))
	const requests = 12
	served, refused := 0, 0
	for i := range requests {
		ip := "198.51.100." + strconv.Itoa(1+i%3) // three addresses, one user
		r := send(t, http.MethodGet, srv.URL, "", "X-User: "+user, "X-Forwarded-For: "+ip)
		if r.header.Get("RateLimit-Policy") == "" {
			t.Errorf("request %d: %d %q without a decision (no rate-limit headers)", i+1, r.status, r.body)
		}
		switch r.status {
		case http.StatusOK:
			served++
		case http.StatusTooManyRequests:
			refused++
		default:
			t.Errorf("request %d: %d %q", i+1, r.status, r.body)
		}
	}
	if served != int(perUser.Limit) || refused != requests-int(perUser.Limit) {
		t.Errorf("%d served, %d refused; want %d and %d: the per-user limit", served, refused, perUser.Limit, requests-int(perUser.Limit))
	}
	// The node counted them: its log of the user is full, not a local stand-in's.
	peek, err := harness.NewLimiter(t, vk, client.Options{Deadline: slowDeadline, Fallback: client.ReturnError}).Peek(ctx5s(t), "api:"+user, perUser)
	if err != nil || peek.Source == client.FromFallback || peek.Remaining != 0 || peek.Allowed {
		t.Errorf("the node's per-user limit: %+v, %v; want it full (Remaining 0)", peek, err)
	}
}

// A policy named "my api" and a token bucket of Capacity 0 cannot be valid: every request is
// answered 500 with what is wrong logged, never served, FailOpen or not; New refuses them as
// static policies.
func TestHTTPStopMisconfigured(t *testing.T) {
	_, vk := httpValkey(t)
	var logged bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	space := httplimit.Policy{Name: "my api", Limit: client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}}
	zero := httplimit.Policy{Name: "zero", Limit: client.TokenBucket{Capacity: 0, Rate: 1, Period: time.Second}}
	policy := func(r *http.Request) httplimit.Policy {
		if r.URL.Path == "/space" {
			return space
		}
		return zero
	}
	for _, failOpen := range []bool{false, true} {
		srv, _ := stopServer(t, harness.NewLimiter(t, vk, asShipped), httplimit.Options{Key: userKey, Policy: policy, FailOpen: failOpen})
		for _, path := range []string{"/space", "/zero"} {
			for i := range 3 {
				r := send(t, http.MethodGet, srv.URL+path, "", "X-User: alice")
				if r.status != http.StatusInternalServerError || !strings.Contains(r.body, "rate limit misconfigured") {
					t.Errorf("FailOpen %v, %s, request %d: %d %q; want 500", failOpen, path, i+1, r.status, r.body)
				}
			}
		}
	}
	for _, want := range []string{
		`msg="httplimit: rate limit misconfigured, answered 500" err="httplimit: policy \"my api\": want letters`,
		`msg="httplimit: rate limit misconfigured, answered 500" err="client: TokenBucket.Capacity must be from 1 to 999999999999999, got 0"`,
	} {
		if !strings.Contains(logged.String(), want) {
			t.Errorf("log:\n%s\nwant a line holding %s", &logged, want)
		}
	}
	if n := dbsize(t, vk); n != 0 {
		t.Errorf("DBSIZE %d after refused configurations, want 0", n)
	}

	for i, p := range []httplimit.Policy{space, zero} {
		_, err := httplimit.New(harness.NewLimiter(t, vk, asShipped), httplimit.Options{Key: userKey, Policy: policy, Policies: []httplimit.Policy{p}})
		var oe *httplimit.ConfigError
		if !errors.As(err, &oe) || oe.Field != "Policies[0]" || !strings.Contains(err.Error(), strconv.Quote(p.Name)) {
			t.Errorf("New with static policy %d: %v, want an *OptionError naming %q", i, err, p.Name)
		}
	}
}

// A 1 MiB X-User header is answered 400 "key too long", on a route of one limit and on one of
// two: nothing reaches the server (DBSIZE 0, used_memory unmoved).
func TestHTTPStopHugeKey(t *testing.T) {
	_, vk := httpValkey(t)
	one := httplimit.Policy{Name: "api", Limit: client.SlidingLog{Limit: 100, Window: time.Hour}}
	two := perUserPerIP(t, "pair", client.SlidingLog{Limit: 100, Window: time.Hour}, client.SlidingWindow{Limit: 1000, Window: time.Hour})
	srv, _ := stopServer(t, harness.NewLimiter(t, vk, asShipped), httplimit.Options{
		Key: userKey,
		Policy: func(r *http.Request) httplimit.Policy {
			if r.URL.Path == "/pair" {
				return two
			}
			return one
		},
	})
	huge := strings.Repeat("u", 1<<20)
	before := usedMemory(t, vk)
	for _, path := range []string{"/one", "/pair"} {
		for i := range 10 {
			r := send(t, http.MethodGet, srv.URL+path, "", "X-User: "+huge, "X-Forwarded-For: 198.51.100.1")
			if r.status != http.StatusBadRequest || r.body != `{"error":"key too long"}`+"\n" {
				t.Fatalf("%s, request %d: %d %q; want 400 key too long", path, i+1, r.status, r.body)
			}
		}
	}
	if n := dbsize(t, vk); n != 0 {
		t.Errorf("DBSIZE %d after 20 requests with a 1 MiB key, want 0", n)
	}
	// One such key would take a MiB; allocator noise is far below it.
	if after := usedMemory(t, vk); after-before > 256<<10 {
		t.Errorf("used_memory went from %d to %d bytes", before, after)
	}
	if r := send(t, http.MethodGet, srv.URL+"/pair", "", "X-User: bob", "X-Forwarded-For: 198.51.100.1"); r.status != http.StatusOK {
		t.Errorf("a short key: %d %q", r.status, r.body)
	}
}

// An attack on one user behind a per-IP limit: a refused request costs the server no more
// calls than an admitted one (INFO commandstats: FCALL and FCALL_RO).
func TestHTTPStopAttackCost(t *testing.T) {
	_, vk := httpValkey(t)
	const allowed = 3
	policy := perUserPerIP(t, "login", client.SlidingWindow{Limit: allowed, Window: time.Hour}, client.SlidingWindow{Limit: 10000, Window: time.Hour})
	srv, _ := stopServer(t, harness.NewLimiter(t, vk, asShipped), httplimit.Options{
		Key:    userKey,
		Policy: func(*http.Request) httplimit.Policy { return policy },
	})
	calls := func() int64 {
		var n int64
		for _, cmd := range []string{"fcall", "fcall_ro"} {
			st, err := harness.CommandStats(ctx5s(t), vk, cmd)
			if err != nil {
				t.Fatal(err)
			}
			n += st.Calls
		}
		return n
	}
	victim := strings.NewReplacer(":", "-", "/", "-").Replace(keyFor(t))
	attack := func(n, want int) float64 {
		start := calls()
		for i := range n {
			// the attacker rotates addresses, each under its per-IP limit
			r := send(t, http.MethodGet, srv.URL, "", "X-User: "+victim, "X-Forwarded-For: 203.0.113."+strconv.Itoa(1+i%200))
			if r.status != want {
				t.Fatalf("request %d: %d %q, want %d", i+1, r.status, r.body, want)
			}
		}
		return float64(calls()-start) / float64(n)
	}
	admitted := attack(allowed, http.StatusOK)
	refused := attack(50, http.StatusTooManyRequests)
	t.Logf("server calls per admitted request %.2f, per refused request %.2f", admitted, refused)
	if refused > admitted {
		t.Errorf("a refused request costs the server %.2f calls, an admitted one %.2f: an attack is dearer than traffic", refused, admitted)
	}
}

// With the server gone, no request is served unlimited by default: the client's default
// policy (LocalFallback) decides it in-process, with the rate-limit headers; a limiter that
// returns its errors (ReturnError) gets 503; only FailOpen serves with no limit.
func TestHTTPStopServerGone(t *testing.T) {
	s, vk := httpValkey(t)
	limit := client.TokenBucket{Capacity: 10, Rate: 10, Period: time.Second}
	policy := func(*http.Request) httplimit.Policy { return httplimit.Policy{Name: "api", Limit: limit} }
	errs := make(chan error, 10)
	onError := func(_ *http.Request, err error) { errs <- err }
	local, _ := stopServer(t, harness.NewLimiter(t, vk, asShipped), httplimit.Options{Key: userKey, Policy: policy, OnError: onError})
	closed, _ := stopServer(t, harness.NewLimiter(t, vk, client.Options{Deadline: slowDeadline, Fallback: client.ReturnError}),
		httplimit.Options{Key: userKey, Policy: policy, OnError: onError})
	open, _ := stopServer(t, harness.NewLimiter(t, vk, client.Options{Deadline: slowDeadline, Fallback: client.ReturnError}),
		httplimit.Options{Key: userKey, Policy: policy, OnError: onError, FailOpen: true})
	user := strings.NewReplacer(":", "-", "/", "-").Replace(keyFor(t))
	for _, srv := range []*httptest.Server{local, closed, open} {
		if r := send(t, http.MethodGet, srv.URL, "", "X-User: "+user); r.status != http.StatusOK || r.header.Get("RateLimit") == "" {
			t.Fatalf("server up: %d %v", r.status, r.header)
		}
	}
	if err := s.Stop(ctx5s(t)); err != nil {
		t.Fatal(err)
	}

	if r := send(t, http.MethodGet, local.URL, "", "X-User: "+user); r.status != http.StatusOK || r.header.Get("RateLimit") == "" {
		t.Errorf("server gone, LocalFallback: %d %v; want 200 decided in-process, with its headers", r.status, r.header)
	}
	if r := send(t, http.MethodGet, closed.URL, "", "X-User: "+user); r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "rate limiter unavailable") {
		t.Errorf("server gone, ReturnError: %d %q; want 503", r.status, r.body)
	}
	if r := send(t, http.MethodGet, open.URL, "", "X-User: "+user); r.status != http.StatusOK || r.header.Get("RateLimit") != "" {
		t.Errorf("server gone, ReturnError and FailOpen: %d %v; want 200 without rate-limit headers", r.status, r.header)
	}
	if n := len(errs); n != 2 {
		t.Errorf("OnError called %d times, want twice (ReturnError's two middlewares)", n)
	}
}
