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

// MaxCost is the largest cost a limit takes, the library's bound on every number.
const MaxCost = 999_999_999_999_999

// BadCost reports a cost no limit can take: negative, or above MaxCost. A Cost function
// computes it from the call (a max_tokens its client sent), so it is the call's fault, answered
// as a bad request, never the service's misconfiguration.
func BadCost(n int64) bool { return n < 0 || n > MaxCost }

// Set is a policy's limits for one call, split into those enforced, decided at once all or
// nothing, and those in shadow, decided beside them and only counted.
type Set struct {
	Enforced, Shadow             []client.Rule
	EnforcedQuotas, ShadowQuotas []Quota
}

// Add adds the limit l named name on key, taking cost units (0: one) counted in unit.
func (s *Set) Add(name, key string, l client.Limit, cost int64, unit string, shadow bool) {
	if shadow {
		s.Shadow = append(s.Shadow, client.Rule{Key: key, Limit: l, Cost: cost, Name: name})
		s.ShadowQuotas = append(s.ShadowQuotas, Quota{name, l, unit})
	} else {
		s.Enforced = append(s.Enforced, client.Rule{Key: key, Limit: l, Cost: cost, Name: name})
		s.EnforcedQuotas = append(s.EnforcedQuotas, Quota{name, l, unit})
	}
}

// AlsoKey is the key of a further limit named also, of a policy named name whose key is key
// ("name:principal"), when the limit has no Key of its own: its name on the same principal.
func AlsoKey(name, also, key string) string { return also + key[len(name):] }

// Split puts a policy's limits for one call into its Set: the policy's own (Own), then each
// further one (Key, then Add), whose Key the transport asks. With an outcome, Measured says
// whether each enforced limit's cost is an estimate (a Cost function's), in Set.Enforced's
// order.
type Split struct {
	Set      Set
	Measured []bool
	costed   bool   // a limit of the policy, in shadow or not, has a Cost function
	name     string // the policy's
	key      string // the call's key of the policy, "name:principal"
	shadow   bool   // the whole policy is in shadow for this key
	outcome  bool   // the call is settled by its outcome
}

// NewSplit starts the split of the limits of a policy named name for a call whose key of the
// policy is key.
func NewSplit(name, key string, shadow, outcome bool) Split {
	return Split{name: name, key: key, shadow: shadow, outcome: outcome}
}

// Own adds the policy's own limit l, taking cost units (0: one) counted in unit; hasCost says
// the cost came from a Cost function.
func (sp *Split) Own(l client.Limit, cost int64, unit string, hasCost bool) {
	sp.Set.Add(sp.name, sp.key, l, cost, unit, sp.shadow)
	sp.costed = sp.costed || hasCost
	if sp.outcome && !sp.shadow {
		sp.Measured = append(sp.Measured, hasCost)
	}
}

// Key is the key of a further limit: "Name:principal", with the principal its own Key returned
// (principal, keyErr: asked only of a rule with OwnKey) or the policy's; with SameKey the
// policy's key itself. A Key error (or an empty principal, emptyKey) refuses the call (err)
// unless only shadow limits see it: then skip is that error, and the limit is left out.
func (sp *Split) Key(rule Named, principal string, keyErr, emptyKey error) (key string, skip, err error) {
	sp.costed = sp.costed || rule.HasCost // a limit left out for its key is the policy's all the same
	switch {
	case rule.OwnKey:
		if keyErr == nil && principal == "" {
			keyErr = emptyKey
		}
		switch {
		case keyErr != nil && (sp.shadow || rule.Shadow):
			return "", keyErr, nil
		case keyErr != nil:
			return "", nil, keyErr
		}
		return rule.Name + ":" + principal, nil, nil
	case rule.SameKey:
		return sp.key, nil, nil
	}
	return AlsoKey(sp.name, rule.Name, sp.key), nil, nil
}

// Add adds further limit rule on key (Key's), taking cost units (0: one).
func (sp *Split) Add(rule Named, key string, cost int64) {
	sp.Set.Add(rule.Name, key, rule.Limit, cost, rule.Unit, sp.shadow || rule.Shadow)
	if sp.outcome && !sp.shadow && !rule.Shadow {
		sp.Measured = append(sp.Measured, rule.HasCost)
	}
}

// Metered says, for each enforced limit in Set.Enforced's order, whether its cost is the one
// measured during or after the call (an outcome's reported cost, a meter's units): the
// limits with a Cost function, or every limit when none of the policy's has one. A policy's
// limits in shadow count: a Cost on a shadow limit alone (the tokens of "calls and tokens"
// being rolled out) leaves every enforced limit its own cost, rather than making the calls'
// limit count the tokens in its place.
func (sp *Split) Metered() []bool {
	if sp.costed {
		return sp.Measured
	}
	all := make([]bool, len(sp.Measured))
	for i := range all {
		all[i] = true
	}
	return all
}

// Decide decides rules, all or nothing, each taking its own Cost; noMulti is the error when
// there are several, or one of a Cost, and lim cannot decide them at once (a MultiDecider
// takes a rule's cost).
func Decide(ctx context.Context, lim Decider, rules []client.Rule, noMulti error) (client.Result, error) {
	if len(rules) == 1 && rules[0].Cost <= 1 {
		return Allow(ctx, lim, rules[0].Name, rules[0].Key, rules[0].Limit)
	}
	ml, ok := lim.(MultiDecider)
	if !ok {
		return client.Result{}, noMulti
	}
	return ml.AllowAll(ctx, rules)
}

// DecideEnforced decides s's enforced limits at once, each limit's state with them when lim
// can tell and the quota is shown, and returns the quotas the deciding one first, each in
// their order.
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
	if err != nil {
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
// rules' order).
func DecideShadow(ctx context.Context, lim Decider, rules []client.Rule, quotas []Quota, noMulti error) (res client.Result, name string, err error) {
	res, err = Decide(ctx, lim, rules, noMulti)
	name = quotas[0].Name
	if 0 <= res.Rule && res.Rule < len(quotas) {
		name = quotas[res.Rule].Name
	}
	return res, name, err
}

// RunShadow decides shadow rules beside a call and tells what to count: report gets an error
// that left it without a decision (ShadowFailed: the call was served, nothing is counted), and
// denied the name of the limit that would have refused the call.
func RunShadow(ctx context.Context, lim Decider, rules []client.Rule, quotas []Quota, noMulti error,
	report func(kind Failure, name string, err error), denied func(name string)) {
	res, name, err := DecideShadow(ctx, lim, rules, quotas, noMulti)
	if err != nil {
		report(ShadowFailed, name, err)
		return
	}
	if !res.Allowed {
		denied(name)
	}
}
