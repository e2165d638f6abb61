package deployer

import (
	"errors"
	"fmt"
	"slices"

	"github.com/rlfn/rlfn/versions"
)

// State is what a node runs relative to the release a plan deploys.
type State string

const (
	StateCurrent State = "current" // runs exactly the release
	StateAbsent  State = "absent"  // has no ratelimit library
	StateBehind  State = "behind"  // runs an older release
	StateAhead   State = "ahead"   // runs a newer release: deploying is a downgrade
	StateDrifted State = "drifted" // runs code that matches no release
	// StateUnreachable: the node could not be read: the cluster holds it to be down
	// (Node.Down), or it did not answer (Installed.Unreachable says why).
	StateUnreachable State = "unreachable"
	// StateUnsupported: the node answers but cannot run Functions (Installed.Unsupported
	// says why): no deploy can reach it.
	StateUnsupported State = "unsupported"
)

// Action is what a deploy does to a node.
type Action string

const (
	ActionNone Action = "none"
	// ActionLoad: FUNCTION LOAD REPLACE on this primary.
	ActionLoad Action = "load"
	// ActionReplicate: a replica receives the library from its primary, which loads it;
	// Apply verifies that it did.
	ActionReplicate Action = "replicate"
)

// Refusal is the safety check that blocks a step unless the plan is forced; "" for none.
// Its value is stable: deploy --json prints it.
type Refusal string

const (
	RefusalDrift       Refusal = "drift"       // would overwrite code that matches no release
	RefusalDowngrade   Refusal = "downgrade"   // would replace a newer release with an older one
	RefusalMajor       Refusal = "major"       // would change the major version (the client contract)
	RefusalUnreachable Refusal = "unreachable" // the node could not be read; forced, it is left out (and NOT deployed)
)

// FromDrifted is Step.From for a node whose code matches no release.
const FromDrifted = "drifted"

// Plan is what a deploy of To would do, one step per node in the order of the inspected
// nodes (Topology order), every node the target knows of included. NewPlan makes it.
type Plan struct {
	To    versions.Release
	Steps []Step
	Force bool // refusals were overridden: the steps still record them
}

// Step is the plan for one node: what it runs as Inspect read it, and what a deploy does
// to it.
type Step struct {
	Installed
	State   State
	From    string // installed release; "" when absent, unreachable or unsupported; FromDrifted for drifted code
	To      string
	Action  Action
	Reason  string  // why this action, for people; a refused step's says what is refused
	Refusal Refusal // the safety check this step trips, recorded even when forced
}

// Pending reports whether applying the plan would load anything.
func (p Plan) Pending() bool {
	for _, s := range p.Steps {
		if s.Node.Role == RolePrimary && s.Action == ActionLoad {
			return true
		}
	}
	return false
}

// Lagging returns the replicas that do not run what their primary runs, and will not
// receive anything from this deploy (their primary is not loaded): a replica still
// catching up, or whose replication is broken. A plan with only such replicas is not
// Pending, and Apply changes nothing; this says there is something to look at. Replicas
// whose primary (or they themselves) could not be inspected are not included.
func (p Plan) Lagging() []Step {
	var out []Step
	for _, i := range p.lagging() {
		out = append(out, p.Steps[i])
	}
	return out
}

// lagging is Lagging as indices into Steps.
func (p Plan) lagging() []int {
	var out []int
	for _, i := range p.diverged() {
		if p.Steps[i].Action != ActionReplicate {
			out = append(out, i)
		}
	}
	return out
}

// diverged are the replicas, as indices into Steps, that were read and run other code than
// their primary (through any chain of replicas), which was read too.
func (p Plan) diverged() []int {
	byAddr := make(map[string]int, len(p.Steps))
	for i, s := range p.Steps {
		byAddr[s.Node.Addr] = i
	}
	var out []int
	for i, s := range p.Steps {
		if s.Node.Role != RoleReplica || !s.read() {
			continue
		}
		root, ok := rootPrimary(p.Steps, byAddr, i)
		if !ok || !p.Steps[root].read() {
			continue
		}
		if s.Code != p.Steps[root].Code {
			out = append(out, i)
		}
	}
	return out
}

// read reports whether the node's library was read: it is neither unreachable nor
// unsupported.
func (s Step) read() bool { return s.State != StateUnreachable && s.State != StateUnsupported }

