package main

import (
	"bufio"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rlfn/rlfn/deployer"
)

// deployCommand is built afresh for each app: cli.App.Setup writes into its commands.
func deployCommand() *cli.Command {
	return &cli.Command{
		OnUsageError: usageErrorHandler,
		Name:         "deploy",
		Usage:        "load a release on every primary, verify every node, restore all on failure",
		ArgsUsage:    " ",
		Description: "deploy loads the release (--to, default the newest embedded) with FUNCTION LOAD REPLACE on\n" +
			"every primary that needs it, including primaries that own no slots, then checks that\n" +
			"every node, replicas included, answers the new rl_version. If a primary refuses or a\n" +
			"node does not verify, every node this run changed gets back exactly what it had.\n" +
			"A deploy --to an older release is the rollback. Drifted code, a downgrade, a change\n" +
			"of major version and an unreachable node are refused (exit 3) unless --force; a forced\n" +
			"deploy leaves unreachable nodes out and exits 1, naming them. A node that cannot run\n" +
			"Functions (unsupported) stops any deploy (exit 1). A replica that does not follow its\n" +
			"primary to the release (lagging) makes it exit 1 too. deploy exits 0 only when every\n" +
			"node runs the release at the end and every warning is accepted (--accept-warning); a\n" +
			"deploy that did all that but printed warnings not accepted exits 4.",
		Flags: []cli.Flag{
			toFlag(),
			&cli.BoolFlag{Name: "yes", Usage: "deploy without asking (required when there is no terminal)"},
			&cli.BoolFlag{Name: "dry-run", Usage: "show the plan, change nothing"},
			&cli.BoolFlag{Name: "force", Usage: "override the safety checks: overwrite drifted code, downgrade, change major version, leave unreachable nodes out"},
			decimalFlag("parallel", "load on `N` primaries at once", 4),
			&cli.DurationFlag{Name: "verify-timeout", Usage: "wait up to `DURATION` for every node to answer the new version", Value: 10 * time.Second},
			jsonFlag(),
		},
		Action: deployAction,
	}
}

func deployAction(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageError(c, "takes no arguments")
	}
	parallel := decimalValue(c, "parallel")
	if parallel < 1 {
		return usageError(c, "--parallel must be at least 1")
	}
	if vt := c.Duration("verify-timeout"); vt <= 0 {
		// The deployer reads 0 as its default: refused, so that it never waits longer than
		// asked.
		return usageError(c, fmt.Sprintf("--verify-timeout must be positive, got %s", vt))
	}
	if vt, timeout := c.Duration("verify-timeout"), c.Duration("timeout"); c.IsSet("verify-timeout") && vt >= timeout {
		// --timeout bounds the whole deploy: a longer verification would be cut short, and
		// the deploy rolled back, by the command's own deadline.
		return usageError(c, fmt.Sprintf("--verify-timeout %s must be shorter than --timeout %s, which bounds the whole deploy: raise --timeout too", vt, timeout))
	}
	ctx, cancel := commandContext(c)
	defer func() { cancel() }() // the one in force at the end: confirming starts another
	force, asJSON := c.Bool("force"), c.Bool("json")
	t, plan, err := planFor(ctx, c, force)
	if err != nil {
		return err
	}
	defer t.Close()
	out := deployJSON{To: plan.To.Version, DryRun: c.Bool("dry-run"), Plan: stepsJSON(plan), Warnings: warningsJSON(plan.Warnings())}
	p := colours(c.App.Writer)
	if !asJSON {
		if err := renderPlan(c.App.Writer, p, plan); err != nil {
			return err
		}
	}
	finish := func(err error) error {
		err = forceAdvice(err)
		if asJSON {
			if err != nil && !isWarnings(err) {
				out.Error = oneLine(err.Error())
			}
			if werr := writeJSON(c.App.Writer, out); werr != nil && err == nil {
				return werr
			}
		}
		return err
	}
	// What Apply would refuse is refused before the question and the dry run, by the same
	// check: a script learns of it either way.
	if err := plan.Check(); err != nil {
		return finish(err)
	}
	if c.Bool("dry-run") {
		// A forced plan with unreachable nodes would leave them out and exit 1: so does its
		// dry run, or a CI check by dry run would pass where the deploy fails.
		if down := plan.Unreachable(); len(down) > 0 {
			addrs := make([]string, len(down))
			for i, s := range down {
				addrs[i] = s.Node.Addr
			}
			return finish(fmt.Errorf("deploy --dry-run: %s unreachable (%s) would be left out, NOT deployed",
				count(len(down), "node", "nodes"), strings.Join(addrs, ", ")))
		}
		return finish(unaccepted(c, plan.Warnings()))
	}
	if plan.Pending() && !c.Bool("yes") {
		if err := confirm(c, plan); err != nil {
			return finish(err)
		}
		// The time a person took to answer is not the command's: the deploy gets its own
		// --timeout, or a slow answer would start it on an expired deadline.
		cancel()
		ctx, cancel = commandContext(c)
	}
	opts := deployer.Options{Parallelism: int(parallel), VerifyTimeout: c.Duration("verify-timeout")}
	if isTerminal(c.App.ErrWriter) {
		opts.Progress = progress(c, colours(c.App.ErrWriter))
	}
	// With nothing to load Apply changes nothing, but it still says whether every node runs
	// the release: a forced plan's unreachable nodes make it an incomplete deploy.
	report, err := t.Apply(ctx, plan, opts)
	var partial *deployer.PartialError
	if !plan.Pending() && err == nil && len(plan.Lagging()) == 0 {
		return finish(unaccepted(c, deployWarnings(plan, report)))
	}
	// From here a report says what happened: loads, or lagging replicas that were waited
	// for (and caught up, or did not), which the plan above warned of.
	out.Report = reportJSONOf(report)
	if !asJSON {
		if err == nil || errors.As(err, &partial) {
			fmt.Fprintln(c.App.Writer)
			if rerr := renderReport(c.App.Writer, p, report); rerr != nil && err == nil {
				err = rerr
			}
		}
	}
	if err == nil {
		err = unaccepted(c, deployWarnings(plan, report))
	}
	return finish(err)
}

