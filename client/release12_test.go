package client_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"
	"go.uber.org/mock/gomock"

	"github.com/rlfn/rlfn/client"
)

// A clock at 2026-03-31 12:00 UTC: a month's window anchored on the 31st started at midnight,
// the day before's was 28 February's, the next starts 30 April (clamped).
var march31 = time.Date(2026, 3, 31, 12, 0, 0, 0, time.UTC)

func ms(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// Each 1.2 call sends exactly the contract's command: a calendar its boundaries, computed
// from the Limiter's clock in the anchor's zone; a limit with a Penalty one rl_multi with the
// principal's block group last; Block, Unblock and PeekBlock the block key alone.
func TestRelease12Commands(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	monthly := client.Calendar{Limit: 100, Period: client.Month, Anchor: time.Date(2020, 1, 31, 0, 0, 0, 0, time.UTC)}
	// Berlin days around the spring change: 29 March 2026 is 23 hours long.
	daily := client.Calendar{Limit: 5, Period: client.Day, Anchor: time.Date(2026, 1, 1, 0, 0, 0, 0, berlin), Reserve: 1, Name: "d"}
	ctx := context.Background()
	tests := []struct {
		name  string
		at    time.Time
		want  []string
		reply valkey.ValkeyResult
		do    func(*client.Limiter) (client.Result, error)
		check func(*testing.T, client.Result)
	}{
		{
			name: "a calendar month, clamped to the month's last day",
			at:   march31,
			want: []string{"FCALL", "rl_calendar", "1", "rl:{u}:calendar", "100",
				ms(time.Date(2026, 2, 28, 0, 0, 0, 0, time.UTC)), ms(time.Date(2026, 3, 31, 0, 0, 0, 0, time.UTC)),
				ms(time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC)), ms(time.Date(2026, 5, 31, 0, 0, 0, 0, time.UTC)), "3"},
			do: func(l *client.Limiter) (client.Result, error) { return l.AllowN(ctx, "u", monthly, 3) },
		},
		{
			name: "a Berlin day of 23 hours, with its reserve",
			at:   time.Date(2026, 3, 29, 12, 0, 0, 0, time.UTC),
			want: []string{"FCALL", "rl_calendar", "1", "rl:{u}:calendar:d", "5",
				ms(time.Date(2026, 3, 28, 0, 0, 0, 0, berlin)), ms(time.Date(2026, 3, 29, 0, 0, 0, 0, berlin)),
				ms(time.Date(2026, 3, 30, 0, 0, 0, 0, berlin)), ms(time.Date(2026, 3, 31, 0, 0, 0, 0, berlin)), "1", "1"},
			do: func(l *client.Limiter) (client.Result, error) { return l.Allow(ctx, "u", daily) },
		},
		{
			name: "a calendar's peek",
			at:   march31,
			want: []string{"FCALL_RO", "rl_calendar_peek", "1", "rl:{u}:calendar", "100",
				ms(time.Date(2026, 2, 28, 0, 0, 0, 0, time.UTC)), ms(time.Date(2026, 3, 31, 0, 0, 0, 0, time.UTC)),
				ms(time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC)), ms(time.Date(2026, 5, 31, 0, 0, 0, 0, time.UTC)), "1"},
			do: func(l *client.Limiter) (client.Result, error) { return l.Peek(ctx, "u", monthly) },
		},
		{
			name: "a calendar's refund",
			at:   march31,
			want: []string{"FCALL", "rl_calendar_refund", "1", "rl:{u}:calendar", "100",
				ms(time.Date(2026, 2, 28, 0, 0, 0, 0, time.UTC)), ms(time.Date(2026, 3, 31, 0, 0, 0, 0, time.UTC)),
				ms(time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC)), ms(time.Date(2026, 5, 31, 0, 0, 0, 0, time.UTC)), "2"},
			do: func(l *client.Limiter) (client.Result, error) { return l.Refund(ctx, "u", monthly, 2) },
		},
		{
			name: "a limit with a penalty and the principal's block, in one rl_multi",
			at:   march31,
			want: []string{"FCALL", "rl_multi", "2", "rl:{u}:fixed_window", "rl:{u}:block",
				"fixed_window", "5", "1000", "1", "0", "block", "60000"},
			reply: mock.Result(ints(0, 0, 0, 60000, 60000, 0, 2)),
			do: func(l *client.Limiter) (client.Result, error) {
				return l.Allow(ctx, "u", client.FixedWindow{Limit: 5, Window: time.Second, Penalty: time.Minute})
			},
			check: func(t *testing.T, r client.Result) {
				if !r.Blocked || r.Allowed || r.RetryAfter != time.Minute {
					t.Errorf("got %+v, want a denial by the block for a minute", r)
				}
			},
		},
		{
			name: "a limit whose own wait outlasts the penalty binds, and the principal is blocked",
			at:   march31,
			want: []string{"FCALL", "rl_multi", "2", "rl:{u}:fixed_window", "rl:{u}:block",
				"fixed_window", "5", "3600000", "1", "0", "block", "60000"},
			reply: mock.Result(ints(0, 5, 0, 1800000, 1800000, 0, 1)),
			do: func(l *client.Limiter) (client.Result, error) {
				return l.Allow(ctx, "u", client.FixedWindow{Limit: 5, Window: time.Hour, Penalty: time.Minute})
			},
			check: func(t *testing.T, r client.Result) {
				if !r.Blocked || r.Allowed || r.Limit != 5 || r.RetryAfter != 30*time.Minute {
					t.Errorf("got %+v, want the window's denial, blocked", r)
				}
			},
		},
		{
			name: "its peek looks at the block too",
			at:   march31,
			want: []string{"FCALL_RO", "rl_multi_peek", "2", "rl:{u}:fixed_window", "rl:{u}:block",
				"fixed_window", "5", "1000", "1", "0", "block", "60000"},
			reply: mock.Result(ints(1, 5, 4, 0, 0, 0, 1)),
			do: func(l *client.Limiter) (client.Result, error) {
				return l.Peek(ctx, "u", client.FixedWindow{Limit: 5, Window: time.Second, Penalty: time.Minute})
			},
			check: func(t *testing.T, r client.Result) {
				if r.Blocked || !r.Allowed {
					t.Errorf("got %+v, want admitted, not blocked", r)
				}
			},
		},
		{
			name: "a principal's rules share its one block, with the longest penalty",
			at:   march31,
			want: []string{"FCALL", "rl_multi", "3", "rl:{u}:fixed_window", "rl:{u}:calendar", "rl:{u}:block",
				"fixed_window", "5", "1000", "1", "0",
				"calendar", "100", ms(time.Date(2026, 2, 28, 0, 0, 0, 0, time.UTC)), ms(time.Date(2026, 3, 31, 0, 0, 0, 0, time.UTC)),
				ms(time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC)), ms(time.Date(2026, 5, 31, 0, 0, 0, 0, time.UTC)), "1", "0",
				"block", "3600000"},
			reply: mock.Result(ints(1, 100, 99, 0, 1000, 0, 2)),
			do: func(l *client.Limiter) (client.Result, error) {
				m := monthly
				m.Penalty = time.Hour
				return l.AllowAll(ctx, []client.Rule{
					{Key: "u", Limit: client.FixedWindow{Limit: 5, Window: time.Second, Penalty: time.Second}},
					{Key: "u", Limit: m},
				})
			},
			check: func(t *testing.T, r client.Result) {
				if r.Rule != 1 || r.Blocked {
					t.Errorf("got %+v, want rule 1 binding", r)
				}
			},
		},
		{
			name:  "Block",
			at:    march31,
			want:  []string{"FCALL", "rl_block", "1", "rl:{u}:block", "90000"},
			reply: mock.Result(ints(0, 0, 0, 90000, 90000, 0)),
			do:    func(l *client.Limiter) (client.Result, error) { return l.Block(ctx, "u", 90*time.Second) },
			check: func(t *testing.T, r client.Result) {
				if !r.Blocked || r.RetryAfter != 90*time.Second {
					t.Errorf("got %+v", r)
				}
			},
		},
		{
			name:  "Unblock",
			at:    march31,
			want:  []string{"FCALL", "rl_unblock", "1", "rl:{u}:block"},
			reply: mock.Result(ints(1, 0, 0, 0, 0, 0)),
			do:    func(l *client.Limiter) (client.Result, error) { return l.Unblock(ctx, "u") },
			check: func(t *testing.T, r client.Result) {
				if r.Blocked || !r.Allowed {
					t.Errorf("got %+v", r)
				}
			},
		},
		{
			name:  "PeekBlock",
			at:    march31,
			want:  []string{"FCALL_RO", "rl_block_peek", "1", "rl:{u}:block"},
			reply: mock.Result(ints(0, 0, 0, 5, 5, 0)),
			do:    func(l *client.Limiter) (client.Result, error) { return l.PeekBlock(ctx, "u") },
			check: func(t *testing.T, r client.Result) {
				if !r.Blocked || r.RetryAfter != 5*time.Millisecond {
					t.Errorf("got %+v", r)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vk := mock.NewClient(gomock.NewController(t))
			reply := okReply
			if tt.reply != (valkey.ValkeyResult{}) {
				reply = tt.reply
			}
			vk.EXPECT().Do(gomock.Any(), mock.Match(tt.want...)).Return(reply)
			at := tt.at.UnixNano()
			lim := newLimiter(t, vk, client.WithClock(client.Options{}, func() int64 { return at }))
			res, err := tt.do(lim)
			if err != nil {
				t.Fatal(err)
			}
			if tt.check != nil {
				tt.check(t, res)
			}
		})
	}
}

