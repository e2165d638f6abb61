package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go/mock"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/versions"
)

// A cluster in every state, with short code so the golden diffs stay readable. The plan and
// the status rows come from the deployer's own NewPlan, so the golden files show its reasons.
var (
	code100 = "#!lua name=ratelimit\nlocal VERSION = '1.0.0'\nlocal a = 1\nlocal b = 2\nlocal c = 3\n"
	code110 = "#!lua name=ratelimit\nlocal VERSION = '1.1.0'\nlocal a = 1\nlocal b = 20\nlocal c = 3\nlocal d = 4\n"
	drifted = "#!lua name=ratelimit\nlocal VERSION = '1.0.0'\nlocal a = 1\nlocal b = 2 -- hotfix\nlocal c = 3\n"

	p1 = deployer.Node{Addr: "127.0.0.1:7001", ID: "a1", Role: deployer.RolePrimary, Slots: 5461}
	p2 = deployer.Node{Addr: "127.0.0.1:7002", ID: "a2", Role: deployer.RolePrimary, Slots: 5462}
	p3 = deployer.Node{Addr: "127.0.0.1:7003", ID: "a3", Role: deployer.RolePrimary, Slots: 5461}
	p4 = deployer.Node{Addr: "127.0.0.1:7007", ID: "a7", Role: deployer.RolePrimary}
	r1 = deployer.Node{Addr: "127.0.0.1:7004", ID: "b4", Role: deployer.RoleReplica, Primary: p1.Addr}
	r2 = deployer.Node{Addr: "127.0.0.1:7005", ID: "b5", Role: deployer.RoleReplica, Primary: p2.Addr}
	r3 = deployer.Node{Addr: "127.0.0.1:7006", ID: "b6", Role: deployer.RoleReplica, Primary: p3.Addr}

	fixtureSet = versions.Set{{Version: "1.0.0", Code: code100}, {Version: "1.1.0", Code: code110}}
	to         = fixtureSet[1]

	// p5 is flagged fail by the cluster with no slots (a failed-over primary, as Discover
	// describes it), p6 answers without Functions; r3 does not answer.
	p5 = deployer.Node{Addr: "127.0.0.1:7008", ID: "a8", Role: deployer.RolePrimary, Down: "flagged fail by the cluster; it is a primary that owns no slots (most often one whose replica took over in a failover): restart it with its nodes.conf and it rejoins (as a replica of its old shard after a failover), or if it is gone for good remove it with CLUSTER FORGET a8 on every other node within 60s (valkey-cli --cluster call 127.0.0.1:7001 CLUSTER FORGET a8)"}
	p6 = deployer.Node{Addr: "127.0.0.1:7009", ID: "a9", Role: deployer.RolePrimary}

	fixtureInstalled = []deployer.Installed{
		onRedis70(identify(p1, code100)),
		identify(p2, code110),
		identify(p3, drifted),
		identify(p4, ""),
		{Node: p5},
		{Node: p6, Unsupported: "FUNCTION is not a command here (renamed or disabled, blocked by a managed service, or a server before Redis 7.0)"},
		identify(r1, code100),
		identify(r2, code110),
		{Node: r3, Unreachable: errors.New("dial tcp 127.0.0.1:7006: connect: connection refused")},
	}
	fixturePlan = deployer.NewPlan(fixtureInstalled, to, false)
	// status also asks every cluster node for cluster-require-full-coverage (Target.Coverage),
	// and finds the primaries without the library the others run (deployer.Gaps): p4 owns no
	// slots (a warning), p7 was given one slot (a problem).
	fixtureStatus = statusFixture()

	fixtureReport = deployer.Report{To: "1.1.0", Duration: 412 * time.Millisecond, Nodes: []deployer.NodeResult{
		{Node: p1, From: "1.0.0", To: "1.1.0", Outcome: deployer.OutcomeLoaded, Duration: 12 * time.Millisecond},
		{Node: p2, From: "1.1.0", To: "1.1.0", Outcome: deployer.OutcomeUnchanged},
		{Node: p4, To: "1.1.0", Outcome: deployer.OutcomeLoaded, Duration: 9 * time.Millisecond},
		{Node: r1, From: "1.0.0", To: "1.1.0", Outcome: deployer.OutcomeReplicated, Duration: 210 * time.Millisecond},
		{Node: r2, From: "1.1.0", To: "1.1.0", Outcome: deployer.OutcomeReplicated, Duration: 3 * time.Millisecond},
	}}

	// fixtureLeftOut: a forced deploy that left a node out, and found a replica that did
	// not follow its primary (lagging): NOT deployed, both.
	fixtureLeftOut = deployer.Report{To: "1.1.0", Duration: 30 * time.Millisecond, Warnings: []deployer.Warning{{
		ID: deployer.WarnLockRelease, Text: "release lock rlfn:deploy:lock on 127.0.0.1:7001 (it expires by itself within 30s): NOPERM"}},
		Nodes: []deployer.NodeResult{
			{Node: p1, From: "1.0.0", To: "1.1.0", Outcome: deployer.OutcomeLoaded, Duration: 12 * time.Millisecond},
			{Node: r1, To: "1.1.0", Outcome: deployer.OutcomeLeftOut, Err: errors.New("unreachable: flagged fail by the cluster")},
			{Node: r2, From: "1.0.0", To: "1.1.0", Outcome: deployer.OutcomeLagging, Duration: 10 * time.Second,
				Err: errors.New("runs 1.0.0, not 1.1.0, and receives nothing from this deploy, which never loads a replica (is its replication broken?): has other code after 10s")},
		}}

	fixtureFailed = deployer.Report{To: "1.1.0", Duration: 95 * time.Millisecond, RolledBack: true, Nodes: []deployer.NodeResult{
		{Node: p1, From: "1.0.0", To: "1.1.0", Outcome: deployer.OutcomeRestored, Duration: 14 * time.Millisecond},
		{Node: p2, From: "1.1.0", To: "1.1.0", Outcome: deployer.OutcomeUnchanged},
		{Node: p4, To: "1.1.0", Outcome: deployer.OutcomeFailed, Duration: 2 * time.Millisecond,
			Err: errors.New("OOM command not allowed when used memory > 'maxmemory'.")},
	}}

	// fixtureFailover: a primary killed after its load, its replica promoted and put back
	// as the shard's primary; another primary demoted before its load, which it refused.
	fixtureFailover = deployer.Report{To: "1.1.0", Duration: 2 * time.Second, Nodes: []deployer.NodeResult{
		{Node: p1, From: "1.0.0", To: "1.1.0", Outcome: deployer.OutcomeRestoreFailed, Duration: 1500 * time.Millisecond,
			Err: errors.New("restore: connect: dial tcp 127.0.0.1:7001: connect: connection refused")},
		{Node: p2, RoleAfter: deployer.RoleReplica, From: "1.0.0", To: "1.1.0", Outcome: deployer.OutcomeFailed, Duration: time.Millisecond,
			Err: errors.New("READONLY You can't write against a read only replica.")},
		{Node: r1, RoleAfter: deployer.RolePrimary, From: "1.0.0", To: "1.1.0", Outcome: deployer.OutcomeRestored, Duration: 20 * time.Millisecond},
	}}
)

