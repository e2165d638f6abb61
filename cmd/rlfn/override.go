package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/internal/limitspec"
	"github.com/rlfn/rlfn/internal/override"
)

// overrideCommand is an operator's hand on the overrides a service's Limiter obeys
// (client.Options.Overrides): one at a time (set, get, list, remove), or as code, a file that
// holds every override and that diff and apply compare with the server, as rlfn diff and rlfn
// deploy treat the library.
func overrideCommand() *cli.Command {
	return &cli.Command{
		Name:  "override",
		Usage: "change one principal's limit, or every principal's of a key prefix, without a deploy",
		Description: "An override replaces the limit of a key (user:42), or of every key with a prefix (user:*;\n" +
			"* alone is every key), for one limit of the service: its algorithm and --name, as rlfn call\n" +
			"names them. A service's Limiter with Options.Overrides obeys it within milliseconds, with no\n" +
			"deploy. Precedence: an exact key, then the longest prefix, then the code's limit.\n" +
			"The overrides live in the keys <prefix>{%overrides...}, next to the limits.",
		HideHelpCommand: true,
		OnUsageError:    usageErrorHandler,
		Flags:           []cli.Flag{jsonFlag()}, // so that "override bogus --json" answers in JSON
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				var names []string
				for _, sc := range c.Command.Subcommands {
					names = append(names, sc.Name)
				}
				return fmt.Errorf("override: no command %q; there are %s (see rlfn override --help)", c.Args().First(), strings.Join(names, ", "))
			}
			return cli.ShowSubcommandHelp(c)
		},
		Subcommands: []*cli.Command{
			overrideSetCommand(), overrideGetCommand(), overrideListCommand(), overrideRemoveCommand(),
			overrideDiffCommand(), overrideApplyCommand(), overrideMigrateCommand(),
		},
	}
}

// overrideFlags are the flags every override command takes: where the store is.
func overrideFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "prefix", Usage: "key `PREFIX`, as the client's Options.Prefix: the overrides of the Limiters under it", Value: "rl:"},
		jsonFlag(),
	}
}

// addressFlags name one override: a limit's name, and httplimit's policy that scopes the key.
func addressFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "name", Usage: "the limit's `NAME` (the client's Name), for a named limit"},
		&cli.StringFlag{Name: "policy", Usage: "a key of httplimit's policy `NAME`: the client's key is NAME:KEY (NAME:* is every principal of the policy)"},
	}
}

// limitFlags are rlfn call's flags that make a limit: the same names and meaning.
func limitFlags() []cli.Flag {
	var out []cli.Flag
	for _, f := range callCommand().Flags {
		switch f.Names()[0] {
		case "limit", "window", "capacity", "rate", "period", "mode", "anchor", "zone", "penalty", "lease", "reserve":
			out = append(out, f)
		}
	}
	return out
}

func subcommand(name, usage, args, description string, flags []cli.Flag, action cli.ActionFunc) *cli.Command {
	return &cli.Command{
		Name: name, Usage: usage, ArgsUsage: args, Description: description,
		Flags: append(flags, overrideFlags()...), Action: action,
		OnUsageError: func(c *cli.Context, err error, _ bool) error {
			return fmt.Errorf("%w (see rlfn override %s --help)", badValue(c.Command.Flags, err), name)
		},
	}
}

// overrideUsage is a mistake in an override command's line.
func overrideUsage(c *cli.Context, msg string) error {
	return fmt.Errorf("override %s: %s (see rlfn override %s --help)", c.Command.Name, msg, c.Command.Name)
}

func overrideSetCommand() *cli.Command {
	flags := append(limitFlags(), addressFlags()...)
	flags = append(flags,
		&cli.StringFlag{Name: "until", Usage: "the override ends at `TIME` (RFC 3339: 2026-12-01T00:00:00Z)"},
		&cli.DurationFlag{Name: "for", Usage: "the override ends `DURATION` from now (e.g. 720h)"},
		&cli.StringFlag{Name: "note", Usage: "why, for the next operator: a `TEXT` such as a ticket"},
	)
	return subcommand("set", "set the limit of a key or a key prefix, replacing any override it has", "ALGORITHM KEY",
		"ALGORITHM and the limit's flags are rlfn call's: the override is a whole limit (--reserve and\n"+
			"--penalty included: left out, it has none). KEY is the principal, or a prefix and '*'.\n"+
			"The limit is checked as the library checks it before anything is written.",
		flags, overrideSetAction)
}

