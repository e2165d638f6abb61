package decide

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/limitspec"
	"github.com/rlfn/rlfn/internal/needs"
	"github.com/rlfn/rlfn/versions"
)

// NameReason is why a policy name is refused.
const NameReason = "want letters, digits, '_', '.' or '-'"

// ValidName reports a policy name: it scopes keys ("name:principal", so no ':') and is sent
// as a Structured Field String, which holds these characters unescaped.
func ValidName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// Named is a limit of a policy beside its main one, as the checks see it.
type Named struct {
	Name   string
	Limit  client.Limit
	Shadow bool
	Unit   string
	// SameKey: counted on the policy's own key; OwnKey: it has a Key function of its own;
	// HasCost: a Cost function.
	SameKey, OwnKey, HasCost bool
}

// Check reports what makes a policy (name, its limit's unit, EnforcePercent percent, n further
// limits, the i-th of which also returns) one no call can be decided on: the name it concerns
// and why, or "" and "" when nothing does. It runs on every call, so it allocates only to
// refuse.
func Check(name, unit string, percent, n int, also func(i int) Named) (bad, reason string) {
	if !ValidName(name) {
		return name, NameReason
	}
	if !ValidName(unit) {
		return name, "Unit: " + NameReason
	}
	if percent < 0 || percent > 100 {
		return name, fmt.Sprintf("EnforcePercent must be from 0 to 100, got %d", percent)
	}
	for i := range n {
		rule := also(i)
		switch {
		case rule.Name == "":
			return name, fmt.Sprintf("Also[%d].Name is required", i)
		case !ValidName(rule.Name):
			return rule.Name, NameReason
		case rule.Limit == nil:
			return rule.Name, "Limit is required"
		case rule.Name == name:
			return rule.Name, "an AlsoLimit has the Name of its Policy"
		case !ValidName(rule.Unit):
			return rule.Name, "Unit: " + NameReason
		case rule.SameKey && rule.OwnKey:
			return rule.Name, "SameKey counts the limit on the Policy's key: it cannot have a Key of its own"
		}
		for j := range i {
			if also(j).Name == rule.Name {
				return rule.Name, "two Rules of one Policy have this Name"
			}
		}
	}
	return "", ""
}

// CheckSameKey reports two limits that would be one limiter on a policy's own key: its limit
// (nil: none) and the n further limits counted there (SameKey). A limiter's state is named by
// the key, the limit's algorithm and its Name (client.Limiter.Key), so two limits of one
// algorithm there need Names of their own. It returns the name of the limit concerned and why,
// or "" and "". A limit of a type it cannot read (a caller's that embeds no limit of the
// client's) is left to the client, which refuses the pair when it decides.
func CheckSameKey(name string, limit client.Limit, n int, also func(i int) Named) (bad, reason string) {
	type state struct {
		t    reflect.Type
		name string
	}
	seen := map[state]string{}
	add := func(owner string, l client.Limit) (string, bool) {
		t, lname, ok := stateOf(l)
		if !ok {
			return "", false
		}
		k := state{t, lname}
		if other, dup := seen[k]; dup {
			return other, true
		}
		seen[k] = owner
		return "", false
	}
	if limit != nil {
		add(name, limit)
	}
	for i := range n {
		rule := also(i)
		if !rule.SameKey || rule.Limit == nil {
			continue
		}
		if other, dup := add(rule.Name, rule.Limit); dup {
			return rule.Name, fmt.Sprintf("SameKey: its Limit has the algorithm and Name of %q's on the Policy's key, where they would be one limiter: give the Limit a Name (client's Name field)", other)
		}
	}
	return "", ""
}

// limitTypes are the client's limits: the algorithm of a limit is the one of these it is or
// embeds (its methods are promoted from it).
var limitTypes = map[reflect.Type]bool{
	reflect.TypeFor[client.FixedWindow]():   true,
	reflect.TypeFor[client.SlidingLog]():    true,
	reflect.TypeFor[client.SlidingWindow](): true,
	reflect.TypeFor[client.TokenBucket]():   true,
	reflect.TypeFor[client.LeakyBucket]():   true,
	reflect.TypeFor[client.Calendar]():      true,
}

