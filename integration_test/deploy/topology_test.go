package deploy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/internal/harness"
)

// TestTopologyChanges runs on a cluster of its own, which it changes: a primary added
// with no slots is found and loaded (and makes an older plan stale), and a killed primary
// whose replica is promoted leaves a cluster that still serves the library, which
// Discover shows as it now is.
func TestTopologyChanges(t *testing.T) {
	cl := harness.StartCluster(t, 3, 1)
	tg := discover(t, urlOf(cl.Primaries[0]))
	deploy(t, tg, v100, false)
	old := plan(t, tg, v110, false)

	added := cl.AddPrimary(t)
	if _, err := tg.Apply(t.Context(), old, deployer.Options{}); !errors.Is(err, deployer.ErrStalePlan) {
		t.Errorf("a plan made before a primary joined: %v, want ErrStalePlan", err)
	} else {
		t.Logf("stale: %v", err)
	}

	tg = discover(t, urlOf(cl.Primaries[0]))
	topo := tg.Topology()
	i := slices.IndexFunc(topo.Nodes, func(n deployer.Node) bool { return n.Addr == added.Addr })
	if i < 0 || topo.Nodes[i].Role != deployer.RolePrimary || topo.Nodes[i].Slots != 0 {
		t.Fatalf("added primary %s not found as a slotless primary in %+v", added.Addr, topo.Nodes)
	}
	p := plan(t, tg, v100, false)
	for _, s := range p.Steps {
		wantLoad := s.Node.Addr == added.Addr
		if (s.Action == deployer.ActionLoad) != wantLoad || (s.State == deployer.StateAbsent) != wantLoad {
			t.Errorf("%s: %s %s", s.Node.Addr, s.State, s.Action)
		}
	}
	rep, err := tg.Apply(t.Context(), p, deployer.Options{})
	if err != nil {
		t.Fatalf("deploy to the added primary: %v\n%s", err, describe(rep))
	}
	if v, err := rlVersion(t, added); err != nil || v != "1.0.0" {
		t.Errorf("added primary: rl_version %q, %v", v, err)
	}

	// Kill a primary: its replica takes over, with the library it received.
	victim := cl.Primaries[0]
	promoted := cl.ReplicasOf(victim)[0]
	if err := victim.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	for !isPrimary(t, promoted) {
		if time.Since(began) > 30*time.Second {
			t.Fatalf("replica %s not promoted after 30s", promoted.Addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := cl.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s promoted after %s", promoted.Addr, time.Since(began).Round(time.Millisecond))

	tg = discover(t, urlOf(promoted))
	topo = tg.Topology()
	t.Logf("after failover: %+v", topo.Nodes)
	nodes := map[string]deployer.Node{}
	for _, n := range topo.Nodes {
		nodes[n.Addr] = n
	}
	if nodes[promoted.Addr].Role != deployer.RolePrimary || len(topo.Nodes) != 7 {
		t.Errorf("promoted replica is %q among %d nodes, want primary among 7", nodes[promoted.Addr].Role, len(topo.Nodes))
	}
	// The dead primary is still a node the cluster knows of: listed, down, never dropped.
	if n, ok := nodes[victim.Addr]; !ok || !strings.Contains(n.Down, "fail") {
		t.Errorf("dead primary %s: %+v, want it listed as flagged fail", victim.Addr, n)
	}
	installed, err := tg.Inspect(t.Context(), releases)
	if err != nil {
		t.Fatal(err)
	}
	afterFailover := deployer.NewPlan(installed, v100, false)
	for _, s := range afterFailover.Steps {
		want := deployer.StateCurrent
		if s.Node.Addr == victim.Addr {
			want = deployer.StateUnreachable
		}
		if s.State != want {
			t.Errorf("%s: %s after the failover, want %s", s.Node.Addr, s.State, want)
		}
	}

	// Every shard, the promoted one included, serves the limiters.
	lim := harness.NewLimiter(t, cl.Client(t, false), client.Options{Deadline: time.Second, Fallback: client.ReturnError})
	for i := range 64 {
		if _, err := lim.Allow(t.Context(), fmt.Sprint("failover:", i), client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}); err != nil {
			t.Fatalf("Allow after the failover: %v", err)
		}
	}
	if v, err := rlVersion(t, promoted); err != nil || v != "1.0.0" {
		t.Errorf("promoted replica: rl_version %q, %v", v, err)
	}

	// The next deploy is refused while the dead primary is known; forced, it covers the new
	// topology and says the dead primary is NOT deployed.
	installed, err = tg.Inspect(t.Context(), releases)
	if err != nil {
		t.Fatal(err)
	}
	var refused *deployer.RefusedError
	if _, err := tg.Apply(t.Context(), deployer.NewPlan(installed, v110, false), deployer.Options{}); !errors.As(err, &refused) {
		t.Errorf("deploy with a failed primary known: %v, want refused", err)
	}
	rep, err = tg.Apply(t.Context(), deployer.NewPlan(installed, v110, true), deployer.Options{})
	t.Logf("forced deploy after the failover: %v\n%s", err, describe(rep))
	if !errors.Is(err, deployer.ErrNotDeployed) {
		t.Errorf("forced deploy with a failed primary: %v, want ErrNotDeployed", err)
	}
	for _, n := range rep.Nodes {
		want := []deployer.Outcome{deployer.OutcomeLoaded, deployer.OutcomeReplicated}
		if n.Node.Addr == victim.Addr {
			want = []deployer.Outcome{deployer.OutcomeLeftOut}
		}
		if !slices.Contains(want, n.Outcome) {
			t.Errorf("%+v, want %v", n, want)
		}
	}
}

func isPrimary(t *testing.T, s *harness.Server) bool {
	t.Helper()
	return !isReplica(t, s.Client(t))
}
