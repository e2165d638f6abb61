package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	"github.com/testcontainers/testcontainers-go/wait"
	"github.com/valkey-io/valkey-go"
)

// Server is one server process in its own container, listening on
// 127.0.0.1:Port through host networking.
type Server struct {
	Addr   string   // "127.0.0.1:<port>"
	Port   int      // client port; a cluster node's bus is Port+10000
	Image  string   // image the container runs
	Cmd    []string // full command, e.g. ["valkey-server", "--port", ...]
	NodeID string   // cluster node ID; empty for standalone servers

	ctr   testcontainers.Container
	admin valkey.Client // the harness's own connection, for cluster checks
	tls   *TLS          // the server speaks TLS only, with this certificate

	mu         sync.Mutex
	stopped    bool
	paused     bool
	terminated bool
}

// StartValkey starts a standalone Valkey server (ValkeyImage) with
// args appended to its command line, and removes it when the test ends.
func StartValkey(t testing.TB, args ...string) *Server {
	t.Helper()
	return startStandalone(t, spec{image: ValkeyImage(), binary: "valkey-server", args: args})
}

// StartRedis starts a standalone Redis server (RedisImage) with args appended
// to its command line, and removes it when the test ends.
func StartRedis(t testing.TB, args ...string) *Server {
	t.Helper()
	return startStandalone(t, spec{image: RedisImage(), binary: "redis-server", args: args})
}

// NewValkey is StartValkey for callers without a test, such as a TestMain that
// shares servers between tests: the caller terminates the server.
func NewValkey(ctx context.Context, args ...string) (*Server, error) {
	return newStandalone(ctx, spec{image: ValkeyImage(), binary: "valkey-server", args: args})
}

// NewRedis is StartRedis for callers without a test.
func NewRedis(ctx context.Context, args ...string) (*Server, error) {
	return newStandalone(ctx, spec{image: RedisImage(), binary: "redis-server", args: args})
}

func newStandalone(ctx context.Context, sp spec) (*Server, error) {
	if err := checkImage(sp.image); err != nil {
		return nil, err
	}
	return startServer(ctx, sp)
}

func startStandalone(t testing.TB, sp spec) *Server {
	t.Helper()
	Require(t, sp.image)
	s, err := startServer(t.Context(), sp)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	t.Cleanup(func() { terminate(t, s) })
	return s
}

// Client returns a connection to this server only (no cluster routing: a
// cluster node answers MOVED for keys it does not own), closed when the test
// ends. Use Cluster.Client for a routed cluster client.
func (s *Server) Client(t testing.TB) valkey.Client {
	t.Helper()
	c, err := s.newClient()
	if err != nil {
		t.Fatalf("harness: connect to %s: %v", s.Addr, err)
	}
	t.Cleanup(c.Close)
	return c
}

// Stop kills the server without a graceful shutdown (stop timeout 0), as a
// crashed node would disappear. The container is kept, so Start can bring the
// same server back.
func (s *Server) Stop(ctx context.Context) error {
	zero := time.Duration(0)
	if err := s.ctr.Stop(ctx, &zero); err != nil {
		return fmt.Errorf("stop %s: %w", s.Addr, err)
	}
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	return nil
}

// Start restarts a stopped server in the same container: same port, and for a
// cluster node the same nodes.conf, so it rejoins with its node ID. Data is
// gone (no persistence). It returns once the server answers PING.
func (s *Server) Start(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The readiness log line from the first run is still in the container
	// log, so testcontainers' wait passes at once; PING is what tells.
	if err := s.ctr.Start(ctx); err != nil {
		return fmt.Errorf("start %s: %w", s.Addr, err)
	}
	s.mu.Lock()
	s.stopped = false
	s.mu.Unlock()
	err := waitFor(ctx, s.Addr+" answering PING", func() error {
		return s.admin.Do(ctx, s.admin.B().Ping().Build()).Error()
	})
	if err != nil {
		return fmt.Errorf("start %s: %w%s", s.Addr, err, tail(s.ctr))
	}
	return nil
}