// fixtureUnrestored is a failed deploy that could not put one node back.
var fixtureUnrestored = deployer.Report{To: "1.1.0", Duration: 5 * time.Second, Nodes: []deployer.NodeResult{
	{Node: p1, From: "1.0.0", To: "1.1.0", Outcome: deployer.OutcomeRestoreFailed, Duration: 5 * time.Second,
		Err: errors.New("restore: i/o timeout")},
	{Node: p4, To: "1.1.0", Outcome: deployer.OutcomeFailed, Duration: 2 * time.Millisecond,
		Err: errors.New("OOM command not allowed when used memory > 'maxmemory'.")},
}}

// onRedis70 is a node on Redis 7.0.15, which lacks the Lua security fixes: a warning.
func onRedis70(in deployer.Installed) deployer.Installed {
	in.Server = deployer.Server{Name: "redis", Version: "7.0.15"}
	in.Warnings = []deployer.Warning{{ID: deployer.WarnLuaSecurity, Addr: in.Node.Addr,
		Text: "Redis 7.0.15 lacks known Lua security fixes (CVE-2025-49844 and others): upgrade to Redis 7.2.11, 7.4.6, 8.0.4, 8.2.2 or later"}}
	return in
}

// withCoverage is installed as status sees it: p1, p2 and r1 left at the servers' default
// cluster-require-full-coverage yes, p3 not letting it be read.
func withCoverage(installed []deployer.Installed) []deployer.Installed {
	out := slices.Clone(installed)
	yes := "cluster-require-full-coverage is yes: while any shard has no primary (a failover's first seconds, or for good) this node answers CLUSTERDOWN to every call, and rate limiting stops on every shard; set it to no on every node (CONFIG SET cluster-require-full-coverage no, and CONFIG REWRITE or the config file, so that a restart keeps it)"
	withWarnings(out, []deployer.Warning{
		{ID: deployer.WarnFullCoverage, Addr: p1.Addr, Text: yes},
		{ID: deployer.WarnFullCoverage, Addr: p2.Addr, Text: yes},
		{ID: deployer.WarnFullCoverage, Addr: p3.Addr, Text: "cluster-require-full-coverage could not be read (CONFIG GET cluster-require-full-coverage: NOPERM User deployer has no permissions to run the 'config|get' command): if it is yes, the default, this node answers CLUSTERDOWN to every call while any shard has no primary, and rate limiting stops on every shard; make sure it is no"},
		{ID: deployer.WarnFullCoverage, Addr: r1.Addr, Text: yes},
	})
	return out
}

