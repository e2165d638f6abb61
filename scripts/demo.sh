#!/usr/bin/env bash
# The quick start: a throwaway Valkey, the library loaded, every algorithm admitting then
# denying. Needs the rlfn/valkey:8.0 image (make images) and valkey-cli.
set -euo pipefail
cd "$(dirname "$0")/.."

image=${RLFN_VALKEY_IMAGE:-rlfn/valkey:8.0}
# Host networking, bound to loopback: the server sees its clients as local.
port=16379
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
id=$(docker run -d --rm --network host "$image" \
  valkey-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no)
trap 'docker rm -f "$id" >/dev/null' EXIT
cli() { valkey-cli -h 127.0.0.1 -p "$port" "$@"; }
for _ in $(seq 50); do cli PING >/dev/null 2>&1 && break; sleep 0.1; done

echo "$(cli INFO server | grep -E '^(valkey|redis)_version' | sort -r | head -n1 | tr -d '\r') on 127.0.0.1:$port"
echo "FUNCTION LOAD: library $(cli -x FUNCTION LOAD REPLACE <functions/ratelimit.lua), version $(cli FCALL rl_version 0)"

# show FUNCTION ARGS...: one line per call, the reply's six integers named
show() {
  local fn=$1 key=$2 n=$3
  shift 3
  echo
  echo "FCALL $fn 1 $key $*"
  for i in $(seq "$n"); do
    cli FCALL "$fn" 1 "$key" "$@" | tr '\n' ' ' | awk -v i="$i" '
      NF != 6 { print "  call " i ": " $0; next }
      {
      printf "  call %d: %-7s remaining=%s retry_after_ms=%s reset_after_ms=%s delay_ms=%s\n",
        i, ($1 == 1 ? "allowed" : "DENIED"), $3, $4, $5, $6 }'
  done
}

show rl_fixed_window demo:fixed 4 3 10000 1
show rl_sliding_log demo:log 4 3 10000 1
show rl_sliding_window demo:sliding 4 3 10000 1
show rl_token_bucket demo:tokens 4 3 1 1000 1
show rl_leaky_bucket demo:police 4 3 1 1000 1 police
show rl_leaky_bucket demo:shape 4 3 1 1000 1 shape
echo
echo "A cost above the limit can never be admitted (retry_after_ms = -1):"
show rl_token_bucket demo:tokens 1 3 1 1000 5
echo
echo "A bad argument is refused before anything is written:"
echo "  $(cli FCALL rl_token_bucket 1 demo:tokens 3 1 1000 -1 2>&1)"
