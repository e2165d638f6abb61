package grpclimit

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/decide"
)

// Outcome counts a method's calls by how they end (Policy.Outcome). The call is decided
// before its handler as always; once it ends, however it ends (a status returned, a panic, a
// stream cancelled or past its deadline), its units are settled: given back (client.Limiter's
// Refund) when Count says the call does not count, or brought to the cost the handler
// reported in the trailer CostTrailer. A settlement is never retried (a refund is not
// idempotent); one that fails goes to ServerOptions.OnError as an *UnsettledError and is
// counted in MetricUnsettled. Shadow limits are not settled. The Limiter must be a
// *client.Limiter (or implement Settler).
type Outcome struct {
	// Count reports whether a call that ended with code counts. Default (nil): every call
	// counts. Failures counts the failed ones, for logins; Successes the others.
	Count func(code codes.Code) bool
	// CostTrailer names a trailer (grpc.SetTrailer, lower case) in which the handler reports
	// the call's cost in units once it knows it (an LLM's tokens): a decimal integer. A call
	// that counts costs it, instead of its estimate, of every limit with a Cost function (of
	// every limit when none of the policy's, in shadow or not, has one); one without it, or with a value that is no such number,
	// costs what the decision took. Default (empty): every call that counts costs what the
	// decision took.
	CostTrailer string
	// CheckFirst takes nothing before the handler: every limit is only peeked, so a call is
	// refused once the limit is spent, and the units are taken after, when the call counts
	// (Count): a login limiter that charges failed attempts alone. Calls in flight at once may
	// all pass the peek, so a limit of n can be exceeded by the calls of one key in flight at
	// that moment: give the policy a Concurrency of 1 to close the gap. Default: false, the
	// unit is taken before and given back when the call does not count.
	CheckFirst bool
}

// Failures is an Outcome.Count that counts the calls that failed (any code but OK).
func Failures(code codes.Code) bool { return code != codes.OK }

// Successes is an Outcome.Count that counts the calls that succeeded (OK).
func Successes(code codes.Code) bool { return code == codes.OK }

// Settler is what a Policy with an Outcome needs of the Limiter, as *client.Limiter has it.
type Settler interface {
	AllowN(ctx context.Context, key string, limit client.Limit, n int64) (client.Result, error)
	PeekN(ctx context.Context, key string, limit client.Limit, n int64) (client.Result, error)
	Refund(ctx context.Context, key string, limit client.Limit, n int64) (client.Result, error)
}

var _ Settler = (*client.Limiter)(nil)

// UnsettledError is passed to ServerOptions.OnError when a call's settlement by its outcome
// failed: the units each enforced limit took (Taken, in the order of Limit and Also) were not
// brought to what it owed (Owed), for some of them: Err says which.
type UnsettledError struct {
	Policy      string
	Taken, Owed []int64
	Err         error
}

func (e *UnsettledError) Error() string {
	return fmt.Sprintf("grpclimit: settling policy %q from %v to %v units: %v", e.Policy, e.Taken, e.Owed, e.Err)
}

func (e *UnsettledError) Unwrap() error { return e.Err }

// costStream is the call's grpc.ServerTransportStream, reading the cost trailer the handler
// sets through grpc.SetTrailer.
type costStream struct {
	grpc.ServerTransportStream
	name string
	cost int64
	set  bool
}

func (c *costStream) SetTrailer(md metadata.MD) error {
	c.read(md)
	return c.ServerTransportStream.SetTrailer(md)
}

func (c *costStream) read(md metadata.MD) {
	if v := md.Get(c.name); len(v) > 0 {
		if n, ok := decide.ParseCost(v[len(v)-1]); ok {
			c.cost, c.set = n, true
		}
	}
}

// costServerStream reads the cost trailer a stream handler sets through its stream.
type costServerStream struct {
	grpc.ServerStream
	ctx  context.Context
	cost *costStream
}

func (s *costServerStream) Context() context.Context { return s.ctx }

func (s *costServerStream) SetTrailer(md metadata.MD) {
	s.cost.read(md)
	s.ServerStream.SetTrailer(md)
}
