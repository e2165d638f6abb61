package client_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.uber.org/mock/gomock"

	"github.com/rlfn/rlfn/client"
)

// Each 1.1 call sends exactly the library's command: the trailing reserve only when a limit
// has one and the call is not critical, never on a refund or a release.
func TestCommands11(t *testing.T) {
	ctx := context.Background()
	crit := client.Critical(ctx)
	tb := client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second, Reserve: 20}
	conc := client.Concurrency{Limit: 10, Lease: 30 * time.Second, Reserve: 2}
	tests := []struct {
		name string
		do   func(lim *client.Limiter) error
		want []string
	}{
		{
			name: "reserve", want: []string{"FCALL", "rl_token_bucket", "1", "rl:{k}:token_bucket", "100", "10", "1000", "1", "20"},
			do: func(lim *client.Limiter) error { _, err := lim.Allow(ctx, "k", tb); return err },
		},
		{
			name: "critical sends no reserve", want: []string{"FCALL", "rl_token_bucket", "1", "rl:{k}:token_bucket", "100", "10", "1000", "1"},
			do: func(lim *client.Limiter) error { _, err := lim.Allow(crit, "k", tb); return err },
		},
		{
			name: "leaky reserve follows mode",
			want: []string{"FCALL_RO", "rl_leaky_bucket_peek", "1", "rl:{k}:leaky_bucket", "5", "1", "1000", "2", "shape", "3"},
			do: func(lim *client.Limiter) error {
				_, err := lim.PeekN(ctx, "k", client.LeakyBucket{Capacity: 5, Rate: 1, Period: time.Second, Mode: client.Shape, Reserve: 3}, 2)
				return err
			},
		},
		{
			name: "named limit", want: []string{"FCALL", "rl_fixed_window", "1", "rl:{k}:fixed_window:hourly", "5", "3600000", "1"},
			do: func(lim *client.Limiter) error {
				_, err := lim.Allow(ctx, "k", client.FixedWindow{Limit: 5, Window: time.Hour, Name: "hourly"})
				return err
			},
		},
		{
			name: "refund", want: []string{"FCALL", "rl_token_bucket_refund", "1", "rl:{k}:token_bucket", "100", "10", "1000", "7"},
			do: func(lim *client.Limiter) error { _, err := lim.Refund(ctx, "k", tb, 7); return err },
		},
		{
			name: "renew", want: []string{"FCALL", "rl_concurrency", "1", "rl:{k}:concurrency", "10", "30000", "holder-1", "2"},
			do: func(lim *client.Limiter) error {
				le, err := lim.Lease("k", conc, "holder-1")
				if err != nil {
					return err
				}
				_, err = le.Renew(ctx)
				return err
			},
		},
		{
			name: "release", want: []string{"FCALL", "rl_concurrency_release", "1", "rl:{k}:concurrency", "10", "30000", "holder-1"},
			do: func(lim *client.Limiter) error {
				le, err := lim.Lease("k", conc, "holder-1")
				if err != nil {
					return err
				}
				_, err = le.Release(ctx)
				return err
			},
		},
		{
			name: "one principal's limits in one rl_multi",
			want: []string{"FCALL", "rl_multi", "2", "rl:{m}:fixed_window", "rl:{m}:token_bucket",
				"fixed_window", "5", "1000", "2", "0", "token_bucket", "100", "10", "1000", "2", "20"},
			do: func(lim *client.Limiter) error {
				_, err := lim.AllowAllN(ctx, []client.Rule{
					{Key: "m", Limit: client.FixedWindow{Limit: 5, Window: time.Second}},
					{Key: "m", Limit: tb},
				}, 2)
				return err
			},
		},
		{
			// a rule's own Cost; the others take the call's n
			name: "a cost per rule in one rl_multi",
			want: []string{"FCALL", "rl_multi", "2", "rl:{m}:fixed_window", "rl:{m}:token_bucket",
				"fixed_window", "60", "60000", "2", "0", "token_bucket", "100", "10", "1000", "1500", "20"},
			do: func(lim *client.Limiter) error {
				_, err := lim.AllowAllN(ctx, []client.Rule{
					{Key: "m", Limit: client.FixedWindow{Limit: 60, Window: time.Minute}},
					{Key: "m", Limit: tb, Cost: 1500},
				}, 2)
				return err
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vk := mock.NewClient(gomock.NewController(t))
			reply := okReply
			if tt.want[1] == "rl_multi" {
				reply = mock.Result(ints(1, 10, 9, 0, 1000, 0, 1))
			}
			vk.EXPECT().Do(gomock.Any(), mock.Match(tt.want...)).Return(reply)
			if err := tt.do(newLimiter(t, vk, client.Options{})); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Acquire's ids are random, 32 hex digits, and differ call after call.
func TestAcquireIDs(t *testing.T) {
	vk := mock.NewClient(gomock.NewController(t))
	var ids []string
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).DoAndReturn(func(_ context.Context, cmd valkey.Completed) valkey.ValkeyResult {
		ids = append(ids, cmd.Commands()[6])
		return okReply
	}).Times(2)
	lim := newLimiter(t, vk, client.Options{})
	for range 2 {
		le, res, err := lim.Acquire(context.Background(), "k", client.Concurrency{Limit: 10, Lease: time.Second})
		if err != nil || le == nil || !res.Allowed || le.ID() != ids[len(ids)-1] || len(le.ID()) != 32 {
			t.Fatalf("%v %+v %v (ids %q)", le, res, err, ids)
		}
	}
	if ids[0] == ids[1] {
		t.Fatalf("two leases with id %s", ids[0])
	}
}

// A released Lease is done: a Renew after it would take a new slot and leak it. A Renew that
// races the Release is answered before the release or refused, never sent after it. (A second
// Release is sent: it answers that the holder holds no slot.)
func TestLeaseAfterRelease(t *testing.T) {
	var mu sync.Mutex
	var sent []string
	vk := mock.NewClient(gomock.NewController(t))
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).DoAndReturn(func(_ context.Context, cmd valkey.Completed) valkey.ValkeyResult {
		time.Sleep(time.Millisecond) // the window in which a renewal could overtake
		mu.Lock()
		sent = append(sent, cmd.Commands()[1])
		mu.Unlock()
		return okReply
	}).AnyTimes()
	lim := newLimiter(t, vk, client.Options{})
	ctx := context.Background()
	le, err := lim.Lease("k", client.Concurrency{Limit: 10, Lease: time.Second}, "holder")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				if _, err := le.Renew(ctx); errors.Is(err, client.ErrLeaseReleased) {
					return
				} else if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	time.Sleep(5 * time.Millisecond)
	if _, err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if _, err := le.Renew(ctx); !errors.Is(err, client.ErrLeaseReleased) {
		t.Errorf("a Renew after the Release: %v, want ErrLeaseReleased", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if last := sent[len(sent)-1]; last != "rl_concurrency_release" || slices.Index(sent, last) != len(sent)-1 {
		t.Errorf("sent %q: want the release once, last", sent)
	}
}

// Release frees the slot with the caller's context canceled (a request whose client went
// away): the slot is owed.
func TestReleaseCanceled(t *testing.T) {
	vk := mock.NewClient(gomock.NewController(t))
	vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_concurrency_release", "1", "rl:{k}:concurrency", "10", "1000", "holder")).
		DoAndReturn(func(ctx context.Context, _ valkey.Completed) valkey.ValkeyResult {
			if d, ok := ctx.Deadline(); !ok || time.Until(d) > 100*time.Millisecond+time.Millisecond {
				t.Errorf("the release is not bounded by the Limiter's deadline: %v %v", d, ok)
			}
			return okReply
		})
	le, err := newLimiter(t, vk, client.Options{}).Lease("k", client.Concurrency{Limit: 10, Lease: time.Second}, "holder")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if res, err := le.Release(ctx); err != nil || !res.Allowed {
		t.Fatalf("%+v, %v", res, err)
	}
}

// Rules of different keys run as separate calls, each with its reserve (0 too: the refunds
// need library 1.1.0); when one denies, the units the others took are refunded, and the
// Result is the denier's, with its index.
func TestAllowAllCompensates(t *testing.T) {
	vk := mock.NewClient(gomock.NewController(t))
	ip := client.FixedWindow{Limit: 100, Window: time.Minute}
	user := client.FixedWindow{Limit: 5, Window: time.Minute}
	vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_fixed_window", "1", "rl:{ip:1}:fixed_window", "100", "60000", "1", "0")).
		Return(mock.Result(ints(1, 100, 50, 0, 1000, 0)))
	vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_fixed_window", "1", "rl:{user:9}:fixed_window", "5", "60000", "1", "0")).
		Return(mock.Result(ints(0, 5, 0, 3000, 3000, 0)))
	vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_fixed_window_refund", "1", "rl:{ip:1}:fixed_window", "100", "60000", "1")).
		Return(mock.Result(ints(1, 100, 51, 0, 1000, 0)))
	res, err := newLimiter(t, vk, client.Options{}).AllowAll(context.Background(), []client.Rule{{Key: "ip:1", Limit: ip}, {Key: "user:9", Limit: user}})
	if err != nil || res.Allowed || res.Rule != 1 || res.Limit != 5 || res.RetryAfter != 3*time.Second {
		t.Fatalf("%+v, %v; want the user's denial", res, err)
	}
}

// A failed principal counts as a denial: the others are refunded, and the error returned.
func TestAllowAllErrorCompensates(t *testing.T) {
	vk := mock.NewClient(gomock.NewController(t))
	l := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}
	vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_token_bucket", "1", "rl:{a}:token_bucket", "10", "1", "1000", "1", "0")).
		Return(okReply)
	vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_token_bucket", "1", "rl:{b}:token_bucket", "10", "1", "1000", "1", "0")).
		Return(mock.Result(mock.ValkeyError("NOPERM no")))
	vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_token_bucket_refund", "1", "rl:{a}:token_bucket", "10", "1", "1000", "1")).
		Return(okReply)
	if _, err := newLimiter(t, vk, client.Options{Fallback: client.ReturnError}).AllowAll(context.Background(), []client.Rule{{Key: "a", Limit: l}, {Key: "b", Limit: l}}); err == nil {
		t.Fatal("no error")
	}
}

func TestAllowAllRefusesBadRules(t *testing.T) {
	lim := newLimiter(t, mock.NewClient(gomock.NewController(t)), client.Options{})
	fw := client.FixedWindow{Limit: 5, Window: time.Second}
	many := make([]client.Rule, 17)
	for i := range many {
		many[i] = client.Rule{Key: "k", Limit: client.FixedWindow{Limit: 5, Window: time.Second, Name: strings.Repeat("n", i+1)}}
	}
	for name, rules := range map[string][]client.Rule{
		"empty":         nil,
		"repeated":      {{Key: "k", Limit: fw}, {Key: "k", Limit: fw}},
		"nil limit":     {{Key: "k"}},
		"invalid":       {{Key: "k", Limit: client.FixedWindow{Limit: 5, Window: time.Second, Reserve: 6}}},
		"17 of one key": many,
		"negative cost": {{Key: "k", Limit: fw, Cost: -1}},
		"cost too big":  {{Key: "k", Limit: fw, Cost: 1_000_000_000_000_000}},
	} {
		var le *client.LimitError
		if _, err := lim.AllowAll(context.Background(), rules); !errors.As(err, &le) {
			t.Errorf("%s: got %v, want a *LimitError", name, err)
		}
	}
	// a bad cost says which rule it is
	_, err := lim.AllowAll(context.Background(), []client.Rule{{Key: "a", Limit: fw}, {Key: "b", Limit: fw, Cost: -2}})
	if want := "client: rules[1].Cost must be from 0 to 999999999999999, got -2"; err == nil || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
	// an invalid limit says which rule it is
	_, err = lim.AllowAll(context.Background(), []client.Rule{{Key: "a", Limit: fw}, {Key: "b", Limit: client.FixedWindow{Limit: 5}}})
	if want := "client: rules[1] FixedWindow.Window must be at least 1ms, got 0s"; err == nil || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
}

// A 1.1 call answered as a 1.0 library answers it is a *VersionError naming the node under
// ReturnError; the node is the one that answers rl_version for the key. (The other policies
// decide it: TestVersionErrorPolicy.)
func TestVersionErrorOn10(t *testing.T) {
	tb := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second, Reserve: 2}
	for _, tt := range []struct {
		name   string
		reply  string
		do     func(ctx context.Context, lim *client.Limiter) error
		what   string
		policy client.Fallback
		key    string
	}{
		{"reserve", "RLERR rl_token_bucket takes 4 arguments (capacity rate period_ms cost), got 5",
			func(ctx context.Context, lim *client.Limiter) error { _, err := lim.Allow(ctx, "k", tb); return err },
			"rl_token_bucket reserve", client.ReturnError, "rl:{k}:token_bucket"},
		{"refund", "ERR Function not found",
			func(ctx context.Context, lim *client.Limiter) error {
				_, err := lim.Refund(ctx, "k", tb, 1)
				return err
			},
			"rl_token_bucket_refund", client.ReturnError, "rl:{k}:token_bucket"},
		{"acquire", "ERR Function not found",
			func(ctx context.Context, lim *client.Limiter) error {
				_, _, err := lim.Acquire(ctx, "k", client.Concurrency{Limit: 1, Lease: time.Second})
				return err
			},
			"rl_concurrency", client.ReturnError, "rl:{k}:concurrency"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctrl := gomock.NewController(t)
			vk := mock.NewClient(ctrl)
			vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(mock.Result(mock.ValkeyError(tt.reply)))
			owner, other := mock.NewClient(ctrl), mock.NewClient(ctrl)
			owner.EXPECT().DoMulti(gomock.Any(), mock.Match("EXISTS", tt.key),
				mock.Match("FCALL_RO", "rl_version", "0")).
				Return([]valkey.ValkeyResult{mock.Result(mock.ValkeyInt64(1)), mock.Result(mock.ValkeyBlobString("1.0.0"))})
			other.EXPECT().DoMulti(gomock.Any(), gomock.Any(), gomock.Any()).
				Return([]valkey.ValkeyResult{mock.Result(mock.ValkeyError("MOVED 1234 10.0.0.1:6379")), mock.Result(mock.ValkeyBlobString("1.1.0"))}).AnyTimes()
			vk.EXPECT().Nodes().Return(map[string]valkey.Client{"10.0.0.1:6379": owner, "10.0.0.0:6379": other})
			err := tt.do(context.Background(), newLimiter(t, vk, client.Options{Fallback: tt.policy}))
			var ve *client.VersionError
			if !errors.As(err, &ve) || ve.Node != "10.0.0.1:6379" || ve.Version != "1.0.0" || ve.Want != "1.1.0" || ve.Function != tt.what {
				t.Fatalf("got %v, want a *VersionError naming 10.0.0.1:6379", err)
			}
			want := "client: node 10.0.0.1:6379 runs ratelimit library 1.0.0, " + tt.what + " needs 1.1.0 or later"
			if err.Error() != want {
				t.Errorf("got %q, want %q", err, want)
			}
		})
	}
}

