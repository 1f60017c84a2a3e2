#!/usr/bin/env bash
# The nccl-tests launchers under a real Slurm (Debian's 22.05: slurmctld, slurmd, srun, sbatch, munge),
# nodes as network namespaces (tests/slurm/cluster.sh), the benchmark `switchless bench` through the
# plugin's TCP paths (tests/slurm/bench-task.sh as the launchers' --bench-cmd), run as a user would:
#
#   * the runbook (docs/guide/slurm.md): its slurm.conf lines are the cluster's; its memlock claim
#     (tasks get slurmd's limit, not the login shell's; Slurm's default would copy the login shell's),
#     --export (srun --export=NONE drops the user's NCCL_* variables) and AllowedDevicesFile (22.05
#     ignores it with a warning) are checked against the daemons;
#   * srun-nccl-tests.sh and nccl-tests.sbatch on 2 and 4 nodes of a ring of cables: the preflight
#     (`switchless doctor` on every node), every test's data verified, every task saw NCCL_NET_PLUGIN,
#     NCCL_NET, the user's exported NCCL_* / NCCL_SWITCHLESS_* variables and slurmd's memlock limit, the
#     plugin applied the user's NCCL_SWITCHLESS_TCP_STREAMS, and `switchless nccl-tests summarize`
#     names the plugin on every rank's host;
#   * --order: the ranks follow a given host list (srun -m arbitrary, SLURM_HOSTFILE);
#   * fleet-doctor.sh over srun inside salloc: every node captured and judged;
#   * failures: a node whose doctor fails (its cables unaddressed) stops the job before any benchmark,
#     naming the node and the finding; a broken variable names every node; a task killed mid-run ends
#     the job with an error within seconds, no hang.
#
# Usage: tests/slurm/run.sh   (root; slurmctld, slurmd, slurm-client, munge, libpmix-dev: scripts/deps.d/slurm.txt)
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

[ "$(id -u)" -eq 0 ] || { echo "slurm: needs root (network namespaces, Slurm daemons)" >&2; exit 1; }
for t in ip unshare slurmctld slurmd srun sbatch salloc sinfo scontrol munged mungekey; do
  command -v "$t" > /dev/null || { echo "slurm: $t is missing (scripts/deps.d/slurm.txt lists the packages)" >&2; exit 1; }
done
# shellcheck source=tests/slurm/cluster.sh
. tests/slurm/cluster.sh

start=$(date +%s)
target="${CARGO_TARGET_DIR:-target}"
cargo build --quiet --locked --lib --bin switchless
trap swl_down EXIT
trap 'exit 130' INT TERM

fail() {
  echo "slurm: FAIL: $*" >&2
  exit 1
}

# ---------------------------------------------------------------------------------------------------
# Four nodes, cabled as a ring: 1-2, 2-3, 3-4, 4-1 (rank order 1..4 follows the cables).
swl_up 4 1-2 2-3 3-4 4-1
W="$SWL_W"
# The plugin "installed" with make install PREFIX=$W/prefix (what --plugin-dir takes).
mkdir -p "$W/prefix/lib" "$W/prefix/bin" "$W/out"
ln -s "$(readlink -f "$target/debug/libswitchless.so")" "$W/prefix/lib/libnccl-net-switchless.so"
ln -s "$(readlink -f "$target/debug/switchless")" "$W/prefix/bin/switchless"
bench_cmd="$repo/tests/slurm/bench-task.sh"
slurmd_memlock=$(grep '^Max locked memory' "/proc/$(cat "$W/spool/swl-n1/slurmd.pid")/limits" | awk '{print $4}')
user_memlock=$((SWL_USER_MEMLOCK_KIB * 1024))

# The user's environment: what the start pages tell them to export, and one plugin tunable.
export NCCL_SWITCHLESS_TRANSPORT=tcp NCCL_SWITCHLESS_TCP_STREAMS=2 NCCL_CROSS_NIC=1

