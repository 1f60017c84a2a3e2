#!/usr/bin/env bash
# TCP failover and failback through the plugin .so between two network namespaces joined by two veth
# links: a bench bandwidth run (data checks on) survives one link set down mid-run and uses it
# again once it is up (tests/netns/failover.sh). Needs root and iproute2; about 30 s after the build
# (minutes on a starved CPU: slow is not stalled, see the script; a stall fails it within 20 s).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" -eq 0 ] || { echo "66-netns-failover: needs root to create network namespaces" >&2; exit 1; }
timeout 330 tests/netns/failover.sh
# The same with frames lost while the carrier stays up: the streams' TCP user timeout notices.
SWL_FAILOVER_FAULT=blackhole timeout 330 tests/netns/failover.sh
echo "66-netns-failover: ok"
