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

// More rules than Options.MaxRules are refused before anything is sent (the mock expects no
// call), with a short *LimitError naming the bound; as many are taken.
func TestAllowAllBoundsItsRules(t *testing.T) {
	vk := mock.NewClient(gomock.NewController(t))
	lim := newLimiter(t, vk, client.Options{MaxRules: 3})
	limit := client.FixedWindow{Limit: 10, Window: time.Minute}
	rules := func(n int) []client.Rule {
		rs := make([]client.Rule, n)
		for i := range rs {
			rs[i] = client.Rule{Key: fmt.Sprint("k", i), Limit: limit}
		}
		return rs
	}
	for _, call := range []func([]client.Rule) error{
		func(rs []client.Rule) error { _, err := lim.AllowAll(context.Background(), rs); return err },
		func(rs []client.Rule) error { _, _, err := lim.AllowAllEach(context.Background(), rs, 1); return err },
		func(rs []client.Rule) error { _, err := lim.PeekAll(context.Background(), rs); return err },
	} {
		err := call(rules(100_000))
		var le *client.LimitError
		if !errors.As(err, &le) || le.Field != "rules" || !strings.Contains(err.Error(), "MaxRules") || len(err.Error()) > 100 {
			t.Errorf("got %v, want a short *LimitError naming Options.MaxRules", err)
		}
	}
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(okReply).Times(3)
	if _, err := lim.AllowAll(context.Background(), rules(3)); err != nil {
		t.Fatal(err)
	}
	if _, err := client.New(vk, client.Options{MaxRules: -1}); err == nil {
		t.Error("MaxRules -1 accepted")
	}
}

// A refund the server surely did not make (an error reply: LOADING) is tried again in the
// background until the server makes it, with nothing returned to the caller.
func TestAllowAllRetriesOwedRefunds(t *testing.T) {
	vk := mock.NewClient(gomock.NewController(t))
	vk.EXPECT().Nodes().Return(map[string]valkey.Client{"127.0.0.1:6379": vk}).AnyTimes()
	l := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Minute}
	vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_token_bucket", "1", "rl:{a}:token_bucket", "10", "1", "60000", "1", "0")).
		Return(mock.Result(ints(1, 10, 9, 0, 6000, 0)))
	vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_token_bucket", "1", "rl:{b}:token_bucket", "10", "1", "60000", "1", "0")).
		Return(mock.Result(ints(0, 10, 0, 6000, 60000, 0)))
	refund := mock.Match("FCALL", "rl_token_bucket_refund", "1", "rl:{a}:token_bucket", "10", "1", "60000", "1")
	made := make(chan struct{})
	gomock.InOrder(
		vk.EXPECT().Do(gomock.Any(), refund).Return(mock.Result(mock.ValkeyError("LOADING the dataset"))),
		vk.EXPECT().Do(gomock.Any(), refund).Return(mock.Result(mock.ValkeyError("LOADING the dataset"))),
		vk.EXPECT().Do(gomock.Any(), refund).DoAndReturn(func(context.Context, valkey.Completed) valkey.ValkeyResult {
			close(made)
			return okReply
		}),
	)
	lim := newLimiter(t, vk, client.Options{Fallback: client.ReturnError})
	res, err := lim.AllowAll(context.Background(), []client.Rule{{Key: "a", Limit: l}, {Key: "b", Limit: l}})
	if err != nil || res.Allowed {
		t.Fatalf("got %+v, %v: want the denial, no error", res, err)
	}
	if n := lim.OwedRefunds(); n != 1 {
		t.Fatalf("%d refunds owed, want 1", n)
	}
	select {
	case <-made:
	case <-time.After(10 * time.Second):
		t.Fatal("the owed refund was not made")
	}
	for lim.OwedRefunds() != 0 {
		time.Sleep(time.Millisecond)
	}
}

// RefundAll refunds each rule of an admitted decision its cost at the server (a rule's Cost,
// else n), nothing for a rule the Fallback decided or of cost 0; a refund the server surely did
// not make (LOADING) is owed and tried again in the background; rules and each that do not
// match are refused before anything is sent.
func TestRefundAll(t *testing.T) {
	vk := mock.NewClient(gomock.NewController(t))
	vk.EXPECT().Nodes().Return(map[string]valkey.Client{"127.0.0.1:6379": vk}).AnyTimes()
	l := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Minute}
	made := make(chan struct{})
	gomock.InOrder(
		vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_token_bucket_refund", "1", "rl:{a}:token_bucket", "10", "1", "60000", "3")).
			Return(mock.Result(mock.ValkeyError("LOADING the dataset"))),
		vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_token_bucket_refund", "1", "rl:{a}:token_bucket", "10", "1", "60000", "3")).
			DoAndReturn(func(context.Context, valkey.Completed) valkey.ValkeyResult {
				close(made)
				return okReply
			}),
	)
	vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_token_bucket_refund", "1", "rl:{b}:token_bucket", "10", "1", "60000", "2")).Return(okReply)
	lim := newLimiter(t, vk, client.Options{Fallback: client.FailOpen})
	rules := []client.Rule{{Key: "a", Limit: l, Cost: 3}, {Key: "b", Limit: l}, {Key: "c", Limit: l}}
	var le *client.LimitError
	if err := lim.RefundAll(context.Background(), rules, 2, make([]client.Result, 2)); !errors.As(err, &le) || le.Field != "each" {
		t.Fatalf("got %v, want a *LimitError of each", err)
	}
	if err := lim.RefundAll(context.Background(), append(rules, client.Rule{Key: "d"}), 2, make([]client.Result, 4)); !errors.As(err, &le) {
		t.Fatalf("got %v, want a *LimitError of the rule with no Limit", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the refunds are owed whatever becomes of the caller's context
	each := []client.Result{{Allowed: true, Limit: 10, ResetAfter: time.Minute}, {Allowed: true, Limit: 10}, {Allowed: true, Source: client.FromFallback}}
	if err := lim.RefundAll(ctx, rules, 2, each); err != nil {
		t.Fatal(err)
	}
	if n := lim.OwedRefunds(); n != 1 {
		t.Fatalf("%d refunds owed, want 1", n)
	}
	select {
	case <-made:
	case <-time.After(10 * time.Second):
		t.Fatal("the owed refund was not made")
	}
	for lim.OwedRefunds() != 0 {
		time.Sleep(time.Millisecond)
	}
}
