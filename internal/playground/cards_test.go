package playground

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go/mock"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/limitspec"
)

// maxDurationMs is the library's longest window or period (MAX_DURATION_MS), as the API's
// messages say it.
const maxDurationMs = 100000000000

func TestLimitOf(t *testing.T) {
	for _, c := range []struct {
		card Card
		give Params
		want client.Limit
	}{
		{FixedWindow, Params{Limit: 5, WindowMs: 5000}, client.FixedWindow{Limit: 5, Window: 5 * time.Second}},
		{SlidingLog, Params{Limit: 100000, WindowMs: 1}, client.SlidingLog{Limit: 100000, Window: time.Millisecond}},
		{SlidingWindow, Params{Limit: 1, WindowMs: maxDurationMs}, client.SlidingWindow{Limit: 1, Window: maxDurationMs * time.Millisecond}},
		{TokenBucket, Params{Capacity: 5, Rate: 1, PeriodMs: 1000}, client.TokenBucket{Capacity: 5, Rate: 1, Period: time.Second}},
		{LeakyPolice, Params{Capacity: 5, Rate: 2, PeriodMs: 1000}, client.LeakyBucket{Capacity: 5, Rate: 2, Period: time.Second, Mode: client.Police}},
		{LeakyShape, Params{Capacity: 5, Rate: 2, PeriodMs: 1000}, client.LeakyBucket{Capacity: 5, Rate: 2, Period: time.Second, Mode: client.Shape}},
		{FixedWindow, Params{Limit: 5, WindowMs: 5000, PenaltyMs: 8000}, client.FixedWindow{Limit: 5, Window: 5 * time.Second, Penalty: 8 * time.Second}},
		{TokenBucket, Params{Capacity: 5, Rate: 1, PeriodMs: 1000, PenaltyMs: 1}, client.TokenBucket{Capacity: 5, Rate: 1, Period: time.Second, Penalty: time.Millisecond}},
		// a day in UTC from the anchor's clock time; 0 is the client's zero anchor
		{Calendar, Params{Limit: 5, AnchorMs: 1795000000000}, client.Calendar{Limit: 5, Period: client.Day, Anchor: time.UnixMilli(1795000000000).UTC()}},
		{Calendar, Params{Limit: 5}, client.Calendar{Limit: 5, Period: client.Day}},
	} {
		got, err := limitOf(c.card, c.give)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("limitOf(%s, %+v) = %#v, %v; want %#v", c.card, c.give, got, err, c.want)
		}
	}
}

