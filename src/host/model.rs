//! The host model: RDMA devices → ports → netdevs → GID entries → addresses with their subnets; PCI
//! functions with their PCIe root, link and NUMA node; adapters and physical ports (cages).

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::Ipv4Net;
use serde::Serialize;

use crate::route::types::KernelRoute;

/// RoCE / IB version of a GID entry, from `gid_attrs/types/N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum GidType {
    /// "IB/RoCE v1" (IB link layer, or RoCE v1 on Ethernet).
    #[serde(rename = "IB/RoCE v1")]
    IbRoceV1,
    #[serde(rename = "RoCE v1")]
    RoceV1,
    #[serde(rename = "RoCE v2")]
    RoceV2,
    /// The type file was missing or unreadable (containers, NVIDIA/nccl PR #1427).
    #[serde(rename = "unknown")]
    Unknown,
}

impl GidType {
    pub fn parse(s: &str) -> Self {
        match s.trim() {
            "IB/RoCE v1" => GidType::IbRoceV1,
            "RoCE v1" => GidType::RoceV1,
            "RoCE v2" => GidType::RoceV2,
            _ => GidType::Unknown,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            GidType::IbRoceV1 => "IB/RoCE v1",
            GidType::RoceV1 => "RoCE v1",
            GidType::RoceV2 => "RoCE v2",
            GidType::Unknown => "unknown",
        }
    }
}

/// What a GID holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "addr")]
pub enum GidAddr {
    /// `::ffff:a.b.c.d`, the GID of an IPv4 address.
    Ipv4Mapped(Ipv4Addr),
    /// `fe80::/64`: made from the MAC, present even without an address. NCCL treats it as invalid.
    LinkLocal,
    /// Any other IPv6 address.
    Ipv6,
}

impl GidAddr {
    /// What `g` holds.
    pub fn of(g: Ipv6Addr) -> GidAddr {
        let s = g.segments();
        if s[0..5] == [0, 0, 0, 0, 0] && s[5] == 0xffff {
            let o = g.octets();
            GidAddr::Ipv4Mapped(Ipv4Addr::new(o[12], o[13], o[14], o[15]))
        } else if s[0] == 0xfe80 && s[1..4] == [0, 0, 0] {
            GidAddr::LinkLocal
        } else {
            GidAddr::Ipv6
        }
    }
}

/// One populated entry of a port's GID table (all-zero entries are left out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GidEntry {
    pub index: u32,
    pub gid: Ipv6Addr,
    pub addr: GidAddr,
    #[serde(rename = "type")]
    pub gid_type: GidType,
    /// The netdev this GID belongs to (`gid_attrs/ndevs/N`).
    pub ndev: Option<String>,
}

impl GidEntry {
    /// An entry as libibverbs reports it (`struct ibv_gid_entry`): `ibv_type` is
    /// `IBV_GID_TYPE_IB` 0, `_ROCE_V1` 1 or `_ROCE_V2` 2, recorded as sysfs names them (the kernel
    /// writes "IB/RoCE v1" for the first two), so both sources give the same model.
    pub fn from_library(index: u32, gid: [u8; 16], ibv_type: u32, ndev: Option<String>) -> Self {
        let gid = Ipv6Addr::from(gid);
        GidEntry {
            index,
            gid,
            addr: GidAddr::of(gid),
            gid_type: match ibv_type {
                0 | 1 => GidType::IbRoceV1,
                2 => GidType::RoceV2,
                _ => GidType::Unknown,
            },
            ndev,
        }
    }

    /// The IPv4 address when this is an IPv4-mapped RoCE v2 GID.
    pub fn ipv4_v2(&self) -> Option<Ipv4Addr> {
        match (self.addr, self.gid_type) {
            (GidAddr::Ipv4Mapped(a), GidType::RoceV2) => Some(a),
            _ => None,
        }
    }
}

/// One physical port (cage) of an adapter: the thing a cable plugs into.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Cage {
    /// Adapter identity: `guid:<sys_image_guid hex>` for RDMA adapters, `pci:<domain:bus:dev>` otherwise.
    pub adapter: String,
    /// Cage number on the adapter, from 0.
    pub index: u8,
}