// Pause freezes the server's processes (docker pause: the cgroup freezer), as a process
// stopped by SIGSTOP or a host that hangs: its kernel still accepts connections and takes
// what is sent, but nothing answers. Unpause thaws it; Terminate does too, first.
func (s *Server) Pause(ctx context.Context) error {
	return s.freeze(ctx, true)
}

// Unpause thaws a server Pause froze.
func (s *Server) Unpause(ctx context.Context) error {
	return s.freeze(ctx, false)
}

func (s *Server) freeze(ctx context.Context, pause bool) error {
	// testcontainers has no pause of its own: its Docker client does.
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return fmt.Errorf("docker client: %w", err)
	}
	defer cli.Close()
	id := s.ctr.GetContainerID()
	if pause {
		_, err = cli.ContainerPause(ctx, id, client.ContainerPauseOptions{})
	} else {
		_, err = cli.ContainerUnpause(ctx, id, client.ContainerUnpauseOptions{})
	}
	if err != nil {
		return fmt.Errorf("pause %s (%v): %w", s.Addr, pause, err)
	}
	s.mu.Lock()
	s.paused = pause
	s.mu.Unlock()
	return nil
}

// Running reports whether the server has not been stopped or terminated.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.stopped && !s.terminated
}

// Terminate removes the server's container. It is registered as test cleanup
// already; calling it again is a no-op.
func (s *Server) Terminate(ctx context.Context) error {
	s.mu.Lock()
	if s.terminated {
		s.mu.Unlock()
		return nil
	}
	s.terminated = true
	paused := s.paused
	s.mu.Unlock()
	if paused {
		// Some runtimes (Podman) refuse to stop a paused container.
		if err := s.Unpause(ctx); err != nil {
			return err
		}
	}
	if s.admin != nil {
		s.admin.Close()
	}
	// No graceful shutdown: nothing is persisted, and a SIGTERM'd primary
	// may first wait for its replicas.
	return s.ctr.Terminate(ctx, testcontainers.StopTimeout(0))
}

// terminate removes servers in parallel (one by one, a cluster's teardown
// adds up) and reports failures on t.
func terminate(t testing.TB, servers ...*Server) {
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := s.Terminate(ctx); err != nil {
				t.Errorf("harness: terminate %s: %v", s.Addr, err)
			}
		})
	}
	wg.Wait()
}

// spec is what a server is started with.
type spec struct {
	image, binary string
	cluster       bool
	args          []string
	tls           *TLS // serve TLS only, on Port, with this certificate
}

