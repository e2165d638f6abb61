package integration_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/grpclimit"
	"github.com/rlfn/rlfn/client/httplimit"
	"github.com/rlfn/rlfn/internal/harness"
)

// decisions is how many FCALL (decisions, refunds) and FCALL_RO (peeks) the nodes of tg have run,
// all of them: a decision on keys of several slots runs on several primaries of a cluster.
func decisions(t *testing.T, tg *target) (write, read int64) {
	t.Helper()
	for _, c := range tg.c.Nodes() {
		write += commandCalls(t, c, "fcall").Calls
		read += commandCalls(t, c, "fcall_ro").Calls
	}
	return write, read
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
		lim := harness.NewLimiter(t, tg.c, slowMachine)
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
		call := func(url, key string, estimate int64) (status int, writes int64) {
			t.Helper()
			w0, _ := decisions(t, tg)
			r := send(t, http.MethodGet, url, "", "X-Key: "+key, "X-Estimate: "+strconv.FormatInt(estimate, 10))
			w1, _ := decisions(t, tg)
			return r.status, w1 - w0
		}
		call(srv.URL, keyFor(t), 1) // the client's first call asks what the nodes run

		key := keyFor(t)
		if st, w := call(srv.URL, key, 4000); st != http.StatusOK || w != 1 {
			t.Fatalf("request 1: %d in %d FCALL, want 200 in one", st, w)
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
		if st, w := call(srv.URL, key, 7000); st != http.StatusTooManyRequests || w != 1 {
			t.Fatalf("request 2: %d in %d FCALL, want 429 in one", st, w)
		}
		if got := remaining(t, lim, "requests", key, requests); got != 2 {
			t.Errorf("after a refusal by the tokens, %d requests left, want 2", got)
		}
		// refused by the requests: nothing taken from the tokens
		for i := range 2 {
			if st, _ := call(srv.URL, key, 100); st != http.StatusOK {
				t.Fatalf("request %d: %d", i+3, st)
			}
		}
		if st, w := call(srv.URL, key, 100); st != http.StatusTooManyRequests || w != 1 {
			t.Fatalf("request 5: %d in %d FCALL, want 429 in one", st, w)
		}
		if got := remaining(t, lim, "requests", key, tokens); got != 5800 {
			t.Errorf("%d tokens left, want 5800: 10000 less 4000 and 2 x 100", got)
		}

		// Keys of their own: one FCALL per key.
		if st, w := call(own.URL, keyFor(t), 4000); st != http.StatusOK || w != 2 {
			t.Errorf("keys of their own: %d in %d FCALL, want 200 in two", st, w)
		}
	})
}

// The same over real gRPC, on every server.
func TestOutcomeGRPCSameKeyOneCall(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		lim := harness.NewLimiter(t, tg.c, slowMachine)
		requests := client.SlidingWindow{Limit: 3, Window: time.Minute}
		tokens := client.TokenBucket{Capacity: 10_000, Rate: 1, Period: time.Hour}
		estimate := func(_ context.Context, _ string, req any) int64 {
			return int64(req.(*testgrpc.SimpleRequest).GetResponseSize())
		}
		c := grpcPair(t, lim, grpclimit.ServerOptions{Default: grpclimit.Policy{Name: "requests", Limit: requests,
			Also: []grpclimit.AlsoLimit{{Name: "tokens", Limit: tokens, Cost: estimate, Unit: "tokens", SameKey: true}}}}, nil, nil)
		call := func(key string, estimate int32) (codes.Code, int64) {
			t.Helper()
			w0, _ := decisions(t, tg)
			_, err := c.UnaryCall(withKey(ctx5s(t), key), &testgrpc.SimpleRequest{ResponseSize: estimate})
			w1, _ := decisions(t, tg)
			return status.Code(err), w1 - w0
		}
		call(keyFor(t), 1)

		key := keyFor(t)
		if code, w := call(key, 4000); code != codes.OK || w != 1 {
			t.Fatalf("call 1: %v in %d FCALL, want OK in one", code, w)
		}
		if k := lim.Key(grpclimit.LimiterKey("requests", key), tokens); !serverKeyExists(t, tg, k) {
			t.Errorf("no state at %s", k)
		}
		if code, w := call(key, 7000); code != codes.ResourceExhausted || w != 1 {
			t.Fatalf("call 2: %v in %d FCALL, want ResourceExhausted in one", code, w)
		}
		if got := remaining(t, lim, "requests", key, requests); got != 2 {
			t.Errorf("after a refusal by the tokens, %d calls left, want 2", got)
		}
		for range 2 {
			call(key, 100)
		}
		if code, w := call(key, 100); code != codes.ResourceExhausted || w != 1 {
			t.Fatalf("call 5: %v in %d FCALL, want ResourceExhausted in one", code, w)
		}
		if got := remaining(t, lim, "requests", key, tokens); got != 5800 {
			t.Errorf("%d tokens left, want 5800", got)
		}
	})
}

// What docs/http.md gives as the CLI's equivalent reaches the middleware's state: rlfn call
// with --policy and an --also without policy= decides both limits on the Policy's key, in one
// call, after a request the middleware counted.
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
	w0, _ := decisions(t, tg)
	out, err := exec.Command(bin, "--url", "redis://"+addr, "call", "sliding_window", key, "--policy", "requests",
		"--limit", "3", "--window", "1m", "--also", "token_bucket,capacity=10000,rate=1,period=1h,cost=1000", "--json").Output()
	if err != nil {
		t.Fatalf("rlfn call: %v\n%s", err, out)
	}
	w1, _ := decisions(t, tg)
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
	if w1-w0 != 1 {
		t.Errorf("rlfn call ran %d FCALL, want one", w1-w0)
	}
}
