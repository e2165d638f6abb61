package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/valkey-io/valkey-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/rlfn/rlfn/internal/keys"
)

// Limiter makes rate-limiting decisions with the ratelimit library's functions. It is safe for
// concurrent use. Its state is its circuit breakers (one per cluster shard) and, with
// LocalFallback, the local limiters; with leased budgets, the units it parked, which Close
// gives back; with the denial cache, recent denials.
type Limiter struct {
	vk        valkey.Client
	prefix    string // escaped, as Key writes it
	deadline  time.Duration
	deadlines deadlines
	fallback  Fallback
	maxKey    int // the longest key a call takes (Options.MaxKeyLen)
	instances int64
	breakers  *breakers
	local     *localStore   // LocalFallback only
	budgets   *budgets      // Options.BudgetBatch only
	denials   *denials      // Options.DenialCache only
	hints     func() *hints // the order of decisions across keys (AllowAll), made at its first
	metrics   *metrics      // nil without a MeterProvider: nothing is recorded
	tracer    trace.Tracer  // nil without a TracerProvider: no span
	traceKeys bool
	clock     func() int64
	monoClock bool // clock is monotonicClock: a reading of it gives time.Since(clockBase)
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
		if m, err = newMetrics(r.MeterProvider); err != nil {
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
		deadline:  r.Deadline,
		fallback:  r.Fallback,
		maxKey:    r.MaxKeyLen,
		instances: int64(r.Instances),
		breakers:  newBreakers(vk, r.BreakerFailures, r.BreakerCooldown),
		hints:     sync.OnceValue(newHints),
		clock:     monotonicClock,
		monoClock: true,
	}
	if r.clock != nil {
		l.clock, l.monoClock = r.clock, false
	}
	if r.Fallback == LocalFallback {
		l.local = newLocalStore(r.LocalKeys)
	}
	l.metrics = m
	if r.TracerProvider != nil {
		l.tracer = r.TracerProvider.Tracer("github.com/rlfn/rlfn/client")
		l.traceKeys = r.TraceKeys
	}
	if r.BudgetBatch > 0 {
		l.budgets = newBudgets(r.BudgetBatch, r.BudgetAge)
	}
	if r.DenialCache > 0 {
		l.denials = newDenials(r.DenialCache)
	}
	return l, nil
}

// clockBase anchors monotonicClock: Unix time that a wall-clock step cannot move, so that
// neither the breaker's cooldown nor a local window jumps with it.
var clockBase = time.Now()

// monotonicClock is the default clock: Unix nanoseconds, advancing with the monotonic clock.
func monotonicClock() int64 { return clockBase.UnixNano() + int64(time.Since(clockBase)) }

// prebuilt is what a call on sk's server key (sk[:n] of stateKey) has built already: the server
// key, and time.Since(clockBase) from now, a reading of the Limiter's clock (0: none), when the
// clock is monotonicClock.
func (l *Limiter) prebuilt(sk []byte, now int64) built {
	p := built{key: sk}
	if l.monoClock && now != 0 {
		p.mono = time.Duration(now - clockBase.UnixNano())
	}
	return p
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
	c, err := l.prepare(ctx, key, limit, n)
	if err != nil {
		return Result{}, err
	}
	if l.tracer != nil {
		return l.traced(ctx, opAllow, key, c)
	}
	return l.allow(ctx, key, c)
}

func (l *Limiter) allow(ctx context.Context, key string, c call) (Result, error) {
	if l.budgets == nil && l.denials == nil {
		return l.decide(ctx, opAllow, key, c)
	}
	return l.allowNear(ctx, key, c)
}

// allowNear decides c with the denial cache and the leased budgets, which answer without the
// server when they can.
func (l *Limiter) allowNear(ctx context.Context, key string, c call) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	var b [192]byte
	sk, n := l.stateKey(b[:0], key, c)
	d := l.denials
	if d != nil && d.shut.Load() {
		d = nil
	}
	bs := l.budgets
	leased := bs != nil && !bs.isShut.Load() && c.leasable()
	var sent int64 // 0: not read; a cold key's budget lookup reads it then
	if d != nil {
		sent = l.clock()
		if r, ok := d.get(sk, n, c.cost, sent); ok {
			l.countCached(ctx, c)
			return r, nil
		}
	}
	var res Result
	var err error
	if leased {
		res, err = l.allowLeased(ctx, sk, n, key, c, sent)
	} else {
		res, err = l.decideBuilt(ctx, opAllow, key, c, l.prebuilt(sk[:n], sent))
	}
	if d != nil && err == nil && !res.Allowed && res.Source != FromFallback && res.Source != FromDenialCache {
		d.put(sk, n, c.cost, sent, l.clock(), res)
	}
	return res, err
}

