//! What the tuner knows about the fabric: the net plugin's devices (each a cable when its addresses are
//! point-to-point), their speeds and PCIe roots, and NCCL's nNodes and nRanks; and the class the tuner
//! puts the communicator in ([`classify`]).
//!
//! The net plugin knows the far-end address of each cable but not which host owns it, so the shape is
//! inferred from counts. With C cables and N hosts: C < N − 1 means some hosts are not neighbours (a
//! GB10 ring of 4); C ≥ N − 1 is taken as a full mesh with C / (N − 1) cables per peer. Every input is
//! local to the host, so every host must see the same cabling (same cables up at job start, same speeds)
//! or hosts may decide differently, which hangs NCCL: the INFO line prints the inputs, and
//! `switchless doctor --fleet` prints what each host's tuner would infer.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::host::NcclDevice;
use crate::route::point_to_point;
use crate::route::types::LocalLink;

use super::model::{Bound, FRAMING, PCIE_EFFICIENCY};

/// One NCCL device of the net plugin, as the tuner reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Port {
    /// NCCL device name (`sl_<netdev>`).
    pub name: String,
    /// Device speed, Gb/s (the plugin's `speed`: min(port rate, PCIe) summed over its logical ports).
    pub gbps: f64,
    /// Data paths of the cable: its members (a CX-8 cage's two 400G halves, a GB10 cage's two PCIe
    /// functions); 1 for a TCP link.
    pub paths: usize,
    /// Whether an address of the device is on a /30 or /31 (a cable to one far end).
    pub point_to_point: bool,
    /// Whether the device has addresses but none on a /30 or /31 (a switched or shared subnet).
    pub shared_subnet: bool,
    /// PCIe roots of its members, with the payload bandwidth of the member's link in Mb/s when known.
    pub roots: Vec<(String, Option<u32>)>,
}

/// The net plugin's devices.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LocalView {
    /// Every NCCL device, in NCCL order.
    pub ports: Vec<Port>,
}

impl LocalView {
    /// The view of the net plugin's device table and links.
    pub fn from_host(devices: &[NcclDevice], links: &[LocalLink]) -> LocalView {
        let ports = devices
            .iter()
            .map(|d| {
                let mine: Vec<&LocalLink> = links
                    .iter()
                    .filter(|l| l.nccl_dev == Some(d.index))
                    .collect();
                let p2p = mine.iter().any(|l| point_to_point(l.addr));
                Port {
                    name: d.name.clone(),
                    gbps: f64::from(d.speed_mbps) / 1000.0,
                    paths: d.members.len().max(1),
                    point_to_point: p2p,
                    shared_subnet: !mine.is_empty() && !p2p,
                    roots: d
                        .members
                        .iter()
                        .filter_map(|m| m.pci_root.clone().map(|r| (r, m.pcie_mbps)))
                        .collect(),
                }
            })
            .collect();
        LocalView { ports }
    }

    /// The devices that are cables.
    pub fn cables(&self) -> impl Iterator<Item = &Port> {
        self.ports.iter().filter(|p| p.point_to_point)
    }

