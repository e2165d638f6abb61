package client_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/valkey-io/valkey-go"

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
	lim := client.New(vk)
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

func ExampleKey() {
	fmt.Println(client.Key("rl:", "user:42", client.TokenBucket{}))
	fmt.Println(client.Key("rl:", "user:42", client.LeakyBucket{Mode: client.Shape}))
	fmt.Println(client.Key("rl:", "a}b{c%", client.FixedWindow{}))
	// Output:
	// rl:{user:42}:token_bucket
	// rl:{user:42}:leaky_bucket
	// rl:{a%7Db%7Bc%25}:fixed_window
}
