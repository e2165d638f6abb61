package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/rlfn/rlfn/internal/keys"
)

// refund.go: the refunds a decision across keys owes (AllowAll: one Key denied or failed, the
// others' units are given back). They are owed whatever the caller does next, so they are the
// Limiter's, not the caller's: a refund the server could not make now (its breaker is open,
// the cluster is down, the node answered an error) is tried again in the background until its
// node answers, within bounds of count, time and memory; what could not be given back is
// counted (rlfn.client.refunds.lost) and said in the log (event refund_lost), never returned
// to the caller, whose decision stands.
//
// A refund is not idempotent: one that was sent and not answered (a timeout, a connection lost
// after the write) may have been made, or may still be made when a paused server resumes, so
// it is never sent again: it is counted as lost, reason "unknown". Only refunds the server
// surely did not make (never sent, or answered with an error) are tried again.

const (
	// maxOwed bounds the refunds a Limiter holds to try again: with keys of at most
	// Options.MaxKeyLen (512 bytes), at most about 7 MB.
	maxOwed = 10_000
	// maxOwedFor bounds how long a refund is tried again. It is also never tried after its
	// limiter would have given the units back by itself (its ResetAfter when it admitted):
	// then it is owed nothing, and a fixed window's refund would take units off the next
	// window instead.
	maxOwedFor = time.Minute
	// owedEvery is how often the owed refunds are tried again. A node whose breaker is open is
	// not asked until its cooldown ends: then one refund is its probe.
	owedEvery = 100 * time.Millisecond
)

// metricRefundsLost names the counter of the units refunds could not give back.
const metricRefundsLost = "rlfn.client.refunds.lost"

// lostReason is why a refund was given up.
type lostReason uint8

const (
	lostUnknown  lostReason = iota // sent, not answered: the server may have made it
	lostExpired                    // its node did not answer before the limiter refilled by itself, maxOwedFor, or Close
	lostOverflow                   // maxOwed refunds were owed already
	lostRefused                    // the server refused it (RLERR, an older library): so it would again
	nLostReasons
)

var lostNames = [nLostReasons]string{"unknown", "expired", "overflow", "refused"}

// owedRefund is a refund to try again.
type owedRefund struct {
	key   string
	c     call
	name  string // its limit as the log names it: the call's context's (WithLimitName) is gone by then
	until int64  // the Limiter's clock: given up after
}

// owedRefunds are a Limiter's refunds to try again, and the counter of those lost.
type owedRefunds struct {
	mu      sync.Mutex
	queue   []owedRefund
	held    int  // refunds in the queue or being tried
	running bool // the goroutine that tries them runs: it stops when none is left

	lost     metric.Int64Counter // nil without a MeterProvider
	lostOpts [nLostReasons][]metric.AddOption
}

func newOwedRefunds(mp metric.MeterProvider) (*owedRefunds, error) {
	o := &owedRefunds{}
	if mp == nil {
		return o, nil
	}
	var err error
	o.lost, err = mp.Meter("github.com/rlfn/rlfn/client").Int64Counter(metricRefundsLost, metric.WithUnit("{unit}"),
		metric.WithDescription("Units a decision across keys took and its refunds could not give back."))
	if err != nil {
		return nil, &OptionError{Field: "MeterProvider", Reason: fmt.Sprintf("creating instruments: %v", err)}
	}
	for r := range nLostReasons {
		o.lostOpts[r] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("rlfn.reason", lostNames[r])))}
	}
	return o, nil
}

// refundAtServer sends c's refund on key to the server, through key's breaker, and never to the
// Fallback: the units are the server's to give back. It returns the failure's kind with its
// error.
func (l *Limiter) refundAtServer(ctx context.Context, key string, c call) (Result, errKind, error) {
	var kb [192]byte
	b := built{key: keys.Append(kb[:0], l.prefix, key, c.alg.name, c.name), now: l.clock()}
	a, kind, err := l.begin(ctx, key, wants(opRefund, c), b.now)
	if err != nil {
		l.tel.countError(ctx, c.alg.id, opRefund, kind)
		return Result{}, kind, err
	}
	res, err := l.server(ctx, opRefund, c, b)
	if err != nil {
		b.now = l.clock()
	}
	kind = l.settle(ctx, a, c.alg.id, opRefund, res, err, b.now)
	if err != nil {
		l.tel.countError(ctx, c.alg.id, opRefund, kind)
		return Result{}, kind, err
	}
	if l.near != nil {
		l.dropDenials(b.key)
	}
	return res, kindNone, nil
}

