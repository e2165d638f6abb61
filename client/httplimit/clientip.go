package httplimit

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// DefaultIPv6Prefix is ClientIPOptions.IPv6Prefix when it is zero: one customer's site is
// given a /64 and picks addresses in it at will, so a single IPv6 address is no principal.
const DefaultIPv6Prefix = 64

// ClientIPOptions configures NewClientIP.
type ClientIPOptions struct {
	// TrustedProxies are the addresses (192.0.2.7, 2001:db8::7) and networks (10.0.0.0/8,
	// 2001:db8::/48) of the proxies in front of the service: only a request whose peer is one
	// of them has its Header read. Default (nil): none, every request is keyed by its peer.
	TrustedProxies []string
	// Header is the header the trusted proxies append the address they received a request
	// from to: "X-Forwarded-For" or "Forwarded" (RFC 7239). Read only that one: a client can
	// send the other, which a proxy that does not manage it passes on untouched. Default
	// (empty): "X-Forwarded-For".
	Header string
	// IPv6Prefix groups IPv6 clients by this many leading bits, from 1 to 128. Default (0):
	// DefaultIPv6Prefix, 64.
	IPv6Prefix int
}

// ClientIP keys requests by the client's IP address, read from the proxies' header only when
// it can be trusted: the rightmost address in it that is not a trusted proxy, which the
// proxy nearest that client wrote. What the client wrote itself is to the left of it and
// never read. Use its Key as an Options.Key or an AlsoLimit.Key.
type ClientIP struct {
	trusted   []netip.Prefix
	forwarded bool // Forwarded rather than X-Forwarded-For
	v6Bits    int
}

// NewClientIP returns a ClientIP, or an *ConfigError naming what opts got wrong.
func NewClientIP(opts ClientIPOptions) (*ClientIP, error) {
	c := &ClientIP{v6Bits: opts.IPv6Prefix}
	switch http.CanonicalHeaderKey(opts.Header) {
	case "", "X-Forwarded-For":
	case "Forwarded":
		c.forwarded = true
	default:
		return nil, &ConfigError{Field: "ClientIPOptions.Header", Reason: fmt.Sprintf(`must be "X-Forwarded-For" or "Forwarded", got %q`, opts.Header)}
	}
	if c.v6Bits == 0 {
		c.v6Bits = DefaultIPv6Prefix
	}
	if c.v6Bits < 1 || c.v6Bits > 128 {
		return nil, &ConfigError{Field: "ClientIPOptions.IPv6Prefix", Reason: fmt.Sprintf("must be from 1 to 128, got %d", opts.IPv6Prefix)}
	}
	for _, s := range opts.TrustedProxies {
		p, err := parseTrusted(s)
		if err != nil {
			return nil, &ConfigError{Field: "ClientIPOptions.TrustedProxies", Reason: fmt.Sprintf("%q: want an IP address or a CIDR network", s)}
		}
		c.trusted = append(c.trusted, p)
	}
	return c, nil
}

// parseTrusted reads an address or a network, IPv4-mapped IPv6 ones as the IPv4 they are.
func parseTrusted(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("bad address %q", s)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	if a := p.Addr(); a.Is4In6() {
		if p.Bits() < 96 {
			return netip.Prefix{}, fmt.Errorf("IPv4-mapped network %q shorter than /96", s)
		}
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked(), nil
}

// Key returns the client's address (an IPv6 one as its network, e.g. "2001:db8:1:2::/64").
// Its error, a RemoteAddr that is no address, answers 400 as any Key error does; it does not
// happen with net/http's server.
func (c *ClientIP) Key(r *http.Request) (string, error) {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	var a netip.Addr
	if err == nil {
		a = peer.Addr()
	} else if a, err = netip.ParseAddr(r.RemoteAddr); err != nil {
		return "", fmt.Errorf("httplimit: RemoteAddr %q: not an IP address", r.RemoteAddr)
	}
	a = a.WithZone("").Unmap()
	if c.isTrusted(a) {
		var chain []netip.Addr
		if c.forwarded {
			chain = forwardedFor(r.Header.Values("Forwarded"))
		} else {
			chain = xForwardedFor(r.Header.Values("X-Forwarded-For"))
		}
		a = c.client(a, chain)
	}
	return c.group(a), nil
}

// client is the address to key a request by, given its trusted peer and the addresses its
// proxies forwarded (an invalid Addr for an entry that is none): walking from the right, the
// first one that is not a trusted proxy. An entry that is no address (garbage, "unknown", an
// obfuscated identifier) ends the walk at the peer: what lies beyond cannot be told apart
// from what the client wrote. Every entry trusted, the leftmost is the client, one of the
// proxies' own networks.
func (c *ClientIP) client(peer netip.Addr, chain []netip.Addr) netip.Addr {
	for i := len(chain) - 1; i >= 0; i-- {
		a := chain[i]
		switch {
		case !a.IsValid():
			return peer
		case !c.isTrusted(a):
			return a
		case i == 0:
			return a
		}
	}
	return peer
}

func (c *ClientIP) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// group is the key of an address: an IPv4 one itself, an IPv6 one its network.
func (c *ClientIP) group(a netip.Addr) string {
	if a.Is4() || c.v6Bits == 128 {
		return a.String()
	}
	return netip.PrefixFrom(a, c.v6Bits).Masked().String()
}

// xForwardedFor reads the addresses of X-Forwarded-For headers, several of them one list in
// their order (RFC 9110, section 5.3), whose empty elements are ignored (section 5.6.1), as
// forwardedFor's are.
func xForwardedFor(values []string) []netip.Addr {
	var chain []netip.Addr
	for _, v := range values {
		for e := range strings.SplitSeq(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				chain = append(chain, parseNode(e))
			}
		}
	}
	return chain
}

