package override

import (
	"errors"
	"github.com/rlfn/rlfn/internal/keys"
	"strconv"
	"strings"
	"testing"
	"time"
)

// lookup is ix.Lookup's value, and whether there is one.
func lookup[T any](ix *Index[T], algorithm, name, key string, now func() int64) (v T, ok bool) {
	if p := ix.Lookup(algorithm, name, key, now); p != nil {
		return *p, true
	}
	return v, false
}

func TestLookupPrecedence(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	tb := Policy{Algorithm: "token_bucket"}
	named := Policy{Algorithm: "token_bucket", Name: "api"}
	ix := NewIndex([]Compiled[string]{
		{ID: ID{tb, "*"}, V: "every key"},
		{ID: ID{tb, "user:*"}, V: "user:*"},
		{ID: ID{tb, "user:4*"}, V: "user:4*"},
		{ID: ID{tb, "user:42"}, V: "user:42"},
		{ID: ID{tb, "user:42*"}, V: "user:42*"},
		{ID: ID{tb, "user:7"}, V: "user:7 expired", Until: now},
		{ID: ID{tb, "user:8"}, V: "user:8 live", Until: now.Add(time.Millisecond)},
		{ID: ID{tb, "user:9*"}, V: "user:9* expired", Until: now.Add(-time.Hour)},
		{ID: ID{named, "user:42"}, V: "named user:42"},
		{ID: ID{Policy{Algorithm: "fixed_window"}, "a*"}, V: "fw a*"},
	})
	clock := func() int64 { return now.UnixMilli() }
	for _, tt := range []struct {
		give      string
		algorithm string
		name      string
		want      string // "" for none
	}{
		{give: "user:42", algorithm: "token_bucket", want: "user:42"},                    // exact beats every pattern
		{give: "user:421", algorithm: "token_bucket", want: "user:42*"},                  // longest prefix
		{give: "user:43", algorithm: "token_bucket", want: "user:4*"},                    // shorter prefix
		{give: "user:5", algorithm: "token_bucket", want: "user:*"},                      // shorter still
		{give: "user:", algorithm: "token_bucket", want: "user:*"},                       // a prefix matches itself
		{give: "svc", algorithm: "token_bucket", want: "every key"},                      // "*"
		{give: "user:7", algorithm: "token_bucket", want: "user:*"},                      // expired exact: the next in precedence
		{give: "user:8", algorithm: "token_bucket", want: "user:8 live"},                 // ends in 1ms
		{give: "user:95", algorithm: "token_bucket", want: "user:*"},                     // expired pattern skipped
		{give: "user:42", algorithm: "token_bucket", name: "api", want: "named user:42"}, // another policy
		{give: "user:43", algorithm: "token_bucket", name: "api"},                        // no pattern in that policy
		{give: "a", algorithm: "fixed_window", want: "fw a*"},
		{give: "b", algorithm: "fixed_window"},
		{give: "user:42", algorithm: "sliding_log"},
	} {
		got, ok := lookup(ix, tt.algorithm, tt.name, tt.give, clock)
		if ok != (tt.want != "") || got != tt.want {
			t.Errorf("Lookup(%s, %q, %q) = %q, %v; want %q", tt.algorithm, tt.name, tt.give, got, ok, tt.want)
		}
	}
	if n := ix.Len(); n != 10 {
		t.Errorf("Len = %d, want 10", n)
	}
	var empty *Index[string]
	if _, ok := lookup(empty, "token_bucket", "", "x", clock); ok || !empty.Empty() {
		t.Error("a nil index matched")
	}
}

// TestLookupReadsNoClock: an override without an end never reads the clock.
func TestLookupReadsNoClock(t *testing.T) {
	ix := NewIndex([]Compiled[int]{{ID: ID{Policy{Algorithm: "fixed_window"}, "k"}, V: 1}})
	if v, ok := lookup(ix, "fixed_window", "", "k", func() int64 { panic("read the clock") }); !ok || v != 1 {
		t.Errorf("Lookup = %d, %v", v, ok)
	}
}

