package integration_test

import (
	"context"
	"encoding/binary"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// Blocks (release 1.2.0): a penalty box set by rl_multi when a limit denies, and a deny list
// an operator keeps by hand with rl_block and rl_unblock.

func blockGroup(penaltyMs int64) []string { return []string{"block", itoa(penaltyMs)[0]} }

// blockedUntil returns a block key's blocked_until_ms, checking its format (8 bytes) and that
// it expires exactly then; 0 when the key does not exist.
func blockedUntil(t testing.TB, c valkey.Client, key string) int64 {
	t.Helper()
	s := snap(t, c, key)
	if !s.exists {
		return 0
	}
	v := value(t, c, key)
	if len(v) != 8 {
		t.Fatalf("%s holds %d bytes, want 8", key, len(v))
	}
	ends := int64(unpacked(v)[0])
	if s.expiry != ends {
		t.Fatalf("%s: blocked until %d, expires at %d", key, ends, s.expiry)
	}
	return ends
}

// unpacked reads a state of little-endian doubles, as the library packs them.
func unpacked(v string) []float64 {
	var out []float64
	for i := 0; i+8 <= len(v); i += 8 {
		out = append(out, math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[i:i+8]))))
	}
	return out
}

// blockReply is the six integers of a block with `left` ms to go (not blocked: left 0).
func blockReply(left int64) reply {
	if left == 0 {
		return reply{Allowed: true}
	}
	return reply{false, 0, 0, left, left, 0}
}

// checkBlockReply checks a reply bound by a block that ends at ends, from a call made at a
// server time in [t0, t1]: {0 0 0 left left 0}, where in rl_multi reset_after may be another
// limit's, longer.
func checkBlockReply(t testing.TB, what string, r reply, ends, t0, t1 int64) {
	t.Helper()
	if r.Allowed || r.Limit != 0 || r.Remaining != 0 || r.Delay != 0 || r.ResetAfter < r.RetryAfter {
		t.Fatalf("%s: %v, want {0 0 0 left left 0}", what, r)
	}
	within(t, what+": left", r.RetryAfter, ends-t1, ends-t0)
}

// rl_block, rl_block_peek and rl_unblock by hand: the reply, the state, its expiry, an
// operator lengthening and shortening a block.
func TestBlockByHand(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		key := keyFor(t)
		if r := fcallRO(t, tg.c, "rl_block_peek", key); r != blockReply(0) {
			t.Fatalf("peek of an absent block: %v", r)
		}
		if r := fcall(t, tg.c, "rl_unblock", key); r != blockReply(0) || snap(t, tg.c, key).exists {
			t.Fatalf("unblock of an absent block: %v", r)
		}
		for _, d := range []int64{60_000, 600_000, 5_000, 100_000_000_000} {
			t0 := serverMs(t, tg.c)
			r, sent, received := timed(func() reply { return fcall(t, tg.c, "rl_block", key, itoa(d)...) })
			t1 := serverMs(t, tg.c)
			if r != (reply{false, 0, 0, d, d, 0}) {
				t.Fatalf("rl_block %d: %v, want {0 0 0 %d %d 0}", d, r, d, d)
			}
			checkTTL(t, tg.c, key, r, sent, received)
			within(t, "blocked_until", blockedUntil(t, tg.c, key), t0+d, t1+d)
			ends := blockedUntil(t, tg.c, key)
			p := fcallRO(t, tg.c, "rl_block_peek", key)
			checkBlockReply(t, "rl_block_peek", p, ends, t1, serverMs(t, tg.c))
			if p.ResetAfter != p.RetryAfter {
				t.Fatalf("rl_block_peek: %v, want reset_after = retry_after", p)
			}
		}
		if r := fcall(t, tg.c, "rl_unblock", key); r != blockReply(0) || snap(t, tg.c, key).exists {
			t.Fatalf("rl_unblock: %v, want {1 0 0 0 0 0} and the key gone", r)
		}
		if r := fcallRO(t, tg.c, "rl_block_peek", key); r != blockReply(0) {
			t.Fatalf("peek after rl_unblock: %v", r)
		}

		// a block that ended is no block: the peek leaves it, a writing call deletes it
		ended := keyFor(t)
		keys := tagKeys(t, 2)
		for _, k := range []string{ended, keys[0]} {
			do(t, tg.c, tg.c.B().Set().Key(k).Value(packed(float64(serverMs(t, tg.c)-10))).PxMilliseconds(60_000).Build())
		}
		before := snap(t, tg.c, ended)
		if r := fcallRO(t, tg.c, "rl_block_peek", ended); r != blockReply(0) || snap(t, tg.c, ended) != before {
			t.Fatalf("peek of an ended block: %v", r)
		}
		if m := multi(t, tg.c, true, keys, blockGroup(1000), group(fixedSlow, 10, 1, 0)); !m.Allowed || m.Binding != 2 {
			t.Fatalf("rl_multi_peek with an ended block: %v", m)
		}
		if !snap(t, tg.c, keys[0]).exists {
			t.Fatal("rl_multi_peek deleted the ended block")
		}
		if m := multi(t, tg.c, false, keys, blockGroup(1000), group(fixedSlow, 10, 1, 0)); !m.Allowed || m.Binding != 2 {
			t.Fatalf("rl_multi with an ended block: %v", m)
		}
		if snap(t, tg.c, keys[0]).exists {
			t.Fatal("rl_multi kept an ended block")
		}
		if r := fcall(t, tg.c, "rl_unblock", ended); r != blockReply(0) || snap(t, tg.c, ended).exists {
			t.Fatalf("rl_unblock of an ended block: %v", r)
		}
	})
}

