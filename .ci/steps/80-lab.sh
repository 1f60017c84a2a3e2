#!/usr/bin/env bash
# CI step: the soft-RoCE VM lab (lab/run.sh) on the pair (2 nodes x 2 cables) and mesh3 (3-node full
# mesh) topologies: perftest ib_write_bw + ib_send_lat on every cable, and `switchless bench` between
# the nodes once the plugin host (src/ffi/host.rs) is in the build (LAB_BENCH=1 forces it on, 0 off).
# About 40 s per topology warm under TCG on 2 cores, plus the first release build and kernel download.
# Needs root (apt-get, ip netns, 9p). Each lab run retries once on a guest-kernel fault only.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
bench=${LAB_BENCH:-auto}
if [ "$bench" = auto ]; then
    bench=0
    [ -f src/ffi/host.rs ] && grep -q '^pub mod host;' src/ffi/mod.rs && bench=1
fi
checks="write_bw send_lat"
extra=(--no-switchless)
if [ "$bench" = 1 ]; then
    checks+=" bench:latency bench:allreduce"
    extra=()
    export BENCH_ARGS=${BENCH_ARGS:-"-b 8 -e 65536 -f 16 -n 5 -w 1 --timeout 60"}
fi
start=$(date +%s)
for topo in pair mesh3; do
    echo "== lab $topo: $checks"
    timeout 420 lab/run.sh "${extra[@]}" --checks "$checks" --timeout 300 \
        --results "lab/.cache/results/ci-$topo" "$topo"
done
echo "lab CI step passed in $(($(date +%s) - start)) s"
