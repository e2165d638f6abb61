package deploy

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/versions"
)

// TestFirstDeploy: a cluster with no library gets it on every primary, its replicas
// receive it, and a second deploy has nothing to do.
func TestFirstDeploy(t *testing.T) {
	cl := sharedCluster(t)
	tg := discover(t, urlOf(cl.Primaries[1]))

	topo := tg.Topology()
	if !topo.Cluster || len(topo.Nodes) != 6 {
		t.Fatalf("topology: cluster %v, %d nodes; want a cluster of 6", topo.Cluster, len(topo.Nodes))
	}
	slots := 0
	for i, n := range topo.Nodes {
		if wantPrimary := i < 3; (n.Role == deployer.RolePrimary) != wantPrimary || n.ID == "" {
			t.Errorf("node %d: %+v, want primaries first, each with its ID", i, n)
		}
		slots += n.Slots
	}
	if slots != 16384 {
		t.Errorf("primaries own %d slots, want 16384", slots)
	}
	for _, p := range cl.Primaries {
		for _, r := range cl.ReplicasOf(p) {
			i := slices.IndexFunc(topo.Nodes, func(n deployer.Node) bool { return n.Addr == r.Addr })
			if i < 0 || topo.Nodes[i].Role != deployer.RoleReplica || topo.Nodes[i].Primary != p.Addr {
				t.Errorf("replica %s of %s not found as such in %+v", r.Addr, p.Addr, topo.Nodes)
			}
		}
	}
	// Any node is a seed, a replica included.
	if got := discover(t, urlOf(cl.Replicas[0])).Topology(); !slices.Equal(got.Nodes, topo.Nodes) {
		t.Errorf("from a replica:\n%+v\nfrom a primary:\n%+v", got.Nodes, topo.Nodes)
	}

	p := plan(t, tg, v100, false)
	for _, s := range p.Steps {
		want := deployer.ActionLoad
		if s.Node.Role == deployer.RoleReplica {
			want = deployer.ActionReplicate
		}
		if s.State != deployer.StateAbsent || s.Action != want {
			t.Errorf("%s: %s %s, want absent %s", s.Node.Addr, s.State, s.Action, want)
		}
	}
	began := time.Now()
	rep, err := tg.Apply(t.Context(), p, deployer.Options{})
	took := time.Since(began)
	if err != nil {
		t.Fatalf("Apply: %v\n%s", err, describe(rep))
	}
	t.Logf("first deploy of %s on 3 primaries + 3 replicas: %s\n%s", v100.Version, took.Round(time.Millisecond), describe(rep))
	want := map[string]deployer.Outcome{}
	for _, s := range cl.Primaries {
		want[s.Addr] = deployer.OutcomeLoaded
	}
	for _, s := range cl.Replicas {
		want[s.Addr] = deployer.OutcomeReplicated
	}
	requireOutcomes(t, rep, want)
	for _, s := range cl.Nodes() {
		if got := code(t, s); got != v100.Code {
			t.Errorf("%s runs %s", s.Addr, label(got))
		}
		if v, err := rlVersion(t, s); err != nil || v != v100.Version {
			t.Errorf("%s: rl_version %q, %v", s.Addr, v, err)
		}
	}
	if v := lockValue(t, cl); v != "" {
		t.Errorf("lock not released: %q", v)
	}

	again := plan(t, tg, v100, false)
	if again.Pending() {
		t.Errorf("second plan still pending: %+v", again.Steps)
	}
	rep = deploy(t, tg, v100, false)
	for _, n := range rep.Nodes {
		if n.Outcome != deployer.OutcomeUnchanged {
			t.Errorf("second deploy: %+v", n)
		}
	}
}

