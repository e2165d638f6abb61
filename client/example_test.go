package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math"
	"net/http"
	"time"

	"github.com/valkey-io/valkey-go"
	"go.opentelemetry.io/otel"

	"github.com/rlfn/rlfn/client"
)

func Example() {
	vk, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{"127.0.0.1:6379"},
		// Peek (FCALL_RO) then runs on replicas, where there are any.
		SendToReplicas: func(cmd valkey.Completed) bool { return cmd.IsReadOnly() },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if err := lim.Check(ctx); err != nil {
		log.Fatal(err) // e.g. the library is not deployed: run rlfn deploy
	}

	res, err := lim.Allow(ctx, "user:42", client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	if !res.Allowed {
		fmt.Printf("429, retry in %s\n", res.RetryAfter)
	}
}

// AllowN takes several units at once, all or nothing: here an upload counted in MB against a
// per-tenant budget of 1 GB a day, which no burst can exceed.
func ExampleLimiter_AllowN() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}

	sizeMB := int64(120)
	res, err := lim.AllowN(context.Background(), "tenant:7", client.SlidingWindow{Limit: 1024, Window: 24 * time.Hour}, sizeMB)
	if err != nil {
		log.Fatal(err)
	}
	switch {
	case res.RetryAfter == client.Never:
		fmt.Println("larger than the whole budget")
	case !res.Allowed:
		fmt.Printf("over budget: %d MB left, retry in %s\n", res.Remaining, res.RetryAfter)
	}
}

// Peek answers "would this pass?" without consuming anything, and may run on a replica: e.g.
// to show a user their remaining quota.
func ExampleLimiter_Peek() {
	vk, err := valkey.NewClient(valkey.ClientOption{
		InitAddress:    []string{"127.0.0.1:6379"},
		SendToReplicas: func(cmd valkey.Completed) bool { return cmd.IsReadOnly() },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}

	res, err := lim.Peek(context.Background(), "user:42", client.FixedWindow{Limit: 1000, Window: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d of %d requests left this hour\n", res.Remaining, res.Limit)
}

// A Limiter that never takes the service down with the server: each call waits 50ms at most,
// five failures in a row open the circuit breaker (no call is sent for a second, then one
// probes), and meanwhile each of the 8 instances of the service admits its eighth of the limit
// by itself. The decisions it makes are client.FromFallback, and counted in metrics.
func ExampleOptions_fallback() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{
		Deadline:        50 * time.Millisecond,
		BreakerFailures: 5,
		BreakerCooldown: time.Second,
		Fallback:        client.LocalFallback,
		Instances:       8,
		MeterProvider:   otel.GetMeterProvider(),
	})
	if err != nil {
		log.Fatal(err)
	}
	limit := client.TokenBucket{Capacity: 800, Rate: 400, Period: time.Second}

	http.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		res, err := lim.Allow(r.Context(), r.Header.Get("X-API-Key"), limit)
		if err != nil {
			// only what no fallback decides: a bad limit, RLERR, a canceled request
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if !res.Allowed {
			w.Header().Set("Retry-After", fmt.Sprint(int64(math.Ceil(res.RetryAfter.Seconds()))))
			http.Error(w, "rate limited", http.StatusTooManyRequests)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", nil))
}

// Every decision is a span (rlfn.allow here, under the request's span, which r.Context()
// carries), with its outcome and its limit; the key, often personal data, only with
// Options.TraceKeys. Without a TracerProvider no span is made, at no cost.
func ExampleOptions_tracing() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{TracerProvider: otel.GetTracerProvider()})
	if err != nil {
		log.Fatal(err)
	}
	limit := client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second, Name: "api"}
	http.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		// the span: rlfn.allow {rlfn.algorithm=token_bucket, rlfn.limit.name=api,
		// ratelimit.allowed, ratelimit.remaining, ratelimit.limit, rlfn.source=server}
		res, err := lim.Allow(r.Context(), r.Header.Get("X-API-Key"), limit)
		if err != nil || !res.Allowed {
			http.Error(w, "rate limited", http.StatusTooManyRequests)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", nil))
}

// With ReturnError (the default is LocalFallback), the caller sees why the server did not
// decide, and ErrCircuitOpen while the breaker spares the server: it decides itself.
func ExampleErrCircuitOpen() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{Fallback: client.ReturnError})
	if err != nil {
		log.Fatal(err)
	}

	_, err = lim.Allow(context.Background(), "user:42", client.FixedWindow{Limit: 10, Window: time.Second})
	switch {
	case errors.Is(err, client.ErrCircuitOpen):
		log.Print("rate limiter down, admitting without it")
	case errors.Is(err, client.ErrNotLoaded):
		log.Print("run rlfn deploy")
	case err != nil:
		log.Print(err)
	}
}

