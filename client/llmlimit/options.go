package llmlimit

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/decide"
)

// Budget is the limits of one principal (a user, an organisation): each that is set counts
// every request of the principal in its own unit. Requests of one Budget share one key of the
// Limiter, "<Name>:<principal>", so every limit of a Budget is decided by one atomic call in
// the principal's cluster slot.
type Budget struct {
	// Name scopes the state and names the limits in headers, bodies and metrics ("user",
	// "org"): letters, digits, '_', '.' and '-'. Two Budgets need two Names. Required.
	Name string
	// Key returns the principal a request is counted against: the user's ID, the organisation
	// of its API key. An error, or an empty principal, is answered 400. Required.
	Key func(r *http.Request) (string, error)
	// Requests counts one unit per request. Default (nil): none.
	Requests client.Limit
	// Tokens counts input and output tokens together, cache reads included unless
	// Options.CachedFree. Default (nil): none.
	Tokens client.Limit
	// InputTokens counts input tokens alone, cache reads included unless Options.CachedFree.
	// Default (nil): none.
	InputTokens client.Limit
	// OutputTokens counts output tokens alone (reasoning included). Default (nil): none.
	OutputTokens client.Limit
	// Spend counts money in the units of Options.Prices (nano-dollars, say): a request costs
	// its tokens at its model's prices. Default (nil): none.
	Spend client.Limit
}

// Price is what a model's tokens cost, in money units per token: whole numbers, so pick a unit
// small enough for the cheapest price. In nano-dollars (10^-9 USD) $3 per million input tokens
// is 3000, $0.075 per million 75; a Spend limit of $100 a month is then 100_000_000_000 (the
// library counts to 999999999999999, nearly a million dollars).
type Price struct {
	Input  int64 // an input token neither read from nor written to the cache
	Output int64 // an output token
	// CacheRead is a cache read's price. Default (zero): Input's; Options.CachedFree makes
	// cache reads cost nothing.
	CacheRead int64
	// CacheWrite is a cache write's price (Anthropic's cache_creation_input_tokens). Default
	// (zero): Input's.
	CacheWrite int64
}

// Options configures a Middleware.
type Options struct {
	// Budgets are the principals each request counts against, all at once (all or nothing):
	// a user's and its organisation's. At least one. Required.
	Budgets []Budget
	// Prices are the prices by model (the request's model, exactly as sent), for Spend limits.
	// A request for a model without a price is answered 400 when a Budget has a Spend limit.
	// Default (nil): none.
	Prices map[string]Price
	// AskUsage asks a chat completions stream for its usage when its request does not
	// (stream_options.include_usage is added to the body the upstream gets), so that the stream
	// is charged its usage rather than the middleware's count of its deltas; the usage chunk
	// the client did not ask for is not passed on. Use it with an upstream that takes
	// stream_options (OpenAI's, and most compatible servers). Default: false, the request as
	// the client sent it.
	AskUsage bool
	// CachedFree counts input tokens read from the prompt cache as nothing: in Tokens,
	// InputTokens and Spend. Default: false, a cached token counts as any input token (in
	// Spend, at Price.CacheRead).
	CachedFree bool
	// Tokens counts the tokens of a prompt's text (Request.Text) and of each streamed delta.
	// Default (nil): Bytes4, a token per 4 bytes, which is rough.
	Tokens Tokens
	// DefaultMaxTokens is a request's output estimate when it sets no maximum (chat
	// completions and responses may leave it out). Default (zero): 4096.
	DefaultMaxTokens int64
	// QuotaStatus answers a request refused by a quota (a client.Calendar limit: a month's
	// budget), 402 Payment Required or 403 Forbidden. A limit of any other kind refuses with
	// 429 and Retry-After. Default (zero): 402.
	QuotaStatus int
	// HoldTTL is how long a request's hold lives unless settled (client.HoldOptions.TTL):
	// longer than the longest response. A hold that expires unsettled (its process died)
	// stays charged at what it held. Default (zero): 15 minutes.
	HoldTTL time.Duration
	// MaxBody is the largest request body read, in bytes; a larger one is answered 413.
	// Default (zero): 32 MiB.
	MaxBody int64
	// API tells the wire format of a request. Default (nil): ByPath.
	API func(r *http.Request) API
	// OnError is called with each error that leaves a request without a decision (the
	// Limiter's), each settlement that failed, and each stream cut because the Limiter failed,
	// from the request's goroutine. Default (nil): a log line on Logger, at most one a second
	// per kind.
	OnError func(r *http.Request, err error)
	// Logger receives the default OnError's lines. Default (nil): slog.Default().
	Logger *slog.Logger
	// Now is the clock of Anthropic's reset headers (RFC 3339 times), for tests. Default
	// (nil): time.Now.
	Now func() time.Time
}

// Defaults of Options.
const (
	DefaultMaxTokens = 4096
	DefaultHoldTTL   = 15 * time.Minute
	DefaultMaxBody   = 32 << 20
)

// ConfigError reports Options that cannot work, found by New.
type ConfigError struct {
	Field  string // e.g. "Budgets[1].Name"
	Reason string // e.g. "is required"
	Err    error  // what refused it (a *client.LimitError); else nil
}

func (e *ConfigError) Error() string { return "llmlimit: Options." + e.Field + " " + e.Reason }

// Unwrap returns the cause, a *client.LimitError for a limit the client refuses.
func (e *ConfigError) Unwrap() error { return e.Err }

// dim is what a limit of a Budget counts.
type dim uint8

const (
	dimRequests dim = iota
	dimTokens
	dimInput
	dimOutput
	dimSpend
	dims
)