# --- the runbook's claims, against the daemons ------------------------------------------------------
for want in "PropagateResourceLimitsExcept=MEMLOCK" "LimitMEMLOCK=infinity" "cgroup_allowed_devices_file" \
  "/dev/infiniband" "ConstrainDevices" "--export=NONE" "libpmix-dev"; do
  grep -qF -- "$want" docs/guide/slurm.md || fail "docs/guide/slurm.md does not mention $want"
done
lim=$(swl_login srun -N 2 -l grep '^Max locked memory' /proc/self/limits)
[ "$(grep -c "Max locked memory *$slurmd_memlock " <<< "$lim")" = 2 ] ||
  fail "PropagateResourceLimitsExcept=MEMLOCK: tasks should get slurmd's memlock ($slurmd_memlock), got: $lim"
lim=$(swl_login srun -N 2 -l --propagate=MEMLOCK grep '^Max locked memory' /proc/self/limits)
[ "$(grep -c "Max locked memory *$user_memlock " <<< "$lim")" = 2 ] ||
  fail "srun --propagate=MEMLOCK (Slurm's default, PropagateResourceLimits=ALL) should copy the login shell's $user_memlock, got: $lim"
swl_log "runbook: tasks get slurmd's memlock ($slurmd_memlock); propagated, the login shell's $user_memlock would reach them"
env_all=$(swl_login srun -N 1 /usr/bin/env)
env_none=$(swl_login srun -N 1 --export="NONE,SLURM_CONF=$W/etc/slurm.conf" /usr/bin/env)
grep -q '^NCCL_SWITCHLESS_TCP_STREAMS=2$' <<< "$env_all" || fail "srun (--export=ALL) lost NCCL_SWITCHLESS_TCP_STREAMS"
if grep -q '^NCCL_' <<< "$env_none"; then fail "srun --export=NONE passed NCCL_* variables: $(grep '^NCCL_' <<< "$env_none")"; fi
swl_log "runbook: --export=ALL passes the user's NCCL_* variables, --export=NONE drops them"
grep -q "AllowedDevicesFile option is obsolete" "$W"/log/slurmd1.out ||
  fail "slurmd 22.05 should call cgroup.conf's AllowedDevicesFile obsolete (docs/guide/slurm.md says it ignores it)"
swl_log "runbook: slurmd $(slurmd -V | awk '{print $2}') ignores AllowedDevicesFile (warns it is obsolete)"

# --- checks over one launcher run ---------------------------------------------------------------------
# check_run OUT NODES MODE... : every test's summary passes and names the plugin on every node; every
# rank's data checks passed; every task saw the variables and slurmd's memlock; the plugin used the
# user's stream count.
check_run() {
  local out="$1" nodes="$2" t f n r hosts=""
  shift 2
  for n in $(seq 1 "$nodes"); do hosts+="${hosts:+, }$(swl_host "$n")"; done
  for t in "$@"; do
    f="$out/$t.summary.txt"
    [ -s "$f" ] || fail "$out: no $t.summary.txt"
    grep -q '^result: PASS' "$f" || fail "$f: $(cat "$f")"
    grep -qF "network plugin 'switchless': used (NCCL used switchless on $nodes process(es); $nodes host(s): $hosts)" "$f" ||
      fail "$f does not name the plugin on all $nodes hosts ($hosts): $(grep "network plugin" "$f")"
    grep -q "^run 1: switchless bench" "$f" || fail "$f: not a bench run: $(head -n 3 "$f")"
    grep -q '# data checks: all passed' "$out/$t.out" || fail "$out/$t.out: rank 0's data checks: $(grep 'data checks' "$out/$t.out")"
    [ "$(grep -c 'done, all data checks passed' "$out/$t.out")" = $((nodes - 1)) ] ||
      fail "$out/$t.out: not every other rank passed its data checks"
    for r in $(seq 0 $((nodes - 1))); do
      f="$out/task.$t.$r.env"
      [ -s "$f" ] || fail "no $f: rank $r did not report"
      for want in NCCL_NET_PLUGIN=switchless NCCL_NET=switchless NCCL_SWITCHLESS_TRANSPORT=tcp \
        NCCL_SWITCHLESS_TCP_STREAMS=2 NCCL_CROSS_NIC=1 NCCL_SOCKET_IFNAME=mgmt "SWITCHLESS_PLUGIN_DIR=$W/prefix"; do
        grep -qxF "$want" "$f" || fail "rank $r of $t did not see $want: $(cat "$f")"
      done
      grep -qE "^Max locked memory +$slurmd_memlock " "$f" || fail "rank $r of $t: memlock is not slurmd's $slurmd_memlock: $(grep locked "$f")"
    done
    grep -h "NET/switchless: TCP path" "$out"/nccl."$t".*.log | grep -q "(2 streams" ||
      fail "$t: the plugin's route lines do not show NCCL_SWITCHLESS_TCP_STREAMS=2: $(grep -h 'TCP path' "$out"/nccl."$t".*.log | head -n 2)"
  done
}

