package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/decide"
)

// Server holds the server interceptors, unary and stream, that rate-limit the calls a gRPC
// server serves. It is safe for concurrent use.
type Server struct {
	lim       Decider
	opts      ServerOptions
	methods   map[string]*Policy // Methods, Names defaulted
	services  map[string]*Policy // "/package.Service/*" of Methods, by "package.Service"
	def       *Policy            // Default; nil when it limits nothing
	clock     decide.Clock
	log       decide.ErrorLog
	wouldDeny metric.Int64Counter   // nil without a MeterProvider
	unsettled metric.Int64Counter   // likewise
	near      *decide.PolicyCounter // likewise
	shadows   sync.WaitGroup        // the shadow decisions running, for tests to wait out
	refusals  refusals              // recent refusals' statuses, shared
}

// refuse is the status of a refusal, shared with a recent one that says the same.
func (s *Server) refuse(hide, blocked bool, policy string, wait time.Duration) error {
	return s.refusals.refuse(hide, blocked, policy, wait)
}

// NewServer returns a Server that asks lim for a decision on every call a policy limits, or a
// *ConfigError naming what opts got wrong.
func NewServer(lim Decider, opts ServerOptions) (*Server, error) {
	if l, ok := lim.(*client.Limiter); ok && l == nil {
		lim = nil // a typed nil: every call would panic
	}
	switch {
	case lim == nil:
		return nil, &ConfigError{Field: "Limiter", Reason: "is required"}
	case opts.Key == nil:
		return nil, &ConfigError{Field: "Key", Reason: "is required"}
	case opts.MaxDelay < 0:
		return nil, &ConfigError{Field: "MaxDelay", Reason: "must not be negative, got " + opts.MaxDelay.String()}
	case opts.ErrorCode == codes.Unavailable:
		return nil, &ConfigError{Field: "ErrorCode", Reason: "must not be Unavailable, which clients and meshes retry at once"}
	case opts.ErrorCode > codes.Unauthenticated:
		return nil, &ConfigError{Field: "ErrorCode", Reason: fmt.Sprintf("must be a gRPC code, got %d", opts.ErrorCode)}
	case opts.ErrorCode != codes.OK && opts.FailOpen:
		return nil, &ConfigError{Field: "ErrorCode", Reason: opts.ErrorCode.String() + " cannot be set with FailOpen, which serves those calls"}
	}
	if opts.MaxDelay == 0 {
		opts.MaxDelay = DefaultMaxDelay
	}
	if opts.ErrorCode == codes.OK {
		opts.ErrorCode = codes.Internal
	}
	s := &Server{lim: lim, opts: opts, methods: map[string]*Policy{}, services: map[string]*Policy{},
		clock: decide.NewClock(opts.Now)}
	s.log.Every, s.log.Prefix, s.log.Messages, s.log.Logger = time.Second, "grpclimit: ", &logMessages, opts.Logger
	for name, p := range opts.Methods {
		field := fmt.Sprintf("Methods[%q]", name)
		service, method, ok := splitMethod(name)
		if !ok {
			return nil, &ConfigError{Field: field, Reason: `is no full method name: want "/package.Service/Method", or "/package.Service/*"`}
		}
		var pp *Policy // nil: the method is named, and not limited
		if limits(&p) {
			var err error
			if pp, err = s.compile(p); err != nil {
				return nil, &ConfigError{Field: field, Reason: strings.TrimPrefix(err.Error(), "grpclimit: "), Err: err}
			}
		}
		if method == "*" {
			s.services[service] = pp
		} else {
			s.methods[name] = pp
		}
	}
	if limits(&opts.Default) {
		pp, err := s.compile(opts.Default)
		if err != nil {
			return nil, &ConfigError{Field: "Default", Reason: strings.TrimPrefix(err.Error(), "grpclimit: "), Err: err}
		}
		s.def = pp
	}
	if opts.MeterProvider != nil {
		meter := opts.MeterProvider.Meter("github.com/rlfn/rlfn/client/grpclimit")
		var err error
		s.wouldDeny, err = meter.Int64Counter(MetricWouldDeny, metric.WithUnit("{call}"),
			metric.WithDescription("Calls a limit in shadow would have denied."))
		if err == nil {
			s.unsettled, err = meter.Int64Counter(MetricUnsettled, metric.WithUnit("{call}"),
				metric.WithDescription("Settlements by outcome (refunds, charges) that failed, not retried."))
		}
		if err == nil {
			s.near, err = decide.NewPolicyCounter(opts.MeterProvider, "github.com/rlfn/rlfn/client/grpclimit", MetricNearLimit,
				"{call}", "Calls admitted past their policy's soft limit (NearLimit).")
		}
		if err != nil {
			return nil, &ConfigError{Field: "MeterProvider", Reason: err.Error()}
		}
	}
	return s, nil
}

