package deployer

import (
	"context"
	"sync"
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
