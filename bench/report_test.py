#!/usr/bin/env python3
"""Unit test of bench/report.py (CTest: bench_report_test): a fixed set of
raw results, as bench/run.py writes them, must give known medians, ratios,
tables and RATIOS line. Needs no server."""

import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402


def result(throughput, p99=1000, requests=3000, p50=500):
    return ("RESULT throughput=%s p50_us=%d p90_us=%d p99_us=%d p999_us=%d "
            "errors=0 requests_total=%d" % (throughput, p50, p50 + 100, p99,
                                            p99 + 1000, requests))


ECHO = "echo (idem-bench-echo)"
HANDOFF = "echo, answered from another thread (--handoff)"
LOCAL = "sidecar replay, in-process cache (default)"
PAIR = "pgbench pair.sql (hand-written pair)"
GATEWAY = "gateway replay (h2load --h1, one key)"
SELECT = "pgbench select.sql (hand-written PK SELECT)"
OWN_SQL = "pgbench fresh.sql, one client"
UPSTREAM = "upstream (idem-bench-http-upstream)"
NGINX = "nginx answering the POST itself (return 201)"
PASS = "gateway pass-through (GET, no key)"
PROXY = "nginx proxy_pass, keep-alive (GET)"
CACHED = "Begin, replayed from the in-process cache"
HEALTH = "grpc.health.v1.Health/Check"

