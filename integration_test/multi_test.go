package integration_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// multiReply is rl_multi's answer: the binding limit's six integers (reset_after_ms and
// delay_ms over all limits), then the binding limit's 1-based index.
type multiReply struct {
	reply
	Binding int64
}

func (m multiReply) String() string { return fmt.Sprintf("%v binding=%d", m.reply, m.Binding) }

func decodeMulti(res valkey.ValkeyResult) (multiReply, error) {
	arr, err := res.ToArray()
	if err != nil {
		return multiReply{}, err
	}
	if len(arr) != 7 {
		return multiReply{}, fmt.Errorf("rl_multi reply has %d elements, want 7", len(arr))
	}
	var n [7]int64
	for i, m := range arr {
		if n[i], err = m.AsInt64(); err != nil {
			return multiReply{}, fmt.Errorf("element %d: %w", i, err)
		}
	}
	if n[0] != 0 && n[0] != 1 {
		return multiReply{}, fmt.Errorf("allowed = %d", n[0])
	}
	return multiReply{reply{n[0] == 1, n[1], n[2], n[3], n[4], n[5]}, n[6]}, nil
}

func tryMulti(c valkey.Client, ro bool, fn string, keys, args []string) (multiReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var cmd valkey.Completed
	if ro {
		cmd = c.B().FcallRo().Function(fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	} else {
		cmd = c.B().Fcall().Function(fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	return decodeMulti(c.Do(ctx, cmd))
}

// multi runs rl_multi (or with ro, rl_multi_peek by FCALL_RO) over keys, one group each.
func multi(t testing.TB, c valkey.Client, ro bool, keys []string, groups ...[]string) multiReply {
	t.Helper()
	fn := "rl_multi"
	if ro {
		fn = "rl_multi_peek"
	}
	var args []string
	for _, g := range groups {
		args = append(args, g...)
	}
	m, err := tryMulti(c, ro, fn, keys, args)
	if err != nil {
		t.Fatalf("%s %v %v: %v", fn, keys, args, err)
	}
	return m
}

func snaps(t testing.TB, c valkey.Client, keys []string) []snapshot {
	t.Helper()
	out := make([]snapshot, len(keys))
	for i, k := range keys {
		out[i] = snap(t, c, k)
	}
	return out
}

func sameSnaps(t testing.TB, c valkey.Client, keys []string, before []snapshot, what string) {
	t.Helper()
	for i, s := range snaps(t, c, keys) {
		if s != before[i] {
			t.Fatalf("%s changed key %d (%s)", what, i+1, keys[i])
		}
	}
}

var (
	fixedSlow   = slow[0]
	logSlow     = slow[1]
	slidingSlow = slow[2]
	tokenSlow   = slow[3]
	policeSlow  = slow[4]
	shapeSlow   = slow[5]
)

// Every limit consumes, or none does.
func TestMultiAllOrNothing(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		keys := tagKeys(t, 5)
		roomInWindow(t, tg.c, 60_000, 2*time.Second)
		// limits 10, 8, 5, 9, 7: the token bucket is the tightest
		limits := []limiter{fixedSlow, logSlow, tokenSlow, slidingSlow, policeSlow}
		caps := []int64{10, 8, 5, 9, 7}
		groups := func(cost int64) [][]string {
			var gs [][]string
			for i, l := range limits {
				gs = append(gs, group(l, caps[i], cost, 0))
			}
			return gs
		}
		for i, cost := range []int64{2, 3} {
			m := multi(t, tg.c, false, keys, groups(cost)...)
			if !m.Allowed || m.Binding != 3 || m.Limit != 5 || m.Remaining != []int64{3, 0}[i] || m.RetryAfter != 0 {
				t.Fatalf("cost %d: %v, want admitted, bound by the token bucket (3)", cost, m)
			}
		}
		// each limit consumed 5
		for i, l := range limits {
			if p := fcallRO(t, tg.c, l.fn+"_peek", keys[i], l.args(caps[i], 0)...); p.Remaining != caps[i]-5 {
				t.Fatalf("%s after two multi calls: %v, want %d left", l.name, p, caps[i]-5)
			}
		}
		before := snaps(t, tg.c, keys)
		for _, ro := range []bool{true, false} {
			m := multi(t, tg.c, ro, keys, groups(1)...)
			if m.Allowed || m.Binding != 3 || m.Remaining != 0 || m.RetryAfter <= 0 || m.Delay != 0 {
				t.Fatalf("peek %v: cost 1 with the token bucket empty: %v, want denied by it (3)", ro, m)
			}
		}
		sameSnaps(t, tg.c, keys, before, "a denied rl_multi")
		// cost 0 is admitted everywhere and writes nothing
		if m := multi(t, tg.c, false, keys, groups(0)...); !m.Allowed || m.Binding != 3 || m.Remaining != 0 {
			t.Fatalf("cost 0: %v", m)
		}
		sameSnaps(t, tg.c, keys, before, "rl_multi of cost 0")
	})
}

// The binding limit: the denier with the longest retry (-1 above all), or when admitted the
// one with the fewest remaining; ties go to the first.
func TestMultiBinding(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		roomInWindow(t, tg.c, 60_000, 3*time.Second)
		k := tagKeys(t, 6)
		// k1, k2: fixed windows of 2, exhausted (retry at the window's end, under 60s)
		// k3: a token bucket of 2, exhausted (retry about 600s)
		fcall(t, tg.c, fixedSlow.fn, k[0], fixedSlow.args(2, 2)...)
		fcall(t, tg.c, fixedSlow.fn, k[1], fixedSlow.args(2, 2)...)
		fcall(t, tg.c, tokenSlow.fn, k[2], tokenSlow.args(2, 2)...)
		fixed, token := group(fixedSlow, 2, 1, 0), group(tokenSlow, 2, 1, 0)
		never := group(fixedSlow, 5, 6, 0) // cost above the limit

		for _, c := range []struct {
			name    string
			keys    []string
			groups  [][]string
			binding int64
			retry   func(r int64) bool
		}{
			{"longest retry", k[:3], [][]string{fixed, fixed, token}, 3, func(r int64) bool { return r > 590_000 }},
			{"longest retry first", []string{k[2], k[0]}, [][]string{token, fixed}, 1, func(r int64) bool { return r > 590_000 }},
			{"equal retries", k[:2], [][]string{fixed, fixed}, 1, func(r int64) bool { return r > 0 && r <= 60_000 }},
			{"never above all", []string{k[0], k[2], k[3]}, [][]string{fixed, token, never}, 3, func(r int64) bool { return r == -1 }},
			{"never twice", []string{k[3], k[2], k[4]}, [][]string{never, token, never}, 1, func(r int64) bool { return r == -1 }},
		} {
			before := snaps(t, tg.c, c.keys)
			for _, ro := range []bool{true, false} {
				m := multi(t, tg.c, ro, c.keys, c.groups...)
				if m.Allowed || m.Binding != c.binding || !c.retry(m.RetryAfter) || m.Delay != 0 {
					t.Fatalf("%s (peek %v): %v, want denied by %d", c.name, ro, m, c.binding)
				}
			}
			sameSnaps(t, tg.c, c.keys, before, c.name)
		}

		// admitted: the fewest remaining binds, ties to the first
		f := tagKeys(t, 4)
		if m := multi(t, tg.c, false, f[:2], group(fixedSlow, 10, 1, 0), group(fixedSlow, 10, 1, 0)); !m.Allowed || m.Binding != 1 || m.Remaining != 9 {
			t.Fatalf("two equal limits: %v, want bound by the first", m)
		}
		if m := multi(t, tg.c, false, f[2:], group(fixedSlow, 10, 1, 0), group(fixedSlow, 5, 1, 0)); !m.Allowed || m.Binding != 2 || m.Remaining != 4 {
			t.Fatalf("limits 10 and 5: %v, want bound by the second", m)
		}
		// a reserve counts: remaining is what this caller could still take
		if m := multi(t, tg.c, false, f[:2], group(fixedSlow, 10, 1, 0), group(fixedSlow, 10, 1, 3)); !m.Allowed || m.Binding != 2 || m.Remaining != 5 {
			t.Fatalf("reserve 3 on the second: %v, want bound by it with 5 remaining", m)
		}
	})
}

