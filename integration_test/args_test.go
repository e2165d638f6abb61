package integration_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// signature is a function's arguments: their names, a valid value for each, and which of
// them may be zero.
type signature struct {
	fn     string
	names  []string
	valid  []string
	live   []string // valid arguments that keep state for minutes
	zeroOK map[string]bool
	// extra cases beyond the per-argument ones
	bad [][]string
}

var signatures = []signature{
	{
		fn: "rl_fixed_window", names: []string{"limit", "window_ms", "cost"},
		valid: []string{"10", "1000", "1"}, live: []string{"10", "600000", "1"}, zeroOK: map[string]bool{"cost": true},
	},
	{
		fn: "rl_sliding_log", names: []string{"limit", "window_ms", "cost"},
		valid: []string{"10", "1000", "1"}, live: []string{"10", "600000", "1"}, zeroOK: map[string]bool{"cost": true},
		bad: [][]string{{"100001", "1000", "1"}}, // the log holds one entry per unit
	},
	{
		fn: "rl_sliding_window", names: []string{"limit", "window_ms", "cost"},
		valid: []string{"10", "1000", "1"}, live: []string{"10", "600000", "1"}, zeroOK: map[string]bool{"cost": true},
		bad: [][]string{
			{"999999999999999", "100000000000", "1"}, // limit*window_ms > 2^53
			{"8796093022208", "1024", "1"},           // limit*window_ms = 2^53 exactly
		},
	},
	{
		fn: "rl_token_bucket", names: []string{"capacity", "rate", "period_ms", "cost"},
		valid: []string{"10", "5", "1000", "1"}, live: []string{"10", "1", "600000", "1"}, zeroOK: map[string]bool{"cost": true},
		bad: [][]string{
			{"999999999999999", "7", "100000000000", "1"}, // exact units overflow 2^53
			{"1099511627776", "125", "1024", "1"},         // capacity*p = 2^40 * 2^13 = 2^53 exactly
		},
	},
	{
		fn: "rl_leaky_bucket", names: []string{"capacity", "rate", "period_ms", "cost", "mode"},
		valid: []string{"10", "5", "1000", "1", "shape"}, live: []string{"10", "1", "600000", "1", "shape"}, zeroOK: map[string]bool{"cost": true},
		bad: [][]string{
			{"10", "5", "1000", "1", "POLICE"},
			{"10", "5", "1000", "1", "drop"},
			{"10", "5", "1000", "1", ""},
			{"999999999999999", "7", "100000000000", "1", "police"},
		},
	},
}

// badNumbers are refused for every numeric argument.
var badNumbers = []string{
	"-1", "-0", "abc", "", " 1", "1 ", "+1", "1.5", "1.0", "1e3", "0x10", "１",
	"1000000000000000", "99999999999999999999", "9223372036854775808", "inf", "nan",
}

type badCall struct {
	name  string
	fn    string
	nkeys int
	args  []string
}

func badCalls() []badCall {
	var calls []badCall
	for _, sig := range signatures {
		for _, fn := range []string{sig.fn, sig.fn + "_peek"} {
			add := func(name string, nkeys int, args []string) {
				calls = append(calls, badCall{name: fn + "/" + name, fn: fn, nkeys: nkeys, args: args})
			}
			add("no key", 0, sig.valid)
			add("two keys", 2, sig.valid)
			add("no arguments", 1, nil)
			add("one too many", 1, append(append([]string{}, sig.valid...), "1"))
			for i, name := range sig.names {
				add("missing "+name, 1, sig.valid[:i])
				if name == "mode" {
					continue
				}
				with := func(v string) []string {
					args := append([]string{}, sig.valid...)
					args[i] = v
					return args
				}
				for _, v := range badNumbers {
					add(fmt.Sprintf("%s=%q", name, v), 1, with(v))
				}
				if !sig.zeroOK[name] {
					add(name+"=0", 1, with("0"))
				}
			}
			for i, args := range sig.bad {
				add(fmt.Sprintf("bad %d %v", i, args), 1, args)
			}
		}
	}
	return calls
}

