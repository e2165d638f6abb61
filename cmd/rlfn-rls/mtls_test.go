package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/internal/harness"
)

// freeAddr is a loopback address free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// httpApp is the command running in-process with its HTTP listener, until its context ends.
type httpApp struct {
	grpc, http string
	log        *harness.Buffer
	done       chan error
}

// startHTTPApp runs the command with args on loopback listeners of its own, and returns once
// GET /healthcheck answers OK.
func startHTTPApp(t *testing.T, ctx context.Context, args ...string) *httpApp {
	t.Helper()
	a := &httpApp{grpc: freeAddr(t), http: freeAddr(t), log: &harness.Buffer{}, done: make(chan error, 1)}
	go func() {
		a.done <- newApp(a.log).RunContext(ctx, append([]string{"rlfn-rls", "--grpc", a.grpc, "--http", a.http, "--check-every", "100ms"}, args...))
	}()
	for deadline := time.Now().Add(20 * time.Second); ; {
		if code, _ := a.get(t, "/healthcheck"); code == http.StatusOK {
			return a
		}
		select {
		case err := <-a.done:
			t.Fatalf("the app ended: %v\n%s", err, a.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("never healthy\n%s", a.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (a *httpApp) get(t *testing.T, path string) (int, string) {
	return a.do(t, http.MethodGet, path, "")
}

func (a *httpApp) do(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+a.http+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// mtlsFiles writes a CA and a certificate it signed (for 127.0.0.1, server and client use),
// and returns the args of a gRPC listener with mutual TLS.
func mtlsFiles(t *testing.T) (*harness.TLS, []string) {
	t.Helper()
	ca, err := harness.NewTLS()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return ca, []string{"--grpc-tls-cert", write("tls.crt", ca.CertPEM), "--grpc-tls-key", write("tls.key", ca.KeyPEM), "--grpc-tls-client-ca", write("ca.crt", ca.CAPEM)}
}

const jsonRequest = `{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}`

// With mutual TLS on the gRPC listener, POST /json (which checks no certificate) is off unless
// --json-without-client-auth: anyone reaching --http would otherwise spend the limits the
// gRPC listener guards. /healthcheck and /metrics stay; the log says why /json is off.
func TestJSONOffWithMutualTLS(t *testing.T) {
	url, dir, _ := startStalled(t, "d")
	_, tlsArgs := mtlsFiles(t)
	run := func(extra ...string) (*httpApp, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		return startHTTPApp(t, ctx, append(append([]string{"--url", url, "--config", dir}, tlsArgs...), extra...)...), cancel
	}
	stop := func(a *httpApp, cancel context.CancelFunc) {
		t.Helper()
		cancel()
		if err := <-a.done; err != nil {
			t.Fatalf("serve: %v\n%s", err, a.log.String())
		}
	}

	a, cancel := run()
	if code, body := a.do(t, http.MethodPost, "/json", jsonRequest); code != http.StatusNotFound || !strings.Contains(body, "--json-without-client-auth") {
		t.Errorf("POST /json with mutual TLS: %d %q, want 404 saying why", code, body)
	}
	if code, _ := a.get(t, "/metrics"); code != http.StatusOK {
		t.Errorf("GET /metrics: %d", code)
	}
	stop(a, cancel)
	if n := strings.Count(a.log.String(), `"msg":"POST /json is off: the gRPC listener requires client certificates`); n != 1 {
		t.Errorf("the log says %d times that /json is off, want once:\n%s", n, a.log.String())
	}

	a, cancel = run("--json-without-client-auth")
	if code, body := a.do(t, http.MethodPost, "/json", jsonRequest); code != http.StatusOK || !strings.Contains(body, `"overallCode":"OK"`) {
		t.Errorf("POST /json with --json-without-client-auth: %d %q, want 200 OK", code, body)
	}
	stop(a, cancel)
	if strings.Contains(a.log.String(), "/json is off") {
		t.Errorf("the log says /json is off with --json-without-client-auth:\n%s", a.log.String())
	}
}

// Over xDS, before the first configuration: the log says the service waits for it, once, not
// that the backend (which is fine) cannot decide at every check; and an xDS server not
// reachable is said not to leave a configuration in use, there being none.
func TestWaitingForFirstConfig(t *testing.T) {
	url, _, _ := startStalled(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := &harness.Buffer{}
	done := make(chan error, 1)
	go func() {
		done <- newApp(log).RunContext(ctx, []string{"rlfn-rls", "--url", url, "--grpc", freeAddr(t), "--http", "", "--check-every", "100ms",
			"--xds-server", freeAddr(t), "--xds-backoff-initial", "100ms", "--xds-backoff-max", "100ms"})
	}()
	// Fifteen checks, and as many attempts to reach the xDS server.
	for start := time.Now(); time.Since(start) < 1500*time.Millisecond || !strings.Contains(log.String(), "xDS configuration server is not reachable"); {
		select {
		case err := <-done:
			t.Fatalf("the app ended: %v\n%s", err, log.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("never tried the xDS server:\n%s", log.String())
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v\n%s", err, log.String())
	}
	out := log.String()
	if n := strings.Count(out, `"msg":"waiting for the first configuration: NOT_SERVING until it arrives"`); n != 1 {
		t.Errorf("%d lines say the service waits for its first configuration, want 1:\n%s", n, out)
	}
	for _, wrong := range []string{"the backend cannot decide", "the configuration in use still applies"} {
		if strings.Contains(out, wrong) {
			t.Errorf("the log says %q before any configuration:\n%s", wrong, out)
		}
	}
	if !strings.Contains(out, "not reachable; still waiting for the first configuration") {
		t.Errorf("the unreachable xDS server's line does not say the service still waits:\n%s", out)
	}
}

// A client the gRPC listener's mutual TLS refuses is logged, at warn, with its address and
// why: once per 10 s, the others counted. A connection closed without a handshake (a TCP
// probe) is no refusal.
func TestTLSRefusalsLogged(t *testing.T) {
	url, dir, _ := startStalled(t, "d")
	ca, tlsArgs := mtlsFiles(t)
	other, err := harness.NewTLS()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := startHTTPApp(t, ctx, append([]string{"--url", url, "--config", dir}, tlsArgs...)...)
	probe, err := net.Dial("tcp", a.grpc)
	if err != nil {
		t.Fatal(err)
	}
	probe.Close()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CAPEM)
	handshake := func(certs []tls.Certificate) string {
		t.Helper()
		raw, err := net.Dial("tcp", a.grpc)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		c := tls.Client(raw, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", Certificates: certs, NextProtos: []string{"h2"}})
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if err := c.Handshake(); err == nil {
			// TLS 1.3: the client's handshake ends before the server has checked its
			// certificate; the server's refusal comes with the first read.
			_, _ = c.Read(make([]byte, 1))
		}
		return raw.LocalAddr().String()
	}
	first := handshake(nil)
	pair, err := tls.X509KeyPair(other.CertPEM, other.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	handshake([]tls.Certificate{pair}) // within 10 s of the first: counted, not written
	var out string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if out = a.log.String(); strings.Contains(out, "TLS handshake") || time.Now().After(deadline) {
			break
		}
	}
	cancel()
	if err := <-a.done; err != nil {
		t.Fatalf("serve: %v\n%s", err, a.log.String())
	}
	out = a.log.String()
	if n := strings.Count(out, `"level":"WARN","msg":"a client's TLS handshake on the gRPC listener was refused"`); n != 1 {
		t.Fatalf("%d lines of refused handshakes, want 1 (the second within 10 s counted):\n%s", n, out)
	}
	for _, want := range []string{`"remote":"` + first + `"`, `certificate`, `"suppressed":0`} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in the refusal's line:\n%s", want, out)
		}
	}
}