/// An RDMA port (`/sys/class/infiniband/<dev>/ports/<n>`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RdmaPort {
    pub port: u8,
    /// Numeric port state (4 = ACTIVE) and its name, from `state` ("4: ACTIVE").
    pub state: u8,
    pub state_name: String,
    /// From `phys_state` ("5: LinkUp").
    pub phys_state: u8,
    pub phys_state_name: String,
    /// Port rate in Mb/s, from `rate` ("200 Gb/sec (4X HDR)").
    pub rate_mbps: Option<u32>,
    /// "Ethernet" or "InfiniBand".
    pub link_layer: String,
    pub gids: Vec<GidEntry>,
    /// The netdev of this port (from the GID table's ndevs, or the netdev on the same PCI function).
    pub netdev: Option<String>,
    /// The active IB MTU in bytes (256..4096). Derived here the way the kernel derives it for RoCE
    /// (largest IB MTU ≤ netdev MTU − 96 bytes of RoCE v2 headers); verbs can overwrite it.
    pub active_mtu: u32,
    /// Where `active_mtu` came from: "derived" (from the netdev MTU) or "verbs".
    pub active_mtu_source: String,
    /// The cage (adapter physical port) this port's traffic leaves through.
    pub cage: Cage,
}

impl RdmaPort {
    pub fn is_active(&self) -> bool {
        self.state == 4
    }
    pub fn is_ethernet(&self) -> bool {
        self.link_layer == "Ethernet"
    }
    /// IPv4-mapped RoCE v2 GIDs, lowest index first.
    pub fn ipv4_v2_gids(&self) -> impl Iterator<Item = (&GidEntry, Ipv4Addr)> {
        self.gids.iter().filter_map(|g| g.ipv4_v2().map(|a| (g, a)))
    }
}

/// An RDMA device (`/sys/class/infiniband/<dev>`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RdmaDevice {
    pub name: String,
    #[serde(serialize_with = "serialize_guid")]
    pub node_guid: u64,
    /// Shared by every function of one adapter (NCCL IB reports it as `guid`).
    #[serde(serialize_with = "serialize_guid")]
    pub sys_image_guid: u64,
    /// PCI function (`0000:01:00.0`) the device sits on; for a software device (rdma_rxe) the function
    /// of the netdev it runs over.
    pub pci: Option<String>,
    /// A software device (soft-RoCE `rdma_rxe`): its sysfs directory is under `/sys/devices/virtual/`.
    #[serde(default)]
    pub software: bool,
    pub ports: Vec<RdmaPort>,
}

/// An IPv4 address of a netdev with the prefix of its connected subnet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetAddr {
    /// Address / prefix of the connected route holding it (/32 when no connected route holds it).
    pub addr: Ipv4Net,
    /// "gid" (from an IPv4-mapped GID of this netdev) or "fib_trie" (from /proc/net/fib_trie).
    pub source: String,
    /// A connected route in /proc/net/route holds this address.
    pub has_route: bool,
}

/// A network interface (`/sys/class/net/<name>`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Netdev {
    pub name: String,
    pub mtu: Option<u32>,
    pub operstate: String,
    /// `carrier`: Some(true) when a cable and peer are up; None when unreadable (admin down).
    pub carrier: Option<bool>,
    pub mac: Option<String>,
    /// `speed` in Mb/s; None when unknown (-1, link down).
    pub speed_mbps: Option<u32>,
    pub phys_port_name: Option<String>,
    pub phys_switch_id: Option<String>,
    /// PCI function (`0000:01:00.0`), None for virtual netdevs.
    pub pci: Option<String>,
    pub addrs: Vec<NetAddr>,
    /// RDMA (device, port) pairs whose GIDs belong to this netdev.
    pub rdma: Vec<(String, u8)>,
}

impl Netdev {
    /// Operationally up with carrier.
    pub fn is_up(&self) -> bool {
        self.operstate == "up" && self.carrier != Some(false)
    }
}

/// A PCIe link's speed (GT/s) and width (lanes).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PcieLink {
    pub current_speed_gts: Option<f32>,
    pub current_width: Option<u32>,
    pub max_speed_gts: Option<f32>,
    pub max_width: Option<u32>,
}

impl PcieLink {
    /// Usable payload bandwidth of the current link in Mb/s (line rate × lanes × encoding efficiency).
    pub fn current_mbps(&self) -> Option<u32> {
        let (s, w) = (self.current_speed_gts?, self.current_width?);
        Some((f64::from(s) * f64::from(w) * encoding(s) * 1000.0) as u32)
    }
    /// The PCIe generation of a transfer rate.
    pub fn gen_of(speed_gts: f32) -> u32 {
        match speed_gts {
            s if s >= 64.0 => 6,
            s if s >= 32.0 => 5,
            s if s >= 16.0 => 4,
            s if s >= 8.0 => 3,
            s if s >= 5.0 => 2,
            _ => 1,
        }
    }
}

fn encoding(speed_gts: f32) -> f64 {
    if speed_gts >= 64.0 {
        242.0 / 256.0 // Gen6 FLIT mode
    } else if speed_gts >= 8.0 {
        128.0 / 130.0
    } else {
        0.8 // 8b/10b
    }
}

