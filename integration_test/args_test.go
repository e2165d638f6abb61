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

// signature is a function's arguments: their names, a valid value for each, and which of
// them may be zero.
type signature struct {
	fn     string
	peek   bool     // fn has a no-writes twin fn_peek with the same arguments
	writer string   // the function that writes the live state bad calls must not touch (fn if empty)
	names  []string // every argument, optional trailing ones included
	valid  []string
	live   []string // the writer's arguments that keep state for minutes
	// optional is how many trailing arguments may be left out
	optional int
	zeroOK   map[string]bool
	// notNumbers are the arguments that are not integers (a mode, an id, an algorithm)
	notNumbers map[string]bool
	// extra cases beyond the per-argument ones
	bad [][]string
}

func (s signature) writes() string {
	if s.writer != "" {
		return s.writer
	}
	return s.fn
}

// limiterSig is a limiter's signature in 1.1: the 1.0 arguments, then an optional reserve.
func limiterSig(fn string, names, valid, live []string, bad ...[]string) signature {
	limit := valid[0]
	withReserve := func(r string) []string { return append(append([]string{}, valid...), r) }
	return signature{
		fn: fn, peek: true,
		names: append(append([]string{}, names...), "reserve"), valid: withReserve("0"),
		live: live, optional: 1,
		zeroOK:     map[string]bool{"cost": true, "reserve": true},
		notNumbers: map[string]bool{"mode": true},
		bad: append(bad,
			withReserve(fmt.Sprint(atoi(limit)+1)), // reserve above the limit
			withReserve("99999999999999"),
		),
	}
}

// refundSig is a refund's signature: the limiter's 1.0 arguments, no reserve.
func refundSig(alg string, names, valid, live []string, bad ...[]string) signature {
	return signature{
		fn: "rl_" + alg + "_refund", writer: "rl_" + alg,
		names: names, valid: valid, live: live,
		zeroOK:     map[string]bool{"cost": true},
		notNumbers: map[string]bool{"mode": true},
		bad:        append(bad, append(append([]string{}, valid...), "0")), // a reserve
	}
}

var (
	windowNames = []string{"limit", "window_ms", "cost"}
	bucketNames = []string{"capacity", "rate", "period_ms", "cost"}
	leakyNames  = []string{"capacity", "rate", "period_ms", "cost", "mode"}
	windowValid = []string{"10", "1000", "1"}
	windowLive  = []string{"10", "600000", "1"}
	bucketValid = []string{"10", "5", "1000", "1"}
	bucketLive  = []string{"10", "1", "600000", "1"}
	leakyValid  = []string{"10", "5", "1000", "1", "shape"}
	leakyLive   = []string{"10", "1", "600000", "1", "shape"}

	logBad     = [][]string{{"100001", "1000", "1"}} // the log holds one entry per unit
	slidingBad = [][]string{
		{"999999999999999", "100000000000", "1"}, // limit*window_ms > 2^53
		{"8796093022208", "1024", "1"},           // limit*window_ms = 2^53 exactly
	}
	bucketBad = [][]string{
		{"999999999999999", "7", "100000000000", "1"}, // exact units overflow 2^53
		{"1099511627776", "125", "1024", "1"},         // capacity*p = 2^40 * 2^13 = 2^53 exactly
	}
	leakyBad = [][]string{
		{"10", "5", "1000", "1", "POLICE"},
		{"10", "5", "1000", "1", "drop"},
		{"10", "5", "1000", "1", ""},
		{"999999999999999", "7", "100000000000", "1", "police"},
	}

	concNames = []string{"limit", "lease_ms", "id", "reserve"}
	concValid = []string{"10", "60000", "holder", "0"}
	concLive  = []string{"10", "600000", "live", "0"}
	concBad   = [][]string{
		{"10", "60000", ""},                       // an id of 0 bytes
		{"10", "60000", strings.Repeat("i", 129)}, // an id of 129 bytes
		{"10", "60000", "holder", "11"},           // reserve above the limit
		{"10", "100000000001", "holder"},          // lease_ms above 10^11
		{"10", "60000", "holder", "0", "0"},       // two too many
	}
)

func concSig(fn string) signature {
	return signature{
		fn: fn, peek: fn == "rl_concurrency", writer: "rl_concurrency",
		names: concNames, valid: concValid, live: concLive, optional: 1,
		zeroOK:     map[string]bool{"reserve": true},
		notNumbers: map[string]bool{"id": true},
		bad:        concBad,
	}
}

