package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/versions"
)

// The load: limit 100 units per hour for every algorithm, one unit per decision. With the
// default 20 decisions per principal every decision is admitted and finds the state its
// predecessor wrote, at any server speed.
const (
	limit    = 100
	periodMS = 3600000
	keyFmt   = "rate:p:%06d" // redis_rate adds "rate:" itself, so both use the same key names
)

var rrLimit = redis_rate.Limit{Rate: limit, Burst: limit, Period: time.Hour}

// algorithm is one row of the table.
type algorithm struct {
	name   string
	stat   string  // the commandstats entry its decisions are counted under
	target float64 // the largest acceptable ratio to redis_rate; 0 for none
	decide func(ctx context.Context, s *server, key string) (bool, error)
	// setup, when set, runs before each round's measured load (after FLUSHALL, not counted):
	// it writes the state the measured calls work on, e.g. what a refund gives back.
	setup func(ctx context.Context, s *server, keys []string) error
	// noMemory leaves the row out of the memory figure: its calls leave no state of one key
	// per principal (a refund, a release, a multi-key call).
	noMemory bool
	// since is the first library version with the functions the row calls: the row is left
	// out when an older library is measured (RLFN_BENCH_LIBRARY), so that one table compares
	// the rows both versions have.
	since string
}

func fcall(fn string, args ...string) func(context.Context, *server, string) (bool, error) {
	return fcallKeys(fn, func(key string) []string { return []string{key} }, args...)
}

// fcallKeys calls fn on the keys a principal's key names, e.g. three limits of one principal
// for rl_multi.
func fcallKeys(fn string, keys func(string) []string, args ...string) func(context.Context, *server, string) (bool, error) {
	return func(ctx context.Context, s *server, key string) (bool, error) {
		ks := keys(key)
		cmd := s.vk.B().Fcall().Function(fn).Numkeys(int64(len(ks))).Key(ks...).Arg(args...).Build()
		r, err := s.vk.Do(ctx, cmd).AsIntSlice()
		if err != nil {
			return false, fmt.Errorf("FCALL %s %s: %w", fn, key, err)
		}
		if len(r) < 6 {
			return false, fmt.Errorf("FCALL %s %s: want 6 integers or more, got %v", fn, key, r)
		}
		return r[0] == 1, nil
	}
}

// leases drives rl_concurrency and rl_concurrency_release: each principal's calls use holder
// ids 0, 1, 2... in turn, so that every acquire takes a new slot and every release frees one.
type leases struct {
	next map[string]int
}

func (l *leases) id(key string) string {
	n := l.next[key]
	l.next[key] = n + 1
	return strconv.Itoa(n)
}

func (l *leases) call(fn string) func(context.Context, *server, string) (bool, error) {
	return func(ctx context.Context, s *server, key string) (bool, error) {
		return fcall(fn, argLimit, argPeriod, l.id(key))(ctx, s, key)
	}
}

// reset starts every principal at id 0; with acquire, it first takes `held` leases per
// principal (what the releases then free).
func (l *leases) reset(held int) func(context.Context, *server, []string) error {
	return func(ctx context.Context, s *server, keys []string) error {
		l.next = map[string]int{}
		for _, key := range keys {
			for i := 0; i < held; i++ {
				if _, err := fcall("rl_concurrency", argLimit, argPeriod, strconv.Itoa(i))(ctx, s, key); err != nil {
					return err
				}
			}
		}
		l.next = map[string]int{}
		return nil
	}
}

// spend takes cost units from every principal's token bucket, for the refunds to give back.
func spend(cost string) func(context.Context, *server, []string) error {
	return func(ctx context.Context, s *server, keys []string) error {
		for _, key := range keys {
			if _, err := fcall("rl_token_bucket", argLimit, argRate, argPeriod, cost)(ctx, s, key); err != nil {
				return err
			}
		}
		return nil
	}
}

func redisRate(ctx context.Context, s *server, key string) (bool, error) {
	res, err := s.rr.Allow(ctx, strings.TrimPrefix(key, "rate:"), rrLimit)
	if err != nil {
		return false, fmt.Errorf("redis_rate Allow %s: %w", key, err)
	}
	return res.Allowed > 0, nil
}

