package harness

import (
	"crypto/x509"
	"os"
	"os/exec"
	"testing"
)

// FallbackRoots checks that the calling test binary verifies a server without the system's
// CA roots, as a FROM scratch image has none: it runs itself again (the test named name)
// with SSL_CERT_FILE and SSL_CERT_DIR naming nothing, where the child must still find a pool
// (Go's copy of the public roots, golang.org/x/crypto/x509roots/fallback, imported by the
// binary's main). Call it first thing in the test named name.
func FallbackRoots(t *testing.T, name string) {
	t.Helper()
	if os.Getenv("RLFN_TEST_NO_SYSTEM_ROOTS") == "1" {
		pool, err := x509.SystemCertPool()
		if err != nil || pool.Equal(x509.NewCertPool()) {
			t.Fatalf("no roots without the system's: %v", err)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), "RLFN_TEST_NO_SYSTEM_ROOTS=1", "SSL_CERT_FILE=/nonexistent/ca.pem", "SSL_CERT_DIR=/nonexistent")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}
