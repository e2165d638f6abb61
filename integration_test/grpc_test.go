package integration_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/grpclimit"
	"github.com/rlfn/rlfn/internal/harness"
)

// testService answers UnaryCall and EmptyCall at once, with the status a request asks for
// (ResponseStatus), and echoes each message of a FullDuplexCall until the client ends it, a
// message asks for a status (the stream ends with it), or the call's context ends.
type testService struct {
	testgrpc.UnimplementedTestServiceServer
}

func (testService) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

func (testService) UnaryCall(ctx context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	switch body := string(req.GetPayload().GetBody()); body {
	case "":
	case "panic":
		panic("the handler failed")
	default: // the call's cost, known once it is served
		grpc.SetTrailer(ctx, metadata.Pairs("rlfn-cost", body))
	}
	if s := req.GetResponseStatus(); s.GetCode() != 0 {
		return nil, status.Error(codes.Code(s.GetCode()), s.GetMessage())
	}
	return &testgrpc.SimpleResponse{}, nil
}

func (testService) FullDuplexCall(stream testgrpc.TestService_FullDuplexCallServer) error {
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err // cancelled, or past its deadline
		}
		if body := req.GetPayload().GetBody(); len(body) > 0 {
			stream.SetTrailer(metadata.Pairs("rlfn-cost", string(body)))
		}
		if s := req.GetResponseStatus(); s.GetCode() != 0 {
			return status.Error(codes.Code(s.GetCode()), s.GetMessage())
		}
		if err := stream.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
}

// grpcPair serves testService behind the server interceptors of opts (and extra ones, outside
// them) over an in-memory connection (bufconn: a network adds nothing to what is tested), and
// returns a real client of it, with the client interceptors of copts when not nil. Calls are
// counted against the key in their "x-key" metadata.
func grpcPair(t *testing.T, lim grpclimit.Decider, opts grpclimit.ServerOptions, copts *grpclimit.ClientOptions, clim grpclimit.Decider, outer ...grpc.StreamServerInterceptor) testgrpc.TestServiceClient {
	t.Helper()
	return grpcPairWith(t, lim, opts, copts, clim, nil, outer...)
}

// grpcPairWith is grpcPair with unary interceptors outside the rate limit's.
func grpcPairWith(t *testing.T, lim grpclimit.Decider, opts grpclimit.ServerOptions, copts *grpclimit.ClientOptions, clim grpclimit.Decider, unary []grpc.UnaryServerInterceptor, outer ...grpc.StreamServerInterceptor) testgrpc.TestServiceClient {
	t.Helper()
	if opts.Key == nil {
		opts.Key = grpclimit.Metadata("x-key")
	}
	s, err := grpclimit.NewServer(lim, opts)
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(append(unary, s.UnaryInterceptor())...),
		grpc.ChainStreamInterceptor(append(outer, s.StreamInterceptor())...))
	testgrpc.RegisterTestServiceServer(srv, testService{})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	dial := []grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}
	if copts != nil {
		c, err := grpclimit.NewClient(clim, *copts)
		if err != nil {
			t.Fatal(err)
		}
		dial = append(dial, grpc.WithUnaryInterceptor(c.UnaryInterceptor()), grpc.WithStreamInterceptor(c.StreamInterceptor()))
	}
	conn, err := grpc.NewClient("passthrough:///bufnet", dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return testgrpc.NewTestServiceClient(conn)
}

// withKey is ctx with key in the call's "x-key" metadata.
func withKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "x-key", key)
}

// details decodes a status's RetryInfo and QuotaFailure, as a client reads them.
func details(t *testing.T, err error) (retry *errdetails.RetryInfo, quota *errdetails.QuotaFailure) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("%v is no gRPC status", err)
	}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			retry = d
		case *errdetails.QuotaFailure:
			quota = d
		case error:
			t.Fatalf("a detail does not decode: %v", d)
		}
	}
	return retry, quota
}

