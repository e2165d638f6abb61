package httplimit

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/limitspec"
	"github.com/rlfn/rlfn/internal/needs"
	"github.com/rlfn/rlfn/versions"
)

// VersionChecker is what Check needs of the Limiter, as *client.Limiter has it.
type VersionChecker interface {
	CheckVersion(ctx context.Context, min string) error
}

var _ VersionChecker = (*client.Limiter)(nil)

// ErrNoVersionChecker is returned by Check when the Limiter cannot tell what its servers run
// (it does not implement VersionChecker).
var ErrNoVersionChecker = errors.New("httplimit: Check needs a Limiter that implements VersionChecker, such as *client.Limiter")

// ReleaseError reports policies that need a library release that a node does not run (or
// whose nodes could not be asked), from Check.
type ReleaseError struct {
	Policies []string // the Names of the policies that need Release, in Options.Policies order
	Release  string   // e.g. "1.1.0"
	Err      error    // the Limiter's: a *client.VersionError per node that runs an older one, joined
}

func (e *ReleaseError) Error() string {
	return fmt.Sprintf("httplimit: policies %s need library %s: %v", quoteAll(e.Policies), e.Release, e.Err)
}

// Unwrap returns the Limiter's error, so that errors.As finds a *client.VersionError in it.
func (e *ReleaseError) Unwrap() error { return e.Err }

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}

// Needs is the library release the decisions of p need: "1.2.0" when a limit is a
// client.Calendar or has a Penalty; else "1.1.0" when it has a Concurrency, when several of
// its limits are decided at once (Also: all or nothing across keys needs refunds), or when a
// limit has a Reserve; else "1.0.0". Limits in shadow count: they are decided too, all at once
// when the whole route is in shadow (Shadow, or EnforcePercent below 100 for the keys outside
// it).
//
// A node older than that does not stop limiting: the client decides what the node can (each
// limit of a 1.0.0 node one at a time) and its client.Fallback the rest. Check says when that
// would happen, before the first request.
func Needs(p Policy) string {
	if p.Limit != nil && needsV12(p.Limit) {
		return needs.V12
	}
	for _, rule := range p.Also {
		if rule.Limit != nil && needsV12(rule.Limit) {
			return needs.V12
		}
	}
	if p.Concurrency != nil {
		return needs.V11
	}
	rel := needs.V10
	for _, d := range decisions(p) {
		if r := needs.Release(d.n, d.reserved); versions.Compare(rel, r) < 0 {
			rel = r
		}
	}
	return rel
}

// needsV12 reports whether l needs library 1.2.0: a Calendar, or a Penalty (which is decided
// with the principal's block in one rl_multi). Every limit of the client has a Penalty field,
// whether passed as a value or a pointer, or embedded in a type of the caller's.
func needsV12(l client.Limit) bool {
	if _, ok := calendarOf(l); ok {
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

// decision is limits of a Policy decided at once: how many, and whether one has a reserve.
type decision struct {
	n        int
	reserved bool
}

// decisions are the sets of p's limits that are decided at once: its enforced ones and its
// shadow ones, or all of them when the whole route is in shadow for some keys (Shadow, or an
// EnforcePercent below 100).
func decisions(p Policy) []decision {
	var all, enforced, shadow decision
	add := func(l client.Limit, inShadow bool) {
		r := limitspec.Reserve(l) > 0
		d := &enforced
		if inShadow {
			d = &shadow
		}
		d.n, d.reserved = d.n+1, d.reserved || r
		all.n, all.reserved = all.n+1, all.reserved || r
	}
	if p.Limit != nil {
		add(p.Limit, p.Shadow)
	}
	for _, rule := range p.Also {
		add(rule.Limit, p.Shadow || rule.Shadow)
	}
	if p.Shadow || p.EnforcePercent > 0 && p.EnforcePercent < 100 {
		return []decision{all}
	}
	return []decision{enforced, shadow}
}

// Check verifies that every primary of the Limiter's servers runs the library release each
// of Options.Policies needs (Needs), or, without Policies that limit anything, a library of
// the major version the client speaks. Call it at start-up: a node that still runs 1.0.0 under a policy of several
// limits is found before the first request, not by a log line under load. It returns nil, or
// a *ReleaseError per release some policies need and a node lacks, joined; ErrNoVersionChecker
// when the Limiter cannot tell.
func (m *Middleware) Check(ctx context.Context) error {
	vc, ok := m.lim.(VersionChecker)
	if !ok {
		return ErrNoVersionChecker
	}
	byRelease := map[string][]string{}
	for _, p := range m.policies {
		if p.Limit == nil && p.Concurrency == nil && len(p.Also) == 0 {
			continue // a route without limits needs no library
		}
		rel := Needs(p)
		byRelease[rel] = append(byRelease[rel], p.Name)
	}
	if len(byRelease) == 0 {
		if err := vc.CheckVersion(ctx, ""); err != nil {
			return fmt.Errorf("httplimit: check: %w", err)
		}
		return nil
	}
	releases := make([]string, 0, len(byRelease))
	for rel := range byRelease {
		releases = append(releases, rel)
	}
	// newest first: when every node runs it, the older ones need no round trip
	slices.SortFunc(releases, func(a, b string) int { return versions.Compare(b, a) })
	var errs []error
	for i, rel := range releases {
		err := vc.CheckVersion(ctx, rel)
		if err == nil {
			if i == 0 {
				return nil
			}
			break // every older release passes too
		}
		errs = append(errs, &ReleaseError{Policies: byRelease[rel], Release: rel, Err: err})
	}
	return errors.Join(errs...)
}

// validPolicy reports why p, a static policy (Options.Policies) whose Name is set, cannot be
// valid, as a *PolicyError: what checkPolicy refuses at request time, and every limit the
// client would refuse.
func validPolicy(p Policy) error {
	if err := checkPolicy(&p); err != nil {
		return err
	}
	if p.Limit != nil {
		if err := validLimit(p.Limit); err != nil {
			return &PolicyError{Name: p.Name, Reason: "Limit: " + limitReason(err), Err: err}
		}
	}
	if p.Concurrency != nil {
		if err := p.Concurrency.Validate(); err != nil {
			return &PolicyError{Name: p.Name, Reason: "Concurrency: " + limitReason(err), Err: err}
		}
	}
	for _, rule := range p.Also {
		if err := validLimit(rule.Limit); err != nil {
			return &PolicyError{Name: rule.Name, Reason: "Limit: " + limitReason(err), Err: err}
		}
	}
	return nil
}

// validLimit is l's Validate, and refuses a nil pointer to a limit, whose Validate would
// dereference it.
func validLimit(l client.Limit) error {
	if v := reflect.ValueOf(l); v.Kind() == reflect.Pointer && v.IsNil() {
		return &client.LimitError{Field: "limit", Reason: "must not be nil"}
	}
	return l.Validate()
}

// limitReason is a limit's error without the client's prefix, which PolicyError has its own of.
func limitReason(err error) string {
	var le *client.LimitError
	if errors.As(err, &le) {
		return le.Field + " " + le.Reason
	}
	return err.Error()
}
