package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/internal/override"
)

// overrideLimiter is a service's Limiter that obeys the overrides, over a caching client of
// the nodes at addrs.
func overrideLimiter(t *testing.T, addrs ...string) *client.Limiter {
	t.Helper()
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: addrs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vk.Close)
	lim, err := client.New(vk, client.Options{Overrides: true, Fallback: client.ReturnError, Deadline: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// decides is the limit lim decides key's token bucket with after reading the overrides, and
// the override's key ("" for the code's).
func decides(t *testing.T, lim *client.Limiter, key string, limit client.Limit) (int64, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := lim.SyncOverrides(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := lim.Peek(ctx, key, limit)
	if err != nil {
		t.Fatal(err)
	}
	if res.Override == nil {
		return res.Limit, ""
	}
	return res.Limit, res.Override.Key
}

// jsonOf runs an rlfn command with --json, wants exit 0, and decodes its output into v.
func jsonOf(t *testing.T, addr string, v any, args ...string) {
	t.Helper()
	r := rlfnAt(t, nil, addr, append(args, "--json")...)
	wantExit(t, r, exitOK, strings.Join(args, " "))
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("%s --json: %v\n%s", strings.Join(args, " "), err, r.stdout)
	}
}

// TestOverrideCommands: set, get, list and remove, each seen by a service's Limiter, with
// their golden tables and JSON, on Valkey 8 and Redis 7.0.
func TestOverrideCommands(t *testing.T) {
	for _, server := range standalones {
		t.Run(server.name, func(t *testing.T) {
			s := server.start(t)
			loadCode(t, s, functions.Source)
			testOverrideCommands(t, s.Addr, []string{s.Addr})
		})
	}
}

// TestOverrideCluster: the same on a cluster, from any node: the store lives in one slot.
func TestOverrideCluster(t *testing.T) {
	c := harness.StartCluster(t, 3, 1)
	for _, p := range c.Primaries {
		loadCode(t, p, functions.Source)
	}
	testOverrideCommands(t, c.Primaries[1].Addr, c.Addrs())
	testOverrideFile(t, c.Primaries[2].Addr, c.Addrs())
}

func testOverrideCommands(t *testing.T, addr string, addrs []string) {
	lim := overrideLimiter(t, addrs...)
	code := client.Limit(client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second})
	if l, from := decides(t, lim, "cust:42", code); l != 10 || from != "" {
		t.Fatalf("before any override: limit %d from %q", l, from)
	}
	set := []string{"override", "set", "token_bucket", "cust:42", "--capacity", "500", "--rate", "50", "--period", "1s",
		"--until", "2099-01-01T00:00:00Z", "--note", "launch week"}
	r := rlfnAt(t, nil, addr, set...)
	wantExit(t, r, exitOK, "override set")
	golden(t, "override-set.golden", r.stdout)
	if l, from := decides(t, lim, "cust:42", code); l != 500 || from != "cust:42" {
		t.Errorf("after override set: limit %d from %q, want 500 from cust:42", l, from)
	}
	var ch changeJSON
	jsonOf(t, addr, &ch, "override", "set", "token_bucket", "cust:*", "--capacity", "20", "--rate", "2", "--period", "1s")
	if ch.Op != override.Add || ch.Override == nil || ch.Override.Key != "cust:*" || ch.Override.Limit.Capacity != 20 || ch.Version == "" {
		t.Errorf("override set --json: %+v", ch)
	}
	jsonOf(t, addr, &ch, "override", "set", "token_bucket", "cust:*", "--capacity", "25", "--rate", "2", "--period", "1s")
	if ch.Op != override.Update || ch.Was == nil || ch.Was.Limit.Capacity != 20 || ch.Override.Limit.Capacity != 25 {
		t.Errorf("override set over one --json: %+v", ch)
	}
	if l, from := decides(t, lim, "cust:7", code); l != 25 || from != "cust:*" {
		t.Errorf("a key of the pattern: limit %d from %q, want 25 from cust:*", l, from)
	}

	r = rlfnAt(t, nil, addr, "override", "get", "token_bucket", "cust:7")
	wantExit(t, r, exitOK, "override get")
	golden(t, "override-get.golden", r.stdout)
	var g getJSON
	jsonOf(t, addr, &g, "override", "get", "token_bucket", "cust:42")
	if g.Override == nil || g.Override.Key != "cust:42" || g.Override.Note != "launch week" {
		t.Errorf("override get --json of an exact key: %+v", g)
	}
	jsonOf(t, addr, &g, "override", "get", "token_bucket", "svc:1")
	if g.Override != nil {
		t.Errorf("override get --json of a key without one: %+v", g)
	}
	r = rlfnAt(t, nil, addr, "override", "get", "fixed_window", "cust:42")
	wantExit(t, r, exitOK, "override get of another policy")
	if r.stdout != "No override: fixed_window cust:42 gets the code's limit.\n" {
		t.Errorf("override get of another policy: %q", r.stdout)
	}

	r = rlfnAt(t, nil, addr, "override", "list")
	wantExit(t, r, exitOK, "override list")
	golden(t, "override-list.golden", r.stdout)
	var l listJSON
	jsonOf(t, addr, &l, "override", "list")
	if len(l.Overrides) != 2 || l.Version != "3" || l.Overrides[0].Key != "cust:*" || l.Overrides[1].Ended {
		t.Errorf("override list --json: %+v", l)
	}

	r = rlfnAt(t, nil, addr, "override", "remove", "token_bucket", "cust:42")
	wantExit(t, r, exitOK, "override remove")
	golden(t, "override-remove.golden", r.stdout)
	if l, from := decides(t, lim, "cust:42", code); l != 25 || from != "cust:*" {
		t.Errorf("cust:42 with its own override removed: limit %d from %q, want the pattern's 25", l, from)
	}
	var none changeJSON
	jsonOf(t, addr, &none, "override", "remove", "token_bucket", "cust:42")
	if none.Override != nil || none.Op != "" {
		t.Errorf("override remove of none --json: %+v", none)
	}
	jsonOf(t, addr, &ch, "override", "remove", "token_bucket", "cust:*")
	if ch.Op != override.Remove || ch.Override == nil || ch.Override.Key != "cust:*" {
		t.Errorf("override remove --json: %+v", ch)
	}
	if l, from := decides(t, lim, "cust:42", code); l != 10 || from != "" {
		t.Errorf("every override removed: limit %d from %q, want the code's 10", l, from)
	}
	r = rlfnAt(t, nil, addr, "override", "list")
	if wantExit(t, r, exitOK, "override list of none"); r.stdout != "No overrides: every key gets the code's limits.\n" {
		t.Errorf("override list of none: %q", r.stdout)
	}

	// --policy, --name, --for: an httplimit policy's named limit, for a while.
	jsonOf(t, addr, &ch, "override", "set", "fixed_window", "*", "--policy", "api", "--name", "hourly", "--limit", "5000", "--window", "1h", "--for", "720h")
	if ch.Override == nil || ch.Override.Key != "api:*" || ch.Override.Name != "hourly" || time.Until(ch.Override.Until) < 719*time.Hour {
		t.Errorf("override set --policy --name --for: %+v", ch.Override)
	}
	hourly := client.Limit(client.FixedWindow{Limit: 100, Window: time.Hour, Name: "hourly"})
	if l, from := decides(t, lim, "api:alice", hourly); l != 5000 || from != "api:*" {
		t.Errorf("the policy's named limit: %d from %q", l, from)
	}
	jsonOf(t, addr, &ch, "override", "remove", "fixed_window", "*", "--policy", "api", "--name", "hourly")
}

// TestOverrideFile: overrides as code, on a standalone Valkey (a cluster in TestOverrideCluster).
func TestOverrideFile(t *testing.T) {
	s := harness.StartValkey(t)
	loadCode(t, s, functions.Source)
	testOverrideFile(t, s.Addr, []string{s.Addr})
}

func testOverrideFile(t *testing.T, addr string, addrs []string) {
	t.Setenv("NO_COLOR", "1")
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	lim := overrideLimiter(t, addrs...)
	code := client.Limit(client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second})
	first := write("first.json", `{"overrides": [
  {"algorithm": "token_bucket", "key": "cust:42", "limit": {"capacity": 500, "rate": 50, "period": "1s"}, "until": "2099-01-01T00:00:00Z", "note": "launch"},
  {"algorithm": "token_bucket", "key": "cust:*", "limit": {"capacity": 20, "rate": 2, "period": "1s"}},
  {"algorithm": "calendar", "name": "monthly", "key": "cust:42", "limit": {"limit": 100000, "period": "month", "anchor": "2026-01-31", "zone": "Europe/Berlin"}}
]}`)
	r := rlfnAt(t, nil, addr, "override", "diff", first, "--exit-code")
	wantExit(t, r, exitPending, "override diff --exit-code of a new file")
	golden(t, "override-diff.golden", r.stdout)
	r = rlfnAt(t, nil, addr, "override", "apply", first)
	wantExit(t, r, exitError, "override apply without --yes nor a terminal")
	if !strings.Contains(r.stderr, "no terminal to confirm on") {
		t.Errorf("apply without --yes: %q", r.stderr)
	}
	r = rlfnAt(t, nil, addr, "override", "apply", first, "--dry-run")
	wantExit(t, r, exitOK, "override apply --dry-run")
	if l, from := decides(t, lim, "cust:42", code); l != 10 || from != "" {
		t.Fatalf("after a dry run and an unconfirmed apply: limit %d from %q, want nothing applied", l, from)
	}
	r = rlfnAt(t, nil, addr, "override", "apply", first, "--yes")
	wantExit(t, r, exitOK, "override apply --yes")
	golden(t, "override-apply.golden", r.stdout)
	if l, from := decides(t, lim, "cust:42", code); l != 500 || from != "cust:42" {
		t.Errorf("after apply: limit %d from %q", l, from)
	}
	if l, from := decides(t, lim, "cust:42", client.Calendar{Limit: 10, Period: client.Month, Name: "monthly"}); l != 100000 || from != "cust:42" {
		t.Errorf("the calendar after apply: limit %d from %q", l, from)
	}
	r = rlfnAt(t, nil, addr, "override", "diff", first, "--exit-code")
	if wantExit(t, r, exitOK, "override diff --exit-code once applied"); r.stdout != "No changes: the server holds the file's overrides.\n" {
		t.Errorf("diff once applied: %q", r.stdout)
	}

	// a second file: one changed, one removed, one kept; JSON plan, then applied with --json
	second := write("second.json", `{"overrides": [
  {"algorithm": "token_bucket", "key": "cust:42", "limit": {"capacity": 800, "rate": 80, "period": "1s"}, "until": "2099-01-01T00:00:00Z", "note": "launch"},
  {"algorithm": "calendar", "name": "monthly", "key": "cust:42", "limit": {"limit": 100000, "period": "month", "anchor": "2026-01-31", "zone": "Europe/Berlin"}}
]}`)
	var p planJSON
	jsonOf(t, addr, &p, "override", "diff", second)
	// in ID order: cust:* before cust:42
	if len(p.Changes) != 2 || p.Changes[0].Op != override.Remove || p.Changes[0].Old.Key != "cust:*" || p.Changes[1].Op != override.Update {
		t.Errorf("override diff --json: %+v", p)
	}
	jsonOf(t, addr, &p, "override", "apply", second, "--yes")
	if !p.Applied || len(p.Changes) != 2 || p.Now == "" {
		t.Errorf("override apply --json: %+v", p)
	}
	if l, from := decides(t, lim, "cust:7", code); l != 10 || from != "" {
		t.Errorf("cust:7 with cust:* removed by the file: limit %d from %q", l, from)
	}

	// Bad files are refused before anything is written, every mistake named.
	before := listOf(t, addr)
	for _, tt := range []struct{ text, want string }{
		{`{"overrides": [{"algorithm": "token_bucket", "key": "k", "limit": {"capacity": 0, "rate": 1, "period": "1s"}}]}`, "TokenBucket.Capacity must be from 1"},
		{`{"overrides": [{"algorithm": "gcra", "key": "k", "limit": {"limit": 1}}]}`, `unknown algorithm "gcra"`},
		{`{"overrides": [{"algorithm": "fixed_window", "key": "k", "limit": {"limit": 5, "window": "1h"}, "until": "2001-01-01T00:00:00Z"}]}`, "is in the past"},
		{`{"overrides": [{"algorithm": "fixed_window", "key": "a*b", "limit": {"limit": 5, "window": "1h"}}]}`, "a '*' elsewhere never matches"},
		{`{"overrides": [{"algorithm": "fixed_window", "key": "k", "limit": {"limit": 5, "window": "1h", "capacity": 3}}]}`, "fixed_window does not take capacity"},
		{`{"overrides": [{"algorithm": "sliding_log", "key": "k", "limit": {"limit": 100001, "window": "1h"}}]}`, "SlidingLog.Limit must be from 1 to 100000"},
		{`{"overrides": [{"algorithm": "fixed_window", "key": "k", "limit": {"limit": 5, "window": "1h"}}, {"algorithm": "fixed_window", "key": "k", "limit": {"limit": 6, "window": "1h"}}]}`, "are both fixed_window k"},
		{`not json`, "invalid override"},
	} {
		for _, cmd := range []string{"diff", "apply"} {
			r := rlfnAt(t, nil, addr, "override", cmd, write("bad.json", tt.text), "--yes")
			if cmd == "diff" {
				r = rlfnAt(t, nil, addr, "override", cmd, write("bad.json", tt.text))
			}
			wantExit(t, r, exitError, "override "+cmd+" of a bad file")
			if !strings.Contains(r.stderr, tt.want) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
				t.Errorf("override %s of %s: stderr %q, want one line saying %q", cmd, tt.text, r.stderr, tt.want)
			}
		}
	}
	if after := listOf(t, addr); after != before {
		t.Errorf("the store changed under bad files:\n%s\nbefore:\n%s", after, before)
	}
}