var (
	argLimit  = strconv.Itoa(limit)
	argPeriod = strconv.Itoa(periodMS)
	argRate   = strconv.Itoa(limit) // bucket rate: `limit` units per period, like redis_rate
)

var acquire, release = &leases{}, &leases{}

// holdOn drives rl_hold on a principal's limiter and its hold key: each call takes one unit
// under a new hold id (a request's hold), or with add under one id that every call adds to (a
// stream's next tokens).
func holdOn(add bool, group []string) func(context.Context, *server, string) (bool, error) {
	ids := &leases{next: map[string]int{}}
	return func(ctx context.Context, s *server, key string) (bool, error) {
		id := "stream"
		if !add {
			id = ids.id(key)
		}
		args := append(append([]string{}, group...), id, argPeriod, "0")
		return fcallKeys("rl_hold", keysOf(":lim", ":holds"), args...)(ctx, s, key)
	}
}

// calendarArgs is rl_calendar's arguments for hour-long windows with now in the middle one,
// computed when the benchmark starts (this host's clock is the local server's): the same
// limit and window length as the fixed window's row.
func calendarArgs() []string {
	now := time.Now().UnixMilli()
	b2 := now - now%periodMS
	b := []int64{b2 - periodMS, b2, b2 + periodMS, b2 + 2*periodMS}
	out := []string{argLimit}
	for _, v := range b {
		out = append(out, strconv.FormatInt(v, 10))
	}
	return append(out, "1")
}

func keysOf(suffixes ...string) func(string) []string {
	return func(key string) []string {
		ks := make([]string, len(suffixes))
		for i, s := range suffixes {
			ks[i] = "{" + key + "}" + s
		}
		return ks
	}
}

var (
	fwGroup = []string{"fixed_window", argLimit, argPeriod, "1", "0"}
	tbGroup = []string{"token_bucket", argLimit, argRate, argPeriod, "1", "0"}
)

// The 1.0 rows keep their 1.0 targets; the 1.1 rows (reserve, refund, leases, multi) have
// none: they are reported beside them.
var algorithms = []algorithm{
	{name: "fixed_window", stat: "fcall", target: 0.9, decide: fcall("rl_fixed_window", argLimit, argPeriod, "1")},
	{name: "sliding_log", stat: "fcall", target: 1.6, decide: fcall("rl_sliding_log", argLimit, argPeriod, "1")},
	{name: "sliding_window", stat: "fcall", target: 1.1, decide: fcall("rl_sliding_window", argLimit, argPeriod, "1")},
	{name: "token_bucket", stat: "fcall", target: 1.0, decide: fcall("rl_token_bucket", argLimit, argRate, argPeriod, "1")},
	{name: "leaky_bucket_police", stat: "fcall", target: 1.0, decide: fcall("rl_leaky_bucket", argLimit, argRate, argPeriod, "1", "police")},
	{name: "leaky_bucket_shape", stat: "fcall", target: 1.0, decide: fcall("rl_leaky_bucket", argLimit, argRate, argPeriod, "1", "shape")},
	{name: "token_bucket_reserve", stat: "fcall", decide: fcall("rl_token_bucket", argLimit, argRate, argPeriod, "1", "10")},
	{name: "token_bucket_refund", stat: "fcall", decide: fcall("rl_token_bucket_refund", argLimit, argRate, argPeriod, "1"),
		setup: spend("50"), noMemory: true},
	{name: "concurrency_acquire", stat: "fcall", decide: acquire.call("rl_concurrency"), setup: acquire.reset(0)},
	{name: "concurrency_release", stat: "fcall", decide: release.call("rl_concurrency_release"),
		setup: release.reset(50), noMemory: true},
	{name: multi3, stat: "fcall", decide: fcallKeys("rl_multi",
		func(key string) []string { return []string{key + ":fw", key + ":sw", key + ":tb"} },
		"fixed_window", argLimit, argPeriod, "1", "0",
		"sliding_window", argLimit, argPeriod, "1", "0",
		"token_bucket", argLimit, argRate, argPeriod, "1", "0"), noMemory: true},
	{name: "calendar", stat: "fcall", decide: fcall("rl_calendar", calendarArgs()...), since: "1.2.0"},
	{name: multi2, stat: "fcall", decide: fcallKeys("rl_multi", keysOf(":fw", ":tb"),
		append(append([]string{}, fwGroup...), tbGroup...)...), noMemory: true},
	{name: multi2Block, stat: "fcall", decide: fcallKeys("rl_multi", keysOf(":block", ":fw", ":tb"),
		append(append([]string{"block", "60000"}, fwGroup...), tbGroup...)...), noMemory: true, since: "1.2.0"},
	{name: "hold_fixed_window", stat: "fcall", decide: holdOn(false, fwGroup), noMemory: true, since: "1.3.0"},
	{name: "hold_token_bucket", stat: "fcall", decide: holdOn(false, tbGroup), noMemory: true, since: "1.3.0"},
	{name: "hold_add_token_bucket", stat: "fcall", decide: holdOn(true, tbGroup), noMemory: true, since: "1.3.0"},
	{name: "redis_rate", stat: "evalsha", decide: redisRate},
}

