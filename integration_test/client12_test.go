package integration_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
)

// A calendar quota through the client, on every target: admitted up to its limit in the
// window that holds now, denied until that window's end, its key expiring exactly then, and
// admitted again once the next window has begun. The window is a UTC day anchored a moment
// ahead of now, so that it ends while the test watches.
func TestClientCalendar(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		key := keyFor(t)
		end := time.Now().UTC().Add(1500 * time.Millisecond).Truncate(time.Millisecond)
		daily := client.Calendar{Limit: 3, Period: client.Day, Anchor: end}
		if q := daily.Quota(); q.Limit != 3 || q.Window != 24*time.Hour {
			t.Errorf("quota %+v, want 3 per 24h", q)
		}
		for i := range 3 {
			if r, err := lim.Allow(ctx, key, daily); err != nil || !r.Allowed || r.Remaining != int64(2-i) {
				t.Fatalf("call %d: %+v, %v", i+1, r, err)
			}
		}
		r, err := lim.Allow(ctx, key, daily)
		left := time.Until(end)
		if err != nil || r.Allowed || r.RetryAfter <= 0 || r.RetryAfter > left+50*time.Millisecond || r.RetryAfter < left-time.Second {
			t.Fatalf("the fourth: %+v, %v; want denied until the window's end in %s", r, err, left)
		}
		if s := snap(t, tg.c, lim.Key(key, daily)); !s.exists || s.expiry != end.UnixMilli() {
			t.Errorf("the calendar key expires at %d, want the window's end %d", s.expiry, end.UnixMilli())
		}
		// the peek and a refund see the same window
		if r, err := lim.Peek(ctx, key, daily); err != nil || r.Allowed {
			t.Errorf("peek: %+v, %v", r, err)
		}
		if r, err := lim.Refund(ctx, key, daily, 1); err != nil || r.Remaining != 1 {
			t.Errorf("refund: %+v, %v", r, err)
		}
		if r, err := lim.AllowN(ctx, key, daily, 2); err != nil || r.Allowed {
			t.Errorf("2 units with 1 left: %+v, %v", r, err)
		}
		time.Sleep(time.Until(end) + 20*time.Millisecond)
		if r, err := lim.AllowN(ctx, key, daily, 3); err != nil || !r.Allowed || r.Remaining != 0 {
			t.Fatalf("the next window: %+v, %v", r, err)
		}
		next := end.Add(24 * time.Hour)
		if s := snap(t, tg.c, lim.Key(key, daily)); s.expiry != next.UnixMilli() {
			t.Errorf("the next window's key expires at %d, want %d", s.expiry, next.UnixMilli())
		}
		// a calendar beside a token bucket of the same principal: one rl_multi
		tb := client.TokenBucket{Capacity: 5, Rate: 1, Period: time.Hour}
		r, err = lim.AllowAll(ctx, []client.Rule{{Key: key, Limit: tb}, {Key: key, Limit: daily}})
		if err != nil || r.Allowed || r.Rule != 1 {
			t.Errorf("AllowAll with the calendar spent: %+v, %v", r, err)
		}
		if p, err := lim.Peek(ctx, key, tb); err != nil || p.Remaining != 5 {
			t.Errorf("the token bucket took from a denied decision: %+v, %v", p, err)
		}
	})
}

