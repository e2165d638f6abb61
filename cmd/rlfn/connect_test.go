package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
	"github.com/valkey-io/valkey-go"
)

// TestClientOption: --timeout bounds connecting too, and $RLFN_TLS_CA applies to TLS URLs
// only, while --tls-ca with a plain URL stays a mistake.
func TestClientOption(t *testing.T) {
	tests := []struct {
		name    string
		env     string // RLFN_TLS_CA
		give    []string
		wantErr string
		want    func(valkey.ClientOption) bool
	}{
		{
			name: "--timeout bounds the dial and the handshake",
			give: []string{"--url", "redis://127.0.0.1:1", "--timeout", "1500ms"},
			want: func(o valkey.ClientOption) bool {
				return o.Dialer.Timeout == 1500*time.Millisecond && o.ConnWriteTimeout == 1500*time.Millisecond
			},
		},
		{
			name: "a shorter dial_timeout in the URL stands",
			give: []string{"--url", "redis://127.0.0.1:1?dial_timeout=100ms", "--timeout", "1m"},
			want: func(o valkey.ClientOption) bool { return o.Dialer.Timeout == 100*time.Millisecond },
		},
		{
			name: "$RLFN_TLS_CA does not break a plain URL",
			env:  "/nonexistent/ca.pem",
			give: []string{"--url", "redis://127.0.0.1:1"},
			want: func(o valkey.ClientOption) bool { return o.TLSConfig == nil },
		},
		{
			name:    "$RLFN_TLS_CA is read for a TLS URL",
			env:     "/nonexistent/ca.pem",
			give:    []string{"--url", "rediss://127.0.0.1:1"},
			wantErr: "$RLFN_TLS_CA: open /nonexistent/ca.pem",
		},
		{
			name:    "--tls-ca with a plain URL is a mistake",
			give:    []string{"--url", "redis://127.0.0.1:1", "--tls-ca", "ca.pem"},
			wantErr: "--tls-ca needs a rediss://",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(tlsCAEnv, tt.env)
			var got valkey.ClientOption
			var err error
			app := New()
			app.Commands = append(app.Commands, &cli.Command{Name: "opt", Action: func(c *cli.Context) error {
				got, err = clientOption(c)
				return nil
			}})
			var out strings.Builder
			app.Writer, app.ErrWriter = &out, &out
			if code := runApp(context.Background(), app, append(append([]string{"rlfn"}, tt.give...), "opt")); code != 0 {
				t.Fatalf("exit %d: %s", code, out.String())
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("err %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !tt.want(got) {
				t.Errorf("clientOption = %+v, %v", got, err)
			}
		})
	}
}

// TestNotAServer: a URL naming a port where something else listens (an HTTP server, most
// often) says so, rather than valkey-go's "received unknown message type: 72".
func TestNotAServer(t *testing.T) {
	web := httptest.NewServer(http.NotFoundHandler()) // on 127.0.0.1
	defer web.Close()
	for _, tt := range []struct {
		name string
		addr string
		want string
	}{
		{"net/http", strings.TrimPrefix(web.URL, "http://"), `not a Valkey or Redis server: an HTTP server answered (its reply starts with 'H'); is the URL's port the server's?`},
		{"a page", replying(t, "<html><body>Error</body></html>"), `an HTTP server answered (its reply starts with '<')`},
		{"ssh", replying(t, "SSH-2.0-OpenSSH_9.2\r\n"), `not a Valkey or Redis server: its reply starts with 'S', which is no RESP reply`},
	} {
		for _, cmd := range [][]string{{"status"}, {"deploy", "--yes"}, {"call", "fixed_window", "k", "--limit", "1", "--window", "1s"}, {"call", "fixed_window", "k", "--limit", "1", "--window", "1s", "--peek"}} {
			r := rlfn(t, nil, append([]string{"--url", "redis://" + tt.addr, "--timeout", "5s"}, cmd...)...)
			if r.code != exitError || !strings.Contains(r.stderr, tt.addr) || !strings.Contains(r.stderr, tt.want) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
				t.Errorf("%s: %v: exit %d, stderr %q; want one line saying %q", tt.name, cmd, r.code, r.stderr, tt.want)
			}
		}
	}
}

// replying listens on 127.0.0.1 and answers every connection with reply, then closes it.
func replying(t *testing.T, reply string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = c.Read(make([]byte, 512))
				_, _ = c.Write([]byte(reply))
			}()
		}
	}()
	return l.Addr().String()
}
