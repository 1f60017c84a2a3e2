#!/usr/bin/env bash
# TCP paths between network namespaces joined by veth pairs (no VMs, no RDMA):
#
#   * a 3-node full mesh (links 1-2, 1-3, 2-3) and a 4-node ring (1-2, 2-3, 3-4, 4-1);
#   * every veth pair is its own /30: 10.200.L.1 on the lower node, 10.200.L.2 on the higher one, MTU 9000;
#   * on every link, in both directions, the payload (default: examples/tcp_pair, the transport protocol
#     over TcpFabric) moves data between the two namespaces and verifies it;
#   * a ring non-neighbour (1 -> 3, 2 -> 4) has no route: the connector must fail fast with a clear error;
#   * --bench: iperf3 and tcp_pair on the same veth link in the same run, 1 stream and N streams, and the
#     ratios tcp_pair / iperf3 (printed, never asserted).
#
# Usage: tests/netns/mesh.sh [--bench] [--streams N] [--bin PATH]
#   SWL_NETNS_PAYLOAD=/path/to/cmd swaps the payload: it is called as
#     cmd serve   <local-ip> <peer-ip> <port>     (in the receiving namespace, must exit 0 when all data verified)
#     cmd connect <local-ip> <peer-ip> <port>     (in the sending namespace)
#   SWL_NETNS_PROBE=/path/to/cmd swaps the non-neighbour probe: cmd <local-ip> <peer-ip> <port> must fail fast
#     and name the missing route ("unreachable" or "no route").
#   so the lead can later run `switchless bench` through the plugin ABI instead.
# Needs root, iproute2 (ip, ss), and for --bench iperf3, jq and /usr/bin/time (package time). Everything created is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

bench=0
streams=4
bin=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bench) bench=1 ;;
    --streams) streams="$2"; shift ;;
    --bin) bin="$2"; shift ;;
    *) echo "mesh.sh: unknown argument $1 (accepted: --bench, --streams N, --bin PATH)" >&2; exit 2 ;;
  esac
  shift
done

[ "$(id -u)" -eq 0 ] || { echo "mesh.sh: needs root to create network namespaces" >&2; exit 1; }
for tool in ip ss; do
  command -v "$tool" >/dev/null || { echo "mesh.sh: $tool is missing (iproute2)" >&2; exit 1; }
done
if [ "$bench" = 1 ]; then
  for tool in iperf3 jq /usr/bin/time; do
    command -v "$tool" >/dev/null || { echo "mesh.sh: $tool is missing; run scripts/deps.sh" >&2; exit 1; }
  done
fi

if [ -z "$bin" ]; then
  # Debug build for the functional runs (already built by `cargo test --all-targets`); release to measure.
  if [ "$bench" = 1 ]; then
    cargo build --quiet --release --example tcp_pair
    bin="${CARGO_TARGET_DIR:-target}/release/examples/tcp_pair"
  else
    cargo build --quiet --example tcp_pair
    bin="${CARGO_TARGET_DIR:-target}/debug/examples/tcp_pair"
  fi
fi
[ -x "$bin" ] || { echo "mesh.sh: $bin is not executable" >&2; exit 1; }
bin=$(readlink -f "$bin")

me=mesh.sh
# shellcheck source=tests/netns/lib.sh
. tests/netns/lib.sh
work=$(mktemp -d)
netns_start "swl$$"

mkns() {
  ip netns add "$1"
  namespaces+=("$1")
  ip -n "$1" link set lo up
}

# link <nsA> <nsB> <L> <devA> <devB>: veth pair, 10.200.L.1/30 on A, 10.200.L.2/30 on B, MTU 9000.
link() { netns_link "$@" 200; }

default_payload() {
  local role="$1" local_ip="$2" peer_ip="$3" port="$4"
  case "$role" in
    serve) exec "$bin" serve --local "$local_ip" --peer "$peer_ip" --port "$port" --timeout 20 ;;
    connect) exec "$bin" connect --local "$local_ip" --remote "$peer_ip" --port "$port" \
      --streams "$streams" --bytes 3000017 --iters 24 --depth 4 --verify-all --timeout 20 ;;
  esac
}

