package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
)

// --deadline holds while the server hangs (docker pause: its kernel takes connections and
// bytes, nothing answers), past the time valkey-go takes to give its connection up (~10 s):
// it then opens another, and every call to the node waits for that, which without a bound of
// its own is a background call's (the health check's 5 s) or valkey-go's 5 s dial timeout.
// With --fallback fail_open every answer must come from the fallback within about the
// deadline, not after Envoy's own timeout decided. The bound asserted (1 s, ten times the
// deadline) is the behaviour's, not a speed figure: the failure it catches is 1-5 s.
func TestDeadlineHoldsWhileServerHangs(t *testing.T) {
	harness.Require(t, harness.ValkeyImage())
	srv := harness.StartValkey(t)
	vk := srv.Client(t)
	if err := vk.Do(context.Background(), vk.B().FunctionLoad().Replace().FunctionCode(functions.Source).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "d.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The health check's own bound (--check-every, 5 s) is the longest a background call
	// waits: startApp's 100ms would hide the failure.
	a := startApp(t, ctx, "--url", "redis://"+srv.Addr, "--config", dir, "--fallback", "fail_open", "--check-every", "5s")
	if resp, err := ask(ctx, a.rls, "d"); err != nil || resp.OverallCode != pb.RateLimitResponse_OK {
		t.Fatalf("before the stall: %v %v", resp, err)
	}
	if err := srv.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	paused := true
	defer func() {
		if paused {
			_ = srv.Unpause(context.Background())
		}
	}()
	const stall, bound = 16 * time.Second, time.Second
	var worst time.Duration
	var slow, n int
	for start := time.Now(); time.Since(start) < stall; n++ {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		t0 := time.Now()
		resp, err := ask(rctx, a.rls, "d")
		took := time.Since(t0)
		rcancel()
		if err != nil || resp.OverallCode != pb.RateLimitResponse_OK {
			t.Fatalf("%s into the stall: %v %v, want OK (fail_open)", time.Since(start).Round(time.Millisecond), resp, err)
		}
		worst = max(worst, took)
		if took > bound {
			slow++
			t.Logf("%s into the stall: answered in %s", time.Since(start).Round(time.Millisecond), took.Round(time.Millisecond))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d requests over %s of stall, the slowest answered in %s", n, stall, worst.Round(time.Millisecond))
	if slow > 0 {
		t.Errorf("%d of %d answers took more than %s (the slowest %s) with --deadline 100ms", slow, n, bound, worst.Round(time.Millisecond))
	}
	if err := srv.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	paused = false
	cancel()
	if err := <-a.done; err != nil {
		t.Fatalf("serve: %v\n%s", err, a.stderr.String())
	}
}

// A TLS URL to a server without TLS (the reference's REDIS_TLS=true on a plain port): the
// server never answers the handshake, and the start-up error says that, not only "context
// deadline exceeded".
func TestTLSToPlainServer(t *testing.T) {
	harness.Require(t, harness.ValkeyImage())
	srv := harness.StartValkey(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "d.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	code := run([]string{"rlfn-rls", "--url", "rediss://" + srv.Addr, "--config", dir, "--grpc", "127.0.0.1:0", "--http", ""}, &stderr)
	want := "the TLS handshake with " + srv.Addr + " did not complete within 100ms (does the server speak TLS on that port?)"
	if code != 1 || !strings.Contains(stderr.String(), want) {
		t.Errorf("exit %d, stderr %q; want 1 and %q", code, stderr.String(), want)
	}
}
