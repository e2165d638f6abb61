package deploy

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/calendar"
	"github.com/rlfn/rlfn/internal/harness"
)

// TestDeployUnderLoad: a 1.0 client (every algorithm, limiter and peek, with 1.0 arguments),
// a 1.1 client (reserve, refunds, concurrency leases, rl_multi) and a 1.2 client (calendar
// quotas, blocks, and their rl_multi groups) call continuously on keys spread over the three
// shards while the deployer takes the cluster through the released 1.0.0, 1.1.0 and 1.2.0, and
// back, forced, to 1.1.0 and to 1.0.0:
//   - no 1.0 call fails at any time: FUNCTION LOAD REPLACE swaps the library atomically on
//     each primary, and every 1.x release keeps every 1.0 call valid;
//   - no 1.1 call fails from the moment every node answers rl_version 1.1.0 until the rollback
//     to 1.0.0 starts, through the upgrade to 1.2.0 and the rollback from it; outside that, a
//     node still (or again) on 1.0.0 may refuse a 1.1 call, but only as 1.0.0 refuses one (an
//     unknown function, or RLERR on the extra argument);
//   - no 1.2 call fails while every node answers 1.2.0; outside that, a node on an older
//     release may refuse one, but only as it refuses one (an unknown function, or an unknown
//     rl_multi group);
//   - no limiter state is lost: limiters exhausted or partly used under 1.0.0 answer exactly
//     as before after each deploy; state written by 1.1.0 and by 1.2.0 (refunds, reserve
//     calls, leases) is read by the release after it, the rollbacks' included, exactly as the
//     one that wrote it read it; and every held key, its bytes and its expiry, is the same
//     after each deploy as before it.
func TestDeployUnderLoad(t *testing.T) {
	cl := sharedCluster(t)
	tg := discover(t, urlOf(cl.Primaries[0]))
	deploy(t, tg, v100, false)
	requireVersion(t, cl, "1.0.0")

	vk := cl.Client(t, false)
	lim := harness.NewLimiter(t, vk, client.Options{Deadline: time.Second, Fallback: client.ReturnError}) // any failure is an error here
	held := holdState(t, cl, vk)
	before := fcalls(t, cl)

	var phase atomic.Int32 // a phaseX below: which answers the 1.1 and 1.2 clients may get
	v10 := &tally{name: "1.0 client"}
	v11 := &tally{name: "1.1 client"}
	v12 := &tally{name: "1.2 client"}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	const workers10, workers11, workers12 = 6, 3, 2
	for w := range workers10 {
		wg.Go(func() { load10(ctx, lim, w, &phase, v10) })
	}
	for w := range workers11 {
		wg.Go(func() { load11(ctx, vk, w, &phase, v11) })
	}
	for w := range workers12 {
		wg.Go(func() { load12(ctx, vk, w, &phase, v12) })
	}

	window := func(name string, to string, force bool) {
		time.Sleep(300 * time.Millisecond) // traffic before, between and after the deploys
		c10, f10, c11, f11, c12, f12 := v10.calls.Load(), v10.failed.Load(), v11.calls.Load(), v11.failed.Load(), v12.calls.Load(), v12.failed.Load()
		keys := held.snapshot(t, vk)
		began := time.Now()
		rep := deploy(t, tg, must(releases.Find(to)), force)
		t.Logf("%s: deploy took %s (report: %s); during it the 1.0 client made %d calls (%d failed), the 1.1 client %d (%d failed), the 1.2 client %d (%d failed)",
			name, time.Since(began).Round(time.Millisecond), rep.Duration.Round(time.Millisecond),
			v10.calls.Load()-c10, v10.failed.Load()-f10, v11.calls.Load()-c11, v11.failed.Load()-f11, v12.calls.Load()-c12, v12.failed.Load()-f12)
		requireVersion(t, cl, to)
		held.same(t, vk, keys, name)
	}

	window("upgrade 1.0.0 -> 1.1.0", "1.1.0", false)
	phase.Store(phaseAll110)
	held.check(t, "after the upgrade to 1.1.0")
	held.write11(t, vk, "1.1.0")
	time.Sleep(300 * time.Millisecond) // the 1.1 client against 1.1.0 everywhere
	window("upgrade 1.1.0 -> 1.2.0", "1.2.0", false)
	phase.Store(phaseAll120)
	held.check(t, "after the upgrade to 1.2.0")
	held.checkLeases(t, vk, "after the upgrade to 1.2.0")
	held.write11(t, vk, "1.2.0")
	time.Sleep(300 * time.Millisecond) // the 1.2 client against 1.2.0 everywhere
	phase.Store(phaseDown120)
	window("rollback 1.2.0 -> 1.1.0 (forced)", "1.1.0", true)
	held.check(t, "after the rollback to 1.1.0")
	held.checkLeases(t, vk, "after the rollback to 1.1.0")
	phase.Store(phaseRollback)
	window("rollback 1.1.0 -> 1.0.0 (forced)", "1.0.0", true)
	held.check(t, "after the rollback to 1.0.0")
	time.Sleep(300 * time.Millisecond)
	stop()
	wg.Wait()

	for _, tl := range []*tally{v10, v11, v12} {
		t.Logf("%s: %d calls by its goroutines over the run, %d failed, %d refused by an older release (allowed), %d answered while every node ran a release that must answer them",
			tl.name, tl.calls.Load(), tl.failed.Load(), tl.refused.Load(), tl.strict.Load())
		if tl.failed.Load() != 0 {
			t.Errorf("%s: %d calls failed; first: %v", tl.name, tl.failed.Load(), tl.first.Load())
		}
	}
	if n := v10.calls.Load(); n < 1000 {
		t.Errorf("the 1.0 client made only %d calls: the load did not run", n)
	}
	for _, tl := range []*tally{v11, v12} {
		for op := range tl.strictByOp {
			if n := tl.strictByOp[op].Load(); n == 0 {
				t.Errorf("the %s's calls of kind %d never ran while every node ran a release that has them", tl.name, op)
			}
		}
		if tl.refused.Load() == 0 {
			t.Errorf("no call of the %s was refused by an older release: it did not run before the upgrades or after the rollbacks", tl.name)
		}
	}
	after := fcalls(t, cl)
	for _, p := range cl.Primaries {
		if after[p.Addr] <= before[p.Addr] {
			t.Errorf("shard %s served no calls", p.Addr)
		}
	}
}