func listOf(t *testing.T, addr string) string {
	t.Helper()
	r := rlfnAt(t, nil, addr, "override", "list", "--json")
	wantExit(t, r, exitOK, "override list --json")
	return r.stdout
}

// TestOverrideBadInput: mistakes in the command line are refused before any write (exit 1,
// one line on stderr, and the JSON error with --json), and the store is as it was.
func TestOverrideBadInput(t *testing.T) {
	s := harness.StartValkey(t)
	loadCode(t, s, functions.Source)
	wantExit(t, rlfnAt(t, nil, s.Addr, "override", "set", "fixed_window", "k", "--limit", "5", "--window", "1h"), exitOK, "a first override")
	before := listOf(t, s.Addr)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"override", "set", "gcra", "k", "--limit", "5"}, `unknown algorithm "gcra"`},
		{[]string{"override", "set", "fixed_window", "k", "--limit", "0", "--window", "1h"}, "--limit must be from 1"},
		{[]string{"override", "set", "fixed_window", "k", "--limit", "5"}, "fixed_window needs --window"},
		{[]string{"override", "set", "fixed_window", "k", "--limit", "5", "--window", "1h", "--capacity", "3"}, "--capacity does not apply to fixed_window"},
		{[]string{"override", "set", "fixed_window", "k", "--limit", "5", "--window", "1h", "--until", "2001-01-01T00:00:00Z"}, "is in the past"},
		{[]string{"override", "set", "fixed_window", "k", "--limit", "5", "--window", "1h", "--until", "tomorrow"}, `--until "tomorrow" is not a time`},
		{[]string{"override", "set", "fixed_window", "k", "--limit", "5", "--window", "1h", "--until", "2099-01-01T00:00:00Z", "--for", "1h"}, "--until and --for both"},
		{[]string{"override", "set", "fixed_window", "a*b", "--limit", "5", "--window", "1h"}, "a '*' elsewhere never matches"},
		{[]string{"override", "set", "fixed_window", "", "--limit", "5", "--window", "1h"}, "the key is empty"},
		{[]string{"override", "set", "fixed_window", "k", "--limit", "5", "--window", "1h", "--policy", "a:b"}, "httplimit names hold"},
		{[]string{"override", "set", "fixed_window", "--limit", "5", "--window", "1h"}, "needs ALGORITHM KEY"},
		{[]string{"override", "set", "leaky_bucket", "k", "--capacity", "5", "--rate", "1", "--period", "1s", "--mode", "drop"}, "--mode is police or shape"},
		{[]string{"override", "remove", "fixed_window", "k", "extra"}, `extra "extra"`},
		{[]string{"override", "list", "k"}, "takes no argument"},
		{[]string{"override", "diff"}, "needs FILE"},
		{[]string{"override", "bogus"}, `no command "bogus"; there are set, get, list, remove, diff, apply`},
		{[]string{"override", "apply", "/nonexistent/overrides.json", "--yes"}, "no such file"},
	} {
		r := rlfnAt(t, nil, s.Addr, tt.args...)
		wantExit(t, r, exitError, strings.Join(tt.args, " "))
		if !strings.Contains(r.stderr, tt.want) || r.stdout != "" {
			t.Errorf("%s: stderr %q, stdout %q; want %q", strings.Join(tt.args, " "), r.stderr, r.stdout, tt.want)
		}
		r = rlfnAt(t, nil, s.Addr, append(tt.args, "--json")...)
		wantExit(t, r, exitError, strings.Join(tt.args, " ")+" --json")
		wantErrorJSON(t, r)
	}
	if after := listOf(t, s.Addr); after != before {
		t.Errorf("the store changed under the mistakes:\n%s\nbefore:\n%s", after, before)
	}
}

