#!/usr/bin/env bash
# Runs NVIDIA nccl-tests with the switchless NCCL net plugin under Slurm, in a container (pyxis/enroot)
# or on the hosts, then summarizes each test with `switchless nccl-tests summarize`.
#
#   # 2x DGX B300 (8 GPUs each), all six collectives, in the coreweave image with the plugin mounted:
#   nccl-tests/srun-nccl-tests.sh -N 2 -g 8 --tests all --plugin-dir /shared/switchless -i eno1
#   # 2x GB10 with our image (plugin inside), all_gather 16 GiB, fail below 185 Gb/s:
#   nccl-tests/srun-nccl-tests.sh -N 2 -g 1 -t all_gather -b 16G -e 16G --image ghcr.io#you/switchless-nccl-tests:latest --expect-busbw 185Gb/s
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

SL_IMAGE="ghcr.io/coreweave/nccl-tests:13.2.0-devel-ubuntu24.04-nccl2.29.7-1-7112046"
SL_CONTAINER=1
SL_MOUNTS=""
SL_SRUN_ARGS=()

usage() {
  cat << 'EOF'
usage: srun-nccl-tests.sh [options] [-- nccl-tests args]

Runs one process per node (srun --ntasks-per-node=1 --mpi=pmix), each driving --gpus-per-node GPUs,
with NCCL_NET_PLUGIN=switchless. Inside an allocation (salloc/sbatch) it uses the allocation.
Writes DIR/<test>.out (the ranks' output, labelled by srun -l), DIR/nccl.<test>.<host>.<pid>.log
(NCCL's per-process log, with the plugin's per-connection route lines) and DIR/<test>.summary.txt.

Examples:
  # 2x DGX B300, all six collectives, the coreweave image with the plugin mounted, checked against the plan:
  srun-nccl-tests.sh -N 2 -g 8 -t all --plugin-dir /shared/switchless -i eno1 --preflight-arg=--plan=/shared/plan.json
  # 2x GB10, our image (plugin inside), fail below 185 Gb/s:
  srun-nccl-tests.sh -N 2 -g 1 -t all_gather -b 16G -e 16G --image ghcr.io#you/switchless-nccl-tests:latest --expect-busbw 185Gb/s
  # 3x GB10 in a full mesh (one GPU each), sizes for a 200G cable:
  srun-nccl-tests.sh -N 3 -g 1 -t all -b 1M -e 8G --plugin-dir /shared/switchless -i enP7s7
  # what would run, as lines to paste (creates nothing; the plugin need not be on this box):
  srun-nccl-tests.sh -N 4 -g 8 --plugin-dir /shared/switchless -i eno1 --dry-run

Slurm options:
      --image IMAGE        container image for pyxis (default
                           ghcr.io/coreweave/nccl-tests:13.2.0-devel-ubuntu24.04-nccl2.29.7-1-7112046;
                           enroot < 4.0 needs REGISTRY#IMAGE: ghcr.io#coreweave/nccl-tests:TAG)
      --no-container       run the binaries on the hosts (no pyxis)
      --mounts LIST        extra --container-mounts entries (SRC:DST[,SRC:DST...])
      --srun-arg ARG       extra srun argument (repeatable), e.g. --srun-arg=--partition=b300
EOF
  sl_common_usage
}

while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help)
      usage
      exit 0
      ;;
    --image)
      [ $# -ge 2 ] || sl_die "--image needs a value"
      SL_IMAGE="$2"
      shift 2
      ;;
    --image=*)
      SL_IMAGE="${1#*=}"
      shift
      ;;
    --no-container)
      SL_CONTAINER=0
      shift
      ;;
    --mounts)
      [ $# -ge 2 ] || sl_die "--mounts needs a value"
      SL_MOUNTS="$2"
      shift 2
      ;;
    --srun-arg)
      [ $# -ge 2 ] || sl_die "--srun-arg needs a value"
      SL_SRUN_ARGS+=("$2")
      shift 2
      ;;
    --srun-arg=*)
      SL_SRUN_ARGS+=("${1#*=}")
      shift
      ;;
    --)
      shift
      SL_REST=("$@")
      break
      ;;
    --*=*)
      sl_parse_common "${1%%=*}" "${1#*=}"
      [ "$SL_SHIFT" != 0 ] || sl_die "unknown option '$1' (see --help)"
      shift
      ;;
    *)
      sl_parse_common "$@"
      [ "$SL_SHIFT" != 0 ] || sl_die "unknown option '$1' (see --help)"
      shift "$SL_SHIFT"
      ;;
  esac
done

sl_validate
sl_rank_env
sl_caller_env
sl_make_out
sl_order ""
sl_stage_preflight_files

plugin_in_container=""
mounts="$SL_OUT:$SL_OUT"
if [ -n "$SL_PLUGIN_DIR" ]; then
  if [ "$SL_CONTAINER" = 1 ]; then
    plugin_in_container=/opt/switchless
    mounts+=",$SL_PLUGIN_DIR:$plugin_in_container:ro"
  else
    plugin_in_container="$SL_PLUGIN_DIR"
  fi
