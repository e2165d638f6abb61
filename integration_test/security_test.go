package integration_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
)

// The service user's name and password on the test servers.
const (
	svcUser     = "rlfn-svc"
	svcPassword = "svc-secret"
)

// aclRule is one rule of the service user (README, "The Go client"), with why it is there.
type aclRule struct {
	rule string
	// needed tells on which targets the rule is proven necessary: the scenario fails
	// without it. nil: everywhere.
	needed func(tg *target) bool
}

// svcRules are the service user's rules after `on >password resetkeys ~rl:* resetchannels
// -@all`. A function runs its commands with its caller's permissions, so the user needs the
// commands the library's functions run (on ~rl:* keys only), as well as FCALL and FCALL_RO.
var svcRules = []aclRule{
	{rule: "+fcall"},
	{rule: "+fcall_ro"},
	// what the functions of library 1.1.0 run (1.0.0 runs a subset of them)
	{rule: "+time"}, {rule: "+get"}, {rule: "+set"}, {rule: "+del"}, {rule: "+pexpireat"},
	{rule: "+zadd"}, {rule: "+zcard"}, {rule: "+zcount"}, {rule: "+zrange"}, {rule: "+zrem"},
	{rule: "+zremrangebyrank"}, {rule: "+zremrangebyscore"}, {rule: "+zscore"},
	// valkey-go turns client-side caching on at connect time (CLIENT TRACKING) unless
	// DisableCache: a refusal fails the connection.
	{rule: "+client|tracking"},
	// a cluster client reads the topology: CLUSTER SHARDS from Valkey 8 on, CLUSTER SLOTS
	// below (Redis 7, Valkey 7.2), which this test has no cluster of
	{rule: "+cluster|shards", needed: func(tg *target) bool { return tg.name == "cluster" }},
	{rule: "+cluster|slots", needed: func(*target) bool { return false }},
	// a cluster replica serves reads only after READONLY; valkey-go ignores its refusal and
	// the replica redirects every peek to its primary
	{rule: "+readonly", needed: func(tg *target) bool { return tg.name == "cluster" }},
}

// A service runs as a user that can call the library and nothing else: every client call
// (every algorithm's Allow, Peek, Refund; leases; several limits at once; peeks on replicas)
// works, while EVAL, FUNCTION LOAD/DELETE, other commands and keys outside rl:* are refused.
// Each rule is needed: without any one, some call fails.
func TestSecurityServiceUser(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		nodes := everyNode(t, tg)
		t.Cleanup(func() {
			for _, n := range nodes {
				_ = n.Do(context.Background(), n.B().AclDeluser().Username(svcUser).Build()).Error()
			}
		})
		setUser := func(rules []aclRule) {
			t.Helper()
			args := []string{"reset", "on", ">" + svcPassword, "resetkeys", "~rl:*", "resetchannels", "-@all"}
			for _, r := range rules {
				args = append(args, r.rule)
			}
			for _, n := range nodes {
				if err := do(t, n, n.B().AclSetuser().Username(svcUser).Rule(args...).Build()).Error(); err != nil {
					t.Fatalf("ACL SETUSER %s %v: %v", svcUser, args, err)
				}
			}
		}
		setUser(svcRules)
		if err := serviceCalls(t, tg); err != nil {
			t.Fatalf("as %s with %d rules: %v", svcUser, len(svcRules), err)
		}
		refused(t, tg)

		for i, r := range svcRules {
			if r.needed != nil && !r.needed(tg) {
				continue
			}
			setUser(slices.Delete(slices.Clone(svcRules), i, i+1))
			err := serviceCalls(t, tg)
			if err == nil {
				t.Errorf("without %s every call still works: the rule is not needed", r.rule)
				continue
			}
			t.Logf("without %s: %v", r.rule, err)
		}
	})
}

