#!/usr/bin/env python3
"""Collectives through NCCL with the switchless plugin, every result checked, and the report.

One rank of the GPU self-test (gpu-selftest.sh starts two, one per network namespace):

    selftest.py run --rank R --nranks N --master HOST:PORT [--device D] [--results FILE.jsonl]
                    [--collectives LIST] [--dtypes float32,bfloat16] [--min-bytes B] [--max-bytes B]
                    [--iters N] [--bytes-per-size B]

runs all_reduce, all_gather, reduce_scatter, alltoall, broadcast and send/recv through
torch.distributed (backend nccl) for every size and dtype, compares every output element with its
exact expected value, and times the operations. The report

    selftest.py report --results FILE.jsonl... [--veth FILE.json] [--logs FILE...] [--nranks N]
                       [--plugin-name NAME] [--note KEY=VALUE...] [--markdown FILE]

merges the drivers' results (this one and nccl_selftest.cu write the same JSON lines) into one
table, checks NCCL's logs (nccllog.py) and exits 0 only when every element of every result was
right and NCCL used the plugin.

Everything above `run_rank` is pure Python (no torch), so `python3 -m unittest` runs its tests
anywhere (test_selftest.py).
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nccllog  # noqa: E402  (beside this file)

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "sendrecv")
DTYPES = {"float32": 4, "bfloat16": 2}
ROOT = 0
# An output element never written keeps this value: an integer outside the pattern's range that
# bfloat16 holds exactly (-2^10).
SENTINEL = -1024
# The pattern's values lie in [-PATTERN_HALF, PATTERN_HALF]; a sum over n ranks stays within n times
# that, and bfloat16 (8 significant bits) holds every integer up to 256 exactly: n <= 8.
PATTERN_HALF = 30
MAX_RANKS = 256 // PATTERN_HALF  # 8


def pattern(rank, i):
    """The input value of element i on a rank: an integer in [-30, 30].

    (i * 7919 + (i // 61) * 31 + rank * 17) mod 61, shifted by -30. 7919 is prime to 61, so
    consecutive elements run through every residue; the rank term makes two ranks differ at every
    element (17 * (r1 - r2) is no multiple of 61 for |r1 - r2| < 61); the i // 61 term breaks the
    period, so a block put at the wrong offset does not match by accident. nccl_selftest.cu
    computes the same values (`pattern` there).
    """
    return (i * 7919 + (i // 61) * 31 + rank * 17) % 61 - PATTERN_HALF


def layout(coll, size_bytes, elt, nranks):
    """(count, input elements, output elements, reported bytes) for one row, as nccl-tests sizes it.

    nccl-tests (src/<coll>.cu, GetCollByteCount; src/common.cu setupArgs) takes the row's size as
    the whole buffer: all_gather's output, reduce_scatter's and alltoall's input are nranks blocks
    of `count` = size / elt / nranks elements; all_reduce, broadcast and sendrecv move `count` =
    size / elt. It also rounds the block down to 16 bytes; here a block keeps at least one element
    instead, so the 8-byte rows are not empty. The reported size is what was moved, in bytes.
    """
    total = max(1, size_bytes // elt)
    if coll in ("all_gather", "reduce_scatter", "alltoall"):
        count = max(1, total // nranks)
        inp = count if coll == "all_gather" else count * nranks
        out = count if coll == "reduce_scatter" else count * nranks
        return count, inp, out, count * nranks * elt
    if coll in ("all_reduce", "broadcast", "sendrecv"):
        return total, total, total, total * elt
    raise ValueError(f"unknown collective {coll!r} (accepted: {', '.join(COLLECTIVES)})")


def input_values(coll, rank, nranks, count, root=ROOT):
    """A rank's input buffer before the operation (pure reference, for small counts)."""
    n_in = count * nranks if coll in ("reduce_scatter", "alltoall") else count
    if coll == "broadcast" and rank != root:
        return [SENTINEL] * n_in
    return [pattern(rank, i) for i in range(n_in)]


def expected_values(coll, rank, nranks, count, root=ROOT):
    """What a rank's output buffer must hold after the operation, element by element."""
    if coll == "all_reduce":
        return [sum(pattern(q, i) for q in range(nranks)) for i in range(count)]
    if coll == "all_gather":
        return [pattern(j, i) for j in range(nranks) for i in range(count)]
    if coll == "reduce_scatter":
        return [sum(pattern(q, rank * count + i) for q in range(nranks)) for i in range(count)]
    if coll == "alltoall":
        return [pattern(j, rank * count + i) for j in range(nranks) for i in range(count)]
    if coll == "broadcast":
        return [pattern(root, i) for i in range(count)]
    if coll == "sendrecv":
        # ring: every rank sends to rank + 1 and receives from rank - 1 (nccl-tests' sendrecv)
        return [pattern((rank - 1) % nranks, i) for i in range(count)]
    raise ValueError(f"unknown collective {coll!r}")


def simulate(coll, inputs, count, root=ROOT):
    """The collective's definition applied to every rank's input: the outputs, per rank.

    Independent of expected_values (it moves the inputs, it does not know the pattern), so a test
    can check that the two agree.
    """
    n = len(inputs)
    if coll == "all_reduce":
        out = [sum(inputs[q][i] for q in range(n)) for i in range(count)]
        return [list(out) for _ in range(n)]
    if coll == "all_gather":
        out = [v for q in range(n) for v in inputs[q][:count]]
        return [list(out) for _ in range(n)]
    if coll == "reduce_scatter":
        return [[sum(inputs[q][r * count + i] for q in range(n)) for i in range(count)] for r in range(n)]
    if coll == "alltoall":
        return [[inputs[q][r * count + i] for q in range(n) for i in range(count)] for r in range(n)]
    if coll == "broadcast":
        return [list(inputs[root][:count]) for _ in range(n)]
    if coll == "sendrecv":
        return [list(inputs[(r - 1) % n][:count]) for r in range(n)]
    raise ValueError(f"unknown collective {coll!r}")


def bf16_exact(v):
    """True when bfloat16 (8 significant bits) holds the integer v exactly."""
    v = abs(int(v))
    while v >= 256 and v % 2 == 0:
        v //= 2
    return v < 256


def bus_factor(coll, nranks):
    """nccl-tests' busbw / algbw (NVIDIA/nccl-tests v2.19.6, src/<coll>.cu, <Coll>GetBw).

    all_reduce 2(n-1)/n (all_reduce.cu:63); all_gather, reduce_scatter and alltoall (n-1)/n
    (all_gather.cu:42, reduce_scatter.cu:41, alltoall.cu:52); broadcast and sendrecv 1
    (broadcast.cu:38, sendrecv.cu:42).
    """
    n = float(nranks)
    if coll == "all_reduce":
        return 2.0 * (n - 1) / n
    if coll in ("all_gather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    if coll in ("broadcast", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown collective {coll!r}")


def bandwidths(coll, size_bytes, seconds, nranks):
    """(algbw, busbw) in GB/s (10^9 bytes per second), nccl-tests' definitions.

    algbw = the row's size / time per operation (the GetBw functions' baseBw: count * typesize,
    times nranks for the blocked collectives, which is the row's size); busbw = algbw * bus_factor.
    """
    if seconds <= 0:
        return 0.0, 0.0
    alg = size_bytes / 1e9 / seconds
    return alg, alg * bus_factor(coll, nranks)


def gbit(gbyte_per_s):
    """GB/s to Gb/s: 1 GB = 10^9 bytes, so exactly 8 bits per byte."""
    return gbyte_per_s * 8.0


def sizes(min_bytes, max_bytes, factor=2):
    """min, min*factor, ... up to max (bytes)."""
    if min_bytes < 1 or max_bytes < min_bytes or factor < 2:
        raise ValueError("sizes: need 1 <= min <= max and factor >= 2")
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


def iters_for(size_bytes, iters, bytes_per_size):
    """Timed iterations for one size: `iters`, fewer for big sizes (at least 2), so that one size
    moves about `bytes_per_size` and the whole run stays within minutes on a TCP path."""
    return max(2, min(iters, bytes_per_size // max(1, size_bytes)))


def parse_size(text):
    """8, 64K, 256M, 1G (powers of 1024) to bytes."""
    t = text.strip().upper()
    mult = 1
    if t[-1:] in ("K", "M", "G"):
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[t[-1]]
        t = t[:-1]
    if not t.isdigit():
        raise ValueError(f"size {text!r}: use 8, 64K, 256M or 1G")
    return int(t) * mult


def human(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def result_row(driver, coll, dtype, size_bytes, count, nranks, iters, seconds, wrong):
    """One result as both drivers write it (a JSON line)."""
    alg, bus = bandwidths(coll, size_bytes, seconds, nranks)
    return {
        "driver": driver,
        "coll": coll,
        "dtype": dtype,
        "size": size_bytes,
        "count": count,
        "nranks": nranks,
        "iters": iters,
        "time_us": seconds * 1e6,
        "algbw_gbyte_s": alg,
        "busbw_gbyte_s": bus,
        "wrong": wrong,
    }


TABLE_HEAD = (
    f"{'driver':<6} {'collective':<14} {'type':<8} {'size':>12} {'count':>10} {'iters':>5} "
    f"{'time us':>11} {'algbw GB/s':>10} {'algbw Gb/s':>10} {'busbw GB/s':>10} {'busbw Gb/s':>10} {'#wrong':>8}"
)


def format_row(r):
    return (
        f"{r['driver']:<6} {r['coll']:<14} {r['dtype']:<8} {r['size']:>12} {r['count']:>10} {r['iters']:>5} "
        f"{r['time_us']:>11.1f} {r['algbw_gbyte_s']:>10.3f} {gbit(r['algbw_gbyte_s']):>10.3f} "
        f"{r['busbw_gbyte_s']:>10.3f} {gbit(r['busbw_gbyte_s']):>10.3f} {r['wrong']:>8}"
    )


def format_table(rows):
    return "\n".join([TABLE_HEAD] + [format_row(r) for r in rows])


def largest_rows(rows):
    """Per (driver, collective, dtype): the row of the largest size."""
    best = {}
    for r in rows:
        k = (r["driver"], r["coll"], r["dtype"])
        if k not in best or r["size"] > best[k]["size"]:
            best[k] = r
    return [best[k] for k in sorted(best, key=lambda k: (k[0], COLLECTIVES.index(k[1]) if k[1] in COLLECTIVES else 99, k[2]))]


def read_jsonl(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON line: {e}") from e
    return rows


def coverage(rows, drivers, collectives, dtypes, n_sizes=None):
    """What the run was asked for but the rows lack: a (driver, collective, dtype) with no row, or
    (given n_sizes) fewer rows than sizes, as messages."""
    seen = {}
    for r in rows:
        k = (r["driver"], r["coll"], r["dtype"])
        seen[k] = seen.get(k, 0) + 1
    out = []
    for d in drivers:
        for c in collectives:
            for t in dtypes:
                got = seen.get((d, c, t), 0)
                if got == 0:
                    out.append(f"no result for {d} {c} {t} (the driver failed or was cut short)")
                elif n_sizes is not None and got < n_sizes:
                    out.append(f"{d} {c} {t}: {got} of {n_sizes} sizes (the driver stopped early)")
    return out


def veth_lines(veth):
    """The raw path's throughput, from the JSON gpu-selftest.sh writes ({"bench_gbit_s": .., ...})."""
    out = []
    if not veth:
        return out
    what = veth.get("path", "the path between the ranks")
    if veth.get("bench_gbit_s") is not None:
        out.append(
            f"switchless bench bandwidth through the plugin over {what}: {veth['bench_gbit_s']:.2f} Gb/s "
            f"= {veth['bench_gbit_s'] / 8:.3f} GB/s ({human(int(veth.get('bench_bytes', 0)))} messages, host memory)"
        )
    if veth.get("iperf3_gbit_s") is not None:
        out.append(
            f"iperf3 -P {veth.get('iperf3_streams', 1)} over {what}: {veth['iperf3_gbit_s']:.2f} Gb/s "
            f"= {veth['iperf3_gbit_s'] / 8:.3f} GB/s"
        )
    return out


def baseline_lines(rows, base_rows, plugin_name, base_name="NCCL Socket"):
    """The plugin's torch rows beside the same driver's rows over NCCL's own transport, size by size:
    time and busbw of each, and plugin busbw / baseline busbw (above 1: the plugin is faster)."""
    base = {(r["coll"], r["dtype"], r["size"]): r for r in base_rows}
    out = [
        f"{'collective':<14} {'type':<8} {'size':>10} {plugin_name + ' us':>14} {base_name + ' us':>14} "
        f"{plugin_name + ' GB/s':>16} {base_name + ' GB/s':>16} {'ratio':>6}"
    ]
    for r in rows:
        b = base.get((r["coll"], r["dtype"], r["size"]))
        if r["driver"] != "torch" or b is None:
            continue
        ratio = r["busbw_gbyte_s"] / b["busbw_gbyte_s"] if b["busbw_gbyte_s"] > 0 else float("nan")
        out.append(
            f"{r['coll']:<14} {r['dtype']:<8} {human(r['size']):>10} {r['time_us']:>14.1f} {b['time_us']:>14.1f} "
            f"{r['busbw_gbyte_s']:>16.3f} {b['busbw_gbyte_s']:>16.3f} {ratio:>6.2f}"
        )
    return out if len(out) > 1 else []


def report(results, veth, logs, nranks, plugin_name, notes, collectives, dtypes, drivers, n_sizes=None, baseline=None):
    """(text, ok): the merged table, the largest-size summary beside the raw path, the log checks, and
    (given a baseline results file) the torch rows beside NCCL's own transport."""
    rows = []
    problems = []
    for path in results:
        try:
            rows += read_jsonl(path)
        except (OSError, ValueError) as e:
            problems.append(f"results {path}: {e}")
    base_rows = []
    if baseline:
        try:
            base_rows = read_jsonl(baseline)
        except (OSError, ValueError) as e:
            problems.append(f"baseline {baseline}: {e}")
        for r in base_rows:
            if r.get("wrong", 0) != 0:
                problems.append(f"baseline {r['coll']} {r['dtype']} {r['size']} B: {r['wrong']} wrong element(s)")
    lines = []
    for k, v in notes:
        lines.append(f"{k}: {v}")
    lines.append("")
    lines.append("All sizes (GB = 10^9 bytes; Gb/s = 8 x GB/s; busbw = algbw x nccl-tests' bus factor):")
    lines.append(format_table(rows))
    lines.append("")
    raw = None
    if veth:
        raw = veth.get("iperf3_gbit_s") or veth.get("bench_gbit_s")
    lines.append("Largest size per collective, beside the raw path:")
    for r in largest_rows(rows):
        ratio = f"  busbw / raw path {gbit(r['busbw_gbyte_s']) / raw:.2f}" if raw else ""
        lines.append(
            f"  {r['driver']:<6} {r['coll']:<14} {r['dtype']:<8} {human(r['size']):>9}: busbw "
            f"{r['busbw_gbyte_s']:.3f} GB/s = {gbit(r['busbw_gbyte_s']):.2f} Gb/s{ratio}"
        )
    for v in veth_lines(veth):
        lines.append("  raw path: " + v)
    lines.append("")
    beside = baseline_lines(rows, base_rows, plugin_name)
    if beside:
        lines.append(f"Beside NCCL's own TCP transport (NCCL_NET=Socket, no plugin), same run, path and driver (torch); ratio = {plugin_name} busbw / Socket busbw:")
        lines += ["  " + x for x in beside]
        lines.append("")
    elif baseline:
        problems.append(f"baseline {baseline}: no row matches a torch row of this run")
    wrong = [r for r in rows if r.get("wrong", 0) != 0]
    for r in wrong:
        problems.append(f"{r['driver']} {r['coll']} {r['dtype']} {r['size']} B: {r['wrong']} wrong element(s)")
    problems += coverage(rows, drivers, collectives, dtypes, n_sizes)
    verdict = nccllog.check_files(logs, nranks=nranks, plugin=plugin_name)
    lines.append("NCCL logs:")
    lines += ["  " + x for x in verdict.lines()]
    problems += verdict.problems
    lines.append("")
    if problems:
        lines.append(f"result: FAIL ({len(problems)} problem(s))")
        lines += ["  - " + p for p in problems]
    else:
        lines.append(
            f"result: PASS ({len(rows)} rows, every element exact; NCCL used '{plugin_name}', ncclNet ABI "
            f"{', '.join('v' + str(a) for a in verdict.abis) or '?'})"
        )
    return "\n".join(lines), not problems


# --- the rank (needs torch and a GPU) -----------------------------------------------------------


def run_rank(a):
    import torch
    import torch.distributed as dist

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    rank, n = a.rank, a.nranks
    if not 2 <= n <= MAX_RANKS:
        raise SystemExit(f"selftest.py: --nranks {n}: 2 to {MAX_RANKS} (bfloat16 sums stay exact up to 8 ranks)")
    torch.cuda.set_device(a.device)
    dev = torch.device("cuda", a.device)

    def pattern_t(r, start, count, dtype):
        i = torch.arange(start, start + count, dtype=torch.int64, device=dev)
        return ((i * 7919 + torch.div(i, 61, rounding_mode="floor") * 31 + r * 17) % 61 - PATTERN_HALF).to(dtype)

    # The vectorised pattern is the pure one.
    probe = pattern_t(rank, 12345, 1000, torch.float32).cpu().tolist()
    if probe != [float(pattern(rank, 12345 + k)) for k in range(1000)]:
        raise SystemExit("selftest.py: the GPU pattern differs from pattern(); fix one of them")

    t0 = time.time()
    dist.init_process_group("nccl", init_method=f"tcp://{a.master}", rank=rank, world_size=n, device_id=dev)
    if rank == 0:
        print(f"selftest.py: {n} ranks, torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
              f"{torch.cuda.get_device_name(dev)}; init {time.time() - t0:.1f} s", flush=True)
        print(TABLE_HEAD, flush=True)

    def average(x):
        t = torch.tensor([x], dtype=torch.float64, device=dev)
        dist.all_reduce(t)
        return t.item() / n

    def total(x):
        t = torch.tensor([x], dtype=torch.int64, device=dev)
        dist.all_reduce(t)
        return int(t.item())

    out_f = open(a.results, "a", encoding="utf-8") if a.results and rank == 0 else None
    for dname in a.dtypes:
        dt, elt = dtypes[dname], DTYPES[dname]
        for coll in a.collectives:
            for size in sizes(a.min_bytes, a.max_bytes, 2):
                count, n_in, n_out, moved = layout(coll, size, elt, n)
                inp = torch.empty(n_in, dtype=dt, device=dev)
                out = torch.empty(n_out, dtype=dt, device=dev)

                def prepare():
                    if coll == "broadcast" and rank != ROOT:
                        inp.fill_(SENTINEL)
                    elif coll == "broadcast":
                        inp.copy_(pattern_t(ROOT, 0, n_in, dt))
                    else:
                        inp.copy_(pattern_t(rank, 0, n_in, dt))
                    out.fill_(SENTINEL)

                if coll == "all_reduce":
                    expect = sum(pattern_t(q, 0, count, torch.float32) for q in range(n)).to(dt)
                elif coll == "all_gather":
                    expect = torch.cat([pattern_t(j, 0, count, dt) for j in range(n)])
                elif coll == "reduce_scatter":
                    expect = sum(pattern_t(q, rank * count, count, torch.float32) for q in range(n)).to(dt)
                elif coll == "alltoall":
                    expect = torch.cat([pattern_t(j, rank * count, count, dt) for j in range(n)])
                elif coll == "broadcast":
                    expect = pattern_t(ROOT, 0, count, dt)
                else:
                    expect = pattern_t((rank - 1) % n, 0, count, dt)

                # all_reduce and broadcast work in place in torch: the result is in `inp`.
                def op():
                    if coll == "all_reduce":
                        dist.all_reduce(inp)
                    elif coll == "all_gather":
                        dist.all_gather_into_tensor(out, inp)
                    elif coll == "reduce_scatter":
                        dist.reduce_scatter_tensor(out, inp)
                    elif coll == "alltoall":
                        dist.all_to_all_single(out, inp)
                    elif coll == "broadcast":
                        dist.broadcast(inp, src=ROOT)
                    else:
                        ops = [dist.P2POp(dist.isend, inp, (rank + 1) % n), dist.P2POp(dist.irecv, out, (rank - 1) % n)]
                        for w in dist.batch_isend_irecv(ops):
                            w.wait()

                result = inp if coll in ("all_reduce", "broadcast") else out

                def wrong_now():
                    torch.cuda.synchronize()
                    return int((result != expect).sum().item())

                # checked once before and once after the timed loop, each from fresh buffers (the
                # in-place all_reduce changes its input every iteration)
                prepare()
                op()
                wrong = wrong_now()
                iters = iters_for(moved, a.iters, a.bytes_per_size)
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(iters):
                    op()
                torch.cuda.synchronize()
                sec = (time.perf_counter() - t) / iters
                prepare()
                op()
                wrong += wrong_now()
                sec = average(sec)
                wrong = total(wrong)
                row = result_row("torch", coll, dname, moved, count, n, iters, sec, wrong)
                if rank == 0:
                    print(format_row(row), flush=True)
                    if out_f:
                        out_f.write(json.dumps(row) + "\n")
                        out_f.flush()
                del inp, out, expect, result
    if out_f:
        out_f.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def csv_list(allowed):
    def parse(text):
        items = [x for x in text.split(",") if x]
        for x in items:
            if x not in allowed:
                raise argparse.ArgumentTypeError(f"{x!r}: accepted {', '.join(allowed)}")
        return items

    return parse


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one rank: collectives through torch.distributed, checked and timed")
    r.add_argument("--rank", type=int, required=True)
    r.add_argument("--nranks", type=int, default=2)
    r.add_argument("--master", required=True, help="rank 0's HOST:PORT for torch's TCP rendezvous")
    r.add_argument("--device", type=int, default=0)
    r.add_argument("--results", help="append rank 0's rows here as JSON lines")
    r.add_argument("--collectives", type=csv_list(COLLECTIVES), default=list(COLLECTIVES))
    r.add_argument("--dtypes", type=csv_list(tuple(DTYPES)), default=list(DTYPES))
    r.add_argument("--min-bytes", type=parse_size, default=8)
    r.add_argument("--max-bytes", type=parse_size, default=256 << 20)
    r.add_argument("--iters", type=int, default=10)
    r.add_argument("--bytes-per-size", type=parse_size, default=512 << 20)
    q = sub.add_parser("report", help="merge results, check NCCL's logs, print the verdict")
    q.add_argument("--results", nargs="*", default=[])
    q.add_argument("--veth", help="JSON with the raw path's throughput")
    q.add_argument("--logs", nargs="*", default=[])
    q.add_argument("--nranks", type=int, default=2)
    q.add_argument("--plugin-name", default="switchless")
    q.add_argument("--note", action="append", default=[], help="KEY=VALUE for the header")
    q.add_argument("--collectives", type=csv_list(COLLECTIVES), default=list(COLLECTIVES))
    q.add_argument("--dtypes", type=csv_list(tuple(DTYPES)), default=list(DTYPES))
    q.add_argument("--drivers", type=csv_list(("torch", "c")), default=["torch", "c"])
    q.add_argument("--min-bytes", type=parse_size, help="with --max-bytes: every size must have a row")
    q.add_argument("--max-bytes", type=parse_size)
    q.add_argument("--markdown", help="also write the report here")
    q.add_argument("--baseline", help="JSON lines of the torch driver over NCCL's own transport, to report beside")
    a = p.parse_args(argv)
    if a.cmd == "run":
        return run_rank(a)
    veth = None
    if a.veth and os.path.exists(a.veth):
        with open(a.veth, encoding="utf-8") as f:
            veth = json.load(f)
    notes = [tuple(x.split("=", 1)) if "=" in x else (x, "") for x in a.note]
    n_sizes = len(sizes(a.min_bytes, a.max_bytes, 2)) if a.min_bytes and a.max_bytes else None
    text, ok = report(a.results, veth, a.logs, a.nranks, a.plugin_name, notes, a.collectives, a.dtypes, a.drivers, n_sizes, a.baseline)
    print(text)
    if a.markdown:
        with open(a.markdown, "w", encoding="utf-8") as f:
            f.write("```\n" + text + "\n```\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
