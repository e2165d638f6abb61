// Command rlfn-rls is an Envoy rate limit service (envoy.service.ratelimit.v3) that decides
// with rlfn's library, configured by envoyproxy/ratelimit's YAML files and rlfn's
// extensions. It is a binary of its own, not an rlfn subcommand, so that the CLI carries no
// gRPC server and the service's image holds only what serving needs.
package main

import (
	"os"
	// Go's copy of the public CAs, used when the system has none (a FROM scratch image): a
	// rediss:// server with a public certificate is verified without REDIS_TLS_CACERT or
	// --tls-ca, which Envoy Gateway never sets.
	_ "golang.org/x/crypto/x509roots/fallback"
	// Go's copy of the zone database: a calendar's time_zone loads in a FROM scratch image.
	_ "time/tzdata"
)

// main is the only place that exits.
func main() {
	os.Exit(run(os.Args, os.Stderr))
}
