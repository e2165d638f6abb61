package deployer

import (
	"errors"
	"fmt"
	"strings"
)

// ErrLocked is returned by Apply when another deploy holds the lock; it is wrapped with
// the holder and the lease it has left.
var ErrLocked = errors.New("deployer: another deploy holds the lock")

// ErrStalePlan is returned by Apply when the target changed between Plan and Apply (a node
// joined or left, changed role, or runs other code): plan again.
var ErrStalePlan = errors.New("deployer: the target changed since the plan")

// ErrNoNodes is returned by Apply (and Plan.Check) for a plan with no nodes: there is
// nothing to deploy to.
var ErrNoNodes = errors.New("deployer: the plan has no nodes")

// ErrLockLost is the cause of a deploy aborted because its lock expired or was taken over
// while it ran (renewal found another value).
var ErrLockLost = errors.New("deployer: the deploy lock was lost")

// ErrNotDeployed is the cause of a PartialError for a deploy that failed nowhere but left
// nodes out (unreachable, forced past), or found replicas that do not follow their primary
// (OutcomeLagging): they do NOT run the release.
var ErrNotDeployed = errors.New("deployer: not every node runs the release")

// UnsupportedError is returned by Apply (and Plan.Check) for a plan with nodes that cannot
// run Functions: forcing does not help, the server has to change.
type UnsupportedError struct {
	Steps []Step
}

func (e *UnsupportedError) Error() string {
	parts := make([]string, 0, len(e.Steps))
	for _, s := range e.Steps {
		parts = append(parts, s.Node.Addr+" cannot run Functions: "+s.Unsupported)
	}
	return "deployer: " + strings.Join(parts, "; ") + "; " + needs
}

// RefusedError is returned by Apply (and Plan.Check) for a plan with refused steps (drift,
// downgrade, major change, unreachable node) that was not forced. Its message names each
// node and its refusal; how to force a plan is the caller's to say (NewPlan's force).
type RefusedError struct {
	Steps []Step
}

func (e *RefusedError) Error() string {
	parts := make([]string, 0, len(e.Steps))
	for _, s := range e.Steps {
		parts = append(parts, s.Node.Addr+" "+refusalText(s))
	}
	return "deployer: refused: " + strings.Join(parts, "; ")
}

// refusalText says why a step is refused, after the node's address.
func refusalText(s Step) string {
	switch s.Refusal {
	case RefusalDrift:
		if s.Declared != "" {
			return "has drifted code (declares " + s.Declared + ")"
		}
		return "has drifted code"
	case RefusalDowngrade:
		return fmt.Sprintf("would downgrade %s to %s", s.From, s.To)
	case RefusalMajor:
		return fmt.Sprintf("would change major version %s to %s", s.From, s.To)
	case RefusalUnreachable:
		return "is unreachable (" + errText(s.Unreachable) + ")"
	}
	return "is refused: " + string(s.Refusal)
}

// NodeError is a failure on one node. It is the cause a PartialError carries when a node
// failed; NodeResult.Err, which sits beside its node already, holds only the inner Err.
type NodeError struct {
	Addr string
	Err  error
}

func (e *NodeError) Error() string { return e.Addr + ": " + e.Err.Error() }

func (e *NodeError) Unwrap() error { return e.Err }

// PartialError is returned by Apply when a deploy did not complete: Report says, node by
// node, what was loaded, what failed and what was restored. Its message is one line that
// names the failed node and the cause once, then any other node that failed, then every
// node that was NOT restored.
type PartialError struct {
	Report Report
	Err    error
}

func (e *PartialError) Error() string {
	var b strings.Builder
	b.WriteString("deployer: deploy of " + e.Report.To)
	if e.Report.RolledBack {
		b.WriteString(" rolled back")
	} else {
		b.WriteString(" incomplete")
	}
	named := ""
	leftOut := e.Report.LeftOut()
	if e.Err == ErrNotDeployed {
		b.WriteString(": NOT deployed: ")
		for i, n := range e.Report.NotDeployed() {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(n.Node.Addr + " (" + causeText(n.Err) + ")")
		}
		return b.String()
	}
	if ne, ok := e.Err.(*NodeError); ok {
		named = ne.Addr
		b.WriteString(": " + ne.Addr + " failed: " + causeText(ne.Err))
	} else if e.Err != nil {
		b.WriteString(": " + causeText(e.Err))
	}
	var failed, unrestored []string
	for _, n := range e.Report.Nodes {
		switch {
		case n.Outcome == OutcomeFailed && n.Node.Addr != named:
			failed = append(failed, n.Node.Addr)
		case n.Outcome == OutcomeRestoreFailed:
			unrestored = append(unrestored, n.Node.Addr)
		}
	}
	if len(failed) > 0 {
		b.WriteString("; also failed: " + strings.Join(failed, ", "))
	}
	if len(unrestored) > 0 {
		b.WriteString("; NOT restored: " + strings.Join(unrestored, ", "))
	}
	if len(leftOut) > 0 {
		b.WriteString("; left out (unreachable): " + strings.Join(addrsOf(leftOut), ", "))
	}
	// Lagging replicas are awaited beside the verification, so a deploy that failed may
	// have found some: they are not restored (nothing changed them), and still NOT current.
	if lagging := e.Report.Lagging(); len(lagging) > 0 {
		b.WriteString("; lagging replicas: " + strings.Join(addrsOf(lagging), ", "))
	}
	return b.String()
}

func addrsOf(nodes []NodeResult) []string {
	out := make([]string, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, n.Node.Addr)
	}
	return out
}

// causeText is an error on one line, without this package's prefix when it is inside a
// message that already starts with it.
func causeText(err error) string {
	return strings.TrimPrefix(oneLine(err.Error()), "deployer: ")
}

func (e *PartialError) Unwrap() error { return e.Err }

// oneLine keeps a server's multi-line error message on the CLI's one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
