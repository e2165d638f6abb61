package grpclimit

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rlfn/rlfn/client"
)

// A cost computed from what the call sent (Example_tokens' x-max-tokens) that no limit takes is
// the caller's fault: InvalidArgument, no decision, nothing reported or logged as a
// misconfiguration. A limit in shadow whose cost is invalid is left out, and the call served.
func TestBadCostIsTheCallers(t *testing.T) {
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	fromMetadata := func(ctx context.Context, _ string, _ any) int64 {
		v := metadata.ValueFromIncomingContext(ctx, "x-max-tokens")
		n, err := strconv.ParseInt(v[0], 10, 64)
		if err != nil {
			return -1
		}
		return n
	}
	tokens := client.TokenBucket{Capacity: 150_000, Rate: 150_000, Period: time.Minute}
	calls := client.SlidingWindow{Limit: 60, Window: time.Minute}
	for _, tt := range []struct {
		name      string
		give      string
		policy    Policy
		want      codes.Code
		wantRules int
	}{
		{name: "negative, an AlsoLimit's", give: "-5", want: codes.InvalidArgument,
			policy: Policy{Name: "calls", Limit: calls, Also: []AlsoLimit{{Name: "tokens", Cost: fromMetadata, SameKey: true, Limit: tokens}}}},
		{name: "unreadable, the Policy's", give: "lots", want: codes.InvalidArgument,
			policy: Policy{Name: "tokens", Limit: tokens, Cost: fromMetadata}},
		{name: "above the library's bound", give: "1000000000000000", want: codes.InvalidArgument,
			policy: Policy{Name: "tokens", Limit: tokens, Cost: fromMetadata}},
		// the Policy's Limit alone is decided by Allow, which rules does not record
		{name: "negative, a shadow limit's", give: "-5", want: codes.OK, wantRules: 0,
			policy: Policy{Name: "calls", Limit: calls, Also: []AlsoLimit{{Name: "tokens", Cost: fromMetadata, SameKey: true, Limit: tokens, Shadow: true}}}},
		{name: "a good cost", give: "1200", want: codes.OK, wantRules: 2,
			policy: Policy{Name: "calls", Limit: calls, Also: []AlsoLimit{{Name: "tokens", Cost: fromMetadata, SameKey: true, Limit: tokens}}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lim := &rules{constant: constant{res: client.Result{Allowed: true, Limit: 60, Remaining: 59}}}
			s, err := NewServer(lim, ServerOptions{Key: Metadata("x-key"), Default: tt.policy})
			if err != nil {
				t.Fatal(err)
			}
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-key", "org7", "x-max-tokens", tt.give))
			_, err = s.unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/p.S/M"}, func(context.Context, any) (any, error) { return nil, nil })
			s.shadows.Wait()
			if got := status.Code(err); got != tt.want {
				t.Fatalf("%v, want %v", err, tt.want)
			}
			if tt.want == codes.InvalidArgument && status.Convert(err).Message() != "grpclimit: invalid cost" {
				t.Errorf("message %q", status.Convert(err).Message())
			}
			if len(lim.got) != tt.wantRules {
				t.Errorf("%d rules decided, want %d", len(lim.got), tt.wantRules)
			}
		})
	}
	if buf.Len() != 0 {
		t.Errorf("logged %q; want nothing", buf.String())
	}
}
