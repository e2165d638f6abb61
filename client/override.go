package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/rlfn/rlfn/internal/override"
)

// Override is an exception an operator set on the server (rlfn override set) that replaced
// the code's limit in a decision: Result.Override. It points at the Limiter's own copy, which
// every decision under that override shares: read it, never change it.
type Override struct {
	// Key is the override's key as set: the principal ("user:42"), or the pattern that
	// matched it ("user:*"; "*" matches every key).
	Key string
	// Limit is the limit enforced instead of the code's, with the code's Name; nil for a
	// Concurrency override (Slots then holds its Limit).
	Limit Limit
	// Slots is a Concurrency override's Limit; 0 for every other limit.
	Slots int64
	// Until is when the override ends, zero for none.
	Until time.Time
	// Note is the operator's note (a ticket, a reason).
	Note string
}

// The overrides' reads: how often the background reader looks at the store's version (in this
// process's client-side cache: no server command), how long that cache may hold it without an
// invalidation, and how often a client without client-side caching reads the server instead.
const (
	overrideCheck = 2 * time.Millisecond
	overrideTTL   = time.Minute
	overridePoll  = time.Second
	// overrideRetry is how long a read that failed waits for the next, doubled up to
	// overrideBackoff after each failure in a row: a server that is gone is not asked a
	// thousand times a second, and one whose connection dropped (and whose invalidations were
	// lost with it) is read again soon after it is back.
	overrideRetry   = 50 * time.Millisecond
	overrideBackoff = 2 * time.Second
	// overrideVerify is how often a cached version is checked against the server's, with one
	// plain read: a lost invalidation (or a server that never tracked the read) then delays a
	// change by this long at most, rather than by overrideTTL.
	overrideVerify = 10 * time.Second
	// overrideMisses is how many reads of an unchanged version must go to the server in a
	// row (each a cache miss) before the Limiter takes its client for one without caching.
	overrideMisses = 10
	// overrideLoadTimeout bounds a whole load by pages (each page is small; a million
	// overrides are a few thousand of them); the reads of the version and of the log have
	// the Limiter's Deadline, at least overrideReadTimeout.
	overrideLoadTimeout = 2 * time.Minute
	overrideReadTimeout = time.Second
	// overrideLayer is how many overrides changed since the last load a Limiter keeps in a
	// layer over its index before it folds them in (each change copies the layer).
	overrideLayer = 4096
)

// overrides is what Options.Overrides turns on: the store's overrides, compiled into an index
// that every decision reads, and kept current by a reader of its own in the background. It
// looks at the store's version every overrideCheck through valkey-go's client-side cache
// (DoCache): a local lookup until the server invalidates the key, so that an idle process is
// as current as a busy one and a decision sends nothing to the server for the overrides. On a
// change it reads the store's log from its version and applies the delta; it reloads the whole
// store by pages only when the log cannot lead it there (a new base, or a log trimmed past its
// version), while the overrides it has stay in force. A decision never waits for the store.
type overrides struct {
	vk      valkey.Client
	store   *override.Store
	head    string // the store's head (override.HeadKey)
	timeout time.Duration

	idx    atomic.Pointer[override.Index[overridden]] // nil until the first load
	loaded atomic.Pointer[override.Head]              // the head idx was made from
	mu     sync.Mutex                                 // one read of the store at a time; guards:
	shared map[sharedKey]*sharedLimit                 // compiled limits, one per distinct limit
	notes  map[string]string                          // notes, one copy of each
	seen   map[string]*seenValue                      // values decoded, less their key (put)
	buf    []byte                                     // put's value less its key

	misses  int  // reads of an unchanged version that missed the cache, in a row
	polling bool // the client does not cache: read every overridePoll
	// uncached is when the cached reads were last given up (zero: never): the server refused
	// their transaction overrideMisses times in a row (a user without MULTI, EXEC, PTTL or
	// CLIENT CACHING), or a change did not reach the cache. For overrideTTL from then, the
	// version is read with a plain HGET, every overridePoll.
	uncached time.Time
	aborted  int       // cached reads aborted in a row
	verified time.Time // when a cached version was last checked against the server's

	// ctx is the background reader's: cancelled by Limiter.Close (or, for a Limiter never
	// closed, once it is unreachable), which cuts a load short too; done is closed when the
	// reader has returned.
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	m      *overrideMetrics
}

