#!/usr/bin/env bash
# ffi: the v6..v8 rows of tests/fixtures/nccl-abi/nccl-v2.30.7-1.tsv (the NCCL layout src/ffi/tests.rs
# checks the plugin's types against) rederived from a header NCCL itself ships: nccl_net.h of Debian's
# libnccl-dev (trixie contrib; NCCL 2.22.3, which defines ncclNet_v6..v8 and their properties). The
# v9..v12 rows come from NCCL's source only (layout.py --nccl-src): no registry package ships those
# headers. The .deb is fetched with a private apt configuration (nothing is added to the host's
# sources, nothing is installed) and cached; apt-get download verifies it against Debian's signed
# release files. Needs apt-get, dpkg-deb, cc and python3. The tuner's rows (nccl-tuner.tsv, checked by
# src/ffi/tuner.rs) come from NCCL's source only: libnccl-dev 2.22.3 ships nccl.h and nccl_net.h, no
# nccl_tuner.h.
set -euo pipefail
cd "$(dirname "$0")/../.."
cache=${SWL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/switchless}/nccl-abi
mkdir -p "$cache/lists/partial" "$cache/archives/partial"
hdr=$cache/nccl_net.h
if [ ! -s "$hdr" ]; then
  printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie contrib\n' \
    > "$cache/sources.list"
  apt=(-o "Dir::Etc::sourcelist=$cache/sources.list" -o Dir::Etc::sourceparts=- -o "Dir::State::Lists=$cache/lists"
    -o "Dir::Cache=$cache" -o APT::Sandbox::User=root -q)
  apt-get "${apt[@]}" update > "$cache/update.log" 2>&1 || { cat "$cache/update.log" >&2; echo "31-nccl-abi: FAIL: apt-get update of trixie contrib" >&2; exit 1; }
  (cd "$cache" && apt-get "${apt[@]}" download libnccl-dev > download.log 2>&1) ||
    { cat "$cache/download.log" >&2; echo "31-nccl-abi: FAIL: apt-get download libnccl-dev" >&2; exit 1; }
  deb=$(ls "$cache"/libnccl-dev_*.deb)
  dpkg-deb --fsys-tarfile "$deb" | tar -x -O ./usr/include/nccl_net.h > "$hdr.tmp"
  mv "$hdr.tmp" "$hdr"
  basename "$deb" > "$cache/package"
  rm -f "$deb"
fi
out=$(python3 tests/fixtures/nccl-abi/layout.py --header "$hdr" --check tests/fixtures/nccl-abi/nccl-v2.30.7-1.tsv) ||
  { echo "$out" >&2; echo "31-nccl-abi: FAIL: $(cat "$cache/package")'s nccl_net.h disagrees with the table" >&2; exit 1; }
echo "$out"
# Every properties struct and vtable of v6..v8 was compared (a header that defined none would compare nothing).
n=$(grep -oE '^layout: [0-9]+ structs' <<< "$out" | grep -oE '[0-9]+')
[ "$n" -ge 6 ] || { echo "31-nccl-abi: FAIL: only $n structs compared (want ncclNetProperties_v6..v8_t and ncclNet_v6..v8_t)" >&2; exit 1; }
echo "31-nccl-abi: ok ($(cat "$cache/package"))"
