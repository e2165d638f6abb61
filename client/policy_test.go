package client_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"
	"go.uber.org/mock/gomock"

	"github.com/rlfn/rlfn/client"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(1_700_000_000_000 * int64(time.Millisecond))
	return c
}

func (c *fakeClock) now() int64              { return c.ns.Load() }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

var (
	refused  = mock.ErrorResult(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
	timedOut = mock.ErrorResult(context.DeadlineExceeded)
	missing  = mock.Result(mock.ValkeyError("ERR Function not found"))
	loading  = mock.Result(mock.ValkeyError("LOADING Valkey is loading the dataset in memory"))
	garbled  = mock.Result(ints(9))
	rlerr    = mock.Result(mock.ValkeyError("RLERR rl_token_bucket: key 'k' does not hold rl_token_bucket state"))
)

// Each policy decides the calls the server could not, and none decides a caller's bug.
func TestPolicies(t *testing.T) {
	bucket := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}
	failures := []struct {
		name string
		give valkey.ValkeyResult
	}{
		{"unreachable", refused},
		{"timeout", timedOut},
		{"not loaded", missing},
		{"server error", loading},
		{"reply out of contract", garbled},
	}
	tests := []struct {
		policy client.Fallback
		want   client.Result
	}{
		{policy: client.FailOpen, want: client.Result{Allowed: true, Limit: 10, Remaining: 9, Source: client.FromFallback}},
		{policy: client.FailClosed, want: client.Result{Limit: 10, RetryAfter: time.Second, ResetAfter: time.Second, Source: client.FromFallback}},
		// 2 instances: capacity 5, 1 token per 2s
		{policy: client.LocalFallback, want: client.Result{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: 2 * time.Second, Source: client.FromFallback}},
	}
	for _, tt := range tests {
		for _, f := range failures {
			t.Run(tt.policy.String()+"/"+f.name, func(t *testing.T) {
				vk := mock.NewClient(gomock.NewController(t))
				vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(f.give).AnyTimes()
				lim := newLimiter(t, vk, client.Options{Fallback: tt.policy, Instances: 2})
				got, err := lim.Allow(context.Background(), "k", bucket)
				if err != nil || got != tt.want {
					t.Fatalf("got %+v, %v; want %+v, nil", got, err, tt.want)
				}
			})
		}
		t.Run(tt.policy.String()+"/RLERR is returned", func(t *testing.T) {
			vk := mock.NewClient(gomock.NewController(t))
			vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(rlerr)
			got, err := newLimiter(t, vk, client.Options{Fallback: tt.policy}).Allow(context.Background(), "k", bucket)
			var le *client.LibraryError
			if !errors.As(err, &le) || got != (client.Result{}) {
				t.Fatalf("got %+v, %v; want a *LibraryError", got, err)
			}
		})
		t.Run(tt.policy.String()+"/a bad limit is returned", func(t *testing.T) {
			lim := newLimiter(t, mock.NewClient(gomock.NewController(t)), client.Options{Fallback: tt.policy})
			var le *client.LimitError
			if _, err := lim.Allow(context.Background(), "k", client.TokenBucket{}); !errors.As(err, &le) {
				t.Fatalf("got %v, want a *LimitError", err)
			}
		})
		t.Run(tt.policy.String()+"/a canceled call is returned", func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			vk := mock.NewClient(gomock.NewController(t))
			vk.EXPECT().Do(gomock.Any(), gomock.Any()).DoAndReturn(func(context.Context, valkey.Completed) valkey.ValkeyResult {
				cancel()
				return mock.ErrorResult(context.Canceled)
			})
			_, err := newLimiter(t, vk, client.Options{Fallback: tt.policy}).Allow(ctx, "k", bucket)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("got %v, want context.Canceled", err)
			}
			// and a context done before the call sends nothing
			if _, err := newLimiter(t, vk, client.Options{Fallback: tt.policy}).Allow(ctx, "k", bucket); !errors.Is(err, context.Canceled) {
				t.Fatalf("got %v, want context.Canceled", err)
			}
		})
		t.Run(tt.policy.String()+"/cost above the limit is never admitted", func(t *testing.T) {
			vk := mock.NewClient(gomock.NewController(t))
			vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(refused)
			got, err := newLimiter(t, vk, client.Options{Fallback: tt.policy}).AllowN(context.Background(), "k", bucket, 11)
			if err != nil || got.Allowed || got.RetryAfter != client.Never || got.Source != client.FromFallback {
				t.Fatalf("got %+v, %v; want denied, RetryAfter Never", got, err)
			}
		})
	}
	t.Run("return_error returns the error", func(t *testing.T) {
		for _, f := range failures {
			vk := mock.NewClient(gomock.NewController(t))
			vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(f.give)
			got, err := newLimiter(t, vk, client.Options{Fallback: client.ReturnError}).Allow(context.Background(), "k", bucket)
			if err == nil || got != (client.Result{}) {
				t.Errorf("%s: got %+v, %v; want the error", f.name, got, err)
			}
		}
	})
}

