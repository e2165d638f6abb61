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
	switch s.Name {
	case "":
		return ""
	case "valkey":
		return "Valkey " + s.Version
	case "redis":
		return "Redis " + s.Version
	}
	return s.Name + " " + s.Version
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

// luaFixes are the first Redis releases of each line with the Lua security fixes of
// October 2025 (CVE-2025-49844, CVE-2025-46817, CVE-2025-46818, CVE-2025-46819): a line
// not listed has none and is below the next listed line's fix.
var luaFixes = [][3]int{{7, 2, 11}, {7, 4, 6}, {8, 0, 4}, {8, 2, 2}}

// warnings are what a deploy does not stop for but people should know of the server.
func (s Server) warnings() []string {
	if s.Name != "redis" {
		return nil
	}
	v, ok := parseVersion(s.Version)
	if !ok {
		return nil
	}
	missing := true
	for i, fix := range luaFixes {
		sameLine := v[0] == fix[0] && v[1] == fix[1]
		last := i == len(luaFixes)-1
		if (sameLine && !less(v, fix)) || (last && !less(v, fix)) {
			missing = false
		}
	}
	if !missing {
		return nil
	}
	return []string{fmt.Sprintf("%s lacks known Lua security fixes (CVE-2025-49844 and others): upgrade to Redis 7.2.11, 7.4.6, 8.0.4, 8.2.2 or later", s)}
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
