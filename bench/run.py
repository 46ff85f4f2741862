#!/usr/bin/env python3
"""The side-by-side benchmark: what the sidecar costs compared with running
the same SQL directly, and how close it is to the fastest RPC the machine
can serve. Everything is measured in one run, on one throwaway PostgreSQL
with one settings file, because absolute numbers drift on a shared machine
while ratios within one run hold.

  bash bench/run.sh [--quick]
                    [--gateway-only | --one-call-only | --cached-only]
                    [--build-dir DIR]
                    [--output FILE]

Contenders, at 1, 8, 32 and 64 clients (--quick: 1, 8 and 64, shorter runs):
  pgbench -M prepared running bench/sql/fresh.sql and replay.sql (the
    sidecar's own statements), with as many connections as the sidecar's
    --pg-pool-size in that run, bench/sql/pair.sql (the INSERT ... ON
    CONFLICT DO NOTHING and guarded UPDATE a service would write by hand,
    on the same table) and bench/sql/select.sql (the primary-key SELECT a
    service would write by hand to replay an answer);
  the sidecar (Release build, --log-level=warn, default batching) with
    Redis: fresh, replay-redis, contention, mixed; without Redis:
    replay-pg, fresh, and fresh with --pg-max-batch 1 (no batching; not at
    1 client, where there is nothing to fold);
  idem-bench-echo (a server that answers Begin at once) under the same
    generator (idem-bench) as the sidecar, and (not in the ratios)
    idem-bench-echo --handoff, which answers from a thread of its own as
    the sidecar answers a replay from PostgreSQL;
  at 64 clients also the sidecar's fresh scenario and pgbench fresh.sql at
    a fixed arrival rate, half of the lower of the two peak fresh rates
    (sidecar, pgbench), for p99.
The contenders of the ratios run 3 times at 64 clients, back to back within
each round; the ratios are the medians. Then 3 rounds at one client: the
sidecar (default flags, no Redis) running fresh Begin + Complete, pgbench
running pair.sql and pgbench running fresh.sql, back to back, each first
once; their mean latency ratios are one_call_vs_pair and
one_call_vs_own_sql. Then the HTTP gateway's row
(docs/gateway.md): h2load --h1 at 64 connections POSTs one
Idempotency-Key through a sidecar (default flags, --http-listen) in front
of idem-bench-http-upstream, a trivial single-threaded HTTP/1.1 service,
so that every request is a replay from the in-process cache; and the same
h2load run against that service directly, and against nginx (nginx-light,
one process, config generated into the results directory) answering the
same 201 itself; then GETs with no key passed through the gateway to the
service, against nginx proxy_pass with upstream keep-alive to it; in each
of the 3 rounds all five, back to back, the order alternating. Then the
cached replay against the health Check: one sidecar (default flags, no
Redis), one finished key, and h2load (HTTP/2, 64 connections, one stream
each) sending Begin on that key, which the in-process cache answers, and
the standard grpc.health.v1.Health/Check, back to back in each of the 3
rounds, the order alternating. Last, bench/waiters.py (1,000
waiting Begins on one key over two sidecars, sent by h2load; --quick: one
round) on a PostgreSQL of its own. Records CPU seconds per 1,000
requests of the server (sidecar or echo), PostgreSQL and the load
generator, and each sidecar's peak RSS.

Writes BENCHMARKS.md at the repo root (or --output) and ends with the line
  RATIOS fresh_vs_pgbench=X fresh_vs_pair=P one_call_vs_pair=O
         one_call_vs_own_sql=Q replay_redis_vs_echo=Y
         replay_pg_vs_echo=Z replay_pg_vs_select=S p99_vs_pgbench=W
         gateway_replay_vs_upstream=G gateway_replay_vs_nginx=N
         gateway_pass_vs_nginx_proxy=K cached_replay_vs_health=H
         rss_mib=R
(one line). --gateway-only runs only PostgreSQL and the gateway's row, prints
its table and a GATEWAY line, and writes no report unless --output is
given; --one-call-only does the same for the one-client rounds (a ONE_CALL
line), --cached-only for the cached replay against the health Check (a
CACHED line). This program starts the processes and collects raw numbers into
a results directory; bench/report.py computes every median, ratio and table
from it (IDEM_BENCH_RESULTS=DIR keeps that directory, and
`python3 bench/report.py report DIR FILE` renders it again).
Exits non-zero if any contender fails. Binaries come from a Release build in
build-bench/ (configured and built here) unless IDEM_SIDECAR, IDEM_BENCH and
IDEM_BENCH_ECHO name them (and IDEM_BENCH_HTTP_UPSTREAM
idem-bench-http-upstream and IDEM_BENCH_WAITERS idem-bench-waiters, by
default beside idem-bench). IDEM_PG_BINDIR
picks the PostgreSQL binaries (default: the newest
/usr/lib/postgresql/*/bin). Python 3, standard library
only; bench/run.sh is its launcher.
"""

import argparse
import collections
import difflib
import glob
import http.client
import os
import pwd
import random
import re
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every contender runs at each of `levels` clients, then ROUNDS times at
# MAX_LEVEL clients (the ratios are medians over those rounds).
MAX_LEVEL = 64
ROUNDS = 3
SNAPSHOT_BYTES = 256
# bench/waiters.py's crowd of waiting Begins on one key.
WAITERS = 1000
TENANT = "bench"
OPERATION = "bench"
# The gateway's row: h2load's connections, the key every request replays
# and the body it sends.
GATEWAY_CLIENTS = 64
GATEWAY_KEY = "bench-gateway-1"
GATEWAY_BODY = b'{"amount":10,"currency":"EUR"}'
# idem-bench-http-upstream's answer, which nginx gives itself in the
# gateway's row.
UPSTREAM_BODY = b'{"id":"pay_1","status":"created","amount":10}'
# nginx for the gateway's row: one process (no master), access log off;
# one server answering itself, one proxying with upstream keep-alive.
NGINX_CONF = """\
worker_processes 1;
master_process off;
daemon off;
pid %(dir)s/nginx.pid;
error_log %(dir)s/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %(tmp)s;
  proxy_temp_path %(tmp)s;
  fastcgi_temp_path %(tmp)s;
  uwsgi_temp_path %(tmp)s;
  scgi_temp_path %(tmp)s;
  keepalive_requests 1000000;
  upstream service {
    server %(upstream)s;
    keepalive 32;
  }
  server {
    listen %(answer)s;
    location / {
      default_type application/json;
      return 201 '%(body)s';
    }
  }
  server {
    listen %(proxy)s;
    location / {
      proxy_pass http://service;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
"""
# The cached replay against the health Check: h2load's connections (one
# stream each), the finished key every Begin replays, the two gRPC methods
# and what field 1 of their answers must hold (BeginResponse.outcome
# COMPLETED, HealthCheckResponse.status SERVING).
CACHED_CLIENTS = 64
CACHED_OPERATION = "bench-cached"
CACHED_KEY = "bench-cached-1"
BEGIN_PATH = "/idempotency.v1.Idempotency/Begin"
HEALTH_PATH = "/grpc.health.v1.Health/Check"
OUTCOME_COMPLETED = 3
SERVING = 1
PAIR = "pgbench pair.sql (hand-written pair)"
# The one-client rounds' sidecar: its default --pg-pool-size.
ONE_CALL_POOL = 8

Plan = collections.namedtuple("Plan", "levels warmup_s duration_s pool_keys")


def plan(quick):
    """The client counts below MAX_LEVEL, run lengths and replay pool."""
    if quick:
        return Plan(levels=[1, 8], warmup_s=1, duration_s=3, pool_keys=2000)
    return Plan(levels=[1, 8, 32], warmup_s=3, duration_s=15, pool_keys=10000)


# The settings file of every contender; PORT and SOCKET_DIR filled in.
PG_SETTINGS = """\
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{socket_dir}'
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
"""

# The statements PostgreSQL ran since the last reset, as "calls<TAB>text"
# lines, in a form that ignores what may legitimately differ between the
# sidecar's text and a pgbench script: parameter numbers, comments, layout
# and literal constants (which pg_stat_statements turns into parameters).
TRACKED_STATEMENTS = r"""SELECT sum(calls), t FROM (SELECT calls,
  btrim(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
  query, '--[^\n]*', '', 'g'), '\$[0-9]+', '$', 'g'), '\s+', ' ',
  'g'), ';\s*$', '')) AS t FROM pg_stat_statements
  WHERE query !~* 'pg_stat_statements') s GROUP BY t ORDER BY t"""

