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
// line first. A line between two listed ones never got them (Redis 8.1: upgrade to 8.2.2).
var luaFixes = map[string][][3]int{
	"redis":  {{7, 2, 11}, {7, 4, 6}, {8, 0, 4}, {8, 2, 2}},
	"valkey": {{7, 2, 11}, {8, 0, 6}, {8, 1, 4}},
}

// luaFixedLine is, per server, the first line that came out with the fixes (Redis 8.4,
// Valkey 9.0): a line past the last one listed in luaFixes but before this one is a
// release candidate of it (Redis 8.3.x, Valkey 8.9.x), cut before the fixes, and is
// warned of as well. Only what is known fixed goes unwarned.
var luaFixedLine = map[string][2]int{
	"redis":  {8, 4},
	"valkey": {9, 0},
}

// unstableVersion is what an unstable (development branch) build of Redis or Valkey calls
// itself: it says nothing of which fixes it has.
const unstableVersion = "255.255.255"

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
	// WarnFullCoverage: a cluster node has cluster-require-full-coverage yes (Valkey's and
	// Redis's default), or would not say (CONFIG refused): while any shard has no primary,
	// it answers every call CLUSTERDOWN, so one dead shard stops rate limiting on all of
	// them (Target.Coverage).
	WarnFullCoverage = "full-coverage"
	// WarnEmptyPrimary: a cluster primary that owns no slots lacks the release the other
	// primaries run (Gaps): the keys of any slot it gets will be decided by the clients'
	// fallback until it is deployed to.
	WarnEmptyPrimary = "empty-primary"
)

// WarningIDs are every Warning.ID there is.
var WarningIDs = []string{WarnLuaSecurity, WarnLockRelease, WarnReplicaLagging, WarnFullCoverage, WarnEmptyPrimary}

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

// warnings are what a deploy does not stop for but people should know of the server. A
// Redis or Valkey whose version does not say it has the Lua security fixes is warned of:
// one below a fixed release, one on a line that never got them, and one whose version
// cannot tell (an unstable build, an unreadable version), never taken for fixed.
func (s Server) warnings() []Warning {
	fixes := luaFixes[s.Name]
	if len(fixes) == 0 {
		return nil // not told what the server is: nothing to say of its fixes
	}
	names := make([]string, len(fixes))
	for i, f := range fixes {
		names[i] = fmt.Sprintf("%d.%d.%d", f[0], f[1], f[2])
	}
	upgrade := fmt.Sprintf("upgrade to %s %s or later", s.product(), strings.Join(names, ", "))
	v, ok := parseVersion(s.Version)
	if !ok || s.Version == unstableVersion {
		version := s.Version
		if version == "" {
			version = "unknown"
		}
		return []Warning{{ID: WarnLuaSecurity, Text: fmt.Sprintf("%s version %q does not tell whether it has the Lua security fixes (CVE-2025-49844 and others): make sure it does, or %s",
			s.product(), version, upgrade)}}
	}
	if luaFixed(v, fixes, luaFixedLine[s.Name]) {
		return nil
	}
	return []Warning{{ID: WarnLuaSecurity, Text: fmt.Sprintf("%s lacks known Lua security fixes (CVE-2025-49844 and others): %s", s, upgrade)}}
}

// luaFixed reports whether version v has the fixes: at or above the fixed release of its
// own line, or on a line at or after fixedLine.
func luaFixed(v [3]int, fixes [][3]int, fixedLine [2]int) bool {
	if v[0] > fixedLine[0] || (v[0] == fixedLine[0] && v[1] >= fixedLine[1]) {
		return true
	}
	for _, fix := range fixes {
		if v[0] == fix[0] && v[1] == fix[1] {
			return !less(v, fix)
		}
	}
	return false
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
