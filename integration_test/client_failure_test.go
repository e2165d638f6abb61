package integration_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
)

// The failure settings of the test's Limiters.
const (
	failDeadline = 100 * time.Millisecond
	failCooldown = 500 * time.Millisecond
	failBreaker  = 5
	// slack is what a loaded machine may add to a deadline: no call may take longer than the
	// deadline plus this.
	slack = 250 * time.Millisecond
	// pauseFor is how long the server hangs (CLIENT PAUSE) before it is killed.
	pauseFor = 2 * time.Second
	// instances shares each limit for the local fallback: capacity 40 is 10 per instance.
	instances = 4
)

// failLimit is the limit every worker calls: no refill to speak of during the test, so the
// local fallback admits exactly capacity / instances per key.
var failLimit = client.TokenBucket{Capacity: 40, Rate: 1, Period: time.Hour}

// record is one call a worker made.
type record struct {
	start time.Time
	took  time.Duration
	res   client.Result
	err   error
}

// policyRun is one Limiter under a policy, with its own connection, so that its dials are its
// own.
type policyRun struct {
	policy  client.Fallback
	lim     *client.Limiter
	dials   atomic.Int64
	reader  *sdkmetric.ManualReader
	keys    []string
	records [][]record // per worker
}

// A server hung, then killed, mid-traffic: under each policy, the decisions it cannot make are
// as the policy promises and come within the deadline; the breaker opens and then sends
// nothing but its probes; a server back without its library (no persistence) still falls
// under the policy; and each time the server can answer again, it decides again within a
// bounded time.
func TestClientServerKilled(t *testing.T) {
	for _, srv := range []struct {
		name  string
		start func(testing.TB, ...string) *harness.Server
	}{
		{"valkey8", harness.StartValkey},
		{"redis7.0", harness.StartRedis},
	} {
		t.Run(srv.name, func(t *testing.T) { serverKilled(t, srv.start(t)) })
	}
}

