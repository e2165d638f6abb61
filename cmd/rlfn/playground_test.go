package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/internal/harness"
)

func TestCheckListen(t *testing.T) {
	for _, c := range []struct {
		give   string
		remote bool
		want   string // "" when accepted
	}{
		{"127.0.0.1:8080", false, ""},
		{"127.0.0.1:0", false, ""},
		{"localhost:8080", false, ""},
		{"[::1]:8080", false, ""},
		{"127.1.2.3:8080", false, ""},
		{"0.0.0.0:8080", false, "not a loopback address"},
		{":8080", false, "not a loopback address"},
		{"[::]:8080", false, "not a loopback address"},
		{"192.168.1.10:8080", false, "not a loopback address"},
		{"example.com:8080", false, "not a loopback address"},
		{"0.0.0.0:8080", true, ""},
		{":8080", true, ""},
		{"127.0.0.1", false, "want HOST:PORT"},
		{"127.0.0.1:http", false, "is not a number from 0 to 65535"},
		{"127.0.0.1:65536", false, "is not a number from 0 to 65535"},
		{"127.0.0.1:-1", false, "is not a number from 0 to 65535"},
		{"", false, "want HOST:PORT"},
	} {
		err := checkListen(c.give, c.remote)
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("checkListen(%q, %v) = %v, want %q", c.give, c.remote, err, c.want)
		}
	}
}

// TestPlaygroundShellQuote: the deploy command the page shows pastes into a shell as the URL
// it names, whatever the URL holds.
func TestPlaygroundShellQuote(t *testing.T) {
	for _, give := range []string{"redis://127.0.0.1:6379", "redis://o'brien:xxxxx@host:6379/0?client_name=it's", "'", "a b $HOME `x` \\ \"q\""} {
		out, err := exec.Command("sh", "-c", "printf %s "+shellQuote(give)).Output()
		if err != nil || string(out) != give {
			t.Errorf("sh -c 'printf %%s %s' = %q, %v; want %q", shellQuote(give), out, err, give)
		}
	}
}

// TestPlaygroundHTTPServer: a client that holds a connection without sending its request is cut
// off; nothing cuts off a boundary scenario's answer, which comes up to a minute later.
func TestPlaygroundHTTPServer(t *testing.T) {
	hs := httpServer(http.NotFoundHandler())
	if hs.ReadHeaderTimeout <= 0 || hs.ReadTimeout <= 0 || hs.IdleTimeout <= 0 || hs.WriteTimeout != 0 {
		t.Errorf("timeouts: header %s, read %s, idle %s, write %s", hs.ReadHeaderTimeout, hs.ReadTimeout, hs.IdleTimeout, hs.WriteTimeout)
	}
}

// TestPlaygroundRefuses: a bad command line is refused before any dial (the URL names a closed
// port), with a message and exit 1.
func TestPlaygroundRefuses(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"playground", "--listen", "0.0.0.0:8080"}, `rlfn: playground: --listen "0.0.0.0:8080" is not a loopback address`},
		{[]string{"playground", "--listen", ":0"}, "add --allow-remote"},
		{[]string{"playground", "--listen", "8080"}, "want HOST:PORT"},
		{[]string{"playground", "--listen", "127.0.0.1:99999"}, "is not a number from 0 to 65535"},
		{[]string{"playground", "now"}, "takes no arguments"},
		{[]string{"playground", "--bogus"}, "flag provided but not defined: -bogus (see rlfn playground --help)"},
		{[]string{"playground", "--listen"}, "flag needs an argument: -listen"},
		{[]string{"playground", "--allow-remote=maybe"}, "invalid boolean value"},
	} {
		r := rlfn(t, nil, append([]string{"--url", "redis://127.0.0.1:1"}, c.args...)...)
		if r.code != exitError || !strings.Contains(r.stderr, c.want) || r.stdout != "" {
			t.Errorf("rlfn %s: exit %d, stdout %q, stderr %q; want exit 1 and %q", strings.Join(c.args, " "), r.code, r.stdout, r.stderr, c.want)
		}
	}
}

