package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/keys"
	"github.com/rlfn/rlfn/internal/limitspec"
	"github.com/rlfn/rlfn/internal/override"
)

// resetCommand and inspectCommand are an operator's view of one principal: every limiter key
// a client keeps for it, all in its cluster slot, found on the one node that holds it.
func resetCommand() *cli.Command {
	return &cli.Command{
		OnUsageError: usageErrorHandler,
		Name:         "reset",
		Usage:        "give a principal a fresh start: delete every limiter it has, or one",
		ArgsUsage:    "KEY [ALGORITHM]",
		Description: "Deletes every key <prefix>{<key>}:<algorithm>[:<name>] of KEY, in one command on the node of\n" +
			"its slot: its next calls are decided by fresh limiters. ALGORITHM (and --name) deletes that\n" +
			"limiter alone, as the client's Limiter.Reset with a limit. Its block stays (rlfn unblock).\n" +
			"A service's processes may still hand out units their leased budgets took before (for\n" +
			"Options.BudgetAge at most) and answer cached denials until they end; see the client's\n" +
			"Limiter.Reset, which a service calls to drop its own.",
		Flags:  append(keyFlags(), &cli.StringFlag{Name: "name", Usage: "the `NAME` of ALGORITHM's limit"}),
		Action: resetAction,
	}
}

func inspectCommand() *cli.Command {
	return &cli.Command{
		OnUsageError: usageErrorHandler,
		Name:         "inspect",
		Usage:        "show every limiter a principal has: its state, its TTL, its override",
		ArgsUsage:    "KEY [ALGORITHM]",
		Description: "Reads every key <prefix>{<key>}:* of KEY on the node of its slot (its block included) and\n" +
			"decodes its state. Where an override applies (rlfn override), it shows it, and what a\n" +
			"peek under its limit answers now; ALGORITHM with rlfn call's limit flags (and --name) gives\n" +
			"the code's limit of that limiter, which is peeked where no override applies. Changes nothing.",
		Flags:  append(keyFlags(), append(limitFlags(), &cli.StringFlag{Name: "name", Usage: "the `NAME` of ALGORITHM's limit"})...),
		Action: inspectAction,
	}
}

// principalKeys finds the server keys of key's limiters (and block) under prefix, those
// starting <prefix>{<key>}:, on the node that holds key's slot. It returns a client of that
// node.
func principalKeys(ctx context.Context, c *cli.Context, prefix, key string) (node string, vk valkey.Client, found []string, err error) {
	tag := keys.Compose(prefix, key, "", "") // <prefix>{<key>}:
	return keysOfSlot(ctx, c, tag, tag)
}

// keysOfSlot finds the keys starting with start on the node that holds key's slot (the
// primary of a standalone server), and returns a client of that node. In a cluster it reads
// that slot alone (CLUSTER GETKEYSINSLOT), never the node's whole keyspace: a principal's
// keys are found at the cost of its slot's, whatever the node holds. A standalone server has
// no slots: a SCAN matching start.
func keysOfSlot(ctx context.Context, c *cli.Context, key, start string) (node string, vk valkey.Client, found []string, err error) {
	opt, err := clientOption(c)
	if err != nil {
		return "", nil, nil, err
	}
	opt, topo, err := towardPrimary(ctx, opt)
	if err != nil {
		return "", nil, nil, err
	}
	node = opt.InitAddress[0]
	if topo.Cluster {
		n, ok := topo.KeyOwner(key)
		if !ok {
			return "", nil, nil, fmt.Errorf("no node serves the slot of %s", printable(key))
		}
		node = n.Addr
	}
	opt.InitAddress, opt.ForceSingleClient, opt.DisableCache = []string{node}, true, true
	opt.Standalone.ReplicaAddress = nil
	vk, err = valkey.NewClient(opt)
	if err != nil {
		return "", nil, nil, connectHint(opt, fmt.Errorf("%s: %w", node, err))
	}
	if topo.Cluster {
		found, err = slotKeys(ctx, vk, key, start)
	} else {
		found, err = scanKeys(ctx, vk, start)
	}
	if err != nil {
		vk.Close()
		return "", nil, nil, fmt.Errorf("%s: %w", node, err)
	}
	slices.Sort(found)
	return node, vk, slices.Compact(found), nil
}

