package grpclimit_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"strconv"
	"time"

	"github.com/valkey-io/valkey-go"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/grpclimit"
)

// A gRPC server whose calls are counted per API key (the "x-api-key" metadata): bursts of 100
// and 10 a second for the whole service, uploads shaped to 2 a second, health checks free.
func Example() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	limits, err := grpclimit.NewServer(lim, grpclimit.ServerOptions{
		Key: grpclimit.Metadata("x-api-key"),
		Methods: map[string]grpclimit.Policy{
			"/shop.v1.Shop/*": {Name: "api", Limit: client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second}},
			"/shop.v1.Shop/Upload": {Name: "upload", Limit: client.LeakyBucket{
				Capacity: 10, Rate: 2, Period: time.Second, Mode: client.Shape}},
			"/grpc.health.v1.Health/Check": {}, // not limited
		},
		MaxDelay: 5 * time.Second,
	})
	if err != nil {
		log.Fatal(err) // a policy that cannot be valid, named
	}
	// Every node runs the library release the policies need, before the first call.
	if err := limits.Check(context.Background()); err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(limits.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(limits.StreamInterceptor()))
	// register the services here, then
	lis, err := net.Listen("tcp", "127.0.0.1:50051")
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(srv.Serve(lis))
}

// budget is a Decider for this example alone, admitting n calls of each key: a service uses a
// *client.Limiter.
type budget struct{ used map[string]int64 }

func (b *budget) Allow(_ context.Context, key string, l client.Limit) (client.Result, error) {
	limit := l.Quota().Limit
	if b.used[key] >= limit {
		return client.Result{Limit: limit, RetryAfter: 1500 * time.Millisecond, ResetAfter: time.Minute}, nil
	}
	b.used[key]++
	return client.Result{Allowed: true, Limit: limit, Remaining: limit - b.used[key], ResetAfter: time.Minute}, nil
}