// A denial outside any block sets the penalty in the same call, starting at the denial; a
// request refused during the block consumes nothing and never lengthens it.
func TestBlockPenalty(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		roomInWindow(t, tg.c, 60_000, 3*time.Second)
		k := tagKeys(t, 3) // block, fixed window, token bucket
		const penalty = 120_000
		gs := [][]string{blockGroup(penalty), group(fixedSlow, 2, 1, 0), group(tokenSlow, 10, 1, 0)}
		for i := int64(0); i < 2; i++ {
			t0 := serverMs(t, tg.c)
			m := multi(t, tg.c, false, k, gs...)
			fw := fcallRO(t, tg.c, fixedSlow.fn+"_peek", k[1], fixedSlow.args(2, 0)...)
			tb := fcallRO(t, tg.c, tokenSlow.fn+"_peek", k[2], tokenSlow.args(10, 0)...)
			elapsed := serverMs(t, tg.c) - t0
			if !m.Allowed || m.Binding != 2 || m.Remaining != 1-i {
				t.Fatalf("call %d: %v, want admitted, bound by the fixed window", i, m)
			}
			// the block group that does not deny adds nothing to reset_after: the limits'
			// resets, read by the peeks up to `elapsed` ms later (a loaded machine took 20
			// between two calls), plus a millisecond of rounding
			if m.ResetAfter > max(fw.ResetAfter, tb.ResetAfter)+elapsed+1 || snap(t, tg.c, k[0]).exists {
				t.Fatalf("call %d: reset %d, the limits' %d and %d read within %d ms; or a block was written",
					i, m.ResetAfter, fw.ResetAfter, tb.ResetAfter, elapsed)
			}
		}
		t0 := serverMs(t, tg.c)
		m := multi(t, tg.c, false, k, gs...)
		t1 := serverMs(t, tg.c)
		// the penalty's 120s is longer than the fixed window's retry: the block binds;
		// reset_after is the token bucket's, the longest
		tb := fcallRO(t, tg.c, tokenSlow.fn+"_peek", k[2], tokenSlow.args(10, 0)...)
		if m.Binding != 1 || m.Allowed || m.Limit != 0 || m.Remaining != 0 || m.RetryAfter != penalty || m.Delay != 0 ||
			m.ResetAfter < tb.ResetAfter || m.ResetAfter > tb.ResetAfter+1000 {
			t.Fatalf("the denial: %v, want bound by the penalty just set, reset the bucket's %d", m, tb.ResetAfter)
		}
		ends := blockedUntil(t, tg.c, k[0])
		within(t, "the penalty's end", ends, t0+penalty, t1+penalty)
		limits := snaps(t, tg.c, k[1:])

		// refused during the block: nothing consumed, the block not lengthened, even with
		// limits that would admit
		time.Sleep(20 * time.Millisecond)
		for _, c := range []struct {
			name   string
			groups [][]string
		}{
			{"the same limits", gs},
			{"limits with room", [][]string{blockGroup(penalty), group(fixedSlow, 100, 1, 0), group(tokenSlow, 100, 1, 0)}},
			{"a longer penalty", [][]string{blockGroup(10 * penalty), group(fixedSlow, 100, 1, 0), group(tokenSlow, 100, 1, 0)}},
		} {
			for _, ro := range []bool{false, true} {
				t0 := serverMs(t, tg.c)
				m := multi(t, tg.c, ro, k, c.groups...)
				if m.Binding != 1 {
					t.Fatalf("%s (peek %v): %v, want bound by the block", c.name, ro, m)
				}
				checkBlockReply(t, c.name, m.reply, ends, t0, serverMs(t, tg.c))
				if got := blockedUntil(t, tg.c, k[0]); got != ends {
					t.Fatalf("%s (peek %v): the block moved from %d to %d", c.name, ro, ends, got)
				}
				sameSnaps(t, tg.c, k[1:], limits, c.name)
			}
		}
		// limits that deny beside a block still count: the longest retry binds, -1 above all
		if m := multi(t, tg.c, false, k, blockGroup(penalty), group(fixedSlow, 2, 3, 0), group(tokenSlow, 10, 1, 0)); m.Binding != 2 || m.RetryAfter != -1 {
			t.Fatalf("a limit that can never admit beside the block: %v, want it binding with -1", m)
		}
		if m := multi(t, tg.c, false, k, blockGroup(penalty), group(fixedSlow, 2, 1, 0), group(tokenSlow, 10, 10, 0)); m.Binding != 3 || m.RetryAfter < 500_000 {
			t.Fatalf("a token bucket's 600s retry beside a 120s block: %v, want it binding", m)
		}
		if got := blockedUntil(t, tg.c, k[0]); got != ends {
			t.Fatalf("the block moved from %d to %d", ends, got)
		}
		sameSnaps(t, tg.c, k[1:], limits, "denials during the block")

		// the operator lifts it: the limits decide again, and the next denial starts a new one
		fcall(t, tg.c, "rl_unblock", k[0])
		if m := multi(t, tg.c, false, k, blockGroup(penalty), group(fixedSlow, 3, 1, 0), group(tokenSlow, 10, 1, 0)); !m.Allowed || m.Binding != 2 {
			t.Fatalf("after rl_unblock: %v", m)
		}
		// a penalty shorter than the limit's retry: the limit binds, the block is set all the same
		// (long enough to be read before it ends on a loaded machine, where a 50 ms one was not)
		const short = 500
		t0 = serverMs(t, tg.c)
		m = multi(t, tg.c, false, k, blockGroup(short), group(fixedSlow, 3, 1, 0), group(tokenSlow, 10, 1, 0))
		t1 = serverMs(t, tg.c)
		if m.Allowed || m.Binding != 2 || m.RetryAfter < short {
			t.Fatalf("a %dms penalty: %v, want the fixed window binding", short, m)
		}
		within(t, "the short penalty's end", blockedUntil(t, tg.c, k[0]), t0+short, t1+short)
	})
}