// A limit with a penalty blocks its principal from its first denial, for the penalty, from
// the denial (not from the window's end); a call refused during the block never lengthens
// it; an operator's Block and Unblock act on a principal being hammered.
func TestClientPenalty(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		key := keyFor(t)
		fw := client.FixedWindow{Limit: 2, Window: 200 * time.Millisecond, Penalty: 3 * time.Second}
		roomInWindow(t, tg.c, 200, 150*time.Millisecond)
		for i := range 2 {
			if r, err := lim.Allow(ctx, key, fw); err != nil || !r.Allowed || r.Blocked {
				t.Fatalf("call %d: %+v, %v", i+1, r, err)
			}
		}
		denied := time.Now()
		r, err := lim.Allow(ctx, key, fw)
		if err != nil || r.Allowed || !r.Blocked || r.RetryAfter != fw.Penalty {
			t.Fatalf("the denial: %+v, %v; want the block of the penalty, from now", r, err)
		}
		blockKey := lim.Key(key, fw)[:len(lim.Key(key, fw))-len("fixed_window")] + "block"
		until := snap(t, tg.c, blockKey).expiry
		if d := time.UnixMilli(until).Sub(denied); d < fw.Penalty-time.Second || d > fw.Penalty+time.Second {
			t.Fatalf("blocked until %s after the denial, want the penalty %s", d, fw.Penalty)
		}
		// refused during the block, even in a new window: never extends it
		time.Sleep(300 * time.Millisecond)
		for range 20 {
			r, err := lim.Allow(ctx, key, fw)
			if err != nil || r.Allowed || !r.Blocked || r.RetryAfter > fw.Penalty {
				t.Fatalf("during the block: %+v, %v", r, err)
			}
		}
		if got := snap(t, tg.c, blockKey).expiry; got != until {
			t.Fatalf("the block moved from %d to %d while refused calls came", until, got)
		}
		if r, err := lim.PeekBlock(ctx, key); err != nil || !r.Blocked || r.RetryAfter <= 0 {
			t.Errorf("PeekBlock: %+v, %v", r, err)
		}
		// the operator lifts it while a client hammers the principal
		var admitted, blocked atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := lim.Allow(ctx, key, fw)
				switch {
				case err != nil:
					t.Error(err)
					return
				case r.Allowed:
					admitted.Add(1)
				case r.Blocked:
					blocked.Add(1)
				}
			}
		})
		time.Sleep(100 * time.Millisecond)
		if admitted.Load() != 0 {
			t.Errorf("%d admitted during the block", admitted.Load())
		}
		if r, err := lim.Unblock(ctx, key); err != nil || r.Blocked || !r.Allowed {
			t.Errorf("Unblock: %+v, %v", r, err)
		}
		time.Sleep(100 * time.Millisecond)
		if admitted.Load() == 0 {
			t.Error("nothing admitted after Unblock")
		}
		// the limit denies again within its window and the penalty blocks again; then an
		// operator's Block replaces that block with a shorter one
		time.Sleep(300 * time.Millisecond)
		if r, err := lim.Block(ctx, key, 500*time.Millisecond); err != nil || !r.Blocked || r.RetryAfter != 500*time.Millisecond {
			t.Errorf("Block: %+v, %v", r, err)
		}
		close(stop)
		wg.Wait()
		if r, err := lim.PeekBlock(ctx, key); err != nil || !r.Blocked || r.RetryAfter > 500*time.Millisecond {
			t.Errorf("after Block for 500ms: %+v, %v", r, err)
		}
		time.Sleep(600 * time.Millisecond)
		if r, err := lim.PeekBlock(ctx, key); err != nil || r.Blocked {
			t.Errorf("after the block's end: %+v, %v", r, err)
		}
		t.Logf("while hammered: %d blocked, %d admitted between Unblock and Block", blocked.Load(), admitted.Load())
	})
}

