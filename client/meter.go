package client

import (
	"context"
	"fmt"
	"math"
	"sync"
)

// meter.go: a stream metered as it runs, on top of a Hold. The meter holds the estimate and
// hands units out of what is held without a call; when they run out it adds a batch, which
// grows (the estimate, then doubling), so that a stream of any length costs a handful of
// calls; when a batch is refused, it takes what the limits have left (a few tries under
// contention), and the stream ends there. Settle (or Close) bills what was used.

// MeterOptions: a stream metered as it runs, on top of a Hold.
type MeterOptions struct {
	Hold HoldOptions // the hold's id, TTL (required) and Keep
	// PerUnit is what one metered unit costs each rule (len == len(rules)), 0 to
	// 999999999999999; 0: nothing (a request count). At least one rule costs something per unit.
	PerUnit []int64
	// Base is the units each rule is charged whatever the stream does (input tokens, the
	// request); nil: none. A rule's Cost is its estimate: Base[i] + the expected units *
	// PerUnit[i]. The units the meter may use without a call (Granted) are, over the rules
	// with PerUnit > 0, min((held_i - Base_i) / PerUnit_i).
	Base []int64
	// Batch is the units taken from the server at once beyond what is held; 0 (the default):
	// grows, the estimate (Granted at the start, at least 1), then twice the last batch.
	// Either way a batch is at least what a Take lacks, and at most what the limits had left at
	// the last reply, when that is more than the Take lacks.
	Batch int64
}

// Meter is a stream metered on a Hold (Limiter.Meter): Take reports units as the stream uses
// them, Settle or Close bills what it used. Its methods are safe for concurrent use.
type Meter struct {
	h     *Hold
	per   []int64
	base  []int64
	batch int64

	mu      sync.Mutex
	used    int64
	granted int64
	next    int64 // the next batch, when Batch is 0
	left    int64 // units the limits had left at the last reply; -1: unknown
	spent   bool  // a batch was refused and what was left taken: no more calls
	done    bool  // settled
	res     Result
}

// Meter holds every rule's Cost (the estimate) and returns a meter that draws units as the
// stream reports them, from what is held, taking more from the server in batches (a 4,000-unit
// stream with an estimate of 500 costs 5 calls: the hold, three batches, the settle). Denied:
// m is nil, nothing taken; the Result is Hold's.
//
// The meter never lets its limits exceed what they allow: what it grants was taken under the
// hold first. A process that dies mid-stream leaves its hold to expire (HoldOptions.TTL), which
// gives the units back (or keeps them charged, with Keep); Limiter.Close settles its open
// meters at what they used (Meter.Close). Under LocalFallback, batches the server cannot decide
// are taken from the local limiters (see Limiter.Hold).
func (l *Limiter) Meter(ctx context.Context, rules []Rule, opt MeterOptions) (*Meter, Result, error) {
	m, res, _, err := l.meter(ctx, rules, opt)
	return m, res, err
}

// MeterEach is Meter that also reports each rule's own limiter, in rule order, from the same
// calls, as HoldEach does for its hold.
func (l *Limiter) MeterEach(ctx context.Context, rules []Rule, opt MeterOptions) (*Meter, Result, []Result, error) {
	return l.meter(ctx, rules, opt)
}

func (l *Limiter) meter(ctx context.Context, rules []Rule, opt MeterOptions) (*Meter, Result, []Result, error) {
	if len(opt.PerUnit) != len(rules) {
		return nil, Result{}, nil, &LimitError{Field: "MeterOptions.PerUnit", Reason: fmt.Sprintf("has %d costs for %d rules", len(opt.PerUnit), len(rules))}
	}
	metered := false
	for i, v := range opt.PerUnit {
		if err := checkInt(fmt.Sprintf("MeterOptions.PerUnit[%d]", i), v, 0, maxInt); err != nil {
			return nil, Result{}, nil, err
		}
		metered = metered || v > 0
	}
	if !metered {
		return nil, Result{}, nil, &LimitError{Field: "MeterOptions.PerUnit", Reason: "is 0 for every rule: nothing to meter (take a Hold)"}
	}
	if opt.Base != nil && len(opt.Base) != len(rules) {
		return nil, Result{}, nil, &LimitError{Field: "MeterOptions.Base", Reason: fmt.Sprintf("has %d amounts for %d rules", len(opt.Base), len(rules))}
	}
	for i, v := range opt.Base {
		if err := checkInt(fmt.Sprintf("MeterOptions.Base[%d]", i), v, 0, maxInt); err != nil {
			return nil, Result{}, nil, err
		}
	}
	if err := checkInt("MeterOptions.Batch", opt.Batch, 0, maxInt); err != nil {
		return nil, Result{}, nil, err
	}
	h, res, each, err := l.hold(ctx, rules, opt.Hold)
	if err != nil || !res.Allowed {
		return nil, res, each, err
	}
	m := &Meter{h: h, per: opt.PerUnit, base: opt.Base, batch: opt.Batch, left: -1, res: res}
	if m.base == nil {
		m.base = make([]int64, len(rules))
	}
	m.granted = m.units(h.Held())
	m.next = max(1, m.granted)
	h.mu.Lock()
	h.meter = m
	h.mu.Unlock()
	return m, res, each, nil
}

