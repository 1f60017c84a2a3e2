#!/usr/bin/env bash
# The main demo (`make demo`): `switchless doctor` on this host, then a three-node switchless mesh of
# soft-RoCE VMs (lab/run.sh mesh3: every node reaches each peer only through the cable, and /30, they
# share) moving verified data through the plugin with `switchless bench`, next to perftest on the same
# cables, and a short report: the routes chosen per pair, bandwidth and latency vs perftest, verification.
# Needs root (packages, network namespace, VMs). Exit status 0 when every check passed.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --locked
echo "== switchless doctor (this host)"
"$target/release/switchless" doctor || echo "(doctor exit status $?: see the findings above)"
results=lab/.cache/results/demo-mesh3
rm -rf "$results"
echo "== soft-RoCE lab: mesh3"
# Two virtual CPUs per VM: with one, about one boot in four saw a VM stop sending on its cables in
# the 2 MiB bursts (docs/guide/lab.md, "A VM whose cables fall silent"); with two, none in 12.
lab/run.sh --bin-dir "$target/release" --results "$results" --smp 2 \
    --checks "write_bw send_lat bench:latency bench:bandwidth bench:alltoall bench:allreduce" \
    --bench-args "-b 8 -e 2097152 -f 4 -n 10 -w 2 --timeout 120" \
    --guest-env "NCCL_DEBUG=INFO" mesh3
echo
python3 scripts/demo_report.py "$results"
