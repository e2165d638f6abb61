package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/versions"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/rlfn -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (go test ./cmd/rlfn -update rewrites it):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// result is what one in-process run of rlfn printed and returned.
type result struct {
	code           int
	stdout, stderr string
}

// rlfn runs the app in-process with args (without the program name) and the given releases
// (nil: the embedded ones).
func rlfn(t *testing.T, set versions.Set, args ...string) result {
	t.Helper()
	app := New()
	if set != nil {
		app.Metadata[releasesKey] = set
	}
	var stdout, stderr bytes.Buffer
	app.Reader, app.Writer, app.ErrWriter = strings.NewReader(""), &stdout, &stderr
	code := runApp(context.Background(), app, append([]string{"rlfn"}, args...))
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

func TestVersions(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	r := rlfn(t, nil, "versions")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	set := versions.Embedded()
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != len(set)+1 || !strings.HasPrefix(lines[len(lines)-1], set.Latest().Version+" ") {
		t.Errorf("versions printed\n%s\nwant a header and %d releases, newest (%s) last", r.stdout, len(set), set.Latest().Version)
	}

	r = rlfn(t, nil, "versions", "--json")
	var got []releaseJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != 0 {
		t.Fatalf("versions --json: exit %d, %v:\n%s", r.code, err, r.stdout)
	}
	if len(got) != len(set) || got[0].Version != set[0].Version || got[0].SHA256 != set[0].SHA256() {
		t.Errorf("versions --json = %+v, want %d releases starting with %s", got, len(set), set[0].Version)
	}
}

func TestHelpGolden(t *testing.T) {
	for _, give := range [][]string{{"--help"}, {"call", "--help"}, {"deploy", "--help"}} {
		r := rlfn(t, nil, give...)
		if r.code != 0 {
			t.Fatalf("rlfn %v: exit %d, stderr %q", give, r.code, r.stderr)
		}
		golden(t, strings.ReplaceAll(strings.Join(append(give[:len(give)-1:len(give)-1], "help"), "-"), "--", "")+".golden", r.stdout)
	}
	// "rlfn help [COMMAND]" is --help, as many tools take it.
	for _, tt := range []struct{ give, same []string }{
		{[]string{"help"}, []string{"--help"}},
		{[]string{"help", "call"}, []string{"call", "--help"}},
		{[]string{"--url", "redis://127.0.0.1:1", "help", "deploy"}, []string{"deploy", "--help"}},
	} {
		r, want := rlfn(t, nil, tt.give...), rlfn(t, nil, tt.same...)
		if r.code != 0 || r.stdout != want.stdout || r.stdout == "" {
			t.Errorf("rlfn %v: exit %d, stderr %q; want the help of rlfn %v", tt.give, r.code, r.stderr, tt.same)
		}
	}
}

// TestVersionFlag: rlfn --version says which rlfn it is and the releases it deploys, exit 0;
// without a command and without it, rlfn shows its help.
func TestVersionFlag(t *testing.T) {
	r := rlfn(t, nil, "--version")
	want := "rlfn "
	if r.code != 0 || !strings.HasPrefix(r.stdout, want) || strings.Count(r.stdout, "\n") != 1 {
		t.Errorf("rlfn --version: exit %d, stdout %q, stderr %q; want one line", r.code, r.stdout, r.stderr)
	}
	for _, rel := range versions.Embedded() {
		if !strings.Contains(r.stdout, rel.Version) {
			t.Errorf("rlfn --version: %q does not name release %s", r.stdout, rel.Version)
		}
	}
	if r, help := rlfn(t, nil), rlfn(t, nil, "--help"); r.code != 0 || r.stdout != help.stdout {
		t.Errorf("rlfn alone: exit %d, stdout %q; want the help", r.code, r.stdout)
	}
	// With a command, wherever written, --version prints the same line and runs nothing: the
	// URL names a port nothing listens on, so a command that ran would fail, and a deploy
	// must not run with the flag ignored.
	for _, args := range [][]string{
		{"--version", "status"},
		{"status", "--version"},
		{"deploy", "--yes", "--version"},
		{"status", "--json", "--version"},
	} {
		got := rlfn(t, nil, append([]string{"--url", "redis://127.0.0.1:1"}, args...)...)
		if got.code != 0 || got.stdout != r.stdout || got.stderr != "" {
			t.Errorf("rlfn %v: exit %d, stdout %q, stderr %q; want exit 0 and %q", args, got.code, got.stdout, got.stderr, r.stdout)
		}
	}
}

// TestUsageErrors covers mistakes caught before any network call: each is one line naming
// the cause, and exit code 1. The URL points at a port nothing listens on, so a command that
// dialled would fail differently.
func TestUsageErrors(t *testing.T) {
	tests := []struct {
		give []string
		want string
	}{
		{[]string{"call"}, "call: needs ALGORITHM and KEY"},
		{[]string{"call", "token_bucket"}, "call: needs KEY after ALGORITHM token_bucket"},
		{[]string{"call", "fixed_window", "k", "extra", "--limit", "5", "--window", "1s"}, `call: takes ALGORITHM and KEY only; extra argument "extra" after KEY "k"`},
		{[]string{"call", "token_bucket", "user", "42", "--capacity", "5", "--rate", "1", "--period", "1s"}, `call: takes ALGORITHM and KEY only; extra argument "42" after KEY "user"`},
		{[]string{"call", "fixed_window", "user", "42", "limit", "--window", "1s"}, `call: takes ALGORITHM and KEY only; extra arguments "42" "limit" after KEY "user"`},
		{[]string{"call", "fixed_window", "", "--limit", "5", "--window", "1s"}, `call: KEY is missing: the second argument is "" (an unset variable?)`},
		{[]string{"call", "bogus", "k"}, `unknown algorithm "bogus"`},
		{[]string{"call", "token_bucket", "k", "--capacity", "10", "--rate", "1"}, "token_bucket needs --period"},
		{[]string{"call", "fixed_window", "k", "--limit", "10", "--window", "1s", "--rate", "1"}, "--rate does not apply to fixed_window"},
		{[]string{"call", "fixed_window", "k", "--limit", "0", "--window", "1s"}, "call: --limit must be from 1 to 999999999999999, got 0 (see rlfn call --help)"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1500us"}, "--window must be a whole number of milliseconds, got 1.5ms"},
		{[]string{"call", "leaky_bucket", "k", "--capacity", "5", "--rate", "1", "--period", "1s", "--mode", "drip"}, "--mode is police or shape"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--repeat", "0"}, "--repeat must be at least 1"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--prefix", ""}, "--prefix must not be empty"},
		{[]string{"call", "fixed_window", "k", "--limit", "x"}, `--limit "x" is not a decimal integer (see rlfn call --help)`},
		{[]string{"call", "fixed_window", "k", "--limit", "1.5", "--window", "1s"}, `--limit "1.5" is not a decimal integer`},
		{[]string{"call", "fixed_window", "k", "--limit", "1", "--window", "1"}, `--window "1": missing unit in duration "1"; write a duration with its unit, e.g. 500ms, 1s, 1m, 1h (see rlfn call --help)`},
		{[]string{"call", "fixed_window", "k", "--limit", "1", "--window", "1s", "--repeat", "x"}, `--repeat "x" is not a decimal integer`},
		{[]string{"--timeout", "5", "status"}, `--timeout "5": missing unit in duration "5"; write a duration with its unit, e.g. 500ms, 1s, 1m, 1h (see rlfn --help)`},
		{[]string{"status", "--timeout", "5"}, `--timeout "5": missing unit in duration "5"`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--reserve", "6"}, "--reserve must be from 0 to 5, got 6"},
		// calendars and penalties (library 1.2.0)
		{[]string{"call", "calendar", "k", "--limit", "5"}, "call: calendar needs --period (see rlfn call --help)"},
		{[]string{"call", "calendar", "k", "--limit", "5", "--period", "fortnight"}, `--period is day, week, month or year for a calendar, not "fortnight"`},
		{[]string{"call", "calendar", "k", "--limit", "5", "--period", "1h"}, `--period is day, week, month or year for a calendar, not "1h"`},
		{[]string{"call", "token_bucket", "k", "--capacity", "5", "--rate", "1", "--period", "month"}, `--period "month": invalid duration "month"; write a duration with its unit`},
		{[]string{"call", "calendar", "k", "--limit", "5", "--period", "month", "--zone", "Mars/Olympus"}, `call: --zone "Mars/Olympus" does not load as a time zone: give an IANA name such as Europe/Berlin, or UTC (see rlfn call --help)`},
		{[]string{"call", "calendar", "k", "--limit", "5", "--period", "month", "--zone", ""}, `--zone "" is not a time zone`},
		{[]string{"call", "calendar", "k", "--limit", "5", "--period", "month", "--zone", "Europe/Berlin\n\x1b[2J"}, `--zone "Europe/Berlin\n\x1b[2J" does not load as a time zone`}, // quoted, on one line
		{[]string{"call", "calendar", "k", "--limit", "5", "--period", "month", "--zone", "Local"}, `--zone "Local" is not a time zone`},
		{[]string{"call", "calendar", "k", "--limit", "5", "--period", "month", "--anchor", "2026-01-31T00:00Z"}, `--anchor "2026-01-31T00:00Z" is not a date and clock time such as 2026-01-31T00:00 (no offset: the zone gives it)`},
		{[]string{"call", "calendar", "k", "--limit", "5", "--period", "month", "--anchor", ""}, "--anchor is empty"},
		{[]string{"call", "calendar", "k", "--limit", "5", "--period", "month", "--window", "1s"}, "--window does not apply to calendar"},
		{[]string{"call", "calendar", "k", "--limit", "5", "--period", "month", "--reserve", "6"}, "--reserve must be from 0 to 5, got 6"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--zone", "UTC"}, "--zone does not apply to fixed_window"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--penalty", "1.5ms"}, "--penalty must be a whole number of milliseconds, got 1.5ms"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--penalty", "-1s"}, "--penalty must be at least 1ms, got -1s"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--penalty", "100000000001ms"}, "--penalty must be at most 100000000000ms"},
		{[]string{"call", "concurrency", "k", "--limit", "5", "--lease", "1s", "--penalty", "1s"}, "--penalty does not apply to concurrency"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "calendar,limit=1"}, "calendar needs period="},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "calendar,limit=1,period=day,zone=Nowhere/City"}, `zone= "Nowhere/City" does not load`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "calendar,limit=1,period=day,anchor=31.01.2026"}, `anchor= "31.01.2026" is not a date and clock time`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "token_bucket,capacity=1,rate=1,period=1s,penalty=1.5ms"}, "penalty= must be a whole number of milliseconds"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "calendar,limit=1,period=day,period=week"}, "period given twice"},
		// block and unblock
		{[]string{"block"}, "block: needs KEY (see rlfn block --help)"},
		{[]string{"block", "k"}, "block: needs --for DURATION to block KEY, or --peek to read its block"},
		{[]string{"block", "k", "--for", "0s"}, "block: --for must be at least 1ms, got 0s"},
		{[]string{"block", "k", "--for", "-1m"}, "--for must be at least 1ms, got -1m0s"},
		{[]string{"block", "k", "--for", "1.5ms"}, "--for must be a whole number of milliseconds, got 1.5ms"},
		{[]string{"block", "k", "--for", "100000000001ms"}, "--for must be at most 100000000000ms"},
		{[]string{"block", "k", "--for", "10"}, `--for "10": missing unit in duration "10"; write a duration with its unit`},
		{[]string{"block", "k", "--for", "1m", "--peek"}, "--for does not go with --peek"},
		{[]string{"block", "", "--for", "1m"}, `block: KEY is missing: the argument is "" (an unset variable?)`},
		{[]string{"block", "k", "j", "--for", "1m", "--json"}, `block: takes KEY only; extra "j" after KEY "k"`},
		{[]string{"block", "k", "--for", "1m", "--prefix", ""}, "--prefix must not be empty"},
		{[]string{"block", "k", "--for", "1m", "--policy", "a b"}, `--policy "a b": httplimit names hold`},
		{[]string{"unblock"}, "unblock: needs KEY"},
		{[]string{"unblock", "k", "--for", "1m"}, "flag provided but not defined: -for (see rlfn unblock --help)"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--cost", "-1"}, "--cost must be 0 to 999999999999999"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--lease", "1s"}, "--lease does not apply to fixed_window"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--id", "a"}, "--id does not apply to fixed_window"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--release"}, "--release does not apply to fixed_window"},
		// refunds
		{[]string{"call", "token_bucket", "k", "--capacity", "5", "--rate", "1", "--period", "1s", "--refund", "-1"}, "--refund must be 0 to 999999999999999"},
		{[]string{"call", "token_bucket", "k", "--capacity", "5", "--rate", "1", "--period", "1s", "--refund", "1", "--cost", "2"}, "--cost does not go with --refund"},
		{[]string{"call", "token_bucket", "k", "--capacity", "5", "--rate", "1", "--period", "1s", "--refund", "1", "--peek"}, "--peek does not go with --refund"},
		{[]string{"call", "token_bucket", "k", "--capacity", "5", "--rate", "1", "--period", "1s", "--refund", "1", "--reserve", "1"}, "--reserve does not go with --refund"},
		{[]string{"call", "token_bucket", "k", "--capacity", "5", "--rate", "1", "--period", "1s", "--refund", "1", "--also", "fixed_window,limit=1,window=1s"}, "--also does not go with --refund"},
		// concurrency
		{[]string{"call", "concurrency", "k", "--limit", "5"}, "concurrency needs --lease"},
		{[]string{"call", "concurrency", "k", "--lease", "1s"}, "concurrency needs --limit"},
		{[]string{"call", "concurrency", "k", "--limit", "5", "--lease", "1s", "--window", "1s"}, "--window does not apply to concurrency"},
		{[]string{"call", "concurrency", "k", "--limit", "5", "--lease", "1s", "--cost", "2"}, "--cost does not apply to concurrency"},
		{[]string{"call", "concurrency", "k", "--limit", "5", "--lease", "1s", "--peek"}, "--peek does not apply to concurrency"},
		{[]string{"call", "concurrency", "k", "--limit", "5", "--lease", "1s", "--refund", "1"}, "--refund does not apply to concurrency"},
		{[]string{"call", "concurrency", "k", "--limit", "5", "--lease", "1s", "--release"}, "--release needs --id"},
		{[]string{"call", "concurrency", "k", "--limit", "5", "--lease", "1s", "--release", "--id", "a", "--critical"}, "--critical does not go with --release"},
		{[]string{"call", "concurrency", "k", "--limit", "5", "--lease", "1s", "--id", strings.Repeat("x", 129)}, "--id must be 1 to 128 bytes"},
		{[]string{"call", "concurrency", "k", "--limit", "5", "--lease", "1s", "--reserve", "6"}, "--reserve must be from 0 to 5, got 6"},
		{[]string{"call", "sliding_window", "k", "--limit", "999999999999999", "--window", "1h"}, "--limit * --window in milliseconds must be below 2^53"},
		{[]string{"call", "token_bucket", "k", "--capacity", "999999999999999", "--rate", "7", "--period", "1s"}, "--capacity * --period in microseconds / gcd(--rate, --period in microseconds) must be below 2^53"},
		{[]string{"call", "concurrency", "k", "--limit", "5", "--lease", "1s", "--release", "--id"}, "flag needs an argument: -id"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--name"}, "flag needs an argument: -name"},
		{[]string{"call", "concurrency", "k", "--limit", "5", "--lease", "1s", "--also", "fixed_window,limit=1,window=1s"}, "--also does not apply to concurrency"},
		// several limits
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "bogus,limit=1"}, `--also bogus,limit=1: unknown algorithm "bogus"`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "token_bucket,capacity=1,rate=1"}, "token_bucket needs period="},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "token_bucket,capacity=1,rate=1,period=1s,window=1s"}, "window= does not apply to token_bucket"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "fixed_window,limit=x,window=1s"}, `limit= "x" is not a decimal integer`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "fixed_window,limit=1,window=1s,foo=1"}, `unknown field "foo"`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "fixed_window,limit=1,limit=2,window=1s"}, "limit given twice"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "fixed_window,limit"}, `"limit" is not field=value`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "leaky_bucket,capacity=1,rate=1,period=1s,mode=drip"}, `mode= is police or shape, not "drip"`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "concurrency,limit=1,lease=1s"}, "concurrency leases are not part of a decision on several limits"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "fixed_window,limit=1,window=1m"}, "is the limiter of rule 1 (rl:{k}:fixed_window): give one a name"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "fixed_window,limit=1,window=0s"}, "--also fixed_window,limit=1,window=0s: window= must be at least 1ms, got 0s"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "fixed_window,key=,limit=1,window=1s"}, "key= is empty"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "fixed_window,name=t,limit=1,window=1s,cost=0"}, `cost= must be a decimal integer from 1 up (the call's --cost when left out), got "0"`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "fixed_window,name=t,limit=1,window=1s,cost=2,cost=3"}, "cost given twice"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "fixed_window,name=t,limit=1,window=1s,cost=-1"}, `got "-1"`},
		{append([]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s"}, manyAlso(16)...), "--also fixed_window,name=16,limit=1,window=1s: more than 16 limits for key k"},
		// --policy takes httplimit's names, which hold no ':' (the key would be ambiguous)
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--policy", "my api"}, `call: --policy "my api": httplimit names hold letters, digits, '_', '.' and '-' only`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--policy", "a:b"}, `--policy "a:b": httplimit names hold letters`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--policy", ""}, "--policy is empty: give the Name of the httplimit Policy (or Rule)"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "fixed_window,policy=a b,limit=1,window=1h"}, `policy= "a b": httplimit names hold letters`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "fixed_window,policy=a,policy=b,limit=1,window=1h"}, "policy given twice"},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1s", "--policy", "api", "--also", "fixed_window,limit=1,window=1h"}, "is the limiter of rule 1 (rl:{api:k}:fixed_window): give one a name"},
		{[]string{"status", "--bogus"}, "flag provided but not defined: -bogus (see rlfn status --help)"},
		{[]string{"--bogus", "status"}, "flag provided but not defined: -bogus (see rlfn --help)"},
		{[]string{"--url", "http://127.0.0.1:1", "status"}, "scheme"},
		{[]string{"--url", "127.0.0.1:7442", "status"}, `URL "127.0.0.1:7442" has no scheme: write redis://HOST:PORT`},
		{[]string{"--url", "redis://127.0.0.1:1", "--tls-ca", "ca.pem", "status"}, "--tls-ca needs a rediss://"},
		{[]string{"status", "extra"}, "status: takes no arguments"},
		{[]string{"deploy", "--parallel", "0"}, "--parallel must be at least 1"},
		// 0 would be taken for the default (10s): a script meaning "do not wait" must not
		// get a deploy that waits.
		{[]string{"deploy", "--yes", "--verify-timeout", "0s"}, "deploy: --verify-timeout must be positive, got 0s"},
		{[]string{"deploy", "--yes", "--verify-timeout", "-1s"}, "deploy: --verify-timeout must be positive, got -1s"},
		{[]string{"--timeout", "30s", "deploy", "--yes", "--verify-timeout", "1m"}, "deploy: --verify-timeout 1m0s must be shorter than --timeout 30s, which bounds the whole deploy: raise --timeout too"},
		{[]string{"diff", "--to", "0.0.1"}, "--to 0.0.1: no such release"},
		{[]string{"bogus"}, `no command "bogus"; there are versions, status, diff, deploy, call, block, unblock, override, reset, inspect, top, playground, reconcile (see rlfn --help)`},
		{[]string{"stat", "--json"}, `no command "stat"`},
		{[]string{"help", "bogus"}, `no command "bogus"`},
		{[]string{"help", "status", "deploy"}, "help takes one command"},
		{[]string{"--", "bogus"}, `no command "bogus"`},
		{[]string{"--timeout", "0s", "versions"}, "--timeout must be positive"},
		// A global flag missing its value (an empty $URL in a script) names the flag.
		{[]string{"deploy", "--url"}, "flag needs an argument: --url (see rlfn deploy --help)"},
		{[]string{"deploy", "--yes", "--url"}, "flag needs an argument: --url (see rlfn deploy --help)"},
		{[]string{"deploy", "--timeout"}, "flag needs an argument: --timeout (see rlfn deploy --help)"},
		{[]string{"status", "--json", "--tls-ca"}, "flag needs an argument: --tls-ca (see rlfn status --help)"},
		{[]string{"--url", "deploy"}, "flag needs an argument: --url (see rlfn deploy --help)"},
		{[]string{"--timeout", "deploy"}, "flag needs an argument: --timeout (see rlfn deploy --help)"},
		{[]string{"--url"}, "flag needs an argument: --url (see rlfn --help)"},
		// Numbers are decimal, as the library reads them: 08 is eight (the deploy dials),
		// 0x10 is no number.
		{[]string{"deploy", "--yes", "--parallel", "0x10"}, `--parallel "0x10" is not a decimal integer`},
		{[]string{"deploy", "--yes", "--parallel", "08"}, "connection refused"},
		// Every integer flag and --also field is decimal: 010 is ten (see TestCallDecimal),
		// and what is not a decimal integer is refused, naming the flag.
		{[]string{"call", "fixed_window", "k", "--limit", "0x10", "--window", "1m"}, `--limit "0x10" is not a decimal integer`},
		{[]string{"call", "fixed_window", "k", "--limit", "0o10", "--window", "1m"}, `--limit "0o10" is not a decimal integer`},
		{[]string{"call", "fixed_window", "k", "--limit", "1_000", "--window", "1m"}, `--limit "1_000" is not a decimal integer`},
		{[]string{"call", "fixed_window", "k", "--limit", "1e3", "--window", "1m"}, `--limit "1e3" is not a decimal integer`},
		{[]string{"call", "fixed_window", "k", "--limit", "99999999999999999999", "--window", "1m"}, `--limit "99999999999999999999" is out of range`},
		{[]string{"call", "token_bucket", "k", "--capacity", "0x10", "--rate", "1", "--period", "1s"}, `--capacity "0x10" is not a decimal integer`},
		{[]string{"call", "token_bucket", "k", "--capacity", "10", "--rate", "0b1", "--period", "1s"}, `--rate "0b1" is not a decimal integer`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1m", "--reserve", "0x1"}, `--reserve "0x1" is not a decimal integer`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1m", "--cost", "0x1"}, `--cost "0x1" is not a decimal integer`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1m", "--refund", "0x1"}, `--refund "0x1" is not a decimal integer`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1m", "--repeat", "0x2"}, `--repeat "0x2" is not a decimal integer`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1m", "--also", "token_bucket,capacity=0x10,rate=1,period=1s"}, `--also token_bucket,capacity=0x10,rate=1,period=1s: capacity= "0x10" is not a decimal integer`},
		{[]string{"call", "fixed_window", "k", "--limit", "5", "--window", "1m", "--also", "fixed_window,name=h,limit=1e3,window=1h"}, `limit= "1e3" is not a decimal integer`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.give, " "), func(t *testing.T) {
			r := rlfn(t, nil, append([]string{"--url", "redis://127.0.0.1:1"}, tt.give...)...)
			if r.code != exitError {
				t.Errorf("exit %d, want %d", r.code, exitError)
			}
			if !strings.Contains(r.stderr, tt.want) {
				t.Errorf("stderr %q does not contain %q", r.stderr, tt.want)
			}
			if lines := strings.Count(strings.TrimSpace(r.stderr), "\n") + 1; lines != 1 {
				t.Errorf("want one line on stderr; got %q", r.stderr)
			}
			// Nothing on stdout, where a script expects the command's output; with --json,
			// the error as JSON.
			if _, asJSON := jsonRequested(New(), append([]string{"rlfn"}, tt.give...)); asJSON {
				wantErrorJSON(t, r)
			} else if r.stdout != "" {
				t.Errorf("want nothing on stdout; got %q", r.stdout)
			}
		})
	}
}

