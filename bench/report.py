#!/usr/bin/env python3
"""The statistics and reports of bench/run.py (bench/run.sh) and
bench/ab.sh.

Those only start processes and collect raw numbers; everything computed
from the numbers is here, where it can be unit-tested (bench/report_test.py,
CTest bench_report_test) without any server. Standard library only.

  report.py report RESULTS_DIR OUTPUT   BENCHMARKS.md from a results
                                        directory; prints the RATIOS line
  report.py ab-medians RESULTS CLIENTS SCENARIOS
                                        bench/ab.sh's summary lines

A results directory (written by bench/run.py) holds:
  meta.tsv   KEY<TAB>VALUE lines: the run's parameters and machine
  runs.tsv   one line per measured run:
             round role section contender clients server_ticks pg_ticks
             client_ticks result
             round 0 is a level below max_level, 1.. the ratio rounds;
             role names the quantity of a ratio round (sidecar_fresh,
             pgbench_fresh, pgbench_pair, sidecar_rate, pgbench_rate, replay_redis,
             replay_pg, echo, gateway_replay, http_upstream, sidecar_one_call,
             pair_one_client, cached_replay, health_check) or is "-";
             section is the table the run goes in, "-" for none;
             server_ticks is "-" when not measured; result is the
             "RESULT k=v ..." line of idem-bench, pgbench-result or h2load
             (run.h2load_result); meta.tsv's gateway_order_<round>,
             one_call_order_<round> and cached_order_<round> say which of
             the gateway's row, of the one-client pair and of the cached
             replay and the health Check ran first
  rss.tsv    KIND<TAB>POOL<TAB>VmHWM kB, one line per sidecar stopped
  bench.conf the PostgreSQL settings file
"""

import math
import os
import sys
from fractions import Fraction

# The ratios of the RATIOS line, each the median over the rounds of
# numerator / denominator: (name, numerator, denominator), as
# (role, field of its RESULT line).
RATIOS = [
    ("fresh_vs_pgbench", ("sidecar_fresh", "throughput"),
     ("pgbench_fresh", "throughput")),
    ("fresh_vs_pair", ("sidecar_fresh", "throughput"),
     ("pgbench_pair", "throughput")),
    # A latency ratio: with one client in a closed loop the mean latency is
    # 1 / throughput, so the pair's rate over the sidecar's is the sidecar's
    # mean latency over the pair's.
    ("one_call_vs_pair", ("pair_one_client", "throughput"),
     ("sidecar_one_call", "throughput")),
    # The same at one client against the sidecar's own statements
    # (bench/sql/fresh.sql): what the sidecar adds over the SQL it sends.
    ("one_call_vs_own_sql", ("fresh_sql_one_client", "throughput"),
     ("sidecar_one_call", "throughput")),
    ("replay_redis_vs_echo", ("replay_redis", "throughput"),
     ("echo", "throughput")),
    ("replay_pg_vs_echo", ("replay_pg", "throughput"), ("echo", "throughput")),
    ("replay_pg_vs_select", ("replay_pg", "throughput"),
     ("pgbench_select", "throughput")),
    ("p99_vs_pgbench", ("sidecar_rate", "p99_us"), ("pgbench_rate", "p99_us")),
    ("gateway_replay_vs_upstream", ("gateway_replay", "throughput"),
     ("http_upstream", "throughput")),
    ("gateway_replay_vs_nginx", ("gateway_replay", "throughput"),
     ("nginx_answer", "throughput")),
    ("gateway_pass_vs_nginx_proxy", ("gateway_pass", "throughput"),
     ("nginx_proxy", "throughput")),
    # A Begin answered from the in-process cache against the cheapest call
    # the same sidecar answers, both sent by h2load.
    ("cached_replay_vs_health", ("cached_replay", "throughput"),
     ("health_check", "throughput")),
]

ECHO = "echo (idem-bench-echo)"
HANDOFF = "echo, answered from another thread (--handoff)"
LOCAL = "sidecar replay, in-process cache (default)"


def num(text):
    """A number as awk reads one: a leading numeric prefix, else 0."""
    try:
        return float(text)
    except (TypeError, ValueError):
        return 0.0


def ratio(a, b):
    a, b = num(a), num(b)
    return "%.2f" % (a / b) if b > 0 else "nan"