// penalty_ms 0 only observes; rl_multi_peek never sets a penalty; several block groups are
// each set, and the longest binds; a multi needs a group that is not a block.
func TestBlockGroups(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		roomInWindow(t, tg.c, 60_000, 3*time.Second)
		k := tagKeys(t, 4) // blocks a, b, c and a fixed window
		fcall(t, tg.c, fixedSlow.fn, k[3], fixedSlow.args(1, 1)...)
		full := group(fixedSlow, 1, 1, 0)

		// the peek judges like the call and writes nothing
		if m := multi(t, tg.c, true, k, blockGroup(300_000), blockGroup(0), blockGroup(200_000), full); m.Allowed || m.Binding != 4 {
			t.Fatalf("rl_multi_peek: %v, want denied by the fixed window", m)
		}
		for _, key := range k[:3] {
			if snap(t, tg.c, key).exists {
				t.Fatal("rl_multi_peek set a penalty")
			}
		}
		// penalty 0 observes only
		if m := multi(t, tg.c, false, []string{k[1], k[3]}, blockGroup(0), full); m.Allowed || m.Binding != 2 || snap(t, tg.c, k[1]).exists {
			t.Fatalf("penalty 0: %v, want denied by the fixed window and no block", m)
		}
		t0 := serverMs(t, tg.c)
		m := multi(t, tg.c, false, k, blockGroup(300_000), blockGroup(0), blockGroup(200_000), full)
		t1 := serverMs(t, tg.c)
		if m.Binding != 1 || m.reply != (reply{false, 0, 0, 300_000, 300_000, 0}) {
			t.Fatalf("three block groups: %v, want the 300s penalty binding", m)
		}
		within(t, "block a", blockedUntil(t, tg.c, k[0]), t0+300_000, t1+300_000)
		within(t, "block c", blockedUntil(t, tg.c, k[2]), t0+200_000, t1+200_000)
		if snap(t, tg.c, k[1]).exists {
			t.Fatal("penalty 0 set a block")
		}
		// a block set by hand is observed by penalty 0, and binds by its own remaining time;
		// reset_after is the longest of the denying groups'
		fcall(t, tg.c, "rl_block", k[1], "400000")
		m = multi(t, tg.c, false, k[1:], blockGroup(0), blockGroup(0), group(fixedSlow, 10, 0, 0))
		if m.Binding != 1 || m.RetryAfter <= 300_000 || m.ResetAfter != m.RetryAfter {
			t.Fatalf("a block by hand: %v, want it binding, reset its own", m)
		}

		// only blocks: refused before anything
		for _, ro := range []bool{false, true} {
			fn := map[bool]string{false: "rl_multi", true: "rl_multi_peek"}[ro]
			_, err := tryMulti(tg.c, ro, fn, k[:2], append(blockGroup(100), blockGroup(0)...))
			if !isRLERR(err) || !strings.Contains(err.Error(), fn+":") {
				t.Fatalf("%s of blocks only: %v, want RLERR", fn, err)
			}
		}
	})
}

