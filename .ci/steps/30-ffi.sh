#!/usr/bin/env bash
# ffi: the built plugin loads through NCCL's name resolution, both as NCCL_NET_PLUGIN=switchless (directory on
# LD_LIBRARY_PATH, file libnccl-net-switchless.so) and as NCCL_NET_PLUGIN=/full/path.so, with a C loader that
# mimics NCCL 2.30 (tests/c/nccl_loader.c). On a host without RDMA, init must fail with ncclSystemError (2) and
# exactly one WARN line, and devices() must report 0; with RDMA devices, init succeeds and devices() > 0.
set -euo pipefail
target="${CARGO_TARGET_DIR:-target}"
# Built every time (a no-op when fresh), so the step never loads a library older than the sources.
cargo build --quiet --locked --lib
so="$target/debug/libswitchless.so"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$so" "$tmp/libnccl-net-switchless.so"
cc -std=c11 -Wall -Wextra -Werror -Iinclude tests/c/nccl_loader.c -o "$tmp/loader" -ldl

ndev_host=0
if [ -d /sys/class/infiniband ]; then ndev_host=$(find /sys/class/infiniband -mindepth 1 -maxdepth 1 | wc -l); fi

check() { # $1 = label, $2 = output file
  local out=$2
  grep -q '^result .*symbol=ncclNetPlugin_v12 name=switchless ' "$out" || { echo "$1: plugin not driven"; cat "$out"; exit 1; }
  if [ "$ndev_host" -eq 0 ]; then
    grep -q ' init=2 devices_rc=0 ndev=0$' "$out" || { echo "$1: expected init=2 ndev=0"; cat "$out"; exit 1; }
    [ "$(grep -c '^log WARN ' "$out")" -eq 1 ] || { echo "$1: expected exactly one WARN line"; cat "$out"; exit 1; }
    grep -q '^log WARN .*no RDMA device: ibv_get_device_list' "$out" || { echo "$1: WARN does not say why"; cat "$out"; exit 1; }
  else
    grep -q ' init=0 devices_rc=0 ndev=[1-9]' "$out" || { echo "$1: expected init=0 and devices"; cat "$out"; exit 1; }
  fi
  echo "$1: ok: $(grep '^result' "$out")"
}

LD_LIBRARY_PATH="$tmp" NCCL_NET_PLUGIN=switchless timeout 30 "$tmp/loader" >"$tmp/by-name.txt"
check "NCCL_NET_PLUGIN=switchless" "$tmp/by-name.txt"
NCCL_NET_PLUGIN="$tmp/libnccl-net-switchless.so" timeout 30 "$tmp/loader" >"$tmp/by-path.txt"
check "NCCL_NET_PLUGIN=<full path>" "$tmp/by-path.txt"

# Without libibverbs (the system copy made invisible in a private mount namespace; a /30 veth pair in a
# private network namespace): the plugin and the binary still load (no DT_NEEDED on it), init fails with
# one WARN naming the package to install while there is no link; with a /30 link, init serves TCP devices
# and a TCP transfer between two ranks runs with data checks.
[ -f "$target/debug/switchless" ] || cargo build --bin switchless
for f in "$so" "$target/debug/switchless"; do
  if readelf -d "$f" | grep -q 'NEEDED.*libibverbs'; then echo "$f: DT_NEEDED on libibverbs"; exit 1; fi
done
libs=$(ldconfig -p | awk '/libibverbs\.so\.1 /{print $NF}' | xargs -r -n1 readlink -f | sort -u)
if [ "$(id -u)" -eq 0 ]; then ns=(unshare --mount --net); else ns=(unshare --user --map-root-user --mount --net); fi
if [ -z "$libs" ]; then
  echo "no-libibverbs: the host has no libibverbs; the checks above already ran without it"
elif ! "${ns[@]}" true 2>/dev/null; then
  echo "no-libibverbs: SKIPPED: cannot create mount and network namespaces here (${ns[*]})"
else
  cat >"$tmp/noverbs.sh" <<'INNER'
set -euo pipefail
tmp=$1; bin=$2; shift 2
for l in "$@"; do mount --bind /dev/null "$l"; done
if python3 -c 'import ctypes; ctypes.CDLL("libibverbs.so.1")' 2>/dev/null; then echo "libibverbs still loads"; exit 1; fi
mount -t sysfs sysfs /sys
ip link set lo up
LD_LIBRARY_PATH="$tmp" NCCL_NET_PLUGIN=switchless timeout 30 "$tmp/loader" >"$tmp/noverbs-loader.txt"
ip link add swl0 type veth peer name swl1
ip addr add 10.251.0.1/30 dev swl0 && ip addr add 10.251.0.2/30 dev swl1
ip link set swl0 up && ip link set swl1 up
LD_LIBRARY_PATH="$tmp" NCCL_NET_PLUGIN=switchless timeout 30 "$tmp/loader" >"$tmp/noverbs-loader-tcp.txt"
for r in 0 1; do
  NCCL_SWITCHLESS_TCP_FALLBACK=1 timeout 60 "$bin" bench bandwidth --rank "$r" --nranks 2 \
    --bootstrap 10.251.0.1:29581 --plugin "$tmp/libnccl-net-switchless.so" -b 8 -e 65536 -n 3 \
    >"$tmp/noverbs-bench-$r.txt" 2>&1 &
done
wait %1 && wait %2
INNER
  # shellcheck disable=SC2086
  "${ns[@]}" bash "$tmp/noverbs.sh" "$tmp" "$target/debug/switchless" $libs \
    || { echo "no-libibverbs: run failed"; cat "$tmp"/noverbs-*.txt 2>/dev/null; exit 1; }
  out="$tmp/noverbs-loader.txt"
  grep -q ' init=2 devices_rc=0 ndev=0$' "$out" || { echo "no-libibverbs: expected init=2 ndev=0"; cat "$out"; exit 1; }
  [ "$(grep -c '^log WARN ' "$out")" -eq 1 ] || { echo "no-libibverbs: expected exactly one WARN line"; cat "$out"; exit 1; }
  grep -q '^log WARN .*libibverbs.so.1 cannot be loaded.*libibverbs1 package' "$out" \
    || { echo "no-libibverbs: WARN does not name the package"; cat "$out"; exit 1; }
  grep -q ' init=0 devices_rc=0 ndev=[1-9]' "$tmp/noverbs-loader-tcp.txt" \
    || { echo "no-libibverbs: with a /30 link, expected init=0 and TCP devices"; cat "$tmp/noverbs-loader-tcp.txt"; exit 1; }
  grep -q '^# data checks: all passed' "$tmp/noverbs-bench-0.txt" \
    || { echo "no-libibverbs: TCP transfer failed"; cat "$tmp"/noverbs-bench-*.txt; exit 1; }
  echo "no-libibverbs: ok: $(grep '^log WARN' "$out")"
  echo "no-libibverbs: ok: with a /30 link $(grep '^result' "$tmp/noverbs-loader-tcp.txt"); TCP bench data checks passed"
fi
