#!/usr/bin/env bash
# CI: the Docker image's build-and-install steps, run here without a container engine
# (docker/install-check.sh: release build, make install into a temporary prefix, checks of the
# installed plugin and CLI).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec docker/install-check.sh