payload() {
  if [ -n "${SWL_NETNS_PAYLOAD:-}" ]; then
    "$SWL_NETNS_PAYLOAD" "$@"
  else
    default_payload "$@"
  fi
}

wait_listen() {
  local ns="$1" port="$2"
  for _ in $(seq 1 200); do
    ip netns exec "$ns" ss -Hltn "sport = :$port" | grep -q . && return 0
    sleep 0.05
  done
  return 1
}

port=5400
# pair <nsSend> <ipSend> <nsRecv> <ipRecv> <what>: payload from the sender to the receiver over one link.
pair() {
  local sns="$1" sip="$2" rns="$3" rip="$4" what="$5" srv_pid rc
  port=$((port + 2))
  ip netns exec "$rns" bash -c "$(declare -f default_payload payload); bin=$bin; streams=$streams; SWL_NETNS_PAYLOAD='${SWL_NETNS_PAYLOAD:-}'; payload serve $rip $sip $port" \
    >"$work/srv.out" 2>&1 &
  srv_pid=$!
  pids+=("$srv_pid")
  wait_listen "$rns" "$port" || fail "$what: the receiver never listened on $rip:$port: $(cat "$work/srv.out")"
  if ! timeout 60 ip netns exec "$sns" bash -c "$(declare -f default_payload payload); bin=$bin; streams=$streams; SWL_NETNS_PAYLOAD='${SWL_NETNS_PAYLOAD:-}'; payload connect $sip $rip $port" \
    >"$work/cli.out" 2>&1; then
    kill "$srv_pid" 2>/dev/null || true
    fail "$what: sender failed: $(cat "$work/cli.out")"
  fi
  rc=0
  wait "$srv_pid" || rc=$?
  [ "$rc" -eq 0 ] || fail "$what: receiver failed (exit $rc): $(cat "$work/srv.out")"
  echo "mesh.sh: $what: $(grep -h 'OK' "$work/srv.out" | tail -1)"
}

# --- 3-node full mesh ---------------------------------------------------------------------------
for n in 1 2 3; do mkns "$tag-m$n"; done
link "$tag-m1" "$tag-m2" 1 to2 to1
link "$tag-m1" "$tag-m3" 2 to3 to1
link "$tag-m2" "$tag-m3" 3 to3 to2
for l in "1 1 2" "2 1 3" "3 2 3"; do
  read -r L A B <<<"$l"
  set -- "$L" "$A" "$B"
  pair "$tag-m$2" "10.200.$1.1" "$tag-m$3" "10.200.$1.2" "mesh link $1 (node $2 -> node $3)"
  pair "$tag-m$3" "10.200.$1.2" "$tag-m$2" "10.200.$1.1" "mesh link $1 (node $3 -> node $2)"
done

# --- 4-node ring --------------------------------------------------------------------------------
for n in 1 2 3 4; do mkns "$tag-r$n"; done
link "$tag-r1" "$tag-r2" 11 to2 to1
link "$tag-r2" "$tag-r3" 12 to3 to2
link "$tag-r3" "$tag-r4" 13 to4 to3
link "$tag-r1" "$tag-r4" 14 to4 to1
for l in "11 1 2" "12 2 3" "13 3 4" "14 1 4"; do
  read -r L A B <<<"$l"
  set -- "$L" "$A" "$B"
  pair "$tag-r$2" "10.200.$1.1" "$tag-r$3" "10.200.$1.2" "ring link $1 (node $2 -> node $3)"
  pair "$tag-r$3" "10.200.$1.2" "$tag-r$2" "10.200.$1.1" "ring link $1 (node $3 -> node $2)"
done

