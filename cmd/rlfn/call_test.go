package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/httplimit"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/versions"
)

// calls runs rlfn call --json against addr and decodes its JSON Lines.
func calls(t *testing.T, addr string, args ...string) []callJSON {
	t.Helper()
	r := rlfnAt(t, testReleases(t), addr, append(append([]string{"call"}, args...), "--json")...)
	wantExit(t, r, exitOK, "call "+strings.Join(args, " "))
	var out []callJSON
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var c callJSON
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("call --json line %q: %v", line, err)
		}
		out = append(out, c)
	}
	return out
}

// want compares the decisions of a run with allowed/remaining pairs, and the rule that decided
// for --also (0 otherwise).
func wantCalls(t *testing.T, what string, got []callJSON, want ...[3]int64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d calls, want %d: %+v", what, len(got), len(want), got)
	}
	for i, w := range want {
		if g := got[i]; g.Allowed != (w[0] == 1) || g.Remaining != w[1] || (g.Rule == nil) != (w[2] == 0) || g.Rule != nil && int64(*g.Rule) != w[2] {
			t.Errorf("%s: call %d = %+v, want allowed %v, remaining %d, rule %d", what, i+1, g, w[0] == 1, w[1], w[2])
		}
	}
}

// TestCallModes makes each call of library 1.1.0 through rlfn call on a real server: reserve
// and critical, refund, concurrency acquire / renew / release, and several limits at once, of
// one key (one rl_multi) and of two (side by side, refunded when one denies). Against 1.0.0,
// a 1.1 call fails with one line naming the node and the version it needs.
func TestCallModes(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	s := harness.StartValkey(t)
	set := testReleases(t)
	wantExit(t, rlfnAt(t, set, s.Addr, "deploy", "--yes", "--to", "1.0.0"), exitOK, "deploy 1.0.0")
	bucket := []string{"token_bucket", "user:1", "--capacity", "5", "--rate", "1", "--period", "1h"}
	r := rlfnAt(t, set, s.Addr, append([]string{"call"}, append(bucket, "--reserve", "1")...)...)
	wantExit(t, r, exitError, "a reserve call against 1.0.0")
	if !strings.Contains(r.stderr, s.Addr) || !strings.Contains(r.stderr, "1.1.0") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Errorf("a reserve call against 1.0.0: stderr %q, want one line naming %s and 1.1.0", r.stderr, s.Addr)
	}
	// Limits of two keys rely on refunds: refused by 1.0.0 before anything is taken.
	login := []string{"call", "sliding_log", "user:9", "--limit", "1", "--window", "1m"}
	r = rlfnAt(t, set, s.Addr, append(login, "--also", "sliding_log,key=other,limit=1,window=1m")...)
	wantExit(t, r, exitError, "limits of two keys against 1.0.0")
	if !strings.Contains(r.stderr, "rl_sliding_log_refund needs 1.1.0") {
		t.Errorf("limits of two keys against 1.0.0: stderr %q, want rl_sliding_log_refund needs 1.1.0", r.stderr)
	}
	wantCalls(t, "nothing taken", calls(t, s.Addr, append(login[1:], "--peek")...), [3]int64{1, 1, 0})
	wantExit(t, rlfnAt(t, set, s.Addr, "deploy", "--yes"), exitOK, "deploy 1.1.0")

	t.Run("reserve", func(t *testing.T) {
		wantCalls(t, "cost 3", calls(t, s.Addr, append(bucket, "--cost", "3")...), [3]int64{1, 2, 0})
		// 2 left: a normal caller leaving 2 is refused, and is told what it could take (0).
		wantCalls(t, "reserve 2", calls(t, s.Addr, append(bucket, "--reserve", "2")...), [3]int64{0, 0, 0})
		wantCalls(t, "reserve 1", calls(t, s.Addr, append(bucket, "--reserve", "1")...), [3]int64{1, 0, 0})
		// The critical caller takes the last unit.
		wantCalls(t, "critical", calls(t, s.Addr, append(bucket, "--reserve", "1", "--critical", "--repeat", "2")...),
			[3]int64{1, 0, 0}, [3]int64{0, 0, 0})
	})

	t.Run("refund", func(t *testing.T) {
		refund := calls(t, s.Addr, append(bucket, "--refund", "3")...)
		wantCalls(t, "refund 3", refund, [3]int64{1, 3, 0})
		if refund[0].ID != nil {
			t.Errorf("a refund's line has an id: %+v", refund[0])
		}
		wantCalls(t, "refund beyond capacity", calls(t, s.Addr, append(bucket, "--refund", "10")...), [3]int64{1, 5, 0})
		wantCalls(t, "peek", calls(t, s.Addr, append(bucket, "--peek")...), [3]int64{1, 5, 0})
	})

	t.Run("concurrency", func(t *testing.T) {
		conc := []string{"concurrency", "user:1", "--limit", "2", "--lease", "1m"}
		a := calls(t, s.Addr, append(conc, "--id", "worker-a", "--repeat", "2")...) // takes, then renews
		wantCalls(t, "worker-a takes and renews", a, [3]int64{1, 1, 0}, [3]int64{1, 1, 0})
		if a[0].ID == nil || *a[0].ID != "worker-a" || a[0].Key != "rl:{user:1}:concurrency" {
			t.Errorf("lease row %+v, want id worker-a on rl:{user:1}:concurrency", a[0])
		}
		// A new holder with a random id takes the last slot; the next one is refused.
		b := calls(t, s.Addr, append(conc, "--repeat", "2")...)
		wantCalls(t, "two new holders", b, [3]int64{1, 0, 0}, [3]int64{0, 0, 0})
		if b[0].ID == nil || !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(*b[0].ID) || b[1].ID == nil || *b[1].ID != "" || b[1].RetryAfterMs <= 0 {
			t.Errorf("new holders %+v, want a random id for the first and \"\", with a wait, for the refused one", b)
		}
		// worker-a still renews when full; a reserve never refuses a renewal.
		wantCalls(t, "renew when full", calls(t, s.Addr, append(conc, "--id", "worker-a", "--reserve", "2")...), [3]int64{1, 0, 0})
		wantCalls(t, "release", calls(t, s.Addr, append(conc, "--id", "worker-a", "--release", "--repeat", "2")...),
			[3]int64{1, 1, 0}, [3]int64{0, 1, 0})
		wantCalls(t, "release the random holder", calls(t, s.Addr, append(conc, "--id", *b[0].ID, "--release")...), [3]int64{1, 2, 0})
		r := rlfnAt(t, set, s.Addr, append([]string{"call"}, append(conc, "--id", "worker-a")...)...)
		if wantExit(t, r, exitOK, "a table"); !regexp.MustCompile(`(?m)^rl:\{user:1\}:concurrency +worker-a +yes +2 +1 +0s +`).MatchString(r.stdout) {
			t.Errorf("concurrency table:\n%s", r.stdout)
		}
	})

	t.Run("several limits of one key", func(t *testing.T) {
		// 5 an hour, and a burst of 2 refilled 1 an hour (neither aligned to the clock): the
		// burst decides the third call, and the denied call took nothing from the other limit.
		multi := []string{"sliding_log", "user:2", "--limit", "5", "--window", "1h", "--also", "token_bucket,name=burst,capacity=2,rate=1,period=1h"}
		got := calls(t, s.Addr, append(multi, "--repeat", "3")...)
		wantCalls(t, "3 calls", got, [3]int64{1, 1, 2}, [3]int64{1, 0, 2}, [3]int64{0, 0, 2})
		if got[2].Key != "rl:{user:2}:token_bucket:burst" || got[2].Limit != 2 || got[2].RetryAfterMs <= 0 {
			t.Errorf("the denied call %+v, want the burst limit's reply", got[2])
		}
		// every limit as each call left it: the log's own state, which the reply of one
		// rl_multi does not hold
		for i, want := range [][2]limitJSON{
			{{Rule: 1, Key: "rl:{user:2}:sliding_log", Allowed: true, Limit: 5, Remaining: 4}, {Rule: 2, Key: "rl:{user:2}:token_bucket:burst", Allowed: true, Limit: 2, Remaining: 1}},
			{{Rule: 1, Key: "rl:{user:2}:sliding_log", Allowed: true, Limit: 5, Remaining: 3}, {Rule: 2, Key: "rl:{user:2}:token_bucket:burst", Allowed: true, Limit: 2, Remaining: 0}},
			{{Rule: 1, Key: "rl:{user:2}:sliding_log", Allowed: true, Limit: 5, Remaining: 3}, {Rule: 2, Key: "rl:{user:2}:token_bucket:burst", Allowed: false, Limit: 2, Remaining: 0}},
		} {
			l := got[i].Limits
			if len(l) != 2 {
				t.Fatalf("call %d: limits %+v, want 2", i+1, l)
			}
			for j := range l {
				w := want[j]
				if g := l[j]; g.Rule != w.Rule || g.Key != w.Key || g.Allowed != w.Allowed || g.Limit != w.Limit || g.Remaining != w.Remaining ||
					g.ResetAfterMs <= 0 || (g.RetryAfterMs > 0) == g.Allowed {
					t.Errorf("call %d, limit %d: %+v, want %+v", i+1, j+1, g, w)
				}
			}
		}
		r := rlfnAt(t, set, s.Addr, append([]string{"call"}, multi...)...)
		if wantExit(t, r, exitOK, "a table"); !regexp.MustCompile(`(?m)^2 +rl:\{user:2\}:token_bucket:burst +no +2 +0 +.*\n\(1\) +rl:\{user:2\}:sliding_log +yes +5 +3 +0s `).MatchString(r.stdout) {
			t.Errorf("multi table, the other limit under the one that decided:\n%s", r.stdout)
		}
		wantCalls(t, "hourly limit", calls(t, s.Addr, "sliding_log", "user:2", "--limit", "5", "--window", "1h", "--peek"), [3]int64{1, 3, 0})
	})

	t.Run("a cost per limit", func(t *testing.T) {
		// 60 requests and 100 tokens an hour, each call 40 tokens (cost=), 1 request (--cost):
		// the third call is refused by the tokens, and takes no request.
		tokens := []string{"fixed_window", "org:1", "--limit", "60", "--window", "1h", "--also", "token_bucket,name=tokens,capacity=100,rate=1,period=1h,cost=40"}
		wantCalls(t, "3 calls", calls(t, s.Addr, append(tokens, "--repeat", "3")...), [3]int64{1, 59, 1}, [3]int64{1, 20, 2}, [3]int64{0, 20, 2})
		wantCalls(t, "requests", calls(t, s.Addr, "fixed_window", "org:1", "--limit", "60", "--window", "1h", "--peek"), [3]int64{1, 58, 0})
		// --cost is every other limit's: 2 requests and 40 tokens would leave 56 and 20
		wantCalls(t, "peek --cost 2", calls(t, s.Addr, append(tokens, "--peek", "--cost", "2")...), [3]int64{0, 20, 2})
	})

	t.Run("several limits of two keys", func(t *testing.T) {
		// A per-user limit of 3 and a global one of 1: the global one denies the second call,
		// and the user's unit is refunded.
		login := []string{"sliding_log", "user:3", "--limit", "3", "--window", "1m", "--also", "token_bucket,key=global,capacity=1,rate=1,period=1h"}
		wantCalls(t, "2 calls", calls(t, s.Addr, append(login, "--repeat", "2")...), [3]int64{1, 0, 2}, [3]int64{0, 0, 2})
		wantCalls(t, "user limit", calls(t, s.Addr, "sliding_log", "user:3", "--limit", "3", "--window", "1m", "--peek"), [3]int64{1, 2, 0})
		r := rlfnAt(t, set, s.Addr, append([]string{"call"}, append(login, "--peek")...)...)
		if wantExit(t, r, exitOK, "a table"); !regexp.MustCompile(`(?m)^2 +rl:\{global\}:token_bucket +no +1 +0 +`).MatchString(r.stdout) {
			t.Errorf("multi table:\n%s", r.stdout)
		}
	})
}

