package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/internal/keys"
	"github.com/rlfn/rlfn/internal/needs"
)

// maxMulti is how many limits one rl_multi call takes (MAX_MULTI).
const maxMulti = 16

// maxMultiArgs bounds the keys and arguments of one rl_multi: a key and at most 8 items (a
// calendar group's) per limit, the block's key and 2 items, and replies.
const maxMultiArgs = maxMulti*9 + 4

// group is the rules of one Key.
type group struct {
	key   string
	rules []int  // indexes in rules
	calls []call // one per rule
	res   Result
	err   error
	each  []Result // AllowAllEach: each call's own state, for a group of several calls
	// decided: the group was sent (or its Fallback decided it). A decision across keys that a
	// group denied leaves the groups after it undecided: they took nothing.
	decided bool
	// kept: its node cannot refund (library 1.0.0), so what it took stays taken when another
	// group denies.
	kept bool
	// peeked: not decided, but peeked for AllowAllEach: res and each are its state, which
	// is not refunded.
	peeked bool
	hinted bool // its key's last answer said it would deny (decideAcross)
}

// all decides rules (AllowAllN, PeekAllN), under a span of its own when traced; each, when
// not nil, gets every rule's own state (AllowAllEach).
func (l *Limiter) all(ctx context.Context, op operation, rules []Rule, n int64, each []Result) (Result, error) {
	if l.tel.tracing() {
		return l.tracedAll(ctx, op, rules, n, each)
	}
	return l.decideAll(ctx, op, rules, n, each)
}

