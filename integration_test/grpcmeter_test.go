package integration_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/grpclimit"
	"github.com/rlfn/rlfn/internal/harness"
)

// meterService streams what a StreamingOutputCall asks: a message of Size bytes per
// ResponseParameters, IntervalUs apart, until one cannot be sent. Its payload says how it
// ends: "ignore" sends on past a refused message and returns nil, "fail" returns Aborted,
// "panic" panics, "cost=N" sets the trailer rlfn-cost to N; else it returns the send's error,
// or nil. UnaryCall answers a payload of ResponseSize bytes.
type meterService struct {
	testgrpc.UnimplementedTestServiceServer
}

func (meterService) UnaryCall(_ context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Payload: &testgrpc.Payload{Body: make([]byte, req.GetResponseSize())}}, nil
}

func (meterService) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, stream testgrpc.TestService_StreamingOutputCallServer) error {
	mode := string(req.GetPayload().GetBody())
	for _, p := range req.GetResponseParameters() {
		if d := p.GetIntervalUs(); d > 0 {
			time.Sleep(time.Duration(d) * time.Microsecond)
		}
		err := stream.Send(&testgrpc.StreamingOutputCallResponse{Payload: &testgrpc.Payload{Body: make([]byte, p.GetSize())}})
		if err != nil && mode != "ignore" {
			return err
		}
	}
	switch {
	case mode == "fail":
		return status.Error(codes.Aborted, "the handler failed")
	case mode == "panic":
		panic("the handler panicked")
	case strings.HasPrefix(mode, "cost="):
		stream.SetTrailer(metadata.Pairs("rlfn-cost", strings.TrimPrefix(mode, "cost=")))
	}
	return nil
}

// payloadUnits is a StreamMeter's Units: a message's payload bytes.
func payloadUnits(msg any) int64 {
	switch m := msg.(type) {
	case *testgrpc.StreamingOutputCallResponse:
		return int64(len(m.GetPayload().GetBody()))
	case *testgrpc.SimpleResponse:
		return int64(len(m.GetPayload().GetBody()))
	}
	return 0
}

// estimateOf is a Cost that reads a call's estimate from its "x-estimate" metadata.
func estimateOf(ctx context.Context, _ string, _ any) int64 {
	v := metadata.ValueFromIncomingContext(ctx, "x-estimate")
	if len(v) == 0 {
		return 0
	}
	n, err := strconv.ParseInt(v[0], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// meterPair serves meterService behind the server interceptors of opts (recovering a panic
// outside them, as a service's own recovery would) over an in-memory connection, and returns
// a real client of it. Calls count against the key in their "x-key" metadata.
func meterPair(t *testing.T, lim grpclimit.Decider, opts grpclimit.ServerOptions) testgrpc.TestServiceClient {
	t.Helper()
	opts.Key = grpclimit.Metadata("x-key")
	s, err := grpclimit.NewServer(lim, opts)
	if err != nil {
		t.Fatal(err)
	}
	recovered := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = status.Errorf(codes.Internal, "panic: %v", v)
			}
		}()
		return handler(srv, ss)
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.UnaryInterceptor(s.UnaryInterceptor()), grpc.ChainStreamInterceptor(recovered, s.StreamInterceptor()))
	testgrpc.RegisterTestServiceServer(srv, meterService{})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return testgrpc.NewTestServiceClient(conn)
}

// tokensPolicy meters every message's payload bytes against limit, the estimate from the
// call's metadata.
func tokensPolicy(limit client.Limit) grpclimit.Policy {
	return grpclimit.Policy{Name: "tokens", Limit: limit, Cost: estimateOf, Unit: "tokens",
		Meter: &grpclimit.StreamMeter{Units: payloadUnits}}
}

