//! The findings registry: every check id `switchless doctor` (and `doctor --plan`) can report, with
//! its severity, the object it names, what triggers it and the remedy it gives. It is the one source
//! of the check tables in `docs/guide/doctor.md` and `docs/guide/plan.md` (generated, checked by a
//! test) and of any reference page of checks. Ids are stable: a check may change its text, never its id.
//!
//! Depends on nothing; the checks (`checks.rs`, `tcp.rs`, `env.rs`, `fleet.rs`, `plan::check`) name
//! their ids through [`check`].
#![forbid(unsafe_code)]

/// Stable check ids.
pub mod check {
    pub const NO_RDMA_DEVICES: &str = "no-rdma-devices";
    pub const MTU_BELOW_4200: &str = "mtu-below-4200";
    pub const SAME_SUBNET: &str = "same-subnet";
    pub const NO_IPV4_ROCE_V2_GID: &str = "no-ipv4-roce-v2-gid";
    pub const IPV4_LINK_LOCAL_GID: &str = "ipv4-link-local-gid";
    pub const MULTIHOST_FUNCTION_IDLE: &str = "multihost-function-idle";
    pub const PCIE_LINK_DEGRADED: &str = "pcie-link-degraded";
    pub const MEMLOCK_LOW: &str = "memlock-low";
    pub const LINK_DOWN: &str = "link-down";
    pub const ADDRESS_WITHOUT_RDMA: &str = "address-without-rdma";
    pub const NO_NEIGHBOUR: &str = "no-neighbour";
    pub const NO_CONNECTED_ROUTE: &str = "no-connected-route";
    pub const SOFT_ROCE_INFINITE_RETRY: &str = "soft-roce-infinite-retry";
    pub const GPU_DIRECT_OFF: &str = "gpu-direct-off";
    pub const NCCL_ENV: &str = "nccl-env";
    pub const NCCL_ENV_UNKNOWN: &str = "nccl-env-unknown";
    pub const NCCL_ENV_UNIT: &str = "nccl-env-unit";
    pub const IB_HCA_NO_MATCH: &str = "ib-hca-no-match";
    pub const IB_HCA_PREFIX_MATCH: &str = "ib-hca-prefix-match";
    pub const IB_HCA_SPLITS_PORT: &str = "ib-hca-splits-port";
    pub const HANDLE_LINKS_OVER_LIMIT: &str = "handle-links-over-limit";
    pub const TCP_NO_LINKS: &str = "tcp-no-links";
    pub const TCP_MTU_BELOW_9000: &str = "tcp-mtu-below-9000";
    pub const TCP_OFFLOAD_OFF: &str = "tcp-offload-off";
    pub const TCP_RX_QUEUES_LOW: &str = "tcp-rx-queues-low";
    pub const TCP_SOCKET_BUFFERS_LOW: &str = "tcp-socket-buffers-low";
    pub const NCCL_SOCKET_IFNAME: &str = "nccl-socket-ifname";
    pub const NCCL_NET_OTHER: &str = "nccl-net-other";
    pub const NCCL_NET_PLUGIN: &str = "nccl-net-plugin";
    pub const IB_GID_INDEX_WRONG: &str = "ib-gid-index-wrong";
    pub const GID_INDEX_DIFFERS: &str = "gid-index-differs";
    pub const NCCL_SHIM: &str = "nccl-shim";
    pub const ARP_FLUX_RISK: &str = "arp-flux-risk";
    pub const IPV6_TEMPORARY_ADDRESS: &str = "ipv6-temporary-address";
    pub const PCIE_SLOT_POWER: &str = "pcie-slot-power";
    pub const PCIE_GEN1_X1: &str = "pcie-gen1-x1";
    pub const NM_MANAGES_FABRIC_PORT: &str = "nm-manages-fabric-port";
    pub const PEERMEM_MISSING: &str = "peermem-missing";
    pub const KERNEL_FILE: &str = crate::findings::CHECK_KERNEL_FILE;
    // `switchless doctor --fleet`: the cross-host checks.
    pub const NO_FAR_END: &str = "no-far-end";
    pub const PREFIX_MISMATCH: &str = "prefix-mismatch";
    pub const MTU_MISMATCH: &str = "mtu-mismatch";
    pub const END_DOWN: &str = "end-down";
    pub const DUPLICATE_ADDRESS: &str = "duplicate-address";
    pub const HALF_ADDRESSED: &str = "half-addressed";
    pub const GID_MISSING_ONE_END: &str = "gid-missing-one-end";
    pub const NON_NEIGHBOURS: &str = "non-neighbours";
    pub const FAILOVER_PATHS: &str = "failover-paths";
    pub const CABLE_MISWIRED: &str = "cable-miswired";
    pub const ARP_FLUX: &str = "arp-flux";
    pub const PROBE_NO_ANSWER: &str = "probe-no-answer";
    pub const PLANNED_CABLE: &str = "planned-cable";
}

