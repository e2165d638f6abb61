package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/aymanbagabas/go-udiff"

	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/versions"
)

// Human output. Each function renders data the deployer returned, so golden files pin it
// without a server; the deployer returns data and renders none of it (a deploy's report is
// rendered here and in deploy --json, nowhere else). Colour goes on the last column only: escape codes would upset tabwriter's
// alignment of any column after them. Every string a server supplies (an address it
// announces, a replica's primary, its errors, its version in a warning, the code it runs)
// goes through printable: a hostile or broken server must not break a table's rows nor
// send the terminal commands.

// renderStatus prints one row per node; SLOTS only means something in a cluster.
func renderStatus(out io.Writer, p palette, rows []statusRow, cluster bool) error {
	t := newTable(out, "ADDR", "ROLE", "SLOTS", "VERSION", "STATE")
	for _, r := range rows {
		version := r.Version
		switch {
		case r.State == string(deployer.StateDrifted) && r.Declared != "":
			version = "(declares " + r.Declared + ")"
		case version == "":
			version = "-"
		}
		role, slots := r.Role, fmt.Sprint(r.Slots)
		if !cluster {
			slots = "-"
		}
		if r.Role == string(deployer.RoleReplica) {
			role, slots = "replica of "+printable(r.Primary), "-"
		}
		state, colour := r.State, r.State
		switch {
		case r.Error != "":
			state += ": " + printable(r.Error)
		case r.Gap != "":
			state += ": " + printable(r.Gap)
			colour = "gap" // red, as every state that is a problem
		}
		t.row(printable(r.Addr), role, slots, printable(version), p.state(colour, state))
	}
	if err := t.flush(); err != nil {
		return err
	}
	var ws []deployer.Warning
	for _, r := range rows {
		for _, w := range r.Warnings {
			ws = append(ws, deployer.Warning{ID: w.ID, Addr: w.Addr, Text: w.Text})
		}
	}
	renderWarnings(out, p, ws)
	return nil
}

// renderWarnings prints one line per warning, the same warning on several nodes (a cluster
// of one server version) once with their addresses.
func renderWarnings(w io.Writer, p palette, ws []deployer.Warning) {
	for _, g := range groupWarnings(ws) {
		g.w.Addr = printableList(g.addrs)
		g.w.Text = printable(g.w.Text)
		fmt.Fprintf(w, "%s: %s\n", p.yellow("Warning"), g.w)
	}
}

func (p palette) state(state, text string) string {
	switch state {
	case string(deployer.StateCurrent):
		return p.green(text)
	case string(deployer.StateBehind), string(deployer.StateAbsent):
		return p.yellow(text)
	}
	return p.red(text)
}

// renderPlan prints what a deploy of plan would do, node by node: every node the target
// knows of, unreachable and unsupported ones included.
func renderPlan(w io.Writer, p palette, plan deployer.Plan) error {
	loads, primaries, replicas, refused := 0, 0, 0, len(plan.Refused())
	for _, s := range plan.Steps {
		if s.Action == deployer.ActionLoad {
			loads++
		}
		if s.Node.Role == deployer.RoleReplica {
			replicas++
		} else {
			primaries++
		}
	}
	unreachable, unsupported := plan.Unreachable(), plan.Unsupported()
	switch {
	case len(plan.Steps) == 0:
		fmt.Fprintln(w, "No nodes found.")
		return nil
	case plan.Current():
		fmt.Fprintf(w, "Plan: nothing to do, every node runs %s.\n", plan.To.Version)
	case loads == 0:
		fmt.Fprintf(w, "Plan: nothing to load, but not every node runs %s.\n", plan.To.Version)
	default:
		fmt.Fprintf(w, "Plan: load %s on %s of %d", plan.To.Version, count(loads, "primary", "primaries"), primaries)
		if replicas > 0 {
			fmt.Fprintf(w, "; %s", count(replicas, "replica follows its primary", "replicas follow their primaries"))
		}
		fmt.Fprintln(w, ".")
	}
	if len(unreachable) > 0 {
		what := "a deploy is refused until --force, which leaves them out: they are NOT deployed"
		if plan.Force {
			what = "left out by --force: they are NOT deployed"
		}
		fmt.Fprintf(w, "%s: %s (%s); %s.\n", p.red("Unreachable"), count(len(unreachable), "node", "nodes"), stepAddrs(unreachable), what)
	}
	if len(unsupported) > 0 {
		fmt.Fprintf(w, "%s: %s (%s) cannot run Functions: no deploy can reach them.\n", p.red("Unsupported"),
			count(len(unsupported), "node", "nodes"), stepAddrs(unsupported))
	}
	if refused > 0 {
		fmt.Fprintf(w, "Refused: %s a safety check; --force overrides.\n", count(refused, "node fails", "nodes fail"))
	}
	renderWarnings(w, p, plan.Warnings())
	t := newTable(w, "ADDR", "ROLE", "FROM", "TO", "ACTION")
	for _, s := range plan.Steps {
		action := printable(s.Reason)
		if s.Refusal != "" && !plan.Force {
			action = "refused: " + action
		}
		colour := p.cyan
		switch {
		case s.Refusal != "" && !plan.Force, s.State == deployer.StateUnreachable, s.State == deployer.StateUnsupported:
			colour = p.red
		case s.Action == deployer.ActionLoad:
			colour = p.yellow
		}
		t.row(printable(s.Node.Addr), string(s.Node.Role), stepFrom(s), plan.To.Version, colour(action))
	}
	return t.flush()
}

