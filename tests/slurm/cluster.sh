# shellcheck shell=bash
# A real Slurm cluster (Debian's slurmctld, slurmd, munge) of network namespaces on this host, for
# tests/slurm/run.sh, which sources this file and calls swl_up / swl_down.
#
#   * one namespace per node (UTS name swl-nN, so slurmd finds its NodeName by host name, as on a real
#     node) with a management veth on a bridge (192.168.210.N/24) that Slurm and NCCL's bootstrap use;
#     the bridge lives in a hub namespace, which is also the login node (the user's srun/sbatch) and
#     runs slurmctld at 192.168.210.254 (UTS name swl-ctl);
#   * data cables: veth pairs, one /30 each (10.210.L.1 / .2, MTU 9000), like tests/netns/;
#   * one munged (its own key and socket under the work directory), one slurmctld, one slurmd per node;
#     every daemon, job step and task runs in our namespaces, so swl_down ends exactly those processes
#     (by PID, `ip netns pids`), deletes the namespaces and the work directory: nothing is left
#     (SWL_KEEP=1 keeps the work directory: logs, slurm.conf, the jobs' outputs).
#
# Plugins (why): ProctrackType=proctrack/linuxproc and TaskPlugin=task/none track and start tasks with
# plain fork/exec and /proc, with no cgroup of their own: the nodes share one kernel and one cgroup tree,
# and a CI machine need not run systemd or delegate a cgroup v2 subtree to us (proctrack/cgroup and
# task/cgroup need one of those). slurmd 22.05 still initializes its cgroup plugin at start, and
# autodetect fails in a namespace whose fresh sysfs has nothing under /sys/fs/cgroup, so cgroup.conf
# names cgroup/v1, which loads without touching any cgroup when no plugin uses it. The runbook's
# settings (docs/guide/slurm.md) are appended to slurm.conf from the page itself.

SWL_TAG="swl$$"
SWL_HUB="$SWL_TAG-hub"
SWL_CTL_ADDR=192.168.210.254
SWL_W=""
SWL_NODES=0
SWL_MUNGED=""
SWL_NAMESPACES=()
SWL_USER_MEMLOCK_KIB=64 # the login shell's soft memlock limit (KiB): what PropagateResourceLimits would copy

swl_log() { echo "slurm: $*"; }
swl_fail() {
  echo "slurm: FAIL: $*" >&2
  exit 1
}

# Whether process $1 runs (a zombie does not).
swl_alive() {
  local st
  st=$(cat "/proc/$1/stat" 2> /dev/null) || return 1
  st=${st##*) }
  [ "${st%% *}" != Z ]
}

swl_ns() { echo "$SWL_TAG-n$1"; }
swl_host() { echo "swl-n$1"; }
swl_addr() { echo "192.168.210.$1"; }

# swl_login CMD...: CMD as the user on the login node (the hub namespace, UTS name swl-login), with the
# cluster's configuration and the user's memlock soft limit; the caller's exported variables pass.
swl_login() {
  # shellcheck disable=SC2016 # expanded by the inner bash
  ip netns exec "$SWL_HUB" unshare --uts env SLURM_CONF="$SWL_W/etc/slurm.conf" bash -c \
    'hostname swl-login && ulimit -S -l "$0" && exec "$@"' "$SWL_USER_MEMLOCK_KIB" "$@"
}

# swl_job_wait JOB SECONDS: waits for a batch job to end (polling; sbatch --wait polls every few
# seconds), prints "STATE EXITCODE" (e.g. "COMPLETED 0:0"); "TIMEOUT" if it has not ended in time.
swl_job_wait() {
  local i info
  for i in $(seq 1 $(($2 * 10))); do
    info=$(swl_login scontrol -o show job "$1" 2> /dev/null || true)
    case "$info" in
      *JobState=PENDING* | *JobState=RUNNING* | *JobState=CONFIGURING* | *JobState=COMPLETING* | "") ;;
      *)
        echo "$(tr ' ' '\n' <<< "$info" | sed -n 's/^JobState=//p') $(tr ' ' '\n' <<< "$info" | sed -n 's/^ExitCode=//p')"
        return 0
        ;;
    esac
    sleep 0.1
  done
  echo TIMEOUT
}