// A refund that AllowAll owes and cannot make is not the caller's error: the denial stands,
// with no error, or the other key's error comes alone. A refund sent and not answered (a
// timeout: the server may have made it) is never sent again: its units are counted as lost,
// reason unknown, and said once in the log, in a short line that names the limit as the
// call's context does (WithLimitName).
func TestAllowAllCountsLostRefunds(t *testing.T) {
	l := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}
	rules := []client.Rule{{Key: "a", Limit: l}, {Key: "b", Limit: l}}
	for _, tt := range []struct {
		name string
		b    valkey.ValkeyResult // rule 1's answer
	}{
		{"denied", mock.Result(ints(0, 10, 0, 1000, 10000, 0))},
		{"failed", mock.Result(mock.ValkeyError("NOPERM no"))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			vk := mock.NewClient(gomock.NewController(t))
			vk.EXPECT().Nodes().Return(map[string]valkey.Client{"127.0.0.1:6379": vk}).AnyTimes()
			vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_token_bucket", "1", "rl:{a}:token_bucket", "10", "1", "1000", "1", "0")).
				Return(okReply)
			vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_token_bucket", "1", "rl:{b}:token_bucket", "10", "1", "1000", "1", "0")).
				Return(tt.b)
			vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_token_bucket_refund", "1", "rl:{a}:token_bucket", "10", "1", "1000", "1")).
				Return(mock.ErrorResult(context.DeadlineExceeded))
			reader := sdkmetric.NewManualReader()
			var out lines
			lim := newLimiter(t, vk, client.Options{Fallback: client.ReturnError, Logger: slog.New(slog.NewTextHandler(&out, nil)),
				MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
			res, err := lim.AllowAll(client.WithLimitName(context.Background(), "login"), rules)
			switch tt.name {
			case "denied":
				if err != nil || res.Allowed || res.Rule != 1 || res.Limit != 10 {
					t.Errorf("the denial: %+v, %v", res, err)
				}
			case "failed":
				if err == nil || !strings.Contains(err.Error(), "NOPERM") || strings.Contains(err.Error(), "refund") {
					t.Errorf("got %v, want rule 1's error alone", err)
				}
			}
			if n := lim.OwedRefunds(); n != 0 {
				t.Errorf("%d refunds owed: a refund that may have been made is never sent again", n)
			}
			var lost []string
			for _, p := range points(t, reader) {
				if strings.HasPrefix(p, "rlfn.client.refunds.lost") {
					lost = append(lost, p)
				}
			}
			if want := "rlfn.client.refunds.lost{rlfn.reason=unknown} 1"; len(lost) != 1 || lost[0] != want {
				t.Errorf("metric %q, want %q", lost, want)
			}
			var said []string
			for line := range strings.Lines(out.String()) {
				if strings.Contains(line, "event=refund_lost") {
					said = append(said, line)
				}
			}
			if len(said) != 1 || !strings.Contains(said[0], "1 of 1 refunds lost") || !strings.Contains(said[0], "limit=token_bucket:login") || len(said[0]) > 400 {
				t.Errorf("refund_lost lines: %q", said)
			}
		})
	}
}

