#!/usr/bin/env bash
# The plugin under a stock NCCL, in one command: two ranks on one GPU made to look like two hosts
# (NCCL_HOSTID differs per rank, so NCCL uses the network between them), each rank in its own
# network namespace, the two joined by a veth /30 (a point-to-point cable). NCCL loads the built
# .so (NCCL_NET_PLUGIN=<path>, NCCL_NET=switchless: fail rather than fall back), runs every
# collective through the PyTorch driver and the C/CUDA driver (gpu/selftest.py, gpu/nccl_selftest.cu),
# and the script checks every result element, NCCL's own log lines (plugin loaded, ncclNet ABI,
# channels via NET/switchless) and the plugin's per-connection route lines. Exit 0 only if all hold.
#
#   nccl-tests/gpu-selftest.sh --stage [--with-ibverbs]   # on the build host: release .so + CLI into gpu/stage/
#   nccl-tests/gpu-selftest.sh --out /tmp/st               # on the GPU host: the whole check
#   nccl-tests/gpu-selftest.sh --no-gpu                    # namespaces, plugin load, bench over the veth (CI)
#   nccl-tests/gpu-selftest.sh --dry-run                   # every command and variable, nothing created
#
# See docs/gpu-selftest.md (what is checked, where results go) and --help.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
gpu="$here/gpu"

stage_dir="$gpu/stage"
plugin=""
cli=""
out=""
drivers="torch,c"
collectives="all_reduce,all_gather,reduce_scatter,alltoall,broadcast,sendrecv"
dtypes="float32,bfloat16"
min_bytes=8
max_bytes=256M
iters=10
bytes_per_size=512M
network=auto
netns_tool=auto
transport=tcp
device=0
timeout_s=300
baseline=none
mps=0
no_gpu=0
dry=0
do_stage=0
with_ibverbs=0
iface=cable0
ip0=10.203.0.1
ip1=10.203.0.2
prefix=30
mtu=9000

usage() {
  cat << 'EOF'
usage: gpu-selftest.sh [options]

Two ranks on one GPU, each in its own network namespace joined by a veth /30 ("cable0",
10.203.0.1/30 - 10.203.0.2/30, MTU 9000), NCCL_HOSTID different per rank so NCCL uses the
network; NCCL loads the plugin .so and runs all_reduce, all_gather, reduce_scatter, alltoall,
broadcast and send/recv (8 B - 256 MiB, float32 and bfloat16) through PyTorch and through a C/CUDA
program, every element checked. Where namespaces cannot be created (sandboxed runtimes) both ranks
share the host and the plugin must carry them over 127.0.0.1 (its same-host path); the script says so.

Actions:
      --stage              build the release plugin and CLI here (stripped) into the stage directory,
                           with BUILD-INFO (commit, date, sha256, NEEDED libraries); then exit
      --with-ibverbs       with --stage: also copy libibverbs.so.1 and the libraries it needs from
                           this host, for a GPU host without rdma-core (the plugin links it today)
      --no-gpu             only the parts that need no GPU: namespaces + veth, plugin load and
                           `switchless bench` over the veth (iperf3 too if present)
      --dry-run            print every command and exported variable; create nothing
  -h, --help               this help

Options:
      --plugin PATH        plugin .so (default: STAGE/libnccl-net-switchless.so, else
                           target/release/libswitchless.so)
      --cli PATH           switchless CLI for the bench (default: STAGE/switchless, else
                           target/release/switchless)
      --stage-dir DIR      default nccl-tests/gpu/stage (ignored by git; carry it to the GPU host)
  -o, --out DIR            results (default nccl-tests/gpu/results/<date>-<time>, ignored by git)
      --drivers LIST       torch,c (default both)
  -t, --collectives LIST   default all six
      --dtypes LIST        float32,bfloat16 (default both)
  -b, --min-bytes SIZE     default 8
  -e, --max-bytes SIZE     default 256M
  -n, --iters N            timed iterations per size (default 10; fewer above --bytes-per-size / N)
      --bytes-per-size B   default 512M
      --network MODE       auto (namespaces, else same host), netns, same-host
      --netns-tool TOOL    auto (ip, else unshare + nsenter + gpu/netlink.py), ip, unshare
      --transport T        NCCL_SWITCHLESS_TRANSPORT for the ranks: tcp (default) or auto
      --device N           GPU for both ranks (CUDA_VISIBLE_DEVICES, default 0)
      --timeout SEC        per driver run (default 300)
      --baseline NET       none (default) or socket: also run the torch driver over NCCL's own TCP
                           transport (NCCL_NET=Socket, no plugin) between the same namespaces, and
                           report switchless beside it size by size (the same path, GPU and NCCL)
      --mps                run the ranks under CUDA MPS (nvidia-cuda-mps-control -d, stopped at exit),
                           so the two ranks' kernels share the GPU instead of time-slicing it

Exit status: 0 every check passed and NCCL used the plugin; 1 a check failed; 2 usage or a missing
tool; 3 blocked by a known gap (no same-host path in this plugin build, libibverbs missing).
EOF
}

