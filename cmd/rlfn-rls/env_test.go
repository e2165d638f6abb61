package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/urfave/cli/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/internal/serverurl"
	"github.com/rlfn/rlfn/rls"
)

func lookupIn(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

// Each of the reference's variables sets a flag, has no effect for a reason, or is refused
// with one line naming it: never taken silently.
func TestReferenceEnv(t *testing.T) {
	for _, tc := range []struct {
		env   map[string]string
		flags map[string]string // flag -> value
		notes []string          // variables with no effect
		err   string            // every line of it
	}{
		{env: map[string]string{}},
		{
			// Files, with no RUNTIME_*: the reference's default directory once any of its
			// variables is given, as the reference reads it.
			env:   map[string]string{"CONFIG_TYPE": "FILE"},
			flags: map[string]string{"config": "/srv/runtime_data/current/config"},
		},
		{
			env:   map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379"},
			flags: map[string]string{"config": "/srv/runtime_data/current/config", "url": "redis://redis:6379"},
		},
		{
			env:   map[string]string{"RUNTIME_SUBDIRECTORY": "ratelimit"},
			flags: map[string]string{"config": "/srv/runtime_data/current/ratelimit/config"},
		},
		{
			env:   map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW"},
			flags: map[string]string{"xds-server": "localhost:18000", "xds-backoff-factor": "1"},
		},
		{
			env:   map[string]string{"HOST": "127.0.0.1", "PORT": "9080", "GRPC_PORT": "9081", "DEBUG_PORT": "6070"},
			flags: map[string]string{"http": "127.0.0.1:9080", "grpc": "0.0.0.0:9081"},
			notes: []string{"DEBUG_PORT=6070"},
		},
		{
			env:   map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis.redis.svc:6379", "REDIS_AUTH": "p#ss", "REDIS_POOL_SIZE": "10"},
			flags: map[string]string{"url": "redis://:p%23ss@redis.redis.svc:6379"},
			notes: []string{"REDIS_POOL_SIZE=10"},
		},
		{
			env: map[string]string{"REDIS_SOCKET_TYPE": "TCP", "REDIS_TYPE": "cluster", "REDIS_URL": "a:7000,b:7001", "REDIS_AUTH": "user:pw", "REDIS_TLS": "true", "REDIS_TLS_CACERT": "/ca.pem",
				"REDIS_TLS_CLIENT_CERT": "/redis-certs/tls.crt", "REDIS_TLS_CLIENT_KEY": "/redis-certs/tls.key"},
			flags: map[string]string{"url": "rediss://user:pw@a:7000?addr=b%3A7001", "tls-ca": "/ca.pem", "tls-cert": "/redis-certs/tls.crt", "tls-key": "/redis-certs/tls.key"},
		},
		{
			// REDIS_URL as radix takes it: a redis:// URL, its user, password and database.
			env:   map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis://127.0.0.1:6390"},
			flags: map[string]string{"url": "redis://127.0.0.1:6390"},
		},
		{
			env:   map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis://:secret@redis:6379/0"},
			flags: map[string]string{"url": "redis://:secret@redis:6379"},
		},
		{
			env:   map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis://app:secret@redis:6379?db=2"},
			flags: map[string]string{"url": "redis://app:secret@redis:6379/2"},
		},
		{
			env:   map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis://redis:6379/3?username=app&password=secret&timeout=1s"},
			flags: map[string]string{"url": "redis://app:secret@redis:6379/3"},
			notes: []string{"REDIS_URL=redis://redis:6379/3?password=xxxxx&timeout=1s&username=app"},
		},
		{
			// REDIS_AUTH's user and password win over the URL's, each.
			env:   map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis://app:url-pw@redis:6379", "REDIS_AUTH": "p#ss"},
			flags: map[string]string{"url": "redis://app:p%23ss@redis:6379"},
		},
		{
			env:   map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis://app:url-pw@redis:6379", "REDIS_AUTH": "admin:pw"},
			flags: map[string]string{"url": "redis://admin:pw@redis:6379"},
		},
		{
			// radix dials each node with its own URL's credentials: valkey-go takes one for all.
			env: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "cluster", "REDIS_URL": "redis://:secret@a:7000,redis://:secret@b:7001,c:7002"},
			err: `$REDIS_URL="redis://:xxxxx@a:7000,redis://:xxxxx@b:7001,c:7002": its nodes give different users, passwords or databases: rlfn-rls takes one for all`,
		},
		{
			// A cluster starts from every node given.
			env:   map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "cluster", "REDIS_URL": "a:7000, b:7001,c:7002", "REDIS_AUTH": "pw"},
			flags: map[string]string{"url": "redis://:pw@a:7000?addr=b%3A7001&addr=c%3A7002"},
		},
		{
			env: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "rediss://:secret@redis:6379"},
			err: `$REDIS_URL="rediss://:xxxxx@redis:6379": the reference takes host:port or redis://host:port only (TLS is REDIS_TLS=true)`,
		},
		{
			env: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis://:se#cret@redis:6379"},
			err: `$REDIS_URL="xxxxx": not a valid URL (a password with # / ? or % must be URL-encoded, e.g. # as %23)`,
		},
		{
			// REDIS_SENTINEL_AUTH splits as REDIS_AUTH does; a Sentinel's URL gives the
			// Sentinels' credentials.
			env:   map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster,s1:26379,s2:26379", "REDIS_SENTINEL_AUTH": "watch:secret"},
			flags: map[string]string{"url": "redis://s1:26379?addr=s2%3A26379&master_set=mymaster&sentinel_password=secret&sentinel_user=watch"},
		},
		{
			env:   map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster,redis://watch:secret@s1:26379,redis://watch:secret@s2:26379", "REDIS_AUTH": "pw"},
			flags: map[string]string{"url": "redis://:pw@s1:26379?addr=s2%3A26379&master_set=mymaster&sentinel_password=secret&sentinel_user=watch"},
		},
		{
			// The reference reads a client certificate only with REDIS_TLS.
			env:   map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "a:7000", "REDIS_TLS_CLIENT_CERT": "/redis-certs/tls.crt"},
			flags: map[string]string{"url": "redis://a:7000"},
			notes: []string{"REDIS_TLS_CLIENT_CERT=/redis-certs/tls.crt"},
		},
		{
			env:   map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,s1:26379,s2:26379", "REDIS_AUTH": "pw", "REDIS_SENTINEL_AUTH": "secret"},
			flags: map[string]string{"url": "redis://:pw@s1:26379?addr=s2%3A26379&master_set=mymaster&sentinel_password=secret"},
		},
		{
			env:   map[string]string{"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true", "RUNTIME_WATCH_ROOT": "false", "MERGE_DOMAIN_CONFIG": "true"},
			flags: map[string]string{"config": "/data/ratelimit/config", "merge-domains": "true"},
			notes: []string{"RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false"},
		},
		{
			env:   map[string]string{"SHADOW_MODE": "1", "RESPONSE_DYNAMIC_METADATA": "true", "LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_RESET_HEADER": "RateLimit-Reset", "LOCAL_CACHE_SIZE_IN_BYTES": "1048576", "CACHE_KEY_PREFIX": "rl:", "LOG_LEVEL": "WARN", "GRPC_MAX_CONNECTION_AGE": "1h", "NEAR_LIMIT_RATIO": "0.9"},
			flags: map[string]string{"shadow-mode": "true", "dynamic-metadata": "true", "headers": "reference", "denial-cache": "8192", "prefix": "rl:", "log-level": "warn", "max-connection-age": "1h", "near-limit-ratio": "0.9"},
			notes: []string{"LIMIT_RESET_HEADER=RateLimit-Reset"},
		},
		{
			env:   map[string]string{"USE_STATSD": "false", "USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001", "PROMETHEUS_MAPPER_YAML": "/etc/m.yaml", "CONFIG_GRPC_XDS_NODE_ID": "n", "REDIS_AUTH": "secret"},
			flags: map[string]string{"metrics": ":19001"},
			notes: []string{"USE_STATSD=false", "PROMETHEUS_MAPPER_YAML=/etc/m.yaml", "CONFIG_GRPC_XDS_NODE_ID=n", "REDIS_AUTH=xxxxx"},
		},
		{
			// The reference's defaults for its metrics listener.
			env:   map[string]string{"USE_PROMETHEUS": "true"},
			flags: map[string]string{"metrics": ":9090"},
		},
		{
			env:   map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": "127.0.0.1:9102", "PROMETHEUS_PATH": "/stats/prometheus"},
			flags: map[string]string{"metrics": "127.0.0.1:9102", "metrics-path": "/stats/prometheus"},
		},
		{
			// No listener without USE_PROMETHEUS, or with DISABLE_STATS, as by the reference.
			env:   map[string]string{"PROMETHEUS_ADDR": ":19001", "PROMETHEUS_PATH": "/m"},
			notes: []string{"PROMETHEUS_ADDR=:19001", "PROMETHEUS_PATH=/m"},
		},
		{
			env:   map[string]string{"USE_PROMETHEUS": "true", "DISABLE_STATS": "true", "PROMETHEUS_ADDR": ":19001"},
			notes: []string{"USE_PROMETHEUS=true", "DISABLE_STATS=true", "PROMETHEUS_ADDR=:19001"},
		},
		{
			env: map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c/tls.crt", "GRPC_SERVER_TLS_KEY": "/c/tls.key",
				"GRPC_CLIENT_TLS_CACERT": "/c/ca.crt", "GRPC_CLIENT_TLS_SAN": "envoy"},
			flags: map[string]string{"grpc-tls-cert": "/c/tls.crt", "grpc-tls-key": "/c/tls.key", "grpc-tls-client-ca": "/c/ca.crt", "grpc-tls-client-san": "envoy"},
			notes: []string{"GRPC_SERVER_USE_TLS=true"},
		},
		{
			env:   map[string]string{"GRPC_CLIENT_TLS_CACERT": "/c/ca.crt"},
			notes: []string{"GRPC_CLIENT_TLS_CACERT=/c/ca.crt"},
		},
		{
			env: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_METADATA": "zone=a", "XDS_CLIENT_BACKOFF_JITTER": "false",
				"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "1s", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/c/tls.crt", "RUNTIME_ROOT": "/data"},
			flags: map[string]string{"xds-server": "localhost:18000", "xds-backoff-factor": "1", "xds-node-metadata": "zone=a", "xds-backoff-random": "0", "xds-backoff-initial": "1s"},
			notes: []string{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/c/tls.crt", "RUNTIME_ROOT=/data"},
		},
		{
			// XDS_CLIENT_BACKOFF_RANDOM_FACTOR is jpillora/backoff's Factor, the growth of
			// each wait: at or below 1 (the reference's 0.5) every wait is the first.
			env:   map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "0.5", "XDS_CLIENT_BACKOFF_JITTER": "true"},
			flags: map[string]string{"xds-server": "localhost:18000", "xds-backoff-factor": "1"},
			notes: []string{"XDS_CLIENT_BACKOFF_JITTER=true"},
		},
		{
			env:   map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "1.5"},
			flags: map[string]string{"xds-server": "localhost:18000", "xds-backoff-factor": "1.5"},
		},
		{
			env:   map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "0", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "0s"},
			flags: map[string]string{"xds-server": "localhost:18000", "xds-backoff-factor": "2", "xds-backoff-initial": "100ms"},
		},
		{
			// A first wait above the longest: every wait is the longest, as jpillora/backoff's.
			env:   map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "2m", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "1m"},
			flags: map[string]string{"xds-server": "localhost:18000", "xds-backoff-factor": "1", "xds-backoff-initial": "1m0s", "xds-backoff-max": "1m0s"},
		},
		{
			env:   map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "5s"},
			flags: map[string]string{"xds-server": "localhost:18000", "xds-backoff-factor": "1", "xds-backoff-initial": "5s", "xds-backoff-max": "5s"},
		},
		{
			// Custom header names are refused where they would be sent, noted where not.
			env: map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_LIMIT_HEADER": "X-Limit", "LIMIT_RESET_HEADER": "RateLimit-Reset"},
			err: `$LIMIT_LIMIT_HEADER="X-Limit": rlfn-rls sends the reference's default header names only (RateLimit-Limit)`,
		},
		{
			env:   map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "false", "LIMIT_LIMIT_HEADER": "X-Limit", "LIMIT_RESET_HEADER": "X-Reset"},
			notes: []string{"LIMIT_RESPONSE_HEADERS_ENABLED=false", "LIMIT_LIMIT_HEADER=X-Limit", "LIMIT_RESET_HEADER=X-Reset"},
		},
		{
			env:   map[string]string{"LIMIT_REMAINING_HEADER": "X-Remaining"},
			notes: []string{"LIMIT_REMAINING_HEADER=X-Remaining"},
		},
		{
			env:   map[string]string{"LOG_FORMAT": "text", "DISABLE_STATS": "false", "CACHE_KEY_PREFIX": "", "SHADOW_MODE": "false"},
			notes: []string{"LOG_FORMAT=text", "DISABLE_STATS=false", "CACHE_KEY_PREFIX=", "SHADOW_MODE=false"},
		},
		{
			// Envoy Gateway's: healthy before its control plane serves any configuration.
			env:   map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true"},
			flags: map[string]string{"xds-server": "localhost:18000", "xds-backoff-factor": "1", "healthy-without-config": "true"},
		},
		{
			env:   map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true"},
			flags: map[string]string{"xds-server": "localhost:18000", "xds-backoff-factor": "1"},
			notes: []string{"FORCE_START_WITHOUT_INITIAL_CONFIG=true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true"},
		},
		{
			env: map[string]string{"REDIS_URL": "/var/run/nutcracker/ratelimit.sock", "GRPC_UDS": "/tmp/s", "QUOTA_MODE": "true", "SHADOW_MODE": "maybe", "NEAR_LIMIT_RATIO": "1.5", "BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "m:11211"},
			err: strings.Join([]string{
				`$GRPC_UDS="/tmp/s": rlfn-rls does not listen on a Unix socket: use GRPC_HOST and GRPC_PORT`,
				`$BACKEND_TYPE="memcache": rlfn-rls decides in Valkey or Redis only`,
				`$MEMCACHE_HOST_PORT="m:11211": rlfn-rls decides in Valkey or Redis only, not memcached`,
				`$REDIS_URL="/var/run/nutcracker/ratelimit.sock": REDIS_SOCKET_TYPE is unix: rlfn-rls reaches Valkey or Redis over TCP only (set REDIS_SOCKET_TYPE=tcp and REDIS_URL=host:port)`,
				`$SHADOW_MODE="maybe": not true or false`,
				`$QUOTA_MODE="true": rlfn-rls has quota_mode per descriptor, not for every descriptor at once`,
				`$NEAR_LIMIT_RATIO="1.5": not a fraction above 0, at most 1`,
			}, "\n"),
		},
		{
			env: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "single", "REDIS_URL": "a:1,b:2", "REDIS_AUTH": "secret", "LOG_LEVEL": "loud", "PORT": "http", "GRPC_SERVER_USE_TLS": "true"},
			err: strings.Join([]string{
				`$PORT="http": not a port number`,
				`$GRPC_SERVER_USE_TLS="true": needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY`,
				`$LOG_LEVEL="loud": not one of trace, debug, info, warn, error, fatal, panic`,
				`$REDIS_URL="a:1,b:2": REDIS_TYPE single takes one host:port`,
			}, "\n"),
		},
		{
			// Variables with no effect here are still of the reference's kinds: a bad value
			// is refused, as the reference's envconfig refuses it at start.
			env: map[string]string{"USE_STATSD": "maybe", "USE_DOG_STATSD": "zz", "STATSD_PORT": "abc", "REDIS_POOL_SIZE": "abc", "STATS_FLUSH_INTERVAL": "10",
				"EXTRA_TAGS": "a=b", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "soon", "XDS_CLIENT_BACKOFF_JITTER": "yes"},
			err: strings.Join([]string{
				`$CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL="soon": not a duration with its unit (e.g. 10s)`,
				`$EXTRA_TAGS="a=b": not key:value pairs separated by commas`,
				`$REDIS_POOL_SIZE="abc": not a whole number`,
				`$STATSD_PORT="abc": not a whole number`,
				`$STATS_FLUSH_INTERVAL="10": not a duration with its unit (e.g. 10s)`,
				`$USE_DOG_STATSD="zz": not true or false`,
				`$USE_STATSD="maybe": not true or false`,
				`$XDS_CLIENT_BACKOFF_JITTER="yes": not true or false`,
			}, "\n"),
		},
		{
			// Good values of those kinds, as the reference reads them (a base prefix, an
			// empty map), noted.
			env:   map[string]string{"USE_STATSD": "0", "STATSD_PORT": "0x1FBD", "REDIS_POOL_SIZE": "10", "STATS_FLUSH_INTERVAL": "10s", "EXTRA_TAGS": "a:b,c:d", "PROMETHEUS_MAPPER_YAML": ""},
			flags: map[string]string{"config": "/srv/runtime_data/current/config"},
			notes: []string{"USE_STATSD=0", "STATSD_PORT=0x1FBD", "REDIS_POOL_SIZE=10", "STATS_FLUSH_INTERVAL=10s", "EXTRA_TAGS=a:b,c:d"},
		},
	} {
		effects, err := referenceEnv(lookupIn(tc.env))
		if tc.err != "" || err != nil {
			if err == nil || err.Error() != tc.err || strings.Contains(err.Error(), "secret") {
				t.Errorf("%v: error\n%v\nwant\n%s", tc.env, err, tc.err)
			}
			continue
		}
		flags := map[string]string{}
		var notes []string
		for _, e := range effects {
			if e.Flag == "config" && tc.env["CONFIG_TYPE"] == "GRPC_XDS_SOTW" {
				t.Errorf("%v: a configuration directory beside xDS: %+v", tc.env, e)
			}
			if _, asked := tc.flags["config"]; e.Flag == "config" && e.Value == referenceConfigDir && !asked {
				continue // the reference's default directory: asked for by the cases below
			}
			if e.Flag != "" {
				flags[e.Flag] = e.Value
			} else {
				notes = append(notes, e.Var)
			}
			if strings.Contains(e.Var+e.Note, "secret") {
				t.Errorf("%v: the password in %+v", tc.env, e)
			}
			if _, err := serverurl.Parse(e.Value); e.Flag == "url" && err != nil {
				t.Errorf("%v: --url %s: %v", tc.env, e.Note, err)
			}
		}
		// A directory the reference's variables name (or its default one) is read as the
		// reference reads it: every file.
		if _, ok := tc.flags["config"]; ok && flags["config-every-file"] != "true" {
			t.Errorf("%v: --config %s without --config-every-file", tc.env, flags["config"])
		}
		delete(flags, "config-every-file")
		if fmt.Sprint(flags) != fmt.Sprint(tc.flags) && !(len(flags) == 0 && len(tc.flags) == 0) {
			t.Errorf("%v: flags %v, want %v", tc.env, flags, tc.flags)
		}
		for _, n := range tc.notes {
			if !strings.Contains(strings.Join(notes, " "), n) {
				t.Errorf("%v: notes %v, want %s", tc.env, notes, n)
			}
		}
	}
}

