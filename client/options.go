package client

import (
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Options configure a Limiter. The zero value is a Limiter with every default: keys under
// "rl:", a 100ms deadline per call, a circuit breaker per node and LocalFallback. New refuses
// a field it cannot use with an *OptionError, rather than run with other settings.
type Options struct {
	// Prefix starts every server key (see Limiter.Key). Default (""): "rl:". The prefix never
	// chooses a cluster slot: its braces are escaped like the key's.
	Prefix string

	// Deadline bounds every call, Allow and Peek alike: a call whose context has a later
	// deadline, or none, gets this one. A call that reaches it is a failure (see Fallback).
	// Default (0): 100ms, a few round trips on a loaded network, far below what a request can
	// wait for its rate limit.
	Deadline time.Duration

	// Fallback is what a call does when the server cannot decide it. Default (the zero
	// value): LocalFallback.
	Fallback Fallback

	// Instances is how many processes share the limits, for LocalFallback: each admits
	// limit / n units of a window, and a bucket of capacity / n refilled at rate / n (kept
	// exact as rate per n periods), rounded down so that the processes together stay within
	// the limit, and at least 1 so that each admits something. From 1 to 1000000. Default
	// (0): 1, the whole limit in every process.
	Instances int

	// LocalKeys bounds the keys LocalFallback holds state for: at most about LocalKeys (a
	// little more as it is split in shards). Each shard drops its expired state once a
	// second; a full shard makes room for a new key by evicting, of 8 keys it samples, the
	// one closest to expiring. Default (0): 100000, about 8 MB when full of windows or
	// buckets, 36 MB of sliding logs (a local log keeps at most 17 counts per key), with keys
	// of about 25 bytes.
	LocalKeys int

	// BreakerFailures and BreakerCooldown set the circuit breaker: it opens after
	// BreakerFailures consecutive calls the server did not answer (a timeout, a network
	// error), sends nothing to the server while open, lets one call through as a probe once
	// BreakerCooldown has passed, and closes when the probe is answered (or opens for another
	// cooldown when it is not). An error reply (ErrNotLoaded, LOADING...) is an answer: such
	// a server is reachable and quick to ask, and a deploy is seen at once. Defaults (0): 5
	// failures, 1s.
	//
	// A Limiter on a cluster has a breaker per shard, found by the key's hash slot (the table
	// of slots comes from CLUSTER SLOTS, read in the background on the first call and
	// whenever a breaker opens): one dead shard opens its own breaker, its calls pay the
	// deadline only until then, and the other shards' calls go on. A shard's replicas share
	// its breaker. A standalone server (or a sentinel's primary) has one.
	BreakerFailures int
	BreakerCooldown time.Duration

	// MaxKeyLen is the longest key (the principal, in bytes) a call takes, from 1 to
	// 1048576; a longer one is a *KeyError, sent nowhere. The server holds each limiter's key
	// for as long as its state lives (an hour for an hour's sliding log), once per algorithm
	// and Name, so a key read from a request header must not be as long as the header. To
	// count by a long identifier (a JWT, a URL), key by a hash of it (sha256, hex). Default
	// (0): 512 bytes, room for an e-mail address or a URL behind a policy's name.
	MaxKeyLen int

	// MaxRules is the most rules one AllowAll (AllowAllN, AllowAllEach, PeekAll) takes, from 1
	// to 1000000; more are a *LimitError (Field "rules"), sent nowhere. Every Key of a
	// decision is a call to the server, and a refund when another Key denies: rules built from
	// request data (a service that limits every item of a request) must not let one request
	// send thousands of calls and owe thousands of refunds. Default (0): 1000.
	MaxRules int

	// BudgetBatch and BudgetAge turn on leased budgets (see "Leased budgets" in the package
	// documentation): admissions of hot keys are served from batches of units taken from the
	// server in one call. A batch takes at most BudgetBatch units (2 to 1000000), so that at
	// most BudgetBatch - 1 are parked in this process per key, limit and reserve, and its
	// units are handed out for at most BudgetAge (1ms to 1 minute) after it was sent, then
	// given back. Set both or neither. Default (0, 0): off, one call per decision.
	//
	// They apply to the token bucket, the leaky bucket in Police mode, the fixed window, the
	// sliding window counter and the calendar (a batch never outlives its window), for AllowN
	// with a cost of at least 1; never to the sliding log (whose exactness batches would
	// break), Shape mode, a limit with a Penalty (its block is decided with it at the
	// server), concurrency leases, peeks, AllowAll or Critical calls on a limit with a Reserve. A Limiter with leased budgets owns
	// parked units: call Close when done with it.
	BudgetBatch int64
	BudgetAge   time.Duration

	// DenialCache answers locally the calls that repeat a recent denial (see "Denial cache"
	// in the package documentation), for at most about DenialCache keys (1 to 10000000) at
	// once. Default (0): off.
	DenialCache int

	// MeterProvider records metrics (see "Metrics" in the package documentation). Default
	// (nil): no instrument exists, and a call costs nothing more.
	MeterProvider metric.MeterProvider

	// MetricLimits bounds the limits whose decisions get metric series of their own (by
	// rlfn.limit.name, rlfn.limit.quota and rlfn.limit.period, see "Metrics" in the package
	// documentation), from 1 to 100000: a limit is its algorithm, name (its Rule.Name,
	// WithLimitName's, or its Name), quota and period. The decisions of limits beyond it share one series
	// per algorithm named OverflowLimitName, so that names made up per request, or an override
	// per key, never grow the series count further. Default (0): 256.
	MetricLimits int

	// TracerProvider records a span per decision (see "Traces" in the package
	// documentation). Default (nil): a call makes no span and costs nothing more.
	TracerProvider trace.TracerProvider

	// Logger receives what the Limiter has to say while it runs, one structured line per
	// event, node and 10 seconds at most (the lines not written meanwhile are counted in the
	// next one's "suppressed"): a node's calls going to the Fallback (warn) and back to the
	// server (info), a circuit breaker opening (warn) and closing (info), a node without the
	// ratelimit library (error). Every line has "event" and "node" (host:port) attributes, and
	// names the limit where one call caused it ("limit": its algorithm and Name). Default
	// (nil): slog.Default() at the time of the line; slog.New(slog.DiscardHandler) silences it.
	Logger *slog.Logger

	// LoadLibrary lets the Limiter load the newest library release it embeds (versions) onto a
	// node that answers it has none: a primary that joined the cluster, or replaced a dead
	// one, after the last rlfn deploy. At most once per node and 10 seconds, in the
	// background (the call that found it goes to the Fallback as always), with FUNCTION LOAD
	// without REPLACE, so that a library that exists is never replaced; the server user
	// needs FUNCTION LOAD in its ACL. The Logger says what it did (event library_loaded) or
	// why it could not. Default: false: the node is logged (event library_missing), and rlfn
	// deploy or rlfn reconcile loads it. See docs/operations.md.
	LoadLibrary bool

	// TraceKeys adds the key (the principal, as the call names it) to every span, as
	// ratelimit.key. Default: false, because a key is often personal data (a user, an
	// address).
	TraceKeys bool

	// Overrides makes the Limiter obey the overrides operators set on the server (rlfn
	// override set, or a file applied with rlfn override apply): an override replaces the
	// limit of one key, or of every key with a prefix, for one limit (its algorithm and
	// Name), until removed or until its end. The Limiter reads them through the valkey.Client's
	// client-side cache, invalidated by the server (RESP3, the default of valkey-go), so that
	// in steady state a decision sends no more to the server than without them, and a change
	// is seen within milliseconds. A client without client-side caching
	// (ClientOption.DisableCache) is detected and read once a second instead. When the
	// overrides cannot be read, the last ones read stay in force (none before the first
	// read: the code's limits), and the rlfn.client.overrides.errors metric counts it; a
	// decision never waits for them nor fails because of them. See docs/overrides.md.
	// Default: false, no override is read.
	Overrides bool

	// TopKeys tracks, for each limit (its algorithm and Name), the TopKeys keys it denies most
	// (the denials of AllowN, and of AllowAll by the rule that decided; 1 to 10000), in bounded memory (a Space-Saving sketch: a key denied
	// more than one in TopKeys of its limit's denials is among them), and publishes them
	// every TopEvery to a key of this process that expires after three periods,
	// <prefix>{%top}:<random id>, which rlfn top merges with every other process's. No key
	// becomes a metric label. A Limiter with TopKeys publishes until Close. Default (0): off.
	TopKeys int
	// TopEvery is how often TopKeys are published, 10ms to 1 hour. Default (0): 5s.
	TopEvery time.Duration

	// clock replaces the Limiter's clock (Unix nanoseconds) in the package's tests, so that
	// the breaker's cooldown and the local limiters' windows run on a fake clock.
	clock func() int64
}

// The defaults of Options' zero fields.
const (
	defaultPrefix          = "rl:"
	defaultDeadline        = 100 * time.Millisecond
	defaultBreakerFailures = 5
	defaultBreakerCooldown = time.Second
	defaultLocalKeys       = 100_000
	defaultMaxKeyLen       = 512
	defaultMaxRules        = 1000
)

// Fallback is what a call does when the server cannot decide it: the server is unreachable,
// the call ran past its deadline, the circuit breaker is open, the cluster is down
// (CLUSTERDOWN, TRYAGAIN: as a dead shard), the node's library is older than the call needs
// (a *VersionError: a reserve, a refund, a lease or rl_multi on a node still running 1.0.0; a
// calendar or a penalty on one running 1.1.0), or the server answered with an error that is not the caller's (ErrNotLoaded, LOADING, OOM,
// NOPERM, a reply out of contract...).
//
// A *LimitError and a *KeyError (refused before any call) and a *LibraryError (RLERR: the key
// holds other state) are the caller's bugs: every fallback returns them as they are. So does
// a call whose context the caller canceled, or that was done before the call: nobody waits
// for its answer.
//
// ErrNotLoaded does fall under the fallback: a server restarted without persistence comes
// back without its functions, and a service must not go down until someone runs rlfn deploy.
// CheckVersion at startup catches a missing deploy, and the errors metric counts not_loaded.
//
// Every fallback but ReturnError answers with err == nil and Result.Source FromFallback, so
// that the usual `if err != nil` handles only what no fallback can decide; the cause is
// counted in metrics.
type Fallback uint8

const (
	// LocalFallback decides with an in-process limiter of the same algorithm, admitting a
	// share of the limit: see Options.Instances. Its Result.Limit is that share. A key's
	// local state lasts until the server decides that key again, or until it expires: in a
	// cluster with a shard down, the live shards' answers leave the dead shard's keys
	// limited. The default: a rate limiter that stops limiting when its server does fails the
	// service it protects exactly when that service is most likely under load.
	LocalFallback Fallback = iota
	// FailClosed denies: Remaining 0, RetryAfter (and ResetAfter) the time until the breaker
	// probes the server again, or its cooldown when it is not open.
	FailClosed
	// FailOpen admits: Allowed, Remaining = Limit - cost, as a fresh limiter would answer. A
	// cost above the limit is still denied with RetryAfter = Never. While the server cannot
	// decide, the service runs with no limit at all: a choice to make knowingly.
	FailOpen
	// ReturnError returns the error (ErrCircuitOpen while the breaker is open), and leaves
	// the decision to the caller.
	ReturnError
)

func (f Fallback) String() string {
	switch f {
	case ReturnError:
		return "return_error"
	case FailOpen:
		return "fail_open"
	case FailClosed:
		return "fail_closed"
	case LocalFallback:
		return "local_fallback"
	}
	return fmt.Sprintf("Fallback(%d)", uint8(f))
}

// OptionError reports an Options field New cannot use (or a nil valkey.Client): New returns
// it, and no Limiter, since one that silently ran with other settings would be worse.
type OptionError struct {
	Field  string // e.g. "Deadline"
	Reason string // e.g. "must not be negative, got -1s"
}

func (e *OptionError) Error() string {
	if e.Field == "vk" {
		return "client: vk " + e.Reason
	}
	return "client: Options." + e.Field + " " + e.Reason
}

// resolved is Options with its defaults applied, and what is wrong with it.
type resolved struct {
	Options
	errs []error
}

func (r *resolved) invalid(field, format string, args ...any) {
	r.errs = append(r.errs, &OptionError{Field: field, Reason: fmt.Sprintf(format, args...)})
}

// resolve applies the defaults of o's zero fields and checks the others.
func resolve(o Options) resolved {
	r := resolved{Options: o}
	if r.Prefix == "" {
		r.Prefix = defaultPrefix
	}
	r.Deadline = orDefault(&r, "Deadline", r.Deadline, defaultDeadline)
	if r.Fallback > ReturnError {
		r.invalid("Fallback", "must be LocalFallback, FailClosed, FailOpen or ReturnError, got %s", r.Fallback)
	}
	r.Instances = inRange(&r, "Instances", r.Instances, 1, 1_000_000, 1)
	r.LocalKeys = inRange(&r, "LocalKeys", r.LocalKeys, 1, 1<<31-1, defaultLocalKeys)
	r.BreakerFailures = inRange(&r, "BreakerFailures", r.BreakerFailures, 1, 1<<31-1, defaultBreakerFailures)
	r.BreakerCooldown = orDefault(&r, "BreakerCooldown", r.BreakerCooldown, defaultBreakerCooldown)
	r.MaxKeyLen = inRange(&r, "MaxKeyLen", r.MaxKeyLen, 1, 1<<20, defaultMaxKeyLen)
	r.MetricLimits = inRange(&r, "MetricLimits", r.MetricLimits, 1, 100_000, defaultMetricLimits)
	r.MaxRules = inRange(&r, "MaxRules", r.MaxRules, 1, 1_000_000, defaultMaxRules)
	switch {
	case r.BudgetBatch == 0 && r.BudgetAge == 0:
	case r.BudgetBatch < 2 || r.BudgetBatch > 1_000_000:
		r.invalid("BudgetBatch", "must be from 2 to 1000000 (or 0 with BudgetAge 0: off), got %d", r.BudgetBatch)
	case r.BudgetAge < time.Millisecond || r.BudgetAge > time.Minute:
		r.invalid("BudgetAge", "must be from 1ms to 1m0s with BudgetBatch, got %s", r.BudgetAge)
	}
	if r.TopKeys < 0 || r.TopKeys > 10_000 {
		r.invalid("TopKeys", "must be from 1 to 10000 (or 0: off), got %d", r.TopKeys)
	}
	switch {
	case r.TopEvery == 0:
		r.TopEvery = 5 * time.Second
	case r.TopEvery < 10*time.Millisecond || r.TopEvery > time.Hour:
		r.invalid("TopEvery", "must be from 10ms to 1h0m0s (or 0: 5s), got %s", r.TopEvery)
	}
	if r.DenialCache < 0 || r.DenialCache > 10_000_000 {
		r.invalid("DenialCache", "must be from 1 to 10000000 (or 0: off), got %d", r.DenialCache)
	}
	return r
}

// orDefault is d, or def when d is zero; a negative d is invalid.
func orDefault(r *resolved, field string, d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		r.invalid(field, "must not be negative, got %s", d)
	}
	return d
}

// inRange is v, or def when v is zero; v must be from lo to hi.
func inRange[T int | int64](r *resolved, field string, v, lo, hi, def T) T {
	switch {
	case v == 0:
		return def
	case v < lo || v > hi:
		r.invalid(field, "must be from %d to %d (or 0: %d), got %d", lo, hi, def, v)
	}
	return v
}
