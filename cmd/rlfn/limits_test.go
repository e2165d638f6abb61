package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/limitspec"
)

// TestCallHelpNamesTheTable: call's help is prose, written once, but it names every algorithm
// of the table, and each field's flag names exactly the algorithms that take it, so that a new
// algorithm or field cannot be missing from it.
func TestCallHelpNamesTheTable(t *testing.T) {
	cmd := callCommand()
	for _, name := range limitspec.Names() {
		if !strings.Contains(cmd.Description, name) {
			t.Errorf("call's description does not name %s", name)
		}
	}
	usage := map[string]string{}
	for _, f := range cmd.Flags {
		if u, ok := f.(interface{ GetUsage() string }); ok {
			usage[f.Names()[0]] = u.GetUsage()
		}
	}
	for _, f := range limitspec.Fields() {
		u, ok := usage[f.Name]
		if !ok {
			t.Errorf("no flag --%s", f.Name)
			continue
		}
		for _, a := range limitspec.Algorithms {
			if named := regexp.MustCompile(`\b` + a.Name + `\b`).MatchString(u); named && !a.Takes(f.Name) || !named && isOwn(a, f) {
				t.Errorf("--%s: %q; %s takes it: %v", f.Name, u, a.Name, a.Takes(f.Name))
			}
		}
	}
	for _, m := range modeNames() {
		if !strings.Contains(usage["mode"], m) {
			t.Errorf("--mode: %q does not name %s", usage["mode"], m)
		}
	}
}

// isOwn reports whether f is a field of a's own, not a shared one, which no flag lists
// algorithms for.
func isOwn(a limitspec.Algorithm, f limitspec.Field) bool {
	for _, g := range a.Fields {
		if g.Name == f.Name {
			return true
		}
	}
	return false
}

// TestMaxRulesPerKey: --also refuses before dialling what rl_multi would refuse (MAX_MULTI);
// the client's own bound is not exported.
func TestMaxRulesPerKey(t *testing.T) {
	m := regexp.MustCompile(`(?m)^local MAX_MULTI = (\d+)`).FindStringSubmatch(functions.Source)
	if m == nil {
		t.Fatal("functions/ratelimit.lua declares no MAX_MULTI")
	}
	if n, _ := strconv.Atoi(m[1]); n != maxRulesPerKey {
		t.Errorf("maxRulesPerKey = %d, the library's MAX_MULTI = %d", maxRulesPerKey, n)
	}
}

func TestOr(t *testing.T) {
	for _, c := range []struct {
		give []string
		want string
	}{{nil, ""}, {[]string{"a"}, "a"}, {[]string{"a", "b"}, "a or b"}, {[]string{"a", "b", "c"}, "a, b or c"}} {
		if got := or(c.give...); got != c.want {
			t.Errorf("or(%q) = %q, want %q", c.give, got, c.want)
		}
	}
}
