#!/usr/bin/env bash
# Side-by-side A/B of two sidecar binaries on the replay paths, for changes
# too small for bench/run.sh to tell apart from a shared machine's noise (on
# a 2-core machine a 5-second run of the same binary moved by 20% or more
# from one minute to the next). The two binaries run one after the other, alternating, on
# the same PostgreSQL, Redis and replay pool; each run reports req/s and the
# sidecar's CPU per call, which moves much less with the machine than
# throughput does. The summary gives medians and B/A.
#
#   bash bench/ab.sh OLD_SIDECAR NEW_SIDECAR
#   bash bench/ab.sh --rounds 5 --clients "64" --scenarios "replay-redis" A B
#
# Scenarios: replay-local (the default in-process cache), replay-redis and
# replay-pg (in-process cache off, as in bench/run.sh); fresh (Begin and
# Complete on new keys, with Redis; not in the default list). Uses the PostgreSQL
# and Redis of `scripts/run-local.sh services` (started if needed) and
# build-bench/bench/idem-bench (built by bench/run.sh; IDEM_BENCH overrides).
# The medians are computed by bench/report.py (ab-medians).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rounds=3
clients="64 8"
scenarios="replay-local replay-redis replay-pg"
duration=5s

usage() {
  echo "usage: bash bench/ab.sh [--rounds N] [--clients \"64 8\"]" \
    "[--scenarios \"replay-local replay-redis replay-pg\"] [--duration 5s]" \
    "SIDECAR_A SIDECAR_B"
}
while (($#)); do
  case "$1" in
    --rounds) rounds="${2:?}"; shift 2 ;;
    --clients) clients="${2:?}"; shift 2 ;;
    --scenarios) scenarios="${2:?}"; shift 2 ;;
    --duration) duration="${2:?}"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    -*) usage >&2; exit 2 ;;
    *) break ;;
  esac
done
(($# == 2)) || { usage >&2; exit 2; }
bin_a="$1"
bin_b="$2"
bench="${IDEM_BENCH:-$root/build-bench/bench/idem-bench}"
for b in "$bin_a" "$bin_b" "$bench"; do
  [[ -x "$b" ]] || { echo "ab: $b is not an executable" >&2; exit 2; }
done

bash "$root/scripts/run-local.sh" services >/dev/null
pg="host=127.0.0.1 port=${IDEM_PG_PORT:-54329} user=postgres dbname=postgres"
redis="127.0.0.1:${IDEM_REDIS_PORT:-63799}"
target=127.0.0.1:50097
results="$(mktemp)"
# The key that signs Redis values, by environment: a binary from before
# the MAC ignores it, where it would refuse an unknown flag.
IDEM_REDIS_MAC_KEY="$(head -c 32 /dev/urandom | od -An -vtx1 | tr -d ' \n')"
export IDEM_REDIS_MAC_KEY
sidecar_pid=""
cleanup() {
  [[ -z "$sidecar_pid" ]] || kill "$sidecar_pid" 2>/dev/null || true
  rm -f "$results"
}
trap cleanup EXIT

# Starts sidecar $1 with the flags of scenario $2 and waits until it serves.
start() {
  local flags=(--listen "$target" --postgres "$pg" --pg-pool-size 64
    --log-level=warn)
  case "$2" in
    replay-local) ;;
    replay-redis) flags+=(--local-cache-mib 0 --redis "$redis") ;;
    replay-pg) flags+=(--local-cache-mib 0) ;;
    fresh) flags+=(--redis "$redis") ;;
    *) echo "ab: unknown scenario $2" >&2; exit 2 ;;
  esac
  "$1" "${flags[@]}" >/dev/null 2>&1 &
  sidecar_pid=$!
  "$bench" --target "$target" --ready-only --wait-ready 10s >/dev/null
}

stop() {
  kill "$sidecar_pid"
  wait "$sidecar_pid" 2>/dev/null || true
  sidecar_pid=""
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# One run: label $1, binary $2, scenario $3, clients $4.
run() {
  local label="$1" bin="$2" scenario="$3" c="$4" mode t0 t1 out n rps
  start "$bin" "$scenario"
  mode="$scenario"
  if [[ "$scenario" == replay-local ]]; then
    mode=replay
    # Fill the in-process cache first, as replays of a busy key would.
    "$bench" --target "$target" --scenario replay --no-preload \
      --key-space 10000 -c 16 --duration 2s >/dev/null
  fi
  t0="$(cpu_ticks "$sidecar_pid")"
  out="$("$bench" --target "$target" --scenario "$mode" --no-preload \
    --key-space 10000 -c "$c" --duration "$duration" --warmup 1s |
    grep '^RESULT')"
  t1="$(cpu_ticks "$sidecar_pid")"
  stop
  n="$(grep -o 'rpcs_total=[0-9]*' <<<"$out" | cut -d= -f2)"
  rps="$(grep -o 'throughput=[0-9]*' <<<"$out" | cut -d= -f2)"
  if ! grep -q ' errors=0' <<<"$out"; then
    echo "ab: $label $scenario c=$c had errors: $out" >&2
  fi
  # Clock ticks are 10 ms: microseconds per call = ticks * 10000 / calls.
  echo "$scenario $c $label $rps $(((t1 - t0) * 10000 / n))" | tee -a "$results"
}

# The schema (a fresh `run-local.sh services` has none), by the newer
# binary: migrations only add.
"$bin_b" migrate --postgres "$pg" >/dev/null

# The replay pool: 10,000 finished keys (idempotent).
start "$bin_a" replay-pg
"$bench" --target "$target" --scenario replay --preload-only \
  --key-space 10000 >/dev/null 2>&1
stop

echo "scenario clients binary req/s cpu_us_per_call"
for ((r = 1; r <= rounds; r++)); do
  for c in $clients; do
    for s in $scenarios; do
      run A "$bin_a" "$s" "$c"
      run B "$bin_b" "$s" "$c"
    done
  done
done

echo "== medians over $rounds rounds (B/A: req/s, CPU per call)"
python3 "$root/bench/report.py" ab-medians "$results" "$clients" "$scenarios"
