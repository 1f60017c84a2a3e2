#!/bin/sh
# In-VM check runner (busybox sh). Reads the node's link table (/tmp/lab.env, written by /init) and
# runs the checks in $L_checks (from the topology file or CHECKS) in order:
#   write_bw read_bw send_bw write_lat send_lat read_lat pingpong
#       perftest on every cable of this node, one cable at a time in global link order (both
#       ends walk the links in the same order, so no topology can deadlock); the lower node of a
#       cable is the server.
#   doctor      `switchless doctor` (and --json); passes when it finds no error (exit 0 or 1)
#   bench:MODE  (MODE = latency | bandwidth | alltoall | allreduce)
#       `switchless bench MODE` on every node at once, rank = node - 1, bootstrap at node 1's
#       management address.
# Each check's stdout goes to /results/<check>[-link<L>].txt; one JSON object per check and cable
# is appended to /results/checks.jsonl (the machine-readable summary). Exit status 0 = all passed.
# shellcheck disable=SC1091,SC2154 # LAB_*/L_* variables come from /tmp/lab.env and /etc/lab.conf
# shellcheck disable=SC2086 # command lines and link records are split into words on purpose
set -a; . /tmp/lab.env; set +a
. /etc/lab.conf
# --guest-env: NAME=VALUE words, checked on the host
for kv in $L_env; do export "${kv?}"; done
R=/results
SW=/opt/switchless/bin/switchless
J=$R/checks.jsonl
: > $J
say() { echo "LAB[$LAB_NODE] $*"; }
up() { cut -d' ' -f1 /proc/uptime; }
dt() { awk -v a="$1" -v b="$(up)" 'BEGIN{printf "%.2f", b-a}'; }
fail=0
# JSON line: $1 check, $2 link id (or null), $3 peer node (or null), $4 role, $5 status, $6 rc,
# $7 seconds, $8 metrics object, $9 output file
jl() {
    printf '{"node":%s,"check":"%s","link":%s,"peer":%s,"role":"%s","status":"%s","rc":%s,"seconds":%s,"metrics":%s,"output":"%s"}\n' \
        "$LAB_NODE" "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$8" "$9" >> $J
}
# the link table itself, so the host summary shows subnets, GID indexes and active_mtu
i=0
while [ $i -lt "$LAB_NLINKS" ]; do
    eval "set -- \$LAB_LINK_$i"
    jl link "$1" "$6" "$7" pass 0 0 \
        "{\"ifname\":\"$2\",\"dev\":\"$3\",\"local_ip\":\"$4\",\"peer_ip\":\"$5\",\"prefixlen\":$9,\"gid_index\":$8,\"netdev_mtu\":$LAB_MTU,\"active_mtu\":${10}}" ""
    say "link $1 $2 $3 $4/$9 -> $5 (node $6, role $7) gid_index $8 active_mtu ${10}"
    i=$((i + 1))
done

perftest_metrics() { # $1 test, $2 output file -> JSON object (client side)
    case $1 in
        *_bw) awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+/{printf "{\"size_B\":%s,\"iterations\":%s,\"bw_peak_Gbps\":%s,\"bw_avg_Gbps\":%s,\"msg_rate_Mpps\":%s}", $1, $2, $3, $4, $5; f=1; exit} END{if(!f) printf "{}"}' "$2" ;;
        *_lat) awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+/{printf "{\"size_B\":%s,\"iterations\":%s,\"t_min_us\":%s,\"t_max_us\":%s,\"t_typical_us\":%s,\"t_avg_us\":%s,\"t_stdev_us\":%s,\"t_99_us\":%s,\"t_99_9_us\":%s}", $1, $2, $3, $4, $5, $6, $7, $8, $9; f=1; exit} END{if(!f) printf "{}"}' "$2" ;;
        pingpong) awk '/bytes in .* seconds =/{m=$(NF-1)} /iters in .* seconds =/{u=$(NF-1)} END{printf "{\"bw_Mbps\":%s,\"usec_per_iter\":%s}", (m==""?"null":m), (u==""?"null":u)}' "$2" ;;
        *) printf '{}' ;;
    esac
}

run_perftest() { # $1 test, $2 check index
    t=$1; k=$2; i=0
    while [ $i -lt "$LAB_NLINKS" ]; do
        eval "set -- \$LAB_LINK_$i"
        lid=$1; ifn=$2; dev=$3; pip=$5; peer=$6; role=$7; gidx=$8; amtu=${10}
        port=$((18000 + lid * 20 + k)); out=$R/$t-link$lid.txt
        case $t in
            pingpong) cmd="ibv_rc_pingpong -d $dev -g $gidx -m $amtu -p $port -n 500 -s 4096" ;;
            *_bw) cmd="ib_$t -d $dev -x $gidx -F --report_gbits -p $port $L_bwargs" ;;
            *_lat) cmd="ib_$t -d $dev -x $gidx -F -p $port $L_latargs" ;;
        esac
        t1=$(up)
        if [ "$role" = s ]; then
            say "CHECK $t link$lid server: $cmd"
            timeout "$L_ctimeout" $cmd > "$out" 2>&1; rc=$?
            rl=server
        else
            say "CHECK $t link$lid client -> $pip: $cmd $pip"
            n=0
            while :; do # the server may not listen yet: retry on connection errors only
                timeout "$L_ctimeout" $cmd "$pip" > "$out" 2>&1; rc=$?
                [ $rc -eq 0 ] && break
                grep -qE "Couldn't connect|Unable to open file descriptor|Connection refused|Failed to establish" "$out" || break
                n=$((n + 1)); [ $n -gt 300 ] && break; sleep 0.2
            done
            rl=client
        fi
        cat "$out"
        s=$(dt "$t1")
        if [ $rc -eq 0 ]; then st=pass; say "CHECKOK $t link$lid ${s}s"
        else
            st=fail; fail=1; say "CHECKFAIL $t link$lid rc=$rc"
            grep -H . /sys/class/infiniband/"$dev"/ports/1/hw_counters/* 2>/dev/null | sed 's|.*/hw_counters/||' | grep -v ':0$' | tr '\n' ' '; echo
            /usr/sbin/ip -s link show "$ifn"
        fi
        m='{}'; [ "$rl" = client ] && m=$(perftest_metrics "$t" "$out")
        [ "$rl" = client ] && say "SUMMARY link$lid $t $m"
        jl "$t" "$lid" "$peer" "$rl" "$st" "$rc" "$s" "$m" "${out#"$R"/}"
        i=$((i + 1))
    done
}

