package override

import (
	"slices"
	"time"
)

// Index finds the override of a policy that applies to a key, by the rules of precedence: an
// exact key beats any pattern, a longer pattern beats a shorter one, and any override beats
// the code's limit (no match: ok is false). Ties cannot happen: patterns are a literal prefix
// and one trailing '*', so two distinct patterns that both match a key are prefixes of it of
// different lengths, and an exact key and a pattern of one ID are one override.
//
// T is what the caller compiled each override into (the client: the limit it sends). An
// Index is built once per change of the store and read by every decision: Lookup allocates
// nothing, and is a map lookup per distinct pattern length of the policy.
type Index[T any] struct {
	policies map[Policy]*policyIndex[T]
}

type policyIndex[T any] struct {
	exact    map[string]entry[T]
	prefixes map[string]entry[T] // by prefix (the pattern without its '*')
	lens     []int               // the distinct prefix lengths, longest first
}

type entry[T any] struct {
	v     T
	until int64 // Unix ms; 0: none
}

// Compiled is one override and what the caller made of it, for NewIndex.
type Compiled[T any] struct {
	ID    ID
	Until time.Time
	V     T
}

// NewIndex indexes the compiled overrides. Of two with one ID, the last wins (a store holds
// one per ID).
func NewIndex[T any](all []Compiled[T]) *Index[T] {
	ix := &Index[T]{policies: map[Policy]*policyIndex[T]{}}
	for _, c := range all {
		p := ix.policies[c.ID.Policy]
		if p == nil {
			p = &policyIndex[T]{exact: map[string]entry[T]{}, prefixes: map[string]entry[T]{}}
			ix.policies[c.ID.Policy] = p
		}
		e := entry[T]{v: c.V}
		if !c.Until.IsZero() {
			e.until = c.Until.UnixMilli()
		}
		if IsPattern(c.ID.Key) {
			prefix := c.ID.Key[:len(c.ID.Key)-1]
			if _, ok := p.prefixes[prefix]; !ok && !slices.Contains(p.lens, len(prefix)) {
				p.lens = append(p.lens, len(prefix))
			}
			p.prefixes[prefix] = e
		} else {
			p.exact[c.ID.Key] = e
		}
	}
	for _, p := range ix.policies {
		slices.Sort(p.lens)
		slices.Reverse(p.lens)
	}
	return ix
}

// Len is how many overrides the index holds.
func (ix *Index[T]) Len() int {
	if ix == nil {
		return 0
	}
	n := 0
	for _, p := range ix.policies {
		n += len(p.exact) + len(p.prefixes)
	}
	return n
}

// Empty reports whether the index holds no override: a decision then looks up nothing.
func (ix *Index[T]) Empty() bool { return ix == nil || len(ix.policies) == 0 }

// Lookup is the override of policy (algorithm, name) that applies to key at nowMs (Unix
// milliseconds, read by now only when an override has an end): an expired override is skipped
// for the next in precedence, as if it had been removed.
func (ix *Index[T]) Lookup(algorithm, name, key string, now func() int64) (v T, ok bool) {
	if ix == nil || len(ix.policies) == 0 {
		return v, false
	}
	p := ix.policies[Policy{algorithm, name}]
	if p == nil {
		return v, false
	}
	var nowMs int64 // read once, when first needed
	live := func(e entry[T]) bool {
		if e.until == 0 {
			return true
		}
		if nowMs == 0 {
			nowMs = now()
		}
		return nowMs < e.until
	}
	if e, found := p.exact[key]; found && live(e) {
		return e.v, true
	}
	for _, n := range p.lens {
		if n > len(key) {
			continue
		}
		if e, found := p.prefixes[key[:n]]; found && live(e) {
			return e.v, true
		}
	}
	return v, false
}
