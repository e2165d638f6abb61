package httplimit_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/valkey-io/valkey-go"
	"go.opentelemetry.io/otel"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/httplimit"
)

func Example() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()

	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	limits, err := httplimit.New(lim, httplimit.Options{
		// Count requests per API key; a request without one is answered 400.
		Key: func(r *http.Request) (string, error) {
			if k := r.Header.Get("X-Api-Key"); k != "" {
				return k, nil
			}
			return "", errors.New("no API key")
		},
		// Per route: uploads are shaped to 2 a second, queued up to 5 seconds; everything
		// else gets bursts of 100 and 10 a second; health checks are not limited.
		Policy: func(r *http.Request) httplimit.Policy {
			switch {
			case r.URL.Path == "/healthz":
				return httplimit.Policy{}
			case strings.HasPrefix(r.URL.Path, "/upload"):
				return httplimit.Policy{Name: "upload", Limit: client.LeakyBucket{
					Capacity: 10, Rate: 2, Period: time.Second, Mode: client.Shape}}
			}
			return httplimit.Policy{Name: "api", Limit: client.TokenBucket{
				Capacity: 100, Rate: 10, Period: time.Second}}
		},
		MaxDelay: 5 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hello\n")) })
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", limits.Handler(mux)))
}

// A payment route holds a concurrency lease for the whole request: at most 20 payments of one
// API key in flight, 4 of them kept for the critical route (refunds to customers), which may
// use them all; other routes stop at 16.
func Example_concurrency() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()

	inFlight := &client.Concurrency{Limit: 20, Lease: 30 * time.Second, Reserve: 4}
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	limits, err := httplimit.New(lim, httplimit.Options{
		Key: func(r *http.Request) (string, error) { return r.Header.Get("X-Api-Key"), nil },
		Policy: func(r *http.Request) httplimit.Policy {
			return httplimit.Policy{
				Name:        "payments",
				Limit:       client.TokenBucket{Capacity: 100, Rate: 25, Period: time.Second, Reserve: 20},
				Concurrency: inFlight,
				Critical:    r.URL.Path == "/refunds",
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("paid\n")) })
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", limits.Handler(mux)))
}

// The login pattern: an attempt counts against three limits at once, all or nothing: per
// (IP, user) against guessing one account from one place, per IP against one address trying
// many accounts, per user against many addresses trying one. The route hides its quota. The
// example prints the key each limit counts an attempt against (behind a proxy at 10.0.0.2);
// run with httplimit.New and a client.Limiter, it is the integration test TestHTTPLogin.
func Example_login() {
	ips, err := httplimit.NewClientIP(httplimit.ClientIPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		log.Fatal(err)
	}
	user := func(r *http.Request) (string, error) {
		if u := r.PostFormValue("user"); u != "" {
			return strings.ToLower(u), nil
		}
		return "", errors.New("no user")
	}
	login := httplimit.Options{
		Key: func(r *http.Request) (string, error) {
			ip, err := ips.Key(r)
			if err != nil {
				return "", err
			}
			u, err := user(r)
			return ip + " " + u, err
		},
		Policy: func(r *http.Request) httplimit.Policy {
			return httplimit.Policy{
				Name:  "login",
				Limit: client.FixedWindow{Limit: 5, Window: time.Minute},
				Also: []httplimit.AlsoLimit{
					{Name: "login-ip", Key: ips.Key, Limit: client.SlidingWindow{Limit: 50, Window: time.Hour}},
					{Name: "login-user", Key: user, Limit: client.SlidingWindow{Limit: 20, Window: time.Hour}},
				},
				HideQuota: true, // no "4 attempts left" for whoever is guessing
			}
		},
	}

	r := httptest.NewRequest("POST", "/login", strings.NewReader("user=Alice&password=hunter2"))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("X-Forwarded-For", "203.0.113.66, 198.51.100.7") // the client wrote the first
	r.RemoteAddr = "10.0.0.2:51000"
	p := login.Policy(r)
	k, _ := login.Key(r)
	fmt.Printf("%s %q\n", p.Name, k)
	for _, rule := range p.Also {
		k, _ := rule.Key(r)
		fmt.Printf("%s %q\n", rule.Name, k)
	}
	// Output:
	// login "198.51.100.7 alice"
	// login-ip "198.51.100.7"
	// login-user "alice"
}

// A service whose limits are constants lists them in Options.Policies: New refuses one that
// cannot be valid, naming it, and Check tells at start-up whether every node runs the library
// release they need, here 1.1.0 for a per-user and per-IP decision. Requests are keyed by a
// hash of their bearer token: a token can be longer than the key the client takes.
func Example_startup() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()

	ips, err := httplimit.NewClientIP(httplimit.ClientIPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		log.Fatal(err)
	}
	api := httplimit.Policy{
		Name:  "api",
		Limit: client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second},
		Also: []httplimit.AlsoLimit{{Name: "api-ip", Key: ips.Key,
			Limit: client.SlidingWindow{Limit: 5000, Window: time.Hour}}},
	}
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	limits, err := httplimit.New(lim, httplimit.Options{
		Key: func(r *http.Request) (string, error) {
			token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || token == "" {
				return "", errors.New("no bearer token")
			}
			sum := sha256.Sum256([]byte(token))
			return hex.EncodeToString(sum[:]), nil
		},
		Policy:   func(*http.Request) httplimit.Policy { return api },
		Policies: []httplimit.Policy{api},
	})
	if err != nil {
		log.Fatal(err) // an *httplimit.ConfigError naming the policy
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := limits.Check(ctx); err != nil {
		// A node on 1.0.0 still limits, each limit on its own rather than all or nothing,
		// until a deploy reaches it.
		slog.Error("rate limits", "err", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hello\n")) })
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", limits.Handler(mux)))
}

// The library release each policy needs: one limit runs on 1.0.0; several at once, a
// concurrency lease or a reserve need 1.1.0; a calendar quota or a penalty, 1.2.0.
func ExampleNeeds() {
	perUser := client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second}
	for _, p := range []httplimit.Policy{
		{Name: "api", Limit: perUser},
		{Name: "api-ip", Limit: perUser, Also: []httplimit.AlsoLimit{{Name: "ip", Key: httplimit.RemoteIP,
			Limit: client.SlidingWindow{Limit: 5000, Window: time.Hour}}}},
		{Name: "payments", Limit: perUser, Concurrency: &client.Concurrency{Limit: 20, Lease: 30 * time.Second}},
		{Name: "monthly", Limit: client.Calendar{Limit: 10_000, Period: client.Month}},
		{Name: "login", Limit: client.SlidingWindow{Limit: 20, Window: 10 * time.Minute, Penalty: time.Hour}},
	} {
		fmt.Println(p.Name, httplimit.Needs(p))
	}
	// Output:
	// api 1.0.0
	// api-ip 1.1.0
	// payments 1.1.0
	// monthly 1.2.0
	// login 1.2.0
}

// A monthly quota per customer, billed in the customer's time zone from the customer's billing
// day: each window starts at local midnight on that day (on the month's last day when it has
// fewer days), and the headers describe the real window: w is this month's length, the reset
// its end, even before the month's first request. A burst limit is decided with it, all or
// nothing. Calendar quotas need library 1.2.0.
func Example_calendar() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()

	berlin, err := time.LoadLocation("Europe/Berlin") // never time.Local: the client refuses it
	if err != nil {
		log.Fatal(err)
	}
	type customer struct {
		plan    int64     // calls a month
		billing time.Time // the first window's start, in the customer's zone
	}
	customers := map[string]customer{
		"key-acme":   {plan: 10_000, billing: time.Date(2026, 1, 31, 0, 0, 0, 0, berlin)},
		"key-globex": {plan: 1_000_000, billing: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)},
	}
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	limits, err := httplimit.New(lim, httplimit.Options{
		Key: func(r *http.Request) (string, error) {
			k := r.Header.Get("X-Api-Key")
			if _, ok := customers[k]; !ok {
				return "", errors.New("unknown API key")
			}
			return k, nil
		},
		Policy: func(r *http.Request) httplimit.Policy {
			c, ok := customers[r.Header.Get("X-Api-Key")]
			if !ok {
				c = customer{plan: 100} // Key answers the request 400 before any decision
			}
			return httplimit.Policy{
				Name:  "monthly",
				Limit: client.Calendar{Limit: c.plan, Period: client.Month, Anchor: c.billing},
				Also: []httplimit.AlsoLimit{{Name: "burst",
					Limit: client.TokenBucket{Capacity: 50, Rate: 10, Period: time.Second}}},
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hello\n")) })
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", limits.Handler(mux)))
}

// A login route with a penalty: an address that makes more than 20 attempts in 10 minutes is
// blocked for an hour. Every attempt in that hour is answered 429 without counting, its
// Retry-After the block's time left, which more attempts never lengthen. The address is read
// from trusted proxies only (ClientIP): a penalty on a key a client can forge lets an attacker
// lock a victim out. Operators block or unblock an address by hand on an endpoint of their
// own, under the key the middleware uses (LimiterKey).
func Example_penalty() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()

	ips, err := httplimit.NewClientIP(httplimit.ClientIPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		log.Fatal(err)
	}
	login := httplimit.Policy{
		Name:      "login",
		Limit:     client.SlidingWindow{Limit: 20, Window: 10 * time.Minute, Penalty: time.Hour},
		HideQuota: true, // Retry-After alone
	}
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	limits, err := httplimit.New(lim, httplimit.Options{
		Key: ips.Key,
		Policy: func(r *http.Request) httplimit.Policy {
			if r.URL.Path == "/login" {
				return login
			}
			return httplimit.Policy{}
		},
		Policies: []httplimit.Policy{login},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := limits.Check(ctx); err != nil {
		slog.Error("rate limits", "err", err) // a node older than 1.2.0 cannot block
	}

	// The operators' endpoint, on an address of its own behind their authentication:
	// POST /blocks?ip=198.51.100.7&for=24h blocks, DELETE /blocks?ip=198.51.100.7 unblocks
	// (an IPv6 client is its /64, as ClientIP keys it: ip=2001:db8:1:2::/64).
	admin := http.NewServeMux()
	admin.HandleFunc("POST /blocks", func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.FormValue("for"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if _, err := lim.Block(r.Context(), httplimit.LimiterKey(login.Name, r.FormValue("ip")), d); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
		}
	})
	admin.HandleFunc("DELETE /blocks", func(w http.ResponseWriter, r *http.Request) {
		if _, err := lim.Unblock(r.Context(), httplimit.LimiterKey(login.Name, r.FormValue("ip"))); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
		}
	})
	go func() { log.Fatal(http.ListenAndServe("127.0.0.1:9090", admin)) }()

	mux := http.NewServeMux()
	mux.HandleFunc("POST /login", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("welcome\n")) })
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", limits.Handler(mux)))
}

