package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
)

// TestInspectReset on a standalone Valkey 8 and Redis 7.0, and on a cluster (from a node that
// does not hold the principal's slot).
func TestInspectReset(t *testing.T) {
	t.Run("valkey8", func(t *testing.T) {
		s := harness.StartValkey(t)
		loadCode(t, s, functions.Source)
		testInspectReset(t, s.Addr, true)
	})
	t.Run("redis7.0", func(t *testing.T) {
		s := harness.StartRedis(t)
		loadCode(t, s, functions.Source)
		testInspectReset(t, s.Addr, false)
	})
	t.Run("cluster", func(t *testing.T) {
		c := harness.StartCluster(t, 3, 0)
		for _, p := range c.Primaries {
			loadCode(t, p, functions.Source)
		}
		for _, p := range c.Primaries {
			// start from a node that does not own cust:42's slot
			if n, err := p.Slots(t.Context()); err == nil && n > 0 {
				r := rlfnAt(t, nil, p.Addr, "inspect", "cust:42", "--json")
				if r.code == exitOK && strings.Contains(r.stdout, `"node": "`+p.Addr+`"`) {
					continue
				}
				testInspectReset(t, p.Addr, false)
				return
			}
		}
		t.Fatal("every primary owns cust:42's slot")
	})
}

// timestamp is a time in inspect's output, which the golden file cannot hold.
var timestamp = regexp.MustCompile(`\d{4}-\d\d-\d\dT[\d:.]+Z`)

// cells is inspect's table as the golden file holds it: cells between " | ", the TTL column
// (which counts down) and the times written as such (the JSON's are checked).
func cells(out string) string {
	var b strings.Builder
	for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		cs := regexp.MustCompile(`\s{2,}`).Split(line, -1)
		if i > 0 && len(cs) > 1 {
			cs[1] = "TTL"
		}
		b.WriteString(timestamp.ReplaceAllString(strings.Join(cs, " | "), "TIME") + "\n")
	}
	return b.String()
}