// envoyGatewayEnv is the environment Envoy Gateway gives the reference's Deployment (its
// rendering of the rate limit Deployment), for a Redis at redisURL, an xDS server at xds
// and its certificates in certs (mounted at /certs there), the listeners on loopback here.
func envoyGatewayEnv(redisURL, xds, certs string, ports []int) map[string]string {
	return map[string]string{
		"RUNTIME_ROOT":                       "/data",
		"RUNTIME_SUBDIRECTORY":               "ratelimit",
		"RUNTIME_IGNOREDOTFILES":             "true",
		"RUNTIME_WATCH_ROOT":                 "false",
		"LOG_LEVEL":                          "info",
		"USE_STATSD":                         "false",
		"CONFIG_TYPE":                        "GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL":         xds,
		"CONFIG_GRPC_XDS_NODE_ID":            "envoy-ratelimit",
		"GRPC_SERVER_USE_TLS":                "true",
		"GRPC_SERVER_TLS_CERT":               filepath.Join(certs, "tls.crt"),
		"GRPC_SERVER_TLS_KEY":                filepath.Join(certs, "tls.key"),
		"GRPC_SERVER_TLS_CA_CERT":            filepath.Join(certs, "ca.crt"),
		"CONFIG_GRPC_XDS_SERVER_USE_TLS":     "true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT":    filepath.Join(certs, "tls.crt"),
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY":     filepath.Join(certs, "tls.key"),
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT":  filepath.Join(certs, "ca.crt"),
		"FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
		"REDIS_SOCKET_TYPE":                  "tcp",
		"REDIS_URL":                          redisURL,
		"USE_PROMETHEUS":                     "true",
		"PROMETHEUS_ADDR":                    fmt.Sprint("127.0.0.1:", ports[2]), // :19001 there
		"PROMETHEUS_MAPPER_YAML":             "/etc/statsd-exporter/conf.yaml",
		"HOST":                               "127.0.0.1",
		"GRPC_HOST":                          "127.0.0.1",
		"PORT":                               fmt.Sprint(ports[0]),
		"GRPC_PORT":                          fmt.Sprint(ports[1]),
	}
}

