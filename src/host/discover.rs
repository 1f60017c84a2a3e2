//! Discovery: builds the [`HostModel`] from kernel files read through a [`Reader`].
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
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::Ipv4Net;

use super::model::*;
use super::reader::Reader;
use crate::findings::{Finding, Severity};
use crate::route::types::KernelRoute;

/// PCI device ids of adapters whose two PCI functions on one PCIe link are the two halves of ONE cage:
/// ConnectX-8 (0x1023, `mt4131`), whose 800G OSFP cage shows as two 400G ports on DGX B300.
pub const SHARED_CAGE_DEVICE_IDS: &[u16] = &[0x1023];

/// Mellanox / NVIDIA networking PCI vendor id.
pub const MELLANOX_VENDOR: u16 = 0x15b3;

/// Check id of findings about kernel files that are missing or unparsable.
pub use crate::findings::CHECK_KERNEL_FILE;

struct Ctx<'a> {
    r: &'a Reader,
    findings: Vec<Finding>,
}

impl Ctx<'_> {
    fn warn_file(&mut self, path: &str, what: impl std::fmt::Display) {
        self.findings.push(Finding::new(
            Severity::Warning,
            CHECK_KERNEL_FILE,
            format!("file {path}"),
            format!("{what}"),
            "check that the driver is loaded and the file is readable (containers may hide sysfs entries)",
        ));
    }

    /// A file the model needs: missing or unreadable gives a warning.
    fn req(&mut self, path: &str) -> Option<String> {
        match self.r.read(path) {
            Ok(s) => Some(s),
            Err(e) => {
                self.warn_file(path, format!("cannot read {path}: {e}"));
                None
            }
        }
    }

    /// An optional file: absent on many hosts (phys_switch_id, speed while down…).
    fn opt(&self, path: &str) -> Option<String> {
        self.r.read(path).ok()
    }

    fn parse<T: std::str::FromStr>(&mut self, path: &str, s: &str, accepted: &str) -> Option<T> {
        match s.trim().parse::<T>() {
            Ok(v) => Some(v),
            Err(_) => {
                self.warn_file(path, format!("{path} holds {s:?}; expected {accepted}"));
                None
            }
        }
    }
}

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
    for nd in &mut netdevs {
        let mut seen = BTreeSet::new();
        // RoCE netdevs: IPv4 addresses from the IPv4-mapped GIDs whose ndev is this netdev.
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
        // Addresses without a GID (netdevs without RDMA): local addresses of /proc/net/fib_trie
        // assigned to the netdev whose connected route holds them.
        for a in &fib_locals {
            if seen.contains(a) {
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

/// The PCI function a device path sits on: the path itself, or its nearest PCI ancestor (virtio
/// netdevs link to `…/0000:00:03.0/virtio2`). Returns (function path, bdf).
fn pci_of_path(path: &str) -> Option<(String, String)> {
    let comps: Vec<&str> = path.split('/').collect();
    let i = comps.iter().rposition(|c| is_bdf(c))?;
    Some((comps[..=i].join("/"), comps[i].to_string()))
}

fn is_bdf(s: &str) -> bool {
    // dddd:bb:dd.f
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// Resolves `<dir>/device` to a PCI function, reading it into `pci` once.
fn read_pci_of(
    cx: &mut Ctx<'_>,
    dir: &str,
    pci: &mut BTreeMap<String, PciFunction>,
) -> Option<String> {
    let link = format!("{dir}/device");
    if !cx.r.exists(&link) {
        return None;
    }
    let path = match cx.r.resolve(&link) {
        Ok(p) => p,
        Err(e) => {
            cx.warn_file(&link, format!("cannot resolve {link}: {e}"));
            return None;
        }
    };
    let (path, bdf) = pci_of_path(&path)?;
    if pci.contains_key(&bdf) {
        return Some(bdf);
    }
    let f = read_pci_function(cx, &path, &bdf);
    pci.insert(bdf.clone(), f);
    Some(bdf)
}

fn read_pci_function(cx: &mut Ctx<'_>, path: &str, bdf: &str) -> PciFunction {
    // /sys/devices/pci0000:00/0000:00:00.0/0000:01:00.0 → root "pci0000:00/0000:00:00.0"
    let rel = path.trim_start_matches("/sys/devices/");
    let comps: Vec<&str> = rel.split('/').collect();
    let root = if comps.len() >= 2 && comps[0].starts_with("pci") {
        format!("{}/{}", comps[0], comps[1])
    } else {
        comps.first().map(|s| s.to_string()).unwrap_or_default()
    };
    let domain = u16::from_str_radix(&bdf[..4], 16).unwrap_or(0);
    let hex = |cx: &mut Ctx<'_>, f: &str| -> Option<u16> {
        let p = format!("{path}/{f}");
        let s = cx.req(&p)?;
        match u16::from_str_radix(s.trim().trim_start_matches("0x"), 16) {
            Ok(v) => Some(v),
            Err(_) => {
                cx.warn_file(
                    &p,
                    format!("{p} holds {s:?}; expected a hex id like 0x15b3"),
                );
                None
            }
        }
    };
    let vendor = hex(cx, "vendor");
    let device = hex(cx, "device");
    let numa_node = cx
        .opt(&format!("{path}/numa_node"))
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|n| *n >= 0);
    let speed = |cx: &mut Ctx<'_>, f: &str| -> Option<f32> {
        let p = format!("{path}/{f}");
        let s = cx.opt(&p)?;
        // "32.0 GT/s PCIe" (5.x+), "8 GT/s", "Unknown"
        let num = s.split_whitespace().next()?;
        if num == "Unknown" {
            return None;
        }
        match num.parse::<f32>() {
            Ok(v) => Some(v),
            Err(_) => {
                cx.warn_file(
                    &p,
                    format!("{p} holds {s:?}; expected e.g. \"32.0 GT/s PCIe\""),
                );
                None
            }
        }
    };
    let width = |cx: &mut Ctx<'_>, f: &str| -> Option<u32> {
        let p = format!("{path}/{f}");
        let s = cx.opt(&p)?;
        match s.trim().parse::<u32>() {
            Ok(0) => None,
            Ok(v) => Some(v),
            Err(_) => {
                cx.warn_file(&p, format!("{p} holds {s:?}; expected a lane count"));
                None
            }
        }
    };
    let link = PcieLink {
        current_speed_gts: speed(cx, "current_link_speed"),
        current_width: width(cx, "current_link_width"),
        max_speed_gts: speed(cx, "max_link_speed"),
        max_width: width(cx, "max_link_width"),
    };
    PciFunction {
        bdf: bdf.to_string(),
        path: path.to_string(),
        domain,
        root,
        vendor,
        device,
        numa_node,
        link,
    }
}

