#!/usr/bin/env bash
# Cross-builds for another Debian architecture and runs its binaries under qemu-user. Today: arm64
# (GB10 / DGX Spark, Grace) from an amd64 host, as CI's aarch64 step and `make deb ARCH=arm64` do. On an
# arm64 host, build natively (`make`, `make deb`, `make test`): nothing here is needed.
#
#   scripts/cross.sh deps ARCH    install what cross-building and qemu need: the arm64 dpkg architecture,
#                                 the cross gcc and binutils, libibverbs-dev:arm64 and librdmacm-dev:arm64
#                                 (rdma-sys's build probes them), qemu-user, and the Rust target.
#                                 Skips what is present (root or sudo for apt; Debian: Ubuntu keeps
#                                 arm64 packages on ports.ubuntu.com, which needs its own apt source).
#   scripts/cross.sh env ARCH     print the environment as export lines: eval "$(scripts/cross.sh env arm64)"
#                                 then `cargo build --target "$SWL_CROSS_TARGET"`; `cargo test` and
#                                 `cargo run` with that target run the binaries with $SWL_CROSS_RUNNER.
#   scripts/cross.sh build ARCH   cargo build --release --locked --target ... (the .so and the CLI)
#   scripts/cross.sh check ARCH [RUNNER...]
#                                 the runner (default $SWL_CROSS_RUNNER) gives a program the dynamic
#                                 loader and libc.so.6 of one glibc build, and threads run; exit 1 naming
#                                 the two files otherwise. CROSS_CHECK_TIMEOUT (seconds, default 30).
#
# The runner is `qemu-aarch64 -L /`: the arm64 glibc of Debian's multiarch libc6:arm64 (pulled in by
# libibverbs-dev:arm64), ld.so and libc.so.6 of one package. `-L /usr/aarch64-linux-gnu` (the cross
# toolchain's copy, libc6-arm64-cross) looks natural but mixes builds: qemu takes the interpreter
# /lib/ld-linux-aarch64.so.1 from the prefix, while that ld.so finds libc.so.6 through the host's
# /etc/ld.so.cache, which lists /lib/aarch64-linux-gnu/libc.so.6 once libc6:arm64 is installed; the
# prefix has no such path, so qemu opens the host file. When the two packages' versions differ
# (bookworm: 2.36-8cross1 and 2.36-9+deb12u14), libc reads ld.so's private _rtld_global at other
# offsets, and the first pthread_create spins forever walking the stack cache list: any threaded
# program (switchless bench, every libtest binary) hangs with no system call. `check` catches it.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

die() {
  echo "cross.sh: $*" >&2
  exit 1
}

# The table: Debian architecture -> Rust target, GNU triplet, qemu-user binary, Debian cross suffix.
arch_vars() {
  case "$1" in
    arm64)
      target="aarch64-unknown-linux-gnu"
      triplet="aarch64-linux-gnu"
      qemu="qemu-aarch64"
      cross_libc="libc6-dev-arm64-cross"
      ;;
    *) die "architecture '$1' is not supported for cross-building; accepted: arm64 (on an arm64 host, build natively)" ;;
  esac
  host_arch=$(dpkg --print-architecture 2> /dev/null || echo unknown)
  [ "$1" != "$host_arch" ] || die "$1 is this host's architecture: build natively (make, make deb)"
  target_env=${target//-/_}
  target_upper=$(tr '[:lower:]' '[:upper:]' <<< "$target_env")
  runner="$qemu -L /"
}

deps() {
  local arch=$1 pkgs missing=() p sudo=""
  arch_vars "$arch"
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  pkgs=("gcc-$triplet" "binutils-$triplet" "$cross_libc" "libibverbs-dev:$arch" "librdmacm-dev:$arch"
    "libibverbs1:$arch" "libc6:$arch" qemu-user pkg-config dpkg-dev)
  if ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
    echo "cross.sh: dpkg --add-architecture $arch" >&2
    $sudo dpkg --add-architecture "$arch"
    missing=("${pkgs[@]}")
  else
    for p in "${pkgs[@]}"; do
      dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    echo "cross.sh: installing: ${missing[*]}" >&2
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" ||
      die "apt-get could not install ${missing[*]} (on Ubuntu, $arch packages come from ports.ubuntu.com: add an apt source with [arch=$arch] for it)"
  fi
  command -v rustup > /dev/null || die "rustup not found: the Rust target $target is added with rustup"
  rustup target list --installed | grep -qx "$target" || rustup target add "$target"
}