// reset_after_ms is the longest over all limits, delay_ms the longest when admitted and 0
// when denied, whichever limit binds.
func TestMultiResetAndDelay(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		roomInWindow(t, tg.c, 60_000, 3*time.Second)
		k := tagKeys(t, 2)
		// a fixed window of 3 (reset under 60s) and a shaping bucket of 10 leaking one unit
		// per 600s (delays and reset in hundreds of seconds)
		groups := [][]string{group(fixedSlow, 3, 1, 0), group(shapeSlow, 10, 1, 0)}
		start := time.Now()
		for i := int64(0); i < 3; i++ {
			m := multi(t, tg.c, false, k, groups...)
			elapsed := time.Since(start).Milliseconds()
			if !m.Allowed || m.Binding != 1 || m.Remaining != 2-i {
				t.Fatalf("call %d: %v, want admitted, bound by the fixed window", i, m)
			}
			within(t, fmt.Sprintf("call %d delay", i), m.Delay, i*600_000-elapsed-1000, i*600_000)
			within(t, fmt.Sprintf("call %d reset", i), m.ResetAfter, (i+1)*600_000-elapsed-1000, (i+1)*600_000)
			fw := fcallRO(t, tg.c, fixedSlow.fn+"_peek", k[0], fixedSlow.args(3, 0)...)
			if fw.ResetAfter > 60_000 || fw.ResetAfter <= 0 {
				t.Fatalf("the fixed window's own reset %v", fw)
			}
		}
		before := snaps(t, tg.c, k)
		m := multi(t, tg.c, false, k, groups...)
		if m.Allowed || m.Binding != 1 || m.Delay != 0 || m.ResetAfter < 1_790_000 || m.ResetAfter > 1_800_000 {
			t.Fatalf("the fixed window exhausted: %v, want denied by it, delay 0, reset the bucket's", m)
		}
		sameSnaps(t, tg.c, k, before, "a denied rl_multi")
		// the peek's delay is the one the call would be given
		if p := multi(t, tg.c, true, k, group(fixedSlow, 4, 1, 0), group(shapeSlow, 10, 1, 0)); !p.Allowed || p.Delay < 1_790_000 || p.Delay > 1_800_000 {
			t.Fatalf("peek: %v, want admitted with the queue's delay", p)
		}
	})
}