// Phases of the cluster as the 1.1 and 1.2 clients see it; they only move forward.
const (
	phaseMixed    = iota // before and during the upgrade to 1.1.0: a node may run 1.0.0
	phaseAll110          // every node answers 1.1.0 (or, during the next upgrade, 1.2.0): every 1.1 call must succeed
	phaseAll120          // every node answers 1.2.0: every 1.1 and 1.2 call must succeed
	phaseDown120         // during and after the rollback to 1.1.0: every 1.1 call must succeed
	phaseRollback        // during and after the rollback to 1.0.0: a node may run 1.0.0 again
)

// needs11 and needs12 report whether a call made while the phase went from was to now (they
// only move forward) found every node on a release that has it, so that it must succeed.
func needs11(was, now int32) bool { return was >= phaseAll110 && now <= phaseDown120 }
func needs12(was, now int32) bool { return was == phaseAll120 && now == phaseAll120 }

// tally counts one client's calls.
type tally struct {
	name                   string
	calls, failed, refused atomic.Int64
	strict                 atomic.Int64    // calls made and answered while every node ran a release that has them
	strictByOp             [5]atomic.Int64 // the 1.1 and 1.2 clients' strict, by kind of call
	first                  atomic.Value    // the first failure, described
}

func (tl *tally) fail(format string, args ...any) {
	tl.failed.Add(1)
	tl.first.CompareAndSwap(nil, fmt.Sprintf(format, args...))
}

// call is one command of the 1.1 or 1.2 client and the length of the reply it wants.
type call struct {
	cmd      valkey.Completed
	replyLen int
}

