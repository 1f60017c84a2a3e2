//! The doctor's checks over the host model: RDMA ports, GIDs, cages, netdevs, PCIe links, locked
//! memory (and, through [`super::tcp`], point-to-point TCP links). Each finding names a check id of
//! [`super::registry`].

use std::collections::BTreeMap;

use super::env::{NcclView, usable};
use super::registry::check;
use crate::findings::{Finding, Severity};
use crate::host::model::{GidAddr, HostModel, PcieLink};
use crate::host::nccl::{NcclDevice, PTR_CUDA, PTR_DMABUF};

/// Below this RLIMIT_MEMLOCK (bytes) registration of NCCL's buffers fails: an error.
pub const MEMLOCK_ERROR_BELOW: u64 = 64 << 20;

/// How to lift the memlock limit, for a shell, PAM logins, systemd services, Slurm jobs and docker.
/// Under srun a job inherits slurmd's own limit (its unit's `LimitMEMLOCK`) unless slurm.conf
/// propagates the submitting shell's limit, which is usually the 8 MiB default.
pub const MEMLOCK_REMEDY: &str = "set memlock unlimited: ulimit -l unlimited (this shell); \
'* - memlock unlimited' in /etc/security/limits.conf (logins); LimitMEMLOCK=infinity (systemd units, and \
slurmd's: systemctl edit slurmd); PropagateResourceLimitsExcept=MEMLOCK in slurm.conf (Slurm jobs keep \
slurmd's limit instead of the login shell's); --ulimit memlock=-1 (docker)";

fn port_obj(dev: &str, port: u8) -> String {
    format!("{dev} port {port}")
}

fn fmt_link(speed: Option<f32>, width: Option<u32>) -> String {
    match (speed, width) {
        (Some(s), Some(w)) => format!("Gen{} x{w} ({s:.1} GT/s)", PcieLink::gen_of(s)),
        (Some(s), None) => format!("Gen{} ({s:.1} GT/s)", PcieLink::gen_of(s)),
        (None, Some(w)) => format!("x{w}"),
        (None, None) => "unknown".to_string(),
    }
}

/// Checks of the host against the NCCL environment the plugin would run with (`ib_retry_cnt` =
/// `NCCL_IB_RETRY_CNT`, 7 when unset).
///
/// `soft-roce-infinite-retry`: rdma_rxe's completer only counts a retry down when the QP's retry
/// count is not 7 (drivers/infiniband/sw/rxe/rxe_comp.c), so with NCCL's default of 7 a send to a
/// dead peer or over a dead cable retries forever instead of failing with "transport retry counter
/// exceeded" (status 12). Hardware RoCE NICs treat 7 as seven retries.
pub fn env_checks(m: &HostModel, ib_retry_cnt: u8) -> Vec<Finding> {
    let soft: Vec<&str> = m
        .rdma_devices
        .iter()
        .filter(|d| d.software)
        .map(|d| d.name.as_str())
        .collect();
    if soft.is_empty() || ib_retry_cnt != 7 {
        return Vec::new();
    }
    vec![Finding::new(
        Severity::Warning,
        check::SOFT_ROCE_INFINITE_RETRY,
        "NCCL_IB_RETRY_CNT",
        format!(
            "{} {} soft-RoCE (rdma_rxe) and NCCL_IB_RETRY_CNT is 7 (NCCL's default when unset): rdma_rxe never \
             counts a retry count of 7 down, so a send to a dead peer or over a dead cable retries forever \
             instead of failing with \"transport retry counter exceeded\" (status 12), and the job hangs",
            soft.join(", "),
            if soft.len() == 1 { "is" } else { "are" }
        ),
        "export NCCL_IB_RETRY_CNT=6 (any value 0..=6) on soft-RoCE hosts; hardware RoCE NICs are not affected",
    )]
}

