//! The doctor's checks of what owners of these fabrics trip over and discovery's model alone does
//! not show, over [`Facts`] read beside it: a GB10 port's two PCIe functions answering ARP for each
//! other (`arp-flux-risk`), IPv6 privacy addresses shifting the GID table (`ipv6-temporary-address`),
//! a slot that gives the NIC too little power (`pcie-slot-power`), a NIC that reports PCIe Gen1 x1
//! (`pcie-gen1-x1`), NetworkManager running DHCP on a cable (`nm-manages-fabric-port`), and no
//! GPU-direct path where one is expected (`peermem-missing`).

use std::collections::BTreeMap;

use super::facts::Facts;
use super::registry::check;
use crate::findings::{Finding, Severity};
use crate::host::HostModel;

/// Every check of this module.
/// `persist` is the command that writes this host's sysctl file of the plan; `dmabuf_probed`: the
/// live host's drivers were asked about DMA-BUF (`gpu-direct-off` then judges GPU-direct instead).
pub fn checks(m: &HostModel, facts: &Facts, persist: &str, dmabuf_probed: bool) -> Vec<Finding> {
    let mut f = Vec::new();
    f.extend(arp_flux_risk(m, facts, persist));
    f.extend(ipv6_temporary(m, facts, persist));
    f.extend(slot_power(m, facts));
    f.extend(gen1_x1(m));
    f.extend(nm_manages(m, facts));
    if !dmabuf_probed {
        f.extend(peermem_missing(m, facts));
    }
    f
}

/// The netdevs a fabric runs on: RoCE netdevs with an address, and point-to-point TCP links.
fn fabric_netdevs(m: &HostModel) -> Vec<&str> {
    m.netdevs
        .iter()
        .filter(|n| {
            (!n.rdma.is_empty() && !n.addrs.is_empty())
                || m.tcp_links.iter().any(|t| t.netdev == n.name)
        })
        .map(|n| n.name.as_str())
        .collect()
}

/// IPv6 addresses of a RoCE netdev take GID slots; privacy (temporary) addresses come and go, so
/// the IPv4 RoCE v2 GID's index moves (3 on one CX-7 function, 5 on the other): a global
/// `NCCL_IB_GID_INDEX` then hangs a NIC, and a GID cached by NCCL goes stale after the next rotation.
fn ipv6_temporary(m: &HostModel, facts: &Facts, persist: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    for n in m.netdevs.iter().filter(|n| !n.rdma.is_empty()) {
        let temps: Vec<String> = facts
            .inet6
            .iter()
            .filter(|a| a.netdev == n.name && a.temporary)
            .map(|a| a.addr.to_string())
            .collect();
        if temps.is_empty() {
            continue;
        }
        let idx: Vec<String> = n
            .rdma
            .iter()
            .filter_map(|(d, p)| m.rdma_port(d, *p))
            .filter_map(|(d, p)| {
                p.ipv4_v2_gids()
                    .next()
                    .map(|(g, _)| format!("{} port {} GID {}", d.name, p.port, g.index))
            })
            .collect();
        out.push(Finding::new(
            Severity::Warning,
            check::IPV6_TEMPORARY_ADDRESS,
            format!("netdev {}", n.name),
            format!(
                "{} has IPv6 privacy (temporary) addresses ({}, use_tempaddr={}): each takes RoCE GID slots and \
                 they are replaced as they expire, so the IPv4 RoCE v2 GID's index moves ({}): a global \
                 NCCL_IB_GID_INDEX then gives this NIC a wrong GID, and a GID cached at connect time goes stale",
                n.name,
                temps.join(", "),
                facts
                    .use_tempaddr
                    .get(&n.name)
                    .map_or("?".to_string(), i8::to_string),
                if idx.is_empty() {
                    "none now".to_string()
                } else {
                    format!("now {}", idx.join(", "))
                }
            ),
            format!(
                "sysctl -w net.ipv6.conf.{0}.use_tempaddr=0; ip -6 addr flush dev {0} scope global temporary   # \
                 persist: {persist} (or net.ipv6.conf.{0}.disable_ipv6=1: RoCE v2 over IPv4 needs no IPv6)",
                n.name
            ),
        ));
    }
    out
}

