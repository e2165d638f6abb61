package harness

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"testing"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// XDS is an xDS management server on loopback, go-control-plane's as Envoy Gateway runs it,
// serving RateLimitConfig snapshots to one node: the configuration source of rlfn-rls and
// of the reference under test.
type XDS struct {
	Addr    string
	node    string
	tls     *tls.Config
	cache   cachev3.SnapshotCache
	version int
	stop    func()
}

// StartXDS starts a management server for node, over TLS when cfg is set, stopped when the
// test ends.
func StartXDS(t testing.TB, node string, cfg *tls.Config) *XDS {
	t.Helper()
	x := &XDS{Addr: "127.0.0.1:0", node: node, tls: cfg, cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)}
	x.Start(t)
	t.Cleanup(func() { x.Stop() })
	return x
}

// Start serves again on the same address after Stop, with the same snapshots.
func (x *XDS) Start(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var opts []grpc.ServerOption
	if x.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(x.tls)))
	}
	g := grpc.NewServer(opts...)
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(ctx, x.cache, nil))
	l, err := net.Listen("tcp", x.Addr)
	if err != nil {
		t.Fatal(err)
	}
	x.Addr = l.Addr().String()
	go func() { _ = g.Serve(l) }()
	x.stop = func() { cancel(); g.Stop() }
}

// Stop closes the server and its streams.
func (x *XDS) Stop() { x.stop() }

// Set serves configs as the whole configuration, in a new version.
func (x *XDS) Set(t testing.TB, configs ...*rlsconfv3.RateLimitConfig) {
	t.Helper()
	x.version++
	rs := make([]types.Resource, 0, len(configs))
	for _, c := range configs {
		rs = append(rs, c)
	}
	snap, err := cachev3.NewSnapshot(fmt.Sprint(x.version), map[resource.Type][]types.Resource{resource.RateLimitConfigType: rs})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.cache.SetSnapshot(context.Background(), x.node, snap); err != nil {
		t.Fatal(err)
	}
}
