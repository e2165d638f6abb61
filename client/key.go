package client

// DefaultPrefix starts every key unless WithPrefix says otherwise.
const DefaultPrefix = "rl:"

// Key returns the server key holding the state of key's limiter of l's algorithm:
//
//	<prefix>{<key>}:<algorithm>
//	<prefix>{<key>}:<algorithm>:<name>   when the limit has a Name
//
// e.g. "rl:{user:42}:token_bucket", "rl:{user:42}:fixed_window:hourly". The CLI composes keys with it, so that both reach the same
// state.
//
// Inside prefix and key, '%', '{' and '}' are written %25, %7B and %7D, and an empty key is
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
func Key(prefix, key string, l Limit) string {
	s := l.spec()
	return string(appendKey(nil, string(appendEscaped(nil, prefix)), key, s.alg.name, s.name))
}

// ConcurrencyKey is Key for a Concurrency limit: <prefix>{<key>}:concurrency[:<name>].
func ConcurrencyKey(prefix, key string, c Concurrency) string {
	s := c.spec("")
	return string(appendKey(nil, string(appendEscaped(nil, prefix)), key, s.alg.name, s.name))
}

// appendKey appends the key for an already escaped prefix.
func appendKey(buf []byte, escapedPrefix, key, algorithm, name string) []byte {
	buf = append(buf, escapedPrefix...)
	buf = append(buf, '{')
	if key == "" {
		// An empty hash tag would make a cluster hash the whole key, scattering the empty
		// principal's limiters over several slots.
		buf = append(buf, '%')
	} else {
		buf = appendEscaped(buf, key)
	}
	buf = append(buf, '}', ':')
	buf = append(buf, algorithm...)
	if name != "" {
		buf = append(append(buf, ':'), name...)
	}
	return buf
}

// appendEscaped appends s with '%', '{' and '}' percent-encoded. A loop over the bytes
// rather than strings.IndexAny, which builds its set of bytes on every call: on a key of a
// few bytes that took 3% of a decision's client CPU (BenchmarkThroughput's profile).
func appendEscaped(buf []byte, s string) []byte {
	from := 0
	for i := 0; i < len(s); i++ {
		var esc string
		switch s[i] {
		case '%':
			esc = "%25"
		case '{':
			esc = "%7B"
		case '}':
			esc = "%7D"
		default:
			continue
		}
		buf = append(append(buf, s[from:i]...), esc...)
		from = i + 1
	}
	return append(buf, s[from:]...)
}
