#!/usr/bin/env bash
# TCP failover and failback through the plugin .so between two network namespaces joined by TWO
# veth links (two /30s, MTU 9000) and a management veth (a /24: bootstrap only, never a data path):
#
#   * `switchless bench bandwidth` rank 0 -> rank 1 (1 MiB messages, the bench's data checks on),
#     NCCL_DEBUG=INFO;
#   * mid-run the carrying link is set down in namespace A (B's end loses carrier: neither end's
#     TCP notices for minutes; the plugin reads the carrier), later up again; or, with
#     SWL_FAILOVER_FAULT=blackhole, A's frames on it go to a MAC nobody has (a static neighbour
#     entry: the carrier stays up, B drops them) until the entry is removed: the streams' TCP user
#     timeout (NCCL_SWITCHLESS_TCP_USER_TIMEOUT, 2 s here) notices;
#   * the run must complete on both ranks, and the logs must show the failover WARN (on the
#     sender) and the failback INFO line ("is back and carries traffic again") on both ranks;
#   * the plugin's metrics (NCCL_SWITCHLESS_METRICS_DIR, read by `switchless watch --metrics-dir`)
#     show the failover and failback of d0 with their times, and the sender's bytes per path add up
#     to the bytes the bench moved through the plugin (with jq).
#
# Prints the time from `link set down` to the failover WARN and from `link set up` to the failback
# INFO line (the log files are polled every 10 ms: the figures are upper bounds, ±10 ms), and how
# long the bench ran.
#
# Slow is not stalled: the debug build checks every byte, tens of ms per 1 MiB message on a starved
# CPU, so a run may take minutes; the bench's --timeout bounds each window of messages, not the
# run. A stall is caught here instead: once the link is back, the run fails as soon as the
# receiving namespace's TCP sockets take in no byte for SWL_FAILOVER_STALL_S seconds (default 20).
# On any failure the logs (both ranks, and both namespaces' sockets at that moment) are kept in a
# directory the last line names (under SWL_FAILOVER_KEEP, default /tmp).
# Usage: tests/netns/failover.sh [--release] (SWL_FAILOVER_ITERS: messages, default 1500;
# SWL_FAILOVER_DOWN_S: seconds the link stays down, default 2). Needs root and iproute2; removes what it creates.
set -euo pipefail
cd "$(dirname "$0")/../.."

profile=debug
[ "${1:-}" = --release ] && profile=release
me=failover.sh
# shellcheck source=tests/netns/lib.sh
. tests/netns/lib.sh
netns_require
netns_build "$profile"

tag="swf$$"
a="$tag-a"
b="$tag-b"
pids=()
kept=""
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
  rm -f "$so"
  if [ -n "$kept" ]; then
    mv "$work" "$kept" && echo "failover.sh: logs kept in $kept" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT INT TERM
fail() {
  for ns in "$a" "$b"; do
    echo "=== $ns"
    ss -N "$ns" -tinmoe 2>/dev/null || true
  done >"$work/sockets.txt"
  for f in "$work"/rank.*; do echo "--- $f"; grep -v "^\s*$" "$f" | tail -n 25; done
  echo "failover.sh: FAIL: $*" >&2
  keep
  exit 1
}
keep() { kept="${SWL_FAILOVER_KEEP:-/tmp}/failover-$fault-$(date +%Y%m%d-%H%M%S)-$$"; }
fault="${SWL_FAILOVER_FAULT:-down}"
# A command that fails outside the checks (errexit) says where, and the logs are kept.
trap 'echo "failover.sh: FAIL: line $LINENO: a command failed (status $?)" >&2; keep' ERR
ip netns add "$a"
ip netns add "$b"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
# pair <name A> <name B> <addr A> <addr B> <mtu>
pair() {
  ip link add "$tag-x" type veth peer name "$tag-y"
  ip link set "$tag-x" netns "$a"
  ip link set "$tag-y" netns "$b"
  ip -n "$a" link set "$tag-x" name "$1"
  ip -n "$b" link set "$tag-y" name "$2"
  ip -n "$a" link set "$1" mtu "$5" up
  ip -n "$b" link set "$2" mtu "$5" up
  ip -n "$a" addr add "$3" dev "$1"
  ip -n "$b" addr add "$4" dev "$2"
}
pair mgmt mgmt 192.168.202.1/24 192.168.202.2/24 1500
pair d0 d0 10.202.1.1/30 10.202.1.2/30 9000
pair d1 d1 10.202.2.1/30 10.202.2.2/30 9000

# Failback probes: 100 ms doubling for 5 tries, then every 1 s (the default is 5 s).
env_common="NCCL_DEBUG=INFO NCCL_SWITCHLESS_TRANSPORT=tcp NCCL_SWITCHLESS_FAILBACK_INTERVAL=1s"
case "$fault" in
  down) ;;
  blackhole) env_common="$env_common NCCL_SWITCHLESS_TCP_USER_TIMEOUT=2s" ;;
  *) echo "failover.sh: SWL_FAILOVER_FAULT=$fault (accepted: down, blackhole)" >&2; exit 2 ;;
esac
iters="${SWL_FAILOVER_ITERS:-1500}"
r=0
started=$(date +%s%N)
for ns in "$a" "$b"; do
  mkdir -p "$work/m$r"
  # shellcheck disable=SC2086
  timeout 270 ip netns exec "$ns" env $env_common NCCL_SWITCHLESS_METRICS_DIR="$work/m$r" \
    "$bin" bench bandwidth --rank "$r" --nranks 2 \
    --bootstrap 192.168.202.1:29710 --plugin "$so" --timeout 60 --no-progress --dev 0 \
    -b 1M -e 1M -n "$iters" -w 50 --save-json "$work/bw$r.json" >"$work/rank.$r" 2>&1 &
  pids+=($!)
  r=$((r + 1))
