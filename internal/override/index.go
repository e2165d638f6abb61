package override

import (
	"hash/maphash"
	"slices"
	"strings"
	"time"
	"unsafe"
)

// Index finds the override of a policy that applies to a key, by the rules of precedence: an
// exact key beats any pattern, a longer pattern beats a shorter one, and any override beats
// the code's limit (no match: nil). Ties cannot happen: patterns are a literal prefix and one
// trailing '*', so two distinct patterns that both match a key are prefixes of it of
// different lengths, and an exact key and a pattern of one ID are one override.
//
// T is what the caller compiled each override into (the client: the limit it sends, and what
// Result says of it). An Index is read by every decision and never changed: Lookup allocates
// nothing, and is a hash lookup per distinct pattern length of the policy. A change makes a
// new Index with With: a small layer over the same base, so that a change of one override
// among millions copies the layer, not the millions.
//
// A million overrides are held without an object or a map entry each, at about 30 bytes
// besides T and the key's text: each override has a place, its T lies in a block of
// blockLen values, its key in a slice by place (the text itself in blocks of Builder.Key),
// and a table of 4-byte places finds it by its key. Lookup hands out a pointer into a block:
// it stays valid, its value unchanged, as long as the caller holds it, and holds that block
// in memory, not the index.
type Index[T any] struct {
	policies map[Policy]*policyIndex
	under    *Index[T] // the base this layer lies over; nil for a base
	vals     [][]T     // by place: vals[p/blockLen][p%blockLen]
	keys     []string  // by place: the exact key, or the pattern's prefix (without its '*')
	until    []int64   // by place: Unix ms, 0 for none, gone for a layer's removal; nil while all are 0
	n        int       // overrides in force through this index (base and layer)
	layer    int       // entries of this layer
}

// blockLen is how many values one block of an Index holds: a pointer Lookup handed out holds
// one block, not a whole load of a million, while a million overrides are a couple of
// thousand blocks.
const blockLen = 512

type policyIndex struct {
	exact    table // the places of the exact keys
	prefixes table // the places of the patterns, by prefix
	lens     []int // the distinct prefix lengths, longest first (a layer's: its base's too)
}

// gone is the end of an override a layer removes: it hides the base's.
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
	text []byte // the block Key copies keys into
}

// NewBuilder starts an empty Index.
func NewBuilder[T any]() *Builder[T] {
	return &Builder[T]{ix: &Index[T]{policies: map[Policy]*policyIndex{}}}
}

// SizeHint sizes the index for about n overrides (its first policy's table too): a load of a
// million then grows nothing.
func (b *Builder[T]) SizeHint(n int) {
	b.hint = n
	b.ix.keys = make([]string, 0, n)
	b.ix.vals = make([][]T, 0, n/blockLen+1)
}

// textBlock is the size of a block of Key's text; a key longer than textBlock/8 is copied
// alone.
const textBlock = 64 << 10

// Key is k copied into the index's own text, many keys to a block rather than one
// allocation each: for a key read from a page of the store (which it would otherwise hold
// whole), to be passed to Set and kept in T.
func (b *Builder[T]) Key(k string) string {
	if k == "" || len(k) > textBlock/8 {
		return strings.Clone(k)
	}
	if cap(b.text)-len(b.text) < len(k) {
		b.text = make([]byte, 0, textBlock)
	}
	start := len(b.text)
	b.text = append(b.text, k...)
	// The bytes of a block are written once, and only past its length after: a string over
	// them never changes.
	return unsafe.String(&b.text[start], len(k))
}

func (b *Builder[T]) policy(p Policy) *policyIndex {
	pi := b.ix.policies[p]
	if pi == nil {
		pi = &policyIndex{}
		pi.exact.init(b.hint)
		b.hint = 0
		b.ix.policies[p] = pi
	}
	return pi
}

// tableOf is the table of id's policy that holds id, and the text it is held by there.
func (b *Builder[T]) tableOf(id ID) (*policyIndex, *table, string) {
	pi := b.policy(id.Policy)
	if IsPattern(id.Key) {
		k := id.Key[:len(id.Key)-1]
		if !slices.Contains(pi.lens, len(k)) {
			pi.lens = append(pi.lens, len(k))
		}
		return pi, &pi.prefixes, k
	}
	return pi, &pi.exact, id.Key
}

