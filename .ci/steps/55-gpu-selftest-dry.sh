#!/usr/bin/env bash
# The GPU self-test (nccl-tests/gpu-selftest.sh) without a GPU: shellcheck; the drivers' pure parts
# (selftest.py and nccllog.py unit tests, nccl_selftest.cu's host code built with g++ against stub
# headers and its values compared with selftest.py's); --dry-run prints the variables and commands
# and creates nothing; then the parts that need no GPU, for real, as root: two namespaces joined by
# a veth /30 made with iproute2 and again with util-linux + netlink.py (no ip), the plugin .so
# loaded and driven by `switchless bench` over the veth, the same-host fallback reported, and a
# plugin with a missing library reported as blocked. Bounded by `timeout`.
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() {
  echo "55-gpu-selftest: FAIL: $*" >&2
  exit 1
}
[ "$(id -u)" -eq 0 ] || fail "needs root to create network namespaces"
command -v shellcheck > /dev/null || fail "shellcheck is not installed (scripts/deps.d/nccltests.txt lists it)"
script=nccl-tests/gpu-selftest.sh
gpu=nccl-tests/gpu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

shellcheck -x "$script"

# --- the drivers' pure parts ---------------------------------------------------------------------------
python3 -m py_compile "$gpu"/*.py
# nccl_selftest.cu's host code: no nvcc here, so g++ with the stand-in CUDA/NCCL headers (gpu/stub/)
g++ -std=c++17 -Wall -Wextra -Werror -x c++ -I"$gpu/stub" -o "$tmp/nccl_selftest_host" "$gpu/nccl_selftest.cu"
out=$(NCCL_SELFTEST_HOST_BIN="$tmp/nccl_selftest_host" python3 -m unittest discover -s "$gpu" -p 'test_*.py' 2>&1) ||
  fail "unit tests: $out"
grep -q "^OK$" <<< "$out" || fail "unit tests: $out"
grep -q "skipped" <<< "$out" && fail "a unit test was skipped (the C driver's host build?): $out"
echo "55-gpu-selftest: unit tests: $(grep '^Ran ' <<< "$out")"
find "$gpu" -name __pycache__ -prune -exec rm -rf {} +

# --- --dry-run: every variable and command, nothing created ----------------------------------------------
before=$(git status --porcelain --untracked-files=all; ip netns list)
dry() {
  "$script" --dry-run --out "$tmp/dry" "$@" 2>&1 || fail "--dry-run $* exited with $?"
}
expect() { # label text wanted...
  local label="$1" text="$2" w
  shift 2
  for w in "$@"; do
    grep -qF -- "$w" <<< "$text" || fail "$label lacks '$w':"$'\n'"$text"
  done
}
d=$(dry)
expect "dry run" "$d" "export NCCL_NET_PLUGIN=/" "export NCCL_NET=switchless" "export NCCL_DEBUG=INFO" \
  "export NCCL_DEBUG_SUBSYS=INIT\\,NET" "export NCCL_SOCKET_IFNAME=cable0" "export NCCL_SWITCHLESS_TRANSPORT=tcp" \
  "+ ip netns add " "type veth peer name cable0 netns" "addr add 10.203.0.1/30 dev cable0" "link set cable0 mtu 9000 up" \
  "NCCL_HOSTID=switchless-selftest-host0" "NCCL_HOSTID=switchless-selftest-host1" \
  "NCCL_DEBUG_FILE=$tmp/dry/nccl.torch.rank0.%p.log" "NCCL_DEBUG_FILE=$tmp/dry/nccl.c.rank1.%p.log" \
  "bench bandwidth --rank 1 --nranks 2 --bootstrap 10.203.0.1:" "selftest.py run --rank 0 --nranks 2 --master 10.203.0.1:" \
  "nvcc -O2 -std=c++17" "-lnccl -Xlinker -rpath" "+ ln -sf " "/libnccl.so.2 $tmp/dry/build/libnccl.so" "nccl_selftest --rank 1 --nranks 2 --id-file" "selftest.py report" \
  "--max-bytes 256M" "dtypes float32\\,bfloat16" "dry run: nothing was created"
[ "$(grep -c 'timeout --kill-after=10 300 env NCCL_NET_PLUGIN=' <<< "$d")" = 6 ] || fail "dry run: expected 6 rank commands (bench, torch, c x 2):"$'\n'"$d"
d=$(dry --netns-tool unshare --drivers torch --max-bytes 1M)
expect "dry run (unshare)" "$d" "+ unshare --net sleep infinity" "netlink.py veth cable0 PID0 PID1" \
  "nsenter --net=/proc/PID1/ns/net python3" "up cable0 --mtu 9000 --addr 10.203.0.2/30" "--max-bytes 1M"
grep -q "nccl_selftest --rank" <<< "$d" && fail "dry run --drivers torch still runs the C driver"
d=$(dry --drivers torch --baseline socket --mps)
expect "dry run (baseline, MPS)" "$d" "nvidia-cuda-mps-control -d" "export CUDA_MPS_PIPE_DIRECTORY=$tmp/dry/mps/pipe" \
  "NCCL_NET_PLUGIN=none NCCL_NET=Socket" "NCCL_DEBUG_FILE=$tmp/dry/baseline.socket.rank1.%p.log" \
  "--results $tmp/dry/results.torch.socket.jsonl" "--baseline $tmp/dry/results.torch.socket.jsonl"
if "$script" --baseline ib --dry-run > /dev/null 2>&1; then fail "accepted an unknown baseline"; fi
d=$(dry --network same-host --no-gpu)
expect "dry run (same host)" "$d" "SAME-HOST FALLBACK" "export NCCL_SOCKET_IFNAME=lo" "--bootstrap 127.0.0.1:" "GPU parts skipped"
grep -q "ip netns" <<< "$d" && fail "dry run --network same-host makes namespaces"
d=$("$script" --stage --with-ibverbs --dry-run --stage-dir "$tmp/stage")
expect "dry run (stage)" "$d" "+ cargo build --release --locked --lib --bin switchless" "libnccl-net-switchless.so" "strip --strip-unneeded"
if [ -e "$tmp/dry" ] || [ -e "$tmp/stage" ]; then fail "--dry-run created its output directory"; fi
[ "$before" = "$(git status --porcelain --untracked-files=all; ip netns list)" ] || fail "--dry-run changed the work tree or left namespaces"
if err=$("$script" --collectives all_reduce,nope --dry-run 2>&1); then fail "accepted an unknown collective"; fi
grep -q "unknown 'nope'" <<< "$err" || fail "unclear error: $err"
if err=$("$script" --bogus 2>&1); then fail "accepted an unknown option"; fi
grep -q "unknown option '--bogus'" <<< "$err" || fail "unclear error: $err"
echo "55-gpu-selftest: --dry-run: ok"

# --- the parts without a GPU, for real (debug build, as .ci/steps/65-netns-bench.sh) ---------------------------
target="${CARGO_TARGET_DIR:-target}"
cargo build --quiet --locked --lib --bin switchless
so="$target/debug/libswitchless.so"
cli="$target/debug/switchless"
real() { # label args...: runs the script with --no-gpu, output in $tmp/<label>; sets rc
  local label="$1"
  shift
  rc=0
  timeout 300 "$script" --no-gpu --plugin "$so" --cli "$cli" --out "$tmp/$label" "$@" > "$tmp/$label.log" 2>&1 || rc=$?
}
for tool in ip unshare; do
  real "netns-$tool" --netns-tool "$tool"
  [ "$rc" = 0 ] || fail "--no-gpu --netns-tool $tool exited $rc:"$'\n'"$(cat "$tmp/netns-$tool.log")"
  log=$(cat "$tmp/netns-$tool.log")
  expect "--no-gpu ($tool)" "$log" "made with $tool" "plugin libraries: all found" "plugin check: OK, data verified" "result: PASS"
  python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); assert v["bench_gbit_s"] > 0, v' "$tmp/netns-$tool/veth.json" ||
    fail "no bench throughput in $tmp/netns-$tool/veth.json"
  # the bench's plugin saw the veth as its one point-to-point link
  grep -q "sl_cable0" "$tmp/netns-$tool"/bench.rank0.log "$tmp/netns-$tool"/bench.rank0.json ||
    fail "the bench did not run on sl_cable0:"$'\n'"$(cat "$tmp/netns-$tool"/bench.rank0.log)"
  echo "55-gpu-selftest: --no-gpu --netns-tool $tool: ok, $(grep -o 'plugin check: OK.*' "$tmp/netns-$tool.log")"
done
[ -z "$(ip netns list | grep swst || true)" ] || fail "namespaces left behind: $(ip netns list)"

# Same host: until the plugin carries a peer on its own host, the bench over 127.0.0.1 fails and
# the script says BLOCKED (exit 3); once it does, the check passes (exit 0).
real same-host --network same-host
case "$rc" in
  0) grep -q "plugin check: OK" "$tmp/same-host.log" || fail "same-host passed without the plugin check" ;;
  3) grep -q "BLOCKED: same-host fallback: the plugin did not carry two ranks of one host over 127.0.0.1" "$tmp/same-host.log" ||
    fail "same-host: exit 3 without saying why:"$'\n'"$(cat "$tmp/same-host.log")" ;;
  *) fail "same-host: exit $rc (expected 0 or 3):"$'\n'"$(cat "$tmp/same-host.log")" ;;
esac
echo "55-gpu-selftest: same-host fallback: exit $rc, $(grep -o -m1 'BLOCKED.*\|plugin check: OK.*' "$tmp/same-host.log" | cut -c1-200)"

# A plugin that cannot load (a NEEDED library missing, as libibverbs on a GPU host): blocked, named.
mkdir -p "$tmp/dep/lib"
echo 'int swl_selftest_dep(void) { return 1; }' > "$tmp/dep/dep.c"
echo 'int swl_selftest_dep(void); int swl_selftest_use(void) { return swl_selftest_dep(); }' > "$tmp/dep/use.c"
gcc -shared -fPIC -o "$tmp/dep/lib/libswlmissing.so.1" -Wl,-soname,libswlmissing.so.1 "$tmp/dep/dep.c"
gcc -shared -fPIC -o "$tmp/dep/libfake.so" "$tmp/dep/use.c" -L"$tmp/dep/lib" -l:libswlmissing.so.1
rc=0
timeout 120 "$script" --no-gpu --plugin "$tmp/dep/libfake.so" --cli "$cli" --stage-dir "$tmp/nostage" --out "$tmp/missing" > "$tmp/missing.log" 2>&1 || rc=$?
[ "$rc" = 3 ] || fail "a plugin with a missing library: exit $rc (expected 3):"$'\n'"$(cat "$tmp/missing.log")"
grep -q "BLOCKED: the plugin cannot load here: missing libswlmissing.so.1" "$tmp/missing.log" || fail "missing library not named:"$'\n'"$(cat "$tmp/missing.log")"
# ... and found in the stage directory's lib/ (where --stage --with-ibverbs puts libibverbs)
rc=0
timeout 120 "$script" --no-gpu --plugin "$tmp/dep/libfake.so" --cli "$cli" --stage-dir "$tmp/dep" --out "$tmp/staged" > "$tmp/staged.log" 2>&1 || rc=$?
grep -q "using the copies in $tmp/dep/lib" "$tmp/staged.log" || fail "stage lib/ not used:"$'\n'"$(cat "$tmp/staged.log")"
grep -q "plugin libraries: all found" "$tmp/staged.log" || fail "stage lib/ did not resolve the library:"$'\n'"$(cat "$tmp/staged.log")"
echo "55-gpu-selftest: missing library: blocked and named; found in the stage's lib/"
echo "55-gpu-selftest: ok"