func (l *Limiter) countCached(ctx context.Context, c call) {
	if m := l.metrics; m != nil {
		m.decisions.Add(ctx, 1, m.decisionOpts[c.alg.id][opAllow][0][srcCached]...)
	}
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
	c, err := l.prepare(ctx, key, limit, n)
	if err != nil {
		return Result{}, err
	}
	if l.tracer != nil {
		return l.traced(ctx, opPeek, key, c)
	}
	return l.decide(ctx, opPeek, key, c)
}

// Refund gives n units (0 to 999999999999999) back to key's limiter, as far as its state
// still holds them (library 1.1.0): a token bucket gets n tokens back, up to its capacity; a
// leaky bucket's level drops by n; a window's current count drops by n; a sliding log drops
// its n newest entries. It never makes a limiter more permissive than a fresh one, and answers
// with the limiter's state after it (Allowed, RetryAfter 0). Charge a predicted cost with
// AllowN, then refund what the work did not use.
//
// A refund is not idempotent: it is never retried, by the client or by the policy. The
// deadline, the breaker and the Fallback apply as to AllowN (LocalFallback refunds the local
// limiter; FailOpen and FailClosed refund nothing).
func (l *Limiter) Refund(ctx context.Context, key string, limit Limit, n int64) (Result, error) {
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
	if l.tracer != nil {
		return l.traced(ctx, opRefund, key, c)
	}
	return l.refund(ctx, key, c)
}

func (l *Limiter) refund(ctx context.Context, key string, c call) (Result, error) {
	res, err := l.decide(ctx, opRefund, key, c)
	if err == nil {
		l.dropDenials(key, c.spec)
	}
	return res, err
}

// decide asks the server unless the breaker is open, and turns a failure into the policy's
// decision.
func (l *Limiter) decide(ctx context.Context, op operation, key string, c call) (Result, error) {
	return l.decideBuilt(ctx, op, key, c, built{})
}

// built is what a caller of decideBuilt has computed already, so that the call does not
// compute it again: leased budgets build the server key and read the clock for every call,
// the spread case's cold keys included, and each costs about as much again.
type built struct {
	key  []byte        // key's server key (appendKey), nil if not built
	mono time.Duration // time.Since(clockBase) when the call began, 0 if not read
}

// decideBuilt is decide with what the caller built already.
func (l *Limiter) decideBuilt(ctx context.Context, op operation, key string, c call, pre built) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	newer := needs11(op, c)
	a, kind, err := l.begin(ctx, key, newer)
	if err != nil {
		if kind == kindVersion && l.fallback == ReturnError {
			err = forCall(err, c.needs(op)) // the caller reads it: its own need, not another call's
		}
		return l.fail(ctx, op, key, c, kind, err)
	}
	res, err := l.server(ctx, op, key, c, pre)
	kind = l.settle(ctx, a, c.alg.id, op, res, err)
	if kind == kindNone && newer {
		a.br.forgetOld()
	}
	if kind == kindNone && a.dropLocal {
		// The server decides key again, and its state is the truth: the local one is memory.
		var b [128]byte
		l.local.drop(keys.Append(b[:0], l.prefix, key, c.alg.name, c.name), a.sent, l.clock())
	}
	if err == nil {
		return res, nil
	}
	if !kind.failure() {
		l.countError(ctx, c.alg.id, op, kind)
		return Result{}, err
	}
	return l.fail(ctx, op, key, c, kind, err)
}

// attempt is a call on its way to the server, past the breaker.
type attempt struct {
	br        *breaker  // the breaker of the key's node
	probe     bool      // the breaker's probe
	start     time.Time // for metricDuration; zero without metrics
	dropLocal bool      // local state exists: the server's answer drops the keys' (see drop)
	sent      int64     // when the call was sent, for drop
}

