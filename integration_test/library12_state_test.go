package integration_test

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/functions"
)

// What every function of release 1.2.0 keeps: flags, arguments refused before any write,
// foreign state refused, the rollback to 1.1.0.

// flags12 are the functions 1.2.0 adds, with their flags.
var flags12 = map[string][]string{
	"rl_calendar":        nil,
	"rl_calendar_peek":   {"no-writes"},
	"rl_calendar_refund": nil,
	"rl_block":           nil,
	"rl_unblock":         nil,
	"rl_block_peek":      {"no-writes"},
}

func TestFunctions12AndFlags(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		flags := functionFlags(t, tg.c)
		for fn, w := range flags12 {
			got, ok := flags[fn]
			if !ok {
				t.Errorf("%s is not registered", fn)
				continue
			}
			sort.Strings(got)
			if strings.Join(got, ",") != strings.Join(w, ",") {
				t.Errorf("%s flags %v, want %v", fn, got, w)
			}
		}
		// the peeks run on a replica; the functions that write are refused there
		t0 := serverMs(t, tg.c)
		b := boundsAround(t0, 60_000, 2, 1_000)
		keys := tagKeys(t, 2)
		fcall(t, tg.c, "rl_calendar", keys[0], calArgs(10, b, 4)...)
		fcall(t, tg.c, "rl_block", keys[1], "60000")
		rep := tg.replicaFor(t, keys[0])
		waitReplicated(t, rep, keys[0])
		waitReplicated(t, rep, keys[1])
		if p, err := rep.peek("rl_calendar_peek", keys[0], calArgs(10, b, 1)...); err != nil || !p.Allowed || p.Remaining != 6 {
			t.Fatalf("rl_calendar_peek on the replica: %v, %v", p, err)
		}
		if p, err := rep.peek("rl_block_peek", keys[1]); err != nil || p.Allowed || p.RetryAfter <= 0 {
			t.Fatalf("rl_block_peek on the replica: %v, %v", p, err)
		}
		m, err := decodeMulti(rep.do(rep.c.B().FcallRo().Function("rl_multi_peek").Numkeys(2).Key(keys[1], keys[0]).
			Arg(append(blockGroup(0), calGroup(10, b, 1, 0)...)...).Build()))
		if err != nil || m.Allowed || m.Binding != 1 {
			t.Fatalf("rl_multi_peek of a block and a calendar on the replica: %v, %v", m, err)
		}
		// Each on the key of its own kind, so that only its flags can refuse it: a function
		// without no-writes is refused by a replica (READONLY; a cluster's replica, read-only
		// for its connection, redirects it to its primary: MOVED), never by a foreign-state
		// RLERR.
		for _, c := range []struct {
			fn   string
			key  string
			args []string
		}{
			{"rl_calendar", keys[0], calArgs(10, b, 1)},
			{"rl_calendar_refund", keys[0], calArgs(10, b, 1)},
			{"rl_block", keys[1], []string{"1000"}},
			{"rl_unblock", keys[1], nil},
		} {
			_, err := rep.call(c.fn, c.key, c.args...)
			if err == nil || !strings.Contains(err.Error(), "READONLY") && !strings.HasPrefix(err.Error(), "MOVED ") {
				t.Errorf("%s on a replica: %v, want READONLY or MOVED", c.fn, err)
			}
		}
	})
}

