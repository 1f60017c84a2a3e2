#!/usr/bin/env bash
# CI step: the soft-RoCE VM lab (lab/run.sh) on the pair (2 nodes x 2 cables) and mesh3 (3-node full
# mesh) topologies: perftest ib_write_bw + ib_send_lat on every cable and, with LAB_BENCH=1,
# `switchless bench latency` and `allreduce` between the nodes through the plugin. LAB_BENCH defaults
# to 0 until the plugin has a transport backend (today its listen() says "no transport backend yet");
# then flip the default below to 1.
# About 40 s per topology warm under TCG on 2 cores, plus the first release build and kernel download.
# Needs root (apt-get, ip netns, 9p). Each lab run retries once on a guest-kernel fault only.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
bench=${LAB_BENCH:-0}
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