// The breaker opens after its failures and sends nothing until the cooldown: gomock fails the
// test on any call beyond those expected.
func TestBreakerStopsCalls(t *testing.T) {
	bucket := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}
	for _, policy := range []client.Fallback{client.ReturnError, client.FailOpen, client.FailClosed, client.LocalFallback} {
		t.Run(policy.String(), func(t *testing.T) {
			clock := newFakeClock()
			vk := mock.NewClient(gomock.NewController(t))
			ctx := context.Background()
			lim := newLimiter(t, vk, client.WithClock(client.Options{Fallback: policy, BreakerFailures: 3, BreakerCooldown: time.Second}, clock.now))

			vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(refused).Times(3)
			for range 3 {
				lim.Allow(ctx, "k", bucket)
			}
			// open: 100 calls, none sent
			for i := range 100 {
				var got client.Result
				var err error
				if i%2 == 0 {
					got, err = lim.Allow(ctx, "k", bucket)
				} else {
					got, err = lim.Peek(ctx, "k", bucket)
				}
				if policy == client.ReturnError {
					if !errors.Is(err, client.ErrCircuitOpen) {
						t.Fatalf("call %d while open: %v, want ErrCircuitOpen", i, err)
					}
				} else if err != nil || got.Source != client.FromFallback {
					t.Fatalf("call %d while open: %+v, %v; want a local decision", i, got, err)
				}
				if policy == client.FailClosed && got.RetryAfter != time.Second {
					t.Fatalf("fail closed RetryAfter %s, want the time to the probe, 1s", got.RetryAfter)
				}
			}
			clock.advance(400 * time.Millisecond)
			if got, _ := lim.Allow(ctx, "k", bucket); policy == client.FailClosed && got.RetryAfter != 600*time.Millisecond {
				t.Fatalf("fail closed RetryAfter %s, want 600ms", got.RetryAfter)
			}
			// the probe fails: another cooldown
			clock.advance(600 * time.Millisecond)
			vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(refused).Times(1)
			lim.Allow(ctx, "k", bucket)
			lim.Allow(ctx, "k", bucket)
			clock.advance(999 * time.Millisecond)
			lim.Allow(ctx, "k", bucket)
			// the probe succeeds: closed, every call goes to the server
			clock.advance(time.Millisecond)
			vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(okReply).Times(3)
			for i := range 3 {
				if got, err := lim.Allow(ctx, "k", bucket); err != nil || got.Source == client.FromFallback {
					t.Fatalf("call %d after the probe: %+v, %v; want the server's decision", i, got, err)
				}
			}
		})
	}
}

// A server that answers with an error is reachable: the policy decides each call, but the
// breaker stays closed, so every call asks the server and a deploy is seen at once.
func TestErrorRepliesKeepTheBreakerClosed(t *testing.T) {
	bucket := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}
	for _, give := range []valkey.ValkeyResult{missing, loading, garbled, rlerr} {
		vk := mock.NewClient(gomock.NewController(t))
		lim := newLimiter(t, vk, client.Options{Fallback: client.LocalFallback, BreakerFailures: 1, BreakerCooldown: time.Hour})
		ctx := context.Background()
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(give).Times(20)
		for range 20 {
			lim.Allow(ctx, "k", bucket)
		}
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(okReply)
		if got, err := lim.Allow(ctx, "k", bucket); err != nil || got.Source == client.FromFallback {
			t.Fatalf("%v, then the server answers: %+v, %v; want its decision", give, got, err)
		}
		if n := lim.LocalKeys(); n != 0 {
			t.Fatalf("%v: %d local keys once the server decides, want 0", give, n)
		}
	}
}

