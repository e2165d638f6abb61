package playground

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/calendar"
	"github.com/rlfn/rlfn/internal/limitspec"
)

//go:embed web
var web embed.FS

// Options configure a Server. The zero value serves loopback clients with a 2s deadline.
type Options struct {
	// Deploy is the command the page shows when the library is absent; default "rlfn deploy".
	Deploy string
	// Server names the server on the page, e.g. its URL without its password; default none.
	Server string
	// Remote accepts requests whatever their Host header. By default only a loopback address
	// or localhost is accepted, so that a web page elsewhere cannot reach the playground
	// through a DNS name rebound to 127.0.0.1.
	Remote bool
	// Deadline bounds each call to the server; default 2s. The page is a person waiting, not
	// a service's hot path (the client's own default is 100ms).
	Deadline time.Duration
	// CalendarLead is how far ahead of the server's clock, when the page loads, the calendar
	// card's first window ends (rounded up to a whole second); default: the next whole minute
	// at least a minute ahead, so that the window rolls over while the page is watched.
	CalendarLead time.Duration
}

// Server is the playground's HTTP handler: the page, and an API that reaches nothing but the
// limiter functions and the cards' keys.
type Server struct {
	vk   valkey.Client
	lim  *client.Limiter
	opts Options
	mux  *http.ServeMux
	// boundaryMu is held by the boundary scenario that runs: a second one, from another tab,
	// would reset the cards under the first and send into its windows, and both would show
	// counts that mean nothing.
	boundaryMu sync.Mutex
}

// errBoundaryBusy refuses a boundary scenario while another one runs.
var errBoundaryBusy = errors.New("the boundary scenario is already running (from this page or another): try again when it ends")

// New returns the playground's handler, which calls the library through vk. The caller owns
// vk and closes it after the handler's last request. Its error is client.New's (a nil vk).
func New(vk valkey.Client, opts Options) (*Server, error) {
	if opts.Deploy == "" {
		opts.Deploy = "rlfn deploy"
	}
	if opts.Deadline <= 0 {
		opts.Deadline = 2 * time.Second
	}
	// ReturnError: the page shows what the server did, never a decision the client made up
	// without it.
	lim, err := client.New(vk, client.Options{
		Prefix:   Prefix,
		Deadline: opts.Deadline,
		Fallback: client.ReturnError,
	})
	if err != nil {
		return nil, err
	}
	s := &Server{
		vk:   vk,
		lim:  lim,
		opts: opts,
		mux:  http.NewServeMux(),
	}
	s.mux.HandleFunc("GET /{$}", asset("web/index.html", "text/html; charset=utf-8"))
	s.mux.HandleFunc("GET /playground.js", asset("web/playground.js", "text/javascript; charset=utf-8"))
	s.mux.HandleFunc("GET /playground.css", asset("web/playground.css", "text/css; charset=utf-8"))
	s.mux.HandleFunc("GET /api/status", s.status)
	s.mux.HandleFunc("POST /api/send", s.send)
	s.mux.HandleFunc("POST /api/reset", s.reset)
	s.mux.HandleFunc("POST /api/boundary", s.boundary)
	return s, nil
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// The page loads its own script and style and talks to its own API: nothing else, so an
	// injected string could neither run nor call out.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; "+
		"connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	if !s.opts.Remote && !loopbackHost(r.Host) {
		writeJSON(w, http.StatusForbidden, errorBody{Error: fmt.Sprintf(
			"host %q is not a loopback address: open the playground at 127.0.0.1 or localhost", clip(r.Host))})
		return
	}
	s.mux.ServeHTTP(w, r)
}

// loopbackHost reports whether a Host header names a loopback address or localhost.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func asset(name, contentType string) http.HandlerFunc {
	body, err := web.ReadFile(name)
	if err != nil {
		panic(err) // embedded at build time: a missing file is a build mistake
	}
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", contentType)
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write(body)
	}
}

