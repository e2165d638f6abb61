package integration_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
)

// cancelDeadline is the Limiter's deadline in TestClientCancelWhilePaused: long, so that a
// call that returns well before it was ended by its cancel, not by the deadline.
const cancelDeadline = 4 * time.Second

// TestClientCancelWhilePaused: a call waiting on a server held by CLIENT PAUSE WRITE (FCALL
// may replicate, so it waits) returns soon after its caller cancels, with context.Canceled,
// under FailOpen too: a cancel is the caller's choice, never a policy decision. Cancelled
// calls are not failures of the server: the breaker (2 failures) stays closed, and once the
// pause ends the next call is the server's. What the server holds is what the contract
// allows for a call whose answer never arrived: the cancelled FCALLs already sent run when
// the pause ends and may each have charged once, no more; a call cancelled before it starts
// sends nothing. The cancelled contexts are plain ones and ones with a deadline of their own.
func TestClientCancelWhilePaused(t *testing.T) {
	for _, server := range standalones {
		t.Run(server.name, func(t *testing.T) {
			s := server.start(t)
			c, admin := s.Client(t), s.Client(t)
			loadCode(t, c, functions.Source)
			lim := harness.NewLimiter(t, c, client.Options{
				Deadline:        cancelDeadline,
				Fallback:        client.FailOpen,
				BreakerFailures: 2,
				BreakerCooldown: time.Minute,
			})
			limit := client.TokenBucket{Capacity: 100, Rate: 1, Period: time.Hour}
			key := "cancel:" + server.name

			if res, err := lim.Allow(ctx5s(t), key, limit); err != nil || !res.Allowed || res.Source == client.FromFallback {
				t.Fatalf("first call: %+v, %v", res, err)
			}
			before := commandCalls(t, admin, "fcall")

			// Cancelled before it starts: nothing is sent.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if _, err := lim.Allow(ctx, key, limit); !errors.Is(err, context.Canceled) {
				t.Fatalf("a call with a cancelled context: %v, want context.Canceled", err)
			}
			if after := commandCalls(t, admin, "fcall"); after.Calls != before.Calls {
				t.Errorf("a call cancelled before it started ran FCALL %d times", after.Calls-before.Calls)
			}

			if err := admin.Do(ctx5s(t), admin.B().ClientPause().Timeout(30000).Write().Build()).Error(); err != nil {
				t.Fatal(err)
			}
			unpaused := false
			unpause := func() {
				if !unpaused {
					unpaused = true
					if err := admin.Do(context.Background(), admin.B().ClientUnpause().Build()).Error(); err != nil {
						t.Error(err)
					}
				}
			}
			defer unpause()

			const cancelled = 3 // more than the breaker's 2 failures
			for i := range cancelled {
				ctx, cancel := context.WithCancel(context.Background())
				if i%2 == 1 {
					// A request's context often has a deadline of its own, here one before
					// the Limiter's: its cancel counts all the same.
					ctx, cancel = context.WithTimeout(context.Background(), cancelDeadline*3/4)
				}
				timer := time.AfterFunc(100*time.Millisecond, cancel)
				began := time.Now()
				res, err := lim.Allow(ctx, key, limit)
				took := time.Since(began)
				timer.Stop()
				cancel()
				if !errors.Is(err, context.Canceled) || res != (client.Result{}) {
					// valkey-go sends a lone call whose context has a deadline synchronously,
					// bounded by the deadline alone: its cancel is not watched. A client that
					// gives a cancelable context a deadline (WithDeadline) ends up there.
					t.Fatalf("call %d on the paused server, after %s: %+v, %v; want no decision and context.Canceled at the cancel", i, took, res, err)
				}
				// Loosely: the cancel at 100ms, not the 4s deadline, ended it.
				if took >= cancelDeadline/2 {
					t.Errorf("call %d returned %s after it began, not at its cancel (100ms)", i, took)
				}
			}
			unpause()

			res, err := lim.Allow(ctx5s(t), key, limit)
			if err != nil || res.Source == client.FromFallback {
				t.Fatalf("after the pause: %+v, %v; want the server's decision (cancels do not open the breaker)", res, err)
			}
			// The first call and this one charged 1 each; each cancelled call 0 or 1.
			used := limit.Capacity - res.Remaining
			if used < 2 || used > 2+cancelled {
				t.Errorf("%d units used, want between 2 and %d", used, 2+cancelled)
			}
			t.Logf("%d of %d cancelled calls ran once the pause ended", used-2, cancelled)
		})
	}
}
