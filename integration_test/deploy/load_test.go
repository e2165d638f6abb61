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
	"github.com/rlfn/rlfn/internal/harness"
)

// TestDeployUnderLoad: a 1.0 client (every algorithm, limiter and peek, with 1.0 arguments)
// and a 1.1 client (reserve, refunds, concurrency leases, rl_multi) call continuously on keys
// spread over the three shards while the cluster is upgraded from the released 1.0.0 to the
// released 1.1.0 and rolled back, forced, to 1.0.0:
//   - no 1.0 call fails at any time: FUNCTION LOAD REPLACE swaps the library atomically on
//     each primary, and 1.1.0 keeps every 1.0 call valid;
//   - no 1.1 call fails once every node answers rl_version 1.1.0 and until the rollback
//     starts; outside that, a node still (or again) on 1.0.0 may refuse a 1.1 call, but only
//     as 1.0.0 refuses one (an unknown function, or RLERR on the extra argument);
//   - no limiter state is lost: limiters exhausted or partly used under 1.0.0 answer exactly
//     as before after the upgrade, and state written by 1.1.0 (refunds, reserve calls) is read
//     by 1.0.0 after the rollback exactly as 1.1.0 read it.
func TestDeployUnderLoad(t *testing.T) {
	cl := sharedCluster(t)
	tg := discover(t, urlOf(cl.Primaries[0]))
	deploy(t, tg, v100, false)
	requireVersion(t, cl, "1.0.0")

	vk := cl.Client(t, false)
	lim := harness.NewLimiter(t, vk, client.Options{Deadline: time.Second, Fallback: client.ReturnError}) // any failure is an error here
	held := holdState(t, cl, vk)
	before := fcalls(t, cl)

	var phase atomic.Int32 // a phaseX below: which answers the 1.1 client may get
	v10 := &tally{name: "1.0 client"}
	v11 := &tally{name: "1.1 client"}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	const workers10, workers11 = 6, 3
	for w := range workers10 {
		wg.Go(func() { load10(ctx, lim, w, &phase, v10) })
	}
	for w := range workers11 {
		wg.Go(func() { load11(ctx, vk, w, &phase, v11) })
	}

	window := func(name string, to string, force bool) {
		time.Sleep(300 * time.Millisecond) // traffic before, between and after the deploys
		c10, f10, c11, f11 := v10.calls.Load(), v10.failed.Load(), v11.calls.Load(), v11.failed.Load()
		began := time.Now()
		rep := deploy(t, tg, must(releases.Find(to)), force)
		t.Logf("%s: deploy took %s (report: %s); during it the 1.0 client made %d calls (%d failed), the 1.1 client %d (%d failed)",
			name, time.Since(began).Round(time.Millisecond), rep.Duration.Round(time.Millisecond),
			v10.calls.Load()-c10, v10.failed.Load()-f10, v11.calls.Load()-c11, v11.failed.Load()-f11)
		requireVersion(t, cl, to)
	}

	window("upgrade 1.0.0 -> 1.1.0", "1.1.0", false)
	phase.Store(phaseAll110)
	held.check(t, "after the upgrade")
	held.write11(t, vk)
	time.Sleep(300 * time.Millisecond) // the 1.1 client against 1.1.0 everywhere
	phase.Store(phaseRollback)
	window("rollback 1.1.0 -> 1.0.0 (forced)", "1.0.0", true)
	held.check(t, "after the rollback")
	time.Sleep(300 * time.Millisecond)
	stop()
	wg.Wait()

	for _, tl := range []*tally{v10, v11} {
		t.Logf("%s: %d calls by its goroutines over the run, %d failed, %d refused by 1.0.0 (allowed), %d answered by 1.1.0 while every node ran it",
			tl.name, tl.calls.Load(), tl.failed.Load(), tl.refused.Load(), tl.on110.Load())
		if tl.failed.Load() != 0 {
			t.Errorf("%s: %d calls failed; first: %v", tl.name, tl.failed.Load(), tl.first.Load())
		}
	}
	if n := v10.calls.Load(); n < 1000 {
		t.Errorf("the 1.0 client made only %d calls: the load did not run", n)
	}
	for op := range v11.on110ByOp {
		if n := v11.on110ByOp[op].Load(); n == 0 {
			t.Errorf("the 1.1 client's calls of kind %d never ran while every node ran 1.1.0", op)
		}
	}
	if v11.refused.Load() == 0 {
		t.Error("no 1.1 call was refused by 1.0.0: the 1.1 client did not run before the upgrade or after the rollback")
	}
	after := fcalls(t, cl)
	for _, p := range cl.Primaries {
		if after[p.Addr] <= before[p.Addr] {
			t.Errorf("shard %s served no calls", p.Addr)
		}
	}
}

// Phases of the 1.1 client's view of the cluster.
const (
	phaseMixed    = iota // before and during the upgrade: a node may run 1.0.0
	phaseAll110          // every node answers rl_version 1.1.0: every 1.1 call must succeed
	phaseRollback        // during and after the rollback: a node may run 1.0.0 again
)

// tally counts one client's calls.
type tally struct {
	name                   string
	calls, failed, refused atomic.Int64
	on110                  atomic.Int64    // calls made and answered while every node ran 1.1.0
	on110ByOp              [5]atomic.Int64 // the 1.1 client's on110, by kind of call
	first                  atomic.Value    // the first failure, described
}

