package client

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"
)

// slotsNode is one node of a fake cluster: it answers CLUSTER SLOTS with slots (0-8191 on
// 10.0.0.1:6379, the rest on 10.0.0.2:6379) and counts the commands it was sent.
type slotsNode struct {
	*mock.Client
	asked atomic.Int32
}

func (n *slotsNode) Do(context.Context, valkey.Completed) valkey.ValkeyResult {
	n.asked.Add(1)
	primary := func(lo, hi int64, host, id string) valkey.ValkeyMessage {
		return mock.ValkeyArray(mock.ValkeyInt64(lo), mock.ValkeyInt64(hi),
			mock.ValkeyArray(mock.ValkeyString(host), mock.ValkeyInt64(6379), mock.ValkeyString(id)))
	}
	return mock.Result(mock.ValkeyArray(primary(0, 8191, "10.0.0.1", "a"), primary(8192, 16383, "10.0.0.2", "b")))
}

type slotsCluster struct {
	*mock.Client
	nodes map[string]valkey.Client
}

func (c *slotsCluster) Nodes() map[string]valkey.Client { return c.nodes }

// A refresh of the slots, which runs when a breaker opens, asks the primaries whose breaker is
// closed first: asking the dead one first dialled it once more per opening (valkey-go dials a
// node per command sent to it), and map order made that one refresh in three.
func TestRefreshAsksLiveNodesFirst(t *testing.T) {
	dead, live := &slotsNode{Client: mock.NewClient(nil)}, &slotsNode{Client: mock.NewClient(nil)}
	vk := &slotsCluster{Client: mock.NewClient(nil, mock.WithSlotCheck()),
		nodes: map[string]valkey.Client{"10.0.0.1:6379": dead, "10.0.0.2:6379": live}}
	l, err := New(vk, Options{})
	if err != nil {
		t.Fatal(err)
	}
	old := l.fetchSlots(nil)
	if old == nil {
		t.Fatal("no slot table")
	}
	b := old.breakers[old.owner[0]]
	for range defaultBreakerFailures {
		b.failure(false, 0)
	}
	if b.current() != open {
		t.Fatalf("breaker of 10.0.0.1:6379 is %v, want open", b.current())
	}
	dead.asked.Store(0)
	for range 30 { // Go's map order is random: every order is tried
		if l.fetchSlots(old) == nil {
			t.Fatal("no slot table")
		}
	}
	if n := dead.asked.Load(); n != 0 {
		t.Errorf("the primary whose breaker is open was asked %d times in 30 refreshes, want 0", n)
	}
}
