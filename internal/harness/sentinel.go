package harness

import (
	"fmt"
	"strings"
	"testing"

	"github.com/testcontainers/testcontainers-go"
)

// StartSentinel starts a Sentinel from primary's image and server (valkey-server --sentinel,
// redis-server --sentinel) that monitors primary as the set name, with a quorum of one and
// short timeouts (a primary is down after 1 s), and removes it when the test ends. Its Addr
// is the Sentinel's.
func StartSentinel(t testing.TB, primary *Server, name string) *Server {
	t.Helper()
	Require(t, primary.Image)
	var errs []string
	for attempt := 1; attempt <= 3; attempt++ {
		port, err := freePort(false)
		if err != nil {
			t.Fatalf("harness: %v", err)
		}
		conf := fmt.Sprintf("port %d\nbind 127.0.0.1\nsentinel monitor %s 127.0.0.1 %d 1\n"+
			"sentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 10000\n", port, name, primary.Port, name, name)
		// Sentinel rewrites its configuration file: it must be its own, and writable.
		file := testcontainers.ContainerFile{Reader: strings.NewReader(conf), ContainerFilePath: "/sentinel.conf", FileMode: 0o644}
		s, err := runContainerReady(t.Context(), primary.Image, []string{primary.Cmd[0], "/sentinel.conf", "--sentinel"}, port, nil, "+monitor master", file)
		if err == nil {
			t.Cleanup(func() { terminate(t, s) })
			return s
		}
		errs = append(errs, err.Error())
		if !strings.Contains(err.Error(), "Address already in use") {
			break
		}
	}
	t.Fatalf("harness: start a Sentinel: %s", strings.Join(errs, "; "))
	return nil
}
