package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/decide"
)

// meter.go: a call metered while it runs (Policy.Meter), llmlimit's model for gRPC. The
// decision holds the call's estimate (client.Limiter.MeterEach) instead of taking it; each
// message the handler sends draws its units from the meter before it goes out; the first
// message the budget has no room for cuts the stream (SendMsg returns its status, and so does
// the call); when the handler returns, the hold is settled at what the call used.

// StreamMeter meters the messages a method's handler sends (Policy.Meter), on top of a hold
// of the policy's limits (library 1.3.0).
//
// The call holds its estimate before its handler runs: each enforced limit with a Cost
// function holds that Cost (a stream's Cost sees no request: it reads the call's metadata),
// every enforced limit when no limit of the policy has one (decide.Split.Metered); these are
// the metered limits. The others (the calls of "60 calls and 150,000 tokens a minute") hold
// their cost, 1, and are charged it. When the limits with a Cost are all in shadow, no limit
// is metered: the call is decided as without a Meter.
// A limit without room for its estimate refuses the call as any decision does.
//
// Each message the handler sends (ServerStream.SendMsg, a stream's Send) uses Units(msg)
// of every metered limit, taken from the meter before the message is sent: within the hold
// without a call, beyond it in batches added to the hold (Batch), so that a long stream
// costs a handful of server calls. When a batch does not fit, the meter takes what the
// limits have left (client.Meter.Take) and the stream is cut: that message is not sent, and
// SendMsg returns, then and on every later call, codes.ResourceExhausted, "grpclimit: budget
// of policy <limit> ran out: the stream is cut", with the RetryInfo of the refused batch's
// wait and the QuotaFailure of the limit that ran out (unless HideQuota), as a refusal's;
// the trailers carry the ratelimit values of that limit. Whatever the handler then returns,
// the call ends with that status. A Take the Limiter could not decide (only with
// client.ReturnError) cuts the stream with ServerOptions.ErrorCode and goes to OnError, or,
// with FailOpen, the message is sent unmetered; a Units that returns a negative count cuts it
// Internal.
//
// However the call ends (OK, an error, cancelled, past its deadline, a panic), the hold is
// settled once, after the handler (client.Meter.Settle): each metered limit is charged the
// units of the messages sent, the rest of the hold given back (a call sent more than it held
// is charged the extra only as far as the limit has room: never above it). With an Outcome,
// a call that Count says does not count is charged nothing, and a CostTrailer the handler
// set replaces the units sent, unless the stream was cut (the client received only what
// was sent); a cut stream is charged what it sent whatever Count says of its code (the cut
// is the budget's, not the call's failure). A settlement that fails goes to ServerOptions.OnError as an *UnsettledError
// and is counted in MetricUnsettled. A process that dies mid-stream leaves its hold to
// expire after TTL, charged at what it held (client.HoldOptions.Keep).
//
// A unary method's response is its one message: it is sent whole (a reply cannot be cut),
// and the call is settled at Units(resp), as llmlimit settles a JSON response; a call that
// failed sent nothing (nor did a response whose Units is negative: that goes to OnError as
// a misconfiguration). A client stream's one response (SendAndClose) is metered as a
// stream's message. Messages received are not metered.
//
// A Policy with a Meter needs a Limit (or an Also), a Limiter that implements Meterer (a
// *client.Limiter), library 1.3.0 on its servers (Needs says so; Server.Check finds a node
// that runs an older one; a call on such a node is refused ErrorCode under
// client.ReturnError), no client.SlidingLog (whose refunds cannot give a hold's units back)
// and no Outcome.CheckFirst (it takes nothing before the call, a meter holds).
type StreamMeter struct {
	// Units returns the units a message the handler sends uses of the metered limits (the
	// tokens of a chunk): 0 to 999999999999999. It runs on the handler's goroutine, before
	// the message is sent. Required.
	Units func(msg any) int64
	// Batch is the units the meter adds to the hold at once when a message goes beyond it
	// (client.MeterOptions.Batch). Default (zero): grows, the estimate, then twice the last
	// batch: a stream of 4,000 units with an estimate of 500 costs 5 server calls.
	Batch int64
	// TTL is how long a call's hold lives unless settled (client.HoldOptions.TTL): longer
	// than the longest call, in whole milliseconds. A hold that expires unsettled (its
	// process died) stays charged at what it held. Default (zero): DefaultMeterTTL.
	TTL time.Duration
}