# The lines of the fenced block that follows the marker comment `<!-- checked: tests/slurm NAME -->` in
# the Slurm runbook, comments and blank lines dropped.
swl_runbook_block() {
  awk -v m="<!-- checked: tests/slurm $1 -->" '
    index($0, m) { armed = 1; next }
    armed && /^```/ { if (inside) exit; inside = 1; next }
    inside && !/^[[:space:]]*(#|$)/ { print }
  ' docs/guide/slurm.md
}

# slurmd's RLIMIT_MEMLOCK as the runbook's unit sets it (LimitMEMLOCK=infinity): unlimited where this
# shell may raise its hard limit; else (no CAP_SYS_RESOURCE, e.g. inside a container) the hard limit,
# which the test then reports. Prints the `ulimit -l` value slurmd is started with.
swl_slurmd_memlock() {
  local want
  want=$(swl_runbook_block slurmd.service | sed -n 's/^LimitMEMLOCK=//p')
  [ "$want" = infinity ] || swl_fail "docs/guide/slurm.md: the slurmd.service block sets no LimitMEMLOCK=infinity (got '$want')"
  if (ulimit -l unlimited) 2> /dev/null; then
    echo unlimited
  else
    ulimit -H -l
  fi
}

swl_network() {
  local n l=0 a b
  ip netns add "$SWL_HUB"
  SWL_NAMESPACES+=("$SWL_HUB")
  ip -n "$SWL_HUB" link set lo up
  ip -n "$SWL_HUB" link add br0 type bridge
  ip -n "$SWL_HUB" link set br0 up
  ip -n "$SWL_HUB" addr add "$SWL_CTL_ADDR/24" dev br0
  for n in $(seq 1 "$SWL_NODES"); do
    ip netns add "$(swl_ns "$n")"
    SWL_NAMESPACES+=("$(swl_ns "$n")")
    ip -n "$(swl_ns "$n")" link set lo up
    ip link add "$SWL_TAG-g$n" type veth peer name "$SWL_TAG-h$n"
    ip link set "$SWL_TAG-g$n" netns "$(swl_ns "$n")"
    ip link set "$SWL_TAG-h$n" netns "$SWL_HUB"
    ip -n "$(swl_ns "$n")" link set "$SWL_TAG-g$n" name mgmt
    ip -n "$(swl_ns "$n")" link set mgmt up
    ip -n "$(swl_ns "$n")" addr add "$(swl_addr "$n")/24" dev mgmt
    ip -n "$SWL_HUB" link set "$SWL_TAG-h$n" master br0 up
  done
  # Cables "A-B": node A's netdev toB (10.210.L.1/30) to node B's toA (10.210.L.2/30).
  for c in "$@"; do
    a=${c%-*} b=${c#*-} l=$((l + 1))
    ip link add "$SWL_TAG-c$l-a" type veth peer name "$SWL_TAG-c$l-b"
    ip link set "$SWL_TAG-c$l-a" netns "$(swl_ns "$a")"
    ip link set "$SWL_TAG-c$l-b" netns "$(swl_ns "$b")"
    ip -n "$(swl_ns "$a")" link set "$SWL_TAG-c$l-a" name "to$b"
    ip -n "$(swl_ns "$b")" link set "$SWL_TAG-c$l-b" name "to$a"
    ip -n "$(swl_ns "$a")" link set "to$b" mtu 9000 up
    ip -n "$(swl_ns "$b")" link set "to$a" mtu 9000 up
    ip -n "$(swl_ns "$a")" addr add "10.210.$l.1/30" dev "to$b"
    ip -n "$(swl_ns "$b")" addr add "10.210.$l.2/30" dev "to$a"
  done
}

swl_munge() {
  # munged checks its directories: the key's private, the socket's searchable by everyone.
  mkdir -p "$SWL_W/munge-key" "$SWL_W/munge"
  chmod 700 "$SWL_W/munge-key"
  chmod 755 "$SWL_W" "$SWL_W/munge"
  mungekey --create --bits 1024 --keyfile "$SWL_W/munge-key/munge.key"
  munged --foreground --socket="$SWL_W/munge/socket" --key-file="$SWL_W/munge-key/munge.key" \
    --log-file="$SWL_W/munge/munged.log" --pid-file="$SWL_W/munge/munged.pid" \
    --seed-file="$SWL_W/munge/munged.seed" > "$SWL_W/munge/munged.out" 2>&1 &
  SWL_MUNGED=$!
  local i
  for i in $(seq 1 50); do
    [ -S "$SWL_W/munge/socket" ] && return 0
    kill -0 "$SWL_MUNGED" 2> /dev/null || break
    sleep 0.1
  done
  cat "$SWL_W/munge/munged.out" >&2
  swl_fail "munged did not start"
}

swl_conf() {
  local n runbook
  mkdir -p "$SWL_W/etc" "$SWL_W/state" "$SWL_W/log"
  for n in $(seq 1 "$SWL_NODES"); do
    mkdir -p "$SWL_W/spool/$(swl_host "$n")" "$SWL_W/tmp/$(swl_host "$n")"
  done
  runbook=$(swl_runbook_block slurm.conf)
  [ -n "$runbook" ] || swl_fail "docs/guide/slurm.md has no slurm.conf block marked for tests/slurm"
  {
    cat << EOF
# Generated by tests/slurm/cluster.sh: a cluster of network namespaces on one host.
ClusterName=swl
SlurmctldHost=swl-ctl($SWL_CTL_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$SWL_W/munge/socket
CredType=cred/munge
StateSaveLocation=$SWL_W/state
SlurmctldPidFile=$SWL_W/state/slurmctld.pid
SlurmctldLogFile=$SWL_W/log/slurmctld.log
# One host, several slurmd: every per-node path carries the node's name (%n).
SlurmdSpoolDir=$SWL_W/spool/%n
SlurmdPidFile=$SWL_W/spool/%n/slurmd.pid
SlurmdLogFile=$SWL_W/log/slurmd.%n.log
# mpi/pmix's per-step directories go under TmpFS: per node here, or the nodes' steps collide.
TmpFS=$SWL_W/tmp/%n
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout=30
MessageTimeout=10
InactiveLimit=0
KillWait=5
GresTypes=gpu
# From docs/guide/slurm.md (the settings that matter for switchless):
$runbook
EOF
    for n in $(seq 1 "$SWL_NODES"); do
      echo "NodeName=$(swl_host "$n") NodeAddr=$(swl_addr "$n") CPUs=1 RealMemory=100 Gres=gpu:1 State=UNKNOWN"
    done
    echo "PartitionName=swl Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
  } > "$SWL_W/etc/slurm.conf"
  # gres/gpu drops a GPU without a device file; /dev/null stands for the one each node "has" (the
  # launchers ask for --gpus-per-node; nothing here uses a GPU).
  printf 'AutoDetect=off\nNodeName=swl-n[1-%s] Name=gpu File=/dev/null\n' "$SWL_NODES" > "$SWL_W/etc/gres.conf"
  {
    echo "CgroupPlugin=cgroup/v1"
    echo "CgroupAutomount=no"
    # Slurm < 21.08 read the devices a job may open from this file (/dev/infiniband/* had to be in
    # it); 22.05 ignores it with a warning, which run.sh checks (docs/guide/slurm.md says so).
    echo "AllowedDevicesFile=$SWL_W/etc/cgroup_allowed_devices_file.conf"
  } > "$SWL_W/etc/cgroup.conf"
  printf '/dev/infiniband/*\n' > "$SWL_W/etc/cgroup_allowed_devices_file.conf"
}

# swl_up N CABLE...: the cluster with N nodes and the given cables ("1-2" ...), every node idle.
swl_up() {
  local n i state memlock
  SWL_NODES="$1"
  shift
  SWL_W=$(mktemp -d /tmp/swl-slurm.XXXXXX)
  swl_network "$@"
  swl_munge
  swl_conf
  # shellcheck disable=SC2016 # expanded by the inner sh
  ip netns exec "$SWL_HUB" unshare --uts sh -c 'hostname swl-ctl && exec slurmctld -D -f "$0"' \
    "$SWL_W/etc/slurm.conf" > "$SWL_W/log/slurmctld.out" 2>&1 &
  memlock=$(swl_slurmd_memlock)
  for n in $(seq 1 "$SWL_NODES"); do
    # shellcheck disable=SC2016 # expanded by the inner sh
    ip netns exec "$(swl_ns "$n")" unshare --uts sh -c \
      'hostname "$0" && ulimit -l "$1" && exec slurmd -D -f "$2"' "$(swl_host "$n")" "$memlock" \
      "$SWL_W/etc/slurm.conf" > "$SWL_W/log/slurmd$n.out" 2>&1 &
  done
  for i in $(seq 1 100); do
    state=$(swl_login sinfo -h -N -o '%N %T' 2> /dev/null | sort -u || true)
    if [ "$(grep -c ' idle$' <<< "$state")" = "$SWL_NODES" ]; then
      swl_log "cluster up: $SWL_NODES nodes idle after $((i / 10)).$((i % 10)) s (cables: $*; slurmd memlock: $memlock)"
      return 0
    fi
    sleep 0.1
  done
  echo "$state" >&2
  tail -n 20 "$SWL_W"/log/*.out "$SWL_W"/log/*.log >&2 || true
  swl_fail "the nodes did not all become idle within 10 s"
}

# Ends every process in our namespaces (daemons, job steps, tasks) and munged, by PID; removes the
# namespaces and the work directory.
swl_down() {
  local ns pids=() p i
  for ns in "${SWL_NAMESPACES[@]}"; do
    mapfile -t -O "${#pids[@]}" pids < <(ip netns pids "$ns" 2> /dev/null)
  done
  [ -z "$SWL_MUNGED" ] || pids+=("$SWL_MUNGED")
  for p in "${pids[@]}"; do kill -TERM "$p" 2> /dev/null || true; done
  for i in $(seq 1 50); do
    local alive=0
    for p in "${pids[@]}"; do swl_alive "$p" && alive=1; done
    [ "$alive" = 1 ] || break
    sleep 0.1
  done
  for p in "${pids[@]}"; do
    if swl_alive "$p"; then
      echo "slurm: $p ($(tr '\0' ' ' < "/proc/$p/cmdline" 2> /dev/null | cut -c1-80)) ignored SIGTERM for 5 s: SIGKILL" >&2
      kill -KILL "$p" 2> /dev/null || true
    fi
    wait "$p" 2> /dev/null || true # reaps the daemons this shell started
  done
  for ns in "${SWL_NAMESPACES[@]}"; do ip netns del "$ns" 2> /dev/null || true; done
  SWL_NAMESPACES=()
  if [ -n "$SWL_W" ] && [ "${SWL_KEEP:-0}" = 1 ]; then
    echo "slurm: SWL_KEEP=1: logs, configuration and outputs kept in $SWL_W" >&2
  elif [ -n "$SWL_W" ]; then
    rm -rf "$SWL_W"
  fi
}