// refundFailure says what becomes of a refund that failed with err (of kind): tried again
// (the server surely did not make it), or lost for a reason.
func refundFailure(kind errKind, err error) (lostReason, bool) {
	switch kind {
	case kindCircuitOpen, kindClusterDown, kindServer, kindNotLoaded:
		return 0, true
	case kindUnreachable:
		var oe *net.OpError
		if errors.As(err, &oe) && oe.Op == "dial" {
			return 0, true // no connection: nothing was sent
		}
		return lostUnknown, false
	case kindLibrary, kindVersion, kindReply:
		return lostRefused, false
	}
	return lostUnknown, false
}

// refundsLost tallies the refunds of one batch that were given up.
type refundsLost struct {
	refunds int
	units   [nLostReasons]int64
	first   error    // the first one's error, for the log
	br      *breaker // the first one's node
	limit   string   // the first one's limit
}

// add tallies c's refund on key, its limit named name (limitName under the call's context).
func (r *refundsLost) add(l *Limiter, key string, c *call, name string, reason lostReason, err error) {
	if r.refunds == 0 {
		r.first, r.br, r.limit = err, l.breakerOf(key), name
	}
	r.refunds++
	r.units[reason] += c.cost
}

// report counts the lost units and says so in the log (once per node and notice period): of
// is how many refunds the batch held.
func (l *Limiter) reportLost(ctx context.Context, r *refundsLost, of int) {
	if r.refunds == 0 {
		return
	}
	var units int64
	reasons := ""
	for reason, n := range r.units {
		if n == 0 {
			continue
		}
		units += n
		if l.owed.lost != nil {
			l.owed.lost.Add(ctx, n, l.owed.lostOpts[reason]...)
		}
		if reasons != "" {
			reasons += ","
		}
		reasons += lostNames[reason]
	}
	cause := "gave up"
	if r.first != nil {
		cause = r.first.Error()
	}
	l.notes.say(ctx, slog.LevelWarn, noticeRefundLost, r.br, l.nodeOf,
		fmt.Sprintf("%d of %d refunds lost: %s; their units stay taken until the limiters give them back by themselves", r.refunds, of, cause),
		slog.Int("refunds", r.refunds), slog.Int64("units", units), slog.String("reason", reasons), slog.String("limit", r.limit))
}

// owe holds refunds to try again, as many as fit: the others are lost (overflow).
func (l *Limiter) owe(refunds []owedRefund, lost *refundsLost) {
	o := l.owed
	o.mu.Lock()
	room := max(0, maxOwed-o.held)
	kept := refunds[:min(room, len(refunds))]
	o.queue = append(o.queue, kept...)
	o.held += len(kept)
	start := !o.running && len(kept) > 0
	if start {
		o.running = true
	}
	o.mu.Unlock()
	for i := len(kept); i < len(refunds); i++ {
		lost.add(l, refunds[i].key, &refunds[i].c, refunds[i].name, lostOverflow, errors.New("too many refunds owed"))
	}
	if start {
		go l.retryOwed()
	}
}

// retryOwed tries the owed refunds again every owedEvery, until none is left.
func (l *Limiter) retryOwed() {
	t := time.NewTicker(owedEvery)
	defer t.Stop()
	ctx := context.Background()
	for range t.C {
		o := l.owed
		o.mu.Lock()
		batch := o.queue
		o.queue = nil
		o.mu.Unlock()
		now := l.clock()
		var lost refundsLost
		var try, again []owedRefund
		for _, r := range batch {
			switch br := l.breakerOf(r.key); {
			case now > r.until:
				lost.add(l, r.key, &r.c, r.name, lostExpired, nil)
			case !mayPass(br, now):
				again = append(again, r) // its node's breaker is open: not asked until its probe
			default:
				try = append(try, r)
			}
		}
		var mu sync.Mutex
		inParallel(len(try), func(i int) {
			r := try[i]
			_, kind, err := l.refundAtServer(ctx, r.key, r.c)
			if err == nil {
				return
			}
			reason, retry := refundFailure(kind, err)
			mu.Lock()
			defer mu.Unlock()
			if retry {
				again = append(again, r)
			} else {
				lost.add(l, r.key, &r.c, r.name, reason, err)
			}
		})
		l.reportLost(ctx, &lost, len(batch))
		o.mu.Lock()
		o.queue = append(o.queue, again...)
		o.held -= len(batch) - len(again)
		if len(o.queue) == 0 {
			o.running = false
			o.mu.Unlock()
			return
		}
		o.mu.Unlock()
	}
}

