package deployer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"
	"go.uber.org/mock/gomock"
)

// TestApplyWithoutServer: the refusals Apply makes before touching any node. The target
// has no connections, so any attempt to reach a server would fail the test.
func TestApplyWithoutServer(t *testing.T) {
	p1, p2 := primary("127.0.0.1:7001"), primary("127.0.0.1:7002")
	r2 := replica("127.0.0.1:7005", p2.Addr)
	down := Installed{Node: p2, Unreachable: errors.New("connect: connection refused")}
	tests := []struct {
		name    string
		give    Plan
		wantErr func(error) bool
		want    Outcome
		// wantNodes, when set, is the outcome of each node instead of want.
		wantNodes []Outcome
	}{
		{
			name:    "empty target",
			give:    NewPlan(nil, r110, false),
			wantErr: func(err error) bool { return errors.Is(err, ErrNoNodes) },
		},
		{
			name: "refused",
			give: NewPlan([]Installed{on(p1, drifted)}, r110, false),
			wantErr: func(err error) bool {
				var re *RefusedError
				return errors.As(err, &re) && len(re.Steps) == 1 && re.Steps[0].Refusal == RefusalDrift
			},
			want: OutcomeUnchanged,
		},
		{
			name:    "unreachable, not forced: refused, nothing left out",
			give:    NewPlan([]Installed{on(p1, r110.Code), down}, r110, false),
			wantErr: func(err error) bool { var re *RefusedError; return errors.As(err, &re) },
			want:    OutcomeUnchanged,
		},
		{
			name: "unreachable, forced: left out, not reported unchanged, and not a success",
			give: NewPlan([]Installed{on(p1, r110.Code), down, on(r2, r110.Code)}, r110, true),
			wantErr: func(err error) bool {
				var pe *PartialError
				return errors.As(err, &pe) && errors.Is(err, ErrNotDeployed) && !pe.Report.RolledBack &&
					err.Error() == "deployer: deploy of 1.1.0 incomplete: NOT deployed: 127.0.0.1:7002 (unreachable: connect: connection refused)"
			},
			wantNodes: []Outcome{OutcomeUnchanged, OutcomeLeftOut, OutcomeUnchanged},
		},
		{
			name: "unsupported, forced: refused all the same, saying what is needed",
			give: NewPlan([]Installed{on(p1, ""), {Node: p2, Unsupported: "FUNCTION is not a command here"}}, r110, true),
			wantErr: func(err error) bool {
				var ue *UnsupportedError
				return errors.As(err, &ue) && len(ue.Steps) == 1 &&
					err.Error() == "deployer: 127.0.0.1:7002 cannot run Functions: FUNCTION is not a command here; "+needs
			},
			want: OutcomeUnchanged,
		},
		{
			// Nothing reaches a replica whose primary is left out: it is left out too (not
			// lagging, which would wait for it to catch up, nor unchanged).
			name: "unreachable primary, forced: its replica behind is left out as well",
			give: NewPlan([]Installed{on(p1, r110.Code), down, on(r2, r100.Code)}, r110, true),
			wantErr: func(err error) bool {
				return errors.Is(err, ErrNotDeployed) &&
					err.Error() == "deployer: deploy of 1.1.0 incomplete: NOT deployed: 127.0.0.1:7002 (unreachable: connect: connection refused), "+
						"127.0.0.1:7005 (its primary 127.0.0.1:7002 is unreachable)"
			},
			wantNodes: []Outcome{OutcomeUnchanged, OutcomeLeftOut, OutcomeLeftOut},
		},
		{
			name:    "nothing pending",
			give:    NewPlan([]Installed{on(p1, r110.Code)}, r110, false),
			wantErr: func(err error) bool { return err == nil },
			want:    OutcomeUnchanged,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var events []Event
			tg := &Target{dial: noDial(t)}
			rep, err := tg.Apply(t.Context(), tt.give, Options{Progress: func(e Event) { events = append(events, e) }})
			if !tt.wantErr(err) {
				t.Fatalf("Apply: %v", err)
			}
			if rep.To != tt.give.To.Version || len(rep.Nodes) != len(tt.give.Steps) {
				t.Errorf("report to %q with %d nodes", rep.To, len(rep.Nodes))
			}
			for i, n := range rep.Nodes {
				want := tt.want
				if tt.wantNodes != nil {
					want = tt.wantNodes[i]
				}
				if n.Outcome != want {
					t.Errorf("%s is %s (%v), want %s", n.Node.Addr, n.Outcome, n.Err, want)
				}
			}
			for _, n := range rep.LeftOut() {
				if n.Outcome != OutcomeLeftOut {
					t.Errorf("LeftOut() has %s, %s", n.Node.Addr, n.Outcome)
				}
			}
			if got, want := len(rep.LeftOut()), countOutcome(tt.wantNodes, OutcomeLeftOut); got != want {
				t.Errorf("LeftOut() has %d nodes, want %d", got, want)
			}
			if len(events) != 1 || events[0].Phase != PhaseDone || !errors.Is(events[0].Err, err) {
				t.Errorf("events %+v, want one done event carrying the error", events)
			}
		})
	}
}

