// Package decide is the rate-limit decision of a call, whatever carries the call: policy
// checks, the share of keys enforced, several limits all or nothing with shadow ones beside
// them, the quota values of the draft RateLimit fields, and the kinds of failure. httplimit
// (net/http) and grpclimit (gRPC) render its answers; neither copies it.
package decide