die() {
  echo "gpu-selftest: $*" >&2
  exit 2
}

while [ $# -gt 0 ]; do
  opt="$1"
  case "$opt" in
    -h | --help) usage; exit 0 ;;
    --stage) do_stage=1; shift; continue ;;
    --with-ibverbs) with_ibverbs=1; shift; continue ;;
    --no-gpu) no_gpu=1; shift; continue ;;
    --mps) mps=1; shift; continue ;;
    --dry-run) dry=1; shift; continue ;;
  esac
  case "$opt" in
    --plugin | --cli | --stage-dir | -o | --out | --drivers | -t | --collectives | --dtypes | -b | --min-bytes | \
      -e | --max-bytes | -n | --iters | --bytes-per-size | --network | --netns-tool | --transport | --device | --timeout | \
      --baseline)
      [ $# -ge 2 ] || die "option $opt needs a value (see --help)"
      ;;
    *) die "unknown option '$opt' (see --help)" ;;
  esac
  val="$2"
  case "$opt" in
    --plugin) plugin="$val" ;;
    --cli) cli="$val" ;;
    --stage-dir) stage_dir="$val" ;;
    -o | --out) out="$val" ;;
    --drivers) drivers="$val" ;;
    -t | --collectives) collectives="$val" ;;
    --dtypes) dtypes="$val" ;;
    -b | --min-bytes) min_bytes="$val" ;;
    -e | --max-bytes) max_bytes="$val" ;;
    -n | --iters) iters="$val" ;;
    --bytes-per-size) bytes_per_size="$val" ;;
    --network) network="$val" ;;
    --netns-tool) netns_tool="$val" ;;
    --transport) transport="$val" ;;
    --device) device="$val" ;;
    --timeout) timeout_s="$val" ;;
    --baseline) baseline="$val" ;;
    *) die "unknown option '$opt' (see --help)" ;;
  esac
  shift 2
done

check_list() { # name value allowed...
  local name="$1" value="$2" x
  shift 2
  for x in ${value//,/ }; do
    case " $* " in
      *" $x "*) ;;
      *) die "$name: unknown '$x' (accepted: $*)" ;;
    esac
  done
  [ -n "${value//,/}" ] || die "$name: empty"
}
check_list --drivers "$drivers" torch c
check_list --collectives "$collectives" all_reduce all_gather reduce_scatter alltoall broadcast sendrecv
check_list --dtypes "$dtypes" float32 bfloat16
check_list --network "$network" auto netns same-host
check_list --netns-tool "$netns_tool" auto ip unshare
check_list --transport "$transport" tcp auto
check_list --baseline "$baseline" none socket
for v in "$min_bytes" "$max_bytes" "$bytes_per_size"; do
  [[ "$v" =~ ^[0-9]+[KMG]?$ ]] || die "sizes look like 8, 64K, 256M or 1G; got '$v'"
done
for v in "$iters" "$timeout_s" "$device"; do
  [[ "$v" =~ ^[0-9]+$ ]] || die "--iters, --timeout and --device take whole numbers; got '$v'"
done

# Prints a command, quoted so it can be pasted.
show() {
  local w s=""
  for w in "$@"; do s+="$(printf '%q' "$w") "; done
  echo "+ ${s% }"
}
# Runs a command (printed first); in a dry run only prints it.
run() {
  show "$@"
  [ "$dry" = 1 ] || "$@"
}
say() { echo "gpu-selftest: $*"; }

