#!/usr/bin/env bash
# Server cost per rate-limiting decision: each limiter of functions/ratelimit.lua and
# go-redis/redis_rate's GCRA script, same load, same server (see bench/doc.go, docs/COST.md).
#
# For each server binary in $SERVERS (default: valkey-server, and redis-server if installed) it
# starts two servers on free 127.0.0.1 ports, one under callgrind counting only the
# instructions executed inside fcallCommand and evalShaCommand, one plain, and runs
# BenchmarkCost against both: instructions from the first, server µs and memory from the second.
# Prints the tables as markdown, and writes them to $1 if given.
#
#   scripts/bench-cost.sh [out.md]      # make bench-cost
#
# Knobs (environment): SERVERS, and RLFN_BENCH_DECISIONS, _PRINCIPALS, _ROUNDS, _IDLE, _LIBRARY, _ONLY,
# RLFN_CALLGRIND_ROUNDS (bench/doc.go); RLFN_CALLGRIND_KEEP=dir keeps the dumps in dir/<server>/
# for callgrind_annotate --inclusive=yes.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-}
servers=${SERVERS:-valkey-server $(command -v redis-server >/dev/null && echo redis-server)}
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  local port
  for port in $(shuf -i 20000-60000 -n 100); do
    if ! { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  echo "no free port" >&2
  return 1
}

# wait_ping <port> <pid> <seconds>: until the server answers PING (valgrind starts slowly).
wait_ping() {
  local i reply
  for ((i = 0; i < $3 * 5; i++)); do
    kill -0 "$2" 2>/dev/null || { echo "server on port $1 exited" >&2; return 1; }
    if { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null; then
      printf 'PING\r\n' >&3
      reply=
      read -r -t 5 reply <&3 || true
      exec 3<&-
      [[ $reply == +PONG* ]] && return 0
    fi
    sleep 0.2
  done
  echo "server on port $1: no PONG after $3 s" >&2
  return 1
}

# start <name> [wrapper...] -- <server-binary>: starts a server, sets $port and $pid.
start() {
  local name=$1
  shift
  port=$(free_port)
  "$@" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
    >"$work/$name.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  wait_ping "$port" "$pid" 120 || { cat "$work/$name.log" >&2; return 1; }
}

report=$work/report.md
: >"$report"
for server in $servers; do
  bin=$(command -v "$server")
  start "$server-callgrind" valgrind --tool=callgrind --collect-atstart=no \
    --toggle-collect=fcallCommand --toggle-collect=evalShaCommand \
    --callgrind-out-file="$work/$server.callgrind" "$bin"
  cg_port=$port cg_pid=$pid
  start "$server" "$bin"
  echo "== $("$bin" --version): callgrind pid $cg_pid port $cg_port, plain port $port" >&2
  keep=
  if [[ -n ${RLFN_CALLGRIND_KEEP:-} ]]; then
    keep=$RLFN_CALLGRIND_KEEP/$server
    mkdir -p "$keep"
  fi
  RLFN_CALLGRIND_KEEP=$keep RLFN_BENCH_ADDR=127.0.0.1:$port RLFN_CALLGRIND_ADDR=127.0.0.1:$cg_port \
    RLFN_CALLGRIND_PID=$cg_pid RLFN_BENCH_OUT=$work/$server.md \
    go test ./bench -run '^$' -bench Cost -benchtime 1x -count 1 -timeout 0 >&2
  {
    echo "### $("$bin" --version | cut -d' ' -f1-3)"
    echo
    cat "$work/$server.md"
    echo
  } >>"$report"
  for p in "$cg_pid" "$pid"; do
    kill "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  pids=()
done
cat "$report"
if [[ -n $out ]]; then
  cp "$report" "$out"
fi