// TestUpgradeAndRollback: 1.0.0 -> 1.1.0, then back to 1.0.0, which is a downgrade:
// refused, changing nothing, until forced. A major version change is refused the same way.
func TestUpgradeAndRollback(t *testing.T) {
	cl := sharedCluster(t)
	tg := discover(t, urlOf(cl.Primaries[0]))
	deploy(t, tg, v100, false)

	p := plan(t, tg, v110, false)
	for _, s := range p.Steps {
		if s.State != deployer.StateBehind || s.From != "1.0.0" || len(p.Refused()) != 0 {
			t.Fatalf("upgrade plan: %+v", s)
		}
	}
	rep, err := tg.Apply(t.Context(), p, deployer.Options{})
	if err != nil {
		t.Fatalf("upgrade: %v\n%s", err, describe(rep))
	}
	t.Logf("upgrade %s -> %s: %s", v100.Version, v110.Version, rep.Duration.Round(time.Millisecond))
	for _, s := range cl.Nodes() {
		if v, err := rlVersion(t, s); err != nil || v != "1.1.0" {
			t.Errorf("%s: rl_version %q, %v after the upgrade", s.Addr, v, err)
		}
	}

	for _, to := range []struct {
		release versions.Release
		refusal deployer.Refusal
	}{{v100, deployer.RefusalDowngrade}, {v200, deployer.RefusalMajor}} {
		before := snapshot(t, cl.Nodes())
		p := plan(t, tg, to.release, false)
		_, err := tg.Apply(t.Context(), p, deployer.Options{})
		var refused *deployer.RefusedError
		if !errors.As(err, &refused) || len(refused.Steps) != 6 || refused.Steps[0].Refusal != to.refusal {
			t.Fatalf("deploy %s over 1.1.0: %v, want refused for %s on all 6 nodes", to.release.Version, err, to.refusal)
		}
		// The library names the node and why; how to force is the CLI's to say.
		if strings.Contains(err.Error(), "--force") || !strings.Contains(err.Error(), cl.Primaries[0].Addr) {
			t.Errorf("refusal message: %s", err)
		}
		if after := snapshot(t, cl.Nodes()); !maps.Equal(before, after) {
			t.Errorf("a refused deploy changed nodes:\nbefore %v\nafter  %v", before, after)
		}
	}

	rep = deploy(t, tg, v100, true)
	t.Logf("rollback %s -> %s: %s", v110.Version, v100.Version, rep.Duration.Round(time.Millisecond))
	for _, s := range cl.Nodes() {
		if got := code(t, s); got != v100.Code {
			t.Errorf("%s runs %s after the rollback", s.Addr, label(got))
		}
	}
}

// TestDrift: a primary whose code matches no release blocks the deploy, which changes
// nothing, until forced.
func TestDrift(t *testing.T) {
	cl := sharedCluster(t)
	tg := discover(t, urlOf(cl.Primaries[0]))
	deploy(t, tg, v100, false)

	hotfix := strings.Replace(v100.Code, "local VERSION = '1.0.0'", "local VERSION = '1.0.0'\n-- hotfix made by hand", 1)
	drifted := cl.Primaries[2]
	c := drifted.Client(t)
	if err := c.Do(t.Context(), c.B().FunctionLoad().Replace().FunctionCode(hotfix).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	waitCode(t, cl.ReplicasOf(drifted)[0], hotfix)

	installed, err := tg.Inspect(t.Context(), releases)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range installed {
		isDrifted := in.Node.Addr == drifted.Addr || in.Node.Addr == cl.ReplicasOf(drifted)[0].Addr
		if isDrifted != (in.Version == "" && in.Declared == "1.0.0" && in.Code == hotfix) {
			t.Errorf("%s: version %q declared %q", in.Node.Addr, in.Version, in.Declared)
		}
	}

	before := snapshot(t, cl.Nodes())
	_, err = tg.Apply(t.Context(), deployer.NewPlan(installed, v110, false), deployer.Options{})
	var refused *deployer.RefusedError
	if !errors.As(err, &refused) || len(refused.Steps) != 2 {
		t.Fatalf("deploy over drift: %v, want refused on the drifted primary and its replica", err)
	}
	want := "deployer: refused: " + drifted.Addr + " has drifted code (declares 1.0.0)"
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got  %s\nwant %s...", err, want)
	}
	if after := snapshot(t, cl.Nodes()); !maps.Equal(before, after) {
		t.Errorf("a refused deploy changed nodes")
	}

	rep := deploy(t, tg, v110, true)
	for _, s := range cl.Nodes() {
		if got := code(t, s); got != v110.Code {
			t.Errorf("%s runs %s after the forced deploy", s.Addr, label(got))
		}
	}
	for _, n := range rep.Nodes {
		if n.Node.Addr == drifted.Addr && (n.From != deployer.FromDrifted || n.Outcome != deployer.OutcomeLoaded) {
			t.Errorf("drifted primary: %+v", n)
		}
	}
}

