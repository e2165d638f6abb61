package integration_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/httplimit"
	"github.com/rlfn/rlfn/internal/override"
)

// httplimit's headers describe the limit enforced: an operator's override of the route's
// policy for one principal (the key httplimit passes the client, LimiterKey(name, principal))
// gives that principal the override's q and w, and its own reply's remaining; another
// principal keeps the code's limit, and so do both once the override is removed.
func TestHTTPOverrideHeaders(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		e := newOvrEnv(t, tg, client.Options{})
		code := client.FixedWindow{Limit: 2, Window: time.Minute, Name: "api"}
		srv := limitedServer(t, e.lim, httplimit.Options{
			Policy: func(*http.Request) httplimit.Policy { return httplimit.Policy{Name: "api", Limit: code} },
		}, nil)
		vip, other := principal(t)+"-vip", principal(t)+"-other"
		e.set(t, override.Override{
			Policy: override.Policy{Algorithm: "fixed_window", Name: "api"}, Key: httplimit.LimiterKey("api", vip),
			Limit: override.Fields{Limit: 50, Window: override.Duration(time.Hour)},
		})
		want := func(r response, status int, policy, remaining string) {
			t.Helper()
			if r.status != status || r.header.Get("RateLimit-Policy") != policy || r.header.Get("X-RateLimit-Remaining") != remaining {
				t.Errorf("%d, RateLimit-Policy %q, X-RateLimit-Remaining %q; want %d, %q, %s",
					r.status, r.header.Get("RateLimit-Policy"), r.header.Get("X-RateLimit-Remaining"), status, policy, remaining)
			}
		}
		for i, left := range []string{"49", "48", "47"} {
			r := get(t, srv.URL, vip)
			want(r, http.StatusOK, `"api";q=50;w=3600`, left)
			if i == 0 && r.header.Get("X-RateLimit-Limit") != "50" {
				t.Errorf("X-RateLimit-Limit %q, want the override's 50", r.header.Get("X-RateLimit-Limit"))
			}
		}
		want(get(t, srv.URL, other), http.StatusOK, `"api";q=2;w=60`, "1")
		want(get(t, srv.URL, other), http.StatusOK, `"api";q=2;w=60`, "0")
		want(get(t, srv.URL, other), http.StatusTooManyRequests, `"api";q=2;w=60`, "0")

		// removed: the code's limit again (its window of a minute is not the override's hour, so
		// it counts afresh: see docs/overrides.md)
		e.remove(t, override.ID{Policy: override.Policy{Algorithm: "fixed_window", Name: "api"}, Key: httplimit.LimiterKey("api", vip)})
		want(get(t, srv.URL, vip), http.StatusOK, `"api";q=2;w=60`, "1")
	})
}
