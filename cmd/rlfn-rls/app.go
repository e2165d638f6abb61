package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v2"
	"github.com/valkey-io/valkey-go"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/internal/envoyconf"
	"github.com/rlfn/rlfn/internal/serverurl"
	"github.com/rlfn/rlfn/rls"
	"github.com/rlfn/rlfn/versions"
)

// run runs the app with args and returns the process's exit code.
func run(args []string, stderr io.Writer) int {
	app := newApp(stderr)
	if err := app.Run(args); err != nil {
		// One line per reason (the reference's environment refuses several at once), each
		// saying whose it is.
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintln(stderr, "rlfn-rls:", line)
		}
		return 1
	}
	return 0
}

func newApp(stderr io.Writer) *cli.App {
	return &cli.App{
		Name:      "rlfn-rls",
		Usage:     "an Envoy rate limit service deciding with rlfn's library",
		ErrWriter: stderr,
		Writer:    stderr,
		// Errors are returned to run, never exit here, so tests run the app in-process.
		ExitErrHandler: func(*cli.Context, error) {},
		OnUsageError:   usageError,
		// envoyproxy/ratelimit's own variables, for a Deployment made for it (env.go).
		Before: applyReferenceEnv,
		// A --policy holds commas (domain:fallback=fail_open,deadline=50ms): several values
		// of one flag in the environment are separated by semicolons instead.
		SliceFlagSeparator: ";",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "url", Value: "redis://127.0.0.1:6379", EnvVars: []string{"RLFN_URL"}, Usage: "any one node of the standalone server or cluster: redis://, rediss://, valkey://, valkeys://"},
			&cli.StringFlag{Name: "tls-ca", EnvVars: []string{"RLFN_TLS_CA"}, Usage: "PEM file of the CA that signed the servers' certificates (rediss:// and valkeys:// URLs; default: the system's roots)"},
			&cli.StringSliceFlag{Name: "config", EnvVars: []string{"RLFN_RLS_CONFIG"}, Usage: "required: a configuration file, or a directory of *.yaml and *.yml files; repeat for more (in the environment, separated by ;)"},
			&cli.BoolFlag{Name: "config-every-file", EnvVars: []string{"RLFN_RLS_CONFIG_EVERY_FILE"}, Usage: "read a --config directory as the reference reads its RUNTIME_* one: every file whatever its name, subdirectories too (dot entries never)"},
			&cli.BoolFlag{Name: "merge-domains", EnvVars: []string{"RLFN_RLS_MERGE_DOMAINS"}, Usage: "let several files add to one domain (the reference's MERGE_DOMAIN_CONFIG)"},
			&cli.StringFlag{Name: "grpc", Value: ":8081", EnvVars: []string{"RLFN_RLS_GRPC"}, Usage: "address of the gRPC listener (ShouldRateLimit, health)"},
			&cli.StringFlag{Name: "http", Value: ":8080", EnvVars: []string{"RLFN_RLS_HTTP"}, Usage: `address of the HTTP listener (/json, /healthcheck, /metrics); "" for none`},
			&cli.IntFlag{Name: "max-in-flight", Value: 1000, EnvVars: []string{"RLFN_RLS_MAX_IN_FLIGHT"}, Usage: "requests decided at once; more are refused at once (RESOURCE_EXHAUSTED)"},
			&cli.IntFlag{Name: "max-request-bytes", Value: rls.DefaultMaxRequestBytes, EnvVars: []string{"RLFN_RLS_MAX_REQUEST_BYTES"}, Usage: "bytes of one encoded request (gRPC message, /json body); more are refused (RESOURCE_EXHAUSTED, HTTP 413) before it is read or decoded"},
			&cli.IntFlag{Name: "max-descriptors", Value: rls.DefaultMaxDescriptors, EnvVars: []string{"RLFN_RLS_MAX_DESCRIPTORS"}, Usage: "descriptors in one request; more are refused (INVALID_ARGUMENT) before anything is sent to the server"},
			&cli.IntFlag{Name: "max-entries", Value: rls.DefaultMaxEntries, EnvVars: []string{"RLFN_RLS_MAX_ENTRIES"}, Usage: "entries in one descriptor; more are refused (INVALID_ARGUMENT)"},
			&cli.IntFlag{Name: "max-value-bytes", Value: rls.DefaultMaxValueBytes, EnvVars: []string{"RLFN_RLS_MAX_VALUE_BYTES"}, Usage: "bytes of a descriptor entry's key or value, and of the domain; more are refused (INVALID_ARGUMENT)"},
			&cli.DurationFlag{Name: "deadline", Value: 100 * time.Millisecond, EnvVars: []string{"RLFN_RLS_DEADLINE"}, Usage: "bound of each call to the server"},
			&cli.StringFlag{Name: "fallback", Value: "return_error", EnvVars: []string{"RLFN_RLS_FALLBACK"}, Usage: "what a request the server cannot decide gets: return_error (a gRPC error: Envoy's failure_mode_deny decides), local, fail_closed, fail_open"},
			&cli.StringSliceFlag{Name: "policy", EnvVars: []string{"RLFN_RLS_POLICY"}, Usage: "a domain's own deadline and fallback: domain:fallback=fail_open,deadline=50ms; repeat for more (in the environment, separated by ;)"},
			&cli.IntFlag{Name: "instances", Value: 1, EnvVars: []string{"RLFN_RLS_INSTANCES"}, Usage: "replicas sharing the limits, for the local fallback's share"},
			&cli.StringFlag{Name: "headers", Value: "none", EnvVars: []string{"RLFN_RLS_HEADERS"}, Usage: "rate limit headers for Envoy to add: none, reference (the reference's RateLimit-Limit, -Remaining, -Reset), draft (RateLimit, RateLimit-Policy)"},
			&cli.BoolFlag{Name: "charge-what-fits", EnvVars: []string{"RLFN_RLS_CHARGE_WHAT_FITS"}, Usage: "charge each limit as many of a request's hits as it has room for, not all or nothing, and refuse hits 0 on a spent limit: for costs known after the response (Envoy AI Gateway's token costs)"},
			&cli.BoolFlag{Name: "shadow-mode", EnvVars: []string{"RLFN_RLS_SHADOW_MODE"}, Usage: "answer every request OK overall, its statuses still saying which descriptors are over (the reference's SHADOW_MODE)"},
			&cli.BoolFlag{Name: "dynamic-metadata", EnvVars: []string{"RLFN_RLS_DYNAMIC_METADATA"}, Usage: "add the response's dynamic metadata: the request, and the metadata of the descriptors within their limits (the reference's RESPONSE_DYNAMIC_METADATA)"},
			&cli.IntFlag{Name: "denial-cache", EnvVars: []string{"RLFN_RLS_DENIAL_CACHE"}, Usage: "answer repeated denials from memory until their retry time, for up to this many keys (the reference's local cache); 0: off"},
			&cli.StringFlag{Name: "prefix", EnvVars: []string{"RLFN_RLS_PREFIX"}, Usage: `start of every server key (default "rl:")`},
			&cli.DurationFlag{Name: "max-connection-age", Value: 24 * time.Hour, EnvVars: []string{"RLFN_RLS_MAX_CONNECTION_AGE"}, Usage: "close a proxy's gRPC connection after this long (an hour's grace), so that connections spread over new replicas (the reference's GRPC_MAX_CONNECTION_AGE)"},
			&cli.DurationFlag{Name: "check-every", Value: 5 * time.Second, EnvVars: []string{"RLFN_RLS_CHECK_EVERY"}, Usage: "how often health checks the library's version on every primary"},
			&cli.DurationFlag{Name: "shutdown-timeout", Value: 15 * time.Second, EnvVars: []string{"RLFN_RLS_SHUTDOWN_TIMEOUT"}, Usage: "how long SIGTERM waits for the requests being decided"},
			&cli.BoolFlag{Name: "reconcile", EnvVars: []string{"RLFN_RLS_RECONCILE"}, Usage: "keep the newest library release this binary embeds on every primary, as rlfn reconcile does, every second (its user needs deployer.ReconcileACLRules)"},
			&cli.Float64Flag{Name: "near-limit-ratio", Value: rls.DefaultNearLimitRatio, EnvVars: []string{"RLFN_RLS_NEAR_LIMIT_RATIO"}, Usage: "share of a limit past which admitted hits count in rlfn_rls_near_limit_total (the reference's NEAR_LIMIT_RATIO), above 0 and at most 1"},
			&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: []string{"RLFN_RLS_LOG_LEVEL"}, Usage: "debug, info, warn or error"},
		}, append(extraFlags(), tracingFlags...)...),
		Action: serve,
	}
}

