#!/usr/bin/env bash
# `switchless bench` through the plugin .so over TCP paths between network namespaces (no RDMA): alltoall and
# allreduce (data verified) on a 3-node full mesh (and two ranks in one namespace: the same host over
# loopback paths) and a 4-node ring of veth /30 links, bootstrap over a
# management bridge (/24, never a data path); ring non-neighbours fail fast without
# NCCL_SWITCHLESS_TCP_FALLBACK and run with it. Needs root and iproute2. Every bench run is bounded by
# `timeout`; `timeout` caps the whole step (including the build).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" -eq 0 ] || { echo "65-netns-bench: needs root to create network namespaces" >&2; exit 1; }
timeout 900 tests/netns/bench.sh
echo "65-netns-bench: ok"