// rl_multi_peek writes nothing, judges like rl_multi, and picks its binding limit from the
// peeks' replies, whose remaining does not subtract the cost.
func TestMultiPeek(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		roomInWindow(t, tg.c, 60_000, 2*time.Second)
		k := tagKeys(t, 2)
		groups := [][]string{group(fixedSlow, 10, 5, 0), group(tokenSlow, 8, 1, 0)}
		p := multi(t, tg.c, true, k, groups...)
		if !p.Allowed || p.Binding != 2 || p.Remaining != 8 || p.ResetAfter != 0 {
			t.Fatalf("peek on fresh limits: %v, want admitted, bound by the bucket's 8", p)
		}
		if s := snaps(t, tg.c, k); s[0].exists || s[1].exists {
			t.Fatal("rl_multi_peek wrote a key")
		}
		// the call leaves 5 and 7: the fixed window binds
		if m := multi(t, tg.c, false, k, groups...); !m.Allowed || m.Binding != 1 || m.Remaining != 5 {
			t.Fatalf("the call: %v, want bound by the fixed window's 5", m)
		}
		before := snaps(t, tg.c, k)
		// 5 and 7 left: the fixed window binds until only the bucket's retry is longer
		for _, c := range []struct {
			cost, binding, remaining int64
			allowed                  bool
		}{
			{1, 1, 5, true},
			{5, 1, 5, true},
			{6, 1, 5, false}, // only the fixed window denies
			{8, 2, 7, false}, // both deny: the bucket's 600s retry is the longer
			{9, 2, 7, false}, // the bucket never admits 9
		} {
			gs := [][]string{group(fixedSlow, 10, c.cost, 0), group(tokenSlow, 8, c.cost, 0)}
			p := multi(t, tg.c, true, k, gs...)
			if p.Allowed != c.allowed || p.Binding != c.binding || p.Remaining != c.remaining || (c.cost == 9) != (p.RetryAfter == -1) {
				t.Fatalf("peek cost %d: %v, want allowed %v bound by %d", c.cost, p, c.allowed, c.binding)
			}
			// FCALL runs the peek too, and the call itself binds the same limit when denied
			m, err := tryMulti(tg.c, false, "rl_multi_peek", k, append(append([]string{}, gs[0]...), gs[1]...))
			if err != nil || m.Binding != p.Binding || m.Allowed != p.Allowed {
				t.Fatalf("FCALL rl_multi_peek cost %d: %v, %v; FCALL_RO said %v", c.cost, m, err, p)
			}
			if !c.allowed {
				if m := multi(t, tg.c, false, k, gs...); m.Allowed || m.Binding != p.Binding {
					t.Fatalf("rl_multi cost %d: %v, the peek %v", c.cost, m, p)
				}
			}
		}
		sameSnaps(t, tg.c, k, before, "rl_multi_peek")
	})
}