func (l *Limiter) decideAll(ctx context.Context, op operation, rules []Rule, n int64, each []Result) (Result, error) {
	groups, err := l.groupRules(ctx, rules, n)
	if err != nil {
		return Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	across := op == opAllow && len(groups) > 1
	if across {
		// The refunds that make several keys all or nothing exist from library 1.1.0: a key's
		// single rule, which 1.0 would serve, must be refused there before it takes anything.
		// (Several rules of a key are an rl_multi call, 1.1.0 already.)
		for i := range groups {
			if len(groups[i].calls) == 1 {
				groups[i].calls[0].refundable = true
			}
		}
	}
	// ask decides g with op (or peeks it, for a peek): one call for its Key.
	ask := func(g *group, op operation) {
		var i int
		if len(g.calls) == 1 {
			c := g.calls[0]
			if op == opPeek {
				c.refundable = false // a peek takes nothing to refund
			}
			g.res, g.err = l.decide(ctx, op, g.key, c, built{})
		} else {
			if each != nil {
				g.each = make([]Result, len(g.calls))
			}
			g.res, i, g.err = l.decideMulti(ctx, op, g.key, g.calls, g.each, penaltyOf(g.calls), 0)
		}
		g.res.Rule = g.rules[i]
	}
	run := func(g *group) {
		g.decided = true
		ask(g, op)
	}
	switch {
	case len(groups) == 1:
		run(&groups[0])
	case !across:
		l.runGroups(groups, anyGroup, run)
	default:
		l.decideAcross(groups, run)
		// A denial ended the decision before these groups were asked: a peek of each tells
		// whether it would have denied too, and how long for, so that RetryAfter is the
		// longest wait as ever (a client told too short a wait comes back to be refused
		// again), and AllowAllEach reports every limit. The refusal costs the server one
		// call per key, as an admission does.
		l.runGroups(groups, anyGroup, func(g *group) {
			g.peeked = true
			ask(g, opPeek)
		})
	}
	var firstErr error
	firstRule := len(rules)
	results := make([]Result, 0, len(groups))
	for i := range groups {
		g := &groups[i]
		switch {
		case g.peeked && g.err == nil:
			// A denial ended the decision before this key was asked: what its peek says
			// counts for the denial's RetryAfter (the longest wait) and ResetAfter.
			results = append(results, g.res)
		case !g.decided:
		case g.err != nil:
			if g.rules[0] < firstRule {
				firstErr, firstRule = g.err, g.rules[0]
			}
		default:
			results = append(results, g.res)
		}
	}
	var res Result
	if firstErr == nil {
		var b int
		res, b = binding(results)
		res.Rule = results[b].Rule
	}
	if each != nil {
		for i := range groups {
			g := &groups[i]
			switch {
			case !g.decided && !g.peeked || g.err != nil:
			case len(g.calls) == 1:
				each[g.rules[0]] = g.res
			default:
				for j, r := range g.each {
					if r.Limit == 0 {
						continue // not read
					}
					if g.res.Allowed {
						r.Allowed, r.RetryAfter = true, 0
					}
					r.Delay, r.Rule = 0, g.rules[j]
					each[g.rules[j]] = r
				}
				// The binding limit's reply is known whatever its peek read: it decided.
				b := &each[g.res.Rule]
				if b.Limit == 0 {
					*b = g.res
					b.Delay = 0
				}
				if !g.res.Allowed {
					b.Allowed, b.RetryAfter = false, g.res.RetryAfter
				}
			}
		}
	}
	setOverrides(groups, &res, each)
	if op == opAllow && (firstErr != nil || !res.Allowed) {
		l.compensate(ctx, groups, each)
	}
	if firstErr != nil {
		return Result{}, firstErr
	}
	return res, nil
}

// decideAcross decides the groups of a decision across keys, whose admitted groups are refunded
// when another denies, in an order that spares the server those refunds:
//
//   - groups whose key's last answer said it would deny the next such call (see hints) go
//     first, on their own: under an attack on one principal, its refusals cost one call, not
//     one per key and a refund;
//   - then the others, side by side, unless a first one denied or failed;
//   - a group whose node cannot refund (library 1.0.0, found by a call refused before it took
//     anything) is decided by the node as 1.0 decides it, one such group at a time (hinted
//     ones first, right after their phase), and the first denial ends the decision. What
//     those took before a later denial stays taken (kept): stricter for a while, never more
//     permissive, and no limit the node can decide is handed to the Fallback.
func (l *Limiter) decideAcross(groups []group, run func(*group)) {
	h := l.hints()
	now := l.clock()
	keys := make([][]byte, len(groups)) // each group's hint key
	hinted := 0
	for i := range groups {
		keys[i] = l.hintKey(&groups[i])
		if groups[i].hinted = h.denies(keys[i], now); groups[i].hinted {
			hinted++
		}
	}
	stopped := func() bool {
		for i := range groups {
			g := &groups[i]
			if g.decided && !l.olderNode(g) && (g.err != nil || !g.res.Allowed) {
				return true
			}
		}
		return false
	}
	// asOld decides, one at a time, the groups of the phase that a node refused for want of
	// refunds, until one denies or fails.
	asOld := func(phase func(*group) bool) {
		for i := range groups {
			g := &groups[i]
			if !phase(g) || !g.decided || !l.olderNode(g) {
				continue
			}
			g.decided, g.err, g.calls[0].refundable = false, nil, false
			if !stopped() {
				run(g)
				g.kept = true
			}
		}
	}
	isHinted := func(g *group) bool { return g.hinted }
	if hinted > 0 && hinted < len(groups) {
		l.runGroups(groups, isHinted, run)
		asOld(isHinted)
		if !stopped() {
			l.runGroups(groups, func(g *group) bool { return !g.hinted }, run)
		}
	} else {
		l.runGroups(groups, anyGroup, run)
	}
	asOld(anyGroup)
	now = l.clock()
	for i := range groups {
		if g := &groups[i]; g.decided && g.err == nil && g.res.Source != FromFallback {
			h.note(keys[i], g.res, g.cost(), now)
		}
	}
}

// cost is the cost of g's call that decided (its res.Rule): what its hint judges the next
// call by.
func (g *group) cost() int64 {
	for j, r := range g.rules {
		if r == g.res.Rule {
			return g.calls[j].cost
		}
	}
	return g.calls[0].cost
}

// runGroups runs side by side the groups that which selects, of those not decided (nor peeked)
// yet.
func (l *Limiter) runGroups(groups []group, which func(*group) bool, run func(*group)) {
	var sem chan struct{} // nil while the groups are few: most decisions are
	if len(groups) > maxFanOut {
		sem = make(chan struct{}, maxFanOut)
	}
	var wg sync.WaitGroup
	for i := range groups {
		if g := &groups[i]; !g.decided && !g.peeked && which(g) {
			if sem == nil {
				wg.Go(func() { run(g) })
				continue
			}
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				run(g)
			})
		}
	}
	wg.Wait()
}

