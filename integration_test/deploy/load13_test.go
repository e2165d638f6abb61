package deploy

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
)

// TestDeploy13UnderLoad: 1.0, 1.1 and 1.2 clients, and a 1.3 client (holds taken, added and
// settled; rl_multi holding a limit with every group's reply), call continuously on keys spread
// over the three shards while the deployer takes the cluster from 1.2.0 to 1.3.0 and back,
// forced, to 1.2.0:
//   - no 1.0, 1.1 or 1.2 call fails at any time: both releases have every one of them;
//   - no 1.3 call fails while every node answers 1.3.0; outside that, a node on 1.2.0 refuses
//     one only as 1.2.0 refuses it (an unknown function, or an unknown rl_multi group);
//   - every held limiter and lease key (written under 1.2.0 with 1.0 and 1.1 calls) has the
//     same bytes and expiry after each deploy as before it, and answers as before;
//   - holds taken under 1.3.0 stay charged after the rollback, as docs/library.md says: 1.2.0
//     reads their limiter as 1.3.0 did, and leaves their hold key as it was.
func TestDeploy13UnderLoad(t *testing.T) {
	v120, v130 := must(releases.Find("1.2.0")), must(releases.Find("1.3.0"))
	cl := sharedCluster(t)
	tg := discover(t, urlOf(cl.Primaries[0]))
	deploy(t, tg, v120, true)
	requireVersion(t, cl, "1.2.0")

	vk := cl.Client(t, false)
	lim := harness.NewLimiter(t, vk, client.Options{Deadline: 5 * time.Second, Fallback: client.ReturnError})
	held := holdState(t, cl, vk)
	held.write11(t, vk, "1.2.0")

	// The 1.0 to 1.2 clients run as if every node had every call they make (both releases do).
	var always atomic.Int32
	always.Store(phaseAll120)
	var phase13 atomic.Int32 // phase13Mixed, phase13All, phase13Down
	v10 := &tally{name: "1.0 client"}
	v11 := &tally{name: "1.1 client"}
	v12 := &tally{name: "1.2 client"}
	v13 := &tally{name: "1.3 client"}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() { load10(ctx, lim, w, &always, v10) })
	}
	for w := range 2 {
		wg.Go(func() { load11(ctx, vk, w, &always, v11) })
		wg.Go(func() { load12(ctx, vk, w, &always, v12) })
		wg.Go(func() { load13(ctx, vk, w, &phase13, v13) })
	}

	window := func(name, to string, force bool) {
		time.Sleep(300 * time.Millisecond) // traffic before, between and after the deploys
		keys := held.snapshot(t, vk)
		began := time.Now()
		rep := deploy(t, tg, must(releases.Find(to)), force)
		t.Logf("%s: deploy took %s (report: %s)", name, time.Since(began).Round(time.Millisecond), rep.Duration.Round(time.Millisecond))
		requireVersion(t, cl, to)
		held.same(t, vk, keys, name)
	}

	window("upgrade 1.2.0 -> 1.3.0", v130.Version, false)
	phase13.Store(phase13All)
	held.check(t, "after the upgrade to 1.3.0")
	held.checkLeases(t, vk, "after the upgrade to 1.3.0")
	time.Sleep(500 * time.Millisecond) // the 1.3 client against 1.3.0 everywhere
	// a hold of 7 that 1.2.0 will find charged
	kept := "{v13:kept}"
	keys := []string{kept + ":fixed_window", kept + ":holds:fixed_window"}
	for _, k := range keys {
		if err := vk.Do(t.Context(), vk.B().Del().Key(k).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	g := []string{"fixed_window", "100", strconv.FormatInt(slow.Milliseconds(), 10), "7", "0"}
	if r, err := vk.Do(t.Context(), vk.B().Fcall().Function("rl_hold").Numkeys(2).Key(keys...).Arg(append(g, "kept", "600000", "0")...).Build()).AsIntSlice(); err != nil || len(r) != 8 || r[0] != 1 || r[2] != 93 || r[6] != 7 {
		t.Fatalf("rl_hold of 7 under 1.3.0: %v, %v", r, err)
	}
	holdKey := func() string {
		d, err := vk.Do(t.Context(), vk.B().Dump().Key(keys[1]).Build()).ToString()
		if err != nil {
			t.Fatalf("DUMP %s: %v", keys[1], err)
		}
		return d
	}
	before := holdKey()

	phase13.Store(phase13Down)
	window("rollback 1.3.0 -> 1.2.0 (forced)", v120.Version, true)
	held.check(t, "after the rollback to 1.2.0")
	held.checkLeases(t, vk, "after the rollback to 1.2.0")
	if r, err := vk.Do(t.Context(), vk.B().FcallRo().Function("rl_fixed_window_peek").Numkeys(1).Key(keys[0]).Arg(g[1:4]...).Build()).AsIntSlice(); err != nil || len(r) != 6 || r[2] != 93 {
		t.Errorf("1.2.0 reads the held limiter: %v, %v; want its 7 units still charged (93 left)", r, err)
	}
	if holdKey() != before {
		t.Error("the rollback changed a hold key")
	}
	time.Sleep(300 * time.Millisecond)
	stop()
	wg.Wait()

	for _, tl := range []*tally{v10, v11, v12, v13} {
		t.Logf("%s: %d calls over the run, %d failed, %d refused by 1.2.0 (allowed), %d answered while every node had them",
			tl.name, tl.calls.Load(), tl.failed.Load(), tl.refused.Load(), tl.strict.Load())
		if tl.failed.Load() != 0 {
			t.Errorf("%s: %d calls failed; first: %v", tl.name, tl.failed.Load(), tl.first.Load())
		}
	}
	if v10.calls.Load() < 500 {
		t.Errorf("the 1.0 client made only %d calls: the load did not run", v10.calls.Load())
	}
	for op := range 3 {
		if v13.strictByOp[op].Load() == 0 {
			t.Errorf("the 1.3 client's calls of kind %d never ran while every node had 1.3.0", op)
		}
	}
	if v13.refused.Load() == 0 {
		t.Error("no call of the 1.3 client was refused by 1.2.0: it did not run before the upgrade or after the rollback")
	}
}

// Phases of the cluster as the 1.3 client sees them; they only move forward.
const (
	phase13Mixed = iota // before and during the upgrade: a node may run 1.2.0
	phase13All          // every node answers 1.3.0: every 1.3 call must succeed
	phase13Down         // during and after the rollback: a node may run 1.2.0 again
)

func needs13(was, now int32) bool { return was == phase13All && now == phase13All }

// load13 is a 1.3 client: holds on a fixed window of a principal (taken, added to and settled),
// and an rl_multi holding a token bucket beside a fixed window, with every group's reply.
func load13(ctx context.Context, vk valkey.Client, w int, phase *atomic.Int32, tl *tally) {
	period := strconv.FormatInt(slow.Milliseconds(), 10)
	for n := 0; ctx.Err() == nil; n++ {
		tag := fmt.Sprintf("{v13:%d:%d}", w, n%64)
		fw := []string{tag + ":fixed_window", tag + ":holds:fixed_window"}
		group := func(cost int) []string {
			return []string{"fixed_window", "1000000", period, strconv.Itoa(cost), "0"}
		}
		id := fmt.Sprintf("s%d", n)
		var calls []call
		op := n % 3
		switch op {
		case 0: // a stream: a hold, two adds, the settle of what it used
			calls = append(calls,
				call{fcallCmd(vk, false, "rl_hold", fw, append(group(20), id, "60000", "0")...), 8},
				call{fcallCmd(vk, false, "rl_hold", fw, append(group(10), id, "60000", "0")...), 8},
				call{fcallCmd(vk, false, "rl_hold", fw, append(group(10), id, "60000", "0")...), 8},
				call{fcallCmd(vk, false, "rl_hold_settle", fw, append(group(35), id)...), 8})
		case 1: // a request held on two limits, every reply; then its settles
			keys := []string{tag + ":token_bucket", tag + ":holds:token_bucket", fw[0], fw[1]}
			bucket := []string{"token_bucket", "1000000", "1000000", "3600000"}
			args := append(append([]string{}, bucket...), "5", "0", "hold", id, "60000", "1")
			args = append(append(args, group(5)...), "hold", id, "60000", "0", "replies")
			calls = append(calls, call{fcallCmd(vk, false, "rl_multi", keys, args...), 7 + 4*6},
				call{fcallCmd(vk, false, "rl_hold_settle", keys[:2], append(bucket, "3", "0", id)...), 8},
				call{fcallCmd(vk, false, "rl_hold_settle", fw, append(group(3), id)...), 8})
		case 2: // a hold left to expire, given back by the next call's sweep
			calls = append(calls, call{fcallCmd(vk, false, "rl_hold", fw, append(group(1), id, "1", "0")...), 8},
				call{fcallCmd(vk, true, "rl_multi_peek", fw[:1], append(group(1), "replies")...), 7 + 6})
		}
		if !tl.send(ctx, vk, phase, op, calls, needs13, refusedBy12) {
			return
		}
	}
}

// refusedBy12 reports whether err is how 1.2.0 refuses a 1.3 call: a function it does not
// have, an rl_multi group it does not know, or replies (an argument more than its groups take).
func refusedBy12(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "Function not found") ||
		strings.HasPrefix(msg, "RLERR rl_multi") && (strings.Contains(msg, "unknown algorithm 'hold'") || strings.Contains(msg, " groups take "))
}
