package playground_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/internal/playground"
	"github.com/rlfn/rlfn/versions"
)

type decision struct {
	At           float64 `json:"at"`
	Allowed      bool    `json:"allowed"`
	Limit        int64   `json:"limit"`
	Remaining    int64   `json:"remaining"`
	RetryAfterMs int64   `json:"retryAfterMs"`
	ResetAfterMs int64   `json:"resetAfterMs"`
	DelayMs      int64   `json:"delayMs"`
	Blocked      bool    `json:"blocked"`
	WindowEnd    float64 `json:"windowEnd"`
}

// cardInfo is what the status tells the page of a card.
type cardInfo struct {
	ID       string           `json:"id"`
	Defaults map[string]int64 `json:"defaults"`
	Penalty  *struct {
		Name     string `json:"name"`
		Min      int64  `json:"min"`
		Max      int64  `json:"max"`
		Default  int64  `json:"default"`
		BlockKey string `json:"blockKey"`
	} `json:"penalty"`
	Calendar *struct {
		Period    string  `json:"period"`
		Zone      string  `json:"zone"`
		WindowEnd float64 `json:"windowEnd"`
	} `json:"calendar"`
}

type reply struct {
	code int
	raw  string
	body struct {
		Error     string                `json:"error"`
		Absent    bool                  `json:"absent"`
		Deploy    string                `json:"deploy"`
		Loaded    bool                  `json:"loaded"`
		Version   string                `json:"version"`
		Server    string                `json:"server"`
		Decisions []decision            `json:"decisions"`
		Deleted   bool                  `json:"deleted"`
		Key       string                `json:"key"`
		Edge      float64               `json:"edge"`
		Warning   string                `json:"warning"`
		ByCard    map[string][]decision `json:"byCard"`
		Cards     []cardInfo            `json:"cards"`
		Now       float64               `json:"now"`
	}
}

// cardParams are the params of a card's kind: window's for the window cards, bucket's for
// the buckets, the limit alone for the calendar (its period is the card's, its anchor zero).
func cardParams(card playground.Card, window, bucket, calendar string) string {
	switch {
	case strings.HasPrefix(string(card), "token") || strings.HasPrefix(string(card), "leaky"):
		return bucket
	case card == playground.Calendar:
		return calendar
	}
	return window
}

