#!/usr/bin/env bash
# Captures every node of a Slurm allocation (or a host list, over ssh) with `switchless doctor
# --capture`, then judges the cables between them with `switchless doctor --fleet`.
#
#   # inside salloc/sbatch, captures on a shared file system:
#   nccl-tests/fleet-doctor.sh -o /shared/fleet-$SLURM_JOB_ID
#   # four GB10s over ssh, JSON report:
#   nccl-tests/fleet-doctor.sh -H spark-1,spark-2,spark-3,spark-4 -- --json
#   # three GB10s against the cables file, each far end pinged once: one line per planned cable
#   nccl-tests/fleet-doctor.sh -H spark-a,spark-b,spark-c --plan plan.json --probe
set -euo pipefail

usage() {
  cat << 'EOF'
usage: fleet-doctor.sh [options] [-- doctor --fleet args, e.g. --json]

Captures each node's kernel files (what discovery reads, a few hundred small files) into DIR/<host>,
then runs `switchless doctor --fleet DIR/<host>...` here. Exit status: the fleet doctor's (0 clean,
1 warnings, 2 errors), or 2 when a node could not be captured.

Nodes:
  (default)                inside a Slurm allocation: one srun task per node (srun --ntasks-per-node=1),
                           each writing DIR/<its short hostname>; DIR must be on a file system every node sees
  -H, --hosts LIST         comma-separated hosts reached with ssh instead; each capture is made in a
                           temporary directory there and copied back with tar (DIR may be local)
Options:
  -o, --out DIR            where the captures go (default ./fleet-<job id or time>); must not exist or be empty
      --plan FILE          also judge the fabric against this plan (switchless plan --format json):
                           one line per planned cable (OK, wrong port and where it goes, down, half)
      --probe              each node pings every cable's far end once while capturing (doctor
                           --probe), so a cable in the wrong port is named even before any traffic
      --bin PATH           the switchless binary on the nodes (default: switchless on their PATH)
      --local-bin PATH     the switchless binary here (default: $SWITCHLESS_BIN, else switchless on PATH)
      --srun-arg ARG       extra srun argument (repeatable), e.g. --srun-arg=--partition=b300
      --dry-run            print the commands, run nothing
  -h, --help               this help
EOF
}

die() {
  echo "$(basename "$0"): $*" >&2
  exit 2
}

hosts=""
out=""
bin="switchless"
local_bin="${SWITCHLESS_BIN:-switchless}"
dry=0
plan=""
probe=""
srun_args=()
rest=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help)
      usage
      exit 0
      ;;
    -H | --hosts)
      hosts="${2:?-H needs a host list}"
      shift
      ;;
    -o | --out)
      out="${2:?-o needs a directory}"
      shift
      ;;
    --bin)
      bin="${2:?--bin needs a path}"
      shift
      ;;
    --local-bin)
      local_bin="${2:?--local-bin needs a path}"
      shift
      ;;
    --srun-arg=*) srun_args+=("${1#--srun-arg=}") ;;
    --srun-arg)
      srun_args+=("${2:?--srun-arg needs an argument}")
      shift
      ;;
    --plan)
      plan="${2:?--plan needs a file}"
      shift
      ;;
    --plan=*) plan="${1#--plan=}" ;;
    --probe) probe="--probe" ;;
    --dry-run) dry=1 ;;
    --)
      shift
      rest=("$@")
      break
      ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift
done

if [ -z "$hosts" ] && [ -z "${SLURM_JOB_NODELIST:-}" ]; then
  die "not inside a Slurm allocation (no SLURM_JOB_NODELIST): run it under salloc/sbatch, or give -H host1,host2"
fi
[ -n "$out" ] || out="./fleet-${SLURM_JOB_ID:-$(date +%Y%m%d-%H%M%S)}"
if [ -n "$plan" ] && [ ! -r "$plan" ]; then
  die "--plan $plan: cannot read it (expected the JSON of switchless plan --format json)"
fi
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2> /dev/null)" ]; then
  die "$out exists and is not empty (expected a new or empty directory)"
fi

run() {
  if [ "$dry" = 1 ]; then
    printf '+'
    printf ' %q' "$@"
    printf '\n'
  else
    "$@"
  fi
}

run mkdir -p "$out"
names=()
if [ -n "$hosts" ]; then
  IFS=, read -r -a list <<< "$hosts"
  for h in "${list[@]}"; do
    [ -n "$h" ] || continue
    names+=("$h")
    # The capture's own exit status is the doctor's verdict (1/2 with findings): judged below by
    # whether the tree arrived, not by it.
    remote="d=\$(mktemp -d) && { $(printf '%q' "$bin") doctor --capture \"\$d/c\" $probe > /dev/null || true; } && tar -C \"\$d\" -c c; rm -rf \"\$d\""
    run mkdir -p "$out/$h"
    if [ "$dry" = 1 ]; then
      run ssh "$h" "$remote"
    else
      # shellcheck disable=SC2029  # $bin is meant to expand here; the rest is escaped for the far side
      ssh "$h" "$remote" | tar -C "$out/$h" -x --strip-components=1 || echo "$(basename "$0"): $h: capture failed" >&2
    fi
  done
else
  n="${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-}}"
  [ -n "$n" ] || die "SLURM_JOB_NUM_NODES is not set"
  abs=$(cd "$out" 2> /dev/null && pwd || echo "$out")
  # shellcheck disable=SC2016  # expanded by the task's shell on each node
  run srun --ntasks-per-node=1 -N "$n" "${srun_args[@]}" bash -c \
    '"$1" doctor --capture "$2/$(hostname -s)" $3 > /dev/null || true' _ "$bin" "$abs" "$probe"
  if [ "$dry" = 0 ]; then
    for d in "$out"/*/; do
      names+=("$(basename "$d")")
    done
  fi
fi

paths=()
missing=0
for h in "${names[@]}"; do
  if [ "$dry" = 0 ] && [ -z "$(ls -A "$out/$h" 2> /dev/null)" ]; then
    echo "$(basename "$0"): no capture from $h" >&2
    missing=1
    continue
  fi
  paths+=("$h=$out/$h")
done
if [ "$dry" = 0 ] && [ "${#paths[@]}" -lt 2 ]; then
  die "fewer than two nodes captured (${#paths[@]}) under $out"
fi
rc=0
plan_args=()
[ -z "$plan" ] || plan_args=(--plan "$plan")
run "$local_bin" doctor --fleet "${paths[@]}" "${plan_args[@]}" "${rest[@]}" || rc=$?
if [ "$missing" = 1 ] && [ "$rc" -lt 2 ]; then
  rc=2
fi
exit "$rc"
