#!/usr/bin/env bash
# The mesh relay policy through the plugin .so between network namespaces (issue 30), over TCP
# paths, driven by `switchless bench` with NCCL's connect-time `setNetAttr` hints:
#
#   * four hosts in a FULL mesh: one veth /30 per pair (6 cables, MTU 9000), a management bridge
#     (192.168.203.N/24) for the bootstrap only, ip_forward off everywhere,
#     NCCL_SWITCHLESS_TRANSPORT=tcp. The rank ring is n1 -> n2 -> n3 -> n4 -> n1, so the diagonal
#     cables n1-n3 and n2-n4 join hosts that are not adjacent in it;
#   * `bench allreduce --nranks 4` (ring, data verified), default hints (the collective
#     connection's): every rank's connection gets relay paths through the two other hosts (the
#     INFO line names them) and the diagonal cables carry a good part of the bytes (below);
#   * the same with `--net-attr none` (no hint: what the bench did before) and with
#     NCCL_SWITCHLESS_RELAY=off: no relay paths, and the diagonal cables carry only what is not the
#     all-reduce's (under 1 % of its payload);
#   * `bench alltoall --nranks 4`, default hints (a p2p connection's): no relay paths;
#   * busbw with relays over busbw without (printed, never asserted: two shared CPUs, debug build).
#   * --measure: then the all-reduce at 128 MiB (10 iterations, 2 warm-up) with relays and with
#     NCCL_SWITCHLESS_RELAY=off, alternated SWL_MEASURE_REPS times (default 3): each busbw, the
#     medians and their ratio, and the diagonal share (printed, never asserted).
#
# Why the diagonal bound: a ring connection A -> B on a 4-host mesh gets one relay path through
# each of the two other hosts, each weighted half the direct path (the model's ring split: 2/N
# direct, 1/N through each other host), so half of its bytes start relayed; a relay path through
# K crosses exactly one diagonal cable (n1 -> n2 through n3: n1-n3, n3-n2; through n4: n1-n4,
# n4-n2). So the diagonals carry about half the all-reduce's payload; the adaptive stripe weights
# move from there as the paths' speeds show (a relayed byte also costs the relay host's CPU), so
# the test asks for at least a fifth (SWL_MESH_DIAG_MIN_PCT, default 20).
#
# Usage: tests/netns/meshrelay.sh [--release] [--measure]
# SWL_BENCH_BIN=/path/to/switchless runs that bench binary (e.g. one built before the bench gave
# hints, to see the test fail) with the plugin built here. KEEP_WORK=1 keeps every rank's output.
# Needs root and iproute2. Everything created is removed on exit. About 30-60 s after the build.
set -euo pipefail
cd "$(dirname "$0")/../.."

me=meshrelay.sh
# shellcheck source=tests/netns/lib.sh
. tests/netns/lib.sh
netns_args "$@"
netns_require
netns_build "$profile"
[ -z "${SWL_BENCH_BIN:-}" ] || bin=$(readlink -f "$SWL_BENCH_BIN")
netns_start "swm$$"
netns_hub
# The ring n1-n2-n3-n4-n1 (lib.sh, ip_forward off), then the two diagonals: a full mesh.
netns_ring4 203
netns_link "$tag-n1" "$tag-n3" 5 to3 to1 203
netns_link "$tag-n2" "$tag-n4" 6 to4 to2 203

# bytes <ns:dev>...: rx + tx bytes at one end of each cable (each byte that crossed it, once).
bytes() {
  local t=0 rx tx d
  for d in "$@"; do
    rx=$(ip netns exec "${d%%:*}" cat "/sys/class/net/${d##*:}/statistics/rx_bytes")
    tx=$(ip netns exec "${d%%:*}" cat "/sys/class/net/${d##*:}/statistics/tx_bytes")
    t=$((t + rx + tx))
  done
  echo "$t"
}
diag() { bytes "$tag-n1:to3" "$tag-n2:to4"; }
ring() { bytes "$tag-n1:to2" "$tag-n2:to3" "$tag-n3:to4" "$tag-n1:to4"; }