const (
	baseline = "redis_rate"
	// multi3 is rl_multi of a fixed window, a sliding window and a token bucket, compared with
	// those three called one by one.
	multi3 = "multi_fw_sw_tb"
	// multi2 is rl_multi of a fixed window and a token bucket, multi2Block the same with a
	// block group (penalty 60s, never blocked: every decision is admitted) in front of them:
	// what guarding two limits with a block costs.
	multi2      = "multi_fw_tb"
	multi2Block = "multi_fw_tb_block"
)

var multiParts = []string{"fixed_window", "sliding_window", "token_bucket"}

type config struct {
	addr, serverBin        string
	library                string   // RLFN_BENCH_LIBRARY: the library's source, else the working copy
	only                   []string // RLFN_BENCH_ONLY: the rows to measure (and redis_rate); nil for all
	cgPID                  int
	cgAddr, cgOut          string
	decisions, principals  int
	rounds, cgRounds, idle int
	out                    string
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		b.Fatalf("%s=%q: want a non-negative integer", name, v)
	}
	return n
}

func loadConfig(b *testing.B) config {
	c := config{
		addr:       os.Getenv("RLFN_BENCH_ADDR"),
		serverBin:  os.Getenv("RLFN_BENCH_SERVER"),
		cgAddr:     os.Getenv("RLFN_CALLGRIND_ADDR"),
		cgOut:      os.Getenv("RLFN_CALLGRIND_OUT"),
		cgPID:      envInt(b, "RLFN_CALLGRIND_PID", 0),
		decisions:  envInt(b, "RLFN_BENCH_DECISIONS", 20000),
		principals: envInt(b, "RLFN_BENCH_PRINCIPALS", 1000),
		rounds:     envInt(b, "RLFN_BENCH_ROUNDS", 5),
		cgRounds:   envInt(b, "RLFN_CALLGRIND_ROUNDS", 2),
		idle:       envInt(b, "RLFN_BENCH_IDLE", 10000),
		out:        os.Getenv("RLFN_BENCH_OUT"),
		library:    functions.Source,
	}
	if path := os.Getenv("RLFN_BENCH_LIBRARY"); path != "" {
		code, err := os.ReadFile(path)
		if err != nil {
			b.Fatalf("RLFN_BENCH_LIBRARY: %v", err)
		}
		c.library = string(code)
	}
	if v := os.Getenv("RLFN_BENCH_ONLY"); v != "" {
		c.only = append(strings.Split(v, ","), baseline)
		for _, name := range c.only {
			if !slices.ContainsFunc(algorithms, func(a algorithm) bool { return a.name == name }) {
				b.Fatalf("RLFN_BENCH_ONLY: no row %q", name)
			}
		}
	}
	if c.serverBin == "" {
		c.serverBin = "valkey-server"
	}
	if c.cgAddr == "" {
		c.cgAddr = c.addr
	}
	if c.decisions < 1 || c.principals < 1 || c.rounds < 1 || c.cgRounds < 1 {
		b.Fatal("RLFN_BENCH_DECISIONS, _PRINCIPALS, _ROUNDS and RLFN_CALLGRIND_ROUNDS must be at least 1")
	}
	if c.cgPID != 0 && c.cgAddr == "" {
		b.Fatal("RLFN_CALLGRIND_PID needs RLFN_CALLGRIND_ADDR or RLFN_BENCH_ADDR: the address of that server")
	}
	if c.cgPID != 0 && c.cgOut == "" {
		out, err := callgrindOutFile(c.cgPID)
		if err != nil {
			b.Fatal(err)
		}
		c.cgOut = out
	}
	return c
}

