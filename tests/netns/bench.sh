#!/usr/bin/env bash
# `switchless bench` through the plugin .so (the ncclNet ABI, as NCCL's proxy drives it) between network
# namespaces, over TCP paths (no RDMA):
#
#   * every node namespace has a management veth on a shared bridge (192.168.200.N/24, in a hub namespace):
#     the bench bootstraps over it; a /24 is not a point-to-point link, so it never carries data;
#   * data links are veth pairs, one /30 each (10.201.L.1 / 10.201.L.2), MTU 9000;
#   * 3-node full mesh: alltoall and allreduce (data verified by the bench) over 3 ranks;
#   * two ranks in one namespace (the same host over the network, as NCCL does with P2P and SHM off):
#     loopback paths to the links' own addresses, the INFO line that says so; and 2 + 1 ranks mixed;
#   * 4-node ring: alltoall and allreduce over 4 ranks (every rank talks to its two neighbours for
#     the ring all-reduce; alltoall needs non-neighbours too, so it runs with the fallback, see below);
#   * ring non-neighbours (node 1 <-> node 3): without NCCL_SWITCHLESS_TCP_FALLBACK the bench fails fast with
#     the clear no-shared-subnet error; with NCCL_SWITCHLESS_TCP_FALLBACK=1 it runs over the management subnet
#     and the plugin logs one WARN per such peer naming the expected bandwidth (counted per rank).
#   * routed 4-node ring, no management network: every node forwards (ip_forward) and has kernel routes to
#     the far subnets through its neighbours (one node only a default route); the bench bootstraps over those
#     routes. Non-neighbours fail fast without the fallback (a kernel route is not a cable) and, with
#     NCCL_SWITCHLESS_TCP_FALLBACK=1, run through a neighbour (the one behind NCCL's device; the WARN names
#     the gateway); through a neighbour that stops forwarding the connection fails within the connect
#     timeout, naming the gateway; alltoall over all 4 ranks with the fallback.
#   * --measure: `switchless bench bandwidth` over one veth link vs iperf3 -P N on the same link in the same
#     run, 1 stream and N streams (NCCL_SWITCHLESS_TCP_STREAMS), ratios printed (never asserted).
#
# Usage: tests/netns/bench.sh [--measure] [--streams N] [--release]
# Needs root and iproute2; --measure also iperf3 and jq. Everything created is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

measure=0
streams=4
profile=debug
while [ $# -gt 0 ]; do
  case "$1" in
    --measure) measure=1; profile=release ;;
    --streams) streams="$2"; shift ;;
    --release) profile=release ;;
    *) echo "bench.sh: unknown argument $1 (accepted: --measure, --streams N, --release)" >&2; exit 2 ;;
  esac
  shift
done

me=bench.sh
# shellcheck source=tests/netns/lib.sh
. tests/netns/lib.sh
netns_require
if [ "$measure" = 1 ]; then
  for t in iperf3 jq; do command -v "$t" >/dev/null || { echo "bench.sh: $t is missing" >&2; exit 1; }; done
fi
netns_build "$profile"
netns_start "swb$$"
netns_hub
# mkns <name> <N>: a node namespace with management address 192.168.200.N/24 on the hub bridge.
mkns() { netns_node "$1" "$2" 200; }
# link <nsA> <nsB> <L> <devA> <devB>: veth pair, 10.201.L.1/30 on A, 10.201.L.2/30 on B, MTU 9000.
link() { netns_link "$@" 201; }

