#!/usr/bin/env bash
# CI: shellcheck every shell script (nccl-tests/, docker/, scripts/, lab/, .ci/, tests/slurm/, tests/netns/), then smoke-test the
# nccl-tests launchers without a cluster (--dry-run, and rank.sh with `env` as the benchmark).
set -euo pipefail
cd "$(dirname "$0")/../.."

command -v shellcheck > /dev/null || {
  echo "shellcheck is not installed (scripts/deps.d/nccltests.txt lists it; run scripts/deps.sh)" >&2
  exit 1
}

mapfile -t files < <(
  {
    for d in nccl-tests docker scripts lab .ci tests/slurm tests/netns; do
      [ -d "$d" ] && find "$d" -type f \( -name '*.sh' -o -name '*.sbatch' \) -not -path '*/.cache/*'
    done
    [ -f .ci/run ] && echo .ci/run
  } | sort -u
)
echo "shellcheck: ${#files[@]} files"
sc_rc=0
shellcheck -x "${files[@]}" || sc_rc=$?

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "nccl-tests smoke: $*" >&2
  exit 1
}

# srun: pyxis flags, plugin mount, PMIx, bootstrap interface, debug logging, every test; every exported
# variable as an `export` line; the preflight before the benchmarks; nothing created.
mkdir -p "$tmp/p/lib" "$tmp/p/bin"
: > "$tmp/p/lib/libnccl-net-switchless.so"
out=$(nccl-tests/srun-nccl-tests.sh -N 2 -g 8 -t all --plugin-dir "$tmp/p" -i eno1 -o "$tmp/s" --dry-run -- -c 1)
for want in "--container-image=ghcr.io/coreweave/nccl-tests:13.2.0-devel-ubuntu24.04-nccl2.29.7-1-7112046" \
  "--container-mounts=$tmp/s:$tmp/s\\,$tmp/p:/opt/switchless:ro" "--mpi=pmix" "--ntasks-per-node=1" \
  "export NCCL_SOCKET_IFNAME=eno1" "export NCCL_NET_PLUGIN=switchless" "export NCCL_DEBUG_SUBSYS=INIT\\,NET" \
  "export SWITCHLESS_PLUGIN_DIR=/opt/switchless" "export PMIX_MCA_gds=hash" "export OMPI_MCA_pml=ob1" \
  "export OMPI_MCA_btl=self\\,tcp" "export OMPI_MCA_coll=\\^ucc\\,hcoll" "export UCX_TLS=tcp" \
  "export UCX_NET_DEVICES=eno1" "export OMPI_MCA_oob_tcp_if_include=eno1" "export OMPI_MCA_btl_tcp_if_include=eno1" \
  "bash -c \"\$(cat $PWD/nccl-tests/rank.sh)\" rank.sh" "rank.sh --preflight" \
  "all_reduce_perf -b 512M -e 16G -f 2 -g 8 -n 20 -c 1" all_gather_perf reduce_scatter_perf alltoall_perf \
  sendrecv_perf broadcast_perf; do
  grep -qF -- "$want" <<< "$out" || fail "srun dry run lacks '$want':"$'\n'"$out"
done
[ "$(grep -c '^srun .*_perf ' <<< "$out")" = 6 ] || fail "srun dry run: expected 6 benchmark commands"
[ "$(grep -c '^switchless nccl-tests summarize ' <<< "$out")" = 6 ] || fail "srun dry run: expected 6 summary commands"
[ "$(grep -c '^srun .*rank.sh --preflight' <<< "$out")" = 1 ] || fail "srun dry run: expected one preflight"
[ ! -e "$tmp/s" ] || fail "srun dry run created $tmp/s"
# A dry run rehearses without the plugin here (it says so); a real run refuses a missing --plugin-dir.
out=$(nccl-tests/srun-nccl-tests.sh --plugin-dir "$tmp/nonexistent" -o "$tmp/s" --dry-run 2>&1) || fail "dry run refused a missing --plugin-dir: $out"
grep -qF "# note: --plugin-dir $tmp/nonexistent has no lib/libnccl-net-switchless.so" <<< "$out" || fail "dry run: no note on the missing plugin: $out"
if err=$(nccl-tests/srun-nccl-tests.sh --plugin-dir "$tmp/nonexistent" -o "$tmp/s" 2>&1); then fail "a run accepted a missing --plugin-dir"; fi
grep -qF "has no lib/libnccl-net-switchless.so" <<< "$err" || fail "unclear error: $err"
[ ! -e "$tmp/s" ] || fail "a refused run created $tmp/s"
# sbatch template: the same, from the allocation's variables; nothing created.
out=$(cd "$tmp" && SWITCHLESS_REPO="$OLDPWD" SLURM_JOB_NUM_NODES=4 SLURM_GPUS_PER_NODE=b300:8 SLURM_JOB_ID=12345 \
  bash "$OLDPWD/nccl-tests/nccl-tests.sbatch" -t all_reduce --plugin-dir "$tmp/p" -i eno1 --dry-run)
