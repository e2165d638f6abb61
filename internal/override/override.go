// Package override is the data model of per-key overrides: an exception that replaces the
// limit of one principal, or of every principal whose key starts with a prefix, for one
// limiter (an algorithm and a limit Name), optionally until a time. It holds what both sides
// share (the client, which decides with them, and rlfn, which writes them): the model, its
// JSON, the rules of precedence, the plans that change a set of overrides, and the one small
// type that reads and writes them on the server (Store).
//
// Nothing here knows the client's limits: the fields of an override's limit are checked by
// whoever turns them into a limit (the client when it compiles them, rlfn before it writes),
// so that the client stays the one place that declares the library's bounds.
package override

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Policy names the limiter an override replaces: its algorithm (as the library and the keys
// name it: token_bucket) and the limit's Name ("" for an unnamed limit). It is exactly what
// follows the principal in the limiter's server key, <prefix>{<key>}:<algorithm>[:<name>], so
// an override reaches the state the code's limit reaches, and never changes the algorithm:
// another algorithm's state would be another key, and the principal would start afresh.
type Policy struct {
	Algorithm string `json:"algorithm"`
	Name      string `json:"name,omitempty"`
}

// String is the policy as keys and rlfn print it: token_bucket, or token_bucket:api.
func (p Policy) String() string {
	if p.Name == "" {
		return p.Algorithm
	}
	return p.Algorithm + ":" + p.Name
}

// Override replaces the limit of Policy for Key: one principal (the key the service passes to
// Allow, e.g. "user:42", or "api:42" under httplimit's policy "api"), or every principal whose
// key starts with a prefix when Key ends with '*' ("user:*"; "*" alone is every principal).
type Override struct {
	Policy
	Key   string    `json:"key"`
	Limit Fields    `json:"limit"`
	Until time.Time `json:"until,omitzero"` // zero: until removed; else the override ends then
	Note  string    `json:"note,omitempty"` // why, for the next operator: a ticket, a name
}

// Fields are an override's limit, the fields of rlfn call's flags, each algorithm reading its
// own: a whole limit (Reserve and Penalty included: an override without them has none), never
// its Name, which is the Policy's.
type Fields struct {
	Limit    int64    `json:"limit,omitempty"`
	Capacity int64    `json:"capacity,omitempty"`
	Rate     int64    `json:"rate,omitempty"`
	Window   Duration `json:"window,omitzero"`
	Period   string   `json:"period,omitempty"` // a bucket's duration (1s), or a calendar's day, week, month or year
	Mode     string   `json:"mode,omitempty"`   // a leaky bucket's police (default) or shape
	Lease    Duration `json:"lease,omitzero"`
	Anchor   string   `json:"anchor,omitempty"` // a calendar's anchor, as rlfn call's --anchor
	Zone     string   `json:"zone,omitempty"`   // a calendar's zone, as rlfn call's --zone
	Reserve  int64    `json:"reserve,omitempty"`
	Penalty  Duration `json:"penalty,omitzero"`
}

// Duration is a time.Duration written as Go writes one ("1s", "1h30m0s") in JSON, so that a
// file of overrides reads as rlfn's flags do.
type Duration time.Duration

func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration: write one with its unit, e.g. 500ms, 1s, 1m, 1h", b)
	}
	*d = Duration(v)
	return nil
}

// IsPattern reports whether key is a pattern: a literal prefix and one trailing '*'.
func IsPattern(key string) bool { return strings.HasSuffix(key, "*") }

// MaxKeyLen is the longest key or pattern an override takes: the client's largest
// Options.MaxKeyLen. A longer exact key is never decided, and a longer prefix matches no key
// the client takes.
const MaxKeyLen = 1 << 20

// ErrInvalid is what every error of CheckKey and Check wraps.
var ErrInvalid = errors.New("invalid override")

// CheckKey refuses a key or pattern that can never match: an empty key, a '*' anywhere but at
// the end (patterns are a prefix and one trailing '*' only, so that two patterns of equal
// length never both match one key), a key too long for any client.
func CheckKey(key string) error {
	body := strings.TrimSuffix(key, "*")
	switch {
	case key == "":
		return fmt.Errorf("%w: the key is empty (a client refuses an empty key; \"*\" is every key)", ErrInvalid)
	case strings.Contains(body, "*"):
		return fmt.Errorf("%w: key %q: a pattern is a prefix and one trailing '*' (user:*), a '*' elsewhere never matches", ErrInvalid, key)
	case len(body) > MaxKeyLen || !IsPattern(key) && len(key) > MaxKeyLen:
		return fmt.Errorf("%w: key %q is longer than any client takes (%d bytes)", ErrInvalid, key[:32]+"...", MaxKeyLen)
	}
	return nil
}

// Check refuses an override that cannot take effect, before anything is written: a bad key
// (CheckKey), an expiry not after now, a policy without an algorithm. The limit's fields are
// checked by limit (the caller's, which knows the library's bounds), nil to skip.
func Check(o Override, now time.Time, limit func(Override) error) error {
	if o.Algorithm == "" {
		return fmt.Errorf("%w: no algorithm", ErrInvalid)
	}
	if err := CheckKey(o.Key); err != nil {
		return err
	}
	if !o.Until.IsZero() && !o.Until.After(now) {
		return fmt.Errorf("%w: %s %s: until %s is in the past", ErrInvalid, o.Policy, o.Key, o.Until.UTC().Format(time.RFC3339))
	}
	if limit != nil {
		if err := limit(o); err != nil {
			return fmt.Errorf("%w: %s %s: %v", ErrInvalid, o.Policy, o.Key, err)
		}
	}
	return nil
}

// String is the override's ID as rlfn prints it (not its Policy's alone, which the embedded
// field would print).
func (o Override) String() string { return o.ID().String() }

// ID is an override's place in the store: its policy and key. Two overrides with one ID are
// one override.
type ID struct {
	Policy
	Key string
}

// ID is o's ID.
func (o Override) ID() ID { return ID{o.Policy, o.Key} }

// String is the ID as rlfn prints it: "token_bucket user:42", "token_bucket:api api:*".
func (id ID) String() string { return id.Policy.String() + " " + id.Key }

// Less orders IDs as rlfn lists them: by policy, then key.
func (id ID) Less(o ID) bool {
	if id.Algorithm != o.Algorithm {
		return id.Algorithm < o.Algorithm
	}
	if id.Name != o.Name {
		return id.Name < o.Name
	}
	return id.Key < o.Key
}

// Expired reports whether o has ended at now.
func (o Override) Expired(now time.Time) bool { return !o.Until.IsZero() && !now.Before(o.Until) }