// Decision is one call's Result as the page draws it, stamped with the server's time.
type Decision struct {
	At           float64 `json:"at"` // server time of the decision, Unix milliseconds
	Allowed      bool    `json:"allowed"`
	Blocked      bool    `json:"blocked"` // denied by the card's block (a penalty): retryAfterMs is its time left
	Limit        int64   `json:"limit"`
	Remaining    int64   `json:"remaining"`
	RetryAfterMs int64   `json:"retryAfterMs"` // -1: never (the cost exceeds the limit)
	ResetAfterMs int64   `json:"resetAfterMs"`
	DelayMs      int64   `json:"delayMs"` // leaky bucket in shape mode: hold it this long
	// WindowEnd is, for a calendar, the end of the window that held the decision (server
	// Unix milliseconds): when its count starts again.
	WindowEnd float64 `json:"windowEnd,omitempty"`
}

func decision(r client.Result, at float64) Decision {
	return Decision{At: at, Allowed: r.Allowed, Blocked: r.Blocked, Limit: r.Limit, Remaining: r.Remaining,
		RetryAfterMs: limitspec.RetryAfterMs(r.RetryAfter), ResetAfterMs: r.ResetAfter.Milliseconds(), DelayMs: r.Delay.Milliseconds()}
}

// windowEnd is the end of l's window at server time at (Unix milliseconds), for a calendar;
// 0 for any other limit, or boundaries the client could not compute (the call has failed then).
func windowEnd(l client.Limit, at float64) float64 {
	c, ok := l.(client.Calendar)
	if !ok {
		return 0
	}
	b, err := calendar.Windows(calendar.Period(c.Period), c.Anchor, time.UnixMilli(int64(at)))
	if err != nil {
		return 0
	}
	return float64(b[2])
}

type errorBody struct {
	Error     string     `json:"error"`
	Absent    bool       `json:"absent,omitempty"`    // the library is absent (or of another major version)
	Deploy    string     `json:"deploy,omitempty"`    // the command that loads it
	Decisions []Decision `json:"decisions,omitempty"` // those made before the error
}

type cardInfo struct {
	ID       Card        `json:"id"`
	Key      string      `json:"key"`
	Defaults Params      `json:"defaults"`
	Fields   []formField `json:"fields"` // the form's numbers and their bounds
	// Penalty is the card's penalty switch, its number and bounds; absent when it has none.
	Penalty *penaltyInfo `json:"penalty,omitempty"`
	// Calendar is, for the calendar card, what it fixes and when its window ends.
	Calendar *calendarInfo `json:"calendar,omitempty"`
}

type penaltyInfo struct {
	formField
	Default  int64  `json:"default"`
	BlockKey string `json:"blockKey"`
}

type calendarInfo struct {
	Period    string  `json:"period"`    // day
	Zone      string  `json:"zone"`      // UTC
	WindowEnd float64 `json:"windowEnd"` // the end of the window of the default anchor, server Unix ms
}

type statusBody struct {
	Loaded bool `json:"loaded"` // the library answers on every primary: the cards work
	// Absent reports a server that answers without the library (or with another major
	// version of it): Deploy loads it.
	Absent  bool       `json:"absent"`
	Version string     `json:"version,omitempty"`
	Error   string     `json:"error,omitempty"` // why the cards cannot work, when they cannot
	Deploy  string     `json:"deploy"`
	Server  string     `json:"server,omitempty"`
	Prefix  string     `json:"prefix"`
	Cards   []cardInfo `json:"cards"`
	Now     float64    `json:"now,omitempty"` // server time, Unix milliseconds
}

// status reports whether the library is there, and the cards' keys and default numbers. It
// answers 200 whatever the server's state, which is what it reports: the page draws its cards
// either way.
func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.Deadline)
	defer cancel()
	body := statusBody{Deploy: s.opts.Deploy, Server: s.opts.Server, Prefix: Prefix}
	clk, err := s.clock(ctx)
	nowMs := time.Now().UnixMilli() // the cards are drawn without the server too
	if err == nil {
		body.Now = clk.now()
		nowMs = int64(body.Now)
	}
	for _, c := range Cards {
		info := cardInfo{ID: c, Key: c.Key(), Defaults: Defaults[c], Fields: c.form()}
		if f := c.penaltyField(); f != nil {
			info.Penalty = &penaltyInfo{formField: *f, Default: DefaultPenaltyMs, BlockKey: c.BlockKey()}
		}
		if cl := cardLimits[c]; cl.alg.Takes("anchor") {
			info.Defaults.AnchorMs = anchorFor(nowMs, s.opts.CalendarLead)
			l, lerr := limitOf(c, info.Defaults)
			if lerr != nil {
				panic("playground: the calendar card's defaults: " + lerr.Error()) // a bug: TestForm
			}
			info.Calendar = &calendarInfo{Period: cl.period.String(), Zone: "UTC", WindowEnd: windowEnd(l, float64(nowMs))}
		}
		body.Cards = append(body.Cards, info)
	}
	if err == nil {
		err = s.lim.Check(ctx)
	}
	var ve *client.VersionError
	switch {
	case errors.As(err, &ve):
		// Absent, or a major version this client does not speak: either way, a deploy.
		body.Absent = true
		body.Error = s.explain(err)
	case err != nil:
		body.Error = s.explain(err)
	default:
		body.Loaded = true
		// Any node will do: Check has just seen the same major version on every primary.
		body.Version, _ = s.vk.Do(ctx, s.vk.B().FcallRo().Function("rl_version").Numkeys(0).Build()).ToString()
	}
	writeJSON(w, http.StatusOK, body)
}

