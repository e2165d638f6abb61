package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/decide"
)

// Decider is what the interceptors need of a *client.Limiter, so that any decision maker (a
// fake in tests, a wrapper that records decisions) can stand in for it.
type Decider interface {
	Allow(ctx context.Context, key string, limit client.Limit) (client.Result, error)
}

// Acquirer is what a Policy with Concurrency needs of the Limiter, as *client.Limiter has it.
type Acquirer interface {
	Acquire(ctx context.Context, key string, c client.Concurrency) (*client.Lease, client.Result, error)
}

// MultiDecider is what a Policy enforcing several limits needs of the Limiter, as
// *client.Limiter has it.
type MultiDecider interface {
	AllowAll(ctx context.Context, rules []client.Rule) (client.Result, error)
}

// EachDecider is what a Policy enforcing several limits needs to report each of them in the
// ratelimit metadata, as *client.Limiter has it. With a MultiDecider that is not one, ratelimit
// has the deciding limit alone.
type EachDecider interface {
	AllowAllEach(ctx context.Context, rules []client.Rule, n int64) (client.Result, []client.Result, error)
}

var (
	_ Decider      = (*client.Limiter)(nil)
	_ Acquirer     = (*client.Limiter)(nil)
	_ MultiDecider = (*client.Limiter)(nil)
	_ EachDecider  = (*client.Limiter)(nil)
)

// Key returns the principal a call is counted against, from its context (metadata, peer,
// authenticated identity) and its full method name ("/package.Service/Method"). See Peer,
// Metadata and TLSIdentity.
type Key func(ctx context.Context, method string) (string, error)

// DefaultMaxDelay is ServerOptions.MaxDelay when it is zero.
const DefaultMaxDelay = time.Second

// DefaultPolicyName is Policy.Name when it is empty.
const DefaultPolicyName = "default"

// Policy is the limit the calls of a method are counted against.
type Policy struct {
	// Name names the policy in the ratelimit metadata and the QuotaFailure, and scopes its
	// state: calls with the same Name and key share one limiter, so two methods with their own
	// Names have their own budgets, and two with one Name share it. Letters, digits, '_', '.'
	// and '-' only. Default (empty): DefaultPolicyName, "default".
	Name string
	// Limit is the limiter's configuration, e.g. client.TokenBucket{...}, a client.Calendar, a
	// limit with a Penalty (library 1.2.0: a call its block refuses is refused with the block's
	// time left). Default (nil): the call is not rate-limited.
	Limit client.Limit
	// Concurrency, when not nil, caps the calls of one key in flight at once: the call holds a
	// lease (library 1.1.0) from after Limit admits it until its handler returns, for a stream
	// its whole life, however it ends (the handler's return when the client cancels, the
	// deadline passes, the handler fails or finishes). Make Lease longer than the longest
	// call: the lease is not renewed, and one that expires frees its slot early. The Limiter
	// must be a *client.Limiter (or implement Acquirer). Default (nil): no concurrency limit.
	Concurrency *client.Concurrency
	// Critical marks the method's calls critical (client.Critical): they may use the Reserve
	// of Limit and of Concurrency, which other methods leave to them. Default: false.
	Critical bool
	// Also are further limits decided with Limit, all or nothing, each reported as an item of
	// ratelimit-policy. The Limiter must be a *client.Limiter (or implement MultiDecider) when
	// more than one limit is enforced. Default (nil): Limit alone.
	Also []AlsoLimit
	// HideQuota sends no ratelimit metadata and refuses with a RetryInfo alone: no
	// QuotaFailure, no policy in the message. For authentication methods, where "4 attempts
	// left" tells an attacker how fast to guess. Default: false.
	HideQuota bool
	// Shadow decides the method's limits (counting the calls, as enforced limits would) but
	// serves every call: a denial is only counted, in MetricWouldDeny, and passed to
	// ServerOptions.OnShadowDeny. Shadow limits send no metadata. Concurrency is always
	// enforced. The shadow decision runs beside the call and may end after it. Default: false.
	Shadow bool
	// EnforcePercent, from 1 to 100, enforces the method's limits for that share of the keys
	// and decides them in shadow for the others, by a hash of the key: the same keys on every
	// call and every instance. Default (0): 100, all keys.
	EnforcePercent int
	// Cost returns the units the call takes of Limit, for a limit of something else than
	// calls (tokens, bytes): "60 calls and 150,000 tokens per minute" is a Policy of the calls
	// and an AlsoLimit of the tokens whose Cost is the call's estimate, decided at once. req
	// is a unary call's request, nil for a stream (decided when it opens). A cost of 0 takes 1,
	// as client.Rule's. A negative cost, or one above 999999999999999, is the caller's fault (a
	// cost comes from what the call sent, a max_tokens): refused InvalidArgument "grpclimit:
	// invalid cost" without a decision, and not reported to OnError; a Cost that cannot read the
	// call returns -1 for that. A limit in shadow whose cost is invalid is left out. With a Cost
	// the Limiter must be a *client.Limiter (or implement MultiDecider). Default (nil): 1.
	Cost Cost
	// Unit names what Limit counts, sent as the ratelimit-policy item's qu parameter (the
	// draft's quota unit), e.g. "tokens". Letters, digits, '_', '.' and '-' only. Default
	// (empty): requests, the draft's default.
	Unit string
	// Outcome, when not nil, settles the call by how it ended (see Outcome). Default (nil):
	// the decision before the call is final.
	Outcome *Outcome
	// Meter, when not nil, holds the call's estimate rather than taking it, meters the
	// messages its handler sends as they go, cuts a stream whose budget runs out, and settles
	// the call at what it sent (see StreamMeter; library 1.3.0). Default (nil): the call is
	// decided once, before its handler.
	Meter *StreamMeter
	// NearLimit, from 0 to 1, is the soft limit that warns before the limit refuses: a call
	// admitted with at least this share of its deciding limit used (1 - remaining / limit)
	// gets the header metadata ratelimit-near naming the policy ("api"), and is counted in
	// MetricNearLimit, so that a client can slow down before it is refused. A hidden quota
	// (HideQuota) is counted but sends no metadata. Default (0): off.
	NearLimit float64
}

