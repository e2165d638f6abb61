package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/rls"
)

// Bad flags and a bad configuration stop the service before it serves, saying why.
func TestStartErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", bad}, bad + ": invalid rate limit unit 'fortnight'"},
		{[]string{"--config", filepath.Join(dir, "none")}, "no such file"},
		{[]string{"--config", good, "--headers", "all"}, `--headers "all": one of none, reference, draft`},
		{[]string{"--config", good, "--fallback", "maybe"}, `--fallback: "maybe" is not one of`},
		{[]string{"--config", good, "--policy", "d"}, `--policy "d": want domain:fallback=...,deadline=...`},
		{[]string{"--config", good, "--policy", "d:deadline=-1s"}, `deadline "-1s" is not a positive duration`},
		{[]string{"--config", good, "--url", "http://x"}, "the scheme must be redis, valkey, rediss or valkeys"},
		{[]string{"--config", good, "--log-level", "loud"}, "--log-level"},
		{[]string{}, `Required flag "config" not set`},
	} {
		var stderr bytes.Buffer
		code := run(append([]string{"rlfn-rls"}, tc.args...), &stderr)
		if code != 1 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 1 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	d, p, err := parsePolicy("api:fallback=fail_open,deadline=50ms")
	if err != nil || d != "api" || p != (rls.Policy{Deadline: 50 * time.Millisecond, Fallback: client.FailOpen, HasFallback: true}) {
		t.Fatalf("%q %+v %v", d, p, err)
	}
	if _, _, err := parsePolicy("api:speed=1"); err == nil {
		t.Fatal("unknown setting accepted")
	}
}

// The whole command in-process, against a Valkey that speaks TLS only: it serves Envoy's
// protocol and health until its context ends, then shuts down cleanly.
func TestServeTLS(t *testing.T) {
	harness.Require(t, harness.ValkeyImage())
	ca, err := harness.NewTLS()
	if err != nil {
		t.Fatal(err)
	}
	srv := harness.StartValkeyTLS(t, ca)
	vk := srv.Client(t)
	if err := vk.Do(context.Background(), vk.B().FunctionLoad().Replace().FunctionCode(functions.Source).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	cfg := filepath.Join(dir, "rl.yaml")
	if err := os.WriteFile(caFile, ca.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- newApp(&stderr).RunContext(ctx, []string{"rlfn-rls", "--url", "rediss://" + srv.Addr, "--tls-ca", caFile,
			"--config", cfg, "--grpc", addr, "--http", "", "--check-every", "100ms"})
	}()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never SERVING: %v %v\n%s", resp, err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	c := pb.NewRateLimitServiceClient(conn)
	req := &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	for i, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
		resp, err := c.ShouldRateLimit(ctx, req)
		if err != nil || resp.OverallCode != want {
			t.Fatalf("request %d: %v %v", i, resp, err)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v\n%s", err, stderr.String())
	}
	// A TLS URL's CA is required to be a PEM file; a plain URL takes none.
	for _, tc := range []struct{ url, ca, want string }{
		{"redis://" + srv.Addr, caFile, "--tls-ca needs a rediss:// or valkeys:// URL"},
		{"rediss://" + srv.Addr, cfg, "--tls-ca: no PEM certificate in " + cfg},
	} {
		var out bytes.Buffer
		if code := run([]string{"rlfn-rls", "--url", tc.url, "--tls-ca", tc.ca, "--config", cfg}, &out); code != 1 || !strings.Contains(out.String(), tc.want) {
			t.Errorf("%s %s: %d %q", tc.url, tc.ca, code, out.String())
		}
	}
}
