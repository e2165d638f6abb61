package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"
	"go.uber.org/mock/gomock"

	"github.com/rlfn/rlfn/client"
)

// blockingClient is a server that never answers: Do returns when ctx is done, as valkey-go's.
type blockingClient struct{ *mock.Client }

func (blockingClient) Do(ctx context.Context, _ valkey.Completed) valkey.ValkeyResult {
	<-ctx.Done()
	return mock.ErrorResult(ctx.Err())
}

// A call whose caller cancels its context ends at once, with context.Canceled, under every
// policy (none decides it), however long the Limiter's deadline.
func TestCancelEndsCallAtOnce(t *testing.T) {
	limit := client.FixedWindow{Limit: 10, Window: time.Minute}
	for _, p := range []client.Fallback{client.ReturnError, client.FailOpen, client.FailClosed, client.LocalFallback} {
		t.Run(p.String(), func(t *testing.T) {
			lim := newLimiter(t, blockingClient{mock.NewClient(nil)}, client.Options{Fallback: p, Deadline: time.Hour})
			calls := map[string]func(ctx context.Context) error{
				"Allow": func(ctx context.Context) error { _, err := lim.Allow(ctx, "k", limit); return err },
				"Peek":  func(ctx context.Context) error { _, err := lim.Peek(ctx, "k", limit); return err },
				"AllowAll": func(ctx context.Context) error {
					_, err := lim.AllowAll(ctx, []client.Rule{{Key: "k", Limit: limit},
						{Key: "k", Limit: client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Second, Name: "b"}}})
					return err
				},
				"Acquire": func(ctx context.Context) error {
					_, _, err := lim.Acquire(ctx, "k", client.Concurrency{Limit: 1, Lease: time.Minute})
					return err
				},
			}
			for name, call := range calls {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(20*time.Millisecond, cancel)
				start := time.Now()
				err := call(ctx)
				if took := time.Since(start); !errors.Is(err, context.Canceled) || took > 2*time.Second {
					t.Errorf("%s canceled after 20ms: %v after %s, want context.Canceled at once", name, err, took)
				}
				if _, err := lim.Allow(ctx, "k", limit); !errors.Is(err, context.Canceled) {
					t.Errorf("Allow with a canceled context: %v, want context.Canceled", err)
				}
			}
		})
	}
}

