// Package reference finds envoyproxy/ratelimit, the service whose configuration envoyconf
// reads and rlfn-rls is compared with, as a Go module at the one version the tests pin. Its
// own test configurations are read from the downloaded module at test time: fetched
// third-party files are never committed.
package reference

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rlfn/rlfn/internal/harness"
)

// Module is the reference's module path.
const Module = "github.com/envoyproxy/ratelimit"

// Version is the reference the tests run and read: the newest version the Go module proxy
// serves (its tags stop at v1.4.0). docs/envoy.md says what it lacks beside the reference's
// newest source (metadata, wildcards in the middle of a value).
const Version = "v1.4.1-0.20260122083618-3fb702589d36"

// fetched is one thing the tests get once per test binary: the module, its binaries.
type fetched struct {
	once sync.Once
	path string
	err  error
}

// get returns what fetch gets, fetching it on the first call. Under go test -short the test
// skips (make unit downloads and builds nothing); a test that cannot get it skips, or fails
// with CI=true, as one that cannot get its server.
func (f *fetched) get(t testing.TB, fetch func() (string, error)) string {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs %s@%s from the Go module proxy: skipped under go test -short", Module, Version)
	}
	f.once.Do(func() { f.path, f.err = fetch() })
	if f.err != nil {
		harness.Unavailable(t, "the reference ("+Module+")", f.err)
	}
	return f.path
}

var module, bin fetched

// Dir returns the module's directory in the module cache, downloading it on first use.
func Dir(t testing.TB) string {
	t.Helper()
	return module.get(t, download)
}

// Bin returns a directory holding the reference's service_cmd and config_check_cmd, built
// on first use into a temporary directory that Remove deletes.
func Bin(t testing.TB) string {
	t.Helper()
	return bin.get(t, build)
}

// Remove deletes what Bin built: for a TestMain, after the tests.
func Remove() {
	if bin.path != "" {
		os.RemoveAll(filepath.Dir(bin.path))
	}
}

// Configs returns the directory of the reference's own test configurations (test/config,
// its YAML files beside its config_test.go).
func Configs(t testing.TB) string {
	t.Helper()
	return filepath.Join(Dir(t), "test", "config")
}

// ReadConfig returns one of the reference's test configurations.
func ReadConfig(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(Configs(t), name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// goOutside runs the go command outside any module, so that the caller's go.mod and
// workspace have no say.
func goOutside(env []string, args ...string) *exec.Cmd {
	cmd := exec.Command("go", args...)
	cmd.Dir = os.TempDir()
	cmd.Env = append(append(os.Environ(), "GOWORK=off", "GOFLAGS="), env...)
	return cmd
}

func download() (string, error) {
	cmd := goOutside(nil, "mod", "download", "-json", Module+"@"+Version)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	// With -json, a failed download is described on stdout (its Error field), and the exit
	// status is non-zero.
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil || m.Error != "" || runErr != nil {
		return "", fmt.Errorf("go mod download %s@%s: %v %s %s", Module, Version, runErr, m.Error, bytes.TrimSpace(stderr.Bytes()))
	}
	if _, err := os.Stat(filepath.Join(m.Dir, "test", "config")); err != nil {
		return "", fmt.Errorf("%s@%s has no test configurations: %w", Module, Version, err)
	}
	return m.Dir, nil
}

func build() (string, error) {
	dir, err := os.MkdirTemp("", "rlfn-reference-")
	if err != nil {
		return "", err
	}
	binDir := filepath.Join(dir, "bin")
	cmd := goOutside([]string{"GOBIN=" + binDir, "CGO_ENABLED=0"}, "install",
		Module+"/src/service_cmd@"+Version, Module+"/src/config_check_cmd@"+Version)
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("go install %s@%s: %v\n%s", Module, Version, err, out)
	}
	return binDir, nil
}
