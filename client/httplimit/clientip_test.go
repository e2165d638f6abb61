package httplimit

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
)

// The key of a request by its peer and its headers, including what a client sends to pass
// for another: its own X-Forwarded-For or Forwarded from an untrusted peer, entries to the
// left of the ones the proxies wrote, a header the proxies do not manage, garbage.
func TestClientIPKey(t *testing.T) {
	behindProxies := ClientIPOptions{TrustedProxies: []string{"10.0.0.0/8", "2001:db8:ffff::/48", "192.0.2.7"}}
	forwarded := behindProxies
	forwarded.Header = "forwarded"
	tests := []struct {
		name string
		opts ClientIPOptions
		peer string
		xff  []string // X-Forwarded-For headers
		fwd  []string // Forwarded headers
		want string
	}{
		{name: "no proxies trusted: the peer", peer: "198.51.100.1:5000", want: "198.51.100.1"},
		{name: "spoof: XFF from an untrusted peer is not read", opts: behindProxies,
			peer: "198.51.100.1:5000", xff: []string{"203.0.113.9"}, want: "198.51.100.1"},
		{name: "spoof: Forwarded from an untrusted peer is not read", opts: forwarded,
			peer: "198.51.100.1:5000", fwd: []string{"for=203.0.113.9"}, want: "198.51.100.1"},
		{name: "one proxy: the address it appended", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"198.51.100.1"}, want: "198.51.100.1"},
		{name: "spoof: the client's own entry is left of the proxy's", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"203.0.113.9, 198.51.100.1"}, want: "198.51.100.1"},
		{name: "spoof: the client claims a trusted address", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"10.9.9.9, 198.51.100.1"}, want: "198.51.100.1"},
		{name: "two proxies: skipped, the first untrusted", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"203.0.113.9, 198.51.100.1, 10.2.2.2"}, want: "198.51.100.1"},
		{name: "spoof: several XFF headers are one list, in order", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"203.0.113.9", "198.51.100.1, 10.2.2.2"}, want: "198.51.100.1"},
		{name: "the client's header first, the proxy's second header last", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"198.51.100.1, 203.0.113.9", "192.0.2.99"}, want: "192.0.2.99"},
		{name: "spoof: garbage at the right ends the walk at the peer", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"198.51.100.1, <script>"}, want: "10.1.1.1"},
		{name: "garbage left of the client's address is never read", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"not an ip, 198.51.100.1"}, want: "198.51.100.1"},
		{name: "garbage behind a trusted hop: the peer", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"junk, 10.2.2.2"}, want: "10.1.1.1"},
		{name: "empty list elements are ignored", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"198.51.100.1, ,", ""}, want: "198.51.100.1"},
		{name: "spoof: a space-only entry is no address", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"203.0.113.9, 198.51.100.1 10.2.2.2"}, want: "10.1.1.1"},
		{name: "entries with ports and brackets", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"[2001:db8:1:2::9]:443, 198.51.100.1:80, 10.3.3.3:8080"}, want: "198.51.100.1"},
		{name: "bracketed IPv6 with a port", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"[2001:db8:1:2::9]:443"}, want: "2001:db8:1:2::/64"},
		{name: "a bracketed IPv4 is garbage", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"[198.51.100.1]"}, want: "10.1.1.1"},
		{name: "a zone is no client address", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"fe80::1%eth0"}, want: "10.1.1.1"},
		{name: "every entry trusted: the leftmost", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"10.5.5.5, 10.2.2.2"}, want: "10.5.5.5"},
		{name: "no header from a trusted peer: the peer", opts: behindProxies,
			peer: "10.1.1.1:40000", want: "10.1.1.1"},
		{name: "IPv6 grouped by /64", peer: "[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:443", want: "2001:db8:1:2::/64"},
		{name: "IPv6 grouped by /56", opts: ClientIPOptions{IPv6Prefix: 56},
			peer: "[2001:db8:1:2ff::1]:443", want: "2001:db8:1:200::/56"},
		{name: "IPv6 not grouped at /128", opts: ClientIPOptions{IPv6Prefix: 128},
			peer: "[2001:db8::1]:443", want: "2001:db8::1"},
		{name: "IPv4-mapped peer is IPv4", peer: "[::ffff:198.51.100.1]:443", want: "198.51.100.1"},
		{name: "IPv4-mapped trusted peer and entry", opts: behindProxies,
			peer: "[::ffff:10.1.1.1]:443", xff: []string{"::ffff:198.51.100.1"}, want: "198.51.100.1"},
		{name: "a trusted IPv6 proxy", opts: behindProxies,
			peer: "[2001:db8:ffff::1]:443", xff: []string{"2001:db8:1:2::9"}, want: "2001:db8:1:2::/64"},
		{name: "a single trusted address", opts: behindProxies,
			peer: "192.0.2.7:443", xff: []string{"198.51.100.1"}, want: "198.51.100.1"},
		{name: "its neighbour is not trusted", opts: behindProxies,
			peer: "192.0.2.8:443", xff: []string{"198.51.100.1"}, want: "192.0.2.8"},

		{name: "Forwarded: the proxy's element", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{"for=198.51.100.1;proto=https;by=10.1.1.1"}, want: "198.51.100.1"},
		{name: "Forwarded: quoted IPv6 with a port", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{`for="[2001:db8:1:2::9]:4711"`}, want: "2001:db8:1:2::/64"},
		{name: "Forwarded: quoted IPv4 with a port, FOR in capitals", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{`FOR="198.51.100.1:4711"`}, want: "198.51.100.1"},
		{name: "spoof: Forwarded, the client's element left of the proxy's", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{`for=203.0.113.9, for="198.51.100.1"`}, want: "198.51.100.1"},
		{name: "spoof: a comma inside the client's quoted string", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{`for="203.0.113.9, for=10.2.2.2", for=198.51.100.1`}, want: "198.51.100.1"},
		{name: "spoof: XFF is not read when proxies write Forwarded", opts: forwarded,
			peer: "10.1.1.1:40000", xff: []string{"203.0.113.9"}, fwd: []string{"for=198.51.100.1"}, want: "198.51.100.1"},
		{name: "spoof: Forwarded is not read when proxies write XFF", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"198.51.100.1"}, fwd: []string{"for=203.0.113.9"}, want: "198.51.100.1"},
		{name: "Forwarded: obfuscated identifier: the peer", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{"for=198.51.100.1, for=_hidden"}, want: "10.1.1.1"},
		{name: "Forwarded: unknown: the peer", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{"for=unknown"}, want: "10.1.1.1"},
		{name: "Forwarded: unquoted IPv6 is a syntax error: the peer", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{"for=2001:db8::1"}, want: "10.1.1.1"},
		{name: "Forwarded: an element without for: the peer", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{"for=198.51.100.1, proto=https"}, want: "10.1.1.1"},
		{name: "Forwarded: an unclosed quote: the peer", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{`for="198.51.100.1`}, want: "10.1.1.1"},
		{name: "Forwarded: several headers, trusted hops skipped", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{"for=203.0.113.9", "for=198.51.100.1;by=_a", "for=10.2.2.2"}, want: "198.51.100.1"},
		{name: "spoof: the client's unclosed quote does not swallow the proxy's element", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{`for="203.0.113.9, for=198.51.100.1`}, want: "198.51.100.1"},
		{name: "spoof: the client's open quote closed by the proxy's quoted node", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{`for=203.0.113.9;by=", for="[2001:db8:1:2::9]"`}, want: "2001:db8:1:2::/64"},
		{name: "spoof: a stray quote after the client's node", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{`for=203.0.113.9 ", for=198.51.100.1`}, want: "198.51.100.1"},
		{name: "Forwarded: an obfuscated port keeps the address", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{`for="198.51.100.1:_p0rt", for="[2001:db8::9]:_x"`}, want: "2001:db8::/64"},
		{name: "Forwarded: an obfuscated port on IPv4", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{`for="198.51.100.1:_p0rt"`}, want: "198.51.100.1"},
		{name: "Forwarded: a bad port is no node", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{`for="198.51.100.1:http"`}, want: "10.1.1.1"},
		{name: "Forwarded: text after the brackets is no node", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{`for="[2001:db8::9]x"`}, want: "10.1.1.1"},
		{name: "Forwarded: empty elements and spaces are skipped", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{"for=203.0.113.9,, for=198.51.100.1 , ", " "}, want: "198.51.100.1"},
		{name: "Forwarded: IPv4-mapped in brackets is IPv4", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{`for="[::ffff:198.51.100.1]:80"`}, want: "198.51.100.1"},
		{name: "Forwarded: for=unknown behind a trusted hop: the peer", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{"for=198.51.100.1, for=unknown, for=10.2.2.2"}, want: "10.1.1.1"},
		{name: "a trusted entry given as an IPv4-mapped address", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"198.51.100.1, ::ffff:10.2.2.2"}, want: "198.51.100.1"},
		{name: "XFF with an obfuscated port", opts: behindProxies,
			peer: "10.1.1.1:40000", xff: []string{"198.51.100.1:_a"}, want: "198.51.100.1"},
		{name: "Forwarded: escaped characters in a quoted string", opts: forwarded,
			peer: "10.1.1.1:40000", fwd: []string{`for="\[2001:db8:1:2::9\]"`}, want: "2001:db8:1:2::/64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewClientIP(tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tt.peer
			for _, v := range tt.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			for _, v := range tt.fwd {
				r.Header.Add("Forwarded", v)
			}
			got, err := c.Key(r)
			if err != nil || got != tt.want {
				t.Errorf("Key = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestClientIPBadRemoteAddr(t *testing.T) {
	c, err := NewClientIP(ClientIPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "pipe"
	if k, err := c.Key(r); err == nil {
		t.Errorf("Key = %q, want an error", k)
	}
	r.RemoteAddr = "198.51.100.1" // no port: still an address
	if k, err := c.Key(r); err != nil || k != "198.51.100.1" {
		t.Errorf("Key = %q, %v", k, err)
	}
}

func TestNewClientIPRefuses(t *testing.T) {
	tests := []struct {
		give      ClientIPOptions
		wantField string
	}{
		{ClientIPOptions{TrustedProxies: []string{"10.0.0.0/33"}}, "ClientIPOptions.TrustedProxies"},
		{ClientIPOptions{TrustedProxies: []string{"proxy.internal"}}, "ClientIPOptions.TrustedProxies"},
		{ClientIPOptions{TrustedProxies: []string{"fe80::1%eth0"}}, "ClientIPOptions.TrustedProxies"},
		{ClientIPOptions{TrustedProxies: []string{"::ffff:0:0/80"}}, "ClientIPOptions.TrustedProxies"},
		{ClientIPOptions{Header: "X-Real-IP"}, "ClientIPOptions.Header"},
		{ClientIPOptions{IPv6Prefix: 129}, "ClientIPOptions.IPv6Prefix"},
		{ClientIPOptions{IPv6Prefix: -1}, "ClientIPOptions.IPv6Prefix"},
	}
	for _, tt := range tests {
		_, err := NewClientIP(tt.give)
		var oe *ConfigError
		if !errors.As(err, &oe) || oe.Field != tt.wantField || !strings.HasPrefix(err.Error(), "httplimit: ") {
			t.Errorf("NewClientIP(%+v) = %v, want an *ConfigError for %s", tt.give, err, tt.wantField)
		}
	}
	// an IPv4-mapped network is the IPv4 one
	c, err := NewClientIP(ClientIPOptions{TrustedProxies: []string{"::ffff:10.0.0.0/104"}})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.1.2.3:80"
	r.Header.Set("X-Forwarded-For", "198.51.100.1")
	if k, _ := c.Key(r); k != "198.51.100.1" {
		t.Errorf("peer 10.1.2.3 behind ::ffff:10.0.0.0/104: key %q, want the forwarded address", k)
	}
}