// A calendar the library would refuse is a *LimitError, sent nowhere: no period, an anchor in
// time.Local (whatever the process's environment said, never the customer's zone), a penalty
// of a fraction of a millisecond.
func TestRelease12Validate(t *testing.T) {
	for _, tt := range []struct {
		give  client.Limit
		field string
	}{
		{client.Calendar{Limit: 1}, "Calendar.Period"},
		{client.Calendar{Limit: 0, Period: client.Day}, "Calendar.Limit"},
		{client.Calendar{Limit: 1, Period: client.Year + 1}, "Calendar.Period"},
		{client.Calendar{Limit: 1, Period: client.Day, Anchor: time.Date(2026, 1, 1, 0, 0, 0, 0, time.Local)}, "Calendar.Anchor"},
		{client.Calendar{Limit: 1, Period: client.Day, Reserve: 2}, "Calendar.Reserve"},
		{client.Calendar{Limit: 1, Period: client.Week, Penalty: time.Microsecond}, "Calendar.Penalty"},
		{client.FixedWindow{Limit: 1, Window: time.Second, Penalty: 1500 * time.Microsecond}, "FixedWindow.Penalty"},
		{client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Second, Penalty: -time.Second}, "TokenBucket.Penalty"},
	} {
		var le *client.LimitError
		if err := tt.give.Validate(); !errors.As(err, &le) || le.Field != tt.field {
			t.Errorf("%#v: got %v, want a *LimitError on %s", tt.give, err, tt.field)
		}
		lim := newLimiter(t, mock.NewClient(nil), client.Options{}) // a call would fail the test: no expectation
		if _, err := lim.Allow(context.Background(), "u", tt.give); !errors.As(err, &le) {
			t.Errorf("%#v: Allow returned %v", tt.give, err)
		}
	}
	if _, err := newLimiter(t, mock.NewClient(nil), client.Options{}).Block(context.Background(), "u", 0); err == nil {
		t.Error("Block for 0 accepted")
	}
	for p, want := range map[client.Period]string{client.Day: "day", client.Week: "week", client.Month: "month", client.Year: "year"} {
		if p.String() != want {
			t.Errorf("%d is %q", p, p)
		}
	}
	if q := (client.Calendar{Limit: 7, Period: client.Week}).Quota(); q.Limit != 7 || q.Window != 7*24*time.Hour {
		t.Errorf("a UTC week's quota: %+v", q)
	}
}