fn read_netdev(
    cx: &mut Ctx<'_>,
    name: &str,
    pci: &mut BTreeMap<String, PciFunction>,
) -> Option<Netdev> {
    let dir = format!("/sys/class/net/{name}");
    if name == "lo" || !cx.r.exists(&format!("{dir}/mtu")) {
        // Loopback, or a non-netdev entry (bonding_masters).
        return None;
    }
    let mtu_s = cx.req(&format!("{dir}/mtu"));
    let mtu = mtu_s.and_then(|s| cx.parse::<u32>(&format!("{dir}/mtu"), &s, "an MTU in bytes"));
    let operstate = cx
        .req(&format!("{dir}/operstate"))
        .unwrap_or_else(|| "unknown".to_string());
    let carrier = cx
        .opt(&format!("{dir}/carrier"))
        .and_then(|s| match s.trim() {
            "1" => Some(true),
            "0" => Some(false),
            _ => None,
        });
    let mac = cx.opt(&format!("{dir}/address"));
    let speed_mbps = cx
        .opt(&format!("{dir}/speed"))
        .and_then(|s| s.trim().parse::<i64>().ok())
        .filter(|v| *v > 0)
        .and_then(|v| u32::try_from(v).ok());
    let phys_port_name = cx
        .opt(&format!("{dir}/phys_port_name"))
        .filter(|s| !s.is_empty());
    let phys_switch_id = cx
        .opt(&format!("{dir}/phys_switch_id"))
        .filter(|s| !s.is_empty());
    let pci_bdf = read_pci_of(cx, &dir, pci);
    Some(Netdev {
        name: name.to_string(),
        mtu,
        operstate,
        carrier,
        mac,
        speed_mbps,
        phys_port_name,
        phys_switch_id,
        pci: pci_bdf,
        addrs: Vec::new(),
        rdma: Vec::new(),
    })
}

fn parse_guid(s: &str) -> Option<u64> {
    let h: String = s.trim().chars().filter(|c| *c != ':').collect();
    if h.len() != 16 {
        return None;
    }
    u64::from_str_radix(&h, 16).ok()
}