// parseNode reads a node as proxies write it: 192.0.2.1, 192.0.2.1:80, 2001:db8::1,
// [2001:db8::1], [2001:db8::1]:80, and RFC 7239's obfuscated ports (192.0.2.1:_a1): the address
// is known. IPv4-mapped IPv6 is read as IPv4. Anything else ("unknown", an obfuscated
// identifier, a bracketed IPv4, a zone, garbage) is the invalid Addr.
func parseNode(s string) netip.Addr {
	host := s
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.IndexByte(s, ']')
		if end < 0 || !validPort(s[end+1:]) {
			return netip.Addr{}
		}
		host = s[1:end]
	case strings.Count(s, ":") == 1: // IPv4 with a port; a bare IPv6 has several
		var port string
		host, port, _ = strings.Cut(s, ":")
		if !validPort(":" + port) {
			return netip.Addr{}
		}
	}
	a, err := netip.ParseAddr(host)
	if err != nil || a.Zone() != "" || host != s && strings.HasPrefix(s, "[") != a.Is6() {
		return netip.Addr{}
	}
	return a.Unmap()
}

// validPort reports an empty s, or ":" and a port: digits, or an obfuscated one ("_" and
// letters, digits, '.', '_', '-'; RFC 7239, section 6.3).
func validPort(s string) bool {
	if s == "" {
		return true
	}
	if s[0] != ':' || len(s) < 2 {
		return false
	}
	p := s[1:]
	if p[0] == '_' {
		for i := 1; i < len(p); i++ {
			if c := p[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
				return false
			}
		}
		return len(p) > 1
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
	}
	return len(p) <= 5
}

// forwardedFor reads the for= node of each element of Forwarded headers (RFC 7239), in
// order. An element without one, or one that does not parse, is the invalid Addr; an empty
// one is skipped. Every comma ends an element, even inside a quoted string, where the syntax
// would keep it: a client that sends an unclosed quote (for="x) would otherwise have it
// swallow the element the proxy appends after it, whose for= is the one to read. No node
// holds a comma, so only an element that is wrong to begin with is cut.
func forwardedFor(values []string) []netip.Addr {
	var chain []netip.Addr
	for _, v := range values {
		for e := range strings.SplitSeq(v, ",") {
			if e = strings.TrimSpace(e); e == "" {
				continue
			}
			node := netip.Addr{}
			if pairs, ok := parseElement(e); ok {
				for _, p := range pairs {
					if strings.EqualFold(p.name, "for") {
						node = parseNode(p.value)
						break
					}
				}
			}
			chain = append(chain, node)
		}
	}
	return chain
}

type pair struct{ name, value string }

// parseElement reads the pairs of one forwarded-element (name=token or name="quoted
// string", separated by ';'), and whether it parsed whole.
func parseElement(s string) ([]pair, bool) {
	var pairs []pair
	i := 0
	for {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		start := i
		for i < len(s) && isTchar(s[i]) {
			i++
		}
		name := s[start:i]
		if name == "" || i >= len(s) || s[i] != '=' {
			return nil, false
		}
		i++
		var value string
		if i < len(s) && s[i] == '"' {
			var b strings.Builder
			i++
			closed := false
			for i < len(s) {
				ch := s[i]
				if ch == '\\' && i+1 < len(s) {
					b.WriteByte(s[i+1])
					i += 2
					continue
				}
				i++
				if ch == '"' {
					closed = true
					break
				}
				b.WriteByte(ch)
			}
			if !closed {
				return nil, false
			}
			value = b.String()
		} else {
			start = i
			for i < len(s) && isTchar(s[i]) {
				i++
			}
			value = s[start:i]
			if value == "" {
				return nil, false
			}
		}
		pairs = append(pairs, pair{name, value})
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		if i >= len(s) {
			return pairs, true
		}
		if s[i] != ';' {
			return nil, false
		}
		i++
	}
}

// isTchar reports a token character (RFC 9110, section 5.6.2).
func isTchar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
