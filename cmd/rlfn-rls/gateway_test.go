package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
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
	"github.com/valkey-io/valkey-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/envoyconf/reference"
	"github.com/rlfn/rlfn/internal/harness"
)

// gatewayConfig is the RateLimitConfig Envoy Gateway's translator generates (its testdata
// out/ratelimit-config, distinct-match, multiple-rules, masked-remote-address-match) for a
// BackendTrafficPolicy with a global limit on the route first-route of first-listener: rule 0,
// perUser an hour for each distinct x-user-id; rule 1, 3 an hour for x-org-id: acme; and on
// second-route, 2 an hour for clients in 192.168.0.0/16. The unit is an hour rather than the
// testdata's second, so that a sequence runs within one window.
func gatewayConfig(perUser uint32) *rlsconfv3.RateLimitConfig {
	hour := func(n uint32) *rlsconfv3.RateLimitPolicy {
		return &rlsconfv3.RateLimitPolicy{RequestsPerUnit: n, Unit: rlsconfv3.RateLimitUnit_HOUR}
	}
	return &rlsconfv3.RateLimitConfig{
		Name:   "first-listener",
		Domain: "first-listener",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "first-route", Value: "first-route", Descriptors: []*rlsconfv3.RateLimitDescriptor{
				{Key: "rule-0-match-0", Value: "", RateLimit: hour(perUser)},
				{Key: "rule-1-match-0", Value: "rule-1-match-0", RateLimit: hour(3)},
			}},
			{Key: "second-route", Value: "second-route", Descriptors: []*rlsconfv3.RateLimitDescriptor{
				{Key: "masked_remote_address", Value: "192.168.0.0/16", RateLimit: hour(2)},
			}},
		},
	}
}

