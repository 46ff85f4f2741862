#!/usr/bin/env bash
# The side-by-side benchmark: what the sidecar costs compared with
# running the same SQL directly, and how close it is to the fastest RPC this
# machine can serve. Everything is measured in one run, on one throwaway
# PostgreSQL with one settings file, because absolute numbers drift on a
# shared machine while ratios within one run hold.
#
#   bash bench/run.sh [--quick] [--build-dir DIR] [--output FILE]
#
# Contenders, at 1, 8, 32 and 64 clients (--quick: 1, 8 and 64, shorter
# runs):
#   pgbench -M prepared running bench/sql/fresh.sql and replay.sql (the
#     sidecar's own statements), with as many connections as the sidecar's
#     --pg-pool-size in that run;
#   the sidecar (Release build, --log-level=warn, default batching) with
#     Redis: fresh, replay-redis, contention, mixed; without Redis:
#     replay-pg, fresh, and fresh with --pg-max-batch 1 (no batching; not
#     at 1 client, where there is nothing to fold);
#   idem-bench-echo (a server that answers Begin at once) under the same
#     generator (idem-bench) as the sidecar, and (not in the ratios)
#     idem-bench-echo --handoff, which answers from a thread of its own as
#     the sidecar answers a replay from PostgreSQL;
#   at 64 clients also the sidecar's fresh scenario and pgbench fresh.sql at
#     a fixed arrival rate, half of the lower of the two peak fresh rates
#     (sidecar, pgbench), for p99.
# The contenders of the ratios run 3 times at 64 clients, back to back
# within each round; the ratios are the medians. Records CPU seconds per
# 1,000 requests of the server (sidecar or echo), PostgreSQL and the load
# generator, and each sidecar's peak RSS.
#
# Writes BENCHMARKS.md at the repo root (or --output) and ends with the line
#   RATIOS fresh_vs_pgbench=X replay_redis_vs_echo=Y replay_pg_vs_echo=Z
#          p99_vs_pgbench=W rss_mib=R
# (one line). This script only starts the processes and collects raw
# numbers into a results directory; bench/report.py computes every median,
# ratio and table from it (IDEM_BENCH_RESULTS=DIR keeps that directory, and
# `python3 bench/report.py report DIR FILE` renders it again).
# Exits non-zero if any contender fails. Binaries come from a
# Release build in build-bench/ (configured and built here) unless
# IDEM_SIDECAR, IDEM_BENCH and IDEM_BENCH_ECHO name them. IDEM_PG_BINDIR
# picks the PostgreSQL binaries (default: the newest /usr/lib/postgresql/*).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
args="$*"
command_line="bash bench/run.sh${args:+ $args}"

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

quick=0
build_dir="$root/build-bench"
output="$root/BENCHMARKS.md"
while (($#)); do
  case "$1" in
    --quick) quick=1 ;;
    --build-dir) build_dir="$2"; shift ;;
    --build-dir=*) build_dir="${1#*=}" ;;
    --output) output="$2"; shift ;;
    --output=*) output="${1#*=}" ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bench/run.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

# Every contender runs at each of `levels` clients, then `rounds` times at
# max_level clients (the ratios are medians over those rounds).
max_level=64
rounds=3
if ((quick)); then
  levels=(1 8)
  warmup_s=1
  duration_s=3
  pool_keys=2000
else
  levels=(1 8 32)
  warmup_s=3
  duration_s=15
  pool_keys=10000
fi
snapshot_bytes=256
tenant=bench
operation=bench

log() { echo "[bench $(date +%H:%M:%S)] $*" >&2; }
die() {
  echo "bench/run.sh: FAILED: $*" >&2
  exit 1
}

# ---------------------------------------------------------------- cleanup
tmp=""
pids=()
sidecar_log=""  # the running sidecar's log (start_sidecar)
pg_ctl_stop=()
# Whether process `pid` exists and is not a zombie.
running() {
  local state
  state="$(awk '{ sub(/^.*\) /, ""); print $1 }' "/proc/$1/stat" 2>/dev/null)"
  [[ -n "$state" && "$state" != Z ]]
}

