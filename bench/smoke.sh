#!/usr/bin/env bash
# Smoke test of the load generator (CTest: bench_smoke): two seconds of
# idem-bench against idem-bench-echo, then against idem-bench-echo --handoff;
# each JSON must show a non-zero throughput and no errors. Needs no database
# and takes about 8 seconds.
#   bash bench/smoke.sh path/to/idem-bench path/to/idem-bench-echo
set -euo pipefail

if (($# != 2)); then
  echo "usage: bash bench/smoke.sh IDEM_BENCH IDEM_BENCH_ECHO" >&2
  exit 2
fi
bench="$1"
echo_server="$2"

tmp="$(mktemp -d -t idem-bench-smoke.XXXXXX)"
echo_pid=""
cleanup() {
  if [[ -n "$echo_pid" ]] && kill -0 "$echo_pid" 2>/dev/null; then
    kill "$echo_pid" 2>/dev/null || true
    wait "$echo_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# Runs the generator against idem-bench-echo started with the given flags.
smoke() {
  : >"$tmp/echo.out"
  "$echo_server" --listen 127.0.0.1:0 "$@" >>"$tmp/echo.out" \
    2>"$tmp/echo.err" &
  echo_pid=$!
  local addr=""
  for _ in $(seq 100); do
    addr="$(sed -n 's/^listening on //p' "$tmp/echo.out")"
    [[ -n "$addr" ]] && break
    kill -0 "$echo_pid" 2>/dev/null || break
    sleep 0.05
  done
  if [[ -z "$addr" ]]; then
    echo "bench_smoke: idem-bench-echo${*:+ $*} did not start" >&2
    cat "$tmp/echo.err" >&2
    exit 1
  fi

  "$bench" --target "$addr" --scenario replay --no-preload --concurrency 8 \
    --threads 2 --warmup 500ms --duration 2s --rpc-timeout 5s \
    --wait-ready 5s --json "$tmp/out.json"

  local throughput errors
  throughput="$(json_number throughput_rps)"
  errors="$(json_number errors_total)"
  if [[ -z "$throughput" || -z "$errors" ]]; then
    echo "bench_smoke: throughput_rps or errors_total missing from the JSON:" >&2
    cat "$tmp/out.json" >&2
    exit 1
  fi
  if ! awk -v t="$throughput" 'BEGIN { exit !(t > 0) }'; then
    echo "bench_smoke: throughput is $throughput, want > 0" >&2
    exit 1
  fi
  if [[ "$errors" != 0 ]]; then
    echo "bench_smoke: $errors errors, want 0" >&2
    cat "$tmp/out.json" >&2
    exit 1
  fi
  kill "$echo_pid"
  wait "$echo_pid" 2>/dev/null || true
  echo_pid=""
  echo "bench_smoke: ok, $throughput req/s against idem-bench-echo${*:+ $*}, 0 errors"
}

json_number() {
  sed -n "s/^  \"$1\": \\([0-9.eE+-]*\\),\$/\\1/p" "$tmp/out.json"
}

smoke
smoke --handoff
