#!/usr/bin/env bash
# One nccl-tests process with the switchless plugin. srun-nccl-tests.sh and mpirun-nccl-tests.sh run
# this on every node (inside the container with pyxis), as: rank.sh BINARY [ARGS...]
#
# Environment it reads (all optional):
#   NCCL_NET_PLUGIN        default: switchless (NCCL then dlopens libnccl-net-switchless.so)
#   SWITCHLESS_PLUGIN_DIR  install prefix of the plugin (lib/libnccl-net-switchless.so); prepended to
#                          LD_LIBRARY_PATH
#   NCCL_SOCKET_IFNAME     bootstrap interface; default: the interface of this node's default route
#   SWITCHLESS_LOG_DIR     directory for NCCL's per-process logs (NCCL_DEBUG_FILE)
#   SWITCHLESS_TEST        test name used in the log file names
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: rank.sh BINARY [ARGS...]" >&2
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

rank="${SLURM_PROCID:-${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-0}}}"
echo "switchless: rank=${rank} host=$(hostname) NCCL_NET_PLUGIN=${NCCL_NET_PLUGIN} plugin=${plugin} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-} NCCL_DEBUG=${NCCL_DEBUG:-}" >&2
if [ "$plugin" = "not found" ]; then
  echo "switchless: WARNING: rank ${rank}: libnccl-net-${NCCL_NET_PLUGIN}.so is not in LD_LIBRARY_PATH or the ld.so cache; NCCL will use its internal IB/Socket transport unless NCCL_NET=${NCCL_NET_PLUGIN} is set" >&2
fi

exec "$@"
