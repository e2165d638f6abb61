// Package grpclimit is gRPC interceptors that rate-limit calls with a client.Limiter, the
// gRPC side of httplimit, sharing its decisions: server interceptors (unary and stream) that
// refuse a call ResourceExhausted with the exact wait in a google.rpc.RetryInfo, and client
// interceptors that pace a service's own calls and wait out a server's RetryInfo.
//
// # Server
//
// NewServer takes a policy per full method name (ServerOptions.Methods, "/package.Service/*"
// for a whole service, Default for the rest) and a Key that reads the call's principal: Peer,
// Metadata, TLSIdentity, or a function of the caller's. A call a policy limits is decided when
// it arrives, a stream once when it opens. An admitted call gets the draft RateLimit fields as
// header metadata,
//
//	ratelimit-policy: "<policy>";q=<limit>;w=<window seconds>
//	ratelimit: "<policy>";r=<remaining>;t=<seconds>
//
// as httplimit sends them (the same values: see its documentation). A refused call is
// answered codes.ResourceExhausted, never Unavailable (which clients and meshes retry at
// once), with the details
//
//	google.rpc.RetryInfo     retry_delay: the exact wait, in milliseconds (none when no wait helps)
//	google.rpc.QuotaFailure  one violation: subject "policy:<policy>", quota_id "<policy>"
//
// and the same metadata with t the wait. A hidden quota (Policy.HideQuota) sends the
// RetryInfo alone. A call without a key (ErrEmptyKey, or the Key's error) is InvalidArgument,
// as is one whose Cost is negative or above 999999999999999 (a cost the call sent);
// a policy that cannot be valid Internal; a limiter that could not decide (only with
// client.ReturnError) ServerOptions.ErrorCode, Internal by default, or the call is served
// with FailOpen.
//
// Policies have httplimit's ideas: several limits all or nothing (Also; AlsoLimit.SameKey
// keeps one on the Policy's key, where one atomic call decides them), shadow mode and a
// share of keys enforced (Shadow, EnforcePercent), critical methods using the reserve
// (Critical), a concurrency lease held for the whole call, a stream's whole life
// (Concurrency), and counting by outcome (Outcome).
//
// # Metered streams
//
// A policy's Meter (StreamMeter, library 1.3.0's holds, the model of llmlimit) holds the
// call's estimate rather than taking it (each limit with a Cost holds that Cost and is
// metered; every limit when none of the policy's, in shadow or not, has one), then takes each message the handler sends from the
// hold as it goes: StreamMeter.Units(msg) units (the tokens of a chunk), within the hold
// without a server call, beyond it in growing batches, so a stream of 4,000 units with an
// estimate of 500 costs 5 calls. When a batch does not fit, the meter takes what the limits
// have left and cuts the stream: the message it has no room for is not sent, and SendMsg
// returns codes.ResourceExhausted ("grpclimit: budget of policy <limit> ran out: the stream is
// cut", with a refusal's RetryInfo and QuotaFailure, and the ratelimit values in the
// trailers), which the call ends with whatever the handler returns. However the call ends
// (OK, an error, cancelled, a panic), the hold is settled at what it sent (or at an Outcome's
// CostTrailer, unless cut; nothing when its Count does not count the call); a failed settle goes
// to OnError as an *UnsettledError. A unary response is sent whole and settled at its units.
// A limit's charged and held units are never above it.
//
// # Client
//
// NewClient's interceptors pace outgoing calls through a limit shared by every instance
// (ClientOptions.Limit), as httplimit.Transport does for HTTP, and send a unary call refused
// ResourceExhausted with a RetryInfo again after that wait plus jitter, within the call's
// deadline, when its method is idempotent: declared so in its proto (idempotency_level), or
// marked by ClientOptions.Idempotent. A call not safe to repeat is never sent again.
package grpclimit
