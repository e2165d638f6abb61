package deployer

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/rlfn/rlfn/versions"
)

// release is a stand-in library: only its declared version matters to planning.
func release(v string) versions.Release {
	return versions.Release{Version: v, Code: "#!lua name=ratelimit\nlocal VERSION = '" + v + "'\n"}
}

var (
	r100 = release("1.0.0")
	r110 = release("1.1.0")
	r200 = release("2.0.0")
	set  = versions.Set{r100, r110, r200}
	// drifted declares 1.1.0 but is not the 1.1.0 release.
	drifted = "#!lua name=ratelimit\nlocal VERSION = '1.1.0'\n-- hotfix\n"
)

func primary(addr string) Node { return Node{Addr: addr, Role: RolePrimary} }
func replica(addr, of string) Node {
	return Node{Addr: addr, Role: RoleReplica, Primary: of}
}

func on(n Node, code string) Installed { return Identify(n, code, "LUA", set) }

// want is the part of a Step a case checks.
type want struct {
	state   State
	from    string
	action  Action
	refusal Refusal
	reason  string // checked when set
}

func TestPlan(t *testing.T) {
	p1, p2, p3 := primary("127.0.0.1:7001"), primary("127.0.0.1:7002"), primary("127.0.0.1:7003")
	r1, r2 := replica("127.0.0.1:7004", p1.Addr), replica("127.0.0.1:7005", p2.Addr)
	chained := replica("127.0.0.1:7006", r1.Addr)
	orphan := replica("127.0.0.1:7007", "127.0.0.1:9999")
	down := errors.New("connect: dial tcp 127.0.0.1:7002: connection refused")

	tests := []struct {
		name        string
		give        []Installed
		to          versions.Release
		force       bool
		want        []want
		wantPending bool
		wantRefused int
	}{
		{
			name: "empty target",
			to:   r110,
		},
		{
			name:        "absent",
			give:        []Installed{on(p1, "")},
			to:          r100,
			want:        []want{{StateAbsent, "", ActionLoad, "", "absent: load 1.0.0"}},
			wantPending: true,
		},
		{
			name:        "behind",
			give:        []Installed{on(p1, r100.Code)},
			to:          r110,
			want:        []want{{StateBehind, "1.0.0", ActionLoad, "", "upgrade 1.0.0 -> 1.1.0"}},
			wantPending: true,
		},
		{
			name: "current",
			give: []Installed{on(p1, r110.Code), on(r1, r110.Code)},
			to:   r110,
			want: []want{
				{StateCurrent, "1.1.0", ActionNone, "", "already 1.1.0"},
				{StateCurrent, "1.1.0", ActionNone, "", "already 1.1.0"},
			},
		},
		{
			name:        "ahead is a downgrade",
			give:        []Installed{on(p1, r110.Code)},
			to:          r100,
			want:        []want{{StateAhead, "1.1.0", ActionLoad, RefusalDowngrade, "downgrade 1.1.0 -> 1.0.0"}},
			wantPending: true, wantRefused: 1,
		},
		{
			name:        "ahead forced: loaded, refusal on record",
			give:        []Installed{on(p1, r110.Code)},
			to:          r100,
			force:       true,
			want:        []want{{StateAhead, "1.1.0", ActionLoad, RefusalDowngrade, ""}},
			wantPending: true,
		},
		{
			name:        "drifted",
			give:        []Installed{on(p1, drifted)},
			to:          r110,
			want:        []want{{StateDrifted, FromDrifted, ActionLoad, RefusalDrift, "drifted code (declares 1.1.0): replace with 1.1.0"}},
			wantPending: true, wantRefused: 1,
		},
		{
			name:        "drifted forced",
			give:        []Installed{on(p1, drifted)},
			to:          r110,
			force:       true,
			want:        []want{{StateDrifted, FromDrifted, ActionLoad, RefusalDrift, ""}},
			wantPending: true,
		},
		{
			name:        "drifted code declaring no version",
			give:        []Installed{on(p1, "#!lua name=ratelimit\nreturn\n")},
			to:          r110,
			want:        []want{{StateDrifted, FromDrifted, ActionLoad, RefusalDrift, "drifted code: replace with 1.1.0"}},
			wantPending: true, wantRefused: 1,
		},
		{
			name:        "major upgrade",
			give:        []Installed{on(p1, r110.Code)},
			to:          r200,
			want:        []want{{StateBehind, "1.1.0", ActionLoad, RefusalMajor, ""}},
			wantPending: true, wantRefused: 1,
		},
		{
			name:        "major downgrade: major takes precedence",
			give:        []Installed{on(p1, r200.Code)},
			to:          r110,
			want:        []want{{StateAhead, "2.0.0", ActionLoad, RefusalMajor, ""}},
			wantPending: true, wantRefused: 1,
		},
		{
			name:        "major forced",
			give:        []Installed{on(p1, r100.Code)},
			to:          r200,
			force:       true,
			want:        []want{{StateBehind, "1.0.0", ActionLoad, RefusalMajor, ""}},
			wantPending: true,
		},
		{
			name:        "absent to another major is no major change",
			give:        []Installed{on(p1, "")},
			to:          r200,
			want:        []want{{StateAbsent, "", ActionLoad, "", ""}},
			wantPending: true,
		},
		{
			name: "replicas follow their primary",
			give: []Installed{on(p1, r100.Code), on(r1, r100.Code), on(chained, r100.Code)},
			to:   r110,
			want: []want{
				{StateBehind, "1.0.0", ActionLoad, "", ""},
				{StateBehind, "1.0.0", ActionReplicate, "", "replica: receives 1.1.0 from 127.0.0.1:7001"},
				{StateBehind, "1.0.0", ActionReplicate, "", "replica: receives 1.1.0 from 127.0.0.1:7004"},
			},
			wantPending: true,
		},
		{
			name: "a drifted replica is refused too: replication overwrites it",
			give: []Installed{on(p1, r100.Code), on(r1, drifted)},
			to:   r110,
			want: []want{
				{StateBehind, "1.0.0", ActionLoad, "", ""},
				{StateDrifted, FromDrifted, ActionReplicate, RefusalDrift, ""},
			},
			wantPending: true, wantRefused: 1,
		},
		{
			name: "a replica lagging behind a current primary is left alone",
			give: []Installed{on(p1, r110.Code), on(r1, r100.Code)},
			to:   r110,
			want: []want{
				{StateCurrent, "1.1.0", ActionNone, "", ""},
				{StateBehind, "1.0.0", ActionNone, "", "replica: follows 127.0.0.1:7001 (current), which is not loaded"},
			},
		},
		{
			name: "a replica whose primary was not found",
			give: []Installed{on(p1, r100.Code), on(orphan, r100.Code)},
			to:   r110,
			want: []want{
				{StateBehind, "1.0.0", ActionLoad, "", ""},
				{StateBehind, "1.0.0", ActionNone, "", "replica of 127.0.0.1:9999, which was not found"},
			},
			wantPending: true,
		},
		{
			name: "mixed cluster",
			give: []Installed{
				on(p1, r110.Code), on(p2, r100.Code), on(p3, ""),
				on(r1, r110.Code), on(r2, r100.Code),
			},
			to: r110,
			want: []want{
				{StateCurrent, "1.1.0", ActionNone, "", ""},
				{StateBehind, "1.0.0", ActionLoad, "", ""},
				{StateAbsent, "", ActionLoad, "", ""},
				{StateCurrent, "1.1.0", ActionNone, "", ""},
				{StateBehind, "1.0.0", ActionReplicate, "", ""},
			},
			wantPending: true,
		},
		{
			name: "mixed cluster with drift, downgrade and current",
			give: []Installed{on(p1, drifted), on(p2, r110.Code), on(p3, r100.Code)},
			to:   r100,
			want: []want{
				{StateDrifted, FromDrifted, ActionLoad, RefusalDrift, ""},
				{StateAhead, "1.1.0", ActionLoad, RefusalDowngrade, ""},
				{StateCurrent, "1.0.0", ActionNone, "", ""},
			},
			wantPending: true, wantRefused: 2,
		},
		{
			name: "an unreachable primary is refused",
			give: []Installed{on(p1, r100.Code), {Node: p2, Unreachable: down}},
			to:   r110,
			want: []want{
				{StateBehind, "1.0.0", ActionLoad, "", ""},
				{StateUnreachable, "", ActionNone, RefusalUnreachable, "unreachable: " + down.Error()},
			},
			wantPending: true, wantRefused: 1,
		},
		{
			name:  "an unreachable primary, forced, is left out with its replica",
			give:  []Installed{on(p1, r100.Code), {Node: p2, Unreachable: down}, on(r2, r100.Code)},
			to:    r110,
			force: true,
			want: []want{
				{StateBehind, "1.0.0", ActionLoad, "", ""},
				{StateUnreachable, "", ActionNone, RefusalUnreachable, "unreachable: " + down.Error() + "; left out (forced): NOT deployed"},
				{StateBehind, "1.0.0", ActionNone, "", ""},
			},
			wantPending: true,
		},
		{
			name: "only replicas behind: nothing pending",
			give: []Installed{on(p1, r110.Code), on(r1, "")},
			to:   r110,
			want: []want{
				{StateCurrent, "1.1.0", ActionNone, "", ""},
				{StateAbsent, "", ActionNone, "", ""},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPlan(tt.give, tt.to, tt.force)
			if p.To.Version != tt.to.Version || p.Force != tt.force {
				t.Errorf("plan to %s force %v, want %s force %v", p.To.Version, p.Force, tt.to.Version, tt.force)
			}
			if len(p.Steps) != len(tt.want) {
				t.Fatalf("%d steps, want %d", len(p.Steps), len(tt.want))
			}
			for i, w := range tt.want {
				s := p.Steps[i]
				got := want{s.State, s.From, s.Action, s.Refusal, s.Reason}
				if w.reason == "" {
					got.reason = ""
				}
				if got != w {
					t.Errorf("step %d (%s): got %+v, want %+v", i, s.Node.Addr, got, w)
				}
				if s.Node != tt.give[i].Node || s.To != tt.to.Version || s.Code != tt.give[i].Code {
					t.Errorf("step %d: node %+v to %q, want %+v to %q", i, s.Node, s.To, tt.give[i].Node, tt.to.Version)
				}
				if s.Reason == "" {
					t.Errorf("step %d (%s): no reason", i, s.Node.Addr)
				}
			}
			if got := p.Pending(); got != tt.wantPending {
				t.Errorf("Pending() = %v, want %v", got, tt.wantPending)
			}
			if got := len(p.Refused()); got != tt.wantRefused {
				t.Errorf("Refused() has %d steps, want %d", got, tt.wantRefused)
			}
		})
	}
}

