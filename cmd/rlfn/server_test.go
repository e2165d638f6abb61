package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/versions"
)

// testReleases is the embedded 1.0.0 and 1.1.0, so that a test upgrades and rolls back between
// the two real releases whatever is released after them.
func testReleases(t *testing.T) versions.Set {
	t.Helper()
	var set versions.Set
	for _, v := range []string{"1.0.0", "1.1.0"} {
		r, ok := versions.Embedded().Find(v)
		if !ok {
			t.Fatalf("%s is not embedded", v)
		}
		set = append(set, r)
	}
	return set
}

// standalone is a Valkey primary with one replica, linked.
func standalone(t *testing.T, start func(testing.TB, ...string) *harness.Server) (primary, replica *harness.Server) {
	t.Helper()
	primary = start(t)
	replica = start(t, "--replicaof", "127.0.0.1", fmt.Sprint(primary.Port))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := primary.WaitReplicas(ctx, 1); err != nil {
		t.Fatal(err)
	}
	return primary, replica
}

// acceptOurs accepts the warnings every server of the tests' images earns (Valkey 8.0.1
// and Redis 7.0.15 both predate the Lua security fixes) and every harness cluster (which
// keeps the servers' cluster-require-full-coverage yes), so that a test's exit codes say
// what it tests; TestSecurityWarning and TestFullCoverage run without them and expect exit 4.
var acceptOurs = []string{"--accept-warning", "lua-security,full-coverage"}

// standalones are the standalone servers a test runs on, one of each kind.
var standalones = []struct {
	name  string
	start func(testing.TB, ...string) *harness.Server
}{{"valkey8", harness.StartValkey}, {"redis7.0", harness.StartRedis}}

// rlfnAt runs rlfn against the server at addr, with acceptOurs.
func rlfnAt(t *testing.T, set versions.Set, addr string, args ...string) result {
	t.Helper()
	return rlfn(t, set, append(append([]string{"--url", "redis://" + addr}, acceptOurs...), args...)...)
}

func statusOf(t *testing.T, set versions.Set, addr string) map[string]statusRow {
	t.Helper()
	r := rlfnAt(t, set, addr, "status", "--json")
	var rows []statusRow
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || r.code != 0 {
		t.Fatalf("status --json: exit %d, %v\nstdout %s\nstderr %s", r.code, err, r.stdout, r.stderr)
	}
	out := map[string]statusRow{}
	for _, row := range rows {
		out[row.Addr] = row
	}
	return out
}

func wantExit(t *testing.T, r result, code int, what string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("%s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", what, r.code, code, r.stdout, r.stderr)
	}
}