/// GPUDirect RDMA: with the NVIDIA driver loaded, NCCL moves GPU buffers straight between GPU and NIC
/// only through a device that offers `NCCL_PTR_CUDA` (a peer-memory client) or `NCCL_PTR_DMABUF`.
/// `dmabuf_probed` says the devices' DMA-BUF bits come from asking each driver (doctor on the live
/// host); kernel files cannot tell DMA-BUF support, so offline (`--root`) this check says nothing.
pub fn gpu_direct_checks(
    m: &HostModel,
    devices: &[NcclDevice],
    dmabuf_probed: bool,
) -> Vec<Finding> {
    let gpu_capable = |d: &NcclDevice| d.ptr_support & (PTR_CUDA | PTR_DMABUF) != 0;
    if !m.gpu_driver || !dmabuf_probed || devices.is_empty() || devices.iter().any(gpu_capable) {
        return Vec::new();
    }
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    vec![Finding::new(
        Severity::Warning,
        check::GPU_DIRECT_OFF,
        "host",
        format!(
            "the NVIDIA GPU driver is loaded but no NCCL device ({}) can register GPU memory: no peer-memory \
             client (nvidia_peermem) is loaded and no RDMA driver takes DMA-BUF registrations, so NCCL \
             stages every GPU buffer through host memory (no /GDRDMA in its log), at a cost in bandwidth and CPU",
            names.join(", ")
        ),
        "modprobe nvidia-peermem, or use DMA-BUF (Linux 5.12 or newer with NVIDIA's open GPU kernel modules, \
         rdma-core 34 or newer); then run switchless doctor again",
    )]
}

/// What the IP plan gives a netdev (`doctor --plan`): its address with the link's prefix, and the MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedIface {
    pub address: ipnet::Ipv4Net,
    /// Bytes.
    pub mtu: u32,
}

/// The planned interfaces by netdev name, to fill remedies in (empty without `--plan`).
pub type Planned = BTreeMap<String, PlannedIface>;

/// How to give `netdev` its address: the planned one when the plan is known, else where to find it.
fn address_remedy(netdev: &str, planned: &Planned) -> String {
    match planned.get(netdev) {
        Some(p) => format!(
            "ip link set dev {netdev} up mtu {}; ip addr add {} dev {netdev}",
            p.mtu, p.address
        ),
        None => format!(
            "ip link set dev {netdev} up mtu 9000   # then its own /30: switchless doctor --plan plan.json \
             --server auto names the planned address"
        ),
    }
}

/// The listen handle advertises at most 16 links (`route::handle::MAX_LINKS`): the RoCE links a
/// node with more would leave out, as the plugin ranks them (`route::handle::advert_rank`).
fn handle_check(m: &HostModel, view: &NcclView) -> Option<Finding> {
    let links = m.local_links(&view.devices);
    let up = links.iter().filter(|l| l.up).count();
    let (_, left) = crate::route::HandleRepr::from_local(&links, 1, None, 0);
    let roce: Vec<String> = left
        .iter()
        .filter(|l| l.up && l.kind == crate::route::types::LinkKind::Roce)
        .map(|l| format!("{} {}", l.netdev, l.addr))
        .collect();
    if roce.is_empty() {
        return None;
    }
    let max = crate::route::handle::MAX_LINKS;
    Some(Finding::new(
        Severity::Warning,
        check::HANDLE_LINKS_OVER_LIMIT,
        "host",
        format!(
            "{up} links are up; the listen handle advertises {max} (point-to-point RoCE first, \
             management last) and leaves out RoCE {}: a peer reached only through them fails to \
             connect (\"no shared subnet\")",
            roce.join(", ")
        ),
        "exclude storage and management NICs with NCCL_IB_HCA (export NCCL_IB_HCA=^<device>,...), or \
         remove secondary addresses from the mesh netdevs",
    ))
}

