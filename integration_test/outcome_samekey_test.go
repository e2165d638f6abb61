package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/grpclimit"
	"github.com/rlfn/rlfn/client/httplimit"
	"github.com/rlfn/rlfn/internal/harness"
)

// counted is a valkey.Client that counts the library's functions it calls, by name, before
// sending them (valkey-go recycles a command once it is sent): a decision of several limits of
// one key is rl_multi, of one limit rl_<algorithm>, a refund rl_<algorithm>_refund, and the state of each
// limit read for the RateLimit values rl_<algorithm>_peek.
type counted struct {
	valkey.Client
	mu  sync.Mutex
	fns map[string]int64
}

func newCounted(c valkey.Client) *counted { return &counted{Client: c, fns: map[string]int64{}} }

func (c *counted) note(cmds ...valkey.Completed) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cmd := range cmds {
		if a := cmd.Commands(); len(a) > 1 && (strings.EqualFold(a[0], "FCALL") || strings.EqualFold(a[0], "FCALL_RO")) {
			c.fns[a[1]]++
		}
	}
}

func (c *counted) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	c.note(cmd)
	return c.Client.Do(ctx, cmd)
}

func (c *counted) DoMulti(ctx context.Context, cmds ...valkey.Completed) []valkey.ValkeyResult {
	c.note(cmds...)
	return c.Client.DoMulti(ctx, cmds...)
}

// calls is what f made the client call: its writes (decisions and refunds, by name) and its
// peeks, and how many FCALL every node of tg ran meanwhile (INFO commandstats), which must be
// all the client sent: the server ran what the client counted, no more.
func (c *counted) calls(t *testing.T, tg *target, f func()) (writes map[string]int64, peeks int64) {
	t.Helper()
	server := func() (n int64) {
		for _, node := range tg.c.Nodes() {
			n += commandCalls(t, node, "fcall").Calls + commandCalls(t, node, "fcall_ro").Calls
		}
		return n
	}
	c.mu.Lock()
	clear(c.fns)
	c.mu.Unlock()
	before := server()
	f()
	ran := server() - before
	c.mu.Lock()
	defer c.mu.Unlock()
	writes = map[string]int64{}
	var sent int64
	for fn, n := range c.fns {
		sent += n
		if strings.HasSuffix(fn, "_peek") {
			peeks += n
		} else {
			writes[fn] += n
		}
	}
	if ran != sent {
		t.Fatalf("the nodes ran %d FCALL and FCALL_RO, the client sent %d (%v)", ran, sent, c.fns)
	}
	return writes, peeks
}

