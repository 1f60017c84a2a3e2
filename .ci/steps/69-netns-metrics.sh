#!/usr/bin/env bash
# The plugin's per-path metrics between two network namespaces joined by two veth links: a bench
# bandwidth run with NCCL_SWITCHLESS_METRICS_DIR, then `switchless watch --metrics-dir` whose per-path
# bytes must match the bench's own count within 1 %, Prometheus and OpenMetrics output parsed by
# prometheus_client, the init line's SHA-256 of the .so, and the plot (tests/netns/metrics.sh).
# Needs root, iproute2 and python3-prometheus-client (scripts/deps.sh); about 30 s after the build.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" -eq 0 ] || { echo "69-netns-metrics: needs root to create network namespaces" >&2; exit 1; }
timeout 300 tests/netns/metrics.sh
echo "69-netns-metrics: ok"
