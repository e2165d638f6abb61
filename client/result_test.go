package client

import (
	"testing"
	"time"
)

// retryAfterMs is the library's retry_after_ms, as traces record it: whole milliseconds, -1
// for Never.
func TestRetryAfterMs(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want int64
	}{{0, 0}, {1500 * time.Millisecond, 1500}, {Never, -1}} {
		if got := retryAfterMs(tt.d); got != tt.want {
			t.Errorf("retryAfterMs(%s) = %d, want %d", tt.d, got, tt.want)
		}
	}
}
