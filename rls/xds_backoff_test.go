package rls

import (
	"fmt"
	"testing"
	"time"
)

// The waits between reconnections to the xDS server: Factor times the one before, up to Max;
// a Factor of 1 or less keeps every wait at Initial (the reference's XDS_CLIENT_BACKOFF_RANDOM_FACTOR
// at or below 1); 0 doubles.
func TestXDSBackOff(t *testing.T) {
	for _, tc := range []struct {
		x    XDS
		want string
	}{
		{XDS{Initial: time.Second, Max: 10 * time.Second}, "[1s 2s 4s 8s 10s 10s]"},
		{XDS{Initial: time.Second, Max: 10 * time.Second, Factor: 3}, "[1s 3s 9s 10s 10s 10s]"},
		{XDS{Initial: time.Second, Max: 10 * time.Second, Factor: 1}, "[1s 1s 1s 1s 1s 1s]"},
		// The reference's default: not waits that shrink to nothing.
		{XDS{Initial: time.Second, Max: 10 * time.Second, Factor: 0.5}, "[1s 1s 1s 1s 1s 1s]"},
	} {
		b := tc.x.backOff()
		var waits []time.Duration
		for range 6 {
			waits = append(waits, b.NextBackOff())
		}
		if got := fmt.Sprint(waits); got != tc.want {
			t.Errorf("%+v: waits %s, want %s", tc.x, got, tc.want)
		}
	}
}
