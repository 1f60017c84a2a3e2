#!/bin/sh
# Payload for lab/run.sh --payload (check `payload`) on `pair`: `ib_write_lat` on cable 1 and
# `switchless bench latency` between nodes 1 and 2 in turn, in one boot, with the RoCE packets each
# node's rxe devices sent and received per run. On 2 shared host cores the medians of single runs
# are the host's; compare minimums, and medians over many rounds (docs/performance.md, "Latency in
# the soft-RoCE lab"). Usage, from the repository root:
#   cargo build --release
#   lab/run.sh --bin-dir target/release --payload lab/payloads/latency-vs-perftest \
#       --check-timeout 600 --checks payload pair
# Environment (--guest-env): LAT_ROUNDS (default 4), LAT_AHEAD (receives posted ahead, a list,
# default "2 1"), LAT_ITERS (bench round trips per run, default 300). Output: payload.txt of each
# node, lines `WL <round> t_min .. t_typical ..` (node 2), `BENCH <round> ahead N ...: min ..
# median ..` (node 1) and `PKTS ...` (both).
[ "$LAB_NODE" -le 2 ] || exit 0
if [ "$LAB_NODE" = 1 ]; then rank=0; else rank=1; fi
# shellcheck disable=SC2086 # the link table entry is a list of fields
set -- $LAB_LINK_0
dev=$3; pip=$5; role=$7; gidx=$8
p=29950; wp=19500
cnt() { # the sum of rxe counter $1 over this node's devices
    s=0
    for f in /sys/class/infiniband/*/ports/1/hw_counters/"$1"; do read -r v < "$f"; s=$((s + v)); done
    echo "$s"
}
pk0() { t0=$(cnt sent_pkts); r0=$(cnt rcvd_pkts); }
pk1() { echo "PKTS $1 node $LAB_NODE sent $(($(cnt sent_pkts) - t0)) rcvd $(($(cnt rcvd_pkts) - r0)) per $2 round trips (set-up included)"; }
wl() { # ib_write_lat, 1000 iterations, node 1 serves
    wp=$((wp + 1)); pk0
    cmd="ib_write_lat -d $dev -x $gidx -F -p $wp -s 2 -n 1000 -u 20"
    if [ "$role" = s ]; then
        $cmd > /tmp/wl.txt 2>&1
    else
        n=0
        until $cmd "$pip" > /tmp/wl.txt 2>&1; do
            grep -qE "Couldn't connect|Unable to open|refused|Failed to establish" /tmp/wl.txt || break
            n=$((n + 1)); [ $n -gt 100 ] && break; sleep 0.2
        done
        awk -v t="$1" '/^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+/{print "WL " t " t_min " $3 " t_typical " $5 " t_99 " $8; exit}' /tmp/wl.txt
    fi
    pk1 "WL $1" 1000
}
bench() { # $1 receives posted ahead, $2 round tag
    p=$((p + 1)); pk0
    /opt/switchless/bin/switchless bench latency --rank $rank --nranks 2 --bootstrap "$LAB_BOOTSTRAP_IP:$p" \
        -b 8 -e 8 -n "${LAT_ITERS:-300}" -w 20 --timeout 100 --ahead "$1" --breakdown --no-progress > /tmp/b.txt 2>&1
    rc=$?
    sed -n "s/^# one-way us at 8 B (rank 0, per round trip \/ 2):/BENCH $2 ahead $1 rc $rc:/p; s/^# breakdown/BREAKDOWN $2 ahead $1:/p" /tmp/b.txt
    [ $rc -eq 0 ] || cat /tmp/b.txt
    pk1 "BENCH $2 ahead $1" "$((${LAT_ITERS:-300} + 20))"
}
r=1
while [ $r -le "${LAT_ROUNDS:-4}" ]; do
    wl "r$r"
    for a in ${LAT_AHEAD:-2 1}; do bench "$a" "r$r"; done
    r=$((r + 1))
done
wl end