// streamOf asks for n messages of size bytes, gap apart, ending by mode.
func streamOf(n, size int, gap time.Duration, mode string) *testgrpc.StreamingOutputCallRequest {
	req := &testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: []byte(mode)}}
	for range n {
		req.ResponseParameters = append(req.ResponseParameters, &testgrpc.ResponseParameters{Size: int32(size), IntervalUs: int32(gap / time.Microsecond)})
	}
	return req
}

// receive reads a stream to its end: the messages and payload bytes received, and its status
// (nil for OK).
func receive(stream grpc.ServerStreamingClient[testgrpc.StreamingOutputCallResponse]) (msgs, units int64, err error) {
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return msgs, units, nil
		}
		if err != nil {
			return msgs, units, err
		}
		msgs++
		units += int64(len(m.GetPayload().GetBody()))
	}
}

// meterCtx is a call's context with its key and estimate.
func meterCtx(ctx context.Context, key string, estimate int64) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "x-key", key, "x-estimate", strconv.FormatInt(estimate, 10))
}

// never is a fixed window that does not reset while a test runs (10^11 ms).
func never(limit int64) client.FixedWindow {
	return client.FixedWindow{Limit: limit, Window: 100_000_000_000 * time.Millisecond}
}

// A stream of 100 messages of 30 units under a budget of 1,000 is cut at the budget: the
// client receives 33 messages (990 units) and then ResourceExhausted, saying the budget ran
// out and naming the limit, with its ratelimit trailers; the server's charged and held units
// are never sampled above 1,000, and the call is charged the 990 sent. A handler that ignores
// the refused send and returns OK ends the same way.
func TestGRPCMeterCutsAtTheBudget(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		const budget, n, k = 1000, 100, 30
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		limit := never(budget)
		c := meterPair(t, lim, grpclimit.ServerOptions{Default: tokensPolicy(limit)})
		for _, mode := range []string{"", "ignore"} {
			t.Run("mode="+mode, func(t *testing.T) {
				key := keyFor(t)
				srvKey := grpclimit.LimiterKey("tokens", key)
				keys := []string{lim.Key(srvKey, limit), holdKeyOf(lim, srvKey, limit)}
				stop := sampleBudget(t, tg.c, keys, budget)
				stream, err := c.StreamingOutputCall(meterCtx(ctx5s(t), key, 100), streamOf(n, k, 0, mode))
				if err != nil {
					t.Fatal(err)
				}
				msgs, units, err := receive(stream)
				samples, worst := stop()
				st := status.Convert(err)
				if st.Code() != codes.ResourceExhausted || st.Message() != "grpclimit: budget of policy tokens ran out: the stream is cut" {
					t.Fatalf("after %d messages: %v; want the cut", msgs, err)
				}
				if _, quota := details(t, err); quota.GetViolations()[0].GetQuotaId() != "tokens" {
					t.Errorf("QuotaFailure %v, want tokens", quota)
				}
				tr := stream.Trailer()
				if got := tr.Get(grpclimit.MetadataRateLimit); len(got) != 1 || !strings.HasPrefix(got[0], `"tokens";r=`) {
					t.Errorf("trailer ratelimit %q", got)
				}
				charged, held := sample(t, tg.c, keys)
				t.Logf("%d messages, %d units received; %d charged, %d held; %d samples, at most %d", msgs, units, charged, held, samples, worst)
				if msgs != budget/k || units != msgs*k {
					t.Errorf("received %d messages (%d units), want %d", msgs, units, budget/k)
				}
				if charged != units || held != 0 {
					t.Errorf("%d charged, %d held; want %d, 0", charged, held, units)
				}
			})
		}
	})
}