// Started with nothing but the environment Envoy Gateway gives the reference's Deployment
// (certificates, Redis, listeners on loopback here), rlfn-rls takes its configuration from an
// xDS server over mutual TLS, as Envoy Gateway's control plane serves it. Before the first
// configuration (Envoy Gateway's serves none until some listener has a global limit) it is
// healthy, as the reference with FORCE_START_WITHOUT_INITIAL_CONFIG, so that Envoy Gateway's
// startupProbe passes, and answers a request with the reference's "no rate limit
// configuration loaded"; then it serves Envoy over TLS with that configuration; its log says
// what each variable did.
func TestEnvoyGatewayEnv(t *testing.T) {
	url, _, _ := startStalled(t)
	// Envoy Gateway's control plane asks its clients for a certificate.
	sec := newGatewaySecret(t)
	ca, certs, xds := sec.ca, sec.dir, sec.xds

	var ports []int
	var held []net.Listener
	for range 3 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
		held = append(held, l)
	}
	env := envoyGatewayEnv(strings.TrimPrefix(url, "redis://"), xds.Addr, certs, ports)
	for k, v := range env {
		t.Setenv(k, v)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out harness.Buffer
	done := make(chan error, 1)
	// The ports were held until now, so that no other test took them.
	for _, l := range held {
		l.Close()
	}
	go func() {
		done <- newApp(&out).RunContext(ctx, []string{"rlfn-rls", "--check-every", "100ms", "--deadline", "5s"})
	}()
	health := func() int {
		resp, err := http.Get(fmt.Sprint("http://127.0.0.1:", ports[0], "/healthcheck"))
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	waitHealth := func(want int) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); health() != want; time.Sleep(50 * time.Millisecond) {
			select {
			case err := <-done:
				t.Fatalf("the app ended: %v\n%s", err, out.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("health never %d\n%s", want, out.String())
			}
		}
	}
	// Serving, and the backend answering, but no configuration yet: healthy.
	waitHealth(http.StatusOK)
	conn, err := grpc.NewClient(fmt.Sprint("127.0.0.1:", ports[1]), grpc.WithTransportCredentials(credentials.NewTLS(ca.ClientConfig())))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := &pb.RateLimitRequest{Domain: "first-listener", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{
		{Key: "first-route", Value: "first-route"}, {Key: "rule-0-match-0", Value: "user-1"}}}}}
	if _, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "no rate limit configuration loaded") {
		t.Fatalf("before any configuration: %v", err)
	}
	xds.Set(t, &rlsconfv3.RateLimitConfig{Name: "first-listener", Domain: "first-listener", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key: "first-route", Value: "first-route",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "rule-0-match-0", RateLimit: &rlsconfv3.RateLimitPolicy{RequestsPerUnit: 5, Unit: rlsconfv3.RateLimitUnit_HOUR}}},
	}}})
	// Envoy, as Envoy Gateway configures it, speaks TLS to the service.
	var resp *pb.RateLimitResponse
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err = pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req); status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 4 || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 5 {
		t.Fatalf("%v %v", resp, err)
	}
	// Scraped where Envoy Gateway's Service and ServiceMonitor look: PROMETHEUS_ADDR, a
	// listener of its own, at the reference's default path; that one request counted.
	metrics, err := http.Get(fmt.Sprint("http://127.0.0.1:", ports[2], "/metrics"))
	if err != nil {
		t.Fatalf("no metrics at PROMETHEUS_ADDR: %v\n%s", err, out.String())
	}
	body, _ := io.ReadAll(metrics.Body)
	metrics.Body.Close()
	if metrics.StatusCode != http.StatusOK || !strings.Contains(string(body), `rlfn_rls_requests_total{`) {
		t.Fatalf("PROMETHEUS_ADDR: %d\n%s", metrics.StatusCode, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v\n%s", err, out.String())
	}
	// Every variable it was given is in its log: the ones it used and why the others did
	// nothing.
	for k := range env {
		if !strings.Contains(out.String(), k) {
			t.Errorf("$%s is not in the log:\n%s", k, out.String())
		}
	}
}

