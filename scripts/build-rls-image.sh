#!/usr/bin/env bash
# Builds the rate limit service's image, FROM scratch holding the static binary of
# cmd/rlfn-rls: no registry is reachable, so nothing is pulled. The tag is the first argument
# (default rlfn/rlfn-rls:dev).
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-rlfn/rlfn-rls:dev}
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$ctx/rlfn-rls" ./cmd/rlfn-rls
cp cmd/rlfn-rls/Dockerfile "$ctx/"
docker build -q -t "$tag" "$ctx" >/dev/null
echo "built $tag ($(du -h "$ctx/rlfn-rls" | cut -f1) binary)"
