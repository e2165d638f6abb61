package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/internal/limitspec"
)

// callCommand is built afresh for each app: cli.App.Setup writes into its commands.
func callCommand() *cli.Command {
	return &cli.Command{
		OnUsageError: usageErrorHandler,
		Name:         "call",
		Usage:        "make a decision as a service would, on the same key",
		ArgsUsage:    "ALGORITHM KEY",
		Description: "ALGORITHM is fixed_window, sliding_log, sliding_window (--limit, --window), token_bucket\n" +
			"or leaky_bucket (--capacity, --rate, --period; leaky_bucket also --mode), calendar (--limit,\n" +
			"--period, and --anchor, --zone), or concurrency (--limit slots, --lease).\n" +
			"KEY is the principal (user:42); the server key is composed as the Go client composes it,\n" +
			"<prefix>{<key>}:<algorithm>[:<name>], so the call reads and changes the state a service sees.\n" +
			"A service on client/httplimit scopes each policy's state by its name: the client's key is\n" +
			"<policy>:<principal>. --policy NAME composes it so, e.g. --policy api alice reaches the state\n" +
			"the middleware's Policy{Name: \"api\"} keeps for alice, rl:{api:alice}:<algorithm>.\n" +
			"Durations use Go syntax: 500ms, 1s, 1m, 1h.\n" +
			"\n" +
			"With library 1.1.0:\n" +
			"  --reserve N   admitted only if N units are left after the call: they are kept for\n" +
			"                critical callers (--critical), who may use them\n" +
			"  --refund N    give N units back (charge a predicted cost, refund what was not used)\n" +
			"  concurrency   take a slot for a new holder (its ID is printed), or with --id take or\n" +
			"                renew that holder's slot; --release --id frees it\n" +
			"  --also SPEC   decide one more limit with the first, all or nothing (repeatable). SPEC\n" +
			"                is ALGORITHM,field=value,...: the fields are the flags' names, key=\n" +
			"                (default: KEY) and policy= (default: --policy; a Rule of httplimit's\n" +
			"                Policy.Also keys its state by its own Name, e.g. policy=login-ip,key=192.0.2.7)\n" +
			"                and cost= (default: --cost), what this limit takes: 60 requests and 150000\n" +
			"                tokens a minute, 1200 tokens a request, is --limit 60 --window 1m --also\n" +
			"                fixed_window,name=tokens,limit=150000,window=1m,cost=1200;\n" +
			"                e.g. token_bucket,key=global,capacity=100,rate=10,period=1s.\n" +
			"                RULE names the limit that decided: 1 is ALGORITHM KEY, 2 the first --also;\n" +
			"                the rows (N) under it are the other limits, as the call left them.\n" +
			"\n" +
			"With library 1.2.0:\n" +
			"  calendar      at most --limit units per --period: day, week, month or year, starting at\n" +
			"                --anchor's clock time (a date and time as the wall clock of --zone reads\n" +
			"                it, e.g. --anchor 2026-01-31T00:00 --zone Europe/Berlin: months start on\n" +
			"                the 31st, or the month's last day). Default: midnight UTC, weeks from\n" +
			"                Monday, months from the 1st, years from 1 January; --zone alone, the same\n" +
			"                in that zone. RETRY AFTER of a denial is the time to the window's end.\n" +
			"  --penalty D   a denial blocks KEY for D (every algorithm but concurrency; penalty= in\n" +
			"                --also): until then every call with a --penalty on KEY is refused, ALLOWED\n" +
			"                reads \"blocked\" and RETRY AFTER is the block's time left (see rlfn block).",
		Flags: []cli.Flag{
			decimalFlag("limit", "`N` units per window (fixed_window, sliding_log, sliding_window, calendar), or slots (concurrency)", 0),
			&cli.DurationFlag{Name: "window", Usage: "window `DURATION` (fixed_window, sliding_log, sliding_window)"},
			decimalFlag("capacity", "bucket capacity `N` (token_bucket, leaky_bucket)", 0),
			decimalFlag("rate", "`N` units refilled or leaked per period (token_bucket, leaky_bucket)", 0),
			textFlag("period", "a `PERIOD`: the DURATION of one rate period (token_bucket, leaky_bucket), or day, week, month or year (calendar)"),
			&cli.StringFlag{Name: "mode", Usage: "leaky_bucket `MODE`: police (reject when full) or shape (delay)", Value: limitspec.Modes[0].String()},
			textFlag("anchor", "calendar: windows start at `TIME`'s clock time, weekday (week), day of month (month), date (year), e.g. 2026-01-31T00:00, as --zone's clocks read it"),
			textFlag("zone", "calendar: the time `ZONE` of --anchor, an IANA name such as Europe/Berlin (default UTC)"),
			&cli.DurationFlag{Name: "penalty", Usage: "a denial blocks KEY for `DURATION`: until then calls with a --penalty are refused (" + strings.Join(takers("penalty"), ", ") + ")"},
			&cli.DurationFlag{Name: "lease", Usage: "concurrency: a lease lasts `DURATION` unless renewed"},
			&cli.StringFlag{Name: "id", Usage: fmt.Sprintf("concurrency: the lease holder `ID` (1 to %d bytes) to take, renew or --release", limitspec.MaxLeaseID)},
			&cli.BoolFlag{Name: "release", Usage: "concurrency: free --id's slot"},
			decimalFlag("reserve", "leave `N` units (slots) to critical callers: admitted only if N are left after the call", 0),
			&cli.BoolFlag{Name: "critical", Usage: "call as a critical caller, who may use the reserve"},
			&cli.StringFlag{Name: "name", Usage: "limit `NAME`, for a second limit of one algorithm on one KEY (as the client's Name)"},
			decimalFlag("cost", "`N` units the call takes", 1),
			decimalFlag("refund", "give `N` units back instead of taking --cost", 0),
			&cli.GenericFlag{Name: "also", Usage: "decide one more limit `SPEC` with the first, all or nothing (repeatable)", Value: &alsoFlag{}},
			&cli.BoolFlag{Name: "peek", Usage: "only check, consuming nothing (FCALL_RO, which a replica may serve)"},
			decimalFlag("repeat", "make the call `N` times", 1),
			&cli.StringFlag{Name: "prefix", Usage: "key `PREFIX`, as the client's Options.Prefix", Value: "rl:"},
			&cli.StringFlag{Name: "policy", Usage: "address the state of httplimit's policy `NAME`: the client's key is NAME:KEY, as the middleware composes it"},
			jsonFlag(),
		},
		Action: callAction,
	}
}