bport=29600
# run_bench <label> <mode> <extra bench args> -- <ns of rank 0> <ns of rank 1> ...: all ranks at once, each
# bounded by `timeout`; rank 0 bootstraps on its management address. Sets $status (0 = every rank passed)
# and leaves rank r's output in $work/<label>.r.
run_bench() {
  local label="$1" mode="$2" extra="$3"; shift 4
  local nranks=$# r=0 ns rank0ip pidlist=()
  bport=$((bport + 1))
  rank0ip="${BOOT_IP:-192.168.200.${1##*n}}"
  for ns in "$@"; do
    # shellcheck disable=SC2086
    # Relays are off here (tests/netns/relay.sh covers them): this file is about direct paths, the
    # no-path errors and the TCP fallback, which relays would otherwise take the place of.
    timeout 120 ip netns exec "$ns" env NCCL_SWITCHLESS_TRANSPORT="${TRANSPORT:-tcp}" \
      NCCL_SWITCHLESS_RELAY=off ${BENCH_ENV:-} "$bin" bench "$mode" --rank "$r" --nranks "$nranks" \
      --bootstrap "$rank0ip:$bport" --plugin "$so" --timeout 30 --no-progress $extra \
      >"$work/$label.$r" 2>&1 &
    pidlist+=($!); pids+=($!)
    r=$((r + 1))
  done
  status=0
  for p in "${pidlist[@]}"; do wait "$p" || status=1; done
}

show() { # label: rank 0's result table, indented
  sed 's/^/    /' "$work/$1.0" | grep -v '^    *$' | tail -n 12
}

expect_ok() { # label mode extra ns...
  local label="$1"
  run_bench "$@"
  if [ "$status" -ne 0 ]; then
    for f in "$work/$label".*; do echo "--- $f"; tail -n 30 "$f"; done
    fail "$label"
  fi
  echo "bench.sh: $label: ok"
  show "$label"
}

# expect_fast_failure <label> <pattern> <ns of rank 0> <ns of rank 1>: a 2-rank bandwidth run must fail
# (no path between the two), within 30 s, with an error matching <pattern> (case-insensitive).
expect_fast_failure() {
  local label="$1" pattern="$2" start ms
  shift 2
  start=$(date +%s%N)
  run_bench "$label" bandwidth "-b 8 -e 65536 -n 3" -- "$@"
  ms=$((($(date +%s%N) - start) / 1000000))
  [ "$status" -ne 0 ] || fail "$label: bench succeeded without the fallback"
  grep -qi "$pattern" "$work/$label".* || {
    tail -n 20 "$work/$label".*; fail "$label: the error does not say '$pattern'"; }
  [ "$ms" -lt 30000 ] || fail "$label: took $ms ms to fail"
  echo "bench.sh: $label without fallback: fails in $ms ms: $(grep -hi -m1 "$pattern" "$work/$label".* | cut -c1-300)"
}

# --- 3-node full mesh ------------------------------------------------------------------------------
for n in 1 2 3; do mkns "$tag-n$n" "$n"; done
link "$tag-n1" "$tag-n2" 1 to2 to1
link "$tag-n1" "$tag-n3" 2 to3 to1
link "$tag-n2" "$tag-n3" 3 to3 to2
sizes="-b 8 -e 4194304 -f 8 -n 5 -w 1"
expect_ok mesh-alltoall alltoall "$sizes" -- "$tag-n1" "$tag-n2" "$tag-n3"
expect_ok mesh-allreduce allreduce "$sizes" -- "$tag-n1" "$tag-n2" "$tag-n3"
TRANSPORT=auto expect_ok mesh-allreduce-auto allreduce "-b 1024 -e 1048576 -f 32 -n 3 -w 1" -- "$tag-n1" "$tag-n2" "$tag-n3"

# --- two ranks in one namespace (one host) ------------------------------------------------------------
# NCCL connects ranks of one host over the network when P2P and SHM are off (NCCL_P2P_DISABLE=1
# NCCL_SHM_DISABLE=1, different host hashes): the peer's handle advertises only this node's addresses,
# and the plugin connects it over TCP to the link's own address, with one INFO line saying so.
BENCH_ENV="NCCL_DEBUG=INFO" expect_ok samehost-bandwidth bandwidth "-b 8 -e 1048576 -n 5" -- "$tag-n1" "$tag-n1"
grep -h -m1 "the peer is this host" "$work"/samehost-bandwidth.0 | cut -c1-300 | sed 's/^/    /' | grep . || {
  tail -n 20 "$work"/samehost-bandwidth.*; fail "samehost: no INFO line says the peer is this host"; }
