package client

import (
	"errors"
	"time"

	"github.com/rlfn/rlfn/internal/calendar"
)

// Calendar admits at most Limit units per calendar window (library 1.2.0): a day, a week, a
// month or a year that starts at Anchor's clock time in Anchor's time zone. "10,000 calls per
// month, resetting at midnight Berlin time on the customer's billing day" is
//
//	berlin, _ := time.LoadLocation("Europe/Berlin")
//	client.Calendar{Limit: 10_000, Period: client.Month, Anchor: time.Date(2026, 1, 31, 0, 0, 0, 0, berlin)}
//
// whose windows start at local midnight on the 31st, or on the month's last day when it has
// fewer: 28 or 29 February, 30 April. Days are 23 or 25 hours long where daylight saving time
// changes; where it skips or repeats the anchor's clock time, a window starts at the instant
// time.Date gives for it.
//
// The client computes each call's window boundaries (Lua has no zone data) and the server's
// clock picks the window among three consecutive ones, so hosts whose clocks are off by less
// than a window never split, double or skip one. Within its window a Calendar is a fixed
// window: a denied call consumes nothing, RetryAfter is the time to the window's end.
type Calendar struct {
	Limit  int64  // 1 to 999999999999999
	Period Period // Day, Week, Month or Year; required
	// Anchor says where windows start: its Location is the zone; its clock time (to the
	// millisecond) starts every window; its weekday starts a Week, its day of month a Month
	// (clamped to the month's last day), its month and day a Year (29 February clamped to the
	// 28th in common years). The zero Anchor is midnight UTC, weeks from Monday, months from
	// the 1st, years from 1 January. An Anchor in time.Local is refused: a process's Local
	// is whatever its environment said at start-up (often UTC in a container), never the
	// customer's zone; load the zone with time.LoadLocation.
	//
	// The Anchor sets the windows' phase only, never when the quota begins: one in the future
	// (a billing day to come) counts in the window that holds now, as one in the past does.
	// time.Date moves a clock time its zone skips that day (02:30 on 29 March 2026 in Berlin)
	// past the gap (03:30), and that clock time then starts every window: give the Anchor on
	// a day that has its clock time (any day of the same phase).
	Anchor  time.Time
	Reserve int64         // 0 to Limit, default 0 (none): units only critical calls may take (see Limit)
	Name    string        // default "": the key without a name; set, a second calendar for one principal (see Limit)
	Penalty time.Duration // 0 (none), or 1ms to 10^11ms: blocks the principal after a denial (see FixedWindow.Penalty)
}

// Period is the length of a Calendar's windows.
type Period uint8

// The periods. The zero Period is none: a Calendar whose Period was never set is refused.
const (
	Day   = Period(calendar.Day)
	Week  = Period(calendar.Week)
	Month = Period(calendar.Month)
	Year  = Period(calendar.Year)
)

// String returns the period's lower-case name: day, week, month or year.
func (p Period) String() string { return calendar.Period(p).String() }

// Validate implements Limit.
func (l Calendar) Validate() error {
	if err := checkInt("Calendar.Limit", l.Limit, 1, maxInt); err != nil {
		return err
	}
	if l.Period < Day || l.Period > Year {
		return &LimitError{Field: "Calendar.Period", Reason: "must be Day, Week, Month or Year, got " + l.Period.String()}
	}
	if l.Anchor.Location() == time.Local && !l.Anchor.IsZero() {
		return &LimitError{Field: "Calendar.Anchor", Reason: "is in time.Local: load the zone with time.LoadLocation"}
	}
	if err := checkInt("Calendar.Reserve", l.Reserve, 0, l.Limit); err != nil {
		return err
	}
	return checkPenalty("Calendar.Penalty", l.Penalty)
}

// Quota implements Limit: Window is the length of the window that holds now by this host's
// clock (a day of 23, 24 or 25 hours; a month of 28 to 31 days), as the RateLimit headers'
// w describes it.
func (l Calendar) Quota() Quota {
	b, err := calendar.Windows(calendar.Period(l.Period), l.Anchor, time.Now())
	if err != nil {
		return Quota{Limit: l.Limit}
	}
	return Quota{Limit: l.Limit, Window: ms(b[2] - b[1])}
}

func (l Calendar) spec() spec {
	return spec{calendarAlg, params{limit: l.Limit, reserve: l.Reserve, name: l.Name, penalty: l.Penalty.Milliseconds(),
		period: l.Period, anchor: l.Anchor}}
}

// bound computes a calendar call's window boundaries by the wall clock (wallClock); other
// calls have none, and read no clock. The middle window holds now, so a server whose clock is
// off by less than a window either way still finds its own.
func (l *Limiter) bound(c *call) error {
	if c.alg != calendarAlg {
		return nil
	}
	now := l.wallClock()
	b, err := calendar.Windows(calendar.Period(c.period), c.anchor, time.Unix(0, now))
	if err != nil {
		field := "Calendar.Anchor"
		if errors.Is(err, calendar.ErrRange) {
			field = "Calendar"
		}
		return &LimitError{Field: field, Reason: err.Error()}
	}
	c.bounds = b
	return nil
}

// localCalendar is rl_calendar in process: a fixed window whose start and end are the call's
// boundaries (LocalFallback computes them with the same clock that decides).
type localCalendar struct{}

// window is the window of p's boundaries that holds now (ns), in milliseconds.
func (localCalendar) window(p params, now int64) (start, end int64) {
	nowMs := now / int64(time.Millisecond)
	for i := 0; i < 3; i++ {
		if p.bounds[i] <= nowMs && nowMs < p.bounds[i+1] {
			return p.bounds[i], p.bounds[i+1]
		}
	}
	return p.bounds[1], p.bounds[2]
}

func (a localCalendar) decide(st *localState, p params, cost, reserve, instances, now int64, write bool) Result {
	start, end := a.window(p, now)
	return decideWindow(st, share(p.limit, instances), cost, reserve, start, end, now, write)
}

func (a localCalendar) refund(st *localState, p params, n, instances, now int64) Result {
	if start, _ := a.window(p, now); st.t == start {
		st.a = max(0, st.a-n)
	}
	return refunded(a, st, p, instances, now)
}
