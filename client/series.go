package client

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// series.go: the metrics of each limit by its name (Options.MeterProvider). A decision is
// counted, and its utilization recorded, with its limit's configured name, quota and period,
// so that "which limit refuses" and "how close is each to its ceiling" need no per-key series.
// The attribute sets of a limit are built the first time it decides and kept per Limiter in a
// copy-on-write map: a decision looks its limit up with one atomic load and a map read, and
// allocates nothing. At most Options.MetricLimits limits get series of their own; every
// further one (names a policy function made up per request, an override per key) shares its
// algorithm's overflow series, so that no traffic grows the series count past that.

// Attribute keys of a limit, on metrics and spans alike (the dashboard reads them as
// rlfn_limit_name, rlfn_limit_quota, rlfn_limit_period).
const (
	attrLimitName   = "rlfn.limit.name"
	attrLimitQuota  = "rlfn.limit.quota"
	attrLimitPeriod = "rlfn.limit.period"
)

// OverflowLimitName is the rlfn.limit.name of the decisions of limits beyond
// Options.MetricLimits: they share one series per algorithm, without quota and period.
const OverflowLimitName = "_overflow"

// defaultMetricLimits is Options.MetricLimits when zero.
const defaultMetricLimits = 256

// utilizationBuckets make "above 80%, 90%, at the limit" one bucket each: the share of a
// limit's decisions above 0.9 is 1 - bucket{le="0.9"} / count.
var utilizationBuckets = []float64{0.25, 0.5, 0.75, 0.8, 0.9, 0.95, 0.99, 1}

// limitID is what tells a limit's series apart: its algorithm (or rl_multi), name, quota and
// period.
type limitID struct {
	subject int
	name    string
	quota   int64
	ms      int64  // window, period or lease, in ms; 0 for a calendar and rl_multi
	cal     Period // a calendar's period
	limit   bool   // quota and period are a limit's: false for an rl_multi no limit decided
}

// series is one limit's attribute sets: those of its decisions, built on first use each, and
// of its utilization.
type series struct {
	subject   int
	attrs     []attribute.KeyValue // rlfn.algorithm and the limit's
	decisions [nOps][2][nSources]atomic.Pointer[[]metric.AddOption]
	util      []metric.RecordOption
}

func newSeries(id limitID, alg string, overflow bool) *series {
	s := &series{subject: id.subject}
	s.attrs = append(s.attrs, attribute.String("rlfn.algorithm", alg))
	if overflow {
		s.attrs = append(s.attrs, attribute.String(attrLimitName, OverflowLimitName))
	} else {
		period := time.Duration(id.ms * int64(time.Millisecond)).String()
		if id.subject == calendarAlg.id {
			period = id.cal.String()
		}
		s.attrs = append(s.attrs, attribute.String(attrLimitName, id.name))
		if id.limit {
			// rl_multi's series are those of the limit that decided; one without it has none
			s.attrs = append(s.attrs, attribute.Int64(attrLimitQuota, id.quota), attribute.String(attrLimitPeriod, period))
		}
	}
	s.util = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(s.attrs...))}
	return s
}

// decisionOpts is the attribute set of a decision of s.
func (s *series) decisionOpts(op operation, allowed bool, src int) []metric.AddOption {
	p := &s.decisions[op][b2i(allowed)][src]
	if o := p.Load(); o != nil {
		return *o
	}
	attrs := append(append(make([]attribute.KeyValue, 0, len(s.attrs)+3), s.attrs...),
		attribute.String("rlfn.operation", opNames[op]),
		attribute.String("rlfn.outcome", outcomeNames[1-b2i(allowed)]),
		attribute.String("rlfn.source", sourceNames[src]))
	o := []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attrs...))}
	p.CompareAndSwap(nil, &o)
	return *p.Load()
}

// limitSeries is a Limiter's series by limit, at most max of them.
type limitSeries struct {
	max      int
	byID     atomic.Pointer[map[limitID]*series] // never written: replaced, under mu
	mu       sync.Mutex
	overflow [nSubjects]*series
}

