package client_test

import (
	"context"
	"fmt"
	"slices"
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
	"github.com/rlfn/rlfn/internal/decide"
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
					if p.Sum <= 0 || m.Unit != "s" && m.Unit != "1" {
						t.Errorf("%s: sum %v unit %q", m.Name, p.Sum, m.Unit)
					}
					v := strconv.FormatUint(p.Count, 10)
					if m.Unit == "1" {
						// a share: its sum says what was recorded
						v += " sum=" + strconv.FormatFloat(p.Sum, 'g', 4, 64)
					}
					out = append(out, m.Name+attrs(p.Attributes)+" "+v)
				}
			default:
				t.Errorf("%s: unexpected %T", m.Name, d)
			}
		}
	}
	sort.Strings(out)
	return out
}

// Decisions, errors, latency, utilization and the breaker's transitions are recorded with their
// attributes; a decision's limit is named by WithLimitName, else by its Name.
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
	bucket := client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Hour, Name: "api"}
	window := client.FixedWindow{Limit: 1, Window: time.Hour}
	login := client.WithLimitName(ctx, "login")

	gomock.InOrder(
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(mock.Result(ints(1, 1, 0, 0, 1000, 0))),
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(mock.Result(ints(0, 1, 0, 10, 1000, 0))),
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(rlerr),
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(missing),
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(refused),
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(refused), // opens the breaker
	)
	lim.Allow(ctx, "k", bucket)   // server allowed
	lim.Peek(ctx, "k", bucket)    // server denied
	lim.Allow(ctx, "k", bucket)   // RLERR: returned
	lim.Allow(ctx, "k", bucket)   // not loaded: local allowed
	lim.Allow(ctx, "k", bucket)   // unreachable: local denied (capacity 1 taken)
	lim.Allow(ctx, "k", bucket)   // again: local denied, and the breaker opens
	lim.Allow(login, "w", window) // open: local allowed
	clock.advance(time.Second)
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(mock.Result(ints(1, 1, 0, 0, 1000, 0)))
	lim.Allow(login, "w", window) // the probe: server allowed, closed

	want := []string{
		"rlfn.client.breaker.transitions{rlfn.breaker.state=closed} 1",
		"rlfn.client.breaker.transitions{rlfn.breaker.state=half_open} 1",
		"rlfn.client.breaker.transitions{rlfn.breaker.state=open} 1",
		"rlfn.client.call.duration{rlfn.algorithm=fixed_window,rlfn.operation=allow,rlfn.outcome=allowed} 1",
		"rlfn.client.call.duration{rlfn.algorithm=token_bucket,rlfn.operation=allow,rlfn.outcome=allowed} 1",
		"rlfn.client.call.duration{rlfn.algorithm=token_bucket,rlfn.operation=allow,rlfn.outcome=error} 4",
		"rlfn.client.call.duration{rlfn.algorithm=token_bucket,rlfn.operation=peek,rlfn.outcome=denied} 1",
		"rlfn.client.decisions{rlfn.algorithm=fixed_window,rlfn.limit.name=login,rlfn.limit.period=1h0m0s,rlfn.limit.quota=1,rlfn.operation=allow,rlfn.outcome=allowed,rlfn.source=local_fallback} 1",
		"rlfn.client.decisions{rlfn.algorithm=fixed_window,rlfn.limit.name=login,rlfn.limit.period=1h0m0s,rlfn.limit.quota=1,rlfn.operation=allow,rlfn.outcome=allowed,rlfn.source=server} 1",
		"rlfn.client.decisions{rlfn.algorithm=token_bucket,rlfn.limit.name=api,rlfn.limit.period=1h0m0s,rlfn.limit.quota=1,rlfn.operation=allow,rlfn.outcome=allowed,rlfn.source=local_fallback} 1",
		"rlfn.client.decisions{rlfn.algorithm=token_bucket,rlfn.limit.name=api,rlfn.limit.period=1h0m0s,rlfn.limit.quota=1,rlfn.operation=allow,rlfn.outcome=allowed,rlfn.source=server} 1",
		"rlfn.client.decisions{rlfn.algorithm=token_bucket,rlfn.limit.name=api,rlfn.limit.period=1h0m0s,rlfn.limit.quota=1,rlfn.operation=allow,rlfn.outcome=denied,rlfn.source=local_fallback} 2",
		"rlfn.client.decisions{rlfn.algorithm=token_bucket,rlfn.limit.name=api,rlfn.limit.period=1h0m0s,rlfn.limit.quota=1,rlfn.operation=peek,rlfn.outcome=denied,rlfn.source=server} 1",
		"rlfn.client.errors{error.type=circuit_open,rlfn.algorithm=fixed_window,rlfn.operation=allow} 1",
		"rlfn.client.errors{error.type=library_error,rlfn.algorithm=token_bucket,rlfn.operation=allow} 1",
		"rlfn.client.errors{error.type=not_loaded,rlfn.algorithm=token_bucket,rlfn.operation=allow} 1",
		"rlfn.client.errors{error.type=unreachable,rlfn.algorithm=token_bucket,rlfn.operation=allow} 2",
		// allowed with 0 of 1 left, allowed with 0 left, denied thrice: 1 each (peeks are not
		// recorded)
		"rlfn.client.limit.utilization{rlfn.algorithm=fixed_window,rlfn.limit.name=login,rlfn.limit.period=1h0m0s,rlfn.limit.quota=1} 2 sum=2",
		"rlfn.client.limit.utilization{rlfn.algorithm=token_bucket,rlfn.limit.name=api,rlfn.limit.period=1h0m0s,rlfn.limit.quota=1} 4 sum=4",
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

// A decision named as the middlewares name theirs (by their policy, without a context of its
// own) costs no allocation more than an unnamed one, and is counted under its name.
func TestNamedDecisionAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	limit := client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second}
	reader := sdkmetric.NewManualReader()
	lim := newLimiter(t, replyClient{mock.NewClient(nil), mock.Result(ints(1, 100, 99, 0, 1000, 0))},
		client.Options{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	unnamed := testing.AllocsPerRun(1000, func() { lim.Allow(ctx, "k", limit) })
	named := testing.AllocsPerRun(1000, func() { decide.Allow(ctx, lim, "api", "k", limit) })
	if named != unnamed {
		t.Errorf("%v allocations per named decision, %v unnamed", named, unnamed)
	}
	want := "rlfn.client.decisions{rlfn.algorithm=token_bucket,rlfn.limit.name=api,rlfn.limit.period=1s,rlfn.limit.quota=100,rlfn.operation=allow,rlfn.outcome=allowed,rlfn.source=server} 1001"
	if got := points(t, reader); !slices.Contains(got, want) {
		t.Errorf("got\n%s\nwant among them\n%s", strings.Join(got, "\n"), want)
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

// series counts the distinct series reader holds, of every instrument.
func series(t *testing.T, reader *sdkmetric.ManualReader) int {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				n += len(d.DataPoints)
			case metricdata.Histogram[float64]:
				n += len(d.DataPoints)
			}
		}
	}
	return n
}

