// Package httplimit is net/http middleware that rate-limits requests with a client.Limiter:
// 429 with Retry-After when a request is denied, the IETF RateLimit headers on every response.
//
// # Responses
//
// Every response to a limited request (served or refused) carries
//
//	RateLimit-Policy: "<policy>";q=<limit>;w=<window seconds>
//	RateLimit: "<policy>";r=<remaining>;t=<seconds>
//	X-RateLimit-Limit: <limit>
//	X-RateLimit-Remaining: <remaining>
//	X-RateLimit-Reset: <seconds>
//
// following draft-ietf-httpapi-ratelimit-headers-11 (both fields are Structured Field lists
// whose items are Strings naming the policy). w is the limit's window; for a token or leaky
// bucket, the time it takes to refill (drain) the whole Capacity: Capacity units per w seconds
// is the bucket's long-run rate. t, and X-RateLimit-Reset, are seconds from now (never a Unix
// time): on a served request, until the limiter is back to its initial state (Result.ResetAfter);
// on a 429, the same as Retry-After, since the draft asks that Retry-After not point before
// the end of t. Every duration is rounded up to a whole second.
//
// A denied request is answered 429 Too Many Requests, Retry-After in seconds (rounded up, so a
// client that waits that long is admitted), Content-Type application/json and the body
//
//	{"error":"rate limited","policy":"<policy>","retry_after_ms":<milliseconds>}
//
// retry_after_ms is left out, as is Retry-After, when no wait would admit the request (its
// cost is above the limit).
//
// # Shaping
//
// With a client.LeakyBucket in client.Shape mode the limiter admits a request with a delay:
// the middleware holds it that long before calling the next handler, so requests leave evenly
// spaced. A delay above Options.MaxDelay is answered 429 instead, with a Retry-After after
// which a request would be held no longer than MaxDelay. That request still took its place in
// the queue (the server admitted it): size Capacity so that Capacity units leak out within
// MaxDelay, and the server itself refuses what would wait longer, at no cost to the queue.
// A request whose context ends while it is held is answered 503 and never reaches the next
// handler.
//
// # Concurrency and critical routes
//
// A Policy with a Concurrency holds a lease of it (library 1.1.0) while the next handler runs,
// released when it returns or panics: at most Limit requests of one key in flight. A request
// refused a slot is answered 429 with Retry-After. A Policy marked Critical makes its
// requests client.Critical: they may use the Reserve of its limits, which other routes
// leave to them.
//
// # Failures
//
// The limiter's errors (server gone, deadline, a limit the library refuses) are passed to
// Options.OnError and, by default, the request is served without rate-limit headers: the
// limiter must not take the service down with it. Options.ErrorStatus answers them with a
// status instead. A Options.Key error is the request's fault and is answered 400.
package httplimit