func overrideGetCommand() *cli.Command {
	return subcommand("get", "show the override a key gets, if any", "ALGORITHM KEY",
		"For a key, the override in force for it: its own, else the longest prefix that matches it (an\n"+
			"ended one is none). For a pattern (user:*), that pattern's own override.",
		addressFlags(), overrideGetAction)
}

func overrideListCommand() *cli.Command {
	return subcommand("list", "list the overrides, ended ones included, in order of policy and key", "",
		"At most --limit of them (1000 unless told; 0: every one), of the keys --match matches.",
		[]cli.Flag{
			&cli.IntFlag{Name: "limit", Usage: "list at most `N` overrides (0: every one)", Value: 1000},
			&cli.StringFlag{Name: "match", Usage: "list the overrides whose key matches `GLOB` ('*' is any text: cust:1*, *:admin)"},
		}, overrideListAction)
}

func overrideRemoveCommand() *cli.Command {
	return subcommand("remove", "remove an override: the code's limit (or a pattern's) applies again", "ALGORITHM KEY",
		"--field FIELD instead removes a field of the store that holds no override (list shows them).",
		append(addressFlags(), &cli.StringFlag{Name: "field", Usage: "remove the store's `FIELD` that holds no override, as list names it"}), overrideRemoveAction)
}

func overrideMigrateCommand() *cli.Command {
	return subcommand("migrate", "carry the overrides of an earlier release's store over to this one's", "",
		"An earlier release kept every override in one hash, <prefix>{%overrides}, which this release's\n"+
			"Limiters do not read. migrate copies them into this release's store, which must be empty;\n"+
			"the old hash stays for the Limiters of the earlier release until --remove-old removes it.",
		[]cli.Flag{&cli.BoolFlag{Name: "remove-old", Usage: "remove the earlier release's hash once copied (or when already copied)"}}, overrideMigrateAction)
}

func overrideDiffCommand() *cli.Command {
	return subcommand("diff", "what applying a file of overrides would change", "FILE",
		"FILE holds every override the server should have, as JSON: {\"overrides\": [{\"algorithm\":\n"+
			"\"token_bucket\", \"key\": \"user:42\", \"limit\": {\"capacity\": 500, \"rate\": 50, \"period\": \"1s\"},\n"+
			"\"until\": \"2026-12-01T00:00:00Z\", \"note\": \"launch\"}]}. An override the server holds and FILE\n"+
			"does not is removed. \"-\" reads standard input.",
		[]cli.Flag{
			&cli.BoolFlag{Name: "exit-code", Usage: "exit 2 when applying FILE would change something"},
			&cli.StringFlag{Name: "save-version", Usage: "write the version of the store the plan was made from to `FILE`, for apply --if-version @FILE"},
			fullFlag,
		}, overrideDiffAction)
}

func overrideApplyCommand() *cli.Command {
	return subcommand("apply", "make the server's overrides those of a file, all or nothing", "FILE",
		"Shows the plan (as override diff), asks, then writes every change, all or nothing, only if\n"+
			"nobody changed the overrides since they were read (else exit 3). --if-version pins the plan to\n"+
			"the version a reviewed diff was made from (diff --save-version, or its JSON's version).",
		[]cli.Flag{
			&cli.BoolFlag{Name: "yes", Usage: "apply without asking (required when there is no terminal)"},
			&cli.BoolFlag{Name: "dry-run", Usage: "show the plan, change nothing"},
			&cli.StringFlag{Name: "if-version", Usage: "apply only if the store is at `VERSION` (@FILE: the version diff --save-version wrote), else exit 3"},
			fullFlag,
		}, overrideApplyAction)
}

// planRows is how many changes a plan lists without --full: a file of a million overrides
// plans a million changes, which nobody reads on a terminal; the counts say what it does.
const planRows = 50

var fullFlag = &cli.BoolFlag{Name: "full", Usage: fmt.Sprintf("list every change of the plan, not only the first %d (--json always lists every one)", planRows)}

