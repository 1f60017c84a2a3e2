#!/bin/sh
# In-VM check runner (busybox sh). Reads the node's link table (/tmp/lab.env, written by /init) and
# runs the checks in $L_checks (from the topology file or CHECKS) in order:
#   write_bw read_bw send_bw write_lat send_lat read_lat pingpong
#       perftest on every cable of this node, one cable at a time in global link order (both
#       ends walk the links in the same order, so no topology can deadlock); the lower node of a
#       cable is the server.
#   doctor      `switchless doctor` (and --json); passes when it finds no error (exit 0 or 1)
#   samehost:MODE@N  two bench ranks in node N, connected over RoCE loopback (see run_samehost)
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
# TCG emulates SHA-256 at a few MB/s: hashing the 40 MB plugin for the init line took 8 s per process
# and pushed every timed check (no-route's 10 s bound) over; natively it takes tens of ms.
export NCCL_SWITCHLESS_ATTEST=0
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
        read -r _ps0 < /sys/class/infiniband/"$dev"/ports/1/hw_counters/sent_pkts 2>/dev/null || _ps0=0
        read -r _pr0 < /sys/class/infiniband/"$dev"/ports/1/hw_counters/rcvd_pkts 2>/dev/null || _pr0=0
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
        case $t in *_lat) # RoCE packets of the cable's device during the test (set-up included)
            read -r _ps1 < /sys/class/infiniband/"$dev"/ports/1/hw_counters/sent_pkts 2>/dev/null || _ps1=$_ps0
            read -r _pr1 < /sys/class/infiniband/"$dev"/ports/1/hw_counters/rcvd_pkts 2>/dev/null || _pr1=$_pr0
            _pk="\"rxe_sent_pkts\":$((_ps1 - _ps0)),\"rxe_rcvd_pkts\":$((_pr1 - _pr0))"
            if [ "$m" = '{}' ]; then m="{$_pk}"; else m="${m%\}},$_pk}"; fi ;;
        esac
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
    # rank 0 also draws the run (--plot writes on rank 0 only): the demo's report points at it
    timeout "$L_ctimeout" $cmd --save-json "$R/bench-$mode.json" --plot "$R/bench-$mode.svg" > "$out" 2>&1; rc=$?
    cat "$out"
    s=$(dt "$t1")
    if [ $rc -eq 0 ]; then st=pass; say "CHECKOK bench:$mode ${s}s"; else st=fail; fail=1; say "CHECKFAIL bench:$mode rc=$rc"; fi
    jl "bench:$mode" null null "rank$((LAB_NODE - 1))" "$st" "$rc" "$s" '{}' "${out#"$R"/}"
}