// serverKeyExists reports whether the server holds key.
func serverKeyExists(t *testing.T, tg *target, key string) bool {
	t.Helper()
	n, err := do(t, tg.c, tg.c.B().Exists().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// The requests and tokens of one principal (an AlsoLimit with SameKey) over real HTTP, on every
// server: one FCALL decides both, their state is on the Policy's key, and a refusal by either
// limit takes nothing from the other, with no refund; the same limits on keys of their own
// (as before SameKey) take one FCALL per key.
func TestOutcomeHTTPSameKeyOneCall(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		vk := newCounted(tg.c)
		lim := harness.NewLimiter(t, vk, slowMachine)
		requests := client.SlidingWindow{Limit: 3, Window: time.Minute}
		tokens := client.TokenBucket{Capacity: 10_000, Rate: 1, Period: time.Hour}
		policy := func(sameKey bool) func(*http.Request) httplimit.Policy {
			estimate := func(r *http.Request) int64 {
				n, _ := strconv.ParseInt(r.Header.Get("X-Estimate"), 10, 64)
				return n
			}
			return func(*http.Request) httplimit.Policy {
				return httplimit.Policy{Name: "requests", Limit: requests, Also: []httplimit.AlsoLimit{
					{Name: "tokens", Limit: tokens, Cost: estimate, Unit: "tokens", SameKey: sameKey}}}
			}
		}
		srv := limitedServer(t, lim, httplimit.Options{Policy: policy(true)}, nil)
		own := limitedServer(t, lim, httplimit.Options{Policy: policy(false)}, nil)
		call := func(url, key string, estimate int64) (status int, writes string, peeks int64) {
			t.Helper()
			w, p := vk.calls(t, tg, func() {
				status = send(t, http.MethodGet, url, "", "X-Key: "+key, "X-Estimate: "+strconv.FormatInt(estimate, 10)).status
			})
			return status, fmt.Sprint(w), p
		}
		one := "map[rl_multi:1]"

		key := keyFor(t)
		// library 1.3.0: the rl_multi replies every limit's state, no peek
		if st, w, p := call(srv.URL, key, 4000); st != http.StatusOK || w != one || p != 0 {
			t.Fatalf("request 1: %d by %s and %d peeks, want 200 by %s alone", st, w, p, one)
		}
		onKey := httplimit.LimiterKey("requests", key)
		for _, l := range []client.Limit{requests, tokens} {
			if k := lim.Key(onKey, l); !serverKeyExists(t, tg, k) {
				t.Errorf("no state at %s", k)
			}
		}
		if k := lim.Key(httplimit.LimiterKey("tokens", key), tokens); serverKeyExists(t, tg, k) {
			t.Errorf("state at the key of its own, %s", k)
		}
		// refused by the tokens: nothing taken from the requests, and nothing to refund
		if st, w, _ := call(srv.URL, key, 7000); st != http.StatusTooManyRequests || w != one {
			t.Fatalf("request 2: %d by %s, want 429 by %s", st, w, one)
		}
		if got := remaining(t, lim, "requests", key, requests); got != 2 {
			t.Errorf("after a refusal by the tokens, %d requests left, want 2", got)
		}
		// refused by the requests: nothing taken from the tokens
		for i := range 2 {
			if st, _, _ := call(srv.URL, key, 100); st != http.StatusOK {
				t.Fatalf("request %d: %d", i+3, st)
			}
		}
		if st, w, _ := call(srv.URL, key, 100); st != http.StatusTooManyRequests || w != one {
			t.Fatalf("request 5: %d by %s, want 429 by %s", st, w, one)
		}
		if got := remaining(t, lim, "requests", key, tokens); got != 5800 {
			t.Errorf("%d tokens left, want 5800: 10000 less 4000 and 2 x 100", got)
		}

		// Keys of their own: a decision per key, and a refund when the second refuses.
		key = keyFor(t)
		if st, w, _ := call(own.URL, key, 4000); st != http.StatusOK || w != "map[rl_sliding_window:1 rl_token_bucket:1]" {
			t.Errorf("keys of their own: %d by %s, want 200 by a call per key", st, w)
		}
		if st, w, _ := call(own.URL, key, 7000); st != http.StatusTooManyRequests || !strings.Contains(w, "_refund:1") {
			t.Errorf("keys of their own, refused by the tokens: %d by %s, want 429 and a refund", st, w)
		}
	})
}

// The same over real gRPC, on every server.
func TestOutcomeGRPCSameKeyOneCall(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		vk := newCounted(tg.c)
		lim := harness.NewLimiter(t, vk, slowMachine)
		requests := client.SlidingWindow{Limit: 3, Window: time.Minute}
		tokens := client.TokenBucket{Capacity: 10_000, Rate: 1, Period: time.Hour}
		estimate := func(_ context.Context, _ string, req any) int64 {
			return int64(req.(*testgrpc.SimpleRequest).GetResponseSize())
		}
		c := grpcPair(t, lim, grpclimit.ServerOptions{Default: grpclimit.Policy{Name: "requests", Limit: requests,
			Also: []grpclimit.AlsoLimit{{Name: "tokens", Limit: tokens, Cost: estimate, Unit: "tokens", SameKey: true}}}}, nil, nil)
		call := func(key string, estimate int32) (code codes.Code, writes string) {
			t.Helper()
			w, _ := vk.calls(t, tg, func() {
				_, err := c.UnaryCall(withKey(ctx5s(t), key), &testgrpc.SimpleRequest{ResponseSize: estimate})
				code = status.Code(err)
			})
			return code, fmt.Sprint(w)
		}
		one := "map[rl_multi:1]"

		key := keyFor(t)
		if code, w := call(key, 4000); code != codes.OK || w != one {
			t.Fatalf("call 1: %v by %s, want OK by %s", code, w, one)
		}
		if k := lim.Key(grpclimit.LimiterKey("requests", key), tokens); !serverKeyExists(t, tg, k) {
			t.Errorf("no state at %s", k)
		}
		if code, w := call(key, 7000); code != codes.ResourceExhausted || w != one {
			t.Fatalf("call 2: %v by %s, want ResourceExhausted by %s", code, w, one)
		}
		if got := remaining(t, lim, "requests", key, requests); got != 2 {
			t.Errorf("after a refusal by the tokens, %d calls left, want 2", got)
		}
		for range 2 {
			call(key, 100)
		}
		if code, w := call(key, 100); code != codes.ResourceExhausted || w != one {
			t.Fatalf("call 5: %v by %s, want ResourceExhausted by %s", code, w, one)
		}
		if got := remaining(t, lim, "requests", key, tokens); got != 5800 {
			t.Errorf("%d tokens left, want 5800", got)
		}
	})
}

