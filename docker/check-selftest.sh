#!/usr/bin/env bash
# Proves `build-plugin.sh check` can fail: runs it on small C stand-ins for the plugin (a good one, one
# missing ncclNetPlugin_v9, one naming the network differently, one needing an extra library) and the
# real `switchless` CLI. Needs cc, nm, readelf, objdump, python3.
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

# make_plugin NAME NETNAME SKIP_VERSION EXTRA_LIB
make_plugin() {
  local dir="$tmp/$1" v
  mkdir -p "$dir/lib" "$dir/bin"
  {
    echo '/* stand-in: each vtable starts with the network name, like ncclNet_vN_t */'
    echo 'struct vt { const char *name; void *rest[24]; };'
    for v in 6 7 8 9 10 11 12; do
      [ "$v" = "$3" ] && continue
      echo "__attribute__((visibility(\"default\"))) const struct vt ncclNetPlugin_v$v = { \"$2\" };"
    done
  } > "$dir/p.c"
  # shellcheck disable=SC2086 # $4 holds linker flags, split on purpose
  cc -shared -fPIC -o "$dir/lib/libnccl-net-switchless.so" "$dir/p.c" $4
  ln -s "$bin" "$dir/bin/switchless"
}

make_plugin good switchless "" ""
make_plugin no_v9 switchless 9 ""
make_plugin named Mesh "" ""
# The extra library is one built here, so the case never depends on what -dev packages the host has.
mkdir -p "$tmp/extra"
echo 'int swl_extra(void) { return 1; }' > "$tmp/extra/e.c"
cc -shared -fPIC -Wl,-soname,libswlextra.so.1 -o "$tmp/extra/libswlextra.so" "$tmp/extra/e.c"
make_plugin extralib switchless "" "-Wl,--no-as-needed -L$tmp/extra -lswlextra"

expect() {
  local what="$1" want="$2" out rc=0
  out=$("$here/build-plugin.sh" check "$tmp/$what" 2>&1) || rc=$?
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

"$here/build-plugin.sh" check "$tmp/good"
expect no_v9 "does not export ncclNetPlugin_v9"
expect named "name the network 'Mesh'"
expect extralib "libswlextra.so.1"
# runtime-check: found through LD_LIBRARY_PATH (as the image's ENV sets it), refused when NCCL could not find it.
LD_LIBRARY_PATH="$tmp/good/lib" "$here/build-plugin.sh" runtime-check "$tmp/good" > /dev/null
if out=$(env -u LD_LIBRARY_PATH "$here/build-plugin.sh" runtime-check "$tmp/good" 2>&1); then
  echo "check-selftest: runtime-check accepted a plugin outside the loader's search path" >&2
  exit 1
fi
grep -qF "would not find it" <<< "$out" || { echo "check-selftest: unclear runtime-check error: $out" >&2; exit 1; }
echo "ok: runtime-check finds the plugin on LD_LIBRARY_PATH and refuses it elsewhere"
echo "check-selftest: OK"
