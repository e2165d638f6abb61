package client

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/valkey-io/valkey-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/rlfn/rlfn/internal/keys"
	"github.com/rlfn/rlfn/internal/needs"
)

// hold.go: holds (library 1.3.0), units taken now under an id and given back at an expiry
// unless settled first, for work whose cost is known only at its end (a stream's tokens). A
// Hold's rules are grouped by Key as AllowAll groups them: a Key's rules are one call (rl_hold
// for a lone rule, else rl_multi with a hold group after each limit), several Keys side by side,
// and when one denies or fails, what the others took is given back. Settle is one
// rl_hold_settle per rule, a Key's pipelined. When the server cannot decide, the Fallback does,
// as for every call: LocalFallback takes the units from its local limiters and settles them
// there.

// HoldOptions says how long a hold lives and what becomes of it when it is never settled.
type HoldOptions struct {
	// ID is the hold's id on the server, 1 to 128 bytes; empty (the default): a random one (128
	// bits from crypto/rand). An ID that names a live hold of the same limits adds to it.
	ID string
	// TTL is required, > 0, whole milliseconds up to 10^11ms: the hold ends then unless settled
	// (or earlier, at its limiter's horizon: the end of a window, the time a bucket takes to
	// refill). Each Add renews it from then.
	TTL time.Duration
	// Keep: when the hold expires unsettled, its units stay charged (the caller is billed its
	// estimate). Default false: they are given back.
	Keep bool
}

// ErrHoldSettled is returned by Add and Settle of a Hold (and by a Meter's calls) that was
// settled already: a settle is not idempotent, and an add after it would take units no Settle
// gives back.
var ErrHoldSettled = errors.New("client: hold already settled")

// Hold is units held on the limits of several rules under one id (library 1.3.0), taken by
// Limiter.Hold: given back when it expires unless settled (Settle) at the amounts actually used.
// Its methods are safe for concurrent use.
type Hold struct {
	lim    *Limiter
	id     string
	ttlMs  int64
	keep   bool
	rules  int
	groups []holdGroup

	mu      sync.Mutex // Add and Settle one at a time: each reads and moves what is held
	settled bool
	meter   *Meter // the meter it belongs to: Limiter.Close settles it at what the meter used
}

// holdGroup is a Hold's rules of one Key, decided together.
type holdGroup struct {
	key   string
	rules []int  // indexes in the Hold's rules
	calls []call // the rules' limits; their cost is the estimate, each call sets its own
	parts []heldPart
	// unsure: a call on this Key was sent and not answered: the server may hold more under the
	// id than parts say. Settle then asks the server even for a rule it knows no hold of.
	unsure bool
}

// heldPart is what one rule holds, by where it is held.
type heldPart struct {
	srv    int64 // units the server's live hold holds for this Hold
	excess int64 // units that hold holds beyond srv: adds given back by a refund (another Key denied)
	past   int64 // units of the rule's earlier server holds that ended before Settle, and units taken without a hold
	loc    int64 // units LocalFallback took in its local limiter
	free   int64 // units FailOpen admitted without taking anything
	// expires is when the server's hold ends (the Limiter's clock, ns); 0 for none
	expires int64
}

func (p *heldPart) held() int64 { return p.past + p.srv + p.loc + p.free }

// Hold takes every rule's Cost (its estimate; zero means 1, as AllowAll) under one id, all or
// nothing, as AllowAll decides (rules of one Key in one rl_multi with hold groups, or rl_hold
// for a lone rule; several Keys side by side, the others' units given back when one denies).
// The Result is AllowAll's. Denied: h is nil and nothing is taken.
//
// A hold needs library 1.3.0 (a node that runs an older one answers a *VersionError, decided by
// the Fallback as every call the node cannot serve; under ReturnError it is returned, nothing
// taken). A SlidingLog cannot be held (*LimitError): its refunds remove the newest entries, not a
// hold's own. At most 8 rules of one Key (7 when one has a Penalty): each is two of rl_multi's
// 16 keys, the limit's and its hold key (<prefix>{<key>}:holds:<algorithm>[:<name>]).
//
// A hold taken while the server cannot decide is the Fallback's: LocalFallback takes the units
// from its local limiter (a share of the limit, see Options.Instances), where they stay until
// Settle gives them back (a local hold has no expiry: the local limiter forgets them as it
// forgets any admission, at its window's end or as its bucket refills); FailOpen admits
// without taking; FailClosed denies. The units of an unsettled hold whose process died come
// back by the server's expiry (TTL), unless Keep.
func (l *Limiter) Hold(ctx context.Context, rules []Rule, opt HoldOptions) (*Hold, Result, error) {
	h, res, _, err := l.hold(ctx, rules, opt)
	return h, res, err
}

// HoldEach is Hold that also reports each rule's own limiter, in rule order, as AllowAllEach
// does, from the same calls: a Key's rl_multi answers every limit's reply (library 1.3.0), so
// the state of every limit a response's headers show costs no call of its own. The decision
// and the binding Result are Hold's.
//
// each[i].Limit, Remaining and ResetAfter are rule i's limiter right after the decision (after
// the others' units were given back, when one Key denied); Allowed is whether that limit
// admitted its Cost, and when it did not, RetryAfter is its own wait. Rule is i; Source is
// FromFallback when the Fallback decided it. A rule whose state is unknown (its Key's call
// failed, with the error returned) is the zero Result, Limit 0.
func (l *Limiter) HoldEach(ctx context.Context, rules []Rule, opt HoldOptions) (*Hold, Result, []Result, error) {
	return l.hold(ctx, rules, opt)
}

