package client_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"

	"github.com/rlfn/rlfn/client"
)

// A Limiter's default is to decide locally when the server cannot: a server gone must never be
// a service served with no limit at all.
func TestDefaultPolicyIsLocalFallback(t *testing.T) {
	lim := newLimiter(t, replyClient{mock.NewClient(nil), mock.ErrorResult(errors.New("connection refused"))}, client.Options{})
	limit := client.FixedWindow{Limit: 3, Window: time.Hour}
	admitted := 0
	for range 10 {
		res, err := lim.Allow(context.Background(), "k", limit)
		if err != nil || res.Source != client.FromFallback {
			t.Fatalf("%+v, %v; want a local decision", res, err)
		}
		if res.Allowed {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("admitted %d of 10 with the server gone, want the limit, 3", admitted)
	}
}

// An empty key and one longer than Options.MaxKeyLen are *KeyErrors, sent nowhere, whatever the
// policy: they are the caller's.
func TestKeyBounds(t *testing.T) {
	var sent atomic.Bool // AllowAll's keys are decided side by side
	vk := scriptClient{Client: mock.NewClient(nil), do: func([]string) valkey.ValkeyResult {
		sent.Store(true)
		return okReply
	}}
	limit := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}
	conc := client.Concurrency{Limit: 1, Lease: time.Second}
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		opts client.Options
		key  string
		want string // the error; empty: admitted
	}{
		{"empty", client.Options{}, "", "client: the key is empty: no principal to count the call against"},
		{"default bound", client.Options{}, strings.Repeat("k", 512), ""},
		{"past the default bound", client.Options{}, strings.Repeat("k", 513),
			"client: the key is 513 bytes, longer than the 512 Options.MaxKeyLen allows (key a long identifier by a hash of it)"},
		{"a MiB", client.Options{}, strings.Repeat("k", 1<<20), "client: the key is 1048576 bytes, longer than the 512 Options.MaxKeyLen allows (key a long identifier by a hash of it)"},
		{"own bound", client.Options{MaxKeyLen: 4}, "kkkk", ""},
		{"past its own bound", client.Options{MaxKeyLen: 4}, "kkkkk",
			"client: the key is 5 bytes, longer than the 4 Options.MaxKeyLen allows (key a long identifier by a hash of it)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, p := range []client.Fallback{client.ReturnError, client.FailOpen, client.LocalFallback} {
				o := tt.opts
				o.Fallback = p
				lim := newLimiter(t, vk, o)
				calls := map[string]func() error{
					"Allow":  func() error { _, err := lim.Allow(ctx, tt.key, limit); return err },
					"Peek":   func() error { _, err := lim.Peek(ctx, tt.key, limit); return err },
					"Refund": func() error { _, err := lim.Refund(ctx, tt.key, limit, 1); return err },
					"AllowAll": func() error {
						_, err := lim.AllowAll(ctx, []client.Rule{{Key: "o", Limit: limit}, {Key: tt.key, Limit: limit}})
						return err
					},
					"Lease": func() error { _, err := lim.Lease(tt.key, conc, "id"); return err },
				}
				for name, call := range calls {
					sent.Store(false)
					err := call()
					var ke *client.KeyError
					switch {
					case tt.want == "" && errors.As(err, &ke):
						t.Errorf("%s %s: %v", p, name, err)
					case tt.want != "" && (!errors.As(err, &ke) || err.Error() != tt.want):
						t.Errorf("%s %s: got %v, want %q", p, name, err, tt.want)
					case tt.want != "" && sent.Load():
						t.Errorf("%s %s: a refused key was sent", p, name)
					}
				}
			}
		})
	}
	for _, n := range []int{-1, 1<<20 + 1} {
		if _, err := client.New(vk, client.Options{MaxKeyLen: n}); err == nil {
			t.Errorf("MaxKeyLen %d accepted", n)
		}
	}
}

