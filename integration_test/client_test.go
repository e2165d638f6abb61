package integration_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
)

// clientLimits is every algorithm through the client, each with a limit of 3 that nothing
// refills or slides out of during a test.
var clientLimits = []struct {
	name     string
	limit    client.Limit
	windowed bool          // aligned windows: the test needs its calls in one window
	reset    time.Duration // the longest ResetAfter after three units
}{
	{"fixed_window", client.FixedWindow{Limit: 3, Window: time.Minute}, true, time.Minute},
	{"sliding_log", client.SlidingLog{Limit: 3, Window: time.Minute}, false, time.Minute},
	{"sliding_window", client.SlidingWindow{Limit: 3, Window: time.Minute}, true, 2 * time.Minute},
	{"token_bucket", client.TokenBucket{Capacity: 3, Rate: 1, Period: 10 * time.Minute}, false, 30 * time.Minute},
	{"leaky_police", client.LeakyBucket{Capacity: 3, Rate: 1, Period: 10 * time.Minute}, false, 30 * time.Minute},
	{"leaky_shape", client.LeakyBucket{Capacity: 3, Rate: 1, Period: 10 * time.Minute, Mode: client.Shape}, false, 30 * time.Minute},
}

func ctx5s(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Every algorithm admits up to its limit through the client, then denies, with Results that
// say so; peeks and costs of 0 or above the limit behave as the contract says.
func TestClientAdmitsThenDenies(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		for _, l := range clientLimits {
			t.Run(l.name, func(t *testing.T) {
				ctx := ctx5s(t)
				key := keyFor(t)
				if l.windowed {
					roomInWindow(t, tg.c, 60_000, 2*time.Second)
				}
				shape := l.name == "leaky_shape"
				for i := int64(1); i <= 3; i++ {
					if p, err := lim.Peek(ctx, key, l.limit); err != nil || !p.Allowed || p.Remaining != 4-i {
						t.Fatalf("peek before call %d: %+v, %v", i, p, err)
					}
					r, err := lim.Allow(ctx, key, l.limit)
					if err != nil {
						t.Fatal(err)
					}
					if !r.Allowed || r.Limit != 3 || r.Remaining != 3-i || r.RetryAfter != 0 ||
						r.ResetAfter <= 0 || r.ResetAfter > l.reset || r.Source == client.FromFallback {
						t.Errorf("call %d: %+v", i, r)
					}
					if wantDelay := shape && i > 1; (r.Delay > 0) != wantDelay || r.Delay > 20*time.Minute {
						t.Errorf("call %d: delay %s", i, r.Delay)
					}
				}
				p, err := lim.Peek(ctx, key, l.limit)
				if err != nil || p.Allowed || p.Remaining != 0 || p.RetryAfter <= 0 {
					t.Errorf("peek when full: %+v, %v", p, err)
				}
				r, err := lim.Allow(ctx, key, l.limit)
				if err != nil || r.Allowed || r.Limit != 3 || r.Remaining != 0 || r.RetryAfter <= 0 ||
					r.RetryAfter > l.reset || r.ResetAfter <= 0 || r.ResetAfter > l.reset || r.Delay != 0 {
					t.Errorf("call 4: %+v, %v", r, err)
				}
				if r, err := lim.AllowN(ctx, key, l.limit, 4); err != nil || r.Allowed || r.RetryAfter != client.Never {
					t.Errorf("cost 4 > limit 3: %+v, %v; want RetryAfter Never", r, err)
				}
				if r, err := lim.AllowN(ctx, key, l.limit, 0); err != nil || !r.Allowed || r.Remaining != 0 {
					t.Errorf("cost 0: %+v, %v", r, err)
				}
				// the state is where Key says, so the CLI finds it
				n, err := do(t, tg.c, tg.c.B().Exists().Key(lim.Key(key, l.limit)).Build()).AsInt64()
				if err != nil || n != 1 {
					t.Errorf("no state at %s: %d, %v", lim.Key(key, l.limit), n, err)
				}
			})
		}
	})
}

