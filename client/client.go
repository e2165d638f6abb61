package client

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/internal/keys"

	"github.com/rlfn/rlfn/internal/needs"
)

// This file is the core, top to bottom: the Limiter, New, every call a service makes, and the
// one path a call takes to the server (run, route, decide). What an option turns on is
// reached through a field of the Limiter: resilience (fallback.go), near (near.go), tel
// (metrics.go, trace.go).

// Limiter makes rate-limiting decisions with the ratelimit library's functions. It is safe for
// concurrent use. Its state is its circuit breakers (one per cluster shard) and, with
// LocalFallback, the local limiters; with leased budgets, the units it parked, which Close
// gives back; with the denial cache, recent denials.
type Limiter struct {
	vk        valkey.Client
	prefix    string // escaped, as Key writes it
	maxKey    int    // the longest key a call takes (Options.MaxKeyLen)
	maxRules  int    // the most rules of one AllowAll (Options.MaxRules)
	deadline  time.Duration
	deadlines deadlines
	clock     func() int64
	monoClock bool          // clock is monotonicClock: a reading of it gives time.Since(clockBase)
	hints     func() *hints // the order of decisions across keys (AllowAll), made at its first

	// What an option turns on lives in files of its own, behind these fields.
	resilience              // the breakers and the Fallback (fallback.go): always
	near       *nearby      // leased budgets and the denial cache (near.go): nil unless set
	tel        *telemetry   // metrics and spans (metrics.go, trace.go): nil unless set
	ovr        *overrides   // the operators' overrides (override.go): nil unless set
	top        *top         // the keys denied most (top.go): nil unless set
	notes      *notices     // what the Limiter says in its log (notice.go): always
	selfLoad   *selfLoader  // loads the library onto a node without one (selfload.go): nil unless set
	owed       *owedRefunds // the refunds AllowAll owes and tries again (refund.go): always
	holds      openHolds    // the holds taken and not settled, which Close settles (hold.go)
}

// New returns a Limiter that sends its commands through vk, configured by o (the zero Options
// for every default). The caller owns vk: the Limiter never dials, and never closes it.
// Read-only commands (Peek) go where vk sends them, e.g. to replicas with
// valkey.ClientOption.SendToReplicas.
//
// New returns an *OptionError (several joined with errors.Join, in which errors.As finds the
// first) when vk is nil or a field of o is invalid (a negative deadline...): a Limiter that
// silently ran with other settings would be worse, and with a nil vk every call would panic.
func New(vk valkey.Client, o Options) (*Limiter, error) {
	r := resolve(o)
	if vk == nil {
		r.errs = append([]error{&OptionError{Field: "vk", Reason: "must not be nil"}}, r.errs...)
	}
	var m *metrics
	if r.MeterProvider != nil && len(r.errs) == 0 {
		var err error
		if m, err = newMetrics(r.MeterProvider, r.MetricLimits); err != nil {
			r.errs = append(r.errs, err)
		}
	}
	var owed *owedRefunds
	if len(r.errs) == 0 {
		var err error
		if owed, err = newOwedRefunds(r.MeterProvider); err != nil {
			r.errs = append(r.errs, err)
		}
	}
	switch len(r.errs) {
	case 0:
	case 1:
		return nil, r.errs[0]
	default:
		return nil, errors.Join(r.errs...)
	}
	l := &Limiter{
		vk:        vk,
		prefix:    string(keys.AppendEscaped(nil, r.Prefix)),
		maxKey:    r.MaxKeyLen,
		maxRules:  r.MaxRules,
		deadline:  r.Deadline,
		clock:     monotonicClock,
		monoClock: true,
		hints:     sync.OnceValue(newHints),
		owed:      owed,
		resilience: resilience{
			breakers:  newBreakers(vk, r.BreakerFailures, r.BreakerCooldown),
			fallback:  r.Fallback,
			instances: int64(r.Instances),
		},
	}
	if r.clock != nil {
		l.clock, l.monoClock = r.clock, false
	}
	l.notes = newNotices(r.Logger, l.clock)
	if r.LoadLibrary {
		l.selfLoad = newSelfLoader()
	}
	if r.Fallback == LocalFallback {
		l.local = newLocalStore(r.LocalKeys)
	}
	if r.BudgetBatch > 0 || r.DenialCache > 0 {
		l.near = &nearby{}
		if r.BudgetBatch > 0 {
			l.near.budgets = newBudgets(r.BudgetBatch, r.BudgetAge)
		}
		if r.DenialCache > 0 {
			l.near.denials = newDenials(r.DenialCache)
		}
	}
	if r.Overrides {
		o, err := newOverrides(vk, r.Prefix, r.Deadline, r.MeterProvider)
		if err != nil {
			return nil, err
		}
		l.ovr = o
		defer l.watchOverrides()
	}
	if r.TopKeys > 0 {
		l.top = newTop(vk, r.Prefix, r.TopKeys, r.TopEvery)
	}
	if m != nil || r.TracerProvider != nil {
		l.tel = &telemetry{m: m, traceKeys: r.TraceKeys}
		if r.TracerProvider != nil {
			l.tel.tracer = r.TracerProvider.Tracer("github.com/rlfn/rlfn/client")
		}
	}
	return l, nil
}

