package deploy

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/internal/harness"
)

// TestStandalone: Valkey 8 and Redis 7.0, each a primary with a replica (and on Valkey a
// replica of that replica), found from the last replica's URL; a deploy reaches every
// replica and is verified there.
func TestStandalone(t *testing.T) {
	for _, tt := range []struct {
		name    string
		start   func(testing.TB, ...string) *harness.Server
		chained bool
	}{
		{"valkey8", harness.StartValkey, true},
		{"redis7.0", harness.StartRedis, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := tt.start(t)
			r := tt.start(t, "--replicaof", "127.0.0.1", fmt.Sprint(p.Port))
			nodes := []*harness.Server{p, r}
			waitReplicas(t, p, 1)
			want := map[string]deployer.Node{
				p.Addr: {Addr: p.Addr, Role: deployer.RolePrimary},
				r.Addr: {Addr: r.Addr, Role: deployer.RoleReplica, Primary: p.Addr},
			}
			if tt.chained {
				rr := tt.start(t, "--replicaof", "127.0.0.1", fmt.Sprint(r.Port))
				waitReplicas(t, r, 1)
				nodes = append(nodes, rr)
				want[rr.Addr] = deployer.Node{Addr: rr.Addr, Role: deployer.RoleReplica, Primary: r.Addr}
			}

			tg := discover(t, urlOf(nodes[len(nodes)-1]))
			topo := tg.Topology()
			if topo.Cluster || len(topo.Nodes) != len(want) || topo.Nodes[0].Addr != p.Addr {
				t.Fatalf("topology %+v, want %v with the primary first", topo, want)
			}
			for _, n := range topo.Nodes {
				if n != want[n.Addr] {
					t.Errorf("node %+v, want %+v", n, want[n.Addr])
				}
			}

			// LIBRARYNAME is a pattern, case-insensitive on Redis 7.0: another library whose
			// name only differs in case is not ours, and a deploy leaves it alone.
			pc := p.Client(t)
			other := "#!lua name=RATELIMIT\nredis.register_function{function_name = 'rltest_other', " +
				"callback = function() return 1 end, flags = {'no-writes'}}\n"
			if err := pc.Do(t.Context(), pc.B().FunctionLoad().FunctionCode(other).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			for _, s := range plan(t, tg, v100, false).Steps {
				if s.State != deployer.StateAbsent || s.Code != "" {
					t.Errorf("%s: %s with code %q, want absent", s.Node.Addr, s.State, s.Code)
				}
			}

			for _, to := range []struct {
				name  string
				force bool
			}{{"1.0.0", false}, {"1.1.0", false}} {
				rel := must(releases.Find(to.name))
				rep := deploy(t, tg, rel, to.force)
				for _, n := range rep.Nodes {
					wantOutcome := deployer.OutcomeReplicated
					if n.Node.Role == deployer.RolePrimary {
						wantOutcome = deployer.OutcomeLoaded
					}
					if n.Outcome != wantOutcome {
						t.Errorf("deploy %s: %+v, want %s", rel.Version, n, wantOutcome)
					}
				}
				for _, s := range nodes {
					if v, err := rlVersion(t, s); err != nil || v != rel.Version {
						t.Errorf("%s: rl_version %q, %v, want %s", s.Addr, v, err, rel.Version)
					}
				}
			}
			for _, s := range nodes {
				c := s.Client(t)
				if v, err := c.Do(t.Context(), c.B().FcallRo().Function("rltest_other").Numkeys(0).Build()).AsInt64(); err != nil || v != 1 {
					t.Errorf("%s: the other library is gone: %d, %v", s.Addr, v, err)
				}
			}
		})
	}
}

// waitReplicas waits until a primary has n replicas online.
func waitReplicas(t *testing.T, p *harness.Server, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if err := p.WaitReplicas(ctx, n); err != nil {
		t.Fatal(err)
	}
}