// p7 joined the cluster and was given one slot, but no library.
var p7 = deployer.Node{Addr: "127.0.0.1:7010", ID: "a10", Role: deployer.RolePrimary, Slots: 1}

// statusFixture is the status rows of fixtureInstalled and p7, as status makes them.
func statusFixture() []statusRow {
	installed := withCoverage(fixtureInstalled)
	installed = slices.Insert(installed, 6, identify(p7, ""))
	gaps, _ := coverageGaps(installed)
	rows := statusRows(deployer.NewPlan(installed, to, false))
	for i := range rows {
		rows[i].Gap = gaps[rows[i].Addr]
	}
	return rows
}

func identify(n deployer.Node, code string) deployer.Installed {
	return deployer.Identify(n, code, "LUA", fixtureSet)
}

func TestRenderGolden(t *testing.T) {
	forced := deployer.NewPlan(fixtureInstalled, to, true)
	var b bytes.Buffer
	must(t, renderPlan(&b, palette{}, forced))
	golden(t, "plan-forced.golden", b.String())

	for _, colour := range []bool{false, true} {
		suffix := ".golden"
		if colour {
			suffix = ".color.golden"
		}
		p := palette{on: colour}
		b.Reset()
		must(t, renderStatus(&b, p, fixtureStatus, true))
		golden(t, "status"+suffix, b.String())

		b.Reset()
		must(t, renderPlan(&b, p, fixturePlan))
		must(t, renderDiff(&b, p, fixturePlan))
		golden(t, "diff"+suffix, b.String())

		b.Reset()
		must(t, renderReport(&b, p, fixtureReport))
		b.WriteString("\n")
		must(t, renderReport(&b, p, fixtureFailed))
		b.WriteString("\n")
		must(t, renderReport(&b, p, fixtureUnrestored))
		b.WriteString("\n")
		must(t, renderReport(&b, p, fixtureLeftOut))
		b.WriteString("\n")
		must(t, renderReport(&b, p, fixtureFailover))
		golden(t, "report"+suffix, b.String())
	}
}

func TestPlanNothingToDo(t *testing.T) {
	var b bytes.Buffer
	// Every primary is current; a replica that is not is worth a warning.
	lagging := identify(r1, code100)
	lagging.Node.Primary = p2.Addr
	plan := deployer.NewPlan([]deployer.Installed{fixtureInstalled[1], lagging}, to, false)
	must(t, renderPlan(&b, palette{}, plan))
	must(t, renderDiff(&b, palette{}, plan))
	golden(t, "diff-current.golden", b.String())
}

