package client

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Instrument names: the package documentation says what each counts, by which attributes.
const (
	metricDecisions          = "rlfn.client.decisions"
	metricLeasedBatches      = "rlfn.client.leased.batches"
	metricLeasedUnits        = "rlfn.client.leased.units"
	metricLeasedRefunded     = "rlfn.client.leased.refunded"
	metricErrors             = "rlfn.client.errors"
	metricDuration           = "rlfn.client.call.duration"
	metricBreakerTransitions = "rlfn.client.breaker.transitions"
	metricUtilization        = "rlfn.client.limit.utilization"
)

// errKind is what a call's error means for the breaker, the Fallback and the errors metric.
type errKind uint8

const (
	kindNone errKind = iota
	kindTimeout
	kindUnreachable
	kindCircuitOpen
	kindNotLoaded
	kindServer
	kindReply
	kindLibrary
	kindVersion
	kindCanceled
	kindClusterDown
	nKinds
)

var kindNames = [nKinds]string{"", "timeout", "unreachable", "circuit_open", "not_loaded",
	"server_error", "reply_error", "library_error", "version", "canceled", "cluster_down"}

// failure reports whether the server could not decide: the Fallback applies. A library error (the
// key holds other state) or a canceled call is the caller's. A library too old for the call is
// not: the node cannot decide that limit, and no limit at all would be the worst answer.
func (k errKind) failure() bool {
	return k != kindNone && k != kindLibrary && k != kindCanceled
}

// unanswered reports a call the server did not decide and will not until its cluster moves:
// the breaker counts it. A shard that is down (CLUSTERDOWN, in a cluster that requires full
// coverage every shard says it while one is) or whose slot is moving (TRYAGAIN) is treated as
// a dead one: its breaker opens and the slot table is read again. A server that answers with
// another error is reachable, and costs a round trip to ask, not a deadline.
func (k errKind) unanswered() bool {
	return k == kindTimeout || k == kindUnreachable || k == kindClusterDown
}

type operation uint8

const (
	opAllow operation = iota
	opPeek
	opRefund
	opAcquire // takes or renews a lease
	opRelease
	opHold   // takes units under a hold (Limiter.Hold, Hold.Add): rl_hold, or rl_multi with hold groups
	opSettle // ends a hold at the actual amount: rl_hold_settle
	nOps
)

var opNames = [nOps]string{"allow", "peek", "refund", "acquire", "release", "hold", "settle"}

// Decision sources: the server, the fallback that decided, a leased budget or the denial
// cache.
const (
	srcServer = iota
	srcFailOpen
	srcFailClosed
	srcLocal
	srcLeased
	srcCached
	nSources
)

// fallbackSrc is the source of a decision each Fallback makes (ReturnError makes none).
var fallbackSrc = [...]int{LocalFallback: srcLocal, FailClosed: srcFailClosed, FailOpen: srcFailOpen, ReturnError: srcServer}

var sourceNames = [nSources]string{"server", "fail_open", "fail_closed", "local_fallback", "leased", "denial_cache"}

// Outcomes of the duration histogram.
const (
	outAllowed = iota
	outDenied
	outError
)

var outcomeNames = [3]string{"allowed", "denied", "error"}

// metrics holds the instruments and every attribute set they are recorded with, built once so
// that recording allocates nothing.
type metrics struct {
	decisions   metric.Int64Counter
	errors      metric.Int64Counter
	duration    metric.Float64Histogram
	transitions metric.Int64Counter
	batches     metric.Int64Counter
	units       metric.Int64Counter
	refunded    metric.Int64Counter
	utilization metric.Float64Histogram

	limits         *limitSeries // the decisions' attribute sets, by limit (series.go)
	errorOpts      [nSubjects][nOps][nKinds][]metric.AddOption
	durationOpts   [nSubjects][nOps][3][]metric.RecordOption
	transitionOpts [3][]metric.AddOption // by breakerState
	algOpts        [nSubjects][]metric.AddOption
}

