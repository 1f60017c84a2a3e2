#!/usr/bin/env bash
# End-to-end check of `switchless plan` on the fixtures in tests/fixtures/plan:
#  1. netplan itself accepts every server's YAML (`netplan generate --root-dir`) next to a host configuration
#     whose global renderer is NetworkManager (Ubuntu desktop style), which it leaves to NetworkManager; the
#     addresses and MTU it renders equal the plan's JSON and our own --format networkd files;
#  2. the --format ip apply scripts (--out, executable), run in one network namespace per server joined by veth
#     pairs named like the real ports, give every link a working subnet; a second run changes nothing; each
#     server's check script (pings: plain, then 9000-byte frames with don't-fragment) passes; and a jumbo ping
#     fails once one end's MTU is lowered (so the check can fail). A plan that names hosts refuses to run on
#     another host (SWITCHLESS_PLAN_ANY_HOST=1 overrides it here, where namespaces share one host name).
#  3. ARP flux: a GB10 port's two functions on one wire (a bridge); the apply script's ARP settings make
#     each peer address resolve to the MAC of the function that holds it.
#  4. A cable in the wrong port: `doctor --probe --capture` in each namespace and `doctor --fleet --plan`
#     over the captures name the port each crossed cable reaches.
# Needs root (namespaces), iproute2, iputils-ping, netplan.io, jq (scripts/deps.d/plan.txt). Bounded: about 100 s on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."

for tool in netplan ip ping jq; do
  command -v "$tool" >/dev/null || { echo "40-plan: $tool is missing; run scripts/deps.sh" >&2; exit 1; }
done
[ "$(id -u)" -eq 0 ] || { echo "40-plan: needs root to create network namespaces" >&2; exit 1; }

