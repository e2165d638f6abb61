package rls_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rlfn/rlfn/client"
)

// loadConfig: one limit per user, spent by the load so that it both admits and refuses.
const loadConfig = `
domain: load
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 200}
`

const (
	loadUsers   = 100
	loadLimit   = 200
	loadWorkers = 32
)

// BenchmarkSideBySide sends the same load (loadWorkers concurrent callers, one descriptor of
// loadUsers users in turn) to rlfn's service and to the reference, each its own process
// over gRPC on loopback, against the same Valkey 8 (standalone, then the 3-shard cluster),
// and to the Go client in process, and reports decisions per second and the latency percentiles. Every user's admissions are counted: more than
// its limit is over-admission, which fails the benchmark. make rls-bench runs it.
func BenchmarkSideBySide(b *testing.B) {
	all := backends(b)
	for _, be := range []*backend{all[0], all[len(all)-1]} {
		b.Run(be.name+"/rlfn-rls", func(b *testing.B) {
			// A process of its own, as the reference's: neither shares the load generator's.
			c := rlfnProcess(b, be, loadConfig)
			drive(b, func(ctx context.Context, user string) (bool, error) {
				resp, err := c.ShouldRateLimit(ctx, request("load", desc("user", user)))
				return err == nil && resp.OverallCode == pb.RateLimitResponse_OK, err
			})
		})
		b.Run(be.name+"/reference", func(b *testing.B) {
			ref := referenceService(b, be, loadConfig)
			drive(b, func(ctx context.Context, user string) (bool, error) {
				resp, err := ref.ShouldRateLimit(ctx, request("load", desc("user", user)))
				return err == nil && resp.OverallCode == pb.RateLimitResponse_OK, err
			})
		})
		b.Run(be.name+"/client-in-process", func(b *testing.B) {
			lim, err := client.New(be.vk, client.Options{Prefix: fmt.Sprintf("rlsload:%d:", time.Now().UnixNano()), Fallback: client.ReturnError})
			if err != nil {
				b.Fatal(err)
			}
			limit := client.FixedWindow{Limit: loadLimit, Window: time.Hour}
			drive(b, func(ctx context.Context, user string) (bool, error) {
				res, err := lim.Allow(ctx, "load/user="+user, limit)
				return res.Allowed, err
			})
		})
	}
}

var rlfnBin struct {
	once sync.Once
	path string
	err  error
}

// rlfnProcess builds cmd/rlfn-rls once and runs it on loopback with config, against be, as
// the reference runs; it returns a client of its gRPC service.
func rlfnProcess(b *testing.B, be *backend, config string) pb.RateLimitServiceClient {
	c, _ := rlfnProcessCmd(b, be, config)
	return c
}

// rlfnProcessCmd is rlfnProcess, with more flags, and the process's command.
func rlfnProcessCmd(b *testing.B, be *backend, config string, flags ...string) (pb.RateLimitServiceClient, *exec.Cmd) {
	rlfnBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "rlfn-rls-bench-")
		if err != nil {
			rlfnBin.err = err
			return
		}
		env.closers = append(env.closers, func() { os.RemoveAll(dir) })
		rlfnBin.path = filepath.Join(dir, "rlfn-rls")
		if out, err := exec.Command("go", "build", "-o", rlfnBin.path, "../cmd/rlfn-rls").CombinedOutput(); err != nil {
			rlfnBin.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if rlfnBin.err != nil {
		b.Fatal(rlfnBin.err)
	}
	dir := b.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		b.Fatal(err)
	}
	c, cmd, _ := startOnFreePorts(b, "rlfn-rls", 1, func(ports []int) (*exec.Cmd, string) {
		addr := fmt.Sprint("127.0.0.1:", ports[0])
		cmd := exec.Command(rlfnBin.path, "--url", "redis://"+be.addrs[0], "--config", cfg, "--grpc", addr, "--http", "",
			"--prefix", fmt.Sprintf("rlsbench:%d:", time.Now().UnixNano()), "--max-in-flight", "10000", "--log-level", "error")
		cmd.Args = append(cmd.Args, flags...)
		return cmd, addr
	})
	return c, cmd
}

// drive runs b.N decisions from loadWorkers goroutines and reports the figures.
func drive(b *testing.B, decide func(ctx context.Context, user string) (bool, error)) {
	awayFromHourEnd()
	var next atomic.Int64
	admitted := make([]atomic.Int64, loadUsers)
	lat := make([][]time.Duration, loadWorkers)
	var failed atomic.Int64
	var wg sync.WaitGroup
	// A run of its own users, so that -count runs do not share counters.
	run := time.Now().UnixNano()
	b.ResetTimer()
	start := time.Now()
	for w := range loadWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				u := int(i % loadUsers)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				t0 := time.Now()
				ok, err := decide(ctx, fmt.Sprintf("%d-%d", run, u))
				lat[w] = append(lat[w], time.Since(t0))
				cancel()
				if err != nil {
					failed.Add(1)
				}
				if ok {
					admitted[u].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	pct := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))].Microseconds()) }
	over := int64(0)
	for i := range admitted {
		over += max(0, admitted[i].Load()-loadLimit)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
	b.ReportMetric(pct(0.999), "p99.9-µs")
	b.ReportMetric(float64(over), "over-admitted")
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d decisions failed", f)
	}
	if over > 0 {
		b.Fatalf("%d decisions over the limit", over)
	}
}

func awayFromHourEnd() {
	now := time.Now()
	if left := now.Truncate(time.Hour).Add(time.Hour).Sub(now); left < 30*time.Second {
		time.Sleep(left + time.Second)
	}
}