# The launcher's options shared by every run: no container, the plugin prefix, bootstrap on mgmt, small
# sizes (debug build), the bench as the benchmark.
common=(-g 1 --no-container --plugin-dir "$W/prefix" -i mgmt -b 1K -e 256K -f 16 -n 3 --bench-cmd "$bench_cmd")

# --- srun-nccl-tests.sh from the login node, 2 and 4 nodes ---------------------------------------------
for nodes in 2 4; do
  tests=all_reduce,alltoall,sendrecv
  [ "$nodes" = 2 ] || tests=all_reduce,sendrecv # alltoall needs every pair cabled; the ring has not
  t0=$(date +%s%N)
  rc=0
  NCCL_NET=switchless swl_login timeout 120 nccl-tests/srun-nccl-tests.sh -N "$nodes" -t "$tests" "${common[@]}" \
    -o "$W/out/srun$nodes" > "$W/out/srun$nodes.log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || { tail -n 40 "$W/out/srun$nodes.log"; fail "srun-nccl-tests.sh -N $nodes exited $rc"; }
  grep -c "switchless preflight: node=swl-n[0-9] ok" "$W/out/srun$nodes.log" | grep -qx "$nodes" ||
    fail "srun -N $nodes: not every node passed the preflight: $(grep preflight "$W/out/srun$nodes.log")"
  check_run "$W/out/srun$nodes" "$nodes" ${tests//,/ }
  swl_log "srun-nccl-tests.sh -N $nodes ($tests): ok in $((($(date +%s%N) - t0) / 1000000)) ms"
done

# --- --order: ranks follow the given host list (srun -m arbitrary with SLURM_HOSTFILE) -----------------
# The ring rotated to start at swl-n3: rank 0 must be on swl-n3 and each rank's neighbours cabled to it.
t0=$(date +%s%N)
rc=0
NCCL_NET=switchless swl_login timeout 120 nccl-tests/srun-nccl-tests.sh -N 4 -t all_reduce "${common[@]}" \
  --order swl-n3,swl-n4,swl-n1,swl-n2 -o "$W/out/order" > "$W/out/order.log" 2>&1 || rc=$?
[ "$rc" = 0 ] || { tail -n 40 "$W/out/order.log"; fail "srun-nccl-tests.sh --order exited $rc"; }
check_run "$W/out/order" 4 all_reduce
r=0
for h in swl-n3 swl-n4 swl-n1 swl-n2; do
  grep -qx "SLURMD_NODENAME=$h" "$W/out/order/task.all_reduce.$r.env" ||
    fail "--order: rank $r ran on $(sed -n 's/^SLURMD_NODENAME=//p' "$W/out/order/task.all_reduce.$r.env"), not $h"
  r=$((r + 1))
done
swl_log "srun-nccl-tests.sh -N 4 --order swl-n3,swl-n4,swl-n1,swl-n2: ranks in that order, ok in $((($(date +%s%N) - t0) / 1000000)) ms"

# --- nccl-tests.sbatch, submitted from the repository root, 2 and 4 nodes ----------------------------
# sbatch exports the login shell's variables (--export=ALL, its default); --strict sets NCCL_NET.
for nodes in 2 4; do
  t0=$(date +%s%N)
  rc=0
  job=$(swl_login sbatch --parsable -N "$nodes" --gpus-per-node=1 -o "$W/out/sbatch$nodes.log" \
    nccl-tests/nccl-tests.sbatch "${common[@]}" --strict -t all_reduce -o "$W/out/sbatch$nodes")
  state=$(swl_job_wait "$job" 120)
  [ "$state" = "COMPLETED 0:0" ] || { tail -n 40 "$W/out/sbatch$nodes.log" || true; fail "sbatch -N $nodes nccl-tests.sbatch: job $job ended $state"; }
  check_run "$W/out/sbatch$nodes" "$nodes" all_reduce
  swl_log "sbatch -N $nodes nccl-tests.sbatch (all_reduce): ok in $((($(date +%s%N) - t0) / 1000000)) ms"
done

# --- fleet-doctor.sh over srun, inside an allocation ---------------------------------------------------
rc=0
swl_login timeout 60 salloc -N 4 nccl-tests/fleet-doctor.sh -o "$W/out/fleet" --bin "$W/prefix/bin/switchless" \
  --local-bin "$W/prefix/bin/switchless" > "$W/out/fleet.log" 2>&1 || rc=$?
[ "$rc" -le 1 ] || { cat "$W/out/fleet.log"; fail "fleet-doctor.sh exited $rc"; }
for n in 1 2 3 4; do
  [ -f "$W/out/fleet/swl-n$n/proc/sys/kernel/hostname" ] || fail "fleet-doctor.sh: no capture of swl-n$n: $(cat "$W/out/fleet.log")"
  grep -qE "^  swl-n$n .*single-host doctor exit [01] " "$W/out/fleet.log" || fail "fleet verdict lacks swl-n$n: $(cat "$W/out/fleet.log")"
done
swl_log "fleet-doctor.sh over srun: 4 nodes captured and judged (exit $rc)"

# --- failure: a node whose doctor fails stops the job before any benchmark ----------------------------
# swl-n3's cables lose their addresses: no /30 left, so with the user's NCCL_SWITCHLESS_TRANSPORT=tcp
# doctor finds no device for the plugin (an error).
ip -n "$(swl_ns 3)" addr flush dev to2
ip -n "$(swl_ns 3)" addr flush dev to4
rc=0
NCCL_NET=switchless swl_login timeout 120 nccl-tests/srun-nccl-tests.sh -N 4 -t all_reduce "${common[@]}" \
  -o "$W/out/badnode" > "$W/out/badnode.log" 2>&1 || rc=$?
[ "$rc" = 2 ] || { cat "$W/out/badnode.log"; fail "a failing node's preflight: exit $rc, expected 2"; }
grep -q "preflight failed, no benchmark run" "$W/out/badnode.log" || fail "no preflight verdict: $(cat "$W/out/badnode.log")"
grep -qE '^  swl-n3: switchless doctor.*\[tcp-no-links\]' "$W/out/badnode.log" ||
  fail "the failing node and its finding are not named: $(cat "$W/out/badnode.log")"
if grep -qE '^  swl-n[124]:' "$W/out/badnode.log"; then fail "a healthy node was blamed: $(cat "$W/out/badnode.log")"; fi
[ ! -e "$W/out/badnode/all_reduce.out" ] || fail "the benchmark ran after a failing preflight"
swl_log "a broken node stops the job: $(grep -E '^  swl-n3:' "$W/out/badnode.log" | cut -c1-160)"
ip -n "$(swl_ns 3)" addr add 10.210.2.2/30 dev to2
ip -n "$(swl_ns 3)" addr add 10.210.3.1/30 dev to4

# --- failure: a broken variable names every node -------------------------------------------------------
rc=0
NCCL_SWITCHLESS_TCP_STREAMS=0 swl_login timeout 120 nccl-tests/srun-nccl-tests.sh -N 2 -t all_reduce "${common[@]}" \
  -o "$W/out/badvar" > "$W/out/badvar.log" 2>&1 || rc=$?
[ "$rc" = 2 ] || { cat "$W/out/badvar.log"; fail "NCCL_SWITCHLESS_TCP_STREAMS=0: exit $rc, expected 2"; }
for n in 1 2; do
  grep -qE "^  swl-n$n: switchless doctor.*\[nccl-env\] NCCL_SWITCHLESS_TCP_STREAMS" "$W/out/badvar.log" ||
    fail "NCCL_SWITCHLESS_TCP_STREAMS=0 not named on swl-n$n: $(cat "$W/out/badvar.log")"
done
swl_log "a broken variable stops the job on every node: $(grep -E '^  swl-n1:' "$W/out/badvar.log" | cut -c1-160)"

# --- failure: a task killed mid-run ends the job with an error, no hang ---------------------------------
# A long all-reduce (4 MiB, many iterations); once rank 1's bench runs, it is killed by PID.
rc=0
NCCL_NET=switchless swl_login timeout 120 nccl-tests/srun-nccl-tests.sh -N 2 -t all_reduce "${common[@]}" \
  -b 4M -e 4M -n 100000 -o "$W/out/killed" > "$W/out/killed.log" 2>&1 &
launcher=$!
victim=""
for i in $(seq 1 300); do
  for p in $(ip netns pids "$(swl_ns 2)"); do
    if { tr '\0' ' ' < "/proc/$p/cmdline"; } 2> /dev/null | grep -q "switchless bench allreduce --rank 1 "; then victim=$p; fi
  done
  [ -z "$victim" ] || break
  sleep 0.1
done
[ -n "$victim" ] || { kill "$launcher" 2> /dev/null; cat "$W/out/killed.log"; fail "rank 1's bench never started"; }
sleep 1
kill -KILL "$victim"
t0=$(date +%s%N)
wait "$launcher" || rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$rc" != 0 ] || fail "the launcher passed a run whose task was killed"
[ "$rc" != 124 ] || fail "the launcher hung after a task was killed (timeout 120 s)"
[ "$ms" -lt 30000 ] || fail "the job took $ms ms to end after a task was killed"
grep -qiE "srun: error: swl-n2: task 1: Killed" "$W/out/killed.log" || fail "srun does not say which task died: $(tail -n 20 "$W/out/killed.log")"
grep -q "all_reduce_perf exited with status" "$W/out/killed.log" || fail "the launcher does not report the failed step: $(tail -n 20 "$W/out/killed.log")"
# The bench prints its table when a run completes: a killed run leaves none, and the summary says so.
if grep -q "^result: PASS" "$W/out/killed.log"; then fail "the summary passed the killed run: $(tail -n 20 "$W/out/killed.log")"; fi
grep -qE "^result: FAIL|no nccl-tests output in" "$W/out/killed.log" || fail "the summary does not flag the killed run: $(tail -n 20 "$W/out/killed.log")"
swl_log "a killed task ends the job in $ms ms, exit $rc: $(grep -m1 "Killed" "$W/out/killed.log"); summary: $(grep -m1 -oE "^result: FAIL|no nccl-tests output in" "$W/out/killed.log")"

# --- nothing of ours still runs in the cluster ---------------------------------------------------------
# (the killed job may still be COMPLETING for a moment: slurmd reports its end)
for i in $(seq 1 150); do
  left=$(swl_login squeue -h -o '%i %T' || true)
  [ -n "$left" ] || break
  sleep 0.1
done
[ -z "$left" ] || fail "jobs left in the queue after 15 s: $left"
swl_log "ok in $(($(date +%s) - start)) s"