// stateOf is the client's limit type that l is (by value or pointer) or embeds, and that
// limit's Name: with the key, what names its state. ok is false when l is none of them.
func stateOf(l client.Limit) (t reflect.Type, name string, ok bool) {
	v := reflect.ValueOf(l)
	deref := func(v reflect.Value) (reflect.Value, bool) {
		for v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return v, false
			}
			v = v.Elem()
		}
		return v, v.Kind() == reflect.Struct
	}
	v, ok = deref(v)
	if !ok {
		return nil, "", false
	}
	if !limitTypes[v.Type()] {
		found := false
		for i := range v.NumField() {
			if !v.Type().Field(i).Anonymous {
				continue
			}
			if f, ok := deref(v.Field(i)); ok && limitTypes[f.Type()] {
				v, found = f, true
				break
			}
		}
		if !found {
			return nil, "", false
		}
	}
	return v.Type(), v.FieldByName("Name").String(), true
}

// Enforced reports whether key is among the percent share of keys whose limits are enforced:
// an FNV-1a hash of it, so that the same keys are in on every call and every instance, and
// raising the percentage only adds keys.
func Enforced(key string, percent int) bool {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h%100) < percent
}

// InShadow reports whether a policy's main limit is decided in shadow for key: the whole
// policy is (shadow), or key is outside its EnforcePercent.
func InShadow(key string, shadow bool, percent int) bool {
	return shadow || percent != 0 && !Enforced(key, percent)
}

// Spec is a policy as Needs sees it.
type Spec struct {
	Limit          client.Limit
	Concurrency    bool
	Shadow         bool
	EnforcePercent int
	Also           []Named
	// Refunds: the policy gives units back (counting by outcome, but for check first).
	Refunds bool
	// Holds: the policy holds its units and settles them (a metered stream).
	Holds bool
}

// Needs is the library release the decisions of s need: "1.3.0" when it holds (Holds); else
// "1.2.0" when a limit is a client.Calendar or has a Penalty; else "1.1.0" when it has a
// Concurrency or Refunds, when several of its limits are decided at once, or when a limit has
// a Reserve; else "1.0.0". Limits in shadow count: they are decided too, all at once when the
// whole policy is in shadow for some keys.
func Needs(s Spec) string {
	if s.Holds {
		return needs.V13
	}
	if s.Limit != nil && needsV12(s.Limit) {
		return needs.V12
	}
	for _, rule := range s.Also {
		if rule.Limit != nil && needsV12(rule.Limit) {
			return needs.V12
		}
	}
	if s.Concurrency || s.Refunds {
		return needs.V11
	}
	rel := needs.V10
	for _, d := range Decisions(s) {
		if r := needs.Release(d.N, d.Reserved); versions.Compare(rel, r) < 0 {
			rel = r
		}
	}
	return rel
}

// needsV12 reports whether l needs library 1.2.0: a Calendar, or a Penalty (which is decided
// with the principal's block in one rl_multi). Every limit of the client has a Penalty field,
// whether passed as a value or a pointer, or embedded in a type of the caller's.
func needsV12(l client.Limit) bool {
	if _, ok := CalendarOf(l); ok {
		return true
	}
	v := reflect.ValueOf(l)
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return false
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return false
	}
	sf, ok := v.Type().FieldByName("Penalty")
	if !ok || sf.Type != reflect.TypeFor[time.Duration]() {
		return false
	}
	f, err := v.FieldByIndexErr(sf.Index)
	return err == nil && f.Int() != 0 // err: through a nil embedded pointer, no limit to read
}

// Decision is limits of a policy decided at once: how many, and whether one has a reserve.
type Decision struct {
	N        int
	Reserved bool
}

