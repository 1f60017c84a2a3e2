//! NCCL devices: the RDMA ports the plugin exposes, with the functions that serve one cage merged.
//!
//! Rules (see docs/guide/doctor.md):
//! * A port is a candidate when it passes the `NCCL_IB_HCA` filter, is ACTIVE, has the Ethernet link layer
//!   and holds an IPv4-mapped RoCE v2 GID. Down or unaddressed ports cannot carry a connection;
//!   InfiniBand ports are left to NCCL's own IB transport.
//! * Candidates in the same cage (same adapter `sys_image_guid` and physical port — see
//!   `discover::assign_cages`) become ONE device; the transport stripes over its members.
//! * Devices are ordered by the PCI path of their primary member (the member with the lowest PCI path),
//!   as NCCL IB orders its devices with `NCCL_IB_DEVICE_PCI_ORDER=1`, so indices agree across nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use serde::Serialize;

use super::model::{Cage, HostModel};

/// `NCCL_PTR_HOST`.
pub const PTR_HOST: u32 = 0x1;
/// `NCCL_PTR_CUDA`.
pub const PTR_CUDA: u32 = 0x2;
/// `NCCL_PTR_DMABUF`.
pub const PTR_DMABUF: u32 = 0x4;

/// 1 TiB: the largest `maxP2pBytes` NCCL accepts (and what NCCL IB reports).
pub const MAX_P2P_BYTES: u64 = 1 << 40;
/// Grouped receives per `irecv` (NCCL IB reports 8).
pub const MAX_RECVS: i32 = 8;
/// `maxComms` when verbs has not told `max_qp` (the plugin may replace it).
pub const DEFAULT_MAX_COMMS: i32 = 65536;
/// The share of a PCIe link's encoded rate that carries payload: transaction-layer headers and
/// flow control at 256-byte payloads leave about 80 % (a GB10's Gen5 x4 function, 126 Gb/s
/// encoded, moves 93–100 Gb/s of RDMA data).
pub const PCIE_PAYLOAD_EFFICIENCY: f64 = 0.8;

/// The physical PCIe link of function `bdf` (`0000:01:00.1` -> `0000:01:00`): the functions of
/// one device share it.
fn pcie_link_of(bdf: &str) -> String {
    bdf.rsplit_once('.').map_or(bdf, |(dev, _)| dev).to_string()
}

/// One RDMA port inside an NCCL device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Member {
    pub rdma_dev: String,
    pub port: u8,
    pub netdev: Option<String>,
    /// PCI function (`0000:01:00.0`) and its PCIe root (`pci0000:00/0000:00:00.0`).
    pub pci_bdf: Option<String>,
    pub pci_root: Option<String>,
    /// NUMA node of the PCI function (`None`: unknown, or the kernel says -1).
    #[serde(default)]
    pub numa_node: Option<i32>,
    /// This member's share of the device speed in Mb/s (see [`NcclDevice::speed_mbps`]).
    pub speed_mbps: u32,
    /// Payload bandwidth of the function's current PCIe link in Mb/s (the tuner's node bound when
    /// cables share PCIe roots); `None` when sysfs does not say.
    #[serde(default)]
    pub pcie_mbps: Option<u32>,
}

