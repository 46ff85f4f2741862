#!/usr/bin/env python3
"""Unit test of bench/run.py (CTest: bench_run_test): the parts that need no
server, i.e. flags, the report's command line, /proc parsing, the statement
check's counting and the flags of each contender."""

import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402


class ArgsTest(unittest.TestCase):
    def test_defaults(self):
        a = run.parse_args([])
        self.assertFalse(a.quick)
        self.assertEqual(a.build_dir, os.path.join(run.ROOT, "build-bench"))
        self.assertEqual(a.output, os.path.join(run.ROOT, "BENCHMARKS.md"))

    def test_flags(self):
        a = run.parse_args(["--quick", "--build-dir=/b", "--output", "/o.md"])
        self.assertEqual((a.quick, a.build_dir, a.output),
                         (True, "/b", "/o.md"))

    def test_gateway_only(self):
        # No report unless asked for: BENCHMARKS.md is the full run's.
        self.assertIsNone(run.parse_args(["--gateway-only"]).output)
        a = run.parse_args(["--gateway-only", "--output", "/g.md"])
        self.assertEqual((a.gateway_only, a.output), (True, "/g.md"))

    def test_one_call_only(self):
        # As --gateway-only: no report unless asked for; not both.
        a = run.parse_args(["--one-call-only", "--quick"])
        self.assertEqual((a.one_call_only, a.output), (True, None))
        self.assertFalse(run.parse_args([]).one_call_only)
        with open(os.devnull, "w") as null:
            stderr, sys.stderr = sys.stderr, null
            try:
                with self.assertRaises(SystemExit) as e:
                    run.parse_args(["--one-call-only", "--gateway-only"])
            finally:
                sys.stderr = stderr
        self.assertEqual(e.exception.code, 2)

    def test_cached_only(self):
        # As --gateway-only: no report unless asked for; excludes the others.
        a = run.parse_args(["--cached-only", "--quick"])
        self.assertEqual((a.cached_only, a.output), (True, None))
        self.assertFalse(run.parse_args([]).cached_only)
        self.assertEqual(run.parse_args(["--cached-only", "--output",
                                         "/c.md"]).output, "/c.md")
        with open(os.devnull, "w") as null:
            stderr, sys.stderr = sys.stderr, null
            try:
                for other in ("--gateway-only", "--one-call-only"):
                    with self.assertRaises(SystemExit) as e:
                        run.parse_args(["--cached-only", other])
                    self.assertEqual(e.exception.code, 2)
            finally:
                sys.stderr = stderr

    def test_unknown_flag(self):
        with open(os.devnull, "w") as null:
            stderr, sys.stderr = sys.stderr, null
            try:
                with self.assertRaises(SystemExit) as e:
                    run.parse_args(["--slow"])
            finally:
                sys.stderr = stderr
        self.assertEqual(e.exception.code, 2)

    def test_plan(self):
        self.assertEqual(run.plan(True), run.Plan([1, 8], 1, 3, 2000))
        self.assertEqual(run.plan(False), run.Plan([1, 8, 32], 3, 15, 10000))


class CommandLineTest(unittest.TestCase):
    def test_plain(self):
        self.assertEqual(run.command_line([], {}, "s", "b", "e"),
                         "bash bench/run.sh")
        self.assertEqual(run.command_line(["--quick"], {}, "s", "b", "e"),
                         "bash bench/run.sh --quick")

    def test_binaries_from_the_environment(self):
        # Named relative to the repository when they are inside it.
        self.assertEqual(
            run.command_line(["--quick"], {"IDEM_BENCH": "x"},
                             "/r/build/server/idempotency-sidecar",
                             "/r/build/bench/idem-bench", "/opt/echo",
                             root="/r"),
            "IDEM_SIDECAR=build/server/idempotency-sidecar "
            "IDEM_BENCH=build/bench/idem-bench IDEM_BENCH_ECHO=/opt/echo "
            "bash bench/run.sh --quick")