// slotKeys are the keys of key's slot that start with start, read from the node serving it.
func slotKeys(ctx context.Context, vk valkey.Client, key, start string) ([]string, error) {
	slot, err := vk.Do(ctx, vk.B().ClusterKeyslot().Key(key).Build()).AsInt64()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER KEYSLOT: %w", err)
	}
	n, err := vk.Do(ctx, vk.B().ClusterCountkeysinslot().Slot(slot).Build()).AsInt64()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER COUNTKEYSINSLOT: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	// keys written meanwhile may be left out, as a SCAN may leave them
	all, err := vk.Do(ctx, vk.B().ClusterGetkeysinslot().Slot(slot).Count(n).Build()).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER GETKEYSINSLOT: %w", err)
	}
	var found []string
	for _, k := range all {
		if strings.HasPrefix(k, start) {
			found = append(found, k)
		}
	}
	return found, nil
}

// scanKeys are the keys of a standalone server that start with start.
func scanKeys(ctx context.Context, vk valkey.Client, start string) ([]string, error) {
	var found []string
	var cursor uint64
	for {
		e, err := vk.Do(ctx, vk.B().Scan().Cursor(cursor).Match(globEscape(start)+"*").Count(1000).Build()).AsScanEntry()
		if err != nil {
			return nil, fmt.Errorf("SCAN: %w", err)
		}
		found = append(found, e.Elements...)
		if cursor = e.Cursor; cursor == 0 {
			return found, nil
		}
	}
}

// globEscape escapes SCAN MATCH's special characters.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// limiterOf splits a server key of tag (<prefix>{<key>}:) into its algorithm and name.
func limiterOf(tag, serverKey string) (algorithm, name string) {
	rest := strings.TrimPrefix(serverKey, tag)
	algorithm, name, _ = strings.Cut(rest, ":")
	return algorithm, name
}

// principalArg reads KEY, --prefix and --policy as block does; inspect takes an ALGORITHM
// after KEY, which inspectLimit reads.
func principalArg(c *cli.Context) (prefix, key string, err error) {
	takesAlgorithm := c.Command.Name == "inspect" || c.Command.Name == "reset"
	if takesAlgorithm && c.NArg() > 2 {
		return "", "", usageError(c, fmt.Sprintf("takes KEY and ALGORITHM only; extra %q after %q", c.Args().Get(2), c.Args().Get(1)))
	}
	if takesAlgorithm && c.NArg() == 2 {
		if key, err = principalKey(c, c.Args().First()); err != nil {
			return "", "", err
		}
		return c.String("prefix"), key, nil
	}
	key, _, err = blockKey(c)
	return c.String("prefix"), key, err
}

// principalKey is KEY under --policy.
func principalKey(c *cli.Context, key string) (string, error) {
	if key == "" {
		return "", usageError(c, `KEY is missing: the argument is "" (an unset variable?)`)
	}
	if c.String("prefix") == "" {
		return "", usageError(c, `--prefix must not be empty (a service's Limiter uses "rl:" unless it set another)`)
	}
	if c.IsSet("policy") {
		if err := checkPolicyName(c.String("policy")); err != nil {
			return "", usageError(c, "--policy "+err.Error())
		}
		key = policyKey(c.String("policy"), key)
	}
	return key, nil
}

// inspectLimit is the code's limit inspect was given (ALGORITHM and its flags), nil if none.
func inspectLimit(c *cli.Context) (client.Limit, error) {
	if c.NArg() < 2 {
		return nil, nil
	}
	spec, err := flagSpec(c, c.Args().Get(1))
	if err != nil {
		return nil, usageError(c, err.Error())
	}
	if spec.alg.Leases() {
		return nil, usageError(c, "a concurrency limit has no peek: inspect shows its live leases")
	}
	l := spec.build()
	if err := l.Validate(); err != nil {
		return nil, usageError(c, spec.explain(err).Error())
	}
	return l, nil
}

