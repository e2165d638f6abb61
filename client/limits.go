package client

import (
	"fmt"
	"time"
)

// Bounds of the library (functions/ratelimit.lua): an argument outside them is refused with
// RLERR, so the client refuses it first, without a round trip.
const (
	maxInt        = 999999999999999 // MAX_INT: the largest limit, capacity, rate or cost
	maxDurationMs = 100000000000    // MAX_DURATION_MS: the longest window or period
	maxLog        = 100000          // MAX_LOG: a sliding log keeps one entry per unit
	maxSafe       = 1 << 53         // MAX_SAFE: the library's arithmetic is exact below it
)

// Limit is a limiter's configuration: FixedWindow, SlidingLog, SlidingWindow, TokenBucket or
// LeakyBucket. It is a value: a call may use any limit, and a changed limit applies to the
// state the previous one left (the key does not depend on it). Keep limits that are used on
// every request in variables of type Limit: a struct converted to the interface at each call
// costs an allocation each time.
type Limit interface {
	// Validate reports, as a *LimitError, why the library would refuse this limit.
	Validate() error
	// args is the library function and its arguments for a call of cost; unexported, because
	// the library has exactly these five limiters.
	args(cost int64) call
}

// function is one limiter of the library.
type function struct {
	name      string // the function FCALL runs
	peek      string // its no-writes twin, for FCALL_RO
	algorithm string // the suffix of its keys
	id        int    // its index in functions, for per-algorithm tables (metrics)
}

var (
	fixedWindowFn   = &function{"rl_fixed_window", "rl_fixed_window_peek", "fixed_window", 0}
	slidingLogFn    = &function{"rl_sliding_log", "rl_sliding_log_peek", "sliding_log", 1}
	slidingWindowFn = &function{"rl_sliding_window", "rl_sliding_window_peek", "sliding_window", 2}
	tokenBucketFn   = &function{"rl_token_bucket", "rl_token_bucket_peek", "token_bucket", 3}
	leakyBucketFn   = &function{"rl_leaky_bucket", "rl_leaky_bucket_peek", "leaky_bucket", 4}

	functions = [nAlgorithms]*function{fixedWindowFn, slidingLogFn, slidingWindowFn, tokenBucketFn, leakyBucketFn}
)

const nAlgorithms = 5

// call is one call's ARGV: integers (the cost last), then, for a leaky bucket, the mode.
type call struct {
	fn   *function
	nums [4]int64
	n    int // how many of nums are used
	mode string
}

// FixedWindow admits at most Limit units per window of Window, windows aligned to the Unix
// epoch: up to twice Limit can pass around a window boundary.
type FixedWindow struct {
	Limit  int64         // 1 to 999999999999999
	Window time.Duration // a whole number of milliseconds, 1ms to 10^11ms (about 3 years)
}

// Validate implements Limit.
func (l FixedWindow) Validate() error {
	if err := checkInt("FixedWindow.Limit", l.Limit, 1, maxInt); err != nil {
		return err
	}
	_, err := milliseconds("FixedWindow.Window", l.Window)
	return err
}

func (l FixedWindow) args(cost int64) call {
	return call{fn: fixedWindowFn, nums: [4]int64{l.Limit, l.Window.Milliseconds(), cost}, n: 3}
}

// SlidingLog admits at most Limit units in any span of Window, exactly: the server keeps one
// log entry per admitted unit, so Limit is at most 100000.
type SlidingLog struct {
	Limit  int64         // 1 to 100000
	Window time.Duration // a whole number of milliseconds, 1ms to 10^11ms
}

// Validate implements Limit.
func (l SlidingLog) Validate() error {
	if err := checkInt("SlidingLog.Limit", l.Limit, 1, maxLog); err != nil {
		return err
	}
	_, err := milliseconds("SlidingLog.Window", l.Window)
	return err
}

func (l SlidingLog) args(cost int64) call {
	return call{fn: slidingLogFn, nums: [4]int64{l.Limit, l.Window.Milliseconds(), cost}, n: 3}
}

// SlidingWindow admits while the previous window's count, weighted by how much of it the
// sliding span still covers, plus the current window's count stays within Limit: the
// sliding window counter, with constant memory.
type SlidingWindow struct {
	Limit  int64         // 1 to 999999999999999, and Limit * Window in ms below 2^53
	Window time.Duration // a whole number of milliseconds, 1ms to 10^11ms
}

// Validate implements Limit.
func (l SlidingWindow) Validate() error {
	if err := checkInt("SlidingWindow.Limit", l.Limit, 1, maxInt); err != nil {
		return err
	}
	ms, err := milliseconds("SlidingWindow.Window", l.Window)
	if err != nil {
		return err
	}
	// In float64, as the library computes it, so that the client refuses exactly what the
	// server refuses.
	if float64(l.Limit)*float64(ms) >= maxSafe {
		return &LimitError{Field: "SlidingWindow.Limit", Reason: fmt.Sprintf(
			"* Window in milliseconds must be below 2^53, got %d * %d", l.Limit, ms)}
	}
	return nil
}

