package httplimit

import (
	"net/http"
	"reflect"
	"strconv"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/calendar"
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
//
// A decision the principal's block refused (res.Blocked) replies the block's limit, 0: the
// headers say the deciding limit's quota instead, with r=0 (nothing is admissible while
// blocked), and t its wait, the block's remaining time. A Calendar's w is the length of the
// window that holds now, and its reset the window's end, both from its boundaries: a window
// that holds no units yet has no reset in the reply (ResetAfter 0).
func (m *Middleware) setHeaders(h http.Header, hide bool, quotas []quota, res client.Result, each []client.Result, wait time.Duration, refused bool) {
	t := res.ResetAfter
	if len(each) > 0 && each[0].Limit != 0 {
		// its own reset: the reply of several limits of one key says the longest of theirs
		t = each[0].ResetAfter
	}
	retry := refused && wait != client.Never
	if retry {
		t = wait
	}
	if hide {
		if retry {
			h["Retry-After"] = []string{string(appendSeconds(nil, wait))}
		}
		return
	}
	var wall int64 // Unix nanoseconds, read when a Calendar needs it
	clock := func() int64 {
		if wall == 0 {
			wall = m.wall()
		}
		return wall
	}
	// A Calendar's reset is its window's end by its boundaries, whether or not the reply has
	// one (a window that holds no units has none), and X-RateLimit-Reset counts from the
	// clock that read them: the end itself, not the coarse clock's tick later.
	calendarReset := false
	if !retry {
		if _, left, ok := calendarSpan(quotas[0].limit, clock); ok {
			t, calendarReset = left, true
		}
	}
	limit := res.Limit
	if res.Blocked {
		limit = quotaLimit(quotas[0], each, 0)
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
		if i == 0 {
			buf = strconv.AppendInt(buf, limit, 10)
		} else {
			buf = strconv.AppendInt(buf, quotaLimit(q, each, i), 10)
		}
		if length, _, ok := calendarSpan(q.limit, clock); ok {
			buf = strconv.AppendInt(append(buf, ";w="...), seconds(length), 10)
		} else if w, ok := window(q.limit); ok {
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
		} else if _, left, ok := calendarSpan(quotas[i].limit, clock); ok {
			et = left
		}
		buf = append(append(append(buf, `, "`...), quotas[i].name...), `";r=`...)
		buf = strconv.AppendInt(buf, e.Remaining, 10)
		buf = appendSeconds(append(buf, ";t="...), et)
	}
	ends[1] = len(buf)
	buf = strconv.AppendInt(buf, limit, 10)
	ends[2] = len(buf)
	buf = strconv.AppendInt(buf, res.Remaining, 10)
	ends[3] = len(buf)
	n := 4
	if m.opts.Reset == ResetUnix {
		from := wall
		if !calendarReset {
			from = m.now()
		}
		buf = appendUnix(buf, from, t)
		ends[4] = len(buf)
		n = 5
	}
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
	return seconds(d), true
}

// seconds is d > 0 in whole seconds, rounded up, at most the largest Structured Field Integer.
func seconds(d time.Duration) int64 {
	return min(maxSFInteger, (int64(d)-1)/int64(time.Second)+1)
}

// quotaLimit is the q of quotas[i]: its own state's Limit when each has it, else its
// configured Limit.
func quotaLimit(q quota, each []client.Result, i int) int64 {
	if i < len(each) && each[i].Limit != 0 {
		return each[i].Limit
	}
	return q.limit.Quota().Limit
}

// calendarSpan is, when l is a client.Calendar (or a pointer to one, or embeds one), the
// window that holds now (Unix nanoseconds, read only then): its length, the RateLimit-Policy
// w, and the time left until its end, the reset. Its Quota has the length alone, by the host's
// clock, and the reply of a window that holds no units has no reset. ok is false for any other
// limit, and for a Calendar whose boundaries cannot be computed (the client refuses it too).
func calendarSpan(l client.Limit, now func() int64) (length, left time.Duration, ok bool) {
	if plainLimit(l) {
		// the common limits, on every request: no Calendar copied, no reflection
		return 0, 0, false
	}
	c, ok := calendarOf(l)
	if !ok {
		return 0, 0, false
	}
	n := now()
	b, err := calendar.Windows(calendar.Period(c.Period), c.Anchor, time.Unix(0, n))
	if err != nil {
		return 0, 0, false
	}
	return time.Duration(b[2]-b[1]) * time.Millisecond, time.Duration(b[2]*int64(time.Millisecond) - n), true
}

// calendarOf is l as a client.Calendar. The type switch answers the limits of the client
// without reflection, on every request; a type of the caller's that embeds a Calendar (and so
// is one, by its promoted methods) is read by reflection.
func calendarOf(l client.Limit) (client.Calendar, bool) {
	switch c := l.(type) {
	case client.Calendar:
		return c, true
	case *client.Calendar:
		if c == nil {
			return client.Calendar{}, false
		}
		return *c, true
	}
	if plainLimit(l) {
		return client.Calendar{}, false
	}
	return embeddedCalendar(l)
}

// plainLimit reports the client's limits other than Calendar, by value or by pointer: no
// Calendar is in them.
func plainLimit(l client.Limit) bool {
	switch l.(type) {
	case client.TokenBucket, client.FixedWindow, client.SlidingWindow, client.SlidingLog, client.LeakyBucket,
		*client.TokenBucket, *client.FixedWindow, *client.SlidingWindow, *client.SlidingLog, *client.LeakyBucket:
		return true
	}
	return false
}

var calendarType = reflect.TypeFor[client.Calendar]()

// embeddedCalendar is the Calendar that l, a struct of the caller's (or a pointer to one),
// embeds, as client.Calendar or *client.Calendar.
func embeddedCalendar(l client.Limit) (client.Calendar, bool) {
	v := reflect.ValueOf(l)
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return client.Calendar{}, false
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return client.Calendar{}, false
	}
	f, ok := v.Type().FieldByName("Calendar")
	if !ok || !f.Anonymous {
		return client.Calendar{}, false
	}
	fv, err := v.FieldByIndexErr(f.Index)
	if err != nil {
		return client.Calendar{}, false // through a nil embedded pointer
	}
	switch {
	case fv.Type() == calendarType:
		return fv.Interface().(client.Calendar), true
	case fv.Type() == reflect.PointerTo(calendarType) && !fv.IsNil():
		return *fv.Interface().(*client.Calendar), true
	}
	return client.Calendar{}, false
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