// The local fallback decides a calendar as the server would, in the window of the call's
// boundaries: the limit's share until the window ends, then a fresh one.
func TestRelease12LocalCalendar(t *testing.T) {
	clock := newFakeClock()
	clock.ns.Store(time.Date(2026, 3, 31, 23, 59, 59, 0, time.UTC).UnixNano())
	vk := mock.NewClient(gomock.NewController(t))
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(refused).AnyTimes()
	lim := newLimiter(t, vk, client.WithClock(client.Options{Instances: 2, BreakerFailures: 1000}, clock.now))
	daily := client.Calendar{Limit: 4, Period: client.Day}
	ctx := context.Background()
	for i := range 3 {
		r, err := lim.Allow(ctx, "u", daily)
		want := i < 2 // 4 / 2 instances
		if err != nil || r.Allowed != want || r.Source != client.FromFallback || r.Limit != 2 {
			t.Fatalf("call %d: %+v, %v", i+1, r, err)
		}
		if !want && r.RetryAfter != time.Second {
			t.Fatalf("denied until the day ends in 1s, got %s", r.RetryAfter)
		}
	}
	clock.advance(time.Second) // 1 April, a new window
	if r, err := lim.Allow(ctx, "u", daily); err != nil || !r.Allowed || r.Remaining != 1 {
		t.Fatalf("the next day: %+v, %v", r, err)
	}
}