// logMessages are the default log's lines, by failure, as gRPC answers them.
var logMessages = [...]string{
	decide.Unavailable:   "no rate-limit decision",
	decide.Misconfigured: "rate limit misconfigured, refused Internal",
	decide.RefusedKey:    "key refused, refused InvalidArgument",
	decide.ShadowKey:     "key of a shadow limit failed, call served",
	decide.ShadowFailed:  "shadow decision failed, call served",
	decide.Unreleased:    "lease not released, it expires at its end",
	decide.Unsettled:     "settlement by outcome failed, not retried",
}

// limits reports whether p limits anything; a Meter is checked, so that a Meter without a
// Limit is refused rather than the method served unmetered.
func limits(p *Policy) bool {
	return p.Limit != nil || p.Concurrency != nil || len(p.Also) > 0 || p.Meter != nil
}

// splitMethod splits "/package.Service/Method" into its service and method.
func splitMethod(name string) (service, method string, ok bool) {
	if !strings.HasPrefix(name, "/") {
		return "", "", false
	}
	service, method, ok = strings.Cut(name[1:], "/")
	return service, method, ok && service != "" && method != "" && !strings.Contains(method, "/")
}

// compile checks p, a policy of Options, and returns it with its Name defaulted.
func (s *Server) compile(p Policy) (*Policy, error) {
	if p.Name == "" {
		p.Name = DefaultPolicyName
	}
	if err := checkPolicy(&p); err != nil {
		return nil, err
	}
	if p.Limit != nil {
		if err := decide.ValidLimit(p.Limit); err != nil {
			return nil, &PolicyError{Name: p.Name, Reason: "Limit: " + decide.LimitReason(err), Err: err}
		}
	}
	if p.Concurrency != nil {
		if err := p.Concurrency.Validate(); err != nil {
			return nil, &PolicyError{Name: p.Name, Reason: "Concurrency: " + decide.LimitReason(err), Err: err}
		}
		if _, ok := s.lim.(Acquirer); !ok {
			return nil, ErrNoAcquirer
		}
	}
	for _, rule := range p.Also {
		if err := decide.ValidLimit(rule.Limit); err != nil {
			return nil, &PolicyError{Name: rule.Name, Reason: "Limit: " + decide.LimitReason(err), Err: err}
		}
	}
	if _, ok := s.lim.(MultiDecider); !ok && (decide.Several(spec(p)) || p.Cost != nil) {
		return nil, ErrNoMultiDecider
	}
	if p.Meter != nil {
		if err := checkMeter(s.lim, &p); err != nil {
			return nil, err
		}
	}
	if p.Outcome != nil {
		if _, ok := s.lim.(Settler); !ok {
			return nil, ErrNoSettler
		}
		if p.Outcome.CostTrailer != "" && strings.ToLower(p.Outcome.CostTrailer) != p.Outcome.CostTrailer {
			return nil, &PolicyError{Name: p.Name, Reason: "Outcome.CostTrailer must be lower case, as gRPC metadata keys are"}
		}
		if p.Outcome.CheckFirst && p.Limit == nil && len(p.Also) == 0 {
			return nil, &PolicyError{Name: p.Name, Reason: "Outcome.CheckFirst needs a Limit"}
		}
	}
	return &p, nil
}