// storePrefix reads --prefix.
func storePrefix(c *cli.Context) (string, error) {
	p := c.String("prefix")
	if p == "" {
		return "", overrideUsage(c, `--prefix must not be empty (a service's Limiter uses "rl:" unless it set another)`)
	}
	return p, nil
}

// overrideID reads ALGORITHM KEY, --name and --policy: the override they address.
func overrideID(c *cli.Context) (override.ID, error) {
	args := c.Args().Slice()
	switch {
	case len(args) < 2:
		return override.ID{}, overrideUsage(c, "needs ALGORITHM KEY")
	case len(args) > 2:
		return override.ID{}, overrideUsage(c, fmt.Sprintf("takes ALGORITHM KEY only; extra %q", args[2]))
	}
	alg := strings.ReplaceAll(args[0], "-", "_")
	if !slices.Contains(override.Algorithms(), alg) {
		return override.ID{}, overrideUsage(c, fmt.Sprintf("unknown algorithm %q: %s", args[0], or(override.Algorithms()...)))
	}
	key := args[1]
	if c.IsSet("policy") {
		if err := checkPolicyName(c.String("policy")); err != nil {
			return override.ID{}, overrideUsage(c, "--policy "+err.Error())
		}
		key = policyKey(c.String("policy"), key)
	}
	if err := override.CheckKey(key); err != nil {
		return override.ID{}, overrideUsage(c, strings.TrimPrefix(err.Error(), override.ErrInvalid.Error()+": "))
	}
	return override.ID{Policy: override.Policy{Algorithm: alg, Name: c.String("name")}, Key: key}, nil
}

// checkLimit refuses an override's limit the library would refuse, in the client's words
// (through limitspec's table, the client's own Validate).
func checkLimit(o override.Override) error {
	_, err := clientLimit(o)
	return err
}

func overrideSetAction(c *cli.Context) error {
	id, err := overrideID(c)
	if err != nil {
		return err
	}
	prefix, err := storePrefix(c)
	if err != nil {
		return err
	}
	spec, err := flagSpec(c, id.Algorithm)
	if err != nil {
		return overrideUsage(c, err.Error())
	}
	if c.IsSet("name") && !spec.set["name"] {
		spec.values.Name = c.String("name")
	}
	o := override.Override{Policy: id.Policy, Key: id.Key, Note: c.String("note"), Limit: fieldsOf(spec)}
	switch {
	case c.IsSet("until") && c.IsSet("for"):
		return overrideUsage(c, "--until and --for both set an end: give one")
	case c.IsSet("until"):
		t, err := time.Parse(time.RFC3339Nano, c.String("until"))
		if err != nil {
			return overrideUsage(c, fmt.Sprintf("--until %q is not a time such as 2026-12-01T00:00:00Z (RFC 3339)", c.String("until")))
		}
		o.Until = t
	case c.IsSet("for"):
		if c.Duration("for") <= 0 {
			return overrideUsage(c, "--for must be positive, got "+c.Duration("for").String())
		}
		o.Until = time.Now().Add(c.Duration("for")).Truncate(time.Millisecond)
	}
	if err := override.Check(o, time.Now(), func(o override.Override) error {
		if err := checkLimit(o); err != nil {
			return spec.explain(err)
		}
		return nil
	}); err != nil {
		return overrideUsage(c, strings.TrimPrefix(err.Error(), override.ErrInvalid.Error()+": "))
	}
	return withStore(c, prefix, false, func(ctx context.Context, s *override.Store) error {
		old, _, err := s.Get(ctx, override.FieldOf(o.ID()))
		if err != nil {
			return err
		}
		var current []override.Override
		if was, err := override.Decode(old); old != "" && err == nil {
			current = append(current, was)
		}
		ch := override.Set(current, o)
		version, err := s.Apply(ctx, []override.Change{ch}, nil)
		if err != nil {
			return err
		}
		if c.Bool("json") {
			return writeJSON(c.App.Writer, changeJSON{Op: ch.Op, Override: ch.New, Was: ch.Old, Version: version})
		}
		return writeOverrides(c.App.Writer, []override.Override{o}, time.Now())
	})
}

// changeJSON is what set and remove print with --json.
type changeJSON struct {
	Op       override.Op        `json:"op,omitempty"` // "" for a remove that found nothing
	Override *override.Override `json:"override"`     // the override set, or removed; null if none
	Was      *override.Override `json:"was,omitempty"`
	Field    string             `json:"field,omitempty"` // a field removed that held no override
	Version  string             `json:"version,omitempty"`
}

