package deployer

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
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
