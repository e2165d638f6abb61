package integration_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/internal/override"
)

// TestOverrideReplicaReads: a service whose client sends reads to replicas (SendToReplicas,
// as README's example) gets every change to the store, twice in a row: valkey-go sends a
// cached read as a transaction (MULTI, PTTL, HGET, EXEC), which goes to the primary, so
// the store's version is read and tracked where it is written (the test shows the replica
// runs none of it).
func TestOverrideReplicaReads(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		opt := valkey.ClientOption{SendToReplicas: func(cmd valkey.Completed) bool { return cmd.IsReadOnly() }}
		for addr := range tg.c.Nodes() {
			opt.InitAddress = append(opt.InitAddress, addr)
		}
		slices.Sort(opt.InitAddress)
		if tg.name != "cluster" {
			opt.InitAddress = []string{addrOf(t, tg.primary)}
			opt.Standalone.ReplicaAddress = []string{tg.replicaFor(t, "").addr}
		}
		vk, err := valkey.NewClient(opt)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(vk.Close)
		prefix := keyFor(t) + ":"
		lim := harness.NewLimiter(t, vk, client.Options{Prefix: prefix, Overrides: true, Fallback: client.ReturnError, Deadline: slowDeadline})
		store := override.NewStore(tg.c, prefix)
		limit := client.Limit(client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour})
		var before int64
		if tg.name != "cluster" {
			before = commandCounts(t, tg.replicaFor(t, "").c)["hget"]
		}
		stop := backgroundLoad(lim, "bg:", limit)
		defer stop()
		for i, capacity := range []int64{100, 200} {
			o := tbOverride("r:1", capacity)
			ch := override.Change{Op: override.Add, New: &o}
			if i > 0 {
				ch.Op = override.Update
			}
			if _, err := store.Apply(ctx5s(t), []override.Change{ch}, nil); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				res, err := lim.Peek(context.Background(), "r:1", limit)
				if err == nil && res.Override != nil && res.Override.Limit.Quota().Limit == capacity {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("change %d (capacity %d) not seen through the replica in 5s: %+v, %v", i, capacity, res, err)
				}
				time.Sleep(time.Millisecond)
			}
		}
		if tg.name != "cluster" {
			if n := commandCounts(t, tg.replicaFor(t, "").c)["hget"] - before; n != 0 {
				t.Errorf("the replica ran %d HGET: the cached reads went there", n)
			}
		}
	})
}

// addrOf is the address of a single node's client.
func addrOf(t testing.TB, c valkey.Client) string {
	t.Helper()
	for addr := range c.Nodes() {
		return addr
	}
	t.Fatal("a client without a node")
	return ""
}
