package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/urfave/cli/v2"
	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/rls"
)

// tlsFlags configure TLS on the gRPC listener (the reference's GRPC_SERVER_USE_TLS and
// the variables beside it).
var tlsFlags = []cli.Flag{
	&cli.StringFlag{Name: "grpc-tls-cert", EnvVars: []string{"RLFN_RLS_GRPC_TLS_CERT"}, Usage: "PEM certificate of the gRPC listener: TLS (re-read when the file changes)"},
	&cli.StringFlag{Name: "grpc-tls-key", EnvVars: []string{"RLFN_RLS_GRPC_TLS_KEY"}, Usage: "PEM key of --grpc-tls-cert"},
	&cli.StringFlag{Name: "grpc-tls-client-ca", EnvVars: []string{"RLFN_RLS_GRPC_TLS_CLIENT_CA"}, Usage: "PEM file of the CA that signs the clients' certificates: mutual TLS, a client without one refused"},
	&cli.StringFlag{Name: "grpc-tls-client-san", EnvVars: []string{"RLFN_RLS_GRPC_TLS_CLIENT_SAN"}, Usage: "a name (DNS, URI or IP) every client's certificate must have"},
	&cli.BoolFlag{Name: "json-without-client-auth", EnvVars: []string{"RLFN_RLS_JSON_WITHOUT_CLIENT_AUTH"}, Usage: "serve POST /json on --http although --grpc-tls-client-ca requires client certificates on gRPC (by default /json is then off: it checks none, and anyone reaching --http could spend the limits)"},
}

// noJSON says why POST /json is not served, or "" when it is: with mutual TLS on the gRPC
// listener, the same decisions over plain HTTP would be open to anyone reaching --http.
func noJSON(c *cli.Context) string {
	if c.String("grpc-tls-client-ca") == "" || c.Bool("json-without-client-auth") || c.String("http") == "" {
		return ""
	}
	return "POST /json is off: the gRPC listener requires client certificates (--grpc-tls-client-ca), which /json cannot check; --json-without-client-auth serves it without"
}

// serverCertFlags present a client certificate to Valkey or Redis (a server with
// tls-auth-clients; the reference's REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY, which Envoy
// Gateway sets for a Redis TLS certificateRef).
var serverCertFlags = []cli.Flag{
	&cli.StringFlag{Name: "tls-cert", EnvVars: []string{"RLFN_TLS_CERT"}, Usage: "PEM client certificate presented to Valkey or Redis (rediss:// and valkeys:// URLs), re-read on a new connection after the file changes"},
	&cli.StringFlag{Name: "tls-key", EnvVars: []string{"RLFN_TLS_KEY"}, Usage: "PEM key of --tls-cert"},
}

// extraFlags are the flags of their own files, after app.go's.
func extraFlags() []cli.Flag {
	return slices.Concat(serverCertFlags, xdsFlags, tlsFlags, metricsFlags)
}

// serverTLS is the gRPC listener's TLS the flags describe, or nil for none.
func serverTLS(c *cli.Context, log *slog.Logger) (*tls.Config, error) {
	cert, key := c.String("grpc-tls-cert"), c.String("grpc-tls-key")
	if cert == "" && key == "" {
		if c.String("grpc-tls-client-ca") != "" || c.String("grpc-tls-client-san") != "" {
			return nil, errors.New("--grpc-tls-client-ca and --grpc-tls-client-san need --grpc-tls-cert and --grpc-tls-key")
		}
		return nil, nil
	}
	if cert == "" || key == "" {
		return nil, errors.New("--grpc-tls-cert and --grpc-tls-key go together")
	}
	ca, san := c.String("grpc-tls-client-ca"), c.String("grpc-tls-client-san")
	if san != "" && ca == "" {
		return nil, fmt.Errorf("%s needs --grpc-tls-client-ca: a client's name is checked in the certificate that CA signed", flagName(c, "grpc-tls-client-san"))
	}
	cfg, err := rls.ServerTLS(cert, key, ca, san, func(err error) {
		log.Error("the rotated certificate does not load; the previous one still serves", "err", err)
	})
	if err != nil {
		// Its error says which file (the certificate, the clients' CA): the flags say whose.
		names := []string{flagName(c, "grpc-tls-cert"), flagName(c, "grpc-tls-key")}
		if ca != "" {
			names = append(names, flagName(c, "grpc-tls-client-ca"))
		}
		return nil, fmt.Errorf("%s: %w", strings.Join(names, ", "), err)
	}
	return cfg, nil
}

// clientCertificate makes opt's TLS present the pair --tls-cert and --tls-key name, read again
// for a new connection once either file has changed (a Kubernetes secret's rotation); a pair
// that does not load then leaves the last good one in use, and log says so.
func clientCertificate(c *cli.Context, opt *valkey.ClientOption, log *slog.Logger) error {
	cert, key := c.String("tls-cert"), c.String("tls-key")
	switch {
	case cert == "" && key == "":
		return nil
	case cert == "" || key == "":
		return errors.New("--tls-cert and --tls-key go together")
	case opt.TLSConfig == nil:
		return errors.New("--tls-cert needs a rediss:// or valkeys:// URL")
	}
	p := &keyPair{cert: cert, key: key}
	if _, err := p.get(); err != nil {
		return fmt.Errorf("--tls-cert, --tls-key: %w", err)
	}
	opt.TLSConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		pair, err := p.get()
		if err != nil {
			log.Error("the rotated client certificate does not load; the previous one is presented", "err", err)
		}
		return pair, nil
	}
	return nil
}

// keyPair is a certificate and key on disk, loaded again when either file's stamp changes.
type keyPair struct {
	cert, key string

	mu    sync.Mutex
	stamp string
	pair  *tls.Certificate
}

// get returns the pair as the files are now, or the last good one and the error of loading
// them.
func (p *keyPair) get() (*tls.Certificate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	stamp := ""
	for _, name := range []string{p.cert, p.key} {
		// Through symbolic links: a secret's volume swaps the ..data link.
		if st, err := os.Stat(name); err == nil {
			stamp += fmt.Sprintf("%d.%d;", st.ModTime().UnixNano(), st.Size())
		}
	}
	if stamp == p.stamp && p.pair != nil {
		return p.pair, nil
	}
	pair, err := tls.LoadX509KeyPair(p.cert, p.key)
	if err != nil {
		return p.pair, err
	}
	p.pair, p.stamp = &pair, stamp
	return p.pair, nil
}