// forceAdvice adds to a refusal the flag that overrides it: the deployer's error names each
// node and its safety check, and only the CLI knows how a person forces a plan.
func forceAdvice(err error) error {
	var refused *deployer.RefusedError
	if errors.As(err, &refused) {
		return fmt.Errorf("%w (use --force)", err)
	}
	return err
}

// deployWarnings are the warnings that decide a finished deploy's exit code: the plan's and
// the run's, but not replica-lagging, which the report has settled (a replica that did not
// catch up is OutcomeLagging, and the deploy exits 1).
func deployWarnings(plan deployer.Plan, report deployer.Report) []deployer.Warning {
	var out []deployer.Warning
	for _, w := range plan.Warnings() {
		if w.ID != deployer.WarnReplicaLagging {
			out = append(out, w)
		}
	}
	return append(out, report.Warnings...)
}

// confirm asks on a terminal; without one there is nobody to ask, so it refuses.
func confirm(c *cli.Context, plan deployer.Plan) error {
	if !isTerminal(c.App.Reader) {
		return errors.New("deploy: no terminal to confirm on; review with rlfn diff, then deploy --yes")
	}
	loads := 0
	for _, s := range plan.Steps {
		if s.Action == deployer.ActionLoad {
			loads++
		}
	}
	fmt.Fprintf(c.App.ErrWriter, "Load %s on %s? [y/N] ", plan.To.Version, count(loads, "primary", "primaries"))
	answer, _ := bufio.NewReader(c.App.Reader).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return nil
	}
	return errors.New("deploy: not confirmed; nothing changed")
}

// progress prints each node's steps as they happen, for a person watching a terminal. The
// deployer serialises its calls.
func progress(c *cli.Context, p palette) func(deployer.Event) {
	return func(e deployer.Event) {
		status := p.green("ok")
		if e.Err != nil {
			status = p.red(printable(oneLine(e.Err.Error())))
		}
		if e.Node.Addr == "" {
			// A step of the whole deploy (inspect, done), not of one node.
			fmt.Fprintf(c.App.ErrWriter, "  %-30s %s\n", e.Phase, status)
			return
		}
		fmt.Fprintf(c.App.ErrWriter, "  %-21s %-8s %s\n", printable(e.Node.Addr), e.Phase, status)
	}
}

// deployJSON is deploy --json's output: the plan, and the report when it ran.
type deployJSON struct {
	To       string        `json:"to"`
	DryRun   bool          `json:"dry_run"`
	Plan     []stepJSON    `json:"plan"`
	Report   *reportJSON   `json:"report,omitempty"`
	Warnings []warningJSON `json:"warnings,omitempty"` // the plan's warnings, e.g. missing security fixes
	Error    string        `json:"error,omitempty"`
}

type reportJSON struct {
	DurationMs int64            `json:"duration_ms"`
	RolledBack bool             `json:"rolled_back"` // failed, and every node it changed is back as it was
	Nodes      []nodeResultJSON `json:"nodes"`       // outcome: loaded, unchanged, replicated, failed, restored, restore-failed, skipped, left-out, lagging
	Warnings   []warningJSON    `json:"warnings,omitempty"`
}

type nodeResultJSON struct {
	Addr string `json:"addr"`
	Role string `json:"role"` // as planned
	// RoleAfter is the role a failover during the deploy gave the node, when the deploy saw
	// it change (a replica promoted, a primary demoted).
	RoleAfter  string `json:"role_after,omitempty"`
	From       string `json:"from"`
	To         string `json:"to"`
	Outcome    string `json:"outcome"`
	DurationMs int64  `json:"duration_ms"`
	Error      string `json:"error,omitempty"`
}

func reportJSONOf(r deployer.Report) *reportJSON {
	out := &reportJSON{DurationMs: r.Duration.Milliseconds(), RolledBack: r.RolledBack, Nodes: []nodeResultJSON{}, Warnings: warningsJSON(r.Warnings)}
	for _, n := range r.Nodes {
		j := nodeResultJSON{
			Addr: n.Node.Addr, Role: string(n.Node.Role), RoleAfter: string(n.RoleAfter), From: n.From, To: n.To,
			Outcome: string(n.Outcome), DurationMs: n.Duration.Milliseconds(),
		}
		if n.Err != nil {
			j.Error = oneLine(n.Err.Error())
		}
		out.Nodes = append(out.Nodes, j)
	}
	return out
}
