//! A multi-host fabric for the model ([`super::ModelFab::mesh`]): hosts joined by wires of their
//! own rates, the NIC functions (paths) that reach a peer over each wire, and the hosts' PCIe roots.
//! A connection between two hosts gets the paths over the wires that join them and, as the
//! [`RelayRule`] says, one relay path through each third host cabled to both: its writes cross a
//! path from the sender to the relay host, wait in the relay host's staging memory until all their
//! bytes are there (store and forward), then cross a path from the relay host to the receiver.
//! Pure data and arithmetic; the timing is in the parent module.
#![forbid(unsafe_code)]

use super::link::Framing;
use crate::error::{Error, Result};
use crate::transport::stripe::MAX_PATHS;

/// A full-duplex wire between two hosts (each direction at `rate_bps`): a 400 Gb/s half of a
/// ConnectX-8 800G cage, a GB10's 200 Gb/s QSFP cable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshWire {
    /// The two hosts (0-based, different).
    pub hosts: [usize; 2],
    /// Line rate per direction, bits per second.
    pub rate_bps: u64,
    /// One-way latency, picoseconds (NICs included).
    pub latency_ps: u64,
}

/// A NIC function that reaches the other end of a wire: a connection's path. Several may share a
/// wire (a GB10 port's two PCIe functions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshPath {
    /// Index into [`Mesh::wires`].
    pub wire: usize,
    /// The PCIe root each end's NIC moves a connection's own data through (index into
    /// [`Mesh::roots`], for `wire.hosts[0]` and `wire.hosts[1]`); `None`: not modelled (not a
    /// bottleneck).
    pub root: [Option<usize>; 2],
    /// The root each end's NIC moves bytes it relays through (to and from its staging memory).
    pub stage_root: [Option<usize>; 2],
    /// How to name it in path labels (e.g. the ports it joins).
    pub label: String,
}

/// A PCIe link of one host, its payload rate per direction (DMA reads and writes counted apart).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshRoot {
    pub host: usize,
    pub name: String,
    pub cap_bps: u64,
}

/// Which connections get relay paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayRule {
    /// None: a pair with no wire between them cannot connect.
    Off,
    /// Only pairs with no wire between them.
    Unreachable,
    /// Pairs with no wire between them, and pairs whose wires carry less than either host can
    /// move through its NIC ([`Mesh::inject_bps`]): where the host's own PCIe, not the cables to
    /// the peer, is the limit (a GB10's two x4 links), a relayed byte, which crosses the relay
    /// host's PCIe twice, can only take room from direct ones.
    Needed,
    /// Every pair, through every host cabled to both (at most [`MAX_PATHS`] paths in all).
    All,
}

/// Staging memory of one relay path at its relay host, per direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Staging {
    /// Slots; a chunk holds one from when it starts on the first leg until the relay host has
    /// the second leg's acknowledgement.
    pub slots: usize,
    /// Largest chunk: a write is forwarded in chunks of at most this many bytes.
    pub slot_bytes: u64,
}

impl Default for Staging {
    /// 4 × 512 KiB (one NCCL SIMPLE step each).
    fn default() -> Self {
        Staging {
            slots: 4,
            slot_bytes: 512 << 10,
        }
    }
}

/// The whole fabric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mesh {
    pub hosts: usize,
    pub wires: Vec<MeshWire>,
    pub paths: Vec<MeshPath>,
    pub roots: Vec<MeshRoot>,
    pub framing: Framing,
    pub relay: RelayRule,
    pub staging: Staging,
}

/// One way across a path, as the timing sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Leg {
    pub(super) path: usize,
    pub(super) wire: usize,
    /// Sending host and which end of the wire it is (0 or 1).
    pub(super) from: usize,
    pub(super) end: usize,
    pub(super) to: usize,
    /// Roots crossed at the sender and at the receiver.
    pub(super) tx_root: Option<usize>,
    pub(super) rx_root: Option<usize>,
    pub(super) latency_ps: u64,
}