// TestIdentify: code is a release only with the release's code and the Lua engine.
func TestIdentify(t *testing.T) {
	n := primary("127.0.0.1:7001")
	tests := []struct {
		name               string
		code, engine       string
		wantVersion, wantD string
	}{
		{name: "absent"},
		{name: "a release", code: r110.Code, engine: "LUA", wantVersion: "1.1.0", wantD: "1.1.0"},
		{name: "engine in lower case", code: r110.Code, engine: "lua", wantVersion: "1.1.0", wantD: "1.1.0"},
		{name: "engine not told", code: r110.Code, wantVersion: "1.1.0", wantD: "1.1.0"},
		{name: "a release's code on another engine is drifted", code: r110.Code, engine: "JS", wantD: "1.1.0"},
		{name: "drifted", code: drifted, engine: "LUA", wantD: "1.1.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Identify(n, tt.code, tt.engine, set)
			if got.Version != tt.wantVersion || got.Declared != tt.wantD || got.Code != tt.code || got.Node != n {
				t.Errorf("Identify = %+v, want version %q declared %q", got, tt.wantVersion, tt.wantD)
			}
			if tt.engine == "JS" && NewPlan([]Installed{got}, r110, false).Steps[0].State != StateDrifted {
				t.Errorf("the release's code on another engine is not drifted")
			}
		})
	}
}

