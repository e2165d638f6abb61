package client

import (
	"fmt"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Defaults of the options.
const (
	// DefaultDeadline bounds every call: a few round trips on a loaded network, far below
	// what a request can wait for its rate limit.
	DefaultDeadline = 100 * time.Millisecond
	// DefaultBreakerFailures consecutive failures open the circuit breaker.
	DefaultBreakerFailures = 5
	// DefaultBreakerCooldown is how long an open breaker sends nothing before its probe.
	DefaultBreakerCooldown = time.Second
	// DefaultLocalKeys is how many keys the local fallback holds state for, at most.
	DefaultLocalKeys = 100_000
	// DefaultMaxKeyLen is the longest key (in bytes) a call takes: room for an e-mail address
	// or a URL behind a policy's name, and a bound on what one principal costs the server.
	DefaultMaxKeyLen = 512
)

// Policy is what a call does when the server cannot decide it: the server is unreachable, the
// call ran past its deadline, the circuit breaker is open, the cluster is down (CLUSTERDOWN,
// TRYAGAIN: as a dead shard), the node's library is older than the call needs (a *VersionError:
// a reserve, a refund, a lease or rl_multi on a node still running 1.0.0), or the server
// answered with an error that is not the caller's (ErrNotLoaded, LOADING, OOM, NOPERM, a reply
// out of contract...).
//
// A *LimitError and a *KeyError (refused before any call) and a *LibraryError (RLERR: the key
// holds other state) are the caller's bugs: every policy returns them as they are. So does a
// call whose context the caller canceled, or that was done before the call: nobody waits for
// its answer.
//
// ErrNotLoaded does fall under the policy: a server restarted without persistence comes back
// without its functions, and a service must not go down until someone runs rlfn deploy.
// Check at startup catches a missing deploy, and the errors metric counts not_loaded.
//
// Every policy but ReturnError answers with err == nil and Result.Source FromPolicy, so that the usual
// `if err != nil` handles only what no policy can decide; the cause is counted in metrics.
type Policy uint8

const (
	// ReturnError returns the error (ErrCircuitOpen while the breaker is open), and leaves the
	// decision to the caller.
	ReturnError Policy = iota
	// FailOpen admits: Allowed, Remaining = Limit - cost, as a fresh limiter would answer. A
	// cost above the limit is still denied with RetryAfter = Never. While the server cannot
	// decide, the service runs with no limit at all: a choice to make knowingly.
	FailOpen
	// FailClosed denies: Remaining 0, RetryAfter (and ResetAfter) the time until the breaker
	// probes the server again, or its cooldown when it is not open.
	FailClosed
	// LocalFallback decides with an in-process limiter of the same algorithm, admitting a
	// share of the limit: see WithInstances. Its Result.Limit is that share. A key's local
	// state lasts until the server decides that key again, or until it expires: in a cluster
	// with a shard down, the live shards' answers leave the dead shard's keys limited. The
	// default: a rate limiter that stops limiting when its server does fails the service it
	// protects exactly when that service is most likely under load.
	LocalFallback
)

func (p Policy) String() string {
	switch p {
	case ReturnError:
		return "return_error"
	case FailOpen:
		return "fail_open"
	case FailClosed:
		return "fail_closed"
	case LocalFallback:
		return "local_fallback"
	}
	return fmt.Sprintf("Policy(%d)", uint8(p))
}

// OptionError reports an option New cannot use (or a nil valkey.Client): New returns it, and
// no Limiter, since one that silently ran with other settings would be worse.
type OptionError struct {
	Option string // e.g. "WithDeadline"
	Reason string // e.g. "must be positive, got 0s"
}

func (e *OptionError) Error() string { return "client: " + e.Option + " " + e.Reason }

// Option configures a Limiter. An invalid one does not panic: New returns its *OptionError.
type Option func(*options)

type options struct {
	prefix          string
	deadline        time.Duration
	policy          Policy
	instances       int
	breakerFailures int
	breakerCooldown time.Duration
	localKeys       int
	maxKeyLen       int
	meterProvider   metric.MeterProvider
	leaseBatch      int64
	leaseAge        time.Duration
	denialKeys      int
	tracerProvider  trace.TracerProvider
	traceKeys       bool
	clock           func() int64
	fakeClock       bool // clock is WithClock's (tests), not monotonicClock
	errs            []error
}

func (o *options) invalid(option, format string, args ...any) {
	o.errs = append(o.errs, &OptionError{Option: option, Reason: fmt.Sprintf(format, args...)})
}

// WithPrefix sets the prefix of every key (see Key). Default: DefaultPrefix, "rl:". The prefix
// never chooses a cluster slot: its braces are escaped like the key's.
func WithPrefix(prefix string) Option {
	return func(o *options) { o.prefix = prefix }
}

// WithDeadline bounds every call, Allow and Peek alike: a call whose context has a later
// deadline, or none, gets this one. A call that reaches it is a failure (see Policy). Default:
// DefaultDeadline, 100ms.
func WithDeadline(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			o.invalid("WithDeadline", "must be positive, got %s", d)
		}
		o.deadline = d
	}
}

// WithPolicy sets what a call does when the server cannot decide it. Default: LocalFallback.
func WithPolicy(p Policy) Option {
	return func(o *options) {
		if p > LocalFallback {
			o.invalid("WithPolicy", "must be ReturnError, FailOpen, FailClosed or LocalFallback, got %s", p)
		}
		o.policy = p
	}
}