// maxFanOut is the most calls of one decision across keys (or of its refunds) in flight at
// once. Each call's deadline runs from when it is sent: a decision of a thousand keys sent at
// once would queue its own calls behind each other on the connections until the last ones ran
// out of their deadlines, and those timeouts, the batch's own doing, would open the breaker
// for every caller of the node. In waves of maxFanOut, no call of a batch waits behind more
// than maxFanOut-1 of its own, and the other callers' calls behind no more than that either.
const maxFanOut = 32

// inParallel runs fn(0) to fn(n-1) side by side, at most maxFanOut at once, and returns when
// all have.
func inParallel(n int, fn func(i int)) {
	var wg sync.WaitGroup
	if n <= maxFanOut {
		for i := range n {
			wg.Go(func() { fn(i) })
		}
		wg.Wait()
		return
	}
	sem := make(chan struct{}, maxFanOut)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			fn(i)
		})
	}
	wg.Wait()
}

func anyGroup(*group) bool { return true }

// olderNode reports a group that a node refused only because its library cannot refund
// (1.0.0): its single call is one 1.0 decides (no reserve), marked refundable by AllowAll, and
// the Fallback is not ReturnError (which returns the error: see fail).
func (l *Limiter) olderNode(g *group) bool {
	var ve *VersionError
	c := &g.calls[0]
	return l.fallback != ReturnError && len(g.calls) == 1 && c.refundable && c.reserve == 0 &&
		c.alg.since == needs.V10 && c.penalty == 0 && errors.As(g.err, &ve) && ve.Version != ""
}

// groupRules validates rules and groups them by Key, in the order of their first rule.
func (l *Limiter) groupRules(ctx context.Context, rules []Rule, n int64) ([]group, error) {
	if len(rules) == 0 {
		return nil, &LimitError{Field: "rules", Reason: "must not be empty"}
	}
	if len(rules) > l.maxRules {
		// Before anything is read of them: a refusal of a hostile batch costs nothing more.
		return nil, &LimitError{Field: "rules", Reason: fmt.Sprintf("are %d, more than the %d Options.MaxRules allows", len(rules), l.maxRules)}
	}
	if err := checkCost(n); err != nil {
		return nil, err
	}
	var groups []group
	byKey := map[string]int{}
	for i, r := range rules {
		if err := l.checkKey(r.Key); err != nil {
			return nil, err
		}
		if err := checkLimit(r.Limit); err != nil {
			// which rule: several may have the same type (formatted only here: a valid rule
			// costs no allocation for it)
			le, ok := err.(*LimitError)
			switch {
			case !ok:
				return nil, err
			case isNil(r.Limit):
				return nil, &LimitError{Field: fmt.Sprintf("rules[%d].Limit", i), Reason: le.Reason}
			}
			return nil, &LimitError{Field: fmt.Sprintf("rules[%d] %s", i, le.Field), Reason: le.Reason}
		}
		c := call{spec: r.Limit.spec(), cost: n}
		c.label = r.Name
		if r.Cost != 0 {
			if err := checkInt(fmt.Sprintf("rules[%d].Cost", i), r.Cost, 0, maxInt); err != nil {
				return nil, err
			}
			c.cost = r.Cost
		}
		l.override(&c, r.Key)
		c.judgeReserve(ctx)
		if err := l.bound(&c); err != nil {
			return nil, err
		}
		gi, ok := byKey[r.Key]
		if !ok {
			gi = len(groups)
			byKey[r.Key] = gi
			groups = append(groups, group{key: r.Key})
		}
		g := &groups[gi]
		for j, o := range g.calls {
			if o.alg == c.alg && o.name == c.name {
				return nil, &LimitError{Field: fmt.Sprintf("rules[%d].Limit", i), Reason: fmt.Sprintf(
					"has the Key, algorithm and Name of rules[%d]: one limiter cannot be two (give one a Name)", g.rules[j])}
			}
		}
		if len(g.calls) == maxMulti || len(g.calls) == maxMulti-1 && (c.penalty > 0 || penaltyOf(g.calls) >= 0) {
			if len(g.calls) < maxMulti {
				return nil, &LimitError{Field: fmt.Sprintf("rules[%d].Limit", i), Reason: fmt.Sprintf(
					"is the 16th rule of Key %q: at most %d per key when one has a Penalty (the key's block is one more)", r.Key, maxMulti-1)}
			}
			return nil, &LimitError{Field: fmt.Sprintf("rules[%d].Limit", i), Reason: fmt.Sprintf("is the 17th rule of Key %q: at most %d per key", r.Key, maxMulti)}
		}
		g.rules = append(g.rules, i)
		g.calls = append(g.calls, c)
	}
	return groups, nil
}

