package versions_test

import (
	"errors"
	"testing"
	"testing/fstest"

	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/versions"
)

// released pins every release's SHA-256: a release is immutable once published, because
// deployers identify what a server runs by its exact code. Add a line per new release; never
// edit one.
var released = map[string]string{
	"1.0.0": "7681155c0bad9197639da26f95be963fb227a3476d3eae1e8647502854cedaff",
	"1.1.0": "6cd490f81c943136056a54222ea6ee63d1be6f0f09d64993a1a8f7b9c8153421",
	"1.2.0": "2c4365d46260f314d02188af1482ee81da6f63803911f5b054b50b68a8caf861",
	"1.3.0": "d1ad84b9786e43967c7040cfe776112381895bef97021b0e7d70fd8f3fd7289d",
}

func TestReleasesAreImmutable(t *testing.T) {
	set := versions.Embedded()
	seen := map[string]bool{}
	for _, r := range set {
		want, ok := released[r.Version]
		if !ok {
			t.Errorf("release %s is not pinned in released: add its SHA-256 %s", r.Version, r.SHA256())
			continue
		}
		if got := r.SHA256(); got != want {
			t.Errorf("release %s changed: SHA-256 %s, pinned %s; releases are immutable, declare a new version instead", r.Version, got, want)
		}
		seen[r.Version] = true
	}
	for v := range released {
		if !seen[v] {
			t.Errorf("pinned release %s is missing from versions/", v)
		}
	}
}

func TestWorkingCopyIsLatestOrNewer(t *testing.T) {
	latest := versions.Embedded().Latest()
	v, err := versions.Declared(functions.Source)
	if err != nil {
		t.Fatalf("functions/ratelimit.lua: %v", err)
	}
	switch c := versions.Compare(v, latest.Version); {
	case c < 0:
		t.Errorf("working copy declares %s, older than the latest release %s", v, latest.Version)
	case c == 0 && functions.Source != latest.Code:
		t.Errorf("working copy declares %s but differs from release %s: declare a newer version", v, latest.Version)
	}
}

func TestLoad(t *testing.T) {
	code := func(v string) *fstest.MapFile {
		return &fstest.MapFile{Data: []byte("#!lua name=ratelimit\nlocal VERSION = '" + v + "'\n")}
	}
	tests := []struct {
		name    string
		give    fstest.MapFS
		want    []string
		wantErr bool
	}{
		{
			name: "sorted by semantic version, not by name",
			give: fstest.MapFS{
				"1.10.0/ratelimit.lua": code("1.10.0"),
				"1.2.0/ratelimit.lua":  code("1.2.0"),
				"1.0.0/ratelimit.lua":  code("1.0.0"),
				"README.md":            &fstest.MapFile{Data: []byte("ignored")},
			},
			want: []string{"1.0.0", "1.2.0", "1.10.0"},
		},
		{name: "declaration disagrees with folder", give: fstest.MapFS{"1.0.0/ratelimit.lua": code("1.0.1")}, wantErr: true},
		{name: "folder is not a version", give: fstest.MapFS{"latest/ratelimit.lua": code("1.0.0")}, wantErr: true},
		{name: "prerelease folder", give: fstest.MapFS{"1.0.0-rc1/ratelimit.lua": code("1.0.0")}, wantErr: true},
		{name: "no declaration", give: fstest.MapFS{"1.0.0/ratelimit.lua": &fstest.MapFile{Data: []byte("x")}}, wantErr: true},
		{name: "missing file", give: fstest.MapFS{"1.0.0/other.lua": code("1.0.0")}, wantErr: true},
		{name: "empty", give: fstest.MapFS{}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, err := versions.Load(tt.give)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			var got []string
			for _, r := range set {
				got = append(got, r.Version)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("versions = %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("versions = %v, want %v", got, tt.want)
				}
			}
		})
	}
}

func TestIdentify(t *testing.T) {
	set := versions.Embedded()
	latest := set.Latest()
	if r, ok := set.Identify(latest.Code); !ok || r.Version != latest.Version {
		t.Errorf("Identify(latest code) = %v, %v", r.Version, ok)
	}
	if _, ok := set.Identify(latest.Code + "\n-- edited on a server\n"); ok {
		t.Error("Identify accepted drifted code")
	}
	if _, ok := set.Find("0.0.1"); ok {
		t.Error("Find found a version that was never released")
	}
}

func TestDeclared(t *testing.T) {
	tests := []struct {
		give    string
		want    string
		wantErr error
	}{
		{give: "local VERSION = '1.2.3'\n", want: "1.2.3"},
		{give: "-- local VERSION = '9.9.9'\nlocal VERSION = '1.0.0'\n", want: "1.0.0"},
		{give: "local VERSION = \"1.2.3\"\n", wantErr: versions.ErrNoVersion},
		{give: "local VERSION = '1.2'\n", wantErr: versions.ErrNoVersion},
	}
	for _, tt := range tests {
		got, err := versions.Declared(tt.give)
		if !errors.Is(err, tt.wantErr) || got != tt.want {
			t.Errorf("Declared(%q) = %q, %v; want %q, %v", tt.give, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestCompare(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"1.0.0", "1.0.0", 0},
		{"1.0.0", "1.0.1", -1},
		{"1.10.0", "1.9.9", 1},
		{"2.0.0", "1.99.99", 1},
	}
	for _, tt := range tests {
		if got := versions.Compare(tt.a, tt.b); got != tt.want {
			t.Errorf("Compare(%s, %s) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
	for give, want := range map[string]string{"1.2.3": "1", "10.0.0": "10", "": "", "garbage": ""} {
		if got := versions.Major(give); got != want {
			t.Errorf("Major(%q) = %q, want %q", give, got, want)
		}
	}
}
