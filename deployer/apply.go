package deployer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/valkey-io/valkey-go"
)

// Options tune Apply. The zero value is ready to use.
type Options struct {
	Parallelism   int           // primaries loaded at once; default 4
	VerifyTimeout time.Duration // how long every node has to answer the new rl_version; default 10s
	LockLease     time.Duration // the lock's lease, renewed while Apply runs; default 30s
	LockKey       string        // default LockKey
	Owner         string        // names this deploy to one that finds the lock held; default user@host pid N
	// Progress, if set, is told of each phase of each node as it completes. Calls are
	// serialised, so it needs no locking; a slow Progress slows the deploy down.
	Progress func(Event)
}

func (o Options) withDefaults() Options {
	if o.Parallelism <= 0 {
		o.Parallelism = 4
	}
	if o.VerifyTimeout <= 0 {
		o.VerifyTimeout = 10 * time.Second
	}
	if o.LockLease <= 0 {
		o.LockLease = 30 * time.Second
	}
	if o.LockKey == "" {
		o.LockKey = LockKey
	}
	if o.Owner == "" {
		o.Owner = defaultOwner()
	}
	return o
}

// Phases of Event, in the order a deploy goes through them.
const (
	PhaseLock    = "lock"    // the lock was taken (Node: where it lives), or not (Err)
	PhaseInspect = "inspect" // the target was re-read to check the plan is not stale
	PhaseLoad    = "load"    // FUNCTION LOAD REPLACE on a primary
	PhaseVerify  = "verify"  // a node answered the new version (or did not in time)
	PhaseRestore = "restore" // a changed node was put back as it was
	PhaseUnlock  = "unlock"  // the lock was released
	PhaseDone    = "done"    // the deploy is over; Err is Apply's error
)

// Event is one step of a running deploy, for progress display.
type Event struct {
	Node  Node
	Phase string
	Err   error
}

// Outcome is what a deploy did to one node.
type Outcome string

const (
	OutcomeLoaded        Outcome = "loaded"         // a primary now runs the release
	OutcomeUnchanged     Outcome = "unchanged"      // nothing was to be done
	OutcomeReplicated    Outcome = "replicated"     // a replica received the release from its primary
	OutcomeFailed        Outcome = "failed"         // this node's load or verification failed
	OutcomeRestored      Outcome = "restored"       // changed, then put back as it was
	OutcomeRestoreFailed Outcome = "restore-failed" // changed, and could not be put back: look at it
	OutcomeSkipped       Outcome = "skipped"        // not attempted, because the deploy failed first
	// OutcomeLeftOut: the node could not be inspected and the plan was forced, so the
	// deploy did not touch it: it is NOT deployed, whatever it runs (see Report.LeftOut).
	OutcomeLeftOut Outcome = "left-out"
)

// Report is what Apply did, one NodeResult per plan step, same order.
type Report struct {
	To       string
	Nodes    []NodeResult
	Duration time.Duration
	// Warnings are problems that did not fail the deploy, for people: e.g. the lock could
	// not be released (its lease runs out by itself).
	Warnings []string
	// RolledBack: the deploy failed and every node it had changed is back as it was. False
	// when any node could not be put back (see NotRestored), or when nothing failed.
	RolledBack bool
}

// LeftOut returns the nodes a forced deploy left out because they could not be inspected
// (OutcomeLeftOut): they are NOT deployed, and nothing is known of what they run.
func (r Report) LeftOut() []NodeResult { return r.with(OutcomeLeftOut) }

// NotRestored returns the nodes a failed deploy changed and could not put back
// (OutcomeRestoreFailed): look at them.
func (r Report) NotRestored() []NodeResult { return r.with(OutcomeRestoreFailed) }

func (r Report) with(o Outcome) []NodeResult {
	var out []NodeResult
	for _, n := range r.Nodes {
		if n.Outcome == o {
			out = append(out, n)
		}
	}
	return out
}

// NodeResult is what Apply did to one node.
type NodeResult struct {
	Node     Node
	From, To string // From as in Step: a release, "" for absent, FromDrifted
	Outcome  Outcome
	Err      error         // what went wrong on this node, without its address (Node says it)
	Duration time.Duration // from the start of this node's load (or verification) to its outcome
}