// signatures12 are the new functions' signatures, with live state made at the server's now.
func signatures12(nowMs int64) []signature {
	b := boundsAround(nowMs, 3_600_000, 2, 1_000)
	bs := itoa(b[0], b[1], b[2], b[3])
	cal := func(limit string, b []string, cost string) []string {
		return append(append([]string{limit}, b...), cost)
	}
	valid := cal("10", bs, "1")
	calBad := [][]string{
		cal("10", []string{bs[1], bs[0], bs[2], bs[3]}, "1"),                                // b2 < b1
		cal("10", []string{bs[0], bs[0], bs[2], bs[3]}, "1"),                                // b2 = b1
		cal("10", []string{bs[0], bs[1], bs[3], bs[2]}, "1"),                                // b4 < b3
		cal("10", []string{bs[0], bs[1], bs[2], bs[2]}, "1"),                                // b4 = b3
		cal("10", itoa(b[1]-100_000_000_001, b[1], b[2], b[3]), "1"),                        // a window of 10^11 + 1 ms
		cal("10", itoa(b[0], b[1], b[2], b[2]+100_000_000_001), "1"),                        // the third too
		cal("10", itoa(b[0], b[1], b[2], 1_000_000_000_000_000), "1"),                       // b4 of 16 digits
		cal("10", itoa(b[0]-7_200_000, b[0]-3_600_000, b[0], b[1]), "1"),                    // stale: now after b4
		cal("10", itoa(b[2], b[2]+1, b[2]+2, b[2]+3), "1"),                                  // the future
		append(cal("10", bs, "1"), "11"),                                                    // reserve above the limit (the refund: a 7th argument)
		cal("10", itoa(b[0], b[1], b[2], b[3]+999_999_999_999_999-b[3]+1), "1"),             // b4 above 10^15 - 1
		cal("10", []string{"0", bs[1], bs[2], bs[3]}, "1"),                                  // b1 = 0
		cal("999999999999999", itoa(b[0], b[1], b[2], b[3]), "1000000000000000"),            // cost of 16 digits
		cal("10", []string{bs[0], bs[1], bs[2], "1" + strings.Repeat("0", 14) + "00"}, "1"), // 17 digits
	}
	calLive := cal("10", bs, "3")
	calendarSig := signature{
		fn: "rl_calendar", peek: true,
		names: []string{"limit", "b1", "b2", "b3", "b4", "cost", "reserve"}, valid: append(valid, "0"),
		live: calLive, optional: 1,
		zeroOK: map[string]bool{"cost": true, "reserve": true},
		bad:    calBad,
	}
	refundSig := signature{
		fn: "rl_calendar_refund", writer: "rl_calendar",
		names: []string{"limit", "b1", "b2", "b3", "b4", "cost"}, valid: valid, live: calLive,
		zeroOK: map[string]bool{"cost": true},
		bad:    calBad,
	}
	blockSig := signature{
		fn: "rl_block", names: []string{"duration_ms"}, valid: []string{"1000"}, live: []string{"3600000"},
		bad: [][]string{{"100000000001"}},
	}
	return []signature{
		calendarSig, refundSig, blockSig,
		{
			fn: "rl_multi", peek: true, writer: "rl_calendar", live: calLive,
			names:      []string{"algorithm", "limit", "b1", "b2", "b3", "b4", "cost", "reserve"},
			valid:      append(append([]string{"calendar"}, valid...), "0"),
			zeroOK:     map[string]bool{"cost": true, "reserve": true},
			notNumbers: map[string]bool{"algorithm": true},
			bad: [][]string{
				append([]string{"calendar"}, valid...),                   // 7 items of 8
				append(append([]string{"calendar"}, valid...), "0", "0"), // 9
				append(append([]string{"calendar"}, calBad[0]...), "0"),
				append(append([]string{"calendar"}, calBad[4]...), "0"),
				append(append([]string{"calendar"}, calBad[7]...), "0"),
				append(append([]string{"calendar"}, calBad[8]...), "0"),
				append(append([]string{"calendar"}, valid...), "11"),
				{"block", "1000"},         // a block only
				{"block"},                 // without its penalty
				{"block", "-1"},           // a bad penalty
				{"block", "100000000001"}, // above 10^11
				{"CALENDAR", "10", bs[0], bs[1], bs[2], bs[3], "1", "0"},
			},
		},
	}
}

// Every bad argument of every new function is RLERR naming the function, and writes nothing,
// even on a key holding live state.
func TestNewFunctionsRefuseBadArgumentsBeforeAnyWrite(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		base := keyFor(t)
		sigs := signatures12(serverMs(t, tg.c))
		before := map[string]snapshot{}
		for _, sig := range sigs {
			key := sigKey(base, sig)
			fcall(t, tg.c, sig.writes(), key, sig.live...)
			before[key] = snap(t, tg.c, key)
		}
		n := 0
		for _, bc := range badCallsOf(base, sigs) {
			err := rawCall(tg, bc.fn, bc.key, bc.nkeys, bc.args).Error()
			if !isRLERR(err) || !namesFunction(err, bc.fn) {
				t.Errorf("%s %.200v: got %v, want RLERR %s...", bc.name, bc.args, err, bc.fn)
			}
			if s := snap(t, tg.c, bc.key); s != before[bc.key] {
				t.Fatalf("%s %.200v changed the state", bc.name, bc.args)
			}
			if s := snap(t, tg.c, bc.key+":second"); s.exists {
				t.Fatalf("%s %.200v wrote a second key", bc.name, bc.args)
			}
			n++
		}
		t.Logf("%d bad calls refused", n)
	})
}

// namesFunction reports whether an RLERR starts with the function's name.
func namesFunction(err error, fn string) bool {
	msg := strings.TrimPrefix(err.Error(), "RLERR ")
	return strings.HasPrefix(msg, fn+":") || strings.HasPrefix(msg, fn+" ")
}

