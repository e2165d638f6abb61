package rls_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/valkey-io/valkey-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/rls"
)

// pauseAtRefund is a valkey.Client that pauses the server (pause) when the first refund is
// sent: a node that stops answering in the middle of a refused request's refunds.
type pauseAtRefund struct {
	valkey.Client
	once  sync.Once
	pause func()
}

func (p *pauseAtRefund) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	if args := cmd.Commands(); len(args) > 1 && strings.HasSuffix(args[1], "_refund") {
		p.once.Do(p.pause)
	}
	return p.Client.Do(ctx, cmd)
}

// A request of 500 descriptors within their limits and one quota descriptor over its own:
// refused after its limits admitted, so its 500 units are refunded, while the server stops
// answering (CLIENT PAUSE WRITE, 1.5s) from the first refund. The refunds the open breaker kept
// from being sent are tried again until the server answers: once it does, every unit is given
// back, or rlfn.client.refunds.lost counts those that may not have been (sent and not
// answered). On standalone servers: a cluster's CLIENT PAUSE would stop one shard of several.
func TestUndoWhilePaused(t *testing.T) {
	for _, b := range backends(t) {
		if len(b.addrs) > 1 {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			const n = 500
			pause := 1500 * time.Millisecond
			pb2 := *b
			pb2.vk = &pauseAtRefund{Client: b.vk, pause: func() {
				if err := b.vk.Do(context.Background(), b.vk.B().ClientPause().Timeout(pause.Milliseconds()).Write().Build()).Error(); err != nil {
					t.Error(err)
				}
			}}
			reader := sdkmetric.NewManualReader()
			r := newRig(t, &pb2, config, client.Options{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))},
				rls.ServerOptions{}, rls.Options{MaxDescriptors: n + 1})
			user := fmt.Sprint(time.Now().UnixNano())
			if resp := r.ask(t, request("edge", desc("quota1", user))); resp.OverallCode != pb.RateLimitResponse_OK {
				t.Fatalf("quota: %v", resp)
			}
			ds := func(h uint64) []*rlv3.RateLimitDescriptor {
				var ds []*rlv3.RateLimitDescriptor
				for i := range n {
					ds = append(ds, hits(desc("loose", fmt.Sprint(user, "-", i)), h))
				}
				return ds
			}
			// "loose" takes 100 an hour: the refunds are owed for the rest of the hour.
			resp := r.ask(t, request("edge", append(ds(1), desc("quota1", user))...))
			if resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("refused by its quota: %v", resp)
			}
			taken, lost := int64(0), int64(0)
			for deadline := time.Now().Add(30 * time.Second); ; {
				time.Sleep(200 * time.Millisecond)
				resp, err := r.call(request("edge", ds(0)...))
				if err != nil {
					continue // the server is paused, or its breaker is open
				}
				taken = 0
				for _, st := range resp.Statuses {
					taken += int64(100 - st.LimitRemaining)
				}
				lost = 0
				for name, v := range sums(t, reader) {
					if strings.HasPrefix(name, "rlfn.client.refunds.lost") {
						lost += v
					}
				}
				if taken <= lost || time.Now().After(deadline) {
					break
				}
			}
			t.Logf("%d units still taken, %d lost by the metric", taken, lost)
			if taken > lost {
				t.Errorf("%d units still taken, the metric says %d may not have been given back", taken, lost)
			}
			if lost == n {
				t.Error("every refund lost: none was owed and tried again")
			}
		})
	}
}