// manyAlso is n --also specs of distinct fixed windows for the call's key.
func manyAlso(n int) []string {
	var args []string
	for i := range n {
		args = append(args, "--also", fmt.Sprintf("fixed_window,name=%d,limit=1,window=1s", i+1))
	}
	return args
}

func TestUnreachable(t *testing.T) {
	for _, cmd := range [][]string{{"status"}, {"diff"}, {"deploy", "--yes"}, {"call", "fixed_window", "k", "--limit", "1", "--window", "1s"}} {
		r := rlfn(t, nil, append([]string{"--url", "redis://127.0.0.1:1", "--timeout", "5s"}, cmd...)...)
		lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
		if r.code != exitError || len(lines) != 1 || !strings.Contains(r.stderr, "127.0.0.1:1") {
			t.Errorf("rlfn %v against a closed port: exit %d, stderr %q; want exit 1 and one line naming the node", cmd, r.code, r.stderr)
		}
	}
}

// TestJSONOnFailure: a --json command that fails before printing its JSON (a node it cannot
// reach, a mistake in the command line) prints the error as one JSON object on stdout, where
// the script reads, with the exit code; stderr still has the one line. Without --json stdout
// stays empty.
func TestJSONOnFailure(t *testing.T) {
	url := []string{"--url", "redis://127.0.0.1:1", "--timeout", "5s"}
	for _, cmd := range [][]string{
		{"status", "--json"},
		{"diff", "--json"},
		{"diff", "--json", "--exit-code"},
		{"deploy", "--yes", "--json"},
		{"deploy", "--dry-run", "--json"},
		{"call", "fixed_window", "k", "--limit", "1", "--window", "1s", "--json"},
		{"call", "--json", "fixed_window", "k", "--limit", "1", "--window", "1s", "--repeat", "3"},
		// mistakes: in the command's flags, its arguments, a global flag, before any dial
		{"status", "--json", "extra"},
		{"versions", "--json", "extra"},
		{"deploy", "--json=true", "--parallel", "0"},
		{"status", "--json", "--bogus"},
		{"diff", "--json", "--to", "0.0.1"},
		{"call", "token_bucket", "k", "--json", "--capacity", "0", "--rate", "1", "--period", "1s"},
		{"--timeout", "0s", "status", "--json"},
		{"--accept-warning", "bogus", "status", "--json"},
		{"status", "--json", "--url"},
	} {
		args := append(append([]string{}, url...), cmd...)
		r := rlfn(t, nil, args...)
		if r.code != exitError || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("rlfn %v: exit %d, stderr %q; want exit 1 and one line", cmd, r.code, r.stderr)
		}
		wantErrorJSON(t, r)

		var plain []string
		for _, a := range args {
			if !strings.HasPrefix(a, "--json") {
				plain = append(plain, a)
			}
		}
		if r := rlfn(t, nil, plain...); r.code != exitError || r.stdout != "" {
			t.Errorf("rlfn %v: exit %d, stdout %q; want exit 1 and nothing on stdout", plain, r.code, r.stdout)
		}
	}
	// --json=false, or "--json" as a flag's value or a key, asks for no JSON.
	for _, cmd := range [][]string{
		{"status", "--json=false"},
		{"call", "fixed_window", "--limit", "1", "--window", "1s", "--", "--json"},
		{"call", "fixed_window", "k", "--limit", "1", "--window", "1s", "--prefix", "--json"},
	} {
		if r := rlfn(t, nil, append(append([]string{}, url...), cmd...)...); r.code != exitError || r.stdout != "" {
			t.Errorf("rlfn %v: exit %d, stdout %q; want exit 1 and nothing on stdout", cmd, r.code, r.stdout)
		}
	}
}

