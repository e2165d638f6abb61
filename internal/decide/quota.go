package decide

import (
	"reflect"
	"strconv"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/calendar"
)

// maxSFInteger is the largest Integer a Structured Field may carry (RFC 9651, section 3.3.1).
const maxSFInteger = 999_999_999_999_999

// Quota is a limit the quota values report, under its policy name, counted in Unit ("" for
// requests, the draft's default).
type Quota struct {
	Name  string
	Limit client.Limit
	Unit  string
}

// ResetFormat is the form of the reset sent beside the draft's fields (X-RateLimit-Reset).
type ResetFormat uint8

const (
	ResetUnix  ResetFormat = iota // the Unix time, in seconds rounded up
	ResetDelta                    // the seconds until then, rounded up, as RateLimit's t
	ResetNone                     // none
)

// Values are the quota values of one decision, written into one buffer that the caller turns
// into one string and slices: two allocations per call, not ten.
type Values struct {
	Buf []byte
	// Ends are where each value ends in Buf, in this order: RateLimit-Policy, RateLimit, the
	// deciding limit's limit and remaining, and with ResetUnix the reset's Unix time; N of
	// them. Each starts where the previous ends.
	Ends [5]int
	N    int
	// TFrom and TEnd hold t's digits, the deciding limit's seconds, which Retry-After and a
	// delta reset repeat.
	TFrom, TEnd int
	// Retry says a refusal with a wait: t is that wait, sent as Retry-After.
	Retry bool
}

// AppendValues writes the quota values of a decision on quotas, the one that decided first:
// res is its reply. A refused call's t is wait, the Retry-After it gets, because the draft
// asks that Retry-After not point before the end of t; a served call's t is the time until
// the limiter is back to its initial state. RateLimit-Policy lists every limit, and RateLimit
// every limit whose state is known: each (client.AllowAllEach's, in the order of quotas) has
// the others', whose t is the wait of a limit that refused, else its reset; with each nil
// (client.AllowAll), RateLimit has the deciding limit alone. The limit and remaining values
// describe the deciding limit.
//
// A decision the principal's block refused (res.Blocked) replies the block's limit, 0: the
// values say the deciding limit's quota instead, with r=0 (nothing is admissible while
// blocked), and t its wait, the block's remaining time. A Calendar's w is the length of the
// window that holds now, and its reset the window's end, both from its boundaries: a window
// that holds no units yet has no reset in the reply (ResetAfter 0).
func AppendValues(buf []byte, c Clock, reset ResetFormat, quotas []Quota, res client.Result, each []client.Result, wait time.Duration, refused bool) Values {
	t := res.ResetAfter
	if len(each) > 0 && each[0].Limit != 0 {
		// its own reset: the reply of several limits of one key says the longest of theirs
		t = each[0].ResetAfter
	}
	retry := refused && wait != client.Never
	if retry {
		t = wait
	}
	var wall int64 // Unix nanoseconds, read when a Calendar needs it
	clock := func() int64 {
		if wall == 0 {
			wall = c.Wall()
		}
		return wall
	}
	// A Calendar's reset is its window's end by its boundaries, whether or not the reply has
	// one (a window that holds no units has none), and a Unix reset counts from the clock that
	// read them: the end itself, not the coarse clock's tick later.
	// An operator's override (client.Options.Overrides) replaced the code's limit in the
	// decision: the values describe the limit enforced, its q, its w and its window.
	enforced := func(i int) client.Limit {
		var o *client.Override
		switch {
		case i < len(each) && each[i].Override != nil:
			o = each[i].Override
		case i == 0:
			o = res.Override
		}
		if o != nil && o.Limit != nil {
			return o.Limit
		}
		return quotas[i].Limit
	}
	calendarReset := false
	if !retry {
		if _, left, ok := CalendarSpan(enforced(0), clock); ok {
			t, calendarReset = left, true
		}
	}
	limit := res.Limit
	if res.Blocked {
		limit = quotaLimit(enforced(0), each, 0)
	}
	v := Values{Retry: retry}
	// Policy names are restricted to characters a Structured Field String holds unescaped.
	for i, q := range quotas {
		if i > 0 {
			buf = append(buf, ", "...)
		}
		buf = append(append(append(buf, '"'), q.Name...), `";q=`...)
		l := enforced(i)
		if i == 0 {
			buf = strconv.AppendInt(buf, limit, 10)
		} else {
			buf = strconv.AppendInt(buf, quotaLimit(l, each, i), 10)
		}
		if length, _, ok := CalendarSpan(l, clock); ok {
			buf = strconv.AppendInt(append(buf, ";w="...), Seconds(length), 10)
		} else if w, ok := Window(l); ok {
			buf = strconv.AppendInt(append(buf, ";w="...), w, 10)
		}
		if q.Unit != "" {
			// the draft's quota unit; ValidName's characters need no escaping in a String
			buf = append(append(append(buf, `;qu="`...), q.Unit...), '"')
		}
	}
	v.Ends[0] = len(buf)
	buf = append(append(append(buf, '"'), quotas[0].Name...), `";r=`...)
	buf = strconv.AppendInt(buf, res.Remaining, 10)
	buf = append(buf, ";t="...)
	v.TFrom = len(buf)
	buf = AppendSeconds(buf, t)
	v.TEnd = len(buf)
	for i := 1; i < len(each) && i < len(quotas); i++ {
		e := each[i]
		if e.Limit == 0 {
			continue // its state could not be read
		}
		et := e.ResetAfter
		if !e.Allowed && e.RetryAfter != client.Never {
			et = e.RetryAfter
		} else if _, left, ok := CalendarSpan(enforced(i), clock); ok {
			et = left
		}
		buf = append(append(append(buf, `, "`...), quotas[i].Name...), `";r=`...)
		buf = strconv.AppendInt(buf, e.Remaining, 10)
		buf = AppendSeconds(append(buf, ";t="...), et)
	}
	v.Ends[1] = len(buf)
	buf = strconv.AppendInt(buf, limit, 10)
	v.Ends[2] = len(buf)
	buf = strconv.AppendInt(buf, res.Remaining, 10)
	v.Ends[3] = len(buf)
	v.N = 4
	if reset == ResetUnix {
		from := wall
		if !calendarReset {
			from = c.Now()
		}
		buf = AppendUnix(buf, from, t)
		v.Ends[4] = len(buf)
		v.N = 5
	}
	v.Buf = buf
	return v
}

