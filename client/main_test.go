package client_test

import (
	"log/slog"
	"os"
	"testing"
)

// TestMain silences the Limiter's notices (Options.Logger's default, slog.Default): the tests
// that read them pass a Logger of their own. A notice names its node, which a mock client
// would be asked for (Nodes) by tests that expect no such call.
func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.DiscardHandler))
	os.Exit(m.Run())
}