// String is one line for the CLI, e.g.
// "127.0.0.1:7001 primary loaded 1.0.0 -> 1.1.0 (14ms)", or after a rollback
// "127.0.0.1:7001 primary restored 1.0.0 (9ms)", or for a node a forced deploy left out
// "127.0.0.1:7002 primary left-out: NOT deployed (could not be inspected)".
func (r NodeResult) String() string {
	from := r.From
	if from == "" {
		from = "absent"
	}
	var b strings.Builder
	if r.Outcome == OutcomeLeftOut {
		// From is empty here: what it runs is unknown, not absent.
		return fmt.Sprintf("%s %s %s: NOT deployed (could not be inspected)", r.Node.Addr, r.Node.Role, r.Outcome)
	}
	fmt.Fprintf(&b, "%s %s %s ", r.Node.Addr, r.Node.Role, r.Outcome)
	switch {
	case r.Outcome == OutcomeUnchanged && r.From == r.To:
		b.WriteString(r.To)
	case r.Outcome == OutcomeRestored:
		b.WriteString(from) // what it runs again
	default:
		b.WriteString(from + " -> " + r.To)
	}
	if r.Duration > 0 {
		fmt.Fprintf(&b, " (%s)", r.Duration.Round(time.Millisecond))
	}
	if r.Err != nil {
		b.WriteString(": " + oneLine(r.Err.Error()))
	}
	return b.String()
}

// run is one Apply in progress.
type run struct {
	t     *Target
	p     Plan
	opts  Options
	began time.Time

	emitMu  sync.Mutex // serialises calls to Progress
	mu      sync.Mutex // guards res, changed and failed
	res     []NodeResult
	changed []bool // primaries this run may have changed (a load that succeeded or whose fate is unknown)
	failed  error  // the first failure
}

func (r *run) emit(e Event) {
	if r.opts.Progress == nil {
		return
	}
	r.emitMu.Lock()
	defer r.emitMu.Unlock()
	r.opts.Progress(e)
}

func (r *run) set(i int, o Outcome, err error, since time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.res[i].Outcome, r.res[i].Err = o, err
	r.res[i].Duration = time.Since(since)
}

func (r *run) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed == nil {
		r.failed = err
	}
}

func (r *run) failure() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *run) report() Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Report{To: r.p.To.Version, Nodes: slices.Clone(r.res), Duration: time.Since(r.began)}
}

// Apply carries out a plan made from this target:
//
//  1. refuse a plan with refused steps (RefusedError) or no nodes (ErrNoNodes); a plan
//     with nothing pending returns at once, every node unchanged; a forced plan's
//     unreachable nodes are OutcomeLeftOut and never touched (see Report.LeftOut);
//  2. take the lock (see the package doc), or return ErrLocked;
//  3. discover and inspect again, and return ErrStalePlan if any node joined, left,
//     changed role or runs other code than the plan saw (nodes a forced plan leaves out
//     are not read again, and may have left);
//  4. FUNCTION LOAD REPLACE the release on every primary with ActionLoad, at most
//     Options.Parallelism at once, starting no new load once one failed;
//  5. verify, within Options.VerifyTimeout, that every node expected to run the release
//     (replicas included) has exactly its code and answers it from FCALL_RO rl_version;
//  6. on any failure (or a cancelled ctx, or a lost lock), restore every primary this run
//     changed to exactly what it had (its old code, or no library), wait for their
//     replicas to follow, and return a *PartialError whose Report says node by node what
//     happened;
//  7. release the lock.
//
// The Report is returned with every error after step 2.
func (t *Target) Apply(ctx context.Context, p Plan, opts Options) (rep Report, err error) {
	r := &run{t: t, p: p, opts: opts.withDefaults(), began: time.Now()}
	r.res = make([]NodeResult, len(p.Steps))
	r.changed = make([]bool, len(p.Steps))
	for i, s := range p.Steps {
		r.res[i] = NodeResult{Node: s.Node, From: s.From, To: p.To.Version, Outcome: OutcomeUnchanged}
		if p.Force && s.State == StateUnknown {
			// Never touched from here on: not loaded, verified, re-read nor dialled.
			r.res[i].Outcome = OutcomeLeftOut
		}
	}
	defer func() {
		if rep.To == "" {
			rep = r.report()
		}
		r.emit(Event{Phase: PhaseDone, Err: err})
	}()
	if len(p.Steps) == 0 {
		return r.report(), ErrNoNodes
	}
	if refused := p.Refused(); len(refused) > 0 {
		return r.report(), &RefusedError{Steps: refused}
	}
	if !p.Pending() {
		return r.report(), nil
	}

	lockClient, lockNode, err := t.lockClient(ctx, p, r.opts.LockKey)
	if err != nil {
		r.emit(Event{Phase: PhaseLock, Err: err})
		return r.report(), err
	}
	dctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	l, err := acquire(ctx, lockClient, r.opts.LockKey, lockNode.Addr, r.opts.Owner, r.opts.LockLease, func() { cancel(ErrLockLost) })
	r.emit(Event{Node: lockNode, Phase: PhaseLock, Err: err})
	if err != nil {
		return r.report(), err
	}
	defer func() {
		uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer ucancel()
		uerr := l.release(uctx)
		r.emit(Event{Node: lockNode, Phase: PhaseUnlock, Err: uerr})
		if uerr == nil {
			return
		}
		// The deploy is done either way and the lease runs out by itself: a warning, not
		// a failed deploy.
		rep.Warnings = append(rep.Warnings, oneLine(uerr.Error()))
		var pe *PartialError
		if errors.As(err, &pe) {
			pe.Report.Warnings = rep.Warnings
		}
	}()

	if err := t.checkStale(dctx, p); err != nil {
		r.emit(Event{Phase: PhaseInspect, Err: err})
		return r.report(), err
	}
	r.emit(Event{Phase: PhaseInspect})

	r.load(dctx)
	if r.failure() == nil {
		r.verify(dctx)
	}
	if err := r.failure(); err != nil {
		if c := context.Cause(dctx); c != nil {
			// The cancellation or lost lock is the cause; a node's failure that is only its
			// consequence is not worth naming.
			if errors.Is(err, c) {
				err = c
			} else {
				err = fmt.Errorf("%w (%w)", c, err)
			}
		}
		r.restore(ctx)
		rep := r.report()
		rep.RolledBack = len(rep.NotRestored()) == 0
		return rep, &PartialError{Report: rep, Err: err}
	}
	return r.report(), nil
}