// TestRefusingPrimary: a primary under maxmemory refuses FUNCTION LOAD; the deploy fails
// naming it, and every node is left exactly as it was.
func TestRefusingPrimary(t *testing.T) {
	cl := sharedCluster(t)
	tg := discover(t, urlOf(cl.Primaries[0]))
	deploy(t, tg, v100, false)

	// One load at a time, in topology order, so the outcome is exact: the full primary
	// is the last, so the two before it are loaded then restored every time (restoring
	// more than one primary). The lock lives elsewhere than on it (SET NX is refused
	// under maxmemory too): on a key of this test's choosing whose slot another owns.
	var order []*harness.Server
	for _, n := range tg.Topology().Nodes {
		for _, p := range cl.Primaries {
			if p.Addr == n.Addr {
				order = append(order, p)
			}
		}
	}
	full := order[len(order)-1]
	lockKey := ""
	for i := 0; lockKey == ""; i++ {
		if k := fmt.Sprintf("rlfn:test:lock:%d", i); ownerOf(t, cl, k) != full {
			lockKey = k
		}
	}
	setMaxmemory(t, full, "1")
	t.Cleanup(func() { setMaxmemory(t, full, "0") })

	before := snapshot(t, cl.Nodes())
	var events []string
	rep, err := tg.Apply(t.Context(), plan(t, tg, v110, false), deployer.Options{
		Parallelism: 1,
		LockKey:     lockKey,
		Progress: func(e deployer.Event) {
			if e.Phase == deployer.PhaseRestore || e.Phase == deployer.PhaseLoad {
				events = append(events, string(e.Phase)+" "+e.Node.Addr)
			}
		},
	})
	var partial *deployer.PartialError
	if !errors.As(err, &partial) {
		t.Fatalf("deploy onto a full primary: %v, want a PartialError\n%s", err, describe(rep))
	}
	t.Logf("error: %v\n%s", err, describe(rep))
	if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, full.Addr+" failed: FUNCTION LOAD: OOM") ||
		strings.Count(msg, full.Addr) != 1 {
		t.Errorf("error %q does not name %s and OOM once, on one line", msg, full.Addr)
	}
	for _, n := range rep.Nodes {
		// Node names the node: its error must not name it again.
		if n.Err != nil && strings.Contains(n.Err.Error(), n.Node.Addr) {
			t.Errorf("%s: error %q names its node again", n.Node.Addr, n.Err)
		}
	}
	if !rep.RolledBack || !partial.Report.RolledBack {
		t.Error("report does not say it rolled back")
	}
	want := map[string]deployer.Outcome{}
	for _, p := range order {
		want[p.Addr], want[cl.ReplicasOf(p)[0].Addr] = deployer.OutcomeRestored, deployer.OutcomeRestored
	}
	want[full.Addr], want[cl.ReplicasOf(full)[0].Addr] = deployer.OutcomeFailed, deployer.OutcomeSkipped
	requireOutcomes(t, rep, want)
	restored := 0
	for _, e := range events {
		if strings.HasPrefix(e, string(deployer.PhaseRestore)+" ") {
			restored++
		}
	}
	if restored != 2*(len(order)-1) {
		t.Errorf("%d restore events, want one per other primary and its replica: %q", restored, events)
	}
	if after := snapshot(t, cl.Nodes()); !maps.Equal(before, after) {
		t.Errorf("nodes changed by a failed deploy:\nbefore %v\nafter  %v", before, after)
	}
	for _, s := range cl.Nodes() {
		if v, err := rlVersion(t, s); err != nil || v != "1.0.0" {
			t.Errorf("%s: rl_version %q, %v after the rollback", s.Addr, v, err)
		}
	}
	t.Logf("events: %q", events)
}