// takers are the algorithms that take the field named name, for a flag's usage.
func takers(name string) []string {
	var names []string
	for _, a := range limitspec.Algorithms {
		if a.Takes(name) {
			names = append(names, a.Name)
		}
	}
	return names
}

// callMode is what one call does.
type callMode int

const (
	modeAllow   callMode = iota // AllowN, or PeekN with --peek
	modeRefund                  // Refund
	modeAcquire                 // Acquire, or a Lease's Renew with --id
	modeRelease                 // a Lease's Release
	modeMulti                   // AllowAllN, or PeekAllN with --peek
)

// callPlan is one call, made --repeat times, checked before any connection is made.
type callPlan struct {
	mode     callMode
	prefix   string
	key      string
	limit    client.Limit       // modeAllow, modeRefund
	conc     client.Concurrency // modeAcquire, modeRelease
	id       string             // modeAcquire: "" takes a slot for a new random holder
	rules    []client.Rule      // modeMulti; rules[0] is ALGORITHM KEY
	stateKey string             // the server key of KEY's limiter (or of rules[0])
	ruleKeys []string           // modeMulti: the server key of each rule
	n        int64              // the cost, or the units refunded
	most     int64              // the largest limit or capacity of the plan: no Result.Limit or Remaining is wider
	wait     time.Duration      // the longest wait a calendar window or a penalty of the plan may reply, 0 if none
	peek     bool
	critical bool
}

func callAction(c *cli.Context) error {
	plan, err := newCallPlan(c)
	if err != nil {
		return err
	}
	repeat := decimalValue(c, "repeat")
	ctx, cancel := commandContext(c)
	defer cancel()
	if plan.critical {
		ctx = client.Critical(ctx)
	}
	d, err := dialLimiter(ctx, c, plan.prefix, plan.peek)
	if err != nil {
		return err
	}
	defer d.close()
	lim, opt, topo := d.lim, d.opt, d.topo

	// Each row is printed as its call returns: --repeat may be a billion.
	out := newCallOutput(c.App.Writer, plan, c.Bool("json"))
	for range repeat {
		row, err := plan.do(ctx, lim)
		if err != nil {
			if row.res != (client.Result{}) {
				// a decision that stands, with an error (a refund it owed failed): print both
				_ = out.add(row)
			}
			return plan.where(err, opt, topo)
		}
		if err := out.add(row); err != nil {
			return err
		}
	}
	return d.refundsLost(ctx)
}