// The client's address behind trusted proxies: only their header is read, the rightmost
// address in it that is not theirs; IPv6 clients are grouped by /64.
func ExampleClientIP() {
	ips, err := httplimit.NewClientIP(httplimit.ClientIPOptions{
		TrustedProxies: []string{"10.0.0.0/8", "2001:db8:ffff::/48"},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range []struct{ peer, xff string }{
		{"198.51.100.7:40000", "203.0.113.66"},              // not from a proxy: the header is ignored
		{"10.0.0.2:40000", "203.0.113.66, 198.51.100.7"},    // the proxy appended 198.51.100.7
		{"10.0.0.2:40000", "198.51.100.7, 10.0.0.3"},        // two proxies
		{"[2001:db8:ffff::1]:443", "2001:db8:42:7:aaaa::1"}, // an IPv6 client
		{"[::ffff:10.0.0.2]:40000", "::ffff:198.51.100.7"},  // IPv4-mapped
		{"10.0.0.2:40000", "198.51.100.7, not-an-address"},  // garbage: the proxy itself
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = c.peer
		r.Header.Set("X-Forwarded-For", c.xff)
		k, _ := ips.Key(r)
		fmt.Println(k)
	}
	// Output:
	// 198.51.100.7
	// 198.51.100.7
	// 198.51.100.7
	// 2001:db8:42:7::/64
	// 198.51.100.7
	// 10.0.0.2
}

// A new per-hour limit rolled out beside the route's limit: decided on every request and
// counted in rlfn.httplimit.would_deny when it would deny, but not enforced. EnforcePercent
// then enforces the route for a share of the keys, the same keys on every instance.
func Example_shadow() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()

	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	limits, err := httplimit.New(lim, httplimit.Options{
		Key: func(r *http.Request) (string, error) { return r.Header.Get("X-Api-Key"), nil },
		Policy: func(r *http.Request) httplimit.Policy {
			return httplimit.Policy{
				Name:  "api",
				Limit: client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second},
				Also: []httplimit.AlsoLimit{{Name: "api-hour", Shadow: true,
					Limit: client.SlidingWindow{Limit: 20000, Window: time.Hour}}},
				EnforcePercent: 100, // lower it to roll the route's limits out gradually
			}
		},
		MeterProvider: otel.GetMeterProvider(),
		OnShadowDeny: func(r *http.Request, policy string) {
			slog.Info("would deny", "policy", policy, "path", r.URL.Path)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hello\n")) })
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", limits.Handler(mux)))
}

// Calling a rate-limited API: every instance of the service shares one leaky bucket of 10
// requests a second to it, so they leave evenly spaced; a 429 is retried after its
// Retry-After, with jitter, up to 3 times.
func ExampleTransport() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()

	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	tr, err := httplimit.NewTransport(http.DefaultTransport, lim, httplimit.TransportOptions{
		Limit: client.LeakyBucket{Capacity: 50, Rate: 10, Period: time.Second, Mode: client.Shape},
	})
	if err != nil {
		log.Fatal(err)
	}
	api := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	resp, err := api.Get("https://api.example.com/v1/items")
	if err != nil {
		log.Fatal(err) // a *httplimit.WaitError when the pace would pass the deadline
	}
	defer resp.Body.Close()
}

// A login route counts failed attempts only: five a minute per user, peeked before the handler
// and charged after a failure (a status of 400 or more), so that a user who types the password
// right is never refused for it. Requests in flight at once could each pass the peek: a
// concurrency lease of one per user closes that gap. The quota is hidden from whoever is
// guessing.
func Example_outcome() {
	login := httplimit.Policy{
		Name:        "login",
		Limit:       client.FixedWindow{Limit: 5, Window: time.Minute},
		Outcome:     &httplimit.Outcome{Count: httplimit.Failures, CheckFirst: true},
		Concurrency: &client.Concurrency{Limit: 1, Lease: 10 * time.Second},
		HideQuota:   true,
	}
	// An API that charges successful calls only: the unit taken before the handler is given
	// back when the response is an error (refunds: library 1.1.0).
	api := httplimit.Policy{
		Name:    "api",
		Limit:   client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second},
		Outcome: &httplimit.Outcome{Count: httplimit.Successes},
	}
	fmt.Println(httplimit.Needs(login), httplimit.Needs(api), login.Outcome.Count(http.StatusUnauthorized))
	// Output:
	// 1.1.0 1.1.0 true
}

// An LLM gateway's "60 requests and 150,000 tokens per minute" per organisation, decided all or
// nothing in one atomic call: the tokens' limit is counted on the policy's own key (SameKey),
// beside the requests', where one rl_multi decides both. It takes the request's estimate (its
// max_tokens, here in a header; a value that is no count, or a negative one, is answered 400),
// the requests' limit 1, and RateLimit-Policy names the tokens' unit. Once the response is streamed, the handler reports the tokens it really used in the
// Rlfn-Cost trailer, which replace the estimate: the difference is given back (or taken).
func Example_tokens() {
	estimate := func(r *http.Request) int64 {
		v := r.Header.Get("X-Max-Tokens")
		if v == "" {
			return 4096
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return -1 // the request's fault, as a negative n is: answered 400 "invalid cost"
		}
		return n
	}
	completions := httplimit.Policy{
		Name:  "requests",
		Limit: client.SlidingWindow{Limit: 60, Window: time.Minute},
		Also: []httplimit.AlsoLimit{{Name: "tokens", Unit: "tokens", Cost: estimate, SameKey: true,
			Limit: client.TokenBucket{Capacity: 150_000, Rate: 150_000, Period: time.Minute}}},
		Outcome: &httplimit.Outcome{CostHeader: "Rlfn-Cost"},
	}
	// In the handler, once the completion is streamed and its tokens counted:
	//	w.Header().Set(http.TrailerPrefix+"Rlfn-Cost", strconv.Itoa(used))

	// Both limits of organisation org-7 are on one key (the server's keys
	// rl:{requests:org-7}:sliding_window and rl:{requests:org-7}:token_bucket).
	fmt.Println(httplimit.Needs(completions), httplimit.LimiterKey(completions.Name, "org-7"))
	// Output:
	// 1.1.0 requests:org-7
}
