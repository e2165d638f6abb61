package deploy

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/versions"
)

// interval is the reconciler's, as the figures ask: 1s.
const interval = time.Second

// TestReconcile runs on a cluster of its own, of three primaries without replicas, which it
// changes as operators do, while a reconciler (as a user with ReconcileACLRules alone) keeps
// the newest release on every primary, and clients decide on keys of every slot:
//   - scale-out: a fourth primary joins with CLUSTER MEET; the reconciler loads it; then
//     1,000 slots, with their live limiter keys, move to it with MIGRATE while decisions
//     run: no decision goes to the fallback, no client logs a missing library, and every
//     key, moved or not, keeps its state on the server (its count is the server's
//     admissions, no more, no less);
//   - a deploy in progress (the lock held) is waited for, never fought;
//   - a node whose ACL refuses FUNCTION LOAD is reported and backed off from, and loaded
//     once its ACL allows it;
//   - replacement: a primary with no replica dies and an empty node takes its slots
//     (CLUSTER ADDSLOTS) while no reconciler runs: the client logs the missing library and
//     decides by its fallback; a reconciler started then heals it;
//   - a reconciler pinned to an older release never downgrades.
//
// The figures (time from a node's join to its library, from a reconciler's start to the
// replacement healed) are logged.
func TestReconcile(t *testing.T) {
	cl := harness.StartCluster(t, 3, 0)
	for _, s := range cl.Nodes() {
		prepareNode(t, s, "+function|load")
	}
	pinned := versions.Embedded().Latest()
	deploy(t, discover(t, urlOf(cl.Primaries[0])), pinned, false)

	rec := startReconciler(t, cl.Primaries[0], pinned, interval)

	// Clients whose keys span every slot: one principal per slot.
	principals := principalsBySlot()
	load := startLoad(t, cl, principals)

	// Nodes are added with the whole test's t: a subtest's would remove them at its end.
	top := t
	var joined *harness.Server
	t.Run("scale-out", func(t *testing.T) {
		began := time.Now()
		joined = cl.MeetPrimary(top)
		prepareNode(t, joined, "+function|load")
		met := time.Now()
		waitCode(t, joined, pinned.Code)
		t.Logf("FIGURE scale-out: library on %s %s after CLUSTER MEET returned (%s after the node started); reconciler interval %s",
			joined.Addr, time.Since(met).Round(time.Millisecond), time.Since(began).Round(time.Millisecond), interval)
		// The node had no slots for at least one interval before the first migration.
		time.Sleep(interval)
		before := load.snapshot()
		moveBegan := time.Now()
		if err := cl.MoveSlots(t.Context(), cl.Primaries[0], joined, 0, 999); err != nil {
			t.Fatal(err)
		}
		after := load.snapshot()
		t.Logf("FIGURE scale-out: 1,000 slots moved in %s; decisions meanwhile %d, by the fallback %d (%d because a node had no library; the others timed out on a loaded machine)",
			time.Since(moveBegan).Round(time.Millisecond), after.decisions-before.decisions, after.fallbacks-before.fallbacks, after.notLoaded-before.notLoaded)
		if after.decisions == before.decisions {
			t.Error("no decision ran during the migration")
		}
		if n := after.notLoaded - before.notLoaded; n != 0 {
			t.Errorf("%d decisions went to the fallback during the migration because a node had no library, want 0", n)
		}
		if lines := load.logs.with("event", "library_missing"); len(lines) > 0 {
			t.Errorf("a client logged a missing library: %v", lines)
		}
		if n, err := joined.Slots(t.Context()); err != nil || n != 1000 {
			t.Errorf("%s owns %d slots, %v; want 1000", joined.Addr, n, err)
		}
	})

	t.Run("lock held", func(t *testing.T) {
		vk := cl.Client(t, false)
		if err := retry(func() error {
			return vk.Do(t.Context(), vk.B().Set().Key(deployer.LockKey).Value("a deploy|x").Px(time.Minute).Build()).Error()
		}); err != nil {
			t.Fatal(err)
		}
		n := cl.MeetPrimary(top)
		prepareNode(t, n, "+function|load")
		// Three passes with the lock held: the node is not loaded.
		time.Sleep(3 * interval)
		if got := code(t, n); got != "" {
			t.Errorf("%s was loaded while a deploy held the lock", n.Addr)
		}
		if rec.loads("locked") == 0 {
			t.Error("no load counted as waiting for the lock")
		}
		if err := retry(func() error { return vk.Do(t.Context(), vk.B().Del().Key(deployer.LockKey).Build()).Error() }); err != nil {
			t.Fatal(err)
		}
		waitCode(t, n, pinned.Code)
	})

	t.Run("ACL refuses FUNCTION LOAD", func(t *testing.T) {
		// A reconciler of its own, passing every 100ms, so that a tight loop would show.
		fast := startReconciler(t, cl.Primaries[0], pinned, 100*time.Millisecond)
		n := cl.MeetPrimary(top)
		prepareNode(t, n, "-function|load")
		time.Sleep(3 * time.Second)
		failed := fast.logs.with("msg", "library load failed")
		// Backing off from 100ms to a 1s maximum: 0.1, 0.2, 0.4, 0.8, 1, 1... at most 7 in
		// 3s, against 30 every pass.
		if len(failed) == 0 || len(failed) > 8 {
			t.Errorf("%d failed loads logged in 3s, want 1 to 8 (backed off): %v", len(failed), failed)
		}
		if len(failed) > 0 && !slices.ContainsFunc(failed, func(l map[string]string) bool {
			return l["node"] == n.Addr && strings.Contains(l["err"], "NOPERM")
		}) {
			t.Errorf("the failed loads do not name %s and NOPERM: %v", n.Addr, failed)
		}
		if fast.loads("failed") == 0 {
			t.Error("no failed load counted")
		}
		if got := code(t, n); got != "" {
			t.Fatalf("%s was loaded by a user that may not", n.Addr)
		}
		prepareNode(t, n, "+function|load")
		waitCode(t, n, pinned.Code)
		fast.stop(t)
	})

	rec.stop(t)
	t.Run("replacement", func(t *testing.T) {
		victim := cl.Primaries[1]
		fresh := cl.ReplacePrimary(top, victim)
		prepareNode(t, fresh, "+function|load")
		// Until a reconciler runs, the client decides those keys by its fallback and says so.
		waitLogged(t, load.logs, "event", "library_missing", fresh.Addr)
		before := load.snapshot()
		began := time.Now()
		healed := startReconciler(t, cl.Primaries[0], pinned, interval)
		waitCode(t, fresh, pinned.Code)
		t.Logf("FIGURE replacement: library on %s %s after the reconciler started (interval %s)", fresh.Addr, time.Since(began).Round(time.Millisecond), interval)
		time.Sleep(200 * time.Millisecond) // the clients' calls in flight
		mid := load.snapshot()
		time.Sleep(interval)
		after := load.snapshot()
		t.Logf("FIGURE replacement: fallback decisions for a missing library %d until healed, %d in the interval after", mid.notLoaded-before.notLoaded, after.notLoaded-mid.notLoaded)
		if n := after.notLoaded - mid.notLoaded; n != 0 {
			t.Errorf("%d decisions went to the fallback for a missing library after it was loaded", n)
		}
		healed.stop(t)
	})

	t.Run("never a downgrade", func(t *testing.T) {
		var current []*harness.Server
		for _, p := range cl.Primaries {
			if p.Running() && code(t, p) == pinned.Code {
				current = append(current, p)
			}
		}
		old := startReconciler(t, cl.Primaries[0], v100, interval)
		time.Sleep(2 * interval)
		old.stop(t)
		for _, p := range current {
			if got := code(t, p); got != pinned.Code {
				t.Errorf("%s runs %s after a reconciler pinned to 1.0.0", p.Addr, label(got))
			}
		}
		if held := old.logs.with("msg", "node left as it is"); !slices.ContainsFunc(held, func(l map[string]string) bool { return strings.Contains(l["why"], "would downgrade") }) {
			t.Errorf("the held primaries are not logged: %v", held)
		}
	})

	load.stop(t)
	// Every key keeps its state: the server's count is the admissions it made, for the keys
	// that moved with MIGRATE and those that did not. The replaced shard's keys died with
	// it (the harness gave the second primary the second third of the slots).
	checkState(t, load, principals, func(slot int) bool { return 16384/3 <= slot && slot < 2*16384/3 })
}

