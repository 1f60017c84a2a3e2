#!/usr/bin/env python3
"""Regenerates the measured part of docs/performance.md and the plots in docs/perf/ (make perf).

Every figure comes from `switchless bench ... --model SPEC` (virtual time: the same on any machine)
except the CPU table (`--cpu`: real time on this machine, release build). The page's text outside
the <!-- perf:begin --> / <!-- perf:end --> markers is kept as written.

Usage: scripts/perf.py            rebuild (release) and rewrite the page and plots
       scripts/perf.py --smoke    check that the commands work on a tiny spec (CI; no timings)
       scripts/perf.py --bin PATH use this switchless binary instead of building one
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "performance.md")
PLOTS = os.path.join(ROOT, "docs", "perf")
BEGIN, END = "<!-- perf:begin -->", "<!-- perf:end -->"

# (key, what, SPEC, --pcie)
TOPOLOGIES = [
    ("gb10", "GB10 port: its two PCIe functions (perftest figures)", "92.57G/1.2us,97.28G/1.2us", ""),
    ("cx8", "CX-8 port: 2 × 400 Gb/s", "400G/1us,400G/1us", ""),
    ("unequal", "three unequal cables: 400 + 400 + 200 Gb/s", "400G/1us,400G/1us,200G/1us", ""),
    ("eight", "8 paths: 8 × 400 Gb/s", ",".join(["400G/1us"] * 8), ""),
    ("shared", "2 × 200 Gb/s behind one 256 Gb/s PCIe root", "200G/1us@r0,200G/1us@r0", "r0=256G"),
]
SIZES = ["-b", "1024", "-e", str(16 << 20), "-f", "4"]
ITERS = ["-n", "20", "-w", "4"]


def run(binary, args):
    cmd = [binary, "bench"] + args + ["--json", "--no-progress", "--timeout", "900"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"perf: {' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    return json.loads(out.stdout)


def size_text(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def model_args(spec, pcie):
    a = ["--model", spec]
    return a + (["--pcie", pcie] if pcie else [])


def build():
    subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "switchless"], cwd=ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(target, "release", "switchless")


def smoke(binary):
    with tempfile.TemporaryDirectory() as d:
        svg = os.path.join(d, "bw.svg")
        r = run(binary, ["bandwidth"] + model_args("10G/1us,10G/2us", "") +
                ["-b", "1024", "-e", "65536", "-f", "8", "-n", "2", "-w", "1", "--plot", svg])
        assert r["efficiency"] > 0 and r["latency_us"] > 0, r
        assert open(svg).read().startswith("<svg"), "no SVG written"
        c = run(binary, ["bandwidth"] + model_args("10G,10G", "") +
                ["-b", "65536", "-e", "65536", "--cpu", "--cpu-bytes", str(1 << 24)])
        assert c["rows"][0]["cpu_s_per_gb"] > 0, c
    print("perf: smoke ok (bandwidth --model --plot, --cpu)")


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def generate(binary):
    os.makedirs(PLOTS, exist_ok=True)
    sect = []
    bw = {}
    for key, what, spec, pcie in TOPOLOGIES:
        svg = os.path.join(PLOTS, f"bandwidth-{key}.svg")
        bw[key] = run(binary, ["bandwidth"] + model_args(spec, pcie) + SIZES + ITERS + ["--plot", svg])
    sizes = [r["size_bytes"] for r in bw["gb10"]["rows"]]

    sect.append("### Bandwidth efficiency per topology and size\n")
    sect.append("Achieved / Σ modelled path rates, bandwidth mode, SIMPLE pattern (512 KiB steps, 8 in "
                "flight), RoCE v2 framing at MTU 4096 (ceiling 4096/4178 = 0.9804), payload checks on.\n")
    rows = []
    for key, what, spec, pcie in TOPOLOGIES:
        r = bw[key]
        eff = {x["size_bytes"]: x["efficiency"] for x in r["rows"]}
        rows.append([what, f"{r['model']['sum_gbits_s']:.2f}"] + [f"{eff[s]:.3f}" for s in sizes])
    sect.append(table(["topology", "Σ rates (Gb/s)"] + [size_text(s) for s in sizes], rows))
    sect.append("")
    rows = []
    for key, what, spec, pcie in TOPOLOGIES:
        r = bw[key]
        g = {x["size_bytes"]: x["algbw_gbits_s"] for x in r["rows"]}
        rows.append([what] + [f"{g[s]:.1f}" for s in sizes])
    sect.append("Achieved rate (Gb/s):\n")
    sect.append(table(["topology"] + [size_text(s) for s in sizes], rows))
    sect.append("")

    sect.append("### One-way small-message latency\n")
    sect.append("Ping-pong of 8 B messages through the protocol (half the round trip) against the modelled "
                "one-way time of one RDMA write with immediate of 8 B on the fastest path (latency + wire "
                "time of 110 B).\n")
    rows = []
    for key, what, spec, pcie in TOPOLOGIES:
        m = bw[key]["model"]
        rows.append([what, f"{m['latency_us']:.3f}", f"{m['rdma_write_us']:.3f}", f"{m['latency_ratio']:.2f}"])
    sect.append(table(["topology", "protocol (us)", "one RDMA write (us)", "ratio"], rows))
    sect.append("")

    sect.append("### Patterns at 4 MiB\n")
    rows = []
    for key in ("gb10", "cx8"):
        _, what, spec, pcie = next(t for t in TOPOLOGIES if t[0] == key)
        cells = [what]
        for pat in ("simple", "ll128", "ll", "messages"):
            r = run(binary, ["bandwidth"] + model_args(spec, pcie) +
                    ["-b", str(4 << 20), "-e", str(4 << 20), "--pattern", pat] + ITERS)
            cells.append(f"{r['efficiency']:.3f}")
        rows.append(cells)
    sect.append(table(["topology", "SIMPLE (512 KiB steps)", "LL128 (600 KiB)", "LL (64 KiB)",
                       "whole messages, 8 per timed batch"], rows))
    sect.append("")

    sect.append("### Collectives (4 ranks, full mesh of CX-8 ports)\n")
    rows = []
    spec = "400G/1us,400G/1us"
    for mode in ("alltoall", "allreduce"):
        r = run(binary, [mode, "--nranks", "4"] + model_args(spec, "") +
                ["-b", str(64 << 10), "-e", str(16 << 20), "-f", "4", "-n", "5", "-w", "1"])
        svg = None
        rows += [[mode, size_text(x["size_bytes"]), f"{x['busbw_gbits_s']:.1f}", f"{x['modelled_gbits_s']:.0f}",
                  f"{x['efficiency']:.3f}"] for x in r["rows"]]
    sect.append(table(["mode", "size", "busbw (Gb/s)", "capacity (Gb/s)", "efficiency"], rows))
    sect.append("")

    sect.append("### CPU per GB (real time, in-memory fabric, no copies)\n")
    c = run(binary, ["bandwidth", "--model", "400G,400G", "--cpu", "-b", str(64 << 10), "-e", str(4 << 20),
                     "-f", "4", "--cpu-bytes", str(4 << 30)])
    cpuinfo = machine()
    sect.append(f"One thread drives both ends of a 2-path connection (steps of at most 512 KiB, 8 in flight); "
                f"CPU from {c['cpu_clock']}; machine: {cpuinfo}. Cores for 800 Gb/s = CPU s/GB × 100 GB/s "
                f"(a host sending and receiving 800 Gb/s each way does one send side and one receive side "
                f"of work per byte).\n")
    rows = [[size_text(x["size_bytes"]), x["steps"], f"{x['gbits_s']:.1f}", f"{x['cpu_s_per_gb'] * 1e3:.3f}",
             f"{x['cores_for_target']:.3f}"] for x in c["rows"]]
    sect.append(table(["size", "steps", "one-thread rate (Gb/s)", "CPU ms per GB", "cores for 800 Gb/s"], rows))
    sect.append("")

    sect.append("### Plots\n")
    for key, what, spec, pcie in TOPOLOGIES:
        sect.append(f"![{what}](perf/bandwidth-{key}.svg)\n")
    sect.append("Trace digests (identical on every machine for the same command): " +
                ", ".join(f"{k} `{bw[k]['model']['trace_hash']}`" for k, *_ in TOPOLOGIES) + ".")
    write_page("\n".join(sect))


def machine():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                return f"{name}, {os.cpu_count()} cores (shared)"
    except OSError:
        pass
    return "unknown"


def write_page(generated):
    text = open(PAGE).read()
    if BEGIN not in text or END not in text:
        sys.exit(f"perf: {PAGE} lacks the {BEGIN} / {END} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    note = "<!-- generated by scripts/perf.py (make perf); edit the script, not this section -->\n"
    open(PAGE, "w").write(head + BEGIN + "\n" + note + generated + "\n" + END + tail)
    print(f"perf: wrote {os.path.relpath(PAGE, ROOT)} and {os.path.relpath(PLOTS, ROOT)}/")


def main():
    args = sys.argv[1:]
    binary = None
    if "--bin" in args:
        binary = args[args.index("--bin") + 1]
    if "--smoke" in args:
        if binary is None:
            subprocess.run(["cargo", "build", "--quiet", "--bin", "switchless"], cwd=ROOT, check=True)
            target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
            binary = os.path.join(target, "debug", "switchless")
        smoke(binary)
        return
    generate(binary or build())


if __name__ == "__main__":
    main()
