#!/usr/bin/env bash
# Runs the fault-injection suite (docs/reliability.md): the checker's
# self-test, then every scenario (or those named), each against its own
# PostgreSQL, Redis and three sidecars, with one seed for the whole run.
#
#   tests/faults/run.sh [--quick] [--seed N] [--scenario NAME]...
#                       [--skip NAME]... [--duration SECONDS]
#                       [--build-dir DIR] [--verbose]
#
#   --quick        12 s of faults per scenario (about 5 minutes in all)
#                  instead of 60 s (about 15 minutes)
#   --seed N       the seed (default: random, printed); a scenario run with
#                  the same seed replays the same fault schedule and choices
#   --scenario S   run only S (repeatable); `faults_runner --list` names them
#   --skip S       leave S out (repeatable; CTest's faults_quick leaves out
#                  patroni-failover and citus-rebalance, which
#                  faults_patroni and faults_citus run)
#   --duration S   seconds of faults per scenario (overrides --quick)
#   --build-dir D  a CMake build directory of this repository (default:
#                  build-faults/ at the top); built here if needed
#   --verbose      print every injected fault
#
# Environment: IDEM_TEST_PGBOUNCER=1 puts the sidecars' pools behind a
# transaction-pooling PgBouncer (faults_bouncer_quick); IDEM_TEST_CITUS=1
# makes the database a Citus coordinator and two workers, the PostgreSQL
# faults hitting the coordinator (faults_quick_citus; pg-failover skips
# there, saying why, and every scenario skips without Citus, or fails with
# CI=true).
#
# Prints a line per scenario with its figures, a line of totals, and last
# "N passed, M failed" (N + M = scenarios, the self-test included; then
# ", K skipped" for scenarios that did not run, each saying why: Citus not
# installed, or pg-failover on Citus). Exits non-zero if any failed; 77 if
# none failed and every scenario was skipped (CTest's faults_citus and
# faults_quick_citus then report a skip). A failing scenario leaves its
# history, fault log, violations and server logs in
# <build-dir>/tests/faults/artifacts/.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"

quick=0
seed=""
duration=""
build_dir=""
verbose=()
scenarios=()
skip=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1 ;;
    --seed) seed="${2:?--seed needs a value}"; shift ;;
    --seed=*) seed="${1#*=}" ;;
    --scenario) scenarios+=("${2:?--scenario needs a value}"); shift ;;
    --scenario=*) scenarios+=("${1#*=}") ;;
    --skip) skip+=("${2:?--skip needs a value}"); shift ;;
    --skip=*) skip+=("${1#*=}") ;;
    --duration) duration="${2:?--duration needs a value}"; shift ;;
    --duration=*) duration="${1#*=}" ;;
    --build-dir) build_dir="${2:?--build-dir needs a value}"; shift ;;
    --build-dir=*) build_dir="${1#*=}" ;;
    --verbose) verbose=(--verbose) ;;
    -h|--help) sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
if [[ -z "${seed}" ]]; then
  seed=$(( (RANDOM * 32768 + RANDOM) % 1000000 ))
fi
if [[ -z "${duration}" ]]; then
  if [[ ${quick} -eq 1 ]]; then duration=12; else duration=60; fi
fi
build_dir="${build_dir:-${repo}/build-faults}"
mkdir -p "${build_dir}"
build_dir="$(cd "${build_dir}" && pwd)"