// TestLifecycle walks a newcomer's path on a primary and its replica, on Valkey 8 and Redis
// 7.0: status, diff, deploy, call, upgrade, rollback, drift; every exit code along the way.
func TestLifecycle(t *testing.T) {
	for _, server := range standalones {
		t.Run(server.name, func(t *testing.T) {
			t.Setenv("NO_COLOR", "1")
			set := testReleases(t)
			primary, replica := standalone(t, server.start)
			addr := primary.Addr

			st := statusOf(t, set, addr)
			if len(st) != 2 || st[addr].Role != "primary" || st[addr].State != "absent" ||
				st[replica.Addr].Role != "replica" || st[replica.Addr].State != "absent" {
				t.Fatalf("status of a fresh primary and replica = %+v", st)
			}

			r := rlfnAt(t, set, addr, "diff", "--exit-code")
			wantExit(t, r, exitPending, "diff --exit-code before the first deploy")
			if !strings.Contains(r.stdout, "absent: load 1.1.0") {
				t.Errorf("diff does not show the load:\n%s", r.stdout)
			}

			// Nobody to ask: no deploy without --yes.
			r = rlfnAt(t, set, addr, "deploy")
			wantExit(t, r, exitError, "deploy without --yes or a terminal")
			if !strings.Contains(r.stderr, "no terminal") {
				t.Errorf("stderr %q does not say why", r.stderr)
			}
			wantExit(t, rlfnAt(t, set, addr, "deploy", "--dry-run"), exitOK, "deploy --dry-run")
			if s := statusOf(t, set, addr)[addr].State; s != "absent" {
				t.Fatalf("after a refused deploy and a dry run the primary is %s, want absent", s)
			}

			r = rlfnAt(t, set, addr, "deploy", "--yes", "--to", "1.0.0", "--json")
			wantExit(t, r, exitOK, "first deploy")
			var dep deployJSON
			if err := json.Unmarshal([]byte(r.stdout), &dep); err != nil || dep.Report == nil {
				t.Fatalf("deploy --json: %v\n%s", err, r.stdout)
			}
			outcomes := map[string]string{}
			for _, n := range dep.Report.Nodes {
				outcomes[n.Addr] = n.Outcome
			}
			if outcomes[addr] != "loaded" || outcomes[replica.Addr] != "replicated" {
				t.Errorf("deploy outcomes %v, want the primary loaded and the replica replicated", outcomes)
			}
			wantVersion(t, primary, replica, "1.0.0")

			// call composes the key as the client does: the client sees what the CLI spent.
			limit := client.TokenBucket{Capacity: 3, Rate: 1, Period: time.Hour}
			r = rlfnAt(t, set, addr, "call", "token_bucket", "user:42", "--capacity", "3", "--rate", "1", "--period", "1h", "--repeat", "4", "--json")
			wantExit(t, r, exitOK, "call --repeat 4")
			var calls []callJSON
			for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
				var c callJSON
				if err := json.Unmarshal([]byte(line), &c); err != nil {
					t.Fatalf("call --json line %q: %v", line, err)
				}
				calls = append(calls, c)
			}
			if len(calls) != 4 || !calls[2].Allowed || calls[3].Allowed || calls[3].Remaining != 0 ||
				calls[3].Key != "rl:{user:42}:token_bucket" || calls[3].RetryAfterMs <= 0 {
				t.Fatalf("call --repeat 4 on a bucket of 3 = %+v", calls)
			}
			lim := harness.NewLimiter(t, primary.Client(t), client.Options{Deadline: 5 * time.Second})
			if res, err := lim.Peek(context.Background(), "user:42", limit); err != nil || res.Allowed || res.Remaining != 0 {
				t.Fatalf("the client's Peek after the CLI's calls = %+v, %v; want the bucket empty", res, err)
			}
			// A cost above the capacity: retry_after_ms is -1 in JSON, as in the library's reply.
			r = rlfnAt(t, set, addr, "call", "token_bucket", "user:42", "--capacity", "3", "--rate", "1", "--period", "1h", "--cost", "4", "--peek", "--json")
			if wantExit(t, r, exitOK, "call --cost 4"); !strings.Contains(r.stdout, `"retry_after_ms":-1`) {
				t.Errorf("call --cost 4 --json = %s, want retry_after_ms -1", r.stdout)
			}

			// Upgrade: the library changes, the limiter's state does not.
			wantExit(t, rlfnAt(t, set, addr, "diff", "--exit-code"), exitPending, "diff before the upgrade")
			wantExit(t, rlfnAt(t, set, addr, "deploy", "--yes"), exitOK, "upgrade")
			wantVersion(t, primary, replica, "1.1.0")
			wantExit(t, rlfnAt(t, set, addr, "diff", "--exit-code"), exitOK, "diff after the upgrade")
			if res, err := lim.Peek(context.Background(), "user:42", limit); err != nil || res.Remaining != 0 {
				t.Fatalf("after the upgrade the bucket is %+v, %v; want it still empty", res, err)
			}

			// Rollback is a downgrade: refused until --force.
			r = rlfnAt(t, set, addr, "deploy", "--yes", "--to", "1.0.0")
			wantExit(t, r, exitRefused, "rollback without --force")
			if !strings.Contains(r.stderr, addr) || !strings.Contains(r.stderr, "downgrade") || !strings.HasSuffix(strings.TrimSpace(r.stderr), "(use --force)") {
				t.Errorf("refusal %q does not name the node and the cause, and end with how to force", r.stderr)
			}
			wantVersion(t, primary, replica, "1.1.0")
			wantExit(t, rlfnAt(t, set, addr, "deploy", "--yes", "--to", "1.0.0", "--force"), exitOK, "rollback")
			wantVersion(t, primary, replica, "1.0.0")

			// Drift: code that matches no release is never overwritten silently.
			hotfix := strings.Replace(functions.Source, "-- ", "--  ", 1)
			vk := primary.Client(t)
			if err := vk.Do(context.Background(), vk.B().FunctionLoad().Replace().FunctionCode(hotfix).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			if s := statusOf(t, set, addr)[addr]; s.State != "drifted" || s.Declared == "" {
				t.Errorf("status after a hand-made load = %+v, want drifted with its declared version", s)
			}
			// A refusal comes before the question and the dry run: a script learns of it either way.
			wantExit(t, rlfnAt(t, set, addr, "deploy", "--dry-run"), exitRefused, "deploy --dry-run over drift")
			wantExit(t, rlfnAt(t, set, addr, "deploy"), exitRefused, "deploy over drift without --yes")
			r = rlfnAt(t, set, addr, "deploy", "--yes")
			wantExit(t, r, exitRefused, "deploy over drift")
			if lines := strings.Split(strings.TrimSpace(r.stderr), "\n"); len(lines) != 1 || !strings.Contains(r.stderr, addr) {
				t.Errorf("refusal is not one line naming the node: %q", r.stderr)
			}
			wantCode(t, primary, hotfix)
			wantExit(t, rlfnAt(t, set, addr, "deploy", "--yes", "--force"), exitOK, "deploy over drift, forced")
			wantVersion(t, primary, replica, "1.1.0")
		})
	}
}