// compensate refunds what the admitted groups took: another group denied or failed. The
// refunds run whatever happens to ctx (they are owed), each within the Limiter's deadline, at
// most maxFanOut at once. Those the server could not make are the Limiter's from then on (see
// refund.go): tried again in the background, or counted as lost and logged; never the caller's
// error. each, when not nil, gets each refunded rule's state after its refund.
func (l *Limiter) compensate(ctx context.Context, groups []group, each []Result) {
	ctx = context.WithoutCancel(ctx)
	type refund struct {
		g *group
		j int // the call's index in g.calls
	}
	var todo []refund
	for i := range groups {
		g := &groups[i]
		if !g.decided || g.kept || g.err != nil || !g.res.Allowed {
			continue
		}
		for j, c := range g.calls {
			switch {
			case c.cost == 0:
			case g.res.Source == FromFallback:
				// The Fallback admitted without the server, which took nothing: a refund there
				// would give back units other requests took. LocalFallback took them locally.
				if l.fallback == LocalFallback {
					after(each, g.rules[j], l.fallbackResult(opRefund, g.key, c, built{}), nil)
				}
			default:
				todo = append(todo, refund{g, j})
			}
		}
	}
	kinds := make([]errKind, len(todo))
	errs := make([]error, len(todo))
	inParallel(len(todo), func(i int) {
		r := todo[i]
		res, kind, err := l.refundAtServer(ctx, r.g.key, r.g.calls[r.j])
		after(each, r.g.rules[r.j], res, err)
		kinds[i], errs[i] = kind, err
	})
	l.settleRefunds(ctx, errs, kinds, func(i int) (string, *call, time.Duration) {
		r := todo[i]
		// Tried again until its limiter would have given the units back by itself.
		return r.g.key, &r.g.calls[r.j], min(max(r.g.res.ResetAfter, 0), maxOwedFor)
	})
}

// after records in each[rule] (when each is not nil) the state a refund of the rule's admitted
// call left: it is Allowed, the limit admitted the call, even when each[rule] was not read (a
// failed peek of its key's rl_multi): the refund has read it.
func after(each []Result, rule int, refund Result, err error) {
	if each == nil {
		return
	}
	if err != nil {
		each[rule] = Result{}
		return
	}
	r := &each[rule]
	r.Limit, r.Remaining, r.ResetAfter = refund.Limit, refund.Remaining, refund.ResetAfter
	r.Allowed, r.RetryAfter, r.Rule = true, 0, rule
	if refund.Source == FromFallback {
		r.Source = FromFallback
	}
}

// binding is the Result of several decisions, as rl_multi picks it: when any denies, the
// denier with the longest RetryAfter (Never is the longest); else the one with the fewest
// Remaining; ties to the first. ResetAfter is the longest of all, Delay the longest when
// admitted; FromFallback if any was decided by the Fallback.
func binding(results []Result) (Result, int) {
	b := 0
	allowed := true
	var reset, delay time.Duration
	local := false
	for i, r := range results {
		reset, delay, local = max(reset, r.ResetAfter), max(delay, r.Delay), local || r.Source == FromFallback
		switch {
		case !r.Allowed:
			if allowed || r.RetryAfter > results[b].RetryAfter {
				b = i
			}
			allowed = false
		case allowed && r.Remaining < results[b].Remaining:
			b = i
		}
	}
	res := results[b]
	res.ResetAfter = reset
	if local {
		res.Source = FromFallback
	}
	res.Delay = 0
	if allowed {
		res.Delay = delay
	}
	return res, b
}