BINARY_VARS = ("IDEM_SIDECAR", "IDEM_BENCH", "IDEM_BENCH_ECHO")


class Failed(Exception):
    """The benchmark cannot go on; the message says why."""


def log(message):
    print("[bench %s] %s" % (time.strftime("%H:%M:%S"), message),
          file=sys.stderr, flush=True)


# ------------------------------------------------------------------ pure
def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="bench/run.sh", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="1, 8 and 64 clients; 1 s warmup, 3 s per run")
    parser.add_argument("--build-dir",
                        default=os.path.join(ROOT, "build-bench"),
                        help="the Release build (default: build-bench/)")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--gateway-only", action="store_true",
                      help="only the HTTP gateway's row (PostgreSQL, the "
                      "upstream, one sidecar); prints its table")
    only.add_argument("--one-call-only", action="store_true",
                      help="only the one-client rounds (PostgreSQL, one "
                      "sidecar at a time, pgbench); prints their table")
    only.add_argument("--cached-only", action="store_true",
                      help="only the cached replay against the health Check "
                      "(PostgreSQL, one sidecar, h2load); prints its table")
    parser.add_argument("--output",
                        help="the report (default: BENCHMARKS.md; with "
                        "--gateway-only, --one-call-only or --cached-only: "
                        "none)")
    args = parser.parse_args(argv)
    if args.output is None and not (args.gateway_only or args.one_call_only
                                    or args.cached_only):
        args.output = os.path.join(ROOT, "BENCHMARKS.md")
    return args


def command_line(argv, env, sidecar, bench, echo_server, root=ROOT):
    """How this run was started, for the report's first line: the binaries
    given in the environment, relative to the repository."""
    cmd = " ".join(["bash bench/run.sh"] + list(argv))
    if any(env.get(v) for v in BINARY_VARS):
        sidecar, bench, echo_server = (
            p[len(root) + 1:] if p.startswith(root + "/") else p
            for p in (sidecar, bench, echo_server))
        cmd = "IDEM_SIDECAR=%s IDEM_BENCH=%s IDEM_BENCH_ECHO=%s %s" % (
            sidecar, bench, echo_server, cmd)
    return cmd


def newest_pg_bindir(paths):
    """The newest of /usr/lib/postgresql/<version>/bin, as `sort -V`."""
    def version(path):
        name = os.path.basename(os.path.dirname(path))
        return [int(n) for n in re.findall(r"\d+", name)]
    return max(paths, key=version) if paths else None


def stat_fields(text):
    """The fields of /proc/PID/stat after "pid (comm) ", from state on: the
    command name may itself hold spaces and parentheses."""
    return text[text.rindex(") ") + 2:].split()


def ticks(text, with_children=False):
    """utime + stime (and with_children: + cutime + cstime) of a
    /proc/PID/stat text, in clock ticks."""
    f = stat_fields(text)
    return sum(int(x) for x in f[11:15 if with_children else 13])


def per_request(rows, requests):
    """From (calls, statement) rows, the statements run at least once per
    request on average, as "times per request<TAB>statement", sorted."""
    return sorted("%d\t%s" % (int(calls / requests + 0.5), text)
                  for calls, text in rows if calls >= requests / 2)


def pgbench_vars(body, pool_keys):
    """The pgbench -D variables of bench/sql/*.sql: `body` the snapshot's
    bytes; replay.sql reads keys 0..pool_keys-1."""
    out = []
    for kv in ("tenant=" + TENANT, "operation=%s-pgbench" % OPERATION,
               "hash=\\x" + "ab" * 32, "body=\\x" + body.hex(),
               "content_type=application/octet-stream", "headers={}",
               "processing=PROCESSING", "succeeded=SUCCEEDED",
               "t=true", "f=false", "pool=%d" % pool_keys):
        out += ["-D", kv]
    return out


def sidecar_flags(kind, redis_addr, mac_key_file):
    """The flags that make a sidecar of `kind`: "local" (Redis and the
    default in-process cache of finished records); "redis" (Redis, no
    in-process cache: every replay is a Redis GET); "no-redis" (neither:
    every replay reads PostgreSQL); "unbatched" (as no-redis, and
    --pg-max-batch 1: every call its own statement); "verify" (as
    no-redis); "default", "gateway" and "cached" (no Redis, the in-process
    cache: the sidecar's defaults). With Redis, `mac_key_file` holds the
    key that signs its values."""
    flags = []
    if kind in ("redis", "local"):
        flags += ["--redis", redis_addr, "--redis-mac-key-file", mac_key_file]
    if kind not in ("local", "default", "gateway", "cached"):
        flags += ["--local-cache-mib", "0"]
    if kind == "unbatched":
        flags += ["--pg-max-batch", "1"]
    return flags


def last_line(text, prefix):
    """The last line of `text` that starts with `prefix`, or ""."""
    lines = [l for l in text.splitlines() if l.startswith(prefix)]
    return lines[-1] if lines else ""


def last_result(text):
    """The last "RESULT k=v ..." line of an idem-bench output, or ""."""
    return last_line(text, "RESULT ")


def metric_sum(page, name, **labels):
    """The sum of metric `name`'s samples in a Prometheus text `page` whose
    labels include `labels` (values compared without case)."""
    total = 0.0
    for m in re.finditer(r"^%s(\{[^}]*\})? (\S+)$" % re.escape(name), page,
                         re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k, "").lower() == v.lower()
               for k, v in labels.items()):
            total += float(m.group(2))
    return total


def h2load_result(text, log, status="201"):
    """The RESULT line (as idem-bench's) of an h2load run: its output
    `text` and its --log-file `log` (start_us, status, duration_us per
    request). Errors: failed, errored or timed-out requests and any answer
    other than `status`. Raises ValueError when the output has no
    summary."""
    rate = re.search(r"^finished in \S+, ([0-9.]+) req/s", text, re.M)
    counts = re.search(r"^requests: (\d+) total, \d+ started, \d+ done, "
                       r"(\d+) succeeded, (\d+) failed, (\d+) errored, "
                       r"(\d+) timeout", text, re.M)
    if not rate or not counts:
        raise ValueError("no h2load summary")
    latencies, other = [], 0
    for line in log.splitlines():
        fields = line.split("\t")
        if len(fields) < 3:
            continue
        if fields[1] != status:
            other += 1
        latencies.append(int(fields[2]))
    latencies.sort()
    n = len(latencies)

    def pct(p):
        return latencies[min(n - 1, int(n * p))] if n else 0
    errors = sum(int(counts.group(i)) for i in (3, 4, 5)) + other
    return ("RESULT throughput=%s p50_us=%d p90_us=%d p99_us=%d p999_us=%d "
            "errors=%d requests_total=%s" % (
                rate.group(1), pct(0.5), pct(0.9), pct(0.99), pct(0.999),
                errors, counts.group(1)))


def proto_field1(message):
    """The value of varint field 1 of a serialised protobuf `message`, 0 if
    absent (proto3 leaves a zero out); raises ValueError if it does not
    parse."""
    def varint(i):
        value, shift = 0, 0
        while True:
            if i >= len(message) or shift > 63:
                raise ValueError("truncated varint")
            b = message[i]
            value |= (b & 0x7f) << shift
            i, shift = i + 1, shift + 7
            if not b & 0x80:
                return value, i
    i = 0
    while i < len(message):
        tag, i = varint(i)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, i = varint(i)
            if number == 1:
                return value
        elif wire == 1:
            i += 8
        elif wire == 2:
            size, i = varint(i)
            i += size
        elif wire == 5:
            i += 4
        else:
            raise ValueError("wire type %d" % wire)
        if i > len(message):
            raise ValueError("truncated field %d" % number)
    return 0


def grpc_answer(verbose, body):
    """(grpc-status, field 1 of the answer) of one unary gRPC call made with
    nghttp: `verbose` its `nghttp -v` output, which shows the trailers,
    `body` the response's bytes (one gRPC message: a flag byte, a 4-byte
    big-endian length, the message). grpc-status is None when the
    trailers have none, field 1 None when the body is not one message."""
    m = re.search(r"^\[[ 0-9.]+\] recv \(stream_id=\d+\) grpc-status: (\d+)$",
                  verbose, re.M)
    status = int(m.group(1)) if m else None
    if len(body) < 5 or body[0] != 0 or \
            int.from_bytes(body[1:5], "big") != len(body) - 5:
        return status, None
    try:
        return status, proto_field1(body[5:])
    except ValueError:
        return status, None