// wantVersion checks what rl_version answers on the primary and, read-only, on the replica.
func wantVersion(t *testing.T, primary, replica *harness.Server, want string) {
	t.Helper()
	for _, s := range []*harness.Server{primary, replica} {
		c := s.Client(t)
		got, err := c.Do(context.Background(), c.B().FcallRo().Function("rl_version").Numkeys(0).Build()).ToString()
		if err != nil || got != want {
			t.Fatalf("rl_version on %s = %q, %v; want %s", s.Addr, got, err, want)
		}
	}
}

func wantCode(t *testing.T, s *harness.Server, want string) {
	t.Helper()
	got, err := harness.LibraryCode(context.Background(), s.Client(t), functions.Library)
	if err != nil || got != want {
		t.Fatalf("%s runs other code than expected (%v)", s.Addr, err)
	}
}

// TestUnsupportedServer: a server that answers but has no FUNCTION command (renamed away, as a
// managed service or a server before Redis 7.0 would have it) is unsupported, never
// unreachable, and never "nothing to do": status and diff exit 1 without diffing the library
// against nothing, and deploy, forced or not, exits 1 saying what rlfn needs.
func TestUnsupportedServer(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	set := testReleases(t)
	s := harness.StartValkey(t, "--rename-command", "FUNCTION", "")
	addr := s.Addr

	r := rlfnAt(t, set, addr, "status", "--json")
	wantExit(t, r, exitError, "status of a server without FUNCTION")
	var rows []statusRow
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || len(rows) != 1 {
		t.Fatalf("status --json: %v\n%s", err, r.stdout)
	}
	if rows[0].State != "unsupported" || !strings.Contains(rows[0].Error, "FUNCTION is not a command") {
		t.Errorf("status --json = %+v, want unsupported: FUNCTION is not a command", rows[0])
	}
	if !strings.Contains(r.stderr, addr+": unsupported: ") {
		t.Errorf("status stderr %q does not name the node unsupported", r.stderr)
	}

	r = rlfnAt(t, set, addr, "diff", "--exit-code")
	wantExit(t, r, exitError, "diff --exit-code against a server without FUNCTION")
	if strings.Contains(r.stdout, "+++") || !strings.Contains(r.stdout, "Unsupported: 1 node ("+addr+")") {
		t.Errorf("diff against a server without FUNCTION:\n%s", r.stdout)
	}

	for _, args := range [][]string{{"deploy", "--yes"}, {"deploy", "--yes", "--force"}} {
		r = rlfnAt(t, set, addr, args...)
		wantExit(t, r, exitError, strings.Join(args, " ")+" to a server without FUNCTION")
		if !strings.Contains(r.stderr, addr+" cannot run Functions: FUNCTION is not a command") ||
			!strings.Contains(r.stderr, "rlfn needs Redis 7.0 or later, or Valkey 7.2 or later") {
			t.Errorf("%v: stderr %q does not say what is missing and what is needed", args, r.stderr)
		}
	}
}

