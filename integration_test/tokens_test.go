package integration_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

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
		stopSampling := sampleBudget(t, tg.c, keys, budget)
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
		samples, worst := stopSampling()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		charged, held := sample(t, tg.c, keys)
		t.Logf("%d streams: %d tokens settled, %d charged (%d short of the budget), %d held at the end, %d cut, %d refused, %d samples, at most %d charged",
			streams, settled.Load(), charged, budget-charged, held, cut.Load(), denied.Load(), samples, worst)
		if held != 0 || charged != settled.Load() || charged > budget {
			t.Fatalf("in the end: %d charged, %d held, %d settled; budget %d", charged, held, settled.Load(), budget)
		}
		if cut.Load()+denied.Load() == 0 || charged < budget*9/10 {
			t.Fatalf("%d charged, %d streams cut or refused: the budget was never reached", charged, cut.Load()+denied.Load())
		}
	})
}

// racer is a client that lets another caller take units right before a given command: the
// concurrent stream of a test, at the instant that decides, on the real server.
type racer struct {
	valkey.Client
	before func(cmd []string) // called with each command Do sends, before it is sent
}

func (r racer) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	r.before(cmd.Commands())
	return r.Client.Do(ctx, cmd)
}

// A refused batch takes what its reply says is left, and when another stream takes part of it
// first (that try is refused), tries again for what the new reply says: the budget ends full,
// not with the other stream's leftovers unused.
func TestClientMeterTriesForWhatIsLeft(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		other := harness.NewLimiter(t, tg.c, slowMachine)
		key := keyFor(t)
		fw := client.FixedWindow{Limit: 100, Window: 100_000_000_000 * time.Millisecond}
		raced := false
		lim := harness.NewLimiter(t, racer{tg.c, func(cmd []string) {
			// the meter's first try for the 30 left: another stream takes 5 of them first
			if len(cmd) > 8 && cmd[1] == "rl_hold" && cmd[8] == "30" && !raced {
				raced = true
				if res, err := other.AllowN(ctx, key, fw, 5); err != nil || !res.Allowed {
					t.Errorf("the other stream: %+v, %v", res, err)
				}
			}
		}}, slowMachine)
		m, res, err := lim.Meter(ctx, []client.Rule{{Key: key, Limit: fw, Cost: 10}},
			client.MeterOptions{Hold: client.HoldOptions{TTL: time.Minute}, PerUnit: []int64{1}, Batch: 50})
		if err != nil || !res.Allowed {
			t.Fatal(res, err)
		}
		if res, err := other.AllowN(ctx, key, fw, 60); err != nil || !res.Allowed {
			t.Fatal(res, err)
		}
		// 30 left: the batch of 50 is refused, the try for 30 too (25 left by then), 25 taken
		ok, err := m.Take(ctx, 11)
		if err != nil || !ok || !raced || m.Granted() != 35 {
			t.Errorf("take 11: %t, %v (raced %t); granted %d, want 10 + 25", ok, err, raced, m.Granted())
		}
		if left := heldLeft(t, lim, key, fw); left != 0 {
			t.Errorf("%d left unused, want the budget full", left)
		}
		if err := m.Close(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