# --- --stage: build here, for carrying --------------------------------------------------------------
if [ "$do_stage" = 1 ]; then
  target="${CARGO_TARGET_DIR:-$repo/target}"
  run cargo build --release --locked --lib --bin switchless --manifest-path "$repo/Cargo.toml"
  run mkdir -p "$stage_dir"
  run install -m755 "$target/release/libswitchless.so" "$stage_dir/libnccl-net-switchless.so"
  run install -m755 "$target/release/switchless" "$stage_dir/switchless"
  run strip --strip-unneeded "$stage_dir/libnccl-net-switchless.so" "$stage_dir/switchless"
  if [ "$with_ibverbs" = 1 ]; then
    # libibverbs.so.1 and what it needs that a plain glibc host lacks (rdma-core's libnl-3, libnl-route-3),
    # as this host resolves them; no providers (the GPU host has no RDMA device anyway).
    run mkdir -p "$stage_dir/lib"
    if [ "$dry" = 0 ]; then
      ibv=$(ldd "$stage_dir/libnccl-net-switchless.so" | awk '$1 == "libibverbs.so.1" { print $3 }')
      if [ -z "$ibv" ] || [ ! -e "$ibv" ]; then
        die "--with-ibverbs: this host has no libibverbs.so.1 (apt-get install libibverbs1)"
      fi
      mapfile -t extra < <(ldd "$ibv" | awk '$1 ~ /^libnl/ { print $3 }')
      for f in "$ibv" "${extra[@]}"; do
        run cp -L "$f" "$stage_dir/lib/$(basename "$f")"
      done
    fi
  fi
  if [ "$dry" = 0 ]; then
    {
      echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm), $(rustc --version 2>/dev/null || echo rustc ?)"
      echo "commit: $(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet HEAD 2>/dev/null || echo ' (uncommitted changes)')"
      (cd "$stage_dir" && find . -type f ! -name BUILD-INFO -print0 | sort -z | xargs -0 sha256sum)
      echo "NEEDED: $(readelf -d "$stage_dir/libnccl-net-switchless.so" | awk '/NEEDED/ { gsub(/[][]/, "", $5); printf "%s ", $5 }')"
      echo "exports: $(nm -D --defined-only "$stage_dir/libnccl-net-switchless.so" | awk '$3 ~ /^ncclNetPlugin_v/ { printf "%s ", $3 }')"
    } > "$stage_dir/BUILD-INFO"
    cat "$stage_dir/BUILD-INFO"
    say "stage: $(du -sh "$stage_dir" | cut -f1) in $stage_dir (copy it to the GPU host with the repository)"
  fi
  exit 0
fi

# --- what to run ----------------------------------------------------------------------------------
[ -n "$plugin" ] || { plugin="$stage_dir/libnccl-net-switchless.so"; [ -e "$plugin" ] || plugin="${CARGO_TARGET_DIR:-$repo/target}/release/libswitchless.so"; }
[ -n "$cli" ] || { cli="$stage_dir/switchless"; [ -e "$cli" ] || cli="${CARGO_TARGET_DIR:-$repo/target}/release/switchless"; }
[ -n "$out" ] || out="$gpu/results/$(date +%Y%m%d-%H%M%S)"
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
if [ "$dry" = 0 ]; then
  [ -e "$plugin" ] || die "no plugin at $plugin: build it (nccl-tests/gpu-selftest.sh --stage) or give --plugin PATH"
  [ -x "$cli" ] || die "no switchless CLI at $cli: build it (--stage) or give --cli PATH"
  plugin=$(readlink -f "$plugin")
  cli=$(readlink -f "$cli")
  mkdir -p "$out"
  exec > >(tee -a "$out/selftest.log") 2>&1
  tee_pid=$!
fi
py=python3
base_port=$((20000 + $$ % 20000))
say "$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm); output: $out"
say "plugin: $plugin; CLI: $cli"
[ -r "$stage_dir/BUILD-INFO" ] && sed 's/^/gpu-selftest: stage: /' "$stage_dir/BUILD-INFO"

status=0      # 0 pass, 1 a check failed, 3 blocked
problems=()
fail() { problems+=("$*"); say "FAIL: $*"; [ "$status" = 3 ] || status=1; }
blocked() { problems+=("$*"); say "BLOCKED: $*"; status=3; }

# --- the plugin's libraries (it links libibverbs today) ---------------------------------------------
lib_path="${LD_LIBRARY_PATH:-}"
missing_libs() { LD_LIBRARY_PATH="$1" ldd "$plugin" 2>/dev/null | awk '/not found/ { print $1 }' | tr '\n' ' '; }
if [ "$dry" = 0 ] && command -v ldd > /dev/null; then
  miss=$(missing_libs "$lib_path")
  if [ -n "$miss" ] && [ -d "$stage_dir/lib" ]; then
    lib_path="$stage_dir/lib${lib_path:+:$lib_path}"
    say "the plugin needs $miss; using the copies in $stage_dir/lib"
    miss=$(missing_libs "$lib_path")
  fi
  if [ -n "$miss" ]; then
    blocked "the plugin cannot load here: missing ${miss% } (it links libibverbs as DT_NEEDED; install rdma-core's libibverbs1, stage with --stage --with-ibverbs, or use a build that loads libibverbs at run time)"
  else
    say "plugin libraries: all found ($(ldd "$plugin" | awk '/=>/ { print $1 }' | tr '\n' ' '))"
  fi
fi

# --- the GPU and PyTorch (a host without them stops here, before the namespaces) -------------------------
gpu_notes=()
if [ "$no_gpu" = 0 ] && [ "$dry" = 0 ]; then
  info=$(CUDA_VISIBLE_DEVICES="$device" "$py" -c 'import torch; print("|".join([torch.__version__, ".".join(map(str, torch.cuda.nccl.version())), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU", str(torch.cuda.device_count())]))' 2> "$out/torch-info.err") ||
    die "python3 cannot import torch: $(tail -n 3 "$out/torch-info.err")"
  say "torch | NCCL | GPU | GPUs: $info"
  IFS='|' read -r torch_ver nccl_ver gpu_name _ <<< "$info"
  gpu_notes+=(--note "torch=$torch_ver" --note "NCCL (torch's)=$nccl_ver" --note "GPU=$gpu_name")
  case "$gpu_name" in *"no GPU"*) die "torch sees no GPU" ;; esac