// Keys are never attributes, and names are bounded by Options.MetricLimits: 100,000 hostile keys,
// names and limits (a policy function that makes its name up per request, an override per key)
// leave the series count as the declared limits and the overflow left it.
func TestMetricsBoundedWhateverTheTraffic(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	lim := newLimiter(t, replyClient{mock.NewClient(nil), mock.Result(ints(1, 100, 99, 0, 1000, 0))}, client.Options{
		MeterProvider: mp,
		MetricLimits:  3,
	})
	ctx := context.Background()
	declared := []string{"login", "api", "search"}
	for _, name := range declared {
		if _, err := lim.Allow(client.WithLimitName(ctx, name), "k", client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	// the first limit beyond the three opens the overflow series
	lim.Allow(ctx, "k", client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second, Name: "fourth"})
	before := series(t, reader)
	for i := range 100_000 {
		hostile := "user:" + strconv.Itoa(i) + "{%}\x00"
		ctx := client.WithLimitName(ctx, hostile)
		limit := client.TokenBucket{Capacity: int64(100 + i), Rate: 10, Period: time.Second, Name: hostile}
		if _, err := lim.Allow(ctx, hostile, limit); err != nil {
			t.Fatal(err)
		}
		if _, err := lim.Allow(client.WithLimitName(ctx, declared[i%3]), hostile, client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	if after := series(t, reader); after != before {
		t.Errorf("%d series after 100000 hostile keys and names, %d before", after, before)
	}
	got := strings.Join(points(t, reader), "\n")
	for _, want := range []string{
		"rlfn.client.decisions{rlfn.algorithm=token_bucket,rlfn.limit.name=_overflow,rlfn.operation=allow,rlfn.outcome=allowed,rlfn.source=server} 100001",
		"rlfn.client.decisions{rlfn.algorithm=token_bucket,rlfn.limit.name=login,rlfn.limit.period=1s,rlfn.limit.quota=100,rlfn.operation=allow,rlfn.outcome=allowed,rlfn.source=server} 33335",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no %s in\n%s", want, got)
		}
	}
	if strings.Contains(got, "user:") {
		t.Errorf("a key or a made-up name is an attribute:\n%s", got)
	}
}

// Utilization is the share of the limit used once admitted, 1 when denied, in buckets that
// make "above 80%, 90%, at the limit" one bucket each.
func TestMetricsUtilization(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	vk := mock.NewClient(gomock.NewController(t))
	lim := newLimiter(t, vk, client.Options{MeterProvider: mp})
	ctx := client.WithLimitName(context.Background(), "api")
	limit := client.FixedWindow{Limit: 10, Window: time.Minute}
	gomock.InOrder(
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(mock.Result(ints(1, 10, 9, 0, 1000, 0))),  // 0.1
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(mock.Result(ints(1, 10, 1, 0, 1000, 0))),  // 0.9
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(mock.Result(ints(0, 10, 0, 10, 1000, 0))), // 1
	)
	for range 3 {
		lim.Allow(ctx, "k", limit)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "rlfn.client.limit.utilization" {
				continue
			}
			p := m.Data.(metricdata.Histogram[float64]).DataPoints[0]
			// bounds 0.25 0.5 0.75 0.8 0.9 0.95 0.99 1
			want := []uint64{1, 0, 0, 0, 1, 0, 0, 1, 0}
			if fmt.Sprint(p.Bounds) != "[0.25 0.5 0.75 0.8 0.9 0.95 0.99 1]" || fmt.Sprint(p.BucketCounts) != fmt.Sprint(want) {
				t.Errorf("bounds %v counts %v, want %v", p.Bounds, p.BucketCounts, want)
			}
			return
		}
	}
	t.Error("no utilization recorded")
}

// Names and utilization allocate nothing: a named limit's attribute sets are made on its first
// decision.
func TestNamedMetricsAllocateNothing(t *testing.T) {
	ctx := client.WithLimitName(context.Background(), "api")
	limit := client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second, Name: "n"}
	allocs := func(o client.Options) float64 {
		lim := newLimiter(t, replyClient{mock.NewClient(nil), mock.Result(ints(1, 100, 99, 0, 1000, 0))}, o)
		lim.Allow(ctx, "k", limit)
		return testing.AllocsPerRun(1000, func() { lim.Allow(ctx, "k", limit) })
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	if without, with := allocs(client.Options{}), allocs(client.Options{MeterProvider: mp}); with != without {
		t.Errorf("%v allocations per named call with metrics, %v without", with, without)
	}
}