// TestSecurityWarning: Valkey 8.0.1 and Redis 7.0.15 lack the Lua security fixes of October
// 2025 (Valkey 7.2.11, 8.0.6, 8.1.4; Redis 7.2.11, 7.4.6, 8.0.4, 8.2.2): every command that
// reads the node says so in the table and in JSON, with the warning's ID, and exits 4 after
// doing all it says (deploy deploys); --accept-warning or $RLFN_ACCEPT_WARNINGS naming the ID
// makes it 0, still printing the warning; an unknown ID is refused before any dial.
func TestSecurityWarning(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	set := testReleases(t)
	for _, server := range []struct {
		name, product string
		start         func(testing.TB, ...string) *harness.Server
	}{{"valkey8", "Valkey 8.0", harness.StartValkey}, {"redis7.0", "Redis 7.0", harness.StartRedis}} {
		t.Run(server.name, func(t *testing.T) {
			s := server.start(t)
			url := "redis://" + s.Addr
			warning := "Warning: " + s.Addr + ": " + server.product
			strict := func(args ...string) result { return rlfn(t, set, append([]string{"--url", url}, args...)...) }
			wantWarned := func(r result, code int, what string) {
				t.Helper()
				wantExit(t, r, code, what)
				if !strings.Contains(r.stdout, "lacks known Lua security fixes") || !strings.Contains(r.stdout, "lua-security") {
					t.Errorf("%s does not print the warning and its ID:\n%s", what, r.stdout)
				}
				if code == exitWarnings && !strings.Contains(r.stderr, "--accept-warning lua-security") {
					t.Errorf("%s: stderr %q does not say how to accept the warning", what, r.stderr)
				}
			}

			r := strict("status")
			if wantWarned(r, exitWarnings, "status"); !strings.Contains(r.stdout, warning) || !strings.HasSuffix(strings.TrimSpace(r.stdout), "[lua-security]") {
				t.Errorf("status does not warn under its table:\n%s", r.stdout)
			}
			r = strict("status", "--json")
			wantWarned(r, exitWarnings, "status --json")
			var rows []statusRow
			if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || len(rows) != 1 || len(rows[0].Warnings) != 1 ||
				rows[0].Warnings[0].ID != "lua-security" || !strings.HasPrefix(rows[0].Warnings[0].Text, server.product) {
				t.Errorf("status --json: %v, warnings %+v", err, rows)
			}
			wantWarned(strict("diff", "--json"), exitWarnings, "diff --json")
			wantWarned(strict("deploy", "--yes", "--dry-run"), exitWarnings, "deploy --dry-run")

			// Accepted, by flag or environment: still printed, exit 0.
			wantWarned(strict("--accept-warning", "lua-security", "status"), exitOK, "status --accept-warning lua-security")
			wantWarned(strict("status", "--accept-warning", "lock-release,lua-security"), exitOK, "status --accept-warning after the command, two IDs")
			t.Setenv("RLFN_ACCEPT_WARNINGS", "lua-security")
			wantWarned(strict("status"), exitOK, "status with RLFN_ACCEPT_WARNINGS")
			// The flag adds to the job's list, it does not replace it: a step that accepts
			// one more warning must not take back the ones the job accepted.
			wantWarned(strict("status", "--accept-warning", "lock-release"), exitOK, "status with RLFN_ACCEPT_WARNINGS and --accept-warning of another ID")
			t.Setenv("RLFN_ACCEPT_WARNINGS", "")
			// Another warning's ID accepts nothing here.
			wantWarned(strict("--accept-warning", "replica-lagging", "status"), exitWarnings, "status accepting another warning")

			// A deploy with a warning deploys, then exits 4: done, with something to review.
			r = strict("deploy", "--yes")
			if wantWarned(r, exitWarnings, "deploy"); !strings.Contains(r.stdout, "Deployed "+set.Latest().Version) {
				t.Errorf("deploy did not deploy:\n%s", r.stdout)
			}
			if row := statusOf(t, set, s.Addr)[s.Addr]; row.State != "current" {
				t.Errorf("after the deploy that exited 4: %+v, want current", row)
			}
			wantWarned(strict("diff", "--exit-code"), exitWarnings, "diff --exit-code of a current node")
			wantWarned(strict("diff", "--exit-code", "--accept-warning", "lua-security"), exitOK, "diff --exit-code accepted")
			r = strict("deploy", "--yes", "--json")
			wantWarned(r, exitWarnings, "deploy --json with nothing to do")
			var out deployJSON
			if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Error != "" || len(out.Warnings) != 1 || out.Warnings[0].ID != "lua-security" {
				t.Errorf("deploy --json: %v, error %q, warnings %+v: want the warning and no error", err, out.Error, out.Warnings)
			}

			// A typo accepts nothing and is refused before any dial.
			r = rlfn(t, set, "--url", "redis://127.0.0.1:1", "--accept-warning", "lua-securty", "status")
			if r.code != exitError || !strings.Contains(r.stderr, `--accept-warning "lua-securty" (the flag or $RLFN_ACCEPT_WARNINGS): no such warning; there are lua-security`) {
				t.Errorf("a misspelt ID: exit %d, stderr %q", r.code, r.stderr)
			}
		})
	}
}

