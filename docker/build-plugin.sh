#!/usr/bin/env bash
# The plugin's build-and-install steps, shared by docker/Dockerfile (its RUN lines call this script) and
# docker/install-check.sh (which runs them on this machine), so the two cannot drift.
#
#   docker/build-plugin.sh deps [ARCH]     install the build packages (scripts/deps.d/build.txt) and the
#                                          tools `check` uses (binutils, python3); skips what is present.
#                                          ARCH (a Debian architecture, e.g. arm64) other than this host's:
#                                          also the cross toolchain and qemu-user (scripts/cross.sh deps)
#   docker/build-plugin.sh install PREFIX  cargo build --release, then `make install PREFIX=PREFIX`
#                                          (PREFIX/lib/libnccl-net-switchless.so, PREFIX/bin/switchless)
#   docker/build-plugin.sh check PREFIX [ARCH]
#                                          verify the installed plugin (exports, dlopen, CLI); for another
#                                          ARCH with its cross binutils, dlopen by the C stand-in for NCCL's
#                                          loader and the CLI under qemu-user (PREFIX/lib or lib/<multiarch>)
#   docker/build-plugin.sh deb OUTDIR [ARCH]
#                                          cargo build --release, then `make deb` (the Debian package the
#                                          runtime image installs: scripts/deb.sh) into OUTDIR; another ARCH
#                                          is cross-built (`make deb ARCH=arm64`, what CI's 52-deb checks)
#   docker/build-plugin.sh package OUTDIR [ARCH]
#                                          the Dockerfile's build stage: this host's ARCH: install, check and
#                                          deb; another ARCH: deb, then check on the package unpacked
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

host_arch() {
  dpkg --print-architecture
}

# Whether $1 names an architecture other than this host's (empty: this host's).
foreign() {
  [ -n "${1:-}" ] && [ "$1" != "$(host_arch)" ]
}

deps() {
  local arch="${1:-}" pkgs=() missing=() p
  mapfile -t pkgs < <(sed 's/#.*//' "$repo/scripts/deps.d/build.txt" | tr -s ' \t' '\n' | sed '/^$/d')
  pkgs+=(binutils python3 make)
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || die "missing packages (${missing[*]}); run as root or install them"
    echo "installing: ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
    rm -rf /var/lib/apt/lists/*
  fi
  if foreign "$arch"; then
    "$repo/scripts/cross.sh" deps "$arch"
  fi
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
  { "${2:-objdump}" -T "$1" | grep -o 'GLIBC_[0-9][0-9.]*' || true; } | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n -k3,3n | tail -n1
}

version_le() {
  [ "$(printf '%s\n%s\n' "$1" "$2" | sort -t. -k1,1n -k2,2n -k3,3n | head -n1)" = "$1" ]
}

check() {
  local prefix="$1" arch="${2:-}" so bin v syms needed bad glibc out d tools="" run=()
  if foreign "$arch"; then
    eval "$("$repo/scripts/cross.sh" env "$arch")"
    tools="$SWL_CROSS_TRIPLET-"
    read -ra run <<< "$SWL_CROSS_RUNNER"
  fi
  so="$prefix/lib/libnccl-net-switchless.so"
  for d in "$prefix"/lib/*-linux-gnu*; do
    [ -f "$d/libnccl-net-switchless.so" ] && so="$d/libnccl-net-switchless.so"
  done
  bin="$prefix/bin/switchless"
  [ -f "$so" ] || die "$so was not installed"
  [ -x "$bin" ] || die "$bin was not installed (or is not executable)"

  syms=$("${tools}nm" -D --defined-only "$so")
  for v in $(seq "$ABI_MIN" "$ABI_MAX"); do
    grep -qE "[[:space:]]ncclNetPlugin_v${v}\$" <<< "$syms" ||
      die "$so does not export ncclNetPlugin_v${v} (nm -D --defined-only); NCCL looks up ncclNetPlugin_v${ABI_MAX} … v${ABI_MIN}"
  done
  echo "ok: exports ncclNetPlugin_v${ABI_MIN} … v${ABI_MAX}"

  needed=$("${tools}readelf" -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  bad=$(grep -vE "$ALLOWED_NEEDED" <<< "$needed" || true)
  [ -z "$bad" ] || die "$so needs libraries a runtime image may lack: $(echo "$bad" | tr '\n' ' ')(allowed: libc, libm, libgcc_s, libdl, libpthread, librt, libibverbs, librdmacm)"
  echo "ok: needs only: $(echo "$needed" | tr '\n' ' ')"

  glibc=$(glibc_needed "$so" "${tools}objdump")
  if [ -n "$glibc" ]; then
    version_le "$glibc" "$MAX_GLIBC" || die "$so needs glibc $glibc, newer than the runtime's $MAX_GLIBC (build on an older distribution)"
    echo "ok: needs glibc >= $glibc (its newest GLIBC_ symbol version); the runtime image has $MAX_GLIBC"
  fi

  if foreign "$arch"; then
    check_foreign_load "$so" "$arch"
  else
    check_load "$so" "$prefix"
  fi

  out=$("${run[@]}" "$bin" --version) || die "$bin --version failed"
  grep -q "v${ABI_MAX}" <<< "$out" || die "'$bin --version' does not list ABI v${ABI_MAX}: $out"
  echo "ok: $out"
}

# $1 = the .so, $2 = the prefix: dlopen the way NCCL does (RTLD_NOW|RTLD_LOCAL, by the name
# NCCL_NET_PLUGIN=switchless resolves to), resolve every vtable and read its name field (the first member
# of ncclNet_vN_t).
check_load() {
  local so="$1" prefix="$2" out
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
}

# $1 = the .so, $2 = its architecture (another than this host's): the C stand-in for NCCL's loader
# (tests/c/nccl_loader.c), cross-compiled, run under qemu-user: dlopen by NCCL's name lookup
# (RTLD_NOW|RTLD_LOCAL), the newest vtable, its name, init and devices.
check_foreign_load() {
  local so="$1" arch="$2" tmp out name
  [ -f "$repo/tests/c/nccl_loader.c" ] || die "tests/c/nccl_loader.c missing: run from a source tree"
  tmp=$(mktemp -d)
  "$SWL_CROSS_TRIPLET-gcc" -std=c11 -Wall -Wextra -Werror -I"$repo/include" "$repo/tests/c/nccl_loader.c" -o "$tmp/loader" -ldl
  out=$(LD_LIBRARY_PATH="$(dirname "$so")" NCCL_NET_PLUGIN=switchless timeout 60 "${run[@]}" "$tmp/loader") || true
  rm -rf "$tmp"
  grep -q "^result .*symbol=ncclNetPlugin_v${ABI_MAX} " <<< "$out" ||
    die "the $arch loader did not resolve ncclNetPlugin_v${ABI_MAX} in $so: $out"
  name=$(sed -n 's/^result .* name=\([^ ]*\) .*/\1/p' <<< "$out")
  [ "$(tr '[:upper:]' '[:lower:]' <<< "$name")" = "$PLUGIN_NAME" ] ||
    die "the vtable names the network '$name'; expected '$PLUGIN_NAME': $out"
  echo "ok: $arch: dlopen(\"libnccl-net-switchless.so\", RTLD_NOW|RTLD_LOCAL) under $SWL_CROSS_RUNNER resolves ncclNetPlugin_v${ABI_MAX}, network name '$name'"
}