// A limit that needs library 1.1.0 on a node that runs 1.0.0 is decided by the Policy (the
// local fallback by default), never left unlimited; the node is asked once a cooldown, not on
// every call, and a deploy is seen after it.
func TestOlderLibraryFallsBack(t *testing.T) {
	clock := newFakeClock()
	var mu sync.Mutex
	version := "1.0.0"
	var refused, lookups, served int
	vk := scriptClient{
		Client: mock.NewClient(nil),
		do: func(cmd []string) valkey.ValkeyResult {
			mu.Lock()
			defer mu.Unlock()
			if version == "1.0.0" {
				refused++
				return mock.Result(mock.ValkeyError("RLERR rl_token_bucket takes 4 arguments (capacity rate period_ms cost), got 5"))
			}
			served++
			return mock.Result(ints(1, 10, 5, 0, 1000, 0))
		},
	}
	node := scriptClient{Client: mock.NewClient(nil), doMulti: func([][]string) []valkey.ValkeyResult {
		mu.Lock()
		defer mu.Unlock()
		lookups++
		return []valkey.ValkeyResult{mock.Result(mock.ValkeyInt64(0)), mock.Result(mock.ValkeyBlobString(version))}
	}}
	nodes := nodesClient{scriptClient: vk, nodes: map[string]valkey.Client{"10.0.0.1:6379": node}}
	lim := newLimiter(t, nodes, client.WithClock(client.Options{}, clock.now))
	limit := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour, Reserve: 2}
	ctx := context.Background()
	admitted := 0
	for range 20 {
		res, err := lim.Allow(ctx, "k", limit)
		if err != nil || res.Source != client.FromFallback {
			t.Fatalf("%+v, %v; want the local fallback's decision", res, err)
		}
		if res.Allowed {
			admitted++
		}
	}
	if admitted != 8 || refused != 1 || lookups != 1 {
		t.Fatalf("admitted %d (want 8: capacity 10, reserve 2), %d calls refused and %d version lookups (want 1 each)", admitted, refused, lookups)
	}
	version = "1.1.0"
	clock.advance(time.Second)
	if res, err := lim.Allow(ctx, "k", limit); err != nil || res.Source == client.FromFallback || served != 1 {
		t.Fatalf("%+v, %v after a deploy and a cooldown; want the server's decision", res, err)
	}
}

// nodesClient is a scriptClient that knows nodes.
type nodesClient struct {
	scriptClient
	nodes map[string]valkey.Client
}

func (c nodesClient) Nodes() map[string]valkey.Client { return c.nodes }

