package deploy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/internal/harness"
)

// TestDeployDuringFailover: a deploy of 1.1.0 over 1.0.0 on a 3-primary cluster with one
// replica each, while a shard fails over: either it completes and every live node, the
// promoted replica included, runs 1.1.0 and answers it, or it fails and says so, with every
// live node back on 1.0.0 except the ones its report names NOT restored. Never a success
// with a mix, never a silent half.
//
//   - manual: CLUSTER FAILOVER on a replica once the deploy has checked its plan and before
//     it loads: the primary it planned to load is a replica by then.
//   - killed: a primary stopped right after its load (one load at a time), and its replica
//     promoted by the cluster, while the deploy goes on with the other primaries.
func TestDeployDuringFailover(t *testing.T) {
	for _, tt := range []struct {
		name string
		// at reports whether e is the moment to fail over, and fo does it.
		at func(e deployer.Event, victim *harness.Server) bool
		// fo runs in the deployer's goroutine (Progress): it returns its error.
		fo func(t *testing.T, cl *harness.Cluster, victim, promoted *harness.Server) error
		// wantNotRestored: the nodes the report must name NOT restored.
		wantNotRestored func(cl *harness.Cluster, victim, promoted *harness.Server) []string
		// wantRoles: the nodes the report must show in another role than planned
		// (NodeResult.RoleAfter), and their role then: the others must show none.
		wantRoles func(victim, promoted *harness.Server) map[string]deployer.Role
	}{
		{
			name: "manual",
			at: func(e deployer.Event, _ *harness.Server) bool {
				return e.Phase == deployer.PhaseInspect && e.Err == nil
			},
			fo: func(t *testing.T, _ *harness.Cluster, victim, promoted *harness.Server) error {
				c := promoted.Client(t)
				if err := c.Do(t.Context(), c.B().ClusterFailover().Build()).Error(); err != nil {
					return fmt.Errorf("CLUSTER FAILOVER on %s: %w", promoted.Addr, err)
				}
				if err := waitRole(t, promoted, "master"); err != nil {
					return err
				}
				return waitRole(t, victim, "slave")
			},
			// The load on the demoted primary is refused (READONLY): every node is restored.
			wantNotRestored: func(_ *harness.Cluster, _, _ *harness.Server) []string { return nil },
			// Its refusal says it is a replica now. The promoted replica's shard was not
			// changed: nothing asks it what it is.
			wantRoles: func(victim, _ *harness.Server) map[string]deployer.Role {
				return map[string]deployer.Role{victim.Addr: deployer.RoleReplica}
			},
		},
		{
			name: "killed",
			at: func(e deployer.Event, victim *harness.Server) bool {
				return e.Phase == deployer.PhaseLoad && e.Node.Addr == victim.Addr && e.Err == nil
			},
			fo: func(t *testing.T, _ *harness.Cluster, victim, promoted *harness.Server) error {
				if err := victim.Stop(context.Background()); err != nil {
					return err
				}
				return waitRole(t, promoted, "master")
			},
			// The dead primary cannot be put back, but the replica promoted in its place,
			// which had replicated 1.1.0, is: a primary now, it is restored as one.
			wantNotRestored: func(_ *harness.Cluster, victim, _ *harness.Server) []string { return []string{victim.Addr} },
			wantRoles: func(_, promoted *harness.Server) map[string]deployer.Role {
				return map[string]deployer.Role{promoted.Addr: deployer.RolePrimary}
			},
		},
		{
			// CLUSTER FAILOVER right after the victim's load, which its replica had
			// replicated, and a replica of another shard killed so that the deploy fails:
			// the demoted victim refuses its restore (READONLY), the replica promoted in its
			// place is put back, and the victim follows it back to 1.0.0: restored, not
			// named NOT restored. Only the dead replica is.
			name: "demoted after its load",
			at: func(e deployer.Event, victim *harness.Server) bool {
				return e.Phase == deployer.PhaseLoad && e.Node.Addr == victim.Addr && e.Err == nil
			},
			fo: func(t *testing.T, cl *harness.Cluster, victim, promoted *harness.Server) error {
				// Replicated first, so that the failover loses nothing: the victim's
				// load is in the promoted replica.
				if err := waitFor(t, promoted, v110.Code); err != nil {
					return err
				}
				c := promoted.Client(t)
				if err := c.Do(t.Context(), c.B().ClusterFailover().Build()).Error(); err != nil {
					return fmt.Errorf("CLUSTER FAILOVER on %s: %w", promoted.Addr, err)
				}
				if err := waitRole(t, promoted, "master"); err != nil {
					return err
				}
				if err := waitRole(t, victim, "slave"); err != nil {
					return err
				}
				return otherReplica(cl, victim).Stop(context.Background())
			},
			wantNotRestored: func(cl *harness.Cluster, victim, _ *harness.Server) []string {
				return []string{otherReplica(cl, victim).Addr}
			},
			wantRoles: func(victim, promoted *harness.Server) map[string]deployer.Role {
				return map[string]deployer.Role{victim.Addr: deployer.RoleReplica, promoted.Addr: deployer.RolePrimary}
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cl := harness.StartCluster(t, 3, 1)
			for _, s := range cl.Nodes() {
				// The other shards serve while one has no primary, as production often has it.
				c := s.Client(t)
				if err := c.Do(t.Context(), c.B().ConfigSet().ParameterValue().ParameterValue("cluster-require-full-coverage", "no").Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			tg := discover(t, urlOf(cl.Primaries[0]))
			deploy(t, tg, v100, false)
			for _, s := range cl.Nodes() {
				waitCode(t, s, v100.Code)
			}

			// The victim: a primary not holding the lock (losing the lock is another test's
			// story), loaded last of the three.
			owner := lockOwner(t, cl)
			var order []*harness.Server
			for _, n := range tg.Topology().Nodes {
				for _, p := range cl.Primaries {
					if p.Addr == n.Addr && p != owner {
						order = append(order, p)
					}
				}
			}
			victim := order[len(order)-1]
			promoted := cl.ReplicasOf(victim)[0]

			tg = discover(t, urlOf(owner))
			p := plan(t, tg, v110, false)
			done := false
			var foErr error
			rep, err := tg.Apply(t.Context(), p, deployer.Options{
				Parallelism:   1,
				VerifyTimeout: 5 * time.Second,
				Progress: func(e deployer.Event) {
					if !done && tt.at(e, victim) {
						done = true
						foErr = tt.fo(t, cl, victim, promoted)
					}
				},
			})
			if !done || foErr != nil {
				t.Fatalf("the failover did not run (%v): deploy %v\n%s", foErr, err, describe(rep))
			}
			t.Logf("deploy: %v\n%s", err, describe(rep))
			neverHalf(t, cl, rep, err)
			var got []string
			for _, n := range rep.NotRestored() {
				got = append(got, n.Node.Addr)
			}
			if want := tt.wantNotRestored(cl, victim, promoted); !slices.Equal(got, want) {
				t.Errorf("NOT restored: %v, want %v", got, want)
			}
			roles := tt.wantRoles(victim, promoted)
			for _, n := range rep.Nodes {
				if n.RoleAfter != roles[n.Node.Addr] {
					t.Errorf("%s: role after %q, want %q", n.Node.Addr, n.RoleAfter, roles[n.Node.Addr])
				}
			}
		})
	}
}

// neverHalf checks what a deploy of v110 over v100 left: complete (every live node runs and
// answers 1.1.0), or failed saying so, every live node on 1.0.0 but the ones it names NOT
// restored.
func neverHalf(t *testing.T, cl *harness.Cluster, rep deployer.Report, err error) {
	t.Helper()
	var live []*harness.Server
	for _, s := range cl.Nodes() {
		if s.Running() {
			live = append(live, s)
		}
	}
	if err == nil {
		for _, s := range live {
			waitCode(t, s, v110.Code)
			if v, err := rlVersion(t, s); err != nil || v != v110.Version {
				t.Errorf("%s answers rl_version %q, %v after a deploy that succeeded", s.Addr, v, err)
			}
		}
		for _, n := range rep.Nodes {
			if n.Outcome != deployer.OutcomeLoaded && n.Outcome != deployer.OutcomeReplicated && n.Outcome != deployer.OutcomeUnchanged {
				t.Errorf("a deploy that succeeded reports %+v", n)
			}
		}
		return
	}
	var partial *deployer.PartialError
	switch {
	case errors.Is(err, deployer.ErrStalePlan):
		// Refused before any load: nothing changed.
	case errors.As(err, &partial):
		if partial.Report.RolledBack != (len(rep.NotRestored()) == 0) {
			t.Errorf("RolledBack %v with NOT restored %v", partial.Report.RolledBack, rep.NotRestored())
		}
	default:
		t.Fatalf("deploy failed with %v (%T): want it refused as stale or a PartialError that says what it did", err, err)
	}
	notRestored := map[string]bool{}
	for _, n := range rep.NotRestored() {
		notRestored[n.Node.Addr] = true
		if !strings.Contains(err.Error(), n.Node.Addr) {
			t.Errorf("error %q does not name %s, NOT restored", err, n.Node.Addr)
		}
	}
	for _, s := range live {
		if notRestored[s.Addr] {
			t.Logf("%s NOT restored (named): runs %s", s.Addr, label(code(t, s)))
			continue
		}
		waitCode(t, s, v100.Code)
	}
	// The report accounts for every node the plan had.
	var addrs []string
	for _, n := range rep.Nodes {
		addrs = append(addrs, n.Node.Addr)
	}
	for _, s := range cl.Nodes() {
		if !slices.Contains(addrs, s.Addr) {
			t.Errorf("%s is not in the report", s.Addr)
		}
	}
}

// waitRole waits up to 30s for a node's ROLE to be role ("master" or "slave").
func waitRole(t *testing.T, s *harness.Server, role string) error {
	c := s.Client(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := c.Do(t.Context(), c.B().Role().Build()).ToArray()
		if err == nil && len(r) > 0 {
			if got, _ := r[0].ToString(); got == role {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is not %s after 30s (%v)", s.Addr, role, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// otherReplica is the replica of the first primary that is not victim.
func otherReplica(cl *harness.Cluster, victim *harness.Server) *harness.Server {
	for _, p := range cl.Primaries {
		if p != victim {
			return cl.ReplicasOf(p)[0]
		}
	}
	panic("no other primary")
}

// waitFor waits up to 10s for a node to run code; unlike waitCode it returns its failure,
// for a Progress callback, which runs outside the test's goroutine.
func waitFor(t *testing.T, s *harness.Server, code string) error {
	c := s.Client(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := harness.LibraryCode(t.Context(), c, "ratelimit")
		if err == nil && got == code {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s runs %s after 10s (%v), want %s", s.Addr, label(got), err, label(code))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