// overridden is one override compiled: what Result says of it, and the limit as the client
// sends it (shared by every override of the same limit). The index holds it by value, in
// blocks (override.Index): a million of them are not a million objects, and Result.Override
// points at the index's own.
type overridden struct {
	info   Override
	shared *sharedLimit
}

// sharedLimit is one distinct limit of the overrides, compiled once however many overrides
// set it: a store of a million customers holds a handful of distinct limits.
type sharedLimit struct {
	spec  spec
	limit Limit
	slots int64
	err   error
}

type sharedKey struct {
	policy override.Policy
	fields override.Fields
}

func newOverrides(vk valkey.Client, prefix string, timeout time.Duration, mp metric.MeterProvider) (*overrides, error) {
	o := &overrides{vk: vk, timeout: max(timeout, overrideReadTimeout), store: override.NewStore(vk, prefix),
		head: override.HeadKey(prefix), done: make(chan struct{}), verified: time.Now()}
	o.ctx, o.cancel = context.WithCancel(context.Background())
	if mp != nil {
		m, err := newOverrideMetrics(mp)
		if err != nil {
			return nil, err
		}
		o.m = m
	}
	go o.run()
	return o, nil
}

// watchOverrides ties the background reader's life to the Limiter's: Close stops it, and so
// does the Limiter becoming unreachable unclosed (the reader holds the overrides, never the
// Limiter).
func (l *Limiter) watchOverrides() {
	if l.ovr != nil {
		runtime.AddCleanup(l, func(cancel context.CancelFunc) { cancel() }, l.ovr.cancel)
	}
}

// close stops the background reader, a read under way included, and waits until it has
// returned or ctx is done. The index stays in force: a decision after Close still obeys the
// overrides last read.
func (o *overrides) close(ctx context.Context) {
	o.cancel()
	select {
	case <-o.done:
	case <-ctx.Done():
	}
}

// run reads the store in the background until stopped: every overrideCheck (the version from
// the local cache), or every overridePoll without a cache; after a failure, later and later
// (overrideRetry doubled up to overrideBackoff), never in a tight loop.
func (o *overrides) run() {
	defer close(o.done)
	t := time.NewTimer(0)
	defer t.Stop()
	backoff := time.Duration(0)
	for {
		select {
		case <-o.ctx.Done():
			return
		case <-t.C:
		}
		err := o.refresh(o.ctx, false, false)
		switch {
		case err != nil:
			backoff = min(max(2*backoff, overrideRetry), overrideBackoff)
			t.Reset(backoff)
		case o.isPolling():
			backoff = 0
			t.Reset(overridePoll)
		default:
			backoff = 0
			t.Reset(overrideCheck)
		}
	}
}

func (o *overrides) isPolling() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.polling
}

// override replaces c's limit with the override of its policy for key, if one applies (the
// call is made from the code's limit, which was validated).
func (l *Limiter) override(c *call, key string) {
	o := l.ovr
	if o == nil {
		return
	}
	ix := o.idx.Load()
	if ix.Empty() {
		return
	}
	v := ix.Lookup(c.alg.name, c.name, key, wallMs)
	if v == nil {
		return
	}
	id, label := c.params.id, c.params.label // a lease's holder and the call's name are the call's, not the override's
	c.spec = v.shared.spec
	c.params.id, c.params.label = id, label
	c.override = &v.info
}

func wallMs() int64 { return time.Now().UnixMilli() }

