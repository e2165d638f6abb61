package deployer

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/valkey-io/valkey-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/rlfn/rlfn/versions"
)

// Decision is what one reconcile pass does, as Decide makes it from what the nodes run.
type Decision struct {
	// Loads are one plan per primary that lacks the release and may be loaded: the primary
	// (ActionLoad) and its replicas (ActionReplicate), for Apply one at a time, so that one
	// node that refuses does not hold the others back (nor restore them).
	Loads []Plan
	// Held are the primaries that lack the release but that a safety check keeps it from:
	// drifted code, a newer release (downgrade) or another major version. Only force loads
	// them.
	Held []Step
	// Unread are the nodes that could not be read (unreachable, unsupported): nothing is
	// known of what they run, and the next pass tries again.
	Unread []Step
	// Current are the primaries that run the release.
	Current int
}

// Decide is a reconcile pass's decision: every primary that does not run pinned is loaded
// unless a safety check refuses it (Held) and force is false; a primary that cannot be read
// is left for the next pass (Unread), never forced. Replicas are never loaded: they follow
// their primary. It is NewPlan's judgement, node by node: a pure function.
func Decide(installed []Installed, pinned versions.Release, force bool) Decision {
	full := NewPlan(installed, pinned, force)
	byAddr := make(map[string]int, len(full.Steps))
	for i, s := range full.Steps {
		byAddr[s.Node.Addr] = i
	}
	var d Decision
	for i, s := range full.Steps {
		switch {
		case !s.read():
			d.Unread = append(d.Unread, s)
			continue
		case s.Node.Role != RolePrimary:
			continue
		case s.State == StateCurrent:
			d.Current++
			continue
		case s.Refusal != "" && !force:
			d.Held = append(d.Held, s)
			continue
		}
		p := Plan{To: pinned, Force: force, Steps: []Step{s}}
		for j, r := range full.Steps {
			if root, ok := rootPrimary(full.Steps, byAddr, j); ok && root == i && r.Action == ActionReplicate {
				p.Steps = append(p.Steps, r)
			}
		}
		d.Loads = append(d.Loads, p)
	}
	return d
}

// backoff spaces the attempts on a node whose load failed: the first retry after one
// interval, then twice as long each time, up to max; a success forgets the node. A server
// that refuses FUNCTION LOAD (its ACL) is then asked once a max, not every interval.
type backoff struct {
	interval, max time.Duration
	fails         map[string]int
	next          map[string]time.Time
}

func newBackoff(interval, max time.Duration) *backoff {
	return &backoff{interval: interval, max: max, fails: map[string]int{}, next: map[string]time.Time{}}
}

// ready reports whether addr may be tried at now.
func (b *backoff) ready(addr string, now time.Time) bool { return !now.Before(b.next[addr]) }

// failed records a failure at now and returns when addr may be tried again.
func (b *backoff) failed(addr string, now time.Time) time.Time {
	b.fails[addr]++
	wait := b.interval
	for range b.fails[addr] - 1 {
		if wait *= 2; wait >= b.max {
			wait = b.max
			break
		}
	}
	b.next[addr] = now.Add(wait)
	return b.next[addr]
}

func (b *backoff) ok(addr string) {
	delete(b.fails, addr)
	delete(b.next, addr)
}

// ReconcileOptions tune a Reconciler. Release is required.
type ReconcileOptions struct {
	Release versions.Release // the release to keep on every primary
	Set     versions.Set     // releases to identify what a node runs; default versions.Embedded()
	// Force loads Release over drifted code, a newer release or another major version, as
	// deploy --force does; without it such a primary is reported (Held) and left alone.
	Force    bool
	Interval time.Duration // between passes; default 1s
	// MaxBackoff bounds the wait before a node whose load failed is tried again; default 1m.
	MaxBackoff time.Duration
	// Apply tunes each load: the lock (LockKey, LockLease), VerifyTimeout, Owner (default
	// "rlfn reconcile" and the process).
	Apply         Options
	Logger        *slog.Logger         // default: discard
	MeterProvider metric.MeterProvider // default: none
}

// Reconciler keeps a release on every primary of a deployment as it changes shape: every
// interval it discovers the topology again (a node joined with CLUSTER MEET, a primary
// replaced, a failover), reads what each node runs, and loads the release onto every
// primary that lacks it, one Apply per primary: the deploy lock (a deploy in progress is
// waited for, never fought), re-reading the node under the lock, verification, and restore
// on failure. It never loads over drifted code, a newer release or another major version
// without Force, and touches no key but the lock's.
type Reconciler struct {
	t     *Target
	opts  ReconcileOptions
	log   *slog.Logger
	bo    *backoff
	m     reconcileMetrics
	said  map[string]string // what was last logged of a node that is held or unread: said once
	tried map[string]string // the last error of a load not attempted, by node: said once
}