func overrideGetAction(c *cli.Context) error {
	id, err := overrideID(c)
	if err != nil {
		return err
	}
	return onStore(c, true, func(ctx context.Context, s *override.Store, snap override.Snapshot) error {
		found := inForce(snap.Overrides, id, time.Now())
		if c.Bool("json") {
			return writeJSON(c.App.Writer, getJSON{Key: id.Key, Policy: id.Policy, Override: found})
		}
		if found == nil {
			_, err := fmt.Fprintf(c.App.Writer, "No override: %s %s gets the code's limit.\n", id.Policy, printable(id.Key))
			return err
		}
		return writeOverrides(c.App.Writer, []override.Override{*found}, time.Now())
	})
}

// getJSON is what get prints with --json.
type getJSON struct {
	Key      string             `json:"key"`
	Policy   override.Policy    `json:"policy"`
	Override *override.Override `json:"override"` // null when the code's limit applies
}

// inForce is the override id.Key gets: for a pattern, its own (ended or not, as list shows
// it); for a key, the one the client's precedence picks at now.
func inForce(all []override.Override, id override.ID, now time.Time) *override.Override {
	if override.IsPattern(id.Key) {
		for _, o := range all {
			if o.ID() == id {
				return &o
			}
		}
		return nil
	}
	var cs []override.Compiled[int]
	for i, o := range all {
		cs = append(cs, override.Compiled[int]{ID: o.ID(), Until: o.Until, V: i})
	}
	i := override.NewIndex(cs).Lookup(id.Algorithm, id.Name, id.Key, func() int64 { return now.UnixMilli() })
	if i == nil {
		return nil
	}
	return &all[*i]
}

func overrideListAction(c *cli.Context) error {
	if c.NArg() > 0 {
		return overrideUsage(c, fmt.Sprintf("takes no argument, got %q", c.Args().First()))
	}
	if c.Int("limit") < 0 {
		return overrideUsage(c, fmt.Sprintf("--limit must be 0 (every one) or more, got %d", c.Int("limit")))
	}
	return onStore(c, true, func(ctx context.Context, s *override.Store, snap override.Snapshot) error {
		now := time.Now()
		shown, more := snap.Overrides, 0
		if c.IsSet("match") {
			shown = slices.DeleteFunc(slices.Clone(shown), func(o override.Override) bool { return !globMatch(c.String("match"), o.Key) })
		}
		if n := c.Int("limit"); n > 0 && len(shown) > n {
			shown, more = shown[:n], len(shown)-n
		}
		if c.Bool("json") {
			out := listJSON{Version: snap.Version, Overrides: make([]listedJSON, 0, len(shown)), More: more}
			for _, o := range shown {
				out.Overrides = append(out.Overrides, listedJSON{Override: o, Ended: o.Expired(now)})
			}
			for _, b := range snap.Bad {
				out.Bad = append(out.Bad, badJSON{Field: b.Field, Error: b.Err.Error()})
			}
			return writeJSON(c.App.Writer, out)
		}
		switch {
		case len(snap.Overrides) == 0:
			fmt.Fprintln(c.App.Writer, "No overrides: every key gets the code's limits.")
		case len(shown) == 0:
			fmt.Fprintf(c.App.Writer, "No override of a key matching %q (of %d).\n", c.String("match"), len(snap.Overrides))
		default:
			if err := writeOverrides(c.App.Writer, shown, now); err != nil {
				return err
			}
		}
		if more > 0 {
			fmt.Fprintf(c.App.Writer, "... and %d more (--limit 0 lists every one, --match narrows).\n", more)
		}
		for _, b := range snap.Bad {
			fmt.Fprintf(c.App.ErrWriter, "Warning: field %q of the overrides holds no override (%v): clients ignore it; rlfn override remove --field removes it\n", b.Field, b.Err)
		}
		return nil
	})
}

