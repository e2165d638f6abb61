package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/rls"
	"github.com/rlfn/rlfn/versions"
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
		{[]string{"--config", filepath.Join(dir, "none")}, "--config: stat " + filepath.Join(dir, "none") + ": no such file or directory"},
		{[]string{"--config", good, "--headers", "all"}, `--headers "all": one of none, reference, draft`},
		{[]string{"--config", good, "--fallback", "maybe"}, `--fallback: "maybe" is not one of`},
		{[]string{"--config", good, "--policy", "d"}, `--policy "d": want domain:fallback=...,deadline=...`},
		// A policy's commas are its own, not a list's.
		{[]string{"--config", good, "--policy", "d:fallback=fail_open,deadline=-1s"}, `--policy "d:fallback=fail_open,deadline=-1s": deadline "-1s" is not a positive duration`},
		{[]string{"--config", good, "--url", "http://x"}, "the scheme must be redis, valkey, rediss or valkeys"},
		{[]string{"--config", good, "--url", "127.0.0.1:7442"}, `URL "127.0.0.1:7442" has no scheme: write redis://HOST:PORT`},
		{[]string{"--config", good, "--log-level", "loud"}, "--log-level"},
		{[]string{}, "--config is required: a configuration file or directory"},
		// Numbers the service cannot use, refused by their flag's name rather than taken
		// for a default or named by the client's option.
		{[]string{"--config", good, "--max-in-flight", "-1"}, "--max-in-flight -1: must be 1 or more"},
		{[]string{"--config", good, "--instances", "0"}, "--instances 0: must be 1 or more"},
		{[]string{"--config", good, "--max-request-bytes", "0"}, "--max-request-bytes 0: must be 1 or more"},
		{[]string{"--config", good, "--max-descriptors", "0"}, "--max-descriptors 0: must be 1 or more"},
		{[]string{"--config", good, "--max-entries", "-3"}, "--max-entries -3: must be 1 or more"},
		{[]string{"--config", good, "--max-value-bytes", "0"}, "--max-value-bytes 0: must be 1 or more"},
		{[]string{"--config", good, "--denial-cache", "-5"}, "--denial-cache -5: must be 0 (off) or more"},
		{[]string{"--config", good, "--deadline", "0s"}, "--deadline 0s: must be more than 0"},
		{[]string{"--config", good, "--deadline", "-1s"}, "--deadline -1s: must be more than 0"},
		{[]string{"--config", good, "--check-every", "0s"}, "--check-every 0s: must be more than 0"},
		{[]string{"--config", good, "--shutdown-timeout", "-1s"}, "--shutdown-timeout -1s: must be more than 0"},
		{[]string{"--config", good, "--max-connection-age", "-1s"}, "--max-connection-age -1s: must be more than 0"},
		{[]string{"--config", good, "--url", "rediss://127.0.0.1:1", "--tls-cert", good}, "--tls-cert and --tls-key go together"},
		{[]string{"--config", good, "--tls-cert", good, "--tls-key", good}, "--tls-cert needs a rediss:// or valkeys:// URL"},
		{[]string{"--config", good, "--url", "rediss://127.0.0.1:1", "--tls-cert", good, "--tls-key", good}, "--tls-cert, --tls-key: tls: failed to find any PEM data in certificate input"},
		{[]string{"--config", good, "--metrics-path", "/stats"}, "--metrics-path needs --metrics, the listener it is the path on"},
		{[]string{"--config", good, "--metrics", "127.0.0.1:0", "--metrics-path", "stats"}, `--metrics-path "stats": a URL path, starting with /`},
		// The gRPC listener's TLS errors name their flags.
		{[]string{"--config", good, "--grpc-tls-cert", good, "--grpc-tls-key", good, "--grpc-tls-client-san", "envoy"}, "--grpc-tls-client-san needs --grpc-tls-client-ca: a client's name is checked in the certificate that CA signed"},
		{[]string{"--config", good, "--grpc-tls-cert", good, "--grpc-tls-key", good}, "--grpc-tls-cert, --grpc-tls-key: the gRPC listener's certificate: tls: failed to find any PEM data"},
		{[]string{"--config", good, "--bogus"}, "flag provided but not defined: -bogus (see rlfn-rls --help)"},
		// A value its flag cannot parse: one line and the reason, not "parse error" and the help.
		{[]string{"--config", good, "--deadline", "100"}, `--deadline "100": missing unit in duration "100"; write a duration with its unit`},
		{[]string{"--config", good, "--max-in-flight", "x"}, `--max-in-flight "x": not a whole number`},
		{[]string{"--config", good, "--shadow-mode=maybe"}, `--shadow-mode="maybe": not true or false`},
		// Two policies for one domain: neither wins silently.
		{[]string{"--config", good, "--policy", "d:fallback=fail_closed", "--policy", "d:fallback=fail_open"}, `--policy "d:fallback=fail_open": the domain "d" has a policy already, "d:fallback=fail_closed": give each domain one`},
		// A policy for a domain no file has (a misspelling) would leave the domain meant on
		// --fallback.
		{[]string{"--config", good, "--policy", "e:fallback=fail_closed"}, `--policy "e:fallback=fail_closed": no configuration has the domain "e" (it has d)`},
		// No server at start (port 1 on loopback refuses at once): said, the password not.
		{[]string{"--config", good, "--url", "redis://u:secret@127.0.0.1:1"}, "connecting to redis://u:xxxxx@127.0.0.1:1: dial tcp 127.0.0.1:1: connect: connection refused"},
	} {
		var stderr bytes.Buffer
		code := run(append([]string{"rlfn-rls"}, tc.args...), &stderr)
		if code != 1 || !strings.Contains(stderr.String(), tc.want) || strings.Contains(stderr.String(), "secret") || strings.Count(stderr.String(), "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want 1 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

// A start-up error names the flag whose value failed, and the reference's variables when they
// set it: a configuration directory that is not there, a listener's port in use.
func TestStartErrorsNameFlags(t *testing.T) {
	t.Run("RUNTIME_ROOT", func(t *testing.T) {
		root := filepath.Join(t.TempDir(), "none")
		t.Setenv("RUNTIME_ROOT", root)
		var stderr bytes.Buffer
		want := "rlfn-rls: --config ($RUNTIME_ROOT): stat " + filepath.Join(root, "config") + ": no such file or directory\n"
		if code := run([]string{"rlfn-rls"}, &stderr); code != 1 || !strings.HasSuffix(stderr.String(), "\n"+want) {
			t.Errorf("exit %d, stderr %q; want 1 and %q", code, stderr.String(), want)
		}
	})
	// The listeners open once the server answers.
	url, dir, _ := startStalled(t, "d")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"--grpc", addr, "--http", ""}, want: "--grpc: listen tcp " + addr + ": bind: address already in use"},
		{args: []string{"--grpc", "127.0.0.1:0", "--http", addr}, want: "--http: listen tcp " + addr + ": bind: address already in use"},
		{args: []string{"--http", ""}, env: map[string]string{"GRPC_HOST": "127.0.0.1", "GRPC_PORT": port},
			want: "--grpc ($GRPC_HOST, $GRPC_PORT): listen tcp " + addr + ": bind: address already in use"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stderr bytes.Buffer
			if code := run(append([]string{"rlfn-rls", "--url", url, "--config", dir}, tc.args...), &stderr); code != 1 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want 1 and %q", code, stderr.String(), tc.want)
			}
		})
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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := startApp(t, ctx, "--url", "rediss://"+srv.Addr, "--tls-ca", caFile, "--config", cfg)
	c := a.rls
	req := &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	for i, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
		resp, err := c.ShouldRateLimit(ctx, req)
		if err != nil || resp.OverallCode != want {
			t.Fatalf("request %d: %v %v", i, resp, err)
		}
	}
	cancel()
	if err := <-a.done; err != nil {
		t.Fatalf("serve: %v\n%s", err, a.stderr.String())
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

// app is the command running in-process on a loopback port of its own.
type app struct {
	rls    pb.RateLimitServiceClient
	health healthpb.HealthClient
	stderr *bytes.Buffer // written by the app until done
	done   chan error    // what the app returned, once ctx ended
}

// startApp runs the command with args (and its gRPC listener on loopback, no HTTP) until ctx
// ends, as SIGTERM ends it, and returns once its health is SERVING.
func startApp(t *testing.T, ctx context.Context, args ...string) *app {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	a := &app{stderr: &bytes.Buffer{}, done: make(chan error, 1)}
	go func() {
		a.done <- newApp(a.stderr).RunContext(ctx, append([]string{"rlfn-rls", "--grpc", addr, "--http", "", "--check-every", "100ms"}, args...))
	}()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	health := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
		select {
		case err := <-a.done:
			t.Fatalf("the app ended: %v\n%s", err, a.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("never SERVING: %v %v\n%s", resp, err, a.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	a.rls, a.health = pb.NewRateLimitServiceClient(conn), health
	return a
}

// policyConfig has one domain for each --policy of TestDomainPolicy, and one without.
const policyConfig = `
domain: %s
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 10}
`

// startStalled starts a Valkey with the library and configuration files for domains, and
// returns its URL, the files' directory and a function that holds the server's writes (every
// decision) for d, as a stalled backend does.
func startStalled(t *testing.T, domains ...string) (url, dir string, stall func(d time.Duration)) {
	t.Helper()
	harness.Require(t, harness.ValkeyImage())
	srv := harness.StartValkey(t)
	vk := srv.Client(t)
	if err := vk.Do(context.Background(), vk.B().FunctionLoad().Replace().FunctionCode(functions.Source).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	for _, d := range domains {
		if err := os.WriteFile(filepath.Join(dir, d+".yaml"), []byte(fmt.Sprintf(policyConfig, d)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stall = func(d time.Duration) {
		t.Helper()
		if err := vk.Do(context.Background(), vk.B().ClientPause().Timeout(d.Milliseconds()).Write().Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	return "redis://" + srv.Addr, dir, stall
}

func ask(ctx context.Context, c pb.RateLimitServiceClient, domain string) (*pb.RateLimitResponse, error) {
	return c.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
}

// Each --policy gives its domain its own fallback and deadline over the same connections:
// while the server stalls, a fail_open domain is admitted, a fail_closed one refused, the
// others get --fallback's gRPC error, and a domain with a longer deadline waits the stall out.
func TestDomainPolicy(t *testing.T) {
	url, dir, stall := startStalled(t, "open", "closed", "patient", "plain")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// In the environment, as a Kubernetes Deployment gives them: policies separated by
	// semicolons, each with its commas.
	t.Setenv("RLFN_RLS_POLICY", "open:fallback=fail_open,deadline=100ms;closed:deadline=100ms,fallback=fail_closed;patient:deadline=20s")
	a := startApp(t, ctx, "--url", url, "--config", dir, "--deadline", "200ms", "--fallback", "return_error")
	for _, d := range []string{"open", "closed", "patient", "plain"} {
		if resp, err := ask(ctx, a.rls, d); err != nil || resp.OverallCode != pb.RateLimitResponse_OK {
			t.Fatalf("%s before the stall: %v %v", d, resp, err)
		}
	}
	stall(3 * time.Second)
	if resp, err := ask(ctx, a.rls, "open"); err != nil || resp.OverallCode != pb.RateLimitResponse_OK {
		t.Errorf("open (fail_open): %v %v, want OK", resp, err)
	}
	if resp, err := ask(ctx, a.rls, "closed"); err != nil || resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
		t.Errorf("closed (fail_closed): %v %v, want OVER_LIMIT", resp, err)
	}
	if resp, err := ask(ctx, a.rls, "plain"); err == nil {
		t.Errorf("plain (--fallback return_error): %v, want a gRPC error", resp)
	}
	// patient keeps --fallback (no fallback= of its own) but waits for the server: decided
	// by it, its second unit of ten.
	if resp, err := ask(ctx, a.rls, "patient"); err != nil || resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 8 {
		t.Errorf("patient (deadline 20s): %v %v, want OK and 8 left", resp, err)
	}
	cancel()
	if err := <-a.done; err != nil {
		t.Fatalf("serve: %v\n%s", err, a.stderr.String())
	}
}

// SIGTERM waits --shutdown-timeout for the requests in flight; one still stalled then is cut,
// and the command says so and fails.
func TestShutdownTimeout(t *testing.T) {
	url, dir, stall := startStalled(t, "d")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := startApp(t, ctx, "--url", url, "--config", dir, "--deadline", "20s", "--shutdown-timeout", "300ms")
	stall(5 * time.Second)
	inFlight := make(chan error, 1)
	go func() {
		_, err := ask(context.Background(), a.rls, "d")
		inFlight <- err
	}()
	// The request reaches the server before the signal: the in-flight gauge would say so, but
	// the command has no HTTP here, and the request waits 5 s in any case.
	time.Sleep(500 * time.Millisecond)
	cancel()
	err := <-a.done
	if err == nil || err.Error() != "requests still in flight after --shutdown-timeout 300ms were cut" {
		t.Fatalf("serve: %v, want the requests cut", err)
	}
	if err := <-inFlight; err == nil {
		t.Fatal("the cut request was answered")
	}
}

// waitHealth waits until a's health is want.
func (a *app) waitHealth(t *testing.T, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := a.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
		if err == nil && resp.Status == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("health %v %v, want %v\n%s", resp.GetStatus(), err, want, a.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Health is SERVING while the server runs a release the configuration in use needs: 1.1.0
// serves fixed windows, not a calendar loaded later (until 1.2.0 is deployed); 1.0.0 serves
// nothing.
func TestHealthByRelease(t *testing.T) {
	harness.Require(t, harness.ValkeyImage())
	srv := harness.StartValkey(t)
	vk := srv.Client(t)
	load := func(version string) {
		t.Helper()
		r, ok := versions.Embedded().Find(version)
		if !ok {
			t.Fatalf("no release %s", version)
		}
		if err := vk.Do(context.Background(), vk.B().FunctionLoad().Replace().FunctionCode(r.Code).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	load("1.1.0")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(fmt.Sprintf(policyConfig, "a")), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := startApp(t, ctx, "--url", "redis://"+srv.Addr, "--config", dir) // SERVING on 1.1.0
	calendar := "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: calendar, unit: month, requests_per_unit: 5}\n"
	if err := os.WriteFile(filepath.Join(dir, "c.yaml"), []byte(calendar), 0o644); err != nil {
		t.Fatal(err)
	}
	a.waitHealth(t, healthpb.HealthCheckResponse_NOT_SERVING)
	load(versions.Embedded().Latest().Version)
	a.waitHealth(t, healthpb.HealthCheckResponse_SERVING)
	if err := os.Remove(filepath.Join(dir, "c.yaml")); err != nil {
		t.Fatal(err)
	}
	load("1.0.0")
	a.waitHealth(t, healthpb.HealthCheckResponse_NOT_SERVING)
	cancel()
	if err := <-a.done; err != nil {
		t.Fatalf("serve: %v\n%s", err, a.stderr.String())
	}
}

// --reconcile loads the newest embedded release onto a server that has none (a node joined
// after the last deploy): the service becomes SERVING by itself, and says so in its log.
func TestReconcileFlag(t *testing.T) {
	harness.Require(t, harness.ValkeyImage())
	srv := harness.StartValkey(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(fmt.Sprintf(policyConfig, "a")), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := startApp(t, ctx, "--url", "redis://"+srv.Addr, "--config", dir, "--reconcile") // SERVING: loaded
	cancel()
	if err := <-a.done; err != nil {
		t.Fatalf("serve: %v\n%s", err, a.stderr.String())
	}
	if log := a.stderr.String(); !strings.Contains(log, `"msg":"library loaded"`) || !strings.Contains(log, `"component":"reconciler"`) ||
		!strings.Contains(log, `"release":"`+versions.Embedded().Latest().Version+`"`) {
		t.Errorf("the log does not say the reconciler loaded the library:\n%s", log)
	}
}

// --max-request-bytes reaches gRPC: a request of 17 values of 4,000 bytes (68 KB, over the
// 64 KiB default) is decided under --max-request-bytes 70000, and one of 18 (72 KB) is refused
// from its length, RESOURCE_EXHAUSTED naming both sizes.
func TestMaxRequestBytes(t *testing.T) {
	url, dir, _ := startStalled(t, "edge")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := startApp(t, ctx, "--url", url, "--config", dir, "--max-request-bytes", "70000")
	req := func(n int) *pb.RateLimitRequest {
		r := &pb.RateLimitRequest{Domain: "edge"}
		for range n {
			r.Descriptors = append(r.Descriptors, &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "unlimited", Value: strings.Repeat("v", 4000)}}})
		}
		return r
	}
	if size := proto.Size(req(17)); size <= rls.DefaultMaxRequestBytes || size > 70000 {
		t.Fatalf("17 values are %d bytes", size)
	}
	if resp, err := a.rls.ShouldRateLimit(ctx, req(17)); err != nil || resp.OverallCode != pb.RateLimitResponse_OK {
		t.Errorf("68 KB: %v %v, want OK", resp, err)
	}
	big := req(18)
	_, err := a.rls.ShouldRateLimit(ctx, big)
	if want := fmt.Sprintf("larger than max (%d vs. 70000)", proto.Size(big)); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), want) {
		t.Errorf("72 KB: %v, want RESOURCE_EXHAUSTED %q", err, want)
	}
	cancel()
	if err := <-a.done; err != nil {
		t.Fatalf("serve: %v\n%s", err, a.stderr.String())
	}
}

// Durations are logged as Go writes them, not as nanoseconds: rlfn-rls's own lines (the xDS
// retry's wait) and the client's, which it hands this logger (the breaker's cooldown), in a
// group too.
func TestLogDurations(t *testing.T) {
	var out bytes.Buffer
	log := newLogger(&out, slog.LevelInfo)
	log.Warn("x", "retry_in", 6939497758*time.Nanosecond, slog.Duration("cooldown", time.Second), slog.Group("g", slog.Duration("d", 50*time.Millisecond)), "n", 7)
	for _, want := range []string{`"retry_in":"6.939497758s"`, `"cooldown":"1s"`, `"g":{"d":"50ms"}`, `"n":7`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %s in %s", want, &out)
		}
	}
}
