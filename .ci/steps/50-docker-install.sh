#!/usr/bin/env bash
# CI: the Docker image's build-and-install steps, run here without a container engine.
# 1. docker/check-selftest.sh: the install checks refuse broken stand-in plugins (they can fail).
# 2. docker/install-check.sh: release build, `make install` into a temporary prefix, and the checks on
#    the real plugin (ncclNetPlugin_v6 … v12 exported, dlopen by NCCL's name, dependencies, glibc, CLI).
set -euo pipefail
cd "$(dirname "$0")/../.."
docker/check-selftest.sh
docker/install-check.sh