// checkPolicy reports why the interceptors cannot apply p, as a *PolicyError.
func checkPolicy(p *Policy) error {
	bad, reason := decide.Check(p.Name, p.Unit, p.EnforcePercent, len(p.Also), func(i int) decide.Named {
		return p.Also[i].named()
	})
	if reason == "" {
		bad, reason = decide.CheckSameKey(p.Name, p.Limit, len(p.Also), func(i int) decide.Named {
			return p.Also[i].named()
		})
	}
	if reason == "" {
		bad, reason = p.Name, decide.CheckNear(p.NearLimit)
	}
	if reason != "" {
		return &PolicyError{Name: bad, Reason: reason}
	}
	return nil
}

// spec is p as the decision's checks see it.
func spec(p Policy) decide.Spec {
	s := decide.Spec{Limit: p.Limit, Concurrency: p.Concurrency != nil, Shadow: p.Shadow, EnforcePercent: p.EnforcePercent,
		Refunds: p.Outcome != nil && !p.Outcome.CheckFirst, Holds: p.Meter != nil}
	for _, rule := range p.Also {
		s.Also = append(s.Also, rule.named())
	}
	return s
}

// Needs is the library release the decisions of p need, as httplimit.Needs says.
func Needs(p Policy) string { return decide.Needs(spec(p)) }

// policy is the policy of a full method name, nil when the method is not limited.
func (s *Server) policy(method string) *Policy {
	if p, ok := s.methods[method]; ok {
		return p
	}
	if len(s.services) > 0 {
		if service, _, ok := splitMethod(method); ok {
			if p, ok := s.services[service]; ok {
				return p
			}
		}
	}
	return s.def
}

// LimiterKey is the key of the Limiter that a Policy (or an AlsoLimit) named name counts
// principal's calls against, as httplimit.LimiterKey: an operator blocks a principal with
// the Limiter's Block on it. An AlsoLimit with SameKey counts on its Policy's.
func LimiterKey(name, principal string) string {
	if name == "" {
		name = DefaultPolicyName
	}
	return name + ":" + principal
}

// UnaryInterceptor returns the unary server interceptor.
func (s *Server) UnaryInterceptor() grpc.UnaryServerInterceptor { return s.unary }

// StreamInterceptor returns the stream server interceptor: a stream is decided once, when it
// opens, and holds its Concurrency lease until its handler returns.
func (s *Server) StreamInterceptor() grpc.StreamServerInterceptor { return s.stream }

func (s *Server) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	p := s.policy(info.FullMethod)
	if p == nil {
		return handler(ctx, req)
	}
	c, err := s.admit(ctx, info.FullMethod, p, req, nil)
	if err != nil {
		return nil, err
	}
	if c.p == nil {
		return handler(ctx, req) // nothing to release or settle
	}
	if c.cost != nil {
		if sts := grpc.ServerTransportStreamFromContext(ctx); sts != nil {
			c.cost.ServerTransportStream = sts
			ctx = grpc.NewContextWithServerTransportStream(ctx, c.cost)
		}
	}
	defer c.recover(ctx)
	resp, err = handler(ctx, req)
	if c.mt != nil {
		c.mt.unaryResponse(ctx, &c, resp, err)
	}
	c.end(ctx, status.Code(err))
	return resp, err
}

