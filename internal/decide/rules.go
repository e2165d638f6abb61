package decide

import (
	"context"

	"github.com/rlfn/rlfn/client"
)

// The Limiter's methods a decision uses, as *client.Limiter has them. httplimit and grpclimit
// declare the same interfaces for their users; an interface value of theirs is one of these.
type (
	Decider interface {
		Allow(ctx context.Context, key string, limit client.Limit) (client.Result, error)
	}
	MultiDecider interface {
		AllowAll(ctx context.Context, rules []client.Rule) (client.Result, error)
	}
	EachDecider interface {
		AllowAllEach(ctx context.Context, rules []client.Rule, n int64) (client.Result, []client.Result, error)
	}
	Acquirer interface {
		Acquire(ctx context.Context, key string, c client.Concurrency) (*client.Lease, client.Result, error)
	}
)

// Set is a policy's limits for one call, split into those enforced, decided at once all or
// nothing, and those in shadow, decided beside them and only counted.
type Set struct {
	Enforced, Shadow             []client.Rule
	EnforcedQuotas, ShadowQuotas []Quota
}

// Add adds the limit l named name on key, taking cost units (0: one) counted in unit.
func (s *Set) Add(name, key string, l client.Limit, cost int64, unit string, shadow bool) {
	if shadow {
		s.Shadow = append(s.Shadow, client.Rule{Key: key, Limit: l, Cost: cost})
		s.ShadowQuotas = append(s.ShadowQuotas, Quota{name, l, unit})
	} else {
		s.Enforced = append(s.Enforced, client.Rule{Key: key, Limit: l, Cost: cost})
		s.EnforcedQuotas = append(s.EnforcedQuotas, Quota{name, l, unit})
	}
}

// AlsoKey is the key of a further limit named also, of a policy named name whose key is key
// ("name:principal"), when the limit has no Key of its own: its name on the same principal.
func AlsoKey(name, also, key string) string { return also + key[len(name):] }

// Limits are a policy's limits for one call, as Split reads them through a transport.
type Limits struct {
	Name  string       // the policy's
	Key   string       // the call's key of the policy, "Name:principal"
	Limit client.Limit // the policy's own; nil: none
	Unit  string
	// HasCost: Limit's cost comes from a Cost function (an estimate, with an outcome)
	HasCost bool
	Shadow  bool // the whole policy is in shadow for this key
	Outcome bool // the call is settled by its outcome
	// N further limits: Also(i) is each, and Principal(i) its own principal, asked only of
	// one with OwnKey. Cost(i) is what limit i takes of the call (-1: Limit), 0 for one,
	// asked only of a limit Split counts.
	N         int
	Also      func(i int) Named
	Cost      func(i int) int64
	Principal func(i int) (string, error)
	// ShadowKey gets the error of a Key that only shadow limits see: the call goes on without
	// that limit. EmptyKey is the transport's error of an empty principal.
	ShadowKey func(name string, err error)
	EmptyKey  error
}

// Split puts l's limits into s: the policy's own on its key, each further one on a key of its
// own ("Name:principal", the principal its Key returns, or the policy's), or with SameKey on
// the policy's key. A further limit's Key error refuses the call (err) unless only shadow
// limits see it. With an outcome it returns whether each enforced limit's cost is an estimate
// (a Cost function's), in the order of s.Enforced.
func (s *Set) Split(l *Limits) (measured []bool, err error) {
	if l.Limit != nil {
		s.Add(l.Name, l.Key, l.Limit, l.Cost(-1), l.Unit, l.Shadow)
		if l.Outcome && !l.Shadow {
			measured = append(measured, l.HasCost)
		}
	}
	for i := range l.N {
		rule := l.Also(i)
		k := l.Key
		switch {
		case rule.OwnKey:
			p, err := l.Principal(i)
			if err == nil && p == "" {
				err = l.EmptyKey
			}
			switch {
			case err != nil && (l.Shadow || rule.Shadow):
				l.ShadowKey(rule.Name, err)
				continue
			case err != nil:
				return nil, err
			}
			k = rule.Name + ":" + p
		case !rule.SameKey:
			k = AlsoKey(l.Name, rule.Name, l.Key)
		}
		s.Add(rule.Name, k, rule.Limit, l.Cost(i), rule.Unit, l.Shadow || rule.Shadow)
		if l.Outcome && !l.Shadow && !rule.Shadow {
			measured = append(measured, rule.HasCost)
		}
	}
	return measured, nil
}

// Decide decides rules, all or nothing, each taking its own Cost; noMulti is the error when
// there are several, or one of a Cost, and lim cannot decide them at once (a MultiDecider
// takes a rule's cost).
func Decide(ctx context.Context, lim Decider, rules []client.Rule, noMulti error) (client.Result, error) {
	if len(rules) == 1 && rules[0].Cost <= 1 {
		return lim.Allow(ctx, rules[0].Key, rules[0].Limit)
	}
	ml, ok := lim.(MultiDecider)
	if !ok {
		return client.Result{}, noMulti
	}
	return ml.AllowAll(ctx, rules)
}

// DecideEnforced decides s's enforced limits at once, each limit's state with them when lim
// can tell and the quota is shown, and returns the quotas the deciding one first, each in
// their order. The error may come with a decision that stands (DecisionStands).
func DecideEnforced(ctx context.Context, lim Decider, s *Set, hide bool, noMulti error) (client.Result, []client.Result, []Quota, error) {
	var res client.Result
	var each []client.Result
	var err error
	if el, ok := lim.(EachDecider); ok && len(s.Enforced) > 1 && !hide {
		// n 1: a rule without a Cost of its own takes one
		res, each, err = el.AllowAllEach(ctx, s.Enforced, 1)
	} else {
		res, err = Decide(ctx, lim, s.Enforced, noMulti)
	}
	quotas := s.EnforcedQuotas
	if err != nil && !DecisionStands(err) {
		return res, nil, quotas, err
	}
	if res.Rule != 0 && res.Rule < len(quotas) {
		// The limit that decided comes first in the values, the others in their order.
		quotas = DecidingFirst(quotas, res.Rule)
		if each != nil {
			each = DecidingFirst(each, res.Rule)
		}
	}
	return res, each, quotas, err
}

// DecideShadow decides shadow rules and names the limit that decided (of quotas, in the
// rules' order). The error may come with a decision that stands (DecisionStands).
func DecideShadow(ctx context.Context, lim Decider, rules []client.Rule, quotas []Quota, noMulti error) (res client.Result, name string, err error) {
	res, err = Decide(ctx, lim, rules, noMulti)
	name = quotas[0].Name
	if 0 <= res.Rule && res.Rule < len(quotas) {
		name = quotas[res.Rule].Name
	}
	return res, name, err
}

// RunShadow decides shadow rules beside a call and tells what to count: report gets an error
// that came with the decision (NotRefunded: the denial stands, and is counted) or instead of
// it (ShadowFailed: the call was served, nothing is counted), and denied the name of the limit
// that would have refused the call.
func RunShadow(ctx context.Context, lim Decider, rules []client.Rule, quotas []Quota, noMulti error,
	report func(kind Failure, name string, err error), denied func(name string)) {
	res, name, err := DecideShadow(ctx, lim, rules, quotas, noMulti)
	switch {
	case DecisionStands(err):
		report(NotRefunded, name, err)
	case err != nil:
		report(ShadowFailed, name, err)
		return
	}
	if !res.Allowed {
		denied(name)
	}
}
