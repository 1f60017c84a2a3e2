#!/usr/bin/env python3
"""Short report of a lab run with bench checks (used by `make demo`).

Reads a lab results directory (lab/run.sh --results DIR): the routes the plugin chose (its per-connection
INFO lines), perftest vs plugin bandwidth and latency, and whether every transfer was verified.
Exit status 1 when a check failed or a data check is missing."""
import glob
import json
import os
import re
import sys


def main(results):
    ok = True
    print(f"switchless demo report ({results})")
    print("\nRoutes chosen by the plugin (one line per connection, from NCCL_DEBUG=INFO):")
    seen = set()
    for f in sorted(glob.glob(os.path.join(results, "node*", "bench-*.txt"))):
        node = os.path.basename(os.path.dirname(f))
        for line in open(f, errors="replace"):
            m = re.search(r"NET/switchless: connected to peer .*?: (\[0\].*)$", line)
            if m:
                path = m.group(1)
                key = (node, re.sub(r"qp 0x\w+ -> 0x\w+", "", path))
                if key not in seen:
                    seen.add(key)
                    print(f"  {node}: {path}")
            m = re.search(r"NCCL chose device \d+ \((\S+) ([^)]*)\).*?; using (.*) instead", line)
            if m and (node, "override", m.group(1), m.group(3)) not in seen:
                seen.add((node, "override", m.group(1), m.group(3)))
                print(f"  {node}: NCCL's device {m.group(1)} does not reach that peer; routed over {m.group(3)}")
    perf_bw, perf_lat = [], []
    for line in open(os.path.join(results, "summary.txt"), errors="replace"):
        m = re.search(r"SUMMARY (link\d+) (write_bw|send_lat) (\{.*\})", line)
        if m:
            d = json.loads(m.group(3))
            if m.group(2) == "write_bw":
                perf_bw.append(d["bw_avg_Gbps"])
            else:
                perf_lat.append(d["t_typical_us"])

    def rank0(mode):
        p = os.path.join(results, "node1", f"bench-{mode}.json")
        return json.load(open(p)) if os.path.exists(p) else None

    print("\nBandwidth and latency (software RoCE under TCG: functional signals, not hardware figures):")
    bw = rank0("bandwidth")
    if bw and perf_bw:
        best = max(bw["rows"], key=lambda r: r["algbw_gbits_s"])
        pb = sum(perf_bw) / len(perf_bw)
        print(f"  plugin bandwidth {best['algbw_gbits_s']:.3f} Gb/s ({best['algbw_gbytes_s']:.4f} GB/s) at "
              f"{best['size_bytes']} B; ib_write_bw {pb:.3f} Gb/s per cable; ratio {best['algbw_gbits_s'] / pb:.2f}")
    lat = rank0("latency")
    if lat and perf_lat:
        small = min(lat["rows"], key=lambda r: r["size_bytes"])
        pl = sorted(perf_lat)[len(perf_lat) // 2]
        print(f"  plugin latency {small['time_us']:.0f} us one-way at {small['size_bytes']} B; "
              f"ib_send_lat {pl:.0f} us typical at 2 B; ratio {small['time_us'] / pl:.1f}")
    for mode in ("alltoall", "allreduce"):
        r = rank0(mode)
        if r:
            last = r["rows"][-1]
            print(f"  {mode}: {last['size_bytes']} B in {last['time_us']:.0f} us, busbw "
                  f"{last['busbw_gbits_s']:.3f} Gb/s ({last['busbw_gbytes_s']:.4f} GB/s)")

    plots = sorted(glob.glob(os.path.join(results, "node1", "bench-*.svg")))
    if plots:
        print("\nPlots (SVG, rate or latency vs message size; open in a browser):")
        for p in plots:
            print(f"  {p}")

    print("\nVerification:")
    nodes = sorted(glob.glob(os.path.join(results, "node*", "")))
    for mode in ("latency", "bandwidth", "alltoall", "allreduce"):
        passed = 0
        for n in nodes:
            p = os.path.join(n, f"bench-{mode}.txt")
            if os.path.exists(p) and re.search(r"data checks.* passed", open(p, errors="replace").read()):
                passed += 1
        good = passed == len(nodes) and passed > 0
        ok &= good
        print(f"  {mode}: {'PASS' if good else 'FAIL'} (every transfer checked on {passed} of {len(nodes)} nodes)")
    fails = [json.loads(l) for l in open(os.path.join(results, "summary.jsonl")) if '"status":"fail"' in l]
    for f in fails:
        ok = False
        print(f"  FAILED check: node {f['node']} {f['check']}")
    print("\nResult:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: demo_report.py RESULTS_DIR")
    sys.exit(main(sys.argv[1]))
