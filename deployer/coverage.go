package deployer

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/rlfn/rlfn/versions"
)

// fullCoverage is the cluster setting that decides whether a node keeps answering for the
// slots it serves while others have no primary.
const fullCoverage = "cluster-require-full-coverage"

// Coverage warns of every cluster node that would stop answering when any shard has no
// primary: one with cluster-require-full-coverage yes (the servers' default), and one that
// would not say (CONFIG refused by an ACL or a managed service, or no reply), which may be
// just as exposed. Such a node answers every command CLUSTERDOWN from the moment a primary
// is flagged failed until its replica is promoted (a second or more), or for good when it
// has none: for a rate limiter, no decision on any shard.
//
// Every node that is not held to be down is asked, replicas too: a replica's own setting
// decides what it answers (FCALL_RO peeks), and it is the primary's after a failover.
// A standalone server has nothing to cover: no warning.
func (t *Target) Coverage(ctx context.Context) []Warning {
	topo := t.Topology()
	if !topo.Cluster {
		return nil
	}
	ws := make([][]Warning, len(topo.Nodes))
	sem := make(chan struct{}, inspectParallelism)
	var wg sync.WaitGroup
	for i, n := range topo.Nodes {
		if n.Down != "" {
			continue // unreachable, and said so elsewhere
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			c, err := t.conn(n.Addr)
			v := ""
			if err == nil {
				v, err = c.config(ctx, fullCoverage)
			}
			if w, ok := coverageWarning(v, err); ok {
				w.Addr = n.Addr
				ws[i] = []Warning{w}
			}
		})
	}
	wg.Wait()
	var out []Warning
	for _, w := range ws {
		out = append(out, w...)
	}
	return out
}

// coverageWarning is the warning for a node whose setting read v (or err): none for "no".
func coverageWarning(v string, err error) (Warning, bool) {
	switch {
	case err != nil:
		return Warning{ID: WarnFullCoverage, Text: fullCoverage + " could not be read (" + causeText(err) +
			"): if it is yes, the default, this node answers CLUSTERDOWN to every call while any shard has no primary, " +
			"and rate limiting stops on every shard; make sure it is no"}, true
	case v == "no":
		return Warning{}, false
	}
	return Warning{ID: WarnFullCoverage, Text: fullCoverage + " is " + v + ": while any shard has no primary " +
		"(a failover's first seconds, or for good) this node answers CLUSTERDOWN to every call, and rate limiting stops " +
		"on every shard; set it to no on every node (CONFIG SET " + fullCoverage + " no, and CONFIG REWRITE or the config file, so that a restart keeps it)"}, true
}

// Gap is a cluster primary with no library while the cluster's other primaries run a
// release: the keys of its slots are not decided by the library but by each client's
// fallback (local, per process), and nothing else says so. Gaps finds them.
type Gap struct {
	Node Node
	// Want is the release the other primaries run: the newest, during a partial rollout.
	Want string
}

// Serving reports whether the node owns slots now, so that its keys are decided by the
// clients' fallback: a problem. One that owns none (a node just joined) is a warning: it
// will get slots.
func (g Gap) Serving() bool { return g.Node.Slots > 0 }

// Warning is the warning for a gap that owns no slots yet (WarnEmptyPrimary).
func (g Gap) Warning() Warning {
	return Warning{ID: WarnEmptyPrimary, Addr: g.Node.Addr, Text: fmt.Sprintf(
		"primary owns no slots and has no library while the other primaries run %s: once it gets slots their keys are decided by the clients' fallback, not the library; "+
			"run rlfn deploy --to %s (or keep rlfn reconcile running)", g.Want, g.Want)}
}

// GapsError is what status and diff fail with when a primary that owns slots is a Gap:
// one line naming every such node and what to run.
type GapsError struct{ Gaps []Gap }

func (e *GapsError) Error() string {
	parts := make([]string, 0, len(e.Gaps))
	want := ""
	for _, g := range e.Gaps {
		slots := "slots"
		if g.Node.Slots == 1 {
			slots = "slot"
		}
		parts = append(parts, fmt.Sprintf("%s owns %d %s and has no library", g.Node.Addr, g.Node.Slots, slots))
		if want == "" || versions.Compare(g.Want, want) > 0 {
			want = g.Want
		}
	}
	return fmt.Sprintf("%s, while the other primaries run %s: the keys of those slots are decided by the clients' fallback, not the library; run rlfn deploy --to %s",
		strings.Join(parts, "; "), want, want)
}

// Gaps are the cluster primaries with no library while another primary that owns slots
// runs a release. A cluster where no primary has a library is none (nothing was deployed:
// every node says absent), nor is a primary behind the others (a partial rollout: status
// says behind). Primaries that own no slots count as Gaps (Gap.Serving says which) but do
// not decide Want: they serve no key. Unread nodes, replicas and standalone servers are
// never Gaps.
func Gaps(installed []Installed) []Gap {
	var out []Gap
	for i, in := range installed {
		n := in.Node
		if n.Role != RolePrimary || n.ID == "" || !readable(in) || in.Code != "" {
			continue
		}
		want := ""
		for j, o := range installed {
			if j != i && o.Node.Role == RolePrimary && o.Node.Slots > 0 && readable(o) && o.Version != "" &&
				(want == "" || versions.Compare(o.Version, want) > 0) {
				want = o.Version
			}
		}
		if want != "" {
			out = append(out, Gap{Node: n, Want: want})
		}
	}
	return out
}

// readable reports whether in was read: neither unreachable nor unsupported.
func readable(in Installed) bool {
	return in.Unreachable == nil && in.Node.Down == "" && in.Unsupported == ""
}