// A refund that several keys' decision owes and cannot make fails the call (exit 1, one line
// saying how many were lost and why), after printing the denial, which stands: the Limiter
// tries it once more when rlfn closes it, and the units stay taken. The server runs 1.1.0 without
// its refund functions, so that the call is made and its refund fails.
func TestCallCompensationFails(t *testing.T) {
	s := harness.StartValkey(t)
	v11, ok := versions.Embedded().Find("1.1.0")
	if !ok {
		t.Fatal("1.1.0 is not embedded")
	}
	const register = "'_refund'"
	if !strings.Contains(v11.Code, register) {
		t.Fatalf("1.1.0 does not name its refunds with %s", register)
	}
	code := strings.Replace(v11.Code, register, "'_refund_gone'", 1)
	vk := s.Client(t)
	if err := vk.Do(context.Background(), vk.B().FunctionLoad().Replace().FunctionCode(code).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	login := []string{"call", "sliding_log", "user:1", "--limit", "5", "--window", "1m", "--also", "token_bucket,key=global,capacity=1,rate=1,period=1h", "--json"}
	wantExit(t, rlfnAt(t, testReleases(t), s.Addr, login...), exitOK, "the first call")
	r := rlfnAt(t, testReleases(t), s.Addr, login...)
	wantExit(t, r, exitError, "a denial whose refund fails")
	// The denial's line, then the error's, which ends the JSON Lines.
	var got callJSON
	denial, errLine, _ := strings.Cut(r.stdout, "\n")
	if err := json.Unmarshal([]byte(denial), &got); err != nil || got.Allowed || got.Rule == nil || *got.Rule != 2 {
		t.Errorf("stdout %q (%v), want the denial by rule 2", r.stdout, err)
	}
	wantErrorJSON(t, result{code: r.code, stdout: errLine, stderr: r.stderr})
	if !strings.Contains(r.stderr, "the decision stands, but 1 of 1 refunds lost") || !strings.Contains(r.stderr, "not loaded") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Errorf("stderr %q, want one line saying rule 0's refund was lost", r.stderr)
	}
}

