package integration_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
)

// Wait sleeps out a denial and is then admitted; it fails at once, consuming nothing, when
// the wait would pass the context's deadline or no wait can admit the cost; a Shape-mode
// Delay is held, and refunded when it would pass the deadline.
func TestWait(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		limit := client.TokenBucket{Capacity: 2, Rate: 1, Period: 300 * time.Millisecond}
		key := keyFor(t)
		if r, err := lim.AllowN(ctx, key, limit, 2); err != nil || !r.Allowed {
			t.Fatalf("empty the bucket: %+v, %v", r, err)
		}
		if err := lim.Wait(ctx, key, limit); err != nil {
			t.Fatalf("Wait: %v", err)
		}
		// Wait took the unit that came back: the bucket is empty again.
		if r, err := lim.Peek(ctx, key, limit); err != nil || r.Allowed || r.RetryAfter <= 0 {
			t.Fatalf("after Wait: %+v, %v; want the refilled unit taken", r, err)
		}

		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		slow := client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Hour}
		key2 := keyFor(t)
		if r, err := lim.Allow(ctx, key2, slow); err != nil || !r.Allowed {
			t.Fatalf("%+v, %v", r, err)
		}
		start := time.Now()
		err := lim.Wait(short, key2, slow)
		if !errors.Is(err, client.ErrWaitPastDeadline) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a wait of an hour within 50ms: %v, want ErrWaitPastDeadline", err)
		}
		if time.Since(start) >= 50*time.Millisecond && short.Err() != nil {
			t.Fatal("Wait slept to its deadline instead of failing at once")
		}
		if err := lim.WaitN(ctx, key2, slow, 2); !errors.Is(err, client.ErrCostOverLimit) {
			t.Fatalf("cost 2 of a capacity of 1: %v, want ErrCostOverLimit", err)
		}

		// Shape mode: the second request is held for its Delay; one whose Delay would pass the
		// deadline gives its unit back.
		shape := client.LeakyBucket{Capacity: 3, Rate: 1, Period: 100 * time.Millisecond, Mode: client.Shape}
		key3 := keyFor(t)
		for range 2 {
			if err := lim.Wait(ctx, key3, shape); err != nil {
				t.Fatal(err)
			}
		}
		hourly := client.LeakyBucket{Capacity: 3, Rate: 1, Period: time.Hour, Mode: client.Shape}
		key4 := keyFor(t)
		if err := lim.Wait(ctx, key4, hourly); err != nil {
			t.Fatal(err)
		}
		if err := lim.Wait(ctx, key4, hourly); !errors.Is(err, client.ErrWaitPastDeadline) {
			t.Fatalf("a Delay of an hour within 5s: %v", err)
		}
		if r, err := lim.Peek(ctx, key4, hourly); err != nil || r.Remaining != 2 {
			t.Fatalf("after a Delay past the deadline: %+v, %v; want the held unit given back (2 remaining)", r, err)
		}
	})
}
