package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
)

// metricsFlags give the metrics a listener of their own, as the reference's USE_PROMETHEUS
// does at PROMETHEUS_ADDR: Envoy Gateway's Deployment and Service name that port (19001) for
// scraping, apart from the health checks' (8080).
var metricsFlags = []cli.Flag{
	&cli.StringFlag{Name: "metrics", EnvVars: []string{"RLFN_RLS_METRICS"}, Usage: `address of a listener of its own serving only the metrics, at --metrics-path (the reference's PROMETHEUS_ADDR); "" for none: they are at /metrics on --http always`},
	&cli.StringFlag{Name: "metrics-path", Value: "/metrics", EnvVars: []string{"RLFN_RLS_METRICS_PATH"}, Usage: "path of the metrics on the --metrics listener (the reference's PROMETHEUS_PATH)"},
}

// checkMetrics refuses a --metrics-path the listener cannot serve, before anything starts.
func checkMetrics(c *cli.Context) error {
	path := c.String("metrics-path")
	if c.String("metrics") == "" && c.IsSet("metrics-path") {
		return errors.New("--metrics-path needs --metrics, the listener it is the path on")
	}
	if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " {}") {
		return fmt.Errorf("--metrics-path %q: a URL path, starting with /", path)
	}
	return nil
}

// metricsListener serves h alone at --metrics-path on the address --metrics; nil without
// --metrics. It listens at once, so that a port in use stops the start with its error (the
// reference then serves no metrics and says nothing).
func metricsListener(c *cli.Context, h http.Handler) (*metricsServer, error) {
	addr, path := c.String("metrics"), c.String("metrics-path")
	if addr == "" {
		return nil, nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName(c, "metrics"), err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+path, h)
	return &metricsServer{l: l, path: path, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}}, nil
}

type metricsServer struct {
	l    net.Listener
	path string
	srv  *http.Server
}

// serve runs until shutdown; the error of a listener that failed otherwise.
func (m *metricsServer) serve() error {
	if err := m.srv.Serve(m.l); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("--metrics listener: %w", err)
	}
	return nil
}

func (m *metricsServer) shutdown(ctx context.Context) error { return m.srv.Shutdown(ctx) }

// close frees the listener of a server that never served (a later start-up error).
func (m *metricsServer) close() {
	if m != nil {
		m.l.Close()
	}
}