// units is how many metered units amounts (per rule) pay for: min over the rules with PerUnit
// > 0 of (amount - Base) / PerUnit, not below 0.
func (m *Meter) units(amounts []int64) int64 {
	u := int64(math.MaxInt64)
	for i, per := range m.per {
		if per > 0 {
			u = min(u, max(0, amounts[i]-m.base[i])/per)
		}
	}
	return u
}

// costs is what n units cost each rule, capped at the library's largest cost.
func (m *Meter) costs(n int64) []int64 {
	out := make([]int64, len(m.per))
	for i, per := range m.per {
		if per > 0 && n > maxInt/per {
			out[i] = maxInt
			continue
		}
		out[i] = n * per
	}
	return out
}

// Take reports n (>= 0) more units used. It returns false when the budget ran out: the units
// up to the budget were granted (Granted says how many in total), and the caller cuts the
// stream; Result then names the limit that ran out. A Take within what is held costs no call;
// one beyond adds a batch to the hold (see MeterOptions.Batch). When a batch is refused, the
// meter takes what the limits have left, as the refusal's reply says it: exactly that much (up
// to the batch), tried again while a reply says units are left, at most 3 calls (other streams
// take from the same limits in between); from then on a Take beyond what is granted returns
// false without a call.
//
// An error is the Add's (the server failed and the Fallback is ReturnError, or ctx ended):
// the units stay reported (Used), not granted.
func (m *Meter) Take(ctx context.Context, n int64) (bool, error) {
	if err := checkInt("n", n, 0, maxInt); err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done {
		return false, ErrHoldSettled
	}
	m.used = min(m.used+n, maxInt)
	if m.used <= m.granted {
		return true, nil
	}
	if m.spent {
		return false, nil
	}
	need := m.used - m.granted
	b := m.batch
	if b == 0 {
		b = m.next
	}
	if m.left >= 0 && b > m.left {
		b = m.left // no more than the limits had left: that batch would be refused
	}
	b = max(b, need)
	res, each, err := m.h.add(ctx, m.costs(b))
	if err != nil {
		return false, err
	}
	m.left = m.leftOf(each)
	m.res = res
	if res.Allowed {
		m.granted += b
		m.next = 2 * b
		return true, nil
	}
	// Refused: what the limits have left, as each reply says it. Under contention another
	// stream may take it first (refused again, with less left) or give some back (admitted,
	// with more left): a few tries end a shared budget within a few units of its limit.
	want := b
	for range maxLeftTries {
		u := min(m.leftOf(each), want)
		if u <= 0 {
			break
		}
		var r Result
		if r, each, err = m.h.add(ctx, m.costs(u)); err != nil {
			return false, err
		}
		m.left = m.leftOf(each)
		if r.Allowed {
			m.granted += u
			if want -= u; want == 0 {
				break
			}
			continue
		}
		m.res = r
	}
	if want > 0 {
		m.spent = true
	} else {
		m.next = 2 * b // the whole batch came, in parts: the budget has not run out
	}
	return m.used <= m.granted, nil
}

// maxLeftTries bounds the calls a refused batch's Take makes for what the limits have left.
const maxLeftTries = 3

// Result is the Result of the meter's last decision at the server (its hold, or a batch of a
// Take): after a Take that returned false, the refusal's, whose Rule names the limit that ran
// out (an index in the Meter's rules, as AllowAll's).
func (m *Meter) Result() Result {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.res
}

// leftOf is the units the limits have left by each (a decision's rules' own Results): the
// fewest over the rules with PerUnit > 0 whose state is known; -1 when none is.
func (m *Meter) leftOf(each []Result) int64 {
	u := int64(-1)
	for i, per := range m.per {
		if per > 0 && i < len(each) && each[i].Limit > 0 {
			v := each[i].Remaining / per
			if u < 0 || v < u {
				u = v
			}
		}
	}
	return u
}

// Used is the units reported by Take.
func (m *Meter) Used() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used
}

// Granted is the units the meter may use without another call: what its hold pays for.
func (m *Meter) Granted() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.granted
}

// Hold is the meter's Hold (its id, what it holds, when it expires).
func (m *Meter) Hold() *Hold { return m.h }

// Settle ends the meter with the actual amount per rule (from the response's usage), as
// Hold.Settle does. After it, Take, Settle and Close return ErrHoldSettled (Close: nil).
func (m *Meter) Settle(ctx context.Context, actual []int64) (Result, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done {
		return Result{}, ErrHoldSettled
	}
	m.done = true
	return m.h.Settle(ctx, actual)
}

// Close settles (unless settled) each rule at Base[i] + Used()*PerUnit[i]: a stream cut or
// abandoned is billed what it used (an extra beyond what is held as far as the limits have
// room). A settled Meter's Close returns nil.
func (m *Meter) Close(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done {
		return nil
	}
	m.done = true
	actual := m.costs(m.used)
	for i := range actual {
		actual[i] = min(maxInt, actual[i]+m.base[i])
	}
	_, err := m.h.Settle(ctx, actual)
	return err
}
