package client_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"

	"github.com/rlfn/rlfn/client"
)

// The slot the client computes for a key is the one valkey-go's cluster builder computes for
// each of its state keys, braces and escapes included.
func TestKeySlot(t *testing.T) {
	b := mock.NewClient(nil, mock.WithSlotCheck()).B()
	for _, key := range []string{"", "user:42", "a{b}c", "{", "}", "%", "%7B", "{}", "x}{y", "\xff\x00é"} {
		for _, limit := range []client.Limit{
			client.FixedWindow{Limit: 1, Window: time.Second},
			client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Second, Name: "n{}"},
		} {
			cmd := b.Get().Key(client.KeyOf("p{}%:", key, limit)).Build()
			if got, want := client.KeySlot(key), cmd.Slot(); got != want {
				t.Errorf("KeySlot(%q) = %d, valkey-go's slot of %s is %d", key, got, client.KeyOf("p{}%:", key, limit), want)
			}
		}
	}
}

// shardedClient is a 2-shard cluster as a Limiter sees it: CLUSTER SLOTS gives slots 0-8191 to
// node a and the rest to node b; a call on a key of a dead shard fails (the deadline), the
// others are answered.
type shardedClient struct {
	*mock.Client
	dead  [2]bool
	slots valkey.ValkeyMessage
	sent  [2]int
}

func newShardedClient() *shardedClient {
	node := func(lo, hi int64, id string) valkey.ValkeyMessage {
		return mock.ValkeyArray(mock.ValkeyInt64(lo), mock.ValkeyInt64(hi),
			mock.ValkeyArray(mock.ValkeyString("10.0.0.1"), mock.ValkeyInt64(6379), mock.ValkeyString(id)))
	}
	return &shardedClient{Client: mock.NewClient(nil, mock.WithSlotCheck()),
		slots: mock.ValkeyArray(node(0, 8191, "a"), node(8192, 16383, "b"))}
}

func (c *shardedClient) Nodes() map[string]valkey.Client { return map[string]valkey.Client{"n": c} }

func (c *shardedClient) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	if cmd.Commands()[0] == "CLUSTER" {
		return mock.Result(c.slots)
	}
	shard := 0
	if cmd.Slot() >= 8192 {
		shard = 1
	}
	c.sent[shard]++
	if c.dead[shard] {
		return mock.ErrorResult(context.DeadlineExceeded)
	}
	return mock.Result(ints(1, 100, 99, 0, 1000, 0))
}

// keyOn returns a key whose slot is on shard (0: 0-8191, 1: the rest).
func keyOn(shard int, n int) string {
	for i := 0; ; i++ {
		k := fmt.Sprintf("k%d-%d", n, i)
		if int(client.KeySlot(k)/8192) == shard {
			return k
		}
	}
}

// A dead shard opens its own breaker: its calls fail at the deadline only until then, and the
// other shard's calls all reach the server, before and after. Before the slots are known, the
// Limiter's calls share one breaker.
func TestBreakerPerNode(t *testing.T) {
	vk := newShardedClient()
	clock := newFakeClock()
	lim := newLimiter(t, vk, client.WithClock(client.Options{BreakerFailures: 3, BreakerCooldown: time.Second, Fallback: client.ReturnError}, clock.now))
	limit := client.FixedWindow{Limit: 100, Window: time.Minute}
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Second)
	for !lim.SlotsKnown() {
		if _, err := lim.Allow(ctx, keyOn(1, 0), limit); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the cluster's slots are not read 5s after the first call")
		}
		time.Sleep(time.Millisecond)
	}
	vk.dead[0] = true
	for i := range 20 {
		_, err := lim.Allow(ctx, keyOn(0, i), limit)
		switch {
		case i < 3 && !errors.Is(err, context.DeadlineExceeded):
			t.Fatalf("dead shard, call %d: %v, want the deadline", i, err)
		case i >= 3 && !errors.Is(err, client.ErrCircuitOpen):
			t.Fatalf("dead shard, call %d: %v, want ErrCircuitOpen", i, err)
		}
		if r, err := lim.Allow(ctx, keyOn(1, i), limit); err != nil || r.Source == client.FromFallback {
			t.Fatalf("live shard, call %d: %+v, %v", i, r, err)
		}
	}
	if vk.sent[0] != 3 {
		t.Errorf("the dead shard was sent %d calls, want 3 (then its breaker opened)", vk.sent[0])
	}
	// The probe after the cooldown closes it once the shard is back.
	vk.dead[0] = false
	clock.advance(time.Second)
	if r, err := lim.Allow(ctx, keyOn(0, 99), limit); err != nil || r.Source == client.FromFallback {
		t.Fatalf("the probe: %+v, %v", r, err)
	}
}
