package rls

import (
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/envoyconf"
)

// A descriptor's status from its limits' results: the binding limit, the remaining units,
// and the time until reset in whole seconds rounded up.
func TestStatus(t *testing.T) {
	now := time.Unix(1000*60+15, 300e6) // 15.3 s into a minute
	s := &Service{now: func() time.Time { return now }}
	minute := envoyconf.Limit{Algorithm: envoyconf.FixedWindow, RequestsPerUnit: 10, Unit: envoyconf.Minute, Multiplier: 1}
	bucket := envoyconf.Limit{Algorithm: envoyconf.TokenBucket, RequestsPerUnit: 1, Unit: envoyconf.Second, Multiplier: 10}
	rl := &envoyconf.RateLimit{Name: "n"}
	for _, tc := range []struct {
		name      string
		limits    []envoyconf.Limit
		results   []client.Result
		code      pb.RateLimitResponse_Code
		rpu       uint32
		remaining uint32
		reset     int64
	}{
		{"admitted", []envoyconf.Limit{minute}, []client.Result{{Allowed: true, Remaining: 7, ResetAfter: 44700 * time.Millisecond}}, pb.RateLimitResponse_OK, 10, 7, 45},
		{"nothing counted: the window's end", []envoyconf.Limit{minute}, []client.Result{{Allowed: true, Remaining: 10}}, pb.RateLimitResponse_OK, 10, 10, 45},
		{"refused: the real wait, rounded up", []envoyconf.Limit{bucket}, []client.Result{{Allowed: false, Remaining: 0, RetryAfter: 8001 * time.Millisecond, ResetAfter: 28 * time.Second}}, pb.RateLimitResponse_OVER_LIMIT, 1, 0, 9},
		{"refused with units left reports none", []envoyconf.Limit{minute}, []client.Result{{Allowed: false, Remaining: 2, RetryAfter: time.Second}}, pb.RateLimitResponse_OVER_LIMIT, 10, 0, 1},
		{"never: the reset", []envoyconf.Limit{minute}, []client.Result{{Allowed: false, RetryAfter: client.Never, ResetAfter: 3 * time.Second}}, pb.RateLimitResponse_OVER_LIMIT, 10, 0, 3},
		{"fewest remaining binds", []envoyconf.Limit{minute, bucket}, []client.Result{{Allowed: true, Remaining: 7, ResetAfter: time.Second}, {Allowed: true, Remaining: 2, ResetAfter: 20 * time.Second}}, pb.RateLimitResponse_OK, 1, 2, 20},
		{"the refusing limit binds", []envoyconf.Limit{minute, bucket}, []client.Result{{Allowed: true, Remaining: 0, ResetAfter: time.Second}, {Allowed: false, RetryAfter: 5 * time.Second}}, pb.RateLimitResponse_OVER_LIMIT, 1, 0, 5},
		{"the longest wait binds", []envoyconf.Limit{minute, bucket}, []client.Result{{Allowed: false, RetryAfter: 50 * time.Second}, {Allowed: false, RetryAfter: 5 * time.Second}}, pb.RateLimitResponse_OVER_LIMIT, 10, 0, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := s.status(rl, tc.limits, tc.results)
			if st.Code != tc.code || st.CurrentLimit.GetRequestsPerUnit() != tc.rpu || st.CurrentLimit.GetName() != "n" ||
				st.LimitRemaining != tc.remaining || st.DurationUntilReset.GetSeconds() != tc.reset {
				t.Fatalf("%v", st)
			}
			if (tc.rpu == 1) != (st.CurrentLimit.GetUnitMultiplier().GetValue() == 10) {
				t.Fatalf("unit_multiplier %v", st.CurrentLimit.GetUnitMultiplier())
			}
		})
	}
}

func TestEscape(t *testing.T) {
	// Distinct entries never compose one principal.
	a, b := escape("a/b=c"), escape("a")+"/"+escape("b")+"="+escape("c")
	if a == b || escape("%2F") == escape("/") {
		t.Fatalf("%q %q", a, b)
	}
}

