package playground

import (
	"strings"
	"testing"
	"time"
)

func TestPlanBoundary(t *testing.T) {
	const s = int64(time.Second / time.Microsecond)
	for _, c := range []struct {
		name     string
		nowUs    int64
		windowMs int64
		want     boundaryPlan
	}{
		{"right after an edge: the next one", 100*s + 1, 5000, boundaryPlan{105 * s, 105*s - 500000, 105*s + 500000}},
		{"a tenth of a 1s window", 100 * s, 1000, boundaryPlan{101 * s, 101*s - 100000, 101*s + 100000}},
		{"on an edge: the next one", 105 * s, 5000, boundaryPlan{110 * s, 110*s - 500000, 110*s + 500000}},
		{"too close to the first burst: one more window", 105*s - 500000 - 49999, 5000, boundaryPlan{110 * s, 110*s - 500000, 110*s + 500000}},
		{"just time for the first burst", 105*s - 500000 - 50000, 5000, boundaryPlan{105 * s, 105*s - 500000, 105*s + 500000}},
		{"margin capped at 0.5s", 0, 60000, boundaryPlan{60 * s, 60*s - 500000, 60*s + 500000}},
		{"the shortest window", 1, 100, boundaryPlan{100000, 90000, 110000}},
		{"the shortest window, too late for its edge", 40001, 100, boundaryPlan{200000, 190000, 210000}},
	} {
		if got := planBoundary(c.nowUs, c.windowMs); got != c.want {
			t.Errorf("%s: planBoundary(%d, %d) = %+v, want %+v", c.name, c.nowUs, c.windowMs, got, c.want)
		}
	}
}

func TestCheckBoundaryWindow(t *testing.T) {
	for _, c := range []struct {
		give int64
		ok   bool
	}{{0, false}, {99, false}, {100, true}, {60000, true}, {60001, false}} {
		if err := checkBoundaryWindow(c.give); (err == nil) != c.ok {
			t.Errorf("checkBoundaryWindow(%d) = %v", c.give, err)
		}
	}
}

func TestParseTime(t *testing.T) {
	for _, c := range []struct {
		give []string
		want int64
		ok   bool
	}{
		{[]string{"1700000000", "123456"}, 1700000000123456, true},
		{[]string{"0", "0"}, 0, true},
		{[]string{"1700000000"}, 0, false},
		{[]string{"1700000000", "1000000"}, 0, false},
		{[]string{"x", "1"}, 0, false},
		{[]string{"-1", "1"}, 0, false},
	} {
		got, err := parseTime(c.give)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("parseTime(%q) = %d, %v", c.give, got, err)
		}
	}
}

func TestBoundaryLate(t *testing.T) {
	// A 1s window: the bursts at 0.9s and 1.1s, the edge at 1s, the next at 2s.
	plan := boundaryPlan{edgeUs: 1_000_000, firstUs: 900_000, secondUs: 1_100_000}
	for _, c := range []struct {
		name          string
		first, second int64
		want          string
	}{
		{"both on their side", 910_000, 1_120_000, ""},
		{"the first ends just before the edge", 999_999, 1_120_000, ""},
		{"the first ends on the edge", 1_000_000, 1_120_000, "the first burst took 100ms, past the edge by 0ms"},
		{"the first ends after it", 1_250_400, 1_300_000, "the first burst took 351ms, past the edge by 251ms: the calls are too slow for a window of 1000ms"},
		{"the second ends just before the next edge", 910_000, 1_999_999, ""},
		{"the second ends in the next window", 910_000, 2_000_000, "the second burst ended 1000ms after the edge, past the fixed window's next one"},
	} {
		got := boundaryLate(plan, 1000, c.first, c.second)
		if (c.want == "") != (got == "") || !strings.HasPrefix(got, c.want) {
			t.Errorf("%s: boundaryLate = %q, want %q", c.name, got, c.want)
		}
	}
}
