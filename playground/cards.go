package playground

import (
	"fmt"
	"strings"
	"time"

	"github.com/rlfn/rlfn/client"
)

// Prefix starts every key the playground writes: client.Key(Prefix, card, limit), nothing
// else. Reset deletes exactly those keys, so a service's keys (under the client's default
// "rl:") are never touched.
const Prefix = "rlfn:playground:"

// Card is one of the page's six limiters. It is also the principal of the card's key, so each
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
)

// Cards lists every card, in the page's order.
var Cards = []Card{FixedWindow, SlidingLog, SlidingWindow, TokenBucket, LeakyPolice, LeakyShape}

// windowed reports whether the card is configured by a limit per window (else by a bucket).
func (c Card) windowed() bool {
	return c == FixedWindow || c == SlidingLog || c == SlidingWindow
}

func (c Card) valid() bool {
	for _, k := range Cards {
		if c == k {
			return true
		}
	}
	return false
}

// Key is the server key of the card's limiter: client.Key(Prefix, card, limit). The numbers
// of a limit are not part of a key, so it depends on the card alone.
func (c Card) Key() string { return client.Key(Prefix, string(c), c.zero()) }

// zero is a limit of the card's algorithm, whatever its numbers: enough to name its key.
func (c Card) zero() client.Limit {
	switch c {
	case FixedWindow:
		return client.FixedWindow{}
	case SlidingLog:
		return client.SlidingLog{}
	case SlidingWindow:
		return client.SlidingWindow{}
	case TokenBucket:
		return client.TokenBucket{}
	}
	return client.LeakyBucket{}
}

// Params are the numbers a card's form edits: Limit and WindowMs for the window cards,
// Capacity, Rate and PeriodMs for the buckets. Durations are whole milliseconds, as the
// library counts them.
type Params struct {
	Limit    int64 `json:"limit,omitempty"`
	WindowMs int64 `json:"windowMs,omitempty"`
	Capacity int64 `json:"capacity,omitempty"`
	Rate     int64 `json:"rate,omitempty"`
	PeriodMs int64 `json:"periodMs,omitempty"`
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
}

// RequestError is a request the API refuses before anything is sent to the server: the
// page answers it with 400 and its message.
type RequestError struct {
	Field  string // e.g. "card", "params.capacity", "n"
	Reason string // e.g. "must be from 1 to 100, got 0"
}

func (e *RequestError) Error() string { return e.Field + " " + e.Reason }

// maxDurationMs is the library's longest window or period; checked before the milliseconds
// become a time.Duration, which a larger number would overflow into a valid-looking one.
const maxDurationMs = 100000000000

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
	var l client.Limit
	if c.windowed() {
		if err := absent(p.Capacity, "params.capacity", c); err != nil {
			return nil, err
		}
		if err := absent(p.Rate, "params.rate", c); err != nil {
			return nil, err
		}
		if err := absent(p.PeriodMs, "params.periodMs", c); err != nil {
			return nil, err
		}
		w, err := duration("params.windowMs", p.WindowMs)
		if err != nil {
			return nil, err
		}
		switch c {
		case FixedWindow:
			l = client.FixedWindow{Limit: p.Limit, Window: w}
		case SlidingLog:
			l = client.SlidingLog{Limit: p.Limit, Window: w}
		default:
			l = client.SlidingWindow{Limit: p.Limit, Window: w}
		}
	} else {
		if err := absent(p.Limit, "params.limit", c); err != nil {
			return nil, err
		}
		if err := absent(p.WindowMs, "params.windowMs", c); err != nil {
			return nil, err
		}
		per, err := duration("params.periodMs", p.PeriodMs)
		if err != nil {
			return nil, err
		}
		switch c {
		case TokenBucket:
			l = client.TokenBucket{Capacity: p.Capacity, Rate: p.Rate, Period: per}
		case LeakyPolice:
			l = client.LeakyBucket{Capacity: p.Capacity, Rate: p.Rate, Period: per, Mode: client.Police}
		default:
			l = client.LeakyBucket{Capacity: p.Capacity, Rate: p.Rate, Period: per, Mode: client.Shape}
		}
	}
	if err := l.Validate(); err != nil {
		return nil, &RequestError{Field: "params", Reason: strings.TrimPrefix(err.Error(), "rlfn: ")}
	}
	return l, nil
}

func absent(v int64, field string, c Card) error {
	if v != 0 {
		return &RequestError{Field: field, Reason: "does not apply to " + string(c)}
	}
	return nil
}

func duration(field string, ms int64) (time.Duration, error) {
	if ms < 1 || ms > maxDurationMs {
		return 0, &RequestError{Field: field, Reason: fmt.Sprintf("must be from 1 to %d, got %d", maxDurationMs, ms)}
	}
	return time.Duration(ms) * time.Millisecond, nil
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
