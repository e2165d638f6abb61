package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// receivedSpan is a span an OTLP receiver got, with its resource's string attributes.
type receivedSpan struct {
	*tracepb.Span
	resource map[string]string
}

// otlpReceiver is an OTLP trace collector on loopback, over gRPC or HTTP (protobuf), keeping
// every span it is sent.
type otlpReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	endpoint string // for OTEL_EXPORTER_OTLP_ENDPOINT

	mu    sync.Mutex
	spans []receivedSpan
}

func (r *otlpReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		res := map[string]string{}
		for _, kv := range rs.GetResource().GetAttributes() {
			res[kv.Key] = kv.GetValue().GetStringValue()
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				r.spans = append(r.spans, receivedSpan{s, res})
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// all is every span received so far.
func (r *otlpReceiver) all() []receivedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]receivedSpan(nil), r.spans...)
}

// startReceiver serves OTLP over protocol (grpc, or http: POST /v1/traces, as an
// OpenTelemetry Collector's port 4318) until the test ends.
func startReceiver(t testing.TB, protocol string) *otlpReceiver {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &otlpReceiver{endpoint: "http://" + l.Addr().String()}
	switch protocol {
	case "grpc":
		s := grpc.NewServer()
		coltracepb.RegisterTraceServiceServer(s, r)
		go func() { _ = s.Serve(l) }()
		t.Cleanup(s.Stop)
	case "http":
		mux := http.NewServeMux()
		mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, req *http.Request) {
			body, err := io.ReadAll(req.Body)
			var in coltracepb.ExportTraceServiceRequest
			if err == nil {
				err = proto.Unmarshal(body, &in)
			}
			if err != nil || req.Header.Get("Content-Type") != "application/x-protobuf" {
				http.Error(w, fmt.Sprintf("%s: %v", req.Header.Get("Content-Type"), err), http.StatusBadRequest)
				return
			}
			resp, _ := r.Export(req.Context(), &in)
			out, _ := proto.Marshal(resp)
			w.Header().Set("Content-Type", "application/x-protobuf")
			_, _ = w.Write(out)
		})
		s := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = s.Serve(l) }()
		t.Cleanup(func() { s.Close() })
	default:
		t.Fatalf("protocol %q", protocol)
	}
	return r
}

// gatewayTracingEnv is what Envoy Gateway adds to the rate limit Deployment's environment for
// rateLimit.telemetry.tracing with a provider's URL (its resource.go): the instance's ID is
// the pod's name there (a fieldRef), the rate its samplingRate / 100, formatted as 1.0, and
// no TRACING_EXPORTER_PROTOCOL, so the reference's default, http.
func gatewayTracingEnv(endpoint, rate string) map[string]string {
	return map[string]string{
		"TRACING_ENABLED":             "true",
		"TRACING_SERVICE_NAME":        "envoy-ratelimit",
		"TRACING_SERVICE_NAMESPACE":   "envoy-gateway-system",
		"TRACING_SERVICE_INSTANCE_ID": "envoy-ratelimit-5b7d9c6f4-x2x8q",
		"TRACING_SAMPLING_RATE":       rate,
		"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
	}
}

// traceparent is W3C trace context for a new trace, as Envoy sends it in the request's
// metadata: the trace's ID, and the parent's span ID, both in hex.
func traceparent(sampled bool) (header, traceID, spanID string) {
	var b [24]byte
	_, _ = rand.Read(b[:])
	traceID, spanID = hex.EncodeToString(b[:16]), hex.EncodeToString(b[16:])
	flags := "00"
	if sampled {
		flags = "01"
	}
	return "00-" + traceID + "-" + spanID + "-" + flags, traceID, spanID
}

// askTraced sends ShouldRateLimit for domain with traceparent in its metadata ("" for none).
func askTraced(t *testing.T, a *app, domain, traceparent string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if traceparent != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", traceparent)
	}
	resp, err := ask(ctx, a.rls, domain)
	if err != nil || resp.OverallCode != pb.RateLimitResponse_OK {
		t.Fatalf("%v %v\n%s", resp, err, a.stderr.String())
	}
}

// stopApp ends the app as SIGTERM does, and fails the test unless it exited cleanly.
func stopApp(t *testing.T, a *app, cancel context.CancelFunc) {
	t.Helper()
	cancel()
	if err := <-a.done; err != nil {
		t.Fatalf("serve: %v\n%s", err, a.stderr.String())
	}
}

