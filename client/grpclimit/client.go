package grpclimit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/decide"
)

// Defaults of ClientOptions: 3 retries, waits of at most a minute, up to 20% of jitter.
const (
	DefaultMaxRetries = decide.DefaultMaxRetries
	DefaultMaxWait    = decide.DefaultMaxWait
	DefaultJitter     = decide.DefaultJitter
)

// ClientOptions configures NewClient.
type ClientOptions struct {
	// Limit paces the calls: a client.LeakyBucket in client.Shape mode spaces them evenly
	// across every instance that shares the key (each call waits its Delay); any other limit
	// admits bursts and makes a call it refuses wait its RetryAfter, then asks again. A stream
	// is paced when it opens. Default (nil): calls are not paced, only retried.
	Limit client.Limit
	// Key returns the principal a call is paced under. Default (nil): the connection's
	// target (grpc.ClientConn.Target), one budget per service called.
	Key Key
	// Idempotent reports whether a method (its full name) is safe to send again. Default
	// (nil): the method's idempotency_level in its proto declaration, NO_SIDE_EFFECTS or
	// IDEMPOTENT, as its generated code registered it; a method declared neither is never
	// sent again.
	Idempotent func(method string) bool
	// MaxRetries is how many times a unary call refused ResourceExhausted with a
	// google.rpc.RetryInfo is sent again, after that wait. Streams are never sent again:
	// their messages are gone. Default (0): DefaultMaxRetries, 3; negative: none.
	MaxRetries int
	// MaxWait is the longest a call waits, for the limiter or for a RetryInfo: a longer wait
	// fails it (the limiter's) or returns the refusal as it is (the server's). A wait that
	// would pass the call's deadline is never started either. Default (0): DefaultMaxWait.
	MaxWait time.Duration
	// Jitter spreads the retries of a fleet refused at once: a RetryInfo of d is waited d
	// plus a random share, up to Jitter, of d; never less than the server asked, nor past
	// MaxWait or the deadline when the wait asked fits. From 0 to 1. Default (0):
	// DefaultJitter, 0.2; negative: none.
	Jitter float64

	// Now, Sleep and Rand are the clock, the wait and the random source, for tests. Sleep
	// returns ctx's error when it ends first. Defaults (nil): time.Now, a timer, math/rand/v2.
	Now   func() time.Time
	Sleep func(ctx context.Context, d time.Duration) error
	Rand  func() float64
}

// Client holds the client interceptors, unary and stream, that pace a service's calls to a
// rate-limited gRPC service and wait out its RetryInfo. It is safe for concurrent use.
//
// The limiter's errors fail the call before it is sent, unless its Policy decides: a
// *client.Limiter's default, client.LocalFallback, paces it in-process while the server
// cannot; client.FailOpen sends it unpaced.
type Client struct {
	opts       ClientOptions
	pacer      decide.Pacer
	idempotent sync.Map // full method name -> bool, of the default Idempotent
}

// WaitError is the error of a call the limiter would hold longer than it may wait, as a
// status: ResourceExhausted, since the call was not sent.
type WaitError struct {
	Key    string
	Wait   time.Duration // what the limiter asked; client.Never when no wait admits it
	Reason string
}

func (e *WaitError) Error() string {
	wait := "forever"
	if e.Wait != client.Never {
		wait = e.Wait.String()
	}
	return fmt.Sprintf("grpclimit: rate limit of %q: a wait of %s %s", e.Key, wait, e.Reason)
}

// GRPCStatus is ResourceExhausted, so that status.Code reads it.
func (e *WaitError) GRPCStatus() *status.Status {
	return status.New(codes.ResourceExhausted, e.Error())
}

// NewClient returns a Client pacing through lim (which may be nil without a Limit), or a
// *ConfigError naming what opts got wrong.
func NewClient(lim Decider, opts ClientOptions) (*Client, error) {
	if l, ok := lim.(*client.Limiter); ok && l == nil {
		lim = nil
	}
	switch {
	case lim == nil && opts.Limit != nil:
		return nil, &ConfigError{Field: "Limiter", Reason: "is required with ClientOptions.Limit"}
	case opts.MaxWait < 0:
		return nil, &ConfigError{Field: "ClientOptions.MaxWait", Reason: "must not be negative, got " + opts.MaxWait.String()}
	case opts.Jitter > 1:
		return nil, &ConfigError{Field: "ClientOptions.Jitter", Reason: fmt.Sprintf("must be at most 1, got %g", opts.Jitter)}
	}
	if opts.Limit != nil {
		if err := decide.ValidLimit(opts.Limit); err != nil {
			return nil, &ConfigError{Field: "ClientOptions.Limit", Reason: decide.LimitReason(err), Err: err}
		}
	}
	opts.MaxRetries = decide.Retries(opts.MaxRetries)
	c := &Client{opts: opts, pacer: decide.NewPacer(lim, opts.Limit, opts.MaxWait,
		opts.Jitter, opts.Now, opts.Sleep, opts.Rand)}
	return c, nil
}

