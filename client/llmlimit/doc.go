// Package llmlimit is net/http middleware that holds LLM requests to exact token budgets: in
// front of an OpenAI- or Anthropic-compatible API (an httputil.ReverseProxy to it), it holds
// each request's estimate, passes JSON and server-sent event streams through while it meters
// the output, cuts a stream whose budget runs out with a well-formed end, and settles every
// request from its response's usage (library 1.3.0's holds, through client.Limiter.Meter).
//
// # Requests
//
// Options.API tells the API by the path (ByPath): POST .../chat/completions (OpenAI's chat
// completions), .../responses (OpenAI's responses), .../messages (Anthropic's messages). Any
// other POST is refused 404, so that no endpoint spends tokens unmetered; a GET or HEAD (a
// list of models) passes unlimited. The body is read whole (up to Options.MaxBody, else 413)
// and handed to the upstream unchanged; the middleware reads its model, its maximum of output
// tokens (max_completion_tokens or max_tokens; max_output_tokens; max_tokens), held for each
// of chat completions' n choices, stream and stream_options.include_usage. A body that is no such request, or a request whose Budget Key
// names no principal, is answered 400.
//
// # Budgets
//
// Each Budget (per user, per organisation) counts every request on its principal's key,
// "<Name>:<principal>", in up to five limits: Requests (one per request), Tokens (input and
// output), InputTokens, OutputTokens, and Spend (money, at Options.Prices by model). A limit
// is any client.Limit but a SlidingLog; a client.Calendar is a quota per day, week, month or
// year. Each is named by what it counts unless it has a Name ("tokens", "spend"), so a month's
// tokens and a month's spend are two limiters on one key, e.g. rl:{org:acme}:calendar:tokens.
//
// A request holds its estimate on every limit of every Budget, all or nothing, before it
// reaches the upstream: its input at Options.Tokens of the prompt's text (Bytes4 by default, a
// token per 4 bytes: rough), its output at its maximum (Options.DefaultMaxTokens when it sets
// none). Spend holds the input estimate at the model's input price and the output at its
// output price.
//
// # Refusals
//
// A request a limit refuses never reaches the upstream. A rate (any limit but a Calendar) is
// answered 429 Too Many Requests with Retry-After in seconds, rounded up; an exhausted quota (a
// Calendar) Options.QuotaStatus, 402 Payment Required or 403 Forbidden, with no Retry-After.
// The body is the API's own error:
//
//	OpenAI:    {"error":{"message":"...","type":"rate_limit_exceeded","param":null,"code":"rate_limit_exceeded"}}
//	           (an exhausted quota: "insufficient_quota")
//	Anthropic: {"type":"error","error":{"type":"rate_limit_error","message":"..."}}
//	           (an exhausted quota: "billing_error" with 402, "permission_error" with 403)
//
// so an OpenAI or Anthropic SDK raises its usual exception. The middleware's other answers (400
// invalid_request_error, 404, 413 request_too_large, 500 and 503 server_error / api_error) use
// the same formats. A Limiter that cannot decide answers 503 (its limits are the service's
// protection: a *client.Limiter decides such requests itself under its default
// client.LocalFallback); a limit it refuses as invalid 500.
//
// # Headers
//
// Every response to a request the limits decided carries the headers the APIs' SDKs and
// clients read, describing this middleware's limits (the upstream's own are removed):
//
//	OpenAI:    x-ratelimit-limit-requests, x-ratelimit-remaining-requests, x-ratelimit-reset-requests,
//	           x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens, x-ratelimit-reset-tokens
//	Anthropic: anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}
//
// For each, of the limits of that dimension, the one with the fewest units left, from the
// hold's own calls (client.Limiter.MeterEach: every limit's reply), so the headers cost no call
// of their own; a limit whose state is unknown (its key's call failed) leaves its headers out.
// OpenAI's reset is a duration ("1s", "6m0s"), Anthropic's an RFC 3339 time, rounded up to the
// second. Remaining is after the request's estimate was held, or, for a refused request, as
// the refusal left it.
//
// # Responses and streams
//
// The upstream is asked for its response as an http.Transport asks (the client's
// Accept-Encoding is removed: a response compressed for the client could not be read on the
// way; the proxy's transport decompresses gzip itself). A response the middleware still cannot
// read (an encoding the transport does not decode, a type that is neither JSON nor a stream) is
// passed on as it is and charged its estimate.
//
// A JSON response is passed through as it comes; its usage settles the request. A stream
// (text/event-stream) is passed through event by event, unchanged, each flushed as soon as it
// is whole. The output text of each event (chat completions' delta content, reasoning, refusal
// and tool call arguments; responses' *.delta events; messages' text, thinking and tool input
// deltas) is counted with Options.Tokens and taken from the request's meter before the event is
// passed on: tokens within the hold cost no call, beyond it the meter takes batches.
//
// When the meter has no more tokens for an event, the stream is cut: that event is not passed
// on, the upstream's request is cancelled (its context), its further writes are refused (an
// httputil.ReverseProxy stops reading the upstream), and the client gets a well-formed end
// that says why:
//
//	chat completions: data: {"id":...,"object":"chat.completion.chunk",...,"choices":[{"index":0,"delta":{},"finish_reason":"length"}],
//	                  "rlfn":{"reason":"budget","message":"...","output_tokens":<n>}}
//	                  data: [DONE]
//	responses:        event: response.incomplete, the response's status "incomplete",
//	                  incomplete_details.reason "max_output_tokens", and "rlfn" beside it
//	messages:         content_block_stop (when a block is open), then a message_delta with
//	                  stop_reason "max_tokens", usage.output_tokens <n> and "rlfn", then message_stop
//
// An SDK sees a response that ran out of tokens (finish_reason "length", status incomplete,
// stop_reason "max_tokens"); a client that wants to know it was the budget reads the member
// "rlfn", whose reason is "budget" (its message names the limit that ran out, as
// "<budget>.<what it counts>"), or "limiter" when the Limiter failed to grant more tokens (the
// stream is cut rather than run unmetered, and the error goes to Options.OnError).
//
// # Settlement
//
// Once the upstream handler has returned (whatever way it ended: a cut, a client gone, a
// panic), the request is settled (client.Meter.Settle): every limit is charged what the
// request used, the difference from its hold given back or, when it used more, the extra taken
// as far as the limit has room, never beyond it. What it used is its usage (OpenAI's
// prompt_tokens, completion_tokens and prompt_tokens_details.cached_tokens; responses'
// input_tokens, output_tokens and input_tokens_details.cached_tokens; Anthropic's input_tokens,
// output_tokens, cache_read_input_tokens and cache_creation_input_tokens; a stream's from its
// last chunk, response.completed, message_start and message_delta), and what it does not say
// is estimated: the input at its estimate, the output at the tokens of the events passed on
// (a chat completions stream says its usage only when asked: Options.AskUsage asks). A
// stream cut is charged the output its client received. A response of 400 or above without
// usage used nothing but the request. Cache reads count as input tokens (at Price.CacheRead in
// Spend) unless Options.CachedFree.
//
// A request's units are never more than its limits allow at any instant: what a stream
// receives was held first. A process that dies mid-stream leaves its hold to expire after
// Options.HoldTTL, charged at what it held (client.HoldOptions.Keep).
package llmlimit