func (s *Server) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	p := s.policy(info.FullMethod)
	if p == nil {
		return handler(srv, ss)
	}
	ctx := ss.Context()
	c, err := s.admit(ctx, info.FullMethod, p, nil, ss)
	if err != nil {
		return err
	}
	if c.p == nil {
		return handler(srv, ss)
	}
	if c.cost != nil {
		if sts := grpc.ServerTransportStreamFromContext(ctx); sts != nil {
			c.cost.ServerTransportStream = sts
			ctx = grpc.NewContextWithServerTransportStream(ctx, c.cost)
		}
		ss = &costServerStream{ServerStream: ss, ctx: ctx, cost: c.cost}
	}
	if c.mt != nil {
		ss = &meteredStream{ServerStream: ss, c: &c}
	}
	defer c.recover(ctx)
	// A stream's handler returns however the stream ends: its client cancels or its deadline
	// passes (the context ends, and a handler that reads or sends gets the error), it fails,
	// or it finishes. The lease is released then, on every one of these paths.
	err = handler(srv, ss)
	if c.mt != nil && c.mt.cut != nil {
		err = c.mt.cut // cut by its meter: whatever the handler made of it, the call ends so
	}
	c.end(ctx, status.Code(err))
	return err
}

// call is what an admitted call owes after its handler: a lease to release, units to settle.
// Its zero value (p nil) owes nothing.
type call struct {
	s      *Server
	p      *Policy
	method string
	lease  *client.Lease
	rules  []client.Rule // the enforced limits, to settle (with an Outcome)
	// whether each rule had a Cost function: its cost was an estimate
	measured []bool
	cost     *costStream // the cost trailer, with Outcome.CostTrailer
	mt       *metering   // the call's meter, with a Meter
}

// recover settles a call whose handler panicked as failed (Internal), then panics on: a
// panic is an outcome too, and the lease is owed whatever happens next.
func (c *call) recover(ctx context.Context) {
	if v := recover(); v != nil {
		c.end(ctx, codes.Internal)
		panic(v)
	}
}

// end releases the call's lease and settles its units, once.
func (c *call) end(ctx context.Context, code codes.Code) {
	if c.p == nil {
		return
	}
	p := c.p
	c.p = nil
	// The call's context may be over (cancelled, past its deadline): what it owes is owed
	// anyway.
	ctx = context.WithoutCancel(ctx)
	if c.lease != nil {
		if _, err := c.lease.Release(ctx); err != nil {
			c.s.report(ctx, c.method, decide.Unreleased, p.Name, err)
		}
	}
	if c.mt != nil {
		c.settle(ctx, p, code)
		return
	}
	o := p.Outcome
	if o == nil || len(c.rules) == 0 {
		return
	}
	var reported int64
	ok := false
	if c.cost != nil {
		reported, ok = c.cost.cost, c.cost.set
	}
	taken, owed := decide.Owed(c.rules, c.measured, o.CheckFirst, o.Count == nil || o.Count(code), reported, ok)
	if err := decide.Settle(ctx, c.s.lim.(Settler), c.rules, taken, owed); err != nil {
		if c.s.unsettled != nil {
			c.s.unsettled.Add(ctx, 1, metric.WithAttributes(attribute.String("rlfn.policy", p.Name)))
		}
		c.s.report(ctx, c.method, decide.Unsettled, p.Name, &UnsettledError{Policy: p.Name, Taken: taken, Owed: owed, Err: err})
	}
}