/// What the plugin reports to NCCL for one device (`getProperties`) plus its members.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NcclDevice {
    /// Index in the plugin's device list.
    pub index: usize,
    /// `sl_<netdev of the primary member>` (e.g. `sl_enp1s0f0np0`): never `mlx5_*`, because NCCL 2.30
    /// shares topology XML nodes by name with its own IB (GIN/RMA) devices.
    pub name: String,
    pub members: Vec<Member>,
    /// Sysfs path of the primary member's PCI function, e.g. `/sys/devices/pci0000:00/0000:00:00.0/0000:01:00.0`.
    pub pci_path: String,
    /// The adapter's `sys_image_guid`, or when that is 0 a hash of the PCI device (JSON: hex string).
    #[serde(serialize_with = "super::model::serialize_guid")]
    pub guid: u64,
    /// Sum over the cage's logical ports of min(port rate, PCIe payload bandwidth of the members on
    /// that port), in Mb/s. A member's share is its link's encoded rate × [`PCIE_PAYLOAD_EFFICIENCY`],
    /// divided among the cages whose functions sit on that link. A GB10 cage with both functions,
    /// the other port unused: min(200, 2 × 126 × 0.8) = 200 Gb/s; both ports used (they share the two
    /// x4 links): 100.8 Gb/s each, about 200 for the NIC; one function alone: 100.8 Gb/s. A B300
    /// CX-8 cage: 400 + 400 Gb/s.
    pub speed_mbps: u32,
    /// Cage number on the adapter + 1, unique per guid (NCCL treats equal guid + port as one
    /// physical port).
    pub port: u8,
    /// µs; 0 = NCCL's default.
    pub latency_us: f32,
    pub max_comms: i32,
    pub max_recvs: i32,
    /// Bitmask of [`PTR_HOST`], [`PTR_CUDA`], [`PTR_DMABUF`].
    pub ptr_support: u32,
    pub max_p2p_bytes: u64,
    /// Peer set: devices facing the same set of far addresses share one (numbered in device order);
    /// -1 when it faces none. Shown by doctor; NCCL's v12 `railId` comes from `NCCL_IB_HCA` only.
    pub rail_id: i16,
    /// v12 plane: -1 (a switchless mesh has no independent planes).
    pub plane_id: i16,
    /// Compact id of the cage (index into `HostModel::cages`).
    pub phys_port_id: u16,
    /// Far addresses this device reaches: for /30 and /31 subnets the other host address, for wider
    /// subnets the complete neighbour (ARP) entries of the member netdevs in that subnet.
    pub peers: Vec<Ipv4Addr>,
}

/// A candidate member: (PCI path, member, port rate Mb/s, PCIe Mb/s, logical port).
type Cand = (String, Member, Option<u32>, Option<u32>, String);

/// The `NCCL_IB_HCA` filter: (rdma device, port) → keep?
pub type HcaFilter<'a> = &'a dyn Fn(&str, u8) -> bool;

/// Which RDMA devices (by name) register DMA-BUF memory: the plugin probes each opened device
/// (`verbs::probe_dmabuf`); offline callers (doctor, route) pass `&|_| false`.
pub type DmabufFilter<'a> = &'a dyn Fn(&str) -> bool;

pub use crate::route::point_to_point_peers;