fi

# --- network: namespaces joined by a veth /30, else the same host -------------------------------------
tag="swst$$"
ns=("$tag-0" "$tag-1")
holders=()
pids=()
net_mode=""
net_reason=""
mps_on=0
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  if [ "$mps_on" = 1 ]; then
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$mps_dir/pipe" nvidia-cuda-mps-control > /dev/null 2>&1 || true
    mps_on=0
  fi
  case "$net_mode" in
    netns-ip) ip netns del "${ns[0]}" 2> /dev/null || true; ip netns del "${ns[1]}" 2> /dev/null || true ;;
  esac
  for p in "${holders[@]}"; do kill "$p" 2> /dev/null || true; done
}
# shellcheck disable=SC2317  # called by the EXIT trap
on_exit() {
  cleanup
  # let tee write the last lines of selftest.log before the caller reads it
  if [ -n "${tee_pid:-}" ]; then
    exec 1>&- 2>&-
    wait "$tee_pid" 2> /dev/null || true
  fi
}
trap on_exit EXIT
trap 'exit 130' INT TERM

netns_ip() {
  run ip netns add "${ns[0]}" && run ip netns add "${ns[1]}" &&
    run ip link add "$iface" netns "${ns[0]}" type veth peer name "$iface" netns "${ns[1]}" &&
    run ip -n "${ns[0]}" link set lo up && run ip -n "${ns[1]}" link set lo up &&
    run ip -n "${ns[0]}" addr add "$ip0/$prefix" dev "$iface" &&
    run ip -n "${ns[1]}" addr add "$ip1/$prefix" dev "$iface" &&
    run ip -n "${ns[0]}" link set "$iface" mtu "$mtu" up &&
    run ip -n "${ns[1]}" link set "$iface" mtu "$mtu" up
}

# A namespace held by a sleeping process (util-linux unshare); its /proc/PID/ns/net names it.
hold_ns() {
  local p
  if [ "$dry" = 1 ]; then
    show unshare --net sleep infinity
    return 0
  fi
  unshare --net sleep infinity < /dev/null > /dev/null 2>&1 &
  p=$!
  holders+=("$p")
  # unshare(1) execs sleep after unshare(2): wait until the process is in its own namespace
  for _ in $(seq 1 100); do
    [ "$(readlink "/proc/$p/ns/net" 2> /dev/null)" != "$(readlink /proc/self/ns/net)" ] && return 0
    kill -0 "$p" 2> /dev/null || return 1
    sleep 0.05
  done
  return 1
}
netns_unshare() {
  local h0 h1
  hold_ns && hold_ns || return 1
  h0="${holders[0]:-PID0}" h1="${holders[1]:-PID1}"
  run "$py" "$gpu/netlink.py" veth "$iface" "$h0" "$h1" &&
    run nsenter --net="/proc/$h0/ns/net" "$py" "$gpu/netlink.py" up lo &&
    run nsenter --net="/proc/$h1/ns/net" "$py" "$gpu/netlink.py" up lo &&
    run nsenter --net="/proc/$h0/ns/net" "$py" "$gpu/netlink.py" up "$iface" --mtu "$mtu" --addr "$ip0/$prefix" &&
    run nsenter --net="/proc/$h1/ns/net" "$py" "$gpu/netlink.py" up "$iface" --mtu "$mtu" --addr "$ip1/$prefix"
}

# ns_exec RANK CMD...: execs CMD in the rank's namespace (call it in a subshell), with /sys
# remounted there so that /sys/class/net lists that namespace's links (the plugin reads them), as
# `ip netns exec` does.
ns_exec() {
  local r="$1"
  shift
  case "$net_mode" in
    netns-ip) exec ip netns exec "${ns[$r]}" "$@" ;;
    netns-unshare)
      exec nsenter --net="/proc/${holders[$r]}/ns/net" unshare --mount --propagation slave \
        sh -c 'umount -l /sys 2>/dev/null; mount -t sysfs sysfs /sys && exec "$@"' sh "$@"
      ;;
    *) exec "$@" ;;
  esac
}
ns_show() { # RANK CMD...: how ns_exec runs it
  local r="$1"
  shift
  case "$net_mode" in
    netns-ip) show ip netns exec "${ns[$r]}" "$@" ;;
    netns-unshare) show nsenter --net="/proc/${holders[$r]:-PID$r}/ns/net" unshare --mount --propagation slave sh -c '<remount /sys; exec>' sh "$@" ;;
    *) show "$@" ;;
  esac
}