// DefaultMeterTTL is StreamMeter.TTL when it is zero.
const DefaultMeterTTL = 15 * time.Minute

// Meterer is what a Policy with a Meter needs of the Limiter, as *client.Limiter has it.
type Meterer interface {
	MeterEach(ctx context.Context, rules []client.Rule, opt client.MeterOptions) (*client.Meter, client.Result, []client.Result, error)
}

var _ Meterer = (*client.Limiter)(nil)

// ErrNoMeterer: a Policy has a Meter and the Limiter cannot hold units. NewServer refuses
// such a policy.
var ErrNoMeterer = errors.New("grpclimit: Policy.Meter needs a Limiter that implements Meterer, such as *client.Limiter")

// checkMeter reports why a Limiter lim cannot meter p's calls.
func checkMeter(lim Decider, p *Policy) error {
	m := p.Meter
	if _, ok := lim.(Meterer); !ok {
		return ErrNoMeterer
	}
	bad := func(reason string) error { return &PolicyError{Name: p.Name, Reason: "Meter: " + reason} }
	switch {
	case m.Units == nil:
		return bad("Units is required")
	case m.Batch < 0:
		return bad(fmt.Sprintf("Batch must not be negative, got %d", m.Batch))
	case m.TTL < 0 || m.TTL%time.Millisecond != 0:
		return bad("TTL must be whole milliseconds, not negative, got " + m.TTL.String())
	case p.Limit == nil && len(p.Also) == 0:
		return bad("needs a Limit to meter")
	case p.Outcome != nil && p.Outcome.CheckFirst:
		return bad("cannot be set with Outcome.CheckFirst, which takes nothing before the call")
	}
	limits := []client.Limit{p.Limit}
	for _, a := range p.Also {
		limits = append(limits, a.Limit)
	}
	for _, l := range limits {
		switch l.(type) {
		case client.SlidingLog, *client.SlidingLog:
			return bad("a SlidingLog cannot hold units (library 1.3.0): use a SlidingWindow")
		}
	}
	return nil
}

// metering is a call's meter and what it sent.
type metering struct {
	m      *client.Meter
	units  func(msg any) int64
	per    []int64        // per enforced limit: 1 when metered, else 0
	base   []int64        // per enforced limit: what an unmetered one is charged (its cost)
	quotas []decide.Quota // the enforced limits', in the rules' order
	hide   bool
	// sent is the units of the messages sent. The handler's goroutine alone sends (gRPC
	// forbids concurrent SendMsg), and the settle runs after it returned.
	sent int64
	cut  error // the status the call ends with, once the meter cut it
}

// openMeter holds the estimate of set's enforced limits, measured saying which are metered
// (decide.Split.Metered), and returns the decision as DecideEnforced does, with the meter
// when admitted.
func (s *Server) openMeter(ctx context.Context, p *Policy, set *decide.Set, measured []bool) (client.Result, []client.Result, []decide.Quota, *metering, error) {
	rules := set.Enforced
	per, base := make([]int64, len(rules)), make([]int64, len(rules))
	for i, r := range rules {
		if measured[i] {
			per[i] = 1
		} else {
			base[i] = max(r.Cost, 1)
		}
	}
	ttl := p.Meter.TTL
	if ttl == 0 {
		ttl = DefaultMeterTTL
	}
	// Keep: a hold whose process died before it settled stays charged at what it held, so a
	// crash never gives a stream's units back for free.
	m, res, each, err := s.lim.(Meterer).MeterEach(ctx, rules, client.MeterOptions{
		Hold: client.HoldOptions{TTL: ttl, Keep: true}, PerUnit: per, Base: base, Batch: p.Meter.Batch})
	quotas := set.EnforcedQuotas
	if err != nil {
		return res, nil, quotas, nil, err
	}
	if res.Rule > 0 && res.Rule < len(quotas) {
		quotas = decide.DecidingFirst(quotas, res.Rule)
		if len(each) == len(rules) {
			each = decide.DecidingFirst(each, res.Rule)
		}
	}
	if m == nil {
		return res, each, quotas, nil, nil
	}
	return res, each, quotas, &metering{m: m, units: p.Meter.Units, per: per, base: base, quotas: set.EnforcedQuotas, hide: p.HideQuota}, nil
}

// maxUnits is the most units the library counts.
const maxUnits = 999_999_999_999_999

