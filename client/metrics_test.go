package client_test

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go/mock"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/mock/gomock"

	"github.com/rlfn/rlfn/client"
)

// points flattens what reader holds into "instrument{attr=value,...} value" lines, sorted; a
// histogram's value is its count.
func points(t *testing.T, reader *sdkmetric.ManualReader) []string {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	attrs := func(s attribute.Set) string {
		var kv []string
		for _, a := range s.ToSlice() {
			kv = append(kv, string(a.Key)+"="+a.Value.Emit())
		}
		return "{" + strings.Join(kv, ",") + "}"
	}
	var out []string
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != "github.com/rlfn/rlfn/client" {
			t.Errorf("scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out = append(out, m.Name+attrs(p.Attributes)+" "+strconv.FormatInt(p.Value, 10))
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if p.Sum <= 0 || m.Unit != "s" {
						t.Errorf("%s: sum %v unit %q", m.Name, p.Sum, m.Unit)
					}
					out = append(out, m.Name+attrs(p.Attributes)+" "+strconv.FormatUint(p.Count, 10))
				}
			default:
				t.Errorf("%s: unexpected %T", m.Name, d)
			}
		}
	}
	sort.Strings(out)
	return out
}

// Decisions, errors, latency and the breaker's transitions are recorded with their attributes.
func TestMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	clock := newFakeClock()
	vk := mock.NewClient(gomock.NewController(t))
	lim := newLimiter(t, vk, client.WithClock(client.Options{
		MeterProvider:   mp,
		Fallback:        client.LocalFallback,
		BreakerFailures: 2,
		BreakerCooldown: time.Second,
	}, clock.now))
	ctx := context.Background()
	bucket := client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Hour}
	window := client.FixedWindow{Limit: 1, Window: time.Hour}

	gomock.InOrder(
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(mock.Result(ints(1, 1, 0, 0, 1000, 0))),
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(mock.Result(ints(0, 1, 0, 10, 1000, 0))),
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(rlerr),
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(missing),
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(refused),
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(refused), // opens the breaker
	)
	lim.Allow(ctx, "k", bucket) // server allowed
	lim.Peek(ctx, "k", bucket)  // server denied
	lim.Allow(ctx, "k", bucket) // RLERR: returned
	lim.Allow(ctx, "k", bucket) // not loaded: local allowed
	lim.Allow(ctx, "k", bucket) // unreachable: local denied (capacity 1 taken)
	lim.Allow(ctx, "k", bucket) // again: local denied, and the breaker opens
	lim.Allow(ctx, "w", window) // open: local allowed
	clock.advance(time.Second)
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(mock.Result(ints(1, 1, 0, 0, 1000, 0)))
	lim.Allow(ctx, "w", window) // the probe: server allowed, closed

	want := []string{
		"rlfn.client.breaker.transitions{rlfn.breaker.state=closed} 1",
		"rlfn.client.breaker.transitions{rlfn.breaker.state=half_open} 1",
		"rlfn.client.breaker.transitions{rlfn.breaker.state=open} 1",
		"rlfn.client.call.duration{rlfn.algorithm=fixed_window,rlfn.operation=allow,rlfn.outcome=allowed} 1",
		"rlfn.client.call.duration{rlfn.algorithm=token_bucket,rlfn.operation=allow,rlfn.outcome=allowed} 1",
		"rlfn.client.call.duration{rlfn.algorithm=token_bucket,rlfn.operation=allow,rlfn.outcome=error} 4",
		"rlfn.client.call.duration{rlfn.algorithm=token_bucket,rlfn.operation=peek,rlfn.outcome=denied} 1",
		"rlfn.client.decisions{rlfn.algorithm=fixed_window,rlfn.operation=allow,rlfn.outcome=allowed,rlfn.source=local_fallback} 1",
		"rlfn.client.decisions{rlfn.algorithm=fixed_window,rlfn.operation=allow,rlfn.outcome=allowed,rlfn.source=server} 1",
		"rlfn.client.decisions{rlfn.algorithm=token_bucket,rlfn.operation=allow,rlfn.outcome=allowed,rlfn.source=local_fallback} 1",
		"rlfn.client.decisions{rlfn.algorithm=token_bucket,rlfn.operation=allow,rlfn.outcome=allowed,rlfn.source=server} 1",
		"rlfn.client.decisions{rlfn.algorithm=token_bucket,rlfn.operation=allow,rlfn.outcome=denied,rlfn.source=local_fallback} 2",
		"rlfn.client.decisions{rlfn.algorithm=token_bucket,rlfn.operation=peek,rlfn.outcome=denied,rlfn.source=server} 1",
		"rlfn.client.errors{error.type=circuit_open,rlfn.algorithm=fixed_window,rlfn.operation=allow} 1",
		"rlfn.client.errors{error.type=library_error,rlfn.algorithm=token_bucket,rlfn.operation=allow} 1",
		"rlfn.client.errors{error.type=not_loaded,rlfn.algorithm=token_bucket,rlfn.operation=allow} 1",
		"rlfn.client.errors{error.type=unreachable,rlfn.algorithm=token_bucket,rlfn.operation=allow} 2",
	}
	got := points(t, reader)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Recording allocates nothing: every attribute set is built in New. (Allocation counts, not
// times, so this holds on any machine.)
func TestMetricsAllocateNothing(t *testing.T) {
	ctx := context.Background()
	limit := client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second}
	allocs := func(o client.Options) float64 {
		lim := newLimiter(t, replyClient{mock.NewClient(nil), mock.Result(ints(1, 100, 99, 0, 1000, 0))}, o)
		return testing.AllocsPerRun(1000, func() { lim.Allow(ctx, "k", limit) })
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	if without, with := allocs(client.Options{}), allocs(client.Options{MeterProvider: mp}); with != without {
		t.Errorf("%v allocations per call with metrics, %v without", with, without)
	}
}

// A local decision on a key the fallback holds allocates nothing.
func TestLocalDecisionAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	lim := newLimiter(t, replyClient{mock.NewClient(nil), refused}, client.Options{
		Fallback:        client.LocalFallback,
		BreakerFailures: 1,
		BreakerCooldown: time.Hour,
	})
	for _, limit := range benchLimits {
		lim.Allow(ctx, "k", limit)
		if n := testing.AllocsPerRun(1000, func() { lim.Allow(ctx, "k", limit) }); n != 0 {
			t.Errorf("%T: %v allocations per local decision", limit, n)
		}
	}
}