// prepareNode sets a node as the tests need: cluster-require-full-coverage no, and the
// reconciler's ACL user with ReconcileACLRules and fn ("+function|load" or
// "-function|load").
func prepareNode(t *testing.T, s *harness.Server, fn string) {
	t.Helper()
	vk := s.Client(t)
	rules := append([]string{"reset", "on", ">s3cret"}, deployer.ReconcileACLRules...)
	rules = append(rules, fn)
	for _, cmd := range []valkey.Completed{
		vk.B().ConfigSet().ParameterValue().ParameterValue("cluster-require-full-coverage", "no").Build(),
		vk.B().AclSetuser().Username("reconciler").Rule(rules...).Build(),
	} {
		if err := vk.Do(t.Context(), cmd).Error(); err != nil {
			t.Fatalf("%s: %v", s.Addr, err)
		}
	}
}

// reconciler is one running in the test, as the ACL user.
type reconciler struct {
	cancel context.CancelFunc
	done   chan error
	logs   *records
	reader *sdkmetric.ManualReader
}

func startReconciler(t *testing.T, seed *harness.Server, pinned versions.Release, every time.Duration) *reconciler {
	t.Helper()
	opt, err := options("redis://reconciler:s3cret@" + seed.Addr)
	if err != nil {
		t.Fatal(err)
	}
	r := &reconciler{done: make(chan error, 1), logs: &records{}, reader: sdkmetric.NewManualReader()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	rec, err := deployer.NewReconciler(t.Context(), opt, deployer.ReconcileOptions{
		Release: pinned, Set: releases, Interval: every, MaxBackoff: 10 * every,
		Logger: slog.New(r.logs), MeterProvider: mp,
	})
	if err != nil {
		t.Fatalf("NewReconciler: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- rec.Run(ctx); rec.Close() }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop ends the reconciler as SIGTERM does (its context), and checks that Run returns nil.
func (r *reconciler) stop(t *testing.T) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("the reconciler did not stop")
	}
}

// loads is the reconciler's rlfn.reconcile.loads counter for outcome.
func (r *reconciler) loads(outcome string) int64 {
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		return -1
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "rlfn.reconcile.loads" {
				for _, dp := range sum.DataPoints {
					if v, ok := dp.Attributes.Value("outcome"); ok && v.AsString() == outcome {
						n += dp.Value
					}
				}
			}
		}
	}
	return n
}

