package rls_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/envoyconf"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/rls"
)

// Mutual TLS on the gRPC listener: a client without a certificate, or with one another CA
// signed, is refused; one with a certificate the clients' CA signed is served. A certificate
// rotated on disk (as Kubernetes rotates a secret) is used by the next connection.
func TestServerMutualTLS(t *testing.T) {
	one, err := harness.NewTLS()
	if err != nil {
		t.Fatal(err)
	}
	two, err := harness.NewTLS()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		t.Helper()
		path := filepath.Join(dir, name)
		// As Kubernetes does: a new file renamed over the old one.
		if err := os.WriteFile(path+".new", data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
		return path
	}
	cert, key, ca := write("tls.crt", one.CertPEM), write("tls.key", one.KeyPEM), write("ca.crt", one.CAPEM)
	var reloadErr error
	serverTLS, err := rls.ServerTLS(cert, key, ca, "", func(err error) { reloadErr = err })
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := envoyconf.Load(nil, false)
	if err != nil {
		t.Fatal(err)
	}
	srv := rls.NewServer(rls.NewService(func(string) *client.Limiter { return nil }, cfg, rls.Options{}), rls.ServerOptions{TLS: serverTLS})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l, nil) }()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })

	// The clients trust both CAs, so that they see which certificate the server shows.
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(one.CAPEM)
	roots.AppendCertsFromPEM(two.CAPEM)
	pair := func(tl *harness.TLS) []tls.Certificate {
		c, err := tls.X509KeyPair(tl.CertPEM, tl.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return []tls.Certificate{c}
	}
	call := func(certs []tls.Certificate) error {
		conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: certs})))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, request("nowhere", desc("k", "v")))
		return err
	}
	if err := call(nil); err == nil {
		t.Error("a client without a certificate was served")
	}
	if err := call(pair(two)); err == nil {
		t.Error("a client whose certificate another CA signed was served")
	}
	if err := call(pair(one)); err != nil {
		t.Fatalf("a client with a good certificate: %v", err)
	}
	shown := func() []byte {
		t.Helper()
		c, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{RootCAs: roots, Certificates: pair(one)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.Handshake(); err != nil {
			t.Fatal(err)
		}
		return c.ConnectionState().PeerCertificates[0].Raw
	}
	first := shown()
	write("tls.crt", two.CertPEM)
	write("tls.key", two.KeyPEM)
	rotated := time.Now()
	for i := 0; bytes.Equal(shown(), first); i++ {
		if i > 1000 {
			t.Fatal("the rotated certificate is never shown")
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("the rotated certificate was shown %v after it was written", time.Since(rotated))
	if err := call(pair(one)); err != nil {
		t.Fatalf("after the rotation: %v", err)
	}
	// A broken file leaves the last good certificate in use, and says so.
	write("tls.key", []byte("not a key"))
	if err := call(pair(one)); err != nil || reloadErr == nil {
		t.Fatalf("with a broken key file: %v, reload error %v", err, reloadErr)
	}
}
