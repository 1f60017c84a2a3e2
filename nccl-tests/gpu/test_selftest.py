#!/usr/bin/env python3
"""Tests of the GPU self-test's pure parts, without torch or a GPU:

* the expected values are what the collectives' definitions give (selftest.simulate), for 2..8
  ranks, and every value involved is exact in bfloat16;
* the layout and bus factors are nccl-tests' (sizes, counts, busbw for 2, 4 and 8 ranks);
* the table and the report (PASS only with every element right and NCCL's logs showing the plugin);
* nccllog against log lines built from NCCL's format strings (cited in nccllog.py);
* selftest.run_rank itself, two ranks as threads over fake_torch.py (every row right; a swapped
  alltoall block caught);
* with NCCL_SELFTEST_HOST_BIN set (the host-only build of nccl_selftest.cu against stub/), the C
  driver's pattern, inputs and expected values equal these.

    python3 -m unittest discover -s nccl-tests/gpu -p 'test_*.py'
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nccllog  # noqa: E402
import selftest as st  # noqa: E402


class Values(unittest.TestCase):
    def test_expected_matches_the_definitions(self):
        for n in range(2, st.MAX_RANKS + 1):
            for count in (1, 2, 5, 64):
                for coll in st.COLLECTIVES:
                    inputs = [st.input_values(coll, r, n, count) for r in range(n)]
                    got = st.simulate(coll, inputs, count)
                    for r in range(n):
                        self.assertEqual(got[r], st.expected_values(coll, r, n, count), (coll, n, count, r))

    def test_every_value_is_exact_in_bf16(self):
        for n in (2, st.MAX_RANKS):
            for coll in st.COLLECTIVES:
                for r in range(n):
                    vals = st.input_values(coll, r, n, 200) + st.expected_values(coll, r, n, 200)
                    self.assertTrue(all(st.bf16_exact(v) for v in vals), (coll, n, r))
        self.assertTrue(st.bf16_exact(st.SENTINEL))
        self.assertTrue(st.bf16_exact(240) and st.bf16_exact(-256) and st.bf16_exact(512))
        self.assertFalse(st.bf16_exact(257) or st.bf16_exact(1023))

    def test_sentinel_is_never_a_value(self):
        vals = {st.pattern(r, i) for r in range(8) for i in range(5000)}
        self.assertEqual(vals, set(range(-30, 31)))
        self.assertNotIn(st.SENTINEL, vals)
        for n in range(2, st.MAX_RANKS + 1):
            self.assertLess(n * st.PATTERN_HALF, abs(st.SENTINEL))

    def test_ranks_differ_everywhere_and_shifted_blocks_do_not_match(self):
        for i in range(3000):
            self.assertNotEqual(st.pattern(0, i), st.pattern(1, i))
        # a block from the wrong offset (alltoall/reduce_scatter/all_gather bugs) does not pass
        for count in (1024, 4096, 1 << 20):
            a = [st.pattern(1, i) for i in range(count, count + 512)]
            b = [st.pattern(1, i) for i in range(512)]
            self.assertNotEqual(a, b)

    def test_a_wrong_block_is_caught(self):
        n, count = 2, 8
        inputs = [st.input_values("alltoall", r, n, count) for r in range(n)]
        out = st.simulate("alltoall", inputs, count)
        out[0][0:count], out[0][count:] = out[0][count:], out[0][0:count]  # blocks swapped
        self.assertNotEqual(out[0], st.expected_values("alltoall", 0, n, count))


class Sizes(unittest.TestCase):
    def test_layout_follows_nccl_tests(self):
        mib = 1 << 20
        self.assertEqual(st.layout("all_reduce", 256 * mib, 4, 2), (64 * mib, 64 * mib, 64 * mib, 256 * mib))
        self.assertEqual(st.layout("all_gather", 256 * mib, 4, 2), (32 * mib, 32 * mib, 64 * mib, 256 * mib))
        self.assertEqual(st.layout("reduce_scatter", 256 * mib, 2, 4), (32 * mib, 128 * mib, 32 * mib, 256 * mib))
        self.assertEqual(st.layout("alltoall", 1024, 4, 2), (128, 256, 256, 1024))
        self.assertEqual(st.layout("broadcast", 8, 2, 2), (4, 4, 4, 8))
        self.assertEqual(st.layout("sendrecv", 8, 4, 2), (2, 2, 2, 8))
        # never an empty row: 8 B of float32 over 4 ranks is one element per block
        self.assertEqual(st.layout("all_gather", 8, 4, 4), (1, 1, 4, 16))
        with self.assertRaises(ValueError):
            st.layout("reduce", 8, 4, 2)

    def test_bus_factors(self):
        self.assertEqual(st.bus_factor("all_reduce", 2), 1.0)
        self.assertEqual(st.bus_factor("all_reduce", 8), 1.75)
        for c in ("all_gather", "reduce_scatter", "alltoall"):
            self.assertEqual(st.bus_factor(c, 2), 0.5)
            self.assertEqual(st.bus_factor(c, 4), 0.75)
        for c in ("broadcast", "sendrecv"):
            self.assertEqual(st.bus_factor(c, 8), 1.0)

    def test_bandwidths_and_units(self):
        alg, bus = st.bandwidths("all_reduce", 1_000_000_000, 0.5, 4)
        self.assertAlmostEqual(alg, 2.0)
        self.assertAlmostEqual(bus, 3.0)
        self.assertAlmostEqual(st.gbit(bus), 24.0)
        self.assertEqual(st.bandwidths("sendrecv", 8, 0.0, 2), (0.0, 0.0))

    def test_sizes_and_iterations(self):
        s = st.sizes(8, 256 << 20)
        self.assertEqual((s[0], s[-1], len(s)), (8, 256 << 20, 26))
        self.assertEqual(st.iters_for(8, 10, 1 << 30), 10)
        self.assertEqual(st.iters_for(256 << 20, 10, 1 << 30), 4)
        self.assertEqual(st.iters_for(1 << 30, 10, 1 << 30), 2)
        self.assertEqual(st.parse_size("256M"), 256 << 20)
        self.assertEqual(st.parse_size("8"), 8)
        self.assertEqual(st.parse_size("64K"), 64 << 10)
        with self.assertRaises(ValueError):
            st.parse_size("1T")


def log_line(msg, pid=100, level="INFO"):
    if level == "WARN":
        return f"gpu:{pid}:{pid + 1} [0] transport/net.cc:1 (f) NCCL WARN {msg}\n"
    return f"gpu:{pid}:{pid + 1} [0] NCCL INFO {msg}\n"


def good_log(rank, version="2.28.9", abi=11, nranks=2):
    """What NCCL at INFO with INIT,NET writes when the plugin carries a 2-rank communicator."""
    lines = [
        f"NCCL version {version}+cuda13.0",
        "NCCL_NET_PLUGIN set by environment to /w/libnccl-net-switchless.so",
        f"NET/Plugin: Loaded net plugin switchless (v{abi})",
        "Successfully loaded external network plugin /w/libnccl-net-switchless.so",
        "Assigned NET plugin switchless to comm",
        "Using network switchless",
        f"comm 0x5555 rank {rank} nRanks {nranks} nNodes {nranks} localRanks 1 localRank 0 MNNVL 0",
        f"Channel 00/0 : {rank}[0] -> {1 - rank}[0] [send] via NET/switchless/0",
        f"Channel 00/0 : {1 - rank}[0] -> {rank}[0] [receive] via NET/switchless/0",
        # the plugin's route lines as `switchless bench` logged them over the veth (gpu-selftest.sh --no-gpu)
        "NET/switchless: TCP path tcp0 cable0 10.203.0.1 -> 10.203.0.2 (4 streams, MTU 9000 bytes) (connector): "
        "speed 10000 Mb/s, frame 524288 bytes",
        "NET/switchless: connected to peer 10.203.0.2/30 (port 38761) on NCCL device 0 (sl_cable0), 1 path(s), "
        "tcp 10.203.0.1:37397 -> 10.203.0.2:38761: [0] cable0 tcp 10.203.0.1/30 -> 10.203.0.2 gid 0 root  mtu 9000 qp - -> -",
        "NET/switchless: accepted from connector 10.203.0.2 on NCCL device 0 (sl_cable0), 1 path(s), "
        "tcp 10.203.0.1:41687 <- 10.203.0.2:56459: [0] cable0 tcp 10.203.0.1/30 -> 10.203.0.2 gid 0 root  mtu 9000 qp - -> -",
    ]
    return "".join(log_line(m, pid=100 + rank) for m in lines)


class Logs(unittest.TestCase):
    def check(self, texts, nranks=2):
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for i, t in enumerate(texts):
                p = os.path.join(d, f"nccl.{i}.log")
                with open(p, "w") as f:
                    f.write(t)
                paths.append(p)
            return nccllog.check_files(paths, nranks=nranks)

    def test_plugin_used(self):
        v = self.check([good_log(0), good_log(1)])
        self.assertEqual(v.problems, [])
        self.assertEqual(v.abis, [11])
        self.assertEqual(v.versions, [(2, 28, 9)])

    def test_nccl_230_takes_v12(self):
        self.assertEqual(self.check([good_log(0, "2.30.7", 12)]).problems, [])
        v = self.check([good_log(0, "2.30.7", 11)])
        self.assertTrue(any("expected v12" in p for p in v.problems), v.problems)

    def test_fallback_to_socket_fails(self):
        text = good_log(0).replace("Using network switchless", "Using network Socket")
        v = self.check([text])
        self.assertTrue(any("instead of 'switchless'" in p for p in v.problems), v.problems)

    def test_not_loaded(self):
        text = "".join(
            log_line(m)
            for m in (
                "NCCL version 2.28.9+cuda13.0",
                "NET/Plugin: /w/libnccl-net-switchless.so: libibverbs.so.1: cannot open shared object file: No such file or directory",
                "NET/Plugin: Could not find: /w/libnccl-net-switchless.so libnccl-net-/w/libnccl-net-switchless.so.so.",
            )
        ) + log_line("Failed to initialize any NET plugin", level="WARN")
        v = self.check([text])
        self.assertTrue(any("never loaded" in p and "libibverbs" in p for p in v.problems), v.problems)
        self.assertTrue(any("Using network" in p for p in v.problems))

    def test_one_node_means_no_network(self):
        text = good_log(0).replace("nNodes 2", "nNodes 1")
        v = self.check([text])
        self.assertTrue(any("NCCL_HOSTID" in p for p in v.problems), v.problems)

    def test_route_lines_and_channels_required(self):
        text = "".join(line for line in good_log(0).splitlines(True) if "NET/switchless:" not in line)
        v = self.check([text])
        self.assertTrue(any("connected to" in p for p in v.problems))
        self.assertTrue(any("accepted from" in p for p in v.problems))
        text = "".join(line for line in good_log(0).splitlines(True) if "[receive]" not in line)
        self.assertTrue(any("[receive]" in p for p in self.check([text]).problems))

    def test_empty_and_missing(self):
        self.assertTrue(self.check([""]).problems)
        self.assertTrue(nccllog.check_files([], 2).problems)
        self.assertTrue(nccllog.check_files(["/nonexistent/x.log"], 2).problems)

    def test_timestamps_and_warn_format(self):
        text = "".join("[2026-11-18 10:00:00] " + line for line in good_log(0).splitlines(True))
        self.assertEqual(self.check([text]).problems, [])


class Report(unittest.TestCase):
    def write(self, d, name, rows):
        p = os.path.join(d, name)
        with open(p, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        return p

    def rows(self, driver, wrong=0):
        out = []
        for coll in st.COLLECTIVES:
            for dt, elt in st.DTYPES.items():
                for size in (8, 1 << 20):
                    count, _, _, moved = st.layout(coll, size, elt, 2)
                    out.append(st.result_row(driver, coll, dt, moved, count, 2, 4, 1e-3, wrong))
        return out

    def run_report(self, rows_by_driver, logs):
        with tempfile.TemporaryDirectory() as d:
            results = [self.write(d, f"{k}.jsonl", v) for k, v in rows_by_driver.items()]
            lp = []
            for i, t in enumerate(logs):
                p = os.path.join(d, f"nccl.{i}.log")
                with open(p, "w") as f:
                    f.write(t)
                lp.append(p)
            veth = {"path": "veth cable0 (10.203.0.1/30 - 10.203.0.2/30)", "bench_gbit_s": 20.0, "bench_bytes": 16 << 20}
            return st.report(results, veth, lp, 2, "switchless", [("mode", "netns")], list(st.COLLECTIVES), list(st.DTYPES), list(rows_by_driver))

    def test_pass(self):
        text, ok = self.run_report({"torch": self.rows("torch"), "c": self.rows("c")}, [good_log(0), good_log(1)])
        self.assertTrue(ok, text)
        self.assertIn("result: PASS", text)
        self.assertIn("busbw / raw path", text)
        self.assertIn("20.00 Gb/s", text)
        # 1 MiB in 1 ms: algbw 1.049 GB/s = 8.389 Gb/s in the table
        self.assertIn("1.049", text)
        self.assertIn("8.389", text)

    def test_wrong_elements_fail(self):
        text, ok = self.run_report({"torch": self.rows("torch", wrong=3)}, [good_log(0), good_log(1)])
        self.assertFalse(ok)
        self.assertIn("3 wrong element(s)", text)

    def test_missing_rows_fail(self):
        rows = [r for r in self.rows("torch") if r["coll"] != "sendrecv"]
        text, ok = self.run_report({"torch": rows}, [good_log(0), good_log(1)])
        self.assertFalse(ok)
        self.assertIn("no result for torch sendrecv float32", text)

    def test_a_driver_cut_short_fails(self):
        rows = self.rows("torch")
        self.assertEqual(st.coverage(rows, ["torch"], st.COLLECTIVES, st.DTYPES, 2), [])
        cut = rows[:-1]  # the last size of the last (collective, dtype) is missing
        self.assertEqual(st.coverage(cut, ["torch"], st.COLLECTIVES, st.DTYPES, 2), ["torch sendrecv bfloat16: 1 of 2 sizes (the driver stopped early)"])

    def test_plugin_not_used_fails(self):
        bad = good_log(0).replace("Using network switchless", "Using network Socket")
        text, ok = self.run_report({"torch": self.rows("torch")}, [bad, good_log(1)])
        self.assertFalse(ok)
        self.assertIn("result: FAIL", text)

    def logs(self, d):
        out = []
        for i, t in enumerate([good_log(0), good_log(1)]):
            out.append(os.path.join(d, f"nccl.{i}.log"))
            with open(out[-1], "w") as f:
                f.write(t)
        return out

    def test_baseline_beside_the_plugin(self):
        base = [dict(r, time_us=r["time_us"] * 2, busbw_gbyte_s=r["busbw_gbyte_s"] / 2) for r in self.rows("torch")]
        with tempfile.TemporaryDirectory() as d:
            bp = self.write(d, "base.jsonl", base)
            res = [self.write(d, "torch.jsonl", self.rows("torch"))]
            text, ok = st.report(res, None, self.logs(d), 2, "switchless", [], list(st.COLLECTIVES), list(st.DTYPES), ["torch"], None, bp)
        self.assertTrue(ok, text)
        # every torch row has its baseline: twice as slow there, so each ratio is 2.00
        beside = text.split("Beside NCCL's own TCP transport")[1].split("\n\n")[0].splitlines()[2:]
        self.assertEqual(len(beside), len(self.rows("torch")))
        self.assertTrue(all(x.endswith(" 2.00") for x in beside), beside)

    def test_a_baseline_with_wrong_elements_or_no_match_fails(self):
        with tempfile.TemporaryDirectory() as d:
            bad = self.write(d, "bad.jsonl", self.rows("torch", wrong=1))
            other = self.write(d, "other.jsonl", [dict(r, size=r["size"] + 1) for r in self.rows("torch")])
            res = [self.write(d, "torch.jsonl", self.rows("torch"))]
            args = (res, None, self.logs(d), 2, "switchless", [], list(st.COLLECTIVES), list(st.DTYPES), ["torch"], None)
            text, ok = st.report(*args, bad)
            self.assertFalse(ok)
            self.assertIn("baseline all_reduce float32 8 B: 1 wrong element(s)", text)
            text, ok = st.report(*args, other)
            self.assertFalse(ok)
            self.assertIn("no row matches a torch row", text)

    def test_table_format(self):
        row = st.result_row("c", "all_reduce", "bfloat16", 1 << 20, 1 << 19, 2, 10, 0.001, 0)
        line = st.format_row(row)
        self.assertEqual(len(line.split()), len(st.TABLE_HEAD.replace("time us", "time_us").replace(" GB/s", "_GB/s").replace(" Gb/s", "_Gb/s").split()))
        self.assertIn("all_reduce", line)


class Driver(unittest.TestCase):
    """selftest.run_rank itself, two ranks as threads over fake_torch (lists, no GPU, no NCCL)."""

    def run_driver(self, fault=None, dtypes=("float32", "bfloat16")):
        import argparse
        import contextlib
        import io
        import threading

        import fake_torch

        fake_torch.install(2, fault)
        errors = []
        with tempfile.TemporaryDirectory() as d:
            results = os.path.join(d, "r.jsonl")

            def rank(r):
                a = argparse.Namespace(rank=r, nranks=2, master="x:1", device=0, results=results,
                                       collectives=list(st.COLLECTIVES), dtypes=list(dtypes),
                                       min_bytes=8, max_bytes=2048, iters=3, bytes_per_size=4096)
                try:
                    st.run_rank(a)
                except BaseException as e:  # noqa: B036 (reported below)
                    errors.append(f"rank {r}: {e!r}")
                    fake_torch._world.barrier.abort()

            printed = io.StringIO()
            try:
                with contextlib.redirect_stdout(printed):
                    ts = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
                    for t in ts:
                        t.start()
                    for t in ts:
                        t.join(120)
            finally:
                fake_torch.uninstall()
            self.assertEqual(errors, [])
            return st.read_jsonl(results), printed.getvalue()

    def test_every_row_right(self):
        rows, printed = self.run_driver()
        self.assertEqual(len(rows), 6 * 2 * len(st.sizes(8, 2048)))
        self.assertEqual([r for r in rows if r["wrong"] != 0], [])
        self.assertEqual(st.coverage(rows, ["torch"], st.COLLECTIVES, st.DTYPES, len(st.sizes(8, 2048))), [])
        for r in rows:
            count, _, _, moved = st.layout(r["coll"], r["size"], st.DTYPES[r["dtype"]], 2)
            self.assertEqual((r["count"], r["size"]), (count, moved), r)
            self.assertGreaterEqual(r["iters"], 2)
        self.assertIn(st.TABLE_HEAD, printed)

    def test_a_wrong_alltoall_is_caught(self):
        rows, _ = self.run_driver(fault="alltoall", dtypes=("float32",))
        bad = {r["coll"] for r in rows if r["wrong"] != 0}
        self.assertEqual(bad, {"alltoall"})


@unittest.skipUnless(os.environ.get("NCCL_SELFTEST_HOST_BIN"), "NCCL_SELFTEST_HOST_BIN unset (host build of nccl_selftest.cu)")
class CDriver(unittest.TestCase):
    def run_bin(self, *args):
        return subprocess.run([os.environ["NCCL_SELFTEST_HOST_BIN"], *map(str, args)], check=True, capture_output=True, text=True).stdout

    def test_pattern(self):
        for r in (0, 1, 7):
            got = [int(x) for x in self.run_bin("--print-pattern", r, 1000, 500).split()]
            self.assertEqual(got, [st.pattern(r, 1000 + i) for i in range(500)])

    def test_inputs_and_expected(self):
        for n in (2, 3, 8):
            for coll in st.COLLECTIVES:
                for r in range(n):
                    out = self.run_bin("--print-expected", coll, r, n, 7).splitlines()
                    self.assertEqual([int(x) for x in out[0].split()[1:]], st.input_values(coll, r, n, 7), (coll, n, r))
                    self.assertEqual([int(x) for x in out[1].split()[1:]], st.expected_values(coll, r, n, 7), (coll, n, r))


if __name__ == "__main__":
    unittest.main()
