#!/usr/bin/env bash
# `switchless bench` through the plugin .so between two network namespaces joined by a veth /30, while a
# hostile client in a third namespace (tests/netns/hostile.py) attacks every port rank 0 listens on:
# malformed hellos and frames, garbage, a silent flood from several source addresses, slow writers,
# connects from a spoofed source (rank 1's address). The ranks must still complete their verified
# transfers, and the client must have reached at least one of the plugin's listeners.
#
#   ns a (rank 0): 10.203.0.1/30 to ns b, 10.203.1.1/24 to ns c; ephemeral ports 40000-40199, so
#                  every listener the plugin opens is in the range the client scans
#   ns b (rank 1): 10.203.0.2/30
#   ns c (client): 10.203.1.2-4/24, a route to 10.203.0.0/30 through ns a, and 10.203.0.2/32 (spoof)
#
# Usage: tests/netns/hostile.sh   (needs root, iproute2 and python3; everything created is removed)
set -euo pipefail
cd "$(dirname "$0")/../.."

[ "$(id -u)" -eq 0 ] || { echo "hostile.sh: needs root to create network namespaces" >&2; exit 1; }
for t in ip python3; do command -v "$t" >/dev/null || { echo "hostile.sh: $t is missing" >&2; exit 1; }; done

target="${CARGO_TARGET_DIR:-target}"
cargo build --quiet --lib --bin switchless
bin=$(readlink -f "$target/debug/switchless")
work=$(mktemp -d)
cp "$target/debug/libswitchless.so" "$work/libnccl-net-switchless.so"
so="$work/libnccl-net-switchless.so"

tag="swh$$"
a="$tag-a" b="$tag-b" c="$tag-c"
namespaces=()
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
fail() { echo "hostile.sh: FAIL: $*" >&2; exit 1; }

for ns in "$a" "$b" "$c"; do
  ip netns add "$ns"; namespaces+=("$ns")
  ip -n "$ns" link set lo up
done
ip link add "$tag-ab" type veth peer name "$tag-ba"
ip link set "$tag-ab" netns "$a"
ip link set "$tag-ba" netns "$b"
ip -n "$a" link set "$tag-ab" name tob
ip -n "$b" link set "$tag-ba" name toa
ip -n "$a" addr add 10.203.0.1/30 dev tob
ip -n "$b" addr add 10.203.0.2/30 dev toa
ip link add "$tag-ac" type veth peer name "$tag-ca"
ip link set "$tag-ac" netns "$a"
ip link set "$tag-ca" netns "$c"
ip -n "$a" link set "$tag-ac" name toc
ip -n "$c" link set "$tag-ca" name toa
ip -n "$a" addr add 10.203.1.1/24 dev toc
for n in 2 3 4; do ip -n "$c" addr add "10.203.1.$n/24" dev toa; done
ip -n "$c" addr add 10.203.0.2/32 dev toa
for ns in "$a" "$b" "$c"; do
  for d in $(ip -n "$ns" -o link show | awk -F': ' '$2 != "lo" {sub(/@.*/, "", $2); print $2}'); do
    ip -n "$ns" link set "$d" up
  done
done
ip -n "$c" route add 10.203.0.0/30 via 10.203.1.1
ip netns exec "$a" sysctl -qw net.ipv4.ip_local_port_range="40000 40199"

bport=29700
ip netns exec "$c" python3 tests/netns/hostile.py --target 10.203.0.1 --ports 40000-40199 --skip "$bport" \
  --sources 10.203.1.2,10.203.1.3,10.203.1.4 --spoof 10.203.0.2 --ready "$work/ready" \
  --stop "$work/stop" --report "$work/attack.json" 2>"$work/attacker.err" &
attacker=$!
pids+=("$attacker")
for _ in $(seq 100); do [ -e "$work/ready" ] && break; sleep 0.1; done
[ -e "$work/ready" ] || fail "the hostile client did not start: $(cat "$work/attacker.err")"

# run <label> <mode> <bench args>: both ranks at once, bounded by `timeout`.
run() {
  local label="$1" mode="$2" extra="$3" r p ns status=0 list=()
  bport=$((bport + 1))
  for r in 0 1; do
    ns="$a"; [ "$r" = 1 ] && ns="$b"
    # shellcheck disable=SC2086
    timeout 60 ip netns exec "$ns" env NCCL_SWITCHLESS_TRANSPORT=tcp "$bin" bench "$mode" --rank "$r" \
      --nranks 2 --bootstrap "10.203.0.1:$bport" --plugin "$so" --timeout 30 --no-progress $extra \
      >"$work/$label.$r" 2>&1 &
    list+=($!); pids+=($!)
  done
  for p in "${list[@]}"; do wait "$p" || status=1; done
  if [ "$status" -ne 0 ]; then
    for f in "$work/$label".*; do echo "--- $f"; tail -n 30 "$f"; done
    fail "$label: the ranks did not complete under attack"
  fi
  echo "hostile.sh: $label under attack: ok"
}

for i in 1 2 3; do
  run "bandwidth$i" bandwidth "-b 8 -e 1048576 -n 3"
  run "alltoall$i" alltoall "-b 8 -e 65536 -n 3"
done
touch "$work/stop"
wait "$attacker" || fail "the hostile client failed: $(cat "$work/attacker.err")"
pids=()
report=$(cat "$work/attack.json")
echo "hostile.sh: client: $report"
python3 - "$work/attack.json" <<'PY' || fail "the hostile client never reached a plugin listener: $report"
import json, sys
r = json.load(open(sys.argv[1]))
sys.exit(0 if r["ports_hit"] and r["garbage_frames"] > 0 else 1)
PY
if grep -l "panicked" "$work"/*.0 "$work"/*.1 >/dev/null 2>&1; then fail "a rank panicked"; fi
# Every connection the listeners drop, refuse or reject is logged within one process-wide limit (10
# WARN lines per 10 s, transport/droplog.rs), whichever thread logged it: the bench prints the lines of
# the plugin's TCP I/O threads too. A run lasts at most its 30 s timeout: 3 intervals.
for f in "$work"/*.0 "$work"/*.1; do
  n=$(grep "WARN" "$f" | grep -cE "refused|dropped|rejected" || true)
  echo "hostile.sh: $(basename "$f"): $n drop WARN lines"
  [ "$n" -le 30 ] || { grep "WARN" "$f" | head -40; fail "$(basename "$f"): $n drop WARN lines, over the process-wide limit"; }
done
echo "hostile.sh: ok"
