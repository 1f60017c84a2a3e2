#!/usr/bin/env bash
# One nccl-tests process with the switchless plugin. srun-nccl-tests.sh and mpirun-nccl-tests.sh run
# this on every node (inside the container with pyxis), as: rank.sh BINARY [ARGS...]
# Before the benchmark they run it as: rank.sh --preflight [DOCTOR ARGS...], which checks this node as
# the benchmark will see it (the plugin resolves, /dev/infiniband is visible where RDMA devices exist,
# `switchless doctor` finds no error: memlock, MTU, links, planned peers with --plan) and prints
# `switchless preflight: node=NAME attest plugin=PATH sha256=H nccl=PATH sha256=H` (compared across
# nodes by the launcher), then `switchless preflight: node=NAME ok` or `... FAIL: WHY`; exit status 1
# on a failure.
#
# Environment it reads (all optional):
#   NCCL_NET_PLUGIN        default: switchless (NCCL then dlopens libnccl-net-switchless.so)
#   SWITCHLESS_PLUGIN_DIR  install prefix of the plugin (lib/libnccl-net-switchless.so); prepended to
#                          LD_LIBRARY_PATH
#   NCCL_SOCKET_IFNAME     bootstrap interface; default: the interface of this node's default route
#   SWITCHLESS_LOG_DIR     directory for NCCL's per-process logs (NCCL_DEBUG_FILE)
#   SWITCHLESS_TEST        test name used in the log file names
#   SWITCHLESS_BIN         the switchless CLI for --preflight (default: SWITCHLESS_PLUGIN_DIR/bin, PATH)
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: rank.sh BINARY [ARGS...] | rank.sh --preflight [DOCTOR ARGS...]" >&2
  exit 2
fi

export NCCL_NET_PLUGIN="${NCCL_NET_PLUGIN:-switchless}"
if [ -n "${SWITCHLESS_PLUGIN_DIR:-}" ]; then
  export LD_LIBRARY_PATH="${SWITCHLESS_PLUGIN_DIR}/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
fi

# Bootstrap (TCP) traffic must use a network that reaches every node: on a switchless mesh each RDMA
# port reaches one peer only, so default to the management interface that holds the default route.
if [ -z "${NCCL_SOCKET_IFNAME:-}" ] && [ -r /proc/net/route ]; then
  NCCL_SOCKET_IFNAME=$(awk '$2 == "00000000" { print $1; exit }' /proc/net/route)
  export NCCL_SOCKET_IFNAME
fi

if [ -n "${SWITCHLESS_LOG_DIR:-}" ]; then
  mkdir -p "${SWITCHLESS_LOG_DIR}"
  # NCCL expands %h (host) and %p (pid): one file per process.
  export NCCL_DEBUG_FILE="${SWITCHLESS_LOG_DIR}/nccl.${SWITCHLESS_TEST:-run}.%h.%p.log"
fi

