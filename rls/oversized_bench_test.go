package rls_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// oversized is a request of 100,000 descriptors of one empty entry each: 0.7 MB, the most
// descriptors under gRPC's default bound on a message, refused by --max-request-bytes from its
// length, before gRPC reads or decodes it.
func oversized() *pb.RateLimitRequest {
	ds := make([]*rlv3.RateLimitDescriptor, 100_000)
	for i := range ds {
		ds[i] = desc("k", "")
	}
	return request("load", ds...)
}

// BenchmarkOversizedRequest runs rlfn-rls as a process of its own on Valkey 8 and measures
// what oversized requests cost the other callers: the load of BenchmarkSideBySide alone, then
// beside a caller that sends nothing but oversized requests, back to back (compare their
// p99-µs), back to back and 20 a second; and the process's CPU time per oversized request and
// resident memory (VmRSS) idle, and after 1,000 oversized requests, at once and 10 s later
// (run memory with -benchtime 1x for one of each).
func BenchmarkOversizedRequest(b *testing.B) {
	be := backends(b)[0]
	// A deadline of a second: on a machine shared with other work, one call of the load that
	// misses 100ms would fail the run, and says nothing about the oversized requests.
	c, cmd := rlfnProcessCmd(b, be, loadConfig, "--deadline", "1s")
	small := func(ctx context.Context, user string) (bool, error) {
		resp, err := c.ShouldRateLimit(ctx, request("load", desc("user", user)))
		return err == nil && resp.OverallCode == pb.RateLimitResponse_OK, err
	}
	// The oversized request is encoded once and sent as it is: the load generator's cost of
	// encoding it is not the service's.
	raw, err := proto.Marshal(oversized())
	if err != nil {
		b.Fatal(err)
	}
	conn, err := grpc.NewClient(cmd.Args[slices.Index(cmd.Args, "--grpc")+1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	refuse := func() error {
		var resp pb.RateLimitResponse
		err := conn.Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", raw, &resp, grpc.ForceCodec(rawCodec{}))
		if status.Code(err) != codes.ResourceExhausted {
			return fmt.Errorf("oversized: %v", err)
		}
		return nil
	}
	b.Run("alone", func(b *testing.B) { drive(b, small) })
	b.Run("beside-oversized", func(b *testing.B) {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		n := 0
		var err error
		wg.Go(func() {
			for err == nil {
				select {
				case <-stop:
					return
				default:
				}
				err = refuse()
				n++
			}
		})
		drive(b, small)
		close(stop)
		wg.Wait()
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(n), "oversized")
	})
	// The same beside a caller sending 20 oversized requests a second: the others' p99 under an
	// equal rate of them, whatever each costs (back to back, the cheaper each is, the more are
	// sent, and the load generator shares the machine with them).
	b.Run("beside-oversized-20-per-s", func(b *testing.B) {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		n := 0
		var err error
		wg.Go(func() {
			t := time.NewTicker(50 * time.Millisecond)
			defer t.Stop()
			for err == nil {
				select {
				case <-stop:
					return
				case <-t.C:
				}
				err = refuse()
				n++
			}
		})
		drive(b, small)
		close(stop)
		wg.Wait()
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(n), "oversized")
	})
	b.Run("memory", func(b *testing.B) {
		for range b.N {
			idle := rss(b, cmd.Process.Pid)
			cpu := cpuTime(b, cmd.Process.Pid)
			for range oversizedN {
				if err := refuse(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((cpuTime(b, cmd.Process.Pid)-cpu).Microseconds())/oversizedN, "rls-cpu-µs/oversized")
			after := rss(b, cmd.Process.Pid)
			time.Sleep(10 * time.Second)
			later := rss(b, cmd.Process.Pid)
			b.ReportMetric(idle/1e6, "idle-MB")
			b.ReportMetric(after/1e6, "after-MB")
			b.ReportMetric(later/1e6, "after-10s-MB")
		}
	})
}

// rawCodec sends bytes already encoded, and decodes replies as protobuf.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }
func (rawCodec) Name() string                       { return "proto" }

// rss is a process's resident memory in bytes.
func rss(b *testing.B, pid int) float64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb * 1024
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

// cpuTime is the CPU time a process has spent (user and system), at the kernel's 10 ms ticks.
func cpuTime(b *testing.B, pid int) time.Duration {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// After the command's name in parentheses: state is field 3, utime and stime 14 and 15.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatal(string(data))
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// oversizedN is how many oversized requests the memory figure is read after.
const oversizedN = 1000