// Set sets the override of id.
func (b *Builder[T]) Set(id ID, until time.Time, v T) {
	var u int64
	if !until.IsZero() {
		u = max(until.UnixMilli(), 1)
	}
	b.set(id, u, &v)
}

func (b *Builder[T]) set(id ID, until int64, v *T) {
	_, t, k := b.tableOf(id)
	ix := b.ix
	p := t.find(ix.keys, k)
	if p < 0 {
		// a new place; a replaced override keeps its own
		p = int32(len(ix.keys))
		ix.keys = append(ix.keys, k)
		if int(p)%blockLen == 0 {
			ix.vals = append(ix.vals, make([]T, blockLen))
		}
		t.insert(ix.keys, k, p)
	}
	ix.vals[p/blockLen][p%blockLen] = *v
	if until != 0 && ix.until == nil {
		ix.until = make([]int64, len(ix.keys), cap(ix.keys))
	}
	if ix.until != nil {
		for len(ix.until) <= int(p) {
			ix.until = append(ix.until, 0)
		}
		ix.until[p] = until
	}
}

// Remove removes the override of id, if any.
func (b *Builder[T]) Remove(id ID) {
	var zero T
	if b.ix.under != nil {
		b.set(id, gone, &zero)
		return
	}
	if b.ix.policies[id.Policy] == nil {
		return
	}
	_, t, k := b.tableOf(id)
	if p := t.remove(b.ix.keys, k); p >= 0 {
		// the place stays unused: removals while a base is built are few (a load's delta)
		b.ix.vals[p/blockLen][p%blockLen] = zero
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
		ix.layer += pi.exact.n + pi.prefixes.n
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
	for pol, pi := range ix.policies {
		up := ix.under.policies[pol]
		for _, prefix := range []bool{false, true} {
			pi.table(prefix).each(func(p int32) {
				had := up != nil && up.table(prefix).find(ix.under.keys, ix.keys[p]) >= 0
				n += delta(had, ix.untilOf(p) != gone)
			})
		}
	}
	return n
}

func (pi *policyIndex) table(prefix bool) *table {
	if prefix {
		return &pi.prefixes
	}
	return &pi.exact
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
	nb := &Builder[T]{ix: &Index[T]{policies: map[Policy]*policyIndex{}}}
	if ix != nil && ix.under != nil {
		base = ix.under
		nb.ix.under = base // the copy's removals are marked, not deleted
		ix.each(func(id ID, until int64, v *T) {
			if v == nil {
				nb.Remove(id)
			} else {
				nb.set(id, until, v)
			}
		})
	}
	if base == nil {
		base = NewBuilder[T]().Index()
	}
	nb.ix.under = base
	changes(nb)
	return nb.Index()
}

// each calls f for every entry of ix's own layer (or base): v is nil for a removal.
func (ix *Index[T]) each(f func(id ID, until int64, v *T)) {
	for pol, pi := range ix.policies {
		for _, prefix := range []bool{false, true} {
			pi.table(prefix).each(func(p int32) {
				id := ID{pol, ix.keys[p]}
				if prefix {
					id.Key += "*"
				}
				if u := ix.untilOf(p); u == gone {
					f(id, 0, nil)
				} else {
					f(id, u, &ix.vals[p/blockLen][p%blockLen])
				}
			})
		}
	}
}

func (ix *Index[T]) untilOf(p int32) int64 {
	if int(p) < len(ix.until) {
		return ix.until[p]
	}
	return 0
}

// Layer is how many entries lie over the base: the cost of the next With.
func (ix *Index[T]) Layer() int {
	if ix == nil || ix.under == nil {
		return 0
	}
	return ix.layer
}

// Flatten is ix as one base: its layer folded into a copy of its base. The keys are the
// ones ix holds, not copies.
func (ix *Index[T]) Flatten() *Index[T] {
	if ix == nil || ix.under == nil {
		return ix
	}
	b := NewBuilder[T]()
	b.SizeHint(ix.n)
	for _, src := range []*Index[T]{ix.under, ix} {
		src.each(func(id ID, until int64, v *T) {
			if v == nil {
				b.Remove(id)
			} else {
				b.set(id, until, v)
			}
		})
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

// Lookup is the override of policy (algorithm, name) that applies to key at now (Unix
// milliseconds, read only when an override has an end), nil for none: an expired override is
// skipped for the next in precedence, as if it had been removed. The value is the index's
// own, which nothing changes: the caller reads it, never writes it.
func (ix *Index[T]) Lookup(algorithm, name, key string, now func() int64) *T {
	if ix.Empty() {
		return nil
	}
	pol := Policy{algorithm, name}
	layer, base := ix, ix
	p := ix.policies[pol]
	var up *policyIndex
	if ix.under != nil {
		base = ix.under
		up = base.policies[pol]
	}
	if p == nil {
		if up == nil {
			return nil
		}
		p, up, layer = up, nil, base
	}
	var nowMs int64 // read once, when first needed
	// at is the value of place i of of, nil when it has ended or is removed
	at := func(of *Index[T], i int32) *T {
		if u := of.untilOf(i); u != 0 {
			if u == gone {
				return nil
			}
			if nowMs == 0 {
				nowMs = now()
			}
			if nowMs >= u {
				return nil
			}
		}
		return &of.vals[i/blockLen][i%blockLen]
	}
	// find is the value of k in the layer, else in the base
	find := func(k string, prefix bool) *T {
		if i := p.table(prefix).find(layer.keys, k); i >= 0 {
			return at(layer, i)
		}
		if up != nil {
			if i := up.table(prefix).find(base.keys, k); i >= 0 {
				return at(base, i)
			}
		}
		return nil
	}
	if v := find(key, false); v != nil {
		return v
	}
	for _, n := range p.lens {
		if n > len(key) {
			continue
		}
		if v := find(key[:n], true); v != nil {
			return v
		}
	}
	return nil
}

// table finds places by their keys: open addressing with linear probing over 4-byte slots,
// at most 3/4 full, so that a million keys cost about 8 bytes each, where a Go map of string
// to place costs about 56.
type table struct {
	slots []int32 // 1 + the place of a key, at its hash; 0 free; tomb a key removed
	n     int     // keys held
	used  int     // slots not free: keys and tombs
}

const tomb = -1

// seed is the tables' hash seed: one per process, as a Go map's, so that nobody outside can
// choose keys that collide.
var seed = maphash.MakeSeed()

func (t *table) init(hint int) {
	if hint > 0 {
		t.slots = make([]int32, slotsFor(hint))
	}
}

// slotsFor is the table size for n keys: a power of two at least n*4/3.
func slotsFor(n int) int {
	s := 8
	for s/4*3 < n+1 {
		s *= 2
	}
	return s
}

// find is the place of k, -1 for none; keys are the places' keys.
func (t *table) find(keys []string, k string) int32 {
	if t.n == 0 {
		return -1
	}
	mask := uint64(len(t.slots) - 1)
	for i := maphash.String(seed, k) & mask; ; i = (i + 1) & mask {
		switch s := t.slots[i]; {
		case s == 0:
			return -1
		case s > 0 && keys[s-1] == k:
			return s - 1
		}
	}
}

// insert adds k, which the table does not hold, at place p (keys[p] is k).
func (t *table) insert(keys []string, k string, p int32) {
	if (t.used+1)*4 > len(t.slots)*3 {
		t.grow(keys)
	}
	mask := uint64(len(t.slots) - 1)
	for i := maphash.String(seed, k) & mask; ; i = (i + 1) & mask {
		if s := t.slots[i]; s <= 0 {
			if s == 0 {
				t.used++
			}
			t.slots[i] = p + 1
			t.n++
			return
		}
	}
}

// grow makes room for more keys: twice the keys held (the tombs dropped), at least.
func (t *table) grow(keys []string) {
	old := t.slots
	t.slots = make([]int32, slotsFor(2*(t.n+1)))
	t.n, t.used = 0, 0
	for _, s := range old {
		if s > 0 {
			t.insert(keys, keys[s-1], s-1)
		}
	}
}

// remove removes k, and is its place (-1 for none).
func (t *table) remove(keys []string, k string) int32 {
	if t.n == 0 {
		return -1
	}
	mask := uint64(len(t.slots) - 1)
	for i := maphash.String(seed, k) & mask; ; i = (i + 1) & mask {
		switch s := t.slots[i]; {
		case s == 0:
			return -1
		case s > 0 && keys[s-1] == k:
			t.slots[i] = tomb
			t.n--
			return s - 1
		}
	}
}

// each calls f with the place of every key.
func (t *table) each(f func(p int32)) {
	for _, s := range t.slots {
		if s > 0 {
			f(s - 1)
		}
	}
}