// everyNode returns an admin connection to every node of tg, replicas included: ACL users
// are each node's own.
func everyNode(t *testing.T, tg *target) []valkey.Client {
	t.Helper()
	if tg.name != "cluster" {
		return []valkey.Client{tg.primary, tg.replicaFor(t, "").c}
	}
	text, err := do(t, tg.primary, tg.primary.B().ClusterNodes().Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	var nodes []valkey.Client
	for line := range strings.Lines(text) {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			t.Fatalf("connect %s: %v", addr, err)
		}
		t.Cleanup(c.Close)
		nodes = append(nodes, c)
	}
	if len(nodes) != 6 {
		t.Fatalf("CLUSTER NODES lists %d nodes, want 6:\n%s", len(nodes), text)
	}
	return nodes
}

// svcClient connects as the service user, with valkey-go's defaults (client-side caching on)
// and reads sent to replicas, as README's example does; for a cluster, it waits until the
// client routes reads to rep. It returns an error when the user cannot connect.
func svcClient(t *testing.T, tg *target, rep *replica) (valkey.Client, error) {
	t.Helper()
	opt := valkey.ClientOption{
		Username:       svcUser,
		Password:       svcPassword,
		SendToReplicas: func(cmd valkey.Completed) bool { return cmd.IsReadOnly() },
	}
	for addr := range tg.c.Nodes() {
		opt.InitAddress = append(opt.InitAddress, addr)
	}
	if tg.name != "cluster" {
		opt.Standalone.ReplicaAddress = []string{rep.addr}
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := valkey.NewClient(opt)
		if err != nil {
			return nil, fmt.Errorf("connect: %w", err)
		}
		if _, ok := c.Nodes()[rep.addr]; ok || tg.name != "cluster" {
			t.Cleanup(c.Close)
			return c, nil
		}
		c.Close()
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the cluster never listed the replica %s as online", rep.addr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// serviceCalls makes every call the client has, as the service user, and returns the first
// that fails or decides wrongly (without +zscore, rl_concurrency admits a holder beyond the
// limit: it reads the refused ZSCORE as a lease the holder has).
func serviceCalls(t *testing.T, tg *target) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := keyFor(t)
	// the principal's state exists, so that its replica is known
	probe := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour}
	probing := harness.NewLimiter(t, tg.c, slowMachine)
	if _, err := probing.Allow(ctx, key, probe); err != nil {
		t.Fatal(err)
	}
	stateKey := probing.Key(key, probe)
	rep := tg.replicaFor(t, stateKey)
	waitReplicated(t, rep, stateKey)

	vk, err := svcClient(t, tg, rep)
	if err != nil {
		return err
	}
	// ReturnError: a call the server refuses must fail here, not be decided locally
	lim := harness.NewLimiter(t, vk, client.Options{Deadline: slowDeadline, Fallback: client.ReturnError})
	if err := lim.CheckVersion(ctx, "1.1.0"); err != nil {
		return fmt.Errorf("CheckVersion: %w", err)
	}
	for _, l := range clientLimits {
		for i := range 4 {
			if _, err := lim.Allow(ctx, key, l.limit); err != nil {
				return fmt.Errorf("%s: Allow %d: %w", l.name, i+1, err)
			}
		}
		if _, err := lim.Peek(ctx, key, l.limit); err != nil {
			return fmt.Errorf("%s: Peek: %w", l.name, err)
		}
		if _, err := lim.Refund(ctx, key, l.limit, 1); err != nil {
			return fmt.Errorf("%s: Refund: %w", l.name, err)
		}
		// back to the initial state: the key is deleted
		if _, err := lim.Refund(ctx, key, l.limit, 100); err != nil {
			return fmt.Errorf("%s: Refund of everything: %w", l.name, err)
		}
	}
	// a log whose entries age out
	short := client.SlidingLog{Limit: 2, Window: 50 * time.Millisecond}
	for i := range 3 {
		if i == 2 {
			time.Sleep(60 * time.Millisecond)
		}
		if _, err := lim.Allow(ctx, key, short); err != nil {
			return fmt.Errorf("short sliding log: Allow %d: %w", i+1, err)
		}
	}

	c := client.Concurrency{Limit: 2, Lease: time.Minute}
	var leases []*client.Lease
	for i := range 3 {
		le, r, err := lim.Acquire(ctx, key, c)
		if err != nil {
			return fmt.Errorf("Acquire %d: %w", i+1, err)
		}
		if (le != nil) != (i < 2) || r.Allowed != (i < 2) {
			return fmt.Errorf("Acquire %d of a limit of 2: %+v, admitted %v", i+1, r, le != nil)
		}
		if le != nil {
			leases = append(leases, le)
		}
	}
	if _, err := lim.PeekN(ctx, key, client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour}, 2); err != nil {
		return fmt.Errorf("PeekN: %w", err)
	}
	for _, le := range leases {
		if _, err := le.Renew(ctx); err != nil {
			return fmt.Errorf("Renew: %w", err)
		}
		if r, err := le.Release(ctx); err != nil || !r.Allowed {
			return fmt.Errorf("Release: %+v, %w", r, err)
		}
	}

	one := []client.Rule{
		{Key: key, Limit: client.TokenBucket{Capacity: 5, Rate: 1, Period: time.Hour, Name: "multi"}},
		{Key: key, Limit: client.SlidingLog{Limit: 5, Window: time.Hour, Name: "multi"}},
	}
	if _, err := lim.AllowAll(ctx, one); err != nil {
		return fmt.Errorf("AllowAll, one principal: %w", err)
	}
	if _, err := lim.PeekAll(ctx, one); err != nil {
		return fmt.Errorf("PeekAll: %w", err)
	}
	// a denial by one principal refunds the other's unit
	several := []client.Rule{
		{Key: key + ":a", Limit: client.TokenBucket{Capacity: 5, Rate: 1, Period: time.Hour}},
		{Key: key + ":b", Limit: client.FixedWindow{Limit: 1, Window: time.Hour}},
	}
	for i := range 2 {
		r, err := lim.AllowAll(ctx, several)
		if err != nil {
			return fmt.Errorf("AllowAll %d, two principals: %w", i+1, err)
		}
		if r.Allowed != (i == 0) {
			return fmt.Errorf("AllowAll %d, two principals: %+v", i+1, r)
		}
	}

	// peeks served by the replica: its own count of FCALL_RO says so
	before := commandCalls(t, rep.c, "fcall_ro")
	for range 3 {
		if _, err := lim.Peek(ctx, key, probe); err != nil {
			return fmt.Errorf("Peek on the replica: %w", err)
		}
	}
	if ran := commandCalls(t, rep.c, "fcall_ro").Calls - before.Calls; ran < 3 {
		return fmt.Errorf("the replica %s ran %d FCALL_RO for 3 peeks (redirected to the primary?)", rep.addr, ran)
	}
	return nil
}