// refresh reads the store's version (from the client-side cache unless invalidated, or from
// the server when fresh) and, when it is not the one the index was made from, the changes
// since (the log), or the whole store by pages. An error leaves the index as it was, and is
// counted.
func (o *overrides) refresh(ctx context.Context, fresh, syncing bool) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.uncached.IsZero() && time.Since(o.uncached) < overrideTTL {
		fresh = true
	}
	// the background reader's reads have deadlines of their own; SyncOverrides' have its
	// caller's ctx alone
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if !syncing {
		rctx, cancel = context.WithTimeout(ctx, o.timeout)
	}
	defer cancel()
	get := func() valkey.Completed { return o.vk.B().Hget().Key(o.head).Field(override.VersionField).Build() }
	var r valkey.ValkeyResult
	if fresh {
		r = o.vk.Do(rctx, get())
	} else {
		r = o.vk.DoCache(rctx, o.vk.B().Hget().Key(o.head).Field(override.VersionField).Cache(), overrideTTL)
	}
	v, err := r.ToString()
	if valkey.IsValkeyNil(err) {
		v, err = "", nil
	}
	if err != nil {
		o.m.failed(ctx, classify(rctx, err))
		if !fresh && errors.Is(err, valkey.ErrDoCacheAborted) {
			if o.aborted++; o.aborted >= overrideMisses {
				// The cached read's transaction is refused again and again (a user without
				// MULTI, EXEC, PTTL or CLIENT CACHING; a connection that drops once aborts one
				// too): read without the cache, once a second, rather than never, and try the
				// cache again after overrideTTL.
				o.uncached, o.polling = time.Now(), true
				return nil
			}
		}
		return err
	}
	if !fresh {
		o.aborted = 0
	}
	hit := !fresh && r.IsCacheHit()
	if hit {
		o.misses, o.polling = 0, false
		if time.Since(o.verified) >= overrideVerify {
			o.verified = time.Now()
			fv, ferr := o.vk.Do(rctx, get()).ToString()
			if valkey.IsValkeyNil(ferr) {
				fv, ferr = "", nil
			}
			if ferr == nil && override.VersionNumber(fv) > override.VersionNumber(v) {
				// The cache missed a change: the server never told this connection (a
				// user without CLIENT CACHING reads untracked; an invalidation lost some
				// other way). Read without the cache for a while, and load the change now.
				o.uncached, o.polling = time.Now(), true
				v, hit = fv, false
			}
		}
	}
	last := o.loaded.Load()
	if last != nil {
		switch {
		case v == last.Version:
			if !hit && !fresh {
				if o.misses++; o.misses >= overrideMisses {
					// An unchanged version read from the server again and again: this
					// client caches nothing (ClientOption.DisableCache), and a read every
					// overrideCheck would be a server command each. Poll once a second.
					o.polling = true
				}
			}
			return nil
		case hit && override.VersionNumber(v) < override.VersionNumber(last.Version):
			// the cache still holds a version older than one read from the server since:
			// its invalidation is on its way
			return nil
		}
		if ok, err := o.follow(rctx, *last); err != nil || ok {
			return err
		}
	}
	lctx, lcancel := ctx, context.CancelFunc(func() {})
	if !syncing {
		lctx, lcancel = context.WithTimeout(ctx, overrideLoadTimeout)
	}
	defer lcancel()
	return o.load(lctx)
}

// follow applies the changes since last, read from the store's log, to the index. ok is false
// when the log cannot lead there: the caller loads the whole store.
func (o *overrides) follow(ctx context.Context, last override.Head) (bool, error) {
	type change struct{ field, value string }
	var changes []change
	h, ok, err := o.store.Follow(ctx, last, func(f, v string) { changes = append(changes, change{f, v}) })
	if err != nil {
		o.m.failed(ctx, classify(ctx, err))
		return false, err
	}
	if !ok {
		return false, nil
	}
	if len(changes) > 0 {
		ix := o.idx.Load().With(func(b *override.Builder[overridden]) {
			for _, c := range changes {
				o.put(ctx, b, c.field, c.value)
			}
		})
		if ix.Layer() > overrideLayer {
			ix = ix.Flatten()
		}
		o.idx.Store(ix)
	}
	o.loaded.Store(&h)
	o.m.load(ctx)
	return true, nil
}

