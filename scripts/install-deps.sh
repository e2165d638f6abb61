#!/usr/bin/env bash
# Installs what the images, the demo, the tests and the cost benchmark need on Debian bookworm:
# Valkey 8 from bookworm-backports, Redis 7.0, valgrind, Chromium (the playground's browser
# test) and the system's tzdata (the calendar tests compare Go's embedded zones with it) from
# bookworm. Uses the machine's own apt sources; it only adds the backports suite to
# them. With --if-missing it does nothing when every program is already there, so that
# `make demo` and `make test` can run it on every invocation.
set -euo pipefail

if [ "${1:-}" = --if-missing ]; then
  missing=0
  for prog in valkey-server redis-server valgrind chromium; do
    command -v "$prog" >/dev/null || missing=1
  done
  [ -f /usr/share/zoneinfo/Europe/Berlin ] || missing=1
  [ "$missing" = 1 ] || exit 0
  echo "installing what is missing (Valkey 8, Redis 7.0, valgrind, Chromium, tzdata) from Debian's packages..."
fi

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
$sudo apt-get install -y -qq redis-server valgrind chromium fonts-dejavu-core tzdata >/dev/null
valkey-server --version
redis-server --version
chromium --version 2>/dev/null | grep -i chromium