// decideMulti decides the calls of one key with rl_multi (rl_multi_peek), or, when the server
// cannot, by the Fallback. It returns the binding Result and its index in cs. each, when not
// nil, gets each call's own state (see serverMulti), or the Fallback's decision of it.
//
// penalty is the principal's block group: -1 for none; else its penalty_ms (0: only observed).
// A decision the block refused has Result.Blocked, and index 0.
// sent is the call's clock reading when its caller made one, else 0.
func (l *Limiter) decideMulti(ctx context.Context, op operation, key string, cs []call, each []Result, penalty, sent int64) (Result, int, error) {
	if sent == 0 {
		sent = l.clock()
	}
	want := needs.V11
	for i := range cs {
		if w := wants(op, cs[i]); w == needs.V12 {
			want = w
		}
	}
	if penalty >= 0 {
		want = needs.V12
	}
	a, kind, err := l.begin(ctx, key, want, sent)
	if err != nil {
		if kind == kindVersion && l.fallback == ReturnError {
			err = forCall(err, multiNeeds(op, penalty), want)
		}
		return l.failMulti(ctx, op, key, cs, kind, err, each)
	}
	res, i, err := l.askMulti(ctx, a.br, op, key, cs, each, sent, penalty, want)
	if err == nil {
		a.series = l.tel.series(ctx, multiSubject, decidedBy(cs, i))
	}
	now := sent
	if err != nil {
		now = l.clock() // when it failed, as decide
	}
	kind = l.settle(ctx, a, multiSubject, op, res, err, now)
	if kind == kindNone {
		a.br.forgetOld(want)
	}
	if kind == kindNone && a.dropLocal {
		for _, c := range cs {
			l.local.drop(keys.Append(nil, l.prefix, key, c.alg.name, c.name), sent, now)
		}
	}
	if err == nil {
		return res, i, nil
	}
	if !kind.failure() {
		l.tel.countError(ctx, multiSubject, op, kind)
		return Result{}, 0, err
	}
	return l.failMulti(ctx, op, key, cs, kind, err, each)
}

// askMulti is serverMulti, with every limit's own reply (each not nil) from the rl_multi
// itself on a node that runs 1.3.0 (replies), else from a peek of each pipelined behind it. A
// node that refuses replies has decided nothing: it is asked again at once without them, and
// br remembers it (asked with replies again after a cooldown, as any older node).
func (l *Limiter) askMulti(ctx context.Context, br *breaker, op operation, key string, cs []call, each []Result, sent, penalty int64, want string) (Result, int, error) {
	replies := each != nil && br.tooOld(sent, needs.V13) == nil
	res, i, err := l.serverMulti(ctx, op, key, cs, each, sent, penalty, want, replies)
	if !replies {
		return res, i, err
	}
	var ve *VersionError
	if err != nil && errors.As(err, &ve) && ve.Want == needs.V13 && ve.Version != "" {
		br.old.Store(&oldLibrary{err: ve, until: sent + br.cooldown})
		clear(each)
		return l.serverMulti(ctx, op, key, cs, each, sent, penalty, want, false)
	}
	if err == nil {
		br.forgetOld(needs.V13)
	}
	return res, i, err
}

