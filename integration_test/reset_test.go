package integration_test

import (
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
)

// TestReset: Limiter.Reset deletes a principal's limiters (every unnamed one, concurrency
// included, or the limits given), leaves its block and every other principal alone, and drops
// this process's parked units and cached denials of it: the next calls are decided by a fresh
// limiter.
func TestReset(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		lim := harness.NewLimiter(t, tg.c, client.Options{
			Deadline: slowDeadline, Fallback: client.ReturnError,
			BudgetBatch: 8, BudgetAge: time.Minute, DenialCache: 100,
		})
		ctx := ctx5s(t)
		key, other := keyFor(t), keyFor(t)
		bucket := client.Limit(client.TokenBucket{Capacity: 3, Rate: 1, Period: time.Hour})
		hourly := client.Limit(client.FixedWindow{Limit: 2, Window: time.Hour, Name: "hourly"})
		leases := client.Concurrency{Limit: 1, Lease: time.Minute}
		exhaust := func(k string, l client.Limit) {
			t.Helper()
			for i := 0; i < 5; i++ {
				if _, err := lim.Allow(ctx, k, l); err != nil {
					t.Fatal(err)
				}
			}
			if res, err := lim.Allow(ctx, k, l); err != nil || res.Allowed {
				t.Fatalf("%s not exhausted: %+v, %v", k, res, err)
			}
		}
		exhaust(key, bucket)
		exhaust(key, hourly)
		exhaust(other, bucket)
		if _, res, err := lim.Acquire(ctx, key, leases); err != nil || !res.Allowed {
			t.Fatalf("lease: %+v, %v", res, err)
		}
		if _, err := lim.Block(ctx, key, time.Hour); err != nil {
			t.Fatal(err)
		}

		// every unnamed limiter: the bucket and the leases, not the named window
		n, err := lim.Reset(ctx, key)
		if err != nil || n != 2 {
			t.Fatalf("Reset(%s) = %d, %v; want the bucket's and the leases' keys deleted", key, n, err)
		}
		res, err := lim.Allow(ctx, key, bucket)
		if err != nil || !res.Allowed || res.Source == client.FromDenialCache || res.Remaining != 2 {
			t.Errorf("the bucket after Reset: %+v, %v; want a fresh bucket (2 left)", res, err)
		}
		if _, res, err := lim.Acquire(ctx, key, leases); err != nil || !res.Allowed {
			t.Errorf("a lease after Reset: %+v, %v", res, err)
		}
		if res, err := lim.Allow(ctx, key, hourly); err != nil || res.Allowed {
			t.Errorf("the named window, not given to Reset: %+v, %v; want still denied", res, err)
		}
		// the limits given
		if n, err := lim.Reset(ctx, key, hourly); err != nil || n != 1 {
			t.Errorf("Reset(%s, hourly) = %d, %v", key, n, err)
		}
		if res, err := lim.Allow(ctx, key, hourly); err != nil || !res.Allowed || res.Remaining != 1 {
			t.Errorf("the named window after Reset: %+v, %v", res, err)
		}
		// the others, and the block, are left
		if res, err := lim.Allow(ctx, other, bucket); err != nil || res.Allowed {
			t.Errorf("another principal after Reset: %+v, %v; want still denied", res, err)
		}
		if res, err := lim.PeekBlock(ctx, key); err != nil || !res.Blocked {
			t.Errorf("the block after Reset: %+v, %v; want kept", res, err)
		}
		if _, err := lim.Reset(ctx, ""); err == nil {
			t.Error("Reset of an empty key: no error")
		}
	})
}

// TestResetParked: units a leased budget parked for the principal are dropped with its state:
// after Reset, the server's fresh limiter decides, and Parked no longer counts them.
func TestResetParked(t *testing.T) {
	tg := servers(t)[0]
	lim := harness.NewLimiter(t, tg.c, client.Options{
		Deadline: slowDeadline, Fallback: client.ReturnError, BudgetBatch: 16, BudgetAge: time.Minute,
	})
	ctx := ctx5s(t)
	key := keyFor(t)
	limit := client.Limit(client.TokenBucket{Capacity: 1000, Rate: 1, Period: time.Hour})
	for i := 0; i < 200 && lim.Parked() == 0; i++ {
		if _, err := lim.Allow(ctx, key, limit); err != nil {
			t.Fatal(err)
		}
	}
	if lim.Parked() == 0 {
		t.Fatal("no units parked after 200 hot calls")
	}
	if _, err := lim.Reset(ctx, key); err != nil {
		t.Fatal(err)
	}
	if p := lim.Parked(); p != 0 {
		t.Errorf("Parked after Reset = %d, want 0", p)
	}
	res, err := lim.Peek(ctx, key, limit)
	if err != nil || res.Remaining != 1000 {
		t.Errorf("the server's limiter after Reset: %+v, %v; want fresh", res, err)
	}
}