// clockBase anchors monotonicClock: Unix time that a wall-clock step cannot move, so that
// neither the breaker's cooldown nor a local window jumps with it.
var clockBase = time.Now()

// monotonicClock is the default clock: Unix nanoseconds, advancing with the monotonic clock.
func monotonicClock() int64 { return clockBase.UnixNano() + int64(time.Since(clockBase)) }

// wallClock is the time by the host's wall clock (Unix nanoseconds), for a calendar's
// boundaries: those name calendar dates, and a clock step since start-up (NTP settling after
// boot, a resume from suspend) must move them, which the monotonic clock would not. A test
// clock stands for both.
func (l *Limiter) wallClock() int64 {
	if l.monoClock {
		return time.Now().UnixNano()
	}
	return l.clock()
}

// mono is time.Since(clockBase) at the clock reading now, when the clock is monotonicClock
// (else 0: a test clock is not the time, and the deadline reads the time itself).
func (l *Limiter) mono(now int64) time.Duration {
	if l.monoClock {
		return time.Duration(now - clockBase.UnixNano())
	}
	return 0
}

// Allow takes one unit from key's limiter.
func (l *Limiter) Allow(ctx context.Context, key string, limit Limit) (Result, error) {
	return l.AllowN(ctx, key, limit, 1)
}

// AllowN takes n units (0 to 999999999999999) from key's limiter, all or nothing: a denied
// call consumes nothing. An n above the limit (with the reserve, unless ctx is Critical) is
// denied with RetryAfter = Never.
//
// The call gives up at its deadline (Options.Deadline), and when the server cannot decide, the
// Limiter's Fallback does.
func (l *Limiter) AllowN(ctx context.Context, key string, limit Limit, n int64) (Result, error) {
	return l.allowN(ctx, "", key, limit, n)
}

// allowN is AllowN of a decision named name ("": by the context, or the limit's Name).
func (l *Limiter) allowN(ctx context.Context, name, key string, limit Limit, n int64) (Result, error) {
	c, err := l.prepare(ctx, name, key, limit, n)
	if err != nil {
		return Result{}, err
	}
	res, err := l.run(ctx, opAllow, key, c)
	if l.top != nil && err == nil && !res.Allowed {
		l.top.denied(key, &c, res)
	}
	return res, err
}

// Peek reports whether one unit would be admitted now, consuming nothing.
func (l *Limiter) Peek(ctx context.Context, key string, limit Limit) (Result, error) {
	return l.PeekN(ctx, key, limit, 1)
}

// PeekN reports whether n units would be admitted now, consuming nothing. It runs the peek
// function with FCALL_RO, so a client that sends read-only commands to replicas runs it on a
// replica, whose state lags the primary's by the replication delay. A replica that has no
// library yet (a deploy in progress) is skipped: the call is repeated on the primary.
//
// The deadline, the circuit breaker and the Fallback apply as to AllowN; a local peek consumes
// nothing either.
func (l *Limiter) PeekN(ctx context.Context, key string, limit Limit, n int64) (Result, error) {
	return l.peekN(ctx, "", key, limit, n)
}