func (tl *tally) fail(format string, args ...any) {
	tl.failed.Add(1)
	tl.first.CompareAndSwap(nil, fmt.Sprintf(format, args...))
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
		} else if was == phaseAll110 && phase.Load() == phaseAll110 {
			tl.on110.Add(1)
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
	fcall := func(ro bool, fn string, keys []string, args ...string) valkey.Completed {
		if ro {
			return vk.B().FcallRo().Function(fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
		}
		return vk.B().Fcall().Function(fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	for n := 0; ctx.Err() == nil; n++ {
		tag := fmt.Sprintf("{v11:%d:%d}", w, n%128)
		a := algs[n%len(algs)]
		key := tag + ":" + a.name
		var cmds []valkey.Completed
		replyLen := 6
		op := n / len(algs) % len(tl.on110ByOp)
		switch op {
		case 0: // a normal caller leaves a reserve
			cmds = append(cmds, fcall(false, "rl_"+a.name, []string{key}, a.argv(1, 10)...))
		case 1: // a peek with a reserve, on a primary
			cmds = append(cmds, fcall(true, "rl_"+a.name+"_peek", []string{key}, a.argv(1, 10)...))
		case 2: // charge 3, refund 2
			cmds = append(cmds, fcall(false, "rl_"+a.name, []string{key}, a.argv(3)...),
				fcall(false, "rl_"+a.name+"_refund", []string{key}, a.argv(2)...))
		case 3: // a lease taken, renewed, released
			key, id := tag+":concurrency", fmt.Sprintf("worker-%d-%d", w, n)
			acquire := func() valkey.Completed { return fcall(false, "rl_concurrency", []string{key}, "5", "2000", id, "1") }
			cmds = append(cmds, acquire(), acquire(), fcall(false, "rl_concurrency_release", []string{key}, "5", "2000", id))
		case 4: // two limits of one principal in one decision
			b := algs[(n+1)%len(algs)]
			keys := []string{key, tag + ":" + b.name + ":multi"}
			args := append(append([]string{a.name}, a.argv(1, 0)...), append([]string{b.name}, b.argv(1, 5)...)...)
			cmds, replyLen = append(cmds, fcall(false, "rl_multi", keys, args...)), 7
		}
		for _, cmd := range cmds {
			was := phase.Load()
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			reply, err := vk.Do(cctx, cmd).AsIntSlice()
			cancel()
			if ctx.Err() != nil {
				return
			}
			tl.calls.Add(1)
			all110 := was == phaseAll110 && phase.Load() == phaseAll110
			switch {
			case err == nil && len(reply) != replyLen:
				tl.fail("%v: reply %v, want %d integers", cmd.Commands(), reply, replyLen)
			case err == nil && all110:
				tl.on110.Add(1)
				tl.on110ByOp[op].Add(1)
			case err == nil:
			case !all110 && refusedBy100(err):
				tl.refused.Add(1)
			default:
				tl.fail("%v (%s): %v", cmd.Commands(), map[bool]string{true: "every node on 1.1.0", false: "mixed"}[all110], err)
			}
		}
	}
}

// refusedBy100 reports whether err is how 1.0.0 refuses a 1.1 call: a function it does not
// have, or an argument list longer than its own.
func refusedBy100(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "Function not found") || (strings.HasPrefix(msg, "RLERR") && strings.Contains(msg, " takes "))
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
// a 1.0 peek of each answers.
type heldState struct {
	keys []heldKey
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

// write11 changes every held limiter with 1.1 calls: a refund of 1, then a call of cost 1
// leaving a reserve of 2, admitted only where 4 units are left (the partly used ones). Each
// reply is checked, and the held state becomes what 1.1.0 reports.
func (h *heldState) write11(t *testing.T, vk valkey.Client) {
	t.Helper()
	fcall := func(fn, key string, args []string) []int64 {
		t.Helper()
		reply, err := vk.Do(t.Context(), vk.B().Fcall().Function(fn).Numkeys(1).Key(key).Arg(args...).Build()).AsIntSlice()
		if err != nil || len(reply) != 6 {
			t.Fatalf("%s %s %v: %v, %v", fn, key, args, reply, err)
		}
		return reply
	}
	for i := range h.keys {
		k := &h.keys[i]
		key := k.key()
		refunded := k.want.Remaining + 1
		if got := fcall("rl_"+k.alg.name+"_refund", key, k.alg.argv(1)); got[0] != 1 || got[2] != refunded {
			t.Errorf("%s: refund of 1 = %v, want remaining %d", key, got, refunded)
		}
		admit := refunded >= 1+2
		got := fcall("rl_"+k.alg.name, key, k.alg.argv(1, 2))
		k.want.Remaining = refunded
		if admit {
			k.want.Remaining--
		}
		if (got[0] == 1) != admit || got[2] != max(k.want.Remaining-2, 0) {
			t.Errorf("%s: cost 1 with a reserve of 2 and %d left = %v, want allowed %v, remaining %d",
				key, refunded, got, admit, max(k.want.Remaining-2, 0))
		}
		k.want.Allowed = k.want.Remaining > 0
	}
	h.check(t, "after 1.1 refunds and reserve calls")
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