// An operator's tool finds a principal's state with Key: the server key holds the limiter of
// that principal and algorithm, e.g. rl:{user:42}:token_bucket, and rl:{a%7Db%7Bc%25}:fixed_window
// for the key "a}b{c%", whose braces cannot choose the cluster slot.
func ExampleLimiter_Key() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	key := lim.Key("user:42", client.TokenBucket{})
	ttl, err := vk.Do(ctx, vk.B().Pttl().Key(key).Build()).AsInt64()
	fmt.Println(key, ttl, err)
}

// The login triple: a login is limited per (IP, user), per IP and per user at once. Each is a
// principal of its own (its own cluster slot): the calls run side by side, and when one
// denies, the units the others took are given back.
func ExampleLimiter_AllowAll() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if err := lim.CheckVersion(ctx, "1.1.0"); err != nil {
		log.Fatal(err) // a node still runs 1.0.0: run rlfn deploy
	}

	ip, user := "203.0.113.7", "alice"
	res, err := lim.AllowAll(ctx, []client.Rule{
		{Key: "login:" + ip + ":" + user, Limit: client.SlidingLog{Limit: 5, Window: 15 * time.Minute}},
		{Key: "login-ip:" + ip, Limit: client.TokenBucket{Capacity: 100, Rate: 1, Period: 6 * time.Second}},
		{Key: "login-user:" + user, Limit: client.SlidingWindow{Limit: 20, Window: time.Hour}},
	})
	if err != nil {
		log.Fatal(err)
	}
	if !res.Allowed {
		fmt.Printf("login refused by rule %d, retry in %s\n", res.Rule, res.RetryAfter)
	}
}

// A payment API checks a per-merchant limit and a global one on every request. The merchant's
// two limits (per second and per day, told apart by a Name) share its slot and are decided by
// one atomic call; the global limit runs beside it.
func ExampleLimiter_AllowAll_merchantAndGlobal() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()

	merchant := "merchant:acme"
	res, err := lim.AllowAll(ctx, []client.Rule{
		{Key: merchant, Limit: client.TokenBucket{Capacity: 50, Rate: 25, Period: time.Second}},
		{Key: merchant, Limit: client.FixedWindow{Limit: 100_000, Window: 24 * time.Hour, Name: "daily"}},
		{Key: "global", Limit: client.TokenBucket{Capacity: 10_000, Rate: 5_000, Period: time.Second}},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Allowed, res.Remaining)
}

// An LLM gateway's "60 requests and 150,000 tokens per minute" for one organisation: each
// rule takes its own cost, the request 1 (the call's) and the tokens its estimate, in one
// atomic call. A request the tokens refuse takes no request either.
func ExampleLimiter_AllowAll_costPerRule() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	org, tokens := "org:7", int64(1200) // the prompt's tokens plus the most it may generate
	res, err := lim.AllowAll(context.Background(), []client.Rule{
		{Key: org, Limit: client.SlidingWindow{Limit: 60, Window: time.Minute}},
		{Key: org, Limit: client.TokenBucket{Capacity: 150_000, Rate: 150_000, Period: time.Minute, Name: "tokens"}, Cost: tokens},
	})
	if err != nil {
		log.Fatal(err)
	}
	if !res.Allowed {
		fmt.Printf("refused by rule %d, retry in %s\n", res.Rule, res.RetryAfter)
	}
}

// AllowAllEach decides as AllowAll does, and also says where each limit stands: what a
// response shows for every limit of a route (client/httplimit's RateLimit header does).
func ExampleLimiter_AllowAllEach() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	rules := []client.Rule{
		{Key: "user:42", Limit: client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}},
		{Key: "user:42", Limit: client.FixedWindow{Limit: 1000, Window: time.Hour, Name: "hourly"}},
	}
	res, each, err := lim.AllowAllEach(context.Background(), rules, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("allowed %v, decided by rule %d\n", res.Allowed, res.Rule)
	for i, r := range each {
		fmt.Printf("rule %d: %d of %d left, back to full in %s\n", i, r.Remaining, r.Limit, r.ResetAfter)
	}
}