// ofTrace are the spans of traceID among spans.
func ofTrace(spans []receivedSpan, traceID string) []receivedSpan {
	var out []receivedSpan
	for _, s := range spans {
		if hex.EncodeToString(s.TraceId) == traceID {
			out = append(out, s)
		}
	}
	return out
}

func describe(spans []receivedSpan) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "%s %s trace %x span %x parent %x %v\n", s.Name, s.Kind, s.TraceId, s.SpanId, s.ParentSpanId, s.resource)
	}
	return b.String()
}

// Started with the environment Envoy Gateway renders for rateLimit.telemetry.tracing, rlfn-rls
// sends a span of Envoy's request, in Envoy's trace (its traceparent the span's parent), with
// the Deployment's service name, namespace and pod, and a child span of its decision in
// Valkey; over OTLP/HTTP, Envoy Gateway's protocol (the reference's default), and over gRPC
// (TRACING_EXPORTER_PROTOCOL=grpc). The spans are sent at exit, before the batch's 5 s are up.
func TestTracingEnvoyGatewayEnv(t *testing.T) {
	url, dir, _ := startStalled(t, "d")
	for _, protocol := range []string{"http", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			recv := startReceiver(t, protocol)
			for k, v := range gatewayTracingEnv(recv.endpoint, "1.0") {
				t.Setenv(k, v)
			}
			if protocol == "grpc" {
				t.Setenv("TRACING_EXPORTER_PROTOCOL", "grpc")
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			a := startApp(t, ctx, "--url", url, "--config", dir, "--deadline", "5s")
			header, traceID, parent := traceparent(true)
			askTraced(t, a, "d", header)
			stopApp(t, a, cancel)

			spans := ofTrace(recv.all(), traceID)
			var server *receivedSpan
			for i, s := range spans {
				if s.Name == "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" {
					server = &spans[i]
				}
			}
			if server == nil {
				t.Fatalf("no ShouldRateLimit span in trace %s; received:\n%s\n%s", traceID, describe(recv.all()), a.stderr.String())
			}
			if server.Kind != tracepb.Span_SPAN_KIND_SERVER || hex.EncodeToString(server.ParentSpanId) != parent {
				t.Errorf("the request's span is not a server span whose parent is Envoy's %s:\n%s", parent, describe(spans))
			}
			want := map[string]string{"service.name": "envoy-ratelimit", "service.namespace": "envoy-gateway-system", "service.instance.id": "envoy-ratelimit-5b7d9c6f4-x2x8q"}
			for k, v := range want {
				if server.resource[k] != v {
					t.Errorf("resource %s = %q, want %q: %v", k, server.resource[k], v, server.resource)
				}
			}
			decided := false
			for _, s := range spans {
				decided = decided || s.Name == "rlfn.allow_all" && bytes.Equal(s.ParentSpanId, server.SpanId) && s.Kind == tracepb.Span_SPAN_KIND_CLIENT
			}
			if !decided {
				t.Errorf("no rlfn.allow_all client span under the request's:\n%s", describe(spans))
			}
			if !strings.Contains(a.stderr.String(), `"msg":"tracing","protocol":"`+protocol+`"`) {
				t.Errorf("the log does not say where the spans go:\n%s", a.stderr.String())
			}
		})
	}
}

// TRACING_SAMPLING_RATE=0.0 (Envoy Gateway's samplingRate 0) sends no span of a request
// outside a trace, nor of one whose trace Envoy did not sample; a request in a trace Envoy
// sampled is traced still (the rate is for the requests with no decision, as the reference's
// parent-based sampler), which shows the spans would have been received.
func TestTracingSamplingRateZero(t *testing.T) {
	url, dir, _ := startStalled(t, "d")
	recv := startReceiver(t, "grpc")
	for k, v := range gatewayTracingEnv(recv.endpoint, "0.0") {
		t.Setenv(k, v)
	}
	t.Setenv("TRACING_EXPORTER_PROTOCOL", "grpc")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := startApp(t, ctx, "--url", url, "--config", dir, "--deadline", "5s")
	unsampled, _, _ := traceparent(false)
	sampled, sampledTrace, _ := traceparent(true)
	for range 3 {
		askTraced(t, a, "d", "")
		askTraced(t, a, "d", unsampled)
	}
	askTraced(t, a, "d", sampled)
	stopApp(t, a, cancel)
	all := recv.all()
	if got := ofTrace(all, sampledTrace); len(got) < 2 || len(got) != len(all) {
		t.Fatalf("want the sampled trace's spans alone, got:\n%s", describe(all))
	}
}

