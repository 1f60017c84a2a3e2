#!/usr/bin/env bash
# CI step (core): the plugin end to end over real verbs. `switchless bench` (dlopens the plugin like
# NCCL's proxy) in the soft-RoCE VM lab: pair (2 nodes x 2 cables) with every bench mode, then mesh3
# (3-node full mesh: each peer reachable only over its own /30) with alltoall and allreduce. Every
# mode checks the received data. ~25 s (pair) + ~60 s (mesh3) under TCG on 2 shared cores, plus the
# release build; then the stripe3 topology (~30 s). Needs root (apt-get, ip netns, 9p), like 80-lab.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/x86-only.sh
source lab/x86-only.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
# The release binaries lab/run.sh uses, built now (a no-op when fresh): never those of older sources.
cargo build --quiet --locked --release --bin switchless --lib
args="-e 1048576 -n 10 -w 2 --timeout 120"
start=$(date +%s)
timeout 420 lab/run.sh --checks "bench:latency bench:bandwidth bench:alltoall bench:allreduce" \
    --bench-args "$args" --timeout 360 --results lab/.cache/results/ci-core-pair pair
timeout 420 lab/run.sh --checks "bench:alltoall bench:allreduce" \
    --bench-args "$args" --timeout 360 --results lab/.cache/results/ci-core-mesh3 mesh3
# Multi-path striping over real verbs: with --dev 2 NCCL's device cannot reach the peer, so each
# connection between nodes 1 and 2 is routed over both cables between them (two QPs, striped).
timeout 420 lab/run.sh --checks "bench:latency bench:bandwidth" --guest-env "NCCL_DEBUG=INFO" \
    --bench-args "--dev 2 $args" --timeout 360 --results lab/.cache/results/ci-core-stripe3 \
    .ci/steps/core-stripe3.topo
grep -q "2 path(s)" lab/.cache/results/ci-core-stripe3/node1/bench-bandwidth.txt || {
    echo "stripe3: node 1's connections did not use 2 paths"; exit 1; }
echo "core CI step passed in $(($(date +%s) - start)) s"
