//go:build linux

package calendar

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
	_ "time/tzdata" // the copy of tzdata that Go embeds, for binaries on hosts without any
)

// time.LoadLocation reads the system's tzdata first and Go's embedded copy only when a zone
// is not found there, and ZONEINFO pointing nowhere does not change that. So this test runs
// itself again in a new user and mount namespace, hides the system's zone directories under
// empty ones, and compares the table and a sweep's digest computed from the embedded copy
// with those computed here from the system's.
const hiddenEnv = "CALENDAR_TEST_SYSTEM_TZDATA_HIDDEN"

var zoneDirs = []string{"/usr/share/zoneinfo", "/usr/share/lib/zoneinfo", "/usr/lib/locale/TZ", "/etc/zoneinfo"}

func TestEmbeddedTZData(t *testing.T) {
	if os.Getenv(hiddenEnv) != "" {
		embeddedChild(t)
		return
	}
	want := sweep(t, systemZone)
	cmd := exec.Command(os.Args[0], "-test.run=^TestEmbeddedTZData$", "-test.v")
	cmd.Env = append(os.Environ(), hiddenEnv+"="+t.TempDir(), "ZONEINFO=/nonexistent/zoneinfo")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		unavailable(t, fmt.Sprintf("no user namespaces to hide the system's tzdata in: %v", err))
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("with the embedded tzdata: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "sweep digest "+want) {
		t.Fatalf("the embedded tzdata gives other boundaries than the system's (digest %s):\n%s", want, out.String())
	}
}

func embeddedChild(t *testing.T) {
	empty := os.Getenv(hiddenEnv)
	for _, dir := range zoneDirs {
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		if err := syscall.Mount(empty, dir, "", syscall.MS_BIND, ""); err != nil {
			t.Fatalf("hiding %s: %v", dir, err)
		}
	}
	if _, err := os.Stat("/usr/share/zoneinfo/Europe/Berlin"); err == nil {
		t.Fatal("the system's tzdata is still visible")
	}
	embedded := func(t testing.TB, name string) *time.Location {
		t.Helper()
		loc, err := time.LoadLocation(name)
		if err != nil {
			t.Fatal(err)
		}
		return loc
	}
	runTable(t, embedded)
	t.Logf("sweep digest %s", sweep(t, embedded))
}