try_netns() { # tool
  local t="$1"
  case "$t" in
    ip) command -v ip > /dev/null || { net_reason+="no ip (iproute2); "; return 1; } ;;
    unshare)
      for x in unshare nsenter mount "$py"; do
        command -v "$x" > /dev/null || { net_reason+="no $x for the unshare path; "; return 1; }
      done
      ;;
  esac
  say "network: two namespaces joined by veth $iface ($ip0/$prefix - $ip1/$prefix, MTU $mtu), made with $t"
  if [ "$t" = ip ]; then
    net_mode=netns-ip
    netns_ip 2> "${out:-/tmp}/netns.$t.err" && return 0
  else
    net_mode=netns-unshare
    netns_unshare 2> "${out:-/tmp}/netns.$t.err" && return 0
  fi
  net_reason+="$t: $(tr '\n' ' ' < "${out:-/tmp}/netns.$t.err" | cut -c1-300); "
  cleanup
  holders=()
  net_mode=""
  return 1
}

if [ "$network" != same-host ]; then
  if [ "$dry" = 1 ]; then
    tool="$netns_tool"
    [ "$tool" != auto ] || { command -v ip > /dev/null && tool=ip || tool=unshare; }
    say "network: two namespaces joined by veth $iface ($ip0/$prefix - $ip1/$prefix, MTU $mtu), made with $tool (if that fails: --netns-tool unshare, then the same-host path over 127.0.0.1)"
    net_mode="netns-$tool"
    if [ "$tool" = ip ]; then netns_ip; else netns_unshare; fi
  else
    case "$netns_tool" in
      auto) try_netns ip || try_netns unshare || true ;;
      *) try_netns "$netns_tool" || true ;;
    esac
    if [ -z "$net_mode" ] && [ "$network" = netns ]; then
      die "--network netns: namespaces could not be created: $net_reason"
    fi
  fi
fi
# The kernel reports a new link's carrier asynchronously (linkwatch, up to a second): the plugin
# takes only links whose state is up, so wait for both ends.
wait_link_up() {
  local r state
  [ "$dry" = 0 ] || return 0
  for r in 0 1; do
    for _ in $(seq 1 100); do
      state=$( (ns_exec "$r" cat "/sys/class/net/$iface/operstate") 2> /dev/null || true)
      [ "$state" = up ] && break
      sleep 0.05
    done
    [ "$state" = up ] || say "network: $iface in rank $r's namespace is '$state', not up, after 5 s"
  done
}
if [ -n "$net_mode" ]; then
  wait_link_up
  boot0="$ip0"
  sock_if="$iface"
else
  net_mode=same-host
  [ "$network" = same-host ] && net_reason="asked for (--network same-host)"
  say "network: SAME-HOST FALLBACK: both ranks in this host's namespace over 127.0.0.1 (${net_reason:-namespaces unavailable})"
  say "network: this needs the plugin's same-host path (a peer advertising this host's own addresses); a build without it refuses the connection, reported below"
  boot0=127.0.0.1
  sock_if=lo
fi

# --- the environment of every rank --------------------------------------------------------------
rank_env=(
  "NCCL_NET_PLUGIN=$plugin"       # the built .so, by path (src/plugin/plugin_open.cc: dlopen(name) first)
  "NCCL_NET=switchless"           # only this network: NCCL fails instead of falling back to IB/Socket
  "NCCL_DEBUG=INFO"
  "NCCL_DEBUG_SUBSYS=INIT,NET"    # plugin load, ABI, channels, and the plugin's own NET lines
  "NCCL_SOCKET_IFNAME=$sock_if"   # NCCL's bootstrap: the veth (namespaces) or lo (same host)
  "NCCL_MNNVL_ENABLE=0"           # two ranks of one GPU must not be taken for one NVLink domain
  "NCCL_SWITCHLESS_TRANSPORT=$transport"
  "CUDA_VISIBLE_DEVICES=$device"
  "PYTHONUNBUFFERED=1"
)
[ -z "$lib_path" ] || rank_env+=("LD_LIBRARY_PATH=$lib_path")
# CUDA MPS: without it, two processes on one GPU time-slice it, and a kernel of one rank that waits
# for the network holds the GPU while the other rank's kernel, which would send the data, waits its turn.
if [ "$mps" = 1 ] && [ "$no_gpu" = 0 ]; then
  mps_dir="$out/mps"
  rank_env+=("CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe" "CUDA_MPS_LOG_DIRECTORY=$mps_dir/log")
  if [ "$dry" = 1 ]; then
    show env "CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe" "CUDA_MPS_LOG_DIRECTORY=$mps_dir/log" "CUDA_VISIBLE_DEVICES=$device" nvidia-cuda-mps-control -d
  else
    command -v nvidia-cuda-mps-control > /dev/null || die "--mps: no nvidia-cuda-mps-control on PATH"
    mkdir -p "$mps_dir/pipe" "$mps_dir/log"
    show env "CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe" "CUDA_MPS_LOG_DIRECTORY=$mps_dir/log" "CUDA_VISIBLE_DEVICES=$device" nvidia-cuda-mps-control -d
    if env "CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe" "CUDA_MPS_LOG_DIRECTORY=$mps_dir/log" "CUDA_VISIBLE_DEVICES=$device" nvidia-cuda-mps-control -d; then
      mps_on=1
      gpu_notes+=(--note "CUDA MPS=on")
    else
      die "--mps: nvidia-cuda-mps-control -d failed (see $mps_dir/log)"
    fi
  fi