# round role section contender clients server_ticks pg_ticks client_ticks
# result. Round 1 at 64 clients: fresh 20000 / 5000 = 4.00, fresh / pair
# 20000 / 8000 = 2.50, replay-redis 0.95, replay-pg 0.60, replay-pg /
# select 6000 / 8000 = 0.75, p99 1500 / 6000 = 0.25; round 2: 3.00, 2.50,
# 0.90, 0.70, 1.00, nan (pgbench p99 0); round 3: 4.50, 2.00, 1.10, 0.50,
# 0.50, 0.50.
RUNS = [
    ("0", "pgbench_fresh", "fresh", "pgbench fresh.sql", "1", "-", "100", "50",
     result("1000.00", p99=2000)),
    ("0", "pgbench_pair", "fresh", PAIR, "1", "-", "80", "40",
     result("1200.00")),
    ("0", "sidecar_fresh", "fresh", "sidecar fresh (redis)", "1", "300",
     "150", "60", result("800.00", requests=2400)),
    ("0", "-", "replay", ECHO, "1", "10", "0", "20", result("3000.00")),
    ("0", "pgbench_fresh", "fresh", "pgbench fresh.sql", "8", "-", "100", "50",
     result("4000.00")),
    ("0", "pgbench_pair", "fresh", PAIR, "8", "-", "80", "40",
     result("4500.00")),
    ("0", "sidecar_fresh", "fresh", "sidecar fresh (redis)", "8", "300", "150",
     "60", result("6000.00")),
    ("0", "-", "fresh", "sidecar fresh (no redis)", "1", "30", "15", "6",
     result("700.00")),
    ("1", "pgbench_fresh", "fresh", "pgbench fresh.sql", "64", "-", "100",
     "50", result("5000.00")),
    ("1", "pgbench_pair", "fresh", PAIR, "64", "-", "80", "40",
     result("8000.00")),
    ("1", "sidecar_fresh", "fresh", "sidecar fresh (redis)", "64", "300",
     "150", "60", result("20000.00")),
    ("1", "sidecar_rate", "rate", "sidecar fresh --target-rate 2500 (redis)",
     "64", "1", "2", "3", result("2500.00", p99=1500)),
    ("1", "pgbench_rate", "rate", "pgbench fresh.sql --rate 2500", "64", "-",
     "2", "3", result("2499.90", p99=6000)),
    ("1", "-", "replay", LOCAL, "64", "1", "0", "1", result("9000.00")),
    ("1", "replay_redis", "replay", "sidecar replay-redis", "64", "1", "0",
     "1", result("9500.00")),
    ("1", "echo", "replay", ECHO, "64", "1", "0", "1", result("10000.00")),
    ("1", "-", "replay", HANDOFF, "64", "1", "0", "1", result("8000.00")),
    ("1", "replay_pg", "replay", "sidecar replay-pg", "64", "1", "0", "1",
     result("6000.00")),
    ("1", "pgbench_select", "replay", SELECT, "64", "-", "1", "1",
     result("8000.00")),
    ("2", "pgbench_fresh", "-", "pgbench fresh.sql", "64", "-", "1", "1",
     result("5000.00")),
    ("2", "pgbench_pair", "-", PAIR, "64", "-", "1", "1", result("6000.00")),
    ("2", "sidecar_fresh", "-", "sidecar fresh (redis)", "64", "1", "1", "1",
     result("15000.00")),
    ("2", "sidecar_rate", "-", "sidecar fresh --target-rate 2500 (redis)",
     "64", "1", "1", "1", result("2500.00", p99=1000)),
    ("2", "pgbench_rate", "-", "pgbench fresh.sql --rate 2500", "64", "-",
     "1", "1", result("2500.00", p99=0)),
    ("2", "replay_redis", "-", "sidecar replay-redis", "64", "1", "1", "1",
     result("9000.00")),
    ("2", "echo", "-", ECHO, "64", "1", "1", "1", result("10000.00")),
    ("2", "replay_pg", "-", "sidecar replay-pg", "64", "1", "1", "1",
     result("7000.00")),
    ("2", "pgbench_select", "-", SELECT, "64", "-", "1", "1",
     result("7000.00")),
    ("3", "pgbench_fresh", "-", "pgbench fresh.sql", "64", "-", "1", "1",
     result("4000.00")),
    ("3", "pgbench_pair", "-", PAIR, "64", "-", "1", "1", result("9000.00")),
    ("3", "sidecar_fresh", "-", "sidecar fresh (redis)", "64", "1", "1", "1",
     result("18000.00")),
    ("3", "sidecar_rate", "-", "sidecar fresh --target-rate 2500 (redis)",
     "64", "1", "1", "1", result("2500.00", p99=2000)),
    ("3", "pgbench_rate", "-", "pgbench fresh.sql --rate 2500", "64", "-",
     "1", "1", result("2500.00", p99=4000)),
    ("3", "replay_redis", "-", "sidecar replay-redis", "64", "1", "1", "1",
     result("11000.00")),
    ("3", "echo", "-", ECHO, "64", "1", "1", "1", result("10000.00")),
    ("3", "replay_pg", "-", "sidecar replay-pg", "64", "1", "1", "1",
     result("5000.00")),
    ("3", "pgbench_select", "-", SELECT, "64", "-", "1", "1",
     result("10000.00")),
    # One client: pair / sidecar req/s (their mean latencies inverted):
    # 1000 / 500 = 2.00, 1000 / 800 = 1.25, 990 / 900 = 1.10.
    ("1", "sidecar_one_call", "one_call",
     "sidecar fresh, one client (default)", "1", "50", "20", "10",
     result("500.00", p99=4000)),
    ("1", "pair_one_client", "one_call", PAIR, "1", "-", "20", "10",
     result("1000.00", p99=2000)),
    ("2", "pair_one_client", "-", PAIR, "1", "-", "1", "1",
     result("1000.00")),
    ("2", "sidecar_one_call", "-", "sidecar fresh, one client (default)",
     "1", "1", "1", "1", result("800.00")),
    ("3", "sidecar_one_call", "-", "sidecar fresh, one client (default)",
     "1", "1", "1", "1", result("900.00")),
    ("3", "pair_one_client", "-", PAIR, "1", "-", "1", "1",
     result("990.00")),
    # Its own SQL / sidecar: 1000 / 500 = 2.00, 1600 / 800 = 2.00,
    # 1350 / 900 = 1.50.
    ("1", "fresh_sql_one_client", "one_call", OWN_SQL, "1", "-", "20", "10",
     result("1000.00")),
    ("2", "fresh_sql_one_client", "-", OWN_SQL, "1", "-", "1", "1",
     result("1600.00")),
    ("3", "fresh_sql_one_client", "-", OWN_SQL, "1", "-", "1", "1",
     result("1350.00")),
    # The gateway's row: 8000 / 10000 = 0.80, 9000 / 10000 = 0.90,
    # 6000 / 10000 = 0.60.
    ("1", "gateway_replay", "gateway", GATEWAY, "64", "600", "0", "300",
     result("8000.00", p99=4000, requests=120000)),
    ("1", "http_upstream", "gateway", UPSTREAM, "64", "150", "0", "300",
     result("10000.00", p99=3000, requests=150000)),
    ("2", "http_upstream", "-", UPSTREAM, "64", "1", "0", "1",
     result("10000.00")),
    ("2", "gateway_replay", "-", GATEWAY, "64", "1", "0", "1",
     result("9000.00")),
    ("3", "gateway_replay", "-", GATEWAY, "64", "1", "0", "1",
     result("6000.00")),
    ("3", "http_upstream", "-", UPSTREAM, "64", "1", "0", "1",
     result("10000.00")),
    # Against nginx, rounds 1 and 2 (round 3 has none): replay 8000 /
    # 16000 = 0.50, 9000 / 12000 = 0.75; pass-through 3000 / 4000 = 0.75,
    # 4000 / 5000 = 0.80.
    ("1", "nginx_answer", "-", NGINX, "64", "200", "0", "1",
     result("16000.00", requests=160000)),
    ("1", "gateway_pass", "-", PASS, "64", "300", "0", "1",
     result("3000.00", requests=30000)),
    ("1", "nginx_proxy", "-", PROXY, "64", "100", "0", "1",
     result("4000.00", requests=40000)),
    ("2", "nginx_answer", "-", NGINX, "64", "1", "0", "1",
     result("12000.00")),
    ("2", "gateway_pass", "-", PASS, "64", "1", "0", "1",
     result("4000.00")),
    ("2", "nginx_proxy", "-", PROXY, "64", "1", "0", "1",
     result("5000.00")),
    # The cached replay against the health Check: 40000 / 50000 = 0.80,
    # 36000 / 60000 = 0.60, 45000 / 50000 = 0.90. The sidecar's CPU per
    # 1,000 calls (ticks / 100 Hz / requests * 1000): replay 0.200, 0.250,
    # 0.200; Check 0.100, 0.100, 0.120.
    ("1", "cached_replay", "cached", CACHED, "64", "2400", "0", "1200",
     result("40000.00", p99=3000, requests=120000)),
    ("1", "health_check", "cached", HEALTH, "64", "1500", "0", "1500",
     result("50000.00", p99=2000, requests=150000)),
    ("2", "health_check", "-", HEALTH, "64", "1800", "0", "1",
     result("60000.00", requests=180000)),
    ("2", "cached_replay", "-", CACHED, "64", "2700", "0", "1",
     result("36000.00", requests=108000)),
    ("3", "cached_replay", "-", CACHED, "64", "2700", "0", "1",
     result("45000.00", requests=135000)),
    ("3", "health_check", "-", HEALTH, "64", "1800", "0", "1",
     result("50000.00", requests=150000)),
]