// An attack on one principal behind a second limit of another key (per user and per IP) costs
// the server no more calls per refused request than per admitted one: once the user's limit
// said it would deny, it is asked first, alone, and its denial ends the decision; the IP's limit
// is only peeked (for the longest RetryAfter), never taken from and refunded.
func TestDenialCostsNoMoreThanAdmission(t *testing.T) {
	var mu sync.Mutex
	used := map[string]int64{}
	calls := 0
	vk := scriptClient{Client: mock.NewClient(nil), do: func(cmd []string) valkey.ValkeyResult {
		mu.Lock()
		defer mu.Unlock()
		calls++
		limit := int64(5)
		if strings.Contains(cmd[3], "ip:") {
			limit = 1000
		}
		switch cmd[1] {
		case "rl_fixed_window_peek":
			return mock.Result(ints(b2i(used[cmd[3]] < limit), limit, limit-used[cmd[3]], 0, 30_000, 0))
		case "rl_fixed_window_refund":
			used[cmd[3]]--
		case "rl_fixed_window":
			if used[cmd[3]] >= limit {
				return mock.Result(ints(0, limit, 0, 30_000, 30_000, 0))
			}
			used[cmd[3]]++
		}
		return mock.Result(ints(1, limit, limit-used[cmd[3]], 0, 30_000, 0))
	}}
	lim := newLimiter(t, vk, client.Options{})
	rules := []client.Rule{
		{Key: "user:alice", Limit: client.FixedWindow{Limit: 5, Window: time.Minute}},
		{Key: "ip:10.0.0.1", Limit: client.FixedWindow{Limit: 1000, Window: time.Minute}},
	}
	for i := range 100 {
		calls = 0
		res, err := lim.AllowAll(context.Background(), rules)
		switch {
		case err != nil:
			t.Fatal(err)
		case res.Allowed != (i < 5):
			t.Fatalf("request %d: %+v", i+1, res)
		case res.Allowed && calls != 2:
			t.Fatalf("admitted request %d cost %d calls, want 2", i+1, calls)
		case !res.Allowed && calls != 2:
			t.Fatalf("refused request %d cost %d calls, want 2 (the user's, and a peek of the IP's)", i+1, calls)
		}
	}
	if used["rl:{ip:10.0.0.1}:fixed_window"] != 5 {
		t.Errorf("the IP's limit counts %v, want the 5 admitted requests", used)
	}
	// AllowAllEach reports every limit: the key not asked is the peek's.
	calls = 0
	res, each, err := lim.AllowAllEach(context.Background(), rules, 1)
	if err != nil || res.Allowed || res.Rule != 0 || calls != 2 {
		t.Fatalf("%+v, %v, %d calls; want the user's denial in 2 calls", res, err, calls)
	}
	if each[0].Allowed || each[0].Limit != 5 || !each[1].Allowed || each[1].Limit != 1000 || each[1].Remaining != 995 {
		t.Errorf("each %+v; want the user's denial and the IP's state", each)
	}
	if used["rl:{ip:10.0.0.1}:fixed_window"] != 5 {
		t.Errorf("the peek took from the IP's limit: %v", used)
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// A key asked first on its own (it denied last time) ends the decision with its denial, but the
// other keys are peeked: when one of them denies too, with a longer wait, RetryAfter is that
// one's, as when every key is asked (a client told too short a wait comes back too early).
func TestHintKeepsTheLongestRetryAfter(t *testing.T) {
	var ipDenies atomic.Bool
	vk := scriptClient{Client: mock.NewClient(nil), do: func(cmd []string) valkey.ValkeyResult {
		switch {
		case strings.Contains(cmd[3], "user:"):
			return mock.Result(ints(0, 5, 0, 1_000, 1_000, 0))
		case cmd[1] == "rl_fixed_window_refund":
			return mock.Result(ints(1, 1000, 1000, 0, 30_000, 0))
		case ipDenies.Load():
			return mock.Result(ints(0, 1000, 0, 30_000, 30_000, 0))
		}
		return mock.Result(ints(1, 1000, 999, 0, 30_000, 0))
	}}
	lim := newLimiter(t, vk, client.Options{})
	rules := []client.Rule{
		{Key: "user:alice", Limit: client.FixedWindow{Limit: 5, Window: time.Second}},
		{Key: "ip:10.0.0.1", Limit: client.FixedWindow{Limit: 1000, Window: time.Minute}},
	}
	ctx := context.Background()
	if _, err := lim.AllowAll(ctx, rules); err != nil { // the user's denial leaves a hint
		t.Fatal(err)
	}
	ipDenies.Store(true)
	res, err := lim.AllowAll(ctx, rules)
	if err != nil || res.Allowed || res.RetryAfter != 30*time.Second || res.Rule != 1 {
		t.Errorf("%+v, %v; want rule 1's denial, 30s: both deny, the IP's wait is the longest", res, err)
	}
}

// On a 1.0.0 node the keys are decided one at a time, a key that denied last time first: an
// attack on one user behind a per-IP limit (the IP's rule first) never takes, and keeps, a unit
// of the IP's limit per refused request, which would exhaust it for every user of the IP.
func TestOlderNodeDecidesTheHintedKeyFirst(t *testing.T) {
	var mu sync.Mutex
	used := map[string]int64{}
	vk := scriptClient{Client: mock.NewClient(nil), do: func(cmd []string) valkey.ValkeyResult {
		mu.Lock()
		defer mu.Unlock()
		if cmd[0] == "FCALL" && len(cmd) > 7 { // a reserve argument: 1.0.0 refuses it
			return mock.Result(mock.ValkeyError("RLERR rl_fixed_window takes 3 arguments (limit window_ms cost), got 4"))
		}
		limit := int64(1000)
		if strings.Contains(cmd[3], "user:") {
			limit = 5
		}
		if cmd[1] == "rl_fixed_window_peek" {
			return mock.Result(ints(b2i(used[cmd[3]] < limit), limit, limit-used[cmd[3]], 0, 30_000, 0))
		}
		if used[cmd[3]] >= limit {
			return mock.Result(ints(0, limit, 0, 30_000, 30_000, 0))
		}
		used[cmd[3]]++
		return mock.Result(ints(1, limit, limit-used[cmd[3]], 0, 30_000, 0))
	}}
	lim := newLimiter(t, nodesClient{scriptClient: vk, nodes: map[string]valkey.Client{"10.0.0.1:6379": on10}}, client.Options{})
	rules := []client.Rule{
		{Key: "ip:10.0.0.1", Limit: client.FixedWindow{Limit: 1000, Window: time.Minute}},
		{Key: "user:alice", Limit: client.FixedWindow{Limit: 5, Window: time.Minute}},
	}
	for i := range 100 {
		res, err := lim.AllowAll(context.Background(), rules)
		if err != nil || res.Source == client.FromFallback || res.Allowed != (i < 5) {
			t.Fatalf("request %d: %+v, %v", i+1, res, err)
		}
	}
	if n := used["rl:{ip:10.0.0.1}:fixed_window"]; n != 5 {
		t.Errorf("the IP's limit counts %d units for 5 admitted requests: refused ones kept theirs", n)
	}
}

// on10 answers a version lookup as a node running 1.0.0 does.
var on10 = scriptClient{Client: mock.NewClient(nil), doMulti: func([][]string) []valkey.ValkeyResult {
	return []valkey.ValkeyResult{mock.Result(mock.ValkeyInt64(0)), mock.Result(mock.ValkeyBlobString("1.0.0"))}
}}

// Once a node is known to run 1.0.0, one call a cooldown goes to it again (the probe), not
// every call in flight when the cooldown ends; a call that needs 1.1.0 and succeeds forgets it.
func TestOlderNodeProbedOnce(t *testing.T) {
	clock := newFakeClock()
	var sent, lookups atomic.Int64
	var upgraded atomic.Bool
	vk := scriptClient{Client: mock.NewClient(nil), do: func([]string) valkey.ValkeyResult {
		sent.Add(1)
		if upgraded.Load() {
			return mock.Result(ints(1, 10, 5, 0, 1000, 0))
		}
		time.Sleep(time.Millisecond)
		return mock.Result(mock.ValkeyError("RLERR rl_token_bucket takes 4 arguments (capacity rate period_ms cost), got 5"))
	}}
	node := scriptClient{Client: mock.NewClient(nil), doMulti: func(c [][]string) []valkey.ValkeyResult {
		lookups.Add(1)
		return on10.doMulti(c)
	}}
	lim := newLimiter(t, nodesClient{scriptClient: vk, nodes: map[string]valkey.Client{"10.0.0.1:6379": node}}, client.WithClock(client.Options{}, clock.now))
	limit := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour, Reserve: 2}
	ctx := context.Background()
	if r, err := lim.Allow(ctx, "k", limit); err != nil || r.Source != client.FromFallback {
		t.Fatalf("%+v, %v; want a local decision", r, err)
	}
	clock.advance(time.Second)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() { _, _ = lim.Allow(ctx, "k", limit) })
	}
	wg.Wait()
	if sent.Load() != 2 || lookups.Load() != 2 {
		t.Errorf("%d calls sent and %d version lookups, want 2 each: the first, and one probe a cooldown later", sent.Load(), lookups.Load())
	}
	// the memory holds for the others: a local decision allocates nothing more for it
	var boxed client.Limit = limit // a struct made an interface at each call would allocate
	if n := testing.AllocsPerRun(100, func() { _, _ = lim.Allow(ctx, "k", boxed) }); n != 0 {
		t.Errorf("%v allocations per local decision of a known 1.0.0 node, want 0", n)
	}
	upgraded.Store(true)
	clock.advance(time.Second)
	for range 3 {
		if r, err := lim.Allow(ctx, "k", limit); err != nil || r.Source == client.FromFallback {
			t.Fatalf("%+v, %v after the upgrade; want the server's decision", r, err)
		}
	}
}

