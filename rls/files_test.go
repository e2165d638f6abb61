package rls_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/internal/envoyconf"
	"github.com/rlfn/rlfn/rls"
)

// A Kubernetes ConfigMap volume: the files are links through ..data to a directory that an
// update replaces by swapping the ..data link. The swap is a reload; a bad update is not.
func TestWatchConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	version := func(name, cfg string) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "config.yaml"), []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	cfg := func(n string) string {
		return "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: " + n + "}\n"
	}
	version("..v1", cfg("1"))
	if err := os.Symlink(filepath.Join("..data", "config.yaml"), filepath.Join(dir, "config.yaml")); err != nil {
		t.Fatal(err)
	}
	svc := watch(t, rls.Files{Paths: []string{dir}})
	limit := func() uint32 {
		return svc.Config().Match("d", []envoyconf.Entry{{Key: "k", Value: "v"}}).Limit.Limits[0].RequestsPerUnit
	}
	version("..v2", cfg("2"))
	eventually(t, func() bool { return limit() == 2 })
	version("..v3", cfg("-1"))
	time.Sleep(200 * time.Millisecond)
	if limit() != 2 {
		t.Fatalf("a bad update replaced the configuration: %d", limit())
	}
	version("..v4", cfg("4"))
	eventually(t, func() bool { return limit() == 4 })
}

// watch serves files' configuration from a Service without limiters, and reloads it as
// Watch does until the test ends.
func watch(t *testing.T, files rls.Files) *rls.Service {
	t.Helper()
	c, err := files.Load()
	if err != nil {
		t.Fatal(err)
	}
	svc := rls.NewService(nil, c, rls.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rls.Watch(ctx, files, svc, nil, nil, 20*time.Millisecond) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	time.Sleep(100 * time.Millisecond) // the watcher is set up
	return svc
}

// A change to a file Load does not read (a neighbour of a file given by name, an editor's
// swap file, a file in a dot directory) reloads nothing; a change to one it reads (in a
// directory given, any file but a dot one) does.
func TestWatchIgnoresOtherFiles(t *testing.T) {
	fileDir, dir := t.TempDir(), t.TempDir()
	write := func(path, s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	file := filepath.Join(fileDir, "rl.yaml")
	write(file, cfg)
	write(filepath.Join(dir, "a.yaml"), "domain: a\n")
	svc := watch(t, rls.Files{Paths: []string{file, dir}})
	c := svc.Config()
	for _, p := range []string{
		filepath.Join(fileDir, "other.yaml"), filepath.Join(fileDir, "notes.txt"),
		filepath.Join(dir, ".a.yaml.swp"), filepath.Join(dir, ".cache", "a.yaml"),
	} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		write(p, "not a configuration")
	}
	time.Sleep(200 * time.Millisecond)
	if svc.Config() != c {
		t.Fatal("a file Load does not read reloaded the configuration")
	}
	write(filepath.Join(dir, "b.yml"), "domain: b\n")
	eventually(t, func() bool { return len(svc.Config().Domains()) == 3 })
	// A directory's *.yaml files alone (without EveryFile): a new c.conf is not read.
	c = svc.Config()
	write(filepath.Join(dir, "c.conf"), "domain: c\n")
	time.Sleep(200 * time.Millisecond)
	if svc.Config() != c {
		t.Fatal("a file Load does not read (c.conf) reloaded the configuration")
	}
	write(file, cfg+"  - key: k2\n    rate_limit: {unit: second, requests_per_unit: 2}\n")
	eventually(t, func() bool { return svc.Config() != c })
}

// writeTree writes each file (a path under dir, with its directories) with its content.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func domains(c *envoyconf.Config) []string {
	d := c.Domains()
	slices.Sort(d)
	return d
}

// A directory is read as the reference's runtime loader reads it: every file, whatever its
// name, as YAML, in subdirectories too; but never a dot entry (a file, or a directory and
// everything in it).
func TestFilesReadsEveryFile(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{
		"a.yaml":            "domain: a\n",
		"limits.conf":       "domain: conf\n",
		"noext":             "domain: noext\n",
		"nested/b.yml":      "domain: b\n",
		"nested/deep/c.txt": "domain: c\n",
		".hidden.yaml":      "not: a configuration\n",
		".git/config":       "[core]\n",
		"nested/.d/d.yaml":  "domain: d\n",
	})
	c, err := rls.Files{Paths: []string{dir}, EveryFile: true}.Load()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := domains(c), []string{"a", "b", "c", "conf", "noext"}; !slices.Equal(got, want) {
		t.Fatalf("domains %v, want %v", got, want)
	}
	// A file of any name is parsed as YAML: a bad one is an error naming it.
	writeTree(t, dir, map[string]string{"nested/README.md": "# notes\n"})
	_, err = rls.Files{Paths: []string{dir}, EveryFile: true}.Load()
	var e *envoyconf.Error
	if !errors.As(err, &e) || e.File != filepath.Join(dir, "nested", "README.md") {
		t.Fatalf("a README in the directory: %v, want an error naming it", err)
	}
}