// 100 streams at once share a budget of 5,000 units, each asking for 40 messages of 5 (200
// units, estimate 50): a sampler never sees the server's charged and held units above the
// budget; the streams the budget cannot carry are cut (or refused when it is spent); in the
// end the server charged exactly what the clients received, at most the budget, and holds
// nothing.
func TestGRPCMetersShareABudget(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		const budget, streams, n, k = 5000, 100, 40, 5
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		limit := never(budget)
		c := meterPair(t, lim, grpclimit.ServerOptions{Default: tokensPolicy(limit)})
		key := keyFor(t)
		srvKey := grpclimit.LimiterKey("tokens", key)
		keys := []string{lim.Key(srvKey, limit), holdKeyOf(lim, srvKey, limit)}
		stop := sampleBudget(t, tg.c, keys, budget)
		ctx := meterCtx(ctx5s(t), key, 50)
		var received, cut, refused, whole atomic.Int64
		var wg sync.WaitGroup
		for range streams {
			wg.Go(func() {
				stream, err := c.StreamingOutputCall(ctx, streamOf(n, k, 100*time.Microsecond, ""))
				if err != nil {
					t.Error(err)
					return
				}
				msgs, units, err := receive(stream)
				received.Add(units)
				st := status.Convert(err)
				switch {
				case err == nil:
					whole.Add(1)
				case st.Code() == codes.ResourceExhausted && strings.HasSuffix(st.Message(), "the stream is cut"):
					cut.Add(1)
				case st.Code() == codes.ResourceExhausted && msgs == 0:
					refused.Add(1)
				default:
					t.Errorf("after %d messages: %v", msgs, err)
				}
			})
		}
		wg.Wait()
		samples, worst := stop()
		charged, held := sample(t, tg.c, keys)
		t.Logf("%d streams: %d whole, %d cut, %d refused; %d units received, %d charged (%d short of the budget), %d held; %d samples, at most %d",
			streams, whole.Load(), cut.Load(), refused.Load(), received.Load(), charged, budget-charged, held, samples, worst)
		if charged != received.Load() || charged > budget || held != 0 {
			t.Errorf("%d charged, %d held, %d received; want charged = received <= %d, nothing held", charged, held, received.Load(), budget)
		}
		if samples < 3 {
			t.Errorf("%d samples: the sampler never saw the streams run", samples)
		}
		if cut.Load() == 0 || charged < budget*9/10 {
			t.Errorf("%d cut, %d charged: the budget never ran out", cut.Load(), charged)
		}
	})
}

// A call is charged what it sent, the rest of its hold given back, however it ends: a stream
// that ends before its estimate, one that fails, one that panics, one its client cancels; a
// cost trailer replaces the units sent; a unary call is charged its response.
func TestGRPCMeterSettlesWhatWasSent(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		limit := never(100_000)
		c := meterPair(t, lim, grpclimit.ServerOptions{Default: tokensPolicy(limit),
			Methods: map[string]grpclimit.Policy{"/grpc.testing.TestService/StreamingOutputCall": func() grpclimit.Policy {
				p := tokensPolicy(limit)
				p.Outcome = &grpclimit.Outcome{CostTrailer: "rlfn-cost"}
				return p
			}()}})
		for _, tt := range []struct {
			name string
			call func(ctx context.Context) error
			want int64
		}{
			{"ended early", func(ctx context.Context) error { return stream(c, ctx, streamOf(10, 5, 0, "")) }, 50},
			{"failed", func(ctx context.Context) error { return stream(c, ctx, streamOf(10, 5, 0, "fail")) }, 50},
			{"panicked", func(ctx context.Context) error { return stream(c, ctx, streamOf(10, 5, 0, "panic")) }, 50},
			{"cost trailer", func(ctx context.Context) error { return stream(c, ctx, streamOf(10, 5, 0, "cost=7")) }, 7},
			{"unary", func(ctx context.Context) error {
				_, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{ResponseSize: 70})
				return err
			}, 70},
		} {
			t.Run(tt.name, func(t *testing.T) {
				key := keyFor(t)
				srvKey := grpclimit.LimiterKey("tokens", key)
				keys := []string{lim.Key(srvKey, limit), holdKeyOf(lim, srvKey, limit)}
				err := tt.call(meterCtx(ctx5s(t), key, 500))
				t.Logf("ended: %v", err)
				if charged, held := sample(t, tg.c, keys); charged != tt.want || held != 0 {
					t.Errorf("%d charged, %d held; want %d, 0", charged, held, tt.want)
				}
			})
		}
		t.Run("cancelled", func(t *testing.T) {
			key := keyFor(t)
			srvKey := grpclimit.LimiterKey("tokens", key)
			keys := []string{lim.Key(srvKey, limit), holdKeyOf(lim, srvKey, limit)}
			ctx, cancel := context.WithCancel(meterCtx(ctx5s(t), key, 500))
			s, err := c.StreamingOutputCall(ctx, streamOf(1000, 5, time.Millisecond, ""))
			if err != nil {
				t.Fatal(err)
			}
			for range 5 {
				if _, err := s.Recv(); err != nil {
					t.Fatal(err)
				}
			}
			cancel()
			// the handler notices at its next send; the settle follows
			deadline := time.Now().Add(5 * time.Second)
			charged, held := sample(t, tg.c, keys)
			for held != 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
				charged, held = sample(t, tg.c, keys)
			}
			if held != 0 || charged < 25 || charged >= 500 {
				t.Errorf("%d charged, %d held; want what was sent (25 and a few more), nothing held", charged, held)
			}
		})
	})
}

