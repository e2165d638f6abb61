package deploy

import (
	"context"
	"errors"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/versions"
)

// TestLockExcludes: while one deploy runs (held inside its first load, for longer than
// its lease, so the lease must be renewed), a second one gets ErrLocked naming the first,
// and the first completes and releases the lock.
func TestLockExcludes(t *testing.T) {
	cl := sharedCluster(t)
	a, b := discover(t, urlOf(cl.Primaries[0])), discover(t, urlOf(cl.Primaries[1]))
	pa, pb := plan(t, a, v100, false), plan(t, b, v100, false)

	held, resume, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once sync.Once
	var errA error
	go func() {
		defer close(done)
		_, errA = a.Apply(t.Context(), pa, deployer.Options{
			Owner:     "deployer A",
			LockLease: 600 * time.Millisecond,
			Progress: func(e deployer.Event) {
				if e.Phase == deployer.PhaseLoad {
					once.Do(func() { close(held); <-resume })
				}
			},
		})
	}()
	select {
	case <-held:
	case <-done:
		t.Fatalf("first deploy ended early: %v", errA)
	}
	time.Sleep(1500 * time.Millisecond) // 2.5 leases: only renewal keeps the lock
	before := snapshot(t, cl.Nodes())
	_, err := b.Apply(t.Context(), pb, deployer.Options{Owner: "deployer B"})
	close(resume)
	<-done
	if !errors.Is(err, deployer.ErrLocked) || !strings.Contains(err.Error(), "held by deployer A") ||
		!strings.Contains(err.Error(), "lease expires in") {
		t.Errorf("second deploy: %v, want ErrLocked naming deployer A and its lease", err)
	}
	if after := snapshot(t, cl.Nodes()); !maps.Equal(before, after) {
		t.Error("the locked-out deploy changed nodes")
	}
	if errA != nil {
		t.Errorf("first deploy: %v", errA)
	}
	if v := lockValue(t, cl); v != "" {
		t.Errorf("lock not released: %q", v)
	}
}

// TestLockExpires: the lock of a deployer that died blocks deploys until its lease runs
// out, then the next deploy proceeds.
func TestLockExpires(t *testing.T) {
	cl := sharedCluster(t)
	tg := discover(t, urlOf(cl.Primaries[0]))
	owner := lockOwner(t, cl)
	c := owner.Client(t)
	if err := c.Do(t.Context(), c.B().Set().Key(deployer.LockKey).Value("ghost@gone pid 1|0123456789abcdef").
		Px(1500*time.Millisecond).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	_, err := tg.Apply(t.Context(), plan(t, tg, v100, false), deployer.Options{})
	if !errors.Is(err, deployer.ErrLocked) || !strings.Contains(err.Error(), "held by ghost@gone pid 1") ||
		!strings.Contains(err.Error(), deployer.LockKey+" on "+owner.Addr) {
		t.Fatalf("deploy under a dead deployer's lock: %v, want ErrLocked naming it and the node holding the key", err)
	}
	t.Logf("locked out: %v", err)
	for lockValue(t, cl) != "" {
		time.Sleep(50 * time.Millisecond)
	}
	deploy(t, tg, v100, false)
}

// TestLockLost: a deploy whose lock was taken over while it ran (it was stalled past its
// lease) stops, restores what it changed, and leaves the new holder's lock alone.
func TestLockLost(t *testing.T) {
	cl := sharedCluster(t)
	tg := discover(t, urlOf(cl.Primaries[0]))
	before := snapshot(t, cl.Nodes())
	owner := lockOwner(t, cl).Client(t)
	const other = "deployer B|fedcba9876543210"
	var once sync.Once
	rep, err := tg.Apply(t.Context(), plan(t, tg, v100, false), deployer.Options{
		Parallelism: 1,
		LockLease:   300 * time.Millisecond,
		Progress: func(e deployer.Event) {
			if e.Phase != deployer.PhaseLoad {
				return
			}
			once.Do(func() {
				// Another deploy takes the lock, as if ours had expired.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := owner.Do(ctx, owner.B().Set().Key(deployer.LockKey).Value(other).Px(time.Minute).Build()).Error(); err != nil {
					t.Error(err)
				}
				time.Sleep(500 * time.Millisecond) // more than a renewal period
			})
		},
	})
	if !errors.Is(err, deployer.ErrLockLost) {
		t.Fatalf("deploy that lost its lock: %v, want ErrLockLost\n%s", err, describe(rep))
	}
	t.Logf("%v\n%s", err, describe(rep))
	if !rep.RolledBack {
		t.Error("not rolled back")
	}
	if after := snapshot(t, cl.Nodes()); !maps.Equal(before, after) {
		t.Errorf("nodes changed by a deploy that lost its lock:\nbefore %v\nafter  %v", before, after)
	}
	if v := lockValue(t, cl); v != other {
		t.Errorf("lock is %q, want the new holder's %q", v, other)
	}
}