// The refunds are owed whatever becomes of the caller's context: they run with it canceled,
// bounded by the Limiter's deadline.
func TestAllowAllCompensatesCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	vk := mock.NewClient(gomock.NewController(t))
	refunded := false
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).DoAndReturn(func(cctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
		switch args := cmd.Commands(); {
		case args[1] == "rl_fixed_window_refund":
			if d, ok := cctx.Deadline(); cctx.Err() != nil || !ok || time.Until(d) > 100*time.Millisecond+time.Millisecond {
				t.Errorf("the refund's context: %v, deadline %v %v", cctx.Err(), d, ok)
			}
			refunded = true
			return okReply
		case args[3] == "rl:{a}:fixed_window":
			cancel() // the caller gives up while a's unit is taken
			return okReply
		}
		return mock.Result(ints(0, 5, 0, 1000, 1000, 0))
	}).AnyTimes()
	l := client.FixedWindow{Limit: 5, Window: time.Minute}
	// b is denied, or not sent at all (context canceled): a's refund is owed either way
	_, _ = newLimiter(t, vk, client.Options{}).AllowAll(ctx, []client.Rule{{Key: "a", Limit: l}, {Key: "b", Limit: l}})
	if !refunded {
		t.Error("a's unit was not refunded")
	}
}

// A key decided by the policy (its server gone) took nothing from the server: when another
// key denies, its units are given back where they were taken (LocalFallback: locally), and no
// refund reaches the server, where it would give back units other requests took.
func TestAllowAllCompensatesLocalDecisionsLocally(t *testing.T) {
	l := client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Hour}
	rules := []client.Rule{{Key: "a", Limit: l}, {Key: "b", Limit: l}}
	for _, p := range []client.Fallback{client.FailOpen, client.LocalFallback} {
		t.Run(p.String(), func(t *testing.T) {
			vk := mock.NewClient(gomock.NewController(t))
			vk.EXPECT().Do(gomock.Any(), gomock.Any()).DoAndReturn(func(_ context.Context, cmd valkey.Completed) valkey.ValkeyResult {
				switch args := cmd.Commands(); {
				case args[1] != "rl_token_bucket":
					t.Errorf("sent %q", args)
				case args[3] == "rl:{b}:token_bucket":
					return mock.Result(ints(0, 1, 0, 3600000, 3600000, 0))
				}
				return mock.ErrorResult(context.DeadlineExceeded) // a's shard is gone
			}).AnyTimes()
			lim := newLimiter(t, vk, client.Options{Fallback: p})
			if res, err := lim.AllowAll(context.Background(), rules); err != nil || res.Allowed || res.Rule != 1 {
				t.Fatalf("%+v, %v; want b's denial", res, err)
			}
			if p != client.LocalFallback {
				return
			}
			// a's local unit was given back: its local bucket of 1 admits again
			if res, err := lim.Allow(context.Background(), "a", l); err != nil || !res.Allowed || res.Source != client.FromFallback {
				t.Errorf("a after the refund: %+v, %v; want a local admission", res, err)
			}
		})
	}
}

