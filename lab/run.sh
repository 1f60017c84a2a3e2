#!/usr/bin/env bash
# lab/run.sh - soft-RoCE (rdma_rxe) VM lab: boots one QEMU VM per node of a topology, cables the
# nodes back to back (one QEMU socket netdev per cable, over 127.0.0.1 inside a private network
# namespace; each cable its own /30 with an rxe device on both ends), runs the checks in every VM
# and brings the results back to the host. Needs root (apt, netns, 9p). Non-interactive.
#
# Usage: lab/run.sh [options] TOPOLOGY      TOPOLOGY = pair | mesh3 | ring4 | path to a .topo file
# Options (environment variable in brackets):
#   --mtu N              netdev MTU of every cable [LAB_MTU, default 9000 -> active_mtu 4096;
#                        1500 reproduces the active_mtu 1024 trap]
#   --checks "C ..."     checks to run instead of the topology's `checks` line [CHECKS]
#   --bin-dir DIR        directory holding the `switchless` binary and libswitchless.so (a cargo
#                        release or debug dir; deps/libswitchless.so is used when newer)
#                        [LAB_BIN_DIR, default ${CARGO_TARGET_DIR:-target}/release]
#   --no-build           do not run `cargo build [--release]` when the binary is missing
#   --no-switchless      leave the switchless binary and plugin out of the VMs (perftest only)
#   --results DIR        results directory [LAB_RESULTS, default lab/.cache/results/<topo>-<time>]
#   --timeout S          limit for one boot-and-check round, seconds [LAB_TIMEOUT, default 600]
#   --check-timeout S    limit for one check in a VM, seconds [LAB_CHECK_TIMEOUT, default 120]
#   --mem MiB            memory per VM [LAB_MEM, default 512]
#   --smp N              virtual CPUs per VM [LAB_SMP, default 1; a payload that needs two threads
#                        on CPUs at once, e.g. examples/regstall.rs, wants 2]
#   --no-install         do not apt-get install missing packages [NO_INSTALL=1]
#   --no-retry           do not retry after a guest kernel fault
#   --bench-args "..."   extra arguments for every `switchless bench` check [BENCH_ARGS]
#   --payload DIR        copy DIR into every VM at /opt/payload (ELF files stripped of debug info,
#                        their libraries added); the `payload` check runs its executable `run` there
#                        with the node's LAB_* variables [LAB_PAYLOAD]
#   --guest-env "K=V ..." environment for the checks in the VMs, e.g. "NCCL_DEBUG=INFO
#                        NCCL_IB_TIMEOUT=20" [LAB_GUEST_ENV]; NCCL_IB_RETRY_CNT=6 is set
#                        unless this sets it (rxe never gives up at 7)
#   Two-node and fault checks (see docs/guide/lab.md) read: LAB_NOROUTE_BOUND (s a no-route
#                        refusal may take, default 10: the refusal is decided at connect, 1.3-2.5 s
#                        for the whole bench process under TCG; a connect that waited instead ends
#                        in the bench's own timeout error, which the check rejects), LAB_FAULT_BOUND
#                        (s from the fault to the bench's end, default derived from the guest
#                        environment: see fault_bound), LAB_FAULT_PKTS (RoCE packets before the fault,
#                        default 300), LAB_FAULT_HANG (the bench's own --timeout in fault runs,
#                        default 60), LAB_LINKDOWN_ITERS (messages of 1 MiB in fault:link-down,
#                        default 200), LAB_FAULT_PEER_HANG=allow (fault:link-down: the far side's
#                        hang is reported as CHECKXFAIL instead of failing the run)
#   LAB_INJECT_FAULT=1   test hook: node 1 crashes its kernel (sysrq) in the first round, to
#                        exercise the fault detection and the single retry; =warn: node 1 prints
#                        a kernel-style WARNING line and fails, which must not be retried
# Exit status: 0 when every node booted, set up its cables and passed every check.
# A round whose failure shows a guest kernel panic (the kernel's "Kernel panic - not syncing": the
# VMs boot with oops=panic, so every Oops and BUG ends there; an rxe or emulator flake, see
# docs/guide/lab.md) is retried once; no other failure is retried, a kernel WARNING included.
set -euo pipefail
LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$LAB_DIR/.." && pwd)
# shellcheck source=lib/addr.sh source-path=SCRIPTDIR
. "$LAB_DIR/lib/addr.sh"

MTU=${LAB_MTU:-9000}
CHECKS_OVERRIDE=${CHECKS-}
BIN_DIR=${LAB_BIN_DIR:-${CARGO_TARGET_DIR:-$REPO/target}/release}
BUILD=1
WITH_SW=1
RESULTS=${LAB_RESULTS:-}
TIMEOUT=${LAB_TIMEOUT:-600}
CHECK_TIMEOUT=${LAB_CHECK_TIMEOUT:-120}
MEM=${LAB_MEM:-512}
SMP=${LAB_SMP:-1}
RETRY=1
BENCH_ARGS=${BENCH_ARGS:-}
GUEST_ENV=${LAB_GUEST_ENV:-}
PAYLOAD=${LAB_PAYLOAD:-}
CACHE=$LAB_DIR/.cache
# -u 20: QP timeout 4.3 s; TCG stalls otherwise trigger retransmits (rxe's NAK path is where guest
# oopses were seen). Small transfers: the guest-kernel flake rate grows with traffic.
BW_ARGS=${BW_ARGS:-"-s 65536 -n 500 -u 20"}
LAT_ARGS=${LAT_ARGS:-"-s 2 -n 1000 -u 20"}
BASEPORT=30000 # cable sockets; they live in the private netns, no clash with the host
MGMT_PORT=29999

