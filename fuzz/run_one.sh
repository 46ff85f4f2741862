#!/usr/bin/env bash
# Runs one libFuzzer binary for a while over its corpora (used by the CTest
# tests of fuzz/CMakeLists.txt and by fuzz/run.sh):
#   run_one.sh FUZZER SECONDS ARTIFACT_DIR WORK_CORPUS [CORPUS...]
# New inputs go to WORK_CORPUS (created); the other corpora are only read
# (missing ones are skipped). A crash, a leak, a sanitizer report, a timeout
# or an out-of-memory fails the run and leaves the input in ARTIFACT_DIR.
# Prints one summary line: runs, execs/s, coverage, corpus size.
set -euo pipefail

if (($# < 4)); then
  echo "usage: run_one.sh FUZZER SECONDS ARTIFACT_DIR WORK_CORPUS [CORPUS...]" >&2
  exit 2
fi
fuzzer="$1" seconds="$2" artifacts="$3" work="$4"
shift 4
corpora=("$work")
for dir in "$@"; do
  [[ -d "$dir" ]] && corpora+=("$dir")
done
mkdir -p "$work" "$artifacts"
name="$(basename "$fuzzer")"
log="$artifacts/$name.log"

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:symbolize=1}"
# Debian's llvm-14 installs the symbolizer under a versioned name only.
if [[ -z "${ASAN_SYMBOLIZER_PATH:-}" && -x /usr/bin/llvm-symbolizer-14 ]]; then
  export ASAN_SYMBOLIZER_PATH=/usr/bin/llvm-symbolizer-14
fi
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# A dictionary of the input's syntax, if the fuzzer has one.
dict=()
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[[ -f "$here/dict/$name.dict" ]] && dict=(-dict="$here/dict/$name.dict")

status=0
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len=4096 -print_final_stats=1 -artifact_prefix="$artifacts/" \
  "${dict[@]}" "${corpora[@]}" >"$log" 2>&1 || status=$?

runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
speed="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)"
cov="$( (grep -o 'cov: [0-9]*' "$log" || true) | tail -n 1 | cut -d' ' -f2)"
corpus="$(find "$work" -type f | wc -l)"
printf '%-20s %s runs (max %ss), %s exec/s, cov %s, %s new inputs, exit %d\n' \
  "$name" "${runs:-?}" "$seconds" "${speed:-?}" "${cov:-?}" "$corpus" "$status"
if ((status != 0)); then
  # The report: the sanitizer's or the property's message and the stack.
  grep -Ev '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse|INITED|RELOAD)' "$log" | tail -n 80
  echo "full log: $log; crashing input in $artifacts/" >&2
fi
exit "$status"