// addDeployer creates the deploy-only ACL user on every node (ACL users are per node).
func addDeployer(t *testing.T, nodes []*harness.Server, name, password string, rules []string) {
	t.Helper()
	for _, s := range nodes {
		c := s.Client(t)
		args := append([]string{"SETUSER", name, "reset", "on", ">" + password}, rules...)
		if err := c.Do(t.Context(), c.B().Arbitrary("ACL").Args(args...).Build()).Error(); err != nil {
			t.Fatalf("%s: ACL %v: %v", s.Addr, args, err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = c.Do(ctx, c.B().AclDeluser().Username(name).Build()).Error()
		})
	}
}

// TestTLSAndACL: a TLS-only Valkey primary and replica, reached with rediss:// as a user
// holding only deployer.ACLRules: discover, deploy, verify on the replica. The user can
// touch nothing else.
func TestTLSAndACL(t *testing.T) {
	ca, err := harness.NewTLS()
	if err != nil {
		t.Fatal(err)
	}
	p := harness.StartValkeyTLS(t, ca)
	r := harness.StartValkeyTLS(t, ca, "--replicaof", "127.0.0.1", fmt.Sprint(p.Port))
	waitReplicas(t, p, 1)
	addDeployer(t, []*harness.Server{p, r}, "deployer", "s3cret", deployer.ACLRules)

	opt, err := options("rediss://deployer:s3cret@" + r.Addr)
	if err != nil {
		t.Fatal(err)
	}
	opt.TLSConfig.RootCAs = ca.ClientConfig().RootCAs

	// Without the CA, the server's certificate is not trusted.
	untrusted := opt
	untrusted.TLSConfig = opt.TLSConfig.Clone()
	untrusted.TLSConfig.RootCAs = nil
	if tg, err := deployer.Discover(t.Context(), untrusted); err == nil {
		tg.Close()
		t.Error("Discover trusted a certificate from an unknown CA")
	}

	tg := discoverOpt(t, opt)
	if n := tg.Topology().Nodes; len(n) != 2 || n[0].Addr != p.Addr || n[1].Addr != r.Addr {
		t.Fatalf("topology over TLS: %+v", n)
	}
	deploy(t, tg, v100, false)
	rep := deploy(t, tg, v110, false)
	t.Logf("over TLS as an ACL user:\n%s", describe(rep))
	if v, err := rlVersion(t, r); err != nil || v != "1.1.0" {
		t.Errorf("replica: rl_version %q, %v", v, err)
	}

	// The deploy user can do nothing else.
	c, err := valkey.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c2, err := valkey.NewClient(func() valkey.ClientOption { o := opt; o.InitAddress = []string{p.Addr}; return o }())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	for _, cmd := range []valkey.Completed{
		c2.B().Get().Key("someone:else").Build(),
		c2.B().Set().Key("someone:else").Value("x").Build(),
		c2.B().Fcall().Function("rl_fixed_window").Numkeys(1).Key("k").Arg("1", "1000", "1").Build(),
		c2.B().FunctionFlush().Build(),
		c2.B().Flushall().Build(),
		c2.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", "1").Build(),
		c2.B().Keys().Pattern("*").Build(),
		// Inspect asks it too, and took the refusal for "not told", not for a server
		// without Lua: the deploys above went through.
		c2.B().FunctionStats().Build(),
	} {
		err := c2.Do(t.Context(), cmd).Error()
		if err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("%v as the deploy user: %v, want NOPERM", cmd.Commands(), err)
		}
	}
}