// rawCall sends FCALL with nkeys keys that share a slot, so that a cluster routes it; with no
// key it goes to a primary (a cluster would send it to any node, and a replica refuses a
// writing function before it runs).
func rawCall(tg *target, fn, key string, nkeys int, args []string) valkey.ValkeyResult {
	c := tg.c
	if nkeys == 0 {
		c = tg.primary
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys := []string{key, key + ":second"}[:nkeys]
	cmd := "FCALL"
	if strings.HasSuffix(fn, "_peek") {
		cmd = "FCALL_RO"
	}
	parts := append([]string{cmd, fn, fmt.Sprint(nkeys)}, keys...)
	if nkeys == 0 {
		return c.Do(ctx, c.B().Arbitrary(parts...).Args(args...).Build())
	}
	return c.Do(ctx, c.B().Arbitrary(parts[0]).Args(parts[1:3]...).Keys(keys...).Args(args...).Build())
}

// Every bad argument of every function is answered RLERR and writes nothing, even on a key
// that already holds live state.
func TestBadArgumentsAreRefusedBeforeAnyWrite(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		base := keyFor(t)
		for _, sig := range signatures {
			key := base + ":{" + sig.fn + "}"
			fcall(t, tg.c, sig.fn, key, sig.live...)
		}
		// The library remembers argument strings it has parsed: make it remember values that
		// are valid for one argument and not for another ("0" is a valid cost, not a valid
		// limit; "100001" a valid window, not a valid sliding log limit), so the refusals below
		// prove the range is checked every call, not only on first sight.
		fcall(t, tg.c, "rl_fixed_window", base+":prime", "100001", "100001", "0")
		before := map[string]snapshot{}
		for _, sig := range signatures {
			key := base + ":{" + sig.fn + "}"
			before[key] = snap(t, tg.c, key)
			if !before[key].exists {
				t.Fatalf("%s wrote no state to protect", sig.fn)
			}
		}
		calls := badCalls()
		for _, bc := range calls {
			key := base + ":{" + strings.TrimSuffix(bc.fn, "_peek") + "}"
			err := rawCall(tg, bc.fn, key, bc.nkeys, bc.args).Error()
			if !isRLERR(err) {
				t.Errorf("%s %v: got %v, want an RLERR error", bc.name, bc.args, err)
			}
			if s := snap(t, tg.c, key); s != before[key] {
				t.Fatalf("%s %v changed the state", bc.name, bc.args)
			}
			if s := snap(t, tg.c, key+":second"); s.exists {
				t.Fatalf("%s %v wrote a second key", bc.name, bc.args)
			}
		}
		if t.Failed() {
			return
		}
		t.Logf("%d bad calls refused", len(calls))
	})
}

// A key of another type is refused with RLERR, not a runtime error, and left alone.
func TestKeyOfAnotherType(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, sig := range signatures {
			for _, holder := range []valkey.Completed{
				tg.c.B().Hset().Key(keyFor(t)+sig.fn).FieldValue().FieldValue("a", "b").Build(),
				tg.c.B().Set().Key(keyFor(t) + sig.fn + "s").Value("not state").Build(),
				tg.c.B().Zadd().Key(keyFor(t)+sig.fn+"z").ScoreMember().ScoreMember(1, "a").Build(),
			} {
				key := holder.Commands()[1]
				if err := do(t, tg.c, holder).Error(); err != nil {
					t.Fatal(err)
				}
				before := snap(t, tg.c, key)
				for _, fn := range []string{sig.fn, sig.fn + "_peek"} {
					_, err := tryCall(tg.c, strings.HasSuffix(fn, "_peek"), fn, key, sig.valid...)
					if sig.fn == "rl_sliding_log" && strings.HasSuffix(key, "z") {
						// a sorted set is the log's own type: any member is an entry
						if err != nil {
							t.Errorf("%s on a sorted set: %v", fn, err)
						}
						continue
					}
					if !isRLERR(err) {
						t.Errorf("%s on %s: got %v, want RLERR", fn, holder.Commands()[0], err)
					}
				}
				if sig.fn != "rl_sliding_log" || !strings.HasSuffix(key, "z") {
					if snap(t, tg.c, key) != before {
						t.Errorf("%s changed a key of another type", sig.fn)
					}
				}
			}
		}
	})
}

// FuzzArguments sends arbitrary arguments to every function of a real server: every reply is
// either the six-integer shape or an RLERR that wrote nothing; anything else (a Lua runtime
// error) is a bug. `go test` runs the seeds; `go test -fuzz FuzzArguments` explores.
func FuzzArguments(f *testing.F) {
	for i := range signatures {
		for _, args := range append([][]string{signatures[i].valid}, signatures[i].bad...) {
			a := append(append([]string{}, args...), "", "", "", "", "")
			f.Add(uint8(i), a[0], a[1], a[2], a[3], a[4])
		}
	}
	f.Add(uint8(3), "1", "3", "7", "0", "")
	f.Add(uint8(2), "999999999999999", "9", "99999999", "99999999", "")
	f.Add(uint8(4), "1", "999999999999999", "1", "1", "police")
	f.Fuzz(func(t *testing.T, which uint8, a0, a1, a2, a3, a4 string) {
		tg := fuzzTarget(t)
		sig := signatures[int(which)%len(signatures)]
		args := []string{a0, a1, a2, a3, a4}[:len(sig.names)]
		// A fresh key with long-lived state: the fuzzed arguments run on it (a change of
		// configuration included), and nothing expires while the test compares snapshots.
		key := keyFor(t) + sig.fn
		fcall(t, tg.c, sig.fn, key, sig.live...)
		before := snap(t, tg.c, key)
		for _, fn := range []string{sig.fn + "_peek", sig.fn} {
			r, err := tryCall(tg.c, fn != sig.fn, fn, key, args...)
			switch {
			case isRLERR(err):
				if snap(t, tg.c, key) != before {
					t.Fatalf("%s %q: RLERR after a write", fn, args)
				}
			case err != nil:
				t.Fatalf("%s %q: %v", fn, args, err)
			default:
				if r.Limit <= 0 || r.Remaining < 0 || r.RetryAfter < -1 || r.ResetAfter < 0 || r.Delay < 0 ||
					(r.Allowed && r.RetryAfter != 0) || (!r.Allowed && r.RetryAfter == 0) {
					t.Fatalf("%s %q: reply out of contract: %v", fn, args, r)
				}
			}
		}
	})
}