// Every RLERR names its function, the 1.0 and 1.1 ones' value errors included ("rl_fixed_window:
// limit must be ...").
func TestEveryRLERRNamesItsFunction(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		base := keyFor(t)
		n := 0
		for _, bc := range badCalls(base) {
			err := rawCall(tg, bc.fn, bc.key, bc.nkeys, bc.args).Error()
			if !isRLERR(err) || !namesFunction(err, bc.fn) {
				t.Errorf("%s %.200v: got %v, want RLERR %s...", bc.name, bc.args, err, bc.fn)
			}
			n++
		}
		if err := rawCall(tg, "rl_version", "", 0, []string{"x"}).Error(); !isRLERR(err) || !namesFunction(err, "rl_version") {
			t.Errorf("rl_version x: %v", err)
		}
		t.Logf("%d RLERRs name their function", n)
	})
}

// badCallsOf is badCalls (args_test.go) over the signatures given, and the bad calls of
// rl_unblock and rl_block_peek, which take no argument (a signature's "no arguments" case
// would be a valid call). badCalls reads the package's signatures: they are swapped for the
// duration of the call, while no other test runs (none of this package's top-level tests is
// parallel).
func badCallsOf(base string, sigs []signature) []badCall {
	saved := signatures
	signatures = sigs
	calls := badCalls(base)
	signatures = saved
	blockKey := sigKey(base, signature{fn: "rl_block"})
	for _, fn := range []string{"rl_unblock", "rl_block_peek"} {
		for _, c := range []struct {
			name  string
			nkeys int
			args  []string
		}{
			{"no key", 0, nil},
			{"two keys", 2, nil},
			{"an argument", 1, []string{"1"}},
			{"two arguments", 1, []string{"1", "2"}},
			{"an empty argument", 1, []string{""}},
		} {
			calls = append(calls, badCall{name: fn + "/" + c.name, fn: fn, key: blockKey, nkeys: c.nkeys, args: c.args})
		}
	}
	return calls
}

// The keys of the new functions refuse anything but their own state, naming the key and
// leaving it as it was: rl_unblock never deletes a foreign key. A calendar key reads a fixed
// window's state (one format); a block's state is foreign to every 1.0/1.1 function.
func TestForeignStateOfNewKeys(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		nowMs := serverMs(t, tg.c)
		b := boundsAround(nowMs, 3_600_000, 2, 1_000)
		start := float64(b[1])
		nan, inf := math.NaN(), math.Inf(1)
		calFns := []string{"rl_calendar", "rl_calendar_peek", "rl_calendar_refund"}
		blockFns := []string{"rl_block", "rl_unblock", "rl_block_peek"}
		calValid := calArgs(10, b, 1)
		argsOf := func(fn string) []string {
			switch fn {
			case "rl_block":
				return []string{"1000"}
			case "rl_unblock", "rl_block_peek":
				return nil
			}
			return calValid
		}
		// what a calendar key and a block key may hold besides their own state
		other := append(holders(),
			holder{"a block", "block", stateOf("rl_block", "3600000")},
			holder{"a calendar", "fixed", stateOf("rl_calendar", calValid...)},
			holder{"a calendar of NaN", "", setTo(packed(start, nan))},
			holder{"a calendar of 2.5", "", setTo(packed(start, 2.5))},
			holder{"a calendar at 10^14", "", setTo(packed(1e14, 1))},
			holder{"a calendar at -1", "", setTo(packed(-1, 1))},
			holder{"a calendar at 0.5", "", setTo(packed(0.5, 1))},
			holder{"a block at NaN", "", setTo(packed(nan))},
			holder{"a block at Inf", "", setTo(packed(inf))},
			holder{"a block at 0", "", setTo(packed(0))},
			holder{"a block at -5", "", setTo(packed(-5))},
			holder{"a block at 1.5", "", setTo(packed(1.5))},
			holder{"a block at 10^14", "", setTo(packed(1e14))},
			holder{"8 bytes of text", "", setTo("garbage!")},
			holder{"7 bytes", "", setTo("garbage")},
			holder{"9 bytes", "", setTo("garbage!!")},
		)
		refused := 0
		for _, h := range other {
			for _, f := range []struct {
				kind  string
				fns   []string
				group []string
			}{
				{"fixed", calFns, calGroup(10, b, 1, 0)}, // a calendar reads a fixed window's state
				{"block", blockFns, blockGroup(1000)},
			} {
				if h.kind == f.kind {
					continue
				}
				key := foreignKey()
				h.make(t, tg.c, key)
				before := snap(t, tg.c, key)
				check := func(fn string, err error) {
					t.Helper()
					wantForeign(t, tg.c, fn, key, h.name, before, err)
					refused++
				}
				for _, fn := range f.fns {
					_, err := tryCall(tg.c, strings.HasSuffix(fn, "_peek"), fn, key, argsOf(fn)...)
					check(fn, err)
				}
				// in rl_multi, beside a limit on a fresh key of the same slot
				mkey := "{" + key + "}:limit"
				for _, fn := range []string{"rl_multi", "rl_multi_peek"} {
					_, err := tryMulti(tg.c, fn == "rl_multi_peek", fn, []string{key, mkey}, append(append([]string{}, f.group...), group(tokenSlow, 10, 1, 0)...))
					check(fn, err)
				}
				if snap(t, tg.c, mkey).exists {
					t.Fatalf("rl_multi wrote its other key beside %s", h.name)
				}
			}
		}
		// a block's 8 bytes are foreign to every 1.0/1.1 function
		for _, f := range families {
			key := foreignKey()
			fcall(t, tg.c, "rl_block", key, "3600000")
			before := snap(t, tg.c, key)
			for _, fn := range f.fns {
				_, err := tryCall(tg.c, strings.HasSuffix(fn, "_peek"), fn, key, f.args...)
				if want := fmt.Sprintf("RLERR %s: key '%s'", fn, key); err == nil || !strings.HasPrefix(err.Error(), want) {
					t.Errorf("%s on a block: %v, want %s...", fn, err, want)
				}
				refused++
			}
			if snap(t, tg.c, key) != before {
				t.Fatalf("%v changed a block", f.fns)
			}
		}
		t.Logf("%d calls on foreign state refused", refused)
	})
}

