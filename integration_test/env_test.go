package integration_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/versions"
)

// target is one deployment the library is tested on: a client that routes to primaries, and
// a way to reach a replica holding a given key.
type target struct {
	name       string
	c          valkey.Client
	primary    valkey.Client // one primary, for calls with no key to route by
	replicaFor func(t testing.TB, key string) *replica
}

// replica is a connection to one replica.
type replica struct {
	addr    string
	c       valkey.Client
	cluster bool // a cluster replica serves reads only after READONLY
}

func (r *replica) do(cmd valkey.Completed) valkey.ValkeyResult {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !r.cluster {
		return r.c.Do(ctx, cmd)
	}
	// DoMulti pipelines both commands on one connection.
	res := r.c.DoMulti(ctx, r.c.B().Readonly().Build(), cmd)
	if err := res[0].Error(); err != nil {
		return res[0]
	}
	return res[1]
}

func (r *replica) peek(fn, key string, args ...string) (reply, error) {
	return decode(r.do(fcallCmd(r.c, true, fn, key, args...)))
}

func (r *replica) call(fn, key string, args ...string) (reply, error) {
	return decode(r.do(fcallCmd(r.c, false, fn, key, args...)))
}

// env holds the servers every test shares: started on first use, stopped by TestMain.
var env struct {
	once    sync.Once
	err     error
	targets []*target
	closers []func()
}

func TestMain(m *testing.M) {
	code := m.Run()
	for i := len(env.closers) - 1; i >= 0; i-- {
		env.closers[i]()
	}
	os.Exit(code)
}

// servers returns the shared targets. A server that cannot start fails the test in CI and
// skips it elsewhere, saying why: never a silent skip.
func servers(t testing.TB) []*target {
	t.Helper()
	env.once.Do(func() { env.err = startEnv() })
	if env.err != nil {
		harness.Unavailable(t, "test servers", env.err)
	}
	return env.targets
}

func forEachTarget(t *testing.T, fn func(t *testing.T, tg *target)) {
	for _, tg := range servers(t) {
		t.Run(tg.name, func(t *testing.T) { fn(t, tg) })
	}
}

// fuzz holds the fuzzer's own Valkey: each fuzzing worker is a process of its own, and needs
// one server, not the whole environment.
var fuzz struct {
	once sync.Once
	err  error
	tg   *target
}

func fuzzTarget(t testing.TB) *target {
	t.Helper()
	if f := flag.Lookup("test.fuzz"); f == nil || f.Value.String() == "" {
		// Only the seed corpus runs (go test): the shared environment is up anyway.
		return servers(t)[0]
	}
	fuzz.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := harness.NewValkey(ctx)
		if err != nil {
			fuzz.err = err
			return
		}
		closeLater(func() { _ = s.Terminate(context.Background()) })
		c, err := nodeClient(s.Addr)
		if err == nil {
			err = load(ctx, c)
		}
		fuzz.tg, fuzz.err = &target{name: "valkey8", c: c, primary: c}, err
	})
	if fuzz.err != nil {
		harness.Unavailable(t, "fuzz server", fuzz.err)
	}
	return fuzz.tg
}

func startEnv() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, s := range []struct {
		name  string
		start func(context.Context, ...string) (*harness.Server, error)
	}{
		{"valkey8", harness.NewValkey},
		{"redis7.0", harness.NewRedis},
	} {
		tg, err := standaloneTarget(ctx, s.name, s.start)
		if err != nil {
			return err
		}
		env.targets = append(env.targets, tg)
	}
	tg, err := clusterTarget(ctx)
	if err != nil {
		return err
	}
	env.targets = append(env.targets, tg)
	return nil
}

func closeLater(f func()) { env.closers = append(env.closers, f) }