// TestPlaygroundDeadServer: a server that does not answer ends the command at once, saying so.
func TestPlaygroundDeadServer(t *testing.T) {
	r := rlfn(t, nil, "--url", "redis://127.0.0.1:1", "--timeout", "5s", "playground", "--listen", "127.0.0.1:0")
	if r.code != exitError || !strings.Contains(r.stderr, "127.0.0.1:1") || !strings.Contains(r.stderr, "refused") {
		t.Errorf("exit %d, stderr %q; want exit 1 naming the node and the refused connection", r.code, r.stderr)
	}
}

// TestPlaygroundServes runs the command against a real Valkey without the library: it prints
// the address it got for port 0, warns that the library is absent, serves the page, whose
// status says so with the deploy command, still refuses other sites' Host names (on loopback
// --allow-remote changes nothing), and ends cleanly (exit 0) when its context is canceled, as
// on Ctrl-C.
func TestPlaygroundServes(t *testing.T) {
	s := harness.StartValkey(t)
	app := New()
	var stdout, stderr harness.Buffer
	app.Writer, app.ErrWriter = &stdout, &stderr
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	url := "redis://" + s.Addr
	go func() {
		done <- runApp(ctx, app, []string{"rlfn", "--url", url, "playground", "--listen", "127.0.0.1:0", "--allow-remote"})
	}()

	addr := regexp.MustCompile(`open http://(127\.0\.0\.1:[0-9]+)/ `)
	var page string
	for deadline := time.Now().Add(20 * time.Second); page == "" && time.Now().Before(deadline); {
		if m := addr.FindStringSubmatch(stdout.String()); m != nil && !strings.HasSuffix(m[1], ":0") {
			page = "http://" + m[1]
		}
		select {
		case code := <-done:
			t.Fatalf("exited %d before serving; stdout %q, stderr %q", code, stdout.String(), stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if page == "" {
		t.Fatalf("no address printed: stdout %q, stderr %q", stdout.String(), stderr.String())
	}

	resp, err := http.Get(page + "/api/status")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Loaded, Absent bool
		Deploy, Server string
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || st.Loaded || !st.Absent || st.Deploy != "rlfn --url '"+url+"' deploy" || st.Server != url {
		t.Errorf("status: %+v, %v", st, err)
	}
	// --allow-remote on a loopback address allows nothing more: other sites' names are refused.
	req, _ := http.NewRequest("GET", page+"/", nil)
	req.Host = "evil.example"
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("Host evil.example on a loopback listener: %v, %v; want 403", resp, err)
	} else {
		resp.Body.Close()
	}
	if !strings.Contains(stderr.String(), "no ratelimit library (run rlfn deploy)") {
		t.Errorf("stderr %q does not say the library is absent", stderr.String())
	}

	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("exit %d after cancel, want 0; stderr %q", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still running 10s after its context was canceled")
	}
	if _, err := http.Get(page + "/"); err == nil {
		t.Error("the page still answers after the command ended")
	}
}

// TestPlaygroundHostileVersion: the warning playground prints when the library is not usable
// quotes what the server answered to rl_version, so that its escape sequences do not reach
// the terminal.
func TestPlaygroundHostileVersion(t *testing.T) {
	s := harness.StartValkey(t)
	vk := s.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	code := "#!lua name=ratelimit\nredis.register_function{function_name='rl_version', callback=function() return '9.0.0\\27]0;owned\\7' end, flags={'no-writes'}}\n"
	if err := vk.Do(ctx, vk.B().FunctionLoad().FunctionCode(code).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	app := New()
	var stdout, stderr harness.Buffer
	app.Writer, app.ErrWriter = &stdout, &stderr
	done := make(chan int, 1)
	go func() {
		done <- runApp(ctx, app, []string{"rlfn", "--url", "redis://" + s.Addr, "playground", "--listen", "127.0.0.1:0"})
	}()
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(stderr.String(), "\n") && time.Now().Before(deadline); {
		select {
		case code := <-done:
			t.Fatalf("exited %d; stdout %q, stderr %q", code, stdout.String(), stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	<-done
	got := stderr.String()
	if strings.ContainsAny(got, "\x1b\x07") || !strings.Contains(got, `9.0.0\x1b]0;owned\a`) {
		t.Errorf("stderr %q: want the server's version Go-quoted, no control character", got)
	}
}