/// Which command reports a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `switchless doctor`.
    Doctor,
    /// `switchless doctor --plan` (the plan checks, `plan::check`).
    Plan,
    /// `switchless doctor --fleet` (the cross-host checks, `doctor::fleet`).
    Fleet,
}

/// One check of the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check {
    pub id: &'static str,
    pub source: Source,
    /// `error`, `warning`, `info`, or when it depends, which and when.
    pub severity: &'static str,
    /// The object the finding names (`netdev X`, `dev port N`, a variable, `host`, `plan`).
    pub object: &'static str,
    /// What triggers it (Markdown).
    pub trigger: &'static str,
    /// The remedy it gives (Markdown); the finding's own remedy fills in names, addresses and values.
    pub remedy: &'static str,
}

const fn doctor(
    id: &'static str,
    severity: &'static str,
    object: &'static str,
    trigger: &'static str,
    remedy: &'static str,
) -> Check {
    Check {
        id,
        source: Source::Doctor,
        severity,
        object,
        trigger,
        remedy,
    }
}

const fn fleet(
    id: &'static str,
    severity: &'static str,
    object: &'static str,
    trigger: &'static str,
    remedy: &'static str,
) -> Check {
    Check {
        id,
        source: Source::Fleet,
        severity,
        object,
        trigger,
        remedy,
    }
}

const fn plan(
    id: &'static str,
    severity: &'static str,
    object: &'static str,
    trigger: &'static str,
    remedy: &'static str,
) -> Check {
    Check {
        id,
        source: Source::Plan,
        severity,
        object,
        trigger,
        remedy,
    }
}

