package main

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/limitspec"
)

// limitSpec is one limit as a command line gives it: call's ALGORITHM and flags, or one --also
// spec. The algorithms, their fields and how the fields make a limit are limitspec's table;
// this is the command line's wording of it.
type limitSpec struct {
	algorithm string
	alg       limitspec.Algorithm // checked: the algorithm's entry
	key       string              // an --also spec's key=; "" is the call's KEY
	set       map[string]bool     // the fields given
	values    limitspec.Values    // the numbers; the mode is parsed from mode by check
	mode      string
	// raw holds, as written, the fields whose reading depends on the algorithm (period: a
	// bucket's duration or a calendar's day, week, month or year) or on each other (a
	// calendar's anchor, read in its zone); check reads them.
	raw    map[string]string
	policy string // an --also spec's policy=, set["policy"] when given
	cost   int64  // an --also spec's cost=, set["cost"] when given; else the call's --cost
	// field names a field in messages: "--limit" for a flag, "limit=" in an --also spec.
	field func(string) string
}

// or lists words as a sentence does: "a, b or c".
func or(words ...string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// modeNames are a leaky bucket's modes as the command line names them: police or shape.
func modeNames() []string {
	var names []string
	for _, m := range limitspec.Modes {
		names = append(names, m.String())
	}
	return names
}

// check refuses an unknown algorithm, a field the algorithm does not take (so that a typo is not
// silently ignored) and a missing one.
func (s *limitSpec) check() error {
	s.algorithm = strings.ReplaceAll(s.algorithm, "-", "_")
	alg, ok := limitspec.Lookup(s.algorithm)
	if !ok {
		return fmt.Errorf("unknown algorithm %q: %s", s.algorithm, or(limitspec.Names()...))
	}
	s.alg = alg
	for _, f := range limitspec.Fields() {
		if s.set[f.Name] && !alg.Takes(f.Name) {
			return fmt.Errorf("%s does not apply to %s", s.field(f.Name), s.algorithm)
		}
	}
	for _, f := range alg.Fields {
		if !f.Optional && !s.set[f.Name] {
			return fmt.Errorf("%s needs %s", s.algorithm, s.field(f.Name))
		}
	}
	if s.values.Mode, ok = limitspec.ParseMode(s.mode); !ok {
		return fmt.Errorf("%s is %s, not %q", s.field("mode"), or(modeNames()...), s.mode)
	}
	return s.readRaw()
}

// rawFields are the fields a limitSpec keeps as written until its algorithm is known: those
// whose name some algorithm gives a calendar's period, anchor or zone.
var rawFields = func() map[string]bool {
	m := map[string]bool{}
	for _, a := range limitspec.Algorithms {
		for _, f := range a.Fields {
			switch f.Kind {
			case limitspec.Calendar, limitspec.Time, limitspec.Zone:
				m[f.Name] = true
			}
		}
	}
	return m
}()

// readRaw reads the raw fields the checked algorithm takes, as its own fields' kinds say.
func (s *limitSpec) readRaw() error {
	for _, f := range s.alg.Fields {
		text, given := s.raw[f.Name]
		if !given || !s.set[f.Name] {
			continue
		}
		switch f.Kind {
		case limitspec.Duration:
			d, err := time.ParseDuration(text)
			if err != nil {
				return fmt.Errorf("%s %q: %s; write a duration with its unit, e.g. 500ms, 1s, 1m, 1h",
					s.field(f.Name), text, strings.TrimPrefix(err.Error(), "time: "))
			}
			*s.values.Duration(f.Name) = d
		case limitspec.Calendar:
			p, ok := limitspec.ParsePeriod(text)
			if !ok {
				return fmt.Errorf("%s is %s for a calendar, not %q", s.field(f.Name), or(periodNames()...), text)
			}
			s.values.Calendar = p
		}
	}
	if !s.alg.Takes("anchor") {
		return nil
	}
	if s.set["zone"] {
		if _, err := limitspec.LoadZone(s.raw["zone"]); err != nil {
			return fmt.Errorf("%s %v", s.field("zone"), err)
		}
	}
	if s.set["anchor"] && s.raw["anchor"] == "" {
		return fmt.Errorf("%s is empty: give a date and clock time such as 2026-01-31T00:00", s.field("anchor"))
	}
	var err error
	if s.values.Anchor, err = limitspec.Anchor(s.values.Calendar, s.raw["anchor"], s.raw["zone"]); err != nil {
		return fmt.Errorf("%s %v", s.field("anchor"), err)
	}
	return nil
}

// periodNames are a calendar's periods as the command line names them.
func periodNames() []string {
	var names []string
	for _, p := range limitspec.Periods {
		names = append(names, p.String())
	}
	return names
}

// clientField is a limit's field as the client names it in a *client.LimitError: Window, or
// FixedWindow.Window. Its names are the table's fields that Validate judges, capitalised as the
// Go fields are.
var clientField = func() *regexp.Regexp {
	var names []string
	for _, f := range limitspec.Fields() {
		if f.Kind != limitspec.Text {
			names = append(names, strings.ToUpper(f.Name[:1])+f.Name[1:])
		}
	}
	return regexp.MustCompile(`\b(?:[A-Z][A-Za-z]*\.)?(` + strings.Join(names, "|") + `)\b`)
}()

// explain words a limit the client refuses in the command line's terms, "--reserve must be
// from 0 to 5, got 6" ("reserve=" in an --also spec), rather than in the Go fields'.
func (s *limitSpec) explain(err error) error {
	var le *client.LimitError
	if !errors.As(err, &le) {
		return err
	}
	flag := func(name string) string {
		return s.field(strings.ToLower(clientField.FindStringSubmatch(name)[1]))
	}
	field := le.Field
	if clientField.MatchString(field) {
		field = flag(field)
	}
	return errors.New(field + " " + clientField.ReplaceAllStringFunc(le.Reason, flag))
}

// build is the checked spec's limit; not for concurrency (see concurrency).
func (s *limitSpec) build() client.Limit {
	if l := s.alg.Limit(s.values); l != nil {
		return l
	}
	panic("build: " + s.algorithm) // newCallPlan and parseSpec take concurrency apart
}

func (s *limitSpec) concurrency() client.Concurrency { return limitspec.Concurrency(s.values) }

// most is the limit or capacity of the spec: no Result.Limit or Remaining is wider.
func (s *limitSpec) most() int64 { return max(s.values.Limit, s.values.Capacity) }

// longestWait is the longest wait the spec's limit may reply, when it can exceed an hour or
// so: a calendar's longest window (a day of 25 hours, a month of 31 days), or its penalty.
func (s *limitSpec) longestWait() time.Duration {
	var window time.Duration
	day := 24 * time.Hour
	switch s.values.Calendar {
	case client.Day:
		window = day + time.Hour
	case client.Week:
		window = 7*day + time.Hour
	case client.Month:
		window = 31*day + time.Hour
	case client.Year:
		window = 366*day + time.Hour
	}
	if s.alg.Name != "calendar" {
		window = 0
	}
	return max(window, s.values.Penalty)
}

// flagSpec is the limit of call's ALGORITHM and flags, checked.
func flagSpec(c *cli.Context, algorithm string) (*limitSpec, error) {
	s := &limitSpec{
		algorithm: algorithm, set: map[string]bool{}, raw: map[string]string{},
		field: func(f string) string { return "--" + f },
	}
	for _, f := range limitspec.Fields() {
		s.set[f.Name] = c.IsSet(f.Name)
		if rawFields[f.Name] {
			s.raw[f.Name] = c.Generic(f.Name).(*textValue).s
			continue
		}
		switch f.Kind {
		case limitspec.Count:
			*s.values.Count(f.Name) = decimalValue(c, f.Name)
		case limitspec.Duration:
			*s.values.Duration(f.Name) = c.Duration(f.Name)
		case limitspec.Mode:
			s.mode = c.String(f.Name)
		case limitspec.Text:
			s.values.Name = c.String(f.Name)
		}
	}
	return s, s.check()
}

// parseSpec reads an --also spec, ALGORITHM,field=value,...: the fields are call's flags
// (limit, window, capacity, rate, period, mode, anchor, zone, penalty, reserve, name), key, the principal (default:
// the call's KEY), policy, the httplimit name that scopes it (default: the call's
// --policy), and cost, the units this limit takes (default: the call's --cost). A value
// cannot hold a comma.
func parseSpec(text string) (*limitSpec, error) {
	parts := strings.Split(text, ",")
	s := &limitSpec{algorithm: parts[0], set: map[string]bool{}, raw: map[string]string{}, mode: limitspec.Modes[0].String(), field: func(f string) string { return f + "=" }}
	for _, p := range parts[1:] {
		f, v, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("%q is not field=value", p)
		}
		if s.set[f] || (f == "key" && s.key != "") {
			return nil, fmt.Errorf("%s given twice", f)
		}
		var err error
		switch n, d := s.values.Count(f), s.values.Duration(f); {
		case rawFields[f]:
			s.raw[f] = v
		case n != nil:
			if *n, err = parseDecimal(v); err != nil {
				return nil, fmt.Errorf("%s %v", s.field(f), err) // e.g. limit= "0x10" is not a decimal integer
			}
		case d != nil:
			*d, err = time.ParseDuration(v)
		case f == "mode":
			s.mode = v
		case f == "name":
			s.values.Name = v
		case f == "key":
			if v == "" {
				return nil, fmt.Errorf("key= is empty")
			}
			s.key = v
			continue
		case f == "cost":
			if s.set[f] {
				return nil, fmt.Errorf("cost given twice")
			}
			// A Rule's Cost of 0 is the call's: cost=0 would silently read as --cost.
			if s.cost, err = parseDecimal(v); err != nil || s.cost < 1 {
				return nil, fmt.Errorf("cost= must be a decimal integer from 1 up (the call's --cost when left out), got %q", v)
			}
			s.set[f] = true
			continue
		case f == "policy":
			if s.set[f] {
				return nil, fmt.Errorf("policy given twice")
			}
			if err := checkPolicyName(v); err != nil {
				return nil, fmt.Errorf("policy= %v", err)
			}
			s.policy, s.set[f] = v, true
			continue
		default:
			return nil, fmt.Errorf("unknown field %q: %s", f, or(append(alsoFields(), "key", "policy", "cost")...))
		}
		if err != nil {
			return nil, fmt.Errorf("invalid value %q for %s", v, s.field(f))
		}
		s.set[f] = true
	}
	if err := s.check(); err != nil {
		return nil, err
	}
	if s.alg.Leases() {
		return nil, fmt.Errorf("%s leases are not part of a decision on several limits", s.algorithm)
	}
	return s, nil
}

