package client

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"strconv"
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

// Limit is a limiter's configuration: FixedWindow, SlidingLog, SlidingWindow, TokenBucket,
// LeakyBucket or Calendar. It is a value: a call may use any limit, and a changed limit applies to the
// state the previous one left (the key does not depend on its numbers). Keep limits that are
// used on every request in variables of type Limit: a struct converted to the interface at
// each call costs an allocation each time.
//
// Every limit has three optional fields. Reserve (library 1.1.0) keeps that many units for
// critical callers: a call whose context is not marked with Critical is admitted only if at
// least Reserve units are left after it, so that a critical caller can still use them. Name
// (any string) tells apart two limits of one algorithm for one principal (per second and per
// hour): it is part of the key (see Limiter.Key), in the principal's cluster slot. Penalty
// (library 1.2.0) blocks the principal for that long once the limit denies it (see
// FixedWindow.Penalty).
type Limit interface {
	// Validate reports, as a *LimitError, why the library would refuse this limit.
	Validate() error
	// Quota is the limit as rate-limit headers describe it.
	Quota() Quota
	// spec is the limit's algorithm and numbers; unexported, because the library has
	// exactly these six limiters.
	spec() spec
}

// Quota is a limit as the IETF RateLimit headers describe it: Limit units per Window.
type Quota struct {
	// Limit is the limit or capacity.
	Limit int64
	// Window is a windowed limit's window; for a bucket, the time Rate per Period takes to
	// refill (or drain) the whole Capacity, rounded up to the millisecond and at most the
	// largest time.Duration, so that Limit per Window is its long-run rate.
	Window time.Duration
	// Leak is, for a LeakyBucket, how long one unit takes to leak out (Period / Rate rounded
	// up); zero for every other limit.
	Leak time.Duration
}

// FixedWindow admits at most Limit units per window of Window, windows aligned to the Unix
// epoch: up to twice Limit can pass around a window boundary.
type FixedWindow struct {
	Limit   int64         // 1 to 999999999999999
	Window  time.Duration // a whole number of milliseconds, 1ms to 10^11ms (about 3 years)
	Reserve int64         // 0 to Limit, default 0 (none): units only critical calls may take (see Limit)
	Name    string        // default "": the key without a name; set, a second limit of this algorithm for one principal (see Limit)
	// Penalty, when set (1ms to 10^11ms, library 1.2.0), blocks the principal for that long
	// once this limit denies it: every call of a limit with a Penalty on that key is then
	// refused until the block ends (Result.Blocked, RetryAfter its remaining time), and a
	// call refused during a block never lengthens it. The limit and the principal's block
	// are decided in one rl_multi call, in the principal's slot. A principal has one block:
	// in AllowAll, the rules of one Key share it when any of them has a Penalty, so that a
	// denial by any of them blocks the Key for the longest Penalty among them, and the block
	// refuses them all. Default 0: no penalty, and the call does not look at blocks (one call
	// as before). Key the limit by a principal
	// the server authenticated: a penalty on a key a client can forge (an address read from
	// a header nobody checked) lets an attacker lock its victim out.
	Penalty time.Duration
}

// Validate implements Limit.
func (l FixedWindow) Validate() error {
	if err := checkInt("FixedWindow.Limit", l.Limit, 1, maxInt); err != nil {
		return err
	}
	if _, err := milliseconds("FixedWindow.Window", l.Window); err != nil {
		return err
	}
	if err := checkInt("FixedWindow.Reserve", l.Reserve, 0, l.Limit); err != nil {
		return err
	}
	return checkPenalty("FixedWindow.Penalty", l.Penalty)
}

// Quota implements Limit.
func (l FixedWindow) Quota() Quota { return Quota{Limit: l.Limit, Window: l.Window} }

func (l FixedWindow) spec() spec {
	return spec{fixedWindowAlg, params{limit: l.Limit, ms: l.Window.Milliseconds(), reserve: l.Reserve, name: l.Name, penalty: l.Penalty.Milliseconds()}}
}

