package httplimit

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/decide"
)

// Outcome counts a route's requests by how they end (Policy.Outcome). The request is decided
// before the next handler as always; once the handler has ended, however it ends (it returns,
// panics, answers through an error handler, streams, or hijacks the connection), its units
// are settled from the response's status: given back (client.Limiter's Refund) when Count says
// the request does not count, or brought to the cost the handler reported in the header (or
// trailer) CostHeader. The status is the one passed to WriteHeader (200 when the handler
// writes without it, or writes nothing; 101 when it hijacks the connection without one; 500
// when it panics).
//
// The settlement runs when the handler returns, before the response is finished, so that the
// client's next request sees it: it adds a round trip to the limiter to the requests it
// changes (not to those that cost what the decision took). It is never retried (a refund is
// not idempotent); one that fails goes to Options.OnError as an *UnsettledError and is counted
// in MetricUnsettled. Shadow limits are not settled. The Limiter must be a *client.Limiter (or
// implement Settler).
type Outcome struct {
	// Count reports whether a request that ended with status counts. Default (nil): every
	// request counts. Failures counts the failed ones (status 400 and above), for logins;
	// Successes the others.
	Count func(status int) bool
	// CostHeader names a response header, or a trailer (http.TrailerPrefix + name, or one
	// declared in the Trailer header), in which the handler reports the request's cost in
	// units once it knows it (an LLM's tokens): a decimal integer. A request that counts
	// costs it, instead of its estimate, of every limit with a Cost function (of every limit
	// when none of the policy's, in shadow or not, has one); one without it, or with a value
	// that is no such number, costs what the decision took. The header is sent to the client
	// as any other. Default (empty): every request that counts costs what the decision took.
	CostHeader string
	// CheckFirst takes nothing before the handler: every limit is only peeked, so a request
	// is refused once the limit is spent, and the units are taken after, when the request
	// counts (Count): a login limiter that charges failed attempts alone. Requests in flight
	// at once may all pass the peek, so a limit of n can be exceeded by the requests of one
	// key in flight at that moment: give the Policy a Concurrency of 1 to close the gap.
	// Default: false, the unit is taken before and given back when the request does not count.
	CheckFirst bool
}

// Failures is an Outcome.Count that counts the requests that failed: status 400 and above.
func Failures(status int) bool { return status >= 400 }

// Successes is an Outcome.Count that counts the requests that did not fail: status below 400.
func Successes(status int) bool { return status < 400 }

// Settler is what a Policy with an Outcome needs of the Limiter, as *client.Limiter has it.
type Settler interface {
	AllowN(ctx context.Context, key string, limit client.Limit, n int64) (client.Result, error)
	PeekN(ctx context.Context, key string, limit client.Limit, n int64) (client.Result, error)
	Refund(ctx context.Context, key string, limit client.Limit, n int64) (client.Result, error)
}

var _ Settler = (*client.Limiter)(nil)

// MetricUnsettled counts the settlements by outcome (refunds and charges) that failed
// ({request}), by rlfn.policy: units not given back, or not taken. None is retried.
const MetricUnsettled = "rlfn.httplimit.unsettled"

// UnsettledError is passed to Options.OnError when a request's settlement by its outcome
// failed: the units each enforced limit took (Taken, in the order of Limit and Also) were not
// brought to what it owed (Owed), for some of them: Err says which.
type UnsettledError struct {
	Policy      string
	Taken, Owed []int64
	Err         error
}

func (e *UnsettledError) Error() string {
	return fmt.Sprintf("httplimit: settling policy %q from %v to %v units: %v", e.Policy, e.Taken, e.Owed, e.Err)
}

func (e *UnsettledError) Unwrap() error { return e.Err }

// counting is what a request counted by its outcome owes once its handler ends.
type counting struct {
	rules      []client.Rule // the enforced limits, each with its cost
	measured   []bool        // whether each had a Cost function: its cost was an estimate
	checkFirst bool          // the decision took nothing: it peeked
}

// serveCounted serves the request with c, or settles it by its outcome first when c is not nil.
func (m *Middleware) serveCounted(w http.ResponseWriter, r *http.Request, next http.Handler, p *Policy, c *counting) {
	if c == nil {
		next.ServeHTTP(w, r)
		return
	}
	ow := &outcomeWriter{ResponseWriter: w}
	defer func() {
		v := recover()
		status := ow.outcome()
		if v != nil {
			status = http.StatusInternalServerError
		}
		m.settle(r, p, c, status, w, ow.hijacked)
		if v != nil {
			panic(v) // net/http's, or an outer middleware's, to handle as before
		}
	}()
	next.ServeHTTP(ow, r)
}

// settle brings what c took to what the request costs by its outcome.
func (m *Middleware) settle(r *http.Request, p *Policy, c *counting, status int, w http.ResponseWriter, hijacked bool) {
	o := p.Outcome
	var reported int64
	ok := false
	if o.CostHeader != "" && !hijacked { // a hijacked connection's headers are the handler's own
		h := w.Header()
		v := h.Get(http.TrailerPrefix + o.CostHeader)
		if v == "" {
			v = h.Get(o.CostHeader)
		}
		reported, ok = decide.ParseCost(v)
	}
	taken, owed := decide.Owed(c.rules, c.measured, c.checkFirst, o.Count == nil || o.Count(status), reported, ok)
	// The request's context may be over (the client went away): the units are owed anyway.
	ctx := context.WithoutCancel(r.Context())
	if err := decide.Settle(ctx, m.lim.(Settler), c.rules, taken, owed); err != nil {
		if m.unsettled != nil {
			m.unsettled.Add(ctx, 1, metric.WithAttributes(attribute.String("rlfn.policy", p.Name)))
		}
		m.report(r, unsettled, p.Name, &UnsettledError{Policy: p.Name, Taken: taken, Owed: owed, Err: err})
	}
}

// outcomeWriter records the status a handler answers, for its settlement. It passes
// everything on, and unwraps for http.ResponseController.
type outcomeWriter struct {
	http.ResponseWriter
	status   int
	hijacked bool
}

func (w *outcomeWriter) WriteHeader(status int) {
	// 1xx are informational, sent before the final status (101 ends the exchange).
	if w.status == 0 && (status >= 200 || status == http.StatusSwitchingProtocols) {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *outcomeWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *outcomeWriter) ReadFrom(src io.Reader) (int64, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}
	return io.Copy(w.ResponseWriter, src)
}

func (w *outcomeWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *outcomeWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.hijacked = true
	}
	return conn, rw, err
}

func (w *outcomeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// outcome is the request's final status.
func (w *outcomeWriter) outcome() int {
	switch {
	case w.status != 0:
		return w.status
	case w.hijacked:
		return http.StatusSwitchingProtocols
	}
	return http.StatusOK // net/http's answer to a handler that writes nothing
}
