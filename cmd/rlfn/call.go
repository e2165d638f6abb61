package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
)

// callCommand is built afresh for each app: cli.App.Setup writes into its commands.
func callCommand() *cli.Command {
	return &cli.Command{
		OnUsageError: usageErrorHandler,
		Name:         "call",
		Usage:        "make a decision as a service would, on the same key",
		ArgsUsage:    "ALGORITHM KEY",
		Description: "ALGORITHM is fixed_window, sliding_log, sliding_window (--limit, --window),\n" +
			"token_bucket or leaky_bucket (--capacity, --rate, --period; leaky_bucket also --mode).\n" +
			"KEY is the principal (user:42); the server key is composed as the Go client composes it,\n" +
			"<prefix>{<key>}:<algorithm>, so the call reads and changes the state a service sees.\n" +
			"Durations use Go syntax: 500ms, 1s, 1m, 1h.",
		Flags: []cli.Flag{
			&cli.Int64Flag{Name: "limit", Usage: "`N` units per window (fixed_window, sliding_log, sliding_window)"},
			&cli.DurationFlag{Name: "window", Usage: "window `DURATION` (fixed_window, sliding_log, sliding_window)"},
			&cli.Int64Flag{Name: "capacity", Usage: "bucket capacity `N` (token_bucket, leaky_bucket)"},
			&cli.Int64Flag{Name: "rate", Usage: "`N` units refilled or leaked per period (token_bucket, leaky_bucket)"},
			&cli.DurationFlag{Name: "period", Usage: "`DURATION` of one rate period (token_bucket, leaky_bucket)"},
			&cli.StringFlag{Name: "mode", Usage: "leaky_bucket `MODE`: police (reject when full) or shape (delay)", Value: "police"},
			&cli.Int64Flag{Name: "cost", Usage: "`N` units the call takes", Value: 1},
			&cli.BoolFlag{Name: "peek", Usage: "only check, consuming nothing (FCALL_RO, which a replica may serve)"},
			&cli.IntFlag{Name: "repeat", Usage: "make the call `N` times", Value: 1},
			&cli.StringFlag{Name: "prefix", Usage: "key `PREFIX`, as the client's WithPrefix", Value: client.DefaultPrefix},
			jsonFlag(),
		},
		Action: callAction,
	}
}

func callAction(c *cli.Context) error {
	if c.NArg() != 2 {
		return usageError(c, "needs ALGORITHM and KEY")
	}
	limit, err := parseLimit(c, c.Args().Get(0))
	if err != nil {
		return err
	}
	key, cost, repeat := c.Args().Get(1), c.Int64("cost"), c.Int("repeat")
	if repeat < 1 {
		return usageError(c, "--repeat must be at least 1")
	}
	// The client validates a limit exactly as the library does; do it before dialling, so a
	// mistake is reported as one whatever the state of the server. (AllowN checks the cost.)
	if err := limit.Validate(); err != nil {
		return err
	}
	opt, err := clientOption(c)
	if err != nil {
		return err
	}
	ctx, cancel := commandContext(c)
	defer cancel()
	opt.SendToReplicas = func(cmd valkey.Completed) bool { return cmd.IsReadOnly() }
	vk, err := valkey.NewClient(opt)
	if err != nil {
		return fmt.Errorf("%s: %w", opt.InitAddress[0], err)
	}
	defer vk.Close()
	// The command's --timeout bounds each call, not the client's 100ms default, which suits a
	// service's hot path rather than a person across a slow link; errors are returned, never
	// replaced by a fallback decision (the client's default policy).
	lim := client.New(vk, client.WithPrefix(c.String("prefix")), client.WithDeadline(c.Duration("timeout")))
	serverKey := client.Key(c.String("prefix"), key, limit)

	var t *table
	if !c.Bool("json") {
		t = newTable(c.App.Writer, "KEY", "ALLOWED", "LIMIT", "REMAINING", "RETRY AFTER", "RESET AFTER", "DELAY")
	}
	for range repeat {
		var res client.Result
		if c.Bool("peek") {
			res, err = lim.PeekN(ctx, key, limit, cost)
		} else {
			res, err = lim.AllowN(ctx, key, limit, cost)
		}
		if err != nil {
			if t != nil {
				t.flush()
			}
			return err
		}
		if t == nil {
			if err := writeJSONLine(c.App.Writer, resultJSON(serverKey, res)); err != nil {
				return err
			}
			continue
		}
		t.row(serverKey, yesNo(res.Allowed), fmt.Sprint(res.Limit), fmt.Sprint(res.Remaining),
			human(res.RetryAfter), human(res.ResetAfter), human(res.Delay))
	}
	if t != nil {
		return t.flush()
	}
	return nil
}

