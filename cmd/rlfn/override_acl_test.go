package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/internal/override"
)

// writerACL is the rules of the overrides' writer as docs/overrides.md gives them (the line
// "ACL SETUSER overrides" and its indented continuations), the password made s3cret: the test
// runs what a reader copies, so the page cannot drift from what works.
func writerACL(t *testing.T) []string {
	t.Helper()
	page, err := os.ReadFile(filepath.Join("..", "..", "docs", "overrides.md"))
	if err != nil {
		t.Fatal(err)
	}
	var rules []string
	in := false
	for _, line := range strings.Split(string(page), "\n") {
		switch {
		case strings.HasPrefix(line, "ACL SETUSER overrides "):
			in = true
			rules = append(rules, strings.Fields(strings.TrimPrefix(line, "ACL SETUSER overrides "))...)
		case in && strings.HasPrefix(line, "    "):
			rules = append(rules, strings.Fields(line)...)
		case in:
			in = false
		}
	}
	i := slices.Index(rules, ">password")
	if i < 0 || !slices.Contains(rules, "+hset") {
		t.Fatalf("docs/overrides.md: no ACL SETUSER overrides with >password and +hset: %q", rules)
	}
	rules[i] = ">s3cret"
	return rules
}

// setUser makes (or remakes from nothing) user with rules on every node.
func setUser(t *testing.T, nodes []*harness.Server, user string, rules []string) {
	t.Helper()
	for _, n := range nodes {
		vk := n.Client(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := vk.Do(ctx, vk.B().AclSetuser().Username(user).Rule(append([]string{"reset"}, rules...)...).Build()).Error()
		cancel()
		if err != nil {
			t.Fatalf("ACL SETUSER %s %v: %v", user, rules, err)
		}
	}
}

// writerRun runs, as the writer, what an operator does with overrides: set one, read them,
// then apply a file that removes it and adds another (a transaction under WATCH). It stops
// at the first command that does not exit 0, and returns its result.
func writerRun(t *testing.T, url, file string) (string, result) {
	t.Helper()
	for _, args := range [][]string{
		{"override", "set", "token_bucket", "cust:8", "--capacity", "5", "--rate", "1", "--period", "1s"},
		{"override", "get", "token_bucket", "cust:8"},
		{"override", "list"},
		{"override", "diff", file},
		{"override", "apply", file, "--yes"},
		{"override", "remove", "token_bucket", "cust:9"},
	} {
		r := rlfn(t, nil, append([]string{"--url", url}, args...)...)
		if r.code != exitOK {
			return strings.Join(args[:2], " "), r
		}
	}
	return "", result{}
}

// TestOverrideWriterACL: the writer's user in docs/overrides.md runs every override command,
// on Valkey 8, Redis 7.0 and a cluster; without any one of its rules that a command sends
// (+unwatch is sent only when the store changed under an apply, +unlink only by a write of a
// new base, +exists only to an empty store, where a refusal is taken for no old layout, the
// cluster rules only to a cluster), the command exits 1 with the server's refusal naming the command.
func TestOverrideWriterACL(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	rules := writerACL(t)
	file := filepath.Join(t.TempDir(), "overrides.json")
	if err := os.WriteFile(file, []byte(`{"overrides": [{"algorithm": "token_bucket", "key": "cust:9", "limit": {"capacity": 5, "rate": 1, "period": "1s"}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, server := range standalones {
		t.Run(server.name, func(t *testing.T) {
			s := server.start(t)
			admin := s.Client(t)
			url := "redis://overrides:s3cret@" + s.Addr
			fresh := func() {
				t.Helper()
				if err := admin.Do(context.Background(), admin.B().Del().Key(override.HeadKey("rl:"), override.DeltaKey("rl:"), override.LogKey("rl:")).Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			setUser(t, []*harness.Server{s}, "overrides", rules)
			if cmd, r := writerRun(t, url, file); cmd != "" {
				t.Fatalf("the documented writer: %s: exit %d\n%s%s", cmd, r.code, r.stdout, r.stderr)
			}
			for _, drop := range []string{"+info", "+hgetall", "+hscan", "+hmget", "+hlen", "+hset", "+hincrby", "+xadd", "+xrange", "+multi", "+exec", "+watch"} {
				fresh()
				setUser(t, []*harness.Server{s}, "overrides", slices.DeleteFunc(slices.Clone(rules), func(r string) bool { return r == drop }))
				cmd, r := writerRun(t, url, file)
				want := "no permissions to run the '" + strings.TrimPrefix(drop, "+") + "' command"
				if cmd == "" || r.code != exitError || !strings.Contains(r.stderr, want) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
					t.Errorf("without %s: %s exit %d, stderr %q; want exit 1 and one line saying %q", drop, cmd, r.code, r.stderr, want)
				}
			}
		})
	}
	t.Run("cluster", func(t *testing.T) {
		c := harness.StartCluster(t, 3, 1)
		setUser(t, c.Nodes(), "overrides", rules)
		// From a node that does not hold the store's slot as well as from one that does.
		for _, p := range c.Primaries {
			if cmd, r := writerRun(t, "redis://overrides:s3cret@"+p.Addr, file); cmd != "" {
				t.Fatalf("the documented writer from %s: %s: exit %d\n%s%s", p.Addr, cmd, r.code, r.stdout, r.stderr)
			}
		}
	})
}
