// Package limitname carries the name of a middleware's decision (its policy's, or a further
// limit's) into a *client.Limiter's metrics, spans and log lines as an argument of the call,
// where client.WithLimitName's context would cost every request an allocation. Package client
// sets these functions when it is initialized; internal/decide calls them. They are typed
// any because this package cannot import client, which imports it: each holds the function
// its comment gives, which internal/decide asserts once.
package limitname

var (
	// AllowN is func(*client.Limiter, context.Context, name, key string, client.Limit, n int64) (client.Result, error).
	AllowN any
	// PeekN is AllowN's signature, for PeekN.
	PeekN any
	// Refund is AllowN's signature, for Refund.
	Refund any
	// Acquire is func(*client.Limiter, context.Context, name, key string, client.Concurrency) (*client.Lease, client.Result, error).
	Acquire any
)