func countOutcome(outcomes []Outcome, o Outcome) int {
	n := 0
	for _, got := range outcomes {
		if got == o {
			n++
		}
	}
	return n
}

// noDial is a Target's dial for tests that must reach no server.
func noDial(t *testing.T) func(valkey.ClientOption, string) (*conn, error) {
	return func(_ valkey.ClientOption, addr string) (*conn, error) {
		t.Errorf("dialed %s", addr)
		return nil, errors.New("no dial in this test")
	}
}

// TestVerifyChecksEveryNode: nodes still catching up do not keep the others from being
// checked. Forty primaries answer other code until the verification window closes; one in
// their middle (neither the first nor the last goroutine started) runs the release from the
// start and must be found so, not failed unread for want of a turn (a check slot used to be
// held for a node's whole wait). The replies are mocked: forty real servers stuck at once
// are not what the integration tests run.
func TestVerifyChecksEveryNode(t *testing.T) {
	const slow, good = 40, 20
	var installed []Installed
	clients := map[string]valkey.Client{}
	ctrl := gomock.NewController(t)
	for i := range slow + 1 {
		n := primary(fmt.Sprintf("127.0.0.1:%d", 7001+i))
		installed = append(installed, on(n, r110.Code))
		code := r110.Code
		if i != good {
			code = r100.Code // not what the plan saw: stuck on other code for the whole window
		}
		c := mock.NewClient(ctrl)
		c.EXPECT().Do(gomock.Any(), mock.Match("FUNCTION", "LIST", "LIBRARYNAME", "ratelimit", "WITHCODE")).DoAndReturn(
			func(ctx context.Context, _ valkey.Completed) valkey.ValkeyResult {
				time.Sleep(time.Millisecond) // a round trip
				return mock.Result(mock.ValkeyArray(mock.ValkeyMap(map[string]valkey.ValkeyMessage{
					"library_name": mock.ValkeyString("ratelimit"),
					"engine":       mock.ValkeyString("LUA"),
					"library_code": mock.ValkeyString(code),
				})))
			}).AnyTimes()
		c.EXPECT().Do(gomock.Any(), mock.Match("FCALL_RO", "rl_version", "0")).Return(mock.Result(mock.ValkeyString(r110.Version))).AnyTimes()
		clients[n.Addr] = c
	}
	tg := &Target{dial: func(_ valkey.ClientOption, addr string) (*conn, error) {
		return &conn{addr: addr, c: clients[addr]}, nil
	}}
	p := NewPlan(installed, r110, false)
	r := &run{t: tg, p: p, opts: Options{VerifyTimeout: 300 * time.Millisecond}.withDefaults(), began: time.Now(),
		checks: make(chan struct{}, inspectParallelism), res: make([]NodeResult, len(p.Steps)), changed: make([]bool, len(p.Steps))}
	for i, s := range p.Steps {
		r.res[i] = NodeResult{Node: s.Node, From: s.From, To: r110.Version, Outcome: OutcomeUnchanged}
	}
	r.verify(t.Context())
	for i, n := range r.res {
		if i == good {
			if n.Outcome != OutcomeUnchanged || n.Err != nil {
				t.Errorf("%s, which runs the release, is %s (%v), want unchanged", n.Node.Addr, n.Outcome, n.Err)
			}
		} else if n.Outcome != OutcomeFailed {
			t.Errorf("%s, stuck on other code, is %s, want failed", n.Node.Addr, n.Outcome)
		}
	}
}