log() { printf '[lab %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
T0=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }

TOPO=""
while [ $# -gt 0 ]; do
    case $1 in
        --mtu) MTU=$2; shift 2 ;;
        --checks) CHECKS_OVERRIDE=$2; shift 2 ;;
        --bin-dir) BIN_DIR=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        --no-switchless) WITH_SW=0; shift ;;
        --results) RESULTS=$2; shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        --check-timeout) CHECK_TIMEOUT=$2; shift 2 ;;
        --mem) MEM=$2; shift 2 ;;
        --smp) SMP=$2; shift 2 ;;
        --no-install) NO_INSTALL=1; shift ;;
        --no-retry) RETRY=0; shift ;;
        --bench-args) BENCH_ARGS=$2; shift 2 ;;
        --guest-env) GUEST_ENV=$2; shift 2 ;;
        --payload) PAYLOAD=$2; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        -*) die "unknown option '$1' (see lab/run.sh --help)" ;;
        *) [ -z "$TOPO" ] || die "one topology only (got '$TOPO' and '$1')"; TOPO=$1; shift ;;
    esac
done
[ -n "$TOPO" ] || { usage >&2; die "no topology given (accepted: a name in lab/topologies/ or a .topo path)"; }
case $MTU in '' | *[!0-9]*) die "--mtu '$MTU' is not a number (accepted: 1280..9000)" ;; esac
{ [ "$MTU" -ge 1280 ] && [ "$MTU" -le 9000 ]; } || die "--mtu $MTU out of range (accepted: 1280..9000)"
case $SMP in '' | *[!0-9]* | 0*) die "--smp '$SMP' is not a CPU count (accepted: 1..4)" ;; esac
[ "$SMP" -le 4 ] || die "--smp $SMP out of range (accepted: 1..4: TCG runs each virtual CPU on a host thread)"
[ "$(id -u)" -eq 0 ] || die "needs root (apt-get, ip netns, 9p export)"
for kv in $GUEST_ENV; do
    [[ $kv =~ ^[A-Za-z_][A-Za-z0-9_]*=[A-Za-z0-9_.,:/+-]*$ ]] || die "--guest-env entry '$kv' (accepted: NAME=VALUE, value of letters, digits and _.,:/+-)"
done

