package integration_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/grpclimit"
	"github.com/rlfn/rlfn/client/httplimit"
	"github.com/rlfn/rlfn/internal/harness"
)

// remaining is what a limit of name holds for principal now, peeked.
func remaining(t *testing.T, lim *client.Limiter, name, principal string, l client.Limit) int64 {
	t.Helper()
	res, err := lim.PeekN(ctx5s(t), httplimit.LimiterKey(name, principal), l, 0)
	if err != nil {
		t.Fatal(err)
	}
	return res.Remaining
}

// outcomeHandler answers by the request's path: /ok 200, /fail 401, /error an error handler's
// 503, /panic a panic, /cost/N 200 with the cost N in a trailer, /header/N in a header,
// /stream 200 flushed then a trailer cost of 7, /hijack a hijacked connection.
func outcomeHandler(w http.ResponseWriter, r *http.Request) {
	switch p := r.URL.Path; {
	case p == "/ok":
		io.WriteString(w, "ok")
	case p == "/fail":
		w.WriteHeader(http.StatusUnauthorized)
	case p == "/error":
		http.Error(w, "down", http.StatusServiceUnavailable)
	case p == "/panic":
		panic(http.ErrAbortHandler)
	case strings.HasPrefix(p, "/cost/"):
		io.WriteString(w, "ok")
		w.Header().Set(http.TrailerPrefix+"Rlfn-Cost", strings.TrimPrefix(p, "/cost/"))
	case strings.HasPrefix(p, "/header/"):
		w.Header().Set("Rlfn-Cost", strings.TrimPrefix(p, "/header/"))
	case p == "/stream":
		io.WriteString(w, "part")
		w.(http.Flusher).Flush()
		w.Header().Set(http.TrailerPrefix+"Rlfn-Cost", "7")
	case p == "/hijack":
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n")
		buf.Flush()
		conn.Close()
	}
}

// A login limit that counts failures only, over real HTTP on every server: the unit taken
// before the handler is given back when the request succeeds, kept when it fails; the third
// failure is refused.
func TestOutcomeHTTPCountsFailures(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		limit := client.FixedWindow{Limit: 2, Window: time.Minute}
		srv := limitedServer(t, lim, httplimit.Options{Policy: func(*http.Request) httplimit.Policy {
			return httplimit.Policy{Name: "login", Limit: limit, Outcome: &httplimit.Outcome{Count: httplimit.Failures}}
		}}, http.HandlerFunc(outcomeHandler))
		key := keyFor(t)
		for range 4 {
			if r := get(t, srv.URL+"/ok", key); r.status != http.StatusOK {
				t.Fatalf("a success: %d", r.status)
			}
		}
		if got := remaining(t, lim, "login", key, limit); got != 2 {
			t.Fatalf("after 4 successes, %d left, want 2: each given back", got)
		}
		for i := range 2 {
			if r := get(t, srv.URL+"/fail", key); r.status != http.StatusUnauthorized {
				t.Fatalf("failure %d: %d", i+1, r.status)
			}
		}
		if r := get(t, srv.URL+"/ok", key); r.status != http.StatusTooManyRequests {
			t.Fatalf("after 2 failures: %d, want 429", r.status)
		}
	})
}

// Check first, charge only failures: successes take nothing at all, a failure is charged
// after, and once the failures spent the limit, the peek refuses.
func TestOutcomeHTTPCheckFirst(t *testing.T) {
	tg := servers(t)[0]
	lim := harness.NewLimiter(t, tg.c, slowMachine)
	limit := client.FixedWindow{Limit: 2, Window: time.Minute}
	srv := limitedServer(t, lim, httplimit.Options{Policy: func(*http.Request) httplimit.Policy {
		return httplimit.Policy{Name: "login", Limit: limit, Outcome: &httplimit.Outcome{Count: httplimit.Failures, CheckFirst: true}}
	}}, http.HandlerFunc(outcomeHandler))
	key := keyFor(t)
	r := get(t, srv.URL+"/ok", key)
	if r.status != http.StatusOK || r.header.Get("RateLimit") == "" {
		t.Fatalf("a success: %d %v", r.status, r.header)
	}
	if got := remaining(t, lim, "login", key, limit); got != 2 {
		t.Fatalf("after a success, %d left, want 2: nothing taken", got)
	}
	get(t, srv.URL+"/fail", key)
	if got := remaining(t, lim, "login", key, limit); got != 1 {
		t.Fatalf("after a failure, %d left, want 1", got)
	}
	get(t, srv.URL+"/error", key) // an error handler's 503 is a failure too
	if r := get(t, srv.URL+"/ok", key); r.status != http.StatusTooManyRequests {
		t.Fatalf("after 2 failures: %d, want 429", r.status)
	}
}