func TestHeaders(t *testing.T) {
	st := func(code pb.RateLimitResponse_Code, rpu, remaining uint32, reset int64, mult uint32) *descriptor {
		s := &pb.RateLimitResponse_DescriptorStatus{Code: code, LimitRemaining: remaining,
			CurrentLimit:       &pb.RateLimitResponse_RateLimit{RequestsPerUnit: rpu, Unit: pb.RateLimitResponse_RateLimit_MINUTE},
			DurationUntilReset: durationpb.New(time.Duration(reset) * time.Second)}
		if mult > 0 {
			s.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(mult)
		}
		return &descriptor{status: s}
	}
	none := &descriptor{status: &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}}
	ds := []*descriptor{st(pb.RateLimitResponse_OK, 100, 3, 40, 0), none, st(pb.RateLimitResponse_OVER_LIMIT, 10, 0, 20, 5), st(pb.RateLimitResponse_OK, 50, 1, 40, 0)}
	for _, tc := range []struct {
		h    Headers
		want string
	}{
		{NoHeaders, ""},
		// The refusing descriptor, as the reference picks.
		{ReferenceHeaders, "RateLimit-Limit: 10|RateLimit-Remaining: 0|RateLimit-Reset: 20"},
		{DraftHeaders, `RateLimit: "d0";r=3;t=40, "d2";r=0;t=20, "d3";r=1;t=40|RateLimit-Policy: "d0";q=100;w=60, "d2";q=10;w=300, "d3";q=50;w=60`},
	} {
		resp := &pb.RateLimitResponse{}
		(&Service{headers: tc.h}).addHeaders(resp, ds)
		var got []string
		for _, h := range resp.ResponseHeadersToAdd {
			got = append(got, h.Key+": "+h.Value)
		}
		if g := strings.Join(got, "|"); g != tc.want {
			t.Errorf("%d: %s\nwant %s", tc.h, g, tc.want)
		}
	}
	// Without a refusal, the fewest remaining.
	resp := &pb.RateLimitResponse{}
	(&Service{headers: ReferenceHeaders}).addHeaders(resp, []*descriptor{ds[0], ds[3]})
	if resp.ResponseHeadersToAdd[0].Value != "50" {
		t.Errorf("%v", resp.ResponseHeadersToAdd)
	}
}

func TestDynamicMetadata(t *testing.T) {
	md := func(m map[string]any) *structpb.Struct {
		s, err := structpb.NewStruct(m)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ok := &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
	over := &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OVER_LIMIT}
	ds := []*descriptor{
		{rl: &envoyconf.RateLimit{Metadata: md(map[string]any{"svc": map[string]any{"name": "a"}, "tier": "gold"})}, status: ok},
		{rl: &envoyconf.RateLimit{Metadata: md(map[string]any{"svc": map[string]any{"team": "b", "name": "x"}, "tier": "silver"})}, status: ok},
		{rl: &envoyconf.RateLimit{Metadata: md(map[string]any{"refused": true})}, status: over},
		{rl: &envoyconf.RateLimit{Unlimited: true, Metadata: md(map[string]any{"unlimited": true})}, status: ok},
	}
	req := &pb.RateLimitRequest{Domain: "edge", HitsAddend: 3, Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "a", Value: "1"}, {Key: "b", Value: "2"}}, HitsAddend: wrapperspb.UInt64(0)},
	}}
	got := dynamicMetadata(req, ds)
	want := md(map[string]any{
		"domain":      "edge",
		"hitsAddend":  3,
		"descriptors": []any{map[string]any{"entries": []any{"a=1", "b=2"}, "hitsAddend": 0}},
		"metadata":    map[string]any{"svc": map[string]any{"name": "a", "team": "b"}, "tier": "gold"},
	})
	if !proto.Equal(got, want) {
		t.Fatalf("%v\nwant %v", got, want)
	}
	// The configuration's metadata is left as it was.
	if !proto.Equal(ds[0].rl.Metadata, md(map[string]any{"svc": map[string]any{"name": "a"}, "tier": "gold"})) {
		t.Fatalf("the configuration's metadata changed: %v", ds[0].rl.Metadata)
	}
}
