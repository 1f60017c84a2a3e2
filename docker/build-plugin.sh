#!/usr/bin/env bash
# The plugin's build-and-install steps, shared by docker/Dockerfile (its RUN lines call this script) and
# docker/install-check.sh (which runs them on this machine), so the two cannot drift.
#
#   docker/build-plugin.sh deps            install the build packages (scripts/deps.d/build.txt) and the
#                                          tools `check` uses (binutils, python3); skips what is present
#   docker/build-plugin.sh install PREFIX  cargo build --release, then `make install PREFIX=PREFIX`
#                                          (PREFIX/lib/libnccl-net-switchless.so, PREFIX/bin/switchless)
#   docker/build-plugin.sh check PREFIX    verify the installed plugin (exports, dlopen, CLI)
#   docker/build-plugin.sh deb OUTDIR      cargo build --release, then `make deb` (the Debian package the
#                                          runtime image installs: scripts/deb.sh) into OUTDIR
#   docker/build-plugin.sh runtime-check PREFIX
#                                          in the runtime image: every library the plugin needs resolves,
#                                          NCCL's name lookup finds it, and the CLI runs (the plugin in
#                                          PREFIX/lib or PREFIX/lib/<multiarch>, where the package puts it)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# ncclNet ABI versions the plugin exports (ncclNetPlugin_v6 … _v12: what NCCL 2.19 … 2.31 look up).
ABI_MIN=6
ABI_MAX=12
# The runtime image is Ubuntu 24.04 (glibc 2.39); the plugin must not need a newer glibc.
MAX_GLIBC="${MAX_GLIBC:-2.39}"
# The name the plugin reports to NCCL: `Using network NAME`, NCCL_NET=NAME (compared case-insensitively).
PLUGIN_NAME="${PLUGIN_NAME:-switchless}"
# Libraries the plugin may link against: the C runtime and rdma-core.
ALLOWED_NEEDED='^(libc\.so\.6|libm\.so\.6|libgcc_s\.so\.1|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libutil\.so\.1|libibverbs\.so\.1|librdmacm\.so\.1|ld-linux[-a-z0-9_.]*\.so\.[0-9]+)$'

die() {
  echo "build-plugin.sh: $*" >&2
  exit 1
}

deps() {
  local pkgs=() missing=() p
  mapfile -t pkgs < <(sed 's/#.*//' "$repo/scripts/deps.d/build.txt" | tr -s ' \t' '\n' | sed '/^$/d')
  pkgs+=(binutils python3 make)
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || die "missing packages (${missing[*]}); run as root or install them"
  echo "installing: ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  rm -rf /var/lib/apt/lists/*
}

install_prefix() {
  local prefix="$1"
  command -v cargo > /dev/null || die "cargo not found (use a rust image, or install rustup)"
  cd "$repo"
  # The Makefile installs from ./target/release: build there whatever CARGO_TARGET_DIR says.
  # `-o deps`: the packages were installed by the `deps` step.
  env -u CARGO_TARGET_DIR make -o deps install PREFIX="$prefix"
}

# Highest GLIBC_x.y version a file needs.
glibc_needed() {
  { objdump -T "$1" | grep -o 'GLIBC_[0-9][0-9.]*' || true; } | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n -k3,3n | tail -n1
}

version_le() {
  [ "$(printf '%s\n%s\n' "$1" "$2" | sort -t. -k1,1n -k2,2n -k3,3n | head -n1)" = "$1" ]
}

