package rls

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// ServerOptions configure a Server.
type ServerOptions struct {
	// MaxInFlight bounds the requests decided at once; one more is refused at once with
	// RESOURCE_EXHAUSTED (HTTP 503), rather than queued while the backend stalls until the
	// process runs out of memory. Default (0): 1000.
	MaxInFlight int
	// Check says whether the backend can decide (every primary runs a library release the
	// configuration needs); the server is SERVING only while it returns nil. Default: always.
	Check func(context.Context) error
	// CheckEvery is how often Check runs. Default (0): 5s.
	CheckEvery time.Duration
	// MaxConnectionAge closes a client's connection after this long (with MaxConnectionAge
	// of grace for its requests in flight), so that the connections of long-lived proxies
	// spread over replicas added since. Defaults (0): 24h and 1h, as the reference's
	// GRPC_MAX_CONNECTION_AGE and GRPC_MAX_CONNECTION_AGE_GRACE.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
	// TLS, when set, is the gRPC listener's (see ServerTLS); the HTTP listener stays plain.
	TLS *tls.Config
	// NoJSON leaves POST /json out of the HTTP listener (/healthcheck and /metrics stay): a
	// request to it is answered 404 with NoJSONReason. A gRPC listener that requires client
	// certificates guards nothing while the same decisions are served without one over HTTP.
	NoJSON       bool
	NoJSONReason string
	// MaxRequestBytes bounds one request's encoded bytes: a gRPC message larger is refused by
	// gRPC from its length, before it is read or decoded (RESOURCE_EXHAUSTED, "received message
	// larger than max (N vs. M)"), and a /json body larger with HTTP 413. Decoding is the work
	// the service cannot bound otherwise: 100,000 descriptors fit in 0.7 MB, and gRPC decodes
	// them all before the service can count them. Default (0): DefaultMaxRequestBytes.
	MaxRequestBytes int
	// Metrics is served at /metrics on the HTTP listener when set (a Prometheus handler).
	Metrics http.Handler
	// StatsHandler, when set, sees every gRPC call (grpc.StatsHandler): OpenTelemetry's
	// otelgrpc.NewServerHandler makes a span of each, in the trace of the caller's metadata.
	// It sees a call refused by MaxInFlight or MaxRequestBytes too. Default (nil): none.
	StatsHandler stats.Handler
	Log          *slog.Logger
}

// Server serves a Service: ShouldRateLimit and gRPC health on one listener, and on
// another HTTP: POST /json (the reference's JSON endpoint: a RateLimitRequest in protobuf
// JSON, the response in it, 429 when over the limit; none with NoJSON), /healthcheck and
// /metrics.
type Server struct {
	svc    *Service
	o      ServerOptions
	sem    chan struct{}
	grpc   *grpc.Server
	health *health.Server
	http   *http.Server

	mu      sync.Mutex
	serving bool
	stop    chan struct{}
	once    sync.Once
	checked string // the last check's error, "" for none: a state logged once
}

// ErrNoConfigYet is Check's error before the first configuration has arrived (over xDS):
// NOT_SERVING, and logged as the wait it is, not as a backend failure.
var ErrNoConfigYet = errors.New("no configuration received yet")

// httpReadTimeout bounds the reading of an HTTP request, its body included: ample for
// MaxRequestBytes on any network a rate limit service sits on. A variable for the tests.
var httpReadTimeout = 10 * time.Second

// serviceName is the RLS service's name in gRPC health.
const serviceName = "envoy.service.ratelimit.v3.RateLimitService"

