package override

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/valkey-io/valkey-go"
	"golang.org/x/sync/errgroup"

	"github.com/rlfn/rlfn/internal/keys"
)

// The store of the overrides of the Limiters under a prefix is a handful of keys, so that no
// command on the way of a read or a write holds a node for more than about a millisecond at
// any size, and a change reaches a process as a delta, not as the whole store:
//
//	<prefix>{%overrides}:head         hash: version (a counter every change increments),
//	                                  gen (the base's generation), shards (how many hashes)
//	<prefix>{%overrides:<gen>:<i>}    the base: the overrides as of the last whole write,
//	                                  spread over shards hashes by a hash of their field; never
//	                                  changed once head names it
//	<prefix>{%overrides}:delta        hash: every override changed since the base, its value
//	                                  "" once removed
//	<prefix>{%overrides}:log          stream: one entry per version since the base (the last
//	                                  LogLen), id <version>-1, its fields the changed fields
//	                                  and their values; a new base logs the field "*"
//
// A small change (at most MaxDelta overrides, the delta under DeltaCap) is one MULTI in the
// slot of {%overrides}: the delta, the version and the log at once. A larger one writes a new
// base under a generation of its own, by batches, then flips head to it in one MULTI that runs
// only if the version is still the one planned from; until then no reader sees any of it. A
// process keeps the version in its client-side cache (head is tiny, the server invalidates
// it), reads the log from its version on a change, and reloads by pages (HSCAN) only when
// the base changed or the log no longer reaches back to its version.
//
// The base's hashes hash to different cluster slots ({%overrides:<gen>:<i>}), so the loads of
// many processes spread over the nodes; head, delta and log share one slot, which every
// process reads from its cache, or once per change.
//
// None of these keys can be a limiter's: a limiter's principal is escaped between the braces,
// where a '%' is only ever followed by two hex digits or by the closing brace.
func Key(prefix string) string {
	return string(keys.AppendEscaped(nil, prefix)) + "{%overrides}"
}

// HeadKey, DeltaKey and LogKey are the store's keys in the slot of {%overrides}.
func HeadKey(prefix string) string  { return Key(prefix) + ":head" }
func DeltaKey(prefix string) string { return Key(prefix) + ":delta" }
func LogKey(prefix string) string   { return Key(prefix) + ":log" }

// ShardKey is the base's hash i of generation gen.
func ShardKey(prefix, gen string, i int) string {
	return string(keys.AppendEscaped(nil, prefix)) + "{%overrides:" + gen + ":" + strconv.Itoa(i) + "}"
}

// The store's bounds.
const (
	// MaxDelta is the most overrides a change writes into the delta, in one MULTI; a larger
	// change writes a new base.
	MaxDelta = 200
	// MaxDeltaBytes bounds the same change by its size (fields and values): the delta's HSET
	// and the log's XADD each copy it, and a log entry is held until about LogLen versions
	// later. Overrides of ~150 bytes reach MaxDelta first.
	MaxDeltaBytes = 64 << 10
	// PageBytes bounds a batch of a new base's write by its size as Page does by its count:
	// an HSET of long keys or notes still copies no more than this (one override larger than
	// it is a batch of its own).
	PageBytes = 64 << 10
	// DeltaCap is the most overrides the delta holds; a change that would pass it writes a
	// new base with the delta folded in.
	DeltaCap = 20_000
	// LogLen is about how many versions the log keeps: a process further behind reloads.
	LogLen = 1000
	// Page is how many fields one HSCAN or one HSET of a batch carries: well under a
	// millisecond of a node's time for overrides of ~150 bytes, even on a busy node.
	Page = 100
	// shardSize is about how many overrides one hash of the base holds.
	shardSize = 32_768
	// minShards spreads even a small base over the slots of a cluster.
	minShards = 16
)

// Head fields.
const (
	VersionField = "version"
	genField     = "gen"
	shardsField  = "shards"
	countField   = "count" // how many overrides the base holds: a reader sizes its index by it
	// reloadField is the log's field that says "a new base": a reader reloads.
	reloadField = "*"
)

// FieldOf is the field of the override with id: a JSON array, so that no key or name,
// whatever it holds, makes two IDs one field.
func FieldOf(id ID) string {
	b, _ := json.Marshal([]string{id.Algorithm, id.Name, id.Key})
	return string(b)
}

