package main

import (
	"crypto/x509"
	"os"
	"os/exec"
	"testing"
)

// In a FROM scratch image there is no CA bundle: the binary carries Go's copy of the public
// roots (golang.org/x/crypto/x509roots/fallback), so that a rediss:// server with a public
// certificate is verified without REDIS_TLS_CACERT (Envoy Gateway never sets it). A child of
// this test binary is given no system roots (SSL_CERT_FILE and SSL_CERT_DIR name nothing), as
// in the image, and must still have a pool.
func TestFallbackRoots(t *testing.T) {
	if os.Getenv("RLFN_TEST_NO_SYSTEM_ROOTS") == "1" {
		pool, err := x509.SystemCertPool()
		if err != nil || pool.Equal(x509.NewCertPool()) {
			t.Fatalf("no roots without the system's: %v", err)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFallbackRoots$", "-test.count=1")
	cmd.Env = append(os.Environ(), "RLFN_TEST_NO_SYSTEM_ROOTS=1", "SSL_CERT_FILE=/nonexistent/ca.pem", "SSL_CERT_DIR=/nonexistent")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}
