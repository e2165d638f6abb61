package deployer

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rlfn/rlfn/versions"
)

// TestDecide: a reconcile pass loads every primary that lacks the pinned release, each in a
// plan of its own with its replicas; drift, a downgrade and a major change are held unless
// forced; unread nodes are left for the next pass, forced or not; replicas are never loaded.
func TestDecide(t *testing.T) {
	p1, p2, p3, p4 := primary("127.0.0.1:7001"), primary("127.0.0.1:7002"), primary("127.0.0.1:7003"), primary("127.0.0.1:7004")
	r1, r2 := replica("127.0.0.1:7011", p1.Addr), replica("127.0.0.1:7012", p2.Addr)
	down := Installed{Node: primary("127.0.0.1:7009"), Unreachable: errors.New("connection refused")}
	unsupported := Installed{Node: primary("127.0.0.1:7008"), Unsupported: "FUNCTION is not a command here"}
	type plan struct {
		addrs   []string // the plan's nodes, primary first
		actions []Action
	}
	for _, tt := range []struct {
		name    string
		give    []Installed
		force   bool
		pinned  versions.Release // default r110
		loads   []plan
		held    []string
		unread  []string
		current int
	}{
		{name: "every primary current", give: []Installed{on(p1, r110.Code), on(r1, r110.Code), on(p2, r110.Code)}, current: 2},
		{name: "a joined primary with no library", give: []Installed{on(p1, r110.Code), on(p2, "")}, current: 1,
			loads: []plan{{[]string{p2.Addr}, []Action{ActionLoad}}}},
		{name: "a primary behind, with its replica", give: []Installed{on(p1, r110.Code), on(p2, r100.Code), on(r2, r100.Code)}, current: 1,
			loads: []plan{{[]string{p2.Addr, r2.Addr}, []Action{ActionLoad, ActionReplicate}}}},
		{name: "two to load: a plan each", give: []Installed{on(p1, ""), on(r1, ""), on(p2, r100.Code), on(r2, r100.Code)},
			loads: []plan{{[]string{p1.Addr, r1.Addr}, []Action{ActionLoad, ActionReplicate}}, {[]string{p2.Addr, r2.Addr}, []Action{ActionLoad, ActionReplicate}}}},
		{name: "drift, major and downgrade held; the absent one loaded", pinned: r100, give: []Installed{on(p1, drifted), on(p2, r200.Code), on(p3, r110.Code), on(p4, "")},
			loads: []plan{{[]string{p4.Addr}, []Action{ActionLoad}}}, held: []string{p1.Addr, p2.Addr, p3.Addr}},
		{name: "forced: drift and major loaded", force: true, give: []Installed{on(p1, drifted), on(p2, r200.Code), on(p3, r110.Code)}, current: 1,
			loads: []plan{{[]string{p1.Addr}, []Action{ActionLoad}}, {[]string{p2.Addr}, []Action{ActionLoad}}}},
		{name: "unread nodes left for the next pass, forced or not", force: true, give: []Installed{on(p1, ""), down, unsupported},
			loads: []plan{{[]string{p1.Addr}, []Action{ActionLoad}}}, unread: []string{down.Node.Addr, unsupported.Node.Addr}},
		{name: "a replica lagging behind a current primary is not loaded", give: []Installed{on(p1, r110.Code), on(r1, r100.Code)}, current: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pinned := r110
			if tt.pinned.Code != "" {
				pinned = tt.pinned
			}
			d := Decide(tt.give, pinned, tt.force)
			if len(d.Loads) != len(tt.loads) {
				t.Fatalf("Loads = %d plans, want %d: %+v", len(d.Loads), len(tt.loads), d.Loads)
			}
			for i, p := range d.Loads {
				var addrs []string
				var actions []Action
				for _, s := range p.Steps {
					addrs, actions = append(addrs, s.Node.Addr), append(actions, s.Action)
				}
				if !slices.Equal(addrs, tt.loads[i].addrs) || !slices.Equal(actions, tt.loads[i].actions) {
					t.Errorf("Loads[%d] = %v %v, want %v %v", i, addrs, actions, tt.loads[i].addrs, tt.loads[i].actions)
				}
				if p.To.Version != pinned.Version || p.Force != tt.force || p.Check() != nil {
					t.Errorf("Loads[%d]: to %s force %v check %v", i, p.To.Version, p.Force, p.Check())
				}
			}
			addrs := func(steps []Step) []string {
				var out []string
				for _, s := range steps {
					out = append(out, s.Node.Addr)
				}
				return out
			}
			if got := addrs(d.Held); !slices.Equal(got, tt.held) {
				t.Errorf("Held = %v, want %v", got, tt.held)
			}
			if got := addrs(d.Unread); !slices.Equal(got, tt.unread) {
				t.Errorf("Unread = %v, want %v", got, tt.unread)
			}
			if d.Current != tt.current {
				t.Errorf("Current = %d, want %d", d.Current, tt.current)
			}
		})
	}
}

// TestBackoff: a node whose load failed is tried again after one interval, then twice as
// long each time up to the maximum; a success starts it over. Other nodes are not held up.
func TestBackoff(t *testing.T) {
	b := newBackoff(time.Second, 10*time.Second)
	t0 := time.Unix(1000, 0)
	if !b.ready("a", t0) {
		t.Fatal("a node never tried is not ready")
	}
	var waits []time.Duration
	now := t0
	for range 6 {
		next := b.failed("a", now)
		waits = append(waits, next.Sub(now))
		if b.ready("a", next.Add(-time.Millisecond)) || !b.ready("a", next) {
			t.Errorf("ready before %v or not at it", next.Sub(t0))
		}
		if !b.ready("b", now) {
			t.Error("another node is held up")
		}
		now = next
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	if !slices.Equal(waits, want) {
		t.Errorf("waits %v, want %v", waits, want)
	}
	b.ok("a")
	if !b.ready("a", now) || b.failed("a", now).Sub(now) != time.Second {
		t.Error("a success does not start the back-off over")
	}
}
