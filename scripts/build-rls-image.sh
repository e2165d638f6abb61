#!/usr/bin/env bash
# Builds the rate limit service's image (scripts/build-cmd-image.sh rlfn-rls). The tag is the first
# argument (default rlfn/rlfn-rls:dev).
exec bash "$(dirname "$0")/build-cmd-image.sh" rlfn-rls "$@"
