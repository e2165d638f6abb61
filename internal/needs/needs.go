// Package needs names the ratelimit library's releases that the client's calls need, and
// decides which one a set of limits needs: one rule for the client's CheckRules and the HTTP
// middleware's Check.
package needs

// The releases of the library that brought calls.
const (
	V10 = "1.0.0" // the first: every limiter and its peek
	V11 = "1.1.0" // reserve, refunds, concurrency leases and rl_multi
	V12 = "1.2.0" // calendar windows and blocks
	V13 = "1.3.0" // holds (rl_hold, rl_hold_settle, rl_multi's hold group) and rl_multi's replies
)

// Release is the release that deciding n limits at once needs, reserved telling whether one of
// them has a Reserve: V11 when there are several (one key's limits are one rl_multi call;
// several keys' need refunds) or a reserve, else V10. (Acquire, Refund and a Concurrency limit
// need V11 too.)
func Release(n int, reserved bool) string {
	if n > 1 || reserved {
		return V11
	}
	return V10
}