// A token bucket behind the interceptors, on every server: calls admitted with the draft's
// ratelimit values in their header metadata counting down, then a refusal decoded by a real
// client: ResourceExhausted (never Unavailable), a RetryInfo of the server's exact wait, a
// QuotaFailure naming the policy, which the wait admits again.
func TestGRPCRefusal(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		limit := client.TokenBucket{Capacity: 2, Rate: 1, Period: time.Second}
		c := grpcPair(t, harness.NewLimiter(t, tg.c, slowMachine), grpclimit.ServerOptions{
			Methods: map[string]grpclimit.Policy{"/grpc.testing.TestService/UnaryCall": {Name: "api", Limit: limit}},
		}, nil, nil)
		ctx := withKey(ctx5s(t), keyFor(t))
		for i, want := range []string{`"api";r=1;t=1`, `"api";r=0;t=2`} {
			var md metadata.MD
			if _, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.Header(&md)); err != nil {
				t.Fatalf("call %d: %v", i+1, err)
			}
			if got := md.Get("ratelimit-policy"); len(got) != 1 || got[0] != `"api";q=2;w=2` {
				t.Errorf("call %d: ratelimit-policy %q", i+1, got)
			}
			if got := md.Get("ratelimit"); len(got) != 1 || got[0] != want {
				t.Errorf("call %d: ratelimit %q, want %q", i+1, got, want)
			}
		}
		var md metadata.MD
		_, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.Header(&md))
		// The wait counts from when the server decided, between the call's start and its
		// answer: from the answer, the retry cannot come early (from the start, it did when the
		// call took more than 5 ms to reach a loaded cluster node).
		answered := time.Now()
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("call 3: %v, want ResourceExhausted", err)
		}
		retry, quota := details(t, err)
		if retry == nil || quota == nil {
			t.Fatalf("call 3: details RetryInfo %v, QuotaFailure %v", retry, quota)
		}
		wait := retry.GetRetryDelay().AsDuration()
		if wait <= 0 || wait > time.Second || wait%time.Millisecond != 0 {
			t.Errorf("RetryInfo %v, want the token's wait, up to 1s, in whole milliseconds", wait)
		}
		if v := quota.GetViolations(); len(v) != 1 || v[0].GetQuotaId() != "api" || v[0].GetSubject() != "policy:api" {
			t.Errorf("QuotaFailure %v, want one violation of policy api", quota)
		}
		if got := md.Get("ratelimit"); len(got) != 1 || !strings.HasPrefix(got[0], `"api";r=0;t=1`) {
			t.Errorf("refused: ratelimit %q", got)
		}
		time.Sleep(wait - time.Since(answered) + 5*time.Millisecond)
		if _, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{}); err != nil {
			t.Errorf("after the RetryInfo's wait: %v", err)
		}
		// A method without a policy is not limited.
		for range 3 {
			if _, err := c.EmptyCall(ctx, &testgrpc.Empty{}); err != nil {
				t.Fatalf("EmptyCall: %v", err)
			}
		}
	})
}

// A hidden quota refuses with a RetryInfo alone: no QuotaFailure, no policy in the message,
// no ratelimit metadata.
func TestGRPCHiddenQuota(t *testing.T) {
	tg := servers(t)[0]
	c := grpcPair(t, harness.NewLimiter(t, tg.c, slowMachine), grpclimit.ServerOptions{
		Default: grpclimit.Policy{Name: "login", Limit: client.FixedWindow{Limit: 1, Window: time.Minute}, HideQuota: true},
	}, nil, nil)
	ctx := withKey(ctx5s(t), keyFor(t))
	var md metadata.MD
	if _, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.Header(&md)); err != nil || len(md.Get("ratelimit")) > 0 {
		t.Fatalf("call 1: %v, metadata %v", err, md)
	}
	_, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.Header(&md))
	retry, quota := details(t, err)
	if status.Code(err) != codes.ResourceExhausted || retry == nil || quota != nil ||
		strings.Contains(status.Convert(err).Message(), "login") || len(md.Get("ratelimit")) > 0 {
		t.Errorf("call 2: %v, RetryInfo %v, QuotaFailure %v, metadata %v; want RetryInfo alone", err, retry, quota, md)
	}
}