// TestRestoreAfterFailover: a failed deploy restores a shard that failed over during it.
// The replica promoted in its primary's place gets what the primary ran (FUNCTION LOAD of
// the primary's code, although the replica itself had no library when planned: deleting
// it would leave the shard without one), and a primary the failover demoted, which refuses
// its own restore (READONLY), is restored once it follows the promoted replica back. The
// exact commands are what is checked, hence the mocks; TestDeployDuringFailover runs real
// failovers.
func TestRestoreAfterFailover(t *testing.T) {
	for _, demoted := range []bool{false, true} {
		t.Run(fmt.Sprintf("demoted=%v", demoted), func(t *testing.T) {
			p1, r1 := primary("127.0.0.1:7001"), replica("127.0.0.1:7004", "127.0.0.1:7001")
			// r1b, r1's sibling, is not promoted: it follows r1 back. p2's shard is as usual.
			r1b := replica("127.0.0.1:7006", p1.Addr)
			p2, r2 := primary("127.0.0.1:7002"), replica("127.0.0.1:7005", "127.0.0.1:7002")
			ctrl := gomock.NewController(t)
			library := func(code string) valkey.ValkeyResult {
				return mock.Result(mock.ValkeyArray(mock.ValkeyMap(map[string]valkey.ValkeyMessage{
					"library_name": mock.ValkeyString("ratelimit"), "engine": mock.ValkeyString("LUA"), "library_code": mock.ValkeyString(code),
				})))
			}
			node := func(role string, loads bool) *mock.Client {
				c := mock.NewClient(ctrl)
				if role != "" {
					c.EXPECT().Do(gomock.Any(), mock.Match("INFO", "replication")).Return(mock.Result(mock.ValkeyString("# Replication\r\nrole:" + role + "\r\n")))
				}
				if loads {
					c.EXPECT().Do(gomock.Any(), mock.Match("FUNCTION", "LOAD", "REPLACE", r100.Code)).Return(mock.Result(mock.ValkeyString("ratelimit")))
				}
				c.EXPECT().Do(gomock.Any(), mock.Match("FUNCTION", "LIST", "LIBRARYNAME", "ratelimit", "WITHCODE")).Return(library(r100.Code)).AnyTimes()
				return c
			}
			clients := map[string]valkey.Client{
				r1.Addr: node("master", true), r1b.Addr: node("slave", false),
				p2.Addr: node("", true), r2.Addr: node("", false),
			}
			if demoted {
				pc := mock.NewClient(ctrl)
				pc.EXPECT().Do(gomock.Any(), mock.Match("FUNCTION", "LOAD", "REPLACE", r100.Code)).Return(mock.Result(mock.ValkeyError("READONLY You can't write against a read only replica.")))
				pc.EXPECT().Do(gomock.Any(), mock.Match("FUNCTION", "LIST", "LIBRARYNAME", "ratelimit", "WITHCODE")).Return(library(r100.Code)).AnyTimes()
				clients[p1.Addr] = pc
			}
			tg := &Target{dial: func(_ valkey.ClientOption, addr string) (*conn, error) {
				if c, ok := clients[addr]; ok {
					return &conn{addr: addr, c: c}, nil
				}
				return nil, errors.New("connect: connection refused") // the dead primary
			}}
			p := NewPlan([]Installed{on(p1, r100.Code), on(p2, r100.Code), on(r1, ""), on(r1b, r100.Code), on(r2, r100.Code)}, r110, false)
			r := &run{t: tg, p: p, opts: Options{VerifyTimeout: time.Second}.withDefaults(), began: time.Now(),
				checks: make(chan struct{}, inspectParallelism), res: make([]NodeResult, len(p.Steps)), changed: []bool{true, true, false, false, false}}
			for i, s := range p.Steps {
				r.res[i] = NodeResult{Node: s.Node, From: s.From, To: r110.Version, Outcome: OutcomeLoaded}
			}
			r.restore(t.Context())
			want := map[string]Outcome{p1.Addr: OutcomeRestoreFailed, p2.Addr: OutcomeRestored, r1.Addr: OutcomeRestored, r1b.Addr: OutcomeRestored, r2.Addr: OutcomeRestored}
			if demoted {
				want[p1.Addr] = OutcomeRestored
			}
			for _, n := range r.res {
				if n.Outcome != want[n.Node.Addr] {
					t.Errorf("%s is %s (%v), want %s", n.Node.Addr, n.Outcome, n.Err, want[n.Node.Addr])
				}
			}
			// The report shows what the failover made of them: r1 a primary, and p1, when
			// demoted, a replica.
			wantRole := map[string]Role{r1.Addr: RolePrimary}
			if demoted {
				wantRole[p1.Addr] = RoleReplica
			}
			for _, n := range r.res {
				if n.RoleAfter != wantRole[n.Node.Addr] {
					t.Errorf("%s: role after %q, want %q", n.Node.Addr, n.RoleAfter, wantRole[n.Node.Addr])
				}
			}
		})
	}
}

