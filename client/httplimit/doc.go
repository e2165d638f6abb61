// Package httplimit is net/http middleware that rate-limits requests with a client.Limiter:
// 429 with Retry-After when a request is denied, the IETF RateLimit headers on every response.
// Its Transport paces a service's own calls to rate-limited APIs.
//
// # Responses
//
// Every response to a limited request (served or refused) carries
//
//	RateLimit-Policy: "<policy>";q=<limit>;w=<window seconds>
//	RateLimit: "<policy>";r=<remaining>;t=<seconds>
//	X-RateLimit-Limit: <limit>
//	X-RateLimit-Remaining: <remaining>
//	X-RateLimit-Reset: <Unix time in seconds>
//
// following draft-ietf-httpapi-ratelimit-headers-11 (both fields are Structured Field lists
// whose items are Strings naming the policy). w is the limit's window; for a token or leaky
// bucket, the time it takes to refill (drain) the whole Capacity: Capacity units per w seconds
// is the bucket's long-run rate. t is seconds from now: on a served request, until the
// limiter is back to its initial state (Result.ResetAfter); on a 429, the same as
// Retry-After, since the draft asks that Retry-After not point before the end of t.
// X-RateLimit-Reset is the Unix time at the end of t, as GitHub and X send it
// (Options.Reset: ResetDelta sends t instead, ResetNone nothing). Every duration is rounded up
// to a whole second.
//
// A denied request is answered 429 Too Many Requests, Retry-After in seconds (rounded up, so a
// client that waits that long is admitted), Content-Type application/json and the body
//
//	{"error":"rate limited","policy":"<policy>","retry_after_ms":<milliseconds>}
//
// retry_after_ms is left out, as is Retry-After, when no wait would admit the request (its
// cost is above the limit). With Options.ProblemJSON the body is RFC 9457 problem details,
// application/problem+json, of the draft's quota-exceeded type:
//
//	{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
//	 "title":"...","status":429,"violated-policies":["<policy>"],"retry_after_ms":<milliseconds>}
//
// # Calendar quotas and penalties
//
// A client.Calendar (library 1.2.0) is a quota per day, week, month or year from an anchor in
// a time zone. Its headers describe the window that holds now: w is its length (a day of 23,
// 24 or 25 hours, a month of 28 to 31 days), and its reset (t on a served request,
// X-RateLimit-Reset) the window's end, also before the window's first unit is taken.
//
// A limit with a Penalty (library 1.2.0) blocks the principal once it denies a request, for the
// Penalty; a block can also be set and lifted by hand (client.Limiter's Block and Unblock, on
// LimiterKey). A request the block refuses (client.Result.Blocked) counts nothing, and is
// answered 429 with Retry-After the block's time left, which more requests never lengthen; its
// headers say the deciding limit's quota, r=0 and t the same wait; its body says
// "blocked":true, the problem details a detail and "blocked":true too. A hidden quota
// (Policy.HideQuota) gets Retry-After alone, and a body that says no more than any denial's.
// Only a limit with a Penalty looks at blocks: to obey an operator's blocks without
// penalising a denial much, give it a Penalty of a millisecond.
//
// Key a penalty by a principal the server authenticated, or an address read from trusted
// proxies only (ClientIP): a key a client can forge (an address from a header nobody checked,
// a user name from a login form) lets an attacker lock a victim out for the whole penalty.
//
// # Several limits, the login pattern
//
// Policy.Also adds limits to a route, decided with its Limit all or nothing
// (client.AllowAll): a request every limit admits counts against each, one that any refuses
// counts against none. An AlsoLimit may count against a key of its own (AlsoLimit.Key): the login
// pattern limits attempts per (IP, user), per IP and per user at once. RateLimit-Policy
// lists every enforced limit, the one that decided first (when refused, the refusing one with
// the longest wait; else the one with the fewest units left); RateLimit and the X-RateLimit-*
// headers describe that one: AllowAll answers with its state alone.
//
// Policy.HideQuota sends no RateLimit-Policy, RateLimit or X-RateLimit-* header and a 429 body
// that names neither the policy nor the wait: on an authentication route, "4 attempts left"
// helps whoever is guessing. Retry-After is still sent.
//
// # Rolling a limit out
//
// A limit in shadow (Policy.Shadow for the whole route, AlsoLimit.Shadow for one limit) is decided
// and counted in the limiter like an enforced one, beside the enforced decision, but never
// refuses and sends no header: a request it would have refused is counted in
// MetricWouldDeny (with Options.MeterProvider) and passed to Options.OnShadowDeny. The
// response does not wait for it (the limiter's deadline bounds it), and a panic in it is
// recovered and logged. A Key error that only shadow limits would see refuses nothing: it goes
// to Options.OnError as a *ShadowKeyError.
// Policy.EnforcePercent enforces a route for a share of its keys, chosen by a hash of the key
// (not at random): the same keys on every request and every instance, and a higher
// percentage only adds keys.
//
// # Client addresses
//
// ClientIP keys requests by the client's IP address behind trusted proxies: their
// X-Forwarded-For (or Forwarded) is read only when the peer is one of them, from the right,
// and the first address that is not a trusted proxy is the client; entries to its left are
// what the client sent, and are never read. IPv6 clients are grouped by /64.
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
// # Counting by outcome, and a cost per limit
//
// Policy.Outcome settles a request once its handler has ended, from its status (however it
// ends: a return, a panic, an error handler, a stream, a hijack) and a cost the handler reports
// in a header or trailer: the units are given back when the request does not count (a login
// limiter counting failures, Failures; an API charging successes, Successes), or brought to
// the reported cost. Outcome.CheckFirst only peeks before the handler and takes after: the
// requests of one key in flight at once can each pass the peek, a gap a Concurrency of 1
// closes. Policy.Cost and AlsoLimit.Cost give each limit its own cost per request, decided all
// or nothing ("60 requests and 150,000 tokens per minute"), and Unit names what a limit counts
// in RateLimit-Policy (qu). AlsoLimit.SameKey keeps the tokens' limit on the Policy's own key,
// beside the requests', where one atomic rl_multi call decides both. Package client/grpclimit does all of this for gRPC services.
//
// # Failures
//
// The middleware never serves a request with no limit unless told to. What it answers when a
// request is left without a decision depends on why (each error also goes to Options.OnError,
// by default a log line saying what is wrong, at most one a second per kind and per
// misconfigured policy):
//
//   - The limiter could not decide: its server unreachable, its deadline passed, its circuit
//     open, its library absent or too old. A *client.Limiter decides these itself under its
//     default policy, client.LocalFallback (an in-process limiter with a share of each
//     limit), so they reach the middleware only from a Limiter built with
//     client.Options{Fallback: client.ReturnError}. Answered 503 Service Unavailable (a temporary
//     condition: a client or a load balancer may retry), or Options.ErrorStatus.
//     Options.FailOpen serves them instead, with no limit and no rate-limit headers: a choice
//     to make knowingly.
//   - A configuration mistake: a Policy the middleware refuses (*PolicyError: a Name with a
//     space, EnforcePercent 101, an AlsoLimit without a Limit), a limit the client refuses
//     (*client.LimitError: a TokenBucket of Capacity 0), a key holding another algorithm's
//     state (*client.LibraryError), a Limiter that cannot decide the Policy (ErrNoMultiDecider,
//     ErrNoAcquirer). Answered 500 Internal Server Error, FailOpen or not: a limit that cannot
//     be valid is a bug, which serving the route unlimited would hide. List the policies in
//     Options.Policies and New refuses them at start-up instead.
//   - A key the limits cannot count the request against: Options.Key's (or an AlsoLimit's) error
//     or empty key, or one the Limiter refuses as too long (*client.KeyError). The client's
//     fault: answered 400 Bad Request, the body saying "missing or unreadable key", "missing
//     key" or "key too long".
//   - A cost no limit takes: a Cost function's (Policy.Cost, AlsoLimit.Cost) negative, or above
//     999999999999999. A cost comes from what the request sent (its max_tokens): answered 400
//     Bad Request, "invalid cost", and not reported, as a Key's own errors are not.
//
// A decision across keys (Policy.Also) whose refunds failed is answered as any denial (429):
// the refunds are the Limiter's, tried again in the background or counted as lost and logged
// (see client.Limiter.AllowAllN).
//
// # Keys
//
// The key a limit counts a request against is the Policy's (or the AlsoLimit's, unless it has
// SameKey) Name, ':' and the principal from Options.Key (or AlsoLimit.Key); the client stores
// its state under the Limiter's Key("<name>:<principal>", limit), e.g.
// rl:{api:user-42}:token_bucket, and its block (a Penalty's, or an operator's) under
// rl:{api:user-42}:block: LimiterKey composes "<name>:<principal>". The server holds each
// key for as long as its limiter's state lives (an hour for an hour's sliding log), so the
// client bounds it: at most 512 bytes (the client's Options.MaxKeyLen default), name and ':'
// included, or what Options.MaxKeyLen sets. A longer one is answered 400 and writes nothing. Key a long identifier (a JWT, a URL,
// a long header) by a hash of it, e.g. hex.EncodeToString of its crypto/sha256 sum: 64 bytes,
// the same for every request that carries it.
//
// # Start-up
//
// A service whose routes' limits are constants lists them in Options.Policies: New refuses
// one that cannot be valid, with an *ConfigError naming it, and Middleware.Check verifies
// that every node runs the library release they need (Needs: 1.2.0 for a Calendar or a
// Penalty, 1.1.0 for several limits at once, a Concurrency or a Reserve). A node that runs an older release still
// limits (the client decides each limit it can, one at a time, and its policy the rest), but
// not all or nothing: Check's *ReleaseError says so before the first request, not a log line
// under load.
//
// # Outbound
//
// Transport is an http.RoundTripper that waits, within the request's context, until a
// limiter admits each request: a client.LeakyBucket in Shape mode spaces the calls of every
// instance sharing it evenly; a token bucket admits bursts, and a request it refuses waits its
// RetryAfter. A wait that would pass the context's deadline fails at once, with a *WaitError.
// A replayable request answered 429 is sent again after its Retry-After (seconds or an
// HTTP-date), plus jitter so that a fleet does not retry at one instant, up to MaxRetries.
package httplimit
