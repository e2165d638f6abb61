package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/util/teststorage"
	"github.com/valkey-io/valkey-go"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/grpclimit"
	"github.com/rlfn/rlfn/client/httplimit"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/rls"
)

// The dashboard and the alerting rules of docs/observability, run against what services
// export: an HTTP service and a gRPC service with three named limits and a plain Limiter
// service, on a real Valkey, under load. Their Prometheus endpoint (the OpenTelemetry
// exporter's) is scraped once per phase step, each scrape stored one virtual minute after the
// last, and Prometheus's own engine evaluates every panel's query and every rule over the
// samples: each panel returns data, each alert fires in the phase it is for (a limit driven
// above 90% for more than 10 minutes; Valkey killed; Valkey back without the library; the
// plain service's overrides unreadable from the kill on; a route's settlements by outcome
// failing while hot; rlfn-rls's configuration failing to load while hot) and none fires in the quiet phase. The log of each service says once that the fallback decides
// and once that the server decides again.
func TestObservability(t *testing.T) {
	s := harness.StartValkey(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	admin := s.Client(t)
	if err := load(ctx, admin); err != nil {
		t.Fatal(err)
	}

	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	endpoint := httptest.NewServer(promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	t.Cleanup(endpoint.Close)

	// One Limiter per service, each with its own log.
	logs := map[string]*lockedBuffer{"plain": {}, "http": {}, "grpc": {}}
	newLimiter := func(name string, overrides bool) *client.Limiter {
		vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{s.Addr}, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(vk.Close)
		return harness.NewLimiter(t, vk, client.Options{
			MeterProvider: mp,
			Logger:        slog.New(slog.NewJSONHandler(logs[name], nil)),
			// long enough that a loaded machine never times a call out while the server
			// lives: the quiet phase has no fallback, and the log one episode
			Deadline:        2 * time.Second,
			BreakerFailures: 2,
			BreakerCooldown: 200 * time.Millisecond,
			// the plain service's read through a client without a cache: once a second
			Overrides: overrides,
		})
	}
	plain, httpLim, grpcLim := newLimiter("plain", true), newLimiter("http", false), newLimiter("grpc", false)

	limits := map[string]client.Limit{
		"login":  client.FixedWindow{Limit: 100, Window: time.Minute},
		"api":    client.TokenBucket{Capacity: 100, Rate: 100, Period: time.Minute},
		"search": client.FixedWindow{Limit: 5, Window: time.Minute},
	}
	policy := func(name string) httplimit.Policy {
		return httplimit.Policy{Name: name, Limit: limits[name], NearLimit: 0.8}
	}
	mw, err := httplimit.New(httpLim, httplimit.Options{
		Key:           func(r *http.Request) (string, error) { return r.Header.Get("X-Key"), nil },
		Policy:        func(r *http.Request) httplimit.Policy { return policy(strings.TrimPrefix(r.URL.Path, "/")) },
		Policies:      []httplimit.Policy{policy("login"), policy("api"), policy("search")},
		MeterProvider: mp,
		// the middleware's own lines beside its Limiter's: nothing is said twice
		Logger: slog.New(slog.NewJSONHandler(logs["http"], nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	web := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	t.Cleanup(web.Close)
	// A route that counts failures alone, whose refunds of the requests that succeed are lost
	// (its Limiter's Refund fails): asked in the hot phase, its settlements fail.
	umw, err := httplimit.New(failingRefunds{plain}, httplimit.Options{
		Key: func(r *http.Request) (string, error) { return r.Header.Get("X-Key"), nil },
		Policy: func(*http.Request) httplimit.Policy {
			return httplimit.Policy{Name: "signup", Limit: client.FixedWindow{Limit: 1000, Window: time.Minute},
				Outcome: &httplimit.Outcome{Count: httplimit.Failures}}
		},
		MeterProvider: mp,
		OnError:       func(*http.Request, error) {}, // the metric says it; the log lines are the Limiters'
	})
	if err != nil {
		t.Fatal(err)
	}
	unsettling := httptest.NewServer(umw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	t.Cleanup(unsettling.Close)
	// rlfn-rls's configuration loads, counted as its watcher counts each reload: a broken
	// file, reloaded in the hot phase, does not load.
	rlsMetrics, err := rls.NewMetrics(mp)
	if err != nil {
		t.Fatal(err)
	}
	brokenConfig := rls.Files{Paths: []string{filepath.Join(t.TempDir(), "config.yaml")}}
	if err := os.WriteFile(brokenConfig.Paths[0], []byte("domain: [unclosed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gpolicy := func(name string) grpclimit.Policy {
		return grpclimit.Policy{Name: name, Limit: limits[name], NearLimit: 0.8}
	}
	rpc := grpcPair(t, grpcLim, grpclimit.ServerOptions{
		Methods: map[string]grpclimit.Policy{
			"/grpc.testing.TestService/EmptyCall": gpolicy("api"),
			"/grpc.testing.TestService/UnaryCall": gpolicy("search"),
		},
		MeterProvider: mp,
		Logger:        slog.New(slog.NewJSONHandler(logs["grpc"], nil)),
	}, nil, nil)

	// Traffic: fresh keys, far from their limits, except the hot key of search when hot.
	var seq int
	var nearHTTP, nearGRPC bool
	traffic := func(hot bool) {
		if hot {
			_, err := brokenConfig.Load()
			if err == nil {
				t.Fatal("a broken rlfn-rls configuration loads")
			}
			rlsMetrics.ConfigLoaded(err)
		}
		for range 10 {
			seq++
			key := "obs-" + strconv.Itoa(seq)
			for _, path := range []string{"/login", "/api", "/search"} {
				k := key
				if hot && path == "/search" {
					k = "hot"
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", web.URL+path, nil)
				req.Header.Set("X-Key", k)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				if resp.Header.Get("RateLimit-Near") == `"search"` {
					nearHTTP = true
				}
				resp.Body.Close()
			}
			rpc.EmptyCall(withKey(ctx, key), &testgrpc.Empty{})
			k := key
			if hot {
				k = "hot"
			}
			var header metadata.MD
			rpc.UnaryCall(withKey(ctx, k), &testgrpc.SimpleRequest{}, grpc.Header(&header))
			if slices.Contains(header.Get(grpclimit.MetadataNear), `"search"`) {
				nearGRPC = true
			}
			if _, err := plain.Allow(ctx, key, client.TokenBucket{Capacity: 50, Rate: 50, Period: time.Minute, Name: "plain"}); err != nil {
				t.Fatal(err)
			}
			if hot {
				req, _ := http.NewRequestWithContext(ctx, "GET", unsettling.URL, nil)
				req.Header.Set("X-Key", key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
		}
	}

	st := teststorage.New(t)
	start := time.Now().Truncate(time.Minute)
	step := 0
	scrape := func() time.Time {
		ts := start.Add(time.Duration(step) * time.Minute)
		step++
		storeScrape(t, st, endpoint.URL, ts)
		return ts
	}
	type phase struct {
		name       string
		from, till time.Time
	}
	var phases []phase
	// overrideErrors is the plain service's count of reads of the overrides that failed.
	overrideErrors := func() float64 {
		families, err := registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0.0
		for _, f := range families {
			if f.GetName() == "rlfn_client_overrides_errors_total" {
				for _, m := range f.GetMetric() {
					n += m.GetCounter().GetValue()
				}
			}
		}
		return n
	}
	// run scrapes steps times after traffic; with unreadable, once the overrides' reads have
	// failed again since the last step (a read is due once a second: minutes pass faster).
	run := func(name string, steps int, hot, unreadable bool) {
		p := phase{name: name}
		for i := range steps {
			before := overrideErrors()
			traffic(hot)
			for unreadable && overrideErrors() == before {
				if ctx.Err() != nil {
					t.Fatal("the overrides' reads never failed with the server gone")
				}
				time.Sleep(50 * time.Millisecond)
				traffic(false)
			}
			ts := scrape()
			if i == 0 {
				p.from = ts
			}
			p.till = ts
		}
		phases = append(phases, p)
	}

	run("quiet", 12, false, false)
	run("hot", 15, true, false)         // RlfnLimitNearCeiling needs 10 minutes, and 5 for its rate to see the phase alone
	if err := s.Stop(ctx); err != nil { // kill -9: no shutdown
		t.Fatal(err)
	}
	run("killed", 6, false, true)        // RlfnOverridesUnreadable needs 5 minutes of failed reads
	if err := s.Start(ctx); err != nil { // back empty: no library
		t.Fatal(err)
	}
	run("not_loaded", 4, false, false)
	// the admin client's connection died with the server: the first command may meet it
	for err := load(ctx, admin); err != nil; err = load(ctx, admin) {
		if ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	run("recovered", 3, false, false)
	end := phases[len(phases)-1].till
	if !nearHTTP || !nearGRPC {
		t.Errorf("an admitted request of search past its NearLimit said RateLimit-Near: %v; a call ratelimit-near: %v", nearHTTP, nearGRPC)
	}

	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 50_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	p := parser.NewParser(parser.Options{})

	// Every panel of the dashboard returns data over the run.
	raw, err := os.ReadFile("../docs/observability/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	if len(dash.Panels) == 0 {
		t.Fatal("the dashboard has no panel")
	}
	for _, panel := range dash.Panels {
		if len(panel.Targets) == 0 {
			t.Errorf("panel %q has no query", panel.Title)
		}
		for _, target := range panel.Targets {
			if _, err := p.ParseExpr(target.Expr); err != nil {
				t.Errorf("panel %q: %v", panel.Title, err)
				continue
			}
			q, err := engine.NewRangeQuery(ctx, st, nil, target.Expr, start, end, time.Minute)
			if err != nil {
				t.Fatalf("panel %q: %v", panel.Title, err)
			}
			res := q.Exec(ctx)
			m, err := res.Matrix()
			switch {
			case err != nil:
				t.Errorf("panel %q: %v", panel.Title, err)
			case len(m) == 0:
				t.Errorf("panel %q returns no data: %s", panel.Title, target.Expr)
			}
			q.Close()
		}
	}

	// Every rule parses, and fires in its phase alone.
	groups, errs := rulefmt.ParseFile("../docs/observability/alerts.yaml", false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	firesIn := map[string]string{
		"RlfnLimitNearCeiling":  "hot",
		"RlfnFallbackDeciding":  "killed",
		"RlfnLibraryNotLoaded":  "not_loaded",
		"RlfnOutcomesUnsettled": "hot",
		"RlfnRLSConfigFailing":  "hot",
		// for 5 minutes after the reads first fail: the server back without its library
		"RlfnOverridesUnreadable": "not_loaded",
	}
	phaseAt := func(ts time.Time) string {
		for _, ph := range phases {
			if !ts.Before(ph.from) && !ts.After(ph.till) {
				return ph.name
			}
		}
		return ""
	}
	query := rules.EngineQueryFunc(engine, st)
	n := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			expr, err := p.ParseExpr(r.Expr)
			if err != nil {
				t.Fatal(err)
			}
			rule := rules.NewAlertingRule(r.Alert, expr, time.Duration(r.For), time.Duration(r.KeepFiringFor),
				labels.FromMap(r.Labels), labels.FromMap(r.Annotations), labels.EmptyLabels(), "", true, slog.New(slog.DiscardHandler))
			firing := map[string]bool{}
			for ts := start; !ts.After(end); ts = ts.Add(time.Minute) {
				if _, err := rule.Eval(ctx, 0, ts, query, nil, 0); err != nil {
					t.Fatalf("%s at %s: %v", r.Alert, ts, err)
				}
				for _, a := range rule.ActiveAlerts() {
					if a.State == rules.StateFiring {
						firing[phaseAt(ts)] = true
					}
				}
			}
			if firing["quiet"] {
				t.Errorf("%s fires in the quiet phase", r.Alert)
			}
			if want, ok := firesIn[r.Alert]; ok && !firing[want] {
				t.Errorf("%s does not fire in phase %s (fires in %v)", r.Alert, want, firing)
			}
		}
	}
	if n < 6 {
		t.Errorf("%d alerting rules, want fallback, library, limit, unsettled, overrides and RLS config ones", n)
	}

	// Each service said once that the fallback decides, and once that the server decides again.
	for name, buf := range logs {
		events := map[string]int{}
		for line := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\n") {
			var l struct{ Event, Node, Limit string }
			if err := json.Unmarshal([]byte(line), &l); err != nil {
				t.Fatalf("%s: %q: %v", name, line, err)
			}
			if l.Node != s.Addr {
				t.Errorf("%s: node %q, want %s: %s", name, l.Node, s.Addr, line)
			}
			events[l.Event]++
		}
		if events["fallback"] != 1 || events["recovered"] != 1 || events["library_missing"] < 1 {
			t.Errorf("%s service logged %v, want fallback and recovered once each, library_missing:\n%s", name, events, buf.String())
		}
	}
}

// lockedBuffer is a log's output, written from the Limiter's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// storeScrape scrapes url (the Prometheus text format) and appends its samples to st at ts, as
// Prometheus would store them: a counter or gauge as its value, a histogram as its _bucket (with
// le), _sum and _count series.
func storeScrape(t *testing.T, st *teststorage.TestStorage, url string, ts time.Time) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	tp := expfmt.NewTextParser(model.UTF8Validation)
	families, err := tp.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("scrape: %v\n%s", err, body)
	}
	app := st.Appender(context.Background())
	ms := ts.UnixMilli()
	add := func(name string, m *dto.Metric, extra map[string]string, v float64) {
		lb := map[string]string{"__name__": name, "job": "rlfn-test", "instance": "service"}
		for _, l := range m.GetLabel() {
			lb[l.GetName()] = l.GetValue()
		}
		for k, v := range extra {
			lb[k] = v
		}
		if _, err := app.Append(0, labels.FromMap(lb), ms, v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				add(name, m, nil, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add(name, m, nil, m.GetGauge().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				inf := false
				for _, b := range h.GetBucket() {
					inf = inf || math.IsInf(b.GetUpperBound(), 1)
					add(name+"_bucket", m, map[string]string{"le": formatLe(b.GetUpperBound())}, float64(b.GetCumulativeCount()))
				}
				if !inf {
					add(name+"_bucket", m, map[string]string{"le": "+Inf"}, float64(h.GetSampleCount()))
				}
				add(name+"_sum", m, nil, h.GetSampleSum())
				add(name+"_count", m, nil, float64(h.GetSampleCount()))
			}
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
}

// formatLe writes a bucket bound as Prometheus writes le.
func formatLe(f float64) string {
	if math.IsInf(f, 1) {
		return "+Inf"
	}
	return fmt.Sprint(model.SampleValue(f))
}
