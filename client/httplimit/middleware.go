package httplimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/decide"
)

// Decider is what the middleware needs of a *client.Limiter, so that any decision maker (a
// fake in tests, a wrapper that records decisions) can stand in for it.
type Decider interface {
	Allow(ctx context.Context, key string, limit client.Limit) (client.Result, error)
}

var _ Decider = (*client.Limiter)(nil)

// DefaultMaxDelay is Options.MaxDelay when it is zero.
const DefaultMaxDelay = time.Second

// DefaultPolicyName is Policy.Name when it is empty.
const DefaultPolicyName = "default"

// Policy is the limit a request is counted against.
type Policy struct {
	// Name names the policy in the RateLimit headers and scopes its state: requests with the
	// same Name and key share one limiter, so two routes with their own Names have their own
	// budgets, and two with one Name share it. Letters, digits, '_', '.' and '-' only.
	// Default (empty): DefaultPolicyName, "default".
	Name string
	// Limit is the limiter's configuration, e.g. client.TokenBucket{...}, or a
	// client.Calendar (library 1.2.0), a quota per day, week, month or year in a time zone,
	// whose headers describe the window that holds now. A limit with a Penalty (library 1.2.0)
	// blocks the principal once it denies a request: the requests of the block are answered 429
	// with Retry-After the block's time left (client.Result.Blocked), as are those of a block an
	// operator set (see LimiterKey). Default (nil): the request is not rate-limited: no call, no
	// rate-limit headers.
	Limit client.Limit
	// Concurrency, when not nil, caps the requests of one key in flight at once: the request
	// holds a lease of it (library 1.1.0) from after Limit admits it until the next handler
	// returns, or panics. Make Lease longer than the longest request: the lease is not renewed,
	// and one that expires frees its slot early. A request refused a slot is answered 429 with
	// Retry-After (the unit Limit took stays taken). The Limiter must be a *client.Limiter (or
	// implement Acquirer). Default (nil): no concurrency limit.
	Concurrency *client.Concurrency
	// Critical marks the route's requests critical (client.Critical): they may use the Reserve
	// of Limit and of Concurrency, which other routes leave to them. Default: false.
	Critical bool
	// Also are further limits decided with Limit, all or nothing (client.AllowAll: either
	// every one admits the request and counts it, or none counts it), each reported as an
	// item of RateLimit-Policy. Rules of other keys (the login pattern: per (IP, user), per
	// IP, per user) take their Key. The Limiter must be a *client.Limiter (or implement
	// MultiDecider) when more than one limit is enforced. Default (nil): Limit alone.
	Also []AlsoLimit
	// HideQuota sends none of the RateLimit-Policy, RateLimit and X-RateLimit-* headers, and
	// answers 429 with a body that names no policy and no wait: only Retry-After says when to
	// come back. For authentication routes, where "4 attempts left" tells an attacker how
	// fast to guess. Default: false.
	HideQuota bool
	// Shadow decides the route's limits (counting the requests in the limiter, as enforced
	// limits would) but serves every request: a denial is only counted, in the metric
	// MetricWouldDeny, and sent to Options.OnShadowDeny. Shadow limits send no headers.
	// Roll a new limit out in shadow, watch what it would deny, then enforce it. An AlsoLimit can be
	// in shadow on its own (AlsoLimit.Shadow). Concurrency is always enforced. The shadow decision
	// runs beside the request and may end after the response: OnShadowDeny and OnError may be
	// called once the request's context is over. A Key error does not refuse a request whose
	// limits are all in shadow: it goes to OnError, and the request is served. Default: false.
	Shadow bool
	// EnforcePercent, from 1 to 100, enforces the route's limits for that share of the keys
	// (Options.Key's) and decides them in shadow for the others: the dial of a gradual
	// roll-out. A key is in or out by a hash of it, the same on every request and every
	// instance, so a client is not refused one request in two. Default (0): 100, all keys.
	EnforcePercent int
	// Cost returns the units the request takes of Limit, for a limit of something else than
	// requests (tokens, bytes): "60 requests and 150,000 tokens per minute" is a Policy of the
	// requests and an AlsoLimit of the tokens whose Cost is the request's estimate, decided at
	// once. A cost of 0 takes 1, as client.Rule's. A negative cost, or one above
	// 999999999999999, is the request's fault (a cost comes from what the client sent, a
	// max_tokens): answered 400 "invalid cost" without a decision, and not reported to
	// OnError; a Cost that cannot read the request returns -1 for that. A limit in shadow
	// whose cost is invalid is left out. With a Cost the Limiter must be a *client.Limiter (or
	// implement MultiDecider). Default (nil): 1.
	Cost func(r *http.Request) int64
	// Unit names what Limit counts, sent as the RateLimit-Policy item's qu parameter (the
	// draft's quota unit), e.g. "tokens". Letters, digits, '_', '.' and '-' only. Default
	// (empty): requests, the draft's default, no qu.
	Unit string
	// Outcome, when not nil, settles each request by how it ended: gives its units back when
	// it does not count (a login limiter that counts failures, an API that charges only
	// successes), or takes the cost the handler reported after the fact (an LLM's tokens).
	// See Outcome. Default (nil): the decision before the handler is final.
	Outcome *Outcome
	// NearLimit, from 0 to 1, is the soft limit that warns before the limit refuses: a
	// request admitted with at least this share of its deciding limit used (1 - remaining /
	// limit) gets the header RateLimit-Near naming the policy ("api"), and is counted in
	// MetricNearLimit, so that a client can slow down, and an operator see who is about to be
	// refused, before a 429. A hidden quota (HideQuota) is counted but sends no header.
	// Default (0): off.
	NearLimit float64
}