// A node still on 1.1.0 answers the calls that need 1.2.0 with the client's version error
// naming it (ReturnError), or leaves them to the Fallback; the 1.1 calls it can decide go on
// being decided by it, not by the memory of its refusal.
func TestClientVersionErrorOn11(t *testing.T) {
	v11 := release(t, "1.1.0")
	s := harness.StartValkey(t)
	loadCode(t, s.Client(t), v11.Code)
	vk := s.Client(t)
	ctx := ctx5s(t)
	key := keyFor(t)
	daily := client.Calendar{Limit: 5, Period: client.Day}
	reserved := client.TokenBucket{Capacity: 5, Rate: 1, Period: time.Hour, Reserve: 1}
	penalized := client.FixedWindow{Limit: 5, Window: time.Minute, Penalty: time.Minute}

	strict := harness.NewLimiter(t, vk, slowMachine)
	for _, c := range []struct {
		what string
		call func() (client.Result, error)
	}{
		{"rl_calendar", func() (client.Result, error) { return strict.Allow(ctx, key, daily) }},
		{"rl_multi block", func() (client.Result, error) { return strict.Allow(ctx, key, penalized) }},
		{"rl_block", func() (client.Result, error) { return strict.Block(ctx, key, time.Second) }},
	} {
		_, err := c.call()
		var ve *client.VersionError
		if !errors.As(err, &ve) || ve.Node != s.Addr || ve.Version != "1.1.0" || ve.Want != "1.2.0" || ve.Function != c.what {
			t.Errorf("%s: got %v, want a *VersionError naming %s, 1.1.0 and %s", c.what, err, s.Addr, c.what)
		}
		// a 1.1 call right after: the node decides it
		if r, err := strict.Allow(ctx, key, reserved); err != nil || r.Source != client.FromServer {
			t.Errorf("a 1.1 call after %s: %+v, %v", c.what, r, err)
		}
	}

	local := harness.NewLimiter(t, vk, asShipped)
	if r, err := local.Allow(ctx, key+":local", daily); err != nil || !r.Allowed || r.Source != client.FromFallback {
		t.Errorf("a calendar on 1.1.0 under the default fallback: %+v, %v; want decided locally", r, err)
	}
	fcalls := commandCalls(t, vk, "fcall").Calls
	for range 5 {
		if r, err := local.Allow(ctx, key+":local", daily); err != nil || r.Source != client.FromFallback {
			t.Errorf("%+v, %v", r, err)
		}
		if r, err := local.Allow(ctx, key+":local", reserved); err != nil || r.Source != client.FromServer {
			t.Errorf("a 1.1 call between: %+v, %v", r, err)
		}
	}
	if n := commandCalls(t, vk, "fcall").Calls - fcalls; n != 5 {
		t.Errorf("the node ran %d FCALL for 5 calendar and 5 token bucket calls, want the 5 it can decide", n)
	}
	if err := local.CheckRules(context.Background(), client.Rule{Key: key, Limit: daily}); err == nil {
		t.Error("CheckRules of a calendar on 1.1.0 found nothing")
	}
}

// AllowAll across keys with a calendar: all or nothing, so a denial by the other key leaves
// the calendar's window as it was (refunded, or never taken when the denying key is asked
// first), and an admission takes from both.
// TestClientCalendarFutureAnchor: an Anchor in the future sets the windows' phase (here the
// 15th at midnight UTC), as one in the past does: the quota counts in the window that holds
// now, not from the anchor.
func TestClientCalendarFutureAnchor(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		key := keyFor(t)
		monthly := client.Calendar{Limit: 2, Period: client.Month, Anchor: time.Date(2031, 6, 15, 0, 0, 0, 0, time.UTC)}
		for i := range 2 {
			if r, err := lim.Allow(ctx, key, monthly); err != nil || !r.Allowed {
				t.Fatalf("call %d: %+v, %v", i+1, r, err)
			}
		}
		r, err := lim.Allow(ctx, key, monthly)
		end := time.Now().Add(r.RetryAfter).UTC().Round(time.Minute)
		if err != nil || r.Allowed || r.RetryAfter > 31*24*time.Hour || end.Day() != 15 || end.Hour() != 0 || end.Minute() != 0 {
			t.Fatalf("the third: %+v, %v; want denied until the next 15th at 00:00 UTC (until %s)", r, err, end)
		}
	})
}

func TestClientCalendarAcrossKeys(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		user, global := keyFor(t)+":user", keyFor(t)+":global"
		monthly := client.Calendar{Limit: 5, Period: client.Month, Anchor: time.Now().UTC().AddDate(0, 0, 10)}
		ceiling := client.TokenBucket{Capacity: 2, Rate: 1, Period: time.Hour}
		rules := []client.Rule{{Key: user, Limit: monthly}, {Key: global, Limit: ceiling}}
		for i := range 2 {
			if r, err := lim.AllowAll(ctx, rules); err != nil || !r.Allowed {
				t.Fatalf("decision %d: %+v, %v", i+1, r, err)
			}
		}
		for range 3 {
			if r, err := lim.AllowAll(ctx, rules); err != nil || r.Allowed || r.Rule != 1 {
				t.Fatalf("with the ceiling spent: %+v, %v", r, err)
			}
		}
		if r, err := lim.Peek(ctx, user, monthly); err != nil || r.Remaining != 3 {
			t.Errorf("the calendar after 2 admitted and 3 denied decisions: %+v, %v; want 3 left", r, err)
		}
	})
}