// dialed is a Limiter of the server --url names, for one command.
type dialed struct {
	lim   *client.Limiter
	notes *limiterNotes       // the Limiter's log (notes.go)
	opt   valkey.ClientOption // where calls that write go (the primary), and reads
	topo  deployer.Topology   // unknown when only reading
	close func()
}

// dialLimiter connects to the server --url names as a service's client would, with prefix.
// A command that only reads (FCALL_RO) is answered by the node the URL names, a replica too,
// also when its primary is down. Anything else writes, on the primary.
func dialLimiter(ctx context.Context, c *cli.Context, prefix string, readOnly bool) (*dialed, error) {
	opt, err := clientOption(c)
	if err != nil {
		return nil, err
	}
	seed := opt.InitAddress[0]
	var topo deployer.Topology // unknown for a read
	if !readOnly {
		if opt, topo, err = towardPrimary(ctx, opt); err != nil {
			return nil, err
		}
	}
	opt.SendToReplicas = func(cmd valkey.Completed) bool { return cmd.IsReadOnly() }
	vk, err := valkey.NewClient(opt)
	if err != nil {
		node := opt.InitAddress[0]
		if node != seed {
			node += " (the primary of " + seed + ", where the call writes)"
		}
		return nil, connectHint(opt, fmt.Errorf("%s: %w", node, &deployer.ConnectError{Err: err}))
	}
	// The command's --timeout bounds each call, not the client's 100ms default, which suits a
	// service's hot path rather than a person across a slow link; errors are returned, never
	// replaced by a fallback decision (the client's default policy).
	// ReturnError: rlfn shows what the server answers; a local decision would hide a node that
	// cannot decide (a 1.0.0 node under a 1.1 call, a dead shard) behind an answer of its own.
	notes := &limiterNotes{}
	lim, err := client.New(vk, client.Options{
		Prefix:   prefix,
		Deadline: c.Duration("timeout"),
		Fallback: client.ReturnError,
		Logger:   slog.New(notes),
	})
	if err != nil {
		vk.Close()
		return nil, err
	}
	return &dialed{lim: lim, notes: notes, opt: opt, topo: topo, close: vk.Close}, nil
}

// towardPrimary points opt at the primary when its URL names a replica of a standalone
// primary, found as status and deploy find it: a call that writes, sent to a replica, fails
// READONLY. The replica named stays the node read-only commands (FCALL_RO) are sent to. A
// cluster needs nothing: the client finds each key's primary from any node. The topology
// found is returned too.
func towardPrimary(ctx context.Context, opt valkey.ClientOption) (valkey.ClientOption, deployer.Topology, error) {
	target, err := deployer.Discover(ctx, opt)
	if err != nil {
		return opt, deployer.Topology{}, connectHint(opt, err)
	}
	defer target.Close()
	topo, seed := target.Topology(), opt.InitAddress[0]
	if topo.Cluster {
		return opt, topo, nil
	}
	for _, n := range topo.Nodes {
		if n.Role == deployer.RolePrimary && n.Addr != seed {
			opt.InitAddress = []string{n.Addr}
			opt.Standalone.ReplicaAddress = []string{seed}
		}
	}
	return opt, topo, nil
}

