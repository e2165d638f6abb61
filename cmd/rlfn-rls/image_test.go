package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
)

// The image is built from the repository (FROM scratch, the static binary), runs as nobody
// against a real Valkey, answers Envoy's protocol, serves its metrics, and stops cleanly on
// SIGTERM (docker stop).
func TestImage(t *testing.T) {
	harness.Require(t, harness.ValkeyImage())
	tag := fmt.Sprintf("rlfn/rlfn-rls:test-%d", time.Now().UnixNano())
	build := exec.Command("bash", "../../scripts/build-rls-image.sh", tag)
	if out, err := build.CombinedOutput(); err != nil {
		harness.Unavailable(t, "the service's image", fmt.Errorf("%v\n%s", err, out))
	}
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "-f", tag).Run() })

	srv := harness.StartValkey(t)
	vk := srv.Client(t)
	if err := vk.Do(context.Background(), vk.B().FunctionLoad().Replace().FunctionCode(functions.Source).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// The container runs as nobody: the mounted configuration must be readable by all.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {algorithm: token_bucket, unit: minute, requests_per_unit: 60, burst: 2}\n"
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ports := make([]int, 2)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	name := strings.NewReplacer("/", "-", ":", "-").Replace(tag)
	out, err := exec.Command("docker", "run", "-d", "--name", name, "--network", "host", "-v", dir+":/config:ro", tag,
		"--url", "redis://"+srv.Addr, "--config", "/config",
		"--grpc", fmt.Sprintf("127.0.0.1:%d", ports[0]), "--http", fmt.Sprintf("127.0.0.1:%d", ports[1])).CombinedOutput()
	if err != nil {
		t.Fatalf("docker run: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("docker", "rm", "-f", name).Run() })
	logs := func() string {
		out, _ := exec.Command("docker", "logs", name).CombinedOutput()
		return string(out)
	}
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", ports[0]), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pb.NewRateLimitServiceClient(conn)
	req := &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u"}}}}}
	var codes []pb.RateLimitResponse_Code
	deadline := time.Now().Add(20 * time.Second)
	for len(codes) < 3 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := c.ShouldRateLimit(ctx, req)
		cancel()
		if err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("the container never answered: %v\n%s", err, logs())
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		codes = append(codes, resp.OverallCode)
	}
	if codes[0] != pb.RateLimitResponse_OK || codes[1] != pb.RateLimitResponse_OK || codes[2] != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a token bucket of 2 answered %v", codes)
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[1]))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`rlfn_rls_requests_total{code="over_limit",domain="edge"`, `rlfn_rls_descriptors_total{descriptor="edge.user",domain="edge"`, `outcome="over_limit"`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics has no %s:\n%s", want, body)
		}
	}
	if out, err := exec.Command("docker", "stop", "-t", "10", name).CombinedOutput(); err != nil {
		t.Fatalf("docker stop: %v\n%s", err, out)
	}
	code, err := exec.Command("docker", "inspect", "-f", "{{.State.ExitCode}}", name).Output()
	if err != nil || strings.TrimSpace(string(code)) != "0" {
		t.Fatalf("exit code %q after SIGTERM (%v)\n%s", code, err, logs())
	}
	if l := logs(); !strings.Contains(l, `"msg":"shutting down"`) {
		t.Errorf("no graceful shutdown in the logs:\n%s", l)
	}

	imageAsEnvoyGateway(t, tag, srv.Addr)
}

// imageAsEnvoyGateway runs the image as Envoy Gateway's rate limit Deployment does: its
// command, /bin/ratelimit (the reference's binary), replacing the entrypoint with no
// arguments; its environment alone (envoyGatewayEnv: the xDS server over mutual TLS, Redis,
// the certificates mounted read-only at /certs); as nobody. Before any configuration it is
// healthy (Envoy Gateway's startupProbe on /healthcheck), then serves the configuration the
// xDS server pushes to Envoy over TLS, and stops cleanly.
func imageAsEnvoyGateway(t *testing.T, tag, redisAddr string) {
	sec := newGatewaySecret(t)
	ca, certs, xds := sec.ca, sec.dir, sec.xds

	ports := harness.FreePorts(t, 3)
	name := strings.NewReplacer("/", "-", ":", "-").Replace(tag) + "-gateway"
	args := []string{"run", "-d", "--name", name, "--network", "host", "--user", "65534:65534", "--read-only",
		"-v", certs + ":/certs:ro", "--entrypoint", "/bin/ratelimit"}
	for k, v := range envoyGatewayEnv(redisAddr, xds.Addr, "/certs", ports) {
		args = append(args, "-e", k+"="+v)
	}
	// Removed even when it was created but did not start (no /bin/ratelimit).
	t.Cleanup(func() { _ = exec.Command("docker", "rm", "-f", name).Run() })
	if out, err := exec.Command("docker", append(args, tag)...).CombinedOutput(); err != nil {
		t.Fatalf("docker run: %v\n%s", err, out)
	}
	logs := func() string {
		out, _ := exec.Command("docker", "logs", name).CombinedOutput()
		return string(out)
	}
	health := func() int {
		resp, err := http.Get(fmt.Sprint("http://127.0.0.1:", ports[0], "/healthcheck"))
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for deadline := time.Now().Add(30 * time.Second); health() != http.StatusOK; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Envoy Gateway's startupProbe would never pass: health %d\n%s", health(), logs())
		}
	}
	xds.Set(t, &rlsconfv3.RateLimitConfig{Name: "first-listener", Domain: "first-listener", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key: "first-route", Value: "first-route",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "rule-0-match-0", RateLimit: &rlsconfv3.RateLimitPolicy{RequestsPerUnit: 5, Unit: rlsconfv3.RateLimitUnit_HOUR}}},
	}}})
	conn, err := grpc.NewClient(fmt.Sprint("127.0.0.1:", ports[1]), grpc.WithTransportCredentials(credentials.NewTLS(ca.ClientConfig())))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := &pb.RateLimitRequest{Domain: "first-listener", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{
		{Key: "first-route", Value: "first-route"}, {Key: "rule-0-match-0", Value: fmt.Sprint("user-", time.Now().UnixNano())}}}}}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
		cancel()
		if err == nil && resp.OverallCode == pb.RateLimitResponse_OK && resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pushed configuration was never served: %v %v\n%s", resp, err, logs())
		}
	}
	if out, err := exec.Command("docker", "stop", "-t", "10", name).CombinedOutput(); err != nil {
		t.Fatalf("docker stop: %v\n%s", err, out)
	}
	code, err := exec.Command("docker", "inspect", "-f", "{{.State.ExitCode}}", name).Output()
	if err != nil || strings.TrimSpace(string(code)) != "0" {
		t.Fatalf("exit code %q after SIGTERM (%v)\n%s", code, err, logs())
	}
}