// Unreachable returns the steps of nodes that could not be read: refused unless the plan
// is forced, and then left out, NOT deployed.
func (p Plan) Unreachable() []Step { return p.in(StateUnreachable) }

// Unsupported returns the steps of nodes that cannot run Functions: no deploy, forced or
// not, can reach them.
func (p Plan) Unsupported() []Step { return p.in(StateUnsupported) }

func (p Plan) in(state State) []Step {
	var out []Step
	for _, s := range p.Steps {
		if s.State == state {
			out = append(out, s)
		}
	}
	return out
}

// Current reports whether every node was read and runs exactly the release: a deploy
// would change nothing and leave nothing out.
func (p Plan) Current() bool {
	for _, s := range p.Steps {
		if s.State != StateCurrent {
			return false
		}
	}
	return len(p.Steps) > 0
}

// Warnings are the nodes' warnings (Installed.Warnings), in plan order.
func (p Plan) Warnings() []Warning {
	var out []Warning
	for _, s := range p.Steps {
		out = append(out, s.Warnings...)
	}
	return out
}

// Refused returns the steps a safety check blocks; none when the plan is forced.
func (p Plan) Refused() []Step {
	if p.Force {
		return nil
	}
	var out []Step
	for _, s := range p.Steps {
		if s.Refusal != "" {
			out = append(out, s)
		}
	}
	return out
}

// Check is what Apply refuses a plan for before it touches any node, in this order:
// ErrNoNodes for a plan without nodes, an *UnsupportedError when a node cannot run
// Functions (forced or not: forcing does not help), a *RefusedError when a step trips a
// safety check and the plan is not forced; nil when Apply may go ahead. Apply calls it
// first, and a dry run can call it to refuse exactly what the deploy would.
func (p Plan) Check() error {
	if len(p.Steps) == 0 {
		return ErrNoNodes
	}
	if unsupported := p.Unsupported(); len(unsupported) > 0 {
		return &UnsupportedError{Steps: unsupported}
	}
	if refused := p.Refused(); len(refused) > 0 {
		return &RefusedError{Steps: refused}
	}
	return nil
}

// NewPlan decides, for every inspected node, what deploying `to` does:
//   - a primary not already running `to` is loaded (ActionLoad), a primary running it is
//     left alone;
//   - a replica is never loaded directly (the server refuses FUNCTION LOAD on a replica):
//     it is ActionReplicate when the primary it follows (through any chain of replicas) is
//     loaded, and ActionNone otherwise;
//   - a node whose code would be replaced is refused when it runs drifted code, a release
//     of another major version, or a newer release (downgrade), in that order of
//     precedence; an unreachable node is refused and, when forced, left out (ActionNone);
//   - an unsupported node is ActionNone and no refusal: force cannot help it, so Apply
//     refuses any plan that has one (UnsupportedError);
//   - with force, refused steps keep their action and their Refusal, so the override is on
//     record.
//
// The nodes are taken as Inspect identified them: NewPlan reads no code. An empty target
// gives an empty plan, no error.
//
// (A function cannot share the name of the type Plan in Go, hence NewPlan.)
func NewPlan(installed []Installed, to versions.Release, force bool) Plan {
	p := Plan{To: to, Force: force, Steps: make([]Step, len(installed))}
	byAddr := make(map[string]int, len(installed))
	for i, in := range installed {
		p.Steps[i] = classify(in, to)
		byAddr[in.Node.Addr] = i
	}
	for i := range p.Steps {
		s := &p.Steps[i]
		switch {
		case s.State == StateUnreachable:
			s.Action = ActionNone
			s.Refusal = RefusalUnreachable
			s.Reason = "unreachable: " + errText(s.Unreachable)
			if force {
				s.Reason += "; left out (forced): NOT deployed"
			}
			continue
		case s.State == StateUnsupported:
			s.Action = ActionNone
			s.Reason = "unsupported: " + s.Unsupported
			continue
		case s.Node.Role == RolePrimary:
			if s.State == StateCurrent {
				s.Action, s.Reason = ActionNone, "already "+to.Version
				continue
			}
			s.Action, s.Reason = ActionLoad, loadReason(*s, to)
		default:
			root, ok := rootPrimary(p.Steps, byAddr, i)
			switch {
			case !ok:
				s.Action = ActionNone
				s.Reason = "replica of " + s.Node.Primary + ", which was not found"
				continue
			case p.Steps[root].Action != ActionLoad:
				s.Action, s.Reason = ActionNone, replicaReason(*s, p.Steps[root], to)
				continue
			}
			s.Action = ActionReplicate
			s.Reason = "replica: receives " + to.Version + " from " + s.Node.Primary
		}
		s.Refusal = refusal(*s, to)
	}
	// Every replica that runs other code than its primary is warned of, also one whose
	// primary this deploy loads: its replication may be broken, and then it fails the
	// deploy's verification, which rolls the whole deploy back. status, whose plan is
	// usually of a newer release than the primaries run, must not hide it.
	for _, i := range p.diverged() {
		s := &p.Steps[i]
		root, _ := rootPrimary(p.Steps, byAddr, i)
		text := fmt.Sprintf("replica runs %s while its primary %s runs %s, and a deploy never loads a replica: is its replication broken?",
			stepRuns(*s), p.Steps[root].Node.Addr, stepRuns(p.Steps[root]))
		if s.Action == ActionReplicate {
			text = fmt.Sprintf("replica runs %s while its primary %s runs %s: is its replication broken? If it does not receive %s, the deploy fails verifying it and restores every node",
				stepRuns(*s), p.Steps[root].Node.Addr, stepRuns(p.Steps[root]), to.Version)
		}
		// A copy: the Installed's slice is the caller's.
		s.Warnings = append(slices.Clip(s.Warnings), Warning{ID: WarnReplicaLagging, Addr: s.Node.Addr, Text: text})
	}
	return p
}

