#!/usr/bin/env bash
# CI: `make deb` builds the Debian package; unpack it into a clean root (dpkg -x: no root needed),
# check its control fields, ldconfig trigger and file list, that the plugin's directory is one the
# loader searches by default (NCCL finds it with no LD_LIBRARY_PATH once installed), load it there with
# the C stand-in for NCCL's loader (tests/c/nccl_loader.c), and run the packaged `switchless --version`,
# man page and completions.
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "deb: $*" >&2
  exit 1
}

deb=$(make -s -o deps deb DEBDIR="$tmp/out" | tail -n1)
[ -f "$deb" ] || fail "make deb printed no package path (got '$deb')"
echo "deb: built $deb ($(du -k "$deb" | cut -f1) KiB)"
dpkg-deb --info "$deb" > "$tmp/info"
for want in "Package: nccl-net-switchless" "Depends: libc6 (>= " "Recommends: libibverbs1" "Architecture: $(dpkg --print-architecture)"; do
  grep -qF -- "$want" "$tmp/info" || fail "control lacks '$want': $(cat "$tmp/info")"
done
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./triggers | grep -qx "activate-noawait ldconfig" || fail "no ldconfig trigger"

root="$tmp/root"
dpkg -x "$deb" "$root"
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2> /dev/null || gcc -print-multiarch)
libdir="/usr/lib/$multiarch"
for f in "$libdir/libnccl-net-switchless.so" /usr/bin/switchless /usr/share/man/man1/switchless.1.gz \
  /usr/share/man/man1/switchless-doctor.1.gz /usr/share/man/man1/switchless-watch.1.gz \
  /usr/share/bash-completion/completions/switchless /usr/share/zsh/vendor-completions/_switchless \
  /usr/share/fish/vendor_completions.d/switchless.fish /usr/share/doc/nccl-net-switchless/copyright; do
  [ -f "$root$f" ] || fail "package lacks $f: $(cd "$root" && find . -type f | sort)"
done
echo "deb: files: $(cd "$root" && find . -type f | sort | tr '\n' ' ')"

# The directory must be one the dynamic loader searches without LD_LIBRARY_PATH: ld.so.conf's
# directories (what ldconfig scans and caches) or the built-in ones.
ldconfig -v -N -X 2> /dev/null | sed -n 's|^\(/[^:]*\):.*|\1|p' > "$tmp/dirs"
grep -qx -- "$libdir" "$tmp/dirs" || grep -qx -- "/lib/$multiarch" "$tmp/dirs" ||
  fail "$libdir is not in the loader's search path here: $(tr '\n' ' ' < "$tmp/dirs")"

# Loaded from the unpacked root the way NCCL does (by name, then by full path).
cc -std=c11 -Wall -Wextra -Werror -Iinclude tests/c/nccl_loader.c -o "$tmp/loader" -ldl
LD_LIBRARY_PATH="$root$libdir" NCCL_NET_PLUGIN=switchless timeout 30 "$tmp/loader" > "$tmp/by-name.txt" || true
grep -q '^result .*symbol=ncclNetPlugin_v12 name=switchless ' "$tmp/by-name.txt" ||
  fail "the packaged plugin did not load by name: $(cat "$tmp/by-name.txt")"
NCCL_NET_PLUGIN="$root$libdir/libnccl-net-switchless.so" timeout 30 "$tmp/loader" > "$tmp/by-path.txt" || true
grep -q '^result .*symbol=ncclNetPlugin_v12 name=switchless ' "$tmp/by-path.txt" ||
  fail "the packaged plugin did not load by path: $(cat "$tmp/by-path.txt")"
echo "deb: loader: $(grep '^result' "$tmp/by-name.txt")"

v=$("$root/usr/bin/switchless" --version) || fail "switchless --version failed"
grep -q "ncclNet ABI" <<< "$v" || fail "unexpected --version: $v"
zcat "$root/usr/share/man/man1/switchless-doctor.1.gz" | grep -q -- "fleet" || fail "man page lacks --fleet"
grep -q "watch" "$root/usr/share/bash-completion/completions/switchless" || fail "bash completion lacks watch"
echo "deb: OK ($v)"