// TestLoadRefusedReadOnly: a primary that refuses the load READONLY was demoted by a failover
// since the plan was checked: the report says it is a replica now. Another refusal says
// nothing of its role.
func TestLoadRefusedReadOnly(t *testing.T) {
	for _, tt := range []struct {
		reply string
		want  Role
		role  string
	}{
		{"READONLY You can't write against a read only replica.", RoleReplica, "primary->replica"},
		{"OOM command not allowed when used memory > 'maxmemory'.", "", "primary"},
	} {
		p1 := primary("127.0.0.1:7001")
		c := mock.NewClient(gomock.NewController(t))
		c.EXPECT().Do(gomock.Any(), mock.Match("FUNCTION", "LOAD", "REPLACE", r110.Code)).Return(mock.Result(mock.ValkeyError(tt.reply)))
		tg := &Target{dial: func(_ valkey.ClientOption, addr string) (*conn, error) { return &conn{addr: addr, c: c}, nil }}
		p := NewPlan([]Installed{on(p1, r100.Code)}, r110, false)
		r := &run{t: tg, p: p, opts: Options{}.withDefaults(), began: time.Now(),
			checks: make(chan struct{}, inspectParallelism), res: make([]NodeResult, 1), changed: make([]bool, 1)}
		r.res[0] = NodeResult{Node: p1, From: "1.0.0", To: r110.Version, Outcome: OutcomeUnchanged}
		r.load(t.Context())
		got := r.res[0]
		if got.Outcome != OutcomeFailed || got.RoleAfter != tt.want || got.Role() != tt.role || r.changed[0] {
			t.Errorf("%q: %s, role after %q, changed %v; want failed, %q, unchanged", tt.reply, got.Outcome, got.RoleAfter, r.changed[0], tt.want)
		}
	}
}

