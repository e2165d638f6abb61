// Package client is the typed Go client of the ratelimit library: a Limiter runs its functions
// with FCALL (and FCALL_RO on replicas) through a valkey.Client the caller owns.
//
//	lim, err := client.New(vk, client.Options{}) // every default: see Options
//	if err != nil {
//		return err
//	}
//	limit := client.TokenBucket{Capacity: 10, Rate: 5, Period: time.Second}
//	res, err := lim.Allow(ctx, "user:42", limit)
//	switch {
//	case err != nil:
//		// a bad key or limit, RLERR, a canceled request: what no Fallback decides
//	case !res.Allowed:
//		// refuse; res.RetryAfter says when to come back (Never: the cost exceeds the limit)
//	}
//
// A limit is a value of one of the algorithms (FixedWindow, SlidingLog, SlidingWindow,
// TokenBucket, LeakyBucket, Calendar; Concurrency for leases); its numbers are not part of the key, so a
// changed limit keeps its principals' state. Result says what was decided, and where
// (Result.Source).
//
// # When the server is slow or gone
//
// Every call has a deadline (Options.Deadline, 100ms by default). A circuit breaker (Options.BreakerFailures)
// opens after consecutive failures, so that a dead server costs no network attempt per call,
// and lets one call probe it after a cooldown. What a call the server cannot decide returns is
// the Limiter's Fallback: the decision of an in-process limiter of the same algorithm admitting a
// share of the limit (LocalFallback, Options.Instances, the default), a denial (FailClosed), an
// admission (FailOpen: no limit while the server is gone), or the error (ReturnError).
// Decisions made in-process have Result.Source FromFallback and err == nil. A node whose library is too
// old for a call (a reserve, a refund, a lease on 1.0.0) and a cluster that answers
// CLUSTERDOWN are among what the Fallback decides: a limit never turns into no limit by default.
//
// # Leased budgets
//
// One call per decision caps a hot key (a big merchant, a global ceiling, an address under
// attack) at what one server core runs. With Options.BudgetBatch and BudgetAge, a Limiter
// takes units of a hot key in batches: AllowN(k) at the server, one call, then hands them out
// to the calls that follow without the server. Budgets are per key, limit and reserve, for the
// token bucket, the leaky bucket in Police mode, the fixed window, the sliding window counter
// and the calendar (never a limit with a Penalty, whose block the server decides with it).
// The bounds:
//
//   - Never over the limit: a unit is consumed at the server before it is handed out, so
//     across any number of processes the total admitted never exceeds what the server
//     admitted. A batch is judged with the limit's Reserve, so the reserve stays at the
//     server. Critical calls on a limit with a Reserve are never batched: a batch taken
//     without the reserve would park the reserve's units in one process, out of reach of the
//     others' critical calls.
//   - Timing: a unit taken at t is handed out by t + maxAge, so a decision is shifted by at
//     most maxAge (as if the request had come at t). A window's batch is not handed out past
//     the end of the window it was counted in (derived from its Result's ResetAfter, from when
//     the batch was sent, less a millisecond: never later than the server's).
//   - Parked units: one batch at a time per budget (the calls that come meanwhile wait for it),
//     of at most maxBatch units, so at most maxBatch - 1 units are parked per process, key,
//     limit and reserve. A key gets a budget once three of its calls came each within a
//     quarter of maxAge of the one before. The batch adapts: it doubles while batches are used up
//     within a quarter of maxAge, halves when one lasts more than half, and is one unit, as
//     without batching, when the key is idle for maxAge or denied. A key called less often
//     than once per maxAge is decided by one call of its cost per decision, and parks nothing.
//     A batch the server denies is followed by the exact call of the cost, so that a limited
//     key is decided as without leased budgets.
//   - Giving back: parked units are refunded when they age out (maxAge), when the key is
//     denied, and on Close. A window's units are refunded only until the Limiter's deadline
//     before the window's end (the server takes a refund off the window current when it runs,
//     and a refund that ran in the next window would free units that window never counted);
//     later ones expire with their window. A crashed process, or a refund that fails, loses its
//     parked units: at most maxBatch - 1 per key, for at most maxAge or until their window
//     ends; the limit under-admits them, never over-admits.
//
// A unit handed out locally has Result.Source FromLease; its Remaining is the server's Remaining
// after the batch plus the units still parked here, its ResetAfter the batch's less the time
// since it was sent: as of the batch, blind to other processes since. Call Close when done
// with such a Limiter; after Close every call goes to the server.
//
// # Denial cache
//
// A denial consumes nothing and, refunds aside, a limiter only recovers with time: a key
// denied with RetryAfter R is denied again until R has passed. With Options.DenialCache, a
// Limiter remembers recent denials per key, limit, cost and reserve, and answers the same
// call from memory until R has passed since the denied call was sent (so never later than the
// server would admit it): Result.Source FromDenialCache, RetryAfter counting down, the denial's Limit and
// Remaining. An abusive client hammering one key then costs the server nothing. A Refund
// through this Limiter drops the key's denials; a refund by another process is not seen, so
// it can only make a cached denial last a little longer than needed, never admit a call too
// many. The cache holds at most about maxKeys keys: a full shard evicts the denial that ends
// first.
//
// # Traces
//
// With Options.TracerProvider, every decision records a client span, whose context the call passes
// on, so that a traced valkey-go client's FCALL span is its child: AllowN (and Wait's calls),
// PeekN and Refund (rlfn.allow, rlfn.peek, rlfn.refund), a lease's Acquire or Renew and its
// Release (rlfn.acquire, rlfn.release), a Hold's Limiter.Hold and Add (rlfn.hold, with rlfn.rules)
// and Settle (rlfn.settle), and AllowAll, AllowAllEach and PeekAll (rlfn.allow_all,
// rlfn.peek_all, one span for all the rules, with rlfn.rules, their number, and rlfn.rule, the
// index of the one that decided, whose limit the other attributes describe). Attributes:
// rlfn.algorithm, rlfn.operation, rlfn.cost, rlfn.limit.name (a limit's Name, when set), and
// once decided ratelimit.allowed,
// ratelimit.remaining, ratelimit.limit, rlfn.source (as rlfn.client.decisions' rlfn.source) and, when
// denied, ratelimit.retry_after_ms (-1 for Never); an error is recorded with the span's status
// Error. The key is recorded (ratelimit.key) only with Options.TraceKeys: keys are often personal
// data. Without a tracer provider, no span is made and a call costs nothing more.
//
// # Metrics
//
// With Options.MeterProvider, a Limiter records through the OpenTelemetry metric API (without
// it, no instrument exists):
//
//   - rlfn.client.decisions counts decisions ({decision}), by rlfn.algorithm (an algorithm,
//     concurrency, or multi for rl_multi), the limit (rlfn.limit.name: its Rule.Name, else
//     WithLimitName's name, else the Limit's Name; rlfn.limit.quota, its configured limit or
//     capacity; rlfn.limit.period, its window, period or lease as time.Duration prints it, or
//     a calendar's day, week, month or year; an rl_multi's are those of the limit that
//     decided it), rlfn.operation
//     (allow, peek, refund, acquire, release), rlfn.outcome (allowed, denied) and rlfn.source:
//     server; the fallback that decided (fail_open, fail_closed, local_fallback); leased for
//     a unit handed out from a leased budget; denial_cache for a denial answered by the
//     denial cache. At most Options.MetricLimits limits (256) have series of their own; the
//     decisions of further ones share their algorithm's, named OverflowLimitName. Keys are
//     never attributes.
//   - rlfn.client.limit.utilization is, for each Allow and Acquire decided, the share of the
//     limit used right after it (1 - Remaining/Limit; 1 when denied), by rlfn.algorithm and
//     the limit's three attributes, in buckets 0.25, 0.5, 0.75, 0.8, 0.9, 0.95, 0.99 and 1:
//     the share of a limit's decisions above 90% is 1 - bucket{le="0.9"}/count.
//   - rlfn.client.errors counts the errors calls met ({error}), returned or decided by a
//     fallback, by rlfn.algorithm, rlfn.operation and error.type: timeout, unreachable,
//     cluster_down (CLUSTERDOWN, TRYAGAIN), circuit_open, not_loaded, server_error,
//     reply_error, library_error, version (a 1.1 or 1.2 feature on an older library) or
//     canceled.
//     Limits and keys refused before any call (*LimitError, *KeyError) are not counted.
//   - rlfn.client.call.duration is the latency of the calls sent to the server, in seconds,
//     by rlfn.algorithm, rlfn.operation and rlfn.outcome (allowed, denied, error).
//   - rlfn.client.breaker.transitions counts the circuit breaker's changes of state
//     ({transition}), by rlfn.breaker.state: open, half_open, closed.
//   - rlfn.client.refunds.lost counts the units a refused decision across keys (AllowAll)
//     took and its refunds could not give back ({unit}), by rlfn.reason: unknown (sent and not
//     answered: the server may have made it), expired (its node did not answer before the
//     limiter would have given the units back by itself, within a minute, or by Close), overflow (10,000
//     refunds were owed already), refused (an error a retry would meet again).
//   - With leased budgets, rlfn.client.leased.batches counts the batches taken ({batch}):
//     admitted calls that took more units than their cost; rlfn.client.leased.units the units
//     those batches took beyond their calls' cost ({unit}); rlfn.client.leased.refunded the
//     parked units given back to the server ({unit}): aged out, after a denial, or by Close.
//     All by rlfn.algorithm.
//   - With Options.Overrides, rlfn.client.overrides.loads counts the versions of the
//     overrides read and compiled; rlfn.client.overrides.errors the reads that failed (the
//     last overrides read stay in force) by error.type as rlfn.client.errors', and the
//     overrides that do not compile (error.type invalid_override: the code's limit applies).
package client
