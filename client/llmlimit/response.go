package llmlimit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"

	"github.com/rlfn/rlfn/internal/decide"
)

// errCut is what the upstream handler's writes return once the middleware has cut the stream:
// an httputil.ReverseProxy stops copying the upstream's response at it.
var errCut = errors.New("llmlimit: the stream was cut: its budget ran out")

// maxEvent bounds an event the middleware waits for the end of: more bytes without a blank
// line are passed on as they are, unmetered (the upstream does not speak server-sent events).
const maxEvent = 1 << 20

// mode is how a response is followed.
type mode uint8

const (
	modeOther mode = iota // passed on; its usage is unknown
	modeJSON              // passed on, and a copy kept to read its usage at the end
	modeSSE               // passed on event by event, each flushed, output metered
)

// writer is the ResponseWriter the upstream handler writes a request's response to.
type writer struct {
	http.ResponseWriter
	m       *Middleware
	r       *http.Request      // the request, for OnError
	ctx     context.Context    // the request's: Take's
	cancel  context.CancelFunc // ends the upstream's request: a cut
	mt      meter
	p       *plan
	headers []header // the rate-limit headers
	s       stream
	// hideUsage: the usage chunk is the middleware's question (Options.AskUsage), not passed on
	hideUsage bool

	wrote     bool
	status    int
	mode      mode
	buf       []byte // SSE: the event being received; JSON: the body so far, up to MaxBody
	delivered int64  // the output tokens of the events passed on
	cut       *Cut
}

// serve runs the upstream handler; a panic it ends with is recovered only when it is the
// abort an httputil.ReverseProxy panics with at a cut stream's refused write.
func (w *writer) serve(next http.Handler, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if w.cut == nil || v != http.ErrAbortHandler {
				defer panic(v)
			}
		}
		w.finish()
	}()
	next.ServeHTTP(w, r)
}

func (w *writer) WriteHeader(code int) {
	if w.wrote {
		return
	}
	if code >= 100 && code < 200 {
		w.ResponseWriter.WriteHeader(code) // informational: the response is still to come
		return
	}
	w.wrote, w.status = true, code
	h := w.Header()
	stripUpstream(h)
	for _, x := range w.headers {
		h.Set(x.name, x.value)
	}
	ct, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	switch ce := h.Get("Content-Encoding"); {
	case ce != "" && ce != "identity":
		// An upstream that compressed anyway: unreadable, passed on, charged its estimate.
	case ct == "text/event-stream" && code < 300:
		w.mode = modeSSE
		h.Del("Content-Length")
	case ct == "application/json":
		w.mode = modeJSON
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *writer) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.cut != nil {
		return 0, errCut
	}
	switch w.mode {
	case modeSSE:
		return w.writeSSE(p)
	case modeJSON:
		if int64(len(w.buf)+len(p)) <= w.m.opts.MaxBody {
			w.buf = append(w.buf, p...)
		}
	}
	return w.ResponseWriter.Write(p)
}

// writeSSE passes on each whole event of what the upstream wrote, after taking the tokens of
// its output from the meter; the first event the meter has no tokens for cuts the stream.
func (w *writer) writeSSE(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	start := 0
	for {
		end := eventEnd(w.buf[start:])
		if end < 0 {
			break
		}
		ev := w.buf[start : start+end]
		var n int64
		text := w.s.event(ev)
		if w.hideUsage && w.s.usageOnly {
			start += end
			continue
		}
		if len(text) > 0 {
			n = max(w.m.opts.Tokens(w.s.model, text), 1)
			ok, err := w.mt.Take(w.ctx, n)
			if err != nil || !ok {
				w.stop(err)
				return 0, errCut
			}
		}
		if _, err := w.ResponseWriter.Write(ev); err != nil {
			return 0, err
		}
		w.delivered += n
		w.s.sent()
		start += end
	}
	if len(w.buf)-start > maxEvent {
		if _, err := w.ResponseWriter.Write(w.buf[start:]); err != nil {
			return 0, err
		}
		start = len(w.buf)
	}
	if start > 0 {
		w.buf = append(w.buf[:0], w.buf[start:]...)
		w.Flush()
	}
	return len(p), nil
}

// stop cuts the stream: the upstream's request is cancelled and its writes refused, and the
// end is written once the upstream handler has returned.
func (w *writer) stop(err error) {
	c := Cut{Reason: "budget", Message: "the token budget ran out: the response is cut", OutputTokens: w.delivered}
	if i := w.mt.Result().Rule; err == nil && i >= 0 && i < len(w.p.rules) {
		c.Message = "the token budget " + w.p.rules[i].Name + " ran out: the response is cut"
	}
	if err != nil {
		c.Reason, c.Message = "limiter", "the rate limiter could not grant more tokens: the response is cut"
		if w.ctx.Err() == nil {
			w.m.report(w.r, decide.Unavailable, "", fmt.Errorf("llmlimit: taking streamed tokens: %w", err))
		}
	}
	w.cut = &c
	w.cancel()
}

// finish writes the end of a cut stream, or passes on what is left of one.
func (w *writer) finish() {
	switch {
	case w.cut != nil && w.ctx.Err() == nil:
		w.ResponseWriter.Write(w.s.end(*w.cut))
		w.Flush()
	case w.mode == modeSSE && len(w.buf) > 0:
		w.ResponseWriter.Write(w.buf)
		w.Flush()
	}
}

// usage is what the response used: its usage, else what was metered, with the input at
// inEstimate when unknown. A response that failed (400 and above, or nothing written) used
// nothing; one the middleware could not read (neither JSON nor a stream, or compressed), its
// estimate.
func (w *writer) usage(inEstimate, outEstimate int64) Usage {
	if w.mode == modeSSE {
		u := Usage{Input: inEstimate}
		if w.s.inKnown {
			u = w.s.in
		}
		u.Output = w.delivered
		if w.s.outKnown && w.cut == nil {
			u.Output = w.s.out
		}
		return u
	}
	if w.mode == modeJSON {
		if u, ok := ParseUsage(w.s.api, w.buf); ok {
			return u
		}
	}
	switch {
	case !w.wrote || w.status >= 400:
		return Usage{}
	case w.mode == modeJSON:
		return Usage{Input: inEstimate, Output: w.m.opts.Tokens(w.s.model, w.buf)}
	}
	return Usage{Input: inEstimate, Output: outEstimate}
}

// Flush sends what was written to the client.
func (w *writer) Flush() {
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack is the ResponseWriter's: a hijacked connection is no longer followed.
func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// Unwrap returns the ResponseWriter, for http.ResponseController.
func (w *writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }
