package harness_test

import (
	"context"
	"testing"
	"time"

	"github.com/rlfn/rlfn/internal/harness"
	"github.com/valkey-io/valkey-go"
)

func TestStandalone(t *testing.T) {
	for name, start := range map[string]func(testing.TB, ...string) *harness.Server{
		"valkey": harness.StartValkey,
		"redis":  harness.StartRedis,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := start(t, "--maxmemory", "64mb")
			c := s.Client(t)
			ping(t, c, s)
			if role := role(t, c, s); role[0] != "master" {
				t.Errorf("%s: ROLE %v, want master", s.Addr, role)
			}
			maxmem, err := c.Do(t.Context(), c.B().ConfigGet().Parameter("maxmemory").Build()).AsStrMap()
			if err != nil || maxmem["maxmemory"] != "67108864" {
				t.Errorf("%s: extra args not applied: maxmemory = %v, %v", s.Addr, maxmem, err)
			}

			// Stop kills the server; Start brings it back on the same port.
			if err := s.Stop(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := c.Do(t.Context(), c.B().Ping().Build()).Error(); err == nil {
				t.Errorf("%s: PING succeeded on a stopped server", s.Addr)
			}
			if err := s.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			ping(t, c, s)
		})
	}
}

func TestCluster(t *testing.T) {
	cl := harness.StartCluster(t, 3, 1)
	if len(cl.Primaries) != 3 || len(cl.Replicas) != 3 || len(cl.Addrs()) != 6 {
		t.Fatalf("got %d primaries, %d replicas, %d addrs", len(cl.Primaries), len(cl.Replicas), len(cl.Addrs()))
	}
	total := 0
	for _, p := range cl.Primaries {
		c := p.Client(t)
		ping(t, c, p)
		if r := role(t, c, p); r[0] != "master" {
			t.Errorf("primary %s: ROLE %v", p.Addr, r)
		}
		n, err := p.Slots(t.Context())
		if err != nil || n == 0 {
			t.Errorf("primary %s owns %d slots, %v", p.Addr, n, err)
		}
		total += n
		reps := cl.ReplicasOf(p)
		if len(reps) != 1 {
			t.Fatalf("primary %s has %d replicas, want 1", p.Addr, len(reps))
		}
		for _, r := range reps {
			rc := r.Client(t)
			ping(t, rc, r)
			// slave, primary ip, primary port, link state, offset
			got := role(t, rc, r)
			if got[0] != "slave" || got[2] != p.Port || got[3] != "connected" {
				t.Errorf("replica %s: ROLE %v, want slave of port %d, connected", r.Addr, got, p.Port)
			}
		}
	}
	if total != 16384 {
		t.Errorf("primaries own %d slots, want 16384", total)
	}

	// Routed clients: writes go to primaries, reads (with sendToReplicas)
	// may be served by replicas once replication catches up.
	c := cl.Client(t, false)
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		if err := c.Do(t.Context(), c.B().Set().Key(k).Value(k).Build()).Error(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	rc := cl.Client(t, true)
	deadline := time.Now().Add(5 * time.Second)
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		for {
			v, err := rc.Do(t.Context(), rc.B().Get().Key(k).Build()).ToString()
			if err == nil && v == k {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s via replicas: %q, %v", k, v, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// A replica killed and restarted rejoins with its node ID.
	r := cl.Replicas[0]
	if err := r.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := cl.Wait(ctx); err != nil {
		t.Fatal(err)
	}

	// AddPrimary: a primary the cluster knows, owning no slots.
	before := cl.Replicas[0]
	np := cl.AddPrimary(t)
	if cl.Replicas[0] != before {
		t.Error("AddPrimary changed Replicas")
	}
	if len(cl.Primaries) != 4 || cl.Primaries[3] != np || len(cl.ReplicasOf(np)) != 0 {
		t.Errorf("AddPrimary not reflected: %d primaries", len(cl.Primaries))
	}
	nc := np.Client(t)
	ping(t, nc, np)
	if r := role(t, nc, np); r[0] != "master" {
		t.Errorf("added node %s: ROLE %v", np.Addr, r)
	}
	if n, err := np.Slots(t.Context()); err != nil || n != 0 {
		t.Errorf("added primary owns %d slots (%v), want 0", n, err)
	}
	for _, s := range cl.Nodes() {
		sc := s.Client(t)
		shards, err := sc.Do(t.Context(), sc.B().ClusterShards().Build()).ToArray()
		if err != nil || len(shards) != 4 {
			t.Errorf("%s: CLUSTER SHARDS lists %d shards (%v), want 4", s.Addr, len(shards), err)
		}
	}
}

func ping(t *testing.T, c valkey.Client, s *harness.Server) {
	t.Helper()
	if v, err := c.Do(t.Context(), c.B().Ping().Build()).ToString(); err != nil || v != "PONG" {
		t.Fatalf("%s: PING = %q, %v", s.Addr, v, err)
	}
}

// role returns ROLE's reply with strings and integers as Go values.
func role(t *testing.T, c valkey.Client, s *harness.Server) []any {
	t.Helper()
	msgs, err := c.Do(t.Context(), c.B().Role().Build()).ToArray()
	if err != nil || len(msgs) == 0 {
		t.Fatalf("%s: ROLE: %v", s.Addr, err)
	}
	var out []any
	for _, m := range msgs {
		if v, err := m.AsInt64(); err == nil {
			out = append(out, int(v))
		} else if v, err := m.ToString(); err == nil {
			out = append(out, v)
		} else {
			out = append(out, nil)
		}
	}
	return out
}

// TestClusterFailover kills a primary, waits for its replica to take over,
// and brings the old primary back as a replica.
func TestClusterFailover(t *testing.T) {
	cl := harness.StartCluster(t, 3, 1)
	p := cl.Primaries[0]
	r := cl.ReplicasOf(p)[0]
	if err := p.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	rc := r.Client(t)
	for role(t, rc, r)[0] != "master" {
		if time.Since(began) > 30*time.Second {
			t.Fatalf("replica %s not promoted after 30s", r.Addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("replica promoted after %s", time.Since(began).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := cl.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	c := cl.Client(t, false)
	if err := c.Do(t.Context(), c.B().Set().Key("k").Value("v").Build()).Error(); err != nil {
		t.Fatalf("SET after failover: %v", err)
	}

	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := cl.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if got := role(t, p.Client(t), p); got[0] != "slave" || got[2] != r.Port {
		t.Errorf("old primary %s: ROLE %v, want replica of %d", p.Addr, got, r.Port)
	}
}