// AlsoLimit is a limit of a Policy beside its Limit (Policy.Also).
type AlsoLimit struct {
	// Name names the limit in the headers and scopes its state, as Policy.Name does; it must
	// differ from the Policy's and from the other AlsoLimits' Names. Required.
	Name string
	// Limit is the limiter's configuration, as Policy.Limit (a Calendar, a Penalty). Its
	// Penalty blocks this limit's key, LimiterKey(Name, principal): the principal of this
	// AlsoLimit only. Required.
	Limit client.Limit
	// Key returns the principal this limit counts the request against. Default (nil):
	// Options.Key's. An error answers 400, as Options.Key's does. Without a Key (and without
	// SameKey) the limit keeps its state on a key of its own, LimiterKey(Name, principal).
	Key func(r *http.Request) (string, error)
	// SameKey counts this limit on the Policy's own key, LimiterKey(Policy.Name, principal),
	// beside the Policy's Limit, rather than on a key of its own: the limits of one key are
	// decided by one atomic call (rl_multi, library 1.1.0) in the principal's cluster slot,
	// where limits of several keys take one call each, and refunds when one refuses. "60
	// requests and 150,000 tokens a minute" is one call. The state is the Limit's own on that
	// key, named by its algorithm and its Name (client.Limiter.Key): two limits of one
	// algorithm there need the client's Name to tell them apart (New refuses a pair that would
	// be one limiter). A Penalty then blocks the Policy's key: every limit with a Penalty on it
	// obeys the block. It cannot be set with Key. Default: false, the key of its own, as
	// before: setting it moves the limit's state to a new key, starting from a full limit.
	SameKey bool
	// Shadow decides this limit in shadow (see Policy.Shadow): an error of its Key goes to
	// Options.OnError and leaves the limit out, never refusing the request. Default: false.
	Shadow bool
	// Cost returns the units the request takes of this limit, as Policy.Cost. Default (nil): 1.
	Cost func(r *http.Request) int64
	// Unit names what this limit counts, as Policy.Unit. Default (empty): requests.
	Unit string
}

// named is a as the decision's checks and split see it.
func (a *AlsoLimit) named() decide.Named {
	return decide.Named{Name: a.Name, Limit: a.Limit, Shadow: a.Shadow, Unit: a.Unit,
		SameKey: a.SameKey, OwnKey: a.Key != nil, HasCost: a.Cost != nil}
}

// Acquirer is what a Policy with Concurrency needs of the Limiter, as *client.Limiter has it.
type Acquirer interface {
	Acquire(ctx context.Context, key string, c client.Concurrency) (*client.Lease, client.Result, error)
}

var _ Acquirer = (*client.Limiter)(nil)

// MultiDecider is what a Policy enforcing several limits needs of the Limiter, as
// *client.Limiter has it.
type MultiDecider interface {
	AllowAll(ctx context.Context, rules []client.Rule) (client.Result, error)
}

var _ MultiDecider = (*client.Limiter)(nil)

// EachDecider is what a Policy enforcing several limits needs to report each of them in
// RateLimit, as *client.Limiter has it (client.Limiter.AllowAllEach). With a MultiDecider that
// is not one, RateLimit has the deciding limit alone.
type EachDecider interface {
	AllowAllEach(ctx context.Context, rules []client.Rule, n int64) (client.Result, []client.Result, error)
}

