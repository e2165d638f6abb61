package client

import (
	"strings"
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

// A Result's one Source turns into the traces' and metrics' rlfn.source values, which stay
// what dashboards query: the fallback's name for a decision by the Fallback.
func TestSourceNames(t *testing.T) {
	for _, tt := range []struct {
		policy Fallback
		give   Source
		want   string
	}{
		{LocalFallback, FromServer, "server"},
		{FailOpen, FromFallback, "fail_open"},
		{FailClosed, FromFallback, "fail_closed"},
		{LocalFallback, FromFallback, "local_fallback"},
		{LocalFallback, FromLease, "leased"},
		{LocalFallback, FromDenialCache, "denial_cache"},
	} {
		l := &Limiter{resilience: resilience{fallback: tt.policy}}
		if got := l.source(Result{Source: tt.give}); got != tt.want {
			t.Errorf("%s under %s: rlfn.source %q, want %q", tt.give, tt.policy, got, tt.want)
		}
	}
	var got []string
	for s := FromServer; s <= FromDenialCache+1; s++ {
		got = append(got, s.String())
	}
	if s := strings.Join(got, " "); s != "server fallback lease denial_cache Source(4)" {
		t.Errorf("got %s", s)
	}
}