/// A connection's path from one host to its peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum MeshRoute {
    Direct(Leg),
    /// Through host `via`: `first` ends in its staging memory, `second` starts there.
    Relay {
        via: usize,
        first: Leg,
        second: Leg,
    },
}

impl Mesh {
    /// Checks indices, rates and host numbers; the error names what is wrong.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(format!("model mesh: {m}")));
        if self.hosts < 2 {
            return bad(format!("{} hosts; at least 2 accepted", self.hosts));
        }
        for (i, w) in self.wires.iter().enumerate() {
            if w.hosts[0] == w.hosts[1] || w.hosts.iter().any(|&h| h >= self.hosts) {
                return bad(format!(
                    "wire {i} joins hosts {:?}; two different hosts of 0..{} accepted",
                    w.hosts, self.hosts
                ));
            }
            if w.rate_bps == 0 {
                return bad(format!("wire {i} has rate 0"));
            }
        }
        for (i, r) in self.roots.iter().enumerate() {
            if r.host >= self.hosts || r.cap_bps == 0 {
                return bad(format!(
                    "root {i} ({}) is on host {} with cap {} b/s; a host of 0..{} and a cap above 0 accepted",
                    r.name, r.host, r.cap_bps, self.hosts
                ));
            }
        }
        for (i, p) in self.paths.iter().enumerate() {
            let Some(w) = self.wires.get(p.wire) else {
                return bad(format!(
                    "path {i} names wire {}, of {}",
                    p.wire,
                    self.wires.len()
                ));
            };
            for e in 0..2 {
                for r in [p.root[e], p.stage_root[e]].into_iter().flatten() {
                    match self.roots.get(r) {
                        Some(root) if root.host == w.hosts[e] => {}
                        _ => {
                            return bad(format!(
                                "path {i} names root {r} at its end on host {}: not a root of that host",
                                w.hosts[e]
                            ));
                        }
                    }
                }
            }
        }
        if self.staging.slots == 0 || self.staging.slot_bytes == 0 {
            return bad("relay staging of 0 slots or 0-byte slots".into());
        }
        Ok(())
    }

    /// The paths over the wires between `a` and `b`, in path order.
    pub fn paths_between(&self, a: usize, b: usize) -> Vec<usize> {
        (0..self.paths.len())
            .filter(|&p| {
                let h = self.wires[self.paths[p].wire].hosts;
                h == [a, b] || h == [b, a]
            })
            .collect()
    }

    /// The hosts other than `a` and `b` with paths to both, in host order.
    pub fn relay_hosts(&self, a: usize, b: usize) -> Vec<usize> {
        (0..self.hosts)
            .filter(|&k| k != a && k != b)
            .filter(|&k| {
                !self.paths_between(a, k).is_empty() && !self.paths_between(k, b).is_empty()
            })
            .collect()
    }

    /// Whether the rule gives the pair relay paths (if any host is cabled to both).
    pub fn relays_for(&self, a: usize, b: usize) -> bool {
        let direct = self.paths_between(a, b);
        match self.relay {
            RelayRule::Off => false,
            RelayRule::Unreachable => direct.is_empty(),
            RelayRule::Needed => {
                direct.is_empty()
                    || self.carry_bps(&direct) < self.inject_bps(a).min(self.inject_bps(b))
            }
            RelayRule::All => true,
        }
    }

    /// What `paths` can carry together one way, b/s: each wire's rate or its paths' speeds,
    /// whichever is less, summed; at most the caps of the roots every path crosses, where every
    /// path crosses one (per end: a host's paths all behind PCIe roots move at most their caps).
    fn carry_bps(&self, paths: &[usize]) -> u64 {
        let mut wires: Vec<usize> = paths.iter().map(|&p| self.paths[p].wire).collect();
        wires.sort_unstable();
        wires.dedup();
        let on_wires: u64 = wires
            .iter()
            .map(|&w| {
                let speeds: u64 = paths
                    .iter()
                    .filter(|&&p| self.paths[p].wire == w)
                    .map(|&p| self.path_bps(p))
                    .sum();
                speeds.min(self.wires[w].rate_bps)
            })
            .sum();
        let mut limit = on_wires;
        for end_host in self.hosts_of(paths) {
            let mut roots = Vec::new();
            let mut all = true;
            for &p in paths {
                let w = &self.wires[self.paths[p].wire];
                for e in 0..2 {
                    if w.hosts[e] == end_host {
                        match self.paths[p].root[e] {
                            Some(r) => roots.push(r),
                            None => all = false,
                        }
                    }
                }
            }
            if all && !roots.is_empty() {
                roots.sort_unstable();
                roots.dedup();
                limit = limit.min(roots.iter().map(|&r| self.roots[r].cap_bps).sum());
            }
        }
        limit
    }

    fn hosts_of(&self, paths: &[usize]) -> Vec<usize> {
        let mut h: Vec<usize> = paths
            .iter()
            .flat_map(|&p| self.wires[self.paths[p].wire].hosts)
            .collect();
        h.sort_unstable();
        h.dedup();
        h
    }

    /// A path's own limit: its wire, or a root at either end if slower.
    fn path_bps(&self, p: usize) -> u64 {
        let path = &self.paths[p];
        let mut r = self.wires[path.wire].rate_bps;
        for root in path.root.iter().flatten() {
            r = r.min(self.roots[*root].cap_bps);
        }
        r
    }

    /// What host `h` can move one way through its NIC to all its peers together, b/s.
    pub fn inject_bps(&self, h: usize) -> u64 {
        let mine: Vec<usize> = (0..self.paths.len())
            .filter(|&p| self.wires[self.paths[p].wire].hosts.contains(&h))
            .collect();
        // only this host's end counts: the peers' roots are theirs
        let mut wires: Vec<usize> = mine.iter().map(|&p| self.paths[p].wire).collect();
        wires.sort_unstable();
        wires.dedup();
        let on_wires: u64 = wires
            .iter()
            .map(|&w| {
                let speeds: u64 = mine
                    .iter()
                    .filter(|&&p| self.paths[p].wire == w)
                    .map(|&p| self.path_bps(p))
                    .sum();
                speeds.min(self.wires[w].rate_bps)
            })
            .sum();
        let mut roots = Vec::new();
        for &p in &mine {
            let w = &self.wires[self.paths[p].wire];
            let e = usize::from(w.hosts[1] == h);
            match self.paths[p].root[e] {
                Some(r) => roots.push(r),
                None => return on_wires,
            }
        }
        roots.sort_unstable();
        roots.dedup();
        on_wires.min(roots.iter().map(|&r| self.roots[r].cap_bps).sum())
    }

    /// Path `p` crossed from host `from`, charging `stage` roots at the ends named.
    fn leg(&self, p: usize, from: usize, stage_from: bool, stage_to: bool) -> Leg {
        let path = &self.paths[p];
        let w = &self.wires[path.wire];
        let end = usize::from(w.hosts[0] != from);
        let pick = |e: usize, stage: bool| {
            if stage {
                path.stage_root[e]
            } else {
                path.root[e]
            }
        };
        Leg {
            path: p,
            wire: path.wire,
            from,
            end,
            to: w.hosts[1 - end],
            tx_root: pick(end, stage_from),
            rx_root: pick(1 - end, stage_to),
            latency_ps: w.latency_ps,
        }
    }

    /// The paths of the `serial`-th connection from host `a` to host `b` (the same wires, taken
    /// the other way, for the connection's other end): direct paths first, then one relay path
    /// per relay host, as [`Mesh::relay`] allows and up to [`MAX_PATHS`] in all. A relay path's
    /// legs take path `(serial + relay host) mod n` of the n paths of each leg's host pair, so
    /// connections spread over the wires.
    pub(super) fn routes(&self, a: usize, b: usize, serial: u64) -> Result<Vec<MeshRoute>> {
        let direct = self.paths_between(a, b);
        if direct.len() > MAX_PATHS {
            return Err(Error::InvalidArgument(format!(
                "model mesh: hosts {a} and {b} are joined by {} paths; a connection stripes over at most {MAX_PATHS}",
                direct.len()
            )));
        }
        let mut out: Vec<MeshRoute> = direct
            .iter()
            .map(|&p| MeshRoute::Direct(self.leg(p, a, false, false)))
            .collect();
        let want = self.relays_for(a, b);
        if want {
            for k in self.relay_hosts(a, b) {
                if out.len() == MAX_PATHS {
                    break;
                }
                let pick = |x: usize, y: usize| {
                    let ps = self.paths_between(x, y);
                    ps[((serial + k as u64) % ps.len() as u64) as usize]
                };
                out.push(MeshRoute::Relay {
                    via: k,
                    first: self.leg(pick(a, k), a, false, true),
                    second: self.leg(pick(k, b), k, true, false),
                });
            }
        }
        if out.is_empty() {
            let why = match self.relay {
                RelayRule::Off => "and relays are off",
                _ => "and no host is cabled to both",
            };
            return Err(Error::InvalidArgument(format!(
                "model mesh: hosts {a} and {b} share no cable {why}: no path between them"
            )));
        }
        Ok(out)
    }

    /// A path's speed for the comms' stripe weights, Mb/s: the wire's rate, or less where a root
    /// at either end is slower.
    fn leg_mbps(&self, l: &Leg) -> u64 {
        let mut r = self.wires[l.wire].rate_bps;
        for root in [l.tx_root, l.rx_root].into_iter().flatten() {
            r = r.min(self.roots[root].cap_bps);
        }
        r / 1_000_000
    }

    /// Label and nominal speed (Mb/s) of each route. A relay path's speed is the split the relay
    /// policy starts from (issue 30: about 2/N of a ring's bytes direct, 1/N through each other
    /// host): half the direct paths' sum, or its slower leg where there is no direct path; the
    /// adaptive stripe weights move from there.
    pub(super) fn describe(&self, routes: &[MeshRoute]) -> Vec<(String, u64)> {
        let direct: u64 = routes
            .iter()
            .map(|r| match r {
                MeshRoute::Direct(l) => self.leg_mbps(l),
                MeshRoute::Relay { .. } => 0,
            })
            .sum();
        routes
            .iter()
            .map(|r| match r {
                MeshRoute::Direct(l) => {
                    let w = &self.wires[l.wire];
                    (
                        format!(
                            "model host{} {} -> host{} ({}, {})",
                            l.from,
                            self.paths[l.path].label,
                            l.to,
                            super::link::rate_text(w.rate_bps),
                            super::link::ps_text(w.latency_ps)
                        ),
                        self.leg_mbps(l),
                    )
                }
                MeshRoute::Relay { via, first, second } => {
                    let legs = self.leg_mbps(first).min(self.leg_mbps(second));
                    let speed = if direct > 0 { direct / 2 } else { legs };
                    (
                        format!(
                            "model host{} relay via host{via} ({} then {}) -> host{}",
                            first.from,
                            self.paths[first.path].label,
                            self.paths[second.path].label,
                            second.to
                        ),
                        speed.max(1),
                    )
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 4-host ring: 0-1, 1-2, 2-3, 3-0, one 100 G wire each, one path per wire, a root per host.
    fn ring4(relay: RelayRule) -> Mesh {
        let wires: Vec<MeshWire> = (0..4)
            .map(|i| MeshWire {
                hosts: [i, (i + 1) % 4],
                rate_bps: 100_000_000_000,
                latency_ps: 1_000_000,
            })
            .collect();
        let roots = (0..4)
            .map(|h| MeshRoot {
                host: h,
                name: format!("r{h}"),
                cap_bps: 50_000_000_000,
            })
            .collect();
        let paths = (0..4)
            .map(|i| MeshPath {
                wire: i,
                root: [Some(i), Some((i + 1) % 4)],
                stage_root: [Some(i), Some((i + 1) % 4)],
                label: format!("w{i}"),
            })
            .collect();
        Mesh {
            hosts: 4,
            wires,
            paths,
            roots,
            framing: Framing::Ideal,
            relay,
            staging: Staging::default(),
        }
    }

    #[test]
    fn neighbours_go_direct_and_the_diagonal_only_through_relays() {
        let m = ring4(RelayRule::Unreachable);
        m.validate().unwrap();
        let r = m.routes(0, 1, 0).unwrap();
        assert_eq!(r.len(), 1);
        assert!(matches!(
            r[0],
            MeshRoute::Direct(Leg { from: 0, to: 1, .. })
        ));
        let r = m.routes(0, 2, 0).unwrap();
        assert_eq!(r.len(), 2, "{r:?}");
        match &r[0] {
            MeshRoute::Relay { via, first, second } => {
                assert_eq!(*via, 1);
                assert_eq!((first.from, first.to, second.from, second.to), (0, 1, 1, 2));
                // the relay host's staging root on both legs, the ends' own roots at the ends
                assert_eq!((first.tx_root, first.rx_root), (Some(0), Some(1)));
                assert_eq!((second.tx_root, second.rx_root), (Some(1), Some(2)));
            }
            other => panic!("{other:?}"),
        }
        let e = ring4(RelayRule::Off)
            .routes(0, 2, 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("share no cable") && e.contains("relays are off"),
            "{e}"
        );
        // the labels name the relay host; a path with no direct sibling takes its legs' speed
        let d = m.describe(&r);
        assert!(d[0].0.contains("via host1"), "{d:?}");
        assert_eq!(d[0].1, 50_000);
    }

    /// Three hosts in a triangle, one 100 G wire per pair, each host's paths behind one root of
    /// `cap` b/s (`None`: no roots).
    fn triangle(cap: Option<u64>) -> Mesh {
        let wires = [[0, 1], [1, 2], [0, 2]]
            .into_iter()
            .map(|hosts| MeshWire {
                hosts,
                rate_bps: 100_000_000_000,
                latency_ps: 1_000_000,
            })
            .collect::<Vec<_>>();
        let roots: Vec<MeshRoot> = match cap {
            Some(c) => (0..3)
                .map(|h| MeshRoot {
                    host: h,
                    name: "x4".into(),
                    cap_bps: c,
                })
                .collect(),
            None => vec![],
        };
        let paths = wires
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let r = |e: usize| cap.map(|_| w.hosts[e]);
                MeshPath {
                    wire: i,
                    root: [r(0), r(1)],
                    stage_root: [r(0), r(1)],
                    label: format!("w{i}"),
                }
            })
            .collect();
        Mesh {
            hosts: 3,
            wires,
            paths,
            roots,
            framing: Framing::Ideal,
            relay: RelayRule::Needed,
            staging: Staging::default(),
        }
    }

    #[test]
    fn relays_are_needed_where_the_cables_not_the_nic_bind() {
        // no roots: a host moves 200 G over its two wires, a pair's wire 100 G: relay
        let m = triangle(None);
        assert_eq!(m.inject_bps(0), 200_000_000_000);
        assert!(m.relays_for(0, 1));
        assert_eq!(m.routes(0, 1, 0).unwrap().len(), 2);
        // every path behind one 100 G root per host (a GB10's NIC, full with one peer's wire)
        let m = triangle(Some(100_000_000_000));
        assert_eq!(m.inject_bps(0), 100_000_000_000);
        assert!(!m.relays_for(0, 1));
        assert_eq!(m.routes(0, 1, 0).unwrap().len(), 1);
        // a roomier root: the cables bind again
        assert!(triangle(Some(150_000_000_000)).relays_for(0, 1));
        // the pairs no cable joins always get them
        assert!(ring4(RelayRule::Needed).relays_for(0, 2));
    }

    #[test]
    fn bad_meshes_say_what_is_wrong() {
        let mut m = ring4(RelayRule::Off);
        m.wires[0].hosts = [1, 1];
        assert!(
            m.validate()
                .unwrap_err()
                .to_string()
                .contains("two different hosts")
        );
        let mut m = ring4(RelayRule::Off);
        m.paths[0].root[0] = Some(2);
        assert!(
            m.validate()
                .unwrap_err()
                .to_string()
                .contains("not a root of that host")
        );
    }
}
