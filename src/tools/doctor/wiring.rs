//! Who faces whom on each wire, from evidence rather than addresses: the fleet's hosts
//! ([`HostInput`]), the MAC of every netdev, and the MACs each netdev's neighbour table (and a
//! `--probe`) saw. An address can be copied or a cable swapped while every address still pairs up;
//! the MAC that answers cannot lie about which port it is.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use super::facts::Facts;
use super::probe::Probe;
use crate::findings::Finding;
use crate::host::HostModel;

/// One host of the fleet: its name, what discovery made of it, and what beside it was read.
#[derive(Debug, Clone)]
pub struct HostInput {
    pub name: String,
    pub model: HostModel,
    /// Discovery's own findings (`kernel-file`), passed to the single-host report.
    pub discovery: Vec<Finding>,
    /// Facts beyond the model (ARP settings, …), for the single-host report.
    pub facts: Facts,
    /// The tree's `--probe` result, if it was captured with one.
    pub probe: Option<Probe>,
}

impl HostInput {
    /// A host from its model alone (no facts, no probe).
    pub fn new(name: impl Into<String>, model: HostModel, discovery: Vec<Finding>) -> HostInput {
        HostInput {
            name: name.into(),
            model,
            discovery,
            facts: Facts::default(),
            probe: None,
        }
    }
}

/// A netdev of the fleet: (host index, netdev name).
pub type Port = (usize, String);

/// Every netdev's MAC (lower case) → the netdev. A MAC found on two hosts (cloned machines, made-up
/// trees) proves nothing and is left out.
#[derive(Debug, Default)]
pub struct Owners {
    map: BTreeMap<String, Port>,
}

impl Owners {
    pub fn of(hosts: &[HostInput]) -> Owners {
        let mut all: BTreeMap<String, Vec<Port>> = BTreeMap::new();
        for (i, h) in hosts.iter().enumerate() {
            for n in &h.model.netdevs {
                if let Some(mac) = n.mac.as_deref().filter(|m| *m != "00:00:00:00:00:00") {
                    all.entry(mac.to_ascii_lowercase())
                        .or_default()
                        .push((i, n.name.clone()));
                }
            }
        }
        let map = all
            .into_iter()
            .filter(|(_, v)| v.iter().all(|p| p.0 == v[0].0))
            .map(|(k, v)| (k, v[0].clone()))
            .collect();
        Owners { map }
    }

    pub fn get(&self, mac: &str) -> Option<&Port> {
        self.map.get(&mac.to_ascii_lowercase())
    }
}

/// The adapter cage (the thing a cable plugs into) of a netdev, as text.
pub fn cage_of(m: &HostModel, netdev: &str) -> Option<String> {
    wire_of(m, netdev).map(|(cage, _)| cage)
}

/// The wire a netdev is on: its adapter cage and logical port (`phys_port_name`). A GB10 port's two
/// PCIe functions share one; a CX-8 cage's two halves are two.
pub fn wire_of(m: &HostModel, netdev: &str) -> Option<(String, String)> {
    let n = m.netdev(netdev)?;
    let cage = n
        .rdma
        .first()
        .and_then(|(d, p)| m.rdma_port(d, *p))
        .map(|(_, p)| p.cage.clone())
        .or_else(|| crate::host::model::netdev_cage(n))?;
    Some((
        format!("{}#{}", cage.adapter, cage.index),
        n.phys_port_name.clone().unwrap_or_else(|| n.name.clone()),
    ))
}

/// What the evidence says about the far end of a path `(host a, netdev na) → address x`, held by
/// `(host b, netdev nb)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// The MAC that answered for x is nb's, or nb's wire answered a probe.
    Holder,
    /// The MAC that answered for x is another netdev on nb's wire (the other PCIe function): ARP
    /// flux.
    OtherFunction(String),
    /// The wire of na reaches another port: this (host, netdev) answered.
    Elsewhere(Port),
    /// Nothing seen.
    Unknown,
}

/// How the neighbour entry (or the probe) of `na` on host `a` sees the holder `(b, nb)` of `x`.
pub fn seen(
    hosts: &[HostInput],
    owners: &Owners,
    a: usize,
    na: &str,
    x: Ipv4Addr,
    b: usize,
    nb: &str,
) -> Seen {
    let hb = &hosts[b].model;
    let wire_b = wire_of(hb, nb);
    let on_b_wire =
        |p: &Port| p.0 == b && (p.1 == nb || (wire_b.is_some() && wire_of(hb, &p.1) == wire_b));
    let arp = hosts[a]
        .model
        .neighbours
        .iter()
        .find(|e| e.complete && e.ifname == na && e.addr == x)
        .and_then(|e| owners.get(&e.mac));
    if let Some(p) = arp {
        return if *p == (b, nb.to_string()) {
            Seen::Holder
        } else if on_b_wire(p) {
            Seen::OtherFunction(p.1.clone())
        } else {
            Seen::Elsewhere(p.clone())
        };
    }
    let far: Vec<&Port> = hosts[a]
        .probe
        .as_ref()
        .and_then(|pr| pr.wires.get(na))
        .map(|w| {
            w.far_macs
                .iter()
                .filter_map(|m| owners.get(m))
                .filter(|p| p.0 != a)
                .collect()
        })
        .unwrap_or_default();
    if far.is_empty() {
        return Seen::Unknown;
    }
    if far.iter().any(|p| on_b_wire(p)) {
        return Seen::Holder;
    }
    Seen::Elsewhere(far[0].clone())
}