fi
say "every rank gets (NCCL_HOSTID and NCCL_DEBUG_FILE differ per rank; see the commands):"
for kv in "${rank_env[@]}"; do echo "export $(printf '%q' "$kv")"; done

# start_rank RANK LOGFILE CMD...: in the background, bounded by --timeout; pid appended to $pids.
# The subshell execs (ip netns exec, nsenter, unshare and sh all exec too), so the pid is `timeout`'s,
# which passes a TERM on to the rank.
start_rank() {
  local r="$1" log="$2"
  shift 2
  ns_show "$r" timeout --kill-after=10 "$timeout_s" "$@"
  echo "    > $log"
  [ "$dry" = 1 ] && return 0
  (ns_exec "$r" timeout --kill-after=10 "$timeout_s" "$@") > "$log" 2>&1 &
  pids+=($!)
}
# Waits for the ranks started since the last call; sets rank_rc (0 when every rank exited 0). When
# one rank fails, the others get 20 s to finish (they usually fail too, with their own message),
# then are stopped: a rank waiting for a dead peer would otherwise sit until --timeout.
wait_ranks() {
  local p left failed_at=0 rc
  rank_rc=0
  [ "$dry" = 1 ] && return 0
  local -A done_
  while :; do
    left=0
    for p in "${pids[@]}"; do
      [ -z "${done_[$p]:-}" ] || continue
      if kill -0 "$p" 2> /dev/null; then
        left=$((left + 1))
        continue
      fi
      rc=0
      wait "$p" || rc=$?
      done_[$p]=1
      if [ "$rc" != 0 ]; then
        [ "$rank_rc" != 0 ] || rank_rc=$rc
        [ "$failed_at" != 0 ] || failed_at=$SECONDS
      fi
    done
    [ "$left" -gt 0 ] || break
    if [ "$failed_at" != 0 ] && [ $((SECONDS - failed_at)) -ge 20 ]; then
      say "a rank failed; stopping the $left still running"
      for p in "${pids[@]}"; do [ -n "${done_[$p]:-}" ] || kill "$p" 2> /dev/null || true; done
      failed_at=$((SECONDS + 1000000))
    fi
    sleep 0.2
  done
  pids=()
}

# --- plugin check without a GPU: `switchless bench` through the .so over the same path ------------------
veth_json="$out/veth.json"
bench_gbit=""
port=$((base_port + 1))
say "plugin check: switchless bench bandwidth, 2 ranks, through $plugin (the ncclNet ABI as NCCL's proxy drives it), data verified"
for r in 1 0; do
  start_rank "$r" "$out/bench.rank$r.log" env "${rank_env[@]}" "$cli" bench bandwidth --rank "$r" --nranks 2 \
    --bootstrap "$boot0:$port" --plugin "$plugin" --timeout 30 --no-progress -b 16 -e 16777216 -f 16 -n 20 -w 2 \
    --save-json "$out/bench.rank$r.json"
done
wait_ranks
if [ "$dry" = 0 ]; then
  if [ "$rank_rc" = 0 ]; then
    bench_gbit=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["rows"][-1]["algbw_gbits_s"])' "$out/bench.rank0.json")
    say "plugin check: OK, data verified; 16 MiB messages: $(printf %.2f "$bench_gbit") Gb/s"
    sed 's/^/    /' "$out/bench.rank0.log"
  else
    why=$(cat "$out"/bench.rank*.log | grep -i -m1 "error\|fail\|refus\|no local link\|point-to-point" | cut -c1-400 || true)
    if [ "$net_mode" = same-host ]; then
      blocked "same-host fallback: the plugin did not carry two ranks of one host over 127.0.0.1 (${why:-see $out/bench.rank0.log}); a build without a same-host path stops here"
    else
      fail "plugin check: switchless bench between the namespaces failed (exit $rank_rc): ${why:-see $out/bench.rank*.log}"
    fi
    tail -n 20 "$out"/bench.rank*.log | sed 's/^/    /'
  fi
fi