// begin lets a call on key through the breaker of key's node, or returns why not: the breaker
// is open, or the call needs a newer library (needsNewer) than the node answered it runs a
// moment ago.
func (l *Limiter) begin(ctx context.Context, key string, needsNewer bool) (attempt, errKind, error) {
	br := l.breakerOf(key)
	if needsNewer && br.old.Load() != nil {
		if err := br.tooOld(l.clock()); err != nil {
			return attempt{}, kindVersion, err
		}
	}
	pass, probe := br.acquire(l.clock)
	if !pass {
		return attempt{}, kindCircuitOpen, ErrCircuitOpen
	}
	if probe {
		l.transition(ctx, halfOpen)
	}
	a := attempt{br: br, probe: probe}
	if l.metrics != nil {
		a.start = time.Now()
	}
	// Only an answer to a call sent after a key's local state began drops it (see drop); with
	// no local state at all, there is nothing to drop and no need to read the clock.
	if a.dropLocal = l.local != nil && l.local.used(); a.dropLocal {
		a.sent = l.clock()
	}
	return a, kindNone, nil
}

// needs11 reports whether c needs library 1.1.0: a reserve, a refund, a
// concurrency lease, or a call that must be refundable.
func needs11(op operation, c call) bool {
	return op == opRefund || op == opRelease || c.alg == concurrencyAlg || c.refundable || c.reserve > 0
}

// settle classifies a server call's outcome, moves the breaker and records the call.
func (l *Limiter) settle(ctx context.Context, a attempt, subject int, op operation, res Result, err error) errKind {
	probe, start := a.probe, a.start
	kind := kindNone
	if err != nil {
		kind = classify(ctx, err)
	}
	switch {
	case kind == kindVersion:
		var ve *VersionError
		if errors.As(err, &ve) {
			a.br.old.Store(&oldLibrary{err: ve, until: l.clock() + a.br.cooldown})
		}
		l.transition(ctx, a.br.success(probe))
	case kind.unanswered():
		s := a.br.failure(probe, l.clock())
		if s == open {
			// a failover or a resharding may have given the node's slots to another
			l.refreshSlots(true)
		}
		l.transition(ctx, s)
	case kind == kindCanceled:
		l.transition(ctx, a.br.release(probe))
	default:
		// the server answered, if only with an error
		l.transition(ctx, a.br.success(probe))
	}
	if m := l.metrics; m != nil {
		out := outError
		if err == nil {
			out = outDenied
			if res.Allowed {
				out = outAllowed
			}
		}
		m.duration.Record(ctx, time.Since(start).Seconds(), m.durationOpts[subject][op][out]...)
		if err == nil {
			m.decisions.Add(ctx, 1, m.decisionOpts[subject][op][b2i(res.Allowed)][0]...)
		}
	}
	return kind
}

// server runs c on the server, within the deadline.
func (l *Limiter) server(ctx context.Context, op operation, key string, c call, pre built) (Result, error) {
	ctx, rel := l.withDeadline(ctx, pre.mono)
	defer rel.release()
	fn := c.function(op)
	reserve := c.sendsReserve(op)
	res, err := decode(fn, rel.result(l.vk.Do(ctx, l.command(op == opPeek, fn, key, pre.key, c, reserve))))
	if op == opPeek && errors.Is(err, ErrNotLoaded) {
		// FCALL is not read-only, so every client sends it to the primary; the peek function
		// runs under FCALL as well (no-writes only permits FCALL_RO, it does not require it).
		res, err = decode(fn, rel.result(l.vk.Do(ctx, l.command(false, fn, key, pre.key, c, reserve))))
	}
	if err != nil && (reserve || op == opRefund || c.alg == concurrencyAlg) && olderLibrary(err) {
		// A 1.0 library has no such function, or takes no reserve.
		var b [128]byte
		return Result{}, l.versionError(rel.wrapped(ctx), c.needs(op), string(keys.Append(b[:0], l.prefix, key, c.alg.name, c.name)), err)
	}
	return res, err
}

// function is the library function c runs for op.
func (c *call) function(op operation) string {
	switch op {
	case opPeek:
		return c.alg.peek
	case opRefund, opRelease:
		return c.alg.refund
	}
	return c.alg.fn
}

// sendsReserve reports whether c's command for op ends with the reserve argument: a limit with
// one, and a call that must be refundable (so that a 1.0 library refuses it before it takes
// anything).
func (c *call) sendsReserve(op operation) bool {
	return op != opRefund && op != opRelease && (c.reserve > 0 || c.refundable)
}

// needs names what of library 1.1.0 c relies on for op, for a *VersionError: the function, its
// reserve argument, or the refund that AllowAll may have to make.
func (c *call) needs(op operation) string {
	switch {
	case c.refundable:
		return c.alg.refund
	case c.sendsReserve(op) && c.alg != concurrencyAlg:
		return c.function(op) + " reserve"
	}
	return c.function(op)
}