// Two limits all or nothing, on every server: a refusal by the second names it, and the first
// did not count the refused call.
func TestGRPCAlso(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		c := grpcPair(t, harness.NewLimiter(t, tg.c, slowMachine), grpclimit.ServerOptions{
			Default: grpclimit.Policy{Name: "minute", Limit: client.FixedWindow{Limit: 3, Window: time.Minute},
				Also: []grpclimit.AlsoLimit{{Name: "second", Limit: client.FixedWindow{Limit: 1, Window: time.Minute}}}},
		}, nil, nil)
		ctx := withKey(ctx5s(t), keyFor(t))
		var md metadata.MD
		if _, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.Header(&md)); err != nil {
			t.Fatal(err)
		}
		if got := md.Get("ratelimit-policy"); len(got) != 1 || got[0] != `"second";q=1;w=60, "minute";q=3;w=60` {
			t.Errorf("ratelimit-policy %q", got)
		}
		_, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.Header(&md))
		_, quota := details(t, err)
		if status.Code(err) != codes.ResourceExhausted || len(quota.GetViolations()) != 1 || quota.GetViolations()[0].GetQuotaId() != "second" {
			t.Fatalf("call 2: %v, %v; want a refusal by second", err, quota)
		}
		if got := md.Get("ratelimit"); len(got) != 1 || !strings.Contains(got[0], `"minute";r=2;`) {
			t.Errorf("refused: ratelimit %q, want minute's 2 left (the refused call not counted)", got)
		}
	})
}

// A stream holds its concurrency lease for its whole life and releases it however it ends:
// the client cancels it, its deadline passes, the server ends it with an error, or the client
// ends it normally. While one stream of a key is open, a second is refused.
func TestGRPCStreamLease(t *testing.T) {
	tg := servers(t)[0]
	ended := make(chan error, 1)
	// outside the rate limit's: it returns once the lease is released
	signal := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		err := handler(srv, ss)
		ended <- err
		return err
	}
	c := grpcPair(t, harness.NewLimiter(t, tg.c, slowMachine), grpclimit.ServerOptions{
		Default: grpclimit.Policy{Name: "streams", Concurrency: &client.Concurrency{Limit: 1, Lease: time.Minute}},
	}, nil, nil, signal)
	key := keyFor(t)
	open := func(ctx context.Context) testgrpc.TestService_FullDuplexCallClient {
		t.Helper()
		s, err := c.FullDuplexCall(withKey(ctx, key))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&testgrpc.StreamingOutputCallRequest{}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatalf("the stream was not admitted: %v", err)
		}
		return s
	}
	refused := func() {
		t.Helper()
		s, err := c.FullDuplexCall(withKey(ctx5s(t), key))
		if err == nil {
			_, err = s.Recv()
		}
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("a second stream while one holds the lease: %v, want ResourceExhausted", err)
		}
		if err := <-ended; status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("the refused stream ended with %v", err)
		}
	}
	for _, tt := range []struct {
		name string
		end  func(s testgrpc.TestService_FullDuplexCallClient, cancel context.CancelFunc)
		want codes.Code
	}{
		{"cancel", func(_ testgrpc.TestService_FullDuplexCallClient, cancel context.CancelFunc) { cancel() }, codes.Canceled},
		{"deadline", func(s testgrpc.TestService_FullDuplexCallClient, _ context.CancelFunc) {
			if _, err := s.Recv(); status.Code(err) != codes.DeadlineExceeded {
				t.Errorf("the client's stream: %v, want DeadlineExceeded", err)
			}
		}, codes.DeadlineExceeded},
		{"error", func(s testgrpc.TestService_FullDuplexCallClient, _ context.CancelFunc) {
			s.Send(&testgrpc.StreamingOutputCallRequest{ResponseStatus: &testgrpc.EchoStatus{Code: int32(codes.FailedPrecondition)}})
		}, codes.FailedPrecondition},
		{"normal", func(s testgrpc.TestService_FullDuplexCallClient, _ context.CancelFunc) { s.CloseSend() }, codes.OK},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if tt.name == "deadline" {
				ctx, cancel = context.WithTimeout(ctx, 500*time.Millisecond)
				defer cancel()
			}
			s := open(ctx)
			refused()
			tt.end(s, cancel)
			select {
			case err := <-ended:
				// At the deadline the client resets the stream too: the server may see either.
				if got := status.Code(err); got != tt.want && !(tt.want == codes.DeadlineExceeded && got == codes.Canceled) {
					t.Errorf("the stream ended with %v, want %v", err, tt.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the stream's handler did not return")
			}
			// released: a new stream of the key is admitted at once
			ctx2, cancel2 := context.WithCancel(ctx5s(t))
			open(ctx2).CloseSend()
			<-ended
			cancel2()
		})
	}
}

