#!/usr/bin/env bash
# nccl-tests launchers, --order: an explicit host list reorders the ranks (mpirun -H, srun -m arbitrary with
# SLURM_HOSTFILE), a wrong list is refused, and --order auto captures every host (fleet-doctor.sh over a
# stand-in ssh that serves the fixture trees of a GB10 ring), asks `switchless doctor --fleet --order`, and
# launches the ranks in cable order although the hosts were given out of order.
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "46-launcher-order: $*" >&2
  exit 1
}

out=$(nccl-tests/mpirun-nccl-tests.sh -H a,b,c -g 1 --order c,a,b -o "$tmp/m" --dry-run)
grep -qF -- "-H c:1\\,a:1\\,b:1" <<< "$out" || fail "mpirun --order c,a,b: $out"
for bad in "x,a,b" "a,a,b" "a,b"; do
  if err=$(nccl-tests/mpirun-nccl-tests.sh -H a,b,c -g 1 --order "$bad" --dry-run 2>&1); then fail "accepted --order $bad"; fi
  grep -q -- "--order $bad" <<< "$err" || fail "unclear error for --order $bad: $err"
done
out=$(SLURM_JOB_ID=7 nccl-tests/srun-nccl-tests.sh -N 2 -g 8 --no-container --order n2,n1 -o "$tmp/s" --dry-run)
for want in "-n 2 --distribution=arbitrary" "export SLURM_HOSTFILE=$tmp/s/hostfile" "hostfile, one host per line in rank order: n2 n1"; do
  grep -qF -- "$want" <<< "$out" || fail "srun --order lacks '$want': $out"
done
out=$(nccl-tests/mpirun-nccl-tests.sh -H a,b,c -g 1 --order auto -o "$tmp/m2" --dry-run)
grep -qF -- "fleet-doctor.sh -o $tmp/m2/fleet" <<< "$out" || fail "auto dry run: $out"
grep -qF -- "-- --order" <<< "$out" || fail "auto dry run: $out"

# --order auto for real, with stand-ins for ssh, the remote CLI and mpirun (which records its arguments).
target="${CARGO_TARGET_DIR:-target}"
cargo build --quiet --locked --bin switchless
bin=$(cd "$target/debug" && pwd)/switchless
mkdir -p "$tmp/fake/bin"
cat > "$tmp/fake/bin/ssh" << 'SSH'
#!/usr/bin/env bash
FAKE_HOST="$1" exec bash -c "$2"
SSH
cat > "$tmp/fake/remote-switchless" << REMOTE
#!/usr/bin/env bash
exec "$bin" doctor --root "$PWD/tests/fixtures/fabric/fleet-gb10-ring4/\$FAKE_HOST" "\${@:2}"
REMOTE
cat > "$tmp/fake/bin/mpirun" << 'MPIRUN'
#!/usr/bin/env bash
echo "$*" >> "$FAKE_MPIRUN_LOG"
MPIRUN
chmod +x "$tmp/fake/bin/ssh" "$tmp/fake/remote-switchless" "$tmp/fake/bin/mpirun"
# The fixture's ring is node1-node2-node3-node4-node1; given as node1,node3,node2,node4, the ring would
# step between non-neighbours.
rc=0
FAKE_MPIRUN_LOG="$tmp/mpirun.log" PATH="$tmp/fake/bin:$PATH" SWITCHLESS_BIN="$bin" SWITCHLESS_NODE_BIN="$tmp/fake/remote-switchless" \
  nccl-tests/mpirun-nccl-tests.sh -H node1,node3,node2,node4 -g 1 --no-preflight --order auto -o "$tmp/run" \
  > "$tmp/run.log" 2>&1 || rc=$?
grep -q "rank order of the hosts: node1,node2,node3,node4" "$tmp/run.log" || fail "no order: $(cat "$tmp/run.log")"
grep -qF -- "-H node1:1,node2:1,node3:1,node4:1" "$tmp/mpirun.log" || fail "mpirun got: $(cat "$tmp/mpirun.log")"
[ -d "$tmp/run/fleet/node3" ] || fail "no capture of node3 under $tmp/run/fleet"
echo "46-launcher-order: ok (explicit lists, refusals, srun hostfile; auto: node1,node3,node2,node4 -> $(grep -o 'node1,node2,node3,node4' "$tmp/run.log" | head -1); exit $rc of the stand-in run)"
