package llmlimit

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
)

// target is one deployment the middleware is tested on.
type target struct {
	name string
	vk   valkey.Client
}

// env holds the servers the tests share: started on first use, stopped by TestMain.
var env struct {
	once    sync.Once
	err     error
	targets []*target
	closers []func()
	n       atomic.Int64 // for each test's own key prefix
}

func TestMain(m *testing.M) {
	code := m.Run()
	for i := len(env.closers) - 1; i >= 0; i-- {
		env.closers[i]()
	}
	os.Exit(code)
}

// servers starts Valkey 8, Redis 7.0 and a Valkey cluster of three primaries, each with the
// working copy of the library (1.3.0). One that cannot start fails the test in CI and skips
// it elsewhere, saying why.
func servers(t testing.TB) []*target {
	t.Helper()
	env.once.Do(func() { env.err = startEnv() })
	if env.err != nil {
		harness.Unavailable(t, "test servers", env.err)
	}
	return env.targets
}

func startEnv() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	load := func(c valkey.Client) error {
		return c.Do(ctx, c.B().FunctionLoad().Replace().FunctionCode(functions.Source).Build()).Error()
	}
	for _, s := range []struct {
		name  string
		start func(context.Context, ...string) (*harness.Server, error)
	}{{"valkey8", harness.NewValkey}, {"redis7.0", harness.NewRedis}} {
		srv, err := s.start(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		env.closers = append(env.closers, func() { _ = srv.Terminate(context.Background()) })
		vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
		if err != nil {
			return err
		}
		env.closers = append(env.closers, vk.Close)
		if err := load(vk); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		env.targets = append(env.targets, &target{name: s.name, vk: vk})
	}
	cl, err := harness.NewCluster(ctx, 3, 0)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	env.closers = append(env.closers, func() { _ = cl.Terminate(context.Background()) })
	for _, p := range cl.Primaries {
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{p.Addr}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			return err
		}
		err = load(c)
		c.Close()
		if err != nil {
			return fmt.Errorf("cluster %s: %w", p.Addr, err)
		}
	}
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: cl.Addrs(), DisableCache: true})
	if err != nil {
		return err
	}
	env.closers = append(env.closers, vk.Close)
	env.targets = append(env.targets, &target{name: "cluster", vk: vk})
	return nil
}

func forEachTarget(t *testing.T, fn func(t *testing.T, tg *target, lim *client.Limiter)) {
	for _, tg := range servers(t) {
		t.Run(tg.name, func(t *testing.T) {
			// Each test its own prefix: no test sees another's counts.
			lim := harness.NewLimiter(t, tg.vk, client.Options{Prefix: fmt.Sprintf("llm%d:", env.n.Add(1)), Fallback: client.ReturnError,
				// a deadline for a shared 2-core machine: the test checks the counts, not the speed
				Deadline: 5 * time.Second})
			t.Cleanup(func() { lim.Close(context.Background()) })
			fn(t, tg, lim)
		})
	}
}

// count is what a fixed window's (or a calendar's) state on the server counts: its charged and
// held units, as the library stores them (struct.pack('<dd', window_start_ms, count)); 0 when
// the key is absent.
func count(t *testing.T, vk valkey.Client, key string) int64 {
	b, err := vk.Do(context.Background(), vk.B().Get().Key(key).Build()).AsBytes()
	if valkey.IsValkeyNil(err) {
		return 0
	}
	if err != nil || len(b) != 16 {
		t.Errorf("GET %s: %q, %v", key, b, err)
		return 0
	}
	return int64(math.Float64frombits(binary.LittleEndian.Uint64(b[8:])))
}

