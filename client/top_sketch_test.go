package client

import (
	"fmt"
	"testing"

	"github.com/rlfn/rlfn/internal/topkeys"
)

// TestTopSketch: the sketch holds at most k keys per limit, every key denied more than n/k of
// n times is among them, and no count is below the truth (Space-Saving's guarantees).
func TestTopSketch(t *testing.T) {
	tp := &top{k: 10, policies: map[topPolicy]*sketch{}}
	c := &call{spec: spec{alg: tokenBucketAlg}}
	named := &call{spec: spec{alg: tokenBucketAlg, params: params{name: "n"}}}
	truth := map[string]int64{}
	deny := func(c *call, key string) {
		tp.denied(key, c, Result{RetryAfter: Never})
		if c.name == "" {
			truth[key]++
		}
	}
	// two heavy hitters in a stream of 1000 distinct keys
	for i := 0; i < 3000; i++ {
		switch {
		case i%5 == 0:
			deny(c, "attacker")
		case i%7 == 0:
			deny(c, "noisy")
		default:
			deny(c, fmt.Sprintf("k%d", i%1000))
		}
	}
	deny(named, "attacker")
	if n := len(tp.policies[topPolicy{"token_bucket", ""}].counts); n != 10 {
		t.Errorf("the sketch holds %d keys, want k = 10", n)
	}
	got := map[string]topkeys.Entry{}
	for _, e := range tp.snapshot() {
		if e.Name == "" {
			got[e.Key] = e
		}
		if e.Name == "" && e.Denials < truth[e.Key] {
			t.Errorf("%s: %d denials counted, fewer than the %d made", e.Key, e.Denials, truth[e.Key])
		}
		if e.Denials-e.Error > truth[e.Key] {
			t.Errorf("%s: at least %d - %d denials claimed, %d made", e.Key, e.Denials, e.Error, truth[e.Key])
		}
	}
	for _, heavy := range []string{"attacker", "noisy"} {
		if _, ok := got[heavy]; !ok {
			t.Errorf("%s (%d of 3000 denials) is not in the top 10: %v", heavy, truth[heavy], got)
		}
	}
	if e := tp.snapshot()[0]; e.Key != "attacker" || e.RetryAfterMs != -1 {
		t.Errorf("the most denied: %+v", e)
	}
	if s := tp.policies[topPolicy{"token_bucket", "n"}]; s == nil || s.counts["attacker"].Denials != 1 {
		t.Error("a named limit's denials are not counted apart")
	}
}