// TestVerifySaysWhyAReplicaIsLate: a replica that did not verify in time is asked what its
// replication is doing, and the failure says so: one in its full sync is healthy but slow
// (a longer verify timeout helps), one whose link is down is broken. Mocked replies: a full
// sync long enough to outlast a verification needs a large dataset.
func TestVerifySaysWhyAReplicaIsLate(t *testing.T) {
	for _, tt := range []struct {
		name, info, want string
	}{
		{"full sync", "# Replication\r\nrole:slave\r\nmaster_link_status:down\r\nmaster_sync_in_progress:1\r\n", "(it is still in a full sync from its primary: healthy but slow, it needs a longer verify timeout)"},
		{"link down", "# Replication\r\nrole:slave\r\nmaster_link_status:down\r\nmaster_sync_in_progress:0\r\nmaster_link_down_since_seconds:12\r\n", "(its link to its primary is down)"},
		// Valkey 8.0.1 during a new replica's first full sync, dual-channel or not
		{"link never up", "# Replication\r\nrole:slave\r\nmaster_link_status:down\r\nmaster_sync_in_progress:0\r\nmaster_link_down_since_seconds:-1\r\n",
			"(its link to its primary has not been up since it started: its first full sync has not finished (it needs a longer verify timeout), or it cannot reach its primary)"},
		{"link up: nothing to add", "# Replication\r\nrole:slave\r\nmaster_link_status:up\r\nmaster_sync_in_progress:0\r\n", "has other code after"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p1, r1 := primary("127.0.0.1:7001"), replica("127.0.0.1:7004", "127.0.0.1:7001")
			ctrl := gomock.NewController(t)
			lib := func(code string) valkey.ValkeyResult {
				return mock.Result(mock.ValkeyArray(mock.ValkeyMap(map[string]valkey.ValkeyMessage{
					"library_name": mock.ValkeyString("ratelimit"), "engine": mock.ValkeyString("LUA"), "library_code": mock.ValkeyString(code),
				})))
			}
			pc, rc := mock.NewClient(ctrl), mock.NewClient(ctrl)
			pc.EXPECT().Do(gomock.Any(), mock.Match("FUNCTION", "LIST", "LIBRARYNAME", "ratelimit", "WITHCODE")).Return(lib(r110.Code)).AnyTimes()
			pc.EXPECT().Do(gomock.Any(), mock.Match("FCALL_RO", "rl_version", "0")).Return(mock.Result(mock.ValkeyString(r110.Version))).AnyTimes()
			rc.EXPECT().Do(gomock.Any(), mock.Match("FUNCTION", "LIST", "LIBRARYNAME", "ratelimit", "WITHCODE")).Return(lib(r100.Code)).AnyTimes()
			rc.EXPECT().Do(gomock.Any(), mock.Match("INFO", "replication")).Return(mock.Result(mock.ValkeyString(tt.info)))
			clients := map[string]valkey.Client{p1.Addr: pc, r1.Addr: rc}
			tg := &Target{dial: func(_ valkey.ClientOption, addr string) (*conn, error) {
				return &conn{addr: addr, c: clients[addr]}, nil
			}}
			p := NewPlan([]Installed{on(p1, r100.Code), on(r1, r100.Code)}, r110, false)
			r := &run{t: tg, p: p, opts: Options{VerifyTimeout: 100 * time.Millisecond}.withDefaults(), began: time.Now(),
				checks: make(chan struct{}, inspectParallelism), res: make([]NodeResult, 2), changed: make([]bool, 2)}
			for i, s := range p.Steps {
				r.res[i] = NodeResult{Node: s.Node, From: s.From, To: r110.Version, Outcome: OutcomeLoaded}
			}
			r.verify(t.Context())
			if got := r.res[1]; got.Outcome != OutcomeFailed || got.Err == nil || !strings.Contains(got.Err.Error(), tt.want) {
				t.Errorf("replica: %s (%v), want failed saying %q", got.Outcome, got.Err, tt.want)
			}
			if got := r.res[0]; got.Outcome != OutcomeLoaded {
				t.Errorf("primary: %s (%v), want loaded", got.Outcome, got.Err)
			}
		})
	}
}

