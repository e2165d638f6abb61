// Package envoyconf reads the YAML configuration of envoyproxy/ratelimit, the reference
// rate limit service for Envoy, and rlfn's extensions to it, and matches a request's
// descriptors against it. It is pure: files in, a Config out, no network.
//
// A file the reference loads is loaded unchanged, with the same meaning; a file it refuses is
// refused with the reference's message (a YAML syntax error aside, whose words come from
// another YAML parser). rlfn's extensions are keys the reference does not know, which it
// refuses as unknown keys: a file using them never runs on the reference with another
// meaning.
package envoyconf

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/limitspec"
)

// Unit is a rate limit's unit as the reference names it. The numbers are those of Envoy's
// RateLimitResponse.RateLimit.Unit, so that a response carries them unchanged.
type Unit int32

const (
	Second Unit = 1
	Minute Unit = 2
	Hour   Unit = 3
	Day    Unit = 4
	Month  Unit = 5
	Year   Unit = 6
	Week   Unit = 7
)

var unitNames = map[string]Unit{
	"SECOND": Second, "MINUTE": Minute, "HOUR": Hour, "DAY": Day,
	"WEEK": Week, "MONTH": Month, "YEAR": Year,
}

// Length is the unit's fixed length, as the reference counts it: a month is 30 days and a
// year 365, whatever the calendar says (the calendar algorithm counts real months).
func (u Unit) Length() time.Duration {
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 30 * 24 * time.Hour
	case Year:
		return 365 * 24 * time.Hour
	}
	return 0
}

func (u Unit) String() string {
	for name, v := range unitNames {
		if v == u {
			return strings.ToLower(name)
		}
	}
	return "unknown"
}

// Algorithm names one of rlfn's algorithms as the extension key `algorithm` takes it.
type Algorithm string

const (
	FixedWindow   Algorithm = "fixed_window" // the reference's algorithm, and the default
	SlidingLog    Algorithm = "sliding_log"
	SlidingWindow Algorithm = "sliding_window"
	TokenBucket   Algorithm = "token_bucket"
	LeakyBucket   Algorithm = "leaky_bucket"
	Calendar      Algorithm = "calendar"
	Concurrency   Algorithm = "concurrency"
)

// Limit is one limit of a descriptor: the reference's rate_limit, or one of rlfn's.
type Limit struct {
	Algorithm       Algorithm
	RequestsPerUnit uint32 // the reference's field; the client's limit, capacity or rate
	Unit            Unit
	// Multiplier is the period in units (the extension unit_multiplier, as newer Envoy
	// versions name it); 1 unless set.
	Multiplier int64
	// Client is the limit the client decides with; nil for Concurrency and Zero.
	Client client.Limit
	// Penalty is how long a denial blocks the principal (library 1.2.0); 0: none. Client
	// has it too, where the configuration's release check cannot read it.
	Penalty time.Duration
	// Zero is a fixed window of 0 requests, which the reference takes: every hit is over it,
	// and a request of 0 hits is within it.
	Zero bool
	// Slots is the concurrency limit, for Concurrency only.
	Slots *client.Concurrency
	// HolderKey is, for Concurrency, the descriptor entry whose value identifies the holder
	// of a lease (e.g. a request id); it is left out of the principal's key.
	HolderKey string
}

// Period is the limit's period: Unit.Length times Multiplier.
func (l Limit) Period() time.Duration { return l.Unit.Length() * time.Duration(l.Multiplier) }

// periodFits says whether Period is the unit times the multiplier: a multiplier large enough
// wraps the product around (3,335,999,724 days to 31 minutes).
func (l Limit) periodFits() bool { return l.Period()/l.Unit.Length() == time.Duration(l.Multiplier) }

// RateLimit is what a descriptor of the configuration holds: the reference's rate_limit
// (one fixed window, or unlimited) or rlfn's list of limits.
type RateLimit struct {
	Limits    []Limit
	Unlimited bool
	Name      string
	Replaces  []string

	ShadowMode     bool
	QuotaMode      bool
	DetailedMetric bool
	Metadata       *structpb.Struct
	// FullKey is the descriptor's path in the configuration, domain.key_value.key, as the
	// reference names its statistics: bounded by the configuration, never by requests.
	FullKey string
	// Override: the request's own limit (see Override), not the configuration's.
	Override bool
}

// File is one configuration file: its name (for messages) and contents.
type File struct {
	Name string
	Data []byte
}

// Error is a load error, "<file>: <what is wrong>", in the reference's words.
type Error struct {
	File string
	Msg  string
}

