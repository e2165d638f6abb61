package integration_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/internal/override"
)

// BenchmarkOverrideScale measures the overrides at a real SaaS's size, with service processes
// that are processes: a store of RLFN_OVERRIDES overrides (1,000,000 unless set), written as
// rlfn override apply writes a file that large (a new base, by batches, flipped to at once),
// then 8 processes (overrideworker), each with a Limiter and a valkey client of its own,
// started one after another: 4 deciding without pause, 4 idle. Each iteration is one change a
// second by rlfn override set (the CLI, run as a process), timed from its exit. After the
// iterations the idle processes stay idle for RLFN_OVERRIDES_IDLE (1m unless set) before each
// of 2 more changes. A ninth process, without overrides, decides beside them: the control.
// It reports:
//
//   - write-s: the whole store's write; start-first-s: the first process's start (New and
//     SyncOverrides) with every override in force, start-max-s the slowest of the 8 (each
//     later one loads beside those already started); exec-max-s: the slowest from the
//     process's exec to its report (the Go runtime's start and the connection included);
//     B/override, B/override-max: each process's heap after its start, less its heap before,
//     per override (mean and largest of 8); rss-max-MB: the largest process's resident memory;
//
//   - busy-p50-ms, busy-p99-ms, busy-max-ms: from rlfn's exit to the last of the 4 busy
//     processes' overrides holding the change (each looks at its version every 200µs), over
//     every change; every one is then checked to decide with it (bad-busy, want 0);
//
//   - idle-stale: idle processes whose first decision, 100 ms after a change, did not carry
//     it (want 0), of idle-decisions; idle-minute-stale: the same after a minute idle;
//
//   - fallback: decisions of the busy processes decided by the Fallback or failed (want 0),
//     of decisions; control-fallback of control-decisions: the same for the process without
//     overrides (a loaded host's decisions past their Deadline);
//
//   - reads/decision: the store's reads (HGET, HGETALL, HSCAN, HMGET, XRANGE: the library
//     runs none of them) per decision while the changes are made, from INFO commandstats;
//
//   - slow: commands of the override path in the servers' SLOWLOG at a 1 ms threshold, the
//     store's write, the 8 starts and every change included (want 0: each fails the run);
//     slow-fcall and fcall-slowest-us: FCALL's, the decisions' command, as the host's
//     control. Each command's mean over the run (INFO commandstats) and its percentiles
//     (INFO latencystats) are logged.
//
//     go test ./integration_test -run '^$' -bench OverrideScale -benchtime 60x -timeout 60m
//
// RLFN_OVERRIDES_PIN=1 gives the servers the first core and this process, its workers and the
// CLI (which inherit it) the others (taskset), so that a server's command is not measured
// with the time the host's scheduler gave a worker: what a server of its own would log.
//
// RLFN_OVERRIDES_REDIS=1 runs it on Redis 7.0 too.
func BenchmarkOverrideScale(b *testing.B) {
	n := 1_000_000
	if s := os.Getenv("RLFN_OVERRIDES"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	idle := time.Minute
	if s := os.Getenv("RLFN_OVERRIDES_IDLE"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatalf("RLFN_OVERRIDES_IDLE: %v", err)
		}
		idle = d
	}
	bin := b.TempDir()
	for _, pkg := range []string{"github.com/rlfn/rlfn/integration_test/overrideworker", "github.com/rlfn/rlfn/cmd/rlfn"} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			b.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	for _, tg := range servers(b) {
		if tg.name == "redis7.0" && os.Getenv("RLFN_OVERRIDES_REDIS") == "" {
			continue // the same commands; set RLFN_OVERRIDES_REDIS=1 to measure it too
		}
		b.Run(tg.name, func(b *testing.B) { overrideScale(b, tg, n, idle, bin) })
	}
}

// worker is one overrideworker process.
type worker struct {
	mode   string
	cmd    *exec.Cmd
	in     io.WriteCloser
	events chan workerEvent
}