    /// What bounds the node, and the node's rate in Gb/s when its NIC's PCIe does: cables whose
    /// members share PCIe roots (GB10: both cages behind the same two x4 functions) can together send
    /// no more than those roots carry.
    pub fn bound(&self) -> (Bound, Option<f64>) {
        let mut users: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        let mut rate: BTreeMap<&str, Option<u32>> = BTreeMap::new();
        for p in self.cables() {
            for (root, mbps) in &p.roots {
                users.entry(root).or_default().insert(&p.name);
                let r = rate.entry(root).or_insert(*mbps);
                *r = match (*r, *mbps) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        if !users.values().any(|u| u.len() > 1) {
            return (Bound::Cables, None);
        }
        let total: Option<u64> = rate.values().map(|r| r.map(u64::from)).sum();
        match total {
            Some(mbps) => (Bound::Nic, Some(mbps as f64 / 1000.0 * PCIE_EFFICIENCY)),
            // Roots shared but their rate unknown: the cables are all the model can bound.
            None => (Bound::Cables, None),
        }
    }
}

/// Whether a relay carries connections between hosts that share no cable (issue 30's two-hop relay).
/// With one, Tree and PAT reach non-neighbours and the ring-only rule does not apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Relay {
    /// Non-neighbours have no fast path (the net plugin carries bytes only on the cables to the peer).
    #[default]
    Unavailable,
    /// The net plugin relays through a neighbour.
    Available,
}

/// The inputs of the decision, printed in the INFO line so that hosts can be compared.
#[derive(Debug, Clone, PartialEq)]
pub struct Inputs {
    /// NCCL's nNodes.
    pub nodes: usize,
    /// NCCL's nRanks.
    pub ranks: usize,
    /// Point-to-point cables of this host.
    pub cables: usize,
    /// The slowest cable, Gb/s (line rate).
    pub cable_gbps: f64,
    /// Data paths per cable (the fewest among the cables).
    pub paths_per_cable: usize,
    /// What bounds the node, and its rate when the NIC's PCIe does (Gb/s goodput).
    pub bound: Bound,
    /// The node rate when [`Bound::Nic`].
    pub node_gbps: Option<f64>,
}

impl fmt::Display for Inputs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} hosts, {} ranks, {} point-to-point cable(s) here at {:.0} Gb/s, {} path(s) each",
            self.nodes, self.ranks, self.cables, self.cable_gbps, self.paths_per_cable
        )?;
        if let Some(n) = self.node_gbps {
            write!(f, ", NIC PCIe shared by the cables: {n:.0} Gb/s per node")?;
        }
        Ok(())
    }
}

/// The class of a communicator, with the reason the INFO line gives.
#[derive(Debug, Clone, PartialEq)]
pub enum Class {
    /// The tuner changes nothing.
    Untouched(String),
    /// Some hosts share no cable: Ring only (Tree, NVLS-tree and PAT would connect non-neighbours).
    NonNeighbours {
        inputs: Inputs,
        /// Cables per neighbour (at least 1).
        per_neighbour: usize,
    },
    /// Every host is taken to be a neighbour: the model picks Ring or Tree for all-reduce.
    Mesh {
        inputs: Inputs,
        /// Cables per peer, C / (N − 1) (whole cables, at least 1).
        per_peer: usize,
        /// Pair goodput per direction, Gb/s: C / (N − 1) cables at the slowest cable's rate.
        pair_gbps: f64,
    },
}

