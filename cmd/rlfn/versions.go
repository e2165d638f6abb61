package main

import (
	"github.com/urfave/cli/v2"
)

// versionsCommand is built afresh for each app: cli.App.Setup writes into its commands.
func versionsCommand() *cli.Command {
	return &cli.Command{
		OnUsageError: usageErrorHandler,
		Name:         "versions",
		Usage:        "list the releases embedded in this binary, newest last",
		ArgsUsage:    " ",
		Flags:        []cli.Flag{jsonFlag()},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageError(c, "takes no arguments")
			}
			set := releases(c)
			if c.Bool("json") {
				out := make([]releaseJSON, len(set))
				for i, r := range set {
					out[i] = releaseJSON{Version: r.Version, SHA256: r.SHA256()}
				}
				return writeJSON(c.App.Writer, out)
			}
			t := newTable(c.App.Writer, "VERSION", "SHA-256")
			for _, r := range set {
				t.row(r.Version, r.SHA256())
			}
			return t.flush()
		},
	}
}

type releaseJSON struct {
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
}