func TestLookupAllocates(t *testing.T) {
	ix := NewIndex([]Compiled[int]{
		{ID: ID{Policy{Algorithm: "fixed_window"}, "user:*"}, V: 1, Until: time.Now().Add(time.Hour)},
		{ID: ID{Policy{Algorithm: "fixed_window"}, "user:42"}, V: 2},
	})
	clock := func() int64 { return time.Now().UnixMilli() }
	if n := testing.AllocsPerRun(100, func() {
		ix.Lookup("fixed_window", "", "user:43", clock)
		ix.Lookup("fixed_window", "", "user:42", clock)
		ix.Lookup("token_bucket", "", "user:42", clock)
	}); n != 0 {
		t.Errorf("Lookup allocates %v times", n)
	}
}

func TestCheck(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	tb := Policy{Algorithm: "token_bucket"}
	refuse := func(Override) error { return errors.New("TokenBucket.Capacity must be from 1") }
	for _, tt := range []struct {
		give  Override
		limit func(Override) error
		want  string // "" when valid
	}{
		{give: Override{Policy: tb, Key: "user:42"}},
		{give: Override{Policy: tb, Key: "user:*"}},
		{give: Override{Policy: tb, Key: "*"}},
		{give: Override{Policy: tb, Key: "a*b"}, want: "a '*' elsewhere never matches"},
		{give: Override{Policy: tb, Key: "a**"}, want: "a '*' elsewhere never matches"},
		{give: Override{Policy: tb, Key: ""}, want: "the key is empty"},
		{give: Override{Policy: tb, Key: strings.Repeat("k", MaxKeyLen+1)}, want: "longer than any client takes"},
		{give: Override{Policy: tb, Key: strings.Repeat("k", MaxKeyLen) + "*"}},
		{give: Override{Key: "k"}, want: "no algorithm"},
		{give: Override{Policy: tb, Key: "k", Until: now}, want: "until 2026-11-26T12:00:00Z is in the past"},
		{give: Override{Policy: tb, Key: "k", Until: now.Add(time.Millisecond)}},
		{give: Override{Policy: tb, Key: "k"}, limit: refuse, want: "token_bucket k: TokenBucket.Capacity must be from 1"},
	} {
		err := Check(tt.give, now, tt.limit)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("Check(%s %.20q) = %v, want nil", tt.give.Policy, tt.give.Key, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrInvalid)):
			t.Errorf("Check(%s %.20q) = %v, want ErrInvalid saying %q", tt.give.Policy, tt.give.Key, err, tt.want)
		}
	}
}

func TestDiff(t *testing.T) {
	tb := Policy{Algorithm: "token_bucket"}
	a := Override{Policy: tb, Key: "a", Limit: Fields{Capacity: 10, Rate: 1, Period: "1s"}}
	a2 := a
	a2.Limit.Capacity = 20
	aNote := a
	aNote.Note = "ticket 7"
	b := Override{Policy: tb, Key: "b*", Limit: Fields{Capacity: 5, Rate: 1, Period: "1s"}}
	c := Override{Policy: Policy{Algorithm: "fixed_window", Name: "h"}, Key: "c", Limit: Fields{Limit: 1, Window: Duration(time.Hour)}}
	until := a
	until.Until = time.UnixMilli(5000).In(time.FixedZone("x", 3600))
	untilUTC := a
	untilUTC.Until = time.UnixMilli(5000).UTC()
	for _, tt := range []struct {
		name             string
		current, desired []Override
		want             []string
	}{
		{"nothing", nil, nil, nil},
		{"same", []Override{a, b}, []Override{b, a}, nil},
		{"add", []Override{a}, []Override{a, b, c}, []string{"add fixed_window:h c", "add token_bucket b*"}},
		{"remove what the file does not hold", []Override{a, b, c}, []Override{b}, []string{"remove fixed_window:h c", "remove token_bucket a"}},
		{"change a limit", []Override{a}, []Override{a2}, []string{"change token_bucket a"}},
		{"change a note", []Override{a}, []Override{aNote}, []string{"change token_bucket a"}},
		{"add an end", []Override{a}, []Override{until}, []string{"change token_bucket a"}},
		{"one instant in two zones", []Override{until}, []Override{untilUTC}, nil},
	} {
		var got []string
		for _, ch := range Diff(tt.current, tt.desired) {
			got = append(got, string(ch.Op)+" "+ch.ID().String())
		}
		if strings.Join(got, "|") != strings.Join(tt.want, "|") {
			t.Errorf("%s: Diff = %q, want %q", tt.name, got, tt.want)
		}
	}
	if ch := Set([]Override{a}, a2); ch.Op != Update || ch.Old.Limit.Capacity != 10 || ch.New.Limit.Capacity != 20 {
		t.Errorf("Set over an override: %+v", ch)
	}
	if ch := Set([]Override{a}, b); ch.Op != Add || ch.Old != nil {
		t.Errorf("Set of a new one: %+v", ch)
	}
}