// refused checks what the service user may not do, and that the library is intact after.
func refused(t *testing.T, tg *target) {
	t.Helper()
	ctx := ctx5s(t)
	vk, err := valkey.NewClient(valkey.ClientOption{
		InitAddress:  slices.Collect(maps.Keys(tg.c.Nodes())),
		Username:     svcUser,
		Password:     svcPassword,
		DisableCache: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer vk.Close()
	for name, cmd := range map[string]valkey.Completed{
		"EVAL":              vk.B().Eval().Script("return redis.call('TIME')").Numkeys(0).Build(),
		"EVAL on rl:*":      vk.B().Eval().Script("return redis.call('GET', KEYS[1])").Numkeys(1).Key("rl:{x}:token_bucket").Build(),
		"FUNCTION LOAD":     vk.B().FunctionLoad().Replace().FunctionCode(functions.Source).Build(),
		"FUNCTION DELETE":   vk.B().FunctionDelete().LibraryName("ratelimit").Build(),
		"FUNCTION FLUSH":    vk.B().FunctionFlush().Build(),
		"FCALL off rl:*":    vk.B().Fcall().Function("rl_token_bucket").Numkeys(1).Key("other:{x}").Arg("10", "1", "1000", "1").Build(),
		"FCALL_RO off rl:*": vk.B().FcallRo().Function("rl_token_bucket_peek").Numkeys(1).Key("other:{x}").Arg("10", "1", "1000", "1").Build(),
		"GET off rl:*":      vk.B().Get().Key("other:{x}").Build(),
		"SET off rl:*":      vk.B().Set().Key("other:{x}").Value("1").Build(),
		"KEYS":              vk.B().Keys().Pattern("*").Build(),
		"SCAN":              vk.B().Scan().Cursor(0).Build(),
		"FLUSHALL":          vk.B().Flushall().Build(),
		"CONFIG SET":        vk.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", "1").Build(),
		"ACL SETUSER":       vk.B().AclSetuser().Username(svcUser).Rule("+@all").Build(),
		"PUBLISH":           vk.B().Publish().Channel("c").Message("m").Build(),
	} {
		err := vk.Do(ctx, cmd).Error()
		if verr, ok := valkey.IsValkeyErr(err); !ok || !strings.HasPrefix(verr.Error(), "NOPERM") {
			t.Errorf("%s as %s: %v; want NOPERM", name, svcUser, err)
		}
	}
	// The client names the refusal: a Limiter whose prefix is outside rl:* gets it back (with
	// ReturnError: the default policy decides a refused call locally).
	_, err = harness.NewLimiter(t, vk, client.Options{Deadline: slowDeadline, Fallback: client.ReturnError, Prefix: "other:"}).Allow(ctx, "x", client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Second})
	if err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("Allow with the prefix other: as %s: %v; want NOPERM", svcUser, err)
	}
	if v, err := do(t, tg.primary, tg.primary.B().FcallRo().Function("rl_version").Numkeys(0).Build()).ToString(); err != nil || v != workingVersion(t) {
		t.Errorf("the library after the refusals: rl_version %q, %v", v, err)
	}
}

