#!/usr/bin/env bash
# Sanitizer CI (docs/fuzzing.md): three trees beside the normal build.
#   asan  build-ci-asan/  clang++-14, ASan+UBSan (-fno-sanitize-recover=all), every
#                         CTest test except those labelled `deploy` and the
#                         Citus variants of the pgtests; the
#                         fault suite (faults_quick, faults_bouncer_quick,
#                         faults_quick_citus, faults_patroni, faults_citus)
#                         alone after the others.
#                         Before the tests, clang-tidy (.clang-tidy,
#                         scripts/clang-tidy.sh) over the sources of
#                         IDEM_TIDY_PATHS (default: server client common
#                         statemachine) with this tree's compile_commands.json
#   tsan  build-ci-tsan/  clang++-14, ThreadSanitizer, the tests labelled `tsan`
#                         (Debian's gRPC, Abseil and libpq are not
#                         instrumented, so only these targets are meant for
#                         TSan; tsan/ annotates absl::Mutex for them), the
#                         store suite and the lone-call lane on PostgreSQL
#                         among them
#   fuzz  build-ci-fuzz/  clang++-14, libFuzzer+ASan+UBSan, each fuzzer for
#                         IDEM_FUZZ_SECONDS (default 10) over its corpus
#
#   bash scripts/ci-sanitizers.sh                # all three
#   bash scripts/ci-sanitizers.sh asan fuzz      # some of them
#
# The trees use -O1 -g1 (line tables only): enough for symbolised reports,
# much cheaper to build than -O2 -g. Installs missing Debian packages first
# (as root). CTEST_PARALLEL_LEVEL (default: the number of cores),
# IDEM_FUZZ_SECONDS and ASAN/UBSAN/TSAN/LSAN_OPTIONS and GTEST_FILTER (which
# replace the defaults below) are honoured. Runs every tree even when one
# fails; prints the time of every step and exits non-zero if any failed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/deps.sh
source "$root/scripts/deps.sh"

usage() { echo "usage: bash scripts/ci-sanitizers.sh [asan] [tsan] [fuzz]"; }

steps=()
for arg in "$@"; do
  case "$arg" in
    asan | tsan | fuzz) steps+=("$arg") ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