func (e *Error) Error() string { return e.File + ": " + e.Msg }

// Config is a loaded configuration: every domain's descriptor tree.
type Config struct {
	domains map[string]*node
}

type node struct {
	children  map[string]*node // by key, or key_value
	wildcards []wildcard       // children whose value holds '*', in file order
	limit     *RateLimit
	// shareThreshold: values matched by this node's wildcard share one counter.
	shareThreshold bool
	pattern        string // the wildcard value, when shareThreshold
}

type wildcard struct {
	key   string // key_value, as in children
	parts []string
}

// Domains lists the configuration's domains.
func (c *Config) Domains() []string {
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	return out
}

// referenceKeys are the keys the reference accepts, anywhere in a file (its check does not
// look at where a key is; a key in the wrong place is then ignored by its decoder, and so
// here).
var referenceKeys = map[string]bool{
	"domain": true, "key": true, "value": true, "descriptors": true, "rate_limit": true,
	"unit": true, "requests_per_unit": true, "unlimited": true, "shadow_mode": true,
	"quota_mode": true, "name": true, "replaces": true, "detailed_metric": true,
	"value_to_metric": true, "share_threshold": true, "metadata": true,
}

// limitKeys are rlfn's extension keys of a rate_limit (and of each item of rate_limits).
var limitKeys = map[string]bool{
	"algorithm": true, "unit_multiplier": true, "burst": true, "mode": true, "reserve": true,
	"penalty": true, "time_zone": true, "anchor": true, "lease": true, "holder_key": true,
}

// descriptorKeys are rlfn's extension keys of a descriptor.
var descriptorKeys = map[string]bool{"rate_limits": true}

// Load parses files into one Config. With merge, files of one domain add to it (the
// reference's MERGE_DOMAIN_CONFIG); without, a second file of a domain is an error.
func Load(files []File, merge bool) (*Config, error) {
	c := &Config{domains: map[string]*node{}}
	for _, f := range files {
		if err := c.load(f, merge); err != nil {
			return nil, err
		}
	}
	return c, nil
}

type yamlReplaces struct {
	Name string `yaml:"name"`
}

type yamlLimit struct {
	RequestsPerUnit uint32         `yaml:"requests_per_unit"`
	Unit            string         `yaml:"unit"`
	Unlimited       bool           `yaml:"unlimited"`
	Name            string         `yaml:"name"`
	Replaces        []yamlReplaces `yaml:"replaces"`

	Algorithm      string `yaml:"algorithm"`
	UnitMultiplier *int64 `yaml:"unit_multiplier"`
	Burst          *int64 `yaml:"burst"`
	Mode           string `yaml:"mode"`
	Reserve        int64  `yaml:"reserve"`
	Penalty        string `yaml:"penalty"`
	TimeZone       string `yaml:"time_zone"`
	Anchor         string `yaml:"anchor"`
	Lease          string `yaml:"lease"`
	HolderKey      string `yaml:"holder_key"`
}

type yamlDescriptor struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value"`
	RateLimit      *yamlLimit       `yaml:"rate_limit"`
	RateLimits     []yamlLimit      `yaml:"rate_limits"`
	Descriptors    []yamlDescriptor `yaml:"descriptors"`
	ShadowMode     bool             `yaml:"shadow_mode"`
	QuotaMode      bool             `yaml:"quota_mode"`
	DetailedMetric bool             `yaml:"detailed_metric"`
	ValueToMetric  bool             `yaml:"value_to_metric"`
	ShareThreshold bool             `yaml:"share_threshold"`
	Metadata       map[string]any   `yaml:"metadata"`
}

type yamlRoot struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors"`
}

func (c *Config) load(f File, merge bool) error {
	fail := func(format string, a ...any) error { return &Error{File: f.Name, Msg: fmt.Sprintf(format, a...)} }
	var doc yaml.Node
	if err := yaml.Unmarshal(f.Data, &doc); err != nil {
		return fail("error loading config file: %s", err)
	}
	var root yamlRoot
	if len(doc.Content) > 0 {
		top := doc.Content[0]
		if top.Kind != yaml.MappingNode {
			// The reference decodes the file into a map; anything else is its YAML error.
			return fail("error loading config file: the file is not a map of keys (domain, descriptors)")
		}
		if err := validate(top, ""); err != nil {
			return fail("%s", err)
		}
		lastKeyWins(top)
		if err := strictBools(top); err != nil {
			return fail("error loading config file: %s", err)
		}
		if err := top.Decode(&root); err != nil {
			return fail("error loading config file: %s", err)
		}
	}
	if root.Domain == "" {
		return fail("config file cannot have empty domain")
	}
	d, present := c.domains[root.Domain]
	if present && !merge {
		return fail("duplicate domain '%s' in config file", root.Domain)
	}
	if !present {
		d = &node{children: map[string]*node{}}
		c.domains[root.Domain] = d
	}
	if err := d.loadDescriptors(root.Domain+".", root.Descriptors); err != nil {
		return fail("%s", err)
	}
	return nil
}

