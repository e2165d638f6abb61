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

// Key is the server key of the overrides of the Limiters under prefix, a hash:
//
//	<prefix>{%overrides}   one field per override (FieldOf: a JSON array), its JSON the value,
//	                       and the field "version", a counter every change increments
//
// It never meets a limiter's key: a limiter's principal is escaped between the braces, where a
// '%' is only ever followed by two hex digits or by the closing brace (the empty key), never by
// "overrides". One key is one cluster slot, and a change is one MULTI there. A client reads
// the version on every decision from its own cache (HGET, through valkey-go's client-side
// caching: the server invalidates the whole key at any change), and the whole hash only when
// the version changed. The library's functions never run HGET or HGETALL, so the server's
// commandstats count the clients' reads of the store alone.
func Key(prefix string) string {
	return string(keys.AppendEscaped(nil, prefix)) + "{%overrides}"
}

// VersionField is the hash field holding the version. No override's field is a bare word.
const VersionField = "version"

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

// ParseSnapshot reads a snapshot from the reply to HGETALL: a missing key is an empty store,
// version "".
func ParseSnapshot(hash valkey.ValkeyResult) (Snapshot, error) {
	var s Snapshot
	m, err := hash.AsStrMap()
	if err != nil && !valkey.IsValkeyNil(err) {
		return s, err
	}
	for field, value := range m {
		if field == VersionField {
			s.Version = value
			continue
		}
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
	vk  valkey.Client
	key string
}

// NewStore is the store of the Limiters under prefix, through vk.
func NewStore(vk valkey.Client, prefix string) *Store {
	return &Store{vk: vk, key: Key(prefix)}
}

// Read reads the whole store, its version with it, in one command.
func (s *Store) Read(ctx context.Context) (Snapshot, error) {
	return ParseSnapshot(s.vk.Do(ctx, s.vk.B().Hgetall().Key(s.key).Build()))
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
			if err := d.Do(ctx, d.B().Watch().Key(s.key).Build()).Error(); err != nil {
				return err
			}
			v, err := d.Do(ctx, d.B().Hget().Key(s.key).Field(VersionField).Build()).ToString()
			if err != nil && !valkey.IsValkeyNil(err) {
				return err
			}
			if v != *ifVersion {
				_ = d.Do(ctx, d.B().Unwatch().Build()).Error()
				return ErrChanged
			}
		}
		cmds := valkey.Commands{d.B().Multi().Build()}
		set := d.B().Hset().Key(s.key).FieldValue()
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
			cmds = append(cmds, d.B().Hdel().Key(s.key).Field(del...).Build())
		}
		cmds = append(cmds, d.B().Hincrby().Key(s.key).Field(VersionField).Increment(1).Build(), d.B().Exec().Build())
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