/// Every check, in the order the documentation lists them.
pub const FINDINGS: &[Check] = &[
    doctor(
        check::NO_RDMA_DEVICES,
        "error; info when the plugin carries the host over TCP",
        "`host`",
        "`/sys/class/infiniband` is missing or empty. On a host with point-to-point TCP links (an up \
         IPv4 address on a /30 or /31) that is a supported setup and only an info naming the TCP devices",
        "`modprobe mlx5_ib` (ConnectX), or give each cable its own /30 to run over TCP",
    ),
    doctor(
        check::MTU_BELOW_4200,
        "warning",
        "`netdev X`",
        "an active RoCE port's interface MTU is below 4200 bytes, or its active_mtu is below 4096 \
         (1500 gives 1024)",
        "`ip link set X mtu 9000` on both ends, persisted in netplan",
    ),
    doctor(
        check::SAME_SUBNET,
        "error",
        "`subnet N/len`, or `netdev X` for an overlap",
        "two netdevs have addresses in one subnet: the kernel routes it through one of them only. Also \
         overlapping subnets (a typo'd /29 over another netdev's /30): the netdev with the wider prefix is \
         named. Under `--plan`, a plan finding about that netdev's address replaces it",
        "give each its own /30 or /31 (`switchless plan` plans one per cable and function); for an overlap \
         `ip addr del A dev X` and its own /30 (the planned one under `--plan`)",
    ),
    doctor(
        check::NO_IPV4_ROCE_V2_GID,
        "warning",
        "`dev port N`",
        "an ACTIVE Ethernet port has no IPv4 RoCE v2 GID. The message says when the port has only \
         link-local (fe80::/64) GIDs; when the port is one function of a cable whose other function \
         is in use, the message says so (no separate `multihost-function-idle`)",
        "`ip addr add A/P dev X` with the planned address (filled in under `--plan`)",
    ),
    doctor(
        check::IPV4_LINK_LOCAL_GID,
        "warning",
        "`dev port N`",
        "the IPv4 GID is in 169.254/16 (autoconfiguration)",
        "static point-to-point addresses, one /30 or /31 per cable",
    ),
    doctor(
        check::MULTIHOST_FUNCTION_IDLE,
        "warning",
        "`dev port N`",
        "another member of the same cage (a GB10's second PCIe function, or a B300 cage's other half) is \
         usable, but this member is down and unaddressed, so half the cable's bandwidth sits idle. A member \
         that is down with an address, or up without a GID, is reported by `link-down` or \
         `no-ipv4-roce-v2-gid` instead, which then say this",
        "`ip link set dev X up mtu 9000` and its own /30 (the planned address under `--plan`)",
    ),
    doctor(
        check::PCIE_LINK_DEGRADED,
        "warning",
        "`pci BDF`",
        "an RDMA (or Mellanox) function's current PCIe width or speed is below its maximum (Gen5 x2 \
         instead of x4)",
        "reseat the card or update the BIOS/firmware; recheck under load",
    ),
    doctor(
        check::MEMLOCK_LOW,
        "error below 64 MiB, warning otherwise; info on a host the plugin carries over TCP",
        "`process RLIMIT_MEMLOCK`",
        "the soft RLIMIT_MEMLOCK is not unlimited. Only RDMA registers (locks) memory: on a host without \
         RDMA devices, or with `NCCL_SWITCHLESS_TRANSPORT=tcp`, the limit does not matter and is only said",
        "`ulimit -l unlimited`; `* - memlock unlimited` in limits.conf, `LimitMEMLOCK=infinity` (systemd, \
         and slurmd's unit), `PropagateResourceLimitsExcept=MEMLOCK` (slurm.conf: jobs keep slurmd's limit), \
         `--ulimit memlock=-1` (docker)",
    ),
    doctor(
        check::LINK_DOWN,
        "warning when the port or netdev has an address, info when it is unused",
        "`netdev X`",
        "the port is not ACTIVE, or the netdev has no carrier or is not up",
        "`ip link set dev X up; ethtool X` (no carrier: no cable, or the far end is down); nothing for \
         a port left empty on purpose",
    ),
    doctor(
        check::ADDRESS_WITHOUT_RDMA,
        "warning for a Mellanox/NVIDIA function (RDMA driver missing), info otherwise",
        "`netdev X`",
        "a PCI netdev has an IPv4 address but no RDMA device (a management NIC, or a TCP link)",
        "`modprobe mlx5_ib` for a Mellanox function; nothing otherwise",
    ),
    doctor(
        check::NO_NEIGHBOUR,
        "warning",
        "`netdev X`",
        "an up, addressed RoCE netdev has no complete `/proc/net/arp` entry in its subnet",
        "`ping -c 3 -I X PEER` (the one peer of a /30 or /31)",
    ),
    doctor(
        check::NO_CONNECTED_ROUTE,
        "warning",
        "`netdev X`",
        "no connected route holds the address, so its subnet is unknown",
        "`ip addr replace A/P dev X` with the prefix of the host's other cable addresses (or the plan's)",
    ),
    doctor(
        check::SOFT_ROCE_INFINITE_RETRY,
        "warning",
        "`NCCL_IB_RETRY_CNT`",
        "a soft-RoCE device (rdma_rxe) exists and `NCCL_IB_RETRY_CNT` is 7, NCCL's default: rxe never \
         counts 7 down, so a dead peer or cable hangs the job instead of failing with status 12",
        "`export NCCL_IB_RETRY_CNT=6`",
    ),
    doctor(
        check::GPU_DIRECT_OFF,
        "warning",
        "`host`",
        "only on the live host: the NVIDIA driver is loaded, no peer-memory client is, and every RDMA \
         driver refused the DMA-BUF probe, so NCCL stages GPU buffers through host memory",
        "`modprobe nvidia-peermem`, or DMA-BUF (Linux ≥ 5.12, NVIDIA's open GPU kernel modules, rdma-core ≥ 34)",
    ),
    doctor(
        check::NCCL_ENV,
        "error; warning for a merge variable",
        "the variable",
        "an `NCCL_IB_*` / `NCCL_SWITCHLESS_*` variable has a value the plugin's `init` would refuse (one \
         finding per variable; the message is the plugin's own: variable, value, accepted forms), or two \
         values contradict each other. The report still completes; the plugin would expose no device. \
         Warning: `NCCL_NET_MERGE_LEVEL`, `NCCL_NET_FORCE_MERGE` or `NCCL_IB_MERGE_NICS` is set, which does \
         nothing with this plugin (no virtual devices: `makeVDevice` is NULL; init WARNs the same)",
        "`unset VAR` (its default), or the `export VAR=...` of a near value that parses (`30` → `30s`)",
    ),
    doctor(
        check::NCCL_ENV_UNIT,
        "warning",
        "the variable",
        "a duration variable (`NCCL_SWITCHLESS_*_TIMEOUT`, `FAILBACK_*`) is a bare number other than 0: it is read \
         as milliseconds, while the command line (`bench --timeout`) reads a bare number as seconds",
        "`export VAR=Nms`, or `Ns` if seconds were meant: a unit reads the same everywhere",
    ),
    doctor(
        check::NCCL_ENV_UNKNOWN,
        "warning",
        "the variable",
        "a set `NCCL_SWITCHLESS_*` name no switchless version reads, or any set name (whatever part the typo \
         is in: `NCCL_SWITCHLES_TCP_STREAMS`, `NCLL_IB_HCA`) that neither NCCL nor the plugin reads and that \
         is within 1 to 3 edits (by its length) of one they read: a typo, so the setting meant is silently \
         at its default. The message asks \"did you mean\". An `NCCL_*` name far from every known one may be \
         a newer NCCL's: no finding",
        "`export MEANT=VALUE; unset TYPO`",
    ),
    doctor(
        check::NCCL_SOCKET_IFNAME,
        "warning",
        "`NCCL_SOCKET_IFNAME`",
        "`NCCL_SOCKET_IFNAME` (NCCL's bootstrap interface, which must reach every node) matches no netdev with \
         an address here, or selects cables (/30, /31 netdevs reach one peer each: beyond a pair NCCL's \
         init hangs)",
        "`export NCCL_SOCKET_IFNAME==IF` with IF the default route's interface (named in the remedy)",
    ),
    doctor(
        check::NCCL_NET_OTHER,
        "warning",
        "`NCCL_NET`",
        "`NCCL_NET` names another network than `switchless` (`IB`, `Socket`): NCCL then never uses the plugin",
        "`export NCCL_NET=switchless`, or unset it",
    ),
    doctor(
        check::NCCL_NET_PLUGIN,
        "info when it resolves (naming the library NCCL loads), warning when it names nothing loadable or `none`",
        "`NCCL_NET_PLUGIN`",
        "`NCCL_NET_PLUGIN` is set: the file NCCL would load for it (`libnccl-net-NAME.so`, then NAME, in \
         `LD_LIBRARY_PATH`, the loader's cache and the system library directories)",
        "`export NCCL_NET_PLUGIN=switchless` with the library installed (`make install`, `ldconfig`), or its \
         full path",
    ),
    doctor(
        check::IB_GID_INDEX_WRONG,
        "error",
        "`NCCL_IB_GID_INDEX`",
        "`NCCL_IB_GID_INDEX=N` is set and GID N of some usable RoCE port is not its IPv4 RoCE v2 GID \
         (link-local, an IPv6 address, RoCE v1, or empty): the message names each such port and where its \
         IPv4 GID is",
        "`unset NCCL_IB_GID_INDEX` (the plugin picks each port's GID per connection)",
    ),
    doctor(
        check::GID_INDEX_DIFFERS,
        "info",
        "`host`",
        "the IPv4 RoCE v2 GID is at different indices on different ports (3 on one CX-7 function, 5 on the \
         other, e.g. after IPv6 addresses came first): harmless unset, fatal for a global `NCCL_IB_GID_INDEX`",
        "leave `NCCL_IB_GID_INDEX` unset",
    ),
    doctor(
        check::NCCL_SHIM,
        "warning for `LD_PRELOAD` and `/etc/ld.so.preload`, info for `LD_LIBRARY_PATH`",
        "`LD_PRELOAD` or `LD_LIBRARY_PATH`",
        "the loader would load a `libnccl.so*` ahead of a program's own: preloaded (every process gets that \
         NCCL; a program that loads its own too aborts with \"Duplicate NCCL runtime found\"), or found in an \
         `LD_LIBRARY_PATH` directory",
        "drop the libnccl entry from `LD_PRELOAD` (`/etc/ld.so.preload`); run a patched NCCL by putting it \
         in place of the framework's copy instead",
    ),
    doctor(
        check::ARP_FLUX_RISK,
        "warning",
        "`port X+Y`",
        "two addressed PCIe functions share one wire (a GB10 QSFP port) and the ARP settings of either are \
         below `arp_ignore=1` / `arp_announce=2` (read from `/proc/sys/net/ipv4/conf/{all,X}`): each may \
         answer ARP for the other's address, so the peer learns the wrong MAC",
        "`sysctl -w net.ipv4.conf.X.arp_ignore=1 net.ipv4.conf.X.arp_announce=2 …`; persist with \
         `switchless plan CABLES --format sysctl` in `/etc/sysctl.d/`",
    ),
    doctor(
        check::IPV6_TEMPORARY_ADDRESS,
        "warning",
        "`netdev X`",
        "a RoCE netdev has IPv6 privacy (temporary) addresses (`/proc/net/if_inet6` flag 0x01): they take GID \
         slots and rotate, so the IPv4 RoCE v2 GID's index moves (a global `NCCL_IB_GID_INDEX` breaks, a cached \
         GID goes stale)",
        "`sysctl -w net.ipv6.conf.X.use_tempaddr=0` and flush them; persist with `switchless plan --format \
         sysctl` (or `disable_ipv6=1` on fabric ports)",
    ),
    doctor(
        check::PCIE_SLOT_POWER,
        "warning",
        "`pci BDF`",
        "a Mellanox function's captured Slot Power Limit is 0 W (`lspci -vv`, root only; `/lspci-vv/BDF` in a \
         capture) or the kernel logged \"insufficient power on the PCIe slot\" for it (`/dmesg`): a ConnectX-7 \
         then throttles (about 13 Gb/s reported)",
        "power off and unplug for 30 s (a warm reboot does not clear it); update the BIOS and NIC firmware",
    ),
    doctor(
        check::PCIE_GEN1_X1,
        "warning",
        "`pci BDF`",
        "a Mellanox function reports its PCIe link as Gen1 x1 (old OEM ConnectX-7 firmware): NCCL's topology costs \
         the NIC at a fraction of a GB/s. Replaces `pcie-link-degraded` for that function",
        "update the ConnectX-7 firmware; meanwhile an `NCCL_TOPO_FILE` with the real speed",
    ),
    doctor(
        check::NM_MANAGES_FABRIC_PORT,
        "warning",
        "`netdev X+Y`",
        "NetworkManager (`nmcli -t device`, `/nmcli-device` in a capture) runs an automatic profile (\"Wired \
         connection N\", connecting, or unconfigured) on a cabled fabric port: DHCP on a cable loops every \
         ~45 s and resets the port's addresses",
        "`nmcli device set X managed no`; persist with the plan's netplan output or NetworkManager's \
         `unmanaged-devices`",
    ),
    doctor(
        check::PEERMEM_MISSING,
        "warning when the kernel files rule DMA-BUF out, info otherwise",
        "`host`",
        "the NVIDIA driver is loaded, RDMA devices exist, `nvidia-peermem` is not loaded, and DMA-BUF is not known \
         to work (judged from `/proc/driver/nvidia/version` and the kernel release when the live host's drivers \
         were not asked; a GB10, whose GPU shares host memory, is left out)",
        "`modprobe nvidia-peermem`; or NVIDIA's open kernel modules on Linux ≥ 5.12 for DMA-BUF",
    ),
    doctor(
        check::PROBE_NO_ANSWER,
        "error",
        "`netdev X`",
        "only with `--probe` (live host): a far address of the netdev's /30 or /31 (the planned peer under \
         `--plan`) did not answer a ping; the message says whether anything else answered on that wire (its \
         MACs: the cable reaches another port) or nothing did",
        "`ethtool -p X 10` blinks the port: follow the cable; `fleet-doctor.sh --plan PLAN --probe` names \
         the port it reaches",
    ),
    doctor(
        check::IB_HCA_NO_MATCH,
        "error when no usable RoCE port is left, warning for an entry that names nothing",
        "`NCCL_IB_HCA`",
        "`NCCL_IB_HCA` selects no usable RoCE port (the plugin then falls back to TCP, or exposes nothing), \
         or one of its entries names no device (with the nearest name)",
        "`unset NCCL_IB_HCA`, or the exact list of the usable devices",
    ),
    doctor(
        check::IB_HCA_PREFIX_MATCH,
        "warning",
        "`NCCL_IB_HCA`",
        "an entry that is a device name also selects (or excludes) longer names by prefix: `mlx5_1` takes \
         `mlx5_10` … `mlx5_17` too. One finding for the variable: a split cable it also causes is said in it",
        "`export NCCL_IB_HCA==...`: the devices named, with the other functions of their cables (one remedy \
         for both problems)",
    ),
    doctor(
        check::IB_HCA_SPLITS_PORT,
        "warning",
        "`NCCL_IB_HCA`",
        "the filter keeps some functions of a cable and drops others (one PCIe function of a GB10 port, one \
         half of a B300 CX-8 port), so that cable's NCCL device gets part of its bandwidth",
        "`export NCCL_IB_HCA==...` with both functions of every cable it uses",
    ),
    doctor(
        check::HANDLE_LINKS_OVER_LIMIT,
        "warning",
        "`host`",
        "more links are up than the listen handle's 16, and a RoCE link is among those left out (the \
         handle keeps point-to-point RoCE first, management last): a peer reached only through it fails \
         to connect with \"no shared subnet\"",
        "exclude storage and management NICs with `NCCL_IB_HCA`, or remove secondary addresses",
    ),
    doctor(
        check::TCP_NO_LINKS,
        "error",
        "`NCCL_SWITCHLESS_TRANSPORT`",
        "`NCCL_SWITCHLESS_TRANSPORT=tcp` on a host without an up IPv4 address on a /30 or /31: init fails",
        "`unset NCCL_SWITCHLESS_TRANSPORT`, or one /30 per cable",
    ),
    doctor(
        check::TCP_MTU_BELOW_9000,
        "warning",
        "`netdev X`",
        "a point-to-point TCP link's MTU is below 9000 bytes (jumbo frames cut the per-packet CPU cost)",
        "`ip link set X mtu 9000` on both ends",
    ),
    doctor(
        check::TCP_OFFLOAD_OFF,
        "warning",
        "`netdev X`",
        "GRO or TSO of a TCP link is off, from `ethtool -k` (the message marks `[fixed]` features)",
        "`ethtool -K X gro on tso on`",
    ),
    doctor(
        check::TCP_RX_QUEUES_LOW,
        "warning",
        "`netdev X`",
        "a TCP link has fewer receive queues (`queues/rx-N`) than the transport's streams for its speed",
        "`ethtool -L X combined N`, irqbalance",
    ),
    doctor(
        check::TCP_SOCKET_BUFFERS_LOW,
        "warning",
        "`host TCP buffer limits`",
        "neither the autotuning ceilings (`tcp_rmem`/`tcp_wmem` third field) nor `net.core.rmem_max`/\
         `wmem_max` reach the transport's buffer size for the fastest TCP link",
        "`sysctl -w net.core.rmem_max=N net.core.wmem_max=N`",
    ),
    doctor(
        check::KERNEL_FILE,
        "warning",
        "`file PATH`",
        "a kernel file (or a captured `ethtool-k/<if>` text) is missing or unparsable",
        "none: the check that needed it is skipped; attach a `--capture` to a bug report",
    ),
    plan(
        "plan-server-unknown",
        "error",
        "`plan`",
        "`--server` is not a server of the plan, or `--server auto` cannot tell which server this host is",
        "`--server N` with this host's number (or name) in the cables file",
    ),
    plan(
        "plan-no-links",
        "warning",
        "`plan`",
        "the plan gives this server no link",
        "add its cables to the cables file and regenerate the plan",
    ),
    plan(
        "plan-model-mismatch",
        "error",
        "`plan`",
        "none of the interfaces the plan gives this server exists here: the plan is for another model \
         (the message names the model the host looks like). The only plan finding then: the others \
         follow from it",
        "regenerate the plan with `--model` of this host",
    ),
    plan(
        "plan-interface-missing",
        "error",
        "`netdev X`",
        "a planned interface does not exist",
        "check the model's port map, the NIC's Ethernet mode and driver",
    ),
    plan(
        "plan-link-down",
        "error",
        "`netdev X`",
        "a planned interface is down",
        "`ip link set dev X up`, then the cable",
    ),
    plan(
        "plan-mtu-mismatch",
        "error if lower, warning if higher",
        "`netdev X`",
        "the MTU differs from the plan (the message says what it costs: RoCE's active MTU, or a TCP \
         link's jumbo frames); replaces `mtu-below-4200` and `tcp-mtu-below-9000` for that netdev",
        "`ip link set dev X mtu M`",
    ),
    plan(
        "plan-addressing-differs",
        "error",
        "`plan`",
        "none of this server's planned addresses is on the host, and its planned interfaces hold other \
         addresses: the host follows another addressing plan. Replaces the per-interface \
         `plan-address-missing` and `plan-extra-address` findings",
        "apply this server's part of the plan (`switchless plan CABLES --format ip --server N`)",
    ),
    plan(
        "plan-address-missing",
        "error",
        "`netdev X`",
        "a planned address is on no interface",
        "`ip addr add A/P dev X`",
    ),
    plan(
        "plan-prefix-mismatch",
        "error",
        "`netdev X`",
        "the planned address is there with another prefix length",
        "`ip addr del A/Q dev X && ip addr add A/P dev X`",
    ),
    plan(
        "plan-address-on-wrong-interface",
        "error",
        "`netdev X`",
        "a planned address is on another interface facing the same peer (or none), or on two interfaces",
        "`ip addr del A dev Y && ip addr add A dev X`",
    ),
    plan(
        "plan-cable-wrong-peer",
        "error",
        "`netdev X`",
        "a planned address is on an interface the plan cables to another peer: a cable in the wrong port",
        "move the cable to the planned port (or fix the cables file and regenerate the plan)",
    ),
    plan(
        "plan-address-of-other-server",
        "error",
        "`netdev X`",
        "the host holds an address the plan gives to another server (wrong `--server`?)",
        "check the server number; `ip addr del A dev X`",
    ),
    plan(
        "plan-address-stray",
        "error",
        "`netdev X`",
        "an address inside a link subnet that is neither of its two planned addresses",
        "`ip addr del A dev X`",
    ),
    plan(
        "plan-address-unplanned",
        "warning",
        "`netdev X`",
        "an address inside `--base` but in no planned link (left from an older plan)",
        "`ip addr del A dev X`",
    ),
    plan(
        "plan-extra-address",
        "warning",
        "`netdev X`",
        "a planned interface carries an address from outside the plan (e.g. 169.254/16)",
        "`ip addr del A dev X` unless something else needs it",
    ),
    plan(
        "plan-host-matches",
        "info",
        "`plan`",
        "everything planned for this server is in place",
        "nothing",
    ),
    fleet(
        check::NO_FAR_END,
        "warning; info when the end is down",
        "`netdev host:X`",
        "A fabric address whose subnet no other host of the fleet holds an address in: the far end is \
         missing from the captures, unaddressed, or in another subnet",
        "capture the far host too, or address its end of the cable in the same /30 (`switchless plan`)",
    ),
    fleet(
        check::PREFIX_MISMATCH,
        "error",
        "`cable A — B`",
        "The two ends of one cable hold addresses with different prefix lengths (e.g. /24 and /30)",
        "give both ends the same /30 or /31 (`switchless plan --format ip`)",
    ),
    fleet(
        check::MTU_MISMATCH,
        "warning",
        "`cable A — B`",
        "The ends of one cable differ in MTU, or in RoCE active MTU. RoCE runs at the smaller active MTU; \
         a TCP cable carries no jumbo frames (TCP takes the smaller MTU per connection: more CPU per byte)",
        "`ip link set dev X mtu M` on the lower end (the finding names the host, the netdev and the value)",
    ),
    fleet(
        check::END_DOWN,
        "warning",
        "`cable A — B`",
        "One end of a cable is down while the other is up",
        "`ip link set dev X up; ethtool X` on the down end (named in the finding); no link detected: reseat \
         or replace the cable / transceiver",
    ),
    fleet(
        check::DUPLICATE_ADDRESS,
        "error",
        "`address A`",
        "One address is assigned on two or more hosts (host-local bridges and link-local addresses \
         excepted)",
        "give every host its own address (on a cable: one end .1, the other .2 of the /30)",
    ),
    fleet(
        check::HALF_ADDRESSED,
        "warning",
        "`cable A:fns — B:fns`",
        "A GB10 port or CX-8 port has both PCIe functions / halves addressed at one end and only one \
         at the other: half the cable's bandwidth is idle",
        "`ip link set dev X up mtu M && ip addr add A/P dev X` on the other end's idle function (the finding \
         names it, the address and the MTU; for a subnet wider than /30 or /31 it names the subnet)",
    ),
    fleet(
        check::GID_MISSING_ONE_END,
        "error",
        "`cable A — B`",
        "One end of a RoCE cable has the RoCE v2 IPv4 GID, the other has none for its address",
        "bring the netdev up with its address so the kernel adds the GID; check `show_gids` on that end",
    ),
    fleet(
        check::NON_NEIGHBOURS,
        "warning",
        "`fleet`",
        "Some host pairs have no cable between them: all-to-all connections between them fail with \
         \"no local link reaches the peer\" (or go over the shared subnet with the TCP fallback)",
        "cable a full mesh for all-to-all, or set NCCL_SWITCHLESS_TCP_FALLBACK=1 and accept the \
         shared subnet's speed for those pairs",
    ),
    fleet(
        check::CABLE_MISWIRED,
        "error",
        "`cable A:X — B:Y`",
        "the MAC that answered for a far address (the neighbour table), or what `--probe` saw on the wire, \
         is another port than the one the addresses pair this end with: a cable in the wrong port, or \
         addresses set for another cabling. One finding per physical cable, naming both ends",
        "`ethtool -p X 10` blinks the port; move the cable to the port its addresses are for (`--fleet \
         --plan` names the planned ports), or re-address both ends",
    ),
    fleet(
        check::ARP_FLUX,
        "warning",
        "`cable A — B`",
        "the MAC an end has for its far address belongs to the other PCIe function on the far end's wire: ARP \
         flux (a GB10 port's two functions with the kernel's ARP defaults)",
        "`arp_ignore=1`, `arp_announce=2` on the far end's functions (`switchless plan --format sysctl`), then \
         `ip neigh flush dev X` on this end",
    ),
    fleet(
        check::PLANNED_CABLE,
        "error",
        "`planned cable A port P — B port Q`",
        "only with `--fleet --plan`: a planned cable of which no function shows: a host is not among the \
         captures, a planned interface does not exist, or it lacks its planned address (the other states, \
         `ok`, `wrong-port`, `down`, `half`, `unverified`, are in the planned-cables table; a wrong port is \
         also `cable-miswired`)",
        "`switchless doctor --plan plan.json` on that host names what to change; capture a missing host",
    ),
    fleet(
        check::FAILOVER_PATHS,
        "info",
        "`hosts A — B`",
        "Always, per host pair with a usable path, in its own section (not a problem: no effect on \
         the exit status): which paths a connection on each NCCL device of \
         A carries on (that device's), and which stand by to take over when one fails (the pair's \
         other usable paths); with one usable path, that nothing can take over",
        "nothing; a second cable (or the port's other function, addressed) where there is one path only",
    ),
];

