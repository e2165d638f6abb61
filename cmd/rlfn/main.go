// Command rlfn shows, diffs and deploys the ratelimit library on Valkey and Redis servers and
// clusters, and calls its functions the way the Go client does.
package main

import (
	"os"
	// Go's copy of the public CAs, used when the system has none (a FROM scratch image): a
	// rediss:// server with a public certificate is verified without --tls-ca.
	_ "golang.org/x/crypto/x509roots/fallback"
	// Go's copy of the zone database: --zone loads on a host without one (a slim container
	// image), and a calendar's windows are the same wherever rlfn runs.
	_ "time/tzdata"
)

// main is the only place that exits: everything else returns an error, which run turns into
// an exit code, so tests drive the whole command in-process.
func main() {
	os.Exit(run(os.Args, os.Stdin, os.Stdout, os.Stderr))
}
