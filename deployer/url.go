package deployer

import (
	"fmt"
	"net"
	"net/url"

	"github.com/valkey-io/valkey-go"
)

// ParseURL turns a redis://, valkey://, rediss:// or valkeys:// URL
// (user:password@host:port[/db], TLS for the "s" schemes) into client options for any one
// node; a cluster is detected from there by Discover, or by valkey.NewClient. Client-side
// caching is disabled: the deployer and the CLI read the server's answers, and tracking
// would need more ACL permissions. valkey-go's query parameters (dial_timeout,
// skip_verify, ...) are passed through. Errors never repeat the password.
func ParseURL(raw string) (valkey.ClientOption, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url's error quotes the whole URL, password included.
		return valkey.ClientOption{}, fmt.Errorf("deployer: URL is not valid: %v", redactErr(err))
	}
	safe := u.Redacted()
	switch u.Scheme {
	case "redis", "valkey", "rediss", "valkeys":
	case "":
		return valkey.ClientOption{}, fmt.Errorf("deployer: URL %q has no scheme: use redis://host:port (or valkey://, rediss://, valkeys://)", safe)
	default:
		return valkey.ClientOption{}, fmt.Errorf("deployer: URL %q: scheme %q is not one of redis, valkey, rediss, valkeys", safe, u.Scheme)
	}
	if u.Opaque != "" {
		return valkey.ClientOption{}, fmt.Errorf("deployer: URL %q: want %s://host:port", safe, u.Scheme)
	}
	if u.Port() != "" {
		if _, err := net.LookupPort("tcp", u.Port()); err != nil {
			return valkey.ClientOption{}, fmt.Errorf("deployer: URL %q: port %q is not a port", safe, u.Port())
		}
	}
	opt, err := valkey.ParseURL(raw)
	if err != nil {
		return valkey.ClientOption{}, fmt.Errorf("deployer: URL %q: %v", safe, err)
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
