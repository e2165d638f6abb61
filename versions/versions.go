// Package versions holds every released version of the ratelimit library, immutable and
// embedded, so that rlfn can identify what a server runs and deploy any release.
package versions

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"

	"golang.org/x/mod/semver"
)

// embedded holds one folder per release, named by its version, each with ratelimit.lua.
//
//go:embed */ratelimit.lua
var embedded embed.FS

// FileName is the library's file name inside each release folder.
const FileName = "ratelimit.lua"

// Release is one released version of the library.
type Release struct {
	Version string // semantic version without a "v", e.g. "1.0.0"
	Code    string // the exact source loaded with FUNCTION LOAD
}

// Major returns the major version, e.g. "1" for "1.2.3".
func (r Release) Major() string { return Major(r.Version) }

// SHA256 returns the hex SHA-256 of the code, the identity of a release.
func (r Release) SHA256() string {
	sum := sha256.Sum256([]byte(r.Code))
	return hex.EncodeToString(sum[:])
}

// ErrNoVersion is returned for library code that does not declare its version.
var ErrNoVersion = errors.New("versions: code declares no VERSION")

// versionDecl is how the library declares its version; rl_version returns this string.
var versionDecl = regexp.MustCompile(`(?m)^local VERSION = '([0-9]+\.[0-9]+\.[0-9]+)'$`)

// Declared returns the version a library's code declares.
func Declared(code string) (string, error) {
	m := versionDecl.FindStringSubmatch(code)
	if m == nil {
		return "", ErrNoVersion
	}
	return m[1], nil
}

// Valid reports whether v is a MAJOR.MINOR.PATCH version.
func Valid(v string) bool {
	return semver.IsValid("v"+v) && semver.Canonical("v"+v) == "v"+v && semver.Prerelease("v"+v) == ""
}

// Compare returns -1, 0 or +1 as version a is older than, equal to or newer than b.
func Compare(a, b string) int { return semver.Compare("v"+a, "v"+b) }

// Major returns the major version of v, e.g. "1" for "1.2.3", or "" when v is not a version
// (a server can answer anything to rl_version).
func Major(v string) string {
	if m := semver.Major("v" + v); m != "" {
		return m[1:]
	}
	return ""
}

// Set is every release of the library, oldest first.
type Set []Release

// Embedded returns the releases compiled into this binary.
func Embedded() Set {
	set, err := Load(embedded)
	if err != nil {
		// The embedded files are checked by this package's tests.
		panic(err)
	}
	return set
}

// Load reads releases from fsys, laid out as <version>/ratelimit.lua, so that an embedded
// set and a folder of test releases behave the same. Each file must declare the version of
// its folder.
func Load(fsys fs.FS) (Set, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("versions: %w", err)
	}
	var set Set
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		v := e.Name()
		if !Valid(v) {
			return nil, fmt.Errorf("versions: folder %q is not a MAJOR.MINOR.PATCH version", v)
		}
		code, err := fs.ReadFile(fsys, path.Join(v, FileName))
		if err != nil {
			return nil, fmt.Errorf("versions: %w", err)
		}
		declared, err := Declared(string(code))
		if err != nil {
			return nil, fmt.Errorf("versions: %s: %w", v, err)
		}
		if declared != v {
			return nil, fmt.Errorf("versions: %s/%s declares version %s", v, FileName, declared)
		}
		set = append(set, Release{Version: v, Code: string(code)})
	}
	if len(set) == 0 {
		return nil, errors.New("versions: no releases")
	}
	sort.Slice(set, func(i, j int) bool { return Compare(set[i].Version, set[j].Version) < 0 })
	return set, nil
}

// Latest returns the newest release.
func (s Set) Latest() Release { return s[len(s)-1] }

// Find returns the release with version v.
func (s Set) Find(v string) (Release, bool) {
	for _, r := range s {
		if r.Version == v {
			return r, true
		}
	}
	return Release{}, false
}

// Identify returns the release whose code is exactly code; false means the code matches no
// release (it drifted).
func (s Set) Identify(code string) (Release, bool) {
	for _, r := range s {
		if r.Code == code {
			return r, true
		}
	}
	return Release{}, false
}