/// A PCI function (`/sys/devices/pci…/<bdf>`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PciFunction {
    /// `0000:01:00.0`.
    pub bdf: String,
    /// Full sysfs path (`/sys/devices/pci0000:00/0000:00:00.0/0000:01:00.0`), as NCCL expects `pciPath`.
    pub path: String,
    pub domain: u16,
    /// Host bridge and root port, e.g. `pci0000:00/0000:00:00.0`.
    pub root: String,
    pub vendor: Option<u16>,
    pub device: Option<u16>,
    pub numa_node: Option<i32>,
    pub link: PcieLink,
}

/// A neighbour (ARP) entry from `/proc/net/arp`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Neighbour {
    pub addr: Ipv4Addr,
    pub mac: String,
    /// ATF_COM (0x2): the entry resolved.
    pub complete: bool,
    pub ifname: String,
}

/// RLIMIT_MEMLOCK from `/proc/self/limits`, in bytes (None = unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Memlock {
    pub soft: Option<u64>,
    pub hard: Option<u64>,
}

/// Everything discovery learned about the host.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostModel {
    /// The root directory the files were read under.
    pub root: String,
    /// `/sys/class/infiniband` exists (the RDMA core is loaded).
    pub rdma_class_present: bool,
    pub rdma_devices: Vec<RdmaDevice>,
    pub netdevs: Vec<Netdev>,
    pub pci_functions: Vec<PciFunction>,
    pub kernel_routes: Vec<KernelRoute>,
    pub neighbours: Vec<Neighbour>,
    pub memlock: Option<Memlock>,
    /// A GPU peer-memory client is loaded (`nvidia_peermem` / `memory_peers/nv_mem`).
    pub peer_memory: bool,
    /// The NVIDIA GPU driver is loaded (`/sys/module/nvidia`): GPU buffers may reach the NICs.
    pub gpu_driver: bool,
    /// Point-to-point TCP links (netdevs without RDMA on a /30 or /31: [`crate::route::point_to_point`]) with
    /// their tuning (see [`crate::host::tcp`]).
    pub tcp_links: Vec<TcpLink>,
    /// Socket buffer limits (`/proc/sys/net/…`); read only when there is a TCP link.
    pub tcp_buffers: Option<BufferLimits>,
}

impl HostModel {
    pub fn netdev(&self, name: &str) -> Option<&Netdev> {
        self.netdevs.iter().find(|n| n.name == name)
    }
    pub fn pci(&self, bdf: &str) -> Option<&PciFunction> {
        self.pci_functions.iter().find(|p| p.bdf == bdf)
    }
    pub fn rdma_port(&self, dev: &str, port: u8) -> Option<(&RdmaDevice, &RdmaPort)> {
        let d = self.rdma_devices.iter().find(|d| d.name == dev)?;
        let p = d.ports.iter().find(|p| p.port == port)?;
        Some((d, p))
    }
    /// Every (device, port), in model order.
    pub fn ports(&self) -> impl Iterator<Item = (&RdmaDevice, &RdmaPort)> {
        self.rdma_devices
            .iter()
            .flat_map(|d| d.ports.iter().map(move |p| (d, p)))
    }
    /// Records an `active_mtu` learned from verbs (`ibv_query_port`), replacing the derived value.
    pub fn set_active_mtu(&mut self, dev: &str, port: u8, mtu: u32) {
        for d in self.rdma_devices.iter_mut().filter(|d| d.name == dev) {
            for p in d.ports.iter_mut().filter(|p| p.port == port) {
                p.active_mtu = mtu;
                p.active_mtu_source = "verbs".to_string();
            }
        }
    }
    /// Sorted list of every cage in the model; a cage's position is its compact `phys_port_id`.
    pub fn cages(&self) -> Vec<Cage> {
        let mut v: Vec<Cage> = self.ports().map(|(_, p)| p.cage.clone()).collect();
        for n in &self.netdevs {
            if n.rdma.is_empty() {
                if let Some(c) = netdev_cage(n) {
                    v.push(c);
                }
            }
        }
        v.sort();
        v.dedup();
        v
    }
}

/// Serializes a GUID as a hex string ("0x4cbb470300a1b2c0"): JSON numbers lose precision above 2^53.
pub fn serialize_guid<S: serde::Serializer>(g: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("0x{g:016x}"))
}

/// RoCE active MTU the kernel derives from a netdev MTU: the largest IB MTU ≤ MTU − 96 bytes
/// (GRH 40 + UDP 8 + BTH 12 + XRC 4 + AtomicETH 28 + ICRC 4, `iboe_get_mtu`). 1500 → 1024, ≥ 4192 → 4096.
pub fn roce_active_mtu(netdev_mtu: u32) -> u32 {
    let eff = netdev_mtu.saturating_sub(96);
    [4096, 2048, 1024, 512, 256]
        .into_iter()
        .find(|m| eff >= *m)
        .unwrap_or(256)
}

