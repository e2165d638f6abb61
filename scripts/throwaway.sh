# Sourced by demo.sh and playground.sh: rlfn built into a temporary folder ($work/rlfn), and
# throwaway Valkey servers on free loopback ports, removed with that folder when the script
# exits. Needs the rlfn/valkey:8.0 image (make images) and Go.
#
# Ports (environment or make variables, e.g. make demo RLFN_DEMO_PORT=17000):
#   RLFN_DEMO_PORT        the throwaway Valkey's port (make demo's replica takes the next free
#                         one); default: the first free port from 16379
#   RLFN_PLAYGROUND_PORT  make playground's page; default: the first free port from 8080

image=${RLFN_VALKEY_IMAGE:-rlfn/valkey:8.0}
work=$(mktemp -d)
go build -o "$work/rlfn" ./cmd/rlfn
ids=()
cleanup() {
  if [ ${#ids[@]} -gt 0 ]; then docker rm -f "${ids[@]}" >/dev/null; fi
  rm -rf "$work"
}
trap cleanup EXIT

# free_port prints a loopback port nothing listens on, from $1 up.
free_port() {
  local port=$1
  while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
  echo "$port"
}
# port VAR DEFAULT prints the port $VAR names, which must be free (a port asked for is that
# port, or an error, never another one), or without $VAR the first free one from DEFAULT.
port() {
  local name=$1 want=${!1:-}
  if [ -z "$want" ]; then
    free_port "$2"
    return
  fi
  if ! [[ $want =~ ^[0-9]+$ ]] || [ "$want" -lt 1 ] || [ "$want" -gt 65535 ]; then
    echo "error: $name=$want is not a port (1 to 65535)" >&2
    return 1
  fi
  if (exec 3<>"/dev/tcp/127.0.0.1/$want") 2>/dev/null; then
    echo "error: $name=$want: something already listens on 127.0.0.1:$want; choose another port, or unset $name for a free one" >&2
    return 1
  fi
  echo "$want"
}
# serve PORT [ARGS...] starts a Valkey on PORT. Host networking, bound to loopback: nothing
# leaves the machine.
serve() {
  ids+=("$(docker run -d --rm --network host "$image" \
    valkey-server --bind 127.0.0.1 --port "$1" --save '' --appendonly no "${@:2}")")
}

export NO_COLOR=1
# Debian's Valkey 8.0.1 predates the October 2025 Lua fixes by its version number: rlfn warns
# about it and would exit 4. These are throwaway servers on loopback, so the warning is
# reviewed and accepted here, by its ID: it is still printed.
export RLFN_ACCEPT_WARNINGS=lua-security
