#!/usr/bin/env bash
# CI step: reachability and fault runs of the soft-RoCE VM lab (lab/run.sh), through the plugin.
#  1. ring4 (1-2-3-4-1, each node cabled to its two neighbours only): `switchless bench latency`
#     between every pair of neighbours (bench:latency@A-B, a 2-rank job each), then no-route:1-3 and
#     no-route:2-4: nodes that share no cable must be refused fast (within LAB_NOROUTE_BOUND, 10 s)
#     with the plugin's "no local link reaches the peer ... shared subnet" error, never hang. Relays
#     off (NCCL_SWITCHLESS_RELAY=off): this is the routing refusal; with relays on, a connector asks
#     its neighbours' relays for up to 10 s first (tests/netns/relay.sh covers relays).
#  2a. pair with standby paths on (the default: each connection carries on NCCL's device's cable
#     and keeps the other cable as a standby path), one boot, three faults on the carrying cable,
#     each of which must COMPLETE on both nodes with the bench's data checks: fault:link-down (the
#     WARN names the standby taking over; the liveness channel on the dead cable times out and is
#     dropped, not fatal), fault:cable-pull (both ends down), fault:link-flap (down 2 s, then up:
#     node 1's log must show the path rebuilt and carrying traffic again, i.e. failback).
#  2. pair with one path per connection (NCCL_SWITCHLESS_STANDBY=0) and small RC timeouts (NCCL_IB_TIMEOUT=14 NCCL_IB_RETRY_CNT=3): fault:link-down (node 1
#     sets the cable its stream uses down mid-transfer: the side with a work request in flight on
#     it must fail with the path and the work-completion status), then fault:kill-peer (node 2 powers itself off mid-burst: node 1's
#     sends must fail within LAB_FAULT_BOUND (derived by lab/run.sh from the RC budget and the request
#     timeout: 20 s here, 12 s for cable-pull, which has no request timeout), with "transport retry counter exceeded (status 12)"
#     when a write was in flight, else with the request timeout naming the path). The side of fault:link-down with nothing in flight on the dead path learns of it
#     one of two ways, whichever comes first: the peer's process exits after its own error and the
#     handshake socket kept as the liveness channel ends ("connection over path(s) [0] ...: the peer
#     at ... is gone"), or NCCL_SWITCHLESS_REQUEST_TIMEOUT (5 s here) fails its requests with "made
#     no progress for ... on path(s) ...", well before the bench's own --timeout (LAB_FAULT_HANG=20 s). No hang
#     is allowed on either side. Node 1's error must say its port went down (asynchronous event
#     IBV_EVENT_PORT_ERR or the port's state, appended by the verbs fabric).
#  3. pair, one path per connection, fault:cable-pull (node 1 takes its end of the cable down mid-transfer, node 2 its end on
#     node 1's note: a pulled DAC) with NCCL_IB_TIMEOUT=14 NCCL_IB_RETRY_CNT=3 and no request
#     timeout: both sides must fail with an error naming the path within 20 s; a side with nothing
#     in flight can only do so through its port staying down past the RC retry budget.
#  4. ring4x (lab/topologies/ring4x.topo: ring4 cabled 1-3-2-4-1, so the pairs 1-2 and 3-4 share
#     no cable and the bench's rank-order ring 1 -> 2 -> 3 -> 4 -> 1 crosses both) with
#     NCCL_SWITCHLESS_TCP_FALLBACK=1 and relays off: `switchless bench alltoall` and `bench allreduce`
#     over all 4 nodes: each process holds RoCE connections to its neighbours and TCP connections
#     (over the management network) to its non-neighbour, and the plugin WARNs once per such peer.
#  5. ring4x with relays (the default) and no TCP fallback, the same benches (issue 30 item 5): both
#     pass with their data checks on all 4 nodes; each node's non-neighbour is reached through both
#     neighbours' relays (TCP legs on the cables): its connection's INFO line names each relay host
#     (`via relay nodeK (10.100...)`), the all-reduce's uncabled hops 1 -> 2 and 3 -> 4 go through
#     relays, and no path uses the fallback or the management network. The step prints the busbw of
#     both benches at 512 KiB, relays vs the fallback of part 4, as a ratio (never asserted).
# ~55 s (ring4) + ~170 s (standby pair) + ~60 s (pair) + ~25 s (cable-pull) + ~50-90 s each (ring4x
# fallback, ring4x relays) under TCG on 2 shared cores: 310-390 s in all (2026-12-04, load 4-6).
# Needs root, like 80-lab.sh. The
# binaries are the debug build (`cargo build` first: a no-op after `cargo test --all-targets`).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/x86-only.sh
source lab/x86-only.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
# The debug binaries, built now (a no-op when fresh): never those of older sources.
cargo build --quiet --locked --bin switchless --lib
bins=(--bin-dir "$CARGO_TARGET_DIR/debug")
res=lab/.cache/results
start=$(date +%s)

