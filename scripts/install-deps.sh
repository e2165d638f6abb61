#!/usr/bin/env bash
# Installs what the images, the demo and the cost benchmark need on Debian bookworm: Valkey 8
# from bookworm-backports, Redis 7.0 from bookworm, valgrind. Uses the machine's own apt
# sources; it only adds the backports suite to them.
set -euo pipefail

sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo

src=/etc/apt/sources.list.d/debian.sources
if [ -f "$src" ] && ! grep -q 'bookworm-backports' "$src"; then
  $sudo sed -i 's/^Suites: bookworm bookworm-updates$/& bookworm-backports/' "$src"
fi
if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  echo "error: add the bookworm-backports suite to your apt sources (Valkey 8 comes from it)" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq -t bookworm-backports valkey-server valkey-tools >/dev/null
$sudo apt-get install -y -qq redis-server valgrind >/dev/null
valkey-server --version
redis-server --version
