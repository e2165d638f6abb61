// Package limitspec is the library's algorithms as rlfn's tools take them: one table from an
// algorithm's name and fields (the flags and --also specs of rlfn call, the forms of the
// playground) to a client limit, with each field's bounds.
//
// The bounds are the client's: they are read off its Validate, which applies the library's
// bounds, rather than written again here, so that the client stays the one place that
// declares them and a tool cannot drift from what the client (and so the library) accepts.
package limitspec

import (
	"fmt"
	"math"
	"reflect"
	"time"

	"github.com/rlfn/rlfn/client"
	cal "github.com/rlfn/rlfn/internal/calendar"
	"github.com/rlfn/rlfn/internal/keys"
)

// Kind is what a field holds.
type Kind uint8

const (
	Count    Kind = iota // a whole number of units: a limit, a capacity, a rate, a reserve
	Duration             // a whole number of milliseconds: a window, a period, a lease
	Mode                 // a leaky bucket's mode, by its name (see ParseMode)
	Text                 // a limit's Name
	Calendar             // a calendar's period, by its name: day, week, month or year (see ParsePeriod)
	Time                 // a calendar's anchor: a date and clock time in its zone (see Anchor)
	Zone                 // a calendar's time zone, by its IANA name (see Anchor)
)

// Field is one field of a limit, named as the tools name it: rlfn call's --limit and limit=,
// the playground's limit (its durations in milliseconds: windowMs).
type Field struct {
	Name string
	Kind Kind
	// Min and Max are the widest range the client's Validate accepts for the field, for some
	// value of the other fields: a Count's units, a Duration's milliseconds; zero for a Mode or
	// a Text. Validate still judges the limit as a whole (a reserve up to the limit, a sliding
	// window's Limit * Window below 2^53).
	Min, Max int64
	// Optional fields may be left out: a Mode (police), a Penalty (none), a calendar's
	// anchor and zone (midnight UTC, weeks from Monday, months from the 1st).
	Optional bool
}

// Algorithm is one of the library's algorithms as the tools take it.
type Algorithm struct {
	Name string // as the library and the client's keys name it: fixed_window
	// Fields are the fields it takes, in the order of the tools' messages; every algorithm
	// takes Shared too. Each one but the Optional ones must be given.
	Fields []Field
	// limit builds its client limit; nil for concurrency, which is no client.Limit: its calls
	// take leases (see Concurrency).
	limit func(Values) client.Limit
}

// The library's bounds, read off the client's Validate: the largest value it accepts with
// every other field at its least.
var (
	// MaxUnits is the largest number of units the library takes: a limit, a capacity, a
	// rate, a reserve, a cost or a refund.
	MaxUnits = largest(func(n int64) bool {
		return client.FixedWindow{Limit: n, Window: time.Millisecond}.Validate() == nil
	}, math.MaxInt64)
	// maxLog is a sliding log's largest limit: the server keeps an entry per unit.
	maxLog = largest(func(n int64) bool {
		return client.SlidingLog{Limit: n, Window: time.Millisecond}.Validate() == nil
	}, math.MaxInt64)
	// maxMs is the longest window, period or lease in milliseconds; the search stops where
	// milliseconds would overflow a time.Duration.
	maxMs = largest(func(ms int64) bool {
		return client.FixedWindow{Limit: 1, Window: time.Duration(ms) * time.Millisecond}.Validate() == nil
	}, math.MaxInt64/int64(time.Millisecond))
	// maxPenaltyMs is the longest Penalty in milliseconds (its least, 0, is none).
	maxPenaltyMs = largest(func(ms int64) bool {
		return client.FixedWindow{Limit: 1, Window: time.Millisecond, Penalty: time.Duration(ms) * time.Millisecond}.Validate() == nil
	}, math.MaxInt64/int64(time.Millisecond))
	// maxCalendarLimit is a calendar's largest limit.
	maxCalendarLimit = largest(func(n int64) bool {
		return client.Calendar{Limit: n, Period: client.Day}.Validate() == nil
	}, math.MaxInt64)
)

