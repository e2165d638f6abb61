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
	"google.golang.org/grpc"
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
}
