package client_test

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go/mock"

	"github.com/rlfn/rlfn/client"
)

var (
	tb = client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Second}
	// one limit per algorithm, and both leaky modes
	everyAlgorithm = []client.Limit{
		client.FixedWindow{}, client.SlidingLog{}, client.SlidingWindow{}, client.TokenBucket{},
		client.LeakyBucket{Mode: client.Police}, client.LeakyBucket{Mode: client.Shape},
	}
)

func TestKey(t *testing.T) {
	tests := []struct {
		prefix, give string
		want         string
		wantTag      string // what a cluster hashes
	}{
		{prefix: "rl:", give: "user:42", want: "rl:{user:42}:token_bucket", wantTag: "user:42"},
		{prefix: "rl:", give: "", want: "rl:{%}:token_bucket", wantTag: "%"},
		{prefix: "rl:", give: "%", want: "rl:{%25}:token_bucket", wantTag: "%25"},
		{prefix: "rl:", give: "%25", want: "rl:{%2525}:token_bucket", wantTag: "%2525"},
		{prefix: "rl:", give: "%7B", want: "rl:{%257B}:token_bucket", wantTag: "%257B"},
		{prefix: "rl:", give: "{", want: "rl:{%7B}:token_bucket", wantTag: "%7B"},
		{prefix: "rl:", give: "}", want: "rl:{%7D}:token_bucket", wantTag: "%7D"},
		{prefix: "rl:", give: "{}", want: "rl:{%7B%7D}:token_bucket", wantTag: "%7B%7D"},
		{prefix: "rl:", give: "}{", want: "rl:{%7D%7B}:token_bucket", wantTag: "%7D%7B"},
		{prefix: "rl:", give: "a}b", want: "rl:{a%7Db}:token_bucket", wantTag: "a%7Db"},
		{prefix: "rl:", give: "{x}", want: "rl:{%7Bx%7D}:token_bucket", wantTag: "%7Bx%7D"},
		{prefix: "rl:", give: "x", want: "rl:{x}:token_bucket", wantTag: "x"},
		{prefix: "rl:", give: "user:1}:fixed_window", want: "rl:{user:1%7D:fixed_window}:token_bucket", wantTag: "user:1%7D:fixed_window"},
		{prefix: "rl:", give: "user:1}:token_bucket", want: "rl:{user:1%7D:token_bucket}:token_bucket", wantTag: "user:1%7D:token_bucket"},
		{prefix: "rl:", give: "user:1", want: "rl:{user:1}:token_bucket", wantTag: "user:1"},
		{prefix: "rl:", give: `\`, want: `rl:{\}:token_bucket`, wantTag: `\`},
		{prefix: "rl:", give: `\}`, want: `rl:{\%7D}:token_bucket`, wantTag: `\%7D`},
		{prefix: "rl:", give: `a\b`, want: `rl:{a\b}:token_bucket`, wantTag: `a\b`},
		{prefix: "rl:", give: "\x00{\xff", want: "rl:{\x00%7B\xff}:token_bucket", wantTag: "\x00%7B\xff"},
		{prefix: "rl:", give: "ключ{", want: "rl:{ключ%7B}:token_bucket", wantTag: "ключ%7B"},
		{prefix: "", give: "k", want: "{k}:token_bucket", wantTag: "k"},
		{prefix: "{all}", give: "k", want: "%7Ball%7D{k}:token_bucket", wantTag: "k"},
		{prefix: "rl:{", give: "k", want: "rl:%7B{k}:token_bucket", wantTag: "k"},
		// the prefix and the key cannot trade characters
		{prefix: "rl:{a", give: "b", want: "rl:%7Ba{b}:token_bucket", wantTag: "b"},
		{prefix: "rl:", give: "{ab", want: "rl:{%7Bab}:token_bucket", wantTag: "%7Bab"},
	}
	seen := map[string]string{}
	for _, tt := range tests {
		got := client.KeyOf(tt.prefix, tt.give, tb)
		if got != tt.want {
			t.Errorf("Key(%q, %q) = %q, want %q", tt.prefix, tt.give, got, tt.want)
		}
		if tag := hashTag(got); tag != tt.wantTag {
			t.Errorf("Key(%q, %q) = %q hashes %q, want %q", tt.prefix, tt.give, got, tag, tt.wantTag)
		}
		in := fmt.Sprintf("%q %q", tt.prefix, tt.give)
		if other, dup := seen[got]; dup {
			t.Errorf("%s and %s both compose %q", in, other, got)
		}
		seen[got] = in
	}
}

func TestKeyAlgorithms(t *testing.T) {
	var got []string
	for _, l := range everyAlgorithm {
		got = append(got, client.KeyOf("rl:", "k", l))
	}
	want := []string{"rl:{k}:fixed_window", "rl:{k}:sliding_log", "rl:{k}:sliding_window",
		"rl:{k}:token_bucket", "rl:{k}:leaky_bucket", "rl:{k}:leaky_bucket"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("got %q, want %q", got, want)
	}
}

// FuzzKey: every composed key can be taken apart again into its prefix, key and algorithm
// (so distinct inputs never compose one key), and a cluster hashes the escaped key alone,
// whatever the prefix and the algorithm.
func FuzzKey(f *testing.F) {
	for _, s := range [][2]string{
		{"rl:", "user:42"}, {"rl:", ""}, {"", "{x}"}, {"{", "}"}, {"%", "%7B"}, {"a}b", "}{"},
		{"rl:", "user:1}:fixed_window"}, {`\`, `\{`}, {"rl:{a", "b"}, {"rl:", "{ab"},
	} {
		f.Add(s[0], s[1], "rl:", "{x}")
	}
	f.Fuzz(func(t *testing.T, prefix, key, prefix2, key2 string) {
		for _, l := range everyAlgorithm {
			got := client.KeyOf(prefix, key, l)
			p, k, alg, ok := parseKey(got)
			if !ok || p != prefix || k != key || alg != client.KeyOf("", "k", l)[len("{k}:"):] {
				t.Fatalf("Key(%q, %q) = %q parses as %q %q %q %v", prefix, key, got, p, k, alg, ok)
			}
			tag := hashTag(got)
			if tag == "" || strings.ContainsAny(tag, "{}") {
				t.Fatalf("Key(%q, %q) = %q hashes %q", prefix, key, got, tag)
			}
			if other := hashTag(client.KeyOf(prefix2, key, everyAlgorithm[0])); other != tag {
				t.Fatalf("the key %q hashes %q under prefix %q but %q under %q", key, tag, prefix, other, prefix2)
			}
			if (prefix != prefix2 || key != key2) && got == client.KeyOf(prefix2, key2, l) {
				t.Fatalf("(%q, %q) and (%q, %q) both compose %q", prefix, key, prefix2, key2, got)
			}
		}
	})
}

// hashTag returns what a cluster hashes: the bytes between the first '{' and the first '}'
// after it when there are any, else the whole key.
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return key
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return key
	}
	return key[i+1 : i+1+j]
}

// parseKey undoes Key, written independently of it: the prefix runs to the first '{', the key
// to the next '}', and then comes ":<algorithm>".
func parseKey(s string) (prefix, key, algorithm string, ok bool) {
	i := strings.IndexByte(s, '{')
	if i < 0 {
		return "", "", "", false
	}
	j := strings.IndexByte(s[i:], '}')
	if j < 0 || !strings.HasPrefix(s[i+j:], "}:") {
		return "", "", "", false
	}
	esc, algorithm := s[i+1:i+j], s[i+j+2:]
	if strings.ContainsAny(algorithm, "{}%") {
		return "", "", "", false
	}
	if prefix, ok = unescape(s[:i]); !ok {
		return "", "", "", false
	}
	if esc == "%" {
		return prefix, "", algorithm, true
	}
	if key, ok = unescape(esc); !ok || key == "" {
		return "", "", "", false
	}
	return prefix, key, algorithm, true
}

func unescape(s string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '{', '}':
			return "", false
		case '%':
			if i+2 >= len(s) {
				return "", false
			}
			c, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
			if err != nil || (c != '%' && c != '{' && c != '}') || s[i+1:i+3] != strings.ToUpper(s[i+1:i+3]) {
				return "", false
			}
			b.WriteByte(byte(c))
			i += 2
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String(), true
}

// A Limiter's Key is KeyOf its prefix ("rl:" by default), escaped the same way.
func TestLimiterKey(t *testing.T) {
	limit := client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Second, Name: "n"}
	conc := client.Concurrency{Limit: 1, Lease: time.Second, Name: "c"}
	for _, tt := range []struct{ prefix, want, wantConc string }{
		{"", "rl:{a%7Db}:token_bucket:n", "rl:{a%7Db}:concurrency:c"},
		{"p{}:", "p%7B%7D:{a%7Db}:token_bucket:n", "p%7B%7D:{a%7Db}:concurrency:c"},
	} {
		lim := newLimiter(t, mock.NewClient(nil), client.Options{Prefix: tt.prefix})
		if got := lim.Key("a}b", limit); got != tt.want || got != client.KeyOf(cmp.Or(tt.prefix, "rl:"), "a}b", limit) {
			t.Errorf("prefix %q: Key = %q, want %q", tt.prefix, got, tt.want)
		}
		if got := lim.ConcurrencyKey("a}b", conc); got != tt.wantConc {
			t.Errorf("prefix %q: ConcurrencyKey = %q, want %q", tt.prefix, got, tt.wantConc)
		}
	}
}
