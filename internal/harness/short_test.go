package harness_test

import (
	"errors"
	"testing"

	"github.com/rlfn/rlfn/internal/harness"
)

// TestShort: under -short (make unit) nothing asks Docker for a server, and a test that needs
// one skips, saying why, even when CI=true: -short is the choice of the tests that need none.
func TestShort(t *testing.T) {
	if !testing.Short() {
		t.Skip("checks go test -short; this run starts servers")
	}
	t.Setenv("CI", "true")
	if err := harness.Available(harness.ValkeyImage()); !errors.Is(err, harness.ErrShort) {
		t.Errorf("Available = %v, want ErrShort", err)
	}
	for name, end := range map[string]func(testing.TB){
		"Require":      func(t testing.TB) { harness.Require(t) },
		"StartValkey":  func(t testing.TB) { harness.StartValkey(t) },
		"StartRedis":   func(t testing.TB) { harness.StartRedis(t) },
		"StartCluster": func(t testing.TB) { harness.StartCluster(t, 1, 0) },
		"Unavailable":  func(t testing.TB) { harness.Unavailable(t, "shared servers", harness.ErrShort) },
	} {
		var skipped bool
		t.Run(name, func(t *testing.T) {
			defer func() { skipped = t.Skipped() }()
			end(t)
			t.Error("returned: a server was started")
		})
		if !skipped {
			t.Errorf("%s did not skip under -short", name)
		}
	}
}