bport=29950
# run_bench <label> <mode> <extra bench args>: one rank per host, n1..n4, all at once, each bounded
# by `timeout`; rank 0 bootstraps on n1's management address. Sets $status; rank r's output is in
# $work/<label>.r; $dbytes and $rbytes: what the diagonal and the ring cables carried meanwhile.
run_bench() {
  local label="$1" mode="$2" extra="$3" r d0 r0 pidlist=() p
  bport=$((bport + 1))
  d0=$(diag); r0=$(ring)
  for r in 0 1 2 3; do
    # shellcheck disable=SC2086
    timeout "${RUN_LIMIT:-90}" ip netns exec "$tag-n$((r + 1))" env NCCL_SWITCHLESS_TRANSPORT=tcp \
      NCCL_DEBUG=INFO ${BENCH_ENV:-} \
      "$bin" bench "$mode" --rank "$r" --nranks 4 --bootstrap "192.168.203.1:$bport" \
      --plugin "$so" --timeout 30 --no-progress $extra >"$work/$label.$r" 2>&1 &
    pidlist+=($!); pids+=($!)
    echo $! >"$work/$label.$r.pid"
  done
  status=0
  for p in "${pidlist[@]}"; do wait "$p" || status=1; done
  dbytes=$(($(diag) - d0)); rbytes=$(($(ring) - r0))
  if [ "$status" -ne 0 ]; then
    for r in 0 1 2 3; do echo "--- $label rank $r"; tail -n 15 "$work/$label.$r"; done
    fail "$label: the bench failed"
  fi
  grep -q "data checks: all passed" "$work/$label.0" || fail "$label: no verified data"
}
# busbw <label>: rank 0's busbw at the largest size, Gb/s.
busbw() { grep -E '^ +[0-9]+ ' "$work/$1.0" | tail -n 1 | awk '{ print $8 }'; }
relay_lines() { grep -h "relayed TCP path(s) through" "$work/$1".? || true; }

# All-reduce: 32 MiB, 2 channels, one 4 MiB message per ring step (--chunk-bytes 4M: relays carry
# a share of messages from 512 KiB on; the bench's default 128 KiB slices would stay direct).
size=$((32 << 20))
iters=3
warmup=1
ar="-b $size -e $size -n $iters -w $warmup --channels 2 --chunk-bytes 4M"
# Payload: each of the 4 ranks sends 2 (N - 1) / N = 3/2 of the size to the next per all-reduce
# (reduce-scatter then all-gather), warm-up included: 6 sizes per all-reduce in all.
payload=$((6 * size * (iters + warmup)))
min_pct=${SWL_MESH_DIAG_MIN_PCT:-20}

# --- default hints: relays ------------------------------------------------------------------------
start=$(date +%s%N)
run_bench ar-hint allreduce "$ar"
ms=$((($(date +%s%N) - start) / 1000000))
# Every rank's connection to the next (one per channel) names its two relay hosts.
for r in 0 1 2 3; do
  l=$(grep -h "relayed TCP path(s) through" "$work/ar-hint.$r" | head -n 1 || true)
  [ -n "$l" ] || { tail -n 30 "$work/ar-hint.$r"; fail "allreduce with NCCL's hints: rank $r: no INFO line names relay hosts"; }
  n=$(echo "$l" | sed -E 's/.* ([0-9]+) relayed TCP path.*/\1/')
  [ "$n" -eq 2 ] || fail "rank $r: $n relayed path(s), 2 expected (through each host not its peer): $l"
done
relay_lines ar-hint | head -n 1 | sed -E 's/.*NET\/switchless: /    /' | cut -c1-300
grep -h "direct and .* relayed path(s)" "$work/ar-hint.0" | head -n 1 | sed -E 's/.*NET\/switchless: /    /' | cut -c1-300
hint_d=$dbytes; hint_r=$rbytes; hint_bw=$(busbw ar-hint)
echo "meshrelay.sh: allreduce, NCCL hints: ok in $ms ms; diagonal cables $hint_d B, ring cables $hint_r B, payload $payload B, busbw $hint_bw Gb/s"
awk -v d="$hint_d" -v p="$payload" 'BEGIN { printf "meshrelay.sh: allreduce, NCCL hints: diagonal bytes / payload = %.3f (about 0.5 at the starting split)\n", d / p }'
[ $((hint_d * 100)) -ge $((payload * min_pct)) ] ||
  fail "the diagonal cables carried $hint_d B, under $min_pct % of the all-reduce's $payload B payload"