// peekN is PeekN of a decision named name (see allowN).
func (l *Limiter) peekN(ctx context.Context, name, key string, limit Limit, n int64) (Result, error) {
	c, err := l.prepare(ctx, name, key, limit, n)
	if err != nil {
		return Result{}, err
	}
	return l.run(ctx, opPeek, key, c)
}

// Refund gives n units (0 to 999999999999999) back to key's limiter, as far as its state
// still holds them (library 1.1.0): a token bucket gets n tokens back, up to its capacity; a
// leaky bucket's level drops by n; a window's current count drops by n; a sliding log drops
// its n newest entries. It never makes a limiter more permissive than a fresh one, and answers
// with the limiter's state after it (Allowed, RetryAfter 0). Charge a predicted cost with
// AllowN, then refund what the work did not use.
//
// A refund is not idempotent: it is never retried, by the client or by the Fallback. The
// deadline, the breaker and the Fallback apply as to AllowN (LocalFallback refunds the local
// limiter; FailOpen and FailClosed refund nothing).
func (l *Limiter) Refund(ctx context.Context, key string, limit Limit, n int64) (Result, error) {
	return l.refund(ctx, "", key, limit, n)
}

// refund is Refund of a limit named name (see allowN).
func (l *Limiter) refund(ctx context.Context, name, key string, limit Limit, n int64) (Result, error) {
	if err := l.checkKey(key); err != nil {
		return Result{}, err
	}
	if err := checkLimit(limit); err != nil {
		return Result{}, err
	}
	if err := checkInt("refund", n, 0, maxInt); err != nil {
		return Result{}, err
	}
	c := call{spec: limit.spec(), cost: n}
	c.label = name
	l.override(&c, key)
	if err := l.bound(&c); err != nil {
		return Result{}, err
	}
	return l.run(ctx, opRefund, key, c)
}

// Rule is one limit of a decision on several: Key's limiter of Limit, charged Cost.
type Rule struct {
	Key   string // the principal, as Allow takes it; rules of one Key are decided in one call
	Limit Limit  // required: a nil Limit is a *LimitError
	// Cost is the units this rule takes when the decision admits; zero takes the call's (1 for
	// AllowAll, n for AllowAllN), so "60 requests and 150,000 tokens per minute" is two rules
	// of one Key, the tokens' with Cost set, decided in one call: each limit is judged against
	// its own cost, and a cost above its limit denies with Never, as AllowN's. A rule cannot
	// take nothing while the others take: a Cost of zero is the call's.
	Cost int64
	// Name names the rule's decisions in metrics, spans and log lines (rlfn.limit.name) in
	// place of WithLimitName's name and of its Limit's Name; it is not part of the state's key.
	// httplimit and grpclimit name each limit of a policy so. Give it names the service
	// declares, never a request's values: each name is a metric series (Options.MetricLimits).
	// Default (empty): WithLimitName's, else the Limit's Name.
	Name string
}

// AllowAll takes one unit from every rule's limiter, all or nothing. See AllowAllN.
func (l *Limiter) AllowAll(ctx context.Context, rules []Rule) (Result, error) {
	return l.AllowAllN(ctx, rules, 1)
}

