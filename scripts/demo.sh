#!/usr/bin/env bash
# The quick start: a throwaway Valkey primary and replica, the library deployed with rlfn, then
# every algorithm called through rlfn until it denies. Needs the rlfn/valkey:8.0 image
# (make images) and Go.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/throwaway.sh
primary=$(port RLFN_DEMO_PORT 16379)
serve "$primary" --repl-diskless-sync-delay 0
replica=$(free_port $((primary + 1)))
serve "$replica" --replicaof 127.0.0.1 "$primary"

export RLFN_URL=redis://127.0.0.1:$primary
rlfn() {
  echo
  echo "\$ rlfn $*"
  "$work/rlfn" "$@"
}
# Wait until the replica has linked to its primary, so that rlfn finds both.
for _ in $(seq 100); do
  "$work/rlfn" status --json 2>/dev/null | grep -q '"role": "replica"' && break
  sleep 0.1
done

rlfn versions
rlfn status
rlfn deploy --yes
rlfn status
rlfn call token_bucket user:42 --capacity 3 --rate 1 --period 1s --repeat 4
rlfn call sliding_window user:42 --limit 3 --window 10s --repeat 4
rlfn call leaky_bucket user:42 --capacity 3 --rate 10 --period 1s --mode shape --repeat 4
rlfn call token_bucket user:42 --capacity 3 --rate 1 --period 1s --peek --json
# Library 1.1.0: a reserve kept for critical callers, a refund, a concurrency lease, and
# several limits in one decision.
rlfn call fixed_window shop:7 --limit 5 --window 1m --reserve 2 --repeat 4
rlfn call fixed_window shop:7 --limit 5 --window 1m --reserve 2 --critical
rlfn call fixed_window shop:7 --limit 5 --window 1m --refund 3
rlfn call concurrency user:42 --limit 1 --lease 30s --id worker-1
rlfn call concurrency user:42 --limit 1 --lease 30s --id worker-2
rlfn call concurrency user:42 --limit 1 --lease 30s --id worker-1 --release
rlfn call sliding_window user:7 --limit 100 --window 1m \
  --also token_bucket,name=burst,capacity=2,rate=1,period=1s \
  --also fixed_window,key=global,limit=1000,window=1s --repeat 3
# A second deploy has nothing to do, and the exit codes say so to a script.
rlfn diff --exit-code
echo
echo "A bad limit is refused before anything is sent (exit code 1):"
if "$work/rlfn" call token_bucket user:42 --capacity 3 --rate 0 --period 1s; then exit 1; fi
echo
echo "The demo removes its servers as it ends. To run a Valkey of your own, deploy the library on it and"
echo "open the playground, where the seven limiters decide in a browser (Ctrl-C stops the page):"
echo
echo "  docker run -d --name rlfn-valkey --network host $image valkey-server --bind 127.0.0.1 --port 6379 --save ''"
echo "  go run ./cmd/rlfn --url redis://127.0.0.1:6379 deploy --yes --accept-warning lua-security"
echo "  go run ./cmd/rlfn --url redis://127.0.0.1:6379 playground"
echo "  docker rm -f rlfn-valkey   # when done"
echo
echo "Or all in one, on free loopback ports: make playground (RLFN_DEMO_PORT and RLFN_PLAYGROUND_PORT choose them)."