// MaxLeaseID is the longest lease holder id the library takes, in bytes (its MAX_ID): the
// client checks an id only when it makes a Lease, so this one is declared, and the test holds
// it to both.
const MaxLeaseID = 128

// The fields, each declared once for every algorithm that takes it.
var (
	limit    = Field{Name: "limit", Kind: Count, Min: 1, Max: MaxUnits}
	logLimit = Field{Name: "limit", Kind: Count, Min: 1, Max: maxLog}
	window   = Field{Name: "window", Kind: Duration, Min: 1, Max: maxMs}
	capacity = Field{Name: "capacity", Kind: Count, Min: 1, Max: MaxUnits}
	rate     = Field{Name: "rate", Kind: Count, Min: 1, Max: MaxUnits}
	period   = Field{Name: "period", Kind: Duration, Min: 1, Max: maxMs}
	mode     = Field{Name: "mode", Kind: Mode, Optional: true}
	lease    = Field{Name: "lease", Kind: Duration, Min: 1, Max: maxMs}
	// penalty is every limit's (not concurrency's, which has no denial to punish): how long a
	// denial blocks the principal, 0 for none.
	penalty = Field{Name: "penalty", Kind: Duration, Min: 0, Max: maxPenaltyMs, Optional: true}
	// A calendar's period shares its name with a bucket's (the tools' --period and period=),
	// not its kind: which one a tool reads is the algorithm's (see Algorithm.Field).
	calLimit = Field{Name: "limit", Kind: Count, Min: 1, Max: maxCalendarLimit}
	calendar = Field{Name: "period", Kind: Calendar}
	anchor   = Field{Name: "anchor", Kind: Time, Optional: true}
	zone     = Field{Name: "zone", Kind: Zone, Optional: true}
)

// BlockFor is how long an operator's block lasts (the client's Limiter.Block): the bounds of a
// Penalty, but at least 1ms, since a block of 0 is none.
var BlockFor = Field{Name: "for", Kind: Duration, Min: 1, Max: maxPenaltyMs}

// Shared are the fields every algorithm takes, optional: the units kept for critical callers
// (up to the limit), and the name that tells two limits of one algorithm apart.
var Shared = []Field{
	{Name: "reserve", Kind: Count, Min: 0, Max: MaxUnits},
	{Name: "name", Kind: Text},
}

// Algorithms are the library's algorithms, in the order the tools list them.
var Algorithms = []Algorithm{
	{"fixed_window", []Field{limit, window, penalty}, func(v Values) client.Limit {
		return client.FixedWindow{Limit: v.Limit, Window: v.Window, Reserve: v.Reserve, Name: v.Name, Penalty: v.Penalty}
	}},
	{"sliding_log", []Field{logLimit, window, penalty}, func(v Values) client.Limit {
		return client.SlidingLog{Limit: v.Limit, Window: v.Window, Reserve: v.Reserve, Name: v.Name, Penalty: v.Penalty}
	}},
	{"sliding_window", []Field{limit, window, penalty}, func(v Values) client.Limit {
		return client.SlidingWindow{Limit: v.Limit, Window: v.Window, Reserve: v.Reserve, Name: v.Name, Penalty: v.Penalty}
	}},
	{"token_bucket", []Field{capacity, rate, period, penalty}, func(v Values) client.Limit {
		return client.TokenBucket{Capacity: v.Capacity, Rate: v.Rate, Period: v.Period, Reserve: v.Reserve, Name: v.Name, Penalty: v.Penalty}
	}},
	{"leaky_bucket", []Field{capacity, rate, period, mode, penalty}, func(v Values) client.Limit {
		return client.LeakyBucket{Capacity: v.Capacity, Rate: v.Rate, Period: v.Period, Mode: v.Mode, Reserve: v.Reserve, Name: v.Name, Penalty: v.Penalty}
	}},
	{"calendar", []Field{calLimit, calendar, anchor, zone, penalty}, func(v Values) client.Limit {
		return client.Calendar{Limit: v.Limit, Period: v.Calendar, Anchor: v.Anchor, Reserve: v.Reserve, Name: v.Name, Penalty: v.Penalty}
	}},
	{"concurrency", []Field{limit, lease}, nil},
}