impl HostModel {
    /// The far addresses reachable from `netdev` through its subnets (see [`NcclDevice::peers`]).
    pub fn far_addresses(&self, netdev: &str) -> Vec<Ipv4Addr> {
        let Some(n) = self.netdev(netdev) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for a in n.addrs.iter().filter(|a| a.has_route) {
            let net = a.addr.trunc();
            if let Some(peers) = point_to_point_peers(a.addr) {
                out.extend(peers);
                continue;
            }
            match a.addr.prefix_len() {
                32 => {}
                _ => {
                    for nb in self.neighbours.iter().filter(|nb| {
                        nb.complete
                            && nb.ifname == n.name
                            && net.contains(&nb.addr)
                            && nb.addr != a.addr.addr()
                    }) {
                        out.push(nb.addr);
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// The NCCL devices of this host. `filter` is the parsed `NCCL_IB_HCA` (applied before grouping);
    /// `dmabuf` says which RDMA devices take DMA-BUF registrations: a device gets [`PTR_DMABUF`] only
    /// when every member does (NCCL registers one buffer on all of them).
    pub fn nccl_devices(&self, filter: HcaFilter<'_>, dmabuf: DmabufFilter<'_>) -> Vec<NcclDevice> {
        let cages = self.cages();
        // Group candidate ports by cage.
        let mut groups: BTreeMap<Cage, Vec<(String, u8)>> = BTreeMap::new();
        for (d, p) in self.ports() {
            // RoCE only: routing works on the IPv4 subnets of the RoCE v2 GIDs; InfiniBand ports are left
            // to NCCL's own IB transport.
            if !filter(&d.name, p.port) || !p.is_active() || !p.is_ethernet() {
                continue;
            }
            if p.ipv4_v2_gids().next().is_none() {
                continue;
            }
            groups
                .entry(p.cage.clone())
                .or_default()
                .push((d.name.clone(), p.port));
        }
        let base_ptr_support = PTR_HOST | if self.peer_memory { PTR_CUDA } else { 0 };
        // The cages whose ports sit on each physical PCIe link (the functions of one PCIe device
        // share its link: a GB10's two QSFP ports are functions 0 and 1 of the same two x4 links).
        let mut link_users: BTreeMap<String, BTreeSet<Cage>> = BTreeMap::new();
        for (cage, ports) in &groups {
            for (dev, port) in ports {
                if let Some(bdf) = self
                    .rdma_port(dev, *port)
                    .and_then(|(d, _)| d.pci.as_deref())
                {
                    link_users
                        .entry(pcie_link_of(bdf))
                        .or_default()
                        .insert(cage.clone());
                }
            }
        }

        let mut devs: Vec<NcclDevice> = Vec::new();
        for (cage, ports) in groups {
            let mut members: Vec<Cand> = Vec::new();
            for (dev, port) in ports {
                let Some((d, p)) = self.rdma_port(&dev, port) else {
                    continue;
                };
                let f = d.pci.as_deref().and_then(|b| self.pci(b));
                let nd = p.netdev.as_deref().and_then(|n| self.netdev(n));
                let rate = p.rate_mbps.or(nd.and_then(|n| n.speed_mbps));
                // What the function's link carries for this cage: its payload rate, shared evenly
                // among the cages on the link.
                let users = d
                    .pci
                    .as_deref()
                    .and_then(|b| link_users.get(&pcie_link_of(b)))
                    .map_or(1, |u| u.len().max(1)) as f64;
                let pcie = f
                    .and_then(|f| f.link.current_mbps())
                    .map(|m| (f64::from(m) * PCIE_PAYLOAD_EFFICIENCY / users) as u32);
                // Logical port on the adapter: the phys_port_name (multi-host functions share it).
                let logical = nd
                    .and_then(|n| n.phys_port_name.clone())
                    .unwrap_or_else(|| format!("{}:{}", d.name, port));
                members.push((
                    f.map(|f| f.path.clone()).unwrap_or_default(),
                    Member {
                        rdma_dev: dev.clone(),
                        port,
                        netdev: p.netdev.clone(),
                        pci_bdf: d.pci.clone(),
                        pci_root: f.map(|f| f.root.clone()),
                        numa_node: f.and_then(|f| f.numa_node).filter(|n| *n >= 0),
                        speed_mbps: 0,
                        pcie_mbps: pcie,
                    },
                    rate,
                    pcie,
                    logical,
                ));
            }
            if members.is_empty() {
                continue;
            }
            members.sort_by(|a, b| {
                (&a.0, &a.1.rdma_dev, a.1.port).cmp(&(&b.0, &b.1.rdma_dev, b.1.port))
            });
            // Speed: per logical port, min(rate, Σ PCIe shares of its members); split evenly.
            let mut by_logical: BTreeMap<String, Vec<usize>> = BTreeMap::new();
            for (i, m) in members.iter().enumerate() {
                by_logical.entry(m.4.clone()).or_default().push(i);
            }
            let mut total: u64 = 0;
            let mut shares = vec![0u32; members.len()];
            for idx in by_logical.values() {
                let rate = idx.iter().filter_map(|i| members[*i].2).max();
                let pcie_sum: Option<u64> = idx
                    .iter()
                    .map(|i| members[*i].3.map(u64::from))
                    .sum::<Option<u64>>();
                let s = match (rate, pcie_sum) {
                    (Some(r), Some(p)) => u64::from(r).min(p),
                    (Some(r), None) => u64::from(r),
                    (None, Some(p)) => p,
                    (None, None) => 0,
                };
                total += s;
                for i in idx {
                    shares[*i] = (s / idx.len() as u64) as u32;
                }
            }
            let first = &members[0];
            let primary_netdev = first
                .1
                .netdev
                .clone()
                .unwrap_or_else(|| format!("{}_{}", first.1.rdma_dev, first.1.port));
            let guid = self
                .rdma_port(&first.1.rdma_dev, first.1.port)
                .map(|(d, _)| d.sys_image_guid)
                .filter(|g| *g != 0)
                .unwrap_or_else(|| fallback_guid(&first.1));
            let mut peers = Vec::new();
            for m in &members {
                if let Some(n) = &m.1.netdev {
                    peers.extend(self.far_addresses(n));
                }
            }
            peers.sort();
            peers.dedup();
            let pci_path = first.0.clone();
            let ptr_support = base_ptr_support
                | if members.iter().all(|m| dmabuf(&m.1.rdma_dev)) {
                    PTR_DMABUF
                } else {
                    0
                };
            let members: Vec<Member> = members
                .into_iter()
                .zip(shares)
                .map(|(m, s)| Member {
                    speed_mbps: s,
                    ..m.1
                })
                .collect();
            devs.push(NcclDevice {
                index: 0,
                name: format!("sl_{primary_netdev}"),
                members,
                pci_path,
                guid,
                speed_mbps: u32::try_from(total).unwrap_or(u32::MAX),
                port: cage.index.saturating_add(1),
                latency_us: 0.0,
                max_comms: DEFAULT_MAX_COMMS,
                max_recvs: MAX_RECVS,
                ptr_support,
                max_p2p_bytes: MAX_P2P_BYTES,
                rail_id: -1,
                plane_id: -1,
                phys_port_id: cages
                    .iter()
                    .position(|c| *c == cage)
                    .and_then(|p| u16::try_from(p).ok())
                    .unwrap_or(u16::MAX),
                peers,
            });
        }
        devs.sort_by(|a, b| (&a.pci_path, &a.name).cmp(&(&b.pci_path, &b.name)));
        distinct_ports(&mut devs);
        // Rails: one per distinct non-empty peer set, numbered in device order.
        let mut rails: Vec<Vec<Ipv4Addr>> = Vec::new();
        for (i, d) in devs.iter_mut().enumerate() {
            d.index = i;
            if d.peers.is_empty() {
                continue;
            }
            let r = match rails.iter().position(|p| *p == d.peers) {
                Some(r) => r,
                None => {
                    rails.push(d.peers.clone());
                    rails.len() - 1
                }
            };
            d.rail_id = i16::try_from(r).unwrap_or(-1);
        }
        devs
    }
}

/// A stable 64-bit id (FNV-1a of `s`): the same name gives the same id on every node and run.
pub fn stable_guid(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The guid of an adapter whose `sys_image_guid` is 0 or unreadable: a hash of its PCI device
/// (`domain:bus:dev`, so the functions of one adapter agree), else of the RDMA device name. NCCL
/// takes equal guid + port for one physical port and subtracts its bandwidth once; with 0 on every
/// such device, all of them would look like one port.
fn fallback_guid(m: &Member) -> u64 {
    match m.pci_bdf.as_deref().and_then(|b| b.rsplit_once('.')) {
        Some((dev, _function)) => stable_guid(&format!("pci:{dev}")),
        None => stable_guid(&format!("rdma:{}", m.rdma_dev)),
    }
}

/// Every device is its own cage, so no two may report the same guid + port (NCCL would count them
/// as one physical port). The cage number alone does not guarantee it: a ConnectX-8 cage is one PCI
/// device and always has number 0, so two cages of one adapter identity would both say port 1. A
/// device whose pair is taken gets the next free port number of its guid, in device (PCI) order, so
/// identical nodes agree.
fn distinct_ports(devs: &mut [NcclDevice]) {
    let mut taken: std::collections::BTreeSet<(u64, u8)> = std::collections::BTreeSet::new();
    for d in devs.iter_mut() {
        while taken.contains(&(d.guid, d.port)) && d.port < u8::MAX {
            d.port += 1;
        }
        taken.insert((d.guid, d.port));
    }
}

/// Names of the bits of a `ptrSupport` mask ("host", "cuda", "dmabuf").
pub fn ptr_support_names(bits: u32) -> Vec<&'static str> {
    let mut v = Vec::new();
    if bits & PTR_HOST != 0 {
        v.push("host");
    }
    if bits & PTR_CUDA != 0 {
        v.push("cuda");
    }
    if bits & PTR_DMABUF != 0 {
        v.push("dmabuf");
    }
    v
}