var _ EachDecider = (*client.Limiter)(nil)

// ErrNoMultiDecider is passed to Options.OnError, and answered 500, when a Policy enforces
// several limits and the Limiter cannot decide them at once (it does not implement
// MultiDecider). New refuses such a Policy in Options.Policies.
var ErrNoMultiDecider = errors.New("httplimit: Policy.Also needs a Limiter that implements MultiDecider, such as *client.Limiter")

// ErrNoAcquirer is passed to Options.OnError, and answered 500, when a Policy has a
// Concurrency and the Limiter cannot take leases (it does not implement Acquirer). New refuses
// such a Policy in Options.Policies.
var ErrNoAcquirer = errors.New("httplimit: Policy.Concurrency needs a Limiter that implements Acquirer, such as *client.Limiter")

// ErrNoSettler is passed to Options.OnError, and answered 500, when a Policy has an Outcome and
// the Limiter cannot settle it (it does not implement Settler). New refuses such a Policy in
// Options.Policies.
var ErrNoSettler = errors.New("httplimit: Policy.Outcome needs a Limiter that implements Settler, such as *client.Limiter")

// Options configures a Middleware. Key and Policy are required.
type Options struct {
	// Key returns the principal a request is counted against: a user ID, an API key, the
	// client's IP (see RemoteIP). Any string is safe: the client escapes it. An error, or an
	// empty key, answers 400 Bad Request without a decision ("missing or unreadable key",
	// "missing key"), because a request that cannot be attributed would otherwise be served
	// unlimited. The Limiter bounds the key it takes, the Policy's Name and ':' included
	// (client.Options.MaxKeyLen, 512 bytes by default): a longer one is
	// answered 400 "key too long". Key a long identifier by a hash of it. Required.
	Key func(r *http.Request) (string, error)
	// Policy returns the limit of a request: per route, per tier. Required.
	Policy func(r *http.Request) Policy
	// Policies are the policies Policy returns, when they are known at start-up (every route's
	// limits are constants): New refuses one that cannot be valid (its Name, a Limit the client
	// would refuse, an AlsoLimit without a Name or a Limit, EnforcePercent out of range, a Limiter
	// that cannot serve it) with an *ConfigError naming it, and Check verifies that every node
	// runs the library release they need. Policy may return others; they are checked when a
	// request meets them. Default (nil): none.
	Policies []Policy
	// MaxDelay is the longest a request admitted with a delay (a LeakyBucket in Shape mode) is
	// held before the next handler runs; a longer delay is answered 429. Default (zero):
	// DefaultMaxDelay, one second. A request whose context ends first is answered 503.
	MaxDelay time.Duration
	// ErrorStatus is the status of a request the limiter could not decide (its server
	// unreachable, its deadline passed, its circuit open, its library absent or too old), from
	// 400 to 599. With a *client.Limiter only client.ReturnError leaves such a request to the
	// middleware: its default, client.LocalFallback, decides it in-process. Default (zero):
	// 503 Service Unavailable, because the condition is temporary and a client (or a load
	// balancer) may retry; it never answers a configuration mistake (500) or a refused key
	// (400).
	ErrorStatus int
	// FailOpen serves the requests the limiter could not decide (those ErrorStatus would
	// answer) with no limit at all, and no rate-limit headers: a choice to make knowingly, since
	// the service then runs unprotected exactly when its limiter's server is down, perhaps under
	// the load it was to limit. A configuration mistake is still answered 500 and a refused key
	// 400: a limit that cannot be valid is a bug to fix, not a reason to stop limiting. It
	// cannot be set with ErrorStatus. Default: false.
	FailOpen bool
	// OnError is called with each error that leaves a request without a decision, before it is
	// answered; it must be safe for concurrent use. These are the limiter's errors (among them
	// a *client.KeyError, answered 400: a service whose keys are all too long answers every
	// request so), a *PolicyError, ErrNoMultiDecider, ErrNoAcquirer and ErrNoSettler. A request whose context ended during the decision (its client went away) is
	// neither reported nor answered. Options.Key's own errors are the request's, answered 400
	// and not reported.
	//
	// Default (nil): the error is logged with slog.Default(), saying what is wrong, at most
	// once a second per kind of failure and, for a misconfigured route, per policy (with a
	// count of the errors not logged), so a dead server does not flood the log and one route's
	// mistake never hides another's.
	//
	// It also gets the errors of a Key that only limits in shadow need (the request is served),
	// then wrapped in a *ShadowKeyError, and each settlement by outcome that failed (Outcome),
	// as an *UnsettledError.
	OnError func(r *http.Request, err error)
	// Reset is the form of X-RateLimit-Reset. Default (ResetUnix): a Unix time in seconds, as
	// GitHub and X send it.
	Reset ResetFormat
	// ProblemJSON answers the responses the middleware writes itself (429, 400, 500, 503) as RFC
	// 9457 problem details, application/problem+json: a 429 of the ratelimit draft's
	// quota-exceeded type, naming the violated policy. Default: false, the JSON body of the
	// package documentation.
	ProblemJSON bool
	// OnShadowDeny is called with the policy (the AlsoLimit's Name, or Policy.Name) of each request
	// a limit in shadow would have denied; it must be safe for concurrent use. Default (nil):
	// the denial is only counted in MetricWouldDeny (with MeterProvider).
	OnShadowDeny func(r *http.Request, policy string)
	// MeterProvider, when not nil, records MetricWouldDeny. Default (nil): no instrument.
	MeterProvider metric.MeterProvider
	// Logger receives the default OnError's lines and a shadow decision's panic. The
	// Limiter's own lines (a node's calls going to its Fallback and back, a circuit breaker, a
	// node without the library) go to its client.Options.Logger. Default (nil):
	// slog.Default(); slog.New(slog.DiscardHandler) silences them.
	Logger *slog.Logger
	// Now is the clock of X-RateLimit-Reset's Unix time and of the window a Calendar's headers
	// describe, for tests. Default (nil): for X-RateLimit-Reset, the wall clock as one
	// goroutine of the process reads it every 100ms, a tick ahead so that a reset is never
	// early; for a Calendar, time.Now.
	Now func() time.Time
}

