package rls_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/valkey-io/valkey-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/envoyconf/reference"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/rls"
)

// backend is one deployment the service is tested on.
type backend struct {
	name  string
	vk    valkey.Client
	addrs []string // every primary: one for a standalone server
}

// env holds the servers every test shares: started on first use, stopped by TestMain.
var env struct {
	once     sync.Once
	err      error
	backends []*backend
	closers  []func()
}

func TestMain(m *testing.M) {
	code := m.Run()
	reference.Remove()
	for i := len(env.closers) - 1; i >= 0; i-- {
		env.closers[i]()
	}
	os.Exit(code)
}

func backends(t testing.TB) []*backend {
	t.Helper()
	env.once.Do(func() { env.err = startEnv() })
	if env.err != nil {
		harness.Unavailable(t, "test servers", env.err)
	}
	return env.backends
}

func forEachBackend(t *testing.T, fn func(t *testing.T, b *backend)) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) { fn(t, b) })
	}
}

func startEnv() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, s := range []struct {
		name  string
		start func(context.Context, ...string) (*harness.Server, error)
	}{
		{"valkey8", harness.NewValkey},
		{"redis7.0", harness.NewRedis},
	} {
		srv, err := s.start(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		env.closers = append(env.closers, func() { _ = srv.Terminate(context.Background()) })
		vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
		if err != nil {
			return err
		}
		env.closers = append(env.closers, vk.Close)
		if err := loadLibrary(ctx, vk); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		env.backends = append(env.backends, &backend{name: s.name, vk: vk, addrs: []string{srv.Addr}})
	}
	cl, err := harness.NewCluster(ctx, 3, 0)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	env.closers = append(env.closers, func() { _ = cl.Terminate(context.Background()) })
	for _, p := range cl.Primaries {
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{p.Addr}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			return err
		}
		err = loadLibrary(ctx, c)
		c.Close()
		if err != nil {
			return fmt.Errorf("cluster %s: %w", p.Addr, err)
		}
	}
	// The service is given one node, as its --url is: valkey-go finds the others.
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: cl.Addrs()[:1], DisableCache: true})
	if err != nil {
		return err
	}
	env.closers = append(env.closers, vk.Close)
	env.backends = append(env.backends, &backend{name: "cluster", vk: vk, addrs: cl.Addrs()})
	return nil
}

func loadLibrary(ctx context.Context, c valkey.Client) error {
	return c.Do(ctx, c.B().FunctionLoad().Replace().FunctionCode(functions.Source).Build()).Error()
}

// rig is one service under test: its server on loopback and a gRPC client built from Envoy's
// generated types.
type rig struct {
	svc    *rls.Service
	srv    *rls.Server
	rls    pb.RateLimitServiceClient
	health healthpb.HealthClient
	http   string // base URL of the HTTP listener
	dir    string // the configuration's directory
}

var testID struct {
	sync.Mutex
	n int
}

// newRig serves config (YAML) from a directory of its own, deciding on b. Every rig has its
// own key prefix, so that tests never share counters.
func newRig(t testing.TB, b *backend, config string, o client.Options, so rls.ServerOptions, svo rls.Options) *rig {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	files := rls.Files{Paths: []string{dir}}
	cfg, err := files.Load()
	if err != nil {
		t.Fatal(err)
	}
	testID.Lock()
	testID.n++
	id := testID.n
	testID.Unlock()
	if o.Prefix == "" {
		o.Prefix = fmt.Sprintf("rlstest:%d:%d:", time.Now().UnixNano(), id)
	}
	if o.Fallback == client.LocalFallback {
		o.Fallback = client.ReturnError
	}
	lim, err := client.New(b.vk, o)
	if err != nil {
		t.Fatal(err)
	}
	svc := rls.NewService(func(string) *client.Limiter { return lim }, cfg, svo)
	if so.Check == nil {
		so.Check = func(ctx context.Context) error { return lim.CheckVersion(ctx, svc.Config().Needs()) }
	}
	if so.CheckEvery == 0 {
		so.CheckEvery = 100 * time.Millisecond
	}
	srv := rls.NewServer(svc, so)
	g, h := serve(t, srv)
	conn, err := grpc.NewClient(g.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// The tests count minute windows: a sequence must not straddle two.
	awayFromMinuteEnd()
	return &rig{svc: svc, srv: srv, rls: pb.NewRateLimitServiceClient(conn), health: healthpb.NewHealthClient(conn), http: "http://" + h.Addr().String(), dir: dir}
}

// serve serves srv on loopback until the test ends, and returns its gRPC and HTTP listeners.
func serve(t testing.TB, srv *rls.Server) (g, h net.Listener) {
	t.Helper()
	g, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(g, h) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return g, h
}

// ask sends one request and fails the test on a gRPC error.
func (r *rig) ask(t testing.TB, req *pb.RateLimitRequest) *pb.RateLimitResponse {
	t.Helper()
	resp, err := r.call(req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

func (r *rig) call(req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return r.rls.ShouldRateLimit(ctx, req)
}

// desc is a descriptor of key/value pairs.
func desc(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// hits sets a descriptor's own hits_addend.
func hits(d *rlv3.RateLimitDescriptor, n uint64) *rlv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func request(domain string, ds ...*rlv3.RateLimitDescriptor) *pb.RateLimitRequest {
	return &pb.RateLimitRequest{Domain: domain, Descriptors: ds}
}