print_env() {
  arch_vars "$1"
  # The linker and C compiler (build.rs's C test helpers, bindgen picks the target from cargo's TARGET);
  # pkg-config sees only the target's .pc files, so the host's libraries never reach the cross link.
  cat << EOF
export SWL_CROSS_ARCH=$1
export SWL_CROSS_TARGET=$target
export SWL_CROSS_TRIPLET=$triplet
export SWL_CROSS_RUNNER='$runner'
export CARGO_TARGET_${target_upper}_LINKER=$triplet-gcc
export CARGO_TARGET_${target_upper}_RUNNER='$runner'
export CC_${target_env}=$triplet-gcc
export AR_${target_env}=$triplet-ar
export PKG_CONFIG_ALLOW_CROSS_${target_env}=1
export PKG_CONFIG_LIBDIR_${target_env}=/usr/lib/$triplet/pkgconfig:/usr/share/pkgconfig
EOF
}

build() {
  eval "$(print_env "$1")"
  cd "$repo"
  cargo build --release --locked --target "$SWL_CROSS_TARGET"
}

# The glibc build a file belongs to, from its banner: "ld.so (Debian GLIBC 2.36-8) stable release
# version 2.36." -> "Debian GLIBC 2.36-8, 2.36".
glibc_build() {
  strings -a "$1" | sed -n 's/.*(\(.*\)) stable release version \([0-9.]*[0-9]\).*/\1, \2/p' | head -n1
}

check() {
  local arch=$1 out rc loader libc lb cb limit=${CROSS_CHECK_TIMEOUT:-30}
  shift
  arch_vars "$arch"
  local run=("$@")
  # shellcheck disable=SC2206 # the runner is a command line, split on purpose
  [ ${#run[@]} -gt 0 ] || run=($runner)
  command -v "${run[0]}" > /dev/null || die "${run[0]} not found (scripts/cross.sh deps $arch installs qemu-user)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$triplet-gcc" -std=c11 -O2 -Wall -Wextra -Werror -pthread "$repo/tests/c/runner_check.c" -o "$tmp/check"
  rc=0
  timeout "$limit" "${run[@]}" "$tmp/check" > "$tmp/out" 2>&1 || rc=$?
  out=$(cat "$tmp/out")
  loader=$(sed -n 's/^loader //p' <<< "$out" | head -n1)
  libc=$(sed -n 's/^libc //p' <<< "$out" | head -n1)
  if [ -z "$loader" ] || [ -z "$libc" ]; then
    die "'${run[*]}' did not run the check program (exit $rc): $out"
  fi
  lb=$(glibc_build "$loader")
  cb=$(glibc_build "$libc")
  if [ "$lb" != "$cb" ]; then
    echo "cross.sh: '${run[*]}' gives a program two glibc builds: ld.so $loader ($lb) with libc $libc ($cb);" \
      "threaded programs hang in pthread_create (exit $rc$([ "$rc" -eq 124 ] && echo ": timed out after ${limit} s")). Use '$runner'." >&2
    return 1
  fi
  if [ "$rc" -ne 0 ] || ! grep -qx 'threads ok' <<< "$out"; then
    die "'${run[*]}': threads did not run (exit $rc$([ "$rc" -eq 124 ] && echo ": timed out after ${limit} s")): $out"
  fi
  echo "cross check: '${run[*]}': ld.so $loader and libc $libc are one glibc build ($lb); threads ok"
}

[ $# -ge 2 ] || die "usage: cross.sh deps|env|build ARCH, or cross.sh check ARCH [RUNNER...]"
cmd=$1
shift
case "$cmd" in
  deps) deps "$1" ;;
  env) print_env "$1" ;;
  build) build "$1" ;;
  check) check "$@" ;;
  *) die "unknown command '$cmd'; accepted: deps, env, build, check" ;;
esac