// ResetFormat is the form of X-RateLimit-Reset (Options.Reset).
type ResetFormat uint8

const (
	// ResetUnix sends the Unix time, in seconds rounded up, at which the limit resets.
	ResetUnix ResetFormat = iota
	// ResetDelta sends the seconds until then, rounded up, as RateLimit's t.
	ResetDelta
	// ResetNone sends no X-RateLimit-Reset.
	ResetNone
)

// MetricWouldDeny counts the requests a limit in shadow would have denied ({request}), by
// rlfn.policy, the limit's Name: the cost of enforcing it.
const MetricWouldDeny = "rlfn.httplimit.would_deny"

// MetricNearLimit counts the requests admitted past their policy's NearLimit ({request}), by
// rlfn.policy.
const MetricNearLimit = "rlfn.httplimit.near_limit"

// headerNear names the policy whose soft limit (Policy.NearLimit) an admitted request passed.
const headerNear = "Ratelimit-Near" // RateLimit-Near

// ConfigError reports Options that cannot work, found by New.
type ConfigError struct {
	Field  string // e.g. "Key", "Policies[2]"
	Reason string // e.g. "is required"
	Err    error  // what refused it, e.g. a *PolicyError for Policies; else nil
}

func (e *ConfigError) Error() string { return "httplimit: Options." + e.Field + " " + e.Reason }

// Unwrap returns the cause, so that errors.As finds a *PolicyError (and the
// *client.LimitError in it).
func (e *ConfigError) Unwrap() error { return e.Err }

// PolicyError reports a Policy the middleware refuses. At request time it is passed to
// Options.OnError and answered 500 (whatever FailOpen says): a limit that cannot be valid is a
// bug, and serving the route with no limit would hide it. In Options.Policies, New refuses it.
type PolicyError struct {
	Name   string // the policy's (or the AlsoLimit's) Name
	Reason string // e.g. "want letters, digits, '_', '.' or '-'"
	Err    error  // the client's, when it refused a limit (a *client.LimitError); else nil
}

func (e *PolicyError) Error() string {
	return fmt.Sprintf("httplimit: policy %q: %s", e.Name, e.Reason)
}

// Unwrap returns the client's error, so that errors.As finds a *client.LimitError.
func (e *PolicyError) Unwrap() error { return e.Err }

// ShadowKeyError is passed to Options.OnError when the Key of a limit in shadow fails: the
// request is served, and that limit is not decided.
type ShadowKeyError struct {
	Policy string // the AlsoLimit's Name, or Policy.Name
	Err    error
}

func (e *ShadowKeyError) Error() string {
	return fmt.Sprintf("httplimit: key of shadow limit %q: %v", e.Policy, e.Err)
}

func (e *ShadowKeyError) Unwrap() error { return e.Err }

