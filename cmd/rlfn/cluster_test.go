package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/integration_test/harness"
	"github.com/rlfn/rlfn/versions"
)

// TestCluster finds every node of a 3-shard cluster from one of its replicas, deploys to
// every primary and calls principals that land on every shard.
func TestCluster(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	c := harness.StartCluster(t, 3, 1)
	seed := c.Replicas[0].Addr
	set := versions.Embedded()

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

	r := rlfnAt(t, set, seed, "deploy", "--yes")
	wantExit(t, r, exitOK, "deploy to the cluster")
	for _, row := range statusOf(t, set, seed) {
		if row.State != "current" || row.Version != set.Latest().Version {
			t.Errorf("after the deploy %s is %s %q", row.Addr, row.State, row.Version)
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
	wantExit(t, rlfnAt(t, set, seed, "diff", "--exit-code"), exitOK, "diff after the deploy")
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
		return rlfn(t, set, append([]string{"--url", url, "--tls-ca", caFile}, args...)...)
	}

	// Without the CA the certificate is not trusted: one line, naming the node.
	r := rlfn(t, set, "--url", url, "status")
	if r.code != exitError || !strings.Contains(r.stderr, s.Addr) || !strings.Contains(r.stderr, "certificate") {
		t.Errorf("status without --tls-ca: exit %d, stderr %q", r.code, r.stderr)
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
		code := runApp(context.Background(), app, []string{"rlfn", "--url", "redis://" + s.Addr, "deploy"})
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