// SlidingLog admits at most Limit units in any span of Window, exactly: the server keeps one
// log entry per admitted unit, so Limit is at most 100000.
type SlidingLog struct {
	Limit   int64         // 1 to 100000
	Window  time.Duration // a whole number of milliseconds, 1ms to 10^11ms
	Reserve int64         // 0 to Limit, default 0 (none): units only critical calls may take (see Limit)
	Name    string        // default "": the key without a name; set, a second limit of this algorithm for one principal (see Limit)
	Penalty time.Duration // 0 (none), or 1ms to 10^11ms: a denial blocks the principal this long (library 1.2.0; see FixedWindow)
}

// Validate implements Limit.
func (l SlidingLog) Validate() error {
	if err := checkInt("SlidingLog.Limit", l.Limit, 1, maxLog); err != nil {
		return err
	}
	if _, err := milliseconds("SlidingLog.Window", l.Window); err != nil {
		return err
	}
	if err := checkInt("SlidingLog.Reserve", l.Reserve, 0, l.Limit); err != nil {
		return err
	}
	return checkPenalty("SlidingLog.Penalty", l.Penalty)
}

// Quota implements Limit.
func (l SlidingLog) Quota() Quota { return Quota{Limit: l.Limit, Window: l.Window} }

func (l SlidingLog) spec() spec {
	return spec{slidingLogAlg, params{limit: l.Limit, ms: l.Window.Milliseconds(), reserve: l.Reserve, name: l.Name, penalty: l.Penalty.Milliseconds()}}
}

// SlidingWindow admits while the previous window's count, weighted by how much of it the
// sliding span still covers, plus the current window's count stays within Limit: the
// sliding window counter, with constant memory.
type SlidingWindow struct {
	Limit   int64         // 1 to 999999999999999, and Limit * Window in ms below 2^53
	Window  time.Duration // a whole number of milliseconds, 1ms to 10^11ms
	Reserve int64         // 0 to Limit, default 0 (none): units only critical calls may take (see Limit)
	Name    string        // default "": the key without a name; set, a second limit of this algorithm for one principal (see Limit)
	Penalty time.Duration // 0 (none), or 1ms to 10^11ms: a denial blocks the principal this long (library 1.2.0; see FixedWindow)
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
	if err := checkInt("SlidingWindow.Reserve", l.Reserve, 0, l.Limit); err != nil {
		return err
	}
	return checkPenalty("SlidingWindow.Penalty", l.Penalty)
}

// Quota implements Limit.
func (l SlidingWindow) Quota() Quota { return Quota{Limit: l.Limit, Window: l.Window} }

func (l SlidingWindow) spec() spec {
	return spec{slidingWindowAlg, params{limit: l.Limit, ms: l.Window.Milliseconds(), reserve: l.Reserve, name: l.Name, penalty: l.Penalty.Milliseconds()}}
}

// TokenBucket allows bursts of up to Capacity units and refills Rate units per Period,
// continuously.
type TokenBucket struct {
	Capacity int64         // 1 to 999999999999999: the largest burst
	Rate     int64         // 1 to 999999999999999 units per Period
	Period   time.Duration // a whole number of milliseconds, 1ms to 10^11ms
	Reserve  int64         // 0 to Capacity, default 0 (none): units only critical calls may take (see Limit)
	Name     string        // default "": the key without a name; set, a second limit of this algorithm for one principal (see Limit)
	Penalty  time.Duration // 0 (none), or 1ms to 10^11ms: a denial blocks the principal this long (library 1.2.0; see FixedWindow)
}