// newMetrics creates the instruments and their attribute sets. The API's instruments never
// fail to be created with valid names, so an error is a broken provider: New returns it.
func newMetrics(mp metric.MeterProvider, maxLimits int) (*metrics, error) {
	meter := mp.Meter("github.com/rlfn/rlfn/client")
	m := &metrics{limits: newLimitSeries(maxLimits)}
	var errs [8]error
	m.decisions, errs[0] = meter.Int64Counter(metricDecisions, metric.WithUnit("{decision}"),
		metric.WithDescription("Rate-limiting decisions, by the server or by a fallback."))
	m.errors, errs[1] = meter.Int64Counter(metricErrors, metric.WithUnit("{error}"),
		metric.WithDescription("Errors met by calls, whether returned or decided by a fallback."))
	m.duration, errs[2] = meter.Float64Histogram(metricDuration, metric.WithUnit("s"),
		metric.WithDescription("Latency of the calls sent to the server."),
		// A call takes tens of microseconds on a LAN and at most the deadline.
		metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
			0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1))
	m.transitions, errs[3] = meter.Int64Counter(metricBreakerTransitions, metric.WithUnit("{transition}"),
		metric.WithDescription("Changes of state of the circuit breaker."))
	m.batches, errs[4] = meter.Int64Counter(metricLeasedBatches, metric.WithUnit("{batch}"),
		metric.WithDescription("Batches of units taken by leased budgets."))
	m.units, errs[5] = meter.Int64Counter(metricLeasedUnits, metric.WithUnit("{unit}"),
		metric.WithDescription("Units taken by leased budgets beyond their calls' cost."))
	m.refunded, errs[6] = meter.Int64Counter(metricLeasedRefunded, metric.WithUnit("{unit}"),
		metric.WithDescription("Parked units of leased budgets given back to the server."))
	m.utilization, errs[7] = meter.Float64Histogram(metricUtilization, metric.WithUnit("1"),
		metric.WithDescription("Share of the limit used once a decision admitted (1 when it refused)."),
		metric.WithExplicitBucketBoundaries(utilizationBuckets...))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, &OptionError{Field: "MeterProvider", Reason: fmt.Sprintf("creating instruments: %v", err)}
	}
	for a, name := range subjectNames() {
		m.algOpts[a] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("rlfn.algorithm", name)))}
		for op := range nOps {
			alg := attribute.String("rlfn.algorithm", name)
			opa := attribute.String("rlfn.operation", opNames[op])
			for k := kindTimeout; k < nKinds; k++ {
				set := attribute.NewSet(alg, opa, attribute.String("error.type", kindNames[k]))
				m.errorOpts[a][op][k] = []metric.AddOption{metric.WithAttributeSet(set)}
			}
			for out := range 3 {
				set := attribute.NewSet(alg, opa, attribute.String("rlfn.outcome", outcomeNames[out]))
				m.durationOpts[a][op][out] = []metric.RecordOption{metric.WithAttributeSet(set)}
			}
		}
	}
	for s := closed; s <= halfOpen; s++ {
		set := attribute.NewSet(attribute.String("rlfn.breaker.state", s.String()))
		m.transitionOpts[s] = []metric.AddOption{metric.WithAttributeSet(set)}
	}
	return m, nil
}

// telemetry is what Options.MeterProvider and TracerProvider turn on (metrics here, spans in
// trace.go): nil when neither is given, and then each of its uses is one nil check.
type telemetry struct {
	m         *metrics     // nil without a MeterProvider
	tracer    trace.Tracer // nil without a TracerProvider
	traceKeys bool         // Options.TraceKeys
}

// meter is t's metrics, nil when none are recorded.
func (t *telemetry) meter() *metrics {
	if t == nil {
		return nil
	}
	return t.m
}

// tracing reports whether calls make spans.
func (t *telemetry) tracing() bool { return t != nil && t.tracer != nil }

func (t *telemetry) countError(ctx context.Context, subject int, op operation, kind errKind) {
	if m := t.meter(); m != nil {
		m.errors.Add(ctx, 1, m.errorOpts[subject][op][kind]...)
	}
}

// transition follows the breaker into a new state (none when s < 0).
func (t *telemetry) transition(ctx context.Context, s breakerState) {
	if s < 0 {
		return
	}
	if m := t.meter(); m != nil {
		m.transitions.Add(ctx, 1, m.transitionOpts[s]...)
	}
}

// countCached counts a denial the denial cache answered.
func (t *telemetry) countCached(ctx context.Context, c call, res Result) {
	t.decided(ctx, t.series(ctx, c.alg.id, &c.spec), opAllow, res, srcCached)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