// ShardOf is the base hash of field, of shards.
func ShardOf(field string, shards int) int {
	h := fnv.New32a()
	h.Write([]byte(field))
	return int(h.Sum32() % uint32(shards))
}

// Decode reads one override as the store holds it.
func Decode(value string) (Override, error) {
	var o Override
	if err := json.Unmarshal([]byte(value), &o); err != nil {
		return Override{}, err
	}
	if o.Algorithm == "" || o.Key == "" {
		return Override{}, errors.New("no algorithm or key")
	}
	return o, nil
}

// DecodeField reads one override and checks that it is the one its field names.
func DecodeField(field, value string) (Override, error) {
	o, err := Decode(value)
	if err == nil && FieldOf(o.ID()) != field {
		err = fmt.Errorf("its value is %s's", o.ID())
	}
	return o, err
}

// Encode is o as the store holds it.
func Encode(o Override) string {
	b, _ := json.Marshal(o)
	return string(b)
}

// Head is the store's head: its version, and the base it is made of.
type Head struct {
	Version string // "" before the first change
	Gen     string // "" before the first base: no base
	Shards  int
	Count   int // the overrides of the base
}

// ParseHead reads a head from HGETALL's reply.
func ParseHead(r valkey.ValkeyResult) (Head, error) {
	m, err := r.AsStrMap()
	if err != nil && !valkey.IsValkeyNil(err) {
		return Head{}, err
	}
	h := Head{Version: m[VersionField], Gen: m[genField]}
	h.Shards, _ = strconv.Atoi(m[shardsField])
	h.Count, _ = strconv.Atoi(m[countField])
	if h.Gen != "" && h.Shards <= 0 {
		return Head{}, fmt.Errorf("the store's head names base %q without its shards", h.Gen)
	}
	return h, nil
}

// VersionNumber is a version as a number ("" is 0).
func VersionNumber(v string) int64 {
	n, _ := strconv.ParseInt(v, 10, 64)
	return n
}

// Snapshot is what the store held when read.
type Snapshot struct {
	// Version is the counter of changes, "" before the first.
	Version string
	// Overrides are the overrides it holds, in ID order, expired ones included (a client
	// skips them; rlfn lists them until removed).
	Overrides []Override
	// Bad are the fields whose value does not decode (written by hand, or by a later
	// release): a client ignores them, rlfn reports them and removes them.
	Bad []BadField
}

// BadField is a field of the store that holds no override.
type BadField struct {
	Field string
	Err   error
}

// Store reads and changes the overrides on a server or cluster: the one type of this package
// that touches the network.
type Store struct {
	vk     valkey.Client
	prefix string
	head   string
	delta  string
	log    string
	// Progress, if set, is told how far a long read or write is: a phase ("read", "write")
	// and the overrides done of total (total 0: unknown).
	Progress func(phase string, done, total int)
}

// NewStore is the store of the Limiters under prefix, through vk.
func NewStore(vk valkey.Client, prefix string) *Store {
	return &Store{vk: vk, prefix: prefix, head: HeadKey(prefix), delta: DeltaKey(prefix), log: LogKey(prefix)}
}

func (s *Store) progress(phase string, done, total int) {
	if s.Progress != nil {
		s.Progress(phase, done, total)
	}
}

// ReadHead reads the head, from the server.
func (s *Store) ReadHead(ctx context.Context) (Head, error) {
	return ParseHead(s.vk.Do(ctx, s.vk.B().Hgetall().Key(s.head).Build()))
}

// ErrOldLayout is the error of a store that only holds the overrides of an earlier release
// (one hash, <prefix>{%overrides}): rlfn override migrate carries them over.
var ErrOldLayout = errors.New("the overrides are in the layout of an earlier release (one hash): run rlfn override migrate")

// Entries are a store's fields as read: an override's JSON, or "" once removed.
type Entries = func(field, value string)

