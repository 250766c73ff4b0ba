#!/usr/bin/env bash
# Builds the Sluice image from this checkout: a static binary in a fresh
# build context, then `docker build` on the scratch-based Dockerfile.
# Usage: deploy/docker/build.sh [TAG]   (default sluice:dev)
set -euo pipefail
cd "$(dirname "$0")/../.."
tag=${1:-sluice:dev}
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$ctx/sluice" ./cmd/sluice
mkdir -p "$ctx/data"
cp deploy/docker/Dockerfile "$ctx/Dockerfile"
docker build -q -t "$tag" "$ctx"