// lockClient returns the Target's connection to the node that holds the lock key: the
// first primary of a standalone target, or the primary that owns the key's slot in a
// cluster, found in CLUSTER NODES. The lock is a key like any other on that node, so it
// needs no client of its own.
func (t *Target) lockClient(ctx context.Context, p Plan, key string) (valkey.Client, Node, error) {
	var primaries []Node
	for _, s := range p.Steps {
		if s.Node.Role == RolePrimary && s.State != StateUnknown {
			primaries = append(primaries, s.Node)
		}
	}
	if len(primaries) == 0 {
		return nil, Node{}, fmt.Errorf("deployer: lock %s: no reachable primary", key)
	}
	owner := primaries[0]
	c, err := t.conn(owner.Addr)
	if err != nil {
		return nil, Node{}, fmt.Errorf("deployer: lock %s on %s: %w", key, owner.Addr, err)
	}
	if !t.Topology().Cluster {
		return c.c, owner, nil
	}
	text, err := c.clusterNodes(ctx)
	if err != nil {
		return nil, Node{}, fmt.Errorf("deployer: lock %s: %s: %w", key, owner.Addr, err)
	}
	host, _, _ := net.SplitHostPort(owner.Addr)
	addr, ok := slotOwner(text, host, keySlot(key))
	i := slices.IndexFunc(primaries, func(n Node) bool { return n.Addr == addr })
	if !ok || i < 0 {
		return nil, Node{}, fmt.Errorf("deployer: lock %s: no reachable primary serves its slot %d", key, keySlot(key))
	}
	owner = primaries[i]
	if c, err = t.conn(owner.Addr); err != nil {
		return nil, Node{}, fmt.Errorf("deployer: lock %s on %s: %w", key, owner.Addr, err)
	}
	return c.c, owner, nil
}