// Without EveryFile (--config), a directory's *.yaml and *.yml files alone are read, as
// rlfn-rls read them before: not an editor's leftovers, a README, nor a subdirectory's.
func TestFilesReadsYAMLAlone(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{
		"a.yaml":              "domain: a\n",
		"b.yml":               "domain: b\n",
		"a.yaml~":             "domain: a\n",
		"#a.yaml#":            "domain: a\n",
		"README.md":           "# notes\n",
		"old/a.yaml":          "domain: a\n",
		"limits.conf":         "domain: conf\n",
		"dir.yaml/inner.yaml": "domain: inner\n",
	})
	c, err := rls.Files{Paths: []string{dir}}.Load()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := domains(c), []string{"a", "b"}; !slices.Equal(got, want) {
		t.Fatalf("domains %v, want %v", got, want)
	}
}

// Files are read in a stable order: a directory's entries in name order, a subdirectory's
// files where its name sorts; the second file of a domain (without Merge) is the one named.
func TestFilesOrder(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{
		"a.yaml":   "domain: d\n",
		"b/c.yaml": "domain: d\n",
		"b.yaml":   "domain: d\n",
	})
	for range 5 {
		_, err := rls.Files{Paths: []string{dir}, EveryFile: true}.Load()
		var e *envoyconf.Error
		if !errors.As(err, &e) || e.File != filepath.Join(dir, "b", "c.yaml") {
			t.Fatalf("%v, want the duplicate domain in b/c.yaml", err)
		}
	}
}

// configMap lays out dir as a Kubernetes ConfigMap volume does (the atomic writer): the
// files in a dot directory, ..data a link to it, and at the top a link through ..data for
// each item's first path element (a file, or a directory for an item with a path in one).
func configMap(t *testing.T, dir, version string, files map[string]string) {
	t.Helper()
	writeTree(t, filepath.Join(dir, version), files)
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		top := strings.Split(name, "/")[0]
		if err := os.Symlink(filepath.Join("..data", top), filepath.Join(dir, top)); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
}

// A ConfigMap volume's files are read once each (not again through ..data or the dot
// directory), those of items in a subdirectory too (a link to a directory is followed).
func TestFilesConfigMap(t *testing.T) {
	dir := t.TempDir()
	configMap(t, dir, "..2024_01_02_03_04_05.000000001", map[string]string{
		"a.yaml":        "domain: a\n",
		"sub/b.yaml":    "domain: b\n",
		"sub/deep/c.md": "domain: c\n",
	})
	c, err := rls.Files{Paths: []string{dir}, EveryFile: true}.Load()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := domains(c), []string{"a", "b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("domains %v, want %v", got, want)
	}
}

// A link to a directory above it would read its files forever: an error.
func TestFilesLinkLoop(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"sub/a.yaml": "domain: a\n"})
	if err := os.Symlink("..", filepath.Join(dir, "sub", "up")); err != nil {
		t.Fatal(err)
	}
	if _, err := (rls.Files{Paths: []string{dir}, EveryFile: true}).Load(); err == nil || !strings.Contains(err.Error(), "loop") {
		t.Fatalf("%v, want an error for the loop", err)
	}
}

// A change in a subdirectory reloads, in one created after the watch started too, however
// deep.
func TestWatchSubdirectories(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"a.yaml": "domain: a\n", "sub/b.yaml": "domain: b\n"})
	svc := watch(t, rls.Files{Paths: []string{dir}, EveryFile: true})
	has := func(want ...string) func() bool {
		return func() bool { return slices.Equal(domains(svc.Config()), want) }
	}
	writeTree(t, dir, map[string]string{"sub/b.yaml": "domain: b2\n"})
	eventually(t, has("a", "b2"))
	writeTree(t, dir, map[string]string{"new/c.conf": "domain: c\n"})
	eventually(t, has("a", "b2", "c"))
	writeTree(t, dir, map[string]string{"new/c.conf": "domain: c2\n"})
	eventually(t, has("a", "b2", "c2"))
	writeTree(t, dir, map[string]string{"new/x/y/z/d.yaml": "domain: d\n"})
	eventually(t, has("a", "b2", "c2", "d"))
	writeTree(t, dir, map[string]string{"new/x/y/z/d.yaml": "domain: d2\n"})
	eventually(t, has("a", "b2", "c2", "d2"))
	if err := os.RemoveAll(filepath.Join(dir, "new")); err != nil {
		t.Fatal(err)
	}
	eventually(t, has("a", "b2"))
	// A directory created again where one was removed is watched again.
	writeTree(t, dir, map[string]string{"new/e.yaml": "domain: e\n"})
	eventually(t, has("a", "b2", "e"))
	writeTree(t, dir, map[string]string{"new/e.yaml": "domain: e2\n"})
	eventually(t, has("a", "b2", "e2"))
}

