#!/usr/bin/env bash
# Quick start on one machine, everything under .local/ of the repository:
#   scripts/run-local.sh            install missing packages (root), build,
#                                   start PostgreSQL, Redis and the sidecar,
#                                   then run the quick-start client; builds
#                                   idemctl too and prints commands for it
#   scripts/run-local.sh services   start only PostgreSQL and Redis
#   scripts/run-local.sh status     say what is running
#   scripts/run-local.sh stop       stop the sidecar, Redis and PostgreSQL
# Environment: IDEM_PG_PORT (54329), IDEM_REDIS_PORT (63799),
# IDEM_SIDECAR_PORT (50051), IDEM_LOCAL_DIR (<repo>/.local),
# IDEM_PG_BINDIR (newest /usr/lib/postgresql/*/bin).
# Re-running is safe: PostgreSQL is initialised once and reused, Redis is
# reused, and a sidecar left by an earlier run is restarted.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/deps.sh
source "$root/scripts/deps.sh"

local_dir="${IDEM_LOCAL_DIR:-$root/.local}"
pg_port="${IDEM_PG_PORT:-54329}"
redis_port="${IDEM_REDIS_PORT:-63799}"
sidecar_port="${IDEM_SIDECAR_PORT:-50051}"
pg_dir="$local_dir/pg"
pg_data="$pg_dir/data"
pg_log="$pg_dir/log"
redis_dir="$local_dir/redis"
sidecar_log="$local_dir/sidecar.log"
sidecar_pid_file="$local_dir/sidecar.pid"
build_dir="$root/build"
sidecar_bin="$build_dir/server/idempotency-sidecar"
quickstart_bin="$build_dir/client/idem-quickstart"
idemctl_bin="$build_dir/client/idemctl"

say() { echo "run-local: $*" >&2; }
die() { say "$*"; exit 1; }

is_root() { [[ "$(id -u)" == 0 ]]; }

pg_bindir() {
  if [[ -n "${IDEM_PG_BINDIR:-}" ]]; then
    echo "$IDEM_PG_BINDIR"
    return
  fi
  local best
  best="$(printf '%s\n' /usr/lib/postgresql/*/bin/initdb | sort -V | tail -n 1)"
  best="${best%/initdb}"
  [[ -x "$best/initdb" ]] || best=""
  [[ -n "$best" ]] || die "no PostgreSQL in /usr/lib/postgresql (set IDEM_PG_BINDIR)"
  echo "$best"
}