func serve(c *cli.Context) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := newLogger(c.App.ErrWriter, level)
	// What each of the reference's variables did is said whatever the level (the reference's
	// LOG_LEVEL is warn by default): a variable must never be ignored without a word.
	logReferenceEnv(c, newLogger(c.App.ErrWriter, slog.LevelInfo))
	xds, err := xdsSource(c, log)
	if err != nil {
		return err
	}
	if len(c.StringSlice("config")) == 0 && xds == nil {
		// Checked here, not by the flag's Required, which prints the whole help.
		return errors.New("--config is required: a configuration file or directory (or --xds-server)")
	}
	files := rls.Files{Paths: c.StringSlice("config"), Merge: c.Bool("merge-domains"), EveryFile: c.Bool("config-every-file")}
	var cfg *envoyconf.Config // with xDS, none until the first arrives
	if xds == nil {
		if cfg, err = files.Load(); err != nil {
			return fmt.Errorf("%s: %w", flagName(c, "config"), err)
		}
	}
	if err := checkNumbers(c); err != nil {
		return err
	}
	if err := checkMetrics(c); err != nil {
		return err
	}
	headers, err := parseHeaders(c.String("headers"))
	if err != nil {
		return err
	}
	base, err := parseFallback(c.String("fallback"))
	if err != nil {
		return fmt.Errorf("--fallback: %w", err)
	}
	policies := map[string]rls.Policy{}
	given := map[string]string{} // each domain's --policy, as given
	for _, p := range c.StringSlice("policy") {
		domain, pol, err := parsePolicy(p)
		if err != nil {
			return fmt.Errorf("--policy %q: %w", p, err)
		}
		if first, ok := given[domain]; ok {
			// The last would win silently: a fail_closed meant could become fail_open.
			return fmt.Errorf("--policy %q: the domain %q has a policy already, %q: give each domain one", p, domain, first)
		}
		given[domain] = p
		if cfg != nil && !cfg.HasDomain(domain) {
			// A misspelt domain would leave the one meant on --fallback, silently.
			return fmt.Errorf("--policy %q: no configuration has the domain %q (it has %s)", p, domain, strings.Join(slices.Sorted(slices.Values(cfg.Domains())), ", "))
		}
		policies[domain] = pol
	}
	opt, err := serverurl.Parse(c.String("url"))
	if err != nil {
		return err
	}
	if file := c.String("tls-ca"); file != "" && (opt.TLSConfig != nil || file != os.Getenv("RLFN_TLS_CA")) {
		// $RLFN_TLS_CA with a plain URL is no mistake (it serves the environment's TLS URLs,
		// as for the CLI); --tls-ca with one is.
		if err := serverurl.TrustCA(&opt, file, "--tls-ca"); err != nil {
			return err
		}
	}
	if err := clientCertificate(c, &opt, log); err != nil {
		return err
	}
	serverurl.BoundConnect(&opt, shortestDeadline(c.Duration("deadline"), policies))
	grpcTLS, err := serverTLS(c, log)
	if err != nil {
		return err
	}
	tr, err := startTracing(c, log)
	if err != nil {
		return err
	}
	// After the requests are drained and the limiters closed: their last spans are sent.
	defer tr.close(log)
	vk, err := valkey.NewClient(opt)
	if err != nil && opt.TLSConfig != nil && errors.Is(err, context.DeadlineExceeded) && len(opt.InitAddress) > 0 {
		// A TLS URL to a plain port (the reference's REDIS_TLS=true on a server without TLS)
		// gets no answer to its handshake: say so, as rlfn's connect hint does.
		err = fmt.Errorf("the TLS handshake with %s did not complete within %s (does the server speak TLS on that port?): %w", opt.InitAddress[0], opt.Dialer.Timeout, err)
	}
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", serverurl.Redact(c.String("url")), err)
	}
	defer vk.Close()

	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	metrics, err := rls.NewMetrics(mp)
	if err != nil {
		return err
	}
	if err := metrics.SetNearLimitRatio(c.Float64("near-limit-ratio")); err != nil {
		return fmt.Errorf("--near-limit-ratio: %w", err)
	}
	metrics.ConfigLoaded(nil)

	limiters, err := rls.NewLimiters(vk, client.Options{Prefix: c.String("prefix"), Deadline: c.Duration("deadline"), Fallback: base,
		Instances: c.Int("instances"), DenialCache: c.Int("denial-cache"), MeterProvider: mp,
		MaxRules: rls.RulesFor(c.Int("max-descriptors")), Logger: log, TracerProvider: tr.provider}, policies)
	if err != nil {
		return err
	}
	// Close stops the denial caches once the last request is answered.
	defer func() { _ = limiters.Close(context.Background()) }()
	svc := rls.NewService(limiters.For, cfg, rls.Options{Headers: headers, ShadowMode: c.Bool("shadow-mode"), ChargeWhatFits: c.Bool("charge-what-fits"), DynamicMetadata: c.Bool("dynamic-metadata"), Metrics: metrics,
		MaxDescriptors: c.Int("max-descriptors"), MaxEntries: c.Int("max-entries"), MaxValueBytes: c.Int("max-value-bytes"), Log: log})
	promHandler := promhttp.HandlerFor(registry, promhttp.HandlerOpts{})
	srv := rls.NewServer(svc, rls.ServerOptions{
		MaxInFlight:      c.Int("max-in-flight"),
		MaxRequestBytes:  c.Int("max-request-bytes"),
		MaxConnectionAge: c.Duration("max-connection-age"),
		Check:            func(ctx context.Context) error { return check(ctx, limiters, svc, c.Bool("healthy-without-config")) },
		CheckEvery:       c.Duration("check-every"),
		Metrics:          promHandler,
		TLS:              grpcTLS,
		NoJSON:           noJSON(c) != "",
		NoJSONReason:     noJSON(c),
		StatsHandler:     tr.stats,
		Log:              log,
	})
	m, err := metricsListener(c, promHandler)
	if err != nil {
		return err
	}
	g, err := net.Listen("tcp", c.String("grpc"))
	if err != nil {
		m.close()
		return fmt.Errorf("%s: %w", flagName(c, "grpc"), err)
	}
	var h net.Listener
	if addr := c.String("http"); addr != "" {
		if h, err = net.Listen("tcp", addr); err != nil {
			g.Close()
			m.close()
			return fmt.Errorf("%s: %w", flagName(c, "http"), err)
		}
	}
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		if xds != nil {
			_ = xds.Run(ctx, svc, metrics, log)
		} else if err := rls.Watch(ctx, files, svc, metrics, log, 200*time.Millisecond); err != nil {
			log.Error("configuration reload stopped", "err", err)
		}
	}()
	if c.Bool("reconcile") {
		stopped, err := startReconciler(ctx, opt, log, mp)
		if err != nil {
			g.Close()
			if h != nil {
				h.Close()
			}
			m.close()
			return err
		}
		defer func() { stop(); <-stopped }()
	}
	attrs := []any{"grpc", g.Addr().String()}
	if cfg != nil {
		attrs = append(attrs, "domains", len(cfg.Domains()))
	} else {
		attrs = append(attrs, "xds", xds.Server, "node", xds.Node.Id)
	}
	if h != nil {
		attrs = append(attrs, "http", h.Addr().String())
	}
	served := make(chan error, 2)
	if m != nil {
		attrs = append(attrs, "metrics", m.l.Addr().String()+m.path)
		go func() {
			if err := m.serve(); err != nil {
				served <- err
			}
		}()
	}
	log.Info("serving", attrs...)
	if why := noJSON(c); why != "" {
		log.Warn(why)
	}
	go func() { served <- srv.Serve(g, h) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), c.Duration("shutdown-timeout"))
	defer cancel()
	if m != nil {
		// Scraped to the end: the last counts of the requests drained below are lost, as a
		// scrape's interval loses them anyway.
		_ = m.shutdown(sctx)
	}
	if err := srv.Shutdown(sctx); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("requests still in flight after --shutdown-timeout %s were cut", c.Duration("shutdown-timeout"))
		}
		return err
	}
	return nil
}

