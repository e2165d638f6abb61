package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/rls"
)

// Bad flags and a bad configuration stop the service before it serves, saying why.
func TestStartErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", bad}, bad + ": invalid rate limit unit 'fortnight'"},
		{[]string{"--config", filepath.Join(dir, "none")}, "no such file"},
		{[]string{"--config", good, "--headers", "all"}, `--headers "all": one of none, reference, draft`},
		{[]string{"--config", good, "--fallback", "maybe"}, `--fallback: "maybe" is not one of`},
		{[]string{"--config", good, "--policy", "d"}, `--policy "d": want domain:fallback=...,deadline=...`},
		{[]string{"--config", good, "--policy", "d:deadline=-1s"}, `deadline "-1s" is not a positive duration`},
		{[]string{"--config", good, "--url", "http://x"}, "the scheme must be redis, valkey, rediss or valkeys"},
		{[]string{"--config", good, "--log-level", "loud"}, "--log-level"},
		{[]string{}, `Required flag "config" not set`},
	} {
		var stderr bytes.Buffer
		code := run(append([]string{"rlfn-rls"}, tc.args...), &stderr)
		if code != 1 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 1 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	d, p, err := parsePolicy("api:fallback=fail_open,deadline=50ms")
	if err != nil || d != "api" || p != (rls.Policy{Deadline: 50 * time.Millisecond, Fallback: client.FailOpen, HasFallback: true}) {
		t.Fatalf("%q %+v %v", d, p, err)
	}
	if _, _, err := parsePolicy("api:speed=1"); err == nil {
		t.Fatal("unknown setting accepted")
	}
}