// Bad rl_multi calls are refused before anything is written, on any key.
func TestMultiRefusesBadCalls(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		roomInWindow(t, tg.c, 60_000, 5*time.Second)
		keys := tagKeys(t, 17)
		for i, k := range keys {
			if i%2 == 0 {
				fcall(t, tg.c, fixedSlow.fn, k, fixedSlow.args(10, 1)...)
			}
		}
		g := group(fixedSlow, 10, 1, 0)
		many := func(n int) []string {
			var args []string
			for i := 0; i < n; i++ {
				args = append(args, g...)
			}
			return args
		}
		join := func(gs ...[]string) []string {
			var args []string
			for _, g := range gs {
				args = append(args, g...)
			}
			return args
		}
		before := snaps(t, tg.c, keys)
		for _, c := range []struct {
			name string
			keys []string
			args []string
		}{
			{"17 keys", keys, many(17)},
			{"a repeated key", []string{keys[0], keys[1], keys[0]}, many(3)},
			{"a repeated key, adjacent", []string{keys[1], keys[1]}, many(2)},
			{"too few groups", keys[:3], many(2)},
			{"too many groups", keys[:2], many(3)},
			{"a short group", keys[:2], join(g, g[:4])},
			{"a short group first", keys[:2], join(g[:4], g)},
			{"a long group", keys[:2], join(g, g, []string{"1"})},
			{"concurrency", keys[:2], join(g, []string{"concurrency", "10", "60000", "id", "0"})},
			{"unknown algorithm", keys[:2], join(g, []string{"gcra", "10", "60000", "1", "0"})},
			{"token bucket of 5", keys[:2], join(g, []string{"token_bucket", "10", "1", "600000", "1"})},
			{"leaky bucket of 6", keys[:2], join(g, []string{"leaky_bucket", "10", "1", "600000", "1", "shape"})},
			{"leaky bucket bad mode", keys[:2], join(g, []string{"leaky_bucket", "10", "1", "600000", "1", "drop", "0"})},
			{"reserve above the limit", keys[:2], join(g, group(fixedSlow, 10, 1, 11))},
			{"bad cost", keys[:2], join(g, []string{"fixed_window", "10", "60000", "-1", "0"})},
			{"bucket overflow", keys[:2], join(g, []string{"token_bucket", "999999999999999", "7", "100000000000", "1", "0"})},
		} {
			for _, fn := range []string{"rl_multi", "rl_multi_peek"} {
				_, err := tryMulti(tg.c, fn == "rl_multi_peek", fn, c.keys, c.args)
				if !isRLERR(err) {
					t.Errorf("%s: %s: got %v, want RLERR", fn, c.name, err)
				}
				sameSnaps(t, tg.c, keys, before, fn+": "+c.name)
			}
		}
		// no key at all
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tg.primary.Do(ctx, tg.primary.B().Fcall().Function("rl_multi").Numkeys(0).Arg(g...).Build()).Error(); !isRLERR(err) {
			t.Errorf("rl_multi with no key: got %v, want RLERR", err)
		}
		// 16 keys are fine
		sixteen := make([][]string, 16)
		for i := range sixteen {
			sixteen[i] = g
		}
		if m := multi(t, tg.c, false, keys[:16], sixteen...); !m.Allowed || m.Binding != 1 || m.Remaining != 8 {
			t.Fatalf("16 keys: %v, want admitted, bound by the first of those with 8 left", m)
		}
	})
}