iperf_gbit=""
if command -v iperf3 > /dev/null && [ "$net_mode" != same-host ]; then
  port=$((port + 1))
  say "raw path: iperf3 -P 4 over $iface"
  start_rank 1 "$out/iperf3.server.log" iperf3 -s -1 -B "$ip1" -p "$port"
  if [ "$dry" = 0 ]; then sleep 1; fi
  ns_show 0 iperf3 -c "$ip1" -B "$ip0" -p "$port" -P 4 -t 3 -l 1M -J
  if [ "$dry" = 0 ]; then
    if (ns_exec 0 timeout 30 iperf3 -c "$ip1" -B "$ip0" -p "$port" -P 4 -t 3 -l 1M -J) > "$out/iperf3.json" 2> "$out/iperf3.err"; then
      iperf_gbit=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 1e9)' "$out/iperf3.json")
      say "raw path: iperf3 -P 4: $(printf %.2f "$iperf_gbit") Gb/s"
    else
      say "raw path: iperf3 failed: $(cut -c1-200 "$out/iperf3.err")"
    fi
    wait_ranks || true
  fi
fi
if [ "$dry" = 0 ]; then
  path_desc="veth $iface ($ip0/$prefix - $ip1/$prefix, MTU $mtu)"
  [ "$net_mode" != same-host ] || path_desc="127.0.0.1 (same host)"
  "$py" - "$veth_json" "$path_desc" "${bench_gbit:-}" "${iperf_gbit:-}" << 'PY'
import json, sys
path, desc, bench, iperf = sys.argv[1:5]
json.dump({"path": desc, "bench_gbit_s": float(bench) if bench else None, "bench_bytes": 16 << 20,
           "iperf3_gbit_s": float(iperf) if iperf else None, "iperf3_streams": 4}, open(path, "w"))
PY
fi

# --- the GPU parts ------------------------------------------------------------------------------------
logs=()
results=()
if [ "$no_gpu" = 1 ]; then
  say "GPU parts skipped (--no-gpu)"
else
  port=$((port + 1))
  if [[ ",$drivers," == *,torch,* ]]; then
    say "driver torch: selftest.py, torch.distributed backend nccl"
    run rm -f "$out/results.torch.jsonl"
    for r in 1 0; do
      start_rank "$r" "$out/torch.rank$r.out" env "${rank_env[@]}" "NCCL_HOSTID=switchless-selftest-host$r" \
        "NCCL_DEBUG_FILE=$out/nccl.torch.rank$r.%p.log" "$py" "$gpu/selftest.py" run --rank "$r" --nranks 2 \
        --master "$boot0:$port" --device 0 --results "$out/results.torch.jsonl" --collectives "$collectives" \
        --dtypes "$dtypes" --min-bytes "$min_bytes" --max-bytes "$max_bytes" --iters "$iters" --bytes-per-size "$bytes_per_size"
    done
    wait_ranks
    results+=("$out/results.torch.jsonl")
    if [ "$dry" = 0 ]; then
      cat "$out/torch.rank0.out"
      [ "$rank_rc" = 0 ] || { fail "driver torch exited with status $rank_rc"; tail -n 15 "$out/torch.rank1.out" | sed 's/^/    rank 1: /'; }
    fi
  fi
  if [[ ",$drivers," == *,c,* ]]; then
    say "driver c: nccl_selftest.cu against the nccl.h and libnccl.so.2 of PyTorch's NCCL wheel"
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    built=0
    run mkdir -p "$out/build"
    nccl_inc="<wheel include dir>" nccl_lib="<wheel lib dir>"
    if [ "$dry" = 0 ]; then
      if wheel=$("$py" "$gpu/ncclwheel.py" 2> "$out/build/ncclwheel.err"); then
        read -r nccl_inc nccl_lib wheel_name <<< "$wheel"
        say "driver c: NCCL from ${wheel_name:-?}: $nccl_inc, $nccl_lib"
      else
        nccl_inc=""
        fail "driver c: the NCCL wheel's nccl.h / libnccl.so.2 not found: $(cat "$out/build/ncclwheel.err")"
      fi
      [ -x "$nvcc" ] || { nccl_inc=""; fail "driver c: no nvcc (PATH or /usr/local/cuda/bin)"; }
    fi
    if [ -n "$nccl_inc" ]; then
      # the wheel has libnccl.so.2 but no libnccl.so for -lnccl: link through a symlink beside the binary
      run ln -sf "$nccl_lib/libnccl.so.2" "$out/build/libnccl.so"
      build=("$nvcc" -O2 -std=c++17 -I"$nccl_inc" -o "$out/build/nccl_selftest" "$gpu/nccl_selftest.cu"
        -L"$out/build" -lnccl -Xlinker -rpath -Xlinker "$nccl_lib")
      # for this GPU's architecture; without -arch (PTX, compiled by the driver at load) if that fails
      show "${build[@]}" -arch=native
      if [ "$dry" = 1 ]; then
        built=1
      elif "${build[@]}" -arch=native > "$out/build/nvcc.log" 2>&1; then
        built=1
      else
        show "${build[@]}"
        if "${build[@]}" >> "$out/build/nvcc.log" 2>&1; then built=1; else
          fail "driver c: nvcc failed: $(tail -n 5 "$out/build/nvcc.log" | tr '\n' ' ' | cut -c1-400)"
        fi
      fi
    fi
    if [ "$built" = 1 ]; then
      port=$((port + 1))
      run rm -f "$out/c.id" "$out/results.c.jsonl"
      for r in 1 0; do
        start_rank "$r" "$out/c.rank$r.out" env "${rank_env[@]}" "NCCL_HOSTID=switchless-selftest-host$r" \
          "NCCL_DEBUG_FILE=$out/nccl.c.rank$r.%p.log" "$out/build/nccl_selftest" --rank "$r" --nranks 2 \
          --id-file "$out/c.id" --device 0 --results "$out/results.c.jsonl" --collectives "$collectives" \
          --dtypes "$dtypes" --min-bytes "$min_bytes" --max-bytes "$max_bytes" --iters "$iters" --bytes-per-size "$bytes_per_size"
      done
      wait_ranks
      if [ "$dry" = 0 ]; then
        cat "$out/c.rank0.out"
        [ "$rank_rc" = 0 ] || { fail "driver c exited with status $rank_rc"; tail -n 15 "$out/c.rank1.out" | sed 's/^/    rank 1: /'; }
      fi
    fi
    results+=("$out/results.c.jsonl")
  fi
  if [ "$baseline" = socket ]; then
    if [ "$net_mode" = same-host ]; then
      say "baseline: skipped: NCCL's Socket transport between two ranks of one namespace is not the veth path"
    else
      # The same torch driver over NCCL's own TCP transport and the same veth: no plugin at all
      # (NCCL_NET_PLUGIN=none), so the ratio isolates the plugin from the GPU sharing and the host.
      say "baseline: torch driver over NCCL's own Socket transport (no plugin), same namespaces and veth"
      port=$((port + 1))
      run rm -f "$out/results.torch.socket.jsonl"
      for r in 1 0; do
        start_rank "$r" "$out/torch-socket.rank$r.out" env "${rank_env[@]}" "NCCL_NET_PLUGIN=none" "NCCL_NET=Socket" \
          "NCCL_HOSTID=switchless-selftest-host$r" "NCCL_DEBUG_FILE=$out/baseline.socket.rank$r.%p.log" \
          "$py" "$gpu/selftest.py" run --rank "$r" --nranks 2 --master "$boot0:$port" --device 0 \
          --results "$out/results.torch.socket.jsonl" --collectives "$collectives" --dtypes "$dtypes" \
          --min-bytes "$min_bytes" --max-bytes "$max_bytes" --iters "$iters" --bytes-per-size "$bytes_per_size"
      done
      wait_ranks
      baseline_file="$out/results.torch.socket.jsonl"
      if [ "$dry" = 0 ] && [ "$rank_rc" != 0 ]; then
        fail "baseline: the torch driver over NCCL's Socket transport exited with status $rank_rc"
        tail -n 15 "$out/torch-socket.rank1.out" | sed 's/^/    rank 1: /'
      fi
    fi
  fi
  if [ "$dry" = 0 ]; then
    shopt -s nullglob
    logs=("$out"/nccl.*.log)
    shopt -u nullglob
  else
    logs=("$out/nccl.<driver>.rank<r>.<pid>.log")
  fi
