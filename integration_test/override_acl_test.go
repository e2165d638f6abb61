package integration_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/internal/override"
)

// overrideRules are what a service user needs beyond svcRules to read the overrides
// (docs/overrides.md): the store's head (HGETALL), its pages (HSCAN) and its log (XRANGE), and
// its version through valkey-go's cached reads, which it sends as CLIENT CACHING YES, MULTI,
// PTTL, HGET, EXEC. Without one of readRules the overrides are never read; without one of the
// others, once a second without the cache.
var overrideRules = []string{"+client|caching", "+hget", "+hgetall", "+hscan", "+xrange", "+multi", "+exec", "+pttl"}

// readRules are the overrideRules without which the overrides are never read.
var readRules = []string{"+hget", "+hgetall", "+hscan", "+xrange"}

// TestOverrideServiceUser: with svcRules and overrideRules, a service user's Limiter reads the
// overrides and sees a change on its own, through the client-side cache; without one of
// readRules it never does (its decisions keep the code's limits, never an error); without one
// of the cache's rules, it still does: reading the server once a second when the cached
// reads are refused (MULTI, EXEC, PTTL), within 10 seconds when they are not tracked (CLIENT
// CACHING). Valkey 8 and Redis 7.0.
func TestOverrideServiceUser(t *testing.T) {
	for _, tg := range servers(t)[:2] {
		t.Run(tg.name, func(t *testing.T) {
			nodes := everyNode(t, tg)
			t.Cleanup(func() {
				for _, n := range nodes {
					_ = n.Do(context.Background(), n.B().AclDeluser().Username(svcUser).Build()).Error()
				}
			})
			setUser := func(extra []string) {
				t.Helper()
				args := []string{"reset", "on", ">" + svcPassword, "resetkeys", "~rl:*", "resetchannels", "-@all"}
				for _, r := range svcRules {
					args = append(args, r.rule)
				}
				args = append(args, extra...)
				for _, n := range nodes {
					if err := do(t, n, n.B().AclSetuser().Username(svcUser).Rule(args...).Build()).Error(); err != nil {
						t.Fatalf("ACL SETUSER %v: %v", args, err)
					}
				}
			}
			setUser(overrideRules)
			if err := overrideCalls(t, tg, false); err != nil {
				t.Fatalf("with every rule: %v", err)
			}
			for i, r := range overrideRules {
				setUser(slices.Delete(slices.Clone(overrideRules), i, i+1))
				err := overrideCalls(t, tg, !slices.Contains(readRules, r))
				switch {
				case slices.Contains(readRules, r) && err == nil:
					t.Errorf("without %s the overrides are still read: the rule is not needed", r)
				case !slices.Contains(readRules, r) && err != nil:
					t.Errorf("without %s (a rule of the cache): %v; want them read without the cache", r, err)
				}
			}
		})
	}
}

// overrideCalls is a service user's Limiter reading the overrides under rl: (SyncOverrides)
// and seeing a change on its own; its decisions never fail. uncached: the cached reads are
// refused, and the Limiter reads once a second instead (so the change takes up to a second).
func overrideCalls(t *testing.T, tg *target, uncached bool) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	vk, err := valkey.NewClient(valkey.ClientOption{Username: svcUser, Password: svcPassword, InitAddress: []string{addrOf(t, tg.primary)}})
	if err != nil {
		return err
	}
	defer vk.Close()
	lim := harness.NewLimiter(t, vk, client.Options{Overrides: true, Fallback: client.ReturnError, Deadline: time.Second})
	store := override.NewStore(tg.c, "rl:")
	key := keyFor(t)
	o := tbOverride(key, 50)
	defer store.Apply(context.Background(), []override.Change{{Op: override.Remove, Old: &o}}, nil)
	limit := client.Limit(client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour})
	syncErr := lim.SyncOverrides(ctx)
	if _, err := lim.Allow(ctx, key, limit); err != nil {
		t.Fatalf("a decision failed: %v", err)
	}
	if uncached {
		// the first cached read is refused, and turns the Limiter to uncached reads
		time.Sleep(50 * time.Millisecond)
		lim.Allow(ctx, key, limit)
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := store.Apply(ctx, []override.Change{{Op: override.Add, New: &o}}, nil); err != nil {
		t.Fatal(err)
	}
	// without CLIENT CACHING the server tracks nothing and valkey-go says nothing of it: the
	// Limiter finds out when it checks its cache against the server, every 10 seconds
	deadline := time.Now().Add(3 * time.Second)
	if uncached {
		deadline = time.Now().Add(12 * time.Second)
	}
	for time.Now().Before(deadline) {
		res, err := lim.Allow(ctx, key, limit)
		if err != nil {
			t.Fatalf("a decision failed: %v", err)
		}
		if res.Override != nil {
			return syncErr
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("the change was not seen in time (SyncOverrides: %v)", syncErr)
}
