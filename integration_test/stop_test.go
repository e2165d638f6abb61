package integration_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
)

// A limiter never silently stops limiting: each situation in which a service once went on
// serving with no limit at all, on real servers, with the Limiter's defaults.

// everyPolicy is every Policy, the default first.
var everyPolicy = []client.Fallback{client.LocalFallback, client.ReturnError, client.FailOpen, client.FailClosed}

// stopEnv is one Valkey with the working library, for the tests below that need an empty
// server (DBSIZE 0) or its own command counts: started on first use, emptied by each.
var stopEnv struct {
	once sync.Once
	err  error
	vk   valkey.Client
}

// emptyServer returns a client of stopEnv's server, emptied (FLUSHALL) and with its command
// counts reset (CONFIG RESETSTAT).
func emptyServer(t *testing.T) valkey.Client {
	t.Helper()
	stopEnv.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := harness.NewValkey(ctx)
		if err != nil {
			stopEnv.err = err
			return
		}
		closeLater(func() { _ = s.Terminate(context.Background()) })
		if stopEnv.vk, err = nodeClient(s.Addr); err == nil {
			err = load(ctx, stopEnv.vk)
		}
		stopEnv.err = err
	})
	if stopEnv.err != nil {
		harness.Unavailable(t, "stop test server", stopEnv.err)
	}
	vk := stopEnv.vk
	for _, cmd := range []valkey.Completed{vk.B().Flushall().Build(), vk.B().ConfigResetstat().Build()} {
		if err := do(t, vk, cmd).Error(); err != nil {
			t.Fatal(err)
		}
	}
	return vk
}

// asShipped is slowMachine's deadline with the client's default fallback: for the tests of
// what a service gets by default.
var asShipped = client.Options{Deadline: slowDeadline}