// TestACLCluster: the deploy-only user deploys to the cluster (the lock through the
// routed client, which needs CLUSTER SHARDS) and, when a primary refuses, restores the
// others to no library (FUNCTION DELETE). Each rule is needed: without it, some part fails.
func TestACLCluster(t *testing.T) {
	cl := sharedCluster(t)
	addDeployer(t, cl.Nodes(), "deployer", "s3cret", deployer.ACLRules)
	url := "redis://deployer:s3cret@" + cl.Replicas[0].Addr
	tg := discover(t, url)
	if n := len(tg.Topology().Nodes); n != 6 {
		t.Fatalf("%d nodes found as the deploy user", n)
	}

	// A failed first deploy: the restored primaries have no library again.
	full := cl.Primaries[0]
	if full == lockOwner(t, cl) {
		full = cl.Primaries[1]
	}
	setMaxmemory(t, full, "1")
	_, err := tg.Apply(t.Context(), plan(t, tg, v100, false), deployer.Options{})
	var partial *deployer.PartialError
	if !errors.As(err, &partial) {
		t.Fatalf("deploy onto a full primary as the deploy user: %v", err)
	}
	for _, n := range partial.Report.Nodes {
		if n.Outcome == deployer.OutcomeRestoreFailed {
			t.Errorf("as the deploy user: %+v", n)
		}
	}
	for _, s := range cl.Nodes() {
		waitCode(t, s, "")
	}
	setMaxmemory(t, full, "0")
	deploy(t, tg, v100, false)
	deploy(t, tg, v110, false)

	// Without any one rule, discovering, deploying and restoring does not all work.
	for _, rule := range deployer.ACLRules {
		if !strings.HasPrefix(rule, "+") {
			continue
		}
		t.Run(rule, func(t *testing.T) {
			reset(t, cl.Nodes())
			rules := make([]string, 0, len(deployer.ACLRules))
			for _, r := range deployer.ACLRules {
				if r != rule {
					rules = append(rules, r)
				}
			}
			addDeployer(t, cl.Nodes(), "partial", "s3cret", rules)
			if err := cycle(t, cl, "redis://partial:s3cret@"+cl.Primaries[0].Addr); err == nil {
				t.Errorf("deploys fully without %s", rule)
			} else {
				t.Logf("without %s: %v", rule, err)
			}
		})
	}
}

var heldByGhost = regexp.MustCompile(`held by ghost, lease expires in (1m0s|59(\.[0-9]+)?s)`)