class ProcTest(unittest.TestCase):
    # pid (comm) state ppid ... utime stime cutime cstime (fields 14-17).
    STAT = ("42 (a) b (c)) S 7 42 42 0 -1 4194560 100 0 0 0 "
            "11 22 33 44 20 0 1 0 100 1000 10")

    def test_fields(self):
        f = run.stat_fields(self.STAT)
        self.assertEqual(f[:2], ["S", "7"])

    def test_ticks(self):
        self.assertEqual(run.ticks(self.STAT), 33)
        self.assertEqual(run.ticks(self.STAT, with_children=True), 110)

    def test_own_process(self):
        self.assertGreaterEqual(run.proc_ticks(os.getpid()), 0)

    def test_children_of(self):
        child = subprocess.Popen(["sleep", "5"])
        try:
            self.assertIn(child.pid, run.children_of(os.getpid()))
        finally:
            child.kill()
            child.wait()

    def test_free_port(self):
        a, b = run.free_port(), run.free_port()
        self.assertNotEqual(a, b)
        self.assertGreaterEqual(min(a, b), 10000)


class StatementsTest(unittest.TestCase):
    def test_per_request(self):
        # 20 requests: 40 calls is twice per request, 10 rounds to once,
        # 9 (under half a call per request) is left out.
        rows = [(40, "SELECT b"), (10, "SELECT a"), (9, "SELECT c"),
                (29, "UPDATE x")]
        self.assertEqual(run.per_request(rows, 20),
                         ["1\tSELECT a", "1\tUPDATE x", "2\tSELECT b"])


