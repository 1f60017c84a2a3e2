# shellcheck shell=bash disable=SC2034  # the SL_* variables are used by the scripts that source this
# Shared by srun-nccl-tests.sh and mpirun-nccl-tests.sh: common options, the environment every rank
# gets, and the summary. Source it; it defines sl_* functions and SL_* variables.

SL_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SL_ALL_TESTS="all_reduce all_gather reduce_scatter alltoall sendrecv broadcast"

# Defaults (the seed's B300 run: -b 512M -e 16G -f 2 -g 8 -n 20).
SL_NODES=2
SL_GPUS=8
SL_TESTS="all_reduce"
SL_MIN=512M
SL_MAX=16G
SL_FACTOR=2
SL_ITERS=20
SL_BOOT_IF="${NCCL_SOCKET_IFNAME:-}"
SL_OUT=""
SL_DEBUG=1 # 0: NCCL_DEBUG=WARN; 1: INFO for INIT,NET (route log); 2: --debug
SL_EXPECT=""
SL_STRICT=0
SL_DRY=0
SL_PREFLIGHT=1
SL_PREFLIGHT_ARGS=()
SL_NCCL_TESTS_DIR="/opt/nccl-tests/build"
SL_BENCH_CMD=""
SL_CHECKED_NODES=""
SL_PLUGIN_DIR=""
SL_ORDER="given"
SL_ORDERED=""
SL_ENV=()
SL_TEST_ARGS=()
SL_REST=()