run_bench() { # $1 mode, $2 check index
    mode=$1; k=$2; out=$R/bench-$mode.txt
    if [ ! -x $SW ]; then
        say "CHECKFAIL bench:$mode: $SW is not in the initramfs"; fail=1
        jl "bench:$mode" null null rank fail 127 0 '{}' ""; return
    fi
    port=$((29500 + k))
    cmd="$SW bench $mode --rank $((LAB_NODE - 1)) --nranks $LAB_NODES --bootstrap $LAB_BOOTSTRAP_IP:$port $L_benchargs"
    say "CHECK bench:$mode: $cmd"
    t1=$(up)
    timeout "$L_ctimeout" $cmd --save-json "$R/bench-$mode.json" > "$out" 2>&1; rc=$?
    cat "$out"
    s=$(dt "$t1")
    if [ $rc -eq 0 ]; then st=pass; say "CHECKOK bench:$mode ${s}s"; else st=fail; fail=1; say "CHECKFAIL bench:$mode rc=$rc"; fi
    jl "bench:$mode" null null "rank$((LAB_NODE - 1))" "$st" "$rc" "$s" '{}' "${out#"$R"/}"
}

# bench checks bootstrap over the management hub: make sure node 1 answers first
case " $L_checks " in
    *" bench:"*)
        if [ "$LAB_NODE" != 1 ]; then
            t1=$(up); n=0
            until ping -c 1 -W 1 "$LAB_BOOTSTRAP_IP" > /dev/null 2>&1; do
                n=$((n + 1)); [ $n -ge 30 ] && break
            done
            if [ $n -lt 30 ]; then jl mgmt null 1 ping pass 0 "$(dt "$t1")" '{}' ""; say "CHECKOK mgmt ping $LAB_BOOTSTRAP_IP"
            else jl mgmt null 1 ping fail 1 "$(dt "$t1")" '{}' ""; say "CHECKFAIL mgmt: no answer from $LAB_BOOTSTRAP_IP"; fail=1; fi
        fi ;;
esac
run_doctor() { # switchless doctor on this node: passes with no error-level finding (exit 0 or 1)
    out=$R/doctor.txt
    if [ ! -x $SW ]; then
        say "CHECKFAIL doctor: $SW is not in the initramfs"; fail=1
        jl doctor null null node fail 127 0 '{}' ""; return
    fi
    t1=$(up)
    $SW doctor > "$out" 2>&1; rc=$?
    $SW doctor --json > "$R/doctor.json" 2> /dev/null
    cat "$out"
    s=$(dt "$t1")
    case $rc in
        0 | 1) st=pass; say "CHECKOK doctor exit $rc ${s}s" ;;
        *) st=fail; fail=1; say "CHECKFAIL doctor exit $rc" ;;
    esac
    codes=$(sed -n 's/^\(WARNING\|ERROR\) \[\([a-z0-9-]*\)\].*/"\2"/p' "$out" | sort -u | tr '\n' ',' | sed 's/,$//')
    say "doctor findings: [$codes]"
    jl doctor null null node "$st" "$rc" "$s" "{\"exit_status\":$rc,\"findings\":[$codes]}" "${out#"$R"/}"
}

k=0
t0=$(up)
for c in $L_checks; do
    k=$((k + 1))
    case $c in
        write_bw | read_bw | send_bw | write_lat | send_lat | read_lat | pingpong) run_perftest "$c" $k ;;
        bench:latency | bench:bandwidth | bench:alltoall | bench:allreduce) run_bench "${c#bench:}" $k ;;
        doctor) run_doctor ;;
        *) say "CHECKFAIL unknown check '$c' (accepted: write_bw read_bw send_bw write_lat send_lat read_lat pingpong bench:latency bench:bandwidth bench:alltoall bench:allreduce doctor)"
           jl "$c" null null none fail 2 0 '{}' ""; fail=1 ;;
    esac
done
for d in /sys/class/infiniband/*; do # retransmission/duplicate counters tell loss and stalls apart
    say "counters ${d##*/}: $(grep -H . "$d"/ports/1/hw_counters/* 2>/dev/null | sed 's|.*/hw_counters/||' | grep -v ':0$' | tr '\n' ' ')"
done
say "checks finished in $(dt "$t0")s"
exit $fail
