#!/usr/bin/env bash
# Proves `build-plugin.sh check` can fail: runs it on small C stand-ins for the plugin (a good one, one
# missing ncclNetPlugin_v9, one naming the network differently, one needing an extra library) and the
# real `switchless` CLI. Needs cc, nm, readelf, objdump, python3. On an amd64 host with the arm64 cross
# toolchain (scripts/cross.sh deps arm64), the same for `check PREFIX arm64` (the Dockerfile's arm64
# build stage): aarch64 stand-ins, cross binutils, the C loader and the aarch64 CLI under qemu-user.
#
#   docker/check-selftest.sh [SWITCHLESS_BIN]     (default: target/debug/switchless, built first)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)

bin="${1:-}"
if [ -z "$bin" ]; then
  bin="${CARGO_TARGET_DIR:-$repo/target}/debug/switchless"
  # built every time (a no-op when fresh): never the binary of older sources
  (cd "$repo" && cargo build --quiet --locked --bin switchless)
fi
[ -x "$bin" ] || { echo "check-selftest: no switchless binary at $bin" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# make_plugin DIR NETNAME SKIP_VERSION EXTRA_LIB CC CLI
# Each vtable starts with the network name, like ncclNet_vN_t; v12's init fails as on a host without
# RDMA and devices reports none, so a loader that calls them (tests/c/nccl_loader.c) gets that far.
make_plugin() {
  local dir="$tmp/$1" v
  mkdir -p "$dir/lib" "$dir/bin"
  {
    echo '#include "nccl_net_switchless.h"'
    echo 'struct vt { const char *name; void *rest[24]; };'
    echo 'static ncclResult_t sl_init(void** c, uint64_t id, ncclNetCommConfig_v12_t* cfg, ncclDebugLogger_t l,'
    echo '                            ncclProfilerCallback_t p) { (void)c; (void)id; (void)cfg; (void)l; (void)p; return ncclSystemError; }'
    echo 'static ncclResult_t sl_devices(int* n) { *n = 0; return ncclSuccess; }'
    for v in 6 7 8 9 10 11; do
      [ "$v" = "$3" ] && continue
      echo "__attribute__((visibility(\"default\"))) const struct vt ncclNetPlugin_v$v = { \"$2\", {0} };"
    done
    echo "__attribute__((visibility(\"default\"))) const ncclNet_v12_t ncclNetPlugin_v12 = { .name = \"$2\", .init = sl_init, .devices = sl_devices };"
  } > "$dir/p.c"
  # shellcheck disable=SC2086 # $4 holds linker flags, split on purpose
  "$5" -shared -fPIC -I"$repo/include" -o "$dir/lib/libnccl-net-switchless.so" "$dir/p.c" $4
  ln -s "$6" "$dir/bin/switchless"
}

# stand_ins PREFIX CC CLI: the four stand-ins under $tmp/PREFIX-*.
stand_ins() {
  make_plugin "$1-good" switchless "" "" "$2" "$3"
  make_plugin "$1-no_v9" switchless 9 "" "$2" "$3"
  make_plugin "$1-named" Mesh "" "" "$2" "$3"
  # The extra library is one built here, so the case never depends on what -dev packages the host has.
  mkdir -p "$tmp/$1-extra"
  echo 'int swl_extra(void) { return 1; }' > "$tmp/$1-extra/e.c"
  "$2" -shared -fPIC -Wl,-soname,libswlextra.so.1 -o "$tmp/$1-extra/libswlextra.so" "$tmp/$1-extra/e.c"
  make_plugin "$1-extralib" switchless "" "-Wl,--no-as-needed -L$tmp/$1-extra -lswlextra" "$2" "$3"
}

# expect PREFIX WHAT WANT [ARCH]: check refuses the stand-in, saying WANT.
expect() {
  local what="$1-$2" want="$3" out rc=0
  out=$("$here/build-plugin.sh" check "$tmp/$what" ${4:+"$4"} 2>&1) || rc=$?
  if [ "$rc" = 0 ]; then
    echo "check-selftest: check accepted the '$what' plugin:"$'\n'"$out" >&2
    exit 1
  fi
  grep -qF -- "$want" <<< "$out" || {
    echo "check-selftest: '$what' refused without '$want':"$'\n'"$out" >&2
    exit 1
  }
  echo "ok: refuses '$what' ($want)"
}

stand_ins host cc "$bin"
"$here/build-plugin.sh" check "$tmp/host-good"
expect host no_v9 "does not export ncclNetPlugin_v9"
expect host named "name the network 'Mesh'"
expect host extralib "libswlextra.so.1"
# runtime-check: found through LD_LIBRARY_PATH (as the image's ENV sets it), refused when NCCL could not find it.
LD_LIBRARY_PATH="$tmp/host-good/lib" "$here/build-plugin.sh" runtime-check "$tmp/host-good" > /dev/null
if out=$(env -u LD_LIBRARY_PATH "$here/build-plugin.sh" runtime-check "$tmp/host-good" 2>&1); then
  echo "check-selftest: runtime-check accepted a plugin outside the loader's search path" >&2
  exit 1
fi
grep -qF "would not find it" <<< "$out" || { echo "check-selftest: unclear runtime-check error: $out" >&2; exit 1; }
echo "ok: runtime-check finds the plugin on LD_LIBRARY_PATH and refuses it elsewhere"

if [ "$(dpkg --print-architecture)" = amd64 ] && command -v aarch64-linux-gnu-gcc > /dev/null && command -v qemu-aarch64 > /dev/null; then
  eval "$("$repo/scripts/cross.sh" env arm64)"
  # The aarch64 CLI (a no-op build after CI step 35).
  (cd "$repo" && cargo build --quiet --release --locked --target "$SWL_CROSS_TARGET" --bin switchless)
  stand_ins arm64 "$SWL_CROSS_TRIPLET-gcc" "${CARGO_TARGET_DIR:-$repo/target}/$SWL_CROSS_TARGET/release/switchless"
  "$here/build-plugin.sh" check "$tmp/arm64-good" arm64
  expect arm64 no_v9 "does not export ncclNetPlugin_v9" arm64
  expect arm64 named "names the network 'Mesh'" arm64
  expect arm64 extralib "libswlextra.so.1" arm64
elif [ "$(dpkg --print-architecture)" != amd64 ]; then
  echo "check-selftest: the checks above are this $(dpkg --print-architecture) host's own (cross checks run on amd64 hosts)"
else
  echo "check-selftest: the arm64 checks were not run: no arm64 cross toolchain here (scripts/cross.sh deps arm64)"
fi
echo "check-selftest: OK"
