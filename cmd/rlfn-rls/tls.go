package main

import (
	"crypto/tls"
	"errors"
	"log/slog"

	"github.com/urfave/cli/v2"

	"github.com/rlfn/rlfn/rls"
)

// tlsFlags configure TLS on the gRPC listener (the reference's GRPC_SERVER_USE_TLS and
// the variables beside it).
var tlsFlags = []cli.Flag{
	&cli.StringFlag{Name: "grpc-tls-cert", EnvVars: []string{"RLFN_RLS_GRPC_TLS_CERT"}, Usage: "PEM certificate of the gRPC listener: TLS (re-read when the file changes)"},
	&cli.StringFlag{Name: "grpc-tls-key", EnvVars: []string{"RLFN_RLS_GRPC_TLS_KEY"}, Usage: "PEM key of --grpc-tls-cert"},
	&cli.StringFlag{Name: "grpc-tls-client-ca", EnvVars: []string{"RLFN_RLS_GRPC_TLS_CLIENT_CA"}, Usage: "PEM file of the CA that signs the clients' certificates: mutual TLS, a client without one refused"},
	&cli.StringFlag{Name: "grpc-tls-client-san", EnvVars: []string{"RLFN_RLS_GRPC_TLS_CLIENT_SAN"}, Usage: "a name (DNS, URI or IP) every client's certificate must have"},
}

// extraFlags are the flags of their own files, after app.go's.
func extraFlags() []cli.Flag {
	return append(append([]cli.Flag{}, xdsFlags...), tlsFlags...)
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
	return rls.ServerTLS(cert, key, c.String("grpc-tls-client-ca"), c.String("grpc-tls-client-san"), func(err error) {
		log.Error("the rotated certificate does not load; the previous one still serves", "err", err)
	})
}