// serverMulti runs cs in one rl_multi (rl_multi_peek). each, when not nil, gets each call's
// own state (the limit's Remaining and ResetAfter after the decision, and whether it alone
// would admit the cost): with replies (library 1.3.0) from the rl_multi's own reply, else from
// a peek of each pipelined behind it, or the zero Result where the peek failed: the decision
// stands. A node older than 1.3.0 answers replies with a *VersionError wanting 1.3.0, having
// decided nothing.
func (l *Limiter) serverMulti(ctx context.Context, op operation, key string, cs []call, each []Result, now, penalty int64, want string, replies bool) (Result, int, error) {
	ctx, rel := l.withDeadline(ctx, l.mono(now))
	defer rel.release()
	fn := multiFunction(op)
	// The keys and every argument are written into one buffer and converted to one string
	// that they slice, as command does for one limit: one allocation rather than one each.
	var b [512]byte
	var e [maxMultiArgs]int
	buf, ends := b[:0], e[:0]
	for i := range cs {
		buf = keys.Append(buf, l.prefix, key, cs[i].alg.name, cs[i].name)
		ends = append(ends, len(buf))
	}
	groups := len(cs)
	if penalty >= 0 {
		// the principal's block, beside its limits in its slot; last, so that the limits'
		// indexes are theirs
		buf = keys.Append(buf, l.prefix, key, blockAlg.name, "")
		ends = append(ends, len(buf))
		groups++
	}
	nkeys := len(ends)
	for i := range cs {
		c := &cs[i]
		buf = append(buf, c.alg.name...)
		ends = append(ends, len(buf))
		buf, ends = c.appendArgs(buf, ends)
		buf = appendInt(buf, c.reserve)
		ends = append(ends, len(buf))
	}
	if penalty >= 0 {
		buf = append(buf, blockAlg.name...)
		ends = append(ends, len(buf))
		buf = appendInt(buf, penalty)
		ends = append(ends, len(buf))
	}
	str := string(buf)
	var p [maxMultiArgs]string
	parts := p[:0]
	from := 0
	for _, end := range ends {
		parts = append(parts, str[from:end])
		from = end
	}
	stateKeys, args := parts[:nkeys], parts[nkeys:]
	if replies {
		args = append(args, "replies")
	}
	// one command per Do: valkey-go recycles a command once it is sent
	command := func(readOnly bool) valkey.Completed {
		if readOnly {
			return l.vk.B().FcallRo().Function(fn).Numkeys(int64(len(stateKeys))).Key(stateKeys...).Arg(args...).Build()
		}
		return l.vk.B().Fcall().Function(fn).Numkeys(int64(len(stateKeys))).Key(stateKeys...).Arg(args...).Build()
	}
	var res Result
	var idx int64
	var err error
	switch {
	case each == nil:
		res, idx, err = decodeN(fn, rel.result(l.vk.Do(ctx, command(op == opPeek))), 7)
	case replies:
		res, idx, err = decodeReplies(fn, rel.result(l.vk.Do(ctx, command(op == opPeek))), groups, each)
		if op == opPeek && errors.Is(err, ErrNotLoaded) {
			res, idx, err = decodeReplies(fn, rel.result(l.vk.Do(ctx, command(false))), groups, each)
		}
		if err != nil && olderLibrary(err) {
			return Result{}, 0, l.versionError(rel.wrapped(ctx), fn+" replies", stateKeys[0], needs.V13, err)
		}
	default:
		// The peeks go with the rl_multi, in one round trip. They only read, so they are
		// FCALL_RO, as every peek: no write on the primary's books, and a replica answers
		// them when the valkey.Client sends read-only commands to replicas
		// (SendToReplicas). The primary runs them right after the rl_multi on its
		// connection; a replica reads its copy, which may not have the rl_multi's write yet:
		// the other limits' values then lag this decision by the replication delay (what
		// they show only informs; the rl_multi decided).
		cmds := make(valkey.Commands, 1, 1+len(cs))
		cmds[0] = command(op == opPeek)
		for i := range cs {
			cmds = append(cmds, l.command(true, cs[i].alg.peek, []byte(stateKeys[i]), cs[i], true))
		}
		replies := l.vk.DoMulti(ctx, cmds...)
		res, idx, err = decodeN(fn, rel.result(replies[0]), 7)
		var again []int // peeks a replica without the library yet refused: FCALL, to the primary
		for i := range cs {
			r, perr := decode(cs[i].alg.peek, rel.result(replies[1+i]))
			switch {
			case perr == nil:
				each[i] = r
			case errors.Is(perr, ErrNotLoaded):
				again = append(again, i)
			}
		}
		if len(again) > 0 {
			cmds = cmds[:0]
			for _, i := range again {
				cmds = append(cmds, l.command(false, cs[i].alg.peek, []byte(stateKeys[i]), cs[i], true))
			}
			for j, reply := range l.vk.DoMulti(ctx, cmds...) {
				if r, perr := decode(cs[again[j]].alg.peek, rel.result(reply)); perr == nil {
					each[again[j]] = r
				}
			}
		}
	}
	if op == opPeek && errors.Is(err, ErrNotLoaded) {
		// as PeekN: a replica without the library yet; FCALL goes to the primary
		res, idx, err = decodeN(fn, rel.result(l.vk.Do(ctx, command(false))), 7)
	}
	if err != nil {
		if olderLibrary(err) {
			err = l.versionError(rel.wrapped(ctx), multiNeeds(op, penalty), stateKeys[0], want, err)
		}
		return Result{}, 0, err
	}
	if idx < 1 || idx > int64(groups) {
		return Result{}, 0, &replyError{Function: fn, Reason: fmt.Sprintf("binding index %d, want 1 to %d", idx, groups)}
	}
	if int(idx) > len(cs) {
		res.Blocked = true
		return res, 0, nil
	}
	// A limit that denies sets the block in the same call: the principal is blocked now,
	// though the limit's own wait, longer than the penalty, is the one that binds.
	res.Blocked = op == opAllow && penalty > 0 && !res.Allowed
	return res, int(idx - 1), nil
}