// cycle is everything a deploy user does, and returns the first thing that did not work:
// discover the cluster; find the lock held by a dead deployer and say who holds it for
// how long; deploy 1.0.0 with one primary refusing, so the others are restored to no
// library; deploy 1.0.0, stalled past its lease, so that only renewal keeps the lock.
func cycle(t *testing.T, cl *harness.Cluster, url string) error {
	opt, err := options(url)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	tg, err := deployer.Discover(ctx, opt)
	if err != nil {
		return err
	}
	defer tg.Close()
	inspect := func() (deployer.Plan, error) {
		installed, err := tg.Inspect(ctx, releases)
		if err != nil {
			return deployer.Plan{}, err
		}
		for _, in := range installed {
			if in.Unreachable != nil {
				return deployer.Plan{}, in.Unreachable
			}
		}
		return deployer.NewPlan(installed, v100, false), nil
	}
	p, err := inspect()
	if err != nil {
		return err
	}

	oc := lockOwner(t, cl).Client(t)
	if err := oc.Do(ctx, oc.B().Set().Key(deployer.LockKey).Value("ghost|0").Px(time.Minute).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	_, err = tg.Apply(ctx, p, deployer.Options{})
	_ = oc.Do(ctx, oc.B().Del().Key(deployer.LockKey).Build()).Error()
	// The lease was set to a minute just before: PTTL reads 60000ms, or a little less.
	if !errors.Is(err, deployer.ErrLocked) || !heldByGhost.MatchString(err.Error()) {
		return fmt.Errorf("deploy under a held lock: %v, want ErrLocked saying who and how long", err)
	}

	// The refusing primary is the last one loaded that does not hold the lock (a full node
	// would refuse its SET too), loaded one at a time: so at least one primary is loaded
	// before it refuses and must be restored, which needs FUNCTION DELETE. With parallel
	// loads, the refusal could come first and leave nothing to restore.
	var full *harness.Server
	for _, s := range p.Steps {
		for _, srv := range cl.Primaries {
			if srv.Addr == s.Node.Addr && s.Action == deployer.ActionLoad && srv != lockOwner(t, cl) {
				full = srv
			}
		}
	}
	if full == nil {
		t.Fatal("no primary to refuse the load")
	}
	setMaxmemory(t, full, "1")
	rep, err := tg.Apply(ctx, p, deployer.Options{VerifyTimeout: 2 * time.Second, Parallelism: 1})
	setMaxmemory(t, full, "0")
	var partial *deployer.PartialError
	if !errors.As(err, &partial) {
		return fmt.Errorf("refused deploy: %v, want a PartialError", err)
	}
	for _, n := range rep.Nodes {
		if n.Outcome == deployer.OutcomeRestoreFailed {
			return n.Err
		}
	}

	if p, err = inspect(); err != nil {
		return err
	}
	var once sync.Once
	rep, err = tg.Apply(ctx, p, deployer.Options{
		VerifyTimeout: 2 * time.Second,
		LockLease:     300 * time.Millisecond,
		Progress: func(e deployer.Event) {
			if e.Phase == deployer.PhaseLoad {
				once.Do(func() { time.Sleep(700 * time.Millisecond) })
			}
		},
	})
	if err == nil && len(rep.Warnings) > 0 {
		// e.g. the lock was not released: the deploy went through, but not cleanly.
		return fmt.Errorf("%v", rep.Warnings)
	}
	return err
}

// TestForcedLeavesOut: a replica stopped after discovery cannot be inspected; the plan is
// refused until forced, and the forced deploy loads the rest and reports the stopped
// replica left out (NOT deployed), never touching it.
func TestForcedLeavesOut(t *testing.T) {
	t.Parallel()
	p := harness.StartValkey(t)
	up := harness.StartValkey(t, "--replicaof", "127.0.0.1", fmt.Sprint(p.Port))
	down := harness.StartValkey(t, "--replicaof", "127.0.0.1", fmt.Sprint(p.Port))
	waitReplicas(t, p, 2)
	tg := discover(t, urlOf(p))
	if n := len(tg.Topology().Nodes); n != 3 {
		t.Fatalf("%d nodes discovered, want 3", n)
	}
	if err := down.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}

	installed, err := tg.Inspect(t.Context(), releases)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tg.Apply(t.Context(), deployer.NewPlan(installed, v100, false), deployer.Options{}); err == nil ||
		!strings.Contains(err.Error(), down.Addr+" is unreachable") {
		t.Fatalf("unforced deploy with a node down: %v, want refused naming %s", err, down.Addr)
	}

	var mu sync.Mutex
	touched := map[string]bool{}
	rep, err := tg.Apply(t.Context(), deployer.NewPlan(installed, v100, true), deployer.Options{
		Progress: func(e deployer.Event) {
			mu.Lock()
			defer mu.Unlock()
			touched[e.Node.Addr] = true
		},
	})
	// Nothing failed, but a node does not run the release: not a success.
	if !errors.Is(err, deployer.ErrNotDeployed) || !strings.Contains(err.Error(), "NOT deployed: "+down.Addr) {
		t.Fatalf("forced deploy: %v, want ErrNotDeployed naming %s\n%s", err, down.Addr, describe(rep))
	}
	t.Logf("forced deploy: %v\n%s", err, describe(rep))
	requireOutcomes(t, rep, map[string]deployer.Outcome{
		p.Addr:    deployer.OutcomeLoaded,
		up.Addr:   deployer.OutcomeReplicated,
		down.Addr: deployer.OutcomeLeftOut,
	})
	if lo := rep.LeftOut(); len(lo) != 1 || lo[0].Node.Addr != down.Addr {
		t.Errorf("LeftOut() = %v, want %s only", lo, down.Addr)
	}
	if touched[down.Addr] {
		t.Errorf("the deploy reported a phase on %s, which it leaves out", down.Addr)
	}
	for _, s := range []*harness.Server{p, up} {
		if v, err := rlVersion(t, s); err != nil || v != v100.Version {
			t.Errorf("%s: rl_version %q, %v", s.Addr, v, err)
		}
	}
}

