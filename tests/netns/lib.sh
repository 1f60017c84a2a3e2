# shellcheck shell=bash disable=SC2034,SC2154
# Shared by the network-namespace tests: sourced after `set -euo pipefail` and a `cd` to the
# repository root, with `me` set to the script's name (it prefixes every message).
#
#   netns_require                 root and iproute2, or a clear error
#   netns_build PROFILE           builds the plugin .so and the CLI; sets $bin, $work (a temporary
#                                 folder, removed on exit unless KEEP_WORK=1) and $so
#   netns_start TAG               $tag, the namespaces and PIDs to clean up, the exit trap
#   netns_hub                     the hub namespace: a bridge for every node's management veth
#   netns_node NS N NET           a node with 192.168.NET.N/24 on the hub bridge (device mgmt)
#   netns_link A B L DA DB NET    a veth cable, 10.NET.L.1/30 on A (device DA), .2/30 on B, MTU 9000
#   fail MESSAGE                  prints "$me: FAIL: MESSAGE" and exits 1
# A rank started in a background subshell is known by its PID file, $work/*.pid: the cleanup ends
# its children and it.

# netns_args "$@": the relay scripts' options, --release (profile=release, else debug) and
# --measure (measure=1, else 0); anything else is refused, naming what is accepted.
netns_args() {
  profile=debug
  measure=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --release) profile=release ;;
      --measure) measure=1 ;;
      *) echo "$me: unknown argument $1 (accepted: --release, --measure)" >&2; exit 2 ;;
    esac
    shift
  done
}

netns_require() {
  [ "$(id -u)" -eq 0 ] || { echo "$me: needs root to create network namespaces" >&2; exit 1; }
  command -v ip >/dev/null || { echo "$me: ip is missing (iproute2)" >&2; exit 1; }
}

netns_build() {
  local profile="$1" target="${CARGO_TARGET_DIR:-target}"
  if [ "$profile" = release ]; then
    cargo build --quiet --release --lib --bin switchless
  else
    cargo build --quiet --lib --bin switchless
  fi
  bin=$(readlink -f "$target/$profile/switchless")
  work=$(mktemp -d)
  cp "$target/$profile/libswitchless.so" "$work/libnccl-net-switchless.so"
  so="$work/libnccl-net-switchless.so"
}

netns_cleanup() {
  local f p c
  for f in "$work"/*.pid; do
    [ -e "$f" ] || continue
    p=$(<"$f")
    for c in $(ps -o pid= --ppid "$p"); do kill "$c" 2>/dev/null || true; done
    kill "$p" 2>/dev/null || true
  done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  if [ -n "${KEEP_WORK:-}" ]; then echo "$me: outputs kept in $work" >&2; else rm -rf "$work"; fi
}

netns_start() {
  tag="$1"
  namespaces=()
  pids=()
  trap netns_cleanup EXIT INT TERM
}

fail() { echo "$me: FAIL: $*" >&2; exit 1; }

netns_hub() {
  hub="$tag-hub"
  ip netns add "$hub"; namespaces+=("$hub")
  ip -n "$hub" link set lo up
  ip -n "$hub" link add br0 type bridge
  ip -n "$hub" link set br0 up
}

netns_node() {
  local ns="$1" n="$2" net="$3"
  ip netns add "$ns"; namespaces+=("$ns")
  ip -n "$ns" link set lo up
  ip link add "$tag-g$n" type veth peer name "$tag-h$n"
  ip link set "$tag-g$n" netns "$ns"
  ip link set "$tag-h$n" netns "$hub"
  ip -n "$ns" link set "$tag-g$n" name mgmt
  ip -n "$ns" link set mgmt up
  ip -n "$ns" addr add "192.168.$net.$n/24" dev mgmt
  ip -n "$hub" link set "$tag-h$n" master br0 up
}

# netns_ring4 <net>: nodes $tag-n1..4 on the hub (192.168.<net>.N) with ip_forward off, cabled in
# a ring n1-n2-n3-n4-n1 (links 1-4: 10.<net>.L.1/30 and .2, devices to<peer>): a relay is then
# the only way between non-neighbours. Checks that no node forwards.
netns_ring4() {
  local net="$1" n
  for n in 1 2 3 4; do
    netns_node "$tag-n$n" "$n" "$net"
    ip netns exec "$tag-n$n" sysctl -q -w net.ipv4.ip_forward=0
  done
  netns_link "$tag-n1" "$tag-n2" 1 to2 to1 "$net"
  netns_link "$tag-n2" "$tag-n3" 2 to3 to2 "$net"
  netns_link "$tag-n3" "$tag-n4" 3 to4 to3 "$net"
  netns_link "$tag-n1" "$tag-n4" 4 to4 to1 "$net"
  for n in 1 2 3 4; do
    [ "$(ip netns exec "$tag-n$n" sysctl -n net.ipv4.ip_forward)" = 0 ] || fail "n$n forwards"
  done
}

netns_link() {
  local a="$1" b="$2" l="$3" da="$4" db="$5" net="$6"
  ip link add "$tag-$l-a" type veth peer name "$tag-$l-b"
  ip link set "$tag-$l-a" netns "$a"
  ip link set "$tag-$l-b" netns "$b"
  ip -n "$a" link set "$tag-$l-a" name "$da"
  ip -n "$b" link set "$tag-$l-b" name "$db"
  ip -n "$a" link set "$da" mtu 9000 up
  ip -n "$b" link set "$db" mtu 9000 up
  ip -n "$a" addr add "10.$net.$l.1/30" dev "$da"
  ip -n "$b" addr add "10.$net.$l.2/30" dev "$db"
}
