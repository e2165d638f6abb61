package integration_test

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/httplimit"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/versions"
)

// client/httplimit on what library 1.2.0 brought (every target loads the working copy, a
// later release): routes whose limits have a Penalty, blocks set by hand, and calendar quotas,
// over real HTTP.

// blockedBody is the part of a 429's JSON body these tests read.
type blockedBody struct {
	Error        string `json:"error"`
	Policy       string `json:"policy"`
	Blocked      bool   `json:"blocked"`
	RetryAfterMs *int64 `json:"retry_after_ms"`
}

func readBlocked(t *testing.T, r response) blockedBody {
	t.Helper()
	var b blockedBody
	if err := json.Unmarshal([]byte(r.body), &b); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	return b
}

// principal is a key no other test or run uses, with none of the characters a header value
// or the test's name would make awkward.
func principal(t *testing.T) string {
	return strings.NewReplacer("/", "-", ":", "-").Replace(keyFor(t))
}

// A route whose limit has a Penalty: requests are served until the limit denies one; that
// denial blocks the principal, and every request until the block ends is answered 429
// blocked, its Retry-After counting down from the penalty, never growing however hard the
// route is hammered; the headers say the route's quota with nothing remaining, not the block's
// limit 0. Once the block ends the route serves again.
func TestHTTPPenalty(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		const penalty = 3 * time.Second
		// Capacity 3, one token a second: the bucket's own wait (a second at most) is shorter
		// than the penalty, so the block decides the denial that sets it.
		limit := client.TokenBucket{Capacity: 3, Rate: 1, Period: time.Second, Penalty: penalty}
		policy := httplimit.Policy{Name: "pen", Limit: limit}
		srv := limitedServer(t, harness.NewLimiter(t, tg.c, slowMachine), httplimit.Options{
			Policy: func(*http.Request) httplimit.Policy { return policy },
		}, nil)
		key := principal(t)

		for i := 1; i <= 3; i++ {
			if r := get(t, srv.URL, key); r.status != http.StatusOK {
				t.Fatalf("request %d: %d %q, want 200", i, r.status, r.body)
			}
		}
		blockedAt := time.Now()
		last := int64(math.MaxInt64)
		n := 0
		for {
			r := get(t, srv.URL, key)
			if r.status == http.StatusOK {
				if since := time.Since(blockedAt); since < penalty-200*time.Millisecond {
					t.Errorf("served %s after the block began, want no sooner than the penalty, %s", since, penalty)
				}
				break
			}
			n++
			if r.status != http.StatusTooManyRequests {
				t.Fatalf("blocked request %d: %d %q, want 429", n, r.status, r.body)
			}
			retry := headerInt(t, r, "Retry-After")
			b := readBlocked(t, r)
			if !b.Blocked || b.Error != "rate limited" || b.Policy != "pen" || b.RetryAfterMs == nil ||
				(*b.RetryAfterMs+999)/1000 != retry {
				t.Errorf("blocked request %d: body %q, Retry-After %d; want it blocked, its wait Retry-After's", n, r.body, retry)
			}
			if n == 1 && retry != int64(penalty/time.Second) {
				t.Errorf("the first refusal: Retry-After %d, want the penalty, %d: the block decides it", retry, int64(penalty/time.Second))
			}
			if retry < 1 || retry > int64(penalty/time.Second) || retry > last {
				t.Errorf("blocked request %d: Retry-After %d after %d; want from %d down, never growing", n, retry, last, int64(penalty/time.Second))
			}
			last = retry
			want := map[string]string{
				"RateLimit-Policy":      `"pen";q=3;w=3`,
				"RateLimit":             `"pen";r=0;t=` + strconv.FormatInt(retry, 10),
				"X-RateLimit-Limit":     "3",
				"X-RateLimit-Remaining": "0",
			}
			for name, v := range want {
				if got := r.header.Get(name); got != v {
					t.Errorf("blocked request %d: %s: %q, want %q", n, name, got, v)
				}
			}
			checkUnixReset(t, r, retry)
			if time.Since(blockedAt) > penalty+5*time.Second {
				t.Fatalf("still blocked %s after a penalty of %s", time.Since(blockedAt), penalty)
			}
			time.Sleep(50 * time.Millisecond)
		}
		// hammered for the whole penalty at 20 a second: dozens of refusals, none lengthened it
		if n < 10 {
			t.Errorf("%d blocked requests, want the route hammered through the block", n)
		}
	})
}

