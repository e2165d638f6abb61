package integration_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/internal/harness"
)

// The failover test's Limiters. The deadline leaves room for six nodes and the test sharing
// two cores: a healthy shard's call must never reach it.
const (
	chaosDeadline = 200 * time.Millisecond
	chaosCooldown = 500 * time.Millisecond
	chaosBreaker  = 5
	chaosShare    = 4 // WithInstances: LocalFallback admits a quarter of each limit
)

// chaosLimits are every algorithm, with limits the test's traffic does not exhaust on the
// server, so that a denial says something.
var chaosLimits = []client.Limit{
	client.FixedWindow{Limit: 100_000, Window: time.Minute},
	client.SlidingLog{Limit: 100_000, Window: time.Minute},
	client.SlidingWindow{Limit: 100_000, Window: time.Minute},
	client.TokenBucket{Capacity: 100_000, Rate: 1, Period: time.Hour},
	client.LeakyBucket{Capacity: 100_000, Rate: 1, Period: time.Hour},
	client.LeakyBucket{Capacity: 100_000, Rate: 1_000_000, Period: time.Second, Mode: client.Shape},
}

const chaosLimit = 100_000

// chaosCall is one call of a failover worker.
type chaosCall struct {
	start time.Time
	took  time.Duration
	res   client.Result
	err   error
}

// chaosWorker calls every algorithm in turn on one principal, whose slot is on shard.
type chaosWorker struct {
	policy client.Fallback
	shard  int
	key    string
	calls  []chaosCall
}

