package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/rlfn/rlfn/internal/override"
)

// Override is an exception an operator set on the server (rlfn override set) that replaced
// the code's limit in a decision: Result.Override.
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

// The overrides' cache: how often a decision looks at the store's version (in this process's
// client-side cache: no server command), how long that cache may hold it without an
// invalidation, and how often a client without client-side caching reads the server instead.
const (
	overrideCheck = time.Millisecond
	overrideTTL   = time.Minute
	overridePoll  = time.Second
	// overrideRetry is how long a read that failed waits for the next: a server that is
	// gone is not asked a thousand times a second, and one whose connection dropped (and
	// whose invalidations were lost with it) is read again soon after it is back.
	overrideRetry = 100 * time.Millisecond
	// overrideVerify is how often a cached version is checked against the server's, with one
	// plain read: a lost invalidation (or a server that never tracked the read) then delays a
	// change by this long at most, rather than by overrideTTL.
	overrideVerify = 10 * time.Second
	// overrideMisses is how many reads of an unchanged version must go to the server in a
	// row (each a cache miss) before the Limiter takes its client for one without caching.
	overrideMisses = 10
)

// overrides is what Options.Overrides turns on: the store's overrides, compiled into an index
// that every decision reads, and kept current from the store's version key, read through
// valkey-go's client-side cache (DoCache): a read is a local lookup until the server
// invalidates the key, so that in steady state a decision sends nothing more to the server.
// Reads run in the background, one at a time, at most once per overrideCheck, started by a
// decision that finds one due: a decision never waits for the store, and an idle process
// reads nothing.
type overrides struct {
	vk      valkey.Client
	key     string // the store (override.Key)
	timeout time.Duration

	idx     atomic.Pointer[override.Index[*overridden]] // nil until the first load
	loaded  atomic.Pointer[string]                      // the version idx was made from
	due     atomic.Int64                                // when the next read may start (ns, clockBase)
	running atomic.Int64                                // when the read that runs began (ns, clockBase); 0: none
	gen     atomic.Int64                                // reads begun, numbered
	mu      sync.Mutex                                  // orders the reads' results:
	stored  int64                                       // the number of the read idx is from
	misses  atomic.Int32                                // reads of an unchanged version that missed the cache, in a row
	polling atomic.Bool                                 // the client does not cache: read every overridePoll
	// uncached is when the cached reads were last given up (ns, clockBase; 0: never): the
	// server refused their transaction overrideMisses times in a row (a user without MULTI,
	// EXEC, PTTL or CLIENT CACHING). For overrideTTL from then, the version is read with a
	// plain HGET, every overridePoll.
	uncached atomic.Int64
	aborted  atomic.Int32 // cached reads aborted in a row
	verified atomic.Int64 // when a cached version was last checked against the server's (ns, clockBase)

	m *overrideMetrics
}

// overridden is one override compiled: the limit as the client sends it, and what Result
// says of it.
type overridden struct {
	spec spec
	info *Override
}

func newOverrides(vk valkey.Client, prefix string, timeout time.Duration, mp metric.MeterProvider) (*overrides, error) {
	o := &overrides{vk: vk, timeout: timeout}
	o.verified.Store(int64(time.Since(clockBase))) // the first check, overrideVerify after the start
	o.key = override.Key(prefix)
	if mp != nil {
		m, err := newOverrideMetrics(mp)
		if err != nil {
			return nil, err
		}
		o.m = m
	}
	return o, nil
}

// override replaces c's limit with the override of its policy for key, if one applies (the
// call is made from the code's limit, which was validated). It also starts a read of the
// store when one is due.
func (l *Limiter) override(c *call, key string) {
	o := l.ovr
	if o == nil {
		return
	}
	if now := int64(time.Since(clockBase)); now >= o.due.Load() {
		o.start(now)
	}
	ix := o.idx.Load()
	if ix.Empty() {
		return
	}
	v, ok := ix.Lookup(c.alg.name, c.name, key, wallMs)
	if !ok {
		return
	}
	id, label := c.params.id, c.params.label // a lease's holder and the call's name are the call's, not the override's
	c.spec = v.spec
	c.params.id, c.params.label = id, label
	c.override = v.info
}

func wallMs() int64 { return time.Now().UnixMilli() }

// start begins a background read of the store, unless one runs. A read that has run past its
// timeout no longer counts: valkey-go may hold a command for longer on a connection that
// dropped (its retries), and the overrides must be read again on the next one meanwhile.
func (o *overrides) start(now int64) {
	r := o.running.Load()
	if r != 0 && now-r < int64(o.timeout) || !o.running.CompareAndSwap(r, now) {
		return
	}
	every := overrideCheck
	if o.polling.Load() {
		every = overridePoll
	}
	o.due.Store(now + int64(every))
	go func() {
		defer o.running.CompareAndSwap(now, 0)
		ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
		defer cancel()
		u := o.uncached.Load()
		if err := o.refresh(ctx, u != 0 && now-u < int64(overrideTTL)); err != nil {
			// the last overrides seen stay in force until a read succeeds
			o.due.Store(int64(time.Since(clockBase)) + int64(overrideRetry))
		}
	}()
}