// decodeReplies decodes rl_multi's reply with replies: the decision's seven integers, then
// six per group, of which each gets the limits' (the first len(each) groups).
func decodeReplies(fn string, res valkey.ValkeyResult, groups int, each []Result) (Result, int64, error) {
	v, err := decodeInts(fn, res, 7+6*groups)
	if err != nil {
		return Result{}, 0, err
	}
	r, err := sixOf(fn, v)
	if err != nil {
		return Result{}, 0, err
	}
	for i := range each {
		if each[i], err = sixOf(fn, v[7+6*i:]); err != nil {
			return Result{}, 0, err
		}
	}
	return r, v[6], nil
}

// penaltyOf is the block group of one key's calls: the longest Penalty among them, or -1
// when none has one (a key's limits share its one block).
func penaltyOf(cs []call) int64 {
	p := int64(-1)
	for i := range cs {
		if cs[i].penalty > 0 {
			p = max(p, cs[i].penalty)
		}
	}
	return p
}

// multiNeeds names what an rl_multi call relies on, for a *VersionError: the function, or its
// block group.
func multiNeeds(op operation, penalty int64) string {
	if penalty >= 0 {
		return multiFunction(op) + " block"
	}
	return multiFunction(op)
}

// multiFunction is the function of rl_multi for op.
func multiFunction(op operation) string {
	if op == opPeek {
		return "rl_multi_peek"
	}
	return "rl_multi"
}

// failMulti applies the Fallback to one key's calls the server could not decide: each is
// decided as a single call would be, all or nothing.
func (l *Limiter) failMulti(ctx context.Context, op operation, key string, cs []call, kind errKind, err error, each []Result) (Result, int, error) {
	l.tel.countError(ctx, multiSubject, op, kind)
	l.fellBack(ctx, key, &cs[0], kind)
	if l.fallback == ReturnError {
		return Result{}, 0, err
	}
	results := make([]Result, len(cs))
	for i, c := range cs {
		results[i] = l.fallbackResult(opPeek, key, c, built{})
	}
	r, b := binding(results)
	if op == opAllow && r.Allowed {
		for i, c := range cs {
			if results[i] = l.fallbackResult(opAllow, key, c, built{}); !results[i].Allowed {
				// a concurrent local call took the room meanwhile: give back what this took
				for _, d := range cs[:i] {
					l.fallbackResult(opRefund, key, d, built{})
				}
				break
			}
		}
		r, b = binding(results)
	}
	copy(each, results)
	l.tel.decided(ctx, l.tel.series(ctx, multiSubject, decidedBy(cs, b)), op, r, fallbackSrc[l.fallback])
	return r, b, nil
}

// decidedBy is the limit of cs that decided an rl_multi, whose name, quota and period its
// metrics carry; nil when the principal's block did.
func decidedBy(cs []call, i int) *spec {
	if 0 <= i && i < len(cs) {
		return &cs[i].spec
	}
	return nil
}