// workerEvent is a line of a worker's output (overrideworker's Event).
type workerEvent struct {
	Event     string  `json:"event"`
	StartNs   int64   `json:"start_ns"`
	HeapB     float64 `json:"heap_b"`
	RSSB      int64   `json:"rss_b"`
	Version   int64   `json:"version"`
	AtNs      int64   `json:"at_ns"`
	OK        bool    `json:"ok"`
	Decisions int64   `json:"decisions"`
	Fallbacks int64   `json:"fallbacks"`
	Err       string  `json:"err"`
}

func startWorker(b *testing.B, bin, mode, addrs, prefix string, n int) *worker {
	b.Helper()
	w := &worker{mode: mode, events: make(chan workerEvent, 256)}
	w.cmd = exec.Command(filepath.Join(bin, "overrideworker"), "-addr", addrs, "-prefix", prefix, "-n", strconv.Itoa(n), "-mode", mode)
	w.cmd.Stderr = os.Stderr
	var err error
	if w.in, err = w.cmd.StdinPipe(); err != nil {
		b.Fatal(err)
	}
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = w.in.Close()
		_ = w.cmd.Process.Kill()
		_ = w.cmd.Wait()
	})
	go func() {
		defer close(w.events)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var e workerEvent
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				e = workerEvent{Event: "error", Err: fmt.Sprintf("%q: %v", sc.Text(), err)}
			}
			w.events <- e
		}
	}()
	return w
}

func (w *worker) send(b *testing.B, line string) {
	b.Helper()
	if _, err := io.WriteString(w.in, line+"\n"); err != nil {
		b.Fatalf("%s worker: %v", w.mode, err)
	}
}

// next is the worker's next event, which must be want.
func (w *worker) next(b *testing.B, want string, timeout time.Duration) workerEvent {
	b.Helper()
	select {
	case e, ok := <-w.events:
		switch {
		case !ok:
			b.Fatalf("%s worker exited: %v", w.mode, w.cmd.Wait())
		case e.Event != want:
			b.Fatalf("%s worker: %+v, want %s", w.mode, e, want)
		}
		return e
	case <-time.After(timeout):
		b.Fatalf("%s worker: no %s in %s", w.mode, want, timeout)
	}
	return workerEvent{}
}