echo "== lab ring4: neighbours through the plugin, non-neighbours refused fast"
timeout 420 lab/run.sh "${bins[@]}" --timeout 300 --results "$res/ci-faults-ring4" \
    --guest-env "NCCL_SWITCHLESS_RELAY=off" --checks "bench:latency@1-2 bench:latency@2-3 bench:latency@3-4 bench:latency@4-1 no-route:1-3 no-route:2-4" \
    --bench-args "-b 8 -e 65536 -f 16 -n 5 -w 1 --timeout 60" ring4
j=$res/ci-faults-ring4/summary.jsonl
n=$(grep '"check":"no-route:' "$j" | grep '"status":"pass"' | grep -c 'no local link reaches the peer' || true)
[ "$n" = 4 ] || { echo "FAIL: no-route refused cleanly on $n of 4 node sides"; exit 1; }
n=$(grep '"check":"bench:latency@' "$j" | grep -c '"status":"pass"' || true)
[ "$n" = 8 ] || { echo "FAIL: bench latency passed on $n of 8 neighbour sides"; exit 1; }
grep -h 'CHECKOK no-route' "$res/ci-faults-ring4/summary.txt" | sed 's/: NCCL WARN.*//'

echo "== lab pair, standby paths on (the default): link-down, cable-pull and link-flap fail over and complete"
LAB_FAULT_HANG=150 LAB_LINKDOWN_ITERS=100 LAB_FLAP_ITERS=150 timeout 600 lab/run.sh "${bins[@]}" --timeout 480 \
    --results "$res/ci-standby-pair" \
    --guest-env "NCCL_IB_TIMEOUT=14 NCCL_IB_RETRY_CNT=3 NCCL_SWITCHLESS_REQUEST_TIMEOUT=5s NCCL_DEBUG=INFO" \
    --checks "fault:link-down fault:cable-pull fault:link-flap" pair
j=$res/ci-standby-pair/summary.jsonl
for f in link-down cable-pull link-flap; do
    n=$(grep "\"check\":\"fault:$f\"" "$j" | grep '"status":"pass"' | grep -c '"outcome":"completed"' || true)
    [ "$n" = 2 ] || { echo "FAIL: with a standby path, fault:$f completed on $n of 2 nodes"; exit 1; }
    grep -qh 'failing over to standby \[1\]' "$res/ci-standby-pair/node1/fault-$f.txt" ||
        { echo "FAIL: fault:$f: node 1 has no WARN naming the standby path taking over"; exit 1; }
done
grep -h 'failing over to standby' "$res"/ci-standby-pair/node1/fault-link-down.txt | head -n 1 | cut -c1-240
grep -q 'carries traffic again' "$res"/ci-standby-pair/node1/fault-link-flap.txt ||
    { echo "FAIL: fault:link-flap: node 1's path never carried traffic again (no failback)"; exit 1; }
grep -hE 'rebuilt: epoch|carries traffic again' "$res"/ci-standby-pair/node1/fault-link-flap.txt | head -n 3 | cut -c1-240
echo "== lab pair, one path per connection (NCCL_SWITCHLESS_STANDBY=0): fault:link-down, then fault:kill-peer"
LAB_FAULT_HANG=20 timeout 420 lab/run.sh "${bins[@]}" --timeout 300 \
    --results "$res/ci-faults-pair" \
    --guest-env "NCCL_IB_TIMEOUT=14 NCCL_IB_RETRY_CNT=3 NCCL_SWITCHLESS_REQUEST_TIMEOUT=5s NCCL_SWITCHLESS_STANDBY=0" \
    --checks "fault:link-down fault:kill-peer" pair
