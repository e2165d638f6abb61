#!/usr/bin/env bash
# make playground: a throwaway Valkey on a free loopback port, the library deployed with rlfn,
# and the playground page served for it until Ctrl-C, which removes the server. Needs the
# rlfn/valkey:8.0 image (make images) and Go.
set -euo pipefail
cd "$(dirname "$0")/.."

image=${RLFN_VALKEY_IMAGE:-rlfn/valkey:8.0}
work=$(mktemp -d)
go build -o "$work/rlfn" ./cmd/rlfn
id=""
cleanup() {
  if [ -n "$id" ]; then docker rm -f "$id" >/dev/null; fi
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  local port=$1
  while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
  echo "$port"
}
port=$(free_port 16379)
# Host networking, bound to loopback: nothing leaves the machine.
id=$(docker run -d --rm --network host "$image" \
  valkey-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no)
export RLFN_URL=redis://127.0.0.1:$port NO_COLOR=1
# Debian's Valkey 8.0.1 predates the October 2025 Lua fixes by its version number: rlfn warns
# about it and would exit 4. These are throwaway servers on loopback, so the warning is
# reviewed and accepted here, by its ID: it is still printed.
export RLFN_ACCEPT_WARNINGS=lua-security
for _ in $(seq 100); do
  "$work/rlfn" status >/dev/null 2>&1 && break
  sleep 0.1
done
"$work/rlfn" deploy --yes
echo
echo "A throwaway Valkey on 127.0.0.1:$port with the library; Ctrl-C stops the page and removes it."
# Not exec: the trap must still remove the server when the page stops.
"$work/rlfn" playground --listen "${RLFN_PLAYGROUND_LISTEN:-127.0.0.1:$(free_port 8080)}"
