package httplimit

import (
	"net/http"
	"strconv"
	"time"

	"github.com/rlfn/rlfn/client"
)

// maxSFInteger is the largest Integer a Structured Field may carry (RFC 9651, section 3.3.1).
const maxSFInteger = 999_999_999_999_999

// The header names in the form http.Header keeps them (textproto.CanonicalMIMEHeaderKey), so
// that setHeaders can write the map without canonicalising each name on every request.
const (
	headerPolicy    = "Ratelimit-Policy" // RateLimit-Policy
	headerRateLimit = "Ratelimit"        // RateLimit
	headerLimit     = "X-Ratelimit-Limit"
	headerRemaining = "X-Ratelimit-Remaining"
	headerReset     = "X-Ratelimit-Reset"
)

// quota is a limit the headers report, under its policy name.
type quota struct {
	name  string
	limit client.Limit
}

// setHeaders writes the rate-limit headers of a decision on quotas, the one that decided
// first: res is its reply. A refused request's t is wait, the Retry-After it gets, because the
// draft asks that Retry-After not point before the end of t; a served request's t is the time
// until the limiter is back to its initial state. RateLimit-Policy lists every limit, and
// RateLimit every limit whose state is known: each (client.AllowAllEach's, in the order of
// quotas) has the others', whose t is the wait of a limit that refused, else its reset; with
// each nil (client.AllowAll), RateLimit has the deciding limit alone. The X-RateLimit-*
// headers describe the deciding limit. A hidden quota gets Retry-After alone.
func (m *Middleware) setHeaders(h http.Header, hide bool, quotas []quota, res client.Result, each []client.Result, wait time.Duration, refused bool) {
	t := res.ResetAfter
	if len(each) > 0 && each[0].Limit != 0 {
		// its own reset: the reply of several limits of one key says the longest of theirs
		t = each[0].ResetAfter
	}
	if refused && wait != client.Never {
		t = wait
	}
	if hide {
		if refused && wait != client.Never {
			h["Retry-After"] = []string{string(appendSeconds(nil, wait))}
		}
		return
	}
	// Every value is written into one buffer, converted to one string that the values slice,
	// and the one-value slices share one array, each capped at its own element so that a
	// later handler's Header.Add copies it rather than overwriting the next: two allocations
	// per request, not ten.
	var b [256]byte
	buf := b[:0]
	var ends [5]int
	// Policy names are restricted to characters a Structured Field String holds unescaped.
	for i, q := range quotas {
		if i > 0 {
			buf = append(buf, ", "...)
		}
		buf = append(append(append(buf, '"'), q.name...), `";q=`...)
		switch {
		case i == 0:
			buf = strconv.AppendInt(buf, res.Limit, 10)
		case i < len(each) && each[i].Limit != 0:
			buf = strconv.AppendInt(buf, each[i].Limit, 10)
		default:
			buf = strconv.AppendInt(buf, q.limit.Quota().Limit, 10)
		}
		if w, ok := window(q.limit); ok {
			buf = strconv.AppendInt(append(buf, ";w="...), w, 10)
		}
	}
	ends[0] = len(buf)
	buf = append(append(append(buf, '"'), quotas[0].name...), `";r=`...)
	buf = strconv.AppendInt(buf, res.Remaining, 10)
	buf = append(buf, ";t="...)
	tFrom := len(buf) // t's digits: Retry-After and a delta reset share them
	buf = appendSeconds(buf, t)
	tEnd := len(buf)
	for i := 1; i < len(each) && i < len(quotas); i++ {
		e := each[i]
		if e.Limit == 0 {
			continue // its state could not be read
		}
		et := e.ResetAfter
		if !e.Allowed && e.RetryAfter != client.Never {
			et = e.RetryAfter
		}
		buf = append(append(append(buf, `, "`...), quotas[i].name...), `";r=`...)
		buf = strconv.AppendInt(buf, e.Remaining, 10)
		buf = appendSeconds(append(buf, ";t="...), et)
	}
	ends[1] = len(buf)
	buf = strconv.AppendInt(buf, res.Limit, 10)
	ends[2] = len(buf)
	buf = strconv.AppendInt(buf, res.Remaining, 10)
	ends[3] = len(buf)
	n := 4
	if m.opts.Reset == ResetUnix {
		buf = appendUnix(buf, m.now(), t)
		ends[4] = len(buf)
		n = 5
	}
	retry := refused && wait != client.Never
	shareT := retry || m.opts.Reset == ResetDelta
	s := string(buf)
	// the values, then t's digits when a header repeats them
	size := n
	if shareT {
		size++
	}
	vals := make([]string, size)
	from := 0
	for i, end := range ends[:n] {
		vals[i] = s[from:end]
		from = end
	}
	if shareT {
		vals[n] = s[tFrom:tEnd]
	}
	h[headerPolicy] = vals[0:1:1]
	h[headerRateLimit] = vals[1:2:2]
	h[headerLimit] = vals[2:3:3]
	h[headerRemaining] = vals[3:4:4]
	if retry {
		h["Retry-After"] = vals[n : n+1 : n+1]
	}
	switch m.opts.Reset {
	case ResetUnix:
		h[headerReset] = vals[4:5:5]
	case ResetDelta:
		h[headerReset] = vals[n : n+1 : n+1]
	}
}

// appendUnix appends the Unix time d after now (Unix nanoseconds), in seconds rounded up: a
// client that waits until then has waited at least d.
func appendUnix(b []byte, now int64, d time.Duration) []byte {
	at := now + int64(max(d, 0))
	s := at / int64(time.Second)
	if at%int64(time.Second) > 0 {
		s++
	}
	return strconv.AppendInt(b, s, 10)
}

// appendSeconds appends d as delay-seconds, rounded up: a client that waits that long has
// waited at least d.
func appendSeconds(b []byte, d time.Duration) []byte {
	if d <= 0 {
		return append(b, '0')
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return strconv.AppendInt(b, s, 10)
}

// window is the RateLimit-Policy w of a limit in seconds, rounded up to at least 1 (the draft
// wants a non-zero integer): client.Quota's Window (a bucket's time to refill or drain its
// whole Capacity, so that q per w is its long-run rate), or none when it has no window.
func window(l client.Limit) (int64, bool) {
	d := l.Quota().Window
	if d <= 0 {
		return 0, false
	}
	return min(maxSFInteger, (int64(d)-1)/int64(time.Second)+1), true
}

// body is the JSON body of a response the middleware writes itself.
type body struct {
	Error        string // a constant of this package: no character JSON would escape
	Policy       string // a valid policy name, likewise; left out when empty
	RetryAfterMs int64  // left out when negative: no wait helps
}

// appendJSON writes b as JSON by hand: a denied request is the cheap path that a flood of
// them takes, and every string in b is known to need no escaping.
func (b body) appendJSON(buf []byte) []byte {
	buf = append(append(append(buf, `{"error":"`...), b.Error...), '"')
	if b.Policy != "" {
		buf = append(append(append(buf, `,"policy":"`...), b.Policy...), '"')
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
// its policy in the draft's violated-policies member; any other status is about:blank, its
// title the status text and b.Error the detail.
func (b body) appendProblem(buf []byte, status int) []byte {
	if status == http.StatusTooManyRequests {
		buf = append(buf, `{"type":"`+ProblemQuotaExceeded+`","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429`...)
		if b.Policy != "" {
			buf = append(append(append(buf, `,"violated-policies":["`...), b.Policy...), `"]`...)
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
		var arr [256]byte
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