// refresh reads the store's version (from the client-side cache unless invalidated, or from
// the server when fresh) and, when it is not the one the index was made from, the whole store,
// and compiles it. An error leaves the index as it was, and is counted.
func (o *overrides) refresh(ctx context.Context, fresh bool) error {
	gen := o.gen.Add(1)
	// a builder makes one command: get makes one for each read
	get := func() valkey.Completed { return o.vk.B().Hget().Key(o.key).Field(override.VersionField).Build() }
	var r valkey.ValkeyResult
	if fresh {
		r = o.vk.Do(ctx, get())
	} else {
		r = o.vk.DoCache(ctx, o.vk.B().Hget().Key(o.key).Field(override.VersionField).Cache(), overrideTTL)
	}
	v, err := r.ToString()
	if valkey.IsValkeyNil(err) {
		v, err = "", nil
	}
	if err != nil {
		o.m.failed(ctx, classify(ctx, err))
		if !fresh && errors.Is(err, valkey.ErrDoCacheAborted) && o.aborted.Add(1) >= overrideMisses {
			// The cached read's transaction is refused again and again (a user without
			// MULTI, EXEC, PTTL or CLIENT CACHING; a connection that drops once aborts one
			// too): read without the cache, once a second, rather than never, and try the
			// cache again after overrideTTL.
			o.uncached.Store(time.Since(clockBase).Nanoseconds())
			o.polling.Store(true)
			return o.refresh(ctx, true)
		}
		return err
	}
	if !fresh {
		o.aborted.Store(0)
	}
	hit := !fresh && r.IsCacheHit()
	if hit {
		o.misses.Store(0)
		o.polling.Store(false)
		if now := int64(time.Since(clockBase)); now-o.verified.Load() >= int64(overrideVerify) {
			o.verified.Store(now)
			fv, ferr := o.vk.Do(ctx, get()).ToString()
			if valkey.IsValkeyNil(ferr) {
				fv, ferr = "", nil
			}
			if ferr == nil && versionNumber(fv) > versionNumber(v) {
				// The cache missed a change: the server never told this connection (a
				// user without CLIENT CACHING reads untracked; an invalidation lost some
				// other way). Read without the cache for a while, and load the change now.
				o.uncached.Store(now)
				o.polling.Store(true)
				v, hit = fv, false
			}
		}
	}
	if last := o.loaded.Load(); last != nil {
		switch {
		case v == *last:
			if !hit && !fresh && o.misses.Add(1) >= overrideMisses {
				// An unchanged version read from the server again and again: this client
				// caches nothing (ClientOption.DisableCache), and a read per millisecond
				// would be a server command per millisecond. Poll once a second instead.
				o.polling.Store(true)
			}
			return nil
		case hit && versionNumber(v) < versionNumber(*last):
			// the cache still holds a version older than one read from the server since:
			// its invalidation is on its way
			return nil
		}
	}
	snap, err := override.ParseSnapshot(o.vk.Do(ctx, o.vk.B().Hgetall().Key(o.key).Build()))
	if err != nil {
		o.m.failed(ctx, classify(ctx, err))
		return err
	}
	all := make([]override.Compiled[*overridden], 0, len(snap.Overrides))
	for _, ov := range snap.Overrides {
		c, err := compileOverride(ov)
		if err != nil {
			// written by hand, or by a later release: the code's limit stands for it
			o.m.invalid(ctx)
			continue
		}
		all = append(all, override.Compiled[*overridden]{ID: ov.ID(), Until: ov.Until, V: c})
	}
	for range snap.Bad {
		o.m.invalid(ctx)
	}
	ix := override.NewIndex(all)
	o.mu.Lock()
	defer o.mu.Unlock()
	if gen < o.stored {
		return nil // a read begun later has stored what it read
	}
	o.stored = gen
	o.idx.Store(ix)
	o.loaded.Store(&snap.Version)
	o.m.load(ctx)
	return nil
}

// versionNumber is a store's version as a number ("" is 0; what is not a number, too).
func versionNumber(v string) int64 {
	n, _ := strconv.ParseInt(v, 10, 64)
	return n
}

// compileOverride makes the limit an override sets, validated as the code's limits are.
func compileOverride(o override.Override) (*overridden, error) {
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
		return &overridden{spec: c.spec(""), info: info}, nil
	default:
		return nil, fmt.Errorf("unknown algorithm %q", o.Algorithm)
	}
	if err := info.Limit.Validate(); err != nil {
		return nil, err
	}
	s = info.Limit.spec()
	return &overridden{spec: s, info: info}, nil
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
	return o.refresh(ctx, true)
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
	if v := l.ovr.loaded.Load(); v != nil {
		return *v
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