// Load pages through the whole store at one version, calling each for every field of the base
// and then of the delta (a later call for a field replaces an earlier one; a value "" removes
// it), and returns the head it read. No command reads more than Page fields. A change made
// while it reads is read from the log, so that what each received is the store at the
// returned version; when the base changed meanwhile, or the log no longer reaches back, it
// starts again (reset is called first, each time).
func (s *Store) Load(ctx context.Context, reset func(h Head), each Entries) (Head, error) {
	for attempt := 0; ; attempt++ {
		if attempt == 5 {
			return Head{}, errors.New("the overrides changed under every one of 5 reads: try again")
		}
		h, err := s.ReadHead(ctx)
		if err != nil {
			return Head{}, err
		}
		if h.Version == "" {
			if old, err := s.vk.Do(ctx, s.vk.B().Exists().Key(Key(s.prefix)).Build()).AsInt64(); err == nil && old > 0 {
				return Head{}, ErrOldLayout
			}
		}
		reset(h)
		done := 0
		if h.Gen != "" {
			// the base's hashes are read side by side (their pages pipelined on the
			// connections, spread over the cluster's nodes); each page is handed to each
			// under one lock, in no particular order: the base holds every field once.
			// Eight at a time hide the round trips; more only queue on the lock and hold
			// more pages at once (BenchmarkOverrideLoad: 16 or 64 were slower, not faster)
			var mu sync.Mutex
			g, gctx := errgroup.WithContext(ctx)
			g.SetLimit(8)
			for i := 0; i < h.Shards; i++ {
				g.Go(func() error {
					return s.scanPages(gctx, ShardKey(s.prefix, h.Gen, i), func(page []string) {
						mu.Lock()
						defer mu.Unlock()
						for j := 0; j+1 < len(page); j += 2 {
							each(page[j], page[j+1])
						}
						if done/10_000 != (done+len(page)/2)/10_000 {
							s.progress("read", done, 0)
						}
						done += len(page) / 2
					})
				})
			}
			if err := g.Wait(); err != nil {
				return Head{}, err
			}
		}
		if err := s.scan(ctx, s.delta, each); err != nil {
			return Head{}, err
		}
		nh, ok, err := s.Follow(ctx, h, each)
		if err != nil {
			return Head{}, err
		}
		if ok {
			s.progress("read", done, done)
			return nh, nil
		}
	}
}

// scan pages through one hash.
func (s *Store) scan(ctx context.Context, key string, each Entries) error {
	return s.scanPages(ctx, key, func(page []string) {
		for i := 0; i+1 < len(page); i += 2 {
			each(page[i], page[i+1])
		}
	})
}

// scanPages pages through one hash (HSCAN), a page of fields and values at a time.
func (s *Store) scanPages(ctx context.Context, key string, page func([]string)) error {
	cursor := uint64(0)
	for {
		e, err := s.vk.Do(ctx, s.vk.B().Hscan().Key(key).Cursor(cursor).Count(Page).Build()).AsScanEntry()
		if err != nil {
			return err
		}
		page(e.Elements)
		if cursor = e.Cursor; cursor == 0 {
			return nil
		}
	}
}

// Follow reads the changes made since h from the log and calls each for every field they
// changed, in order, and returns the head they lead to. ok is false when they cannot be
// followed: the base changed, or the log no longer reaches back to h; the caller reloads.
func (s *Store) Follow(ctx context.Context, h Head, each Entries) (Head, bool, error) {
	v := VersionNumber(h.Version)
	for {
		msgs, err := s.vk.Do(ctx, s.vk.B().Xrange().Key(s.log).Start(fmt.Sprintf("(%d-1", v)).End("+").Count(16).Build()).AsXRange()
		if err != nil {
			return h, false, err
		}
		for _, m := range msgs {
			n, err := strconv.ParseInt(strings.TrimSuffix(m.ID, "-1"), 10, 64)
			if err != nil || n != v+1 {
				return h, false, nil // the log was trimmed past v: reload
			}
			if _, ok := m.FieldValues[reloadField]; ok {
				return h, false, nil
			}
			// a stream entry's fields are returned as a map: the order of one version's
			// fields does not matter, each is one override
			for f, val := range m.FieldValues {
				each(f, val)
			}
			v = n
		}
		if len(msgs) < 16 {
			if v != VersionNumber(h.Version) {
				h.Version = strconv.FormatInt(v, 10)
			}
			return h, true, nil
		}
	}
}

// Read reads the whole store, by pages, at one version.
func (s *Store) Read(ctx context.Context) (Snapshot, error) {
	var m map[string]string
	h, err := s.Load(ctx, func(Head) { m = map[string]string{} }, func(f, v string) {
		if v == "" {
			delete(m, f)
		} else {
			m[f] = v
		}
	})
	if err != nil {
		return Snapshot{}, err
	}
	return snapshotOf(h.Version, m), nil
}