j=$res/ci-faults-pair/summary.jsonl
# Node 1 learns of the death one of two ways, both clean: a write in flight fails with retry
# exhaustion, or, when node 2's kernel (rxe answers in the kernel) acknowledged the last writes
# before it stopped and node 1 then waits for a clear-to-send that never comes, the request
# timeout names the path. Which one depends on where in the window the power-off lands.
kp=$(grep '"node":1,"check":"fault:kill-peer"' "$j" | grep '"status":"pass"' || true)
if grep -q 'failed: transport retry counter exceeded (status 12)' <<< "$kp"; then
    echo "kill-peer: node 1 failed with retry exhaustion (a write was in flight)"
elif grep -qE 'made no progress for [0-9]+ ms .*on path\(s\) \[0\]' <<< "$kp"; then
    echo "kill-peer: node 1 failed with the request timeout naming the path (no write was in flight)"
else
    echo "FAIL: node 1 did not fail cleanly (retry exhaustion or request timeout naming the path) after node 2 died"; exit 1
fi
grep '"check":"fault:link-down"' "$j" | grep '"status":"pass"' | grep -qE 'on path [0-9]+ \(.*\) failed: ' ||
    { echo "FAIL: neither node failed with the path's error after the link went down"; exit 1; }
# Node 1 took its own cable down: its error names the port as the device reports it (the
# asynchronous IBV_EVENT_PORT_ERR and/or the port's state when the error was built).
grep '"node":1,"check":"fault:link-down"' "$j" |
    grep -qE 'rxe_eth[0-9]+ port 1: IBV_EVENT_PORT_ERR|rxe_eth[0-9]+ port 1 is DOWN now|rxe_eth[0-9]+ port 1 has been down for ' ||
    { echo "FAIL: node 1's link-down error does not say its port went down"; exit 1; }
n=$(grep '"check":"fault:link-down"' "$j" | grep -c '"status":"pass"' || true)
[ "$n" = 2 ] || { echo "FAIL: fault:link-down passed (error or completion, no hang) on $n of 2 nodes"; exit 1; }
grep -hE 'CHECK(OK|XFAIL|FAIL) fault' "$res/ci-faults-pair/summary.txt" | sed 's/ path=0 label=.*//'
echo "== lab pair, one path per connection: fault:cable-pull (both ends down) with no request timeout: both sides must fail"
LAB_FAULT_HANG=20 timeout 420 lab/run.sh "${bins[@]}" --timeout 300 \
    --results "$res/ci-cablepull-pair" \
    --guest-env "NCCL_IB_TIMEOUT=14 NCCL_IB_RETRY_CNT=3 NCCL_SWITCHLESS_STANDBY=0" --checks "fault:cable-pull" pair
j=$res/ci-cablepull-pair/summary.jsonl
n=$(grep '"check":"fault:cable-pull"' "$j" | grep -c '"status":"pass"' || true)
[ "$n" = 2 ] || { echo "FAIL: fault:cable-pull passed (a clean error naming the path) on $n of 2 nodes"; exit 1; }
# A side with a work request in flight fails with its completion status; a side with nothing in
# flight (usually one of them) has no request timeout here, so only its port staying down past the
# RC retry budget can end its wait: without that it would hang and fail the check above.
echo "cable-pull: $(grep '"check":"fault:cable-pull"' "$j" | grep -c 'has been down for ' || true) of 2 sides failed through the port staying down"
grep -hE 'CHECK(OK|FAIL) fault' "$res/ci-cablepull-pair/summary.txt" | sed 's/ path=0 label=.*//'
# Parts 4 and 5 run the same benches on ring4x (ring4 cabled 1-3-2-4-1, out of rank order: the
# bench's rank-order ring all-reduce then crosses the two uncabled pairs 1-2 and 3-4, where on ring4
# it would stay on the cables), first over the TCP fallback, then through relays: same sizes, same
# iterations, so the busbw ratio printed at the end compares them in one run (never asserted).
ring_bench="-b 8 -e 512K -f 16 -n 5 -w 1 --timeout 120"
echo "== lab ring4x with the TCP fallback: alltoall and allreduce, RoCE to neighbours and TCP to non-neighbours"
timeout 420 lab/run.sh "${bins[@]}" --timeout 300 --results "$res/ci-fallback-ring4x" \
    --guest-env "NCCL_SWITCHLESS_TCP_FALLBACK=1 NCCL_SWITCHLESS_RELAY=off NCCL_DEBUG=INFO" --checks "bench:alltoall bench:allreduce" \
    --bench-args "$ring_bench" ring4x
j=$res/ci-fallback-ring4x/summary.jsonl
for m in alltoall allreduce; do
    n=$(grep "\"check\":\"bench:$m\"" "$j" | grep -c '"status":"pass"' || true)
    [ "$n" = 4 ] || { echo "FAIL: $m with the fallback passed on $n of 4 nodes"; exit 1; }
