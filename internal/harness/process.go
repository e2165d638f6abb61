package harness

import (
	"os/exec"
	"strings"
	"testing"
)

// StartProcess starts cmd with its output (stdout and stderr) in a Buffer, and returns that
// and a channel closed once the process has ended; the process is killed, and waited for,
// when the test ends.
func StartProcess(t testing.TB, cmd *exec.Cmd) (*Buffer, <-chan struct{}) {
	t.Helper()
	out := &Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	return out, exited
}

// FreePorts returns n ports of 127.0.0.1 that are free now and were never handed out before
// by this process (as the servers' are), for a process the test starts to listen on. Another
// process can still take one before it binds: start it through RetryTakenPort.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		p, err := freePort(false)
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = p
	}
	return ports
}

// RetryTakenPort runs start, which starts a process on ports FreePorts picked and reports
// whether it serves, else its output. A start that failed because a port was taken between
// its pick and the bind ("address already in use", as Go and the servers say it) is made
// again, by start picking fresh ports, up to three starts in all; any other failure fails t
// with the end of the output, where a process says why it stopped.
func RetryTakenPort(t testing.TB, what string, start func() (ok bool, out string)) {
	t.Helper()
	for try := 1; ; try++ {
		ok, out := start()
		if ok {
			return
		}
		if try == 3 || !strings.Contains(strings.ToLower(out), "address already in use") {
			t.Fatalf("%s stopped before it served:\n%s", what, tailOf(out, 6000))
		}
		t.Logf("%s: a port was taken before it could listen; again on fresh ports", what)
	}
}

// Tail is the last n bytes written (all of it when shorter), where a process says why it
// stopped: the start of its output is often its configuration.
func (b *Buffer) Tail(n int) string { return tailOf(b.String(), n) }

func tailOf(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
