package main

import (
	"errors"
	"fmt"
	"slices"

	"github.com/urfave/cli/v2"

	"github.com/rlfn/rlfn/deployer"
)

// statusCommand is built afresh for each app: cli.App.Setup writes into its commands.
func statusCommand() *cli.Command {
	return &cli.Command{
		OnUsageError: usageErrorHandler,
		Name:         "status",
		Usage:        "show every node: address, role, state and version of its library",
		ArgsUsage:    " ",
		Description: "STATE compares a node's library with the newest release in this binary: current, absent,\n" +
			"behind, ahead, or drifted (code that matches no release). A node that cannot be read\n" +
			"(down as the cluster says, or not answering) is unreachable, and one that answers but\n" +
			"cannot run Functions is unsupported: status then exits 1. Every node the server knows\n" +
			"of is a row. Warnings (a server missing Lua security fixes, a replica that does not follow\n" +
			"its primary, a cluster node that stops answering everywhere when one shard has no primary:\n" +
			"cluster-require-full-coverage yes, or not readable, a primary with no slots and no library\n" +
			"while the others run a release) make it exit 4 unless --accept-warning names them.\n\n" +
			"A cluster primary that owns slots and has no library while the others run a release makes\n" +
			"status exit 1: the keys of its slots are decided by each client's fallback, not the\n" +
			"library. The line says what to run.",
		Flags: []cli.Flag{jsonFlag()},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageError(c, "takes no arguments")
			}
			ctx, cancel := commandContext(c)
			defer cancel()
			t, err := discover(ctx, c)
			if err != nil {
				return err
			}
			defer t.Close()
			set := releases(c)
			installed, err := t.Inspect(ctx, set)
			if err != nil {
				return err
			}
			// Only status asks: the setting is the service's availability, not a deploy's
			// safety, and must not change what diff or deploy exit with.
			withWarnings(installed, t.Coverage(ctx))
			gaps, gapErr := coverageGaps(installed)
			plan := deployer.NewPlan(installed, set.Latest(), false)
			rows := statusRows(plan)
			for i := range rows {
				rows[i].Gap = gaps[rows[i].Addr]
			}
			if c.Bool("json") {
				err = writeJSON(c.App.Writer, rows)
			} else {
				err = renderStatus(c.App.Writer, colours(c.App.Writer), rows, t.Topology().Cluster)
			}
			if err != nil {
				return err
			}
			if err := unread(rows); err != nil {
				return err
			}
			if gapErr != nil {
				return gapErr
			}
			return unaccepted(c, plan.Warnings())
		},
	}
}

// statusRow is one node in status's output; its JSON names are a contract.
type statusRow struct {
	Addr     string        `json:"addr"`
	Role     string        `json:"role"`               // primary or replica
	State    string        `json:"state"`              // current, absent, behind, ahead, drifted, unreachable, unsupported
	Version  string        `json:"version"`            // the release the node runs; "" when absent or drifted
	Declared string        `json:"declared,omitempty"` // the version drifted code declares
	Primary  string        `json:"primary,omitempty"`  // a replica's primary
	Slots    int           `json:"slots"`              // hash slots a cluster primary owns
	ID       string        `json:"id,omitempty"`       // cluster node ID
	Server   string        `json:"server,omitempty"`   // e.g. "Valkey 8.0.1"
	Error    string        `json:"error,omitempty"`    // why the node is unreachable or unsupported
	Gap      string        `json:"gap,omitempty"`      // a primary that owns slots and has no library while the others run one: what to run
	Warnings []warningJSON `json:"warnings,omitempty"` // e.g. a server missing known security fixes
}

// statusRows is one row per step of a plan against the newest release: the plan's state is
// the node's state.
func statusRows(plan deployer.Plan) []statusRow {
	rows := make([]statusRow, 0, len(plan.Steps))
	for _, s := range plan.Steps {
		r := statusRow{
			Addr: s.Node.Addr, Role: string(s.Node.Role), State: string(s.State), Version: s.Version,
			Primary: s.Node.Primary, Slots: s.Node.Slots, ID: s.Node.ID, Server: s.Server.String(),
			Error: nodeError(s), Warnings: warningsJSON(s.Warnings),
		}
		if s.State == deployer.StateDrifted {
			r.Declared = s.Declared // a release declares its own version: only drift needs saying
		}
		rows = append(rows, r)
	}
	return rows
}

// nodeError says why a node is unreachable or unsupported; "" for a node that was read.
func nodeError(s deployer.Step) string {
	switch {
	case s.State == deployer.StateUnreachable && s.Unreachable != nil:
		return oneLine(s.Unreachable.Error())
	case s.State == deployer.StateUnsupported:
		return s.Unsupported
	}
	return ""
}

// unread fails a command that could not read every node: a status with a hole in it must
// not look like success to a script.
func unread(rows []statusRow) error {
	var errs []error
	for _, r := range rows {
		// By state, not by whether a reason was found: a hole without one is a hole.
		if r.State != string(deployer.StateUnreachable) && r.State != string(deployer.StateUnsupported) {
			continue
		}
		why := r.Error
		if why == "" {
			why = "not read"
		}
		errs = append(errs, fmt.Errorf("%s: %s: %s", r.Addr, r.State, why))
	}
	return errors.Join(errs...)
}

// withWarnings adds each warning to the node it names, in place.
func withWarnings(installed []deployer.Installed, ws []deployer.Warning) {
	for _, w := range ws {
		for i := range installed {
			if installed[i].Node.Addr == w.Addr {
				// A copy: the Installed's slice may be shared.
				installed[i].Warnings = append(slices.Clip(installed[i].Warnings), w)
			}
		}
	}
}

// coverageGaps finds the cluster primaries without the library the others run
// (deployer.Gaps): those that own no slots yet become warnings on their node, in place; the
// others are an error naming them and what to run, and a text for each one's row, by
// address.
func coverageGaps(installed []deployer.Installed) (map[string]string, error) {
	rows := map[string]string{}
	var serving []deployer.Gap
	var ws []deployer.Warning
	for _, g := range deployer.Gaps(installed) {
		if !g.Serving() {
			ws = append(ws, g.Warning())
			continue
		}
		serving = append(serving, g)
		rows[g.Node.Addr] = "owns slots and has no library while the other primaries run " + g.Want + ": run rlfn deploy --to " + g.Want
	}
	withWarnings(installed, ws)
	if len(serving) == 0 {
		return rows, nil
	}
	return rows, &deployer.GapsError{Gaps: serving}
}