// AllowAll across keys relies on refunds, which a 1.0 node lacks: the single rule of a key is
// refused there before it takes anything (its reserve, even 0, is an argument 1.0 refuses), and
// is then decided as 1.0 decides it, one key at a time, the first denial ending the decision:
// the node never stops limiting. What a key took before a later key denied stays taken (no
// refund exists): stricter, never more permissive. The node is asked for its version once a
// cooldown: the next decision goes to 1.0's calls at once.
func TestAllowAllAcrossKeysOn10(t *testing.T) {
	ctrl := gomock.NewController(t)
	vk := mock.NewClient(ctrl)
	l := client.SlidingLog{Limit: 1, Window: time.Minute}
	on10 := mock.Result(mock.ValkeyError("RLERR rl_sliding_log takes 3 arguments (limit window_ms cost), got 4"))
	// a and b go side by side: the first refused tells the node's version, and the other, when
	// it comes after that, is not sent at all
	vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_sliding_log", "1", "rl:{a}:sliding_log", "1", "60000", "1", "0")).Return(on10).MaxTimes(1)
	vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_sliding_log", "1", "rl:{b}:sliding_log", "1", "60000", "1", "0")).Return(on10).MaxTimes(1)
	node := mock.NewClient(ctrl)
	node.EXPECT().DoMulti(gomock.Any(), gomock.Any(), gomock.Any()).
		Return([]valkey.ValkeyResult{mock.Result(mock.ValkeyInt64(0)), mock.Result(mock.ValkeyBlobString("1.0.0"))}).MinTimes(1).MaxTimes(2)
	vk.EXPECT().Nodes().Return(map[string]valkey.Client{"10.0.0.1:6379": node}).MinTimes(1).MaxTimes(2)
	// 1.0's own calls: a admits, b denies; a's unit is not refunded (no such function)
	gomock.InOrder(
		vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_sliding_log", "1", "rl:{a}:sliding_log", "1", "60000", "1")).
			Return(mock.Result(ints(1, 1, 0, 0, 60000, 0))),
		vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_sliding_log", "1", "rl:{b}:sliding_log", "1", "60000", "1")).
			Return(mock.Result(ints(0, 1, 0, 5000, 60000, 0))),
	)
	lim := newLimiter(t, vk, client.Options{})
	rules := []client.Rule{{Key: "a", Limit: l}, {Key: "b", Limit: l}}
	res, err := lim.AllowAll(context.Background(), rules)
	if err != nil || res.Allowed || res.Rule != 1 || res.RetryAfter != 5*time.Second || res.Source == client.FromFallback {
		t.Fatalf("%+v, %v; want b's denial, decided by the node", res, err)
	}
	// Within the cooldown, the node is known to run 1.0.0: no refused call, no lookup. a denies
	// first, and b is never asked (it would take a unit nobody could give back).
	vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_sliding_log", "1", "rl:{a}:sliding_log", "1", "60000", "1")).
		Return(mock.Result(ints(0, 1, 0, 59000, 59000, 0)))
	// b is peeked, for the longest wait
	vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL_RO", "rl_sliding_log_peek", "1", "rl:{b}:sliding_log", "1", "60000", "1")).
		Return(mock.Result(ints(0, 1, 0, 4000, 59000, 0)))
	res, err = lim.AllowAll(context.Background(), rules)
	if err != nil || res.Allowed || res.Rule != 0 {
		t.Fatalf("%+v, %v; want a's denial", res, err)
	}
}