fi
[ -z "$SL_MOUNTS" ] || mounts+=",$SL_MOUNTS"

# Environment for the ranks: srun exports the caller's environment (--export=ALL) and pyxis passes it
# into the container; OpenMPI/UCX settings keep MPI's own traffic on the bootstrap network (as in the
# seed's B300 run).
# shellcheck disable=SC2054 # the commas are inside values
exports=("${SL_RANK_ENV[@]}" PMIX_MCA_gds=hash 'OMPI_MCA_coll=^ucc,hcoll' OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,tcp UCX_TLS=tcp)
if [ -n "$SL_BOOT_IF" ]; then
  exports+=("OMPI_MCA_oob_tcp_if_include=$SL_BOOT_IF" "OMPI_MCA_btl_tcp_if_include=$SL_BOOT_IF" "UCX_NET_DEVICES=$SL_BOOT_IF")
fi
[ -z "$plugin_in_container" ] || exports+=("SWITCHLESS_PLUGIN_DIR=$plugin_in_container")
# --order: tasks laid out in the hostfile's order (srun -m arbitrary reads SLURM_HOSTFILE).
if [ -n "$SL_ORDERED" ]; then
  exports+=("SLURM_HOSTFILE=$SL_OUT/hostfile")
  if [ "$SL_DRY" = 1 ]; then
    echo "# $SL_OUT/hostfile, one host per line in rank order: ${SL_ORDERED//,/ }"
  else
    tr , '\n' <<< "$SL_ORDERED" > "$SL_OUT/hostfile"
  fi
fi
# enroot's Mellanox hook passes /dev/infiniband into the container only for the devices this names.
[ "$SL_CONTAINER" = 0 ] || exports+=("MELLANOX_VISIBLE_DEVICES=${MELLANOX_VISIBLE_DEVICES:-all}")
if [ "$SL_DRY" = 1 ]; then
  echo "# switchless nccl-tests dry run: paste these lines into bash to run the same"
  sl_show mkdir -p "$SL_OUT"
  sl_show_exports "${exports[@]}"
  if [ ${#SL_CALLER_ENV[@]} -gt 0 ]; then
    echo "# from this shell (srun --export=ALL passes them to every rank):"
    sl_show_exports "${SL_CALLER_ENV[@]}"
  fi
else
  export "${exports[@]}"
fi
sl_copy_staged

srun_cmd=(srun -N "$SL_NODES" --ntasks-per-node=1 --gpus-per-node="$SL_GPUS" --mpi=pmix -u -l --kill-on-bad-exit=1)
if [ "$SL_CONTAINER" = 1 ]; then
  srun_cmd+=(--container-image="$SL_IMAGE" --container-mounts="$mounts" --container-writable --no-container-mount-home)
fi
[ -z "$SL_ORDERED" ] || srun_cmd+=(-n "$SL_NODES" --distribution=arbitrary)
srun_cmd+=("${SL_SRUN_ARGS[@]}")

[ "$SL_DRY" = 1 ] || echo "switchless nccl-tests: ${SL_NODES} node(s) x ${SL_GPUS} GPU(s), tests: ${SL_TESTS}, output: ${SL_OUT}"
# --kill-on-bad-exit=0: every node finishes its preflight and reports, not only the first to fail.
sl_preflight "${srun_cmd[@]}" --kill-on-bad-exit=0 --export="ALL,SWITCHLESS_TEST=preflight" bash -c "$SL_RANK_WORD" rank.sh --preflight "${SL_PREFLIGHT_ARGS[@]}"
# Outside an allocation every srun is a job of its own, which Slurm may place on other nodes: the tests
# run on the nodes the preflight checked.
if [ -z "${SLURM_JOB_ID:-}" ] && [ -z "$SL_ORDERED" ] && [ -n "$SL_CHECKED_NODES" ]; then
  srun_cmd+=(-w "$SL_CHECKED_NODES")
fi
sl_test_args
status=0
for t in $SL_TESTS; do
  sl_bench "$t"
  cmd=("${srun_cmd[@]}" --export="ALL,SWITCHLESS_TEST=$t" bash -c "$SL_RANK_WORD" rank.sh "${SL_BENCH[@]}")
  if [ "$SL_DRY" = 1 ]; then
    sl_show "${cmd[@]}"
    sl_show_summarize "$t"
    continue
  fi
  echo "== ${t}_perf"
  rc=0
  sl_run "${cmd[@]}" 2>&1 | tee "$SL_OUT/$t.out" || rc=$?
  [ "$rc" = 0 ] || echo "switchless nccl-tests: ${t}_perf exited with status $rc"
  sl_summarize "$t" || rc=1
  [ "$rc" = 0 ] || status=1
done
exit "$status"
