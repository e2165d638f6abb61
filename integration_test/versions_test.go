package integration_test

import (
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/integration_test/harness"
	"github.com/rlfn/rlfn/versions"
)

// lineage is every release, then the working copy when it declares a newer version.
func lineage(t *testing.T) versions.Set {
	set := append(versions.Set{}, versions.Embedded()...)
	if v := workingVersion(t); versions.Compare(v, set.Latest().Version) > 0 {
		set = append(set, versions.Release{Version: v, Code: functions.Source})
	}
	return set
}

func loadCode(t *testing.T, c valkey.Client, code string) {
	t.Helper()
	if err := do(t, c, c.B().FunctionLoad().Replace().FunctionCode(code).Build()).Error(); err != nil {
		t.Fatalf("FUNCTION LOAD: %v", err)
	}
}

// Each release loads on both servers and its rl_version names the release it is in.
func TestReleasesAnswerTheirVersion(t *testing.T) {
	for _, s := range []struct {
		name  string
		start func(testing.TB, ...string) *harness.Server
	}{{"valkey8", harness.StartValkey}, {"redis7.0", harness.StartRedis}} {
		t.Run(s.name, func(t *testing.T) {
			c := s.start(t).Client(t)
			for _, r := range lineage(t) {
				loadCode(t, c, r.Code)
				v, err := do(t, c, c.B().FcallRo().Function("rl_version").Numkeys(0).Build()).ToString()
				if err != nil || v != r.Version {
					t.Errorf("release %s answers rl_version %q, %v", r.Version, v, err)
				}
			}
		})
	}
}

// State written by each 1.x version is read by every later one: a deploy between them keeps
// every live limiter where it was.
func TestStateSurvivesUpgrades(t *testing.T) {
	c := harness.StartValkey(t).Client(t)
	set := lineage(t)
	for i, from := range set {
		for _, to := range set[i:] {
			if from.Major() != to.Major() {
				continue
			}
			t.Run(from.Version+"_to_"+to.Version, func(t *testing.T) {
				for _, l := range slow {
					loadCode(t, c, from.Code)
					key := keyFor(t) + l.name
					if l.windowed {
						roomInWindow(t, c, 60_000, time.Second)
					}
					first := fcall(t, c, l.fn, key, l.args(10, 3)...)
					loadCode(t, c, to.Code)
					p := fcall(t, c, l.fn+"_peek", key, l.args(10, 1)...)
					if p.Remaining != first.Remaining || p.ResetAfter > first.ResetAfter {
						t.Errorf("%s: %s left %v, %s reads %v", l.name, from.Version, first, to.Version, p)
					}
					r := fcall(t, c, l.fn, key, l.args(10, 7)...)
					if !r.Allowed || r.Remaining != 0 {
						t.Errorf("%s: after the upgrade: %v, want the 7 left admitted", l.name, r)
					}
				}
			})
		}
	}
}
