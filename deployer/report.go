package deployer

import "time"

// Outcome is what a deploy did to one node.
type Outcome string

const (
	OutcomeLoaded        Outcome = "loaded"         // a primary now runs the release
	OutcomeUnchanged     Outcome = "unchanged"      // nothing was to be done
	OutcomeReplicated    Outcome = "replicated"     // a replica received the release from its primary
	OutcomeFailed        Outcome = "failed"         // this node's load or verification failed
	OutcomeRestored      Outcome = "restored"       // changed, then put back as it was
	OutcomeRestoreFailed Outcome = "restore-failed" // changed, and could not be put back: look at it
	OutcomeSkipped       Outcome = "skipped"        // not attempted, because the deploy failed first
	// OutcomeLeftOut: the node was unreachable and the plan was forced, so the deploy did
	// not touch it: it is NOT deployed, whatever it runs (see Report.LeftOut); Err says
	// why it was unreachable.
	OutcomeLeftOut Outcome = "left-out"
	// OutcomeLagging: a replica that received nothing from this deploy (its primary was not
	// loaded) and still does not run the release after Options.VerifyTimeout: its
	// replication is broken or far behind, and a deploy never loads a replica. It is NOT
	// deployed; Err says what it was found running.
	OutcomeLagging Outcome = "lagging"
)

// Report is what Apply did, one NodeResult per plan step, same order. It is data: rlfn
// renders it as a table and as JSON.
type Report struct {
	To       string
	Nodes    []NodeResult
	Duration time.Duration
	// Warnings are problems that did not fail the deploy: the lock could not be released
	// (WarnLockRelease; its lease runs out by itself).
	Warnings []Warning
	// RolledBack: the deploy failed and every node it had changed is back as it was. False
	// when any node could not be put back (see NotRestored), or when nothing failed.
	RolledBack bool
}

// LeftOut returns the nodes a forced deploy left out because they were unreachable
// (OutcomeLeftOut): they are NOT deployed, and nothing is known of what they run.
func (r Report) LeftOut() []NodeResult { return r.with(OutcomeLeftOut) }

// Lagging returns the replicas that do not run the release at the end, their replication
// broken (OutcomeLagging): they are NOT deployed.
func (r Report) Lagging() []NodeResult { return r.with(OutcomeLagging) }

// NotDeployed returns the nodes that do not run the release at the end although the deploy
// failed nowhere: those left out, and lagging replicas.
func (r Report) NotDeployed() []NodeResult {
	var out []NodeResult
	for _, n := range r.Nodes {
		if n.Outcome == OutcomeLeftOut || n.Outcome == OutcomeLagging {
			out = append(out, n)
		}
	}
	return out
}

// NotRestored returns the nodes a failed deploy changed and could not put back
// (OutcomeRestoreFailed): look at them.
func (r Report) NotRestored() []NodeResult { return r.with(OutcomeRestoreFailed) }

func (r Report) with(o Outcome) []NodeResult {
	var out []NodeResult
	for _, n := range r.Nodes {
		if n.Outcome == o {
			out = append(out, n)
		}
	}
	return out
}

// NodeResult is what Apply did to one node.
type NodeResult struct {
	Node Node // as planned: Node.Role is its role when the plan was made
	// RoleAfter is the node's role at the end when the deploy saw it change (a failover
	// during the deploy promoted a replica, which restore then put back as a primary, or
	// demoted a primary, which refused a write READONLY); "" when it saw no change.
	RoleAfter Role
	From, To  string // From as in Step: a release, "" for absent, FromDrifted
	Outcome   Outcome
	Err       error         // what went wrong on this node, without its address (Node says it)
	Duration  time.Duration // from the start of this node's load (or verification) to its outcome
}

// Role is the node's role for people: as planned, or how the deploy saw it change, e.g.
// "replica->primary".
func (r NodeResult) Role() string {
	if r.RoleAfter == "" || r.RoleAfter == r.Node.Role {
		return string(r.Node.Role)
	}
	return string(r.Node.Role) + "->" + string(r.RoleAfter)
}