// admit decides a call of method under p. req is a unary call's request, ss a stream call's
// stream. It returns the status error of a call that is not to be served.
func (s *Server) admit(ctx context.Context, method string, p *Policy, req any, ss grpc.ServerStream) (call, error) {
	key, err := s.opts.Key(ctx, method)
	if err == nil && key == "" {
		err = ErrEmptyKey
	}
	if err != nil {
		if p.Shadow && p.Concurrency == nil {
			// Nothing enforced needs the key: shadow limits never refuse.
			s.report(ctx, method, decide.ShadowKey, p.Name, &ShadowKeyError{Policy: p.Name, Err: err})
			return call{}, nil
		}
		return call{}, keyStatus(err)
	}
	// The decisions are the policy's in the Limiter's metrics, spans and log lines: its Name is
	// in the key, not in the Limit, so each call names it (decide.Allow, Rule.Name), without a
	// context of its own.
	dctx := ctx
	if p.Critical {
		dctx = client.Critical(dctx)
	}
	shadow := decide.InShadow(key, p.Shadow, p.EnforcePercent)
	// The name cannot contain ':', so "name:key" is injective. The key and the metadata
	// values share one allocation (see callBuf).
	cb := new(callBuf)
	key = cb.key(p.Name, key)
	var res client.Result
	var each []client.Result
	var quotas []decide.Quota
	var set decide.Set
	c := call{s: s, p: p, method: method}
	switch {
	case len(p.Also) == 0 && !shadow && p.Outcome == nil && p.Cost == nil && p.Meter == nil:
		// the common policy, one limit: no rule slices
		if p.Limit == nil {
			return s.concurrent(ctx, dctx, method, p, key, call{})
		}
		res, err = decide.Allow(dctx, s.lim, p.Name, key, p.Limit)
		quotas = []decide.Quota{{Name: p.Name, Limit: p.Limit, Unit: p.Unit}}
	default:
		if c.measured, err = s.split(ctx, method, p, key, req, shadow, &set); err != nil {
			return call{}, err
		}
		switch {
		case len(set.Enforced) == 0 && p.Concurrency == nil:
			return call{}, nil // every limit in shadow: served
		case len(set.Enforced) == 0:
			return s.concurrent(ctx, dctx, method, p, key, call{})
		case p.Meter != nil && slices.Contains(c.measured, true):
			res, each, quotas, c.mt, err = s.openMeter(dctx, p, &set, c.measured)
		case p.Meter != nil:
			// The limits with a Cost are all in shadow: nothing to meter, and the calls'
			// limit is decided as without a Meter (not metered per unit in their place).
			res, each, quotas, err = decide.DecideEnforced(dctx, s.lim, &set, p.HideQuota, ErrNoMultiDecider)
		case p.Outcome != nil && p.Outcome.CheckFirst:
			res, err = decide.PeekAll(dctx, s.lim.(Settler), set.Enforced)
			quotas = set.EnforcedQuotas
			if err == nil && res.Rule != 0 {
				quotas = decide.DecidingFirst(quotas, res.Rule)
			}
		default:
			res, each, quotas, err = decide.DecideEnforced(dctx, s.lim, &set, p.HideQuota, ErrNoMultiDecider)
		}
	}
	if err != nil {
		return call{}, s.limiterError(ctx, method, p.Name, err)
	}
	if !res.Allowed {
		s.setMetadata(ctx, ss, cb, p.HideQuota, quotas, res, each, res.RetryAfter, true, false)
		return call{}, s.refuse(p.HideQuota, res.Blocked, quotas[0].Name, res.RetryAfter)
	}
	if res.Delay > s.opts.MaxDelay {
		// The server has counted this call and it is refused all the same, as promised.
		wait := decide.TooLongWait(res.Delay, s.opts.MaxDelay, quotas)
		c.drop(ctx)
		s.setMetadata(ctx, ss, cb, p.HideQuota, quotas, res, each, wait, true, false)
		return call{}, s.refuse(p.HideQuota, false, quotas[0].Name, wait)
	}
	near := decide.Near(res, p.NearLimit)
	if near {
		s.near.Add(ctx, p.Name)
	}
	s.setMetadata(ctx, ss, cb, p.HideQuota, quotas, res, each, 0, false, near)
	if p.Outcome != nil {
		c.rules = set.Enforced
		if p.Outcome.CostTrailer != "" {
			c.cost = &costStream{name: p.Outcome.CostTrailer}
		}
	}
	if res.Delay > 0 && !decide.Hold(ctx.Done(), res.Delay) {
		// The call never ran: what the decision took stays taken, as for any refusal.
		c.drop(ctx)
		return call{}, status.FromContextError(ctx.Err()).Err()
	}
	if p.Concurrency != nil {
		return s.concurrent(ctx, dctx, method, p, key, c)
	}
	if p.Outcome == nil && c.mt == nil {
		return call{}, nil
	}
	return c, nil
}

