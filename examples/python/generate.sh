#!/usr/bin/env bash
# Generates the Python stubs of Sluice's API (proto/sluice/v1/sluice.proto)
# into a directory: OUT/sluice/v1/sluice_pb2.py and sluice_pb2_grpc.py.
#
#   examples/python/generate.sh [OUT]     # OUT defaults to examples/python/gen
#
# Uses protoc from PATH (Debian: protobuf-compiler) and the gRPC Python
# plugin (Debian: protobuf-compiler-grpc, /usr/bin/grpc_python_plugin; set
# GRPC_PYTHON_PLUGIN to use another). See README.md for the versions.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
protos=$(cd "$here/../../proto" && pwd)
out=${1:-$here/gen}

fail() { echo "generate.sh: $*" >&2; exit 2; }

command -v protoc >/dev/null ||
  fail "protoc not found (apt-get install protobuf-compiler)"
plugin=${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin || true)}
[ -n "$plugin" ] && [ -x "$plugin" ] ||
  fail "grpc_python_plugin not found (apt-get install protobuf-compiler-grpc, or set GRPC_PYTHON_PLUGIN)"

# sluice.proto has a proto3 optional field (optional int64 hits): protoc
# 3.15 and later take it, 3.12 to 3.14 only with a flag, older ones not at
# all. After 3.21, protoc numbers itself 22.x, 23.x, ...: those are newer.
version=$(protoc --version | awk '{print $2}')
major=${version%%.*}; major=${major%%[!0-9]*}
minor=${version#*.}; minor=${minor%%.*}; minor=${minor%%[!0-9]*}
flags=()
case $major$minor in *[!0-9]*|'') fail "cannot read protoc's version from: $(protoc --version)" ;; esac
if [ "$major" -lt 3 ] || { [ "$major" = 3 ] && [ "$minor" -lt 12 ]; }; then
  fail "protoc $version is too old for proto3 optional fields: need 3.15 or later (3.12 to 3.14 with a flag)"
elif [ "$major" = 3 ] && [ "$minor" -lt 15 ]; then
  flags+=(--experimental_allow_proto3_optional)
fi

mkdir -p "$out"
protoc -I "$protos" ${flags[@]+"${flags[@]}"} \
  --python_out="$out" \
  --plugin=protoc-gen-grpc_python="$plugin" --grpc_python_out="$out" \
  "$protos/sluice/v1/sluice.proto"
echo "generated $out/sluice/v1/sluice_pb2.py and sluice_pb2_grpc.py (protoc $version)"
