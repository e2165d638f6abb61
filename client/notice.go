package client

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
)

// notice.go: what a Limiter says in its log. A service must hear, without a MeterProvider,
// that its limits are no longer decided by the server (a dead node, a node without the
// library): a local fallback admits a share of each limit per process, and a service that
// falls back silently runs for hours at Instances times its limits before anyone looks.
//
// A notice is one structured line (log/slog) per kind and node, at most once per noticeEvery
// of the Limiter's clock; the lines a kind and node did not say meanwhile are counted in the
// next one's "suppressed" attribute. Nothing here runs on a decision's hot path but one atomic
// load (breaker.degraded) when the server answers.

// noticeKind is what a notice says.
type noticeKind uint8

const (
	// noticeFallback: the node could not decide a call; the Fallback decides its calls.
	noticeFallback noticeKind = iota
	// noticeRecovered: the node decides again after noticeFallback.
	noticeRecovered
	// noticeBreakerOpen and noticeBreakerClosed: the node's circuit breaker moved.
	noticeBreakerOpen
	noticeBreakerClosed
	// noticeNotLoaded: the node answered that it has no ratelimit library.
	noticeNotLoaded
	// noticeRefundLost: units a decision took could not be given back (see AllowAll).
	noticeRefundLost
	// noticeLibraryLoaded: the Limiter loaded its embedded release on a node that lacked one.
	noticeLibraryLoaded
	nNoticeKinds
)

var noticeNames = [nNoticeKinds]string{"fallback", "recovered", "breaker_open", "breaker_closed",
	"library_missing", "refund_lost", "library_loaded"}

// noticeEvery is the shortest time between two lines of one kind and node, in nanoseconds:
// a flapping node says so a few times a minute, not on every call.
const noticeEvery = int64(10e9)

// notices is a Limiter's rate-limited log.
type notices struct {
	log   *slog.Logger // nil: slog.Default() when a line is written
	clock func() int64

	mu   sync.Mutex
	last map[noticeID]*noticeState // bounded by the breakers (nodes) times the kinds
}

type noticeID struct {
	kind noticeKind
	node *breaker // the node's breaker: its name is only looked up for a line written
}

type noticeState struct {
	at         int64 // when a line was last written
	suppressed int64 // lines not written since
}

func newNotices(log *slog.Logger, clock func() int64) *notices {
	return &notices{log: log, clock: clock, last: map[noticeID]*noticeState{}}
}

// say writes msg at level with attrs for kind on br's node (named by node), unless it said
// kind on that node less than noticeEvery ago: then it counts it for the next line.
func (n *notices) say(ctx context.Context, level slog.Level, kind noticeKind, br *breaker, node func(*breaker) string, msg string, attrs ...slog.Attr) {
	log := n.log
	if log == nil {
		log = slog.Default()
	}
	if !log.Enabled(ctx, level) {
		return
	}
	now := n.clock()
	id := noticeID{kind, br}
	n.mu.Lock()
	s := n.last[id]
	switch {
	case s == nil:
		s = &noticeState{}
		n.last[id] = s
	case now-s.at < noticeEvery:
		s.suppressed++
		n.mu.Unlock()
		return
	}
	suppressed := s.suppressed
	s.at, s.suppressed = now, 0
	n.mu.Unlock()

	all := make([]slog.Attr, 0, len(attrs)+3)
	all = append(all, slog.String("event", noticeNames[kind]), slog.String("node", node(br)))
	all = append(all, attrs...)
	if suppressed > 0 {
		all = append(all, slog.Int64("suppressed", suppressed))
	}
	log.LogAttrs(ctx, level, "rlfn: "+msg, all...)
}

// nodeOf names br's node for a notice: its address, or the server's for a standalone one.
func (l *Limiter) nodeOf(br *breaker) string {
	if br.addr != "" {
		return br.addr
	}
	if !l.breakers.cluster {
		for addr := range l.vk.Nodes() {
			return addr
		}
	}
	return "cluster"
}

// limitName is how a notice names a call's limit: its algorithm and its name (its Rule.Name,
// WithLimitName's, or its Name), as the rlfn.limit.name of its metrics.
func limitName(ctx context.Context, c *call) string {
	name := nameOf(ctx, &c.spec)
	if name == "" {
		return c.alg.name
	}
	return c.alg.name + ":" + name
}

// fellBack notes that the server could not decide c on key's node (kind), and that the
// Fallback decides it: the first such call since the node last decided says so.
func (l *Limiter) fellBack(ctx context.Context, key string, c *call, kind errKind) {
	br := l.breakerOf(key)
	if kind == kindNotLoaded {
		l.notes.say(ctx, slog.LevelError, noticeNotLoaded, br, l.nodeOf,
			"the node has no ratelimit library: its limits are decided by the fallback until `rlfn deploy` loads it",
			slog.String("limit", limitName(ctx, c)), slog.String("fallback", l.fallback.String()))
		// A node without the library is often one the slot table does not know yet (it
		// took a dead primary's slots): read the table again, so that the next line names it
		// and LoadLibrary loads it, not the node it replaced.
		l.refreshSlots(false)
		l.loadLibrary(ctx, br)
	}
	if br.degraded.Load() || !br.degraded.CompareAndSwap(false, true) {
		br.fallbacks.Add(1)
		return
	}
	br.fallbacks.Store(1)
	msg := "the server cannot decide: limits go to the fallback"
	if l.fallback == ReturnError {
		msg = "the server cannot decide: calls return its error"
	}
	l.notes.say(ctx, slog.LevelWarn, noticeFallback, br, l.nodeOf, msg,
		slog.String("limit", limitName(ctx, c)), slog.String("cause", kindNames[kind]), slog.String("fallback", l.fallback.String()))
}

// answered notes that br's node decided a call: if the Fallback decided its calls until now,
// that is over. The hot path pays one atomic load.
func (l *Limiter) answered(ctx context.Context, br *breaker) {
	if !br.degraded.Load() || !br.degraded.CompareAndSwap(true, false) {
		return
	}
	l.notes.say(ctx, slog.LevelInfo, noticeRecovered, br, l.nodeOf, "the server decides again",
		slog.Int64("fallback_decisions", br.fallbacks.Swap(0)))
}

// moved notes br's breaker entering s (none when s < 0).
func (l *Limiter) moved(ctx context.Context, br *breaker, s breakerState, kind errKind) {
	switch s {
	case open:
		l.notes.say(ctx, slog.LevelWarn, noticeBreakerOpen, br, l.nodeOf, "circuit breaker open: no call goes to the node until its cooldown ends",
			slog.String("cause", kindNames[kind]), slog.Duration("cooldown", l.breakers.cooldown))
	case closed:
		l.notes.say(ctx, slog.LevelInfo, noticeBreakerClosed, br, l.nodeOf, "circuit breaker closed: the node answers")
	}
}

// degradedState is what a breaker keeps for notices: whether its node's calls are decided by
// the Fallback, and how many since. Embedded in breaker.
type degradedState struct {
	addr      string      // the node's host:port, "" for the standalone or unmapped breaker
	degraded  atomic.Bool // the Fallback decided its node's last failed call, none answered since
	fallbacks atomic.Int64
}