func stepAddrs(steps []deployer.Step) string {
	out := make([]string, 0, len(steps))
	for _, s := range steps {
		out = append(out, s.Node.Addr)
	}
	return printableList(out)
}

// printableList joins addresses for people, each printable.
func printableList(addrs []string) string {
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = printable(a)
	}
	return strings.Join(out, ", ")
}

// stepFrom is what a node runs, for the FROM column: a release, "-" (absent), or its state.
func stepFrom(s deployer.Step) string {
	switch s.State {
	case deployer.StateAbsent:
		return "-"
	case deployer.StateDrifted, deployer.StateUnreachable, deployer.StateUnsupported:
		return string(s.State)
	}
	if s.From == "" {
		return "-"
	}
	return s.From
}

// renderDiff prints a unified diff from each distinct code the nodes run to the plan's code,
// naming the nodes that run it. A node without the library gets one line, not the whole file.
func renderDiff(w io.Writer, p palette, plan deployer.Plan) error {
	for _, g := range groupByCode(plan) {
		s := g.step
		switch {
		case s.State == deployer.StateAbsent:
			fmt.Fprintf(w, "\n%s: no library; %s (%d lines) will be loaded.\n", printableList(g.addrs),
				plan.To.Version, strings.Count(plan.To.Code, "\n"))
			continue
		case s.Code == plan.To.Code:
			continue
		}
		text := g.unified(plan.To)
		fmt.Fprintln(w)
		for _, line := range strings.SplitAfter(text, "\n") {
			// A line of the server's code (or its header, which names its nodes) is shown as
			// it is, tabs and all, unless it holds another control character.
			if body, nl := strings.CutSuffix(line, "\n"); !prints(body, true) {
				line = body[:1] + printable(body[1:]) // after the diff's +, - or space
				if nl {
					line += "\n"
				}
			}
			switch {
			case strings.HasPrefix(line, "+++"), strings.HasPrefix(line, "---"):
				line = p.bold(strings.TrimSuffix(line, "\n")) + "\n"
			case strings.HasPrefix(line, "+"):
				line = p.green(strings.TrimSuffix(line, "\n")) + "\n"
			case strings.HasPrefix(line, "-"):
				line = p.red(strings.TrimSuffix(line, "\n")) + "\n"
			case strings.HasPrefix(line, "@@"):
				line = p.cyan(strings.TrimSuffix(line, "\n")) + "\n"
			}
			if _, err := io.WriteString(w, line); err != nil {
				return err
			}
		}
	}
	return nil
}

type codeGroup struct {
	step  deployer.Step // the first node's step; every node in the group runs its FromCode
	addrs []string
}