// server is one server with a client for each path: valkey-go for FCALL, go-redis (through
// redis_rate) for EVALSHA.
type server struct {
	addr    string
	version string
	library string // the library's version
	vk      valkey.Client
	rr      *redis_rate.Limiter
}

func connect(b *testing.B, addr, library string) *server {
	ctx := b.Context()
	vk, err := valkey.NewClient(valkey.ClientOption{
		InitAddress:      []string{addr},
		DisableCache:     true, // no CLIENT TRACKING: the server does no tracking work
		ConnWriteTimeout: 2 * time.Minute,
	})
	if err != nil {
		b.Fatalf("connect to %s: %v", addr, err)
	}
	b.Cleanup(vk.Close)
	rdb := redis.NewClient(&redis.Options{
		Addr:            addr,
		Protocol:        3,
		DisableIdentity: true,
		ReadTimeout:     2 * time.Minute,
		WriteTimeout:    2 * time.Minute,
	})
	b.Cleanup(func() { rdb.Close() })
	s := &server{addr: addr, vk: vk, rr: redis_rate.NewLimiter(rdb)}

	if err := vk.Do(ctx, vk.B().FunctionLoad().Replace().FunctionCode(library).Build()).Error(); err != nil {
		b.Fatalf("%s: FUNCTION LOAD REPLACE: %v", addr, err)
	}
	if s.library, err = versions.Declared(library); err != nil {
		b.Fatal(err)
	}
	// Load redis_rate's script (its first Allow gets NOSCRIPT and falls back to EVAL) so that
	// every measured call is one EVALSHA; FLUSHALL keeps scripts and functions.
	if _, err := s.rr.Allow(ctx, "warmup", rrLimit); err != nil {
		b.Fatalf("%s: redis_rate warm-up: %v", addr, err)
	}
	info, err := s.info(ctx, "server")
	if err != nil {
		b.Fatal(err)
	}
	if v := info["valkey_version"]; v != "" {
		s.version = "valkey " + v
	} else {
		s.version = "redis " + info["redis_version"]
	}
	return s
}

// startServer starts a throwaway server for the benchmark through the harness: Valkey, or
// Redis when RLFN_BENCH_SERVER names it; removed when the benchmark ends.
func startServer(b *testing.B, which string) string {
	if strings.Contains(which, "redis") {
		return harness.StartRedis(b).Addr
	}
	return harness.StartValkey(b).Addr
}

// info returns the fields of INFO section.
func (s *server) info(ctx context.Context, section string) (map[string]string, error) {
	info, err := harness.Info(ctx, s.vk, section)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.addr, err)
	}
	return info, nil
}

func (s *server) do(ctx context.Context, args ...string) error {
	return s.vk.Do(ctx, s.vk.B().Arbitrary(args...).Build()).Error()
}

// callgrind drives a server running under valgrind --tool=callgrind.
type callgrind struct {
	pid  int
	out  string // --callgrind-out-file; callgrind_control -d writes <out>.<n>
	keep string // directory to keep the dumps in, for callgrind_annotate; "" removes them
}

// callgrindOutFile reads --callgrind-out-file from the valgrind process's command line.
func callgrindOutFile(pid int) (string, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return "", fmt.Errorf("RLFN_CALLGRIND_PID=%d: %w", pid, err)
	}
	var out string
	for _, arg := range strings.Split(string(raw), "\x00") {
		if v, ok := strings.CutPrefix(arg, "--callgrind-out-file="); ok {
			out = v
		}
	}
	if out == "" || strings.Contains(out, "%") {
		return "", fmt.Errorf("RLFN_CALLGRIND_PID=%d: no plain --callgrind-out-file in its command line; set RLFN_CALLGRIND_OUT", pid)
	}
	if !filepath.IsAbs(out) {
		cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		if err != nil {
			return "", err
		}
		out = filepath.Join(cwd, out)
	}
	return out, nil
}

