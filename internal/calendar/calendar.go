// Package calendar computes the boundaries of calendar windows: days, weeks, months or years
// that start at an anchor's clock time in the anchor's time zone, as Unix milliseconds. The
// client uses it to compute the b1 b2 b3 b4 that rl_calendar takes, since Lua has no zone data.
package calendar

import (
	"errors"
	"fmt"
	"time"
)

// Period is the length of a calendar window. The zero Period is not a period, so a limit whose
// period was never set is refused rather than silently taken as daily.
type Period uint8

// The periods. A window starts at the anchor's clock time: every day (Day); on the anchor's
// weekday (Week); on the anchor's day of month, clamped to the month's last day (Month); on the
// anchor's month and day, 29 February clamped to the 28th in common years (Year).
const (
	Day Period = iota + 1
	Week
	Month
	Year
)

// String returns the period's lower-case name, as the CLI and error messages spell it.
func (p Period) String() string {
	switch p {
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	case Year:
		return "year"
	}
	return fmt.Sprintf("Period(%d)", uint8(p))
}

// The library's bounds on the boundaries it takes: Unix milliseconds from MinMs to MaxMs, each
// window at most MaxWindowMs long. Windows refuses boundaries the library would refuse.
const (
	MinMs       = 1
	MaxMs       = 999_999_999_999_999
	MaxWindowMs = 100_000_000_000
)

var (
	// ErrPeriod: the period is not Day, Week, Month or Year.
	ErrPeriod = errors.New("calendar: unknown period")
	// ErrLocal: the anchor is in time.Local. time.Local is whatever zone the process found
	// at start-up (often UTC in containers), so a quota would silently reset at the wrong
	// hour; the zone must be named (time.LoadLocation) or be UTC.
	ErrLocal = errors.New("calendar: anchor is in time.Local; give it a named zone")
	// ErrRange: the boundaries fall outside the library's bounds (MinMs to MaxMs) or a
	// window is longer than MaxWindowMs.
	ErrRange = errors.New("calendar: boundaries outside the library's bounds")
	// ErrNotIncreasing: the zone's rules make two consecutive boundaries equal or decreasing
	// (a zone that skips a whole calendar day, such as Pacific/Apia on 30 December 2011).
	// The library needs b1 < b2 < b3 < b4, and merging windows would be a choice the
	// contract does not make, so the caller gets an error instead.
	ErrNotIncreasing = errors.New("calendar: zone rules make window boundaries not increase")
)

// Windows returns the boundaries of the window of the given period that holds now, and of its
// neighbours, in Unix milliseconds: [previous start, current start, next start, the start
// after], so that b[1] <= now < b[2]. A boundary belongs to the window it starts.
//
// The anchor's Location is the zone, and its clock time, weekday, day of month and month (in
// that zone) say where windows start; which fields count depends on the period. A zero anchor
// (IsZero) means midnight UTC, weeks from Monday, months from the 1st, years from 1 January.
// An anchor in time.Local is refused (ErrLocal). The anchor's clock time is truncated to the
// millisecond, so boundaries are whole milliseconds. Only now's instant matters, not its zone.
//
// Each boundary is the instant time.Date gives for the local wall-clock time, so where
// daylight saving time skips or repeats the anchor's clock time, the boundary is time.Date's
// normalisation of it; days of 23 and 25 hours follow.
func Windows(period Period, anchor, now time.Time) ([4]int64, error) {
	var b [4]int64
	if period < Day || period > Year {
		return b, fmt.Errorf("%w: %d", ErrPeriod, uint8(period))
	}
	if anchor.IsZero() {
		// time.Time{} is already Monday 1 January of year 1, 00:00 UTC; spelled out so
		// that a zero instant carried into another zone still means midnight UTC.
		anchor = time.Date(1, time.January, 1, 0, 0, 0, 0, time.UTC)
	}
	if anchor.Location() == time.Local {
		return b, ErrLocal
	}
	nowMs := now.UnixMilli()
	if nowMs < MinMs || nowMs > MaxMs {
		// Checked first so that time.Date never sees years beyond the library's range.
		return b, fmt.Errorf("%w: now is %d ms", ErrRange, nowMs)
	}

	r := newRule(period, anchor, now)
	// Step from the window of now's local date to the one holding now. time.Date moves
	// a boundary by at most a zone's offset change from its wall clock, so a step or two
	// suffices; the cap only guards against a zone whose boundaries go backwards.
	j, steps := 0, 0
	for r.start(j) > nowMs {
		j--
		if steps++; steps > 4 {
			return b, fmt.Errorf("%w in %s near %d ms", ErrNotIncreasing, r.loc, nowMs)
		}
	}
	for r.start(j+1) <= nowMs {
		j++
		if steps++; steps > 8 {
			return b, fmt.Errorf("%w in %s near %d ms", ErrNotIncreasing, r.loc, nowMs)
		}
	}
	for i := range b {
		b[i] = r.start(j - 1 + i)
	}
	for i := 1; i < len(b); i++ {
		if b[i] <= b[i-1] {
			return b, fmt.Errorf("%w in %s: %d then %d ms", ErrNotIncreasing, r.loc, b[i-1], b[i])
		}
		if b[i]-b[i-1] > MaxWindowMs {
			return b, fmt.Errorf("%w: a window of %d ms", ErrRange, b[i]-b[i-1])
		}
	}
	if b[0] < MinMs || b[3] > MaxMs {
		return b, fmt.Errorf("%w: %d to %d ms", ErrRange, b[0], b[3])
	}
	return b, nil
}