cleanup() {
  local rc=$?
  set +e
  local pid alive
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null
  done
  # SIGTERM, up to 10 s to exit, then SIGKILL.
  for _ in $(seq 100); do
    alive=0
    for pid in "${pids[@]}"; do
      running "$pid" && alive=1
    done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    running "$pid" && kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  if ((${#pg_ctl_stop[@]})); then
    if ! timeout 60 "${pg_ctl_stop[@]}" >/dev/null 2>&1 &&
      [[ -f "$pgdata/postmaster.pid" ]]; then
      kill -9 "$(head -n 1 "$pgdata/postmaster.pid")" 2>/dev/null
    fi
  fi
  if [[ -n "$tmp" ]]; then
    rm -rf "$tmp"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Forgets a background process that has been stopped and waited for.
forget_pid() {
  local keep=() p
  for p in "${pids[@]}"; do
    [[ "$p" == "$1" ]] || keep+=("$p")
  done
  pids=("${keep[@]}")
}

# ---------------------------------------------------------------- binaries
sidecar="${IDEM_SIDECAR:-}"
bench="${IDEM_BENCH:-}"
echo_server="${IDEM_BENCH_ECHO:-}"
if [[ -z "$sidecar" || -z "$bench" || -z "$echo_server" ]]; then
  if ! grep -Eq '^[[:space:]]*add_subdirectory\([[:space:]]*bench[[:space:]]*\)' \
    "$root/CMakeLists.txt"; then
    die "the top-level CMakeLists.txt has no add_subdirectory(bench), so" \
      "idem-bench is not built; add it, or point IDEM_SIDECAR, IDEM_BENCH" \
      "and IDEM_BENCH_ECHO at built binaries"
  fi
  log "building (Release) in $build_dir"
  cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build_dir" -j"$(nproc)" --target idempotency-sidecar \
    idem-bench idem-bench-echo >/dev/null
  sidecar="${sidecar:-$build_dir/server/idempotency-sidecar}"
  bench="${bench:-$build_dir/bench/idem-bench}"
  echo_server="${echo_server:-$build_dir/bench/idem-bench-echo}"
fi
for bin in "$sidecar" "$bench" "$echo_server"; do
  [[ -x "$bin" ]] || die "$bin: not an executable"
done
# The malloc a binary links (CMake IDEM_MALLOC): tcmalloc or glibc.
allocator_of() {
  if ldd "$1" 2>/dev/null | grep -q 'libtcmalloc'; then
    echo tcmalloc
  else
    echo glibc
  fi
}
if [[ -n "${IDEM_SIDECAR:-}${IDEM_BENCH:-}${IDEM_BENCH_ECHO:-}" ]]; then
  command_line="IDEM_SIDECAR=${sidecar#"$root"/} IDEM_BENCH=${bench#"$root"/}"
  command_line+=" IDEM_BENCH_ECHO=${echo_server#"$root"/} bash"
  command_line+=" bench/run.sh${args:+ $args}"
fi
sidecar_help="$("$sidecar" --help 2>&1 || true)"
if ! grep -q -- --redis <<<"$sidecar_help"; then
  die "this idempotency-sidecar has no --redis flag yet (the Redis cache" \
    "has not landed): replay-redis, fresh, contention and mixed need it." \
    "Run again once 'idempotency-sidecar --help' lists --redis."
fi

pg_bindir="${IDEM_PG_BINDIR:-$(printf '%s\n' /usr/lib/postgresql/*/bin |
  sort -V | tail -n 1)}"
for tool in initdb pg_ctl postgres psql pgbench; do
  [[ -x "$pg_bindir/$tool" ]] || die "$pg_bindir/$tool not found (set" \
    "IDEM_PG_BINDIR)"
done
command -v redis-server >/dev/null || die "redis-server not found"
command -v redis-cli >/dev/null || die "redis-cli not found"
command -v python3 >/dev/null ||
  die "python3 not found (bench/report.py computes the report)"

# ---------------------------------------------------------------- helpers
clk_tck="$(getconf CLK_TCK)"

# A port below the ephemeral range, which others' port-0 binds and outgoing
# connections use.
free_port() {
  local port low
  low="$(cut -f 1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null ||
    echo 32768)"
  while true; do
    port=$((10000 + RANDOM % (low - 10000)))
    if ! ss -Htln "sport = :$port" 2>/dev/null | grep -q .; then
      echo "$port"
      return
    fi
  done
}

# utime + stime of a process, in clock ticks.
proc_ticks() {
  awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"
}

# CPU of the whole PostgreSQL cluster in clock ticks: the postmaster with the
# children it has reaped, plus its live children.
pg_ticks() {
  local pm child total
  pm="$(head -n 1 "$pgdata/postmaster.pid")"
  total="$(awk '{ sub(/^.*\) /, ""); print $12 + $13 + $14 + $15 }' \
    "/proc/$pm/stat")"
  for child in $(pgrep -P "$pm" || true); do
    total=$((total + $(proc_ticks "$child" 2>/dev/null || echo 0)))
  done
  echo "$total"
}

pg_children() {
  pgrep -P "$(head -n 1 "$pgdata/postmaster.pid")" | wc -l
}

# Waits (up to 5 s) until PostgreSQL has only its own background processes
# (pg_aux of them) left: the CPU of a backend whose client disconnected
# counts in pg_ticks only once the postmaster has reaped it.
wait_pg_idle() {
  for _ in $(seq 100); do
    (($(pg_children) <= pg_aux)) && return 0
    sleep 0.05
  done
}

# Sets children_ticks to the CPU (user + system) of this shell's finished
# children, in clock ticks: it grows by the load generator's once that has
# been waited for. Call it directly: in $(...) or a pipeline, `times` would
# run in a subshell that has no children of its own.
children_ticks=0
read_children_ticks() {
  times >"$tmp/times"
  children_ticks="$(awk -v hz="$clk_tck" 'NR == 2 {
    t = 0
    for (i = 1; i <= 2; i++) {
      split($i, part, "m"); sub("s", "", part[2]); t += part[1] * 60 + part[2]
    }
    printf "%d", t * hz }' "$tmp/times")"
}