/// A slot that grants the NIC too little power: ConnectX-7 then throttles (owners report about
/// 13 Gb/s), and only a cold power cycle clears it. From the captured Slot Power Limit (`lspci -vv`,
/// 0 W) or the driver's "insufficient power" warning.
fn slot_power(m: &HostModel, facts: &Facts) -> Vec<Finding> {
    let mut bdfs: Vec<&str> = facts
        .slot_power_w
        .iter()
        .filter(|(_, w)| **w <= 0.0)
        .map(|(b, _)| b.as_str())
        .chain(facts.power_warnings.iter().map(|(b, _)| b.as_str()))
        .collect();
    bdfs.sort_unstable();
    bdfs.dedup();
    bdfs.into_iter()
        .map(|b| {
            let mut why = Vec::new();
            if let Some(w) = facts.slot_power_w.get(b) {
                why.push(format!("lspci -vv shows SlotPowerLimit {w}W"));
            }
            for (_, l) in facts.power_warnings.iter().filter(|(x, _)| x == b) {
                why.push(format!("the kernel logged \"{l}\""));
            }
            let nd: Vec<&str> = m
                .netdevs
                .iter()
                .filter(|n| n.pci.as_deref() == Some(b))
                .map(|n| n.name.as_str())
                .collect();
            Finding::new(
                Severity::Warning,
                check::PCIE_SLOT_POWER,
                format!("pci {b}"),
                format!(
                    "{b}{}: {}; a ConnectX-7 short of slot power throttles its links (owners report about \
                     13 Gb/s instead of 100 per function)",
                    if nd.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", nd.join(", "))
                    },
                    why.join("; ")
                ),
                "power the box off and unplug it for 30 s (a warm reboot does not clear it), update the BIOS and \
                 the NIC firmware (fwupdmgr update), then check that lspci -vv shows a non-zero SlotPowerLimit",
            )
        })
        .collect()
}

/// A Mellanox function whose link reads PCIe Gen1 x1 (old OEM ConnectX-7 firmware reports so):
/// NCCL's topology then costs the NIC as a Gen1 x1 device, a fraction of a GB/s.
fn gen1_x1(m: &HostModel) -> Vec<Finding> {
    m.pci_functions
        .iter()
        .filter(|f| f.vendor == Some(crate::host::model::MELLANOX_VENDOR))
        .filter(|f| {
            f.link.current_width == Some(1) && f.link.current_speed_gts.is_some_and(|s| s < 5.0)
        })
        .map(|f| {
            Finding::new(
                Severity::Warning,
                check::PCIE_GEN1_X1,
                format!("pci {}", f.bdf),
                format!(
                    "{} reports its PCIe link as Gen1 x1 (2.5 GT/s x1; maximum {}): old OEM ConnectX-7 firmware reports \
                     this whatever the slot, and NCCL's topology then costs the NIC at a fraction of a GB/s and \
                     routes around it",
                    f.bdf,
                    match (f.link.max_speed_gts, f.link.max_width) {
                        (Some(s), Some(w)) => format!("{s} GT/s x{w}"),
                        _ => "unknown".to_string(),
                    }
                ),
                "update the ConnectX-7 firmware (fwupdmgr update, or mlxfwmanager -u), then recheck \
                 current_link_speed; until then give NCCL an NCCL_TOPO_FILE with the NIC's real PCIe speed",
            )
        })
        .collect()
}