func standaloneTarget(ctx context.Context, name string, start func(context.Context, ...string) (*harness.Server, error)) (*target, error) {
	primary, err := start(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	closeLater(func() { _ = primary.Terminate(context.Background()) })
	rs, err := start(ctx, "--replicaof", "127.0.0.1", fmt.Sprint(primary.Port))
	if err != nil {
		return nil, fmt.Errorf("%s replica: %w", name, err)
	}
	closeLater(func() { _ = rs.Terminate(context.Background()) })
	c, err := nodeClient(primary.Addr)
	if err != nil {
		return nil, err
	}
	rc, err := nodeClient(rs.Addr)
	if err != nil {
		return nil, err
	}
	if err := load(ctx, c); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	rep := &replica{addr: rs.Addr, c: rc}
	if err := waitVersion(ctx, rep); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &target{
		name:       name,
		c:          c,
		primary:    c,
		replicaFor: func(testing.TB, string) *replica { return rep },
	}, nil
}

func clusterTarget(ctx context.Context) (*target, error) {
	cl, err := harness.NewCluster(ctx, 3, 1)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	closeLater(func() { _ = cl.Terminate(context.Background()) })
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: cl.Addrs(), DisableCache: true})
	if err != nil {
		return nil, err
	}
	closeLater(c.Close)
	primaries := map[*harness.Server]valkey.Client{}
	replicas := map[*harness.Server]*replica{}
	for _, p := range cl.Primaries {
		pc, err := nodeClient(p.Addr)
		if err != nil {
			return nil, err
		}
		if err := load(ctx, pc); err != nil {
			return nil, fmt.Errorf("cluster primary %s: %w", p.Addr, err)
		}
		primaries[p] = pc
		for _, r := range cl.ReplicasOf(p) {
			rc, err := nodeClient(r.Addr)
			if err != nil {
				return nil, err
			}
			rep := &replica{addr: r.Addr, c: rc, cluster: true}
			if err := waitVersion(ctx, rep); err != nil {
				return nil, fmt.Errorf("cluster: %w", err)
			}
			replicas[p] = rep
		}
	}
	// A key lives on the primary whose slots hold it: ask each which one has it.
	replicaFor := func(t testing.TB, key string) *replica {
		t.Helper()
		for p, pc := range primaries {
			n, err := do(t, pc, pc.B().Exists().Key(key).Build()).AsInt64()
			if err == nil && n == 1 {
				return replicas[p]
			}
		}
		t.Fatalf("no primary holds %s", key)
		return nil
	}
	return &target{name: "cluster", c: c, primary: primaries[cl.Primaries[0]], replicaFor: replicaFor}, nil
}

func nodeClient(addr string) (valkey.Client, error) {
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", addr, err)
	}
	closeLater(c.Close)
	return c, nil
}

func load(ctx context.Context, c valkey.Client) error {
	return c.Do(ctx, c.B().FunctionLoad().Replace().FunctionCode(functions.Source).Build()).Error()
}

// waitVersion waits until a replica has received the library from its primary.
func waitVersion(ctx context.Context, r *replica) error {
	want, err := versions.Declared(functions.Source)
	if err != nil {
		return err
	}
	var last error
	for ctx.Err() == nil {
		v, err := r.do(r.c.B().FcallRo().Function("rl_version").Numkeys(0).Build()).ToString()
		if err == nil && v == want {
			return nil
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("replica %s never answered rl_version %s: %v", r.addr, want, last)
}

// waitReplicated waits until the replica holds the primary's write to key.
func waitReplicated(t testing.TB, r *replica, key string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		n, err := r.do(r.c.B().Exists().Key(key).Build()).AsInt64()
		if err == nil && n == 1 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("replica %s never received %s", r.addr, key)
}

// waitSame waits until replica r holds key's value as the primary (through c) holds it.
func waitSame(t testing.TB, r *replica, c valkey.Client, key string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		want, err1 := c.Do(t.Context(), c.B().Get().Key(key).Build()).ToString()
		got, err2 := r.do(r.c.B().Get().Key(key).Build()).ToString()
		if err1 == nil && err2 == nil && got == want {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("replica %s never caught up with %s", r.addr, key)
}

var keySeq struct {
	sync.Mutex
	n int
}

// keyFor returns a key no other test or run uses.
func keyFor(t testing.TB) string {
	keySeq.Lock()
	keySeq.n++
	n := keySeq.n
	keySeq.Unlock()
	return fmt.Sprintf("rltest:%s:%d:%d", strings.ReplaceAll(t.Name(), " ", "_"), time.Now().UnixNano(), n)
}

func workingVersion(t testing.TB) string {
	t.Helper()
	v, err := versions.Declared(functions.Source)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// functionFlags returns each registered rl_ function's flags, read from FUNCTION LIST.
func functionFlags(t testing.TB, c valkey.Client) map[string][]string {
	t.Helper()
	libs, err := do(t, c, c.B().FunctionList().Libraryname("ratelimit").Build()).ToArray()
	if err != nil || len(libs) != 1 {
		t.Fatalf("FUNCTION LIST: %d libraries, %v", len(libs), err)
	}
	lib, err := libs[0].AsMap()
	if err != nil {
		t.Fatal(err)
	}
	list := lib["functions"]
	fns, err := list.ToArray()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, f := range fns {
		m, err := f.AsMap()
		if err != nil {
			t.Fatal(err)
		}
		nameMsg, flagsMsg := m["name"], m["flags"]
		name, err := nameMsg.ToString()
		if err != nil {
			t.Fatal(err)
		}
		flags, err := flagsMsg.AsStrSlice()
		if err != nil && !errors.Is(err, valkey.Nil) {
			t.Fatal(err)
		}
		out[name] = flags
	}
	return out
}

// standalones are the standalone servers of the tests that need one of each kind (the others
// run on every target of forEachTarget).
var standalones = []struct {
	name  string
	start func(testing.TB, ...string) *harness.Server
}{{"valkey8", harness.StartValkey}, {"redis7.0", harness.StartRedis}}
