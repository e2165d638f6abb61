// Package bench measures what one rate-limiting decision costs the server, for each limiter of
// the ratelimit library and, as the yardstick, for go-redis/redis_rate's own GCRA script.
//
// Its first benchmark, BenchmarkCost (cost_test.go), is run explicitly:
//
//	go test ./bench -run '^$' -bench Cost -benchtime 1x -timeout 0
//
// or end to end, with the server under callgrind, by scripts/bench-cost.sh (make bench-cost).
// `go test ./...` runs only the package's small parser tests: it starts no server.
//
// Every algorithm gets the same load: a fixed number of sequential decisions spread round-robin
// over a fixed set of principals (keys), with a limit of 100 units per hour, so every decision
// is admitted (the write path) and the state each decision reads was written by the previous
// one, whatever the speed of the server (a server under callgrind is some 50 times slower; with
// a one-second limit its state would expire between calls and it would run another path). Our
// limiters are called with FCALL through valkey-go, redis_rate through its own Limiter.Allow
// (EVALSHA through go-redis), on the same server, with the same key names.
//
// For each algorithm it records:
//
//   - instructions per decision: the server runs under
//     valgrind --tool=callgrind --collect-atstart=no --toggle-collect=fcallCommand
//     --toggle-collect=evalShaCommand, so only instructions executed inside those two command
//     handlers (the script with everything it calls) are counted; the counters are zeroed with
//     callgrind_control -z before an algorithm's load and dumped with callgrind_control -d after
//     it, and the dump's total Ir is divided by the decisions. These repeat run to run.
//   - server microseconds per decision: CONFIG RESETSTAT before the load, then usec/calls of
//     cmdstat_fcall or cmdstat_evalsha from INFO commandstats, the median over several rounds.
//   - bytes per idle principal: after FLUSHALL, used_memory (INFO memory) before and after one
//     admitted decision on each of many fresh principals, divided by their number; and MEMORY
//     USAGE of one of those keys.
//
// Environment:
//
//	RLFN_BENCH_ADDR        server for the microseconds and the memory (host:port); unset: a
//	                       Valkey 8 container from the harness, or Redis 7.0 when
//	                       RLFN_BENCH_SERVER is redis-server
//	RLFN_CALLGRIND_PID     pid of a server run under callgrind as above: count instructions
//	RLFN_CALLGRIND_ADDR    its address (default RLFN_BENCH_ADDR: one server for everything)
//	RLFN_CALLGRIND_OUT     its --callgrind-out-file (default: read from /proc/PID/cmdline)
//	RLFN_CALLGRIND_KEEP    keep each dump there as <algorithm>.<round>.callgrind (for
//	                       callgrind_annotate --inclusive=yes); unset: dumps are removed
//	RLFN_BENCH_DECISIONS   decisions per algorithm and round (default 20000)
//	RLFN_BENCH_PRINCIPALS  principals they are spread over (default 1000)
//	RLFN_BENCH_ROUNDS      rounds for the microseconds (default 5)
//	RLFN_CALLGRIND_ROUNDS  rounds under callgrind (default 2)
//	RLFN_BENCH_IDLE        principals for the memory figure (default 10000)
//	RLFN_BENCH_OUT         also write the markdown table to this file
//	RLFN_BENCH_LIBRARY     the library source to load (default: the working copy), a path
//	                       absolute or relative to bench/ (go test runs there), e.g.
//	                       ../versions/1.1.0/ratelimit.lua to compare a release with the working
//	                       copy; rows calling functions it lacks are left out
//	RLFN_BENCH_ONLY        measure only these rows (comma-separated names, e.g.
//	                       fixed_window,hold_fixed_window), and redis_rate: a quick look at
//	                       a change; the tables then lack the comparisons of the rows left out
//
// BenchmarkThroughput (throughput_test.go) measures what a service sees: rlfn's Allow (a token
// bucket through client.New on valkey-go), go-redis/redis_rate's Allow and a plain INCR through
// valkey-go, side by side against one Valkey 8 that the benchmark starts through the harness
// (Docker, 127.0.0.1), each from 64 goroutines over 10,000 principals, every decision admitted.
// Each reports ops/s, p50 and p99 latency, and the server's and this process's CPU time per
// call, which say which side limits the throughput when both share the machine.
// BenchmarkThroughput also runs rlfn_leased, the same token bucket with leased budgets
// (client.Options{BudgetBatch: 256, BudgetAge: 50ms}), which must not be slower when no key is hot; each
// contender reports server-calls/op and server-calls/s too. BenchmarkHotKey calls one key from
// 64 goroutines with one call per decision, with leased budgets, and with redis_rate, and checks
// the server's count after each rlfn run (over-admitted, which must be 0);
// BenchmarkSharedBucket runs four Limiters with leased budgets on one token bucket whose
// demand is far above its rate, and reports admitted/allowance (admitted against Capacity +
// Rate x the run's duration); BenchmarkUnderAttack hammers one exhausted key, with and
// without the denial cache (client.Options.DenialCache), whose server-calls/s is what the attack
// costs the server. `make bench-throughput` runs all four.
// BenchmarkThroughputAlgorithms does the same for every limiter of the library. -count would
// run each contender's rounds back to back; separate runs interleave them, so that a busy
// spell of the machine does not fall on one contender only:
//
//	for i in 1 2 3 4 5 6; do go test ./bench -run '^$' -bench 'Throughput$' -count 1 -timeout 0; done | tee throughput.txt
//	go run golang.org/x/perf/cmd/benchstat@latest throughput.txt  # optional; 6 runs give it a confidence interval
//
// Environment (each applies to the valkey-go client of both rlfn and INCR, or to every
// contender for the callers):
//
//	RLFN_BENCH_CALLERS      concurrent goroutines (default 64)
//	RLFN_BENCH_FLUSH_DELAY  valkey-go's MaxFlushDelay, e.g. 20us (default 0)
//	RLFN_BENCH_MULTIPLEX    valkey-go's PipelineMultiplex; -1 for one connection (default:
//	                        valkey-go's, 2 connections with GOMAXPROCS 2, 4 from 4)
package bench