// checkStale discovers and inspects the target again and compares it with the plan.
func (t *Target) checkStale(ctx context.Context, p Plan) error {
	topo, err := t.discover(ctx)
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.topo = topo
	t.mu.Unlock()
	key := func(n Node) string {
		if n.Role == RoleReplica {
			return n.Addr + " (replica of " + n.Primary + ")"
		}
		return n.Addr + " (" + string(n.Role) + ")"
	}
	planned, now := map[string]bool{}, map[string]bool{}
	for _, s := range p.Steps {
		planned[key(s.Node)] = true
	}
	for _, n := range topo.Nodes {
		now[key(n)] = true
	}
	var diffs []string
	for _, n := range topo.Nodes {
		if k := key(n); !planned[k] {
			diffs = append(diffs, "now "+k)
		}
	}
	for _, s := range p.Steps {
		// A node a forced plan leaves out may well have vanished from the topology (a
		// stopped replica is no longer listed by its primary): it is left out either way.
		if k := key(s.Node); !now[k] && s.State != StateUnknown {
			diffs = append(diffs, "no longer "+k)
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%w: %s", ErrStalePlan, strings.Join(diffs, ", "))
	}
	// Re-read every node but those left out: dialling an unreachable node again would
	// only delay the deploy.
	var steps []Step
	var nodes []Node
	for _, s := range p.Steps {
		if s.State != StateUnknown {
			steps = append(steps, s)
			nodes = append(nodes, s.Node)
		}
	}
	codes := t.readCodes(ctx, nodes)
	for i, s := range steps {
		if codes[i].err != nil {
			return fmt.Errorf("deployer: %s: %w", s.Node.Addr, codes[i].err)
		}
		if codes[i].code != s.FromCode {
			return fmt.Errorf("%w: %s no longer runs the code the plan saw (%s)", ErrStalePlan, s.Node.Addr, s.State)
		}
	}
	return nil
}

// load runs FUNCTION LOAD REPLACE on every primary to load, in plan order, Parallelism
// at once; once one has failed, the ones not yet started are skipped.
func (r *run) load(ctx context.Context) {
	todo := make(chan int)
	var wg sync.WaitGroup
	for range r.opts.Parallelism {
		wg.Go(func() {
			for i := range todo {
				r.loadOne(ctx, i)
			}
		})
	}
	for i, s := range r.p.Steps {
		if s.Node.Role == RolePrimary && s.Action == ActionLoad {
			todo <- i
		}
	}
	close(todo)
	wg.Wait()
	if r.failure() == nil && ctx.Err() != nil {
		r.fail(context.Cause(ctx))
	}
}

func (r *run) loadOne(ctx context.Context, i int) {
	s := r.p.Steps[i]
	if r.failure() != nil || ctx.Err() != nil {
		r.mu.Lock()
		r.res[i].Outcome = OutcomeSkipped
		r.mu.Unlock()
		return
	}
	began := time.Now()
	c, err := r.t.conn(s.Node.Addr)
	if err == nil {
		err = c.load(ctx, r.p.To.Code)
		// A refusal by the server changed nothing; anything else (a timeout, a dropped
		// connection) may have loaded it.
		r.mu.Lock()
		r.changed[i] = err == nil || !refused(err)
		r.mu.Unlock()
	}
	switch {
	case err != nil && ctx.Err() != nil:
		// Cut short by what stops the whole deploy (a cancel, a lost lock): not this
		// node's failure. It may have loaded all the same, and then restore puts it back.
		r.set(i, OutcomeSkipped, nil, began)
		r.fail(context.Cause(ctx))
		err = context.Cause(ctx)
	case err != nil:
		r.set(i, OutcomeFailed, err, began)
		r.fail(&NodeError{Addr: s.Node.Addr, Err: err})
	default:
		r.set(i, OutcomeLoaded, nil, began)
	}
	r.emit(Event{Node: s.Node, Phase: PhaseLoad, Err: err})
}

// verify waits for every node that should now run the release to run it.
func (r *run) verify(ctx context.Context) {
	vctx, cancel := context.WithTimeout(ctx, r.opts.VerifyTimeout)
	defer cancel()
	var wg sync.WaitGroup
	sem := make(chan struct{}, inspectParallelism)
	for i, s := range r.p.Steps {
		if s.State == StateUnknown || (s.Action == ActionNone && s.State != StateCurrent) {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			began := time.Now()
			if s.Action == ActionLoad {
				r.mu.Lock()
				began = began.Add(-r.res[i].Duration) // count from the start of the load
				r.mu.Unlock()
			}
			err := r.await(vctx, s.Node, r.p.To.Code, r.p.To.Version)
			switch {
			case err != nil && ctx.Err() != nil:
				// Stopped by a cancel or a lost lock, not by this node: its outcome stays
				// as it is until restore.
				r.fail(context.Cause(ctx))
				err = context.Cause(ctx)
			case err != nil:
				err = fmt.Errorf("verify: %w", err)
				r.set(i, OutcomeFailed, err, began)
				r.fail(&NodeError{Addr: s.Node.Addr, Err: err})
			default:
				o := OutcomeUnchanged
				switch s.Action {
				case ActionLoad:
					o = OutcomeLoaded
				case ActionReplicate:
					o = OutcomeReplicated
				}
				r.set(i, o, nil, began)
			}
			r.emit(Event{Node: s.Node, Phase: PhaseVerify, Err: err})
		})
	}
	wg.Wait()
}