// referenceVars are every variable of the reference's settings (src/settings/settings.go),
// and Envoy Gateway's GRPC_SERVER_TLS_CA_CERT.
var referenceVars = []string{"HOST", "PORT", "DEBUG_HOST", "DEBUG_PORT", "GRPC_UDS", "GRPC_HOST", "GRPC_PORT", "GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE", "GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN", "LOG_LEVEL", "LOG_FORMAT", "CONFIG_TYPE", "FORCE_START_WITHOUT_INITIAL_CONFIG", "CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA", "CONFIG_GRPC_XDS_SERVER_URL", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "XDS_CLIENT_BACKOFF_JITTER", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "USE_DOG_STATSD", "USE_DOG_STATSD_MOGRIFIERS", "USE_STATSD", "STATSD_HOST", "STATSD_PORT", "EXTRA_TAGS", "STATS_FLUSH_INTERVAL", "DISABLE_STATS", "USE_PROMETHEUS", "PROMETHEUS_ADDR", "PROMETHEUS_PATH", "PROMETHEUS_MAPPER_YAML", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT", "EXPIRATION_JITTER_MAX_SECONDS", "LOCAL_CACHE_SIZE_IN_BYTES", "NEAR_LIMIT_RATIO", "CACHE_KEY_PREFIX", "BACKEND_TYPE", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "LIMIT_RESPONSE_HEADERS_ENABLED", "LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_URL", "REDIS_POOL_SIZE", "REDIS_AUTH", "REDIS_TLS", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_CACERT", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "REDIS_PIPELINE_WINDOW", "REDIS_PIPELINE_LIMIT", "REDIS_CLUSTER_PIPELINE_PARALLELISM", "REDIS_PERSECOND", "REDIS_PERSECOND_SOCKET_TYPE", "REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_URL", "REDIS_PERSECOND_POOL_SIZE", "REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_TLS", "REDIS_SENTINEL_AUTH", "REDIS_PERSECOND_SENTINEL_AUTH", "REDIS_PERSECOND_PIPELINE_WINDOW", "REDIS_PERSECOND_PIPELINE_LIMIT", "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "REDIS_TIMEOUT", "REDIS_PERSECOND_TIMEOUT", "REDIS_POOL_ON_EMPTY_BEHAVIOR", "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "REDIS_STARTUP_INITIAL_INTERVAL", "REDIS_STARTUP_MAX_INTERVAL", "REDIS_STARTUP_MAX_ELAPSED_TIME", "MEMCACHE_HOST_PORT", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_SRV", "MEMCACHE_SRV_REFRESH", "MEMCACHE_TLS", "MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY", "MEMCACHE_TLS_CACERT", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "SHADOW_MODE", "QUOTA_MODE", "RESPONSE_DYNAMIC_METADATA", "MERGE_DOMAIN_CONFIG", "TRACING_ENABLED", "TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE", "TRACING_SERVICE_INSTANCE_ID", "TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE", "GRPC_SERVER_TLS_CA_CERT"}

// No variable of the reference is ignored silently: each, set alone (to "true", a value of
// the wrong kind for most), sets a flag, is noted, or is refused, by its name.
func TestReferenceEnvEveryVariable(t *testing.T) {
	for _, name := range referenceVars {
		effects, err := referenceEnv(lookupIn(map[string]string{name: "true"}))
		said := err != nil && strings.Contains(err.Error(), "$"+name+"=")
		for _, e := range effects {
			said = said || strings.Contains(e.Var, name)
		}
		if !said {
			t.Errorf("$%s=true: nothing said (%+v, %v)", name, effects, err)
		}
	}
}

// envoy.md's table of the reference's environment names every variable.
func TestDocsReferenceEnv(t *testing.T) {
	md, err := os.ReadFile("../../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(md), "## The reference's environment")
	section, _, _ = strings.Cut(section, "\n## ")
	for _, name := range referenceVars {
		prefix := ""
		for _, p := range []string{"CONFIG_GRPC_XDS_", "XDS_CLIENT_", "REDIS_PERSECOND_", "MEMCACHE_", "TRACING_"} {
			if strings.HasPrefix(name, p) {
				prefix = p
			}
		}
		if !strings.Contains(section, "`"+name+"`") && (prefix == "" || !strings.Contains(section, "`"+prefix+"*`")) {
			t.Errorf("envoy.md's table lacks $%s", name)
		}
	}
	if !strings.Contains(section, "`DOG_STATSD_MOGRIFIER_*`") {
		t.Error("envoy.md's table lacks the dogstatsd mogrifiers, DOG_STATSD_MOGRIFIER_*")
	}
}

// An xDS server that holds no configuration (Envoy Gateway's, before any listener has a global
// limit) never answers. With FORCE_START_WITHOUT_INITIAL_CONFIG alone, rlfn-rls is healthy
// meanwhile, as the reference is; with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED too, or without
// either, it is not.
func TestReferenceEnvForceStart(t *testing.T) {
	url, _, _ := startStalled(t)
	xds := harness.StartXDS(t, "envoy-ratelimit", nil)
	for _, tc := range []struct {
		env  map[string]string
		want int
	}{
		{map[string]string{"FORCE_START_WITHOUT_INITIAL_CONFIG": "true"}, http.StatusOK},
		{map[string]string{"FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "false"}, http.StatusOK},
		{map[string]string{"FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true"}, http.StatusServiceUnavailable},
		{map[string]string{}, http.StatusServiceUnavailable},
	} {
		t.Run(fmt.Sprint(tc.env), func(t *testing.T) {
			ports := harness.FreePorts(t, 2)
			env := map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": xds.Addr, "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
				"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": url, // the reference takes a redis:// URL too
				"HOST": "127.0.0.1", "PORT": fmt.Sprint(ports[0]), "GRPC_HOST": "127.0.0.1", "GRPC_PORT": fmt.Sprint(ports[1])}
			for k, v := range tc.env {
				env[k] = v
			}
			for k, v := range env {
				t.Setenv(k, v)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var out harness.Buffer
			done := make(chan error, 1)
			go func() {
				done <- newApp(&out).RunContext(ctx, []string{"rlfn-rls", "--check-every", "100ms", "--deadline", "5s"})
			}()
			// Health is checked every 100ms: a second of answers is ten checks.
			var codes []int
			for deadline := time.Now().Add(20 * time.Second); len(codes) < 10; time.Sleep(100 * time.Millisecond) {
				select {
				case err := <-done:
					t.Fatalf("the app ended: %v\n%s", err, out.String())
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("health answered %v\n%s", codes, out.String())
				}
				resp, err := http.Get(fmt.Sprint("http://127.0.0.1:", ports[0], "/healthcheck"))
				if err != nil {
					continue
				}
				resp.Body.Close()
				if codes = append(codes, resp.StatusCode); resp.StatusCode == http.StatusOK && tc.want != http.StatusOK {
					t.Fatalf("healthy without a configuration\n%s", out.String())
				}
			}
			if codes[len(codes)-1] != tc.want {
				t.Fatalf("health answered %v, want %d at the end\n%s", codes, tc.want, out.String())
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("serve: %v\n%s", err, out.String())
			}
		})
	}
}

// REDIS_TYPE=cluster with several nodes in REDIS_URL starts from any of them, as the reference
// does: the first node given is down, rlfn-rls starts from the second and serves.
func TestReferenceEnvClusterSeeds(t *testing.T) {
	c := harness.StartCluster(t, 1, 0)
	vk := c.Client(t, false)
	for _, r := range vk.DoMulti(context.Background(), vk.B().FunctionLoad().Replace().FunctionCode(functions.Source).Build()) {
		if err := r.Error(); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(t.TempDir(), "config")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(fmt.Sprintf(policyConfig, "edge")), 0o644); err != nil {
		t.Fatal(err)
	}
	down := harness.FreePorts(t, 1)[0] // nothing listens there
	for k, v := range map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "cluster", "REDIS_URL": fmt.Sprintf("127.0.0.1:%d,%s", down, c.Addrs()[0]),
		"RUNTIME_ROOT": filepath.Dir(dir)} {
		t.Setenv(k, v)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := startApp(t, ctx, "--deadline", "5s")
	if resp, err := ask(ctx, a.rls, "edge"); err != nil || resp.OverallCode != pb.RateLimitResponse_OK {
		t.Fatalf("%v %v\n%s", resp, err, a.stderr.String())
	}
	cancel()
	if err := <-a.done; err != nil {
		t.Fatalf("serve: %v\n%s", err, a.stderr.String())
	}
}

// What each variable did reaches the log whatever LOG_LEVEL says (warn is the reference's
// default), and every refusal is a line of its own saying whose it is.
func TestReferenceEnvLines(t *testing.T) {
	t.Run("LOG_LEVEL=warn", func(t *testing.T) {
		for k, v := range map[string]string{"LOG_LEVEL": "warn", "DEBUG_PORT": "6070", "REDIS_POOL_SIZE": "10", "SHADOW_MODE": "true",
			"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c/tls.crt", "GRPC_SERVER_TLS_KEY": "/c/tls.key",
			"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": "127.0.0.1:28092", "HOST": "127.0.0.1", "PORT": "8080"} {
			t.Setenv(k, v)
		}
		var out bytes.Buffer
		if code := run([]string{"rlfn-rls", "--config", filepath.Join(t.TempDir(), "none")}, &out); code != 1 {
			t.Fatalf("exit %d\n%s", code, &out)
		}
		for _, want := range []string{`"var":"DEBUG_PORT=6070","effect":"none"`, `"var":"REDIS_POOL_SIZE=10","effect":"none"`, `"var":"SHADOW_MODE=true","flag":"--shadow-mode"`,
			// What it does through the certificate's flags, not "none".
			`"var":"GRPC_SERVER_USE_TLS=true","effect":"TLS on the gRPC listener"`,
			// Several variables of one flag: each with its own value.
			`"var":"USE_PROMETHEUS=true PROMETHEUS_ADDR=127.0.0.1:28092","flag":"--metrics","value":"127.0.0.1:28092"`,
			`"var":"HOST=127.0.0.1 PORT=8080","flag":"--http","value":"127.0.0.1:8080"`} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("no %s in\n%s", want, &out)
			}
		}
	})
	t.Run("refusals", func(t *testing.T) {
		for k, v := range map[string]string{"GRPC_UDS": "/tmp/s", "QUOTA_MODE": "true", "BACKEND_TYPE": "memcache"} {
			t.Setenv(k, v)
		}
		var out bytes.Buffer
		if code := run([]string{"rlfn-rls"}, &out); code != 1 {
			t.Fatalf("exit %d\n%s", code, &out)
		}
		lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
		if len(lines) != 3 {
			t.Fatalf("%d lines, want one for each of 3 refusals:\n%s", len(lines), &out)
		}
		for _, l := range lines {
			if !strings.HasPrefix(l, "rlfn-rls: $") {
				t.Errorf("line %q is not rlfn-rls's", l)
			}
		}
	})
}

// The reference's back-off reaches the xDS client as it means it: a growth factor of 1.5, and
// a first wait above the longest clamped to it rather than refused.
func TestReferenceEnvBackoff(t *testing.T) {
	for k, v := range map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "2m", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "1m", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "1.5"} {
		t.Setenv(k, v)
	}
	app := newApp(io.Discard)
	var x *rls.XDS
	app.Action = func(c *cli.Context) (err error) {
		x, err = xdsSource(c, slog.New(slog.DiscardHandler))
		return err
	}
	if err := app.Run([]string{"rlfn-rls"}); err != nil {
		t.Fatal(err)
	}
	if x.Initial != time.Minute || x.Max != time.Minute || x.Factor != 1.5 || x.RandomFactor != 0.5 {
		t.Errorf("initial %s, max %s, factor %g, random %g", x.Initial, x.Max, x.Factor, x.RandomFactor)
	}
}

// Without RUNTIME_* nor --config, the reference reads /srv/runtime_data/current/config: so does
// rlfn-rls once any of the reference's variables is given; --config, or --xds-server, given
// instead wins; with none of them, --config is required as ever.
func TestReferenceEnvConfigDir(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"CONFIG_TYPE": "FILE"}, nil, "[" + referenceConfigDir + "]"},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "127.0.0.1:6390"}, nil, "[" + referenceConfigDir + "]"},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "127.0.0.1:6390"}, []string{"--config", "/etc/rl"}, "[/etc/rl]"},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "127.0.0.1:6390"}, []string{"--xds-server", "127.0.0.1:18000"}, "[]"},
		{map[string]string{}, nil, "[]"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, nil, "[]"},
		// What platforms set (Cloud Run's PORT) and habit (LOG_LEVEL) is not the reference's
		// environment in use: a start without --config says --config is required.
		{map[string]string{"PORT": "8080", "HOST": "0.0.0.0", "LOG_LEVEL": "info", "LOG_FORMAT": "json"}, nil, "[]"},
	} {
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		app := newApp(io.Discard)
		var got []string
		var every bool
		app.Action = func(c *cli.Context) error {
			got, every = c.StringSlice("config"), c.Bool("config-every-file")
			return nil
		}
		if err := app.Run(append([]string{"rlfn-rls"}, tc.args...)); err != nil || fmt.Sprint(got) != tc.want {
			t.Errorf("%v %v: --config %v %v, want %s", tc.env, tc.args, got, err, tc.want)
		}
		// The reference's directory is read as the reference reads it; a --config given, as
		// rlfn-rls reads its own (over xDS, there is no directory to read).
		if want := tc.want == "["+referenceConfigDir+"]"; every != want && !slices.Contains(tc.args, "--xds-server") {
			t.Errorf("%v %v: --config-every-file %v, want %v", tc.env, tc.args, every, want)
		}
		for k := range tc.env {
			os.Unsetenv(k)
		}
	}
	var out bytes.Buffer
	t.Setenv("CONFIG_TYPE", "FILE")
	if code := run([]string{"rlfn-rls"}, &out); code != 1 || !strings.Contains(out.String(), referenceConfigDir) {
		t.Errorf("exit %d\n%s", code, &out)
	}
}

