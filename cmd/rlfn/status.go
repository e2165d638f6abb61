package main

import (
	"errors"
	"fmt"

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
			"is shown as unreachable, and status exits 1.",
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
			rows := statusRows(installed, deployer.NewPlan(installed, set, set.Latest(), false))
			if c.Bool("json") {
				err = writeJSON(c.App.Writer, rows)
			} else {
				err = renderStatus(c.App.Writer, colours(c.App.Writer), rows, t.Topology().Cluster)
			}
			if err != nil {
				return err
			}
			return unreachable(installed)
		},
	}
}

// statusRow is one node in status's output; its JSON names are a contract.
type statusRow struct {
	Addr     string `json:"addr"`
	Role     string `json:"role"`               // primary or replica
	State    string `json:"state"`              // current, absent, behind, ahead, drifted, unreachable
	Version  string `json:"version"`            // the release the node runs; "" when absent or drifted
	Declared string `json:"declared,omitempty"` // the version drifted code declares
	Primary  string `json:"primary,omitempty"`  // a replica's primary
	Slots    int    `json:"slots"`              // hash slots a cluster primary owns
	ID       string `json:"id,omitempty"`       // cluster node ID
	Error    string `json:"error,omitempty"`    // why the node could not be read
}

func statusRows(installed []deployer.Installed, plan deployer.Plan) []statusRow {
	rows := make([]statusRow, 0, len(installed))
	for i, in := range installed {
		r := statusRow{
			Addr: in.Node.Addr, Role: string(in.Node.Role), Version: in.Version, Declared: in.Declared,
			Primary: in.Node.Primary, Slots: in.Node.Slots, ID: in.Node.ID,
		}
		switch {
		case in.Err != nil:
			r.State, r.Error = "unreachable", in.Err.Error()
		case i < len(plan.Steps):
			r.State = string(plan.Steps[i].State)
		}
		if r.State != string(deployer.StateDrifted) {
			r.Declared = "" // a release declares its own version: only drift needs saying
		}
		rows = append(rows, r)
	}
	return rows
}

// unreachable fails a command that read every node but one: a status with a hole in it must
// not look like success to a script.
func unreachable(installed []deployer.Installed) error {
	var errs []error
	for _, in := range installed {
		if in.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", in.Node.Addr, in.Err))
		}
	}
	return errors.Join(errs...)
}
