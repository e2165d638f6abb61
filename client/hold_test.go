package client_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"

	"github.com/rlfn/rlfn/client"
)

// Holds send exactly the contract's commands (docs/library.md, Release 1.3.0): a lone rule
// rl_hold with its limiter's key and its hold key <prefix>{<key>}:holds:<algorithm>[:<name>];
// several rules of a Key one rl_multi with a hold group after each limit and replies; a settle
// one rl_hold_settle per rule, pipelined; AllowAllEach one rl_multi with replies.
func TestHoldCommands(t *testing.T) {
	ctx := context.Background()
	fw := client.FixedWindow{Limit: 100, Window: time.Minute, Name: "m"}
	tb := client.TokenBucket{Capacity: 50, Rate: 1, Period: time.Second, Reserve: 5}
	var sent [][]string
	vk := scriptClient{
		Client: mock.NewClient(nil),
		do: func(cmd []string) valkey.ValkeyResult {
			sent = append(sent, cmd)
			switch cmd[1] {
			case "rl_hold":
				return mock.Result(ints(1, 100, 70, 0, 60_000, 0, 30, 60_000))
			case "rl_multi":
				if cmd[2] == "4" {
					return mock.Result(ints(1, 50, 15, 0, 35_000, 0, 3,
						1, 100, 70, 0, 60_000, 0, 1, 0, 30, 0, 60_000, 0,
						1, 50, 15, 0, 35_000, 0, 1, 0, 30, 0, 35_000, 0))
				}
				return mock.Result(ints(1, 50, 44, 0, 6_000, 0, 2, 1, 100, 99, 0, 60_000, 0, 1, 50, 44, 0, 6_000, 0))
			}
			t.Errorf("unexpected %q", cmd)
			return mock.ErrorResult(context.Canceled)
		},
		doMulti: func(cmds [][]string) []valkey.ValkeyResult {
			sent = append(sent, cmds...)
			out := make([]valkey.ValkeyResult, len(cmds))
			for i := range cmds {
				out[i] = mock.Result(ints(1, 100, 80, 0, 60_000, 0, 20, 0))
			}
			return out
		},
	}
	lim := newLimiter(t, vk, client.Options{})
	h, res, err := lim.Hold(ctx, []client.Rule{{Key: "u", Limit: fw, Cost: 30}}, client.HoldOptions{ID: "req-7", TTL: time.Minute})
	if err != nil || !res.Allowed || h.Held()[0] != 30 || time.Until(h.Expires()) < 59*time.Second {
		t.Fatalf("hold: %+v, %v, held %v", res, err, h.Held())
	}
	if _, err := h.Settle(ctx, []int64{20}); err != nil {
		t.Fatal(err)
	}
	h, res, err = lim.Hold(ctx, []client.Rule{{Key: "u", Limit: fw, Cost: 30}, {Key: "u", Limit: tb, Cost: 30}},
		client.HoldOptions{ID: "req-8", TTL: time.Minute, Keep: true})
	if err != nil || !res.Allowed || res.Rule != 1 || !slices.Equal(h.Held(), []int64{30, 30}) {
		t.Fatalf("hold of two: %+v, %v, held %v", res, err, h.Held())
	}
	if _, err := h.Settle(ctx, []int64{20, 31}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := lim.AllowAllEach(ctx, []client.Rule{{Key: "u", Limit: fw}, {Key: "u", Limit: tb}}, 1); err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"FCALL", "rl_hold", "2", "rl:{u}:fixed_window:m", "rl:{u}:holds:fixed_window:m", "fixed_window", "100", "60000", "30", "0", "req-7", "60000", "0"},
		{"FCALL", "rl_hold_settle", "2", "rl:{u}:fixed_window:m", "rl:{u}:holds:fixed_window:m", "fixed_window", "100", "60000", "20", "0", "req-7"},
		{"FCALL", "rl_multi", "4", "rl:{u}:fixed_window:m", "rl:{u}:holds:fixed_window:m", "rl:{u}:token_bucket", "rl:{u}:holds:token_bucket",
			"fixed_window", "100", "60000", "30", "0", "hold", "req-8", "60000", "1",
			"token_bucket", "50", "1", "1000", "30", "5", "hold", "req-8", "60000", "1", "replies"},
		{"FCALL", "rl_hold_settle", "2", "rl:{u}:fixed_window:m", "rl:{u}:holds:fixed_window:m", "fixed_window", "100", "60000", "20", "0", "req-8"},
		{"FCALL", "rl_hold_settle", "2", "rl:{u}:token_bucket", "rl:{u}:holds:token_bucket", "token_bucket", "50", "1", "1000", "31", "5", "req-8"},
		{"FCALL", "rl_multi", "2", "rl:{u}:fixed_window:m", "rl:{u}:token_bucket",
			"fixed_window", "100", "60000", "1", "0", "token_bucket", "50", "1", "1000", "1", "5", "replies"},
	}
	if !slices.EqualFunc(sent, want, slices.Equal) {
		t.Errorf("sent\n%q\nwant\n%q", sent, want)
	}
}