// validate checks n's keys as the reference does (every key a string, and one it knows;
// lists hold maps; leaves are strings, integers, booleans or null), and rlfn's keys where
// they belong: in a rate_limit or rate_limits item (parent "limit"), in a descriptor
// (parent "descriptor").
func validate(n *yaml.Node, parent string) error {
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
			return fmt.Errorf("config error, key is not of type string: %v", k.Value)
		}
		name := k.Value
		switch {
		case referenceKeys[name]:
		case limitKeys[name] && parent == "limit", descriptorKeys[name] && parent == "descriptor":
		default:
			return fmt.Errorf("config error, unknown key '%s'", name)
		}
		if name == "metadata" {
			// Arbitrary: converted to a protobuf Struct later.
			continue
		}
		child := ""
		switch name {
		case "descriptors":
			child = "descriptor"
		case "rate_limit", "rate_limits":
			child = "limit"
		}
		if err := validateValue(v, child); err != nil {
			return err
		}
	}
	return nil
}

func validateValue(v *yaml.Node, child string) error {
	switch v.Kind {
	case yaml.SequenceNode:
		for _, e := range v.Content {
			if e.Kind != yaml.MappingNode {
				return fmt.Errorf("config error, yaml file contains list of type other than map: %v", e.Value)
			}
			if err := validate(e, child); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		return validate(v, child)
	case yaml.ScalarNode:
		switch v.Tag {
		case "!!str", "!!int", "!!bool", "!!null":
		default:
			return fmt.Errorf("error checking config")
		}
	case yaml.AliasNode:
		return validateValue(v.Alias, child)
	}
	return nil
}

// lastKeyWins drops every mapping key that the same mapping repeats later: the reference's
// YAML parser takes the last one, where ours would refuse the file.
func lastKeyWins(n *yaml.Node) {
	if n.Kind == yaml.MappingNode {
		last := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			last[n.Content[i].Value] = i
		}
		kept := n.Content[:0]
		for i := 0; i+1 < len(n.Content); i += 2 {
			if last[n.Content[i].Value] == i {
				kept = append(kept, n.Content[i], n.Content[i+1])
			}
		}
		n.Content = kept
	}
	for _, c := range n.Content {
		lastKeyWins(c)
	}
}

// boolKeys are the reference's boolean keys.
var boolKeys = map[string]bool{
	"unlimited": true, "shadow_mode": true, "quota_mode": true, "detailed_metric": true,
	"value_to_metric": true, "share_threshold": true,
}

// yaml11Bool are YAML 1.1's booleans, which the reference's parser reads as such unquoted.
var yaml11Bool = map[string]bool{}

func init() {
	for _, w := range strings.Fields("y yes true on n no false off") {
		for _, v := range []string{w, strings.ToUpper(w[:1]) + w[1:], strings.ToUpper(w)} {
			yaml11Bool[v] = true
		}
	}
}

// strictBools refuses a quoted string as a boolean ("yes"), which the reference's YAML parser
// refuses and ours would read as true, in the reference's words.
func strictBools(n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			quoted := v.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0
			if boolKeys[k.Value] && v.Kind == yaml.ScalarNode && v.Tag == "!!str" && (quoted || !yaml11Bool[v.Value]) {
				return fmt.Errorf("yaml: unmarshal errors:\n  line %d: cannot unmarshal !!str `%s` into bool", v.Line, v.Value)
			}
		}
	}
	for _, c := range n.Content {
		if err := strictBools(c); err != nil {
			return err
		}
	}
	return nil
}

