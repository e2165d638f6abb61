package deploy

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/integration_test/harness"
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
			t.Errorf("primary %s, want failed with the dropped connection's error", n)
		}
		if n.Node.Addr == r.Addr && n.Outcome != deployer.OutcomeRestored {
			t.Errorf("replica %s, want restored", n)
		}
	}
	waitCode(t, p, v100.Code)
	waitCode(t, r, v100.Code)
}