runner_pid=""
build_log=""
cleanup() {
  local rc=$?
  if [[ -n "${runner_pid}" ]] && kill -0 "${runner_pid}" 2>/dev/null; then
    # The runner tears its clusters down on SIGTERM.
    kill -TERM "${runner_pid}" 2>/dev/null || true
    for _ in $(seq 1 120); do
      kill -0 "${runner_pid}" 2>/dev/null || break
      sleep 0.5
    done
    kill -KILL "${runner_pid}" 2>/dev/null || true
  fi
  [[ -n "${build_log}" ]] && rm -f "${build_log}"
  exit "${rc}"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Build what the suite needs; configure the build directory first if it
# has not been configured (or predates the suite's targets).
build_log="$(mktemp /tmp/idem-faults-build.XXXXXX)"
targets=""
# Older versions of this script configured their build directory with a
# project include file from tests/faults/ that no longer exists; drop it
# from such a cache, or CMake fails to re-run.
if grep -q '^CMAKE_PROJECT_INCLUDE:[A-Z]*=.*/tests/faults/' \
      "${build_dir}/CMakeCache.txt" 2>/dev/null; then
  echo "reconfiguring ${build_dir} without the old project include"
  if ! cmake -U CMAKE_PROJECT_INCLUDE -S "${repo}" -B "${build_dir}" \
        >"${build_log}" 2>&1; then
    tail -n 50 "${build_log}"
    exit 1
  fi
fi
if [[ -f "${build_dir}/CMakeCache.txt" ]]; then
  targets="$(cmake --build "${build_dir}" --target help 2>/dev/null || true)"
fi
if ! grep -q faults_runner <<<"${targets}"; then
  echo "configuring ${build_dir}"
  if ! cmake -S "${repo}" -B "${build_dir}" >"${build_log}" 2>&1; then
    tail -n 50 "${build_log}"
    exit 1
  fi
fi
echo "building faults_runner (and idempotency-sidecar) in ${build_dir}"
if ! cmake --build "${build_dir}" --target faults_runner -j2 \
      >"${build_log}" 2>&1; then
  tail -n 50 "${build_log}"
  exit 1
fi
runner="${build_dir}/tests/faults/faults_runner"
artifacts="${build_dir}/tests/faults/artifacts"

if [[ ${#scenarios[@]} -eq 0 ]]; then
  mapfile -t scenarios < <("${runner}" --list | awk '{print $1}')
fi
if [[ ${#skip[@]} -gt 0 ]]; then
  mapfile -t scenarios < <(printf '%s\n' "${scenarios[@]}" |
    grep -vxF -f <(printf '%s\n' "${skip[@]}"))
fi

echo "seed ${seed}: ${#scenarios[@]} scenario(s), ${duration}s of faults each"
echo "reproduce one: tests/faults/run.sh --seed ${seed} --scenario NAME" \
  "--duration ${duration}"

passed=0
failed=0
skipped=0
total_ops=0
total_faults=0
total_violations=0
total_lost=0

field() {  # field NAME LINE -> the number after NAME= (0 if absent)
  local v
  v="$(grep -o "[ :]$1=[0-9]*" <<<"$2" | head -n 1 | cut -d= -f2)"
  echo "${v:-0}"
}

# The checker must be able to fail: it must report every planted violation.
if selftest="$("${runner}" --selftest)"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
fi
echo "${selftest}"

for s in "${scenarios[@]}"; do
  out_file="$(mktemp /tmp/idem-faults-out.XXXXXX)"
  set +e
  "${runner}" --scenario="${s}" --seed="${seed}" --duration="${duration}" \
    --artifacts="${artifacts}" "${verbose[@]}" >"${out_file}" 2>&1 &
  runner_pid=$!
  wait "${runner_pid}"
  rc=$?
  set -e
  runner_pid=""
  out="$(cat "${out_file}")"
  rm -f "${out_file}"
  line="$(grep '^scenario ' <<<"${out}" | tail -n 1 || true)"
  grep -v '^scenario ' <<<"${out}" | grep -v '^$' || true
  if [[ -z "${line}" ]]; then
    line="scenario ${s} seed=${seed}: no result (exit ${rc}) FAIL"
  fi
  echo "${line}"
  if [[ ${rc} -eq 0 && "${line}" == *" PASS" ]]; then
    passed=$((passed + 1))
  elif [[ ${rc} -eq 77 && "${line}" == *" SKIP" ]]; then
    skipped=$((skipped + 1))
  else
    failed=$((failed + 1))
  fi
  total_ops=$((total_ops + $(field ops "${line}")))
  total_faults=$((total_faults + $(field faults "${line}")))
  total_violations=$((total_violations + $(field violations "${line}")))
  total_lost=$((total_lost + $(field lost "${line}")))
done

echo "total: operations=${total_ops} faults=${total_faults}" \
  "violations=${total_violations}" \
  "lost_acknowledged_writes=${total_lost} seed=${seed}"
if [[ ${skipped} -gt 0 ]]; then
  echo "${passed} passed, ${failed} failed, ${skipped} skipped"
else
  echo "${passed} passed, ${failed} failed"
fi
[[ ${failed} -eq 0 ]] || exit 1
if [[ ${skipped} -gt 0 && ${skipped} -eq ${#scenarios[@]} ]]; then
  exit 77
fi