// forCall is the *VersionError a breaker remembered (another call's) as the error of a call
// that needs what.
func forCall(err error, what string) error {
	ve, ok := err.(*VersionError)
	if !ok || ve.Function == what {
		return err
	}
	v := *ve
	v.Function = what
	return &v
}

// fail applies the policy to a call the server could not decide.
func (l *Limiter) fail(ctx context.Context, op operation, key string, c call, kind errKind, err error) (Result, error) {
	if kind == kindVersion && op == opAllow && c.refundable && c.reserve == 0 && l.fallback != ReturnError {
		// The node can decide this limit, only not refundably: AllowAll does (decideAcross,
		// olderNode), rather than the policy. (ReturnError wants the error: the decision
		// would not be all or nothing as asked.)
		return Result{}, err
	}
	l.countError(ctx, c.alg.id, op, kind)
	if l.fallback == ReturnError {
		return Result{}, err
	}
	r := l.fallbackResult(op, key, c)
	if m := l.metrics; m != nil {
		m.decisions.Add(ctx, 1, m.decisionOpts[c.alg.id][op][b2i(r.Allowed)][fallbackSrc[l.fallback]]...)
	}
	return r, nil
}

// fallbackResult is the decision of the Limiter's policy (not ReturnError) on c.
func (l *Limiter) fallbackResult(op operation, key string, c call) Result {
	limit, need := c.limit, c.cost+c.reserve
	giveBack := op == opRefund || op == opRelease
	var r Result
	switch l.fallback {
	case FailOpen:
		r = Result{Allowed: true, Limit: limit, Remaining: max(0, limit-need), Source: FromFallback}
		switch {
		case giveBack:
			r.Remaining = limit
		case need > limit:
			r = Result{Limit: limit, Remaining: max(0, limit-c.reserve), RetryAfter: Never, Source: FromFallback}
		}
	case FailClosed:
		wait := l.breakerOf(key).retryAfter(l.clock())
		r = Result{Limit: limit, RetryAfter: wait, ResetAfter: wait, Source: FromFallback}
		switch {
		case giveBack:
			r = Result{Allowed: true, Limit: limit, Source: FromFallback}
		case need > limit:
			r.RetryAfter = Never
		}
	case LocalFallback:
		var b [128]byte
		k := keys.Append(b[:0], l.prefix, key, c.alg.name, c.name)
		if giveBack {
			r = l.local.refund(k, c, l.instances, l.clock())
		} else {
			r = l.local.decide(k, c, l.instances, l.clock(), op != opPeek)
		}
	}
	return r
}

func (l *Limiter) countError(ctx context.Context, subject int, op operation, kind errKind) {
	if m := l.metrics; m != nil {
		m.errors.Add(ctx, 1, m.errorOpts[subject][op][kind]...)
	}
}

// transition follows the breaker into a new state (none when s < 0).
func (l *Limiter) transition(ctx context.Context, s breakerState) {
	if s < 0 {
		return
	}
	if m := l.metrics; m != nil {
		m.transitions.Add(ctx, 1, m.transitionOpts[s]...)
	}
}

