package deployer

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"
	"go.uber.org/mock/gomock"
)

// TestConnDialsOutsideTheLock: while one node's dial hangs (a node that takes its whole
// dial timeout to fail), the others are dialed and returned without waiting for it.
func TestConnDialsOutsideTheLock(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	tg := &Target{dial: func(_ valkey.ClientOption, addr string) (*conn, error) {
		if addr == "127.0.0.1:7002" {
			close(entered)
			<-release
			return nil, errors.New("i/o timeout")
		}
		return &conn{addr: addr}, nil
	}}
	hung := make(chan error, 1)
	go func() {
		_, err := tg.conn("127.0.0.1:7002")
		hung <- err
	}()
	<-entered

	got := make(chan error, 1)
	go func() {
		_, err := tg.conn("127.0.0.1:7001")
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Errorf("conn: %v", err)
		}
	case <-time.After(5 * time.Second): // an upper bound; the dial itself is instant
		t.Error("dialing 127.0.0.1:7001 waited for the hung dial of 127.0.0.1:7002")
	}
	close(release)
	if err := <-hung; err == nil {
		t.Error("the hung dial succeeded")
	}
}

// TestConnDialsOnce: callers asking for a node at once share one dial, and a failed dial
// is not retried: every later caller gets its error at once.
func TestConnDialsOnce(t *testing.T) {
	var dials atomic.Int32
	tg := &Target{dial: func(_ valkey.ClientOption, addr string) (*conn, error) {
		dials.Add(1)
		time.Sleep(10 * time.Millisecond) // let the callers pile up
		if addr == "127.0.0.1:7002" {
			return nil, errors.New("connection refused")
		}
		return &conn{addr: addr}, nil
	}}
	for _, tt := range []struct {
		give    string
		wantErr bool
	}{{"127.0.0.1:7001", false}, {"127.0.0.1:7002", true}} {
		dials.Store(0)
		var wg sync.WaitGroup
		conns := make([]*conn, 8)
		for i := range conns {
			wg.Go(func() {
				c, err := tg.conn(tt.give)
				if (err != nil) != tt.wantErr {
					t.Errorf("%s: err %v, want error %v", tt.give, err, tt.wantErr)
				}
				conns[i] = c
			})
		}
		wg.Wait()
		if _, err := tg.conn(tt.give); (err != nil) != tt.wantErr {
			t.Errorf("%s again: err %v", tt.give, err)
		}
		if n := dials.Load(); n != 1 {
			t.Errorf("%s: dialed %d times, want once", tt.give, n)
		}
		for _, c := range conns {
			if c != conns[0] {
				t.Errorf("%s: callers got different connections", tt.give)
			}
		}
	}
}

// TestDiscoverPrimaryDown: from a standalone replica whose primary cannot be dialled (down,
// or a wrong master_host), the primary is listed, and Inspect finds it unreachable, with the
// replica; a primary that answers and then fails is an error, since its other replicas
// would be missing without a word.
func TestDiscoverPrimaryDown(t *testing.T) {
	const seed, primary = "127.0.0.1:7004", "127.0.0.1:7001"
	for _, tt := range []struct {
		name      string
		primary   func(ctrl *gomock.Controller) (valkey.Client, error) // nil client: the dial fails
		wantNodes []Node
		wantErr   string
	}{
		{
			name:      "not dialled",
			primary:   func(*gomock.Controller) (valkey.Client, error) { return nil, errors.New("connect: connection refused") },
			wantNodes: []Node{{Addr: primary, Role: RolePrimary}, {Addr: seed, Role: RoleReplica, Primary: primary}},
		},
		{
			name: "dialled, then no answer",
			primary: func(ctrl *gomock.Controller) (valkey.Client, error) {
				c := mock.NewClient(ctrl)
				c.EXPECT().Do(gomock.Any(), mock.Match("INFO", "replication")).Return(mock.ErrorResult(errors.New("i/o timeout")))
				return c, nil
			},
			wantErr: "deployer: 127.0.0.1:7001: INFO replication: i/o timeout",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctrl := gomock.NewController(t)
			rc := mock.NewClient(ctrl)
			rc.EXPECT().Do(gomock.Any(), mock.Match("INFO", "cluster")).Return(mock.Result(mock.ValkeyString("# Cluster\r\ncluster_enabled:0\r\n")))
			rc.EXPECT().Do(gomock.Any(), mock.Match("INFO", "replication")).Return(mock.Result(mock.ValkeyString(
				"# Replication\r\nrole:slave\r\nmaster_host:127.0.0.1\r\nmaster_port:7001\r\nmaster_link_status:down\r\nconnected_slaves:0\r\n"))).AnyTimes()
			pc, perr := tt.primary(ctrl)
			tg := &Target{seed: seed, dial: func(_ valkey.ClientOption, addr string) (*conn, error) {
				switch {
				case addr == seed:
					return &conn{addr: addr, c: rc}, nil
				case addr == primary && pc != nil:
					return &conn{addr: addr, c: pc}, nil
				case addr == primary:
					return nil, perr
				}
				t.Errorf("dialed %s", addr)
				return nil, errors.New("no such node")
			}}
			topo, err := tg.discover(t.Context())
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("discover: %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(topo.Nodes, tt.wantNodes) {
				t.Errorf("nodes %+v, want %+v", topo.Nodes, tt.wantNodes)
			}
			tg.topo = topo
			// The primary is unreachable, by the dial that failed.
			in := tg.inspect(t.Context(), topo.Nodes[0], set)
			if in.Unreachable == nil || !strings.Contains(in.Unreachable.Error(), "connection refused") {
				t.Errorf("primary inspected: %+v, want unreachable", in)
			}
		})
	}
}

// TestDiscoverSentinel: a Sentinel's URL (its INFO has no cluster nor replication section,
// and says server_mode or redis_mode sentinel) is named for what it is, not taken for a
// server without a role. The INFO replies are those of Valkey 8.0 and Redis 7.0 Sentinels.
func TestDiscoverSentinel(t *testing.T) {
	for _, server := range []string{
		"# Server\r\nvalkey_version:8.0.1\r\nserver_mode:sentinel\r\n",
		"# Server\r\nredis_version:7.0.15\r\nredis_mode:sentinel\r\n",
	} {
		c := mock.NewClient(gomock.NewController(t))
		c.EXPECT().Do(gomock.Any(), mock.Match("INFO", "cluster")).Return(mock.Result(mock.ValkeyString("")))
		c.EXPECT().Do(gomock.Any(), mock.Match("INFO", "server")).Return(mock.Result(mock.ValkeyString(server)))
		tg := &Target{seed: "127.0.0.1:26379", dial: func(_ valkey.ClientOption, addr string) (*conn, error) { return &conn{addr: addr, c: c}, nil }}
		_, err := tg.discover(t.Context())
		if want := "deployer: 127.0.0.1:26379 is a Sentinel: give the URL of a node it monitors"; err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("discover from a Sentinel (%q): %v, want %q", server, err, want)
		}
	}
}
