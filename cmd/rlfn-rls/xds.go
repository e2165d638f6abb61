package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/urfave/cli/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rlfn/rlfn/rls"
)

// xdsFlags configure the xDS configuration source, the reference's CONFIG_TYPE=GRPC_XDS_SOTW
// (its defaults are the reference's).
var xdsFlags = []cli.Flag{
	&cli.StringFlag{Name: "xds-server", EnvVars: []string{"RLFN_RLS_XDS_SERVER"}, Usage: "host:port of an xDS management server serving RateLimitConfig resources (Envoy Gateway's), instead of --config"},
	&cli.StringFlag{Name: "xds-node", Value: "default", EnvVars: []string{"RLFN_RLS_XDS_NODE"}, Usage: "the node ID this service gives the xDS server (Envoy Gateway's is envoy-ratelimit)"},
	&cli.StringFlag{Name: "xds-node-metadata", EnvVars: []string{"RLFN_RLS_XDS_NODE_METADATA"}, Usage: "the node's metadata: key=value,key=value"},
	&cli.StringFlag{Name: "xds-headers", EnvVars: []string{"RLFN_RLS_XDS_HEADERS"}, Usage: "gRPC metadata sent to the xDS server: key:value,key:value"},
	&cli.StringFlag{Name: "xds-tls-ca", EnvVars: []string{"RLFN_RLS_XDS_TLS_CA"}, Usage: "PEM file of the CA that signed the xDS server's certificate: TLS to the xDS server"},
	&cli.StringFlag{Name: "xds-tls-cert", EnvVars: []string{"RLFN_RLS_XDS_TLS_CERT"}, Usage: "PEM certificate presented to the xDS server (with --xds-tls-key)"},
	&cli.StringFlag{Name: "xds-tls-key", EnvVars: []string{"RLFN_RLS_XDS_TLS_KEY"}, Usage: "PEM key of --xds-tls-cert"},
	&cli.StringFlag{Name: "xds-tls-server-name", EnvVars: []string{"RLFN_RLS_XDS_TLS_SERVER_NAME"}, Usage: "the name the xDS server's certificate must have (default: --xds-server's host)"},
	&cli.BoolFlag{Name: "xds-tls", EnvVars: []string{"RLFN_RLS_XDS_TLS"}, Usage: "TLS to the xDS server, trusting the system's roots unless --xds-tls-ca"},
	&cli.DurationFlag{Name: "xds-backoff-initial", Value: 10e9, EnvVars: []string{"RLFN_RLS_XDS_BACKOFF_INITIAL"}, Usage: "first wait before reconnecting to the xDS server; each next is --xds-backoff-factor times longer, up to --xds-backoff-max"},
	&cli.DurationFlag{Name: "xds-backoff-max", Value: 60e9, EnvVars: []string{"RLFN_RLS_XDS_BACKOFF_MAX"}, Usage: "longest wait before reconnecting to the xDS server"},
	&cli.Float64Flag{Name: "xds-backoff-factor", Value: 2, EnvVars: []string{"RLFN_RLS_XDS_BACKOFF_FACTOR"}, Usage: "each wait before reconnecting to the xDS server is the one before times this, up to --xds-backoff-max (1: every wait is --xds-backoff-initial)"},
	&cli.Float64Flag{Name: "xds-backoff-random", Value: 0.5, EnvVars: []string{"RLFN_RLS_XDS_BACKOFF_RANDOM"}, Usage: "each wait is randomised by up to this fraction, more or less (0: none)"},
	&cli.BoolFlag{Name: "healthy-without-config", EnvVars: []string{"RLFN_RLS_HEALTHY_WITHOUT_CONFIG"}, Usage: "healthy (the backend still checked) before the first configuration arrives over xDS, requests answered UNAVAILABLE \"no rate limit configuration loaded\" until then (the reference's FORCE_START_WITHOUT_INITIAL_CONFIG); without it, NOT_SERVING until then"},
	&cli.IntFlag{Name: "xds-max-message", EnvVars: []string{"RLFN_RLS_XDS_MAX_MESSAGE"}, Usage: "largest xDS response taken, in bytes (default: gRPC's 4 MiB)"},
}

