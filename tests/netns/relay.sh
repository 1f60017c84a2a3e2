#!/usr/bin/env bash
# Relay paths through the plugin .so between network namespaces (issue 30), over TCP paths:
#
#   * four hosts in a ring (n1 - n2 - n3 - n4 - n1), one veth /30 per neighbour pair, MTU 9000, and
#     a management bridge (192.168.202.N/24) that the bench bootstraps over; ip_forward is off
#     everywhere and NCCL_SWITCHLESS_TCP_FALLBACK is unset, so the diagonal pairs (n1-n3, n2-n4) have
#     no way to each other but through a neighbour's relay service (inside that neighbour's plugin);
#   * `bench alltoall --nranks 4` (data verified by the bench): passes; every rank's INFO line names
#     the relay hosts of its diagonal connection; the management bridge carries only the bootstrap and
#     the handshakes (its byte counters grow by less than 1 % of the diagonal payload, which the
#     cables carried);
#   * `NCCL_SWITCHLESS_RELAY=off`: the same run fails fast with the no-cable error (the test can fail);
#   * a relay host killed mid-transfer: n1 -> n3 bandwidth through n2 and n4, n2's process killed
#     after 3 s: the run completes over the relay through n4 (failover) or fails with an error naming
#     the relay host n2, within 60 s; nothing hangs.
#
#   * --measure: the same 4-rank alltoall at 16 MiB through relays and then with relays off over the
#     TCP fallback (the diagonal over the management bridge), in the same run; busbw and the ratio
#     are printed, never asserted; and for each relay host its relay thread's CPU time (/proc, by
#     the thread's name), the bytes its service forwarded (its own count, logged at stop), cores per
#     100 Gb/s forwarded and peak staging memory.
#
# Usage: tests/netns/relay.sh [--release] [--measure]
# Debugging: KEEP_WORK=1 keeps every rank's output; ONLY_KILL=1 runs only the relay-kill part.
# Needs root and iproute2. Everything created is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

me=relay.sh
# shellcheck source=tests/netns/lib.sh
. tests/netns/lib.sh
netns_args "$@"
netns_require
netns_build "$profile"
netns_start "swr$$"
netns_hub
# n1-n2-n3-n4-n1, 10.202.L.x/30 cables, ip_forward off (lib.sh).
netns_ring4 202

# Bytes through the management bridge (every node's mgmt veth, both directions) and through the
# cables (every ring link, counted at one end, both directions).
mgmt_bytes() {
  local n t=0 rx tx
  for n in 1 2 3 4; do
    rx=$(ip netns exec "$tag-n$n" cat /sys/class/net/mgmt/statistics/rx_bytes)
    tx=$(ip netns exec "$tag-n$n" cat /sys/class/net/mgmt/statistics/tx_bytes)
    t=$((t + rx + tx))
  done
  echo "$t"
}
cable_bytes() {
  local t=0 rx tx d
  for d in "$tag-n1:to2" "$tag-n2:to3" "$tag-n3:to4" "$tag-n1:to4"; do
    rx=$(ip netns exec "${d%%:*}" cat "/sys/class/net/${d##*:}/statistics/rx_bytes")
    tx=$(ip netns exec "${d%%:*}" cat "/sys/class/net/${d##*:}/statistics/tx_bytes")
    t=$((t + rx + tx))
  done
  echo "$t"
}

bport=29700
# run_bench <label> <mode> <extra bench args> -- <ns of rank 0> ...: all ranks at once, each bounded
# by `timeout`; rank 0 bootstraps on its management address. Sets $status; rank r's output is in
# $work/<label>.r, its PID in $work/<label>.r.pid.
run_bench() {
  local label="$1" mode="$2" extra="$3"; shift 4
  local nranks=$# r=0 ns rank0ip pidlist=()
  bport=$((bport + 1))
  rank0ip="192.168.202.${1##*n}"
  for ns in "$@"; do
    # shellcheck disable=SC2086
    timeout "${RUN_LIMIT:-120}" ip netns exec "$ns" env NCCL_SWITCHLESS_TRANSPORT=tcp ${BENCH_ENV:-} \
      "$bin" bench "$mode" --rank "$r" --nranks "$nranks" \
      --bootstrap "$rank0ip:$bport" --plugin "$so" --timeout 30 --no-progress $extra \
      >"$work/$label.$r" 2>&1 &
    pidlist+=($!); pids+=($!)
    echo $! >"$work/$label.$r.pid"
    r=$((r + 1))
  done
  status=0
  for p in "${pidlist[@]}"; do wait "$p" || status=1; done
}

