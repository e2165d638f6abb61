package envoyconf

import (
	"fmt"
	"strings"

	"github.com/rlfn/rlfn/client"
)

// Entry is one entry of a request's descriptor.
type Entry struct {
	Key, Value string
}

// Match is what the configuration says about one descriptor of a request.
type Match struct {
	// Limit is the descriptor's limit; nil when none applies (an unknown domain, no matching
	// descriptor, or a limit above the descriptor's last entry, which the reference ignores).
	Limit *RateLimit
	// Shared holds, per entry, the wildcard value that replaces the entry's value in the
	// counter's key when the matching descriptor has share_threshold (every value it matches
	// shares one counter); "" for an entry counted by its own value.
	Shared []string
}

// HasDomain reports whether the configuration has domain.
func (c *Config) HasDomain(domain string) bool { return c.domains[domain] != nil }

// Match finds the limit of a descriptor in domain, as the reference does: at each level an
// entry matches the child key_value, else the first wildcard child whose key_value matches
// (in file order), else the child with the key alone; the limit is the one at the level of
// the descriptor's last entry, so a descriptor with more entries than the configuration's
// path has no limit.
func (c *Config) Match(domain string, entries []Entry) Match {
	cur := c.domains[domain]
	if cur == nil {
		return Match{}
	}
	var m Match
	for i, e := range entries {
		full := e.Key + "_" + e.Value
		next := cur.children[full]
		wild := false
		if next == nil {
			for _, w := range cur.wildcards {
				if wildcardMatch(w.parts, full) {
					next, wild = cur.children[w.key], true
					break
				}
			}
		}
		if next == nil {
			next = cur.children[e.Key]
		}
		if next == nil {
			break
		}
		if wild && next.shareThreshold {
			if m.Shared == nil {
				m.Shared = make([]string, len(entries))
			}
			m.Shared[i] = next.pattern
		}
		if next.limit != nil && i == len(entries)-1 {
			m.Limit = next.limit
		}
		if len(next.children) == 0 {
			break
		}
		cur = next
	}
	return m
}

// wildcardMatch reports whether s matches the pattern split at its '*'s: each '*' stands
// for any run of bytes, the empty one included.
func wildcardMatch(parts []string, s string) bool {
	if len(parts) == 1 {
		return parts[0] == s
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(s) < len(first)+len(last) || !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	mid := s[len(first) : len(s)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(mid, p)
		if i < 0 {
			return false
		}
		mid = mid[i+len(p):]
	}
	return true
}

// Override is the limit of a descriptor that carries its own (Envoy's per-descriptor
// limit override): a fixed window, as the reference reads it, never in shadow mode.
// FullKey is the request's path (domain.key_value...), as the reference names it; Override
// is set, so that metrics never label by it.
func Override(domain string, entries []Entry, requestsPerUnit uint32, unit Unit, multiplier int64) (*RateLimit, error) {
	if unit.Length() == 0 {
		return nil, fmt.Errorf("limit override: unknown unit %d", unit)
	}
	if multiplier < 1 {
		multiplier = 1
	}
	l := Limit{Algorithm: FixedWindow, RequestsPerUnit: requestsPerUnit, Unit: unit, Multiplier: multiplier}
	if !l.periodFits() {
		// As a configuration's unit_multiplier is refused.
		return nil, fmt.Errorf("limit override: unit_multiplier %d times a %s is too long", multiplier, unit)
	}
	if requestsPerUnit == 0 {
		// As a configuration's limit of 0, which the reference takes for both.
		l.Zero = true
	} else {
		l.Client = client.FixedWindow{Limit: int64(requestsPerUnit), Window: l.Period()}
		if err := l.Client.Validate(); err != nil {
			return nil, fmt.Errorf("limit override: %w", err)
		}
	}
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range entries {
		b.WriteByte('.')
		b.WriteString(e.Key)
		if e.Value != "" {
			b.WriteString("_" + e.Value)
		}
	}
	return &RateLimit{Limits: []Limit{l}, FullKey: b.String(), Override: true}, nil
}

// Needs is the library release the configuration's limits need: 1.2.0 for a calendar or a
// penalty, else 1.1.0 (several limits decided together, refunds, leases).
func (c *Config) Needs() string {
	need := "1.1.0"
	var walk func(n *node)
	walk = func(n *node) {
		if n.limit != nil {
			for _, l := range n.limit.Limits {
				if l.Algorithm == Calendar || l.Penalty > 0 {
					need = "1.2.0"
				}
			}
		}
		for _, ch := range n.children {
			walk(ch)
		}
	}
	for _, d := range c.domains {
		walk(d)
	}
	return need
}