// The tracing flags' errors stop the start, one line each; a tracing flag without --tracing is
// a mistake said, not a setting ignored.
func TestTracingFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tracing", "--tracing-protocol", "udp"}, `--tracing-protocol "udp": http or grpc`},
		{[]string{"--tracing", "--tracing-sampling-rate", "1.5"}, "--tracing-sampling-rate 1.5: a fraction from 0 to 1"},
		{[]string{"--tracing", "--tracing-sampling-rate", "-0.1"}, "--tracing-sampling-rate -0.1: a fraction from 0 to 1"},
		{[]string{"--tracing-protocol", "grpc"}, "--tracing-protocol needs --tracing, the spans it is about"},
		{[]string{"--tracing-service-name", "rl"}, "--tracing-service-name needs --tracing"},
	} {
		var stderr bytes.Buffer
		// Port 1 on loopback: had the flags passed, connecting would have failed instead.
		code := run(append([]string{"rlfn-rls", "--config", "../../docs/envoy/ratelimit.yaml", "--url", "redis://127.0.0.1:1"}, tc.args...), &stderr)
		if code != 1 || !strings.Contains(stderr.String(), tc.want) || strings.Count(stderr.String(), "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want 1 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

// The reference's TRACING_* map to the tracing flags when TRACING_ENABLED is true, and are
// said to do nothing otherwise, as the reference reads none of them then.
func TestReferenceEnvTracing(t *testing.T) {
	for _, tc := range []struct {
		env   map[string]string
		flags map[string]string
		notes []string
		err   string
	}{
		{
			env: gatewayTracingEnv("http://otel-collector.monitoring:4318", "0.5"),
			flags: map[string]string{"tracing": "true", "tracing-service-name": "envoy-ratelimit", "tracing-service-namespace": "envoy-gateway-system",
				"tracing-service-instance-id": "envoy-ratelimit-5b7d9c6f4-x2x8q", "tracing-sampling-rate": "0.5"},
			notes: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-collector.monitoring:4318"},
		},
		{
			// The reference's service name when none is given.
			env:   map[string]string{"TRACING_ENABLED": "1", "TRACING_EXPORTER_PROTOCOL": "grpc"},
			flags: map[string]string{"tracing": "true", "tracing-service-name": "RateLimit", "tracing-protocol": "grpc"},
		},
		{
			env:   map[string]string{"TRACING_ENABLED": "false", "TRACING_SERVICE_NAME": "x", "TRACING_SAMPLING_RATE": "100", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
			notes: []string{"TRACING_ENABLED=false", "TRACING_SERVICE_NAME=x", "TRACING_SAMPLING_RATE=100"},
		},
		{
			// Not a number at all: the reference reads it as one even without tracing, and
			// refuses it at start.
			env: map[string]string{"TRACING_ENABLED": "false", "TRACING_SAMPLING_RATE": "abc"},
			err: `$TRACING_SAMPLING_RATE="abc": not a number`,
		},
		{
			env: map[string]string{"TRACING_ENABLED": "true", "TRACING_EXPORTER_PROTOCOL": "udp", "TRACING_SAMPLING_RATE": "100"},
			err: `$TRACING_EXPORTER_PROTOCOL="udp": not http or grpc` + "\n" + `$TRACING_SAMPLING_RATE="100": not a fraction from 0 to 1`,
		},
		{
			env: map[string]string{"TRACING_ENABLED": "yes"},
			err: `$TRACING_ENABLED="yes": not true or false`,
		},
	} {
		effects, err := referenceEnv(lookupIn(tc.env))
		if tc.err != "" || err != nil {
			if err == nil || err.Error() != tc.err {
				t.Errorf("%v: error\n%v\nwant\n%s", tc.env, err, tc.err)
			}
			continue
		}
		flags := map[string]string{}
		var notes []string
		for _, e := range effects {
			if e.Flag == "config" && e.Value == referenceConfigDir || e.Flag == "config-every-file" {
				continue // the reference's default directory, read as it reads it (TestReferenceEnvConfigDir)
			}
			if e.Flag != "" {
				flags[e.Flag] = e.Value
			} else {
				notes = append(notes, e.Var)
			}
		}
		if fmt.Sprint(flags) != fmt.Sprint(tc.flags) && !(len(flags) == 0 && len(tc.flags) == 0) {
			t.Errorf("%v: flags %v, want %v", tc.env, flags, tc.flags)
		}
		for _, n := range tc.notes {
			if !strings.Contains(strings.Join(notes, " "), n) {
				t.Errorf("%v: notes %v, want %s", tc.env, notes, n)
			}
		}
	}
}
