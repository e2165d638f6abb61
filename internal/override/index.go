package override

import (
	"maps"
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
// Index is read by every decision and never changed: Lookup allocates nothing, and is a map
// lookup per distinct pattern length of the policy. A change makes a new Index with With: a
// small layer over the same base, so that a change of one override among millions copies the
// layer, not the millions.
type Index[T any] struct {
	policies map[Policy]*policyIndex[T]
	under    *Index[T] // the base this layer lies over; nil for a base
	n        int       // overrides in force through this index (base and layer)
	layer    int       // entries of this layer
}

type policyIndex[T any] struct {
	exact    map[string]entry[T]
	prefixes map[string]entry[T] // by prefix (the pattern without its '*')
	lens     []int               // the distinct prefix lengths, longest first (a layer's: its base's too)
}

type entry[T any] struct {
	v     T
	until int64 // Unix ms; 0: none; gone: removed in this layer (hides the base's)
}

const gone = -1

// Compiled is one override and what the caller made of it, for NewIndex.
type Compiled[T any] struct {
	ID    ID
	Until time.Time
	V     T
}

// Builder makes an Index one override at a time, each replacing or removing any earlier of
// its ID: for a load that receives a store's entries in no order, a later one winning.
type Builder[T any] struct {
	ix   *Index[T]
	hint int
}

// NewBuilder starts an empty Index.
func NewBuilder[T any]() *Builder[T] {
	return &Builder[T]{ix: &Index[T]{policies: map[Policy]*policyIndex[T]{}}}
}

// SizeHint sizes the index's first policy for about n overrides: a load of a million then
// grows no map.
func (b *Builder[T]) SizeHint(n int) { b.hint = n }

func (b *Builder[T]) policy(p Policy) *policyIndex[T] {
	pi := b.ix.policies[p]
	if pi == nil {
		pi = &policyIndex[T]{exact: make(map[string]entry[T], b.hint), prefixes: map[string]entry[T]{}}
		b.hint = 0
		b.ix.policies[p] = pi
	}
	return pi
}

// Set sets the override of id.
func (b *Builder[T]) Set(id ID, until time.Time, v T) {
	e := entry[T]{v: v}
	if !until.IsZero() {
		e.until = max(until.UnixMilli(), 1)
	}
	b.put(id, e)
}

// Remove removes the override of id, if any.
func (b *Builder[T]) Remove(id ID) {
	if b.ix.under != nil {
		b.put(id, entry[T]{until: gone})
		return
	}
	pi := b.ix.policies[id.Policy]
	if pi == nil {
		return
	}
	if IsPattern(id.Key) {
		delete(pi.prefixes, id.Key[:len(id.Key)-1])
	} else {
		delete(pi.exact, id.Key)
	}
}

func (b *Builder[T]) put(id ID, e entry[T]) {
	pi := b.policy(id.Policy)
	if IsPattern(id.Key) {
		prefix := id.Key[:len(id.Key)-1]
		if !slices.Contains(pi.lens, len(prefix)) {
			pi.lens = append(pi.lens, len(prefix))
		}
		pi.prefixes[prefix] = e
	} else {
		pi.exact[id.Key] = e
	}
}

// Index is the index built. The builder is not used after.
func (b *Builder[T]) Index() *Index[T] {
	ix := b.ix
	ix.layer = 0
	for p, pi := range ix.policies {
		if u := ix.under; u != nil {
			if up := u.policies[p]; up != nil {
				for _, n := range up.lens {
					if !slices.Contains(pi.lens, n) {
						pi.lens = append(pi.lens, n)
					}
				}
			}
		}
		slices.Sort(pi.lens)
		slices.Reverse(pi.lens)
		ix.layer += len(pi.exact) + len(pi.prefixes)
	}
	ix.n = ix.count()
	return ix
}

// count is how many overrides the index holds: its base's, and its layer's that are not the
// base's (less those it removes).
func (ix *Index[T]) count() int {
	if ix.under == nil {
		return ix.layer
	}
	n := ix.under.n
	for p, pi := range ix.policies {
		up := ix.under.policies[p]
		for k, e := range pi.exact {
			_, had := lookup(up, k, false)
			n += delta(had, e.until != gone)
		}
		for k, e := range pi.prefixes {
			_, had := lookup(up, k, true)
			n += delta(had, e.until != gone)
		}
	}
	return n
}

func lookup[T any](p *policyIndex[T], k string, prefix bool) (entry[T], bool) {
	if p == nil {
		return entry[T]{}, false
	}
	if prefix {
		e, ok := p.prefixes[k]
		return e, ok
	}
	e, ok := p.exact[k]
	return e, ok
}

func delta(had, has bool) int {
	switch {
	case had && !has:
		return -1
	case !had && has:
		return 1
	}
	return 0
}

// With is the index with changes: a new layer over ix's base holding ix's layer and them.
// It copies the layer only, so a change costs what the changes since the base weigh; the
// caller folds the layer into a new base (Flatten) when it grows.
func (ix *Index[T]) With(changes func(*Builder[T])) *Index[T] {
	base := ix
	nb := &Index[T]{policies: map[Policy]*policyIndex[T]{}}
	if ix != nil && ix.under != nil {
		base = ix.under
		nbb := &Builder[T]{ix: nb}
		for p, pi := range ix.policies {
			np := nbb.policy(p)
			maps.Copy(np.exact, pi.exact)
			maps.Copy(np.prefixes, pi.prefixes)
			for k := range pi.prefixes {
				if !slices.Contains(np.lens, len(k)) {
					np.lens = append(np.lens, len(k))
				}
			}
		}
	}
	if base == nil {
		base = NewBuilder[T]().Index()
	}
	nb.under = base
	b := &Builder[T]{ix: nb}
	changes(b)
	return b.Index()
}

// Layer is how many entries lie over the base: the cost of the next With.
func (ix *Index[T]) Layer() int {
	if ix == nil || ix.under == nil {
		return 0
	}
	return ix.layer
}

// Flatten is ix as one base: its layer folded into a copy of its base.
func (ix *Index[T]) Flatten() *Index[T] {
	if ix == nil || ix.under == nil {
		return ix
	}
	b := NewBuilder[T]()
	for _, src := range []*Index[T]{ix.under, ix} {
		for p, pi := range src.policies {
			for k, e := range pi.exact {
				id := ID{p, k}
				if e.until == gone {
					b.Remove(id)
				} else {
					b.put(id, e)
				}
			}
			for k, e := range pi.prefixes {
				id := ID{p, k + "*"}
				if e.until == gone {
					b.Remove(id)
				} else {
					b.put(id, e)
				}
			}
		}
	}
	return b.Index()
}

// NewIndex indexes the compiled overrides. Of two with one ID, the last wins (a store holds
// one per ID).
func NewIndex[T any](all []Compiled[T]) *Index[T] {
	b := NewBuilder[T]()
	for _, c := range all {
		b.Set(c.ID, c.Until, c.V)
	}
	return b.Index()
}

// Len is how many overrides the index holds.
func (ix *Index[T]) Len() int {
	if ix == nil {
		return 0
	}
	return ix.n
}

// Empty reports whether the index holds no override: a decision then looks up nothing.
func (ix *Index[T]) Empty() bool { return ix == nil || ix.n == 0 }

// Lookup is the override of policy (algorithm, name) that applies to key at nowMs (Unix
// milliseconds, read by now only when an override has an end): an expired override is skipped
// for the next in precedence, as if it had been removed.
func (ix *Index[T]) Lookup(algorithm, name, key string, now func() int64) (v T, ok bool) {
	if ix.Empty() {
		return v, false
	}
	pol := Policy{algorithm, name}
	p := ix.policies[pol]
	var up *policyIndex[T]
	if ix.under != nil {
		up = ix.under.policies[pol]
	}
	if p == nil {
		if up == nil {
			return v, false
		}
		p, up = up, nil
	}
	var nowMs int64 // read once, when first needed
	live := func(e entry[T]) bool {
		switch {
		case e.until == 0:
			return true
		case e.until == gone:
			return false
		}
		if nowMs == 0 {
			nowMs = now()
		}
		return nowMs < e.until
	}
	// find is the entry of k in the layer, else in the base
	find := func(k string, prefix bool) (entry[T], bool) {
		if e, ok := lookup(p, k, prefix); ok {
			return e, true
		}
		return lookup(up, k, prefix)
	}
	if e, found := find(key, false); found && live(e) {
		return e.v, true
	}
	for _, n := range p.lens {
		if n > len(key) {
			continue
		}
		if e, found := find(key[:n], true); found && live(e) {
			return e.v, true
		}
	}
	return v, false
}