// globMatch reports whether key matches glob, where '*' is any text (none included) and every
// other byte itself: a filter for list, not a pattern of the store.
func globMatch(glob, key string) bool {
	parts := strings.Split(glob, "*")
	if len(parts) == 1 {
		return glob == key
	}
	if !strings.HasPrefix(key, parts[0]) {
		return false
	}
	key = key[len(parts[0]):]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(key, p)
		if i < 0 {
			return false
		}
		key = key[i+len(p):]
	}
	return strings.HasSuffix(key, parts[len(parts)-1])
}

type listJSON struct {
	Version   string       `json:"version"`
	Overrides []listedJSON `json:"overrides"`
	More      int          `json:"more,omitempty"` // overrides left out by --limit
	Bad       []badJSON    `json:"bad,omitempty"`
}

type listedJSON struct {
	override.Override
	Ended bool `json:"ended"`
}

type badJSON struct {
	Field string `json:"field"`
	Error string `json:"error"`
}

func overrideRemoveAction(c *cli.Context) error {
	var field string
	var id override.ID
	if c.IsSet("field") {
		if c.NArg() > 0 || c.IsSet("name") || c.IsSet("policy") {
			return overrideUsage(c, "--field FIELD names what to remove alone: no ALGORITHM KEY, --name or --policy")
		}
		field = c.String("field")
	} else {
		var err error
		if id, err = overrideID(c); err != nil {
			return err
		}
		field = override.FieldOf(id)
	}
	prefix, err := storePrefix(c)
	if err != nil {
		return err
	}
	return withStore(c, prefix, false, func(ctx context.Context, s *override.Store) error {
		value, _, err := s.Get(ctx, field)
		if err != nil {
			return err
		}
		what := printable(field)
		if !c.IsSet("field") {
			what = id.Policy.String() + " " + printable(id.Key)
		}
		if value == "" {
			if c.Bool("json") {
				return writeJSON(c.App.Writer, changeJSON{})
			}
			_, err := fmt.Fprintf(c.App.Writer, "No override %s: nothing removed.\n", what)
			return err
		}
		// an override that does not decode (written by hand) is removed by its field
		ch := override.Change{Op: override.Remove, Field: field}
		old, derr := override.DecodeField(field, value)
		if derr == nil {
			ch = override.Change{Op: override.Remove, Old: &old}
		}
		version, err := s.Apply(ctx, []override.Change{ch}, nil)
		if err != nil {
			return err
		}
		if c.Bool("json") {
			return writeJSON(c.App.Writer, changeJSON{Op: override.Remove, Override: ch.Old, Field: ch.Field, Version: version})
		}
		if derr != nil {
			_, err = fmt.Fprintf(c.App.Writer, "Removed %s, which held no override (%v).\n", what, derr)
			return err
		}
		_, err = fmt.Fprintf(c.App.Writer, "Removed %s.\n", what)
		return err
	})
}

func overrideMigrateAction(c *cli.Context) error {
	if c.NArg() > 0 {
		return overrideUsage(c, fmt.Sprintf("takes no argument, got %q", c.Args().First()))
	}
	prefix, err := storePrefix(c)
	if err != nil {
		return err
	}
	return withStore(c, prefix, false, func(ctx context.Context, s *override.Store) error {
		setProgress(c, s)
		h, err := s.ReadHead(ctx)
		if err != nil {
			return err
		}
		old, err := s.ReadOld(ctx)
		if err != nil {
			return err
		}
		switch {
		case h.Version != "" && len(old) > 0 && !c.Bool("remove-old"):
			return fmt.Errorf("override migrate: this release's store already holds version %s: nothing copied (--remove-old removes the earlier release's hash of %d fields)", h.Version, len(old))
		case h.Version == "" && len(old) > 0:
			v, err := s.WriteFields(ctx, old, "")
			if errors.Is(err, override.ErrChanged) {
				return &refusedError{err}
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "Copied %s to this release's store (version %s).\n", count(len(old), "field", "fields"), v)
		case len(old) == 0:
			fmt.Fprintln(c.App.Writer, "No overrides of an earlier release: nothing to copy.")
		}
		if c.Bool("remove-old") && len(old) > 0 {
			if err := s.DropOld(ctx); err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "Removed the earlier release's hash %s.\n", override.Key(prefix))
		}
		return nil
	})
}

