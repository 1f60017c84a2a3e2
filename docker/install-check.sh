#!/usr/bin/env bash
# Runs the Docker image's build-and-install steps here (no container engine needed): the same
# docker/build-plugin.sh the Dockerfile's RUN lines call, into a temporary prefix, then checks the
# installed plugin: ncclNetPlugin_v6 … v12 exported, dlopen(RTLD_NOW|RTLD_LOCAL) by the name NCCL uses,
# no unexpected library dependencies, glibc no newer than the runtime image's, `switchless --version`.
# On an amd64 host, also the image's linux/arm64 build stage: `build-plugin.sh package OUTDIR arm64`
# (make deb ARCH=arm64, cross-built as in CI step 35, and the same checks on the unpacked package, the
# dlopen and the CLI under qemu-user).
#
#   docker/install-check.sh            build (cargo build --release into ./target) and check
#   KEEP=1 docker/install-check.sh     keep the temporary prefix and print its path
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

tmp=$(mktemp -d)
if [ "${KEEP:-0}" = 1 ]; then
  echo "prefix kept in $tmp/usr/local"
else
  trap 'rm -rf "$tmp"' EXIT
fi
prefix="$tmp/usr/local"

"$here/build-plugin.sh" deps
"$here/build-plugin.sh" install "$prefix"
"$here/build-plugin.sh" check "$prefix"
echo "docker install check: OK ($prefix)"
if [ "$(dpkg --print-architecture)" = amd64 ]; then
  "$here/build-plugin.sh" deps arm64
  "$here/build-plugin.sh" package "$tmp/out-arm64" arm64
  echo "docker install check: arm64 build stage OK ($(basename "$tmp"/out-arm64/*.deb))"
fi