// flushOwed tries every owed refund once, within ctx (Close: the connection may go next), and
// counts those that fail as lost.
func (l *Limiter) flushOwed(ctx context.Context) {
	o := l.owed
	o.mu.Lock()
	batch := o.queue
	o.queue = nil
	o.held -= len(batch)
	o.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	var mu sync.Mutex
	var lost refundsLost
	inParallel(len(batch), func(i int) {
		r := batch[i]
		_, kind, err := l.refundAtServer(ctx, r.key, r.c)
		if err == nil {
			return
		}
		reason, retry := refundFailure(kind, err)
		if retry {
			reason = lostExpired // no later try: the Limiter is closing
		}
		mu.Lock()
		defer mu.Unlock()
		lost.add(l, r.key, &r.c, r.name, reason, err)
	})
	l.reportLost(context.WithoutCancel(ctx), &lost, len(batch))
}

// mayPass reports whether br would let a call through at now: closed, or open with its
// cooldown over (the call is then its probe).
func mayPass(br *breaker, now int64) bool {
	switch br.current() {
	case closed:
		return true
	case open:
		return now-br.openedAt.Load() >= br.cooldown
	}
	return false
}

// OwedRefunds is how many refunds the Limiter holds to try again: refunds that decisions across
// keys (AllowAll) owed and that the server could not make when they were due. They are tried
// until their node answers, for at most a minute each (and never after the limiter would have
// given the units back by itself); those given up are counted by the rlfn.client.refunds.lost
// metric and said in the log.
func (l *Limiter) OwedRefunds() int {
	l.owed.mu.Lock()
	defer l.owed.mu.Unlock()
	return l.owed.held
}

// RefundAll gives back what an admitted AllowAllEach(ctx, rules, n) took: pass the same rules
// and n, and its each. A service undoes with it a decision it cannot keep (work that failed
// after several limits admitted it, another limit of its own that refused). Every rule is
// refunded its cost, as Refund does, all at once: at the server when the server decided it
// (each[i].Source), at the local limiter when LocalFallback did, not at all when another
// Fallback did (it took nothing). A denied decision took nothing: it needs no RefundAll.
//
// Unlike Refund's, these refunds are owed whatever happens to ctx (its values are kept, its
// end is not), each within the Limiter's deadline, and are the Limiter's from then on, as
// AllowAll's own (see OwedRefunds): one the server could not make now (its node's breaker
// open, the cluster down, an error answered) is tried again in the background until its node
// answers, for at most a minute and never after each[i].ResetAfter (when the limiter would
// have given the units back by itself; unknown, Limit 0: a minute), and what is given up is
// counted by rlfn.client.refunds.lost and logged, never returned. The error is the rules'
// (a *KeyError or *LimitError, as AllowAllEach would return), before anything is sent.
func (l *Limiter) RefundAll(ctx context.Context, rules []Rule, n int64, each []Result) error {
	if len(each) != len(rules) {
		return &LimitError{Field: "each", Reason: fmt.Sprintf("has %d results for %d rules", len(each), len(rules))}
	}
	groups, err := l.groupRules(ctx, rules, n)
	if err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	type refund struct {
		key string
		c   call
		res Result
	}
	var todo []refund
	for _, g := range groups {
		for j, c := range g.calls {
			res := each[g.rules[j]]
			switch {
			case c.cost == 0:
			case res.Source == FromFallback:
				if l.fallback == LocalFallback {
					l.fallbackResult(opRefund, g.key, c, built{})
				}
			default:
				todo = append(todo, refund{g.key, c, res})
			}
		}
	}
	kinds := make([]errKind, len(todo))
	errs := make([]error, len(todo))
	inParallel(len(todo), func(i int) {
		_, kinds[i], errs[i] = l.refundAtServer(ctx, todo[i].key, todo[i].c)
	})
	l.settleRefunds(ctx, errs, kinds, func(i int) (string, *call, time.Duration) {
		r := &todo[i]
		within := maxOwedFor
		if r.res.Limit != 0 {
			within = min(max(r.res.ResetAfter, 0), maxOwedFor)
		}
		return r.key, &r.c, within
	})
	return nil
}

// settleRefunds holds for another try, or counts as lost, the refunds of a batch that failed:
// refund i failed with errs[i] (kinds[i]); of returns its key, its call, and for how long it
// may be tried again (until its limiter would have given the units back by itself).
func (l *Limiter) settleRefunds(ctx context.Context, errs []error, kinds []errKind, of func(i int) (string, *call, time.Duration)) {
	var owed []owedRefund
	var lost refundsLost
	now := l.clock()
	for i, err := range errs {
		if err == nil {
			continue
		}
		key, c, within := of(i)
		if reason, retry := refundFailure(kinds[i], err); !retry {
			lost.add(l, key, c, limitName(ctx, c), reason, err)
			continue
		}
		owed = append(owed, owedRefund{key: key, c: *c, name: limitName(ctx, c), until: now + int64(within)})
	}
	if owed != nil {
		l.owe(owed, &lost)
	}
	l.reportLost(ctx, &lost, len(errs))
}
