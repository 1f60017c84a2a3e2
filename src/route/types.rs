//! Inputs of routing, shared by `host` (which produces the local side from the host model) and by the
//! handle decoder (which produces the remote side). This is the contract between those layers.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

/// What kind of path a link can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    /// A RoCE port: an RDMA device port with an IPv4 RoCE v2 GID on this address.
    Roce,
    /// A plain IPv4 netdev with no RDMA device (TCP transport).
    Tcp,
}

/// One local link: one IPv4 address on one netdev (a netdev with two addresses gives two links).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalLink {
    /// Index of this link in the host's link list (stable for a given host model).
    pub id: usize,
    pub kind: LinkKind,
    /// Kernel netdev name, e.g. `enp1s0f0np0`.
    pub netdev: String,
    /// RDMA device and port (RoCE links only), e.g. `rocep1s0f0`, 1.
    pub rdma_dev: Option<String>,
    pub port: u8,
    /// The address with the prefix of its connected subnet, e.g. 10.0.0.1/30.
    pub addr: Ipv4Net,
    /// Index of the IPv4-mapped RoCE v2 GID of `addr` on this port (RoCE links only).
    pub gid_index: Option<u32>,
    /// PCIe root of the function (e.g. `pci0000:00/0000:00:01.0`); striping balances across these.
    pub pci_root: String,
    /// Compact id of (adapter, physical port): links with equal ids share a cable.
    pub phys_port_id: u16,
    /// The NCCL device (index into the plugin's device list) this link belongs to, if exposed.
    pub nccl_dev: Option<usize>,
    /// Link speed in Mb/s.
    pub speed_mbps: u32,
    /// Netdev MTU in bytes and, for RoCE, the active IB MTU in bytes (256..4096).
    pub mtu: u32,
    pub active_mtu: u32,
    /// Operational state is up (carrier present).
    pub up: bool,
}

/// A route of the kernel's main table, as read from `/proc/net/route` (IPv4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelRoute {
    /// Destination network (0.0.0.0/0 for the default route).
    pub dest: Ipv4Net,
    /// Gateway; `None` for a connected (on-link) route.
    pub gateway: Option<std::net::Ipv4Addr>,
    /// Outgoing interface.
    pub ifname: String,
    pub metric: u32,
}

/// One link address the peer advertises in its listen handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemoteLink {
    /// Address with its prefix length.
    pub addr: Ipv4Net,
    /// The peer's compact id of (adapter, physical port) / PCIe root for this address.
    pub phys_port_id: u16,
    /// The peer's compact id of the PCIe root of this address's function (added by `route`; in a
    /// decoded handle both ids are handle-local indices 0..=15). Striping alternates these.
    #[serde(default)]
    pub pci_root_id: u16,
    pub kind: LinkKind,
}

/// Whether a subnet is a cable: a /30 or a /31 (one address at each end). A wider subnet is not, even
/// with a single neighbour today (a two-node management LAN, a lab hub). The one rule for TCP data
/// paths, the doctor's TCP link checks and the NCCL devices' far ends.
pub fn point_to_point(net: Ipv4Net) -> bool {
    matches!(net.prefix_len(), 30 | 31)
}

/// The far end(s) of a point-to-point subnet: the partner of a /31, the other host of a /30 (both
/// hosts when the address itself is not one of them). `None` for any other prefix.
pub fn point_to_point_peers(a: Ipv4Net) -> Option<Vec<Ipv4Addr>> {
    let me = u32::from(a.addr());
    match a.prefix_len() {
        31 => Some(vec![Ipv4Addr::from(me ^ 1)]),
        30 => {
            let base = u32::from(a.network());
            Some(
                [base + 1, base + 2]
                    .into_iter()
                    .filter(|h| *h != me)
                    .map(Ipv4Addr::from)
                    .collect(),
            )
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_30_or_31_is_a_cable() {
        let p2p = |s: &str| point_to_point(s.parse().unwrap());
        assert!(p2p("10.0.0.1/30") && p2p("10.0.0.0/31"));
        assert!(!p2p("10.0.0.1/29") && !p2p("10.0.0.1/32") && !p2p("192.168.1.5/24"));
        let peers = |s: &str| point_to_point_peers(s.parse().unwrap());
        assert_eq!(
            peers("10.0.0.1/30"),
            Some(vec!["10.0.0.2".parse().unwrap()])
        );
        assert_eq!(
            peers("10.0.0.3/31"),
            Some(vec!["10.0.0.2".parse().unwrap()])
        );
        assert_eq!(peers("10.0.0.1/29"), None);
    }
}