var signatures = []signature{
	limiterSig("rl_fixed_window", windowNames, windowValid, windowLive),
	limiterSig("rl_sliding_log", windowNames, windowValid, windowLive, logBad...),
	limiterSig("rl_sliding_window", windowNames, windowValid, windowLive, slidingBad...),
	limiterSig("rl_token_bucket", bucketNames, bucketValid, bucketLive, bucketBad...),
	limiterSig("rl_leaky_bucket", leakyNames, leakyValid, leakyLive, leakyBad...),
	refundSig("fixed_window", windowNames, windowValid, windowLive),
	refundSig("sliding_log", windowNames, windowValid, windowLive, logBad...),
	refundSig("sliding_window", windowNames, windowValid, windowLive, slidingBad...),
	refundSig("token_bucket", bucketNames, bucketValid, bucketLive, bucketBad...),
	refundSig("leaky_bucket", leakyNames, leakyValid, leakyLive, leakyBad...),
	concSig("rl_concurrency"),
	concSig("rl_concurrency_release"),
	{
		// one group on one key: a cluster routes it like any call; see multi_test.go for more keys
		fn: "rl_multi", peek: true, writer: "rl_fixed_window",
		names: []string{"algorithm", "limit", "window_ms", "cost", "reserve"},
		valid: []string{"fixed_window", "10", "1000", "1", "0"}, live: windowLive,
		zeroOK:     map[string]bool{"cost": true, "reserve": true},
		notNumbers: map[string]bool{"algorithm": true},
		bad: [][]string{
			{"concurrency", "10", "1000", "1", "0"},
			{"FIXED_WINDOW", "10", "1000", "1", "0"},
			{"", "10", "1000", "1", "0"},
			{"fixed_window", "10", "1000", "1", "11"},             // reserve above the limit
			{"token_bucket", "10", "1000", "1", "0"},              // 5 items of 6
			{"leaky_bucket", "10", "5", "1000", "1", "shape"},     // 6 items of 7
			{"leaky_bucket", "10", "5", "1000", "1", "drop", "0"}, // a bad mode
			{"sliding_log", "100001", "1000", "1", "0"},
			{"sliding_window", "8796093022208", "1024", "1", "0"},
			{"token_bucket", "999999999999999", "7", "100000000000", "1", "0"},
		},
	},
}

func atoi(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		panic(err)
	}
	return n
}

// badNumbers are refused for every numeric argument.
var badNumbers = []string{
	"-1", "-0", "abc", "", " 1", "1 ", "+1", "1.5", "1.0", "1e3", "0x10", "１",
	"1000000000000000", "99999999999999999999", "9223372036854775808", "inf", "nan",
}

type badCall struct {
	name  string
	fn    string
	key   string // the key (with live state) the call is sent to
	nkeys int
	args  []string
}

// sigKey is the key holding sig's live state under base.
func sigKey(base string, sig signature) string { return base + ":{" + sig.fn + "}" }

func badCalls(base string) []badCall {
	var calls []badCall
	for _, sig := range signatures {
		fns := []string{sig.fn}
		if sig.peek {
			fns = append(fns, sig.fn+"_peek")
		}
		for _, fn := range fns {
			add := func(name string, nkeys int, args []string) {
				calls = append(calls, badCall{name: fn + "/" + name, fn: fn, key: sigKey(base, sig), nkeys: nkeys, args: args})
			}
			add("no key", 0, sig.valid)
			add("two keys", 2, sig.valid)
			add("no arguments", 1, nil)
			add("one too many", 1, append(append([]string{}, sig.valid...), "1"))
			for i, name := range sig.names {
				if i < len(sig.names)-sig.optional {
					add("missing "+name, 1, sig.valid[:i])
				}
				if sig.notNumbers[name] {
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
				add(fmt.Sprintf("bad %d %.80v", i, args), 1, args)
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
			fcall(t, tg.c, sig.writes(), sigKey(base, sig), sig.live...)
		}
		// The library remembers argument strings it has parsed: make it remember values that
		// are valid for one argument and not for another ("0" is a valid cost, not a valid
		// limit; "100001" a valid window, not a valid sliding log limit; "11" a valid limit,
		// not a valid reserve of 10), so the refusals below prove the range is checked every
		// call, not only on first sight.
		fcall(t, tg.c, "rl_fixed_window", base+":prime", "100001", "100001", "0")
		fcall(t, tg.c, "rl_fixed_window", base+":prime11", "11", "100001", "0", "11")
		before := map[string]snapshot{}
		for _, sig := range signatures {
			key := sigKey(base, sig)
			before[key] = snap(t, tg.c, key)
			if !before[key].exists {
				t.Fatalf("%s wrote no state to protect", sig.writes())
			}
		}
		calls := badCalls(base)
		for _, bc := range calls {
			err := rawCall(tg, bc.fn, bc.key, bc.nkeys, bc.args).Error()
			if !isRLERR(err) {
				t.Errorf("%s %.200v: got %v, want an RLERR error", bc.name, bc.args, err)
			}
			if s := snap(t, tg.c, bc.key); s != before[bc.key] {
				t.Fatalf("%s %.200v changed the state", bc.name, bc.args)
			}
			if s := snap(t, tg.c, bc.key+":second"); s.exists {
				t.Fatalf("%s %.200v wrote a second key", bc.name, bc.args)
			}
		}
		if t.Failed() {
			return
		}
		t.Logf("%d bad calls refused", len(calls))
	})
}

// A key of another type is refused with RLERR, not a runtime error, and left alone (see
// foreign_test.go for keys of the right type holding something else).
func TestKeyOfAnotherType(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, sig := range signatures {
			for _, holder := range []valkey.Completed{
				tg.c.B().Hset().Key(keyFor(t)+sig.fn).FieldValue().FieldValue("a", "b").Build(),
				tg.c.B().Set().Key(keyFor(t) + sig.fn + "s").Value("not state").Build(),
				// a sorted set is the log's and the leases' type, not these members
				tg.c.B().Zadd().Key(keyFor(t)+sig.fn+"z").ScoreMember().ScoreMember(1, "a").Build(),
			} {
				key := holder.Commands()[1]
				if err := do(t, tg.c, holder).Error(); err != nil {
					t.Fatal(err)
				}
				before := snap(t, tg.c, key)
				fns := []string{sig.fn}
				if sig.peek {
					fns = append(fns, sig.fn+"_peek")
				}
				for _, fn := range fns {
					err := rawCall(tg, fn, key, 1, sig.valid).Error()
					if !isRLERR(err) {
						t.Errorf("%s on %s: got %v, want RLERR", fn, holder.Commands()[0], err)
					}
				}
				if snap(t, tg.c, key) != before {
					t.Errorf("%s changed a key of another type", sig.fn)
				}
			}
		}
	})
}

