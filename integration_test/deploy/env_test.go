package deploy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/versions"
)

// env holds the cluster the tests that leave it as they found it share: started on first
// use, removed by TestMain.
var env struct {
	once    sync.Once
	err     error
	cluster *harness.Cluster
}

func TestMain(m *testing.M) {
	code := m.Run()
	if env.cluster != nil {
		_ = env.cluster.Terminate(context.Background())
	}
	os.Exit(code)
}

// sharedCluster returns the shared 3-primary, 3-replica cluster, reset: no library on any
// node, no deploy lock. Tests using it must not run in parallel.
func sharedCluster(t testing.TB) *harness.Cluster {
	t.Helper()
	env.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		began := time.Now()
		env.cluster, env.err = harness.NewCluster(ctx, 3, 1)
		if env.err == nil {
			fmt.Fprintf(os.Stderr, "deploy tests: shared cluster up in %s\n", time.Since(began).Round(time.Millisecond))
		}
	})
	if env.err != nil {
		harness.Unavailable(t, "shared cluster", env.err)
	}
	reset(t, env.cluster.Nodes())
	return env.cluster
}

// reset removes every function library and the deploy lock from the primaries, and
// waits until the replicas have followed.
func reset(t testing.TB, nodes []*harness.Server) {
	t.Helper()
	for _, s := range nodes {
		c := s.Client(t)
		if isReplica(t, c) {
			continue
		}
		for _, cmd := range []valkey.Completed{
			c.B().FunctionFlush().Build(),
			c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", "0").Build(),
		} {
			if err := c.Do(t.Context(), cmd).Error(); err != nil {
				t.Fatalf("reset %s: %v", s.Addr, err)
			}
		}
		// DEL on the node that does not own the key answers MOVED: only the owner deletes.
		_ = c.Do(t.Context(), c.B().Del().Key(deployer.LockKey).Build()).Error()
	}
	for _, s := range nodes {
		waitCode(t, s, "")
	}
}

func isReplica(t testing.TB, c valkey.Client) bool {
	t.Helper()
	role, err := c.Do(t.Context(), c.B().Role().Build()).ToArray()
	if err != nil || len(role) == 0 {
		t.Fatalf("ROLE: %v", err)
	}
	r, _ := role[0].ToString()
	return r == "slave"
}

// Test releases: the embedded ones (1.0.0, 1.1.0, ...) and a 2.0.0 made from the newest by
// rewriting the version it declares, which is all that tells releases apart to the deployer:
// a major version change that no release makes yet.
var (
	releases = func() versions.Set {
		// Only released code: what rlfn deploys is what these tests deploy. The working copy
		// is checked against the newest release by versions' tests.
		set := versions.Embedded()
		latest := set.Latest()
		major := strings.Replace(latest.Code, "local VERSION = '"+latest.Version+"'", "local VERSION = '2.0.0'", 1)
		if major == latest.Code || versions.Major(latest.Version) != "1" {
			panic("the newest release is not a 1.x declaring its version as this test expects")
		}
		return append(slices.Clip(set), versions.Release{Version: "2.0.0", Code: major})
	}()
	v100 = must(releases.Find("1.0.0"))
	v110 = must(releases.Find("1.1.0"))
	v200 = must(releases.Find("2.0.0"))
)

func must(r versions.Release, ok bool) versions.Release {
	if !ok {
		panic("missing test release")
	}
	return r
}

// discover finds the target from one node's URL; the target is closed when the test ends.
func discover(t *testing.T, url string) *deployer.Target {
	t.Helper()
	opt, err := options(url)
	if err != nil {
		t.Fatal(err)
	}
	return discoverOpt(t, opt)
}

// options are the client options of a node's URL, as the CLI makes them: no client-side
// caching.
func options(url string) (valkey.ClientOption, error) {
	opt, err := valkey.ParseURL(url)
	opt.DisableCache = true
	return opt, err
}

func discoverOpt(t *testing.T, opt valkey.ClientOption) *deployer.Target {
	t.Helper()
	tg, err := deployer.Discover(t.Context(), opt)
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	t.Cleanup(tg.Close)
	return tg
}

func urlOf(s *harness.Server) string { return "redis://" + s.Addr }

// plan inspects the target and plans a deploy of to.
func plan(t *testing.T, tg *deployer.Target, to versions.Release, force bool) deployer.Plan {
	t.Helper()
	installed, err := tg.Inspect(t.Context(), releases)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	for _, in := range installed {
		if in.Unreachable != nil {
			t.Fatalf("Inspect: %s: %v", in.Node.Addr, in.Unreachable)
		}
	}
	return deployer.NewPlan(installed, to, force)
}

