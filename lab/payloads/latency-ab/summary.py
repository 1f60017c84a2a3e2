#!/usr/bin/env python3
"""Summarizes latency-ab payload results: per build, the runs' one-way min and median (µs) and
their ratios to the `ib_write_lat` run just before each (min ÷ t_min, median ÷ t_typical), as
medians over the runs, with packets per round trip and RNR NAKs/retries.
Usage: summary.py RESULTS_DIR... (lab/run.sh --results directories of latency-ab runs)."""
import re
import statistics as st
import sys
from pathlib import Path

runs = {}  # build -> list of (min, median, ratio_min, ratio_med)
pkts = {}  # build -> list of (packets per round trip, rnr, retries)
for d in sys.argv[1:]:
    wl, bench = {}, []
    for node in ("node1", "node2"):
        f = Path(d) / node / "payload.txt"
        if not f.exists():
            continue
        for line in f.read_text(errors="replace").splitlines():
            m = re.match(r"WL (\S+) t_min ([\d.]+) t_typical ([\d.]+)", line)
            if m:
                wl[m[1]] = (float(m[2]), float(m[3]))
            m = re.match(r"BENCH (\S+) build (\S+) ahead \d+ rc 0: min ([\d.]+) median ([\d.]+)", line)
            if m:
                bench.append((m[1], m[2], float(m[3]), float(m[4])))
            m = re.match(r"PKTS BENCH (\S+) build (\S+) node 1 sent (\d+) rcvd \d+ per (\d+) round "
                         r"trips .* rnr (\d+) retries (\d+)", line)
            if m:
                pkts.setdefault(m[2], []).append((int(m[3]) / int(m[4]), int(m[5]), int(m[6])))
    for tag, build, mn, med in bench:
        ref = wl.get(f"{tag}-{build.lower()}")
        if ref is None:
            continue
        runs.setdefault(build, []).append((mn, med, mn / ref[0], med / ref[1]))
print("| build | runs | min µs (median of runs) | median µs (median of runs; best) | "
      "min ÷ t_min | median ÷ t_typical | packets per round trip, node 1 | RNR NAKs; retries |")
print("|---|---|---|---|---|---|---|---|")
for b in sorted(runs):
    r = runs[b]
    p = pkts.get(b, [])
    pk = f"{min(x[0] for x in p):.2f}-{max(x[0] for x in p):.2f}" if p else "-"
    print(f"| {b} | {len(r)} | {st.median(x[0] for x in r):.0f} | {st.median(x[1] for x in r):.0f}; "
          f"{min(x[1] for x in r):.0f} | {st.median(x[2] for x in r):.2f} | "
          f"{st.median(x[3] for x in r):.2f} | {pk} | {sum(x[1] for x in p)}; {sum(x[2] for x in p)} |")
