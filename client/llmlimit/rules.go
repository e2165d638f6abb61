package llmlimit

import (
	"context"
	"errors"
	"math/bits"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/decide"
)

// meter is what a request needs of the meter that holds its estimate (a *client.Meter): draw
// output tokens as they stream, then settle.
type meter interface {
	Take(ctx context.Context, n int64) (bool, error)
	// Result is the meter's last decision: after a Take that returned false, its Rule is the
	// limit that ran out.
	Result() client.Result
	Settle(ctx context.Context, actual []int64) (client.Result, error)
}

// meterSpec is a meter's options (client.MeterOptions): what a metered output token costs
// each rule, and what each is charged whatever the stream does.
type meterSpec struct {
	perUnit, base []int64
	ttl           time.Duration
}

// opener opens the meter of a request: holds every rule's Cost, all or nothing. A
// *client.Limiter is one (limiter.go: MeterEach, from the same calls); tests have their own.
// each, when not nil, is every rule's Result, in rules' order.
type opener interface {
	open(ctx context.Context, rules []client.Rule, spec meterSpec) (m meter, res client.Result, each []client.Result, err error)
}

// plan is the rules of one request, and what each counts.
type plan struct {
	api    API
	rules  []client.Rule
	dims   []dim
	budget []int // the Budget of each rule, an index of Options.Budgets
	price  Price
	spec   meterSpec
}

// errTooLarge is a request whose estimate no limit can take.
var errTooLarge = errors.New("llmlimit: the request's estimate is above 999999999999999 units")

// errNoPrice is a request for a model without a price, when a Spend limit needs one.
var errNoPrice = errors.New("llmlimit: the model has no price")

// plan builds the rules of a request whose principals (one per Budget) are keys, its input
// estimated at in tokens and its output at out: each rule's Cost is its estimate, Base what it
// is charged whatever the stream does, PerUnit what an output token costs it.
func (m *Middleware) plan(req *Request, keys []string, in, out int64) (*plan, error) {
	p := &plan{api: req.API, spec: meterSpec{ttl: m.opts.HoldTTL}}
	spend := false
	for i := range m.opts.Budgets {
		spend = spend || m.opts.Budgets[i].Spend != nil
	}
	if spend {
		price, ok := m.opts.Prices[req.Model]
		if !ok {
			return nil, errNoPrice
		}
		p.price = price.filled(m.opts.CachedFree)
	}
	for i := range m.opts.Budgets {
		b := &m.opts.Budgets[i]
		key := b.Name + ":" + keys[i]
		for d, l := range b.limits() {
			if l == nil {
				continue
			}
			var base, per int64
			switch dim(d) {
			case dimRequests:
				base = 1
			case dimTokens:
				base, per = in, 1
			case dimInput:
				base = in
			case dimOutput:
				per = 1
			case dimSpend:
				base, per = mul(in, p.price.Input), p.price.Output
			}
			cost := add(base, mul(out, per))
			if decide.BadCost(base) || decide.BadCost(cost) {
				return nil, errTooLarge
			}
			p.rules = append(p.rules, client.Rule{Key: key, Limit: l, Cost: cost, Name: b.Name + "." + names[d]})
			p.dims = append(p.dims, dim(d))
			p.budget = append(p.budget, i)
			p.spec.base = append(p.spec.base, base)
			p.spec.perUnit = append(p.spec.perUnit, per)
		}
	}
	return p, nil
}

// actual is what each rule is charged for a response that used u.
func (p *plan) actual(u Usage, cachedFree bool) []int64 {
	in := u.Input + u.CacheWrite
	if !cachedFree {
		in += u.CacheRead
	}
	out := make([]int64, len(p.rules))
	for i, d := range p.dims {
		var n int64
		switch d {
		case dimRequests:
			n = 1
		case dimTokens:
			n = add(in, u.Output)
		case dimInput:
			n = in
		case dimOutput:
			n = u.Output
		case dimSpend:
			n = add(add(mul(u.Input, p.price.Input), mul(u.CacheRead, p.price.CacheRead)),
				add(mul(u.CacheWrite, p.price.CacheWrite), mul(u.Output, p.price.Output)))
		}
		out[i] = min(n, decide.MaxCost)
	}
	return out
}

// filled is p with its defaults: a cache read or write at the Input price, a cache read free
// when cachedFree.
func (p Price) filled(cachedFree bool) Price {
	if p.CacheRead == 0 {
		p.CacheRead = p.Input
	}
	if p.CacheWrite == 0 {
		p.CacheWrite = p.Input
	}
	if cachedFree {
		p.CacheRead = 0
	}
	return p
}

// mul is a*b for a, b ≥ 0, saturating above decide.MaxCost (which the caller refuses).
func mul(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > decide.MaxCost {
		return decide.MaxCost + 1
	}
	return int64(lo)
}

// add is a+b for a, b ≥ 0, saturating likewise.
func add(a, b int64) int64 {
	if a > decide.MaxCost || b > decide.MaxCost || a+b > decide.MaxCost {
		return decide.MaxCost + 1
	}
	return a + b
}