// WithInstances is how many processes share the limits, for LocalFallback: each admits limit /
// n units of a window, and a bucket of capacity / n refilled at rate / n (kept exact as rate
// per n periods), rounded down so that the processes together stay within the limit, and at
// least 1 so that each admits something. n from 1 to 1000000. Default: 1, the whole limit in
// every process.
func WithInstances(n int) Option {
	return func(o *options) {
		if n < 1 || n > 1_000_000 {
			o.invalid("WithInstances", "must be from 1 to 1000000, got %d", n)
		}
		o.instances = n
	}
}

// WithBreaker sets the circuit breaker: it opens after failures consecutive calls the server
// did not answer (a timeout, a network error), sends nothing to the server while open, lets
// one call through as a probe once cooldown has passed, and closes when the probe is answered
// (or opens for another cooldown when it is not). An error reply (ErrNotLoaded, LOADING...)
// is an answer: such a server is reachable and quick to ask, and a deploy is seen at once.
// Defaults: DefaultBreakerFailures (5) and DefaultBreakerCooldown (1s).
//
// A Limiter on a cluster has a breaker per shard, found by the key's hash slot (the table of
// slots comes from CLUSTER SLOTS, read in the background on the first call and whenever a
// breaker opens): one dead shard opens its own breaker, its calls pay the deadline only until
// then, and the other shards' calls go on. A shard's replicas share its breaker. A standalone
// server (or a sentinel's primary) has one.
func WithBreaker(failures int, cooldown time.Duration) Option {
	return func(o *options) {
		if failures < 1 {
			o.invalid("WithBreaker", "failures must be at least 1, got %d", failures)
		}
		if cooldown <= 0 {
			o.invalid("WithBreaker", "cooldown must be positive, got %s", cooldown)
		}
		o.breakerFailures, o.breakerCooldown = failures, cooldown
	}
}

// WithLocalKeys bounds the keys LocalFallback holds state for: at most about n (a little more
// as it is split in shards). Each shard drops its expired state once a second; a full shard
// makes room for a new key by evicting, of 8 keys it samples, the one closest to expiring.
// Default: DefaultLocalKeys, 100000: about 8 MB when full of windows or buckets, 36 MB of
// sliding logs (a local log keeps at most 17 counts per key), with keys of about 25 bytes.
func WithLocalKeys(n int) Option {
	return func(o *options) {
		if n < 1 {
			o.invalid("WithLocalKeys", "must be at least 1, got %d", n)
		}
		o.localKeys = n
	}
}

// WithMaxKeyLen sets the longest key (the principal, in bytes) a call takes, from 1 to
// 1048576; a longer one is a *KeyError, sent nowhere. The server holds each limiter's key for
// as long as its state lives (an hour for an hour's sliding log), once per algorithm and Name,
// so a key read from a request header must not be as long as the header. To count by a long
// identifier (a JWT, a URL), key by a hash of it (sha256, hex). Default: DefaultMaxKeyLen, 512.
func WithMaxKeyLen(n int) Option {
	return func(o *options) {
		if n < 1 || n > 1<<20 {
			o.invalid("WithMaxKeyLen", "must be from 1 to 1048576, got %d", n)
		}
		o.maxKeyLen = n
	}
}

// WithMeterProvider records metrics through mp (see the package documentation for the
// instruments). Default: none, and then no instrument exists and a call costs nothing more.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(o *options) {
		if mp == nil {
			o.invalid("WithMeterProvider", "must not be nil")
		}
		o.meterProvider = mp
	}
}

// WithLeasedBudgets serves admissions of hot keys from batches of units taken from the server
// in one call (see "Leased budgets" in the package documentation): a batch takes at most
// maxBatch units (2 to 1000000), so that at most maxBatch - 1 are parked in this process per
// key, limit and reserve, and its units are handed out for at most maxAge (1ms to 1 minute)
// after it was sent, then given back. Default: off, one call per decision.
//
// It applies to the token bucket, the leaky bucket in Police mode, the fixed window and the
// sliding window counter, for AllowN with a cost of at least 1; never to the sliding log
// (whose exactness it would break), Shape mode, concurrency leases, peeks, AllowAll or
// Critical calls on a limit with a Reserve. A Limiter with leased budgets owns parked units:
// call Close when done with it.
func WithLeasedBudgets(maxBatch int64, maxAge time.Duration) Option {
	return func(o *options) {
		if maxBatch < 2 || maxBatch > 1_000_000 {
			o.invalid("WithLeasedBudgets", "maxBatch must be from 2 to 1000000, got %d", maxBatch)
		}
		if maxAge < time.Millisecond || maxAge > time.Minute {
			o.invalid("WithLeasedBudgets", "maxAge must be from 1ms to 1m0s, got %s", maxAge)
		}
		o.leaseBatch, o.leaseAge = maxBatch, maxAge
	}
}

// WithDenialCache answers locally the calls that repeat a recent denial (see "Denial cache" in
// the package documentation), for at most about maxKeys keys (1 to 10000000) at once. Default:
// off.
func WithDenialCache(maxKeys int) Option {
	return func(o *options) {
		if maxKeys < 1 || maxKeys > 10_000_000 {
			o.invalid("WithDenialCache", "maxKeys must be from 1 to 10000000, got %d", maxKeys)
		}
		o.denialKeys = maxKeys
	}
}

// WithTracerProvider records a span per decision through tp (see "Traces" in the package
// documentation). Default: none, and then a call makes no span and costs nothing more.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) {
		if tp == nil {
			o.invalid("WithTracerProvider", "must not be nil")
		}
		o.tracerProvider = tp
	}
}

// WithTraceKeys adds the key (the principal, as the call names it) to every span, as
// ratelimit.key. Default: off, because a key is often personal data (a user, an address).
func WithTraceKeys() Option {
	return func(o *options) { o.traceKeys = true }
}