// do sends one request to the page's server: a POST of body as JSON unless body is nil.
func do(t *testing.T, method, url, body string, header ...string) reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
		} else {
			req.Header.Set(header[i], header[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	r := reply{code: resp.StatusCode, raw: string(b)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(b, &r.body); err != nil {
			t.Fatalf("%s %s: %v\n%s", method, url, err, b)
		}
	}
	return r
}

func post(t *testing.T, url, body string) reply { return do(t, http.MethodPost, url, body) }

// serverTime is the server's TIME in Unix milliseconds.
func serverTime(t *testing.T, vk valkey.Client) float64 {
	t.Helper()
	parts, err := vk.Do(context.Background(), vk.B().Time().Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	sec, _ := strconv.ParseInt(parts[0], 10, 64)
	us, _ := strconv.ParseInt(parts[1], 10, 64)
	return float64(sec*1e6+us) / 1000
}

func dbsize(t *testing.T, vk valkey.Client) int64 {
	t.Helper()
	n, err := vk.Do(context.Background(), vk.B().Dbsize().Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func count(ds []decision) (admitted, denied int) {
	for _, d := range ds {
		if d.Allowed {
			admitted++
		} else {
			denied++
		}
	}
	return admitted, denied
}

// TestAPISend: a burst decides as a service's calls would, on the card's key, each decision
// stamped with the server's time.
func TestAPISend(t *testing.T) {
	for _, server := range servers {
		t.Run(server.name, func(t *testing.T) { testSend(t, servedOn(t, server.start, true)) })
	}
}

func testSend(t *testing.T, e env) {

	st := do(t, http.MethodGet, e.page+"/api/status", "")
	if st.code != 200 || !st.body.Loaded || st.body.Version != workingVersion || st.body.Server != e.url {
		t.Fatalf("status: %d %s", st.code, st.raw)
	}

	before := serverTime(t, e.vk)
	r := post(t, e.page+"/api/send", `{"card":"token_bucket","params":{"capacity":5,"rate":1,"periodMs":60000},"n":10}`)
	after := serverTime(t, e.vk)
	if r.code != 200 {
		t.Fatalf("send: %d %s", r.code, r.raw)
	}
	ds := r.body.Decisions
	if a, d := count(ds); a != 5 || d != 5 || len(ds) != 10 {
		t.Fatalf("a burst of 10 on a capacity of 5: %d admitted, %d denied, want 5 and 5\n%s", a, d, r.raw)
	}
	for i, d := range ds {
		if d.Allowed != (i < 5) || d.Remaining != max(0, int64(4-i)) || d.Limit != 5 {
			t.Errorf("decision %d = %+v", i, d)
		}
		if !d.Allowed && (d.RetryAfterMs <= 0 || d.RetryAfterMs > 60000) {
			t.Errorf("denied decision %d retries after %dms", i, d.RetryAfterMs)
		}
		// The stamp is the server's clock, read through TIME, within half a round trip.
		const slack = 5
		if d.At < before-slack || d.At > after+slack {
			t.Errorf("decision %d stamped %.3f, outside the server's TIME %.3f..%.3f", i, d.At, before, after)
		}
		if i > 0 && d.At < ds[i-1].At {
			t.Errorf("decision %d stamped %.3f, before decision %d at %.3f", i, d.At, i-1, ds[i-1].At)
		}
	}

	// The card's state is a service's: the client, with the playground's prefix, sees it.
	key := playground.TokenBucket.Key()
	if key != "rlfn:playground:{token_bucket}:token_bucket" {
		t.Errorf("token bucket key %q", key)
	}
	lim := harness.NewLimiter(t, e.vk, client.Options{Prefix: playground.Prefix})
	res, err := lim.Peek(context.Background(), "token_bucket", client.TokenBucket{Capacity: 5, Rate: 1, Period: time.Minute})
	if err != nil || res.Allowed || res.Remaining != 0 {
		t.Errorf("a service's peek after the burst: %+v, %v; want denied, 0 remaining", res, err)
	}
	if n := dbsize(t, e.vk); n != 1 {
		t.Errorf("the server holds %d keys after one card's burst, want 1", n)
	}

	// shape mode: admitted with growing delays, then denied when the queue is full
	r = post(t, e.page+"/api/send", `{"card":"leaky_shape","params":{"capacity":3,"rate":1,"periodMs":1000},"n":5}`)
	if r.code != 200 || len(r.body.Decisions) != 5 {
		t.Fatalf("send leaky_shape: %d %s", r.code, r.raw)
	}
	for i, d := range r.body.Decisions[:3] {
		if !d.Allowed || d.DelayMs < int64(i)*1000-50 || d.DelayMs > int64(i)*1000 {
			t.Errorf("shaped decision %d = %+v, want admitted with a delay of about %ds", i, d, i)
		}
	}
	if a, _ := count(r.body.Decisions); a != 3 {
		t.Errorf("shape mode with a queue of 3 admitted %d of 5", a)
	}
	// police mode on its own card: its own key, not the shape card's level
	r = post(t, e.page+"/api/send", `{"card":"leaky_police","params":{"capacity":3,"rate":1,"periodMs":1000},"n":1}`)
	if r.code != 200 || !r.body.Decisions[0].Allowed || r.body.Decisions[0].Remaining != 2 {
		t.Errorf("police after shape: %d %s; want admitted with 2 remaining (a key of its own)", r.code, r.raw)
	}
}

// TestAPIReset deletes the card's key and nothing else: not another card's, not a service's
// limiter of the same name under the client's default prefix, not an unrelated key.
func TestAPIReset(t *testing.T) {
	e := served(t, true)
	ctx := context.Background()
	tb := `{"card":"token_bucket","params":{"capacity":5,"rate":1,"periodMs":60000},"n":3}`
	if r := post(t, e.page+"/api/send", tb); r.code != 200 {
		t.Fatalf("send: %d %s", r.code, r.raw)
	}
	if r := post(t, e.page+"/api/send", `{"card":"fixed_window","params":{"limit":5,"windowMs":60000},"n":1}`); r.code != 200 {
		t.Fatalf("send: %d %s", r.code, r.raw)
	}
	service := harness.NewLimiter(t, e.vk, client.Options{}) // the default prefix, rl:
	if _, err := service.Allow(ctx, "token_bucket", client.TokenBucket{Capacity: 5, Rate: 1, Period: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"other", "rlfn:playground:other", "rlfn:playground:{token_bucket}:token_bucket:x"} {
		if err := e.vk.Do(ctx, e.vk.B().Set().Key(k).Value("v").Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	if n := dbsize(t, e.vk); n != 6 {
		t.Fatalf("%d keys before the reset, want 6", n)
	}

	r := post(t, e.page+"/api/reset", `{"card":"token_bucket"}`)
	if r.code != 200 || !r.body.Deleted || r.body.Key != playground.TokenBucket.Key() {
		t.Fatalf("reset: %d %s", r.code, r.raw)
	}
	keys, err := e.vk.Do(ctx, e.vk.B().Keys().Pattern("*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"other": true, "rlfn:playground:other": true, "rlfn:playground:{token_bucket}:token_bucket:x": true,
		"rl:{token_bucket}:token_bucket": true, playground.FixedWindow.Key(): true}
	if len(keys) != len(want) {
		t.Errorf("keys after the reset %q, want %d: only the token bucket card's gone", keys, len(want))
	}
	for _, k := range keys {
		if !want[k] {
			t.Errorf("key %q left after the reset", k)
		}
	}

	// The card starts afresh: a full bucket again.
	r = post(t, e.page+"/api/send", tb)
	if r.code != 200 || r.body.Decisions[0].Remaining != 4 {
		t.Errorf("send after reset: %d %s; want a full bucket (4 remaining after one)", r.code, r.raw)
	}
	post(t, e.page+"/api/reset", `{"card":"token_bucket"}`)
	if r := post(t, e.page+"/api/reset", `{"card":"token_bucket"}`); r.code != 200 || r.body.Deleted {
		t.Errorf("second reset: %d %s; want 200, nothing deleted", r.code, r.raw)
	}
}

// TestAPICalendar: the calendar card's status gives an anchor a minute or two ahead and the
// end of its window; a send admits up to the limit in the window that holds the server's now,
// each decision naming the window's end; once the anchor's clock time passes, a new window
// (a day long) admits again. The test's anchor is a few seconds ahead, as the page's would
// be after a minute.
func TestAPICalendar(t *testing.T) {
	e := served(t, true)
	st := do(t, http.MethodGet, e.page+"/api/status", "")
	var cal *cardInfo
	for i, c := range st.body.Cards {
		if c.ID == "calendar" {
			cal = &st.body.Cards[i]
		}
	}
	if cal == nil || cal.Calendar == nil || cal.Calendar.Period != "day" || cal.Calendar.Zone != "UTC" {
		t.Fatalf("status: no calendar card of a day in UTC: %s", st.raw)
	}
	anchor := cal.Defaults["anchorMs"]
	if ahead := float64(anchor) - st.body.Now; ahead < 59000 || ahead > 121000 || anchor%60000 != 0 || cal.Calendar.WindowEnd != float64(anchor) {
		t.Errorf("status: anchor %d, %.0fms ahead of the server's %.0f, window end %.0f; want a whole minute 1 to 2 minutes ahead, the window's end",
			anchor, ahead, st.body.Now, cal.Calendar.WindowEnd)
	}

	end := int64(serverTime(t, e.vk)) + 2500
	send := func(n int) []decision {
		t.Helper()
		r := post(t, e.page+"/api/send", `{"card":"calendar","params":{"limit":3,"anchorMs":`+strconv.FormatInt(end, 10)+`},"n":`+strconv.Itoa(n)+`}`)
		if r.code != 200 || len(r.body.Decisions) != n {
			t.Fatalf("send: %d %s", r.code, r.raw)
		}
		return r.body.Decisions
	}
	ds := send(4)
	if a, d := count(ds); a != 3 || d != 1 {
		t.Errorf("4 on a calendar of 3: %d admitted, %d denied", a, d)
	}
	for i, d := range ds {
		if d.WindowEnd != float64(end) {
			t.Errorf("decision %d: window end %.0f, want the anchor %d", i, d.WindowEnd, end)
		}
	}
	if d := ds[3]; d.RetryAfterMs <= 0 || d.RetryAfterMs > 2500 || float64(d.RetryAfterMs) < float64(end)-d.At-50 {
		t.Errorf("the denial %+v: want retry after the window's end, %.0fms away", d, float64(end)-d.At)
	}
	if k := playground.Calendar.Key(); k != "rlfn:playground:{calendar}:calendar" {
		t.Errorf("calendar key %q", k)
	}
	time.Sleep(time.Duration(float64(end)-serverTime(t, e.vk)+100) * time.Millisecond)
	ds = send(1)
	if d := ds[0]; !d.Allowed || d.Remaining != 2 || d.WindowEnd != float64(end+86400000) {
		t.Errorf("after the window's end: %+v; want admitted in a new window ending a day later", d)
	}
	if r := post(t, e.page+"/api/send", `{"card":"calendar","params":{"limit":3,"periodMs":1000},"n":1}`); r.code != 400 || !strings.Contains(r.body.Error, "does not apply to calendar") {
		t.Errorf("a calendar with a period of its own: %d %s", r.code, r.raw)
	}
}

// TestAPIPenalty: with penaltyMs, the fixed window card's denial blocks its key (the block
// key next to its limiter's); its calls are refused as blocked until the block ends; Reset
// deletes both keys.
func TestAPIPenalty(t *testing.T) {
	e := served(t, true)
	st := do(t, http.MethodGet, e.page+"/api/status", "")
	for _, c := range st.body.Cards {
		if (c.Penalty != nil) != (c.ID == "fixed_window") {
			t.Errorf("card %s: penalty switch %+v", c.ID, c.Penalty)
		}
		if c.Penalty != nil && (c.Penalty.Name != "penaltyMs" || c.Penalty.BlockKey != playground.FixedWindow.BlockKey() || c.Penalty.Min != 1) {
			t.Errorf("the switch: %+v", *c.Penalty)
		}
	}
	body := `{"card":"fixed_window","params":{"limit":2,"windowMs":500,"penaltyMs":1500},"n":4}`
	// The four calls must fall in one window of 500ms (windows are aligned to the server's
	// clock): start well before a window's end, or the third is admitted by the next one.
	if ms := int64(serverTime(t, e.vk)) % 500; ms > 300 {
		time.Sleep(time.Duration(510-ms) * time.Millisecond)
	}
	r := post(t, e.page+"/api/send", body)
	if r.code != 200 || len(r.body.Decisions) != 4 {
		t.Fatalf("send: %d %s", r.code, r.raw)
	}
	ds := r.body.Decisions
	if !ds[0].Allowed || !ds[1].Allowed || ds[2].Allowed || !ds[2].Blocked || ds[2].RetryAfterMs != 1500 || !ds[3].Blocked || ds[3].Limit != 0 {
		t.Errorf("2 admitted, then blocked for 1500ms: %s", r.raw)
	}
	ttl, err := e.vk.Do(context.Background(), e.vk.B().Pttl().Key(playground.FixedWindow.BlockKey()).Build()).AsInt64()
	if err != nil || ttl <= 0 || ttl > 1500 {
		t.Errorf("the block key's PTTL %d, %v", ttl, err)
	}
	// the window (500ms) ends before the block: still blocked
	time.Sleep(600 * time.Millisecond)
	if r := post(t, e.page+"/api/send", body); r.code != 200 || !r.body.Decisions[0].Blocked {
		t.Errorf("after the window, within the block: %s", r.raw)
	}
	time.Sleep(1000 * time.Millisecond)
	if r := post(t, e.page+"/api/send", body); r.code != 200 || !r.body.Decisions[0].Allowed || r.body.Decisions[0].Blocked {
		t.Errorf("after the block: %s", r.raw)
	}
	// a new block, then Reset: both keys go
	post(t, e.page+"/api/send", body)
	if n := dbsize(t, e.vk); n != 2 {
		t.Errorf("%d keys, want the limiter's and the block's", n)
	}
	if r := post(t, e.page+"/api/reset", `{"card":"fixed_window"}`); r.code != 200 || !r.body.Deleted {
		t.Errorf("reset: %d %s", r.code, r.raw)
	}
	if n := dbsize(t, e.vk); n != 0 {
		t.Errorf("%d keys after the reset, want none", n)
	}
	if r := post(t, e.page+"/api/send", body); r.code != 200 || !r.body.Decisions[0].Allowed {
		t.Errorf("after the reset: %s", r.raw)
	}
	if r := post(t, e.page+"/api/send", `{"card":"fixed_window","params":{"limit":2,"windowMs":500,"penaltyMs":-1},"n":1}`); r.code != 400 || !strings.Contains(r.body.Error, "params.penaltyMs") {
		t.Errorf("a negative penalty: %d %s", r.code, r.raw)
	}
}

// TestAPIForeignState: a card's key that holds something else is the library's RLERR, shown
// as such (409), and left as it is until Reset deletes it.
func TestAPIForeignState(t *testing.T) {
	e := served(t, true)
	ctx := context.Background()
	key := playground.SlidingLog.Key()
	if err := e.vk.Do(ctx, e.vk.B().Set().Key(key).Value("not a log").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	send := `{"card":"sliding_log","params":{"limit":5,"windowMs":1000},"n":2}`
	r := post(t, e.page+"/api/send", send)
	if r.code != http.StatusConflict || !strings.Contains(r.body.Error, "RLERR") || !strings.Contains(r.body.Error, "Reset") {
		t.Fatalf("send on a foreign key: %d %s; want 409 naming RLERR and Reset", r.code, r.raw)
	}
	if v, _ := e.vk.Do(ctx, e.vk.B().Get().Key(key).Build()).ToString(); v != "not a log" {
		t.Errorf("the foreign value became %q", v)
	}
	post(t, e.page+"/api/reset", `{"card":"sliding_log"}`)
	if r := post(t, e.page+"/api/send", send); r.code != 200 || len(r.body.Decisions) != 2 {
		t.Errorf("send after reset: %d %s", r.code, r.raw)
	}
}

// TestAPIAbsentLibrary: without the library the status says so with the deploy command, and
// a call answers 503 with it; nothing is written.
func TestAPIAbsentLibrary(t *testing.T) {
	for _, server := range servers {
		t.Run(server.name, func(t *testing.T) { testAbsent(t, servedOn(t, server.start, false)) })
	}
}

func testAbsent(t *testing.T, e env) {
	st := do(t, http.MethodGet, e.page+"/api/status", "")
	deploy := "rlfn --url '" + e.url + "' deploy"
	if st.code != 200 || st.body.Loaded || !st.body.Absent || st.body.Deploy != deploy ||
		!strings.Contains(st.body.Error, "no ratelimit library") {
		t.Fatalf("status without the library: %d %s", st.code, st.raw)
	}
	r := post(t, e.page+"/api/send", `{"card":"fixed_window","params":{"limit":5,"windowMs":1000},"n":1}`)
	if r.code != http.StatusServiceUnavailable || !r.body.Absent || r.body.Deploy != deploy || !strings.Contains(r.body.Error, "not loaded") {
		t.Fatalf("send without the library: %d %s", r.code, r.raw)
	}
	// The boundary scenario says so at once, not after waiting for the edge of its minute.
	p := `{"limit":5,"windowMs":60000}`
	r = post(t, e.page+"/api/boundary", `{"fixed_window":`+p+`,"sliding_log":`+p+`,"sliding_window":`+p+`}`)
	if r.code != http.StatusServiceUnavailable || !r.body.Absent || r.body.Deploy != deploy {
		t.Fatalf("boundary without the library: %d %s", r.code, r.raw)
	}
	if n := dbsize(t, e.vk); n != 0 {
		t.Errorf("%d keys written without the library", n)
	}
}

// TestAPIBoundary: the fixed window admits twice its limit around its edge; the sliding log
// admits its limit, the sliding window about its limit.
func TestAPIBoundary(t *testing.T) {
	e := served(t, true)
	p := `{"limit":5,"windowMs":1000}`
	r := post(t, e.page+"/api/boundary", `{"fixed_window":`+p+`,"sliding_log":`+p+`,"sliding_window":`+p+`}`)
	if r.code != 200 {
		t.Fatalf("boundary: %d %s", r.code, r.raw)
	}
	edge := r.body.Edge
	if r.body.Warning != "" {
		t.Errorf("a warning on loopback: %s", r.body.Warning)
	}
	if int64(edge)%1000 != 0 {
		t.Errorf("edge %.3f is not a 1s window's edge", edge)
	}
	around := func(card string) (before, after int) {
		ds := r.body.ByCard[card]
		if len(ds) != 10 {
			t.Fatalf("%s: %d decisions, want two bursts of 5", card, len(ds))
		}
		for i, d := range ds {
			// Scheduled 100ms either side of the edge (a tenth of the window).
			if (i < 5) != (d.At < edge) || d.At < edge-150 || d.At > edge+150 {
				t.Errorf("%s: decision %d at %+.1fms from the edge", card, i, d.At-edge)
			}
			if d.Allowed && d.At < edge {
				before++
			} else if d.Allowed {
				after++
			}
		}
		return before, after
	}
	if b, a := around("fixed_window"); b != 5 || a != 5 {
		t.Errorf("fixed window admitted %d before the edge and %d after, want 5 and 5", b, a)
	}
	if b, a := around("sliding_log"); b != 5 || a != 0 {
		t.Errorf("sliding log admitted %d before the edge and %d after, want 5 and 0", b, a)
	}
	// 100ms into the window, the previous one still weighs 90%: 4.5 of 5 counted.
	if b, a := around("sliding_window"); b != 5 || a != 0 {
		t.Errorf("sliding window admitted %d before the edge and %d after, want 5 and 0", b, a)
	}
}

// TestAPIRefuses: every request but the API's own is refused with a clear error, and nothing is
// written to the server.
func TestAPIRefuses(t *testing.T) {
	e := served(t, true)
	tb := func(params string) string {
		return `{"card":"token_bucket","params":` + params + `,"n":1}`
	}
	window := `{"limit":5,"windowMs":1000}`
	// A valid request padded past 4KiB: only the bound on the body refuses it.
	big := `{"card":"token_bucket",` + strings.Repeat(" ", 5000) + `"params":{"capacity":5,"rate":1,"periodMs":1000},"n":1}`
	for _, c := range []struct {
		name, method, path, body string
		header                   []string
		code                     int
		want                     string
	}{
		{"negative capacity", "POST", "/api/send", tb(`{"capacity":-5,"rate":1,"periodMs":1000}`), nil, 400, "TokenBucket.Capacity must be from 1"},
		{"zero rate", "POST", "/api/send", tb(`{"capacity":5,"rate":0,"periodMs":1000}`), nil, 400, "TokenBucket.Rate must be from 1"},
		{"huge capacity", "POST", "/api/send", tb(`{"capacity":1000000000000000,"rate":1,"periodMs":1000}`), nil, 400, "must be from 1 to 999999999999999"},
		{"beyond int64", "POST", "/api/send", tb(`{"capacity":99999999999999999999,"rate":1,"periodMs":1000}`), nil, 400, "body is not valid"},
		{"NaN", "POST", "/api/send", tb(`{"capacity":"NaN","rate":1,"periodMs":1000}`), nil, 400, "body is not valid"},
		{"fraction", "POST", "/api/send", tb(`{"capacity":5.5,"rate":1,"periodMs":1000}`), nil, 400, "body is not valid"},
		{"period overflowing a Duration", "POST", "/api/send", tb(`{"capacity":5,"rate":1,"periodMs":9223372036854}`), nil, 400, "params.periodMs must be from 1 to 100000000000"},
		{"missing period", "POST", "/api/send", tb(`{"capacity":5,"rate":1}`), nil, 400, "params.periodMs must be from 1"},
		{"a window number on a bucket", "POST", "/api/send", tb(`{"capacity":5,"rate":1,"periodMs":1000,"limit":5}`), nil, 400, "params.limit does not apply to token_bucket"},
		{"sliding log over 100000", "POST", "/api/send", `{"card":"sliding_log","params":{"limit":100001,"windowMs":1000},"n":1}`, nil, 400, "SlidingLog.Limit must be from 1 to 100000"},
		{"a key with braces", "POST", "/api/send", `{"card":"{token_bucket}","params":{"capacity":5,"rate":1,"periodMs":1000},"n":1}`, nil, 400, `card must be one of`},
		{"a key of another prefix", "POST", "/api/reset", `{"card":"rl:{user:42}:token_bucket"}`, nil, 400, `card must be one of`},
		{"a wildcard", "POST", "/api/reset", `{"card":"*"}`, nil, 400, `card must be one of`},
		{"no card", "POST", "/api/reset", `{}`, nil, 400, `card must be one of`},
		{"a key field", "POST", "/api/send", `{"card":"token_bucket","key":"user:42","params":{"capacity":5,"rate":1,"periodMs":1000},"n":1}`, nil, 400, `unknown field "key"`},
		{"burst of 0", "POST", "/api/send", `{"card":"token_bucket","params":{"capacity":5,"rate":1,"periodMs":1000},"n":0}`, nil, 400, "n must be from 1 to 100, got 0"},
		{"burst of 101", "POST", "/api/send", `{"card":"token_bucket","params":{"capacity":5,"rate":1,"periodMs":1000},"n":101}`, nil, 400, "n must be from 1 to 100, got 101"},
		{"two objects", "POST", "/api/send", tb(`{"capacity":5,"rate":1,"periodMs":1000}`) + `{}`, nil, 400, "one JSON object only"},
		{"too large", "POST", "/api/send", big, nil, 400, "body is not valid: http: request body too large"},
		{"not JSON", "POST", "/api/send", `card=token_bucket`, nil, 400, "body is not valid"},
		{"a form", "POST", "/api/send", tb(`{"capacity":5,"rate":1,"periodMs":1000}`), []string{"Content-Type", "application/x-www-form-urlencoded"}, 400, "Content-Type must be application/json"},
		{"text/plain", "POST", "/api/reset", `{"card":"token_bucket"}`, []string{"Content-Type", "text/plain"}, 400, "Content-Type must be application/json"},
		{"boundary window too short", "POST", "/api/boundary", `{"fixed_window":{"limit":5,"windowMs":99},"sliding_log":` + window + `,"sliding_window":` + window + `}`, nil, 400, "params.fixed_window.windowMs must be from 100 to 60000"},
		{"boundary window too long", "POST", "/api/boundary", `{"fixed_window":{"limit":5,"windowMs":60001},"sliding_log":` + window + `,"sliding_window":` + window + `}`, nil, 400, "params.fixed_window.windowMs must be from 100 to 60000"},
		{"boundary limit too large", "POST", "/api/boundary", `{"fixed_window":` + window + `,"sliding_log":{"limit":101,"windowMs":1000},"sliding_window":` + window + `}`, nil, 400, "params.sliding_log.limit must be at most 100"},
		{"boundary without a card", "POST", "/api/boundary", `{"fixed_window":` + window + `,"sliding_log":` + window + `}`, nil, 400, "params.sliding_window.windowMs must be from 1"},
		{"another site's name (DNS rebinding)", "POST", "/api/send", tb(`{"capacity":5,"rate":1,"periodMs":1000}`), []string{"Host", "evil.example:8080"}, 403, "not a loopback address"},
		{"another site's name, the page", "GET", "/", "", []string{"Host", "evil.example"}, 403, "not a loopback address"},
		{"GET on an action", "GET", "/api/send", "", nil, 405, ""},
		{"another path", "GET", "/api/keys", "", nil, 404, ""},
		{"a file outside the page", "GET", "/web/index.html", "", nil, 404, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := do(t, c.method, e.page+c.path, c.body, c.header...)
			if r.code != c.code || !strings.Contains(r.body.Error, c.want) {
				t.Errorf("%d %s\nwant %d with an error containing %q", r.code, r.raw, c.code, c.want)
			}
		})
	}
	if n := dbsize(t, e.vk); n != 0 {
		t.Errorf("%d keys written by refused requests", n)
	}
	for _, host := range []string{"localhost:8080", "127.0.0.1", "[::1]:8080", "127.0.0.2:80", "LOCALHOST"} {
		if r := do(t, "GET", e.page+"/", "", "Host", host); r.code != 200 || !strings.Contains(r.raw, "<title>rlfn playground</title>") {
			t.Errorf("the page for Host %s: %d", host, r.code)
		}
	}
	r := do(t, "GET", e.page+"/", "")
	if csp := r.raw; r.code != 200 || !strings.Contains(csp, "playground.js") {
		t.Errorf("the page: %d", r.code)
	}
}

// TestRemote: with Options.Remote any Host is served.
func TestRemote(t *testing.T) {
	e := served(t, true)
	srv := newServer(t, e.vk, playground.Options{Remote: true})
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest("GET", "http://playground.example:8080/", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "<title>rlfn playground</title>") {
		t.Errorf("Remote: Host playground.example answered %d", rec.Code)
	}
}

// TestAPICluster: on a 3-shard Valkey cluster the cards' keys live in their own slots, every
// card decides, the boundary holds, Reset deletes one key; a primary without the library is
// named on the page.
func TestAPICluster(t *testing.T) {
	c := harness.StartCluster(t, 3, 0)
	for _, p := range c.Primaries[:2] {
		load(t, p.Client(t))
	}
	e := serve(t, c.Client(t, false), "redis://"+c.Primaries[0].Addr)
	missing := c.Primaries[2].Addr
	st := do(t, http.MethodGet, e.page+"/api/status", "")
	if st.body.Loaded || !st.body.Absent || !strings.Contains(st.body.Error, missing) {
		t.Fatalf("status with %s lacking the library: %s", missing, st.raw)
	}
	load(t, c.Primaries[2].Client(t))
	if st := do(t, http.MethodGet, e.page+"/api/status", ""); !st.body.Loaded || st.body.Version != workingVersion {
		t.Fatalf("status with the library everywhere: %s", st.raw)
	}

	window, bucket := `{"limit":3,"windowMs":60000}`, `{"capacity":3,"rate":1,"periodMs":60000}`
	for _, card := range playground.Cards {
		p := cardParams(card, window, bucket, `{"limit":3}`)
		r := post(t, e.page+"/api/send", `{"card":"`+string(card)+`","params":`+p+`,"n":5}`)
		if a, d := count(r.body.Decisions); r.code != 200 || a != 3 || d != 2 {
			t.Errorf("%s: %d, %d admitted, %d denied; want 3 and 2\n%s", card, r.code, a, d, r.raw)
		}
	}
	keys := func() map[string]bool {
		all := map[string]bool{}
		for _, p := range c.Primaries {
			vk := p.Client(t)
			ks, err := vk.Do(context.Background(), vk.B().Keys().Pattern("*").Build()).AsStrSlice()
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range ks {
				all[k] = true
			}
		}
		return all
	}
	if got := keys(); len(got) != len(playground.Cards) {
		t.Errorf("keys %v, want one per card", got)
	}
	if r := post(t, e.page+"/api/reset", `{"card":"leaky_shape"}`); r.code != 200 || !r.body.Deleted {
		t.Errorf("reset: %d %s", r.code, r.raw)
	}
	got := keys()
	if len(got) != len(playground.Cards)-1 || got[playground.LeakyShape.Key()] {
		t.Errorf("keys after the reset of leaky_shape %v", got)
	}

	p := `{"limit":5,"windowMs":1000}`
	r := post(t, e.page+"/api/boundary", `{"fixed_window":`+p+`,"sliding_log":`+p+`,"sliding_window":`+p+`}`)
	if r.code != 200 {
		t.Fatalf("boundary: %d %s", r.code, r.raw)
	}
	for card, want := range map[string]int{"fixed_window": 10, "sliding_log": 5, "sliding_window": 5} {
		if a, _ := count(r.body.ByCard[card]); a != want {
			t.Errorf("boundary on a cluster: %s admitted %d, want %d", card, a, want)
		}
	}
}

// playgroundACL is the user the README suggests for the playground: the service user's rules
// (README, "The Go client"), on the playground's keys only.
var playgroundACL = strings.Fields(`on >secret resetkeys ~rlfn:playground:* resetchannels -@all
	+fcall +fcall_ro +time +get +set +del +pexpireat
	+zadd +zcard +zcount +zrange +zrem +zremrangebyrank +zremrangebyscore +zscore`)

// TestAPIACLUser: every card, Reset and the boundary work for a user that may call the library
// on the playground's keys and nothing else.
func TestAPIACLUser(t *testing.T) {
	s := harness.StartValkey(t)
	admin := s.Client(t)
	load(t, admin)
	ctx := context.Background()
	if err := admin.Do(ctx, admin.B().AclSetuser().Username("playground").Rule(playgroundACL...).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{s.Addr}, Username: "playground", Password: "secret", DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vk.Close)
	e := serve(t, vk, "redis://playground@"+s.Addr)

	if st := do(t, http.MethodGet, e.page+"/api/status", ""); !st.body.Loaded {
		t.Fatalf("status: %s", st.raw)
	}
	window, bucket := `{"limit":3,"windowMs":1000,"penaltyMs":1000}`, `{"capacity":3,"rate":1,"periodMs":1000}`
	for _, card := range playground.Cards {
		p := cardParams(card, window, bucket, `{"limit":3}`)
		if card != playground.FixedWindow {
			p = strings.Replace(p, `,"penaltyMs":1000`, "", 1)
		}
		body := `{"card":"` + string(card) + `","params":` + p + `,"n":4}`
		if r := post(t, e.page+"/api/send", body); r.code != 200 || len(r.body.Decisions) != 4 {
			t.Errorf("%s: %d %s", card, r.code, r.raw)
		}
		if r := post(t, e.page+"/api/reset", `{"card":"`+string(card)+`"}`); r.code != 200 || !r.body.Deleted {
			t.Errorf("reset %s: %d %s", card, r.code, r.raw)
		}
	}
	if r := post(t, e.page+"/api/boundary", `{"fixed_window":`+window+`,"sliding_log":`+window+`,"sliding_window":`+window+`}`); r.code != 200 {
		t.Errorf("boundary: %d %s", r.code, r.raw)
	}
}

// TestAPITimeout: a server that does not answer within the deadline is shown as such (504),
// not as "context deadline exceeded" alone.
func TestAPITimeout(t *testing.T) {
	s := harness.StartValkey(t)
	vk := s.Client(t)
	load(t, vk)
	srv := httptest.NewServer(newServer(t, vk, playground.Options{Deadline: 300 * time.Millisecond}))
	t.Cleanup(srv.Close)
	pause := func(mode string) {
		t.Helper()
		// CLIENT PAUSE holds the clients' commands (writes, or all) for 1.5s.
		if err := vk.Do(context.Background(), vk.B().Arbitrary("CLIENT", "PAUSE", "1500", mode).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	const want = "the server did not answer within 300ms"
	// Writes held: TIME answers, the limiter's FCALL does not.
	pause("WRITE")
	r := post(t, srv.URL+"/api/send", `{"card":"token_bucket","params":{"capacity":5,"rate":1,"periodMs":1000},"n":1}`)
	if r.code != http.StatusGatewayTimeout || !strings.Contains(r.body.Error, want) || strings.Contains(r.body.Error, "TIME") {
		t.Errorf("send to a server holding writes: %d %s; want 504 and %q", r.code, r.raw, want)
	}
	pause("ALL")
	if st := do(t, http.MethodGet, srv.URL+"/api/status", ""); st.code != 200 || st.body.Loaded || !strings.Contains(st.body.Error, want) {
		t.Errorf("status of a paused server: %d %s; want 200, not loaded, and %q", st.code, st.raw, want)
	}
}

// TestAPIOldLibrary: on a server running 1.1.0 the cards of 1.1 work, while the calendar card
// and the penalty switch are refused (503) naming the node, its release and the one needed,
// with the deploy command; nothing is written for them.
func TestAPIOldLibrary(t *testing.T) {
	s := harness.StartValkey(t)
	vk := s.Client(t)
	v11, ok := versions.Embedded().Find("1.1.0")
	if !ok {
		t.Fatal("1.1.0 is not embedded")
	}
	if err := vk.Do(context.Background(), vk.B().FunctionLoad().Replace().FunctionCode(v11.Code).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	e := serve(t, vk, "redis://"+s.Addr)
	for _, body := range []string{
		`{"card":"calendar","params":{"limit":2},"n":1}`,
		`{"card":"fixed_window","params":{"limit":2,"windowMs":1000,"penaltyMs":1000},"n":1}`,
	} {
		r := post(t, e.page+"/api/send", body)
		if r.code != http.StatusServiceUnavailable || !r.body.Absent || !strings.Contains(r.body.Error, s.Addr) ||
			!strings.Contains(r.body.Error, "1.1.0") || !strings.Contains(r.body.Error, "1.2.0") || r.body.Deploy == "" {
			t.Errorf("%s on 1.1.0: %d %s", body, r.code, r.raw)
		}
	}
	if n := dbsize(t, vk); n != 0 {
		t.Errorf("%d keys written by refused calls", n)
	}
	if r := post(t, e.page+"/api/send", `{"card":"fixed_window","params":{"limit":2,"windowMs":1000},"n":1}`); r.code != 200 {
		t.Errorf("a 1.1 card on 1.1.0: %d %s", r.code, r.raw)
	}
}