type reconcileMetrics struct {
	passes  metric.Int64Counter
	loads   metric.Int64Counter
	missing metric.Int64Gauge
}

// NewReconciler discovers the deployment opt's addresses belong to (any of them may answer)
// and returns a Reconciler for it. Close it when done.
func NewReconciler(ctx context.Context, opt valkey.ClientOption, o ReconcileOptions) (*Reconciler, error) {
	if o.Release.Code == "" {
		return nil, errors.New("deployer: ReconcileOptions.Release is required")
	}
	if o.Interval < 0 || o.MaxBackoff < 0 {
		return nil, errors.New("deployer: ReconcileOptions.Interval and MaxBackoff must not be negative")
	}
	if err := o.Apply.check(); err != nil {
		return nil, err
	}
	if o.Set == nil {
		o.Set = versions.Embedded()
	}
	if o.Interval == 0 {
		o.Interval = time.Second
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = time.Minute
	}
	if o.Apply.Owner == "" {
		o.Apply.Owner = "rlfn reconcile " + defaultOwner()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.MeterProvider == nil {
		o.MeterProvider = noop.NewMeterProvider()
	}
	if len(opt.InitAddress) == 0 {
		return nil, errors.New("deployer: no address to discover from")
	}
	t := &Target{opt: opt, seed: opt.InitAddress[0]}
	if err := t.refresh(ctx); err != nil {
		t.Close()
		return nil, err
	}
	meter := o.MeterProvider.Meter("github.com/rlfn/rlfn/deployer")
	r := &Reconciler{t: t, opts: o, log: o.Logger, bo: newBackoff(o.Interval, o.MaxBackoff), said: map[string]string{}, tried: map[string]string{}}
	var errs [3]error
	r.m.passes, errs[0] = meter.Int64Counter("rlfn.reconcile.passes", metric.WithDescription("reconcile passes, by result: ok, or error (the target could not be discovered or read)"))
	r.m.loads, errs[1] = meter.Int64Counter("rlfn.reconcile.loads", metric.WithDescription("loads of the release onto a primary that lacked it, by outcome: loaded, failed, locked (a deploy held the lock), stale (the node changed under the lock)"))
	r.m.missing, errs[2] = meter.Int64Gauge("rlfn.reconcile.missing", metric.WithDescription("primaries that do not run the release after the last pass, by reason: pending (to load, or backing off), held (a safety check), unread"))
	if err := errors.Join(errs[:]...); err != nil {
		t.Close()
		return nil, err
	}
	return r, nil
}

// Close closes the connections.
func (r *Reconciler) Close() { r.t.Close() }

// Run passes every Interval until ctx is done, then returns nil: a pass that fails is
// logged and the next one tries again. A load in progress when ctx is done is cut short,
// restored and its lock released, as any Apply.
func (r *Reconciler) Run(ctx context.Context) error {
	r.log.Info("reconciling", "release", r.opts.Release.Version, "interval", r.opts.Interval.String(), "force", r.opts.Force)
	tick := time.NewTicker(r.opts.Interval)
	defer tick.Stop()
	for {
		if _, err := r.Pass(ctx); err != nil && ctx.Err() == nil {
			r.log.Error("reconcile pass failed", "err", oneLine(err.Error()))
		}
		select {
		case <-ctx.Done():
			r.log.Info("reconciler stopped")
			return nil
		case <-tick.C:
		}
	}
}

// PassResult is what one pass found and did.
type PassResult struct {
	Decision Decision
	Loaded   []Node // primaries the pass loaded
	Failed   []Node // primaries whose load failed (or that were backing off)
}

// Pass discovers and reads the target, decides, and loads every primary that lacks the
// release and is not backing off. The error is for a target it could not discover or read;
// a load's failure is logged, counted, and backed off from.
func (r *Reconciler) Pass(ctx context.Context) (PassResult, error) {
	var res PassResult
	if err := r.t.refresh(ctx); err != nil {
		r.m.passes.Add(ctx, 1, metric.WithAttributes(attribute.String("result", "error")))
		return res, err
	}
	installed, err := r.t.Inspect(ctx, r.opts.Set)
	if err != nil {
		r.m.passes.Add(ctx, 1, metric.WithAttributes(attribute.String("result", "error")))
		return res, err
	}
	d := Decide(installed, r.opts.Release, r.opts.Force)
	res.Decision = d
	r.sayOnce(d)
	pending := 0
	for _, p := range d.Loads {
		n := p.Steps[0].Node
		now := time.Now()
		if !r.bo.ready(n.Addr, now) {
			pending++
			res.Failed = append(res.Failed, n)
			continue
		}
		rep, err := r.t.applyPart(ctx, p, r.opts.Apply)
		outcome := "loaded"
		switch {
		case err == nil:
			r.bo.ok(n.Addr)
			delete(r.tried, n.Addr)
			res.Loaded = append(res.Loaded, n)
			r.log.Info("library loaded", "node", n.Addr, "slots", n.Slots, "release", r.opts.Release.Version,
				"was", stepRuns(p.Steps[0]), "took", rep.Duration.Round(time.Millisecond).String())
		case errors.Is(err, ErrLocked):
			// A deploy (or another reconciler) holds the lock: it is doing the work, or will
			// say why not. The next pass looks again, without backing off.
			outcome = "locked"
			pending++
			r.log.Info("deploy lock held: waiting", "node", n.Addr, "lock", oneLine(err.Error()))
		case errors.Is(err, ErrStalePlan):
			outcome = "stale"
			pending++
			r.log.Info("node changed under the lock: next pass", "node", n.Addr, "why", oneLine(err.Error()))
		case ctx.Err() != nil:
			return res, ctx.Err()
		case !errors.As(err, new(*PartialError)):
			// Not the node's failure: the lock's node could not be reached (it may be the
			// dead primary being replaced), or the target not read again. The next pass
			// tries again; said once, not every pass.
			outcome = "failed"
			pending++
			res.Failed = append(res.Failed, n)
			if msg := oneLine(err.Error()); r.tried[n.Addr] != msg {
				r.tried[n.Addr] = msg
				r.log.Error("library load not attempted: next pass", "node", n.Addr, "err", msg)
			}
		default:
			outcome = "failed"
			pending++
			res.Failed = append(res.Failed, n)
			next := r.bo.failed(n.Addr, now)
			r.log.Error("library load failed", "node", n.Addr, "slots", n.Slots, "release", r.opts.Release.Version,
				"err", oneLine(err.Error()), "retry_in", next.Sub(now).Round(time.Millisecond).String())
		}
		r.m.loads.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", outcome)))
	}
	for reason, n := range map[string]int{"pending": pending, "held": len(d.Held), "unread": unreadPrimaries(d)} {
		r.m.missing.Record(ctx, int64(n), metric.WithAttributes(attribute.String("reason", reason)))
	}
	r.m.passes.Add(ctx, 1, metric.WithAttributes(attribute.String("result", "ok")))
	return res, nil
}

func unreadPrimaries(d Decision) int {
	n := 0
	for _, s := range d.Unread {
		if s.Node.Role == RolePrimary {
			n++
		}
	}
	return n
}

// sayOnce logs the held and unread nodes when what is said of them changes, not every pass.
func (r *Reconciler) sayOnce(d Decision) {
	now := map[string]string{}
	for _, s := range d.Held {
		now[s.Node.Addr] = "held: " + refusalText(s) + "; it keeps what it runs (force loads " + r.opts.Release.Version + " over it)"
	}
	for _, s := range d.Unread {
		why := s.Unsupported
		if s.State == StateUnreachable {
			why = errText(s.Unreachable)
		}
		now[s.Node.Addr] = string(s.State) + ": " + why
	}
	for _, addr := range slices.Sorted(maps.Keys(now)) {
		if r.said[addr] != now[addr] {
			r.log.Warn("node left as it is", "node", addr, "why", now[addr])
		}
	}
	for addr := range r.said {
		if _, ok := now[addr]; !ok {
			r.log.Info("node no longer left out", "node", addr)
		}
	}
	r.said = now
}

// applyPart is Apply for a plan of some of the target's nodes (a Decision's Loads): only they
// are checked for staleness.
func (t *Target) applyPart(ctx context.Context, p Plan, opts Options) (Report, error) {
	if err := opts.check(); err != nil {
		return Report{}, err
	}
	r := newRun(t, p, opts)
	r.part = true
	return r.finish(r.deploy(ctx))
}

// ReconcileACLRules are the rules of an ACL user that can run a Reconciler and nothing else:
// read the topology (INFO, CLUSTER NODES), read and load the library (FUNCTION LIST, FUNCTION
// LOAD, FCALL_RO to verify), and hold the deploy lock (its key alone). Unlike ACLRules it may
// not FUNCTION DELETE: a reconciler loads a node that has no library and verifies it, and a
// failed verification there is reported, the node keeping the release it was given.
var ReconcileACLRules = slices.DeleteFunc(slices.Clone(ACLRules), func(r string) bool { return r == "+function|delete" })