// parseLimit builds the limit of algorithm from the flags, refusing flags of other algorithms
// so that a typo is not silently ignored.
func parseLimit(c *cli.Context, algorithm string) (client.Limit, error) {
	algorithm = strings.ReplaceAll(algorithm, "-", "_")
	window := []string{"limit", "window"}
	bucket := []string{"capacity", "rate", "period"}
	var limit client.Limit
	var want []string
	switch algorithm {
	case "fixed_window":
		limit, want = client.FixedWindow{Limit: c.Int64("limit"), Window: c.Duration("window")}, window
	case "sliding_log":
		limit, want = client.SlidingLog{Limit: c.Int64("limit"), Window: c.Duration("window")}, window
	case "sliding_window":
		limit, want = client.SlidingWindow{Limit: c.Int64("limit"), Window: c.Duration("window")}, window
	case "token_bucket":
		limit, want = client.TokenBucket{Capacity: c.Int64("capacity"), Rate: c.Int64("rate"), Period: c.Duration("period")}, bucket
	case "leaky_bucket":
		mode := client.Police
		switch c.String("mode") {
		case "police":
		case "shape":
			mode = client.Shape
		default:
			return nil, usageError(c, fmt.Sprintf("--mode is police or shape, not %q", c.String("mode")))
		}
		limit = client.LeakyBucket{Capacity: c.Int64("capacity"), Rate: c.Int64("rate"), Period: c.Duration("period"), Mode: mode}
		want = append(bucket, "mode")
	default:
		return nil, usageError(c, fmt.Sprintf("unknown algorithm %q: fixed_window, sliding_log, sliding_window, token_bucket or leaky_bucket", algorithm))
	}
	for _, name := range []string{"limit", "window", "capacity", "rate", "period", "mode"} {
		if c.IsSet(name) && !slices.Contains(want, name) {
			return nil, usageError(c, fmt.Sprintf("--%s does not apply to %s", name, algorithm))
		}
	}
	for _, name := range want {
		if name != "mode" && !c.IsSet(name) {
			return nil, usageError(c, fmt.Sprintf("%s needs --%s", algorithm, name))
		}
	}
	return limit, nil
}

// callJSON is the library's reply in its own units: scripts compare it with FCALL's.
type callJSON struct {
	Key          string `json:"key"`
	Allowed      bool   `json:"allowed"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	RetryAfterMs int64  `json:"retry_after_ms"` // -1: the cost exceeds the limit, no wait admits it
	ResetAfterMs int64  `json:"reset_after_ms"`
	DelayMs      int64  `json:"delay_ms"`
}

func resultJSON(key string, r client.Result) callJSON {
	retry := r.RetryAfter.Milliseconds()
	if r.RetryAfter == client.Never {
		retry = -1
	}
	return callJSON{
		Key: key, Allowed: r.Allowed, Limit: r.Limit, Remaining: r.Remaining,
		RetryAfterMs: retry, ResetAfterMs: r.ResetAfter.Milliseconds(), DelayMs: r.Delay.Milliseconds(),
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// human prints a duration as the library returns it, whole milliseconds.
func human(d time.Duration) string {
	if d == client.Never {
		return "never"
	}
	return d.String()
}
