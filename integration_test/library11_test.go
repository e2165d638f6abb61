package integration_test

import (
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// Helpers for the functions release 1.1.0 adds: reserve, refunds, leases and rl_multi.

// withReserve appends a reserve to a limiter's 1.0 arguments.
func withReserve(args []string, reserve int64) []string {
	return append(append([]string{}, args...), itoa(reserve)...)
}

// alg is a limiter's algorithm name, as rl_multi groups and refunds name it.
func alg(l limiter) string { return strings.TrimPrefix(l.fn, "rl_") }

func refundFn(l limiter) string { return l.fn + "_refund" }

// group is one rl_multi group: the algorithm's name and all of its arguments, reserve included.
func group(l limiter, limit, cost, reserve int64) []string {
	return append([]string{alg(l)}, withReserve(l.args(limit, cost), reserve)...)
}

// tagKeys returns n fresh keys in one cluster slot.
func tagKeys(t testing.TB, n int) []string {
	base := keyFor(t)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "{" + base + "}:" + itoa(int64(i + 1))[0]
	}
	return keys
}

// timed runs a call and returns the client-clock instants it was sent and answered: the
// server decided between them.
func timed(f func() reply) (r reply, sent, received time.Time) {
	sent = time.Now()
	r = f()
	return r, sent, time.Now()
}

// checkTTL holds a key to the TTL rule: it expires no earlier than the call's reset_after_ms
// and at most 1000ms after it; a reset_after_ms of 0 means the key is gone.
func checkTTL(t testing.TB, c valkey.Client, key string, r reply, sent, received time.Time) {
	t.Helper()
	s := snap(t, c, key)
	if r.ResetAfter == 0 {
		if s.exists {
			t.Fatalf("%s: reset_after 0 but the key exists (expiry %d)", key, s.expiry)
		}
		return
	}
	if !s.exists {
		t.Fatalf("%s: reset_after %d but the key is gone", key, r.ResetAfter)
	}
	if lo := sent.UnixMilli() + r.ResetAfter; s.expiry < lo {
		t.Fatalf("%s expires at %d, before the call's earliest time + reset_after %d (%v)", key, s.expiry, lo, r)
	}
	if hi := received.UnixMilli() + r.ResetAfter + 1000; s.expiry > hi {
		t.Fatalf("%s expires at %d, more than 1000ms after the call's latest time + reset_after %d (%v)", key, s.expiry, hi, r)
	}
}

// within fails unless lo <= got <= hi.
func within(t testing.TB, what string, got, lo, hi int64) {
	t.Helper()
	if got < lo || got > hi {
		t.Fatalf("%s = %d, want %d..%d", what, got, lo, hi)
	}
}

// ceilDiv is a / b rounded up, for non-negative a.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// The peeks 1.1.0 adds run on replicas with FCALL_RO, like the limiters' peeks; the
// functions that write are refused there.
func TestNewPeeksRunOnAReplica(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		roomInWindow(t, tg.c, 60_000, 2*time.Second)
		keys := tagKeys(t, 3)
		fcall(t, tg.c, "rl_concurrency", keys[0], leaseArgs(3, 60_000, "a")...)
		fcall(t, tg.c, fixedSlow.fn, keys[1], fixedSlow.args(10, 4)...)
		rep := tg.replicaFor(t, keys[0])
		waitReplicated(t, rep, keys[0])
		waitReplicated(t, rep, keys[1])
		if p, err := rep.peek("rl_concurrency_peek", keys[0], leaseArgs(3, 60_000, "b")...); err != nil || !p.Allowed || p.Remaining != 2 {
			t.Fatalf("rl_concurrency_peek on the replica %s: %v, %v", rep.addr, p, err)
		}
		m, err := decodeMulti(rep.do(rep.c.B().FcallRo().Function("rl_multi_peek").Numkeys(2).Key(keys[1:]...).
			Arg(append(group(fixedSlow, 10, 1, 0), group(tokenSlow, 8, 1, 0)...)...).Build()))
		if err != nil || !m.Allowed || m.Binding != 1 || m.Remaining != 6 {
			t.Fatalf("rl_multi_peek on the replica %s: %v, %v", rep.addr, m, err)
		}
		for _, c := range []struct {
			fn   string
			args []string
		}{
			{"rl_concurrency", leaseArgs(3, 60_000, "b")},
			{"rl_concurrency_release", leaseArgs(3, 60_000, "a")},
			{refundFn(fixedSlow), fixedSlow.args(10, 1)},
		} {
			if _, err := rep.call(c.fn, keys[0], c.args...); err == nil {
				t.Errorf("a replica accepted %s", c.fn)
			}
		}
	})
}