// TestPlanAccountsForEveryNode: a node the cluster holds to be down, one that did not answer
// and one that cannot run Functions are each a step of their own, never current, and a plan
// with any of them is not Current.
func TestPlanAccountsForEveryNode(t *testing.T) {
	p1, p2, p3 := primary("127.0.0.1:7001"), primary("127.0.0.1:7002"), primary("127.0.0.1:7003")
	failed := p2
	failed.Down = "flagged fail by the cluster"
	r3 := replica("127.0.0.1:7006", p3.Addr)
	noFunctions := Installed{Node: p3, Unsupported: "FUNCTION is not a command here"}
	tests := []struct {
		name            string
		give            []Installed
		force           bool
		wantStates      []State
		wantReasons     []string
		wantCurrent     bool
		wantUnreachable int
		wantUnsupported int
		wantRefused     int
	}{
		{
			name:        "all current",
			give:        []Installed{on(p1, r110.Code)},
			wantStates:  []State{StateCurrent},
			wantCurrent: true,
		},
		{
			name:            "a node flagged fail, not dialled: unreachable, refused",
			give:            []Installed{on(p1, r110.Code), {Node: failed}},
			wantStates:      []State{StateCurrent, StateUnreachable},
			wantReasons:     []string{"already 1.1.0", "unreachable: flagged fail by the cluster"},
			wantUnreachable: 1, wantRefused: 1,
		},
		{
			name:            "forced: left out, NOT deployed",
			give:            []Installed{on(p1, r110.Code), {Node: failed}},
			force:           true,
			wantStates:      []State{StateCurrent, StateUnreachable},
			wantReasons:     []string{"already 1.1.0", "unreachable: flagged fail by the cluster; left out (forced): NOT deployed"},
			wantUnreachable: 1,
		},
		{
			name:            "unsupported: no refusal (force cannot help), its replica not found loaded",
			give:            []Installed{on(p1, r110.Code), noFunctions, {Node: r3, Unsupported: "FUNCTION is not a command here"}},
			force:           true,
			wantStates:      []State{StateCurrent, StateUnsupported, StateUnsupported},
			wantReasons:     []string{"already 1.1.0", "unsupported: FUNCTION is not a command here", "unsupported: FUNCTION is not a command here"},
			wantUnsupported: 2,
		},
		{
			name:        "a lagging replica: nothing to load, not current",
			give:        []Installed{on(p1, r110.Code), on(replica("127.0.0.1:7004", p1.Addr), r100.Code)},
			wantStates:  []State{StateCurrent, StateBehind},
			wantCurrent: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPlan(tt.give, r110, tt.force)
			for i, s := range p.Steps {
				if s.State != tt.wantStates[i] {
					t.Errorf("%s: %s, want %s", s.Node.Addr, s.State, tt.wantStates[i])
				}
				if tt.wantReasons != nil && s.Reason != tt.wantReasons[i] {
					t.Errorf("%s: reason %q, want %q", s.Node.Addr, s.Reason, tt.wantReasons[i])
				}
				if !s.read() && s.Action != ActionNone {
					t.Errorf("%s: %s, yet action %s", s.Node.Addr, s.State, s.Action)
				}
			}
			if p.Current() != tt.wantCurrent || len(p.Unreachable()) != tt.wantUnreachable ||
				len(p.Unsupported()) != tt.wantUnsupported || len(p.Refused()) != tt.wantRefused {
				t.Errorf("Current %v, %d unreachable, %d unsupported, %d refused; want %v, %d, %d, %d",
					p.Current(), len(p.Unreachable()), len(p.Unsupported()), len(p.Refused()),
					tt.wantCurrent, tt.wantUnreachable, tt.wantUnsupported, tt.wantRefused)
			}
		})
	}
}