// The client over TLS, trusting the server's CA: 1.0 and 1.1 calls are decided by the server.
// Without the CA, the client does not connect.
func TestSecurityClientTLS(t *testing.T) {
	ca, err := harness.NewTLS()
	if err != nil {
		t.Fatal(err)
	}
	s := harness.StartValkeyTLS(t, ca)
	ctx := ctx5s(t)
	if err := load(ctx, s.Client(t)); err != nil {
		t.Fatal(err)
	}
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{s.Addr}, TLSConfig: ca.ClientConfig()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vk.Close)
	lim := harness.NewLimiter(t, vk, slowMachine)
	if err := lim.CheckVersion(ctx, "1.1.0"); err != nil {
		t.Fatal(err)
	}
	key := "tls:" + keyFor(t)
	limit := client.TokenBucket{Capacity: 3, Rate: 1, Period: time.Hour}
	for i := range 4 {
		r, err := lim.Allow(ctx, key, limit)
		if err != nil || r.Source == client.FromFallback || r.Allowed != (i < 3) {
			t.Fatalf("Allow %d: %+v, %v", i+1, r, err)
		}
	}
	if r, err := lim.Peek(ctx, key, limit); err != nil || r.Source == client.FromFallback || r.Allowed || r.Remaining != 0 {
		t.Fatalf("Peek: %+v, %v", r, err)
	}
	if r, err := lim.Refund(ctx, key, limit, 2); err != nil || r.Source == client.FromFallback || r.Remaining != 2 {
		t.Fatalf("Refund: %+v, %v", r, err)
	}
	le, r, err := lim.Acquire(ctx, key, client.Concurrency{Limit: 1, Lease: time.Minute})
	if err != nil || le == nil || r.Source == client.FromFallback {
		t.Fatalf("Acquire: %+v, %v", r, err)
	}
	if r, err := le.Release(ctx); err != nil || !r.Allowed {
		t.Fatalf("Release: %+v, %v", r, err)
	}

	// the server speaks TLS only, and the client checks its certificate
	if _, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{s.Addr}, DisableCache: true}); err == nil {
		t.Error("a plain-text client connected to the TLS-only server")
	}
	other, err := harness.NewTLS()
	if err != nil {
		t.Fatal(err)
	}
	_, err = valkey.NewClient(valkey.ClientOption{InitAddress: []string{s.Addr}, TLSConfig: other.ClientConfig(), DisableCache: true})
	var unknown x509.UnknownAuthorityError
	if err == nil || !errors.As(err, &unknown) {
		t.Errorf("a client trusting another CA: %v; want an unknown authority", err)
	}
}