// await polls a node until it has exactly code ("" = no library) and, if version is set,
// answers it from rl_version.
func (r *run) await(ctx context.Context, n Node, code, version string) error {
	began := time.Now()
	var last error
	for {
		last = r.check(ctx, n, code, version)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			if context.Cause(ctx) == ErrLockLost {
				return ErrLockLost
			}
			return fmt.Errorf("%w after %s", last, time.Since(began).Round(time.Millisecond))
		case <-time.After(10 * time.Millisecond): // replication usually takes under a millisecond
		}
	}
}

func (r *run) check(ctx context.Context, n Node, code, version string) error {
	c, err := r.t.conn(n.Addr)
	if err != nil {
		return err
	}
	got, err := c.libraryCode(ctx)
	switch {
	case err != nil:
		return err
	case got != code && code == "":
		return errors.New("still has a ratelimit library")
	case got != code && got == "":
		return errors.New("has no ratelimit library")
	case got != code:
		return errors.New("has other code")
	case version == "":
		return nil
	}
	v, err := c.version(ctx)
	if err != nil {
		return err
	}
	if v != version {
		return fmt.Errorf("rl_version answers %q, want %q", v, version)
	}
	return nil
}

// restore puts back every primary this run changed, then waits for them and their
// replicas to have the old code. It runs on its own deadline: it must not be cut short by
// the cancellation that may have caused it.
func (r *run) restore(parent context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), r.opts.VerifyTimeout+10*time.Second)
	defer cancel()
	byAddr := map[string]int{}
	for i, s := range r.p.Steps {
		byAddr[s.Node.Addr] = i
	}
	r.mu.Lock()
	changed := slices.Clone(r.changed)
	r.mu.Unlock()

	// Put back the primaries.
	sem := make(chan struct{}, r.opts.Parallelism)
	var wg sync.WaitGroup
	restored := make([]bool, len(r.p.Steps))
	for i, s := range r.p.Steps {
		if !changed[i] {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			began := time.Now()
			c, err := r.t.conn(s.Node.Addr)
			if err == nil {
				if s.FromCode == "" {
					err = c.deleteLibrary(ctx)
				} else {
					err = c.load(ctx, s.FromCode)
				}
			}
			if err == nil {
				err = r.await(ctx, s.Node, s.FromCode, "")
			}
			r.settle(i, err, began)
			restored[i] = err == nil
			r.emit(Event{Node: s.Node, Phase: PhaseRestore, Err: err})
		})
	}
	wg.Wait()

	// Then the replicas that followed them.
	for i, s := range r.p.Steps {
		if s.Node.Role != RoleReplica || s.State == StateUnknown {
			continue
		}
		root, ok := rootPrimary(r.p.Steps, byAddr, i)
		if !ok || !changed[root] {
			if s.Action == ActionReplicate {
				r.mu.Lock()
				if r.res[i].Outcome == OutcomeUnchanged {
					r.res[i].Outcome = OutcomeSkipped
				}
				r.mu.Unlock()
			}
			continue
		}
		wg.Go(func() {
			began := time.Now()
			var err error
			if restored[root] {
				err = r.await(ctx, s.Node, r.p.Steps[root].FromCode, "")
			} else {
				err = fmt.Errorf("its primary %s was not restored", r.p.Steps[root].Node.Addr)
			}
			r.settle(i, err, began)
			r.emit(Event{Node: s.Node, Phase: PhaseRestore, Err: err})
		})
	}
	wg.Wait()
}

// settle records a restore's outcome: a node that failed keeps "failed" (it is the cause)
// when it was put back, and any node that could not be put back is "restore-failed".
func (r *run) settle(i int, err error, began time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := &r.res[i]
	res.Duration += time.Since(began)
	switch {
	case err != nil:
		err = fmt.Errorf("restore: %w", err)
		res.Outcome, res.Err = OutcomeRestoreFailed, errors.Join(res.Err, err)
	case res.Outcome != OutcomeFailed:
		res.Outcome = OutcomeRestored
	}
}
