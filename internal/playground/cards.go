package playground

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/calendar"
	"github.com/rlfn/rlfn/internal/limitspec"
)

// Prefix starts every key the playground writes: its Limiter's Key(card, limit), nothing
// else. Reset deletes exactly those keys, so a service's keys (under the client's default
// "rl:") are never touched.
const Prefix = "rlfn:playground:"

// Card is one of the page's seven limiters. It is also the principal of the card's key, so each
// card has a state of its own, the two leaky bucket cards included (both modes of a leaky
// bucket share a key per principal).
type Card string

// The cards, in the page's order.
const (
	FixedWindow   Card = "fixed_window"
	SlidingLog    Card = "sliding_log"
	SlidingWindow Card = "sliding_window"
	TokenBucket   Card = "token_bucket"
	LeakyPolice   Card = "leaky_police"
	LeakyShape    Card = "leaky_shape"
	Calendar      Card = "calendar"
)

// Cards lists every card, in the page's order.
var Cards = []Card{FixedWindow, SlidingLog, SlidingWindow, TokenBucket, LeakyPolice, LeakyShape, Calendar}

func (c Card) valid() bool {
	_, ok := cardLimits[c]
	return ok
}

// cardLimit is the algorithm of a card in the tools' table, what the card fixes (its form has
// no field for it): a leaky bucket's mode, a calendar's period (its zone is UTC, its anchor
// the page's), and whether its form offers the penalty switch.
type cardLimit struct {
	alg     limitspec.Algorithm
	mode    client.Mode
	period  client.Period
	penalty bool
}

var cardLimits = func() map[Card]cardLimit {
	alg := func(name string) limitspec.Algorithm {
		a, ok := limitspec.Lookup(name)
		if !ok {
			panic("playground: no algorithm " + name)
		}
		return a
	}
	return map[Card]cardLimit{
		// One card has the penalty switch: the fixed window, whose denials are the easiest to
		// cause and whose window is shorter than a penalty worth watching.
		FixedWindow:   {alg: alg("fixed_window"), penalty: true},
		SlidingLog:    {alg: alg("sliding_log")},
		SlidingWindow: {alg: alg("sliding_window")},
		TokenBucket:   {alg: alg("token_bucket")},
		LeakyPolice:   {alg: alg("leaky_bucket"), mode: client.Police},
		LeakyShape:    {alg: alg("leaky_bucket"), mode: client.Shape},
		// A day, so that a window that ends while the page is watched (its anchor a minute
		// or two ahead) is followed by one a day long, as a daily quota's is.
		Calendar: {alg: alg("calendar"), period: client.Day},
	}
}()

// Key is the server key of the card's limiter, the playground Limiter's Key(card, limit). The numbers
// of a limit are not part of a key, so it depends on the card alone.
func (c Card) Key() string {
	cl := cardLimits[c]
	return cl.alg.Key(Prefix, string(c), limitspec.Values{})
}

// BlockKey is the server key of the card's block, which a penalty sets: the card is the
// principal, so each card has a block of its own.
func (c Card) BlockKey() string { return limitspec.BlockKey(Prefix, string(c)) }

// Params are the numbers a card's form edits: Limit and WindowMs for the window cards,
// Capacity, Rate and PeriodMs for the buckets, Limit and AnchorMs for the calendar; PenaltyMs
// when a card's penalty switch is on. Durations are whole milliseconds, as the library counts
// them.
type Params struct {
	Limit    int64 `json:"limit,omitempty"`
	WindowMs int64 `json:"windowMs,omitempty"`
	Capacity int64 `json:"capacity,omitempty"`
	Rate     int64 `json:"rate,omitempty"`
	PeriodMs int64 `json:"periodMs,omitempty"`
	// AnchorMs is the calendar's anchor, Unix milliseconds in UTC: its clock time starts
	// each day's window. 0 is the client's zero anchor, midnight UTC.
	AnchorMs int64 `json:"anchorMs,omitempty"`
	// PenaltyMs, when not 0, blocks the card's key that long after a denial.
	PenaltyMs int64 `json:"penaltyMs,omitempty"`
}

// param is one number of Params: its field in the tools' table, and its name in the API (a
// duration's in milliseconds, windowMs).
type param struct {
	field string
	json  string
	v     *int64
}

// params are p's numbers, in the order the API checks them; their json names are Params'
// tags (TestParamNames).
func (p *Params) params() []param {
	return []param{
		{"limit", "limit", &p.Limit},
		{"window", "windowMs", &p.WindowMs},
		{"capacity", "capacity", &p.Capacity},
		{"rate", "rate", &p.Rate},
		{"period", "periodMs", &p.PeriodMs},
		{"anchor", "anchorMs", &p.AnchorMs},
		{"penalty", "penaltyMs", &p.PenaltyMs},
	}
}

// Defaults are the numbers the page starts with: small enough that a burst of 10 shows
// admissions and denials, slow enough to watch a window end or a bucket refill.
var Defaults = map[Card]Params{
	FixedWindow:   {Limit: 5, WindowMs: 5000},
	SlidingLog:    {Limit: 5, WindowMs: 5000},
	SlidingWindow: {Limit: 5, WindowMs: 5000},
	TokenBucket:   {Capacity: 5, Rate: 1, PeriodMs: 1000},
	LeakyPolice:   {Capacity: 5, Rate: 1, PeriodMs: 1000},
	LeakyShape:    {Capacity: 5, Rate: 1, PeriodMs: 1000},
	// the anchor is the status's: a minute or two ahead of the server's clock (see anchorFor)
	Calendar: {Limit: 5},
}