/// Puts a communicator of `ranks` ranks on `nodes` hosts in its class, from this host's `view`.
pub fn classify(nodes: usize, ranks: usize, view: &LocalView, relay: Relay) -> Class {
    if nodes <= 1 {
        return Class::Untouched("one host: no network between ranks of this communicator".into());
    }
    if nodes == 2 {
        return Class::Untouched(
            "two hosts: NCCL's ring and tree already use every cable in both directions".into(),
        );
    }
    let shared: Vec<&str> = view
        .ports
        .iter()
        .filter(|p| p.shared_subnet)
        .map(|p| p.name.as_str())
        .collect();
    if !shared.is_empty() {
        return Class::Untouched(format!(
            "device(s) {} sit on a subnet wider than /30 or /31, which the plugin never takes for a cable (a \
             switched network, where NCCL's model of every NIC reaching every host holds; or cables \
             addressed wider than /30: `switchless plan` gives each cable its own /30)",
            shared.join(", ")
        ));
    }
    let cables: Vec<&Port> = view.cables().collect();
    if cables.is_empty() {
        return Class::Untouched(
            "no point-to-point cable among the net plugin's devices (it is not carrying this \
             communicator, or its init failed)"
                .into(),
        );
    }
    let (bound, node_gbps) = view.bound();
    let inputs = Inputs {
        nodes,
        ranks,
        cables: cables.len(),
        cable_gbps: cables.iter().map(|p| p.gbps).fold(f64::INFINITY, f64::min),
        paths_per_cable: cables.iter().map(|p| p.paths).min().unwrap_or(1),
        bound,
        node_gbps,
    };
    if inputs.cable_gbps <= 0.0 || !inputs.cable_gbps.is_finite() {
        return Class::Untouched(format!(
            "a cable reports speed {} Gb/s; the model needs a positive rate",
            inputs.cable_gbps
        ));
    }
    let peers = nodes - 1;
    if cables.len() < peers {
        if relay == Relay::Available {
            return Class::Untouched(format!(
                "{inputs}: some hosts are not neighbours, and the relay reaches them"
            ));
        }
        return Class::NonNeighbours {
            per_neighbour: (cables.len() / 2).max(1),
            inputs,
        };
    }
    let per_peer = (cables.len() / peers).max(1);
    let pair_gbps = cables.len() as f64 / peers as f64 * inputs.cable_gbps * FRAMING;
    Class::Mesh {
        inputs,
        per_peer,
        pair_gbps,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A view of `n` cables of `gbps` with `paths` members; `shared_roots` puts every cable's members on
    /// the same two roots (GB10), else each cable has its own.
    pub(crate) fn cables(
        n: usize,
        gbps: f64,
        paths: usize,
        shared_roots: Option<u32>,
    ) -> LocalView {
        LocalView {
            ports: (0..n)
                .map(|i| Port {
                    name: format!("sl_c{i}"),
                    gbps,
                    paths,
                    point_to_point: true,
                    shared_subnet: false,
                    roots: (0..paths)
                        .map(|m| match shared_roots {
                            Some(mbps) => (format!("pci000{m}:00"), Some(mbps)),
                            None => (format!("pci00{i:02}:00"), Some(504_000)),
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    #[test]
    fn classes() {
        let b300 = cables(6, 800.0, 2, None);
        assert!(
            matches!(classify(2, 16, &b300, Relay::Unavailable), Class::Untouched(r) if r.contains("two hosts"))
        );
        assert!(matches!(
            classify(1, 8, &b300, Relay::Unavailable),
            Class::Untouched(_)
        ));
        match classify(4, 32, &b300, Relay::Unavailable) {
            Class::Mesh {
                per_peer,
                pair_gbps,
                inputs,
                ..
            } => {
                assert_eq!(per_peer, 2);
                assert!((pair_gbps - 1568.0).abs() < 1e-9);
                assert_eq!(inputs.bound, Bound::Cables);
            }
            c => panic!("{c:?}"),
        }
        // GB10 ring of 4: two cables, three other hosts.
        let gb10 = cables(2, 200.0, 2, Some(126_000));
        match classify(4, 4, &gb10, Relay::Unavailable) {
            Class::NonNeighbours {
                per_neighbour,
                inputs,
            } => {
                assert_eq!(per_neighbour, 1);
                assert_eq!(inputs.bound, Bound::Nic);
                assert!((inputs.node_gbps.unwrap() - 2.0 * 126.0 * PCIE_EFFICIENCY).abs() < 1e-9);
            }
            c => panic!("{c:?}"),
        }
        assert!(
            matches!(classify(4, 4, &gb10, Relay::Available), Class::Untouched(r) if r.contains("relay"))
        );
        assert!(matches!(
            classify(3, 3, &gb10, Relay::Unavailable),
            Class::Mesh { per_peer: 1, .. }
        ));
        // A switched network anywhere: untouched.
        let mut lan = cables(6, 800.0, 2, None);
        lan.ports[3].point_to_point = false;
        lan.ports[3].shared_subnet = true;
        assert!(
            matches!(classify(4, 32, &lan, Relay::Unavailable), Class::Untouched(r) if r.contains("wider"))
        );
        assert!(matches!(
            classify(4, 32, &LocalView::default(), Relay::Unavailable),
            Class::Untouched(_)
        ));
        let mut slow = cables(6, 800.0, 2, None);
        slow.ports[0].gbps = 0.0;
        assert!(
            matches!(classify(4, 32, &slow, Relay::Unavailable), Class::Untouched(r) if r.contains("speed"))
        );
    }
}