// The client interceptor waits out the server's RetryInfo, with jitter and never less, for a
// method marked idempotent, then the call succeeds; a method not marked is never sent again.
func TestGRPCRetryWaitsWhatTheServerSaid(t *testing.T) {
	tg := servers(t)[0]
	var mu sync.Mutex
	var slept []time.Duration
	copts := &grpclimit.ClientOptions{
		Idempotent: func(method string) bool { return method == "/grpc.testing.TestService/UnaryCall" },
		Sleep: func(ctx context.Context, d time.Duration) error {
			mu.Lock()
			slept = append(slept, d)
			mu.Unlock()
			time.Sleep(d)
			return ctx.Err()
		},
	}
	c := grpcPair(t, harness.NewLimiter(t, tg.c, slowMachine), grpclimit.ServerOptions{
		Default: grpclimit.Policy{Name: "api", Limit: client.TokenBucket{Capacity: 1, Rate: 1, Period: 700 * time.Millisecond}},
	}, copts, nil)
	ctx := withKey(ctx5s(t), keyFor(t))
	if _, err := c.EmptyCall(ctx, &testgrpc.Empty{}); err != nil {
		t.Fatal(err)
	}
	// not idempotent: refused at once, not waited
	_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
	retry, _ := details(t, err)
	if status.Code(err) != codes.ResourceExhausted || retry == nil || len(slept) != 0 {
		t.Fatalf("EmptyCall: %v, slept %v; want a refusal returned as it is", err, slept)
	}
	server := retry.GetRetryDelay().AsDuration()
	start := time.Now()
	if _, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{}); err != nil {
		t.Fatalf("UnaryCall, retried: %v", err)
	}
	if len(slept) != 1 || slept[0] < server-time.Since(start) || slept[0] > server*6/5 {
		t.Errorf("slept %v; want one wait of the server's %v or a little more, at most 20%% more", slept, server)
	}
	// A deadline the wait would pass: refused at once.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c.UnaryCall(short, &testgrpc.SimpleRequest{}); status.Code(err) != codes.ResourceExhausted || len(slept) != 1 {
		t.Errorf("within a 50ms deadline: %v, slept %v; want the refusal, no wait", err, slept)
	}
}

// The client interceptor paces outgoing calls through its own limit against the shared
// server: two calls of a bucket of one, the second waits for the token.
func TestGRPCClientPaces(t *testing.T) {
	tg := servers(t)[0]
	lim := harness.NewLimiter(t, tg.c, slowMachine)
	var slept []time.Duration
	key := keyFor(t)
	copts := &grpclimit.ClientOptions{
		Limit: client.TokenBucket{Capacity: 1, Rate: 1, Period: 300 * time.Millisecond},
		Key:   func(context.Context, string) (string, error) { return key, nil },
		Sleep: func(ctx context.Context, d time.Duration) error { slept = append(slept, d); time.Sleep(d); return nil },
	}
	c := grpcPair(t, lim, grpclimit.ServerOptions{}, copts, lim)
	ctx := withKey(ctx5s(t), keyFor(t))
	for range 2 {
		if _, err := c.EmptyCall(ctx, &testgrpc.Empty{}); err != nil {
			t.Fatal(err)
		}
	}
	if len(slept) != 1 || slept[0] <= 0 || slept[0] > 300*time.Millisecond {
		t.Errorf("slept %v, want one wait for the token, up to 300ms", slept)
	}
	// A limit no wait satisfies fails the call before it is sent, ResourceExhausted.
	copts.Limit = client.FixedWindow{Limit: 1, Window: time.Hour}
	c = grpcPair(t, lim, grpclimit.ServerOptions{}, copts, lim)
	key = keyFor(t)
	c.EmptyCall(ctx, &testgrpc.Empty{})
	_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
	var we *grpclimit.WaitError
	if status.Code(err) != codes.ResourceExhausted || !errors.As(err, &we) {
		t.Errorf("a wait of an hour: %v, want a *WaitError, ResourceExhausted", err)
	}
}

