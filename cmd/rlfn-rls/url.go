package main

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/valkey-io/valkey-go"
)

// parseURL reads the server's URL as rlfn's commands take it: redis://, valkey://,
// rediss:// or valkeys:// (TLS), user:password@host:port[/db], any one node of a standalone
// server or of a cluster (valkey-go finds the cluster's other nodes). Client-side caching
// is off: every decision reads the server. Errors never repeat the password.
func parseURL(raw string) (valkey.ClientOption, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return valkey.ClientOption{}, fmt.Errorf("--url is not a URL (a password with # / ? or %% must be URL-encoded)")
	}
	switch u.Scheme {
	case "redis", "valkey", "rediss", "valkeys":
	default:
		return valkey.ClientOption{}, fmt.Errorf("--url %q: the scheme must be redis, valkey, rediss or valkeys", u.Redacted())
	}
	if u.Path == "/" {
		u.Path = ""
	}
	opt, err := valkey.ParseURL(u.String())
	if err != nil {
		return opt, fmt.Errorf("--url %q: %v", u.Redacted(), err)
	}
	opt.DisableCache = true
	return opt, nil
}

// redact is the URL without its password, for messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return strings.SplitN(raw, "@", 2)[len(strings.SplitN(raw, "@", 2))-1]
	}
	return u.Redacted()
}