func (n *node) loadDescriptors(parentKey string, ds []yamlDescriptor) error {
	for _, dc := range ds {
		if dc.Key == "" {
			return fmt.Errorf("descriptor has empty key")
		}
		finalKey := dc.Key
		if dc.Value != "" {
			finalKey += "_" + dc.Value
		}
		fullKey := parentKey + finalKey
		if _, present := n.children[finalKey]; present {
			return fmt.Errorf("duplicate descriptor composite key '%s'", fullKey)
		}
		rl, err := loadRateLimit(dc, fullKey)
		if err != nil {
			return err
		}
		if dc.ShareThreshold && !strings.Contains(finalKey, "*") {
			return fmt.Errorf("share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", finalKey)
		}
		if len(dc.Metadata) > 0 {
			m, err := structpb.NewStruct(dc.Metadata)
			if err != nil {
				return fmt.Errorf("error parsing metadata: %s", err)
			}
			if rl != nil {
				rl.Metadata = m
			}
		}
		child := &node{children: map[string]*node{}, limit: rl, shareThreshold: dc.ShareThreshold}
		if dc.ShareThreshold {
			child.pattern = dc.Value
		}
		if strings.Contains(finalKey, "*") {
			n.wildcards = append(n.wildcards, wildcard{key: finalKey, parts: strings.Split(finalKey, "*")})
		}
		if err := child.loadDescriptors(fullKey+".", dc.Descriptors); err != nil {
			return err
		}
		n.children[finalKey] = child
	}
	return nil
}

func loadRateLimit(dc yamlDescriptor, fullKey string) (*RateLimit, error) {
	if dc.RateLimit == nil && len(dc.RateLimits) == 0 {
		return nil, nil
	}
	if dc.RateLimit != nil && len(dc.RateLimits) > 0 {
		return nil, fmt.Errorf("descriptor '%s' has both rate_limit and rate_limits: give its limits in one list", fullKey)
	}
	rl := &RateLimit{
		ShadowMode: dc.ShadowMode, QuotaMode: dc.QuotaMode, DetailedMetric: dc.DetailedMetric,
		FullKey: fullKey,
	}
	ys := dc.RateLimits
	if dc.RateLimit != nil {
		ys = []yamlLimit{*dc.RateLimit}
	}
	// Limits of one algorithm on one descriptor need names of their own in the key (see
	// client.Limit): each gets its index, so that the keys stay the same while the list
	// keeps its order.
	algorithms := map[Algorithm]int{}
	for _, y := range ys {
		algorithms[algorithmOf(y)]++
	}
	for i, y := range ys {
		unit, validUnit := unitNames[strings.ToUpper(y.Unit)]
		if y.Unlimited {
			if validUnit {
				return nil, fmt.Errorf("should not specify rate limit unit when unlimited")
			}
			if len(ys) > 1 {
				return nil, fmt.Errorf("descriptor '%s': an unlimited limit is the descriptor's only one", fullKey)
			}
			rl.Unlimited = true
		} else if !validUnit {
			return nil, fmt.Errorf("invalid rate limit unit '%s'", y.Unit)
		}
		for _, r := range y.Replaces {
			if r.Name == "" {
				return nil, fmt.Errorf("should not have an empty replaces entry")
			}
			if r.Name == y.Name {
				return nil, fmt.Errorf("replaces should not contain name of same descriptor")
			}
			rl.Replaces = append(rl.Replaces, r.Name)
		}
		if y.Name != "" {
			if rl.Name != "" && rl.Name != y.Name {
				return nil, fmt.Errorf("descriptor '%s': its limits have two names, %q and %q: a descriptor has one name", fullKey, rl.Name, y.Name)
			}
			rl.Name = y.Name
		}
		if rl.Unlimited {
			continue
		}
		name := ""
		if algorithms[algorithmOf(y)] > 1 {
			name = strconv.Itoa(i)
		}
		l, err := extend(y, unit, name)
		if err != nil {
			where := fullKey
			if len(ys) > 1 {
				where += fmt.Sprintf(" rate_limits[%d]", i)
			}
			return nil, fmt.Errorf("descriptor '%s': %s", where, err)
		}
		rl.Limits = append(rl.Limits, l)
	}
	return rl, nil
}

// algorithmOf is y's algorithm: a fixed window, as the reference's, unless set.
func algorithmOf(y yamlLimit) Algorithm {
	if y.Algorithm == "" {
		return FixedWindow
	}
	return Algorithm(y.Algorithm)
}