func TestStatusJSONNames(t *testing.T) {
	// The JSON names are a contract: scripts read addr, role, state and version.
	var b bytes.Buffer
	must(t, writeJSON(&b, []statusRow{fixtureStatus[0], fixtureStatus[6]}))
	golden(t, "status.json.golden", b.String())
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestColours: colour only on a terminal, and never with NO_COLOR or TERM=dumb.
func TestColours(t *testing.T) {
	defer func(f func(any) bool) { isTerminal = f }(isTerminal)
	tests := []struct {
		terminal bool
		env      map[string]string
		want     bool
	}{
		{terminal: false, want: false},
		{terminal: true, want: true},
		{terminal: true, env: map[string]string{"NO_COLOR": ""}, want: false},
		{terminal: true, env: map[string]string{"NO_COLOR": "1"}, want: false},
		{terminal: true, env: map[string]string{"TERM": "dumb"}, want: false},
	}
	for _, tt := range tests {
		isTerminal = func(any) bool { return tt.terminal }
		t.Setenv("NO_COLOR", "") // restored after the test...
		os.Unsetenv("NO_COLOR")  // ...and unset for this case
		t.Setenv("TERM", "xterm")
		for k, v := range tt.env {
			t.Setenv(k, v)
		}
		var b bytes.Buffer
		must(t, renderStatus(&b, colours(&b), fixtureStatus, true))
		if got := strings.Contains(b.String(), "\x1b["); got != tt.want {
			t.Errorf("terminal %v, env %v: coloured %v, want %v", tt.terminal, tt.env, got, tt.want)
		}
	}
}

// TestCallGolden pins call's output in every mode, as a table and as JSON Lines. The table's
// columns are as wide as the plan can fill them, whatever the rows: a cell wider than its
// column (a reset of hours) pushes the rest of its row right.
func TestCallGolden(t *testing.T) {
	admitted := client.Result{Allowed: true, Limit: 10, Remaining: 7, ResetAfter: 3 * time.Second}
	shaped := client.Result{Allowed: true, Limit: 10, Remaining: 2, ResetAfter: 800 * time.Millisecond, Delay: 400 * time.Millisecond}
	denied := client.Result{Limit: 10, RetryAfter: 1500 * time.Millisecond, ResetAfter: 9 * time.Second}
	never := client.Result{Limit: 10, Remaining: 3, RetryAfter: client.Never, ResetAfter: time.Second}
	long := client.Result{Limit: 10, RetryAfter: time.Hour, ResetAfter: 2*time.Hour - time.Millisecond}
	bucket := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}
	conc := client.Concurrency{Limit: 2, Lease: 30 * time.Second}
	for _, tt := range []struct {
		name string
		plan *callPlan
		rows []callRow
	}{
		{"allow", &callPlan{mode: modeAllow, prefix: "rl:", key: "user:42", limit: bucket, most: 10}, []callRow{
			{key: "rl:{user:42}:token_bucket", res: admitted},
			{key: "rl:{user:42}:token_bucket", res: denied},
			{key: "rl:{user:42}:token_bucket", res: never},
			{key: "rl:{user:42}:token_bucket", res: shaped},
			{key: "rl:{user:42}:token_bucket", res: long},
		}},
		{"refund", &callPlan{mode: modeRefund, prefix: "rl:", key: "shop:7", limit: client.TokenBucket{Capacity: 1000, Rate: 50, Period: time.Second}, most: 1000},
			[]callRow{{key: "rl:{shop:7}:token_bucket", res: client.Result{Allowed: true, Limit: 1000, Remaining: 640, ResetAfter: 7200 * time.Millisecond}}}},
		{"concurrency", &callPlan{mode: modeAcquire, prefix: "rl:", key: "user:42", conc: conc, most: 2}, []callRow{
			{key: "rl:{user:42}:concurrency", id: "9f86d081884c7d659a2feaa0c55ad015", res: client.Result{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: 30 * time.Second}},
			{key: "rl:{user:42}:concurrency", res: client.Result{Limit: 2, RetryAfter: 29990 * time.Millisecond, ResetAfter: 30 * time.Second}},
		}},
		{"concurrency-id", &callPlan{mode: modeAcquire, prefix: "rl:", key: "user:42", conc: conc, id: "worker-1", most: 2}, []callRow{
			{key: "rl:{user:42}:concurrency", id: "worker-1", res: client.Result{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 30 * time.Second}},
		}},
		{"release", &callPlan{mode: modeRelease, prefix: "rl:", key: "user:42", conc: conc, id: "worker-1", most: 2}, []callRow{
			{key: "rl:{user:42}:concurrency", id: "worker-1", res: client.Result{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: 29 * time.Second}},
			{key: "rl:{user:42}:concurrency", id: "worker-1", res: client.Result{Limit: 2, Remaining: 1}},
		}},
		{"multi", &callPlan{mode: modeMulti, prefix: "rl:", key: "user:42", most: 10, rules: []client.Rule{
			{Key: "user:42", Limit: client.SlidingWindow{Limit: 5, Window: time.Minute}},
			{Key: "user:42", Limit: client.FixedWindow{Limit: 10, Window: time.Hour, Name: "hourly"}},
			{Key: "global", Limit: bucket},
		}}, []callRow{
			{key: "rl:{user:42}:fixed_window:hourly", rule: 2, res: admitted, each: []ruleRow{
				{1, "rl:{user:42}:sliding_window", client.Result{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: 90 * time.Second}},
				// its own reset, which the table shows: the decision's is the longest of its key's
				{2, "rl:{user:42}:fixed_window:hourly", client.Result{Allowed: true, Limit: 10, Remaining: 7, ResetAfter: 2 * time.Second}},
				{3, "rl:{global}:token_bucket", client.Result{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: 100 * time.Millisecond}},
			}},
			{key: "rl:{global}:token_bucket", rule: 3, res: denied, each: []ruleRow{
				{1, "rl:{user:42}:sliding_window", client.Result{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: 89 * time.Second}},
				{3, "rl:{global}:token_bucket", client.Result{Limit: 10, RetryAfter: 1500 * time.Millisecond, ResetAfter: 9 * time.Second}},
			}},
		}},
		// A penalty, from a real run of rlfn call fixed_window user:42 --limit 5 --window 1s
		// --penalty 15m --repeat 7 (TestPenaltyGoldenIsReal checks its rows against a real
		// server's, times aside): five admitted, the denial that sets the block and is
		// refused by it (limit and remaining the block's 0, its waits the penalty), then a call
		// the block refuses (the block's time left).
		{"penalty", &callPlan{mode: modeAllow, prefix: "rl:", key: "user:42", limit: client.FixedWindow{Limit: 5, Window: time.Second, Penalty: 15 * time.Minute}, most: 5, wait: 15 * time.Minute}, []callRow{
			{key: "rl:{user:42}:fixed_window", res: client.Result{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: 880 * time.Millisecond}},
			{key: "rl:{user:42}:fixed_window", res: client.Result{Allowed: true, Limit: 5, Remaining: 3, ResetAfter: 880 * time.Millisecond}},
			{key: "rl:{user:42}:fixed_window", res: client.Result{Allowed: true, Limit: 5, Remaining: 2, ResetAfter: 879 * time.Millisecond}},
			{key: "rl:{user:42}:fixed_window", res: client.Result{Allowed: true, Limit: 5, Remaining: 1, ResetAfter: 879 * time.Millisecond}},
			{key: "rl:{user:42}:fixed_window", res: client.Result{Allowed: true, Limit: 5, Remaining: 0, ResetAfter: 879 * time.Millisecond}},
			{key: "rl:{user:42}:fixed_window", res: client.Result{Blocked: true, RetryAfter: 15 * time.Minute, ResetAfter: 15 * time.Minute}},
			{key: "rl:{user:42}:fixed_window", res: client.Result{Blocked: true, RetryAfter: 15*time.Minute - time.Millisecond, ResetAfter: 15*time.Minute - time.Millisecond}},
		}},
		// Several limits of a blocked key: the block decides, and its row's RESET AFTER is
		// the block's, as its RETRY AFTER, not the peek of the limit the call never reached.
		{"multi-blocked", &callPlan{mode: modeMulti, prefix: "rl:", key: "user:42", most: 5000, wait: time.Hour, rules: []client.Rule{
			{Key: "user:42", Limit: client.SlidingWindow{Limit: 100, Window: time.Minute}},
			{Key: "user:42", Limit: client.FixedWindow{Limit: 5000, Window: time.Hour, Name: "hourly", Penalty: time.Hour}},
		}}, []callRow{
			{key: "rl:{user:42}:sliding_window", rule: 1, res: client.Result{Blocked: true, RetryAfter: 14*time.Minute + 59980*time.Millisecond, ResetAfter: 40 * time.Minute}, each: []ruleRow{
				{1, "rl:{user:42}:sliding_window", client.Result{Limit: 100, Remaining: 100, RetryAfter: 14*time.Minute + 59980*time.Millisecond}},
				{2, "rl:{user:42}:fixed_window:hourly", client.Result{Allowed: true, Limit: 5000, Remaining: 4999, ResetAfter: 40 * time.Minute}},
			}},
		}},
		// A peek, from make demo: rlfn call token_bucket user:42 --capacity 3 --rate 1
		// --period 1s --peek after four calls (TestPeekGoldenIsReal checks it as the penalty's).
		{"peek", &callPlan{mode: modeAllow, prefix: "rl:", key: "user:42", limit: client.TokenBucket{Capacity: 3, Rate: 1, Period: time.Second}, most: 3, peek: true}, []callRow{
			{key: "rl:{user:42}:token_bucket", res: client.Result{Limit: 3, RetryAfter: 964 * time.Millisecond, ResetAfter: 2964 * time.Millisecond}},
		}},
		// A month's windows: waits of days, in columns as wide as the longest.
		{"calendar", &callPlan{mode: modeAllow, prefix: "rl:", key: "shop:7", limit: client.Calendar{Limit: 10000, Period: client.Month}, most: 10000, wait: 31*24*time.Hour + time.Hour}, []callRow{
			{key: "rl:{shop:7}:calendar", res: client.Result{Allowed: true, Limit: 10000, Remaining: 1, ResetAfter: 82*time.Hour + 37*time.Minute + 29703*time.Millisecond}},
			{key: "rl:{shop:7}:calendar", res: client.Result{Limit: 10000, RetryAfter: 82*time.Hour + 37*time.Minute + 29696*time.Millisecond, ResetAfter: 82*time.Hour + 37*time.Minute + 29696*time.Millisecond}},
		}},
		{"multi-peek", &callPlan{mode: modeMulti, prefix: "rl:", key: "user:42", most: 10, peek: true, rules: []client.Rule{
			{Key: "user:42", Limit: client.SlidingWindow{Limit: 5, Window: time.Minute}},
			{Key: "global", Limit: bucket},
		}}, []callRow{
			{key: "rl:{global}:token_bucket", rule: 2, res: denied},
		}},
	} {
		keyed(t, tt.plan)
		var table, lines bytes.Buffer
		for _, o := range []*callOutput{newCallOutput(&table, tt.plan, false), newCallOutput(&lines, tt.plan, true)} {
			for _, r := range tt.rows {
				must(t, o.add(r))
			}
		}
		golden(t, "call-"+tt.name+".golden", table.String()+"\n"+lines.String())
	}
}