// An operator's Block of a principal (the Limiter's key, LimiterKey) makes a route
// whose limit has a Penalty answer 429 blocked, Retry-After the block's time left, on a hidden
// quota too (Retry-After alone); Unblock lifts it. A route whose limit has no Penalty does not
// look at blocks, and serves.
func TestHTTPBlockByHand(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		limit := client.FixedWindow{Limit: 100, Window: time.Minute, Penalty: time.Millisecond}
		routes := map[string]httplimit.Policy{
			"/api":   {Name: "api", Limit: limit},
			"/login": {Name: "login", Limit: limit, HideQuota: true},
			"/free":  {Name: "free", Limit: client.FixedWindow{Limit: 100, Window: time.Minute}},
		}
		srv := limitedServer(t, lim, httplimit.Options{
			Policy: func(r *http.Request) httplimit.Policy { return routes[r.URL.Path] },
		}, nil)
		key := principal(t)
		for path := range routes {
			if r := get(t, srv.URL+path, key); r.status != http.StatusOK {
				t.Fatalf("%s before the block: %d %q", path, r.status, r.body)
			}
		}

		const d = 20 * time.Second
		for _, name := range []string{"api", "login", "free"} {
			res, err := lim.Block(ctx5s(t), httplimit.LimiterKey(name, key), d)
			if err != nil || !res.Blocked {
				t.Fatalf("Block %s: %+v, %v", name, res, err)
			}
		}
		r := get(t, srv.URL+"/api", key)
		retry := headerInt(t, r, "Retry-After")
		b := readBlocked(t, r)
		if r.status != http.StatusTooManyRequests || !b.Blocked || retry < 19 || retry > 20 {
			t.Errorf("/api blocked: %d %q, Retry-After %d; want 429 blocked, 19 or 20 seconds", r.status, r.body, retry)
		}
		if got, want := r.header.Get("RateLimit"), `"api";r=0;t=`+strconv.FormatInt(retry, 10); got != want {
			t.Errorf("/api blocked: RateLimit %q, want %q", got, want)
		}
		if got := r.header.Get("RateLimit-Policy"); got != `"api";q=100;w=60` {
			t.Errorf("/api blocked: RateLimit-Policy %q, want the route's quota", got)
		}

		r = get(t, srv.URL+"/login", key)
		retry = headerInt(t, r, "Retry-After")
		if b := readBlocked(t, r); r.status != http.StatusTooManyRequests || retry < 19 || retry > 20 || b.Blocked || b.Policy != "" || b.RetryAfterMs != nil {
			t.Errorf("/login blocked: %d %q, Retry-After %d; want 429, 19 or 20 seconds, a body that says nothing more", r.status, r.body, retry)
		}
		for _, h := range []string{"RateLimit", "RateLimit-Policy", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
			if v := r.header.Get(h); v != "" {
				t.Errorf("/login blocked, its quota hidden: %s: %q", h, v)
			}
		}

		if r := get(t, srv.URL+"/free", key); r.status != http.StatusOK {
			t.Errorf("/free, no Penalty: %d %q, want it served (it does not look at blocks)", r.status, r.body)
		}

		for _, name := range []string{"api", "login"} {
			if res, err := lim.Unblock(ctx5s(t), httplimit.LimiterKey(name, key)); err != nil || res.Blocked {
				t.Fatalf("Unblock %s: %+v, %v", name, res, err)
			}
		}
		for _, path := range []string{"/api", "/login"} {
			if r := get(t, srv.URL+path, key); r.status != http.StatusOK {
				t.Errorf("%s after Unblock: %d %q, want 200", path, r.status, r.body)
			}
		}
	})
}

// localWindow is the window of a daily quota starting at hour:min in loc that holds now,
// computed with time.Date alone (not the client's calendar package): its start and end.
func localWindow(now time.Time, loc *time.Location, hour, min int) (time.Time, time.Time) {
	l := now.In(loc)
	start := time.Date(l.Year(), l.Month(), l.Day(), hour, min, 0, 0, loc)
	if start.After(now) {
		start = time.Date(l.Year(), l.Month(), l.Day()-1, hour, min, 0, 0, loc)
	}
	sl := start.In(loc)
	return start, time.Date(sl.Year(), sl.Month(), sl.Day()+1, hour, min, 0, 0, loc)
}