func (cg *callgrind) control(arg string) error {
	out, err := exec.Command("callgrind_control", arg, strconv.Itoa(cg.pid)).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "OK") {
		return fmt.Errorf("callgrind_control %s %d: %v: %s", arg, cg.pid, err, out)
	}
	return nil
}

func (cg *callgrind) dumps() map[string]bool {
	files, _ := filepath.Glob(cg.out + ".*")
	m := map[string]bool{}
	for _, f := range files {
		m[f] = true
	}
	return m
}

// dump asks for a dump and returns its total instruction count (Ir); the dump is kept as
// <keep>/<name>.callgrind if cg.keep is set.
func (cg *callgrind) dump(name string) (int64, error) {
	before := cg.dumps()
	if err := cg.control("-d"); err != nil {
		return 0, err
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for f := range cg.dumps() {
			if before[f] {
				continue
			}
			ir, err := dumpTotal(f)
			if err != nil {
				continue
			}
			if cg.keep != "" {
				err = os.Rename(f, filepath.Join(cg.keep, name+".callgrind"))
			} else {
				err = os.Remove(f)
			}
			return ir, err
		}
	}
	return 0, fmt.Errorf("no new complete dump %s.* after callgrind_control -d", cg.out)
}

// dumpTotal reads the "totals:" (or "summary:") line of a callgrind dump with Ir as its first
// event.
func dumpTotal(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return parseTotal(f)
}

func parseTotal(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var summary, totals string
	events := ""
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "events:"); ok {
			events = strings.TrimSpace(v)
		} else if v, ok := strings.CutPrefix(line, "summary:"); ok {
			summary = strings.TrimSpace(v)
		} else if v, ok := strings.CutPrefix(line, "totals:"); ok {
			totals = strings.TrimSpace(v)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !strings.HasPrefix(events, "Ir") {
		return 0, fmt.Errorf("callgrind dump: events %q, want Ir first", events)
	}
	v := totals
	if v == "" {
		v = summary
	}
	if v == "" {
		return 0, errors.New("callgrind dump: no totals: or summary: line (incomplete?)")
	}
	return strconv.ParseInt(strings.Fields(v)[0], 10, 64)
}

// run is one algorithm's load on one server in one round.
type run struct {
	decisions, admitted int64
	usec                float64 // server µs per decision
	ir                  float64 // instructions per decision; 0 without callgrind
}

// load runs cfg.decisions decisions of a round-robin over cfg.principals fresh principals and
// reads the server's cost of them.
func load(ctx context.Context, s *server, cg *callgrind, a algorithm, cfg config, round int) (run, error) {
	var r run
	if err := s.do(ctx, "FLUSHALL", "SYNC"); err != nil {
		return r, err
	}
	keys := make([]string, cfg.principals)
	for i := range keys {
		keys[i] = fmt.Sprintf(keyFmt, i)
	}
	if a.setup != nil {
		if err := a.setup(ctx, s, keys); err != nil {
			return r, fmt.Errorf("%s: setup: %w", a.name, err)
		}
	}
	if cg != nil {
		if err := cg.control("-z"); err != nil {
			return r, err
		}
	}
	if err := s.do(ctx, "CONFIG", "RESETSTAT"); err != nil {
		return r, err
	}
	for i := 0; i < cfg.decisions; i++ {
		ok, err := a.decide(ctx, s, keys[i%len(keys)])
		if err != nil {
			return r, err
		}
		if ok {
			r.admitted++
		}
	}
	st, err := harness.CommandStats(ctx, s.vk, a.stat)
	if err != nil {
		return r, fmt.Errorf("%s: cmdstat_%s: %w", a.name, a.stat, err)
	}
	if cg != nil {
		ir, err := cg.dump(fmt.Sprintf("%s.%d", a.name, round))
		if err != nil {
			return r, err
		}
		r.ir = float64(ir) / float64(cfg.decisions)
	}
	calls, usec, failed := st.Calls, st.Usec, st.Failed+st.Rejected
	if calls != int64(cfg.decisions) || failed != 0 {
		return r, fmt.Errorf("%s: cmdstat_%s counted %d calls (%d failed), want %d",
			a.name, a.stat, calls, failed, cfg.decisions)
	}
	r.decisions = calls
	r.usec = float64(usec) / float64(calls)
	return r, nil
}