fi

# --- report ------------------------------------------------------------------------------------------
build_info="$(grep -h '^commit:' "$stage_dir/BUILD-INFO" 2> /dev/null | cut -d' ' -f2- || true)"
[ -n "$build_info" ] || build_info="$(git -C "$repo" rev-parse HEAD 2> /dev/null || echo unknown) (the working tree's HEAD)"
rep=("$py" "$gpu/selftest.py" report --nranks 2 --veth "$veth_json" --markdown "$out/report.md"
  --note "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)" --note "network=$net_mode${net_reason:+ ($net_reason)}"
  --note "plugin=$plugin" --note "plugin commit=$build_info" "${gpu_notes[@]}")
if [ "$no_gpu" = 1 ]; then
  [ "$dry" = 1 ] || cat "$veth_json"
  echo
else
  [ -z "${baseline_file:-}" ] || rep+=(--baseline "$baseline_file")
  rep+=(--collectives "$collectives" --dtypes "$dtypes" --drivers "$drivers" --min-bytes "$min_bytes" --max-bytes "$max_bytes" --results "${results[@]}" --logs "${logs[@]}")
  if [ "$dry" = 1 ]; then
    show "${rep[@]}"
  else
    show "${rep[@]}" | cut -c1-300
    "${rep[@]}" || { [ "$status" = 3 ] || status=1; }
  fi
fi
if [ "$dry" = 1 ]; then
  say "dry run: nothing was created"
  exit 0
fi
for p in "${problems[@]}"; do say "problem: $p"; done
case "$status" in
  0) say "result: PASS" ;;
  3) say "result: BLOCKED (exit 3)" ;;
  *) say "result: FAIL" ;;
esac
exit "$status"