// A rollback from 1.2.0 to 1.1.0 keeps every live 1.0/1.1 limiter: the state the working copy
// writes for them (as limiters, refunds, leases and rl_multi groups) is read by 1.1.0's peeks
// as 1.2.0's read it (allowed, remaining, limit; reset and delay less the time between), and
// 1.1.0 goes on deciding with it: it takes exactly the units left. (That the bytes and expiry
// are those 1.1.0 itself writes for the same calls is not compared here: the server's clock
// moves between two runs. TestRollbackTo10KeepsState does the same for 1.1.0 to 1.0.0.)
func TestRollbackTo11KeepsState(t *testing.T) {
	v11 := release(t, "1.1.0")
	for _, s := range standalones {
		t.Run(s.name, func(t *testing.T) {
			c := s.start(t).Client(t)
			const limit = 10
			roomInWindow(t, c, 60_000, 3*time.Second)
			loadCode(t, c, functions.Source)
			base := keyFor(t)
			keys := map[string]string{}
			for _, l := range slow {
				key := "{" + base + "}" + l.name
				keys[l.name] = key
				fcall(t, c, l.fn, key, withReserve(l.args(limit, 3), 2)...)
				if m := multi(t, c, false, []string{key}, group(l, limit, 4, 3)); !m.Allowed {
					t.Fatalf("%s: rl_multi: %v", l.name, m)
				}
				if r := fcall(t, c, refundFn(l), key, l.args(limit, 2)...); r.Remaining != 5 {
					t.Fatalf("%s: refund 2 of 7: %v", l.name, r)
				}
			}
			lease := base + ":lease"
			fcall(t, c, "rl_concurrency", lease, leaseArgs(3, 600_000, "a")...)
			fcall(t, c, "rl_concurrency", lease, leaseArgs(3, 600_000, "b")...)
			fcall(t, c, "rl_concurrency_release", lease, leaseArgs(3, 600_000, "a")...)
			read := func() map[string]reply {
				out := map[string]reply{}
				for _, l := range slow {
					out[l.name] = fcall(t, c, l.fn+"_peek", keys[l.name], l.args(limit, 1)...)
				}
				out["lease"] = fcall(t, c, "rl_concurrency_peek", lease, leaseArgs(3, 600_000, "c")...)
				return out
			}
			all := append([]string{lease}, func() []string {
				var ks []string
				for _, k := range keys {
					ks = append(ks, k)
				}
				return ks
			}()...)
			dumps := snaps(t, c, all)
			start := time.Now()
			by12 := read()
			loadCode(t, c, v11.Code)
			by11 := read()
			elapsed := time.Since(start).Milliseconds()
			sameSnaps(t, c, all, dumps, "the peeks of both releases") // no-writes, as flagged
			for name, a := range by12 {
				b := by11[name]
				if b.Allowed != a.Allowed || b.Remaining != a.Remaining || b.Limit != a.Limit ||
					b.ResetAfter > a.ResetAfter || b.ResetAfter < a.ResetAfter-elapsed-1 || b.Delay > a.Delay || b.Delay < a.Delay-elapsed-1 {
					t.Errorf("%s: 1.2.0 reads %v, 1.1.0 reads %v", name, a, b)
				}
			}
			for _, l := range slow {
				if r := fcall(t, c, l.fn, keys[l.name], l.args(limit, 5)...); !r.Allowed || r.Remaining != 0 {
					t.Errorf("%s: 1.1.0 takes the 5 left: %v", l.name, r)
				}
			}
			if r := fcall(t, c, "rl_concurrency", lease, leaseArgs(3, 600_000, "c")...); !r.Allowed || r.Remaining != 1 {
				t.Errorf("1.1.0 leases after the rollback: %v", r)
			}
		})
	}
}
