package main

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/valkey-io/valkey-go"
)

// errURLPassword is the whole message for a URL that may hold a password and does not parse
// as meant: any detail would quote part of it.
const errURLPassword = "--url is not valid (a password with # / ? or % must be URL-encoded, e.g. # as %23)"

// urlParams are the query parameters of valkey-go's URLs that the service passes on, as the
// rlfn CLI does.
var urlParams = []string{"db", "dial_timeout", "write_timeout", "skip_verify", "protocol", "client_name", "max_retries"}

// parseURL reads the server's URL as rlfn's commands take it: redis://, valkey://,
// rediss:// or valkeys:// (TLS), user:password@host:port[/db], any one node of a standalone
// server or of a cluster (valkey-go finds the cluster's other nodes). Client-side caching
// is off: every decision reads the server. An unknown query parameter is an error, and no
// error repeats the password.
func parseURL(raw string) (valkey.ClientOption, error) {
	mayHoldPassword := strings.Contains(raw, "@")
	u, err := url.Parse(raw)
	if err != nil {
		if mayHoldPassword {
			return valkey.ClientOption{}, errors.New(errURLPassword)
		}
		return valkey.ClientOption{}, fmt.Errorf("--url is not a URL: %v", errors.Unwrap(err))
	}
	// A password that a '#', '/' or '?' cut short leaves its rest in the fragment, or an
	// '@' outside the user info.
	if u.Fragment != "" || (u.User == nil && mayHoldPassword) {
		return valkey.ClientOption{}, errors.New(errURLPassword)
	}
	safe := u.Redacted()
	switch u.Scheme {
	case "redis", "valkey", "rediss", "valkeys":
	default:
		return valkey.ClientOption{}, fmt.Errorf("--url %q: the scheme must be redis, valkey, rediss or valkeys", safe)
	}
	for k := range u.Query() {
		if !slices.Contains(urlParams, k) {
			// A typo (dial_timout) must not be dropped without a word; Sentinel and more
			// seeds are not taken: any one node finds the others.
			return valkey.ClientOption{}, fmt.Errorf("--url %q: unknown parameter %q; there are %s", safe, k, strings.Join(urlParams, ", "))
		}
	}
	if u.Path == "/" {
		u.Path, u.RawPath = "", ""
	}
	opt, err := valkey.ParseURL(u.String())
	if err != nil {
		return opt, fmt.Errorf("--url %q: %v", safe, err)
	}
	opt.DisableCache = true
	return opt, nil
}

// redact is the URL without its password, for messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "the --url"
	}
	return u.Redacted()
}