/// Every doctor check over the model, given what the plugin would expose (`view`) and the planned
/// addresses (empty without `--plan`). Discovery's own findings (`kernel-file`) are not repeated here.
pub fn checks(m: &HostModel, view: &NcclView, planned: &Planned) -> Vec<Finding> {
    let mut f = Vec::new();
    f.extend(handle_check(m, view));

    if m.rdma_devices.is_empty() {
        let why = if m.rdma_class_present {
            "/sys/class/infiniband is empty: no RDMA device is registered"
        } else {
            "/sys/class/infiniband does not exist: the RDMA core (ib_core) or the NIC's RDMA driver is not loaded"
        };
        if view.transport == "tcp" {
            // A point-to-point Ethernet host is a supported setup: the plugin carries it over TCP.
            let names: Vec<&str> = view.devices.iter().map(|d| d.name.as_str()).collect();
            f.push(Finding::new(
                Severity::Info,
                check::NO_RDMA_DEVICES,
                "host",
                format!("no RDMA devices ({why}): the plugin carries connections over TCP on {}", names.join(", ")),
                "nothing to do for TCP; for RoCE, load the NIC's RDMA driver (modprobe mlx5_ib for ConnectX)",
            ));
        } else {
            f.push(Finding::new(
                Severity::Error,
                check::NO_RDMA_DEVICES,
                "host",
                format!("no RDMA devices: {why}, and no netdev has an up IPv4 address on a /30 or /31 for TCP"),
                "load the RDMA driver (modprobe mlx5_ib for ConnectX), or give each cable its own /30 (switchless plan) to run over TCP",
            ));
        }
    }

    // Per RDMA port.
    for (d, p) in m.ports() {
        let nd = p.netdev.as_deref().and_then(|n| m.netdev(n));
        let obj = port_obj(&d.name, p.port);
        let up = nd.is_none_or(|n| n.is_up()) && p.is_active();
        let addressed =
            p.ipv4_v2_gids().next().is_some() || nd.is_some_and(|n| !n.addrs.is_empty());
        if !up {
            let (state, carrier) = (
                format!("{} ({})", p.state_name, p.phys_state_name),
                nd.map(|n| {
                    format!(
                        "netdev {} operstate {}, carrier {}",
                        n.name,
                        n.operstate,
                        match n.carrier {
                            Some(true) => "1",
                            Some(false) => "0",
                            None => "unreadable",
                        }
                    )
                })
                .unwrap_or_else(|| "no netdev".to_string()),
            );
            let sev = if addressed {
                Severity::Warning
            } else {
                Severity::Info
            };
            let ifname = nd.map(|n| n.name.as_str());
            let remedy = match (ifname, addressed) {
                (Some(n), true) => format!(
                    "ip link set dev {n} up; ethtool {n}   # 'Link detected: no': no cable, or the far end is down"
                ),
                (Some(n), false) => format!(
                    "nothing if the port is empty on purpose; to use it: cable it, then {}",
                    address_remedy(n, planned)
                ),
                (None, _) => "check the cable and the peer's port; the port has no netdev (ip link shows none)".to_string(),
            };
            f.push(Finding::new(
                sev,
                check::LINK_DOWN,
                nd.map(|n| format!("netdev {}", n.name))
                    .unwrap_or(obj.clone()),
                format!(
                    "{obj} is {state}; {carrier}{}",
                    if addressed {
                        "; it has an address, so it is meant to carry traffic"
                    } else {
                        "; unused (no address)"
                    }
                ),
                remedy,
            ));
            continue;
        }
        if p.is_ethernet() {
            if let (Some(n), Some(mtu)) = (nd, nd.and_then(|n| n.mtu)) {
                if mtu < 4200 || p.active_mtu < 4096 {
                    f.push(Finding::new(
                        Severity::Warning,
                        check::MTU_BELOW_4200,
                        format!("netdev {}", n.name),
                        format!(
                            "interface MTU {mtu} bytes gives RoCE active_mtu {} bytes ({}) on {obj}; 4096-byte RoCE frames need an interface MTU of at least 4200 bytes",
                            p.active_mtu, p.active_mtu_source
                        ),
                        format!("ip link set {} mtu 9000 (on both ends; persist it in netplan), then re-check active_mtu with ibv_devinfo", n.name),
                    ));
                }
            }
            let v2: Vec<_> = p.ipv4_v2_gids().collect();
            if v2.is_empty() {
                let only_ll =
                    !p.gids.is_empty() && p.gids.iter().all(|g| g.addr == GidAddr::LinkLocal);
                let what = if p.gids.is_empty() {
                    "has no GIDs at all".to_string()
                } else if only_ll {
                    "has only link-local GIDs (fe80::/64), which NCCL treats as invalid".to_string()
                } else {
                    let kinds: Vec<String> = p
                        .gids
                        .iter()
                        .map(|g| format!("{}={} {}", g.index, g.gid, g.gid_type.as_str()))
                        .collect();
                    format!(
                        "has no IPv4-mapped RoCE v2 GID (GIDs: {})",
                        kinds.join(", ")
                    )
                };
                f.push(Finding::new(
                    Severity::Warning,
                    check::NO_IPV4_ROCE_V2_GID,
                    obj.clone(),
                    format!("{obj} is ACTIVE but {what}; it cannot carry a RoCE v2 connection"),
                    match p.netdev.as_deref() {
                        Some(n) => address_remedy(n, planned),
                        None => "the port has no netdev: check that the NIC is in Ethernet mode (mlxconfig LINK_TYPE_P1=2)".to_string(),
                    },
                ));
            } else {
                for (g, a) in v2.iter().filter(|(_, a)| a.is_link_local()) {
                    f.push(Finding::new(
                        Severity::Warning,
                        check::IPV4_LINK_LOCAL_GID,
                        obj.clone(),
                        format!("GID {} of {obj} is the IPv4 link-local address {a} (169.254.0.0/16 autoconfiguration)", g.index),
                        "assign static point-to-point addresses (/30 or /31 per cable); link-local addresses change and collide",
                    ));
                }
            }
        }
    }

    // Multi-host / split cages: a member that is idle while another member of the cage is usable.
    // A member already reported (down with an address, or up without a GID) gets the consequence
    // added to that finding instead of a second one about the same port; a down member without an
    // address is this finding (its `link-down` info goes).
    let mut cages: BTreeMap<_, Vec<(String, u8)>> = BTreeMap::new();
    for (d, p) in m.ports() {
        cages
            .entry(p.cage.clone())
            .or_default()
            .push((d.name.clone(), p.port));
    }
    for members in cages.values() {
        let Some(good) = members.iter().find(|(d, p)| usable(m, d, *p)) else {
            continue;
        };
        for (d, p) in members.iter().filter(|(d, p)| !usable(m, d, *p)) {
            let Some((dev, port)) = m.rdma_port(d, *p) else {
                continue;
            };
            let root = dev
                .pci
                .as_deref()
                .and_then(|b| m.pci(b))
                .map(|f| f.root.clone())
                .unwrap_or_default();
            let nd = port.netdev.as_deref().and_then(|n| m.netdev(n));
            let why = if !port.is_active() || nd.is_some_and(|n| !n.is_up()) {
                "down"
            } else {
                "unaddressed (no IPv4 RoCE v2 GID)"
            };
            let consequence = format!(
                "it serves the same cable as {} port {}, so that function's PCIe link (root {root}) and about \
                 half of the cable's bandwidth stay idle",
                good.0, good.1
            );
            let obj = port_obj(d, *p);
            let nd_obj = port.netdev.as_deref().map(|n| format!("netdev {n}"));
            let earlier = f.iter().position(|x| {
                (x.check == check::LINK_DOWN
                    && (Some(&x.object) == nd_obj.as_ref() || x.object == obj))
                    || (x.check == check::NO_IPV4_ROCE_V2_GID && x.object == obj)
            });
            match earlier {
                Some(i) if f[i].severity >= Severity::Warning => {
                    f[i].message = format!("{}; {consequence}", f[i].message);
                    continue;
                }
                Some(i) => {
                    f.remove(i);
                }
                None => {}
            }
            f.push(Finding::new(
                Severity::Warning,
                check::MULTIHOST_FUNCTION_IDLE,
                obj.clone(),
                format!(
                    "{obj} (netdev {}) is {why}: {consequence}",
                    port.netdev.as_deref().unwrap_or("none"),
                ),
                match port.netdev.as_deref() {
                    Some(n) => address_remedy(n, planned),
                    None => {
                        "the port has no netdev: check that the NIC is in Ethernet mode".to_string()
                    }
                },
            ));
        }
    }

    // Netdevs: routes, neighbours, address without RDMA. The prefix most RDMA netdevs' routed
    // addresses use is the host's cable prefix (a /24 GB10 layout, /30 on a planned mesh).
    let mut prefixes: BTreeMap<u8, usize> = BTreeMap::new();
    for n in m.netdevs.iter().filter(|n| !n.rdma.is_empty()) {
        for a in n.addrs.iter().filter(|a| a.has_route) {
            *prefixes.entry(a.addr.prefix_len()).or_default() += 1;
        }
    }
    let netdev_names: Vec<&str> = m.netdevs.iter().map(|n| n.name.as_str()).collect();
    let model_arg = crate::tools::plan::PortMap::builtin_like(&netdev_names)
        .map_or(String::new(), |p| format!(" --model {}", p.name));
    let cable_prefix = prefixes
        .iter()
        .max_by_key(|(p, c)| (**c, std::cmp::Reverse(**p)))
        .map_or(30, |(p, _)| *p);
    let mut subnets: BTreeMap<ipnet::Ipv4Net, Vec<String>> = BTreeMap::new();
    for n in &m.netdevs {
        for a in &n.addrs {
            if !a.has_route {
                f.push(Finding::new(
                    Severity::Warning,
                    check::NO_CONNECTED_ROUTE,
                    format!("netdev {}", n.name),
                    format!("no connected route in /proc/net/route holds {} on {}; its subnet is unknown", a.addr.addr(), n.name),
                    format!(
                        "ip addr replace {}/{} dev {}   # the prefix {}",
                        a.addr.addr(),
                        planned.get(&n.name).map_or(cable_prefix, |p| p.address.prefix_len()),
                        n.name,
                        if planned.contains_key(&n.name) { "of the plan" } else { "this host's other cable addresses use" }
                    ),
                ));
                continue;
            }
            if a.addr.prefix_len() < 32 {
                let v = subnets.entry(a.addr.trunc()).or_default();
                if !v.contains(&n.name) {
                    v.push(n.name.clone());
                }
            }
        }
        if n.pci.is_some() && !n.addrs.is_empty() && n.rdma.is_empty() {
            let mellanox = n
                .pci
                .as_deref()
                .and_then(|b| m.pci(b))
                .and_then(|f| f.vendor)
                .is_some_and(|v| v == crate::host::discover::MELLANOX_VENDOR);
            let addrs: Vec<String> = n.addrs.iter().map(|a| a.addr.to_string()).collect();
            f.push(if mellanox {
                Finding::new(
                    Severity::Warning,
                    check::ADDRESS_WITHOUT_RDMA,
                    format!("netdev {}", n.name),
                    format!("{} ({}) is a Mellanox/NVIDIA function with an address but no RDMA device: only TCP can use it", n.name, addrs.join(", ")),
                    "load the RDMA driver (modprobe mlx5_ib) and check rdma link show",
                )
            } else {
                Finding::new(
                    Severity::Info,
                    check::ADDRESS_WITHOUT_RDMA,
                    format!("netdev {}", n.name),
                    if m.tcp_links.iter().any(|t| t.netdev == n.name) {
                        format!("{} ({}) has an address but no RDMA device: a point-to-point TCP link (the tcp-* checks cover its tuning)", n.name, addrs.join(", "))
                    } else {
                        format!("{} ({}) has an address but no RDMA device: TCP only (management or bootstrap network)", n.name, addrs.join(", "))
                    },
                    "nothing to do unless this interface should carry RDMA",
                )
            });
        }
        // Neighbours on usable RoCE netdevs.
        let roce_up = n.is_up() && n.rdma.iter().any(|(d, p)| usable(m, d, *p));
        if roce_up {
            for a in n
                .addrs
                .iter()
                .filter(|a| a.has_route && a.addr.prefix_len() < 32)
            {
                let net = a.addr.trunc();
                let seen = m
                    .neighbours
                    .iter()
                    .any(|nb| nb.complete && nb.ifname == n.name && net.contains(&nb.addr));
                if !seen {
                    f.push(Finding::new(
                        Severity::Warning,
                        check::NO_NEIGHBOUR,
                        format!("netdev {}", n.name),
                        format!("no other host of {net} is in the kernel's neighbour table (/proc/net/arp) for {}: the cable may go nowhere or the peer is not addressed in this subnet", n.name),
                        format!("ping -c 3 -I {} {}; if it fails check the cable and the peer's address (the table is empty until traffic has flowed, so this is expected right after boot)", n.name, match crate::host::nccl::point_to_point_peers(a.addr).as_deref() {
                            Some([p]) => p.to_string(),
                            _ => format!("<peer address in {net}>"),
                        }),
                    ));
                }
            }
        }
    }
    // Overlapping prefixes on two netdevs (a typo'd /29 over a cable's /30): the kernel sends the
    // narrower range through the netdev with the longer prefix only. The wider one is the odd one.
    for (wide, wide_names) in &subnets {
        for (narrow, narrow_names) in &subnets {
            if wide == narrow || !wide.contains(narrow) {
                continue;
            }
            for w in wide_names.iter().filter(|w| !narrow_names.contains(w)) {
                let held = m
                    .netdev(w)
                    .and_then(|n| n.addrs.iter().find(|a| a.addr.trunc() == *wide))
                    .map_or_else(|| wide.to_string(), |a| a.addr.to_string());
                f.push(Finding::new(
                    Severity::Error,
                    check::SAME_SUBNET,
                    format!("netdev {w}"),
                    format!(
                        "{w} holds {held}, whose subnet {wide} overlaps {narrow} of {}: the kernel routes {narrow} \
                         through {} only (the longer prefix), so {w}'s traffic to that range leaves by the \
                         wrong port and RoCE connections on it fail",
                        narrow_names.join(", "),
                        narrow_names.join(", ")
                    ),
                    match planned.get(w.as_str()) {
                        Some(p) => format!(
                            "ip addr del {held} dev {w} && ip addr add {} dev {w}   # the plan's address",
                            p.address
                        ),
                        None => format!(
                            "ip addr del {held} dev {w}, then give {w} its own /30 (switchless doctor --plan \
                             plan.json names the planned one; switchless plan CABLES{model_arg} --format ip plans it)"
                        ),
                    },
                ));
            }
        }
    }
    for (net, names) in &subnets {
        if names.len() > 1 {
            f.push(Finding::new(
                Severity::Error,
                check::SAME_SUBNET,
                format!("subnet {net}"),
                format!("{} all have addresses in {net}: the kernel routes the subnet through one of them only and RoCE connections on the others fail", names.join(", ")),
                format!(
                    "give {} each its own /30: switchless plan CABLES{} --format ip plans one per cable and function",
                    names.join(", "),
                    model_arg
                ),
            ));
        }
    }

    // PCIe links of RDMA functions and Mellanox netdevs.
    let mut fns: Vec<&str> = m
        .rdma_devices
        .iter()
        .filter_map(|d| d.pci.as_deref())
        .collect();
    fns.extend(
        m.netdevs
            .iter()
            .filter(|n| n.rdma.is_empty())
            .filter_map(|n| n.pci.as_deref())
            .filter(|b| {
                m.pci(b).and_then(|f| f.vendor) == Some(crate::host::discover::MELLANOX_VENDOR)
            }),
    );
    fns.sort();
    fns.dedup();
    for b in fns {
        let Some(pf) = m.pci(b) else { continue };
        let l = pf.link;
        let width_low = matches!((l.current_width, l.max_width), (Some(c), Some(x)) if c < x);
        let speed_low =
            matches!((l.current_speed_gts, l.max_speed_gts), (Some(c), Some(x)) if c + 0.01 < x);
        if width_low || speed_low {
            f.push(Finding::new(
                Severity::Warning,
                check::PCIE_LINK_DEGRADED,
                format!("pci {b}"),
                format!(
                    "PCIe link of {b} (root {}) runs at {} below its maximum {}: the function is capped near {} Gb/s",
                    pf.root,
                    fmt_link(l.current_speed_gts, l.current_width),
                    fmt_link(l.max_speed_gts, l.max_width),
                    l.current_mbps().unwrap_or(0) / 1000
                ),
                "reseat the card or update the BIOS/firmware (GB10 BIOS before 2026-04 trained the second function at Gen5 x2); recheck under load, idle links may train down",
            ));
        }
    }

    // Locked memory: only what RDMA registers is locked. A host the plugin carries over TCP (no RDMA
    // device, or NCCL_SWITCHLESS_TRANSPORT=tcp) registers nothing with verbs, so the limit is only
    // said; where RDMA devices will be opened (or would be, once their ports work) it decides.
    if let Some((ml, soft)) = m.memlock.and_then(|ml| ml.soft.map(|s| (ml, s))) {
        let hard = ml
            .hard
            .map(|h| format!("{h} bytes"))
            .unwrap_or_else(|| "unlimited".into());
        let limit = format!(
            "max locked memory is {soft} bytes ({}) soft, {hard} hard",
            crate::tools::units::bytes(soft)
        );
        if view.transport == "tcp" {
            f.push(Finding::new(
                Severity::Info,
                check::MEMLOCK_LOW,
                "process RLIMIT_MEMLOCK",
                format!(
                    "{limit}: no matter here, the plugin carries this host over TCP and registers no memory with RDMA"
                ),
                format!("nothing for TCP; before using RoCE: {MEMLOCK_REMEDY}"),
            ));
        } else {
            let (sev, what) = if soft < MEMLOCK_ERROR_BELOW {
                (
                    Severity::Error,
                    "memory registration (ibv_reg_mr, QP and CQ creation) will fail with ENOMEM",
                )
            } else {
                (Severity::Warning, "large registrations may fail")
            };
            f.push(Finding::new(
                sev,
                check::MEMLOCK_LOW,
                "process RLIMIT_MEMLOCK",
                format!("{limit}: {what}"),
                MEMLOCK_REMEDY,
            ));
        }
    }
    // Point-to-point TCP links: MTU, offloads, receive queues, socket buffer limits.
    f.extend(super::tcp::checks(m));
    f
}