// TestCallStreams: each row is written when its call returns, and nothing is held for the
// rows to come: --repeat of a billion prints as it goes, in bounded memory.
func TestCallStreams(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		plan := &callPlan{mode: modeMulti, prefix: "rl:", key: "user:42", most: 10, rules: []client.Rule{
			{Key: "user:42", Limit: client.SlidingWindow{Limit: 5, Window: time.Minute}},
			{Key: "global", Limit: client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}},
		}}
		keyed(t, plan)
		var w countingWriter
		o := newCallOutput(&w, plan, asJSON)
		row := callRow{key: "rl:{global}:token_bucket", rule: 2, res: client.Result{Limit: 10, RetryAfter: time.Second, ResetAfter: time.Minute}}
		const rows = 200000
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range rows {
			n := w.lines
			must(t, o.add(row))
			if w.lines <= n {
				t.Fatalf("json %v: row %d not written when added (%d lines written)", asJSON, i+1, w.lines)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		// A table that held its rows would hold 200000 of them, some 16 MB.
		if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 1<<20 {
			t.Errorf("json %v: the heap grew by %d bytes over %d rows", asJSON, grown, rows)
		}
		runtime.KeepAlive(o)
	}
}

// countingWriter counts the lines written to it and keeps none.
type countingWriter struct{ lines int }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.lines += bytes.Count(p, []byte("\n"))
	return len(p), nil
}

