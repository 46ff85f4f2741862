#!/usr/bin/env python3
"""Unit test of bench/waiters.py (CTest: bench_waiters_test): the parts that
need no server, i.e. flags, h2load's log, the metrics page and the
percentiles."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402
import waiters  # noqa: E402


class WaitersTest(unittest.TestCase):
    def test_args(self):
        a = waiters.parse_args([])
        self.assertEqual((a.waiters, a.rounds), (1000, 3))
        with open(os.devnull, "w") as null:
            stderr, sys.stderr = sys.stderr, null
            try:
                for bad in (["--waiters", "15"], ["--waiters", "0"],
                            ["--rounds", "0"]):
                    with self.assertRaises(SystemExit):
                        waiters.parse_args(bad)
            finally:
                sys.stderr = stderr

    def test_h2load_ends(self):
        log = "1000\t200\t50\n2000\t-1\t7\n3000\t200\t5\nnoise\n"
        self.assertEqual(waiters.h2load_ends(log), ([1050, 3005], 1))

    def test_metric_sum(self):
        page = ("# HELP idem_begin_total x\n"
                'idem_begin_total{operation="a",outcome="COMPLETED"} 3\n'
                'idem_begin_total{operation="b",outcome="completed"} 4\n'
                'idem_begin_total{operation="b",outcome="ACQUIRED"} 9\n'
                "idem_waiters 500\n"
                "idem_waiters_dropped_total 2\n")
        self.assertEqual(run.metric_sum(page, "idem_begin_total",
                                        outcome="completed"), 7)
        self.assertEqual(run.metric_sum(page, "idem_waiters"), 500)
        self.assertEqual(run.metric_sum(page, "idem_missing"), 0)

    def test_percentile(self):
        values = list(range(1, 101))
        self.assertEqual(waiters.percentile(values, 0.5), 51)
        self.assertEqual(waiters.percentile(values, 0.99), 100)
        self.assertEqual(waiters.percentile([7], 0.99), 7)


if __name__ == "__main__":
    unittest.main()