META = {
    "command_line": "bash bench/run.sh --quick", "levels": "1 8",
    "max_level": "64", "rounds": "3", "warmup_s": "1", "duration_s": "3",
    "snapshot_bytes": "256", "pool_keys": "2000", "clk_tck": "100",
    "load_before": "0.50 0.40 0.30", "started_at": "2026-01-01 00:00:00 UTC",
    "load_after": "1.00 0.90 0.80", "cpu_model": "Test CPU", "nproc": "2",
    "mem_kib": "8388608", "kernel": "Linux 6.1.0", "git_rev": "abc1234",
    "postgres_version": "postgres (PostgreSQL) 15.13",
    "pgbench_version": "pgbench (PostgreSQL) 15.13",
    "redis_version": "Redis server v=7.0.15", "grpc_version": "1.51.1",
    "compiler": "c++ (Debian 12.2.0-14) 12.2.0", "allocator_sidecar":
    "tcmalloc", "allocator_echo": "tcmalloc",
    "gateway_order_1": "gateway upstream",
    "gateway_order_2": "upstream gateway",
    "gateway_order_3": "gateway upstream",
    "one_call_order_1": "sidecar pair",
    "one_call_order_2": "pair sidecar",
    "one_call_order_3": "sidecar pair",
    "cached_order_1": "replay health",
    "cached_order_2": "health replay",
    "cached_order_3": "replay health",
}

