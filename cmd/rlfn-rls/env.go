package main

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rlfn/rlfn/internal/serverurl"
)

// envEffect is what one of the reference's environment variables does to rlfn-rls: set a
// flag, or nothing, for a reason said in the log.
type envEffect struct {
	Var    string // the reference's variable, as set (NAME=value; several separated by spaces)
	Flag   string // the flag it sets; "" for none
	Value  string // the flag's value
	Note   string // why it sets none, or how it was read
	Unless string // a flag that, given, leaves Flag unset too
	Effect string // with no Flag, what it does through flags set by others; "" for nothing
}

// referenceEnv reads envoyproxy/ratelimit's environment (settings.go), so that rlfn-rls
// started where the reference was, with its Deployment's variables (Envoy Gateway's,
// WSO2 APK's), serves the same. Every variable of the reference that is set either maps to
// a flag, has no effect for a reason (said in the log at start), or is refused: one error
// line each, naming the variable and why; one set to its default value too. Variables not
// set are mostly not looked at: the reference's defaults are rlfn-rls's own flags' (its
// ports, no headers, no shadow mode), or need a variable to mean anything (REDIS_URL's
// default is a Unix socket). The exceptions: its default configuration directory, read when
// any of its variables is set and none names one; and over xDS its back-off's growth, whose
// default (a factor of 0.5: 10s every time) is not rlfn-rls's (10s doubling to 60s).
//
// names are the variables set (os.Environ's), for those the reference reads by a prefix.
func referenceEnv(lookup func(string) (string, bool), names ...string) ([]envEffect, error) {
	r := envReader{lookup: lookup, names: names, set: map[string]string{}}
	r.listeners()
	r.config()
	r.redis()
	r.behaviour()
	r.stats()
	r.types()
	r.unsaid()
	if r.defaultDir && r.used {
		// The reference's environment is in use, and names no directory: the reference
		// reads its default one. A start with none of its variables stays rlfn-rls's own
		// (--config is required).
		// The way of reading first: applied before --config is, it is left out for a
		// --config given, which is read as rlfn-rls reads it.
		r.effects = append(r.effects, envEffect{Var: "RUNTIME_ROOT and RUNTIME_APPDIRECTORY unset", Flag: "config-every-file", Value: "true",
			Note: "every file of the directory, as the reference reads it", Unless: "config"},
			envEffect{Var: "RUNTIME_ROOT and RUNTIME_APPDIRECTORY unset", Flag: "config", Value: referenceConfigDir,
				Note: "the reference's default directory", Unless: "xds-server"})
	}
	return r.effects, errors.Join(r.errs...)
}

// genericVars are variables of the reference that other programs' environments set too.
var genericVars = map[string]bool{"PORT": true, "HOST": true, "LOG_LEVEL": true, "LOG_FORMAT": true}

// referenceConfigDir is where the reference reads its configuration without RUNTIME_*: its
// RUNTIME_ROOT and RUNTIME_APPDIRECTORY defaults.
const referenceConfigDir = "/srv/runtime_data/current/config"

type envReader struct {
	lookup     func(string) (string, bool)
	names      []string
	effects    []envEffect
	errs       []error
	refused    map[string]bool
	set        map[string]string // every variable looked at that is set
	used       bool              // some variable looked at is set
	defaultDir bool              // the configuration is files, and no RUNTIME_* names their directory
}

func (r *envReader) get(name string) (string, bool) {
	v, ok := r.lookup(name)
	if ok {
		// OTEL_* are OpenTelemetry's, set in a pod by others (an operator's injection), and
		// PORT, HOST, LOG_LEVEL and LOG_FORMAT are set by platforms (Cloud Run, Knative,
		// Heroku give PORT) and by habit: none says the reference's environment is in use.
		r.used = r.used || !strings.HasPrefix(name, "OTEL_") && !genericVars[name]
		r.set[name] = v
	}
	return v, ok
}

// unsaid gives a line to each variable set that has none yet: one set to what changes nothing
// (the reference's default, which is rlfn-rls's, or empty), which is said too.
func (r *envReader) unsaid() {
	said := map[string]bool{}
	for _, e := range r.effects {
		for _, n := range varNames(e.Var) {
			said[n] = true
		}
	}
	for _, n := range slices.Sorted(maps.Keys(r.set)) {
		if !said[n] && !r.refused[n] {
			r.note(n, r.set[n], "nothing to change at this value: as rlfn-rls does")
		}
	}
}