// TestUnsupported: a server that answers without FUNCTION (renamed away) is Unsupported,
// not Unreachable; its plan step is unsupported, and Apply refuses it even forced, loading
// nothing. Redis 7.0 is supported, with a warning for its missing Lua security fixes.
func TestUnsupported(t *testing.T) {
	t.Parallel()
	noFunction := harness.StartValkey(t, "--rename-command", "FUNCTION", "")
	noFcall := harness.StartValkey(t, "--rename-command", "FCALL_RO", "")
	for _, s := range []*harness.Server{noFunction, noFcall} {
		tg := discover(t, urlOf(s))
		installed, err := tg.Inspect(t.Context(), releases)
		if err != nil {
			t.Fatal(err)
		}
		if len(installed) != 1 || installed[0].Unreachable != nil || installed[0].Unsupported == "" ||
			!strings.HasPrefix(installed[0].Server.String(), "Valkey ") {
			t.Fatalf("%s: inspected %+v, want unsupported, not unreachable", s.Cmd, installed)
		}
		t.Logf("%s: unsupported: %s", s.Addr, installed[0].Unsupported)
		p := deployer.NewPlan(installed, v100, true)
		if p.Steps[0].State != deployer.StateUnsupported || len(p.Unsupported()) != 1 {
			t.Errorf("plan: %+v, want unsupported", p.Steps[0])
		}
		var ue *deployer.UnsupportedError
		if _, err := tg.Apply(t.Context(), p, deployer.Options{}); !errors.As(err, &ue) {
			t.Errorf("forced deploy to an unsupported server: %v, want UnsupportedError", err)
		}
	}
	if got := code(t, noFcall); got != "" {
		t.Errorf("a refused deploy loaded %s", label(got))
	}

	redis := harness.StartRedis(t)
	installed, err := discover(t, urlOf(redis)).Inspect(t.Context(), releases)
	if err != nil {
		t.Fatal(err)
	}
	if in := installed[0]; in.Unsupported != "" || in.Unreachable != nil || len(in.Warnings) != 1 ||
		in.Warnings[0].ID != deployer.WarnLuaSecurity || in.Warnings[0].Addr != redis.Addr ||
		!strings.HasPrefix(in.Warnings[0].Text, "Redis 7.0.") || !strings.Contains(in.Warnings[0].Text, "lacks known Lua security fixes") {
		t.Errorf("Redis 7.0: %+v, want supported with a security warning", in)
	}
}

// Discover starts from the first seed that answers: a URL naming a node that is down first
// (?addr=, REDIS_TYPE=cluster's several nodes) still finds the deployment, and one whose
// every seed is down names each.
func TestDiscoverSeeds(t *testing.T) {
	p := harness.StartValkey(t)
	dead := fmt.Sprint("127.0.0.1:", harness.FreePorts(t, 1)[0])
	opt := valkey.ClientOption{InitAddress: []string{dead, p.Addr}}
	opt.Dialer.Timeout = time.Second
	tg, err := deployer.Discover(t.Context(), opt)
	if err != nil {
		t.Fatalf("a dead first seed: %v", err)
	}
	defer tg.Close()
	if nodes := tg.Topology().Nodes; len(nodes) != 1 || nodes[0].Addr != p.Addr {
		t.Fatalf("nodes %+v, want %s alone", nodes, p.Addr)
	}
	dead2 := fmt.Sprint("127.0.0.1:", harness.FreePorts(t, 1)[0])
	opt.InitAddress = []string{dead, dead2}
	if _, err := deployer.Discover(t.Context(), opt); err == nil || !strings.Contains(err.Error(), dead) || !strings.Contains(err.Error(), dead2) {
		t.Fatalf("every seed dead: %v, want an error naming both", err)
	}
}