sl_common_usage() {
  cat << 'EOF'
Common options:
  -N, --nodes N            nodes (default 2)
  -g, --gpus-per-node G    GPUs per node, one process per node drives them all (default 8, a B300;
                           GB10 and workstations: -g 1, and sizes such as -b 1M -e 8G)
  -t, --tests LIST         comma-separated: all_reduce,all_gather,reduce_scatter,alltoall,sendrecv,
                           broadcast, or "all" (default all_reduce)
  -b, --min-bytes SIZE     smallest message (default 512M)
  -e, --max-bytes SIZE     largest message (default 16G)
  -f, --factor F           size step factor (default 2)
  -n, --iters N            timed iterations per size (default 20)
  -i, --bootstrap-if IF    NCCL_SOCKET_IFNAME for NCCL's TCP bootstrap (default: $NCCL_SOCKET_IFNAME, else
                           each node's default-route interface); must reach every node
  -o, --out DIR            output directory (default ./nccl-tests-<job or time>); must be on a file system
                           every node sees, or NCCL's per-process logs stay on each node
      --nccl-tests-dir D   directory of the *_perf binaries (default /opt/nccl-tests/build)
      --bench-cmd CMD      run CMD TEST ARGS... on every rank instead of DIR/TEST_perf ARGS... (TEST:
                           all_reduce, ...; ARGS: the nccl-tests arguments), e.g. a wrapper that starts a
                           profiler; one word, a path or a name on the nodes' PATH (inside the container)
      --plugin-dir DIR     install prefix of the plugin (DIR/lib/libnccl-net-switchless.so), e.g. the
                           PREFIX of `make install`; default: the plugin is already installed
      --expect-busbw BW    fail when busbw at the largest size is below BW (787, 787GB/s or 6300Gb/s)
      --strict             NCCL_NET=switchless: fail instead of falling back to NCCL's IB transport
      --debug              more NCCL logging (INIT,NET,GRAPH,ENV,TUNING) in the per-process logs
      --quiet              NCCL_DEBUG=WARN (no per-connection route log, plugin use not verifiable)
      --order MODE         rank order of the hosts: given (default), auto (capture every node with
                           fleet-doctor.sh into DIR/fleet and take `switchless doctor --fleet --order`;
                           the nodes' CLI: $SWITCHLESS_NODE_BIN, --plugin-dir's, or their PATH's),
                           or a comma-separated host list. NCCL's ring sends host n's bytes to host n+1
                           in rank order, so on an unequal mesh or a ring of cables the order decides
                           its busbw (docs/guide/tuner.md)
      --env VAR=VALUE      extra environment for every rank (repeatable); every NCCL_* variable of
                           this shell reaches every rank too (mpirun: -x; srun: --export=ALL)
      --no-preflight       skip the preflight (below)
      --preflight-arg ARG  argument for the preflight's `switchless doctor` (repeatable), e.g.
                           --preflight-arg=--plan=plan.json (checks each node against the plan; the
                           plan is copied into DIR, which every node and container sees)
      --dry-run            print the exported variables and the exact commands (pasteable), run and
                           create nothing
  -h, --help               this help
  -- ARGS                  extra arguments for the nccl-tests binaries (e.g. -- -d bfloat16 -c 0)

Before the benchmark every node runs, in the same srun/container and environment,
`rank.sh --preflight`: the plugin library resolves, /dev/infiniband is visible where sysfs lists RDMA
devices, and `switchless doctor` (memlock, MTU, links; planned peers with --plan) reports no error;
every node's plugin and libnccl.so.2 have the same SHA-256 as most nodes'. A failure stops the run
before any benchmark, naming the node.

Exit status: 0 every test passed; 1 a test failed (or its summary: wrong results, plugin not used,
busbw below --expect-busbw); 2 bad options, or the preflight failed on a node.
EOF
}

sl_die() {
  echo "$(basename "$0"): $*" >&2
  exit 2
}

# Parses one common option. Sets SL_SHIFT to the number of words used, 0 if the option is not common.
sl_parse_common() {
  SL_SHIFT=2
  local opt="$1" val="${2-}"
  case "$opt" in
    -N | --nodes) SL_NODES="$val" ;;
    -g | --gpus-per-node) SL_GPUS="$val" ;;
    -t | --tests) SL_TESTS="$val" ;;
    -b | --min-bytes) SL_MIN="$val" ;;
    -e | --max-bytes) SL_MAX="$val" ;;
    -f | --factor) SL_FACTOR="$val" ;;
    -n | --iters) SL_ITERS="$val" ;;
    -i | --bootstrap-if) SL_BOOT_IF="$val" ;;
    -o | --out) SL_OUT="$val" ;;
    --nccl-tests-dir) SL_NCCL_TESTS_DIR="$val" ;;
    --bench-cmd)
      [ -n "$val" ] || sl_die "--bench-cmd needs a command (a path or a name on the nodes' PATH)"
      SL_BENCH_CMD="$val"
      ;;
    --plugin-dir) SL_PLUGIN_DIR="$val" ;;
    --expect-busbw) SL_EXPECT="$val" ;;
    --env)
      case "$val" in
        [A-Za-z_]*=*) SL_ENV+=("$val") ;;
        *) sl_die "--env takes VAR=VALUE, got '$val'" ;;
      esac
      ;;
    --strict) SL_STRICT=1 SL_SHIFT=1 ;;
    --debug) SL_DEBUG=2 SL_SHIFT=1 ;;
    --quiet) SL_DEBUG=0 SL_SHIFT=1 ;;
    --dry-run) SL_DRY=1 SL_SHIFT=1 ;;
    --no-preflight) SL_PREFLIGHT=0 SL_SHIFT=1 ;;
    --preflight-arg) SL_PREFLIGHT_ARGS+=("$val") ;;
    --order) SL_ORDER="$val" ;;
    --)
      SL_SHIFT=1
      return 0
      ;;
    *) SL_SHIFT=0 ;;
  esac
  if [ "$SL_SHIFT" = 2 ] && [ $# -lt 2 ]; then
    sl_die "option $opt needs a value"
  fi
}