// An RLERR about the reserve argument, when no node can tell its version (the lookup ran
// out of time), is still an older library's answer, not the limit's error: a *replyError,
// which the policy decides, never a *LibraryError.
func TestArityErrorUnknownVersion(t *testing.T) {
	for _, p := range []client.Fallback{client.ReturnError, client.FailOpen} {
		t.Run(p.String(), func(t *testing.T) {
			ctrl := gomock.NewController(t)
			vk := mock.NewClient(ctrl)
			vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(mock.Result(mock.ValkeyError("RLERR rl_token_bucket takes 4 arguments (capacity rate period_ms cost), got 5")))
			node := mock.NewClient(ctrl)
			gone := mock.ErrorResult(context.DeadlineExceeded)
			node.EXPECT().DoMulti(gomock.Any(), gomock.Any(), gomock.Any()).Return([]valkey.ValkeyResult{gone, gone})
			vk.EXPECT().Nodes().Return(map[string]valkey.Client{"10.0.0.1:6379": node})
			res, err := newLimiter(t, vk, client.Options{Fallback: p}).Allow(context.Background(), "k", client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second, Reserve: 2})
			var le *client.LibraryError
			var re *client.ReplyError
			switch {
			case errors.As(err, &le):
				t.Fatalf("got the *LibraryError %v", err)
			case p == client.ReturnError && !errors.As(err, &re):
				t.Fatalf("got %v, want a *replyError", err)
			case p == client.FailOpen && (err != nil || res.Source != client.FromFallback):
				t.Fatalf("got %+v, %v; want the policy's decision", res, err)
			}
		})
	}
}

