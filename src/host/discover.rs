//! Discovery: builds the [`HostModel`] from kernel files read through a [`Reader`] (the object
//! readers are in `sysfs.rs` and `procfs.rs`, the text parsers in `parse.rs`).
//!
//! Sources (all relative to the root):
//! * `/sys/class/infiniband/<dev>`: `node_guid`, `sys_image_guid`, `device` (link to the PCI function),
//!   `ports/<n>/{state,phys_state,rate,link_layer}`, `ports/<n>/gids/<i>`,
//!   `ports/<n>/gid_attrs/{types,ndevs}/<i>` (only for non-zero GIDs).
//! * `/sys/class/net/<if>`: `mtu`, `operstate`, `carrier`, `address`, `speed`, `phys_port_name`,
//!   `phys_switch_id`, `device` (link to the PCI function).
//! * The PCI function directory the `device` links resolve to: `vendor`, `device`, `numa_node`,
//!   `current_link_{speed,width}`, `max_link_{speed,width}`; its sysfs path gives the domain and root port.
//! * `/proc/net/route` (connected subnets), `/proc/net/fib_trie` (local addresses of netdevs without
//!   RDMA), `/proc/net/arp` (neighbours), `/proc/self/limits` (RLIMIT_MEMLOCK),
//!   `/sys/module/nvidia_peermem`, `/sys/kernel/mm/memory_peers/nv_mem{,_nc}` (GPU peer memory),
//!   `/sys/module/nvidia` (GPU driver).
//! * For point-to-point TCP links only ([`super::tcp`]): `/sys/class/net/<if>/queues`,
//!   `/proc/sys/net/{core/rmem_max,core/wmem_max,ipv4/tcp_rmem,ipv4/tcp_wmem}` and the `ethtool -k`
//!   text (`/ethtool-k/<if>` under a root; the tool itself on a live host when the reader allows it).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::ctx::Ctx;
use super::model::*;
use super::procfs::{read_arp, read_fib_trie_locals, read_memlock, read_routes};
use super::reader::Reader;
use super::sysfs::{read_netdev, read_rdma_device};
use crate::findings::Finding;
use crate::route::types::KernelRoute;

pub use super::model::{MELLANOX_VENDOR, SHARED_CAGE_DEVICE_IDS};
pub use super::parse::{classify_gid, parse_gid};
/// Check id of findings about kernel files that are missing or unparsable.
pub use crate::findings::CHECK_KERNEL_FILE;

/// Reads the host under `reader`'s root. Never fails: what cannot be read becomes a warning finding
/// (check id `kernel-file`) naming the file.
pub fn discover_with(reader: &Reader) -> (HostModel, Vec<Finding>) {
    let mut cx = Ctx {
        r: reader,
        findings: Vec::new(),
    };
    let mut pci: BTreeMap<String, PciFunction> = BTreeMap::new();

    let kernel_routes = read_routes(&mut cx);
    let neighbours = read_arp(&mut cx);
    let fib_locals = read_fib_trie_locals(&mut cx);
    let memlock = read_memlock(&mut cx);
    let peer_memory = [
        "/sys/module/nvidia_peermem",
        "/sys/kernel/mm/memory_peers/nv_mem",
        "/sys/kernel/mm/memory_peers/nv_mem_nc",
    ]
    .iter()
    .any(|p| reader.exists(p));
    let gpu_driver = reader.exists("/sys/module/nvidia");

    // Netdevs first (the RDMA ports point at them).
    let mut netdevs = Vec::new();
    let net_names = reader.list("/sys/class/net").unwrap_or_default();
    for name in net_names {
        if let Some(n) = read_netdev(&mut cx, &name, &mut pci) {
            netdevs.push(n);
        }
    }

    let rdma_class_present = reader.exists("/sys/class/infiniband");
    let mut rdma_devices = Vec::new();
    if rdma_class_present {
        match reader.list("/sys/class/infiniband") {
            Ok(names) => {
                for name in names {
                    if let Some(d) = read_rdma_device(&mut cx, &name, &mut pci, &netdevs) {
                        rdma_devices.push(d);
                    }
                }
            }
            Err(e) => cx.warn_file(
                "/sys/class/infiniband",
                format!("cannot list /sys/class/infiniband: {e}"),
            ),
        }
    }

    rdma_devices.sort_by_key(|d| natural_key(&d.name));
    netdevs.sort_by_key(|n| natural_key(&n.name));

    // Link ports and netdevs, derive active_mtu, cages and addresses.
    let pci_funcs: Vec<PciFunction> = pci.into_values().collect();
    // Software RDMA devices (rdma_rxe, siw) sit on no PCI function: use the function of the netdev
    // they run over, so locality (pciPath, PCIe root) still means something.
    for d in rdma_devices.iter_mut().filter(|d| d.pci.is_none()) {
        let fns: BTreeSet<&str> = d
            .ports
            .iter()
            .filter_map(|p| p.netdev.as_deref())
            .filter_map(|n| netdevs.iter().find(|x| x.name == n))
            .filter_map(|n| n.pci.as_deref())
            .collect();
        if fns.len() == 1 {
            d.pci = fns.into_iter().next().map(str::to_string);
        }
    }
    assign_cages(&mut rdma_devices, &netdevs, &pci_funcs);
    for d in &mut rdma_devices {
        for p in &mut d.ports {
            if let Some(nd) = p
                .netdev
                .as_ref()
                .and_then(|n| netdevs.iter_mut().find(|x| &x.name == n))
            {
                nd.rdma.push((d.name.clone(), p.port));
                if p.is_ethernet() {
                    if let Some(m) = nd.mtu {
                        p.active_mtu = roce_active_mtu(m);
                    }
                }
            }
        }
    }
    // RoCE netdevs: IPv4 addresses from the IPv4-mapped GIDs whose ndev is this netdev. A GID
    // names its netdev; the connected routes only guess (an address of one netdev lies inside a
    // narrower subnet of another when prefixes overlap), so an address a GID places is nobody
    // else's.
    let mut gid_placed: BTreeSet<Ipv4Addr> = BTreeSet::new();
    for nd in &mut netdevs {
        let mut seen = BTreeSet::new();
        for d in &rdma_devices {
            for p in &d.ports {
                for g in &p.gids {
                    if let GidAddr::Ipv4Mapped(a) = g.addr {
                        let mine = g.ndev.as_deref() == Some(nd.name.as_str())
                            || (g.ndev.is_none() && p.netdev.as_deref() == Some(nd.name.as_str()));
                        if mine && seen.insert(a) {
                            nd.addrs.push(net_addr(a, "gid", &nd.name, &kernel_routes));
                        }
                    }
                }
            }
        }
        gid_placed.extend(seen);
    }
    for nd in &mut netdevs {
        let mut seen: BTreeSet<Ipv4Addr> = nd.addrs.iter().map(|a| a.addr.addr()).collect();
        // Addresses without a GID (netdevs without RDMA): local addresses of /proc/net/fib_trie
        // assigned to the netdev whose connected route holds them.
        for a in &fib_locals {
            if seen.contains(a) || gid_placed.contains(a) {
                continue;
            }
            if connected_route_of(*a, &kernel_routes).map(|r| r.ifname.as_str())
                == Some(nd.name.as_str())
            {
                seen.insert(*a);
                nd.addrs
                    .push(net_addr(*a, "fib_trie", &nd.name, &kernel_routes));
            }
        }
        nd.addrs.sort_by_key(|a| a.addr.addr());
    }

    let mut model = HostModel {
        root: reader.root().display().to_string(),
        rdma_class_present,
        rdma_devices,
        netdevs,
        pci_functions: pci_funcs,
        kernel_routes,
        neighbours,
        memlock,
        peer_memory,
        gpu_driver,
        tcp_links: Vec::new(),
        tcp_buffers: None,
    };
    super::tcp::read_tcp(reader, &mut model, &mut cx.findings);
    (model, cx.findings)
}

