package client

import (
	"errors"
	"fmt"
	"strings"
)

// ErrNotLoaded is returned when the server has no ratelimit library (it answered "Function not
// found"): the library is loaded once per server by a deploy, never by this client.
var ErrNotLoaded = errors.New("client: the ratelimit library is not loaded on the server")

// ErrCircuitOpen is returned, under the ReturnError Fallback, by the calls made while the circuit
// breaker is open: the server failed repeatedly, and no call is sent until the breaker's probe.
var ErrCircuitOpen = errors.New("client: circuit breaker open: the server failed repeatedly; no call is sent until its cooldown ends")

// LimitError reports a limit or cost that the library would refuse, found before any network
// call.
type LimitError struct {
	Field  string // the offending field, e.g. "TokenBucket.Rate", "cost", or for AllowAll "rules[1] TokenBucket.Rate"
	Reason string // what is wrong with it, e.g. "must be from 1 to 999999999999999, got 0"
}

func (e *LimitError) Error() string { return "client: " + e.Field + " " + e.Reason }

// KeyError reports a key (the principal a call names) that the Limiter refuses before any
// call: an empty one, most likely an identifier the caller failed to read, or one longer than
// Options.MaxKeyLen, which would cost the server its length in memory for every limiter of it
// (for as long as the limiter lives: a sliding log's window). It is the caller's: no Fallback
// decides it, and client/httplimit answers it 400.
type KeyError struct {
	Len int // the key's length in bytes
	Max int // the longest key the Limiter takes (Options.MaxKeyLen)
}

func (e *KeyError) Error() string {
	if e.Len == 0 {
		return "client: the key is empty: no principal to count the call against"
	}
	return fmt.Sprintf("client: the key is %d bytes, longer than the %d Options.MaxKeyLen allows (key a long identifier by a hash of it)", e.Len, e.Max)
}

// LibraryError is an RLERR reply: the library refused the call, before writing anything. With
// limits this client has validated, it means the key holds something else than this limiter's
// state (another type, or another algorithm's state).
type LibraryError struct {
	Function string // e.g. "rl_token_bucket"
	Message  string // the reply without "RLERR ", e.g. "rl_token_bucket: key 'x' does not hold ..."
}

func (e *LibraryError) Error() string { return "client: " + e.Function + ": RLERR " + e.Message }

// replyError reports a reply outside the library's contract (six integers, allowed 0 or 1).
type replyError struct {
	Function string // e.g. "rl_token_bucket"
	Reason   string // e.g. "4 elements, want 6"
}

func (e *replyError) Error() string {
	return "client: " + e.Function + ": reply out of contract: " + e.Reason
}

// VersionError reports a primary that runs no ratelimit library, one of a major version this
// client does not speak, or one older than a call or CheckVersion needs (a 1.1 feature
// against a node still running 1.0.0). It is errors.Is ErrNotLoaded when the library is
// absent. A call the node's library is too old for is decided by the Fallback (only ReturnError
// returns it): a limit must not turn into no limit because a deploy has not reached a node, or
// was rolled back. The Limiter asks such a node again once a breaker cooldown has passed; until
// then its calls that need more go to the Fallback without a round trip. CheckRules and
// CheckVersion find such nodes at start-up.
type VersionError struct {
	Node    string // the node's address
	Version string // what its rl_version answered; empty when the library is absent
	// Want is what is needed: the major version this client speaks (e.g. "1") from Check, a
	// minimum version (e.g. "1.1.0") from CheckVersion or a call.
	Want string
	// Function is, for a call, the function (or argument) that needs Want, e.g.
	// "rl_concurrency" or "rl_token_bucket reserve"; empty from Check and CheckVersion.
	Function string
}

func (e *VersionError) Error() string {
	switch {
	case e.Version == "":
		return fmt.Sprintf("client: node %s has no ratelimit library", e.Node)
	case !strings.Contains(e.Want, "."):
		return fmt.Sprintf("client: node %s runs ratelimit library %s, this client speaks %s.x",
			e.Node, e.Version, e.Want)
	case e.Function != "":
		return fmt.Sprintf("client: node %s runs ratelimit library %s, %s needs %s or later",
			e.Node, e.Version, e.Function, e.Want)
	}
	return fmt.Sprintf("client: node %s runs ratelimit library %s, %s or later is required",
		e.Node, e.Version, e.Want)
}

// Unwrap makes an absent library errors.Is ErrNotLoaded.
func (e *VersionError) Unwrap() error {
	if e.Version == "" {
		return ErrNotLoaded
	}
	return nil
}
