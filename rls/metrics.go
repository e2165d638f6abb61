package rls

import (
	"context"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/rlfn/rlfn/internal/envoyconf"
)

// Metrics records what the service does through the OpenTelemetry metric API. Its labels
// are bounded by the configuration, never by requests: a domain the configuration does not
// have is "unknown", a descriptor is labelled by its path in the configuration
// (domain.key_value.key, wildcards as written), never by a request's values, whatever
// detailed_metric says (the reference's per-value series grew without bound), and a
// request's own limit override is "override". A nil *Metrics records nothing.
type Metrics struct {
	requests    metric.Int64Counter
	duration    metric.Float64Histogram
	descriptors metric.Int64Counter
	loads       metric.Int64Counter
	overloaded  metric.Int64Counter
	inFlight    metric.Int64UpDownCounter
}

// NewMetrics makes the instruments from mp:
//
//   - rlfn.rls.requests ({request}): ShouldRateLimit calls, by domain and code (ok,
//     over_limit, error);
//   - rlfn.rls.request.duration (s): their latency, by domain and code;
//   - rlfn.rls.descriptors ({descriptor}): decided descriptors, by domain, descriptor and
//     outcome (ok, over_limit, shadow_over_limit, unlimited, refund, no_limit);
//   - rlfn.rls.config.loads ({load}): configuration loads, by result (ok, error);
//   - rlfn.rls.overloaded ({request}): requests refused at once because MaxInFlight were
//     being decided;
//   - rlfn.rls.in_flight ({request}): requests being decided.
func NewMetrics(mp metric.MeterProvider) (*Metrics, error) {
	m := mp.Meter("github.com/rlfn/rlfn/rls")
	var err error
	var x Metrics
	if x.requests, err = m.Int64Counter("rlfn.rls.requests", metric.WithUnit("{request}"), metric.WithDescription("ShouldRateLimit calls")); err != nil {
		return nil, err
	}
	if x.duration, err = m.Float64Histogram("rlfn.rls.request.duration", metric.WithUnit("s"), metric.WithDescription("ShouldRateLimit latency"),
		metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)); err != nil {
		return nil, err
	}
	if x.descriptors, err = m.Int64Counter("rlfn.rls.descriptors", metric.WithUnit("{descriptor}"), metric.WithDescription("descriptors decided")); err != nil {
		return nil, err
	}
	if x.loads, err = m.Int64Counter("rlfn.rls.config.loads", metric.WithUnit("{load}"), metric.WithDescription("configuration loads")); err != nil {
		return nil, err
	}
	if x.overloaded, err = m.Int64Counter("rlfn.rls.overloaded", metric.WithUnit("{request}"), metric.WithDescription("requests refused for too many in flight")); err != nil {
		return nil, err
	}
	if x.inFlight, err = m.Int64UpDownCounter("rlfn.rls.in_flight", metric.WithUnit("{request}"), metric.WithDescription("requests being decided")); err != nil {
		return nil, err
	}
	return &x, nil
}

func (m *Metrics) request(ctx context.Context, cfg *envoyconf.Config, domain string, resp *pb.RateLimitResponse, ds []*descriptor, err error, d time.Duration) {
	if m == nil {
		return
	}
	if cfg == nil || !cfg.HasDomain(domain) {
		domain = "unknown"
	}
	code := "error"
	if err == nil {
		code = "ok"
		if resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
			code = "over_limit"
		}
	}
	set := attribute.NewSet(attribute.String("domain", domain), attribute.String("code", code))
	m.requests.Add(ctx, 1, metric.WithAttributeSet(set))
	m.duration.Record(ctx, d.Seconds(), metric.WithAttributeSet(set))
	for _, x := range ds {
		outcome, name := "no_limit", ""
		switch {
		case x.rl == nil:
		case x.rl.Unlimited:
			outcome, name = "unlimited", x.rl.FullKey
		case x.negative:
			outcome, name = "refund", x.rl.FullKey
		case x.shadowed:
			outcome, name = "shadow_over_limit", x.rl.FullKey
		case x.status.Code == pb.RateLimitResponse_OVER_LIMIT:
			outcome, name = "over_limit", x.rl.FullKey
		default:
			outcome, name = "ok", x.rl.FullKey
		}
		if x.rl != nil && x.rl.Override {
			name = "override"
		}
		m.descriptors.Add(ctx, 1, metric.WithAttributes(attribute.String("domain", domain), attribute.String("descriptor", name), attribute.String("outcome", outcome)))
	}
}

// ConfigLoaded counts a configuration load: err nil or not.
func (m *Metrics) ConfigLoaded(err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.loads.Add(context.Background(), 1, metric.WithAttributes(attribute.String("result", result)))
}

func (m *Metrics) flight(ctx context.Context, n int64) {
	if m != nil {
		m.inFlight.Add(ctx, n)
	}
}

func (m *Metrics) overload(ctx context.Context) {
	if m != nil {
		m.overloaded.Add(ctx, 1)
	}
}
