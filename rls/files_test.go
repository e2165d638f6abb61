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
	files := rls.Files{Paths: []string{dir}}
	c, err := files.Load()
	if err != nil {
		t.Fatal(err)
	}
	svc := rls.NewService(nil, c, rls.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- rls.Watch(ctx, files, svc, nil, nil, 20*time.Millisecond) }()
	limit := func() uint32 {
		return svc.Config().Match("d", []envoyconf.Entry{{Key: "k", Value: "v"}}).Limit.Limits[0].RequestsPerUnit
	}
	time.Sleep(100 * time.Millisecond) // the watcher is set up
	version("..v2", cfg("2"))
	eventually(t, func() bool { return limit() == 2 })
	version("..v3", cfg("-1"))
	time.Sleep(200 * time.Millisecond)
	if limit() != 2 {
		t.Fatalf("a bad update replaced the configuration: %d", limit())
	}
	version("..v4", cfg("4"))
	eventually(t, func() bool { return limit() == 4 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