func snapshotOf(version string, m map[string]string) Snapshot {
	s := Snapshot{Version: version, Overrides: make([]Override, 0, len(m))}
	for field, value := range m {
		o, err := DecodeField(field, value)
		if err != nil {
			s.Bad = append(s.Bad, BadField{Field: field, Err: err})
			continue
		}
		s.Overrides = append(s.Overrides, o)
	}
	sort.Slice(s.Overrides, func(i, j int) bool { return s.Overrides[i].ID().Less(s.Overrides[j].ID()) })
	sort.Slice(s.Bad, func(i, j int) bool { return s.Bad[i].Field < s.Bad[j].Field })
	return s
}

// ErrChanged is Apply's error when the store changed since the snapshot its plan was made
// from: nothing was written; read and plan again.
var ErrChanged = errors.New("the overrides changed on the server since they were read: nothing written; run the command again")

// Apply makes changes, all of them and the version's increment, or nothing. With ifVersion
// set (a plan made from a snapshot), only if the version is still *ifVersion, else
// ErrChanged. A change of at most MaxDelta overrides is one MULTI; a larger one (or one the
// delta has no room for) reads the store, writes it as the changes leave it as a new base,
// and flips to it (Replace does the same from a whole set the caller has). Without ifVersion,
// a change made meanwhile by someone else is no conflict: the MULTI is tried again on it. It
// returns the new version.
func (s *Store) Apply(ctx context.Context, changes []Change, ifVersion *string) (string, error) {
	if len(changes) == 0 {
		return "", errors.New("override: no change to apply")
	}
	if len(changes) > MaxDelta || changeBytes(changes) > MaxDeltaBytes {
		return s.rebase(ctx, changes, ifVersion)
	}
	for attempt := 0; ; attempt++ {
		v, err := s.applyDelta(ctx, changes, ifVersion)
		if errors.Is(err, errFull) {
			return s.rebase(ctx, changes, ifVersion)
		}
		// without a version to keep, a concurrent change is no conflict: write again on it
		if errors.Is(err, ErrChanged) && ifVersion == nil && attempt < 10 {
			continue
		}
		return v, err
	}
}

var errFull = errors.New("the delta is full")

// changeFields are the fields and values a change writes: "" removes.
func changeFields(changes []Change) [][2]string {
	out := make([][2]string, 0, len(changes))
	for _, c := range changes {
		switch {
		case c.Field != "":
			out = append(out, [2]string{c.Field, ""})
		case c.New == nil:
			out = append(out, [2]string{FieldOf(c.Old.ID()), ""})
		default:
			out = append(out, [2]string{FieldOf(c.New.ID()), Encode(*c.New)})
		}
	}
	return out
}

// changeBytes is the size of the fields and values changes write.
func changeBytes(changes []Change) int {
	n := 0
	for _, fv := range changeFields(changes) {
		n += len(fv[0]) + len(fv[1])
	}
	return n
}

// applyDelta writes changes into the delta in one MULTI, the version and the log with them.
func (s *Store) applyDelta(ctx context.Context, changes []Change, ifVersion *string) (string, error) {
	var version string
	err := s.vk.Dedicated(func(d valkey.DedicatedClient) error {
		rs := d.DoMulti(ctx,
			d.B().Watch().Key(s.head).Build(),
			d.B().Hgetall().Key(s.head).Build(),
			d.B().Hlen().Key(s.delta).Build())
		if err := rs[0].Error(); err != nil {
			return err
		}
		h, err := ParseHead(rs[1])
		if err != nil {
			return err
		}
		n, err := rs[2].AsInt64()
		if err != nil {
			return err
		}
		if ifVersion != nil && h.Version != *ifVersion {
			_ = d.Do(ctx, d.B().Unwatch().Build()).Error()
			return ErrChanged
		}
		if n+int64(len(changes)) > DeltaCap {
			_ = d.Do(ctx, d.B().Unwatch().Build()).Error()
			return errFull
		}
		if h.Version == "" {
			if old, err := d.Do(ctx, d.B().Exists().Key(Key(s.prefix)).Build()).AsInt64(); err == nil && old > 0 {
				_ = d.Do(ctx, d.B().Unwatch().Build()).Error()
				return ErrOldLayout
			}
		}
		next := VersionNumber(h.Version) + 1
		fields := changeFields(changes)
		set := d.B().Hset().Key(s.delta).FieldValue()
		add := d.B().Xadd().Key(s.log).Maxlen().Almost().Threshold(strconv.Itoa(LogLen)).Id(fmt.Sprintf("%d-1", next)).FieldValue()
		for _, fv := range fields {
			set = set.FieldValue(fv[0], fv[1])
			add = add.FieldValue(fv[0], fv[1])
		}
		rs = d.DoMulti(ctx,
			d.B().Multi().Build(),
			set.Build(),
			d.B().Hincrby().Key(s.head).Field(VersionField).Increment(1).Build(),
			add.Build(),
			d.B().Exec().Build())
		version, err = execResult(rs, 1)
		return err
	})
	return version, err
}