func (l *Limiter) hold(ctx context.Context, rules []Rule, opt HoldOptions) (h *Hold, res Result, each []Result, err error) {
	if l.tel.tracing() {
		var end func(Result, error)
		ctx, end = l.holdSpan(ctx, opHold, len(rules))
		defer func() { end(res, err) }()
	}
	if h, err = l.newHold(ctx, rules, opt); err != nil {
		return nil, Result{}, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, Result{}, nil, err
	}
	costs := make([][]int64, len(h.groups))
	for i := range h.groups {
		g := &h.groups[i]
		costs[i] = make([]int64, len(g.calls))
		for j := range g.calls {
			costs[i][j] = g.calls[j].cost
		}
	}
	res, each, err = h.take(ctx, costs, true)
	if err != nil || !res.Allowed {
		return nil, res, each, err
	}
	l.holds.add(h)
	return h, res, each, nil
}

// newHold validates rules and opt, and makes the Hold, without a call.
func (l *Limiter) newHold(ctx context.Context, rules []Rule, opt HoldOptions) (*Hold, error) {
	id := opt.ID
	if id == "" {
		id = randomID()
	} else if len(id) > maxLeaseID {
		return nil, &LimitError{Field: "HoldOptions.ID", Reason: "must be 1 to " + strconv.Itoa(maxLeaseID) + " bytes"}
	}
	ttl, err := milliseconds("HoldOptions.TTL", opt.TTL)
	if err != nil {
		return nil, err
	}
	groups, err := l.groupRules(ctx, rules, 1)
	if err != nil {
		return nil, err
	}
	h := &Hold{lim: l, id: id, ttlMs: ttl, keep: opt.Keep, rules: len(rules), groups: make([]holdGroup, len(groups))}
	for i, g := range groups {
		for j, c := range g.calls {
			if c.alg == slidingLogAlg {
				return nil, &LimitError{Field: fmt.Sprintf("rules[%d].Limit", g.rules[j]), Reason: "is a SlidingLog, which cannot be held: its refunds remove the newest entries, not a hold's own"}
			}
		}
		keys := 2 * len(g.calls)
		if penaltyOf(g.calls) >= 0 {
			keys++
		}
		if keys > maxMulti {
			return nil, &LimitError{Field: fmt.Sprintf("rules[%d].Limit", g.rules[len(g.rules)-1]), Reason: fmt.Sprintf(
				"makes %d keys of Key %q in one rl_multi, more than %d: a held limit is two (its hold key), at most 8 per Key (7 with a Penalty)", keys, g.key, maxMulti)}
		}
		h.groups[i] = holdGroup{key: g.key, rules: g.rules, calls: g.calls, parts: make([]heldPart, len(g.calls))}
	}
	return h, nil
}

// ID is the hold's id on the server.
func (h *Hold) ID() string { return h.id }

// Held is the units held per rule, in rules' order: the estimate and every admitted Add, less
// nothing (a settled Hold keeps its last figures).
func (h *Hold) Held() []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.heldLocked()
}

func (h *Hold) heldLocked() []int64 {
	out := make([]int64, h.rules)
	for _, g := range h.groups {
		for j, r := range g.rules {
			out[r] = g.parts[j].held()
		}
	}
	return out
}

// Expires is the earliest expiry of its rules' holds on the server (the Limiter's clock); the
// zero Time when none is live there (a hold the Fallback took, or settled).
func (h *Hold) Expires() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	var first int64
	for _, g := range h.groups {
		for _, p := range g.parts {
			if p.expires != 0 && (first == 0 || p.expires < first) {
				first = p.expires
			}
		}
	}
	if first == 0 {
		return time.Time{}
	}
	return time.Unix(0, first)
}

// Add takes costs[i] more on rule i (len(costs) == len(rules); 0 takes nothing on that rule),
// all or nothing, renewing the hold (every rule's, from now for its TTL). Allowed false: nothing
// taken, the hold keeps what it held. The Result is AllowAll's.
//
// Across Keys, an Add that one Key denied is undone on the Keys that took it, each in one
// transaction (MULTI/EXEC: rl_hold_settle at 0, then rl_hold of what the hold held before,
// which is admitted: its units were just given back), so that every server hold counts exactly
// what its limit holds for it, and a process that dies before it settles gives back at expiry
// what it held, once (a bucket that refilled meanwhile is left a little emptier than a plain
// refund would leave it, as the settle's refund stops at full: stricter, never more
// permissive). Two cases differ. A transaction that failed keeps the Add's units taken until
// Settle or the hold's expiry (run or not, the hold and its limit agree): stricter for a while.
// A hold above its bucket's capacity (adds as it refilled) cannot be taken again whole: the
// Add is given back by its limit's refund while the hold keeps counting those units, given
// back a second time at its expiry if the process dies before it settles (at most what such
// refused Adds took, and only without Keep).
func (h *Hold) Add(ctx context.Context, costs []int64) (res Result, err error) {
	res, _, err = h.add(ctx, costs)
	return res, err
}