// setProgress shows a long read or write of the store on a terminal: one line, rewritten.
func setProgress(c *cli.Context, s *override.Store) {
	if c.Bool("json") || !isTerminal(c.App.ErrWriter) {
		return
	}
	last := time.Now()
	s.Progress = func(phase string, done, total int) {
		if time.Since(last) < 200*time.Millisecond && done != total {
			return
		}
		last = time.Now()
		if total > 0 {
			fmt.Fprintf(c.App.ErrWriter, "\r\x1b[K%s: %d of %d overrides", phase, done, total)
		} else {
			fmt.Fprintf(c.App.ErrWriter, "\r\x1b[K%s: %d overrides", phase, done)
		}
		if done == total {
			fmt.Fprint(c.App.ErrWriter, "\r\x1b[K")
		}
	}
}

// fileProgress shows on a terminal how far the read and the check of a file of overrides
// are, as setProgress shows the store's: nil when there is nothing to show it on.
func fileProgress(c *cli.Context, name string) func(phase string, done, total int) {
	if c.Bool("json") || !isTerminal(c.App.ErrWriter) {
		return nil
	}
	last := time.Now()
	return func(phase string, done, total int) {
		if time.Since(last) < 200*time.Millisecond && done != total {
			return
		}
		last = time.Now()
		switch {
		case phase == "read":
			fmt.Fprintf(c.App.ErrWriter, "\r\x1b[Kread %s: %d MB", name, done)
		case done == total:
			fmt.Fprint(c.App.ErrWriter, "\r\x1b[K")
		default:
			fmt.Fprintf(c.App.ErrWriter, "\r\x1b[Kcheck %s: %d of %d overrides", name, done, total)
		}
	}
}

// countingReader tells read how many bytes have been read through it.
type countingReader struct {
	r    io.Reader
	n    int64
	read func(n int64)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	c.read(c.n)
	return n, err
}

// readFile reads and checks a file of overrides ("-": standard input) before any connection.
func readFile(c *cli.Context) ([]override.Override, error) {
	if c.NArg() != 1 {
		return nil, overrideUsage(c, "needs FILE, one file of overrides")
	}
	name := c.Args().First()
	var r io.Reader = c.App.Reader
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	progress := fileProgress(c, name)
	if progress != nil {
		r = &countingReader{r: r, read: func(n int64) { progress("read", int(n>>20), 0) }}
	}
	var check func(done, total int)
	if progress != nil {
		check = func(done, total int) { progress("check", done, total) }
	}
	all, err := override.ParseProgress(r, time.Now(), checkLimit, check)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return all, nil
}

// planJSON is what diff and apply print with --json.
type planJSON struct {
	Version string            `json:"version"` // the server's, the plan was made from
	Changes []override.Change `json:"changes"`
	DryRun  bool              `json:"dry_run,omitempty"`
	Applied bool              `json:"applied"`
	Now     string            `json:"applied_version,omitempty"` // the version after apply
}

// plan is the changes that make the store hold want: the removals of its fields that hold no
// override first, so that a plan summarised to its first rows always shows them.
func plan(snap override.Snapshot, want []override.Override) []override.Change {
	return append(override.RemoveBad(snap.Bad), override.Diff(snap.Overrides, want)...)
}

func overrideDiffAction(c *cli.Context) error {
	want, err := readFile(c)
	if err != nil {
		return err
	}
	return onStore(c, true, func(ctx context.Context, s *override.Store, snap override.Snapshot) error {
		changes := plan(snap, want)
		if f := c.String("save-version"); f != "" {
			if err := os.WriteFile(f, []byte(snap.Version+"\n"), 0o644); err != nil {
				return err
			}
		}
		if err := writePlan(c, snap.Version, changes); err != nil {
			return err
		}
		if c.Bool("exit-code") && len(changes) > 0 {
			return errPending
		}
		return nil
	})
}

// ifVersion reads apply's --if-version: a version, or @FILE that holds one.
func ifVersion(c *cli.Context) (string, bool, error) {
	if !c.IsSet("if-version") {
		return "", false, nil
	}
	v := c.String("if-version")
	if name, ok := strings.CutPrefix(v, "@"); ok {
		b, err := os.ReadFile(name)
		if err != nil {
			return "", false, err
		}
		v = strings.TrimSpace(string(b))
	}
	return v, true, nil
}

