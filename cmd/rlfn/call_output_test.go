package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/keys"
)

// A key holding a newline or an escape sequence (the principal is the caller's input, often
// a user's) prints Go-quoted, on one row, with no control character reaching the terminal;
// --json keeps its exact bytes.
func TestCallOutputHostileKey(t *testing.T) {
	limit := client.TokenBucket{Capacity: 2, Rate: 1, Period: time.Second}
	for _, key := range []string{"we{ird}\n*key", "evil\x1b[2J\x1b]0;owned\x07", "bad\xffutf8", "tab\there"} {
		p := &callPlan{mode: modeAllow, prefix: "rl:", key: key, limit: limit, n: 1, most: 2, stateKey: keys.Compose("rl:", key, "token_bucket", "")}
		var out bytes.Buffer
		o := newCallOutput(&out, p, false)
		row := callRow{key: p.stateKey, res: client.Result{Allowed: true, Limit: 2, Remaining: 1}}
		if err := o.add(row); err != nil {
			t.Fatal(err)
		}
		if err := o.add(row); err != nil {
			t.Fatal(err)
		}
		text := out.String()
		if n := strings.Count(text, "\n"); n != 3 {
			t.Errorf("key %q: %d lines, want a header and 2 rows:\n%s", key, n, text)
		}
		for _, c := range strings.TrimRight(text, "\n") {
			if c != '\n' && c < ' ' || c == 0x7f {
				t.Errorf("key %q: control character %q reaches the terminal:\n%q", key, c, text)
				break
			}
		}

		out.Reset()
		o = newCallOutput(&out, p, true)
		if err := o.add(row); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), `"key":`) || strings.Count(out.String(), "\n") != 1 {
			t.Errorf("key %q: --json line %q", key, out.String())
		}
	}
	if got := printable("user:42"); got != "user:42" {
		t.Errorf("printable(user:42) = %q", got)
	}
}
