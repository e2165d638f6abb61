package harness

import (
	"testing"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
)

// NewLimiter is client.New with the Options the test chose: an error is the test's bug, and fails
// it.
func NewLimiter(t testing.TB, vk valkey.Client, o client.Options) *client.Limiter {
	t.Helper()
	lim, err := client.New(vk, o)
	if err != nil {
		t.Fatal(err)
	}
	return lim
}