// referenceTypes are the kinds of the reference's variables that are not strings, as its
// settings.go declares them ([]string ones take any value).
var referenceTypes = map[string]string{
	"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "map", "EXTRA_TAGS": "map",
	"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "duration", "GRPC_MAX_CONNECTION_AGE": "duration", "GRPC_MAX_CONNECTION_AGE_GRACE": "duration",
	"MEMCACHE_SRV_REFRESH": "duration", "REDIS_PERSECOND_PIPELINE_WINDOW": "duration", "REDIS_PERSECOND_TIMEOUT": "duration", "REDIS_PIPELINE_WINDOW": "duration",
	"REDIS_STARTUP_INITIAL_INTERVAL": "duration", "REDIS_STARTUP_MAX_ELAPSED_TIME": "duration", "REDIS_STARTUP_MAX_INTERVAL": "duration", "REDIS_TIMEOUT": "duration",
	"STATS_FLUSH_INTERVAL": "duration", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "duration", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "duration",
	"DEBUG_PORT": "int", "EXPIRATION_JITTER_MAX_SECONDS": "int", "GRPC_PORT": "int", "LOCAL_CACHE_SIZE_IN_BYTES": "int", "MEMCACHE_MAX_IDLE_CONNS": "int",
	"PORT": "int", "REDIS_CLUSTER_PIPELINE_PARALLELISM": "int", "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM": "int", "REDIS_PERSECOND_PIPELINE_LIMIT": "int",
	"REDIS_PERSECOND_POOL_SIZE": "int", "REDIS_PIPELINE_LIMIT": "int", "REDIS_POOL_SIZE": "int", "STATSD_PORT": "int", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "int",
	"NEAR_LIMIT_RATIO": "float32", "TRACING_SAMPLING_RATE": "float64", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "float64",
	"CONFIG_GRPC_XDS_SERVER_USE_TLS": "bool", "DISABLE_STATS": "bool", "FORCE_START_WITHOUT_INITIAL_CONFIG": "bool", "GRPC_SERVER_USE_TLS": "bool",
	"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "bool", "LIMIT_RESPONSE_HEADERS_ENABLED": "bool", "MEMCACHE_TLS": "bool", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION": "bool",
	"MERGE_DOMAIN_CONFIG": "bool", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": "bool", "QUOTA_MODE": "bool", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "bool",
	"REDIS_PERSECOND": "bool", "REDIS_PERSECOND_TLS": "bool", "REDIS_TLS": "bool", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "bool", "RESPONSE_DYNAMIC_METADATA": "bool",
	"RUNTIME_IGNOREDOTFILES": "bool", "RUNTIME_WATCH_ROOT": "bool", "SHADOW_MODE": "bool", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "bool", "TRACING_ENABLED": "bool",
	"USE_DOG_STATSD": "bool", "USE_PROMETHEUS": "bool", "USE_STATSD": "bool", "XDS_CLIENT_BACKOFF_JITTER": "bool",
}

// types refuses a variable set to a value of the wrong kind, as the reference's envconfig
// does at start, even where the variable has no effect here (USE_STATSD=maybe,
// STATSD_PORT=abc): the Deployment is wrong, and would not start the reference either. A
// variable refused already keeps its own reason.
func (r *envReader) types() {
	for _, name := range slices.Sorted(maps.Keys(referenceTypes)) {
		v, ok := r.lookup(name)
		if !ok || r.refused[name] {
			continue
		}
		var err error
		why := ""
		switch referenceTypes[name] {
		case "bool":
			_, err = strconv.ParseBool(v)
			why = "not true or false"
		case "int":
			_, err = strconv.ParseInt(v, 0, 64)
			why = "not a whole number"
		case "float32":
			_, err = strconv.ParseFloat(v, 32)
			why = "not a number"
		case "float64":
			_, err = strconv.ParseFloat(v, 64)
			why = "not a number"
		case "duration":
			_, err = time.ParseDuration(v)
			why = "not a duration with its unit (e.g. 10s)"
		case "map":
			if strings.TrimSpace(v) != "" {
				for _, kv := range strings.Split(v, ",") {
					if strings.Count(kv, ":") != 1 {
						err = errors.New("not key:value")
					}
				}
			}
			why = "not key:value pairs separated by commas"
		}
		if err != nil {
			r.refuse(name, v, why)
		}
	}
}

// vars names several variables in one effect: each set one with its value (NAME=value, a
// secret hidden), separated by spaces.
func (r *envReader) vars(names ...string) string {
	var parts []string
	for _, n := range names {
		if v, ok := r.lookup(n); ok {
			parts = append(parts, n+"="+shown(n, v))
		}
	}
	return strings.Join(parts, " ")
}