as_root_or_owner() {
  if ((EUID == 0)); then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

psql_run() {
  "$pg_bindir/psql" -X -q -h 127.0.0.1 -p "$pg_port" -U postgres \
    -d postgres -v ON_ERROR_STOP=1 "$@"
}

# ---------------------------------------------------------------- results
# Raw results go to $results (bench/report.py's header describes the files):
# meta.tsv, the run's parameters and machine; runs.tsv, one line per run;
# rss.tsv, each sidecar's peak RSS.
report_py="$root/bench/report.py"
results=""
# The ratio round that run_level is in (0: a level below max_level).
current_round=0

meta() {
  printf '%s\t%s\n' "$1" "$2" >>"$results/meta.tsv"
}

# Appends a run to runs.tsv: role section contender clients server_ticks
# result_line, with the current round and run_pg_ticks, run_client_ticks.
record() {
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$current_round" "$1" \
    "$2" "$3" "$4" "$5" "$run_pg_ticks" "$run_client_ticks" "$6" \
    >>"$results/runs.tsv"
}

# Field `name` of a "RESULT k=v ..." line.
result_field() {
  tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"
}

# Runs idem-bench; sets run_line (its RESULT line), run_server_ticks and
# run_pg_ticks. Fails the benchmark on any error. Arguments: a label, the pid
# whose CPU to count, then idem-bench's arguments.
run_idem() {
  local label="$1" server_pid="$2" out
  shift 2
  out="$tmp/out/$label.txt"
  local s0 p0 c0
  s0="$(proc_ticks "$server_pid")"
  p0="$(pg_ticks)"
  read_children_ticks
  c0="$children_ticks"
  if ! "$bench" --threads 2 --snapshot-bytes "$snapshot_bytes" \
    --tenant "$tenant" --operation "$operation" \
    --json "$tmp/out/$label.json" "$@" >"$out" 2>&1; then
    cat "$out" >&2
    die "idem-bench $label exited non-zero"
  fi
  read_children_ticks
  run_client_ticks=$((children_ticks - c0))
  run_server_ticks=$(($(proc_ticks "$server_pid") - s0))
  run_pg_ticks=$(($(pg_ticks) - p0))
  run_line="$(grep '^RESULT ' "$out" | tail -n 1)"
  [[ -n "$run_line" ]] || die "idem-bench $label printed no RESULT line"
  local errors throughput
  errors="$(result_field "$run_line" errors)"
  throughput="$(result_field "$run_line" throughput)"
  if [[ "$errors" != 0 ]]; then
    cat "$out" >&2
    if [[ -n "$sidecar_log" ]]; then
      echo "the sidecar's last errors ($sidecar_log):" >&2
      grep '"level":"error"' "$sidecar_log" | tail -n 20 >&2
    fi
    die "idem-bench $label: $errors errors"
  fi
  if ! [[ "$throughput" =~ [1-9] ]]; then
    cat "$out" >&2
    die "idem-bench $label: no request succeeded"
  fi
  log "$label: $throughput req/s, p99 $(result_field "$run_line" p99_us) us"
}

# Records the last run_idem in table `section` ("-": none) as `contender`
# at `clients`, in the role `role` of a ratio round ("-": none).
record_idem() {
  local section="$1" contender="$2" clients="$3" role="${4:--}"
  record "$role" "$section" "$contender" "$clients" "$run_server_ticks" \
    "$run_line"
}

# The pgbench variables of bench/sql/*.sql.
pgbench_vars=()

# Runs pgbench on script `sql` with `clients` connections for warmup +
# duration and measures the window after the warmup from its per-transaction
# log, like idem-bench does. Extra pgbench arguments follow. Sets pgb_line
# ("RESULT"-like: throughput, p50_us ... errors, transactions) and
# run_pg_ticks.
run_pgbench() {
  local label="$1" sql="$2" clients="$3"
  shift 3
  local threads=$((clients < 2 ? clients : 2))
  local out="$tmp/out/$label.txt" prefix="$tmp/pgb/$label"
  local p0 c0
  psql_run -c CHECKPOINT
  wait_pg_idle
  p0="$(pg_ticks)"
  read_children_ticks
  c0="$children_ticks"
  local rc=0
  (cd "$tmp/pgb" && "$pg_bindir/pgbench" -h 127.0.0.1 -p "$pg_port" \
    -U postgres -n -M prepared -c "$clients" -j "$threads" \
    -T $((warmup_s + duration_s)) -f "$root/bench/sql/$sql" \
    "${pgbench_vars[@]}" -l --log-prefix="$prefix" "$@" postgres) \
    >"$out" 2>&1 || rc=$?
  read_children_ticks
  run_client_ticks=$((children_ticks - c0))
  wait_pg_idle
  run_pg_ticks=$(($(pg_ticks) - p0))
  if ((rc != 0)) || grep -qi 'aborted\|error' "$out"; then
    cat "$out" >&2
    die "pgbench $label failed (exit $rc)"
  fi
  # The per-transaction logs (pgbench -l) to a RESULT line like
  # idem-bench's, over the window after the warmup.
  pgb_line="$(python3 "$report_py" pgbench-result "$warmup_s" \
    "$duration_s" "$prefix".*)" || die "pgbench $label: see above"
  rm -f "$prefix".*
  if [[ "$sql" == fresh.sql ]]; then
    # The guarded update must have found its row: otherwise pgbench did less
    # work than the sidecar. A client may stop between two statements.
    local unfinished
    unfinished="$(psql_run -At -c "SELECT count(*) FROM idempotency_record
      WHERE operation = '$operation-pgbench' AND status <> 'SUCCEEDED'")"
    ((unfinished <= clients)) || die "pgbench $label left $unfinished" \
      "records unfinished: bench/sql/fresh.sql no longer matches the table"
    psql_run -c "DELETE FROM idempotency_record
      WHERE operation = '$operation-pgbench' AND status <> 'SUCCEEDED'"
  fi
  log "$label: $(result_field "$pgb_line" throughput) tps," \
    "p99 $(result_field "$pgb_line" p99_us) us"
}

# As record_idem, for the last run_pgbench (no server CPU).
record_pgbench() {
  local section="$1" contender="$2" clients="$3" role="${4:--}"
  record "$role" "$section" "$contender" "$clients" - "$pgb_line"
}

# ---------------------------------------------------------------- servers
tmp="$(mktemp -d -t idem-bench.XXXXXX)"
chmod 755 "$tmp"
mkdir -p "$tmp/out" "$tmp/pgb" "$tmp/pg"
results="${IDEM_BENCH_RESULTS:-$tmp/results}"
mkdir -p "$results"
rm -f "$results/meta.tsv" "$results/runs.tsv" "$results/rss.tsv"
: >"$results/runs.tsv"
: >"$results/rss.tsv"
meta command_line "$command_line"
meta levels "${levels[*]}"
meta max_level "$max_level"
meta rounds "$rounds"
meta warmup_s "$warmup_s"
meta duration_s "$duration_s"
meta snapshot_bytes "$snapshot_bytes"
meta pool_keys "$pool_keys"
meta clk_tck "$clk_tck"
meta load_before "$(cut -d ' ' -f 1-3 /proc/loadavg)"
meta started_at "$(date -u '+%Y-%m-%d %H:%M:%S UTC')"

pg_port="$(free_port)"
pgdata="$tmp/pg/data"
if ((EUID == 0)); then
  id postgres >/dev/null 2>&1 || die "running as root needs a 'postgres' user"
  chown postgres: "$tmp/pg"
fi
log "initdb in $pgdata (port $pg_port)"
as_root_or_owner "$pg_bindir/initdb" -D "$pgdata" -U postgres -A trust \
  -E UTF8 --locale=C --no-instructions >"$tmp/out/initdb.txt" 2>&1 ||
  { cat "$tmp/out/initdb.txt" >&2; die "initdb failed"; }
# The one settings file of every contender.
settings="$pgdata/bench.conf"
as_root_or_owner tee "$settings" >/dev/null <<EOF
listen_addresses = '127.0.0.1'
port = $pg_port
unix_socket_directories = '$tmp/pg'
max_connections = 300
shared_buffers = 256MB
fsync = on
synchronous_commit = on
full_page_writes = on
wal_level = replica
max_wal_size = 4GB
checkpoint_timeout = 30min
log_min_messages = warning
# Loaded only to check, before the measurements, that bench/sql/*.sql are
# the sidecar's statements; tracking is off except in those sessions.
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = none
EOF
echo "include 'bench.conf'" | as_root_or_owner tee -a \
  "$pgdata/postgresql.conf" >/dev/null
pg_ctl_stop=("$pg_bindir/pg_ctl" -D "$pgdata" -m immediate -w stop)
if ((EUID == 0)); then
  pg_ctl_stop=(runuser -u postgres -- "${pg_ctl_stop[@]}")
fi
as_root_or_owner "$pg_bindir/pg_ctl" -D "$pgdata" -l "$tmp/pg/log" -w \
  -t 60 start >/dev/null || { cat "$tmp/pg/log" >&2; die "PostgreSQL did" \
  "not start"; }
pg_conninfo="host=127.0.0.1 port=$pg_port user=postgres dbname=postgres"
"$sidecar" migrate --postgres="$pg_conninfo" >"$tmp/out/migrate.txt" 2>&1 ||
  { cat "$tmp/out/migrate.txt" >&2; die "migrate failed"; }
# PostgreSQL's own background processes: the fewest children seen in 1 s.
pg_aux=1000
for _ in $(seq 10); do
  n="$(pg_children)"
  ((n < pg_aux)) && pg_aux="$n"
  sleep 0.1
done

redis_port="$(free_port)"
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' \
  --appendonly no --daemonize no --dir "$tmp" \
  --logfile "$tmp/redis.log" >/dev/null 2>&1 &
redis_pid=$!
pids+=("$redis_pid")
for _ in $(seq 100); do
  [[ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" == PONG ]] && break
  sleep 0.1
done
[[ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" == PONG ]] ||
  die "redis-server did not start"

# Starts idem-bench-echo with the given flags; sets started_pid and
# started_addr.
start_echo() {
  local out="$tmp/echo$*.out"
  : >"$out"
  "$echo_server" --listen 127.0.0.1:0 --snapshot-bytes "$snapshot_bytes" \
    "$@" >>"$out" 2>&1 &
  started_pid=$!
  pids+=("$started_pid")
  started_addr=""
  for _ in $(seq 100); do
    started_addr="$(sed -n 's/^listening on //p' "$out")"
    [[ -n "$started_addr" ]] && break
    sleep 0.05
  done
  [[ -n "$started_addr" ]] || die "idem-bench-echo $* did not start"
}
start_echo
echo_pid="$started_pid"
echo_addr="$started_addr"
start_echo --handoff
handoff_pid="$started_pid"
handoff_addr="$started_addr"

sidecar_pid=""
sidecar_addr=""

# Starts a sidecar with `pool` PostgreSQL connections: "local" (Redis and
# the default in-process cache of finished records); "redis" (Redis, no
# in-process cache: every replay is a Redis GET); "no-redis" (neither: every
# replay reads PostgreSQL); "unbatched" (as no-redis, and --pg-max-batch 1:
# every call its own statement); "verify" (as no-redis, statement tracking
# on, peak RSS not recorded).
start_sidecar() {
  local kind="$1" pool="$2" conninfo="$pg_conninfo" log attempt
  log="$tmp/out/sidecar-$kind-$pool.log"
  if [[ "$kind" == verify ]]; then
    conninfo+=" options='-c pg_stat_statements.track=top'"
  fi
  current_kind="$kind"
  current_pool="$pool"
  sidecar_log="$log"
  # A port found free may be taken before the sidecar binds it: try again
  # on other ports.
  for attempt in 1 2 3; do
    local port metrics
    port="$(free_port)"
    metrics="$(free_port)"
    local args=(--listen "127.0.0.1:$port" --postgres "$conninfo"
      --pg-pool-size "$pool" --metrics-listen "127.0.0.1:$metrics"
      --log-level=warn)
    [[ "$kind" == redis || "$kind" == local ]] &&
      args+=(--redis "127.0.0.1:$redis_port")
    [[ "$kind" == local ]] || args+=(--local-cache-mib 0)
    [[ "$kind" == unbatched ]] && args+=(--pg-max-batch 1)
    "$sidecar" "${args[@]}" >>"$log" 2>&1 &
    sidecar_pid=$!
    pids+=("$sidecar_pid")
    sidecar_addr="127.0.0.1:$port"
    local waited
    for ((waited = 0; waited < 30; waited++)); do
      if "$bench" --target "$sidecar_addr" --ready-only --wait-ready 1s \
        >"$tmp/out/ready.txt" 2>&1; then
        return 0
      fi
      running "$sidecar_pid" || break
    done
    if running "$sidecar_pid"; then
      kill -9 "$sidecar_pid"
    fi
    wait "$sidecar_pid" 2>/dev/null || true
    forget_pid "$sidecar_pid"
    log "the sidecar ($kind, pool $pool) did not start (attempt $attempt)"
  done
  cat "$tmp/out/ready.txt" "$log" >&2
  die "the sidecar ($kind, pool $pool) did not become SERVING"
}

stop_sidecar() {
  local hwm
  hwm="$(awk '/^VmHWM:/ { print $2 }' "/proc/$sidecar_pid/status")"
  if [[ "$current_kind" != verify ]]; then
    printf '%s\t%s\t%s\n' "$current_kind" "$current_pool" "$hwm" \
      >>"$results/rss.tsv"
  fi
  kill "$sidecar_pid"
  local rc=0
  wait "$sidecar_pid" || rc=$?
  forget_pid "$sidecar_pid"
  ((rc == 0)) || die "the sidecar exited with $rc on SIGTERM (log:" \
    "$sidecar_log)"
  sidecar_log=""
}

# ---------------------------------------------------------------- pgbench
hex() { od -An -v -tx1 | tr -d ' \n'; }
pgbench_vars=(
  -D "tenant=$tenant" -D "operation=$operation-pgbench"
  -D "hash=\\x$(printf '\xab%.0s' $(seq 32) | hex)"
  -D "body=\\x$(head -c "$snapshot_bytes" /dev/urandom | hex)"
  -D content_type=application/octet-stream -D 'headers={}'
  -D processing=PROCESSING -D succeeded=SUCCEEDED
  -D t=true -D f=false
  -D "pool=$pool_keys"
)
# The replay pool: operation "<operation>-replay", keys 0..pool_keys-1.
pgbench_replay_vars=("${pgbench_vars[@]}" -D "operation=$operation-replay")

common=(--warmup "${warmup_s}s" --duration "${duration_s}s")

# ---------------------------------------------------------------- the runs
log "preloading $pool_keys finished keys (the replay pool)"
start_sidecar redis "$max_level"
"$bench" --target "$sidecar_addr" --scenario replay --preload-only \
  --key-space "$pool_keys" --concurrency 32 --tenant "$tenant" \
  --operation "$operation" --snapshot-bytes "$snapshot_bytes" \
  >"$tmp/out/preload.txt" 2>&1 ||
  { cat "$tmp/out/preload.txt" >&2; die "preload failed"; }
stop_sidecar
psql_run -c 'VACUUM ANALYZE'

# The statements PostgreSQL ran since the last reset, as "calls<TAB>text"
# lines, in a form that ignores what may legitimately differ between the
# sidecar's text and a pgbench script: parameter numbers, comments, layout
# and literal constants (which pg_stat_statements turns into parameters).
tracked_statements() {
  psql_run -At -F $'\t' -c "SELECT sum(calls), t FROM (SELECT calls,
      btrim(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
      query, '--[^\n]*', '', 'g'), '\\\$[0-9]+', '\$', 'g'), '\s+', ' ',
      'g'), ';\s*$', '')) AS t FROM pg_stat_statements
      WHERE query !~* 'pg_stat_statements') s GROUP BY t ORDER BY t"
}

