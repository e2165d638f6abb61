package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/httplimit"
)

// Each limit of a policy is counted under its own name, quota and period: the policy's own
// limit by the policy's Name, a further limit by its AlsoLimit.Name, and a decision of one
// principal's limits in one rl_multi by the limit that decided it, as a direct AllowAll's rule
// by its Rule.Name.
func TestMetricsNameEachLimit(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		reader := sdkmetric.NewManualReader()
		lim, err := client.New(tg.c, client.Options{Fallback: client.ReturnError, Deadline: 5 * time.Second,
			MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
		if err != nil {
			t.Fatal(err)
		}
		prefix := keyFor(t)
		policies := map[string]httplimit.Policy{
			// one principal's two limits: one rl_multi, the bucket the fewest left
			"/multi": {Name: "api", Limit: client.FixedWindow{Limit: 10, Window: time.Hour},
				Also: []httplimit.AlsoLimit{{Name: "burst", SameKey: true, Limit: client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Hour}}}},
			// its further limit on a key of its own: two calls, each named
			"/keys": {Name: "route", Limit: client.FixedWindow{Limit: 10, Window: time.Minute},
				Also: []httplimit.AlsoLimit{{Name: "daily", Limit: client.SlidingWindow{Limit: 100, Window: 24 * time.Hour}}}},
			"/solo":  {Name: "solo", Limit: client.TokenBucket{Capacity: 5, Rate: 5, Period: time.Second}},
			"/lease": {Name: "slots", Concurrency: &client.Concurrency{Limit: 3, Lease: time.Minute}},
		}
		m, err := httplimit.New(lim, httplimit.Options{
			Key:    func(*http.Request) (string, error) { return prefix, nil },
			Policy: func(r *http.Request) httplimit.Policy { return policies[r.URL.Path] },
		})
		if err != nil {
			t.Fatal(err)
		}
		h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		for _, path := range []string{"/multi", "/multi", "/keys", "/solo", "/lease"} {
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", path, nil))
		}
		if _, err := lim.AllowAll(context.Background(), []client.Rule{
			{Key: prefix + ":a", Limit: client.FixedWindow{Limit: 7, Window: time.Second}, Name: "rule-a"},
			{Key: prefix + ":a", Limit: client.SlidingLog{Limit: 3, Window: time.Second}, Name: "rule-b"},
		}); err != nil {
			t.Fatal(err)
		}

		got := counters(t, reader)
		for _, want := range []string{
			"{rlfn.algorithm=multi}{rlfn.limit.name=burst}{rlfn.limit.period=1h0m0s}{rlfn.limit.quota=1}{rlfn.operation=allow}{rlfn.outcome=allowed}",
			"{rlfn.algorithm=multi}{rlfn.limit.name=burst}{rlfn.limit.period=1h0m0s}{rlfn.limit.quota=1}{rlfn.operation=allow}{rlfn.outcome=denied}",
			"{rlfn.algorithm=fixed_window}{rlfn.limit.name=route}{rlfn.limit.period=1m0s}{rlfn.limit.quota=10}{rlfn.operation=allow}{rlfn.outcome=allowed}",
			"{rlfn.algorithm=sliding_window}{rlfn.limit.name=daily}{rlfn.limit.period=24h0m0s}{rlfn.limit.quota=100}{rlfn.operation=allow}{rlfn.outcome=allowed}",
			"{rlfn.algorithm=token_bucket}{rlfn.limit.name=solo}{rlfn.limit.period=1s}{rlfn.limit.quota=5}{rlfn.operation=allow}{rlfn.outcome=allowed}",
			"{rlfn.algorithm=concurrency}{rlfn.limit.name=slots}{rlfn.limit.period=1m0s}{rlfn.limit.quota=3}{rlfn.operation=acquire}{rlfn.outcome=allowed}",
			"{rlfn.algorithm=concurrency}{rlfn.limit.name=slots}{rlfn.limit.period=1m0s}{rlfn.limit.quota=3}{rlfn.operation=release}{rlfn.outcome=allowed}",
			"{rlfn.algorithm=multi}{rlfn.limit.name=rule-b}{rlfn.limit.period=1s}{rlfn.limit.quota=3}{rlfn.operation=allow}{rlfn.outcome=allowed}",
		} {
			if got["rlfn.client.decisions"+want+"{rlfn.source=server}"] != 1 {
				var have []string
				for k, v := range got {
					if strings.HasPrefix(k, "rlfn.client.decisions") {
						have = append(have, fmt.Sprint(k, " ", v))
					}
				}
				t.Errorf("no decision %s; the decisions:\n%s", want, strings.Join(have, "\n"))
			}
		}
	})
}
