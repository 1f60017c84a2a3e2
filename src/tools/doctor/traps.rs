//! The doctor's checks of what owners of these fabrics trip over and discovery's model alone does
//! not show, over [`Facts`] read beside it: a GB10 port's two PCIe functions answering ARP for each
//! other (`arp-flux-risk`).

use std::collections::BTreeMap;

use super::facts::Facts;
use super::registry::check;
use crate::findings::{Finding, Severity};
use crate::host::HostModel;

/// Every check of this module.
/// `persist` is the command that writes this host's sysctl file of the plan.
pub fn checks(m: &HostModel, facts: &Facts, persist: &str) -> Vec<Finding> {
    let mut f = Vec::new();
    f.extend(arp_flux_risk(m, facts, persist));
    f
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
