package httplimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/rlfn/rlfn/client"
)

// A request admitted past its policy's NearLimit says so in RateLimit-Near and is counted; one
// below it, or refused, is not; a hidden quota is counted without the header.
func TestNearLimit(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	f := &fake{}
	hide := false
	m, err := New(f, Options{
		Key: constKey("k"),
		Policy: func(*http.Request) Policy {
			return Policy{Name: "api", Limit: tokenBucket, NearLimit: 0.8, HideQuota: hide}
		},
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		Now:           now,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		res  client.Result
		hide bool
		want string
	}{
		{client.Result{Allowed: true, Limit: 100, Remaining: 21}, false, ""},
		{client.Result{Allowed: true, Limit: 100, Remaining: 20}, false, `"api"`},
		{client.Result{Allowed: true, Limit: 100, Remaining: 0}, false, `"api"`},
		{client.Result{Limit: 100, RetryAfter: 1}, false, ""},
		{client.Result{Allowed: true, Limit: 100, Remaining: 5}, true, ""},
	} {
		f.res, hide = tt.res, tt.hide
		rec := httptest.NewRecorder()
		m.Handler(served).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if got := rec.Header().Get("RateLimit-Near"); got != tt.want {
			t.Errorf("%+v hide %v: RateLimit-Near %q, want %q", tt.res, tt.hide, got, tt.want)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name == MetricNearLimit {
				for _, p := range mt.Data.(metricdata.Sum[int64]).DataPoints {
					if v, _ := p.Attributes.Value("rlfn.policy"); v.AsString() != "api" {
						t.Errorf("rlfn.policy %q", v.AsString())
					}
					n += p.Value
				}
			}
		}
	}
	if n != 3 {
		t.Errorf("%d near-limit requests counted, want 3", n)
	}
	if _, err := New(f, Options{Key: constKey("k"), Policy: func(*http.Request) Policy { return Policy{} },
		Policies: []Policy{{Name: "api", Limit: tokenBucket, NearLimit: 1.5}}}); err == nil {
		t.Error("NearLimit 1.5 accepted")
	}
}
