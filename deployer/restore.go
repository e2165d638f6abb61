package deployer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// restore puts back every primary this run changed, then waits for them and their
// replicas to have the old code. It runs on its own deadline: it must not be cut short by
// the cancellation that may have caused it.
func (r *run) restore(parent context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), r.opts.VerifyTimeout+10*time.Second)
	defer cancel()
	r.mu.Lock()
	r.restored = true
	r.mu.Unlock()
	byAddr := map[string]int{}
	for i, s := range r.p.Steps {
		byAddr[s.Node.Addr] = i
	}
	r.mu.Lock()
	changed := slices.Clone(r.changed)
	r.mu.Unlock()

	// Put back the primaries. One a failover demoted during the deploy refuses the load
	// (READONLY): it follows its new primary, which is put back below, and is waited for
	// last.
	sem := make(chan struct{}, r.opts.Parallelism)
	var wg sync.WaitGroup
	restored := make([]bool, len(r.p.Steps))
	demoted := make([]bool, len(r.p.Steps))
	for i, s := range r.p.Steps {
		if !changed[i] {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			began := time.Now()
			err := r.putBack(ctx, s, s.Code)
			if readOnly(err) {
				demoted[i] = true
				r.roleAfter(i, RoleReplica)
				return
			}
			r.settle(i, err, began)
			restored[i] = err == nil
			r.emit(Event{Node: s.Node, Phase: PhaseRestore, Err: err})
		})
	}
	wg.Wait()

	// A replica whose primary was not put back may have been promoted in its place (its
	// primary died or was demoted during the deploy), with what it had replicated: a
	// primary now, it is put back as one, to what its shard ran before the deploy (the
	// primary's code: a replica's own may have lagged, or been none). Its shard is then
	// back, and the shard's other nodes follow it.
	var mu sync.Mutex
	shardBack := slices.Clone(restored) // by root primary: its shard runs its old code again
	type waiter struct{ i, root int }
	var waiters []waiter
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
		if restored[root] {
			mu.Lock() // the goroutines below append too
			waiters = append(waiters, waiter{i, root})
			mu.Unlock()
			continue
		}
		wg.Go(func() {
			began := time.Now()
			if !r.promoted(ctx, s.Node) {
				mu.Lock()
				waiters = append(waiters, waiter{i, root})
				mu.Unlock()
				return
			}
			r.roleAfter(i, RolePrimary)
			err := r.putBack(ctx, s, r.p.Steps[root].Code)
			if err == nil {
				mu.Lock()
				shardBack[root] = true
				mu.Unlock()
			}
			r.settle(i, err, began)
			r.emit(Event{Node: s.Node, Phase: PhaseRestore, Err: err})
		})
	}
	wg.Wait()
	for i, d := range demoted {
		if d {
			waiters = append(waiters, waiter{i, i})
		}
	}

	// Then every other node of a changed shard follows its (possibly new) primary back.
	for _, w := range waiters {
		wg.Go(func() {
			began := time.Now()
			root := r.p.Steps[w.root]
			err := fmt.Errorf("its primary %s was not restored", root.Node.Addr)
			if w.i == w.root {
				err = fmt.Errorf("refused the restore (a failover made it a replica), and no primary of its shard was restored")
			}
			if shardBack[w.root] {
				err = r.await(ctx, r.p.Steps[w.i].Node, root.Code, "")
			}
			r.settle(w.i, err, began)
			r.emit(Event{Node: r.p.Steps[w.i].Node, Phase: PhaseRestore, Err: err})
		})
	}
	wg.Wait()
}

// readOnly reports whether err is a node's refusal to write because it is a replica.
func readOnly(err error) bool {
	return err != nil && refused(err) && strings.Contains(err.Error(), "READONLY")
}

// putBack loads code on a node ("": deletes the library), and waits until it runs exactly
// that.
func (r *run) putBack(ctx context.Context, s Step, code string) error {
	c, err := r.t.conn(s.Node.Addr)
	if err != nil {
		return err
	}
	if code == "" {
		err = c.deleteLibrary(ctx)
	} else {
		err = c.load(ctx, code)
	}
	if err != nil {
		return err
	}
	return r.await(ctx, s.Node, code, "")
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

// roleAfter records that step i's node was found in another role than planned.
func (r *run) roleAfter(i int, role Role) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.res[i].RoleAfter = role
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