/// NetworkManager managing a cabled port with an automatic (DHCP) profile: it finds no DHCP server
/// on a cable, gives up, and starts again (owners report a loop every ~45 s), resetting the address.
fn nm_manages(m: &HostModel, facts: &Facts) -> Vec<Finding> {
    let Some(nm) = &facts.nm else {
        return Vec::new();
    };
    let fabric = fabric_netdevs(m);
    let cabled: Vec<&str> = m
        .netdevs
        .iter()
        .filter(|n| !n.rdma.is_empty() && n.carrier == Some(true))
        .map(|n| n.name.as_str())
        .chain(fabric.iter().copied())
        .collect();
    let looping: Vec<&super::facts::NmDevice> = nm
        .iter()
        .filter(|d| cabled.contains(&d.device.as_str()))
        .filter(|d| {
            d.state.starts_with("connecting")
                || d.connection.starts_with("Wired connection")
                || (d.state == "disconnected" && d.connection.is_empty())
        })
        .collect();
    if looping.is_empty() {
        return Vec::new();
    }
    let names: Vec<&str> = looping.iter().map(|d| d.device.as_str()).collect();
    let what: Vec<String> = looping
        .iter()
        .map(|d| {
            format!(
                "{} ({}{})",
                d.device,
                d.state,
                if d.connection.is_empty() {
                    String::new()
                } else {
                    format!(", profile \"{}\"", d.connection)
                }
            )
        })
        .collect();
    vec![Finding::new(
        Severity::Warning,
        check::NM_MANAGES_FABRIC_PORT,
        format!("netdev {}", names.join("+")),
        format!(
            "NetworkManager runs an automatic profile on cabled fabric ports: {}; with no DHCP server on a cable it \
             retries every ~45 s and resets the port's addresses",
            what.join(", ")
        ),
        format!(
            "{}   # persist: the plan's netplan output (per-interface renderer networkd), or [keyfile] \
             unmanaged-devices={} in /etc/NetworkManager/conf.d/99-switchless.conf",
            names
                .iter()
                .map(|n| format!("nmcli device set {n} managed no"))
                .collect::<Vec<_>>()
                .join("; "),
            names
                .iter()
                .map(|n| format!("interface-name:{n}"))
                .collect::<Vec<_>>()
                .join(";")
        ),
    )]
}

/// The NVIDIA driver is loaded and RDMA devices are there, but no peer-memory client is, and (from
/// the kernel files alone) no DMA-BUF path either: NCCL stages GPU buffers through host memory
/// ("GPU Direct RDMA Disabled"). A GB10's GPU shares host memory, so no GPU-direct is expected there.
fn peermem_missing(m: &HostModel, facts: &Facts) -> Vec<Finding> {
    if !m.gpu_driver || m.peer_memory || m.rdma_devices.is_empty() {
        return Vec::new();
    }
    let names: Vec<&str> = m.netdevs.iter().map(|n| n.name.as_str()).collect();
    let integrated = facts.gpu_models.iter().any(|g| g.contains("GB10"))
        || (facts.gpu_models.is_empty()
            && crate::tools::plan::PortMap::builtin_like(&names).is_some_and(|p| p.name == "gb10"));
    if integrated {
        return Vec::new();
    }
    let open = facts
        .nvidia_version
        .as_deref()
        .map(|v| v.contains("Open Kernel Module"));
    let kernel_ok = facts.kernel.as_deref().and_then(kernel_at_least_5_12);
    let (sev, dmabuf) = match (open, kernel_ok) {
        (Some(true), Some(true)) => (
            Severity::Info,
            "DMA-BUF can stand in (NVIDIA's open kernel module, Linux 5.12 or newer): run switchless doctor on \
             the live host, which asks each RDMA driver",
        ),
        (Some(false), _) => (
            Severity::Warning,
            "and the NVIDIA kernel module is the proprietary one, which offers no DMA-BUF for RDMA",
        ),
        (_, Some(false)) => (
            Severity::Warning,
            "and the kernel is older than 5.12, which has no DMA-BUF for RDMA",
        ),
        _ => (
            Severity::Info,
            "whether DMA-BUF can stand in is unknown here (no /proc/driver/nvidia/version or kernel release)",
        ),
    };
    vec![Finding::new(
        sev,
        check::PEERMEM_MISSING,
        "host",
        format!(
            "the NVIDIA driver is loaded and the host has RDMA devices, but nvidia-peermem is not loaded{}{dmabuf}: \
             without either, NCCL moves GPU buffers through host memory (\"GPU Direct RDMA Disabled\" in its log)",
            if sev == Severity::Info { "; " } else { " " }
        ),
        "modprobe nvidia-peermem (and list it in /etc/modules-load.d/); if it fails with \"Invalid argument\", use \
         NVIDIA's open kernel modules on Linux 5.12 or newer for DMA-BUF instead",
    )]
}