build_deb() {
  local out="$1" arch="${2:-}"
  command -v cargo > /dev/null || die "cargo not found (use a rust image, or install rustup)"
  cd "$repo"
  if foreign "$arch"; then
    # The cross build lands in $CARGO_TARGET_DIR (or ./target) as make deb ARCH=... builds it in CI.
    make -o deps deb ARCH="$arch" DEBDIR="$out"
  else
    env -u CARGO_TARGET_DIR make -o deps deb DEBDIR="$out"
  fi
}

package() {
  local out="$1" arch="${2:-}" root
  if foreign "$arch"; then
    build_deb "$out" "$arch"
    root=$(mktemp -d)
    dpkg -x "$out"/nccl-net-switchless_*_"$arch".deb "$root"
    check "$root/usr" "$arch"
    rm -rf "$root"
  else
    install_prefix /tmp/prefix
    check /tmp/prefix
    build_deb "$out"
  fi
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
  deps) deps "${2:-}" ;;
  install)
    [ $# -eq 2 ] || die "usage: build-plugin.sh install PREFIX"
    install_prefix "$2"
    ;;
  check)
    [ $# -eq 2 ] || [ $# -eq 3 ] || die "usage: build-plugin.sh check PREFIX [ARCH]"
    check "$2" "${3:-}"
    ;;
  deb)
    [ $# -eq 2 ] || [ $# -eq 3 ] || die "usage: build-plugin.sh deb OUTDIR [ARCH]"
    build_deb "$2" "${3:-}"
    ;;
  package)
    [ $# -eq 2 ] || [ $# -eq 3 ] || die "usage: build-plugin.sh package OUTDIR [ARCH]"
    package "$2" "${3:-}"
    ;;
  runtime-check)
    [ $# -eq 2 ] || die "usage: build-plugin.sh runtime-check PREFIX"
    runtime_check "$2"
    ;;
  *) die "usage: build-plugin.sh deps [ARCH] | install PREFIX | check PREFIX [ARCH] | deb OUTDIR [ARCH] | package OUTDIR [ARCH] | runtime-check PREFIX" ;;
esac