// A node client that panics is the node's error, never a panic in Check's goroutines, which no
// caller could recover.
func TestCheckNodePanics(t *testing.T) {
	ctrl := gomock.NewController(t)
	nc := mock.NewClient(ctrl)
	nc.EXPECT().DoMulti(gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(
		func(context.Context, ...valkey.Completed) []valkey.ValkeyResult { panic("broken node client") }).AnyTimes()
	vk := mock.NewClient(ctrl)
	vk.EXPECT().Nodes().Return(map[string]valkey.Client{"10.0.0.1:6379": nc})
	err := newLimiter(t, vk, client.Options{}).Check(context.Background())
	if err == nil || !strings.Contains(err.Error(), "10.0.0.1:6379") || !strings.Contains(err.Error(), "broken node client") {
		t.Fatalf("Check: %v, want the node's panic as its error", err)
	}
}

// A call with a cancelable context that its caller does not cancel ends at the Limiter's
// deadline with context.DeadlineExceeded, not Canceled (the shared tick cancels its context
// with a cause of its own), and its policy decides it; many such calls share a tick, and the
// ones that end before it are no longer canceled by it.
func TestCancelableContextDeadline(t *testing.T) {
	limit := client.FixedWindow{Limit: 10, Window: time.Minute}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lim := newLimiter(t, blockingClient{mock.NewClient(nil)}, client.Options{Deadline: 50 * time.Millisecond, Fallback: client.ReturnError})
	start := time.Now()
	_, err := lim.Allow(ctx, "k", limit)
	if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		took < 50*time.Millisecond || took > 50*time.Millisecond+2*time.Second {
		t.Fatalf("got %v after %s, want DeadlineExceeded after 50ms", err, took)
	}
	if ctx.Err() != nil {
		t.Fatal("the caller's context was canceled")
	}

	open := newLimiter(t, blockingClient{mock.NewClient(nil)}, client.Options{
		Deadline: 50 * time.Millisecond,
		Fallback: client.FailOpen,
	})
	errs := make(chan error, 20)
	for range cap(errs) {
		go func() {
			r, err := open.Allow(ctx, "k", limit)
			if err == nil && (!r.Allowed || r.Source != client.FromFallback) {
				err = fmt.Errorf("got %+v, want FailOpen's admission", r)
			}
			errs <- err
		}()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}

	// calls that end before their tick: the tick must not cancel a context it no longer holds
	fast := newLimiter(t, replyClient{mock.NewClient(nil), mock.Result(ints(1, 100, 99, 0, 1000, 0))}, client.Options{
		Deadline: 20 * time.Millisecond,
	})
	for range 1000 {
		if _, err := fast.Allow(ctx, "k", limit); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(40 * time.Millisecond)
}

// A cancelable context without a deadline of its own, a request's as a rule, costs a call
// what watching its cancel needs and no more: context.WithCancelCause's context and cancel
// function (and its Done channel, which valkey-go asks for and this mock does not), without a
// wrapper around them. (Allocation counts, not times, so this holds on any machine.)
func TestCancelableContextAllocations(t *testing.T) {
	limit := client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second}
	lim := newLimiter(t, replyClient{mock.NewClient(nil), mock.Result(ints(1, 100, 99, 0, 1000, 0))}, client.Options{})
	allocs := func(ctx context.Context) float64 {
		return testing.AllocsPerRun(1000, func() { lim.Allow(ctx, "k", limit) })
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if background, cancelable := allocs(context.Background()), allocs(ctx); cancelable > background+2 {
		t.Errorf("%v allocations per call with a cancelable context, %v with context.Background: want at most 2 more", cancelable, background)
	}
}

// versionCheckClient answers every call with reply, and gives nodes for the version check
// that follows an answer a 1.0 library would give.
type versionCheckClient struct {
	replyClient
	nodes map[string]valkey.Client
}

func (c versionCheckClient) Nodes() map[string]valkey.Client { return c.nodes }

// blockingNode never answers the version check: DoMulti returns when ctx is done.
type blockingNode struct{ *mock.Client }

func (blockingNode) DoMulti(ctx context.Context, cmds ...valkey.Completed) []valkey.ValkeyResult {
	<-ctx.Done()
	res := make([]valkey.ValkeyResult, len(cmds))
	for i := range res {
		res[i] = mock.ErrorResult(ctx.Err())
	}
	return res
}

// The version check after a call that a 1.0 library would have refused runs within the call's
// deadline, and when no node answers by then, says so: the deadline, not a cancel, which the
// caller did not make (a cancelable context without a deadline of its own, whose call the tick
// ends).
func TestVersionCheckDeadline(t *testing.T) {
	tb := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second, Reserve: 2}
	vk := versionCheckClient{
		replyClient{mock.NewClient(nil), mock.Result(mock.ValkeyError("RLERR rl_token_bucket takes 4 arguments (capacity rate period_ms cost), got 5"))},
		map[string]valkey.Client{"10.0.0.1:6379": blockingNode{mock.NewClient(nil)}},
	}
	lim := newLimiter(t, vk, client.Options{Deadline: 50 * time.Millisecond, Fallback: client.ReturnError})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := lim.Allow(ctx, "k", tb)
	var re *client.ReplyError
	if !errors.As(err, &re) || !strings.Contains(re.Reason, context.DeadlineExceeded.Error()) || strings.Contains(re.Reason, "canceled") {
		t.Fatalf("got %v, want a *replyError whose version check ran out of time (%v)", err, context.DeadlineExceeded)
	}
}