// Decisions are the sets of s's limits that are decided at once: its enforced ones and its
// shadow ones, or all of them when the whole policy is in shadow for some keys (Shadow, or an
// EnforcePercent below 100).
func Decisions(s Spec) []Decision {
	var all, enforced, shadow Decision
	add := func(l client.Limit, inShadow bool) {
		r := limitspec.Reserve(l) > 0
		d := &enforced
		if inShadow {
			d = &shadow
		}
		d.N, d.Reserved = d.N+1, d.Reserved || r
		all.N, all.Reserved = all.N+1, all.Reserved || r
	}
	if s.Limit != nil {
		add(s.Limit, s.Shadow)
	}
	for _, rule := range s.Also {
		add(rule.Limit, s.Shadow || rule.Shadow)
	}
	if s.Shadow || s.EnforcePercent > 0 && s.EnforcePercent < 100 {
		return []Decision{all}
	}
	return []Decision{enforced, shadow}
}

// Several reports whether s decides more than one limit at once somewhere.
func Several(s Spec) bool {
	for _, d := range Decisions(s) {
		if d.N > 1 {
			return true
		}
	}
	return false
}

// ValidLimit is l's Validate, and refuses a nil pointer to a limit, whose Validate would
// dereference it.
func ValidLimit(l client.Limit) error {
	if v := reflect.ValueOf(l); v.Kind() == reflect.Pointer && v.IsNil() {
		return &client.LimitError{Field: "limit", Reason: "must not be nil"}
	}
	return l.Validate()
}

// LimitReason is a limit's error without the client's prefix, which a policy's error has its
// own of.
func LimitReason(err error) string {
	var le *client.LimitError
	if errors.As(err, &le) {
		return le.Field + " " + le.Reason
	}
	return err.Error()
}

// UnitLeak is how long one unit takes to leak out of a leaky bucket; zero for every other
// limit.
func UnitLeak(l client.Limit) time.Duration { return l.Quota().Leak }

// MaxLeak is the longest time one unit takes to leak out of the leaky buckets among quotas.
func MaxLeak(quotas []Quota) time.Duration {
	var d time.Duration
	for _, q := range quotas {
		d = max(d, UnitLeak(q.Limit))
	}
	return d
}

// TooLongWait is the wait of a call admitted with a delay above maxDelay, which is refused
// all the same: the server has counted it (its unit is in the queue), and a call made later
// waits behind that unit too, so the delay it would get is within maxDelay once delay plus
// one unit's leak time has passed down to maxDelay.
func TooLongWait(delay, maxDelay time.Duration, quotas []Quota) time.Duration {
	return delay + MaxLeak(quotas) - maxDelay
}

// DecidingFirst is s with its element i moved first, the others in their order.
func DecidingFirst[T any](s []T, i int) []T {
	out := append(make([]T, 0, len(s)), s[i])
	out = append(out, s[:i]...)
	return append(out, s[i+1:]...)
}

// VersionChecker is what a check of the releases needs of the Limiter, as *client.Limiter has
// it.
type VersionChecker interface {
	CheckVersion(ctx context.Context, min string) error
}

// Missing is a release some policies need and a node lacks (or could not be asked).
type Missing struct {
	Policies []string // in the order given
	Release  string
	Err      error // the Limiter's
}

// CheckReleases asks vc whether every node runs the release each policy needs (needs[i] of
// names[i]), newest first: when every node runs it, the older ones need no round trip. With
// no policy, it checks the major version the client speaks (err). It returns each release
// some policies need and a node lacks.
func CheckReleases(ctx context.Context, vc VersionChecker, names, needs []string) (missing []Missing, err error) {
	byRelease := map[string][]string{}
	for i, rel := range needs {
		byRelease[rel] = append(byRelease[rel], names[i])
	}
	if len(byRelease) == 0 {
		return nil, vc.CheckVersion(ctx, "")
	}
	releases := make([]string, 0, len(byRelease))
	for rel := range byRelease {
		releases = append(releases, rel)
	}
	slices.SortFunc(releases, func(a, b string) int { return versions.Compare(b, a) })
	for i, rel := range releases {
		err := vc.CheckVersion(ctx, rel)
		if err == nil {
			if i == 0 {
				return nil, nil
			}
			break // every older release passes too
		}
		missing = append(missing, Missing{Policies: byRelease[rel], Release: rel, Err: err})
	}
	return missing, nil
}
