#!/usr/bin/env bash
# Runs NVIDIA nccl-tests (built with MPI=1) with the switchless NCCL net plugin on hosts reached by
# Open MPI's mpirun over ssh (no Slurm), then summarizes each test.
#
#   # two GB10 / DGX Spark boxes, one GPU each, plugin installed in /usr/local, all six collectives:
#   nccl-tests/mpirun-nccl-tests.sh -H spark-a,spark-b -g 1 -t all -b 1M -e 16G --nccl-tests-dir ~/nccl-tests/build -i enP7s7
#   # four GB10s in a ring, all_reduce, fail below 185 Gb/s at the largest size:
#   nccl-tests/mpirun-nccl-tests.sh -H spark-a,spark-b,spark-c,spark-d -g 1 -b 1M -e 8G --expect-busbw 185Gb/s --nccl-tests-dir ~/nccl-tests/build
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

SL_HOSTS=""
SL_MPIRUN="${MPIRUN:-mpirun}"
SL_MPI_ARGS=()

usage() {
  cat << 'EOF'
usage: mpirun-nccl-tests.sh -H HOST,HOST[,...] [options] [-- nccl-tests args]

Starts one process per host (Open MPI: mpirun -H h1:1,h2:1 --map-by ppr:1:node), each driving
--gpus-per-node GPUs, with NCCL_NET_PLUGIN=switchless. The nccl-tests binaries, the plugin and this
output directory must exist at the same paths on every host (a shared file system, or copies).

Examples:
  # two GB10 / DGX Spark boxes, one GPU each, plugin in /usr/local, all six collectives:
  mpirun-nccl-tests.sh -H spark-a,spark-b -g 1 -t all -b 1M -e 16G --nccl-tests-dir ~/nccl-tests/build -i enP7s7
  # what would run, as lines to paste (creates nothing):
  mpirun-nccl-tests.sh -H spark-a,spark-b -g 1 -i enP7s7 --dry-run
  # four GB10s in a ring of cables, ranks in cable order (captures every host first):
  mpirun-nccl-tests.sh -H spark-a,spark-b,spark-c,spark-d -g 1 --order auto

mpirun options:
  -H, --hosts LIST         comma-separated host names (sets --nodes)
      --mpirun PATH        mpirun to use (default $MPIRUN or mpirun)
      --mpi-arg ARG        extra mpirun argument (repeatable)
EOF
  sl_common_usage
}

while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help)
      usage
      exit 0
      ;;
    -H | --hosts)
      [ $# -ge 2 ] || sl_die "$1 needs a value"
      SL_HOSTS="$2"
      shift 2
      ;;
    --hosts=*)
      SL_HOSTS="${1#*=}"
      shift
      ;;
    --mpirun)
      [ $# -ge 2 ] || sl_die "--mpirun needs a value"
      SL_MPIRUN="$2"
      shift 2
      ;;
    --mpi-arg)
      [ $# -ge 2 ] || sl_die "--mpi-arg needs a value"
      SL_MPI_ARGS+=("$2")
      shift 2
      ;;
    --mpi-arg=*)
      SL_MPI_ARGS+=("${1#*=}")
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

[ -n "$SL_HOSTS" ] || sl_die "give the hosts with -H host1,host2[,...]"
IFS=, read -r -a hosts <<< "$SL_HOSTS"
SL_NODES=${#hosts[@]}
sl_validate
sl_order "$SL_HOSTS"
[ -z "$SL_ORDERED" ] || IFS=, read -r -a hosts <<< "$SL_ORDERED"
sl_rank_env
[ -z "$SL_PLUGIN_DIR" ] || SL_RANK_ENV+=("SWITCHLESS_PLUGIN_DIR=$SL_PLUGIN_DIR")
sl_caller_env
sl_make_out
sl_stage_preflight_files

host_list=""
for h in "${hosts[@]}"; do
  host_list+="${host_list:+,}$h:1"
done

# Open MPI forwards an environment variable to the ranks only when named with -x: the launcher's own,
# then every NCCL_* (and NCCL_SWITCHLESS_*) variable of this shell, as srun --export=ALL would.
mpi=("$SL_MPIRUN" -np "$SL_NODES" -H "$host_list" --map-by ppr:1:node --bind-to none --tag-output)
for kv in "${SL_RANK_ENV[@]}" "${SL_CALLER_ENV[@]}"; do
  mpi+=(-x "$kv")
done
mpi+=(-x LD_LIBRARY_PATH -x PATH)
if [ -n "$SL_BOOT_IF" ]; then
  mpi+=(--mca oob_tcp_if_include "$SL_BOOT_IF" --mca btl_tcp_if_include "$SL_BOOT_IF")
fi
mpi+=(--mca btl "self,tcp" --mca pml ob1 "${SL_MPI_ARGS[@]}")

if [ "$SL_DRY" = 1 ]; then
  echo "# switchless nccl-tests dry run: paste these lines into bash to run the same (-x passes each variable)"
  [ ${#SL_CALLER_ENV[@]} = 0 ] || echo "# from this shell, passed to every rank with -x: ${SL_CALLER_ENV[*]%%=*}"
  sl_show mkdir -p "$SL_OUT"
else
  echo "switchless nccl-tests: hosts ${SL_HOSTS}, ${SL_GPUS} GPU(s) each, tests: ${SL_TESTS}, output: ${SL_OUT}"
fi
sl_copy_staged
sl_preflight "${mpi[@]}" -x "SWITCHLESS_TEST=preflight" bash -c "$SL_RANK_WORD" rank.sh --preflight "${SL_PREFLIGHT_ARGS[@]}"
sl_test_args
status=0
for t in $SL_TESTS; do
  sl_bench "$t"
  cmd=("${mpi[@]}" -x "SWITCHLESS_TEST=$t" bash -c "$SL_RANK_WORD" rank.sh "${SL_BENCH[@]}")
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
