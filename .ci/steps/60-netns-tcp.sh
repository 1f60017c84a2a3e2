#!/usr/bin/env bash
# TCP paths between network namespaces: the transport protocol over TcpFabric on every link of a 3-node
# full mesh and of a 4-node ring of veth pairs (MTU 9000, one /30 per link), both directions, data
# verified; ring non-neighbours must fail fast with a no-route error. Needs root and iproute2. Bounded:
# the script's own runs take a few seconds; `timeout` caps the whole step (including the release build).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" -eq 0 ] || { echo "60-netns-tcp: needs root to create network namespaces" >&2; exit 1; }
timeout 900 tests/netns/mesh.sh
echo "60-netns-tcp: ok"