// The outcome is read however the handler ends: a cost in a trailer or a header, a streamed
// response, a panic, a hijacked connection.
func TestOutcomeHTTPEndings(t *testing.T) {
	tg := servers(t)[0]
	lim := harness.NewLimiter(t, tg.c, slowMachine)
	limit := client.TokenBucket{Capacity: 1000, Rate: 1, Period: time.Hour}
	srv := limitedServer(t, lim, httplimit.Options{Policy: func(*http.Request) httplimit.Policy {
		return httplimit.Policy{Name: "tokens", Limit: limit,
			Outcome: &httplimit.Outcome{Count: httplimit.Successes, CostHeader: "Rlfn-Cost"}}
	}}, http.HandlerFunc(outcomeHandler))
	for _, tt := range []struct {
		path string
		want int64 // left of 1000 after the request
	}{
		{"/cost/300", 700},  // a trailer's cost
		{"/header/40", 960}, // a header's
		{"/stream", 993},    // a trailer set after the body was flushed
		{"/ok", 999},        // no cost reported: 1
		{"/fail", 1000},     // a failure does not count: given back
		{"/error", 1000},
		{"/panic", 1000},    // a panic is a 500
		{"/hijack", 999},    // 101: a success
		{"/cost/nope", 999}, // no number: 1
		{"/cost/5000", 0},   // more than the bucket holds: what is left
	} {
		t.Run(strings.TrimPrefix(tt.path, "/"), func(t *testing.T) {
			key := keyFor(t)
			req, _ := http.NewRequest(http.MethodGet, srv.URL+tt.path, nil)
			req.Header.Set("X-Key", key)
			if tt.path == "/hijack" {
				req.Header.Set("Connection", "Upgrade")
				req.Header.Set("Upgrade", "test")
			}
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				io.Copy(io.Discard, bufio.NewReader(resp.Body))
				resp.Body.Close()
			} else if tt.path != "/panic" {
				t.Fatal(err)
			}
			// A panic or a hijack ends the exchange before the handler returns: wait for its
			// settlement.
			deadline := time.Now().Add(5 * time.Second)
			for remaining(t, lim, "tokens", key, limit) != tt.want && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if got := remaining(t, lim, "tokens", key, limit); got != tt.want {
				t.Errorf("%d left, want %d", got, tt.want)
			}
		})
	}
}

// failingRefunds is a real limiter whose refunds fail.
type failingRefunds struct{ *client.Limiter }

var errRefund = errors.New("refund lost")

func (failingRefunds) Refund(context.Context, string, client.Limit, int64) (client.Result, error) {
	return client.Result{}, errRefund
}