// What docs/http.md gives as the CLI's equivalent reaches the middleware's state: rlfn call
// with --policy and an --also without policy= decides both limits on the Policy's key, after a
// request the middleware counted, all or nothing.
func TestOutcomeSameKeyCLI(t *testing.T) {
	tg := servers(t)[0]
	bin := filepath.Join(t.TempDir(), "rlfn")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/rlfn/rlfn/cmd/rlfn").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var addr string
	for a := range tg.c.Nodes() {
		addr = a
	}
	lim := harness.NewLimiter(t, tg.c, slowMachine)
	requests := client.SlidingWindow{Limit: 3, Window: time.Minute}
	tokens := client.TokenBucket{Capacity: 10_000, Rate: 1, Period: time.Hour}
	srv := limitedServer(t, lim, httplimit.Options{Policy: func(*http.Request) httplimit.Policy {
		return httplimit.Policy{Name: "requests", Limit: requests, Also: []httplimit.AlsoLimit{{Name: "tokens", Limit: tokens,
			Cost: func(*http.Request) int64 { return 4000 }, Unit: "tokens", SameKey: true}}}
	}}, nil)
	key := keyFor(t)
	if r := get(t, srv.URL, key); r.status != http.StatusOK {
		t.Fatalf("the request: %d", r.status)
	}
	rlfnCall := func(cost string) []byte {
		t.Helper()
		out, err := exec.Command(bin, "--url", "redis://"+addr, "call", "sliding_window", key, "--policy", "requests",
			"--limit", "3", "--window", "1m", "--also", "token_bucket,capacity=10000,rate=1,period=1h,cost="+cost, "--json").Output()
		if err != nil {
			t.Fatalf("rlfn call: %v\n%s", err, out)
		}
		return out
	}
	out := rlfnCall("1000")
	var got struct {
		Allowed bool `json:"allowed"`
		Limits  []struct {
			Key       string `json:"key"`
			Remaining int64  `json:"remaining"`
		} `json:"limits"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(string(out))), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	onKey := httplimit.LimiterKey("requests", key)
	want := []struct {
		key  string
		left int64
	}{{lim.Key(onKey, requests), 1}, {lim.Key(onKey, tokens), 5000}}
	if !got.Allowed || len(got.Limits) != 2 {
		t.Fatalf("rlfn call: %s", out)
	}
	for i, w := range want {
		if got.Limits[i].Key != w.key || got.Limits[i].Remaining != w.left {
			t.Errorf("limit %d: %s with %d left, want %s with %d", i+1, got.Limits[i].Key, got.Limits[i].Remaining, w.key, w.left)
		}
	}
	// all or nothing on that state: refused by the tokens, nothing taken from the requests
	if out := rlfnCall("6000"); !strings.Contains(string(out), `"allowed":false`) {
		t.Errorf("rlfn call of 6000 tokens of 5000: %s", out)
	}
	if got := remaining(t, lim, "requests", key, requests); got != 1 {
		t.Errorf("after the CLI's refusal, %d requests left, want 1", got)
	}
}