# From tracked_statements output on stdin, the statements run at least
# once per request on average, as "times per request<TAB>text", sorted;
# `requests` requests were made.
per_request() {
  awk -F '\t' -v n="$1" '$1 >= n / 2 {
    printf "%d\t%s\n", int($1 / n + 0.5), $2 }' | sort
}

psql_reset_statements() {
  psql_run -c 'SELECT pg_stat_statements_reset()' >/dev/null
}

# Checks that bench/sql/fresh.sql and replay.sql run, once per transaction,
# exactly the statements the sidecar runs once per fresh request and per
# replay without Redis: runs both, with pg_stat_statements tracking only
# those sessions, and compares statement texts and counts. The sidecar runs
# with one client here, so that it uses its single-row statements; under
# concurrency it folds the same statements into their batch forms
# (server/postgres/pg_batch.cc), which is what the measurements then compare with
# pgbench running the single-row ones.
log "checking that bench/sql/*.sql run the sidecar's own statements"
psql_run -c 'CREATE EXTENSION IF NOT EXISTS pg_stat_statements' >/dev/null
for pair in fresh:fresh.sql replay-pg:replay.sql; do
  scenario="${pair%%:*}"
  script="${pair#*:}"
  # Statements prepared before a reset would be recorded with their
  # constants in place: a new sidecar prepares everything after it.
  psql_reset_statements
  start_sidecar verify 2
  if ! "$bench" --target "$sidecar_addr" --scenario "$scenario" \
    --no-preload --key-space "$pool_keys" -c 1 --warmup 0s --duration 2s \
    --tenant "$tenant" --operation "$operation" \
    --snapshot-bytes "$snapshot_bytes" --fail-on-error \
    >"$tmp/out/verify-$scenario.txt" 2>&1; then
    cat "$tmp/out/verify-$scenario.txt" >&2
    die "the sidecar failed its check run ($scenario)"
  fi
  requests="$(result_field "$(grep '^RESULT ' "$tmp/out/verify-$scenario.txt")" \
    requests_total)"
  ((requests >= 10)) || die "the sidecar's check run made $requests requests"
  stop_sidecar
  tracked_statements >"$tmp/out/sidecar-$scenario.tsv"
  per_request "$requests" <"$tmp/out/sidecar-$scenario.tsv" \
    >"$tmp/out/sidecar-$scenario.per-request"
  vars=("${pgbench_vars[@]}")
  [[ "$script" == replay.sql ]] && vars=("${pgbench_replay_vars[@]}")
  psql_reset_statements
  PGOPTIONS='-c pg_stat_statements.track=top' "$pg_bindir/pgbench" \
    -h 127.0.0.1 -p "$pg_port" -U postgres -n -M prepared -c 1 -t 20 \
    -f "$root/bench/sql/$script" "${vars[@]}" postgres \
    >"$tmp/out/verify-$script.txt" 2>&1 ||
    { cat "$tmp/out/verify-$script.txt" >&2; die "pgbench $script failed"; }
  tracked_statements | per_request 20 >"$tmp/out/pgbench-$script.per-request"
  if ! diff -u "$tmp/out/sidecar-$scenario.per-request" \
    "$tmp/out/pgbench-$script.per-request" >"$tmp/out/verify.diff"; then
    {
      echo "statements per request (times<TAB>statement): the sidecar's"
      echo "$scenario scenario (---) and bench/sql/$script (+++) differ:"
      cat "$tmp/out/verify.diff"
    } >&2
    die "bench/sql/$script no longer runs what the sidecar runs" \
      "(server/postgres/postgres_store.cc, server/core/coordinator.cc); update it"
  fi
