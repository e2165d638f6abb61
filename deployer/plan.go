package deployer

import (
	"fmt"

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
	StateUnknown State = "unknown" // could not be inspected (unreachable)
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

// Refusals: the safety checks that block a step unless the plan is forced.
const (
	RefusalDrift       = "drift"       // would overwrite code that matches no release
	RefusalDowngrade   = "downgrade"   // would replace a newer release with an older one
	RefusalMajor       = "major"       // would change the major version (the client contract)
	RefusalUnreachable = "unreachable" // the node could not be inspected; forced, it is left out
)

// FromDrifted is Step.From for a node whose code matches no release.
const FromDrifted = "drifted"

// Plan is what a deploy of To would do, one step per node in the order of the inspected
// nodes (Topology order). NewPlan makes it.
type Plan struct {
	To    versions.Release
	Steps []Step
	Force bool // refusals were overridden: the steps still record them
}

// Step is the plan for one node.
type Step struct {
	Node     Node
	State    State
	From     string // installed release; "" when absent or unknown; FromDrifted for drifted code
	FromCode string // installed code ("" when absent), for the CLI's unified diff
	Declared string // the version the installed code declares, if any (useful for drift)
	To       string
	Action   Action
	Reason   string // why this action, for people
	Refusal  string // the safety check this step trips (Refusal* constants), recorded even when forced
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
	byAddr := make(map[string]int, len(p.Steps))
	for i, s := range p.Steps {
		byAddr[s.Node.Addr] = i
	}
	var out []Step
	for i, s := range p.Steps {
		if s.Node.Role != RoleReplica || s.State == StateUnknown || s.Action == ActionReplicate {
			continue
		}
		root, ok := rootPrimary(p.Steps, byAddr, i)
		if !ok || p.Steps[root].State == StateUnknown {
			continue
		}
		if s.FromCode != p.Steps[root].FromCode {
			out = append(out, s)
		}
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

// NewPlan decides, for every inspected node, what deploying `to` does:
//   - a primary not already running `to` is loaded (ActionLoad), a primary running it is
//     left alone;
//   - a replica is never loaded directly (the server refuses FUNCTION LOAD on a replica):
//     it is ActionReplicate when the primary it follows (through any chain of replicas) is
//     loaded, and ActionNone otherwise;
//   - a node whose code would be replaced is refused when it runs drifted code, a release
//     of another major version, or a newer release (downgrade), in that order of
//     precedence; an unreachable node is refused and, when forced, left out (ActionNone);
//   - with force, refused steps keep their action and their Refusal, so the override is on
//     record.
//
// Installed code is identified against set (Installed.Version is not trusted, so a plan
// can be made from any inspection). An empty target gives an empty plan, no error.
//
// (A function cannot share the name of the type Plan in Go, hence NewPlan.)
func NewPlan(installed []Installed, set versions.Set, to versions.Release, force bool) Plan {
	p := Plan{To: to, Force: force, Steps: make([]Step, len(installed))}
	byAddr := make(map[string]int, len(installed))
	for i, in := range installed {
		p.Steps[i] = classify(in, set, to)
		byAddr[in.Node.Addr] = i
	}
	for i := range p.Steps {
		s := &p.Steps[i]
		switch {
		case s.State == StateUnknown:
			s.Action = ActionNone
			s.Refusal = RefusalUnreachable
			s.Reason = "unreachable: " + errText(installed[i].Err)
			if force {
				s.Reason += "; left out (forced)"
			}
			continue
		case s.Node.Role == RolePrimary:
			if s.State == StateCurrent {
				s.Action, s.Reason = ActionNone, "already "+to.Version
				continue
			}
			s.Action, s.Reason = ActionLoad, loadReason(*s)
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
	return p
}

// classify compares what one node runs with to.
func classify(in Installed, set versions.Set, to versions.Release) Step {
	s := Step{Node: in.Node, To: to.Version, FromCode: in.Code}
	if in.Code != "" {
		s.Declared, _ = versions.Declared(in.Code)
	}
	switch {
	case in.Err != nil:
		s.State = StateUnknown
	case in.Code == "":
		s.State = StateAbsent
	default:
		r, ok := set.Identify(in.Code)
		if !ok {
			s.State, s.From = StateDrifted, FromDrifted
			break
		}
		s.From = r.Version
		switch c := versions.Compare(r.Version, to.Version); {
		case r.Code == to.Code:
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

func refusal(s Step, to versions.Release) string {
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

func loadReason(s Step) string {
	switch s.State {
	case StateAbsent:
		return "absent: load " + s.To
	case StateBehind:
		return "upgrade " + s.From + " -> " + s.To
	case StateAhead:
		return "downgrade " + s.From + " -> " + s.To
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
