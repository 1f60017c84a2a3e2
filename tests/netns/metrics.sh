#!/usr/bin/env bash
# The plugin's per-path metrics against the bench's own byte counts, between two network namespaces
# joined by two veth /30 links (two TCP paths per connection, no RDMA):
#
#   * `switchless bench bandwidth` through the plugin .so on 2 ranks, each with
#     NCCL_SWITCHLESS_METRICS_DIR (its own directory) and a 200 ms snapshot period;
#   * `switchless watch --metrics-dir DIR --once --json` on each rank's directory: the bytes per path
#     (send paths of rank 0, receive paths of rank 1), summed, must match the bytes the bench says it
#     moved through the plugin (`plugin_bytes` of its --save-json report) within 1 %; the cable of
#     NCCL's device carries, the other one is a standby and carries nothing;
#   * `--prometheus` output parsed by prometheus_client's text parser and `--openmetrics` by its
#     OpenMetrics parser (python3-prometheus-client), the per-path byte counters equal to the JSON's;
#   * `watch --plot` draws the history into an SVG;
#   * attestation: the init line names version, commit and the SHA-256 of the loaded .so.
#
# Usage: tests/netns/metrics.sh   (root, iproute2, python3 with prometheus_client; builds debug)
set -euo pipefail
cd "$(dirname "$0")/../.."

[ "$(id -u)" -eq 0 ] || { echo "metrics.sh: needs root to create network namespaces" >&2; exit 1; }
command -v ip >/dev/null || { echo "metrics.sh: ip is missing (iproute2)" >&2; exit 1; }
# Debian's python3-prometheus-client lives in the system python (a pyenv or venv python3 first on PATH
# may not see it).
py=""
for p in python3 /usr/bin/python3; do
  if "$p" -c 'import prometheus_client' 2>/dev/null; then py="$p"; break; fi
done
[ -n "$py" ] ||
  { echo "metrics.sh: python3 prometheus_client is missing (scripts/deps.sh installs python3-prometheus-client)" >&2; exit 1; }

target="${CARGO_TARGET_DIR:-target}"
cargo build --quiet --lib --bin switchless
bin=$(readlink -f "$target/debug/switchless")
work=$(mktemp -d)
cp "$target/debug/libswitchless.so" "$work/libnccl-net-switchless.so"
so="$work/libnccl-net-switchless.so"

tag="swm$$"
namespaces=()
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
fail() { echo "metrics.sh: FAIL: $*" >&2; exit 1; }

for i in 0 1; do ip netns add "$tag-$i"; namespaces+=("$tag-$i"); ip -n "$tag-$i" link set lo up; done
for l in 1 2; do
  ip link add "$tag-$l-a" netns "$tag-0" type veth peer name "$tag-$l-b" netns "$tag-1"
  ip -n "$tag-0" link set "$tag-$l-a" name "cable$l"
  ip -n "$tag-1" link set "$tag-$l-b" name "cable$l"
  for i in 0 1; do
    ip -n "$tag-$i" addr add "10.78.$l.$((i + 1))/30" dev "cable$l"
    ip -n "$tag-$i" link set "cable$l" mtu 9000 up
  done
done

# The plugin takes a link only once its operstate is up: wait for the four veth ends.
for _ in $(seq 100); do
  n=$(for i in 0 1; do ip netns exec "$tag-$i" cat /sys/class/net/cable1/operstate /sys/class/net/cable2/operstate; done |
    grep -c '^up$' || true)
  [ "$n" = 4 ] && break
  sleep 0.1
done

for r in 0 1; do
  mkdir -p "$work/m$r"
  timeout 120 ip netns exec "$tag-$r" env NCCL_SWITCHLESS_TRANSPORT=tcp NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
    NCCL_SWITCHLESS_METRICS_DIR="$work/m$r" NCCL_SWITCHLESS_METRICS_INTERVAL=200ms \
    "$bin" bench bandwidth --rank "$r" --nranks 2 --bootstrap 10.78.1.1:29655 --plugin "$so" --timeout 30 \
    --no-progress -b 4096 -e 8M -f 4 -n 20 --save-json "$work/bw$r.json" >"$work/bench.$r" 2>&1 &
  pids+=($!)
done
st=0
for p in "${pids[@]}"; do wait "$p" || st=1; done
pids=()
if [ "$st" != 0 ]; then
  for r in 0 1; do echo "--- rank $r"; tail -n 30 "$work/bench.$r"; done
  fail "the bench failed"
fi