type resetJSON struct {
	Key     string   `json:"key"`
	Node    string   `json:"node"`
	Deleted []string `json:"deleted"`
}

// onPrincipal reads KEY, --prefix and --policy, finds the principal's keys on its node, and
// runs f with them and a client of that node.
func onPrincipal(c *cli.Context, f func(ctx context.Context, prefix, key, node string, vk valkey.Client, found []string) error) error {
	prefix, key, err := principalArg(c)
	if err != nil {
		return err
	}
	ctx, cancel := commandContext(c)
	defer cancel()
	node, vk, found, err := principalKeys(ctx, c, prefix, key)
	if err != nil {
		return err
	}
	defer vk.Close()
	return f(ctx, prefix, key, node, vk, found)
}

func resetAction(c *cli.Context) error {
	alg, err := resetLimiter(c)
	if err != nil {
		return err // before any connection
	}
	return onPrincipal(c, func(ctx context.Context, prefix, key, node string, vk valkey.Client, found []string) error {
		return reset(ctx, c, prefix, key, node, vk, found, alg)
	})
}

// resetLimiter is the algorithm of the one limiter reset was given (ALGORITHM), nil for all.
func resetLimiter(c *cli.Context) (*limitspec.Algorithm, error) {
	if c.NArg() < 2 {
		if c.IsSet("name") {
			return nil, usageError(c, "--name names a limit of ALGORITHM: give ALGORITHM after KEY")
		}
		return nil, nil
	}
	a, ok := limitspec.Lookup(c.Args().Get(1))
	if !ok {
		return nil, usageError(c, fmt.Sprintf("unknown algorithm %q: %s", c.Args().Get(1), or(limitspec.Names()...)))
	}
	return &a, nil
}

func reset(ctx context.Context, c *cli.Context, prefix, key, node string, vk valkey.Client, found []string, alg *limitspec.Algorithm) error {
	block := limitspec.BlockKey(prefix, key)
	var del []string
	for _, k := range found {
		if k != block && (alg == nil || k == alg.Key(prefix, key, limitspec.Values{Name: c.String("name")})) {
			del = append(del, k)
		}
	}
	if len(del) > 0 {
		if err := vk.Do(ctx, vk.B().Del().Key(del...).Build()).Error(); err != nil {
			return fmt.Errorf("%s: DEL: %w", node, err)
		}
	}
	if c.Bool("json") {
		out := resetJSON{Key: key, Node: node, Deleted: del}
		if out.Deleted == nil {
			out.Deleted = []string{}
		}
		return writeJSON(c.App.Writer, out)
	}
	w := c.App.Writer
	if len(del) == 0 {
		// Say what the principal has, so that a reset of the wrong algorithm (or name) is
		// seen as such rather than read as "nothing there".
		tag := keys.Compose(prefix, key, "", "")
		var has []string
		for _, k := range found {
			if k != block {
				has = append(has, strings.TrimPrefix(k, tag))
			}
		}
		switch {
		case alg == nil || len(has) == 0:
			_, err := fmt.Fprintf(w, "Nothing to reset: %s has no limiter state.\n", printable(key))
			return err
		default:
			asked := strings.TrimPrefix(alg.Key(prefix, key, limitspec.Values{Name: c.String("name")}), tag)
			_, err := fmt.Fprintf(w, "Nothing to reset: %s has no %s state; it has: %s.\n", printable(key), printable(asked), printable(strings.Join(has, ", ")))
			return err
		}
	}
	for _, k := range del {
		fmt.Fprintf(w, "deleted %s\n", printable(k))
	}
	if slices.Contains(found, block) {
		fmt.Fprintf(w, "%s is blocked still: rlfn unblock lifts it.\n", printable(key))
	}
	return nil
}

