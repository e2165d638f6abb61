// Package client is the typed Go client of the ratelimit library: Allow, AllowN and Peek run
// its functions with FCALL (and FCALL_RO on replicas) through a valkey.Client the caller owns.
//
// # When the server is slow or gone
//
// Every call has a deadline (WithDeadline, 100ms by default). A circuit breaker (WithBreaker)
// opens after consecutive failures, so that a dead server costs no network attempt per call,
// and lets one call probe it after a cooldown. What a call the server cannot decide returns is
// the Limiter's Policy: the error (ReturnError, the default), an admission (FailOpen), a
// denial (FailClosed), or the decision of an in-process limiter of the same algorithm
// admitting a share of the limit (LocalFallback, WithInstances). Decisions made in-process
// have Result.Local set and err == nil.
//
// # Metrics
//
// With WithMeterProvider, a Limiter records through the OpenTelemetry metric API:
// MetricDecisions, MetricErrors, MetricDuration and MetricBreakerTransitions. Without it, no
// instrument exists.
package client