if [ -z "${ONLY_KILL:-}" ]; then
# --- alltoall over the ring: the diagonals through relays ------------------------------------------
size=4194304
first=1024
iters=5
m0=$(mgmt_bytes); c0=$(cable_bytes)
start=$(date +%s%N)
BENCH_ENV="NCCL_DEBUG=INFO" run_bench ring-alltoall alltoall "-b $first -e $size -f 8 -n $iters -w 1" -- \
  "$tag-n1" "$tag-n2" "$tag-n3" "$tag-n4"
ms=$((($(date +%s%N) - start) / 1000000))
m1=$(mgmt_bytes); c1=$(cable_bytes)
if [ "$status" -ne 0 ]; then
  for f in "$work"/ring-alltoall.?; do echo "--- $f"; tail -n 30 "$f"; done
  fail "ring-alltoall through relays"
fi
sed 's/^/    /' "$work/ring-alltoall.0" | grep -v '^    *$' | grep -v "NCCL INFO\|NET/" | tail -n 8
# Every rank sends to its diagonal peer through the relays of both its neighbours.
for r in 0 1 2 3; do
  line=$(grep -h "relayed TCP path(s) through" "$work/ring-alltoall.$r" | head -n 1)
  [ -n "$line" ] || { tail -n 40 "$work/ring-alltoall.$r"; fail "rank $r: no INFO line names its relay hosts"; }
  n=$(echo "$line" | sed -E 's/.* ([0-9]+) relayed TCP path.*/\1/')
  [ "$n" -ge 2 ] || fail "rank $r: $n relayed path(s), 2 expected (one per neighbour): $line"
  [ "$r" = 0 ] && echo "$line" | sed -E 's/.*NET\/switchless: /    /' | cut -c1-300
done
grep -h "connected to .*via relay" "$work/ring-alltoall.0" | head -n 1 | sed -E 's/.*NET\/switchless: /    /' | cut -c1-400
mgmt=$((m1 - m0)); cables=$((c1 - c0))
# The alltoall's bytes on the diagonal: every rank sends one block of each size to each peer per
# iteration (warm-up included), 1/4 of the size per peer; two diagonal pairs, both directions.
diag=0
s=$first
while [ "$s" -le "$size" ]; do diag=$((diag + 4 * (iters + 1) * s / 4)); s=$((s * 8)); done
echo "relay.sh: ring-alltoall: ok in $ms ms; management bridge $mgmt bytes, cables $cables bytes, diagonal payload $diag bytes"
awk -v m="$mgmt" -v d="$diag" 'BEGIN { printf "relay.sh: management bridge bytes / diagonal payload bytes = %.4f\n", m / d }'
[ $((mgmt * 100)) -lt "$diag" ] || fail "the management bridge carried $mgmt bytes, not less than 1 % of the $diag diagonal bytes: data went over it"
[ "$cables" -gt $((diag * 2)) ] || fail "the cables carried $cables bytes, less than twice the diagonal's $diag (each relayed byte crosses two cables)"

