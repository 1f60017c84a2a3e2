#!/usr/bin/env bash
# Builds the Debian package nccl-net-switchless_<version>-<rev>_<arch>.deb with dpkg-deb (no
# cargo-deb: installing it from source costs minutes of CI on 2 cores, and a package this small needs
# only a staged tree and a control file). `make deb` runs it after the release build.
#
#   scripts/deb.sh [OUTDIR]     default OUTDIR: $TARGET_DIR/debian (TARGET_DIR: $CARGO_TARGET_DIR or target)
#   DEB_ARCH=arm64 scripts/deb.sh [OUTDIR]
#                               the package of another Debian architecture, from the cross build in
#                               $TARGET_DIR/<rust target>/release (`make deb ARCH=arm64` builds it; the
#                               environment, the cross binutils and the qemu-user runner that generates the
#                               man pages come from scripts/cross.sh)
#
# The package installs:
#   /usr/lib/<multiarch>/libnccl-net-switchless.so   a directory of the default loader path, so NCCL's
#                                                    dlopen("libnccl-net-switchless.so") finds it with no
#                                                    LD_LIBRARY_PATH (ldconfig trigger refreshes the cache)
#   /usr/bin/switchless                              the CLI
#   /usr/share/man/man1/switchless*.1.gz             man pages generated from the CLI's clap definition
#   bash, zsh and fish completions                   generated the same way
#   /usr/share/doc/nccl-net-switchless/copyright
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target="${TARGET_DIR:-${CARGO_TARGET_DIR:-$repo/target}}"
out="${1:-$target/debian}"

die() {
  echo "deb.sh: $*" >&2
  exit 1
}
command -v dpkg-deb > /dev/null || die "dpkg-deb not found (Debian/Ubuntu: it is in the dpkg package)"
host_arch=$(dpkg --print-architecture)
arch="${DEB_ARCH:-$host_arch}"
if [ "$arch" = "$host_arch" ]; then
  rel="$target/release"
  tools="" # binutils of this host
  run=()
  build_hint="cargo build --release --locked first (make deb does)"
  multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2> /dev/null || gcc -print-multiarch 2> /dev/null || true)
else
  eval "$("$repo/scripts/cross.sh" env "$arch")"
  rel="$target/$SWL_CROSS_TARGET/release"
  tools="$SWL_CROSS_TRIPLET-"
  read -ra run <<< "$SWL_CROSS_RUNNER"
  build_hint="make deb ARCH=$arch (or scripts/cross.sh build $arch) first"
  multiarch=$(dpkg-architecture -a"$arch" -qDEB_HOST_MULTIARCH 2> /dev/null || echo "$SWL_CROSS_TRIPLET")
  command -v "${tools}strip" > /dev/null || die "${tools}strip not found (scripts/cross.sh deps $arch installs it)"
  command -v "${run[0]}" > /dev/null || die "${run[0]} not found: the $arch CLI writes the man pages (scripts/cross.sh deps $arch installs qemu-user)"
fi
so="$rel/libswitchless.so"
bin="$rel/switchless"
{ [ -f "$so" ] && [ -x "$bin" ]; } || die "$so or $bin missing: run $build_hint"

pkg=nccl-net-switchless
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -n1)
[ -n "$version" ] || die "no version in Cargo.toml"
rev="${DEB_REVISION:-1}"
[ -n "$multiarch" ] || die "cannot tell the multiarch triplet (install dpkg-dev or gcc)"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/root"
libdir="$root/usr/lib/$multiarch"
install -Dm644 "$so" "$libdir/libnccl-net-switchless.so"
install -Dm755 "$bin" "$root/usr/bin/switchless"
# Debian policy: installed binaries are stripped (the release build keeps line tables for backtraces).
"${tools}strip" --strip-unneeded "$libdir/libnccl-net-switchless.so" "$root/usr/bin/switchless"

man="$root/usr/share/man/man1"
# Written by the packaged architecture's own CLI (under qemu-user when cross-built).
"${run[@]}" "$bin" manpages "$man"
gzip -9n "$man"/*.1
"${run[@]}" "$bin" completions bash | install -Dm644 /dev/stdin "$root/usr/share/bash-completion/completions/switchless"
"${run[@]}" "$bin" completions zsh | install -Dm644 /dev/stdin "$root/usr/share/zsh/vendor-completions/_switchless"
"${run[@]}" "$bin" completions fish | install -Dm644 /dev/stdin "$root/usr/share/fish/vendor_completions.d/switchless.fish"
doc="$root/usr/share/doc/$pkg"
install -d "$doc"
cat > "$doc/copyright" << EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: $pkg
License: Apache-2.0

Files: *
License: Apache-2.0
 On Debian systems, the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
EOF

# Depends: glibc no older than the newest GLIBC_ symbol version either file needs, and the rdma-core
# libraries the plugin links against.
glibc=$(for f in "$libdir/libnccl-net-switchless.so" "$root/usr/bin/switchless"; do "${tools}objdump" -T "$f"; done |
  grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n -k3,3n | tail -n1)
depends="libc6 (>= ${glibc:-2.17})"
needed=$(for f in "$libdir/libnccl-net-switchless.so" "$root/usr/bin/switchless"; do "${tools}readelf" -d "$f"; done |
  sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u)
grep -qx 'libibverbs.so.1' <<< "$needed" && depends="$depends, libibverbs1"
grep -qx 'librdmacm.so.1' <<< "$needed" && depends="$depends, librdmacm1"
grep -qx 'libgcc_s.so.1' <<< "$needed" && depends="$depends, libgcc-s1"
# libibverbs is opened at run time (dlopen): without it the plugin still serves TCP paths, so the
# RDMA libraries are recommended, not required.
recommends="libibverbs1, ibverbs-providers, rdma-core"

install -d "$root/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat > "$root/DEBIAN/control" << EOF
Package: $pkg
Version: $version-$rev
Architecture: $arch
Maintainer: switchless maintainers <switchless@localhost>
Installed-Size: $size
Depends: $depends
Recommends: $recommends
Section: net
Priority: optional
Homepage: https://github.com/switchless/nccl-net-switchless
Description: NCCL network plugin for switchless RoCE/Ethernet meshes
 libnccl-net-switchless.so, loaded by a stock NCCL with NCCL_NET_PLUGIN=switchless: per-peer
 routing over point-to-point subnets (back-to-back cabled DGX B300 / GB10 boxes), multi-path
 striping, TCP fallback. Also the switchless CLI: doctor (one host or a fleet), plan, route,
 bench, nccl-tests summaries and a live per-port view (watch).
EOF
# The library lands in a directory ld.so caches: refresh the cache on install and removal.
echo "activate-noawait ldconfig" > "$root/DEBIAN/triggers"
(cd "$root" && find usr -type f -print0 | sort -z | xargs -0 md5sum) > "$root/DEBIAN/md5sums"
chmod 644 "$root/DEBIAN/control" "$root/DEBIAN/triggers" "$root/DEBIAN/md5sums"

mkdir -p "$out"
deb="$out/${pkg}_${version}-${rev}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" > /dev/null
echo "$deb"