/// Sort key that orders embedded numbers numerically (mlx5_2 < mlx5_10).
fn natural_key(s: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut num = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            num.push(c);
        } else {
            if !num.is_empty() {
                out.push((std::mem::take(&mut text), num.parse().unwrap_or(u64::MAX)));
                num.clear();
            }
            text.push(c);
        }
    }
    out.push((text, num.parse().unwrap_or(0)));
    out
}

fn net_addr(a: Ipv4Addr, source: &str, ifname: &str, routes: &[KernelRoute]) -> NetAddr {
    let route = routes
        .iter()
        .filter(|r| r.gateway.is_none() && r.ifname == ifname && r.dest.contains(&a))
        .max_by_key(|r| r.dest.prefix_len());
    let (addr, has_route) = match route {
        Some(r) => (
            Ipv4Net::new(a, r.dest.prefix_len()).unwrap_or_else(|_| Ipv4Net::from(a)),
            true,
        ),
        None => (Ipv4Net::from(a), false),
    };
    NetAddr {
        addr,
        source: source.to_string(),
        has_route,
    }
}

/// The most specific connected (gateway-less) route holding `a`.
fn connected_route_of(a: Ipv4Addr, routes: &[KernelRoute]) -> Option<&KernelRoute> {
    routes
        .iter()
        .filter(|r| r.gateway.is_none() && r.dest.prefix_len() > 0 && r.dest.contains(&a))
        .max_by_key(|r| r.dest.prefix_len())
}

/// Cages: ports of one adapter (same sys_image_guid) with the same port number share a cage — this
/// merges the multi-host functions of a GB10 (rocep1s0f0 on 0000:01 and roceP2p1s0f0 on 0002:01,
/// both `p0`). On adapters listed in [`SHARED_CAGE_DEVICE_IDS`] (ConnectX-8) every port of one PCI
/// device (domain:bus:dev) is one cage: the two 400G halves of an 800G cage on DGX B300.
fn assign_cages(devs: &mut [RdmaDevice], netdevs: &[Netdev], pci: &[PciFunction]) {
    for d in devs.iter_mut() {
        let f = d
            .pci
            .as_deref()
            .and_then(|b| pci.iter().find(|p| p.bdf == b));
        let shared = f
            .and_then(|f| f.device)
            .is_some_and(|id| SHARED_CAGE_DEVICE_IDS.contains(&id));
        let adapter = if d.sys_image_guid != 0 {
            format!("guid:{:016x}", d.sys_image_guid)
        } else {
            format!("rdma:{}", d.name)
        };
        let bdf = d.pci.clone();
        for p in d.ports.iter_mut() {
            let nd = p
                .netdev
                .as_deref()
                .and_then(|n| netdevs.iter().find(|x| x.name == n));
            let index = if shared {
                0
            } else {
                super::model::port_number(nd, bdf.as_deref(), p.port)
            };
            let adapter = if shared {
                // One cage per PCI device: the functions of one device share it.
                match bdf.as_deref() {
                    Some(b) => format!("{adapter}/{}", &b[..b.len().saturating_sub(2)]),
                    None => adapter.clone(),
                }
            } else {
                adapter.clone()
            };
            p.cage = Cage { adapter, index };
        }
    }
}
