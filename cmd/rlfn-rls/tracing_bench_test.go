package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
)

// BenchmarkTracingDecision is one ShouldRateLimit after another, over gRPC on loopback, to
// the command in-process against a Valkey: without tracing (the default, which must cost a
// decision nothing), with tracing at rate 0 (spans started but not sampled), and at rate 1
// with each request in a sampled trace of Envoy's, sent to an OTLP receiver in the test. The
// allocations are the whole round trip's, client and Valkey client included.
func BenchmarkTracingDecision(b *testing.B) {
	harness.Require(b, harness.ValkeyImage())
	srv := harness.StartValkey(b)
	vk := srv.Client(b)
	if err := vk.Do(context.Background(), vk.B().FunctionLoad().Replace().FunctionCode(functions.Source).Build()).Error(); err != nil {
		b.Fatal(err)
	}
	cfg := filepath.Join(b.TempDir(), "rl.yaml")
	// A limit never reached: every decision is the same admission.
	if err := os.WriteFile(cfg, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000000000}\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	recv := startReceiver(b, "grpc")
	for _, tc := range []struct {
		name   string
		args   []string
		parent bool
	}{
		{"off", nil, false},
		{"rate0", []string{"--tracing", "--tracing-protocol", "grpc", "--tracing-sampling-rate", "0"}, false},
		{"rate1-sampled-parent", []string{"--tracing", "--tracing-protocol", "grpc"}, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.endpoint)
			c := benchApp(b, append([]string{"--url", "redis://" + srv.Addr, "--config", cfg, "--deadline", "5s", "--log-level", "error"}, tc.args...)...)
			req := &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
			ctx := context.Background()
			if tc.parent {
				h, _, _ := traceparent(true)
				ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", h)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				resp, err := c.ShouldRateLimit(ctx, req)
				if err != nil || resp.OverallCode != pb.RateLimitResponse_OK {
					b.Fatal(resp, err)
				}
			}
		})
	}
}

// benchApp runs the command with args on a loopback port until the benchmark ends, and
// returns a client once it is SERVING.
func benchApp(b *testing.B, args ...string) pb.RateLimitServiceClient {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var out harness.Buffer
	go func() {
		done <- newApp(&out).RunContext(ctx, append([]string{"rlfn-rls", "--grpc", addr, "--http", "", "--check-every", "1m"}, args...))
	}()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("serve: %v\n%s", err, out.String())
		}
	})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	health := healthpb.NewHealthClient(conn)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("never SERVING: %v %v\n%s", resp, err, out.String())
		}
	}
	return pb.NewRateLimitServiceClient(conn)
}
