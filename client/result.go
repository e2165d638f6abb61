package client

import (
	"fmt"
	"math"
	"time"
)

// Never is Result.RetryAfter when the cost is more than the limit, so no wait would admit it.
const Never time.Duration = math.MaxInt64

// retryAfterMs is RetryAfter as the library replies it (retry_after_ms), for traces: whole
// milliseconds, and -1 for Never.
func retryAfterMs(d time.Duration) int64 {
	if d == Never {
		return -1
	}
	return d.Milliseconds()
}

// Result is one decision, the library's six-integer reply in Go units.
type Result struct {
	// Allowed reports whether the cost was admitted (for Peek: would be admitted now). A denied
	// call consumed nothing.
	Allowed bool
	// Limit is the limit or capacity the decision was made against.
	Limit int64
	// Remaining is how many units are still admissible right after this call; never negative.
	Remaining int64
	// RetryAfter is zero when Allowed. Otherwise it is the smallest wait after which the same
	// cost would be admitted, rounded up to the millisecond, or Never when the cost exceeds
	// Limit.
	RetryAfter time.Duration
	// ResetAfter is the wait until the limiter is back to its initial state (an empty window, a
	// full token bucket, an empty leaky bucket); the server forgets the key then.
	ResetAfter time.Duration
	// Delay is how long to hold an admitted request before forwarding it: a leaky bucket in
	// Shape mode spaces requests this way. Zero for every other limiter.
	Delay time.Duration
	// Source is where the decision came from: the server, or this process without it.
	Source Source
	// Rule is, for AllowAll and PeekAll, the index in their rules of the limit this Result
	// is the reply of, the one that decided: when denied, the denying limit with the longest
	// RetryAfter; when admitted, the one with the fewest Remaining (ties: the first). Zero
	// for every other call.
	Rule int
	// Blocked reports a denial while the principal is blocked (library 1.2.0: a limit's
	// Penalty, or Limiter.Block): by its block, or by a limit that denied and so blocked it
	// in the same call. RetryAfter is the longer wait of the two. When the block decided
	// (its wait is the longer), Limit and Remaining are the block's, 0; a Peek reports a
	// block only then. ResetAfter is the longest of the decision's, as for AllowAll. For Limiter.Block and PeekBlock,
	// whether the key is blocked after the call.
	Blocked bool
	// Override is the operators' override that replaced the code's limit in this decision
	// (Options.Overrides; rlfn override set), nil when the code's limit decided. Limit,
	// Remaining and the waits are the override's limit's: a response's rate-limit headers
	// describe Override.Limit (its Quota), not the code's. For AllowAll, the deciding rule's.
	Override *Override
}

// Source is where a decision came from.
type Source uint8

const (
	// FromServer is a decision the server made on this call.
	FromServer Source = iota
	// FromFallback is a decision made in this process without the server, by the Limiter's
	// Fallback (FailOpen, FailClosed or LocalFallback) when the server could not decide.
	FromFallback
	// FromLease is an admission served from a batch of units this process took from the
	// server earlier (Options.BudgetBatch): the server admitted the unit when it took the batch.
	// Remaining is then the server's Remaining after that batch plus the units still parked
	// here, and ResetAfter the batch's ResetAfter less the time since it was sent: both as of
	// the batch, blind to other processes' calls since.
	FromLease
	// FromDenialCache is a denial answered by the denial cache (Options.DenialCache) without the
	// server: RetryAfter counts down from the server's denial, Remaining and Limit are its.
	FromDenialCache
)

func (s Source) String() string {
	switch s {
	case FromServer:
		return "server"
	case FromFallback:
		return "fallback"
	case FromLease:
		return "lease"
	case FromDenialCache:
		return "denial_cache"
	}
	return fmt.Sprintf("Source(%d)", uint8(s))
}
