package integration_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/override"
)

// BenchmarkOverridePropagation measures how long a change to the overrides takes to reach a
// Limiter that decides under load (4 goroutines calling Allow without pause on other keys):
// each iteration writes an override as rlfn override set does (one transaction) and peeks
// its key until a decision carries it (Result.Override: the server's, or the Fallback's while
// a breaker is open). It reports the median, the 99th percentile and the
// worst, in milliseconds; kill_connections kills the Limiter's connections before each change
// (their tracking, and any invalidation in flight, is lost), as a network failure would.
//
//	go test ./integration_test -run '^$' -bench OverridePropagation -benchtime 200x
func BenchmarkOverridePropagation(b *testing.B) {
	for _, tg := range servers(b) {
		if tg.name == "redis7.0" {
			continue // the same client code: Valkey 8 and the cluster bound it
		}
		for _, kill := range []bool{false, true} {
			name := tg.name
			if kill {
				name += "/kill_connections"
			}
			b.Run(name, func(b *testing.B) {
				// A service's deadline, the default: it also bounds a read of the store. Killed
				// connections open the breaker for a second: FailClosed decides meanwhile, and
				// its decisions carry the override as the server's do.
				e := newOvrEnv(b, tg, client.Options{Deadline: 100 * time.Millisecond, Fallback: client.FailClosed})
				limit := client.Limit(client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour})
				if err := e.lim.SyncOverrides(ctx5s(b)); err != nil {
					b.Fatal(err)
				}
				stop := backgroundLoad(e.lim, "bg:", limit)
				defer stop()
				var took []time.Duration
				i := int64(0)
				for b.Loop() {
					i++
					if kill {
						b.StopTimer()
						killClients(b, tg)
						b.StartTimer()
					}
					o := tbOverride("target", 100+i)
					start := time.Now()
					if _, err := e.store.Apply(context.Background(), []override.Change{{Op: override.Add, New: &o}}, nil); err != nil {
						b.Fatal(err)
					}
					for {
						res, err := e.lim.Peek(context.Background(), "target", limit)
						if err == nil && res.Override != nil && res.Override.Limit.Quota().Limit == 100+i {
							break
						}
						if time.Since(start) > 10*time.Second {
							b.Fatalf("change %d not seen in 10s", i)
						}
					}
					took = append(took, time.Since(start))
				}
				slices.Sort(took)
				ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
				b.ReportMetric(ms(took[len(took)/2]), "p50-ms")
				b.ReportMetric(ms(took[len(took)*99/100]), "p99-ms")
				b.ReportMetric(ms(took[len(took)-1]), "max-ms")
			})
		}
	}
}

// BenchmarkOverrideCommands counts the server commands a decision costs with overrides on
// and set, under load (8 goroutines), from the server's INFO commandstats: FCALL per
// decision, and the store's reads (HGET, HGETALL: the library never runs them) per decision.
//
//	go test ./integration_test -run '^$' -bench OverrideCommands -benchtime 20000x
func BenchmarkOverrideCommands(b *testing.B) {
	tg := servers(b)[0]
	e := newOvrEnv(b, tg, client.Options{})
	e.set(b, tbOverride("hot:*", 1_000_000))
	limit := client.Limit(client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour})
	runLoad(b, e.lim, 1, 10, "hot:", limit) // the first read through the cache fills it
	time.Sleep(10 * time.Millisecond)
	before := commandCounts(b, tg.c)
	b.ResetTimer()
	n := int64(b.N)
	per := n / 8
	done := runLoad(b, e.lim, 8, int(per), "hot:", limit)
	b.StopTimer()
	after := commandCounts(b, tg.c)
	b.ReportMetric(float64(after["fcall"]-before["fcall"])/float64(done), "fcall/decision")
	b.ReportMetric(float64(after["hget"]-before["hget"]+after["hgetall"]-before["hgetall"])/float64(done), "store-reads/decision")
}