func TestLimitOfRefuses(t *testing.T) {
	for _, c := range []struct {
		card Card
		give Params
		want string
	}{
		{FixedWindow, Params{Limit: 5}, "params.windowMs must be from 1 to 100000000000, got 0"},
		{FixedWindow, Params{Limit: 5, WindowMs: -1}, "params.windowMs must be from 1"},
		{FixedWindow, Params{Limit: 5, WindowMs: maxDurationMs + 1}, "params.windowMs must be from 1"},
		// 2^63 ns is about 9223372036854 ms: a larger number must not wrap into a valid Duration.
		{SlidingLog, Params{Limit: 5, WindowMs: 9223372036855 * 1000}, "params.windowMs must be from 1"},
		{FixedWindow, Params{Limit: 0, WindowMs: 1000}, "FixedWindow.Limit must be from 1"},
		{FixedWindow, Params{Limit: 5, WindowMs: 1000, Capacity: 5}, "params.capacity does not apply to fixed_window"},
		{SlidingWindow, Params{Limit: 5, WindowMs: 1000, Rate: 1}, "params.rate does not apply to sliding_window"},
		{SlidingLog, Params{Limit: 5, WindowMs: 1000, PeriodMs: 1}, "params.periodMs does not apply to sliding_log"},
		{SlidingLog, Params{Limit: 100001, WindowMs: 1000}, "SlidingLog.Limit must be from 1 to 100000"},
		{SlidingWindow, Params{Limit: 999999999999999, WindowMs: 1000}, "below 2^53"},
		{TokenBucket, Params{Capacity: 5, Rate: 1}, "params.periodMs must be from 1"},
		{TokenBucket, Params{Capacity: -1, Rate: 1, PeriodMs: 1}, "TokenBucket.Capacity must be from 1"},
		{TokenBucket, Params{Capacity: 5, Rate: 1, PeriodMs: 1, Limit: 5}, "params.limit does not apply to token_bucket"},
		{LeakyShape, Params{Capacity: 5, Rate: 1, PeriodMs: 1, WindowMs: 5}, "params.windowMs does not apply to leaky_shape"},
		{LeakyPolice, Params{Capacity: 5, Rate: 0, PeriodMs: 1000}, "LeakyBucket.Rate must be from 1"},
		{FixedWindow, Params{Limit: 5, WindowMs: 1000, PenaltyMs: -1}, "params.penaltyMs must be from 0 to 100000000000, got -1"},
		{FixedWindow, Params{Limit: 5, WindowMs: 1000, PenaltyMs: maxDurationMs + 1}, "params.penaltyMs must be from 0"},
		{FixedWindow, Params{Limit: 5, WindowMs: 1000, AnchorMs: 1}, "params.anchorMs does not apply to fixed_window"},
		{Calendar, Params{Limit: 5, PeriodMs: 1000}, "params.periodMs does not apply to calendar: its period is a day"},
		{Calendar, Params{Limit: 5, WindowMs: 1000}, "params.windowMs does not apply to calendar"},
		{Calendar, Params{Limit: 5, AnchorMs: -1}, "params.anchorMs must be from 0 to 999999999999999, got -1"},
		{Calendar, Params{Limit: 5, AnchorMs: 1e15}, "params.anchorMs must be from 0"},
		{Calendar, Params{Limit: 0}, "Calendar.Limit must be from 1"},
	} {
		_, err := limitOf(c.card, c.give)
		var re *RequestError
		if !errors.As(err, &re) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("limitOf(%s, %+v) = %v, want a *RequestError containing %q", c.card, c.give, err, c.want)
		}
	}
}

func TestParseCard(t *testing.T) {
	for _, c := range Cards {
		if got, err := parseCard(string(c)); got != c || err != nil {
			t.Errorf("parseCard(%q) = %q, %v", c, got, err)
		}
	}
	for _, give := range []string{"", "Token_Bucket", "token_bucket ", "{token_bucket}", "leaky_bucket", "*", strings.Repeat("x", 1000)} {
		_, err := parseCard(give)
		if err == nil || len(err.Error()) > 200 {
			t.Errorf("parseCard(%.20q) = %v, want a short error", give, err)
		}
	}
}

// TestKeys: each card has a key of its own, under Prefix, as the client composes it.
func TestKeys(t *testing.T) {
	lim, err := client.New(mock.NewClient(nil), client.Options{Prefix: Prefix})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]Card{}
	for _, c := range Cards {
		k := c.Key()
		if !strings.HasPrefix(k, Prefix+"{"+string(c)+"}:") {
			t.Errorf("%s: key %q", c, k)
		}
		if other, ok := seen[k]; ok {
			t.Errorf("%s and %s share the key %q", c, other, k)
		}
		seen[k] = c
		d := Defaults[c]
		l, err := limitOf(c, d)
		if err != nil {
			t.Errorf("%s: defaults %+v: %v", c, d, err)
			continue
		}
		if want := lim.Key(string(c), l); k != want {
			t.Errorf("%s: key %q is not the client's %q", c, k, want)
		}
		if b := c.BlockKey(); b != Prefix+"{"+string(c)+"}:block" {
			t.Errorf("%s: block key %q", c, b)
		}
	}
}

// TestPenaltyField: the fixed window card has the switch, with the table's bounds from 1 (off
// is the switch's); its default is within them; no other card has one.
func TestPenaltyField(t *testing.T) {
	for _, c := range Cards {
		f := c.penaltyField()
		if (f != nil) != (c == FixedWindow) {
			t.Errorf("%s: penalty switch %+v", c, f)
		}
		if f != nil && (f.Name != "penaltyMs" || f.Min != 1 || f.Max != maxDurationMs || DefaultPenaltyMs < f.Min || DefaultPenaltyMs > f.Max) {
			t.Errorf("%s: penalty field %+v, default %d", c, f, DefaultPenaltyMs)
		}
	}
	// longer than the card's default window: the block is what a denial waits for
	if DefaultPenaltyMs <= Defaults[FixedWindow].WindowMs {
		t.Errorf("DefaultPenaltyMs %d is not longer than the fixed window's %dms", DefaultPenaltyMs, Defaults[FixedWindow].WindowMs)
	}
}