# Non-neighbours: node 1 -> node 3 (10.200.12.2 / 10.200.13.1), node 2 -> node 4 (10.200.13.2 / 10.200.14.2).
# "Fast" means before the probe's own connect timeout, which a connector retrying an unreachable peer
# would run into: the kernel refuses at once (ENETUNREACH, "unreachable"/"no route"), while a wait ends
# in a timeout error after PROBE_TIMEOUT s. The bound, half of that, includes `ip netns exec` and the
# start of a debug binary on a loaded host, which take well under a second.
PROBE_TIMEOUT=30
nonneighbour() {
  local ns="$1" local_ip="$2" peer_ip="$3" what="$4" start end out cmd
  start=$(date +%s%N)
  if [ -n "${SWL_NETNS_PROBE:-}" ]; then
    cmd=("$SWL_NETNS_PROBE" "$local_ip" "$peer_ip" 5399)
  else
    cmd=("$bin" probe --local "$local_ip" --remote "$peer_ip" --port 5399 --timeout "$PROBE_TIMEOUT")
  fi
  if out=$(timeout $((PROBE_TIMEOUT * 2)) ip netns exec "$ns" "${cmd[@]}" 2>&1); then
    fail "$what: connecting to a non-neighbour succeeded"
  fi
  end=$(date +%s%N)
  echo "$out" | grep -qi "unreachable\|no route" || fail "$what: error does not name the missing route: $out"
  [ $(((end - start) / 1000000)) -lt $((PROBE_TIMEOUT * 1000 / 2)) ] ||
    fail "$what: took $(((end - start) / 1000000)) ms to fail (expected well before the ${PROBE_TIMEOUT} s timeout)"
  echo "mesh.sh: $what: fails fast ($(((end - start) / 1000000)) ms): $out"
}
nonneighbour "$tag-r1" 10.200.11.1 10.200.12.2 "ring non-neighbour 1 -> 3"
nonneighbour "$tag-r2" 10.200.12.1 10.200.14.2 "ring non-neighbour 2 -> 4"

