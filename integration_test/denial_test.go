package integration_test

import (
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
)

// After a denial, the calls within its RetryAfter are answered without the server, with
// RetryAfter counting down; once it has passed, the next call goes to the server and is
// admitted. A refund through the Limiter drops the denial.
func TestDenialCache(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		cc := &countingClient{Client: tg.c}
		lim := harness.NewLimiter(t, cc, client.Options{Deadline: slowDeadline, Fallback: client.ReturnError, DenialCache: 1000})
		limit := client.TokenBucket{Capacity: 3, Rate: 1, Period: 400 * time.Millisecond}
		key := keyFor(t)
		for i := range 3 {
			if r, err := lim.Allow(ctx, key, limit); err != nil || !r.Allowed {
				t.Fatalf("call %d: %+v, %v", i, r, err)
			}
		}
		denied, err := lim.Allow(ctx, key, limit)
		if err != nil || denied.Allowed || denied.Source == client.FromDenialCache || denied.RetryAfter <= 0 {
			t.Fatalf("the 4th call: %+v, %v; want denied by the server", denied, err)
		}
		sentBefore, _ := cc.count("rl_token_bucket")
		last := denied.RetryAfter
		for i := range 50 {
			r, err := lim.Allow(ctx, key, limit)
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed {
				// the denial ran out: it can only be after RetryAfter (see below)
				break
			}
			if r.Source != client.FromDenialCache || r.RetryAfter > last || r.Limit != 3 || r.Remaining != 0 {
				t.Fatalf("call %d within RetryAfter: %+v, want a cached denial counting down from %v", i, r, last)
			}
			last = r.RetryAfter
		}
		if n, _ := cc.count("rl_token_bucket"); n != sentBefore {
			t.Fatalf("%d calls sent within RetryAfter, want none", n-sentBefore)
		}
		// Another cost is another call: the server decides it.
		if r, err := lim.AllowN(ctx, key, limit, 2); err != nil || r.Allowed || r.Source == client.FromDenialCache {
			t.Fatalf("cost 2: %+v, %v; want denied by the server", r, err)
		}
		time.Sleep(last + 5*time.Millisecond)
		r, err := lim.Allow(ctx, key, limit)
		if err != nil || !r.Allowed || r.Source == client.FromDenialCache {
			t.Fatalf("after RetryAfter: %+v, %v; want admitted by the server", r, err)
		}
		if n, _ := cc.count("rl_token_bucket"); n != sentBefore+2 {
			t.Fatalf("%d calls sent, want the cost 2 and the one after RetryAfter", n-sentBefore)
		}

		// A refund through the Limiter drops the denial: the next call is the server's.
		r, err = lim.Allow(ctx, key, limit)
		if err != nil || r.Allowed {
			t.Fatalf("empty again: %+v, %v", r, err)
		}
		if r, err := lim.Allow(ctx, key, limit); err != nil || r.Source != client.FromDenialCache {
			t.Fatalf("denied again: %+v, %v; want cached", r, err)
		}
		if _, err := lim.Refund(ctx, key, limit, 1); err != nil {
			t.Fatal(err)
		}
		if r, err := lim.Allow(ctx, key, limit); err != nil || !r.Allowed || r.Source == client.FromDenialCache {
			t.Fatalf("after the refund: %+v, %v; want admitted by the server", r, err)
		}
	})
}