// limiterJSON is one key of inspect.
type limiterJSON struct {
	Key       string             `json:"key"`
	Algorithm string             `json:"algorithm"`
	Name      string             `json:"name,omitempty"`
	TTLMs     int64              `json:"ttl_ms"` // -1: no expiry
	State     map[string]any     `json:"state"`
	Override  *override.Override `json:"override,omitempty"`
	Peek      *callJSONish       `json:"peek,omitempty"`
}

// callJSONish is a peek's answer, in the library's units.
type callJSONish struct {
	Allowed      bool  `json:"allowed"`
	Limit        int64 `json:"limit"`
	Remaining    int64 `json:"remaining"`
	RetryAfterMs int64 `json:"retry_after_ms"`
	ResetAfterMs int64 `json:"reset_after_ms"`
}

type inspectJSON struct {
	Key      string        `json:"key"`
	Node     string        `json:"node"`
	Limiters []limiterJSON `json:"limiters"`
}

func inspectAction(c *cli.Context) error {
	if _, err := inspectLimit(c); err != nil {
		return err // before any connection
	}
	return onPrincipal(c, func(ctx context.Context, prefix, key, node string, vk valkey.Client, found []string) error {
		return inspect(ctx, c, prefix, key, node, vk, found)
	})
}

func inspect(ctx context.Context, c *cli.Context, prefix, key, node string, vk valkey.Client, found []string) error {
	tag := keys.Compose(prefix, key, "", "")
	var ovr []override.Override
	d, err := dialLimiter(ctx, c, prefix, false)
	if err != nil {
		return err
	}
	defer d.close()
	store, err := storeOf(ctx, c, prefix)
	if err != nil {
		return err
	}
	ovr = store
	given, err := inspectLimit(c)
	if err != nil {
		return err
	}
	out := inspectJSON{Key: key, Node: node, Limiters: []limiterJSON{}}
	for _, k := range found {
		alg, name := limiterOf(tag, k)
		row := limiterJSON{Key: k, Algorithm: alg, Name: name}
		rs := vk.DoMulti(ctx, vk.B().Type().Key(k).Build(), vk.B().Pttl().Key(k).Build(), vk.B().Get().Key(k).Build(), vk.B().Zcard().Key(k).Build())
		typ, _ := rs[0].ToString()
		if typ == "none" {
			continue // expired since the SCAN
		}
		row.TTLMs, _ = rs[1].AsInt64()
		raw, _ := rs[2].ToString()
		n, _ := rs[3].AsInt64()
		row.State = decodeState(alg, typ, raw, n)
		var peek client.Limit // the limit in force, where known
		if alg != "block" {
			if o := inForce(ovr, override.ID{Policy: override.Policy{Algorithm: alg, Name: name}, Key: key}, time.Now()); o != nil {
				row.Override = o
				peek, _ = clientLimit(*o)
			} else if given != nil && d.lim.Key(key, given) == k {
				peek = given
			}
		}
		if peek != nil {
			if res, err := d.lim.Peek(ctx, key, peek); err == nil {
				row.Peek = &callJSONish{Allowed: res.Allowed, Limit: res.Limit, Remaining: res.Remaining,
					RetryAfterMs: limitspec.RetryAfterMs(res.RetryAfter), ResetAfterMs: res.ResetAfter.Milliseconds()}
			}
		}
		out.Limiters = append(out.Limiters, row)
	}
	if c.Bool("json") {
		return writeJSON(c.App.Writer, out)
	}
	return writeInspect(c.App.Writer, out)
}

// storeOf reads the overrides under prefix.
func storeOf(ctx context.Context, c *cli.Context, prefix string) ([]override.Override, error) {
	var all []override.Override
	err := withStore(c, prefix, true, func(_ context.Context, s *override.Store) error {
		snap, err := s.Read(ctx)
		all = snap.Overrides
		return err
	})
	return all, err
}