// split puts p's limits for a call into set: the enforced ones and the shadow ones, whose
// decision it starts beside the call. With an Outcome or a Meter, it returns whether each
// enforced limit has a Cost function.
func (s *Server) split(ctx context.Context, method string, p *Policy, key string, req any, shadow bool, set *decide.Set) (measured []bool, err error) {
	sp := decide.NewSplit(p.Name, key, shadow, p.Outcome != nil || p.Meter != nil)
	if p.Limit != nil {
		switch c := cost(ctx, p.Cost, method, req); {
		case !decide.BadCost(c):
			sp.Own(p.Limit, c, p.Unit, p.Cost != nil)
		case !shadow:
			return nil, errBadCost
		} // a shadow limit never refuses: one whose cost is bad is left out
	}
	for i := range p.Also {
		a := &p.Also[i]
		c := cost(ctx, a.Cost, method, req)
		if decide.BadCost(c) {
			if !shadow && !a.Shadow {
				return nil, errBadCost
			}
			continue
		}
		var principal string
		var keyErr error
		if a.Key != nil {
			principal, keyErr = a.Key(ctx, method)
		}
		k, skip, err := sp.Key(a.named(), principal, keyErr, ErrEmptyKey)
		switch {
		case err != nil:
			return nil, keyStatus(err)
		case skip != nil:
			s.report(ctx, method, decide.ShadowKey, a.Name, &ShadowKeyError{Policy: a.Name, Err: skip})
			continue
		}
		sp.Add(a.named(), k, c)
	}
	*set = sp.Set
	if len(set.Shadow) > 0 {
		// Beside the call, which does not wait for it: a roll-out adds no round trip. The
		// limiter's own deadline bounds how long it runs.
		s.shadows.Add(1)
		go s.shadow(context.WithoutCancel(ctx), method, set.Shadow, set.ShadowQuotas)
	}
	return sp.Metered(), nil
}

// errBadCost refuses a call whose Cost function computed a cost no limit takes from what the
// call sent (see Policy.Cost): the caller's fault, so nothing is reported.
var errBadCost = status.Error(codes.InvalidArgument, "grpclimit: invalid cost")

// cost is a Cost function's units for a call, 0 (one, the call's) without one.
func cost(ctx context.Context, f Cost, method string, req any) int64 {
	if f == nil {
		return 0
	}
	return f(ctx, method, req)
}

// shadow decides the shadow limits of a call, and counts a denial. A panic on its goroutine
// would end the process: it is recovered and logged.
func (s *Server) shadow(ctx context.Context, method string, rules []client.Rule, quotas []decide.Quota) {
	defer s.shadows.Done()
	defer func() {
		if v := recover(); v != nil {
			s.logger().ErrorContext(ctx, "grpclimit: panic in a shadow decision", "panic", v,
				"method", method, "stack", string(debug.Stack()))
		}
	}()
	decide.RunShadow(ctx, s.lim, rules, quotas, ErrNoMultiDecider,
		func(kind decide.Failure, name string, err error) { s.report(ctx, method, kind, name, err) },
		func(name string) {
			if s.wouldDeny != nil {
				s.wouldDeny.Add(ctx, 1, metric.WithAttributes(attribute.String("rlfn.policy", name)))
			}
			if s.opts.OnShadowDeny != nil {
				s.opts.OnShadowDeny(ctx, method, name)
			}
		})
}

