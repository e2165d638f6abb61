package main

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rlfn/rlfn/client"
)

// limitSpec is one limit as a command line gives it: call's ALGORITHM and flags, or one --also
// spec. Every algorithm's knowledge of the CLI is in algorithmFields and build.
type limitSpec struct {
	algorithm string
	key       string          // an --also spec's key=; "" is the call's KEY
	set       map[string]bool // the fields given
	limit     int64
	window    time.Duration
	capacity  int64
	rate      int64
	period    time.Duration
	mode      string
	lease     time.Duration
	reserve   int64
	name      string
	policy    string // an --also spec's policy=, set["policy"] when given
	// field names a field in messages: "--limit" for a flag, "limit=" in an --also spec.
	field func(string) string
}

// algorithmFields is what each algorithm takes, in the order of its messages; reserve and name
// apply to every algorithm, and mode has a default.
var algorithmFields = map[string][]string{
	"fixed_window":   {"limit", "window"},
	"sliding_log":    {"limit", "window"},
	"sliding_window": {"limit", "window"},
	"token_bucket":   {"capacity", "rate", "period"},
	"leaky_bucket":   {"capacity", "rate", "period", "mode"},
	"concurrency":    {"limit", "lease"},
}

const algorithmList = "fixed_window, sliding_log, sliding_window, token_bucket, leaky_bucket or concurrency"

// limitFields is every field, in the order they are checked.
var limitFields = []string{"limit", "window", "capacity", "rate", "period", "mode", "lease", "reserve", "name"}

// check refuses an unknown algorithm, a field the algorithm does not take (so that a typo is not
// silently ignored) and a missing one.
func (s *limitSpec) check() error {
	s.algorithm = strings.ReplaceAll(s.algorithm, "-", "_")
	want, ok := algorithmFields[s.algorithm]
	if !ok {
		return fmt.Errorf("unknown algorithm %q: %s", s.algorithm, algorithmList)
	}
	for _, f := range limitFields {
		if s.set[f] && !slices.Contains(want, f) && f != "reserve" && f != "name" {
			return fmt.Errorf("%s does not apply to %s", s.field(f), s.algorithm)
		}
	}
	for _, f := range want {
		if f != "mode" && !s.set[f] {
			return fmt.Errorf("%s needs %s", s.algorithm, s.field(f))
		}
	}
	if s.mode != "police" && s.mode != "shape" {
		return fmt.Errorf("%s is police or shape, not %q", s.field("mode"), s.mode)
	}
	return nil
}

// clientField is a limit's field as the client names it in a *client.LimitError: Window, or
// FixedWindow.Window.
var clientField = regexp.MustCompile(`\b(?:[A-Z][A-Za-z]*\.)?(Limit|Window|Capacity|Rate|Period|Mode|Lease|Reserve)\b`)

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
	switch s.algorithm {
	case "fixed_window":
		return client.FixedWindow{Limit: s.limit, Window: s.window, Reserve: s.reserve, Name: s.name}
	case "sliding_log":
		return client.SlidingLog{Limit: s.limit, Window: s.window, Reserve: s.reserve, Name: s.name}
	case "sliding_window":
		return client.SlidingWindow{Limit: s.limit, Window: s.window, Reserve: s.reserve, Name: s.name}
	case "token_bucket":
		return client.TokenBucket{Capacity: s.capacity, Rate: s.rate, Period: s.period, Reserve: s.reserve, Name: s.name}
	case "leaky_bucket":
		mode := client.Police
		if s.mode == "shape" {
			mode = client.Shape
		}
		return client.LeakyBucket{Capacity: s.capacity, Rate: s.rate, Period: s.period, Mode: mode, Reserve: s.reserve, Name: s.name}
	}
	panic("build: " + s.algorithm) // check refused it
}

func (s *limitSpec) concurrency() client.Concurrency {
	return client.Concurrency{Limit: s.limit, Lease: s.lease, Reserve: s.reserve, Name: s.name}
}

// flagSpec is the limit of call's ALGORITHM and flags, checked.
func flagSpec(c *cli.Context, algorithm string) (*limitSpec, error) {
	s := &limitSpec{
		algorithm: algorithm, set: map[string]bool{},
		limit: decimalValue(c, "limit"), window: c.Duration("window"),
		capacity: decimalValue(c, "capacity"), rate: decimalValue(c, "rate"), period: c.Duration("period"), mode: c.String("mode"),
		lease: c.Duration("lease"), reserve: decimalValue(c, "reserve"), name: c.String("name"),
		field: func(f string) string { return "--" + f },
	}
	for _, f := range limitFields {
		s.set[f] = c.IsSet(f)
	}
	return s, s.check()
}

// parseSpec reads an --also spec, ALGORITHM,field=value,...: the fields are call's flags
// (limit, window, capacity, rate, period, mode, reserve, name), key, the principal (default:
// the call's KEY), and policy, the httplimit name that scopes it (default: the call's
// --policy). A value cannot hold a comma.
func parseSpec(text string) (*limitSpec, error) {
	parts := strings.Split(text, ",")
	s := &limitSpec{algorithm: parts[0], set: map[string]bool{}, mode: "police", field: func(f string) string { return f + "=" }}
	numbers := map[string]*int64{"limit": &s.limit, "capacity": &s.capacity, "rate": &s.rate, "reserve": &s.reserve}
	durations := map[string]*time.Duration{"window": &s.window, "period": &s.period, "lease": &s.lease}
	for _, p := range parts[1:] {
		f, v, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("%q is not field=value", p)
		}
		if s.set[f] || (f == "key" && s.key != "") {
			return nil, fmt.Errorf("%s given twice", f)
		}
		var err error
		switch {
		case numbers[f] != nil:
			if *numbers[f], err = parseDecimal(v); err != nil {
				return nil, fmt.Errorf("%s %v", s.field(f), err) // e.g. limit= "0x10" is not a decimal integer
			}
		case durations[f] != nil:
			*durations[f], err = time.ParseDuration(v)
		case f == "mode":
			s.mode = v
		case f == "name":
			s.name = v
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
			return nil, fmt.Errorf("unknown field %q: limit, window, capacity, rate, period, mode, reserve, name, key or policy", f)
		}
		if err != nil {
			return nil, fmt.Errorf("invalid value %q for %s", v, s.field(f))
		}
		s.set[f] = true
	}
	if err := s.check(); err != nil {
		return nil, err
	}
	if s.algorithm == "concurrency" {
		return nil, fmt.Errorf("concurrency leases are not part of a decision on several limits")
	}
	return s, nil
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