func TestRefusedError(t *testing.T) {
	in := []Installed{
		on(primary("127.0.0.1:7001"), drifted),
		on(primary("127.0.0.1:7002"), r110.Code),
		on(primary("127.0.0.1:7003"), r200.Code),
	}
	err := &RefusedError{Steps: NewPlan(in, r100, false).Refused()}
	want := "deployer: refused: 127.0.0.1:7001 has drifted code (declares 1.1.0); " +
		"127.0.0.1:7002 would downgrade 1.1.0 to 1.0.0; " +
		"127.0.0.1:7003 would change major version 2.0.0 to 1.0.0"
	if err.Error() != want {
		t.Errorf("got  %s\nwant %s", err, want)
	}
}

func TestPlanLagging(t *testing.T) {
	p1, p2 := primary("127.0.0.1:7001"), primary("127.0.0.1:7002")
	r1, r2 := replica("127.0.0.1:7004", p1.Addr), replica("127.0.0.1:7005", p2.Addr)
	chained := replica("127.0.0.1:7006", r1.Addr)
	orphan := replica("127.0.0.1:7007", "127.0.0.1:9999")
	down := errors.New("connect: connection refused")
	tests := []struct {
		name        string
		give        []Installed
		to          versions.Release
		want        []string // addresses of the lagging replicas
		wantPending bool
		// wantWarned: the replicas warned of as replica-lagging, when not want: those
		// whose primary is loaded are not Lagging (they receive the release), but they do
		// run other code than their primary.
		wantWarned []string
	}{
		{
			name: "all current",
			give: []Installed{on(p1, r110.Code), on(r1, r110.Code)},
			to:   r110,
		},
		{
			name: "a replica behind a current primary",
			give: []Installed{on(p1, r110.Code), on(r1, r100.Code)},
			to:   r110,
			want: []string{r1.Addr},
		},
		{
			name: "a replica with no library under a current primary",
			give: []Installed{on(p1, r110.Code), on(r1, ""), on(chained, "")},
			to:   r110,
			want: []string{r1.Addr, chained.Addr},
		},
		{
			name: "a drifted replica, its primary not loaded",
			give: []Installed{on(p1, r110.Code), on(r1, drifted), on(p2, r100.Code), on(r2, r100.Code)},
			to:   r110,
			want: []string{r1.Addr}, wantPending: true,
		},
		{
			name:        "a replica whose primary is loaded receives it: not lagging, but warned of",
			give:        []Installed{on(p1, r100.Code), on(r1, "")},
			to:          r110,
			wantPending: true,
			wantWarned:  []string{r1.Addr},
		},
		{
			name:        "a replica that runs what its primary runs, both to be loaded: not warned of",
			give:        []Installed{on(p1, r100.Code), on(r1, r100.Code)},
			to:          r110,
			wantPending: true,
		},
		{
			name: "unknown: an unreachable replica, an unreachable primary, a missing primary",
			give: []Installed{{Node: p1, Unreachable: down}, on(r1, ""), on(p2, r110.Code), {Node: r2, Unreachable: down}, on(orphan, "")},
			to:   r110,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPlan(tt.give, tt.to, true)
			var got []string
			for _, s := range p.Lagging() {
				got = append(got, s.Node.Addr)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Lagging() = %v, want %v", got, tt.want)
			}
			// Each lagging replica is a warning of its own, which reaches status, diff and
			// their exit code.
			var warned []string
			for _, w := range p.Warnings() {
				if w.ID == WarnReplicaLagging && strings.Contains(w.Text, "is its replication broken?") {
					warned = append(warned, w.Addr)
				}
			}
			wantWarned := tt.want
			if tt.wantWarned != nil {
				wantWarned = tt.wantWarned
			}
			if !slices.Equal(warned, wantWarned) {
				t.Errorf("replica-lagging warnings on %v, want %v", warned, wantWarned)
			}
			for _, in := range tt.give {
				if len(in.Warnings) > 0 {
					t.Errorf("NewPlan wrote into the Installed it was given: %v", in.Warnings)
				}
			}
			if p.Pending() != tt.wantPending {
				t.Errorf("Pending() = %v, want %v", p.Pending(), tt.wantPending)
			}
		})
	}
}