grep -qF -- "srun -N 4 --ntasks-per-node=1 --gpus-per-node=8" <<< "$out" || fail "sbatch dry run: $out"
grep -qF -- "export SWITCHLESS_PLUGIN_DIR=/opt/switchless" <<< "$out" || fail "sbatch dry run: $out"
if [ -e "$tmp/nccl-tests-12345" ] || [ -e nccl-tests-12345 ]; then fail "sbatch dry run created its output directory"; fi

# Pasted, the srun dry run runs the same: a stand-in srun records what it gets, then runs the rank
# command once (rank.sh with `env` as the benchmark).
mkdir -p "$tmp/paste/bin"
cat > "$tmp/paste/bin/srun" << 'SRUN'
#!/usr/bin/env bash
# stand-in srun: apply --export=ALL,VAR=VALUE, drop the other options, run the command once
while [ $# -gt 0 ] && [ "$1" != bash ]; do
  case "$1" in --export=ALL,*) export "${1#--export=ALL,}" ;; esac
  shift
done
exec "$@"
SRUN
chmod +x "$tmp/paste/bin/srun"
out=$(nccl-tests/srun-nccl-tests.sh -N 2 -g 8 --no-container --no-preflight --plugin-dir "$tmp/p" -i eno1 \
  -o "$tmp/paste/out" --nccl-tests-dir /usr/bin --dry-run)
# (the summary line, which the dry run shows too, needs the benchmark's output: left out here)
pasted=$(cd "$tmp" && echo "${out//\/usr\/bin\/all_reduce_perf -b*/\/usr\/bin\/env}" | grep -v 'nccl-tests summarize' | env -i PATH="$tmp/paste/bin:$PATH" bash 2>&1) ||
  fail "the pasted dry run failed: $pasted"
for want in "SWITCHLESS_PLUGIN_DIR=$tmp/p" "LD_LIBRARY_PATH=$tmp/p/lib" "OMPI_MCA_btl_tcp_if_include=eno1" "PMIX_MCA_gds=hash" \
  "SWITCHLESS_TEST=all_reduce" "plugin=$tmp/p/lib/libnccl-net-switchless.so"; do
  grep -qF -- "$want" <<< "$pasted" || fail "the pasted dry run's rank lacks '$want':"$'\n'"$pasted"
done

# mpirun: hosts, -x forwarding, strict mode.
out=$(nccl-tests/mpirun-nccl-tests.sh -H a,b -g 1 -t sendrecv --strict --quiet -o "$tmp/m" --dry-run)
for want in "-H a:1\\,b:1" "-x NCCL_NET=switchless" "-x NCCL_DEBUG=WARN" "sendrecv_perf" "--map-by ppr:1:node"; do
  grep -qF -- "$want" <<< "$out" || fail "mpirun dry run lacks '$want':"$'\n'"$out"
done

# --bench-cmd: every rank runs CMD TEST ARGS instead of DIR/TEST_perf ARGS (both launchers).
out=$(nccl-tests/srun-nccl-tests.sh -N 2 -g 1 -t all_reduce,sendrecv --no-container --bench-cmd /opt/x/bench -o "$tmp/b" --dry-run)
for want in "rank.sh /opt/x/bench all_reduce -b 512M" "rank.sh /opt/x/bench sendrecv -b 512M"; do
  grep -qF -- "$want" <<< "$out" || fail "srun --bench-cmd dry run lacks '$want':"$'\n'"$out"
done
if grep -q "_perf" <<< "$out"; then fail "srun --bench-cmd still runs a *_perf binary: $out"; fi
out=$(nccl-tests/mpirun-nccl-tests.sh -H a,b -g 1 --bench-cmd bench -o "$tmp/mb" --dry-run)
grep -qF -- "rank.sh bench all_reduce -b 512M" <<< "$out" || fail "mpirun --bench-cmd dry run: $out"