// gatewayDescriptor is a descriptor as Envoy sends it for one of gatewayConfig's rules.
func gatewayDescriptor(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// userRequest is Envoy's request on first-route for user, with the org rule's descriptor
// when the request matched it.
func userRequest(user string, org bool) *pb.RateLimitRequest {
	req := &pb.RateLimitRequest{Domain: "first-listener", Descriptors: []*rlv3.RateLimitDescriptor{
		gatewayDescriptor("first-route", "first-route", "rule-0-match-0", user)}}
	if org {
		req.Descriptors = append(req.Descriptors, gatewayDescriptor("first-route", "first-route", "rule-1-match-0", "rule-1-match-0"))
	}
	return req
}

// gatewayService is one rate limit service process started with Envoy Gateway's environment.
type gatewayService struct {
	name    string
	rls     pb.RateLimitServiceClient
	metrics string // PROMETHEUS_ADDR's URL
	out     *harness.Buffer
	exited  <-chan struct{} // closed when the process has ended
}

func (s *gatewayService) ask(req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.rls.ShouldRateLimit(ctx, req)
}

// startGatewayService runs bin with env() (and the test's own environment under it), stopped
// when the test ends, and returns a client of its gRPC listener speaking TLS as Envoy does
// under Envoy Gateway: trusting the CA, presenting the same certificate. env picks its ports
// with harness.FreePorts, and a start whose port was taken before the process bound it is
// made again on fresh ones (harness.RetryTakenPort).
func startGatewayService(t *testing.T, name, bin string, env func() map[string]string, clientTLS *tls.Config) *gatewayService {
	t.Helper()
	var s *gatewayService
	var grpcAddr string
	harness.RetryTakenPort(t, name, func() (bool, string) {
		e := env()
		cmd := exec.Command(bin)
		cmd.Env = os.Environ()
		for k, v := range e {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		s = &gatewayService{name: name, metrics: "http://" + e["PROMETHEUS_ADDR"] + "/metrics"}
		s.out, s.exited = harness.StartProcess(t, cmd)
		grpcAddr = e["GRPC_HOST"] + ":" + e["GRPC_PORT"]
		return listening(s, grpcAddr), s.out.String()
	})
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s.rls = pb.NewRateLimitServiceClient(conn)
	return s
}

// listening waits until addr takes a TCP connection, and says false if s ends first (or
// has not listened in a minute).
func listening(s *gatewayService, addr string) bool {
	for start := time.Now(); time.Since(start) < time.Minute; time.Sleep(5 * time.Millisecond) {
		select {
		case <-s.exited:
			return false
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return true
		}
	}
	return false
}

// outTail is how much of a service's output a failure shows, from its end (where it says why
// it stopped): its start logs a line per variable of Envoy Gateway's environment, several
// thousand bytes.
const outTail = 6000

// waitGatewayLimit asks s with fresh users until rule 0's limit is n, and says how long it
// took.
func waitGatewayLimit(t *testing.T, s *gatewayService, n uint32) time.Duration {
	t.Helper()
	start := time.Now()
	for i := 0; ; i++ {
		resp, err := s.ask(userRequest(fmt.Sprintf("probe-%d-%d-%d", start.UnixNano(), n, i), false))
		if err == nil && len(resp.Statuses) == 1 && resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() == n {
			return time.Since(start)
		}
		select {
		case <-s.exited:
			t.Fatalf("%s ended:\n%s", s.name, s.out.Tail(outTail))
		default:
		}
		if time.Since(start) > 60*time.Second {
			t.Fatalf("%s: the limit never became %d: %v %v\n%s", s.name, n, resp, err, s.out.Tail(outTail))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// gatewayDiff compares two responses field by field: every field of the message equal, but
// each status's duration_until_reset, equal within a second (the two answer a moment apart).
func gatewayDiff(want, got *pb.RateLimitResponse) string {
	want, got = proto.Clone(want).(*pb.RateLimitResponse), proto.Clone(got).(*pb.RateLimitResponse)
	var d []string
	if len(want.Statuses) == len(got.Statuses) {
		for i, w := range want.Statuses {
			g := got.Statuses[i]
			if (w.DurationUntilReset == nil) != (g.DurationUntilReset == nil) ||
				w.DurationUntilReset != nil && (w.DurationUntilReset.Seconds-g.DurationUntilReset.Seconds > 1 || g.DurationUntilReset.Seconds-w.DurationUntilReset.Seconds > 1) {
				d = append(d, fmt.Sprintf("statuses[%d].duration_until_reset %v, reference %v", i, g.DurationUntilReset, w.DurationUntilReset))
			}
			w.DurationUntilReset, g.DurationUntilReset = nil, nil
		}
	}
	if !proto.Equal(want, got) {
		d = append(d, fmt.Sprintf("rlfn-rls  %s\nreference %s", protojson.Format(got), protojson.Format(want)))
	}
	return strings.Join(d, "\n")
}

// Envoy Gateway's rate limit Deployment, its image swapped: rlfn-rls and the reference, each
// started as a process with nothing but the environment Envoy Gateway renders for that
// Deployment (its testdata default.yaml, and redis-tls-settings.yaml for Redis over TLS with
// a client certificate) and pointed at one go-control-plane xDS server over mutual TLS,
// serving the RateLimitConfig Envoy Gateway generates, answer Envoy's requests over TLS the
// same, field by field; a configuration pushed over xDS is served by both (rlfn-rls's delay
// logged); both serve their metrics at PROMETHEUS_ADDR.
//
// What differs from a cluster: the listeners are on loopback ports rather than 8080, 8081 and
// 19001 (two services side by side), the certificates are in temporary directories rather
// than /certs and /redis-certs, and the reference's debug listener (DEBUG_PORT, which Envoy
// Gateway leaves at 6070) gets a port of its own. Envoy Gateway names no CA for Redis: the
// reference and rlfn-rls both verify the server against the system's roots, so the test's
// CA is made one of them by SSL_CERT_FILE, as a cluster's would be in the image.
func TestEnvoyGatewaySideBySide(t *testing.T) {
	refBin := filepath.Join(reference.Bin(t), "service_cmd")
	harness.Require(t, harness.ValkeyImage())
	sec := newGatewaySecret(t)
	ca, certs, pair, pool, xds := sec.ca, sec.dir, sec.pair, sec.pool, sec.xds
	// The Redis client certificate at /redis-certs: the same certificate here.
	redisCerts := t.TempDir()
	for name, data := range map[string][]byte{"tls.crt": ca.CertPEM, "tls.key": ca.KeyPEM} {
		if err := os.WriteFile(filepath.Join(redisCerts, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	mutual := func() *tls.Config {
		return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	}

	// Valkey over TLS only, requiring a client certificate once the library is loaded.
	srv := harness.StartValkeyTLS(t, ca)
	admin := srv.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, admin.B().FunctionLoad().Replace().FunctionCode(functions.Source).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, admin.B().ConfigSet().ParameterValue().ParameterValue("tls-auth-clients", "yes").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, TLSConfig: ca.ClientConfig(), DisableCache: true}); err == nil {
		c.Close()
		t.Fatal("Valkey takes a client without a certificate: REDIS_TLS_CLIENT_CERT would go untested")
	}

	xds.Set(t, gatewayConfig(3))

	ours := filepath.Join(t.TempDir(), "rlfn-rls")
	if out, err := exec.Command("go", "build", "-o", ours, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var services []*gatewayService
	for _, s := range []struct{ name, bin string }{{"reference", refBin}, {"rlfn-rls", ours}} {
		env := func() map[string]string {
			env := envoyGatewayEnv(srv.Addr, xds.Addr, certs, harness.FreePorts(t, 3))
			// redis-tls-settings.yaml: a Redis TLS certificateRef.
			env["REDIS_TLS"] = "true"
			env["REDIS_TLS_CLIENT_CERT"] = filepath.Join(redisCerts, "tls.crt")
			env["REDIS_TLS_CLIENT_KEY"] = filepath.Join(redisCerts, "tls.key")
			env["SSL_CERT_FILE"] = filepath.Join(certs, "ca.crt")
			if s.name == "reference" {
				env["DEBUG_HOST"], env["DEBUG_PORT"] = "127.0.0.1", fmt.Sprint(harness.FreePorts(t, 1)[0])
			} else {
				// The reference waits up to REDIS_TIMEOUT, 10 s, for Redis; rlfn-rls's 100ms
				// default is for a quiet network, not a test machine shared by many.
				env["RLFN_RLS_DEADLINE"] = "2s"
			}
			return env
		}
		services = append(services, startGatewayService(t, s.name, s.bin, env, mutual()))
	}
	ref, rlfn := services[0], services[1]
	for _, s := range services {
		waitGatewayLimit(t, s, 3)
	}

	compare := func(reqs ...*pb.RateLimitRequest) {
		t.Helper()
		// An hour's window: a sequence must not straddle two.
		if now := time.Now(); now.Minute() == 59 && now.Second() >= 50 {
			time.Sleep(time.Duration(61-now.Second()) * time.Second)
		}
		for i, req := range reqs {
			want, err := ref.ask(req)
			if err != nil {
				t.Fatalf("reference, request %d %v: %v\n%s", i, req, err, ref.out.Tail(outTail))
			}
			got, err := rlfn.ask(req)
			if err != nil {
				t.Fatalf("rlfn-rls, request %d %v: %v\n%s", i, req, err, rlfn.out.Tail(outTail))
			}
			if diff := gatewayDiff(want, got); diff != "" {
				t.Fatalf("request %d %v:\n%s", i, req, diff)
			}
		}
	}
	run := fmt.Sprint(time.Now().UnixNano())
	user := func(name string) string { return name + "-" + run }
	heavy := userRequest(user("heavy"), false)
	heavy.Descriptors[0].HitsAddend = wrapperspb.UInt64(2)
	reqs := []*pb.RateLimitRequest{
		// Rule 0 for one user, to its limit and past it; rule 1 beside it for the org.
		userRequest(user("u1"), true), userRequest(user("u1"), true), userRequest(user("u1"), true), userRequest(user("u1"), true),
		userRequest(user("u2"), false),
		// A request's own hits (hits_addend), as Envoy Gateway's cost settings send.
		heavy, heavy,
		// Second route: the client range's limit.
		{Domain: "first-listener", Descriptors: []*rlv3.RateLimitDescriptor{gatewayDescriptor("second-route", "second-route", "masked_remote_address", "192.168.0.0/16")}},
		{Domain: "first-listener", Descriptors: []*rlv3.RateLimitDescriptor{gatewayDescriptor("second-route", "second-route", "masked_remote_address", "192.168.0.0/16")}},
		{Domain: "first-listener", Descriptors: []*rlv3.RateLimitDescriptor{gatewayDescriptor("second-route", "second-route", "masked_remote_address", "192.168.0.0/16")}},
		// What no rule matches: a route alone, another range, another listener's domain.
		{Domain: "first-listener", Descriptors: []*rlv3.RateLimitDescriptor{gatewayDescriptor("first-route", "first-route")}},
		{Domain: "first-listener", Descriptors: []*rlv3.RateLimitDescriptor{gatewayDescriptor("second-route", "second-route", "masked_remote_address", "10.0.0.0/8")}},
		{Domain: "second-listener", Descriptors: []*rlv3.RateLimitDescriptor{gatewayDescriptor("first-route", "first-route", "rule-0-match-0", user("u1"))}},
	}
	compare(reqs...)

	// A changed policy, pushed: rlfn-rls serves it, then both answer it the same.
	xds.Set(t, gatewayConfig(1))
	took := waitGatewayLimit(t, rlfn, 1)
	waitGatewayLimit(t, ref, 1)
	t.Logf("rlfn-rls served the configuration pushed over xDS %v after it was set", took)
	compare(userRequest(user("u3"), false), userRequest(user("u3"), false), userRequest(user("u1"), true))

	// Both serve metrics where Envoy Gateway's Service and ServiceMonitor scrape them.
	for _, s := range services {
		code, body := get(s.metrics)
		if code != http.StatusOK || len(body) == 0 {
			t.Errorf("%s: PROMETHEUS_ADDR answers %d\n%.2000s", s.name, code, body)
		}
	}
	if _, body := get(rlfn.metrics); !strings.Contains(body, `rlfn_rls_requests_total{`) {
		t.Errorf("rlfn-rls's metrics at PROMETHEUS_ADDR lack its requests:\n%.2000s", body)
	}
}

// gatewaySecret is Envoy Gateway's Secret envoy-rate-limit as Kubernetes mounts it at
// /certs (ca.crt, tls.crt, tls.key, readable by all: one certificate for the gRPC listener
// and for the xDS client), and its control plane's xDS server, which asks its clients for
// that certificate.
type gatewaySecret struct {
	ca   *harness.TLS
	dir  string
	pair tls.Certificate
	pool *x509.CertPool
	xds  *harness.XDS
}

func newGatewaySecret(t *testing.T) gatewaySecret {
	t.Helper()
	ca, err := harness.NewTLS()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"ca.crt": ca.CAPEM, "tls.crt": ca.CertPEM, "tls.key": ca.KeyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pair, err := tls.X509KeyPair(ca.CertPEM, ca.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CAPEM)
	xds := harness.StartXDS(t, "envoy-ratelimit", &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert})
	return gatewaySecret{ca: ca, dir: dir, pair: pair, pool: pool, xds: xds}
}
