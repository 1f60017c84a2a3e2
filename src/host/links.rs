//! The local side of routing: [`LocalLink`]s and [`KernelRoute`]s from the host model.

use super::model::HostModel;
use super::nccl::NcclDevice;
use crate::route::types::{KernelRoute, LinkKind, LocalLink};

impl HostModel {
    /// One link per IPv4 address per netdev, ordered by netdev name then address. `speed_mbps` is
    /// min(port rate or netdev speed, PCIe bandwidth of the function): what the link can carry. A link is RoCE when
    /// an RDMA port of the netdev holds the address as an IPv4-mapped RoCE v2 GID (lowest such index),
    /// TCP otherwise. Netdevs with neither a PCI function nor an RDMA port (bridges, docker0) are left out.
    pub fn local_links(&self, devices: &[NcclDevice]) -> Vec<LocalLink> {
        let cages = self.cages();
        let mut out = Vec::new();
        for n in &self.netdevs {
            // Physical netdevs, and RoCE netdevs without a PCI function of their own (a bond over
            // RoCE LAG): their PCI function is the RDMA device's.
            let bdf = n.pci.clone().or_else(|| {
                n.rdma
                    .iter()
                    .find_map(|(d, p)| self.rdma_port(d, *p).and_then(|(d, _)| d.pci.clone()))
            });
            let Some(bdf) = bdf else {
                continue;
            };
            let pcie_mbps = self.pci(&bdf).and_then(|f| f.link.current_mbps());
            let pci_root = self.pci(&bdf).map(|f| f.root.clone()).unwrap_or_default();
            for a in &n.addrs {
                // The RDMA port and GID carrying this address.
                let mut roce = None;
                for (dev, port) in &n.rdma {
                    if let Some((_, p)) = self.rdma_port(dev, *port) {
                        if let Some((g, _)) = p.ipv4_v2_gids().find(|(g, ip)| {
                            *ip == a.addr.addr() && g.ndev.as_deref().is_none_or(|d| d == n.name)
                        }) {
                            roce = Some((dev.clone(), *port, g.index, p));
                            break;
                        }
                    }
                }
                let (kind, rdma_dev, port, gid_index, cage, speed, active_mtu, nccl_dev) =
                    match roce {
                        Some((dev, port, gi, p)) => {
                            let nccl = devices
                                .iter()
                                .find(|d| {
                                    d.members
                                        .iter()
                                        .any(|m| m.rdma_dev == dev && m.port == port)
                                })
                                .map(|d| d.index);
                            (
                                LinkKind::Roce,
                                Some(dev),
                                port,
                                Some(gi),
                                Some(p.cage.clone()),
                                min_opt(p.rate_mbps.or(n.speed_mbps), pcie_mbps),
                                p.active_mtu,
                                nccl,
                            )
                        }
                        None => (
                            LinkKind::Tcp,
                            None,
                            0,
                            None,
                            super::model::netdev_cage(n),
                            min_opt(n.speed_mbps, pcie_mbps),
                            0,
                            None,
                        ),
                    };
                let phys_port_id = cage
                    .and_then(|c| cages.iter().position(|x| *x == c))
                    .and_then(|p| u16::try_from(p).ok())
                    .unwrap_or(u16::MAX);
                out.push(LocalLink {
                    id: out.len(),
                    kind,
                    netdev: n.name.clone(),
                    rdma_dev,
                    port,
                    addr: a.addr,
                    gid_index,
                    pci_root: pci_root.clone(),
                    phys_port_id,
                    nccl_dev,
                    speed_mbps: speed.unwrap_or(0),
                    mtu: n.mtu.unwrap_or(0),
                    active_mtu,
                    up: n.is_up(),
                });
            }
        }
        out
    }

    /// The kernel's IPv4 routes (`/proc/net/route`), in file order.
    pub fn routes(&self) -> Vec<KernelRoute> {
        self.kernel_routes.clone()
    }
}

fn min_opt(a: Option<u32>, b: Option<u32>) -> Option<u32> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Whether a netdev's link is down, from its sysfs `operstate` and `carrier` (`None` when the
/// carrier file cannot be read, as for an interface set administratively down): `Some(why)` when
/// it is. `unknown` (drivers that do not report, loopback) and `dormant` count as up: only a state
/// that says no frame can pass is down.
pub fn link_down(operstate: &str, carrier: Option<&str>) -> Option<String> {
    let oper = operstate.trim();
    if matches!(oper, "down" | "lowerlayerdown" | "notpresent") {
        return Some(format!("operstate {oper}"));
    }
    (carrier.map(str::trim) == Some("0")).then(|| "carrier 0".to_string())
}

/// [`link_down`] of netdev `name` read through `reader` (`/sys/class/net/<name>/…`); `None` too
/// when there is no such netdev (nothing to judge by).
pub fn netdev_link_down(reader: &super::Reader, name: &str) -> Option<String> {
    if name.is_empty() || name.contains('/') {
        return None;
    }
    let dir = format!("/sys/class/net/{name}");
    let oper = reader.read(&format!("{dir}/operstate")).ok()?;
    let carrier = reader.read(&format!("{dir}/carrier")).ok();
    link_down(&oper, carrier.as_deref()).map(|why| format!("{name}: {why}"))
}

#[cfg(test)]
mod link_state_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_link_is_down_by_its_operstate_or_its_carrier() {
        assert_eq!(link_down("up\n", Some("1\n")), None);
        assert_eq!(link_down("unknown", None), None);
        assert_eq!(link_down("dormant", Some("1")), None);
        assert_eq!(link_down("up", Some("0")), Some("carrier 0".into()));
        assert_eq!(
            link_down("lowerlayerdown", Some("0")),
            Some("operstate lowerlayerdown".into())
        );
        // Set down by hand: the carrier file refuses to be read.
        assert_eq!(link_down("down", None), Some("operstate down".into()));
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "writes a temp dir on the host filesystem; Miri isolates it"
    )]
    fn a_netdev_is_read_under_the_root() {
        let dir = std::env::temp_dir().join(format!("swl-linkstate-{}", std::process::id()));
        let net = dir.join("sys/class/net/to2");
        std::fs::create_dir_all(&net).unwrap();
        std::fs::write(net.join("operstate"), "up\n").unwrap();
        std::fs::write(net.join("carrier"), "0\n").unwrap();
        let r = crate::host::Reader::new(&dir);
        assert_eq!(netdev_link_down(&r, "to2"), Some("to2: carrier 0".into()));
        assert_eq!(netdev_link_down(&r, "absent"), None);
        assert_eq!(netdev_link_down(&r, "../x"), None);
        std::fs::write(net.join("carrier"), "1\n").unwrap();
        assert_eq!(netdev_link_down(&r, "to2"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
