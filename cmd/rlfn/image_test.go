package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/versions"
)

// jobPod is what TestImage reads of the Helm chart's deploy Job, as the chart renders it
// (deploy/helm/testdata/deploy-job.json, which the chart's TestDeployJobGolden keeps equal to
// the rendering, with serverCA the Secret valkey-ca and lua-security accepted).
type jobPod struct {
	Volumes []struct {
		Name   string
		Secret struct{ SecretName string }
	}
	Containers []struct {
		Image        string
		Args         []string
		Env          []struct{ Name, Value string }
		VolumeMounts []struct{ Name, MountPath string }
		// readOnlyRootFilesystem, capabilities.drop and allowPrivilegeEscalation, as docker
		// run's --read-only, --cap-drop and no-new-privileges.
		SecurityContext struct {
			ReadOnlyRootFilesystem   bool
			AllowPrivilegeEscalation *bool
			Capabilities             struct{ Drop []string }
		}
	}
	SecurityContext struct{ RunAsUser, RunAsGroup int64 }
}

// The rlfn image is built from the repository (FROM scratch, the static binary) and run as the
// chart's deploy Job runs it (its arguments, variables, mounted Secret and security context,
// as nobody) against real Valkeys: it installs the library release it embeds, a second run
// has nothing to do, over TLS it trusts the CA the Job mounts (the image has no CA bundle, and
// without the mount refuses the server's certificate), and a server that is not there fails
// the Job with the reason.
func TestImage(t *testing.T) {
	harness.Require(t, harness.ValkeyImage())
	raw, err := os.ReadFile("../../deploy/helm/testdata/deploy-job.json")
	if err != nil {
		t.Fatal(err)
	}
	var pod jobPod
	if err := json.Unmarshal(raw, &pod); err != nil {
		t.Fatal(err)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("the Job has %d containers", len(pod.Containers))
	}
	// What scripts/build-cmd-image.sh tags by default is what the chart runs by default.
	if img := pod.Containers[0].Image; img != "rlfn/rlfn:dev" {
		t.Fatalf("the chart's deployJob.image is %s, the script's rlfn/rlfn:dev", img)
	}

	tag := fmt.Sprintf("rlfn/rlfn:test-%d", time.Now().UnixNano())
	if out, err := exec.Command("bash", "../../scripts/build-cmd-image.sh", "rlfn", tag).CombinedOutput(); err != nil {
		harness.Unavailable(t, "the rlfn image", fmt.Errorf("%v\n%s", err, out))
	}
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "-f", tag).Run() })
	user, err := exec.Command("docker", "inspect", "-f", "{{.Config.User}}", tag).Output()
	if err != nil {
		t.Fatal(err)
	}
	if u := strings.TrimSpace(string(user)); u != fmt.Sprintf("%d:%d", pod.SecurityContext.RunAsUser, pod.SecurityContext.RunAsGroup) {
		t.Fatalf("the image runs as %q, the Job as user %d, group %d", u, pod.SecurityContext.RunAsUser, pod.SecurityContext.RunAsGroup)
	}

	ca, err := harness.NewTLS()
	if err != nil {
		t.Fatal(err)
	}
	// The Secret the Job mounts: the servers' CA under the key the chart's values name.
	secret := t.TempDir()
	if err := os.WriteFile(filepath.Join(secret, "ca.crt"), ca.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	// The container runs as nobody: the mounted Secret must be readable by all.
	if err := os.Chmod(secret, 0o755); err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{"valkey-ca": secret}

	t.Run("plain", func(t *testing.T) {
		srv := harness.StartValkey(t)
		vk := srv.Client(t)
		if v, err := libraryVersion(vk); err == nil {
			t.Fatalf("a fresh server runs %s already", v)
		}
		code, out := runJob(t, tag, pod, "redis://"+srv.Addr, secrets)
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		v, err := libraryVersion(vk)
		if want := versions.Embedded().Latest().Version; err != nil || v != want {
			t.Fatalf("the server runs %q (%v), want %s:\n%s", v, err, want, out)
		}
		// A Job run again (an upgrade with the same image, a retried pod) changes nothing.
		code, out = runJob(t, tag, pod, "redis://"+srv.Addr, secrets)
		if code != 0 || !strings.Contains(out, "nothing to do") {
			t.Fatalf("the second run: exit %d:\n%s", code, out)
		}
	})

	t.Run("TLS", func(t *testing.T) {
		srv := harness.StartValkeyTLS(t, ca)
		url := "rediss://" + srv.Addr
		// Without the chart's CA the image trusts nothing: FROM scratch has no CA bundle.
		bare := pod
		bare.Volumes = nil
		bare.Containers = append(bare.Containers[:0:0], pod.Containers...)
		bare.Containers[0].VolumeMounts = nil
		bare.Containers[0].Env = nil
		code, out := runJob(t, tag, bare, url, nil)
		if code == 0 || !strings.Contains(out, "RLFN_TLS_CA") {
			t.Fatalf("without the CA: exit %d:\n%s", code, out)
		}
		code, out = runJob(t, tag, pod, url, secrets)
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		vk := srv.Client(t)
		v, err := libraryVersion(vk)
		if want := versions.Embedded().Latest().Version; err != nil || v != want {
			t.Fatalf("the server runs %q (%v), want %s:\n%s", v, err, want, out)
		}
	})

	t.Run("no server", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := l.Addr().String()
		l.Close()
		code, out := runJob(t, tag, pod, "redis://"+dead, secrets)
		if code == 0 || !strings.Contains(out, dead) || !strings.Contains(out, "connection refused") {
			t.Fatalf("exit %d:\n%s", code, out)
		}
	})
}

// libraryVersion is the release the server runs, as rl_version says: an error when none.
func libraryVersion(vk valkey.Client) (string, error) {
	return vk.Do(context.Background(), vk.B().FcallRo().Function("rl_version").Numkeys(0).Build()).ToString()
}

// runJob runs the image tag as the Job's pod runs it, with $RLFN_URL url (the chart's is a
// Secret's) and each Secret volume mounted from the directory secrets names for it, and
// returns the exit code and the output.
func runJob(t *testing.T, tag string, pod jobPod, url string, secrets map[string]string) (int, string) {
	t.Helper()
	c := pod.Containers[0]
	args := []string{"run", "--rm", "--network", "host"}
	if c.SecurityContext.ReadOnlyRootFilesystem {
		args = append(args, "--read-only")
	}
	for _, capability := range c.SecurityContext.Capabilities.Drop {
		args = append(args, "--cap-drop", capability)
	}
	if p := c.SecurityContext.AllowPrivilegeEscalation; p != nil && !*p {
		args = append(args, "--security-opt", "no-new-privileges")
	}
	for _, e := range c.Env {
		if e.Name == "RLFN_URL" {
			e.Value = url
		}
		args = append(args, "-e", e.Name+"="+e.Value)
	}
	if !strings.Contains(strings.Join(args, " "), "RLFN_URL=") {
		args = append(args, "-e", "RLFN_URL="+url)
	}
	for _, m := range c.VolumeMounts {
		var dir string
		for _, v := range pod.Volumes {
			if v.Name == m.Name {
				dir = secrets[v.Secret.SecretName]
			}
		}
		if dir == "" {
			t.Fatalf("the Job mounts %s, which the test has no Secret for", m.Name)
		}
		args = append(args, "-v", dir+":"+m.MountPath+":ro")
	}
	args = append(append(args, tag), c.Args...)
	out, err := exec.Command("docker", args...).CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &exit):
		return exit.ExitCode(), string(out)
	}
	t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	return 0, ""
}