# --- benchmark: iperf3 and tcp_pair on mesh link 1 --------------------------------------------------
if [ "$bench" = 1 ]; then
  secs="${SWL_BENCH_SECONDS:-5}"
  # Each run sets res="<Gb/s at the receiver> <CPU seconds of both ends per GB of payload>".
  iperf() {
    local par="$1" p sp
    port=$((port + 2)); p=$port
    ip netns exec "$tag-m2" /usr/bin/time -f '%U %S' -o "$work/cpu.srv" iperf3 -s -1 -B 10.200.1.2 -p "$p" >/dev/null 2>&1 &
    sp=$!; pids+=("$sp")
    wait_listen "$tag-m2" "$p" || fail "iperf3 server did not start"
    ip netns exec "$tag-m1" /usr/bin/time -f '%U %S' -o "$work/cpu.cli" \
      iperf3 -c 10.200.1.2 -B 10.200.1.1 -p "$p" -P "$par" -t "$secs" -l 1M -J >"$work/iperf.json"
    wait "$sp" 2>/dev/null || true
    res=$(awk -v r="$(jq '.end.sum_received.bits_per_second / 1e9' "$work/iperf.json")" \
      -v b="$(jq '.end.sum_received.bytes' "$work/iperf.json")" \
      -v c="$(cat "$work/cpu.srv" "$work/cpu.cli" | awk '{ s += $1 + $2 } END { print s }')" \
      'BEGIN { printf "%.2f %.3f\n", r, c / (b / 1e9) }')
  }
  ours() {
    local st="$1" bytes=4194304 iters sp rate
    # Size the run like iperf3's: the measured rate of a short run × seconds.
    port=$((port + 2))
    ip netns exec "$tag-m2" "$bin" serve --local 10.200.1.2 --port "$port" --timeout 30 >"$work/srv.out" 2>&1 &
    sp=$!; pids+=("$sp")
    wait_listen "$tag-m2" "$port" || fail "tcp_pair server did not start"
    ip netns exec "$tag-m1" "$bin" connect --local 10.200.1.1 --remote 10.200.1.2 --port "$port" --streams "$st" \
      --bytes "$bytes" --iters 100 --depth 8 --timeout 30 >/dev/null 2>&1 || fail "tcp_pair calibration failed"
    wait "$sp" || fail "tcp_pair calibration receiver failed: $(cat "$work/srv.out")"
    rate=$(sed -n 's/.*: \([0-9.]*\) Gb\/s$/\1/p' "$work/srv.out")
    iters=$(awk -v r="$rate" -v s="$secs" -v b="$bytes" 'BEGIN { n = int(r * 1e9 / 8 * s / b); if (n < 50) n = 50; print n }')
    port=$((port + 2))
    ip netns exec "$tag-m2" /usr/bin/time -f '%U %S' -o "$work/cpu.srv" \
      "$bin" serve --local 10.200.1.2 --port "$port" --timeout 60 >"$work/srv.out" 2>&1 &
    sp=$!; pids+=("$sp")
    wait_listen "$tag-m2" "$port" || fail "tcp_pair server did not start"
    ip netns exec "$tag-m1" /usr/bin/time -f '%U %S' -o "$work/cpu.cli" \
      "$bin" connect --local 10.200.1.1 --remote 10.200.1.2 --port "$port" --streams "$st" \
      --bytes "$bytes" --iters "$iters" --depth 8 --timeout 60 >/dev/null 2>&1 || fail "tcp_pair run failed"
    wait "$sp" || fail "tcp_pair receiver failed: $(cat "$work/srv.out")"
    res=$(awk -v r="$(sed -n 's/.*: \([0-9.]*\) Gb\/s$/\1/p' "$work/srv.out")" -v b="$((iters * bytes))" \
      -v c="$(cat "$work/cpu.srv" "$work/cpu.cli" | awk '{ s += $1 + $2 } END { print s }')" \
      'BEGIN { printf "%.2f %.3f\n", r, c / (b / 1e9) }')
  }
  reps="${SWL_BENCH_REPEAT:-3}"
  median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
  declare -A rate cpu
  # Alternate the tools so that load from other processes hits both alike.
  for _ in $(seq 1 "$reps"); do
    for run in "iperf 1" "ours 1" "iperf $streams" "ours $streams"; do
      $run
      read -r r c <<<"$res"
      rate[$run]+=" $r"; cpu[$run]+=" $c"
    done
  done
  printf 'mesh.sh: bench on veth (MTU 9000), %s s per run, median of %s alternating runs\n' "$secs" "$reps"
  printf 'mesh.sh: bench   Gb/s = 10^9 bit/s of payload at the receiver; CPU = user+system seconds of both ends per GB (10^9 bytes) of payload\n'
  for n in 1 "$streams"; do
    i=$(echo "${rate[iperf $n]}" | median); o=$(echo "${rate[ours $n]}" | median)
    ic=$(echo "${cpu[iperf $n]}" | median); oc=$(echo "${cpu[ours $n]}" | median)
    printf 'mesh.sh: bench runs %2s stream(s): iperf3 Gb/s [%s ] CPU [%s ]; tcp_pair Gb/s [%s ] CPU [%s ]\n' \
      "$n" "${rate[iperf $n]}" "${cpu[iperf $n]}" "${rate[ours $n]}" "${cpu[ours $n]}"
    printf 'mesh.sh: bench %2s stream(s): iperf3 %6.2f Gb/s %.3f CPU s/GB | tcp_pair %6.2f Gb/s %.3f CPU s/GB | ratio tcp_pair/iperf3 %.2f (CPU %.2f)\n' \
      "$n" "$i" "$ic" "$o" "$oc" "$(awk -v a="$o" -v b="$i" 'BEGIN{print a/b}')" "$(awk -v a="$oc" -v b="$ic" 'BEGIN{print a/b}')"
  done
fi
echo "mesh.sh: ok"
