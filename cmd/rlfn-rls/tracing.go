package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"github.com/urfave/cli/v2"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/stats"
)

// tracingFlags send spans over OTLP, as the reference's TRACING_* variables do (Envoy
// Gateway sets them for rateLimit.telemetry.tracing). The exporter's endpoint, headers, TLS
// and timeout are OpenTelemetry's own OTEL_EXPORTER_OTLP_* variables, read by its exporter, as
// the reference leaves them.
var tracingFlags = []cli.Flag{
	&cli.BoolFlag{Name: "tracing", EnvVars: []string{"RLFN_RLS_TRACING"}, Usage: "send spans over OTLP to $OTEL_EXPORTER_OTLP_ENDPOINT: one per ShouldRateLimit, in the trace of Envoy's W3C traceparent, with a child per decision in Valkey or Redis (the reference's TRACING_ENABLED)"},
	&cli.StringFlag{Name: "tracing-protocol", Value: "http", EnvVars: []string{"RLFN_RLS_TRACING_PROTOCOL"}, Usage: "OTLP over http (protobuf) or grpc (the reference's TRACING_EXPORTER_PROTOCOL)"},
	&cli.Float64Flag{Name: "tracing-sampling-rate", Value: 1, EnvVars: []string{"RLFN_RLS_TRACING_SAMPLING_RATE"}, Usage: "share of the requests without a sampling decision of Envoy's that are traced, from 0 to 1; a request in Envoy's trace follows its sampled flag (the reference's TRACING_SAMPLING_RATE)"},
	&cli.StringFlag{Name: "tracing-service-name", Value: "rlfn-rls", EnvVars: []string{"RLFN_RLS_TRACING_SERVICE_NAME"}, Usage: "the spans' service.name (the reference's TRACING_SERVICE_NAME)"},
	&cli.StringFlag{Name: "tracing-service-namespace", EnvVars: []string{"RLFN_RLS_TRACING_SERVICE_NAMESPACE"}, Usage: "the spans' service.namespace (the reference's TRACING_SERVICE_NAMESPACE)"},
	&cli.StringFlag{Name: "tracing-service-instance-id", EnvVars: []string{"RLFN_RLS_TRACING_SERVICE_INSTANCE_ID"}, Usage: "the spans' service.instance.id (default: a random UUID at each start; the reference's TRACING_SERVICE_INSTANCE_ID)"},
}

// tracingFlush bounds the sending, at exit, of the spans still queued: the requests are
// drained by then, and a collector that does not answer must not hold the exit for the
// exporter's minute of retries.
const tracingFlush = 5 * time.Second

// tracing is what --tracing turns on: the provider the client's decisions record their spans
// with, and the gRPC server's handler that starts a request's span. Without --tracing both
// are nil, and nothing is added to a request's work.
type tracing struct {
	provider trace.TracerProvider // nil without --tracing
	stats    stats.Handler        // nil without --tracing
	sdk      *sdktrace.TracerProvider
}

// startTracing reads the tracing flags and, with --tracing, makes the OTLP exporter (which
// connects when it first sends) and the provider; close sends what is queued.
func startTracing(c *cli.Context, log *slog.Logger) (*tracing, error) {
	if !c.Bool("tracing") {
		for _, f := range tracingFlags[1:] {
			if name := f.Names()[0]; c.IsSet(name) {
				return nil, fmt.Errorf("--%s needs --tracing, the spans it is about", name)
			}
		}
		return &tracing{}, nil
	}
	rate := c.Float64("tracing-sampling-rate")
	if !(rate >= 0 && rate <= 1) {
		return nil, fmt.Errorf("--tracing-sampling-rate %v: a fraction from 0 to 1", rate)
	}
	protocol := c.String("tracing-protocol")
	var exporter sdktrace.SpanExporter
	var err error
	switch protocol {
	case "http":
		exporter, err = otlptracehttp.New(c.Context)
	case "grpc":
		exporter, err = otlptracegrpc.New(c.Context)
	default:
		return nil, fmt.Errorf("--tracing-protocol %q: http or grpc", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("--tracing: %w", err)
	}
	instance := c.String("tracing-service-instance-id")
	if instance == "" {
		instance = randomUUID()
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(c.String("tracing-service-name")), semconv.ServiceInstanceID(instance)}
	if ns := c.String("tracing-service-namespace"); ns != "" {
		attrs = append(attrs, semconv.ServiceNamespace(ns))
	}
	// OTEL_RESOURCE_ATTRIBUTES adds to these (the provider merges it under them).
	res := resource.NewWithAttributes(semconv.SchemaURL, attrs...)
	// The SDK's own complaints (a collector unreachable, spans dropped) as the log's JSON
	// lines rather than its plain ones on stderr.
	otel.SetLogger(logr.FromSlogHandler(log.Handler()))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing", "err", err) }))
	// Batched: a span ended is queued, never waited for, and dropped when the queue is full
	// (a collector down), so that tracing never slows a decision.
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(rate))),
	)
	h := otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(tp),
		// Envoy sends its trace in the request's metadata as W3C traceparent (and baggage).
		otelgrpc.WithPropagators(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})),
		// Its RPC metrics would duplicate rlfn_rls_request_duration_seconds.
		otelgrpc.WithMeterProvider(noop.NewMeterProvider()),
		// Health checks and reflection are not the requests traced.
		otelgrpc.WithFilter(filters.ServiceName(rlsService)),
	)
	log.Info("tracing", "protocol", protocol, "endpoint", otlpEndpoint(), "sampling_rate", rate,
		"service_name", c.String("tracing-service-name"), "service_namespace", c.String("tracing-service-namespace"), "service_instance_id", instance)
	return &tracing{provider: tp, stats: h, sdk: tp}, nil
}