type sendRequest struct {
	Card   string `json:"card"`
	Params Params `json:"params"`
	N      int    `json:"n"`
}

type decisionsBody struct {
	Card      Card       `json:"card"`
	Decisions []Decision `json:"decisions"`
	Now       float64    `json:"now"`
}

// send makes n calls of one unit each on a card's key, one after the other, as n requests of
// a service would.
func (s *Server) send(w http.ResponseWriter, r *http.Request) {
	var req sendRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, err, nil)
		return
	}
	card, err := parseCard(req.Card)
	if err != nil {
		s.fail(w, err, nil)
		return
	}
	l, err := limitOf(card, req.Params)
	if err == nil {
		err = checkBurst(req.N)
	}
	if err != nil {
		s.fail(w, err, nil)
		return
	}
	ctx := r.Context()
	clk, err := s.clock(ctx)
	if err != nil {
		s.fail(w, err, nil)
		return
	}
	ds, err := s.burst(ctx, clk, card, l, req.N, nil)
	if err != nil {
		s.fail(w, err, ds)
		return
	}
	writeJSON(w, http.StatusOK, decisionsBody{Card: card, Decisions: ds, Now: clk.now()})
}

// burst makes n calls on card's key, appending their decisions to ds.
func (s *Server) burst(ctx context.Context, clk serverClock, card Card, l client.Limit, n int, ds []Decision) ([]Decision, error) {
	key := string(card)
	for range n {
		start := time.Now()
		res, err := s.lim.Allow(ctx, key, l)
		if err != nil {
			return ds, err
		}
		d := decision(res, clk.at(start, time.Now()))
		d.WindowEnd = windowEnd(l, d.At)
		ds = append(ds, d)
	}
	return ds, nil
}

type resetRequest struct {
	Card string `json:"card"`
}

type resetBody struct {
	Card    Card   `json:"card"`
	Key     string `json:"key"`
	Deleted bool   `json:"deleted"` // false: the keys were already gone (a fresh or expired limiter, no block)
}

// reset deletes the card's keys, its limiter's and its block's, and only them: the limiter
// starts afresh, unblocked.
func (s *Server) reset(w http.ResponseWriter, r *http.Request) {
	var req resetRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, err, nil)
		return
	}
	card, err := parseCard(req.Card)
	if err != nil {
		s.fail(w, err, nil)
		return
	}
	n, err := s.del(r.Context(), card)
	if err != nil {
		s.fail(w, err, nil)
		return
	}
	writeJSON(w, http.StatusOK, resetBody{Card: card, Key: card.Key(), Deleted: n > 0})
}

func (s *Server) del(ctx context.Context, c Card) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Deadline)
	defer cancel()
	// One DEL: both keys are in the card's slot.
	return s.vk.Do(ctx, s.vk.B().Del().Key(c.Key(), c.BlockKey()).Build()).AsInt64()
}

type boundaryRequest struct {
	FixedWindow   Params `json:"fixed_window"`
	SlidingLog    Params `json:"sliding_log"`
	SlidingWindow Params `json:"sliding_window"`
}

type boundaryBody struct {
	Edge   float64             `json:"edge"`   // the fixed window's edge between the bursts, server Unix ms
	ByCard map[Card][]Decision `json:"byCard"` // each window card's decisions, both bursts
	// Warning says that a burst did not keep to its side of the edge (the calls were too
	// slow for the window): the counts are still true, but they no longer show the 2x.
	Warning string  `json:"warning,omitempty"`
	Now     float64 `json:"now"`
}