/// The registry entry of `id`.
pub fn find(id: &str) -> Option<&'static Check> {
    FINDINGS.iter().find(|c| c.id == id)
}

/// The Markdown table of the checks of `source` (Check id, Severity, Object, When, Remedy).
pub fn markdown(source: Source) -> String {
    let mut out =
        String::from("| Check id | Severity | Object | When | Remedy |\n|---|---|---|---|---|\n");
    for c in FINDINGS.iter().filter(|c| c.source == source) {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            c.id,
            c.severity,
            c.object,
            c.trigger.replace('|', "\\|"),
            c.remedy.replace('|', "\\|")
        ));
    }
    out
}

/// The whole of `docs/reference/doctor-findings.md`: every check of every source, with its code,
/// severity, the object it names, its trigger and its remedy.
pub fn reference_page() -> String {
    format!(
        "# Doctor findings\n\n\
         <!-- Generated from src/tools/doctor/registry.rs: edit the registry, then run \
         SWITCHLESS_UPDATE_DOCS=1 cargo test --lib doctor::registry -->\n\n\
         Every finding `switchless doctor` can report, by its check id (the `check` field of \
         `doctor --json`; ids are stable). Severity decides the exit status: 0 when only info findings \
         remain, 1 with a warning, 2 with an error. The remedy printed with a finding fills in the \
         interface names, addresses and values that the table writes as `X`, `A` or `N`.\n\n\
         ## `switchless doctor`\n\n{}\n\
         ## `switchless doctor --plan`\n\n\
         Checks of this host against its part of an IP plan (`switchless plan --format json`).\n\n{}\n\
         ## `switchless doctor --fleet`\n\n\
         Checks of the cables between hosts, from one capture per host.\n\n{}",
        markdown(Source::Doctor),
        markdown(Source::Plan),
        markdown(Source::Fleet)
    )
}