// rule numbers the windows of one period and anchor from the one whose start falls on now's
// local date (day), week, month or year: start(0) is that window's start, start(j) the j-th
// after it. Numbering by calendar date rather than by instant is what makes every caller in
// one window compute the same boundaries, whatever its now.
type rule struct {
	period                   Period
	loc                      *time.Location
	year                     int
	month                    time.Month
	day                      int // now's date for Day, Week and Month; unused for Year
	anchorMonth              time.Month
	anchorDay                int
	hour, minute, sec, nanos int
}

func newRule(period Period, anchor, now time.Time) rule {
	loc := anchor.Location()
	r := rule{period: period, loc: loc}
	r.hour, r.minute, r.sec = anchor.Clock()
	r.nanos = anchor.Nanosecond() / 1e6 * 1e6
	_, r.anchorMonth, r.anchorDay = anchor.Date()
	local := now.In(loc)
	r.year, r.month, r.day = local.Date()
	if period == Week {
		// Back to the anchor's weekday on or before now's local date.
		r.day -= (int(local.Weekday()) - int(anchor.Weekday()) + 7) % 7
	}
	return r
}

// start returns the j-th window's start in Unix milliseconds.
func (r rule) start(j int) int64 {
	y, m, d := r.year, r.month, r.day
	switch r.period {
	case Day:
		d += j
	case Week:
		d += 7 * j
	case Month:
		// Normalise the month here rather than in time.Date: the day must be clamped
		// to the target month's length, not overflow into the next month.
		n := y*12 + int(m) - 1 + j
		y, m = floorDiv(n, 12), time.Month(n-floorDiv(n, 12)*12+1)
		d = min(r.anchorDay, daysIn(y, m))
	case Year:
		y += j
		m = r.anchorMonth
		d = min(r.anchorDay, daysIn(y, m))
	}
	return time.Date(y, m, d, r.hour, r.minute, r.sec, r.nanos, r.loc).UnixMilli()
}

func daysIn(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

func floorDiv(a, b int) int {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// anchorLayouts are the anchors the tools take as text (rlfn's --anchor, rlfn-rls's anchor,
// an override's): the clock on the zone's wall, no offset, since the zone gives it.
var anchorLayouts = []string{"2006-01-02T15:04:05.000", "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"}

// ParseAnchor reads text, a date and clock time as loc's clocks read it (2026-01-31T00:00,
// 2026-01-31T09:30:00, 2026-01-31T09:30:00.250, or a date alone for midnight), as the anchor
// of period's windows (see Anchor). It reports false for text in none of those forms.
func ParseAnchor(period Period, text string, loc *time.Location) (time.Time, bool) {
	for _, layout := range anchorLayouts {
		if t, err := time.Parse(layout, text); err == nil {
			y, m, d := t.Date()
			h, mi, s := t.Clock()
			return Anchor(period, y, m, d, h, mi, s, t.Nanosecond(), loc), true
		}
	}
	return time.Time{}, false
}

// Anchor is the anchor of period's windows for a date and clock time as loc's clocks read
// them. Windows takes from an anchor only its clock time, weekday, day of month and month (as
// period needs them), never its date otherwise, so an anchor sets the windows' phase: one in
// the past or in the future starts the same windows.
//
// Where loc skips the clock time on that date (a daylight saving gap: 02:30 on 29 March 2026
// in Europe/Berlin), time.Date would move it past the gap (03:30), and every window would
// start at 03:30. Anchor returns instead that clock time on the nearest earlier date of the
// same phase that has it (the day, the week, the same day of an earlier month, the same date
// of an earlier year): windows then start at 02:30 on every day that has it, and on a day
// that skips it at the instant time.Date gives. A time.Time made with time.Date has lost the
// clock time already; Windows cannot tell it from one given after the gap.
func Anchor(period Period, year int, month time.Month, day, hour, minute, sec, nsec int, loc *time.Location) time.Time {
	at := func(y int, m time.Month, d int) (time.Time, bool) {
		t := time.Date(y, m, d, hour, minute, sec, nsec, loc)
		ty, tm, td := t.Date()
		th, tmi, ts := t.Clock()
		return t, ty == y && tm == m && td == d && th == hour && tmi == minute && ts == sec
	}
	given, ok := at(year, month, day)
	if ok {
		return given
	}
	if day < 1 || day > daysIn(year, month) {
		return given // not a date: time.Date's normalisation is all there is
	}
	// A zone skips a clock time on a few days a year at most: a handful of steps back finds
	// one that has it (the cap guards against a zone that would skip it forever).
	y, m, d := year, month, day
	for range 100 {
		switch period {
		case Day:
			y, m, d = time.Date(y, m, d-1, 12, 0, 0, 0, time.UTC).Date()
		case Week:
			y, m, d = time.Date(y, m, d-7, 12, 0, 0, 0, time.UTC).Date()
		case Month:
			// the same day of month, in the month before that has it
			for {
				if m--; m < time.January {
					y, m = y-1, time.December
				}
				if day <= daysIn(y, m) {
					break
				}
			}
		case Year:
			// the same date, in the year before that has it (29 February: a leap year)
			for {
				y--
				if day <= daysIn(y, m) {
					break
				}
			}
		default:
			return given
		}
		if t, ok := at(y, m, d); ok {
			return t
		}
	}
	return given
}
