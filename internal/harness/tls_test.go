package harness_test

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/rlfn/rlfn/internal/harness"
)

// TestTLS: a TLS server answers over TLS with a certificate the CA signed, and a
// plaintext client gets nowhere.
func TestTLS(t *testing.T) {
	ca, err := harness.NewTLS()
	if err != nil {
		t.Fatal(err)
	}
	s := harness.StartValkeyTLS(t, ca)
	ping(t, s.Client(t), s)

	conn, err := tls.Dial("tcp", s.Addr, ca.ClientConfig())
	if err != nil {
		t.Fatalf("TLS handshake with the CA's trust: %v", err)
	}
	conn.Close()
	if conn, err := tls.Dial("tcp", s.Addr, &tls.Config{MinVersion: tls.VersionTLS12}); err == nil {
		conn.Close()
		t.Error("the certificate verified without trusting the test CA")
	}

	// A plaintext PING gets no +PONG: the server only speaks TLS on this port.
	pc, err := net.DialTimeout("tcp", s.Addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	_ = pc.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := pc.Write([]byte("PING\r\n")); err != nil {
		return
	}
	buf := make([]byte, 16)
	if n, _ := pc.Read(buf); n > 0 && string(buf[:n]) == "+PONG\r\n" {
		t.Error("plaintext PING answered")
	}
}
