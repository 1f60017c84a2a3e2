//! `switchless doctor`: checks over the host model, the port table, and the JSON report.

pub mod fleet;
pub mod fleet_render;
pub mod tcp;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::findings::{Finding, Severity, exit_status};
use crate::host::model::{GidAddr, HostModel, PcieLink};
use crate::host::nccl::{NcclDevice, PTR_CUDA, PTR_DMABUF, ptr_support_names};

/// Stable check ids (documented in docs/readme/fabric.md).
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
    pub const KERNEL_FILE: &str = crate::findings::CHECK_KERNEL_FILE;
    pub use super::tcp::check::*;
}

/// Below this RLIMIT_MEMLOCK (bytes) registration of NCCL's buffers fails: an error.
pub const MEMLOCK_ERROR_BELOW: u64 = 64 << 20;

fn port_obj(dev: &str, port: u8) -> String {
    format!("{dev} port {port}")
}

/// A port can carry traffic: ACTIVE, netdev up, and (Ethernet) an IPv4 RoCE v2 GID.
fn usable(m: &HostModel, dev: &str, port: u8) -> bool {
    let Some((_, p)) = m.rdma_port(dev, port) else {
        return false;
    };
    let up = p
        .netdev
        .as_deref()
        .and_then(|n| m.netdev(n))
        .is_none_or(|n| n.is_up());
    p.is_active() && up && (!p.is_ethernet() || p.ipv4_v2_gids().next().is_some())
}

fn fmt_link(speed: Option<f32>, width: Option<u32>) -> String {
    match (speed, width) {
        (Some(s), Some(w)) => format!("Gen{} x{w} ({s:.1} GT/s)", PcieLink::gen_of(s)),
        (Some(s), None) => format!("Gen{} ({s:.1} GT/s)", PcieLink::gen_of(s)),
        (None, Some(w)) => format!("x{w}"),
        (None, None) => "unknown".to_string(),
    }
}

