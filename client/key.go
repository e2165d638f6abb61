package client

import "github.com/rlfn/rlfn/internal/keys"

// Key returns the server key holding the state of key's limiter of limit's algorithm, for
// operators' tools (the CLI composes keys with it, so that both reach the same state):
//
//	<prefix>{<key>}:<algorithm>
//	<prefix>{<key>}:<algorithm>:<name>   when the limit has a Name
//
// e.g. "rl:{user:42}:token_bucket", "rl:{user:42}:fixed_window:hourly", with the Limiter's
// Options.Prefix.
//
// Inside the prefix and key, '%', '{' and '}' are written %25, %7B and %7D, and an empty key is
// written as a lone "%". So the first '{' of the result is the one Key writes and the first '}'
// after it closes it: a cluster hashes exactly the escaped key, and a principal's limiters
// share one slot whatever the prefix or the algorithm, while a key's own braces can neither
// choose the slot nor end the tag early. Escaping never writes a '%' that is not followed by two
// hex digits, so a lone "%" is no other key's escape, and the whole composition can be undone:
// distinct (prefix, key, algorithm) give distinct keys, so no principal reaches another's state.
//
// The algorithm is the limiter's name (fixed_window, sliding_log, sliding_window, token_bucket,
// leaky_bucket): both modes of a leaky bucket share a key, see LeakyBucket. The limit's numbers
// are not part of the key, so a changed limit keeps its principals' state; two limits of one
// algorithm for one principal (per second and per hour) need a Name each (or one of them),
// which keeps both in the principal's slot, so that AllowAll decides them in one call. A name
// comes after the algorithm, whose name has no ':', so named and unnamed keys never meet.
func (l *Limiter) Key(key string, limit Limit) string {
	s := limit.spec()
	return string(keys.Append(nil, l.prefix, key, s.alg.name, s.name))
}

// ConcurrencyKey is Key for a Concurrency limit: <prefix>{<key>}:concurrency[:<name>].
func (l *Limiter) ConcurrencyKey(key string, c Concurrency) string {
	s := c.spec("")
	return string(keys.Append(nil, l.prefix, key, s.alg.name, s.name))
}