// An RLERR about arguments from a 1.1 node is the limit's error, not a version error.
func TestArityErrorOn11StaysLibraryError(t *testing.T) {
	ctrl := gomock.NewController(t)
	vk := mock.NewClient(ctrl)
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(mock.Result(mock.ValkeyError("RLERR rl_token_bucket takes 4 or 5 arguments, got 9")))
	node := mock.NewClient(ctrl)
	node.EXPECT().DoMulti(gomock.Any(), gomock.Any(), gomock.Any()).
		Return([]valkey.ValkeyResult{mock.Result(mock.ValkeyInt64(0)), mock.Result(mock.ValkeyBlobString("1.1.0"))})
	vk.EXPECT().Nodes().Return(map[string]valkey.Client{"10.0.0.1:6379": node})
	_, err := newLimiter(t, vk, client.Options{}).Allow(context.Background(), "k", client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second, Reserve: 2})
	var le *client.LibraryError
	if !errors.As(err, &le) {
		t.Fatalf("got %v, want the *LibraryError", err)
	}
}

func TestCheckVersion(t *testing.T) {
	primary := mock.Result(mock.ValkeyArray(mock.ValkeyBlobString("master"), mock.ValkeyInt64(0), mock.ValkeyArray()))
	for _, tt := range []struct {
		runs, min string
		ok        bool
	}{
		{"1.0.0", "", true},
		{"1.0.0", "1.1.0", false},
		{"1.1.0", "1.1.0", true},
		{"1.2.0", "1.1.0", true},
	} {
		ctrl := gomock.NewController(t)
		nc := mock.NewClient(ctrl)
		nc.EXPECT().DoMulti(gomock.Any(), gomock.Any(), gomock.Any()).
			Return([]valkey.ValkeyResult{primary, mock.Result(mock.ValkeyBlobString(tt.runs))})
		vk := mock.NewClient(ctrl)
		vk.EXPECT().Nodes().Return(map[string]valkey.Client{"10.0.0.1:6379": nc})
		err := newLimiter(t, vk, client.Options{}).CheckVersion(context.Background(), tt.min)
		var ve *client.VersionError
		if tt.ok != (err == nil) || !tt.ok && (!errors.As(err, &ve) || ve.Want != tt.min || ve.Version != tt.runs) {
			t.Errorf("%s, min %q: %v", tt.runs, tt.min, err)
		}
	}
}

func TestQuota(t *testing.T) {
	tests := []struct {
		give client.Limit
		want client.Quota
	}{
		{client.FixedWindow{Limit: 5, Window: time.Minute}, client.Quota{Limit: 5, Window: time.Minute}},
		{&client.SlidingLog{Limit: 5, Window: time.Second}, client.Quota{Limit: 5, Window: time.Second}},
		{client.TokenBucket{Capacity: 10, Rate: 3, Period: time.Second}, client.Quota{Limit: 10, Window: 3334 * time.Millisecond}},
		{client.LeakyBucket{Capacity: 10, Rate: 3, Period: time.Second}, client.Quota{Limit: 10, Window: 3334 * time.Millisecond, Leak: 333333334}},
		{client.TokenBucket{Capacity: 999999999999999, Rate: 1, Period: 100000000000 * time.Millisecond}, client.Quota{Limit: 999999999999999, Window: 1<<63 - 1}},
	}
	for _, tt := range tests {
		if got := tt.give.Quota(); got != tt.want {
			t.Errorf("%#v: %+v, want %+v", tt.give, got, tt.want)
		}
	}
}

