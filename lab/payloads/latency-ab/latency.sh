#!/bin/sh
# Payload for lab/run.sh --payload (check `payload`) on `pair`: two builds of switchless side by side
# in one boot, A B A B, with `ib_write_lat` on cable 1 between every two runs and the RoCE packets
# each node's rxe devices sent and received per run. A is the build in /opt/switchless (--bin-dir),
# B the one copied into this payload's b/ (its `switchless` and `libnccl-net-switchless.so`).
# Usage, from the repository root (B: another checkout's release build):
#   cp -r lab/payloads/latency-ab /tmp/ab && mkdir -p /tmp/ab/b
#   cp OTHER/target/release/switchless /tmp/ab/b/
#   cp OTHER/target/release/libswitchless.so /tmp/ab/b/libnccl-net-switchless.so
#   lab/run.sh --bin-dir target/release --payload /tmp/ab --check-timeout 1200 --checks payload pair
# Environment (--guest-env): LAT_ROUNDS (default 3), LAT_AHEAD (receives posted ahead, default 2),
# LAT_ITERS (bench round trips per run, default 300), LAT_BW (1: a 2 MiB bandwidth run of each build
# per round, default), LAT_BW_ITERS (default 10), LAT_BREAKDOWN (1: the bench's per-call breakdown,
# lines `BRK <tag> build A|B node N ...`), LAT_B_ENV (environment for build B's runs, NAME:VALUE
# pairs separated by commas, as --guest-env takes no `=` in a value: `NCCL_IB_HCA:rxe_eth1` when B
# is NCCL's IB transport, see ibext/build.sh). Output: payload.txt of each node, lines
# `WL <tag> t_min .. t_typical ..` (node 2), `BENCH <tag> build A|B ...: min .. median ..` and
# `BW <tag> build A|B ... algbw(Gb/s) ..` (node 1) and `PKTS ... rnr N retries N` (both).
[ "$LAB_NODE" -le 2 ] || exit 0
if [ "$LAB_NODE" = 1 ]; then rank=0; else rank=1; fi
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck disable=SC2086 # the link table entry is a list of fields
set -- $LAB_LINK_0
dev=$3; pip=$5; role=$7; gidx=$8
p=29950; wp=19500
cnt() { # the sum of rxe counter $1 over this node's devices
    s=0
    for f in /sys/class/infiniband/*/ports/1/hw_counters/"$1"; do
        [ -f "$f" ] && read -r v < "$f" && s=$((s + v))
    done
    echo "$s"
}
# RNR NAKs sent and received, and retries (a requester's retransmissions): all must stay 0.
nak() { echo $(($(cnt send_rnr_err) + $(cnt rcvd_rnr_err))); }
rty() { echo $(($(cnt completer_retry_err) + $(cnt duplicate_request))); }
pk0() { t0=$(cnt sent_pkts); r0=$(cnt rcvd_pkts); n0=$(nak); y0=$(rty); }
pk1() { echo "PKTS $1 node $LAB_NODE sent $(($(cnt sent_pkts) - t0)) rcvd $(($(cnt rcvd_pkts) - r0)) per $2 round trips (set-up included) rnr $(($(nak) - n0)) retries $(($(rty) - y0))"; }
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
pick() { # $1 build (A or B): sets bin, plug and envb (B's environment)
    if [ "$1" = A ]; then
        bin=/opt/switchless/bin/switchless; plug=/opt/switchless/lib/libnccl-net-switchless.so; envb=
    else
        bin=$here/b/switchless; plug=$here/b/libnccl-net-switchless.so; envb=$(echo "${LAT_B_ENV:-}" | tr ',:' ' =')
    fi
}
bw() { # $1 build, $2 round tag: 2 MiB messages over both cables
    p=$((p + 1)); pk0; pick "$1"
    # shellcheck disable=SC2086 # LAT_B_ENV is a list of K=V words
    env $envb "$bin" bench bandwidth --plugin "$plug" --rank $rank --nranks 2 --bootstrap "$LAB_BOOTSTRAP_IP:$p" \
        -b 2M -e 2M -n "${LAT_BW_ITERS:-10}" -w 2 --timeout 100 --no-progress > /tmp/w.txt 2>&1
    rc=$?
    awk -v t="$2" -v b="$1" -v rc=$rc '$1 == 2097152 {print "BW " t " build " b " rc " rc " algbw(Gb/s) " $7; exit}' /tmp/w.txt
    [ $rc -eq 0 ] || cat /tmp/w.txt
    pk1 "BW $2 build $1" "${LAT_BW_ITERS:-10}"
}
bench() { # $1 build (A or B), $2 round tag
    p=$((p + 1)); pk0; pick "$1"
    a=${LAT_AHEAD:-2}
    brk=; [ "${LAT_BREAKDOWN:-0}" = 1 ] && brk=--breakdown
    # shellcheck disable=SC2086 # LAT_B_ENV is a list of K=V words
    env $envb "$bin" bench latency --plugin "$plug" --rank $rank --nranks 2 --bootstrap "$LAB_BOOTSTRAP_IP:$p" \
        -b 8 -e 8 -n "${LAT_ITERS:-300}" -w 20 --timeout 100 --ahead "$a" --no-progress $brk > /tmp/b.txt 2>&1
    rc=$?
    sed -n "s/^# one-way us at 8 B (rank 0, per round trip \/ 2):/BENCH $2 build $1 ahead $a rc $rc:/p" /tmp/b.txt
    sed -n "s/^# breakdown/BRK $2 build $1 node $LAB_NODE: breakdown/p" /tmp/b.txt
    [ $rc -eq 0 ] || cat /tmp/b.txt
    pk1 "BENCH $2 build $1" "$((${LAT_ITERS:-300} + 20))"
}
r=1
while [ $r -le "${LAT_ROUNDS:-3}" ]; do
    wl "r$r-a"
    bench A "r$r"
    wl "r$r-b"
    bench B "r$r"
    if [ "${LAT_BW:-1}" = 1 ]; then bw A "r$r"; bw B "r$r"; fi
    r=$((r + 1))
done
wl end