// wantErrorJSON checks that r's stdout is exactly one error object holding r's stderr line
// and exit code.
func wantErrorJSON(t *testing.T, r result) {
	t.Helper()
	var got map[string]any
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	if err := dec.Decode(&got); err != nil || dec.More() {
		t.Errorf("stdout %q is not one JSON object (%v); stderr %q", r.stdout, err, r.stderr)
		return
	}
	msg := strings.TrimPrefix(strings.TrimSpace(r.stderr), "rlfn: ")
	if len(got) != 2 || got["error"] != msg || got["exit"] != float64(r.code) {
		t.Errorf("stdout %q, want {\"error\": %q, \"exit\": %d}", r.stdout, msg, r.code)
	}
}

func TestPermute(t *testing.T) {
	app := New()
	tests := []struct {
		give, want string
	}{
		{"rlfn", "rlfn"},
		{"rlfn versions", "rlfn versions"},
		{"rlfn call token_bucket user:42 --capacity 10 --json", "rlfn call --capacity 10 --json -- token_bucket user:42"},
		{"rlfn --url redis://x:1 call a k --peek --limit 3", "rlfn --url redis://x:1 call --peek --limit 3 -- a k"},
		{"rlfn --json=false call a --limit=3 k", "rlfn --json=false call --limit=3 -- a k"},
		{"rlfn call a -- -k --limit", "rlfn call -- a -k --limit"},
		{"rlfn call --limit 3 a k", "rlfn call --limit 3 -- a k"},
		{"rlfn call a k --also fixed_window,key=k=1,limit=3 --release", "rlfn call --also fixed_window,key=k=1,limit=3 --release -- a k"},
		{"rlfn bogus --x y", "error"},
		{"rlfn help", "rlfn --help"},
		{"rlfn --url redis://x:1 help status", "rlfn --url redis://x:1 status --help"},
		{"rlfn status --url redis://x:1 --json", "rlfn --url redis://x:1 status --json"},
		{"rlfn --timeout 1s call a k --url=redis://x:1 --limit 3", "rlfn --timeout 1s --url=redis://x:1 call --limit 3 -- a k"},
		{"rlfn call a k --release --id", "rlfn call --release --id"},
		// A global flag without its value is an error, wherever it is written.
		{"rlfn --url", "error"},
		{"rlfn deploy --yes --url", "error"},
		{"rlfn --url deploy", "error"},
		{"rlfn --url status deploy", "rlfn --url status deploy"},
		// A subcommand's flags follow its arguments too; global flags go before the command
		// wherever they are written.
		{"rlfn override set token_bucket k --capacity 5 --url redis://x:1", "rlfn --url redis://x:1 override set --capacity 5 -- token_bucket k"},
		{"rlfn override --url redis://x:1 list --json", "rlfn --url redis://x:1 override list --json"},
		{"rlfn override --url=redis://x:1 --timeout 1s get token_bucket k", "rlfn --url=redis://x:1 --timeout 1s override get -- token_bucket k"},
		{"rlfn override list --url", "error"},
		{"rlfn override --url", "error"},
	}
	for _, tt := range tests {
		args, err := permute(app, strings.Fields(tt.give))
		got := strings.Join(args, " ")
		if err != nil {
			got = "error"
		}
		if got != tt.want {
			t.Errorf("permute(%q) = %q (%v), want %q", tt.give, got, err, tt.want)
		}
	}
}

