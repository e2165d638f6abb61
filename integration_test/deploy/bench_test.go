package deploy

import (
	"testing"

	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/versions"
)

// BenchmarkDeploy measures one whole deploy on the 3-shard cluster (3 primaries, 3
// replicas), as `rlfn deploy` runs it: discover, inspect, plan, and apply (lock, stale
// check, load, verify every node, unlock), alternating between 1.0.0 and 1.1.0.
func BenchmarkDeploy(b *testing.B) {
	cl := sharedCluster(b)
	url := urlOf(cl.Primaries[0])
	opt, err := options(url)
	if err != nil {
		b.Fatal(err)
	}
	next := []versions.Release{v110, v100}
	for i := 0; b.Loop(); i++ {
		tg, err := deployer.Discover(b.Context(), opt)
		if err != nil {
			b.Fatal(err)
		}
		installed, err := tg.Inspect(b.Context(), releases)
		if err != nil {
			b.Fatal(err)
		}
		p := deployer.NewPlan(installed, next[i%2], true)
		if !p.Pending() {
			b.Fatalf("nothing to deploy: %+v", p.Steps)
		}
		if _, err := tg.Apply(b.Context(), p, deployer.Options{}); err != nil {
			b.Fatal(err)
		}
		tg.Close()
	}
}