// where names, in a call's error, the node it was sent to and the key, as far as rlfn knows
// them and the error does not already: the server's reply alone ("CLUSTERDOWN", "the
// ratelimit library is not loaded") does not say which node of a cluster gave it. A
// standalone call goes to the node opt names (a peek to the one the URL names); a cluster's
// to the primary of the key's slot (a peek perhaps to one of its replicas; a peek is not
// discovered, so only its key is named); several keys name no key.
func (p *callPlan) where(err error, opt valkey.ClientOption, topo deployer.Topology) error {
	if ke := (*client.KeyError)(nil); errors.As(err, &ke) {
		// refused before any call: no node to name, and the key may be a megabyte
		return err
	}
	text := err.Error()
	var node, key string
	if keys := p.keys(); len(keys) == 1 && !strings.Contains(text, keys[0]) {
		key = keys[0]
	}
	switch {
	case p.peek:
		// not discovered: a standalone node or a cluster's, which rlfn does not know
	case topo.Cluster && key != "":
		if n, ok := topo.KeyOwner(key); ok {
			node = n.Addr
		}
	case !topo.Cluster && len(opt.InitAddress) > 0:
		node = opt.InitAddress[0]
	}
	if node != "" && strings.Contains(text, node) {
		node = ""
	}
	switch {
	case node != "" && key != "":
		return &placedError{where: node + " (" + key + ")", err: err}
	case node != "" || key != "":
		return &placedError{where: node + key, err: err}
	}
	return err
}

// placedError is a call's error with where it happened in front.
type placedError struct {
	where string
	err   error
}

func (e *placedError) Error() string { return e.where + ": " + e.err.Error() }

func (e *placedError) Unwrap() error { return e.err }