/// One feature line of `ethtool -k`: `on`/`off`, and `[fixed]` (the driver cannot change it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Toggle {
    pub on: bool,
    pub fixed: bool,
}

/// GRO and TSO of a netdev, from the text of `ethtool -k`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Features {
    /// The logical path the text was read from (`/ethtool-k/<if>`).
    pub source: String,
    /// `generic-receive-offload`.
    pub gro: Option<Toggle>,
    /// `tcp-segmentation-offload`.
    pub tso: Option<Toggle>,
}

/// A point-to-point TCP link (one per netdev: its first point-to-point address).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TcpLink {
    pub netdev: String,
    /// Address with the prefix of its connected subnet.
    pub addr: Ipv4Net,
    /// Why it is point-to-point: "/30" or "/31".
    pub point_to_point: String,
    /// What the link can carry, Mb/s: min(netdev speed, PCIe bandwidth); None when unknown.
    pub speed_mbps: Option<u32>,
    /// Netdev MTU, bytes.
    pub mtu: Option<u32>,
    pub up: bool,
    /// Active receive queues (`queues/rx-N` entries); None when unreadable.
    pub rx_queues: Option<u32>,
    /// Streams the TCP transport opens per path at this speed (`streams_for_speed`).
    pub streams: usize,
    /// GRO/TSO; None when no source was available.
    pub features: Option<Features>,
}

/// Socket buffer limits, bytes; None when the file is missing or unparsable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BufferLimits {
    /// `net.core.rmem_max`: cap of an explicit `SO_RCVBUF`.
    pub rmem_max: Option<u64>,
    /// `net.core.wmem_max`: cap of an explicit `SO_SNDBUF`.
    pub wmem_max: Option<u64>,
    /// Third field of `net.ipv4.tcp_rmem`: ceiling of receive autotuning.
    pub tcp_rmem_max: Option<u64>,
    /// Third field of `net.ipv4.tcp_wmem`: ceiling of send autotuning.
    pub tcp_wmem_max: Option<u64>,
}

/// PCI device ids of adapters whose two PCI functions on one PCIe link are the two halves of ONE cage:
/// ConnectX-8 (0x1023, `mt4131`), whose 800G OSFP cage shows as two 400G ports on DGX B300.
pub const SHARED_CAGE_DEVICE_IDS: &[u16] = &[0x1023];

/// Mellanox / NVIDIA networking PCI vendor id.
pub const MELLANOX_VENDOR: u16 = 0x15b3;

/// Cage of a netdev without RDMA: its PCI device and port number.
pub fn netdev_cage(n: &Netdev) -> Option<Cage> {
    let b = n.pci.as_deref()?;
    Some(Cage {
        adapter: format!("pci:{}", &b[..b.len().saturating_sub(2)]),
        index: port_number(Some(n), Some(b), 1),
    })
}

/// Port number on the adapter of a netdev: `phys_port_name` "p1" → 1, else the PCI function number.
pub(super) fn port_number(n: Option<&Netdev>, bdf: Option<&str>, rdma_port: u8) -> u8 {
    if let Some(p) = n
        .and_then(|n| n.phys_port_name.as_deref())
        .and_then(|s| s.strip_prefix('p'))
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse::<u8>().ok())
    {
        return p;
    }
    if let Some(f) = bdf
        .and_then(|b| b.rsplit('.').next())
        .and_then(|f| f.parse::<u8>().ok())
    {
        return f;
    }
    rdma_port.saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn active_mtu_follows_the_kernel() {
        assert_eq!(roce_active_mtu(1500), 1024);
        assert_eq!(roce_active_mtu(4200), 4096);
        assert_eq!(roce_active_mtu(4192), 4096);
        assert_eq!(roce_active_mtu(4191), 2048);
        assert_eq!(roce_active_mtu(9000), 4096);
        assert_eq!(roce_active_mtu(2200), 2048);
        assert_eq!(roce_active_mtu(0), 256);
    }

    #[test]
    fn pcie_bandwidth() {
        let l = PcieLink {
            current_speed_gts: Some(32.0),
            current_width: Some(4),
            max_speed_gts: Some(32.0),
            max_width: Some(4),
        };
        // Gen5 x4: 128 GT/s × 128/130 ≈ 126 Gb/s.
        assert_eq!(l.current_mbps(), Some(126030));
        assert_eq!(PcieLink::gen_of(32.0), 5);
        assert_eq!(PcieLink::gen_of(2.5), 1);
    }
}
