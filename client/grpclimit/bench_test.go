package grpclimit

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/httplimit"
)

var tokenBucket = client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second}

// constant is a Limiter that answers one Result, recording nothing; with step, each refusal
// waits step less than the one before, as a flood's refusals do from one millisecond to the
// next.
type constant struct {
	res  client.Result
	step time.Duration
}

func (c *constant) Allow(context.Context, string, client.Limit) (client.Result, error) {
	if c.step != 0 {
		c.res.RetryAfter -= c.step
		if c.res.RetryAfter <= 0 {
			c.res.RetryAfter = time.Hour
		}
	}
	return c.res, nil
}

// stream is a ServerTransportStream that keeps nothing, as discard does for HTTP.
type stream struct{}

func (stream) Method() string                  { return "/bench.S/M" }
func (stream) SetHeader(metadata.MD) error     { return nil }
func (stream) SendHeader(metadata.MD) error    { return nil }
func (stream) SetTrailer(md metadata.MD) error { return nil }

type discard struct{ h http.Header }

func (d discard) Header() http.Header       { return d.h }
func (discard) Write(p []byte) (int, error) { return len(p), nil }
func (discard) WriteHeader(int)             {}

// BenchmarkDecision is the interceptor's own cost per call beside httplimit's middleware's per
// request, for the same limit, key (the peer's address) and decision, without a server: what
// the transport adds to a decision. Compare with benchstat -col /transport. A refusal's
// status is gRPC's most expensive part: "denied" repeats one wait, as refusals within one
// millisecond do, and shares its status; "denied-each-wait-new" builds one every call.
func BenchmarkDecision(b *testing.B) {
	for _, bb := range []struct {
		name string
		res  client.Result
		step time.Duration
	}{
		{"allowed", client.Result{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: 100 * time.Millisecond}, 0},
		{"denied", client.Result{Limit: 100, RetryAfter: 1500 * time.Millisecond, ResetAfter: 10 * time.Second}, 0},
		// every refusal a wait of its own: what the first refusal of each millisecond costs
		{"denied-each-wait-new", client.Result{Limit: 100, RetryAfter: time.Hour, ResetAfter: 10 * time.Second}, time.Millisecond},
	} {
		b.Run("transport=http/decision="+bb.name, func(b *testing.B) {
			m, err := httplimit.New(&constant{bb.res, bb.step}, httplimit.Options{
				Key:    httplimit.RemoteIP,
				Policy: func(*http.Request) httplimit.Policy { return httplimit.Policy{Name: "api", Limit: tokenBucket} },
			})
			if err != nil {
				b.Fatal(err)
			}
			h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			r := httptest.NewRequest("GET", "/", nil)
			w := discard{http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				h.ServeHTTP(w, r)
			}
		})
		b.Run("transport=grpc/decision="+bb.name, func(b *testing.B) {
			s, err := NewServer(&constant{bb.res, bb.step}, ServerOptions{
				Key:     Peer,
				Default: Policy{Name: "api", Limit: tokenBucket},
			})
			if err != nil {
				b.Fatal(err)
			}
			ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 1234}})
			ctx = grpc.NewContextWithServerTransportStream(ctx, stream{})
			info := &grpc.UnaryServerInfo{FullMethod: "/bench.S/M"}
			handler := func(context.Context, any) (any, error) { return nil, nil }
			interceptor := s.UnaryInterceptor()
			b.ReportAllocs()
			for b.Loop() {
				interceptor(ctx, nil, info, handler)
			}
		})
	}
}