func testInspectReset(t *testing.T, addr string, goldens bool) {
	for _, args := range [][]string{
		{"call", "token_bucket", "cust:42", "--capacity", "10", "--rate", "1", "--period", "1h", "--repeat", "3"},
		{"call", "fixed_window", "cust:42", "--name", "hourly", "--limit", "5", "--window", "1h", "--repeat", "2"},
		{"call", "concurrency", "cust:42", "--limit", "2", "--lease", "1m", "--id", "job-1"},
		{"call", "calendar", "cust:42", "--limit", "100", "--period", "year", "--anchor", "2001-01-01"},
		{"call", "token_bucket", "cust:7", "--capacity", "10", "--rate", "1", "--period", "1h"},
		{"block", "cust:42", "--for", "1h"},
		{"override", "set", "token_bucket", "cust:*", "--capacity", "100", "--rate", "1", "--period", "1h"},
	} {
		wantExit(t, rlfnAt(t, nil, addr, args...), exitOK, strings.Join(args, " "))
	}
	var in inspectJSON
	jsonOf(t, addr, &in, "inspect", "cust:42")
	got := map[string]limiterJSON{}
	for _, l := range in.Limiters {
		got[l.Key] = l
	}
	bucket := got["rl:{cust:42}:token_bucket"]
	if len(in.Limiters) != 5 || bucket.State["level"] != float64(3) || bucket.Override == nil || bucket.Override.Key != "cust:*" ||
		bucket.Peek == nil || bucket.Peek.Limit != 100 || bucket.Peek.Remaining != 97 || bucket.TTLMs <= 0 {
		t.Errorf("inspect --json: %+v", in)
	}
	if fw := got["rl:{cust:42}:fixed_window:hourly"]; fw.Name != "hourly" || fw.State["count"] != float64(2) || fw.Override != nil || fw.Peek != nil {
		t.Errorf("inspect --json, the named window: %+v", fw)
	}
	if cal := got["rl:{cust:42}:calendar"]; cal.State["count"] != float64(1) || !strings.HasSuffix(cal.State["window_start"].(string), "-01-01T00:00:00Z") {
		t.Errorf("inspect --json, the calendar: %+v", cal)
	}
	if c := got["rl:{cust:42}:concurrency"]; c.State["leases"] != float64(1) {
		t.Errorf("inspect --json, the leases: %+v", c)
	}
	if b := got["rl:{cust:42}:block"]; b.State["blocked_until"] == nil {
		t.Errorf("inspect --json, the block: %+v", b)
	}
	// the code's limit of one limiter, given: peeked where no override applies
	jsonOf(t, addr, &in, "inspect", "cust:42", "fixed_window", "--name", "hourly", "--limit", "5", "--window", "1h")
	for _, l := range in.Limiters {
		switch l.Key {
		case "rl:{cust:42}:fixed_window:hourly":
			if l.Peek == nil || l.Peek.Limit != 5 || l.Peek.Remaining != 3 || !l.Peek.Allowed {
				t.Errorf("inspect with the window's limit given: %+v %+v", l, l.Peek)
			}
		case "rl:{cust:42}:token_bucket":
			if l.Peek == nil || l.Peek.Limit != 100 {
				t.Errorf("inspect with another limit given: the override's peek is gone: %+v", l)
			}
		case "rl:{cust:42}:calendar":
			if l.Peek != nil {
				t.Errorf("inspect peeked a limiter whose limit is not known: %+v", l)
			}
		}
	}
	r := rlfnAt(t, nil, addr, "inspect", "cust:42", "fixed_window", "--limit", "0", "--window", "1h")
	wantExit(t, r, exitError, "inspect with a bad limit")
	if !strings.Contains(r.stderr, "--limit must be from 1") {
		t.Errorf("inspect with a bad limit: %q", r.stderr)
	}
	if goldens {
		r := rlfnAt(t, nil, addr, "inspect", "cust:42")
		wantExit(t, r, exitOK, "inspect")
		golden(t, "inspect.golden", cells(r.stdout))
	}

	// one limiter alone, as Limiter.Reset with a limit
	var one resetJSON
	jsonOf(t, addr, &one, "reset", "cust:42", "fixed_window", "--name", "hourly")
	if len(one.Deleted) != 1 || one.Deleted[0] != "rl:{cust:42}:fixed_window:hourly" {
		t.Errorf("reset of one limiter: %+v", one)
	}
	jsonOf(t, addr, &in, "inspect", "cust:42")
	for _, l := range in.Limiters {
		if l.Key == "rl:{cust:42}:fixed_window:hourly" {
			t.Errorf("inspect after its reset: %+v", l)
		}
	}
	if len(in.Limiters) < 2 {
		t.Errorf("reset of one limiter took the others: %+v", in.Limiters)
	}
	// a limiter the principal lacks: nothing deleted, and what it has said (its block aside)
	for _, args := range [][]string{{"sliding_window"}, {"fixed_window", "--name", "daily"}} {
		r = rlfnAt(t, nil, addr, append([]string{"reset", "cust:42"}, args...)...)
		wantExit(t, r, exitOK, "reset of a limiter the principal lacks")
		want := "Nothing to reset: cust:42 has no " + strings.Join(args, "") + " state; it has: calendar, concurrency, token_bucket.\n"
		want = strings.Replace(want, "--name", ":", 1)
		if r.stdout != want {
			t.Errorf("reset cust:42 %v: %q, want %q", args, r.stdout, want)
		}
	}
	r = rlfnAt(t, nil, addr, "reset", "cust:42")
	wantExit(t, r, exitOK, "reset")
	if goldens {
		golden(t, "reset.golden", r.stdout)
	}
	jsonOf(t, addr, &in, "inspect", "cust:42")
	if len(in.Limiters) != 1 || in.Limiters[0].Algorithm != "block" {
		t.Errorf("inspect after reset: %+v; want the block alone", in.Limiters)
	}
	jsonOf(t, addr, &in, "inspect", "cust:7")
	if len(in.Limiters) != 1 {
		t.Errorf("another principal after reset: %+v", in.Limiters)
	}
	var rs resetJSON
	jsonOf(t, addr, &rs, "reset", "cust:42")
	if len(rs.Deleted) != 0 || rs.Key != "cust:42" {
		t.Errorf("reset of a principal without state --json: %+v", rs)
	}
	// a principal whose key holds SCAN's special characters matches only itself
	wantExit(t, rlfnAt(t, nil, addr, "call", "fixed_window", "a*", "--limit", "5", "--window", "1h"), exitOK, "call a*")
	wantExit(t, rlfnAt(t, nil, addr, "call", "fixed_window", "ab", "--limit", "5", "--window", "1h"), exitOK, "call ab")
	jsonOf(t, addr, &rs, "reset", "a*")
	if len(rs.Deleted) != 1 || rs.Deleted[0] != "rl:{a*}:fixed_window" {
		t.Errorf("reset a*: %+v", rs)
	}
	wantExit(t, rlfnAt(t, nil, addr, "override", "remove", "token_bucket", "cust:*"), exitOK, "override remove")
	wantExit(t, rlfnAt(t, nil, addr, "unblock", "cust:42"), exitOK, "unblock")
	r = rlfnAt(t, nil, addr, "reset")
	wantExit(t, r, exitError, "reset without KEY")
	wantExit(t, rlfnAt(t, nil, addr, "inspect", "a", "b"), exitError, "inspect of an unknown algorithm")
	wantExit(t, rlfnAt(t, nil, addr, "reset", "a", "b"), exitError, "reset of an unknown algorithm")
	wantExit(t, rlfnAt(t, nil, addr, "reset", "a", "fixed_window", "c"), exitError, "reset with an extra argument")
	wantExit(t, rlfnAt(t, nil, addr, "reset", "a", "--name", "n"), exitError, "reset --name without ALGORITHM")
}
