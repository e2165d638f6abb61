package deploy

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/internal/harness"
)

// TestLoadOutcomeUnknown: a FUNCTION LOAD that was sent and whose connection dropped before
// any reply may or may not have loaded. The deployer counts the node as changed: the deploy
// fails naming it, restore puts the old release back, and the report says it was rolled back.
// The primary is paused for writes once the lock is taken, so the load waits on the server;
// its connection is then killed, and the pause lifted.
func TestLoadOutcomeUnknown(t *testing.T) {
	p := harness.StartValkey(t)
	r := harness.StartValkey(t, "--replicaof", "127.0.0.1", fmt.Sprint(p.Port))
	waitReplicas(t, p, 1)
	tg := discover(t, urlOf(p))
	deploy(t, tg, v100, false)
	v110 := must(releases.Find("1.1.0"))

	ctl := p.Client(t)
	killed := make(chan error, 1)
	kill := func(ctx context.Context) error {
		defer ctl.Do(context.WithoutCancel(ctx), ctl.B().Arbitrary("CLIENT", "UNPAUSE").Build())
		load := regexp.MustCompile(`(?m)^id=(\d+) .*cmd=function\|load`)
		for {
			list, err := ctl.Do(ctx, ctl.B().ClientList().Build()).ToString()
			if err != nil {
				return err
			}
			if m := load.FindStringSubmatch(list); m != nil {
				return ctl.Do(ctx, ctl.B().Arbitrary("CLIENT", "KILL", "ID", m[1]).Build()).Error()
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("no FUNCTION LOAD waiting: %w", ctx.Err())
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	opts := deployer.Options{Progress: func(e deployer.Event) {
		if e.Phase != deployer.PhaseLock || e.Err != nil {
			return
		}
		// The lock is taken (a write): from now on the load is the only write.
		err := ctl.Do(t.Context(), ctl.B().Arbitrary("CLIENT", "PAUSE", "60000", "WRITE").Build()).Error()
		if err != nil {
			killed <- err
			return
		}
		go func() {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			killed <- kill(ctx)
		}()
	}}
	rep, err := tg.Apply(t.Context(), plan(t, tg, v110, false), opts)
	if kerr := <-killed; kerr != nil {
		t.Fatalf("killing the load's connection: %v", kerr)
	}
	var ne *deployer.NodeError
	if !errors.As(err, &ne) || ne.Addr != p.Addr {
		t.Fatalf("Apply = %v, want the failure of %s\n%s", err, p.Addr, describe(rep))
	}
	if !rep.RolledBack || len(rep.NotRestored()) != 0 {
		t.Errorf("report not rolled back:\n%s", describe(rep))
	}
	for _, n := range rep.Nodes {
		if n.Node.Addr == p.Addr && (n.Outcome != deployer.OutcomeFailed || n.Err == nil) {
			t.Errorf("primary %+v, want failed with the dropped connection's error", n)
		}
		if n.Node.Addr == r.Addr && n.Outcome != deployer.OutcomeRestored {
			t.Errorf("replica %+v, want restored", n)
		}
	}
	waitCode(t, p, v100.Code)
	waitCode(t, r, v100.Code)
}

// TestRestoreWaitsForPrimary: a replica whose primary is put back waits until the old release
// reaches it. Of two Valkey replicas, one is held at 1.0.0 (CLIENT PAUSE WRITE holds a Valkey
// replica's replication stream), so the deploy of 1.1.0 fails its verify; the other is held
// once it runs 1.1.0, and still runs it when its primary is restored: its restore waits for
// the pause to be lifted, then finds 1.0.0 replicated.
func TestRestoreWaitsForPrimary(t *testing.T) {
	p := harness.StartValkey(t)
	ahead := harness.StartValkey(t, "--replicaof", "127.0.0.1", fmt.Sprint(p.Port))
	behind := harness.StartValkey(t, "--replicaof", "127.0.0.1", fmt.Sprint(p.Port))
	waitReplicas(t, p, 2)
	tg := discover(t, urlOf(p))
	deploy(t, tg, v100, false)
	v110 := must(releases.Find("1.1.0"))

	pause := func(s *harness.Server) error {
		c := s.Client(t)
		return c.Do(t.Context(), c.B().Arbitrary("CLIENT", "PAUSE", "60000", "WRITE").Build()).Error()
	}
	unpause := func(s *harness.Server) {
		c := s.Client(t)
		_ = c.Do(context.WithoutCancel(t.Context()), c.B().Arbitrary("CLIENT", "UNPAUSE").Build()).Error()
	}
	t.Cleanup(func() { unpause(ahead); unpause(behind) })
	if err := pause(behind); err != nil {
		t.Fatal(err)
	}
	var errs []error
	var atRestore string // what the replica held ahead ran when its primary was restored
	opts := deployer.Options{VerifyTimeout: time.Second, Progress: func(e deployer.Event) {
		switch {
		case e.Phase == deployer.PhaseVerify && e.Node.Addr == ahead.Addr && e.Err == nil:
			errs = append(errs, pause(ahead))
		case e.Phase == deployer.PhaseRestore && e.Node.Addr == p.Addr:
			atRestore = code(t, ahead)
			go func() {
				time.Sleep(200 * time.Millisecond) // the replicas' restore is waiting by then
				unpause(ahead)
				unpause(behind)
			}()
		}
	}}
	rep, err := tg.Apply(t.Context(), plan(t, tg, v110, false), opts)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	var ne *deployer.NodeError
	if !errors.As(err, &ne) || ne.Addr != behind.Addr {
		t.Fatalf("Apply = %v, want the verify of %s failed\n%s", err, behind.Addr, describe(rep))
	}
	if atRestore != v110.Code {
		t.Fatalf("when its primary was restored, %s ran %s, want 1.1.0 (held by its pause)", ahead.Addr, label(atRestore))
	}
	if !rep.RolledBack {
		t.Errorf("report not rolled back:\n%s", describe(rep))
	}
	for _, n := range rep.Nodes {
		if n.Node.Addr == ahead.Addr && (n.Outcome != deployer.OutcomeRestored || n.Err != nil) {
			t.Errorf("replica held ahead: %+v, want restored", n)
		}
	}
	for _, s := range []*harness.Server{p, ahead, behind} {
		waitCode(t, s, v100.Code)
	}
}

// TestLaggingReplicaDoesNotRollBack: on the cluster, one shard already runs 1.1.0 on its
// primary (loaded by hand) while its replica's replication is held (CLIENT PAUSE WRITE) on
// 1.0.0. A deploy of 1.1.0 loads the two other shards and verifies them; the held replica,
// which receives nothing from it, is given VerifyTimeout and then reported lagging: the
// deploy is NOT complete (ErrNotDeployed, naming it), and nothing is rolled back, since
// every load is sound and restoring them would not help the replica.
func TestLaggingReplicaDoesNotRollBack(t *testing.T) {
	cl := sharedCluster(t)
	tg := discover(t, urlOf(cl.Primaries[0]))
	deploy(t, tg, v100, false)
	for _, s := range cl.Nodes() {
		waitCode(t, s, v100.Code)
	}
	shard := cl.Primaries[0]
	held := cl.ReplicasOf(shard)[0]
	hc := held.Client(t)
	if err := hc.Do(t.Context(), hc.B().ClientPause().Timeout(30000).Write().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hc.Do(context.Background(), hc.B().ClientUnpause().Build()) })
	sc := shard.Client(t)
	if err := sc.Do(t.Context(), sc.B().FunctionLoad().Replace().FunctionCode(v110.Code).Build()).Error(); err != nil {
		t.Fatal(err)
	}

	p := plan(t, tg, v110, false)
	if lagging := p.Lagging(); len(lagging) != 1 || lagging[0].Node.Addr != held.Addr || !p.Pending() {
		t.Fatalf("plan: lagging %v, pending %v; want %s lagging and loads pending", lagging, p.Pending(), held.Addr)
	}
	rep, err := tg.Apply(t.Context(), p, deployer.Options{VerifyTimeout: time.Second})
	t.Logf("deploy: %v\n%s", err, describe(rep))
	var partial *deployer.PartialError
	if !errors.As(err, &partial) || !errors.Is(err, deployer.ErrNotDeployed) || rep.RolledBack ||
		!strings.Contains(err.Error(), "NOT deployed: "+held.Addr) {
		t.Fatalf("deploy: %v; want NOT deployed naming %s, not rolled back", err, held.Addr)
	}
	want := map[string]deployer.Outcome{shard.Addr: deployer.OutcomeUnchanged, held.Addr: deployer.OutcomeLagging}
	for _, p := range cl.Primaries[1:] {
		want[p.Addr] = deployer.OutcomeLoaded
		want[cl.ReplicasOf(p)[0].Addr] = deployer.OutcomeReplicated
	}
	requireOutcomes(t, rep, want)
	for _, s := range cl.Nodes() {
		if s != held {
			waitCode(t, s, v110.Code)
		}
	}
	if got := code(t, held); got != v100.Code {
		t.Errorf("%s runs %s while held, want 1.0.0", held.Addr, label(got))
	}
}