# ---- two-node checks: CHECK@A-B (or no-route:A-B) runs between nodes A and B only (A = rank 0,
# bootstrap at A's management address); the other nodes skip it. Every node walks the check list in
# the same order, so these never deadlock.
pair_nodes() { # $1 = "A-B" -> PA, PB; non-zero when malformed (run.sh validated the list already)
    PA=${1%-*}; PB=${1#*-}
    case "$PA$PB" in '' | *[!0-9]*) return 1 ;; esac
    [ "$PA" != "$PB" ]
}
mgmt_ip_of() { eval "_m=\$L_mgmtip_$1"; echo "${_m%/*}"; }
rxe_counter() { # $1 counter name -> sum over this node's rxe devices
    cat /sys/class/infiniband/*/ports/1/hw_counters/"$1" 2>/dev/null | awk '{s+=$1} END{print s+0}'
}
counters_line() { # non-zero rxe counters of every device, one line
    for _d in /sys/class/infiniband/*; do
        printf '%s: %s\n' "${_d##*/}" "$(grep -H . "$_d"/ports/1/hw_counters/* 2>/dev/null | sed 's|.*/hw_counters/||' | grep -v ':0$' | tr '\n' ' ')"
    done
}
# pkts_now COUNTER: _s = that rxe counter summed over this node's devices (shell builtins only,
# no fork: it is polled every 20 ms)
pkts_now() {
    _s=0
    for _f in /sys/class/infiniband/*/ports/1/hw_counters/"$1"; do
        read -r _v < "$_f" && _s=$((_s + _v))
    done
}
# wait_burst COUNTER BASE: returns once COUNTER has grown by L_fault_pkts since BASE and a burst
# (a batch of bench messages: 8 x 1 MiB = 2048 RoCE packets) has just begun, at least 64 packets
# in: most of the batch is still to go, so work requests are in flight. Gives up after 120 s.
# (A fault between batches finds no work request in flight: see docs/guide/lab.md.)
wait_burst() {
    _prev=$2; _b=-1; _n=0
    while :; do
        pkts_now "$1"
        if [ $((_s - _prev)) -ge 4 ]; then [ $_b -lt 0 ] && _b=$_prev; else _b=-1; fi
        [ $((_s - $2)) -ge "$L_fault_pkts" ] && [ $_b -ge 0 ] && [ $((_s - _b)) -ge 64 ] && return 0
        _prev=$_s; _n=$((_n + 1)); [ $_n -ge 6000 ] && return 1
        usleep 20000
    done
}
# bench2 MODE A B PORT OUT ARGS...: `switchless bench MODE` as a 2-rank job between nodes A and B
# (this node is one of them); sets rc and s (seconds)
bench2() {
    _mode=$1; _a=$2; _b=$3; _port=$4; _out=$5; shift 5
    if [ "$LAB_NODE" = "$_a" ]; then _rank=0; else _rank=1; fi
    cmd="$SW bench $_mode --rank $_rank --nranks 2 --bootstrap $(mgmt_ip_of "$_a"):$_port $*"
    say "CHECK $c: $cmd"
    t1=$(up)
    timeout "$L_ctimeout" $cmd > "$_out" 2>&1; rc=$?
    s=$(dt "$t1")
}
# rendezvous A B PORT: both nodes return once the other has arrived (a TCP note over the
# management hub), so a timed two-node check does not count the wait for a busy peer
rendezvous() {
    if [ "$LAB_NODE" = "$1" ]; then
        timeout "$L_ctimeout" nc -l -p "$3" < /dev/null 2> /dev/null | { read -r _; }
    else
        _i=0
        until echo go | timeout 2 nc "$(mgmt_ip_of "$1")" "$3" > /dev/null 2>&1 || [ $_i -ge 600 ]; do
            usleep 200000; _i=$((_i + 1))
        done
    fi
}
last_link_to() { # $1 node -> LL_ID, LL_IF, LL_DEV of this node's last cable to it (empty: none)
    LL_ID=""; LL_IF=""; LL_DEV=""; _i=0; _to=$1 # (set -- below replaces $1)
    while [ $_i -lt "$LAB_NLINKS" ]; do
        eval "set -- \$LAB_LINK_$_i"; [ "$6" = "$_to" ] && { LL_ID=$1; LL_IF=$2; LL_DEV=$3; }
        _i=$((_i + 1))
    done
}
json_str() { # $1 -> JSON string body (quotes and backslashes escaped, one line)
    printf '%s' "$1" | tr -d '\r' | tr '\n' ' ' | sed 's/\\/\\\\/g; s/"/\\"/g'
}
# plugin error lines of a bench output: the first line naming a path failure, else the last
# error line
plugin_error() {
    grep -m1 -E 'on path [0-9]+ .*failed|made no progress for|has been down for|asynchronous event .*cannot continue|is gone: |still pending|no local link reaches' "$1" ||
        grep -E 'switchless bench|[Ee]rror|WARN' "$1" | tail -1
}

run_bench_pair() { # bench:MODE@A-B
    spec=${c#bench:}; mode=${spec%@*}; pair_nodes "${spec#*@}" || return 0
    [ "$LAB_NODE" = "$PA" ] || [ "$LAB_NODE" = "$PB" ] || { say "SKIP $c (not one of nodes $PA, $PB)"; return 0; }
    out=$R/bench-$mode-$PA-$PB.txt
    # RoCE packets this node sent and received during the bench (rxe counters over all its devices;
    # set-up included): per round trip, the protocol's work on the wire, which TCG's timings hide
    pkts_now sent_pkts; _s0=$_s; pkts_now rcvd_pkts; _r0=$_s
    bench2 "$mode" "$PA" "$PB" $((29600 + k)) "$out" $L_benchargs --save-json "$R/bench-$mode-$PA-$PB.json"
    pkts_now sent_pkts; _ps=$((_s - _s0)); pkts_now rcvd_pkts; _pr=$((_s - _r0))
    cat "$out"
    if [ $rc -eq 0 ]; then st=pass; say "CHECKOK $c ${s}s"; else st=fail; fail=1; say "CHECKFAIL $c rc=$rc"; fi
    # the spread of the one-way times, beside perftest's SUMMARY lines (t_min, t_typical, t_99)
    sed -n 's/^# one-way us at /one-way us at /p' "$out" | while read -r l; do say "SUMMARY $c $l"; done
    say "SUMMARY $c rxe packets of this node: sent $_ps, received $_pr"
    if [ "$LAB_NODE" = "$PA" ]; then peer=$PB; else peer=$PA; fi
    jl "$c" null "$peer" "rank$_rank" "$st" "$rc" "$s" "{\"rxe_sent_pkts\":$_ps,\"rxe_rcvd_pkts\":$_pr}" "${out#"$R"/}"
}

run_no_route() { # no-route:A-B: A and B share no cable; the plugin must refuse fast and clearly
    pair_nodes "${c#no-route:}" || return 0
    [ "$LAB_NODE" = "$PA" ] || [ "$LAB_NODE" = "$PB" ] || { say "SKIP $c (not one of nodes $PA, $PB)"; return 0; }
    if [ "$LAB_NODE" = "$PA" ]; then peer=$PB; else peer=$PA; fi
    out=$R/no-route-$PA-$PB.txt
    rendezvous "$PA" "$PB" $((29700 + k))
    bench2 latency "$PA" "$PB" $((29600 + k)) "$out" -b 8 -e 8 -n 1 -w 0 --timeout "$L_noroute_bound"
    cat "$out"
    err=$(plugin_error "$out")
    why=""
    if [ $rc -eq 0 ]; then why="the bench succeeded between nodes that share no cable"
    elif [ $rc -eq 124 ]; then why="the bench hung (killed after $L_ctimeout s)"
    elif ! grep -q "no local link reaches the peer" "$out"; then why="no 'no local link reaches the peer' error"
    elif ! grep -q "shared subnet" "$out"; then why="the error does not mention the shared subnet"
    elif ! awk -v a="$s" -v b="$L_noroute_bound" 'BEGIN{exit !(a <= b)}'; then why="it took ${s}s (bound ${L_noroute_bound}s)"
    fi
    if [ -z "$why" ]; then st=pass; say "CHECKOK $c: refused in ${s}s: $err"
    else st=fail; fail=1; say "CHECKFAIL $c: $why (rc=$rc, ${s}s): $err"; fi
    jl "$c" null "$peer" "rank$_rank" "$st" "$rc" "$s" \
        "{\"bound_s\":$L_noroute_bound,\"error\":\"$(json_str "$err")\"}" "${out#"$R"/}"
}

# samehost:MODE@N: two ranks of `switchless bench MODE` in node N (the other nodes skip it), bootstrap at
# N's management address: NCCL connects ranks of one host over the network when P2P and SHM are off.
# Passes when both ranks succeed and rank 0's log (NCCL_DEBUG=INFO) says the peer is this host, over
# RoCE loopback (each port's own GID). Metrics: `loopback` (the INFO line).
run_samehost() {
    spec=${c#samehost:}; mode=${spec%@*}; node=${spec#*@}
    [ "$LAB_NODE" = "$node" ] || { say "SKIP $c (runs in node $node)"; return 0; }
    out=$R/samehost-$mode.txt
    boot="$(mgmt_ip_of "$LAB_NODE"):$((29800 + k))"
    cmd="$SW bench $mode --nranks 2 --bootstrap $boot $L_benchargs"
    say "CHECK $c: two ranks of: $cmd"
    t1=$(up)
    NCCL_DEBUG=INFO timeout "$L_ctimeout" $cmd --rank 1 > "$out.rank1" 2>&1 &
    p1=$!
    NCCL_DEBUG=INFO timeout "$L_ctimeout" $cmd --rank 0 --save-json "$R/samehost-$mode.json" > "$out" 2>&1; rc=$?
    wait $p1; rc1=$?
    s=$(dt "$t1")
    cat "$out"
    line=$(grep -m1 "the peer is this host" "$out")
    why=""
    if [ $rc -ne 0 ] || [ $rc1 -ne 0 ]; then why="rank 0 rc=$rc, rank 1 rc=$rc1: $(plugin_error "$out") $(plugin_error "$out.rank1")"
    elif [ -z "$line" ]; then why="no INFO line says the peer is this host"
    elif ! echo "$line" | grep -q "HCA loopback"; then why="the loopback is not RoCE: $line"
    fi
    if [ -z "$why" ]; then st=pass; say "CHECKOK $c ${s}s: $(echo "$line" | cut -c1-300)"
    else st=fail; fail=1; say "CHECKFAIL $c: $why"; fi
    jl "$c" null "$LAB_NODE" rank0 "$st" "$rc" "$s" "{\"loopback\":\"$(json_str "$line")\"}" "${out#"$R"/}"
}

# fault:kill-peer[@A-B]: A streams to B (bench bandwidth); B powers itself off once it has received
# L_fault_pkts RoCE packets of the stream, after telling A (a TCP note over the management hub).
# A's requests must then fail with the plugin's error (path + work-completion status) within
# L_fault_bound seconds of the note. B marks its death as expected, so the host does not count it
# as a failure (B runs no check after this one).
# fault:link-down[@A-B]: A streams to B over every cable between them; once L_fault_pkts packets
# have gone out, A sets its last cable to B down. Passes when A's bench ends (an error naming the
# path, or completion if the plugin carried on over the other cable) within L_fault_bound seconds
# of the link going down; B's outcome is recorded, and must not be a hang either.
# fault:link-flap[@A-B]: as link-down, but A sets the cable up again L_flap_s seconds later (run
# with NCCL_DEBUG=INFO): passes when A's bench completes and its log shows the path rebuilt and
# carrying traffic again (failback); the plugin's INFO lines give the time from the port's
# IBV_EVENT_PORT_ACTIVE to both ends connected.
# fault:cable-pull[@A-B]: as link-down, but B also sets its end of that cable down when A's note
# arrives (a DAC pulled out: both ports go down). With one path per connection
# (NCCL_SWITCHLESS_STANDBY=0 or NCCL_SWITCHLESS_FAILOVER=0, or a single cable between A and B) both
# sides must end with an error within L_fault_bound seconds, with no NCCL_SWITCHLESS_REQUEST_TIMEOUT
# needed: the side with nothing in flight learns it from its port (IBV_EVENT_PORT_ERR, then down past
# the RC retry budget). With a standby path on another cable (the default) both sides must complete.
FAULT_ARGS="-b 1048576 -e 1048576 -w 0 --window 8"
# The plugin's errors that name the failed path: a work completion's status, the request timeout,
# the path's port down past the RC retry budget, or the liveness channel (the handshake socket)
# ending once the peer's process exits after its own error, with the connection's paths named.
PATH_ERR_RE='on path [0-9]+ \(.*\) failed: |made no progress for [0-9]+ ms .*on path\(s\) \[0\]|path [0-9]+ \(.*\): .* port [0-9]+ has been down for |connection over path\(s\) \[0\] .*: the peer at .* is gone: '
ifs_to() { # $1 node -> this node's cable netdevs to it, space-separated
    _l=""; _i=0; _to=$1 # (set -- below replaces $1)
    while [ $_i -lt "$LAB_NLINKS" ]; do
        eval "set -- \$LAB_LINK_$_i"; [ "$6" = "$_to" ] && _l="$_l $2"
        _i=$((_i + 1))
    done
    echo $_l
}
# Samples every 0.25 s: uptime, then tx_bytes of each netdev named (until killed).
sample_tx() {
    while :; do
        _l=$(up); for _f in "$@"; do _l="$_l $(cat "/sys/class/net/$_f/statistics/tx_bytes")"; done
        echo "$_l"; usleep 250000
    done
}
# Sender's Gb/s per cable before the fault, while the cable is down, after it is up again:
# $1 samples file, $2 fault time, $3 link-up time (or empty), $4 "if1 if2 ..." -> one line
phase_rates() {
    awk -v tf="$2" -v tu="${3:-}" -v names="$4" '
        { t[NR] = $1; tot[NR] = 0; for (i = 2; i <= NF; i++) { b[NR, i] = $i; tot[NR] += $i }; nf = NF }
        function rate(a, z,   i, s, o, tot) {
            if (z <= a || t[z] <= t[a]) return "n/a"
            o = ""; tot = 0
            for (i = 2; i <= nf; i++) { s = (b[z, i] - b[a, i]) * 8 / (t[z] - t[a]) / 1e9; tot += s
                o = o sprintf(" %s %.3f", nm[i - 1], s) }
            return sprintf("%.3f Gb/s (%s)", tot, substr(o, 2))
        }
        function at(x,   i) { for (i = 1; i <= NR; i++) if (t[i] >= x) return i; return NR }
        END {
            split(names, nm, " ")
            f = at(tf); u = (tu == "") ? NR : at(tu)
            # "before" starts when data moves (the first 64 KiB), not at the bench'"'"'s launch
            for (s0 = 1; s0 < f && tot[s0 + 1] - tot[1] <= 65536; s0++) ;
            printf "before %s; down %s", rate(s0, f), rate(f, u)
            if (tu != "") printf "; after %s", rate(u, NR)
            printf "\n"
        }' "$1"
}
cables_to() { # $1 node -> how many of this node's cables reach it
    _n=0; _i=0; _to=$1 # (set -- below replaces $1)
    while [ $_i -lt "$LAB_NLINKS" ]; do
        eval "set -- \$LAB_LINK_$_i"; [ "$6" = "$_to" ] && _n=$((_n + 1))
        _i=$((_i + 1))
    done
    echo $_n
}
# whether a connection to node $1 keeps a standby path on another cable (the plugin's defaults)
standby_to() {
    [ "${NCCL_SWITCHLESS_STANDBY:-1}" != 0 ] && [ "${NCCL_SWITCHLESS_FAILOVER:-1}" != 0 ] &&
        [ "$(cables_to "$1")" -ge 2 ]
}
run_fault() { # $1 check
    kind=${1#fault:}; spec=1-2
    case $kind in *@*) spec=${kind#*@}; kind=${kind%@*} ;; esac
    pair_nodes "$spec" || return 0
    [ "$LAB_NODE" = "$PA" ] || [ "$LAB_NODE" = "$PB" ] || { say "SKIP $c (not one of nodes $PA, $PB)"; return 0; }
    if [ "$LAB_NODE" = "$PA" ]; then peer=$PB; else peer=$PA; fi
    port=$((29600 + k)); rport=$((29700 + k)); nport=$((29800 + k))
    out=$R/fault-$kind.txt; note=$R/fault-$kind.note
    rm -f "$note"
    case $kind in
        kill-peer) iters=1000000 ;;   # runs until the peer dies (or the bench's own --timeout)
        link-flap) iters=$L_flap_iters ;;  # long enough for the link to come back mid-run
        *) iters=$L_linkdown_iters ;;  # long enough for the link to go down mid-run
    esac
    rendezvous "$PA" "$PB" "$rport" # the bench's --timeout then measures the transfer, not the wait
    p0=$(rxe_counter rcvd_pkts); q0=$(rxe_counter sent_pkts); t1=$(up)
    if { [ "$kind" = kill-peer ] && [ "$LAB_NODE" = "$PA" ]; } || { [ "$kind" != kill-peer ] && [ "$LAB_NODE" = "$PB" ]; }; then
        # the fault note from the other node (the victim's death, the link going down): its
        # arrival time in this node's uptime
        nc -l -p "$nport" < /dev/null 2> /dev/null | { read -r _; up > "$note"; } &
    fi
    bdn=""
    if [ "$kind" = cable-pull ] && [ "$LAB_NODE" = "$PB" ]; then
        # this node's end of the same cable (the last one to A, as A picks)
        last_link_to "$PA"; bdn=$LL_IF
        ( while [ ! -s "$note" ]; do usleep 20000; done
          /usr/sbin/ip link set "$bdn" down
          say "FAULT cable-pull: this end ($bdn) set down too" ) &
    fi
    if [ "$kind" = kill-peer ] && [ "$LAB_NODE" = "$PB" ]; then
        # logged first: after the trigger nothing may delay the power-off
        say "FAULT kill-peer: will power off after $L_fault_pkts packets, mid-burst (expected death)"
        jl "$c" null "$PA" victim pass 0 0 "{\"after_pkts\":$L_fault_pkts}" ""
        echo "LAB_EXPECTED_DEATH node $LAB_NODE ($c)"
        sync
        ( wait_burst rcvd_pkts "$p0"
          echo dead | timeout 2 nc "$(mgmt_ip_of "$PA")" "$nport" > /dev/null 2>&1
          echo o > /proc/sysrq-trigger
          sleep 30 ) &
    fi
    if [ "$kind" != kill-peer ] && [ "$LAB_NODE" = "$PA" ]; then
        # the last cable to B
        last_link_to "$PB"; dn=$LL_IF; ddev=$LL_DEV; dl=$LL_ID
        if [ -z "$dn" ]; then
            say "CHECKFAIL $c: node $PA has no cable to node $PB"; fail=1
            jl "$c" null "$PB" "rank0" fail 2 0 '{}' ""; return 0
        fi
        ( wait_burst sent_pkts "$q0"
          /usr/sbin/ip link set "$dn" down
          up > "$note"
          echo down | timeout 2 nc "$(mgmt_ip_of "$PB")" "$nport" > /dev/null 2>&1
          say "FAULT $kind: $((_s - q0)) packets sent, link$dl ($dn, $ddev) set down"
          if [ "$kind" = link-flap ]; then
              sleep "$L_flap_s"; /usr/sbin/ip link set "$dn" up; up > "$R/fault-$kind.upat"
              say "FAULT link-flap: link$dl ($dn) set up again after ${L_flap_s}s, mid-run"
          fi ) &
        rm -f "$R/fault-$kind.upat"
        rifs=$(ifs_to "$PB"); sample_tx $rifs > "$R/fault-$kind.rates" &
        sampler=$!
    fi
    bench2 bandwidth "$PA" "$PB" "$port" "$out" $FAULT_ARGS -n "$iters" --timeout "$L_fault_hang"
    t2=$(up)
    if [ -n "${sampler:-}" ]; then
        kill "$sampler" 2> /dev/null; wait "$sampler" 2> /dev/null || true; sampler=""
        # (the sender's rates per phase: before the fault, while the cable is down, after)
        [ -s "$note" ] && say "RATES $c: $(phase_rates "$R/fault-$kind.rates" "$(cat "$note")" \
            "$(cat "$R/fault-$kind.upat" 2> /dev/null)" "$rifs")"
    fi
    cat "$out"
    err=$(plugin_error "$out")
    ft=null; tf=null
    [ -s "$note" ] && { ft=$(cat "$note"); tf=$(awk -v a="$ft" -v b="$t2" 'BEGIN{printf "%.2f", b-a}'); }
    outcome=error; [ $rc -eq 0 ] && outcome=completed
    { [ $rc -eq 124 ] || grep -q "still pending\|not up within" "$out"; } && outcome=hang
    why=""
    case $kind in
        kill-peer)
            if [ "$LAB_NODE" = "$PB" ]; then return 0; fi  # (not reached: the victim is off)
            if [ "$tf" = null ]; then why="no death note from node $PB (it did not die mid-transfer?)"
            elif [ $outcome = completed ]; then why="the bench completed although the peer died"
            elif [ $outcome = hang ]; then why="HANG: requests neither completed nor failed after the peer died"
            elif ! grep -qE "$PATH_ERR_RE" "$out"; then why="no plugin error naming the path and completion status"
            elif ! awk -v a="$tf" -v b="$L_fault_bound" 'BEGIN{exit !(a <= b)}'; then why="failed ${tf}s after the peer died (bound ${L_fault_bound}s)"
            fi ;;
        cable-pull)
            if [ "$tf" = null ]; then why="the cable was never pulled, or no note of it (transfer over before $L_fault_pkts packets?)"
            elif standby_to "$peer"; then
                [ $outcome = completed ] || why="$outcome: with a standby path on the other cable both sides must complete"
            elif [ $outcome != error ]; then why="$outcome: both sides must fail after the cable is pulled"
            elif ! grep -qE "$PATH_ERR_RE" "$out"; then why="no plugin error naming the path (completion status, port down or request timeout)"
            elif ! awk -v a="$tf" -v b="$L_fault_bound" 'BEGIN{exit !(a <= b)}'; then why="ended ${tf}s after the cable was pulled (bound ${L_fault_bound}s)"
            fi ;;
        link-flap)
            if [ "$tf" = null ]; then why="the link never went down, or no note of it"
            elif [ $outcome != completed ]; then why="$outcome: the bench must complete on both sides over the other cable"
            elif [ "$LAB_NODE" = "$PA" ] && ! grep -q "carries traffic again" "$out"; then why="no failback: the path never carried traffic again"
            fi
            grep -E "rebuilt: epoch|carries traffic again|failing over" "$out" | sed 's/^/FLAP /' ;;
        link-down)
            if [ "$tf" = null ]; then why="the link never went down, or no note of it (transfer over before $L_fault_pkts packets?)"
            elif [ $outcome = hang ]; then why="HANG: requests neither completed nor failed after the link went down"
            elif [ $outcome = error ] && ! grep -qE "$PATH_ERR_RE" "$out"; then why="no plugin error naming the path and completion status"
            # The bound is for failing: a run that fails over completes at the surviving cable's
            # rate, within the bench's own --timeout.
            elif [ $outcome = error ] && ! awk -v a="$tf" -v b="$L_fault_bound" 'BEGIN{exit !(a <= b)}'; then why="ended ${tf}s after the link went down (bound ${L_fault_bound}s)"
            fi ;;
    esac
    if [ "$kind" != kill-peer ] && [ "$LAB_NODE" = "$PA" ] && [ -n "$dn" ]; then
        /usr/sbin/ip link set "$dn" up; say "FAULT $kind: link$dl ($dn) set up again"
    fi
    if [ -n "$bdn" ]; then
        /usr/sbin/ip link set "$bdn" up; say "FAULT cable-pull: this end ($bdn) set up again"
    fi
    cl=$(counters_line | tr '\n' ' ')
    say "counters after $c: $cl"
    m="{\"outcome\":\"$outcome\",\"seconds_to_end_after_fault\":$tf,\"bound_s\":$L_fault_bound,\"bench_seconds\":$s,\"rcvd_pkts\":$(( $(rxe_counter rcvd_pkts) - p0 )),\"sent_pkts\":$(( $(rxe_counter sent_pkts) - q0 )),\"error\":\"$(json_str "$err")\",\"counters\":\"$(json_str "$cl")\"}"
    if [ -z "$why" ]; then st=pass; say "CHECKOK $c: $outcome, ${tf} s after the fault (bench ${s} s): $err"
    elif [ "$kind" = link-down ] && [ $outcome = hang ] && [ "$L_fault_peer_hang" = allow ]; then
        # a known plugin gap, made visible: the side with no work request in flight on the dead
        # path never learns of it (the other side must still fail cleanly: see 86-lab-faults.sh)
        st=xfail; say "CHECKXFAIL $c: $why (allowed by LAB_FAULT_PEER_HANG=allow; rc=$rc, bench ${s}s): $err"
    else st=fail; fail=1; say "CHECKFAIL $c: $why (rc=$rc, bench ${s}s): $err"; fi
    jl "$c" null "$peer" "rank$_rank" "$st" "$rc" "$s" "$m" "${out#"$R"/}"
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

run_payload() { # /opt/payload/run (from lab/run.sh --payload) with this node's LAB_* variables
    out=$R/payload.txt
    if [ ! -x /opt/payload/run ]; then
        say "CHECKFAIL payload: /opt/payload/run is not in the initramfs"; fail=1
        jl payload null null node fail 127 0 '{}' ""; return
    fi
    say "CHECK payload: /opt/payload/run"
    t1=$(up)
    (cd /opt/payload && timeout "$L_ctimeout" ./run) > "$out" 2>&1; rc=$?
    cat "$out"
    s=$(dt "$t1")
    if [ $rc -eq 0 ]; then st=pass; say "CHECKOK payload ${s}s"; else st=fail; fail=1; say "CHECKFAIL payload rc=$rc"; fi
    jl payload null null node "$st" "$rc" "$s" '{}' "${out#"$R"/}"
}
run_watch() { # watch:MODE: `switchless watch` beside a `switchless bench MODE` on every node
    mode=${c#watch:}; out=$R/watch-$mode.txt
    if [ ! -x $SW ]; then
        say "CHECKFAIL $c: $SW is not in the initramfs"; fail=1
        jl "$c" null null node fail 127 0 '{}' ""; return
    fi
    port=$((29800 + k))
    t1=$(up)
    timeout "$L_ctimeout" $SW bench "$mode" --rank $((LAB_NODE - 1)) --nranks "$LAB_NODES" \
        --bootstrap "$LAB_BOOTSTRAP_IP:$port" $L_benchargs > "$R/watch-bench-$mode.txt" 2>&1 &
    bpid=$!
    # the watchers only read counter files: they must not slow or break the job beside them; they
    # run until the bench ends (its set-up alone takes seconds under TCG)
    $SW watch --interval 1 > "$out" 2>&1 &
    wpid=$!
    $SW watch --interval 1 --json > "$R/watch-$mode.json" 2> /dev/null &
    jpid=$!
    wait $bpid; rc=$?
    kill $wpid $jpid 2> /dev/null
    wait $wpid $jpid 2> /dev/null
    cat "$out"
    s=$(dt "$t1")
    peak=$(grep -o '"[tr]x_gbps":[0-9.eE+-]*' "$R/watch-$mode.json" | awk -F: '$2 + 0 > m {m = $2 + 0} END {print m + 0}')
    say "watch peak ${peak} Gb/s during bench $mode"
    if [ $rc -ne 0 ]; then st=fail; fail=1; say "CHECKFAIL $c: bench rc=$rc beside the watcher"
    elif ! awk -v p="$peak" 'BEGIN{exit !(p > 0)}'; then st=fail; fail=1; say "CHECKFAIL $c: watch saw no traffic"
    else st=pass; say "CHECKOK $c: peak $peak Gb/s ${s}s"; fi
    jl "$c" null null node "$st" "$rc" "$s" "{\"peak_gbps\":$peak}" "${out#"$R"/}"
}

k=0
t0=$(up)
for c in $L_checks; do
    k=$((k + 1))
    case $c in
        write_bw | read_bw | send_bw | write_lat | send_lat | read_lat | pingpong) run_perftest "$c" $k ;;
        bench:latency | bench:bandwidth | bench:alltoall | bench:allreduce) run_bench "${c#bench:}" $k ;;
        bench:*@*-*) run_bench_pair ;;
        no-route:*-*) run_no_route ;;
        samehost:*@*) run_samehost ;;
        fault:kill-peer | fault:link-down | fault:cable-pull | fault:link-flap | fault:kill-peer@*-* | fault:link-down@*-* | fault:cable-pull@*-* | fault:link-flap@*-*) run_fault "$c" ;;
        doctor) run_doctor ;;
        payload) run_payload ;;
        watch:latency | watch:bandwidth | watch:alltoall | watch:allreduce) run_watch ;;
        *) say "CHECKFAIL unknown check '$c' (accepted: payload write_bw read_bw send_bw write_lat send_lat read_lat pingpong bench:latency bench:bandwidth bench:alltoall bench:allreduce bench:MODE@A-B no-route:A-B samehost:MODE@N fault:kill-peer[@A-B] fault:link-down[@A-B] fault:cable-pull[@A-B] fault:link-flap[@A-B] doctor watch:MODE)"
           jl "$c" null null none fail 2 0 '{}' ""; fail=1 ;;
    esac
done
for d in /sys/class/infiniband/*; do # retransmission/duplicate counters tell loss and stalls apart
    say "counters ${d##*/}: $(grep -H . "$d"/ports/1/hw_counters/* 2>/dev/null | sed 's|.*/hw_counters/||' | grep -v ':0$' | tr '\n' ' ')"
done
say "checks finished in $(dt "$t0")s"
exit $fail