// newLogger writes JSON lines at level and above. A duration is written as Go writes it
// ("1s", "6.939s"), not as slog's JSON writes it, a number of nanoseconds: the client's lines
// too (its circuit breaker's cooldown), which go through this logger.
func newLogger(w io.Writer, level slog.Leveler) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Value.Kind() == slog.KindDuration {
			a.Value = slog.StringValue(a.Value.Duration().String())
		}
		return a
	}}))
}

// checkNumbers refuses a number or duration the service cannot use, naming its flag: below
// the flag, the libraries would take 0 for their default or say which of their options is
// wrong, not which flag.
func checkNumbers(c *cli.Context) error {
	for _, name := range []string{"max-in-flight", "instances", "max-request-bytes", "max-descriptors", "max-entries", "max-value-bytes"} {
		if n := c.Int(name); n < 1 {
			return fmt.Errorf("--%s %d: must be 1 or more", name, n)
		}
	}
	if n := c.Int("denial-cache"); n < 0 {
		return fmt.Errorf("--denial-cache %d: must be 0 (off) or more", n)
	}
	for _, name := range []string{"deadline", "check-every", "shutdown-timeout", "max-connection-age"} {
		if d := c.Duration(name); d <= 0 {
			return fmt.Errorf("--%s %s: must be more than 0", name, d)
		}
	}
	return nil
}