// Middleware rate-limits the requests of the handlers it wraps. It is safe for concurrent use.
type Middleware struct {
	lim       Decider
	opts      Options
	policies  []Policy              // Options.Policies, Names defaulted
	log       *errorLog             // the default OnError
	clock     decide.Clock          // of X-RateLimit-Reset (coarse, a tick ahead) and of Calendars (exact)
	wouldDeny metric.Int64Counter   // nil without a MeterProvider
	near      *decide.PolicyCounter // likewise
	unsettled metric.Int64Counter   // likewise
	shadows   sync.WaitGroup        // the shadow decisions running, for tests to wait out
}

// New returns a Middleware that asks lim for a decision on every request.
func New(lim Decider, opts Options) (*Middleware, error) {
	if l, ok := lim.(*client.Limiter); ok && l == nil {
		lim = nil // a typed nil: every request would panic
	}
	switch {
	case lim == nil:
		return nil, &ConfigError{Field: "Limiter", Reason: "is required"}
	case opts.Key == nil:
		return nil, &ConfigError{Field: "Key", Reason: "is required"}
	case opts.Policy == nil:
		return nil, &ConfigError{Field: "Policy", Reason: "is required"}
	case opts.MaxDelay < 0:
		return nil, &ConfigError{Field: "MaxDelay", Reason: "must not be negative, got " + opts.MaxDelay.String()}
	case opts.ErrorStatus != 0 && (opts.ErrorStatus < 400 || opts.ErrorStatus > 599):
		return nil, &ConfigError{Field: "ErrorStatus", Reason: fmt.Sprintf("must be 0 or from 400 to 599, got %d", opts.ErrorStatus)}
	case opts.ErrorStatus != 0 && opts.FailOpen:
		return nil, &ConfigError{Field: "ErrorStatus", Reason: fmt.Sprintf("%d cannot be set with FailOpen, which serves those requests", opts.ErrorStatus)}
	case opts.Reset > ResetNone:
		return nil, &ConfigError{Field: "Reset", Reason: fmt.Sprintf("must be ResetUnix, ResetDelta or ResetNone, got %d", opts.Reset)}
	}
	if opts.MaxDelay == 0 {
		opts.MaxDelay = DefaultMaxDelay
	}
	if opts.ErrorStatus == 0 {
		opts.ErrorStatus = http.StatusServiceUnavailable
	}
	m := &Middleware{lim: lim, opts: opts, log: &errorLog{every: time.Second, logger: opts.Logger}}
	for i, p := range opts.Policies {
		if p.Name == "" {
			p.Name = DefaultPolicyName
		}
		if err := m.servable(p); err != nil {
			return nil, &ConfigError{Field: fmt.Sprintf("Policies[%d]", i), Reason: strings.TrimPrefix(err.Error(), "httplimit: "), Err: err}
		}
		m.policies = append(m.policies, p)
	}
	m.clock = decide.NewClock(opts.Now)
	if opts.MeterProvider != nil {
		c, err := opts.MeterProvider.Meter("github.com/rlfn/rlfn/client/httplimit").Int64Counter(MetricWouldDeny,
			metric.WithUnit("{request}"),
			metric.WithDescription("Requests a limit in shadow would have denied."))
		if err != nil {
			return nil, &ConfigError{Field: "MeterProvider", Reason: "creating " + MetricWouldDeny + ": " + err.Error()}
		}
		m.wouldDeny = c
		if m.unsettled, err = opts.MeterProvider.Meter("github.com/rlfn/rlfn/client/httplimit").Int64Counter(MetricUnsettled,
			metric.WithUnit("{request}"),
			metric.WithDescription("Settlements by outcome (refunds, charges) that failed, not retried.")); err != nil {
			return nil, &ConfigError{Field: "MeterProvider", Reason: "creating " + MetricUnsettled + ": " + err.Error()}
		}
		if m.near, err = decide.NewPolicyCounter(opts.MeterProvider, "github.com/rlfn/rlfn/client/httplimit", MetricNearLimit,
			"{request}", "Requests admitted past their policy's soft limit (NearLimit)."); err != nil {
			return nil, &ConfigError{Field: "MeterProvider", Reason: "creating " + MetricNearLimit + ": " + err.Error()}
		}
	}
	return m, nil
}