// boundary resets the three window cards, then sends each a burst of its limit just before
// the fixed window's next edge and another just after it: the fixed window admits both (twice
// its limit in a moment), the sliding log and the sliding window admit about one limit.
// The server schedules the bursts, on its own clock synchronised with the server's TIME, so
// the page's timing (and its tab being in the background) cannot move them.
func (s *Server) boundary(w http.ResponseWriter, r *http.Request) {
	var req boundaryRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, err, nil)
		return
	}
	order := []Card{FixedWindow, SlidingLog, SlidingWindow}
	params := map[Card]Params{FixedWindow: req.FixedWindow, SlidingLog: req.SlidingLog, SlidingWindow: req.SlidingWindow}
	limits := map[Card]client.Limit{}
	for _, c := range order {
		l, err := limitOf(c, params[c])
		if err != nil {
			var re *RequestError
			if errors.As(err, &re) {
				re.Field = strings.Replace(re.Field, "params", "params."+string(c), 1)
			}
			s.fail(w, err, nil)
			return
		}
		if n := params[c].Limit; n > MaxBurst {
			s.fail(w, &RequestError{Field: "params." + string(c) + ".limit", Reason: fmt.Sprintf(
				"must be at most %d for the boundary scenario (each burst is one limit), got %d", MaxBurst, n)}, nil)
			return
		}
		limits[c] = l
	}
	if err := checkBoundaryWindow(req.FixedWindow.WindowMs); err != nil {
		s.fail(w, err, nil)
		return
	}
	if !s.boundaryMu.TryLock() {
		s.fail(w, errBoundaryBusy, nil)
		return
	}
	defer s.boundaryMu.Unlock()
	ctx := r.Context()
	for _, c := range order {
		if _, err := s.del(ctx, c); err != nil {
			s.fail(w, err, nil)
			return
		}
		// A peek (read-only) asks each card's node whether it has the library now, rather
		// than after a wait of up to a window.
		if _, err := s.lim.Peek(ctx, string(c), limits[c]); err != nil {
			s.fail(w, err, nil)
			return
		}
	}
	clk, err := s.clock(ctx)
	if err != nil {
		s.fail(w, err, nil)
		return
	}
	plan := planBoundary(clk.nowUs(), req.FixedWindow.WindowMs)
	body := boundaryBody{Edge: float64(plan.edgeUs) / 1000, ByCard: map[Card][]Decision{}}
	var lastUs [2]int64 // the last decision of each burst, server microseconds
	for b, at := range []int64{plan.firstUs, plan.secondUs} {
		if err := clk.sleepUntil(ctx, at); err != nil {
			s.fail(w, err, nil)
			return
		}
		// One call per card in turn, so that the three cards see the same moments.
		for i := int64(0); i < maxLimit(params); i++ {
			for _, c := range order {
				if i >= params[c].Limit {
					continue
				}
				ds, err := s.burst(ctx, clk, c, limits[c], 1, body.ByCard[c])
				body.ByCard[c] = ds
				if err != nil {
					s.fail(w, err, nil)
					return
				}
				lastUs[b] = int64(ds[len(ds)-1].At * 1000)
			}
		}
	}
	body.Warning = boundaryLate(plan, req.FixedWindow.WindowMs, lastUs[0], lastUs[1])
	body.Now = clk.now()
	writeJSON(w, http.StatusOK, body)
}

func maxLimit(params map[Card]Params) int64 {
	var n int64
	for _, p := range params {
		n = max(n, p.Limit)
	}
	return n
}

// anchorFor is the calendar card's anchor for a page loaded at nowMs (server Unix ms): lead
// ahead, rounded up to a whole second; by default the next whole minute at least a minute
// ahead. Only its clock time counts for a day's windows: the first window ends there, a day
// after it started.
func anchorFor(nowMs int64, lead time.Duration) int64 {
	if lead <= 0 {
		const minute = 60_000
		return (nowMs+minute)/minute*minute + minute
	}
	const second = 1000
	at := nowMs + lead.Milliseconds()
	return (at + second - 1) / second * second
}