// AllowAllEach under a policy: a key whose server is gone has each rule decided by the policy,
// reported as such.
func TestAllowAllEachByPolicy(t *testing.T) {
	tb := client.TokenBucket{Capacity: 2, Rate: 1, Period: time.Hour}
	fw := client.FixedWindow{Limit: 5, Window: time.Hour}
	rules := []client.Rule{{Key: "a", Limit: tb}, {Key: "a", Limit: fw}}
	vk := mock.NewClient(gomock.NewController(t))
	gone := mock.ErrorResult(context.DeadlineExceeded)
	// the rl_multi and a peek of each rule, in one pipeline
	vk.EXPECT().DoMulti(gomock.Any(), gomock.Any(), gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, cmds ...valkey.Completed) []valkey.ValkeyResult {
			want := [][]string{
				{"FCALL", "rl_multi", "2", "rl:{a}:token_bucket", "rl:{a}:fixed_window"},
				// read-only: a replica may answer them (SendToReplicas)
				{"FCALL_RO", "rl_token_bucket_peek", "1", "rl:{a}:token_bucket", "2", "1", "3600000", "1", "0"},
				{"FCALL_RO", "rl_fixed_window_peek", "1", "rl:{a}:fixed_window", "5", "3600000", "1", "0"},
			}
			for i, c := range cmds {
				got := c.Commands()
				if i == 0 {
					got = got[:len(want[0])]
				}
				if !slices.Equal(got, want[i]) {
					t.Errorf("command %d: %q, want %q", i, got, want[i])
				}
			}
			return []valkey.ValkeyResult{gone, gone, gone}
		}).Times(3)
	lim := newLimiter(t, vk, client.Options{Fallback: client.LocalFallback})
	lim.Before13("a") // a 1.2 node: the peeks' path
	for i, want := range []struct {
		allowed bool
		tb, fw  int64 // remaining
	}{{true, 1, 4}, {true, 0, 3}, {false, 0, 3}} {
		res, each, err := lim.AllowAllEach(context.Background(), rules, 1)
		if err != nil || res.Allowed != want.allowed || res.Source != client.FromFallback || len(each) != 2 {
			t.Fatalf("call %d: %+v, %+v, %v", i+1, res, each, err)
		}
		if each[0].Remaining != want.tb || each[1].Remaining != want.fw || each[0].Source != client.FromFallback || each[1].Source != client.FromFallback ||
			each[0].Limit != 2 || each[1].Limit != 5 || each[0].Rule != 0 || each[1].Rule != 1 ||
			!each[1].Allowed || each[0].Allowed != want.allowed {
			t.Errorf("call %d: each %+v; want remaining %d and %d, local", i+1, each, want.tb, want.fw)
		}
	}
}

// scriptClient answers Do and DoMulti with functions of the commands.
type scriptClient struct {
	*mock.Client
	do      func(cmd []string) valkey.ValkeyResult
	doMulti func(cmds [][]string) []valkey.ValkeyResult
}

func (c scriptClient) Do(_ context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	return c.do(cmd.Commands())
}

func (c scriptClient) DoMulti(_ context.Context, cmds ...valkey.Completed) []valkey.ValkeyResult {
	all := make([][]string, len(cmds))
	for i, cmd := range cmds {
		all[i] = cmd.Commands()
	}
	return c.doMulti(all)
}

// AllowAllEach across keys, denied by one: a rule of another key's rl_multi whose peek failed
// is still known after its refund, which read its state: it admitted (its key's rl_multi did),
// and it is its own rule.
func TestAllowAllEachRefundedAfterFailedPeek(t *testing.T) {
	tb := client.TokenBucket{Capacity: 2, Rate: 1, Period: time.Hour}
	fw := client.FixedWindow{Limit: 5, Window: time.Hour}
	rules := []client.Rule{{Key: "a", Limit: tb}, {Key: "a", Limit: fw}, {Key: "b", Limit: fw}}
	var mu sync.Mutex
	var refunded []string
	vk := scriptClient{
		Client: mock.NewClient(nil),
		do: func(cmd []string) valkey.ValkeyResult {
			switch {
			case cmd[1] == "rl_fixed_window" && cmd[3] == "rl:{b}:fixed_window":
				return mock.Result(ints(0, 5, 0, 60_000, 60_000, 0)) // b denies
			case cmd[1] == "rl_token_bucket_refund":
				mu.Lock()
				refunded = append(refunded, cmd[3])
				mu.Unlock()
				return mock.Result(ints(1, 2, 2, 0, 0, 0))
			case cmd[1] == "rl_fixed_window_refund" && cmd[3] == "rl:{a}:fixed_window":
				mu.Lock()
				refunded = append(refunded, cmd[3])
				mu.Unlock()
				return mock.Result(ints(1, 5, 5, 0, 3_600_000, 0))
			}
			t.Errorf("unexpected command %q", cmd)
			return mock.ErrorResult(errors.New("unexpected"))
		},
		doMulti: func(cmds [][]string) []valkey.ValkeyResult {
			// a's rl_multi admits (the token bucket binding), the token bucket's peek reads
			// it, the fixed window's fails
			return []valkey.ValkeyResult{
				mock.Result(ints(1, 2, 1, 0, 3_600_000, 0, 1)),
				mock.Result(ints(1, 2, 1, 0, 3_600_000, 0)),
				mock.ErrorResult(errors.New("connection reset")),
			}
		},
	}
	lim := newLimiter(t, vk, client.Options{})
	lim.Before13("a") // a 1.2 node: the peeks' path
	res, each, err := lim.AllowAllEach(context.Background(), rules, 1)
	if err != nil || res.Allowed || res.Rule != 2 || len(each) != 3 || len(refunded) != 2 {
		t.Fatalf("got %+v, %+v, %v, refunds of %q; want rule 2's denial, each rule, two refunds", res, each, err, refunded)
	}
	want := []client.Result{
		{Allowed: true, Limit: 2, Remaining: 2, Rule: 0},
		{Allowed: true, Limit: 5, Remaining: 5, ResetAfter: time.Hour, Rule: 1},
		{Limit: 5, RetryAfter: time.Minute, ResetAfter: time.Minute, Rule: 2},
	}
	for i := range want {
		if each[i] != want[i] {
			t.Errorf("each[%d] = %+v, want %+v", i, each[i], want[i])
		}
	}
}