// Values are a limit's fields as given; each algorithm reads its own.
type Values struct {
	Limit, Capacity, Rate, Reserve int64
	Window, Period, Lease, Penalty time.Duration
	Mode                           client.Mode
	Name                           string
	Calendar                       client.Period // a calendar's period (its field is "period")
	// Anchor is a calendar's anchor, in its zone: the anchor and zone fields together (see
	// Anchor).
	Anchor time.Time
}

// Count is the Count field named name, for a tool that reads fields by name; nil if there is
// none.
func (v *Values) Count(name string) *int64 {
	switch name {
	case limit.Name:
		return &v.Limit
	case capacity.Name:
		return &v.Capacity
	case rate.Name:
		return &v.Rate
	case Shared[0].Name:
		return &v.Reserve
	}
	return nil
}

// Duration is the Duration field named name; nil if there is none.
func (v *Values) Duration(name string) *time.Duration {
	switch name {
	case window.Name:
		return &v.Window
	case period.Name:
		return &v.Period
	case lease.Name:
		return &v.Lease
	case penalty.Name:
		return &v.Penalty
	}
	return nil
}

// Lookup is the algorithm named name.
func Lookup(name string) (Algorithm, bool) {
	for _, a := range Algorithms {
		if a.Name == name {
			return a, true
		}
	}
	return Algorithm{}, false
}

// Names are the algorithms' names, in order.
func Names() []string {
	names := make([]string, len(Algorithms))
	for i, a := range Algorithms {
		names[i] = a.Name
	}
	return names
}

// Fields is every field name once, in the order the tools check them: each algorithm's as
// they first appear, then Shared. A name two algorithms give fields of different kinds
// (period: a bucket's duration, a calendar's day, week, month or year) is listed once, as it
// first appears: Algorithm.Field is each algorithm's own.
func Fields() []Field {
	var all []Field
	seen := map[string]bool{}
	for _, a := range Algorithms {
		for _, f := range a.Fields {
			if !seen[f.Name] {
				seen[f.Name] = true
				all = append(all, f)
			}
		}
	}
	return append(all, Shared...)
}

// Field is a's field named name, Shared ones included.
func (a Algorithm) Field(name string) (Field, bool) {
	for _, fs := range [][]Field{a.Fields, Shared} {
		for _, f := range fs {
			if f.Name == name {
				return f, true
			}
		}
	}
	return Field{}, false
}

// Takes reports whether a takes the field named name (Shared ones included).
func (a Algorithm) Takes(name string) bool {
	_, ok := a.Field(name)
	return ok
}

// Key is the server key of key's limiter of this algorithm with v's Name under prefix: the
// client's Limiter.Key (or ConcurrencyKey) of the limit a.Limit(v) builds.
func (a Algorithm) Key(prefix, key string, v Values) string {
	return keys.Compose(prefix, key, a.Name, v.Name)
}

// BlockKey is the server key of key's block under prefix, <prefix>{<key>}:block: the key
// Limiter.Block, Unblock and PeekBlock reach, and that a limit's Penalty sets. It shares the
// principal's slot with the principal's limiters, so one call decides both.
func BlockKey(prefix, key string) string {
	return keys.Compose(prefix, key, "block", "")
}

// Leases reports whether a is concurrency: its calls take leases, and it has no client.Limit
// (see Concurrency).
func (a Algorithm) Leases() bool { return a.limit == nil }

// Limit is a's limit with v's fields, not validated; nil for an algorithm that Leases.
func (a Algorithm) Limit(v Values) client.Limit {
	if a.limit == nil {
		return nil
	}
	return a.limit(v)
}

// Concurrency is the concurrency limit with v's fields, not validated.
func Concurrency(v Values) client.Concurrency {
	return client.Concurrency{Limit: v.Limit, Lease: v.Lease, Reserve: v.Reserve, Name: v.Name}
}

// Modes are a leaky bucket's modes, the default first.
var Modes = []client.Mode{client.Police, client.Shape}

// ParseMode is the mode named s, as client.Mode's String names it: police or shape.
func ParseMode(s string) (client.Mode, bool) {
	for _, m := range Modes {
		if m.String() == s {
			return m, true
		}
	}
	return 0, false
}