// TestAnchorFor: the calendar's first window ends a minute or two ahead by default, at a whole
// minute; or lead ahead, at a whole second.
func TestAnchorFor(t *testing.T) {
	for _, now := range []int64{1795000000000, 1795000000001, 1795000059999, 1795000060000} {
		a := anchorFor(now, 0)
		if a%60000 != 0 || a-now < 60000 || a-now > 120000 {
			t.Errorf("anchorFor(%d, 0) = %d: %dms ahead", now, a, a-now)
		}
		b := anchorFor(now, 3*time.Second)
		if b%1000 != 0 || b-now < 3000 || b-now >= 4000 {
			t.Errorf("anchorFor(%d, 3s) = %d: %dms ahead", now, b, b-now)
		}
	}
}

func TestCheckBurst(t *testing.T) {
	for _, c := range []struct {
		give int
		ok   bool
	}{{-1, false}, {0, false}, {1, true}, {MaxBurst, true}, {MaxBurst + 1, false}} {
		if err := checkBurst(c.give); (err == nil) != c.ok {
			t.Errorf("checkBurst(%d) = %v", c.give, err)
		}
	}
}

// TestParamNames: each of Params' numbers is named as its JSON tag says, and is a field of the
// tools' table.
func TestParamNames(t *testing.T) {
	var p Params
	raw, _ := json.Marshal(Params{Limit: 1, WindowMs: 1, Capacity: 1, Rate: 1, PeriodMs: 1, AnchorMs: 1, PenaltyMs: 1})
	var tags map[string]int64
	if err := json.Unmarshal(raw, &tags); err != nil {
		t.Fatal(err)
	}
	ps := p.params()
	if len(ps) != len(tags) {
		t.Errorf("params() has %d numbers, Params %d", len(ps), len(tags))
	}
	fields := map[string]bool{}
	for _, f := range limitspec.Fields() {
		fields[f.Name] = true
	}
	for _, q := range ps {
		if _, ok := tags[q.json]; !ok {
			t.Errorf("param %s: Params has no tag %q", q.field, q.json)
		}
		if !fields[q.field] {
			t.Errorf("param %s is no field of the table", q.field)
		}
	}
}

// TestForm: what the page is told to draw for each card, with the library's bounds; the
// defaults fill exactly the form.
func TestForm(t *testing.T) {
	const maxInt = 999999999999999
	window := []formField{{"limit", "Limit", 1, maxInt}, {"windowMs", "Window (ms)", 1, maxDurationMs}}
	bucket := []formField{{"capacity", "Capacity", 1, maxInt}, {"rate", "Rate", 1, maxInt}, {"periodMs", "Period (ms)", 1, maxDurationMs}}
	want := map[Card][]formField{
		FixedWindow:   window,
		SlidingLog:    {{"limit", "Limit", 1, 100000}, {"windowMs", "Window (ms)", 1, maxDurationMs}},
		SlidingWindow: window,
		TokenBucket:   bucket,
		LeakyPolice:   bucket,
		LeakyShape:    bucket,
		Calendar:      {{"limit", "Limit", 1, maxInt}},
	}
	for _, c := range Cards {
		got := c.form()
		if !slices.Equal(got, want[c]) {
			t.Errorf("%s: form %v, want %v", c, got, want[c])
		}
		raw, _ := json.Marshal(Defaults[c])
		var defaults map[string]int64
		_ = json.Unmarshal(raw, &defaults)
		for _, f := range got {
			if defaults[f.Name] == 0 {
				t.Errorf("%s: no default for %s", c, f.Name)
			}
			delete(defaults, f.Name)
		}
		if len(defaults) != 0 {
			t.Errorf("%s: defaults outside the form: %v", c, defaults)
		}
	}
}