// Validate implements Limit.
func (l TokenBucket) Validate() error {
	if err := validateBucket("TokenBucket.Capacity", "TokenBucket.Rate", "TokenBucket.Period",
		l.Capacity, l.Rate, l.Period); err != nil {
		return err
	}
	if err := checkInt("TokenBucket.Reserve", l.Reserve, 0, l.Capacity); err != nil {
		return err
	}
	return checkPenalty("TokenBucket.Penalty", l.Penalty)
}

// Quota implements Limit.
func (l TokenBucket) Quota() Quota {
	return Quota{Limit: l.Capacity, Window: bucketWindow(l.Capacity, l.Rate, l.Period)}
}

func (l TokenBucket) spec() spec {
	return spec{tokenBucketAlg, params{limit: l.Capacity, rate: l.Rate, ms: l.Period.Milliseconds(), reserve: l.Reserve, name: l.Name, penalty: l.Penalty.Milliseconds()}}
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
	Reserve  int64         // 0 to Capacity, default 0 (none): units only critical calls may take (see Limit)
	Name     string        // default "": the key without a name; set, a second limit of this algorithm for one principal (see Limit)
	Penalty  time.Duration // 0 (none), or 1ms to 10^11ms: a denial blocks the principal this long (library 1.2.0; see FixedWindow)
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
	if err := checkInt("LeakyBucket.Reserve", l.Reserve, 0, l.Capacity); err != nil {
		return err
	}
	return checkPenalty("LeakyBucket.Penalty", l.Penalty)
}

// Quota implements Limit.
func (l LeakyBucket) Quota() Quota {
	q := Quota{Limit: l.Capacity, Window: bucketWindow(l.Capacity, l.Rate, l.Period)}
	if l.Rate > 0 && l.Period > 0 {
		rate := time.Duration(l.Rate)
		q.Leak = (l.Period + rate - 1) / rate
	}
	return q
}

func (l LeakyBucket) spec() spec {
	return spec{leakyBucketAlg, params{limit: l.Capacity, rate: l.Rate, ms: l.Period.Milliseconds(), mode: l.Mode, reserve: l.Reserve, name: l.Name, penalty: l.Penalty.Milliseconds()}}
}

// bucketWindow is ceil(capacity * period / rate) in whole milliseconds, exactly (the product
// needs 128 bits), at most the largest Duration; 0 for a bucket that cannot work.
func bucketWindow(capacity, rate int64, period time.Duration) time.Duration {
	ms := period.Milliseconds()
	if capacity <= 0 || rate <= 0 || ms <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(capacity), uint64(ms))
	if hi >= uint64(rate) {
		return math.MaxInt64
	}
	q, rem := bits.Div64(hi, lo, uint64(rate))
	if rem != 0 {
		q++
	}
	if q > uint64(math.MaxInt64/int64(time.Millisecond)) {
		return math.MaxInt64
	}
	return time.Duration(q) * time.Millisecond
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

// checkPenalty refuses a Penalty the library would refuse; 0 is none.
func checkPenalty(field string, d time.Duration) error {
	if d == 0 {
		return nil
	}
	_, err := milliseconds(field, d)
	return err
}

// checkCost refuses a cost the library would refuse. A cost above the limit is not an error:
// the library denies it with Result.RetryAfter = Never.
func checkCost(n int64) error {
	return checkInt("cost", n, 0, maxInt)
}

func appendInt(buf []byte, v int64) []byte { return strconv.AppendInt(buf, v, 10) }

type criticalKey struct{}

// Critical returns ctx marked critical: calls made with it may use the whole limit, the
// Reserve of every limit included (Allow, Peek, Acquire, AllowAll; Reserve needs library
// 1.1.0). A call that is not critical leaves each limit's Reserve to critical ones. The
// middleware (httplimit) marks a route's requests critical this way.
func Critical(ctx context.Context) context.Context {
	return context.WithValue(ctx, criticalKey{}, true)
}

// isCritical reports whether ctx was marked by Critical.
func isCritical(ctx context.Context) bool {
	v, _ := ctx.Value(criticalKey{}).(bool)
	return v
}