// Periods are a calendar's periods, in order.
var Periods = []client.Period{client.Day, client.Week, client.Month, client.Year}

// ParsePeriod is the calendar period named s, as client.Period's String names it: day, week,
// month or year.
func ParsePeriod(s string) (client.Period, bool) {
	for _, p := range Periods {
		if p.String() == s {
			return p, true
		}
	}
	return 0, false
}

// zoneAnchor is where windows start in a zone when no anchor is given: local midnight on
// Monday 1 January 2001, so that days start at midnight, weeks on Monday, months on the 1st
// and years on 1 January, as the client's zero anchor does in UTC.
var zoneAnchor = time.Date(2001, time.January, 1, 0, 0, 0, 0, time.UTC)

// Anchor is a calendar's anchor from the tools' anchor and zone fields: text is a date and
// clock time as the zone's clocks read it (2026-01-31T00:00, 2026-01-31T09:30:00, or a date
// alone for midnight), zone an IANA name (Europe/Berlin; default UTC). Neither given is the
// client's zero anchor; a zone alone is local midnight, weeks from Monday, months from the
// 1st, years from 1 January. A zone that does not load is an error, and so is "Local": the
// client refuses time.Local, whose zone is whatever the process's environment says. The
// anchor sets the windows' phase for period (internal/calendar's Anchor): a clock time the zone skips on
// the date given starts the windows at that clock time on every day that has it.
func Anchor(period client.Period, text, zoneName string) (time.Time, error) {
	if text == "" && zoneName == "" {
		return time.Time{}, nil
	}
	loc := time.UTC
	if zoneName != "" {
		var err error
		if loc, err = LoadZone(zoneName); err != nil {
			return time.Time{}, err
		}
	}
	if text == "" {
		y, m, d := zoneAnchor.Date()
		return time.Date(y, m, d, 0, 0, 0, 0, loc), nil
	}
	if t, ok := cal.ParseAnchor(cal.Period(period), text, loc); ok {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%q is not a date and clock time such as 2026-01-31T00:00 (no offset: the zone gives it)", text)
}

// LoadZone loads the time zone named name (an IANA name such as Europe/Berlin, or UTC).
func LoadZone(name string) (*time.Location, error) {
	if name == "" || name == "Local" {
		// LoadLocation takes "" for UTC and "Local" for time.Local: neither names a zone.
		return nil, fmt.Errorf("%q is not a time zone: give an IANA name such as Europe/Berlin, or UTC", name)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		// Not err's text, which repeats the name unquoted: a name is often pasted, and may
		// hold anything.
		return nil, fmt.Errorf("%q does not load as a time zone: give an IANA name such as Europe/Berlin, or UTC", name)
	}
	return loc, nil
}

// largest is the largest n in [1, hi] for which valid holds, valid holding from 1 up to it and
// from there on no more. It panics if valid(1) is false: the client's bounds changed shape,
// and the table must be looked at again.
func largest(valid func(int64) bool, hi int64) int64 {
	if !valid(1) {
		panic("limitspec: the client refuses 1")
	}
	lo := int64(1) // valid(lo) holds
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if valid(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// RetryAfterMs is a Result's RetryAfter as the library replies it (retry_after_ms), as rlfn
// call's JSON and the playground's page show it: whole milliseconds, and -1 for client.Never.
func RetryAfterMs(d time.Duration) int64 {
	if d == client.Never {
		return -1
	}
	return d.Milliseconds()
}

// Reserve is a limit's Reserve, 0 for none and for a nil limit. Every limit has the field,
// whether passed as a value or a pointer, or embedded in a type of the caller's.
func Reserve(l client.Limit) int64 {
	v := reflect.ValueOf(l)
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return 0
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return 0
	}
	// FieldByName panics through a nil embedded pointer (a caller's type embedding a
	// *client.FixedWindow left nil): such a limit has no reserve to read.
	sf, ok := v.Type().FieldByName("Reserve")
	if !ok {
		return 0
	}
	if f, err := v.FieldByIndexErr(sf.Index); err == nil && f.CanInt() {
		return f.Int()
	}
	return 0
}
