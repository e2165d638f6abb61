package integration_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/internal/override"
)

// BenchmarkOverrideLoad measures one Limiter's start with RLFN_OVERRIDES overrides in force
// (1,000,000 unless set), on a Valkey 8 of its own: New and SyncOverrides on a valkey client
// of its own, as a process starts. It reports the wall time (s/load) and this process's CPU
// time, user and system (cpu-s/load), of each load.
//
//	go test ./integration_test -run '^$' -bench OverrideLoad -benchtime 5x -timeout 30m
func BenchmarkOverrideLoad(b *testing.B) {
	n := 1_000_000
	if s := os.Getenv("RLFN_OVERRIDES"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	srv := harness.StartValkey(b)
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}})
	if err != nil {
		b.Fatal(err)
	}
	defer vk.Close()
	all := make([]override.Override, n)
	for i := range all {
		all[i] = override.Override{Policy: override.Policy{Algorithm: "token_bucket"}, Key: fmt.Sprintf("cust:%d", i),
			Limit: override.Fields{Capacity: 100 + int64(i%50), Rate: 10, Period: "1s"}, Note: "bulk"}
	}
	if _, err := override.NewStore(vk, "rl:").Replace(context.Background(), all, ""); err != nil {
		b.Fatal(err)
	}
	all = nil
	var wall, cpu time.Duration
	for b.Loop() {
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}})
		if err != nil {
			b.Fatal(err)
		}
		cpu0, t0 := cpuTime(), time.Now()
		lim := harness.NewLimiter(b, c, client.Options{Overrides: true})
		if err := lim.SyncOverrides(context.Background()); err != nil {
			b.Fatal(err)
		}
		wall += time.Since(t0)
		cpu += cpuTime() - cpu0
		_ = lim.Close(context.Background())
		c.Close()
	}
	b.ReportMetric(wall.Seconds()/float64(b.N), "s/load")
	b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/load")
}

// cpuTime is the CPU time this process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
