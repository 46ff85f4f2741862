#!/usr/bin/env python3
"""One PostgreSQL against a Citus coordinator with two workers, side by
side on this machine (docs/scaling.md, "Citus against one primary").

  python3 bench/citus.py [--rounds N] [--clients C] [--duration S]
                         [--warmup S] [--build-dir DIR]

Starts a throwaway PostgreSQL and a Citus cluster (a coordinator and two
workers, Citus' default 32 shards per table), every node with the same
settings (fsync on) but Citus preloaded on the cluster's; runs the
sidecar's migrations on both (the tables are distributed on Citus); starts
one sidecar on each (no Redis, so every call reaches the
database, and no in-process cache, so every replay reads it), and a second
sidecar on the cluster with --pg-max-batch 1; preloads a pool of finished
keys. Then, for each round, idem-bench at C clients (one tenant, so one
worker holds every key) runs fresh (Begin + Complete on new keys) and then
replay-pg (Begin on finished keys) against each sidecar, the three back to
back, the order rotating from round to round. Commits are the
sum of pg_stat_database's xact_commit on every node of the target (on
Citus also given per role: coordinator, workers) over the whole run,
warm-up included, divided by idem-bench's requests_total.

Prints a line per run and a table of the medians, and exits non-zero if a
run failed. Binaries come from DIR (default build/): server/
idempotency-sidecar and bench/idem-bench, or IDEM_SIDECAR and IDEM_BENCH.
Exits 77 when Citus is not installed beside the PostgreSQL in use
(IDEM_PG_BINDIR, else the newest /usr/lib/postgresql/*/bin). One machine
cannot show scale-out: every node shares its cores and disk.
"""

import argparse
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import Failed, find_pg_bindir, free_port, last_result, read  # noqa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIPPED = 77

# Every node's settings (PORT and SOCKET_DIR filled in); Citus' nodes add
# CITUS_SETTINGS.
PG_SETTINGS = """\
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{socket_dir}'
max_connections = 300
shared_buffers = 128MB
fsync = on
synchronous_commit = on
max_wal_size = 4GB
checkpoint_timeout = 30min
log_min_messages = warning
"""
CITUS_SETTINGS = """\
shared_preload_libraries = 'citus'
citus.local_hostname = '127.0.0.1'
"""


def log(message):
    sys.stderr.write("citus.py: %s\n" % message)
    sys.stderr.flush()


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--duration", type=int, default=10,
                   help="measured seconds of each run")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--keys", type=int, default=5000,
                   help="finished keys preloaded for replay-pg")
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    return p.parse_args(argv)


def parse_result(line):
    """{key: value} of a "RESULT k=v ..." line."""
    return dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)