// startServer starts one server in a container on a free port, retrying with
// another port when the port was taken (by another process, between freePort
// and the server's bind).
func startServer(ctx context.Context, sp spec) (*Server, error) {
	var errs []error
	for attempt := 1; attempt <= 3 && ctx.Err() == nil; attempt++ {
		port, err := freePort(sp.cluster)
		if err != nil {
			return nil, err
		}
		listen := []string{"--port", strconv.Itoa(port)}
		if sp.tls != nil {
			listen = append([]string{"--port", "0", "--tls-port", strconv.Itoa(port)}, sp.tls.args()...)
		}
		cmd := append([]string{sp.binary, "--bind", "127.0.0.1"}, listen...)
		cmd = append(cmd, "--save", "", "--appendonly", "no",
			// A primary otherwise waits 5s for more replicas before a
			// (diskless) full sync: most of a cluster's start-up time.
			"--repl-diskless-sync-delay", "0")
		if sp.cluster {
			cmd = append(cmd, "--cluster-enabled", "yes",
				"--cluster-config-file", fmt.Sprintf("nodes-%d.conf", port),
				"--cluster-node-timeout", "2000",
				// Pin the address nodes announce (and clients are redirected
				// to) to loopback, rather than what each node infers from
				// its cluster bus connections.
				"--cluster-announce-ip", "127.0.0.1")
		}
		cmd = append(cmd, sp.args...)
		s, err := runContainer(ctx, sp.image, cmd, port, sp.tls)
		if err == nil {
			return s, nil
		}
		errs = append(errs, fmt.Errorf("attempt %d (port %d): %w", attempt, port, err))
		if !strings.Contains(err.Error(), "Address already in use") {
			break // e.g. a bad argument: another port will not help
		}
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("start %s: %w", sp.image, errors.Join(errs...))
}

func runContainer(ctx context.Context, image string, cmd []string, port int, tlsFiles *TLS) (*Server, error) {
	// Both Valkey ("... connections tcp") and Redis log this.
	return runContainerReady(ctx, image, cmd, port, tlsFiles, "Ready to accept connections")
}

// runContainerReady is runContainer for a server that logs ready once ready, with files
// copied into its container.
func runContainerReady(ctx context.Context, image string, cmd []string, port int, tlsFiles *TLS, ready string, extra ...testcontainers.ContainerFile) (*Server, error) {
	files := extra
	if tlsFiles != nil {
		files = append(files, tlsFiles.files()...)
	}
	ctr, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:  image,
			Cmd:    cmd,
			Files:  files,
			Labels: map[string]string{"rlfn.harness": "true"},
			// Host networking: the server binds 127.0.0.1:port on the host,
			// so test traffic never touches a bridge address.
			HostConfigModifier: func(hc *container.HostConfig) { hc.NetworkMode = "host" },
			WaitingFor: wait.ForLog(ready).
				WithStartupTimeout(30 * time.Second),
			AlwaysPullImage: false, // there is no registry; Require checked the image
		},
		Started: true,
		// Lifecycle chatter would drown test output; errors are returned.
		Logger: tclog.NewNoopLogger(),
	})
	if dc, ok := ctr.(*testcontainers.DockerContainer); ok && dc == nil {
		ctr = nil // a nil *DockerContainer in a non-nil interface
	}
	if err != nil {
		err = fmt.Errorf("%w%s", err, tail(ctr))
		if ctr != nil {
			_ = ctr.Terminate(context.Background(), testcontainers.StopTimeout(0))
		}
		return nil, err
	}
	s := &Server{
		Addr:  net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Port:  port,
		Image: image,
		Cmd:   cmd,
		ctr:   ctr,
	}
	s.tls = tlsFiles
	if s.admin, err = s.newClient(); err != nil {
		err = fmt.Errorf("connect to %s: %w%s", s.Addr, err, tail(ctr))
		_ = ctr.Terminate(context.Background(), testcontainers.StopTimeout(0))
		return nil, err
	}
	return s, nil
}

// tail returns the end of a failed container's log (e.g. "Address already in
// use"), which says more than the wait strategy's error.
func tail(ctr testcontainers.Container) string {
	if ctr == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rc, err := ctr.Logs(ctx)
	if err != nil {
		return ""
	}
	defer rc.Close()
	b, _ := io.ReadAll(rc)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return "\ncontainer log:\n" + string(b)
}

// newClient connects to this server only, never following the cluster topology, over TLS
// if it speaks TLS.
func (s *Server) newClient() (valkey.Client, error) {
	return valkey.NewClient(valkey.ClientOption{
		InitAddress:       []string{s.Addr},
		ForceSingleClient: true,
		DisableCache:      true, // no client-side caching: tests see the server's answers
		TLSConfig:         s.tls.ClientConfig(),
	})
}

// waitFor polls cond until it returns nil or ctx ends, then reports what was
// awaited and the last reason it was not yet true.
func waitFor(ctx context.Context, what string, cond func() error) error {
	start := time.Now()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up after %s waiting for %s: %w (last: %v)",
				time.Since(start).Round(time.Millisecond), what, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