check() {
  local prefix="$1" so bin v syms needed bad glibc out
  so="$prefix/lib/libnccl-net-switchless.so"
  bin="$prefix/bin/switchless"
  [ -f "$so" ] || die "$so was not installed"
  [ -x "$bin" ] || die "$bin was not installed (or is not executable)"

  syms=$(nm -D --defined-only "$so")
  for v in $(seq "$ABI_MIN" "$ABI_MAX"); do
    grep -qE "[[:space:]]ncclNetPlugin_v${v}\$" <<< "$syms" ||
      die "$so does not export ncclNetPlugin_v${v} (nm -D --defined-only); NCCL looks up ncclNetPlugin_v${ABI_MAX} … v${ABI_MIN}"
  done
  echo "ok: exports ncclNetPlugin_v${ABI_MIN} … v${ABI_MAX}"

  needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  bad=$(grep -vE "$ALLOWED_NEEDED" <<< "$needed" || true)
  [ -z "$bad" ] || die "$so needs libraries a runtime image may lack: $(echo "$bad" | tr '\n' ' ')(allowed: libc, libm, libgcc_s, libdl, libpthread, librt, libibverbs, librdmacm)"
  echo "ok: needs only: $(echo "$needed" | tr '\n' ' ')"

  glibc=$(glibc_needed "$so")
  if [ -n "$glibc" ]; then
    version_le "$glibc" "$MAX_GLIBC" || die "$so needs glibc $glibc, newer than the runtime's $MAX_GLIBC (build on an older distribution)"
    echo "ok: needs glibc >= $glibc (its newest GLIBC_ symbol version); the runtime image has $MAX_GLIBC"
  fi

  # dlopen the way NCCL does (RTLD_NOW|RTLD_LOCAL, by the name NCCL_NET_PLUGIN=switchless resolves to),
  # resolve every vtable and read its name field (the first member of ncclNet_vN_t).
  out=$(LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" python3 - "$so" "$ABI_MIN" "$ABI_MAX" << 'PY'
import ctypes, os, sys
path, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lib = ctypes.CDLL("libnccl-net-switchless.so", mode=os.RTLD_NOW | os.RTLD_LOCAL)
if ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)._handle != lib._handle:
    sys.exit("dlopen by name found another libnccl-net-switchless.so than " + path)
names = set()
for v in range(hi, lo - 1, -1):
    sym = getattr(lib, "ncclNetPlugin_v%d" % v)  # dlsym; AttributeError if it does not resolve
    name = ctypes.c_char_p.from_address(ctypes.cast(sym, ctypes.c_void_p).value).value
    if not name:
        sys.exit("ncclNetPlugin_v%d has no name" % v)
    names.add(name.decode())
print(",".join(sorted(names)))
PY
  ) || die "dlopen/dlsym of $so failed (see above)"
  [ "$(tr '[:upper:]' '[:lower:]' <<< "$out")" = "$PLUGIN_NAME" ] ||
    die "the vtables name the network '$out'; expected '$PLUGIN_NAME' (NCCL_NET=$PLUGIN_NAME and 'Using network' depend on it)"
  echo "ok: dlopen(\"libnccl-net-switchless.so\", RTLD_NOW|RTLD_LOCAL) resolves ncclNetPlugin_v${ABI_MAX} … v${ABI_MIN}, network name '$out'"

  out=$("$bin" --version) || die "$bin --version failed"
  grep -q "v${ABI_MAX}" <<< "$out" || die "'$bin --version' does not list ABI v${ABI_MAX}: $out"
  echo "ok: $out"
}

build_deb() {
  local out="$1"
  command -v cargo > /dev/null || die "cargo not found (use a rust image, or install rustup)"
  cd "$repo"
  env -u CARGO_TARGET_DIR make -o deps deb DEBDIR="$out"
}

runtime_check() {
  local prefix="$1" so missing d
  so="$prefix/lib/libnccl-net-switchless.so"
  for d in "$prefix"/lib/*-linux-gnu*; do
    [ -f "$d/libnccl-net-switchless.so" ] && so="$d/libnccl-net-switchless.so"
  done
  [ -f "$so" ] || die "$so is missing"
  missing=$(ldd "$so" | grep 'not found' || true)
  [ -z "$missing" ] || die "$so: libraries not found in this image: $missing"
  case ":${LD_LIBRARY_PATH:-}:" in
    *":$(dirname "$so"):"*) ;;
    *)
      ldconfig -p | grep -qF "$so" ||
        die "$so is neither in the ld.so cache nor on LD_LIBRARY_PATH: NCCL_NET_PLUGIN=switchless would not find it"
      ;;
  esac
  "$prefix/bin/switchless" --version
}

case "${1:-}" in
  deps) deps ;;
  install)
    [ $# -eq 2 ] || die "usage: build-plugin.sh install PREFIX"
    install_prefix "$2"
    ;;
  check)
    [ $# -eq 2 ] || die "usage: build-plugin.sh check PREFIX"
    check "$2"
    ;;
  deb)
    [ $# -eq 2 ] || die "usage: build-plugin.sh deb OUTDIR"
    build_deb "$2"
    ;;
  runtime-check)
    [ $# -eq 2 ] || die "usage: build-plugin.sh runtime-check PREFIX"
    runtime_check "$2"
    ;;
  *) die "usage: build-plugin.sh deps | install PREFIX | check PREFIX | deb OUTDIR | runtime-check PREFIX" ;;
esac