done
psql_run -c 'DROP EXTENSION pg_stat_statements' \
  -c "DELETE FROM idempotency_record WHERE operation = '$operation-pgbench'"

# Each ratio is taken in rounds at max_level clients, its contenders back to
# back within a round (load from elsewhere on the machine drifts over
# minutes); RATIOS are the medians over the rounds.
half=""
peak=""
peak_of=""

# Runs the contenders at `c` clients. `round` 0: every contender, for the
# tables (levels below max_level). At max_level, round 1 runs every
# contender and the fixed-rate pair and starts the ratio rounds; rounds 2
# and up run only the contenders of the ratios.
run_level() {
  local c="$1" round="$2"
  local tag="$c" all=$((round <= 1)) hot=$((c / 16 > 0 ? c / 16 : 1))
  if ((round > 1)); then
    tag="$c-round$round"
  fi
  # The table section of a run: none ("-") in the repeat rounds.
  section() { if ((all)); then echo "$1"; else echo -; fi; }
  current_round="$round"
  if ((round > 0)); then
    log "== $c clients (pool $c), ratio round $round of $rounds"
  else
    log "== $c clients (pool $c)"
  fi

  run_pgbench "pgbench-fresh-$tag" fresh.sql "$c"
  record_pgbench "$(section fresh)" "pgbench fresh.sql" "$c" pgbench_fresh

  start_sidecar local "$c"
  psql_run -c CHECKPOINT
  run_idem "fresh-$tag" "$sidecar_pid" --target "$sidecar_addr" \
    --scenario fresh -c "$c" "${common[@]}"
  record_idem "$(section fresh)" "sidecar fresh (redis)" "$c" sidecar_fresh
  if ((round >= 1)); then
    if ((round == 1)); then
      # Half of the lower of the two contenders' peak fresh throughputs
      # (each the best over all client counts), the same for every round: a
      # load both can sustain. Above the slower one's peak its queue, and
      # so its p99 from the scheduled start, would grow without bound.
      read -r half peak peak_of < <(python3 "$report_py" fixed-rate \
        "$results") || true
      [[ -n "$peak_of" ]] || die "bench/report.py fixed-rate failed"
      log "fixed rate: $half/s (half of the $peak_of peak $peak/s)"
    fi
    psql_run -c CHECKPOINT
    run_idem "fresh-rate-$tag" "$sidecar_pid" --target "$sidecar_addr" \
      --scenario fresh -c "$c" --target-rate "$half" "${common[@]}"
    record_idem "$(section rate)" \
      "sidecar fresh --target-rate $half (redis)" "$c" sidecar_rate
    stop_sidecar
    run_pgbench "pgbench-rate-$tag" fresh.sql "$c" --rate "$half"
    record_pgbench "$(section rate)" "pgbench fresh.sql --rate $half" "$c" \
      pgbench_rate
    start_sidecar local "$c"
  fi
  if ((all)); then
    psql_run -c CHECKPOINT
    run_idem "contention-$tag" "$sidecar_pid" --target "$sidecar_addr" \
      --scenario contention --key-space "$hot" -c "$c" "${common[@]}"
    record_idem contention "sidecar contention, hot keys: $hot" "$c"
    psql_run -c CHECKPOINT
    run_idem "mixed-$tag" "$sidecar_pid" --target "$sidecar_addr" \
      --scenario mixed --no-preload --key-space "$pool_keys" -c "$c" \
      "${common[@]}"
    record_idem mixed "sidecar mixed (90% replay-redis)" "$c"
  fi
  if ((all)); then
    run_idem "replay-local-$tag" "$sidecar_pid" --target "$sidecar_addr" \
      --scenario replay-redis --no-preload --key-space "$pool_keys" -c "$c" \
      "${common[@]}"
    record_idem replay "sidecar replay, in-process cache (default)" "$c"
  fi
  stop_sidecar

  start_sidecar redis "$c"
  run_idem "replay-redis-$tag" "$sidecar_pid" --target "$sidecar_addr" \
    --scenario replay-redis --no-preload --key-space "$pool_keys" -c "$c" \
    "${common[@]}"
  record_idem "$(section replay)" "sidecar replay-redis" "$c" replay_redis
  stop_sidecar

  run_idem "echo-$tag" "$echo_pid" --target "$echo_addr" --scenario replay \
    --no-preload -c "$c" "${common[@]}"
  record_idem "$(section replay)" "echo (idem-bench-echo)" "$c" echo
  if ((all)); then
    run_idem "echo-handoff-$tag" "$handoff_pid" --target "$handoff_addr" \
      --scenario replay --no-preload -c "$c" "${common[@]}"
    record_idem replay "echo, answered from another thread (--handoff)" \
      "$c"
  fi

  start_sidecar no-redis "$c"
  psql_run -c CHECKPOINT
  run_idem "replay-pg-$tag" "$sidecar_pid" --target "$sidecar_addr" \
    --scenario replay-pg --no-preload --key-space "$pool_keys" -c "$c" \
    "${common[@]}"
  record_idem "$(section replay)" "sidecar replay-pg" "$c" replay_pg
  if ((all)); then
    psql_run -c CHECKPOINT
    run_idem "fresh-noredis-$tag" "$sidecar_pid" --target "$sidecar_addr" \
      --scenario fresh -c "$c" "${common[@]}"
    record_idem fresh "sidecar fresh (no redis)" "$c"
  fi
  stop_sidecar
  if ((all && c > 1)); then
    # What folding concurrent statements into batches buys.
    start_sidecar unbatched "$c"
    psql_run -c CHECKPOINT
    run_idem "fresh-unbatched-$tag" "$sidecar_pid" --target "$sidecar_addr" \
      --scenario fresh -c "$c" "${common[@]}"
    record_idem fresh "sidecar fresh (no redis, --pg-max-batch 1)" "$c"
    stop_sidecar
  fi
  if ((all)); then
    run_pgbench "pgbench-replay-$tag" replay.sql "$c" \
      "${pgbench_replay_vars[@]}"
    record_pgbench replay "pgbench replay.sql" "$c"
  fi
}