// The local fallback's peek consumes nothing, and its allow does.
func TestLocalPeekConsumesNothing(t *testing.T) {
	vk := mock.NewClient(gomock.NewController(t))
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(refused).AnyTimes()
	lim := newLimiter(t, vk, client.WithClock(client.Options{Fallback: client.LocalFallback, Instances: 5}, newFakeClock().now))
	ctx := context.Background()
	limit := client.SlidingLog{Limit: 10, Window: time.Minute} // 2 per instance
	for range 10 {
		if got, err := lim.Peek(ctx, "k", limit); err != nil || !got.Allowed || got.Remaining != 2 || got.Source != client.FromFallback {
			t.Fatalf("peek: %+v, %v", got, err)
		}
	}
	if n := lim.LocalKeys(); n != 0 {
		t.Fatalf("peeks left %d keys", n)
	}
	for i, want := range []bool{true, true, false, false} {
		if got, err := lim.Allow(ctx, "k", limit); err != nil || got.Allowed != want || got.Source != client.FromFallback {
			t.Fatalf("allow %d: %+v, %v; want allowed %v", i, got, err, want)
		}
	}
	// another principal, and another algorithm of the same principal, have their own share
	if got, _ := lim.Allow(ctx, "k2", limit); !got.Allowed {
		t.Errorf("another key: %+v", got)
	}
	if got, _ := lim.Allow(ctx, "k", client.FixedWindow{Limit: 10, Window: time.Minute}); !got.Allowed {
		t.Errorf("another algorithm: %+v", got)
	}
}

// A probe that answers closes the breaker, and the server's decision for a key drops that
// key's local state: the server is the truth. Other keys' state stays until it expires or the
// server decides them.
func TestRecoveryDropsLocalState(t *testing.T) {
	clock := newFakeClock()
	vk := mock.NewClient(gomock.NewController(t))
	lim := newLimiter(t, vk, client.WithClock(client.Options{Fallback: client.LocalFallback, BreakerFailures: 1, BreakerCooldown: time.Second}, clock.now))
	ctx := context.Background()
	limit := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour}
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(refused)
	lim.Allow(ctx, "k", limit)
	lim.Allow(ctx, "k2", limit)
	if n := lim.LocalKeys(); n != 2 {
		t.Fatalf("%d local keys, want 2", n)
	}
	clock.advance(time.Second)
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(okReply)
	if got, err := lim.Allow(ctx, "k", limit); err != nil || got.Source == client.FromFallback {
		t.Fatalf("probe: %+v, %v", got, err)
	}
	if n := lim.LocalKeys(); n != 1 {
		t.Fatalf("%d local keys after recovery, want 1 (k2's)", n)
	}
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(okReply)
	if got, err := lim.Allow(ctx, "k2", limit); err != nil || got.Source == client.FromFallback {
		t.Fatalf("k2: %+v, %v", got, err)
	}
	if n := lim.LocalKeys(); n != 0 {
		t.Fatalf("%d local keys once the server decided both, want 0", n)
	}
}