// load reads the whole store by pages and compiles it into a new index, which replaces the
// one in force only once complete.
func (o *overrides) load(ctx context.Context) error {
	var b *override.Builder[overridden]
	h, err := o.store.Load(ctx, func(h override.Head) {
		b = override.NewBuilder[overridden]()
		b.SizeHint(h.Count)
	}, func(f, v string) { o.put(ctx, b, f, v) })
	if err != nil {
		o.m.failed(ctx, classify(ctx, err))
		return err
	}
	o.idx.Store(b.Index())
	o.loaded.Store(&h)
	o.m.load(ctx)
	return nil
}

// put sets (or, for a value "", removes) the override a field of the store holds. One that
// does not compile is ignored: the code's limit stands for it.
//
// A store of a million overrides holds a handful of distinct limits, ends and notes: an
// override whose value, less its key, is one already decoded is made from that one, without
// decoding its JSON again (a load is then a few hundred nanoseconds an override).
func (o *overrides) put(ctx context.Context, b *override.Builder[overridden], field, value string) {
	if value == "" {
		var id []string
		if json.Unmarshal([]byte(field), &id) == nil && len(id) == 3 {
			b.Remove(override.ID{Policy: override.Policy{Algorithm: id[0], Name: id[1]}, Key: id[2]})
		}
		return
	}
	id, plain := plainID(field)
	if plain {
		// the value less its key, in a buffer reused from one override to the next: the
		// lookup (string(o.buf)) allocates nothing; only a value seen first is copied
		o.buf, plain = appendWithoutKey(o.buf[:0], value, id.Key)
		if t := o.seen[string(o.buf)]; plain && t != nil && t.info.Key == "" && t.policy == id.Policy {
			id.Key = b.Key(id.Key) // not a slice of the whole field, nor an allocation of its own
			v := overridden{info: t.info, shared: t.shared}
			v.info.Key = id.Key
			b.Set(id, v.info.Until, v)
			return
		}
	}
	ov, err := override.DecodeField(field, value)
	if err != nil {
		o.m.invalid(ctx)
		return
	}
	c, err := o.compile(ov)
	if err != nil {
		// written by hand, or by a later release: the code's limit stands for it
		o.m.invalid(ctx)
		// and an earlier value of the same override no longer applies
		b.Remove(ov.ID())
		return
	}
	if plain && len(o.seen) < 1<<16 {
		t := &seenValue{policy: ov.Policy, info: c.info, shared: c.shared}
		t.info.Key = ""
		o.seen[string(o.buf)] = t
	}
	c.info.Key = b.Key(c.info.Key)
	b.Set(override.ID{Policy: ov.Policy, Key: c.info.Key}, ov.Until, c)
}

// seenValue is an override's value decoded, less its key: for put to make others of it.
type seenValue struct {
	policy override.Policy
	info   Override
	shared *sharedLimit
}

// plainID reads a field of the store, ["algorithm","name","key"], when none of its strings
// holds an escape (else ok is false, and the caller decodes it as JSON).
func plainID(field string) (id override.ID, ok bool) {
	if !strings.HasPrefix(field, `["`) || !strings.HasSuffix(field, `"]`) || strings.IndexByte(field, '\\') >= 0 {
		return id, false
	}
	body := field[2 : len(field)-2]
	alg, rest, ok1 := strings.Cut(body, `","`)
	name, key, ok2 := strings.Cut(rest, `","`)
	if !ok1 || !ok2 || strings.Contains(key, `"`) {
		return id, false
	}
	return override.ID{Policy: override.Policy{Algorithm: alg, Name: name}, Key: key}, true
}

