package rls_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/rls"
)

// wireCodec sends its wire bytes whatever the request given to ShouldRateLimit (proto refuses
// to encode a string that is not UTF-8, where Envoy's C++ encoder sends it), and decodes
// answers as proto does.
type wireCodec struct{ wire []byte }

func (c wireCodec) Marshal(any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(c.wire)}, nil
}
func (wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}
func (wireCodec) Name() string { return "proto" }

// A descriptor value that is not UTF-8 (a header's obs-text byte Envoy copies as it is) is
// decided, under its own limit, with the byte escaped, rather than answered INTERNAL before
// the service sees it, which Envoy's default failure_mode_deny: false admits: one byte would
// take a client out of its limit. Two values that differ only there keep two limits.
func TestInvalidUTF8(t *testing.T) {
	b := backends(t)[0]
	var logs harness.Buffer
	r := newRig(t, b, config, client.Options{}, rls.ServerOptions{Log: slog.New(slog.NewJSONHandler(&logs, nil))}, rls.Options{})
	wire := func(v byte) []byte {
		data, err := proto.Marshal(request("edge", desc("small", "caf?")))
		if err != nil {
			t.Fatal(err)
		}
		i := bytes.Index(data, []byte("caf?"))
		data[i+3] = v
		return data
	}
	ask := func(v byte) *pb.RateLimitResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := r.rls.ShouldRateLimit(ctx, &pb.RateLimitRequest{}, grpc.ForceCodecV2(wireCodec{wire(v)}))
		if err != nil {
			t.Fatalf("value caf\\x%02x: %v", v, err)
		}
		return resp
	}
	// small: 2 a minute.
	for i, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
		if got := ask(0xe9).OverallCode; got != want {
			t.Fatalf("request %d: %v, want %v", i, got, want)
		}
	}
	if got := ask(0xe8).OverallCode; got != pb.RateLimitResponse_OK {
		t.Fatalf("another invalid value shares the first's limit: %v", got)
	}
	if !strings.Contains(logs.String(), "not valid UTF-8") {
		t.Errorf("nothing logged:\n%s", logs.String())
	}
}