func overrideApplyAction(c *cli.Context) error {
	pinned, pin, err := ifVersion(c)
	if err != nil {
		return err
	}
	want, err := readFile(c)
	if err != nil {
		return err
	}
	return onStore(c, false, func(ctx context.Context, s *override.Store, snap override.Snapshot) error {
		if pin && snap.Version != pinned {
			return &refusedError{fmt.Errorf("the overrides are at version %q, not %q (--if-version): nothing written; diff again", snap.Version, pinned)}
		}
		changes := plan(snap, want)
		asJSON := c.Bool("json")
		if !asJSON {
			if err := writePlan(c, snap.Version, changes); err != nil {
				return err
			}
		}
		out := planJSON{Version: snap.Version, Changes: changes, DryRun: c.Bool("dry-run")}
		if out.Changes == nil {
			out.Changes = []override.Change{}
		}
		if len(changes) == 0 || c.Bool("dry-run") {
			if asJSON {
				return writeJSON(c.App.Writer, out)
			}
			return nil
		}
		if !c.Bool("yes") {
			if err := confirmOverrides(c, len(changes)); err != nil {
				return err
			}
		}
		var v string
		if len(changes) > override.MaxDelta {
			// a new base of the file's overrides, flipped to only if nobody changed the store
			v, err = s.Replace(ctx, want, snap.Version)
		} else {
			v, err = s.Apply(ctx, changes, &snap.Version)
		}
		if errors.Is(err, override.ErrChanged) {
			return &refusedError{err}
		}
		if err != nil {
			return err
		}
		if asJSON {
			out.Applied, out.Now = true, v
			return writeJSON(c.App.Writer, out)
		}
		_, err = fmt.Fprintf(c.App.Writer, "Applied %s.\n", count(len(changes), "change", "changes"))
		return err
	})
}

// refusedError is apply's refusal when the overrides changed between its read and its write:
// nothing was written, exit 3 as for a deploy a safety check refuses.
type refusedError struct{ err error }

func (e *refusedError) Error() string { return "override apply: " + e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }

// confirmOverrides asks on a terminal; without one there is nobody to ask, so it refuses.
func confirmOverrides(c *cli.Context, n int) error {
	if !isTerminal(c.App.Reader) {
		return errors.New("override apply: no terminal to confirm on; review with rlfn override diff, then apply --yes")
	}
	fmt.Fprintf(c.App.ErrWriter, "Apply %s? [y/N] ", count(n, "change", "changes"))
	answer, _ := bufio.NewReader(c.App.Reader).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return nil
	}
	return errors.New("override apply: not confirmed; nothing changed")
}

// onStore reads the overrides under --prefix and runs f with them, and the store to change
// them in (its primary, unless readOnly).
func onStore(c *cli.Context, readOnly bool, f func(context.Context, *override.Store, override.Snapshot) error) error {
	prefix, err := storePrefix(c)
	if err != nil {
		return err
	}
	return withStore(c, prefix, readOnly, func(ctx context.Context, s *override.Store) error {
		setProgress(c, s)
		snap, err := s.Read(ctx)
		if err != nil {
			return err
		}
		return f(ctx, s, snap)
	})
}

// withStore connects to the server the global flags name (its primary, when it will write)
// and runs f on the overrides under prefix, within --timeout.
func withStore(c *cli.Context, prefix string, readOnly bool, f func(context.Context, *override.Store) error) error {
	ctx, cancel := commandContext(c)
	defer cancel()
	opt, err := clientOption(c)
	if err != nil {
		return err
	}
	if !readOnly {
		if opt, _, err = towardPrimary(ctx, opt); err != nil {
			return err
		}
	}
	opt.DisableCache = true // one read: nothing to cache
	vk, err := valkey.NewClient(opt)
	if err != nil {
		return connectHint(opt, fmt.Errorf("%s: %w", opt.InitAddress[0], err))
	}
	defer vk.Close()
	if err := f(ctx, override.NewStore(vk, prefix)); err != nil {
		var re *refusedError
		if errors.As(err, &re) || errors.Is(err, errPending) {
			return err
		}
		return fmt.Errorf("%s: %w", override.Key(prefix), err)
	}
	return nil
}

