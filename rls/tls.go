package rls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
)

// ServerTLS is a TLS configuration for the gRPC listener from PEM files: the certificate and
// key, and with clientCA the CA a client's certificate must be signed by (mutual TLS; with
// clientSAN too, a name the client's certificate must have, as the reference's
// GRPC_CLIENT_TLS_SAN). The files are read again on the first handshake after any of them
// changes (a Kubernetes secret's rotation), so that new connections use the new ones without
// a restart; files that do not load then leave the previous ones in use (and onError is
// told).
func ServerTLS(certFile, keyFile, clientCA, clientSAN string, onError func(error)) (*tls.Config, error) {
	f := &tlsFiles{cert: certFile, key: keyFile, ca: clientCA, san: clientSAN, onError: onError}
	cfg, err := f.load()
	if err != nil {
		return nil, err
	}
	f.cfg, f.stamp = cfg, f.stamps()
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: f.config}, nil
}

type tlsFiles struct {
	cert, key, ca, san string
	onError            func(error)

	mu    sync.Mutex
	stamp string
	cfg   *tls.Config
}

// stamps says when each file last changed: its size and time, through symbolic links.
func (f *tlsFiles) stamps() string {
	s := ""
	for _, name := range []string{f.cert, f.key, f.ca} {
		if name == "" {
			continue
		}
		if st, err := os.Stat(name); err == nil {
			s += fmt.Sprintf("%d.%d;", st.ModTime().UnixNano(), st.Size())
		} else {
			s += "missing;"
		}
	}
	return s
}

func (f *tlsFiles) config(*tls.ClientHelloInfo) (*tls.Config, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if stamp := f.stamps(); stamp != f.stamp {
		cfg, err := f.load()
		if err != nil {
			if f.onError != nil {
				f.onError(err)
			}
			return f.cfg, nil
		}
		f.cfg, f.stamp = cfg, stamp
	}
	return f.cfg, nil
}

func (f *tlsFiles) load() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		return nil, fmt.Errorf("the gRPC listener's certificate: %w", err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if f.ca == "" {
		if f.san != "" {
			return nil, errors.New("a client's name to check needs the CA of the clients' certificates")
		}
		return cfg, nil
	}
	pem, err := os.ReadFile(f.ca)
	if err != nil {
		return nil, fmt.Errorf("the clients' CA: %w", err)
	}
	cfg.ClientCAs = x509.NewCertPool()
	if !cfg.ClientCAs.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("the clients' CA: no PEM certificate in %s", f.ca)
	}
	cfg.ClientAuth = tls.RequireAndVerifyClientCert
	if san := f.san; san != "" {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			c := cs.PeerCertificates[0]
			names := slices.Clone(c.DNSNames)
			for _, u := range c.URIs {
				names = append(names, u.String())
			}
			for _, ip := range c.IPAddresses {
				names = append(names, ip.String())
			}
			if !slices.Contains(names, san) {
				return fmt.Errorf("the client's certificate is not for %s", san)
			}
			return nil
		}
	}
	return cfg, nil
}