// add is Add that also returns each rule's own Result (its limit's Remaining: what it has left).
func (h *Hold) add(ctx context.Context, costs []int64) (res Result, each []Result, err error) {
	l := h.lim
	if l.tel.tracing() {
		var end func(Result, error)
		ctx, end = l.holdSpan(ctx, opHold, h.rules)
		defer func() { end(res, err) }()
	}
	per, err := h.perGroup("costs", costs)
	if err != nil {
		return Result{}, nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.settled {
		return Result{}, nil, ErrHoldSettled
	}
	if err := ctx.Err(); err != nil {
		return Result{}, nil, err
	}
	return h.take(ctx, per, false)
}

// perGroup checks amounts (one per rule, 0 to 999999999999999) and splits them by group.
func (h *Hold) perGroup(what string, amounts []int64) ([][]int64, error) {
	if len(amounts) != h.rules {
		return nil, &LimitError{Field: what, Reason: fmt.Sprintf("has %d amounts for %d rules", len(amounts), h.rules)}
	}
	for i, v := range amounts {
		if err := checkInt(fmt.Sprintf("%s[%d]", what, i), v, 0, maxInt); err != nil {
			return nil, err
		}
	}
	per := make([][]int64, len(h.groups))
	for i, g := range h.groups {
		per[i] = make([]int64, len(g.rules))
		for j, r := range g.rules {
			per[i][j] = amounts[r]
		}
	}
	return per, nil
}

// groupReply is what one Key's call answered for a hold.
type groupReply struct {
	res   Result   // the binding Result; Rule is the index in the group's calls
	each  []Result // each call's own reply
	held  []int64  // the server's hold per call after the call; nil when the Fallback decided
	exp   []int64  // ms until each of those holds expires
	sent  int64    // the Limiter's clock when the call was sent
	err   error
	taken bool // the units are taken (the Fallback's: LocalFallback's local limiter)
}

// take runs costs (per group, per call) on every group, all or nothing: the first call of a
// Hold (first) or an Add. Each group's parts move by what was taken; when a group denies or
// fails, the groups that took give it back. It returns the binding Result (Rule: the index in
// the Hold's rules) and each rule's own Result. h.mu is held, or h is not shared yet.
func (h *Hold) take(ctx context.Context, costs [][]int64, first bool) (Result, []Result, error) {
	l := h.lim
	replies := make([]groupReply, len(h.groups))
	inParallel(len(h.groups), func(i int) { replies[i] = h.takeGroup(ctx, &h.groups[i], costs[i]) })
	var firstErr error
	firstRule := h.rules
	results := make([]Result, 0, len(h.groups))
	each := make([]Result, h.rules)
	for i := range h.groups {
		g, r := &h.groups[i], &replies[i]
		if r.err != nil {
			if g.rules[0] < firstRule {
				firstErr, firstRule = r.err, g.rules[0]
			}
			continue
		}
		res := r.res
		res.Rule = g.rules[res.Rule]
		results = append(results, res)
		for j, e := range r.each {
			e.Rule = g.rules[j]
			each[g.rules[j]] = e
		}
	}
	var res Result
	if firstErr == nil {
		res, _ = binding(results)
	}
	if firstErr != nil || !res.Allowed {
		// Give back what the groups that admitted took, before anything else is read.
		inParallel(len(h.groups), func(i int) {
			if r := &replies[i]; r.err == nil && r.res.Allowed {
				h.undo(ctx, &h.groups[i], costs[i], r, first, each)
			}
		})
		if firstErr != nil {
			return Result{}, each, firstErr
		}
		return res, each, nil
	}
	for i := range h.groups {
		h.groups[i].moved(l, costs[i], &replies[i])
	}
	return res, each, nil
}

// moved records in g's parts what an admitted call took (costs, per call).
func (g *holdGroup) moved(l *Limiter, costs []int64, r *groupReply) {
	for j, cost := range costs {
		p := &g.parts[j]
		switch {
		case r.held == nil && r.taken:
			p.loc += cost
		case r.held == nil:
			p.free += cost
		case r.held[j] >= p.srv+p.excess+cost:
			// the live hold, renewed: what it holds beyond is a concurrent holder's of the same id
			p.srv = r.held[j] - p.excess
		default:
			// The hold had ended (its ttl or its limiter's horizon) and a new one began, or none
			// did (a horizon of now): the old hold's units, and those not held, are charged
			// outside it.
			p.past += max(0, p.srv+cost-r.held[j])
			p.srv, p.excess = r.held[j], 0
		}
		if r.held != nil {
			p.expires = 0
			if p.srv > 0 {
				p.expires = r.sent + r.exp[j]*int64(time.Millisecond)
			}
		}
	}
}

// undo gives back what g took in a decision that another group denied or failed: a Hold's
// first call ends its holds (settled at what they held before, nothing for a new one), an
// Add's is refunded by the limits' refunds, its holds keeping the units (excess) until Settle.
// each gets the rules' state after it, as AllowAll's does.
func (h *Hold) undo(ctx context.Context, g *holdGroup, costs []int64, r *groupReply, first bool, each []Result) {
	l := h.lim
	ctx = context.WithoutCancel(ctx)
	if r.held == nil {
		if r.taken {
			for j, c := range g.calls {
				c.cost = costs[j]
				if c.cost > 0 {
					after(each, g.rules[j], l.fallbackResult(opRefund, g.key, c, built{}), nil)
				}
			}
		}
		return
	}
	if first {
		actual := make([]int64, len(g.calls))
		for j := range actual {
			actual[j] = max(0, r.held[j]-costs[j])
		}
		// Not retried, as no settle is: a hold not ended here ends at its expiry.
		if rs, _, _, err := l.settleGroup(ctx, g, actual, h.id); err == nil {
			for j, s := range rs {
				after(each, g.rules[j], s, nil)
			}
		}
		return
	}
	type refund struct {
		j int
		c call
	}
	var todo []refund
	var redo []int
	for j, c := range g.calls {
		switch prev := r.held[j] - costs[j]; {
		case costs[j] <= 0:
		case prev >= 0 && prev <= c.limit:
			redo = append(redo, j)
		default:
			// A hold above its bucket's capacity (adds as it refilled) could not be taken
			// again whole: its limit's refund gives the units back, and its hold keeps them
			// (excess) until Settle.
			c.cost = costs[j]
			todo = append(todo, refund{j, c})
			g.parts[j].excess += costs[j]
		}
	}
	if len(redo) > 0 {
		h.unAdd(ctx, g, redo, costs, r, each)
	}
	kinds := make([]errKind, len(todo))
	errs := make([]error, len(todo))
	inParallel(len(todo), func(i int) {
		var res Result
		res, kinds[i], errs[i] = l.refundAtServer(ctx, g.key, todo[i].c)
		after(each, g.rules[todo[i].j], res, errs[i])
	})
	// A refund the server could not make is tried again as AllowAll's are; one lost leaves
	// the units charged (excess counts them as held either way: stricter, never more
	// permissive).
	l.settleRefunds(ctx, errs, kinds, func(i int) (string, *call, time.Duration) {
		return g.key, &todo[i].c, min(max(r.res.ResetAfter, 0), maxOwedFor)
	})
}

// unAdd undoes the Add of costs on g's calls js, which another Key refused, so that their
// server holds stay what they were: in one transaction (MULTI/EXEC) on the Key, each hold is
// settled at 0 (its units given back, the Add's with them) and taken again at what it held
// before (rl_hold, reserve 0: the units were just given back, so it is admitted, and ends at
// the same horizon). A plain refund would leave the hold counting the Add's units, given back
// a second time at its expiry if the process died before it settled. When the transaction
// fails, nothing is lost either way: run or not, each hold counts exactly what its limit holds
// for it (the Add's units too, when it did not run), which Settle or the expiry gives back.
func (h *Hold) unAdd(ctx context.Context, g *holdGroup, js []int, costs []int64, r *groupReply, each []Result) {
	l := h.lim
	sent := l.clock()
	a, kind, err := l.begin(ctx, g.key, needs.V13, sent)
	if err != nil {
		g.unsure = true
		l.tel.countError(ctx, multiSubject, opRefund, kind)
		return
	}
	keepArg := "0"
	if h.keep {
		keepArg = "1"
	}
	rctx, rel := l.withDeadline(ctx, l.mono(sent))
	cmds := []valkey.Completed{l.vk.B().Multi().Build()}
	type step struct{ j, settle, hold int } // indexes in the EXEC's replies; hold -1: none
	steps := make([]step, len(js))
	n := 0
	for i, j := range js {
		c := g.calls[j]
		prev := r.held[j] - costs[j]
		var b cmdArgs
		b.buf = make([]byte, 0, 192)
		c.cost = 0
		b.held(l, g.key, &c)
		b.add(h.id)
		ks, args := b.strings(2)
		cmds = append(cmds, l.vk.B().Fcall().Function("rl_hold_settle").Numkeys(2).Key(ks...).Arg(args...).Build())
		steps[i] = step{j, n, -1}
		n++
		if prev > 0 {
			var b cmdArgs
			b.buf = make([]byte, 0, 192)
			c.cost, c.reserve = prev, 0
			b.held(l, g.key, &c)
			b.add(h.id)
			b.num(h.ttlMs)
			b.add(keepArg)
			ks, args := b.strings(2)
			cmds = append(cmds, l.vk.B().Fcall().Function("rl_hold").Numkeys(2).Key(ks...).Arg(args...).Build())
			steps[i].hold = n
			n++
		}
	}
	cmds = append(cmds, l.vk.B().Exec().Build())
	rs := l.vk.DoMulti(rctx, cmds...)
	var replies []valkey.ValkeyMessage
	for _, x := range rs[:len(rs)-1] {
		if err = rel.result(x).Error(); err != nil {
			break
		}
	}
	if err == nil {
		replies, err = rel.result(rs[len(rs)-1]).ToArray()
	}
	if err != nil {
		err = replyErr("rl_hold_settle", err)
	} else if len(replies) != n {
		err = &replyError{Function: "rl_hold_settle", Reason: fmt.Sprintf("a transaction of %d calls answered %d", n, len(replies))}
	}
	rel.release()
	now := sent
	if err != nil {
		now = l.clock()
	}
	if kind = l.settle(ctx, a, multiSubject, opRefund, Result{Allowed: true}, err, now); kind != kindNone {
		g.unsure = true // run or not: Settle asks the server
		l.tel.countError(ctx, multiSubject, opRefund, kind)
		return
	}
	for _, st := range steps {
		p := &g.parts[st.j]
		v, err := decodeInts("rl_hold_settle", valkey.NewResult(replies[st.settle], nil), 8)
		var res Result
		if err == nil {
			res, err = sixOf("rl_hold_settle", v)
		}
		if err != nil {
			g.unsure = true
			after(each, g.rules[st.j], Result{}, err)
			continue
		}
		held, exp := int64(0), int64(0)
		if st.hold >= 0 {
			if v, err = decodeInts("rl_hold", valkey.NewResult(replies[st.hold], nil), 8); err == nil {
				res, err = sixOf("rl_hold", v)
			}
			if err != nil || !res.Allowed {
				// Given back and not taken again (a server that refused the same arguments
				// it just took): the units the hold held are free, as a FailOpen admission's.
				g.unsure = true
				p.free += p.srv
				p.srv, p.excess, p.expires = 0, 0, 0
				after(each, g.rules[st.j], res, err)
				continue
			}
			held, exp = v[6], v[7]
		}
		if held >= p.srv+p.excess {
			p.srv = held - p.excess
		} else {
			// the hold had ended before the Add (as moved says it): its units are charged
			// outside it
			p.past += max(0, p.srv-held)
			p.srv, p.excess = held, 0
		}
		p.expires = 0
		if held > 0 {
			p.expires = sent + exp*int64(time.Millisecond)
		}
		after(each, g.rules[st.j], res, nil)
	}
}

// takeGroup takes costs (per call) under the hold on g's Key: at the server through its
// breaker, or when the server cannot decide, by the Fallback (all or nothing, as failMulti).
func (h *Hold) takeGroup(ctx context.Context, g *holdGroup, costs []int64) groupReply {
	l := h.lim
	cs := make([]call, len(g.calls))
	for j, c := range g.calls {
		c.cost = costs[j]
		cs[j] = c
	}
	sent := l.clock()
	a, kind, err := l.begin(ctx, g.key, needs.V13, sent)
	if err != nil {
		if kind == kindVersion && l.fallback == ReturnError {
			err = forCall(err, holdNeeds(cs), needs.V13)
		}
		return h.fallBack(ctx, g, cs, kind, err)
	}
	r := l.serverHold(ctx, g.key, cs, h.id, h.ttlMs, h.keep, sent)
	now := sent
	if r.err != nil {
		now = l.clock()
	}
	subject := multiSubject
	if len(cs) == 1 {
		subject = cs[0].alg.id
	}
	if r.err == nil {
		a.series = l.tel.series(ctx, subject, decidedBy(cs, r.res.Rule))
	}
	kind = l.settle(ctx, a, subject, opHold, r.res, r.err, now)
	if kind == kindNone {
		a.br.forgetOld(needs.V13)
		if a.dropLocal {
			for _, c := range cs {
				l.local.drop(keys.Append(nil, l.prefix, g.key, c.alg.name, c.name), sent, now)
			}
		}
		return r
	}
	if kind == kindTimeout || kind == kindUnreachable || kind == kindCanceled {
		g.unsure = true // sent, perhaps made
	}
	if !kind.failure() {
		l.tel.countError(ctx, subject, opHold, kind)
		return groupReply{err: r.err}
	}
	return h.fallBack(ctx, g, cs, kind, r.err)
}

// fallBack is the Fallback's decision on a group's calls (cs) the server could not decide.
func (h *Hold) fallBack(ctx context.Context, g *holdGroup, cs []call, kind errKind, err error) groupReply {
	l := h.lim
	each := make([]Result, len(cs))
	res, i, err := l.failMulti(ctx, opAllow, g.key, cs, kind, err, each)
	if err != nil {
		return groupReply{err: err}
	}
	res.Rule = i
	return groupReply{res: res, each: each, taken: l.fallback == LocalFallback}
}

// holdNeeds names what a hold on one Key relies on, for a *VersionError.
func holdNeeds(cs []call) string {
	if len(cs) == 1 && cs[0].penalty == 0 {
		return "rl_hold"
	}
	return "rl_multi hold"
}

// holdKey appends c's hold key on key: <prefix>{<key>}:holds:<algorithm>[:<name>], so that no
// limit's Name can make it (a name follows the algorithm).
func (l *Limiter) holdKey(buf []byte, key string, c *call) []byte {
	buf = keys.Append(buf, l.prefix, key, "holds", c.alg.name)
	if c.name != "" {
		buf = append(append(buf, ':'), c.name...)
	}
	return buf
}

// cmdArgs collects a command's keys and arguments in one buffer, converted to one string that
// they slice: one allocation for all of them, as command does.
type cmdArgs struct {
	buf  []byte
	ends []int
}

func (a *cmdArgs) end()         { a.ends = append(a.ends, len(a.buf)) }
func (a *cmdArgs) add(s string) { a.buf = append(a.buf, s...); a.end() }
func (a *cmdArgs) num(v int64)  { a.buf = appendInt(a.buf, v); a.end() }
func (a *cmdArgs) group(c *call) {
	a.add(c.alg.name)
	a.buf, a.ends = c.appendArgs(a.buf, a.ends)
	a.num(c.reserve)
}

// held adds the keys and the limit group of c's call on key given its hold key (rl_hold,
// rl_hold_settle): its limiter's key, its hold key, its limit group.
func (a *cmdArgs) held(l *Limiter, key string, c *call) {
	a.buf = keys.Append(a.buf, l.prefix, key, c.alg.name, c.name)
	a.end()
	a.buf = l.holdKey(a.buf, key, c)
	a.end()
	a.group(c)
}

// strings slices the buffer into its keys (the first nkeys) and arguments.
func (a *cmdArgs) strings(nkeys int) (keys, args []string) {
	s := string(a.buf)
	parts := make([]string, len(a.ends))
	from := 0
	for i, end := range a.ends {
		parts[i] = s[from:end]
		from = end
	}
	return parts[:nkeys], parts[nkeys:]
}

// serverHold runs cs under the hold id on key: rl_hold for a lone call without a Penalty,
// else rl_multi with a hold group after each limit (the principal's block group last) and
// replies, so that each limit's own reply and its hold come back in the one call.
func (l *Limiter) serverHold(ctx context.Context, key string, cs []call, id string, ttlMs int64, keep bool, sent int64) groupReply {
	ctx, rel := l.withDeadline(ctx, l.mono(sent))
	defer rel.release()
	r := groupReply{sent: sent}
	keepArg := "0"
	if keep {
		keepArg = "1"
	}
	var a cmdArgs
	a.buf = make([]byte, 0, 256)
	penalty := penaltyOf(cs)
	if len(cs) == 1 && penalty < 0 {
		a.held(l, key, &cs[0])
		a.add(id)
		a.num(ttlMs)
		a.add(keepArg)
		ks, args := a.strings(2)
		v, err := decodeInts("rl_hold", rel.result(l.vk.Do(ctx, l.vk.B().Fcall().Function("rl_hold").Numkeys(2).Key(ks...).Arg(args...).Build())), 8)
		if err == nil {
			r.res, err = sixOf("rl_hold", v)
		}
		if err == nil && (v[6] < 0 || v[7] < 0) {
			err = &replyError{Function: "rl_hold", Reason: fmt.Sprintf("held %d, expires_after_ms %d", v[6], v[7])}
		}
		if err != nil {
			if olderLibrary(err) {
				err = l.versionError(rel.wrapped(ctx), "rl_hold", ks[0], needs.V13, err)
			}
			r.err = err
			return r
		}
		r.res.Blocked = false
		r.each, r.held, r.exp = []Result{r.res}, []int64{v[6]}, []int64{v[7]}
		return r
	}
	for i := range cs {
		a.buf = keys.Append(a.buf, l.prefix, key, cs[i].alg.name, cs[i].name)
		a.end()
		a.buf = l.holdKey(a.buf, key, &cs[i])
		a.end()
	}
	groups := 2 * len(cs)
	if penalty >= 0 {
		a.buf = keys.Append(a.buf, l.prefix, key, blockAlg.name, "")
		a.end()
		groups++
	}
	for i := range cs {
		a.group(&cs[i])
		a.add("hold")
		a.add(id)
		a.num(ttlMs)
		a.add(keepArg)
	}
	if penalty >= 0 {
		a.add(blockAlg.name)
		a.num(penalty)
	}
	a.add("replies")
	ks, args := a.strings(groups)
	v, err := decodeInts("rl_multi", rel.result(l.vk.Do(ctx, l.vk.B().Fcall().Function("rl_multi").Numkeys(int64(groups)).Key(ks...).Arg(args...).Build())), 7+6*groups)
	if err != nil {
		if olderLibrary(err) {
			err = l.versionError(rel.wrapped(ctx), holdNeeds(cs), ks[0], needs.V13, err)
		}
		r.err = err
		return r
	}
	if r.res, err = sixOf("rl_multi", v); err != nil {
		r.err = err
		return r
	}
	idx := v[6]
	if idx < 1 || idx > int64(groups) || idx <= int64(2*len(cs)) && idx%2 == 0 {
		r.err = &replyError{Function: "rl_multi", Reason: fmt.Sprintf("binding index %d of %d groups, not a limit's", idx, groups)}
		return r
	}
	r.each, r.held, r.exp = make([]Result, len(cs)), make([]int64, len(cs)), make([]int64, len(cs))
	for i := range cs {
		o := 7 + 12*i
		if r.each[i], err = sixOf("rl_multi", v[o:o+6]); err != nil {
			r.err = err
			return r
		}
		r.each[i].Delay = 0
		r.held[i], r.exp[i] = v[o+8], v[o+10]
		if r.held[i] < 0 || r.exp[i] < 0 {
			r.err = &replyError{Function: "rl_multi", Reason: fmt.Sprintf("hold group %d: held %d, expires_after_ms %d", i+1, r.held[i], r.exp[i])}
			return r
		}
	}
	if idx > int64(2*len(cs)) {
		r.res.Blocked = true
		return r
	}
	r.res.Rule = int(idx-1) / 2
	r.res.Blocked = penalty > 0 && !r.res.Allowed
	return r
}

// settleGroup ends id's hold of g's calls at actual (per call; -1: not asked), one
// rl_hold_settle per call, pipelined, through the Key's breaker. It is never retried, nor
// decided by the Fallback: a hold the server did not settle ends at its expiry. It returns each
// call's reply (the zero Result for those not asked) and the units each charged.
func (l *Limiter) settleGroup(ctx context.Context, g *holdGroup, actual []int64, id string) ([]Result, []int64, errKind, error) {
	out := make([]Result, len(g.calls))
	charged := make([]int64, len(g.calls))
	var asked []int
	for j, v := range actual {
		if v >= 0 {
			asked = append(asked, j)
		}
	}
	if len(asked) == 0 {
		return out, charged, kindNone, nil
	}
	subject := multiSubject
	if len(asked) == 1 {
		subject = g.calls[asked[0]].alg.id
	}
	sent := l.clock()
	a, kind, err := l.begin(ctx, g.key, needs.V13, sent)
	if err != nil {
		l.tel.countError(ctx, subject, opSettle, kind)
		return out, charged, kind, err
	}
	var res Result
	err = func() error {
		rctx, rel := l.withDeadline(ctx, l.mono(sent))
		defer rel.release()
		cmds := make([]valkey.Completed, len(asked))
		limKeys := make([]string, len(asked))
		for i, j := range asked {
			c := g.calls[j]
			c.cost = actual[j]
			var b cmdArgs
			b.buf = make([]byte, 0, 192)
			b.held(l, g.key, &c)
			b.add(id)
			ks, args := b.strings(2)
			limKeys[i] = ks[0]
			cmds[i] = l.vk.B().Fcall().Function("rl_hold_settle").Numkeys(2).Key(ks...).Arg(args...).Build()
		}
		var first error
		for i, reply := range l.vk.DoMulti(rctx, cmds...) {
			j := asked[i]
			v, err := decodeInts("rl_hold_settle", rel.result(reply), 8)
			if err == nil {
				out[j], err = sixOf("rl_hold_settle", v)
			}
			if err == nil && (v[6] < 0 || v[7] < -1) {
				err = &replyError{Function: "rl_hold_settle", Reason: fmt.Sprintf("held %d, expires_after_ms %d", v[6], v[7])}
			}
			if err != nil {
				if olderLibrary(err) {
					err = l.versionError(rel.wrapped(rctx), "rl_hold_settle", limKeys[i], needs.V13, err)
				}
				first = cmp.Or(first, err)
				continue
			}
			charged[j] = v[6]
			res = out[j]
		}
		return first
	}()
	now := sent
	if err != nil {
		now = l.clock()
	} else {
		a.series = l.tel.series(ctx, subject, &g.calls[asked[0]].spec)
	}
	kind = l.settle(ctx, a, subject, opSettle, res, err, now)
	if kind == kindNone {
		a.br.forgetOld(needs.V13)
	} else {
		l.tel.countError(ctx, subject, opSettle, kind)
	}
	return out, charged, kind, err
}

// Settle ends the hold at the actual amounts per rule (len(actual) == len(rules), 0 to
// 999999999999999): it gives back the difference, or takes the extra as far as each limit has
// room, leaving its Reserve (Result.Allowed false when some extra did not fit: a budget is
// never exceeded). Each rule is settled by one rl_hold_settle, a Key's pipelined, Keys side by
// side. After Settle the hold is done, whatever it returns: a second Settle or an Add is
// ErrHoldSettled. The Result is the binding one over the rules, as AllowAll's: Limit,
// Remaining and ResetAfter describe each limit after the settle.
//
// A settle is not idempotent: it is never retried, and runs whatever happens to ctx (its
// values are kept, its end is not), within the Limiter's deadline. A rule whose settle the
// server could not make keeps its hold until the hold's expiry, which gives its units back (or
// leaves them charged, with Keep): its error (the first in rule order) is returned under
// ReturnError; under another Fallback its Result is FromFallback, and the errors metric counts
// it. An error the server answered (RLERR: its key holds something else) is always returned.
// The part of a hold LocalFallback took is settled in the local limiter. A hold that expired before
// Settle (its TTL, or its limiter's horizon) charges nothing more: its units came back, or
// stayed charged with Keep.
func (h *Hold) Settle(ctx context.Context, actual []int64) (res Result, err error) {
	l := h.lim
	if l.tel.tracing() {
		var end func(Result, error)
		ctx, end = l.holdSpan(ctx, opSettle, h.rules)
		defer func() { end(res, err) }()
	}
	per, err := h.perGroup("actual", actual)
	if err != nil {
		return Result{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.settled {
		return Result{}, ErrHoldSettled
	}
	h.settled = true
	l.holds.remove(h)
	return h.settleAll(context.WithoutCancel(ctx), per)
}

// settleAll settles every group at actual (per group, per call). h.mu is held.
func (h *Hold) settleAll(ctx context.Context, actual [][]int64) (Result, error) {
	errs := make([]error, len(h.groups))
	each := make([]Result, h.rules)
	inParallel(len(h.groups), func(i int) { errs[i] = h.settleGroup(ctx, &h.groups[i], actual[i], each) })
	var firstErr error
	firstRule := h.rules
	for i, err := range errs {
		if err != nil && h.groups[i].rules[0] < firstRule {
			firstErr, firstRule = err, h.groups[i].rules[0]
		}
	}
	if firstErr != nil {
		return Result{}, firstErr
	}
	res, b := binding(each)
	res.Rule = b
	return res, nil
}

// settleGroup settles g's calls at actual: each call's part at the server by rl_hold_settle,
// its local part (LocalFallback's) in the local limiter. each gets every rule's Result.
func (h *Hold) settleGroup(ctx context.Context, g *holdGroup, actual []int64, each []Result) error {
	l := h.lim
	asked := make([]int64, len(g.calls))
	for j := range g.calls {
		p, c := &g.parts[j], g.calls[j]
		// Units that earlier holds charged are billed already; of the rest, the local part
		// first (it was taken when the server could not), then the server's hold, which takes
		// any extra.
		rest := max(0, actual[j]-p.past)
		local := min(rest, p.loc)
		srv := rest - local
		asked[j] = -1
		atServer := p.srv > 0 || p.excess > 0 || g.unsure
		if atServer {
			asked[j] = srv + p.excess
		}
		r := Result{Allowed: true, Limit: c.limit, Rule: g.rules[j]}
		if l.fallback == LocalFallback && p.loc > 0 {
			if p.loc > local {
				c.cost = p.loc - local
				r = l.fallbackResult(opRefund, g.key, c, built{})
			}
			if !atServer && srv > 0 {
				// an extra with no hold at the server: taken locally, as far as there is room
				room := l.fallbackResult(opPeek, g.key, callWith(c, 0), built{}).Remaining
				r = l.fallbackResult(opAllow, g.key, callWith(c, min(srv, room)), built{})
				r.Allowed = room >= srv
			}
		} else if !atServer && srv > 0 {
			r.Allowed = false // nothing holds it any more: the expiry decided
		}
		r.Rule = g.rules[j]
		each[g.rules[j]] = r
	}
	rs, _, kind, err := l.settleGroup(ctx, g, asked, h.id)
	for j, v := range asked {
		p := &g.parts[j]
		switch {
		case v < 0:
		case err == nil:
			r := rs[j]
			r.Rule = g.rules[j]
			each[g.rules[j]] = r
		default:
			// Not settled: the server's hold ends at its expiry, which gives its units back
			// (or keeps them, with Keep), and charges no extra.
			each[g.rules[j]] = Result{Allowed: v <= p.srv+p.excess, Limit: g.calls[j].limit, Source: FromFallback, Rule: g.rules[j]}
		}
		p.expires = 0
	}
	if err != nil && kind.failure() && l.fallback != ReturnError {
		// The server could not settle: what it holds comes back at its expiry, as the
		// Fallback's decisions come back at their limiters' reset. The caller has nothing to
		// do about it; the errors metric and the breaker have it.
		return nil
	}
	return err
}

// callWith is c costing n.
func callWith(c call, n int64) call {
	c.cost = n
	return c
}

// openHolds are the Holds a Limiter took and that are not settled yet: Close settles them.
type openHolds struct {
	mu      sync.Mutex
	m       map[*Hold]struct{}
	sweepAt int // the size at which add drops the holds that have surely ended
}

func (o *openHolds) add(h *Hold) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m, o.sweepAt = map[*Hold]struct{}{}, 1024
	}
	if len(o.m) >= o.sweepAt {
		// Holds their callers never settled: those held only at the server, and expired
		// there, have nothing left for Close to settle.
		now := h.lim.clock()
		for x := range o.m {
			if x.ended(now) {
				delete(o.m, x)
			}
		}
		o.sweepAt = max(1024, 2*len(o.m))
	}
	o.m[h] = struct{}{}
}

func (o *openHolds) remove(h *Hold) {
	o.mu.Lock()
	delete(o.m, h)
	o.mu.Unlock()
}

// ended reports a hold with nothing left to settle: no local part, no server hold that may be
// live at now. It does not wait for h.mu (a hold being added to or settled is not ended).
func (h *Hold) ended(now int64) bool {
	if !h.mu.TryLock() {
		return false
	}
	defer h.mu.Unlock()
	for _, g := range h.groups {
		if g.unsure {
			return false
		}
		for _, p := range g.parts {
			if p.loc > 0 || p.srv > 0 && p.expires > now {
				return false
			}
		}
	}
	return true
}

// closeHolds settles, within ctx, every hold the Limiter took and nobody settled: a Meter's at
// what it used (Meter.Close), any other as its expiry would, sooner: given back, or with Keep
// charged at what it holds.
func (l *Limiter) closeHolds(ctx context.Context) error {
	l.holds.mu.Lock()
	open := make([]*Hold, 0, len(l.holds.m))
	for h := range l.holds.m {
		open = append(open, h)
	}
	l.holds.mu.Unlock()
	errs := make([]error, len(open))
	inParallel(len(open), func(i int) {
		h := open[i]
		h.mu.Lock()
		m := h.meter
		h.mu.Unlock()
		if m != nil {
			errs[i] = m.Close(ctx)
			return
		}
		actual := make([]int64, h.rules)
		if h.keep {
			actual = h.Held()
		}
		if _, err := h.Settle(ctx, actual); err != nil && !errors.Is(err, ErrHoldSettled) {
			errs[i] = err
		}
	})
	return errors.Join(errs...)
}

// randomID is a hold's or a lease's id: 128 bits from crypto/rand, so that ids never collide
// across processes.
func randomID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// holdSpan starts the span of a Hold's call (op: opHold for Limiter.Hold and Add, opSettle),
// and returns the function that ends it with the call's outcome.
func (l *Limiter) holdSpan(ctx context.Context, op operation, rules int) (context.Context, func(Result, error)) {
	ctx, span := l.tel.tracer.Start(ctx, spanNames[op], trace.WithSpanKind(trace.SpanKindClient))
	return ctx, func(res Result, err error) {
		attrs := []attribute.KeyValue{attribute.String("rlfn.operation", opNames[op]), attribute.Int("rlfn.rules", rules)}
		if err == nil {
			attrs = append(attrs, attribute.Int("rlfn.rule", res.Rule))
		}
		l.endSpan(span, attrs, res, err)
		span.End()
	}
}