func dbsize(t *testing.T, vk valkey.Client) int64 {
	t.Helper()
	n, err := do(t, vk, vk.B().Dbsize().Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// fcalls is how many FCALL and FCALL_RO the node vk talks to has run.
func fcalls(t *testing.T, vk valkey.Client) int64 {
	t.Helper()
	return commandCalls(t, vk, "fcall").Calls + commandCalls(t, vk, "fcall_ro").Calls
}

// Release skew: a node still on library 1.0.0 (before an upgrade, or after the rollback the
// README calls safe) under a per-user and a per-IP limit, two keys, decided with AllowAll:
// every request is decided by the node, each limit enforced exactly, none served unlimited; a
// limit the node cannot decide (a reserve) is decided locally rather than being an error a
// service fails open on; CheckRules says at start-up that the rules need 1.1.0; and state
// written under 1.1.0 keeps limiting after FUNCTION LOAD REPLACE of 1.0.0.
func TestStopReleaseSkew(t *testing.T) {
	v10, v11 := release(t, "1.0.0"), release(t, "1.1.0")
	s := harness.StartValkey(t)
	vk := s.Client(t)
	loadCode(t, vk, v10.Code)
	ctx := ctx5s(t)
	user := client.SlidingLog{Limit: 5, Window: time.Hour}
	ip := client.SlidingLog{Limit: 1000, Window: time.Hour, Name: "ip"}
	perUserAndIP := func(k string) []client.Rule {
		return []client.Rule{{Key: "user:" + k, Limit: user}, {Key: "ip:" + k, Limit: ip}}
	}
	// allow makes n requests of rules, and returns how many were admitted and how many
	// served unlimited (an error: a fail-open middleware serves it with no limit).
	allow := func(lim *client.Limiter, n int, rules func(i int) []client.Rule) (admitted, unlimited int) {
		t.Helper()
		for i := range n {
			r, err := lim.AllowAll(ctx, rules(i))
			switch {
			case err != nil:
				unlimited++
				if unlimited == 1 {
					t.Errorf("request %d: %v; served unlimited by a fail-open service", i+1, err)
				}
			case r.Source == client.FromFallback:
				t.Errorf("request %d: %+v; want the node's decision", i+1, r)
			case r.Allowed:
				admitted++
			}
		}
		return admitted, unlimited
	}

	t.Run("per user and per IP", func(t *testing.T) {
		lim := harness.NewLimiter(t, vk, asShipped)
		k := keyFor(t)
		const requests = 20
		admitted, unlimited := allow(lim, requests, func(int) []client.Rule { return perUserAndIP(k) })
		t.Logf("library 1.0.0, per user %d/h and per IP %d/h: %d requests, %d admitted, %d served unlimited",
			user.Limit, ip.Limit, requests, admitted, unlimited)
		if admitted != int(user.Limit) {
			t.Errorf("%d of %d requests admitted, want the per-user limit, %d", admitted, requests, user.Limit)
		}
		if p, err := lim.Peek(ctx, "user:"+k, user); err != nil || p.Source == client.FromFallback || p.Remaining != 0 {
			t.Errorf("the user's limit after: %+v, %v; want 0 remaining", p, err)
		}
		// every admitted request counted; a refused one at most once (what a key took before
		// another denied stays taken on 1.0: stricter, never more permissive)
		if p, err := lim.Peek(ctx, "ip:"+k, ip); err != nil || p.Remaining > ip.Limit-user.Limit || p.Remaining < ip.Limit-requests {
			t.Errorf("the IP's limit after: %+v, %v; want from %d to %d remaining", p, err, ip.Limit-requests, ip.Limit-user.Limit)
		}
	})

	t.Run("one IP, many users", func(t *testing.T) {
		lim := harness.NewLimiter(t, vk, asShipped)
		k := keyFor(t)
		few := client.SlidingLog{Limit: 3, Window: time.Hour, Name: "ip"}
		const requests = 10
		admitted, _ := allow(lim, requests, func(i int) []client.Rule {
			return []client.Rule{{Key: fmt.Sprintf("user:%s:%d", k, i), Limit: user}, {Key: "ip:" + k, Limit: few}}
		})
		if admitted != int(few.Limit) {
			t.Errorf("%d of %d users' requests admitted from one IP, want the per-IP limit, %d", admitted, requests, few.Limit)
		}
	})

	t.Run("a reserve", func(t *testing.T) {
		lim := harness.NewLimiter(t, vk, asShipped)
		k := keyFor(t)
		reserved := client.TokenBucket{Capacity: 5, Rate: 1, Period: time.Hour, Reserve: 1}
		admitted := 0
		for i := range 10 {
			r, err := lim.Allow(ctx, k, reserved)
			if err != nil || r.Source != client.FromFallback {
				t.Fatalf("call %d: %+v, %v; want the local fallback's decision", i+1, r, err)
			}
			if r.Allowed {
				admitted++
			}
		}
		if want := int(reserved.Capacity - reserved.Reserve); admitted != want {
			t.Errorf("%d of 10 admitted locally, want %d (capacity less the reserve)", admitted, want)
		}
	})

	t.Run("CheckRules", func(t *testing.T) {
		lim := harness.NewLimiter(t, vk, asShipped)
		k := keyFor(t)
		var ve *client.VersionError
		if err := lim.CheckRules(ctx, perUserAndIP(k)...); !errors.As(err, &ve) ||
			ve.Node != s.Addr || ve.Version != "1.0.0" || ve.Want != "1.1.0" {
			t.Errorf("CheckRules of a per-user and a per-IP limit on 1.0.0: %v; want a *VersionError wanting %s", err, "1.1.0")
		}
		if err := lim.CheckRules(ctx, client.Rule{Key: k, Limit: user}); err != nil {
			t.Errorf("CheckRules of one limit without a reserve, which 1.0.0 decides: %v", err)
		}
	})

	t.Run("rollback", func(t *testing.T) {
		loadCode(t, vk, v11.Code)
		lim := harness.NewLimiter(t, vk, asShipped)
		k := keyFor(t)
		admitted, _ := allow(lim, 3, func(int) []client.Rule { return perUserAndIP(k) })
		if admitted != 3 {
			t.Fatalf("on 1.1.0: %d of 3 admitted", admitted)
		}
		loadCode(t, vk, v10.Code)
		admitted, unlimited := allow(lim, 10, func(int) []client.Rule { return perUserAndIP(k) })
		t.Logf("rolled back to 1.0.0 with 3 of %d taken: 10 more requests, %d admitted, %d served unlimited", user.Limit, admitted, unlimited)
		if admitted != int(user.Limit)-3 {
			t.Errorf("after the rollback: %d of 10 admitted, want the %d the user had left", admitted, user.Limit-3)
		}
	})
}

// stopCall is one call of a cluster worker.
type stopCall struct {
	key   int // index in the worker's keys
	start time.Time
	res   client.Result
	err   error
}

// stopWorker calls a limit on keys of one shard, callsPerKey calls each, a key after another.
type stopWorker struct {
	shard int
	keys  []string
	calls []stopCall
}

// clusterKeys returns n keys for each primary of cl whose slots hold them (StartCluster gives
// primary i the i-th third of the slots), none used before.
func clusterKeys(t *testing.T, cl *harness.Cluster, n int) [][]string {
	t.Helper()
	admin := cl.Primaries[0].Client(t)
	out := make([][]string, len(cl.Primaries))
	base := keyFor(t)
	for batch := 0; ; batch++ {
		keys := make([]string, 0, 512)
		cmds := make(valkey.Commands, 0, 512)
		for i := range 512 {
			k := base + ":" + strconv.Itoa(batch*512+i)
			keys = append(keys, k)
			cmds = append(cmds, admin.B().ClusterKeyslot().Key(k).Build())
		}
		full := true
		for i, r := range admin.DoMulti(ctx5s(t), cmds...) {
			slot, err := r.AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			shard := int(slot) * len(cl.Primaries) / 16384
			if len(out[shard]) < n {
				out[shard] = append(out[shard], keys[i])
			}
		}
		for _, ks := range out {
			full = full && len(ks) == n
		}
		if full {
			return out
		}
	}
}

// A cluster loses a primary. With cluster-require-full-coverage yes (Valkey's default) every
// shard answers CLUSTERDOWN until the dead one's replica is promoted; with no, the other
// shards keep serving. Either way, with the Limiter's defaults, every request on a key of any
// shard is decided, by the server or locally (client.FromFallback), none is served unlimited (an
// error, which a fail-open service serves with no limit), and no key admits more than its limit
// from either: the server's count and the local fallback's share (the whole limit: one
// instance) each stay within it.
func TestStopClusterWithoutFullCoverage(t *testing.T) {
	cl := harness.StartCluster(t, 3, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, p := range cl.Primaries {
		if err := load(ctx, p.Client(t)); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range cl.Replicas {
		if err := waitVersion(ctx, &replica{addr: r.Addr, c: r.Client(t), cluster: true}); err != nil {
			t.Fatal(err)
		}
	}
	const callsPerKey = 15
	limit := client.TokenBucket{Capacity: 5, Rate: 1, Period: time.Hour}
	// the defaults but for the deadline and the breaker, those of the failover tests
	reader := sdkmetric.NewManualReader()
	lim := harness.NewLimiter(t, cl.Client(t, false), client.Options{
		Deadline:        chaosDeadline,
		BreakerFailures: chaosBreaker,
		BreakerCooldown: chaosCooldown,
		MeterProvider:   sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
	})
	keys := clusterKeys(t, cl, 2000)

	// round kills the primary of shard victim under the workers' load, and returns their
	// calls and when the cluster state was fail, as the other shards' primaries saw it.
	round := func(t *testing.T, victim int, from int) (workers []*stopWorker, downFrom, downTo, promotedAt time.Time) {
		for shard := range cl.Primaries {
			workers = append(workers, &stopWorker{shard: shard, keys: keys[shard][from : from+1000]})
		}
		// warm: each worker's shard decides its first key
		for _, w := range workers {
			for i := 0; ; i++ {
				r, err := lim.Allow(ctx, w.keys[0], limit)
				if err == nil && r.Source != client.FromFallback {
					break
				}
				if i == 50 {
					t.Fatalf("warming up shard %d: %+v, %v", w.shard, r, err)
				}
			}
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for _, w := range workers {
			wg.Go(func() {
				for i := 1; i < len(w.keys); i++ {
					for range callsPerKey {
						select {
						case <-stop:
							return
						default:
						}
						start := time.Now()
						r, err := lim.Allow(context.Background(), w.keys[i], limit)
						w.calls = append(w.calls, stopCall{i, start, r, err})
						time.Sleep(time.Millisecond)
					}
				}
				t.Errorf("shard %d: the worker ran out of keys", w.shard)
			})
		}
		end := func() { close(stop); wg.Wait() }

		time.Sleep(300 * time.Millisecond)
		dead := cl.Primaries[victim]
		promoted := cl.ReplicasOf(dead)[0]
		var watch []valkey.Client
		for i, p := range cl.Primaries {
			if i != victim && p.Running() {
				watch = append(watch, p.Client(t))
			}
		}
		for _, r := range cl.Replicas {
			if r == promoted || !r.Running() {
				continue
			}
			// a promoted replica of an earlier round is a primary now
			if i := r.Client(t); !isReplicaNode(t, i) {
				watch = append(watch, i)
			}
		}
		if err := dead.Stop(ctx); err != nil {
			end()
			t.Fatal(err)
		}
		stoppedAt := time.Now()
		pc := promoted.Client(t)
		for promotedAt.IsZero() {
			if time.Since(stoppedAt) > 30*time.Second {
				end()
				t.Fatalf("%s not promoted 30s after its primary was stopped", promoted.Addr)
			}
			now := time.Now()
			for _, c := range watch {
				info, err := c.Do(ctx, c.B().ClusterInfo().Build()).ToString()
				if err != nil {
					continue
				}
				down := strings.Contains(info, "cluster_state:fail")
				if down && downFrom.IsZero() {
					downFrom = now
				}
				if !down && !downFrom.IsZero() && downTo.IsZero() {
					downTo = now
				}
			}
			if !isReplicaNode(t, pc) {
				promotedAt = time.Now()
			}
			time.Sleep(10 * time.Millisecond)
		}
		// the cluster state is ok again soon after the promotion; then the client's breaker
		// lets a probe through a cooldown later
		for downTo.IsZero() && !downFrom.IsZero() && time.Since(promotedAt) < 10*time.Second {
			info, err := watch[0].Do(ctx, watch[0].B().ClusterInfo().Build()).ToString()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				downTo = time.Now()
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(2*chaosCooldown + chaosDeadline + slack + time.Second)
		end()
		return workers, downFrom, downTo, promotedAt
	}

	// judge counts the calls of a round, reports the figures and checks every call was decided
	// and no key admitted more than its limit from the server or locally.
	judge := func(t *testing.T, name string, workers []*stopWorker, victim int) (healthyLocal, healthyCalls int) {
		calls, unlimited, healthyUnlimited, deadLocal, mixed := 0, 0, 0, 0, 0
		var firstUnlimited string
		for _, w := range workers {
			type count struct{ server, local int }
			admitted := map[int]*count{}
			for _, c := range w.calls {
				calls++
				if w.shard != victim {
					healthyCalls++
				}
				a := admitted[c.key]
				if a == nil {
					a = &count{}
					admitted[c.key] = a
				}
				switch {
				case c.err != nil:
					if unlimited++; unlimited == 1 {
						firstUnlimited = fmt.Sprintf("shard %d: %v", w.shard, c.err)
					}
					if w.shard != victim {
						healthyUnlimited++
					}
				case c.res.Source == client.FromFallback:
					if w.shard == victim {
						deadLocal++
					} else {
						healthyLocal++
					}
					if c.res.Allowed {
						a.local++
					}
				case c.res.Allowed:
					a.server++
				}
			}
			for i, a := range admitted {
				if a.server > int(limit.Capacity) || a.local > int(limit.Capacity) {
					t.Errorf("shard %d, key %s: %d admitted by the server and %d locally, limit %d each",
						w.shard, w.keys[i], a.server, a.local, limit.Capacity)
				}
				if a.server > 0 && a.local > 0 {
					// the local fallback does not know what the server admitted (or the
					// server what the fallback did): a key decided by both in one round may
					// admit its limit from each
					mixed++
				}
			}
		}
		t.Logf("%s: %d calls; served unlimited (an error: a fail-open service serves it with no limit): %d on the healthy shards, "+
			"%d on the dead one; decided locally: %d on the healthy shards, %d on the dead one; %d keys decided both by the server and locally",
			name, calls, healthyUnlimited, unlimited-healthyUnlimited, healthyLocal, deadLocal, mixed)
		if unlimited > 0 {
			t.Errorf("%d of %d calls were not decided (served unlimited), the first: %s", unlimited, calls, firstUnlimited)
		}
		return healthyLocal, healthyCalls
	}

	t.Run("full coverage", func(t *testing.T) {
		before := clusterDownErrors(t, reader)
		workers, downFrom, downTo, promotedAt := round(t, 0, 0)
		if clusterDownErrors(t, reader) == before {
			t.Error("no call was answered CLUSTERDOWN (or TRYAGAIN), as the errors metric counts it")
		}
		if downFrom.IsZero() {
			t.Fatal("the cluster state never was fail: no CLUSTERDOWN to test")
		}
		t.Logf("cluster state fail for %s; the replica promoted %s after it began",
			downTo.Sub(downFrom).Round(time.Millisecond), promotedAt.Sub(downFrom).Round(time.Millisecond))
		// during the CLUSTERDOWN window the healthy shards answered CLUSTERDOWN, which the
		// client must decide around (locally), not return
		healthyDown := 0
		for _, w := range workers {
			if w.shard == 0 {
				continue
			}
			for _, c := range w.calls {
				if c.start.After(downFrom) && c.start.Before(downTo) && (c.err != nil || c.res.Source == client.FromFallback) {
					healthyDown++
				}
			}
		}
		if healthyDown == 0 {
			t.Error("no call of a healthy shard met the CLUSTERDOWN window")
		}
		judge(t, "full coverage (yes, the default)", workers, 0)
	})
	if t.Failed() {
		return
	}

	t.Run("without full coverage", func(t *testing.T) {
		for _, s := range cl.Nodes() {
			if !s.Running() {
				continue
			}
			c := s.Client(t)
			if err := do(t, c, c.B().ConfigSet().ParameterValue().ParameterValue("cluster-require-full-coverage", "no").Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
		before := clusterDownErrors(t, reader)
		workers, downFrom, _, _ := round(t, 1, 1000)
		if !downFrom.IsZero() {
			t.Error("the cluster state was fail without full coverage required")
		}
		if n := clusterDownErrors(t, reader) - before; n != 0 {
			t.Errorf("%d calls answered CLUSTERDOWN or TRYAGAIN without full coverage required", n)
		}
		// No node answers CLUSTERDOWN, so a healthy shard's call decided locally is only one
		// that missed its deadline on a loaded machine (its breaker may then open for a
		// cooldown): seen once in several full runs of the suite (15 calls of about 9,000),
		// never alone. More than 1% is the shard, not the machine.
		healthyLocal, healthyCalls := judge(t, "without full coverage (no)", workers, 1)
		if healthyLocal*100 > healthyCalls {
			t.Errorf("%d of %d calls of healthy shards decided locally; want them decided by the server", healthyLocal, healthyCalls)
		}
	})
}

// A limit that cannot be valid (a token bucket of capacity 0) is a *LimitError, under every
// policy and from every entry point, with nothing sent and nothing written; CheckRules finds
// it at start-up.
func TestStopBadLimit(t *testing.T) {
	vk := emptyServer(t)
	ctx := ctx5s(t)
	bad := client.TokenBucket{Capacity: 0, Rate: 1, Period: time.Second}
	good := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}
	for _, p := range everyPolicy {
		lim := harness.NewLimiter(t, vk, client.Options{Deadline: slowDeadline, Fallback: p})
		k := keyFor(t)
		calls := []struct {
			name string
			call func() error
		}{
			{"Allow", func() error { _, err := lim.Allow(ctx, k, bad); return err }},
			{"Peek", func() error { _, err := lim.Peek(ctx, k, bad); return err }},
			{"Refund", func() error { _, err := lim.Refund(ctx, k, bad, 1); return err }},
			{"Acquire", func() error {
				_, _, err := lim.Acquire(ctx, k, client.Concurrency{Limit: 0, Lease: time.Second})
				return err
			}},
			{"AllowAll, one key", func() error {
				_, err := lim.AllowAll(ctx, []client.Rule{{Key: k, Limit: good}, {Key: k, Limit: bad}})
				return err
			}},
			{"AllowAll, two keys", func() error {
				_, err := lim.AllowAll(ctx, []client.Rule{{Key: k, Limit: good}, {Key: k + ":ip", Limit: bad}})
				return err
			}},
			{"PeekAll", func() error {
				_, err := lim.PeekAll(ctx, []client.Rule{{Key: k, Limit: good}, {Key: k + ":ip", Limit: bad}})
				return err
			}},
			{"CheckRules", func() error {
				return lim.CheckRules(ctx, client.Rule{Key: k, Limit: good}, client.Rule{Key: k + ":ip", Limit: bad})
			}},
		}
		for _, c := range calls {
			var le *client.LimitError
			if err := c.call(); !errors.As(err, &le) {
				t.Errorf("%s, %s: %v; want a *LimitError", p, c.name, err)
			}
		}
	}
	if n := fcalls(t, vk); n != 0 {
		t.Errorf("%d FCALL and FCALL_RO ran", n)
	}
	if n := dbsize(t, vk); n != 0 {
		t.Errorf("DBSIZE %d after calls with a bad limit, want 0", n)
	}
}

// A 1 MiB key (a header nobody bounded) is a *KeyError under every policy, with nothing written
// and the server's memory unchanged; a key of DefaultMaxKeyLen bytes is decided by the server.
func TestStopLongKey(t *testing.T) {
	vk := emptyServer(t)
	ctx := ctx5s(t)
	usedMemory := func() int64 {
		t.Helper()
		info, err := harness.Info(ctx, vk, "memory")
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(info["used_memory"], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	limit := client.SlidingLog{Limit: 10, Window: time.Hour}
	before := usedMemory()
	keys := 0
	for _, p := range everyPolicy {
		lim := harness.NewLimiter(t, vk, client.Options{Deadline: slowDeadline, Fallback: p})
		for i := range 5 {
			keys++
			huge := strings.Repeat(string(rune('a'+keys)), 1<<20)
			_, err := lim.Allow(ctx, huge, limit)
			if i == 0 {
				// and beside a rule of another key
				_, err = lim.AllowAll(ctx, []client.Rule{{Key: keyFor(t), Limit: limit}, {Key: huge, Limit: limit}})
			}
			var ke *client.KeyError
			if !errors.As(err, &ke) || ke.Len != 1<<20 || ke.Max != 512 {
				t.Errorf("%s: a 1 MiB key: %v; want a *KeyError", p, err)
			}
		}
	}
	after := usedMemory()
	t.Logf("%d calls with 1 MiB keys: used_memory %d before, %d after", keys, before, after)
	if n := dbsize(t, vk); n != 0 {
		t.Errorf("DBSIZE %d after calls with 1 MiB keys, want 0", n)
	}
	if after-before > 256<<10 {
		t.Errorf("used_memory grew by %d bytes after calls with 1 MiB keys", after-before)
	}

	lim := harness.NewLimiter(t, vk, asShipped)
	long := strings.Repeat("k", 512)
	if r, err := lim.Allow(ctx, long, limit); err != nil || !r.Allowed || r.Source == client.FromFallback {
		t.Errorf("a key of %d bytes: %+v, %v; want admitted by the server", len(long), r, err)
	}
	if n := dbsize(t, vk); n != 1 {
		t.Errorf("DBSIZE %d after a call with a key of %d bytes, want 1", n, len(long))
	}
	var ke *client.KeyError
	if _, err := lim.Allow(ctx, long+"k", limit); !errors.As(err, &ke) {
		t.Errorf("a key of %d bytes: %v; want a *KeyError", len(long)+1, err)
	}
}

// An attack on one principal behind a second limit of another key (per user 5 a minute, per
// IP 1000 a minute, decided with AllowAll): a refused request costs the server no more calls
// (FCALL and FCALL_RO, counted by INFO commandstats) than an admitted one, and the IP's limit
// counts the admitted requests alone.
func TestStopDenialCost(t *testing.T) {
	vk := emptyServer(t)
	ctx := ctx5s(t)
	lim := harness.NewLimiter(t, vk, asShipped)
	user := client.SlidingLog{Limit: 5, Window: time.Minute}
	ip := client.SlidingLog{Limit: 1000, Window: time.Minute, Name: "ip"}
	k := keyFor(t)
	rules := []client.Rule{{Key: "user:" + k, Limit: user}, {Key: "ip:10.0.0.1:" + k, Limit: ip}}
	const requests = 100
	var admitted, refused, admittedCalls, refusedCalls int64
	for i := range requests {
		before := fcalls(t, vk)
		r, err := lim.AllowAll(ctx, rules)
		if err != nil || r.Source == client.FromFallback {
			t.Fatalf("request %d: %+v, %v; want the server's decision", i+1, r, err)
		}
		n := fcalls(t, vk) - before
		if r.Allowed {
			admitted++
			admittedCalls += n
		} else {
			refused++
			refusedCalls += n
		}
	}
	if admitted != user.Limit || refused != requests-user.Limit {
		t.Fatalf("%d admitted and %d refused of %d requests, want %d admitted", admitted, refused, requests, user.Limit)
	}
	perAdmitted, perRefused := float64(admittedCalls)/float64(admitted), float64(refusedCalls)/float64(refused)
	t.Logf("server calls per admitted request %.2f (%d for %d), per refused request %.2f (%d for %d)",
		perAdmitted, admittedCalls, admitted, perRefused, refusedCalls, refused)
	if perRefused > perAdmitted {
		t.Errorf("a refused request costs the server %.2f calls, an admitted one %.2f", perRefused, perAdmitted)
	}
	if p, err := lim.Peek(ctx, rules[1].Key, ip); err != nil || p.Remaining != ip.Limit-user.Limit {
		t.Errorf("the IP's limit: %+v, %v; want the %d admitted requests counted", p, err, user.Limit)
	}
}

// clusterDownErrors is how many calls the errors metric counts as cluster_down (CLUSTERDOWN,
// TRYAGAIN) so far.
func clusterDownErrors(t *testing.T, reader *sdkmetric.ManualReader) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "rlfn.client.errors" {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, _ := p.Attributes.Value("error.type"); v.AsString() == "cluster_down" {
					n += p.Value
				}
			}
		}
	}
	return n
}