// appendWithoutKey appends to buf an override's JSON less its "key" member (and the comma
// after it), when that is key written plain. A JSON string never holds a bare quote, so the
// first "key":" is the member's.
func appendWithoutKey(buf []byte, value, key string) ([]byte, bool) {
	const member = `"key":"`
	i := strings.Index(value, member)
	if i < 0 {
		return buf, false
	}
	j := i + len(member)
	if !strings.HasPrefix(value[j:], key) || !strings.HasPrefix(value[j+len(key):], `",`) {
		return buf, false
	}
	return append(append(buf, value[:i]...), value[j+len(key)+2:]...), true
}

// compile is an override compiled, its limit shared with every other override of the same
// limit, its note with every other of the same note.
func (o *overrides) compile(ov override.Override) (overridden, error) {
	if o.shared == nil {
		o.shared, o.notes, o.seen = map[sharedKey]*sharedLimit{}, map[string]string{}, map[string]*seenValue{}
	}
	k := sharedKey{ov.Policy, ov.Limit}
	sh := o.shared[k]
	if sh == nil {
		sh = &sharedLimit{}
		c, err := compileOverride(ov)
		if err != nil {
			sh.err = err
		} else {
			sh.spec, sh.limit, sh.slots = c.spec, c.info.Limit, c.info.Slots
		}
		if len(o.shared) < 1<<16 { // a store of distinct limits each is not held forever
			o.shared[k] = sh
		}
	}
	if sh.err != nil {
		return overridden{}, sh.err
	}
	note, ok := o.notes[ov.Note]
	if !ok {
		note = ov.Note
		if len(o.notes) < 1<<16 {
			o.notes[note] = note
		}
	}
	return overridden{info: Override{Key: ov.Key, Limit: sh.limit, Slots: sh.slots, Until: ov.Until, Note: note}, shared: sh}, nil
}

// compiled is an override's limit as the client sends it, and what Result says of it.
type compiled struct {
	spec spec
	info *Override
}

// compileOverride makes the limit an override sets, validated as the code's limits are.
func compileOverride(o override.Override) (*compiled, error) {
	info := &Override{Key: o.Key, Until: o.Until, Note: o.Note}
	f, err := o.Limit.Values(o.Algorithm)
	if err != nil {
		return nil, err
	}
	var s spec
	switch o.Algorithm {
	case fixedWindowAlg.name:
		info.Limit = FixedWindow{Limit: f.Limit, Window: f.Window, Reserve: f.Reserve, Name: o.Name, Penalty: f.Penalty}
	case slidingLogAlg.name:
		info.Limit = SlidingLog{Limit: f.Limit, Window: f.Window, Reserve: f.Reserve, Name: o.Name, Penalty: f.Penalty}
	case slidingWindowAlg.name:
		info.Limit = SlidingWindow{Limit: f.Limit, Window: f.Window, Reserve: f.Reserve, Name: o.Name, Penalty: f.Penalty}
	case tokenBucketAlg.name:
		info.Limit = TokenBucket{Capacity: f.Capacity, Rate: f.Rate, Period: f.Period, Reserve: f.Reserve, Name: o.Name, Penalty: f.Penalty}
	case leakyBucketAlg.name:
		mode := Police
		if f.Shape {
			mode = Shape
		}
		info.Limit = LeakyBucket{Capacity: f.Capacity, Rate: f.Rate, Period: f.Period, Mode: mode, Reserve: f.Reserve, Name: o.Name, Penalty: f.Penalty}
	case calendarAlg.name:
		info.Limit = Calendar{Limit: f.Limit, Period: Period(f.Calendar), Anchor: f.Anchor, Reserve: f.Reserve, Name: o.Name, Penalty: f.Penalty}
	case concurrencyAlg.name:
		c := Concurrency{Limit: f.Limit, Lease: f.Lease, Reserve: f.Reserve, Name: o.Name}
		if err := c.Validate(); err != nil {
			return nil, err
		}
		info.Slots = c.Limit
		return &compiled{spec: c.spec(""), info: info}, nil
	default:
		return nil, fmt.Errorf("unknown algorithm %q", o.Algorithm)
	}
	if err := info.Limit.Validate(); err != nil {
		return nil, err
	}
	s = info.Limit.spec()
	return &compiled{spec: s, info: info}, nil
}

