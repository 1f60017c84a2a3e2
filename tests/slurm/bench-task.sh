#!/usr/bin/env bash
# The launchers' --bench-cmd in tests/slurm/run.sh: one Slurm task of `switchless bench` standing in for
# an nccl-tests binary (no GPU in CI), through the plugin's TCP paths.
#
#   bench-task.sh TEST [nccl-tests args: -b MIN -e MAX -f F -g G -n N ...]
#
# TEST all_reduce runs `bench allreduce`, alltoall `bench alltoall`, sendrecv `bench bandwidth` (rank
# pairs 0-1, 2-3); -b/-e/-f/-n pass through, -g is dropped (one rank per node, no GPU). Rank and size
# come from Slurm (SLURM_PROCID, SLURM_NTASKS); the bootstrap is rank 0's node at its NodeAddr (the
# first host of SLURM_HOSTFILE under --order, else the step's first node), on a port derived from the
# job and step. The plugin and CLI are SWITCHLESS_PLUGIN_DIR's (--plugin-dir). The table is printed in
# nccl-tests' layout (--nccl-tests) for `switchless nccl-tests summarize`.
#
# Before the bench it writes what this task saw to SWITCHLESS_LOG_DIR/task.TEST.RANK.env: its NCCL_*,
# SWITCHLESS_* and a few SLURM_* variables and the `Max locked memory` line of /proc/self/limits.
set -euo pipefail

die() {
  echo "bench-task.sh: $*" >&2
  exit 2
}

[ $# -ge 1 ] || die "usage: bench-task.sh TEST [nccl-tests args]"
test_name="$1"
shift
case "$test_name" in
  all_reduce) mode=allreduce ;;
  alltoall) mode=alltoall ;;
  sendrecv) mode=bandwidth ;;
  *) die "switchless bench has no counterpart of ${test_name}_perf (accepted: all_reduce, alltoall, sendrecv)" ;;
esac
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -b | -e | -f | -n)
      [ $# -ge 2 ] || die "$1 needs a value"
      args+=("$1" "$2")
      shift 2
      ;;
    -g)
      shift 2
      ;;
    *) die "unknown nccl-tests argument '$1' (accepted: -b, -e, -f, -g, -n)" ;;
  esac
done

for v in SLURM_PROCID SLURM_NTASKS SLURM_JOB_ID SLURM_STEP_ID SWITCHLESS_PLUGIN_DIR SWITCHLESS_LOG_DIR; do
  [ -n "${!v:-}" ] || die "$v is not set (run under srun from the nccl-tests launchers with --plugin-dir)"
done
rank="$SLURM_PROCID"

{
  env | grep -E '^(NCCL_|SWITCHLESS_|SLURMD_NODENAME=|SLURM_PROCID=|SLURM_NTASKS=)' | sort
  grep '^Max locked memory' /proc/self/limits
} > "$SWITCHLESS_LOG_DIR/task.${SWITCHLESS_TEST:-$test_name}.$rank.env"

if [ -n "${SLURM_HOSTFILE:-}" ] && [ "${SLURM_DISTRIBUTION:-}" = arbitrary ]; then
  first=$(head -n 1 "$SLURM_HOSTFILE")
else
  first=$(scontrol show hostnames "${SLURM_STEP_NODELIST:-$SLURM_JOB_NODELIST}" | head -n 1)
fi
addr=$(scontrol -o show node "$first" | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
[ -n "$addr" ] || die "no NodeAddr for $first (scontrol show node $first)"
port=$((20000 + (SLURM_JOB_ID % 2000) * 8 + SLURM_STEP_ID % 8))

exec "$SWITCHLESS_PLUGIN_DIR/bin/switchless" bench "$mode" --rank "$rank" --nranks "$SLURM_NTASKS" \
  --bootstrap "$addr:$port" --plugin "$SWITCHLESS_PLUGIN_DIR/lib/libnccl-net-switchless.so" \
  --nccl-tests --no-progress --timeout 30 -w 1 "${args[@]}"
