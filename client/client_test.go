package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"
	"go.uber.org/mock/gomock"

	"github.com/rlfn/rlfn/client"
)

func ints(vs ...int64) valkey.ValkeyMessage {
	ms := make([]valkey.ValkeyMessage, len(vs))
	for i, v := range vs {
		ms[i] = mock.ValkeyInt64(v)
	}
	return mock.ValkeyArray(ms...)
}

// okReply is a well-formed reply, for tests about the command.
var okReply = mock.Result(ints(1, 10, 9, 0, 1000, 0))

// Each method sends exactly the library's command for every limit.
func TestCommands(t *testing.T) {
	type method int
	const (
		allow method = iota
		allowN
		peek
		peekN
	)
	tests := []struct {
		name   string
		method method
		key    string
		limit  client.Limit
		n      int64
		want   []string
	}{
		{
			name: "fixed window", method: allow, key: "user:42",
			limit: client.FixedWindow{Limit: 100, Window: time.Minute},
			want:  []string{"FCALL", "rl_fixed_window", "1", "rl:{user:42}:fixed_window", "100", "60000", "1"},
		},
		{
			name: "sliding log", method: allowN, key: "user:42", n: 7,
			limit: client.SlidingLog{Limit: 100000, Window: time.Millisecond},
			want:  []string{"FCALL", "rl_sliding_log", "1", "rl:{user:42}:sliding_log", "100000", "1", "7"},
		},
		{
			name: "sliding window", method: allowN, key: "user:42", n: 0,
			limit: client.SlidingWindow{Limit: 5, Window: 90 * time.Second},
			want:  []string{"FCALL", "rl_sliding_window", "1", "rl:{user:42}:sliding_window", "5", "90000", "0"},
		},
		{
			name: "token bucket", method: allow, key: "user:42",
			limit: client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second},
			want:  []string{"FCALL", "rl_token_bucket", "1", "rl:{user:42}:token_bucket", "100", "10", "1000", "1"},
		},
		{
			name: "leaky bucket police by default", method: allow, key: "user:42",
			limit: client.LeakyBucket{Capacity: 3, Rate: 1, Period: time.Second},
			want:  []string{"FCALL", "rl_leaky_bucket", "1", "rl:{user:42}:leaky_bucket", "3", "1", "1000", "1", "police"},
		},
		{
			name: "leaky bucket shape", method: allowN, key: "user:42", n: 999999999999999,
			limit: client.LeakyBucket{Capacity: 999999999999999, Rate: 100000000000000, Period: 100000000000 * time.Millisecond, Mode: client.Shape},
			want: []string{"FCALL", "rl_leaky_bucket", "1", "rl:{user:42}:leaky_bucket",
				"999999999999999", "100000000000000", "100000000000", "999999999999999", "shape"},
		},
		{
			name: "peek fixed window", method: peek, key: "k",
			limit: client.FixedWindow{Limit: 1, Window: time.Millisecond},
			want:  []string{"FCALL_RO", "rl_fixed_window_peek", "1", "rl:{k}:fixed_window", "1", "1", "1"},
		},
		{
			name: "peek sliding log", method: peekN, key: "k", n: 3,
			limit: client.SlidingLog{Limit: 10, Window: time.Second},
			want:  []string{"FCALL_RO", "rl_sliding_log_peek", "1", "rl:{k}:sliding_log", "10", "1000", "3"},
		},
		{
			name: "peek sliding window", method: peek, key: "k",
			limit: client.SlidingWindow{Limit: 10, Window: time.Hour},
			want:  []string{"FCALL_RO", "rl_sliding_window_peek", "1", "rl:{k}:sliding_window", "10", "3600000", "1"},
		},
		{
			name: "peek token bucket", method: peekN, key: "k", n: 0,
			limit: client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Millisecond},
			want:  []string{"FCALL_RO", "rl_token_bucket_peek", "1", "rl:{k}:token_bucket", "1", "1", "1", "0"},
		},
		{
			name: "peek leaky bucket", method: peek, key: "k",
			limit: client.LeakyBucket{Capacity: 2, Rate: 3, Period: 4 * time.Millisecond, Mode: client.Shape},
			want:  []string{"FCALL_RO", "rl_leaky_bucket_peek", "1", "rl:{k}:leaky_bucket", "2", "3", "4", "1", "shape"},
		},
		{
			name: "hostile key", method: allow, key: "a}{%b",
			limit: client.FixedWindow{Limit: 1, Window: time.Second},
			want:  []string{"FCALL", "rl_fixed_window", "1", "rl:{a%7D%7B%25b}:fixed_window", "1", "1000", "1"},
		},
		{
			name: "long key", method: allow, key: strings.Repeat("k", 300),
			limit: client.FixedWindow{Limit: 1, Window: time.Second},
			want:  []string{"FCALL", "rl_fixed_window", "1", "rl:{" + strings.Repeat("k", 300) + "}:fixed_window", "1", "1000", "1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vk := mock.NewClient(gomock.NewController(t))
			vk.EXPECT().Do(gomock.Any(), mock.Match(tt.want...)).Return(okReply)
			lim := newLimiter(t, vk, client.Options{})
			ctx := context.Background()
			var err error
			switch tt.method {
			case allow:
				_, err = lim.Allow(ctx, tt.key, tt.limit)
			case allowN:
				_, err = lim.AllowN(ctx, tt.key, tt.limit, tt.n)
			case peek:
				_, err = lim.Peek(ctx, tt.key, tt.limit)
			case peekN:
				_, err = lim.PeekN(ctx, tt.key, tt.limit, tt.n)
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestPrefix(t *testing.T) {
	tests := []struct {
		give string
		want string
	}{
		{give: "", want: "rl:{user:1}:token_bucket"}, // the default: every key has a prefix
		{give: "app:rl:", want: "app:rl:{user:1}:token_bucket"},
		// a prefix cannot choose the slot either
		{give: "{all}:", want: "%7Ball%7D:{user:1}:token_bucket"},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			vk := mock.NewClient(gomock.NewController(t))
			vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_token_bucket", "1", tt.want, "1", "1", "1000", "1")).Return(okReply)
			if _, err := newLimiter(t, vk, client.Options{Prefix: tt.give}).Allow(context.Background(), "user:1",
				client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Second}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Every reply is decoded into a Result or a typed error; none panics.
func TestReplies(t *testing.T) {
	tests := []struct {
		name    string
		give    valkey.ValkeyResult
		want    client.Result
		wantErr func(error) bool
	}{
		{
			name: "allowed",
			give: mock.Result(ints(1, 100, 99, 0, 1000, 0)),
			want: client.Result{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: time.Second},
		},
		{
			name: "denied",
			give: mock.Result(ints(0, 100, 0, 977, 2977, 0)),
			want: client.Result{Limit: 100, RetryAfter: 977 * time.Millisecond, ResetAfter: 2977 * time.Millisecond},
		},
		{
			name: "shaped",
			give: mock.Result(ints(1, 3, 1, 0, 1990, 990)),
			want: client.Result{Allowed: true, Limit: 3, Remaining: 1, ResetAfter: 1990 * time.Millisecond, Delay: 990 * time.Millisecond},
		},
		{
			name: "cost above the limit",
			give: mock.Result(ints(0, 3, 3, -1, 0, 0)),
			want: client.Result{Limit: 3, Remaining: 3, RetryAfter: client.Never},
		},
		{
			name: "longest durations",
			give: mock.Result(ints(0, 1, 0, 9223372036854, 9223372036854, 9223372036854)),
			want: client.Result{Limit: 1, RetryAfter: 9223372036854 * time.Millisecond,
				ResetAfter: 9223372036854 * time.Millisecond, Delay: 9223372036854 * time.Millisecond},
		},
		{
			name: "a longer reply from a later 1.x",
			give: mock.Result(ints(1, 100, 99, 0, 1000, 0, 42)),
			want: client.Result{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: time.Second},
		},
		{name: "five elements", give: mock.Result(ints(1, 100, 99, 0, 1000)), wantErr: isReplyError},
		{name: "empty array", give: mock.Result(ints()), wantErr: isReplyError},
		{name: "allowed 2", give: mock.Result(ints(2, 100, 99, 0, 1000, 0)), wantErr: isReplyError},
		{name: "allowed -1", give: mock.Result(ints(-1, 100, 99, 0, 1000, 0)), wantErr: isReplyError},
		{name: "negative remaining", give: mock.Result(ints(1, 100, -1, 0, 1000, 0)), wantErr: isReplyError},
		{name: "retry -2", give: mock.Result(ints(0, 100, 0, -2, 1000, 0)), wantErr: isReplyError},
		{name: "negative reset", give: mock.Result(ints(1, 100, 0, 0, -1, 0)), wantErr: isReplyError},
		{name: "negative delay", give: mock.Result(ints(1, 100, 0, 0, 0, -1)), wantErr: isReplyError},
		{name: "reset overflows a Duration", give: mock.Result(ints(1, 100, 0, 0, 9223372036855, 0)), wantErr: isReplyError},
		{
			name: "string element",
			give: mock.Result(mock.ValkeyArray(mock.ValkeyInt64(1), mock.ValkeyBlobString("100"), mock.ValkeyInt64(0),
				mock.ValkeyInt64(0), mock.ValkeyInt64(0), mock.ValkeyInt64(0))),
			wantErr: isReplyError,
		},
		{
			name: "nested array",
			give: mock.Result(mock.ValkeyArray(ints(1), mock.ValkeyInt64(100), mock.ValkeyInt64(0),
				mock.ValkeyInt64(0), mock.ValkeyInt64(0), mock.ValkeyInt64(0))),
			wantErr: isReplyError,
		},
		{
			name: "nil element",
			give: mock.Result(mock.ValkeyArray(mock.ValkeyNil(), mock.ValkeyInt64(100), mock.ValkeyInt64(0),
				mock.ValkeyInt64(0), mock.ValkeyInt64(0), mock.ValkeyInt64(0))),
			wantErr: isReplyError,
		},
		{name: "integer", give: mock.Result(mock.ValkeyInt64(1)), wantErr: isReplyError},
		{name: "string", give: mock.Result(mock.ValkeyString("OK")), wantErr: isReplyError},
		{name: "nil", give: mock.Result(mock.ValkeyNil()), wantErr: isReplyError},
		{name: "map", give: mock.Result(mock.ValkeyMap(map[string]valkey.ValkeyMessage{"a": mock.ValkeyInt64(1)})), wantErr: isReplyError},
		{
			name: "RLERR",
			give: mock.Result(mock.ValkeyError("RLERR rl_token_bucket: key 'rl:{k}:token_bucket' does not hold rl_token_bucket state")),
			wantErr: func(err error) bool {
				var le *client.LibraryError
				return errors.As(err, &le) && le.Function == "rl_token_bucket" &&
					le.Message == "rl_token_bucket: key 'rl:{k}:token_bucket' does not hold rl_token_bucket state" &&
					err.Error() == "client: rl_token_bucket: RLERR rl_token_bucket: key 'rl:{k}:token_bucket' does not hold rl_token_bucket state"
			},
		},
		{
			name:    "function not found",
			give:    mock.Result(mock.ValkeyError("ERR Function not found")),
			wantErr: func(err error) bool { return errors.Is(err, client.ErrNotLoaded) },
		},
		{
			name: "another server error",
			give: mock.Result(mock.ValkeyError("NOPERM this user has no permissions to run the 'fcall' command")),
			wantErr: func(err error) bool {
				_, ok := valkey.IsValkeyErr(errors.Unwrap(err))
				return ok && strings.HasPrefix(err.Error(), "client: rl_token_bucket: NOPERM")
			},
		},
		{
			name:    "network error",
			give:    mock.ErrorResult(context.DeadlineExceeded),
			wantErr: func(err error) bool { return errors.Is(err, context.DeadlineExceeded) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vk := mock.NewClient(gomock.NewController(t))
			vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(tt.give)
			got, err := newLimiter(t, vk, client.Options{Fallback: client.ReturnError}).Allow(context.Background(), "k", client.TokenBucket{Capacity: 100, Rate: 1, Period: time.Second})
			if tt.wantErr != nil {
				if !tt.wantErr(err) {
					t.Fatalf("got %v, %v; want another error", got, err)
				}
				if got != (client.Result{}) {
					t.Errorf("got %+v along with the error, want a zero Result", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func isReplyError(err error) bool {
	var re *client.ReplyError
	return errors.As(err, &re) && re.Function == "rl_token_bucket" && strings.HasPrefix(err.Error(), "client: rl_token_bucket: reply out of contract: ")
}

// A replica without the library (a deploy in progress) does not fail a peek: it is repeated
// with FCALL, which goes to the primary.
func TestPeekFallsBackToPrimary(t *testing.T) {
	limit := client.SlidingLog{Limit: 10, Window: time.Second}
	ro := mock.Match("FCALL_RO", "rl_sliding_log_peek", "1", "rl:{k}:sliding_log", "10", "1000", "1")
	rw := mock.Match("FCALL", "rl_sliding_log_peek", "1", "rl:{k}:sliding_log", "10", "1000", "1")
	notFound := mock.Result(mock.ValkeyError("ERR Function not found"))

	t.Run("primary answers", func(t *testing.T) {
		vk := mock.NewClient(gomock.NewController(t))
		gomock.InOrder(
			vk.EXPECT().Do(gomock.Any(), ro).Return(notFound),
			vk.EXPECT().Do(gomock.Any(), rw).Return(mock.Result(ints(1, 10, 4, 0, 800, 0))),
		)
		got, err := newLimiter(t, vk, client.Options{}).Peek(context.Background(), "k", limit)
		want := client.Result{Allowed: true, Limit: 10, Remaining: 4, ResetAfter: 800 * time.Millisecond}
		if err != nil || got != want {
			t.Fatalf("got %+v, %v; want %+v", got, err, want)
		}
	})
	t.Run("primary has none either", func(t *testing.T) {
		vk := mock.NewClient(gomock.NewController(t))
		gomock.InOrder(
			vk.EXPECT().Do(gomock.Any(), ro).Return(notFound),
			vk.EXPECT().Do(gomock.Any(), rw).Return(notFound),
		)
		_, err := newLimiter(t, vk, client.Options{Fallback: client.ReturnError}).Peek(context.Background(), "k", limit)
		if !errors.Is(err, client.ErrNotLoaded) || err.Error() != "client: the ratelimit library is not loaded on the server" {
			t.Fatalf("got %v, want ErrNotLoaded", err)
		}
	})
	t.Run("other errors are not retried", func(t *testing.T) {
		for _, give := range []valkey.ValkeyResult{
			mock.Result(mock.ValkeyError("RLERR nope")),
			mock.ErrorResult(context.Canceled),
			mock.Result(ints(9)),
		} {
			vk := mock.NewClient(gomock.NewController(t))
			vk.EXPECT().Do(gomock.Any(), ro).Return(give)
			if _, err := newLimiter(t, vk, client.Options{Fallback: client.ReturnError}).Peek(context.Background(), "k", limit); err == nil {
				t.Fatalf("%v: no error", give)
			}
		}
	})
}

// A limit or cost the library would refuse is a *LimitError, and nothing is sent (the mock
// expects no call).
func TestInvalidLimits(t *testing.T) {
	const maxDuration = 100000000000 * time.Millisecond
	tests := []struct {
		name  string
		give  client.Limit
		n     int64
		field string
	}{
		{name: "nil", give: nil, n: 1, field: "limit"},
		{name: "nil *FixedWindow", give: (*client.FixedWindow)(nil), n: 1, field: "limit"},
		{name: "nil *SlidingLog", give: (*client.SlidingLog)(nil), n: 1, field: "limit"},
		{name: "nil *SlidingWindow", give: (*client.SlidingWindow)(nil), n: 1, field: "limit"},
		{name: "nil *TokenBucket", give: (*client.TokenBucket)(nil), n: 1, field: "limit"},
		{name: "nil *LeakyBucket", give: (*client.LeakyBucket)(nil), n: 1, field: "limit"},
		{name: "zero limit", give: client.FixedWindow{Window: time.Second}, n: 1, field: "FixedWindow.Limit"},
		{name: "negative limit", give: client.FixedWindow{Limit: -1, Window: time.Second}, n: 1, field: "FixedWindow.Limit"},
		{name: "limit too big", give: client.FixedWindow{Limit: 1e15, Window: time.Second}, n: 1, field: "FixedWindow.Limit"},
		{name: "zero window", give: client.FixedWindow{Limit: 1}, n: 1, field: "FixedWindow.Window"},
		{name: "negative window", give: client.FixedWindow{Limit: 1, Window: -time.Second}, n: 1, field: "FixedWindow.Window"},
		{name: "sub-millisecond window", give: client.FixedWindow{Limit: 1, Window: 999 * time.Microsecond}, n: 1, field: "FixedWindow.Window"},
		{name: "fractional window", give: client.FixedWindow{Limit: 1, Window: 1500 * time.Microsecond}, n: 1, field: "FixedWindow.Window"},
		{name: "window too long", give: client.FixedWindow{Limit: 1, Window: maxDuration + time.Millisecond}, n: 1, field: "FixedWindow.Window"},
		{name: "log too long", give: client.SlidingLog{Limit: 100001, Window: time.Second}, n: 1, field: "SlidingLog.Limit"},
		{name: "log zero window", give: client.SlidingLog{Limit: 1}, n: 1, field: "SlidingLog.Window"},
		{name: "sliding zero limit", give: client.SlidingWindow{Window: time.Second}, n: 1, field: "SlidingWindow.Limit"},
		{name: "sliding nanosecond", give: client.SlidingWindow{Limit: 1, Window: time.Nanosecond}, n: 1, field: "SlidingWindow.Window"},
		{name: "sliding product", give: client.SlidingWindow{Limit: 999999999999999, Window: maxDuration}, n: 1, field: "SlidingWindow.Limit"},
		{name: "sliding product exactly 2^53", give: client.SlidingWindow{Limit: 8796093022208, Window: 1024 * time.Millisecond}, n: 1, field: "SlidingWindow.Limit"},
		{name: "bucket ticks exactly 2^53", give: client.TokenBucket{Capacity: 1099511627776, Rate: 125, Period: 1024 * time.Millisecond}, n: 1, field: "TokenBucket.Capacity"},
		{name: "sliding product just above 2^53", give: client.SlidingWindow{Limit: 4503599627371, Window: 2 * time.Second}, n: 1, field: "SlidingWindow.Limit"},
		{name: "token zero capacity", give: client.TokenBucket{Rate: 1, Period: time.Second}, n: 1, field: "TokenBucket.Capacity"},
		{name: "token zero rate", give: client.TokenBucket{Capacity: 1, Period: time.Second}, n: 1, field: "TokenBucket.Rate"},
		{name: "token negative rate", give: client.TokenBucket{Capacity: 1, Rate: -10, Period: time.Second}, n: 1, field: "TokenBucket.Rate"},
		{name: "token rate too big", give: client.TokenBucket{Capacity: 1, Rate: 1e15, Period: time.Second}, n: 1, field: "TokenBucket.Rate"},
		{name: "token zero period", give: client.TokenBucket{Capacity: 1, Rate: 1}, n: 1, field: "TokenBucket.Period"},
		{name: "token sub-millisecond period", give: client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Microsecond}, n: 1, field: "TokenBucket.Period"},
		{name: "token exact units overflow", give: client.TokenBucket{Capacity: 999999999999999, Rate: 7, Period: maxDuration}, n: 1, field: "TokenBucket.Capacity"},
		{name: "leaky zero capacity", give: client.LeakyBucket{Rate: 1, Period: time.Second}, n: 1, field: "LeakyBucket.Capacity"},
		{name: "leaky exact units overflow", give: client.LeakyBucket{Capacity: 999999999999999, Rate: 7, Period: maxDuration}, n: 1, field: "LeakyBucket.Capacity"},
		{name: "leaky bad mode", give: client.LeakyBucket{Capacity: 1, Rate: 1, Period: time.Second, Mode: 2}, n: 1, field: "LeakyBucket.Mode"},
		{name: "negative cost", give: client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Second}, n: -1, field: "cost"},
		{name: "cost too big", give: client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Second}, n: 1e15, field: "cost"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := newLimiter(t, mock.NewClient(gomock.NewController(t)), client.Options{})
			ctx := context.Background()
			for _, call := range []func() (client.Result, error){
				func() (client.Result, error) { return lim.AllowN(ctx, "k", tt.give, tt.n) },
				func() (client.Result, error) { return lim.PeekN(ctx, "k", tt.give, tt.n) },
			} {
				_, err := call()
				var le *client.LimitError
				if !errors.As(err, &le) || le.Field != tt.field || !strings.HasPrefix(err.Error(), "client: "+tt.field+" ") {
					t.Fatalf("got %v, want a *LimitError on %s", err, tt.field)
				}
			}
			// (a nil pointer's Validate dereferences it, as any value method does)
			if tt.field != "limit" && tt.field != "cost" && tt.give.Validate() == nil {
				t.Errorf("Validate accepts it")
			}
		})
	}
}

// The largest limits the library accepts are accepted.
func TestLimitsAtTheBounds(t *testing.T) {
	const maxDuration = 100000000000 * time.Millisecond
	for _, give := range []client.Limit{
		client.FixedWindow{Limit: 999999999999999, Window: maxDuration},
		client.FixedWindow{Limit: 1, Window: time.Millisecond},
		client.SlidingLog{Limit: 100000, Window: maxDuration},
		client.SlidingWindow{Limit: 90071992547409, Window: 100 * time.Millisecond}, // 2^53 - 92
		client.SlidingWindow{Limit: 4503599627370, Window: 2 * time.Second},
		client.SlidingWindow{Limit: 1, Window: maxDuration},
		client.TokenBucket{Capacity: 999999999999999, Rate: 100000000000000, Period: maxDuration}, // p = 1
		client.TokenBucket{Capacity: 9007, Rate: 1, Period: 1000000 * time.Millisecond},           // p = 1e9
		client.LeakyBucket{Capacity: 1, Rate: 1, Period: maxDuration, Mode: client.Shape},
	} {
		if err := give.Validate(); err != nil {
			t.Errorf("%#v: %v", give, err)
		}
	}
}

func TestLimitErrorMessages(t *testing.T) {
	tests := []struct {
		give client.Limit
		want string
	}{
		{client.FixedWindow{Limit: 0, Window: time.Second}, "client: FixedWindow.Limit must be from 1 to 999999999999999, got 0"},
		{client.SlidingLog{Limit: 1, Window: 1500 * time.Microsecond}, "client: SlidingLog.Window must be a whole number of milliseconds, got 1.5ms"},
		{client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Microsecond}, "client: TokenBucket.Period must be at least 1ms, got 1µs"},
		{client.SlidingWindow{Limit: 999999999999999, Window: time.Hour},
			"client: SlidingWindow.Limit * Window in milliseconds must be below 2^53, got 999999999999999 * 3600000"},
		{client.LeakyBucket{Capacity: 999999999999999, Rate: 7, Period: time.Hour},
			"client: LeakyBucket.Capacity * Period in microseconds / gcd(Rate, Period in microseconds) must be below 2^53, got 999999999999999 * 3600000000 / 1"},
		{client.LeakyBucket{Capacity: 1, Rate: 1, Period: time.Second, Mode: 5}, "client: LeakyBucket.Mode must be Police or Shape, got Mode(5)"},
	}
	for _, tt := range tests {
		if err := tt.give.Validate(); err == nil || err.Error() != tt.want {
			t.Errorf("%#v: got %v, want %s", tt.give, err, tt.want)
		}
	}
}

// newLimiter is client.New with the Options the test chose: an error is the test's bug.
func newLimiter(t testing.TB, vk valkey.Client, o client.Options) *client.Limiter {
	t.Helper()
	lim, err := client.New(vk, o)
	if err != nil {
		t.Fatal(err)
	}
	return lim
}
