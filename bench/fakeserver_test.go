package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
)

// fakeServerEnv makes the test binary, run again with it set, a fake server instead of a test.
const fakeServerEnv = "RLFN_BENCH_FAKE_SERVER"

// TestMain runs the fake server in the process BenchmarkClientOnly starts, and the tests
// otherwise.
func TestMain(m *testing.M) {
	if os.Getenv(fakeServerEnv) == "1" {
		serveFake()
		return
	}
	os.Exit(m.Run())
}

// The fake server's replies: an admission of rl_token_bucket, INCR's integer, and +OK for
// anything else (valkey-go's handshake).
const (
	fakeFcallReply = "*6\r\n:1\r\n:1000000\r\n:999999\r\n:0\r\n:1000\r\n:0\r\n"
	fakeIncrReply  = ":1\r\n"
)

// serveFake answers RESP2 commands on 127.0.0.1 (its address on stdout) as fast as it reads
// them, whatever they are, until stdin closes: a server whose latency is the same for FCALL and
// INCR, so that a client's CPU per call differs only by the client's work.
func serveFake() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr())
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			os.Exit(1)
		}
		go serveFakeConn(c)
	}
}

func serveFakeConn(c net.Conn) {
	defer c.Close()
	r := bufio.NewReaderSize(c, 1<<16)
	w := bufio.NewWriterSize(c, 1<<16)
	for {
		name, err := readCommand(r)
		if err != nil {
			return
		}
		switch {
		case strings.EqualFold(name, "FCALL"):
			w.WriteString(fakeFcallReply)
		case strings.EqualFold(name, "INCR"):
			w.WriteString(fakeIncrReply)
		default:
			w.WriteString("+OK\r\n")
		}
		// one write for every command read at once, as a server does
		if r.Buffered() == 0 {
			if w.Flush() != nil {
				return
			}
		}
	}
}

// readCommand reads one RESP array of bulk strings and returns its first element.
func readCommand(r *bufio.Reader) (string, error) {
	n, err := readLen(r, '*')
	if err != nil {
		return "", err
	}
	var name string
	for i := range n {
		l, err := readLen(r, '$')
		if err != nil {
			return "", err
		}
		b := make([]byte, l+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return "", err
		}
		if i == 0 {
			name = string(b[:l])
		}
	}
	return name, nil
}

func readLen(r *bufio.Reader, kind byte) (int, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 3 || line[0] != kind {
		return 0, fmt.Errorf("want %c, got %q", kind, line)
	}
	return strconv.Atoi(string(line[1 : len(line)-2]))
}

// startFake starts the fake server in a process of its own, so that its CPU is not this
// process's, and returns its address.
func startFake(b *testing.B) string {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fakeServerEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("the fake server: %v", err)
	}
	return strings.TrimSpace(addr)
}

// BenchmarkClientOnly is BenchmarkThroughput's INCR, valkey_fcall and rlfn contenders (with and
// without leased budgets, which no key gets here: the fake's replies never deny) against
// a fake server in another process that answers FCALL and INCR alike, at once: the server's
// latency, and with it valkey-go's batching, is then the same for all, and the client's CPU per
// call differs only by what the client does (its command, its reply, its own code). 64
// goroutines (RLFN_BENCH_CALLERS), each with a cancelable context of its own.
func BenchmarkClientOnly(b *testing.B) {
	addr := startFake(b)
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}, DisableCache: true, AlwaysRESP2: true,
		ForceSingleClient: true})
	if err != nil {
		b.Fatal(err)
	}
	defer vk.Close()
	e := &throughputEnv{callers: envInt(b, "RLFN_BENCH_CALLERS", defaultCallers), vk: vk,
		lim:    harness.NewLimiter(b, vk, client.Options{Deadline: time.Minute}),
		leased: harness.NewLimiter(b, vk, client.Options{Deadline: time.Minute, BudgetBatch: leaseBatch, BudgetAge: leaseAge})}
	defer e.leased.Close(context.Background())
	bucket := client.TokenBucket{Capacity: perSecond, Rate: perSecond, Period: time.Second}
	background := rlfnOn(e.lim, "rlfn_background", bucket)
	op := background.op
	background.op = func(_ context.Context, p int) error { return op(context.Background(), p) }
	for _, c := range []contender{e.rlfn("rlfn_token_bucket", bucket), background,
		rlfnOn(e.leased, "rlfn_leased", bucket), e.valkeyFcall(), e.incr()} {
		b.Run(c.name, func(b *testing.B) { clientOnly(b, e.callers, c) })
	}
}

// clientOnly is parallel without the server's figures.
func clientOnly(b *testing.B, callers int, c contender) {
	user0, sys0 := clientCPU()
	reads0, writes0, wbytes0 := syscalls()
	var mem0, mem1 runtime.MemStats
	runtime.ReadMemStats(&mem0)
	var (
		calls  atomic.Int64
		failed atomic.Bool
		wg     sync.WaitGroup
	)
	b.ResetTimer()
	for range callers {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(b.Context())
			defer cancel()
			for calls.Add(1) <= int64(b.N) {
				if err := c.op(ctx, rand.IntN(principals)); err != nil && !failed.Swap(true) {
					b.Error(err)
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	runtime.ReadMemStats(&mem1)
	user1, sys1 := clientCPU()
	reads1, writes1, wbytes1 := syscalls()
	n := float64(b.N)
	b.ReportMetric(n/b.Elapsed().Seconds(), "ops/s")
	b.ReportMetric(micros(user1-user0+sys1-sys0)/n, "client-cpu-µs/op")
	b.ReportMetric(micros(sys1-sys0)/n, "client-sys-µs/op")
	b.ReportMetric(float64(mem1.Mallocs-mem0.Mallocs)/n, "client-allocs/op")
	if reads0 >= 0 && reads1 >= 0 {
		b.ReportMetric(float64(reads1-reads0)/n, "client-reads/op")
		b.ReportMetric(float64(writes1-writes0)/n, "client-writes/op")
		b.ReportMetric(float64(wbytes1-wbytes0)/n, "client-write-B/op")
	}
}