/// "4: ACTIVE" → (4, "ACTIVE").
fn parse_state(s: &str) -> Option<(u8, String)> {
    let (n, name) = s.split_once(':')?;
    Some((n.trim().parse().ok()?, name.trim().to_string()))
}

/// "200 Gb/sec (4X HDR)" → 200000 Mb/s; "2.5 Gb/sec (1X SDR)" → 2500.
fn parse_rate_mbps(s: &str) -> Option<u32> {
    let mut it = s.split_whitespace();
    let v: f64 = it.next()?.parse().ok()?;
    let unit = it.next()?;
    let mult = match unit {
        "Gb/sec" => 1000.0,
        "Mb/sec" => 1.0,
        _ => return None,
    };
    Some((v * mult).round() as u32)
}

/// Parses a sysfs GID ("fe80:0000:…", eight groups of four hex digits).
pub fn parse_gid(s: &str) -> Option<Ipv6Addr> {
    let groups: Vec<&str> = s.trim().split(':').collect();
    if groups.len() != 8 {
        return None;
    }
    let mut seg = [0u16; 8];
    for (i, g) in groups.iter().enumerate() {
        if g.is_empty() || g.len() > 4 {
            return None;
        }
        seg[i] = u16::from_str_radix(g, 16).ok()?;
    }
    Some(Ipv6Addr::from(seg))
}

pub fn classify_gid(g: Ipv6Addr) -> GidAddr {
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

fn read_rdma_device(
    cx: &mut Ctx<'_>,
    name: &str,
    pci: &mut BTreeMap<String, PciFunction>,
    netdevs: &[Netdev],
) -> Option<RdmaDevice> {
    let dir = format!("/sys/class/infiniband/{name}");
    let guid = |cx: &mut Ctx<'_>, f: &str| -> u64 {
        let p = format!("{dir}/{f}");
        match cx.req(&p) {
            Some(s) => match parse_guid(&s) {
                Some(g) => g,
                None => {
                    cx.warn_file(
                        &p,
                        format!("{p} holds {s:?}; expected a GUID like 4cbb:4703:00a1:b2c0"),
                    );
                    0
                }
            },
            None => 0,
        }
    };
    let node_guid = guid(cx, "node_guid");
    let sys_image_guid = guid(cx, "sys_image_guid");
    let pci_bdf = read_pci_of(cx, &dir, pci);
    // Hardware devices live under their PCI function; rdma_rxe registers a virtual device.
    let software =
        cx.r.resolve(&dir)
            .is_ok_and(|p| p.starts_with("/sys/devices/virtual/"));
    let mut ports = Vec::new();
    let port_names = match cx.r.list(&format!("{dir}/ports")) {
        Ok(v) => v,
        Err(e) => {
            cx.warn_file(
                &format!("{dir}/ports"),
                format!("cannot list {dir}/ports: {e}"),
            );
            Vec::new()
        }
    };
    let mut nums: Vec<u8> = port_names.iter().filter_map(|s| s.parse().ok()).collect();
    nums.sort();
    for n in nums {
        ports.push(read_port(cx, name, n, pci_bdf.as_deref(), netdevs));
    }
    Some(RdmaDevice {
        name: name.to_string(),
        node_guid,
        sys_image_guid,
        pci: pci_bdf,
        software,
        ports,
    })
}

