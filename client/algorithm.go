package client

import (
	"time"

	"github.com/rlfn/rlfn/internal/needs"
)

// algorithm is one of the library's algorithms: everything the client knows of it. Each Limit
// type names its own (Limit.spec), and newAlgorithm takes every piece, so an algorithm that
// lacks one fails to compile rather than falling through to another's code.
type algorithm struct {
	id     int    // its index in algorithms, for per-algorithm tables (metrics)
	name   string // the suffix of its keys and its name in rl_multi groups
	fn     string // rl_<name>: the limiter, run with FCALL
	peek   string // rl_<name>_peek: its no-writes twin, for FCALL_RO
	refund string // rl_<name>_refund (for concurrency: rl_concurrency_release)
	argv   argv   // how its parameters are laid out in ARGV
	local  localAlgorithm
	since  string // the library release that has it (internal/needs)
}

// argv is the layout of an algorithm's ARGV, before the optional trailing reserve.
type argv uint8

const (
	windowArgv      argv = iota // limit window_ms cost
	bucketArgv                  // capacity rate period_ms cost
	leakyArgv                   // capacity rate period_ms cost mode
	concurrencyArgv             // limit lease_ms id
	calendarArgv                // limit b1 b2 b3 b4 cost
	blockArgv                   // [duration_ms]: rl_block's alone
)

func newAlgorithm(id int, name string, refund string, a argv, local localAlgorithm, since string) *algorithm {
	return &algorithm{id: id, name: name, fn: "rl_" + name, peek: "rl_" + name + "_peek", refund: refund, argv: a, local: local, since: since}
}

var (
	fixedWindowAlg   = newAlgorithm(0, "fixed_window", "rl_fixed_window_refund", windowArgv, localFixedWindow{}, needs.V10)
	slidingLogAlg    = newAlgorithm(1, "sliding_log", "rl_sliding_log_refund", windowArgv, localSlidingLog{}, needs.V10)
	slidingWindowAlg = newAlgorithm(2, "sliding_window", "rl_sliding_window_refund", windowArgv, localSlidingWindow{}, needs.V10)
	tokenBucketAlg   = newAlgorithm(3, "token_bucket", "rl_token_bucket_refund", bucketArgv, localBucket{}, needs.V10)
	leakyBucketAlg   = newAlgorithm(4, "leaky_bucket", "rl_leaky_bucket_refund", leakyArgv, localBucket{leaky: true}, needs.V10)
	// concurrency is not one of rl_multi's algorithms, but its calls go the same way.
	concurrencyAlg = newAlgorithm(5, "concurrency", "rl_concurrency_release", concurrencyArgv, localConcurrency{}, needs.V11)
	calendarAlg    = newAlgorithm(6, "calendar", "rl_calendar_refund", calendarArgv, localCalendar{}, needs.V12)
	// block is a principal's block (Limiter.Block, a limit's Penalty): not a limit, so no
	// local equivalent; its calls go the same way, rl_block as the "limiter", rl_unblock as
	// the "refund".
	blockAlg = newAlgorithm(7, "block", "rl_unblock", blockArgv, nil, needs.V12)

	algorithms = [...]*algorithm{fixedWindowAlg, slidingLogAlg, slidingWindowAlg, tokenBucketAlg, leakyBucketAlg, concurrencyAlg, calendarAlg, blockAlg}
)

// Metric subjects: every algorithm, then rl_multi.
const (
	multiSubject = len(algorithms)
	nSubjects    = multiSubject + 1
)

// params is a limit's numbers, by name: what ARGV is made of and what the local equivalent
// reads.
type params struct {
	limit   int64  // a window's limit, a bucket's capacity, concurrency's slots
	rate    int64  // buckets: units per period
	ms      int64  // window_ms, period_ms, or lease_ms
	mode    Mode   // leaky bucket
	reserve int64  // units kept for critical callers
	name    string // the optional suffix of the key (Limit's Name)
	label   string // the limit's name in metrics, spans and log lines when set (Rule.Name, a middleware's policy), not part of the key
	id      string // concurrency: the lease holder
	penalty int64  // ms a denial blocks the principal for (a limit's Penalty); 0: none
	// calendar: the period and anchor, and the call's boundaries (call.bound)
	period Period
	anchor time.Time
	bounds [4]int64
}

// spec is a limit as the client sends it: its algorithm and its numbers.
type spec struct {
	alg *algorithm
	params
}

// call is one call: a spec, its cost, and the reserve it is judged with (0 for a critical
// call, see Critical).
type call struct {
	spec
	cost    int64
	reserve int64
	// refundable marks a call that AllowAll may have to refund (its rules span several
	// keys): it relies on library 1.1.0, so it sends its reserve even when 0, which a 1.0
	// library refuses before writing anything, rather than taking units it cannot give back.
	refundable bool
	// extra is what a leased budget's batch takes beyond cost (budget.go): the server is asked
	// for cost + extra, while a Fallback that decides instead judges cost alone.
	extra int64
	// override is the operators' override that replaced the code's limit (Options.Overrides),
	// nil for none: Result.Override.
	override *Override
}

// appendArgs appends c's ARGV (without reserve) to buf, recording where each argument ends.
func (c *call) appendArgs(buf []byte, ends []int) ([]byte, []int) {
	p := &c.params
	num := func(v int64) {
		buf = appendInt(buf, v)
		ends = append(ends, len(buf))
	}
	switch c.alg.argv {
	case windowArgv:
		num(p.limit)
		num(p.ms)
		num(c.cost + c.extra)
	case bucketArgv, leakyArgv:
		num(p.limit)
		num(p.rate)
		num(p.ms)
		num(c.cost + c.extra)
		if c.alg.argv == leakyArgv {
			buf = append(buf, p.mode.String()...)
			ends = append(ends, len(buf))
		}
	case concurrencyArgv:
		num(p.limit)
		num(p.ms)
		buf = append(buf, p.id...)
		ends = append(ends, len(buf))
	case calendarArgv:
		num(p.limit)
		for _, b := range p.bounds {
			num(b)
		}
		num(c.cost + c.extra)
	case blockArgv:
		if p.ms > 0 {
			num(p.ms)
		}
	}
	return buf, ends
}
