package rls_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/envoyconf/reference"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/rls"
)

// egNode is the node Envoy Gateway's control plane serves the rate limit configuration to.
const egNode = "envoy-ratelimit"

// egConfig is the RateLimitConfig Envoy Gateway generates for a BackendTrafficPolicy with a
// global limit of n an hour per distinct x-user-id on the route first-route of the listener
// first-listener (its translator's "distinct-match" output, the unit an hour here).
func egConfig(n uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{
		Name:   "first-listener",
		Domain: "first-listener",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key:   "first-route",
			Value: "first-route",
			Descriptors: []*rlsconfv3.RateLimitDescriptor{{
				Key:       "rule-0-match-0",
				RateLimit: &rlsconfv3.RateLimitPolicy{RequestsPerUnit: n, Unit: rlsconfv3.RateLimitUnit_HOUR},
			}},
		}},
	}
}

// egRequest is what Envoy sends for that route and user.
func egRequest(user string) *pb.RateLimitRequest {
	return request("first-listener", desc("first-route", "first-route", "rule-0-match-0", user))
}

// waitLimit asks c with fresh users until the route's limit is n, and says how long it took.
func waitLimit(t *testing.T, ask func(*pb.RateLimitRequest) (*pb.RateLimitResponse, error), n uint32) time.Duration {
	t.Helper()
	start := time.Now()
	for i := 0; ; i++ {
		resp, err := ask(egRequest(fmt.Sprintf("probe-%d-%d", n, i)))
		if err == nil && resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() == n {
			return time.Since(start)
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the limit never became %d: %v %v", n, resp, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The reference and rlfn-rls, each an xDS client of the same management server, answer
// Envoy Gateway's configuration the same, before and after it changes; rlfn-rls serves a
// changed configuration soon after it is pushed (the time is logged, not asserted).
func TestXDSSideBySide(t *testing.T) {
	reference.Bin(t)
	b := backends(t)[0]
	x := harness.StartXDS(t, egNode, nil)
	x.Set(t, egConfig(5))
	ref, _ := referenceWithEnv(t, b, "", "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+x.Addr,
		"CONFIG_GRPC_XDS_NODE_ID="+egNode, "FORCE_START_WITHOUT_INITIAL_CONFIG=true")
	askRef := func(req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return ref.ShouldRateLimit(ctx, req)
	}
	ours := newRig(t, b, "domain: placeholder\n", client.Options{}, rls.ServerOptions{}, rls.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- rls.XDS{Server: x.Addr, Node: &corev3.Node{Id: egNode}, DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
			Initial: 50 * time.Millisecond, Max: time.Second}.Run(ctx, ours.svc, nil, nil)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitLimit(t, askRef, 5)
	waitLimit(t, ours.call, 5)
	steps := []step{
		{egRequest("u1"), 7},
		{egRequest("u2"), 1},
		{request("first-listener", desc("first-route", "first-route")), 1},
		{request("first-listener", desc("other-route", "other-route", "rule-0-match-0", "u1")), 1},
		{request("second-listener", desc("first-route", "first-route", "rule-0-match-0", "u1")), 1},
	}
	compare(t, ref, ours, steps)

	x.Set(t, egConfig(2))
	took := waitLimit(t, ours.call, 2)
	t.Logf("rlfn-rls served the pushed configuration %v after it was set", took)
	waitLimit(t, askRef, 2)
	compare(t, ref, ours, []step{{egRequest("u3"), 4}, {egRequest("u1"), 1}})
}

// A configuration that does not load is refused, logged, and the previous one still applies;
// the next good one is taken. A management server that goes away is reconnected to.
func TestXDSBadConfigAndReconnect(t *testing.T) {
	x := harness.StartXDS(t, egNode, nil)
	x.Set(t, egConfig(5))
	svc := rls.NewService(func(string) *client.Limiter { return nil }, nil, rls.Options{})
	var log harness.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = rls.XDS{Server: x.Addr, Node: &corev3.Node{Id: egNode}, DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
			Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond}.Run(ctx, svc, nil, slog.New(slog.NewJSONHandler(&log, nil)))
	}()
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("never %s:\n%s", what, log.String())
			}
		}
	}
	waitFor("a configuration", func() bool { return svc.Config() != nil && svc.Config().HasDomain("first-listener") })
	good := svc.Config()

	bad := egConfig(5)
	bad.Descriptors[0].Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit_UNKNOWN
	x.Set(t, bad)
	waitFor("the bad configuration refused", func() bool { return strings.Contains(log.String(), "does not load") })
	if svc.Config() != good {
		t.Fatal("a configuration that does not load replaced the good one")
	}
	if !strings.Contains(log.String(), "xds:first-listener") {
		t.Errorf("the error does not name the resource:\n%s", log.String())
	}
	second := egConfig(5)
	second.Name, second.Domain = "second-listener", "second-listener"
	x.Set(t, egConfig(5), second)
	waitFor("the next good configuration", func() bool { return svc.Config().HasDomain("second-listener") })

	// The server goes away and comes back on the same address, with a new configuration:
	// the client reconnects and takes it; meanwhile the last one applies.
	x.Stop()
	waitFor("the loss of the server logged", func() bool { return strings.Contains(log.String(), "not reachable") })
	if !svc.Config().HasDomain("second-listener") {
		t.Fatal("the configuration was dropped with the connection")
	}
	third := egConfig(5)
	third.Name, third.Domain = "third-listener", "third-listener"
	x.Set(t, third)
	x.Start(t)
	waitFor("the configuration after reconnecting", func() bool { return svc.Config().HasDomain("third-listener") })
}
