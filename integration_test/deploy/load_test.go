package deploy

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/integration_test/harness"
)

// TestDeployUnderLoad: while clients call every algorithm (and a peek) continuously on
// keys spread over all shards, an upgrade and a rollback complete with zero failed calls:
// FUNCTION LOAD REPLACE swaps the library atomically on each primary, and the contract of
// major version 1 keeps every call valid on either version.
func TestDeployUnderLoad(t *testing.T) {
	cl := sharedCluster(t)
	tg := discover(t, urlOf(cl.Primaries[0]))
	deploy(t, tg, v100, false)

	lim := client.New(cl.Client(t, false), client.WithDeadline(time.Second)) // ReturnError: any failure is an error here
	limits := []client.Limit{
		client.FixedWindow{Limit: 1000, Window: time.Second},
		client.SlidingLog{Limit: 100, Window: time.Second},
		client.SlidingWindow{Limit: 1000, Window: time.Second},
		client.TokenBucket{Capacity: 100, Rate: 1000, Period: time.Second},
		client.LeakyBucket{Capacity: 100, Rate: 1000, Period: time.Second, Mode: client.Police},
		client.LeakyBucket{Capacity: 100, Rate: 1000, Period: time.Second, Mode: client.Shape},
	}
	before := fcalls(t, cl)

	var calls, failed atomic.Int64
	var firstErr atomic.Value
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	const workers = 8
	for w := range workers {
		wg.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				key := fmt.Sprintf("load:%d:%d", w, n%256)
				limit := limits[n%len(limits)]
				var res client.Result
				var err error
				if n%7 == 0 {
					res, err = lim.Peek(ctx, key, limit)
				} else {
					res, err = lim.Allow(ctx, key, limit)
				}
				if ctx.Err() != nil {
					return // stopped mid-call: not a failure of the deploy
				}
				calls.Add(1)
				if err != nil || res.Local {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("%s %T: %v", key, limit, err))
				}
			}
		})
	}

	window := func(name string, f func()) {
		time.Sleep(300 * time.Millisecond) // traffic before, between and after the deploys
		c0, f0, began := calls.Load(), failed.Load(), time.Now()
		f()
		t.Logf("%s took %s; %d calls during it, %d failed",
			name, time.Since(began).Round(time.Millisecond), calls.Load()-c0, failed.Load()-f0)
	}
	window("upgrade 1.0.0 -> 1.1.0", func() { deploy(t, tg, v110, false) })
	window("rollback 1.1.0 -> 1.0.0 (forced)", func() { deploy(t, tg, v100, true) })
	time.Sleep(300 * time.Millisecond)
	stop()
	wg.Wait()

	t.Logf("under load: %d calls by %d goroutines, %d failed", calls.Load(), workers, failed.Load())
	if failed.Load() != 0 {
		t.Errorf("%d calls failed; first: %v", failed.Load(), firstErr.Load())
	}
	if calls.Load() < 1000 {
		t.Errorf("only %d calls: the load did not run", calls.Load())
	}
	after := fcalls(t, cl)
	for _, p := range cl.Primaries {
		if after[p.Addr] <= before[p.Addr] {
			t.Errorf("shard %s served no calls", p.Addr)
		}
	}
	for _, s := range cl.Nodes() {
		if v, err := rlVersion(t, s); err != nil || v != "1.0.0" {
			t.Errorf("%s: rl_version %q, %v", s.Addr, v, err)
		}
	}
}

// fcalls counts FCALL and FCALL_RO calls on every primary.
func fcalls(t *testing.T, cl *harness.Cluster) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, p := range cl.Primaries {
		c := p.Client(t)
		for _, cmd := range []string{"fcall", "fcall_ro"} {
			st, err := harness.CommandStats(t.Context(), c, cmd)
			if err != nil {
				t.Fatal(err)
			}
			out[p.Addr] += st.Calls
		}
	}
	return out
}