// UnaryInterceptor returns the unary client interceptor: it paces each attempt, and sends a
// call refused ResourceExhausted with a RetryInfo again after that wait when its method is
// idempotent, while MaxRetries, MaxWait and the call's deadline allow.
func (c *Client) UnaryInterceptor() grpc.UnaryClientInterceptor { return c.unary }

// StreamInterceptor returns the stream client interceptor: it paces a stream when it opens.
// A stream is not sent again: its messages are the caller's.
func (c *Client) StreamInterceptor() grpc.StreamClientInterceptor { return c.stream }

func (c *Client) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	key, err := c.key(ctx, method, cc)
	if err != nil {
		return err
	}
	retry := c.opts.MaxRetries > 0 && c.idempotentMethod(method)
	for attempt := 0; ; attempt++ {
		if err := c.pace(ctx, key); err != nil {
			return err
		}
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil || !retry || attempt >= c.opts.MaxRetries {
			return err
		}
		d, ok := RetryDelay(err)
		if !ok {
			return err
		}
		wait, ok := c.pacer.RetryWait(ctx, d, 0)
		if !ok {
			return err // the server's wait does not fit: its answer stands
		}
		if serr := c.pacer.Sleep(ctx, wait); serr != nil {
			return status.FromContextError(serr).Err()
		}
	}
}

func (c *Client) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	key, err := c.key(ctx, method, cc)
	if err != nil {
		return nil, err
	}
	if err := c.pace(ctx, key); err != nil {
		return nil, err
	}
	return streamer(ctx, desc, cc, method, opts...)
}

// key is the principal a call is paced under, "" when nothing paces it.
func (c *Client) key(ctx context.Context, method string, cc *grpc.ClientConn) (string, error) {
	if c.opts.Limit == nil {
		return "", nil
	}
	if c.opts.Key == nil {
		return cc.Target(), nil
	}
	key, err := c.opts.Key(ctx, method)
	if err != nil {
		return "", status.Errorf(codes.InvalidArgument, "grpclimit: client key: %v", err)
	}
	return key, nil
}

// pace waits until the limiter admits a call of key.
func (c *Client) pace(ctx context.Context, key string) error {
	if c.opts.Limit == nil {
		return nil
	}
	wait, reason, slept, err := c.pacer.Pace(ctx, key)
	switch {
	case slept:
		return status.FromContextError(err).Err()
	case err != nil:
		// Not Unavailable: a client's own limiter failing is no reason for a blind retry.
		return status.Errorf(codes.Internal, "grpclimit: pacing %q: %v", key, err)
	case reason != "":
		return &WaitError{Key: key, Wait: wait, Reason: reason}
	}
	return nil
}

// RetryDelay is the wait a server asked for in a ResourceExhausted status's
// google.rpc.RetryInfo, and whether it asked.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return max(ri.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}

// idempotentMethod reports whether method may be sent again.
func (c *Client) idempotentMethod(method string) bool {
	if c.opts.Idempotent != nil {
		return c.opts.Idempotent(method)
	}
	if v, ok := c.idempotent.Load(method); ok {
		return v.(bool)
	}
	ok := DeclaredIdempotent(method)
	c.idempotent.Store(method, ok)
	return ok
}

// DeclaredIdempotent reports whether a method (its full name, "/package.Service/Method") is
// declared idempotent in its proto: option idempotency_level = NO_SIDE_EFFECTS or IDEMPOTENT,
// as its generated code registered it (protoregistry.GlobalFiles).
func DeclaredIdempotent(method string) bool {
	service, name, ok := splitMethod(method)
	if !ok {
		return false
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		return false
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return false
	}
	md := sd.Methods().ByName(protoreflect.Name(strings.TrimSpace(name)))
	if md == nil {
		return false
	}
	opts, ok := md.Options().(*descriptorpb.MethodOptions)
	if !ok {
		return false
	}
	switch opts.GetIdempotencyLevel() {
	case descriptorpb.MethodOptions_NO_SIDE_EFFECTS, descriptorpb.MethodOptions_IDEMPOTENT:
		return true
	}
	return false
}