// In a cluster with one shard down, the server's decisions for the live shard's keys leave the
// dead shard's local state alone: those keys stay limited to their share.
func TestOneDeadShardStaysLimited(t *testing.T) {
	vk := mock.NewClient(gomock.NewController(t))
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).DoAndReturn(func(_ context.Context, cmd valkey.Completed) valkey.ValkeyResult {
		if strings.Contains(cmd.Commands()[3], "{dead}") {
			return refused
		}
		return okReply
	}).AnyTimes()
	lim := newLimiter(t, vk, client.WithClock(client.Options{Fallback: client.LocalFallback}, newFakeClock().now))
	ctx := context.Background()
	limit := client.FixedWindow{Limit: 5, Window: time.Minute}
	admitted := 0
	for range 100 {
		got, err := lim.Allow(ctx, "dead", limit)
		if err != nil || got.Source != client.FromFallback {
			t.Fatalf("dead shard: %+v, %v; want a local decision", got, err)
		}
		if got.Allowed {
			admitted++
		}
		if got, err := lim.Allow(ctx, "alive", limit); err != nil || got.Source == client.FromFallback {
			t.Fatalf("live shard: %+v, %v; want the server's decision", got, err)
		}
	}
	if admitted != 5 {
		t.Fatalf("the dead shard's key admitted %d of 100, want its limit, 5", admitted)
	}
}

// A probe whose caller gave up says nothing of the server: the next call probes at once,
// without waiting for another cooldown.
func TestCanceledProbeLetsTheNextCallProbe(t *testing.T) {
	clock := newFakeClock()
	vk := mock.NewClient(gomock.NewController(t))
	lim := newLimiter(t, vk, client.WithClock(client.Options{BreakerFailures: 1, BreakerCooldown: time.Second, Fallback: client.ReturnError}, clock.now))
	limit := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}
	ctx := context.Background()
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(refused)
	lim.Allow(ctx, "k", limit)
	if _, err := lim.Allow(ctx, "k", limit); !errors.Is(err, client.ErrCircuitOpen) {
		t.Fatalf("after one failure: %v, want ErrCircuitOpen", err)
	}
	clock.advance(time.Second)
	probeCtx, cancel := context.WithCancel(ctx)
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).DoAndReturn(func(context.Context, valkey.Completed) valkey.ValkeyResult {
		cancel()
		return mock.ErrorResult(context.Canceled)
	})
	if _, err := lim.Allow(probeCtx, "k", limit); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled probe: %v, want context.Canceled", err)
	}
	// no time passes: the next call is the probe (gomock fails the test if it is not sent)
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(okReply)
	if got, err := lim.Allow(ctx, "k", limit); err != nil || got.Source == client.FromFallback {
		t.Fatalf("next call: %+v, %v; want the server's decision", got, err)
	}
}