// A key of another type, or another algorithm's state, is a *client.LibraryError.
func TestClientLibraryError(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		key := keyFor(t)
		limit := client.SlidingWindow{Limit: 3, Window: time.Minute}
		k := harness.NewLimiter(t, tg.c, slowMachine).Key(key, limit)
		if err := do(t, tg.c, tg.c.B().Hset().Key(k).FieldValue().FieldValue("a", "b").Build()).Error(); err != nil {
			t.Fatal(err)
		}
		_, err := harness.NewLimiter(t, tg.c, slowMachine).Allow(ctx, key, limit)
		var le *client.LibraryError
		if !errors.As(err, &le) || le.Function != "rl_sliding_window" {
			t.Fatalf("got %v, want a *client.LibraryError", err)
		}
	})
}

// Peek runs on a replica when the client sends read-only commands there. The proof is the
// replica's own count of FCALL_RO calls.
func TestClientPeekRunsOnAReplica(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		key := keyFor(t)
		limit := client.TokenBucket{Capacity: 5, Rate: 1, Period: 10 * time.Minute}
		if _, err := harness.NewLimiter(t, tg.c, slowMachine).AllowN(ctx, key, limit, 2); err != nil {
			t.Fatal(err)
		}
		stateKey := harness.NewLimiter(t, tg.c, slowMachine).Key(key, limit)
		rep := tg.replicaFor(t, stateKey)
		waitReplicated(t, rep, stateKey)

		lim := harness.NewLimiter(t, readsFromReplicas(t, tg, rep), slowMachine)
		before := commandCalls(t, rep.c, "fcall_ro")
		for range 5 {
			r, err := lim.Peek(ctx, key, limit)
			if err != nil || !r.Allowed || r.Remaining != 3 {
				t.Fatalf("peek: %+v, %v; want allowed with 3 remaining", r, err)
			}
		}
		if after := commandCalls(t, rep.c, "fcall_ro"); after.Calls-before.Calls < 5 {
			t.Errorf("replica %s ran FCALL_RO %d times for 5 peeks", rep.addr, after.Calls-before.Calls)
		}
	})
}

