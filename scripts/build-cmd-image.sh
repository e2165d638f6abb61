#!/usr/bin/env bash
# Builds the image of one of the repository's commands, FROM scratch holding its static binary:
# rlfn-rls (the rate limit service) or rlfn (the CLI, which the Helm chart's deploy Job runs).
# No registry is reachable, so nothing is pulled. Usage: build-cmd-image.sh COMMAND [TAG], the tag
# rlfn/COMMAND:dev by default, the names the chart's values give. Both images built from one
# work tree are of one version: the release the Job deploys is the one the service embeds.
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:?usage: build-cmd-image.sh rlfn|rlfn-rls [TAG]}
if [ ! -f "cmd/$cmd/Dockerfile" ]; then
	echo "build-cmd-image.sh: cmd/$cmd has no Dockerfile" >&2
	exit 2
fi
tag=${2:-rlfn/$cmd:dev}
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$ctx/$cmd" "./cmd/$cmd"
cp "cmd/$cmd/Dockerfile" "$ctx/"
if [ "$cmd" = rlfn-rls ]; then
	# The reference's path too, a link to the binary: Envoy Gateway's Deployment runs
	# command: [/bin/ratelimit], which replaces the image's entrypoint.
	mkdir "$ctx/bin"
	ln -s /rlfn-rls "$ctx/bin/ratelimit"
fi
docker build -q -t "$tag" "$ctx" >/dev/null
echo "built $tag ($(du -h "$ctx/$cmd" | cut -f1) binary)"