// TestCallValidatesFirst: in every mode call checks its limits before dialling. Against a port
// nothing listens on, each invalid limit fails with its own message, never a dial error; the
// same call with a valid limit gets as far as dialling, so the check is not one of the mode's.
func TestCallValidatesFirst(t *testing.T) {
	tests := []struct {
		name    string
		give    []string // a valid call of the mode
		invalid []string // appended, makes one of its limits invalid
		want    string
	}{
		{"allow", []string{"fixed_window", "k", "--limit", "5", "--window", "1s"}, []string{"--reserve", "6"}, "--reserve must be from 0 to 5, got 6"},
		{"peek", []string{"sliding_window", "k", "--limit", "5", "--window", "1s", "--peek"}, []string{"--cost", "1000000000000000"}, "--cost must be 0 to"},
		{"critical", []string{"sliding_log", "k", "--limit", "5", "--window", "1s", "--critical"}, []string{"--window", "1500us"}, "--window must be a whole number of milliseconds"},
		{"refund", []string{"token_bucket", "k", "--capacity", "5", "--rate", "1", "--period", "1s", "--refund", "1"}, []string{"--rate", "0"}, "--rate must be"},
		{"shape", []string{"leaky_bucket", "k", "--capacity", "5", "--rate", "1", "--period", "1s", "--mode", "shape"}, []string{"--period", "0s"}, "--period must be"},
		{"acquire", []string{"concurrency", "k", "--limit", "2", "--lease", "1s"}, []string{"--lease", "0s"}, "--lease must be"},
		{"renew", []string{"concurrency", "k", "--limit", "2", "--lease", "1s", "--id", "w"}, []string{"--limit", "0"}, "--limit must be from 1"},
		{"release", []string{"concurrency", "k", "--limit", "2", "--lease", "1s", "--id", "w", "--release"}, []string{"--reserve", "3"}, "--reserve must be from 0 to 2, got 3"},
		{"also", []string{"fixed_window", "k", "--limit", "5", "--window", "1s", "--also", "token_bucket,key=g,capacity=5,rate=1,period=1s"},
			[]string{"--also", "sliding_log,key=g,limit=5,window=1s,reserve=9"}, "--also sliding_log,key=g,limit=5,window=1s,reserve=9: reserve= must be from 0 to 5, got 9"},
		{"also peek", []string{"fixed_window", "k", "--limit", "5", "--window", "1s", "--peek", "--also", "token_bucket,name=b,capacity=5,rate=1,period=1s"},
			[]string{"--also", "leaky_bucket,name=l,capacity=0,rate=1,period=1s"}, "capacity= must be"},
	}
	url := []string{"--url", "redis://127.0.0.1:1", "--timeout", "5s", "call"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rlfn(t, nil, append(append(url, tt.give...), "--json")...)
			if r.code != exitError || !strings.Contains(r.stderr, "127.0.0.1:1") || !strings.Contains(r.stderr, "connection refused") {
				t.Fatalf("the valid call: exit %d, stderr %q; want a dial error", r.code, r.stderr)
			}
			r = rlfn(t, nil, append(append(append(url, tt.give...), tt.invalid...), "--json")...)
			if r.code != exitError || !strings.Contains(r.stderr, tt.want) || strings.Contains(r.stderr, "127.0.0.1:1") {
				t.Errorf("with %v: exit %d, stdout %q, stderr %q; want exit 1 and %q, before dialling", tt.invalid, r.code, r.stdout, r.stderr, tt.want)
			}
			wantErrorJSON(t, r)
		})
	}
}