// concurrent takes the call's lease of p.Concurrency into c. A call it refuses never runs: what
// Limit took stays taken, and nothing is settled.
func (s *Server) concurrent(ctx, dctx context.Context, method string, p *Policy, key string, c call) (call, error) {
	acq, ok := s.lim.(Acquirer)
	if !ok {
		return call{}, s.failed(ctx, method, p.Name, ErrNoAcquirer)
	}
	lease, res, err := decide.Acquire(dctx, acq, p.Name, key, *p.Concurrency)
	if err != nil {
		c.drop(ctx)
		return call{}, s.limiterError(ctx, method, p.Name, err)
	}
	if !res.Allowed {
		c.drop(ctx)
		return call{}, s.refuse(p.HideQuota, false, p.Name, res.RetryAfter)
	}
	c.s, c.p, c.method, c.lease = s, p, method, lease
	return c, nil
}

// limiterError answers an error of the limiter's decision.
func (s *Server) limiterError(ctx context.Context, method, policy string, err error) error {
	if ctx.Err() != nil {
		// The client went away, or its deadline passed: the limiter did not fail.
		return status.FromContextError(ctx.Err()).Err()
	}
	return s.failed(ctx, method, policy, err)
}

// failed answers a call left without a decision because of err, and reports err. A nil error
// serves the call (FailOpen).
func (s *Server) failed(ctx context.Context, method, policy string, err error) error {
	kind := classify(err)
	s.report(ctx, method, kind, policy, err)
	switch kind {
	case decide.RefusedKey:
		return keyStatus(err)
	case decide.Misconfigured:
		return status.Error(codes.Internal, "grpclimit: rate limit misconfigured")
	}
	if s.opts.FailOpen {
		return nil
	}
	return status.Error(s.opts.ErrorCode, "grpclimit: rate limiter unavailable")
}

// classify is the failure of an error that left a call without a decision.
func classify(err error) decide.Failure {
	return decide.Classify(err, ErrEmptyKey, func(err error) bool {
		var pe *PolicyError
		return errors.As(err, &pe) || errors.Is(err, ErrNoMultiDecider) || errors.Is(err, ErrNoAcquirer) || errors.Is(err, ErrNoSettler) || errors.Is(err, ErrNoMeterer)
	})
}

// report passes err to OnError, or logs it.
func (s *Server) report(ctx context.Context, method string, kind decide.Failure, policy string, err error) {
	if s.opts.OnError != nil {
		s.opts.OnError(ctx, method, err)
		return
	}
	s.log.Log(ctx, kind, policy, err, "method", method)
}

// logger is ServerOptions.Logger, or slog.Default().
func (s *Server) logger() *slog.Logger {
	if s.opts.Logger != nil {
		return s.opts.Logger
	}
	return slog.Default()
}

// keyStatus is the status of a call whose principal could not be read or was refused.
func keyStatus(err error) error {
	var ke *client.KeyError
	switch {
	case errors.As(err, &ke) && ke.Len > 0:
		return status.Error(codes.InvalidArgument, "grpclimit: key too long")
	case errors.As(err, &ke) || errors.Is(err, ErrEmptyKey):
		return status.Error(codes.InvalidArgument, "grpclimit: missing key")
	}
	return status.Error(codes.InvalidArgument, "grpclimit: missing or unreadable key")
}

// Metadata keys of the quota state (draft-ietf-httpapi-ratelimit-headers-11's fields, in
// lower case as gRPC metadata keys are).
const (
	MetadataPolicy    = "ratelimit-policy"
	MetadataRateLimit = "ratelimit"
)

// callBuf holds the strings of one call that are made of bytes written once, never after:
// its limiter key, then its metadata values, in one allocation rather than three. A string
// points into buf only where its bytes are final, so the key stays valid wherever the Limiter
// keeps it.
type callBuf struct {
	vals [2]string
	// a key and the values of one limit or two take 40 to 120 bytes; more get an array of
	// their own
	buf [144]byte
	off int // where the key ends in buf: the metadata values go after it
}

