#!/usr/bin/env bash
# make playground: a throwaway Valkey on a free loopback port, the library deployed with rlfn,
# and the playground page served for it until Ctrl-C, which removes the server. Needs the
# rlfn/valkey:8.0 image (make images) and Go. RLFN_DEMO_PORT and RLFN_PLAYGROUND_PORT choose
# the ports (see throwaway.sh); RLFN_PLAYGROUND_LISTEN, host:port, the page's whole address.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/throwaway.sh
valkey=$(port RLFN_DEMO_PORT 16379)
listen=${RLFN_PLAYGROUND_LISTEN:-}
if [ -z "$listen" ]; then
  listen=127.0.0.1:$(port RLFN_PLAYGROUND_PORT 8080)
fi
serve "$valkey"
export RLFN_URL=redis://127.0.0.1:$valkey
for _ in $(seq 100); do
  "$work/rlfn" status >/dev/null 2>&1 && break
  sleep 0.1
done
"$work/rlfn" deploy --yes
echo
echo "A throwaway Valkey on 127.0.0.1:$valkey with the library; Ctrl-C stops the page and removes it."
# Not exec: the trap must still remove the server when the page stops.
"$work/rlfn" playground --listen "$listen"
