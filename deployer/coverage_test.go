package deployer

import (
	"errors"
	"strings"
	"testing"
)

// TestCoverageWarning: only "no" keeps a node answering while a shard has no primary; yes and
// a setting that could not be read are warned of, each saying what to do.
func TestCoverageWarning(t *testing.T) {
	for _, tt := range []struct {
		give string
		err  error
		want []string // "" when no warning
	}{
		{give: "no"},
		{give: "yes", want: []string{"cluster-require-full-coverage is yes:", "CLUSTERDOWN", "CONFIG SET cluster-require-full-coverage no, and CONFIG REWRITE or the config file"}},
		{err: errors.New("CONFIG GET cluster-require-full-coverage: NOPERM User deployer has no permissions to run the 'config|get' command"),
			want: []string{"could not be read (CONFIG GET cluster-require-full-coverage: NOPERM", "if it is yes, the default", "make sure it is no"}},
		{err: errors.New("CONFIG GET cluster-require-full-coverage: unknown command 'CONFIG'"), want: []string{"could not be read", "unknown command"}},
	} {
		w, ok := coverageWarning(tt.give, tt.err)
		if ok != (len(tt.want) > 0) {
			t.Errorf("%q, %v: warned %v (%q)", tt.give, tt.err, ok, w.Text)
			continue
		}
		if ok && w.ID != WarnFullCoverage {
			t.Errorf("%q, %v: ID %q", tt.give, tt.err, w.ID)
		}
		for _, part := range tt.want {
			if !strings.Contains(w.Text, part) {
				t.Errorf("%q, %v: %q does not say %q", tt.give, tt.err, w.Text, part)
			}
		}
	}
}

// TestGaps: a cluster primary without the release the others run is a Gap, one that owns
// slots a problem (Serving) and one that owns none a warning; a partial rollout, a cluster
// nothing was deployed to, drift, unread nodes, replicas and standalone servers are not.
func TestGaps(t *testing.T) {
	id := func(c byte) string { return strings.Repeat(string(c), 40) }
	primary := func(addr string, slots int, version string) Installed {
		in := Installed{Node: Node{Addr: addr, ID: id(addr[len(addr)-1]), Role: RolePrimary, Slots: slots}, Version: version}
		if version != "" {
			in.Code = "code of " + version
		}
		return in
	}
	drifted := primary("n:9", 100, "")
	drifted.Code = "#!lua name=ratelimit\n-- edited"
	down := primary("n:8", 100, "")
	down.Node.Down = "flagged fail by the cluster"
	unreachable := primary("n:7", 100, "")
	unreachable.Unreachable = errors.New("connection refused")
	replica := Installed{Node: Node{Addr: "n:6", ID: id('6'), Role: RoleReplica, Primary: "n:1"}}
	standalone := Installed{Node: Node{Addr: "n:5", Role: RolePrimary}}
	for _, tt := range []struct {
		name string
		give []Installed
		want []Gap
	}{
		{"every primary current", []Installed{primary("n:1", 5000, "1.2.0"), primary("n:2", 5000, "1.2.0")}, nil},
		{"a joined node got a slot", []Installed{primary("n:1", 5000, "1.2.0"), primary("n:2", 1, "")},
			[]Gap{{Node: primary("n:2", 1, "").Node, Want: "1.2.0"}}},
		{"a joined node owns no slots", []Installed{primary("n:1", 5000, "1.2.0"), primary("n:2", 0, "")},
			[]Gap{{Node: primary("n:2", 0, "").Node, Want: "1.2.0"}}},
		{"behind the others is no gap", []Installed{primary("n:1", 5000, "1.2.0"), primary("n:2", 5000, "1.2.0"), primary("n:3", 5000, "1.1.0")}, nil},
		{"absent during a partial rollout: the newest", []Installed{primary("n:1", 5000, "1.2.0"), primary("n:2", 5000, "1.1.0"), primary("n:3", 5000, "")},
			[]Gap{{Node: primary("n:3", 5000, "").Node, Want: "1.2.0"}}},
		{"a partial rollout is no gap", []Installed{primary("n:1", 5000, "1.2.0"), primary("n:2", 5000, "1.1.0"), primary("n:3", 5000, "1.1.0")}, nil},
		{"ahead of the others is no gap", []Installed{primary("n:1", 5000, "1.2.0"), primary("n:2", 5000, "1.1.0")}, nil},
		{"nothing deployed", []Installed{primary("n:1", 5000, ""), primary("n:2", 5000, "")}, nil},
		{"an empty primary's release sets no want", []Installed{primary("n:1", 0, "1.2.0"), primary("n:2", 5000, "")}, nil},
		{"drift, unread nodes, replicas and standalone servers", []Installed{primary("n:1", 5000, "1.2.0"), drifted, down, unreachable, replica, standalone}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := Gaps(tt.give)
			if len(got) != len(tt.want) {
				t.Fatalf("Gaps = %+v, want %+v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("Gaps[%d] = %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
	g := Gap{Node: Node{Addr: "127.0.0.1:7464", Slots: 1}, Want: "1.2.0"}
	if !g.Serving() {
		t.Error("a gap with a slot is not Serving")
	}
	want := "127.0.0.1:7464 owns 1 slot and has no library, while the other primaries run 1.2.0: the keys of those slots are decided by the clients' fallback, not the library; run rlfn deploy --to 1.2.0"
	if got := (&GapsError{Gaps: []Gap{g}}).Error(); got != want {
		t.Errorf("GapsError = %q, want %q", got, want)
	}
	g.Node.Slots = 0
	if w := g.Warning(); w.ID != WarnEmptyPrimary || w.Addr != g.Node.Addr || !strings.Contains(w.Text, "owns no slots and has no library while the other primaries run 1.2.0") ||
		!strings.Contains(w.Text, "run rlfn deploy --to 1.2.0") {
		t.Errorf("Warning = %+v", w)
	}
}