((${#steps[@]})) || steps=(asan tsan fuzz)

idem_install_deps

jobs="$(nproc)"
parallel="${CTEST_PARALLEL_LEVEL:-$jobs}"
fast_flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1")
# verify_asan_link_order=0: the fault suite runs a sidecar under faketime,
# whose LD_PRELOAD would otherwise make ASan refuse to start.
asan_options="abort_on_error=1:detect_leaks=1:check_initialization_order=1"
asan_options+=":verify_asan_link_order=0"
ubsan_options="print_stacktrace=1:halt_on_error=1"
tsan_options="halt_on_error=1:second_deadlock_stack=1"
# Known leaks outside our code. libpqxx 6.4 (Debian 12) leaks the PGresult
# of a statement that fails because the connection broke (BEGIN or COMMIT
# during a PostgreSQL crash, seen in the fault suite's ledger client; cf.
# jtv/libpqxx#500).
# LeakSanitizer's fast unwinder stops inside libpq/libpqxx (no frame
# pointers), so the suppression names the module.
lsan_suppressions=(
  "leak:libpqxx-6.4.so"
)
# Tests that assert latencies (1,000 waiters answered within 30 ms; replay p50 under
# load within 4x the baseline): ASan's slowdown alone breaks them.
gtest_skip="WaitersTest.AThousandWaitersGetTheReplayRightAfterComplete"
gtest_skip+=":RedisTest.KillPauseAndFlushUnderLoadChangeNoAnswer"
# The fault suite loads the machine on purpose (three sidecars, PostgreSQL,
# Redis, many clients); it runs alone so as not to starve timing-sensitive
# tests (Redis lookups time out and fall through to a stopped PostgreSQL).
heavy='^faults_((bouncer_)?quick(_citus)?|patroni|citus)$'
# The Citus variants of the pgtests run in the plain suite only: under ASan
# they would add about a minute to CI (45 minutes at most), and the sidecars
# of faults_citus and faults_quick_citus run the same Citus code paths
# under ASan in the fault step.
asan_skip='_citus_pgtest$'
# clang-tidy in the asan step covers the folders of the code that ships:
# the whole tree (95 files, the pgtests' and faults' too) took 38 min on a
# shared 2-core machine, far beyond its share of CI (docs/fuzzing.md).
read -r -a tidy_paths <<<"${IDEM_TIDY_PATHS:-server client common statemachine}"

# Runs ctest in tree $1 with the remaining arguments, every sanitizer
# report (of the test binaries and of the processes they start: sidecars,
# idemctl) written to $1/sanitizer-reports/. Prints the reports; fails if
# ctest failed or any report was written.
sanitized_ctest() {
  local dir="$1" reports="$1/sanitizer-reports" status=0
  shift
  rm -rf "$reports"
  mkdir -p "$reports"
  printf '%s\n' "${lsan_suppressions[@]}" >"$dir/lsan.supp"
  GTEST_FILTER="${GTEST_FILTER:--$gtest_skip}" \
    LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$dir/lsan.supp:print_suppressions=0}" \
    ASAN_OPTIONS="${ASAN_OPTIONS:-$asan_options}:log_path=$reports/asan" \
    UBSAN_OPTIONS="${UBSAN_OPTIONS:-$ubsan_options}:log_path=$reports/ubsan" \
    TSAN_OPTIONS="${TSAN_OPTIONS:-$tsan_options}:log_path=$reports/tsan" \
    ctest --test-dir "$dir" --output-on-failure --timeout 900 \
    -j"$parallel" "$@" || status=$?
  if [[ -n "$(ls -A "$reports")" ]]; then
    for report in "$reports"/*; do
      echo "---- $report"
      cat "$report"
    done
    echo "sanitizer reports in $reports" >&2
    status=1
  fi
  return "$status"
}

timings=()
# Runs "$@" as the step named $1 and records how long it took.
timed() {
  local name="$1" start status=0
  shift
  echo "== $name"
  start="$(date +%s)"
  "$@" || status=$?
  timings+=("$(printf '%-20s %5ds%s' "$name" "$(($(date +%s) - start))" \
    "$( ((status == 0)) || echo "  FAILED ($status)")")")
  return "$status"
}

failed=()
report() {
  echo "== timings"
  printf '%s\n' "${timings[@]}"
  if ((${#failed[@]})); then
    echo "FAILED: ${failed[*]}"
  else
    echo "all passed"
  fi
}
trap report EXIT

# Each tree is configured, built and tested; a failure moves on to the next
# tree, and the script fails at the end.
# clang++-14 (installed with the fuzzing packages, scripts/deps.sh) builds
# every tree here: with sanitizers it compiles in half g++'s time or less.
need_clang() {
  if ! command -v clang++-14 >/dev/null; then
    echo "clang++-14 not found: apt-get install clang-14 libclang-rt-14-dev llvm-14 (in scripts/deps.sh)" >&2
    return 1
  fi
}

asan() {
  local dir="$root/build-ci-asan" status=0
  need_clang || return 1
  timed "asan: configure" cmake -S "$root" -B "$dir" -DIDEM_SANITIZE=ON \
    -DCMAKE_CXX_COMPILER=clang++-14 "${fast_flags[@]}" &&
    timed "asan: build" cmake --build "$dir" -j"$jobs" || return 1
  # Fails the step (not the tests after it) on any finding.
  IDEM_TIDY_JOBS="$jobs" timed "asan: clang-tidy" \
    bash "$root/scripts/clang-tidy.sh" "$dir" "${tidy_paths[@]}" || status=1
  timed "asan: test" sanitized_ctest "$dir" --no-tests=error -LE deploy \
    -E "$heavy|$asan_skip" || status=1
  timed "asan: fault suite" sanitized_ctest "$dir" --no-tests=ignore \
    -LE deploy -R "$heavy" || status=1
  return "$status"
}

tsan() {
  local dir="$root/build-ci-tsan"
  need_clang || return 1
  timed "tsan: configure" cmake -S "$root" -B "$dir" -DIDEM_TSAN=ON \
    -DCMAKE_CXX_COMPILER=clang++-14 "${fast_flags[@]}" &&
    timed "tsan: build" cmake --build "$dir" -j"$jobs" \
      --target transitions_test coordinator_race_test group_commit_test \
      redis_store_test timer_queue_test periodic_test begin_waiters_test \
      store_pgtest pg_lane_pgtest &&
    timed "tsan: test" sanitized_ctest "$dir" --no-tests=error -L tsan
}

fuzz() {
  local dir="$root/build-ci-fuzz"
  need_clang || return 1
  timed "fuzz: configure" cmake -S "$root" -B "$dir" -DIDEM_FUZZ=ON \
    -DCMAKE_CXX_COMPILER=clang++-14 \
    "-DIDEM_FUZZ_SECONDS=${IDEM_FUZZ_SECONDS:-10}" "${fast_flags[@]}" &&
    timed "fuzz: build" cmake --build "$dir" -j"$jobs" --target \
      validation_fuzzer statemachine_fuzzer page_token_fuzzer config_fuzzer \
      auth_fuzzer redis_codec_fuzzer gateway_config_fuzzer \
      gateway_request_fuzzer &&
    # One fuzzer per core; each prints a one-line summary, and its report
    # if it fails.
    ASAN_OPTIONS="${ASAN_OPTIONS:-$asan_options}" \
      UBSAN_OPTIONS="${UBSAN_OPTIONS:-$ubsan_options}" \
      timed "fuzz: run" ctest --test-dir "$dir" -L fuzz -V \
      --timeout 900 --no-tests=error -j"$jobs"
}

for step in "${steps[@]}"; do
  "$step" || failed+=("$step")
done
((${#failed[@]} == 0))