// names are the dimensions' names: the limits' default Names, and the second half of each
// rule's Name ("org.tokens").
var names = [dims]string{"requests", "tokens", "input_tokens", "output_tokens", "spend"}

func (b *Budget) limits() [dims]client.Limit {
	return [dims]client.Limit{b.Requests, b.Tokens, b.InputTokens, b.OutputTokens, b.Spend}
}

// check validates o and fills in its defaults, naming each limit by its dimension (see named).
func (o *Options) check() error {
	if len(o.Budgets) == 0 {
		return &ConfigError{Field: "Budgets", Reason: "must hold at least one Budget"}
	}
	seen := map[string]bool{}
	budgets := make([]Budget, len(o.Budgets))
	for i, b := range o.Budgets {
		field := fmt.Sprintf("Budgets[%d]", i)
		switch {
		case b.Name == "":
			return &ConfigError{Field: field + ".Name", Reason: "is required"}
		case !decide.ValidName(b.Name):
			return &ConfigError{Field: field + ".Name", Reason: fmt.Sprintf("%q: want letters, digits, '_', '.' or '-'", b.Name)}
		case seen[b.Name]:
			return &ConfigError{Field: field + ".Name", Reason: fmt.Sprintf("%q names two Budgets", b.Name)}
		case b.Key == nil:
			return &ConfigError{Field: field + ".Key", Reason: "is required"}
		}
		seen[b.Name] = true
		some := false
		ls := b.limits()
		for d, l := range ls {
			if l == nil {
				continue
			}
			some = true
			nl, err := named(l, names[d])
			if err == nil {
				err = nl.Validate()
			}
			if err != nil {
				return &ConfigError{Field: field + "." + fieldNames[d], Reason: err.Error(), Err: err}
			}
			ls[d] = nl
		}
		if !some {
			return &ConfigError{Field: field, Reason: "sets no limit"}
		}
		b.Requests, b.Tokens, b.InputTokens, b.OutputTokens, b.Spend = ls[0], ls[1], ls[2], ls[3], ls[4]
		budgets[i] = b
		if b.Spend != nil && len(o.Prices) == 0 {
			return &ConfigError{Field: "Prices", Reason: "are required by " + field + ".Spend"}
		}
	}
	o.Budgets = budgets
	for model, p := range o.Prices {
		if p.Input < 0 || p.Output < 0 || p.CacheRead < 0 || p.CacheWrite < 0 {
			return &ConfigError{Field: fmt.Sprintf("Prices[%q]", model), Reason: "must not be negative"}
		}
	}
	switch {
	case o.QuotaStatus == 0:
		o.QuotaStatus = http.StatusPaymentRequired
	case o.QuotaStatus != http.StatusPaymentRequired && o.QuotaStatus != http.StatusForbidden:
		return &ConfigError{Field: "QuotaStatus", Reason: fmt.Sprintf("must be 0, 402 or 403, got %d", o.QuotaStatus)}
	}
	switch {
	case o.DefaultMaxTokens < 0:
		return &ConfigError{Field: "DefaultMaxTokens", Reason: "must not be negative"}
	case o.DefaultMaxTokens == 0:
		o.DefaultMaxTokens = DefaultMaxTokens
	}
	switch {
	case o.HoldTTL < 0:
		return &ConfigError{Field: "HoldTTL", Reason: "must not be negative"}
	case o.HoldTTL == 0:
		o.HoldTTL = DefaultHoldTTL
	}
	switch {
	case o.MaxBody < 0:
		return &ConfigError{Field: "MaxBody", Reason: "must not be negative"}
	case o.MaxBody == 0:
		o.MaxBody = DefaultMaxBody
	}
	if o.Tokens == nil {
		o.Tokens = Bytes4
	}
	if o.API == nil {
		o.API = ByPath
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

var fieldNames = [dims]string{"Requests", "Tokens", "InputTokens", "OutputTokens", "Spend"}

// named is l with name as its Name unless it has one: the limits of a Budget share its key, so
// two of one algorithm (a month's tokens and a month's spend, both Calendars) need a Name
// each. A sliding log cannot be held: it is refused.
func named(l client.Limit, name string) (client.Limit, error) {
	switch v := l.(type) {
	case client.FixedWindow:
		v.Name = cmpOr(v.Name, name)
		return v, nil
	case *client.FixedWindow:
		if v != nil {
			return named(*v, name)
		}
	case client.SlidingWindow:
		v.Name = cmpOr(v.Name, name)
		return v, nil
	case *client.SlidingWindow:
		if v != nil {
			return named(*v, name)
		}
	case client.TokenBucket:
		v.Name = cmpOr(v.Name, name)
		return v, nil
	case *client.TokenBucket:
		if v != nil {
			return named(*v, name)
		}
	case client.LeakyBucket:
		v.Name = cmpOr(v.Name, name)
		return v, nil
	case *client.LeakyBucket:
		if v != nil {
			return named(*v, name)
		}
	case client.Calendar:
		v.Name = cmpOr(v.Name, name)
		return v, nil
	case *client.Calendar:
		if v != nil {
			return named(*v, name)
		}
	case client.SlidingLog, *client.SlidingLog:
		return nil, fmt.Errorf("a SlidingLog cannot hold units (library 1.3.0): use a SlidingWindow")
	default:
		return nil, fmt.Errorf("%T is no limit llmlimit can hold", l)
	}
	return nil, fmt.Errorf("must not be a nil pointer")
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// quota reports a limit whose refusal is an exhausted quota (QuotaStatus), not a rate (429).
func quota(l client.Limit) bool {
	switch l.(type) {
	case client.Calendar, *client.Calendar:
		return true
	}
	return false
}