// Every call gets the Limiter's deadline unless the caller's comes first, and returns by it.
func TestDeadline(t *testing.T) {
	bucket := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}
	// block waits for the call's deadline; a call that never gets one fails the test rather
	// than hang it.
	block := func(ctx context.Context, _ valkey.Completed) valkey.ValkeyResult {
		select {
		case <-ctx.Done():
			return mock.ErrorResult(ctx.Err())
		case <-time.After(5 * time.Second):
			t.Error("the call was not cut off at its deadline")
			return mock.ErrorResult(errors.New("no deadline"))
		}
	}
	t.Run("a call without deadline gets it", func(t *testing.T) {
		vk := mock.NewClient(gomock.NewController(t))
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).DoAndReturn(block)
		start := time.Now()
		_, err := newLimiter(t, vk, client.Options{Deadline: 50 * time.Millisecond, Fallback: client.ReturnError}).Allow(context.Background(), "k", bucket)
		took := time.Since(start)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want DeadlineExceeded", err)
		}
		// timers never fire early; the upper bound is generous for a loaded machine
		if took < 50*time.Millisecond || took > 50*time.Millisecond+250*time.Millisecond {
			t.Fatalf("returned after %s, want 50ms (+ up to 250ms)", took)
		}
	})
	t.Run("a later deadline is shortened", func(t *testing.T) {
		vk := mock.NewClient(gomock.NewController(t))
		var got time.Time
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).DoAndReturn(func(ctx context.Context, _ valkey.Completed) valkey.ValkeyResult {
			got, _ = client.CallDeadline(ctx)
			if _, ok := ctx.Deadline(); ok {
				t.Error("valkey-go sees a deadline: it would not watch the cancel of a lone call")
			}
			return okReply
		})
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		start := time.Now()
		if _, err := newLimiter(t, vk, client.Options{Deadline: 80 * time.Millisecond}).Allow(ctx, "k", bucket); err != nil {
			t.Fatal(err)
		}
		if d := got.Sub(start); d < 80*time.Millisecond || d > 80*time.Millisecond+250*time.Millisecond {
			t.Fatalf("deadline %s after the call, want 80ms (shared timers round up by 1ms)", d)
		}
	})
	// A cold key's call reuses the clock reading of the leased budgets and the denial cache
	// for its deadline: not a test clock's, which is not the time.
	for _, tc := range []struct {
		name  string
		clock func() int64
	}{
		{"leased budgets and a denial cache", nil},
		{"the same with a test clock an hour ahead", func() int64 {
			return time.Now().Add(time.Hour).UnixNano()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vk := mock.NewClient(gomock.NewController(t))
			var got time.Time
			vk.EXPECT().Do(gomock.Any(), gomock.Any()).DoAndReturn(func(ctx context.Context, _ valkey.Completed) valkey.ValkeyResult {
				got, _ = client.CallDeadline(ctx)
				return okReply
			})
			opts := client.Options{Deadline: 80 * time.Millisecond, BudgetBatch: 16, BudgetAge: time.Second, DenialCache: 10}
			if tc.clock != nil {
				opts = client.WithClock(opts, tc.clock)
			}
			start := time.Now()
			if _, err := newLimiter(t, vk, opts).Allow(context.Background(), "k", bucket); err != nil {
				t.Fatal(err)
			}
			if d := got.Sub(start); d < 80*time.Millisecond || d > 80*time.Millisecond+250*time.Millisecond {
				t.Fatalf("deadline %s after the call, want 80ms (shared timers round up by 1ms)", d)
			}
		})
	}
	t.Run("an earlier deadline is kept", func(t *testing.T) {
		vk := mock.NewClient(gomock.NewController(t))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		want, _ := ctx.Deadline()
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).DoAndReturn(func(ctx context.Context, _ valkey.Completed) valkey.ValkeyResult {
			if got, _ := client.CallDeadline(ctx); !got.Equal(want) {
				t.Errorf("deadline %s, want the caller's %s", got, want)
			}
			return okReply
		})
		if _, err := newLimiter(t, vk, client.Options{}).Allow(ctx, "k", bucket); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a peek and its retry on the primary share one deadline", func(t *testing.T) {
		vk := mock.NewClient(gomock.NewController(t))
		gomock.InOrder(
			vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(missing),
			vk.EXPECT().Do(gomock.Any(), gomock.Any()).DoAndReturn(block),
		)
		start := time.Now()
		got, err := newLimiter(t, vk, client.Options{Deadline: 50 * time.Millisecond, Fallback: client.FailOpen}).Peek(context.Background(), "k", bucket)
		if took := time.Since(start); took > 300*time.Millisecond || err != nil || !got.Allowed || got.Source != client.FromFallback {
			t.Fatalf("got %+v, %v after %s; want fail open within the deadline", got, err, took)
		}
	})
}