// deploy plans and applies a deploy of to, failing the test on any error.
func deploy(t *testing.T, tg *deployer.Target, to versions.Release, force bool) deployer.Report {
	t.Helper()
	rep, err := tg.Apply(t.Context(), plan(t, tg, to, force), deployer.Options{})
	if err != nil {
		t.Fatalf("deploy %s: %v\n%s", to.Version, err, describe(rep))
	}
	return rep
}

// describe lists a report's nodes for a test's log, each field as it is: the CLI's table is
// the report's only rendering for people.
func describe(rep deployer.Report) string {
	var b strings.Builder
	for _, n := range rep.Nodes {
		fmt.Fprintf(&b, "  %s %s %s from %q to %q in %s, err %v\n", n.Node.Addr, n.Role(), n.Outcome, n.From, n.To, n.Duration.Round(time.Millisecond), n.Err)
	}
	return b.String()
}

// setMaxmemory sets a node's maxmemory: "1" makes it refuse FUNCTION LOAD (OOM), "0" lifts it.
func setMaxmemory(t testing.TB, s *harness.Server, v string) {
	t.Helper()
	c := s.Client(t)
	if err := c.Do(context.Background(), c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", v).Build()).Error(); err != nil {
		t.Errorf("%s: CONFIG SET maxmemory %s: %v", s.Addr, v, err)
	}
}

// code returns the ratelimit library's code on a node, read directly, "" when absent.
func code(t testing.TB, s *harness.Server) string {
	t.Helper()
	got, err := harness.LibraryCode(t.Context(), s.Client(t), "ratelimit")
	if err != nil {
		t.Fatalf("%s: FUNCTION LIST: %v", s.Addr, err)
	}
	return got
}

// waitCode waits up to 10s for a node (a replica catching up) to hold code.
func waitCode(t testing.TB, s *harness.Server, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := code(t, s)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s runs %s, want %s", s.Addr, label(got), label(want))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// label names code for failure messages.
func label(code string) string {
	if code == "" {
		return "no library"
	}
	if r, ok := releases.Identify(code); ok {
		return r.Version
	}
	return "drifted code"
}

// snapshot is every node's full FUNCTION LIST WITHCODE reply, every library included.
func snapshot(t testing.TB, nodes []*harness.Server) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, s := range nodes {
		c := s.Client(t)
		libs, err := c.Do(t.Context(), c.B().FunctionList().Withcode().Build()).ToAny()
		if err != nil && !valkey.IsValkeyNil(err) {
			t.Fatalf("%s: FUNCTION LIST: %v", s.Addr, err)
		}
		out[s.Addr] = fmt.Sprint(libs)
	}
	return out
}

// rlVersion calls rl_version on one node with FCALL_RO.
func rlVersion(t testing.TB, s *harness.Server) (string, error) {
	t.Helper()
	c := s.Client(t)
	return c.Do(t.Context(), c.B().FcallRo().Function("rl_version").Numkeys(0).Build()).ToString()
}

// requireOutcomes checks a report's outcome for every node.
func requireOutcomes(t *testing.T, rep deployer.Report, want map[string]deployer.Outcome) {
	t.Helper()
	if len(rep.Nodes) != len(want) {
		t.Errorf("report has %d nodes, want %d:\n%s", len(rep.Nodes), len(want), describe(rep))
	}
	for _, n := range rep.Nodes {
		if w, ok := want[n.Node.Addr]; !ok || n.Outcome != w {
			t.Errorf("%s: outcome %s, want %s:\n%s", n.Node.Addr, n.Outcome, w, describe(rep))
		}
	}
}

// lockOwner returns the cluster primary that owns the deploy lock's slot.
func lockOwner(t *testing.T, cl *harness.Cluster) *harness.Server {
	t.Helper()
	return ownerOf(t, cl, deployer.LockKey)
}

// ownerOf returns the cluster primary that owns key's slot.
func ownerOf(t *testing.T, cl *harness.Cluster, key string) *harness.Server {
	t.Helper()
	for _, p := range cl.Primaries {
		c := p.Client(t)
		err := c.Do(t.Context(), c.B().Exists().Key(key).Build()).Error()
		var ve *valkey.ValkeyError
		if errors.As(err, &ve) {
			if _, moved := ve.IsMoved(); moved {
				continue
			}
		}
		if err != nil {
			t.Fatalf("%s: EXISTS: %v", p.Addr, err)
		}
		return p
	}
	t.Fatalf("no primary owns %s", key)
	return nil
}