def median(values):
    """Median of ratio strings, as `sort -g | awk`: NaNs sort first; an odd
    count gives the middle string as it is, an even one the mean (%.2f)."""
    def key(v):
        x = num(v)
        return (0, 0.0) if math.isnan(x) else (1, x)
    v = sorted(values, key=key)
    n = len(v)
    if n == 0:
        return "nan"
    if n % 2:
        return v[(n + 1) // 2 - 1]
    return "%.2f" % ((num(v[n // 2 - 1]) + num(v[n // 2])) / 2)


def printf_f(text, digits=1):
    """`printf '%.<digits>f' TEXT` as bash's builtin prints it: bash reads the
    number as an x86 long double (64-bit mantissa), then rounds that value
    exactly, ties to even. So "16931.55" prints 16931.6, where a Python
    float (16931.549999...) would print 16931.5."""
    try:
        x = Fraction(text.strip())
    except (AttributeError, ValueError, ZeroDivisionError):
        return "%.*f" % (digits, num(text))
    sign = "-" if x < 0 else ""
    a = abs(x)
    if a:
        e = a.numerator.bit_length() - a.denominator.bit_length()
        if Fraction(2) ** e > a:
            e -= 1
        elif Fraction(2) ** (e + 1) <= a:
            e += 1
        scale = Fraction(2) ** (63 - e)
        a = round(a * scale) / scale
    q = round(a * 10 ** digits)
    if q == 0:
        sign = "-" if sign and x != 0 else ""
    whole, frac = divmod(q, 10 ** digits)
    if digits == 0:
        return "%s%d" % (sign, whole)
    return "%s%d.%0*d" % (sign, whole, digits, frac)


def ms(us):
    return "%.2f" % (num(us) / 1000)


def per_1k(ticks, requests, hz):
    """Seconds of CPU per 1,000 requests from clock ticks."""
    if ticks == "-":
        return "-"
    n = num(requests)
    if n > 0:
        return "%.3f" % (num(ticks) / hz / n * 1000)
    return "-"


def result_fields(line):
    """The k=v fields of a "RESULT k=v ..." line."""
    fields = {}
    for part in line.split():
        if "=" in part:
            k, v = part.split("=", 1)
            fields[k] = v
    return fields


# ------------------------------------------------------------------ loading
# The columns of waiters.tsv (bench/waiters.py's rounds).
WAITER_FIELDS = ("round", "min", "p50", "p99", "max", "complete_ms")


class Results:
    def __init__(self, meta, runs, rss, settings="", waiters=()):
        self.meta = meta
        self.runs = runs
        self.rss = rss
        self.settings = settings
        self.waiters = list(waiters)

    @classmethod
    def load(cls, directory):
        meta = {}
        with open(os.path.join(directory, "meta.tsv"), encoding="utf-8") as f:
            for line in f:
                line = line.rstrip("\n")
                if line and not line.startswith("#"):
                    k, _, v = line.partition("\t")
                    meta[k] = v
        runs = []
        path = os.path.join(directory, "runs.tsv")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    line = line.rstrip("\n")
                    if line and not line.startswith("#"):
                        runs.append(parse_run(line))
        rss = []
        path = os.path.join(directory, "rss.tsv")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    line = line.rstrip("\n")
                    if line and not line.startswith("#"):
                        kind, pool, kib = line.split("\t")
                        rss.append((kind, pool, kib))
        settings = ""
        path = os.path.join(directory, "bench.conf")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                settings = f.read()
        waiters = []
        path = os.path.join(directory, "waiters.tsv")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    line = line.rstrip("\n")
                    if line and not line.startswith("#"):
                        waiters.append(dict(zip(WAITER_FIELDS,
                                                line.split("\t"))))
        return cls(meta, runs, rss, settings, waiters)

    def levels(self):
        return self.meta.get("levels", "").split()

    def max_level(self):
        return self.meta.get("max_level", "64")

    def rounds(self):
        return int(self.meta.get("rounds", "3"))

    def value(self, contender, clients):
        """req/s of `contender` at `clients` in the tables (last one wins),
        or None."""
        found = None
        for r in self.runs:
            if (r["section"] != "-" and r["contender"] == contender and
                    r["clients"] == str(clients)):
                found = r["result"].get("throughput", "")
        return found

    def round_value(self, role, field, rnd):
        found = ""
        for r in self.runs:
            if r["role"] == role and r["round"] == str(rnd):
                found = r["result"].get(field, "")
        return found


def parse_run(line):
    cols = line.split("\t")
    if len(cols) != 9:
        raise ValueError("runs.tsv: expected 9 columns: %r" % line)
    return {
        "round": cols[0], "role": cols[1], "section": cols[2],
        "contender": cols[3], "clients": cols[4], "server_ticks": cols[5],
        "pg_ticks": cols[6], "client_ticks": cols[7],
        "result": result_fields(cols[8]),
    }


# ------------------------------------------------------------------ numbers
def fixed_rate(res):
    """(half, peak, peak_of): half of the lower of the two contenders' peak
    fresh throughputs (each the best over all client counts)."""
    sidecar_peak = "0"
    pgbench_peak = "0"
    for level in res.levels() + [res.max_level()]:
        b = res.value("sidecar fresh (redis)", level) or "0"
        if num(b) > num(sidecar_peak):
            sidecar_peak = b
        b = res.value("pgbench fresh.sql", level) or "0"
        if num(b) > num(pgbench_peak):
            pgbench_peak = b
    peak = pgbench_peak if num(pgbench_peak) < num(sidecar_peak) else sidecar_peak
    peak_of = "pgbench" if peak == pgbench_peak else "sidecar"
    half = int(num(peak) / 2)
    return (half if half >= 1 else 1), peak, peak_of


def round_ratios(res):
    """{ratio name: [per-round ratio strings]}."""
    out = {}
    for name, (ra, fa), (rb, fb) in RATIOS:
        out[name] = [
            ratio(res.round_value(ra, fa, r), res.round_value(rb, fb, r))
            for r in range(1, res.rounds() + 1)]
    return out


def rss_max_kib(res):
    return max([num(k) for _, _, k in res.rss] + [0])


def ratios_line(res):
    medians = {name: median(v) for name, v in round_ratios(res).items()}
    return ("RATIOS " + " ".join(
        "%s=%s" % (name, medians[name]) for name, _, _ in RATIOS) +
        " rss_mib=%.1f" % (rss_max_kib(res) / 1024))


def extra_ratios(res):
    """The round-1 ratios at max_level that are not in the RATIOS line."""
    m = res.max_level()
    v = lambda c: res.value(c, m) or "0"  # noqa: E731
    return {
        "replay_local_vs_echo": ratio(v(LOCAL), v(ECHO)),
        "handoff_vs_echo": ratio(v(HANDOFF), v(ECHO)),
        "replay_redis_vs_handoff": ratio(v("sidecar replay-redis"), v(HANDOFF)),
        "replay_pg_vs_handoff": ratio(v("sidecar replay-pg"), v(HANDOFF)),
    }


# ------------------------------------------------------------------ Markdown
def table(res, section):
    hz = num(res.meta.get("clk_tck", "100")) or 100
    lines = [
        "| contender | clients | req/s | p50 ms | p90 ms | p99 ms | p99.9 ms |"
        " errors | CPU s/1k req: server | PostgreSQL | load generator |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    rows = [r for r in res.runs if r["section"] == section]
    rows.sort(key=lambda r: num(r["clients"]))  # stable, like sort -s
    for r in rows:
        f = r["result"]
        n = f.get("requests_total", "0")
        lines.append(
            "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["contender"], r["clients"], printf_f(f.get("throughput", "")),
                ms(f.get("p50_us")), ms(f.get("p90_us")), ms(f.get("p99_us")),
                ms(f.get("p999_us")), f.get("errors", ""),
                per_1k(r["server_ticks"], n, hz),
                per_1k(r["pg_ticks"], n, hz),
                per_1k(r["client_ticks"], n, hz)))
    return lines


def markdown(res):
    m = res.meta
    rounds = res.rounds()
    max_level = res.max_level()
    half, peak, peak_of = fixed_rate(res)
    per_round = round_ratios(res)
    extra = extra_ratios(res)
    mem_gib = "%.1f" % (num(m.get("mem_kib")) / 1048576)
    out = []
    w = out.append
    w("# Benchmarks")
    w("")
    w("Generated by `%s` (see [docs/benchmarks.md](docs/benchmarks.md)" %
      m.get("command_line", "bash bench/run.sh"))
    w("for what each contender measures and how to read the ratios). Absolute")
    w("numbers drift with the machine and whatever else runs on it; the ratios")
    w("between contenders of one run are what hold.")
    w("")
    w("```")
    w(ratios_line(res))
    w("```")
    w("")
    w("Each ratio is the median of %d rounds at %s clients (below);" %
      (rounds, max_level))
    w("within a round its contenders ran back to back.")
    w("")
    w("- fresh_vs_pgbench: sidecar fresh (Begin + Complete, with Redis, default")
    w("  settings: concurrent statements folded into batches) req/s / pgbench")
    w("  running the same single-row SQL (bench/sql/fresh.sql) transactions/s.")
    w("- fresh_vs_pair: sidecar fresh req/s / pgbench running the pair a service")
    w("  would write by hand on the same table (bench/sql/pair.sql: INSERT ... ON")
    w("  CONFLICT DO NOTHING, then the token-guarded UPDATE) transactions/s.")
    w("- one_call_vs_pair: the mean latency of one Begin + Complete on a new")
    w("  key at one client (the sidecar with its defaults, no Redis) / that of")
    w("  the hand-written pair (bench/sql/pair.sql) at one client; see \"One")
    w("  call at one client\" below (not at %s clients)." % max_level)
    w("- replay_redis_vs_echo, replay_pg_vs_echo: sidecar replays (Begin on a")
    w("  finished key) served by Redis (every replay a Redis GET) and by")
    w("  PostgreSQL (no Redis), both with the in-process cache off")
    w("  (--local-cache-mib 0), req/s / idem-bench-echo req/s. With the default")
    w("  in-process cache, replays of keys this instance saw are answered from")
    w("  memory: see \"sidecar replay, in-process cache (default)\" below")
    w("  (replay_local_vs_echo=%s at %s clients, round 1)." %
      (extra["replay_local_vs_echo"], max_level))
    w("  A replay from PostgreSQL is answered from another thread than the")
    w("  one that took the call; idem-bench-echo --handoff does only that")
    w("  (handoff_vs_echo=%s; replay_redis_vs_handoff=%s," %
      (extra["handoff_vs_echo"], extra["replay_redis_vs_handoff"]))
    w("  replay_pg_vs_handoff=%s; %s clients, round 1)." %
      (extra["replay_pg_vs_handoff"], max_level))
    w("- replay_pg_vs_select: sidecar replay-pg req/s / pgbench running the")
    w("  primary-key SELECT a service would write by hand to replay an answer")
    w("  (bench/sql/select.sql) transactions/s, with one connection per client.")
    w("- p99_vs_pgbench: p99 of sidecar fresh / p99 of pgbench fresh.sql, both at")
    w("  a fixed %s requests/s (half of the lower peak fresh rate, %s's" %
      (half, peak_of))
    w("  %s/s: a load both sustain)," % peak)
    w("  latency from the scheduled start.")
    w("- gateway_replay_vs_upstream: h2load --h1 POSTs with one")
    w("  Idempotency-Key through the HTTP gateway (every request a replay from")
    w("  the in-process cache) req/s / the same h2load run against the service")
    w("  behind it (idem-bench-http-upstream, a trivial single-threaded")
    w("  HTTP/1.1 server) req/s; see \"HTTP gateway\" below.")
    w("- gateway_replay_vs_nginx: the same gateway replays req/s / nginx")
    w("  (one process) answering the same POST itself with the service's 201")
    w("  req/s. gateway_pass_vs_nginx_proxy: GETs with no key passed through")
    w("  the gateway to that service req/s / the same through nginx's")
    w("  proxy_pass with upstream keep-alive req/s.")
    w("- cached_replay_vs_health: Begin on one finished key, answered from")
    w("  the in-process cache, req/s / the standard")
    w("  grpc.health.v1.Health/Check req/s, both sent by h2load to one")
    w("  sidecar; see \"A cached replay against the health Check\" below.")
    w("- rss_mib: the largest peak RSS (VmHWM) of any sidecar process in the run.")
    w("")
    w("| round | sidecar fresh | pgbench fresh | fresh_vs_pgbench |"
      " pgbench pair | fresh_vs_pair | replay-redis | replay-pg | echo | replay_redis_vs_echo |"
      " replay_pg_vs_echo | sidecar p99 ms | pgbench p99 ms | p99_vs_pgbench |")
    w("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in range(1, rounds + 1):
        rv = lambda role, field="throughput": res.round_value(role, field, r)  # noqa: E731
        w("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s "
          "| %s |" % (
            r, printf_f(rv("sidecar_fresh")), printf_f(rv("pgbench_fresh")),
            per_round["fresh_vs_pgbench"][r - 1],
            printf_f(rv("pgbench_pair")), per_round["fresh_vs_pair"][r - 1],
            printf_f(rv("replay_redis")), printf_f(rv("replay_pg")),
            printf_f(rv("echo")),
            per_round["replay_redis_vs_echo"][r - 1],
            per_round["replay_pg_vs_echo"][r - 1],
            ms(rv("sidecar_rate", "p99_us")), ms(rv("pgbench_rate", "p99_us")),
            per_round["p99_vs_pgbench"][r - 1]))
    w("")
    w("## Machine and versions")
    w("")
    w("- date: %s" % m.get("started_at", ""))
    w("- CPU: %s, %s cores; memory %s GiB" %
      (m.get("cpu_model") or "unknown", m.get("nproc", ""), mem_gib))
    w("- kernel: %s" % m.get("kernel", ""))
    w("- load average (1, 5, 15 min) before: %s; after: %s" %
      (m.get("load_before", ""), m.get("load_after", "")))
    w("- PostgreSQL: %s" % m.get("postgres_version", ""))
    w("- pgbench: %s" % m.get("pgbench_version", ""))
    w("- Redis: %s" % m.get("redis_version", ""))
    w("- gRPC: %s; compiler: %s" %
      (m.get("grpc_version", ""), m.get("compiler", "")))
    built = ("the binaries named in the command above"
             if "IDEM_SIDECAR=" in m.get("command_line", "")
             else "Release build")
    w("- sidecar: %s, of commit %s; allocator of the sidecar" %
      (built, m.get("git_rev", "")))
    w("  and echo server: %s / %s" %
      (m.get("allocator_sidecar", ""), m.get("allocator_echo", "")))
    w("- runs: warmup %ss, measured %ss each, at" %
      (m.get("warmup_s", ""), m.get("duration_s", "")))
    w("  %s and %s clients; idem-bench and pgbench each use" %
      (" ".join(res.levels()), max_level))
    w("  up to 2 threads; snapshot body %s bytes; replay pool" %
      m.get("snapshot_bytes", ""))
    w("  %s keys; the sidecar's --pg-pool-size equals the number of" %
      m.get("pool_keys", ""))
    w("  clients (pgbench's connections) in each run. The tables show round 1")
    w("  at %s clients." % max_level)
    w("")
    w("PostgreSQL settings (one file, bench.conf, for every contender):")
    w("")
    w("```")
    out.extend(res.settings.splitlines())
    w("```")
    w("")
    w("## Fresh: Begin + Complete on a new key")
    w("")
    w("pgbench runs the statements the sidecar runs alone (insert-or-read;")
    w("read + guarded update), each its own transaction, one request at a")
    w("time per connection. Under concurrency the sidecar folds the same")
    w("statements of concurrent requests into batch statements, one commit")
    w("each (--pg-max-batch 1 turns that off: its row shows what batching")
    w("buys).")
    w("")
    out.extend(table(res, "fresh"))
    w("")
    w("## Replay: Begin on a finished key")
    w("")
    w("idem-bench-echo answers the same Begin with a canned response: the")
    w("ceiling for any RPC here. pgbench replay.sql is the SQL of a replay")
    w("without Redis (the insert-or-read statement, which conflicts and")
    w("returns the record). replay-redis and replay-pg run with the in-process")
    w("cache off; the default (in-process cache on) row replays the same pool")
    w("with Redis configured.")
    w("")
    out.extend(table(res, "replay"))
    w("")
    w("## Contention: many clients on a few hot keys")
    w("")
    w("Each request is a Begin on one of the hot keys; the winner Completes")
    w("and moves the key on to a new generation, the others get IN_PROGRESS")
    w("(or COMPLETED); every answer counts as a request.")
    w("")
    out.extend(table(res, "contention"))
    w("")
    w("## Mixed: 90% replay (Redis), 10% fresh")
    w("")
    out.extend(table(res, "mixed"))
    w("")
    w("## p99 at half of the peak fresh load")
    w("")
    out.extend(table(res, "rate"))
    w("")
    w("## Sidecar peak RSS (VmHWM)")
    w("")
    w("| sidecar | --pg-pool-size | peak RSS MiB |")
    w("|---|--:|--:|")
    last = {}
    for kind, pool, kib in res.rss:
        last[(kind, pool)] = kib
    for (kind, pool) in sorted(last, key=lambda k: (k[0], num(k[1]))):
        # awk's print (%.6g), then bash's printf %.1f, as before.
        w("| %s | %s | %s |" % (
            kind, pool, printf_f("%.6g" % (num(last[(kind, pool)]) / 1024))))
    out.extend(one_call_section(res))
    out.extend(gateway_section(res))
    out.extend(cached_section(res))
    out.extend(waiters_section(res))
    return "\n".join(out) + "\n"


def one_call_line(res):
    """The ONE_CALL line of bench/run.sh --one-call-only: the median ratio
    and the median mean latencies (ms) of its contenders."""
    def mean_ms(role):
        rates = [num(res.round_value(role, "throughput", r))
                 for r in range(1, res.rounds() + 1)]
        return median(["%.3f" % (1000 / x) if x else "nan" for x in rates])
    ratios = round_ratios(res)
    return ("ONE_CALL one_call_vs_pair=%s one_call_vs_own_sql=%s "
            "sidecar_ms=%s pair_ms=%s own_sql_ms=%s" % (
                median(ratios["one_call_vs_pair"]),
                median(ratios["one_call_vs_own_sql"]),
                mean_ms("sidecar_one_call"), mean_ms("pair_one_client"),
                mean_ms("fresh_sql_one_client")))


def one_call_section(res):
    """The one-client rounds: one Begin + Complete against the hand-written
    pair, each round's order alternating; none if the run has none."""
    if not any(r["role"] == "sidecar_one_call" for r in res.runs):
        return []
    ratios = round_ratios(res)
    per_round = ratios["one_call_vs_pair"]
    own_sql = ratios["one_call_vs_own_sql"]
    out = ["", "## One call at one client", "",
           "One client, one request at a time: the sidecar (default flags, no",
           "Redis) running Begin + Complete on new keys, pgbench -c 1 running",
           "the hand-written pair (bench/sql/pair.sql) and pgbench -c 1 running",
           "the sidecar's own two statements (bench/sql/fresh.sql). The mean",
           "latency is 1 / throughput; one_call_vs_pair is the sidecar's over",
           "the pair's, one_call_vs_own_sql the sidecar's over its statements'",
           "(what the sidecar adds besides its SQL).", "",
           "| round | first | sidecar req/s | sidecar mean ms | sidecar p99 ms "
           "| pair tx/s | pair mean ms | pair p99 ms | own SQL mean ms "
           "| one_call_vs_pair | one_call_vs_own_sql |",
           "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in range(1, res.rounds() + 1):
        rv = lambda role, field="throughput": res.round_value(role, field, r)  # noqa: E731

        def mean_ms(role):
            rate = num(rv(role))
            return "%.3f" % (1000 / rate) if rate else "nan"
        first = res.meta.get("one_call_order_%d" % r, "").split()
        out.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r, first[0] if first else "", printf_f(rv("sidecar_one_call")),
            mean_ms("sidecar_one_call"), ms(rv("sidecar_one_call", "p99_us")),
            printf_f(rv("pair_one_client")), mean_ms("pair_one_client"),
            ms(rv("pair_one_client", "p99_us")),
            mean_ms("fresh_sql_one_client"), per_round[r - 1],
            own_sql[r - 1]))
    return out


def gateway_section(res):
    """The HTTP gateway's row (docs/gateway.md): replays through the gateway
    and the upstream's own answers, each round back to back, and CPU per
    request of the serving process and of h2load."""
    runs = [r for r in res.runs if r["role"] == "gateway_replay"]
    if not runs:
        return []
    per_round = round_ratios(res)["gateway_replay_vs_upstream"]

    def cpu(role, rnd, column):
        return cpu_per_1k(res, role, rnd, column)
    out = ["", "## HTTP gateway: replays against the service's own answers",
           "",
           "h2load --h1 -t 1, %s connections, POSTs /payments with one" %
           runs[0]["clients"],
           "Idempotency-Key: through the gateway (a sidecar with default "
           "flags and",
           "--http-listen) every request after the first is a replay from "
           "the",
           "in-process cache; directly, idem-bench-http-upstream (one thread, "
           "Boost.Beast)",
           "answers 201 and a small JSON. Both back to back in each round, "
           "the order",
           "alternating; the ratio's median is in the RATIOS line. CPU is "
           "seconds per",
           "1,000 requests: of the sidecar or the upstream, and of h2load.",
           "",
           "| round | first | gateway req/s | upstream req/s | ratio |"
           " gateway p99 ms | upstream p99 ms | CPU: sidecar | upstream |"
           " h2load via gateway | h2load direct |",
           "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for rnd in range(1, res.rounds() + 1):
        gw = lambda f: res.round_value("gateway_replay", f, rnd)  # noqa: E731
        up = lambda f: res.round_value("http_upstream", f, rnd)  # noqa: E731
        first = res.meta.get("gateway_order_%d" % rnd, "-").split(" ")[0]
        out.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |"
                   % (rnd, first, printf_f(gw("throughput")),
                      printf_f(up("throughput")), per_round[rnd - 1],
                      ms(gw("p99_us")), ms(up("p99_us")),
                      cpu("gateway_replay", rnd, "server_ticks"),
                      cpu("http_upstream", rnd, "server_ticks"),
                      cpu("gateway_replay", rnd, "client_ticks"),
                      cpu("http_upstream", rnd, "client_ticks")))
    if not any(r["role"] == "nginx_answer" for r in res.runs):
        return out
    ratios = round_ratios(res)
    out += ["",
            "Against nginx (nginx-light, one process): the same POST answered "
            "by nginx",
            "itself (`return 201` with the upstream's body), and GETs with no "
            "key passed",
            "to the upstream, through the gateway and through nginx's "
            "proxy_pass with",
            "upstream keep-alive (`keepalive 32`). CPU as above, of the "
            "sidecar or nginx.",
            "",
            "| round | gateway replay req/s | nginx answer req/s | ratio |"
            " gateway pass-through req/s | nginx proxy req/s | ratio |"
            " CPU: replay | nginx answer | pass-through | nginx proxy |",
            "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for rnd in range(1, res.rounds() + 1):
        v = lambda role: res.round_value(role, "throughput", rnd)  # noqa: E731
        out.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |"
                   % (rnd, printf_f(v("gateway_replay")),
                      printf_f(v("nginx_answer")),
                      ratios["gateway_replay_vs_nginx"][rnd - 1],
                      printf_f(v("gateway_pass")), printf_f(v("nginx_proxy")),
                      ratios["gateway_pass_vs_nginx_proxy"][rnd - 1],
                      cpu("gateway_replay", rnd, "server_ticks"),
                      cpu("nginx_answer", rnd, "server_ticks"),
                      cpu("gateway_pass", rnd, "server_ticks"),
                      cpu("nginx_proxy", rnd, "server_ticks")))
    return out


def gateway_line(res):
    """GATEWAY gateway_replay_vs_upstream=X gateway_rps=A upstream_rps=B:
    the median ratio and the medians of either side's req/s."""
    rounds = range(1, res.rounds() + 1)

    def rps(role):
        return median([res.round_value(role, "throughput", r)
                       for r in rounds])
    ratios = round_ratios(res)
    return ("GATEWAY gateway_replay_vs_upstream=%s gateway_rps=%s "
            "upstream_rps=%s gateway_replay_vs_nginx=%s "
            "gateway_pass_vs_nginx_proxy=%s" % (
                median(ratios["gateway_replay_vs_upstream"]),
                rps("gateway_replay"), rps("http_upstream"),
                median(ratios["gateway_replay_vs_nginx"]),
                median(ratios["gateway_pass_vs_nginx_proxy"])))


def cpu_per_1k(res, role, rnd, column):
    """CPU seconds per 1,000 requests in `column` of the run of `role` in
    round `rnd`, "-" if none."""
    hz = num(res.meta.get("clk_tck", "100")) or 100
    for r in res.runs:
        if r["role"] == role and r["round"] == str(rnd):
            return per_1k(r[column], r["result"].get("requests_total"), hz)
    return "-"


def cached_cpu_ratios(res):
    """Per round, the sidecar's CPU per call in the health Check over that in
    the cached replay: as cached_replay_vs_health, below 1.0 the replay
    costs more. On a shared machine it moves less than the req/s."""
    out = []
    for rnd in range(1, res.rounds() + 1):
        per_call = {}
        for r in res.runs:
            n = num(r["result"].get("requests_total"))
            if r["round"] == str(rnd) and n > 0 and r["role"] in (
                    "cached_replay", "health_check"):
                per_call[r["role"]] = num(r["server_ticks"]) / n
        out.append(ratio(per_call.get("health_check"),
                         per_call.get("cached_replay")))
    return out


def cached_section(res):
    """The cached replay against the health Check: per round, either side's
    req/s and p99 and the CPU per 1,000 calls of the sidecar and of h2load;
    none if the run has none."""
    runs = [r for r in res.runs if r["role"] == "cached_replay"]
    if not runs:
        return []
    per_round = round_ratios(res)["cached_replay_vs_health"]
    cpu_ratios = cached_cpu_ratios(res)
    out = ["", "## A cached replay against the health Check", "",
           "One sidecar (default flags, no Redis) and one finished key; "
           "h2load -t 1,",
           "%s connections of one stream each, sends Begin on that key, "
           "which the" % runs[0]["clients"],
           "in-process cache answers (COMPLETED), and the standard",
           "grpc.health.v1.Health/Check (SERVING). Both back to back in each "
           "round, the",
           "order alternating; the ratio's median is in the RATIOS line. CPU "
           "is seconds",
           "per 1,000 calls, of the sidecar and of h2load; the CPU ratio is "
           "the",
           "sidecar's per Check over its per replay (below 1.0 the replay "
           "costs more).", "",
           "| round | first | replay req/s | Check req/s | ratio | CPU ratio |"
           " replay p99 ms | Check p99 ms | CPU: sidecar, replay | Check |"
           " h2load, replay | Check |",
           "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for rnd in range(1, res.rounds() + 1):
        rv = lambda role, f: res.round_value(role, f, rnd)  # noqa: E731
        first = res.meta.get("cached_order_%d" % rnd, "-").split(" ")[0]
        out.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s "
                   "| %s |"
                   % (rnd, first, printf_f(rv("cached_replay", "throughput")),
                      printf_f(rv("health_check", "throughput")),
                      per_round[rnd - 1], cpu_ratios[rnd - 1],
                      ms(rv("cached_replay", "p99_us")),
                      ms(rv("health_check", "p99_us")),
                      cpu_per_1k(res, "cached_replay", rnd, "server_ticks"),
                      cpu_per_1k(res, "health_check", rnd, "server_ticks"),
                      cpu_per_1k(res, "cached_replay", rnd, "client_ticks"),
                      cpu_per_1k(res, "health_check", rnd, "client_ticks")))
    return out


def cached_line(res):
    """CACHED cached_replay_vs_health=X cpu_ratio=Y replay_rps=A
    health_rps=B replay_cpu_s_per_1k=C health_cpu_s_per_1k=D: the median
    ratios (req/s; the sidecar's CPU per call, cached_cpu_ratios) and the
    medians of either side's req/s and sidecar CPU per 1,000 calls."""
    rounds = range(1, res.rounds() + 1)

    def rps(role):
        return median([res.round_value(role, "throughput", r)
                       for r in rounds])

    def cpu(role):
        return median([cpu_per_1k(res, role, r, "server_ticks")
                       for r in rounds])
    return ("CACHED cached_replay_vs_health=%s cpu_ratio=%s replay_rps=%s "
            "health_rps=%s replay_cpu_s_per_1k=%s health_cpu_s_per_1k=%s" % (
                median(round_ratios(res)["cached_replay_vs_health"]),
                median(cached_cpu_ratios(res)),
                rps("cached_replay"), rps("health_check"),
                cpu("cached_replay"), cpu("health_check")))


def waiters_section(res):
    """bench/waiters.py's rounds (docs/benchmarks.md#waiters-on-one-key):
    milliseconds from Complete being sent to each waiter's answer."""
    if not res.waiters:
        return []
    out = ["", "## Waiters on one key", "",
           "%s waiting Begins on one key, half on each of two sidecars "
           "(default flags), sent" % res.meta.get("waiters", "?"),
           "by h2load; milliseconds from Complete being sent to each answer.",
           "", "| round | min | p50 | p99 | max | Complete took |",
           "|--:|--:|--:|--:|--:|--:|"]
    for r in res.waiters:
        out.append("| %s |" % " | ".join(r.get(f, "") for f in WAITER_FIELDS))
    return out


# ------------------------------------------------------------------ pgbench
def pgbench_result(warmup_s, duration_s, logs):
    """The RESULT line of a pgbench -l run, measured over the window after
    the warmup like idem-bench's. Log lines: client transaction time_us
    script epoch_s epoch_us [lag_us]; the epoch is the end of the
    transaction. Latency with --rate includes the schedule lag. Raises
    ValueError on failed transactions."""
    rows = []
    for path in logs:
        with open(path, encoding="utf-8") as f:
            rows.extend(line.split() for line in f if line.strip())
    failed = sum(1 for r in rows if not r[2].isdigit())
    if failed:
        raise ValueError("%d failed transactions" % failed)
    t0 = None
    for r in rows:
        s = float(r[4]) + float(r[5]) / 1e6 - float(r[2]) / 1e6
        if t0 is None or s < t0:
            t0 = s
    t0 = float("%.6f" % (t0 if t0 is not None else -1))
    start = float("%.6f" % (t0 + warmup_s))
    end = float("%.6f" % (t0 + warmup_s + duration_s))
    lat = []
    for r in rows:
        e = float(r[4]) + float(r[5]) / 1e6
        if start <= e < end:
            lat.append(int(r[2]) + (int(r[6]) if len(r) >= 7 else 0))
    lat.sort()
    n = len(lat)

    def pct(p):
        i = int(p / 100 * n)
        if i < p / 100 * n:
            i += 1
        if i < 1:
            i = 1
        return lat[i - 1] if i <= n else 0
    return ("RESULT throughput=%.2f p50_us=%d p90_us=%d p99_us=%d "
            "p999_us=%d errors=0 requests_total=%d" % (
                n / duration_s, pct(50), pct(90), pct(99), pct(99.9),
                len(rows)))


# ------------------------------------------------------------------ ab.sh
def ab_medians(lines, clients, scenarios):
    """bench/ab.sh's summary: lines "scenario clients A|B req/s cpu_us"."""
    def med(v):
        v = sorted(v)
        n = len(v)
        return v[(n + 1) // 2 - 1] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    out = []
    rows = [l.split() for l in lines if l.strip()]
    for c in clients:
        for s in scenarios:
            pick = lambda b: [r for r in rows  # noqa: E731
                              if r[0] == s and r[1] == c and r[2] == b]
            a, b = pick("A"), pick("B")
            if not a or not b:
                continue
            mra, mca = med([num(r[3]) for r in a]), med([num(r[4]) for r in a])
            mrb, mcb = med([num(r[3]) for r in b]), med([num(r[4]) for r in b])
            div = lambda x, y: x / y if y else float("nan")  # noqa: E731
            out.append(
                "%-13s c=%-3s A %7.0f req/s %4.0f us  B %7.0f req/s %4.0f us"
                "  B/A %.2f %.2f" % (s, c, mra, mca, mrb, mcb, div(mrb, mra),
                                     div(mcb, mca)))
    return out


# ------------------------------------------------------------------ main
USAGE = __doc__.split("\n\n")[2]


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if len(argv) < 2 else sys.stdout)
        return 2 if len(argv) < 2 else 0
    cmd, args = argv[1], argv[2:]
    try:
        if cmd == "report" and len(args) == 2:
            res = Results.load(args[0])
            with open(args[1], "w", encoding="utf-8") as f:
                f.write(markdown(res))
            print(ratios_line(res))
        elif cmd == "ab-medians" and len(args) == 3:
            with open(args[0], encoding="utf-8") as f:
                lines = f.readlines()
            for line in ab_medians(lines, args[1].split(), args[2].split()):
                print(line)
        else:
            print(USAGE, file=sys.stderr)
            return 2
    except (OSError, ValueError) as e:
        print("bench/report.py %s: %s" % (cmd, e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
