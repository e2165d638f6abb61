package httplimit

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/decide"
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
// client.Calendar or has a Penalty; else "1.1.0" when it has a Concurrency or an Outcome that
// gives units back (all but CheckFirst: refunds), when several of
// its limits are decided at once (Also: all or nothing across keys needs refunds), or when a
// limit has a Reserve; else "1.0.0". Limits in shadow count: they are decided too, all at once
// when the whole route is in shadow (Shadow, or EnforcePercent below 100 for the keys outside
// it).
//
// A node older than that does not stop limiting: the client decides what the node can (each
// limit of a 1.0.0 node one at a time) and its client.Fallback the rest. Check says when that
// would happen, before the first request.
func Needs(p Policy) string { return decide.Needs(spec(p)) }

// spec is p as the decision's checks see it.
func spec(p Policy) decide.Spec {
	s := decide.Spec{Limit: p.Limit, Concurrency: p.Concurrency != nil, Shadow: p.Shadow, EnforcePercent: p.EnforcePercent,
		Refunds: p.Outcome != nil && !p.Outcome.CheckFirst}
	for _, rule := range p.Also {
		s.Also = append(s.Also, rule.named())
	}
	return s
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
	var names, rels []string
	for _, p := range m.policies {
		if p.Limit == nil && p.Concurrency == nil && len(p.Also) == 0 {
			continue // a route without limits needs no library
		}
		names, rels = append(names, p.Name), append(rels, Needs(p))
	}
	missing, err := decide.CheckReleases(ctx, vc, names, rels)
	if err != nil {
		return fmt.Errorf("httplimit: check: %w", err)
	}
	var errs []error
	for _, ms := range missing {
		errs = append(errs, &ReleaseError{Policies: ms.Policies, Release: ms.Release, Err: ms.Err})
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
		if err := decide.ValidLimit(p.Limit); err != nil {
			return &PolicyError{Name: p.Name, Reason: "Limit: " + decide.LimitReason(err), Err: err}
		}
	}
	if p.Concurrency != nil {
		if err := p.Concurrency.Validate(); err != nil {
			return &PolicyError{Name: p.Name, Reason: "Concurrency: " + decide.LimitReason(err), Err: err}
		}
	}
	if o := p.Outcome; o != nil && o.CheckFirst && p.Limit == nil && len(p.Also) == 0 {
		return &PolicyError{Name: p.Name, Reason: "Outcome.CheckFirst needs a Limit"}
	}
	for _, rule := range p.Also {
		if err := decide.ValidLimit(rule.Limit); err != nil {
			return &PolicyError{Name: rule.Name, Reason: "Limit: " + decide.LimitReason(err), Err: err}
		}
	}
	if bad, reason := decide.CheckSameKey(p.Name, p.Limit, len(p.Also), func(i int) decide.Named {
		return p.Also[i].named()
	}); reason != "" {
		return &PolicyError{Name: bad, Reason: reason}
	}
	return nil
}
