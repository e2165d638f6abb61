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

// setHeaders writes the rate-limit headers of a decision. A refused request's t is wait, the
// Retry-After it gets, because the draft asks that Retry-After not point before the end of t;
// a served request's t is the time until the limiter is back to its initial state.
func setHeaders(h http.Header, p Policy, res client.Result, wait time.Duration, refused bool) {
	t := res.ResetAfter
	if refused && wait != client.Never {
		t = wait
	}
	// Every value is written into one buffer, converted to one string that the values slice,
	// and the five one-value slices share one array, each capped at its own element so that a
	// later handler's Header.Add copies it rather than overwriting the next: two allocations
	// per request, not ten.
	var b [256]byte
	buf := b[:0]
	var ends [5]int
	// Policy names are restricted to characters a Structured Field String holds unescaped.
	buf = append(append(append(buf, '"'), p.Name...), `";q=`...)
	buf = strconv.AppendInt(buf, res.Limit, 10)
	if w, ok := window(p.Limit); ok {
		buf = strconv.AppendInt(append(buf, ";w="...), w, 10)
	}
	ends[0] = len(buf)
	buf = append(append(append(buf, '"'), p.Name...), `";r=`...)
	buf = strconv.AppendInt(buf, res.Remaining, 10)
	buf = appendSeconds(append(buf, ";t="...), t)
	ends[1] = len(buf)
	buf = strconv.AppendInt(buf, res.Limit, 10)
	ends[2] = len(buf)
	buf = strconv.AppendInt(buf, res.Remaining, 10)
	ends[3] = len(buf)
	buf = appendSeconds(buf, t)
	ends[4] = len(buf)
	s := string(buf)
	vals := make([]string, 5)
	from := 0
	for i, end := range ends {
		vals[i] = s[from:end]
		from = end
	}
	h[headerPolicy] = vals[0:1:1]
	h[headerRateLimit] = vals[1:2:2]
	h[headerLimit] = vals[2:3:3]
	h[headerRemaining] = vals[3:4:4]
	h[headerReset] = vals[4:5:5]
	if refused && wait != client.Never {
		// X-RateLimit-Reset is then the wait, in the same delay-seconds: share its value.
		h["Retry-After"] = vals[4:5:5]
	}
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

func writeJSON(w http.ResponseWriter, status int, b body) {
	var arr [128]byte
	data := b.appendJSON(arr[:0])
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Content-Length"] = []string{strconv.Itoa(len(data))}
	w.WriteHeader(status)
	w.Write(data)
}