// extend turns one rate_limit (with rlfn's keys) into a Limit the client can decide, named
// name in the key.
func extend(y yamlLimit, unit Unit, name string) (Limit, error) {
	l := Limit{Algorithm: algorithmOf(y), RequestsPerUnit: y.RequestsPerUnit, Unit: unit, Multiplier: 1}
	if y.UnitMultiplier != nil {
		if *y.UnitMultiplier < 1 {
			return l, fmt.Errorf("unit_multiplier must be at least 1, got %d", *y.UnitMultiplier)
		}
		l.Multiplier = *y.UnitMultiplier
	}
	n := int64(y.RequestsPerUnit)
	period := l.Period()
	if !l.periodFits() {
		return l, fmt.Errorf("unit_multiplier %d times a %s is too long", l.Multiplier, l.Unit)
	}
	penalty, err := duration("penalty", y.Penalty)
	if err != nil {
		return l, err
	}
	l.Penalty = penalty
	only := func(field string, set bool, algos ...Algorithm) error {
		if !set {
			return nil
		}
		for _, a := range algos {
			if a == l.Algorithm {
				return nil
			}
		}
		return fmt.Errorf("%s does not apply to algorithm %s", field, l.Algorithm)
	}
	for _, e := range []error{
		only("burst", y.Burst != nil, TokenBucket, LeakyBucket),
		only("mode", y.Mode != "", LeakyBucket),
		only("time_zone", y.TimeZone != "", Calendar),
		only("anchor", y.Anchor != "", Calendar),
		only("lease", y.Lease != "", Concurrency),
		only("holder_key", y.HolderKey != "", Concurrency),
		only("penalty", penalty != 0, FixedWindow, SlidingLog, SlidingWindow, TokenBucket, LeakyBucket, Calendar),
	} {
		if e != nil {
			return l, e
		}
	}
	capacity := n
	if y.Burst != nil {
		capacity = *y.Burst
	}
	if l.Algorithm == FixedWindow && n == 0 && y.Reserve == 0 && penalty == 0 {
		// The reference takes a limit of 0: it refuses every request that takes a hit. The
		// library has no such limit; the service decides it alone (see Limit.Zero).
		l.Zero = true
		return l, nil
	}
	switch l.Algorithm {
	case FixedWindow:
		l.Client = client.FixedWindow{Limit: n, Window: period, Reserve: y.Reserve, Penalty: penalty, Name: name}
	case SlidingLog:
		l.Client = client.SlidingLog{Limit: n, Window: period, Reserve: y.Reserve, Penalty: penalty, Name: name}
	case SlidingWindow:
		l.Client = client.SlidingWindow{Limit: n, Window: period, Reserve: y.Reserve, Penalty: penalty, Name: name}
	case TokenBucket:
		l.Client = client.TokenBucket{Capacity: capacity, Rate: n, Period: period, Reserve: y.Reserve, Penalty: penalty, Name: name}
	case LeakyBucket:
		mode := client.Police
		if y.Mode != "" {
			m, ok := limitspec.ParseMode(y.Mode)
			if !ok {
				return l, fmt.Errorf("mode must be police or shape, got %q", y.Mode)
			}
			mode = m
		}
		l.Client = client.LeakyBucket{Capacity: capacity, Rate: n, Period: period, Mode: mode, Reserve: y.Reserve, Penalty: penalty, Name: name}
	case Calendar:
		p, ok := limitspec.ParsePeriod(strings.ToLower(l.Unit.String()))
		if !ok {
			return l, fmt.Errorf("a calendar's unit is day, week, month or year, got %s", l.Unit)
		}
		if l.Multiplier != 1 {
			return l, fmt.Errorf("a calendar takes no unit_multiplier")
		}
		anchor, err := limitspec.Anchor(p, y.Anchor, y.TimeZone)
		if err != nil {
			return l, err
		}
		l.Client = client.Calendar{Limit: n, Period: p, Anchor: anchor, Reserve: y.Reserve, Penalty: penalty, Name: name}
	case Concurrency:
		lease, err := duration("lease", y.Lease)
		if err != nil {
			return l, err
		}
		if lease == 0 {
			return l, fmt.Errorf("a concurrency limit needs a lease (e.g. lease: 30s): how long a slot is held when no release comes")
		}
		if y.HolderKey == "" {
			return l, fmt.Errorf("a concurrency limit needs a holder_key: the descriptor entry naming the holder (e.g. a request id)")
		}
		c := client.Concurrency{Limit: n, Lease: lease, Reserve: y.Reserve}
		if err := c.Validate(); err != nil {
			return l, err
		}
		l.Slots, l.HolderKey = &c, y.HolderKey
		return l, nil
	default:
		return l, fmt.Errorf("unknown algorithm %q: one of fixed_window, sliding_log, sliding_window, token_bucket, leaky_bucket, calendar, concurrency", y.Algorithm)
	}
	if err := l.Client.Validate(); err != nil {
		return l, err
	}
	return l, nil
}

func duration(field, s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s must be a positive duration such as 30s or 10m, got %q", field, s)
	}
	return d, nil
}