// A block group and the limits it guards live in one slot: on a cluster the decision is one
// call there, and keys of other slots are refused (CROSSSLOT) before the function runs.
func TestBlockInOneSlot(t *testing.T) {
	for _, tg := range servers(t) {
		if tg.name != "cluster" {
			continue
		}
		roomInWindow(t, tg.c, 60_000, 2*time.Second)
		k := tagKeys(t, 2)
		fcall(t, tg.c, fixedSlow.fn, k[1], fixedSlow.args(1, 1)...)
		m := multi(t, tg.c, false, k, blockGroup(60_000), group(fixedSlow, 1, 1, 0))
		if m.Binding != 1 || m.RetryAfter != 60_000 || blockedUntil(t, tg.c, k[0]) == 0 {
			t.Fatalf("a block and its limit in one slot of a cluster: %v", m)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a, b := "{a}"+keyFor(t), "{b}"+keyFor(t)
		cmd := tg.primary.B().Arbitrary("FCALL", "rl_multi", "2", a, b).Args(blockGroup(1000)...).Args(group(fixedSlow, 10, 1, 0)...).Build()
		if err := tg.primary.Do(ctx, cmd).Error(); err == nil || !strings.Contains(err.Error(), "CROSSSLOT") {
			t.Fatalf("a block in another slot than its limit: %v, want CROSSSLOT", err)
		}
	}
}

// An operator blocks and unblocks a principal while clients hammer it: every decision that
// starts after rl_block answered is refused by the block until rl_unblock is sent, and every
// decision that starts after rl_unblock answered is the limit's again.
func TestBlockWhileHammered(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		roomInWindow(t, tg.c, 60_000, 5*time.Second)
		k := tagKeys(t, 2)
		gs := append(blockGroup(0), group(fixedSlow, 1_000_000, 1, 0)...)
		type outcome struct {
			sent, received time.Time
			m              multiReply
		}
		var (
			mu       sync.Mutex
			outcomes []outcome
			stop     atomic.Bool
			wg       sync.WaitGroup
			failed   atomic.Value
		)
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					sent := time.Now()
					m, err := tryMulti(tg.c, false, "rl_multi", k, gs)
					if err != nil {
						failed.Store(err)
						return
					}
					mu.Lock()
					outcomes = append(outcomes, outcome{sent, time.Now(), m})
					mu.Unlock()
				}
			}()
		}
		time.Sleep(100 * time.Millisecond)
		fcall(t, tg.c, "rl_block", k[0], "600000")
		blocked := time.Now()
		time.Sleep(200 * time.Millisecond)
		unblockSent := time.Now()
		fcall(t, tg.c, "rl_unblock", k[0])
		unblocked := time.Now()
		time.Sleep(100 * time.Millisecond)
		stop.Store(true)
		wg.Wait()
		if err := failed.Load(); err != nil {
			t.Fatal(err)
		}
		var during, after, admitted int
		for _, o := range outcomes {
			switch {
			case o.sent.After(blocked) && o.received.Before(unblockSent):
				during++
				if o.m.Allowed || o.m.Binding != 1 || o.m.RetryAfter <= 0 || o.m.RetryAfter > 600_000 {
					t.Fatalf("a decision during the block: %v", o.m)
				}
			case o.sent.After(unblocked):
				after++
				if !o.m.Allowed || o.m.Binding != 2 {
					t.Fatalf("a decision after rl_unblock: %v", o.m)
				}
			}
			if o.m.Allowed {
				admitted++
			}
		}
		if during == 0 || after == 0 {
			t.Fatalf("%d decisions during the block, %d after it: the test proves nothing", during, after)
		}
		p := fcallRO(t, tg.c, fixedSlow.fn+"_peek", k[1], fixedSlow.args(1_000_000, 0)...)
		if used := 1_000_000 - p.Remaining; used != int64(admitted) {
			t.Fatalf("the limit counted %d units, %d decisions were admitted", used, admitted)
		}
		t.Logf("%d decisions: %d during the block, %d after it", len(outcomes), during, after)
	})
}