// rlsService is the gRPC service whose calls are traced.
const rlsService = "envoy.service.ratelimit.v3.RateLimitService"

// close sends the spans still queued, within tracingFlush, and stops the exporter.
func (t *tracing) close(log *slog.Logger) {
	if t.sdk == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), tracingFlush)
	defer cancel()
	if err := t.sdk.Shutdown(ctx); err != nil {
		log.Warn("tracing: the last spans were not all sent", "err", err)
	}
}

// otlpEndpoint says where the exporter sends, for the log: the variable it reads, or its
// default. A password in it is not shown.
func otlpEndpoint() string {
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if e := os.Getenv(v); e != "" {
			if u, err := url.Parse(e); err == nil && u.User != nil {
				e = u.Redacted()
			}
			return e
		}
	}
	return "the exporter's default (localhost)"
}

// randomUUID is a version 4 UUID, the reference's service.instance.id when none is given.
func randomUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// tracing maps the reference's TRACING_* variables to the tracing flags. The reference reads
// the others only with TRACING_ENABLED; the exporter reads OTEL_EXPORTER_OTLP_* itself.
func (r *envReader) tracing() {
	others := []string{"TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE", "TRACING_SERVICE_INSTANCE_ID", "TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE"}
	if !r.bool("TRACING_ENABLED", false) {
		if v, ok := r.get("TRACING_ENABLED"); ok {
			if b, err := strconv.ParseBool(v); err == nil && !b {
				r.note("TRACING_ENABLED", v, "no tracing, rlfn-rls's default")
			}
		}
		r.noted("unused without TRACING_ENABLED (as by the reference)", others...)
		return
	}
	r.flag("TRACING_ENABLED", "true", "tracing", "true")
	if v, ok := r.get("TRACING_SERVICE_NAME"); ok {
		r.flag("TRACING_SERVICE_NAME", v, "tracing-service-name", v)
	} else {
		// The reference's name when none is given, so that a trace's service stays the same.
		r.flag("TRACING_ENABLED", "true", "tracing-service-name", "RateLimit")
	}
	for v, flag := range map[string]string{"TRACING_SERVICE_NAMESPACE": "tracing-service-namespace", "TRACING_SERVICE_INSTANCE_ID": "tracing-service-instance-id"} {
		if value, ok := r.get(v); ok && value != "" {
			r.flag(v, value, flag, value)
		}
	}
	if v, ok := r.get("TRACING_EXPORTER_PROTOCOL"); ok {
		switch v {
		case "http", "grpc":
			r.flag("TRACING_EXPORTER_PROTOCOL", v, "tracing-protocol", v)
		case "":
			r.note("TRACING_EXPORTER_PROTOCOL", v, "http, as by the reference")
		default:
			r.refuse("TRACING_EXPORTER_PROTOCOL", v, "not http or grpc")
		}
	}
	if v, ok := r.get("TRACING_SAMPLING_RATE"); ok {
		if f, err := strconv.ParseFloat(v, 64); err != nil || !(f >= 0 && f <= 1) {
			r.refuse("TRACING_SAMPLING_RATE", v, "not a fraction from 0 to 1")
		} else {
			r.flag("TRACING_SAMPLING_RATE", v, "tracing-sampling-rate", v)
		}
	}
	r.noted("read by OpenTelemetry's OTLP exporter, as by the reference", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
}