func newLimitSeries(max int) *limitSeries {
	ls := &limitSeries{max: max}
	m := map[limitID]*series{}
	ls.byID.Store(&m)
	for subject, name := range subjectNames() {
		ls.overflow[subject] = newSeries(limitID{subject: subject}, name, true)
	}
	return ls
}

// subjectNames are the rlfn.algorithm of every subject.
func subjectNames() [nSubjects]string {
	var names [nSubjects]string
	for _, a := range algorithms {
		names[a.id] = a.name
	}
	names[multiSubject] = "multi"
	return names
}

// get is id's series, made on its first decision, or its algorithm's overflow series once the
// Limiter has max.
func (ls *limitSeries) get(id limitID) *series {
	if s, ok := (*ls.byID.Load())[id]; ok {
		return s
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	old := *ls.byID.Load()
	if s, ok := old[id]; ok {
		return s
	}
	if len(old) >= ls.max {
		return ls.overflow[id.subject]
	}
	next := make(map[limitID]*series, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	s := newSeries(id, subjectNames()[id.subject], false)
	next[id] = s
	ls.byID.Store(&next)
	return s
}

// limitNameKey is the context key of WithLimitName.
type limitNameKey struct{}

// WithLimitName names the decisions made with ctx in metrics, spans and log lines
// (rlfn.limit.name) in place of their limits' Name (a Rule's Name names its own): a route's
// or a tier's name, which is in the key rather than in the Limit. Give it names the service
// declares, never a request's values: each name is a metric series (see
// Options.MetricLimits). Without it, a decision is named by its Limit's Name. The context is
// one allocation; httplimit and grpclimit name their calls without one.
func WithLimitName(ctx context.Context, name string) context.Context {
	return &namedContext{ctx, name}
}

// namedContext is WithLimitName's context: one allocation per call, where context.WithValue
// would make two (the context, and the string boxed in an interface), on a middleware's every
// request.
type namedContext struct {
	context.Context
	name string
}

// Value answers limitNameKey with c itself, a pointer, which an interface holds without an
// allocation.
func (c *namedContext) Value(key any) any {
	if key == (limitNameKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// nameOf is the name of s's decisions under ctx: the call's own (Rule.Name, a middleware's),
// else WithLimitName's, else the Limit's Name.
func nameOf(ctx context.Context, s *spec) string {
	if s != nil && s.label != "" {
		return s.label
	}
	if n, ok := ctx.Value(limitNameKey{}).(*namedContext); ok {
		return n.name
	}
	if s == nil {
		return ""
	}
	return s.name
}

// periodOf is the rlfn.limit.period of s: a window's, a bucket's period, a lease's length (as
// time.Duration prints it: "1m0s"), or a calendar's period (day, week, month, year).
func periodOf(s *spec) string {
	if s.alg == calendarAlg {
		return s.period.String()
	}
	return time.Duration(s.ms * int64(time.Millisecond)).String()
}

// series is the series of a decision of sp under ctx (for rl_multi, sp is the limit that
// decided, or nil when none did: named by ctx alone), or nil without metrics.
func (t *telemetry) series(ctx context.Context, subject int, sp *spec) *series {
	m := t.meter()
	if m == nil {
		return nil
	}
	id := limitID{subject: subject, name: nameOf(ctx, sp)}
	if sp != nil {
		id.quota, id.ms, id.cal, id.limit = sp.limit, sp.ms, sp.period, true
		if sp.alg == calendarAlg {
			id.ms = 0
		}
	}
	return m.limits.get(id)
}

// decided counts a decision of s (nil: none recorded), and records its utilization when it
// takes units (Allow, Acquire, Hold): the share of the limit used once it admitted, 1 when it
// refused.
func (t *telemetry) decided(ctx context.Context, s *series, op operation, res Result, src int) {
	m := t.meter()
	if m == nil || s == nil {
		return
	}
	m.decisions.Add(ctx, 1, s.decisionOpts(op, res.Allowed, src)...)
	if op != opAllow && op != opAcquire && op != opHold || res.Limit <= 0 {
		return
	}
	u := 1.0
	if res.Allowed {
		u = min(1, max(0, float64(res.Limit-res.Remaining)/float64(res.Limit)))
	}
	m.utilization.Record(ctx, u, s.util...)
}
