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
	policy    string // an --also spec's policy=, set["policy"] when given
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
		if f.Kind != limitspec.Mode && !s.set[f.Name] {
			return fmt.Errorf("%s needs %s", s.algorithm, s.field(f.Name))
		}
	}
	if s.values.Mode, ok = limitspec.ParseMode(s.mode); !ok {
		return fmt.Errorf("%s is %s, not %q", s.field("mode"), or(modeNames()...), s.mode)
	}
	return nil
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

// flagSpec is the limit of call's ALGORITHM and flags, checked.
func flagSpec(c *cli.Context, algorithm string) (*limitSpec, error) {
	s := &limitSpec{
		algorithm: algorithm, set: map[string]bool{},
		field: func(f string) string { return "--" + f },
	}
	for _, f := range limitspec.Fields() {
		s.set[f.Name] = c.IsSet(f.Name)
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
// (limit, window, capacity, rate, period, mode, reserve, name), key, the principal (default:
// the call's KEY), and policy, the httplimit name that scopes it (default: the call's
// --policy). A value cannot hold a comma.
func parseSpec(text string) (*limitSpec, error) {
	parts := strings.Split(text, ",")
	s := &limitSpec{algorithm: parts[0], set: map[string]bool{}, mode: limitspec.Modes[0].String(), field: func(f string) string { return f + "=" }}
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
			return nil, fmt.Errorf("unknown field %q: %s", f, or(append(alsoFields(), "key", "policy")...))
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