// newCallPlan reads and checks the command line: every mistake is reported before dialling,
// whatever the state of the server. (The client validates a limit exactly as the library does.)
func newCallPlan(c *cli.Context) (*callPlan, error) {
	switch args := c.Args().Slice(); {
	case len(args) == 0:
		return nil, usageError(c, "needs ALGORITHM and KEY")
	case len(args) == 1:
		return nil, usageError(c, fmt.Sprintf("needs KEY after ALGORITHM %s", printable(args[0])))
	case len(args) > 2:
		// Most often a flag's value split in two, or a flag without its dashes.
		extra := make([]string, len(args)-2)
		for i, a := range args[2:] {
			extra[i] = strconv.Quote(a)
		}
		return nil, usageError(c, fmt.Sprintf("takes ALGORITHM and KEY only; extra %s %s after KEY %s",
			map[bool]string{true: "argument", false: "arguments"}[len(extra) == 1], strings.Join(extra, " "), strconv.Quote(args[1])))
	case args[1] == "":
		// An unset variable in a script ("$USER_ID"): the call would decide, on a key that
		// no service uses, and seem to work. The client refuses an empty key too, and
		// --also's key= is refused empty as well.
		return nil, usageError(c, `KEY is missing: the second argument is "" (an unset variable?)`)
	}
	spec, err := flagSpec(c, c.Args().Get(0))
	if err != nil {
		return nil, usageError(c, err.Error())
	}
	if decimalValue(c, "repeat") < 1 {
		return nil, usageError(c, "--repeat must be at least 1")
	}
	if c.String("prefix") == "" {
		// The client has no empty prefix (Options.Prefix "" is its default, "rl:"): the call
		// would reach a key no Limiter uses.
		return nil, usageError(c, `--prefix must not be empty (a service's Limiter uses "rl:" unless it set another)`)
	}
	key := c.Args().Get(1)
	if c.IsSet("policy") {
		if err := checkPolicyName(c.String("policy")); err != nil {
			return nil, usageError(c, "--policy "+err.Error())
		}
		key = policyKey(c.String("policy"), key)
	}
	p := &callPlan{
		prefix: c.String("prefix"), key: key, n: decimalValue(c, "cost"),
		peek: c.Bool("peek"), critical: c.Bool("critical"), id: c.String("id"),
		stateKey: spec.alg.Key(c.String("prefix"), key, spec.values),
	}
	also := *c.Generic("also").(*alsoFlag)
	// Flags that do not go together, as "--a with --b" or "--a with ALGORITHM".
	conflict := func(a, b string) error {
		if !strings.HasPrefix(b, "-") {
			return usageError(c, fmt.Sprintf("--%s does not apply to %s", a, b))
		}
		return usageError(c, fmt.Sprintf("--%s does not go with %s", a, b))
	}
	given := func(names ...string) string {
		for _, n := range names {
			if c.IsSet(n) {
				return n
			}
		}
		return ""
	}
	switch {
	case spec.alg.Leases():
		if f := given("cost", "refund", "peek", "also"); f != "" {
			return nil, conflict(f, spec.algorithm)
		}
		p.mode, p.conc, p.most = modeAcquire, spec.concurrency(), spec.most()
		if c.Bool("release") {
			p.mode = modeRelease
			if p.id == "" {
				return nil, usageError(c, "--release needs --id")
			}
			if c.IsSet("critical") {
				return nil, conflict("critical", "--release")
			}
		}
		if err := p.conc.Validate(); err != nil {
			return nil, usageError(c, spec.explain(err).Error())
		}
		if c.IsSet("id") && (len(p.id) < 1 || len(p.id) > limitspec.MaxLeaseID) {
			return nil, usageError(c, fmt.Sprintf("--id must be 1 to %d bytes", limitspec.MaxLeaseID))
		}
		return p, nil
	case given("id", "release") != "":
		return nil, conflict(given("id", "release"), spec.algorithm)
	}

	p.limit, p.most, p.wait = spec.build(), spec.most(), spec.longestWait()
	if err := p.limit.Validate(); err != nil {
		return nil, usageError(c, spec.explain(err).Error())
	}
	switch {
	case c.IsSet("refund"):
		if f := given("cost", "peek", "reserve", "critical", "also"); f != "" {
			return nil, conflict(f, "--refund")
		}
		p.mode, p.n = modeRefund, decimalValue(c, "refund")
		if p.n < 0 || p.n > limitspec.MaxUnits {
			return nil, usageError(c, fmt.Sprintf("--refund must be 0 to %d", limitspec.MaxUnits))
		}
		return p, nil
	case p.n < 0 || p.n > limitspec.MaxUnits:
		return nil, usageError(c, fmt.Sprintf("--cost must be 0 to %d", limitspec.MaxUnits))
	case len(also) == 0:
		return p, nil
	}

	p.mode = modeMulti
	p.rules = []client.Rule{{Key: p.key, Limit: p.limit}}
	p.ruleKeys = []string{p.stateKey}
	seen := map[string]int{p.stateKey: 1}
	perKey := map[string]int{p.key: 1}
	for _, text := range also {
		s, err := parseSpec(text)
		if err != nil {
			return nil, usageError(c, fmt.Sprintf("--also %s: %v", text, err))
		}
		r := client.Rule{Key: c.Args().Get(1), Limit: s.build(), Cost: s.cost}
		if s.key != "" {
			r.Key = s.key
		}
		switch {
		case s.set["policy"]:
			r.Key = policyKey(s.policy, r.Key)
		case c.IsSet("policy"):
			r.Key = policyKey(c.String("policy"), r.Key)
		}
		if err := r.Limit.Validate(); err != nil {
			return nil, usageError(c, fmt.Sprintf("--also %s: %v", text, s.explain(err)))
		}
		k := s.alg.Key(p.prefix, r.Key, s.values)
		if i, ok := seen[k]; ok {
			return nil, usageError(c, fmt.Sprintf("--also %s: is the limiter of rule %d (%s): give one a name", text, i, k))
		}
		seen[k] = len(p.rules) + 1
		p.ruleKeys = append(p.ruleKeys, k)
		if perKey[r.Key]++; perKey[r.Key] > maxRulesPerKey {
			return nil, usageError(c, fmt.Sprintf("--also %s: more than %d limits for key %s", text, maxRulesPerKey, r.Key))
		}
		p.rules = append(p.rules, r)
		p.most, p.wait = max(p.most, s.most()), max(p.wait, s.longestWait())
	}
	return p, nil
}

// maxRulesPerKey is how many limits of one key one rl_multi call decides.
const maxRulesPerKey = 16

// callRow is one call's outcome as printed.
type callRow struct {
	key  string // the server key of the limit that decided
	id   string // a lease's holder
	rule int    // modeMulti: the 1-based index of the limit that decided
	res  client.Result
	each []ruleRow // modeMulti without --peek: every limit as the call left it, in rule order
}

// ruleRow is one limit of a decision on several, as the call left it (client.AllowAllEach).
type ruleRow struct {
	rule int // 1-based
	key  string
	res  client.Result
}