// SyncOverrides reads the overrides from the server now, and waits for them (Options.Overrides):
// for a service's start-up, so that its first decisions already obey them, and for tests.
// Decisions never wait for the store: they keep the last overrides read (none before the
// first read) and read it again in the background. It returns ErrNoOverrides without
// Options.Overrides, and the server's error when the store cannot be read.
func (l *Limiter) SyncOverrides(ctx context.Context) error {
	o := l.ovr
	if o == nil {
		return ErrNoOverrides
	}
	return o.refresh(ctx, true, true)
}

// ErrNoOverrides is SyncOverrides' error on a Limiter without Options.Overrides.
var ErrNoOverrides = errors.New("client: overrides are off (Options.Overrides)")

// overrideMetrics are the overrides' instruments: loads of a new version, and reads that
// failed (the last overrides read stay in force meanwhile) or overrides that did not compile.
type overrideMetrics struct {
	loads, errors metric.Int64Counter
	kindOpts      [nKinds][]metric.AddOption
	invalidOpts   []metric.AddOption
}

const (
	metricOverrideLoads  = "rlfn.client.overrides.loads"
	metricOverrideErrors = "rlfn.client.overrides.errors"
)

func newOverrideMetrics(mp metric.MeterProvider) (*overrideMetrics, error) {
	meter := mp.Meter("github.com/rlfn/rlfn/client")
	m := &overrideMetrics{}
	var err error
	if m.loads, err = meter.Int64Counter(metricOverrideLoads,
		metric.WithDescription("Versions of the overrides read from the server and compiled")); err != nil {
		return nil, err
	}
	if m.errors, err = meter.Int64Counter(metricOverrideErrors,
		metric.WithDescription("Reads of the overrides that failed (the last ones read stay in force), and overrides that do not compile (the code's limit stands)")); err != nil {
		return nil, err
	}
	for k := range m.kindOpts {
		m.kindOpts[k] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("error.type", kindNames[k])))}
	}
	m.invalidOpts = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("error.type", "invalid_override")))}
	return m, nil
}

func (m *overrideMetrics) load(ctx context.Context) {
	if m != nil {
		m.loads.Add(ctx, 1)
	}
}

func (m *overrideMetrics) failed(ctx context.Context, k errKind) {
	if m != nil {
		m.errors.Add(ctx, 1, m.kindOpts[k]...)
	}
}

func (m *overrideMetrics) invalid(ctx context.Context) {
	if m != nil {
		m.errors.Add(ctx, 1, m.invalidOpts...)
	}
}

// OverridesVersion is the version of the store's overrides this Limiter decides with ("" when
// it has read none, or the store is empty and never changed), for tests and diagnostics.
func (l *Limiter) OverridesVersion() string {
	if l.ovr == nil {
		return ""
	}
	if h := l.ovr.loaded.Load(); h != nil {
		return h.Version
	}
	return ""
}

// setOverrides sets the Override of an AllowAll's binding Result, and of each rule's, from
// the calls that decided them.
func setOverrides(groups []group, res *Result, each []Result) {
	for i := range groups {
		g := &groups[i]
		for j, c := range g.calls {
			if c.override == nil {
				continue
			}
			if g.rules[j] == res.Rule && (g.decided || g.peeked) {
				res.Override = c.override
			}
			if each != nil {
				each[g.rules[j]].Override = c.override
			}
		}
	}
}