// execResult reads a MULTI ... EXEC's replies: the version the HINCRBY at inc made.
func execResult(rs []valkey.ValkeyResult, inc int) (string, error) {
	for _, r := range rs[:len(rs)-1] {
		if err := r.Error(); err != nil {
			return "", err
		}
	}
	exec, err := rs[len(rs)-1].ToArray()
	if valkey.IsValkeyNil(err) {
		return "", ErrChanged // the head changed between the read and the EXEC
	}
	if err != nil {
		return "", err
	}
	for _, r := range exec {
		if err := r.Error(); err != nil {
			return "", err
		}
	}
	n, err := exec[inc].AsInt64()
	if err != nil {
		return "", err
	}
	return strconv.FormatInt(n, 10), nil
}

// rebase writes the store as changes leave it as a new base, then flips head to it if the
// version is still the one the store was read at (and *ifVersion, when set).
func (s *Store) rebase(ctx context.Context, changes []Change, ifVersion *string) (string, error) {
	var m map[string]string
	h, err := s.Load(ctx, func(Head) { m = map[string]string{} }, func(f, v string) {
		if v == "" {
			delete(m, f)
		} else {
			m[f] = v
		}
	})
	if err != nil {
		return "", err
	}
	if ifVersion != nil && h.Version != *ifVersion {
		return "", ErrChanged
	}
	for _, fv := range changeFields(changes) {
		if fv[1] == "" {
			delete(m, fv[0])
		} else {
			m[fv[0]] = fv[1]
		}
	}
	return s.writeBase(ctx, h, m)
}

// Replace makes the store hold exactly all (and none of its bad fields), as a new base, if
// its version is still ifVersion: all or nothing. It returns the new version.
func (s *Store) Replace(ctx context.Context, all []Override, ifVersion string) (string, error) {
	m := make(map[string]string, len(all))
	for _, o := range all {
		m[FieldOf(o.ID())] = Encode(o)
	}
	return s.writeBase(ctx, Head{Version: ifVersion}, m)
}

// WriteFields makes the store hold exactly fields (field: value, as the store holds them) as a
// new base, if its version is still ifVersion: for rlfn override migrate.
func (s *Store) WriteFields(ctx context.Context, fields map[string]string, ifVersion string) (string, error) {
	return s.writeBase(ctx, Head{Version: ifVersion}, fields)
}