// servable reports why the middleware could not serve p, a static policy, as a *PolicyError;
// or ErrNoMultiDecider, ErrNoAcquirer.
func (m *Middleware) servable(p Policy) error {
	if err := validPolicy(p); err != nil {
		return err
	}
	if _, ok := m.lim.(MultiDecider); !ok && (decide.Several(spec(p)) || p.Cost != nil) {
		return ErrNoMultiDecider
	}
	if _, ok := m.lim.(Acquirer); !ok && p.Concurrency != nil {
		return ErrNoAcquirer
	}
	if _, ok := m.lim.(Settler); !ok && p.Outcome != nil {
		return ErrNoSettler
	}
	return nil
}

// Handler returns next behind the rate limit. Its signature makes m.Handler usable wherever a
// func(http.Handler) http.Handler middleware is.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	p := m.opts.Policy(r)
	if p.Limit == nil && p.Concurrency == nil && len(p.Also) == 0 {
		next.ServeHTTP(w, r)
		return
	}
	if p.Name == "" {
		p.Name = DefaultPolicyName
	}
	if err := checkPolicy(&p); err != nil {
		m.failed(w, r, next, p.Name, err)
		return
	}
	key, err := m.opts.Key(r)
	if err == nil && key == "" {
		// The Limiter would take "name:" as a key: every request without one would share it.
		err = ErrEmptyKey
	}
	if err != nil {
		if p.Shadow && p.Concurrency == nil {
			// Nothing enforced needs the key: shadow limits never refuse.
			m.report(r, shadowKey, p.Name, &ShadowKeyError{Policy: p.Name, Err: err})
			next.ServeHTTP(w, r)
			return
		}
		m.badKey(w, keyBody(err))
		return
	}
	// The decisions are the policy's in the Limiter's metrics, spans and log lines: its Name is
	// in the key, not in the Limit, so each call names it (decide.Allow, Rule.Name), without a
	// context of its own.
	ctx := r.Context()
	if p.Critical {
		ctx = client.Critical(ctx)
	}
	shadow := decide.InShadow(key, p.Shadow, p.EnforcePercent)
	// The name cannot contain ':', so "name:key" is injective.
	key = p.Name + ":" + key
	if len(p.Also) > 0 || shadow || p.Outcome != nil || p.Cost != nil {
		m.several(ctx, w, r, next, &p, key, shadow)
		return
	}
	if p.Limit == nil {
		m.concurrent(ctx, w, r, next, p, key, nil)
		return
	}
	res, err := decide.Allow(ctx, m.lim, p.Name, key, p.Limit)
	if err != nil {
		m.limiterError(w, r, next, p.Name, err)
		return
	}
	m.decided(ctx, w, r, next, &p, key, res, []decide.Quota{{Name: p.Name, Limit: p.Limit, Unit: p.Unit}}, nil, nil)
}

// LimiterKey is the key of the Limiter that a Policy (or an AlsoLimit) named name counts
// principal's requests against: "<name>:<principal>", principal as Options.Key (or
// AlsoLimit.Key) returns it. An AlsoLimit with SameKey counts on its Policy's. An operator blocks a principal of a route with the Limiter's
// Block(ctx, LimiterKey(name, principal), d), which every limit of that name with a Penalty
// then obeys, and lifts it with Unblock (PeekBlock tells); Peek and Refund take it too.
func LimiterKey(name, principal string) string {
	if name == "" {
		name = DefaultPolicyName
	}
	return name + ":" + principal
}

// keyBody is the body of the 400 answering a Key's error.
func keyBody(err error) string {
	if err == ErrEmptyKey {
		return bodyMissingKey
	}
	return bodyUnreadableKey
}

// limiterError handles an error of the limiter's decision on policy.
func (m *Middleware) limiterError(w http.ResponseWriter, r *http.Request, next http.Handler, policy string, err error) {
	if r.Context().Err() != nil {
		// The client went away (or the server is shutting down): nobody reads an answer,
		// and the limiter did not fail.
		return
	}
	m.failed(w, r, next, policy, err)
}

