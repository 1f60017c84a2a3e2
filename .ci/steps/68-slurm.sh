#!/usr/bin/env bash
# The nccl-tests launchers under a real Slurm (Debian's slurmctld, slurmd, srun/sbatch/salloc 22.05,
# munge), nodes as network namespaces cabled by veth /30s, the benchmark `switchless bench` over the
# plugin's TCP paths (tests/slurm/run.sh): srun-nccl-tests.sh and nccl-tests.sbatch on 2 and 4 nodes
# with data verified and every task's NCCL_* variables and memlock checked, --order, fleet-doctor.sh over srun,
# the runbook's settings (docs/guide/slurm.md), and the failures (a broken node, a broken variable, a
# killed task). Needs root; about 30 s after the build. The daemons and namespaces are removed on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" -eq 0 ] || { echo "68-slurm: needs root to create network namespaces and run Slurm's daemons" >&2; exit 1; }
timeout 300 tests/slurm/run.sh
echo "68-slurm: ok"
