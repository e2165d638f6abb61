package calendar

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// The zones the tests load: the contract's two DST zones, UTC, and three whose rules stress
// other corners (a 30-minute DST shift, DST that skipped midnight, a +05:45 offset).
var testZones = []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Sao_Paulo", "Asia/Kathmandu"}

// unavailable skips a test this machine cannot run, or fails it under CI=true, where every
// test must run (the CI installs tzdata, and its kernel allows user namespaces).
func unavailable(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (CI=true: failing instead of skipping)", why)
	}
	t.Skip(why)
}

// systemZone loads a zone with time.LoadLocation from the system's tzdata. The test binary
// also embeds time/tzdata (tzdata_linux_test.go), which LoadLocation only falls back to, so
// the file is checked to exist: these tests must read the system's data.
func systemZone(t testing.TB, name string) *time.Location {
	t.Helper()
	if name != "UTC" {
		if _, err := os.Stat(filepath.Join("/usr/share/zoneinfo", name)); err != nil {
			unavailable(t, fmt.Sprintf("no system tzdata for %s: %v", name, err))
		}
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

type tcase struct {
	name   string
	zone   string // the anchor's zone; with anchor "" the zero anchor is used
	period Period
	anchor string        // wall clock in zone, "2006-01-02 15:04:05.999999999"
	now    string        // RFC 3339 with an offset
	want   [4]string     // RFC 3339 with the zone's offset, so DST shows
	mid    time.Duration // the caller's window length, when worth stating
}

var tableCases = []tcase{
	// 23- and 25-hour days, anchored at midnight.
	{"berlin 23h day", "Europe/Berlin", Day, "2026-01-01 00:00:00", "2026-03-29T12:00:00+02:00",
		[4]string{"2026-03-28T00:00:00+01:00", "2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00", "2026-03-31T00:00:00+02:00"}, 23 * time.Hour},
	{"berlin 25h day", "Europe/Berlin", Day, "2026-01-01 00:00:00", "2026-10-25T12:00:00+01:00",
		[4]string{"2026-10-24T00:00:00+02:00", "2026-10-25T00:00:00+02:00", "2026-10-26T00:00:00+01:00", "2026-10-27T00:00:00+01:00"}, 25 * time.Hour},
	{"new york 23h day", "America/New_York", Day, "2026-01-01 00:00:00", "2026-03-08T12:00:00-04:00",
		[4]string{"2026-03-07T00:00:00-05:00", "2026-03-08T00:00:00-05:00", "2026-03-09T00:00:00-04:00", "2026-03-10T00:00:00-04:00"}, 23 * time.Hour},
	{"new york 25h day", "America/New_York", Day, "2026-01-01 00:00:00", "2026-11-01T12:00:00-05:00",
		[4]string{"2026-10-31T00:00:00-04:00", "2026-11-01T00:00:00-04:00", "2026-11-02T00:00:00-05:00", "2026-11-03T00:00:00-05:00"}, 25 * time.Hour},

	// A skipped anchor clock time: time.Date moves Berlin's 02:30 forward to 03:30 CEST...
	{"berlin skipped 02:30", "Europe/Berlin", Day, "2026-01-01 02:30:00", "2026-03-29T12:00:00+02:00",
		[4]string{"2026-03-28T02:30:00+01:00", "2026-03-29T03:30:00+02:00", "2026-03-30T02:30:00+02:00", "2026-03-31T02:30:00+02:00"}, 23 * time.Hour},
	{"berlin skipped 02:30, 03:00 CEST still the day before", "Europe/Berlin", Day, "2026-01-01 02:30:00", "2026-03-29T03:00:00+02:00",
		[4]string{"2026-03-27T02:30:00+01:00", "2026-03-28T02:30:00+01:00", "2026-03-29T03:30:00+02:00", "2026-03-30T02:30:00+02:00"}, 24 * time.Hour},
	// ...and New York's back to 01:30 EST, so there the short day is the one before.
	{"new york skipped 02:30", "America/New_York", Day, "2026-01-01 02:30:00", "2026-03-08T12:00:00-04:00",
		[4]string{"2026-03-07T02:30:00-05:00", "2026-03-08T01:30:00-05:00", "2026-03-09T02:30:00-04:00", "2026-03-10T02:30:00-04:00"}, 24 * time.Hour},
	{"new york skipped 02:30, 01:00 EST the short day", "America/New_York", Day, "2026-01-01 02:30:00", "2026-03-08T01:00:00-05:00",
		[4]string{"2026-03-06T02:30:00-05:00", "2026-03-07T02:30:00-05:00", "2026-03-08T01:30:00-05:00", "2026-03-09T02:30:00-04:00"}, 23 * time.Hour},
	// An anchor given on the very day the zone skips its clock time: windows start at that
	// clock time on every day that has it, and on the day that skips it at time.Date's instant
	// (not at 03:30 every day, as the anchor's own instant would say).
	{"berlin anchor 02:30 on the day it is skipped, that day", "Europe/Berlin", Day, "2026-03-29 02:30:00", "2026-03-29T12:00:00+02:00",
		[4]string{"2026-03-28T02:30:00+01:00", "2026-03-29T03:30:00+02:00", "2026-03-30T02:30:00+02:00", "2026-03-31T02:30:00+02:00"}, 23 * time.Hour},
	{"berlin anchor 02:30 on the day it is skipped, in june", "Europe/Berlin", Day, "2026-03-29 02:30:00", "2026-06-10T12:00:00+02:00",
		[4]string{"2026-06-09T02:30:00+02:00", "2026-06-10T02:30:00+02:00", "2026-06-11T02:30:00+02:00", "2026-06-12T02:30:00+02:00"}, 24 * time.Hour},
	{"berlin week anchor on the skipped sunday 02:30", "Europe/Berlin", Week, "2026-03-29 02:30:00", "2026-04-08T12:00:00+02:00",
		[4]string{"2026-03-29T03:30:00+02:00", "2026-04-05T02:30:00+02:00", "2026-04-12T02:30:00+02:00", "2026-04-19T02:30:00+02:00"}, 168 * time.Hour},
	{"berlin month anchor on the skipped 29 march 02:30", "Europe/Berlin", Month, "2026-03-29 02:30:00", "2026-04-15T12:00:00+02:00",
		[4]string{"2026-02-28T02:30:00+01:00", "2026-03-29T03:30:00+02:00", "2026-04-29T02:30:00+02:00", "2026-05-29T02:30:00+02:00"}, 31*24*time.Hour - time.Hour},
	{"berlin year anchor on the skipped 29 march 02:30", "Europe/Berlin", Year, "2026-03-29 02:30:00", "2027-06-01T00:00:00+02:00",
		[4]string{"2026-03-29T03:30:00+02:00", "2027-03-29T02:30:00+02:00", "2028-03-29T02:30:00+02:00", "2029-03-29T02:30:00+02:00"}, 366 * 24 * time.Hour},
	{"new york anchor 02:30 on the day it is skipped, the day after", "America/New_York", Day, "2026-03-08 02:30:00", "2026-03-09T12:00:00-04:00",
		[4]string{"2026-03-08T01:30:00-05:00", "2026-03-09T02:30:00-04:00", "2026-03-10T02:30:00-04:00", "2026-03-11T02:30:00-04:00"}, 24 * time.Hour},

	// An anchor in the future sets the phase only, as one in the past does: the window that
	// holds now, not one that starts at the anchor.
	{"month anchor in the future", "Europe/Berlin", Month, "2030-05-31 00:00:00", "2026-02-15T12:00:00+01:00",
		[4]string{"2025-12-31T00:00:00+01:00", "2026-01-31T00:00:00+01:00", "2026-02-28T00:00:00+01:00", "2026-03-31T00:00:00+02:00"}, 28 * 24 * time.Hour},
	{"day anchor in the future", "UTC", Day, "2099-01-15 06:00:00", "2026-02-15T12:00:00Z",
		[4]string{"2026-02-14T06:00:00Z", "2026-02-15T06:00:00Z", "2026-02-16T06:00:00Z", "2026-02-17T06:00:00Z"}, 24 * time.Hour},

	// A repeated anchor clock time: time.Date picks Berlin's second 02:30 (CET)...
	{"berlin repeated 02:30", "Europe/Berlin", Day, "2026-01-01 02:30:00", "2026-10-25T12:00:00+01:00",
		[4]string{"2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+01:00", "2026-10-26T02:30:00+01:00", "2026-10-27T02:30:00+01:00"}, 24 * time.Hour},
	{"berlin repeated 02:30, the first 02:45 in the long day", "Europe/Berlin", Day, "2026-01-01 02:30:00", "2026-10-25T02:45:00+02:00",
		[4]string{"2026-10-23T02:30:00+02:00", "2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+01:00", "2026-10-26T02:30:00+01:00"}, 25 * time.Hour},
	// ...and New York's first 01:30 (EDT).
	{"new york repeated 01:30", "America/New_York", Day, "2026-01-01 01:30:00", "2026-11-01T12:00:00-05:00",
		[4]string{"2026-10-31T01:30:00-04:00", "2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00", "2026-11-03T01:30:00-05:00"}, 25 * time.Hour},
	{"new york repeated 01:30, the second 01:15", "America/New_York", Day, "2026-01-01 01:30:00", "2026-11-01T01:15:00-05:00",
		[4]string{"2026-10-31T01:30:00-04:00", "2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00", "2026-11-03T01:30:00-05:00"}, 25 * time.Hour},

	// Months anchored on the 29th, 30th and 31st across February, leap (2024) and common.
	{"month 31st, leap february", "Europe/Berlin", Month, "2023-01-31 00:00:00", "2024-02-15T12:00:00+01:00",
		[4]string{"2023-12-31T00:00:00+01:00", "2024-01-31T00:00:00+01:00", "2024-02-29T00:00:00+01:00", "2024-03-31T00:00:00+01:00"}, 29 * 24 * time.Hour},
	{"month 31st, from 29 february 2024", "Europe/Berlin", Month, "2023-01-31 00:00:00", "2024-03-01T00:00:00+01:00",
		[4]string{"2024-01-31T00:00:00+01:00", "2024-02-29T00:00:00+01:00", "2024-03-31T00:00:00+01:00", "2024-04-30T00:00:00+02:00"}, 31 * 24 * time.Hour},
	{"month 31st, common february", "Europe/Berlin", Month, "2023-01-31 00:00:00", "2025-03-01T00:00:00+01:00",
		[4]string{"2025-01-31T00:00:00+01:00", "2025-02-28T00:00:00+01:00", "2025-03-31T00:00:00+02:00", "2025-04-30T00:00:00+02:00"}, 31*24*time.Hour - time.Hour},
	{"month 30th, common february, now at the boundary", "Europe/Berlin", Month, "2023-04-30 00:00:00", "2026-02-28T00:00:00+01:00",
		[4]string{"2026-01-30T00:00:00+01:00", "2026-02-28T00:00:00+01:00", "2026-03-30T00:00:00+02:00", "2026-04-30T00:00:00+02:00"}, 30*24*time.Hour - time.Hour},
	{"month 30th, leap february, last millisecond", "Europe/Berlin", Month, "2023-04-30 00:00:00", "2024-02-29T23:59:59.999+01:00",
		[4]string{"2024-01-30T00:00:00+01:00", "2024-02-29T00:00:00+01:00", "2024-03-30T00:00:00+01:00", "2024-04-30T00:00:00+02:00"}, 30 * 24 * time.Hour},
	{"month 29th, common february, now at the boundary", "Europe/Berlin", Month, "2023-01-29 00:00:00", "2025-02-28T00:00:00+01:00",
		[4]string{"2025-01-29T00:00:00+01:00", "2025-02-28T00:00:00+01:00", "2025-03-29T00:00:00+01:00", "2025-04-29T00:00:00+02:00"}, 29 * 24 * time.Hour},
	{"month 29th, common february, a millisecond before", "Europe/Berlin", Month, "2023-01-29 00:00:00", "2025-02-27T23:59:59.999+01:00",
		[4]string{"2024-12-29T00:00:00+01:00", "2025-01-29T00:00:00+01:00", "2025-02-28T00:00:00+01:00", "2025-03-29T00:00:00+01:00"}, 30 * 24 * time.Hour},
	{"month 29th, leap february", "Europe/Berlin", Month, "2023-01-29 00:00:00", "2024-02-29T00:00:00+01:00",
		[4]string{"2024-01-29T00:00:00+01:00", "2024-02-29T00:00:00+01:00", "2024-03-29T00:00:00+01:00", "2024-04-29T00:00:00+02:00"}, 29 * 24 * time.Hour},
	{"month zero anchor: the 1st, midnight UTC", "", Month, "", "2026-02-15T10:00:00Z",
		[4]string{"2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z"}, 28 * 24 * time.Hour},

	// Weeks from Monday (the zero anchor) and from a Sunday.
	{"week zero anchor: monday UTC", "", Week, "", "2026-03-04T12:00:00Z",
		[4]string{"2026-02-23T00:00:00Z", "2026-03-02T00:00:00Z", "2026-03-09T00:00:00Z", "2026-03-16T00:00:00Z"}, 168 * time.Hour},
	{"week zero anchor, now at monday midnight", "", Week, "", "2026-03-02T00:00:00Z",
		[4]string{"2026-02-23T00:00:00Z", "2026-03-02T00:00:00Z", "2026-03-09T00:00:00Z", "2026-03-16T00:00:00Z"}, 168 * time.Hour},
	{"week zero anchor, sunday's last millisecond", "", Week, "", "2026-03-08T23:59:59.999Z",
		[4]string{"2026-02-23T00:00:00Z", "2026-03-02T00:00:00Z", "2026-03-09T00:00:00Z", "2026-03-16T00:00:00Z"}, 168 * time.Hour},
	{"week zero anchor, now's zone does not matter", "", Week, "", "2026-03-08T20:00:00-04:00",
		[4]string{"2026-03-02T00:00:00Z", "2026-03-09T00:00:00Z", "2026-03-16T00:00:00Z", "2026-03-23T00:00:00Z"}, 168 * time.Hour},
	{"week from sunday", "America/New_York", Week, "2026-03-01 00:00:00", "2026-03-04T12:00:00-05:00",
		[4]string{"2026-02-22T00:00:00-05:00", "2026-03-01T00:00:00-05:00", "2026-03-08T00:00:00-05:00", "2026-03-15T00:00:00-04:00"}, 168 * time.Hour},
	{"week from sunday, saturday's last millisecond", "America/New_York", Week, "2026-03-01 00:00:00", "2026-03-07T23:59:59.999-05:00",
		[4]string{"2026-02-22T00:00:00-05:00", "2026-03-01T00:00:00-05:00", "2026-03-08T00:00:00-05:00", "2026-03-15T00:00:00-04:00"}, 168 * time.Hour},
	{"week from sunday, 167h across DST", "America/New_York", Week, "2026-03-01 00:00:00", "2026-03-08T00:00:00-05:00",
		[4]string{"2026-03-01T00:00:00-05:00", "2026-03-08T00:00:00-05:00", "2026-03-15T00:00:00-04:00", "2026-03-22T00:00:00-04:00"}, 167 * time.Hour},

	// A year anchored on 29 February starts on the 28th in common years.
	{"year from 29 february, common year", "Europe/Berlin", Year, "2024-02-29 00:00:00", "2025-06-01T00:00:00+02:00",
		[4]string{"2024-02-29T00:00:00+01:00", "2025-02-28T00:00:00+01:00", "2026-02-28T00:00:00+01:00", "2027-02-28T00:00:00+01:00"}, 365 * 24 * time.Hour},
	{"year from 29 february, now at 28 february", "Europe/Berlin", Year, "2024-02-29 00:00:00", "2025-02-28T00:00:00+01:00",
		[4]string{"2024-02-29T00:00:00+01:00", "2025-02-28T00:00:00+01:00", "2026-02-28T00:00:00+01:00", "2027-02-28T00:00:00+01:00"}, 365 * 24 * time.Hour},
	{"year from 29 february, a millisecond before", "Europe/Berlin", Year, "2024-02-29 00:00:00", "2025-02-27T23:59:59.999+01:00",
		[4]string{"2023-02-28T00:00:00+01:00", "2024-02-29T00:00:00+01:00", "2025-02-28T00:00:00+01:00", "2026-02-28T00:00:00+01:00"}, 365 * 24 * time.Hour},
	{"year from 29 february, back to the 29th in 2028", "Europe/Berlin", Year, "2024-02-29 00:00:00", "2028-03-01T00:00:00+01:00",
		[4]string{"2027-02-28T00:00:00+01:00", "2028-02-29T00:00:00+01:00", "2029-02-28T00:00:00+01:00", "2030-02-28T00:00:00+01:00"}, 365 * 24 * time.Hour},
	{"year zero anchor: 1 january UTC", "", Year, "", "2026-07-01T00:00:00Z",
		[4]string{"2025-01-01T00:00:00Z", "2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"}, 365 * 24 * time.Hour},

	// The anchor's sub-millisecond part is truncated: windows start at .001, not .0019.
	{"sub-millisecond anchor truncated", "UTC", Day, "2000-01-01 06:00:00.0019", "2026-01-01T06:00:00.001Z",
		[4]string{"2025-12-31T06:00:00.001Z", "2026-01-01T06:00:00.001Z", "2026-01-02T06:00:00.001Z", "2026-01-03T06:00:00.001Z"}, 24 * time.Hour},
	{"now's sub-millisecond part before a boundary", "UTC", Day, "2000-01-01 06:00:00.0019", "2026-01-01T06:00:00.0009Z",
		[4]string{"2025-12-30T06:00:00.001Z", "2025-12-31T06:00:00.001Z", "2026-01-01T06:00:00.001Z", "2026-01-02T06:00:00.001Z"}, 24 * time.Hour},
}

// runTable checks tableCases with zones from load, so that the system's tzdata and Go's
// embedded copy are held to the same expectations.
func runTable(t *testing.T, load func(testing.TB, string) *time.Location) {
	for _, c := range tableCases {
		t.Run(c.name, func(t *testing.T) {
			var anchor time.Time
			if c.anchor != "" {
				// as the tools read an anchor's text: Anchor, which is time.Date's instant
				// unless the zone skips the clock time on that date
				a, err := time.Parse("2006-01-02 15:04:05.999999999", c.anchor)
				if err != nil {
					t.Fatal(err)
				}
				y, m, d := a.Date()
				h, mi, sec := a.Clock()
				anchor = Anchor(c.period, y, m, d, h, mi, sec, a.Nanosecond(), load(t, c.zone))
			}
			got, err := Windows(c.period, anchor, mustParse(t, c.now))
			if err != nil {
				t.Fatal(err)
			}
			var want [4]int64
			for i, s := range c.want {
				want[i] = mustParse(t, s).UnixMilli()
			}
			if got != want {
				t.Errorf("got %v, want %v", format(got, anchor.Location()), c.want)
			}
			if mid := time.Duration(got[2]-got[1]) * time.Millisecond; c.mid != 0 && mid != c.mid {
				t.Errorf("window is %v long, want %v", mid, c.mid)
			}
		})
	}
}

func TestWindowsTable(t *testing.T) { runTable(t, systemZone) }

func mustParse(t testing.TB, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func format(b [4]int64, loc *time.Location) [4]string {
	var s [4]string
	for i, ms := range b {
		s[i] = time.UnixMilli(ms).In(loc).Format(time.RFC3339Nano)
	}
	return s
}

func TestWindowsBounds(t *testing.T) {
	utc := func(y int, m time.Month, d, h int) time.Time { return time.Date(y, m, d, h, 0, 0, 0, time.UTC) }
	ms := func(y int, m time.Month, d int) int64 { return utc(y, m, d, 0).UnixMilli() }
	for _, c := range []struct {
		name   string
		period Period
		now    time.Time
		want   [4]int64 // zero when ErrRange is expected
	}{
		{"earliest days", Day, utc(1970, 1, 3, 0), [4]int64{86_400_000, 172_800_000, 259_200_000, 345_600_000}},
		{"b1 would be 0", Day, utc(1970, 1, 2, 23), [4]int64{}},
		{"now is 0", Day, time.UnixMilli(0), [4]int64{}},
		{"latest days: b4 just under the maximum", Day, utc(33658, 9, 25, 12),
			[4]int64{ms(33658, 9, 24), ms(33658, 9, 25), ms(33658, 9, 26), ms(33658, 9, 27)}},
		{"b4 past the maximum", Day, utc(33658, 9, 26, 0), [4]int64{}},
		{"now past the maximum", Day, time.UnixMilli(MaxMs + 1), [4]int64{}},
		{"latest years", Year, utc(33656, 6, 1, 0),
			[4]int64{ms(33655, 1, 1), ms(33656, 1, 1), ms(33657, 1, 1), ms(33658, 1, 1)}},
		{"years past the maximum", Year, utc(33657, 1, 1, 0), [4]int64{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Windows(c.period, time.Time{}, c.now)
			if c.want == ([4]int64{}) {
				if !errors.Is(err, ErrRange) {
					t.Fatalf("got %v, %v; want ErrRange", got, err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

func TestWindowsErrors(t *testing.T) {
	now := time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)
	for _, p := range []Period{0, Year + 1} {
		if _, err := Windows(p, time.Time{}, now); !errors.Is(err, ErrPeriod) {
			t.Errorf("period %v: got %v, want ErrPeriod", p, err)
		}
	}
	// time.Local is whatever the process found; a quota must name its zone.
	for _, a := range []time.Time{time.Date(2026, 1, 1, 0, 0, 0, 0, time.Local), time.Now()} {
		if _, err := Windows(Day, a, now); !errors.Is(err, ErrLocal) {
			t.Errorf("anchor %v: got %v, want ErrLocal", a, err)
		}
	}
	// Samoa skipped 30 December 2011: that day's midnight is the instant of the 29th's,
	// so the boundaries around it do not increase.
	apia := systemZone(t, "Pacific/Apia")
	midnight := time.Date(2000, 1, 1, 0, 0, 0, 0, apia)
	if got, err := Windows(Day, midnight, time.Date(2011, 12, 29, 12, 0, 0, 0, apia)); !errors.Is(err, ErrNotIncreasing) {
		t.Errorf("Apia 2011-12-29: got %v, %v; want ErrNotIncreasing", format(got, apia), err)
	}
}

// A zero instant in another zone is still the zero anchor: midnight UTC, not 00:53 LMT.
func TestZeroAnchorInAZone(t *testing.T) {
	berlin := systemZone(t, "Europe/Berlin")
	got, err := Windows(Day, time.Time{}.In(berlin), time.Date(2026, 3, 29, 12, 0, 0, 0, berlin))
	want := [4]int64{}
	for i := range want {
		want[i] = time.Date(2026, 3, 28+i, 0, 0, 0, 0, time.UTC).UnixMilli()
	}
	if err != nil || got != want {
		t.Fatalf("got %v, %v; want %v", format(got, time.UTC), err, format(want, time.UTC))
	}
}

var sweepAnchors = []string{"", "2024-02-29 00:00:00", "2023-01-31 02:30:00", "2026-03-01 01:30:00", "2000-01-05 23:59:59.999"}

// sweep computes the windows of every test zone, period and sweepAnchors entry, for nows
// from 2018 to 2031 a little under half a day apart, checks that the boundaries increase
// and chain (a new window's neighbours are the old ones, shifted), and returns a digest of
// all of them, so that two sources of tzdata can be compared.
func sweep(t testing.TB, load func(testing.TB, string) *time.Location) string {
	h := sha256.New()
	const step = 11*time.Hour + 7*time.Minute
	for _, zone := range testZones {
		loc := load(t, zone)
		for _, as := range sweepAnchors {
			var anchor time.Time
			if as != "" {
				a, err := time.ParseInLocation("2006-01-02 15:04:05.999999999", as, loc)
				if err != nil {
					t.Fatal(err)
				}
				anchor = a
			}
			for p := Day; p <= Year; p++ {
				var prev [4]int64
				for now := time.Date(2018, 1, 1, 0, 0, 0, 0, time.UTC); now.Year() < 2031; now = now.Add(step) {
					b, err := Windows(p, anchor, now)
					if err != nil {
						t.Fatalf("%s %v anchor %q now %v: %v", zone, p, as, now, err)
					}
					checkInvariants(t, b, now)
					if prev != ([4]int64{}) && b != prev && [3]int64(b[:3]) != [3]int64(prev[1:]) {
						t.Fatalf("%s %v anchor %q now %v: %v does not follow %v", zone, p, as, now, b, prev)
					}
					prev = b
					_ = binary.Write(h, binary.LittleEndian, b)
				}
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

func checkInvariants(t testing.TB, b [4]int64, now time.Time) {
	t.Helper()
	n := now.UnixMilli()
	if !(b[1] <= n && n < b[2]) {
		t.Fatalf("now %d not in [%d, %d)", n, b[1], b[2])
	}
	for i := 1; i < 4; i++ {
		if l := b[i] - b[i-1]; l < 1 || l > MaxWindowMs {
			t.Fatalf("window %d of %v is %d ms long", i, b, l)
		}
	}
	if b[0] < MinMs || b[3] > MaxMs {
		t.Fatalf("%v outside the library's bounds", b)
	}
}

func TestSweepIncreases(t *testing.T) { sweep(t, systemZone) }

// TestWindowsProperty checks random anchors and nows: the invariants, that every now in a
// window (its first and last millisecond) gives the same boundaries, and that the
// neighbouring windows' own boundaries are these, shifted by one.
func TestWindowsProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(20260301, 1))
	locs := make([]*time.Location, len(testZones))
	for i, z := range testZones {
		locs[i] = systemZone(t, z)
	}
	lo := time.Date(1971, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	hi := time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	for range 4000 {
		loc := locs[r.IntN(len(locs))]
		p := Period(1 + r.IntN(4))
		anchor := time.UnixMilli(r.Int64N(hi-lo) + lo).Add(time.Duration(r.IntN(1e6))).In(loc)
		if r.IntN(10) == 0 {
			anchor = time.Time{}
		}
		now := time.UnixMilli(r.Int64N(hi-lo) + lo)
		b, err := Windows(p, anchor, now)
		if err != nil {
			t.Fatalf("%v anchor %v now %v: %v", p, anchor, now, err)
		}
		checkInvariants(t, b, now)
		for _, ms := range []int64{b[1], b[2] - 1} {
			if got, err := Windows(p, anchor, time.UnixMilli(ms)); err != nil || got != b {
				t.Fatalf("%v anchor %v: now %d gave %v, %v; want %v", p, anchor, ms, got, err, b)
			}
		}
		next, err1 := Windows(p, anchor, time.UnixMilli(b[2]))
		prev, err2 := Windows(p, anchor, time.UnixMilli(b[1]-1))
		if err1 != nil || err2 != nil || !slices.Equal(next[:3], b[1:]) || !slices.Equal(prev[1:], b[:3]) {
			t.Fatalf("%v anchor %v: neighbours %v and %v do not chain with %v", p, anchor, prev, next, b)
		}
	}
}
