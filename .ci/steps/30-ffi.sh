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
