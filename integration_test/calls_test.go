package integration_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// reply is the library's six-integer answer.
type reply struct {
	Allowed    bool
	Limit      int64
	Remaining  int64
	RetryAfter int64
	ResetAfter int64
	Delay      int64
}

func (r reply) String() string {
	return fmt.Sprintf("{allowed=%v limit=%d remaining=%d retry=%d reset=%d delay=%d}",
		r.Allowed, r.Limit, r.Remaining, r.RetryAfter, r.ResetAfter, r.Delay)
}

func decode(res valkey.ValkeyResult) (reply, error) {
	arr, err := res.ToArray()
	if err != nil {
		return reply{}, err
	}
	if len(arr) != 6 {
		return reply{}, fmt.Errorf("reply has %d elements, want 6", len(arr))
	}
	var n [6]int64
	for i, m := range arr {
		if n[i], err = m.AsInt64(); err != nil {
			return reply{}, fmt.Errorf("element %d: %w", i, err)
		}
	}
	if n[0] != 0 && n[0] != 1 {
		return reply{}, fmt.Errorf("allowed = %d", n[0])
	}
	return reply{n[0] == 1, n[1], n[2], n[3], n[4], n[5]}, nil
}

// fcall runs a limiter function on key and fails the test on any error.
func fcall(t testing.TB, c valkey.Client, fn, key string, args ...string) reply {
	t.Helper()
	r, err := tryCall(c, false, fn, key, args...)
	if err != nil {
		t.Fatalf("FCALL %s %s %v: %v", fn, key, args, err)
	}
	return r
}

// fcallRO runs a function with FCALL_RO.
func fcallRO(t testing.TB, c valkey.Client, fn, key string, args ...string) reply {
	t.Helper()
	r, err := tryCall(c, true, fn, key, args...)
	if err != nil {
		t.Fatalf("FCALL_RO %s %s %v: %v", fn, key, args, err)
	}
	return r
}

func tryCall(c valkey.Client, ro bool, fn, key string, args ...string) (reply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return decode(c.Do(ctx, fcallCmd(c, ro, fn, key, args...)))
}

// fcallCmd builds FCALL (or FCALL_RO) of fn on one key.
func fcallCmd(c valkey.Client, ro bool, fn, key string, args ...string) valkey.Completed {
	if ro {
		return c.B().FcallRo().Function(fn).Numkeys(1).Key(key).Arg(args...).Build()
	}
	return c.B().Fcall().Function(fn).Numkeys(1).Key(key).Arg(args...).Build()
}

func do(t testing.TB, c valkey.Client, cmd valkey.Completed) valkey.ValkeyResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Do(ctx, cmd)
}

// serverNow returns the server's clock in microseconds: windows are aligned to it.
func serverNow(t testing.TB, c valkey.Client) int64 {
	t.Helper()
	arr, err := do(t, c, c.B().Time().Build()).AsStrSlice()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	s, _ := strconv.ParseInt(arr[0], 10, 64)
	us, _ := strconv.ParseInt(arr[1], 10, 64)
	return s*1_000_000 + us
}

// roomInWindow waits, if needed, until the current aligned window of windowMs has at least
// need left, so that a test's calls all fall in one window.
func roomInWindow(t testing.TB, c valkey.Client, windowMs int64, need time.Duration) {
	t.Helper()
	nowMs := serverNow(t, c) / 1000
	left := time.Duration(windowMs-nowMs%windowMs) * time.Millisecond
	if left < need {
		time.Sleep(left + 2*time.Millisecond)
	}
}

// atWindowStart waits until just after the start of the next aligned window.
func atWindowStart(t testing.TB, c valkey.Client, windowMs int64) {
	t.Helper()
	nowMs := serverNow(t, c) / 1000
	time.Sleep(time.Duration(windowMs-nowMs%windowMs)*time.Millisecond + 2*time.Millisecond)
}

// snapshot is everything a call could change on a key: its serialized value and its expiry.
type snapshot struct {
	dump   string
	exists bool
	expiry int64
}

func snap(t testing.TB, c valkey.Client, key string) snapshot {
	t.Helper()
	d, err := do(t, c, c.B().Dump().Key(key).Build()).ToString()
	if valkey.IsValkeyNil(err) {
		return snapshot{}
	}
	if err != nil {
		t.Fatalf("DUMP %s: %v", key, err)
	}
	exp, err := do(t, c, c.B().Pexpiretime().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatalf("PEXPIRETIME %s: %v", key, err)
	}
	return snapshot{dump: d, exists: true, expiry: exp}
}

func isRLERR(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "RLERR ")
}

func itoa(ns ...int64) []string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.FormatInt(n, 10)
	}
	return s
}
