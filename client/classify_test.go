package client

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"
)

// What each error means for the breaker and the policy.
func TestClassify(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	reply := func(msg string) error {
		_, err := decode("rl_token_bucket", mock.Result(mock.ValkeyError(msg)))
		return err
	}
	network := func(err error) error {
		_, err = decode("rl_token_bucket", mock.ErrorResult(err))
		return err
	}
	tests := []struct {
		name       string
		give       error
		ctx        context.Context
		want       errKind
		failure    bool
		unanswered bool
	}{
		{name: "connection refused", give: network(&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}), want: kindUnreachable, failure: true, unanswered: true},
		{name: "connection closed", give: network(io.EOF), want: kindUnreachable, failure: true, unanswered: true},
		{name: "deadline", give: network(context.DeadlineExceeded), want: kindTimeout, failure: true, unanswered: true},
		{name: "i/o timeout", give: network(&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}), want: kindTimeout, failure: true, unanswered: true},
		{name: "not loaded", give: reply("ERR Function not found"), want: kindNotLoaded, failure: true},
		{name: "loading", give: reply("LOADING Valkey is loading the dataset in memory"), want: kindServer, failure: true},
		{name: "cluster down", give: reply("CLUSTERDOWN The cluster is down"), want: kindClusterDown, failure: true, unanswered: true},
		{name: "slot moving", give: reply("TRYAGAIN Multiple keys request during rehashing of slot"), want: kindClusterDown, failure: true, unanswered: true},
		{name: "library too old", give: &VersionError{Node: "n", Version: "1.0.0", Want: "1.1.0"}, want: kindVersion, failure: true},
		{name: "out of memory", give: reply("OOM command not allowed when used memory > 'maxmemory'"), want: kindServer, failure: true},
		{name: "reply out of contract", give: &replyError{Function: "f", Reason: "r"}, want: kindReply, failure: true},
		{name: "RLERR", give: reply("RLERR bad"), want: kindLibrary},
		{name: "caller canceled", give: network(context.Canceled), ctx: canceled, want: kindCanceled},
		{name: "caller canceled, whatever the error", give: network(io.EOF), ctx: canceled, want: kindCanceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := tt.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			got := classify(ctx, tt.give)
			if got != tt.want || got.failure() != tt.failure || got.unanswered() != tt.unanswered {
				t.Errorf("%v: %s (failure %v, unanswered %v), want %s", tt.give, kindNames[got], got.failure(), got.unanswered(), kindNames[tt.want])
			}
		})
	}
	// a wrapped server error is still one
	if _, ok := valkey.IsValkeyErr(errors.Unwrap(reply("LOADING x"))); !ok {
		t.Error("replyErr no longer wraps the *valkey.ValkeyError")
	}
}

// The answers an older library gives a call it cannot serve, which send the client to ask the
// node's version; and answers that say nothing of the version.
func TestOlderLibrary(t *testing.T) {
	for _, tt := range []struct {
		give error
		want bool
	}{
		{ErrNotLoaded, true},
		{&LibraryError{Function: "rl_token_bucket", Message: "rl_token_bucket takes 4 arguments (capacity rate period_ms cost), got 5"}, true},
		{&LibraryError{Function: "rl_multi", Message: "rl_multi: group 2: unknown algorithm 'calendar' (fixed_window, sliding_log, sliding_window, token_bucket or leaky_bucket)"}, true},
		{&LibraryError{Function: "rl_token_bucket", Message: "rl_token_bucket: key 'k' does not hold token_bucket state"}, false},
		{&LibraryError{Function: "rl_fixed_window", Message: "limit must be an integer from 1 to 999999999999999, got '0'"}, false},
		{context.DeadlineExceeded, false},
	} {
		if got := olderLibrary(tt.give); got != tt.want {
			t.Errorf("olderLibrary(%v) = %v, want %v", tt.give, got, tt.want)
		}
	}
}