// TestReleaseFails: a deploy that succeeds but cannot release its lock (the user may not
// DEL) returns no error: the lease runs out by itself. The report warns, naming the lock
// and its node, and so does the unlock event.
func TestReleaseFails(t *testing.T) {
	t.Parallel()
	p := harness.StartValkey(t)
	var rules []string
	for _, r := range deployer.ACLRules {
		if r != "+del" {
			rules = append(rules, r)
		}
	}
	addDeployer(t, []*harness.Server{p}, "nodel", "s3cret", rules)
	tg := discover(t, "redis://nodel:s3cret@"+p.Addr)
	var unlock error
	rep, err := tg.Apply(t.Context(), plan(t, tg, v100, false), deployer.Options{
		LockLease: time.Second,
		Progress: func(e deployer.Event) {
			if e.Phase == deployer.PhaseUnlock {
				unlock = e.Err
			}
		},
	})
	if err != nil {
		t.Fatalf("deploy that could not release its lock: %v, want no error", err)
	}
	t.Logf("warnings: %q", rep.Warnings)
	want := "release lock " + deployer.LockKey + " on " + p.Addr
	if len(rep.Warnings) != 1 || rep.Warnings[0].ID != deployer.WarnLockRelease ||
		!strings.Contains(rep.Warnings[0].Text, want) || !strings.Contains(rep.Warnings[0].Text, "'del'") {
		t.Errorf("warnings %q, want one saying %q and why", rep.Warnings, want)
	}
	if unlock == nil {
		t.Error("the unlock event carries no error")
	}
	if v, err := rlVersion(t, p); err != nil || v != v100.Version {
		t.Errorf("rl_version %q, %v", v, err)
	}
}

// TestCancelled: the CLI cancels Apply's ctx on Ctrl-C. Cancelled as the first primary
// is loaded, Apply stops, returns an error saying so, puts every node back to exactly
// what it had, and releases the lock: the next deploy takes it at once.
func TestCancelled(t *testing.T) {
	for _, tt := range []struct {
		name        string
		from        *versions.Release // nil: no library
		parallelism int
	}{
		{"from 1.0.0, one at a time", &v100, 1},
		{"from 1.0.0, all at once", &v100, 4},
		{"from no library, all at once", nil, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cl := sharedCluster(t)
			tg := discover(t, urlOf(cl.Primaries[0]))
			if tt.from != nil {
				deploy(t, tg, *tt.from, false)
			}
			before := snapshot(t, cl.Nodes())
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var phases []string
			rep, err := tg.Apply(ctx, plan(t, tg, v110, false), deployer.Options{
				Parallelism: tt.parallelism,
				Progress: func(e deployer.Event) {
					phases = append(phases, string(e.Phase)+" "+e.Node.Addr)
					if e.Phase == deployer.PhaseLoad {
						cancel()
					}
				},
			})
			t.Logf("%v\n%s%q", err, describe(rep), phases)
			var partial *deployer.PartialError
			if !errors.Is(err, context.Canceled) || !errors.As(err, &partial) {
				t.Fatalf("cancelled deploy: %v, want a PartialError for context.Canceled", err)
			}
			if !rep.RolledBack {
				t.Error("not rolled back")
			}
			// No node failed: the loads the cancel cut short are its doing, not theirs.
			if strings.Contains(err.Error(), "failed") {
				t.Errorf("error %q names nodes as failed", err)
			}
			for _, n := range rep.Nodes {
				switch n.Outcome {
				case deployer.OutcomeRestored, deployer.OutcomeSkipped:
				default:
					t.Errorf("after a cancel: %+v", n)
				}
			}
			if after := snapshot(t, cl.Nodes()); !maps.Equal(before, after) {
				t.Errorf("nodes changed by a cancelled deploy:\nbefore %v\nafter  %v", before, after)
			}
			if v := lockValue(t, cl); v != "" {
				t.Errorf("lock not released after a cancel: %q", v)
			}
			deploy(t, tg, v110, false)
		})
	}
}

// TestLockStuck: a lock key no deploy will ever release (set by hand without a TTL, or a key
// of another type) is reported with how to recover, not as a lease that expires.
func TestLockStuck(t *testing.T) {
	t.Parallel()
	s := harness.StartValkey(t)
	c := s.Client(t)
	tg := discover(t, urlOf(s))
	for _, tt := range []struct {
		name string
		set  valkey.Completed
		want []string
	}{
		{"no TTL", c.B().Set().Key(deployer.LockKey).Value("someone|0").Build(),
			[]string{"held by someone with no expiry", "remove it: DEL " + deployer.LockKey + " on " + s.Addr}},
		{"wrong type", c.B().Lpush().Key(deployer.LockKey).Element("x").Build(),
			[]string{deployer.LockKey + " on " + s.Addr + " is not a deploy lock", "DEL " + deployer.LockKey}},
	} {
		if err := c.Do(t.Context(), c.B().Del().Key(deployer.LockKey).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if err := c.Do(t.Context(), tt.set).Error(); err != nil {
			t.Fatal(err)
		}
		_, err := tg.Apply(t.Context(), plan(t, tg, v100, false), deployer.Options{})
		if !errors.Is(err, deployer.ErrLocked) {
			t.Fatalf("%s: %v, want ErrLocked", tt.name, err)
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tt.name, err, w)
			}
		}
	}
}
