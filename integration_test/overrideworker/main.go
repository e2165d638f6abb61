// Command overrideworker is one service process of BenchmarkOverrideScale: a Limiter with
// Options.Overrides on a valkey client of its own, in a process of its own, driven by the
// benchmark through standard input and reporting on standard output, a JSON object a line.
//
// It starts (New and SyncOverrides, timed) and reports its heap per override, then obeys:
//
//	go                   decide without pause (busy, control), each Allow on the next key
//	expect V KEY WANT    report when this process's overrides reach version V (the wall
//	                     clock, in ns) and whether a decision on KEY then carries the override
//	                     whose limit is WANT (busy)
//	probe V KEY WANT     one decision on KEY now, the first since the last probe, and whether
//	                     it carries the override of WANT (idle)
//	count                report the decisions and fallbacks so far
//	stop                 report them and exit
//
// It is not a test: it is built and run by the benchmark only.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/override"
)

// Event is a line of standard output.
type Event struct {
	Event     string  `json:"event"` // ready, seen, probe, count, error
	StartNs   int64   `json:"start_ns,omitempty"`
	HeapB     float64 `json:"heap_b,omitempty"` // heap per override after the start
	RSSB      int64   `json:"rss_b,omitempty"`  // the process's resident memory after the start
	Version   int64   `json:"version,omitempty"`
	AtNs      int64   `json:"at_ns,omitempty"` // wall clock, Unix ns
	OK        bool    `json:"ok,omitempty"`
	Decisions int64   `json:"decisions,omitempty"`
	Fallbacks int64   `json:"fallbacks,omitempty"`
	Err       string  `json:"err,omitempty"`
}

func main() {
	addrs := flag.String("addr", "", "the server's nodes, comma-separated")
	prefix := flag.String("prefix", "rl:", "the Limiters' prefix")
	n := flag.Int("n", 1_000_000, "the overrides of the store: keys cust:0 to cust:<n-1>")
	mode := flag.String("mode", "busy", "busy, idle or control (a Limiter without overrides)")
	flag.Parse()
	out := json.NewEncoder(os.Stdout)
	var mu sync.Mutex // the watcher and the commands both report
	say := func(e Event) {
		mu.Lock()
		defer mu.Unlock()
		if err := out.Encode(e); err != nil {
			os.Exit(1)
		}
	}
	fail := func(err error) {
		say(Event{Event: "error", Err: err.Error()})
		os.Exit(1)
	}

	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: strings.Split(*addrs, ",")})
	if err != nil {
		fail(err)
	}
	defer vk.Close()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	t0 := time.Now()
	lim, err := client.New(vk, client.Options{Prefix: *prefix, Overrides: *mode != "control", Fallback: client.FailOpen})
	if err != nil {
		fail(err)
	}
	if *mode != "control" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		err := lim.SyncOverrides(ctx)
		cancel()
		if err != nil {
			fail(err)
		}
	}
	start := time.Since(t0)
	runtime.GC()
	runtime.ReadMemStats(&after)
	say(Event{Event: "ready", StartNs: int64(start), HeapB: float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(*n), RSSB: rss()})

	limit := client.Limit(client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Hour})
	var decisions, fallbacks atomic.Int64
	carries := func(key string, want int64) bool {
		res, err := lim.Allow(context.Background(), key, limit)
		return err == nil && res.Override != nil && res.Override.Limit.Quota().Limit == want
	}
	type expect struct {
		v, want int64
		key     string
	}
	expects := make(chan expect, 1024)
	if *mode == "busy" {
		// the watcher: the time this process's overrides reach each version, looked at every
		// 200µs (what the next decision decides with), then a decision on the changed key
		go func() {
			seen := map[int64]int64{}
			last := override.VersionNumber(lim.OverridesVersion())
			var pending []expect
			for {
				if v := override.VersionNumber(lim.OverridesVersion()); v > last {
					now := time.Now().UnixNano()
					for ; last < v; last++ {
						seen[last+1] = now
					}
				}
			drain:
				for {
					select {
					case e := <-expects:
						pending = append(pending, e)
					default:
						break drain
					}
				}
				kept := pending[:0]
				for _, e := range pending {
					if at, ok := seen[e.v]; ok {
						say(Event{Event: "seen", Version: e.v, AtNs: at, OK: carries(e.key, e.want)})
					} else {
						kept = append(kept, e)
					}
				}
				pending = kept
				time.Sleep(200 * time.Microsecond)
			}
		}()
	}

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "go":
			go func() {
				ctx := context.Background()
				for j := 0; ; j++ {
					res, err := lim.Allow(ctx, "cust:"+strconv.Itoa(j%*n), limit)
					decisions.Add(1)
					if err != nil || res.Source == client.FromFallback {
						fallbacks.Add(1)
					}
				}
			}()
		case "expect", "probe":
			if len(f) != 4 {
				fail(fmt.Errorf("%q: want %s V KEY WANT", in.Text(), f[0]))
			}
			v, _ := strconv.ParseInt(f[1], 10, 64)
			want, _ := strconv.ParseInt(f[3], 10, 64)
			if f[0] == "expect" {
				expects <- expect{v: v, key: f[2], want: want}
				continue
			}
			ok := carries(f[2], want)
			say(Event{Event: "probe", Version: override.VersionNumber(lim.OverridesVersion()), OK: ok})
		case "count", "stop":
			say(Event{Event: "count", Decisions: decisions.Load(), Fallbacks: fallbacks.Load()})
			if f[0] == "stop" {
				_ = lim.Close(context.Background())
				return
			}
		default:
			fail(fmt.Errorf("unknown command %q", in.Text()))
		}
	}
}

// rss is the process's resident memory, from /proc (0 where there is none).
func rss() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