// classify compares what one node runs with to.
func classify(in Installed, to versions.Release) Step {
	s := Step{Installed: in, To: to.Version}
	switch {
	case in.Unreachable != nil || in.Node.Down != "":
		s.State = StateUnreachable
		if s.Unreachable == nil {
			s.Unreachable = errors.New(in.Node.Down)
		}
	case in.Unsupported != "":
		s.State = StateUnsupported
	case in.Code == "":
		s.State = StateAbsent
	case in.Version == "":
		s.State, s.From = StateDrifted, FromDrifted
	default:
		s.From = in.Version
		switch c := versions.Compare(in.Version, to.Version); {
		case in.Code == to.Code:
			s.State = StateCurrent
		case c < 0:
			s.State = StateBehind
		case c > 0:
			s.State = StateAhead
		default:
			// Same version number, other code: a release set that disagrees with itself.
			s.State, s.From = StateDrifted, FromDrifted
		}
	}
	return s
}

func refusal(s Step, to versions.Release) Refusal {
	switch {
	case s.State == StateDrifted:
		return RefusalDrift
	case s.From != "" && versions.Major(s.From) != to.Major():
		return RefusalMajor
	case s.State == StateAhead:
		return RefusalDowngrade
	}
	return ""
}

func loadReason(s Step, to versions.Release) string {
	major := ""
	if s.From != "" && s.From != FromDrifted && versions.Major(s.From) != to.Major() {
		major = "major "
	}
	switch s.State {
	case StateAbsent:
		return "absent: load " + s.To
	case StateBehind:
		return major + "upgrade " + s.From + " -> " + s.To
	case StateAhead:
		return major + "downgrade " + s.From + " -> " + s.To
	case StateDrifted:
		if s.Declared != "" {
			return "drifted code (declares " + s.Declared + "): replace with " + s.To
		}
		return "drifted code: replace with " + s.To
	}
	return "load " + s.To
}

// replicaReason explains a replica that receives nothing.
func replicaReason(s, root Step, to versions.Release) string {
	if s.State == StateCurrent {
		return "already " + to.Version
	}
	// e.g. a replica still catching up with a primary that is current.
	return fmt.Sprintf("replica: follows %s (%s), which is not loaded", s.Node.Primary, root.State)
}

// rootPrimary follows a replica's chain of primaries up to a primary; false when a link is
// missing from the plan or the chain loops.
func rootPrimary(steps []Step, byAddr map[string]int, i int) (int, bool) {
	for range len(steps) {
		j, ok := byAddr[steps[i].Node.Primary]
		if !ok {
			return 0, false
		}
		if steps[j].Node.Role == RolePrimary {
			return j, true
		}
		i = j
	}
	return 0, false
}

func errText(err error) string {
	if err == nil {
		return "no reply"
	}
	return oneLine(err.Error())
}
