package httplimit

import (
	"net/http"
	"strconv"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/decide"
)

// The header names in the form http.Header keeps them (textproto.CanonicalMIMEHeaderKey), so
// that setHeaders can write the map without canonicalising each name on every request.
const (
	headerPolicy    = "Ratelimit-Policy" // RateLimit-Policy
	headerRateLimit = "Ratelimit"        // RateLimit
	headerLimit     = "X-Ratelimit-Limit"
	headerRemaining = "X-Ratelimit-Remaining"
	headerReset     = "X-Ratelimit-Reset"
)

// setHeaders writes the rate-limit headers of a decision on quotas, the one that decided
// first: res is its reply (decide.AppendValues says what each value holds). The X-RateLimit-*
// headers describe the deciding limit. A hidden quota gets Retry-After alone.
func (m *Middleware) setHeaders(h http.Header, hide bool, quotas []decide.Quota, res client.Result, each []client.Result, wait time.Duration, refused bool) {
	if hide {
		if refused && wait != client.Never {
			h["Retry-After"] = []string{string(decide.AppendSeconds(nil, wait))}
		}
		return
	}
	// Every value is written into one buffer, converted to one string that the values slice,
	// and the one-value slices share one array, each capped at its own element so that a
	// later handler's Header.Add copies it rather than overwriting the next: two allocations
	// per request, not ten.
	var b [256]byte
	v := decide.AppendValues(b[:0], m.clock, decide.ResetFormat(m.opts.Reset), quotas, res, each, wait, refused)
	n := v.N
	shareT := v.Retry || m.opts.Reset == ResetDelta
	s := string(v.Buf)
	// the values, then t's digits when a header repeats them
	size := n
	if shareT {
		size++
	}
	vals := make([]string, size)
	from := 0
	for i, end := range v.Ends[:n] {
		vals[i] = s[from:end]
		from = end
	}
	if shareT {
		vals[n] = s[v.TFrom:v.TEnd]
	}
	h[headerPolicy] = vals[0:1:1]
	h[headerRateLimit] = vals[1:2:2]
	h[headerLimit] = vals[2:3:3]
	h[headerRemaining] = vals[3:4:4]
	if v.Retry {
		h["Retry-After"] = vals[n : n+1 : n+1]
	}
	switch m.opts.Reset {
	case ResetUnix:
		h[headerReset] = vals[4:5:5]
	case ResetDelta:
		h[headerReset] = vals[n : n+1 : n+1]
	}
}

// body is the JSON body of a response the middleware writes itself.
type body struct {
	Error        string // a constant of this package: no character JSON would escape
	Policy       string // a valid policy name, likewise; left out when empty
	RetryAfterMs int64  // left out when negative: no wait helps
	Blocked      bool   // a 429 of the principal's block (client.Result.Blocked); left out when false
}

// appendJSON writes b as JSON by hand: a denied request is the cheap path that a flood of
// them takes, and every string in b is known to need no escaping.
func (b body) appendJSON(buf []byte) []byte {
	buf = append(append(append(buf, `{"error":"`...), b.Error...), '"')
	if b.Policy != "" {
		buf = append(append(append(buf, `,"policy":"`...), b.Policy...), '"')
	}
	if b.Blocked {
		buf = append(buf, `,"blocked":true`...)
	}
	if b.RetryAfterMs >= 0 {
		buf = strconv.AppendInt(append(buf, `,"retry_after_ms":`...), b.RetryAfterMs, 10)
	}
	return append(buf, "}\n"...)
}

// ProblemQuotaExceeded is the problem type of a 429 with Options.ProblemJSON, from
// draft-ietf-httpapi-ratelimit-headers ("Quota Exceeded").
const ProblemQuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// appendProblem writes b as RFC 9457 problem details. A 429 is of the quota-exceeded type,
// its policy in the draft's violated-policies member, and, when a block refused it, a detail
// saying so and the extension member blocked; any other status is about:blank, its title the
// status text and b.Error the detail.
func (b body) appendProblem(buf []byte, status int) []byte {
	if status == http.StatusTooManyRequests {
		buf = append(buf, `{"type":"`+ProblemQuotaExceeded+`","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429`...)
		if b.Policy != "" {
			buf = append(append(append(buf, `,"violated-policies":["`...), b.Policy...), `"]`...)
		}
		if b.Blocked {
			// An extension member a program reads, and the detail a person does: the wait is the
			// block's, which further requests do not shorten, nor lengthen.
			buf = append(buf, `,"detail":"blocked until Retry-After, by a penalty for exceeding the quota or by an operator","blocked":true`...)
		}
	} else {
		buf = append(append(append(buf, `{"type":"about:blank","title":"`...), http.StatusText(status)...), `","status":`...)
		buf = strconv.AppendInt(buf, int64(status), 10)
		buf = append(append(append(buf, `,"detail":"`...), b.Error...), '"')
	}
	if b.RetryAfterMs >= 0 {
		buf = strconv.AppendInt(append(buf, `,"retry_after_ms":`...), b.RetryAfterMs, 10)
	}
	return append(buf, "}\n"...)
}

// write answers status with b, as JSON or, with Options.ProblemJSON, problem details.
func (m *Middleware) write(w http.ResponseWriter, status int, b body) {
	if m.opts.ProblemJSON {
		var arr [384]byte // a blocked 429's, the longest, with a policy name of 32 bytes
		send(w, status, "application/problem+json", b.appendProblem(arr[:0], status))
		return
	}
	// A buffer of its own, the size the JSON body needs: it escapes to the ResponseWriter,
	// and is allocated on every refused request.
	var arr [128]byte
	send(w, status, "application/json", b.appendJSON(arr[:0]))
}

func send(w http.ResponseWriter, status int, contentType string, data []byte) {
	h := w.Header()
	h["Content-Type"] = []string{contentType}
	h["Content-Length"] = []string{strconv.Itoa(len(data))}
	w.WriteHeader(status)
	w.Write(data)
}
