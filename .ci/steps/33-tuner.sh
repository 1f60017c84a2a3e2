#!/usr/bin/env bash
# tuner: the built library's ncclTunerPlugin_vN, found and driven the way NCCL does (tests/c/nccl_tuner_loader.c:
# NCCL_NET_PLUGIN=switchless, no NCCL_TUNER_PLUGIN, so the tuner comes from the net plugin's library), with the
# net plugin holding real point-to-point links: /30 veth pairs in a private network namespace, carried as TCP.
# Each host view below is what one host of the named fabric sees (the plugin takes one end of each veth pair
# as a cable: the other end is its own address); NCCL's nRanks/nNodes are the loader's.
#   - 2 veth pairs (2 cables), 4 hosts: a GB10-like ring of 4: Tree and PAT are never picked, at any size;
#   - 6 veth pairs (6 cables), 4 hosts × 8 ranks: a B300-like mesh, 2 cables per peer: Tree for large all-reduce;
#   - the same host with 2 hosts: nothing changes (the 2-node guarantee);
#   - the same with NCCL_ALGO=Ring or NCCL_SWITCHLESS_TUNER=0: nothing changes.
# Every tuner version (v2..v6; v1 changes nothing by design) is driven for the mesh. Needs cc and unshare (root,
# or user namespaces).
set -euo pipefail
cd "$(dirname "$0")/../.."
target="${CARGO_TARGET_DIR:-target}"
cargo build --quiet --locked --lib
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$target/debug/libswitchless.so" "$tmp/libnccl-net-switchless.so"
cc -std=c11 -Wall -Wextra -Werror -Iinclude tests/c/nccl_tuner_loader.c -o "$tmp/loader" -ldl

# A private mount namespace too: sysfs is remounted there so that /sys/class/net shows the namespace's links.
if [ "$(id -u)" -eq 0 ]; then ns=(unshare --mount --net); else ns=(unshare --user --map-root-user --mount --net); fi
if ! "${ns[@]}" true 2>/dev/null; then
  echo "33-tuner: SKIPPED: cannot create a network namespace here (${ns[*]})"
  exit 0
fi

cat >"$tmp/inner.sh" <<'INNER'
set -euo pipefail
tmp=$1; pairs=$2; shift 2
mount -t sysfs sysfs /sys
ip link set lo up
for i in $(seq 1 "$pairs"); do
  ip link add "swa$i" type veth peer name "swb$i"
  ip addr add "10.252.$i.1/30" dev "swa$i"
  ip addr add "10.252.$i.2/30" dev "swb$i"
  ip link set "swa$i" up
  ip link set "swb$i" up
done
cd "$tmp"
env -i PATH="$PATH" LD_LIBRARY_PATH="$tmp" NCCL_NET_PLUGIN=switchless NCCL_DEBUG=INFO "$@" ./loader
INNER

run() { # $1 = label, $2 = veth pairs, rest = environment for the loader
  local label=$1 pairs=$2
  shift 2
  "${ns[@]}" bash "$tmp/inner.sh" "$tmp" "$pairs" "$@" >"$tmp/$label.txt" 2>&1 ||
    { echo "33-tuner: $label: loader failed"; cat "$tmp/$label.txt"; exit 1; }
  grep -q '^net .* init=0 ndev=[1-9]' "$tmp/$label.txt" ||
    { echo "33-tuner: $label: the net plugin found no TCP device"; cat "$tmp/$label.txt"; exit 1; }
  if grep -q '^call .* rc=[1-9]' "$tmp/$label.txt"; then echo "33-tuner: $label: a call failed"; cat "$tmp/$label.txt"; exit 1; fi
}
fail() { echo "33-tuner: $1"; cat "$2"; exit 1; }
untouched() { # every call keeps NCCL's pick, no channel count
  local f=$1
  [ "$(grep -c '^call ' "$f")" -eq 6 ] || fail "expected 6 calls" "$f"
  while read -r line; do
    nccl=$(sed -E 's/.* nccl=([^ ]+) .*/\1/' <<<"$line")
    grep -q " pick=$nccl nch=0 " <<<"$line" || fail "changed: $line" "$f"
  done < <(grep '^call ' "$f")
}

# GB10-like ring of 4 (2 cables, 4 hosts): Ring only.
run ring4 2 SWL_NRANKS=4 SWL_NNODES=4
f=$tmp/ring4.txt
grep -q 'Ring only for every collective' "$f" || fail "ring4: no ring-only INFO line" "$f"
grep -q ' 2 point-to-point cable(s) here' "$f" || fail "ring4: expected 2 cables" "$f"
if grep '^call ' "$f" | grep -qv ' tree=0 pat=0$'; then fail "ring4: Tree or PAT left valid" "$f"; fi
if grep '^call ' "$f" | grep -qv ' pick=Ring/'; then fail "ring4: a pick is not Ring" "$f"; fi
echo "33-tuner: ring4: ok: $(grep -c '^call ' "$f") calls, all Ring, Tree/PAT ignored"

# B300-like mesh of 4 hosts × 8 ranks, 6 cables (2 per peer): Tree for large all-reduce, in every version.
for v in 2 3 4 5 6; do
  run "mesh4-v$v" 6 SWL_NRANKS=32 SWL_NNODES=4 SWL_TUNER_VERSION=$v
  f=$tmp/mesh4-v$v.txt
  grep -q "symbol=ncclTunerPlugin_v$v name=switchless init=0" "$f" || fail "mesh4 v$v: not loaded" "$f"
  grep -q 'full mesh assumed' "$f" || fail "mesh4 v$v: no mesh INFO line" "$f"
  grep -q "^call coll=4 bytes=1073741824 rc=0 nccl=Ring/Simple pick=Tree/Simple" "$f" ||
    fail "mesh4 v$v: 1 GiB all-reduce did not move to Tree" "$f"
  if [ "$v" -ge 3 ]; then
    grep -q "^call coll=4 bytes=268435456 rc=0 nccl=Ring/Simple pick=Tree/Simple" "$f" ||
      fail "mesh4 v$v: 256 MiB all-reduce did not move to Tree" "$f"
  fi
  grep -q '^call coll=2 .* nccl=Ring/Simple pick=Ring/Simple nch=0 tree=1 pat=1$' "$f" ||
    fail "mesh4 v$v: all-gather is NCCL's, PAT kept" "$f"
  grep -q ' 6 point-to-point cable(s) here' "$f" || fail "mesh4 v$v: expected 6 cables" "$f"
  echo "33-tuner: mesh4 v$v: ok: $(grep '^call coll=4 bytes=1073741824' "$f")"
done

# The same host in a 2-host job, and with the user's choices: untouched.
run mesh2 6 SWL_NRANKS=16 SWL_NNODES=2
untouched "$tmp/mesh2.txt"
grep -q 'two hosts' "$tmp/mesh2.txt" || fail "mesh2: no reason given" "$tmp/mesh2.txt"
run algo 6 SWL_NRANKS=32 SWL_NNODES=4 NCCL_ALGO=Ring
untouched "$tmp/algo.txt"
run off 6 SWL_NRANKS=32 SWL_NNODES=4 NCCL_SWITCHLESS_TUNER=0
untouched "$tmp/off.txt"
echo "33-tuner: 2 hosts, NCCL_ALGO=Ring, NCCL_SWITCHLESS_TUNER=0: ok, nothing changed"
