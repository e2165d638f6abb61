package integration_test

import (
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
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
	for _, s := range standalones {
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

func release(t *testing.T, v string) versions.Release {
	t.Helper()
	for _, r := range versions.Embedded() {
		if r.Version == v {
			return r
		}
	}
	t.Fatalf("no release %s", v)
	return versions.Release{}
}

// A rollback from 1.1.0 to 1.0.0 keeps every live limiter exactly: state written by 1.1.0,
// with reserves and after refunds, is read by 1.0.0 as 1.1.0 reads it.
func TestRollbackTo10KeepsState(t *testing.T) {
	v10, v11 := release(t, "1.0.0"), release(t, "1.1.0")
	for _, s := range standalones {
		t.Run(s.name, func(t *testing.T) {
			c := s.start(t).Client(t)
			const limit = 10
			roomInWindow(t, c, 60_000, 3*time.Second)
			loadCode(t, c, v11.Code)
			keys := map[string]string{}
			for _, l := range slow {
				key := keyFor(t) + l.name
				keys[l.name] = key
				// 7 taken, 2 given back: 5 used
				fcall(t, c, l.fn, key, withReserve(l.args(limit, 3), 2)...)
				fcall(t, c, l.fn, key, withReserve(l.args(limit, 4), 3)...)
				if r := fcall(t, c, l.fn, key, withReserve(l.args(limit, 1), 6)...); r.Allowed {
					t.Fatalf("%s: cost 1 + reserve 6 with 3 left: %v", l.name, r)
				}
				if r := fcall(t, c, refundFn(l), key, l.args(limit, 2)...); r.Remaining != 5 {
					t.Fatalf("%s: refund 2 of 7: %v", l.name, r)
				}
			}
			read := func() map[string]reply {
				out := map[string]reply{}
				for _, l := range slow {
					out[l.name] = fcall(t, c, l.fn+"_peek", keys[l.name], l.args(limit, 1)...)
				}
				return out
			}
			dumps := map[string]snapshot{}
			for name, key := range keys {
				dumps[name] = snap(t, c, key)
			}
			start := time.Now()
			by11 := read()
			loadCode(t, c, v10.Code)
			by10 := read()
			elapsed := time.Since(start).Milliseconds()
			for _, l := range slow {
				a, b := by11[l.name], by10[l.name]
				if a.Remaining != 5 || b.Allowed != a.Allowed || b.Remaining != a.Remaining || b.Limit != a.Limit ||
					b.ResetAfter > a.ResetAfter || b.ResetAfter < a.ResetAfter-elapsed-1 || b.Delay > a.Delay || b.Delay < a.Delay-elapsed-1 {
					t.Errorf("%s: 1.1.0 reads %v, 1.0.0 reads %v", l.name, a, b)
				}
				if snap(t, c, keys[l.name]) != dumps[l.name] {
					t.Errorf("%s: the state changed across the rollback", l.name)
				}
				if r := fcall(t, c, l.fn, keys[l.name], l.args(limit, 5)...); !r.Allowed || r.Remaining != 0 {
					t.Errorf("%s: 1.0.0 takes the 5 left: %v", l.name, r)
				}
				if r := fcall(t, c, l.fn, keys[l.name], l.args(limit, 1)...); r.Allowed {
					t.Errorf("%s: 1.0.0 admits beyond the limit: %v", l.name, r)
				}
			}
		})
	}
}
