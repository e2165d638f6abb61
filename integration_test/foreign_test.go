package integration_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// family is the functions that share one algorithm's state.
type family struct {
	kind  string   // the state it owns: see holder.kind
	fns   []string // its functions; a name ending in _peek is called with FCALL_RO
	args  []string // valid arguments for every one of them
	group []string // its rl_multi group, if it has one
}

var families = []family{
	{"fixed", []string{"rl_fixed_window", "rl_fixed_window_peek", "rl_fixed_window_refund"}, windowLive, nil},
	{"sliding", []string{"rl_sliding_window", "rl_sliding_window_peek", "rl_sliding_window_refund"}, windowLive, nil},
	{"log", []string{"rl_sliding_log", "rl_sliding_log_peek", "rl_sliding_log_refund"}, windowLive, nil},
	{"bucket", []string{"rl_token_bucket", "rl_token_bucket_peek", "rl_token_bucket_refund"}, bucketLive, nil},
	{"bucket", []string{"rl_leaky_bucket", "rl_leaky_bucket_peek", "rl_leaky_bucket_refund"}, leakyLive, nil},
	{"lease", []string{"rl_concurrency", "rl_concurrency_peek", "rl_concurrency_release"}, concLive, nil},
}

func init() {
	for i := range families {
		if f := &families[i]; f.kind != "lease" {
			f.group = append(append([]string{strings.TrimPrefix(f.fns[0], "rl_")}, f.args...), "0")
		}
	}
}

// holder is something a key may hold; kind names the algorithm state it is, "" for none.
type holder struct {
	name string
	kind string
	make func(t testing.TB, c valkey.Client, key string)
}

func packed(fs ...float64) string {
	b := make([]byte, 0, 8*len(fs))
	for _, f := range fs {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
	}
	return string(b)
}