// AllowAllN takes n units from every rule's limiter, all or nothing: either every limit admits
// and each consumes n, or none consumes anything. The Result is the reply of the limit that
// decided, whose index in rules is Result.Rule: when denied, the denying limit with the
// longest RetryAfter (Never above all); when admitted, the one with the fewest Remaining.
// ResetAfter is the longest of all, Delay the longest when admitted.
//
// Rules of one Key (one principal, so one cluster slot) are decided by one atomic rl_multi
// call, up to 16 of them (library 1.1.0); two of one algorithm need distinct Names. Rules of
// different Keys (the login triple (IP, user), IP and user; a merchant's limit and a global
// one) are decided side by side, each Key by one call, and when any denies or fails, the units
// the others took are refunded: no limit ever admits more than it allows, though a concurrent
// call may, rarely, see a unit that is about to be refunded. A Key whose limit said it would
// deny the next call is asked first, alone, and its denial ends the decision; the other Keys are
// then peeked (FCALL_RO), for the longest RetryAfter: a refused request costs the server no
// more calls than an admitted one, and takes nothing to refund.
//
// Refunds need library 1.1.0. A node that still runs 1.0.0 refuses a Key's single rule before
// it takes anything; that rule is then decided as 1.0 decides it, after the others, one Key at
// a time, the first denial ending the decision: what such a Key took before another denied
// stays taken (stricter for a while, never more permissive). Several rules of one Key (one
// rl_multi) on a 1.0 node are decided by the Fallback. No limit turns into no limit. Under
// ReturnError, the call returns the node's *VersionError instead, with nothing taken.
//
// Each call keeps the deadline, the breaker and the Fallback; when the server cannot decide one
// Key's rules, the Fallback decides them (LocalFallback: all or nothing, locally). The first
// error, in rule order, is returned after the refunds. At most Options.MaxRules rules (1000 by
// default) are taken, and at most 32 Keys' calls are in flight at once (each with its own
// deadline, from when it is sent): a large decision runs in waves rather than queueing its own
// calls past their deadlines, which the breaker would count as the node failing.
//
// The refunds are the Limiter's, never the caller's error: a refund the server could not make
// (its breaker open, the cluster down, an error reply) is tried again in the background until
// its node answers, within bounds (OwedRefunds); one that was sent and not answered (the
// server may have made it) is never sent again. What could not be given back is counted by the
// rlfn.client.refunds.lost metric and said in the log (Options.Logger), and stays taken until
// its limiter gives it back by itself: stricter for a while, never more permissive.
func (l *Limiter) AllowAllN(ctx context.Context, rules []Rule, n int64) (Result, error) {
	res, err := l.all(ctx, opAllow, rules, n, nil)
	l.topAll(rules, res, err)
	return res, err
}

// AllowAllEach is AllowAllN that also reports each rule's own limiter, in rule order: what the
// response of a route with several limits shows for every one of them (client/httplimit's
// RateLimit items). The decision is AllowAllN's, and so is the binding Result.
//
// each[i].Limit, Remaining and ResetAfter are rule i's limiter right after the decision (after
// the refunds of a denied decision across keys). Allowed is whether that limit admitted the
// cost (always, when the decision admitted); when it did not, RetryAfter is its own wait.
// Rule is i, Source is FromFallback when the Fallback decided it. A rule decided alone (the only rule of
// its Key) has its call's Result, Delay included. Rules of one Key share one rl_multi, whose
// reply is the binding limit's alone: their own state is read by a peek of each (FCALL_RO),
// pipelined with the rl_multi (one round trip, one more call per rule for the server), so it
// is the state just after the decision, which a concurrent call may already have changed (a
// replica that runs the peeks, with valkey.ClientOption.SendToReplicas in a cluster, may not
// have the decision's write yet); their Delay is zero (the binding Result has the decision's). A rule whose
// state could not be read (its peek failed, or its Key's call did, with the error returned)
// is the zero Result, Limit 0.
func (l *Limiter) AllowAllEach(ctx context.Context, rules []Rule, n int64) (Result, []Result, error) {
	each := make([]Result, len(rules))
	res, err := l.all(ctx, opAllow, rules, n, each)
	l.topAll(rules, res, err)
	return res, each, err
}

// PeekAll reports whether one unit of every rule would be admitted now, consuming nothing;
// Result.Rule names the limit that decides, as for AllowAll. See PeekAllN.
func (l *Limiter) PeekAll(ctx context.Context, rules []Rule) (Result, error) {
	return l.PeekAllN(ctx, rules, 1)
}

// PeekAllN reports whether n units of every rule would be admitted now, consuming nothing.
// Since a peek's Remaining does not subtract its cost, an admitted PeekAllN may name another
// limit than AllowAllN would; a denied one names the same.
func (l *Limiter) PeekAllN(ctx context.Context, rules []Rule, n int64) (Result, error) {
	return l.all(ctx, opPeek, rules, n, nil)
}

// Acquire takes a slot of key's Concurrency limit for a new holder with a random id (128 bits
// from crypto/rand: ids never collide across processes). When admitted it returns the Lease,
// which the caller releases when done (Release) and renews before it expires if the work takes
// longer (Renew); when denied, a nil Lease and a Result whose RetryAfter is when enough leases
// will have expired (a release may come sooner).
//
// A call that is not Critical leaves c.Reserve slots free. The deadline, the breaker and the
// Fallback apply as to AllowN: LocalFallback holds a local semaphore of Limit / instances slots.
func (l *Limiter) Acquire(ctx context.Context, key string, c Concurrency) (*Lease, Result, error) {
	return l.acquire(ctx, "", key, c)
}