// TestUnread: status and diff fail on every node that was not read, by its state, also
// when no reason was recorded for it; a node that was read never fails them.
func TestUnread(t *testing.T) {
	rows := []statusRow{
		{Addr: "127.0.0.1:7001", State: "current"},
		{Addr: "127.0.0.1:7002", State: "unreachable"},
		{Addr: "127.0.0.1:7003", State: "unsupported", Error: "FUNCTION is not a command here"},
		{Addr: "127.0.0.1:7004", State: "absent"},
	}
	err := unread(rows)
	want := "127.0.0.1:7002: unreachable: not read\n127.0.0.1:7003: unsupported: FUNCTION is not a command here"
	if err == nil || err.Error() != want {
		t.Errorf("unread = %v, want %q", err, want)
	}
	if err := unread(rows[:1]); err != nil {
		t.Errorf("unread of a node read = %v, want nil", err)
	}
}

// TestJSONShapes: the keys of diff --json, deploy --json and a failed command's --json are the ones the README
// documents, a contract for scripts: a renamed or dropped field fails here first. Every
// optional field is filled in, so that each key shows.
func TestJSONShapes(t *testing.T) {
	keys := func(t *testing.T, v any) map[string]any {
		t.Helper()
		var b bytes.Buffer
		if err := writeJSON(&b, v); err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	same := func(t *testing.T, what string, m map[string]any, want string) {
		t.Helper()
		got := slices.Sorted(maps.Keys(m))
		w := strings.Fields(want)
		slices.Sort(w)
		if !slices.Equal(got, w) {
			t.Errorf("%s keys %v, want %v (README)", what, got, w)
		}
	}
	// A forced plan keeps its refusals on record; the unreachable node has an error too.
	var step stepJSON
	for _, s := range stepsJSON(deployer.NewPlan(fixtureInstalled, to, true)) {
		if s.Refusal != "" && s.Error != "" {
			step = s
		}
	}
	if step.Addr == "" {
		t.Fatal("no refused step with an error in the fixture")
	}
	step.Warnings = warningsJSON([]deployer.Warning{{ID: deployer.WarnLuaSecurity, Addr: step.Addr, Text: "t"}})
	rep := fixtureLeftOut
	rep.Nodes = append(rep.Nodes, fixtureFailover.Nodes...)
	out := deployJSON{To: "1.1.0", Plan: []stepJSON{step}, Warnings: step.Warnings, Report: reportJSONOf(rep), Error: "x"}
	m := keys(t, out)
	same(t, "deploy --json", m, "to dry_run plan warnings report error")
	same(t, "deploy --json plan[]", m["plan"].([]any)[0].(map[string]any), "addr role state from to action reason refusal error warnings")
	same(t, "deploy --json warnings[]", m["warnings"].([]any)[0].(map[string]any), "id addr text")
	report := m["report"].(map[string]any)
	same(t, "deploy --json report", report, "duration_ms rolled_back nodes warnings")
	var node map[string]any
	for _, n := range report["nodes"].([]any) {
		if n.(map[string]any)["error"] != nil && n.(map[string]any)["role_after"] != nil {
			node = n.(map[string]any)
		}
	}
	same(t, "deploy --json report.nodes[]", node, "addr role role_after from to outcome duration_ms error")

	same(t, "a failed --json command", keys(t, errorJSON{Error: "x", Exit: 1}), "error exit")

	d := keys(t, diffJSON{To: "1.1.0", Steps: []stepJSON{step}, Diffs: diffsJSON(fixturePlan), Warnings: step.Warnings})
	same(t, "diff --json", d, "to pending current steps diffs warnings")
	same(t, "block --json", keys(t, blockJSON{}), "key blocked retry_after_ms")
}

// TestRenderHostile: every string of a server's in every table and line for people is
// printed Go-quoted when it holds a control character: here what only a fake or broken
// server supplies (its version in a warning, a primary's address, an error's text);
// TestHostileServer has a real server announce an address and run code that hold them.
func TestRenderHostile(t *testing.T) {
	const evil = "\x1b]0;owned\x07\n"
	node := deployer.Node{Addr: "10.0.0.1" + evil + ":7001", Role: deployer.RolePrimary}
	rep := deployer.Node{Addr: "10.0.0.2:7002", Role: deployer.RoleReplica, Primary: node.Addr}
	down := deployer.Node{Addr: "10.0.0.3" + evil + ":7003", Role: deployer.RoleReplica, Primary: node.Addr}
	odd := deployer.Node{Addr: "10.0.0.4:7004", Role: deployer.RolePrimary}
	warn := deployer.Warning{ID: deployer.WarnLuaSecurity, Addr: node.Addr, Text: "Valkey 8.0.1" + evil + " lacks known Lua security fixes"}
	in := []deployer.Installed{
		identify(node, drifted),
		identify(rep, code100),
		{Node: down, Unreachable: errors.New("dial tcp: lookup " + evil)},
		{Node: odd, Unsupported: "ERR unknown command" + evil},
	}
	in[0].Warnings = []deployer.Warning{warn}
	plan := deployer.NewPlan(in, to, true)
	report := deployer.Report{To: "1.1.0", Warnings: []deployer.Warning{{ID: deployer.WarnLockRelease, Text: "release lock: " + evil}},
		Nodes: []deployer.NodeResult{
			{Node: node, From: deployer.FromDrifted, To: "1.1.0", Outcome: deployer.OutcomeRestoreFailed, Err: errors.New("OOM" + evil)},
			{Node: down, To: "1.1.0", Outcome: deployer.OutcomeLeftOut, Err: errors.New("unreachable: " + evil)},
		}}
	var b bytes.Buffer
	must(t, renderStatus(&b, palette{}, statusRows(plan), false))
	must(t, renderPlan(&b, palette{}, plan))
	must(t, renderDiff(&b, palette{}, plan))
	must(t, renderReport(&b, palette{}, report))
	report.Nodes[0].Outcome = deployer.OutcomeFailed
	must(t, renderReport(&b, palette{}, report))
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.ContainsFunc(line, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
			t.Errorf("a control character reaches the terminal: %q", line)
		}
		if strings.Contains(line, "owned") && !strings.Contains(line, `\x1b]0;owned\a`) {
			t.Errorf("a server's text is not Go-quoted: %q", line)
		}
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("output:\n%s", b.String())
	}
}

// keyed fills the server keys of a plan made by hand, as newCallPlan does, with the client's
// own Key.
func keyed(t *testing.T, p *callPlan) {
	t.Helper()
	lim, err := client.New(mock.NewClient(nil), client.Options{Prefix: p.prefix})
	if err != nil {
		t.Fatal(err)
	}
	switch p.mode {
	case modeAcquire, modeRelease:
		p.stateKey = lim.ConcurrencyKey(p.key, p.conc)
	case modeMulti:
		for _, r := range p.rules {
			p.ruleKeys = append(p.ruleKeys, lim.Key(r.Key, r.Limit))
		}
		p.stateKey = p.ruleKeys[0]
	default:
		p.stateKey = lim.Key(p.key, p.limit)
	}
}