// A refund that fails is not retried: it goes to OnError as an *UnsettledError and is counted
// in the metric, by policy.
func TestOutcomeUnsettledCounted(t *testing.T) {
	tg := servers(t)[0]
	lim := failingRefunds{harness.NewLimiter(t, tg.c, slowMachine)}
	reader := metric.NewManualReader()
	var mu sync.Mutex
	var errs []error
	srv := limitedServer(t, lim, httplimit.Options{
		Policy: func(*http.Request) httplimit.Policy {
			return httplimit.Policy{Name: "login", Limit: client.FixedWindow{Limit: 5, Window: time.Minute},
				Outcome: &httplimit.Outcome{Count: httplimit.Failures}}
		},
		MeterProvider: metric.NewMeterProvider(metric.WithReader(reader)),
		OnError:       func(_ *http.Request, err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() },
	}, http.HandlerFunc(outcomeHandler))
	get(t, srv.URL+"/ok", keyFor(t))
	var ue *httplimit.UnsettledError
	if len(errs) != 1 || !errors.As(errs[0], &ue) || !errors.Is(errs[0], errRefund) || fmt.Sprint(ue.Taken, ue.Owed) != "[1] [0]" {
		t.Fatalf("OnError got %v, want one *UnsettledError from 1 to 0", errs)
	}
	if got := counterSum(t, reader, httplimit.MetricUnsettled, "login"); got != 1 {
		t.Errorf("%s = %d, want 1", httplimit.MetricUnsettled, got)
	}

	// The same through the gRPC interceptors.
	greader := metric.NewManualReader()
	errs = nil
	c := grpcPair(t, lim, grpclimit.ServerOptions{
		Default: grpclimit.Policy{Name: "login", Limit: client.FixedWindow{Limit: 5, Window: time.Minute},
			Outcome: &grpclimit.Outcome{Count: grpclimit.Failures}},
		MeterProvider: metric.NewMeterProvider(metric.WithReader(greader)),
		OnError:       func(_ context.Context, _ string, err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() },
	}, nil, nil)
	if _, err := c.UnaryCall(withKey(ctx5s(t), keyFor(t)), &testgrpc.SimpleRequest{}); err != nil {
		t.Fatal(err)
	}
	var gue *grpclimit.UnsettledError
	if len(errs) != 1 || !errors.As(errs[0], &gue) || !errors.Is(errs[0], errRefund) {
		t.Fatalf("OnError got %v, want one *grpclimit.UnsettledError", errs)
	}
	if got := counterSum(t, greader, grpclimit.MetricUnsettled, "login"); got != 1 {
		t.Errorf("%s = %d, want 1", grpclimit.MetricUnsettled, got)
	}
}

// counterSum is the sum of the counter name's points of policy.
func counterSum(t *testing.T, r *metric.ManualReader, name, policy string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, ok := dp.Attributes.Value("rlfn.policy"); ok && v.AsString() == policy {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// gRPC calls counted by their status, on every server: successes given back, failures kept,
// then a refusal.
func TestOutcomeGRPCCountsFailures(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		limit := client.FixedWindow{Limit: 2, Window: time.Minute}
		c := grpcPair(t, lim, grpclimit.ServerOptions{
			Default: grpclimit.Policy{Name: "login", Limit: limit, Outcome: &grpclimit.Outcome{Count: grpclimit.Failures}},
		}, nil, nil)
		key := keyFor(t)
		ctx := withKey(ctx5s(t), key)
		for range 3 {
			if _, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{}); err != nil {
				t.Fatal(err)
			}
		}
		if got := remaining(t, lim, "login", key, limit); got != 2 {
			t.Fatalf("after 3 successes, %d left, want 2", got)
		}
		fail := &testgrpc.SimpleRequest{ResponseStatus: &testgrpc.EchoStatus{Code: int32(codes.Unauthenticated)}}
		for range 2 {
			if _, err := c.UnaryCall(ctx, fail); status.Code(err) != codes.Unauthenticated {
				t.Fatalf("a failure: %v", err)
			}
		}
		if _, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{}); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("after 2 failures: %v, want ResourceExhausted", err)
		}
	})
}