// meteredStream is a metered call's stream: each message the handler sends is taken from the
// meter first.
type meteredStream struct {
	grpc.ServerStream
	c *call
}

func (ms *meteredStream) SendMsg(msg any) error {
	mt, c := ms.c.mt, ms.c
	if mt.cut != nil {
		return mt.cut
	}
	n := mt.units(msg)
	ctx := ms.Context()
	ok, err := mt.m.Take(ctx, n)
	switch {
	case err != nil:
		if st := c.s.limiterError(ctx, c.method, c.p.Name, fmt.Errorf("grpclimit: metering the stream: %w", err)); st != nil {
			mt.cut = st
			return st
		}
		// FailOpen: sent unmetered, and settled at what was sent.
	case !ok:
		mt.cut = c.s.cutStream(ms.ServerStream, mt)
		return mt.cut
	}
	if err := ms.ServerStream.SendMsg(msg); err != nil {
		return err
	}
	mt.sent = min(mt.sent+n, maxUnits)
	return nil
}

// cutStream is the status of a stream whose meter refused a message, whose trailers get the
// ratelimit values of the limit that ran out.
func (s *Server) cutStream(ss grpc.ServerStream, mt *metering) error {
	res := mt.m.Result()
	quotas := mt.quotas
	if res.Rule > 0 && res.Rule < len(quotas) {
		quotas = decide.DecidingFirst(quotas, res.Rule)
	}
	if !mt.hide {
		v := decide.AppendValues(nil, s.clock, decide.ResetNone, quotas[:1], res, nil, res.RetryAfter, true)
		str := string(v.Buf)
		ss.SetTrailer(metadata.MD{MetadataPolicy: {str[:v.Ends[0]]}, MetadataRateLimit: {str[v.Ends[0]:v.Ends[1]]}})
	}
	return cutStatus(mt.hide, quotas[0].Name, res.RetryAfter)
}

// unaryResponse meters a unary call's response, its one message: sent whole, settled at its
// units. A negative count is a misconfiguration, reported, and settled as nothing sent.
func (mt *metering) unaryResponse(ctx context.Context, c *call, resp any, err error) {
	if err != nil || resp == nil {
		return
	}
	n := mt.units(resp)
	if n < 0 {
		c.s.report(ctx, c.method, decide.Misconfigured, c.p.Name, &PolicyError{Name: c.p.Name, Reason: fmt.Sprintf("Meter: Units returned %d for a response", n)})
		return
	}
	mt.sent = min(n, maxUnits)
}

// settle ends a metered call that ended with code: each metered limit charged what was sent
// (or the cost trailer's value), each other its cost; nothing when the Outcome does not count
// the call, unless the meter cut it.
func (c *call) settle(ctx context.Context, p *Policy, code codes.Code) {
	mt := c.mt
	used := mt.sent
	if c.cost != nil && c.cost.set && mt.cut == nil {
		used = c.cost.cost
	}
	// A cut stream counts whatever Count says of its code: its messages were sent, and the
	// cut is the budget's doing, not the call's failure (else a spent budget would serve
	// every stream up to the cut for free).
	counts := mt.cut != nil || p.Outcome == nil || p.Outcome.Count == nil || p.Outcome.Count(code)
	actual := make([]int64, len(mt.per))
	if counts {
		for i := range actual {
			actual[i] = mt.base[i] + used*mt.per[i]
		}
	}
	if _, err := mt.m.Settle(ctx, actual); err != nil {
		if c.s.unsettled != nil {
			c.s.unsettled.Add(ctx, 1, metric.WithAttributes(attribute.String("rlfn.policy", p.Name)))
		}
		c.s.report(ctx, c.method, decide.Unsettled, p.Name, &UnsettledError{Policy: p.Name, Taken: mt.m.Hold().Held(), Owed: actual, Err: err})
	}
}

// drop settles the meter of a call refused after its hold was taken (its delay too long, its
// client gone while it waited, its Concurrency refused): it never ran, so the metered limits
// get their units back, and the others keep their cost, as a refused decision's stays taken.
func (c *call) drop(ctx context.Context) {
	if c.mt != nil {
		if err := c.mt.m.Close(context.WithoutCancel(ctx)); err != nil {
			c.s.report(ctx, c.method, decide.Unsettled, c.p.Name, &UnsettledError{Policy: c.p.Name, Taken: c.mt.m.Hold().Held(), Owed: c.mt.base, Err: err})
		}
		c.mt = nil
	}
}