// TestCallRepeatStreams: rlfn call --repeat of a billion prints each row as its call returns.
// Stdout cancels the run once it has read 100 rows: had the rows been held until the end, it
// would read none before --timeout ended the run, which would then fail as a deadline.
func TestCallRepeatStreams(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	s := harness.StartValkey(t)
	set := testReleases(t)
	wantExit(t, rlfnAt(t, set, s.Addr, "deploy", "--yes"), exitOK, "deploy")
	for _, asJSON := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		out := &cancelAfter{rows: 100, cancel: cancel}
		var stderr bytes.Buffer
		app := New()
		app.Metadata[releasesKey] = set
		app.Reader, app.Writer, app.ErrWriter = strings.NewReader(""), out, &stderr
		args := []string{"rlfn", "--url", "redis://" + s.Addr, "--timeout", "30s",
			"call", "token_bucket", "user:stream", "--capacity", "1000000", "--rate", "1", "--period", "1h", "--repeat", "1000000000"}
		if asJSON {
			args = append(args, "--json")
		}
		code := runApp(ctx, app, args)
		cancel()
		if code != exitError || !strings.Contains(stderr.String(), context.Canceled.Error()) {
			t.Fatalf("json %v: exit %d, stderr %q; want the run cancelled by its reader", asJSON, code, stderr.String())
		}
		lines := strings.Split(strings.TrimSpace(out.buf.String()), "\n")
		if len(lines) < 100 {
			t.Fatalf("json %v: %d lines before the cancel, want at least 100", asJSON, len(lines))
		}
		row := regexp.MustCompile(`^rl:\{user:stream\}:token_bucket  yes      1000000  \d{6} {5}0s {11}\S+ +0s$`)
		if asJSON {
			row = regexp.MustCompile(`^\{"key":"rl:\{user:stream\}:token_bucket","allowed":true,`)
			// The error ends the JSON Lines.
			last := lines[len(lines)-1]
			wantErrorJSON(t, result{code: code, stdout: last, stderr: stderr.String()})
			lines = lines[:len(lines)-1]
		} else if lines = lines[1:]; !strings.HasPrefix(out.buf.String(), "KEY ") {
			t.Errorf("no header:\n%s", out.buf.String())
		}
		for i, l := range lines {
			if !row.MatchString(l) {
				t.Fatalf("json %v: row %d %q, want a decision in aligned columns", asJSON, i+1, l)
			}
		}
	}
}