// Cost returns the units a call takes of a limit (Policy.Cost, AlsoLimit.Cost).
type Cost func(ctx context.Context, method string, req any) int64

// AlsoLimit is a limit of a Policy beside its Limit (Policy.Also).
type AlsoLimit struct {
	// Name names the limit, as Policy.Name does; it must differ from the Policy's and from the
	// other AlsoLimits' Names. Required.
	Name string
	// Limit is the limiter's configuration, as Policy.Limit. Required.
	Limit client.Limit
	// Key returns the principal this limit counts the call against. Default (nil):
	// ServerOptions.Key's. An error refuses the call InvalidArgument, as ServerOptions.Key's.
	// Without a Key (and without SameKey) the limit keeps its state on a key of its own,
	// LimiterKey(Name, principal).
	Key Key
	// SameKey counts this limit on the Policy's own key, LimiterKey(Policy.Name, principal),
	// beside the Policy's Limit, rather than on a key of its own: the limits of one key are
	// decided by one atomic call (rl_multi, library 1.1.0) in the principal's cluster slot,
	// where limits of several keys take one call each, and refunds when one refuses. "60 calls
	// and 150,000 tokens a minute" is one call. The state is the Limit's own on that key, named
	// by its algorithm and its Name (client.Limiter.Key): two limits of one algorithm there
	// need the client's Name to tell them apart (NewServer refuses a pair that would be one
	// limiter). A Penalty then blocks the Policy's key. It cannot be set with Key. Default:
	// false, the key of its own, as before: setting it moves the limit's state to a new key,
	// starting from a full limit.
	SameKey bool
	// Shadow decides this limit in shadow (see Policy.Shadow). Default: false.
	Shadow bool
	// Cost returns the units the call takes of this limit, as Policy.Cost. Default (nil): 1.
	Cost Cost
	// Unit names what this limit counts, as Policy.Unit. Default (empty): requests.
	Unit string
}

// named is a as the decision's checks and split see it.
func (a *AlsoLimit) named() decide.Named {
	return decide.Named{Name: a.Name, Limit: a.Limit, Shadow: a.Shadow, Unit: a.Unit,
		SameKey: a.SameKey, OwnKey: a.Key != nil, HasCost: a.Cost != nil}
}