// With its server gone, the interceptors do what the Limiter and the options say: the default
// LocalFallback decides in-process (and refuses past the limit, ResourceExhausted);
// client.ReturnError leaves the call to ErrorCode (Internal by default, never Unavailable),
// or FailOpen serves it; each error reaches OnError.
func TestGRPCServerGone(t *testing.T) {
	s, vk := httpValkey(t)
	limit := client.FixedWindow{Limit: 2, Window: time.Minute}
	var mu sync.Mutex
	var errs []error
	onError := func(_ context.Context, _ string, err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }
	returnError := client.Options{Deadline: slowDeadline, Fallback: client.ReturnError}
	policy := grpclimit.Policy{Name: "api", Limit: limit}
	local := grpcPair(t, harness.NewLimiter(t, vk, client.Options{Deadline: time.Second}), grpclimit.ServerOptions{Default: policy}, nil, nil)
	closed := grpcPair(t, harness.NewLimiter(t, vk, returnError), grpclimit.ServerOptions{Default: policy, OnError: onError}, nil, nil)
	open := grpcPair(t, harness.NewLimiter(t, vk, returnError), grpclimit.ServerOptions{Default: policy, OnError: onError, FailOpen: true}, nil, nil)
	ctx := withKey(ctx5s(t), keyFor(t))
	if _, err := closed.EmptyCall(ctx, &testgrpc.Empty{}); err != nil {
		t.Fatalf("server up: %v", err)
	}
	if err := s.Stop(ctx5s(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := closed.EmptyCall(ctx, &testgrpc.Empty{}); status.Code(err) != codes.Internal {
		t.Errorf("server gone, ReturnError: %v, want Internal", err)
	}
	var md metadata.MD
	if _, err := open.EmptyCall(ctx, &testgrpc.Empty{}, grpc.Header(&md)); err != nil || len(md.Get("ratelimit")) > 0 {
		t.Errorf("server gone, FailOpen: %v, metadata %v; want served, no quota state", err, md)
	}
	mu.Lock()
	if len(errs) != 2 {
		t.Errorf("OnError got %v, want the two calls' errors", errs)
	}
	mu.Unlock()
	lctx := withKey(ctx5s(t), keyFor(t))
	for i := range 3 {
		_, err := local.EmptyCall(lctx, &testgrpc.Empty{})
		if want := codes.OK; i == 2 && status.Code(err) != codes.ResourceExhausted || i < 2 && status.Code(err) != want {
			t.Errorf("server gone, LocalFallback, call %d: %v", i+1, err)
		}
	}
}

// A critical method may take the reserve the others leave to it: of a window of 3 with 1
// reserved, a plain method gets 2 calls, the critical one the third. Both share one budget
// (one policy Name).
func TestGRPCCritical(t *testing.T) {
	tg := servers(t)[0]
	limit := client.FixedWindow{Limit: 3, Window: time.Minute, Reserve: 1}
	c := grpcPair(t, harness.NewLimiter(t, tg.c, slowMachine), grpclimit.ServerOptions{
		Methods: map[string]grpclimit.Policy{
			"/grpc.testing.TestService/EmptyCall": {Name: "api", Limit: limit},
			"/grpc.testing.TestService/UnaryCall": {Name: "api", Limit: limit, Critical: true},
		},
	}, nil, nil)
	ctx := withKey(ctx5s(t), keyFor(t))
	for i := range 3 {
		_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
		if want := codes.OK; i == 2 {
			want = codes.ResourceExhausted
			if status.Code(err) != want {
				t.Fatalf("plain call %d: %v, want the reserve kept", i+1, err)
			}
		} else if err != nil {
			t.Fatalf("plain call %d: %v", i+1, err)
		}
	}
	if _, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{}); err != nil {
		t.Errorf("critical call: %v, want the reserve", err)
	}
	if _, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("critical call past the limit: %v", err)
	}
}