// varNames are the variables an effect's Var names.
func varNames(v string) []string {
	var names []string
	for _, f := range strings.Fields(v) {
		if n, _, ok := strings.Cut(f, "="); ok {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		names = append(names, v)
	}
	return names
}

// bool reads a boolean variable as the reference does (strconv.ParseBool); a bad value is
// refused, an unset one is def.
func (r *envReader) bool(name string, def bool) bool {
	v, ok := r.get(name)
	if !ok {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.refuse(name, v, "not true or false")
		return def
	}
	return b
}

// secrets are the variables whose values are never logged nor said in an error.
var secrets = map[string]bool{"REDIS_AUTH": true, "REDIS_SENTINEL_AUTH": true, "REDIS_PERSECOND_AUTH": true,
	"REDIS_PERSECOND_SENTINEL_AUTH": true, "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": true}

func shown(name, v string) string {
	if secrets[name] {
		return "xxxxx"
	}
	if name == "REDIS_URL" || name == "REDIS_PERSECOND_URL" {
		return redactRedisURL(v)
	}
	return v
}

// redactRedisURL is REDIS_URL with each node's password hidden: a redis:// node may hold one,
// in its user information or its query.
func redactRedisURL(v string) string {
	parts := strings.Split(v, ",")
	for i, p := range parts {
		if !strings.Contains(p, "://") && !strings.Contains(p, "@") {
			continue
		}
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil || u.Fragment != "" || (u.User == nil && strings.Contains(p, "@")) {
			parts[i] = "xxxxx" // a password that does not parse may be anywhere in it
			continue
		}
		if q := u.Query(); q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		parts[i] = u.Redacted()
	}
	return strings.Join(parts, ",")
}

func (r *envReader) flag(name, v, flag, value string) {
	r.effects = append(r.effects, envEffect{Var: name + "=" + v, Flag: flag, Value: value})
}

func (r *envReader) note(name, v, why string) {
	r.effects = append(r.effects, envEffect{Var: name + "=" + shown(name, v), Note: why})
}

func (r *envReader) refuse(name, v, why string) {
	r.errs = append(r.errs, fmt.Errorf("$%s=%q: %s", name, shown(name, v), why))
	if r.refused == nil {
		r.refused = map[string]bool{}
	}
	r.refused[name] = true
}

// noted gives each of names that is set the note why.
func (r *envReader) noted(why string, names ...string) {
	for _, n := range names {
		if v, ok := r.get(n); ok {
			r.note(n, v, why)
		}
	}
}

// refusedUnless refuses each of names set to anything but one of ok (compared without case).
func (r *envReader) refusedUnless(why string, ok []string, names ...string) {
	for _, n := range names {
		v, set := r.get(n)
		if !set {
			continue
		}
		good := false
		for _, o := range ok {
			good = good || strings.EqualFold(v, o)
		}
		if good {
			r.note(n, v, "as rlfn-rls does")
		} else {
			r.refuse(n, v, why)
		}
	}
}

// address joins a host and port variable pair into a listener's address.
func (r *envReader) address(hostVar, portVar, flag string) {
	host, hostSet := r.get(hostVar)
	port, portSet := r.get(portVar)
	if !hostSet && !portSet {
		return
	}
	if !hostSet {
		host = "0.0.0.0"
	}
	if !portSet {
		port = map[string]string{"PORT": "8080", "GRPC_PORT": "8081"}[portVar]
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		r.refuse(portVar, port, "not a port number")
		return
	}
	r.effects = append(r.effects, envEffect{Var: r.vars(hostVar, portVar), Flag: flag, Value: net.JoinHostPort(host, port)})
}

func (r *envReader) listeners() {
	r.address("HOST", "PORT", "http")
	r.address("GRPC_HOST", "GRPC_PORT", "grpc")
	if v, ok := r.get("GRPC_UDS"); ok && v != "" {
		r.refuse("GRPC_UDS", v, "rlfn-rls does not listen on a Unix socket: use GRPC_HOST and GRPC_PORT")
	}
	r.noted("rlfn-rls has no debug listener: /metrics and /healthcheck are on HOST:PORT", "DEBUG_HOST", "DEBUG_PORT")
	if v, ok := r.get("GRPC_MAX_CONNECTION_AGE"); ok {
		if d, err := time.ParseDuration(v); err != nil || d <= 0 {
			r.refuse("GRPC_MAX_CONNECTION_AGE", v, "not a positive duration")
		} else {
			r.flag("GRPC_MAX_CONNECTION_AGE", v, "max-connection-age", v)
		}
	}
	if v, ok := r.get("GRPC_MAX_CONNECTION_AGE_GRACE"); ok {
		if d, err := time.ParseDuration(v); err != nil || d != time.Hour {
			r.refuse("GRPC_MAX_CONNECTION_AGE_GRACE", v, "rlfn-rls's grace is the reference's default, 1h, and no other")
		} else {
			r.note("GRPC_MAX_CONNECTION_AGE_GRACE", v, "as rlfn-rls does")
		}
	}
	tlsVars := []string{"GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN"}
	if r.bool("GRPC_SERVER_USE_TLS", false) {
		for v, flag := range map[string]string{"GRPC_SERVER_TLS_CERT": "grpc-tls-cert", "GRPC_SERVER_TLS_KEY": "grpc-tls-key",
			"GRPC_CLIENT_TLS_CACERT": "grpc-tls-client-ca", "GRPC_CLIENT_TLS_SAN": "grpc-tls-client-san"} {
			if value, ok := r.get(v); ok && value != "" {
				r.flag(v, value, flag, value)
			}
		}
		cert, _ := r.get("GRPC_SERVER_TLS_CERT")
		key, _ := r.get("GRPC_SERVER_TLS_KEY")
		if cert == "" || key == "" {
			r.refuse("GRPC_SERVER_USE_TLS", "true", "needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
		} else {
			r.effects = append(r.effects, envEffect{Var: "GRPC_SERVER_USE_TLS=true", Effect: "TLS on the gRPC listener",
				Note: "with GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY (re-read when they change)"})
		}
	} else {
		r.noted("without GRPC_SERVER_USE_TLS, unused (as by the reference)", tlsVars...)
	}
	// Envoy Gateway sets it beside the others; the reference reads no such variable.
	r.noted("not a variable of the reference (its client CA is GRPC_CLIENT_TLS_CACERT): unused, as by the reference", "GRPC_SERVER_TLS_CA_CERT")
	if v, ok := r.get("LOG_LEVEL"); ok {
		// logrus's levels, as the reference takes them, to slog's.
		level, known := map[string]string{"trace": "debug", "debug": "debug", "info": "info", "warn": "warn", "warning": "warn", "error": "error", "fatal": "error", "panic": "error"}[strings.ToLower(v)]
		if !known {
			r.refuse("LOG_LEVEL", v, "not one of trace, debug, info, warn, error, fatal, panic")
		} else {
			r.flag("LOG_LEVEL", v, "log-level", level)
		}
	}
	if v, ok := r.get("LOG_FORMAT"); ok {
		// The reference logs JSON for json, and logrus's text for any other value.
		if strings.EqualFold(v, "json") {
			r.note("LOG_FORMAT", v, "rlfn-rls logs JSON lines, with slog's keys (time, level, msg), not the reference's @timestamp and @message")
		} else {
			r.note("LOG_FORMAT", v, "rlfn-rls logs JSON lines only, where the reference logs logrus's text lines")
		}
	}
	r.tracing() // tracing.go
}

func (r *envReader) config() {
	typ, _ := r.get("CONFIG_TYPE")
	xdsVars := []string{"CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA", "CONFIG_GRPC_XDS_SERVER_URL",
		"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "CONFIG_GRPC_XDS_SERVER_USE_TLS",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "XDS_CLIENT_BACKOFF_JITTER",
		"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "FORCE_START_WITHOUT_INITIAL_CONFIG", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"}
	runtimeVars := []string{"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT"}
	switch strings.ToUpper(typ) {
	case "", "FILE":
		if typ != "" {
			r.note("CONFIG_TYPE", typ, "configuration files, read as --config reads them")
		}
		r.noted("unused with CONFIG_TYPE FILE (as by the reference)", xdsVars...)
		r.files()
	case "GRPC_XDS_SOTW":
		r.noted("unused with CONFIG_TYPE GRPC_XDS_SOTW (as by the reference)", runtimeVars...)
		r.xds()
	default:
		r.refuse("CONFIG_TYPE", typ, "not FILE or GRPC_XDS_SOTW")
	}
	if r.bool("MERGE_DOMAIN_CONFIG", false) {
		r.flag("MERGE_DOMAIN_CONFIG", "true", "merge-domains", "true")
	}
}

func (r *envReader) xds() {
	server, ok := r.get("CONFIG_GRPC_XDS_SERVER_URL")
	if !ok {
		server = "localhost:18000" // the reference's default
	}
	r.effects = append(r.effects, envEffect{Var: r.vars("CONFIG_TYPE", "CONFIG_GRPC_XDS_SERVER_URL"), Flag: "xds-server", Value: server})
	for v, flag := range map[string]string{"CONFIG_GRPC_XDS_NODE_ID": "xds-node", "CONFIG_GRPC_XDS_NODE_METADATA": "xds-node-metadata",
		"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "xds-headers", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "xds-max-message"} {
		if value, ok := r.get(v); ok && value != "" {
			r.effects = append(r.effects, envEffect{Var: v + "=" + shown(v, value), Flag: flag, Value: value})
		}
	}
	r.backoff()
	tlsVars := map[string]string{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "xds-tls-cert", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "xds-tls-key",
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "xds-tls-ca", "CONFIG_GRPC_XDS_SERVER_TLS_SAN": "xds-tls-server-name"}
	if r.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS", false) {
		r.flag("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true", "xds-tls", "true")
		for v, flag := range tlsVars {
			if value, ok := r.get(v); ok && value != "" {
				r.flag(v, value, flag, value)
			}
		}
	} else {
		for v := range tlsVars {
			r.noted("unused without CONFIG_GRPC_XDS_SERVER_USE_TLS (as by the reference)", v)
		}
	}
	r.noted("unused: reconnections wait as XDS_CLIENT_BACKOFF_* say, as the reference's", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL")
	r.health()
}

// backoff maps the reference's waits between reconnections to the xDS server: jpillora/backoff's
// Min, Max, Factor (XDS_CLIENT_BACKOFF_RANDOM_FACTOR, the growth of each wait despite its name:
// at or below 1 every wait is Min, as with the reference's default 0.5) and Jitter, with its
// defaults for a zero or negative Min (100ms), Max (10s) or Factor (2), and Max for every wait
// when Min is above it.
func (r *envReader) backoff() {
	const initialVar, maxVar, factorVar, jitterVar = "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "XDS_CLIENT_BACKOFF_JITTER"
	duration := func(name string, def, zero time.Duration) (time.Duration, string, bool) {
		v, ok := r.get(name)
		if !ok {
			return def, "", false
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			r.refuse(name, v, "not a duration")
			return def, v, false
		}
		if d <= 0 {
			d = zero
		}
		return d, v, true
	}
	// rlfn-rls's defaults are the reference's for these two.
	initial, iv, initialSet := duration(initialVar, 10*time.Second, 100*time.Millisecond)
	maxWait, mv, maxSet := duration(maxVar, 60*time.Second, 10*time.Second)
	if maxSet {
		r.flag(maxVar, mv, "xds-backoff-max", maxWait.String())
	}
	switch {
	case initial > maxWait:
		r.effects = append(r.effects, envEffect{Var: r.vars(initialVar, maxVar), Flag: "xds-backoff-initial", Value: maxWait.String(),
			Note: "above the longest wait: every wait is the longest, as the reference's"})
	case initialSet:
		r.flag(initialVar, iv, "xds-backoff-initial", initial.String())
	}
	if v, ok := r.get(factorVar); ok {
		f, err := strconv.ParseFloat(v, 64)
		switch {
		case err != nil:
			r.refuse(factorVar, v, "not a number")
		case f <= 0:
			r.effects = append(r.effects, envEffect{Var: factorVar + "=" + v, Flag: "xds-backoff-factor", Value: "2", Note: "the growth of each wait; 0 or less is jpillora/backoff's default, 2"})
		case f <= 1:
			r.effects = append(r.effects, envEffect{Var: factorVar + "=" + v, Flag: "xds-backoff-factor", Value: "1", Note: "the growth of each wait; at or below 1 every wait is XDS_CLIENT_BACKOFF_INITIAL_INTERVAL, as the reference's"})
		default:
			r.effects = append(r.effects, envEffect{Var: factorVar + "=" + v, Flag: "xds-backoff-factor", Value: v, Note: "the growth of each wait, as the reference's"})
		}
	} else {
		// The reference's default, 0.5: it tries again every XDS_CLIENT_BACKOFF_INITIAL_INTERVAL
		// (10s) while its control plane is away, where rlfn-rls's own would wait up to 60s.
		r.effects = append(r.effects, envEffect{Var: factorVar + " unset", Flag: "xds-backoff-factor", Value: "1", Note: "the reference's default, 0.5: every wait is XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"})
	}
	if v, ok := r.get(jitterVar); ok {
		if r.bool(jitterVar, true) {
			r.note(jitterVar, v, "each wait is randomised by ±--xds-backoff-random (0.5) where the reference draws it between the initial wait and the grown one")
		} else {
			r.flag(jitterVar, v, "xds-backoff-random", "0")
		}
	}
}

// health maps the reference's start without a configuration. The reference with
// FORCE_START_WITHOUT_INITIAL_CONFIG serves at once, healthy unless
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, and answers a request before the first
// configuration with the error "no rate limit configuration loaded"; without it, it does not
// listen until the first configuration arrives.
func (r *envReader) health() {
	const force, healthy = "FORCE_START_WITHOUT_INITIAL_CONFIG", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"
	forced := r.bool(force, false)
	needsOne := r.bool(healthy, false)
	fv, _ := r.get(force)
	hv, healthySet := r.get(healthy)
	switch {
	case forced && !needsOne:
		r.flag(force, fv, "healthy-without-config", "true")
		if healthySet {
			r.note(healthy, hv, "healthy before the first configuration (--healthy-without-config), as the reference")
		}
	case forced:
		r.note(force, fv, "with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, NOT_SERVING until the first configuration arrives, as rlfn-rls does by default")
		r.note(healthy, hv, "NOT_SERVING until the first configuration arrives, as rlfn-rls does by default")
	default:
		if v, ok := r.get(force); ok {
			r.note(force, v, "rlfn-rls listens at once, NOT_SERVING until the first configuration arrives (the reference does not listen until then)")
		}
		if healthySet {
			r.note(healthy, hv, "NOT_SERVING until the first configuration arrives, as rlfn-rls does by default")
		}
	}
}

func (r *envReader) files() {
	// The reference reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
	root, rootSet := r.get("RUNTIME_ROOT")
	sub, subSet := r.get("RUNTIME_SUBDIRECTORY")
	app, appSet := r.get("RUNTIME_APPDIRECTORY")
	if rootSet || subSet || appSet {
		if !rootSet {
			root = "/srv/runtime_data/current"
		}
		if !appSet {
			app = "config"
		}
		dir := filepath.Join(root, sub, app)
		vars := r.vars("RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY")
		r.effects = append(r.effects, envEffect{Var: vars, Flag: "config-every-file", Value: "true", Note: "every file of the directory, as the reference reads it", Unless: "config"},
			envEffect{Var: vars, Flag: "config", Value: dir})
	} else {
		r.defaultDir = true
	}
	r.noted("rlfn-rls never reads dot files, and watches the directory it reads (a ConfigMap's ..data swap included)", "RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT")
}

func (r *envReader) redis() {
	r.refusedUnless("rlfn-rls decides in Valkey or Redis only", []string{"redis"}, "BACKEND_TYPE")
	for _, n := range []string{"MEMCACHE_HOST_PORT", "MEMCACHE_SRV"} {
		if v, ok := r.get(n); ok && v != "" {
			r.refuse(n, v, "rlfn-rls decides in Valkey or Redis only, not memcached")
		}
	}
	r.noted("unused without memcached", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_SRV_REFRESH", "MEMCACHE_TLS", "MEMCACHE_TLS_CLIENT_CERT",
		"MEMCACHE_TLS_CLIENT_KEY", "MEMCACHE_TLS_CACERT", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION")
	if r.bool("REDIS_PERSECOND", false) {
		r.refuse("REDIS_PERSECOND", "true", "rlfn-rls keeps every limit in one Valkey or Redis (a cluster spreads them)")
	} else {
		r.noted("unused without REDIS_PERSECOND (as by the reference)", "REDIS_PERSECOND_SOCKET_TYPE", "REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_URL",
			"REDIS_PERSECOND_POOL_SIZE", "REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_TLS", "REDIS_PERSECOND_SENTINEL_AUTH", "REDIS_PERSECOND_PIPELINE_WINDOW",
			"REDIS_PERSECOND_PIPELINE_LIMIT", "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "REDIS_PERSECOND_TIMEOUT", "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR")
	}
	r.noted("valkey-go pipelines every call on one connection per node, automatically", "REDIS_POOL_SIZE", "REDIS_PIPELINE_WINDOW",
		"REDIS_PIPELINE_LIMIT", "REDIS_CLUSTER_PIPELINE_PARALLELISM", "REDIS_POOL_ON_EMPTY_BEHAVIOR")
	r.noted("each call is bounded by --deadline (100ms by default)", "REDIS_TIMEOUT")
	r.noted("health checks every primary's library every --check-every", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")
	r.noted("rlfn-rls connects once at start and exits 1 when it cannot (Kubernetes restarts it)", "REDIS_STARTUP_INITIAL_INTERVAL", "REDIS_STARTUP_MAX_INTERVAL", "REDIS_STARTUP_MAX_ELAPSED_TIME")
	if r.bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false) {
		r.refuse("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true", "rlfn-rls always verifies the server's name: give its CA in REDIS_TLS_CACERT")
	}

	addrs, set := r.get("REDIS_URL")
	if !set {
		r.noted("unused without REDIS_URL", "REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_AUTH", "REDIS_SENTINEL_AUTH", "REDIS_TLS", "REDIS_TLS_CACERT", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY")
		return
	}
	socket, set := r.get("REDIS_SOCKET_TYPE")
	if !set {
		socket = "unix" // the reference's default
	}
	if !strings.EqualFold(socket, "tcp") {
		r.refuse("REDIS_URL", addrs, "REDIS_SOCKET_TYPE is "+socket+": rlfn-rls reaches Valkey or Redis over TCP only (set REDIS_SOCKET_TYPE=tcp and REDIS_URL=host:port)")
		return
	}
	typ, _ := r.get("REDIS_TYPE")
	parts := strings.Split(addrs, ",")
	sentinel := false
	switch strings.ToUpper(typ) {
	case "", "SINGLE":
		if len(parts) > 1 {
			r.refuse("REDIS_URL", addrs, "REDIS_TYPE single takes one host:port")
			return
		}
	case "CLUSTER":
		// Every node given is a seed: valkey-go starts from the first that answers, and
		// finds the whole cluster from it.
	case "SENTINEL":
		// The reference's form: the set's name, then the Sentinels.
		if len(parts) < 2 {
			r.refuse("REDIS_URL", addrs, "REDIS_TYPE sentinel takes the set's name then the Sentinels: mymaster,host:port,...")
			return
		}
		sentinel = true
	default:
		r.refuse("REDIS_TYPE", typ, "not single, sentinel or cluster")
		return
	}
	var masterSet string
	if sentinel {
		masterSet, parts = strings.TrimSpace(parts[0]), parts[1:]
	} else {
		r.noted("unused without REDIS_TYPE sentinel", "REDIS_SENTINEL_AUTH")
	}
	nodes := make([]redisNode, len(parts))
	for i, p := range parts {
		n, why := parseRedisNode(strings.TrimSpace(p))
		if why != "" {
			r.refuse("REDIS_URL", addrs, why)
			return
		}
		nodes[i] = n
	}
	// radix dials each node of REDIS_URL with its own URL's user, password and database;
	// valkey-go takes one of each for all.
	first := nodes[0]
	for _, n := range nodes[1:] {
		if n.user != first.user || n.pass != first.pass || n.db != first.db {
			r.refuse("REDIS_URL", addrs, "its nodes give different users, passwords or databases: rlfn-rls takes one for all")
			return
		}
	}
	var ignored []string
	for _, n := range nodes {
		for _, k := range n.ignored {
			if !slices.Contains(ignored, k) {
				ignored = append(ignored, k)
			}
		}
	}
	if len(ignored) > 0 {
		r.note("REDIS_URL", addrs, "its parameters "+strings.Join(ignored, ", ")+" are not the reference's (radix reads username, password and db): unused, as by the reference")
	}
	if first.db != "" && first.db != "0" {
		switch {
		case sentinel:
			r.refuse("REDIS_URL", addrs, "a Sentinel's URL takes no database (the reference would SELECT it on the Sentinel)")
			return
		case strings.EqualFold(typ, "cluster"):
			r.refuse("REDIS_URL", addrs, "a cluster has database 0 only")
			return
		}
	}
	// REDIS_AUTH's user and password win over the URL's, each, as radix's dialer does with
	// its own; a Sentinel's URL gives the Sentinels' (REDIS_SENTINEL_AUTH's win over them),
	// the primary is reached with REDIS_AUTH alone.
	user, pass := splitAuth(r.get("REDIS_AUTH"))
	sentinelUser, sentinelPass := splitAuth(r.get("REDIS_SENTINEL_AUTH"))
	if sentinel {
		sentinelUser, sentinelPass = cmp.Or(sentinelUser, first.user), cmp.Or(sentinelPass, first.pass)
	} else {
		user, pass = cmp.Or(user, first.user), cmp.Or(pass, first.pass)
	}
	u := url.URL{Scheme: "redis", Host: first.host}
	if r.bool("REDIS_TLS", false) {
		u.Scheme = "rediss"
		for v, flag := range map[string]string{"REDIS_TLS_CACERT": "tls-ca", "REDIS_TLS_CLIENT_CERT": "tls-cert", "REDIS_TLS_CLIENT_KEY": "tls-key"} {
			if value, ok := r.get(v); ok && value != "" {
				r.flag(v, value, flag, value)
			}
		}
	} else {
		r.noted("unused without REDIS_TLS (as by the reference)", "REDIS_TLS_CACERT", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY")
	}
	if user != "" || pass != "" {
		u.User = url.UserPassword(user, pass)
	}
	if first.db != "" && first.db != "0" {
		u.Path = "/" + first.db
	}
	q := url.Values{}
	if sentinel {
		q.Set("master_set", masterSet)
		if sentinelUser != "" {
			q.Set("sentinel_user", sentinelUser)
		}
		if sentinelPass != "" {
			q.Set("sentinel_password", sentinelPass)
		}
	}
	for _, n := range nodes[1:] {
		q.Add("addr", n.host)
	}
	u.RawQuery = q.Encode()
	r.effects = append(r.effects, envEffect{Var: r.vars("REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_URL", "REDIS_AUTH", "REDIS_SENTINEL_AUTH", "REDIS_TLS"), Flag: "url", Value: u.String(), Note: serverurl.Redact(u.String())})
}

// splitAuth reads REDIS_AUTH as the reference does: "user:password", or a password alone.
func splitAuth(auth string, _ bool) (user, pass string) {
	if u, p, ok := strings.Cut(auth, ":"); ok {
		return u, p
	}
	return "", auth
}

// redisNode is one node of REDIS_URL: host:port, or a redis:// URL as radix dials it, with
// its user, password and database.
type redisNode struct {
	host, user, pass, db string
	ignored              []string // its query's parameters radix does not read
}

// parseRedisNode reads one node of REDIS_URL, or says why not (never quoting it: it may hold
// a password).
func parseRedisNode(s string) (redisNode, string) {
	if !strings.Contains(s, "://") {
		if _, _, err := net.SplitHostPort(s); err != nil {
			return redisNode{}, "not host:port, nor redis://[user:password@]host:port[/db]"
		}
		return redisNode{host: s}, ""
	}
	if !strings.HasPrefix(s, "redis://") {
		// radix reads redis:// alone; any other is dialled as an address, and fails.
		return redisNode{}, "the reference takes host:port or redis://host:port only (TLS is REDIS_TLS=true)"
	}
	u, err := url.Parse(s)
	if err != nil || u.Fragment != "" || u.Opaque != "" {
		return redisNode{}, "not a valid URL (a password with # / ? or % must be URL-encoded, e.g. # as %23)"
	}
	if _, port, err := net.SplitHostPort(u.Host); err != nil || port == "" {
		return redisNode{}, "a redis:// URL without host:port"
	}
	q := u.Query()
	n := redisNode{host: u.Host, user: q.Get("username"), pass: q.Get("password"), db: q.Get("db")}
	if name := u.User.Username(); name != "" {
		n.user = name
	}
	if p, ok := u.User.Password(); ok {
		n.pass = p
	}
	if u.Path != "" && u.Path != "/" {
		n.db = u.Path[1:]
	}
	if d, err := strconv.Atoi(n.db); n.db != "" && (err != nil || d < 0) {
		return redisNode{}, "its database is not a number"
	}
	for k := range q {
		if k != "username" && k != "password" && k != "db" {
			n.ignored = append(n.ignored, k)
		}
	}
	slices.Sort(n.ignored)
	return n, ""
}

func (r *envReader) behaviour() {
	if r.bool("SHADOW_MODE", false) {
		r.flag("SHADOW_MODE", "true", "shadow-mode", "true")
	}
	if r.bool("QUOTA_MODE", false) {
		r.refuse("QUOTA_MODE", "true", "rlfn-rls has quota_mode per descriptor, not for every descriptor at once")
	}
	if r.bool("RESPONSE_DYNAMIC_METADATA", false) {
		r.flag("RESPONSE_DYNAMIC_METADATA", "true", "dynamic-metadata", "true")
	}
	headers := r.bool("LIMIT_RESPONSE_HEADERS_ENABLED", false)
	if headers {
		r.flag("LIMIT_RESPONSE_HEADERS_ENABLED", "true", "headers", "reference")
	}
	for _, h := range [][2]string{{"LIMIT_LIMIT_HEADER", "RateLimit-Limit"}, {"LIMIT_REMAINING_HEADER", "RateLimit-Remaining"}, {"LIMIT_RESET_HEADER", "RateLimit-Reset"}} {
		n, def := h[0], h[1]
		v, ok := r.get(n)
		switch {
		case !ok:
		case !headers:
			r.note(n, v, "unused without LIMIT_RESPONSE_HEADERS_ENABLED (as by the reference)")
		case v == def:
			r.note(n, v, "as rlfn-rls does")
		default:
			r.refuse(n, v, "rlfn-rls sends the reference's default header names only ("+def+")")
		}
	}
	if v, ok := r.get("LOCAL_CACHE_SIZE_IN_BYTES"); ok {
		n, err := strconv.Atoi(v)
		switch {
		case err != nil || n < 0:
			r.refuse("LOCAL_CACHE_SIZE_IN_BYTES", v, "not a size in bytes")
		case n > 0:
			// The reference's cache holds a key and its expiry; rlfn's a principal and its
			// retry time: about 128 bytes each.
			r.flag("LOCAL_CACHE_SIZE_IN_BYTES", v, "denial-cache", strconv.Itoa(max(1, n/128)))
		}
	}
	if v, ok := r.get("CACHE_KEY_PREFIX"); ok && v != "" {
		r.flag("CACHE_KEY_PREFIX", v, "prefix", v)
	} else if ok {
		r.note("CACHE_KEY_PREFIX", v, "rlfn-rls's keys start with its own prefix, rl: (--prefix), and never meet the reference's")
	}
	r.noted("rlfn-rls never counts a refused request (see Differences)", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")
	r.noted("rlfn's keys expire when their limiter is back to its initial state", "EXPIRATION_JITTER_MAX_SECONDS")
	if v, ok := r.get("NEAR_LIMIT_RATIO"); ok {
		if f, err := strconv.ParseFloat(v, 64); err != nil || f <= 0 || f > 1 {
			r.refuse("NEAR_LIMIT_RATIO", v, "not a fraction above 0, at most 1")
		} else {
			r.flag("NEAR_LIMIT_RATIO", v, "near-limit-ratio", v)
		}
	}
}

func (r *envReader) stats() {
	r.noted("rlfn-rls sends no statsd: its metrics are Prometheus's, at /metrics on HOST:PORT", "USE_STATSD", "USE_DOG_STATSD",
		"USE_DOG_STATSD_MOGRIFIERS", "STATSD_HOST", "STATSD_PORT", "EXTRA_TAGS", "STATS_FLUSH_INTERVAL")
	// The reference's dogstatsd mogrifiers, DOG_STATSD_MOGRIFIER_<NAME>_PATTERN and the like.
	for _, n := range r.names {
		if strings.HasPrefix(n, "DOG_STATSD_MOGRIFIER_") {
			r.noted("rlfn-rls sends no statsd (a dogstatsd mogrifier of the reference's)", n)
		}
	}
	disabled := r.bool("DISABLE_STATS", false)
	if v, ok := r.get("DISABLE_STATS"); ok && disabled {
		r.note("DISABLE_STATS", v, "no PROMETHEUS_ADDR listener, as the reference sends no stats; /metrics on HOST:PORT stays")
	}
	if r.bool("USE_PROMETHEUS", false) && !disabled {
		// The reference's listener of its own, with its defaults; the metrics stay on
		// HOST:PORT too. The reference refuses USE_PROMETHEUS beside USE_STATSD (true by
		// default) as two sinks; rlfn-rls sends no statsd, so there is only one.
		addr, ok := r.get("PROMETHEUS_ADDR")
		if !ok {
			addr = ":9090"
		}
		r.effects = append(r.effects, envEffect{Var: r.vars("USE_PROMETHEUS", "PROMETHEUS_ADDR"), Flag: "metrics", Value: addr})
		if path, ok := r.get("PROMETHEUS_PATH"); ok {
			r.flag("PROMETHEUS_PATH", path, "metrics-path", path) // the default is the reference's, /metrics
		}
	} else {
		r.noted("unused without USE_PROMETHEUS, or with DISABLE_STATS (as by the reference): the metrics are at /metrics on HOST:PORT", "USE_PROMETHEUS", "PROMETHEUS_ADDR", "PROMETHEUS_PATH")
	}
	r.noted("rlfn-rls's metrics are OpenTelemetry's own names (rlfn_rls_*), with no statsd mapping", "PROMETHEUS_MAPPER_YAML", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS")
}

// applyReferenceEnv is the app's Before: it sets the flags the reference's environment maps
// to, unless given on the command line or by rlfn-rls's own variables, which win.
func applyReferenceEnv(c *cli.Context) error {
	var names []string
	for _, kv := range os.Environ() {
		n, _, _ := strings.Cut(kv, "=")
		names = append(names, n)
	}
	effects, err := referenceEnv(os.LookupEnv, names...)
	if err != nil {
		return err
	}
	for i, e := range effects {
		if e.Flag == "" {
			continue
		}
		if c.IsSet(e.Flag) {
			effects[i].Note = "--" + e.Flag + " given, which wins"
			effects[i].Flag = ""
			continue
		}
		if e.Unless != "" && c.IsSet(e.Unless) {
			effects[i].Note = "--" + e.Unless + " given: no --" + e.Flag
			effects[i].Flag = ""
			continue
		}
		if err := c.Set(e.Flag, e.Value); err != nil {
			return fmt.Errorf("$%s: %w", e.Var, err)
		}
	}
	if c.App.Metadata == nil {
		c.App.Metadata = map[string]any{}
	}
	c.App.Metadata[envKey] = effects
	return nil
}

const envKey = "reference environment"

// flagName is how an error names a flag: --name, and the reference's variables when they
// set it (--grpc ($GRPC_HOST, $GRPC_PORT)), so that a user of the reference's environment
// knows which of its variables to fix.
func flagName(c *cli.Context, name string) string {
	effects, _ := c.App.Metadata[envKey].([]envEffect)
	for _, e := range effects {
		if e.Flag != name {
			continue
		}
		if !strings.Contains(e.Var, "=") {
			return "--" + name + " (" + e.Var + ")" // the reference's default directory
		}
		return "--" + name + " ($" + strings.Join(varNames(e.Var), ", $") + ")"
	}
	return "--" + name
}

// logReferenceEnv says, once the logger is made, what each of the reference's variables did.
func logReferenceEnv(c *cli.Context, log *slog.Logger) {
	effects, _ := c.App.Metadata[envKey].([]envEffect)
	for _, e := range effects {
		switch {
		case e.Flag == "url":
			log.Info("the reference's environment", "var", e.Var, "flag", "--url", "value", e.Note)
		case e.Flag != "" && e.Note != "":
			log.Info("the reference's environment", "var", e.Var, "flag", "--"+e.Flag, "value", e.Value, "why", e.Note)
		case e.Flag != "":
			log.Info("the reference's environment", "var", e.Var, "flag", "--"+e.Flag, "value", e.Value)
		case e.Effect != "":
			log.Info("the reference's environment", "var", e.Var, "effect", e.Effect, "why", e.Note)
		default:
			log.Info("the reference's environment", "var", e.Var, "effect", "none", "why", e.Note)
		}
	}
}
