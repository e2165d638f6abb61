package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rlfn/rlfn/internal/harness"
)

// A certificate and key on disk (--tls-cert, --xds-tls-cert) are read again once their files
// change, as a Kubernetes secret's rotation changes them, and a pair that does not load then
// leaves the last good one in use.
func TestKeyPairRotation(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	write := func(c, k []byte, at time.Time) {
		t.Helper()
		for name, b := range map[string][]byte{cert: c, key: k} {
			if err := os.WriteFile(name, b, 0o600); err != nil {
				t.Fatal(err)
			}
			// A file's stamp is its time and size: two writes within the clock's step
			// would look alike, so each write has a time of its own.
			if err := os.Chtimes(name, at, at); err != nil {
				t.Fatal(err)
			}
		}
	}
	first, err := harness.NewTLS()
	if err != nil {
		t.Fatal(err)
	}
	second, err := harness.NewTLS()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	write(first.CertPEM, first.KeyPEM, now)
	p := &keyPair{cert: cert, key: key}
	a, err := p.get()
	if err != nil {
		t.Fatal(err)
	}
	if again, err := p.get(); err != nil || again != a {
		t.Fatalf("unchanged files: %p %v, want the pair read before (%p)", again, err, a)
	}
	write(second.CertPEM, second.KeyPEM, now.Add(time.Second))
	b, err := p.get()
	if err != nil {
		t.Fatal(err)
	}
	if string(b.Certificate[0]) == string(a.Certificate[0]) {
		t.Fatal("the rotated certificate was not read")
	}
	write([]byte("not a certificate"), second.KeyPEM, now.Add(2*time.Second))
	c, err := p.get()
	if err == nil || c != b {
		t.Fatalf("a pair that does not load: %p %v, want the last good one (%p) and the error", c, err, b)
	}
}
