# Sourced by the lab's CI steps (80, 82, 85, 86): the lab's VMs are x86-64 guests made from this host's
# x86-64 files (lab/run.sh), so on another host architecture the step says what it did not run and
# ends. On a GB10 (aarch64) the hardware takes the lab's place: docs/guide/aarch64.md.
# shellcheck shell=bash
if [ "$(uname -m)" != x86_64 ]; then
  echo "$(basename "$0"): not run on this $(uname -m) host: the soft-RoCE VM lab's guests are x86-64; see docs/guide/aarch64.md for the checks on GB10 hardware"
  exit 0
fi