// AllowAllEach's peeks are FCALL_RO, which a replica may answer: one without the library yet
// (ERR Function not found) has them sent again as FCALL, to the primary, in one pipeline;
// the decision, the rl_multi's, is not sent again.
func TestAllowAllEachPeeksNotLoadedOnAReplica(t *testing.T) {
	rules := []client.Rule{{Key: "a", Limit: client.TokenBucket{Capacity: 2, Rate: 1, Period: time.Hour}},
		{Key: "a", Limit: client.FixedWindow{Limit: 5, Window: time.Hour}}}
	var sent [][]string
	vk := scriptClient{
		Client: mock.NewClient(nil),
		doMulti: func(cmds [][]string) []valkey.ValkeyResult {
			for _, c := range cmds {
				sent = append(sent, c[:2])
			}
			if cmds[0][1] == "rl_multi" {
				notFound := mock.Result(mock.ValkeyError("ERR Function not found"))
				return []valkey.ValkeyResult{mock.Result(ints(1, 2, 1, 0, 3_600_000, 0, 1)), notFound, notFound}
			}
			return []valkey.ValkeyResult{mock.Result(ints(1, 2, 1, 0, 3_600_000, 0)), mock.Result(ints(1, 5, 4, 0, 3_600_000, 0))}
		},
	}
	lim := newLimiter(t, vk, client.Options{Fallback: client.ReturnError})
	lim.Before13("a") // a 1.2 node: the peeks' path
	res, each, err := lim.AllowAllEach(context.Background(), rules, 1)
	if err != nil || !res.Allowed || len(each) != 2 || each[0].Remaining != 1 || each[1].Remaining != 4 || each[1].Limit != 5 {
		t.Fatalf("got %+v, %+v, %v; want admitted, 1 and 4 left", res, each, err)
	}
	want := [][]string{{"FCALL", "rl_multi"}, {"FCALL_RO", "rl_token_bucket_peek"}, {"FCALL_RO", "rl_fixed_window_peek"},
		{"FCALL", "rl_token_bucket_peek"}, {"FCALL", "rl_fixed_window_peek"}}
	if !slices.EqualFunc(sent, want, slices.Equal) {
		t.Errorf("sent %q, want %q", sent, want)
	}
}

// The local fallback judges each rule against its own cost, as the server does: "60 requests
// and 100 tokens", each request 40 tokens, admits two requests, and the third is refused by
// the tokens while the requests' limit has room: all or nothing locally too.
func TestAllowAllCostPerRuleLocally(t *testing.T) {
	lim := newLimiter(t, replyClient{mock.NewClient(nil), mock.ErrorResult(context.DeadlineExceeded)}, client.Options{})
	rules := []client.Rule{
		{Key: "org:1", Limit: client.FixedWindow{Limit: 60, Window: time.Hour}},
		{Key: "org:1", Limit: client.TokenBucket{Capacity: 100, Rate: 1, Period: time.Hour}, Cost: 40},
	}
	ctx := context.Background()
	for i, want := range []struct {
		allowed   bool
		rule      int
		remaining int64
	}{{true, 0, 59}, {true, 1, 20}, {false, 1, 20}} {
		res, each, err := lim.AllowAllEach(ctx, rules, 1)
		if err != nil || res.Source != client.FromFallback || res.Allowed != want.allowed || res.Rule != want.rule || res.Remaining != want.remaining {
			t.Fatalf("call %d: %+v, %v; want allowed %v by rule %d with %d left", i+1, res, err, want.allowed, want.rule, want.remaining)
		}
		if used := int64(min(i+1, 2)); each[0].Remaining != 60-used {
			t.Errorf("call %d: the requests' limit has %d left, want %d", i+1, each[0].Remaining, 60-used)
		}
	}
}