done

now_ms() { echo $(($(date +%s%N) / 1000000)); }
# wait_for <pattern> <file> <limit ms>: polls every 10 ms; prints the ms waited, fails at the limit.
wait_for() {
  local t0 t
  t0=$(now_ms)
  while ! grep -q -- "$1" "$2" 2>/dev/null; do
    t=$(now_ms)
    [ $((t - t0)) -lt "$3" ] || return 1
    sleep 0.01
  done
  echo $(($(now_ms) - t0))
}

# Traffic first: the warm-up is over when the path INFO lines are out and a second has passed.
wait_for "TCP path tcp0" "$work/rank.0" 30000 >/dev/null || fail "rank 0 never connected its TCP paths"
sleep 1.5
for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || fail "a rank ended before the fault (raise SWL_FAILOVER_ITERS?)"; done
if [ "$fault" = down ]; then
  ip -n "$a" link set d0 down
else
  ip -n "$a" neigh replace 10.202.1.2 lladdr 02:00:5e:00:53:99 dev d0 nud permanent
fi
warn_ms=$(wait_for "failed (.*failing over to" "$work/rank.0" 20000) || fail "no failover WARN on rank 0 within 20 s"
sleep "${SWL_FAILOVER_DOWN_S:-2}"
for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || fail "a rank ended while the link was down (raise SWL_FAILOVER_ITERS?)"; done
if [ "$fault" = down ]; then
  ip -n "$a" link set d0 up
else
  ip -n "$a" neigh del 10.202.1.2 dev d0
fi
back0=$(wait_for "is back and carries traffic again" "$work/rank.0" 20000) || fail "no failback INFO on rank 0 within 20 s"
back1=$(wait_for "is back and carries traffic again" "$work/rank.1" 20000) || fail "no failback INFO on rank 1 within 20 s"

# Bytes the receiving namespace's TCP sockets have taken in (streams replaced at failover and
# failback drop out of the sum: any change is progress). Never fails (errexit, pipefail): once the
# ranks close their sockets there is nothing to sum.
rx_bytes() {
  { ss -N "$b" -tinH 2>/dev/null || true; } |
    awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^bytes_received:/) { split($i, kv, ":"); s += kv[2] } }
      END { print s + 0 }'
}
stall_s="${SWL_FAILOVER_STALL_S:-20}"
seen=$(rx_bytes)
moved=$(date +%s)
while :; do
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ "$alive" -eq 1 ] || break
  now=$(rx_bytes)
  if [ "$now" != "$seen" ]; then
    seen=$now
    moved=$(date +%s)
  elif [ $(($(date +%s) - moved)) -ge "$stall_s" ]; then
    fail "stalled: the receiver took in no byte for ${stall_s} s after failback"
  fi
  sleep 0.5
done
ran_ms=$((($(date +%s%N) - started) / 1000000))
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
[ "$status" -eq 0 ] || fail "the bench did not complete on both ranks (it ran ${ran_ms} ms)"
grep -q "data checks: all passed" "$work/rank.0" || fail "rank 0 does not report its data checks passed"
grep -q "all data checks passed" "$work/rank.1" || fail "rank 1 does not report its data checks passed"
grep -q "WARN.*path \[0\].*failed (.*failing over to" "$work/rank.0" || fail "rank 0's failover line is not a WARN about path [0]"
grep -q "INFO.*path \[0\].*is back and carries traffic again" "$work/rank.1" || fail "rank 1's failback line is not an INFO about path [0]"
# The plugin's counters saw it too: on the sender, path d0 failed over and came back (with both
# times), and the bytes per path add up to what the bench moved through the plugin (re-sent pieces
# count once, where they landed).
"$bin" watch --metrics-dir "$work/m0" --once --interval 0.05 --json >"$work/watch0.json" || fail "watch --metrics-dir"
if command -v jq >/dev/null; then
  d0=$(jq -c '[.plugin.paths[] | select(.direction == "send" and .netdev == "d0")][0]' "$work/watch0.json")
  [ "$(jq '.failovers >= 1 and .failbacks >= 1 and .last_failover_unix_ms != null and .last_failback_unix_ms != null' <<< "$d0")" = true ] ||
    fail "the counters of d0 show no failover and failback: $d0"
  got=$(jq '[.plugin.paths[] | select(.direction == "send") | .sent_bytes] | add' "$work/watch0.json")
  want=$(jq '.plugin_bytes.sent_bytes' "$work/bw0.json")
  [ "$got" = "$want" ] || fail "the send paths' bytes ($got) are not the bench's ($want)"
  echo "    metrics: d0 failovers/failbacks $(jq -r '"\(.failovers)/\(.failbacks)"' <<< "$d0"); sent per path: $(jq -r '[.plugin.paths[] | select(.direction == "send") | "\(.netdev) \(.sent_bytes)"] | join(", ")' "$work/watch0.json") = bench $want B"
fi
grep -h "failing over to" "$work"/rank.* | head -n 2 | cut -c1-300 | sed 's/^/    /'
grep -h "is back and carries traffic again" "$work"/rank.* | head -n 2 | cut -c1-300 | sed 's/^/    /'
grep -h "new streams connected" "$work"/rank.* | head -n 2 | cut -c1-300 | sed 's/^/    /'
grep -v "^\s*$" "$work/rank.0" | tail -n 4 | sed 's/^/    /'
echo "failover.sh: $fault: fault -> failover WARN on the sender: ${warn_ms} ms; repaired -> failback INFO: rank 0 ${back0} ms, rank 1 ${back1} ms (+${back0} ms); the bench ran ${ran_ms} ms"
echo "failover.sh: ok"