// ServerOptions configures a Server. Key and Methods (or Default) are required.
type ServerOptions struct {
	// Key returns the principal a call is counted against. An error, or an empty key, refuses
	// the call InvalidArgument without a decision: a call that cannot be attributed would
	// otherwise be served unlimited. Required.
	Key Key
	// Methods are the policies by full method name, "/package.Service/Method"; a name
	// "/package.Service/*" covers that service's methods without a policy of their own. New
	// refuses a policy that cannot be valid with a *ConfigError naming it. Default (nil): every
	// method has Default.
	Methods map[string]Policy
	// Default is the policy of a method Methods does not name. Default (zero): such a method
	// is not limited.
	Default Policy
	// MaxDelay is the longest a call admitted with a delay (a LeakyBucket in Shape mode) is
	// held before its handler runs; a longer delay is refused. Default (zero):
	// DefaultMaxDelay, one second.
	MaxDelay time.Duration
	// ErrorCode is the code of a call the limiter could not decide (its server unreachable,
	// its circuit open, its library absent or too old). With a *client.Limiter only
	// client.ReturnError leaves such a call here: its default, client.LocalFallback, decides
	// in-process. Never codes.Unavailable, which clients and meshes retry at once, nor OK.
	// Default (zero, OK): codes.Internal.
	ErrorCode codes.Code
	// FailOpen serves the calls the limiter could not decide, with no limit at all: the
	// service then runs unprotected exactly when its limiter's server is down. A
	// misconfigured policy is still refused Internal and a refused key InvalidArgument. It
	// cannot be set with ErrorCode. Default: false.
	FailOpen bool
	// OnError is called with each error that leaves a call without a decision, or a
	// settlement undone; it must be safe for concurrent use. Default (nil): logged with
	// slog.Default(), at most once a second per kind of failure.
	OnError func(ctx context.Context, method string, err error)
	// OnShadowDeny is called with the policy (the AlsoLimit's Name, or Policy.Name) of each
	// call a limit in shadow would have denied; it must be safe for concurrent use.
	OnShadowDeny func(ctx context.Context, method, policy string)
	// MeterProvider, when not nil, records MetricWouldDeny and MetricUnsettled. Default (nil):
	// no instrument.
	MeterProvider metric.MeterProvider
	// Now is the clock of a Calendar's window, for tests. Default (nil): time.Now.
	Now func() time.Time
	// Logger receives the default OnError's lines and a shadow decision's panic. The
	// Limiter's own lines (a node's calls going to its Fallback and back, a circuit breaker, a
	// node without the library) go to its client.Options.Logger. Default (nil):
	// slog.Default(); slog.New(slog.DiscardHandler) silences them.
	Logger *slog.Logger
}

// MetricNearLimit counts the calls admitted past their policy's NearLimit ({call}), by
// rlfn.policy.
const MetricNearLimit = "rlfn.grpclimit.near_limit"

// MetadataNear is the header metadata naming the policy whose soft limit (Policy.NearLimit) an
// admitted call passed.
const MetadataNear = "ratelimit-near"

// MetricWouldDeny counts the calls a limit in shadow would have denied ({call}), by
// rlfn.policy.
const MetricWouldDeny = "rlfn.grpclimit.would_deny"

// MetricUnsettled counts the settlements by outcome (refunds and charges) that failed
// ({call}), by rlfn.policy: units not given back, or not taken. None is retried.
const MetricUnsettled = "rlfn.grpclimit.unsettled"

// ConfigError reports options that cannot work, found by NewServer or NewClient.
type ConfigError struct {
	Field  string // e.g. "Key", `Methods["/pkg.S/M"]`
	Reason string // e.g. "is required"
	Err    error  // what refused it, e.g. a *PolicyError; else nil
}

func (e *ConfigError) Error() string { return "grpclimit: " + e.Field + " " + e.Reason }

// Unwrap returns the cause, so that errors.As finds a *PolicyError (and a
// *client.LimitError in it).
func (e *ConfigError) Unwrap() error { return e.Err }

// PolicyError reports a Policy the interceptors refuse.
type PolicyError struct {
	Name   string // the policy's (or the AlsoLimit's) Name
	Reason string
	Err    error // the client's, when it refused a limit; else nil
}

func (e *PolicyError) Error() string {
	return fmt.Sprintf("grpclimit: policy %q: %s", e.Name, e.Reason)
}

// Unwrap returns the client's error, so that errors.As finds a *client.LimitError.
func (e *PolicyError) Unwrap() error { return e.Err }

// ShadowKeyError is passed to ServerOptions.OnError when the Key of a limit in shadow fails:
// the call is served, and that limit is not decided.
type ShadowKeyError struct {
	Policy string
	Err    error
}

func (e *ShadowKeyError) Error() string {
	return fmt.Sprintf("grpclimit: key of shadow limit %q: %v", e.Policy, e.Err)
}

func (e *ShadowKeyError) Unwrap() error { return e.Err }

// ErrEmptyKey is the error of a Key that returned "": no principal to count the call against.
var ErrEmptyKey = errors.New("grpclimit: the key is empty")

// ErrNoMultiDecider: a Policy enforces several limits and the Limiter cannot decide them at
// once. NewServer refuses such a policy.
var ErrNoMultiDecider = errors.New("grpclimit: Policy.Also needs a Limiter that implements MultiDecider, such as *client.Limiter")

// ErrNoAcquirer: a Policy has a Concurrency and the Limiter cannot take leases. NewServer
// refuses such a policy.
var ErrNoAcquirer = errors.New("grpclimit: Policy.Concurrency needs a Limiter that implements Acquirer, such as *client.Limiter")

// ErrNoSettler: a Policy has an Outcome and the Limiter cannot settle it. NewServer refuses
// such a policy.
var ErrNoSettler = errors.New("grpclimit: Policy.Outcome needs a Limiter that implements Settler, such as *client.Limiter")