// referenceDefaults are the defaults of the reference's settings (src/settings/settings.go).
var referenceDefaults = map[string]string{"HOST": "0.0.0.0", "PORT": "8080", "DEBUG_HOST": "0.0.0.0", "DEBUG_PORT": "6070", "GRPC_UDS": "", "GRPC_HOST": "0.0.0.0", "GRPC_PORT": "8081", "GRPC_MAX_CONNECTION_AGE": "24h", "GRPC_MAX_CONNECTION_AGE_GRACE": "1h", "GRPC_SERVER_USE_TLS": "false", "GRPC_SERVER_TLS_CERT": "", "GRPC_SERVER_TLS_KEY": "", "GRPC_CLIENT_TLS_CACERT": "", "GRPC_CLIENT_TLS_SAN": "", "LOG_LEVEL": "WARN", "LOG_FORMAT": "text", "CONFIG_TYPE": "FILE", "FORCE_START_WITHOUT_INITIAL_CONFIG": "false", "CONFIG_GRPC_XDS_NODE_ID": "default", "CONFIG_GRPC_XDS_NODE_METADATA": "", "CONFIG_GRPC_XDS_SERVER_URL": "localhost:18000", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "3s", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "false", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "", "CONFIG_GRPC_XDS_SERVER_TLS_SAN": "", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "10s", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "60s", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "0.5", "XDS_CLIENT_BACKOFF_JITTER": "true", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "", "USE_DOG_STATSD": "false", "USE_DOG_STATSD_MOGRIFIERS": "", "USE_STATSD": "true", "STATSD_HOST": "localhost", "STATSD_PORT": "8125", "EXTRA_TAGS": "", "STATS_FLUSH_INTERVAL": "10s", "DISABLE_STATS": "false", "USE_PROMETHEUS": "false", "PROMETHEUS_ADDR": ":9090", "PROMETHEUS_PATH": "/metrics", "PROMETHEUS_MAPPER_YAML": "", "RUNTIME_ROOT": "/srv/runtime_data/current", "RUNTIME_SUBDIRECTORY": "", "RUNTIME_APPDIRECTORY": "config", "RUNTIME_IGNOREDOTFILES": "false", "RUNTIME_WATCH_ROOT": "true", "EXPIRATION_JITTER_MAX_SECONDS": "300", "LOCAL_CACHE_SIZE_IN_BYTES": "0", "NEAR_LIMIT_RATIO": "0.8", "CACHE_KEY_PREFIX": "", "BACKEND_TYPE": "redis", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "false", "LIMIT_RESPONSE_HEADERS_ENABLED": "false", "LIMIT_LIMIT_HEADER": "RateLimit-Limit", "LIMIT_REMAINING_HEADER": "RateLimit-Remaining", "LIMIT_RESET_HEADER": "RateLimit-Reset", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "false", "REDIS_SOCKET_TYPE": "unix", "REDIS_TYPE": "SINGLE", "REDIS_URL": "/var/run/nutcracker/ratelimit.sock", "REDIS_POOL_SIZE": "10", "REDIS_AUTH": "", "REDIS_TLS": "false", "REDIS_TLS_CLIENT_CERT": "", "REDIS_TLS_CLIENT_KEY": "", "REDIS_TLS_CACERT": "", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "false", "REDIS_PIPELINE_WINDOW": "0", "REDIS_PIPELINE_LIMIT": "0", "REDIS_PERSECOND": "false", "REDIS_PERSECOND_SOCKET_TYPE": "unix", "REDIS_PERSECOND_TYPE": "SINGLE", "REDIS_PERSECOND_URL": "/var/run/nutcracker/ratelimitpersecond.sock", "REDIS_PERSECOND_POOL_SIZE": "10", "REDIS_PERSECOND_AUTH": "", "REDIS_PERSECOND_TLS": "false", "REDIS_SENTINEL_AUTH": "", "REDIS_PERSECOND_SENTINEL_AUTH": "", "REDIS_PERSECOND_PIPELINE_WINDOW": "0", "REDIS_PERSECOND_PIPELINE_LIMIT": "0", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "false", "REDIS_TIMEOUT": "10s", "REDIS_PERSECOND_TIMEOUT": "10s", "REDIS_POOL_ON_EMPTY_BEHAVIOR": "WAIT", "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR": "WAIT", "MEMCACHE_HOST_PORT": "", "MEMCACHE_MAX_IDLE_CONNS": "2", "MEMCACHE_SRV": "", "MEMCACHE_SRV_REFRESH": "0", "MEMCACHE_TLS": "false", "MEMCACHE_TLS_CLIENT_CERT": "", "MEMCACHE_TLS_CLIENT_KEY": "", "MEMCACHE_TLS_CACERT": "", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION": "false", "SHADOW_MODE": "false", "QUOTA_MODE": "false", "RESPONSE_DYNAMIC_METADATA": "false", "MERGE_DOMAIN_CONFIG": "false", "TRACING_ENABLED": "false", "TRACING_SERVICE_NAME": "RateLimit", "TRACING_SERVICE_NAMESPACE": "", "TRACING_SERVICE_INSTANCE_ID": "", "TRACING_EXPORTER_PROTOCOL": "http", "TRACING_SAMPLING_RATE": "1"}

// A variable set to the reference's default (or empty) is said too, not skipped as changing
// nothing: alone, and beside CONFIG_TYPE=GRPC_XDS_SOTW, where the xDS variables are read. The
// reference's dogstatsd mogrifiers, read by their prefix, are said as well.
func TestReferenceEnvDefaults(t *testing.T) {
	for _, name := range referenceVars {
		for _, env := range []map[string]string{{name: referenceDefaults[name]}, {"CONFIG_TYPE": "GRPC_XDS_SOTW", name: referenceDefaults[name]}} {
			effects, err := referenceEnv(lookupIn(env))
			said := err != nil && strings.Contains(err.Error(), "$"+name+"=")
			for _, e := range effects {
				said = said || slices.Contains(varNames(e.Var), name)
			}
			if !said {
				t.Errorf("%v: nothing said of $%s (%+v, %v)", env, name, effects, err)
			}
		}
	}
	env := map[string]string{"USE_DOG_STATSD": "true", "USE_DOG_STATSD_MOGRIFIERS": "TAG", "DOG_STATSD_MOGRIFIER_TAG_PATTERN": "^ratelimit\\.(.*)$"}
	effects, err := referenceEnv(lookupIn(env), slices.Collect(maps.Keys(env))...)
	var vars []string
	for _, e := range effects {
		vars = append(vars, e.Var)
	}
	if err != nil || !slices.Contains(vars, "DOG_STATSD_MOGRIFIER_TAG_PATTERN=^ratelimit\\.(.*)$") {
		t.Errorf("the mogrifier is not said: %v %v", vars, err)
	}
}
