package override

import (
	"fmt"
	"time"

	"github.com/rlfn/rlfn/internal/calendar"
)

// Values are an override's Fields read for its algorithm: durations, a mode, a calendar's
// period and anchor. Whether the library takes them is for the caller's limit to say.
type Values struct {
	Limit, Capacity, Rate, Reserve int64
	Window, Period, Lease, Penalty time.Duration
	Shape                          bool            // a leaky bucket in shape mode
	Calendar                       calendar.Period // a calendar's period
	Anchor                         time.Time       // a calendar's anchor, in its zone
}

// fieldsOf are the fields each algorithm takes besides reserve (every one but concurrency's
// takes penalty too), in the order their mistakes are reported.
var fieldsOf = map[string][]string{
	"fixed_window":   {"limit", "window"},
	"sliding_log":    {"limit", "window"},
	"sliding_window": {"limit", "window"},
	"token_bucket":   {"capacity", "rate", "period"},
	"leaky_bucket":   {"capacity", "rate", "period", "mode"},
	"calendar":       {"limit", "period", "anchor", "zone"},
	"concurrency":    {"limit", "lease"},
}

// Algorithms are the algorithms an override takes, as the library names them.
func Algorithms() []string {
	return []string{"fixed_window", "sliding_log", "sliding_window", "token_bucket", "leaky_bucket", "calendar", "concurrency"}
}

// Values reads f for algorithm: a field the algorithm does not take is an error (it would be
// silently ignored), as is an unknown algorithm, a duration or period that does not parse, a
// mode that is neither police nor shape, a zone that does not load.
func (f Fields) Values(algorithm string) (Values, error) {
	takes, ok := fieldsOf[algorithm]
	if !ok {
		return Values{}, fmt.Errorf("unknown algorithm %q (one of %v)", algorithm, Algorithms())
	}
	set := map[string]bool{
		"limit": f.Limit != 0, "capacity": f.Capacity != 0, "rate": f.Rate != 0, "window": f.Window != 0,
		"period": f.Period != "", "mode": f.Mode != "", "lease": f.Lease != 0, "anchor": f.Anchor != "",
		"zone": f.Zone != "", "penalty": f.Penalty != 0,
	}
	allowed := map[string]bool{"reserve": true, "penalty": algorithm != "concurrency"}
	for _, n := range takes {
		allowed[n] = true
	}
	for _, n := range []string{"limit", "capacity", "rate", "window", "period", "mode", "lease", "anchor", "zone", "penalty"} {
		if set[n] && !allowed[n] {
			return Values{}, fmt.Errorf("%s does not take %s", algorithm, n)
		}
	}
	v := Values{Limit: f.Limit, Capacity: f.Capacity, Rate: f.Rate, Reserve: f.Reserve,
		Window: time.Duration(f.Window), Lease: time.Duration(f.Lease), Penalty: time.Duration(f.Penalty)}
	switch algorithm {
	case "token_bucket", "leaky_bucket":
		if f.Period != "" {
			d, err := time.ParseDuration(f.Period)
			if err != nil {
				return Values{}, fmt.Errorf("period %q is not a duration: write one with its unit, e.g. 500ms, 1s, 1m", f.Period)
			}
			v.Period = d
		}
		switch f.Mode {
		case "", "police":
		case "shape":
			v.Shape = true
		default:
			return Values{}, fmt.Errorf("mode is police or shape, not %q", f.Mode)
		}
	case "calendar":
		for p := calendar.Day; p <= calendar.Year; p++ {
			if p.String() == f.Period {
				v.Calendar = p
			}
		}
		if v.Calendar == 0 {
			return Values{}, fmt.Errorf("a calendar's period is day, week, month or year, not %q", f.Period)
		}
		a, err := anchor(v.Calendar, f.Anchor, f.Zone)
		if err != nil {
			return Values{}, err
		}
		v.Anchor = a
	}
	return v, nil
}

// anchor is a calendar's anchor from its text and zone, as rlfn call reads --anchor and
// --zone: neither is the zero anchor (midnight UTC); a zone alone, local midnight on Monday
// 1 January 2001 (days from midnight, weeks from Monday, months from the 1st). The anchor
// sets the windows' phase for period (calendar.Anchor).
func anchor(period calendar.Period, text, zone string) (time.Time, error) {
	if text == "" && zone == "" {
		return time.Time{}, nil
	}
	loc := time.UTC
	if zone != "" {
		if zone == "Local" {
			return time.Time{}, fmt.Errorf("zone %q is not a time zone: give an IANA name such as Europe/Berlin, or UTC", zone)
		}
		var err error
		if loc, err = time.LoadLocation(zone); err != nil {
			return time.Time{}, fmt.Errorf("zone %q does not load: give an IANA name such as Europe/Berlin, or UTC", zone)
		}
	}
	if text == "" {
		return time.Date(2001, time.January, 1, 0, 0, 0, 0, loc), nil
	}
	if t, ok := calendar.ParseAnchor(period, text, loc); ok {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("anchor %q is not a date and clock time such as 2026-01-31T00:00 (no offset: the zone gives it)", text)
}