// What a client sees: the quota state in the header metadata of an admitted call, and a
// refusal as ResourceExhausted with the exact wait in a RetryInfo and the policy in a
// QuotaFailure.
func Example_refusal() {
	limits, err := grpclimit.NewServer(&budget{used: map[string]int64{}}, grpclimit.ServerOptions{
		Key:     grpclimit.Metadata("x-api-key"),
		Default: grpclimit.Policy{Name: "health", Limit: client.FixedWindow{Limit: 1, Window: time.Minute}},
	})
	if err != nil {
		log.Fatal(err)
	}
	lis := bufconn.Listen(1 << 16)
	srv := grpc.NewServer(grpc.UnaryInterceptor(limits.UnaryInterceptor()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient("passthrough:///example",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k1")

	var md metadata.MD
	_, err = health.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
	fmt.Println(err, md.Get("ratelimit-policy"), md.Get("ratelimit"))

	_, err = health.Check(ctx, &healthpb.HealthCheckRequest{})
	fmt.Println(status.Code(err))
	for _, d := range status.Convert(err).Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			fmt.Println("retry in", d.GetRetryDelay().AsDuration())
		case *errdetails.QuotaFailure:
			fmt.Println("policy", d.GetViolations()[0].GetQuotaId())
		}
	}
	wait, _ := grpclimit.RetryDelay(err)
	fmt.Println(wait)
	// Output:
	// <nil> ["health";q=1;w=60] ["health";r=0;t=60]
	// ResourceExhausted
	// retry in 1.5s
	// policy health
	// 1.5s
}

// A refused stream looks open: the call that opens it returns a stream and no error, since
// gRPC opens a stream without waiting for the server's answer, and a Send may succeed too.
// The refusal arrives with the first Recv (or CloseAndRecv), which returns the status with
// its RetryInfo: read before relying on the stream, and handle the refusal there.
func Example_streamRefusal() {
	limits, err := grpclimit.NewServer(&budget{used: map[string]int64{}}, grpclimit.ServerOptions{
		Key:     grpclimit.Metadata("x-api-key"),
		Default: grpclimit.Policy{Name: "watch", Limit: client.FixedWindow{Limit: 1, Window: time.Minute}},
	})
	if err != nil {
		log.Fatal(err)
	}
	lis := bufconn.Listen(1 << 16)
	srv := grpc.NewServer(grpc.StreamInterceptor(limits.StreamInterceptor()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient("passthrough:///example",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k1"))
	defer cancel()

	for range 2 {
		stream, err := health.Watch(ctx, &healthpb.HealthCheckRequest{})
		fmt.Println("opened:", err) // nil for the refused stream too
		if err != nil {
			return
		}
		if _, err := stream.Recv(); err != nil {
			wait, _ := grpclimit.RetryDelay(err)
			fmt.Println("first Recv:", status.Code(err), "retry in", wait)
			continue
		}
		fmt.Println("first Recv: serving")
	}
	// Output:
	// opened: <nil>
	// first Recv: serving
	// opened: <nil>
	// first Recv: ResourceExhausted retry in 1.5s
}

// A service calling a rate-limited gRPC API paces its calls through a limit every instance
// shares (a leaky bucket spacing them 100ms apart), and waits out the API's RetryInfo for the
// methods safe to repeat: GetPrice is; PlaceOrder is not, and is never sent twice.
func ExampleNewClient() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	pacer, err := grpclimit.NewClient(lim, grpclimit.ClientOptions{
		Limit:      client.LeakyBucket{Capacity: 50, Rate: 10, Period: time.Second, Mode: client.Shape},
		Idempotent: func(method string) bool { return method == "/market.v1.Market/GetPrice" },
	})
	if err != nil {
		log.Fatal(err)
	}
	conn, err := grpc.NewClient("dns:///market.internal:443",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(pacer.UnaryInterceptor()),
		grpc.WithChainStreamInterceptor(pacer.StreamInterceptor()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	// market.NewMarketClient(conn) ...
}

// A login method counts failed attempts only: five a minute per user, peeked before the
// handler and charged after a failure, so that a user who types the password right is never
// refused for it. A concurrency lease of one per user closes the gap of the peek (calls in
// flight at once could each pass it), and the quota is hidden from whoever is guessing.
func Example_login() {
	login := grpclimit.Policy{
		Name:        "login",
		Limit:       client.FixedWindow{Limit: 5, Window: time.Minute},
		Outcome:     &grpclimit.Outcome{Count: grpclimit.Failures, CheckFirst: true},
		Concurrency: &client.Concurrency{Limit: 1, Lease: 10 * time.Second},
		HideQuota:   true,
	}
	opts := grpclimit.ServerOptions{
		Key:     grpclimit.Metadata("x-user"),
		Methods: map[string]grpclimit.Policy{"/auth.v1.Auth/Login": login},
	}
	fmt.Println(grpclimit.Needs(login), opts.Methods["/auth.v1.Auth/Login"].Outcome.Count(codes.Unauthenticated))
	// Output:
	// 1.1.0 true
}

// An LLM gateway's "60 calls and 150,000 tokens per minute" per organisation, decided all or
// nothing in one atomic call: the tokens' limit is counted on the policy's own key (SameKey),
// beside the calls', where one rl_multi decides both. It takes the call's estimate (its
// max_tokens, here in the "x-max-tokens" metadata; a value that is no count, or a negative
// one, is refused InvalidArgument), the calls' limit 1; once the call is
// served, the handler reports the tokens it really used in the "rlfn-cost" trailer, which
// replace the estimate.
func Example_tokens() {
	estimate := func(ctx context.Context, _ string, _ any) int64 {
		v := metadata.ValueFromIncomingContext(ctx, "x-max-tokens")
		if len(v) == 0 {
			return 4096
		}
		n, err := strconv.ParseInt(v[0], 10, 64)
		if err != nil {
			return -1 // the caller's fault, as a negative n is: refused InvalidArgument
		}
		return n
	}
	completions := grpclimit.Policy{
		Name:  "calls",
		Limit: client.SlidingWindow{Limit: 60, Window: time.Minute},
		Also: []grpclimit.AlsoLimit{{Name: "tokens", Unit: "tokens", Cost: estimate, SameKey: true,
			Limit: client.TokenBucket{Capacity: 150_000, Rate: 150_000, Period: time.Minute}}},
		Outcome: &grpclimit.Outcome{CostTrailer: "rlfn-cost"},
	}
	// In the handler, once the tokens are counted:
	//	grpc.SetTrailer(ctx, metadata.Pairs("rlfn-cost", strconv.Itoa(used)))

	// Both limits of organisation org-7 are on one key (the server's keys
	// rl:{calls:org-7}:sliding_window and rl:{calls:org-7}:token_bucket).
	fmt.Println(grpclimit.Needs(completions), grpclimit.LimiterKey(completions.Name, "org-7"))
	// Output:
	// 1.1.0 calls:org-7
}

// An LLM service whose Generate method streams chunks of tokens, with "60 calls and 150,000
// tokens a minute" per organisation: each call holds one call and its estimate of tokens
// (its max_tokens, in the "x-max-tokens" metadata) before its handler runs; each chunk the
// handler sends draws its tokens from the hold first (in batches beyond it); a stream whose
// budget runs out is cut ResourceExhausted; the call is charged the tokens it sent.
func Example_streamMeter() {
	estimate := func(ctx context.Context, _ string, _ any) int64 {
		v := metadata.ValueFromIncomingContext(ctx, "x-max-tokens")
		if len(v) == 0 {
			return 4096
		}
		n, err := strconv.ParseInt(v[0], 10, 64)
		if err != nil {
			return -1 // the caller's fault: refused InvalidArgument
		}
		return n
	}
	// The tokens of a message the handler sends: here any message with a GetTokens method, as
	// the service's own chunk message has.
	tokens := func(msg any) int64 {
		if c, ok := msg.(interface{ GetTokens() int64 }); ok {
			return c.GetTokens()
		}
		return 0
	}
	generate := grpclimit.Policy{
		Name:  "calls",
		Limit: client.SlidingWindow{Limit: 60, Window: time.Minute},
		// the limit with a Cost is the one metered; the calls' limit holds 1, and keeps it
		Also: []grpclimit.AlsoLimit{{Name: "tokens", Unit: "tokens", Cost: estimate, SameKey: true,
			Limit: client.TokenBucket{Capacity: 150_000, Rate: 150_000, Period: time.Minute}}},
		Meter: &grpclimit.StreamMeter{Units: tokens},
	}
	// With a *client.Limiter lim (see Example):
	//	grpclimit.NewServer(lim, grpclimit.ServerOptions{Key: grpclimit.Metadata("x-org"),
	//		Methods: map[string]grpclimit.Policy{"/llm.v1.Model/Generate": generate}})
	// In the handler, a Send that returns an error ends the stream; the cut's is
	// ResourceExhausted "grpclimit: budget of policy tokens ran out: the stream is cut":
	//	if err := stream.Send(chunk); err != nil {
	//		return err
	//	}

	// Holds need library 1.3.0 on every node (Server.Check tells).
	fmt.Println(grpclimit.Needs(generate))
	// Output:
	// 1.3.0
}
