package llmlimit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/decide"
)

// Middleware limits the LLM requests of the handler it wraps by token budgets. It is safe for
// concurrent use.
type Middleware struct {
	lim  opener
	opts Options
	log  decide.ErrorLog
}

// newMiddleware is New with any opener.
func newMiddleware(lim opener, opts Options) (*Middleware, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	m := &Middleware{lim: lim, opts: opts}
	m.log.Every, m.log.Prefix, m.log.Logger = time.Second, "llmlimit: ", opts.Logger
	return m, nil
}

// Handler returns next behind the budgets: next is the upstream API, often an
// httputil.ReverseProxy.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
}

// The messages of the responses the middleware writes itself.
const (
	msgUnreadable  = "llmlimit: the request body is not a request of this API"
	msgTooLarge    = "llmlimit: the request body is too large"
	msgNoEndpoint  = "llmlimit: this endpoint has no token accounting"
	msgNoKey       = "llmlimit: the request names no principal to count it against"
	msgNoPrice     = "llmlimit: the model has no price"
	msgEstimate    = "llmlimit: the request's estimate is more than a limit can count"
	msgUnavailable = "llmlimit: rate limiter unavailable"
	msgMisconfig   = "llmlimit: rate limit misconfigured"
)

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	api := m.opts.API(r)
	if api == NotLLM {
		if r.Method == http.MethodGet || r.Method == http.MethodHead || r.Method == http.MethodOptions {
			next.ServeHTTP(w, r) // a model list: no tokens
			return
		}
		m.write(w, OpenAIChat, failure{http.StatusNotFound, kindNotFound, msgNoEndpoint})
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, m.opts.MaxBody+1))
	if err != nil {
		if r.Context().Err() == nil {
			m.write(w, api, failure{http.StatusBadRequest, kindInvalid, msgUnreadable})
		}
		return
	}
	if int64(len(body)) > m.opts.MaxBody {
		m.write(w, api, failure{http.StatusRequestEntityTooLarge, kindTooLarge, msgTooLarge})
		return
	}
	req, err := ParseRequest(api, body)
	if err != nil {
		m.write(w, api, failure{http.StatusBadRequest, kindInvalid, msgUnreadable + ": " + err.Error()})
		return
	}
	keys := make([]string, len(m.opts.Budgets))
	for i := range m.opts.Budgets {
		k, err := m.opts.Budgets[i].Key(r)
		if err != nil || k == "" {
			m.write(w, api, failure{http.StatusBadRequest, kindInvalid, msgNoKey})
			return
		}
		keys[i] = k
	}
	in := max(m.opts.Tokens(req.Model, req.Text), 1)
	out := req.MaxTokens
	if out == 0 {
		out = m.opts.DefaultMaxTokens
	}
	out = mul(out, req.Choices) // each choice may use them all
	p, err := m.plan(req, keys, in, out)
	switch {
	case errors.Is(err, errNoPrice):
		m.write(w, api, failure{http.StatusBadRequest, kindInvalid, msgNoPrice + ": " + strconv.Quote(req.Model)})
		return
	case err != nil:
		m.write(w, api, failure{http.StatusBadRequest, kindInvalid, msgEstimate})
		return
	}
	mt, res, each, err := m.lim.open(r.Context(), p.rules, p.spec)
	if err != nil {
		m.limiterError(w, r, api, err)
		return
	}
	st := p.states(res, each)
	if !res.Allowed {
		m.deny(w, api, p, res, m.quotaHeaders(api, st))
		return
	}
	// Every limit's state came with the hold's reply: the headers cost no call of their own.
	headers := m.quotaHeaders(api, st)
	asked := false
	if m.opts.AskUsage && api == OpenAIChat && req.Stream && !req.IncludeUsage {
		if b, err := withUsage(body); err == nil {
			body, asked = b, true
		}
	}
	// The upstream reads the body the middleware read.
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil
	// A response compressed for the client could not be read: the upstream is asked as the
	// proxy's own transport asks (an http.Transport adds gzip and decompresses itself).
	r.Header.Del("Accept-Encoding")
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	rw := &writer{ResponseWriter: w, m: m, r: r, ctx: r.Context(), cancel: cancel, mt: mt, p: p, headers: headers,
		hideUsage: asked, s: stream{api: api, model: req.Model, open: -1}}
	defer func() {
		// However the upstream ended (a panic included), the request is charged what it
		// used: its client may have gone, the charge is owed anyway.
		u := rw.usage(in, out)
		if _, err := mt.Settle(context.WithoutCancel(r.Context()), p.actual(u, m.opts.CachedFree)); err != nil {
			m.report(r, decide.Unsettled, p.rules[0].Name, fmt.Errorf("llmlimit: settling the request: %w", err))
		}
	}()
	rw.serve(next, r.WithContext(ctx))
}

// deny answers a request its limits refused: 429 with Retry-After for a rate, QuotaStatus for
// a quota (a Calendar), in the API's error format.
func (m *Middleware) deny(w http.ResponseWriter, api API, p *plan, res client.Result, headers []header) {
	h := w.Header()
	for _, x := range headers {
		h.Set(x.name, x.value)
	}
	i := max(res.Rule, 0)
	name := ""
	if i < len(p.rules) {
		name = p.rules[i].Name
	}
	if i < len(p.rules) && quota(p.rules[i].Limit) && !res.Blocked {
		m.write(w, api, failure{m.opts.QuotaStatus, kindQuota, "llmlimit: quota " + name + " exhausted"})
		return
	}
	msg := "llmlimit: rate limit " + name + " reached"
	if res.RetryAfter != client.Never {
		secs := ceilSecond(res.RetryAfter) / time.Second
		h.Set("Retry-After", strconv.FormatInt(int64(secs), 10))
		msg += ", retry after " + ceilMilli(res.RetryAfter).String()
	} else {
		msg += ": the request's estimate is more than the limit"
	}
	m.write(w, api, failure{http.StatusTooManyRequests, kindRate, msg})
}

// limiterError answers a request the Limiter could not decide: 500 for a limit or key it
// refuses (a configuration mistake), 400 for a principal too long, else 503.
func (m *Middleware) limiterError(w http.ResponseWriter, r *http.Request, api API, err error) {
	if r.Context().Err() != nil {
		return // the client went away: nobody reads an answer
	}
	kind := decide.Classify(err, nil, func(error) bool { return false })
	m.report(r, kind, "", err)
	switch kind {
	case decide.RefusedKey:
		m.write(w, api, failure{http.StatusBadRequest, kindInvalid, msgNoKey})
	case decide.Misconfigured:
		m.write(w, api, failure{http.StatusInternalServerError, kindServer, msgMisconfig})
	default:
		m.write(w, api, failure{http.StatusServiceUnavailable, kindServer, msgUnavailable})
	}
}

// report passes err to Options.OnError, or logs it.
func (m *Middleware) report(r *http.Request, kind decide.Failure, policy string, err error) {
	if m.opts.OnError != nil {
		m.opts.OnError(r, err)
		return
	}
	m.log.Log(r.Context(), kind, policy, err, "path", r.URL.Path)
}
