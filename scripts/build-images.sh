#!/usr/bin/env bash
# Builds rlfn/valkey:8.0 and rlfn/redis:7.0 from the servers installed on this
# host: no registry is reachable, so each image is FROM scratch holding the
# binary plus every library ldd lists. No ENTRYPOINT: the harness passes the
# full command ("valkey-server --port ..."), which the official images accept
# too, so RLFN_VALKEY_IMAGE/RLFN_REDIS_IMAGE can point at either.
set -euo pipefail

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT

build() { # build <tag> <server-name> <install-hint>
  local tag=$1 name=$2 hint=$3 bin dir=$ctx/$2
  bin=$(command -v "$name") || {
    echo "error: $name not found; $hint" >&2
    exit 1
  }
  mkdir -p "$dir/rootfs/usr/local/bin"
  # -L: the Debian binary is a symlink to *-check-rdb and picks its mode from
  # argv[0], so it must be copied under its server name.
  cp -L "$bin" "$dir/rootfs/usr/local/bin/$name"
  # Every absolute path ldd prints: the libraries and the dynamic loader.
  ldd "$bin" | grep -o '/[^ ]*' | while read -r lib; do
    mkdir -p "$dir/rootfs$(dirname "$lib")"
    cp -L "$lib" "$dir/rootfs$lib"
  done
  printf '%s\n' 'FROM scratch' 'COPY rootfs/ /' 'ENV PATH=/usr/local/bin' \
    'WORKDIR /data' >"$dir/Dockerfile"
  docker build -q -t "$tag" "$dir" >/dev/null
  echo "built $tag: $("$bin" --version)"
}

build rlfn/valkey:8.0 valkey-server \
  'install valkey-server from bookworm-backports: apt-get install -t bookworm-backports valkey-server'
build rlfn/redis:7.0 redis-server 'install it: apt-get install redis-server'
