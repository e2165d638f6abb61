package harness

import (
	"testing"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
)

// NewLimiter is client.New with options the test chose: an error is the test's bug, and fails
// it.
func NewLimiter(t testing.TB, vk valkey.Client, opts ...client.Option) *client.Limiter {
	t.Helper()
	lim, err := client.New(vk, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return lim
}
