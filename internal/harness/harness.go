// Package harness starts Valkey and Redis servers, standalone or as a Valkey
// cluster, in local Docker containers on 127.0.0.1 for rlfn's integration tests.
package harness

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/testcontainers/testcontainers-go"
)

// Default images, built from the host's Debian packages by
// scripts/build-images.sh ("make images").
const (
	DefaultValkeyImage = "rlfn/valkey:8.0"
	DefaultRedisImage  = "rlfn/redis:7.0"
)

// ValkeyImage is the image for Valkey servers: $RLFN_VALKEY_IMAGE, else
// DefaultValkeyImage. Any image whose entrypoint accepts
// "valkey-server --port ..." works (e.g. the official valkey/valkey).
func ValkeyImage() string { return envOr("RLFN_VALKEY_IMAGE", DefaultValkeyImage) }

// RedisImage is the image for Redis servers: $RLFN_REDIS_IMAGE, else
// DefaultRedisImage.
func RedisImage() string { return envOr("RLFN_REDIS_IMAGE", DefaultRedisImage) }

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func init() {
	// The reaper (Ryuk) image cannot be pulled without a registry, and
	// testcontainers reads this setting once, on first use, so it is set
	// before anything else runs. Containers are removed by t.Cleanup instead;
	// after a crash, remove leftovers with
	// docker rm -f $(docker ps -aq --filter label=rlfn.harness).
	if _, ok := os.LookupEnv("TESTCONTAINERS_RYUK_DISABLED"); !ok {
		os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
}

// Require ends the test unless Docker is reachable and every image (default:
// ValkeyImage and RedisImage) is present locally. It skips the test, or fails
// it when CI=true, so a CI run can never pass by silently skipping. StartValkey,
// StartRedis and StartCluster call it themselves. Under go test -short it skips
// the test, CI or not (see ErrShort).
func Require(t testing.TB, images ...string) {
	t.Helper()
	if short() {
		t.Skip(ErrShort)
	}
	if len(images) == 0 {
		images = []string{ValkeyImage(), RedisImage()}
	}
	for _, image := range images {
		if err := checkImage(image); err != nil {
			Unavailable(t, "harness", err)
		}
	}
}

// Unavailable ends a test that could not get what it needs (a server, an image): it skips,
// or fails when CI is set true, so a CI run can never pass by silently skipping. Under
// go test -short it skips, CI or not: the servers were not asked for (see ErrShort).
func Unavailable(t testing.TB, what string, err error) {
	t.Helper()
	if short() {
		t.Skipf("%s: %v", what, ErrShort)
	}
	if inCI() {
		t.Fatalf("%s: %v (CI=true: failing instead of skipping)", what, err)
	}
	t.Skipf("%s: %v (skipping: run make images; with CI=true this fails)", what, err)
}

// Available reports why a test could not get a server from image: Docker is
// unreachable or the image is missing. For callers without a test (TestMain);
// tests call Require.
func Available(image string) error { return checkImage(image) }

// ErrShort is why no server is started under go test -short: -short asks for the tests that
// need none (make unit), so a test that needs one is skipped by choice, not for want of a
// server, and skips even when CI=true. A TestMain that shares servers gets it from NewValkey,
// NewRedis and NewCluster, and its tests skip through Unavailable.
var ErrShort = errors.New("needs a server: skipped under go test -short (run it without -short, as make test does)")

// short reports whether the test binary runs with -short. Before the flags are parsed (a
// TestMain before m.Run) it cannot know, and says no.
func short() bool { return flag.Parsed() && testing.Short() }

func inCI() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}

var (
	dockerOnce sync.Once
	dockerCli  *testcontainers.DockerClient
	dockerErr  error

	imagesMu sync.Mutex
	images   = map[string]error{} // checked images; nil means present
)

// docker returns a client configured the way testcontainers configures its
// own (DOCKER_HOST, ~/.testcontainers.properties), so the checks look where
// the containers will be started.
func docker() (*testcontainers.DockerClient, error) {
	dockerOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		dockerCli, dockerErr = testcontainers.NewDockerClientWithOpts(ctx)
		if dockerErr != nil {
			dockerErr = fmt.Errorf("docker is not reachable: %w", dockerErr)
		}
	})
	return dockerCli, dockerErr
}

// checkImage reports whether image is present locally. It is checked up front
// because no registry is reachable: a missing image would otherwise surface as
// an obscure pull failure.
func checkImage(image string) error {
	if short() {
		return ErrShort
	}
	imagesMu.Lock()
	defer imagesMu.Unlock()
	if err, ok := images[image]; ok {
		return err
	}
	cli, err := docker()
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		_, err = cli.ImageInspect(ctx, image)
		cancel()
		switch {
		case cerrdefs.IsNotFound(err):
			hint := "run make images"
			if image != DefaultValkeyImage && image != DefaultRedisImage {
				hint += " or docker pull " + image
			}
			err = fmt.Errorf("image %s not found: %s", image, hint)
		case err != nil:
			err = fmt.Errorf("inspect image %s: %w", image, err)
		}
	}
	images[image] = err
	return err
}

var (
	portsMu sync.Mutex
	ports   = map[int]bool{} // ports handed out by this process
)

// maxPort keeps port+10000 (the cluster bus port) a valid port.
const maxPort = 65535 - 10000

// freePort returns a port on 127.0.0.1 that is free now and was not handed out
// before by this process; with bus, port+10000 must be free too. Another
// process can still take it before the server binds, so callers retry.
func freePort(bus bool) (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 200 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("find a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		ok := port < maxPort && !ports[port] && !(bus && ports[port+10000])
		if ok && bus {
			lb, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
			if ok = err == nil; ok {
				lb.Close()
			}
		}
		l.Close()
		if ok {
			ports[port] = true
			if bus {
				ports[port+10000] = true
			}
			return port, nil
		}
	}
	return 0, errors.New("find a free port: no suitable port on 127.0.0.1 after 200 tries")
}
