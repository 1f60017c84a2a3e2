#!/usr/bin/env bash
# Relay paths between network namespaces (issue 30, tests/netns/relay.sh): four hosts in a ring of
# veth /30 links, ip_forward off, no TCP fallback, a management bridge for the bootstrap only.
# `bench alltoall --nranks 4` reaches each diagonal peer through its neighbours' relay services with
# verified data while the bridge's byte counters stay under 1 % of the diagonal payload;
# NCCL_SWITCHLESS_RELAY=off makes the diagonal fail fast; a relay host killed mid-transfer fails
# the path over to the other relay (or fails naming the relay), without a hang. Then the mesh policy
# (tests/netns/meshrelay.sh): four hosts in a full mesh, `bench allreduce --nranks 4` with NCCL's
# connect-time hints gets relay paths and puts bytes on the diagonal cables, `--net-attr none`,
# NCCL_SWITCHLESS_RELAY=off and an alltoall get none. Then a ring of six (tests/netns/ring6.sh): the
# opposite hosts connect through chains of two relays. Needs root and iproute2; about three
# minutes after the build.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" -eq 0 ] || { echo "71-netns-relay: needs root to create network namespaces" >&2; exit 1; }
timeout 240 tests/netns/relay.sh
timeout 240 tests/netns/meshrelay.sh
timeout 240 tests/netns/ring6.sh
echo "71-netns-relay: ok"