// alsoFields are the fields of the algorithms an --also spec can name (not concurrency's),
// and the shared ones.
func alsoFields() []string {
	var names []string
	for _, f := range limitspec.Fields() {
		for _, a := range limitspec.Algorithms {
			if !a.Leases() && a.Takes(f.Name) {
				names = append(names, f.Name)
				break
			}
		}
	}
	return names
}

// textValue is a flag's text kept as written: --period, --anchor and --zone, which check reads
// once it knows the algorithm (--period is a duration for a bucket, a day, week, month or year
// for a calendar).
type textValue struct{ s string }

func (t *textValue) Set(v string) error { t.s = v; return nil }
func (t *textValue) String() string     { return t.s }

// textFlag is a flag read by check, as written.
func textFlag(name, usage string) *cli.GenericFlag {
	return &cli.GenericFlag{Name: name, Usage: usage, Value: &textValue{}}
}

// alsoFlag collects the repeated --also specs as given; they are parsed with the call's KEY.
type alsoFlag []string

func (a *alsoFlag) Set(v string) error { *a = append(*a, v); return nil }
func (a *alsoFlag) String() string     { return strings.Join(*a, " ") }

// policyKey is the key httplimit passes the client for a policy (or a Rule of Policy.Also)
// named name and a principal: "<name>:<principal>". Its names hold no ':', so the split is
// unambiguous.
func policyKey(name, principal string) string { return name + ":" + principal }

// checkPolicyName applies httplimit's rule for a Policy's or a Rule's Name, so that a name the
// middleware refuses (and so never writes state under) is not looked up either.
func checkPolicyName(name string) error {
	if name == "" {
		return errors.New("is empty: give the Name of the httplimit Policy (or Rule)")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return fmt.Errorf("%q: httplimit names hold letters, digits, '_', '.' and '-' only", name)
		}
	}
	return nil
}