// A policy of calls and tokens on one key (AlsoLimit.SameKey) meters the tokens alone, the
// limit with a Cost: the call holds 1 call and its estimate, one rl_multi, and is charged 1
// call and the tokens it sent.
func TestGRPCMeterCallsAndTokens(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		calls, tokens := never(100), never(100_000)
		tokens.Name = "tokens"
		c := meterPair(t, lim, grpclimit.ServerOptions{Default: grpclimit.Policy{Name: "calls", Limit: calls,
			Also:  []grpclimit.AlsoLimit{{Name: "tokens", Limit: tokens, Cost: estimateOf, SameKey: true}},
			Meter: &grpclimit.StreamMeter{Units: payloadUnits}}})
		key := keyFor(t)
		srvKey := grpclimit.LimiterKey("calls", key)
		if err := stream(c, meterCtx(ctx5s(t), key, 500), streamOf(30, 5, 0, "")); err != nil {
			t.Fatal(err)
		}
		nc, hc := sample(t, tg.c, []string{lim.Key(srvKey, calls), holdKeyOf(lim, srvKey, calls)})
		nt, ht := sample(t, tg.c, []string{lim.Key(srvKey, tokens), holdKeyOf(lim, srvKey, tokens)})
		if nc != 1 || nt != 150 || hc+ht != 0 {
			t.Errorf("calls %d (held %d), tokens %d (held %d); want 1 and 150, nothing held", nc, hc, nt, ht)
		}
	})
}

// An Outcome whose Count leaves out ResourceExhausted (Successes) does not make a cut stream
// free: the cut is the budget's, and the stream is charged what it sent, so a second stream
// finds the budget spent.
func TestGRPCMeterCutCountsWhatItSent(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		limit := never(1000)
		p := tokensPolicy(limit)
		p.Outcome = &grpclimit.Outcome{Count: grpclimit.Successes}
		c := meterPair(t, lim, grpclimit.ServerOptions{Default: p})
		key := keyFor(t)
		srvKey := grpclimit.LimiterKey("tokens", key)
		keys := []string{lim.Key(srvKey, limit), holdKeyOf(lim, srvKey, limit)}
		s, err := c.StreamingOutputCall(meterCtx(ctx5s(t), key, 100), streamOf(100, 30, 0, ""))
		if err != nil {
			t.Fatal(err)
		}
		msgs, _, err := receive(s)
		if status.Code(err) != codes.ResourceExhausted || msgs != 33 {
			t.Fatalf("%d messages, %v; want 33 and the cut", msgs, err)
		}
		if charged, held := sample(t, tg.c, keys); charged != 990 || held != 0 {
			t.Fatalf("the cut stream: %d charged, %d held; want 990, 0", charged, held)
		}
		s, err = c.StreamingOutputCall(meterCtx(ctx5s(t), key, 100), streamOf(100, 30, 0, ""))
		if err == nil {
			msgs, _, err = receive(s)
		}
		if status.Code(err) != codes.ResourceExhausted || msgs > 0 {
			t.Fatalf("the next stream: %d messages, %v; want none and ResourceExhausted", msgs, err)
		}
	})
}