// 200 streams at once against one organisation's monthly budget of 10,000 tokens, through the
// middleware in front of a fake OpenAI-compatible upstream whose every stream (60 tokens)
// outruns its estimate (max_tokens 20): at no sampled instant do the server's charged and held
// units pass 10,000; streams are cut when the budget runs out (a request that finds it spent
// is refused 402); and what the server charged in the end is exactly what the clients
// received, never more than 10,000.
func TestConcurrentStreamsShareABudget(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target, lim *client.Limiter) {
		const budget, streams, words = 10_000, 200, 60
		tokens := client.Calendar{Limit: budget, Period: client.Month}
		m, err := New(lim, Options{Budgets: []Budget{{Name: "org", Key: orgKey, Tokens: tokens}}})
		if err != nil {
			t.Fatal(err)
		}
		up := &upstream{Words: words, Gap: time.Millisecond}
		srv := serve(t, m, up)
		key := lim.Key("org:acme", m.opts.Budgets[0].Tokens)

		// The sampler: the state's count, and a peek's view of it, as often as they answer.
		stop := make(chan struct{})
		var samples, over atomic.Int64
		var peak atomic.Int64
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				n := count(t, tg.vk, key)
				res, err := lim.Peek(context.Background(), "org:acme", m.opts.Budgets[0].Tokens)
				if err != nil {
					t.Error(err)
					return
				}
				samples.Add(1)
				if n > budget || res.Limit-res.Remaining > budget {
					over.Add(1)
				}
				if n > peak.Load() {
					peak.Store(n)
				}
			}
		}()

		// The calls the streams cost the server (a standalone server answers every one).
		calls := func() int64 {
			st, err := harness.CommandStats(context.Background(), tg.vk, "fcall")
			if err != nil {
				t.Fatal(err)
			}
			return st.Calls
		}
		callsBefore := calls()
		body := chatBody("gpt-x", 20, true, true, prompt)
		in := Bytes4("", mustParse(t, "/v1/chat/completions", body).Text)
		var served, cut, refused, received atomic.Int64
		var clients sync.WaitGroup
		for range streams {
			clients.Add(1)
			go func() {
				defer clients.Done()
				resp, b := post(t, srv, "/v1/chat/completions", "acme", body)
				switch resp.StatusCode {
				case http.StatusOK:
					served.Add(1)
					if strings.Contains(b, `"rlfn":{"reason":"limiter"`) {
						t.Errorf("a stream cut by the limiter's failure:\n%s", b)
					}
					if strings.Contains(b, `"rlfn":{"reason":"budget"`) {
						cut.Add(1)
						if !strings.HasSuffix(b, "data: [DONE]\n\n") || !strings.Contains(b, `"message":"the token budget org.tokens ran out`) {
							t.Errorf("a cut stream without its end, or its end naming no limit:\n%s", b)
						}
					}
					received.Add(in + int64(strings.Count(b, "tok ")))
				case http.StatusPaymentRequired:
					refused.Add(1)
				default:
					t.Errorf("status %d: %s", resp.StatusCode, b)
				}
			}()
		}
		clients.Wait()
		close(stop)
		wg.Wait()
		final := count(t, tg.vk, key)
		if tg.name != "cluster" {
			// the sampler's peeks are FCALL_RO, not counted here
			t.Logf("%.1f calls a stream (the hold, its batches, the settle)", float64(calls()-callsBefore)/streams)
		}
		t.Logf("%d streams: %d served (%d cut), %d refused; %d samples, peak %d; charged %d (%d short of the budget), received %d",
			streams, served.Load(), cut.Load(), refused.Load(), samples.Load(), peak.Load(), final, budget-final, received.Load())
		if over.Load() > 0 || samples.Load() < 3 {
			t.Errorf("%d of %d samples over the budget", over.Load(), samples.Load())
		}
		if cut.Load() == 0 {
			t.Error("no stream cut: the budget never ran out")
		}
		if final > budget || final != received.Load() {
			t.Errorf("charged %d, the clients received %d; want them equal, at most %d", final, received.Load(), budget)
		}
	})
}

// On the server, a request is charged what its usage says, on every limit of every Budget
// (two keys, side by side); one whose estimate the month has no room for is refused 402 and
// takes nothing; a Budget with no limit of output tokens is held without a meter.
func TestSettlesOnServer(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target, lim *client.Limiter) {
		userKey := func(r *http.Request) (string, error) { return "u-" + r.Header.Get("X-Org"), nil }
		monthly := client.Calendar{Limit: 1000, Period: client.Month}
		m, err := New(lim, Options{Budgets: []Budget{
			{Name: "org", Key: orgKey, Requests: hourly, Tokens: monthly},
			{Name: "user", Key: userKey, InputTokens: hourly},
		}})
		if err != nil {
			t.Fatal(err)
		}
		srv := serve(t, m, &upstream{Words: 7, Cached: 2})
		b := m.opts.Budgets
		keys := func() [3]int64 {
			return [3]int64{count(t, tg.vk, lim.Key("org:acme", b[0].Requests)), count(t, tg.vk, lim.Key("org:acme", b[0].Tokens)),
				count(t, tg.vk, lim.Key("user:u-acme", b[1].InputTokens))}
		}
		body := chatBody("gpt-x", 100, false, false, prompt)
		in := Bytes4("", mustParse(t, "/v1/chat/completions", body).Text)
		// A whole response ends for its client (its length was said) before the middleware
		// settles it: the counts are read once they are what they should be, or at a deadline.
		eventually := func(want [3]int64) [3]int64 {
			deadline := time.Now().Add(5 * time.Second)
			got := keys()
			for got != want && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
				got = keys()
			}
			return got
		}
		resp, _ := post(t, srv, "/v1/chat/completions", "acme", body)
		if got, want := eventually([3]int64{1, in + 7, in}), [3]int64{1, in + 7, in}; resp.StatusCode != 200 || got != want {
			t.Errorf("%d; counts %v, want %v", resp.StatusCode, got, want)
		}
		// the headers of both kinds, after the hold: one from the hold's reply (its deciding
		// limit), the other peeked at
		if r, tk := resp.Header.Get("X-Ratelimit-Remaining-Requests"), resp.Header.Get("X-Ratelimit-Remaining-Tokens"); r != "99999" || tk != fmt.Sprint(1000-in-100) {
			t.Errorf("remaining requests %q, tokens %q; want 99999, %d", r, tk, 1000-in-100)
		}
		resp, _ = post(t, srv, "/v1/messages", "acme", messagesBody("claude-x", 100, true, prompt))
		in2 := Bytes4("", mustParse(t, "/v1/messages", messagesBody("claude-x", 100, true, prompt)).Text)
		if got, want := keys(), [3]int64{2, in + 7 + in2 + 7, in + in2}; resp.StatusCode != 200 || got != want {
			t.Errorf("stream: %d; counts %v, want %v", resp.StatusCode, got, want)
		}
		before := keys()
		resp, body2 := post(t, srv, "/v1/chat/completions", "acme", chatBody("gpt-x", 990, true, false, prompt))
		if resp.StatusCode != 402 || !strings.Contains(body2, `"code":"insufficient_quota"`) || keys() != before {
			t.Errorf("a month without room: %d %s; counts %v, want %v", resp.StatusCode, body2, keys(), before)
		}
		if got := resp.Header.Get("X-Ratelimit-Remaining-Tokens"); got != fmt.Sprint(1000-before[1]) {
			t.Errorf("X-Ratelimit-Remaining-Tokens %q, want %d", got, 1000-before[1])
		}

		// requests and input alone: a hold, no meter
		m2, err := New(lim, Options{Budgets: []Budget{{Name: "plain", Key: orgKey, Requests: hourly, InputTokens: hourly}}})
		if err != nil {
			t.Fatal(err)
		}
		srv2 := serve(t, m2, &upstream{Words: 30})
		resp, body3 := post(t, srv2, "/v1/chat/completions", "acme", chatBody("gpt-x", 5, true, false, prompt))
		p := m2.opts.Budgets[0]
		if n := count(t, tg.vk, lim.Key("plain:acme", p.InputTokens)); resp.StatusCode != 200 || strings.Count(body3, "tok ") != 30 || n != in {
			t.Errorf("held only: %d, %d tokens streamed, input counted %d; want all 30, %d", resp.StatusCode, strings.Count(body3, "tok "), n, in)
		}
	})
}

