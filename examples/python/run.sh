#!/usr/bin/env bash
# Runs the Python walkthrough against a sidecar: examples/python/run.sh HOST:PORT
#
# Needs Debian's python3-grpcio (with python3-protobuf), protoc
# (protobuf-compiler) and grpc_python_plugin (protobuf-compiler-grpc); or
# python3-grpc-tools instead of the last two. The gRPC stubs are generated from
# proto/ into a temporary directory that is removed on exit.
set -euo pipefail

if (($# != 1)); then
  echo "usage: $0 HOST:PORT" >&2
  exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
proto_dir="$(cd "$here/../../proto" && pwd)"

# The first interpreter that has grpc: $PYTHON, then python3 on PATH, then
# Debian's own (a pyenv or venv python3 on PATH does not see Debian packages).
python=""
for candidate in "${PYTHON:-}" python3 /usr/bin/python3; do
  if [[ -n "$candidate" ]] &&
      "$candidate" -c 'import grpc, google.protobuf' 2>/dev/null; then
    python="$candidate"
    break
  fi
done
if [[ -z "$python" ]]; then
  echo "error: no python3 with the grpc module; install python3-grpcio" >&2
  exit 1
fi

gen="$(mktemp -d "${TMPDIR:-/tmp}/idem-py-stubs.XXXXXX")"
trap 'rm -rf "$gen"' EXIT

# protoc must find google/protobuf/*.proto (shipped with libprotobuf-dev or
# protobuf-compiler in /usr/include).
includes=(-I "$proto_dir")
[[ -d /usr/include/google/protobuf ]] && includes+=(-I /usr/include)
if command -v protoc >/dev/null && command -v grpc_python_plugin >/dev/null; then
  protoc "${includes[@]}" --python_out="$gen" --grpc_python_out="$gen" \
    --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" \
    idempotency/v1/idempotency.proto
elif "$python" -c 'import grpc_tools' 2>/dev/null; then
  "$python" -m grpc_tools.protoc "${includes[@]}" --python_out="$gen" \
    --grpc_python_out="$gen" idempotency/v1/idempotency.proto
else
  echo "error: cannot generate the Python stubs; install protobuf-compiler" \
    "and protobuf-compiler-grpc (or python3-grpc-tools)" >&2
  exit 1
fi

PYTHONPATH="$gen:$here${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1 \
  "$python" "$here/walkthrough.py" "$1"