func serverKilled(t *testing.T, s *harness.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := s.Client(t)
	if err := load(ctx, admin); err != nil {
		t.Fatal(err)
	}

	const workers = 3
	var runs []*policyRun
	for _, p := range []client.Fallback{client.ReturnError, client.FailOpen, client.FailClosed, client.LocalFallback} {
		r := &policyRun{policy: p, reader: sdkmetric.NewManualReader(), records: make([][]record, workers)}
		vk, err := valkey.NewClient(valkey.ClientOption{
			InitAddress:       []string{s.Addr},
			DisableCache:      true,
			ForceSingleClient: true,
			DialCtxFn: func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
				r.dials.Add(1)
				return d.DialContext(ctx, "tcp", addr)
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(vk.Close)
		r.lim = harness.NewLimiter(t, vk, client.Options{
			Fallback:        p,
			Deadline:        failDeadline,
			BreakerFailures: failBreaker,
			BreakerCooldown: failCooldown,
			Instances:       instances,
			MeterProvider:   sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader)),
		})
		for range workers {
			r.keys = append(r.keys, keyFor(t))
		}
		runs = append(runs, r)
	}

	tr := newTraffic(t)
	for _, r := range runs {
		for w := range workers {
			tr.call(r.lim, r.keys[w], &r.records[w])
		}
	}

	time.Sleep(300 * time.Millisecond)
	// Hung: the server takes connections and commands but runs none for a while, so calls
	// end at their deadline. Calls from when the command is sent may already hang.
	pauseSent := time.Now()
	if err := admin.Do(ctx, admin.B().ClientPause().Timeout(pauseFor.Milliseconds()).All().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	pausedAt := time.Now()
	time.Sleep(pauseFor + failCooldown + failDeadline + slack + 300*time.Millisecond)

	// Killed.
	killAt := time.Now()
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	// Long enough for many cooldowns: the breaker must open, probe and open again.
	time.Sleep(4 * failCooldown)
	down := countNow(t, runs)
	time.Sleep(2 * failCooldown)
	down2 := countNow(t, runs)

	// Back without data, so without the library, as a server without persistence restarts.
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	startedAt := time.Now()
	time.Sleep(3 * failCooldown)
	// Calls from when the load is sent may find the library.
	loadSent := time.Now()
	if err := load(ctx, admin); err != nil {
		t.Fatal(err)
	}
	loadedAt := time.Now()
	time.Sleep(failCooldown + failDeadline + slack + 300*time.Millisecond)
	tr.end()

	// What each call must be, by when it started; calls in between (a kill under way, a pause
	// ending) are only held to the deadline. recover: the server decides again by recoverBy,
	// and every call after that is its decision. After the pause, the breaker closes at its
	// next probe: at most a cooldown later, plus the deadline of a probe on its way, plus
	// slack. After the library is loaded, at once: the server answered ErrNotLoaded, which
	// is an answer, so the breaker was closed already.
	type phase struct {
		name      string
		from, to  time.Time
		want      string // "server", "policy", "policy, library absent" or "recover"
		recoverBy time.Time
	}
	pauseEnds := pausedAt.Add(pauseFor)
	phases := []phase{
		{name: "before the pause", to: pauseSent, want: "server"},
		{name: "paused", from: pausedAt, to: pauseEnds.Add(-failDeadline - slack), want: "policy"},
		{name: "pause over", from: pauseEnds, to: killAt, want: "recover", recoverBy: pauseEnds.Add(failCooldown + failDeadline + slack)},
		{name: "killed", from: stoppedAt, to: startedAt, want: "policy"},
		// Right after the restart a probe may still time out (reconnecting on a loaded
		// machine): any policy decision; after a cooldown, the server answers ErrNotLoaded.
		{name: "restarting", from: startedAt, to: startedAt.Add(failCooldown + failDeadline + slack), want: "policy"},
		{name: "back without library", from: startedAt.Add(failCooldown + failDeadline + slack), to: loadSent, want: "policy, library absent"},
		{name: "library loaded", from: loadedAt, to: time.Now(), want: "recover", recoverBy: loadedAt.Add(slack)},
	}
	for i, r := range runs {
		t.Run(r.policy.String(), func(t *testing.T) {
			var maxTook time.Duration
			var local, localAllowed, calls int
			for w, recs := range r.records {
				// local admissions per outage: the local state is dropped when the server is back
				var allowedPaused, allowedKilled int
				for _, ph := range phases {
					var recovered time.Time
					for _, rec := range recs {
						if rec.start.Before(ph.from) || !rec.start.Before(ph.to) {
							continue
						}
						// A call still in flight when its phase ended (a restart, a load) may be
						// decided by what came next: a policy phase holds only calls that ended in it.
						if strings.HasPrefix(ph.want, "policy") && !rec.start.Add(rec.took).Before(ph.to) {
							continue
						}
						switch ph.want {
						case "server":
							if rec.err != nil || rec.res.Source == client.FromFallback {
								t.Errorf("%s: %+v, %v; want the server's decision", ph.name, rec.res, rec.err)
							}
						case "policy", "policy, library absent":
							checkPolicy(t, ph.name, r.policy, rec, ph.want != "policy")
						case "recover":
							if recovered.IsZero() && rec.err == nil && rec.res.Source != client.FromFallback {
								recovered = rec.start
							}
							if !recovered.IsZero() && (rec.err != nil || rec.res.Source == client.FromFallback) {
								t.Errorf("%s, %s after recovery: %+v, %v; want the server's decision",
									ph.name, rec.start.Sub(recovered), rec.res, rec.err)
							}
						}
					}
					if ph.want == "recover" && (recovered.IsZero() || recovered.After(ph.recoverBy)) {
						t.Errorf("%s: worker %d: the server decides again %s after, want within %s",
							ph.name, w, recovered.Sub(ph.from), ph.recoverBy.Sub(ph.from))
					}
				}
				for _, rec := range recs {
					calls++
					maxTook = max(maxTook, rec.took)
					if rec.took > failDeadline+slack {
						t.Errorf("a call took %s, past the deadline %s + %s", rec.took, failDeadline, slack)
					}
					if rec.res.Source == client.FromFallback {
						local++
						if rec.res.Allowed {
							localAllowed++
							if rec.start.Before(killAt) {
								allowedPaused++
							} else {
								allowedKilled++
							}
						}
					}
				}
				if share := int(failLimit.Capacity / instances); r.policy == client.LocalFallback &&
					(allowedPaused != share || allowedKilled != share) {
					t.Errorf("worker %d: the local fallback admitted %d while paused and %d while killed, want its share %d each",
						w, allowedPaused, allowedKilled, share)
				}
			}
			// Between the two counts the breaker was open but for its probes: one dial at most
			// per probe.
			dials := down2[i].dials - down[i].dials
			probes := down2[i].probes - down[i].probes
			if probes < 1 || probes > 3 || dials > probes {
				t.Errorf("server down for %s: %d dials for %d probes; want 1 to 3 probes and no other dial",
					down2[i].at.Sub(down[i].at), dials, probes)
			}
			t.Logf("%d calls, %d decided locally (%d allowed), max latency %s; killed, over %s: %d dials, %d probes; %d dials in all",
				calls, local, localAllowed, maxTook.Round(time.Microsecond), down2[i].at.Sub(down[i].at).Round(time.Millisecond),
				dials, probes, r.dials.Load())
		})
	}
}

// checkPolicy checks a call made while the server could not decide: stopped, or back without
// its library (notLoaded).
func checkPolicy(t *testing.T, phase string, p client.Fallback, rec record, notLoaded bool) {
	t.Helper()
	res, err := rec.res, rec.err
	switch p {
	case client.ReturnError:
		ok := err != nil && res == (client.Result{})
		if notLoaded {
			ok = ok && (errors.Is(err, client.ErrNotLoaded) || errors.Is(err, client.ErrCircuitOpen))
		}
		if !ok {
			t.Errorf("%s: %+v, %v; want an error", phase, res, err)
		}
	case client.FailOpen:
		if err != nil || res.Source != client.FromFallback || !res.Allowed || res.Limit != failLimit.Capacity {
			t.Errorf("%s: %+v, %v; want admitted, locally", phase, res, err)
		}
	case client.FailClosed:
		if err != nil || res.Source != client.FromFallback || res.Allowed || res.RetryAfter <= 0 || res.RetryAfter > failCooldown {
			t.Errorf("%s: %+v, %v; want denied locally, RetryAfter within the cooldown", phase, res, err)
		}
	case client.LocalFallback:
		if err != nil || res.Source != client.FromFallback || res.Limit != failLimit.Capacity/instances {
			t.Errorf("%s: %+v, %v; want a local decision against the share", phase, res, err)
		}
	}
}

// traffic is workers calling Allow continuously, a little spaced so that local decisions (a
// microsecond each) do not fill memory with records, until end.
type traffic struct {
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

// newTraffic returns a traffic that ends, at the latest, with the test.
func newTraffic(t *testing.T) *traffic {
	tr := &traffic{stop: make(chan struct{})}
	t.Cleanup(tr.end)
	return tr
}

// call starts a worker calling lim.Allow for key and appending each call to *recs.
func (tr *traffic) call(lim *client.Limiter, key string, recs *[]record) {
	tr.wg.Go(func() {
		for {
			select {
			case <-tr.stop:
				return
			default:
			}
			start := time.Now()
			res, err := lim.Allow(context.Background(), key, failLimit)
			*recs = append(*recs, record{start, time.Since(start), res, err})
			time.Sleep(500 * time.Microsecond)
		}
	})
}

// end stops the workers and waits for them: their records are complete when it returns.
func (tr *traffic) end() {
	tr.once.Do(func() { close(tr.stop) })
	tr.wg.Wait()
}

// counts is a policyRun's dials and breaker probes at one time.
type counts struct {
	at            time.Time
	dials, probes int64
}

func countNow(t *testing.T, runs []*policyRun) []counts {
	t.Helper()
	out := make([]counts, len(runs))
	for i, r := range runs {
		out[i] = counts{at: time.Now(), dials: r.dials.Load(), probes: transitions(t, r.reader, "half_open")}
	}
	return out
}

// transitions is how many times the breaker entered state.
func transitions(t *testing.T, reader *sdkmetric.ManualReader, state string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "rlfn.client.breaker.transitions" {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, _ := p.Attributes.Value("rlfn.breaker.state"); v.AsString() == state {
					return p.Value
				}
			}
		}
	}
	return 0
}