// The denial cache honours a block: a call refused by the principal's block is answered from
// memory, still blocked, until the block's remaining time has passed, and not longer.
func TestRelease12DenialCacheKeepsBlock(t *testing.T) {
	clock := newFakeClock()
	vk := mock.NewClient(gomock.NewController(t))
	vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_multi", "2", "rl:{u}:fixed_window", "rl:{u}:block",
		"fixed_window", "5", "1000", "1", "0", "block", "60000")).Return(mock.Result(ints(0, 0, 0, 2000, 2000, 0, 2))).Times(2)
	lim := newLimiter(t, vk, client.WithClock(client.Options{DenialCache: 10}, clock.now))
	fw := client.Limit(client.FixedWindow{Limit: 5, Window: time.Second, Penalty: time.Minute})
	ctx := context.Background()
	if r, err := lim.Allow(ctx, "u", fw); err != nil || !r.Blocked || r.Source != client.FromServer {
		t.Fatalf("the server's denial: %+v, %v", r, err)
	}
	clock.advance(1500 * time.Millisecond)
	r, err := lim.Allow(ctx, "u", fw)
	if err != nil || !r.Blocked || r.Source != client.FromDenialCache || r.RetryAfter != 500*time.Millisecond {
		t.Fatalf("from the cache: %+v, %v; want blocked 500ms more", r, err)
	}
	clock.advance(500 * time.Millisecond)
	if r, err := lim.Allow(ctx, "u", fw); err != nil || r.Source != client.FromServer {
		t.Fatalf("after the block's time: %+v, %v; want the server asked again", r, err)
	}
}

// A principal's rules with a Penalty are decided with its block, one key more: at most 15 of
// them per key, refused before any call rather than by the server.
func TestRelease12RulesWithPenalty(t *testing.T) {
	lim := newLimiter(t, mock.NewClient(nil), client.Options{})
	var rules []client.Rule
	for i := range 16 {
		rules = append(rules, client.Rule{Key: "u", Limit: client.FixedWindow{Limit: 5, Window: time.Second, Name: strconv.Itoa(i)}})
	}
	rules[0].Limit = client.FixedWindow{Limit: 5, Window: time.Second, Name: "0", Penalty: time.Minute}
	var le *client.LimitError
	if _, err := lim.AllowAll(context.Background(), rules); !errors.As(err, &le) || le.Field != "rules[15].Limit" {
		t.Fatalf("16 rules of a key with a penalty: %v", err)
	}
}

// Unblock and Block through a Limiter drop the principal's cached denials: they were made
// under the block the call changed. (Another process's Unblock is not seen: its denials last
// until their RetryAfter.)
func TestRelease12UnblockDropsCachedDenials(t *testing.T) {
	clock := newFakeClock()
	vk := mock.NewClient(gomock.NewController(t))
	multi := mock.Match("FCALL", "rl_multi", "2", "rl:{u}:fixed_window", "rl:{u}:block",
		"fixed_window", "5", "1000", "1", "0", "block", "60000")
	gomock.InOrder(
		vk.EXPECT().Do(gomock.Any(), multi).Return(mock.Result(ints(0, 0, 0, 60000, 60000, 0, 2))),
		vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_unblock", "1", "rl:{u}:block")).Return(mock.Result(ints(1, 0, 0, 0, 0, 0))),
		vk.EXPECT().Do(gomock.Any(), multi).Return(mock.Result(ints(1, 5, 4, 0, 1000, 0, 1))),
	)
	lim := newLimiter(t, vk, client.WithClock(client.Options{DenialCache: 10}, clock.now))
	fw := client.Limit(client.FixedWindow{Limit: 5, Window: time.Second, Penalty: time.Minute})
	ctx := context.Background()
	if r, err := lim.Allow(ctx, "u", fw); err != nil || !r.Blocked {
		t.Fatalf("%+v, %v", r, err)
	}
	if _, err := lim.Unblock(ctx, "u"); err != nil {
		t.Fatal(err)
	}
	if r, err := lim.Allow(ctx, "u", fw); err != nil || !r.Allowed || r.Source != client.FromServer {
		t.Fatalf("after Unblock: %+v, %v; want the server's admission", r, err)
	}
}

// An rl_multi call writes its keys and arguments into one buffer, as a single limit's call
// does: a limit with a Penalty allocates about as much as one without, and a principal's two
// limits in one AllowAll about twice that. (Allocation counts, not times: they hold on any
// machine.)
func TestMultiAllocations(t *testing.T) {
	lim := newLimiter(t, replyClient{mock.NewClient(nil), mock.Result(ints(1, 100, 99, 0, 1000, 0, 1))}, client.Options{})
	penalised := client.Limit(client.FixedWindow{Limit: 100, Window: time.Minute, Penalty: time.Minute})
	rules := []client.Rule{
		{Key: "k", Limit: client.FixedWindow{Limit: 100, Window: time.Minute}},
		{Key: "k", Limit: client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}},
	}
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() { lim.Allow(ctx, "k", penalised) }); n > 6 {
		t.Errorf("a penalised Allow: %.0f allocations, want at most 6 (it was 18 with a string per key and argument)", n)
	}
	if n := testing.AllocsPerRun(1000, func() { lim.AllowAll(ctx, rules) }); n > 14 {
		t.Errorf("AllowAll of a key's two limits: %.0f allocations, want at most 14 (it was 27)", n)
	}
}