# Say where the plugin would come from, so a missing library is visible before NCCL quietly falls
# back to its internal IB transport.
plugin="not found"
case "${NCCL_NET_PLUGIN}" in
  /*) [ -e "${NCCL_NET_PLUGIN}" ] && plugin="${NCCL_NET_PLUGIN}" ;;
  none | NONE) plugin="none (NCCL internal transports)" ;;
  *)
    lib="libnccl-net-${NCCL_NET_PLUGIN}.so"
    IFS=: read -r -a dirs <<< "${LD_LIBRARY_PATH:-}"
    for d in "${dirs[@]}"; do
      if [ -n "$d" ] && [ -e "$d/$lib" ]; then
        plugin="$d/$lib"
        break
      fi
    done
    if [ "$plugin" = "not found" ] && command -v ldconfig > /dev/null 2>&1; then
      found=$(ldconfig -p 2> /dev/null | awk -v l="$lib" '$1 == l { print $NF; exit }')
      [ -n "$found" ] && plugin="$found"
    fi
    ;;
esac

node="${SLURMD_NODENAME:-$(hostname)}"
if [ "$1" = --preflight ]; then
  shift
  why=()
  case "$plugin" in
    "not found") why+=("libnccl-net-${NCCL_NET_PLUGIN}.so is not in LD_LIBRARY_PATH or the ld.so cache (--plugin-dir DIR, or make install and ldconfig)") ;;
  esac
  # Inside a container sysfs can list RDMA devices whose /dev/infiniband nodes were not passed in
  # (enroot's Mellanox hook needs MELLANOX_VISIBLE_DEVICES; docker needs --device /dev/infiniband).
  transport="${NCCL_SWITCHLESS_TRANSPORT:-auto}"
  if [ "${transport,,}" != tcp ] && [ -n "$(ls -A /sys/class/infiniband 2> /dev/null)" ] &&
    ! compgen -G "/dev/infiniband/uverbs*" > /dev/null; then
    why+=("RDMA devices in /sys/class/infiniband but no /dev/infiniband/uverbs* here (pyxis/enroot: export MELLANOX_VISIBLE_DEVICES=all; docker: --device /dev/infiniband)")
  fi
  cli="${SWITCHLESS_BIN:-}"
  if [ -z "$cli" ] && [ -n "${SWITCHLESS_PLUGIN_DIR:-}" ] && [ -x "${SWITCHLESS_PLUGIN_DIR}/bin/switchless" ]; then
    cli="${SWITCHLESS_PLUGIN_DIR}/bin/switchless"
  fi
  [ -n "$cli" ] || cli=$(command -v switchless 2> /dev/null || true)
  if [ -z "$cli" ]; then
    echo "switchless preflight: node=${node}: no switchless CLI here (SWITCHLESS_BIN, --plugin-dir DIR/bin or PATH); doctor skipped" >&2
  else
    drc=0
    report=$("$cli" doctor "$@" 2>&1) || drc=$?
    if [ "$drc" -ge 2 ]; then
      # The verdict line is the report's first; the errors follow it.
      why+=("switchless doctor${*:+ $*}: $(grep -m1 -E '^(verdict|[0-9]+ error)|error' <<< "$report" || echo "exit status $drc")")
      printf '%s\n' "$report" | sed "s/^/switchless preflight: node=${node}: doctor: /" >&2
    fi
  fi
  # Attestation: the SHA-256 of the plugin and of the libnccl this node would load, compared across
  # nodes by the launcher (a stale library on one node otherwise wins silently).
  nccl="-"
  IFS=: read -r -a dirs <<< "${LD_LIBRARY_PATH:-}"
  for d in "${dirs[@]}"; do
    if [ -n "$d" ] && [ -e "$d/libnccl.so.2" ]; then
      nccl="$d/libnccl.so.2"
      break
    fi
  done
  if [ "$nccl" = "-" ] && command -v ldconfig > /dev/null 2>&1; then
    found=$(ldconfig -p 2> /dev/null | awk '$1 == "libnccl.so.2" { print $NF; exit }')
    [ -n "$found" ] && nccl="$found"
  fi
  sha() { if [ -r "$1" ]; then sha256sum "$1" | cut -d' ' -f1; else echo -; fi; }
  echo "switchless preflight: node=${node} attest plugin=${plugin// /_} sha256=$(sha "$plugin") nccl=${nccl// /_} sha256=$(sha "$nccl")"
  if [ ${#why[@]} -gt 0 ]; then
    for w in "${why[@]}"; do
      echo "switchless preflight: node=${node} FAIL: $w"
    done
    exit 1
  fi
  echo "switchless preflight: node=${node} ok"
  exit 0
fi

rank="${SLURM_PROCID:-${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-0}}}"
echo "switchless: rank=${rank} host=$(hostname) NCCL_NET_PLUGIN=${NCCL_NET_PLUGIN} plugin=${plugin} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-} NCCL_DEBUG=${NCCL_DEBUG:-}" >&2
if [ "$plugin" = "not found" ]; then
  echo "switchless: WARNING: rank ${rank}: libnccl-net-${NCCL_NET_PLUGIN}.so is not in LD_LIBRARY_PATH or the ld.so cache; NCCL will use its internal IB/Socket transport unless NCCL_NET=${NCCL_NET_PLUGIN} is set" >&2
fi

exec "$@"
