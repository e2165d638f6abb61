// Package serverurl reads the URL that names a Valkey or Redis server, as rlfn and rlfn-rls
// both take it (--url, $RLFN_URL), and the CA that its TLS needs: one parser, so that a URL
// one command takes the other takes too, and neither ever repeats a password in an error.
package serverurl

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/valkey-io/valkey-go"
)

// ErrPassword is the whole message for a URL that holds (or may hold) a password and
// does not parse as meant: any detail would quote part of the raw URL, and so perhaps of
// the password.
const ErrPassword = "URL is not valid (a password with # / ? or % must be URL-encoded, e.g. # as %23)"

// noScheme says what to write for a URL without a scheme.
const noScheme = "write redis://HOST:PORT (valkey:// is the same; rediss:// or valkeys:// for TLS)"

// knownOpaque reports whether raw starts with one of the schemes but no "//"
// (redis:127.0.0.1:7001), which Parse refuses with what to write instead.
func knownOpaque(raw string) bool {
	scheme, _, ok := strings.Cut(raw, ":")
	return ok && slices.Contains([]string{"redis", "valkey", "rediss", "valkeys"}, strings.ToLower(scheme))
}

// Params are the query parameters of valkey-go's URLs that are passed on.
var Params = []string{"db", "dial_timeout", "write_timeout", "skip_verify", "protocol", "client_cache", "max_retries", "client_name"}

// Parse turns a redis://, valkey://, rediss:// or valkeys:// URL
// (user:password@host:port[/db], TLS for the "s" schemes) into client options for any one
// node; a cluster is found from there (by deployer.Discover, or by valkey.NewClient).
// Client-side caching is disabled: the deployer, the CLI and the rate limit service read the
// server's answers, and tracking would need more ACL permissions. valkey-go's query
// parameters (dial_timeout, skip_verify, ...) are passed through, but not Sentinel's
// master_set nor more seeds (addr), and an unknown one is an error. Errors never repeat the
// password, nor any part of a URL that may hold one.
func Parse(raw string) (valkey.ClientOption, error) {
	// A password is always followed by '@': without one, the URL holds none and the
	// parser's own words are safe to show.
	mayHoldPassword := strings.Contains(raw, "@")
	if !strings.Contains(raw, "://") && !knownOpaque(raw) {
		// host:port alone: url.Parse takes the host for a scheme ("localhost:7442") or
		// fails on the colon ("127.0.0.1:7442"), and neither says what to write.
		if mayHoldPassword {
			return valkey.ClientOption{}, errors.New("URL has no scheme: " + noScheme)
		}
		return valkey.ClientOption{}, fmt.Errorf("URL %q has no scheme: %s", raw, noScheme)
	}
	u, err := url.Parse(raw)
	if err != nil {
		if mayHoldPassword {
			return valkey.ClientOption{}, errors.New(ErrPassword)
		}
		// url's error quotes the whole URL; keep only what is wrong with it.
		return valkey.ClientOption{}, fmt.Errorf("URL is not valid: %v", redactErr(err))
	}
	// An '@' outside the user info, or a fragment, is a password that a '#', '/' or '?'
	// cut short: the rest of it now sits in the path, query or fragment, and the host may
	// be its first half. Redacted() would not hide it.
	if u.Fragment != "" || (u.User == nil && mayHoldPassword) {
		return valkey.ClientOption{}, errors.New(ErrPassword)
	}
	safe := u.Redacted()
	switch u.Scheme {
	case "redis", "valkey", "rediss", "valkeys":
	case "":
		return valkey.ClientOption{}, fmt.Errorf("URL %q has no scheme: %s", safe, noScheme)
	default:
		return valkey.ClientOption{}, fmt.Errorf("URL %q: the scheme must be redis, valkey, rediss or valkeys, not %q", safe, u.Scheme)
	}
	if u.Opaque != "" {
		return valkey.ClientOption{}, fmt.Errorf("URL %q: want %s://host:port", safe, u.Scheme)
	}
	if u.Port() != "" {
		if _, err := net.LookupPort("tcp", u.Port()); err != nil {
			return valkey.ClientOption{}, fmt.Errorf("URL %q: port %q is not a port", safe, u.Port())
		}
	}
	for k := range u.Query() {
		switch k {
		case "master_set", "addr":
			// Sentinel, or more seeds: any one node finds every other.
			return valkey.ClientOption{}, fmt.Errorf("URL %q: unknown parameter %q: the URL of any one node finds the others itself, not %s=", safe, k, k)
		}
		if !slices.Contains(Params, k) {
			// A typo (dial_timout) must not be dropped without a word.
			return valkey.ClientOption{}, fmt.Errorf("URL %q: unknown parameter %q; there are %s", safe, k, strings.Join(Params, ", "))
		}
	}
	if u.Path == "/" {
		// redis://host:6379/ is database 0, as with no path; valkey-go reads the empty
		// database number as an error.
		u.Path, u.RawPath = "", ""
		raw = u.String()
	}
	opt, err := valkey.ParseURL(raw)
	if err != nil {
		return valkey.ClientOption{}, fmt.Errorf("URL %q: %v", safe, err)
	}
	opt.DisableCache = true
	return opt, nil
}

// Redact is the URL without its password, for messages.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "the --url"
	}
	return u.Redacted()
}

// redactErr drops the URL from a *url.Error, keeping what is wrong with it.
func redactErr(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}

// TrustCA makes opt's TLS trust the PEM certificates in file (from names where file came
// from, for errors: "--tls-ca" or "$RLFN_TLS_CA"). A plain URL takes no CA: naming one is
// a mistake, most likely a URL that should have been rediss://.
func TrustCA(opt *valkey.ClientOption, file, from string) error {
	if opt.TLSConfig == nil {
		return errors.New("--tls-ca needs a rediss:// or valkeys:// URL")
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("%s: no PEM certificate in %s", from, file)
	}
	opt.TLSConfig.RootCAs = pool
	return nil
}