// memory measures the server memory one idle principal holds: one admitted decision on each
// of n fresh principals.
func memory(ctx context.Context, s *server, a algorithm, n int) (perKey float64, usage int64, err error) {
	if err := s.do(ctx, "FLUSHALL", "SYNC"); err != nil {
		return 0, 0, err
	}
	used := func() (int64, error) {
		info, err := s.info(ctx, "memory")
		if err != nil {
			return 0, err
		}
		return strconv.ParseInt(info["used_memory"], 10, 64)
	}
	before, err := used()
	if err != nil {
		return 0, 0, err
	}
	for i := 0; i < n; i++ {
		ok, err := a.decide(ctx, s, fmt.Sprintf(keyFmt, i))
		if err != nil {
			return 0, 0, err
		}
		if !ok {
			return 0, 0, fmt.Errorf("%s: first decision of a fresh principal denied", a.name)
		}
	}
	after, err := used()
	if err != nil {
		return 0, 0, err
	}
	size, err := s.vk.Do(ctx, s.vk.B().Dbsize().Build()).AsInt64()
	if err != nil {
		return 0, 0, err
	}
	if size != int64(n) {
		return 0, 0, fmt.Errorf("%s: %d keys after %d fresh principals (expired during the measurement?)", a.name, size, n)
	}
	usage, err = s.vk.Do(ctx, s.vk.B().MemoryUsage().Key(fmt.Sprintf(keyFmt, 0)).Samples(0).Build()).AsInt64()
	if err != nil {
		return 0, 0, err
	}
	return float64(after-before) / float64(n), usage, nil
}