func parseHeaders(s string) (rls.Headers, error) {
	switch s {
	case "none", "":
		return rls.NoHeaders, nil
	case "reference":
		return rls.ReferenceHeaders, nil
	case "draft":
		return rls.DraftHeaders, nil
	}
	return 0, fmt.Errorf("--headers %q: one of none, reference, draft", s)
}

func parseFallback(s string) (client.Fallback, error) {
	switch s {
	case "return_error":
		return client.ReturnError, nil
	case "local":
		return client.LocalFallback, nil
	case "fail_closed":
		return client.FailClosed, nil
	case "fail_open":
		return client.FailOpen, nil
	}
	return 0, fmt.Errorf("%q is not one of return_error, local, fail_closed, fail_open", s)
}

// parsePolicy reads domain:fallback=fail_open,deadline=50ms.
func parsePolicy(s string) (string, rls.Policy, error) {
	var p rls.Policy
	domain, rest, ok := strings.Cut(s, ":")
	if !ok || domain == "" || rest == "" {
		return "", p, errors.New("want domain:fallback=...,deadline=...")
	}
	for _, kv := range strings.Split(rest, ",") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "fallback":
			f, err := parseFallback(v)
			if err != nil {
				return "", p, err
			}
			p.Fallback, p.HasFallback = f, true
		case "deadline":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return "", p, fmt.Errorf("deadline %q is not a positive duration", v)
			}
			p.Deadline = d
		default:
			return "", p, fmt.Errorf("unknown setting %q: fallback or deadline", k)
		}
	}
	return domain, p, nil
}

// shortestDeadline is the shortest of --deadline and the policies' deadlines.
func shortestDeadline(d time.Duration, policies map[string]rls.Policy) time.Duration {
	for _, p := range policies {
		if p.Deadline > 0 {
			d = min(d, p.Deadline)
		}
	}
	return d
}

// startReconciler runs, until ctx ends, the reconciler rlfn reconcile runs: the newest
// release embedded here on every primary, checked every second. The channel is closed once
// it has stopped.
func startReconciler(ctx context.Context, opt valkey.ClientOption, log *slog.Logger, mp metric.MeterProvider) (<-chan struct{}, error) {
	r, err := deployer.NewReconciler(ctx, opt, deployer.ReconcileOptions{Release: versions.Embedded().Latest(), Logger: log.With("component", "reconciler"), MeterProvider: mp})
	if err != nil {
		return nil, fmt.Errorf("--reconcile: %w", err)
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		defer r.Close()
		_ = r.Run(ctx)
	}()
	return stopped, nil
}
