package integration_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
)

// Each decision is a span with its outcome; the key only when opted in.
func TestTraces(t *testing.T) {
	tg := servers(t)[0]
	ctx := ctx5s(t)
	rec, tp := recordSpans(t)
	limit := client.FixedWindow{Limit: 1, Window: time.Minute, Name: "per_minute"}
	key := keyFor(t)
	roomInWindow(t, tg.c, 60_000, 2*time.Second)

	lim := harness.NewLimiter(t, tg.c, client.Options{Deadline: slowDeadline, Fallback: client.ReturnError, TracerProvider: tp})
	if r, err := lim.Allow(ctx, key, limit); err != nil || !r.Allowed {
		t.Fatalf("%+v, %v", r, err)
	}
	if r, err := lim.Allow(ctx, key, limit); err != nil || r.Allowed {
		t.Fatalf("%+v, %v", r, err)
	}
	if _, err := lim.Refund(ctx, key, limit, 1); err != nil {
		t.Fatal(err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := lim.Peek(canceled, key, limit); err == nil {
		t.Fatal("a peek with a canceled context succeeded")
	}
	keyed := harness.NewLimiter(t, tg.c, client.Options{
		Deadline:       slowDeadline,
		Fallback:       client.ReturnError,
		TracerProvider: tp,
		TraceKeys:      true,
	})
	if _, err := keyed.Peek(ctx, key, limit); err != nil {
		t.Fatal(err)
	}

	spans := rec.Ended()
	if len(spans) != 5 {
		t.Fatalf("%d spans, want 5", len(spans))
	}
	attrs := func(i int) map[attribute.Key]attribute.Value { return spanAttrs(spans[i]) }
	for i, want := range []struct {
		name      string
		allowed   bool
		remaining int64
		err       bool
		key       bool
	}{
		{"rlfn.allow", true, 0, false, false},
		{"rlfn.allow", false, 0, false, false},
		{"rlfn.refund", true, 1, false, false},
		{"rlfn.peek", false, 0, true, false},
		{"rlfn.peek", true, 1, false, true},
	} {
		a := attrs(i)
		if spans[i].Name() != want.name || a["rlfn.algorithm"].AsString() != "fixed_window" ||
			a["rlfn.limit.name"].AsString() != "per_minute" {
			t.Errorf("span %d: %s %v", i, spans[i].Name(), a)
		}
		if _, ok := a["ratelimit.key"]; ok != want.key || (ok && a["ratelimit.key"].AsString() != key) {
			t.Errorf("span %d: key recorded %v, want %v: %v", i, ok, want.key, a)
		}
		if want.err {
			if spans[i].Status().Code != codes.Error {
				t.Errorf("span %d: status %v, want Error", i, spans[i].Status())
			}
			continue
		}
		if a["ratelimit.allowed"].AsBool() != want.allowed || a["ratelimit.remaining"].AsInt64() != want.remaining ||
			a["rlfn.source"].AsString() != "server" {
			t.Errorf("span %d: %v, want allowed %v remaining %d from the server", i, a, want.allowed, want.remaining)
		}
		if _, ok := a["ratelimit.retry_after_ms"]; ok == want.allowed {
			t.Errorf("span %d: retry_after_ms recorded %v on allowed %v", i, ok, want.allowed)
		}
	}
}

// AllowAll, PeekAll and a lease's Acquire and Release are spans, as Allow is.
func TestTracesAllAndLeases(t *testing.T) {
	tg := servers(t)[0]
	ctx := ctx5s(t)
	rec, tp := recordSpans(t)
	key := keyFor(t)
	perMinute := client.FixedWindow{Limit: 1, Window: time.Minute, Name: "per_minute"}
	burst := client.TokenBucket{Capacity: 5, Rate: 1, Period: time.Second}
	rules := []client.Rule{{Key: key, Limit: burst}, {Key: key, Limit: perMinute}}
	roomInWindow(t, tg.c, 60_000, 2*time.Second)
	lim := harness.NewLimiter(t, tg.c, client.Options{
		Deadline:       slowDeadline,
		Fallback:       client.ReturnError,
		TracerProvider: tp,
		TraceKeys:      true,
	})
	if r, err := lim.AllowAll(ctx, rules); err != nil || !r.Allowed {
		t.Fatalf("%+v, %v", r, err)
	}
	if r, err := lim.PeekAll(ctx, rules); err != nil || r.Allowed {
		t.Fatalf("%+v, %v", r, err)
	}
	lease, r, err := lim.Acquire(ctx, key, client.Concurrency{Limit: 2, Lease: time.Minute})
	if err != nil || !r.Allowed {
		t.Fatalf("%+v, %v", r, err)
	}
	if _, err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	spans := rec.Ended()
	if len(spans) != 4 {
		t.Fatalf("%d spans, want 4", len(spans))
	}
	for i, want := range []struct {
		name, alg string
		allowed   bool
		remaining int64
		rule      int64 // -1: none
	}{
		{"rlfn.allow_all", "fixed_window", true, 0, 1},
		{"rlfn.peek_all", "fixed_window", false, 0, 1},
		{"rlfn.acquire", "concurrency", true, 1, -1},
		{"rlfn.release", "concurrency", true, 2, -1},
	} {
		a := spanAttrs(spans[i])
		rule, hasRule := a["rlfn.rule"]
		if spans[i].Name() != want.name || a["rlfn.algorithm"].AsString() != want.alg ||
			a["ratelimit.allowed"].AsBool() != want.allowed || a["ratelimit.remaining"].AsInt64() != want.remaining ||
			a["ratelimit.key"].AsString() != key || hasRule != (want.rule >= 0) || (hasRule && rule.AsInt64() != want.rule) {
			t.Errorf("span %d: %s %v; want %+v", i, spans[i].Name(), a, want)
		}
	}
}

// recordSpans is a tracer provider that keeps the spans it ends, shut down after the test.
func recordSpans(t *testing.T) (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return rec, tp
}

// spanAttrs is a span's attributes by key.
func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}
