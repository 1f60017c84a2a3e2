#!/usr/bin/env bash
# Peers two relays away, through the plugin .so between network namespaces (issue 30): six hosts
# in a ring (n1 - n2 - ... - n6 - n1), one veth /30 per neighbour pair, a management bridge
# (192.168.204.N/24) for the bootstrap and the handshakes, ip_forward off, no TCP fallback. Each
# host's opposite (n1-n4, n2-n5, n3-n6) is two relays away: no neighbour's relay reaches it, so the
# plugin asks its neighbours for their links and probes the hosts behind them (chains).
#
#   * `bench alltoall --nranks 6` (data verified by the bench) passes; every rank's INFO lines say
#     it asked relays two hops away and name a path `via relays K1 > K2` to its opposite host;
#   * `NCCL_SWITCHLESS_RELAY=off`: the same run fails with the no-cable error.
#
# Usage: tests/netns/ring6.sh [--release]. Needs root and iproute2; removes what it creates.
set -euo pipefail
cd "$(dirname "$0")/../.."

me=ring6.sh
# shellcheck source=tests/netns/lib.sh
. tests/netns/lib.sh
netns_args "$@"
netns_require
netns_build "$profile"
netns_start "sw6$$"
netns_hub
for n in 1 2 3 4 5 6; do
  netns_node "$tag-n$n" "$n" 204
  ip netns exec "$tag-n$n" sysctl -q -w net.ipv4.ip_forward=0
done
# Cable L joins nL and n(L+1) (n6 and n1 for L = 6): device to<peer> at each end.
for l in 1 2 3 4 5 6; do
  m=$((l % 6 + 1))
  netns_link "$tag-n$l" "$tag-n$m" "$l" "to$m" "to$l" 204
done

port=29800
# ring_alltoall <label> [K=V ...]: one rank per host, all at once, each bounded; sets $status.
ring_alltoall() {
  local label="$1" r ps=()
  shift
  port=$((port + 1))
  for r in 0 1 2 3 4 5; do
    timeout "${RUN_LIMIT:-150}" ip netns exec "$tag-n$((r + 1))" env NCCL_SWITCHLESS_TRANSPORT=tcp \
      NCCL_DEBUG=INFO "$@" "$bin" bench alltoall --rank "$r" --nranks 6 \
      --bootstrap "192.168.204.1:$port" --plugin "$so" --timeout "${BENCH_TIMEOUT:-60}" --no-progress \
      -b 1K -e 1M -f 32 -n 3 -w 1 >"$work/$label.$r" 2>&1 &
    ps+=($!); pids+=($!)
    echo $! >"$work/$label.$r.pid"
  done
  status=0
  for p in "${ps[@]}"; do wait "$p" || status=1; done
}

start=$(date +%s)
ring_alltoall chains
if [ "$status" -ne 0 ]; then
  for f in "$work"/chains.?; do echo "--- $f"; tail -n 25 "$f"; done
  fail "alltoall over the ring of six"
fi
for r in 0 1 2 3 4 5; do
  grep -q "relay(s) two hops away" "$work/chains.$r" ||
    { tail -n 30 "$work/chains.$r"; fail "rank $r: no INFO line says it asked relays two hops away"; }
  grep -qE "connected to peer .* via relays [^ ]+ \([0-9.]+\) > " "$work/chains.$r" ||
    { tail -n 30 "$work/chains.$r"; fail "rank $r: no connection INFO line names a chain of two relays"; }
done
grep -hE "connected to peer .* via relays" "$work/chains.0" | head -n 1 | sed -E 's/.*NET\/switchless: /    /' | cut -c1-400
echo "ring6.sh: alltoall over six hosts, opposite hosts through chains of two relays: ok in $(($(date +%s) - start)) s"

start=$(date +%s)
RUN_LIMIT=60 BENCH_TIMEOUT=20 ring_alltoall off NCCL_SWITCHLESS_RELAY=off
[ "$status" -ne 0 ] || fail "with NCCL_SWITCHLESS_RELAY=off the ring of six passed: the opposite hosts must not connect"
grep -qhi "no local link reaches the peer\|subnet" "$work"/off.? ||
  { for f in "$work"/off.?; do echo "--- $f"; tail -n 10 "$f"; done; fail "relays off: no rank names the missing cable"; }
echo "ring6.sh: NCCL_SWITCHLESS_RELAY=off: the opposite hosts fail, naming the missing cable ($(($(date +%s) - start)) s)"
echo "ring6.sh: ok"