// FuzzArguments sends arbitrary arguments to every function of a real server: every reply is
// either the six-integer shape (seven for rl_multi) or an RLERR that wrote nothing; anything
// else (a Lua runtime error) is a bug. `go test` runs the seeds; `go test -fuzz FuzzArguments`
// explores. An empty last argument is left out when it is optional (a reserve), so both
// arities are explored.
func FuzzArguments(f *testing.F) {
	for i := range signatures {
		for _, args := range append([][]string{signatures[i].valid}, signatures[i].bad...) {
			a := append(append([]string{}, args...), "", "", "", "", "", "")
			f.Add(uint8(i), a[0], a[1], a[2], a[3], a[4], a[5])
		}
	}
	f.Add(uint8(3), "1", "3", "7", "0", "", "")
	f.Add(uint8(2), "999999999999999", "9", "99999999", "99999999", "", "")
	f.Add(uint8(4), "1", "999999999999999", "1", "1", "police", "1")
	f.Add(uint8(8), "1", "3", "7", "999999999999999", "", "")
	f.Add(uint8(10), "1", "1", "\x00", "1", "", "")
	f.Fuzz(func(t *testing.T, which uint8, a0, a1, a2, a3, a4, a5 string) {
		tg := fuzzTarget(t)
		sig := signatures[int(which)%len(signatures)]
		args := []string{a0, a1, a2, a3, a4, a5}[:len(sig.names)]
		if sig.optional > 0 && args[len(args)-1] == "" {
			args = args[:len(args)-1]
		}
		// A fresh key with long-lived state: the fuzzed arguments run on it (a change of
		// configuration included), and nothing expires while the test compares snapshots.
		key := keyFor(t) + sig.fn
		fcall(t, tg.c, sig.writes(), key, sig.live...)
		before := snap(t, tg.c, key)
		fns := []string{sig.fn}
		if sig.peek {
			fns = []string{sig.fn + "_peek", sig.fn}
		}
		for _, fn := range fns {
			r, err := tryAny(tg.c, strings.HasSuffix(fn, "_peek"), fn, key, args...)
			switch {
			case isRLERR(err):
				if snap(t, tg.c, key) != before {
					t.Fatalf("%s %q: RLERR after a write", fn, args)
				}
			case err != nil:
				t.Fatalf("%s %q: %v", fn, args, err)
			default:
				if r.Limit <= 0 || r.Remaining < 0 || r.RetryAfter < -1 || r.ResetAfter < 0 || r.Delay < 0 ||
					(r.Allowed && r.RetryAfter != 0) || (!r.Allowed && r.RetryAfter == 0 && !strings.HasSuffix(fn, "_release")) {
					t.Fatalf("%s %q: reply out of contract: %v", fn, args, r)
				}
			}
		}
	})
}

// tryAny calls fn on one key and decodes its reply, seven integers for rl_multi.
func tryAny(c valkey.Client, ro bool, fn, key string, args ...string) (reply, error) {
	if strings.HasPrefix(fn, "rl_multi") {
		m, err := tryMulti(c, ro, fn, []string{key}, args)
		if err == nil && m.Binding != 1 {
			err = fmt.Errorf("binding index %d of one limit", m.Binding)
		}
		return m.reply, err
	}
	return tryCall(c, ro, fn, key, args...)
}
