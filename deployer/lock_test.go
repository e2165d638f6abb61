package deployer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

func TestKeySlot(t *testing.T) {
	tests := []struct {
		give string
		want int
	}{
		{"foo", 12182},
		{"bar", 5061},
		{"123456789", 12739}, // CRC16/XMODEM check value 0x31C3
		{"{bar}foo", 5061},
		{"foo{bar}{zap}", 5061},
		{"foo{}{bar}", keySlot("foo{}{bar}")}, // empty tag: the whole key
		{"{user1000}.following", keySlot("user1000")},
	}
	for _, tt := range tests {
		if got := keySlot(tt.give); got != tt.want {
			t.Errorf("keySlot(%q) = %d, want %d", tt.give, got, tt.want)
		}
	}
	if keySlot("foo{}{bar}") == keySlot("bar") {
		t.Error(`"foo{}{bar}" hashed on "bar": an empty tag must hash the whole key`)
	}
}

func TestSlotOwner(t *testing.T) {
	nodes := "" +
		"a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460\n" +
		"a2 :7002@17002 master - 0 0 2 connected 5461-10922 [10923->-a3]\n" +
		"a3 127.0.0.1:7003@17003 master - 0 0 3 connected 10923-16383\n" +
		"a4 127.0.0.1:7004@17004 slave a1 0 0 1 connected\n"
	tests := []struct {
		give   int
		want   string
		wantOK bool
	}{
		{0, "127.0.0.1:7001", true},
		{5460, "127.0.0.1:7001", true},
		{5461, "127.0.0.1:7002", true}, // no ip: the seed's host
		{10923, "127.0.0.1:7003", true},
		{16383, "127.0.0.1:7003", true},
		{16384, "", false},
	}
	topo, err := parseClusterNodes(withIDs(nodes), "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		got, ok := topo.owner(tt.give)
		if got.Addr != tt.want || ok != tt.wantOK {
			t.Errorf("slot %d: %q %v, want %q %v", tt.give, got.Addr, ok, tt.want, tt.wantOK)
		}
	}
	// A failed node still owns its slots as far as the cluster says: the owner is found,
	// and is down (the lock then says so, rather than take another node's word for it).
	topo, err = parseClusterNodes(withIDs("a5 127.0.0.1:7005@17005 master,fail - 0 0 5 connected 42\n"), "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := topo.owner(42); !ok || got.Down == "" {
		t.Errorf("slot of a failed node: %+v %v, want the node, down", got, ok)
	}
}

// TestRenewDeadline: a renewal that hangs (a lock node that stopped answering) is cut at
// a third of the lease, so the lease is declared lost once it has run out, not whenever
// the node answers again.
func TestRenewDeadline(t *testing.T) {
	const ttl = 300 * time.Millisecond
	l := &lease{key: LockKey, ttl: ttl, done: make(chan struct{})}
	l.renewOnce = func(ctx context.Context) (int64, error) {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("renewal without a deadline")
		}
		<-ctx.Done() // never answers
		return 0, ctx.Err()
	}
	lost := make(chan struct{})
	began := time.Now()
	l.start(t.Context(), func() { close(lost) })
	defer func() { l.cancel(); <-l.done }()
	select {
	case <-lost:
		t.Logf("lost after %s", time.Since(began).Round(time.Millisecond))
	case <-time.After(ttl + 5*time.Second): // an upper bound: a lease, plus generous slack
		t.Fatal("a lease whose renewals hang was not declared lost")
	}
}

// TestHeldError: a held lock names its holder and how to get past it.
func TestHeldError(t *testing.T) {
	const where = "127.0.0.1:7001"
	tests := []struct {
		name   string
		value  string
		getErr error
		pttl   int64
		want   []string
	}{
		{
			name: "a deploy's lock", value: "ann@ci pid 42|abcd", pttl: 25_000,
			want: []string{"held by ann@ci pid 42, lease expires in 25s (key rlfn:deploy:lock on 127.0.0.1:7001)", "wait for it", "DEL rlfn:deploy:lock on 127.0.0.1:7001"},
		},
		{
			name: "a lock without TTL", value: "ghost|0", pttl: -1,
			want: []string{"held by ghost with no expiry", "never released by itself", "if no deploy is running, remove it: DEL rlfn:deploy:lock on 127.0.0.1:7001"},
		},
		{
			name: "released meanwhile", getErr: valkey.Nil, pttl: -2,
			want: []string{"may just have been released: try again"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := heldError(LockKey, where, tt.value, tt.getErr, tt.pttl)
			if !errors.Is(err, ErrLocked) {
				t.Fatalf("%v is not ErrLocked", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
		})
	}
	wrongType := heldError(LockKey, where, "", errors.New("WRONGTYPE Operation against a key holding the wrong kind of value"), -1)
	for _, w := range []string{"is not a deploy lock", "remove it (DEL rlfn:deploy:lock on 127.0.0.1:7001)"} {
		if !strings.Contains(wrongType.Error(), w) {
			t.Errorf("%q does not say %q", wrongType, w)
		}
	}
}