// A request through a Budget of several limits on one key, with the headers of every one of
// them, costs the server one call to decide (the hold: one rl_multi, whose reply says every
// limit's state) and one rl_hold_settle per limit to settle (pipelined: one round trip), no
// peek: counted by the server (INFO commandstats) on each standalone server.
func TestHeadersCostNoCall(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target, lim *client.Limiter) {
		if tg.name == "cluster" {
			return // each node counts its own calls: the standalone servers count them all
		}
		m, err := New(lim, Options{Budgets: []Budget{{Name: "org", Key: orgKey, Requests: hourly, Tokens: hourly, OutputTokens: hourly}}})
		if err != nil {
			t.Fatal(err)
		}
		srv := serve(t, m, &upstream{Words: 7})
		stat := func(cmd string) int64 {
			st, err := harness.CommandStats(context.Background(), tg.vk, cmd)
			if err != nil {
				t.Fatal(err)
			}
			return st.Calls
		}
		const rules = 3
		for _, tc := range []struct{ path, body string }{
			{"/v1/chat/completions", chatBody("gpt-x", 100, false, false, prompt)},
			{"/v1/chat/completions", chatBody("gpt-x", 100, true, true, prompt)},
			{"/v1/messages", messagesBody("claude-x", 100, true, prompt)},
		} {
			fcalls, ro := stat("fcall"), stat("fcall_ro")
			resp, _ := post(t, srv, tc.path, "acme", tc.body)
			// the settle may follow the response's end: counted once it came, or at a deadline
			want := fcalls + 1 + rules
			deadline := time.Now().Add(5 * time.Second)
			got := stat("fcall")
			for got < want && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
				got = stat("fcall")
			}
			var names []string
			for k := range resp.Header {
				if l := strings.ToLower(k); strings.Contains(l, "ratelimit-") && strings.Contains(l, "remaining") {
					names = append(names, k)
				}
			}
			t.Logf("%s: %d FCALL, %d FCALL_RO; headers %v", tc.path, got-fcalls, stat("fcall_ro")-ro, names)
			if got != want || stat("fcall_ro") != ro {
				t.Errorf("%s: %d FCALL and %d FCALL_RO a request, want 1 hold and %d settles, no peek", tc.path, got-fcalls, stat("fcall_ro")-ro, rules)
			}
			wantHeaders := 2 // OpenAI's: requests and tokens
			if strings.HasPrefix(tc.path, "/v1/messages") {
				wantHeaders = 3 // Anthropic's: requests, tokens, output tokens
			}
			if resp.StatusCode != 200 || len(names) != wantHeaders {
				t.Errorf("%s: %d, headers %v, want %d kinds", tc.path, resp.StatusCode, names, wantHeaders)
			}
		}
	})
}