// cancelAfter is stdout that cancels the run once it has read rows lines.
type cancelAfter struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	rows   int // lines to read before cancelling
	lines  int
	cancel func()
}

func (w *cancelAfter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if w.lines += bytes.Count(p, []byte("\n")); w.lines >= w.rows {
		w.cancel()
	}
	return len(p), nil
}

// TestCallReplicaURL: given a replica's URL, call finds its primary, as status and deploy do:
// the decision is made there (a write sent to the replica would fail READONLY), and a --peek
// is still answered by the replica named.
func TestCallReplicaURL(t *testing.T) {
	primary, replica := standalone(t, harness.StartValkey)
	set := testReleases(t)
	wantExit(t, rlfnAt(t, set, replica.Addr, "deploy", "--yes"), exitOK, "deploy from the replica's URL")
	bucket := []string{"token_bucket", "user:1", "--capacity", "5", "--rate", "1", "--period", "1h"}
	wantCalls(t, "calls from the replica's URL", calls(t, replica.Addr, append(bucket, "--repeat", "2")...), [3]int64{1, 4, 0}, [3]int64{1, 3, 0})
	wantCalls(t, "the primary's state", calls(t, primary.Addr, append(bucket, "--peek")...), [3]int64{1, 3, 0})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := primary.WaitReplicas(ctx, 1); err != nil {
		t.Fatal(err)
	}
	vk := primary.Client(t)
	if err := vk.Do(ctx, vk.B().Wait().Numreplicas(1).Timeout(5000).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// The replica named answers the peek: its count of FCALL_RO grows by one.
	before := fcallROCalls(t, replica)
	wantCalls(t, "a peek from the replica's URL", calls(t, replica.Addr, append(bucket, "--peek")...), [3]int64{1, 3, 0})
	if got := fcallROCalls(t, replica); got != before+1 {
		t.Errorf("the replica served %d FCALL_RO for one peek", got-before)
	}
	conc := []string{"concurrency", "user:1", "--limit", "2", "--lease", "1m", "--id", "worker-a"}
	wantCalls(t, "a lease from the replica's URL", calls(t, replica.Addr, conc...), [3]int64{1, 1, 0})
}

// fcallROCalls is how many FCALL_RO s has run, from INFO commandstats.
func fcallROCalls(t *testing.T, s *harness.Server) int {
	t.Helper()
	vk := s.Client(t)
	info, err := vk.Do(context.Background(), vk.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`cmdstat_fcall_ro:calls=(\d+)`).FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestCallDecimal: a number with a leading zero is decimal on the command line as in the
// library: --limit 010 decides with a limit of ten, not eight (Go's octal), and so do
// --cost, --repeat and --also's fields.
func TestCallDecimal(t *testing.T) {
	s := harness.StartValkey(t)
	wantExit(t, rlfnAt(t, testReleases(t), s.Addr, "deploy", "--yes"), exitOK, "deploy")
	got := calls(t, s.Addr, "fixed_window", "k", "--limit", "010", "--window", "1m", "--cost", "02", "--repeat", "02")
	if len(got) != 2 || got[0].Limit != 10 || got[0].Remaining != 8 || got[1].Remaining != 6 {
		t.Errorf("--limit 010 --cost 02 --repeat 02 = %+v, want two calls of a limit of 10 taking 2 each", got)
	}
	got = calls(t, s.Addr, "fixed_window", "k2", "--limit", "5", "--window", "1m", "--also", "token_bucket,capacity=010,rate=01,period=1h")
	if len(got) != 1 || len(got[0].Limits) != 2 || got[0].Limits[1].Limit != 10 {
		t.Errorf("--also capacity=010 = %+v, want a second limit of capacity 10", got)
	}
}

// TestCallPolicy: --policy reaches the state an httplimit middleware keeps: requests served
// through a Policy named "api" (and its Rule "per-ip", keyed by the client's address) are
// seen by rlfn call --policy api (and --policy per-ip, or policy= in --also), and by no call
// without it, which reads another key in another slot.
func TestCallPolicy(t *testing.T) {
	s := harness.StartValkey(t)
	wantExit(t, rlfnAt(t, testReleases(t), s.Addr, "deploy", "--yes"), exitOK, "deploy")
	vk := s.Client(t)
	mw, err := httplimit.New(harness.NewLimiter(t, vk, client.Options{}), httplimit.Options{
		Key: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil },
		Policy: func(*http.Request) httplimit.Policy {
			return httplimit.Policy{
				Name:  "api",
				Limit: client.TokenBucket{Capacity: 5, Rate: 1, Period: time.Hour},
				Also: []httplimit.AlsoLimit{{
					Name:  "per-ip",
					Key:   func(*http.Request) (string, error) { return "192.0.2.7", nil },
					Limit: client.FixedWindow{Limit: 10, Window: time.Hour},
				}},
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for range 2 {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-User", "alice")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("request through the middleware: %d %s", rec.Code, rec.Body)
		}
	}

	bucket := []string{"token_bucket", "alice", "--capacity", "5", "--rate", "1", "--period", "1h", "--peek"}
	got := calls(t, s.Addr, append(bucket, "--policy", "api")...)
	if len(got) != 1 || got[0].Key != "rl:{api:alice}:token_bucket" || got[0].Remaining != 3 {
		t.Errorf("call --policy api = %+v, want rl:{api:alice}:token_bucket with 2 of 5 taken by the middleware", got)
	}
	if got := calls(t, s.Addr, bucket...); got[0].Remaining != 5 {
		t.Errorf("call without --policy = %+v, want a fresh bucket: the middleware's key is another", got)
	}
	got = calls(t, s.Addr, "fixed_window", "192.0.2.7", "--policy", "per-ip", "--limit", "10", "--window", "1h", "--peek")
	if len(got) != 1 || got[0].Key != "rl:{per-ip:192.0.2.7}:fixed_window" || got[0].Remaining != 8 {
		t.Errorf("call --policy per-ip = %+v, want rl:{per-ip:192.0.2.7}:fixed_window with 2 of 10 taken", got)
	}
	// The route's decision, as the middleware makes it: its Rule's key with policy=.
	got = calls(t, s.Addr, "token_bucket", "alice", "--policy", "api", "--capacity", "5", "--rate", "1", "--period", "1h",
		"--also", "fixed_window,policy=per-ip,key=192.0.2.7,limit=10,window=1h")
	if len(got) != 1 || len(got[0].Limits) != 2 || got[0].Limits[0].Key != "rl:{api:alice}:token_bucket" || got[0].Limits[0].Remaining != 2 ||
		got[0].Limits[1].Key != "rl:{per-ip:192.0.2.7}:fixed_window" || got[0].Limits[1].Remaining != 7 {
		t.Errorf("call --policy api --also policy=per-ip = %+v, want both of the middleware's limits, one more unit taken of each", got)
	}
}

// A key longer than a service's Limiter takes is refused as the client refuses it, before any
// call, in one short line: the key itself (perhaps a megabyte) is not echoed.
func TestCallLongKey(t *testing.T) {
	s := harness.StartValkey(t)
	wantExit(t, rlfnAt(t, testReleases(t), s.Addr, "deploy", "--yes"), exitOK, "deploy")
	long := strings.Repeat("k", 1<<20)
	r := rlfnAt(t, testReleases(t), s.Addr, "call", "fixed_window", long, "--limit", "10", "--window", "1m")
	wantExit(t, r, exitError, "a 1 MiB key")
	want := "rlfn: client: the key is 1048576 bytes, longer than the 512 Options.MaxKeyLen allows (key a long identifier by a hash of it)\n"
	if r.stderr != want {
		t.Errorf("stderr %.200q, want %q", r.stderr, want)
	}
	if n, err := s.Client(t).Do(t.Context(), s.Client(t).B().Dbsize().Build()).AsInt64(); err != nil || n != 0 {
		t.Errorf("DBSIZE %d, %v: want nothing written", n, err)
	}
}