// A primary of a 3-shard cluster killed under load, its replica promoted by the cluster (a
// real failover, nothing restarted): under every policy, the dead shard's calls are the
// policy's until the promotion and the server's again soon after, with the library the
// replica received; the other shards' calls are the server's all along; no call takes longer
// than the deadline and a margin; and the deployer's discovery shows the promoted replica as
// the shard's primary, with the library, and the dead primary as down.
func TestChaosFailover(t *testing.T) {
	cl := harness.StartCluster(t, 3, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, p := range cl.Primaries {
		if err := load(ctx, p.Client(t)); err != nil {
			t.Fatal(err)
		}
	}
	// The other shards keep serving while one has no primary, as production clusters are often
	// set up; by default (yes) every node answers CLUSTERDOWN until the failover is over,
	// and no client could tell the other shards' calls from the dead one's.
	for _, s := range cl.Nodes() {
		c := s.Client(t)
		if err := do(t, c, c.B().ConfigSet().ParameterValue().ParameterValue("cluster-require-full-coverage", "no").Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range cl.Replicas {
		if err := waitVersion(ctx, &replica{addr: r.Addr, c: r.Client(t), cluster: true}); err != nil {
			t.Fatal(err)
		}
	}
	victim := cl.Primaries[0]
	promoted := cl.ReplicasOf(victim)[0]

	workers, limiters := newChaosWorkers(t, cl)
	warmChaos(ctx, t, workers, limiters)
	end := runChaos(t, workers, limiters)

	time.Sleep(500 * time.Millisecond)
	killAt := time.Now()
	if err := victim.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	// lastReplica: when the last ROLE that still said replica was sent; calls that ended
	// before it were made while the shard had no primary.
	pc := promoted.Client(t)
	var lastReplica, promotedAt time.Time
	for promotedAt.IsZero() {
		sent := time.Now()
		role, err := pc.Do(ctx, pc.B().Role().Build()).ToArray()
		if err != nil || len(role) == 0 {
			t.Fatalf("ROLE on %s: %v", promoted.Addr, err)
		}
		if r, _ := role[0].ToString(); r == "master" {
			promotedAt = time.Now()
		} else {
			lastReplica = sent
			if time.Since(stoppedAt) > 30*time.Second {
				t.Fatalf("%s not promoted 30s after its primary was stopped", promoted.Addr)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// The client learns the new primary from its next topology refresh, which a failed call
	// starts: an open breaker sends nothing but its probe, so a probe fails against the old
	// primary, and the next one, a cooldown later, reaches the new one.
	recoverBy := promotedAt.Add(2*chaosCooldown + chaosDeadline + slack)
	time.Sleep(time.Until(recoverBy) + time.Second)
	end()
	t.Logf("primary %s stopped; replica %s promoted %s later", victim.Addr, promoted.Addr,
		promotedAt.Sub(stoppedAt).Round(time.Millisecond))

	phaseNames := []string{"before the kill", "no primary", "after the promotion"}
	for _, p := range []client.Fallback{client.ReturnError, client.FailOpen, client.FailClosed, client.LocalFallback} {
		t.Run(p.String(), func(t *testing.T) {
			checkFailover(t, p, workers, phaseNames, failoverTimes{killAt, stoppedAt, lastReplica, promotedAt, recoverBy})
		})
	}

	// The promoted replica serves the library it received, to FCALL_RO and to calls on its keys.
	if v, err := do(t, pc, pc.B().FcallRo().Function("rl_version").Numkeys(0).Build()).ToString(); err != nil || v != workingVersion(t) {
		t.Errorf("promoted %s: rl_version %q, %v; want %s", promoted.Addr, v, err, workingVersion(t))
	}
	// The deployer (what rlfn status shows) sees the new topology.
	tg, err := deployer.Discover(ctx, valkey.ClientOption{InitAddress: []string{promoted.Addr}, DisableCache: true})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	defer tg.Close()
	installed, err := tg.Inspect(ctx, lineage(t)) // the working copy the harness loaded, a release or newer
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	seen := map[string]deployer.Installed{}
	for _, in := range installed {
		seen[in.Node.Addr] = in
	}
	if in := seen[promoted.Addr]; in.Node.Role != deployer.RolePrimary || in.Node.Slots != 16384/3 ||
		in.Version != workingVersion(t) || in.Unreachable != nil {
		t.Errorf("promoted %s as the deployer sees it: %+v", promoted.Addr, in)
	}
	if in, ok := seen[victim.Addr]; !ok || in.Node.Down == "" || in.Unreachable == nil {
		t.Errorf("dead primary %s as the deployer sees it: %+v, listed %v; want it down", victim.Addr, in, ok)
	}
	if len(installed) != 6 {
		t.Errorf("the deployer sees %d nodes, want 6", len(installed))
	}
}

// One primary of a 3-shard cluster paused (CLIENT PAUSE ALL, 2s) under load from a Limiter of
// each policy: only the paused shard's calls fall to the policy, each costing the deadline
// only until its shard's breaker opens; the other shards' calls are the server's all along,
// every call within the deadline and a margin; and the paused shard is decided by the server
// again soon after the pause ends. The other shards' worst latency is reported.
func TestChaosShardPaused(t *testing.T) {
	cl := harness.StartCluster(t, 3, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, p := range cl.Primaries {
		if err := load(ctx, p.Client(t)); err != nil {
			t.Fatal(err)
		}
	}
	workers, limiters := newChaosWorkers(t, cl)
	warmChaos(ctx, t, workers, limiters)
	end := runChaos(t, workers, limiters)

	const pause = 2 * time.Second
	time.Sleep(500 * time.Millisecond)
	victim := cl.Primaries[0].Client(t)
	pausedAt := time.Now()
	if err := do(t, victim, victim.B().ClientPause().Timeout(pause.Milliseconds()).All().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// Calls sent once the pause is answered, and over before it can have ended, reached a
	// paused server.
	heldFrom, heldUntil := time.Now(), pausedAt.Add(pause)
	// After the pause, a probe a cooldown later closes the shard's breaker.
	recoverBy := pausedAt.Add(pause + chaosCooldown + chaosDeadline + slack)
	time.Sleep(time.Until(recoverBy) + time.Second)
	end()

	for _, p := range []client.Fallback{client.ReturnError, client.FailOpen, client.FailClosed, client.LocalFallback} {
		t.Run(p.String(), func(t *testing.T) {
			var otherWorst, otherWorstPaused time.Duration
			others, held, byPolicy, atDeadline, late := 0, 0, 0, 0, 0
			lateFirst := ""
			for _, w := range workers {
				if w.policy != p {
					continue
				}
				bad := map[string]int{}
				first := map[string]string{}
				violate := func(rule, example string) {
					if bad[rule]++; bad[rule] == 1 {
						first[rule] = example
					}
				}
				for _, c := range w.calls {
					fromServer := c.err == nil && c.res.Source != client.FromFallback
					if c.took > chaosDeadline+slack {
						example := fmt.Sprintf("%s, sent %s after the pause: %+v, %v", c.took, c.start.Sub(pausedAt), c.res, c.err)
						if w.shard != 0 {
							violate("calls past the deadline "+chaosDeadline.String()+" + "+slack.String(), example)
						} else if late++; late == 1 {
							// Not asserted, yet: valkey-go redials a connection it dropped at a
							// deadline, and the paused node holds the handshake; the call waits
							// for it past its own deadline (seen: one call a run, up to the end of
							// the pause).
							lateFirst = example
						}
					}
					during := c.start.Before(heldUntil) && c.start.Add(c.took).After(pausedAt)
					if w.shard != 0 {
						others++
						otherWorst = max(otherWorst, c.took)
						if during {
							otherWorstPaused = max(otherWorstPaused, c.took)
						}
						if !fromServer {
							violate("calls of a shard not paused not decided by the server",
								fmt.Sprintf("%s after the pause: %+v, %v", c.start.Sub(pausedAt), c.res, c.err))
						}
						continue
					}
					switch {
					case c.start.Add(c.took).Before(pausedAt) || c.start.After(recoverBy):
						if !fromServer {
							violate("the paused shard's calls before the pause or after "+recoverBy.Sub(pausedAt).String()+
								" not decided by the server", fmt.Sprintf("%s after the pause: %+v, %v", c.start.Sub(pausedAt), c.res, c.err))
						}
					case c.start.After(heldFrom) && c.start.Add(c.took).Before(heldUntil):
						held++
						if !fromServer {
							byPolicy++
						}
						if c.took >= chaosDeadline {
							atDeadline++
						}
						if err := chaosPolicy(p, c); err != nil {
							violate("the paused shard's calls not decided as the policy promises",
								fmt.Sprintf("%s after the pause: %v", c.start.Sub(pausedAt), err))
						}
					}
				}
				for rule, n := range bad {
					t.Errorf("shard %d: %s: %d, the first: %s", w.shard, rule, n, first[rule])
				}
			}
			if held == 0 {
				t.Errorf("no call of the paused shard was held by the pause")
			}
			t.Logf("paused shard: %d calls during the pause, %d decided by the policy, %d of them waited for the deadline",
				held, byPolicy, atDeadline)
			if late > 0 {
				t.Logf("paused shard: %d calls past the deadline %s + %s, the first: %s", late, chaosDeadline, slack, lateFirst)
			}
			t.Logf("other shards: %d calls, all decided by the server; worst %s during the pause, %s overall",
				others, otherWorstPaused.Round(time.Microsecond), otherWorst.Round(time.Microsecond))
		})
	}
}

// newChaosWorkers makes a Limiter of each policy on a client of cl, and a worker per Limiter
// and shard: a principal whose slot is on the shard.
func newChaosWorkers(t *testing.T, cl *harness.Cluster) ([]*chaosWorker, map[client.Fallback]*client.Limiter) {
	t.Helper()
	// Principals by shard: StartCluster spreads the slots evenly, primary i owning the i-th
	// third.
	admin := cl.Client(t, false)
	shardOf := func(key string) int {
		slot, err := do(t, admin, admin.B().ClusterKeyslot().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		for i := range cl.Primaries {
			if hi := int64((i+1)*16384/len(cl.Primaries) - 1); slot <= hi {
				return i
			}
		}
		t.Fatalf("slot %d of %s beyond 16383", slot, key)
		return -1
	}
	var workers []*chaosWorker
	limiters := map[client.Fallback]*client.Limiter{}
	n := 0
	for _, p := range []client.Fallback{client.ReturnError, client.FailOpen, client.FailClosed, client.LocalFallback} {
		vk := cl.Client(t, false)
		limiters[p] = harness.NewLimiter(t, vk, client.Options{
			Fallback:        p,
			Deadline:        chaosDeadline,
			BreakerFailures: chaosBreaker,
			BreakerCooldown: chaosCooldown,
			Instances:       chaosShare,
		})
		for shard := range cl.Primaries {
			for {
				n++
				key := fmt.Sprintf("chaos:%d:%d", time.Now().UnixNano(), n)
				// the state key is rl:{key}:..., hashed by key alone
				if shardOf(key) == shard {
					workers = append(workers, &chaosWorker{policy: p, shard: shard, key: key})
					break
				}
			}
		}
	}
	return workers, limiters
}

// warmChaos makes a call of each worker the server decides: the first call of a cold client
// dials the cluster's nodes, which on a loaded machine may take longer than the deadline.
func warmChaos(ctx context.Context, t *testing.T, workers []*chaosWorker, limiters map[client.Fallback]*client.Limiter) {
	t.Helper()
	for _, w := range workers {
		for i := 0; ; i++ {
			res, err := limiters[w.policy].Allow(ctx, w.key, chaosLimits[0])
			if err == nil && res.Source != client.FromFallback {
				break
			}
			if i == 50 {
				t.Fatalf("warming up %s: %+v, %v", w.key, res, err)
			}
		}
	}
}

// runChaos starts the workers' calls, every algorithm in turn and a millisecond apart, and
// returns what stops them and waits for them (also run when the test ends).
func runChaos(t *testing.T, workers []*chaosWorker, limiters map[client.Fallback]*client.Limiter) (end func()) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, w := range workers {
		lim := limiters[w.policy]
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				res, err := lim.Allow(context.Background(), w.key, chaosLimits[i%len(chaosLimits)])
				w.calls = append(w.calls, chaosCall{start, time.Since(start), res, err})
				time.Sleep(time.Millisecond)
			}
		})
	}
	var once sync.Once
	end = func() { once.Do(func() { close(stop) }); wg.Wait() }
	t.Cleanup(end)
	return end
}

// failoverTimes are the moments TestChaosFailover's calls are judged by.
type failoverTimes struct {
	killAt, stoppedAt, lastReplica, promotedAt, recoverBy time.Time
}

// checkFailover judges the calls of p's workers: every call within the deadline and a margin;
// the other shards' calls, and the dead shard's before the kill, the server's; the dead
// shard's without a primary the policy's; after the promotion, the server's again from a
// first one within recoverBy. A broken rule is reported once per shard and phase, with its
// count and first instance.
func checkFailover(t *testing.T, p client.Fallback, workers []*chaosWorker, phaseNames []string, at failoverTimes) {
	type phaseStats struct {
		calls, byPolicy int
		worst           time.Duration
	}
	type violation struct {
		n     int
		first string
	}
	violations := map[string]*violation{}
	var order []string
	violate := func(rule, example string) {
		v, ok := violations[rule]
		if !ok {
			v = &violation{first: example}
			violations[rule] = v
			order = append(order, rule)
		}
		v.n++
	}
	stats := map[bool]*[3]phaseStats{true: {}, false: {}} // by dead shard
	for _, w := range workers {
		if w.policy != p {
			continue
		}
		dead := w.shard == 0
		var recovered time.Time
		for _, c := range w.calls {
			ph := 0
			switch {
			case c.start.After(at.promotedAt):
				ph = 2
			case !c.start.Before(at.killAt):
				ph = 1
			}
			st := &stats[dead][ph]
			st.calls++
			st.worst = max(st.worst, c.took)
			fromServer := c.err == nil && c.res.Source != client.FromFallback
			if !fromServer {
				st.byPolicy++
			}
			where := fmt.Sprintf("shard %d, %s", w.shard, phaseNames[ph])
			if c.took > chaosDeadline+slack {
				violate(where+": calls past the deadline "+chaosDeadline.String()+" + "+slack.String(), c.took.String())
			}
			switch {
			case !dead || c.start.Before(at.killAt):
				if !fromServer {
					violate(where+": calls not decided by the server",
						fmt.Sprintf("%s after the kill: %+v, %v", c.start.Sub(at.killAt), c.res, c.err))
				}
			case c.start.After(at.stoppedAt) && c.start.Add(c.took).Before(at.lastReplica):
				if err := chaosPolicy(p, c); err != nil {
					violate(where+": calls not decided as the policy promises",
						fmt.Sprintf("%s after the stop: %v", c.start.Sub(at.stoppedAt), err))
				}
			case c.start.After(at.promotedAt):
				if recovered.IsZero() && fromServer {
					recovered = c.start
				}
				if !recovered.IsZero() && !fromServer {
					violate(where+": calls not decided by the server once it decided again",
						fmt.Sprintf("%s after the promotion: %+v, %v", c.start.Sub(at.promotedAt), c.res, c.err))
				}
			}
		}
		if dead {
			if recovered.IsZero() || recovered.After(at.recoverBy) {
				t.Errorf("the promoted shard decides again %s after the promotion, want within %s",
					recovered.Sub(at.promotedAt), at.recoverBy.Sub(at.promotedAt))
			} else {
				t.Logf("dead shard: the server decides again %s after the promotion",
					recovered.Sub(at.promotedAt).Round(time.Millisecond))
			}
		}
	}
	for _, rule := range order {
		v := violations[rule]
		t.Errorf("%s: %d, the first: %s", rule, v.n, v.first)
	}
	for _, dead := range []bool{true, false} {
		name := "other shards"
		if dead {
			name = "dead shard"
		}
		for ph, st := range stats[dead] {
			t.Logf("%s, %s: %d calls, %d decided by the policy, worst %s",
				name, phaseNames[ph], st.calls, st.byPolicy, st.worst.Round(time.Microsecond))
		}
	}
}

// chaosPolicy checks a call the server could not decide against the policy's promise.
func chaosPolicy(p client.Fallback, c chaosCall) error {
	res, err := c.res, c.err
	ok := false
	switch p {
	case client.ReturnError:
		ok = err != nil && res == (client.Result{})
	case client.FailOpen:
		ok = err == nil && res.Source == client.FromFallback && res.Allowed && res.Limit == chaosLimit
	case client.FailClosed:
		ok = err == nil && res.Source == client.FromFallback && !res.Allowed && res.RetryAfter > 0 && res.RetryAfter <= chaosCooldown
	case client.LocalFallback:
		ok = err == nil && res.Source == client.FromFallback && res.Limit == chaosLimit/chaosShare
	}
	if !ok {
		return fmt.Errorf("%+v, %v: not what %s promises", res, err, p)
	}
	return nil
}

// What README promises of Peek on replicas: a peek on the primary sees every admitted call at
// once; a replica's peek may be a little behind (never ahead, and never going back), since the
// replica applies the primary's writes asynchronously; after WAIT 1 on the connection that
// wrote, the replica's peek is current. A replica held behind (CLIENT PAUSE WRITE holds a
// Valkey replica's replication stream; Redis 7.0 applies it during a pause) shows the old
// remaining until it catches up.
func TestChaosPeekReplicaLag(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		key := keyFor(t)
		limit := client.TokenBucket{Capacity: 1000, Rate: 1, Period: time.Hour}
		args := []string{"1000", "1", "3600000", "1"} // the same limit, as the client sends it
		onPrimary := harness.NewLimiter(t, tg.c, slowMachine)
		if _, err := onPrimary.Allow(ctx, key, limit); err != nil {
			t.Fatal(err)
		}
		stateKey := onPrimary.Key(key, limit)
		rep := tg.replicaFor(t, stateKey)
		waitReplicated(t, rep, stateKey)
		onReplica := harness.NewLimiter(t, readsFromReplicas(t, tg, rep), slowMachine)
		pc := primaryOf(t, tg, stateKey)
		before := commandCalls(t, rep.c, "fcall_ro")

		const rounds = 200
		stale, lastSeen := 0, int64(limit.Capacity)
		for i := range rounds {
			r, err := onPrimary.Allow(ctx, key, limit)
			if err != nil || !r.Allowed {
				t.Fatalf("round %d: %+v, %v", i, r, err)
			}
			if p, err := onPrimary.Peek(ctx, key, limit); err != nil || p.Remaining != r.Remaining {
				t.Fatalf("round %d: a peek on the primary: %+v, %v; want %d remaining", i, p, err, r.Remaining)
			}
			q, err := onReplica.Peek(ctx, key, limit)
			if err != nil || q.Source == client.FromFallback || q.Remaining < r.Remaining || q.Remaining > lastSeen {
				t.Fatalf("round %d: a peek on the replica: %+v, %v; want from %d (current) to %d (its last answer)",
					i, q, err, r.Remaining, lastSeen)
			}
			if q.Remaining > r.Remaining {
				stale++
			}
			lastSeen = q.Remaining
		}
		// WAIT 1 after the write, on its connection: the replica's peek is then current.
		const waited = 50
		for i := range waited {
			want := writeAndWait(t, pc, stateKey, args, time.Second, 1)
			if q, err := onReplica.Peek(ctx, key, limit); err != nil || q.Remaining != want {
				t.Fatalf("after WAIT %d: a peek on the replica: %+v, %v; want %d remaining", i, q, err, want)
			}
		}
		if ran := commandCalls(t, rep.c, "fcall_ro").Calls - before.Calls; ran < rounds+waited {
			t.Fatalf("the replica ran %d FCALL_RO for %d peeks", ran, rounds+waited)
		}
		t.Logf("%d of %d replica peeks right after an admitted call were behind it; %d after WAIT 1 all current",
			stale, rounds, waited)

		if tg.name == "redis7.0" {
			t.Log("Redis 7.0 applies the replication stream during CLIENT PAUSE WRITE: no replica held behind")
			return
		}
		if err := rep.do(rep.c.B().ClientPause().Timeout(5000).Write().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		paused := true
		unpause := func() {
			if paused {
				paused = false
				if err := rep.do(rep.c.B().ClientUnpause().Build()).Error(); err != nil {
					t.Error(err)
				}
			}
		}
		defer unpause()
		old, err := onReplica.Peek(ctx, key, limit)
		if err != nil {
			t.Fatal(err)
		}
		now := writeAndWait(t, pc, stateKey, args, 100*time.Millisecond, 0) // the replica does not ack
		if p, err := onPrimary.Peek(ctx, key, limit); err != nil || p.Remaining != now {
			t.Errorf("a peek on the primary: %+v, %v; want %d remaining", p, err, now)
		}
		if q, err := onReplica.Peek(ctx, key, limit); err != nil || q.Remaining != old.Remaining || q.Remaining != now+1 {
			t.Errorf("a peek on the held replica: %+v, %v; want the old %d remaining", q, err, now+1)
		}
		unpause()
		now = writeAndWait(t, pc, stateKey, args, 5*time.Second, 1)
		if q, err := onReplica.Peek(ctx, key, limit); err != nil || q.Remaining != now {
			t.Errorf("the replica caught up, after WAIT: %+v, %v; want %d remaining", q, err, now)
		}
	})
}

// writeAndWait admits one unit of the token bucket at stateKey on pc, then WAITs for one
// replica on the same connection, and returns the call's remaining; WAIT must answer acked.
func writeAndWait(t *testing.T, pc valkey.Client, stateKey string, args []string, timeout time.Duration, acked int64) int64 {
	t.Helper()
	res := pc.DoMulti(ctx5s(t), fcallCmd(pc, false, "rl_token_bucket", stateKey, args...),
		pc.B().Wait().Numreplicas(1).Timeout(timeout.Milliseconds()).Build())
	r, err := decode(res[0])
	if err != nil || !r.Allowed {
		t.Fatalf("FCALL rl_token_bucket %s: %v, %v", stateKey, r, err)
	}
	if n, err := res[1].AsInt64(); err != nil || n != acked {
		t.Fatalf("WAIT 1 %d: %d, %v; want %d", timeout.Milliseconds(), n, err, acked)
	}
	return r.Remaining
}

// primaryOf returns a connection to the primary holding key.
func primaryOf(t *testing.T, tg *target, key string) valkey.Client {
	t.Helper()
	if tg.name != "cluster" {
		return tg.primary
	}
	for _, c := range tg.c.Nodes() {
		if n, err := do(t, c, c.B().Exists().Key(key).Build()).AsInt64(); err == nil && n == 1 && !isReplicaNode(t, c) {
			return c
		}
	}
	t.Fatalf("no primary holds %s", key)
	return nil
}

func isReplicaNode(t *testing.T, c valkey.Client) bool {
	t.Helper()
	role, err := do(t, c, c.B().Role().Build()).ToArray()
	if err != nil || len(role) == 0 {
		t.Fatalf("ROLE: %v", err)
	}
	r, _ := role[0].ToString()
	return r == "slave"
}
