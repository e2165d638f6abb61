package client_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
)

// The examples in this file exist for docs/: each is copied verbatim into a page, and
// TestDocsExamples fails when a page and its example part.

// A concurrency lease caps how many of one principal's jobs run at once. Every lease
// expires unless renewed, so a holder that crashes never keeps its slot.
func ExampleLimiter_Acquire() {
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

	reports := client.Concurrency{Limit: 2, Lease: 30 * time.Second}
	lease, res, err := lim.Acquire(ctx, "tenant:7", reports)
	if err != nil {
		log.Fatal(err)
	}
	if !res.Allowed {
		fmt.Printf("2 reports already running, retry in %s\n", res.RetryAfter)
		return
	}
	defer lease.Release(ctx) // runs even when ctx is over: the slot is owed

	// A job longer than the lease renews it before it runs out.
	if _, err := lease.Renew(ctx); err != nil {
		log.Print(err)
	}
}

// A critical caller may use the units a limit's Reserve keeps from everyone else.
func ExampleCritical() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}

	limit := client.TokenBucket{Capacity: 100, Rate: 50, Period: time.Second, Reserve: 20}
	ctx := context.Background()
	batch, err := lim.Allow(ctx, "shop:7", limit) // admitted only while 20 tokens stay
	if err != nil {
		log.Fatal(err)
	}
	checkout, err := lim.Allow(client.Critical(ctx), "shop:7", limit) // may take the last 20
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(batch.Allowed, checkout.Allowed)
}

// A key is at most Options.MaxKeyLen bytes (512 by default): count by a long identifier (a
// token, a URL) through a hash of it.
func Example_longKey() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}

	token := "eyJhbGciOiJIUzI1NiJ9.a-long-bearer-token.signature"
	sum := sha256.Sum256([]byte(token))
	limit := client.FixedWindow{Limit: 1000, Window: time.Hour}
	res, err := lim.Allow(context.Background(), "tok:"+hex.EncodeToString(sum[:]), limit)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Allowed)
}

// Options.Overrides makes a Limiter obey what operators set with rlfn override: here customer
// 42 (key cust:42) gets a bucket of 500 instead of the code's 100, with no deploy.
// SyncOverrides at start-up reads them before the first request; afterwards they are kept
// current in the background, from valkey-go's client-side cache (on by default): a decision
// sends no extra command.
func ExampleOptions_overrides() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{Overrides: true})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if err := lim.SyncOverrides(ctx); err != nil {
		log.Print(err) // the code's limits apply until the overrides can be read
	}

	api := client.Limit(client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second})
	res, err := lim.Allow(ctx, "cust:42", api)
	if err != nil {
		log.Fatal(err)
	}
	if res.Override != nil {
		// rlfn override set token_bucket cust:42 --capacity 500 --rate 50 --period 1s
		fmt.Printf("override %s: %d of %d left\n", res.Override.Key, res.Remaining, res.Limit)
	}
}

// A stream whose cost is known only at its end (an LLM's output tokens) is metered against an
// exact budget: the meter holds the estimate, draws the stream's tokens from it without a call,
// adds batches as the stream outgrows it, and settles at what was used. A stream cut by the
// budget stops where the budget ends; one abandoned is billed what it used (Close).
func ExampleLimiter_Meter() {
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

	daily := client.FixedWindow{Limit: 1_000_000, Window: 24 * time.Hour, Name: "tokens"}
	const input, expected = 1200, 500 // the prompt's tokens, and the output expected
	m, res, err := lim.Meter(ctx, []client.Rule{{Key: "team:7", Limit: daily, Cost: input + expected}},
		client.MeterOptions{Hold: client.HoldOptions{TTL: 5 * time.Minute}, PerUnit: []int64{1}, Base: []int64{input}})
	if err != nil {
		log.Fatal(err)
	}
	if !res.Allowed {
		fmt.Printf("over budget, retry in %s\n", res.RetryAfter)
		return
	}
	defer m.Close(ctx) // bills what was used if the stream ends early

	for _, chunk := range []int64{180, 240, 310} { // the stream's output tokens, chunk by chunk
		ok, err := m.Take(ctx, chunk)
		if err != nil {
			log.Print(err)
			break
		}
		if !ok {
			fmt.Printf("budget spent after %d tokens\n", m.Granted())
			break
		}
	}
	// The response's usage is the truth: settle at it.
	if _, err := m.Settle(ctx, []int64{input + m.Used()}); err != nil {
		log.Print(err)
	}
}