// do makes the call once.
func (p *callPlan) do(ctx context.Context, lim *client.Limiter) (callRow, error) {
	var row callRow
	var err error
	switch p.mode {
	case modeAllow:
		row.key = p.stateKey
		if p.peek {
			row.res, err = lim.PeekN(ctx, p.key, p.limit, p.n)
		} else {
			row.res, err = lim.AllowN(ctx, p.key, p.limit, p.n)
		}
	case modeRefund:
		row.key = p.stateKey
		row.res, err = lim.Refund(ctx, p.key, p.limit, p.n)
	case modeAcquire, modeRelease:
		row.key, row.id = p.stateKey, p.id
		var lease *client.Lease
		switch {
		case p.id == "":
			lease, row.res, err = lim.Acquire(ctx, p.key, p.conc)
			if lease != nil {
				row.id = lease.ID()
			}
		case p.mode == modeRelease:
			if lease, err = lim.Lease(p.key, p.conc, p.id); err == nil {
				row.res, err = lease.Release(ctx)
			}
		default:
			if lease, err = lim.Lease(p.key, p.conc, p.id); err == nil {
				row.res, err = lease.Renew(ctx)
			}
		}
	case modeMulti:
		if p.peek {
			row.res, err = lim.PeekAllN(ctx, p.rules, p.n)
		} else {
			var each []client.Result
			row.res, each, err = lim.AllowAllEach(ctx, p.rules, p.n)
			for i, r := range each {
				if r.Limit != 0 { // 0: its state could not be read
					row.each = append(row.each, ruleRow{i + 1, p.ruleKeys[i], r})
				}
			}
		}
		row.key, row.rule = p.ruleKeys[row.res.Rule], row.res.Rule+1
	}
	return row, err
}

// callOutput prints the calls as they are made: a table whose columns are as wide as the plan
// can fill them (its keys, its holder's ID, its largest limit), so that every row is written
// at once and none is held; or JSON Lines (one object per call).
type callOutput struct {
	w    io.Writer
	mode callMode
	t    *columns // nil for JSON
}

func newCallOutput(w io.Writer, p *callPlan, asJSON bool) *callOutput {
	o := &callOutput{w: w, mode: p.mode}
	if asJSON {
		return o
	}
	key, units := 0, len(strconv.FormatInt(p.most, 10))
	// A window of days or a long penalty replies waits wider than the headers: its columns are
	// as wide as its longest, so that the rows stay aligned.
	wait := 0
	if p.wait > 0 {
		wait = len(human(p.wait - time.Millisecond))
	}
	for _, k := range p.keys() {
		key = max(key, len(printable(k)))
	}
	switch p.mode {
	case modeAcquire:
		id := len(printable(p.id))
		if p.id == "" {
			id = 32 // a new holder's random ID: 32 hex digits
		}
		o.t = newColumns(w, []int{key, id, 0, units, units},
			"KEY", "ID", "ALLOWED", "LIMIT", "REMAINING", "RETRY AFTER", "RESET AFTER")
	case modeRelease:
		o.t = newColumns(w, []int{key, len(printable(p.id)), 0, units, units},
			"KEY", "ID", "HELD", "LIMIT", "REMAINING", "RETRY AFTER", "RESET AFTER")
	case modeMulti:
		// the other limits' rows are "(N)"
		o.t = newColumns(w, []int{len(strconv.Itoa(len(p.rules))) + 2, key, 0, units, units, wait, wait},
			"RULE", "KEY", "ALLOWED", "LIMIT", "REMAINING", "RETRY AFTER", "RESET AFTER", "DELAY")
	default:
		o.t = newColumns(w, []int{key, 0, units, units, wait, wait},
			"KEY", "ALLOWED", "LIMIT", "REMAINING", "RETRY AFTER", "RESET AFTER", "DELAY")
	}
	return o
}

// keys are the server keys a row of the plan may name.
func (p *callPlan) keys() []string {
	switch p.mode {
	case modeMulti:
		return p.ruleKeys
	}
	return []string{p.stateKey}
}

