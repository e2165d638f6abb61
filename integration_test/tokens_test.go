package integration_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
)

// An exact token budget through the client: 200 streams metered at once (client.Meter) share
// 10,000 tokens a window. A sampler reads the limiter's count and its holds (one read-only
// script, nothing else) while they run: the count is never above the budget. Each stream
// settles what it used of what it was granted; in the end the count is exactly the sum of the
// settlements, at most the budget, and no hold is left.
func TestClientMetersShareABudget(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		const budget, streams = 10_000, 200
		ctx := ctx5s(t)
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		key := keyFor(t)
		// a window of 10^11 ms: the budget never resets during the test
		tokens := client.FixedWindow{Limit: budget, Window: 100_000_000_000 * time.Millisecond}
		keys := []string{lim.Key(key, tokens), holdKeyOf(lim, key, tokens)}
		stop := make(chan struct{})
		var samples, worst atomic.Int64
		var sampler sync.WaitGroup
		sampler.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				charged, held := sample(t, tg.c, keys)
				samples.Add(1)
				if charged > budget || held > charged {
					t.Errorf("sampled: %d charged, %d held, budget %d", charged, held, budget)
				}
				if charged > worst.Load() {
					worst.Store(charged)
				}
			}
		})
		var settled, cut, denied atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, streams)
		for w := range streams {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 7))
				want := 20 + rng.Int64N(130) // what the stream would use
				m, res, err := lim.Meter(ctx, []client.Rule{{Key: key, Limit: tokens, Cost: 50}},
					client.MeterOptions{Hold: client.HoldOptions{TTL: time.Minute}, PerUnit: []int64{1}})
				if err != nil {
					errs <- err
					return
				}
				if !res.Allowed {
					denied.Add(1)
					return
				}
				used := int64(0)
				for used < want {
					step := min(7, want-used)
					ok, err := m.Take(ctx, step)
					if err != nil {
						errs <- err
						return
					}
					if !ok {
						cut.Add(1)
						break
					}
					used += step
				}
				// bill what was used of what was granted (a cut stream used up to its grant)
				actual := min(m.Used(), m.Granted())
				if _, err := m.Settle(ctx, []int64{actual}); err != nil {
					errs <- fmt.Errorf("settle of %d: %w", actual, err)
					return
				}
				settled.Add(actual)
			})
		}
		wg.Wait()
		close(stop)
		sampler.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		charged, held := sample(t, tg.c, keys)
		t.Logf("%d streams: %d tokens settled, %d charged (%d short of the budget), %d held at the end, %d cut, %d refused, %d samples, at most %d charged",
			streams, settled.Load(), charged, budget-charged, held, cut.Load(), denied.Load(), samples.Load(), worst.Load())
		if held != 0 || charged != settled.Load() || charged > budget {
			t.Fatalf("in the end: %d charged, %d held, %d settled; budget %d", charged, held, settled.Load(), budget)
		}
		if cut.Load()+denied.Load() == 0 || charged < budget*9/10 {
			t.Fatalf("%d charged, %d streams cut or refused: the budget was never reached", charged, cut.Load()+denied.Load())
		}
	})
}

// Streams that each want more than the budget, and use all they are granted, end it exactly:
// a stream whose batch is refused takes what the reply says is left, and tries again (a few
// times) while another stream took it first, so that no units stay unused while streams wait
// for them. 200 streams, each holding 10 and taking batches of 10, a unit at a time.
func TestClientMetersEndABudgetExactly(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		const budget, streams = 10_000, 200
		ctx := ctx5s(t)
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		key := keyFor(t)
		tokens := client.FixedWindow{Limit: budget, Window: 100_000_000_000 * time.Millisecond}
		var granted, refused atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, streams)
		for range streams {
			wg.Go(func() {
				m, res, err := lim.Meter(ctx, []client.Rule{{Key: key, Limit: tokens, Cost: 10}},
					client.MeterOptions{Hold: client.HoldOptions{TTL: time.Minute}, PerUnit: []int64{1}, Batch: 10})
				if err != nil {
					errs <- err
					return
				}
				if !res.Allowed {
					refused.Add(1)
					return
				}
				for {
					ok, err := m.Take(ctx, 1)
					if err != nil {
						errs <- err
						return
					}
					if !ok {
						break
					}
				}
				if r := m.Result(); r.Allowed || r.Rule != 0 || r.Limit != budget {
					t.Errorf("a cut meter's Result: %+v, want the budget's refusal", r)
				}
				if _, err := m.Settle(ctx, []int64{m.Granted()}); err != nil {
					errs <- err
					return
				}
				granted.Add(m.Granted())
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		charged, held := sample(t, tg.c, []string{lim.Key(key, tokens), holdKeyOf(lim, key, tokens)})
		t.Logf("%d streams: %d charged (%d short of the budget), %d held, %d refused", streams, charged, budget-charged, held, refused.Load())
		if charged != granted.Load() || held != 0 || charged != budget {
			t.Errorf("%d charged, %d granted, %d held; want the whole budget, %d", charged, granted.Load(), held, budget)
		}
	})
}
