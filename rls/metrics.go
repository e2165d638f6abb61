package rls

import (
	"context"
	"fmt"
	"math"
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
	nearLimit   metric.Int64Counter
	nearRatio   float64 // SetNearLimitRatio's
}

// DefaultNearLimitRatio is the share of a limit past which hits count as near it, as the
// reference's NEAR_LIMIT_RATIO default.
const DefaultNearLimitRatio = 0.8

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
//   - rlfn.rls.in_flight ({request}): requests being decided;
//   - rlfn.rls.near_limit ({hit}): hits admitted past the near-limit ratio of their limit
//     (DefaultNearLimitRatio, SetNearLimitRatio) and within it, by domain and descriptor, as
//     the reference's near_limit: a limit whose traffic is about to be refused.
func NewMetrics(mp metric.MeterProvider) (*Metrics, error) {
	m := mp.Meter("github.com/rlfn/rlfn/rls")
	var err error
	x := Metrics{nearRatio: DefaultNearLimitRatio}
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
	if x.nearLimit, err = m.Int64Counter("rlfn.rls.near_limit", metric.WithUnit("{hit}"), metric.WithDescription("hits admitted past the near-limit ratio of their limit")); err != nil {
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
		if outcome == "ok" && x.status != nil && x.status.CurrentLimit != nil {
			if n := nearHits(int64(x.status.CurrentLimit.RequestsPerUnit), int64(x.status.LimitRemaining), x.hits, m.nearRatio); n > 0 {
				m.nearLimit.Add(ctx, n, metric.WithAttributes(attribute.String("domain", domain), attribute.String("descriptor", name)))
			}
		}
	}
}

// SetNearLimitRatio sets the share of a limit past which admitted hits are counted in
// rlfn.rls.near_limit, from 0 (exclusive) to 1: the reference's NEAR_LIMIT_RATIO.
func (m *Metrics) SetNearLimitRatio(ratio float64) error {
	if !(ratio > 0 && ratio <= 1) {
		return fmt.Errorf("rls: near-limit ratio must be above 0 and at most 1, got %v", ratio)
	}
	if m != nil {
		m.nearRatio = ratio
	}
	return nil
}

// nearHits is how many of hits, admitted by a limit of limit units that has remaining left
// after them, lie past the near-limit threshold (floor(limit * ratio)): the units used after
// the hits beyond the threshold, or beyond the units used before them if those were past it
// already.
func nearHits(limit, remaining, hits int64, ratio float64) int64 {
	if limit <= 0 || hits <= 0 {
		return 0
	}
	threshold := int64(math.Floor(float64(limit) * ratio))
	after := limit - remaining
	before := after - hits
	if after <= threshold {
		return 0
	}
	return after - max(threshold, before)
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