# KIND POOL VmHWM kB; the last of a kind and pool is its row, the largest
# of all is rss_mib (81234 / 1024 = 79.3).
RSS = [("local", "1", "50000"), ("local", "64", "81234"),
       ("redis", "64", "70000"), ("no-redis", "8", "60000"),
       ("local", "64", "72000")]


class ReportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        d = cls.dir.name
        with open(os.path.join(d, "meta.tsv"), "w") as f:
            for k, v in META.items():
                f.write("%s\t%s\n" % (k, v))
        with open(os.path.join(d, "runs.tsv"), "w") as f:
            for r in RUNS:
                f.write("\t".join(r) + "\n")
        with open(os.path.join(d, "rss.tsv"), "w") as f:
            for r in RSS:
                f.write("\t".join(r) + "\n")
        with open(os.path.join(d, "bench.conf"), "w") as f:
            f.write("fsync = on\nshared_buffers = 256MB\n")
        cls.res = report.Results.load(d)
        cls.md = report.markdown(cls.res)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_median(self):
        self.assertEqual(report.median(["0.95", "0.90", "1.10"]), "0.95")
        # NaN sorts first, as with sort -g.
        self.assertEqual(report.median(["0.25", "nan", "0.50"]), "0.25")
        self.assertEqual(report.median(["1.00", "2.00"]), "1.50")
        self.assertEqual(report.median([]), "nan")

    def test_printf_f(self):
        # bash's printf reads a long double: decimal ties round as it does.
        self.assertEqual(report.printf_f("16931.55"), "16931.6")
        self.assertEqual(report.printf_f("0.25"), "0.2")
        self.assertEqual(report.printf_f("0.35"), "0.3")
        self.assertEqual(report.printf_f("2.45"), "2.5")
        self.assertEqual(report.printf_f("79.3301"), "79.3")
        self.assertEqual(report.printf_f(""), "0.0")

    def test_ratio(self):
        self.assertEqual(report.ratio("9500.00", "8000.00"), "1.19")
        self.assertEqual(report.ratio("1", "0"), "nan")
        self.assertEqual(report.ratio("", "2"), "0.00")

    def test_round_ratios(self):
        self.assertEqual(report.round_ratios(self.res), {
            "fresh_vs_pgbench": ["4.00", "3.00", "4.50"],
            "fresh_vs_pair": ["2.50", "2.50", "2.00"],
            "one_call_vs_pair": ["2.00", "1.25", "1.10"],
            "one_call_vs_own_sql": ["2.00", "2.00", "1.50"],
            "replay_redis_vs_echo": ["0.95", "0.90", "1.10"],
            "replay_pg_vs_echo": ["0.60", "0.70", "0.50"],
            "replay_pg_vs_select": ["0.75", "1.00", "0.50"],
            "p99_vs_pgbench": ["0.25", "nan", "0.50"],
            "gateway_replay_vs_upstream": ["0.80", "0.90", "0.60"],
            "gateway_replay_vs_nginx": ["0.50", "0.75", "nan"],
            "gateway_pass_vs_nginx_proxy": ["0.75", "0.80", "nan"],
            "cached_replay_vs_health": ["0.80", "0.60", "0.90"],
        })

    def test_ratios_line(self):
        self.assertEqual(
            report.ratios_line(self.res),
            "RATIOS fresh_vs_pgbench=4.00 fresh_vs_pair=2.50 "
            "one_call_vs_pair=1.25 one_call_vs_own_sql=2.00 "
            "replay_redis_vs_echo=0.95 "
            "replay_pg_vs_echo=0.60 replay_pg_vs_select=0.75 "
            "p99_vs_pgbench=0.25 "
            "gateway_replay_vs_upstream=0.80 gateway_replay_vs_nginx=0.50 "
            "gateway_pass_vs_nginx_proxy=0.75 cached_replay_vs_health=0.80 "
            "rss_mib=79.3")

    def test_gateway(self):
        self.assertEqual(report.gateway_line(self.res),
                         "GATEWAY gateway_replay_vs_upstream=0.80 "
                         "gateway_rps=8000.00 upstream_rps=10000.00 "
                         "gateway_replay_vs_nginx=0.50 "
                         "gateway_pass_vs_nginx_proxy=0.75")
        section = "\n".join(report.gateway_section(self.res))
        self.assertIn(section, self.md)
        # Round 1: CPU 600 ticks / 100 Hz / 120000 requests * 1000 = 0.050 s
        # per 1,000 requests of the sidecar, 0.010 of the upstream.
        self.assertIn("| 1 | gateway | 8000.0 | 10000.0 | 0.80 | 4.00 | 3.00 "
                      "| 0.050 | 0.010 | 0.025 | 0.020 |", section)
        self.assertIn("| 2 | upstream | 9000.0 | 10000.0 | 0.90 |", section)
        # Round 1 against nginx: CPU 200 ticks / 100 Hz / 160000 requests
        # * 1000 = 0.013 s per 1,000 of nginx; 300 / 100 / 30000 * 1000 =
        # 0.100 of the pass-through sidecar.
        self.assertIn("| 1 | 8000.0 | 16000.0 | 0.50 | 3000.0 | 4000.0 | 0.75 "
                      "| 0.050 | 0.013 | 0.100 | 0.025 |", section)
        self.assertIn("| 3 | 6000.0 | 0.0 | nan | 0.0 | 0.0 | nan |", section)
        no_gateway = report.Results(self.res.meta, [
            r for r in self.res.runs if "gateway" not in r["section"] and
            r["role"] not in ("gateway_replay", "http_upstream",
                              "nginx_answer", "gateway_pass",
                              "nginx_proxy")], [])
        self.assertEqual(report.gateway_section(no_gateway), [])

    def test_fixed_rate(self):
        # Peaks: sidecar 20000.00, pgbench 5000.00; half of the lower.
        self.assertEqual(report.fixed_rate(self.res), (2500, "5000.00", "pgbench"))

    def test_extra_ratios(self):
        self.assertEqual(report.extra_ratios(self.res), {
            "replay_local_vs_echo": "0.90", "handoff_vs_echo": "0.80",
            "replay_redis_vs_handoff": "1.19", "replay_pg_vs_handoff": "0.75",
        })

    def test_markdown(self):
        md = self.md
        self.assertIn("Generated by `bash bench/run.sh --quick` (see", md)
        self.assertIn(
            "```\nRATIOS fresh_vs_pgbench=4.00 fresh_vs_pair=2.50 "
            "one_call_vs_pair=1.25 one_call_vs_own_sql=2.00 "
            "replay_redis_vs_echo=0.95 "
            "replay_pg_vs_echo=0.60 replay_pg_vs_select=0.75 "
            "p99_vs_pgbench=0.25 "
            "gateway_replay_vs_upstream=0.80 gateway_replay_vs_nginx=0.50 "
            "gateway_pass_vs_nginx_proxy=0.75 cached_replay_vs_health=0.80 "
            "rss_mib=79.3\n```", md)
        self.assertIn("Each ratio is the median of 3 rounds at 64 clients", md)
        self.assertIn("(replay_local_vs_echo=0.90 at 64 clients, round 1).", md)
        self.assertIn("(handoff_vs_echo=0.80; replay_redis_vs_handoff=1.19,\n"
                      "  replay_pg_vs_handoff=0.75; 64 clients, round 1).", md)
        self.assertIn("  a fixed 2500 requests/s (half of the lower peak fresh "
                      "rate, pgbench's\n  5000.00/s: a load both sustain),", md)
        self.assertIn("| 1 | 20000.0 | 5000.0 | 4.00 | 8000.0 | 2.50 | "
                      "9500.0 | 6000.0 | 10000.0 | 0.95 | 0.60 | 1.50 | "
                      "6.00 | 0.25 |", md)
        self.assertIn("| 2 | 15000.0 | 5000.0 | 3.00 | 6000.0 | 2.50 | "
                      "9000.0 | 7000.0 | 10000.0 | 0.90 | 0.70 | 1.00 | "
                      "0.00 | nan |", md)
        self.assertIn("- fresh_vs_pair: sidecar fresh req/s / pgbench running "
                      "the pair a service\n", md)
        self.assertIn("- CPU: Test CPU, 2 cores; memory 8.0 GiB", md)
        self.assertIn("  1 8 and 64 clients; idem-bench and pgbench each use", md)
        self.assertIn("```\nfsync = on\nshared_buffers = 256MB\n```", md)
        self.assertIn("| local | 1 | 48.8 |\n| local | 64 | 70.3 |\n"
                      "| no-redis | 8 | 58.6 |\n| redis | 64 | 68.4 |\n", md)
        # The one-client rounds after the RSS table, the gateway's section
        # last (the fixture has no waiters).
        self.assertIn("| redis | 64 | 68.4 |\n\n## One call at one client\n",
                      md)
        self.assertIn("| 1 | sidecar | 500.0 | 2.000 | 4.00 | 1000.0 | 1.000 "
                      "| 2.00 | 1.000 | 2.00 | 2.00 |\n| 2 | pair | 800.0 "
                      "| 1.250 | 1.00 | 1000.0 | 1.000 | 1.00 | 0.625 | 1.25 "
                      "| 2.00 |\n", md)
        self.assertIn("- one_call_vs_pair: the mean latency of one Begin + "
                      "Complete on a new\n", md)
        self.assertEqual(report.one_call_line(self.res),
                         "ONE_CALL one_call_vs_pair=1.25 "
                         "one_call_vs_own_sql=2.00 sidecar_ms=1.250 "
                         "pair_ms=1.000 own_sql_ms=0.741")
        no_one_call = report.Results(self.res.meta, [
            r for r in self.res.runs
            if r["role"] not in ("sidecar_one_call", "pair_one_client",
                                 "fresh_sql_one_client")], [])
        self.assertEqual(report.one_call_section(no_one_call), [])
        # Then the gateway's section, then the cached replay's last.
        self.assertIn("| 1.10 | 1.50 |\n\n## HTTP gateway: replays against "
                      "the service's own answers\n", md)
        self.assertIn("| 3 | gateway | 6000.0 | 10000.0 | 0.60 | 1.00 | 1.00 "
                      "| 0.003 | 0.003 | 0.003 | 0.003 |\n", md)
        self.assertIn("| 3 | 6000.0 | 0.0 | nan | 0.0 | 0.0 | nan | 0.003 "
                      "| - | - | - |\n\n## A cached replay against the "
                      "health Check\n", md)
        self.assertTrue(md.endswith("\n".join(report.cached_section(
            self.res)) + "\n"))
        self.assertIn("- cached_replay_vs_health: Begin on one finished key, "
                      "answered from\n", md)

    def test_cached(self):
        self.assertEqual(report.cached_line(self.res),
                         "CACHED cached_replay_vs_health=0.80 "
                         "cpu_ratio=0.50 replay_rps=40000.00 "
                         "health_rps=50000.00 replay_cpu_s_per_1k=0.200 "
                         "health_cpu_s_per_1k=0.100")
        section = report.cached_section(self.res)
        self.assertEqual(section[:3], ["", "## A cached replay against the "
                                       "health Check", ""])
        self.assertIn("h2load -t 1,\n64 connections of one stream each",
                      "\n".join(section))
        # Per round: who went first, req/s, ratio, the CPU ratio (the
        # Check's ticks per call over the replay's: 0.010 / 0.020, 0.010 /
        # 0.025, 0.012 / 0.020), p99 (ms), then CPU per 1,000 calls of the
        # sidecar and of h2load (1200 ticks / 100 Hz / 120000 calls * 1000
        # = 0.100).
        self.assertEqual(report.cached_cpu_ratios(self.res),
                         ["0.50", "0.40", "0.60"])
        self.assertEqual(section[-3:], [
            "| 1 | replay | 40000.0 | 50000.0 | 0.80 | 0.50 | 3.00 | 2.00 "
            "| 0.200 | 0.100 | 0.100 | 0.100 |",
            "| 2 | health | 36000.0 | 60000.0 | 0.60 | 0.40 | 1.00 | 1.00 "
            "| 0.250 | 0.100 | 0.000 | 0.000 |",
            "| 3 | replay | 45000.0 | 50000.0 | 0.90 | 0.60 | 1.00 | 1.00 "
            "| 0.200 | 0.120 | 0.000 | 0.000 |"])
        no_cached = report.Results(self.res.meta, [
            r for r in self.res.runs
            if r["role"] not in ("cached_replay", "health_check")], [])
        self.assertEqual(report.cached_section(no_cached), [])
        self.assertIn("cached_replay_vs_health=nan ",
                      report.ratios_line(no_cached))

    def test_waiters(self):
        # Without waiters.tsv, no section (the fixture has none).
        self.assertNotIn("## Waiters on one key", self.md)
        with tempfile.TemporaryDirectory() as d:
            for name in ("meta.tsv", "runs.tsv", "rss.tsv"):
                shutil.copy(os.path.join(self.dir.name, name), d)
            with open(os.path.join(d, "meta.tsv"), "a") as f:
                f.write("waiters\t1000\n")
            with open(os.path.join(d, "waiters.tsv"), "w") as f:
                f.write("1\t4.0\t12.5\t19.0\t21.3\t3.2\n"
                        "2\t5.0\t13.5\t22.0\t24.0\t3.9\n")
            md = report.markdown(report.Results.load(d))
        self.assertIn("## Waiters on one key\n\n1000 waiting Begins", md)
        self.assertTrue(md.endswith(
            "| round | min | p50 | p99 | max | Complete took |\n"
            "|--:|--:|--:|--:|--:|--:|\n"
            "| 1 | 4.0 | 12.5 | 19.0 | 21.3 | 3.2 |\n"
            "| 2 | 5.0 | 13.5 | 22.0 | 24.0 | 3.9 |\n"), md)

    def test_tables(self):
        fresh = self.md.split("## Fresh: Begin + Complete on a new key")[1]
        fresh = fresh.split("## Replay")[0]
        rows = [l for l in fresh.splitlines() if l.startswith("| ")][1:]
        # Sorted by clients, in run order within a client count; rounds 2
        # and 3 (section "-") are in no table. CPU: ticks / 100 Hz per 1,000
        # requests (pgbench has no server column).
        self.assertEqual(rows, [
            "| pgbench fresh.sql | 1 | 1000.0 | 0.50 | 0.60 | 2.00 | 3.00 "
            "| 0 | - | 0.333 | 0.167 |",
            "| " + PAIR + " | 1 | 1200.0 | 0.50 | 0.60 | 1.00 | 2.00 "
            "| 0 | - | 0.267 | 0.133 |",
            "| sidecar fresh (redis) | 1 | 800.0 | 0.50 | 0.60 | 1.00 | "
            "2.00 | 0 | 1.250 | 0.625 | 0.250 |",
            "| sidecar fresh (no redis) | 1 | 700.0 | 0.50 | 0.60 | 1.00 | "
            "2.00 | 0 | 0.100 | 0.050 | 0.020 |",
            "| pgbench fresh.sql | 8 | 4000.0 | 0.50 | 0.60 | 1.00 | 2.00 "
            "| 0 | - | 0.333 | 0.167 |",
            "| " + PAIR + " | 8 | 4500.0 | 0.50 | 0.60 | 1.00 | 2.00 "
            "| 0 | - | 0.267 | 0.133 |",
            "| sidecar fresh (redis) | 8 | 6000.0 | 0.50 | 0.60 | 1.00 | "
            "2.00 | 0 | 1.000 | 0.500 | 0.200 |",
            "| pgbench fresh.sql | 64 | 5000.0 | 0.50 | 0.60 | 1.00 | 2.00 "
            "| 0 | - | 0.333 | 0.167 |",
            "| " + PAIR + " | 64 | 8000.0 | 0.50 | 0.60 | 1.00 | 2.00 "
            "| 0 | - | 0.267 | 0.133 |",
            "| sidecar fresh (redis) | 64 | 20000.0 | 0.50 | 0.60 | 1.00 | "
            "2.00 | 0 | 1.000 | 0.500 | 0.200 |",
        ])
        rate = self.md.split("## p99 at half of the peak fresh load")[1]
        rows = [l for l in rate.splitlines() if l.startswith("| ")][1:]
        self.assertEqual(len([r for r in rows if "--rate 2500" in r or
                              "--target-rate 2500" in r]), 2)

    def test_report_command(self):
        out = os.path.join(self.dir.name, "BENCHMARKS.md")
        import contextlib
        import io
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = report.main(["report.py", "report", self.dir.name, out])
        self.assertEqual(rc, 0)
        self.assertEqual(buf.getvalue(), report.ratios_line(self.res) + "\n")
        with open(out) as f:
            self.assertEqual(f.read(), self.md)


