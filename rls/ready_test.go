package rls_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/rls"
)

// /ready is 200 once the service has a configuration, whatever the backend (the check
// fails here throughout): the readiness of replicas whose fallback decides while the backend
// is gone, which must still not serve before their first configuration over xDS.
func TestReady(t *testing.T) {
	svc := rls.NewService(func(string) *client.Limiter { return nil }, nil, rls.Options{})
	srv := rls.NewServer(svc, rls.ServerOptions{Check: func(context.Context) error { return context.DeadlineExceeded }, CheckEvery: 10 * time.Millisecond})
	_, h := serve(t, srv)
	get := func(path string) int {
		t.Helper()
		resp, err := http.Get("http://" + h.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("/ready"); code != http.StatusServiceUnavailable {
		t.Fatalf("/ready before any configuration: %d", code)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "c.yaml"), []byte("domain: d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := rls.Files{Paths: []string{dir}}.Load()
	if err != nil {
		t.Fatal(err)
	}
	svc.SetConfig(cfg)
	if code := get("/ready"); code != http.StatusOK {
		t.Fatalf("/ready with a configuration: %d", code)
	}
	if code := get("/healthcheck"); code != http.StatusServiceUnavailable {
		t.Fatalf("/healthcheck with the backend failing: %d", code)
	}
}