// An option New cannot use is an *OptionError naming it, returned, never a panic; several are
// all returned.
func TestInvalidOptions(t *testing.T) {
	tests := []struct {
		give client.Options
		want string
	}{
		{client.Options{Deadline: -time.Second}, "client: Options.Deadline must not be negative, got -1s"},
		{client.Options{Fallback: 9}, "client: Options.Fallback must be LocalFallback, FailClosed, FailOpen or ReturnError, got Fallback(9)"},
		{client.Options{Instances: -1}, "client: Options.Instances must be from 1 to 1000000 (or 0: 1), got -1"},
		{client.Options{Instances: 1_000_001}, "client: Options.Instances must be from 1 to 1000000 (or 0: 1), got 1000001"},
		{client.Options{BreakerFailures: -1}, "client: Options.BreakerFailures must be from 1 to 2147483647 (or 0: 5), got -1"},
		{client.Options{BreakerCooldown: -time.Second}, "client: Options.BreakerCooldown must not be negative, got -1s"},
		{client.Options{LocalKeys: -1}, "client: Options.LocalKeys must be from 1 to 2147483647 (or 0: 100000), got -1"},
		{client.Options{MaxKeyLen: 1<<20 + 1}, "client: Options.MaxKeyLen must be from 1 to 1048576 (or 0: 512), got 1048577"},
		{client.Options{BudgetBatch: 1, BudgetAge: time.Second}, "client: Options.BudgetBatch must be from 2 to 1000000 (or 0 with BudgetAge 0: off), got 1"},
		{client.Options{BudgetBatch: 1_000_001, BudgetAge: time.Second}, "client: Options.BudgetBatch must be from 2 to 1000000 (or 0 with BudgetAge 0: off), got 1000001"},
		{client.Options{BudgetAge: time.Second}, "client: Options.BudgetBatch must be from 2 to 1000000 (or 0 with BudgetAge 0: off), got 0"},
		{client.Options{BudgetBatch: 64}, "client: Options.BudgetAge must be from 1ms to 1m0s with BudgetBatch, got 0s"},
		{client.Options{BudgetBatch: 64, BudgetAge: 2 * time.Minute}, "client: Options.BudgetAge must be from 1ms to 1m0s with BudgetBatch, got 2m0s"},
		{client.Options{DenialCache: -1}, "client: Options.DenialCache must be from 1 to 10000000 (or 0: off), got -1"},
		{client.Options{DenialCache: 10_000_001}, "client: Options.DenialCache must be from 1 to 10000000 (or 0: off), got 10000001"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			lim, err := client.New(mock.NewClient(nil), tt.give)
			var oe *client.OptionError
			if lim != nil || !errors.As(err, &oe) || err.Error() != tt.want {
				t.Fatalf("got %v, %v; want %s", lim, err, tt.want)
			}
		})
	}
	// a nil client, with which every call would panic
	if lim, err := client.New(nil, client.Options{}); lim != nil || err == nil || err.Error() != "client: vk must not be nil" {
		t.Fatalf("New(nil) = %v, %v; want an *OptionError", lim, err)
	}
	// every mistake is reported, in order
	_, err := client.New(nil, client.Options{Deadline: -1, Instances: -1})
	if want := "client: vk must not be nil\nclient: Options.Deadline must not be negative, got -1ns\nclient: Options.Instances must be from 1 to 1000000 (or 0: 1), got -1"; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
	// the valid extremes are accepted
	if _, err := client.New(mock.NewClient(nil), client.Options{
		Deadline:        time.Nanosecond,
		Instances:       1_000_000,
		BreakerFailures: 1,
		BreakerCooldown: time.Nanosecond,
		LocalKeys:       1,
		Fallback:        client.LocalFallback,
	}); err != nil {
		t.Fatal(err)
	}
}

func TestFallbackString(t *testing.T) {
	var got []string
	for p := client.LocalFallback; p <= client.ReturnError+1; p++ {
		got = append(got, p.String())
	}
	if s := strings.Join(got, " "); s != "local_fallback fail_closed fail_open return_error Fallback(4)" {
		t.Errorf("got %s", s)
	}
}

// Parked units that a batch's call takes with it, and gives back when the call fails, are
// given back to the server when they aged out meanwhile: they are no longer handed out, and no
// timer is left to refund them (the one that fired during the call left them to it).
func TestLeasedUnitsAgedOutDuringFailedCall(t *testing.T) {
	bucket := client.TokenBucket{Capacity: 100, Rate: 1, Period: time.Second}
	clock := newFakeClock()
	var fail atomic.Bool
	var refunded atomic.Int64
	vk := scriptClient{
		Client: mock.NewClient(nil),
		do: func(cmd []string) valkey.ValkeyResult {
			switch {
			case cmd[1] == "rl_token_bucket_refund":
				n, _ := strconv.ParseInt(cmd[7], 10, 64)
				refunded.Add(n)
				return mock.Result(ints(1, 100, 90, 0, 1000, 0))
			case fail.Load():
				// the call takes longer than the parked units' maxAge, then fails
				clock.advance(time.Second)
				return mock.ErrorResult(errors.New("connection reset"))
			}
			return mock.Result(ints(1, 100, 90, 0, 1000, 0))
		},
	}
	lim := newLimiter(t, vk, client.WithClock(client.Options{BudgetBatch: 16, BudgetAge: 100 * time.Millisecond, Fallback: client.ReturnError}, clock.now))
	ctx := context.Background()
	for i := 0; lim.Parked() == 0; i++ {
		if i == 10 {
			t.Fatal("no unit parked after 10 quick calls")
		}
		clock.advance(time.Millisecond)
		if _, err := lim.Allow(ctx, "k", bucket); err != nil {
			t.Fatal(err)
		}
	}
	parked := lim.Parked()
	// a call of more than the parked units takes them and asks the server for the rest
	fail.Store(true)
	if _, err := lim.AllowN(ctx, "k", bucket, parked+1); err == nil {
		t.Fatal("the failed call returned no error")
	}
	if err := lim.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := refunded.Load(); got != parked {
		t.Fatalf("%d units refunded, want the %d parked units, aged out during the failed call", got, parked)
	}
}