// TestOverrideApplyRace: a change made between apply's read and its write refuses the
// apply (exit 3) and writes nothing of it.
func TestOverrideApplyRace(t *testing.T) {
	s := harness.StartValkey(t)
	vk := s.Client(t)
	store := override.NewStore(vk, "rl:")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	snap, err := store.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := override.Override{Policy: override.Policy{Algorithm: "fixed_window"}, Key: "a", Limit: override.Fields{Limit: 1, Window: override.Duration(time.Hour)}}
	b := a
	b.Key = "b"
	if _, err := store.Apply(ctx, []override.Change{{Op: override.Add, New: &a}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Apply(ctx, []override.Change{{Op: override.Add, New: &b}}, &snap.Version); err != override.ErrChanged {
		t.Fatalf("Apply from a stale snapshot: %v, want ErrChanged", err)
	}
	now, err := store.Read(ctx)
	if err != nil || len(now.Overrides) != 1 || now.Overrides[0].Key != "a" || now.Version != "1" {
		t.Errorf("after the refused apply: %+v, %v", now, err)
	}
	if exitCode(&refusedError{override.ErrChanged}) != exitRefused {
		t.Error("a refused apply does not exit 3")
	}
}

// TestOverrideBadField: a field of the store that holds no override (written by hand) is
// listed as such, and ignored by a service's Limiter, which still obeys the others.
func TestOverrideBadField(t *testing.T) {
	s := harness.StartValkey(t)
	loadCode(t, s, functions.Source)
	vk := s.Client(t)
	wantExit(t, rlfnAt(t, nil, s.Addr, "override", "set", "token_bucket", "k", "--capacity", "50", "--rate", "1", "--period", "1s"), exitOK, "override set")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bad := override.Override{Policy: override.Policy{Algorithm: "token_bucket"}, Key: "j", Limit: override.Fields{Capacity: 0, Rate: 1, Period: "1s"}}
	if err := vk.Do(ctx, vk.B().Hset().Key(override.DeltaKey("rl:")).FieldValue().
		FieldValue("by hand", "{").FieldValue(override.FieldOf(bad.ID()), override.Encode(bad)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	r := rlfnAt(t, nil, s.Addr, "override", "list")
	wantExit(t, r, exitOK, "override list with a bad field")
	if !strings.Contains(r.stderr, `Warning: field "by hand" of the overrides holds no override`) {
		t.Errorf("override list with a bad field: stderr %q", r.stderr)
	}
	var l listJSON
	jsonOf(t, s.Addr, &l, "override", "list")
	if len(l.Bad) != 1 || l.Bad[0].Field != "by hand" || len(l.Overrides) != 2 {
		t.Errorf("override list --json with a bad field: %+v", l)
	}
	lim := overrideLimiter(t, s.Addr)
	code := client.Limit(client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second})
	if got, from := decides(t, lim, "k", code); got != 50 || from != "k" {
		t.Errorf("k beside bad fields: limit %d from %q, want its override", got, from)
	}
	if got, from := decides(t, lim, "j", code); got != 10 || from != "" {
		t.Errorf("j, whose override does not compile: limit %d from %q, want the code's", got, from)
	}
}

// TestOverrideAtScale: the commands at a store's size: a file of more overrides than a delta
// takes is applied as a new base (all or nothing), list pages and filters, a reviewed plan is
// applied only on the version diff saved (exit 3 after a colleague's change, nothing written),
// a field that holds no override is shown and removed by apply and by remove --field, and a
// store of the earlier layout is carried over by migrate.
func TestOverrideAtScale(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	s := harness.StartValkey(t)
	vk := s.Client(t)
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString(`{"overrides": [`)
	const n = 3 * override.MaxDelta
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"algorithm": "token_bucket", "key": "cust:%04d", "limit": {"capacity": %d, "rate": 1, "period": "1s"}}`, i, 100+i)
	}
	b.WriteString("]}")
	file := filepath.Join(dir, "big.json")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// a plan of more changes than a terminal shows: the first ones and the counts; --full all
	r := rlfnAt(t, nil, s.Addr, "override", "diff", file)
	wantExit(t, r, exitOK, "override diff of a big file")
	if !strings.Contains(r.stdout, "cust:0049 ") || strings.Contains(r.stdout, "cust:0050") ||
		!strings.Contains(r.stdout, "... and 550 more changes (--full") || !strings.Contains(r.stdout, "Plan: 600 to add, 0 to change, 0 to remove.") {
		t.Errorf("override diff of %d changes:\n%s", n, r.stdout)
	}
	r = rlfnAt(t, nil, s.Addr, "override", "diff", file, "--full")
	if !strings.Contains(r.stdout, "cust:0599 ") || strings.Contains(r.stdout, "more change") {
		t.Errorf("override diff --full of %d changes:\n%s", n, r.stdout)
	}
	r = rlfnAt(t, nil, s.Addr, "override", "apply", file, "--yes")
	wantExit(t, r, exitOK, "override apply of a big file")
	if strings.Contains(r.stdout, "cust:0050") || !strings.Contains(r.stdout, "... and 550 more changes") || !strings.Contains(r.stdout, "Applied 600 changes.") {
		t.Errorf("override apply of %d changes:\n%s", n, r.stdout)
	}
	var l listJSON
	jsonOf(t, s.Addr, &l, "override", "list")
	if len(l.Overrides) != n || l.More != 0 || l.Version != "1" {
		t.Errorf("override list of %d: %d listed, %d more, version %q; want every one at version 1 (one new base)", n, len(l.Overrides), l.More, l.Version)
	}
	r = rlfnAt(t, nil, s.Addr, "override", "list", "--limit", "2", "--match", "cust:01*")
	wantExit(t, r, exitOK, "override list --limit --match")
	if !strings.Contains(r.stdout, "cust:0100 ") || !strings.Contains(r.stdout, "cust:0101 ") || strings.Contains(r.stdout, "cust:0102") ||
		!strings.Contains(r.stdout, "... and 98 more") {
		t.Errorf("override list --limit 2 --match cust:01*:\n%s", r.stdout)
	}

	// a reviewed plan, then a colleague's change: apply --if-version refuses, writes nothing
	small := filepath.Join(dir, "small.json")
	if err := os.WriteFile(small, []byte(`{"overrides": [{"algorithm": "token_bucket", "key": "x", "limit": {"capacity": 1, "rate": 1, "period": "1s"}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	saved := filepath.Join(dir, "version")
	wantExit(t, rlfnAt(t, nil, s.Addr, "override", "diff", small, "--save-version", saved), exitOK, "override diff --save-version")
	wantExit(t, rlfnAt(t, nil, s.Addr, "override", "set", "token_bucket", "vip:1", "--capacity", "5", "--rate", "1", "--period", "1s", "--note", "incident 123"), exitOK, "override set")
	r = rlfnAt(t, nil, s.Addr, "override", "apply", small, "--yes", "--if-version", "@"+saved)
	wantExit(t, r, exitRefused, "override apply --if-version after a change")
	if !strings.Contains(r.stderr, `not "1" (--if-version)`) {
		t.Errorf("apply --if-version refused: %q", r.stderr)
	}
	r = rlfnAt(t, nil, s.Addr, "override", "get", "token_bucket", "vip:1")
	if !strings.Contains(r.stdout, "incident 123") {
		t.Errorf("the colleague's change is gone:\n%s%s", r.stdout, r.stderr)
	}

	// a field that holds no override: listed, in the plan, removed by apply; by remove --field
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := vk.Do(ctx, vk.B().Hset().Key(override.DeltaKey("rl:")).FieldValue().FieldValue("by hand", "{").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// a plan summarised to its first changes shows the bad field's removal first, always
	r = rlfnAt(t, nil, s.Addr, "override", "diff", small)
	if lines := strings.Split(r.stdout, "\n"); len(lines) < 2 || !strings.HasPrefix(lines[1], "remove  -") || !strings.Contains(lines[1], "by hand") ||
		!strings.Contains(r.stdout, "... and 553 more changes") {
		t.Errorf("override diff of 603 changes, one a bad field's removal:\n%s", r.stdout)
	}
	r = rlfnAt(t, nil, s.Addr, "override", "diff", small, "--full")
	if !strings.Contains(r.stdout, "remove  -") || !strings.Contains(r.stdout, "by hand") {
		t.Errorf("override diff with a bad field:\n%s", r.stdout)
	}
	wantExit(t, rlfnAt(t, nil, s.Addr, "override", "apply", small, "--yes"), exitOK, "override apply over a bad field")
	jsonOf(t, s.Addr, &l, "override", "list")
	if len(l.Bad) != 0 || len(l.Overrides) != 1 || l.Overrides[0].Key != "x" {
		t.Errorf("after apply of small.json: %+v", l)
	}
	if err := vk.Do(ctx, vk.B().Hset().Key(override.DeltaKey("rl:")).FieldValue().FieldValue("by hand", "{").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	r = rlfnAt(t, nil, s.Addr, "override", "remove", "--field", "by hand")
	wantExit(t, r, exitOK, "override remove --field")
	jsonOf(t, s.Addr, &l, "override", "list")
	if len(l.Bad) != 0 || !strings.Contains(r.stdout, "Removed by hand, which held no override") {
		t.Errorf("after remove --field: %+v\n%s", l, r.stdout)
	}

	// a store of the earlier layout: refused with the way out, then carried over
	s2 := harness.StartValkey(t)
	vk2 := s2.Client(t)
	o := override.Override{Policy: override.Policy{Algorithm: "token_bucket"}, Key: "old:1", Limit: override.Fields{Capacity: 3, Rate: 1, Period: "1s"}}
	if err := vk2.Do(ctx, vk2.B().Hset().Key(override.Key("rl:")).FieldValue().FieldValue("version", "7").FieldValue(override.FieldOf(o.ID()), override.Encode(o)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	r = rlfnAt(t, nil, s2.Addr, "override", "list")
	wantExit(t, r, exitError, "override list of an old store")
	if !strings.Contains(r.stderr, "rlfn override migrate") {
		t.Errorf("override list of an old store: %q", r.stderr)
	}
	r = rlfnAt(t, nil, s2.Addr, "override", "migrate", "--remove-old")
	wantExit(t, r, exitOK, "override migrate")
	r = rlfnAt(t, nil, s2.Addr, "override", "get", "token_bucket", "old:1")
	if !strings.Contains(r.stdout, "capacity=3") {
		t.Errorf("old:1 after migrate:\n%s%s", r.stdout, r.stderr)
	}
	if n, _ := vk2.Do(ctx, vk2.B().Exists().Key(override.Key("rl:")).Build()).AsInt64(); n != 0 {
		t.Error("migrate --remove-old left the old hash")
	}
}