/// First line of a generated table of checks in a documentation page.
pub const BEGIN: &str = "<!-- BEGIN generated from src/tools/doctor/registry.rs: edit the registry, then run \
SWITCHLESS_UPDATE_DOCS=1 cargo test --lib doctor::registry -->";
/// Last line of a generated table.
pub const END: &str = "<!-- END generated -->";

#[cfg(test)]
mod tests {
    use super::*;

    /// `page` with the region between BEGIN and END replaced by `table`.
    fn splice(page: &str, table: &str) -> Option<String> {
        let start = page.find(BEGIN)? + BEGIN.len();
        let end = start + page[start..].find(END)?;
        Some(format!("{}\n{table}{}", &page[..start], &page[end..]))
    }

    #[test]
    fn ids_are_unique_and_kebab_case() {
        let mut seen = std::collections::BTreeSet::new();
        for c in FINDINGS {
            assert!(seen.insert(c.id), "{} twice", c.id);
            assert!(
                c.id.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{}",
                c.id
            );
            assert!(!c.trigger.is_empty() && !c.remedy.is_empty(), "{}", c.id);
        }
    }

    #[test]
    fn every_id_the_code_reports_is_registered() {
        // The ids of `check` (the doctor's checks) ...
        let me = include_str!("registry.rs");
        let consts =
            &me[me.find("pub mod check {").unwrap()..me.find("/// Which command").unwrap()];
        let mut n = 0;
        for line in consts.lines().filter(|l| l.contains("&str = \"")) {
            let id = line.split('"').nth(1).unwrap();
            assert!(find(id).is_some(), "{id} is a check id but not registered");
            n += 1;
        }
        assert!(n >= 24, "{n}");
        assert!(find(check::KERNEL_FILE).is_some());
        // ... the fleet's cross-host checks among them ...
        let fleet = FINDINGS
            .iter()
            .filter(|c| c.source == Source::Fleet)
            .count();
        assert!(fleet >= 8, "{fleet}");
        // ... and the plan checks, which name theirs as string literals.
        let text = include_str!("../plan/check.rs");
        for (i, _) in text.match_indices("\"plan-") {
            let id: String = text[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
                .collect();
            assert!(find(&id).is_some(), "{id} is reported but not registered");
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "reads docs/ from the host filesystem; Miri isolates it"
    )]
    fn documentation_tables_are_current() {
        // SWITCHLESS_UPDATE_DOCS=1 rewrites the pages instead.
        let root = env!("CARGO_MANIFEST_DIR");
        let mut pages = Vec::new();
        for (page, source) in [("doctor.md", Source::Doctor), ("plan.md", Source::Plan)] {
            let path = format!("{root}/docs/guide/{page}");
            let text = std::fs::read_to_string(&path).unwrap();
            let want = splice(&text, &markdown(source))
                .unwrap_or_else(|| panic!("{path} lacks the generated-table markers"));
            pages.push((path, text, want));
        }
        let path = format!("{root}/docs/reference/doctor-findings.md");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        pages.push((path, text, reference_page()));
        for (path, text, want) in pages {
            if std::env::var_os("SWITCHLESS_UPDATE_DOCS").is_some() {
                std::fs::write(&path, &want).unwrap();
                continue;
            }
            assert!(
                text == want,
                "{path} is stale: run SWITCHLESS_UPDATE_DOCS=1 cargo test --lib doctor::registry"
            );
        }
    }
}
