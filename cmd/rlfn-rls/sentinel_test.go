package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/internal/serverurl"
)

// rlfn-rls given a Sentinel's URL decides on the primary the Sentinel names, and follows a
// failover under load: decisions resume on the new primary, and no request is ever answered
// OK without its limit (a failed one is a gRPC error, for Envoy's failure_mode_deny). On
// Valkey 8 and on Redis 7.0 (each with its own Sentinel), and on Redis 7.0 with a password
// (the primary's in the URL, as REDIS_AUTH gives it, the Sentinel's auth-pass for it).
func TestSentinelFailover(t *testing.T) {
	for _, tc := range []struct {
		name     string
		start    func(testing.TB, ...string) *harness.Server
		password string
	}{
		{"valkey8", harness.StartValkey, ""},
		{"redis7.0", harness.StartRedis, ""},
		{"redis7.0-password", harness.StartRedis, "s3cret"},
	} {
		t.Run(tc.name, func(t *testing.T) { sentinelFailover(t, tc.start, tc.password) })
	}
}

func sentinelFailover(t *testing.T, start func(testing.TB, ...string) *harness.Server, password string) {
	primary := start(t)
	replica := start(t, "--replicaof", "127.0.0.1", fmt.Sprint(primary.Port))
	pc := primary.Client(t)
	ctx := context.Background()
	if err := pc.Do(ctx, pc.B().FunctionLoad().Replace().FunctionCode(functions.Source).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	rc := replica.Client(t)
	// The replica has the library (replicated) before it can be promoted.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		info, _ := rc.Do(ctx, rc.B().Info().Section("replication").Build()).ToString()
		list, _ := rc.Do(ctx, rc.B().FunctionList().Build()).ToArray()
		if strings.Contains(info, "master_link_status:up") && len(list) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica never synced: %s", info)
		}
	}
	sentinel := harness.StartSentinel(t, primary, "mymaster")
	sc := sentinel.Client(t)
	url := fmt.Sprintf("redis://%s?master_set=mymaster", sentinel.Addr)
	if password != "" {
		// Set once every connection the test holds is made (the harness connects without a
		// password): the replicas' masterauth first (the old primary is one after the
		// failover), then the Sentinel's, then the servers'.
		for _, c := range []valkey.Client{pc, rc} {
			if err := c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("masterauth", password).Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
		if err := sc.Do(ctx, sc.B().Arbitrary("SENTINEL", "SET", "mymaster", "auth-pass", password).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		for _, c := range []valkey.Client{pc, rc} {
			if err := c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("requirepass", password).Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
		url = fmt.Sprintf("redis://:%s@%s?master_set=mymaster", password, sentinel.Addr)
		// The Sentinel's failover kills the servers' client connections: the test's own,
		// reconnecting, needs the password too.
		var err error
		if rc, err = valkey.NewClient(valkey.ClientOption{InitAddress: []string{replica.Addr}, Password: password, ForceSingleClient: true, DisableCache: true}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rc.Close)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "s.yaml"), []byte(fmt.Sprintf(policyConfig, "s")), 0o644); err != nil {
		t.Fatal(err)
	}
	if password != "" {
		// Without it, the primary refuses rlfn-rls: the password is what lets it decide.
		var out bytes.Buffer
		noPass := fmt.Sprintf("redis://%s?master_set=mymaster", sentinel.Addr)
		if code := run([]string{"rlfn-rls", "--url", noPass, "--config", dir, "--grpc", "127.0.0.1:0", "--http", ""}, &out); code != 1 || !strings.Contains(out.String(), "NOAUTH") {
			t.Fatalf("without the password: exit %d, %s", code, out.String())
		}
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	a := startApp(t, actx, "--url", url, "--config", dir)

	// Load: one caller, a fresh user each request, until stopped.
	var mu sync.Mutex
	var ok, failed, unlimited int
	var lastOK time.Time
	var longestGap time.Duration // between two decided requests
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 200000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
			resp, err := a.rls.ShouldRateLimit(rctx, &pb.RateLimitRequest{Domain: "s", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: fmt.Sprint("u", i)}}}}})
			rcancel()
			mu.Lock()
			switch {
			case err != nil:
				failed++
			case resp.Statuses[0].CurrentLimit == nil:
				unlimited++
			default:
				ok++
				if !lastOK.IsZero() {
					longestGap = max(longestGap, time.Since(lastOK))
				}
				lastOK = time.Now()
			}
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	time.Sleep(500 * time.Millisecond)
	// The Sentinel learns of the replica from the primary (its INFO, every 10 s at first).
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		rs, _ := sc.Do(ctx, sc.B().Arbitrary("SENTINEL", "REPLICAS", "mymaster").Build()).ToArray()
		if len(rs) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Sentinel never saw the replica")
		}
	}
	if err := sc.Do(ctx, sc.B().Arbitrary("SENTINEL", "FAILOVER", "mymaster").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	failover := time.Now()
	// The Sentinel names the replica; the CLI's resolution (serverurl.Primary) follows it.
	opt, err := serverurl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		p, err := serverurl.Primary(ctx, opt)
		if err == nil && p.InitAddress[0] == replica.Addr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Sentinel never named the replica: %v %v", p.InitAddress, err)
		}
	}
	// Decisions resume on the new primary.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		mu.Lock()
		resumed := lastOK.After(time.Now().Add(-100*time.Millisecond)) && lastOK.After(failover)
		mu.Unlock()
		if resumed {
			info, _ := rc.Do(ctx, rc.B().Info().Section("replication").Build()).ToString()
			if strings.Contains(info, "role:master") {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("decisions never resumed after the failover\n%s", a.stderr.String())
		}
	}
	close(stop)
	<-done
	mu.Lock()
	defer mu.Unlock()
	t.Logf("failover, %s on %s: %d decided, %d gRPC errors, %d unlimited; longest time without a decision %v", t.Name(), primary.Image, ok, failed, unlimited, longestGap)
	if unlimited > 0 {
		t.Errorf("%d requests answered OK without their limit", unlimited)
	}
	// The new primary decided: the last users' counters are on it.
	n, err := rc.Do(ctx, rc.B().Dbsize().Build()).AsInt64()
	if err != nil || n == 0 {
		t.Errorf("the new primary holds %d keys (%v)", n, err)
	}
}