// NewServer returns a Server of svc, not yet serving.
func NewServer(svc *Service, o ServerOptions) *Server {
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 1000
	}
	if o.CheckEvery <= 0 {
		o.CheckEvery = 5 * time.Second
	}
	if o.MaxConnectionAge <= 0 {
		o.MaxConnectionAge = 24 * time.Hour
	}
	if o.MaxConnectionAgeGrace <= 0 {
		o.MaxConnectionAgeGrace = time.Hour
	}
	if o.MaxRequestBytes <= 0 {
		o.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{svc: svc, o: o, sem: make(chan struct{}, o.MaxInFlight), health: health.NewServer(), stop: make(chan struct{})}
	// A request over MaxRequestBytes is refused by gRPC from its length in the message's header:
	// its body is not read into a message nor decoded, and what of it the connection already
	// carried (at most the stream's flow control window) is dropped with the stream, which gRPC
	// resets after the status. That window is fixed at MaxRequestBytes (64 KiB at least, gRPC's
	// floor): gRPC's dynamic one grows on a fast link towards 16 MiB, and a flood of refused
	// requests would leave that much of their bodies in the process. Within MaxRequestBytes,
	// Options' MaxDescriptors and the others bound the work.
	opts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(s.bound), grpc.MaxRecvMsgSize(o.MaxRequestBytes),
		grpc.StaticStreamWindowSize(int32(min(max(o.MaxRequestBytes, 64<<10), 1<<30))),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: o.MaxConnectionAge, MaxConnectionAgeGrace: o.MaxConnectionAgeGrace})}
	if o.TLS != nil {
		opts = append(opts, grpc.Creds(refusalsLogged{credentials.NewTLS(o.TLS), &throttledLog{log: o.Log}}))
	}
	escapes := &throttledLog{log: o.Log}
	opts = append(opts, grpc.ForceServerCodecV2(newEscapingCodec(func() {
		escapes.say(context.Background(), "a request's strings are not valid UTF-8: decided with the invalid bytes escaped as \\xHH")
	})))
	if o.StatsHandler != nil {
		opts = append(opts, grpc.StatsHandler(o.StatsHandler))
	}
	s.grpc = grpc.NewServer(opts...)
	pb.RegisterRateLimitServiceServer(s.grpc, svc)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	// Reflection lets grpcurl, ghz and Postman call the service by hand with no .proto files
	// or protoset: it serves the descriptors already compiled into the binary.
	reflection.Register(s.grpc)
	s.setServing(false)
	mux := http.NewServeMux()
	if o.NoJSON {
		mux.HandleFunc("/json", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, cmp.Or(o.NoJSONReason, "/json is not served"), http.StatusNotFound)
		})
	} else {
		mux.HandleFunc("POST /json", s.serveJSON)
	}
	mux.HandleFunc("GET /healthcheck", s.serveHealth)
	mux.HandleFunc("GET /ready", s.serveReady)
	if o.Metrics != nil {
		mux.Handle("GET /metrics", o.Metrics)
	}
	// A client that sends its request slowly, or keeps its connection idle, must not hold a
	// goroutine for ever: --max-in-flight bounds only the requests read whole.
	s.http = &http.Server{Handler: mux, ReadHeaderTimeout: httpReadTimeout, ReadTimeout: httpReadTimeout, IdleTimeout: 2 * time.Minute}
	return s
}

// refusalsLogged are the gRPC listener's TLS credentials, which say in the log why a
// client's handshake failed (no certificate, one another CA signed, not for
// ServerTLS's clientSAN) and whose it was: gRPC itself says nothing of it. At most one line
// per refusalsEvery, with the count of those not written.
type refusalsLogged struct {
	credentials.TransportCredentials
	refusals *throttledLog
}

func (c refusalsLogged) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	// A connection closed before or during its handshake (a TCP probe, a client that gave
	// up) was refused nothing.
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
		c.refusals.say(context.Background(), "a client's TLS handshake on the gRPC listener was refused",
			slog.String("remote", conn.RemoteAddr().String()), slog.String("err", err.Error()))
	}
	return out, info, err
}

func (c refusalsLogged) Clone() credentials.TransportCredentials {
	return refusalsLogged{c.TransportCredentials.Clone(), c.refusals}
}

// bound refuses a request at once when MaxInFlight are being decided.
func (s *Server) bound(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if info.FullMethod != "/"+serviceName+"/ShouldRateLimit" {
		return handler(ctx, req)
	}
	if !s.enter(ctx) {
		return nil, status.Error(codes.ResourceExhausted, "too many requests in flight")
	}
	defer s.leave(ctx)
	return handler(ctx, req)
}

// enter takes a place among the MaxInFlight requests, or reports there is none, counted as
// an overload. A request that entered calls leave when answered.
func (s *Server) enter(ctx context.Context) bool {
	select {
	case s.sem <- struct{}{}:
	default:
		s.svc.metrics.overload(ctx)
		return false
	}
	s.svc.metrics.flight(ctx, 1)
	return true
}

func (s *Server) leave(ctx context.Context) {
	<-s.sem
	s.svc.metrics.flight(ctx, -1)
}

// DefaultMaxRequestBytes is ServerOptions.MaxRequestBytes's default: an Envoy request is a
// few hundred bytes, and one at every other bound's limit but for its values' bytes (64
// descriptors of 16 entries) a few tens of kilobytes. gRPC's own default is 4 MiB.
const DefaultMaxRequestBytes = 64 << 10

