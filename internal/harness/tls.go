package harness

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

// TLS is a throwaway certificate authority and one server certificate it signed, for
// 127.0.0.1 and localhost, made in memory for a test run: nothing is read from or
// written to the host's disk.
type TLS struct {
	CAPEM   []byte // the CA certificate, which clients trust
	CertPEM []byte // the server certificate
	KeyPEM  []byte // the server's private key

	pool *x509.CertPool
}

// Paths of the TLS files inside a server's container.
const (
	tlsCAFile   = "/tls/ca.crt"
	tlsCertFile = "/tls/server.crt"
	tlsKeyFile  = "/tls/server.key"
)

// NewTLS generates a CA and a server certificate valid for a day.
func NewTLS() (*TLS, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("harness: CA key: %w", err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "rlfn test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("harness: CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("harness: CA certificate: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("harness: server key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// Client auth too: a cluster's or replica's outgoing links present this certificate.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:    []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("harness: server certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("harness: server key: %w", err)
	}
	t := &TLS{
		CAPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		pool:    x509.NewCertPool(),
	}
	t.pool.AddCert(ca)
	return t, nil
}

// ClientConfig trusts only this CA. The server name is left to the dialer, which takes
// the host of the address it dials (127.0.0.1, in the certificate). A nil TLS has none: the
// server speaks plain text.
func (t *TLS) ClientConfig() *tls.Config {
	if t == nil {
		return nil
	}
	return &tls.Config{RootCAs: t.pool, MinVersion: tls.VersionTLS12}
}

// args configure a server to use the certificate; clients need none of their own.
func (t *TLS) args() []string {
	return []string{
		"--tls-cert-file", tlsCertFile, "--tls-key-file", tlsKeyFile,
		"--tls-ca-cert-file", tlsCAFile, "--tls-auth-clients", "no",
		"--tls-replication", "yes",
	}
}

func (t *TLS) files() []testcontainers.ContainerFile {
	return []testcontainers.ContainerFile{
		{Reader: bytes.NewReader(t.CAPEM), ContainerFilePath: tlsCAFile, FileMode: 0o644},
		{Reader: bytes.NewReader(t.CertPEM), ContainerFilePath: tlsCertFile, FileMode: 0o644},
		{Reader: bytes.NewReader(t.KeyPEM), ContainerFilePath: tlsKeyFile, FileMode: 0o600},
	}
}

// StartValkeyTLS starts a standalone Valkey that speaks TLS only (no plain port), with
// the certificate ca made, and args appended to its command line; Server.Client and the
// harness connect over TLS. It is removed when the test ends.
func StartValkeyTLS(t testing.TB, ca *TLS, args ...string) *Server {
	t.Helper()
	return startStandalone(t, spec{image: ValkeyImage(), binary: "valkey-server", args: args, tls: ca})
}

// NewValkeyTLS is StartValkeyTLS for callers without a test: the caller terminates it.
func NewValkeyTLS(ctx context.Context, ca *TLS, args ...string) (*Server, error) {
	return newStandalone(ctx, spec{image: ValkeyImage(), binary: "valkey-server", args: args, tls: ca})
}
