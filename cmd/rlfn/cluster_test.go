package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/versions"
)

// TestCluster finds every node of a 3-shard cluster from one of its replicas, deploys 1.0.0
// to every primary and calls principals that land on every shard; then, with 1.1.0 loaded by
// hand on one primary (a partial rollout), status and diff show the others behind, diff shows
// the real code diff 1.0.0 -> 1.1.0, and a deploy completes the rollout.
func TestCluster(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	c := harness.StartCluster(t, 3, 1)
	seed := c.Replicas[0].Addr
	set := testReleases(t)
	v100, v110 := set[0], set[1]

	st := statusOf(t, set, seed)
	roles := map[string]int{}
	for _, row := range st {
		roles[row.Role]++
		if row.State != "absent" {
			t.Errorf("%s is %s before the first deploy", row.Addr, row.State)
		}
		if row.Role == "primary" && row.Slots == 0 {
			t.Errorf("primary %s owns no slots", row.Addr)
		}
	}
	if roles["primary"] != 3 || roles["replica"] != 3 {
		t.Fatalf("status from a replica found %v, want 3 primaries and 3 replicas", roles)
	}

	// Before any deploy, a call fails naming the primary of its key's slot, which answered
	// (the server's reply does not say which node of the cluster it is), and the key; a
	// peek, which rlfn sends without discovering the cluster, names the key.
	r := rlfnAt(t, set, seed, "call", "sliding_log", "user:0", "--limit", "1", "--window", "1m")
	wantExit(t, r, exitError, "a call before any deploy")
	if m := regexp.MustCompile(`^rlfn: (127\.0\.0\.1:\d+) \(rl:\{user:0\}:sliding_log\): client: the ratelimit library is not loaded on the server \(run rlfn deploy\)\n$`).FindStringSubmatch(r.stderr); m == nil {
		t.Errorf("a call before any deploy: stderr %q does not name the node and the key", r.stderr)
	} else {
		i := slices.IndexFunc(c.Primaries, func(p *harness.Server) bool { return p.Addr == m[1] })
		if i < 0 {
			t.Fatalf("the call names %s, not a primary", m[1])
		}
		vk := c.Primaries[i].Client(t) // follows no redirect: another node's slot is MOVED
		if err := vk.Do(context.Background(), vk.B().Get().Key("rl:{user:0}:sliding_log").Build()).Error(); err != nil && !valkey.IsValkeyNil(err) {
			t.Errorf("the call names %s, which does not serve the key: %v", m[1], err)
		}
	}
	r = rlfnAt(t, set, seed, "call", "sliding_log", "user:0", "--limit", "1", "--window", "1m", "--peek")
	if !strings.HasPrefix(r.stderr, "rlfn: rl:{user:0}:sliding_log: client: the ratelimit library is not loaded on the server (run rlfn deploy)") {
		t.Errorf("a peek before any deploy: stderr %q does not name the key", r.stderr)
	}

	r = rlfnAt(t, set, seed, "deploy", "--yes", "--to", v100.Version)
	wantExit(t, r, exitOK, "deploy 1.0.0 to the cluster")
	for _, row := range statusOf(t, set, seed) {
		if row.State != "behind" || row.Version != v100.Version {
			t.Errorf("after the deploy of 1.0.0 %s is %s %q, want behind 1.0.0", row.Addr, row.State, row.Version)
		}
	}
	// 30 principals spread over the 3 shards: each call reaches its slot's primary.
	for i := range 30 {
		r := rlfnAt(t, set, seed, "call", "sliding_log", fmt.Sprintf("user:%d", i), "--limit", "1", "--window", "1m", "--repeat", "2", "--json")
		wantExit(t, r, exitOK, "call on the cluster")
		if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 2 ||
			!strings.Contains(lines[0], `"allowed":true`) || !strings.Contains(lines[1], `"allowed":false`) {
			t.Fatalf("user:%d: %s", i, r.stdout)
		}
	}

	// A partial rollout: one primary (and so its replica) runs 1.1.0, loaded by hand.
	ahead := c.Primaries[1]
	vk := ahead.Client(t)
	if err := vk.Do(context.Background(), vk.B().FunctionLoad().Replace().FunctionCode(v110.Code).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	waitLibrary(t, c.ReplicasOf(ahead)[0], v110.Code)
	upgraded := map[string]bool{ahead.Addr: true, c.ReplicasOf(ahead)[0].Addr: true}
	var behind []string // the primaries still on 1.0.0
	for _, p := range c.Primaries {
		if !upgraded[p.Addr] {
			behind = append(behind, p.Addr)
		}
	}
	slices.Sort(behind)

	for addr, row := range statusOf(t, set, seed) {
		want, version := "behind", v100.Version
		if upgraded[addr] {
			want, version = "current", v110.Version
		}
		if row.State != want || row.Version != version {
			t.Errorf("partial rollout: %s is %s %q, want %s %s", addr, row.State, row.Version, want, version)
		}
	}
	r = rlfnAt(t, set, seed, "status")
	wantExit(t, r, exitOK, "status during a partial rollout")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")[1:]
	// Under the table, the warnings our images and the harness's clusters earn (the Lua fixes,
	// cluster-require-full-coverage), each once for all six nodes.
	if len(lines) != 8 {
		t.Fatalf("status: %d lines under the header, want 6 nodes and 2 warnings:\n%s", len(lines), r.stdout)
	}
	if warning := lines[6]; !strings.HasPrefix(warning, "Warning: ") || strings.Count(warning, ", 127.0.0.1:") != 5 ||
		!strings.Contains(warning, ": Valkey 8.0.1 lacks known Lua security fixes") {
		t.Errorf("status warning line %q, want one for the six nodes", warning)
	}
	if warning := lines[7]; !strings.HasPrefix(warning, "Warning: ") || strings.Count(warning, ", 127.0.0.1:") != 5 ||
		!strings.HasSuffix(warning, "[full-coverage]") {
		t.Errorf("status warning line %q, want one for the six nodes", warning)
	}
	for _, line := range lines[:6] {
		addr, _, _ := strings.Cut(line, " ")
		want := "1.0.0 +behind$"
		if upgraded[addr] {
			want = "1.1.0 +current$"
		}
		if !regexp.MustCompile(want).MatchString(line) {
			t.Errorf("status line %q does not match %q", line, want)
		}
	}

	r = rlfnAt(t, set, seed, "diff", "--exit-code")
	wantExit(t, r, exitPending, "diff --exit-code during a partial rollout")
	for _, want := range []string{
		"Plan: load 1.1.0 on 2 primaries of 3; 3 replicas follow their primaries.",
		"--- ratelimit 1.0.0 on " + strings.Join(behind, ", ") + "\n+++ ratelimit 1.1.0\n",
		"\n-local VERSION = '1.0.0'\n",
		"\n+local VERSION = '1.1.0'\n",
		"\n+  function_name = 'rl_concurrency',\n", // a line only 1.1.0 has
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("diff during a partial rollout does not contain %q:\n%s", want, r.stdout)
		}
	}
	for _, addr := range behind {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(addr) + ` +primary +1\.0\.0 +1\.1\.0 +upgrade 1\.0\.0 -> 1\.1\.0$`).MatchString(r.stdout) {
			t.Errorf("diff does not plan the upgrade of %s:\n%s", addr, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "--- ratelimit 1.1.0") {
		t.Errorf("diff shows a diff of the primary that already runs 1.1.0:\n%s", r.stdout)
	}

	r = rlfnAt(t, set, seed, "diff", "--json")
	wantExit(t, r, exitOK, "diff --json during a partial rollout")
	var dj diffJSON
	if err := json.Unmarshal([]byte(r.stdout), &dj); err != nil {
		t.Fatalf("diff --json: %v\n%s", err, r.stdout)
	}
	if !dj.Pending || len(dj.Diffs) != 1 || dj.Diffs[0].From != v100.Version || dj.Diffs[0].State != "behind" ||
		!slices.Equal(dj.Diffs[0].Nodes, behind) || !strings.Contains(dj.Diffs[0].Diff, "\n+local VERSION = '1.1.0'\n") {
		t.Errorf("diff --json during a partial rollout = %+v, want one diff from 1.0.0 on %v", dj, behind)
	}
	for _, s := range dj.Steps {
		if want := map[bool]string{true: "current", false: "behind"}[upgraded[s.Addr]]; s.State != want {
			t.Errorf("diff --json: %s is %s, want %s", s.Addr, s.State, want)
		}
	}

	wantExit(t, rlfnAt(t, set, seed, "deploy", "--yes"), exitOK, "deploy completing the rollout")
	for _, row := range statusOf(t, set, seed) {
		if row.State != "current" || row.Version != v110.Version {
			t.Errorf("after the rollout %s is %s %q", row.Addr, row.State, row.Version)
		}
	}
	wantExit(t, rlfnAt(t, set, seed, "diff", "--exit-code"), exitOK, "diff after the rollout")
	// The limiters the 1.0.0 calls exhausted are still exhausted under 1.1.0.
	for i := range 30 {
		r := rlfnAt(t, set, seed, "call", "sliding_log", fmt.Sprintf("user:%d", i), "--limit", "1", "--window", "1m", "--peek", "--json")
		if wantExit(t, r, exitOK, "peek after the rollout"); !strings.Contains(r.stdout, `"allowed":false`) {
			t.Fatalf("user:%d after the rollout: %s", i, r.stdout)
		}
	}
}

// waitLibrary waits up to 10s for a node (a replica catching up) to run code.
func waitLibrary(t *testing.T, s *harness.Server, code string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := harness.LibraryCode(context.Background(), s.Client(t), functions.Library)
		if err == nil && got == code {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not run the expected code after 10s (%v)", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTLSAndACL deploys over rediss:// with --tls-ca as a user that may deploy and do nothing
// else: the same user cannot call a limiter.
func TestTLSAndACL(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	ca, err := harness.NewTLS()
	if err != nil {
		t.Fatal(err)
	}
	s := harness.StartValkeyTLS(t, ca)
	vk := s.Client(t)
	acl := append([]string{"deployer", "on", ">s3cret"}, deployer.ACLRules...)
	if err := vk.Do(context.Background(), vk.B().AclSetuser().Username(acl[0]).Rule(acl[1:]...).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.CAPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	set := versions.Embedded()
	url := "rediss://deployer:s3cret@" + s.Addr
	run := func(args ...string) result {
		return rlfn(t, set, append(append([]string{"--url", url, "--tls-ca", caFile}, acceptOurs...), args...)...)
	}

	// Without the CA the certificate is not trusted: one line, naming the node, and what to
	// do.
	r := rlfn(t, set, "--url", url, "status")
	if r.code != exitError || !strings.Contains(r.stderr, s.Addr) || !strings.Contains(r.stderr, "certificate") ||
		!strings.Contains(r.stderr, "(name the CA that signed it with --tls-ca or $RLFN_TLS_CA)") {
		t.Errorf("status without --tls-ca: exit %d, stderr %q", r.code, r.stderr)
	}
	// The wrong scheme either way says which to use: plain text to the TLS port is cut off,
	// TLS to a plain port waits for a handshake until --timeout.
	plain := harness.StartValkey(t)
	for _, tt := range []struct {
		global []string
		want   string
	}{
		{[]string{"--url", "redis://deployer:s3cret@" + s.Addr}, "does the port need TLS? then use rediss://"},
		{[]string{"--url", "rediss://" + plain.Addr, "--tls-ca", caFile}, "no answer to the TLS handshake within --timeout: is it a TLS port?"},
	} {
		for _, cmd := range [][]string{{"status"}, {"call", "fixed_window", "k", "--limit", "1", "--window", "1s"}} {
			r := rlfn(t, set, append(append(tt.global, "--timeout", "1s"), cmd...)...)
			if r.code != exitError || !strings.Contains(r.stderr, tt.want) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
				t.Errorf("%v %v: exit %d, stderr %q; want one line saying %q", tt.global, cmd, r.code, r.stderr, tt.want)
			}
		}
	}
	r = rlfn(t, set, "--url", "rediss://deployer:wrong@"+s.Addr, "--tls-ca", caFile, "status")
	if r.code != exitError || strings.Contains(r.stderr, "wrong") {
		t.Errorf("status with a wrong password: exit %d, stderr %q (must not echo the password)", r.code, r.stderr)
	}

	wantExit(t, run("deploy", "--yes"), exitOK, "deploy over TLS as the deploy-only user")
	if r := run("status", "--json"); r.code != exitOK || !strings.Contains(r.stdout, `"state": "current"`) {
		t.Errorf("status after the deploy: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = run("call", "token_bucket", "user:1", "--capacity", "1", "--rate", "1", "--period", "1s")
	if r.code != exitError || !strings.Contains(r.stderr, "NOPERM") {
		t.Errorf("a call by the deploy-only user: exit %d, stderr %q; want NOPERM", r.code, r.stderr)
	}
}

// TestConfirm answers deploy's question on a (pretended) terminal.
func TestConfirm(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	defer func(f func(any) bool) { isTerminal = f }(isTerminal)
	isTerminal = func(any) bool { return true }
	s := harness.StartValkey(t)
	set := versions.Embedded()
	for _, tt := range []struct {
		give string
		code int
		want string
	}{
		{"\n", exitError, "not confirmed"},
		{"no\n", exitError, "not confirmed"},
		{"y\n", exitOK, "Deployed " + set.Latest().Version},
	} {
		app := New()
		var stdout, stderr strings.Builder
		app.Reader, app.Writer, app.ErrWriter = strings.NewReader(tt.give), &stdout, &stderr
		code := runApp(context.Background(), app, append([]string{"rlfn", "--url", "redis://" + s.Addr, "deploy"}, acceptOurs...))
		if code != tt.code || !strings.Contains(stdout.String()+stderr.String(), tt.want) {
			t.Errorf("answer %q: exit %d\nstdout:\n%s\nstderr:\n%s", tt.give, code, stdout.String(), stderr.String())
		}
		if !strings.Contains(stderr.String(), "[y/N]") {
			t.Errorf("answer %q: no question asked: %q", tt.give, stderr.String())
		}
		if tt.code == exitOK && !strings.Contains(stderr.String(), "load") {
			t.Errorf("no progress shown on the terminal: %q", stderr.String())
		}
	}
}

// slowReader answers a prompt after a person's pause.
type slowReader struct {
	pause  time.Duration
	answer string
	done   bool
}

func (r *slowReader) Read(p []byte) (int, error) {
	if r.done {
		return 0, io.EOF
	}
	time.Sleep(r.pause)
	r.done = true
	return copy(p, r.answer), nil
}

// TestConfirmSlowly: the time a person takes to answer the prompt does not count against
// --timeout: a deploy confirmed after longer than it still runs, on a deadline of its own.
func TestConfirmSlowly(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	defer func(f func(any) bool) { isTerminal = f }(isTerminal)
	isTerminal = func(any) bool { return true }
	s := harness.StartValkey(t)
	app := New()
	var stdout, stderr strings.Builder
	app.Reader, app.Writer, app.ErrWriter = &slowReader{pause: 1500 * time.Millisecond, answer: "y\n"}, &stdout, &stderr
	code := runApp(context.Background(), app, append([]string{"rlfn", "--url", "redis://" + s.Addr, "--timeout", "1s", "deploy", "--verify-timeout", "500ms"}, acceptOurs...))
	if code != exitOK || !strings.Contains(stdout.String(), "Deployed ") {
		t.Errorf("confirmed after 1.5s with --timeout 1s: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
}

// TestClusterNodeDown is a partial cluster: a primary of a 3-primary cluster
// (full coverage not required, as in production) stops. Every command still accounts for
// it: status and diff show it unreachable and exit 1, deploy refuses it (3), and a forced
// deploy loads the others and exits 1 naming it NOT deployed, in the table and in JSON.
func TestClusterNodeDown(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	c := harness.StartCluster(t, 3, 0)
	set := testReleases(t)
	v100 := set[0]
	for _, p := range c.Primaries {
		vk := p.Client(t)
		if err := vk.Do(context.Background(), vk.B().ConfigSet().ParameterValue().ParameterValue("cluster-require-full-coverage", "no").Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	wantExit(t, rlfnAt(t, set, c.Primaries[0].Addr, "deploy", "--yes", "--to", v100.Version), exitOK, "first deploy")

	// The victim owns no part of the lock's slot: a forced deploy can still take the lock.
	var victim *harness.Server
	var live []*harness.Server
	for _, p := range c.Primaries {
		if victim == nil && !ownsKey(t, p, deployer.LockKey) {
			victim = p
			continue
		}
		live = append(live, p)
	}
	for _, p := range live {
		vk := p.Client(t)
		if err := vk.Do(context.Background(), vk.B().FunctionDelete().LibraryName(functions.Library).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	if err := victim.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	seed := live[0].Addr

	// At once (not answering) and once the cluster flags it (fail), the victim is a row.
	r := rlfnAt(t, set, seed, "status")
	wantExit(t, r, exitError, "status with a primary stopped")
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(victim.Addr) + ` +primary .* unreachable: `).MatchString(r.stdout) {
		t.Errorf("status does not show %s unreachable:\n%s", victim.Addr, r.stdout)
	}
	waitFlagged(t, live[0], victim, "fail")

	r = rlfnAt(t, set, seed, "status", "--json")
	wantExit(t, r, exitError, "status --json with a primary flagged fail")
	var rows []statusRow
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
		t.Fatalf("status --json: %v\n%s", err, r.stdout)
	}
	i := slices.IndexFunc(rows, func(row statusRow) bool { return row.Addr == victim.Addr })
	if len(rows) != 3 || i < 0 || rows[i].State != "unreachable" || !strings.Contains(rows[i].Error, "flagged fail") {
		t.Errorf("status --json = %+v, want 3 rows, %s unreachable: flagged fail", rows, victim.Addr)
	}
	if !strings.Contains(r.stderr, victim.Addr) || !strings.Contains(r.stderr, "unreachable") {
		t.Errorf("status stderr %q does not name %s unreachable", r.stderr, victim.Addr)
	}

	r = rlfnAt(t, set, seed, "diff", "--exit-code", "--to", v100.Version)
	wantExit(t, r, exitError, "diff --exit-code with a primary flagged fail")
	if strings.Contains(r.stdout, "every primary runs") || !strings.Contains(r.stdout, "Unreachable: 1 node ("+victim.Addr+")") {
		t.Errorf("diff does not account for %s:\n%s", victim.Addr, r.stdout)
	}

	r = rlfnAt(t, set, seed, "deploy", "--yes", "--to", v100.Version)
	wantExit(t, r, exitRefused, "deploy with a primary flagged fail")
	if !strings.Contains(r.stderr, victim.Addr+" is unreachable") {
		t.Errorf("refusal %q does not name %s", r.stderr, victim.Addr)
	}

	// Its dry run exits as the forced deploy will, or a CI check by dry run would pass.
	r = rlfnAt(t, set, seed, "deploy", "--dry-run", "--force", "--to", v100.Version)
	wantExit(t, r, exitError, "forced dry run with a primary flagged fail")
	if !strings.Contains(r.stderr, victim.Addr+") would be left out, NOT deployed") {
		t.Errorf("forced dry run does not name %s as left out: %q", victim.Addr, r.stderr)
	}

	r = rlfnAt(t, set, seed, "deploy", "--yes", "--force", "--to", v100.Version)
	wantExit(t, r, exitError, "forced deploy with a primary flagged fail")
	if !strings.Contains(r.stderr, "NOT deployed: "+victim.Addr) || strings.Contains(r.stdout, "Deployed "+v100.Version+" in") ||
		!regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(victim.Addr)+` +primary .* left-out: unreachable: flagged fail`).MatchString(r.stdout) {
		t.Errorf("forced deploy does not say %s is NOT deployed:\nstdout:\n%s\nstderr:\n%s", victim.Addr, r.stdout, r.stderr)
	}
	for _, p := range live {
		waitLibrary(t, p, v100.Code)
	}

	r = rlfnAt(t, set, seed, "deploy", "--yes", "--force", "--to", v100.Version, "--json")
	wantExit(t, r, exitError, "forced deploy --json with nothing left to load but a primary flagged fail")
	var dep deployJSON
	if err := json.Unmarshal([]byte(r.stdout), &dep); err != nil || dep.Report == nil {
		t.Fatalf("deploy --json: %v\n%s", err, r.stdout)
	}
	j := slices.IndexFunc(dep.Report.Nodes, func(n nodeResultJSON) bool { return n.Addr == victim.Addr })
	if j < 0 || dep.Report.Nodes[j].Outcome != "left-out" || !strings.Contains(dep.Error, "NOT deployed: "+victim.Addr) {
		t.Errorf("deploy --json = %+v, want %s left-out and an error naming it", dep, victim.Addr)
	}
}

// ownsKey reports whether a cluster primary serves key's slot (it does not answer MOVED).
func ownsKey(t *testing.T, s *harness.Server, key string) bool {
	t.Helper()
	vk := s.Client(t)
	err := vk.Do(context.Background(), vk.B().Exists().Key(key).Build()).Error()
	if err != nil && !strings.Contains(err.Error(), "MOVED") {
		t.Fatalf("%s: EXISTS: %v", s.Addr, err)
	}
	return err == nil
}

// waitFlagged waits up to 30s for seen's CLUSTER NODES to flag node with flag.
func waitFlagged(t *testing.T, seen, node *harness.Server, flag string) {
	t.Helper()
	vk := seen.Client(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		text, err := vk.Do(context.Background(), vk.B().ClusterNodes().Build()).ToString()
		for line := range strings.Lines(text) {
			if f := strings.Fields(line); err == nil && len(f) > 2 && strings.HasPrefix(f[1], node.Addr+"@") &&
				slices.Contains(strings.Split(f[2], ","), flag) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not flagged %s by %s after 30s (%v):\n%s", node.Addr, flag, seen.Addr, err, text)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestFullCoverage: status points out every cluster node that would answer CLUSTERDOWN to
// every call while one shard has no primary (cluster-require-full-coverage yes, the default),
// and every node that would not say (an ACL user without CONFIG): one warning line naming
// the nodes, on each node's row in JSON, and exit 4 until the setting is no or the warning is
// accepted. A standalone server has nothing to warn of.
func TestFullCoverage(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	set := testReleases(t)
	lua := []string{"--accept-warning", "lua-security"} // not full-coverage
	status := func(url string, args ...string) result {
		t.Helper()
		return rlfn(t, set, append(append([]string{"--url", url}, lua...), append([]string{"status"}, args...)...)...)
	}
	single := harness.StartValkey(t)
	wantExit(t, status("redis://"+single.Addr), exitOK, "status of a standalone server")

	c := harness.StartCluster(t, 3, 1)
	url := "redis://" + c.Primaries[0].Addr
	r := status(url)
	wantExit(t, r, exitWarnings, "status of a cluster with the default cluster-require-full-coverage")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if w := lines[len(lines)-1]; !strings.HasPrefix(w, "Warning: ") || strings.Count(w, "127.0.0.1:") != 6 ||
		!strings.Contains(w, ": cluster-require-full-coverage is yes: ") || !strings.HasSuffix(w, " [full-coverage]") {
		t.Errorf("status warning %q, want one line naming the six nodes", w)
	}
	if want := "rlfn: 1 warning not accepted (full-coverage): review, then pass --accept-warning full-coverage"; !strings.HasPrefix(r.stderr, want) {
		t.Errorf("status stderr %q, want %q...", r.stderr, want)
	}
	wantExit(t, rlfn(t, set, "--url", url, "--accept-warning", "lua-security,full-coverage", "status"), exitOK, "status accepting full-coverage")
	// deploy and diff are not about the service's availability: they do not ask.
	wantExit(t, rlfn(t, set, append([]string{"--url", url}, append(lua, "deploy", "--yes")...)...), exitOK, "deploy to a cluster with the default cluster-require-full-coverage")

	// Every node but one replica set as recommended: only that replica is named.
	left := c.Replicas[0]
	for _, s := range c.Nodes() {
		if s == left {
			continue
		}
		vk := s.Client(t)
		if err := vk.Do(context.Background(), vk.B().ConfigSet().ParameterValue().ParameterValue("cluster-require-full-coverage", "no").Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	r = status(url, "--json")
	wantExit(t, r, exitWarnings, "status --json with one replica left at yes")
	var rows []statusRow
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
		t.Fatalf("status --json: %v\n%s", err, r.stdout)
	}
	for _, row := range rows {
		var ids []string
		for _, w := range row.Warnings {
			ids = append(ids, w.ID)
		}
		if got, want := slices.Contains(ids, "full-coverage"), row.Addr == left.Addr; got != want {
			t.Errorf("status --json: %s warnings %v, want full-coverage %v", row.Addr, ids, want)
		}
	}
	vk := left.Client(t)
	if err := vk.Do(context.Background(), vk.B().ConfigSet().ParameterValue().ParameterValue("cluster-require-full-coverage", "no").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	wantExit(t, status(url), exitOK, "status with cluster-require-full-coverage no everywhere")

	// A deploy-only ACL user may not read settings: each node is warned of as unreadable,
	// never passed over.
	acl := append([]string{"deployer", "on", ">s3cret"}, deployer.ACLRules...)
	for _, s := range c.Nodes() {
		vk := s.Client(t)
		if err := vk.Do(context.Background(), vk.B().AclSetuser().Username(acl[0]).Rule(acl[1:]...).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	r = status("redis://deployer:s3cret@" + c.Primaries[0].Addr)
	wantExit(t, r, exitWarnings, "status as a user that cannot read CONFIG")
	if !regexp.MustCompile(`(?m)^Warning: (127\.0\.0\.1:\d+, ){5}127\.0\.0\.1:\d+: cluster-require-full-coverage could not be read \(CONFIG GET cluster-require-full-coverage: NOPERM .*\): if it is yes, the default, .* \[full-coverage\]$`).MatchString(r.stdout) {
		t.Errorf("status as a user that cannot read CONFIG does not warn of the six nodes:\n%s", r.stdout)
	}
}

// TestFailedOverPrimary: after a failover the dead ex-primary stays in every node's view,
// flagged fail with no slots: status exits 1 and every deploy is refused until it is
// restarted or forgotten. Both say so, with its ID: in the table, the JSON and stderr. Each
// remedy is then followed as written: restarted, it rejoins as a replica of its old shard
// and status exits 0; stopped again and forgotten by every other node, status exits 0
// without it.
func TestFailedOverPrimary(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	c := harness.StartCluster(t, 3, 1)
	set := testReleases(t)
	victim, promoted := c.Primaries[0], c.ReplicasOf(c.Primaries[0])[0]
	seed := c.Primaries[1]
	wantExit(t, rlfnAt(t, set, seed.Addr, "deploy", "--yes"), exitOK, "deploy")
	if err := victim.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFailedOver(t, seed, victim)

	remedy := "; it is a primary that owns no slots (most often one whose replica took over in a failover): restart it with its nodes.conf " +
		"and it rejoins (as a replica of its old shard after a failover), or if it is gone for good remove it with CLUSTER FORGET " +
		victim.NodeID + " on every other node within 60s (valkey-cli --cluster call " + seed.Addr + " CLUSTER FORGET " + victim.NodeID + ")"
	r := rlfnAt(t, set, seed.Addr, "status")
	wantExit(t, r, exitError, "status with a failed-over primary")
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(victim.Addr) + ` +primary +0 +- +unreachable: flagged fail by the cluster` + regexp.QuoteMeta(remedy) + `$`).MatchString(r.stdout) {
		t.Errorf("status does not say what to do with %s:\n%s", victim.Addr, r.stdout)
	}
	if want := "rlfn: " + victim.Addr + ": unreachable: flagged fail by the cluster" + remedy + "\n"; r.stderr != want {
		t.Errorf("status stderr\n%q, want\n%q", r.stderr, want)
	}
	r = rlfnAt(t, set, seed.Addr, "status", "--json")
	var rows []statusRow
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
		t.Fatalf("status --json: %v\n%s", err, r.stdout)
	}
	if i := slices.IndexFunc(rows, func(row statusRow) bool { return row.Addr == victim.Addr }); i < 0 || rows[i].Error != "flagged fail by the cluster"+remedy {
		t.Errorf("status --json = %+v, want %s's error to say what to do", rows, victim.Addr)
	}
	r = rlfnAt(t, set, seed.Addr, "deploy", "--yes", "--to", "1.0.0", "--force")
	wantExit(t, r, exitError, "forced deploy with a failed-over primary")
	if !strings.Contains(r.stdout, "unreachable: flagged fail by the cluster"+remedy) {
		t.Errorf("forced deploy does not say what to do with %s:\n%s", victim.Addr, r.stdout)
	}
	r = rlfnAt(t, set, seed.Addr, "deploy", "--yes")
	wantExit(t, r, exitRefused, "deploy with a failed-over primary")
	if !strings.Contains(r.stderr, victim.Addr+" is unreachable (flagged fail by the cluster"+remedy+")") {
		t.Errorf("deploy refusal %q does not say what to do with %s", r.stderr, victim.Addr)
	}

	// Restarted, it rejoins as a replica of the replica that took over.
	if err := victim.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, set, seed, exitOK)
	if row := statusOf(t, set, seed.Addr)[victim.Addr]; row.Role != "replica" || row.Primary != promoted.Addr {
		t.Errorf("restarted, %s is %+v, want a replica of %s", victim.Addr, row, promoted.Addr)
	}

	// Gone for good: stopped, then forgotten by every other node.
	if err := victim.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFlagged(t, seed, victim, "fail")
	r = rlfnAt(t, set, seed.Addr, "status")
	wantExit(t, r, exitError, "status with a replica flagged fail")
	if !strings.Contains(r.stderr, "; it is a replica: restart it with its nodes.conf and it rejoins, or if it is gone for good remove it with CLUSTER FORGET "+victim.NodeID) {
		t.Errorf("status stderr %q does not say what to do with the replica %s", r.stderr, victim.Addr)
	}
	for _, s := range c.Nodes() {
		if s == victim {
			continue
		}
		vk := s.Client(t)
		if err := vk.Do(context.Background(), vk.B().ClusterForget().NodeId(victim.NodeID).Build()).Error(); err != nil {
			t.Fatalf("CLUSTER FORGET on %s: %v", s.Addr, err)
		}
	}
	st := statusOf(t, set, seed.Addr)
	if _, ok := st[victim.Addr]; ok || len(st) != 5 {
		t.Errorf("status after CLUSTER FORGET on every node = %v, want the 5 others", st)
	}
}

// waitFailedOver waits up to 30s for seen's CLUSTER NODES to show node as a primary flagged
// fail that owns no slots: its replica has taken them over.
func waitFailedOver(t *testing.T, seen, node *harness.Server) {
	t.Helper()
	vk := seen.Client(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		text, err := vk.Do(context.Background(), vk.B().ClusterNodes().Build()).ToString()
		for line := range strings.Lines(text) {
			if f := strings.Fields(line); err == nil && len(f) == 8 && strings.HasPrefix(f[1], node.Addr+"@") && f[2] == "master,fail" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not a failed primary without slots in %s's view after 30s (%v):\n%s", node.Addr, seen.Addr, err, text)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitStatus waits up to 30s for status from seen to exit code (a restarted node takes a
// moment to be seen as live by every node).
func waitStatus(t *testing.T, set versions.Set, seen *harness.Server, code int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := rlfnAt(t, set, seen.Addr, "status")
		if r.code == code {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("status from %s: exit %d after 30s, want %d\n%s%s", seen.Addr, r.code, code, r.stdout, r.stderr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