// acquire is Acquire of a lease named name (see allowN).
func (l *Limiter) acquire(ctx context.Context, name, key string, c Concurrency) (*Lease, Result, error) {
	lease, err := l.Lease(key, c, randomID())
	if err != nil {
		return nil, Result{}, err
	}
	lease.label = name
	res, err := lease.Renew(ctx)
	if err != nil || !res.Allowed {
		return nil, res, err
	}
	return lease, res, nil
}

// Lease returns the lease of holder id (1 to 128 bytes) on key's Concurrency limit,
// without a call: to renew or release a lease taken elsewhere (by another process, or by
// rlfn call). Renew takes its slot if id holds none.
func (l *Limiter) Lease(key string, c Concurrency, id string) (*Lease, error) {
	if err := l.checkKey(key); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if len(id) < 1 || len(id) > maxLeaseID {
		return nil, &LimitError{Field: "lease id", Reason: "must be 1 to " + strconv.Itoa(maxLeaseID) + " bytes"}
	}
	return &Lease{lim: l, key: key, limit: c, id: id}, nil
}

// Block blocks key for d (1ms to 10^11ms; library 1.2.0), replacing any block it has: an
// operator may lengthen or shorten one. While blocked, every call on key of a limit with a
// Penalty is refused (Result.Blocked), without consuming anything. The Result describes the
// block after the call: Blocked, and RetryAfter and ResetAfter its remaining time.
//
// Block, Unblock and PeekBlock are operators' calls: they go to the server within the
// Limiter's deadline, and what fails is returned, never decided by the Fallback.
func (l *Limiter) Block(ctx context.Context, key string, d time.Duration) (Result, error) {
	ms, err := milliseconds("block duration", d)
	if err != nil {
		return Result{}, err
	}
	return l.blockCall(ctx, opAllow, key, ms)
}

// Unblock lifts key's block (library 1.2.0). Result.Blocked is false after it.
func (l *Limiter) Unblock(ctx context.Context, key string) (Result, error) {
	return l.blockCall(ctx, opRefund, key, 0)
}

// PeekBlock reports key's block (library 1.2.0) without changing it: Result.Blocked, and
// RetryAfter its remaining time.
func (l *Limiter) PeekBlock(ctx context.Context, key string) (Result, error) {
	return l.blockCall(ctx, opPeek, key, 0)
}