// A calls-and-tokens policy whose tokens limit is in shadow (being rolled out) meters
// nothing: the calls limit is charged 1 a call, not metered per token in the tokens' place.
func TestGRPCMeterShadowTokens(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		calls, tokens := never(100), never(100_000)
		tokens.Name = "tokens"
		c := meterPair(t, lim, grpclimit.ServerOptions{Default: grpclimit.Policy{Name: "calls", Limit: calls,
			Also:  []grpclimit.AlsoLimit{{Name: "tokens", Limit: tokens, Cost: estimateOf, SameKey: true, Shadow: true}},
			Meter: &grpclimit.StreamMeter{Units: payloadUnits}}})
		key := keyFor(t)
		srvKey := grpclimit.LimiterKey("calls", key)
		if err := stream(c, meterCtx(ctx5s(t), key, 500), streamOf(30, 5, 0, "")); err != nil {
			t.Fatalf("a stream of 150 tokens under 100 calls: %v", err)
		}
		if nc, hc := sample(t, tg.c, []string{lim.Key(srvKey, calls), holdKeyOf(lim, srvKey, calls)}); nc != 1 || hc != 0 {
			t.Errorf("calls charged %d (held %d), want 1", nc, hc)
		}
	})
}

// A unary response whose Units is negative is a misconfiguration: reported to OnError, and
// charged as nothing sent.
func TestGRPCMeterNegativeUnary(t *testing.T) {
	tg := servers(t)[0]
	lim := harness.NewLimiter(t, tg.c, slowMachine)
	limit := never(1000)
	var mu sync.Mutex
	var reported []error
	c := meterPair(t, lim, grpclimit.ServerOptions{
		Default: grpclimit.Policy{Name: "tokens", Limit: limit, Cost: estimateOf, Meter: &grpclimit.StreamMeter{Units: func(any) int64 { return -1 }}},
		OnError: func(_ context.Context, _ string, err error) {
			mu.Lock()
			defer mu.Unlock()
			reported = append(reported, err)
		}})
	key := keyFor(t)
	if _, err := c.UnaryCall(meterCtx(ctx5s(t), key, 500), &testgrpc.SimpleRequest{ResponseSize: 70}); err != nil {
		t.Fatal(err)
	}
	srvKey := grpclimit.LimiterKey("tokens", key)
	if charged, held := sample(t, tg.c, []string{lim.Key(srvKey, limit), holdKeyOf(lim, srvKey, limit)}); charged != 0 || held != 0 {
		t.Errorf("%d charged, %d held; want 0, 0", charged, held)
	}
	mu.Lock()
	defer mu.Unlock()
	var pe *grpclimit.PolicyError
	if len(reported) != 1 || !errors.As(reported[0], &pe) {
		t.Errorf("reported %v, want one *PolicyError", reported)
	}
}

// stream runs a StreamingOutputCall to its end and returns its status.
func stream(c testgrpc.TestServiceClient, ctx context.Context, req *testgrpc.StreamingOutputCallRequest) error {
	s, err := c.StreamingOutputCall(ctx, req)
	if err != nil {
		return err
	}
	_, _, err = receive(s)
	return err
}

