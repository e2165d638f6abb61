// Package serverurl reads the URL that names a Valkey or Redis server, as rlfn and rlfn-rls
// both take it (--url, $RLFN_URL), and the CA that its TLS needs: one parser, so that a URL
// one command takes the other takes too, and neither ever repeats a password in an error.
package serverurl

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

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

// Params are the query parameters of valkey-go's URLs that are passed on, and Sentinel's:
// master_set (valkey-go's: the host is then a Sentinel, and the primary is the one it names
// for that set), addr (more Sentinels with master_set; without it, more nodes of a cluster to
// start from, when the first does not answer), and sentinel_user and sentinel_password (the
// Sentinels' own credentials, when they differ from the primary's).
var Params = []string{"db", "dial_timeout", "write_timeout", "skip_verify", "protocol", "client_cache", "max_retries", "client_name",
	"master_set", "addr", "sentinel_user", "sentinel_password"}

// sentinelRefresh is how often a Sentinel client asks the Sentinels for the primary, beside
// their +switch-master events: one missed event would otherwise bind it to a demoted node.
const sentinelRefresh = 5 * time.Second

// Parse turns a redis://, valkey://, rediss:// or valkeys:// URL
// (user:password@host:port[/db], TLS for the "s" schemes) into client options for any one
// node; a cluster is found from there (by deployer.Discover, or by valkey.NewClient).
// Client-side caching is disabled: the deployer, the CLI and the rate limit service read the
// server's answers, and tracking would need more ACL permissions. valkey-go's query
// parameters (dial_timeout, skip_verify, addr for more seeds, ...) are passed through, and an
// unknown one is an error. A standalone server takes one address: with more, valkey-go
// connects to a cluster only. Errors never repeat the
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
	safe := redacted(u)
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
	q := u.Query()
	for k := range q {
		switch k {
		case "sentinel_user", "sentinel_password":
			if !q.Has("master_set") {
				return valkey.ClientOption{}, fmt.Errorf("URL %q: %s= is the Sentinels' credentials: it needs master_set=", safe, k)
			}
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
	if q.Has("sentinel_user") || q.Has("sentinel_password") {
		// Not valkey-go's: taken here, and kept out of its URL.
		q.Del("sentinel_user")
		q.Del("sentinel_password")
		v := *u
		v.RawQuery = q.Encode()
		raw = v.String()
	}
	opt, err := valkey.ParseURL(raw)
	if err != nil {
		return valkey.ClientOption{}, fmt.Errorf("URL %q: %v", safe, err)
	}
	opt.DisableCache = true
	if opt.Sentinel.MasterSet != "" {
		// The Sentinels speak TLS when the primary does, and are dialled alike (valkey-go
		// dials them with Sentinel.Dialer alone: without it, dial_timeout would not reach
		// them, and a Sentinel that hangs would hold the client for the OS's connect timeout).
		opt.Sentinel.TLSConfig = opt.TLSConfig
		opt.Sentinel.Dialer = opt.Dialer
		opt.Sentinel.Username = u.Query().Get("sentinel_user")
		opt.Sentinel.Password = u.Query().Get("sentinel_password")
		opt.Sentinel.TopologyRefreshInterval = sentinelRefresh
	} else if q.Has("master_set") {
		return valkey.ClientOption{}, fmt.Errorf("URL %q: master_set= is empty", safe)
	}
	return opt, nil
}

// redacted is u without its passwords: the user's, and the Sentinels'.
func redacted(u *url.URL) string {
	q := u.Query()
	if !q.Has("sentinel_password") {
		return u.Redacted()
	}
	q.Set("sentinel_password", "xxxxx")
	v := *u
	v.RawQuery = q.Encode()
	return v.Redacted()
}

// Primary resolves a Sentinel's URL options to the primary its Sentinels name now, for the
// commands that talk to nodes one by one (rlfn deploy, status): the first Sentinel that
// answers names it. Options without master_set are returned as they are.
func Primary(ctx context.Context, opt valkey.ClientOption) (valkey.ClientOption, error) {
	set := opt.Sentinel.MasterSet
	if set == "" {
		return opt, nil
	}
	var errs []error
	for _, addr := range opt.InitAddress {
		s, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true,
			Dialer: opt.Dialer, ConnWriteTimeout: opt.ConnWriteTimeout, TLSConfig: opt.Sentinel.TLSConfig,
			Username: opt.Sentinel.Username, Password: opt.Sentinel.Password})
		if err != nil {
			errs = append(errs, fmt.Errorf("Sentinel %s: %w", addr, err))
			continue
		}
		hostPort, err := s.Do(ctx, s.B().SentinelGetMasterAddrByName().Master(set).Build()).AsStrSlice()
		s.Close()
		if err != nil || len(hostPort) != 2 {
			errs = append(errs, fmt.Errorf("Sentinel %s: no primary for %q: %v", addr, set, err))
			continue
		}
		primary := opt
		primary.InitAddress = []string{net.JoinHostPort(hostPort[0], hostPort[1])}
		primary.Sentinel = valkey.SentinelOption{}
		return primary, nil
	}
	return opt, errors.Join(errs...)
}

// Redact is the URL without its passwords, for messages.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "the --url"
	}
	return redacted(u)
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

// BoundConnect makes d bound the opening of a connection (TCP, TLS, and valkey-go's HELLO
// and the like), of the nodes and of the Sentinels, as d bounds each call; a shorter
// dial_timeout the URL gave is kept. valkey-go opens a node's broken connection again with
// whichever call comes next, and every call to the node waits for it, whatever its own
// deadline: a background call's (the health check's, or none) or valkey-go's 5 s dial
// timeout would otherwise hold every call for seconds once a node hangs (in rlfn-rls,
// Envoy's timeout, not --fallback, would decide; in the CLI, a command would outlive
// --timeout). The price: a server more than d away (TCP and TLS round trips) never connects.
func BoundConnect(opt *valkey.ClientOption, d time.Duration) {
	for _, dialer := range []*net.Dialer{&opt.Dialer, &opt.Sentinel.Dialer} {
		if dialer.Timeout <= 0 || dialer.Timeout > d {
			dialer.Timeout = d
		}
	}
}
