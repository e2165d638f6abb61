package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v2"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/rlfn/rlfn/deployer"
)

// reconcileCommand is built afresh for each app: cli.App.Setup writes into its commands.
func reconcileCommand() *cli.Command {
	return &cli.Command{
		OnUsageError: usageErrorHandler,
		Name:         "reconcile",
		Usage:        "keep a release on every primary as the cluster changes shape: a long-lived process",
		ArgsUsage:    " ",
		Description: "reconcile runs until SIGTERM or SIGINT. Every --interval it discovers the deployment\n" +
			"again (a node joined with CLUSTER MEET, an empty node given a dead primary's slots, a\n" +
			"failover), reads every node, and loads the release (--to, default the newest embedded)\n" +
			"onto every primary that lacks it, one at a time, as deploy does: under the deploy lock\n" +
			"(a deploy in progress is waited for), verified, restored on failure. Drifted code, a\n" +
			"downgrade and a change of major version are left alone and logged unless --force. A\n" +
			"node whose load fails (an ACL without FUNCTION LOAD) is tried again after one interval,\n" +
			"then twice as long each time up to --max-backoff. It logs JSON lines on stderr and, with\n" +
			"--metrics, serves Prometheus metrics on /metrics. --timeout bounds the first discovery.",
		Flags: []cli.Flag{
			toFlag(),
			&cli.BoolFlag{Name: "force", Usage: "load over drifted code, a newer release or another major version"},
			&cli.DurationFlag{Name: "interval", Value: time.Second, Usage: "rediscover and compare every `DURATION`"},
			&cli.DurationFlag{Name: "max-backoff", Value: time.Minute, Usage: "wait at most `DURATION` before trying a node whose load failed again"},
			&cli.DurationFlag{Name: "verify-timeout", Value: 10 * time.Second, Usage: "wait up to `DURATION` for a loaded node and its replicas to answer the release"},
			&cli.StringFlag{Name: "metrics", Usage: "serve Prometheus metrics on http://`ADDR`/metrics (e.g. :9090)"},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error"},
		},
		Action: reconcileAction,
	}
}

func reconcileAction(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageError(c, "takes no arguments")
	}
	for _, name := range []string{"interval", "max-backoff", "verify-timeout"} {
		if d := c.Duration(name); d <= 0 {
			return usageError(c, fmt.Sprintf("--%s must be positive, got %s", name, d))
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return usageError(c, "--log-level: "+err.Error())
	}
	to, err := target(c)
	if err != nil {
		return err
	}
	opt, err := clientOption(c)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(c.App.ErrWriter, &slog.HandlerOptions{Level: level}))

	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	var srv *http.Server
	if addr := c.String("metrics"); addr != "" {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("--metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(l) }()
		defer srv.Close()
		log.Info("serving metrics", "addr", l.Addr().String())
	}

	ctx, cancel := commandContext(c)
	r, err := deployer.NewReconciler(ctx, opt, deployer.ReconcileOptions{
		Release: to, Set: releases(c), Force: c.Bool("force"),
		Interval: c.Duration("interval"), MaxBackoff: c.Duration("max-backoff"),
		Apply:  deployer.Options{VerifyTimeout: c.Duration("verify-timeout")},
		Logger: log, MeterProvider: mp,
	})
	cancel()
	if err != nil {
		return connectHint(opt, err)
	}
	defer r.Close()
	// c.Context ends with the first SIGTERM or SIGINT (see run): a load in progress is
	// restored and its lock released, and Run returns.
	if err := r.Run(c.Context); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