// TestCheckStaleEngine: the stale check compares what each node runs now with what the plan
// saw, the code and, when there is code, the engine it runs on: the same code reloaded on
// another engine is no longer the release the plan identified (Identify takes it for drift),
// and the deploy must not go on as if it were. Without code, there is no engine to compare.
func TestCheckStaleEngine(t *testing.T) {
	p1 := primary("127.0.0.1:7001")
	for _, tt := range []struct {
		name                 string
		planCode, planEngine string // what the plan saw
		nowCode, nowEngine   string // what the node runs at the check ("" code: no library)
		wantStale            bool
	}{
		{"same code, same engine", r100.Code, "LUA", r100.Code, "LUA", false},
		{"same code, another engine", r100.Code, "LUA", r100.Code, "JS", true},
		{"same code, engine no longer told", r100.Code, "LUA", r100.Code, "", true},
		{"same code, engine now told", r100.Code, "", r100.Code, "LUA", true},
		{"other code, same engine", r100.Code, "LUA", r110.Code, "LUA", true},
		{"no library, none now", "", "", "", "", false},
		{"no library, one now", "", "", r100.Code, "LUA", true},
		{"a library, none now", r100.Code, "LUA", "", "", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := mock.NewClient(gomock.NewController(t))
			c.EXPECT().Do(gomock.Any(), mock.Match("INFO", "cluster")).Return(mock.Result(mock.ValkeyString("# Cluster\r\ncluster_enabled:0\r\n")))
			c.EXPECT().Do(gomock.Any(), mock.Match("INFO", "replication")).Return(mock.Result(mock.ValkeyString("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n")))
			libs := mock.ValkeyArray()
			if tt.nowCode != "" {
				libs = mock.ValkeyArray(mock.ValkeyMap(map[string]valkey.ValkeyMessage{
					"library_name": mock.ValkeyString("ratelimit"), "engine": mock.ValkeyString(tt.nowEngine), "library_code": mock.ValkeyString(tt.nowCode),
				}))
			}
			c.EXPECT().Do(gomock.Any(), mock.Match("FUNCTION", "LIST", "LIBRARYNAME", "ratelimit", "WITHCODE")).Return(mock.Result(libs))
			tg := &Target{seed: p1.Addr, dial: func(_ valkey.ClientOption, addr string) (*conn, error) {
				if addr != p1.Addr {
					t.Errorf("dialed %s", addr)
				}
				return &conn{addr: addr, c: c}, nil
			}}
			p := NewPlan([]Installed{Identify(p1, tt.planCode, tt.planEngine, set)}, r110, true)
			err := tg.checkStale(t.Context(), p)
			if got := errors.Is(err, ErrStalePlan); got != tt.wantStale {
				t.Errorf("checkStale = %v, want stale %v", err, tt.wantStale)
			}
		})
	}
}

// TestVerifyGivesUpOnRefusal: a check the node refuses for good (the user may not run
// FCALL_RO, or the node has no such command) fails the verification at once: waiting out
// --verify-timeout would change nothing. Each node is checked exactly once (gomock fails a
// second call), within a window that would otherwise hold dozens of checks.
func TestVerifyGivesUpOnRefusal(t *testing.T) {
	for _, reply := range []string{
		"NOPERM this user has no permissions to run the 'fcall_ro' command",
		"ERR unknown command 'FCALL_RO', with args beginning with: 'rl_version' '0'",
	} {
		p1 := primary("127.0.0.1:7001")
		c := mock.NewClient(gomock.NewController(t))
		c.EXPECT().Do(gomock.Any(), mock.Match("FUNCTION", "LIST", "LIBRARYNAME", "ratelimit", "WITHCODE")).Return(mock.Result(mock.ValkeyArray(mock.ValkeyMap(map[string]valkey.ValkeyMessage{
			"library_name": mock.ValkeyString("ratelimit"), "engine": mock.ValkeyString("LUA"), "library_code": mock.ValkeyString(r110.Code),
		})))).Times(1)
		c.EXPECT().Do(gomock.Any(), mock.Match("FCALL_RO", "rl_version", "0")).Return(mock.Result(mock.ValkeyError(reply))).Times(1)
		tg := &Target{dial: func(_ valkey.ClientOption, addr string) (*conn, error) { return &conn{addr: addr, c: c}, nil }}
		p := NewPlan([]Installed{on(p1, r100.Code)}, r110, false)
		r := &run{t: tg, p: p, opts: Options{VerifyTimeout: 500 * time.Millisecond}.withDefaults(), began: time.Now(),
			checks: make(chan struct{}, inspectParallelism), res: make([]NodeResult, 1), changed: make([]bool, 1)}
		r.res[0] = NodeResult{Node: p1, From: "1.0.0", To: r110.Version, Outcome: OutcomeLoaded}
		r.verify(t.Context())
		if got := r.res[0]; got.Outcome != OutcomeFailed || got.Err == nil || !strings.Contains(got.Err.Error(), strings.TrimPrefix(reply, "ERR ")) {
			t.Errorf("%q: %s (%v), want failed with the refusal", reply, got.Outcome, got.Err)
		}
	}
}