// records is a slog.Handler that keeps every line, its attributes as text.
type records struct {
	mu    sync.Mutex
	lines []map[string]string
	attrs []slog.Attr
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	line := map[string]string{"msg": r.Message, "level": r.Level.String()}
	for _, a := range h.attrs {
		line[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { line[a.Key] = a.Value.String(); return true })
	h.mu.Lock()
	h.lines = append(h.lines, line)
	h.mu.Unlock()
	return nil
}
func (h *records) WithAttrs(as []slog.Attr) slog.Handler {
	return &recordsWith{h, as}
}
func (h *records) WithGroup(string) slog.Handler { return h }

// recordsWith adds attributes to the lines it hands to its records.
type recordsWith struct {
	*records
	as []slog.Attr
}

func (h *recordsWith) Handle(ctx context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(h.as...)
	return h.records.Handle(ctx, r)
}

// with returns the lines whose key is value.
func (h *records) with(key, value string) []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]string
	for _, l := range h.lines {
		if l[key] == value {
			out = append(out, l)
		}
	}
	return out
}

// waitLogged waits up to 30s for a line whose key is value and whose node is node.
func waitLogged(t *testing.T, h *records, key, value, node string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if slices.ContainsFunc(h.with(key, value), func(l map[string]string) bool { return l["node"] == node }) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no %s=%s line naming %s", key, value, node)
}

// principalsBySlot returns one principal per hash slot: principals[slot] lands on slot.
func principalsBySlot() []string {
	out := make([]string, 16384)
	left := len(out)
	for i := 0; left > 0; i++ {
		p := "u" + strconv.Itoa(i)
		if s := crc16(p) % 16384; out[s] == "" {
			out[s] = p
			left--
		}
	}
	return out
}

// crc16 is the cluster's key hash (CRC16-XMODEM).
func crc16(s string) int {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc)
}

// limit is the load's: high enough never to deny, so that each key's server count is its
// admissions; a day's window, so that it does not roll over during the test.
var limit = client.FixedWindow{Limit: 1 << 40, Window: 24 * time.Hour}

