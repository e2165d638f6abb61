package deployer

import (
	"context"
	"errors"
	"fmt"
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

// check refuses a negative setting, which would otherwise read as "the default" (zero does):
// a deploy run with settings other than those given is worse than none.
func (o Options) check() error {
	for _, f := range []struct {
		name string
		bad  bool
		v    any
	}{
		{"Parallelism", o.Parallelism < 0, o.Parallelism},
		{"VerifyTimeout", o.VerifyTimeout < 0, o.VerifyTimeout},
		{"LockLease", o.LockLease < 0, o.LockLease},
	} {
		if f.bad {
			return fmt.Errorf("deployer: Options.%s must not be negative, got %v", f.name, f.v)
		}
	}
	return nil
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

// Phase is a step of a deploy an Event reports. Its value is what a progress display shows.
type Phase string

// Phases, in the order a deploy goes through them.
const (
	PhaseLock    Phase = "lock"    // the lock was taken (Node: where it lives), or not (Err)
	PhaseInspect Phase = "inspect" // the target was re-read to check the plan is not stale
	PhaseLoad    Phase = "load"    // FUNCTION LOAD REPLACE on a primary
	PhaseVerify  Phase = "verify"  // a node answered the new version (or did not in time)
	PhaseRestore Phase = "restore" // a changed node was put back as it was
	PhaseUnlock  Phase = "unlock"  // the lock was released
	PhaseDone    Phase = "done"    // the deploy is over; Err is Apply's error
)

// Event is one step of a running deploy, for progress display.
type Event struct {
	Node  Node
	Phase Phase
	Err   error
}

// run is one Apply in progress.
type run struct {
	t     *Target
	p     Plan
	opts  Options
	began time.Time

	checks   chan struct{} // bounds the nodes await checks at once
	emitMu   sync.Mutex    // serialises calls to Progress
	mu       sync.Mutex    // guards res, changed, failed, restored and warnings
	res      []NodeResult
	changed  []bool    // primaries this run may have changed (a load that succeeded or whose fate is unknown)
	failed   error     // the first failure
	restored bool      // the run failed and restore ran
	warnings []Warning // Report.Warnings
	// part: the plan holds some of the target's nodes (a reconcile's one primary and its
	// replicas), so only they are checked for staleness (checkPart), not the whole target.
	part bool
}

// newRun records every node as unchanged, but those a forced plan leaves out: an unreachable
// node, and a replica behind that its unreachable primary keeps from receiving anything.
func newRun(t *Target, p Plan, opts Options) *run {
	r := &run{t: t, p: p, opts: opts.withDefaults(), began: time.Now(), checks: make(chan struct{}, inspectParallelism)}
	r.res = make([]NodeResult, len(p.Steps))
	r.changed = make([]bool, len(p.Steps))
	byAddr := make(map[string]int, len(p.Steps))
	for i, s := range p.Steps {
		byAddr[s.Node.Addr] = i
	}
	for i, s := range p.Steps {
		r.res[i] = NodeResult{Node: s.Node, From: s.From, To: p.To.Version, Outcome: OutcomeUnchanged}
		if !p.Force {
			continue
		}
		if s.State == StateUnreachable {
			// Never touched from here on: not loaded, verified, re-read nor dialled.
			r.res[i].Outcome, r.res[i].Err = OutcomeLeftOut, fmt.Errorf("unreachable: %w", s.Unreachable)
		} else if root, ok := rootPrimary(p.Steps, byAddr, i); ok && s.Node.Role == RoleReplica &&
			s.State != StateCurrent && p.Steps[root].State == StateUnreachable {
			// Its primary is left out, so nothing reaches it: left out as well, not lagging.
			r.res[i].Outcome, r.res[i].Err = OutcomeLeftOut, fmt.Errorf("its primary %s is unreachable", p.Steps[root].Node.Addr)
		}
	}
	return r
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

// report is what the run did so far: Apply makes it once, when the run is over.
func (r *run) report() Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := Report{To: r.p.To.Version, Nodes: slices.Clone(r.res), Duration: time.Since(r.began), Warnings: slices.Clone(r.warnings)}
	rep.RolledBack = r.restored && len(rep.NotRestored()) == 0
	return rep
}

// Apply carries out a plan made from this target:
//
//  1. refuse the plan as Plan.Check does: no nodes (ErrNoNodes), an unsupported node
//     (UnsupportedError, forced or not), refused steps (RefusedError); a forced plan's
//     unreachable nodes are OutcomeLeftOut and never touched (see Report.LeftOut); a plan
//     with nothing pending returns at once, every other node unchanged;
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
// A replica that receives nothing (its primary already runs the release) yet runs other
// code is given Options.VerifyTimeout to catch up (the same window as step 5's, not one
// after it), also when nothing is pending; one that does not is OutcomeLagging. A deploy
// that left nodes out (forced past unreachable nodes, and their replicas) or found a
// lagging replica returns a *PartialError whose cause is ErrNotDeployed, even when nothing
// else failed: Apply returns nil only when every node the plan knows of runs the release at
// the end. The Report is returned with every error, made once the lock is released (its
// Warnings hold a failed release); a *PartialError carries the same Report.
func (t *Target) Apply(ctx context.Context, p Plan, opts Options) (Report, error) {
	if err := opts.check(); err != nil {
		return Report{}, err
	}
	r := newRun(t, p, opts)
	rep, err := r.finish(r.deploy(ctx))
	r.emit(Event{Phase: PhaseDone, Err: err})
	return rep, err
}

// finish makes the report of a run that is over, the lock released, and the error that
// carries the same report: err, the deploy's own, or a node that does not run the release.
func (r *run) finish(err error) (Report, error) {
	rep := r.report()
	switch {
	case r.restored:
		err = &PartialError{Report: rep, Err: err}
	case err == nil && len(rep.NotDeployed()) > 0:
		// It failed nowhere, but a node does not run the release: not a success.
		err = &PartialError{Report: rep, Err: ErrNotDeployed}
	}
	return rep, err
}

// deploy is Apply's steps 1 to 7, each node's outcome recorded in r as it goes. It returns
// what stopped the deploy: a refusal, the lock, a stale plan, or the failure that made it
// restore (r.restored).
func (r *run) deploy(ctx context.Context) error {
	if err := r.p.Check(); err != nil {
		return err
	}
	if !r.p.Pending() {
		r.awaitLagging(ctx)
		return nil
	}

	lockClient, lockNode, err := r.t.lockClient(r.p, r.opts.LockKey)
	if err != nil {
		r.emit(Event{Phase: PhaseLock, Err: err})
		return err
	}
	dctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	l, err := acquire(ctx, lockClient, r.opts.LockKey, lockNode.Addr, r.opts.Owner, r.opts.LockLease, func() { cancel(ErrLockLost) })
	r.emit(Event{Node: lockNode, Phase: PhaseLock, Err: err})
	if err != nil {
		return err
	}
	defer r.unlock(ctx, l, lockNode)

	check := r.t.checkStale
	if r.part {
		check = r.t.checkPart
	}
	if err := check(dctx, r.p); err != nil {
		r.emit(Event{Phase: PhaseInspect, Err: err})
		return err
	}
	r.emit(Event{Phase: PhaseInspect})

	r.load(dctx)
	if r.failure() == nil {
		// One VerifyTimeout for both, as --verify-timeout promises: the replicas that
		// receive nothing have been free to catch up all along.
		var wg sync.WaitGroup
		wg.Go(func() { r.verify(dctx) })
		wg.Go(func() { r.awaitLagging(dctx) })
		wg.Wait()
	}
	err = r.failure()
	if err == nil {
		return nil
	}
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
	return err
}

// unlock releases the lock. The deploy is done either way and the lease runs out by itself,
// so a release that fails is a warning of the report, not a failed deploy. Its text names
// the node.
func (r *run) unlock(ctx context.Context, l *lease, where Node) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := l.release(uctx)
	r.emit(Event{Node: where, Phase: PhaseUnlock, Err: err})
	if err != nil {
		r.mu.Lock()
		r.warnings = append(r.warnings, Warning{ID: WarnLockRelease, Text: causeText(err)})
		r.mu.Unlock()
	}
}

// lockClient returns the Target's connection to the node that holds the lock key: the
// primary of a standalone target, or the primary that owns the key's slot in a cluster, as
// the discovered topology says. The lock is a key like any other on that node, so it needs
// no client of its own.
func (t *Target) lockClient(p Plan, key string) (valkey.Client, Node, error) {
	topo := t.Topology()
	var owner Node
	if topo.Cluster {
		n, ok := topo.owner(keySlot(key))
		if !ok {
			return nil, Node{}, fmt.Errorf("deployer: lock %s: no primary serves its slot %d: is the cluster still being set up? Assign every slot first (CLUSTER ADDSLOTS, or valkey-cli --cluster create)", key, keySlot(key))
		}
		owner = n
	} else {
		i := slices.IndexFunc(p.Steps, func(s Step) bool { return s.Node.Role == RolePrimary })
		if i < 0 {
			return nil, Node{}, fmt.Errorf("deployer: lock %s: no primary", key)
		}
		owner = p.Steps[i].Node
	}
	if i := slices.IndexFunc(p.Steps, func(s Step) bool { return s.Node.Addr == owner.Addr }); i >= 0 && p.Steps[i].State == StateUnreachable {
		return nil, Node{}, fmt.Errorf("deployer: lock %s: %s, which serves its slot, is unreachable (%s)", key, owner.Addr, errText(p.Steps[i].Unreachable))
	}
	c, err := t.conn(owner.Addr)
	if err != nil {
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
		if k := key(s.Node); !now[k] && s.State != StateUnreachable {
			diffs = append(diffs, "no longer "+k)
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%w: %s", ErrStalePlan, strings.Join(diffs, ", "))
	}
	return t.checkCodes(ctx, p)
}

// checkPart is checkStale for a plan of some of the target's nodes: each of them must still
// be there in the role the plan saw (a replica following the same primary) and run the code
// it saw; nodes outside the plan may come and go.
func (t *Target) checkPart(ctx context.Context, p Plan) error {
	topo, err := t.discover(ctx)
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.topo = topo
	t.mu.Unlock()
	for _, s := range p.Steps {
		if !slices.ContainsFunc(topo.Nodes, func(n Node) bool {
			return n.Addr == s.Node.Addr && n.Role == s.Node.Role && n.Primary == s.Node.Primary && n.Down == ""
		}) {
			return fmt.Errorf("%w: %s is no longer a %s as planned", ErrStalePlan, s.Node.Addr, s.Node.Role)
		}
	}
	return t.checkCodes(ctx, p)
}

// checkCodes reads the code of the plan's nodes again and compares it with what the plan saw.
func (t *Target) checkCodes(ctx context.Context, p Plan) error {
	// Re-read every node but those left out: dialling an unreachable node again would
	// only delay the deploy.
	var steps []Step
	var nodes []Node
	for _, s := range p.Steps {
		if s.State != StateUnreachable && s.Node.Down == "" {
			steps = append(steps, s)
			nodes = append(nodes, s.Node)
		}
	}
	codes := t.readCodes(ctx, nodes)
	for i, s := range steps {
		if codes[i].err != nil {
			return fmt.Errorf("deployer: %s: %w", s.Node.Addr, codes[i].err)
		}
		if codes[i].code != s.Code || (s.Code != "" && codes[i].engine != s.Engine) {
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
		if readOnly(err) {
			r.roleAfter(i, RoleReplica) // a failover demoted it since the plan was checked
		}
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
	for i, s := range r.p.Steps {
		if !s.read() || (s.Action == ActionNone && s.State != StateCurrent) {
			continue
		}
		wg.Go(func() {
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

// awaitLagging gives every replica that receives nothing from this deploy yet does not run
// the release (Plan.Lagging, and replicas whose primary is not in the plan) until
// Options.VerifyTimeout to catch up: a replica whose replication is broken would otherwise
// stay on other code while the deploy says done. One that does not is OutcomeLagging; it
// does not fail the deploy, whose loads are sound, and nothing is restored for it.
func (r *run) awaitLagging(ctx context.Context) {
	vctx, cancel := context.WithTimeout(ctx, r.opts.VerifyTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for i, s := range r.p.Steps {
		r.mu.Lock()
		leftOut := r.res[i].Outcome == OutcomeLeftOut
		r.mu.Unlock()
		if !s.read() || s.Action != ActionNone || s.State == StateCurrent || leftOut {
			continue
		}
		wg.Go(func() {
			began := time.Now()
			err := r.await(vctx, s.Node, r.p.To.Code, r.p.To.Version)
			if err == nil {
				r.set(i, OutcomeReplicated, nil, began)
			} else {
				r.set(i, OutcomeLagging, fmt.Errorf("runs %s, not %s, and receives nothing from this deploy, which never loads a replica (is its replication broken?): %w",
					stepRuns(s), r.p.To.Version, err), began)
			}
			r.emit(Event{Node: s.Node, Phase: PhaseVerify, Err: err})
		})
	}
	wg.Wait()
}

// stepRuns says what a node ran when inspected: a release, "drifted code" or "no library".
func stepRuns(s Step) string {
	switch s.State {
	case StateAbsent:
		return "no library"
	case StateDrifted:
		return "drifted code"
	}
	return s.From
}

// await polls a node until it has exactly code ("" = no library) and, if version is set,
// answers it from rl_version.
func (r *run) await(ctx context.Context, n Node, code, version string) error {
	began := time.Now()
	var last error
	for {
		// A slot is held for one check, not for the whole wait: nodes still catching up
		// must not keep the others from being checked until the window has closed (and
		// then be reported failed without ever being read).
		select {
		case r.checks <- struct{}{}:
			last = r.check(ctx, n, code, version)
			<-r.checks
			if last == nil {
				return nil
			}
			if forbidden(last) {
				return last // no wait will change it
			}
		case <-ctx.Done():
			if last == nil {
				last = context.Cause(ctx)
			}
		}
		select {
		case <-ctx.Done():
			if context.Cause(ctx) == ErrLockLost {
				return ErrLockLost
			}
			err := fmt.Errorf("%w after %s", last, time.Since(began).Round(time.Millisecond))
			if n.Role == RoleReplica && errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
				if hint := r.replicationHint(n); hint != "" {
					err = fmt.Errorf("%w (%s)", err, hint)
				}
			}
			return err
		case <-time.After(10 * time.Millisecond): // replication usually takes under a millisecond
		}
	}
}

// forbidden reports whether err is a node's refusal that waiting does not change: the user
// may not run the command (NOPERM), or the node does not have it. A check that only finds
// the code not there yet is waited on.
func forbidden(err error) bool {
	if !refused(err) {
		return false
	}
	var ve *valkey.ValkeyError
	errors.As(err, &ve)
	msg := ve.Error()
	return strings.HasPrefix(msg, "NOPERM") || strings.Contains(strings.ToLower(msg), "unknown command")
}

// replicationHint asks a replica that did not verify in time what its replication is doing,
// so that one still in its full sync (a replica just added to a large shard: healthy, only
// slow) is told from a broken one. "" when it cannot tell. Its own short deadline: the
// verification's has passed.
func (r *run) replicationHint(n Node) string {
	c, err := r.t.conn(n.Addr)
	if err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := c.info(ctx, "replication")
	if err != nil {
		return ""
	}
	return syncHint(info)
}

// syncHint reads INFO replication of a replica for why it may not have received a load yet.
func syncHint(info string) string {
	switch {
	case infoField(info, "master_sync_in_progress") == "1":
		return "it is still in a full sync from its primary: healthy but slow, it needs a longer verify timeout"
	case infoField(info, "master_link_status") == "down" && infoField(info, "master_link_down_since_seconds") == "-1":
		// -1: the link has never been up since the replica started. Valkey 8 reports its first
		// full sync this way, with master_sync_in_progress 0 (dual-channel or not), and so
		// does a replica that never reached its primary: which one, INFO does not tell.
		return "its link to its primary has not been up since it started: its first full sync has not finished (it needs a longer verify timeout), or it cannot reach its primary"
	case infoField(info, "master_link_status") == "down":
		return "its link to its primary is down"
	}
	return ""
}

func (r *run) check(ctx context.Context, n Node, code, version string) error {
	c, err := r.t.conn(n.Addr)
	if err != nil {
		return err
	}
	got, _, err := c.libraryCode(ctx)
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