// add prints one call's row.
func (o *callOutput) add(row callRow) error {
	if o.t == nil {
		return writeJSONLine(o.w, resultJSON(o.mode, row))
	}
	key := printable(row.key)
	cells := resultCells(key, row.res)
	switch o.mode {
	case modeAcquire, modeRelease:
		id := printable(row.id)
		if id == "" {
			id = "-" // denied: no holder was given a slot
		}
		cells = append([]string{key, id}, cells[1:6]...)
	case modeMulti:
		for _, e := range row.each {
			if e.rule == row.rule {
				// its own reset: the reply of one key's limits says the longest of theirs
				cells[5] = human(e.res.ResetAfter)
			}
		}
		if row.res.Blocked && row.res.Limit == 0 {
			// The block decided (LIMIT and REMAINING are its 0): its own reset is its time
			// left, as its RETRY AFTER, not the peek of a limit the call never reached.
			cells[5] = human(row.res.RetryAfter)
		}
		cells = append([]string{strconv.Itoa(row.rule)}, cells...)
		if err := o.t.row(cells...); err != nil {
			return err
		}
		// then the call's other limits, as it left them
		for _, e := range row.each {
			if e.rule == row.rule {
				continue
			}
			if err := o.t.row(append([]string{"(" + strconv.Itoa(e.rule) + ")"}, resultCells(printable(e.key), e.res)...)...); err != nil {
				return err
			}
		}
		return nil
	}
	return o.t.row(cells...)
}

// callJSON is the library's reply in its own units: scripts compare it with FCALL's. Every
// line of a mode has the same fields: id in each of a concurrency call's, rule in each of a
// several-limit call's (and limits without --peek), none elsewhere.
type callJSON struct {
	Key          string      `json:"key"`
	ID           *string     `json:"id,omitempty"`   // concurrency: the lease holder; "" when a new holder was refused
	Rule         *int        `json:"rule,omitempty"` // --also: the limit that decided, 1 for ALGORITHM KEY
	Allowed      bool        `json:"allowed"`        // a release: whether the holder held a slot
	Blocked      bool        `json:"blocked"`        // denied by KEY's block (a --penalty), not by the limit
	Limit        int64       `json:"limit"`
	Remaining    int64       `json:"remaining"`
	RetryAfterMs int64       `json:"retry_after_ms"` // -1: the cost exceeds the limit, no wait admits it
	ResetAfterMs int64       `json:"reset_after_ms"`
	DelayMs      int64       `json:"delay_ms"`
	Limits       []limitJSON `json:"limits,omitempty"` // --also without --peek: every limit as the call left it
}

// limitJSON is one limit of a decision on several as the call left it: allowed tells whether
// it admitted the cost, and retry_after_ms its own wait when it did not.
type limitJSON struct {
	Rule         int    `json:"rule"`
	Key          string `json:"key"`
	Allowed      bool   `json:"allowed"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	ResetAfterMs int64  `json:"reset_after_ms"`
}

func resultJSON(mode callMode, row callRow) callJSON {
	r := row.res
	j := callJSON{
		Key: row.key, Allowed: r.Allowed, Blocked: r.Blocked, Limit: r.Limit, Remaining: r.Remaining,
		RetryAfterMs: limitspec.RetryAfterMs(r.RetryAfter), ResetAfterMs: r.ResetAfter.Milliseconds(), DelayMs: r.Delay.Milliseconds(),
	}
	switch mode {
	case modeAcquire, modeRelease:
		j.ID = &row.id
	case modeMulti:
		j.Rule = &row.rule
		for _, e := range row.each {
			j.Limits = append(j.Limits, limitJSON{Rule: e.rule, Key: e.key, Allowed: e.res.Allowed, Limit: e.res.Limit,
				Remaining: e.res.Remaining, RetryAfterMs: limitspec.RetryAfterMs(e.res.RetryAfter), ResetAfterMs: e.res.ResetAfter.Milliseconds()})
		}
	}
	return j
}

// resultCells are a Result's cells of a table row: KEY, ALLOWED, LIMIT, REMAINING, RETRY AFTER,
// RESET AFTER, DELAY.
func resultCells(key string, r client.Result) []string {
	return []string{key, allowed(r), strconv.FormatInt(r.Limit, 10), strconv.FormatInt(r.Remaining, 10),
		human(r.RetryAfter), human(r.ResetAfter), human(r.Delay)}
}

// allowed is a Result's ALLOWED cell: "blocked" for a denial by the principal's block, whose
// LIMIT and REMAINING are the block's 0 and RETRY AFTER its time left, so that the row does
// not read as a limit of 0; a marker rather than a column, since a row is blocked only when
// denied and every other row (and every script reading the columns) stays as it was.
func allowed(r client.Result) string {
	if r.Blocked {
		return "blocked"
	}
	return yesNo(r.Allowed)
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