// serverClock reads the server's time from this process's clock: offsetUs is the server's
// TIME minus the local time halfway through the TIME call. A decision is stamped halfway
// through its own call, within half a round trip of when the library read TIME for it.
type serverClock struct{ offsetUs int64 }

// clock measures the offset with one TIME call. In a cluster, TIME goes to any node; the
// nodes' clocks are assumed to agree as closely as the page can draw.
func (s *Server) clock(ctx context.Context) (serverClock, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Deadline)
	defer cancel()
	start := time.Now()
	parts, err := s.vk.Do(ctx, s.vk.B().Time().Build()).AsStrSlice()
	end := time.Now()
	if err != nil {
		return serverClock{}, fmt.Errorf("reading the server's clock (TIME): %w", err)
	}
	us, err := parseTime(parts)
	if err != nil {
		return serverClock{}, err
	}
	return clockOf(us, start, end), nil
}

// clockOf is the clock of a server whose TIME read us during a call from start to end.
func clockOf(us int64, start, end time.Time) serverClock {
	return serverClock{offsetUs: us - midpoint(start, end)}
}

// parseTime reads TIME's reply: seconds and microseconds, as two decimal strings.
func parseTime(parts []string) (int64, error) {
	if len(parts) != 2 {
		return 0, fmt.Errorf("TIME: %d elements, want 2", len(parts))
	}
	sec, err1 := strconv.ParseInt(parts[0], 10, 64)
	usec, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil || sec < 0 || usec < 0 || usec >= 1e6 {
		return 0, fmt.Errorf("TIME: %q is not a time", parts)
	}
	return sec*1e6 + usec, nil
}

func midpoint(start, end time.Time) int64 {
	return start.UnixMicro() + end.Sub(start).Microseconds()/2
}

func (c serverClock) nowUs() int64 { return time.Now().UnixMicro() + c.offsetUs }
func (c serverClock) now() float64 { return float64(c.nowUs()) / 1000 }

func (c serverClock) at(start, end time.Time) float64 {
	return float64(midpoint(start, end)+c.offsetUs) / 1000
}

// sleepUntil waits until the server's clock reads us.
func (c serverClock) sleepUntil(ctx context.Context, us int64) error {
	d := time.Duration(us-c.nowUs()) * time.Microsecond
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// maxBody bounds a request: the largest valid one is a few hundred bytes.
const maxBody = 4096

// decode reads exactly one JSON object of known fields. Only application/json is accepted:
// a form or text/plain body, which another site's page can send without asking, is refused.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return &RequestError{Field: "Content-Type", Reason: "must be application/json"}
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &RequestError{Field: "body", Reason: "is not valid: " + clipN(err.Error(), 200)}
	}
	if _, err := dec.Token(); err != io.EOF {
		return &RequestError{Field: "body", Reason: "must hold one JSON object only"}
	}
	return nil
}

// explain is err as the page shows it: a timeout says how long the server was given, since
// "context deadline exceeded" alone reads as a fault of the page.
func (s *Server) explain(err error) string {
	msg := err.Error()
	if timedOut(err) {
		msg = fmt.Sprintf("the server did not answer within %s (%s)", s.opts.Deadline, msg)
	}
	return msg
}

func timedOut(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)
}

// fail answers err: 400 for a refused request, 503 when the library must be deployed, 409
// when the card's key holds something else than its limiter or a boundary scenario runs
// already, 504 when the server did not answer in time, 502 for any other server error.
func (s *Server) fail(w http.ResponseWriter, err error, ds []Decision) {
	body := errorBody{Error: s.explain(err), Decisions: ds}
	var (
		re   *RequestError
		le   *client.LibraryError
		ve   *client.VersionError
		code = http.StatusBadGateway
	)
	switch {
	case errors.As(err, &re):
		code = http.StatusBadRequest
	case errors.Is(err, errBoundaryBusy):
		code = http.StatusConflict
	case errors.Is(err, client.ErrNotLoaded) || errors.As(err, &ve):
		code, body.Absent, body.Deploy = http.StatusServiceUnavailable, true, s.opts.Deploy
	case errors.As(err, &le):
		code = http.StatusConflict
		body.Error += " (Reset deletes the card's key)"
	case errors.Is(err, context.Canceled):
		// The page went away; nobody reads the answer.
		return
	case timedOut(err):
		code = http.StatusGatewayTimeout
	}
	writeJSON(w, code, body)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
