package rls_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/rls"
)

// collected is one collection of the service's metrics: each series' value by its name and
// attributes (name{k=v,...}).
type collected map[string]float64

func collect(t *testing.T, r *sdkmetric.ManualReader) collected {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := collected{}
	key := func(name string, set attribute.Set) string {
		var kv []string
		for _, a := range set.ToSlice() {
			kv = append(kv, string(a.Key)+"="+a.Value.Emit())
		}
		return name + "{" + strings.Join(kv, ",") + "}"
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, p.Attributes)] = float64(p.Value)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, p.Attributes)] = float64(p.Count)
				}
			}
		}
	}
	return out
}

// Metrics count by domain, code and the configuration's descriptors, never by a request's
// values; the in-flight gauge and the overload count see HTTP requests as gRPC ones.
func TestMetrics(t *testing.T) {
	b := backends(t)[0]
	reader := sdkmetric.NewManualReader()
	m, err := rls.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, b, config, client.Options{Deadline: 5 * time.Second}, rls.ServerOptions{MaxInFlight: 1}, rls.Options{Metrics: m})
	r.ask(t, request("edge", desc("key2", "secret-value"), desc("small", "secret-value")))
	r.ask(t, request("{hostile-domain}", desc("key2", "secret-value")))
	r.ask(t, request("edge", override(desc("key2", "secret-value"), 5, pb.RateLimitResponse_RateLimit_MINUTE)))
	got := collect(t, reader)
	for series := range got {
		if strings.Contains(series, "secret-value") || strings.Contains(series, "hostile") {
			t.Errorf("a request's value in a series: %s", series)
		}
	}
	for _, want := range []string{
		"rlfn.rls.requests{code=ok,domain=edge}",
		"rlfn.rls.requests{code=ok,domain=unknown}",
		"rlfn.rls.descriptors{descriptor=edge.key2,domain=edge,outcome=ok}",
		"rlfn.rls.descriptors{descriptor=edge.small,domain=edge,outcome=ok}",
		"rlfn.rls.descriptors{descriptor=,domain=unknown,outcome=no_limit}",
		"rlfn.rls.descriptors{descriptor=override,domain=edge,outcome=ok}",
	} {
		n := 1.0
		if want == "rlfn.rls.requests{code=ok,domain=edge}" {
			n = 2
		}
		if got[want] != n {
			t.Errorf("%s = %v; collected %v", want, got[want], got)
		}
	}

	// One HTTP request stalled on the server is in flight; another is refused and counted.
	if err := b.vk.Do(context.Background(), b.vk.B().ClientPause().Timeout(1500).Write().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	body := `{"domain": "edge", "descriptors": [{"entries": [{"key": "key2", "value": "http"}]}]}`
	first := make(chan int, 1)
	go func() {
		resp, err := http.Post(r.http+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	eventually(t, func() bool { return collect(t, reader)["rlfn.rls.in_flight{}"] == 1 })
	resp, err := http.Post(r.http+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("second request: %d, want 503", resp.StatusCode)
	}
	if code := <-first; code != http.StatusOK {
		t.Fatalf("the stalled request: %d", code)
	}
	got = collect(t, reader)
	if got["rlfn.rls.in_flight{}"] != 0 || got["rlfn.rls.overloaded{}"] != 1 {
		t.Fatalf("in flight %v, overloaded %v", got["rlfn.rls.in_flight{}"], got["rlfn.rls.overloaded{}"])
	}
}

// Hits admitted past the near-limit ratio of their limit are counted, as the reference's
// near_limit: a limit of 5 with the ratio 0.6 (threshold 3) counts the 4th and 5th hits, and
// nothing of the refused 6th.
func TestNearLimit(t *testing.T) {
	b := backends(t)[0]
	reader := sdkmetric.NewManualReader()
	m, err := rls.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []float64{0, -0.5, 1.5} {
		if m.SetNearLimitRatio(bad) == nil {
			t.Errorf("ratio %v accepted", bad)
		}
	}
	if err := m.SetNearLimitRatio(0.6); err != nil {
		t.Fatal(err)
	}
	// an hour's window: six requests never straddle two
	const hourly = "domain: edge\ndescriptors:\n  - key: big\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"
	r := newRig(t, b, hourly, client.Options{Deadline: 5 * time.Second}, rls.ServerOptions{}, rls.Options{Metrics: m})
	key := "near-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	for i := range 6 {
		r.ask(t, request("edge", desc("big", key)))
		want := max(0, min(i+1, 5)-3)
		if got := collect(t, reader)["rlfn.rls.near_limit{descriptor=edge.big,domain=edge}"]; got != float64(want) {
			t.Errorf("after %d hits: %v near the limit, want %d", i+1, got, want)
		}
	}
}
