package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"

	"github.com/rlfn/rlfn/client"
)

// replyClient answers every command with one reply. Its builder is mock.Client's, which is
// valkey-go's own; gomock's expectations are left out because matching a call costs more than
// the client does.
type replyClient struct {
	*mock.Client
	reply valkey.ValkeyResult
}

func (c replyClient) Do(context.Context, valkey.Completed) valkey.ValkeyResult { return c.reply }

// BenchmarkAllow is the client's own cost per decision: validation, key, command, decoding.
// A real valkey-go client recycles each command after Do; this one cannot (the pool is
// internal), so the numbers include building one command from scratch (BenchmarkBuilder).
func BenchmarkAllow(b *testing.B) {
	vk := replyClient{mock.NewClient(nil), mock.Result(ints(1, 100, 99, 0, 1000, 0))}
	lim := client.New(vk)
	ctx := context.Background()
	for _, l := range []client.Limit{
		client.FixedWindow{Limit: 100, Window: time.Minute},
		client.SlidingLog{Limit: 100, Window: time.Minute},
		client.SlidingWindow{Limit: 100, Window: time.Minute},
		client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second},
		client.LeakyBucket{Capacity: 100, Rate: 10, Period: time.Second, Mode: client.Shape},
	} {
		b.Run(client.Key("", "", l)[len("{%}:"):], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := lim.Allow(ctx, "user:42", l); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkBuilder is the part of BenchmarkAllow a real client recycles: one command built
// from constant strings.
func BenchmarkBuilder(b *testing.B) {
	vk := mock.NewClient(nil)
	b.ReportAllocs()
	for b.Loop() {
		_ = vk.B().Fcall().Function("rl_token_bucket").Numkeys(1).Key("rl:{user:42}:token_bucket").
			Arg("100", "10", "1000", "1").Build()
	}
}
