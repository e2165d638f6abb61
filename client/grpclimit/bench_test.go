package grpclimit

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/httplimit"
)

var tokenBucket = client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second}

// constant is a Limiter that answers one Result, recording nothing; with step, each refusal
// waits step less than the one before, as a flood's refusals do from one millisecond to the
// next; with waits, the refusals' waits go round that many milliseconds, as those of a
// token bucket of 10 a second refusing many principals do (100).
type constant struct {
	res   client.Result
	step  time.Duration
	waits int
	n     int
}

func (c *constant) Allow(context.Context, string, client.Limit) (client.Result, error) {
	switch {
	case c.step != 0:
		c.res.RetryAfter -= c.step
		if c.res.RetryAfter <= 0 {
			c.res.RetryAfter = time.Hour
		}
	case c.waits != 0:
		c.n++
		c.res.RetryAfter = time.Duration(1+c.n%c.waits) * time.Millisecond
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
// the transport adds to a decision. Compare with benchstat -col /transport.
//
// What each side includes: the Key (the gRPC side formats the peer's address on each call,
// where net/http formats RemoteAddr once per connection), the decision, the quota values, and
// what the transport's API asks to carry them: the middleware writes into the header map that
// net/http allocates for every response (reused here), the interceptor allocates the
// metadata.MD that grpc.SetHeader takes (400 B in 2 allocations; gRPC then copies it, which is
// not counted). A refusal is, for HTTP, its 429 written (the body into a discarding writer),
// for gRPC, its status error built (what gRPC does with it after, marshalling it into a
// trailer, is not counted; BenchmarkServer counts everything).
//
// A refusal's status is gRPC's most expensive part: "denied" repeats one wait, as refusals
// within one millisecond do; "denied-100-waits" goes round 100 waits, as a token bucket of
// 10 a second refusing many principals does; both share their statuses. "denied-each-wait-new"
// builds one every call: the floor, 9 of whose allocations are gRPC's copy of the status
// (status.FromProto clones it).
func BenchmarkDecision(b *testing.B) {
	for _, bb := range []struct {
		name  string
		res   client.Result
		step  time.Duration
		waits int
	}{
		{"allowed", client.Result{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: 100 * time.Millisecond}, 0, 0},
		{"denied", client.Result{Limit: 100, RetryAfter: 1500 * time.Millisecond, ResetAfter: 10 * time.Second}, 0, 0},
		{"denied-100-waits", client.Result{Limit: 100, ResetAfter: 10 * time.Second}, 0, 100},
		// every refusal a wait of its own: what the first refusal of each millisecond costs
		{"denied-each-wait-new", client.Result{Limit: 100, RetryAfter: time.Hour, ResetAfter: 10 * time.Second}, time.Millisecond, 0},
	} {
		b.Run("transport=http/decision="+bb.name, func(b *testing.B) {
			m, err := httplimit.New(&constant{res: bb.res, step: bb.step, waits: bb.waits}, httplimit.Options{
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
			s, err := NewServer(&constant{res: bb.res, step: bb.step, waits: bb.waits}, ServerOptions{
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

// BenchmarkServer is a whole call through a real server and client, for context: a gRPC
// health check over bufconn beside an HTTP GET over the same in-memory connection, client and
// server CPU both, with the limiter of BenchmarkDecision. "none" is the call without a limit:
// what limiting adds to a call is a decision's figure less none's. A refusal is what the
// client gets: for gRPC, the status with its details, which the server marshals into the
// trailer and the client decodes.
func BenchmarkServer(b *testing.B) {
	for _, bb := range []struct {
		name string
		res  *client.Result // nil: not limited
		step time.Duration
	}{
		{"none", nil, 0},
		{"allowed", &client.Result{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: 100 * time.Millisecond}, 0},
		{"denied", &client.Result{Limit: 100, RetryAfter: 1500 * time.Millisecond, ResetAfter: 10 * time.Second}, 0},
		{"denied-each-wait-new", &client.Result{Limit: 100, RetryAfter: time.Hour, ResetAfter: 10 * time.Second}, time.Millisecond},
	} {
		b.Run("transport=http/decision="+bb.name, func(b *testing.B) {
			var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) })
			if bb.res != nil {
				m, err := httplimit.New(&constant{res: *bb.res, step: bb.step}, httplimit.Options{
					// bufconn's address is no host:port: the whole of it, on either side
					Key:    func(r *http.Request) (string, error) { return r.RemoteAddr, nil },
					Policy: func(*http.Request) httplimit.Policy { return httplimit.Policy{Name: "api", Limit: tokenBucket} },
				})
				if err != nil {
					b.Fatal(err)
				}
				h = m.Handler(h)
			}
			lis := bufconn.Listen(1 << 16)
			srv := &http.Server{Handler: h}
			go srv.Serve(lis)
			defer srv.Close()
			hc := &http.Client{Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return lis.DialContext(ctx) }}}
			defer hc.CloseIdleConnections()
			want := http.StatusOK
			if bb.res != nil && !bb.res.Allowed {
				want = http.StatusTooManyRequests
			}
			b.ReportAllocs()
			for b.Loop() {
				resp, err := hc.Get("http://bench/")
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					b.Fatalf("status %d, want %d", resp.StatusCode, want)
				}
			}
		})
		b.Run("transport=grpc/decision="+bb.name, func(b *testing.B) {
			var opts []grpc.ServerOption
			if bb.res != nil {
				s, err := NewServer(&constant{res: *bb.res, step: bb.step}, ServerOptions{
					Key: func(ctx context.Context, _ string) (string, error) {
						p, _ := peer.FromContext(ctx)
						return p.Addr.String(), nil
					},
					Default: Policy{Name: "api", Limit: tokenBucket},
				})
				if err != nil {
					b.Fatal(err)
				}
				opts = append(opts, grpc.UnaryInterceptor(s.UnaryInterceptor()))
			}
			lis := bufconn.Listen(1 << 16)
			srv := grpc.NewServer(opts...)
			healthpb.RegisterHealthServer(srv, health.NewServer())
			go srv.Serve(lis)
			defer srv.Stop()
			conn, err := grpc.NewClient("passthrough:///bench",
				grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
				grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			hc := healthpb.NewHealthClient(conn)
			want := codes.OK
			if bb.res != nil && !bb.res.Allowed {
				want = codes.ResourceExhausted
			}
			ctx := context.Background()
			req := &healthpb.HealthCheckRequest{}
			b.ReportAllocs()
			for b.Loop() {
				_, err := hc.Check(ctx, req)
				if status.Code(err) != want {
					b.Fatalf("%v, want %v", err, want)
				}
			}
		})
	}
}