func (s *Server) serveJSON(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(s.o.MaxRequestBytes)))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			// Cut at the bound, the JSON would be refused as truncated: say why instead.
			http.Error(w, fmt.Sprintf("request body larger than %d bytes (--max-request-bytes)", s.o.MaxRequestBytes), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req pb.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, "not a RateLimitRequest in protobuf JSON: "+err.Error(), http.StatusBadRequest)
		return
	}
	if !s.enter(r.Context()) {
		http.Error(w, "too many requests in flight", http.StatusServiceUnavailable)
		return
	}
	resp, err := s.svc.ShouldRateLimit(r.Context(), &req)
	s.leave(r.Context())
	if err != nil {
		code := http.StatusServiceUnavailable
		if status.Code(err) == codes.InvalidArgument {
			code = http.StatusBadRequest
		}
		http.Error(w, status.Convert(err).Message(), code)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	// protojson adds spaces at random (differing between builds, so that no one depends on
	// its output's bytes): compacted, the body is the same from every build, as documented.
	var compact bytes.Buffer
	if err := json.Compact(&compact, out); err == nil {
		out = compact.Bytes()
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	_, _ = w.Write(out)
}

// serveReady answers 200 once the service has a configuration, whatever the backend: the
// readiness of a replica whose fallback decides while the backend is gone (/healthcheck
// would take every replica out of the Service then, and Envoy's failure_mode_deny would
// decide in the fallback's place), but that must not serve before its first configuration
// over xDS (every request would be UNAVAILABLE).
func (s *Server) serveReady(w http.ResponseWriter, _ *http.Request) {
	if s.svc.Config() == nil {
		http.Error(w, "no configuration yet", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "OK")
}

func (s *Server) serveHealth(w http.ResponseWriter, _ *http.Request) {
	if !s.Serving() {
		http.Error(w, "NOT SERVING", http.StatusServiceUnavailable)
		return
	}
	_, _ = io.WriteString(w, "OK\n")
}

// Serving reports whether the server answers SERVING.
func (s *Server) Serving() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.serving
}

func (s *Server) setServing(ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.stop:
		// A check that ends after Shutdown never turns a stopping server SERVING again.
		ok = false
	default:
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	if ok != s.serving {
		s.o.Log.Info("health", "serving", ok)
	}
	s.serving = ok
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(serviceName, st)
}

// Serve serves gRPC on g and HTTP on h (nil: no HTTP) until Shutdown, and checks the backend
// every CheckEvery meanwhile. It returns the first listener's error, nil after Shutdown.
func (s *Server) Serve(g, h net.Listener) error {
	errs := make(chan error, 2)
	go func() { errs <- s.grpc.Serve(g) }()
	if h != nil {
		go func() {
			err := s.http.Serve(h)
			if errors.Is(err, http.ErrServerClosed) {
				err = nil
			}
			errs <- err
		}()
	}
	go s.checkLoop()
	select {
	case err := <-errs:
		return err
	case <-s.stop:
		return nil
	}
}

func (s *Server) checkLoop() {
	t := time.NewTicker(s.o.CheckEvery)
	defer t.Stop()
	for {
		s.check()
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

func (s *Server) check() {
	if s.o.Check == nil {
		s.setServing(true)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.o.CheckEvery)
	defer cancel()
	err := s.o.Check(ctx)
	// Once per state, not once per check: a wait for the first configuration, or a backend
	// down for an hour, is one line (and another when its reason changes).
	state := ""
	if err != nil {
		state = err.Error()
	}
	if state != s.checked {
		s.checked = state
		switch {
		case errors.Is(err, ErrNoConfigYet):
			s.o.Log.Info("waiting for the first configuration: NOT_SERVING until it arrives")
		case err != nil:
			s.o.Log.Warn("the backend cannot decide", "err", err)
		}
	}
	s.setServing(err == nil)
}

// Shutdown stops serving: health turns NOT_SERVING at once (so that load balancers stop
// sending), the requests being decided finish, and ctx bounds the wait, after which the
// remaining ones are cut and ctx's error is returned.
func (s *Server) Shutdown(ctx context.Context) error {
	s.once.Do(func() { close(s.stop) })
	s.health.Shutdown()
	s.mu.Lock()
	s.serving = false
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	err := s.http.Shutdown(ctx)
	select {
	case <-done:
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
		if err == nil {
			err = ctx.Err()
		}
	}
	return err
}