// TestTimeoutBoundsConnecting: a server that accepts the connection and never answers (a
// hung process, a proxy without its backend) holds a command only for --timeout, not for
// the dial's or the handshake's own defaults: exit 1, one line naming it. The bound is loose
// (a tenth of the 2m default): this is about returning at all, not about speed.
func TestTimeoutBoundsConnecting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // read nothing, answer nothing
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	}()
	addr := ln.Addr().String()
	for _, cmd := range [][]string{{"status"}, {"deploy", "--yes"}, {"call", "fixed_window", "k", "--limit", "1", "--window", "1s"}} {
		began := time.Now()
		r := rlfn(t, nil, append([]string{"--url", "redis://" + addr, "--timeout", "500ms"}, cmd...)...)
		took := time.Since(began)
		if r.code != exitError || !strings.Contains(r.stderr, addr) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("rlfn %v against a server that never answers: exit %d, stderr %q; want exit 1 and one line naming it", cmd, r.code, r.stderr)
		}
		if took > defaultTimeout/10 {
			t.Errorf("rlfn %v --timeout 500ms took %s", cmd, took)
		}
		if !strings.Contains(r.stderr, "(--timeout 500ms ran out: raise it)") {
			t.Errorf("rlfn %v: stderr %q does not say that --timeout ran out", cmd, r.stderr)
		}
	}
}

// The client's errors carry no CLI advice: rlfn adds "run rlfn deploy" to those a deploy fixes,
// wherever they are wrapped, and to no other.
func TestDeployAdvice(t *testing.T) {
	for _, tt := range []struct {
		give error
		want string
	}{
		{client.ErrNotLoaded, " (run rlfn deploy)"},
		{&placedError{where: "127.0.0.1:6379 (k)", err: client.ErrNotLoaded}, " (run rlfn deploy)"},
		{&client.VersionError{Node: "10.0.0.1:6379", Version: "1.0.0", Want: "1.1.0"}, " (run rlfn deploy)"},
		{fmt.Errorf("call: %w", &client.VersionError{Node: "10.0.0.1:6379", Version: "2.0.0", Want: "1"}), " (run rlfn deploy)"},
		{&client.KeyError{Len: 0}, ""},
		{errors.New("dial tcp: connection refused"), ""},
	} {
		if got := deployAdvice(tt.give); got != tt.want {
			t.Errorf("deployAdvice(%v) = %q, want %q", tt.give, got, tt.want)
		}
	}
}