# ---------------------------------------------------------------- topology
TOPO_FILE=$TOPO
[ -f "$TOPO_FILE" ] || TOPO_FILE=$LAB_DIR/topologies/$TOPO.topo
[ -f "$TOPO_FILE" ] || die "topology '$TOPO' not found (accepted: $(find "$LAB_DIR/topologies" -name '*.topo' -printf '%f ' | sed 's/\.topo//g')or a file path)"
TOPO_NAME=$(basename "$TOPO_FILE" .topo)
NODES=0
LINK_A=() LINK_B=()
TOPO_CHECKS=""
lineno=0
while IFS= read -r line || [ -n "$line" ]; do
    lineno=$((lineno + 1))
    line=${line%%#*}
    read -r -a w <<< "$line" || true
    [ ${#w[@]} -eq 0 ] && continue
    case ${w[0]} in
        nodes)
            if ! { [ ${#w[@]} -eq 2 ] && [[ ${w[1]} =~ ^[0-9]+$ ]] && [ "${w[1]}" -ge 2 ] && [ "${w[1]}" -le 16 ]; }; then
                die "$TOPO_FILE:$lineno: 'nodes N' needs N in 2..16"
            fi
            NODES=${w[1]} ;;
        link)
            [ "$NODES" -gt 0 ] || die "$TOPO_FILE:$lineno: 'link' before 'nodes'"
            [ ${#w[@]} -eq 3 ] || die "$TOPO_FILE:$lineno: 'link A B' takes two node numbers"
            for x in "${w[1]}" "${w[2]}"; do
                if ! { [[ $x =~ ^[0-9]+$ ]] && [ "$x" -ge 1 ] && [ "$x" -le "$NODES" ]; }; then
                    die "$TOPO_FILE:$lineno: node '$x' out of range (accepted: 1..$NODES)"
                fi
            done
            [ "${w[1]}" != "${w[2]}" ] || die "$TOPO_FILE:$lineno: a link joins two different nodes (rxe cannot loop back in one VM)"
            if [ "${w[1]}" -lt "${w[2]}" ]; then LINK_A+=("${w[1]}") LINK_B+=("${w[2]}"); else LINK_A+=("${w[2]}") LINK_B+=("${w[1]}"); fi ;;
        checks) TOPO_CHECKS="${w[*]:1}" ;;
        *) die "$TOPO_FILE:$lineno: unknown statement '${w[0]}' (accepted: nodes, link, checks)" ;;
    esac
done < "$TOPO_FILE"
[ "$NODES" -ge 2 ] || die "$TOPO_FILE: no 'nodes N' line"
NLINKS=${#LINK_A[@]}
[ "$NLINKS" -ge 1 ] || die "$TOPO_FILE: no 'link A B' line"
for ((n = 1; n <= NODES; n++)); do
    [[ " ${LINK_A[*]} ${LINK_B[*]} " == *" $n "* ]] || die "$TOPO_FILE: node $n has no link"
done
CHECKS_LIST=${CHECKS_OVERRIDE:-$TOPO_CHECKS}
ACCEPTED="payload write_bw read_bw send_bw write_lat send_lat read_lat pingpong bench:latency bench:bandwidth bench:alltoall bench:allreduce bench:MODE@A-B no-route:A-B samehost:MODE@N fault:kill-peer[@A-B] fault:link-down[@A-B] fault:cable-pull[@A-B] fault:link-flap[@A-B] doctor watch:MODE"
check_pair() { # $1 check, $2 "A-B": two different nodes of the topology
    [[ $2 =~ ^([0-9]+)-([0-9]+)$ ]] || die "check '$1': '$2' is not A-B (two node numbers)"
    local x
    for x in "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"; do
        { [ "$x" -ge 1 ] && [ "$x" -le "$NODES" ]; } || die "check '$1': node $x out of range (accepted: 1..$NODES)"
    done
    [ "${BASH_REMATCH[1]}" != "${BASH_REMATCH[2]}" ] || die "check '$1': A and B must differ"
}
KILLED=() # victims of fault:kill-peer: their death is expected
for c in $CHECKS_LIST; do
    case $c in
        write_bw | read_bw | send_bw | write_lat | send_lat | read_lat | pingpong) ;;
        bench:latency | bench:bandwidth | bench:alltoall | bench:allreduce | doctor) ;;
        payload) [ -n "$PAYLOAD" ] || die "check 'payload' needs --payload DIR" ;;
        watch:latency | watch:bandwidth | watch:alltoall | watch:allreduce) ;;
        bench:latency@* | bench:bandwidth@* | bench:alltoall@* | bench:allreduce@*) check_pair "$c" "${c#*@}" ;;
        no-route:*) check_pair "$c" "${c#no-route:}" ;;
        samehost:latency@* | samehost:bandwidth@* | samehost:alltoall@* | samehost:allreduce@*)
            x=${c#*@}
            if ! [[ $x =~ ^[0-9]+$ ]] || [ "$x" -lt 1 ] || [ "$x" -gt "$NODES" ]; then
                die "check '$c': '$x' is not a node of the topology (accepted: 1..$NODES)"
            fi ;;
        fault:link-down | fault:cable-pull | fault:link-flap) [ "$NODES" -ge 2 ] ;;
        fault:link-down@* | fault:cable-pull@* | fault:link-flap@*) check_pair "$c" "${c#*@}" ;;
        fault:kill-peer | fault:kill-peer@*)
            sp=1-2; [[ $c == *@* ]] && sp=${c#*@}
            check_pair "$c" "$sp"; KILLED+=("${sp#*-}") ;;
        *) die "unknown check '$c' (accepted: $ACCEPTED)" ;;
    esac