// slowBatches is a client whose calls hang until their context ends once block is set,
// recording their deadlines and costs; before, they are admitted at once.
type slowBatches struct {
	*mock.Client
	block     atomic.Bool
	mu        sync.Mutex
	deadlines []time.Time
	costs     []string
}

func (c *slowBatches) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	args := cmd.Commands()
	if c.block.Load() && args[1] == "rl_token_bucket" {
		d, _ := client.CallDeadline(ctx)
		c.mu.Lock()
		c.deadlines = append(c.deadlines, d)
		c.costs = append(c.costs, args[7])
		c.mu.Unlock()
		<-ctx.Done()
		return mock.ErrorResult(ctx.Err())
	}
	return mock.Result(ints(1, 1000, 900, 0, 1000, 0))
}

// A call that waits for another call's batch keeps its deadline: when the batch fails and it
// calls the server itself, that call gets what is left of the deadline, not a new one, so that
// waiting and calling take one deadline together; then its policy decides, as when a call of
// its own times out.
func TestLeasedWaitKeepsTheDeadline(t *testing.T) {
	const deadline = 200 * time.Millisecond
	bucket := client.TokenBucket{Capacity: 1000, Rate: 1, Period: time.Second}
	vk := &slowBatches{Client: mock.NewClient(nil)}
	lim := newLimiter(t, vk, client.Options{
		Deadline:    deadline,
		Fallback:    client.FailOpen,
		BudgetBatch: 64,
		BudgetAge:   time.Minute,
	})
	ctx := context.Background()
	for i := 0; lim.Parked() == 0; i++ {
		if i == 20 {
			t.Fatal("no unit parked after 20 quick calls")
		}
		if _, err := lim.Allow(ctx, "k", bucket); err != nil {
			t.Fatal(err)
		}
	}
	// use the parked units up, so that the next call takes a batch, which hangs
	vk.block.Store(true)
	if _, err := lim.AllowN(ctx, "k", bucket, lim.Parked()); err != nil {
		t.Fatal(err)
	}
	first := make(chan struct{})
	go func() {
		defer close(first)
		lim.Allow(ctx, "k", bucket)
	}()
	for {
		vk.mu.Lock()
		n := len(vk.deadlines)
		vk.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	r, err := lim.Allow(ctx, "k", bucket)
	if err != nil || !r.Allowed || r.Source != client.FromFallback {
		t.Fatalf("the waiting call: %+v, %v; want FailOpen's admission", r, err)
	}
	<-first
	vk.mu.Lock()
	defer vk.mu.Unlock()
	if len(vk.deadlines) != 2 || vk.costs[0] == "1" {
		t.Fatalf("calls of costs %q, want 2: the first call's batch and the waiter's call after it failed", vk.costs)
	}
	// The waiter waited about 150ms: with a deadline of its own its call would end about 350ms
	// after it began. The margin is for a late scheduling of the waiter's first wait.
	if got := vk.deadlines[1].Sub(start); got > deadline+60*time.Millisecond {
		t.Fatalf("the waiter's call has a deadline %s after the waiter began, want %s", got, deadline)
	}
}