// DefaultPenaltyMs is the penalty the switch starts with: longer than the fixed window's
// default 5s window, so that the block, not the window, is what a denial waits for.
const DefaultPenaltyMs = 8000

// maxAnchorMs is the latest anchor the API takes: the library's latest boundary. Only the
// anchor's clock time counts for a day, so no later one is needed.
const maxAnchorMs = calendar.MaxMs

// RequestError is a request the API refuses before anything is sent to the server: the
// page answers it with 400 and its message.
type RequestError struct {
	Field  string // e.g. "card", "params.capacity", "n"
	Reason string // e.g. "must be from 1 to 100, got 0"
}

func (e *RequestError) Error() string { return e.Field + " " + e.Reason }

// parseCard reads a card's name.
func parseCard(s string) (Card, error) {
	c := Card(s)
	if !c.valid() {
		names := make([]string, len(Cards))
		for i, k := range Cards {
			names[i] = string(k)
		}
		return "", &RequestError{Field: "card", Reason: fmt.Sprintf("must be one of %s, got %q", strings.Join(names, ", "), clip(s))}
	}
	return c, nil
}

// limitOf is the client limit that card runs with p, checked as the library would check it.
// A number that belongs to the other kind of card is refused rather than ignored: the page
// never sends one, and a caller who does has a mistake to see.
func limitOf(c Card, p Params) (client.Limit, error) {
	cl := cardLimits[c]
	ps := p.params()
	for _, q := range ps {
		if !cl.alg.Takes(q.field) && *q.v != 0 {
			return nil, &RequestError{Field: "params." + q.json, Reason: "does not apply to " + string(c)}
		}
	}
	v := limitspec.Values{Mode: cl.mode, Calendar: cl.period}
	for _, q := range ps {
		f, ok := cl.alg.Field(q.field)
		switch {
		case !ok:
		case f.Kind == limitspec.Duration:
			// Checked before the milliseconds become a time.Duration, which a larger number
			// would overflow into a valid-looking one.
			if *q.v < f.Min || *q.v > f.Max {
				return nil, &RequestError{Field: "params." + q.json, Reason: fmt.Sprintf("must be from %d to %d, got %d", f.Min, f.Max, *q.v)}
			}
			*v.Duration(f.Name) = time.Duration(*q.v) * time.Millisecond
		case f.Kind == limitspec.Time:
			if *q.v < 0 || *q.v > maxAnchorMs {
				return nil, &RequestError{Field: "params." + q.json, Reason: fmt.Sprintf("must be from 0 to %d, got %d", int64(maxAnchorMs), *q.v)}
			}
			if *q.v > 0 {
				v.Anchor = time.UnixMilli(*q.v).UTC()
			}
		case f.Kind == limitspec.Calendar:
			// the card's period is fixed
			if *q.v != 0 {
				return nil, &RequestError{Field: "params." + q.json, Reason: fmt.Sprintf("does not apply to %s: its period is a %s", c, cl.period)}
			}
		case f.Kind == limitspec.Count:
			*v.Count(f.Name) = *q.v
		}
	}
	l := cl.alg.Limit(v)
	if err := l.Validate(); err != nil {
		if le := (*client.LimitError)(nil); errors.As(err, &le) {
			return nil, &RequestError{Field: "params", Reason: le.Field + " " + le.Reason}
		}
		return nil, &RequestError{Field: "params", Reason: err.Error()}
	}
	return l, nil
}

// formField is one number of a card's form, as the page draws it: its API name, its label,
// and the bounds of the tools' table (the client's), so that the page checks what the server
// will without a second copy of them.
type formField struct {
	Name  string `json:"name"`
	Label string `json:"label"`
	Min   int64  `json:"min"`
	Max   int64  `json:"max"`
}

// form is the numbers of c's form, in the form's order: its counts and durations, but the
// penalty, which has a switch of its own (see penaltyField), and what the card fixes.
func (c Card) form() []formField {
	var fs []formField
	for _, q := range (&Params{}).params() {
		f, ok := cardLimits[c].alg.Field(q.field)
		if !ok || f.Kind != limitspec.Count && f.Kind != limitspec.Duration || f.Name == "penalty" {
			continue
		}
		label := strings.ToUpper(f.Name[:1]) + f.Name[1:]
		if f.Kind == limitspec.Duration {
			label += " (ms)"
		}
		fs = append(fs, formField{Name: q.json, Label: label, Min: f.Min, Max: f.Max})
	}
	return fs
}

// penaltyField is the number of c's penalty switch, with the table's bounds (from 1: off is
// the switch's), or nil for a card without one.
func (c Card) penaltyField() *formField {
	cl := cardLimits[c]
	f, ok := cl.alg.Field("penalty")
	if !cl.penalty || !ok {
		return nil
	}
	return &formField{Name: "penaltyMs", Label: "Penalty (ms)", Min: max(1, f.Min), Max: f.Max}
}

// MaxBurst is the most requests one Burst sends: enough to empty any limit worth watching,
// few enough that a click cannot become a load test.
const MaxBurst = 100

func checkBurst(n int) error {
	if n < 1 || n > MaxBurst {
		return &RequestError{Field: "n", Reason: fmt.Sprintf("must be from 1 to %d, got %d", MaxBurst, n)}
	}
	return nil
}

// clip keeps a hostile value short in an error message.
func clip(s string) string { return clipN(s, 40) }

func clipN(s string, most int) string {
	if len(s) > most {
		return s[:most] + "..."
	}
	return s
}