// TestPlanCheck: what Apply refuses before touching a node, in its order of precedence, and
// that force overrides the safety checks but not an unsupported node.
func TestPlanCheck(t *testing.T) {
	p1, p2 := primary("127.0.0.1:7001"), primary("127.0.0.1:7002")
	unsupported := Installed{Node: p2, Unsupported: "FUNCTION is not a command here"}
	down := Installed{Node: p2, Unreachable: errors.New("connect: connection refused")}
	tests := []struct {
		name  string
		give  []Installed
		force bool
		want  func(error) bool
	}{
		{
			name: "no nodes",
			want: func(err error) bool { return errors.Is(err, ErrNoNodes) },
		},
		{
			name: "current: nothing refused",
			give: []Installed{on(p1, r110.Code)},
			want: func(err error) bool { return err == nil },
		},
		{
			name: "upgrade: nothing refused",
			give: []Installed{on(p1, r100.Code)},
			want: func(err error) bool { return err == nil },
		},
		{
			name: "drift",
			give: []Installed{on(p1, drifted)},
			want: func(err error) bool {
				var re *RefusedError
				return errors.As(err, &re) && len(re.Steps) == 1 && re.Steps[0].Refusal == RefusalDrift
			},
		},
		{
			name:  "drift, forced",
			give:  []Installed{on(p1, drifted)},
			force: true,
			want:  func(err error) bool { return err == nil },
		},
		{
			name: "unreachable",
			give: []Installed{on(p1, r100.Code), down},
			want: func(err error) bool {
				var re *RefusedError
				return errors.As(err, &re) && len(re.Steps) == 1 && re.Steps[0].Refusal == RefusalUnreachable
			},
		},
		{
			name:  "unreachable, forced: left out by Apply, not refused",
			give:  []Installed{on(p1, r100.Code), down},
			force: true,
			want:  func(err error) bool { return err == nil },
		},
		{
			name: "unsupported before refused",
			give: []Installed{on(p1, drifted), unsupported},
			want: func(err error) bool { var ue *UnsupportedError; return errors.As(err, &ue) && len(ue.Steps) == 1 },
		},
		{
			name:  "unsupported, forced: still refused",
			give:  []Installed{on(p1, r100.Code), unsupported},
			force: true,
			want:  func(err error) bool { var ue *UnsupportedError; return errors.As(err, &ue) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := NewPlan(tt.give, r110, tt.force).Check(); !tt.want(err) {
				t.Errorf("Check() = %v", err)
			}
		})
	}
}
