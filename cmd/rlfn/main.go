// Command rlfn shows, diffs and deploys the ratelimit library on Valkey and Redis servers and
// clusters, and calls its functions the way the Go client does.
package main

import "os"

// main is the only place that exits: everything else returns an error, which run turns into
// an exit code, so tests drive the whole command in-process.
func main() {
	os.Exit(run(os.Args, os.Stdin, os.Stdout, os.Stderr))
}
