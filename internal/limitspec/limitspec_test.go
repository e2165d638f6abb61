package limitspec

import (
	"context"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go/mock"
	"go.uber.org/mock/gomock"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/functions"
)

// testLimiter is a Limiter that composes keys under prefix; it sends nothing.
func testLimiter(t *testing.T, prefix string) *client.Limiter {
	t.Helper()
	lim, err := client.New(mock.NewClient(nil), client.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// luaConst is a numeric constant the library declares: local NAME = 123.
func luaConst(t *testing.T, name string) int64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^local ` + name + ` = (\d+)`).FindStringSubmatch(functions.Source)
	if m == nil {
		t.Fatalf("functions/ratelimit.lua declares no %s", name)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestBoundsAreTheLibrarys: the bounds read off the client's Validate are the ones the library
// declares, so that a tool refuses what the server would, and nothing else.
func TestBoundsAreTheLibrarys(t *testing.T) {
	for _, c := range []struct {
		lua  string
		got  int64
		what string
	}{
		{"MAX_INT", MaxUnits, "MaxUnits"},
		{"MAX_LOG", maxLog, "a sliding log's limit"},
		{"MAX_DURATION_MS", maxMs, "a duration in ms"},
		{"MAX_DURATION_MS", maxPenaltyMs, "a penalty in ms"},
		{"MAX_INT", maxCalendarLimit, "a calendar's limit"},
		{"MAX_ID", MaxLeaseID, "MaxLeaseID"},
		{"MAX_ID", largest(func(n int64) bool {
			_, err := testLimiter(t, "rl:").Lease("k", client.Concurrency{Limit: 1, Lease: time.Second}, strings.Repeat("i", int(n)))
			return err == nil
		}, 1<<20), "the client's longest lease id"},
	} {
		if want := luaConst(t, c.lua); c.got != want {
			t.Errorf("%s = %d, want the library's %s = %d", c.what, c.got, c.lua, want)
		}
	}
}

func TestLargest(t *testing.T) {
	for _, c := range []struct{ max, hi int64 }{{1, 1}, {1, 100}, {7, 100}, {99, 100}, {100, 100}, {1 << 40, 1 << 62}} {
		if got := largest(func(n int64) bool { return n <= c.max }, c.hi); got != c.max {
			t.Errorf("largest(n <= %d, %d) = %d", c.max, c.hi, got)
		}
	}
}

// TestTable: every algorithm builds the client limit of its name, every field has a place in
// Values, and each field's bounds are what Validate accepts (and refuses) around them.
func TestTable(t *testing.T) {
	berlin, err := LoadZone("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 31, 0, 0, 0, 0, berlin)
	p := 7 * time.Second
	v := Values{Limit: 3, Capacity: 4, Rate: 5, Reserve: 1, Window: time.Second, Period: 2 * time.Second,
		Lease: 3 * time.Second, Mode: client.Shape, Name: "n", Penalty: p, Calendar: client.Month, Anchor: at}
	want := map[string]any{
		"fixed_window":   client.FixedWindow{Limit: 3, Window: time.Second, Reserve: 1, Name: "n", Penalty: p},
		"sliding_log":    client.SlidingLog{Limit: 3, Window: time.Second, Reserve: 1, Name: "n", Penalty: p},
		"sliding_window": client.SlidingWindow{Limit: 3, Window: time.Second, Reserve: 1, Name: "n", Penalty: p},
		"token_bucket":   client.TokenBucket{Capacity: 4, Rate: 5, Period: 2 * time.Second, Reserve: 1, Name: "n", Penalty: p},
		"leaky_bucket":   client.LeakyBucket{Capacity: 4, Rate: 5, Period: 2 * time.Second, Mode: client.Shape, Reserve: 1, Name: "n", Penalty: p},
		"calendar":       client.Calendar{Limit: 3, Period: client.Month, Anchor: at, Reserve: 1, Name: "n", Penalty: p},
		"concurrency":    client.Concurrency{Limit: 3, Lease: 3 * time.Second, Reserve: 1, Name: "n"},
	}
	if len(Algorithms) != len(want) {
		t.Errorf("%d algorithms, want %d", len(Algorithms), len(want))
	}
	for _, a := range Algorithms {
		var got any = a.Limit(v)
		if a.Leases() {
			got = Concurrency(v)
		}
		if !reflect.DeepEqual(got, want[a.Name]) {
			t.Errorf("%s: %#v, want %#v", a.Name, got, want[a.Name])
		}
		for _, prefix := range []string{"rl:", "p{}%:"} {
			lim := testLimiter(t, prefix)
			var clients string
			switch l := got.(type) {
			case client.Limit:
				clients = lim.Key("a}b", l)
			case client.Concurrency:
				clients = lim.ConcurrencyKey("a}b", l)
			}
			if k := a.Key(prefix, "a}b", v); k != clients || !strings.HasSuffix(k, ":"+a.Name+":n") {
				t.Errorf("%s: Key is %q, the client's %q", a.Name, k, clients)
			}
		}
		if b, ok := Lookup(a.Name); !ok || b.Name != a.Name {
			t.Errorf("Lookup(%q) = %v, %v", a.Name, b.Name, ok)
		}
		for _, f := range append(a.Fields, Shared...) {
			if g, ok := a.Field(f.Name); !ok || g != f {
				t.Errorf("%s: Field(%s) = %+v, %v; want its own %+v", a.Name, f.Name, g, ok, f)
			}
			checkBounds(t, a, v, f)
		}
		if a.Takes("penalty") == a.Leases() {
			t.Errorf("%s: takes a penalty %v, leases %v: every limit takes one, concurrency none", a.Name, a.Takes("penalty"), a.Leases())
		}
	}
	if _, ok := Lookup("leaky-bucket"); ok {
		t.Error(`Lookup("leaky-bucket") found one`)
	}
}

// checkBounds: Validate accepts f at Min and at Max, with the other fields at values that let
// it, and refuses it just outside them.
func checkBounds(t *testing.T, a Algorithm, base Values, f Field) {
	t.Helper()
	var set func(v *Values, n int64)
	switch f.Kind {
	case Count:
		if base.Count(f.Name) == nil {
			t.Fatalf("%s: Values has no count %s", a.Name, f.Name)
		}
		set = func(v *Values, n int64) { *v.Count(f.Name) = n }
	case Duration:
		if base.Duration(f.Name) == nil {
			t.Fatalf("%s: Values has no duration %s", a.Name, f.Name)
		}
		set = func(v *Values, n int64) { *v.Duration(f.Name) = time.Duration(n) * time.Millisecond }
	default:
		if f.Min != 0 || f.Max != 0 {
			t.Errorf("%s: %s has bounds", a.Name, f.Name)
		}
		return
	}
	validate := func(n int64) error {
		// the widest other fields: a bucket of rate 1000 per ms is one tick per unit
		v := Values{Limit: 1, Capacity: 1, Rate: 1000, Window: time.Millisecond, Period: time.Millisecond, Lease: time.Millisecond, Calendar: client.Day}
		if f.Name == "reserve" {
			v.Limit, v.Capacity = f.Max, f.Max
			if a.Name == "sliding_log" {
				v.Limit = maxLog
			}
		}
		set(&v, n)
		if a.Leases() {
			return Concurrency(v).Validate()
		}
		return a.Limit(v).Validate()
	}
	if f.Name == "reserve" && a.Name == "sliding_log" {
		f.Max = maxLog // the reserve is at most the limit
	}
	for _, c := range []struct {
		n  int64
		ok bool
	}{{f.Min, true}, {f.Max, true}, {f.Min - 1, false}, {f.Max + 1, false}} {
		if err := validate(c.n); (err == nil) != c.ok {
			t.Errorf("%s: %s = %d: Validate says %v", a.Name, f.Name, c.n, err)
		}
	}
}

// TestFields: every field once, in the order the tools check them.
func TestFields(t *testing.T) {
	var names []string
	for _, f := range Fields() {
		names = append(names, f.Name)
	}
	if got, want := strings.Join(names, " "), "limit window penalty capacity rate period mode anchor zone lease reserve name"; got != want {
		t.Errorf("Fields() = %s, want %s", got, want)
	}
	if got := strings.Join(Names(), " "); got != "fixed_window sliding_log sliding_window token_bucket leaky_bucket calendar concurrency" {
		t.Errorf("Names() = %s", got)
	}
}

func TestParseMode(t *testing.T) {
	for _, c := range []struct {
		give string
		want client.Mode
		ok   bool
	}{{"police", client.Police, true}, {"shape", client.Shape, true}, {"Shape", 0, false}, {"", 0, false}, {"drip", 0, false}} {
		if got, ok := ParseMode(c.give); got != c.want || ok != c.ok {
			t.Errorf("ParseMode(%q) = %v, %v", c.give, got, ok)
		}
	}
}

// Reserve reads every algorithm's Reserve, from a value, a pointer or a type embedding it.
func TestReserve(t *testing.T) {
	type embedded struct{ client.TokenBucket }
	type embeddedPointer struct{ *client.FixedWindow }
	for _, name := range Names() {
		a, _ := Lookup(name)
		if a.Leases() {
			continue
		}
		l := a.Limit(Values{Limit: 10, Capacity: 10, Rate: 1, Reserve: 3, Window: time.Second, Period: time.Second})
		if got := Reserve(l); got != 3 {
			t.Errorf("%s: Reserve = %d, want 3", name, got)
		}
		if got := Reserve(a.Limit(Values{Limit: 10, Capacity: 10, Rate: 1})); got != 0 {
			t.Errorf("%s without a reserve: Reserve = %d, want 0", name, got)
		}
	}
	tb := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second, Reserve: 2}
	for _, tt := range []struct {
		give client.Limit
		want int64
	}{
		{&tb, 2},
		{embedded{tb}, 2},
		{(*client.TokenBucket)(nil), 0},
		{embeddedPointer{&client.FixedWindow{Limit: 5, Window: time.Second, Reserve: 1}}, 1},
		{embeddedPointer{}, 0}, // through a nil embedded pointer: no reserve, no panic
		{nil, 0},
	} {
		if got := Reserve(tt.give); got != tt.want {
			t.Errorf("Reserve(%#v) = %d, want %d", tt.give, got, tt.want)
		}
	}
}

func TestRetryAfterMs(t *testing.T) {
	for _, tt := range []struct {
		give time.Duration
		want int64
	}{{0, 0}, {1500 * time.Microsecond, 1}, {time.Hour, 3_600_000}, {client.Never, -1}} {
		if got := RetryAfterMs(tt.give); got != tt.want {
			t.Errorf("RetryAfterMs(%s) = %d, want %d", tt.give, got, tt.want)
		}
	}
}

func TestParsePeriod(t *testing.T) {
	for _, c := range []struct {
		give string
		want client.Period
		ok   bool
	}{{"day", client.Day, true}, {"week", client.Week, true}, {"month", client.Month, true}, {"year", client.Year, true},
		{"Month", 0, false}, {"", 0, false}, {"1h", 0, false}, {"fortnight", 0, false}} {
		if got, ok := ParsePeriod(c.give); got != c.want || ok != c.ok {
			t.Errorf("ParsePeriod(%q) = %v, %v", c.give, got, ok)
		}
	}
}

// Anchor reads a local date and clock time in the zone named, refuses a zone that does not
// load (time.Local above all) and an offset, and gives a zone alone the zero anchor's
// meaning in that zone.
func TestAnchor(t *testing.T) {
	berlin, err := LoadZone("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		text, zone string
		want       time.Time
		err        string
		period     client.Period // default Day
	}{
		{"", "", time.Time{}, "", 0},
		{"2026-01-31T00:00", "Europe/Berlin", time.Date(2026, 1, 31, 0, 0, 0, 0, berlin), "", 0},
		{"2026-01-31T09:30:15", "", time.Date(2026, 1, 31, 9, 30, 15, 0, time.UTC), "", 0},
		{"2026-01-31T09:30:15.250", "UTC", time.Date(2026, 1, 31, 9, 30, 15, 250e6, time.UTC), "", 0},
		{"2026-01-31", "Europe/Berlin", time.Date(2026, 1, 31, 0, 0, 0, 0, berlin), "", 0},
		{"", "Europe/Berlin", time.Date(2001, 1, 1, 0, 0, 0, 0, berlin), "", 0},
		{"2026-01-31T00:00+01:00", "", time.Time{}, "no offset", 0},
		{"31/01/2026", "", time.Time{}, "not a date and clock time", 0},
		{"2026-02-30T00:00", "", time.Time{}, "not a date and clock time", 0},
		{"2026-01-31T00:00", "Mars/Olympus", time.Time{}, `"Mars/Olympus" does not load`, 0},
		{"2026-01-31T00:00", "../../etc/passwd", time.Time{}, "does not load", 0},
		{"", "Local", time.Time{}, `"Local" is not a time zone`, 0},
		// 02:30 is skipped in Berlin on 29 March 2026: the same clock time on the date of the
		// same phase before it, so that windows start at 02:30 wherever the day has it
		{"2026-03-29T02:30", "Europe/Berlin", time.Date(2026, 3, 28, 2, 30, 0, 0, berlin), "", client.Day},
		{"2026-03-29T02:30", "Europe/Berlin", time.Date(2026, 3, 22, 2, 30, 0, 0, berlin), "", client.Week},
		{"2026-03-29T02:30", "Europe/Berlin", time.Date(2026, 1, 29, 2, 30, 0, 0, berlin), "", client.Month},
		{"2026-03-29T02:30", "Europe/Berlin", time.Date(2025, 3, 29, 2, 30, 0, 0, berlin), "", client.Year},
		// a date in the future is taken as it is: it sets the phase only
		{"2099-01-15", "", time.Date(2099, 1, 15, 0, 0, 0, 0, time.UTC), "", client.Month},
	} {
		if c.period == 0 {
			c.period = client.Day
		}
		got, err := Anchor(c.period, c.text, c.zone)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("Anchor(%q, %q): %v", c.text, c.zone, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("Anchor(%q, %q) = %v, %v; want an error saying %q", c.text, c.zone, got, err, c.err)
		case c.err == "" && (!got.Equal(c.want) || got.Location().String() != c.want.Location().String()):
			t.Errorf("Anchor(%q, %q) = %v, want %v", c.text, c.zone, got, c.want)
		}
	}
	if wd := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC).Weekday(); wd != time.Monday {
		t.Errorf("a zone's default anchor is a %s, want a Monday", wd)
	}
}

// BlockKey is the key the client's Block sends: checked on the command itself.
func TestBlockKey(t *testing.T) {
	for _, prefix := range []string{"rl:", "p{}%:"} {
		vk := mock.NewClient(gomock.NewController(t))
		want := BlockKey(prefix, "a}b")
		vk.EXPECT().Do(gomock.Any(), mock.Match("FCALL", "rl_block", "1", want, "1000")).Return(mock.Result(mock.ValkeyArray(
			mock.ValkeyInt64(0), mock.ValkeyInt64(0), mock.ValkeyInt64(0), mock.ValkeyInt64(1000), mock.ValkeyInt64(1000), mock.ValkeyInt64(0))))
		lim, err := client.New(vk, client.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lim.Block(context.Background(), "a}b", time.Second); err != nil {
			t.Errorf("prefix %q: Block did not send rl_block on %s: %v", prefix, want, err)
		}
	}
}

// BlockFor's bounds are what Block takes: the mock expects no call, so a duration Block sends
// fails the test, and one it refuses must be refused before sending.
func TestBlockForBounds(t *testing.T) {
	lim, err := client.New(mock.NewClient(gomock.NewController(t)), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ms := range []int64{BlockFor.Min - 1, BlockFor.Max + 1} {
		if _, err := lim.Block(context.Background(), "k", time.Duration(ms)*time.Millisecond); err == nil {
			t.Errorf("Block for %dms: no error", ms)
		}
	}
	if _, err := lim.Block(context.Background(), "k", 1500*time.Microsecond); err == nil {
		t.Error("Block for 1.5ms: no error")
	}
	if BlockFor.Min != 1 || BlockFor.Max != luaConst(t, "MAX_DURATION_MS") {
		t.Errorf("BlockFor is %d to %d, want 1 to the library's MAX_DURATION_MS", BlockFor.Min, BlockFor.Max)
	}
}

// TestAlgorithmsAreTheLibrarys: the table's algorithms are the library's, in its order: each
// limit one of its ALGORITHMS (rl_<name>, and a group of rl_multi), concurrency its own
// functions. (The block key is the client's, see TestBlockKey.)
func TestAlgorithmsAreTheLibrarys(t *testing.T) {
	m := regexp.MustCompile(`(?m)^local ALGORITHMS = \{([^}]*)\}`).FindStringSubmatch(functions.Source)
	if m == nil {
		t.Fatal("functions/ratelimit.lua declares no ALGORITHMS")
	}
	var lua []string
	for _, v := range strings.Split(m[1], ",") {
		lua = append(lua, strings.TrimSpace(v))
	}
	var limits []string
	for _, a := range Algorithms {
		if a.Leases() {
			if !strings.Contains(functions.Source, "function_name = 'rl_"+a.Name+"'") {
				t.Errorf("the library registers no rl_%s", a.Name)
			}
			continue
		}
		limits = append(limits, a.Name)
		if !regexp.MustCompile(`(?m)^  name = '` + a.Name + `',`).MatchString(functions.Source) {
			t.Errorf("the library has no algorithm named %s", a.Name)
		}
	}
	if strings.Join(limits, " ") != strings.Join(lua, " ") {
		t.Errorf("the table's limits are %v, the library's ALGORITHMS %v", limits, lua)
	}
}