for r in 0 1; do
  ls "$work/m$r"/switchless-metrics-*.json >/dev/null 2>&1 || fail "rank $r wrote no snapshot in $work/m$r"
  ip netns exec "$tag-$r" "$bin" watch --metrics-dir "$work/m$r" --once --interval 0.1 --json >"$work/watch$r.json" ||
    fail "watch --json on rank $r"
  ip netns exec "$tag-$r" "$bin" watch --metrics-dir "$work/m$r" --once --interval 0.1 \
    --prometheus "$work/m$r.prom" >/dev/null || fail "watch --prometheus on rank $r"
  ip netns exec "$tag-$r" "$bin" watch --metrics-dir "$work/m$r" --once --interval 0.1 \
    --prometheus "$work/m$r.om" --openmetrics >/dev/null || fail "watch --openmetrics on rank $r"
done

"$py" - "$work" <<'EOF' || fail "counts or exposition"
import json, sys
from prometheus_client.parser import text_string_to_metric_families as prom
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om
w = sys.argv[1]
bench = [json.load(open(f"{w}/bw{r}.json")) for r in (0, 1)]
watch = [json.load(open(f"{w}/watch{r}.json")) for r in (0, 1)]
def paths(r, direction):
    return [p for p in watch[r]["plugin"]["paths"] if p["direction"] == direction]
checks = [
    ("rank 0 sent", bench[0]["plugin_bytes"]["sent_bytes"], paths(0, "send"), "sent_bytes"),
    ("rank 1 received", bench[1]["plugin_bytes"]["received_bytes"], paths(1, "recv"), "received_bytes"),
    ("rank 1 sent", bench[1]["plugin_bytes"]["sent_bytes"], paths(1, "send"), "sent_bytes"),
    ("rank 0 received", bench[0]["plugin_bytes"]["received_bytes"], paths(0, "recv"), "received_bytes"),
]
for what, want, ps, key in checks:
    got = sum(p[key] for p in ps)
    per = ", ".join(f'{p["netdev"]} {p[key]}' for p in ps)
    dev = abs(got - want) / max(want, 1) * 100
    print(f"metrics.sh: {what}: bench {want} B, plugin per path {per} = {got} B ({dev:.3f} % apart)")
    assert want > 0, what
    assert dev <= 1.0, f"{what}: {got} vs {want}"
    # NCCL's device is one cable here: its path carries, the other cable stands by (no data).
    assert len(ps) == 2, f"{what}: two paths per connection: {per}"
    for p in ps:
        assert (p[key] > 0) == (p["standby"] == 0), f"{what}: only the standby path is idle: {ps}"
for r in (0, 1):
    text = open(f"{w}/m{r}.prom").read()
    fams = {f.name: f for f in prom(text)}
    sent = {s.labels["netdev"]: s.value for s in fams["switchless_path_sent_bytes"].samples
            if s.labels["direction"] == "send"}
    want = {p["netdev"]: p["sent_bytes"] for p in paths(r, "send")}
    assert sent == want, (sent, want)
    assert fams["switchless_path_sent_bytes"].type == "counter"
    info = fams["switchless_build_info"].samples
    assert len(info) == 1 and len(info[0].labels["plugin_sha256"]) == 64, info
    ofams = {f.name: f for f in om(open(f"{w}/m{r}.om").read())}
    assert ofams["switchless_path_received_bytes"].type == "counter"
    assert ofams["switchless_path_received_bytes"].unit == "bytes"
    print(f"metrics.sh: rank {r}: Prometheus text ({len(fams)} families) and OpenMetrics ({len(ofams)}) parse")
EOF

# Attestation: the init line (NCCL_DEBUG=INFO through the bench's logger) names the .so and its hash.
want=$(sha256sum "$so" | cut -d' ' -f1)
grep -q "plugin $so sha256 $want" "$work/bench.0" ||
  { grep -m3 'initialized' "$work/bench.0" >&2 || true; fail "the init line does not name $so with sha256 $want"; }
echo "metrics.sh: the init line names the plugin's sha256 $want"

"$bin" watch --metrics-dir "$work/m0" --plot "$work/plot.svg" >/dev/null || fail "watch --plot"
if ! grep -q '<svg' "$work/plot.svg" || ! grep -q 'cable1' "$work/plot.svg"; then fail "the plot names no path"; fi
"$bin" watch --metrics-dir "$work/m0" --once --interval 0.1 --root "$work" | sed -n '/plugin counters/,$p'
echo "metrics.sh: ok"