func setTo(v string) func(testing.TB, valkey.Client, string) {
	return func(t testing.TB, c valkey.Client, key string) {
		t.Helper()
		if err := do(t, c, c.B().Set().Key(key).Value(v).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
}

func zsetOf(members ...any) func(testing.TB, valkey.Client, string) {
	return func(t testing.TB, c valkey.Client, key string) {
		t.Helper()
		cmd := c.B().Zadd().Key(key).ScoreMember()
		for i := 0; i < len(members); i += 2 {
			cmd = cmd.ScoreMember(members[i].(float64), members[i+1].(string))
		}
		if err := do(t, c, cmd.Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
}

func stateOf(fn string, args ...string) func(testing.TB, valkey.Client, string) {
	return func(t testing.TB, c valkey.Client, key string) {
		t.Helper()
		fcall(t, c, fn, key, args...)
	}
}

func holders() []holder {
	nowMs := float64(time.Now().UnixMilli())
	nowUs := nowMs * 1000
	start := nowMs - math.Mod(nowMs, 600_000)
	nan, inf := math.NaN(), math.Inf(1)
	logEntry := packed(nowUs, 1)
	return []holder{
		{"a hash", "", func(t testing.TB, c valkey.Client, key string) {
			do(t, c, c.B().Hset().Key(key).FieldValue().FieldValue("a", "b").Build())
		}},
		{"a set", "", func(t testing.TB, c valkey.Client, key string) {
			do(t, c, c.B().Sadd().Key(key).Member("a").Build())
		}},
		{"a string", "", setTo("not state")},
		{"fixed window state", "fixed", stateOf("rl_fixed_window", windowLive...)},
		{"sliding window state", "sliding", stateOf("rl_sliding_window", windowLive...)},
		{"token bucket state", "bucket", stateOf("rl_token_bucket", bucketLive...)},
		{"leaky bucket state", "bucket", stateOf("rl_leaky_bucket", leakyLive...)},
		{"sliding log state", "log", stateOf("rl_sliding_log", windowLive...)},
		{"concurrency state", "lease", stateOf("rl_concurrency", concLive...)},
		{"16 bytes of text", "", setTo("garbage garbage!")},
		{"24 bytes of text", "", setTo("garbage garbage garbage!")},
		{"16 bytes of capitals", "", setTo("ABCDEFGHIJKLMNOP")},
		{"24 bytes of capitals", "", setTo("ABCDEFGHIJKLMNOPQRSTUVWX")},
		{"16 bytes of 0xff", "", setTo(strings.Repeat("\xff", 16))},
		{"24 bytes of 0xff", "", setTo(strings.Repeat("\xff", 24))},
		{"a fixed window of NaN", "", setTo(packed(start, nan))},
		{"a fixed window at NaN", "", setTo(packed(nan, 1))},
		{"a fixed window of Inf", "", setTo(packed(start, inf))},
		{"a fixed window at Inf", "", setTo(packed(inf, 1))},
		{"a fixed window of -1", "", setTo(packed(start, -1))},
		{"a fixed window of 1.5", "", setTo(packed(start, 1.5))},
		{"a sliding window of NaN", "", setTo(packed(start, nan, 1))},
		{"a sliding window of Inf", "", setTo(packed(start, 1, inf))},
		{"a sliding window at Inf", "", setTo(packed(inf, 1, 1))},
		{"a bucket of NaN", "", setTo(packed(nowUs, nan, 1000))},
		{"a bucket at Inf", "", setTo(packed(inf, 1, 1000))},
		{"a bucket at NaN", "", setTo(packed(nan, 1, 1000))},
		{"a bucket of Inf ticks", "", setTo(packed(nowUs, 1, inf))},
		{"a bucket of 0 ticks", "", setTo(packed(nowUs, 1, 0))},
		{"a bucket of -1", "", setTo(packed(nowUs, -1, 1000))},
		{"a bucket in 10^20 us", "", setTo(packed(1e20, 1, 1000))},
		{"a sorted set", "", zsetOf(1.0, "a")},
		// the hot path reads a log's oldest member, not its score (see log_oldest)
		{"a log entry of 1970", "", zsetOf(5.0, packed(5, 1))},
		{"a log entry numbered 0", "", zsetOf(nowUs, packed(nowUs, 0))},
		{"a log entry numbered 1.5", "", zsetOf(nowUs, packed(nowUs, 1.5))},
		{"a log entry of 15 bytes", "", zsetOf(nowUs, logEntry[:15])},
		{"a log entry at Inf", "", zsetOf(inf, packed(inf, 1))},
		{"leases without a marker", "", zsetOf(nowMs+60_000, "holder")},
		{"a marker scored 5", "", zsetOf(5.0, "", nowMs+60_000, "holder")},
		{"a marker and an endless lease", "", zsetOf(0.0, "", inf, "holder")},
	}
}

// foreignKey is a key short enough to be named in full by an error.
func foreignKey() string {
	keySeq.Lock()
	keySeq.n++
	n := keySeq.n
	keySeq.Unlock()
	return fmt.Sprintf("fs%x:%d", time.Now().UnixNano()&0xffffffffff, n)
}

// A key holding anything but a function's own state is refused with RLERR naming the key,
// and left as it was, by every function that reads that state.
func TestForeignStateIsRefused(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		refused := 0
		for _, h := range holders() {
			t.Run(h.name, func(t *testing.T) {
				for _, f := range families {
					if f.kind == h.kind {
						continue
					}
					key := foreignKey()
					h.make(t, tg.c, key)
					before := snap(t, tg.c, key)
					if !before.exists {
						t.Fatalf("%s: nothing written", h.name)
					}
					check := func(fn string, err error) {
						t.Helper()
						wantForeign(t, tg.c, fn, key, h.name, before, err)
						refused++
					}
					for _, fn := range f.fns {
						_, err := tryCall(tg.c, strings.HasSuffix(fn, "_peek"), fn, key, f.args...)
						check(fn, err)
					}
					if f.group != nil {
						for _, fn := range []string{"rl_multi", "rl_multi_peek"} {
							_, err := tryMulti(tg.c, fn == "rl_multi_peek", fn, []string{key}, f.group)
							check(fn, err)
						}
					}
				}
			})
		}
		t.Logf("%d calls on foreign state refused", refused)
	})
}

// The formats the library chose are read back as their own state (the refusals above are not
// refusing everything).
func TestOwnStateIsRead(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, h := range holders() {
			for _, f := range families {
				if f.kind != h.kind {
					continue
				}
				key := foreignKey()
				h.make(t, tg.c, key)
				for _, fn := range f.fns {
					if _, err := tryCall(tg.c, strings.HasSuffix(fn, "_peek"), fn, key, f.args...); err != nil {
						t.Errorf("%s on %s: %v", fn, h.name, err)
					}
				}
			}
		}
	})
}

// wantForeign checks fn's answer err on key, which holds foreign state of what: an RLERR
// naming fn and the key, and the key left as it was (before).
func wantForeign(t *testing.T, c valkey.Client, fn, key, what string, before snapshot, err error) {
	t.Helper()
	want := fmt.Sprintf("RLERR %s: key '%s'", fn, key)
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("%s on %s: got %v, want %s...", fn, what, err, want)
	}
	if snap(t, c, key) != before {
		t.Fatalf("%s changed %s", fn, what)
	}
}
