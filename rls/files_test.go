package rls_test

import (
	"context"
	"os"
	"path/filepath"
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

// A directory holds more than the configuration: a change to a file Load does not read
// (a neighbour of a file given by name, an editor's swap file, a README) reloads nothing; a
// change to one it reads does.
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
		filepath.Join(dir, ".a.yaml.swp"), filepath.Join(dir, "README.md"),
	} {
		write(p, "not a configuration")
	}
	time.Sleep(200 * time.Millisecond)
	if svc.Config() != c {
		t.Fatal("a file Load does not read reloaded the configuration")
	}
	write(filepath.Join(dir, "b.yml"), "domain: b\n")
	eventually(t, func() bool { return len(svc.Config().Domains()) == 3 })
	c = svc.Config()
	write(file, cfg+"  - key: k2\n    rate_limit: {unit: second, requests_per_unit: 2}\n")
	eventually(t, func() bool { return svc.Config() != c })
}
