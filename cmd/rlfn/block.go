package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/limitspec"
)

// blockCommand and unblockCommand are an operator's hand on a principal's block (library
// 1.2.0): the block a limit's --penalty sets, which every call with a penalty on that key
// observes. They are built afresh for each app: cli.App.Setup writes into its commands.
func blockCommand() *cli.Command {
	return &cli.Command{
		OnUsageError: usageErrorHandler,
		Name:         "block",
		Usage:        "block a principal for a time, or read its block (--peek)",
		ArgsUsage:    "KEY",
		Description: "KEY is the principal (user:42), as rlfn call takes it; its block is the server key\n" +
			"<prefix>{<key>}:block, in the slot of all its limiters. While blocked, every call on KEY of\n" +
			"a limit with a penalty (the client's Penalty, rlfn call --penalty) is refused without\n" +
			"consuming anything. --for replaces any block KEY has: it lengthens or shortens it.\n" +
			"--peek reads the block, changing nothing (FCALL_RO, which a replica may serve); rlfn\n" +
			"unblock lifts it. Block only principals the service authenticated: a block on a key a\n" +
			"client can forge (an IP address from an unchecked header) locks its victim out.\n" +
			"Needs library 1.2.0 on the node that holds KEY.",
		Flags: append([]cli.Flag{
			&cli.DurationFlag{Name: "for", Usage: fmt.Sprintf("block KEY for `DURATION` (1ms to %dms, whole milliseconds), e.g. 15m", limitspec.BlockFor.Max)},
			&cli.BoolFlag{Name: "peek", Usage: "only read KEY's block"},
		}, keyFlags()...),
		Action: func(c *cli.Context) error {
			if _, _, err := blockKey(c); err != nil {
				return err // KEY's mistakes first, as call's
			}
			switch {
			case c.IsSet("for") && c.Bool("peek"):
				return usageError(c, "--for does not go with --peek")
			case c.Bool("peek"):
				return blockAction(c, (*client.Limiter).PeekBlock, true)
			case !c.IsSet("for"):
				// Not a read: "rlfn block KEY" reads as blocking KEY, and must not print "not
				// blocked" to someone who meant to block it and forgot how long for.
				return usageError(c, "needs --for DURATION to block KEY, or --peek to read its block")
			}
			d := c.Duration("for")
			if err := checkBlockFor(d); err != nil {
				return usageError(c, err.Error())
			}
			return blockAction(c, func(l *client.Limiter, ctx context.Context, key string) (client.Result, error) {
				return l.Block(ctx, key, d)
			}, false)
		},
	}
}

func unblockCommand() *cli.Command {
	return &cli.Command{
		OnUsageError: usageErrorHandler,
		Name:         "unblock",
		Usage:        "lift a principal's block",
		ArgsUsage:    "KEY",
		Description: "Deletes KEY's block, <prefix>{<key>}:block (see rlfn block): its calls are decided by\n" +
			"their limits again. A key without a block stays without one. Needs library 1.2.0.",
		Flags: keyFlags(),
		Action: func(c *cli.Context) error {
			return blockAction(c, (*client.Limiter).Unblock, false)
		},
	}
}

// keyFlags address a principal's state as rlfn call does.
func keyFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "prefix", Usage: "key `PREFIX`, as the client's Options.Prefix", Value: "rl:"},
		&cli.StringFlag{Name: "policy", Usage: "address the principal of httplimit's policy `NAME`: the client's key is NAME:KEY, as the middleware composes it"},
		jsonFlag(),
	}
}

// checkBlockFor refuses a duration Block would refuse, before any connection is made.
func checkBlockFor(d time.Duration) error {
	f := limitspec.BlockFor
	switch {
	case d < time.Duration(f.Min)*time.Millisecond:
		return fmt.Errorf("--for must be at least %dms, got %s", f.Min, d)
	case d%time.Millisecond != 0:
		return fmt.Errorf("--for must be a whole number of milliseconds, got %s", d)
	case d.Milliseconds() > f.Max:
		return fmt.Errorf("--for must be at most %dms, got %s", f.Max, d)
	}
	return nil
}

// blockKey reads KEY, --prefix and --policy as rlfn call does: the client's key, and its
// block's server key.
func blockKey(c *cli.Context) (key, serverKey string, err error) {
	switch args := c.Args().Slice(); {
	case len(args) == 0:
		return "", "", usageError(c, "needs KEY")
	case len(args) > 1:
		return "", "", usageError(c, fmt.Sprintf("takes KEY only; extra %q after KEY %q", args[1], args[0]))
	case args[0] == "":
		return "", "", usageError(c, `KEY is missing: the argument is "" (an unset variable?)`)
	}
	prefix := c.String("prefix")
	if prefix == "" {
		return "", "", usageError(c, `--prefix must not be empty (a service's Limiter uses "rl:" unless it set another)`)
	}
	key = c.Args().First()
	if c.IsSet("policy") {
		if err := checkPolicyName(c.String("policy")); err != nil {
			return "", "", usageError(c, "--policy "+err.Error())
		}
		key = policyKey(c.String("policy"), key)
	}
	return key, limitspec.BlockKey(prefix, key), nil
}

// blockAction makes one call on KEY's block and prints the block as it left it.
func blockAction(c *cli.Context, call func(*client.Limiter, context.Context, string) (client.Result, error), readOnly bool) error {
	key, serverKey, err := blockKey(c)
	if err != nil {
		return err
	}
	ctx, cancel := commandContext(c)
	defer cancel()
	d, err := dialLimiter(ctx, c, c.String("prefix"), readOnly)
	if err != nil {
		return err
	}
	defer d.close()
	res, err := call(d.lim, ctx, key)
	if err != nil {
		// the node and the key, as a call's errors name them
		p := &callPlan{mode: modeAllow, stateKey: serverKey, peek: readOnly}
		return p.where(err, d.opt, d.topo)
	}
	return writeBlock(c.App.Writer, serverKey, res, c.Bool("json"))
}

// blockJSON is a block as the library replies it, in its units: blocked while retry_after_ms
// (the time left) is above 0.
type blockJSON struct {
	Key          string `json:"key"`
	Blocked      bool   `json:"blocked"`
	RetryAfterMs int64  `json:"retry_after_ms"`
}

// writeBlock prints a block: KEY, BLOCKED and RETRY AFTER, its time left.
func writeBlock(w io.Writer, serverKey string, res client.Result, asJSON bool) error {
	if asJSON {
		return writeJSON(w, blockJSON{Key: serverKey, Blocked: res.Blocked, RetryAfterMs: res.RetryAfter.Milliseconds()})
	}
	key := printable(serverKey)
	t := newColumns(w, []int{len(key)}, "KEY", "BLOCKED", "RETRY AFTER")
	return t.row(key, yesNo(res.Blocked), human(res.RetryAfter))
}