// clientLimit is an override's limit as the client takes it; nil for concurrency.
func clientLimit(o override.Override) (client.Limit, error) {
	v, err := o.Limit.Values(o.Algorithm)
	if err != nil {
		return nil, err
	}
	alg, ok := limitspec.Lookup(o.Algorithm)
	if !ok {
		return nil, fmt.Errorf("unknown algorithm %q", o.Algorithm)
	}
	lv := limitspec.Values{Limit: v.Limit, Capacity: v.Capacity, Rate: v.Rate, Reserve: v.Reserve,
		Window: v.Window, Period: v.Period, Lease: v.Lease, Penalty: v.Penalty, Name: o.Name, Anchor: v.Anchor,
		Calendar: client.Period(v.Calendar)}
	if v.Shape {
		lv.Mode = client.Shape
	}
	if alg.Leases() {
		return nil, limitspec.Concurrency(lv).Validate()
	}
	l := alg.Limit(lv)
	return l, l.Validate()
}

// decodeState reads a limiter's state as the library's formats hold it (docs/library.md).
func decodeState(alg, typ, raw string, members int64) map[string]any {
	f := func(i int) float64 {
		return math.Float64frombits(binary.LittleEndian.Uint64([]byte(raw[8*i : 8*i+8])))
	}
	ms := func(v float64) string { return time.UnixMilli(int64(v)).UTC().Format(time.RFC3339Nano) }
	switch {
	case typ == "zset" && alg == "concurrency":
		// the marker member '' tells the leases from a sliding log (docs/library.md)
		return map[string]any{"leases": max(0, members-1)}
	case typ == "zset":
		return map[string]any{"entries": members}
	case typ == "string" && alg == "block" && len(raw) == 8:
		return map[string]any{"blocked_until": ms(f(0))}
	case typ == "string" && (alg == "fixed_window" || alg == "calendar") && len(raw) == 16:
		return map[string]any{"window_start": ms(f(0)), "count": int64(f(1))}
	case typ == "string" && alg == "sliding_window" && len(raw) == 24:
		return map[string]any{"window_start": ms(f(0)), "previous": int64(f(1)), "current": int64(f(2))}
	case typ == "string" && (alg == "token_bucket" || alg == "leaky_bucket") && len(raw) == 24:
		// debt in ticks of 1/p unit: the tokens missing from a full bucket, a leaky bucket's level
		p := f(2)
		level := int64(0)
		if p > 0 {
			level = int64(math.Ceil(f(1) / p))
		}
		return map[string]any{"at": time.UnixMicro(int64(f(0))).UTC().Format(time.RFC3339Nano), "level": level}
	}
	return map[string]any{"type": typ, "bytes": len(raw)}
}

// stateText is a decoded state on one line, its fields in a fixed order.
func stateText(s map[string]any) string {
	var parts []string
	for _, k := range []string{"count", "current", "previous", "level", "entries", "leases", "window_start", "at", "blocked_until", "type", "bytes"} {
		if v, ok := s[k]; ok {
			parts = append(parts, fmt.Sprintf("%s=%v", k, v))
		}
	}
	return strings.Join(parts, " ")
}

func writeInspect(w io.Writer, out inspectJSON) error {
	if len(out.Limiters) == 0 {
		_, err := fmt.Fprintf(w, "%s has no limiter state on %s.\n", printable(out.Key), out.Node)
		return err
	}
	t := newTable(w, "KEY", "TTL", "STATE", "OVERRIDE", "PEEK")
	for _, l := range out.Limiters {
		ttl := "-"
		if l.TTLMs >= 0 {
			ttl = (time.Duration(l.TTLMs) * time.Millisecond).String()
		}
		ovr, peek := "-", "-"
		if l.Override != nil {
			ovr = printable(l.Override.Key) + " " + limitText(*l.Override)
		}
		if l.Peek != nil {
			peek = fmt.Sprintf("%s, %d of %d left", map[bool]string{true: "allowed", false: "denied"}[l.Peek.Allowed], l.Peek.Remaining, l.Peek.Limit)
		}
		t.row(printable(l.Key), ttl, stateText(l.State), ovr, peek)
	}
	return t.flush()
}