fn read_port(
    cx: &mut Ctx<'_>,
    dev: &str,
    port: u8,
    pci_bdf: Option<&str>,
    netdevs: &[Netdev],
) -> RdmaPort {
    let dir = format!("/sys/class/infiniband/{dev}/ports/{port}");
    let state_of = |cx: &mut Ctx<'_>, f: &str| -> (u8, String) {
        let p = format!("{dir}/{f}");
        match cx.req(&p) {
            Some(s) => match parse_state(&s) {
                Some(v) => v,
                None => {
                    cx.warn_file(&p, format!("{p} holds {s:?}; expected e.g. \"4: ACTIVE\""));
                    (0, "unknown".to_string())
                }
            },
            None => (0, "unknown".to_string()),
        }
    };
    let (state, state_name) = state_of(cx, "state");
    let (phys_state, phys_state_name) = state_of(cx, "phys_state");
    let rate_mbps = match cx.req(&format!("{dir}/rate")) {
        Some(s) => {
            let v = parse_rate_mbps(&s);
            if v.is_none() {
                cx.warn_file(
                    &format!("{dir}/rate"),
                    format!("{dir}/rate holds {s:?}; expected e.g. \"200 Gb/sec (4X HDR)\""),
                );
            }
            v
        }
        None => None,
    };
    let link_layer = cx
        .req(&format!("{dir}/link_layer"))
        .unwrap_or_else(|| "unknown".to_string());

    let mut gids = Vec::new();
    let idx: Vec<u32> = match cx.r.list(&format!("{dir}/gids")) {
        Ok(v) => v.iter().filter_map(|s| s.parse().ok()).collect(),
        Err(e) => {
            cx.warn_file(
                &format!("{dir}/gids"),
                format!("cannot list {dir}/gids: {e}"),
            );
            Vec::new()
        }
    };
    let mut idx = idx;
    idx.sort();
    for i in idx {
        let gp = format!("{dir}/gids/{i}");
        // Unpopulated slots read as all zeros, or fail with EINVAL in some kernels/containers.
        let Some(s) = cx.opt(&gp) else { continue };
        let Some(gid) = parse_gid(&s) else {
            cx.warn_file(
                &gp,
                format!(
                    "{gp} holds {s:?}; expected a GID like fe80:0000:0000:0000:0000:0000:0000:0001"
                ),
            );
            continue;
        };
        if gid.is_unspecified() {
            continue;
        }
        let gid_type = cx
            .opt(&format!("{dir}/gid_attrs/types/{i}"))
            .map(|s| GidType::parse(&s))
            .unwrap_or(GidType::Unknown);
        let ndev = cx
            .opt(&format!("{dir}/gid_attrs/ndevs/{i}"))
            .filter(|s| !s.is_empty());
        gids.push(GidEntry {
            index: i,
            gid,
            addr: classify_gid(gid),
            gid_type,
            ndev,
        });
    }
    // The port's netdev: the most common ndev of its GIDs; else the netdev on the same PCI function
    // with the same port number (phys_port_name) or the only one.
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for g in &gids {
        if let Some(n) = &g.ndev {
            *count.entry(n.as_str()).or_default() += 1;
        }
    }
    let netdev = count
        .iter()
        .max_by_key(|(_, c)| **c)
        .map(|(n, _)| n.to_string())
        .or_else(|| {
            let on_fn: Vec<&Netdev> = netdevs
                .iter()
                .filter(|n| pci_bdf.is_some() && n.pci.as_deref() == pci_bdf)
                .collect();
            if on_fn.len() == 1 {
                Some(on_fn[0].name.clone())
            } else {
                on_fn
                    .iter()
                    .find(|n| {
                        n.phys_port_name.as_deref() == Some(&format!("p{}", port.saturating_sub(1)))
                    })
                    .map(|n| n.name.clone())
            }
        });
    RdmaPort {
        port,
        state,
        state_name,
        phys_state,
        phys_state_name,
        rate_mbps,
        link_layer,
        gids,
        netdev,
        active_mtu: 1024,
        active_mtu_source: "derived".to_string(),
        cage: Cage {
            adapter: String::new(),
            index: 0,
        },
    }
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

/// `/proc/net/route`: Iface Destination Gateway Flags RefCnt Use Metric Mask … (hex in the host's byte
/// order; every supported host — x86-64, AArch64 — is little-endian, which is what the files hold).
fn read_routes(cx: &mut Ctx<'_>) -> Vec<KernelRoute> {
    let path = "/proc/net/route";
    let Some(s) = cx.req(path) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, line) in s.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        let parsed = (|| {
            if f.len() < 8 {
                return None;
            }
            let h = |x: &str| {
                u32::from_str_radix(x, 16)
                    .ok()
                    .map(|v| Ipv4Addr::from(v.to_le_bytes()))
            };
            let dest = h(f[1])?;
            let gw = h(f[2])?;
            let flags = u32::from_str_radix(f[3], 16).ok()?;
            let metric: u32 = f[6].parse().ok()?;
            let mask = h(f[7])?;
            let prefix = u32::from(mask).leading_ones() as u8;
            Some((dest, gw, flags, metric, prefix))
        })();
        match parsed {
            Some((dest, gw, flags, metric, prefix)) => {
                if flags & 0x1 == 0 {
                    continue; // RTF_UP not set
                }
                let Ok(net) = Ipv4Net::new(dest, prefix) else { continue };
                out.push(KernelRoute {
                    dest: net,
                    gateway: (flags & 0x2 != 0).then_some(gw),
                    ifname: f[0].to_string(),
                    metric,
                });
            }
            None => cx.warn_file(
                path,
                format!("{path} line {}: {line:?} is not Iface Destination Gateway Flags RefCnt Use Metric Mask …", i + 1),
            ),
        }
    }
    out
}