// loadGen makes decisions on every principal, round and round, from four workers, counting
// per principal the admissions the server made, and the decisions of the fallback.
type loadGen struct {
	lim       *client.Limiter
	logs      *records
	reader    *sdkmetric.ManualReader
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	decisions atomic.Int64
	fallbacks atomic.Int64
	errs      atomic.Int64
	server    []atomic.Int64 // admissions by the server, by slot
	uncertain []atomic.Int64 // calls by slot a fallback decided or that failed: the server may have counted them (a timeout) or not
}

type loadSnapshot struct{ decisions, fallbacks, notLoaded int64 }

func (l *loadGen) snapshot() loadSnapshot {
	return loadSnapshot{l.decisions.Load(), l.fallbacks.Load(), l.notLoadedErrors()}
}

// notLoadedErrors is the client's rlfn.client.errors counter for error.type not_loaded: the
// calls a node answered without the library, each decided by the fallback.
func (l *loadGen) notLoadedErrors() int64 {
	var rm metricdata.ResourceMetrics
	if err := l.reader.Collect(context.Background(), &rm); err != nil {
		return -1
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "rlfn.client.errors" {
				for _, dp := range sum.DataPoints {
					if v, ok := dp.Attributes.Value("error.type"); ok && v.AsString() == "not_loaded" {
						n += dp.Value
					}
				}
			}
		}
	}
	return n
}

func startLoad(t *testing.T, cl *harness.Cluster, principals []string) *loadGen {
	t.Helper()
	l := &loadGen{logs: &records{}, reader: sdkmetric.NewManualReader(), server: make([]atomic.Int64, len(principals)), uncertain: make([]atomic.Int64, len(principals))}
	lim, err := client.New(cl.Client(t, false), client.Options{Deadline: time.Second, Logger: slog.New(l.logs),
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(l.reader))})
	if err != nil {
		t.Fatal(err)
	}
	l.lim = lim
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	const workers = 4
	for w := range workers {
		l.wg.Go(func() {
			for ctx.Err() == nil {
				for slot := w; slot < len(principals) && ctx.Err() == nil; slot += workers {
					res, err := lim.Allow(ctx, principals[slot], limit)
					switch {
					case err != nil:
						l.errs.Add(1)
						l.uncertain[slot].Add(1)
						continue
					case res.Source == client.FromFallback:
						l.fallbacks.Add(1)
						l.uncertain[slot].Add(1)
					case res.Allowed:
						l.server[slot].Add(1)
					}
					l.decisions.Add(1)
				}
			}
		})
	}
	t.Cleanup(func() { l.stop(t) })
	return l
}

func (l *loadGen) stop(t *testing.T) {
	if l.cancel != nil {
		l.cancel()
		l.cancel = nil
		l.wg.Wait()
		t.Logf("load: %d decisions, %d by the fallback, %d errors", l.decisions.Load(), l.fallbacks.Load(), l.errs.Load())
	}
}

// checkState peeks every principal's limiter: its count on the server must be at least the
// admissions the server made (nothing lost, moved or not) and at most those plus the calls
// whose fate is unknown (a timeout may have been counted), but for the slots left out.
func checkState(t *testing.T, load *loadGen, principals []string, leftOut func(slot int) bool) {
	t.Helper()
	wrong, checked := 0, 0
	for slot, p := range principals {
		if leftOut(slot) {
			continue
		}
		res, err := load.lim.Peek(t.Context(), p, limit)
		if err != nil {
			t.Fatalf("Peek %s: %v", p, err)
		}
		checked++
		used, admitted, unknown := limit.Limit-res.Remaining, load.server[slot].Load(), load.uncertain[slot].Load()
		if used < admitted || used > admitted+unknown {
			if wrong++; wrong <= 5 {
				t.Errorf("slot %d (%s): the server counts %d, want %d admissions (+ up to %d of unknown fate)", slot, p, used, admitted, unknown)
			}
		}
	}
	if wrong > 0 {
		t.Errorf("%d keys of %d lost or gained state", wrong, checked)
	}
	t.Logf("state checked on %d keys", checked)
}

// retry runs do until it succeeds, fails otherwise than CLUSTERDOWN, or 30s have passed: a
// loaded machine's nodes may miss pings and hold the cluster down for a moment.
func retry(do func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := do()
		if err == nil || !strings.HasPrefix(err.Error(), "CLUSTERDOWN") || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
