package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/versions"
)

func toFlag() cli.Flag {
	return &cli.StringFlag{Name: "to", Usage: "release `VERSION` to deploy (default: the newest embedded; see rlfn versions)"}
}

// diffCommand is built afresh for each app: cli.App.Setup writes into its commands.
func diffCommand() *cli.Command {
	return &cli.Command{
		OnUsageError: usageErrorHandler,
		Name:         "diff",
		Usage:        "show the plan of a deploy and a unified diff of the code",
		ArgsUsage:    " ",
		Description: "diff shows what a deploy would do on every node the server knows of. It exits 1 when a\n" +
			"node cannot be read (unreachable) or cannot run Functions (unsupported); with\n" +
			"--exit-code it exits 2 unless every node runs the release. It exits 1 too when a cluster\n" +
			"primary owns slots and has no library while the others run a release (the clients'\n" +
			"fallback decides its keys). Otherwise, warnings make it exit 4 unless --accept-warning\n" +
			"names them.",
		Flags: []cli.Flag{
			toFlag(),
			&cli.BoolFlag{Name: "exit-code", Usage: "exit 2 unless every node runs the release"},
			jsonFlag(),
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageError(c, "takes no arguments")
			}
			ctx, cancel := commandContext(c)
			defer cancel()
			t, plan, err := planFor(ctx, c, false)
			if err != nil {
				return err
			}
			defer t.Close()
			gapErr := planGaps(&plan)
			if c.Bool("json") {
				err = writeJSON(c.App.Writer, diffJSON{
					To: plan.To.Version, Pending: plan.Pending(), Current: plan.Current(),
					Steps: stepsJSON(plan), Diffs: diffsJSON(plan), Warnings: warningsJSON(plan.Warnings()),
					Gaps: gapsJSON(gapErr),
				})
			} else {
				p := colours(c.App.Writer)
				if err = renderPlan(c.App.Writer, p, plan); err == nil {
					err = renderDiff(c.App.Writer, p, plan)
				}
			}
			if err != nil {
				return err
			}
			if err := unread(statusRows(plan)); err != nil {
				return err
			}
			if gapErr != nil {
				return gapErr
			}
			if c.Bool("exit-code") && !plan.Current() {
				return errPending
			}
			return unaccepted(c, plan.Warnings())
		},
	}
}

// target resolves --to against the releases in this binary.
func target(c *cli.Context) (versions.Release, error) {
	set := releases(c)
	v := c.String("to")
	if v == "" {
		return set.Latest(), nil
	}
	r, ok := set.Find(strings.TrimPrefix(v, "v"))
	if !ok {
		names := make([]string, len(set))
		for i, r := range set {
			names[i] = r.Version
		}
		return r, fmt.Errorf("--to %s: no such release; this binary has %s", v, strings.Join(names, ", "))
	}
	return r, nil
}

// planFor discovers the target, reads every node and plans the deploy --to asks for. A node
// that cannot be read is a refusal in the plan (only --force leaves it out, NOT deployed).
func planFor(ctx context.Context, c *cli.Context, force bool) (*deployer.Target, deployer.Plan, error) {
	to, err := target(c)
	if err != nil {
		return nil, deployer.Plan{}, err
	}
	t, err := discover(ctx, c)
	if err != nil {
		return nil, deployer.Plan{}, err
	}
	set := releases(c)
	installed, err := t.Inspect(ctx, set)
	if err != nil {
		t.Close()
		return nil, deployer.Plan{}, err
	}
	return t, deployer.NewPlan(installed, to, force), nil
}

type diffJSON struct {
	To       string        `json:"to"`
	Pending  bool          `json:"pending"` // a deploy would load something
	Current  bool          `json:"current"` // every node was read and runs the release
	Steps    []stepJSON    `json:"steps"`
	Diffs    []codeJSON    `json:"diffs"`
	Warnings []warningJSON `json:"warnings,omitempty"`
	// Gaps are the primaries that own slots and have no library while the others run a
	// release: diff exits 1.
	Gaps []gapJSON `json:"gaps,omitempty"`
}

type gapJSON struct {
	Addr  string `json:"addr"`
	Slots int    `json:"slots"`
	Want  string `json:"want"` // the release the other primaries run
}

func gapsJSON(err error) []gapJSON {
	var ge *deployer.GapsError
	if !errors.As(err, &ge) {
		return nil
	}
	out := make([]gapJSON, len(ge.Gaps))
	for i, g := range ge.Gaps {
		out[i] = gapJSON{Addr: g.Node.Addr, Slots: g.Node.Slots, Want: g.Want}
	}
	return out
}

// planGaps finds the plan's coverage gaps (coverageGaps): a primary with no slots becomes a
// warning of its step; the error names those that own slots.
func planGaps(plan *deployer.Plan) error {
	installed := make([]deployer.Installed, len(plan.Steps))
	for i, s := range plan.Steps {
		installed[i] = s.Installed
	}
	_, err := coverageGaps(installed)
	for i := range plan.Steps {
		plan.Steps[i].Warnings = installed[i].Warnings
	}
	return err
}

type stepJSON struct {
	Addr     string        `json:"addr"`
	Role     string        `json:"role"`
	State    string        `json:"state"`
	From     string        `json:"from"`
	To       string        `json:"to"`
	Action   string        `json:"action"`
	Reason   string        `json:"reason,omitempty"`
	Refusal  string        `json:"refusal,omitempty"`
	Error    string        `json:"error,omitempty"` // why the node is unreachable or unsupported
	Warnings []warningJSON `json:"warnings,omitempty"`
}

func stepsJSON(plan deployer.Plan) []stepJSON {
	out := make([]stepJSON, 0, len(plan.Steps))
	for _, s := range plan.Steps {
		out = append(out, stepJSON{
			Addr: s.Node.Addr, Role: string(s.Node.Role), State: string(s.State), From: s.From, To: s.To,
			Action: string(s.Action), Reason: s.Reason, Refusal: string(s.Refusal), Error: nodeError(s), Warnings: warningsJSON(s.Warnings),
		})
	}
	return out
}

type codeJSON struct {
	Nodes []string `json:"nodes"`
	From  string   `json:"from"`
	State string   `json:"state"`
	Diff  string   `json:"diff"` // unified diff; empty when the node has no library
}

func diffsJSON(plan deployer.Plan) []codeJSON {
	out := []codeJSON{}
	for _, g := range groupByCode(plan) {
		if g.step.Code == plan.To.Code {
			continue
		}
		d := codeJSON{Nodes: g.addrs, From: g.step.From, State: string(g.step.State)}
		if g.step.State != deployer.StateAbsent {
			d.Diff = g.unified(plan.To)
		}
		out = append(out, d)
	}
	return out
}
