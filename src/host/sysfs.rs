//! Readers of sysfs objects: PCI functions, netdevs, RDMA devices and their ports (GIDs, state,
//! rate, cages).

use std::collections::BTreeMap;

use super::ctx::Ctx;
use super::model::*;
use super::parse::{
    classify_gid, parse_gid, parse_guid, parse_rate_mbps, parse_state, pci_of_path,
};

/// Resolves `<dir>/device` to a PCI function, reading it into `pci` once.
pub(super) fn read_pci_of(
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

pub(super) fn read_pci_function(cx: &mut Ctx<'_>, path: &str, bdf: &str) -> PciFunction {
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

pub(super) fn read_netdev(
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

pub(super) fn read_rdma_device(
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

pub(super) fn read_port(
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

    let gids = match cx.r.gid_table(dev, port) {
        Some(t) => t.to_vec(),
        None => read_gids(cx, &dir),
    };
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

/// The populated GID slots of a port directory, one file per slot and attribute.
fn read_gids(cx: &mut Ctx<'_>, dir: &str) -> Vec<GidEntry> {
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
    gids
}