for c in "${levels[@]}"; do
  run_level "$c" 0
done
for ((round = 1; round <= rounds; round++)); do
  run_level "$max_level" "$round"
done

# ---------------------------------------------------------------- report
# The machine and versions, raw; bench/report.py computes the rest.
meta load_after "$(cut -d ' ' -f 1-3 /proc/loadavg)"
meta cpu_model "$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
meta nproc "$(nproc)"
meta mem_kib "$(awk '/^MemTotal/ { print $2 }' /proc/meminfo)"
meta kernel "$(uname -sr)"
git_rev="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git -C "$root" status --porcelain 2>/dev/null | head -n 1)" ]]; then
  git_rev+=" (with uncommitted changes)"
fi
meta git_rev "$git_rev"
meta postgres_version "$("$pg_bindir/postgres" --version)"
meta pgbench_version "$("$pg_bindir/pgbench" --version)"
meta redis_version "$(redis-server --version | cut -d ' ' -f 1-3)"
meta grpc_version "$(pkg-config --modversion grpc++ 2>/dev/null || echo unknown)"
meta compiler "$(c++ --version | head -n 1)"
meta allocator_sidecar "$(allocator_of "$sidecar")"
meta allocator_echo "$(allocator_of "$echo_server")"
cp "$settings" "$results/bench.conf"

ratios="$(python3 "$report_py" report "$results" "$output")" ||
  die "bench/report.py could not write the report (raw results: $results)"
log "wrote $output"
echo "$ratios"
