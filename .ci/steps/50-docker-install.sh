#!/usr/bin/env bash
# CI: the Docker image's build-and-install steps, run here without a container engine.
# 1. docker/check-selftest.sh: the install checks refuse broken stand-in plugins (they can fail), for
#    this host's architecture and, with the cross toolchain of step 35, for arm64.
# 2. docker/install-check.sh: release build, `make install` into a temporary prefix, and the checks on
#    the real plugin (ncclNetPlugin_v6 … v12 exported, dlopen by NCCL's name, dependencies, glibc, CLI);
#    on amd64 also the image's linux/arm64 build stage (make deb ARCH=arm64, checked unpacked).
set -euo pipefail
cd "$(dirname "$0")/../.."
docker/check-selftest.sh
docker/install-check.sh