class ContenderTest(unittest.TestCase):
    def test_sidecar_flags(self):
        r = "127.0.0.1:6379"
        k = "/tmp/key"
        mac = ["--redis-mac-key-file", k]
        self.assertEqual(run.sidecar_flags("local", r, k), ["--redis", r] + mac)
        self.assertEqual(run.sidecar_flags("redis", r, k),
                         ["--redis", r] + mac + ["--local-cache-mib", "0"])
        self.assertEqual(run.sidecar_flags("no-redis", r, k),
                         ["--local-cache-mib", "0"])
        self.assertEqual(run.sidecar_flags("verify", r, k),
                         ["--local-cache-mib", "0"])
        self.assertEqual(run.sidecar_flags("unbatched", r, k),
                         ["--local-cache-mib", "0", "--pg-max-batch", "1"])
        self.assertEqual(run.sidecar_flags("default", r, k), [])
        self.assertEqual(run.sidecar_flags("gateway", r, k), [])
        self.assertEqual(run.sidecar_flags("cached", r, k), [])

    H2LOAD = """starting benchmark...
spawning thread #0: 64 total client(s). Timing-based test with 0s of \
warm-up time and 3s of main duration for measurements.
Main benchmark duration is started for client #0.

finished in 3.00s, 12345.67 req/s, 2.10MB/s
requests: 37037 total, 37101 started, 37037 done, 37037 succeeded, \
0 failed, 0 errored, 0 timeout
status codes: 37037 2xx, 0 3xx, 0 4xx, 0 5xx
"""

    def test_h2load_result(self):
        log = "".join("1700000000%06d\t201\t%d\n" % (i, 100 + i)
                      for i in range(1000))
        self.assertEqual(
            run.h2load_result(self.H2LOAD, log),
            "RESULT throughput=12345.67 p50_us=600 p90_us=1000 p99_us=1090 "
            "p999_us=1099 errors=0 requests_total=37037")
        # Another status than the replayed 201 is an error, as are
        # h2load's own failures.
        self.assertIn("errors=1 ", run.h2load_result(
            self.H2LOAD, log + "1\t409\t5\n"))
        failed = self.H2LOAD.replace("0 failed, 0 errored, 0 timeout",
                                     "2 failed, 1 errored, 3 timeout")
        self.assertIn("errors=6 ", run.h2load_result(failed, log))
        with self.assertRaises(ValueError):
            run.h2load_result("connect failed\n", "")

    def test_pgbench_vars(self):
        v = run.pgbench_vars(b"\x01\xfe", 2000)
        self.assertEqual(v[0::2], ["-D"] * 11)
        d = dict(kv.split("=", 1) for kv in v[1::2])
        self.assertEqual(d["operation"], "bench-pgbench")
        self.assertEqual(d["hash"], "\\x" + "ab" * 32)
        self.assertEqual(d["body"], "\\x01fe")
        self.assertEqual(d["pool"], "2000")
        self.assertEqual(d["headers"], "{}")

    def test_scripts_use_only_defined_variables(self):
        # Every :variable of bench/sql/*.sql is a -D of pgbench_vars or a
        # \set of the script (pgbench would stop on an undefined one only
        # once the run is under way).
        defined = {kv.split("=", 1)[0]
                   for kv in run.pgbench_vars(b"", 1)[1::2]}
        sql_dir = os.path.join(run.ROOT, "bench", "sql")
        scripts = sorted(os.listdir(sql_dir))
        self.assertIn("pair.sql", scripts)
        for name in scripts:
            with open(os.path.join(sql_dir, name)) as f:
                lines = [l for l in f.read().splitlines()
                         if not l.startswith("--")]
            sets = {l.split()[1] for l in lines if l.startswith("\\set ")}
            text = "\n".join(lines)
            used = set(re.findall(r"(?<![:\w]):([a-z_]+)", text))
            self.assertEqual(used - defined - sets, set(), name)

    def test_proto_field1(self):
        # BeginResponse{outcome: COMPLETED, record: {...}}: field 1 first.
        self.assertEqual(run.proto_field1(b"\x08\x03\x12\x02\x0a\x00"), 3)
        # Field 1 after other fields (varint, 64-bit, bytes, 32-bit) and a
        # multi-byte varint.
        self.assertEqual(run.proto_field1(
            b"\x10\x96\x01\x19" + b"\0" * 8 + b"\x22\x01x\x2d" + b"\0" * 4 +
            b"\x08\xac\x02"), 300)
        # Absent: proto3's zero (an empty HealthCheckResponse is UNKNOWN).
        self.assertEqual(run.proto_field1(b""), 0)
        for bad in (b"\x08", b"\x12\x05ab", b"\x0b"):
            with self.assertRaises(ValueError):
                run.proto_field1(bad)

    def test_grpc_answer(self):
        verbose = (
            "[  0.001] recv (stream_id=13) :status: 200\n"
            "[  0.001] recv (stream_id=13) content-type: application/grpc\n"
            "[  0.002] recv DATA frame <length=7, flags=0x00, "
            "stream_id=13>\n"
            "[  0.002] recv (stream_id=13) grpc-status: 0\n")
        # A HealthCheckResponse{status: SERVING} in one gRPC message.
        serving = b"\0\0\0\0\x02\x08\x01"
        self.assertEqual(run.grpc_answer(verbose, serving), (0, 1))
        # A gRPC error arrives as HTTP 200 with no message.
        failed = verbose.replace("grpc-status: 0", "grpc-status: 5")
        self.assertEqual(run.grpc_answer(failed, b""), (5, None))
        self.assertEqual(run.grpc_answer("", serving), (None, 1))
        # A length that does not match, a compressed message, garbage.
        for body in (b"\0\0\0\0\x03\x08\x01", b"\x01\0\0\0\x02\x08\x01",
                     b"\0\0\0\0\x01\x0b"):
            self.assertEqual(run.grpc_answer(verbose, body), (0, None))

    def test_newest_pg_bindir(self):
        self.assertEqual(run.newest_pg_bindir(
            ["/p/9.6/bin", "/p/15/bin", "/p/13/bin"]), "/p/15/bin")
        self.assertIsNone(run.newest_pg_bindir([]))

    def test_last_result(self):
        self.assertEqual(run.last_result("table\nRESULT a=1\nRESULT a=2\n"),
                         "RESULT a=2")
        self.assertEqual(run.last_result("no result\n"), "")


if __name__ == "__main__":
    unittest.main()