// The outcome of a gRPC call is read however it ends: a cost in a trailer, a panic (settled,
// then passed on to an outer recovery), a stream cancelled, failed or with a cost; and check
// first takes nothing from a success.
func TestOutcomeGRPCEndings(t *testing.T) {
	tg := servers(t)[0]
	lim := harness.NewLimiter(t, tg.c, slowMachine)
	limit := client.TokenBucket{Capacity: 1000, Rate: 1, Period: time.Hour}
	recovered := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if v := recover(); v != nil {
				err = status.Errorf(codes.Internal, "panic: %v", v)
			}
		}()
		return handler(ctx, req)
	}
	ended := make(chan struct{}, 1)
	signal := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		defer func() { ended <- struct{}{} }()
		return handler(srv, ss)
	}
	c := grpcPairWith(t, lim, grpclimit.ServerOptions{
		Default: grpclimit.Policy{Name: "tokens", Limit: limit,
			Outcome: &grpclimit.Outcome{Count: grpclimit.Successes, CostTrailer: "rlfn-cost"}},
		Methods: map[string]grpclimit.Policy{"/grpc.testing.TestService/EmptyCall": {Name: "check", Limit: limit,
			Outcome: &grpclimit.Outcome{Count: grpclimit.Failures, CheckFirst: true}}},
	}, nil, nil, []grpc.UnaryServerInterceptor{recovered}, signal)
	payload := func(s string) *testgrpc.Payload { return &testgrpc.Payload{Body: []byte(s)} }
	for _, tt := range []struct {
		name string
		call func(ctx context.Context) error
		want int64
	}{
		{"cost", func(ctx context.Context) error {
			_, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{Payload: payload("300")})
			return err
		}, 700},
		{"no cost", func(ctx context.Context) error { _, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{}); return err }, 999},
		{"failed", func(ctx context.Context) error {
			_, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{ResponseStatus: &testgrpc.EchoStatus{Code: int32(codes.NotFound)}})
			if status.Code(err) != codes.NotFound {
				return fmt.Errorf("%v, want NotFound", err)
			}
			return nil
		}, 1000},
		{"panic", func(ctx context.Context) error {
			_, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{Payload: payload("panic")})
			if status.Code(err) != codes.Internal {
				return fmt.Errorf("a panic answered %v, want the outer recovery's Internal", err)
			}
			return nil
		}, 1000},
		{"stream cost", func(ctx context.Context) error {
			s, err := c.FullDuplexCall(ctx)
			if err != nil {
				return err
			}
			s.Send(&testgrpc.StreamingOutputCallRequest{Payload: payload("25")})
			s.Recv()
			s.CloseSend()
			s.Recv()
			<-ended
			return nil
		}, 975},
		{"stream cancelled", func(ctx context.Context) error {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			s, err := c.FullDuplexCall(ctx)
			if err != nil {
				return err
			}
			s.Send(&testgrpc.StreamingOutputCallRequest{Payload: payload("25")})
			s.Recv()
			cancel()
			<-ended
			return nil
		}, 1000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key := keyFor(t)
			if err := tt.call(withKey(ctx5s(t), key)); err != nil {
				t.Fatal(err)
			}
			if got := remaining(t, lim, "tokens", key, limit); got != tt.want {
				t.Errorf("%d left, want %d", got, tt.want)
			}
		})
	}
	t.Run("check first", func(t *testing.T) {
		key := keyFor(t)
		ctx := withKey(ctx5s(t), key)
		if _, err := c.EmptyCall(ctx, &testgrpc.Empty{}); err != nil {
			t.Fatal(err)
		}
		if got := remaining(t, lim, "check", key, limit); got != 1000 {
			t.Errorf("after a success, %d left, want 1000: nothing taken", got)
		}
	})
}

// "60 requests and 150,000 tokens per minute" over real HTTP, on every server: one atomic
// decision where the tokens' limit takes the request's estimate and the requests' one; each
// RateLimit-Policy item with its unit; a request the tokens refuse takes no request either;
// the tokens the handler reports after the fact replace the estimate.
func TestOutcomeHTTPCostPerLimit(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		requests := client.SlidingWindow{Limit: 60, Window: time.Minute}
		tokens := client.TokenBucket{Capacity: 150_000, Rate: 150_000, Period: time.Minute, Name: "tokens"}
		estimate := func(r *http.Request) int64 {
			n, _ := strconv.ParseInt(r.Header.Get("X-Estimate"), 10, 64)
			return n
		}
		srv := limitedServer(t, lim, httplimit.Options{Policy: func(*http.Request) httplimit.Policy {
			return httplimit.Policy{Name: "requests", Limit: requests,
				Also:    []httplimit.AlsoLimit{{Name: "tokens", Limit: tokens, Cost: estimate, Unit: "tokens"}},
				Outcome: &httplimit.Outcome{CostHeader: "Rlfn-Cost"}}
		}}, http.HandlerFunc(outcomeHandler))
		key := keyFor(t)
		r := send(t, http.MethodGet, srv.URL+"/ok", "", "X-Key: "+key, "X-Estimate: 100000")
		if r.status != http.StatusOK {
			t.Fatalf("request 1: %d %q", r.status, r.body)
		}
		if got, want := r.header.Get("RateLimit-Policy"), `"requests";q=60;w=60, "tokens";q=150000;w=60;qu="tokens"`; got != want {
			t.Errorf("RateLimit-Policy %q, want %q", got, want)
		}
		if got := r.header.Get("RateLimit"); !strings.Contains(got, `"tokens";r=50000;`) || !strings.Contains(got, `"requests";r=59;`) {
			t.Errorf("RateLimit %q, want tokens 50000 left and requests 59", got)
		}
		// 60,000 more tokens: refused by the tokens, and no request taken either
		r = send(t, http.MethodGet, srv.URL+"/ok", "", "X-Key: "+key, "X-Estimate: 60000")
		if r.status != http.StatusTooManyRequests || !strings.Contains(r.body, `"policy":"tokens"`) {
			t.Fatalf("request 2: %d %q, want 429 by tokens", r.status, r.body)
		}
		if got := remaining(t, lim, "requests", key, requests); got != 59 {
			t.Errorf("after a refusal by the tokens, %d requests left, want 59", got)
		}
		// An estimate of 40,000 the handler reports was 300: the tokens' limit keeps 300, the
		// requests' its 1.
		r = send(t, http.MethodGet, srv.URL+"/cost/300", "", "X-Key: "+key, "X-Estimate: 40000")
		if r.status != http.StatusOK {
			t.Fatalf("request 3: %d %q", r.status, r.body)
		}
		// The bucket refills 2.5 tokens a ms: up to 100 ms between the settle and this peek is
		// 250 more; a settle that kept the estimate leaves 10,000, one that gave back all 50,000.
		if got := remaining(t, lim, "tokens", key, tokens); got < 49_700 || got > 49_950 {
			t.Errorf("%d tokens left, want 49700 (and what refilled since)", got)
		}
		if got := remaining(t, lim, "requests", key, requests); got != 58 {
			t.Errorf("%d requests left, want 58", got)
		}
	})
}