# Mixed: ranks 0 and 1 share n1 (loopback paths), rank 2 is n2 (its cable).
expect_ok samehost-allreduce allreduce "-b 8 -e 1048576 -f 32 -n 3 -w 1" -- "$tag-n1" "$tag-n1" "$tag-n2"

# --- 4-node ring -----------------------------------------------------------------------------------
for n in 4 5 6 7; do mkns "$tag-n$n" "$n"; done
link "$tag-n4" "$tag-n5" 11 to2 to1
link "$tag-n5" "$tag-n6" 12 to3 to2
link "$tag-n6" "$tag-n7" 13 to4 to3
link "$tag-n4" "$tag-n7" 14 to4 to1
# Ring all-reduce: each rank talks to its ring neighbours only (rank order = ring order).
expect_ok ring-allreduce allreduce "$sizes" -- "$tag-n4" "$tag-n5" "$tag-n6" "$tag-n7"

# Non-neighbours (ring nodes 1 and 3): no shared point-to-point subnet.
expect_fast_failure ring-nonneighbour "subnet" "$tag-n4" "$tag-n6"

# fallback_warns <label> <max per rank> <min in all>: the plugin's fallback WARN ("... TCP_FALLBACK=1
# carries it ...") appears at most <max> times in each rank's output (once per peer that needs it) and
# at least <min> times in all, and each names the bandwidth to expect ("N Mb/s link" or "link speed
# unknown").
fallback_warns() {
  local label="$1" max="$2" min="$3" f n total=0
  for f in "$work/$label".*; do
    n=$(grep -ci "TCP_FALLBACK=1 carries it" "$f" || true)
    [ "$n" -le "$max" ] || fail "$label: $n fallback WARNs in $(basename "$f"), at most $max expected (one per peer)"
    total=$((total + n))
  done
  [ "$total" -ge "$min" ] || fail "$label: $total fallback WARNs in all, at least $min expected"
  if grep -hi "TCP_FALLBACK=1 carries it" "$work/$label".* | grep -viqE '[0-9]+ Mb/s link|link speed unknown'; then
    fail "$label: a fallback WARN names no bandwidth: $(grep -hi "TCP_FALLBACK=1 carries it" "$work/$label".* | head -n 1)"
  fi
  grep -hi "TCP_FALLBACK=1 carries it" "$work/$label".* | head -n 1 | cut -c1-400 | sed 's/^/    /'
  echo "bench.sh: $label: $total fallback WARN(s), at most $max per rank, each naming the bandwidth"
}

BENCH_ENV="NCCL_SWITCHLESS_TCP_FALLBACK=1 NCCL_DEBUG=WARN" expect_ok ring-nonneighbour-fallback bandwidth "-b 8 -e 1048576 -n 5" -- "$tag-n4" "$tag-n6"
# Each rank has one peer, reached over the management subnet.
fallback_warns ring-nonneighbour-fallback 1 1
# Alltoall on the ring needs the non-neighbour pairs: with the fallback they use the management subnet.
# Every rank connects to its one non-neighbour: exactly one WARN each.
BENCH_ENV="NCCL_SWITCHLESS_TCP_FALLBACK=1 NCCL_DEBUG=WARN" expect_ok ring-alltoall-fallback alltoall "-b 8 -e 1048576 -f 16 -n 3 -w 1" -- "$tag-n4" "$tag-n5" "$tag-n6" "$tag-n7"
fallback_warns ring-alltoall-fallback 1 4

