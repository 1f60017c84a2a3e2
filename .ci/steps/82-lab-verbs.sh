#!/usr/bin/env bash
# CI step: the tests that have a branch for hosts with RDMA devices, run where verbs exist: inside
# the soft-RoCE VM lab (lab/run.sh pair: 2 nodes, 2 cables), through its `payload` check. The step
# builds the test binaries (cargo test --no-run; paths from --message-format=json): tests/abi.rs,
# tests/bench_host.rs, tests/relay_verbs.rs (a verbs relay leg A -> K -> B over real queue pairs)
# and the library's unit tests, plus the cdylib they load and the
# examples verbs_smoke and async_events; lab/guest/verbs-tests.sh runs them in both VMs. Then it
# counts, per node, what ran; a test whose RDMA branch did not run there fails the step:
#   * every RDMA-BRANCH marker the sources print (grep of src/ and tests/: `println!("RDMA-BRANCH
#     …")` and tests/abi.rs's `rdma_branch("…")`), on every node;
#   * four `test result: ok` lines with tests passed and none failed;
#   * verbs_smoke: one SMOKE PASS per cable of the node, and the error path (bad rkey -> remote
#     access error, then a flushed request) on the client end of every cable;
#   * async_events: IBV_EVENT_PORT_ERR and IBV_EVENT_PORT_ACTIVE on the node's first cable.
# About 60-120 s under TCG on 2 shared cores, plus the build when cargo test has not run. Needs
# root, like 80-lab.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/x86-only.sh
source lab/x86-only.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
fail() { echo "82-lab-verbs: FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pl=$tmp/payload
mkdir -p "$pl"

cargo test --no-run --locked --message-format=json --lib --test abi --test bench_host --test relay_verbs 2> "$tmp/build.err" > "$tmp/tests.json" ||
  { cat "$tmp/build.err" >&2; fail "cargo test --no-run"; }
cargo build --locked --message-format=json --example verbs_smoke --example async_events 2> "$tmp/build.err" > "$tmp/examples.json" ||
  { cat "$tmp/build.err" >&2; fail "cargo build --examples"; }
art() { # $1 json file, $2 jq filter -> one path
  local p
  p=$(jq -r "select(.reason == \"compiler-artifact\") | $2" "$1" | tail -n 1)
  if [ -z "$p" ] || [ ! -f "$p" ]; then fail "no artifact for $2 in $1"; fi
  echo "$p"
}
cp "$(art "$tmp/tests.json" 'select(.target.name == "abi" and .profile.test) | .executable')" "$pl/abi"
cp "$(art "$tmp/tests.json" 'select(.target.name == "bench_host" and .profile.test) | .executable')" "$pl/bench_host"
cp "$(art "$tmp/tests.json" 'select(.target.name == "relay_verbs" and .profile.test) | .executable')" "$pl/relay_verbs"
cp "$(art "$tmp/tests.json" 'select(.target.name == "switchless" and .profile.test and (.target.kind | index("rlib"))) | .executable')" "$pl/unit"
# tests/abi.rs and bench_host.rs load the plugin from next to their executable.
cp "$(art "$tmp/tests.json" 'select(.target.name == "switchless" and (.profile.test | not) and (.target.kind | index("cdylib"))) | .filenames[] | select(endswith(".so"))')" "$pl/libswitchless.so"
cp "$(art "$tmp/examples.json" 'select(.target.name == "verbs_smoke") | .executable')" "$pl/verbs_smoke"
cp "$(art "$tmp/examples.json" 'select(.target.name == "async_events") | .executable')" "$pl/async_events"
install -m 755 lab/guest/verbs-tests.sh "$pl/run"

# The markers the sources print in their RDMA branches.
mapfile -t want < <({
  # (abi's helper prints "abi::{test}": its literal ends in "::" and is left out)
  grep -rhoE 'println!\("RDMA-BRANCH [A-Za-z0-9_:]+' src tests | sed 's/.*RDMA-BRANCH //' | grep -v '::$'
  grep -hoE 'rdma_branch\("[a-z0-9_]+"\)' tests/abi.rs | sed -E 's/rdma_branch\("(.*)"\)/abi::\1/'
} | sort -u)
[ "${#want[@]}" -ge 6 ] || fail "found only ${#want[@]} RDMA-BRANCH markers in the sources: ${want[*]}"

res=lab/.cache/results/ci-verbs
start=$(date +%s)
timeout 600 lab/run.sh --no-switchless --payload "$pl" --checks payload --check-timeout 420 --timeout 540 \
  --results "$res" pair || fail "the lab run failed (see $res/summary.txt)"
cables_total=0 errpath=0
for n in 1 2; do
  out=$res/node$n/payload.txt
  [ -s "$out" ] || fail "node $n: no $out"
  ! grep -q '^PAYLOAD-FAIL' "$out" || fail "node $n: $(grep '^PAYLOAD-FAIL' "$out" | head -3)"
  for m in "${want[@]}"; do
    # libtest prints it after "test NAME ... ", at the end of that line
    grep -qE "RDMA-BRANCH ${m}\$" "$out" || fail "node $n: the RDMA branch of $m did not run (no 'RDMA-BRANCH $m')"
  done
  ok=$(grep -cE '^test result: ok\. [1-9][0-9]* passed; 0 failed' "$out" || true)
  [ "$ok" = 4 ] || fail "node $n: $ok of 4 test binaries passed tests: $(grep '^test result' "$out" | tr '\n' ' ')"
  nl=$(sed -n 's/^LAB_NLINKS=//p' "$res/node$n/lab.env")
  pass=$(grep -c "^SMOKE PASS node $n cable " "$out" || true)
  [ "$pass" = "$nl" ] || fail "node $n: verbs_smoke passed on $pass of $nl cables"
  cables_total=$((cables_total + nl))
  errpath=$((errpath + $(grep -c '^SMOKE cable [0-9]* error path ok: ' "$out" || true)))
  grep -q "^ASYNC-EVENTS node $n " "$out" || fail "node $n: async_events saw no port going down and up"
  echo "82-lab-verbs: node $n: ${#want[@]} RDMA branches, 4 test binaries, $pass cables, port events: ok"
done
# Each cable has one client end, which checks the error path.
[ "$errpath" -eq $((cables_total / 2)) ] || fail "the bad-rkey/flush error path ran on $errpath of $((cables_total / 2)) cables"
echo "82-lab-verbs: passed in $(($(date +%s) - start)) s (lab run included)"