// Wait is the blocking form, as golang.org/x/time/rate's: a worker paces its calls to a
// partner's API, shared by every worker of the fleet, and gives up at once when the pace would
// take it past its deadline.
func ExampleLimiter_Wait() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	partner := client.LeakyBucket{Capacity: 20, Rate: 5, Period: time.Second, Mode: client.Shape}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, job := range []string{"a", "b", "c"} {
		if err := lim.Wait(ctx, "partner:acme", partner); err != nil {
			// client.ErrWaitPastDeadline: the queue is longer than the time left
			log.Printf("job %s not sent: %v", job, err)
			return
		}
		fmt.Println("send", job)
	}
}

func ExampleLimiter_Refund() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()

	limit := client.TokenBucket{Capacity: 1000, Rate: 50, Period: time.Second}
	const predicted = 120
	res, err := lim.AllowN(ctx, "shop:42", limit, predicted)
	if err != nil {
		log.Fatal(err)
	}
	if !res.Allowed {
		fmt.Printf("throttled, retry in %s\n", res.RetryAfter)
		return
	}
	actual := int64(35) // what the query really cost
	if _, err := lim.Refund(ctx, "shop:42", limit, predicted-actual); err != nil {
		log.Print(err) // a lost refund only makes the limit stricter for a while
	}
}

// A global ceiling every request of every instance passes through is one hot key: leased
// budgets serve it from batches of up to 256 units, each handed out within 50ms, and the denial
// cache answers a flood of denied calls without the server. Close gives the parked units back.
func ExampleOptions_leasedBudgets() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{
		BudgetBatch: 256,
		BudgetAge:   50 * time.Millisecond,
		DenialCache: 100_000,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close(context.Background()) // before vk.Close: the refunds need the connection

	global := client.Limit(client.TokenBucket{Capacity: 20_000, Rate: 10_000, Period: time.Second})
	res, err := lim.Allow(context.Background(), "api:global", global)
	if err != nil {
		log.Fatal(err)
	}
	if !res.Allowed {
		fmt.Printf("503, retry in %s\n", res.RetryAfter)
	}
}

// A monthly quota billed on the customer's day, in the customer's zone: 10,000 calls from
// midnight Berlin time on the 31st (the month's last day when it has fewer) to the next.
// Denied, RetryAfter is the time to the window's end. Library 1.2.0.
func ExampleCalendar() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	berlin, err := time.LoadLocation("Europe/Berlin") // never time.Local: the client refuses it
	if err != nil {
		log.Fatal(err)
	}
	monthly := client.Limit(client.Calendar{
		Limit:  10_000,
		Period: client.Month,
		Anchor: time.Date(2026, 1, 31, 0, 0, 0, 0, berlin),
	})
	res, err := lim.Allow(context.Background(), "customer:42", monthly)
	if err != nil {
		log.Fatal(err)
	}
	if !res.Allowed {
		fmt.Printf("quota spent, renewed in %s\n", res.RetryAfter.Round(time.Hour))
	}
}

// A login limit whose denial blocks the account for 15 minutes: the limit and the block are
// decided in one call, and a request refused during the block never lengthens it. An operator
// lifts a block with Unblock (or rlfn unblock). Library 1.2.0.
func ExampleLimiter_Block() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	logins := client.Limit(client.SlidingWindow{Limit: 5, Window: time.Minute, Penalty: 15 * time.Minute})
	res, err := lim.Allow(ctx, "account:42", logins)
	switch {
	case err != nil:
		log.Fatal(err)
	case res.Blocked:
		fmt.Printf("account blocked for %s\n", res.RetryAfter)
	case !res.Allowed:
		fmt.Printf("too many attempts, retry in %s\n", res.RetryAfter)
	}

	// an operator's hand: block for an hour, read it back, lift it
	if _, err := lim.Block(ctx, "account:42", time.Hour); err != nil {
		log.Fatal(err)
	}
	if b, err := lim.PeekBlock(ctx, "account:42"); err == nil && b.Blocked {
		fmt.Printf("blocked for %s more\n", b.RetryAfter)
	}
	if _, err := lim.Unblock(ctx, "account:42"); err != nil {
		log.Fatal(err)
	}
}