// The same over real gRPC: the tokens' cost from the request, each ratelimit-policy item with
// its unit, the cost trailer replacing the estimate.
func TestOutcomeGRPCCostPerLimit(t *testing.T) {
	tg := servers(t)[0]
	lim := harness.NewLimiter(t, tg.c, slowMachine)
	requests := client.SlidingWindow{Limit: 60, Window: time.Minute}
	tokens := client.TokenBucket{Capacity: 150_000, Rate: 150_000, Period: time.Minute, Name: "tokens"}
	estimate := func(_ context.Context, _ string, req any) int64 {
		if r, ok := req.(*testgrpc.SimpleRequest); ok {
			return int64(r.GetResponseSize())
		}
		return 0
	}
	c := grpcPair(t, lim, grpclimit.ServerOptions{
		Default: grpclimit.Policy{Name: "requests", Limit: requests,
			Also:    []grpclimit.AlsoLimit{{Name: "tokens", Limit: tokens, Cost: estimate, Unit: "tokens"}},
			Outcome: &grpclimit.Outcome{CostTrailer: "rlfn-cost"}},
	}, nil, nil)
	key := keyFor(t)
	ctx := withKey(ctx5s(t), key)
	var md metadata.MD
	if _, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{ResponseSize: 100_000}, grpc.Header(&md)); err != nil {
		t.Fatal(err)
	}
	if got := md.Get("ratelimit-policy"); len(got) != 1 || got[0] != `"requests";q=60;w=60, "tokens";q=150000;w=60;qu="tokens"` {
		t.Errorf("ratelimit-policy %q", got)
	}
	_, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{ResponseSize: 60_000})
	if _, quota := details(t, err); status.Code(err) != codes.ResourceExhausted || quota.GetViolations()[0].GetQuotaId() != "tokens" {
		t.Fatalf("call 2: %v, want a refusal by tokens", err)
	}
	if _, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{ResponseSize: 40_000, Payload: &testgrpc.Payload{Body: []byte("300")}}); err != nil {
		t.Fatal(err)
	}
	// As the HTTP twin's: 2.5 tokens a ms refill, up to 100 ms between the settle and this
	// peek; a settle that kept the estimate leaves 10,000, one that gave back all 50,000.
	if got := remaining(t, lim, "tokens", key, tokens); got < 49_700 || got > 49_950 {
		t.Errorf("%d tokens left, want 49700 (and what refilled since)", got)
	}
	if got := remaining(t, lim, "requests", key, requests); got != 58 {
		t.Errorf("%d requests left, want 58", got)
	}
}