// readsFromReplicas returns a client of tg that sends read-only commands to replicas (for a
// standalone target, to rep).
func readsFromReplicas(t *testing.T, tg *target, rep *replica) valkey.Client {
	t.Helper()
	opt := valkey.ClientOption{
		DisableCache:   true,
		SendToReplicas: func(cmd valkey.Completed) bool { return cmd.IsReadOnly() },
	}
	for addr := range tg.c.Nodes() {
		opt.InitAddress = append(opt.InitAddress, addr)
	}
	if tg.name != "cluster" {
		opt.Standalone.ReplicaAddress = []string{rep.addr}
	}
	// valkey-go routes reads only to replicas that CLUSTER SHARDS reports "online"; a replica
	// is "loading" until the cluster's gossip has seen it replicate something, so a client
	// made too early keeps sending reads to the primary until its next topology refresh.
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := valkey.NewClient(opt)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := c.Nodes()[rep.addr]; ok || tg.name != "cluster" {
			t.Cleanup(c.Close)
			return c
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("the cluster never listed the replica %s as online", rep.addr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// commandCalls reads a command's counters from a node's INFO commandstats.
func commandCalls(t testing.TB, c valkey.Client, cmd string) harness.CommandStat {
	t.Helper()
	st, err := harness.CommandStats(ctx5s(t), c, cmd)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A replica without the library (here: a server the client takes for a replica, which never
// had it) does not fail a peek: the client asks the primary.
func TestClientPeekFallsBackToPrimary(t *testing.T) {
	primary, other := harness.StartValkey(t), harness.StartValkey(t)
	pc, oc := primary.Client(t), other.Client(t)
	loadCode(t, pc, functions.Source)
	vk, err := valkey.NewClient(valkey.ClientOption{
		InitAddress:    []string{primary.Addr},
		Standalone:     valkey.StandaloneOption{ReplicaAddress: []string{other.Addr}},
		SendToReplicas: func(cmd valkey.Completed) bool { return cmd.IsReadOnly() },
		DisableCache:   true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer vk.Close()
	lim := harness.NewLimiter(t, vk, slowMachine)
	ctx := ctx5s(t)
	limit := client.SlidingLog{Limit: 4, Window: time.Minute}
	if _, err := lim.Allow(ctx, "user:42", limit); err != nil {
		t.Fatal(err)
	}
	replicaBefore, primaryBefore := commandCalls(t, oc, "fcall_ro"), commandCalls(t, pc, "fcall")
	r, err := lim.Peek(ctx, "user:42", limit)
	if err != nil || !r.Allowed || r.Remaining != 3 {
		t.Fatalf("peek: %+v, %v; want allowed with 3 remaining", r, err)
	}
	replicaAfter, primaryAfter := commandCalls(t, oc, "fcall_ro"), commandCalls(t, pc, "fcall")
	if replicaAfter.Failed-replicaBefore.Failed != 1 {
		t.Errorf("the replica failed %d FCALL_RO, want 1", replicaAfter.Failed-replicaBefore.Failed)
	}
	if primaryAfter.Calls-primaryBefore.Calls != 1 {
		t.Errorf("the primary ran %d FCALL, want 1 (the peek)", primaryAfter.Calls-primaryBefore.Calls)
	}
}

// AllowAllEach (what fills the quota headers of a SameKey policy) is one rl_multi on a node that
// runs library 1.3.0: every limit's own state comes in its reply (replies), with no peek, and
// is the decision's own.
func TestAllowAllEachOneCall(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		key := keyFor(t)
		tb := client.TokenBucket{Capacity: 5, Rate: 1, Period: 10 * time.Minute}
		fw := client.FixedWindow{Limit: 9, Window: time.Hour}
		rules := []client.Rule{{Key: key, Limit: tb}, {Key: key, Limit: fw}}
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		if _, err := lim.AllowAll(ctx, rules); err != nil {
			t.Fatal(err)
		}
		node := primaryOf(t, tg, lim.Key(key, tb))
		roBefore, rwBefore := commandCalls(t, node, "fcall_ro"), commandCalls(t, node, "fcall")
		for i := range int64(3) {
			res, each, err := lim.AllowAllEach(ctx, rules, 1)
			if err != nil || !res.Allowed || res.Source != client.FromServer || len(each) != 2 {
				t.Fatalf("decision %d: %+v, %+v, %v", i+1, res, each, err)
			}
			for j, want := range []int64{3 - i, 7 - i} {
				if e := each[j]; e.Limit != rules[j].Limit.Quota().Limit || e.Remaining != want || !e.Allowed || e.Rule != j {
					t.Errorf("decision %d, limit %d: %+v; want %d remaining", i+1, j, e, want)
				}
			}
		}
		if after := commandCalls(t, node, "fcall_ro"); after.Calls != roBefore.Calls {
			t.Errorf("%s ran FCALL_RO %d times for 3 decisions, want none", tg.name, after.Calls-roBefore.Calls)
		}
		if after := commandCalls(t, node, "fcall"); after.Calls-rwBefore.Calls != 3 {
			t.Errorf("the primary ran FCALL %d times for 3 decisions, want 3 (the rl_multi alone)", after.Calls-rwBefore.Calls)
		}
		// denied: each limit as its peek would read it, nothing taken
		res, each, err := lim.AllowAllEach(ctx, rules, 2)
		if err != nil || res.Allowed || res.Rule != 0 || each[0].Allowed || each[0].Remaining != 1 || !each[1].Allowed || each[1].Remaining != 5 {
			t.Errorf("a denied decision: %+v, %+v, %v", res, each, err)
		}
	})
}

// On a node that runs 1.2.0, AllowAllEach reads each limit's state by a peek pipelined behind
// the rl_multi, as before 1.3.0: the node's refusal of replies costs one refused call and a
// version lookup a cooldown, never an error. The peeks are FCALL_RO: a replica may answer them
// (SendToReplicas); a standalone client sends a pipeline that holds a write to the primary.
func TestAllowAllEachOn12Peeks(t *testing.T) {
	s := harness.StartValkey(t)
	c := s.Client(t)
	loadCode(t, c, release(t, "1.2.0").Code)
	ctx := ctx5s(t)
	key := keyFor(t)
	tb := client.TokenBucket{Capacity: 5, Rate: 1, Period: 10 * time.Minute}
	fw := client.FixedWindow{Limit: 9, Window: time.Hour}
	rules := []client.Rule{{Key: key, Limit: tb}, {Key: key, Limit: fw}}
	lim := harness.NewLimiter(t, c, client.Options{Deadline: slowDeadline, Fallback: client.ReturnError, BreakerCooldown: time.Hour})
	roBefore, rwBefore := commandCalls(t, c, "fcall_ro"), commandCalls(t, c, "fcall")
	for i := range int64(3) {
		res, each, err := lim.AllowAllEach(ctx, rules, 1)
		if err != nil || !res.Allowed || res.Source != client.FromServer || len(each) != 2 {
			t.Fatalf("decision %d: %+v, %+v, %v", i+1, res, each, err)
		}
		for j, want := range []int64{4 - i, 8 - i} {
			if e := each[j]; e.Remaining != want {
				t.Errorf("decision %d, limit %d: %+v; want %d remaining", i+1, j, e, want)
			}
		}
	}
	ro, rw := commandCalls(t, c, "fcall_ro"), commandCalls(t, c, "fcall")
	// the peeks (6), and the version lookup after the refusal (1)
	if ro.Calls-roBefore.Calls != 7 || rw.Calls-rwBefore.Calls != 4 || rw.Failed-rwBefore.Failed != 1 {
		t.Errorf("1.2.0 ran FCALL_RO %d times, FCALL %d (%d refused) for 3 decisions; want 7, 4 (1)",
			ro.Calls-roBefore.Calls, rw.Calls-rwBefore.Calls, rw.Failed-rwBefore.Failed)
	}
}

// A server without the library answers ErrNotLoaded, which says what to do: returned as it is
// by ReturnError (the default policy, LocalFallback, decides such calls locally).
func TestClientNotLoaded(t *testing.T) {
	s := harness.StartValkey(t)
	lim := harness.NewLimiter(t, s.Client(t), client.Options{Deadline: slowDeadline, Fallback: client.ReturnError})
	ctx := ctx5s(t)
	limit := client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Second}
	for name, call := range map[string]func() (client.Result, error){
		"allow": func() (client.Result, error) { return lim.Allow(ctx, "k", limit) },
		"peek":  func() (client.Result, error) { return lim.Peek(ctx, "k", limit) },
	} {
		if _, err := call(); !errors.Is(err, client.ErrNotLoaded) || strings.Contains(err.Error(), "rlfn deploy") {
			t.Errorf("%s: got %v, want ErrNotLoaded, with no CLI advice", name, err)
		}
	}
	err := lim.Check(ctx)
	var ve *client.VersionError
	if !errors.Is(err, client.ErrNotLoaded) || !errors.As(err, &ve) || ve.Node != s.Addr {
		t.Errorf("check: got %v, want ErrNotLoaded naming %s", err, s.Addr)
	}
}

// sourceWithVersion is the working copy declaring another version.
func sourceWithVersion(t *testing.T, v string) string {
	t.Helper()
	cur := "local VERSION = '" + workingVersion(t) + "'"
	src := strings.Replace(functions.Source, cur, "local VERSION = '"+v+"'", 1)
	if src == functions.Source {
		t.Fatalf("no %q in the library", cur)
	}
	return src
}

func TestClientCheck(t *testing.T) {
	t.Run("shared targets", func(t *testing.T) {
		forEachTarget(t, func(t *testing.T, tg *target) {
			if err := harness.NewLimiter(t, tg.c, slowMachine).Check(ctx5s(t)); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("another major", func(t *testing.T) {
		s := harness.StartValkey(t)
		c := s.Client(t)
		loadCode(t, c, sourceWithVersion(t, "2.0.0"))
		err := harness.NewLimiter(t, c, slowMachine).Check(ctx5s(t))
		var ve *client.VersionError
		if !errors.As(err, &ve) || ve.Node != s.Addr || ve.Version != "2.0.0" || errors.Is(err, client.ErrNotLoaded) {
			t.Fatalf("got %v, want a *VersionError naming %s", err, s.Addr)
		}
		// a minor version ahead is still the same contract
		loadCode(t, c, sourceWithVersion(t, "1.99.0"))
		if err := harness.NewLimiter(t, c, slowMachine).Check(ctx5s(t)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		cl := harness.StartCluster(t, 3, 0)
		good, wrong, none := cl.Primaries[0], cl.Primaries[1], cl.Primaries[2]
		loadCode(t, good.Client(t), functions.Source)
		loadCode(t, wrong.Client(t), sourceWithVersion(t, "2.0.0"))
		err := harness.NewLimiter(t, cl.Client(t, false), slowMachine).Check(ctx5s(t))
		if err == nil {
			t.Fatal("no error")
		}
		joined, ok := err.(interface{ Unwrap() []error })
		if !ok || len(joined.Unwrap()) != 2 {
			t.Fatalf("got %v, want one error for each of %s and %s", err, wrong.Addr, none.Addr)
		}
		got := map[string]*client.VersionError{}
		for _, e := range joined.Unwrap() {
			var ve *client.VersionError
			if !errors.As(e, &ve) {
				t.Fatalf("%v is not a *VersionError", e)
			}
			got[ve.Node] = ve
		}
		if ve := got[wrong.Addr]; ve == nil || ve.Version != "2.0.0" {
			t.Errorf("%s runs 2.0.0: got %v", wrong.Addr, err)
		}
		if ve := got[none.Addr]; ve == nil || !errors.Is(ve, client.ErrNotLoaded) {
			t.Errorf("%s has no library: got %v", none.Addr, err)
		}
		if strings.Contains(err.Error(), good.Addr) {
			t.Errorf("%s is fine, but named: %v", good.Addr, err)
		}
	})
}

// Keys with braces, colons, percent signs and backslashes are principals of their own: none
// reaches another's state, and each hashes to the slot of its own escaped key. The empty key
// names no principal: it is a *KeyError, and nothing is written for it.
func TestClientHostileKeys(t *testing.T) {
	keys := []struct{ give, tag string }{
		{"x", "x"}, {"{x}", "%7Bx%7D"}, {"a", "a"}, {"b", "b"}, {"a}b", "a%7Db"}, {"{a}b", "%7Ba%7Db"},
		{"user:1", "user:1"}, {"user:1}:fixed_window", "user:1%7D:fixed_window"},
		{"user:1}:token_bucket", "user:1%7D:token_bucket"}, {"user:1}", "user:1%7D"},
		{`\`, `\`}, {`a\b`, `a\b`}, {`\}`, `\%7D`}, {`\{`, `\%7B`}, {"{", "%7B"}, {"}", "%7D"},
		{"{}", "%7B%7D"}, {"}{", "%7D%7B"}, {"%", "%25"}, {"%7B", "%257B"}, {"%25", "%2525"}, {"", "%"},
	}
	limits := []client.Limit{
		client.FixedWindow{Limit: 1, Window: time.Minute},
		client.TokenBucket{Capacity: 1, Rate: 1, Period: 10 * time.Minute},
	}
	forEachTarget(t, func(t *testing.T, tg *target) {
		ctx := ctx5s(t)
		prefix := keyFor(t) + ":"
		lim := harness.NewLimiter(t, tg.c, client.Options{Prefix: prefix, Deadline: slowDeadline, Fallback: client.ReturnError})
		roomInWindow(t, tg.c, 60_000, 3*time.Second)
		for round, want := range []bool{true, false} {
			for _, l := range limits {
				for _, k := range keys {
					r, err := lim.Allow(ctx, k.give, l)
					if k.give == "" {
						var ke *client.KeyError
						if !errors.As(err, &ke) || ke.Len != 0 {
							t.Errorf("round %d, the empty key, %T: %+v, %v; want a *KeyError", round+1, l, r, err)
						}
						if n, err := do(t, tg.c, tg.c.B().Exists().Key(lim.Key(k.give, l)).Build()).AsInt64(); err != nil || n != 0 {
							t.Errorf("the empty key, %T: its state key exists (%d, %v)", l, n, err)
						}
						continue
					}
					if err != nil || r.Allowed != want {
						t.Errorf("round %d, %q, %T: %+v, %v; want allowed=%v", round+1, k.give, l, r, err, want)
					}
				}
			}
		}
		if tg.name != "cluster" {
			return
		}
		slot := func(key string) int64 {
			n, err := do(t, tg.primary, tg.primary.B().ClusterKeyslot().Key(key).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		for _, k := range keys {
			want := slot(k.tag)
			for _, l := range append(limits, client.SlidingLog{}, client.SlidingWindow{}, client.LeakyBucket{}) {
				for _, p := range []string{prefix, "rl:", "{other}"} {
					sk := harness.NewLimiter(t, tg.c, client.Options{Prefix: p}).Key(k.give, l)
					if got := slot(sk); got != want {
						t.Errorf("%s is in slot %d, want %d (that of %q)", sk, got, want, k.tag)
					}
				}
			}
		}
	})
}

// The client refuses exactly the limits the server refuses, at the edges of the library's
// bounds too (its 2^53 checks are made in float64).
func TestClientValidationMatchesServer(t *testing.T) {
	const maxDuration = 100000000000 * time.Millisecond
	limits := []client.Limit{
		client.FixedWindow{Limit: 999999999999999, Window: maxDuration},
		client.FixedWindow{Limit: 1, Window: maxDuration + time.Millisecond},
		client.SlidingLog{Limit: 100000, Window: time.Second},
		client.SlidingLog{Limit: 100001, Window: time.Second},
		client.SlidingWindow{Limit: 4503599627370, Window: 2 * time.Second},                // 2^53 - 992
		client.SlidingWindow{Limit: 4503599627371, Window: 2 * time.Second},                // 2^53 + 1008
		client.SlidingWindow{Limit: 84179432287299, Window: 107 * time.Millisecond},        // 2^53 + 1, 2^53 in float64
		client.SlidingWindow{Limit: 84179432287300, Window: 107 * time.Millisecond},        // 2^53 + 108
		client.TokenBucket{Capacity: 9007199, Rate: 1, Period: 1000000 * time.Millisecond}, // p = 10^9
		client.TokenBucket{Capacity: 9007200, Rate: 1, Period: 1000000 * time.Millisecond},
		client.TokenBucket{Capacity: 84179432287299, Rate: 1000, Period: 107 * time.Millisecond}, // p = 107
		client.TokenBucket{Capacity: 84179432287300, Rate: 1000, Period: 107 * time.Millisecond},
		client.TokenBucket{Capacity: 999999999999999, Rate: 100000000000000, Period: maxDuration}, // p = 1
		client.LeakyBucket{Capacity: 84179432287299, Rate: 1000, Period: 107 * time.Millisecond, Mode: client.Shape},
		client.LeakyBucket{Capacity: 84179432287300, Rate: 1000, Period: 107 * time.Millisecond},
	}
	forEachTarget(t, func(t *testing.T, tg *target) {
		for _, l := range limits {
			fn, args := serverArgs(l)
			_, serverErr := tryCall(tg.c, true, fn+"_peek", keyFor(t), args...)
			if serverErr != nil && !isRLERR(serverErr) {
				t.Fatalf("%#v: %v", l, serverErr)
			}
			if clientErr := l.Validate(); (clientErr == nil) != (serverErr == nil) {
				t.Errorf("%#v: the client says %v, the server %v", l, clientErr, serverErr)
			}
		}
	})
}

// serverArgs is how the library takes l, written here independently of the client.
func serverArgs(l client.Limit) (fn string, args []string) {
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	switch l := l.(type) {
	case client.FixedWindow:
		return "rl_fixed_window", itoa(l.Limit, ms(l.Window), 1)
	case client.SlidingLog:
		return "rl_sliding_log", itoa(l.Limit, ms(l.Window), 1)
	case client.SlidingWindow:
		return "rl_sliding_window", itoa(l.Limit, ms(l.Window), 1)
	case client.TokenBucket:
		return "rl_token_bucket", itoa(l.Capacity, l.Rate, ms(l.Period), 1)
	case client.LeakyBucket:
		return "rl_leaky_bucket", append(itoa(l.Capacity, l.Rate, ms(l.Period), 1), l.Mode.String())
	}
	panic(fmt.Sprintf("%T", l))
}

// BenchmarkClientAllow is one decision through the client against the shared Valkey, round
// trip included: the allocations are the client's and valkey-go's together.
func BenchmarkClientAllow(b *testing.B) {
	tg := servers(b)[0]
	lim := harness.NewLimiter(b, tg.c, slowMachine)
	ctx := context.Background()
	limit := client.TokenBucket{Capacity: 1e12, Rate: 1e12, Period: time.Second}
	key := keyFor(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := lim.Allow(ctx, key, limit); err != nil {
			b.Fatal(err)
		}
	}
}

// slowMachine is for tests of what the server decides. It replaces the client's 100ms default
// deadline: a test machine running other suites at once can take longer than that, and a
// deadline is tested on its own (client_failure_test.go). And it returns every error
// (ReturnError) rather than the default local fallback's decision, which would let such a test
// pass with the server failing; a test of a fallback names its own with slowDeadline.
var slowMachine = client.Options{Deadline: slowDeadline, Fallback: client.ReturnError}

// slowDeadline is slowMachine's deadline.
const slowDeadline = 5 * time.Second