# Bad input is refused with a message.
if err=$(nccl-tests/srun-nccl-tests.sh -t all_reduce,nope --dry-run 2>&1); then fail "accepted an unknown test"; fi
grep -q "unknown test 'nope'" <<< "$err" || fail "unclear error: $err"
if err=$(nccl-tests/mpirun-nccl-tests.sh -g 1 --dry-run 2>&1); then fail "accepted no hosts"; fi
grep -q -- "-H host1" <<< "$err" || fail "unclear error: $err"

# rank.sh: defaults, plugin dir on LD_LIBRARY_PATH, per-process NCCL log path, plugin found.
mkdir -p "$tmp/p/lib"
: > "$tmp/p/lib/libnccl-net-switchless.so"
env_out=$(env -u NCCL_NET_PLUGIN SWITCHLESS_LOG_DIR="$tmp/logs" SWITCHLESS_TEST=all_reduce SWITCHLESS_PLUGIN_DIR="$tmp/p" \
  NCCL_SOCKET_IFNAME=mgmt0 bash nccl-tests/rank.sh env 2> "$tmp/rank.err")
for want in "NCCL_NET_PLUGIN=switchless" "NCCL_SOCKET_IFNAME=mgmt0" "NCCL_DEBUG_FILE=$tmp/logs/nccl.all_reduce.%h.%p.log" \
  "LD_LIBRARY_PATH=$tmp/p/lib"; do
  grep -qF -- "$want" <<< "$env_out" || fail "rank.sh environment lacks '$want'"
done
grep -qF "plugin=$tmp/p/lib/libnccl-net-switchless.so" "$tmp/rank.err" || fail "rank.sh did not find the plugin: $(cat "$tmp/rank.err")"
# End to end through a stand-in srun (runs the rank command on two "nodes" here, one after the other)
# and a stand-in all_reduce_perf that prints a fixture: the preflight, rank.sh, the output files and
# the summary with its exit status.
bin="${CARGO_TARGET_DIR:-target}/debug/switchless"
cargo build --quiet --locked --bin switchless # a no-op when fresh; never a stale binary
bin=$(cd "$(dirname "$bin")" && pwd)/switchless
mkdir -p "$tmp/fake/bin" "$tmp/fake/nccl-tests"
cat > "$tmp/fake/bin/srun" << 'SRUN'
#!/usr/bin/env bash
# stand-in srun: drop srun's options, run the command on node1 and node2; FAKE_BAD_NODE's doctor fails
while [ $# -gt 0 ] && [ "$1" != bash ]; do shift; done
rc=0
for n in node1 node2; do
  if [ "$n" = "${FAKE_BAD_NODE:-}" ]; then bin="$FAKE_BAD_BIN"; else bin="$SWITCHLESS_BIN"; fi
  SLURMD_NODENAME=$n SWITCHLESS_BIN=$bin "$@" || rc=$?
  case "$*" in *--preflight*) ;; *) break ;; esac
done
exit "$rc"
SRUN
printf '#!/bin/sh\ncat "%s"\n' "$PWD/tests/fixtures/nccl-tests/b300-2node-all_reduce-switchless.log" > "$tmp/fake/nccl-tests/all_reduce_perf"
chmod +x "$tmp/fake/bin/srun" "$tmp/fake/nccl-tests/all_reduce_perf"
run_fake() {
  PATH="$tmp/fake/bin:$PATH" SWITCHLESS_BIN="$bin" nccl-tests/srun-nccl-tests.sh -N 2 -g 8 --no-container \
    --plugin-dir "$tmp/p" --preflight-arg=--root="$PWD/tests/fixtures/fabric/tcp-2link" \
    --nccl-tests-dir "$tmp/fake/nccl-tests" -o "$tmp/e2e" "$@"
}
run_fake --expect-busbw 6000Gb/s > "$tmp/e2e.log" 2>&1 || fail "wrapper failed a passing run: $(cat "$tmp/e2e.log")"
grep -q "switchless preflight: node=node2 ok" "$tmp/e2e.log" || fail "no preflight on node2: $(cat "$tmp/e2e.log")"
grep -q "network plugin 'switchless': used" "$tmp/e2e/all_reduce.summary.txt" || fail "no plugin verdict in the summary"
grep -q "^switchless: rank=0 " "$tmp/e2e/all_reduce.out" || fail "rank.sh banner missing from the output"
if run_fake --expect-busbw 800 > "$tmp/e2e.log" 2>&1; then fail "wrapper passed a run below --expect-busbw 800"; fi
grep -q "result: FAIL" "$tmp/e2e.log" || fail "no FAIL verdict: $(cat "$tmp/e2e.log")"
# The preflight stops the run naming the failing node: doctor finds an error there (memlock), or
# the plugin does not resolve.
rm -rf "$tmp/e2e"
# (the node's own host tree, whatever --root the launcher passes)
printf '#!/bin/sh\nexec "%s" doctor --root "%s"\n' "$bin" "$PWD/tests/fixtures/fabric/broken-memlock" > "$tmp/fake/bin/doctor-fails"
chmod +x "$tmp/fake/bin/doctor-fails"
if FAKE_BAD_NODE=node2 FAKE_BAD_BIN="$tmp/fake/bin/doctor-fails" run_fake > "$tmp/e2e.log" 2>&1; then
  fail "wrapper ran past a failing preflight: $(cat "$tmp/e2e.log")"