done
out=$res/ci-fallback-ring4x/node1/bench-alltoall.txt
# One WARN per peer that needs the fallback: each ring4x node has exactly one non-neighbour.
for f in "$res"/ci-fallback-ring4x/node*/bench-alltoall.txt; do
    n=$(grep -c 'TCP_FALLBACK=1 carries it over TCP' "$f" || true)
    [ "$n" = 1 ] || { echo "FAIL: $f has $n fallback WARNs, expected 1 (one non-neighbour)"; exit 1; }
done
grep -q 'connected to peer.* rxe_' "$out" || { echo "FAIL: node 1 has no RoCE connection"; exit 1; }
grep -qE '(connected to|accepted from) .* tcp [0-9.]+/24 ->' "$out" ||
    { echo "FAIL: node 1 has no TCP connection over the management network"; exit 1; }
grep -h 'TCP_FALLBACK=1 carries it' "$out" | head -n 1 | cut -c1-300

echo "== lab ring4x with relays (the default, no TCP fallback): alltoall and allreduce through the neighbours"
timeout 420 lab/run.sh "${bins[@]}" --timeout 300 --results "$res/ci-relay-ring4x" \
    --guest-env "NCCL_DEBUG=INFO" --checks "bench:alltoall bench:allreduce" --bench-args "$ring_bench" ring4x
d=$res/ci-relay-ring4x
j=$d/summary.jsonl
for m in alltoall allreduce; do
    n=$(grep "\"check\":\"bench:$m\"" "$j" | grep -c '"status":"pass"' || true)
    [ "$n" = 4 ] || { echo "FAIL: $m through relays passed (data checks included) on $n of 4 nodes"; exit 1; }
done
# Each node's non-neighbour goes through both its neighbours' relays: the connector's INFO line
# names each relay host (`-> <peer> via relay nodeK (<K's address>)`). Neighbours in ring4x:
# 1: 3 4, 2: 3 4, 3: 1 2, 4: 1 2. Nothing may take the TCP fallback or a management-network path.
for n in 1 2 3 4; do
    case $n in 1 | 2) relays="3 4" ;; *) relays="1 2" ;; esac
    f=$d/node$n/bench-alltoall.txt
    for k in $relays; do
        grep -qE "connected to peer .* via relay node$k \(10\.100\." "$f" ||
            { echo "FAIL: node $n's alltoall has no connection INFO line naming the relay host node$k"; exit 1; }
    done
    for m in alltoall allreduce; do
        ! grep -qE 'TCP_FALLBACK=1 carries it|\[[0-9]+\] [^ ]+ [^ ]+ 192\.168\.77\.[0-9]+/24 ->' "$d/node$n/bench-$m.txt" ||
            { echo "FAIL: node $n's $m used the TCP fallback or a management-network path"; exit 1; }
    done
done
# The rank-order ring all-reduce sends node 1 -> 2 and 3 -> 4 (uncabled) through relays.
for n in 1 3; do
    grep -qE 'connected to peer .* via relay node[0-9]' "$d/node$n/bench-allreduce.txt" ||
        { echo "FAIL: node $n's allreduce did not connect to its uncabled ring successor through relays"; exit 1; }
done
grep -hE 'connected to peer .* via relay node' "$d/node1/bench-alltoall.txt" | head -n 1 | sed -E 's/.*NET\/switchless: /    /' | cut -c1-400
# busbw at the largest size, rank 0's report: relays vs the fallback in this run (printed only).
python3 - "$res/ci-relay-ring4x/node1" "$res/ci-fallback-ring4x/node1" <<'PY'
import json, sys
for m in ("alltoall", "allreduce"):
    r, f = (json.load(open(f"{d}/bench-{m}.json"))["rows"][-1] for d in sys.argv[1:3])
    ratio = r["busbw_gbits_s"] / f["busbw_gbits_s"] if f["busbw_gbits_s"] > 0 else float("nan")
    print(f"lab ring4x {m} busbw at {r['size_bytes']} B: relays {r['busbw_gbits_s']:.4f} Gb/s, "
          f"TCP fallback {f['busbw_gbits_s']:.4f} Gb/s, ratio {ratio:.2f} (TCG VMs: ratios only)")
PY

echo "lab faults CI step passed in $(($(date +%s) - start)) s"