func (l SlidingWindow) args(cost int64) call {
	return call{fn: slidingWindowFn, nums: [4]int64{l.Limit, l.Window.Milliseconds(), cost}, n: 3}
}

// TokenBucket allows bursts of up to Capacity units and refills Rate units per Period,
// continuously.
type TokenBucket struct {
	Capacity int64         // 1 to 999999999999999: the largest burst
	Rate     int64         // 1 to 999999999999999 units per Period
	Period   time.Duration // a whole number of milliseconds, 1ms to 10^11ms
}

// Validate implements Limit.
func (l TokenBucket) Validate() error {
	return validateBucket("TokenBucket.Capacity", "TokenBucket.Rate", "TokenBucket.Period",
		l.Capacity, l.Rate, l.Period)
}

func (l TokenBucket) args(cost int64) call {
	return call{fn: tokenBucketFn, nums: [4]int64{l.Capacity, l.Rate, l.Period.Milliseconds(), cost}, n: 4}
}

// Mode is what a leaky bucket does with a request.
type Mode uint8

const (
	// Police admits a request now if it fits in the bucket and rejects it otherwise. The
	// default.
	Police Mode = iota
	// Shape admits a request that fits with a Result.Delay (the time for the units ahead of
	// it to leak out), so that requests leave evenly spaced; it rejects only when the bucket,
	// the queue, is full.
	Shape
)

func (m Mode) String() string {
	switch m {
	case Police:
		return "police"
	case Shape:
		return "shape"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// LeakyBucket is a bucket (a queue) of Capacity units that leaks Rate units per Period.
//
// Both modes keep the same state under the same key: the mode decides what to do with a
// request, not what is counted, so a principal's level carries over when the mode changes.
type LeakyBucket struct {
	Capacity int64         // 1 to 999999999999999
	Rate     int64         // 1 to 999999999999999 units per Period
	Period   time.Duration // a whole number of milliseconds, 1ms to 10^11ms
	Mode     Mode          // Police (the zero value) or Shape
}

// Validate implements Limit.
func (l LeakyBucket) Validate() error {
	if err := validateBucket("LeakyBucket.Capacity", "LeakyBucket.Rate", "LeakyBucket.Period",
		l.Capacity, l.Rate, l.Period); err != nil {
		return err
	}
	if l.Mode != Police && l.Mode != Shape {
		return &LimitError{Field: "LeakyBucket.Mode", Reason: "must be Police or Shape, got " + l.Mode.String()}
	}
	return nil
}

func (l LeakyBucket) args(cost int64) call {
	return call{fn: leakyBucketFn, nums: [4]int64{l.Capacity, l.Rate, l.Period.Milliseconds(), cost}, n: 4, mode: l.Mode.String()}
}

// validateBucket validates a token or leaky bucket; the field names are constants, so that a
// valid limit costs no allocation.
func validateBucket(capacityField, rateField, periodField string, capacity, rate int64, period time.Duration) error {
	if err := checkInt(capacityField, capacity, 1, maxInt); err != nil {
		return err
	}
	if err := checkInt(rateField, rate, 1, maxInt); err != nil {
		return err
	}
	ms, err := milliseconds(periodField, period)
	if err != nil {
		return err
	}
	// The library counts a unit as p = period_us / gcd(rate, period_us) ticks, and a full
	// bucket's ticks must stay below 2^53 (a product that reaches 2^53 may be rounded); compared in float64,
	// as the library does.
	periodUs := ms * 1000
	p := periodUs / gcd(rate, periodUs)
	if float64(capacity)*float64(p) >= maxSafe {
		return &LimitError{Field: capacityField, Reason: fmt.Sprintf(
			"* Period in microseconds / gcd(Rate, Period in microseconds) must be below 2^53, got %d * %d / %d",
			capacity, periodUs, periodUs/p)}
	}
	return nil
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func checkInt(field string, v, lo, hi int64) error {
	if v < lo || v > hi {
		return &LimitError{Field: field, Reason: fmt.Sprintf("must be from %d to %d, got %d", lo, hi, v)}
	}
	return nil
}

// milliseconds returns d in whole milliseconds, the library's unit. A fraction of a
// millisecond is refused rather than rounded: the server would run another limit than the one
// written.
func milliseconds(field string, d time.Duration) (int64, error) {
	switch {
	case d < time.Millisecond:
		return 0, &LimitError{Field: field, Reason: "must be at least 1ms, got " + d.String()}
	case d%time.Millisecond != 0:
		return 0, &LimitError{Field: field, Reason: "must be a whole number of milliseconds, got " + d.String()}
	case d.Milliseconds() > maxDurationMs:
		return 0, &LimitError{Field: field, Reason: fmt.Sprintf("must be at most %dms (about 3 years), got %s", maxDurationMs, d)}
	}
	return d.Milliseconds(), nil
}

// checkCost refuses a cost the library would refuse. A cost above the limit is not an error:
// the library denies it with Result.RetryAfter = Never.
func checkCost(n int64) error {
	return checkInt("cost", n, 0, maxInt)
}
