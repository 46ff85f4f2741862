#!/usr/bin/env bash
# 1,000 waiting Begins on one key over two sidecars, sent by h2load, and how
# long after Complete each gets its answer (docs/benchmarks.md).
#
#   bash bench/waiters.sh [--waiters N] [--rounds R] [--build-dir DIR]
#   bash bench/waiters.sh --help
#
# bench/waiters.py does the work (Python 3, standard library only).
set -euo pipefail

python="$(command -v python3 || true)"
if [[ -z "$python" ]]; then
  echo "bench/waiters.sh: FAILED: python3 not found" >&2
  exit 1
fi
exec "$python" "$(dirname "${BASH_SOURCE[0]}")/waiters.py" "$@"