// A calendar route's headers: w is the length of today's window in its zone, t and
// X-RateLimit-Reset its end, on a served request and on one refused with its window still
// empty (which the library replies no reset for).
func TestHTTPCalendar(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, zone := range []struct {
			name      string
			hour, min int
		}{
			{"America/New_York", 0, 0},    // midnight, 23 or 25 hours on the days clocks change
			{"Asia/Kolkata", 6, 30},       // a half-hour offset, a window from 06:30
			{"Australia/Lord_Howe", 2, 0}, // half-hour daylight saving
		} {
			t.Run(zone.name, func(t *testing.T) {
				loc, err := time.LoadLocation(zone.name)
				if err != nil {
					t.Fatal(err)
				}
				anchor := time.Date(2026, 1, 1, zone.hour, zone.min, 0, 0, loc)
				routes := map[string]httplimit.Policy{
					"/day": {Name: "day", Limit: client.Calendar{Limit: 50, Period: client.Day, Anchor: anchor}},
					// every unit kept for critical callers: a request of this route is refused
					// with no wait that helps, and its window stays empty
					"/reserved": {Name: "reserved", Limit: client.Calendar{Limit: 1, Reserve: 1, Period: client.Day, Anchor: anchor}},
				}
				srv := limitedServer(t, harness.NewLimiter(t, tg.c, slowMachine), httplimit.Options{
					Policy:   func(r *http.Request) httplimit.Policy { return routes[r.URL.Path] },
					Policies: []httplimit.Policy{routes["/day"], routes["/reserved"]},
				}, nil)
				key := principal(t)

				for _, tc := range []struct {
					path      string
					status    int
					q, remain int64
				}{
					{"/day", http.StatusOK, 50, 49},
					{"/reserved", http.StatusTooManyRequests, 1, 0},
				} {
					before := time.Now()
					r := get(t, srv.URL+tc.path, key)
					after := time.Now()
					start, end := localWindow(before, loc, zone.hour, zone.min)
					if _, end2 := localWindow(after, loc, zone.hour, zone.min); !end2.Equal(end) {
						t.Skipf("the window ended during the request (%s)", end)
					}
					if r.status != tc.status {
						t.Fatalf("%s: %d %q, want %d", tc.path, r.status, r.body, tc.status)
					}
					name := tc.path[1:]
					w := int64(end.Sub(start) / time.Second)
					if got, want := r.header.Get("RateLimit-Policy"), `"`+name+`";q=`+strconv.FormatInt(tc.q, 10)+`;w=`+strconv.FormatInt(w, 10); got != want {
						t.Errorf("%s: RateLimit-Policy %q, want %q (the window %s to %s)", tc.path, got, want, start, end)
					}
					if got := headerInt(t, r, "X-RateLimit-Remaining"); got != tc.remain {
						t.Errorf("%s: X-RateLimit-Remaining %d, want %d", tc.path, got, tc.remain)
					}
					// t is the time to the window's end, rounded up, read between before and after
					tv := rateLimitT(t, r)
					lo := int64(math.Ceil(end.Sub(after).Seconds()))
					hi := int64(math.Ceil(end.Sub(before).Seconds()))
					if tv < lo || tv > hi {
						t.Errorf("%s: RateLimit t=%d, want %d to %d: the seconds to %s", tc.path, tv, lo, hi, end)
					}
					// the reset is the window's end, a whole second in these zones
					if reset := headerInt(t, r, "X-RateLimit-Reset"); reset != end.Unix() {
						t.Errorf("%s: X-RateLimit-Reset %d, want %d, the window's end (%s)", tc.path, reset, end.Unix(), end)
					}
					if r.header.Get("Retry-After") != "" {
						t.Errorf("%s: Retry-After %q, want none", tc.path, r.header.Get("Retry-After"))
					}
				}
			})
		}
	})
}

// Check at start-up names the policies that need 1.2.0 (a Calendar, a Penalty) on a node that
// runs 1.1.0, and passes on one that runs 1.2.0; a policy of 1.1.0 alone passes on both.
func TestHTTPCheck12(t *testing.T) {
	s := harness.StartValkey(t)
	vk := s.Client(t)
	cal := httplimit.Policy{Name: "monthly", Limit: client.Calendar{Limit: 10_000, Period: client.Month}}
	pen := httplimit.Policy{Name: "login", Limit: client.SlidingLog{Limit: 5, Window: time.Minute, Penalty: 15 * time.Minute}}
	old := httplimit.Policy{Name: "api", Limit: client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second, Reserve: 1}}
	for _, tc := range []struct {
		version string
		want    []string // the policies a *ReleaseError for 1.2.0 names
	}{
		{"1.1.0", []string{"monthly", "login"}},
		{"working copy", nil},
	} {
		t.Run(tc.version, func(t *testing.T) {
			if tc.version == "working copy" {
				if err := load(ctx5s(t), vk); err != nil {
					t.Fatal(err)
				}
			} else {
				rel, ok := versions.Embedded().Find(tc.version)
				if !ok {
					t.Fatalf("no release %s", tc.version)
				}
				if err := vk.Do(ctx5s(t), vk.B().FunctionLoad().Replace().FunctionCode(rel.Code).Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			m, err := httplimit.New(harness.NewLimiter(t, vk, slowMachine), httplimit.Options{
				Key:      userKey,
				Policy:   func(*http.Request) httplimit.Policy { return old },
				Policies: []httplimit.Policy{old, cal, pen},
			})
			if err != nil {
				t.Fatal(err)
			}
			err = m.Check(ctx5s(t))
			if tc.want == nil {
				if err != nil {
					t.Errorf("Check: %v, want nil", err)
				}
				return
			}
			var re *httplimit.ReleaseError
			var ve *client.VersionError
			if !errors.As(err, &re) || re.Release != "1.2.0" || strings.Join(re.Policies, ",") != strings.Join(tc.want, ",") ||
				!errors.As(err, &ve) || ve.Version != tc.version {
				t.Errorf("Check: %v; want policies %q needing 1.2.0 on a node running %s", err, tc.want, tc.version)
			}
		})
	}
}
