package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"

	"github.com/valkey-io/valkey-go"
)

// errURLPassword is the whole message for a URL that holds (or may hold) a password and
// does not parse as meant: any detail would quote part of the raw URL, and so perhaps of
// the password.
const errURLPassword = "URL is not valid (a password with # / ? or % must be URL-encoded, e.g. # as %23)"

// urlParams are the query parameters of valkey-go's URLs that rlfn passes on.
var urlParams = []string{"db", "dial_timeout", "write_timeout", "skip_verify", "protocol", "client_cache", "max_retries", "client_name"}

// parseURL turns a redis://, valkey://, rediss:// or valkeys:// URL
// (user:password@host:port[/db], TLS for the "s" schemes) into client options for any one
// node; a cluster is detected from there by Discover, or by valkey.NewClient. Client-side
// caching is disabled: the deployer and the CLI read the server's answers, and tracking
// would need more ACL permissions. valkey-go's query parameters (dial_timeout,
// skip_verify, ...) are passed through, but not Sentinel's master_set nor more seeds (addr),
// and an unknown one is an error. Errors never repeat the password, nor any part of
// a URL that may hold one.
func parseURL(raw string) (valkey.ClientOption, error) {
	// A password is always followed by '@': without one, the URL holds none and the
	// parser's own words are safe to show.
	mayHoldPassword := strings.Contains(raw, "@")
	u, err := url.Parse(raw)
	if err != nil {
		if mayHoldPassword {
			return valkey.ClientOption{}, errors.New(errURLPassword)
		}
		// url's error quotes the whole URL; keep only what is wrong with it.
		return valkey.ClientOption{}, fmt.Errorf("URL is not valid: %v", redactErr(err))
	}
	// An '@' outside the user info, or a fragment, is a password that a '#', '/' or '?'
	// cut short: the rest of it now sits in the path, query or fragment, and the host may
	// be its first half. Redacted() would not hide it.
	if u.Fragment != "" || (u.User == nil && mayHoldPassword) {
		return valkey.ClientOption{}, errors.New(errURLPassword)
	}
	safe := u.Redacted()
	switch u.Scheme {
	case "redis", "valkey", "rediss", "valkeys":
	case "":
		return valkey.ClientOption{}, fmt.Errorf("URL %q has no scheme: use redis://host:port (or valkey://, rediss://, valkeys://)", safe)
	default:
		return valkey.ClientOption{}, fmt.Errorf("URL %q: scheme %q is not one of redis, valkey, rediss, valkeys", safe, u.Scheme)
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
			// Sentinel, or more seeds: rlfn finds every node itself, from any one.
			return valkey.ClientOption{}, fmt.Errorf("URL %q: rlfn takes the URL of any one node and finds the others itself, not %s=", safe, k)
		}
		if !slices.Contains(urlParams, k) {
			// A typo (dial_timout) must not be dropped without a word.
			return valkey.ClientOption{}, fmt.Errorf("URL %q: unknown parameter %q; there are %s", safe, k, strings.Join(urlParams, ", "))
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

// redactErr drops the URL from a *url.Error, keeping what is wrong with it.
func redactErr(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}