// fieldsOf is a checked limit of the command line as an override stores it: durations in Go's
// syntax, a calendar's period, anchor and zone as written.
func fieldsOf(s *limitSpec) override.Fields {
	v := s.values
	f := override.Fields{Limit: v.Limit, Capacity: v.Capacity, Rate: v.Rate, Reserve: v.Reserve,
		Window: override.Duration(v.Window), Lease: override.Duration(v.Lease), Penalty: override.Duration(v.Penalty)}
	switch s.algorithm {
	case "token_bucket", "leaky_bucket":
		f.Period = v.Period.String()
		if s.algorithm == "leaky_bucket" && v.Mode != limitspec.Modes[0] {
			f.Mode = v.Mode.String()
		}
	case "calendar":
		f.Period, f.Anchor, f.Zone = v.Calendar.String(), s.raw["anchor"], s.raw["zone"]
	}
	return f
}

// limitText is an override's limit as rlfn prints it: capacity=500 rate=50 period=1s.
func limitText(o override.Override) string {
	f := o.Limit
	var parts []string
	add := func(name, v string) {
		if v != "" && v != "0" && v != "0s" {
			parts = append(parts, name+"="+v)
		}
	}
	add("limit", strconv.FormatInt(f.Limit, 10))
	add("capacity", strconv.FormatInt(f.Capacity, 10))
	add("rate", strconv.FormatInt(f.Rate, 10))
	add("window", time.Duration(f.Window).String())
	add("period", f.Period)
	add("mode", f.Mode)
	add("anchor", f.Anchor)
	add("zone", f.Zone)
	add("lease", time.Duration(f.Lease).String())
	add("reserve", strconv.FormatInt(f.Reserve, 10))
	add("penalty", time.Duration(f.Penalty).String())
	return strings.Join(parts, " ")
}

// untilText is an override's end as rlfn prints it: "-" for none, "ended" once past.
func untilText(o override.Override, now time.Time) string {
	switch {
	case o.Until.IsZero():
		return "-"
	case o.Expired(now):
		return o.Until.UTC().Format(time.RFC3339) + " (ended)"
	}
	return o.Until.UTC().Format(time.RFC3339)
}

// writeOverrides prints overrides as a table: POLICY KEY LIMIT UNTIL NOTE.
func writeOverrides(w io.Writer, all []override.Override, now time.Time) error {
	t := newTable(w, "POLICY", "KEY", "LIMIT", "UNTIL", "NOTE")
	for _, o := range all {
		t.row(printable(o.Policy.String()), printable(o.Key), limitText(o), untilText(o, now), printable(orDash(o.Note)))
	}
	return t.flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writePlan prints a plan of changes (or, with --json, the plan as data).
func writePlan(c *cli.Context, version string, changes []override.Change) error {
	w := c.App.Writer
	if c.Bool("json") {
		out := planJSON{Version: version, Changes: changes}
		if out.Changes == nil {
			out.Changes = []override.Change{}
		}
		return writeJSON(w, out)
	}
	if len(changes) == 0 {
		_, err := fmt.Fprintln(w, "No changes: the server holds the file's overrides.")
		return err
	}
	n := map[override.Op]int{}
	for _, ch := range changes {
		n[ch.Op]++
	}
	shown := changes
	if !c.Bool("full") && len(shown) > planRows {
		shown = shown[:planRows]
	}
	t := newTable(w, "ACTION", "POLICY", "KEY", "LIMIT", "UNTIL", "NOTE")
	now := time.Now()
	for _, ch := range shown {
		o := ch.New
		if o == nil {
			o = ch.Old
		}
		if o == nil { // a field that holds no override
			t.row(string(ch.Op), "-", printable(ch.Field), "(holds no override)", "-", "-")
			continue
		}
		t.row(string(ch.Op), printable(o.Policy.String()), printable(o.Key), limitText(*o), untilText(*o, now), printable(orDash(o.Note)))
		if ch.Op == override.Update {
			t.row("  was", "", "", limitText(*ch.Old), untilText(*ch.Old, now), printable(orDash(ch.Old.Note)))
		}
	}
	if err := t.flush(); err != nil {
		return err
	}
	if more := len(changes) - len(shown); more > 0 {
		if _, err := fmt.Fprintf(w, "... and %s (--full lists every change, --json as data).\n", count(more, "more change", "more changes")); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "Plan: %d to add, %d to change, %d to remove.\n", n[override.Add], n[override.Update], n[override.Remove])
	return err
}
