package deployer

import (
	"fmt"
	"strconv"
	"strings"
)

// Server is what INFO server says a node is.
type Server struct {
	Name    string // "valkey" or "redis"; "" when not told
	Version string // e.g. "8.0.1"
}

// String is e.g. "Valkey 8.0.1" or "Redis 7.0.15"; "" when not told.
func (s Server) String() string {
	if s.Name == "" {
		return ""
	}
	return s.product() + " " + s.Version
}

// product is the server's name as its makers write it.
func (s Server) product() string {
	switch s.Name {
	case "valkey":
		return "Valkey"
	case "redis":
		return "Redis"
	}
	return s.Name
}

// parseServer reads INFO server. Valkey says server_name:valkey and valkey_version (its
// redis_version is a compatibility constant, 7.2.4); Redis says only redis_version.
func parseServer(info string) Server {
	if v := infoField(info, "valkey_version"); v != "" {
		return Server{Name: "valkey", Version: v}
	}
	if v := infoField(info, "redis_version"); v != "" {
		name := infoField(info, "server_name")
		if name == "" {
			name = "redis"
		}
		return Server{Name: name, Version: v}
	}
	return Server{}
}

// needs is what rlfn needs of a server, for messages about one that falls short.
const needs = "rlfn needs Redis 7.0 or later, or Valkey 7.2 or later, with FUNCTION and FCALL enabled and the Lua engine"

// unsupported says why a server cannot run Functions as far as its version tells; "" when
// it can (or its version is not known).
func (s Server) unsupported() string {
	if s.Name == "redis" && versionLess(s.Version, 7, 0, 0) {
		return s.String() + " has no Functions (they came with Redis 7.0)"
	}
	return ""
}

// luaFixes are, per server, the first release of each line with the Lua security fixes
// of October 2025 (CVE-2025-49844, CVE-2025-46817, CVE-2025-46818, CVE-2025-46819), oldest
// line first. A line between two listed ones never got them (Redis 8.1: upgrade to 8.2.2);
// a line after the last listed one came out with them (Redis 8.4, Valkey 9.0).
var luaFixes = map[string][][3]int{
	"redis":  {{7, 2, 11}, {7, 4, 6}, {8, 0, 4}, {8, 2, 2}},
	"valkey": {{7, 2, 11}, {8, 0, 6}, {8, 1, 4}},
}

// Warning IDs: a warning's kind, stable, so that a script can accept the ones it has
// reviewed (rlfn --accept-warning) while any other still fails it.
const (
	// WarnLuaSecurity: the server lacks known Lua security fixes.
	WarnLuaSecurity = "lua-security"
	// WarnLockRelease: a deploy could not release its lock; the lease runs out by itself.
	WarnLockRelease = "lock-release"
	// WarnReplicaLagging: a replica runs other code than its primary, which a deploy does
	// not load (Plan.Lagging); a deploy ends with it OutcomeLagging unless it catches up.
	WarnReplicaLagging = "replica-lagging"
)

// WarningIDs are every Warning.ID there is.
var WarningIDs = []string{WarnLuaSecurity, WarnLockRelease, WarnReplicaLagging}

// Warning is a problem that does not stop a deploy, but that people should act on.
type Warning struct {
	ID   string // one of WarningIDs
	Addr string // the node it is about; "" when the text names it
	Text string // for people, one line, without the address
}

// String is e.g. "127.0.0.1:7001: Valkey 8.0.1 lacks known Lua security fixes (...)
// [lua-security]".
func (w Warning) String() string {
	s := w.Text + " [" + w.ID + "]"
	if w.Addr != "" {
		s = w.Addr + ": " + s
	}
	return s
}

// warnings are what a deploy does not stop for but people should know of the server.
func (s Server) warnings() []Warning {
	fixes := luaFixes[s.Name]
	v, ok := parseVersion(s.Version)
	if len(fixes) == 0 || !ok {
		return nil
	}
	missing := true
	for i, fix := range fixes {
		sameLine := v[0] == fix[0] && v[1] == fix[1]
		last := i == len(fixes)-1
		if (sameLine && !less(v, fix)) || (last && !less(v, fix)) {
			missing = false
		}
	}
	if !missing {
		return nil
	}
	names := make([]string, len(fixes))
	for i, f := range fixes {
		names[i] = fmt.Sprintf("%d.%d.%d", f[0], f[1], f[2])
	}
	return []Warning{{ID: WarnLuaSecurity, Text: fmt.Sprintf("%s lacks known Lua security fixes (CVE-2025-49844 and others): upgrade to %s %s or later",
		s, s.product(), strings.Join(names, ", "))}}
}

// parseVersion reads "major.minor.patch" (missing parts are 0).
func parseVersion(s string) ([3]int, bool) {
	var v [3]int
	parts := strings.SplitN(s, ".", 3)
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return v, false
		}
		v[i] = n
	}
	return v, s != ""
}

func less(a, b [3]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// versionLess reports whether version s is known and below major.minor.patch.
func versionLess(s string, major, minor, patch int) bool {
	v, ok := parseVersion(s)
	return ok && less(v, [3]int{major, minor, patch})
}