func TestParse(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	good := `{"overrides": [
	  {"algorithm": "token_bucket", "key": "user:42", "limit": {"capacity": 500, "rate": 50, "period": "1s"}, "until": "2026-12-01T00:00:00Z", "note": "launch"},
	  {"algorithm": "fixed_window", "name": "hourly", "key": "api:*", "limit": {"limit": 100, "window": "1h"}}
	]}`
	got, err := Parse(strings.NewReader(good), now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Limit.Capacity != 500 || got[0].Limit.Period != "1s" || !got[0].Until.Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)) ||
		got[1].Name != "hourly" || time.Duration(got[1].Limit.Window) != time.Hour {
		t.Errorf("Parse = %+v", got)
	}
	if got, err := Parse(strings.NewReader(`{"overrides": []}`), now, nil); err != nil || len(got) != 0 {
		t.Errorf(`Parse({"overrides": []}) = %v, %v; want none, the file that removes every override`, got, err)
	}
	for _, tt := range []struct{ give, want string }{
		{`{"overrides": [{"algorithm": "token_bucket", "key": "k", "limit": {"capacity": 1}, "colour": "red"}]}`, `unknown field "colour"`},
		{`{"overrides": [{"algorithm": "fixed_window", "key": "k", "limit": {"window": "1 hour"}}]}`, `"1 hour" is not a duration`},
		{`{"overrides": [{"algorithm": "fixed_window", "key": "k"}, {"algorithm": "fixed_window", "key": "k"}]}`, "overrides 1 and 2 are both fixed_window k"},
		{`{"overrides": [{"algorithm": "fixed_window", "key": "k", "until": "2020-01-01T00:00:00Z"}, {"algorithm": "fixed_window", "key": "a*b"}]}`,
			"override 1: invalid override: fixed_window k: until 2020-01-01T00:00:00Z is in the past; override 2: invalid override: key \"a*b\""},
		{`{"overrides": []} {}`, "more than one JSON value"},
		{`[{"algorithm": "fixed_window", "key": "k"}]`, `a file of overrides is one JSON object, {"overrides": [...]}, not array`},
		{`{"overrides": "x"}`, "cannot unmarshal"},
		{``, "EOF"},
		{`{}`, `no "overrides" list`},
		{`null`, `no "overrides" list`},
		{`{"overrides": null}`, `no "overrides" list`},
		// every mistake of a file in one pass, JSON mistakes included
		{`{"overrides": [
		  {"algorithm": "token_bucket", "key": "a", "limit": {"capacity": 1, "rate": 1, "perod": "1s"}},
		  {"algorithm": "leaky", "key": "b", "limit": {"capacity": 1}},
		  {"algorithm": "token_bucket", "key": "c*d", "limit": {"capacity": 1}},
		  {"algorithm": "token_bucket", "key": "e", "limit": {"capacity": "ten"}}]}`,
			`override 1: invalid override: json: unknown field "perod"; override 3: invalid override: key "c*d": a pattern is a prefix and one trailing '*' (user:*), a '*' elsewhere never matches; override 4: invalid override: json: cannot unmarshal string`},
	} {
		_, err := Parse(strings.NewReader(tt.give), now, nil)
		if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%s) = %v, want ErrInvalid saying %q", tt.give, err, tt.want)
		}
	}
}