# ------------------------------------------------------------------ system
def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def proc_ticks(pid, with_children=False):
    return ticks(read("/proc/%d/stat" % pid), with_children)


def children_of(pid):
    """The live child processes of `pid` (as pgrep -P)."""
    kids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if stat_fields(read("/proc/%s/stat" % name))[1] == str(pid):
                    kids.append(int(name))
            except (OSError, ValueError, IndexError):
                pass  # exited meanwhile
    return kids


def children_cpu_s():
    """CPU seconds of this process's children that have been waited for:
    grows by a load generator's once subprocess.run returns."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


_ports_given = set()


def free_port():
    """A free loopback port below the ephemeral range, which others' port-0
    binds and outgoing connections use."""
    try:
        low = int(read("/proc/sys/net/ipv4/ip_local_port_range").split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    while True:
        port = random.randrange(10000, low)
        if port in _ports_given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _ports_given.add(port)
        return port


def redis_ping(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def output_of(cmd):
    """What a command prints on stdout; "" if it cannot run."""
    try:
        return subprocess.run(cmd, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True).stdout
    except OSError:
        return ""


def first_line(cmd):
    """The first line a command prints, or "unknown"."""
    out = output_of(cmd)
    return out.splitlines()[0] if out.strip() else "unknown"


def allocator_of(binary):
    """The malloc a binary links (CMake IDEM_MALLOC): tcmalloc or glibc."""
    return ("tcmalloc" if "libtcmalloc" in output_of(["ldd", binary])
            else "glibc")


def executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


# ------------------------------------------------------------------ binaries
def find_binaries(build_dir):
    """(sidecar, idem-bench, idem-bench-echo): from the environment, else
    from a Release build in build_dir configured and built here."""
    sidecar, bench, echo_server = (os.environ.get(v, "") for v in BINARY_VARS)
    if not (sidecar and bench and echo_server):
        top = read(os.path.join(ROOT, "CMakeLists.txt"))
        if not re.search(r"^\s*add_subdirectory\(\s*bench\s*\)", top, re.M):
            raise Failed(
                "the top-level CMakeLists.txt has no add_subdirectory(bench), "
                "so idem-bench is not built; add it, or point IDEM_SIDECAR, "
                "IDEM_BENCH and IDEM_BENCH_ECHO at built binaries")
        log("building (Release) in %s" % build_dir)
        for cmd in (["cmake", "-S", ROOT, "-B", build_dir,
                     "-DCMAKE_BUILD_TYPE=Release"],
                    ["cmake", "--build", build_dir, "-j%d" % os.cpu_count(),
                     "--target", "idempotency-sidecar", "idem-bench",
                     "idem-bench-echo", "idem-bench-waiters",
                     "idem-bench-http-upstream"]):
            if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode:
                raise Failed("%s failed" % " ".join(cmd))
        sidecar = sidecar or os.path.join(build_dir, "server",
                                          "idempotency-sidecar")
        bench = bench or os.path.join(build_dir, "bench", "idem-bench")
        echo_server = echo_server or os.path.join(build_dir, "bench",
                                                  "idem-bench-echo")
    for b in (sidecar, bench, echo_server):
        if not executable(b):
            raise Failed("%s: not an executable" % b)
    return sidecar, bench, echo_server


def find_pg_bindir():
    bindir = (os.environ.get("IDEM_PG_BINDIR") or
              newest_pg_bindir(glob.glob("/usr/lib/postgresql/*/bin")))
    for tool in ("initdb", "pg_ctl", "postgres", "psql", "pgbench"):
        if not bindir or not executable(os.path.join(bindir, tool)):
            raise Failed("%s/%s not found (set IDEM_PG_BINDIR)" %
                         (bindir or "/usr/lib/postgresql/*/bin", tool))
    return bindir


# ------------------------------------------------------------------ the run
Measured = collections.namedtuple(
    "Measured", "server_ticks pg_ticks client_ticks result")
Sidecar = collections.namedtuple("Sidecar", "proc kind pool addr log")


class Bench:
    def __init__(self, args, argv):
        self.args = args
        self.argv = argv
        self.plan = plan(args.quick)
        self.hz = os.sysconf("SC_CLK_TCK")
        self.procs = []        # every background process, for cleanup
        self.tmp = None
        self.pgdata = None     # set once PostgreSQL may be running
        self.sidecar = None    # the running sidecar
        self.round = 0         # the ratio round being run (0: none)
        self.pg_aux = 0

    # -------------------------------------------------------------- processes
    def spawn(self, cmd, output):
        """Starts a background process, its output appended to `output`."""
        with open(output, "a") as f:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f,
                                    stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def run_logged(self, cmd, output, **kw):
        """Runs a command to completion, its output in `output`; returns
        (exit code, output)."""
        with open(output, "w") as f:
            rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=f,
                                stderr=subprocess.STDOUT, **kw).returncode
        return rc, read(output)

    def cleanup(self):
        """Stops everything started (SIGTERM, up to 10 s, then SIGKILL) and
        removes the temporary directory."""
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.pgdata:
            stop = self.as_postgres([self.pg("pg_ctl"), "-D", self.pgdata,
                                     "-m", "immediate", "-w", "stop"])
            try:
                ok = subprocess.run(stop, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL,
                                    timeout=60).returncode == 0
            except subprocess.TimeoutExpired:
                ok = False
            pidfile = os.path.join(self.pgdata, "postmaster.pid")
            if not ok and os.path.exists(pidfile):
                try:
                    os.kill(int(read(pidfile).split()[0]), signal.SIGKILL)
                except (OSError, ValueError, IndexError):
                    pass
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def out(self, name):
        return os.path.join(self.tmp, "out", name)

    # -------------------------------------------------------------- PostgreSQL
    def pg(self, tool):
        return os.path.join(self.pg_bindir, tool)

    def as_postgres(self, cmd):
        """As root, PostgreSQL runs as the postgres user."""
        return (["runuser", "-u", "postgres", "--"] + cmd
                if os.geteuid() == 0 else cmd)

    def psql(self, *args):
        """Runs psql with `args`; returns what it prints."""
        cmd = [self.pg("psql"), "-X", "-q", "-h", "127.0.0.1", "-p",
               str(self.pg_port), "-U", "postgres", "-d", "postgres",
               "-v", "ON_ERROR_STOP=1"] + list(args)
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, text=True)
        if p.returncode:
            raise Failed("psql %s failed" % " ".join(args))
        return p.stdout

    def postmaster(self):
        pidfile = os.path.join(self.pgdata, "postmaster.pid")
        return int(read(pidfile).split()[0])

    def pg_ticks(self):
        """CPU of the whole cluster in clock ticks: the postmaster with the
        children it has reaped, plus its live children."""
        pm = self.postmaster()
        total = proc_ticks(pm, with_children=True)
        for child in children_of(pm):
            try:
                total += proc_ticks(child)
            except (OSError, ValueError, IndexError):
                pass  # reaped meanwhile: counted in the postmaster's
        return total

    def wait_pg_idle(self):
        """Waits (up to 5 s) until PostgreSQL has only its own background
        processes left: the CPU of a backend whose client disconnected
        counts in pg_ticks only once the postmaster has reaped it."""
        for _ in range(100):
            if len(children_of(self.postmaster())) <= self.pg_aux:
                return
            time.sleep(0.05)

    def start_postgres(self):
        self.pg_port = free_port()
        pgdir = os.path.join(self.tmp, "pg")
        pgdata = os.path.join(pgdir, "data")
        if os.geteuid() == 0:
            try:
                postgres = pwd.getpwnam("postgres")
            except KeyError:
                raise Failed("running as root needs a 'postgres' user")
            os.chown(pgdir, postgres.pw_uid, postgres.pw_gid)
        log("initdb in %s (port %d)" % (pgdata, self.pg_port))
        rc, text = self.run_logged(self.as_postgres(
            [self.pg("initdb"), "-D", pgdata, "-U", "postgres", "-A", "trust",
             "-E", "UTF8", "--locale=C", "--no-instructions"]),
            self.out("initdb.txt"))
        if rc:
            sys.stderr.write(text)
            raise Failed("initdb failed")
        self.settings = os.path.join(pgdata, "bench.conf")
        with open(self.settings, "w") as f:
            f.write(PG_SETTINGS.format(port=self.pg_port, socket_dir=pgdir))
        if os.geteuid() == 0:
            os.chown(self.settings, postgres.pw_uid, postgres.pw_gid)
        with open(os.path.join(pgdata, "postgresql.conf"), "a") as f:
            f.write("include 'bench.conf'\n")
        self.pgdata = pgdata
        pglog = os.path.join(pgdir, "log")
        if subprocess.run(self.as_postgres(
                [self.pg("pg_ctl"), "-D", pgdata, "-l", pglog, "-w", "-t",
                 "60", "start"]), stdout=subprocess.DEVNULL).returncode:
            sys.stderr.write(read(pglog))
            raise Failed("PostgreSQL did not start")
        self.pg_conninfo = ("host=127.0.0.1 port=%d user=postgres "
                            "dbname=postgres" % self.pg_port)
        rc, text = self.run_logged(
            [self.sidecar_bin, "migrate", "--postgres=" + self.pg_conninfo],
            self.out("migrate.txt"))
        if rc:
            sys.stderr.write(text)
            raise Failed("migrate failed")
        # PostgreSQL's own background processes: the fewest children in 1 s.
        self.pg_aux = 1000
        for _ in range(10):
            self.pg_aux = min(self.pg_aux, len(children_of(self.postmaster())))
            time.sleep(0.1)

    # -------------------------------------------------------------- servers
    def start_redis(self):
        self.redis_port = free_port()
        self.spawn(["redis-server", "--port", str(self.redis_port), "--bind",
                    "127.0.0.1", "--save", "", "--appendonly", "no",
                    "--daemonize", "no", "--dir", self.tmp, "--logfile",
                    os.path.join(self.tmp, "redis.log")], os.devnull)
        for _ in range(100):
            if redis_ping(self.redis_port):
                return
            time.sleep(0.1)
        raise Failed("redis-server did not start")

    def start_echo(self, *flags):
        """Starts idem-bench-echo with `flags`; returns (process, address)."""
        output = self.out("echo%s.out" % "".join(flags))
        proc = self.spawn([self.echo_bin, "--listen", "127.0.0.1:0",
                           "--snapshot-bytes", str(SNAPSHOT_BYTES)] +
                          list(flags), output)
        for _ in range(100):
            m = re.search(r"^listening on (\S+)", read(output), re.M)
            if m:
                return proc, m.group(1)
            time.sleep(0.05)
        raise Failed("idem-bench-echo %s did not start" % " ".join(flags))

    def redis_mac_key(self):
        """The file holding the sidecars' key of the Redis cache's MAC (32
        random bytes in hex), written on first use."""
        path = os.path.join(self.tmp, "redis-mac-key")
        if not os.path.exists(path):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600),
                      "w") as f:
                f.write(secrets.token_hex(32))
        return path

    def start_sidecar(self, kind, pool, extra=()):
        """Starts a sidecar of `kind` (sidecar_flags) with `pool` PostgreSQL
        connections and the flags `extra`, and waits until it is SERVING.
        "verify" turns statement tracking on and its peak RSS is not
        recorded."""
        conninfo = self.pg_conninfo
        if kind == "verify":
            conninfo += " options='-c pg_stat_statements.track=top'"
        output = self.out("sidecar-%s-%d.log" % (kind, pool))
        ready = self.out("ready.txt")
        # A port found free may be taken before the sidecar binds it: try
        # again on other ports.
        for attempt in (1, 2, 3):
            addr = "127.0.0.1:%d" % free_port()
            proc = self.spawn(
                [self.sidecar_bin, "--listen", addr, "--postgres", conninfo,
                 "--pg-pool-size", str(pool), "--metrics-listen",
                 "127.0.0.1:%d" % free_port(), "--log-level=warn"] +
                sidecar_flags(kind, "127.0.0.1:%d" % self.redis_port,
                              self.redis_mac_key()) + list(extra), output)
            for _ in range(30):
                rc, _ = self.run_logged([self.bench_bin, "--target", addr,
                                         "--ready-only", "--wait-ready", "1s"],
                                        ready)
                if rc == 0:
                    self.sidecar = Sidecar(proc, kind, pool, addr, output)
                    return
                if proc.poll() is not None:
                    break
            proc.kill()
            proc.wait()
            self.procs.remove(proc)
            log("the sidecar (%s, pool %d) did not start (attempt %d)" %
                (kind, pool, attempt))
        sys.stderr.write(read(ready) + read(output))
        raise Failed("the sidecar (%s, pool %d) did not become SERVING" %
                     (kind, pool))

    def stop_sidecar(self):
        """Stops the sidecar with SIGTERM, which it must exit 0 on, and
        records its peak RSS."""
        s = self.sidecar
        hwm = re.search(r"^VmHWM:\s*(\d+)",
                        read("/proc/%d/status" % s.proc.pid), re.M)
        if not hwm:  # a zombie has no memory left to show
            raise Failed("the sidecar exited early (log: %s)" % s.log)
        if s.kind != "verify":
            with open(os.path.join(self.results, "rss.tsv"), "a") as f:
                f.write("%s\t%d\t%s\n" % (s.kind, s.pool, hwm.group(1)))
        s.proc.terminate()
        try:
            rc = s.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise Failed("the sidecar did not exit within 60 s of SIGTERM "
                         "(log: %s)" % s.log)
        self.procs.remove(s.proc)
        self.sidecar = None
        if rc != 0:
            raise Failed("the sidecar exited with %d on SIGTERM (log: %s)" %
                         (rc, s.log))

    # -------------------------------------------------------------- measuring
    def record(self, m, section, contender, clients, role="-"):
        """Appends a run to runs.tsv (bench/report.py's header): in table
        `section` ("-": none) as `contender`, in the ratio role `role`."""
        with open(os.path.join(self.results, "runs.tsv"), "a") as f:
            f.write("\t".join(str(x) for x in (
                self.round, role, section, contender, clients, m.server_ticks,
                m.pg_ticks, m.client_ticks, m.result)) + "\n")

    def meta(self, key, value):
        with open(os.path.join(self.results, "meta.tsv"), "a") as f:
            f.write("%s\t%s\n" % (key, value))

    def run_idem(self, label, server, *args):
        """Runs idem-bench with `args`, counting the CPU of process
        `server`; fails the benchmark on any error."""
        output = self.out(label + ".txt")
        s0, p0, c0 = proc_ticks(server.pid), self.pg_ticks(), children_cpu_s()
        rc, text = self.run_logged(
            [self.bench_bin, "--threads", "2", "--snapshot-bytes",
             str(SNAPSHOT_BYTES), "--tenant", TENANT, "--operation", OPERATION,
             "--json", self.out(label + ".json")] + list(args), output)
        client_ticks = int((children_cpu_s() - c0) * self.hz)
        m = Measured(proc_ticks(server.pid) - s0, self.pg_ticks() - p0,
                     client_ticks, last_result(text))
        if rc:
            sys.stderr.write(text)
            raise Failed("idem-bench %s exited non-zero" % label)
        if not m.result:
            raise Failed("idem-bench %s printed no RESULT line" % label)
        f = report.result_fields(m.result)
        if f.get("errors") != "0":
            sys.stderr.write(text)
            if self.sidecar:
                print("the sidecar's last errors (%s):" % self.sidecar.log,
                      file=sys.stderr)
                errors = [l for l in read(self.sidecar.log).splitlines()
                          if '"level":"error"' in l]
                sys.stderr.write("".join(l + "\n" for l in errors[-20:]))
            raise Failed("idem-bench %s: %s errors" % (label, f.get("errors")))
        if not re.search("[1-9]", f.get("throughput", "")):
            sys.stderr.write(text)
            raise Failed("idem-bench %s: no request succeeded" % label)
        log("%s: %s req/s, p99 %s us" % (label, f["throughput"],
                                         f.get("p99_us")))
        return m

    def run_pgbench(self, label, sql, clients, *extra):
        """Runs pgbench on bench/sql/`sql` with `clients` connections for
        warmup + duration, then measures the window after the warmup from
        its per-transaction log, like idem-bench does."""
        prefix = os.path.join(self.tmp, "pgb", label)
        self.psql("-c", "CHECKPOINT")
        self.wait_pg_idle()
        p0, c0 = self.pg_ticks(), children_cpu_s()
        rc, text = self.run_logged(
            [self.pg("pgbench"), "-h", "127.0.0.1", "-p", str(self.pg_port),
             "-U", "postgres", "-n", "-M", "prepared", "-c", str(clients),
             "-j", str(min(clients, 2)), "-T",
             str(self.plan.warmup_s + self.plan.duration_s),
             "-f", os.path.join(ROOT, "bench", "sql", sql)] +
            self.pgbench_vars + ["-l", "--log-prefix=" + prefix] +
            list(extra) + ["postgres"],
            self.out(label + ".txt"), cwd=os.path.dirname(prefix))
        client_ticks = int((children_cpu_s() - c0) * self.hz)
        self.wait_pg_idle()
        pg_ticks = self.pg_ticks() - p0
        if rc or re.search("aborted|error", text, re.I):
            sys.stderr.write(text)
            raise Failed("pgbench %s failed (exit %d)" % (label, rc))
        logs = sorted(glob.glob(prefix + ".*"))
        try:
            line = report.pgbench_result(self.plan.warmup_s,
                                         self.plan.duration_s, logs)
        except ValueError as e:
            raise Failed("pgbench %s: %s" % (label, e))
        for path in logs:
            os.remove(path)
        if sql in ("fresh.sql", "pair.sql"):
            # The guarded update must have found its row: otherwise pgbench
            # did less work than the sidecar. A client may stop between two
            # statements.
            where = ("WHERE operation = '%s-pgbench' AND status <> "
                     "'SUCCEEDED'" % OPERATION)
            unfinished = int(self.psql(
                "-At", "-c",
                "SELECT count(*) FROM idempotency_record " + where))
            if unfinished > clients:
                raise Failed("pgbench %s left %d records unfinished: "
                             "bench/sql/%s no longer matches the "
                             "table" % (label, unfinished, sql))
            self.psql("-c", "DELETE FROM idempotency_record " + where)
        f = report.result_fields(line)
        log("%s: %s tps, p99 %s us" % (label, f["throughput"], f["p99_us"]))
        return Measured("-", pg_ticks, client_ticks, line)

    def tracked_statements(self):
        rows = []
        for line in self.psql("-At", "-F", "\t", "-c",
                              TRACKED_STATEMENTS).splitlines():
            calls, _, text = line.partition("\t")
            rows.append((int(calls), text))
        return rows

    def check_statements(self):
        """Checks that bench/sql/fresh.sql and replay.sql run, once per
        transaction, exactly the statements the sidecar runs once per fresh
        request and per replay without Redis: runs both, with
        pg_stat_statements tracking only those sessions, and compares
        statement texts and counts. The sidecar runs with one client here,
        so that it uses its single-row statements; under concurrency it
        folds the same statements into their batch forms
        (server/postgres/pg_batch.cc), which is what the measurements then
        compare with pgbench running the single-row ones."""
        log("checking that bench/sql/*.sql run the sidecar's own statements")
        self.psql("-c", "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        reset = ("-c", "SELECT pg_stat_statements_reset()")
        for scenario, script in (("fresh", "fresh.sql"),
                                 ("replay-pg", "replay.sql")):
            # Statements prepared before a reset would be recorded with
            # their constants in place: a new sidecar prepares everything
            # after it.
            self.psql(*reset)
            self.start_sidecar("verify", 2)
            rc, text = self.run_logged(
                [self.bench_bin, "--target", self.sidecar.addr, "--scenario",
                 scenario, "--no-preload", "--key-space",
                 str(self.plan.pool_keys), "-c", "1", "--warmup", "0s",
                 "--duration", "2s", "--tenant", TENANT, "--operation",
                 OPERATION, "--snapshot-bytes", str(SNAPSHOT_BYTES),
                 "--fail-on-error"], self.out("verify-%s.txt" % scenario))
            if rc:
                sys.stderr.write(text)
                raise Failed("the sidecar failed its check run (%s)" %
                             scenario)
            requests = int(report.result_fields(last_result(text))
                           .get("requests_total", "0"))
            if requests < 10:
                raise Failed("the sidecar's check run made %d requests" %
                             requests)
            self.stop_sidecar()
            sidecar = per_request(self.tracked_statements(), requests)
            self.psql(*reset)
            rc, text = self.run_logged(
                [self.pg("pgbench"), "-h", "127.0.0.1", "-p",
                 str(self.pg_port), "-U", "postgres", "-n", "-M", "prepared",
                 "-c", "1", "-t", "20", "-f",
                 os.path.join(ROOT, "bench", "sql", script)] +
                (self.pgbench_replay_vars if script == "replay.sql"
                 else self.pgbench_vars) + ["postgres"],
                self.out("verify-%s.txt" % script),
                env=dict(os.environ,
                         PGOPTIONS="-c pg_stat_statements.track=top"))
            if rc:
                sys.stderr.write(text)
                raise Failed("pgbench %s failed" % script)
            pgbench = per_request(self.tracked_statements(), 20)
            if sidecar != pgbench:
                print("statements per request (times<TAB>statement): the "
                      "sidecar's\n%s scenario (---) and bench/sql/%s (+++) "
                      "differ:" % (scenario, script), file=sys.stderr)
                for line in difflib.unified_diff(
                        sidecar, pgbench, "sidecar " + scenario,
                        "bench/sql/" + script, lineterm=""):
                    print(line, file=sys.stderr)
                raise Failed(
                    "bench/sql/%s no longer runs what the sidecar runs "
                    "(server/postgres/postgres_store.cc, "
                    "server/core/coordinator.cc); update it" % script)
        self.psql("-c", "DROP EXTENSION pg_stat_statements", "-c",
                  "DELETE FROM idempotency_record WHERE operation = "
                  "'%s-pgbench'" % OPERATION)

    def run_level(self, c, rnd):
        """Runs the contenders at `c` clients. Round 0: every contender, for
        the tables (levels below MAX_LEVEL). At MAX_LEVEL, round 1 runs
        every contender and the fixed-rate pair and starts the ratio
        rounds; rounds 2 and up run only the contenders of the ratios."""
        self.round = rnd
        every = rnd <= 1
        tag = "%d-round%d" % (c, rnd) if rnd > 1 else str(c)
        common = ["-c", str(c), "--warmup", "%ds" % self.plan.warmup_s,
                  "--duration", "%ds" % self.plan.duration_s]
        replay_pool = ["--no-preload", "--key-space", str(self.plan.pool_keys)]
        log("== %d clients (pool %d)%s" % (
            c, c, ", ratio round %d of %d" % (rnd, ROUNDS) if rnd else ""))

        def table(name):
            """The table of a run: none in the repeat rounds."""
            return name if every else "-"

        def idem(name, server, addr, args, section, contender, role="-"):
            m = self.run_idem(name + "-" + tag, server, "--target", addr,
                              *args, *common)
            self.record(m, section, contender, c, role)

        def sidecar(name, args, section, contender, role="-", pg=True):
            # A run that reaches PostgreSQL (`pg`) starts after a
            # checkpoint, so that none of an earlier run's writes lands in
            # it.
            if pg:
                self.psql("-c", "CHECKPOINT")
            idem(name, self.sidecar.proc, self.sidecar.addr,
                 ["--scenario"] + args, section, contender, role)

        def pgbench(name, sql, section, contender, role="-", extra=()):
            m = self.run_pgbench(name + "-" + tag, sql, c, *extra)
            self.record(m, section, contender, c, role)

        pgbench("pgbench-fresh", "fresh.sql", table("fresh"),
                "pgbench fresh.sql", "pgbench_fresh")
        pgbench("pgbench-pair", "pair.sql", table("fresh"), PAIR,
                "pgbench_pair")
        self.start_sidecar("local", c)
        sidecar("fresh", ["fresh"], table("fresh"), "sidecar fresh (redis)",
                "sidecar_fresh")
        if rnd >= 1:
            if rnd == 1:
                # Half of the lower of the two contenders' peak fresh
                # throughputs (each the best over all client counts), the
                # same for every round: a load both can sustain. Above the
                # slower one's peak its queue, and so its p99 from the
                # scheduled start, would grow without bound.
                self.half, peak, peak_of = report.fixed_rate(
                    report.Results.load(self.results))
                log("fixed rate: %d/s (half of the %s peak %s/s)" %
                    (self.half, peak_of, peak))
            half = str(self.half)
            sidecar("fresh-rate", ["fresh", "--target-rate", half],
                    table("rate"), "sidecar fresh --target-rate %s (redis)" %
                    half, "sidecar_rate")
            self.stop_sidecar()
            pgbench("pgbench-rate", "fresh.sql", table("rate"),
                    "pgbench fresh.sql --rate " + half, "pgbench_rate",
                    ["--rate", half])
            self.start_sidecar("local", c)
        if every:
            hot = str(max(c // 16, 1))
            sidecar("contention", ["contention", "--key-space", hot],
                    "contention", "sidecar contention, hot keys: " + hot)
            sidecar("mixed", ["mixed"] + replay_pool, "mixed",
                    "sidecar mixed (90% replay-redis)")
            sidecar("replay-local", ["replay-redis"] + replay_pool, "replay",
                    report.LOCAL, pg=False)
        self.stop_sidecar()

        self.start_sidecar("redis", c)
        sidecar("replay-redis", ["replay-redis"] + replay_pool,
                table("replay"), "sidecar replay-redis", "replay_redis",
                pg=False)
        self.stop_sidecar()

        echo_args = ["--scenario", "replay", "--no-preload"]
        idem("echo", self.echo, self.echo_addr, echo_args, table("replay"),
             report.ECHO, "echo")
        if every:
            idem("echo-handoff", self.handoff, self.handoff_addr, echo_args,
                 "replay", report.HANDOFF)

        self.start_sidecar("no-redis", c)
        sidecar("replay-pg", ["replay-pg"] + replay_pool, table("replay"),
                "sidecar replay-pg", "replay_pg")
        if every:
            sidecar("fresh-noredis", ["fresh"], "fresh",
                    "sidecar fresh (no redis)")
        self.stop_sidecar()
        if every and c > 1:
            # What folding concurrent statements into batches buys.
            self.start_sidecar("unbatched", c)
            sidecar("fresh-unbatched", ["fresh"], "fresh",
                    "sidecar fresh (no redis, --pg-max-batch 1)")
            self.stop_sidecar()
        if every:
            pgbench("pgbench-replay", "replay.sql", "replay",
                    "pgbench replay.sql", extra=self.pgbench_replay_vars)
        pgbench("pgbench-select", "select.sql", table("replay"),
                "pgbench select.sql (hand-written PK SELECT)",
                "pgbench_select", extra=self.pgbench_replay_vars)

    def run_one_call(self, rnd):
        """Round `rnd` of the one-client rounds: the sidecar (default flags,
        no Redis) running fresh Begin + Complete, pgbench running the
        hand-written pair and pgbench running the sidecar's own statements,
        each with one client, back to back, each first in one round of
        three. Their latency ratios are one_call_vs_pair and
        one_call_vs_own_sql. The sidecar
        keeps its default pool (ONE_CALL_POOL): a lone call uses one
        connection, and the health ping, reaper and counts do not queue
        in front of it as they would on a pool of one."""
        self.round = rnd
        # Each of the three goes first in one round of three.
        sides = ("sidecar", "pair", "own-sql")
        order = sides[(rnd - 1) % 3:] + sides[:(rnd - 1) % 3]
        self.meta("one_call_order_%d" % rnd, " ".join(order))
        log("== one call at one client, round %d of %d" % (rnd, ROUNDS))
        section = "one_call" if rnd == 1 else "-"
        for side in order:
            self.psql("-c", "CHECKPOINT")
            if side == "pair":
                m = self.run_pgbench("pgbench-pair-one-round%d" % rnd,
                                     "pair.sql", 1)
                self.record(m, section, PAIR, 1, "pair_one_client")
                continue
            if side == "own-sql":
                m = self.run_pgbench("pgbench-fresh-one-round%d" % rnd,
                                     "fresh.sql", 1)
                self.record(m, section, "pgbench fresh.sql, one client", 1,
                            "fresh_sql_one_client")
                continue
            self.start_sidecar("default", ONE_CALL_POOL)
            m = self.run_idem(
                "one-call-round%d" % rnd, self.sidecar.proc, "--target",
                self.sidecar.addr, "--scenario", "fresh", "-c", "1",
                "--warmup", "%ds" % self.plan.warmup_s, "--duration",
                "%ds" % self.plan.duration_s)
            self.stop_sidecar()
            self.record(m, section, "sidecar fresh, one client (default)", 1,
                        "sidecar_one_call")
        self.round = 0

    def start_upstream(self):
        """Starts idem-bench-http-upstream; returns (process, address)."""
        output = self.out("http-upstream.out")
        proc = self.spawn([self.upstream_bin, "--listen", "127.0.0.1:0"],
                          output)
        for _ in range(100):
            m = re.search(r"^listening on (\S+)", read(output), re.M)
            if m:
                return proc, m.group(1)
            time.sleep(0.05)
        raise Failed("idem-bench-http-upstream did not start")

    def start_nginx(self, upstream_addr):
        """nginx (one process, one worker loop) on two free ports: one
        answering the gateway row's POST itself with the upstream's 201 and
        body, one passing requests to `upstream_addr` over keep-alive
        connections. Returns (process, answer address, proxy address)."""
        conf_dir = self.out("nginx")
        os.makedirs(os.path.join(conf_dir, "tmp"), exist_ok=True)
        answer = "127.0.0.1:%d" % free_port()
        proxy = "127.0.0.1:%d" % free_port()
        tmp = os.path.join(conf_dir, "tmp")
        conf = os.path.join(conf_dir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(NGINX_CONF % {
                "dir": conf_dir, "tmp": tmp, "upstream": upstream_addr,
                "answer": answer, "proxy": proxy,
                "body": UPSTREAM_BODY.decode()})
        proc = self.spawn(["nginx", "-c", conf, "-p", conf_dir],
                          self.out("nginx.out"))
        for addr in (answer, proxy):
            host, port = addr.rsplit(":", 1)
            for _ in range(100):
                try:
                    socket.create_connection((host, int(port)),
                                             timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            else:
                raise Failed("nginx did not listen on %s (%s)" %
                             (addr, self.out("nginx.out")))
        return proc, answer, proxy

    def http_post(self, addr):
        """One POST of the gateway row's request to `addr`: (status,
        headers, body)."""
        conn = http.client.HTTPConnection(addr, timeout=10)
        try:
            conn.request("POST", "/payments", body=GATEWAY_BODY, headers={
                "Idempotency-Key": '"%s"' % GATEWAY_KEY,
                "Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()

    def start_gateway(self, upstream_addr):
        """A sidecar with default flags and the gateway in front of
        `upstream_addr`; the key primed: its first POST runs on the
        upstream, the second must be a replay of it. Returns the gateway's
        address."""
        addr = "127.0.0.1:%d" % free_port()
        self.start_sidecar("gateway", 8, ["--http-listen", addr,
                                          "--http-upstream",
                                          "http://" + upstream_addr])
        host, port = addr.rsplit(":", 1)
        for _ in range(100):
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        first = self.http_post(addr)
        again = self.http_post(addr)
        if first[0] != 201 or again[0] != 201 or again[2] != first[2] or \
                again[1].get("Idempotent-Replayed") != "true":
            raise Failed("the gateway's priming POSTs: %r then %r (log: %s)" %
                         (first, again, self.sidecar.log))
        return addr

    def metrics(self, sidecar):
        """The Prometheus page of `sidecar`'s --metrics-listen."""
        args = sidecar.proc.args
        addr = args[args.index("--metrics-listen") + 1]
        with urllib.request.urlopen("http://%s/metrics" % addr,
                                    timeout=5) as r:
            return r.read().decode()

    def gateway_metric(self, result):
        return metric_sum(self.metrics(self.sidecar),
                          "idem_http_requests_total", result=result)

    def run_gateway_h2load(self, label, server, addr, post=True):
        """h2load --h1 POSTing the gateway row's request to `addr` (or, not
        `post`, GETting /payments with no key) with GATEWAY_CLIENTS
        connections, counting the CPU of process `server` (run_h2load)."""
        body = self.out("gateway-body.json")
        with open(body, "wb") as f:
            f.write(GATEWAY_BODY)
        cmd = ["--h1", "-c", str(GATEWAY_CLIENTS), "-t", "1"]
        if post:
            cmd += ["-d", body, "-H", 'idempotency-key: "%s"' % GATEWAY_KEY,
                    "-H", "content-type: application/json"]
        return self.run_h2load(label, server, cmd,
                               "http://%s/payments" % addr,
                               "201" if post else "200")

    def run_h2load(self, label, server, args, url, status):
        """h2load with `args` on `url`: a warmup run, then the measured one,
        counting the CPU of process `server`; any answer other than HTTP
        `status` is an error."""
        cmd = ["h2load"] + args
        rc, text = self.run_logged(cmd + ["-D", str(self.plan.warmup_s), url],
                                   self.out(label + "-warmup.txt"))
        if rc:
            sys.stderr.write(text)
            raise Failed("h2load %s (warmup) exited with %d" % (label, rc))
        log_file = self.out(label + ".tsv")
        s0, p0, c0 = proc_ticks(server.pid), self.pg_ticks(), children_cpu_s()
        rc, text = self.run_logged(
            cmd + ["-D", str(self.plan.duration_s), "--log-file=" + log_file,
                   url], self.out(label + ".txt"))
        client_ticks = int((children_cpu_s() - c0) * self.hz)
        server_ticks = proc_ticks(server.pid) - s0
        pg_ticks = self.pg_ticks() - p0
        try:
            result = h2load_result(text, read(log_file), status)
        except (OSError, ValueError) as e:
            sys.stderr.write(text)
            raise Failed("h2load %s: %s" % (label, e))
        os.remove(log_file)
        f = report.result_fields(result)
        if rc or f["errors"] != "0":
            sys.stderr.write(text)
            raise Failed("h2load %s: exit %d, %s errors" % (label, rc,
                                                            f["errors"]))
        log("%s: %s req/s, p99 %s us" % (label, f["throughput"], f["p99_us"]))
        return Measured(server_ticks, pg_ticks, client_ticks, result)

    def run_gateway(self):
        """The HTTP gateway's row: replays through the gateway against the
        upstream's own answers and against nginx answering itself, and GETs
        with no key passed through the gateway against nginx's proxy_pass
        with keep-alive; ROUNDS rounds, the order alternating."""
        log("== the HTTP gateway: %d connections" % GATEWAY_CLIENTS)
        upstream, upstream_addr = self.start_upstream()
        addr = self.start_gateway(upstream_addr)
        nginx, nginx_answer, nginx_proxy = self.start_nginx(upstream_addr)
        executed = self.gateway_metric("executed")
        sides = {
            "gateway": (lambda: self.sidecar.proc, addr, "gateway_replay",
                        "gateway replay (h2load --h1, one key)", True),
            "upstream": (lambda: upstream, upstream_addr, "http_upstream",
                         "upstream (idem-bench-http-upstream)", True),
            "nginx": (lambda: nginx, nginx_answer, "nginx_answer",
                      "nginx answering the POST itself (return 201)", True),
            "gateway-pass": (lambda: self.sidecar.proc, addr, "gateway_pass",
                             "gateway pass-through (GET, no key)", False),
            "nginx-proxy": (lambda: nginx, nginx_proxy, "nginx_proxy",
                            "nginx proxy_pass, keep-alive (GET)", False),
        }
        forward = ("gateway", "upstream", "nginx", "gateway-pass",
                   "nginx-proxy")
        backward = ("upstream", "gateway", "nginx", "nginx-proxy",
                    "gateway-pass")
        for rnd in range(1, ROUNDS + 1):
            self.round = rnd
            order = forward if rnd % 2 else backward
            self.meta("gateway_order_%d" % rnd, " ".join(order))
            for side in order:
                proc, target, role, contender, post = sides[side]
                replayed = self.gateway_metric("replayed")
                m = self.run_gateway_h2load("%s-round%d" % (side, rnd),
                                            proc(), target, post)
                if side == "gateway":
                    done = int(report.result_fields(m.result)
                               ["requests_total"])
                    if self.gateway_metric("replayed") - replayed < done:
                        raise Failed("the gateway answered fewer than %d "
                                     "requests as replays" % done)
                self.record(m, "gateway" if rnd == 1 else "-", contender,
                            GATEWAY_CLIENTS, role)
        if self.gateway_metric("executed") != executed:
            raise Failed("a request through the gateway reached the upstream "
                         "during the row: not every one was a replay")
        self.round = 0
        self.stop_sidecar()
        for proc in (nginx, upstream):
            proc.terminate()
            proc.wait()
            self.procs.remove(proc)

    def waiters_tool(self, *args):
        """Runs idem-bench-waiters with `args`; returns its "KEY value"
        output lines as a dict."""
        p = subprocess.run([self.waiters_bin] + list(args),
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        if p.returncode:
            raise Failed("idem-bench-waiters %s: %s" %
                         (args[0], p.stderr.strip()))
        return dict(line.split(" ", 1) for line in p.stdout.splitlines())

    def grpc_call(self, label, path, frame):
        """One call of gRPC method `path` on the sidecar with nghttp, the
        request `frame` as h2load sends it: (grpc-status, field 1 of the
        answer), as grpc_answer. Two calls: one shows the trailers, the
        other gives the body alone."""
        cmd = ["nghttp", "-d", frame, "-H", "content-type: application/grpc",
               "-H", "te: trailers", "http://%s%s" % (self.sidecar.addr, path)]
        rc, verbose = self.run_logged(cmd[:1] + ["-v", "-n"] + cmd[1:],
                                      self.out(label + "-nghttp.txt"))
        body = self.out(label + "-answer.bin")
        if rc or self.run_logged(cmd, body)[0]:
            raise Failed("nghttp %s failed (%s)" % (path, self.out(
                label + "-nghttp.txt")))
        with open(body, "rb") as f:
            return grpc_answer(verbose, f.read())

    def run_cached(self):
        """The cached replay against the health Check: one sidecar (default
        flags, no Redis), one finished key; h2load (HTTP/2, CACHED_CLIENTS
        connections, one stream each) sends Begin on that key and the
        standard health Check, back to back in each of ROUNDS rounds, the
        order alternating. h2load sees only HTTP statuses, so before the
        rounds nghttp checks that both calls answer grpc-status 0, the
        Begin COMPLETED and the Check SERVING; and in each round the
        sidecar's replays from the in-process cache must grow by at least
        h2load's measured Begins."""
        log("== the cached replay against the health Check: %d connections"
            % CACHED_CLIENTS)
        self.start_sidecar("cached", ONE_CALL_POOL)
        ident = ["--tenant", TENANT, "--operation", CACHED_OPERATION,
                 "--key", CACHED_KEY]
        token = self.waiters_tool("hold", "--target", self.sidecar.addr,
                                  *ident)["TOKEN"]
        self.waiters_tool("complete", "--target", self.sidecar.addr,
                          "--fencing-token", token, *ident)
        begin = self.out("cached-begin.bin")
        self.waiters_tool("frame", "--wait", "0", "--out", begin, *ident)
        health = self.out("cached-health.bin")
        with open(health, "wb") as f:
            f.write(b"\0\0\0\0\0")  # an empty HealthCheckRequest
        sides = {
            "replay": (BEGIN_PATH, begin, OUTCOME_COMPLETED, "cached_replay",
                       "Begin, replayed from the in-process cache"),
            "health": (HEALTH_PATH, health, SERVING, "health_check",
                       "grpc.health.v1.Health/Check"),
        }
        for side, (path, frame, want, _, _) in sides.items():
            answer = self.grpc_call("cached-" + side, path, frame)
            if answer != (0, want):
                raise Failed("%s answered (grpc-status, field 1) %r, not "
                             "(0, %d) (log: %s)" % (path, answer, want,
                                                    self.sidecar.log))

        def from_memory():
            return metric_sum(self.metrics(self.sidecar), "idem_replay_total",
                              source="memory")
        grpc = ["-c", str(CACHED_CLIENTS), "-m", "1", "-t", "1", "-H",
                "content-type: application/grpc", "-H", "te: trailers"]
        forward = ("replay", "health")
        for rnd in range(1, ROUNDS + 1):
            self.round = rnd
            order = forward if rnd % 2 else forward[::-1]
            self.meta("cached_order_%d" % rnd, " ".join(order))
            for side in order:
                path, frame, _, role, contender = sides[side]
                replayed = from_memory()
                m = self.run_h2load(
                    "cached-%s-round%d" % (side, rnd), self.sidecar.proc,
                    grpc + ["-d", frame], "http://%s%s" % (self.sidecar.addr,
                                                          path), "200")
                if side == "replay":
                    done = int(report.result_fields(m.result)
                               ["requests_total"])
                    if from_memory() - replayed < done:
                        raise Failed("the sidecar answered fewer than %d "
                                     "Begins from the in-process cache" %
                                     done)
                self.record(m, "cached" if rnd == 1 else "-", contender,
                            CACHED_CLIENTS, role)
        self.round = 0
        self.stop_sidecar()

    def run_only(self, run, section, line):
        """A --*-only run: `run` (its sidecars use no Redis), then the
        report if --output asks for one, and the table `section` and the
        one line `line` of bench/report.py printed."""
        self.redis_port = 0
        run()
        self.finish_results()
        self.write_report()
        res = report.Results.load(self.results)
        print("\n".join(section(res)))
        print(line(res))

    def run_waiters(self):
        """bench/waiters.py with these binaries, on PostgreSQL and sidecars
        of its own: its rounds go to waiters.tsv."""
        env = dict(os.environ, IDEM_SIDECAR=self.sidecar_bin,
                   IDEM_BENCH=self.bench_bin, IDEM_BENCH_ECHO=self.echo_bin,
                   IDEM_BENCH_WAITERS=self.waiters_bin)
        rc, text = self.run_logged(
            [sys.executable, os.path.join(ROOT, "bench", "waiters.py"),
             "--waiters", str(WAITERS), "--rounds",
             "1" if self.args.quick else str(ROUNDS), "--tsv",
             os.path.join(self.results, "waiters.tsv")],
            self.out("waiters.txt"), env=env)
        if rc:
            sys.stderr.write(text)
            raise Failed("bench/waiters.py failed")
        self.meta("waiters", WAITERS)
        log("waiters: %s" % last_line(text, "WAITERS "))

    # -------------------------------------------------------------- main
    def prepare(self):
        """Finds the binaries and tools and checks they fit."""
        self.sidecar_bin, self.bench_bin, self.echo_bin = find_binaries(
            self.args.build_dir)
        self.command_line = command_line(self.argv, os.environ,
                                         self.sidecar_bin, self.bench_bin,
                                         self.echo_bin)
        if "--redis" not in output_of([self.sidecar_bin, "--help"]):
            raise Failed(
                "this idempotency-sidecar has no --redis flag yet (the Redis "
                "cache has not landed): replay-redis, fresh, contention and "
                "mixed need it. Run again once 'idempotency-sidecar --help' "
                "lists --redis.")
        self.pg_bindir = find_pg_bindir()
        if not shutil.which("redis-server"):
            raise Failed("redis-server not found")
        if not shutil.which("h2load"):
            raise Failed("h2load not found (bench/waiters.py and the "
                         "gateway's row send requests with it): apt-get "
                         "install nghttp2-client")
        if "--http-listen" not in output_of([self.sidecar_bin, "--help"]):
            raise Failed("this idempotency-sidecar has no --http-listen flag "
                         "(the HTTP gateway): the gateway's row needs it")
        self.upstream_bin = (os.environ.get("IDEM_BENCH_HTTP_UPSTREAM") or
                             os.path.join(os.path.dirname(self.bench_bin),
                                          "idem-bench-http-upstream"))
        if not executable(self.upstream_bin):
            raise Failed("%s: not an executable" % self.upstream_bin)
        self.waiters_bin = (os.environ.get("IDEM_BENCH_WAITERS") or
                            os.path.join(os.path.dirname(self.bench_bin),
                                         "idem-bench-waiters"))
        if not executable(self.waiters_bin):
            raise Failed("%s: not an executable" % self.waiters_bin)
        if not shutil.which("nghttp"):
            raise Failed("nghttp not found (the cached replay's check "
                         "calls): apt-get install nghttp2-client")
        if not shutil.which("nginx"):
            raise Failed("nginx not found (the gateway's row compares with "
                         "it): apt-get install nginx-light")

    def start_results(self):
        """The raw results directory, with the run's parameters."""
        self.results = (os.environ.get("IDEM_BENCH_RESULTS") or
                        os.path.join(self.tmp, "results"))
        os.makedirs(self.results, exist_ok=True)
        for name in ("meta.tsv", "runs.tsv", "rss.tsv"):
            open(os.path.join(self.results, name), "w").close()
        p = self.plan
        for key, value in (
                ("command_line", self.command_line),
                ("levels", " ".join(str(l) for l in p.levels)),
                ("max_level", MAX_LEVEL), ("rounds", ROUNDS),
                ("warmup_s", p.warmup_s), ("duration_s", p.duration_s),
                ("snapshot_bytes", SNAPSHOT_BYTES),
                ("pool_keys", p.pool_keys), ("clk_tck", self.hz),
                ("load_before", " ".join(read("/proc/loadavg").split()[:3])),
                ("started_at", time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                             time.gmtime()))):
            self.meta(key, value)

    def finish_results(self):
        """The machine and versions, raw; bench/report.py computes the rest."""
        cpu = re.search(r"^model name\s*:\s*(.*)$", read("/proc/cpuinfo"),
                        re.M)
        mem = re.search(r"^MemTotal:\s*(\d+)", read("/proc/meminfo"), re.M)
        git = ["git", "-C", ROOT]
        rev = first_line(git + ["rev-parse", "--short", "HEAD"])
        if output_of(git + ["status", "--porcelain"]).strip():
            rev += " (with uncommitted changes)"
        uname = os.uname()
        for key, value in (
                ("load_after", " ".join(read("/proc/loadavg").split()[:3])),
                ("cpu_model", cpu.group(1) if cpu else ""),
                ("nproc", os.cpu_count()),
                ("mem_kib", mem.group(1) if mem else ""),
                ("kernel", "%s %s" % (uname.sysname, uname.release)),
                ("git_rev", rev),
                ("postgres_version", first_line([self.pg("postgres"),
                                                 "--version"])),
                ("pgbench_version", first_line([self.pg("pgbench"),
                                                "--version"])),
                ("redis_version", " ".join(first_line(
                    ["redis-server", "--version"]).split()[:3])),
                ("grpc_version", first_line(["pkg-config", "--modversion",
                                             "grpc++"])),
                ("compiler", first_line(["c++", "--version"])),
                ("allocator_sidecar", allocator_of(self.sidecar_bin)),
                ("allocator_echo", allocator_of(self.echo_bin))):
            self.meta(key, value)
        shutil.copy(self.settings, os.path.join(self.results, "bench.conf"))

    def run(self):
        self.prepare()
        self.tmp = tempfile.mkdtemp(prefix="idem-bench.")
        os.chmod(self.tmp, 0o755)
        for d in ("out", "pgb", "pg"):
            os.mkdir(os.path.join(self.tmp, d))
        self.start_results()
        self.start_postgres()
        if self.args.gateway_only:
            return self.run_only(self.run_gateway, report.gateway_section,
                                 report.gateway_line)
        if self.args.one_call_only:
            self.pgbench_vars = pgbench_vars(os.urandom(SNAPSHOT_BYTES),
                                             self.plan.pool_keys)

            def rounds():
                for rnd in range(1, ROUNDS + 1):
                    self.run_one_call(rnd)
            return self.run_only(rounds, report.one_call_section,
                                 report.one_call_line)
        if self.args.cached_only:
            return self.run_only(self.run_cached, report.cached_section,
                                 report.cached_line)
        self.start_redis()
        self.echo, self.echo_addr = self.start_echo()
        self.handoff, self.handoff_addr = self.start_echo("--handoff")
        self.pgbench_vars = pgbench_vars(os.urandom(SNAPSHOT_BYTES),
                                         self.plan.pool_keys)
        # The replay pool: operation "<operation>-replay", keys
        # 0..pool_keys-1 (a later -D wins).
        self.pgbench_replay_vars = self.pgbench_vars + [
            "-D", "operation=%s-replay" % OPERATION]

        log("preloading %d finished keys (the replay pool)" %
            self.plan.pool_keys)
        self.start_sidecar("redis", MAX_LEVEL)
        rc, text = self.run_logged(
            [self.bench_bin, "--target", self.sidecar.addr, "--scenario",
             "replay", "--preload-only", "--key-space",
             str(self.plan.pool_keys), "--concurrency", "32", "--tenant",
             TENANT, "--operation", OPERATION, "--snapshot-bytes",
             str(SNAPSHOT_BYTES)], self.out("preload.txt"))
        if rc:
            sys.stderr.write(text)
            raise Failed("preload failed")
        self.stop_sidecar()
        self.psql("-c", "VACUUM ANALYZE")

        self.check_statements()
        for c in self.plan.levels:
            self.run_level(c, 0)
        for rnd in range(1, ROUNDS + 1):
            self.run_level(MAX_LEVEL, rnd)
        for rnd in range(1, ROUNDS + 1):
            self.run_one_call(rnd)
        self.run_gateway()
        self.run_cached()
        self.run_waiters()

        self.finish_results()
        self.write_report()
        print(report.ratios_line(report.Results.load(self.results)))

    def write_report(self):
        """The report of the results so far into --output, if any."""
        if not self.args.output:
            return
        res = report.Results.load(self.results)
        try:
            with open(self.args.output, "w", encoding="utf-8") as f:
                f.write(report.markdown(res))
        except OSError as e:
            raise Failed("could not write the report: %s (raw results: %s)" %
                         (e, self.results))
        log("wrote %s" % self.args.output)


def main(argv):
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bench = Bench(args, argv)
    try:
        bench.run()
        return 0
    except Failed as e:
        print("bench/run.sh: FAILED: %s" % e, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        # A second Ctrl-C must not leave servers behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        bench.cleanup()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