// classify tells what err means; ctx is the caller's.
func classify(ctx context.Context, err error) errKind {
	var le *LibraryError
	var re *replyError
	var ve *VersionError
	switch {
	case errors.As(err, &le):
		return kindLibrary
	case errors.As(err, &ve) && ve.Version != "":
		return kindVersion
	case errors.Is(err, ErrNotLoaded):
		return kindNotLoaded
	case errors.As(err, &re):
		return kindReply
	case errors.Is(ctx.Err(), context.Canceled):
		return kindCanceled
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return kindTimeout
	}
	// replyErr wraps the server's error, and IsValkeyErr does not unwrap
	var vke *valkey.ValkeyError
	if errors.As(err, &vke) {
		if vke.IsClusterDown() || vke.IsTryAgain() {
			return kindClusterDown
		}
		return kindServer
	}
	return kindUnreachable
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// prepare validates a key, a limit and a cost, and makes the call, with the limit's reserve
// unless ctx is Critical.
func (l *Limiter) prepare(ctx context.Context, key string, limit Limit, n int64) (call, error) {
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
	c.judgeReserve(ctx)
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

// command builds FCALL (or FCALL_RO) fn 1 key args... [reserve], with key's server key sk
// when the caller built it already (else nil). A command is built for each call and never
// reused, because valkey-go recycles it once Do returns; so it needs no Pin.
func (l *Limiter) command(readOnly bool, fn, key string, sk []byte, c call, reserve bool) valkey.Completed {
	// The key and every argument are written into one buffer and converted to one string that
	// the arguments slice: one allocation per call rather than one per argument.
	var b [192]byte
	var e [8]int
	var buf []byte
	if sk != nil {
		buf = append(b[:0], sk...)
	} else {
		buf = keys.Append(b[:0], l.prefix, key, c.alg.name, c.name)
	}
	ends := append(e[:0], len(buf))
	buf, ends = c.appendArgs(buf, ends)
	if reserve {
		buf = appendInt(buf, c.reserve)
		ends = append(ends, len(buf))
	}
	s := string(buf)
	var argv [len(e)]string
	args := argv[:0]
	for i := 1; i < len(ends); i++ {
		args = append(args, s[ends[i-1]:ends[i]])
	}
	k := s[:ends[0]]
	if readOnly {
		return l.vk.B().FcallRo().Function(fn).Numkeys(1).Key(k).Arg(args...).Build()
	}
	return l.vk.B().Fcall().Function(fn).Numkeys(1).Key(k).Arg(args...).Build()
}

// maxMs is the largest number of milliseconds a time.Duration holds.
const maxMs = int64(1<<63-1) / int64(time.Millisecond)

// decode turns fn's reply into a Result, or into this package's error for it.
func decode(fn string, res valkey.ValkeyResult) (Result, error) {
	r, _, err := decodeN(fn, res, 6)
	return r, err
}

// decodeN decodes a reply of at least n integers (6, or 7 for rl_multi, whose seventh is the
// binding limit's 1-based index, returned as the second value).
func decodeN(fn string, res valkey.ValkeyResult, n int) (Result, int64, error) {
	if err := res.Error(); err != nil && !valkey.IsValkeyNil(err) {
		return Result{}, 0, replyErr(fn, err)
	}
	arr, err := res.ToArray()
	if err != nil {
		return Result{}, 0, &replyError{Function: fn, Reason: err.Error()}
	}
	// Within a major version the reply may grow: later elements are for later clients.
	if len(arr) < n {
		return Result{}, 0, &replyError{Function: fn, Reason: fmt.Sprintf("%d elements, want %d", len(arr), n)}
	}
	var v [7]int64
	for i := range n {
		if v[i], err = arr[i].ToInt64(); err != nil {
			return Result{}, 0, &replyError{Function: fn, Reason: fmt.Sprintf("element %d is not an integer: %v", i+1, err)}
		}
	}
	allowed, limit, remaining, retry, reset, delay := v[0], v[1], v[2], v[3], v[4], v[5]
	switch {
	case allowed != 0 && allowed != 1:
		return Result{}, 0, &replyError{Function: fn, Reason: fmt.Sprintf("allowed is %d, want 0 or 1", allowed)}
	case remaining < 0:
		return Result{}, 0, &replyError{Function: fn, Reason: fmt.Sprintf("remaining is %d", remaining)}
	case retry < -1 || retry > maxMs || reset < 0 || reset > maxMs || delay < 0 || delay > maxMs:
		return Result{}, 0, &replyError{Function: fn, Reason: fmt.Sprintf(
			"durations out of range: retry_after_ms %d, reset_after_ms %d, delay_ms %d", retry, reset, delay)}
	}
	r := Result{
		Allowed:    allowed == 1,
		Limit:      limit,
		Remaining:  remaining,
		RetryAfter: time.Duration(retry) * time.Millisecond,
		ResetAfter: time.Duration(reset) * time.Millisecond,
		Delay:      time.Duration(delay) * time.Millisecond,
	}
	if retry == -1 {
		r.RetryAfter = Never
	}
	return r, v[6], nil
}

// replyErr classifies an error reply: RLERR, a missing function, or anything else (the
// network, the context, another server error), which is wrapped so that errors.Is still sees
// context.DeadlineExceeded or a *valkey.ValkeyError.
func replyErr(fn string, err error) error {
	if verr, ok := valkey.IsValkeyErr(err); ok {
		msg := verr.Error()
		if rest, ok := strings.CutPrefix(msg, "RLERR "); ok {
			return &LibraryError{Function: fn, Message: rest}
		}
		if notFound(msg) {
			return ErrNotLoaded
		}
	}
	return fmt.Errorf("client: %s: %w", fn, err)
}

// notFound reports the server's answer to FCALL of a function it does not have ("ERR
// Function not found"; valkey-go strips the "ERR ").
func notFound(msg string) bool {
	return strings.HasPrefix(msg, "Function not found")
}