// AppendUnix appends the Unix time d after now (Unix nanoseconds), in seconds rounded up: a
// client that waits until then has waited at least d.
func AppendUnix(b []byte, now int64, d time.Duration) []byte {
	at := now + int64(max(d, 0))
	s := at / int64(time.Second)
	if at%int64(time.Second) > 0 {
		s++
	}
	return strconv.AppendInt(b, s, 10)
}

// AppendSeconds appends d as delay-seconds, rounded up: a client that waits that long has
// waited at least d.
func AppendSeconds(b []byte, d time.Duration) []byte {
	if d <= 0 {
		return append(b, '0')
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return strconv.AppendInt(b, s, 10)
}

// Window is the RateLimit-Policy w of a limit in seconds, rounded up to at least 1 (the draft
// wants a non-zero integer): client.Quota's Window (a bucket's time to refill or drain its
// whole Capacity, so that q per w is its long-run rate), or none when it has no window.
func Window(l client.Limit) (int64, bool) {
	d := l.Quota().Window
	if d <= 0 {
		return 0, false
	}
	return Seconds(d), true
}

// Seconds is d > 0 in whole seconds, rounded up, at most the largest Structured Field Integer.
func Seconds(d time.Duration) int64 {
	return min(maxSFInteger, (int64(d)-1)/int64(time.Second)+1)
}

// quotaLimit is the q of quotas[i], whose enforced limit is l: its own state's Limit when
// each has it, else l's.
func quotaLimit(l client.Limit, each []client.Result, i int) int64 {
	if i < len(each) && each[i].Limit != 0 {
		return each[i].Limit
	}
	return l.Quota().Limit
}

// CalendarSpan is, when l is a client.Calendar (or a pointer to one, or embeds one), the
// window that holds now (Unix nanoseconds, read only then): its length, the RateLimit-Policy
// w, and the time left until its end, the reset. Its Quota has the length alone, by the host's
// clock, and the reply of a window that holds no units has no reset. ok is false for any other
// limit, and for a Calendar whose boundaries cannot be computed (the client refuses it too).
func CalendarSpan(l client.Limit, now func() int64) (length, left time.Duration, ok bool) {
	if plainLimit(l) {
		// the common limits, on every call: no Calendar copied, no reflection
		return 0, 0, false
	}
	c, ok := CalendarOf(l)
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

// CalendarOf is l as a client.Calendar. The type switch answers the limits of the client
// without reflection, on every call; a type of the caller's that embeds a Calendar (and so
// is one, by its promoted methods) is read by reflection.
func CalendarOf(l client.Limit) (client.Calendar, bool) {
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