class Node:
    """A PostgreSQL server in its own directory under `tmp`."""

    def __init__(self, bindir, tmp, name, citus):
        self.bindir = bindir
        self.dir = os.path.join(tmp, name)
        self.data = os.path.join(self.dir, "data")
        self.port = free_port()
        self.citus = citus
        os.makedirs(self.dir)
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)

    def as_owner(self, cmd):
        return (["runuser", "-u", "postgres", "--"] + cmd
                if os.geteuid() == 0 else cmd)

    def start(self):
        init = subprocess.run(self.as_owner(
            [os.path.join(self.bindir, "initdb"), "-D", self.data, "-U",
             "postgres", "-A", "trust", "-E", "UTF8", "--locale=C",
             "--no-instructions"]), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        if init.returncode:
            raise Failed("initdb in %s: %s" % (self.data, init.stdout))
        settings = PG_SETTINGS.format(port=self.port, socket_dir=self.dir)
        if self.citus:
            settings += CITUS_SETTINGS
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write(settings)
        pglog = os.path.join(self.dir, "log")
        if subprocess.run(self.as_owner(
                [os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-l",
                 pglog, "-w", "-t", "60", "start"]),
                stdout=subprocess.DEVNULL).returncode:
            raise Failed("PostgreSQL in %s did not start:\n%s" %
                         (self.data, read(pglog)))
        if self.citus:
            self.psql("CREATE EXTENSION citus")

    def stop(self):
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            subprocess.run(self.as_owner(
                [os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-m",
                 "immediate", "-w", "stop"]), stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)

    def conninfo(self):
        return "host=127.0.0.1 port=%d user=postgres dbname=postgres" % (
            self.port)

    def psql(self, sql):
        p = subprocess.run(
            [os.path.join(self.bindir, "psql"), "-X", "-At", "-h",
             "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d",
             "postgres", "-v", "ON_ERROR_STOP=1", "-c", sql],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        if p.returncode:
            raise Failed("psql on port %d: %s: %s" %
                         (self.port, sql, p.stderr.strip()))
        return p.stdout.strip()

    def commits(self):
        return int(self.psql("SELECT xact_commit FROM pg_stat_database"
                             " WHERE datname = 'postgres'"))


class Target:
    """A database (one node, or a coordinator and its workers) with one
    sidecar in front."""

    def __init__(self, name, nodes, flags=()):
        self.name = name
        self.nodes = nodes
        self.flags = list(flags)
        self.proc = None
        self.addr = None

    def commits(self):
        return [n.commits() for n in self.nodes]


def start_sidecar(sidecar, target, tmp):
    target.addr = "127.0.0.1:%d" % free_port()
    out = open(os.path.join(tmp, "sidecar-%s.log" % target.name), "w")
    target.proc = subprocess.Popen(
        [sidecar, "--listen", target.addr, "--postgres",
         target.nodes[0].conninfo(), "--metrics-listen",
         "127.0.0.1:%d" % free_port(), "--local-cache-mib", "0",
         "--log-level=warn"] + target.flags,
        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)


def bench(bench_bin, target, scenario, args, extra=()):
    cmd = [bench_bin, "--target", target.addr, "--scenario", scenario,
           "-c", str(args.clients), "--warmup", "%ds" % args.warmup,
           "--duration", "%ds" % args.duration, "--key-space",
           str(args.keys), "--fail-on-error"] + list(extra)
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    line = last_result(p.stdout)
    if p.returncode or not line:
        raise Failed("%s failed:\n%s" % (" ".join(cmd), p.stdout[-3000:]))
    return parse_result(line)


def measure(bench_bin, target, scenario, args):
    """One run: req/s and commits per request (all nodes, then each)."""
    before = target.commits()
    r = bench(bench_bin, target, scenario, args, ["--no-preload"]
              if scenario == "replay-pg" else [])
    # A backend reports its counters at most once a second.
    time.sleep(1.5)
    after = target.commits()
    requests = int(r["requests_total"])
    per_node = [(a - b) / requests for a, b in zip(after, before)]
    return float(r["throughput"]), per_node


def main(argv):
    args = parse_args(argv)
    try:
        bindir = find_pg_bindir()
    except Failed as e:
        log(str(e))
        return 1
    citus_so = os.path.join(os.path.dirname(bindir), "lib", "citus.so")
    if not os.path.exists(citus_so):
        log("skipped: Citus is not installed (no %s; docs/scaling.md)" %
            citus_so)
        return SKIPPED
    sidecar = os.environ.get("IDEM_SIDECAR") or os.path.join(
        args.build_dir, "server", "idempotency-sidecar")
    bench_bin = os.environ.get("IDEM_BENCH") or os.path.join(
        args.build_dir, "bench", "idem-bench")
    for b in (sidecar, bench_bin):
        if not os.access(b, os.X_OK):
            log("%s: not an executable (build it, or set IDEM_SIDECAR and"
                " IDEM_BENCH)" % b)
            return 1
    tmp = tempfile.mkdtemp(prefix="idem-citus-bench-")
    os.chmod(tmp, 0o755)
    one = Target("one", [Node(bindir, tmp, "one", False)])
    cluster = Target("citus", [Node(bindir, tmp, name, True)
                               for name in ("coordinator", "worker1",
                                            "worker2")])
    # The same cluster behind a sidecar that runs every call on its own
    # (--pg-max-batch 1): what folding a tenant's calls buys.
    unbatched = Target("citus-b1", cluster.nodes, ["--pg-max-batch", "1"])
    targets = [one, cluster, unbatched]
    rows = {}
    try:
        for node in one.nodes + cluster.nodes:
            node.start()
        coordinator = cluster.nodes[0]
        coordinator.psql("SELECT citus_set_coordinator_host('127.0.0.1', %d)"
                         % coordinator.port)
        for worker in cluster.nodes[1:]:
            coordinator.psql("SELECT citus_add_node('127.0.0.1', %d)" %
                             worker.port)
        for t in targets:
            m = subprocess.run([sidecar, "migrate", "--postgres",
                                t.nodes[0].conninfo()],
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
            if m.returncode:
                raise Failed("migrate on %s: %s" % (t.name, m.stdout))
            start_sidecar(sidecar, t, tmp)
        for t in targets:
            subprocess.run([bench_bin, "--target", t.addr, "--wait-ready",
                            "30s", "--ready-only"], check=True,
                           stdout=subprocess.DEVNULL)
            log("%s: preloading %d finished keys" % (t.name, args.keys))
            subprocess.run([bench_bin, "--target", t.addr, "--scenario",
                            "replay-pg", "--key-space", str(args.keys),
                            "--preload-only"], check=True,
                           stdout=subprocess.DEVNULL)
        for rnd in range(args.rounds):
            order = targets[rnd % 3:] + targets[:rnd % 3]
            if rnd % 2:
                order.reverse()
            for scenario in ("fresh", "replay-pg"):
                for t in order:
                    rate, per_node = measure(bench_bin, t, scenario, args)
                    rows.setdefault((t.name, scenario), []).append(
                        (rate, per_node))
                    print("round %d %-8s %-9s %8.0f req/s  commits/request"
                          " %.3f (per node: %s)" %
                          (rnd + 1, t.name, scenario, rate, sum(per_node),
                           " ".join("%.3f" % c for c in per_node)),
                          flush=True)
    except (Failed, subprocess.CalledProcessError) as e:
        log("FAILED: %s" % e)
        return 1
    finally:
        for t in targets:
            if t.proc is not None:
                t.proc.terminate()
                t.proc.wait()
        for node in one.nodes + cluster.nodes:
            node.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    print("\n| scenario | target | req/s (median) | vs one | commits/request"
          " | of which coordinator |")
    print("|---|---|--:|--:|--:|--:|")
    for scenario in ("fresh", "replay-pg"):
        base = statistics.median(r for r, _ in rows[("one", scenario)])
        for t in targets:
            runs = rows[(t.name, scenario)]
            rate = statistics.median(r for r, _ in runs)
            print("| %s | %s | %s | %.2f | %.2f | %s |" % (
                scenario, t.name, "{:,.0f}".format(rate), rate / base,
                statistics.median(sum(c) for _, c in runs),
                "%.2f" % statistics.median(c[0] for _, c in runs)
                if len(t.nodes) > 1 else "-"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
