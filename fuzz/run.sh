#!/usr/bin/env bash
# Longer fuzzing runs (docs/fuzzing.md). Builds the fuzz tree with clang if
# needed, then runs each fuzzer for SECONDS over its seeds, its regressions
# and a work corpus kept in the build tree (so that runs add up).
#   bash fuzz/run.sh                          # every fuzzer, 300 s each
#   bash fuzz/run.sh --seconds 60 validation_fuzzer statemachine_fuzzer
#   bash fuzz/run.sh --jobs 2                 # two fuzzers at a time
# Options: --seconds N, --jobs N (fuzzers at once; default 1), --build-dir
# DIR (default build-fuzz). Crashing inputs land in DIR/fuzz/artifacts/;
# copy a minimised one into fuzz/corpus/regressions/<fuzzer>/ once fixed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds=300
jobs=1
build="$root/build-fuzz"
fuzzers=()
all=(validation_fuzzer statemachine_fuzzer page_token_fuzzer config_fuzzer
  auth_fuzzer redis_codec_fuzzer gateway_config_fuzzer
  gateway_request_fuzzer)

usage() {
  echo "usage: bash fuzz/run.sh [--seconds N] [--jobs N] [--build-dir DIR] [FUZZER...]"
  echo "fuzzers: ${all[*]}"
}

while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --build-dir) build="$(realpath -m "$2")"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    -*) usage >&2; exit 2 ;;
    *) fuzzers+=("$1"); shift ;;
  esac
done
((${#fuzzers[@]})) || fuzzers=("${all[@]}")

cxx="${IDEM_FUZZ_CXX:-clang++-14}"
if ! command -v "$cxx" >/dev/null; then
  echo "$cxx not found: apt-get install clang-14 libclang-rt-14-dev" >&2
  exit 1
fi
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build" -DIDEM_FUZZ=ON -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1"
fi
cmake --build "$build" -j"$(nproc)" --target "${fuzzers[@]}"

run() {
  local f="$1"
  bash "$root/fuzz/run_one.sh" "$build/fuzz/$f" "$seconds" \
    "$build/fuzz/artifacts/$f" "$build/fuzz/corpus/$f" \
    "$root/fuzz/corpus/$f" "$root/fuzz/corpus/regressions/$f"
}
export -f run
export root build seconds

failed=0
printf '%s\n' "${fuzzers[@]}" |
  xargs -P "$jobs" -I{} bash -c 'run {}' || failed=1
exit "$failed"