# --- routed 4-node ring, no management network -------------------------------------------------------
# Links 21..24: n8 -21- n9 -22- n10 -23- n11 -24- n8. Forwarding on, reverse-path filter off (the
# namespaces inherit the host's), before the links exist so that every interface takes it.
for n in 8 9 10 11; do
  ns="$tag-n$n"
  ip netns add "$ns"; namespaces+=("$ns")
  ip -n "$ns" link set lo up
  ip netns exec "$ns" sysctl -q -w net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 \
    net.ipv4.conf.default.rp_filter=0
done
link "$tag-n8" "$tag-n9" 21 to2 to1
link "$tag-n9" "$tag-n10" 22 to3 to2
link "$tag-n10" "$tag-n11" 23 to4 to3
link "$tag-n8" "$tag-n11" 24 to4 to1
ip -n "$tag-n8" route add 10.201.22.0/30 via 10.201.21.2
ip -n "$tag-n8" route add 10.201.23.0/30 via 10.201.24.2
ip -n "$tag-n9" route add 10.201.23.0/30 via 10.201.22.2
ip -n "$tag-n9" route add 10.201.24.0/30 via 10.201.21.1
ip -n "$tag-n10" route add 10.201.24.0/30 via 10.201.23.2
ip -n "$tag-n10" route add 10.201.21.0/30 via 10.201.22.1
ip -n "$tag-n11" route add default via 10.201.23.1
ip netns exec "$tag-n10" ping -c 1 -W 2 10.201.21.1 >/dev/null || fail "routed ring: n10 cannot reach n8 through n9"
export BOOT_IP=10.201.21.1 # rank 0 is n8 unless a run says otherwise

# A kernel route is not a cable: without the fallback the plugin refuses the non-neighbour at once.
expect_fast_failure routed-nonneighbour "no local link reaches the peer" "$tag-n8" "$tag-n10"

BENCH_ENV="NCCL_SWITCHLESS_TCP_FALLBACK=1 NCCL_DEBUG=WARN" expect_ok routed-nonneighbour-fallback bandwidth "-b 8 -e 1048576 -n 5" -- "$tag-n8" "$tag-n10"
w=$(grep -h "TCP_FALLBACK=1 carries it" "$work"/routed-nonneighbour-fallback.0 | head -n 1)
# NCCL's device is the locality hint here too: the path leaves through that device's neighbour.
case "$w" in
  *"to2 10.201.21.1/30 -> 10.201.22.2/30 via 10.201.21.2"*|*"to4 10.201.24.1/30 -> 10.201.23.1/30 via 10.201.24.2"*) ;;
  *) echo "$w"; fail "routed ring: rank 0's fallback WARN does not name a path through a neighbour" ;;
esac
echo "$w" | cut -c1-400 | sed 's/^/    /'
# n11 has only a default route (through n10): its path to n9 goes that way (rank 0 = n11 here).
BOOT_IP=10.201.23.2 BENCH_ENV="NCCL_SWITCHLESS_TCP_FALLBACK=1 NCCL_DEBUG=WARN" expect_ok routed-default-route bandwidth "-b 8 -e 65536 -n 3" -- "$tag-n11" "$tag-n9"
grep -h "TCP_FALLBACK=1 carries it" "$work"/routed-default-route.0 | grep -q "via 10.201.23.1" || {
  grep -h "TCP_FALLBACK" "$work"/routed-default-route.0; fail "routed ring: n11's fallback WARN does not name its default gateway"; }
# A route through a host that does not forward: the connection fails within the connect timeout and
# the error names the gateway to check. `--dev 0` pins both ends to the path through n9.
ip netns exec "$tag-n9" sysctl -q -w net.ipv4.ip_forward=0
start=$(date +%s%N)
BOOT_IP=10.201.24.1 BENCH_ENV="NCCL_SWITCHLESS_TCP_FALLBACK=1 NCCL_SWITCHLESS_CONNECT_TIMEOUT=3s" \
  run_bench routed-no-forwarding bandwidth "--dev 0 -b 8 -e 65536 -n 3" -- "$tag-n8" "$tag-n10"