class PgbenchResultTest(unittest.TestCase):
    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def test_window_and_percentiles(self):
        # client tx time_us script epoch_s epoch_us [lag_us]. The first
        # transaction starts at 100.0: the window is [101.0, 103.0).
        a = self.write("log.1", "0 0 1000 0 100 1000\n"
                                "0 1 2000 0 101 500000\n"
                                "0 2 3000 0 102 0\n"
                                "1 0 4000 0 102 999999\n"
                                "1 1 5000 0 103 0\n"
                                "1 2 6000 0 100 500000\n")
        self.assertEqual(
            report.pgbench_result(1, 2, [a]),
            "RESULT throughput=1.50 p50_us=3000 p90_us=4000 p99_us=4000 "
            "p999_us=4000 errors=0 requests_total=6")
        # With --rate, the schedule lag (7th column) counts.
        b = self.write("log.2", "2 0 1000 0 102 0 500\n")
        self.assertEqual(
            report.pgbench_result(1, 2, [a, b]),
            "RESULT throughput=2.00 p50_us=2000 p90_us=4000 p99_us=4000 "
            "p999_us=4000 errors=0 requests_total=7")

    def test_failed_transaction(self):
        a = self.write("log.1", "0 0 1000 0 100 1000\n0 1 failed 0 101 0\n")
        with self.assertRaisesRegex(ValueError, "1 failed transactions"):
            report.pgbench_result(1, 2, [a])


class AbMediansTest(unittest.TestCase):
    def test_medians(self):
        lines = ["replay-redis 64 A 1000 50", "replay-redis 64 B 1300 30",
                 "replay-redis 64 A 1200 40", "replay-redis 64 B 1500 35",
                 "replay-redis 64 A 1100 45", "replay-redis 64 B 1400 32",
                 "replay-pg 8 A 100 10", "replay-pg 8 B 300 20",
                 "replay-pg 8 A 200 20", "replay-pg 8 B 400 40"]
        self.assertEqual(
            report.ab_medians(lines, ["64", "8"], ["replay-redis", "replay-pg"]),
            ["replay-redis  c=64  A    1100 req/s   45 us  B    1400 req/s"
             "   32 us  B/A 1.27 0.71",
             "replay-pg     c=8   A     150 req/s   15 us  B     350 req/s"
             "   30 us  B/A 2.33 2.00"])


if __name__ == "__main__":
    unittest.main()
