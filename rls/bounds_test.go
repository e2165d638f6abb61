package rls_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/rls"
)

const boundsConfig = `
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000}
`

// users is a request of n descriptors, one user each, from first.
func users(first, n int) *pb.RateLimitRequest {
	ds := make([]*rlv3.RateLimitDescriptor, n)
	for i := range ds {
		ds[i] = desc("user", fmt.Sprint("u", first+i))
	}
	return request("edge", ds...)
}

// load sends small requests from callers until stop is closed, and returns how many were
// sent and the errors and refusals they met.
func load(r *rig, callers int, stop <-chan struct{}) func() (sent int, failed []string) {
	var mu sync.Mutex
	var sent int
	var failed []string
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := r.call(users(1_000_000+c*1000+i%1000, 2))
				mu.Lock()
				sent++
				switch {
				case err != nil:
					failed = append(failed, err.Error())
				case resp.OverallCode != pb.RateLimitResponse_OK:
					failed = append(failed, resp.String())
				}
				mu.Unlock()
			}
		})
	}
	return func() (int, []string) {
		wg.Wait()
		return sent, failed
	}
}

// Requests of 100,000 descriptors, beside callers under steady load: refused at once by gRPC
// for their bytes (RESOURCE_EXHAUSTED), and one of 5,000 with a short INVALID_ARGUMENT naming
// the bound, logged once; the others' requests all decided by
// the server (the backend's fallback is return_error: any failure would be an error), the
// breaker never opening. Just under the bounds, a request is decided. Past each other bound,
// refused alike.
func TestOversizedRequest(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		reader := sdkmetric.NewManualReader()
		var logs harness.Buffer
		// A deadline of a second: the machines that run the tests are shared, and a call of
		// the load that misses 100ms there says nothing about the big request.
		r := newRig(t, b, boundsConfig, client.Options{Deadline: time.Second, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
			MaxRules: rls.RulesFor(rls.DefaultMaxDescriptors)}, rls.ServerOptions{},
			rls.Options{Log: slog.New(slog.NewJSONHandler(&logs, nil))})
		// The connections to every node are made before the load starts: a cluster's first
		// calls pay for them.
		for i := 0; ; i++ {
			if _, err := r.call(users(2_000_000, rls.DefaultMaxDescriptors)); err == nil {
				break
			} else if i == 100 {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // a breaker the first calls opened probes again
		}
		before := sums(t, reader)
		stop := make(chan struct{})
		wait := load(r, 4, stop)

		// 100,000 descriptors are 0.7 MB of empty entries, 1.8 MB of users: over
		// DefaultMaxRequestBytes, refused by gRPC from the message's length, before it is read
		// or decoded, the message naming both sizes.
		tiny := func(n int) *pb.RateLimitRequest {
			ds := make([]*rlv3.RateLimitDescriptor, n)
			for i := range ds {
				ds[i] = desc("k", "")
			}
			return request("edge", ds...)
		}
		for _, req := range []*pb.RateLimitRequest{users(0, 100_000), tiny(100_000)} {
			_, err := r.call(req)
			if msg := status.Convert(err).Message(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(msg, "larger than max") ||
				!strings.Contains(msg, fmt.Sprintf("(%d vs. %d)", proto.Size(req), rls.DefaultMaxRequestBytes)) || len(msg) > 100 {
				t.Fatalf("100,000 descriptors: %v", err)
			}
		}
		// 5,000 descriptors of one empty entry each are 35 KB: within the bytes, decoded, and
		// refused for their number before any is matched.
		for range 3 {
			_, err := r.call(tiny(5_000))
			msg := status.Convert(err).Message()
			if status.Code(err) != codes.InvalidArgument || msg != "rate limit request has 5000 descriptors, more than 64 (--max-descriptors)" {
				t.Fatalf("5,000 descriptors: %v", err)
			}
		}
		long := strings.Repeat("x", rls.DefaultMaxValueBytes+1)
		for _, tt := range []struct {
			req  *pb.RateLimitRequest
			want string
		}{
			{request("edge", desc(strings.Split(strings.Repeat("k,v,", 17), ",")[:34]...)), "descriptor 0 has 17 entries, more than 16 (--max-entries)"},
			{request("edge", desc("user", "u"), desc("user", long)), "descriptor 1 entry 0 has a key or value of 4097 bytes, more than 4096 (--max-value-bytes)"},
			{request(long, desc("user", "u")), "rate limit domain of 4097 bytes, more than 4096 (--max-value-bytes)"},
		} {
			_, err := r.call(tt.req)
			if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != tt.want {
				t.Errorf("got %v, want %q", err, tt.want)
			}
		}
		// Just under the bound: decided, every descriptor taking its unit.
		resp, err := r.call(users(0, rls.DefaultMaxDescriptors))
		if err != nil || resp.OverallCode != pb.RateLimitResponse_OK || len(resp.Statuses) != rls.DefaultMaxDescriptors {
			t.Fatalf("64 descriptors: %v %v", resp, err)
		}
		for i, st := range resp.Statuses {
			if st.LimitRemaining != 999_999 {
				t.Fatalf("descriptor %d: %v", i, st)
			}
		}
		close(stop)
		sent, failed := wait()
		if len(failed) > 0 {
			t.Errorf("%d of %d small requests failed, the first: %s", len(failed), sent, failed[0])
		}
		if sent == 0 {
			t.Error("no load")
		}
		for name, n := range sums(t, reader) {
			if (name == "rlfn.client.breaker.transitions" || name == "rlfn.client.errors") && n != before[name] {
				t.Errorf("%s: %d since the load started", name, n-before[name])
			}
		}
		lines := strings.Count(logs.String(), "request refused")
		if lines != 1 || !strings.Contains(logs.String(), "--max-descriptors") {
			t.Errorf("log, want one line of the refusals:\n%s", logs.String())
		}
		t.Logf("%d small requests decided beside the refusals", sent)
	})
}

// sums are the client's counters in reader, by name.
func sums(t testing.TB, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, p := range d.DataPoints {
					out[m.Name] += p.Value
				}
			}
		}
	}
	return out
}
