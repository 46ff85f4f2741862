#!/usr/bin/env bash
# Builds the project and runs every test with CTest.
#   bash scripts/test.sh              # build/ (RelWithDebInfo)
#   bash scripts/test.sh --sanitize   # build-asan/ with ASan + UBSan
# Installs missing Debian packages first (as root). CTEST_PARALLEL_LEVEL is
# honoured; each test starts the PostgreSQL and Redis servers it needs.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/deps.sh
source "$root/scripts/deps.sh"

usage() { echo "usage: bash scripts/test.sh [--sanitize]"; }

sanitize=0
for arg in "$@"; do
  case "$arg" in
    --sanitize) sanitize=1 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done

idem_install_deps

if ((sanitize)); then
  build_dir="$root/build-asan"
  cmake_args=(-DIDEM_SANITIZE=ON)
  export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
else
  build_dir="$root/build"
  cmake_args=()
fi

cmake -S "$root" -B "$build_dir" "${cmake_args[@]}"
cmake --build "$build_dir" -j"$(nproc)"
ctest --test-dir "$build_dir" --output-on-failure --timeout 600 --no-tests=error