done
[ ${#KILLED[@]} -le 1 ] || die "one fault:kill-peer per run (its victim powers off)"
if [ ${#KILLED[@]} -eq 1 ]; then
    read -r -a cl <<< "$CHECKS_LIST"
    [[ ${cl[-1]} == fault:kill-peer* ]] || die "fault:kill-peer must be the last check (its victim powers off)"
fi
if [ "$WITH_SW" = 0 ] && [[ " $CHECKS_LIST " =~ \ (bench:|doctor\ |no-route:|samehost:|fault:|watch:) ]]; then
    die "bench, doctor and watch checks need the switchless binary (drop --no-switchless)"
fi
if [ -n "$PAYLOAD" ]; then
    if [ ! -d "$PAYLOAD" ] || [ ! -x "$PAYLOAD/run" ]; then
        die "--payload $PAYLOAD: not a directory with an executable 'run'"
    fi
    PAYLOAD=$(cd "$PAYLOAD" && pwd)
fi
log "topology $TOPO_NAME: $NODES nodes, $NLINKS links; mtu $MTU; checks: ${CHECKS_LIST:-none}"

# The guests are x86-64 (an amd64 kernel, this host's x86-64 rdma-core and binaries copied in).
[ "$(uname -m)" = x86_64 ] || die "the lab's VMs are x86-64 guests built from this host's files; this host is $(uname -m) (on a GB10, test on the hardware: docs/guide/aarch64.md)"

# ---------------------------------------------------------------- packages
PKGS=$(sed 's/#.*//' "$REPO/scripts/deps.d/lab.txt" | tr -s ' \t' '\n' | sed '/^$/d')
if [ -z "${NO_INSTALL:-}" ]; then
    missing=()
    for p in $PKGS; do dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' || missing+=("$p"); done
    if [ ${#missing[@]} -gt 0 ]; then
        t=$(date +%s.%N); log "installing: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q > /dev/null
        apt-get install -y -q --no-install-recommends "${missing[@]}" > /dev/null
        log "install took $(since "$t")s"
    fi
fi
command -v qemu-system-x86_64 > /dev/null || die "qemu-system-x86_64 missing (package qemu-system-x86)"

# ---------------------------------------------------------------- guest kernel
# The distribution's own kernel, downloaded with apt-get download and unpacked (never installed).
# Debian: linux-image-<ver>-amd64-unsigned (bookworm's 6.1: its rxe flakes least of the kernels tried).
# Ubuntu: linux-image-<ver>-generic + linux-modules-<ver>-generic + linux-modules-extra (rdma_rxe).
if apt-cache show linux-image-amd64 > /dev/null 2>&1; then
    kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
    debs=("$kpkg-unsigned")
elif apt-cache show linux-image-generic > /dev/null 2>&1; then
    kpkg=$(apt-cache depends linux-image-generic | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
    debs=("$kpkg" "linux-modules-${kpkg#linux-image-}" "linux-modules-extra-${kpkg#linux-image-}")
else
    die "apt-cache knows neither linux-image-amd64 (Debian) nor linux-image-generic (Ubuntu): no guest kernel to download"
fi
[ -n "$kpkg" ] || die "apt-cache found no kernel package behind the linux-image meta package"
KROOT=$CACHE/kernels/$kpkg
if [ ! -d "$KROOT/boot" ]; then
    t=$(date +%s.%N); rm -rf "$KROOT"; mkdir -p "$KROOT"
    (cd "$KROOT" && apt-get download -q "${debs[@]}" > /dev/null 2>&1 && for d in ./*.deb; do dpkg-deb -x "$d" .; done &&
        rm -f ./*.deb && { [ -d lib/modules ] || ln -s usr/lib lib; } && depmod -b . "$(ls lib/modules)") ||
        { rm -rf "$KROOT"; die "download/unpack of ${debs[*]} failed"; }
    log "fetched and unpacked ${debs[*]} in $(since "$t")s"
fi
KVER=$(find "$KROOT/lib/modules" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -V | tail -1)
KERNEL=$KROOT/boot/vmlinuz-$KVER
[ -r "$KERNEL" ] || die "no kernel image $KERNEL"
# TCG: KVM here is kvm_pvm (nested in Firecracker) which a stock kernel cannot use; take KVM only
# with real VT-x/AMD-V.
if [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo && [ ! -d /sys/module/kvm_pvm ]; then
    ACCEL=(-accel kvm -cpu host) ACCEL_NAME=kvm
else
    ACCEL=(-accel "tcg,thread=multi" -cpu qemu64) ACCEL_NAME=tcg
fi
log "kernel $KVER, accel $ACCEL_NAME, $(qemu-system-x86_64 --version | head -1)"

# ---------------------------------------------------------------- switchless binary + plugin
SW_BIN="" SW_LIB=""
if [ "$WITH_SW" = 1 ]; then
    # the plugin: cargo's uplifted copy, or the deps/ copy that `cargo test` leaves (the uplifted one
    # is stale after a test-only build): the newer of the two
    find_lib() {
        local c best=""
        for c in "$BIN_DIR/libswitchless.so" "$BIN_DIR/deps/libswitchless.so"; do
            [ -f "$c" ] || continue
            if [ -z "$best" ] || [ "$c" -nt "$best" ]; then best=$c; fi
        done
        echo "$best"
    }
    SW_LIB=$(find_lib)
    if [ ! -x "$BIN_DIR/switchless" ] || [ -z "$SW_LIB" ]; then
        [ "$BUILD" = 1 ] || die "$BIN_DIR has no switchless + libswitchless.so (build them, drop --no-build, or pass --no-switchless)"
        case $BIN_DIR in
            */release) prof=(--release) ;;
            */debug) prof=() ;;
            *) die "--bin-dir $BIN_DIR lacks the binaries and is not a cargo release or debug dir; build them first" ;;
        esac
        # "/debug" is what "--bin-dir $CARGO_TARGET_DIR/debug" gives with the variable unset: never
        # build a whole target tree at the filesystem root
        case $(dirname "$BIN_DIR") in
            / | .) die "--bin-dir $BIN_DIR lacks the binaries and its parent is not a cargo target directory (an unset \$CARGO_TARGET_DIR?); pass <target>/debug or <target>/release" ;;
        esac
        t=$(date +%s.%N); log "building ${prof[*]:-debug} binaries into $BIN_DIR"
        (cd "$REPO" && CARGO_TARGET_DIR=$(dirname "$BIN_DIR") cargo build "${prof[@]}") >&2 || die "cargo build ${prof[*]} failed"
        log "build took $(since "$t")s"
        SW_LIB=$(find_lib)
    fi
    SW_BIN=$BIN_DIR/switchless
    { [ -x "$SW_BIN" ] && [ -f "$SW_LIB" ]; } || die "no $SW_BIN or libswitchless.so in $BIN_DIR"
    log "switchless: $SW_BIN, plugin: $SW_LIB"
fi

# ---------------------------------------------------------------- results dir
[ -n "$RESULTS" ] || RESULTS=$CACHE/results/$TOPO_NAME-mtu$MTU-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
WORK=$RESULTS/.work
rm -rf "$WORK"; mkdir -p "$WORK"
ln -sfn "$RESULTS" "$CACHE/results/latest" 2> /dev/null || true

# ---------------------------------------------------------------- initramfs
ROOT=$WORK/initramfs
mkdir -p "$ROOT"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,etc,proc,sys,dev,tmp,run,results,root,lab}
ln -s usr/bin "$ROOT/bin"; ln -s usr/sbin "$ROOT/sbin"; ln -s usr/lib "$ROOT/lib"; ln -s usr/lib64 "$ROOT/lib64"
cpfile() { # copy $1 to the same canonical (merged-/usr) path in the initramfs
    local d; d=$(readlink -f "$(dirname "$1")")
    mkdir -p "$ROOT$d"; cp -L "$1" "$ROOT$d/$(basename "$1")"
}
cplibs() { # the shared-library closure of ELF file $1
    ldd "$1" 2> /dev/null | awk '/=> \//{print $3} /^\t\/lib/{print $1}' | while read -r l; do
        [ -e "$ROOT$(readlink -f "$(dirname "$l")")/$(basename "$l")" ] || cpfile "$l"
    done
}
cp /bin/busybox "$ROOT/usr/bin/busybox"
for a in $("$ROOT/usr/bin/busybox" --list); do [ -e "$ROOT/usr/bin/$a" ] || ln -s busybox "$ROOT/usr/bin/$a"; done
BINS=(/usr/bin/rdma /usr/sbin/ip /usr/bin/ibv_devices /usr/bin/ibv_devinfo /usr/bin/ibv_rc_pingpong
    /usr/bin/ib_write_bw /usr/bin/ib_read_bw /usr/bin/ib_send_bw /usr/bin/ib_write_lat /usr/bin/ib_send_lat /usr/bin/ib_read_lat)
for b in "${BINS[@]}"; do
    rm -f "$ROOT/usr/bin/$(basename "$b")" "$ROOT/usr/sbin/$(basename "$b")"
    cpfile "$b"; cplibs "$b"
done
# rxe verbs provider (dlopen'ed: not in ldd output); Rust code needs libgcc_s for unwinding
mkdir -p "$ROOT/etc/libibverbs.d"
cp /etc/libibverbs.d/rxe.driver "$ROOT/etc/libibverbs.d/"
for p in /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so; do cpfile "$p"; cplibs "$p"; done
cpfile /lib/x86_64-linux-gnu/libgcc_s.so.1
if [ -n "$SW_BIN" ]; then
    # layout `switchless bench` searches by default: <bin dir>/../lib/libnccl-net-switchless.so
    mkdir -p "$ROOT/opt/switchless/bin" "$ROOT/opt/switchless/lib"
    cp "$SW_BIN" "$ROOT/opt/switchless/bin/switchless"
    cp "$SW_LIB" "$ROOT/opt/switchless/lib/libnccl-net-switchless.so"
    if command -v strip > /dev/null; then strip -g "$ROOT/opt/switchless/bin/switchless" "$ROOT/opt/switchless/lib/libnccl-net-switchless.so"; fi
    cplibs "$SW_BIN"; cplibs "$SW_LIB"
fi
if [ -n "$PAYLOAD" ]; then
    mkdir -p "$ROOT/opt/payload"
    cp -a "$PAYLOAD/." "$ROOT/opt/payload/"
    while IFS= read -r -d '' f; do
        if head -c 4 "$f" | grep -q 'ELF'; then
            if command -v strip > /dev/null; then strip -g "$f"; fi
            cplibs "$f"
        fi
    done < <(find "$ROOT/opt/payload" -type f -print0)
    log "payload: $(du -sh "$ROOT/opt/payload" | cut -f1) from $PAYLOAD"
fi
MODS="crc32_generic crc32-pclmul virtio_pci virtio_net rdma_rxe ib_uverbs 9p 9pnet_virtio"
for f in $(for m in $MODS; do modprobe -d "$KROOT" -S "$KVER" --show-depends "$m"; done | awk '$1=="insmod"{print $2}' | sort -u); do
    rel=${f#"$KROOT"}; mkdir -p "$ROOT$(dirname "$rel")"
    case $f in # busybox modprobe loads uncompressed modules only
        *.xz) xz -dc "$f" > "$ROOT${rel%.xz}" ;;
        *.zst) zstd -qdc "$f" > "$ROOT${rel%.zst}" ;;
        *) cp "$f" "$ROOT$rel" ;;
    esac
done
cp "$KROOT"/lib/modules/"$KVER"/modules.{order,builtin,builtin.modinfo} "$ROOT/lib/modules/$KVER/" 2> /dev/null || true
depmod -b "$ROOT" "$KVER"
echo "root:x:0:0:root:/root:/bin/sh" > "$ROOT/etc/passwd"
printf '127.0.0.1 localhost\n' > "$ROOT/etc/hosts"
install -m 755 "$LAB_DIR/guest/init" "$ROOT/init"
install -m 755 "$LAB_DIR/guest/runner.sh" "$ROOT/lab/runner.sh"

# ---------------------------------------------------------------- cables
# Per node: "lid:mac:prefixlen:local_ip:peer_ip:peer_node:role,..." (role s = lower node, which
# also listens on the cable's TCP socket; VMs start in node order), and the QEMU netdev arguments.
declare -a NODE_LINKS NODE_NET NODE_WAIT
for ((l = 1; l <= NLINKS; l++)); do
    a=${LINK_A[l - 1]} b=${LINK_B[l - 1]}
    read -r plen ia ib <<< "$(lab_link_addr "$l")"
    port=$((BASEPORT + l))
    maca=$(printf '52-54-00-%02x-%02x-01' "$l" "$a") macb=$(printf '52-54-00-%02x-%02x-01' "$l" "$b")
    NODE_LINKS[a]+="${NODE_LINKS[a]:+,}$l:$maca:$plen:$ia:$ib:$b:s"
    NODE_LINKS[b]+="${NODE_LINKS[b]:+,}$l:$macb:$plen:$ib:$ia:$a:c"
    NODE_NET[a]+=" -netdev socket,id=l$l,listen=127.0.0.1:$port -device virtio-net-pci,romfile=,netdev=l$l,mac=${maca//-/:}"
    NODE_NET[b]+=" -netdev socket,id=l$l,connect=127.0.0.1:$port -device virtio-net-pci,romfile=,netdev=l$l,mac=${macb//-/:}"
    NODE_WAIT[b]+=" $port"
    log "link $l: node $a $ia/$plen <-> node $b $ib/$plen (127.0.0.1:$port)"
done
q() { local v=${1//\'/\'\\\'\'}; printf "'%s'" "$v"; }
# LAB_FAULT_BOUND's default, derived from the guest environment: the longest a clean end of a fault
# check can take is the longest of the plugin's three ways to learn of a dead path: a work request's
# RC retries (4.096 us x 2^NCCL_IB_TIMEOUT x (NCCL_IB_RETRY_CNT + 1)), the port-down check (that
# budget, at least 1 s) and NCCL_SWITCHLESS_REQUEST_TIMEOUT when set. The bound is twice that plus
# 10 s: under TCG each VM's vCPU shares a host core with rxe's kernel threads and the other VMs, and
# stalls of a few seconds happen. CI's fault runs (14, 3, 5 s) get 2 x 5 + 10 = 20 s (measured ends:
# 0.3-5.7 s); with no request timeout, 2 x 1 + 10 = 12 s (measured: 0.5-1.3 s).
fault_bound() {
    local ib_timeout=20 retry=6 req_ms=0 kv v n unit
    for kv in $GUEST_ENV; do
        v=${kv#*=}
        case $kv in
            NCCL_IB_TIMEOUT=*) ib_timeout=$v ;;
            NCCL_IB_RETRY_CNT=*) retry=$v ;;
            NCCL_SWITCHLESS_REQUEST_TIMEOUT=*)
                [[ $v =~ ^([0-9]+)(ms|s|m|min)?$ ]] || die "NCCL_SWITCHLESS_REQUEST_TIMEOUT=$v: not a duration (30000, 500ms, 30s, 2m)"
                n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]}
                case $unit in '' | ms) req_ms=$n ;; s) req_ms=$((n * 1000)) ;; *) req_ms=$((n * 60000)) ;; esac ;;
        esac
    done
    awk -v t="$ib_timeout" -v r="$retry" -v q="$req_ms" 'BEGIN {
        rc = 4.096e-6 * 2 ^ t * (r + 1); port = (rc > 1 ? rc : 1); m = rc
        if (port > m) m = port
        if (q / 1000 > m) m = q / 1000
        printf "%d", 2 * m + 10 + 0.999 }'
}
read -r _ mip1 <<< "$(lab_mgmt_addr 1)"
{
    echo "L_nodes=$NODES"; echo "L_mtu=$MTU"; echo "L_checks=$(q "$CHECKS_LIST")"
    echo "L_ctimeout=$CHECK_TIMEOUT"; echo "L_bwargs=$(q "$BW_ARGS")"; echo "L_latargs=$(q "$LAT_ARGS")"
    echo "L_benchargs=$(q "$BENCH_ARGS")"; echo "L_bootstrap=$mip1"; echo "L_inject_fault=${LAB_INJECT_FAULT:-0}"
    # NCCL_IB_RETRY_CNT=6 first: doctor's remedy for rxe's endless retries at 7 (--guest-env may override).
    echo "L_env=$(q "NCCL_IB_RETRY_CNT=6 $GUEST_ENV")"
    echo "L_noroute_bound=${LAB_NOROUTE_BOUND:-10}"; echo "L_fault_bound=${LAB_FAULT_BOUND:-$(fault_bound)}"
    echo "L_fault_pkts=${LAB_FAULT_PKTS:-300}"; echo "L_fault_hang=${LAB_FAULT_HANG:-60}"
    echo "L_linkdown_iters=${LAB_LINKDOWN_ITERS:-200}"; echo "L_flap_iters=${LAB_FLAP_ITERS:-150}"; echo "L_flap_s=${LAB_FLAP_S:-2}"; echo "L_fault_peer_hang=${LAB_FAULT_PEER_HANG:-fail}"
    for ((n = 1; n <= NODES; n++)); do
        read -r mplen mip <<< "$(lab_mgmt_addr "$n")"
        echo "L_links_$n=$(q "${NODE_LINKS[n]}")"
        echo "L_mgmtip_$n=$mip/$mplen"
        echo "L_mgmtmac_$n=$(printf '52-54-00-ff-%02x-02' "$n")"
    done
} > "$ROOT/etc/lab.conf"
t=$(date +%s.%N)
(cd "$ROOT" && find . | cpio -o -H newc --quiet | gzip -1) > "$WORK/initramfs.img"
log "initramfs $(du -h "$WORK/initramfs.img" | cut -f1) built in $(since "$t")s"

