#!/usr/bin/env bash
# make playground: a throwaway Valkey on a free loopback port, the library deployed with rlfn,
# and the playground page served for it until Ctrl-C, which removes the server. Needs the
# rlfn/valkey:8.0 image (make images) and Go.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/throwaway.sh
port=$(free_port 16379)
serve "$port"
export RLFN_URL=redis://127.0.0.1:$port
for _ in $(seq 100); do
  "$work/rlfn" status >/dev/null 2>&1 && break
  sleep 0.1
done
"$work/rlfn" deploy --yes
echo
echo "A throwaway Valkey on 127.0.0.1:$port with the library; Ctrl-C stops the page and removes it."
# Not exec: the trap must still remove the server when the page stops.
"$work/rlfn" playground --listen "${RLFN_PLAYGROUND_LISTEN:-127.0.0.1:$(free_port 8080)}"
