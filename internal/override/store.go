package override

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/internal/keys"
)

// Keys are the server keys of the overrides of the Limiters under prefix:
//
//	<prefix>{%overrides}          a hash: one field per override (FieldOf), its JSON the value
//	<prefix>{%overrides}:version  a counter every change increments, in the same transaction
//
// They never meet a limiter's key: a limiter's principal is escaped between the braces, where
// a '%' is only ever followed by two hex digits or by the closing brace (the empty key), never
// by "overrides". They share one hash tag, so one cluster slot, and a change is one MULTI
// there. A client reads the version on every decision from its own cache (valkey-go's
// client-side caching, invalidated by the server), and the hash only when the version changed.
func Keys(prefix string) (hash, version string) {
	hash = string(keys.AppendEscaped(nil, prefix)) + "{%overrides}"
	return hash, hash + ":version"
}

// FieldOf is the hash field of the override with id: a JSON array, so that no key or name,
// whatever it holds, makes two IDs one field.
func FieldOf(id ID) string {
	b, _ := json.Marshal([]string{id.Algorithm, id.Name, id.Key})
	return string(b)
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

// Encode is o as the store holds it.
func Encode(o Override) string {
	b, _ := json.Marshal(o)
	return string(b)
}

// Snapshot is what the store held when read.
type Snapshot struct {
	// Version is the counter of changes, "" before the first.
	Version string
	// Overrides are the overrides it holds, in ID order, expired ones included (a client
	// skips them; rlfn lists them until removed).
	Overrides []Override
	// Bad are the fields whose value does not decode (written by hand, or by a later
	// release): a client ignores them, rlfn reports them.
	Bad []BadField
}

// BadField is a field of the store that holds no override.
type BadField struct {
	Field string
	Err   error
}

// Parse reads a snapshot from the replies to GET version and HGETALL hash. A missing
// version (nil) is "", a missing hash empty.
func ParseSnapshot(version valkey.ValkeyResult, hash valkey.ValkeyResult) (Snapshot, error) {
	var s Snapshot
	v, err := version.ToString()
	switch {
	case valkey.IsValkeyNil(err):
	case err != nil:
		return s, err
	default:
		s.Version = v
	}
	m, err := hash.AsStrMap()
	if err != nil && !valkey.IsValkeyNil(err) {
		return s, err
	}
	for field, value := range m {
		o, err := Decode(value)
		if err == nil && FieldOf(o.ID()) != field {
			err = fmt.Errorf("its value is %s's", o.ID())
		}
		if err != nil {
			s.Bad = append(s.Bad, BadField{Field: field, Err: err})
			continue
		}
		s.Overrides = append(s.Overrides, o)
	}
	sort.Slice(s.Overrides, func(i, j int) bool { return s.Overrides[i].ID().Less(s.Overrides[j].ID()) })
	sort.Slice(s.Bad, func(i, j int) bool { return s.Bad[i].Field < s.Bad[j].Field })
	return s, nil
}

// Store reads and changes the overrides on a server or cluster: the one type of this package
// that touches the network.
type Store struct {
	vk            valkey.Client
	hash, version string
}

// NewStore is the store of the Limiters under prefix, through vk.
func NewStore(vk valkey.Client, prefix string) *Store {
	s := &Store{vk: vk}
	s.hash, s.version = Keys(prefix)
	return s
}

// Read reads the whole store: GET version and HGETALL in one round trip. A change between the
// two replies leaves a snapshot newer than its version, never older: the version is read
// first.
func (s *Store) Read(ctx context.Context) (Snapshot, error) {
	r := s.vk.DoMulti(ctx,
		s.vk.B().Get().Key(s.version).Build(),
		s.vk.B().Hgetall().Key(s.hash).Build())
	return ParseSnapshot(r[0], r[1])
}

// ErrChanged is Apply's error when the store changed since the snapshot its plan was made
// from: nothing was written; read and plan again.
var ErrChanged = errors.New("the overrides changed on the server since they were read: nothing written; run the command again")

// Apply makes changes in one transaction (MULTI/EXEC): all of them and the version's
// increment, or nothing. With ifVersion set (a plan made from a snapshot), the transaction
// runs only if the version is still *ifVersion (WATCH), else ErrChanged. It returns the new
// version.
func (s *Store) Apply(ctx context.Context, changes []Change, ifVersion *string) (string, error) {
	if len(changes) == 0 {
		return "", errors.New("override: no change to apply")
	}
	var version string
	err := s.vk.Dedicated(func(d valkey.DedicatedClient) error {
		if ifVersion != nil {
			if err := d.Do(ctx, d.B().Watch().Key(s.version, s.hash).Build()).Error(); err != nil {
				return err
			}
			v, err := d.Do(ctx, d.B().Get().Key(s.version).Build()).ToString()
			if err != nil && !valkey.IsValkeyNil(err) {
				return err
			}
			if v != *ifVersion {
				_ = d.Do(ctx, d.B().Unwatch().Build()).Error()
				return ErrChanged
			}
		}
		cmds := valkey.Commands{d.B().Multi().Build()}
		set := d.B().Hset().Key(s.hash).FieldValue()
		var del []string
		sets := 0
		for _, c := range changes {
			if c.New == nil {
				del = append(del, FieldOf(c.Old.ID()))
				continue
			}
			set = set.FieldValue(FieldOf(c.New.ID()), Encode(*c.New))
			sets++
		}
		if sets > 0 {
			cmds = append(cmds, set.Build())
		}
		if len(del) > 0 {
			cmds = append(cmds, d.B().Hdel().Key(s.hash).Field(del...).Build())
		}
		cmds = append(cmds, d.B().Incr().Key(s.version).Build(), d.B().Exec().Build())
		rs := d.DoMulti(ctx, cmds...)
		for _, r := range rs[:len(rs)-1] {
			if err := r.Error(); err != nil {
				return err
			}
		}
		exec, err := rs[len(rs)-1].ToArray()
		if valkey.IsValkeyNil(err) {
			return ErrChanged // a WATCHed key changed between the GET and the EXEC
		}
		if err != nil {
			return err
		}
		for _, r := range exec {
			if err := r.Error(); err != nil {
				return err
			}
		}
		n, err := exec[len(exec)-1].AsInt64()
		if err != nil {
			return err
		}
		version = fmt.Sprint(n)
		return nil
	})
	return version, err
}