sl_validate() {
  local t
  [[ "$SL_NODES" =~ ^[1-9][0-9]*$ ]] || sl_die "--nodes must be a positive whole number, got '$SL_NODES'"
  [[ "$SL_GPUS" =~ ^[1-9][0-9]*$ ]] || sl_die "--gpus-per-node must be a positive whole number, got '$SL_GPUS'"
  [[ "$SL_ITERS" =~ ^[1-9][0-9]*$ ]] || sl_die "--iters must be a positive whole number, got '$SL_ITERS'"
  [[ "$SL_FACTOR" =~ ^[1-9][0-9]*$ ]] || sl_die "--factor must be a positive whole number, got '$SL_FACTOR'"
  for t in "$SL_MIN" "$SL_MAX"; do
    [[ "$t" =~ ^[0-9]+[KMGkmg]?$ ]] || sl_die "message sizes look like 8, 64K, 512M or 16G; got '$t'"
  done
  if [ "$SL_TESTS" = all ]; then
    SL_TESTS="$SL_ALL_TESTS"
  else
    SL_TESTS="${SL_TESTS//,/ }"
    for t in $SL_TESTS; do
      case " $SL_ALL_TESTS " in
        *" $t "*) ;;
        *) sl_die "unknown test '$t' (accepted: ${SL_ALL_TESTS// /, }, all)" ;;
      esac
    done
  fi
  if [ -z "$SL_OUT" ]; then
    SL_OUT="$PWD/nccl-tests-${SLURM_JOB_ID:-$(date +%Y%m%d-%H%M%S)}"
  fi
  case "$SL_OUT" in
    /*) ;;
    *) SL_OUT="$PWD/$SL_OUT" ;;
  esac
  # A dry run rehearses on an admin box, which need not hold the plugin: it says so and goes on; a real
  # run stops here.
  if [ -n "$SL_PLUGIN_DIR" ] && [ ! -e "$SL_PLUGIN_DIR/lib/libnccl-net-switchless.so" ]; then
    if [ "$SL_DRY" = 1 ]; then
      echo "# note: --plugin-dir $SL_PLUGIN_DIR has no lib/libnccl-net-switchless.so here; the run itself stops on it (make install PREFIX=$SL_PLUGIN_DIR)"
    else
      sl_die "--plugin-dir $SL_PLUGIN_DIR has no lib/libnccl-net-switchless.so (run: make install PREFIX=$SL_PLUGIN_DIR)"
    fi
  fi
}

# Creates the output directory, except in a dry run (which creates nothing).
sl_make_out() {
  [ "$SL_DRY" = 1 ] || mkdir -p "$SL_OUT"
}

# The environment every rank gets, as VAR=VALUE words in SL_RANK_ENV.
sl_rank_env() {
  SL_RANK_ENV=(
    "NCCL_NET_PLUGIN=${NCCL_NET_PLUGIN:-switchless}"
    "SWITCHLESS_LOG_DIR=$SL_OUT"
    "CUDA_DEVICE_ORDER=PCI_BUS_ID"
  )
  if [ -n "$SL_BOOT_IF" ]; then
    SL_RANK_ENV+=("NCCL_SOCKET_IFNAME=$SL_BOOT_IF")
  fi
  case "$SL_DEBUG" in
    0) SL_RANK_ENV+=("NCCL_DEBUG=WARN") ;;
    1) SL_RANK_ENV+=("NCCL_DEBUG=INFO" "NCCL_DEBUG_SUBSYS=INIT,NET") ;;
    2) SL_RANK_ENV+=("NCCL_DEBUG=INFO" "NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH,ENV,TUNING") ;;
  esac
  if [ "$SL_STRICT" = 1 ]; then
    SL_RANK_ENV+=("NCCL_NET=${NCCL_NET_PLUGIN:-switchless}")
  fi
  SL_RANK_ENV+=("${SL_ENV[@]}")
}

# The caller's NCCL_* variables (NCCL_SWITCHLESS_* among them) that the launcher does not set itself,
# as VAR=VALUE words in SL_CALLER_ENV: every rank gets them, as srun --export=ALL gives them (mpirun
# forwards them with -x; the dry runs print them).
sl_caller_env() {
  local name kv set
  SL_CALLER_ENV=()
  for name in $(compgen -e | LC_ALL=C sort); do
    [[ "$name" == NCCL_* ]] || continue
    set=0
    for kv in "${SL_RANK_ENV[@]}"; do
      [ "${kv%%=*}" = "$name" ] && set=1
    done
    [ "$set" = 1 ] || SL_CALLER_ENV+=("$name=${!name}")
  done
}

# Files the preflight's `switchless doctor` reads (--plan): each is copied into the output directory,
# which every node (and container) sees at the same path, and its argument rewritten to the copy; a
# dry run prints the copy. Sets SL_STAGE (SRC DST pairs).
sl_stage_preflight_files() {
  local i a src next=0 args=()
  SL_STAGE=()
  for ((i = 0; i < ${#SL_PREFLIGHT_ARGS[@]}; i++)); do
    a="${SL_PREFLIGHT_ARGS[$i]}"
    if [ "$next" = 1 ]; then
      src="$a"
      a=""
    elif [[ "$a" == --plan=* ]]; then
      src="${a#--plan=}"
      a="--plan="
    else
      [ "$a" = --plan ] && next=1
      args+=("$a")
      continue
    fi
    next=0
    case "$src" in
      /*) ;;
      *) src="$PWD/$src" ;;
    esac
    if [ ! -r "$src" ]; then
      if [ "$SL_DRY" = 1 ]; then
        echo "# note: the plan $src is not readable here; the run itself stops on it"
      else
        sl_die "--preflight-arg --plan: cannot read $src (the preflight copies it into $SL_OUT for every node)"
      fi
    fi
    SL_STAGE+=("$src" "$SL_OUT/preflight-$(basename "$src")")
    args+=("$a$SL_OUT/preflight-$(basename "$src")")
  done
  SL_PREFLIGHT_ARGS=("${args[@]}")
}

# Copies the staged files (sl_stage_preflight_files) into the output directory; a dry run prints it.
sl_copy_staged() {
  local i
  for ((i = 0; i + 1 < ${#SL_STAGE[@]}; i += 2)); do
    if [ "$SL_DRY" = 1 ]; then
      sl_show cp -- "${SL_STAGE[$i]}" "${SL_STAGE[$((i + 1))]}"
    else
      cp -- "${SL_STAGE[$i]}" "${SL_STAGE[$((i + 1))]}"
    fi
  done
}

# nccl-tests arguments for one test.
sl_test_args() {
  SL_TEST_ARGS=(-b "$SL_MIN" -e "$SL_MAX" -f "$SL_FACTOR" -g "$SL_GPUS" -n "$SL_ITERS" "${SL_REST[@]}")
}

# The benchmark words for one test in SL_BENCH: DIR/TEST_perf ARGS..., or with --bench-cmd CMD TEST ARGS...
sl_bench() {
  sl_test_args
  if [ -n "$SL_BENCH_CMD" ]; then
    SL_BENCH=("$SL_BENCH_CMD" "$1" "${SL_TEST_ARGS[@]}")
  else
    SL_BENCH=("$SL_NCCL_TESTS_DIR/${1}_perf" "${SL_TEST_ARGS[@]}")
  fi
}

# Stands for the rank script in a command; sl_run passes its text, sl_show prints how to get it.
SL_RANK_WORD="@rank.sh@"

# Prints a command, quoted so it can be pasted into bash: the rank script as "$(cat PATH)".
sl_show() {
  local w out=""
  for w in "$@"; do
    if [ "$w" = "$SL_RANK_WORD" ]; then
      out+="\"\$(cat $(printf '%q' "$SL_DIR/rank.sh"))\" "
    else
      out+="$(printf '%q' "$w") "
    fi
  done
  echo "${out% }"
}

# Prints `export VAR=VALUE` for each word, quoted so it can be pasted.
sl_show_exports() {
  local kv
  for kv in "$@"; do
    echo "export ${kv%%=*}=$(printf '%q' "${kv#*=}")"
  done
}

# Runs a command given with SL_RANK_WORD, which becomes the rank script's text.
sl_run() {
  local w args=() script
  script=$(cat "$SL_DIR/rank.sh")
  for w in "$@"; do
    if [ "$w" = "$SL_RANK_WORD" ]; then args+=("$script"); else args+=("$w"); fi
  done
  "${args[@]}"
}

# Runs the preflight command (a launcher's srun/mpirun words ending in `bash -c SL_RANK_WORD rank.sh
# --preflight ...`) unless disabled; in a dry run prints it. Stops (exit 2) naming each failing node.
sl_preflight() {
  [ "$SL_PREFLIGHT" = 1 ] || return 0
  if [ "$SL_DRY" = 1 ]; then
    echo "# preflight on every node (stops before the benchmark, naming a failing node):"
    sl_show "$@"
    return 0
  fi
  local out rc=0 failed
  echo "== preflight"
  out=$(sl_run "$@" 2>&1) || rc=$?
  printf '%s\n' "$out" | tee "$SL_OUT/preflight.out"
  failed=$(grep -E 'switchless preflight: node=[^ ]+ FAIL' <<< "$out" | sed -E 's/.*switchless preflight: node=([^ ]+) FAIL: /\1: /' || true)
  if [ -n "$failed" ]; then
    echo "$(basename "$0"): preflight failed, no benchmark run:" >&2
    printf '%s\n' "$failed" | sort -u | sed 's/^/  /' >&2
    exit 2
  fi
  if [ "$rc" != 0 ]; then
    sl_die "preflight: the launcher exited with status $rc before every node reported (see $SL_OUT/preflight.out)"
  fi
  sl_attest_check "$out"
  # The nodes that passed, comma-separated (Slurm node names under srun: SLURMD_NODENAME).
  SL_CHECKED_NODES=$(grep -oE 'switchless preflight: node=[^ ]+ ok$' <<< "$out" | sed -E 's/.*node=([^ ]+) ok$/\1/' | sort -u | paste -sd, -)
}

# Compares the preflight's attest lines across nodes: a node whose plugin or libnccl differs (by
# SHA-256) from what most nodes have stops the run (exit 2), naming the node and both hashes.
sl_attest_check() {
  local lines bad
  lines=$(grep -oE 'switchless preflight: node=[^ ]+ attest plugin=[^ ]+ sha256=[^ ]+ nccl=[^ ]+ sha256=[^ ]+' <<< "$1" |
    sed -E 's/.*node=([^ ]+) attest plugin=([^ ]+) sha256=([^ ]+) nccl=([^ ]+) sha256=([^ ]+)/\1 \3 \5 \2 \4/' | sort -u || true)
  [ -n "$lines" ] || return 0
  bad=$(awk '
    { node[NR] = $1; p[NR] = $2; n[NR] = $3; pp[NR] = $4; np[NR] = $5; cp[$2]++; cn[$3]++ }
    END {
      for (k in cp) if (!sp || cp[k] > cp[mp] || (cp[k] == cp[mp] && k < mp)) { mp = k; sp = 1 }
      for (k in cn) if (!sn || cn[k] > cn[mn] || (cn[k] == cn[mn] && k < mn)) { mn = k; sn = 1 }
      for (i = 1; i <= NR; i++) {
        if (p[i] != mp) printf "%s: plugin %s has sha256 %s, %d of %d node(s) have %s\n", node[i], pp[i], p[i], cp[mp], NR, mp
        if (n[i] != mn) printf "%s: libnccl %s has sha256 %s, %d of %d node(s) have %s\n", node[i], np[i], n[i], cn[mn], NR, mn
      }
    }' <<< "$lines")
  if [ -n "$bad" ]; then
    echo "$(basename "$0"): preflight: the nodes do not run the same plugin and NCCL, no benchmark run:" >&2
    printf '%s\n' "$bad" | sed 's/^/  /' >&2
    exit 2
  fi
}

sl_find_cli() {
  if [ -n "${SWITCHLESS_BIN:-}" ]; then
    echo "$SWITCHLESS_BIN"
  elif [ -n "$SL_PLUGIN_DIR" ] && [ -x "$SL_PLUGIN_DIR/bin/switchless" ]; then
    echo "$SL_PLUGIN_DIR/bin/switchless"
  elif command -v switchless > /dev/null 2>&1; then
    command -v switchless
  fi
}

# The summary command of one test, as a dry run shows it (the NCCL logs as a glob).
sl_show_summarize() {
  local test="$1" args=()
  [ "$SL_DEBUG" -ge 1 ] && args+=(--require-plugin)
  [ -z "$SL_EXPECT" ] || args+=(--expect-busbw "$SL_EXPECT")
  echo "$(sl_show switchless nccl-tests summarize "$SL_OUT/$test.out") $(printf '%q' "$SL_OUT")/nccl.$test.*.log${args[*]:+ $(sl_show "${args[@]}")}"
}

# Summarizes one test's output (stdout file + NCCL logs). Returns the summary's status.
sl_summarize() {
  local test="$1" cli args logs
  args=("$SL_OUT/$test.out")
  shopt -s nullglob
  logs=("$SL_OUT"/nccl."$test".*.log)
  shopt -u nullglob
  args+=("${logs[@]}")
  if [ "$SL_DEBUG" -ge 1 ]; then
    args+=(--require-plugin)
  fi
  if [ -n "$SL_EXPECT" ]; then
    args+=(--expect-busbw "$SL_EXPECT")
  fi
  cli=$(sl_find_cli)
  if [ -z "$cli" ]; then
    echo "switchless CLI not found (set SWITCHLESS_BIN); summarize later with:"
    sl_show switchless nccl-tests summarize "${args[@]}"
    return 0
  fi
  "$cli" nccl-tests summarize "${args[@]}" | tee "$SL_OUT/$test.summary.txt"
  return "${PIPESTATUS[0]}"
}

# Resolves --order for the hosts in $1 (comma-separated; empty: the nodes of the Slurm allocation) into
# SL_ORDERED, the hosts in rank order, comma-separated; empty keeps the launcher's order. `auto` runs
# fleet-doctor.sh (a capture on every node) and `switchless doctor --fleet --order` here; a dry run prints
# that command and keeps the given order. A list must name each host once (with $1: exactly its hosts).
sl_order() {
  local hosts="$1" cli out h n=0
  local fd=("$SL_DIR/fleet-doctor.sh" -o "$SL_OUT/fleet")
  SL_ORDERED=""
  case "$SL_ORDER" in
    given) return 0 ;;
    auto)
      cli=$(sl_find_cli)
      if [ -z "$cli" ]; then
        [ "$SL_DRY" = 1 ] || sl_die "--order auto needs the switchless CLI here (set SWITCHLESS_BIN or --plugin-dir)"
        cli=switchless
      fi
      # The CLI on the nodes: $SWITCHLESS_NODE_BIN, else --plugin-dir's, else switchless on their PATH.
      local node_bin="${SWITCHLESS_NODE_BIN:-}"
      if [ -z "$node_bin" ] && [ -n "$SL_PLUGIN_DIR" ]; then node_bin="$SL_PLUGIN_DIR/bin/switchless"; fi
      fd+=(--local-bin "$cli" --bin "${node_bin:-switchless}")
      [ -z "$hosts" ] || fd+=(-H "$hosts")
      if [ "$SL_DRY" = 1 ]; then
        echo "# --order auto: the rank order is taken from the cabling when run (the commands below keep the given order):"
        sl_show "${fd[@]}" -- --order
        return 0
      fi
      out=$("${fd[@]}" -- --order) ||
        sl_die "--order auto: no rank order visits every host over cables, or a node was not captured (captures in $SL_OUT/fleet; see nccl-tests/fleet-doctor.sh)"
      SL_ORDERED=$(tail -n 1 <<< "$out")
      ;;
    *) SL_ORDERED="$SL_ORDER" ;;
  esac
  local seen=","
  IFS=, read -r -a list <<< "$SL_ORDERED"
  for h in "${list[@]}"; do
    [ -n "$h" ] || sl_die "--order $SL_ORDERED: an empty host name"
    case "$seen" in *",$h,"*) sl_die "--order $SL_ORDERED: $h twice" ;; esac
    seen+="$h,"
    n=$((n + 1))
    if [ -n "$hosts" ]; then
      case ",$hosts," in *",$h,"*) ;; *) sl_die "--order $SL_ORDERED: $h is not one of the hosts ($hosts)" ;; esac
    fi
  done
  [ "$n" = "$SL_NODES" ] || sl_die "--order $SL_ORDERED names $n host(s); the run has $SL_NODES"
  [ "$SL_DRY" = 1 ] || echo "switchless nccl-tests: rank order of the hosts: $SL_ORDERED"
}