// A refund AllowAll owes on a key whose shard is remembered as running 1.0.0 (here, before a
// cluster's slot table is read, every key shares one breaker) goes to the policy, as every
// refund does: it is not handed back as an error.
func TestRefundOwedUnderOlderNodeMemory(t *testing.T) {
	vk := scriptClient{Client: mock.NewClient(nil), do: func(cmd []string) valkey.ValkeyResult {
		switch {
		case strings.Contains(cmd[3], "{b}") && len(cmd) > 7:
			return mock.Result(mock.ValkeyError("RLERR rl_fixed_window takes 3 arguments (limit window_ms cost), got 4"))
		case strings.Contains(cmd[3], "{b}") && cmd[0] == "FCALL_RO":
			return mock.Result(ints(0, 5, 0, 1000, 1000, 0))
		case strings.Contains(cmd[3], "{b}"):
			return mock.Result(ints(0, 5, 0, 1000, 1000, 0)) // b, on 1.0, denies
		}
		return mock.Result(ints(1, 5, 4, 0, 1000, 0)) // a, on 1.1, admits (and is refunded)
	}}
	lim := newLimiter(t, nodesClient{scriptClient: vk, nodes: map[string]valkey.Client{"10.0.0.1:6379": on10}}, client.Options{})
	fw := client.FixedWindow{Limit: 5, Window: time.Second}
	for range 3 {
		res, err := lim.AllowAll(context.Background(), []client.Rule{{Key: "a", Limit: fw}, {Key: "b", Limit: fw}})
		if err != nil || res.Allowed || res.Rule != 1 {
			t.Fatalf("%+v, %v; want b's denial and no error", res, err)
		}
	}
}