// An update of a ConfigMap with items in a subdirectory: its link at the top (sub ->
// ..data/sub) now leads to the new version, whose later changes are seen too.
func TestWatchConfigMapSubdirectory(t *testing.T) {
	dir := t.TempDir()
	configMap(t, dir, "..v1", map[string]string{"a.yaml": "domain: a\n", "sub/b.yaml": "domain: b\n"})
	svc := watch(t, rls.Files{Paths: []string{dir}, EveryFile: true})
	has := func(want ...string) func() bool {
		return func() bool { return slices.Equal(domains(svc.Config()), want) }
	}
	configMap(t, dir, "..v2", map[string]string{"a.yaml": "domain: a\n", "sub/b.yaml": "domain: b2\n"})
	eventually(t, has("a", "b2"))
	// Not what Kubernetes does, but what a watch of the old version would miss.
	writeTree(t, filepath.Join(dir, "..v2"), map[string]string{"sub/b.yaml": "domain: b3\n"})
	eventually(t, has("a", "b3"))
	if err := os.RemoveAll(filepath.Join(dir, "..v1")); err != nil {
		t.Fatal(err)
	}
	writeTree(t, filepath.Join(dir, "..v2"), map[string]string{"sub/b.yaml": "domain: b4\n"})
	eventually(t, has("a", "b4"))
}

// The reference's own way to deploy a version (RUNTIME_WATCH_ROOT, its default): swap the
// link RUNTIME_ROOT (/srv/runtime_data/current) to another directory. The swap reloads, and
// the new version's directory is the one watched then.
func TestWatchRootLinkSwap(t *testing.T) {
	root := t.TempDir()
	for v, d := range map[string]string{"v1": "a", "v2": "b"} {
		writeTree(t, filepath.Join(root, v), map[string]string{"ratelimit/config/rl.yaml": "domain: " + d + "\n"})
	}
	current := filepath.Join(root, "current")
	swap := func(v string) {
		t.Helper()
		tmp := filepath.Join(root, "tmp")
		if err := os.Symlink(v, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, current); err != nil {
			t.Fatal(err)
		}
	}
	swap("v1")
	svc := watch(t, rls.Files{Paths: []string{filepath.Join(current, "ratelimit", "config")}, EveryFile: true})
	has := func(want ...string) func() bool {
		return func() bool { return slices.Equal(domains(svc.Config()), want) }
	}
	swap("v2")
	eventually(t, has("b"))
	writeTree(t, filepath.Join(root, "v2"), map[string]string{"ratelimit/config/rl.yaml": "domain: b2\n"})
	eventually(t, has("b2"))
	writeTree(t, filepath.Join(root, "v1"), map[string]string{"ratelimit/config/rl.yaml": "domain: a2\n"})
	time.Sleep(200 * time.Millisecond)
	if got := domains(svc.Config()); !slices.Equal(got, []string{"b2"}) {
		t.Fatalf("domains %v after a change to the version no more in use", got)
	}
}

// The reference's runtime loader, given a directory with RUNTIME_IGNOREDOTFILES=true, reads
// what Load reads: a file of another name, one in a subdirectory, no dot file. A link to a
// directory it skips (with a warning), where Load follows it (difference 11 of
// docs/envoy.md).
func TestReferenceReadsADirectoryAsFiles(t *testing.T) {
	b := backends(t)[0]
	root := t.TempDir()
	cfg := func(domain string) string {
		return "domain: " + domain + "\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 7}\n"
	}
	cfgDir := filepath.Join(root, "ratelimit", "config")
	writeTree(t, cfgDir, map[string]string{
		"a.yaml":           cfg("a"),
		"limits.conf":      cfg("conf"),
		"nested/b.yaml":    cfg("b"),
		"nested/deep/c.md": cfg("c"),
		".hidden.yaml":     cfg("hidden"),
		".dot/d.yaml":      cfg("dot"),
	})
	writeTree(t, root, map[string]string{"elsewhere/e.yaml": cfg("linked")})
	if err := os.Symlink(filepath.Join(root, "elsewhere"), filepath.Join(cfgDir, "linked")); err != nil {
		t.Fatal(err)
	}
	ref, _ := referenceWithEnv(t, b, "", "RUNTIME_ROOT="+root, "RUNTIME_IGNOREDOTFILES=true")
	ours, err := rls.Files{Paths: []string{cfgDir}, EveryFile: true}.Load()
	if err != nil {
		t.Fatal(err)
	}
	for domain, want := range map[string]bool{"a": true, "conf": true, "b": true, "c": true, "hidden": false, "dot": false} {
		resp, err := ref.ShouldRateLimit(context.Background(), request(domain, hits(desc("k", "v"), 0)))
		if err != nil {
			t.Fatal(err)
		}
		refHas := resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() == 7
		ourHas := ours.Match(domain, []envoyconf.Entry{{Key: "k", Value: "v"}}).Limit != nil
		if refHas != want || ourHas != want {
			t.Errorf("domain %s: the reference has it %v, rlfn-rls %v, want %v", domain, refHas, ourHas, want)
		}
	}
	resp, err := ref.ShouldRateLimit(context.Background(), request("linked", hits(desc("k", "v"), 0)))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Statuses[0].GetCurrentLimit() != nil || ours.Match("linked", []envoyconf.Entry{{Key: "k", Value: "v"}}).Limit == nil {
		t.Errorf("a link to a directory: the reference reads it (%v), or rlfn-rls does not", resp.Statuses[0].GetCurrentLimit())
	}
}