// TestLayers: a change is a layer over the base that replaces, adds and removes overrides of
// it, exact and patterns, with the base's precedence; Flatten folds it in to the same answers.
func TestLayers(t *testing.T) {
	tb := Policy{Algorithm: "token_bucket"}
	clock := func() int64 { return 1 }
	base := NewIndex([]Compiled[string]{
		{ID: ID{tb, "user:*"}, V: "user:*"},
		{ID: ID{tb, "user:4*"}, V: "user:4*"},
		{ID: ID{tb, "user:42"}, V: "user:42"},
		{ID: ID{tb, "user:7"}, V: "user:7"},
	})
	one := base.With(func(b *Builder[string]) {
		b.Set(ID{tb, "user:42"}, time.Time{}, "user:42 new") // replaced
		b.Remove(ID{tb, "user:4*"})                          // a pattern removed: the shorter applies
		b.Set(ID{tb, "user:43*"}, time.Time{}, "user:43*")   // a length the base lacks
		b.Remove(ID{tb, "user:7"})
	})
	two := one.With(func(b *Builder[string]) {
		b.Set(ID{Policy{Algorithm: "fixed_window"}, "f"}, time.Time{}, "fw f") // a policy the base lacks
		b.Remove(ID{tb, "user:43*"})
	})
	for _, ix := range []*Index[string]{two, two.Flatten()} {
		for _, tt := range []struct{ alg, key, want string }{
			{"token_bucket", "user:42", "user:42 new"},
			{"token_bucket", "user:45", "user:*"},
			{"token_bucket", "user:431", "user:*"},
			{"token_bucket", "user:7", "user:*"},
			{"fixed_window", "f", "fw f"},
			{"fixed_window", "g", ""},
		} {
			got, ok := lookup(ix, tt.alg, "", tt.key, clock)
			if ok != (tt.want != "") || got != tt.want {
				t.Errorf("layer %d: Lookup(%s, %s) = %q, %v; want %q", ix.Layer(), tt.alg, tt.key, got, ok, tt.want)
			}
		}
		if ix.Len() != 3 {
			t.Errorf("layer %d: Len = %d, want 3 (user:*, user:42, fw f)", ix.Layer(), ix.Len())
		}
	}
	if got, _ := lookup(one, "token_bucket", "", "user:431", clock); got != "user:43*" {
		t.Errorf("the first layer lost its pattern: %q", got)
	}
	if got, _ := lookup(base, "token_bucket", "", "user:42", clock); got != "user:42" {
		t.Errorf("a layer changed its base: %q", got)
	}
}

func TestCodec(t *testing.T) {
	o := Override{Policy: Policy{Algorithm: "leaky_bucket", Name: "n"}, Key: "k*", Note: "x",
		Limit: Fields{Capacity: 3, Rate: 1, Period: "1s", Mode: "shape", Penalty: Duration(time.Minute)},
		Until: time.UnixMilli(1_800_000_000_000).UTC()}
	got, err := Decode(Encode(o))
	if err != nil || !Same(got, o) {
		t.Errorf("Decode(Encode(o)) = %+v, %v; want %+v", got, err, o)
	}
	if s := Encode(o); !strings.Contains(s, `"penalty":"1m0s"`) || !strings.Contains(s, `"until":"2027-01-15T08:00:00Z"`) {
		t.Errorf("Encode = %s", s)
	}
	// FieldOf is injective where a separator would not be.
	a := FieldOf(ID{Policy{"fixed_window", "a b"}, "c"})
	b := FieldOf(ID{Policy{"fixed_window", "a"}, "b c"})
	if a == b {
		t.Errorf("FieldOf: %s twice", a)
	}
	if _, err := Decode(`{"key": "k"}`); err == nil {
		t.Error("Decode of an override without an algorithm")
	}
	if k := Key("rl:"); k != "rl:{%overrides}" {
		t.Errorf("Key(rl:) = %s", k)
	}
	if k := Key("a{b}"); k != "a%7Bb%7D{%overrides}" {
		t.Errorf("Key(a{b}) = %s", k)
	}
	if f := FieldOf(ID{Policy{"version", ""}, "version"}); f == VersionField {
		t.Errorf("FieldOf can be the version's field")
	}
}