type result struct {
	ir, usec        []float64 // per round
	admitted, total int64
	bytes           float64
	usage           int64
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// rounds runs every algorithm's load n times, interleaved and in a rotating order so that a
// slow spell of the machine does not fall on one algorithm only.
func rounds(b *testing.B, s *server, cg *callgrind, cfg config, n int, res map[string]*result, keepUsec bool) {
	for round := 0; round < n; round++ {
		for i := range algorithms {
			a := algorithms[(i+round)%len(algorithms)]
			r, err := load(b.Context(), s, cg, a, cfg, round)
			if err != nil {
				b.Fatal(err)
			}
			rr := res[a.name]
			if cg != nil {
				rr.ir = append(rr.ir, r.ir)
			}
			if keepUsec {
				rr.usec = append(rr.usec, r.usec)
				rr.admitted += r.admitted
				rr.total += r.decisions
			}
		}
	}
}

func BenchmarkCost(b *testing.B) {
	cfg := loadConfig(b)
	if cfg.addr == "" {
		cfg.addr = startServer(b, cfg.serverBin)
	}
	plain := connect(b, cfg.addr, cfg.library)
	// rows the measured library lacks are left out of every table, and so are the rows
	// RLFN_BENCH_ONLY does not name
	algorithms = slices.DeleteFunc(slices.Clone(algorithms), func(a algorithm) bool {
		return a.since != "" && versions.Compare(plain.library, a.since) < 0 ||
			cfg.only != nil && !slices.Contains(cfg.only, a.name)
	})
	res := map[string]*result{}
	for _, a := range algorithms {
		res[a.name] = &result{}
	}

	var cgServer *server
	var cg *callgrind
	if cfg.cgPID != 0 {
		cg = &callgrind{pid: cfg.cgPID, out: cfg.cgOut, keep: os.Getenv("RLFN_CALLGRIND_KEEP")}
		cgServer = plain
		if cfg.cgAddr != cfg.addr {
			cgServer = connect(b, cfg.cgAddr, cfg.library)
		}
		// Nothing may be counted outside fcallCommand / evalShaCommand: an idle spell (the
		// event loop and serverCron run) must count zero.
		if err := cg.control("-z"); err != nil {
			b.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		idle, err := cg.dump("idle")
		if err != nil {
			b.Fatal(err)
		}
		if idle != 0 {
			b.Fatalf("callgrind counted %d instructions while the server was idle: start it with --collect-atstart=no --toggle-collect=fcallCommand --toggle-collect=evalShaCommand", idle)
		}
		rounds(b, cgServer, cg, cfg, cfg.cgRounds, res, cgServer == plain)
		for _, a := range algorithms {
			// A script decision is thousands of instructions: less means the toggle missed it.
			if ir := median(res[a.name].ir); ir < 1000 {
				b.Fatalf("%s: %.0f instructions per decision: the callgrind toggle did not capture the script", a.name, ir)
			}
		}
	}
	if cgServer != plain {
		rounds(b, plain, nil, cfg, cfg.rounds, res, true)
	}
	for _, a := range algorithms {
		if a.noMemory {
			continue
		}
		perKey, usage, err := memory(b.Context(), plain, a, cfg.idle)
		if err != nil {
			b.Fatal(err)
		}
		res[a.name].bytes, res[a.name].usage = perKey, usage
	}

	table := report(cfg, plain, cgServer, res)
	fmt.Print("\n" + table + "\n")
	if cfg.out != "" {
		if err := os.WriteFile(cfg.out, []byte(table), 0o644); err != nil {
			b.Fatal(err)
		}
	}

	base := res[baseline]
	for _, a := range algorithms {
		r := res[a.name]
		b.Run(a.name, func(b *testing.B) {
			b.ReportMetric(0, "ns/op")
			if cg != nil {
				b.ReportMetric(median(r.ir), "instr/decision")
				b.ReportMetric(median(r.ir)/median(base.ir), "instr-ratio")
			}
			b.ReportMetric(median(r.usec), "server-us/decision")
			b.ReportMetric(median(r.usec)/median(base.usec), "us-ratio")
			b.ReportMetric(r.bytes, "bytes/idle-principal")
		})
	}
}

// report formats the results as markdown.
func report(cfg config, plain, cgServer *server, res map[string]*result) string {
	var sb strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	base := res[baseline]
	usecNote := ""
	if cgServer == plain {
		usecNote = " (under callgrind: only the ratios mean anything)"
	}
	w("Library %s. Server: %s. Load per algorithm and round: %d decisions round-robin over %d principals, limit %d per %d ms, cost 1.\n",
		plain.library, plain.version, cfg.decisions, cfg.principals, limit, periodMS)
	if cgServer != nil {
		w("Instructions: %s under callgrind, median of %d rounds. ", cgServer.version, cfg.cgRounds)
	}
	w("Server µs: median of %d rounds%s. Memory: %d idle principals.\n\n", len(base.usec), usecNote, cfg.idle)
	w("| algorithm | instructions/decision | ratio | target | met | server µs/decision | ratio | admitted | bytes/idle principal | MEMORY USAGE |\n")
	w("|---|--:|--:|--:|:-:|--:|--:|--:|--:|--:|\n")
	for _, a := range algorithms {
		r := res[a.name]
		irCell, irRatio, target, met := "n/a", "n/a", "", ""
		if cgServer != nil {
			ratio := median(r.ir) / median(base.ir)
			irCell = fmt.Sprintf("%.0f", median(r.ir))
			irRatio = fmt.Sprintf("%.2fx", ratio)
			if a.target > 0 {
				target = fmt.Sprintf("≤ %.1fx", a.target)
				met = "no"
				if ratio <= a.target {
					met = "yes"
				}
			}
		}
		bytes, usage := fmt.Sprintf("%.0f", r.bytes), strconv.FormatInt(r.usage, 10)
		if a.noMemory {
			bytes, usage = "n/a", "n/a"
		}
		w("| %s | %s | %s | %s | %s | %.2f | %.2fx | %.1f%% | %s | %s |\n",
			a.name, irCell, irRatio, target, met, median(r.usec), median(r.usec)/median(base.usec),
			100*float64(r.admitted)/float64(r.total), bytes, usage)
	}
	// rl_multi against the same three limits called one by one (unless RLFN_BENCH_ONLY left
	// one of them out)
	if m := res[multi3]; m != nil && !slices.ContainsFunc(multiParts, func(name string) bool { return res[name] == nil }) {
		var sepIr, sepUsec float64
		for _, name := range multiParts {
			sepIr += median(res[name].ir)
			sepUsec += median(res[name].usec)
		}
		if cgServer != nil {
			w("\n%s: %.0f instructions, %.2fx the %.0f of %s called one by one; ", multi3, median(m.ir),
				median(m.ir)/sepIr, sepIr, strings.Join(multiParts, " + "))
		} else {
			w("\n%s: ", multi3)
		}
		w("%.2f server µs, %.2fx the %.2f of the three calls.\n", median(m.usec), median(m.usec)/sepUsec, sepUsec)
	}
	// 1.2.0's targets: a calendar costs at most 5% more than a fixed window, a block group
	// adds at most 15% to a two-limit rl_multi; 1.3.0's below
	for _, c := range []struct {
		row, base string
		target    float64
	}{{"calendar", "fixed_window", 1.05}, {multi2Block, multi2, 1.15},
		// 1.3.0's: a hold costs at most 1.3x its limiter's plain call
		{"hold_fixed_window", "fixed_window", 1.3}, {"hold_token_bucket", "token_bucket", 1.3},
		{"hold_add_token_bucket", "token_bucket", 1.3}} {
		r, ok := res[c.row]
		if !ok || len(r.usec) == 0 || res[c.base] == nil {
			continue
		}
		if cgServer != nil {
			ratio := median(r.ir) / median(res[c.base].ir)
			met := "no"
			if ratio <= c.target {
				met = "yes"
			}
			w("\n%s: %.0f instructions, %.3fx %s's %.0f (target ≤ %.2fx: %s); ", c.row, median(r.ir), ratio,
				c.base, median(res[c.base].ir), c.target, met)
		} else {
			w("\n%s: ", c.row)
		}
		w("%.2f server µs, %.2fx %s's %.2f.\n", median(r.usec), median(r.usec)/median(res[c.base].usec), c.base, median(res[c.base].usec))
	}
	// eachRound lists each algorithm's figure of every round, to show how much they vary.
	eachRound := func(title, format string, figures func(*result) []float64) {
		w("\n%s, each round:\n\n", title)
		for _, a := range algorithms {
			var v []string
			for _, f := range figures(res[a.name]) {
				v = append(v, fmt.Sprintf(format, f))
			}
			w("- %s: %s\n", a.name, strings.Join(v, ", "))
		}
	}
	if cgServer != nil {
		eachRound("Instructions per decision", "%.0f", func(r *result) []float64 { return r.ir })
	}
	eachRound("Server µs per decision", "%.2f", func(r *result) []float64 { return r.usec })
	return sb.String()
}

func TestParseCommandstats(t *testing.T) {
	info := harness.ParseInfo("txt:# Commandstats\r\ncmdstat_fcall:calls=20000,usec=301234,usec_per_call=15.06,rejected_calls=0,failed_calls=2\r\n")
	st, err := harness.ParseCommandStat(info["cmdstat_fcall"])
	calls, usec, failed := st.Calls, st.Usec, st.Failed+st.Rejected
	if err != nil || calls != 20000 || usec != 301234 || failed != 2 {
		t.Fatalf("cmdstat: %d %d %d %v", calls, usec, failed, err)
	}
	if _, err := harness.ParseCommandStat(""); err == nil {
		t.Fatal("cmdstat of an absent entry: no error")
	}
}

func TestParseCallgrindTotal(t *testing.T) {
	dump := "# callgrind format\nversion: 1\nevents: Ir\nsummary: 9352395\nfn=(1) main\n1 2\ntotals: 9352395\n"
	ir, err := parseTotal(strings.NewReader(dump))
	if err != nil || ir != 9352395 {
		t.Fatalf("parseTotal: %d %v", ir, err)
	}
	if _, err := parseTotal(strings.NewReader("events: Ir\n")); err == nil {
		t.Fatal("parseTotal of an incomplete dump: no error")
	}
}