// unified is the diff from the group's code to release to.
func (g codeGroup) unified(to versions.Release) string {
	// The header is one line by the diff's format, whatever a server announced as its address.
	from := "ratelimit " + stepFrom(g.step) + " on " + printableList(g.addrs)
	return udiff.Unified(from, "ratelimit "+to.Version, g.step.Code, to.Code)
}

// groupByCode gathers the primaries that were read (what a deploy replaces) by the code
// they run, in the plan's order. An unreachable or unsupported node has no code to diff.
func groupByCode(plan deployer.Plan) []codeGroup {
	var groups []codeGroup
	index := map[string]int{}
	for _, s := range plan.Steps {
		if s.Node.Role != deployer.RolePrimary || s.State == deployer.StateUnreachable || s.State == deployer.StateUnsupported {
			continue
		}
		key := string(s.State) + "\x00" + s.Code
		i, ok := index[key]
		if !ok {
			i = len(groups)
			index[key] = i
			groups = append(groups, codeGroup{step: s})
		}
		groups[i].addrs = append(groups[i].addrs, s.Node.Addr)
	}
	for _, g := range groups {
		sort.Strings(g.addrs)
	}
	return groups
}

// renderReport prints what a deploy did, node by node, and one summary line.
func renderReport(w io.Writer, p palette, r deployer.Report) error {
	t := newTable(w, "ADDR", "ROLE", "FROM", "TO", "TIME", "OUTCOME")
	for _, n := range r.Nodes {
		from := n.From
		if from == "" {
			from = "-"
		}
		outcome := string(n.Outcome)
		if n.Err != nil {
			outcome += ": " + printable(oneLine(n.Err.Error()))
		}
		colour := p.green
		switch n.Outcome {
		case deployer.OutcomeFailed, deployer.OutcomeRestoreFailed, deployer.OutcomeLeftOut, deployer.OutcomeLagging:
			colour = p.red
		case deployer.OutcomeRestored, deployer.OutcomeSkipped:
			colour = p.yellow
		}
		t.row(printable(n.Node.Addr), n.Role(), from, n.To, ms(n.Duration), colour(outcome))
	}
	if err := t.flush(); err != nil {
		return err
	}
	var failed []string
	for _, n := range r.Nodes {
		if n.Outcome == deployer.OutcomeFailed {
			failed = append(failed, n.Node.Addr)
		}
	}
	unrestored, notDeployed := addrs(r.NotRestored()), r.NotDeployed()
	switch {
	case len(unrestored) > 0:
		fmt.Fprintf(w, "%s: deploy of %s failed after %s and %s NOT restored: %s. Check them with rlfn status.\n",
			p.red("ATTENTION"), r.To, ms(r.Duration), count(len(unrestored), "node was", "nodes were"), printableList(unrestored))
	case r.RolledBack:
		fmt.Fprintf(w, "Deploy of %s failed after %s; every node it changed was restored.\n", r.To, ms(r.Duration))
	case len(failed) > 0:
		fmt.Fprintf(w, "Deploy of %s failed after %s on %s.\n", r.To, ms(r.Duration), printableList(failed))
	case len(notDeployed) > 0:
		named := make([]string, len(notDeployed))
		for i, n := range notDeployed {
			why := "left out by --force" // unreachable, or its primary is
			if n.Outcome == deployer.OutcomeLagging {
				why = "lagging replica"
			}
			named[i] = printable(n.Node.Addr) + " (" + why + ")"
		}
		fmt.Fprintf(w, "%s: deploy of %s incomplete after %s: %s NOT deployed: %s.\n",
			p.red("ATTENTION"), r.To, ms(r.Duration), count(len(notDeployed), "node was", "nodes were"), strings.Join(named, ", "))
	default:
		fmt.Fprintf(w, "Deployed %s in %s.\n", r.To, ms(r.Duration))
	}
	renderWarnings(w, p, r.Warnings)
	return nil
}

func addrs(nodes []deployer.NodeResult) []string {
	out := make([]string, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, n.Node.Addr)
	}
	return out
}

func ms(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return d.Round(time.Millisecond).String()
}

// count writes n and the noun in the right number: "1 primary", "3 primaries".
func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