// blockCall runs rl_block (opAllow, for ms), rl_unblock (opRefund) or rl_block_peek (opPeek)
// on key's block.
func (l *Limiter) blockCall(ctx context.Context, op operation, key string, ms int64) (Result, error) {
	if err := l.checkKey(key); err != nil {
		return Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	var kb [192]byte
	b := built{key: keys.Append(kb[:0], l.prefix, key, blockAlg.name, ""), now: l.clock()}
	res, err := l.server(ctx, op, call{spec: spec{alg: blockAlg, params: params{ms: ms}}}, b)
	if err != nil {
		return Result{}, err
	}
	if op != opPeek && l.near != nil && l.near.denials != nil {
		// the principal's cached denials were made under the block this call changed
		l.near.denials.dropPrincipal(keys.Append(kb[:0], l.prefix, key, "", ""))
	}
	res.Blocked = !res.Allowed
	return res, nil
}

// run is the path of every call on one limit: its span when traced, then route.
func (l *Limiter) run(ctx context.Context, op operation, key string, c call) (res Result, err error) {
	if l.tel.tracing() {
		res, err = l.traced(ctx, op, key, c)
	} else {
		res, err = l.route(ctx, op, key, c)
	}
	res.Override = c.override // the override that replaced the code's limit, nil for none
	return res, err
}

// route decides c: an Allow through the leased budgets and the denial cache when they are on
// (near.go), every call by decide; a refund then forgets the key's cached denials.
func (l *Limiter) route(ctx context.Context, op operation, key string, c call) (Result, error) {
	switch {
	case op == opAllow && l.near != nil:
		return l.allowNear(ctx, key, c)
	case op == opRefund && l.near != nil:
		var kb [192]byte
		b := built{key: keys.Append(kb[:0], l.prefix, key, c.alg.name, c.name)}
		res, err := l.decide(ctx, op, key, c, b)
		if err == nil {
			l.dropDenials(b.key)
		}
		return res, err
	}
	return l.decide(ctx, op, key, c, built{})
}

// built is what a call computes once and passes down: its server key and its clock reading.
// A caller that made them already (the hot-key paths) passes them to decide; else decide does.
type built struct {
	key []byte // key's server key (keys.Append), nil if not made yet
	now int64  // the Limiter's clock when the call began, 0 if not read yet
}

// decide asks the server unless the breaker is open, and turns a failure into the Fallback's
// decision. The server key and the clock reading are made once, here or by the caller (b);
// a call the server failed reads the clock once more, when it failed: the breaker's cooldown
// and the Fallback's decision run from then.
func (l *Limiter) decide(ctx context.Context, op operation, key string, c call, b built) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	if c.penalty > 0 && (op == opAllow || op == opPeek) {
		// the limit and the principal's block, in one rl_multi, which makes its keys
		res, _, err := l.decideMulti(ctx, op, key, []call{c}, nil, c.penalty, b.now)
		return res, err
	}
	var kb [192]byte
	if b.key == nil {
		b.key = keys.Append(kb[:0], l.prefix, key, c.alg.name, c.name)
	}
	if b.now == 0 {
		b.now = l.clock()
	}
	want := wants(op, c)
	a, kind, err := l.begin(ctx, key, want, b.now)
	a.series = l.tel.series(ctx, c.alg.id, &c.spec)
	if err != nil {
		if kind == kindVersion && l.fallback == ReturnError {
			err = forCall(err, c.needs(op), want) // the caller reads it: its own need, not another call's
		}
		return l.fail(ctx, op, key, c, b, kind, err)
	}
	res, err := l.server(ctx, op, c, b)
	sent := b.now
	if err != nil {
		b.now = l.clock()
	}
	kind = l.settle(ctx, a, c.alg.id, op, res, err, b.now)
	if kind == kindNone && want != "" {
		a.br.forgetOld(want)
	}
	if kind == kindNone && a.dropLocal {
		// The server decides key again, and its state is the truth: the local one is memory.
		l.local.drop(b.key, sent, b.now)
	}
	if err == nil {
		return res, nil
	}
	if !kind.failure() {
		l.tel.countError(ctx, c.alg.id, op, kind)
		return Result{}, err
	}
	return l.fail(ctx, op, key, c, b, kind, err)
}

// attempt is a call on its way to the server, past the breaker.
type attempt struct {
	br        *breaker  // the breaker of the key's node
	probe     bool      // the breaker's probe
	start     time.Time // for the duration metric; zero without metrics
	dropLocal bool      // local state exists: the server's answer drops the keys' (see drop)
	series    *series   // the limit's metrics; nil for rl_multi, whose settle finds them
}

// begin lets a call on key through the breaker of key's node, or returns why not: the breaker
// is open, or the call needs a newer library (want) than the node answered it runs a moment
// ago. now is the call's clock reading.
func (l *Limiter) begin(ctx context.Context, key string, want string, now int64) (attempt, errKind, error) {
	br := l.breakerOf(key)
	if want != "" && br.old.Load() != nil {
		if err := br.tooOld(now, want); err != nil {
			return attempt{}, kindVersion, err
		}
	}
	pass, probe := br.acquire(func() int64 { return now })
	if !pass {
		return attempt{}, kindCircuitOpen, ErrCircuitOpen
	}
	if probe {
		l.tel.transition(ctx, halfOpen)
	}
	a := attempt{br: br, probe: probe}
	if l.tel.meter() != nil {
		a.start = time.Now()
	}
	// Only an answer to a call sent after a key's local state began drops it (see drop).
	a.dropLocal = l.local != nil && l.local.used()
	return a, kindNone, nil
}