// A stream of 4,000 units (400 messages of 10) with an estimate of 500 costs the server a
// handful of calls, counted by it (INFO commandstats): the hold, the batches that grow, the
// settle; at most 10.
func TestGRPCMeterCallsAStream(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		if tg.name == "cluster" {
			t.Skip("the calls are counted on one node")
		}
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		c := meterPair(t, lim, grpclimit.ServerOptions{Default: tokensPolicy(never(1_000_000))})
		calls := func() int64 {
			var n int64
			for _, cmd := range []string{"fcall", "fcall_ro", "evalsha", "eval"} {
				st, err := harness.CommandStats(context.Background(), tg.c, cmd)
				if err != nil {
					t.Fatal(err)
				}
				n += st.Calls
			}
			return n
		}
		before := calls()
		s, err := c.StreamingOutputCall(meterCtx(ctx5s(t), keyFor(t), 500), streamOf(400, 10, 0, ""))
		if err != nil {
			t.Fatal(err)
		}
		msgs, units, err := receive(s)
		got := calls() - before
		t.Logf("%d messages, %d units: %d server calls", msgs, units, got)
		if err != nil || units != 4000 {
			t.Fatalf("%d units, %v", units, err)
		}
		if got > 10 {
			t.Errorf("%d server calls for a 4,000-unit stream, want at most 10", got)
		}
	})
}

// A policy that meters is refused at NewServer when it cannot work: its Units missing, its
// Limiter unable to hold units, a SlidingLog, check first.
func TestGRPCMeterRefused(t *testing.T) {
	tg := servers(t)[0]
	lim := harness.NewLimiter(t, tg.c, slowMachine)
	units := &grpclimit.StreamMeter{Units: payloadUnits}
	for _, tt := range []struct {
		name string
		lim  grpclimit.Decider
		p    grpclimit.Policy
		want error
	}{
		{"no units", lim, grpclimit.Policy{Limit: never(10), Meter: &grpclimit.StreamMeter{}}, nil},
		{"no meterer", allowOnlyLimiter{lim}, grpclimit.Policy{Limit: never(10), Meter: units}, grpclimit.ErrNoMeterer},
		{"sliding log", lim, grpclimit.Policy{Limit: client.SlidingLog{Limit: 10, Window: time.Second}, Meter: units}, nil},
		{"check first", lim, grpclimit.Policy{Limit: never(10), Meter: units, Outcome: &grpclimit.Outcome{CheckFirst: true}}, nil},
		{"no limit", lim, grpclimit.Policy{Concurrency: &client.Concurrency{Limit: 1, Lease: time.Second}, Meter: units}, nil},
		{"a meter alone", lim, grpclimit.Policy{Meter: units}, nil},
		{"a meter alone without units", lim, grpclimit.Policy{Meter: &grpclimit.StreamMeter{}}, nil},
		{"ttl", lim, grpclimit.Policy{Limit: never(10), Meter: &grpclimit.StreamMeter{Units: payloadUnits, TTL: time.Microsecond}}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := grpclimit.NewServer(tt.lim, grpclimit.ServerOptions{Key: grpclimit.Peer, Default: tt.p})
			var ce *grpclimit.ConfigError
			var pe *grpclimit.PolicyError
			switch {
			case s != nil || !errors.As(err, &ce) || ce.Field != "Default":
				t.Fatalf("NewServer = %v, %v; want a *ConfigError of Default", s, err)
			case tt.want != nil && !errors.Is(err, tt.want):
				t.Errorf("%v, want %v", err, tt.want)
			case tt.want == nil && !errors.As(err, &pe):
				t.Errorf("%v, want a *PolicyError", err)
			}
			t.Log(err)
		})
	}
	if got := grpclimit.Needs(grpclimit.Policy{Limit: never(10), Meter: units}); got != "1.3.0" {
		t.Errorf("Needs = %q, want 1.3.0", got)
	}
}

// allowOnlyLimiter is a Limiter that can only decide, not hold.
type allowOnlyLimiter struct{ l *client.Limiter }

func (a allowOnlyLimiter) Allow(ctx context.Context, key string, l client.Limit) (client.Result, error) {
	return a.l.Allow(ctx, key, l)
}