fn fmt_short(speed: Option<f32>, width: Option<u32>) -> String {
    let g = speed
        .map(|s| format!("Gen{}", PcieLink::gen_of(s)))
        .unwrap_or_else(|| "Gen?".into());
    let w = width
        .map(|w| format!("x{w}"))
        .unwrap_or_else(|| "x?".into());
    format!("{g} {w}")
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

/// Every doctor check over the model. Discovery's own findings (`kernel-file`) are not repeated here.
pub fn checks(m: &HostModel, devices: &[NcclDevice]) -> Vec<Finding> {
    let mut f = Vec::new();

    if m.rdma_devices.is_empty() {
        let why = if m.rdma_class_present {
            "/sys/class/infiniband is empty: no RDMA device is registered"
        } else {
            "/sys/class/infiniband does not exist: the RDMA core (ib_core) or the NIC's RDMA driver is not loaded"
        };
        f.push(Finding::new(
            Severity::Error,
            check::NO_RDMA_DEVICES,
            "host",
            format!("no RDMA devices: {why}"),
            "load the RDMA driver (modprobe mlx5_ib for ConnectX); for a lab without RDMA hardware: modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <if>",
        ));
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
            f.push(Finding::new(
                sev,
                check::LINK_DOWN,
                nd.map(|n| format!("netdev {}", n.name)).unwrap_or(obj.clone()),
                format!("{obj} is {state}; {carrier}{}", if addressed { "; it has an address, so it is meant to carry traffic" } else { "; unused (no address)" }),
                "check the cable and the peer's port (ip link set <if> up; ethtool <if>); no carrier usually means no cable or the far end is down",
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
                    format!(
                        "assign an IPv4 address to {} (ip addr add <addr>/30 dev {}); the kernel then adds the ::ffff:<addr> RoCE v2 GID",
                        p.netdev.as_deref().unwrap_or("the netdev"),
                        p.netdev.as_deref().unwrap_or("<if>")
                    ),
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
            f.push(Finding::new(
                Severity::Warning,
                check::MULTIHOST_FUNCTION_IDLE,
                port_obj(d, *p),
                format!(
                    "{} (netdev {}, PCIe root {root}) serves the same cable as {} port {} but is {why}: that function's PCIe link and about half of the cable's bandwidth stay idle",
                    port_obj(d, *p),
                    port.netdev.as_deref().unwrap_or("none"),
                    good.0,
                    good.1
                ),
                format!(
                    "bring {} up with its own subnet (e.g. ip link set {0} up mtu 9000; ip addr add <addr>/30 dev {0}) so traffic is striped over both PCIe links",
                    port.netdev.as_deref().unwrap_or("<if>")
                ),
            ));
        }
    }

    // Netdevs: routes, neighbours, address without RDMA.
    let mut subnets: BTreeMap<ipnet::Ipv4Net, Vec<String>> = BTreeMap::new();
    for n in &m.netdevs {
        for a in &n.addrs {
            if !a.has_route {
                f.push(Finding::new(
                    Severity::Warning,
                    check::NO_CONNECTED_ROUTE,
                    format!("netdev {}", n.name),
                    format!("no connected route in /proc/net/route holds {} on {}; its subnet is unknown", a.addr.addr(), n.name),
                    format!("re-add the address with its prefix (ip addr replace {}/30 dev {})", a.addr.addr(), n.name),
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
    for (net, names) in &subnets {
        if names.len() > 1 {
            f.push(Finding::new(
                Severity::Error,
                check::SAME_SUBNET,
                format!("subnet {net}"),
                format!("{} all have addresses in {net}: the kernel routes the subnet through one of them only and RoCE connections on the others fail", names.join(", ")),
                "give every function / port its own subnet (one /30 or /31 per cable and function)",
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

    // Locked memory.
    if let Some(ml) = m.memlock {
        if let Some(soft) = ml.soft {
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
                format!(
                    "max locked memory is {soft} bytes ({} MiB) soft, {} hard: {what}",
                    soft >> 20,
                    ml.hard.map(|h| format!("{h} bytes")).unwrap_or_else(|| "unlimited".into())
                ),
                "set memlock unlimited: ulimit -l unlimited, '* - memlock unlimited' in /etc/security/limits.conf, LimitMEMLOCK=infinity for systemd, --ulimit memlock=-1 for docker",
            ));
        }
    }
    // Point-to-point TCP links: MTU, offloads, receive queues, socket buffer limits.
    f.extend(tcp::checks(m));
    let _ = devices;
    f
}

/// One row of the port table.
#[derive(Debug, Clone, Serialize)]
pub struct PortRow {
    pub device: String,
    pub port: u8,
    pub netdev: Option<String>,
    /// "ACTIVE", "DOWN", … (port state) and the netdev's operstate.
    pub state: String,
    pub operstate: Option<String>,
    pub addresses: Vec<AddrRow>,
    pub mtu: Option<u32>,
    pub active_mtu: u32,
    pub rate_mbps: Option<u32>,
    pub pci: Option<String>,
    pub pci_root: Option<String>,
    pub numa_node: Option<i32>,
    pub pcie: Option<PcieLink>,
    /// Name of the NCCL device this port belongs to.
    pub nccl_device: Option<String>,
    pub phys_port_id: Option<u16>,
}

/// An address of a port with its GID.
#[derive(Debug, Clone, Serialize)]
pub struct AddrRow {
    /// "a.b.c.d/len".
    pub addr: String,
    pub gid_index: Option<u32>,
    pub gid_type: Option<String>,
}

/// The whole report (`--json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Schema version of this document: "switchless-doctor/1".
    pub schema: &'static str,
    pub root: String,
    pub ports: Vec<PortRow>,
    pub nccl_devices: Vec<NcclDevice>,
    /// Point-to-point TCP links (netdevs without RDMA) with their tuning.
    pub tcp_links: Vec<crate::host::model::TcpLink>,
    /// Socket buffer limits; null when the host has no TCP link.
    pub tcp_buffers: Option<crate::host::model::BufferLimits>,
    pub findings: Vec<Finding>,
    pub exit_status: u8,
}

pub const SCHEMA: &str = "switchless-doctor/1";

/// Builds the report: port rows, devices, and the findings (discovery's first, then the checks').
pub fn report(m: &HostModel, devices: &[NcclDevice], mut findings: Vec<Finding>) -> Report {
    findings.extend(checks(m, devices));
    // Worst first; stable within a severity.
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
    let cages = m.cages();
    let mut ports = Vec::new();
    for (d, p) in m.ports() {
        let nd = p.netdev.as_deref().and_then(|n| m.netdev(n));
        let pf = d.pci.as_deref().and_then(|b| m.pci(b));
        let mut addresses = Vec::new();
        for (g, a) in p.ipv4_v2_gids() {
            let net = nd
                .and_then(|n| n.addrs.iter().find(|x| x.addr.addr() == a))
                .map(|x| x.addr.to_string())
                .unwrap_or_else(|| format!("{a}/32"));
            addresses.push(AddrRow {
                addr: net,
                gid_index: Some(g.index),
                gid_type: Some(g.gid_type.as_str().to_string()),
            });
        }
        ports.push(PortRow {
            device: d.name.clone(),
            port: p.port,
            netdev: p.netdev.clone(),
            state: p.state_name.clone(),
            operstate: nd.map(|n| n.operstate.clone()),
            addresses,
            mtu: nd.and_then(|n| n.mtu),
            active_mtu: p.active_mtu,
            rate_mbps: p.rate_mbps,
            pci: d.pci.clone(),
            pci_root: pf.map(|f| f.root.clone()),
            numa_node: pf.and_then(|f| f.numa_node),
            pcie: pf.map(|f| f.link),
            nccl_device: devices
                .iter()
                .find(|x| {
                    x.members
                        .iter()
                        .any(|mm| mm.rdma_dev == d.name && mm.port == p.port)
                })
                .map(|x| x.name.clone()),
            phys_port_id: cages
                .iter()
                .position(|c| *c == p.cage)
                .and_then(|i| u16::try_from(i).ok()),
        });
    }
    let exit_status = exit_status(&findings);
    Report {
        schema: SCHEMA,
        root: m.root.clone(),
        ports,
        nccl_devices: devices.to_vec(),
        tcp_links: m.tcp_links.clone(),
        tcp_buffers: m.tcp_buffers,
        findings,
        exit_status,
    }
}

/// The human-readable report.
pub fn render_text(r: &Report) -> String {
    let mut out = String::new();
    let header = [
        "DEVICE",
        "PORT",
        "NETDEV",
        "STATE",
        "ADDRESS",
        "GID",
        "MTU/ACTIVE",
        "PCIE ROOT",
        "PCIE LINK",
        "NCCL DEVICE",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    for p in &r.ports {
        let addr = if p.addresses.is_empty() {
            "-".to_string()
        } else {
            p.addresses
                .iter()
                .map(|a| a.addr.clone())
                .collect::<Vec<_>>()
                .join(",")
        };
        let gid = if p.addresses.is_empty() {
            "-".to_string()
        } else {
            p.addresses
                .iter()
                .map(|a| {
                    format!(
                        "{} {}",
                        a.gid_index.map(|i| i.to_string()).unwrap_or_default(),
                        a.gid_type.clone().unwrap_or_default()
                    )
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        let link = p
            .pcie
            .map(|l| {
                format!(
                    "{} (max {})",
                    fmt_short(l.current_speed_gts, l.current_width),
                    fmt_short(l.max_speed_gts, l.max_width)
                )
            })
            .unwrap_or_else(|| "-".to_string());
        rows.push(vec![
            p.device.clone(),
            p.port.to_string(),
            p.netdev.clone().unwrap_or_else(|| "-".into()),
            format!(
                "{}/{}",
                p.state,
                p.operstate.clone().unwrap_or_else(|| "-".into())
            ),
            addr,
            gid,
            format!(
                "{}/{}",
                p.mtu.map(|m| m.to_string()).unwrap_or_else(|| "?".into()),
                p.active_mtu
            ),
            p.pci_root.clone().unwrap_or_else(|| "-".into()),
            link,
            p.nccl_device.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    let ncol = header.len();
    let widths: Vec<usize> = (0..ncol)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    let _ = writeln!(out);
    if r.nccl_devices.is_empty() {
        let _ = writeln!(out, "NCCL devices: none");
    } else {
        let _ = writeln!(out, "NCCL devices:");
        for d in &r.nccl_devices {
            let members: Vec<String> = d
                .members
                .iter()
                .map(|m| {
                    format!(
                        "{}:{}({})",
                        m.rdma_dev,
                        m.port,
                        m.netdev.clone().unwrap_or_default()
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "  {} {}: {} Gb/s, guid 0x{:016x} port {}, rail {}, ptr {}, members {}",
                d.index,
                d.name,
                d.speed_mbps / 1000,
                d.guid,
                d.port,
                d.rail_id,
                ptr_support_names(d.ptr_support).join("|"),
                members.join(" + ")
            );
        }
    }
    if !r.tcp_links.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "TCP point-to-point links:");
        for t in &r.tcp_links {
            let toggle = |v: Option<crate::host::model::Toggle>| match v {
                Some(t) if t.on => "on",
                Some(_) => "off",
                None => "?",
            };
            let feat = t
                .features
                .as_ref()
                .map(|f| format!("GRO {}, TSO {}", toggle(f.gro), toggle(f.tso)))
                .unwrap_or_else(|| "GRO/TSO unchecked".into());
            let _ = writeln!(
                out,
                "  {} {} ({}): {}, MTU {} bytes, {} rx queues for {} streams, {}",
                t.netdev,
                t.addr,
                t.point_to_point,
                t.speed_mbps
                    .map(|s| format!("{s} Mb/s"))
                    .unwrap_or_else(|| "speed unknown".into()),
                t.mtu.map(|m| m.to_string()).unwrap_or_else(|| "?".into()),
                t.rx_queues
                    .map(|q| q.to_string())
                    .unwrap_or_else(|| "?".into()),
                t.streams,
                feat
            );
        }
        if let Some(b) = r.tcp_buffers {
            let v = |x: Option<u64>| x.map(|x| x.to_string()).unwrap_or_else(|| "?".into());
            let _ = writeln!(
                out,
                "  socket buffer limits (bytes): rmem_max {}, wmem_max {}, tcp_rmem max {}, tcp_wmem max {}",
                v(b.rmem_max),
                v(b.wmem_max),
                v(b.tcp_rmem_max),
                v(b.tcp_wmem_max)
            );
        }
    }
    let _ = writeln!(out);
    if r.findings.is_empty() {
        let _ = writeln!(out, "No findings: clean.");
    } else {
        for f in &r.findings {
            let sev = match f.severity {
                Severity::Info => "info",
                Severity::Warning => "WARNING",
                Severity::Error => "ERROR",
            };
            let _ = writeln!(
                out,
                "{sev} [{}] {}: {}\n    remedy: {}",
                f.check, f.object, f.message, f.remedy
            );
        }
    }
    out
}