# --- relays off: the diagonal fails at once, naming why ------------------------------------------
start=$(date +%s%N)
BENCH_ENV="NCCL_SWITCHLESS_RELAY=off" run_bench relay-off bandwidth "-b 8 -e 65536 -n 3" -- "$tag-n1" "$tag-n3"
ms=$((($(date +%s%N) - start) / 1000000))
[ "$status" -ne 0 ] || fail "relay-off: the diagonal connected with NCCL_SWITCHLESS_RELAY=off"
grep -qi "no local link reaches the peer\|subnet" "$work"/relay-off.* || { tail -n 20 "$work"/relay-off.*; fail "relay-off: the error does not say why"; }
[ "$ms" -lt 30000 ] || fail "relay-off: took $ms ms to fail"
echo "relay.sh: relay-off: the diagonal fails in $ms ms: $(grep -hi -m1 "no local link\|subnet" "$work"/relay-off.* | cut -c1-200)"

fi
# --- a relay host killed mid-transfer ---------------------------------------------------------------
# Job A: n1 -> n3 (diagonal, through n2 and n4). Jobs B and C keep a plugin with a relay service on
# n2 and n4: two ranks on one host each. A relay serves only its own communicator, and each bench
# job draws a random communicator id unless given one, so all three jobs are given the same
# `--comm-id` (one communicator id, one relay port), as the ranks of one NCCL job share commHash.
# Each runs in the background (a subshell) with its own bootstrap port. Job B (n2) is killed once
# job A moved 256 MiB through it; job C (n4) keeps relaying.
kill_comm="--comm-id 0x5357$(printf '%012x' $$)"
bport=29800
RUN_LIMIT=120 run_bench killB bandwidth "-b 65536 -e 65536 -n 10000000 -w 1 $kill_comm" -- "$tag-n2" "$tag-n2" &
jobb=$!
bport=29850
RUN_LIMIT=120 run_bench killC bandwidth "-b 65536 -e 65536 -n 10000000 -w 1 $kill_comm" -- "$tag-n4" "$tag-n4" &
jobc=$!
bport=29900
RUN_LIMIT=120 BENCH_ENV="NCCL_DEBUG=INFO" run_bench killA bandwidth "-b 8388608 -e 8388608 -n ${KILL_ITERS:-200} -w 1 $kill_comm" -- "$tag-n1" "$tag-n3" &
joba=$!
# Wait until job A's connection through both relays carries data, then kill n2's process.
for _ in $(seq 1 300); do
  grep -q "connected to .*via relay" "$work/killA.0" 2>/dev/null && break
  sleep 0.1
done
grep -q "connected to .*via relay" "$work/killA.0" || { tail -n 30 "$work"/killA.*; fail "kill: job A did not connect through relays in 30 s"; }
# Mid-transfer: once 256 MiB went out on n1's cable to n2 (about a fifth of that path's share).
tx() { ip netns exec "$tag-n1" cat /sys/class/net/to2/statistics/tx_bytes; }
t0=$(tx)
for _ in $(seq 1 600); do
  [ $(($(tx) - t0)) -gt $((256 << 20)) ] && break
  sleep 0.1
done
[ $(($(tx) - t0)) -gt $((256 << 20)) ] || fail "kill: job A moved under 256 MiB through n2 in 60 s"
start=$(date +%s%N)
# stop <signal> <label>: each rank of a job is the child of `timeout` (ip netns exec execs the
# bench): signal the bench by its PID, then `timeout`.
stop() {
  local sig="$1" label="$2" r victim c
  for r in 0 1; do
    victim=$(<"$work/$label.$r.pid")
    for c in $(ps -o pid= --ppid "$victim"); do kill "-$sig" "$c" 2>/dev/null || true; done
    kill "-$sig" "$victim" 2>/dev/null || true
  done
}
stop KILL killB
astatus=0
wait "$joba" || astatus=1
ms=$((($(date +%s%N) - start) / 1000000))
stop TERM killC
wait "$jobb" 2>/dev/null || true
wait "$jobc" 2>/dev/null || true
[ "$ms" -lt 100000 ] || fail "kill: job A took $ms ms after the kill"
if [ "$astatus" -ne 0 ]; then
  # It must fail naming the relay host (n2: 10.202.1.2 on n1's link, 10.202.2.1 on n3's).
  grep -h "10\.202\.1\.2\|10\.202\.2\.1" "$work/killA.0" "$work/killA.1" | grep -i "warn\|error" | head -n 3 | sed 's/^/    /' | cut -c1-300
  grep -h "error" "$work/killA.0" "$work/killA.1" | grep -q "10\.202\.1\.2\|10\.202\.2\.1" || {
    tail -n 20 "$work"/killA.*; fail "kill: job A failed without naming the relay host"; }
  echo "relay.sh: kill: job A failed $ms ms after the kill, naming the relay host"