// writeBase writes m as a new generation, in batches of Page fields, then flips head to it in
// one MULTI if the version is still from.Version. Until the flip nothing reads it; when the
// flip does not happen its hashes are deleted. The old base's hashes are deleted after it.
func (s *Store) writeBase(ctx context.Context, from Head, m map[string]string) (string, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	gen := hex.EncodeToString(b[:])
	shards := max(minShards, (len(m)+shardSize-1)/shardSize)
	byShard := make([][]string, shards)
	for f, v := range m {
		i := ShardOf(f, shards)
		byShard[i] = append(byShard[i], f, v)
	}
	flipped := false
	defer func() {
		if !flipped {
			s.drop(context.WithoutCancel(ctx), gen, shards)
		}
	}()
	done := 0
	var cmds valkey.Commands
	flush := func() error {
		for _, r := range s.vk.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				return err
			}
		}
		cmds = cmds[:0]
		s.progress("write", done, len(m))
		return nil
	}
	for i, fvs := range byShard {
		key := ShardKey(s.prefix, gen, i)
		for len(fvs) > 0 {
			set := s.vk.B().Hset().Key(key).FieldValue()
			n, size := 0, 0
			for ; n < min(len(fvs), 2*Page) && (n == 0 || size+len(fvs[n])+len(fvs[n+1]) <= PageBytes); n += 2 {
				set = set.FieldValue(fvs[n], fvs[n+1])
				size += len(fvs[n]) + len(fvs[n+1])
			}
			cmds = append(cmds, set.Build())
			done += n / 2
			fvs = fvs[n:]
			if len(cmds) == 32 {
				if err := flush(); err != nil {
					return "", err
				}
			}
		}
	}
	if err := flush(); err != nil {
		return "", err
	}
	var version string
	var old Head
	err := s.vk.Dedicated(func(d valkey.DedicatedClient) error {
		rs := d.DoMulti(ctx, d.B().Watch().Key(s.head).Build(), d.B().Hgetall().Key(s.head).Build())
		if err := rs[0].Error(); err != nil {
			return err
		}
		h, err := ParseHead(rs[1])
		if err != nil {
			return err
		}
		if h.Version != from.Version {
			_ = d.Do(ctx, d.B().Unwatch().Build()).Error()
			return ErrChanged
		}
		old = h
		next := VersionNumber(h.Version) + 1
		rs = d.DoMulti(ctx,
			d.B().Multi().Build(),
			d.B().Hset().Key(s.head).FieldValue().FieldValue(genField, gen).FieldValue(shardsField, strconv.Itoa(shards)).FieldValue(countField, strconv.Itoa(len(m))).Build(),
			d.B().Hincrby().Key(s.head).Field(VersionField).Increment(1).Build(),
			d.B().Unlink().Key(s.delta).Build(),
			d.B().Xadd().Key(s.log).Maxlen().Almost().Threshold(strconv.Itoa(LogLen)).Id(fmt.Sprintf("%d-1", next)).FieldValue().FieldValue(reloadField, gen).Build(),
			d.B().Exec().Build())
		version, err = execResult(rs, 1)
		return err
	})
	if err != nil {
		return "", err
	}
	flipped = true
	if old.Gen != "" {
		s.drop(context.WithoutCancel(ctx), old.Gen, old.Shards)
	}
	return version, nil
}

// drop deletes a generation's hashes (UNLINK: freed off the node's main thread). A reader
// paging through them when they go notices the head's change and reads again.
func (s *Store) drop(ctx context.Context, gen string, shards int) {
	cmds := make(valkey.Commands, 0, shards)
	for i := 0; i < shards; i++ {
		cmds = append(cmds, s.vk.B().Unlink().Key(ShardKey(s.prefix, gen, i)).Build())
	}
	s.vk.DoMulti(ctx, cmds...)
}

// ReadOld reads the store of an earlier release (one hash, <prefix>{%overrides}) by pages:
// its fields, its version field left out.
func (s *Store) ReadOld(ctx context.Context) (map[string]string, error) {
	m := map[string]string{}
	err := s.scan(ctx, Key(s.prefix), func(f, v string) {
		if f != VersionField {
			m[f] = v
		}
	})
	return m, err
}

// DropOld deletes the store of an earlier release.
func (s *Store) DropOld(ctx context.Context) error {
	return s.vk.Do(ctx, s.vk.B().Unlink().Key(Key(s.prefix)).Build()).Error()
}

// Get is the value of one field of the store ("" for none), and the version it was read at:
// from the delta when it holds the field, else from the base; two small reads, whatever the
// store's size. A change between them is told by the version: the caller's write checks it.
func (s *Store) Get(ctx context.Context, field string) (value string, h Head, err error) {
	if h, err = s.ReadHead(ctx); err != nil {
		return "", h, err
	}
	if h.Version == "" {
		if old, err := s.vk.Do(ctx, s.vk.B().Exists().Key(Key(s.prefix)).Build()).AsInt64(); err == nil && old > 0 {
			return "", h, ErrOldLayout
		}
	}
	r := s.vk.Do(ctx, s.vk.B().Hmget().Key(s.delta).Field(field).Build())
	vs, err := r.ToArray()
	if err != nil {
		return "", h, err
	}
	if !vs[0].IsNil() {
		v, err := vs[0].ToString()
		return v, h, err
	}
	if h.Gen == "" {
		return "", h, nil
	}
	vs, err = s.vk.Do(ctx, s.vk.B().Hmget().Key(ShardKey(s.prefix, h.Gen, ShardOf(field, h.Shards))).Field(field).Build()).ToArray()
	if err != nil {
		return "", h, err
	}
	if vs[0].IsNil() {
		return "", h, nil
	}
	v, err := vs[0].ToString()
	return v, h, err
}
