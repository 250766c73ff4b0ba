#!/usr/bin/env bash
# Builds the Sluice image from this checkout: a static binary in a fresh
# build context, then `docker build` on the scratch-based Dockerfile.
# Usage: deploy/docker/build.sh [TAG]
# Without TAG the image is tagged sluice:<version> (the release the source
# says, cmd/sluice/version.go; the chart's default image) and sluice:dev
# (the compose file's default). The binary records the commit it was built
# from (`sluice version`, sluice_build_info) when git is there.
set -euo pipefail
cd "$(dirname "$0")/../.."
version=$(sed -n 's/^const releaseVersion = "\(.*\)"$/\1/p' cmd/sluice/version.go)
if [ -z "$version" ]; then
	echo "build.sh: no releaseVersion in cmd/sluice/version.go" >&2
	exit 1
fi
tags=(-t "${1:-sluice:$version}")
[ $# -gt 0 ] || tags+=(-t sluice:dev)
ldflags='-s -w'
if rev=$(git rev-parse --short HEAD 2>/dev/null); then
	git diff --quiet HEAD 2>/dev/null || rev+=-dirty
	ldflags+=" -X main.revision=$rev"
fi
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
CGO_ENABLED=0 go build -trimpath -ldflags="$ldflags" -o "$ctx/sluice" ./cmd/sluice
mkdir -p "$ctx/data"
cp deploy/docker/Dockerfile "$ctx/Dockerfile"
docker build -q "${tags[@]}" "$ctx"