# --- no hints, relays off: the diagonals idle ---------------------------------------------------
check_idle() { # label what
  local label="$1" what="$2"
  [ -z "$(relay_lines "$label")" ] || { relay_lines "$label" | head -n 2; fail "$what: relay paths"; }
  [ $((dbytes * 100)) -lt "$payload" ] ||
    fail "$what: the diagonal cables carried $dbytes B, not under 1 % of the $payload B payload"
  echo "meshrelay.sh: allreduce, $what: ok, no relay paths; diagonal cables $dbytes B, ring cables $rbytes B, busbw $(busbw "$label") Gb/s"
}
if [ -z "${SWL_BENCH_BIN:-}" ]; then
  run_bench ar-none allreduce "$ar --net-attr none"
  check_idle ar-none "--net-attr none"
  none_bw=$(busbw ar-none)
fi
BENCH_ENV="NCCL_SWITCHLESS_RELAY=off" run_bench ar-off allreduce "$ar"
check_idle ar-off "NCCL_SWITCHLESS_RELAY=off"
off_bw=$(busbw ar-off)

# --- alltoall: p2p hints, no relays -----------------------------------------------------------------
run_bench a2a alltoall "-b 1M -e 16M -f 4 -n 3 -w 1"
[ -z "$(relay_lines a2a)" ] || { relay_lines a2a | head -n 2; fail "alltoall with NCCL's p2p hint got relay paths"; }
grep -q "connected to" "$work/a2a.0" || fail "alltoall: no connection INFO line to check"
echo "meshrelay.sh: alltoall, NCCL hints: ok, no relay paths (diagonal cables $dbytes B: its own direct traffic)"

awk -v h="$hint_bw" -v o="$off_bw" -v n="${none_bw:-0}" -v p="$profile" 'BEGIN {
  printf "meshrelay.sh: busbw (%s build, 4 ranks, 32 MiB allreduce): relays %.3f Gb/s, RELAY=off %.3f Gb/s, ratio %.2f", p, h, o, (o > 0 ? h / o : 0)
  if (n > 0) printf "; --net-attr none %.3f Gb/s, ratio %.2f", n, h / n
  printf "\n" }'

# --- --measure: relays on vs off, alternated ----------------------------------------------------------
if [ "$measure" = 1 ]; then
  msize=$((128 << 20)); miters=10; mwarm=2
  m="-b $msize -e $msize -n $miters -w $mwarm --channels 2 --chunk-bytes 4M"
  mpayload=$((6 * msize * (miters + mwarm)))
  median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
  on="" off="" share=""
  for i in $(seq 1 "${SWL_MEASURE_REPS:-3}"); do
    run_bench "m-on-$i" allreduce "$m"
    on+=" $(busbw "m-on-$i")"
    share+=" $(awk -v d="$dbytes" -v p="$mpayload" 'BEGIN { printf "%.3f", d / p }')"
    BENCH_ENV="NCCL_SWITCHLESS_RELAY=off" run_bench "m-off-$i" allreduce "$m"
    off+=" $(busbw "m-off-$i")"
  done
  mon=$(echo "$on" | median); moff=$(echo "$off" | median)
  echo "meshrelay.sh: measure ($profile build, 4 ranks, 128 MiB allreduce, 2 channels): busbw relays [$on ] Gb/s, RELAY=off [$off ] Gb/s; diagonal bytes / payload [$share ]"
  awk -v a="$mon" -v b="$moff" 'BEGIN { printf "meshrelay.sh: measure: median busbw relays %.3f Gb/s, RELAY=off %.3f Gb/s, ratio %.2f\n", a, b, (b > 0 ? a / b : 0) }'
fi
echo "meshrelay.sh: ok"
