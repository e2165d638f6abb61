package helm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// binaries builds rlfn-rls and rlfn from the repository once per test binary, for the test
// that gives them the chart's arguments.
var binaries struct {
	once sync.Once
	dir  string
	err  error
	out  []byte
}

func buildBinaries(t *testing.T) string {
	t.Helper()
	binaries.once.Do(func() {
		binaries.dir, binaries.err = os.MkdirTemp("", "rlfn-chart-")
		if binaries.err != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", binaries.dir, "./cmd/rlfn-rls", "./cmd/rlfn")
		// The main module, two directories up: not this module's go.mod.
		cmd.Dir = filepath.Join("..", "..")
		cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0")
		binaries.out, binaries.err = cmd.CombinedOutput()
	})
	if binaries.err != nil {
		t.Fatalf("go build: %v\n%s", binaries.err, binaries.out)
	}
	return binaries.dir
}

func TestMain(m *testing.M) {
	code := checkEveryValueTried(m.Run())
	if binaries.dir != "" {
		os.RemoveAll(binaries.dir)
	}
	os.Exit(code)
}

// accepts runs bin with args and --help: the real binary parses every argument with its own
// flags (a flag it lacks, or a value its flag cannot take, is an error) and, the help asked,
// stops before connecting or reading anything. The environment is empty, so that no
// variable of the test's stands in for an argument. Only the help shown says all parsed: a
// refused flag prints its error alone (rlfn then exits 0 all the same).
func accepts(bin string, args []string) error {
	cmd := exec.Command(bin, append(append([]string{}, args...), "--help")...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "USAGE:") || strings.HasPrefix(string(out), filepath.Base(bin)+":") {
		return fmt.Errorf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	return nil
}

// checkContainer checks c's arguments and variables against bin, the binary of its image.
func checkContainer(t *testing.T, bin string, c corev1.Container) {
	t.Helper()
	if len(c.Command) > 0 {
		t.Fatalf("%s: a command %v replaces the image's entrypoint: this test knows only the entrypoints", c.Name, c.Command)
	}
	for _, e := range c.Env {
		if !strings.HasPrefix(e.Name, "RLFN_") {
			t.Errorf("%s: $%s is no variable of rlfn's", c.Name, e.Name)
		}
	}
	if err := accepts(bin, c.Args); err != nil {
		t.Error(err)
	}
}

// Every argument the chart gives a container, with its defaults and with every option, is
// one the binary in that container's image accepts: rlfn-rls for the Deployment, rlfn for
// the deploy Job (both built here from the repository, their flag sets the real ones).
func TestChartArgsAccepted(t *testing.T) {
	dir := buildBinaries(t)
	for name, values := range map[string]string{"defaults": minimal, "every option": everyOption} {
		t.Run(name, func(t *testing.T) {
			m, err := render(t, values)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range m.deployment.Spec.Template.Spec.Containers {
				checkContainer(t, filepath.Join(dir, "rlfn-rls"), c)
			}
			for _, c := range m.job.Spec.Template.Spec.Containers {
				checkContainer(t, filepath.Join(dir, "rlfn"), c)
			}
		})
	}
	// What the binaries refuse fails it.
	for _, bad := range []struct {
		bin  string
		args []string
	}{
		{"rlfn", []string{"deploy", "--yes", "--acept-warning=lua-security"}},
		{"rlfn", []string{"deploy", "--yes", "--parallel=four"}},
		{"rlfn-rls", []string{"--deadline=100"}},
		{"rlfn-rls", []string{"--reconcile=maybe"}},
		{"rlfn-rls", []string{"--metric=:19001"}},
	} {
		if err := accepts(filepath.Join(dir, bad.bin), bad.args); err == nil {
			t.Errorf("%s %v: accepted", bad.bin, bad.args)
		}
	}
}

// Kubernetes' service links set $<SERVICE>_PORT=tcp://IP:PORT for every Service in the
// namespace: a Service named grpc gives GRPC_PORT, the reference's variable, which rlfn-rls
// refuses at start. Both pods turn the links off.
func TestChartNoServiceLinks(t *testing.T) {
	m, err := render(t, minimal)
	if err != nil {
		t.Fatal(err)
	}
	for name, pod := range map[string]*corev1.PodSpec{"service": &m.deployment.Spec.Template.Spec, "job": &m.job.Spec.Template.Spec} {
		if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
			t.Errorf("%s: enableServiceLinks %v", name, pod.EnableServiceLinks)
		}
	}
	// Why: the variable a Service named grpc injects stops rlfn-rls.
	dir := buildBinaries(t)
	cmd := exec.Command(filepath.Join(dir, "rlfn-rls"), "--config", t.TempDir())
	cmd.Env = []string{"GRPC_PORT=tcp://10.96.0.12:8081"}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "GRPC_PORT") {
		t.Errorf("rlfn-rls with a service link's GRPC_PORT: %v\n%s", err, out)
	}
}

// startService runs bin as the pod would run c: its arguments (the configuration directory
// the ConfigMap's data, the listeners on loopback) and its literal variables, $RLFN_URL url;
// and returns what it printed when it exited. Nothing listens on url's port, so it exits at
// start: the point is which check stops it.
func startService(t *testing.T, bin string, c corev1.Container, data map[string]string, url string) (string, error) {
	t.Helper()
	config := t.TempDir()
	for name, text := range data {
		if err := os.WriteFile(filepath.Join(config, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var args []string
	for _, a := range c.Args {
		switch {
		case strings.HasPrefix(a, "--config="):
			a = "--config=" + config
		case strings.HasPrefix(a, "--grpc="), strings.HasPrefix(a, "--http="):
			a = a[:strings.Index(a, "=")] + "=127.0.0.1:0"
		}
		args = append(args, a)
	}
	env := []string{"RLFN_URL=" + url}
	for _, e := range c.Env {
		if e.Name != "RLFN_URL" && e.ValueFrom == nil {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The servers' CA reaches the service as the deploy Job's does, $RLFN_TLS_CA, which rlfn-rls
// takes with a TLS URL and ignores with a plain one: --tls-ca, which it refuses with a plain
// URL, stopped every pod whose URL (in a Secret the chart cannot read) was redis://.
func TestChartServerCA(t *testing.T) {
	bin := filepath.Join(buildBinaries(t), "rlfn-rls")
	m, err := render(t, minimal+"serverCA: {secret: valkey-ca, key: ca.pem}")
	if err != nil {
		t.Fatal(err)
	}
	c := m.deployment.Spec.Template.Spec.Containers[0]
	// A plain URL: past the CA, to the connection (refused: nothing listens there).
	out, err := startService(t, bin, c, m.configMap.Data, "redis://127.0.0.1:1")
	if err == nil || strings.Contains(out, "tls-ca") || !strings.Contains(out, "127.0.0.1:1") {
		t.Errorf("a plain URL with the chart's CA: %v\n%s", err, out)
	}
	// A TLS URL: the CA is the file the chart mounts (not there here, which says so).
	out, err = startService(t, bin, c, m.configMap.Data, "rediss://127.0.0.1:1")
	if err == nil || !strings.Contains(out, "/etc/rlfn-rls/server-ca/ca.pem") {
		t.Errorf("a TLS URL with the chart's CA: %v\n%s", err, out)
	}
}