// decided answers a request its enforced limits decided on: quotas are those limits, the one
// that decided (res.Rule) first, and each, when known, their own states in the same order. c,
// when not nil, is what the request owes by its outcome.
func (m *Middleware) decided(ctx context.Context, w http.ResponseWriter, r *http.Request, next http.Handler, p *Policy, key string, res client.Result, quotas []decide.Quota, each []client.Result, c *counting) {
	h := w.Header()
	switch {
	case !res.Allowed:
		m.setHeaders(h, p.HideQuota, quotas, res, each, res.RetryAfter, true)
		m.deny(w, p.HideQuota, res.Blocked, quotas[0].Name, res.RetryAfter)
	case res.Delay > m.opts.MaxDelay:
		// The server has counted this request and it is refused all the same, as promised.
		wait := decide.TooLongWait(res.Delay, m.opts.MaxDelay, quotas)
		m.setHeaders(h, p.HideQuota, quotas, res, each, wait, true)
		m.deny(w, p.HideQuota, false, quotas[0].Name, wait)
	default:
		m.setHeaders(h, p.HideQuota, quotas, res, each, 0, false)
		if decide.Near(res, p.NearLimit) {
			m.near.Add(ctx, p.Name)
			if !p.HideQuota {
				h[headerNear] = []string{`"` + quotas[0].Name + `"`}
			}
		}
		if res.Delay > 0 && !decide.Hold(r.Context().Done(), res.Delay) {
			m.write(w, http.StatusServiceUnavailable, body{Error: "request ended while delayed by the rate limit", Policy: quotas[0].Name, RetryAfterMs: -1})
			return
		}
		if p.Concurrency != nil {
			m.concurrent(ctx, w, r, next, *p, key, c)
			return
		}
		m.serveCounted(w, r, next, p, c)
	}
}

// several decides a Policy's limits when there are more than one, or some in shadow: the
// enforced ones at once, all or nothing, and beside them the shadow ones, whose denial is only
// counted.
func (m *Middleware) several(ctx context.Context, w http.ResponseWriter, r *http.Request, next http.Handler, p *Policy, key string, shadow bool) {
	sp := decide.NewSplit(p.Name, key, shadow, p.Outcome != nil)
	if p.Limit != nil {
		switch c := cost(p.Cost, r); {
		case !decide.BadCost(c):
			sp.Own(p.Limit, c, p.Unit, p.Cost != nil)
		case !shadow:
			m.badCost(w)
			return
		} // a shadow limit never refuses: one whose cost is bad is left out
	}
	for i := range p.Also {
		a := &p.Also[i]
		c := cost(a.Cost, r)
		if decide.BadCost(c) {
			if !shadow && !a.Shadow {
				m.badCost(w)
				return
			}
			continue
		}
		var principal string
		var keyErr error
		if a.Key != nil {
			principal, keyErr = a.Key(r)
		}
		k, skip, err := sp.Key(a.named(), principal, keyErr, ErrEmptyKey)
		switch {
		case err != nil:
			m.badKey(w, keyBody(err))
			return
		case skip != nil:
			m.report(r, shadowKey, a.Name, &ShadowKeyError{Policy: a.Name, Err: skip})
			continue
		}
		sp.Add(a.named(), k, c)
	}
	set, measured := &sp.Set, sp.Metered() // with an Outcome, whether each enforced limit is settled at the reported cost
	if len(set.Shadow) > 0 {
		// The shadow decision runs beside the enforced one and the handler, and the response
		// does not wait for it: a roll-out must not add a round trip to the route's latency,
		// nor a limiter's deadline when the server is gone. Its context outlives the response;
		// the limiter's own deadline (client.Options.Deadline) bounds how long it runs.
		m.shadows.Add(1)
		go m.shadow(context.WithoutCancel(ctx), r, set.Shadow, set.ShadowQuotas)
	}
	if len(set.Enforced) == 0 {
		if p.Concurrency != nil {
			m.concurrent(ctx, w, r, next, *p, key, nil)
			return
		}
		next.ServeHTTP(w, r)
		return
	}
	var c *counting
	if p.Outcome != nil {
		c = &counting{rules: set.Enforced, measured: measured, checkFirst: p.Outcome.CheckFirst}
		if _, ok := m.lim.(Settler); !ok {
			m.failed(w, r, next, p.Name, ErrNoSettler)
			return
		}
	}
	var res client.Result
	var each []client.Result
	var quotas []decide.Quota
	var err error
	if c != nil && p.Outcome.CheckFirst {
		quotas = set.EnforcedQuotas
		res, err = decide.PeekAll(ctx, m.lim.(Settler), set.Enforced)
		if err == nil && res.Rule != 0 {
			quotas = decide.DecidingFirst(quotas, res.Rule)
		}
	} else {
		res, each, quotas, err = decide.DecideEnforced(ctx, m.lim, set, p.HideQuota, ErrNoMultiDecider)
	}
	if err != nil {
		m.limiterError(w, r, next, p.Name, err)
		return
	}
	m.decided(ctx, w, r, next, p, key, res, quotas, each, c)
}

