// Package keys composes the server keys of the library's limiters, <prefix>{<key>}:<algorithm>
// and <prefix>{<key>}:<algorithm>:<name>, for the client and for the tools that name a
// limiter by its algorithm's name rather than by a client.Limit (the CLI, the playground).
// Limiter.Key in package client says why the key is escaped as it is.
package keys

// Compose is the server key of key's limiter of algorithm and name under prefix.
func Compose(prefix, key, algorithm, name string) string {
	return string(Append(nil, string(AppendEscaped(nil, prefix)), key, algorithm, name))
}

// Append appends the key for an already escaped prefix.
func Append(buf []byte, escapedPrefix, key, algorithm, name string) []byte {
	buf = append(buf, escapedPrefix...)
	buf = append(buf, '{')
	if key == "" {
		// An empty hash tag would make a cluster hash the whole key, scattering the empty
		// principal's limiters over several slots.
		buf = append(buf, '%')
	} else {
		buf = AppendEscaped(buf, key)
	}
	buf = append(buf, '}', ':')
	buf = append(buf, algorithm...)
	if name != "" {
		buf = append(append(buf, ':'), name...)
	}
	return buf
}

// AppendEscaped appends s with '%', '{' and '}' percent-encoded. A loop over the bytes
// rather than strings.IndexAny, which builds its set of bytes on every call: on a key of a
// few bytes that took 3% of a decision's client CPU (BenchmarkThroughput's profile).
func AppendEscaped(buf []byte, s string) []byte {
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