// TestKeysMeetNoLimiter: no principal, algorithm or name composes the store's keys, whatever
// the prefix (keys.Compose is the client's Limiter.Key).
func TestKeysMeetNoLimiter(t *testing.T) {
	for _, prefix := range []string{"rl:", "", "a{", "x%"} {
		for _, key := range []string{Key(prefix), HeadKey(prefix), DeltaKey(prefix), LogKey(prefix), ShardKey(prefix, "0123abcd", 3)} {
			for _, k := range []string{"%overrides", "%", "", "%overrides}:version", "{%overrides}", "overrides", "%overrides:0123abcd:3", "%overrides}:head"} {
				for _, alg := range []string{"token_bucket", "version", ""} {
					for _, name := range []string{"", "version"} {
						if got := keys.Compose(prefix, k, alg, name); got == key {
							t.Errorf("Compose(%q, %q, %q, %q) = %q, the overrides' key", prefix, k, alg, name, got)
						}
					}
				}
			}
		}
	}
}

// A calendar override's anchor on a day its zone skips the clock time (02:30 on 29 March 2026
// in Berlin) keeps that clock time, as rlfn call's --anchor does: windows start at 02:30.
func TestAnchorInAGap(t *testing.T) {
	v, err := Fields{Limit: 5, Period: "day", Anchor: "2026-03-29T02:30", Zone: "Europe/Berlin"}.Values("calendar")
	if err != nil {
		t.Fatal(err)
	}
	if h, m, _ := v.Anchor.Clock(); h != 2 || m != 30 || v.Anchor.Location().String() != "Europe/Berlin" {
		t.Errorf("anchor %v, want 02:30 in Europe/Berlin", v.Anchor)
	}
}

// TestIndexAgainstMap: an index of many keys, set, replaced and removed in no order, with
// layers over it and folded, answers every key as a map of the same changes does; a value
// Lookup handed out stays as it was.
func TestIndexAgainstMap(t *testing.T) {
	tb := Policy{Algorithm: "token_bucket"}
	const n = 50_000
	want := map[string]int{}
	b := NewBuilder[int]()
	b.SizeHint(n / 2) // the table grows past its hint
	for i := 0; i < n; i++ {
		k := b.Key("cust:" + strconv.Itoa(i*7919%n))
		b.Set(ID{tb, k}, time.Time{}, i)
		want[k] = i
		if i%3 == 0 { // replaced
			b.Set(ID{tb, k}, time.Time{}, -i)
			want[k] = -i
		}
		if i%5 == 0 { // removed, then some set again
			b.Remove(ID{tb, k})
			delete(want, k)
		}
		if i%10 == 0 {
			b.Set(ID{tb, k}, time.Time{}, 2*i)
			want[k] = 2 * i
		}
	}
	ix := b.Index()
	held := ix.Lookup("token_bucket", "", "cust:1", nil)
	heldWant := *held
	check := func(ix *Index[int], what string) {
		t.Helper()
		if ix.Len() != len(want) {
			t.Errorf("%s: Len = %d, want %d", what, ix.Len(), len(want))
		}
		for i := 0; i < n+10; i++ {
			k := "cust:" + strconv.Itoa(i)
			got := ix.Lookup("token_bucket", "", k, nil)
			w, ok := want[k]
			if (got != nil) != ok || got != nil && *got != w {
				t.Fatalf("%s: Lookup(%s) = %v, want %d, %v", what, k, got, w, ok)
			}
		}
	}
	check(ix, "base")
	for round := 0; round < 3; round++ {
		ix = ix.With(func(b *Builder[int]) {
			for i := round; i < n; i += 97 {
				k := "cust:" + strconv.Itoa(i)
				if i%2 == 0 {
					b.Remove(ID{tb, k})
					delete(want, k)
				} else {
					b.Set(ID{tb, k}, time.Time{}, 1000*i+round)
					want[k] = 1000*i + round
				}
			}
		})
		check(ix, "layer")
	}
	check(ix.Flatten(), "flattened")
	if *held != heldWant {
		t.Errorf("a value Lookup handed out changed: %d, was %d", *held, heldWant)
	}
}