/// Whether a kernel release (`6.8.0-45-generic`) is 5.12 or newer; `None` when unparsable.
fn kernel_at_least_5_12(release: &str) -> Option<bool> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major: u32 = it.next()?.parse().ok()?;
    let minor: u32 = it.next()?.parse().ok()?;
    Some((major, minor) >= (5, 12))
}

/// A GB10 port is reached by two PCIe functions on one wire (a CX-8 cage's halves are separate
/// ports). With both addressed and the kernel's ARP defaults (`arp_ignore=0`, `arp_announce=0`)
/// each function answers ARP for the other's address, so the peer may learn the wrong function's
/// MAC and RoCE frames for one land on the other.
fn arp_flux_risk(m: &HostModel, facts: &Facts, persist: &str) -> Vec<Finding> {
    // Netdevs that are up with an address, by (cage, logical port): one wire.
    let mut wires: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (_, p) in m.ports() {
        let Some(n) = p.netdev.as_deref().and_then(|n| m.netdev(n)) else {
            continue;
        };
        if !n.is_up() || n.addrs.is_empty() {
            continue;
        }
        let key = (
            format!("{}#{}", p.cage.adapter, p.cage.index),
            n.phys_port_name.clone().unwrap_or_default(),
        );
        let v = wires.entry(key).or_default();
        if !v.contains(&n.name) {
            v.push(n.name.clone());
        }
    }
    let mut out = Vec::new();
    for names in wires.values().filter(|v| v.len() > 1) {
        let loose: Vec<(&String, (u8, u8))> = names
            .iter()
            .filter_map(|n| facts.effective_arp(n).map(|e| (n, e)))
            .filter(|(_, (ign, ann))| *ign < 1 || *ann < 2)
            .collect();
        if loose.is_empty() {
            continue;
        }
        let addrs = |n: &str| {
            m.netdev(n)
                .map(|d| {
                    d.addrs
                        .iter()
                        .map(|a| a.addr.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default()
        };
        let which: Vec<String> = names
            .iter()
            .map(|n| format!("{n} ({})", addrs(n)))
            .collect();
        let settings: Vec<String> = loose
            .iter()
            .map(|(n, (i, a))| format!("{n} arp_ignore={i} arp_announce={a}"))
            .collect();
        let set: Vec<String> = loose
            .iter()
            .flat_map(|(n, _)| {
                [
                    format!("net.ipv4.conf.{n}.arp_ignore=1"),
                    format!("net.ipv4.conf.{n}.arp_announce=2"),
                ]
            })
            .collect();
        out.push(Finding::new(
            Severity::Warning,
            check::ARP_FLUX_RISK,
            format!("port {}", names.join("+")),
            format!(
                "the PCIe functions {} share one wire, and {} (the kernel's defaults answer ARP for any \
                 local address on any interface): the peer can learn one function's MAC for the other's address, \
                 so RoCE frames for one function land on the other and the cable's stripe breaks or halves",
                which.join(" and "),
                settings.join(", ")
            ),
            format!("sysctl -w {}   # persist: {persist}", set.join(" ")),
        ));
    }
    out
}