ms=$((($(date +%s%N) - start) / 1000000))
ip netns exec "$tag-n9" sysctl -q -w net.ipv4.ip_forward=1
[ "$status" -ne 0 ] || fail "routed-no-forwarding: bench succeeded through a host that does not forward"
grep -q "via 10.201.21.2 (for 10.201.21.1 -> 10.201.22.2): that host must forward" "$work"/routed-no-forwarding.0 || {
  tail -n 20 "$work"/routed-no-forwarding.*; fail "routed-no-forwarding: rank 0's error does not name the gateway"; }
[ "$ms" -lt 30000 ] || fail "routed-no-forwarding: took $ms ms to fail"
echo "bench.sh: routed-no-forwarding: fails in $ms ms naming the gateway"
BENCH_ENV="NCCL_SWITCHLESS_TCP_FALLBACK=1" expect_ok routed-alltoall-fallback alltoall "-b 8 -e 1048576 -f 16 -n 3 -w 1" -- "$tag-n8" "$tag-n9" "$tag-n10" "$tag-n11"
unset BOOT_IP

# --- measurement: one veth link (mesh link 1, n1 <-> n2) ----------------------------------------------
if [ "$measure" = 1 ]; then
  secs="${SWL_BENCH_SECONDS:-5}"
  iperf() { # $1 = parallel streams; prints Gb/s at the receiver
    local p=$((bport + 50))
    bport=$p
    ip netns exec "$tag-n2" iperf3 -s -1 -B 10.201.1.2 -p "$p" >/dev/null 2>&1 &
    local sp=$!; pids+=("$sp")
    sleep 0.5
    ip netns exec "$tag-n1" timeout 60 iperf3 -c 10.201.1.2 -B 10.201.1.1 -p "$p" -P "$1" -t "$secs" -l 1M -J >"$work/iperf.json"
    wait "$sp" 2>/dev/null || true
    jq '.end.sum_received.bits_per_second / 1e9' "$work/iperf.json"
  }
  plugin_bw() { # $1 = NCCL_SWITCHLESS_TCP_STREAMS; prints the bandwidth (Gb/s of payload) at 16 MiB messages
    rm -f "$work/bw$1.json"
    BENCH_ENV="NCCL_SWITCHLESS_TCP_STREAMS=$1" run_bench "bw$1" bandwidth \
      "-b 16777216 -e 16777216 -n ${SWL_BENCH_ITERS:-60} -w 4 --window 8 --save-json $work/bw$1.json" -- "$tag-n1" "$tag-n2"
    [ "$status" -eq 0 ] || { tail -n 20 "$work/bw$1".*; fail "bandwidth with $1 streams"; }
    jq '.rows | last | .algbw_gbits_s' "$work/bw$1.json"
  }
  # The bench fills and verifies every message outside its timed windows (docs/guide/lab.md); its
  # ceiling with the in-process loopback Net (no network, same sizes) is printed for comparison.
  ceil=$(timeout 120 "$bin" bench bandwidth --loopback -b 16777216 -e 16777216 -n "${SWL_BENCH_ITERS:-60}" -w 4 \
    --window 8 --no-progress --save-json "$work/ceil.json" >/dev/null 2>&1 && jq '.rows | last | .algbw_gbits_s' "$work/ceil.json")
  echo "bench.sh: measure: the bench's own ceiling (--loopback, 16 MiB, fill + verify untimed): $(printf %.2f "${ceil:-0}") Gb/s"
  for n in 1 "$streams"; do
    ip_g=$(iperf "$n")
    pl_g=$(plugin_bw "$n")
    awk -v n="$n" -v a="$pl_g" -v b="$ip_g" 'BEGIN { printf "bench.sh: measure %s stream(s): plugin %.2f Gb/s, iperf3 -P %s %.2f Gb/s, ratio %.2f\n", n, a, n, b, (b > 0 ? a / b : 0) }'
  done
fi
echo "bench.sh: ok"