// send makes the calls one by one and counts each in tl: a reply of the wanted length is a
// success; an error is allowed only outside the phases in which every node has the call (as
// must says), and only if refused says it is how an older release refuses it. It returns
// false once ctx is done.
func (tl *tally) send(ctx context.Context, vk valkey.Client, phase *atomic.Int32, op int, calls []call, must func(was, now int32) bool, refused func(error) bool) bool {
	for _, c := range calls {
		was := phase.Load()
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		reply, err := vk.Do(cctx, c.cmd).AsIntSlice()
		cancel()
		if ctx.Err() != nil {
			return false
		}
		tl.calls.Add(1)
		strict := must(was, phase.Load())
		switch {
		case err == nil && len(reply) != c.replyLen:
			tl.fail("%v: reply %v, want %d integers", c.cmd.Commands(), reply, c.replyLen)
		case err == nil && strict:
			tl.strict.Add(1)
			tl.strictByOp[op].Add(1)
		case err == nil:
		case !strict && refused(err):
			tl.refused.Add(1)
		default:
			tl.fail("%v (phase %d to %d): %v", c.cmd.Commands(), was, phase.Load(), err)
		}
	}
	return true
}

// fcallCmd builds an FCALL, or an FCALL_RO when ro.
func fcallCmd(vk valkey.Client, ro bool, fn string, keys []string, args ...string) valkey.Completed {
	if ro {
		return vk.B().FcallRo().Function(fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	return vk.B().Fcall().Function(fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

// loadLimits are the 1.0 client's limits: every algorithm, both leaky modes.
var loadLimits = []client.Limit{
	client.FixedWindow{Limit: 1000, Window: time.Second},
	client.SlidingLog{Limit: 100, Window: time.Second},
	client.SlidingWindow{Limit: 1000, Window: time.Second},
	client.TokenBucket{Capacity: 100, Rate: 1000, Period: time.Second},
	client.LeakyBucket{Capacity: 100, Rate: 1000, Period: time.Second, Mode: client.Police},
	client.LeakyBucket{Capacity: 100, Rate: 1000, Period: time.Second, Mode: client.Shape},
}

// load10 is a 1.0 client: Allow and Peek with 1.0 arguments, through the Go client.
func load10(ctx context.Context, lim *client.Limiter, w int, phase *atomic.Int32, tl *tally) {
	for n := 0; ctx.Err() == nil; n++ {
		was := phase.Load()
		key := fmt.Sprintf("load:%d:%d", w, n%256)
		limit := loadLimits[n%len(loadLimits)]
		var res client.Result
		var err error
		if n%7 == 0 {
			res, err = lim.Peek(ctx, key, limit)
		} else {
			res, err = lim.Allow(ctx, key, limit)
		}
		if ctx.Err() != nil {
			return // stopped mid-call: not a failure of the deploy
		}
		tl.calls.Add(1)
		if err != nil || res.Source == client.FromFallback {
			tl.fail("%s %T: %v (source %v)", key, limit, err, res.Source)
		} else if needs11(was, phase.Load()) {
			tl.strict.Add(1)
		}
	}
}

// algorithm is one limiter called by raw FCALL: its 1.0 ARGV is pre, cost, post.
type algorithm struct {
	name      string // fixed_window, ...
	limit     client.Limit
	pre, post []string
	max       int64 // its limit or capacity
}

// argv is the limiter's ARGV for cost, then reserve if any.
func (a algorithm) argv(cost int64, reserve ...int64) []string {
	out := append(slices.Clone(a.pre), strconv.FormatInt(cost, 10))
	out = append(out, a.post...)
	for _, r := range reserve {
		out = append(out, strconv.FormatInt(r, 10))
	}
	return out
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// algorithms builds every algorithm (both leaky modes) for a limit of n per period.
func algorithms(n int64, period time.Duration) []algorithm {
	ns := strconv.FormatInt(n, 10)
	window := []string{ns, ms(period)}
	bucket := []string{ns, "1", ms(period)}
	return []algorithm{
		{"fixed_window", client.FixedWindow{Limit: n, Window: period}, window, nil, n},
		{"sliding_log", client.SlidingLog{Limit: n, Window: period}, window, nil, n},
		{"sliding_window", client.SlidingWindow{Limit: n, Window: period}, window, nil, n},
		{"token_bucket", client.TokenBucket{Capacity: n, Rate: 1, Period: period}, bucket, nil, n},
		{"leaky_bucket", client.LeakyBucket{Capacity: n, Rate: 1, Period: period, Mode: client.Police}, bucket, []string{"police"}, n},
		{"leaky_bucket", client.LeakyBucket{Capacity: n, Rate: 1, Period: period, Mode: client.Shape}, bucket, []string{"shape"}, n},
	}
}

// load11 is a 1.1 client: calls that need 1.1.0, by raw FCALL, each reply checked for its
// shape. See TestDeployUnderLoad for which failures are allowed when.
func load11(ctx context.Context, vk valkey.Client, w int, phase *atomic.Int32, tl *tally) {
	algs := algorithms(100, 100*time.Millisecond)
	fcall := func(ro bool, fn string, keys []string, args ...string) call {
		return call{fcallCmd(vk, ro, fn, keys, args...), 6}
	}
	for n := 0; ctx.Err() == nil; n++ {
		tag := fmt.Sprintf("{v11:%d:%d}", w, n%128)
		a := algs[n%len(algs)]
		key := tag + ":" + a.name
		var calls []call
		op := n / len(algs) % len(tl.strictByOp)
		switch op {
		case 0: // a normal caller leaves a reserve
			calls = append(calls, fcall(false, "rl_"+a.name, []string{key}, a.argv(1, 10)...))
		case 1: // a peek with a reserve, on a primary
			calls = append(calls, fcall(true, "rl_"+a.name+"_peek", []string{key}, a.argv(1, 10)...))
		case 2: // charge 3, refund 2
			calls = append(calls, fcall(false, "rl_"+a.name, []string{key}, a.argv(3)...),
				fcall(false, "rl_"+a.name+"_refund", []string{key}, a.argv(2)...))
		case 3: // a lease taken, renewed, released
			key, id := tag+":concurrency", fmt.Sprintf("worker-%d-%d", w, n)
			acquire := func() call { return fcall(false, "rl_concurrency", []string{key}, "5", "2000", id, "1") }
			calls = append(calls, acquire(), acquire(), fcall(false, "rl_concurrency_release", []string{key}, "5", "2000", id))
		case 4: // two limits of one principal in one decision
			b := algs[(n+1)%len(algs)]
			keys := []string{key, tag + ":" + b.name + ":multi"}
			args := append(append([]string{a.name}, a.argv(1, 0)...), append([]string{b.name}, b.argv(1, 5)...)...)
			calls = append(calls, call{fcallCmd(vk, false, "rl_multi", keys, args...), 7})
		}
		if !tl.send(ctx, vk, phase, op, calls, needs11, refusedBy100) {
			return
		}
	}
}

// load12 is a 1.2 client: a daily quota in UTC (boundaries computed as the client does, from
// this host's clock, which the servers share) and blocks, by raw FCALL, each reply checked for
// its shape. See TestDeployUnderLoad for which failures are allowed when.
func load12(ctx context.Context, vk valkey.Client, w int, phase *atomic.Int32, tl *tally) {
	fcall := func(ro bool, fn string, keys []string, args ...string) call {
		return call{fcallCmd(vk, ro, fn, keys, args...), 6}
	}
	multi := func(ro bool, keys []string, args ...string) call {
		fn := map[bool]string{false: "rl_multi", true: "rl_multi_peek"}[ro]
		return call{fcallCmd(vk, ro, fn, keys, args...), 7}
	}
	for n := 0; ctx.Err() == nil; n++ {
		b, err := calendar.Windows(calendar.Day, time.Time{}, time.Now())
		if err != nil {
			tl.fail("calendar boundaries: %v", err)
			return
		}
		bounds := make([]string, len(b))
		for i, v := range b {
			bounds[i] = strconv.FormatInt(v, 10)
		}
		// limit, b1..b4, cost, then reserve if any
		quota := func(limit, cost int64, reserve ...int64) []string {
			out := append(append([]string{strconv.FormatInt(limit, 10)}, bounds...), strconv.FormatInt(cost, 10))
			for _, r := range reserve {
				out = append(out, strconv.FormatInt(r, 10))
			}
			return out
		}
		tag := fmt.Sprintf("{v12:%d:%d}", w, n%128)
		key, block := tag+":calendar", tag+":block"
		var calls []call
		op := n % len(tl.strictByOp)
		switch op {
		case 0: // a quota that leaves a reserve
			calls = append(calls, fcall(false, "rl_calendar", []string{key}, quota(100000, 1, 10)...))
		case 1: // a peek, on a primary
			calls = append(calls, fcall(true, "rl_calendar_peek", []string{key}, quota(100000, 1)...))
		case 2: // charge 3, refund 2
			calls = append(calls, fcall(false, "rl_calendar", []string{key}, quota(100000, 3)...),
				fcall(false, "rl_calendar_refund", []string{key}, quota(100000, 2)...))
		case 3: // an operator blocks the principal, a decision it guards is refused, the block is lifted
			calls = append(calls, fcall(false, "rl_block", []string{block}, "60000"),
				multi(true, []string{block, key}, append([]string{"block", "0", "calendar"}, quota(100000, 1, 0)...)...),
				fcall(false, "rl_unblock", []string{block}),
				fcall(true, "rl_block_peek", []string{block}))
		case 4: // a quota of 1 guarded by a 50 ms penalty: the second call of a window denies and sets it
			calls = append(calls, multi(false, []string{block, tag + ":calendar:penalty"},
				append([]string{"block", "50", "calendar"}, quota(1, 1, 0)...)...))
		}
		if !tl.send(ctx, vk, phase, op, calls, needs12, refusedByOlder) {
			return
		}
	}
}

// refusedBy100 reports whether err is how 1.0.0 refuses a 1.1 call: a function it does not
// have, or an argument list longer than its own.
func refusedBy100(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "Function not found") || (strings.HasPrefix(msg, "RLERR") && strings.Contains(msg, " takes "))
}

// refusedByOlder reports whether err is how 1.1.0 or 1.0.0 refuses a 1.2 call: a function it
// does not have, or an rl_multi group it does not know.
func refusedByOlder(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "Function not found") ||
		(strings.HasPrefix(msg, "RLERR rl_multi") && strings.Contains(msg, "unknown algorithm"))
}

// requireVersion checks that every node answers rl_version want.
func requireVersion(t *testing.T, cl *harness.Cluster, want string) {
	t.Helper()
	for _, s := range cl.Nodes() {
		if v, err := rlVersion(t, s); err != nil || v != want {
			t.Fatalf("%s: rl_version %q, %v; want %s", s.Addr, v, err, want)
		}
	}
}

// slow is the period of the held limiters: nothing refills, leaks or leaves a window while
// the test runs, so a limiter's remaining changes only when a call changes it. (A fixed
// window is aligned to multiples of slow since the epoch: a run crosses a boundary once in
// millions.)
const slow = 1000 * time.Hour

// heldState is limiters written under 1.0.0 on principals spread over every shard, and what
// a 1.0 peek of each answers; and, from 1.1.0 on, a concurrency key per principal with the
// leases taken on it.
type heldState struct {
	keys   []heldKey
	leases map[string]int64 // lease key: the leases it holds
}

type heldKey struct {
	lim       *client.Limiter
	prefix    string // the limiter's key prefix
	principal string
	alg       algorithm
	want      client.Result // what a 1.0 peek of cost 1 answers: Allowed and Remaining
}

// key is the held limiter's server key.
func (k heldKey) key() string { return k.lim.Key(k.principal, k.alg.limit) }

// holdState exhausts (even principals: every unit taken, then one more call denied) or
// partly uses (odd ones: 2 of 5 taken) every algorithm of 5 units per slow, under 1.0.0.
func holdState(t *testing.T, cl *harness.Cluster, vk valkey.Client) *heldState {
	t.Helper()
	// Two principals per shard, one exhausted and one partly used on each.
	perShard := map[string][]string{}
	for i := 0; len(perShard) < len(cl.Primaries) || slices.ContainsFunc(cl.Primaries, func(p *harness.Server) bool {
		return len(perShard[p.Addr]) < 2
	}); i++ {
		if i > 1000 {
			t.Fatalf("principals do not spread over the shards: %v", perShard)
		}
		p := fmt.Sprintf("held:%d", i)
		owner := ownerOf(t, cl, "{"+p+"}").Addr
		if len(perShard[owner]) < 2 {
			perShard[owner] = append(perShard[owner], p)
		}
	}
	// Both modes of a leaky bucket share a key: the shaping one gets a prefix of its own.
	const shapePrefix = "rl:shape:"
	lims := map[string]*client.Limiter{}
	for _, prefix := range []string{"rl:", shapePrefix} {
		lims[prefix] = harness.NewLimiter(t, vk, client.Options{Prefix: prefix, Deadline: 5 * time.Second, Fallback: client.ReturnError})
	}
	h := &heldState{}
	for _, principals := range perShard {
		for i, p := range principals {
			for _, a := range algorithms(5, slow) {
				k := heldKey{prefix: "rl:", principal: p, alg: a}
				if len(a.post) > 0 && a.post[0] == "shape" {
					k.prefix = shapePrefix
				}
				lim := lims[k.prefix]
				k.lim = lim
				// The shared cluster keeps keys between tests: start from a fresh limiter.
				if err := vk.Do(t.Context(), vk.B().Del().Key(k.key()).Build()).Error(); err != nil {
					t.Fatal(err)
				}
				cost, wantRemaining := int64(2), int64(3)
				if i == 0 {
					cost, wantRemaining = 5, 0
				}
				res, err := lim.AllowN(t.Context(), p, a.limit, cost)
				if err != nil || !res.Allowed || res.Remaining != wantRemaining {
					t.Fatalf("%s %+v: AllowN(%d) under 1.0.0 = %+v, %v", p, a.limit, cost, res, err)
				}
				if i == 0 {
					if res, err := lim.Allow(t.Context(), p, a.limit); err != nil || res.Allowed {
						t.Fatalf("%s %+v: Allow on an exhausted limiter = %+v, %v", p, a.limit, res, err)
					}
				}
				k.want = client.Result{Allowed: wantRemaining > 0, Limit: 5, Remaining: wantRemaining}
				h.keys = append(h.keys, k)
			}
		}
	}
	h.check(t, "under 1.0.0")
	return h
}

// check peeks every held limiter as a 1.0 client does and compares with what it should hold;
// an exhausted one must also deny a call (which consumes nothing).
func (h *heldState) check(t *testing.T, when string) {
	t.Helper()
	for _, k := range h.keys {
		if !k.want.Allowed {
			if res, err := k.lim.Allow(t.Context(), k.principal, k.alg.limit); err != nil || res.Allowed || res.Remaining != 0 {
				t.Errorf("%s %s %+v: Allow on an exhausted limiter = %+v, %v", when, k.key(), k.alg.limit, res, err)
			}
		}
		res, err := k.lim.Peek(t.Context(), k.principal, k.alg.limit)
		if err != nil || res.Allowed != k.want.Allowed || res.Limit != k.want.Limit || res.Remaining != k.want.Remaining {
			t.Errorf("%s %s %+v: peek = %+v, %v; want allowed %v, remaining %d as before",
				when, k.key(), k.alg.limit, res, err, k.want.Allowed, k.want.Remaining)
		}
	}
}

// write11 changes every held limiter with 1.1 calls under the release `under` (1.1.0 or
// later): a refund of 1, then a call of cost 1 leaving a reserve of 2, admitted only where 4
// units are left (the partly used ones), and one more lease of slow on each principal's
// concurrency key. Each reply is checked, and the held state becomes what the release reports.
func (h *heldState) write11(t *testing.T, vk valkey.Client, under string) {
	t.Helper()
	fcall := func(fn, key string, args []string) []int64 {
		t.Helper()
		reply, err := vk.Do(t.Context(), vk.B().Fcall().Function(fn).Numkeys(1).Key(key).Arg(args...).Build()).AsIntSlice()
		if err != nil || len(reply) != 6 {
			t.Fatalf("%s: %s %s %v: %v, %v", under, fn, key, args, reply, err)
		}
		return reply
	}
	if h.leases == nil {
		h.leases = map[string]int64{}
	}
	for i := range h.keys {
		k := &h.keys[i]
		key := k.key()
		refunded := k.want.Remaining + 1
		if got := fcall("rl_"+k.alg.name+"_refund", key, k.alg.argv(1)); got[0] != 1 || got[2] != refunded {
			t.Errorf("%s: %s: refund of 1 = %v, want remaining %d", under, key, got, refunded)
		}
		admit := refunded >= 1+2
		got := fcall("rl_"+k.alg.name, key, k.alg.argv(1, 2))
		k.want.Remaining = refunded
		if admit {
			k.want.Remaining--
		}
		if (got[0] == 1) != admit || got[2] != max(k.want.Remaining-2, 0) {
			t.Errorf("%s: %s: cost 1 with a reserve of 2 and %d left = %v, want allowed %v, remaining %d",
				under, key, refunded, got, admit, max(k.want.Remaining-2, 0))
		}
		k.want.Allowed = k.want.Remaining > 0
		lk := "rl:{" + k.principal + "}:concurrency"
		if _, ok := h.leases[lk]; !ok {
			// The shared cluster keeps keys between tests: start without leases.
			if err := vk.Do(t.Context(), vk.B().Del().Key(lk).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			h.leases[lk] = 0
		}
	}
	for key, n := range h.leases {
		if got := fcall("rl_concurrency", key, leaseArgs(under)); got[0] != 1 || got[2] != leaseLimit-n-1 {
			t.Errorf("%s: %s: a lease with %d held = %v, want admitted with %d left", under, key, n, got, leaseLimit-n-1)
		}
		h.leases[key] = n + 1
	}
	h.check(t, "after 1.1 refunds, reserve calls and leases under "+under)
	h.checkLeases(t, vk, "after 1.1 leases under "+under)
}

// The held leases: at most leaseLimit per principal, each for slow.
const leaseLimit = 5

func leaseArgs(id string) []string {
	return []string{strconv.Itoa(leaseLimit), strconv.FormatInt(slow.Milliseconds(), 10), id}
}

// checkLeases peeks every held concurrency key for a new holder: it is admitted, with the
// slots the held leases leave. (1.0.0 has no leases: the snapshots compare their keys then.)
func (h *heldState) checkLeases(t *testing.T, vk valkey.Client, when string) {
	t.Helper()
	for key, n := range h.leases {
		got, err := vk.Do(t.Context(), vk.B().FcallRo().Function("rl_concurrency_peek").Numkeys(1).Key(key).Arg(leaseArgs("probe")...).Build()).AsIntSlice()
		if err != nil || len(got) != 6 || got[0] != 1 || got[2] != leaseLimit-n {
			t.Errorf("%s: %s with %d leases held: peek = %v, %v; want admitted with %d free", when, key, n, got, err, leaseLimit-n)
		}
	}
}

// snapshot reads every held key as the server keeps it: its DUMP (the value, bytes for bytes)
// and its PEXPIRETIME; "" for a key that does not exist.
func (h *heldState) snapshot(t *testing.T, vk valkey.Client) map[string]string {
	t.Helper()
	keys := make([]string, 0, len(h.keys)+len(h.leases))
	for _, k := range h.keys {
		keys = append(keys, k.key())
	}
	for key := range h.leases {
		keys = append(keys, key)
	}
	out := map[string]string{}
	for _, key := range keys {
		dump, err := vk.Do(t.Context(), vk.B().Dump().Key(key).Build()).ToString()
		if valkey.IsValkeyNil(err) {
			out[key] = ""
			continue
		}
		if err != nil {
			t.Fatalf("DUMP %s: %v", key, err)
		}
		expiry, err := vk.Do(t.Context(), vk.B().Pexpiretime().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatalf("PEXPIRETIME %s: %v", key, err)
		}
		out[key] = fmt.Sprintf("%q expiring at %d", dump, expiry)
	}
	return out
}

// same checks that every held key is as before: nothing but the clients' calls changes a key,
// and none of them calls a held one while a deploy runs.
func (h *heldState) same(t *testing.T, vk valkey.Client, before map[string]string, what string) {
	t.Helper()
	for key, now := range h.snapshot(t, vk) {
		if was := before[key]; now != was {
			t.Errorf("%s changed %s: %s, was %s", what, key, now, was)
		}
	}
}

// fcalls counts FCALL and FCALL_RO calls on every primary.
func fcalls(t *testing.T, cl *harness.Cluster) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, p := range cl.Primaries {
		c := p.Client(t)
		for _, cmd := range []string{"fcall", "fcall_ro"} {
			st, err := harness.CommandStats(t.Context(), c, cmd)
			if err != nil {
				t.Fatal(err)
			}
			out[p.Addr] += st.Calls
		}
	}
	return out
}