/// `/proc/net/arp`: IP address, HW type, Flags, HW address, Mask, Device.
fn read_arp(cx: &mut Ctx<'_>) -> Vec<Neighbour> {
    let path = "/proc/net/arp";
    let Some(s) = cx.opt(path) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in s.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 {
            continue;
        }
        let (Ok(addr), Ok(flags)) = (
            f[0].parse::<Ipv4Addr>(),
            u32::from_str_radix(f[2].trim_start_matches("0x"), 16),
        ) else {
            cx.warn_file(
                path,
                format!("{path}: line {line:?} is not IP HWtype Flags HWaddress Mask Device"),
            );
            continue;
        };
        out.push(Neighbour {
            addr,
            mac: f[3].to_string(),
            complete: flags & 0x2 != 0,
            ifname: f[5].to_string(),
        });
    }
    out
}

/// Local IPv4 addresses from `/proc/net/fib_trie` (leaves followed by "/32 host LOCAL"), loopback excluded.
/// The file does not name interfaces; callers assign each address to the netdev whose connected route
/// holds it.
fn read_fib_trie_locals(cx: &mut Ctx<'_>) -> Vec<Ipv4Addr> {
    let Some(s) = cx.opt("/proc/net/fib_trie") else {
        return Vec::new();
    };
    let mut out = BTreeSet::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in s.lines() {
        let t = line.trim_start_matches([' ', '|', '+', '-']).trim();
        if let Ok(a) = t.parse::<Ipv4Addr>() {
            last = Some(a);
        } else if t.starts_with("/32 host LOCAL") {
            if let Some(a) = last.filter(|a| !a.is_loopback()) {
                out.insert(a);
            }
        }
    }
    out.into_iter().collect()
}

/// "Max locked memory  8388608  8388608  bytes" from `/proc/self/limits`.
fn read_memlock(cx: &mut Ctx<'_>) -> Option<Memlock> {
    let path = "/proc/self/limits";
    let s = cx.req(path)?;
    let line = s.lines().find(|l| l.starts_with("Max locked memory"));
    let Some(line) = line else {
        cx.warn_file(path, format!("{path} has no \"Max locked memory\" line"));
        return None;
    };
    let f: Vec<&str> = line["Max locked memory".len()..]
        .split_whitespace()
        .collect();
    let val = |x: &str| -> Result<Option<u64>, ()> {
        if x == "unlimited" {
            Ok(None)
        } else {
            x.parse::<u64>().map(Some).map_err(|_| ())
        }
    };
    match (f.first().map(|x| val(x)), f.get(1).map(|x| val(x))) {
        (Some(Ok(soft)), Some(Ok(hard))) => Some(Memlock { soft, hard }),
        _ => {
            cx.warn_file(
                path,
                format!("{path}: {line:?} is not \"Max locked memory <soft> <hard> bytes\""),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_formats() {
        assert_eq!(parse_rate_mbps("200 Gb/sec (4X HDR)"), Some(200_000));
        assert_eq!(parse_rate_mbps("2.5 Gb/sec (1X SDR)"), Some(2_500));
        assert_eq!(parse_rate_mbps("fast"), None);
        assert_eq!(parse_state("4: ACTIVE"), Some((4, "ACTIVE".into())));
        assert_eq!(parse_state("ACTIVE"), None);
        assert_eq!(
            parse_guid("4cbb:4703:00a1:b2c0"),
            Some(0x4cbb_4703_00a1_b2c0)
        );
        assert_eq!(parse_guid("4cbb:4703"), None);
        let g = parse_gid("0000:0000:0000:0000:0000:ffff:c0a8:640a").unwrap();
        assert_eq!(
            classify_gid(g),
            GidAddr::Ipv4Mapped(Ipv4Addr::new(192, 168, 100, 10))
        );
        let g = parse_gid("fe80:0000:0000:0000:4ebb:47ff:fe00:0001").unwrap();
        assert_eq!(classify_gid(g), GidAddr::LinkLocal);
        assert!(
            parse_gid("0000:0000:0000:0000:0000:0000:0000:0000")
                .unwrap()
                .is_unspecified()
        );
        assert!(parse_gid("zz").is_none());
        assert!(is_bdf("0002:01:00.1"));
        assert!(!is_bdf("pci0000:00"));
    }
}