// TestStalePlan: a node changed between Plan and Apply makes Apply refuse before any load.
func TestStalePlan(t *testing.T) {
	cl := sharedCluster(t)
	tg := discover(t, urlOf(cl.Primaries[0]))
	p := plan(t, tg, v100, false)
	c := cl.Primaries[1].Client(t)
	if err := c.Do(t.Context(), c.B().FunctionLoad().FunctionCode(v110.Code).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, cl.Nodes())
	_, err := tg.Apply(t.Context(), p, deployer.Options{})
	if !errors.Is(err, deployer.ErrStalePlan) || !strings.Contains(err.Error(), cl.Primaries[1].Addr) {
		t.Fatalf("Apply of a stale plan: %v, want ErrStalePlan naming %s", err, cl.Primaries[1].Addr)
	}
	if after := snapshot(t, cl.Nodes()); !maps.Equal(before, after) {
		t.Error("a stale plan changed nodes")
	}
	if v := lockValue(t, cl); v != "" {
		t.Errorf("lock not released after a stale plan: %q", v)
	}
}

// lockValue reads the deploy lock ("" when free).
func lockValue(t *testing.T, cl *harness.Cluster) string {
	t.Helper()
	c := lockOwner(t, cl).Client(t)
	v, err := c.Do(t.Context(), c.B().Get().Key(deployer.LockKey).Build()).ToString()
	if err != nil {
		return ""
	}
	return v
}

// TestRestoreFails: a primary loaded by the deploy then refuses its restore (maxmemory set
// under it once loaded: FUNCTION LOAD is refused, FUNCTION DELETE would not be), after a
// later primary refused the load. The deploy is not rolled back: the report says so, and
// the error names the nodes NOT restored, the primary and its replica.
func TestRestoreFails(t *testing.T) {
	cl := sharedCluster(t)
	tg := discover(t, urlOf(cl.Primaries[0]))
	deploy(t, tg, v100, false)

	// One load at a time in topology order: broken is loaded first of the two, then full
	// refuses. Neither owns the lock (SET NX is refused under maxmemory too).
	owner := lockOwner(t, cl)
	var order []*harness.Server
	for _, n := range tg.Topology().Nodes {
		for _, p := range cl.Primaries {
			if p.Addr == n.Addr && p != owner {
				order = append(order, p)
			}
		}
	}
	broken, full := order[0], order[1]
	setMaxmemory(t, full, "1")
	t.Cleanup(func() { setMaxmemory(t, full, "0"); setMaxmemory(t, broken, "0") })

	rep, err := tg.Apply(t.Context(), plan(t, tg, v110, false), deployer.Options{
		Parallelism:   1,
		VerifyTimeout: 2 * time.Second,
		Progress: func(e deployer.Event) {
			if e.Phase == deployer.PhaseLoad && e.Node.Addr == broken.Addr && e.Err == nil {
				setMaxmemory(t, broken, "1")
			}
		},
	})
	var partial *deployer.PartialError
	if !errors.As(err, &partial) {
		t.Fatalf("deploy: %v, want a PartialError\n%s", err, describe(rep))
	}
	t.Logf("error: %v\n%s", err, describe(rep))
	if rep.RolledBack || partial.Report.RolledBack {
		t.Error("report says rolled back, but a node was not restored")
	}
	wantNot := []string{broken.Addr, cl.ReplicasOf(broken)[0].Addr}
	var got []string
	for _, n := range rep.NotRestored() {
		got = append(got, n.Node.Addr)
	}
	if !slices.Equal(got, wantNot) {
		t.Errorf("NotRestored: %v, want %v", got, wantNot)
	}
	if msg := err.Error(); !strings.Contains(msg, "NOT restored: "+strings.Join(wantNot, ", ")) || strings.Contains(msg, "rolled back") {
		t.Errorf("error %q does not say the deploy is not rolled back and which nodes are NOT restored", msg)
	}
}