// key is "name:principal", in cb when it fits.
func (cb *callBuf) key(name, principal string) string {
	b := append(append(append(cb.buf[:0], name...), ':'), principal...)
	if len(b) > len(cb.buf) {
		return string(b) // it did not fit: b is an array of its own
	}
	cb.off = len(b)
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// setMetadata sends the quota state of a decision as header metadata: the draft's
// RateLimit-Policy and RateLimit values (decide.AppendValues), and with near MetadataNear. A
// hidden quota sends none.
func (s *Server) setMetadata(ctx context.Context, ss grpc.ServerStream, cb *callBuf, hide bool, quotas []decide.Quota, res client.Result, each []client.Result, wait time.Duration, refused, near bool) {
	if hide {
		return
	}
	// After the key, in the call's buffer: written once, here, and never after, so the
	// strings may point into it. Values that do not fit get an array of their own (append's).
	v := decide.AppendValues(cb.buf[cb.off:cb.off], s.clock, decide.ResetNone, quotas, res, each, wait, refused)
	str := unsafe.String(unsafe.SliceData(v.Buf), len(v.Buf))
	cb.vals = [2]string{str[:v.Ends[0]], str[v.Ends[0]:v.Ends[1]]}
	md := metadata.MD{MetadataPolicy: cb.vals[0:1:1], MetadataRateLimit: cb.vals[1:2:2]}
	if near {
		md[MetadataNear] = []string{`"` + quotas[0].Name + `"`}
	}
	if ss != nil {
		ss.SetHeader(md)
		return
	}
	grpc.SetHeader(ctx, md) // fails only outside a server call: nobody to tell
}

// VersionChecker is what Check needs of the Limiter, as *client.Limiter has it.
type VersionChecker interface {
	CheckVersion(ctx context.Context, min string) error
}

var _ VersionChecker = (*client.Limiter)(nil)

// ErrNoVersionChecker is returned by Check when the Limiter cannot tell what its servers run.
var ErrNoVersionChecker = errors.New("grpclimit: Check needs a Limiter that implements VersionChecker, such as *client.Limiter")

// ReleaseError reports policies that need a library release that a node does not run (or
// whose nodes could not be asked), from Check.
type ReleaseError struct {
	Policies []string // the Names of the policies that need Release
	Release  string   // e.g. "1.1.0"
	Err      error    // the Limiter's: a *client.VersionError per node that runs an older one, joined
}

func (e *ReleaseError) Error() string {
	return fmt.Sprintf("grpclimit: policies %q need library %s: %v", e.Policies, e.Release, e.Err)
}

// Unwrap returns the Limiter's error, so that errors.As finds a *client.VersionError in it.
func (e *ReleaseError) Unwrap() error { return e.Err }

// Check verifies that every primary of the Limiter's servers runs the library release each
// policy of Methods and Default needs (Needs), as httplimit's Check: call it at start-up, so
// that a node that still runs an older release is found before the first call. It returns
// nil, or a *ReleaseError per release some policies need and a node lacks, joined.
func (s *Server) Check(ctx context.Context) error {
	vc, ok := s.lim.(VersionChecker)
	if !ok {
		return ErrNoVersionChecker
	}
	seen := map[*Policy]bool{}
	var names, rels []string
	add := func(p *Policy) {
		if p != nil && !seen[p] {
			seen[p] = true
			names, rels = append(names, p.Name), append(rels, Needs(*p))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(s.methods)) {
		add(s.methods[name])
	}
	for _, name := range slices.Sorted(maps.Keys(s.services)) {
		add(s.services[name])
	}
	add(s.def)
	missing, err := decide.CheckReleases(ctx, vc, names, rels)
	if err != nil {
		return fmt.Errorf("grpclimit: check: %w", err)
	}
	var errs []error
	for _, m := range missing {
		errs = append(errs, &ReleaseError{Policies: m.Policies, Release: m.Release, Err: m.Err})
	}
	return errors.Join(errs...)
}