# ---------------------------------------------------------------- boot + run
PIDS=()
NS=swlab$$
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2> /dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2> /dev/null || true; done
    PIDS=()
    ip netns del "$NS" 2> /dev/null || true
}
trap 'cleanup; rm -rf "$WORK"' EXIT # the initramfs (about 40 MB) is rebuilt each run
trap 'exit 130' INT TERM
attempt=1

# The guest kernel's own fault marker. With oops=panic every Oops and BUG ends in this panic; a
# WARNING does not stop the kernel and can come from what the code under test asks of rxe, so a
# round that fails with only a WARNING is a failure (its lines are shown), never retried.
FAULT_RE='Kernel panic - not syncing'
WARN_RE='WARNING: CPU|BUG: soft lockup|INFO: task .* blocked'
# A node that a fault:kill-peer check powers off prints LAB_EXPECTED_DEATH first: it is done, not
# failed, when it is that check's victim and its console shows no kernel fault.
expected_death() {
    local v
    for v in "${KILLED[@]}"; do
        if [ "$v" = "$1" ] && grep -qa "LAB_EXPECTED_DEATH node $1 " "$RESULTS/node$1.log" &&
            ! grep -qaE "$FAULT_RE" "$RESULTS/node$1.log"; then return 0; fi
    done
    return 1
}
powering_off() { # node $1 is the kill-peer victim and has issued its power-off
    [ ${#KILLED[@]} -eq 1 ] && [ "${KILLED[0]}" = "$1" ] &&
        grep -qa "LAB_EXPECTED_DEATH node $1 " "$RESULTS/node$1.log" && grep -qa "sysrq: Power Off" "$RESULTS/node$1.log"
}
node_done() { grep -qa "RESULT PASS" "$RESULTS/node$1.log" || expected_death "$1"; }
round() { # one boot-and-check round; returns 0 when every node passed
    local n p i rc=0 alive end t mac why
    local -a off_at=()
    ip netns add "$NS"
    ip -n "$NS" link set lo up
    # QEMU's TCP netdev does not set TCP_NODELAY: without quickack, Nagle + delayed ACK add ~20 ms
    # to small frames.
    ip -n "$NS" route replace local 127.0.0.1 dev lo table local proto kernel scope host src 127.0.0.1 quickack 1
    ip -n "$NS" route replace local 127.0.0.0/8 dev lo table local proto kernel scope host src 127.0.0.1 quickack 1
    # management hub: UDP multicast on the namespace's loopback
    ip -n "$NS" link set lo multicast on
    ip -n "$NS" route add 224.0.0.0/4 dev lo
    for ((n = 1; n <= NODES; n++)); do
        rm -rf "${RESULTS:?}/node$n"; mkdir -p "$RESULTS/node$n"
    done
    t=$(date +%s.%N)
    for ((n = 1; n <= NODES; n++)); do
        for p in ${NODE_WAIT[n]:-}; do # the listening end of each cable must exist first
            for ((i = 0; i < 100; i++)); do
                ip netns exec "$NS" ss -Hltn "sport = :$p" 2> /dev/null | grep -q . && break
                sleep 0.1
            done
        done
        mac=$(printf '52:54:00:ff:%02x:02' "$n")
        # shellcheck disable=SC2086 # NODE_NET holds several arguments
        ip netns exec "$NS" qemu-system-x86_64 "${ACCEL[@]}" -machine q35 -smp "$SMP" -m "$MEM" -nographic -no-reboot \
            -nodefaults -serial stdio -kernel "$KERNEL" -initrd "$WORK/initramfs.img" \
            -virtfs "local,path=$RESULTS/node$n,mount_tag=results,security_model=none" \
            -netdev "socket,id=mg,mcast=230.0.0.1:$MGMT_PORT,localaddr=127.0.0.1" \
            -device "virtio-net-pci,romfile=,netdev=mg,mac=$mac" ${NODE_NET[n]} \
            -append "console=ttyS0 quiet loglevel=3 oops=panic panic=-1 lab.node=$n lab.attempt=$attempt" \
            < /dev/null > "$RESULTS/node$n.log" 2>&1 &
        PIDS+=($!)
        log "VM node$n pid ${PIDS[n - 1]}: links ${NODE_LINKS[n]}"
    done
    end=$(($(date +%s) + TIMEOUT))
    while :; do # fail fast: when one VM dies without passing, stop the others
        alive=0
        for ((n = 1; n <= NODES; n++)); do
            if kill -0 "${PIDS[n - 1]}" 2> /dev/null; then
                alive=$((alive + 1))
                # a fault:kill-peer victim whose power-off stalls (rxe under TCG can soft-lock
                # ksoftirqd during shutdown) is cut off by the host 5 s after its sysrq
                if powering_off "$n"; then
                    [ -n "${off_at[n]:-}" ] || off_at[n]=$(date +%s)
                    if [ $(($(date +%s) - off_at[n])) -ge 5 ]; then
                        log "node$n: planned power-off not finished after 5 s; stopping its VM"
                        kill "${PIDS[n - 1]}" 2> /dev/null || true
                        echo "LAB_HOST_STOPPED_AFTER_POWEROFF" >> "$RESULTS/node$n.log"
                    fi
                fi
            elif ! node_done "$n"; then
                log "node$n exited without passing; stopping the other VMs"; rc=1; alive=0; break
            fi
        done
        [ $alive -eq 0 ] && break
        if [ "$(date +%s)" -ge $end ]; then log "round timed out after ${TIMEOUT}s; stopping the VMs"; rc=1; break; fi
        sleep 0.5
    done
    cleanup
    log "VMs finished in $(since "$t")s"
    FAULT=0
    for ((n = 1; n <= NODES; n++)); do
        if expected_death "$n"; then
            log "node$n powered off as its fault check planned (LAB_EXPECTED_DEATH)"
        elif ! grep -qa "RESULT PASS" "$RESULTS/node$n.log"; then
            why=$(grep -aE 'RESULT|CHECKFAIL|FAIL' "$RESULTS/node$n.log" | tail -3 | tr -d '\r' | tr '\n' ' ')
            rc=1; log "node$n did not pass: ${why:-no RESULT line (stopped early: another node failed, or the round timed out)}"
        fi
        if [ $rc -ne 0 ] && grep -qaE "$WARN_RE" "$RESULTS/node$n.log"; then
            log "node$n: kernel warning (not a fault: not retried): $(grep -aE "$WARN_RE" "$RESULTS/node$n.log" | head -2 | tr -d '\r' | tr '\n' ' ')"
        fi
        if grep -qaE "$FAULT_RE" "$RESULTS/node$n.log"; then
            FAULT=1; rc=1
            log "node$n: guest kernel fault: $(grep -aE "$FAULT_RE" "$RESULTS/node$n.log" | head -2 | tr -d '\r' | tr '\n' ' ')"
            echo "LAB_GUEST_KERNEL_FAULT node$n"
        fi
    done
    return $rc
}

rc=0
round || rc=$?
if [ $rc -ne 0 ] && [ "$FAULT" = 1 ] && [ "$RETRY" = 1 ]; then
    log "guest kernel panic (an rxe/emulator flake, not the code under test): retrying once"
    # A rerun into the same --results folder (a developer's checkout) finds the last run's attempt.
    rm -rf "$RESULTS/attempt1"
    mkdir -p "$RESULTS/attempt1"
    for ((n = 1; n <= NODES; n++)); do mv "$RESULTS/node$n" "$RESULTS/node$n.log" "$RESULTS/attempt1/"; done
    attempt=2 rc=0
    round || rc=$?
fi

# ---------------------------------------------------------------- summary
cat "$RESULTS"/node*/checks.jsonl > "$RESULTS/summary.jsonl" 2> /dev/null || true
for ((n = 1; n <= NODES; n++)); do
    [ -s "$RESULTS/node$n/checks.jsonl" ] || { rc=1; log "node$n wrote no checks.jsonl"; }
done
if grep -q '"status":"fail"' "$RESULTS/summary.jsonl" 2> /dev/null; then rc=1; fi
{
    echo "topology=$TOPO_NAME nodes=$NODES links=$NLINKS mtu=$MTU accel=$ACCEL_NAME kernel=$KVER attempts=$attempt"
    echo "checks: ${CHECKS_LIST:-none}"
    grep -ahoE 'LAB\[[0-9]+\] (booted|rxe ready|link |SUMMARY|doctor findings|CHECKOK|CHECKFAIL|CHECKXFAIL|FAULT|checks finished|RESULT).*' "$RESULTS"/node*.log | tr -d '\r' || true
    echo "total $(since "$T0")s"
    [ $rc -eq 0 ] && echo "LAB PASS" || echo "LAB FAIL"
} > "$RESULTS/summary.txt"
cat "$RESULTS/summary.txt"
echo "results: $RESULTS"
exit $rc