// On a cluster, the primary holding a principal's slot killed mid-traffic: the principal's
// calls fall to the local fallback within the deadline, the breaker spares the dead node all
// but its probes, and once the node is back with the library the cluster decides again.
func TestClientClusterPrimaryKilled(t *testing.T) {
	cl := harness.StartCluster(t, 3, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, p := range cl.Primaries {
		if err := load(ctx, p.Client(t)); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	dials := map[string]int64{}
	dialsTo := func(addr string) int64 {
		mu.Lock()
		defer mu.Unlock()
		return dials[addr]
	}
	vk, err := valkey.NewClient(valkey.ClientOption{
		InitAddress:  cl.Addrs(),
		DisableCache: true,
		DialCtxFn: func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
			mu.Lock()
			dials[addr]++
			mu.Unlock()
			return d.DialContext(ctx, "tcp", addr)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vk.Close)
	reader := sdkmetric.NewManualReader()
	lim := harness.NewLimiter(t, vk, client.Options{
		Fallback:        client.LocalFallback,
		Deadline:        failDeadline,
		BreakerFailures: failBreaker,
		BreakerCooldown: failCooldown,
		Instances:       instances,
		MeterProvider:   sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
	})

	key := keyFor(t)
	if res, err := lim.Allow(ctx, key, failLimit); err != nil || res.Source == client.FromFallback {
		t.Fatalf("first call: %+v, %v", res, err)
	}
	var victim *harness.Server
	for _, p := range cl.Primaries {
		pc := p.Client(t)
		n, err := pc.Do(ctx, pc.B().Exists().Key(lim.Key(key, failLimit)).Build()).AsInt64()
		if err == nil && n == 1 {
			victim = p
		}
	}
	if victim == nil {
		t.Fatalf("no primary holds %s", key)
	}

	const workers = 2 // on one key: the share is the key's, whichever goroutine asks
	records := make([][]record, workers)
	tr := newTraffic(t)
	for w := range workers {
		tr.call(lim, key, &records[w])
	}

	time.Sleep(300 * time.Millisecond)
	killAt := time.Now()
	if err := victim.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	time.Sleep(4 * failCooldown)
	dials0, probes0, at0 := dialsTo(victim.Addr), transitions(t, reader, "half_open"), time.Now()
	time.Sleep(2 * failCooldown)
	dials1, probes1, at1 := dialsTo(victim.Addr), transitions(t, reader, "half_open"), time.Now()

	if err := victim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cl.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	// back empty: the deploy's job, done here
	vc := victim.Client(t)
	loadSent := time.Now() // calls from then may find the library
	if err := load(ctx, vc); err != nil {
		t.Fatal(err)
	}
	loadedAt := time.Now()
	recoverBy := loadedAt.Add(failCooldown + failDeadline + slack)
	time.Sleep(time.Until(recoverBy) + 300*time.Millisecond)
	tr.end()

	var maxTook time.Duration
	var calls, local, allowedLocally int
	for w, recs := range records {
		var recovered time.Time
		for _, rec := range recs {
			calls++
			maxTook = max(maxTook, rec.took)
			if rec.took > failDeadline+slack {
				t.Errorf("a call took %s, past the deadline %s + %s", rec.took, failDeadline, slack)
			}
			if rec.res.Source == client.FromFallback {
				local++
				if rec.res.Allowed {
					allowedLocally++
				}
			}
			switch {
			case rec.start.Before(killAt):
				if rec.err != nil || rec.res.Source == client.FromFallback {
					t.Errorf("before the kill: %+v, %v; want the server's decision", rec.res, rec.err)
				}
			// A call is the policy's only if it ended before the load was sent: one that
			// started before but was still in flight may be decided by the reloaded server.
			case rec.start.After(stoppedAt) && rec.start.Add(rec.took).Before(loadSent):
				checkPolicy(t, "primary down", client.LocalFallback, rec, false)
			case rec.start.After(loadedAt):
				if recovered.IsZero() && rec.err == nil && rec.res.Source != client.FromFallback {
					recovered = rec.start
				}
				if !recovered.IsZero() && (rec.err != nil || rec.res.Source == client.FromFallback) {
					t.Errorf("after recovery: %+v, %v; want the server's decision", rec.res, rec.err)
				}
			}
		}
		if recovered.IsZero() || recovered.After(recoverBy) {
			t.Errorf("worker %d: the cluster decides again %s after the library is back, want within %s",
				w, recovered.Sub(loadedAt), recoverBy.Sub(loadedAt))
		}
	}
	if share := int(failLimit.Capacity / instances); allowedLocally != share {
		t.Errorf("the local fallback admitted %d for the key, want its share %d", allowedLocally, share)
	}
	// A failed probe makes valkey-go refresh the cluster's topology, which may dial the dead
	// node again: a few dials per probe, against the thousands of calls of the same second.
	if probes := probes1 - probes0; probes < 1 || probes > 3 || dials1-dials0 > 4*probes {
		t.Errorf("primary down for %s: %d dials to it for %d probes; want 1 to 3 probes and at most 4 dials each",
			at1.Sub(at0), dials1-dials0, probes)
	}
	t.Logf("%d calls, %d decided locally (%d allowed), max latency %s; primary down, over %s: %d dials to it, %d probes",
		calls, local, allowedLocally, maxTook.Round(time.Microsecond), at1.Sub(at0).Round(time.Millisecond),
		dials1-dials0, probes1-probes0)
}
