package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/rlfn/rlfn/deployer"
)

// acceptEnv holds the warning IDs a CI job has reviewed, comma-separated, as
// --accept-warning does.
const acceptEnv = "RLFN_ACCEPT_WARNINGS"

// acceptFlag names the warnings a script has reviewed: they are still printed, but no
// longer change the exit code. By ID, not all at once, so that a new kind of warning (a
// later rlfn, another server) still stops the pipeline that accepted the old ones.
//
// $RLFN_ACCEPT_WARNINGS is read by accepted, not through EnvVars: the flag adds to it
// rather than replacing it, so that a step accepting one more warning keeps the job's.
func acceptFlag() cli.Flag {
	return &cli.StringSliceFlag{
		Name: "accept-warning",
		Usage: "`ID` of a warning you reviewed (" + strings.Join(deployer.WarningIDs, ", ") +
			"): still printed, it no longer makes status, diff or deploy exit 4; repeat or separate with commas; " +
			"adds to $" + acceptEnv,
	}
}

// accepted reads --accept-warning and $RLFN_ACCEPT_WARNINGS, together; an ID that names no
// warning is a mistake (a typo must not leave the warning it meant failing, or worse, seem
// to accept it).
func accepted(c *cli.Context) (map[string]bool, error) {
	out := map[string]bool{}
	for _, v := range append(c.StringSlice("accept-warning"), os.Getenv(acceptEnv)) {
		for id := range strings.SplitSeq(v, ",") {
			id = strings.TrimSpace(id)
			if id == "" {
				continue // an empty $RLFN_ACCEPT_WARNINGS accepts nothing, as an unset one
			}
			if !slices.Contains(deployer.WarningIDs, id) {
				return nil, fmt.Errorf("--accept-warning %q (the flag or $%s): no such warning; there are %s", id, acceptEnv, strings.Join(deployer.WarningIDs, ", "))
			}
			out[id] = true
		}
	}
	return out, nil
}

// warningsError ends a command that did all it says but printed warnings nobody accepted:
// exit 4, so that CI notices them without taking the command for failed.
type warningsError struct {
	ids []string // the kinds not accepted, each once
	n   int      // the warnings not accepted as printed: one about six nodes is one
}

func (e *warningsError) Error() string {
	return fmt.Sprintf("%s not accepted (%s): review, then pass --accept-warning %s (or set %s) to exit 0",
		count(e.n, "warning", "warnings"), strings.Join(e.ids, ", "), strings.Join(e.ids, ","), acceptEnv)
}

// unaccepted is nil when every warning is accepted, else a *warningsError.
func unaccepted(c *cli.Context, warnings []deployer.Warning) error {
	ok, err := accepted(c)
	if err != nil {
		return err
	}
	return notAccepted(ok, warnings)
}

// notAccepted is nil when ok accepts every warning's ID, else a *warningsError.
func notAccepted(ok map[string]bool, warnings []deployer.Warning) error {
	e := &warningsError{}
	for _, g := range groupWarnings(warnings) {
		if ok[g.w.ID] {
			continue
		}
		e.n++
		if !slices.Contains(e.ids, g.w.ID) {
			e.ids = append(e.ids, g.w.ID)
		}
	}
	if e.n == 0 {
		return nil
	}
	return e
}

func isWarnings(err error) bool {
	var we *warningsError
	return errors.As(err, &we)
}

// warningJSON is a warning in every command's --json: its ID is what --accept-warning takes.
type warningJSON struct {
	ID   string `json:"id"`
	Addr string `json:"addr,omitempty"`
	Text string `json:"text"`
}

func warningsJSON(ws []deployer.Warning) []warningJSON {
	if len(ws) == 0 {
		return nil
	}
	out := make([]warningJSON, len(ws))
	for i, w := range ws {
		out[i] = warningJSON{ID: w.ID, Addr: w.Addr, Text: w.Text}
	}
	return out
}

// warningGroup is one warning as printed: the same kind and text on several nodes (a cluster
// of one server version) is one line naming them all, and counts once.
type warningGroup struct {
	w     deployer.Warning
	addrs []string
}

// groupWarnings gathers ws by kind and text, in the order first seen.
func groupWarnings(ws []deployer.Warning) []*warningGroup {
	var groups []*warningGroup
	byText := map[[2]string]*warningGroup{}
	for _, w := range ws {
		k := [2]string{w.ID, w.Text}
		g, ok := byText[k]
		if !ok {
			g = &warningGroup{w: w}
			byText[k] = g
			groups = append(groups, g)
		}
		if w.Addr != "" {
			g.addrs = append(g.addrs, w.Addr)
		}
	}
	return groups
}
