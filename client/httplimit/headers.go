package httplimit

import (
	"encoding/json"
	"math/bits"
	"net/http"
	"strconv"
	"time"

	"github.com/rlfn/rlfn/client"
)

// maxSFInteger is the largest Integer a Structured Field may carry (RFC 9651, section 3.3.1).
const maxSFInteger = 999_999_999_999_999

// setHeaders writes the rate-limit headers of a decision. A refused request's t is wait, the
// Retry-After it gets, because the draft asks that Retry-After not point before the end of t;
// a served request's t is the time until the limiter is back to its initial state.
func setHeaders(h http.Header, p Policy, res client.Result, wait time.Duration, refused bool) {
	t := res.ResetAfter
	if refused && wait != client.Never {
		t = wait
	}
	limit := strconv.FormatInt(res.Limit, 10)
	remaining := strconv.FormatInt(res.Remaining, 10)
	reset := seconds(t)
	// Policy names are restricted to characters a Structured Field String holds unescaped.
	policy := `"` + p.Name + `";q=` + limit
	if w, ok := window(p.Limit); ok {
		policy += ";w=" + strconv.FormatInt(w, 10)
	}
	h.Set("RateLimit-Policy", policy)
	h.Set("RateLimit", `"`+p.Name+`";r=`+remaining+";t="+reset)
	h.Set("X-RateLimit-Limit", limit)
	h.Set("X-RateLimit-Remaining", remaining)
	h.Set("X-RateLimit-Reset", reset)
}

// seconds formats d as delay-seconds, rounded up: a client that waits that long has waited
// at least d.
func seconds(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return strconv.FormatInt(s, 10)
}

// window is the RateLimit-Policy w of a limit in seconds, rounded up to at least 1 (the draft
// wants a non-zero integer): the window of a windowed limit; for a bucket, the time Rate per
// Period takes to refill (or drain) the whole Capacity, so that q per w is its long-run rate.
func window(l client.Limit) (int64, bool) {
	switch l := l.(type) {
	case client.FixedWindow:
		return windowSeconds(l.Window)
	case *client.FixedWindow:
		return windowSeconds(l.Window)
	case client.SlidingLog:
		return windowSeconds(l.Window)
	case *client.SlidingLog:
		return windowSeconds(l.Window)
	case client.SlidingWindow:
		return windowSeconds(l.Window)
	case *client.SlidingWindow:
		return windowSeconds(l.Window)
	case client.TokenBucket:
		return bucketSeconds(l.Capacity, l.Rate, l.Period)
	case *client.TokenBucket:
		return bucketSeconds(l.Capacity, l.Rate, l.Period)
	case client.LeakyBucket:
		return bucketSeconds(l.Capacity, l.Rate, l.Period)
	case *client.LeakyBucket:
		return bucketSeconds(l.Capacity, l.Rate, l.Period)
	}
	return 0, false
}

func windowSeconds(d time.Duration) (int64, bool) {
	if d <= 0 {
		return 0, false
	}
	return max(1, (int64(d)+int64(time.Second)-1)/int64(time.Second)), true
}

// bucketSeconds is ceil(capacity * period / rate) in seconds, exactly: capacity and period in
// milliseconds each go up to about 10^15 and 10^11, so their product needs 128 bits.
func bucketSeconds(capacity, rate int64, period time.Duration) (int64, bool) {
	ms := period.Milliseconds()
	if capacity <= 0 || rate <= 0 || ms <= 0 {
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(capacity), uint64(ms))
	if hi >= uint64(rate) {
		return maxSFInteger, true
	}
	q, rem := bits.Div64(hi, lo, uint64(rate))
	if rem != 0 {
		q++
	}
	s := (q + 999) / 1000
	return int64(min(max(s, 1), maxSFInteger)), true
}

// body is the JSON body of a response the middleware writes itself.
type body struct {
	Error        string `json:"error"`
	Policy       string `json:"policy,omitempty"`
	RetryAfterMs *int64 `json:"retry_after_ms,omitempty"` // absent when no wait helps
}

func writeJSON(w http.ResponseWriter, status int, b body) {
	data, _ := json.Marshal(b) // three plain fields: cannot fail
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(data)+1))
	w.WriteHeader(status)
	w.Write(append(data, '\n'))
}
