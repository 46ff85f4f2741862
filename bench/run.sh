#!/usr/bin/env bash
# The side-by-side benchmark (docs/benchmarks.md): the sidecar, pgbench
# running the sidecar's own SQL and an echo server, in one run; writes
# BENCHMARKS.md and ends with a RATIOS line.
#
#   bash bench/run.sh [--quick] [--build-dir DIR] [--output FILE]
#   bash bench/run.sh --gateway-only [--quick]   the HTTP gateway's row only
#   bash bench/run.sh --cached-only [--quick]    the cached replay against
#                                                the health Check only
#   bash bench/run.sh --help      every flag and environment variable
#
# bench/run.py does the work (Python 3, standard library only); this
# launcher keeps the documented command and finds python3.
set -euo pipefail

python="$(command -v python3 || true)"
if [[ -z "$python" ]]; then
  echo "bench/run.sh: FAILED: python3 not found (bench/run.py runs the" \
    "benchmark)" >&2
  exit 1
fi
exec "$python" "$(dirname "${BASH_SOURCE[0]}")/run.py" "$@"
