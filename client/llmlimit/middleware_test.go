package llmlimit

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
)

var (
	hourly  = client.FixedWindow{Limit: 100_000, Window: time.Hour}
	monthly = client.Calendar{Limit: 100_000, Period: client.Month}
)

// orgKey reads the organisation from X-Org.
func orgKey(r *http.Request) (string, error) { return r.Header.Get("X-Org"), nil }

// proxy serves the middleware in front of an httputil.ReverseProxy to up, on a real HTTP
// server: the setting it is for (flushes, a cancelled upstream, the proxy's abort).
func proxy(t *testing.T, lim opener, up http.Handler, opts Options) (*Middleware, *httptest.Server) {
	t.Helper()
	if opts.Budgets == nil {
		opts.Budgets = []Budget{{Name: "org", Key: orgKey, Requests: hourly, Tokens: hourly}}
	}
	m, err := newMiddleware(lim, opts)
	if err != nil {
		t.Fatal(err)
	}
	return m, serve(t, m, up)
}

// serve serves m in front of an httputil.ReverseProxy to up.
func serve(t *testing.T, m *Middleware, up http.Handler) *httptest.Server {
	t.Helper()
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	target, _ := url.Parse(upSrv.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ErrorLog = nil
	srv := httptest.NewServer(m.Handler(rp))
	t.Cleanup(srv.Close)
	return srv
}

// post sends body to path as organisation org, and reads the whole response.
func post(t *testing.T, srv *httptest.Server, path, org, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", srv.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Org", org)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// direct is the upstream's own answer to body, for comparison.
func direct(t *testing.T, up http.Handler, path, body string) string {
	rec := httptest.NewRecorder()
	up.ServeHTTP(rec, httptest.NewRequest("POST", path, strings.NewReader(body)))
	return rec.Body.String()
}

const prompt = "hello world, how are you today?" // 31 bytes and a newline: 8 tokens by Bytes4

// A whole JSON response is passed on unchanged and settles from its usage: input (cached
// included, or not with CachedFree) and output, and the request.
func TestJSONSettlesFromUsage(t *testing.T) {
	for _, cachedFree := range []bool{false, true} {
		for _, tt := range []struct {
			path, body string
		}{
			{"/v1/chat/completions", chatBody("gpt-x", 100, false, false, prompt)},
			{"/v1/responses", responsesBody("gpt-x", 100, false, prompt)},
			{"/v1/messages", messagesBody("claude-x", 100, false, prompt)},
		} {
			t.Run(fmt.Sprint(tt.path, cachedFree), func(t *testing.T) {
				up := &upstream{Words: 7, Cached: 3}
				f := newFake(nil)
				_, srv := proxy(t, f, up, Options{CachedFree: cachedFree})
				resp, body := post(t, srv, tt.path, "acme", tt.body)
				if resp.StatusCode != 200 || body != direct(t, up, tt.path, tt.body) {
					t.Fatalf("%d %s; want the upstream's body", resp.StatusCode, body)
				}
				in := Bytes4("", mustParse(t, tt.path, tt.body).Text)
				want := in + 7
				if cachedFree {
					want -= 3
				}
				if got := f.settledAfter(t, 1); got != fmt.Sprint([][]int64{{1, want}}) {
					t.Errorf("settled %s, want requests 1, tokens %d", got, want)
				}
				if rules := f.opened[0]; rules[1].Cost != in+100 || rules[0].Cost != 1 || rules[1].Key != "org:acme" || rules[1].Name != "org.tokens" {
					t.Errorf("rules %+v; want tokens' estimate %d on org:acme", rules, in+100)
				}
			})
		}
	}
}

func mustParse(t *testing.T, path, body string) *Request {
	t.Helper()
	r, err := ParseRequest(ByPath(httptest.NewRequest("POST", path, nil)), []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A stream within its budget is passed on byte for byte, and settles from its usage when it
// reports one, else from the tokens metered (the input at its estimate).
func TestStreamPassesUnchanged(t *testing.T) {
	for _, tt := range []struct {
		name, path, body string
		wantOut          int64
		usage            bool // the stream reports its input
	}{
		{"chat, usage", "/v1/chat/completions", chatBody("gpt-x", 10, true, true, prompt), 40, true},
		{"chat, metered", "/v1/chat/completions", chatBody("gpt-x", 10, true, false, prompt), 40, false},
		{"responses", "/v1/responses", responsesBody("gpt-x", 10, true, prompt), 40, true},
		{"messages", "/v1/messages", messagesBody("claude-x", 10, true, prompt), 40, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := &upstream{Words: 40, Cached: 2}
			f := newFake(nil)
			_, srv := proxy(t, f, up, Options{})
			resp, body := post(t, srv, tt.path, "acme", tt.body)
			if want := direct(t, up, tt.path, tt.body); resp.StatusCode != 200 || body != want {
				t.Fatalf("%d\n%s\nwant\n%s", resp.StatusCode, body, want)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("Content-Type %q", ct)
			}
			req := mustParse(t, tt.path, tt.body)
			in := Bytes4("", req.Text)
			if !tt.usage {
				in = Bytes4("", req.Text) // the estimate: the same function, so the same number
			}
			if got := f.settledAfter(t, 1); got != fmt.Sprint([][]int64{{1, in + tt.wantOut}}) {
				t.Errorf("settled %s, want tokens %d", got, in+tt.wantOut)
			}
		})
	}
}

// The headers a client of each API reads describe the middleware's limits, not the
// upstream's: every one, from the hold's reply of each limit's state.
func TestHeaders(t *testing.T) {
	f := newFake(map[string]int64{"org.requests": 60, "org.tokens": 10_000, "user.output_tokens": 5000})
	at := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	_, srv := proxy(t, f, &upstream{Words: 3}, Options{Now: func() time.Time { return at }, Budgets: []Budget{
		{Name: "org", Key: orgKey, Requests: hourly, Tokens: hourly},
		{Name: "user", Key: orgKey, OutputTokens: hourly},
	}})
	resp, _ := post(t, srv, "/v1/chat/completions", "acme", chatBody("gpt-x", 100, false, false, prompt))
	want := map[string]string{
		"X-Ratelimit-Limit-Requests": "60", "X-Ratelimit-Remaining-Requests": "59", "X-Ratelimit-Reset-Requests": "1m0s",
		"X-Ratelimit-Limit-Tokens": "10000", "X-Ratelimit-Remaining-Tokens": "9892", "X-Ratelimit-Reset-Tokens": "1m0s",
	}
	for k, v := range want {
		if got := resp.Header.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	resp, _ = post(t, srv, "/v1/messages", "acme", messagesBody("claude-x", 100, false, prompt))
	want = map[string]string{
		"Anthropic-Ratelimit-Requests-Limit": "60", "Anthropic-Ratelimit-Requests-Remaining": "58",
		"Anthropic-Ratelimit-Requests-Reset": "2026-11-28T12:01:00Z",
		"Anthropic-Ratelimit-Tokens-Limit":   "10000", "Anthropic-Ratelimit-Output-Tokens-Limit": "5000",
		"Anthropic-Ratelimit-Output-Tokens-Remaining": "4897",
	}
	for k, v := range want {
		if got := resp.Header.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	if h := resp.Header.Get("X-Ratelimit-Limit-Tokens"); h != "" {
		t.Errorf("an Anthropic response has OpenAI's headers: %q", h)
	}
}

// A stream that runs out of budget is cut cleanly: the upstream's request is cancelled, the
// client gets the events it was granted and then a well-formed end that says why, and the
// request settles at what the client received.
func TestCut(t *testing.T) {
	for _, tt := range []struct {
		name, path, body string
		wantEnd          string
	}{
		{"chat", "/v1/chat/completions", chatBody("gpt-x", 5, true, true, prompt),
			`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-x","choices":[{"index":0,"delta":{},"finish_reason":"length"}],` +
				`"rlfn":{"reason":"budget","message":"the token budget org.tokens ran out: the response is cut","output_tokens":20}}` + "\n\ndata: [DONE]\n\n"},
		{"responses", "/v1/responses", responsesBody("gpt-x", 5, true, prompt),
			"event: response.incomplete\ndata: {\"response\":{\"id\":\"resp_1\",\"incomplete_details\":{\"reason\":\"max_output_tokens\"},\"model\":\"gpt-x\",\"object\":\"response\",\"status\":\"incomplete\"}," +
				`"rlfn":{"reason":"budget","message":"the token budget org.tokens ran out: the response is cut","output_tokens":20},"sequence_number":23,"type":"response.incomplete"}` + "\n\n"},
		{"messages", "/v1/messages", messagesBody("claude-x", 5, true, prompt),
			"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":20}," +
				`"rlfn":{"reason":"budget","message":"the token budget org.tokens ran out: the response is cut","output_tokens":20}}` + "\n\n" +
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			in := Bytes4("", mustParse(t, tt.path, tt.body).Text)
			f := newFake(map[string]int64{"org.tokens": in + 20})
			up := &upstream{Words: 100, Gap: time.Millisecond}
			_, srv := proxy(t, f, up, Options{})
			resp, body := post(t, srv, tt.path, "acme", tt.body)
			if resp.StatusCode != 200 || !strings.HasSuffix(body, tt.wantEnd) {
				t.Fatalf("%d\n%s\nwant it to end with\n%s", resp.StatusCode, body, tt.wantEnd)
			}
			if n := strings.Count(body, `tok `); n != 20 {
				t.Errorf("%d deltas passed on, want the 20 granted", n)
			}
			if got := f.settledAfter(t, 1); got != fmt.Sprint([][]int64{{1, in + 20}}) {
				t.Errorf("settled %s, want tokens %d", got, in+20)
			}
			deadline := time.Now().Add(5 * time.Second)
			for up.cancelled.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if up.cancelled.Load() != 1 || up.finished.Load() != 0 {
				t.Errorf("upstream: %d cancelled, %d finished; want its request cancelled", up.cancelled.Load(), up.finished.Load())
			}
		})
	}
}

// A stream whose Limiter fails to grant more is cut too (never run unmetered), saying so, and
// the failure is reported.
func TestCutByLimiter(t *testing.T) {
	f := newFake(nil)
	f.takeErr = errors.New("connection refused")
	var reported []error
	_, srv := proxy(t, f, &upstream{Words: 30}, Options{OnError: func(_ *http.Request, err error) { reported = append(reported, err) }})
	_, body := post(t, srv, "/v1/chat/completions", "acme", chatBody("gpt-x", 5, true, false, prompt))
	if !strings.Contains(body, `"rlfn":{"reason":"limiter"`) || !strings.HasSuffix(body, "data: [DONE]\n\n") || strings.Contains(body, "tok ") {
		t.Errorf("body:\n%s", body)
	}
	if len(reported) != 1 || !strings.Contains(reported[0].Error(), "connection refused") {
		t.Errorf("reported %v", reported)
	}
}

// A refused request is answered in its API's error format: 429 and Retry-After for a rate,
// QuotaStatus for a quota; it never reaches the upstream.
func TestDenied(t *testing.T) {
	for _, tt := range []struct {
		name, path, body string
		limit            client.Limit
		status           int // Options.QuotaStatus
		wantCode         int
		wantBody         string
		wantRetry        string
	}{
		{"rate, OpenAI", "/v1/chat/completions", chatBody("gpt-x", 100, false, false, prompt), hourly, 0, 429,
			`{"error":{"message":"llmlimit: rate limit org.tokens reached, retry after 1.5s","type":"rate_limit_exceeded","param":null,"code":"rate_limit_exceeded"}}`, "2"},
		{"quota, OpenAI", "/v1/chat/completions", chatBody("gpt-x", 100, false, false, prompt), monthly, 0, 402,
			`{"error":{"message":"llmlimit: quota org.tokens exhausted","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`, ""},
		{"rate, Anthropic", "/v1/messages", messagesBody("claude-x", 100, false, prompt), hourly, 0, 429,
			`{"type":"error","error":{"type":"rate_limit_error","message":"llmlimit: rate limit org.tokens reached, retry after 1.5s"}}`, "2"},
		{"quota, Anthropic", "/v1/messages", messagesBody("claude-x", 100, false, prompt), monthly, 0, 402,
			`{"type":"error","error":{"type":"billing_error","message":"llmlimit: quota org.tokens exhausted"}}`, ""},
		{"quota 403, Anthropic", "/v1/messages", messagesBody("claude-x", 100, false, prompt), monthly, 403, 403,
			`{"type":"error","error":{"type":"permission_error","message":"llmlimit: quota org.tokens exhausted"}}`, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := &upstream{Words: 3}
			f := newFake(map[string]int64{"org.tokens": 50})
			_, srv := proxy(t, f, up, Options{QuotaStatus: tt.status,
				Budgets: []Budget{{Name: "org", Key: orgKey, Requests: hourly, Tokens: tt.limit}}})
			resp, body := post(t, srv, tt.path, "acme", tt.body)
			if resp.StatusCode != tt.wantCode || body != tt.wantBody+"\n" || resp.Header.Get("Retry-After") != tt.wantRetry {
				t.Errorf("%d %q Retry-After %q\nwant %d %s", resp.StatusCode, body, resp.Header.Get("Retry-After"), tt.wantCode, tt.wantBody)
			}
			if len(f.settled) != 0 || up.finished.Load() != 0 {
				t.Errorf("a refused request was served")
			}
		})
	}
}

// Requests the middleware cannot count are answered 400 (413, 404) and never reach the
// upstream; a GET (a list of models) passes.
func TestBadRequests(t *testing.T) {
	up := &upstream{Words: 3}
	f := newFake(nil)
	var reported []error
	_, srv := proxy(t, f, up, Options{MaxBody: 4096, Prices: map[string]Price{"gpt-x": {Input: 1, Output: 4}},
		OnError: func(_ *http.Request, err error) { reported = append(reported, err) },
		Budgets: []Budget{{Name: "org", Key: orgKey, Spend: monthly}}})
	for _, tt := range []struct {
		name, path, org, body string
		want                  int
		wantType              string
	}{
		{"not JSON", "/v1/chat/completions", "acme", "{", 400, "invalid_request_error"},
		{"max_tokens a string", "/v1/chat/completions", "acme", `{"model":"gpt-x","max_tokens":"9"}`, 400, "invalid_request_error"},
		{"max_tokens negative", "/v1/chat/completions", "acme", `{"model":"gpt-x","max_tokens":-9}`, 400, "invalid_request_error"},
		{"no principal", "/v1/chat/completions", "", chatBody("gpt-x", 10, false, false, prompt), 400, "invalid_request_error"},
		{"no price", "/v1/chat/completions", "acme", chatBody("gpt-y", 10, false, false, prompt), 400, "invalid_request_error"},
		{"estimate too large", "/v1/chat/completions", "acme", chatBody("gpt-x", 1<<62, false, false, prompt), 400, "invalid_request_error"},
		{"too large", "/v1/chat/completions", "acme", chatBody("gpt-x", 10, false, false, strings.Repeat("x", 5000)), 413, "request_too_large"},
		{"not an LLM call", "/v1/embeddings", "acme", `{}`, 404, "not_found"},
		{"Anthropic's format", "/v1/messages", "acme", "{", 400, `{"type":"error","error":{"type":"invalid_request_error"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := post(t, srv, tt.path, tt.org, tt.body)
			if resp.StatusCode != tt.want || !strings.Contains(body, tt.wantType) {
				t.Errorf("%d %s; want %d %s", resp.StatusCode, body, tt.want, tt.wantType)
			}
		})
	}
	resp, err := srv.Client().Get(srv.URL + "/v1/models")
	if err != nil || resp.StatusCode != 400 { // the fake upstream answers 400 to whatever it does not serve
		t.Errorf("GET: %v %v; want it passed to the upstream", resp, err)
	}
	if len(f.opened) != 0 || len(reported) != 0 {
		t.Errorf("opened %d meters, reported %v; want none", len(f.opened), reported)
	}
}

// A Spend limit charges a request its tokens at its model's prices: the estimate holds the
// input estimate and max_tokens at the input and output prices; the settlement the usage's
// tokens, cache reads at their own price, or free.
func TestSpend(t *testing.T) {
	prices := map[string]Price{"claude-x": {Input: 3000, Output: 15000, CacheRead: 300, CacheWrite: 3750}}
	for _, cachedFree := range []bool{false, true} {
		up := &upstream{Words: 10, Cached: 4}
		f := newFake(nil)
		_, srv := proxy(t, f, up, Options{Prices: prices, CachedFree: cachedFree,
			Budgets: []Budget{{Name: "org", Key: orgKey, Spend: monthly}}})
		body := messagesBody("claude-x", 100, true, prompt)
		post(t, srv, "/v1/messages", "acme", body)
		in := Bytes4("", mustParse(t, "/v1/messages", body).Text)
		if got, want := f.opened[0][0].Cost, in*3000+100*15000; got != want {
			t.Errorf("estimate %d, want %d", got, want)
		}
		want := (in-4)*3000 + 4*300 + 10*15000
		if cachedFree {
			want -= 4 * 300
		}
		if got := f.settledAfter(t, 1); got != fmt.Sprint([][]int64{{want}}) {
			t.Errorf("cached free %v: settled %s, want %d", cachedFree, got, want)
		}
	}
}

// New refuses Options that cannot work, naming the field.
func TestNewRefuses(t *testing.T) {
	b := Budget{Name: "org", Key: orgKey, Tokens: hourly}
	for _, tt := range []struct {
		name  string
		give  Options
		field string
	}{
		{"no budget", Options{}, "Budgets"},
		{"no name", Options{Budgets: []Budget{{Key: orgKey, Tokens: hourly}}}, "Budgets[0].Name"},
		{"a bad name", Options{Budgets: []Budget{{Name: "o:rg", Key: orgKey, Tokens: hourly}}}, "Budgets[0].Name"},
		{"two names", Options{Budgets: []Budget{b, b}}, "Budgets[1].Name"},
		{"no key", Options{Budgets: []Budget{{Name: "org", Tokens: hourly}}}, "Budgets[0].Key"},
		{"no limit", Options{Budgets: []Budget{{Name: "org", Key: orgKey}}}, "Budgets[0]"},
		{"a sliding log", Options{Budgets: []Budget{{Name: "org", Key: orgKey, Tokens: client.SlidingLog{Limit: 5, Window: time.Second}}}}, "Budgets[0].Tokens"},
		{"a bad limit", Options{Budgets: []Budget{{Name: "org", Key: orgKey, Requests: client.FixedWindow{Limit: 5}}}}, "Budgets[0].Requests"},
		{"a nil pointer", Options{Budgets: []Budget{{Name: "org", Key: orgKey, Requests: (*client.FixedWindow)(nil)}}}, "Budgets[0].Requests"},
		{"spend without prices", Options{Budgets: []Budget{{Name: "org", Key: orgKey, Spend: monthly}}}, "Prices"},
		{"a negative price", Options{Budgets: []Budget{b}, Prices: map[string]Price{"m": {Input: -1}}}, `Prices["m"]`},
		{"quota status 429", Options{Budgets: []Budget{b}, QuotaStatus: 429}, "QuotaStatus"},
		{"negative TTL", Options{Budgets: []Budget{b}, HoldTTL: -1}, "HoldTTL"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, err := newMiddleware(newFake(nil), tt.give)
			var ce *ConfigError
			if m != nil || !errors.As(err, &ce) || ce.Field != tt.field {
				t.Errorf("%v, %v; want a *ConfigError of %s", m, err, tt.field)
			}
		})
	}
}

// Each limit of a Budget is named by what it counts unless it has a Name: two Calendars (a
// month's tokens and spend) on one key are two limiters.
func TestLimitsNamed(t *testing.T) {
	f := newFake(nil)
	m, err := newMiddleware(f, Options{Prices: map[string]Price{"m": {Input: 1, Output: 1}},
		Budgets: []Budget{{Name: "org", Key: orgKey, Tokens: monthly, Spend: &client.Calendar{Limit: 10, Period: client.Month, Name: "dollars"}}}})
	if err != nil {
		t.Fatal(err)
	}
	got := []string{m.opts.Budgets[0].Tokens.(client.Calendar).Name, m.opts.Budgets[0].Spend.(client.Calendar).Name}
	if fmt.Sprint(got) != "[tokens dollars]" {
		t.Errorf("names %v", got)
	}
}

// With AskUsage, a chat completions stream whose client did not ask for usage is charged its
// usage (here its cached tokens free), and the client gets the stream as it asked for it,
// without the usage chunk.
func TestAskUsage(t *testing.T) {
	for _, ask := range []bool{false, true} {
		up := &upstream{Words: 12, Cached: 2}
		f := newFake(nil)
		_, srv := proxy(t, f, up, Options{AskUsage: ask, CachedFree: true})
		body := chatBody("gpt-x", 10, true, false, prompt)
		resp, got := post(t, srv, "/v1/chat/completions", "acme", body)
		if want := direct(t, up, "/v1/chat/completions", body); resp.StatusCode != 200 || got != want {
			t.Fatalf("ask %v: %d\n%s\nwant\n%s", ask, resp.StatusCode, got, want)
		}
		in := Bytes4("", mustParse(t, "/v1/chat/completions", body).Text)
		want := in + 12 // the estimate of the input: no usage came
		if ask {
			want = in - 2 + 12 // the usage's, its 2 cached tokens free
		}
		if got := f.settledAfter(t, 1); got != fmt.Sprint([][]int64{{1, want}}) {
			t.Errorf("ask %v: settled %s, want tokens %d", ask, got, want)
		}
	}
	// A client that asked for usage gets it, whatever AskUsage says.
	up := &upstream{Words: 3}
	_, srv := proxy(t, newFake(nil), up, Options{AskUsage: true})
	body := chatBody("gpt-x", 10, true, true, prompt)
	if _, got := post(t, srv, "/v1/chat/completions", "acme", body); got != direct(t, up, "/v1/chat/completions", body) || !strings.Contains(got, `"usage"`) {
		t.Errorf("usage asked for by the client:\n%s", got)
	}
}

// A chat completion of n choices holds its maximum for each.
func TestChoices(t *testing.T) {
	f := newFake(nil)
	_, srv := proxy(t, f, &upstream{Words: 3}, Options{})
	body := strings.Replace(chatBody("gpt-x", 100, false, false, prompt), `"max_tokens":100`, `"max_tokens":100,"n":3`, 1)
	post(t, srv, "/v1/chat/completions", "acme", body)
	in := Bytes4("", mustParse(t, "/v1/chat/completions", body).Text)
	if got := f.opened[0][1].Cost; got != in+300 {
		t.Errorf("estimate %d, want %d", got, in+300)
	}
	resp, _ := post(t, srv, "/v1/chat/completions", "acme", strings.Replace(body, `"n":3`, `"n":0`, 1))
	if resp.StatusCode != 400 {
		t.Errorf("n 0: %d, want 400", resp.StatusCode)
	}
}

// A client that accepts a compressed response cannot have its stream passed through unread:
// the upstream is asked for it as the proxy's transport asks (and decompresses), and the
// stream is metered and cut as any.
func TestCompressedUpstream(t *testing.T) {
	body := chatBody("gpt-x", 5, true, false, prompt)
	in := Bytes4("", mustParse(t, "/v1/chat/completions", body).Text)
	f := newFake(map[string]int64{"org.tokens": in + 10})
	_, srv := proxy(t, f, &upstream{Words: 50}, Options{})
	req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("X-Org", "acme")
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if n := strings.Count(string(b), "tok "); resp.Header.Get("Content-Encoding") != "" || n != 10 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Errorf("Content-Encoding %q, %d tokens passed on, want 10 and the end:\n%s", resp.Header.Get("Content-Encoding"), n, b)
	}
}

// A stream in an encoding the proxy's transport does not decode (brotli) cannot be read: it is
// passed on as it is, and charged its estimate.
func TestCompressedAnyway(t *testing.T) {
	body := chatBody("gpt-x", 5, true, false, prompt)
	in := Bytes4("", mustParse(t, "/v1/chat/completions", body).Text)
	f := newFake(nil)
	_, srv := proxy(t, f, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Encoding", "br")
		w.Write([]byte("\x1b\x00\x00 not readable"))
	}), Options{})
	resp, got := post(t, srv, "/v1/chat/completions", "acme", body)
	if settled := f.settledAfter(t, 1); resp.StatusCode != 200 || got != "\x1b\x00\x00 not readable" || settled != fmt.Sprint([][]int64{{1, in + 5}}) {
		t.Errorf("%d %q, settled %s; want it passed on, the estimate %d", resp.StatusCode, got, settled, in+5)
	}
}

// A client that goes away mid-stream ends the upstream's request too, and the request is
// charged the output it was sent; an upstream handler that panics is settled before the panic
// goes on.
func TestClientGoneAndPanic(t *testing.T) {
	body := chatBody("gpt-x", 5, true, false, prompt)
	in := Bytes4("", mustParse(t, "/v1/chat/completions", body).Text)
	f := newFake(nil)
	up := &upstream{Words: 1000, Gap: time.Millisecond}
	_, srv := proxy(t, f, up, Options{})
	req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("X-Org", "acme")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2000)
	n, _ := io.ReadAtLeast(resp.Body, buf, 1500)
	resp.Body.Close() // gone, 1000 tokens before the end
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.mu.Lock()
		settled := append([][]int64(nil), f.settled...)
		f.mu.Unlock()
		if len(settled) == 1 {
			out := settled[0][1] - in
			if out < int64(strings.Count(string(buf[:n]), "tok ")) || out >= 1000 {
				t.Errorf("charged %d output tokens; the client read %d of 1000", out, strings.Count(string(buf[:n]), "tok "))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not settled")
		}
		time.Sleep(time.Millisecond)
	}
	for up.cancelled.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if up.cancelled.Load() != 1 {
		t.Error("the upstream's request was not cancelled")
	}

	f = newFake(nil)
	m, err := newMiddleware(f, Options{Budgets: []Budget{{Name: "org", Key: orgKey, Tokens: hourly}}})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok tok \"}}]}\n\n")
		panic("upstream")
	}))
	r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
	r.Header.Set("X-Org", "acme")
	func() {
		defer func() {
			if v := recover(); v != "upstream" {
				t.Errorf("recovered %v, want the upstream's panic", v)
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	if got := fmt.Sprint(f.settled); got != fmt.Sprint([][]int64{{in + 2}}) {
		t.Errorf("after a panic: settled %s, want %d", got, in+2)
	}
}
