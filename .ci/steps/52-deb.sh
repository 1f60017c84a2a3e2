#!/usr/bin/env bash
# CI: `make deb` builds the Debian package, for this host's architecture and, on an amd64 host, for arm64
# (GB10 / DGX Spark) with `make deb ARCH=arm64` (cross-built: scripts/cross.sh; step 35 built the same
# release binaries, so cargo has nothing left to do). Each package is unpacked into a clean root (dpkg -x:
# no root needed); the step checks its control fields, ldconfig trigger and file list, that both binaries
# are ELF files of the package's architecture, that the plugin's directory is one that architecture's
# loader searches by default (NCCL finds it with no LD_LIBRARY_PATH once installed), loads it there with
# the C stand-in for NCCL's loader (tests/c/nccl_loader.c, built for that architecture), and runs the
# packaged `switchless --version`, man page and completions (arm64: under qemu-user).
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "deb: $*" >&2
  exit 1
}

host_arch=$(dpkg --print-architecture)

check_deb() { # $1 = Debian architecture
  local arch=$1 deb root multiarch libdir machine cc=cc want f v run=() tools=""
  if [ "$arch" != "$host_arch" ]; then
    eval "$(scripts/cross.sh env "$arch")"
    read -ra run <<< "$SWL_CROSS_RUNNER"
    cc="$SWL_CROSS_TRIPLET-gcc"
    tools="$SWL_CROSS_TRIPLET-"
  fi
  case "$arch" in
    amd64) machine="Advanced Micro Devices X86-64" ;;
    arm64) machine="AArch64" ;;
    *) machine="" ;;
  esac
  deb=$(make -s -o deps deb ARCH="$arch" DEBDIR="$tmp/out-$arch" | tail -n1)
  [ -f "$deb" ] || fail "make deb ARCH=$arch printed no package path (got '$deb')"
  echo "deb $arch: built $deb ($(du -k "$deb" | cut -f1) KiB)"
  dpkg-deb --info "$deb" > "$tmp/info"
  for want in "Package: nccl-net-switchless" "Depends: libc6 (>= " "Recommends: libibverbs1" "Architecture: $arch"; do
    grep -qF -- "$want" "$tmp/info" || fail "$arch: control lacks '$want': $(cat "$tmp/info")"
  done
  dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./triggers | grep -qx "activate-noawait ldconfig" || fail "$arch: no ldconfig trigger"

  root="$tmp/root-$arch"
  dpkg -x "$deb" "$root"
  multiarch=$(dpkg-architecture -a"$arch" -qDEB_HOST_MULTIARCH 2> /dev/null || "$cc" -print-multiarch)
  libdir="/usr/lib/$multiarch"
  for f in "$libdir/libnccl-net-switchless.so" /usr/bin/switchless /usr/share/man/man1/switchless.1.gz \
    /usr/share/man/man1/switchless-doctor.1.gz /usr/share/man/man1/switchless-watch.1.gz \
    /usr/share/bash-completion/completions/switchless /usr/share/zsh/vendor-completions/_switchless \
    /usr/share/fish/vendor_completions.d/switchless.fish /usr/share/doc/nccl-net-switchless/copyright; do
    [ -f "$root$f" ] || fail "$arch: package lacks $f: $(cd "$root" && find . -type f | sort)"
  done
  echo "deb $arch: files: $(cd "$root" && find . -type f | sort | tr '\n' ' ')"
  if [ -n "$machine" ]; then
    for f in "$root$libdir/libnccl-net-switchless.so" "$root/usr/bin/switchless"; do
      "${tools}readelf" -h "$f" | grep -qF "Machine:                           $machine" ||
        fail "$arch: $f is not an ELF file for $machine: $("${tools}readelf" -h "$f" | grep Machine)"
    done
  fi

  # The directory must be one the package architecture's dynamic loader searches without LD_LIBRARY_PATH:
  # here, ld.so.conf's directories (what ldconfig scans and caches) or the built-in ones; for another
  # architecture, that loader's built-in "system search path" (ld.so --help).
  if [ "$arch" = "$host_arch" ]; then
    ldconfig -v -N -X 2> /dev/null | sed -n 's|^\(/[^:]*\):.*|\1|p' > "$tmp/dirs"
  else
    ld=$("${tools}readelf" -l "$root/usr/bin/switchless" | sed -n 's/.*program interpreter: \(.*\)]/\1/p')
    "${run[@]}" "$ld" --help | sed -n 's|^ *\(/[^ ]*\) (system search path)|\1|p' > "$tmp/dirs"
  fi
  grep -qx -- "$libdir" "$tmp/dirs" || grep -qx -- "/lib/$multiarch" "$tmp/dirs" ||
    fail "$arch: $libdir is not in the loader's search path: $(tr '\n' ' ' < "$tmp/dirs")"

  # Loaded from the unpacked root the way NCCL does (by name, then by full path).
  "$cc" -std=c11 -Wall -Wextra -Werror -Iinclude tests/c/nccl_loader.c -o "$tmp/loader-$arch" -ldl
  LD_LIBRARY_PATH="$root$libdir" NCCL_NET_PLUGIN=switchless timeout 60 "${run[@]}" "$tmp/loader-$arch" > "$tmp/by-name.txt" || true
  grep -q '^result .*symbol=ncclNetPlugin_v12 name=switchless ' "$tmp/by-name.txt" ||
    fail "$arch: the packaged plugin did not load by name: $(cat "$tmp/by-name.txt")"
  NCCL_NET_PLUGIN="$root$libdir/libnccl-net-switchless.so" timeout 60 "${run[@]}" "$tmp/loader-$arch" > "$tmp/by-path.txt" || true
  grep -q '^result .*symbol=ncclNetPlugin_v12 name=switchless ' "$tmp/by-path.txt" ||
    fail "$arch: the packaged plugin did not load by path: $(cat "$tmp/by-path.txt")"
  echo "deb $arch: loader: $(grep '^result' "$tmp/by-name.txt")"

  v=$("${run[@]}" "$root/usr/bin/switchless" --version) || fail "$arch: switchless --version failed"
  grep -q "ncclNet ABI" <<< "$v" || fail "$arch: unexpected --version: $v"
  zcat "$root/usr/share/man/man1/switchless-doctor.1.gz" | grep -q -- "fleet" || fail "$arch: man page lacks --fleet"
  grep -q "watch" "$root/usr/share/bash-completion/completions/switchless" || fail "$arch: bash completion lacks watch"
  echo "deb $arch: OK ($v)"
}

check_deb "$host_arch"
if [ "$host_arch" = amd64 ]; then
  check_deb arm64
  # The two packages differ in architecture only: the same files, the same man pages and completions.
  diff <(cd "$tmp/root-amd64" && find . -type f | sed 's|x86_64-linux-gnu|MULTIARCH|' | sort) \
    <(cd "$tmp/root-arm64" && find . -type f | sed 's|aarch64-linux-gnu|MULTIARCH|' | sort) ||
    fail "the amd64 and arm64 packages hold different files"
  for f in usr/share/man/man1/switchless-bench.1.gz usr/share/bash-completion/completions/switchless; do
    cmp -s "$tmp/root-amd64/$f" "$tmp/root-arm64/$f" || fail "$f differs between amd64 and arm64"
  done
  echo "deb: amd64 and arm64 packages hold the same files"
fi
