package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// get returns the status and body of a GET of url, 0 when nothing answers.
func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// --metrics serves the metrics on a listener of their own at --metrics-path, and nothing
// else there; the listener is closed on shutdown; a port in use stops the start.
func TestMetricsListener(t *testing.T) {
	url, dir, _ := startStalled(t, "m")
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := held.Addr().String()
	held.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := startApp(t, ctx, "--url", url, "--config", dir, "--metrics", addr, "--metrics-path", "/stats/prometheus")
	req := &pb.RateLimitRequest{Domain: "m", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	if _, err := a.rls.ShouldRateLimit(ctx, req); err != nil {
		t.Fatal(err)
	}
	code, body := get("http://" + addr + "/stats/prometheus")
	if code != http.StatusOK || !strings.Contains(body, `rlfn_rls_requests_total{`) || !strings.Contains(body, `domain="m"`) {
		t.Fatalf("--metrics-path: %d\n%s", code, body)
	}
	for _, path := range []string{"/metrics", "/healthcheck", "/json"} {
		if code, _ := get("http://" + addr + path); code != http.StatusNotFound {
			t.Errorf("%s on the metrics listener: %d, want 404", path, code)
		}
	}
	// Its address is in the start's log line.
	if !strings.Contains(a.stderr.String(), `"metrics":"`+addr+`/stats/prometheus"`) {
		t.Errorf("the log does not say where the metrics are:\n%s", a.stderr.String())
	}

	// A second service on the same port stops at start, naming the flag.
	var out bytes.Buffer
	if code := run([]string{"rlfn-rls", "--url", url, "--config", dir, "--grpc", "127.0.0.1:0", "--http", "", "--metrics", addr}, &out); code != 1 ||
		!strings.Contains(out.String(), fmt.Sprintf("--metrics: listen tcp %s: bind: address already in use", addr)) {
		t.Errorf("a port in use: exit %d, %q", code, out.String())
	}

	cancel()
	if err := <-a.done; err != nil {
		t.Fatalf("serve: %v\n%s", err, a.stderr.String())
	}
	if code, _ := get("http://" + addr + "/stats/prometheus"); code != 0 {
		t.Errorf("the metrics listener still answers after shutdown: %d", code)
	}
}
