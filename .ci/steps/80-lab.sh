#!/usr/bin/env bash
# CI step: the soft-RoCE VM lab (lab/run.sh) on the pair (2 nodes x 2 cables) and mesh3 (3-node full
# mesh) topologies: perftest ib_write_bw + ib_send_lat on every cable, then `switchless doctor` in every
# VM (clean at MTU 9000); a pair at MTU 1500, where doctor must report the active_mtu 1024 trap
# (mtu-below-4200). The binaries are the debug build (`cargo build` first: a no-op after `cargo
# test --all-targets`). On pair and mesh3, `switchless bench latency` and `allreduce` run between
# the nodes through the plugin too, always (each run must show every rxe device's ptrSupport), and two
# allreduce ranks in node 1 (samehost: RoCE loopback, as NCCL connects ranks of one host with P2P/SHM off).
# About 30-90 s per lab run under TCG on 2 shared cores, plus the one-time guest kernel download.
# Needs root (apt-get, ip netns, 9p). Each lab run retries once on a guest kernel panic only; the
# MTU 1500 run injects one (LAB_INJECT_FAULT=1) and must take two rounds, and a last short run
# injects a WARNING and a failure (LAB_INJECT_FAULT=warn), which must fail with no retry.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/x86-only.sh
source lab/x86-only.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
# The debug binaries, built now (a no-op when fresh): never those of older sources.
cargo build --quiet --locked --bin switchless --lib
checks="write_bw send_lat doctor bench:latency bench:allreduce samehost:allreduce@1"
export BENCH_ARGS=${BENCH_ARGS:-"-b 8 -e 65536 -f 16 -n 5 -w 1 --timeout 60"}
bins=(--bin-dir "$CARGO_TARGET_DIR/debug")
start=$(date +%s)
for topo in pair mesh3; do
    echo "== lab $topo: $checks"
    timeout 420 lab/run.sh "${bins[@]}" --checks "$checks" --timeout 300 \
        --results "lab/.cache/results/ci-$topo" "$topo"
    if grep '"check":"doctor"' "lab/.cache/results/ci-$topo/summary.jsonl" | grep -v '"findings":\[\]'; then
        echo "FAIL: doctor reported findings on a healthy MTU 9000 lab ($topo)"; exit 1
    fi
    # rxe refuses every DMA-BUF registration (EOPNOTSUPP) although libibverbs has the symbol: the
    # plugin's per-device probe must keep NCCL_PTR_DMABUF out of ptrSupport ("ptr host").
    devs=$(cat "lab/.cache/results/ci-$topo"/node*/bench-latency.txt | grep -c '^#  dev ' || true)
    host=$(cat "lab/.cache/results/ci-$topo"/node*/bench-latency.txt | grep -c '^#  dev .*, ptr host, ' || true)
    if [ "$devs" -eq 0 ] || [ "$devs" != "$host" ]; then
        echo "FAIL: $host of $devs rxe devices report ptrSupport host only ($topo)"; exit 1
    fi
    n=$(grep -E '"check":"bench:(latency|allreduce)"' "lab/.cache/results/ci-$topo/summary.jsonl" | grep -c '"status":"pass"' || true)
    want=$(($(grep -c '"check":"doctor"' "lab/.cache/results/ci-$topo/summary.jsonl") * 2))
    if [ "$want" -eq 0 ] || [ "$n" != "$want" ]; then echo "FAIL: $n of $want bench checks passed ($topo)"; exit 1; fi
done
echo "== lab pair --mtu 1500: doctor must find the active_mtu 1024 trap (node 1 panics in round 1)"
# LAB_INJECT_FAULT=1: node 1's kernel panics in the first round: the run must say so, retry once and
# pass in the second round.
LAB_INJECT_FAULT=1 timeout 400 lab/run.sh "${bins[@]}" --mtu 1500 --checks "write_bw doctor" --timeout 240 \
    --results lab/.cache/results/ci-pair-mtu1500 pair
grep -q ' attempts=2$' lab/.cache/results/ci-pair-mtu1500/summary.txt ||
    { echo "FAIL: the injected kernel panic was not retried (attempts=2 expected)"; exit 1; }
n=$(grep '"check":"doctor"' lab/.cache/results/ci-pair-mtu1500/summary.jsonl | grep -c '"mtu-below-4200"' || true)
[ "$n" = 2 ] || { echo "FAIL: doctor flagged mtu-below-4200 on $n of 2 nodes at MTU 1500"; exit 1; }
echo "== lab pair, LAB_INJECT_FAULT=warn: a kernel WARNING with a failure is a failure, not retried"
if LAB_INJECT_FAULT=warn timeout 200 lab/run.sh "${bins[@]}" --checks "write_bw" --timeout 120 \
    --results lab/.cache/results/ci-pair-warn pair > lab/.cache/results/ci-pair-warn.log 2>&1; then
    echo "FAIL: a run whose node failed after a WARNING passed"; exit 1
fi
grep -q ' attempts=1$' lab/.cache/results/ci-pair-warn/summary.txt ||
    { echo "FAIL: a WARNING was retried as a kernel fault"; cat lab/.cache/results/ci-pair-warn.log; exit 1; }
grep -q 'kernel warning (not a fault: not retried)' lab/.cache/results/ci-pair-warn.log ||
    { echo "FAIL: the WARNING was not reported"; cat lab/.cache/results/ci-pair-warn.log; exit 1; }
echo "lab CI step passed in $(($(date +%s) - start)) s"
