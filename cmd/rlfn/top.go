package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rlfn/rlfn/internal/override"
	"github.com/rlfn/rlfn/internal/topkeys"
)

// topCommand shows who is being limited now: the keys every process's Limiter with
// Options.TopKeys published, merged.
func topCommand() *cli.Command {
	return &cli.Command{
		OnUsageError: usageErrorHandler,
		Name:         "top",
		Usage:        "who is being limited now: the keys denied most, over every process",
		Description: "Reads the keys denied most that each service process with the client's Options.TopKeys\n" +
			"publishes (every Options.TopEvery, to <prefix>{%top}:<process>, which expires when the\n" +
			"process stops publishing), and merges them: per key and limit, the denials of every process\n" +
			"(each an upper bound, as the processes' sketches count), the last denial's retry-after, and\n" +
			"the override in force (rlfn override).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "prefix", Usage: "key `PREFIX`, as the client's Options.Prefix", Value: "rl:"},
			decimalFlag("limit", "show the `N` keys denied most", 20),
			jsonFlag(),
		},
		Action: topAction,
	}
}

// topRow is one key of a limit, merged over the processes.
type topRow struct {
	Key          string             `json:"key"`
	Algorithm    string             `json:"algorithm"`
	Name         string             `json:"name,omitempty"`
	Denials      int64              `json:"denials"`
	RetryAfterMs int64              `json:"retry_after_ms"` // the last denial's, of any process
	LastMs       int64              `json:"last_ms"`
	Processes    int                `json:"processes"`
	Override     *override.Override `json:"override,omitempty"`
}

type topJSON struct {
	Processes int      `json:"processes"`
	Keys      []topRow `json:"keys"`
}

// mergeTop merges the processes' published tops, most denied first (ties: by key).
func mergeTop(published [][]topkeys.Entry) []topRow {
	type id struct{ alg, name, key string }
	rows := map[id]*topRow{}
	for _, entries := range published {
		for _, e := range entries {
			k := id{e.Algorithm, e.Name, e.Key}
			r := rows[k]
			if r == nil {
				r = &topRow{Key: e.Key, Algorithm: e.Algorithm, Name: e.Name}
				rows[k] = r
			}
			r.Denials += e.Denials
			r.Processes++
			if e.LastMs >= r.LastMs {
				r.LastMs, r.RetryAfterMs = e.LastMs, e.RetryAfterMs
			}
		}
	}
	out := make([]topRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Denials != out[j].Denials {
			return out[i].Denials > out[j].Denials
		}
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].Algorithm+":"+out[i].Name < out[j].Algorithm+":"+out[j].Name
	})
	return out
}

func topAction(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageError(c, fmt.Sprintf("takes no argument, got %q", c.Args().First()))
	}
	prefix := c.String("prefix")
	if prefix == "" {
		return usageError(c, `--prefix must not be empty (a service's Limiter uses "rl:" unless it set another)`)
	}
	limit := decimalValue(c, "limit")
	if limit < 1 {
		return usageError(c, fmt.Sprintf("--limit must be at least 1, got %d", limit))
	}
	ctx, cancel := commandContext(c)
	defer cancel()
	tk := topkeys.Key(prefix)
	node, vk, found, err := keysOfSlot(ctx, c, tk, tk+":")
	if err != nil {
		return err
	}
	defer vk.Close()
	var published [][]topkeys.Entry
	for _, k := range found {
		v, err := vk.Do(ctx, vk.B().Get().Key(k).Build()).ToString()
		if err != nil {
			continue // expired since the SCAN
		}
		var entries []topkeys.Entry
		if json.Unmarshal([]byte(v), &entries) != nil {
			fmt.Fprintf(c.App.ErrWriter, "Warning: %s on %s holds no top of a process: skipped\n", printable(k), node)
			continue
		}
		published = append(published, entries)
	}
	rows := mergeTop(published)
	if int64(len(rows)) > limit {
		rows = rows[:limit]
	}
	ovr, err := storeOf(ctx, c, prefix)
	if err != nil {
		return err
	}
	now := time.Now()
	for i := range rows {
		rows[i].Override = inForce(ovr, override.ID{Policy: override.Policy{Algorithm: rows[i].Algorithm, Name: rows[i].Name}, Key: rows[i].Key}, now)
	}
	if c.Bool("json") {
		return writeJSON(c.App.Writer, topJSON{Processes: len(published), Keys: rows})
	}
	return writeTop(c.App.Writer, len(published), rows, now)
}

func writeTop(w io.Writer, processes int, rows []topRow, now time.Time) error {
	if len(rows) == 0 {
		_, err := fmt.Fprintf(w, "No denials published (%s): is Options.TopKeys set in the services?\n", count(processes, "process", "processes"))
		return err
	}
	t := newTable(w, "KEY", "POLICY", "DENIALS", "RETRY AFTER", "LAST", "OVERRIDE")
	for _, r := range rows {
		policy := override.Policy{Algorithm: r.Algorithm, Name: r.Name}.String()
		retry := "never"
		if r.RetryAfterMs >= 0 {
			retry = (time.Duration(r.RetryAfterMs) * time.Millisecond).String()
		}
		last := now.Sub(time.UnixMilli(r.LastMs)).Truncate(time.Second).String() + " ago"
		ovr := "-"
		if r.Override != nil {
			ovr = printable(r.Override.Key) + " " + limitText(*r.Override)
		}
		t.row(printable(r.Key), printable(policy), fmt.Sprint(r.Denials), retry, last, ovr)
	}
	if err := t.flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "From %s.\n", count(processes, "process", "processes"))
	return err
}
