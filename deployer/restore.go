package deployer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

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
			err := r.putBack(ctx, s)
			r.settle(i, err, began)
			restored[i] = err == nil
			r.emit(Event{Node: s.Node, Phase: PhaseRestore, Err: err})
		})
	}
	wg.Wait()

	// Then the replicas that followed them.
	for i, s := range r.p.Steps {
		if s.Node.Role != RoleReplica || !s.read() {
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
			switch {
			case restored[root]:
				err = r.await(ctx, s.Node, r.p.Steps[root].Code, "")
			case r.promoted(ctx, s.Node):
				// Its primary died during the deploy and it took over, with what it had
				// replicated: a primary now, it is put back as one.
				err = r.putBack(ctx, s)
			default:
				err = fmt.Errorf("its primary %s was not restored", r.p.Steps[root].Node.Addr)
			}
			r.settle(i, err, began)
			r.emit(Event{Node: s.Node, Phase: PhaseRestore, Err: err})
		})
	}
	wg.Wait()
}

// putBack loads what a node ran before the deploy (or deletes the library it did not have),
// and waits until it runs exactly that.
func (r *run) putBack(ctx context.Context, s Step) error {
	c, err := r.t.conn(s.Node.Addr)
	if err != nil {
		return err
	}
	if s.Code == "" {
		err = c.deleteLibrary(ctx)
	} else {
		err = c.load(ctx, s.Code)
	}
	if err != nil {
		return err
	}
	return r.await(ctx, s.Node, s.Code, "")
}

// promoted reports whether a node planned as a replica now says it is a primary (a failover
// during the deploy promoted it). A node that cannot tell is not.
func (r *run) promoted(ctx context.Context, n Node) bool {
	c, err := r.t.conn(n.Addr)
	if err != nil {
		return false
	}
	text, err := c.info(ctx, "replication")
	if err != nil {
		return false
	}
	repl, err := parseReplication(text)
	return err == nil && repl.Role == RolePrimary
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