cargo build --quiet --bin switchless
bin="${CARGO_TARGET_DIR:-target}/debug/switchless"
fx=tests/fixtures/plan
work=$(mktemp -d)
namespaces=()
cleanup() {
  for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

fail() { echo "40-plan: FAIL: $*" >&2; exit 1; }

check_case() {
  local cables="$fx/$1" model="$2" tag="$3"
  local json servers s ipdir
  json="$work/$tag.json"
  "$bin" plan "$cables" --model "$model" --format json >"$json" 2>/dev/null
  servers=$(jq .server_count "$json")
  # The base name of server N's files: its host name when the cables file names hosts.
  stem() { jq -r --arg s "$1" '.server_names[$s] // "server\($s)"' "$json"; }

  # 1. netplan and networkd renderings agree with the JSON.
  for s in $(seq 1 "$servers"); do
    local want root nd
    want=$(jq -r --argjson s "$s" '.servers[] | select(.server == $s) | .interfaces[] | "\(.interface) \(.address)"' "$json" | sort)
    root="$work/$tag-netplan-$s"
    mkdir -p "$root/etc/netplan"
    # The host's own configuration: NetworkManager renders everything it names.
    printf 'network:\n  version: 2\n  renderer: NetworkManager\n  ethernets:\n    mgmt0:\n      dhcp4: true\n' >"$root/etc/netplan/01-network-manager-all.yaml"
    "$bin" plan "$cables" --model "$model" --format netplan --server "$s" >"$root/etc/netplan/99-switchless.yaml" 2>/dev/null
    chmod 600 "$root/etc/netplan/"*.yaml
    netplan generate --root-dir "$root" || fail "$tag server $s: netplan rejects the YAML"
    [ -e "$root/run/NetworkManager/system-connections/netplan-mgmt0.nmconnection" ] ||
      fail "$tag server $s: the host's NetworkManager interface was taken over by our file"
    local got_np=""
    for f in "$root"/run/systemd/network/10-netplan-*.network; do
      [ -e "$f" ] || continue
      got_np+="$(sed -n 's/^Name=//p' "$f") $(sed -n 's/^Address=//p' "$f")"$'\n'
      grep -qx 'MTUBytes=9000' "$f" || fail "$tag server $s: $f lacks MTUBytes=9000"
    done
    [ "$(printf '%s' "$got_np" | sed '/^$/d' | sort)" = "$want" ] || fail "$tag server $s: netplan renders other addresses than the plan"
    nd="$work/$tag-networkd"
    "$bin" plan "$cables" --model "$model" --format networkd --server "$s" --out "$nd" 2>/dev/null
    local got_nd=""
    for f in "$nd/$(stem "$s")"/05-switchless-*.network; do
      [ -e "$f" ] || continue
      got_nd+="$(sed -n 's/^Name=//p' "$f") $(sed -n 's/^Address=//p' "$f")"$'\n'
    done
    [ "$(printf '%s' "$got_nd" | sed '/^$/d' | sort)" = "$want" ] || fail "$tag server $s: networkd files disagree with the plan"
  done

  # 2. The ip commands in namespaces joined by veth pairs.
  local ns=()
  for s in $(seq 1 "$servers"); do
    ns[s]="swlplan$$-$tag-$s"
    ip netns add "${ns[s]}"
    namespaces+=("${ns[s]}")
  done
  while read -r sa ia sb ib; do
    ip netns exec "${ns[sa]}" ip link add name "$ia" type veth peer name "$ib" netns "${ns[sb]}"
  done < <(jq -r '.links[] | "\(.ends[0].server) \(.ends[0].interface) \(.ends[1].server) \(.ends[1].interface)"' "$json")
  ipdir="$work/$tag-ip"
  "$bin" plan "$cables" --model "$model" --format ip --out "$ipdir" 2>/dev/null
  if command -v shellcheck >/dev/null; then
    shellcheck "$ipdir"/*.sh || fail "$tag: shellcheck finds fault with the ip scripts"
  fi
  for s in $(seq 1 "$servers"); do
    local apply
    apply="$ipdir/$(stem "$s").sh"
    { [ -x "$apply" ] && [ -x "$ipdir/$(stem "$s")-check.sh" ]; } || fail "$tag server $s: the scripts are not executable"
    if [ "$(jq -r --arg s "$s" '.server_names[$s] // ""' "$json")" != "" ]; then
      if ip netns exec "${ns[s]}" "$apply" >/dev/null 2>&1; then fail "$tag server $s: $apply ran on another host"; fi
    fi
    SWITCHLESS_PLAN_ANY_HOST=1 ip netns exec "${ns[s]}" "$apply" >/dev/null || fail "$tag server $s: $apply failed"
  done
  for s in $(seq 1 "$servers"); do
    local want got
    want=$(jq -r --argjson s "$s" '.servers[] | select(.server == $s) | .interfaces[] | "\(.interface) \(.address) 9000 UP"' "$json" | sort)
    got=$(ip netns exec "${ns[s]}" ip -j addr show | jq -r '.[] | select(.ifname != "lo") | "\(.ifname) \(.addr_info[] | select(.family == "inet") | "\(.local)/\(.prefixlen)") \(.mtu) \(.operstate)"' | sort)
    [ "$got" = "$want" ] || fail "$tag server $s: addresses after the ip commands:"$'\n'"$got"$'\n'"planned:"$'\n'"$want"
    # Idempotent: a second run leaves every address and MTU as it was.
    local before after
    before=$(ip netns exec "${ns[s]}" ip -j addr show | jq -c '[.[] | {ifname, mtu, inet: [.addr_info[] | select(.family == "inet") | "\(.local)/\(.prefixlen)"]}]')
    SWITCHLESS_PLAN_ANY_HOST=1 ip netns exec "${ns[s]}" "$ipdir/$(stem "$s").sh" >/dev/null || fail "$tag server $s: second run failed"
    after=$(ip netns exec "${ns[s]}" ip -j addr show | jq -c '[.[] | {ifname, mtu, inet: [.addr_info[] | select(.family == "inet") | "\(.local)/\(.prefixlen)"]}]')
    [ "$before" = "$after" ] || fail "$tag server $s: a second run of the apply script changed the host"
  done
  local pings=0
  for s in $(seq 1 "$servers"); do
    local out
    # One packet per check instead of three keeps the step short.
    out=$(PING_COUNT=1 ip netns exec "${ns[s]}" "$ipdir/$(stem "$s")-check.sh") || fail "$tag server $s: the check script failed:"$'\n'"$out"
    pings=$((pings + $(grep -c '^ok ' <<<"$out")))
  done
  # Every link end pings its peer twice (plain, then 9000-byte frames): counted from the JSON, so
  # an ip rendering that dropped its ping lines fails instead of passing "0 pings".
  local want_pings
  want_pings=$(($(jq '.links | length' "$json") * 4))
  if [ "$pings" -eq 0 ] || [ "$pings" -ne "$want_pings" ]; then
    fail "$tag: ran $pings pings, expected $want_pings (2 per link end)"
  fi
  # The jumbo check must catch a lowered MTU.
  local first_if first_peer
  first_if=$(jq -r '.links[0].ends[0].interface' "$json")
  first_peer=$(jq -r '.links[0].ends[1].address | split("/")[0]' "$json")
  ip netns exec "${ns[$(jq '.links[0].ends[1].server' "$json")]}" ip link set dev "$(jq -r '.links[0].ends[1].interface' "$json")" mtu 1500
  if ip netns exec "${ns[$(jq '.links[0].ends[0].server' "$json")]}" ping -I "$first_if" -c 1 -W 1 -M "do" -s 8972 "$first_peer" >/dev/null 2>&1; then
    fail "$tag: a 9000-byte ping crossed a link whose far end has MTU 1500"
  fi
  for s in $(seq 1 "$servers"); do ip netns del "${ns[s]}"; done
  echo "40-plan: $tag: netplan + networkd agree with the plan; $pings pings over $(jq '.links | length' "$json") links passed"
}

# 3. ARP flux on a GB10 port: its two PCIe functions share one wire (here a bridge in a third namespace).
# With the plan's apply script (arp_ignore=1, arp_announce=2 on every interface) each far end's
# neighbour entry is the MAC of the function that holds the address, never the other one's; the
# settings are the plan's too (sysctl in the namespace reads them back).
arp_flux_case() {
  local json ipdir ns wire s f ifn peer_if mac_want mac_got
  json="$work/flux.json"
  echo '1-1 > 2-1' | "$bin" plan - --model gb10 --format json >"$json" 2>/dev/null
  ipdir="$work/flux-ip"
  echo '1-1 > 2-1' | "$bin" plan - --model gb10 --format ip --out "$ipdir" 2>/dev/null
  wire="swlflux$$-w"
  ip netns add "$wire"
  namespaces+=("$wire")
  ip netns exec "$wire" ip link add br0 type bridge
  ip netns exec "$wire" ip link set br0 up
  for s in 1 2; do
    ns[s]="swlflux$$-$s"
    ip netns add "${ns[s]}"
    namespaces+=("${ns[s]}")
    for f in enp1s0f0np0 enP2p1s0f0np0; do
      ip netns exec "${ns[s]}" ip link add name "$f" type veth peer name "w$s-${f:0:6}" netns "$wire"
      ip netns exec "$wire" ip link set "w$s-${f:0:6}" master br0 up
    done
    SWITCHLESS_PLAN_ANY_HOST=1 ip netns exec "${ns[s]}" "$ipdir/server$s.sh" >/dev/null || fail "flux: server$s.sh failed"
    for f in enp1s0f0np0 enP2p1s0f0np0; do
      [ "$(ip netns exec "${ns[s]}" sysctl -n "net.ipv4.conf.$f.arp_ignore")" = 1 ] || fail "flux: arp_ignore not set on $f"
      [ "$(ip netns exec "${ns[s]}" sysctl -n "net.ipv4.conf.$f.arp_announce")" = 2 ] || fail "flux: arp_announce not set on $f"
    done
  done
  for i in 1 2 3; do
    for ifn in enp1s0f0np0 enP2p1s0f0np0; do
      peer=$(jq -r --arg i "$ifn" '.servers[0].interfaces[] | select(.interface == $i) | .peer.address' "$json")
      ip netns exec "${ns[1]}" ip neigh flush dev "$ifn"
      ip netns exec "${ns[1]}" ping -I "$ifn" -c 1 -W 1 "$peer" >/dev/null || fail "flux: $ifn cannot ping $peer"
      peer_if=$(jq -r --arg i "$ifn" '.servers[0].interfaces[] | select(.interface == $i) | .peer.interface' "$json")
      mac_want=$(ip netns exec "${ns[2]}" cat "/sys/class/net/$peer_if/address")
      mac_got=$(ip netns exec "${ns[1]}" ip -j neigh show dev "$ifn" "$peer" | jq -r '.[0].lladdr')
      [ "$mac_got" = "$mac_want" ] || fail "flux: try $i: $ifn learned $mac_got for $peer, the MAC of $peer_if is $mac_want"
    done
  done
  for s in 1 2; do ip netns del "${ns[s]}"; done
  ip netns del "$wire"
  echo "40-plan: flux: two functions on one wire, each peer address resolves to its own function's MAC"
}

# 4. A cable in the wrong port, found from the live hosts: two GB10-named hosts with two cables,
# plugged crosswise at server 2. Each namespace runs `switchless doctor --probe --capture` (ping the
# planned far end, read what answered), and the fleet view of both captures against the plan names
# where each cable goes; the single-host doctor says its planned peers do not answer.
probe_case() {
  local json s cap out rc
  json="$work/probe.json"
  printf '1-1 > 2-1\n1-2 > 2-2\n' | "$bin" plan - --model gb10 --format json >"$json" 2>/dev/null
  for s in 1 2; do
    ns[s]="swlprobe$$-$s"
    ip netns add "${ns[s]}"
    namespaces+=("${ns[s]}")
  done
  # Port 1 of server 1 reaches port 2 of server 2 and the other way round (one function per port).
  ip netns exec "${ns[1]}" ip link add enp1s0f0np0 type veth peer name enp1s0f1np1 netns "${ns[2]}"
  ip netns exec "${ns[1]}" ip link add enp1s0f1np1 type veth peer name enp1s0f0np0 netns "${ns[2]}"
  for s in 1 2; do
    jq -r --argjson s "$s" '.servers[] | select(.server == $s) | .interfaces[] | select(.interface | startswith("enp1s0")) | "\(.interface) \(.address)"' "$json" |
      while read -r ifn addr; do
        ip netns exec "${ns[s]}" ip link set dev "$ifn" up mtu 9000
        ip netns exec "${ns[s]}" ip addr add "$addr" dev "$ifn"
      done
  done
  for s in 1 2; do
    cap="$work/probe-cap$s"
    rc=0
    out=$(ip netns exec "${ns[s]}" "$bin" doctor --plan "$json" --server "$s" --probe --capture "$cap") || rc=$?
    [ "$rc" = 2 ] || fail "probe: doctor --probe on server $s exited $rc, expected 2:"$'\n'"$out"
    grep -q "\[probe-no-answer\] netdev enp1s0f0np0: enp1s0f0np0: 10.100.0." <<<"$out" || fail "probe: no probe-no-answer on server $s:"$'\n'"$out"
    [ -f "$cap/switchless/probe.json" ] || fail "probe: the capture of server $s lacks switchless/probe.json"
  done
  out=$("$bin" doctor --fleet "server1=$work/probe-cap1" "server2=$work/probe-cap2" --plan "$json") || true
  grep -qE "line 1 .*WRONG PORT: +server 1 port 1 \(enp1s0f0np0\) faces server 2 port 2 \(enp1s0f1np1\)" <<<"$out" ||
    fail "probe: the fleet does not name where cable 1 goes:"$'\n'"$out"
  grep -qE "line 2 .*WRONG PORT: +server 1 port 2 \(enp1s0f1np1\) faces server 2 port 1 \(enp1s0f0np0\)" <<<"$out" ||
    fail "probe: the fleet does not name where cable 2 goes:"$'\n'"$out"
  for s in 1 2; do ip netns del "${ns[s]}"; done
  echo "40-plan: probe: doctor --probe in each namespace and the fleet against the plan name both crossed cables"
}

check_case b300-2node.cables b300 b300x2
check_case b300-4node.cables b300 b300x4
check_case gb10-3ring.cables gb10 gb10x3
check_case custom.cables "$fx/custom.map" custom
check_case b300-4node-named.cables b300 named
arp_flux_case
probe_case
echo "40-plan: ok"