// TestApplyReportOnce: Apply returns one report, made when the run is over: a failed load
// is restored, the lock's release then fails, and the report Apply returns and the one its
// PartialError carries are the same, the release's warning and RolledBack included.
func TestApplyReportOnce(t *testing.T) {
	p1 := primary("127.0.0.1:7001")
	c := mock.NewClient(gomock.NewController(t))
	eval := func(cmd []string) bool { return len(cmd) > 3 && cmd[0] == "EVAL" && cmd[3] == LockKey }
	set := func(cmd []string) bool { return len(cmd) > 1 && cmd[0] == "SET" && cmd[1] == LockKey }
	c.EXPECT().Do(gomock.Any(), mock.MatchFn(set, "SET lock")).Return(mock.Result(mock.ValkeyString("OK")))
	c.EXPECT().Do(gomock.Any(), mock.Match("INFO", "cluster")).Return(mock.Result(mock.ValkeyString("# Cluster\r\ncluster_enabled:0\r\n")))
	c.EXPECT().Do(gomock.Any(), mock.Match("INFO", "replication")).Return(mock.Result(mock.ValkeyString("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n")))
	c.EXPECT().Do(gomock.Any(), mock.Match("FUNCTION", "LIST", "LIBRARYNAME", "ratelimit", "WITHCODE")).Return(mock.Result(mock.ValkeyArray(mock.ValkeyMap(map[string]valkey.ValkeyMessage{
		"library_name": mock.ValkeyString("ratelimit"), "engine": mock.ValkeyString("LUA"), "library_code": mock.ValkeyString(r100.Code),
	}))))
	c.EXPECT().Do(gomock.Any(), mock.Match("FUNCTION", "LOAD", "REPLACE", r110.Code)).Return(mock.Result(mock.ValkeyError("OOM command not allowed when used memory > 'maxmemory'.")))
	c.EXPECT().Do(gomock.Any(), mock.MatchFn(eval, "EVAL release")).Return(mock.Result(mock.ValkeyError("NOPERM this user has no permissions to run the 'del' command")))
	tg := &Target{seed: p1.Addr, dial: func(_ valkey.ClientOption, addr string) (*conn, error) { return &conn{addr: addr, c: c}, nil }}

	var phases []Phase
	rep, err := tg.Apply(t.Context(), NewPlan([]Installed{on(p1, r100.Code)}, r110, false), Options{Progress: func(e Event) { phases = append(phases, e.Phase) }})
	var pe *PartialError
	if !errors.As(err, &pe) {
		t.Fatalf("Apply: %v, want a PartialError", err)
	}
	if len(rep.Warnings) != 1 || rep.Warnings[0].ID != WarnLockRelease || !strings.Contains(rep.Warnings[0].Text, "NOPERM") {
		t.Errorf("warnings %v, want the lock's release", rep.Warnings)
	}
	if !rep.RolledBack || len(rep.Nodes) != 1 || rep.Nodes[0].Outcome != OutcomeFailed {
		t.Errorf("report %+v, want rolled back, the primary failed", rep)
	}
	if fmt.Sprintf("%+v", pe.Report) != fmt.Sprintf("%+v", rep) {
		t.Errorf("the PartialError's report differs from Apply's:\n%+v\n%+v", pe.Report, rep)
	}
	want := []Phase{PhaseLock, PhaseInspect, PhaseLoad, PhaseUnlock, PhaseDone}
	if fmt.Sprint(phases) != fmt.Sprint(want) {
		t.Errorf("phases %v, want %v", phases, want)
	}
}

// A negative setting is refused before anything is sent: zero is "the default", and a deploy
// run with other settings than those given would be worse than none.
func TestApplyRefusesNegativeOptions(t *testing.T) {
	for _, tt := range []struct {
		give Options
		want string
	}{
		{Options{Parallelism: -1}, "deployer: Options.Parallelism must not be negative, got -1"},
		{Options{VerifyTimeout: -time.Second}, "deployer: Options.VerifyTimeout must not be negative, got -1s"},
		{Options{LockLease: -time.Second}, "deployer: Options.LockLease must not be negative, got -1s"},
	} {
		var tg Target // no node: a call to one would panic
		if _, err := tg.Apply(context.Background(), Plan{}, tt.give); err == nil || err.Error() != tt.want {
			t.Errorf("%+v: got %v, want %s", tt.give, err, tt.want)
		}
	}
	if err := (Options{}).check(); err != nil {
		t.Errorf("the zero Options: %v", err)
	}
}