// xdsSource is the xDS client the flags describe, or nil without --xds-server.
func xdsSource(c *cli.Context, log *slog.Logger) (*rls.XDS, error) {
	server := c.String("xds-server")
	if server == "" {
		for _, name := range []string{"xds-tls-ca", "xds-tls-cert", "xds-tls-key", "xds-tls-server-name", "xds-headers", "xds-node-metadata", "healthy-without-config"} {
			if c.IsSet(name) {
				return nil, fmt.Errorf("--%s needs --xds-server", name)
			}
		}
		return nil, nil
	}
	if len(c.StringSlice("config")) > 0 {
		return nil, fmt.Errorf("--config and --xds-server: the configuration comes from one or the other")
	}
	x := &rls.XDS{Server: server, Merge: c.Bool("merge-domains"),
		Initial: c.Duration("xds-backoff-initial"), Max: c.Duration("xds-backoff-max"), Factor: c.Float64("xds-backoff-factor"), RandomFactor: c.Float64("xds-backoff-random")}
	if x.Initial <= 0 || x.Max < x.Initial {
		return nil, fmt.Errorf("--xds-backoff-initial %s, --xds-backoff-max %s: want 0 < initial <= max", x.Initial, x.Max)
	}
	if x.Factor < 1 {
		return nil, fmt.Errorf("--xds-backoff-factor %g: want 1 or more", x.Factor)
	}
	if x.RandomFactor < 0 || x.RandomFactor >= 1 {
		return nil, fmt.Errorf("--xds-backoff-random %g: want 0 or more, less than 1", x.RandomFactor)
	}
	meta := map[string]any{}
	for _, kv := range splitList(c.String("xds-node-metadata")) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("--xds-node-metadata %q: want key=value,...", c.String("xds-node-metadata"))
		}
		meta[k] = v
	}
	st, err := structpb.NewStruct(meta)
	if err != nil {
		return nil, err
	}
	x.Node = &corev3.Node{Id: c.String("xds-node"), Metadata: st}
	if h := c.String("xds-headers"); h != "" {
		x.Headers = map[string]string{}
		for _, kv := range splitList(h) {
			k, v, ok := strings.Cut(kv, ":")
			if !ok {
				return nil, fmt.Errorf("--xds-headers: %q is not key:value", kv)
			}
			x.Headers[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	creds, err := xdsCredentials(c, log)
	if err != nil {
		return nil, err
	}
	x.DialOptions = append(x.DialOptions, creds)
	if n := c.Int("xds-max-message"); n > 0 {
		x.DialOptions = append(x.DialOptions, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(n)))
	} else if n < 0 {
		return nil, fmt.Errorf("--xds-max-message %d: want a size in bytes", n)
	}
	return x, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// xdsCredentials are the connection's to the xDS server: TLS (mutual with a certificate)
// when any TLS flag is given, else plain.
func xdsCredentials(c *cli.Context, log *slog.Logger) (grpc.DialOption, error) {
	ca, cert, key := c.String("xds-tls-ca"), c.String("xds-tls-cert"), c.String("xds-tls-key")
	if !c.Bool("xds-tls") && ca == "" && cert == "" && key == "" {
		return grpc.WithTransportCredentials(insecure.NewCredentials()), nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.String("xds-tls-server-name")}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("--xds-tls-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--xds-tls-ca: no PEM certificate in %s", ca)
		}
	}
	if (cert == "") != (key == "") {
		return nil, fmt.Errorf("--xds-tls-cert and --xds-tls-key go together")
	}
	if cert != "" {
		// Read again for the next connection once a file has changed (a Kubernetes secret's
		// rotation); a pair that does not load then leaves the last good one presented.
		p := &keyPair{cert: cert, key: key}
		if _, err := p.get(); err != nil {
			return nil, fmt.Errorf("--xds-tls-cert, --xds-tls-key: %w", err)
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			pair, err := p.get()
			if err != nil {
				log.Error("the rotated xDS client certificate does not load; the previous one is presented", "err", err)
			}
			return pair, nil
		}
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
}

// check is health's: the backend runs a library release the configuration in use needs,
// and there is a configuration (over xDS, none until the first arrives: the reference's
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED) unless withoutConfig (the reference's
// FORCE_START_WITHOUT_INITIAL_CONFIG, where Envoy Gateway sets it: its control plane serves
// nothing until some listener has a global limit), when the backend alone is checked.
func check(ctx context.Context, limiters *rls.Limiters, svc *rls.Service, withoutConfig bool) error {
	cfg := svc.Config()
	if cfg == nil {
		if withoutConfig {
			return limiters.Check(ctx, "")
		}
		return rls.ErrNoConfigYet
	}
	return limiters.Check(ctx, cfg.Needs())
}