// A multi call that fails on a later group's key (foreign state, an out-of-range bucket) has
// written nothing on the keys before it, not even the cleanup of a log's ended entries.
func TestMultiErrorWritesNothing(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		k := tagKeys(t, 3)
		// a log with ended entries, in a key kept alive
		fcall(t, tg.c, "rl_sliding_log", k[0], itoa(10, 100, 2)...)
		if err := do(t, tg.c, tg.c.B().Pexpire().Key(k[0]).Milliseconds(60_000).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(110 * time.Millisecond)
		do(t, tg.c, tg.c.B().Set().Key(k[1]).Value("not state").Build())
		before := snaps(t, tg.c, k[:2])
		logGroup := []string{"sliding_log", "10", "100", "1", "0"}
		for _, c := range []struct {
			name string
			args []string
		}{
			{"foreign state", append(append([]string{}, logGroup...), group(fixedSlow, 10, 1, 0)...)},
			{"bucket overflow", append(append([]string{}, logGroup...), "token_bucket", "999999999999999", "7", "100000000000", "1", "0")},
		} {
			for _, fn := range []string{"rl_multi", "rl_multi_peek"} {
				_, err := tryMulti(tg.c, fn == "rl_multi_peek", fn, k[:2], c.args)
				if !isRLERR(err) {
					t.Errorf("%s: %s: got %v, want RLERR", fn, c.name, err)
				}
				sameSnaps(t, tg.c, k[:2], before, fn+": "+c.name)
			}
		}
		// the deferred cleanup still runs: on a denial (no consumption, the ended entries go,
		// and with them the key) and before an admission's entries
		full := k[2]
		fcall(t, tg.c, fixedSlow.fn, full, fixedSlow.args(1, 1)...)
		if m, err := tryMulti(tg.c, false, "rl_multi", []string{k[0], full}, append(append([]string{}, logGroup...), group(fixedSlow, 1, 1, 0)...)); err != nil || m.Allowed || m.Binding != 2 {
			t.Fatalf("rl_multi denied by its second limit: %v, %v", m, err)
		}
		if snap(t, tg.c, k[0]).exists {
			t.Fatalf("a denied rl_multi kept a log of ended entries: %v", zscores(t, tg.c, k[0]))
		}
		fcall(t, tg.c, "rl_sliding_log", k[0], itoa(10, 100, 2)...)
		if err := do(t, tg.c, tg.c.B().Pexpire().Key(k[0]).Milliseconds(60_000).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(110 * time.Millisecond)
		if m, err := tryMulti(tg.c, false, "rl_multi", k[:1], logGroup); err != nil || !m.Allowed || m.Remaining != 9 {
			t.Fatalf("rl_multi over a log of ended entries: %v, %v; want admitted with 9 left", m, err)
		}
		entries := zscores(t, tg.c, k[0])
		if len(entries) != 1 {
			t.Fatalf("log after rl_multi: %v, want its one new entry", entries)
		}
		if exp := snap(t, tg.c, k[0]).expiry; exp != ceilDiv(entries[0]+100_000, 1000) {
			t.Fatalf("the log expires at %d, its entry leaves the window at %d", exp, ceilDiv(entries[0]+100_000, 1000))
		}
	})
}

// 64 callers on one rl_multi of three limits never get more than the tightest.
func TestMultiNoOverAdmission(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		roomInWindow(t, tg.c, 60_000, 10*time.Second)
		k := tagKeys(t, 3)
		groups := append(append(group(fixedSlow, 30, 1, 0), group(tokenSlow, 20, 1, 0)...), group(logSlow, 25, 1, 0)...)
		var admitted atomic.Int64
		race(t, 64, func(int) error {
			for i := 0; i < 10; i++ {
				m, err := tryMulti(tg.c, false, "rl_multi", k, groups)
				if err != nil {
					return err
				}
				if m.Allowed {
					admitted.Add(1)
				}
			}
			return nil
		})
		if got := admitted.Load(); got != 20 {
			t.Fatalf("64 callers admitted %d, the tightest limit is 20", got)
		}
		for i, c := range []struct {
			l     limiter
			limit int64
		}{{fixedSlow, 30}, {tokenSlow, 20}, {logSlow, 25}} {
			if p := fcallRO(t, tg.c, c.l.fn+"_peek", k[i], c.l.args(c.limit, 0)...); p.Remaining != c.limit-20 {
				t.Fatalf("%s: %v, want 20 consumed", c.l.name, p)
			}
		}
	})
}

// A cluster refuses keys of different slots before the function runs.
func TestMultiCrossSlot(t *testing.T) {
	for _, tg := range servers(t) {
		if tg.name != "cluster" {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a, b := "{a}"+keyFor(t), "{b}"+keyFor(t)
		g := group(fixedSlow, 10, 1, 0)
		// a node connection: the cluster client refuses to build such a command at all
		cmd := tg.primary.B().Arbitrary("FCALL", "rl_multi", "2", a, b).Args(g...).Args(g...).Build()
		err := tg.primary.Do(ctx, cmd).Error()
		if err == nil || !strings.Contains(err.Error(), "CROSSSLOT") {
			t.Fatalf("rl_multi over two slots: %v, want CROSSSLOT", err)
		}
	}
}
