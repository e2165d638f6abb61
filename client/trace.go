package client

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Span names, by operation, and the attributes of every span (Options.TracerProvider).
var spanNames = [nOps]string{"rlfn.allow", "rlfn.peek", "rlfn.refund", "rlfn.acquire", "rlfn.release", "rlfn.hold", "rlfn.settle"}

// Span names of AllowAll and PeekAll, by operation.
var allSpanNames = [nOps]string{opAllow: "rlfn.allow_all", opPeek: "rlfn.peek_all"}

// traced runs c as op under a span of its own, a child of ctx's, so that a traced valkey-go
// client's FCALL span is the span's child.
func (l *Limiter) traced(ctx context.Context, op operation, key string, c call) (Result, error) {
	ctx, span := l.tel.tracer.Start(ctx, spanNames[op], trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	res, err := l.route(ctx, op, key, c)
	if !span.IsRecording() {
		// Not sampled: its attributes would be built for nothing (5 allocations, 2.2 KB a decision).
		return res, err
	}
	attrs := make([]attribute.KeyValue, 0, 8)
	attrs = append(attrs,
		attribute.String("rlfn.operation", opNames[op]),
		attribute.Int64("rlfn.cost", c.cost))
	attrs = l.limitAttrs(ctx, attrs, c.spec, key)
	l.endSpan(span, attrs, res, err)
	return res, err
}

// tracedAll runs all (AllowAll, PeekAll) under a span of its own: the number of rules, and
// the deciding rule's index, limit and outcome.
func (l *Limiter) tracedAll(ctx context.Context, op operation, rules []Rule, n int64, each []Result) (Result, error) {
	ctx, span := l.tel.tracer.Start(ctx, allSpanNames[op], trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	res, err := l.decideAll(ctx, op, rules, n, each)
	if !span.IsRecording() {
		return res, err
	}
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs,
		attribute.String("rlfn.operation", opNames[op]+"_all"),
		attribute.Int64("rlfn.cost", n),
		attribute.Int("rlfn.rules", len(rules)))
	if err == nil {
		r := rules[res.Rule]
		attrs = append(attrs, attribute.Int("rlfn.rule", res.Rule))
		sp := r.Limit.spec()
		sp.label = r.Name
		attrs = l.limitAttrs(ctx, attrs, sp, r.Key)
	}
	l.endSpan(span, attrs, res, err)
	return res, err
}

// limitAttrs appends a limit's algorithm, name (its Rule.Name, WithLimitName's, or its Name), quota and period,
// named as its metrics' attributes, and its key with Options.TraceKeys alone (keys are often
// personal data).
func (l *Limiter) limitAttrs(ctx context.Context, attrs []attribute.KeyValue, s spec, key string) []attribute.KeyValue {
	attrs = append(attrs, attribute.String("rlfn.algorithm", s.alg.name))
	if name := nameOf(ctx, &s); name != "" {
		attrs = append(attrs, attribute.String(attrLimitName, name))
	}
	if s.alg != blockAlg {
		attrs = append(attrs, attribute.Int64(attrLimitQuota, s.limit), attribute.String(attrLimitPeriod, periodOf(&s)))
	}
	if l.tel.traceKeys {
		attrs = append(attrs, attribute.String("ratelimit.key", key))
	}
	return attrs
}

// endSpan records a decision's outcome, or its error, on span.
func (l *Limiter) endSpan(span trace.Span, attrs []attribute.KeyValue, res Result, err error) {
	if err != nil {
		span.SetAttributes(attrs...)
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return
	}
	attrs = append(attrs,
		attribute.Bool("ratelimit.allowed", res.Allowed),
		attribute.Int64("ratelimit.remaining", res.Remaining),
		attribute.Int64("ratelimit.limit", res.Limit),
		attribute.String("rlfn.source", l.source(res)))
	if !res.Allowed {
		attrs = append(attrs, attribute.Int64("ratelimit.retry_after_ms", retryAfterMs(res.RetryAfter)))
	}
	span.SetAttributes(attrs...)
}

// source names who decided res, as metricDecisions' rlfn.source does.
func (l *Limiter) source(res Result) string {
	switch res.Source {
	case FromLease:
		return sourceNames[srcLeased]
	case FromDenialCache:
		return sourceNames[srcCached]
	case FromFallback:
		return sourceNames[fallbackSrc[l.fallback]]
	}
	return sourceNames[srcServer]
}