fi
grep -q "preflight failed, no benchmark run" "$tmp/e2e.log" || fail "no preflight verdict: $(cat "$tmp/e2e.log")"
grep -qE "^  node2: switchless doctor .*memlock-low" "$tmp/e2e.log" || fail "failing node not named: $(cat "$tmp/e2e.log")"
if grep -q "^  node1" "$tmp/e2e.log"; then fail "node1 blamed: $(cat "$tmp/e2e.log")"; fi
[ ! -e "$tmp/e2e/all_reduce.out" ] || fail "the benchmark ran after a failing preflight"
if PATH="$tmp/fake/bin:$PATH" SWITCHLESS_BIN="$bin" nccl-tests/srun-nccl-tests.sh -N 2 -g 8 --no-container \
  --preflight-arg=--root="$PWD/tests/fixtures/fabric/tcp-2link" --nccl-tests-dir "$tmp/fake/nccl-tests" \
  -o "$tmp/e2e2" > "$tmp/e2e.log" 2>&1; then fail "wrapper ran without a resolvable plugin"; fi
grep -q "node1: libnccl-net-switchless.so is not in LD_LIBRARY_PATH" "$tmp/e2e.log" || fail "plugin failure not named: $(cat "$tmp/e2e.log")"
# fleet-doctor.sh over a stand-in ssh (runs the command here, with HOST set) and a stand-in remote
# switchless that captures the fixture tree of that host: the four captures, then the fleet verdict.
cat > "$tmp/fake/bin/ssh" << 'SSH'
#!/usr/bin/env bash
# stand-in ssh: HOST CMD -> run CMD here with FAKE_HOST=HOST
FAKE_HOST="$1" exec bash -c "$2"
SSH
cat > "$tmp/fake/remote-switchless" << REMOTE
#!/usr/bin/env bash
# stand-in remote switchless: doctor --capture DIR of the fixture tree named by FAKE_HOST
exec "$bin" doctor --root "$PWD/tests/fixtures/fabric/fleet-gb10-ring4-faults/\$FAKE_HOST" "\${@:2}"
REMOTE
chmod +x "$tmp/fake/bin/ssh" "$tmp/fake/remote-switchless"
rc=0
PATH="$tmp/fake/bin:$PATH" nccl-tests/fleet-doctor.sh -H node1,node2,node3,node4 -o "$tmp/fleet" \
  --bin "$tmp/fake/remote-switchless" --local-bin "$bin" > "$tmp/fleet.log" 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "fleet-doctor.sh exited $rc on the faulty ring, expected 2: $(cat "$tmp/fleet.log")"
for want in "Cabling matrix" "[half-addressed]" "[duplicate-address] address 192.168.102.10" "node1  ·"; do
  grep -qF -- "$want" "$tmp/fleet.log" || fail "fleet-doctor.sh output lacks '$want': $(cat "$tmp/fleet.log")"
done
[ -f "$tmp/fleet/node3/proc/net/route" ] || fail "fleet-doctor.sh did not copy node3's capture back"
out=$(SLURM_JOB_NODELIST="n[1-2]" SLURM_JOB_NUM_NODES=2 nccl-tests/fleet-doctor.sh -o "$tmp/fl2" --dry-run -- --json)
for want in "srun --ntasks-per-node=1 -N 2" "doctor\\ --capture" "doctor --fleet" "--json"; do
  grep -qF -- "$want" <<< "$out" || fail "fleet-doctor.sh dry run lacks '$want': $out"
done
if err=$(env -u SLURM_JOB_NODELIST nccl-tests/fleet-doctor.sh 2>&1); then fail "fleet-doctor.sh ran outside Slurm without -H"; fi
grep -q "not inside a Slurm allocation" <<< "$err" || fail "unclear error: $err"
echo "nccl-tests scripts: OK"
if [ "$sc_rc" != 0 ]; then
  echo "shellcheck found problems (above)" >&2
  exit 1
fi