// A policy in shadow serves every call, counts them as an enforced one would, and reports the
// calls it would have refused; EnforcePercent 100 of a second policy enforces it for every key.
func TestGRPCShadow(t *testing.T) {
	tg := servers(t)[0]
	var mu sync.Mutex
	var denied []string
	limit := client.FixedWindow{Limit: 1, Window: time.Minute}
	c := grpcPair(t, harness.NewLimiter(t, tg.c, slowMachine), grpclimit.ServerOptions{
		Methods: map[string]grpclimit.Policy{
			"/grpc.testing.TestService/EmptyCall": {Name: "new", Limit: limit, Shadow: true},
			"/grpc.testing.TestService/UnaryCall": {Name: "all", Limit: limit, EnforcePercent: 100},
		},
		OnShadowDeny: func(_ context.Context, method, policy string) {
			mu.Lock()
			denied = append(denied, method+" "+policy)
			mu.Unlock()
		},
	}, nil, nil)
	ctx := withKey(ctx5s(t), keyFor(t))
	for i := range 3 {
		var md metadata.MD
		if _, err := c.EmptyCall(ctx, &testgrpc.Empty{}, grpc.Header(&md)); err != nil || len(md.Get("ratelimit")) > 0 {
			t.Fatalf("shadow call %d: %v, metadata %v; want served, no quota state", i+1, err, md)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(denied)
		mu.Unlock()
		if n == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	if len(denied) != 2 || denied[0] != "/grpc.testing.TestService/EmptyCall new" {
		t.Errorf("would have denied %v, want the 2nd and 3rd calls of policy new", denied)
	}
	mu.Unlock()
	c.UnaryCall(ctx, &testgrpc.SimpleRequest{})
	if _, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("EnforcePercent 100, call 2: %v, want refused", err)
	}
}

// Over a real loopback connection, where the network gives what a key is read from: the
// client's address (Peer), and over mutual TLS the identity the server verified
// (TLSIdentity). Each principal has its own budget of one call.
func TestGRPCLoopbackKeys(t *testing.T) {
	tg := servers(t)[0]
	lim := harness.NewLimiter(t, tg.c, slowMachine)
	ca, caKey := newCA(t)
	serverCert := issue(t, ca, caKey, "localhost", x509.ExtKeyUsageServerAuth)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	suffix := strconv.FormatInt(time.Now().UnixNano(), 10) // policies of this run alone
	for _, tt := range []struct {
		name  string
		key   grpclimit.Key
		creds func(cn string) (grpc.ServerOption, grpc.DialOption)
		want  string // the principal
	}{
		{"peer", grpclimit.Peer, func(string) (grpc.ServerOption, grpc.DialOption) {
			return grpc.EmptyServerOption{}, grpc.WithTransportCredentials(insecure.NewCredentials())
		}, "127.0.0.1"},
		{"tls", grpclimit.TLSIdentity, func(cn string) (grpc.ServerOption, grpc.DialOption) {
			return grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{serverCert},
					ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert})),
				grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "localhost",
					Certificates: []tls.Certificate{issue(t, ca, caKey, cn, x509.ExtKeyUsageClientAuth)}}))
		}, "billing-" + suffix},
	} {
		t.Run(tt.name, func(t *testing.T) {
			name := tt.name + "-" + suffix
			limit := client.FixedWindow{Limit: 1, Window: time.Minute}
			s, err := grpclimit.NewServer(lim, grpclimit.ServerOptions{Key: tt.key, Default: grpclimit.Policy{Name: name, Limit: limit}})
			if err != nil {
				t.Fatal(err)
			}
			sopt, dopt := tt.creds("billing-" + suffix)
			srv := grpc.NewServer(sopt, grpc.UnaryInterceptor(s.UnaryInterceptor()))
			testgrpc.RegisterTestServiceServer(srv, testService{})
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go srv.Serve(lis)
			t.Cleanup(srv.Stop)
			conn, err := grpc.NewClient(lis.Addr().String(), dopt)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			c := testgrpc.NewTestServiceClient(conn)
			if _, err := c.EmptyCall(ctx5s(t), &testgrpc.Empty{}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.EmptyCall(ctx5s(t), &testgrpc.Empty{}); status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("call 2: %v, want ResourceExhausted", err)
			}
			if got := remaining(t, lim, name, tt.want, limit); got != 0 {
				t.Errorf("%s's window has %d left, want 0: the calls were not counted against it", tt.want, got)
			}
		})
	}
}

// newCA makes a certificate authority for the test's TLS.
func newCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rlfn test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return ca, key
}

// issue makes a certificate of cn signed by ca, for usage.
func issue(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		DNSNames: []string{cn}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