else
  # The path through n2 failed over to the one through n4, on one end or both.
  grep -h "failing over" "$work/killA.0" "$work/killA.1" | grep "10\.202\.1\.2\|10\.202\.2\.1" | head -n 1 \
    | sed -E 's/.*NET\/switchless: /    /' | cut -c1-300 | grep . || { tail -n 20 "$work"/killA.*; fail "kill: no path through the relay n2 failed over"; }
  grep -q "data checks: all passed" "$work/killA.0" || fail "kill: job A passed without its data checks"
  echo "relay.sh: kill: job A completed $ms ms after the kill, over the relay through n4 (failover)"
fi

# --- measurement: relays vs the TCP fallback, same run ------------------------------------------------
if [ "$measure" = 1 ]; then
  busbw() { # label: rank 0's busbw (Gb/s) at the largest size
    grep -E '^ +[0-9]+ ' "$work/$1.0" | tail -n 1 | awk '{ print $8 }'
  }
  # relay_cpu <label> <nranks>: until $work/<label>.done exists, samples every rank's relay service
  # thread (comm `swl-relay<port>`) from /proc: "<utime+stime ticks> <thread life, ticks> <time on
  # a CPU, ns (schedstat: finer than the ticks)>" goes to
  # $work/<label>.<r>.relaycpu at each sample, so the last line written is the last sample before
  # the thread ended. Builtins only between the sleeps (no fork per sample but the sleep).
  relay_cpu() {
    local label="$1" nranks="$2" r t st fld up bench=() rest tp ns
    while [ ! -e "$work/$label.done" ]; do
      for ((r = 0; r < nranks; r++)); do
        if [ -z "${bench[r]:-}" ]; then
          # The rank's PID file holds `timeout`; the bench is its child (ip netns exec execs it).
          [ -e "$work/$label.$r.pid" ] || continue
          tp=$(<"$work/$label.$r.pid")
          read -r "bench[$r]" _ <"/proc/$tp/task/$tp/children" 2>/dev/null || true
          [ -n "${bench[r]:-}" ] || continue
        fi
        for t in /proc/"${bench[r]}"/task/*; do
          read -r st <"$t/comm" 2>/dev/null || continue
          [[ $st == swl-relay* ]] || continue
          read -r st <"$t/stat" 2>/dev/null || continue
          read -r up _ </proc/uptime
          ns=-1
          read -r ns _ <"$t/schedstat" 2>/dev/null || true
          rest=${st##*) }
          read -ra fld <<<"$rest"
          # Fields 14, 15 (utime, stime) and 22 (starttime) of stat; $rest starts at field 3.
          up=${up/./}
          echo "$((fld[11] + fld[12])) $((up * clk / 100 - fld[19])) $ns" >"$work/$label.$r.relaycpu"
        done
      done
      sleep 0.1
    done
  }
  clk=$(getconf CLK_TCK)
  m="-b 16777216 -e 16777216 -n ${SWL_MEASURE_ITERS:-20} -w 2"
  rm -f "$work/measure-relay.done"
  relay_cpu measure-relay 4 &
  poller=$!; pids+=("$poller")
  BENCH_ENV="NCCL_DEBUG=INFO" run_bench measure-relay alltoall "$m" -- "$tag-n1" "$tag-n2" "$tag-n3" "$tag-n4"
  touch "$work/measure-relay.done"; wait "$poller" || true
  [ "$status" -eq 0 ] || { tail -n 20 "$work"/measure-relay.*; fail "measure: alltoall through relays"; }
  BENCH_ENV="NCCL_DEBUG=INFO NCCL_SWITCHLESS_RELAY=off NCCL_SWITCHLESS_TCP_FALLBACK=1" \
    run_bench measure-fallback alltoall "$m" -- "$tag-n1" "$tag-n2" "$tag-n3" "$tag-n4"
  [ "$status" -eq 0 ] || { tail -n 20 "$work"/measure-fallback.*; fail "measure: alltoall over the fallback"; }
  r=$(busbw measure-relay); f=$(busbw measure-fallback)
  awk -v r="$r" -v f="$f" -v p="$profile" 'BEGIN { printf "relay.sh: measure (%s build) alltoall 4 ranks 16 MiB busbw: relays %.3f Gb/s, TCP fallback %.3f Gb/s, ratio %.2f\n", p, r, f, (f > 0 ? r / f : 0) }'
  # Relay cost per host: CPU from /proc (the thread's whole life, sampled), bytes forwarded from
  # the service's own count (RelayStats, logged when it stops at finalize: both directions,
  # frame headers included). Cores per 100 Gb/s = (CPU s / wall s) / (forwarded Gb/s / 100); the
  # wall time (the thread's life) cancels, so it is CPU seconds per 100 Gb forwarded.
  tcpu=0; tns=0; tbytes=0
  for r in 0 1 2 3; do
    [ -s "$work/measure-relay.$r.relaycpu" ] || fail "measure: rank $r: no relay thread (swl-relay*) seen in /proc"
    read -r ticks life ns <"$work/measure-relay.$r.relaycpu"
    line=$(grep -h "relay service on port .* stopped" "$work/measure-relay.$r" | tail -n 1)
    [ -n "$line" ] || fail "measure: rank $r: the relay service did not log its forwarded bytes at stop"
    mib=$(echo "$line" | sed -E 's/.*\(([0-9.]+) MiB\) forwarded.*/\1/')
    peak=$(echo "$line" | sed -E 's/.*peak staging ([0-9.]+) MiB.*/\1/')
    own=$(echo "$line" | sed -E 's/.*CPU ([0-9.]+) s.*/\1/')
    awk -v n="n$((r + 1))" -v t="$ticks" -v l="$life" -v c="$clk" -v m="$mib" -v p="$peak" -v o="$own" -v ns="$ns" 'BEGIN {
      cpu = t / c; wall = l / c; gbit = m * 1048576 * 8 / 1e9
      printf "relay.sh: measure: relay host %s: relay thread CPU %.2f s (utime+stime; on a CPU %.3f s by schedstat, %.3f s by the service) over %.2f s wall (%.3f cores), forwarded %.1f MiB (%.3f Gb/s), %.2f cores per 100 Gb/s (%.2f by schedstat), peak staging %.1f MiB\n",
        n, cpu, ns / 1e9, o, wall, cpu / wall, m, gbit / wall, (gbit > 0 ? cpu / (gbit / 100) : 0), (gbit > 0 && ns >= 0 ? ns / 1e9 / (gbit / 100) : -1), p }'
    tcpu=$((tcpu + ticks)); tns=$((tns + ns)); tbytes=$(awk -v a="$tbytes" -v m="$mib" 'BEGIN { printf "%.0f", a + m * 1048576 }')
  done
  awk -v t="$tcpu" -v c="$clk" -v b="$tbytes" -v p="$profile" -v ns="$tns" 'BEGIN {
    printf "relay.sh: measure (%s build): all relay hosts: %.2f CPU s (utime+stime; %.3f s by schedstat) for %.3f Gb forwarded: %.2f cores per 100 Gb/s (%.2f by schedstat)\n",
      p, t / c, ns / 1e9, b * 8 / 1e9, (b > 0 ? (t / c) / (b * 8 / 1e11) : 0), (b > 0 ? (ns / 1e9) / (b * 8 / 1e11) : 0) }'
fi
echo "relay.sh: ok"