// settle classifies a server call's outcome, moves the breaker and records the call. now is
// when the call ended, read only when it failed (see decide).
func (l *Limiter) settle(ctx context.Context, a attempt, subject int, op operation, res Result, err error, now int64) errKind {
	probe, start := a.probe, a.start
	kind := kindNone
	if err != nil {
		kind = classify(ctx, err)
	}
	s := breakerState(-1)
	switch {
	case kind == kindVersion:
		var ve *VersionError
		if errors.As(err, &ve) {
			a.br.old.Store(&oldLibrary{err: ve, until: now + a.br.cooldown})
		}
		s = a.br.success(probe)
	case kind.unanswered():
		if s = a.br.failure(probe, now); s == open {
			// a failover or a resharding may have given the node's slots to another
			l.refreshSlots(true)
		}
	case kind == kindCanceled:
		s = a.br.release(probe)
	default:
		// the server answered, if only with an error
		s = a.br.success(probe)
	}
	if s >= 0 {
		l.tel.transition(ctx, s)
		l.moved(ctx, a.br, s, kind)
	}
	if kind == kindNone {
		l.answered(ctx, a.br)
	}
	if m := l.tel.meter(); m != nil {
		out := outError
		if err == nil {
			out = outDenied
			if res.Allowed {
				out = outAllowed
			}
		}
		m.duration.Record(ctx, time.Since(start).Seconds(), m.durationOpts[subject][op][out]...)
		if err == nil {
			ser := a.series
			if ser == nil {
				ser = l.tel.series(ctx, subject, nil)
			}
			l.tel.decided(ctx, ser, op, res, srcServer)
		}
	}
	return kind
}

// server runs c on the server, within the deadline, with the call's server key and clock
// reading (b).
func (l *Limiter) server(ctx context.Context, op operation, c call, b built) (Result, error) {
	ctx, rel := l.withDeadline(ctx, l.mono(b.now))
	defer rel.release()
	fn := c.function(op)
	reserve := c.sendsReserve(op)
	res, err := decode(fn, rel.result(l.vk.Do(ctx, l.command(op == opPeek, fn, b.key, c, reserve))))
	if op == opPeek && errors.Is(err, ErrNotLoaded) {
		// FCALL is not read-only, so every client sends it to the primary; the peek function
		// runs under FCALL as well (no-writes only permits FCALL_RO, it does not require it).
		res, err = decode(fn, rel.result(l.vk.Do(ctx, l.command(false, fn, b.key, c, reserve))))
	}
	if err != nil && (reserve || op == opRefund || c.alg.since != needs.V10) && olderLibrary(err) {
		// An older library has no such function, or takes no reserve.
		return Result{}, l.versionError(rel.wrapped(ctx), c.needs(op), string(b.key), wants(op, c), err)
	}
	return res, err
}

// prepare validates a key, a limit and a cost, and makes the call, with the limit's reserve
// unless ctx is Critical.
func (l *Limiter) prepare(ctx context.Context, name, key string, limit Limit, n int64) (call, error) {
	if err := l.checkKey(key); err != nil {
		return call{}, err
	}
	if err := checkLimit(limit); err != nil {
		return call{}, err
	}
	if err := checkCost(n); err != nil {
		return call{}, err
	}
	c := call{spec: limit.spec(), cost: n}
	c.label = name
	l.override(&c, key)
	c.judgeReserve(ctx)
	if err := l.bound(&c); err != nil {
		return call{}, err
	}
	return c, nil
}

// checkKey refuses an empty key and one longer than the Limiter takes.
func (l *Limiter) checkKey(key string) error {
	if len(key) == 0 || len(key) > l.maxKey {
		return &KeyError{Len: len(key), Max: l.maxKey}
	}
	return nil
}

// checkLimit refuses a nil limit (or a nil pointer to one) and a limit the library would
// refuse.
func checkLimit(limit Limit) error {
	if isNil(limit) {
		return &LimitError{Field: "limit", Reason: "must not be nil"}
	}
	return limit.Validate()
}

// judgeReserve makes c keep its limit's reserve, unless ctx is Critical. The context is read
// only for limits with a reserve: the others do not pay for it.
func (c *call) judgeReserve(ctx context.Context) {
	if c.params.reserve > 0 && !isCritical(ctx) {
		c.reserve = c.params.reserve
	}
}

// isNil reports a nil Limit, or a nil pointer to a limit: a pointer has the value's methods,
// and they would dereference it.
func isNil(limit Limit) bool {
	if limit == nil {
		return true
	}
	v := reflect.ValueOf(limit)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