// shadow decides the shadow limits of a request, and counts a denial. It runs on a goroutine
// of its own, whose panic (a Limiter's, OnShadowDeny's, OnError's) would end the process
// where net/http would only have ended the request: it is recovered and logged.
func (m *Middleware) shadow(ctx context.Context, r *http.Request, rules []client.Rule, quotas []decide.Quota) {
	defer m.shadows.Done()
	defer func() {
		if v := recover(); v != nil {
			m.logger().ErrorContext(ctx, "httplimit: panic in a shadow decision", "panic", v,
				"path", r.URL.Path, "stack", string(debug.Stack()))
		}
	}()
	decide.RunShadow(ctx, m.lim, rules, quotas, ErrNoMultiDecider,
		func(kind failure, name string, err error) { m.report(r, kind, name, err) },
		func(name string) {
			if m.wouldDeny != nil {
				m.wouldDeny.Add(ctx, 1, metric.WithAttributes(attribute.String("rlfn.policy", name)))
			}
			if m.opts.OnShadowDeny != nil {
				m.opts.OnShadowDeny(r, name)
			}
		})
}

// logger is Options.Logger, or slog.Default().
func (m *Middleware) logger() *slog.Logger {
	if m.opts.Logger != nil {
		return m.opts.Logger
	}
	return slog.Default()
}

// cost is a Cost function's units for r, 0 (one, the call's) without one.
func cost(f func(*http.Request) int64, r *http.Request) int64 {
	if f == nil {
		return 0
	}
	return f(r)
}

// checkPolicy reports why the middleware cannot apply p, as a *PolicyError.
func checkPolicy(p *Policy) error {
	bad, reason := decide.Check(p.Name, p.Unit, p.EnforcePercent, len(p.Also), func(i int) decide.Named {
		return p.Also[i].named()
	})
	if reason != "" {
		return &PolicyError{Name: bad, Reason: reason}
	}
	if reason := decide.CheckNear(p.NearLimit); reason != "" {
		return &PolicyError{Name: p.Name, Reason: reason}
	}
	return nil
}

// concurrent serves the request holding a lease of p.Concurrency, released when next returns
// or panics; c, when not nil, settles it by its outcome. A request it refuses never reached the
// handler: nothing is settled.
func (m *Middleware) concurrent(ctx context.Context, w http.ResponseWriter, r *http.Request, next http.Handler, p Policy, key string, c *counting) {
	acq, ok := m.lim.(Acquirer)
	if !ok {
		m.failed(w, r, next, p.Name, ErrNoAcquirer)
		return
	}
	lease, res, err := decide.Acquire(ctx, acq, p.Name, key, *p.Concurrency)
	if err != nil {
		m.limiterError(w, r, next, p.Name, err)
		return
	}
	if !res.Allowed {
		if res.RetryAfter != client.Never {
			w.Header()["Retry-After"] = []string{string(decide.AppendSeconds(nil, res.RetryAfter))}
		}
		m.deny(w, p.HideQuota, false, p.Name, res.RetryAfter)
		return
	}
	defer func() {
		// The request's context may be over (the client went away): the slot is owed anyway.
		if _, err := lease.Release(context.WithoutCancel(r.Context())); err != nil {
			m.report(r, unreleased, p.Name, err)
		}
	}()
	m.serveCounted(w, r, next, &p, c)
}

// deny answers 429; setHeaders has set Retry-After. blocked says the principal's block
// refused it (client.Result.Blocked), which the body says. A hidden quota's body names neither
// the policy nor the wait, nor a block: a guesser who learns that it tripped a penalty learns
// the route's quota.
func (m *Middleware) deny(w http.ResponseWriter, hide, blocked bool, policy string, wait time.Duration) {
	b := body{Error: "rate limited", Policy: policy, RetryAfterMs: -1, Blocked: blocked}
	if hide {
		b.Policy, b.Blocked = "", false
	} else if wait != client.Never {
		b.RetryAfterMs = wait.Milliseconds()
		if wait%time.Millisecond != 0 {
			b.RetryAfterMs++
		}
	}
	m.write(w, http.StatusTooManyRequests, b)
}

// RemoteIP is a Key function that counts requests per client IP address, as the connection
// reports it (Request.RemoteAddr). Behind a proxy every request has the proxy's address: use
// ClientIP, which reads the header the proxies set, and only from them, and groups IPv6.
func RemoteIP(r *http.Request) (string, error) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return "", fmt.Errorf("httplimit: RemoteAddr %q: %w", r.RemoteAddr, err)
	}
	return host, nil
}