# Runs a command as the owner of the PostgreSQL data: postgres when root.
as_pg() {
  if is_root; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Waits up to $2 seconds for 127.0.0.1:$1 to accept connections.
wait_port() {
  local deadline=$((SECONDS + $2))
  until port_open "$1"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

# --- PostgreSQL --------------------------------------------------------------

pg_running() {
  [[ -f "$pg_data/PG_VERSION" ]] &&
    as_pg "$(pg_bindir)/pg_ctl" -D "$pg_data" status >/dev/null 2>&1
}

pg_start() {
  local bindir
  bindir="$(pg_bindir)"
  mkdir -p "$pg_dir"
  if is_root; then
    chown postgres: "$pg_dir"
    runuser -u postgres -- test -w "$pg_dir" ||
      die "user postgres cannot write $pg_dir (a parent directory is closed to it); set IDEM_LOCAL_DIR, e.g. IDEM_LOCAL_DIR=/tmp/idem-local"
  fi
  if [[ ! -f "$pg_data/PG_VERSION" ]]; then
    say "initialising PostgreSQL in $pg_data"
    (cd "$pg_dir" && as_pg "$bindir/initdb" -D "$pg_data" -U postgres \
      -A trust -E UTF8 --locale=C --no-instructions >/dev/null)
    echo "include_if_exists = 'idem-local.conf'" |
      as_pg tee -a "$pg_data/postgresql.conf" >/dev/null
  fi
  if pg_running; then
    local running_port
    running_port="$(sed -n 4p "$pg_data/postmaster.pid")"
    if [[ "$running_port" != "$pg_port" ]]; then
      say "PostgreSQL already runs on port $running_port (not $pg_port); using it"
      pg_port="$running_port"
    fi
    say "PostgreSQL already running on port $pg_port"
    return
  fi
  printf "port = %s\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\n" \
    "$pg_port" "$pg_dir" | as_pg tee "$pg_data/idem-local.conf" >/dev/null
  say "starting PostgreSQL on 127.0.0.1:$pg_port (log $pg_log)"
  (cd "$pg_dir" && as_pg "$bindir/pg_ctl" -D "$pg_data" -l "$pg_log" -w -t 60 \
    start >/dev/null) || {
    tail -n 30 "$pg_log" >&2 || true
    die "PostgreSQL did not start"
  }
}

pg_stop() {
  if pg_running; then
    say "stopping PostgreSQL"
    (cd "$pg_dir" && as_pg "$(pg_bindir)/pg_ctl" -D "$pg_data" -m fast -w \
      -t 60 stop >/dev/null)
  fi
}

pg_conninfo() {
  echo "host=127.0.0.1 port=$pg_port user=postgres dbname=postgres"
}

# --- Redis -------------------------------------------------------------------

redis_pid() {
  local pid
  pid="$(cat "$redis_dir/redis.pid" 2>/dev/null)" || return 1
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

redis_ping() {
  [[ "$(redis-cli -h 127.0.0.1 -p "$redis_port" ping 2>/dev/null)" == PONG ]]
}

redis_start() {
  mkdir -p "$redis_dir"
  if redis_ping; then
    say "Redis already running on port $redis_port"
    return
  fi
  say "starting Redis on 127.0.0.1:$redis_port (log $redis_dir/redis.log)"
  redis-server --port "$redis_port" --bind 127.0.0.1 --save "" \
    --appendonly no --dir "$redis_dir" --daemonize yes \
    --pidfile "$redis_dir/redis.pid" --logfile "$redis_dir/redis.log"
  local deadline=$((SECONDS + 10))
  until redis_ping; do
    if ((SECONDS >= deadline)); then
      tail -n 30 "$redis_dir/redis.log" >&2 || true
      die "Redis did not start"
    fi
    sleep 0.1
  done
}

redis_stop() {
  local pid
  if pid="$(redis_pid)"; then
    say "stopping Redis"
    kill -TERM "$pid"
    local deadline=$((SECONDS + 10))
    while kill -0 "$pid" 2>/dev/null; do
      if ((SECONDS >= deadline)); then
        kill -KILL "$pid" 2>/dev/null || true
        break
      fi
      sleep 0.1
    done
  fi
  rm -f "$redis_dir/redis.pid"
}

# --- sidecar -----------------------------------------------------------------

# Prints the pid of the sidecar started by an earlier run, if it still runs.
sidecar_pid() {
  local pid
  pid="$(cat "$sidecar_pid_file" 2>/dev/null)" || return 1
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null &&
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null |
    grep -q idempotency-sidecar && echo "$pid"
}

sidecar_stop() {
  local pid
  if pid="$(sidecar_pid)"; then
    say "stopping the sidecar (pid $pid)"
    kill -TERM "$pid"
    local deadline=$((SECONDS + 15))
    while kill -0 "$pid" 2>/dev/null; do
      if ((SECONDS >= deadline)); then
        kill -KILL "$pid" 2>/dev/null || true
        break
      fi
      sleep 0.1
    done
  fi
  rm -f "$sidecar_pid_file"
}

sidecar_start() {
  sidecar_stop
  if port_open "$sidecar_port"; then
    die "something else listens on 127.0.0.1:$sidecar_port; set IDEM_SIDECAR_PORT"
  fi
  local conninfo
  conninfo="$(pg_conninfo)"
  say "applying migrations"
  "$sidecar_bin" migrate --postgres="$conninfo"
  # The key that signs the sidecar's Redis values (docs/redis.md): 32
  # random bytes in hex, made once and kept, so that restarts still accept
  # what is cached.
  local mac_key="$local_dir/redis-mac-key"
  if [[ ! -s "$mac_key" ]]; then
    (umask 077 && head -c 32 /dev/urandom | od -An -vtx1 | tr -d ' \n' >"$mac_key")
  fi
  say "starting the sidecar on 127.0.0.1:$sidecar_port (log $sidecar_log)"
  nohup "$sidecar_bin" --listen="127.0.0.1:$sidecar_port" \
    --postgres="$conninfo" --redis="127.0.0.1:$redis_port" \
    --redis-mac-key-file="$mac_key" \
    >>"$sidecar_log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$sidecar_pid_file"
  local deadline=$((SECONDS + 20))
  until port_open "$sidecar_port"; do
    if ! kill -0 "$pid" 2>/dev/null || ((SECONDS >= deadline)); then
      tail -n 30 "$sidecar_log" >&2 || true
      die "the sidecar did not start"
    fi
    sleep 0.1
  done
}

# --- commands ----------------------------------------------------------------

build() {
  say "building into $build_dir"
  cmake -S "$root" -B "$build_dir" >/dev/null
  cmake --build "$build_dir" -j"$(nproc)" \
    --target idempotency-sidecar idem-quickstart idemctl
}

print_summary() {
  cat <<MSG

PostgreSQL: $(pg_conninfo)   (log $pg_log)
Redis:      127.0.0.1:$redis_port   (log $redis_dir/redis.log)
MSG
  if sidecar_pid >/dev/null; then
    echo "Sidecar:    127.0.0.1:$sidecar_port   (log $sidecar_log)"
    if [[ -x "$idemctl_bin" ]]; then
      echo
      echo "Operate it with idemctl (docs/idemctl.md):"
      echo "  $idemctl_bin --addr 127.0.0.1:$sidecar_port list --status unknown"
      echo "  $idemctl_bin --addr 127.0.0.1:$sidecar_port health"
    fi
  fi
  echo
  echo "Stop everything: scripts/run-local.sh stop"
}

cmd_start() {
  idem_install_deps
  build
  mkdir -p "$local_dir"
  pg_start
  redis_start
  sidecar_start
  local rc=0
  say "running the quick-start client"
  # It prints an idemctl command to look at its record; give it the path of
  # the idemctl just built, so that the command works as printed.
  "$quickstart_bin" --addr="127.0.0.1:$sidecar_port" |
    sed "s|^  idemctl |  $idemctl_bin |" || rc=$?
  print_summary
  return "$rc"
}

cmd_services() {
  idem_install_deps
  mkdir -p "$local_dir"
  pg_start
  redis_start
  print_summary
}

cmd_stop() {
  sidecar_stop
  redis_stop
  pg_stop
  say "stopped"
}

cmd_status() {
  local pid
  if pid="$(sidecar_pid)"; then
    echo "sidecar:    running (pid $pid, 127.0.0.1:$sidecar_port)"
  else
    echo "sidecar:    stopped"
  fi
  if redis_ping; then
    echo "redis:      running (127.0.0.1:$redis_port)"
  else
    echo "redis:      stopped"
  fi
  if pg_running; then
    echo "postgresql: running (port $(sed -n 4p "$pg_data/postmaster.pid"))"
  else
    echo "postgresql: stopped"
  fi
}

case "${1:-start}" in
  start) cmd_start ;;
  services) cmd_services ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