func overrideScale(b *testing.B, tg *target, n int, idle time.Duration, bin string) {
	prefix := keyFor(b) + ":"
	if os.Getenv("RLFN_OVERRIDES_PIN") == "1" {
		pinServers(b)
	}
	nodes := tg.c.Nodes()
	addrs := strings.Join(slices.Sorted(maps.Keys(nodes)), ",")
	// room for every decision the loaded host holds past 1 ms too
	for _, c := range nodes {
		if err := do(b, c, c.B().ConfigSet().ParameterValue().ParameterValue("slowlog-log-slower-than", "1000").
			ParameterValue("slowlog-max-len", "20000").Build()).Error(); err != nil {
			b.Fatal(err)
		}
		if err := do(b, c, c.B().SlowlogReset().Build()).Error(); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		for _, c := range nodes {
			_ = do(b, c, c.B().ConfigSet().ParameterValue().ParameterValue("slowlog-log-slower-than", "10000").
				ParameterValue("slowlog-max-len", "128").Build()).Error()
		}
	})

	// each command's calls and time (µs) over the whole run, every node's: the override
	// path's mean cost per command, beside the outliers the SLOWLOG holds
	cmdstats := func() map[string][2]int64 {
		m := map[string][2]int64{}
		for _, c := range nodes {
			text, _ := do(b, c, c.B().Info().Section("commandstats").Build()).ToString()
			for _, line := range strings.Split(text, "\n") {
				name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
				if !ok || !strings.HasPrefix(name, "cmdstat_") {
					continue
				}
				var calls, usec int64
				for _, kv := range strings.Split(rest, ",") {
					k, v, _ := strings.Cut(kv, "=")
					switch k {
					case "calls":
						calls, _ = strconv.ParseInt(v, 10, 64)
					case "usec":
						usec, _ = strconv.ParseInt(v, 10, 64)
					}
				}
				st := m[strings.TrimPrefix(name, "cmdstat_")]
				m[strings.TrimPrefix(name, "cmdstat_")] = [2]int64{st[0] + calls, st[1] + usec}
			}
		}
		return m
	}
	statsBefore := cmdstats()

	all := make([]override.Override, n)
	for i := range all {
		all[i] = override.Override{Policy: override.Policy{Algorithm: "token_bucket"}, Key: fmt.Sprintf("cust:%d", i),
			Limit: override.Fields{Capacity: 100 + int64(i%50), Rate: 10, Period: "1s"}, Note: "bulk"}
	}
	store := override.NewStore(tg.c, prefix)
	start := time.Now()
	if _, err := store.Replace(context.Background(), all, ""); err != nil {
		b.Fatal(err)
	}
	write := time.Since(start)
	all = nil
	b.Cleanup(func() {
		h, err := store.ReadHead(context.Background())
		if err == nil && h.Gen != "" {
			for i := 0; i < h.Shards; i++ {
				_ = tg.c.Do(context.Background(), tg.c.B().Unlink().Key(override.ShardKey(prefix, h.Gen, i)).Build()).Error()
			}
		}
		_ = tg.c.Do(context.Background(), tg.c.B().Unlink().Key(override.HeadKey(prefix), override.DeltaKey(prefix), override.LogKey(prefix)).Build()).Error()
	})

	// one after another, as processes start on machines of their own: each start has the
	// cores this host has (two, shared with whatever else runs)
	const procs, nbusy = 8, 4
	var workers []*worker
	var starts, execs []time.Duration
	var heap []float64
	var rssMax int64
	for i := 0; i < procs; i++ {
		mode := "busy"
		if i >= nbusy {
			mode = "idle"
		}
		t0 := time.Now()
		w := startWorker(b, bin, mode, addrs, prefix, n)
		e := w.next(b, "ready", 10*time.Minute)
		execs = append(execs, time.Since(t0))
		starts = append(starts, time.Duration(e.StartNs))
		heap = append(heap, e.HeapB)
		rssMax = max(rssMax, e.RSSB)
		workers = append(workers, w)
	}
	control := startWorker(b, bin, "control", addrs, prefix, n)
	control.next(b, "ready", time.Minute)
	busy, idlers := workers[:nbusy], workers[nbusy:]
	for _, w := range append(slices.Clone(busy), control) {
		w.send(b, "go")
	}

	reads := func() (r int64) {
		for _, c := range nodes {
			text, _ := do(b, c, c.B().Info().Section("commandstats").Build()).ToString()
			for _, line := range strings.Split(text, "\n") {
				name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
				if !ok {
					continue
				}
				calls, _ := strconv.ParseInt(strings.Split(rest, ",")[0], 10, 64)
				switch strings.TrimPrefix(name, "cmdstat_") {
				case "hget", "hgetall", "hscan", "hmget", "xrange":
					r += calls
				}
			}
		}
		return r
	}
	counts := func(ws []*worker) (decisions, fallbacks int64) {
		for _, w := range ws {
			w.send(b, "count")
		}
		for _, w := range ws {
			e := w.next(b, "count", time.Minute)
			decisions += e.Decisions
			fallbacks += e.Fallbacks
		}
		return decisions, fallbacks
	}
	h, err := store.ReadHead(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	version := override.VersionNumber(h.Version)
	anyAddr := strings.Split(addrs, ",")[0]

	var took []time.Duration
	badBusy := 0
	// change sets an override with rlfn override set, and is how long after its exit the
	// last busy process held it; idle processes then decide once, 100 ms after the exit
	change := func(i int) (stale int) {
		key := fmt.Sprintf("cust:%d", (i*7919)%n)
		want := 1000 + int64(i)
		version++
		for _, w := range busy {
			w.send(b, fmt.Sprintf("expect %d %s %d", version, key, want))
		}
		cmd := exec.Command(filepath.Join(bin, "rlfn"), "--url", "redis://"+anyAddr, "override", "set", "token_bucket", key,
			"--capacity", strconv.FormatInt(want, 10), "--rate", "10", "--period", "1s", "--note", "change", "--prefix", prefix)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("rlfn override set: %v\n%s", err, out)
		}
		t0 := time.Now()
		var worst time.Duration
		for _, w := range busy {
			e := w.next(b, "seen", 10*time.Second)
			if e.Version != version {
				b.Fatalf("a busy process saw version %d, want %d", e.Version, version)
			}
			worst = max(worst, time.Unix(0, e.AtNs).Sub(t0))
			if !e.OK {
				badBusy++
			}
		}
		took = append(took, worst)
		time.Sleep(100*time.Millisecond - time.Since(t0))
		for _, w := range idlers {
			w.send(b, fmt.Sprintf("probe %d %s %d", version, key, want))
		}
		for _, w := range idlers {
			if e := w.next(b, "probe", time.Minute); !e.OK {
				stale++
				b.Logf("change %d: an idle process at version %d decided without it", i, e.Version)
			}
		}
		return stale
	}

	readsBefore := reads()
	decisionsBefore, _ := counts(busy)
	stale, i := 0, 0
	for b.Loop() {
		i++
		b.StopTimer()
		time.Sleep(time.Second - 100*time.Millisecond) // one change a second
		b.StartTimer()
		stale += change(i)
	}
	b.StopTimer()
	readsAfter := reads()
	decisionsAfter, _ := counts(busy)
	idleStale := 0
	const idleChanges = 2
	for k := 0; k < idleChanges; k++ {
		time.Sleep(idle) // the idle processes decide nothing meanwhile
		i++
		idleStale += change(i)
	}
	dec, fallback := counts(busy)
	controlDec, controlFallback := counts([]*worker{control})

	statsAfter := cmdstats()
	// the servers' latency percentiles of each command (INFO latencystats, since they
	// started: these servers run nothing else meanwhile), the largest of every node's
	tails := map[string]string{}
	for _, c := range nodes {
		text, _ := do(b, c, c.B().Info().Section("latencystats").Build()).ToString()
		for _, line := range strings.Split(text, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
			if name, ok2 := strings.CutPrefix(name, "latency_percentiles_usec_"); ok && ok2 && len(rest) > len(tails[name]) {
				tails[name] = rest
			}
		}
	}
	for _, name := range []string{"hset", "hincrby", "xadd", "hgetall", "hget", "hscan", "xrange", "exec", "fcall", "fcall_ro"} {
		calls, usec := statsAfter[name][0]-statsBefore[name][0], statsAfter[name][1]-statsBefore[name][1]
		if calls > 0 {
			b.Logf("%s: %d calls, %.1f µs each on average; µs %s", strings.ToUpper(name), calls, float64(usec)/float64(calls), tails[name])
		}
	}
	// FCALL, the decisions' command, as the host's control: a command of tens of µs that
	// the SLOWLOG holds at 1 ms was kept from a core, not slow
	slow, slowest, slowFcall, fcallSlowest := 0, int64(0), 0, int64(0)
	for addr, c := range nodes {
		entries, err := do(b, c, c.B().SlowlogGet().Count(20000).Build()).ToArray()
		if err != nil {
			b.Errorf("SLOWLOG GET of %s: %v", addr, err)
		}
		for _, e := range entries {
			fields, _ := e.ToArray()
			if len(fields) < 4 {
				continue
			}
			us, _ := fields[2].AsInt64()
			args, _ := fields[3].AsStrSlice()
			if len(args) > 0 && strings.EqualFold(args[0], "fcall") {
				fcallSlowest = max(fcallSlowest, us)
				if us >= 1000 {
					slowFcall++
				}
			}
			if len(args) < 2 || !strings.Contains(strings.Join(args[1:min(3, len(args))], " "), "%overrides") {
				continue
			}

			slowest = max(slowest, us)
			if us >= 1000 {
				slow++
				if slow <= 20 { // the count and the slowest are in the summary below
					b.Errorf("SLOWLOG %s: %d µs: %.80s", addr, us, strings.Join(args, " "))
				}
			}
		}
	}
	slices.Sort(took)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	var heapSum float64
	for _, h := range heap {
		heapSum += h
	}
	b.ReportMetric(write.Seconds(), "write-s")
	b.ReportMetric(starts[0].Seconds(), "start-first-s")
	b.ReportMetric(slices.Max(starts).Seconds(), "start-max-s")
	b.ReportMetric(slices.Max(execs).Seconds(), "exec-max-s")
	b.ReportMetric(heapSum/float64(len(heap)), "B/override")
	b.ReportMetric(slices.Max(heap), "B/override-max")
	b.ReportMetric(float64(rssMax)/(1<<20), "rss-max-MB")
	b.ReportMetric(ms(took[len(took)/2]), "busy-p50-ms")
	b.ReportMetric(ms(took[len(took)*99/100]), "busy-p99-ms")
	b.ReportMetric(ms(took[len(took)-1]), "busy-max-ms")
	b.ReportMetric(float64(badBusy), "bad-busy")
	b.ReportMetric(float64(stale), "idle-stale")
	b.ReportMetric(float64((i-idleChanges)*len(idlers)), "idle-decisions")
	b.ReportMetric(float64(idleStale), "idle-minute-stale")
	b.ReportMetric(float64(fallback), "fallback")
	b.ReportMetric(float64(dec), "decisions")
	b.ReportMetric(float64(controlFallback), "control-fallback")
	b.ReportMetric(float64(controlDec), "control-decisions")
	b.ReportMetric(float64(readsAfter-readsBefore)/float64(max(decisionsAfter-decisionsBefore, 1)), "reads/decision")
	b.ReportMetric(float64(slow), "slow")
	b.ReportMetric(float64(slowest), "slowest-us")
	b.ReportMetric(float64(slowFcall), "slow-fcall")
	b.ReportMetric(float64(fcallSlowest), "fcall-slowest-us")
	// The figures again, for a run that failed (a failed benchmark prints no metrics).
	b.Logf("%d overrides, %d changes (%d after %s idle), %d decisions, %d store reads while changing; starts %v",
		n, len(took), idleChanges, idle, dec, readsAfter-readsBefore, starts)
	b.Logf("busy p50/p99/max %.1f/%.1f/%.1f ms, bad busy %d; idle stale %d, after a minute %d; fallback %d of %d (control %d of %d); "+
		"%.0f B/override; SLOWLOG at 1 ms: %d of the override path (slowest %d µs), %d FCALL (slowest %d µs)",
		ms(took[len(took)/2]), ms(took[len(took)*99/100]), ms(took[len(took)-1]), badBusy, stale, idleStale,
		fallback, dec, controlFallback, controlDec, heapSum/float64(len(heap)), slow, slowest, slowFcall, fcallSlowest)
	for _, w := range append(workers, control) {
		w.send(b, "stop")
	}
}

// pinServers puts every Valkey and Redis server of the host on CPU 0 and this process (and so
// every process it starts) on the others.
func pinServers(b *testing.B) {
	out, err := exec.Command("pgrep", "-f", "valkey-server|redis-server").Output()
	if err != nil {
		b.Fatalf("pgrep: %v", err)
	}
	pin := func(cpus, pid string) {
		if out, err := exec.Command("taskset", "-a", "-p", "-c", cpus, pid).CombinedOutput(); err != nil {
			b.Fatalf("taskset %s %s: %v\n%s", cpus, pid, err, out)
		}
	}
	for _, pid := range strings.Fields(string(out)) {
		pin("0", pid)
	}
	pin(fmt.Sprintf("1-%d", runtime.NumCPU()-1), strconv.Itoa(os.Getpid()))
}