// TestLaggingReplica: a replica whose replication is held (CLIENT PAUSE WRITE on it) keeps
// 1.0.0 while its primary runs 1.1.0, loaded by hand. A deploy of 1.1.0 has nothing to load,
// and it used to exit 0 with a warning; now status and diff warn (replica-lagging, exit 4;
// diff --exit-code 2), and deploy waits --verify-timeout for the replica, then exits 1
// naming it NOT deployed (lagging) in the table and in JSON. Released, it catches up and the
// same deploy exits 0.
func TestLaggingReplica(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	set := testReleases(t)
	v100, v110 := set[0], set[1]
	primary, replica := standalone(t, harness.StartValkey)
	wantExit(t, rlfnAt(t, set, primary.Addr, "deploy", "--yes", "--to", v100.Version), exitOK, "deploy 1.0.0")
	waitLibrary(t, replica, v100.Code)

	ctx := context.Background()
	rc := replica.Client(t)
	if err := rc.Do(ctx, rc.B().ClientPause().Timeout(60000).Write().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Do(context.Background(), rc.B().ClientUnpause().Build()) })
	pc := primary.Client(t)

	// Its primary's library deleted by hand: the primary is behind the newest release, so
	// a deploy would load it, and status must still say that the replica does not follow it.
	if err := pc.Do(ctx, pc.B().FunctionDelete().LibraryName("ratelimit").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	r := rlfnAt(t, set, primary.Addr, "status")
	if wantExit(t, r, exitWarnings, "status with a replica that does not follow a primary behind the release"); !strings.Contains(r.stdout,
		"Warning: "+replica.Addr+": replica runs 1.0.0 while its primary "+primary.Addr+" runs no library: is its replication broken?") {
		t.Errorf("status does not warn of the replica that does not follow its primary:\n%s%s", r.stdout, r.stderr)
	}

	if err := pc.Do(ctx, pc.B().FunctionLoad().Replace().FunctionCode(v110.Code).Build()).Error(); err != nil {
		t.Fatal(err)
	}

	r = rlfnAt(t, set, primary.Addr, "status")
	if wantExit(t, r, exitWarnings, "status with a lagging replica"); !strings.Contains(r.stdout, "Warning: "+replica.Addr+": replica runs 1.0.0 while its primary "+primary.Addr+" runs 1.1.0") ||
		!strings.Contains(r.stderr, "--accept-warning replica-lagging") {
		t.Errorf("status does not warn of the lagging replica:\n%s%s", r.stdout, r.stderr)
	}
	wantExit(t, rlfnAt(t, set, primary.Addr, "diff", "--exit-code"), exitPending, "diff --exit-code with a lagging replica")

	r = rlfnAt(t, set, primary.Addr, "deploy", "--yes", "--verify-timeout", "500ms")
	wantExit(t, r, exitError, "deploy with a lagging replica")
	if !strings.Contains(r.stdout, "lagging: runs 1.0.0, not 1.1.0") || !strings.Contains(r.stdout, "ATTENTION: deploy of 1.1.0 incomplete") ||
		!strings.Contains(r.stdout, replica.Addr+" (lagging replica)") || !strings.Contains(r.stderr, "NOT deployed: "+replica.Addr) {
		t.Errorf("deploy does not name the lagging replica NOT deployed:\n%s%s", r.stdout, r.stderr)
	}
	r = rlfnAt(t, set, primary.Addr, "deploy", "--yes", "--verify-timeout", "500ms", "--json")
	wantExit(t, r, exitError, "deploy --json with a lagging replica")
	var out deployJSON
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Report == nil || out.Error == "" {
		t.Fatalf("deploy --json: %v\n%s", err, r.stdout)
	}
	for _, n := range out.Report.Nodes {
		if want := map[string]string{primary.Addr: "unchanged", replica.Addr: "lagging"}[n.Addr]; n.Outcome != want {
			t.Errorf("deploy --json: %s %s, want %s", n.Addr, n.Outcome, want)
		}
	}

	if err := rc.Do(ctx, rc.B().ClientUnpause().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	wantExit(t, rlfnAt(t, set, primary.Addr, "deploy", "--yes"), exitOK, "deploy once the replica caught up")

	// Held again for 3s, long enough to be planned lagging: the deploy waits for it, it
	// catches up, and the report says so, in the table and in JSON.
	for _, asJSON := range []bool{false, true} {
		if err := pc.Do(ctx, pc.B().FunctionLoad().Replace().FunctionCode(v100.Code).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		waitLibrary(t, replica, v100.Code)
		if err := rc.Do(ctx, rc.B().ClientPause().Timeout(3000).Write().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if err := pc.Do(ctx, pc.B().FunctionLoad().Replace().FunctionCode(v110.Code).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		args := []string{"deploy", "--yes", "--accept-warning", "replica-lagging"}
		if asJSON {
			args = append(args, "--json")
		}
		r = rlfnAt(t, set, primary.Addr, args...)
		wantExit(t, r, exitOK, "deploy with a replica that catches up")
		if !asJSON {
			if !strings.Contains(r.stdout, "[replica-lagging]") || !regexp.MustCompile(regexp.QuoteMeta(replica.Addr)+` +replica .* replicated`).MatchString(r.stdout) ||
				!strings.Contains(r.stdout, "Deployed 1.1.0") {
				t.Errorf("deploy does not report the replica that caught up:\n%s%s", r.stdout, r.stderr)
			}
			continue
		}
		var out deployJSON
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Report == nil {
			t.Fatalf("deploy --json with a replica that catches up: %v, no report\n%s", err, r.stdout)
		}
		for _, n := range out.Report.Nodes {
			if want := map[string]string{primary.Addr: "unchanged", replica.Addr: "replicated"}[n.Addr]; n.Outcome != want {
				t.Errorf("deploy --json: %s %s, want %s", n.Addr, n.Outcome, want)
			}
		}
	}
}

// TestLockReleaseWarning: a deploy whose user may not DEL cannot release its lock: it is
// done (the lease runs out by itself), but says so, as a lock-release warning in the report,
// in JSON and in the exit code (4) until accepted.
func TestLockReleaseWarning(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	set := testReleases(t)
	s := harness.StartValkey(t)
	c := s.Client(t)
	var rules []string
	for _, r := range deployer.ACLRules {
		if r != "+del" {
			rules = append(rules, r)
		}
	}
	if err := c.Do(context.Background(), c.B().AclSetuser().Username("nodel").Rule(append([]string{"on", ">s3cret"}, rules...)...).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) result {
		return rlfn(t, set, append(append([]string{"--url", "redis://nodel:s3cret@" + s.Addr}, acceptOurs...), args...)...)
	}
	r := run("deploy", "--yes", "--to", "1.0.0")
	wantExit(t, r, exitWarnings, "deploy that could not release its lock")
	if !strings.Contains(r.stdout, "Deployed 1.0.0") || !strings.Contains(r.stdout, "[lock-release]") || !strings.Contains(r.stderr, "(lock-release)") {
		t.Errorf("deploy does not warn of its lock:\n%s%s", r.stdout, r.stderr)
	}
	// The lock's lease (30s) is still running: the next deploy waits for nothing, it has
	// nothing to load. A deploy with loads would find the lock held, so the key goes.
	if err := c.Do(context.Background(), c.B().Del().Key(deployer.LockKey).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	r = run("--accept-warning", "lock-release", "deploy", "--yes", "--to", "1.1.0", "--json")
	wantExit(t, r, exitOK, "deploy --json that could not release its lock, the warning accepted")
	var out deployJSON
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Report == nil {
		t.Fatalf("deploy --json: %v\n%s", err, r.stdout)
	}
	if len(out.Report.Warnings) != 1 || out.Report.Warnings[0].ID != deployer.WarnLockRelease {
		t.Errorf("deploy --json report warnings %+v, want one lock-release", out.Report.Warnings)
	}
}

// TestHostileServer: a server's text reaches every table Go-quoted, never as the terminal's
// commands nor as a broken row, and --json keeps its exact bytes. A real Valkey supplies it:
// a replica announces an address holding escape sequences (replica-announce-ip, which its
// primary lists as is and which no dial can reach: its error quotes the address again), and
// the primary runs drifted code holding them (the diff shows that code).
func TestHostileServer(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	const evil = "evil\x1b[31mRED\x1b]0;owned\x07"
	set := testReleases(t)
	primary := harness.StartValkey(t)
	harness.StartValkey(t, "--replicaof", "127.0.0.1", fmt.Sprint(primary.Port), "--replica-announce-ip", evil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := primary.WaitReplicas(ctx, 1); err != nil {
		t.Fatal(err)
	}
	code := "#!lua name=ratelimit\nlocal VERSION = '1.0.0'\n-- \x1b[2J\x1b]0;owned\x07\nredis.register_function('rl_version', function() return VERSION end)\n"
	vk := primary.Client(t)
	if err := vk.Do(ctx, vk.B().FunctionLoad().Replace().FunctionCode(code).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	quiet := func(what string, r result) {
		t.Helper()
		for _, out := range []string{r.stdout, r.stderr} {
			for _, c := range out {
				if c < ' ' && c != '\n' && c != '\t' || c == 0x7f {
					t.Errorf("%s: control character %q reaches the terminal:\n%s%s", what, c, r.stdout, r.stderr)
					return
				}
			}
		}
		if !strings.Contains(r.stdout+r.stderr, `"evil\x1b[31mRED\x1b]0;owned\a`) {
			t.Errorf("%s: the replica's address is not shown Go-quoted:\n%s%s", what, r.stdout, r.stderr)
		}
	}
	r := rlfnAt(t, set, primary.Addr, "status")
	wantExit(t, r, exitError, "status with an unreachable replica")
	quiet("status", r)
	r = rlfnAt(t, set, primary.Addr, "diff")
	wantExit(t, r, exitError, "diff with an unreachable replica")
	quiet("diff", r)
	if !strings.Contains(r.stdout, `-"-- \x1b[2J\x1b]0;owned\a"`) {
		t.Errorf("diff does not show the drifted line Go-quoted:\n%s", r.stdout)
	}
	r = rlfnAt(t, set, primary.Addr, "deploy", "--yes")
	wantExit(t, r, exitRefused, "deploy over drift, with an unreachable replica")
	quiet("deploy", r)
	r = rlfnAt(t, set, primary.Addr, "deploy", "--yes", "--force")
	wantExit(t, r, exitError, "forced deploy leaving the replica out")
	quiet("deploy --force", r)
	if !strings.Contains(r.stdout, "left-out") {
		t.Errorf("forced deploy: no report of the replica left out:\n%s", r.stdout)
	}

	// JSON keeps the exact bytes: the row's address is the one announced.
	r = rlfnAt(t, set, primary.Addr, "status", "--json")
	var rows []statusRow
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
		t.Fatalf("status --json: %v\n%s", err, r.stdout)
	}
	found := false
	for _, row := range rows {
		found = found || strings.HasPrefix(row.Addr, evil+":")
	}
	if !found {
		t.Errorf("status --json has no row for %q: %+v", evil, rows)
	}
}

// TestPrimaryDown: pointed at a replica whose primary is down (here: a master_host nothing
// listens on), status lists the primary unreachable beside the replica and exits 1, rather
// than failing with no table; deploy is refused for it; a --peek is answered by the replica,
// which needs no primary; a call that writes names the primary it could not reach.
func TestPrimaryDown(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	set := testReleases(t)
	s := harness.StartValkey(t, "--replicaof", "127.0.0.1", "1", "--replica-read-only", "no")
	vk := s.Client(t)
	if err := vk.Do(t.Context(), vk.B().FunctionLoad().FunctionCode(set.Latest().Code).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	const primary = "127.0.0.1:1"

	r := rlfnAt(t, set, s.Addr, "status", "--json")
	wantExit(t, r, exitError, "status of a replica whose primary is down")
	var rows []statusRow
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || len(rows) != 2 {
		t.Fatalf("status --json: %v\n%s", err, r.stdout)
	}
	if rows[0].Addr != primary || rows[0].State != "unreachable" || rows[1].Addr != s.Addr || rows[1].State != "current" || rows[1].Primary != primary {
		t.Errorf("status --json = %+v, want %s unreachable and %s current, its replica", rows, primary, s.Addr)
	}
	if !strings.Contains(r.stderr, primary+": unreachable: ") {
		t.Errorf("status stderr %q does not name the primary unreachable", r.stderr)
	}

	r = rlfnAt(t, set, s.Addr, "deploy", "--yes", "--to", "1.0.0", "--force")
	wantExit(t, r, exitError, "forced deploy with the primary down")
	if !strings.Contains(r.stderr, "NOT deployed: "+primary) {
		t.Errorf("forced deploy: stderr %q does not name %s NOT deployed", r.stderr, primary)
	}

	bucket := []string{"token_bucket", "user:1", "--capacity", "5", "--rate", "1", "--period", "1h"}
	wantCalls(t, "a peek through the replica", calls(t, s.Addr, append(bucket, "--peek")...), [3]int64{1, 5, 0})
	r = rlfnAt(t, set, s.Addr, append([]string{"call"}, bucket...)...)
	wantExit(t, r, exitError, "a call that writes, with the primary down")
	if !strings.Contains(r.stderr, primary+" (the primary of "+s.Addr+", where the call writes)") {
		t.Errorf("call: stderr %q does not name the primary it could not reach", r.stderr)
	}
}

// TestInjectedReplicaAddress: a replica's announced address (replica-announce-ip) holding
// line breaks writes lines of its own into its primary's INFO replication: here "role:slave"
// and a master_host, which made rlfn take the primary for a replica of a decoy server, and
// deploy there (with the URL's credentials) instead of to the deployment. Such a reply is
// refused, naming the node, and nothing is deployed anywhere.
func TestInjectedReplicaAddress(t *testing.T) {
	set := testReleases(t)
	primary, replica := standalone(t, harness.StartValkey)
	decoy := harness.StartValkey(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	vk := replica.Client(t)
	evil := fmt.Sprintf("127.0.0.1,port=%d\r\nrole:slave\r\nmaster_host:127.0.0.1\r\nmaster_port:%d\r\nx", decoy.Port, decoy.Port)
	for _, cmd := range []valkey.Completed{
		vk.B().ConfigSet().ParameterValue().ParameterValue("replica-announce-ip", evil).Build(),
		vk.B().Arbitrary("REPLICAOF", "NO", "ONE").Build(),
		vk.B().Arbitrary("REPLICAOF", "127.0.0.1", fmt.Sprint(primary.Port)).Build(),
	} {
		if err := vk.Do(ctx, cmd).Error(); err != nil {
			t.Fatal(err)
		}
	}
	pc := primary.Client(t)
	for {
		info, err := harness.Info(ctx, pc, "replication")
		if err != nil {
			t.Fatal(err)
		}
		if info["master_host"] != "" {
			break // the injected lines are in
		}
		time.Sleep(20 * time.Millisecond)
	}

	for _, cmd := range [][]string{{"status"}, {"deploy", "--yes"}} {
		r := rlfnAt(t, set, primary.Addr, cmd...)
		wantExit(t, r, exitError, strings.Join(cmd, " ")+" with a replica's address injecting lines")
		if !strings.Contains(r.stderr, "holds role twice") || !strings.Contains(r.stderr, primary.Addr) {
			t.Errorf("%v: stderr %q, want the reply refused, naming %s", cmd, r.stderr, primary.Addr)
		}
	}
	for _, s := range []*harness.Server{primary, decoy} {
		if code, err := harness.LibraryCode(ctx, s.Client(t), functions.Library); err != nil || code != "" {
			t.Errorf("%s runs a library (%v): nothing was to be deployed", s.Addr, err)
		}
	}
}

// TestClusterWithoutSlots: a cluster still being set up (a node with cluster mode on and no
// slot assigned) has no node to hold the deploy's lock: deploy says so, and what to do, and
// changes nothing.
func TestClusterWithoutSlots(t *testing.T) {
	set := testReleases(t)
	s := harness.StartValkey(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes-alone.conf")
	r := rlfnAt(t, set, s.Addr, "deploy", "--yes")
	wantExit(t, r, exitError, "deploy to a cluster without slots")
	if !strings.Contains(r.stderr, "no primary serves its slot") || !strings.Contains(r.stderr, "Assign every slot first") {
		t.Errorf("deploy to a cluster without slots: stderr %q, want the lock's slot unserved and what to do", r.stderr)
	}
	if code, err := harness.LibraryCode(t.Context(), s.Client(t), functions.Library); err != nil || code != "" {
		t.Errorf("the node runs a library (%v) after a deploy that could not take its lock", err)
	}
}
