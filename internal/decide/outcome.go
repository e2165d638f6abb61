package decide

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/rlfn/rlfn/client"
)

// Settler is what counting by outcome needs of the Limiter, as *client.Limiter has it.
type Settler interface {
	AllowN(ctx context.Context, key string, limit client.Limit, n int64) (client.Result, error)
	PeekN(ctx context.Context, key string, limit client.Limit, n int64) (client.Result, error)
	Refund(ctx context.Context, key string, limit client.Limit, n int64) (client.Result, error)
}

var _ Settler = (*client.Limiter)(nil)

// PeekAll answers whether each of rules would admit its cost now (Cost, or 1), consuming
// nothing: the "check first" half of counting only failures. The reply is the refusing rule's
// with the longest wait (Never above all), else the one with the fewest remaining; Rule is
// its index.
func PeekAll(ctx context.Context, lim Settler, rules []client.Rule) (client.Result, error) {
	var out client.Result
	for i, r := range rules {
		res, err := PeekN(ctx, lim, r.Name, r.Key, r.Limit, max(r.Cost, 1))
		if err != nil {
			return client.Result{}, err
		}
		res.Rule = i
		switch {
		case i == 0:
			out = res
		case !res.Allowed && out.Allowed:
			out = res
		case !res.Allowed && !out.Allowed:
			if out.RetryAfter != client.Never && (res.RetryAfter == client.Never || res.RetryAfter > out.RetryAfter) {
				out = res
			}
		case res.Allowed && out.Allowed && res.Remaining < out.Remaining:
			out = res
		}
	}
	return out, nil
}

// Owed is what each rule of a decision costs by the call's outcome: nothing when the call does
// not count; when it does, the cost reported after the fact (reported true) for the rules
// whose cost it is (measured: Split.Metered); else what each took. checkFirst says the
// decision took nothing (it peeked). It returns taken and owed, per rule.
func Owed(rules []client.Rule, measured []bool, checkFirst, counts bool, reported int64, ok bool) (taken, owed []int64) {
	taken, owed = make([]int64, len(rules)), make([]int64, len(rules))
	for i, r := range rules {
		cost := max(r.Cost, 1)
		if !checkFirst {
			taken[i] = cost
		}
		switch {
		case !counts:
		case ok && measured[i]:
			owed[i] = reported
		default:
			owed[i] = cost
		}
	}
	return taken, owed
}

// Settle brings what each of rules took, taken[i] units (0 when the call was only peeked), to
// owed[i]: it gives the difference back (Refund), or takes more (AllowN). A charge the limit
// cannot hold in full takes what is left, so the limit ends empty: the call was served, and
// the excess is not carried over. Nothing is retried: a refund is not idempotent, and a
// charge sent twice would count twice. The errors of every rule are joined.
func Settle(ctx context.Context, lim Settler, rules []client.Rule, taken, owed []int64) error {
	var errs []error
	for i, r := range rules {
		var err error
		switch {
		case owed[i] < taken[i]:
			_, err = Refund(ctx, lim, r.Name, r.Key, r.Limit, taken[i]-owed[i])
		case owed[i] > taken[i]:
			err = charge(ctx, lim, r, owed[i]-taken[i])
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// charge takes n units of r after the fact, or what is left of them.
func charge(ctx context.Context, lim Settler, r client.Rule, n int64) error {
	res, err := AllowN(ctx, lim, r.Name, r.Key, r.Limit, n)
	if err != nil || res.Allowed || res.Remaining <= 0 {
		return err
	}
	_, err = AllowN(ctx, lim, r.Name, r.Key, r.Limit, min(res.Remaining, n))
	return err
}

// ParseCost reads a cost a handler reported (a header or trailer value): a decimal integer
// from 0 to 999999999999999, spaces around it allowed.
func ParseCost(v string) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n < 0 || n > maxSFInteger {
		return 0, false
	}
	return n, true
}
