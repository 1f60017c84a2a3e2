//! `switchless doctor --fleet`: the cables between hosts, judged from one host model per host (trees
//! made by `switchless doctor --capture`, or `--root` trees). Pairs every fabric address with the
//! addresses of other hosts in its subnet (a cable end facing its far end), groups those paths into
//! cables (one adapter cage at each end), and reports what only shows across hosts: see [`check`].
//! Depends on `host` (discovery, local links) and the single-host doctor's report; text and JSON
//! rendering are in `fleet_render.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::Serialize;

use crate::findings::{Finding, Severity, exit_status};
use crate::host::model::HostModel;
use crate::route::types::LinkKind;

/// Stable check ids of the cross-host findings: in the registry with the single-host ones, so that
/// the registry depends on no check module (documented in docs/guide/fleet.md and
/// docs/reference/doctor-findings.md).
pub use super::registry::check;

/// Schema version of the `--fleet --json` document.
pub const SCHEMA: &str = "switchless-fleet/1";

pub use super::wiring::HostInput;
use super::wiring::{Owners, Seen};

/// What one cable end carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndKind {
    /// An RDMA port holds the address as an IPv4-mapped RoCE v2 GID.
    Roce,
    /// A netdev with an RDMA port whose GID table lacks the address: RoCE cannot use it.
    NoGid,
    /// A point-to-point TCP link (a netdev without RDMA on a /30 or /31).
    Tcp,
}

/// One fabric address of one host: a cable end.
#[derive(Debug, Clone, Serialize)]
pub struct End {
    pub host: String,
    pub netdev: String,
    pub rdma_dev: Option<String>,
    pub port: Option<u8>,
    /// Address with the prefix of its connected subnet.
    pub addr: Ipv4Net,
    pub kind: EndKind,
    /// Netdev up with carrier and (RoCE) the port ACTIVE.
    pub up: bool,
    /// Netdev MTU, bytes.
    pub mtu: Option<u32>,
    /// RoCE active MTU, bytes (None for TCP).
    pub active_mtu: Option<u32>,
    /// The adapter cage (physical port) this end leaves through, e.g. `guid:4cbb470300a1b2c0#1`.
    pub cage: String,
    /// NCCL device of this end on its host.
    pub nccl_device: Option<String>,
    #[serde(skip)]
    host_idx: usize,
    /// Port rate (or netdev speed) and PCIe bandwidth of the function, Mb/s.
    #[serde(skip)]
    rate_mbps: Option<u32>,
    #[serde(skip)]
    pcie_mbps: Option<u32>,
    /// Logical port on the adapter (`phys_port_name`): multi-host functions share one.
    #[serde(skip)]
    logical: String,
}

impl End {
    /// `host:netdev addr`.
    pub fn label(&self) -> String {
        format!("{}:{} {}", self.host, self.netdev, self.addr)
    }
}

/// Two ends in one subnet on different hosts.
#[derive(Debug, Clone, Serialize)]
pub struct Path {
    pub a: End,
    pub b: End,
    /// Both ends up and of the same kind (RoCE–RoCE or TCP–TCP): traffic can flow.
    pub usable: bool,
}

/// One side of a cable: a host and the cage there.
#[derive(Debug, Clone, Serialize)]
pub struct CableSide {
    pub host: String,
    pub cage: String,
    /// Netdevs of this cage with an address on the cable.
    pub netdevs: Vec<String>,
}

/// One cable: the paths between one cage of host A and one cage of host B.
#[derive(Debug, Clone, Serialize)]
pub struct Cable {
    pub a: CableSide,
    pub b: CableSide,
    pub paths: Vec<Path>,
    /// What the usable paths can carry, Mb/s: the smaller side's min(port rate, Σ PCIe of its
    /// functions) per logical port.
    pub speed_mbps: u64,
}

/// One cell of the cabling matrix (a host pair, `a` before `b` in the host list).
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub a: String,
    pub b: String,
    /// Physical cables: one per pair of cages the paths join, plus cables whose ends the MAC
    /// evidence shows but whose addresses pair them elsewhere (no path on them).
    pub cables: usize,
    pub paths: usize,
    pub usable_paths: usize,
    /// Capped at what the cages at either end carry.
    pub speed_mbps: u64,
    /// A cage of one host faces two cages of the other by address only (a copied address, no MAC
    /// evidence either way): the cable count and rate are what the addresses claim, capped.
    pub as_addressed: bool,
}

/// One host in the report: its single-host doctor verdict.
#[derive(Debug, Clone, Serialize)]
pub struct HostSummary {
    pub name: String,
    pub root: String,
    pub nccl_devices: usize,
    /// Fabric addresses (cable ends) found on the host.
    pub ends: usize,
    /// The single-host doctor's findings and exit status for this host.
    pub findings: Vec<Finding>,
    pub exit_status: u8,
}

/// The `--fleet` report.
#[derive(Debug, Clone, Serialize)]
pub struct FleetReport {
    pub schema: &'static str,
    pub hosts: Vec<HostSummary>,
    pub cables: Vec<Cable>,
    /// Every host pair, in host order.
    pub matrix: Vec<Cell>,
    /// Host pairs with no path between them.
    pub non_neighbours: Vec<(String, String)>,
    /// Cross-host findings, worst first.
    pub findings: Vec<Finding>,
    /// Per host pair with a usable path, which paths fail over to which (`failover-paths`, info):
    /// a map rather than a problem, so kept out of `findings` and the exit status.
    pub failover: Vec<Finding>,
    /// Worst of the cross-host findings and every host's single-host status: 0, 1 or 2.
    pub exit_status: u8,
}

/// Cage id as text.
fn cage_text(c: &crate::host::model::Cage) -> String {
    format!("{}#{}", c.adapter, c.index)
}

/// The fabric ends of one host: RoCE addresses, addresses of RDMA netdevs without a RoCE v2 GID,
/// and point-to-point TCP links. Management LANs (no RDMA, not a /30 or /31) are not cable ends.
fn ends_of(host_idx: usize, h: &HostInput) -> Vec<End> {
    let m = &h.model;
    let devices = m.nccl_devices(&|_, _| true, &|_| false);
    let cages = m.cages();
    let mut out = Vec::new();
    for l in m.local_links(&devices) {
        let Some(n) = m.netdev(&l.netdev) else {
            continue;
        };
        let tcp = m.tcp_links.iter().any(|t| t.netdev == l.netdev);
        let kind = match l.kind {
            LinkKind::Roce => EndKind::Roce,
            LinkKind::Tcp if !n.rdma.is_empty() => EndKind::NoGid,
            LinkKind::Tcp if tcp => EndKind::Tcp,
            LinkKind::Tcp => continue,
        };
        let port = l.rdma_dev.as_deref().and_then(|d| m.rdma_port(d, l.port));
        // An RDMA netdev without the GID: its first RDMA port tells rate and state.
        let any_port = port.or_else(|| n.rdma.first().and_then(|(d, p)| m.rdma_port(d, *p)));
        let bdf = n
            .pci
            .clone()
            .or_else(|| any_port.and_then(|(d, _)| d.pci.clone()));
        let pcie_mbps = bdf
            .as_deref()
            .and_then(|b| m.pci(b))
            .and_then(|f| f.link.current_mbps());
        let cage = cages
            .get(usize::from(l.phys_port_id))
            .map(cage_text)
            .or_else(|| any_port.map(|(_, p)| cage_text(&p.cage)))
            .unwrap_or_else(|| format!("netdev:{}", n.name));
        out.push(End {
            host: h.name.clone(),
            netdev: l.netdev.clone(),
            rdma_dev: any_port.map(|(d, _)| d.name.clone()),
            port: any_port.map(|(_, p)| p.port),
            addr: l.addr,
            kind,
            up: n.is_up() && any_port.is_none_or(|(_, p)| p.is_active()),
            mtu: n.mtu,
            active_mtu: port.map(|(_, p)| p.active_mtu),
            cage,
            nccl_device: match kind {
                // A TCP link's device is the plugin's TCP device of its netdev.
                EndKind::Tcp => Some(format!("sl_{}", l.netdev)),
                _ => l
                    .nccl_dev
                    .and_then(|i| devices.get(i))
                    .map(|d| d.name.clone()),
            },
            host_idx,
            rate_mbps: any_port
                .and_then(|(_, p)| p.rate_mbps)
                .or(n.speed_mbps)
                .filter(|_| n.is_up()),
            pcie_mbps,
            logical: n.phys_port_name.clone().unwrap_or_else(|| n.name.clone()),
        });
    }
    out
}

/// The ends `a` and `b` face each other: one's subnet holds the other's address.
fn faces(a: &End, b: &End) -> bool {
    a.addr.trunc().contains(&b.addr.addr()) || b.addr.trunc().contains(&a.addr.addr())
}

/// What one side of a cable carries over the given ends: per logical port min(port rate, Σ PCIe of
/// its functions), summed (a GB10 cage: min(200, 2 × 126) Gb/s; a CX-8 cage: 400 + 400 Gb/s).
fn side_capacity(ends: &[&End]) -> u64 {
    let mut by_logical: BTreeMap<&str, Vec<&End>> = BTreeMap::new();
    for e in ends {
        by_logical.entry(e.logical.as_str()).or_default().push(e);
    }
    by_logical
        .values()
        .map(|v| {
            let rate = v.iter().filter_map(|e| e.rate_mbps).max().map(u64::from);
            let pcie: Option<u64> = v.iter().map(|e| e.pcie_mbps.map(u64::from)).sum();
            match (rate, pcie) {
                (Some(r), Some(p)) => r.min(p),
                (r, p) => r.or(p).unwrap_or(0),
            }
        })
        .sum()
}

fn gbps(mbps: u64) -> String {
    crate::tools::units::gbps(mbps)
}

fn mtu_text(v: Option<u32>) -> String {
    v.map(|m| m.to_string()).unwrap_or_else(|| "?".into())
}

/// Checks of one path; pushes findings.
fn path_checks(p: &Path, f: &mut Vec<Finding>) {
    let (a, b) = (&p.a, &p.b);
    let obj = format!("cable {} — {}", a.label(), b.label());
    if a.addr.prefix_len() != b.addr.prefix_len() {
        f.push(Finding::new(
            Severity::Error,
            check::PREFIX_MISMATCH,
            obj.clone(),
            format!(
                "the two ends of one cable are in different prefixes: {} holds {} (subnet {}), {} holds {} \
                 (subnet {}); routing on each host decides by its own subnet, so one side may not see the \
                 other as on-link",
                a.host,
                a.addr,
                a.addr.trunc(),
                b.host,
                b.addr,
                b.addr.trunc()
            ),
            "give both ends the same prefix length (a /30 or /31 per cable, as `switchless plan` writes)",
        ));
    }
    let roce = |e: &End| e.kind == EndKind::Roce;
    if a.kind != b.kind && (roce(a) || roce(b)) {
        let (has, lacks) = if roce(a) { (a, b) } else { (b, a) };
        let why = match lacks.kind {
            EndKind::NoGid => format!(
                "{}'s RDMA port {} has no IPv4-mapped RoCE v2 GID for {}",
                lacks.host,
                lacks.rdma_dev.clone().unwrap_or_else(|| "?".into()),
                lacks.addr.addr()
            ),
            _ => format!("{}:{} has no RDMA device at all", lacks.host, lacks.netdev),
        };
        f.push(Finding::new(
            Severity::Error,
            check::GID_MISSING_ONE_END,
            obj.clone(),
            format!(
                "{} is a RoCE v2 end but {why}: the plugin on {} exposes no RoCE link for this address, so \
                 the cable carries no RDMA traffic",
                has.label(),
                lacks.host
            ),
            format!(
                "on {}: check that the address is on the RoCE netdev itself (not a bond or VLAN above it) and \
                 that the RDMA driver is loaded, then `switchless doctor` there (check no-ipv4-roce-v2-gid)",
                lacks.host
            ),
        ));
    }
    if !a.up || !b.up {
        let msg = match (a.up, b.up) {
            (false, false) => format!("both ends are down: {} and {}", a.label(), b.label()),
            (true, _) => format!(
                "{} is up but {} is down (no carrier or port not ACTIVE): no traffic crosses this path",
                a.label(),
                b.label()
            ),
            _ => format!(
                "{} is up but {} is down (no carrier or port not ACTIVE): no traffic crosses this path",
                b.label(),
                a.label()
            ),
        };
        let down: Vec<String> = [a, b]
            .into_iter()
            .filter(|e| !e.up)
            .map(|e| {
                format!(
                    "on {}: ip link set dev {1} up; ethtool {1}",
                    e.host, e.netdev
                )
            })
            .collect();
        f.push(Finding::new(
            Severity::Warning,
            check::END_DOWN,
            obj.clone(),
            msg,
            format!(
                "{}   # 'Link detected: no': reseat or replace the cable / transceiver, then check the link \
                 mode both ends agree on",
                down.join("; ")
            ),
        ));
    }
    let amtu_differs = roce(a) && roce(b) && a.active_mtu != b.active_mtu;
    if a.mtu != b.mtu || amtu_differs {
        let mut what = vec![format!("MTU {}/{} bytes", mtu_text(a.mtu), mtu_text(b.mtu))];
        if roce(a) && roce(b) {
            what.push(format!(
                "active_mtu {}/{} bytes",
                mtu_text(a.active_mtu),
                mtu_text(b.active_mtu)
            ));
        }
        let why = if roce(a) && roce(b) {
            "RoCE runs at the smaller active MTU of the two ends (4096-byte frames need an MTU of 4200 \
             bytes or more on both)"
        } else {
            "TCP agrees on the smaller MTU per connection, so the cable carries no jumbo frames: more \
             packets and CPU per byte (nothing is dropped)"
        };
        // Raise the lower end to the higher one (9000 when neither is known).
        let target = a.mtu.max(b.mtu).filter(|m| *m >= 4200).unwrap_or(9000);
        let low: Vec<String> = [a, b]
            .into_iter()
            .filter(|e| e.mtu.is_none_or(|m| m < target))
            .map(|e| format!("on {}: ip link set dev {} mtu {target}", e.host, e.netdev))
            .collect();
        f.push(Finding::new(
            Severity::Warning,
            check::MTU_MISMATCH,
            obj,
            format!(
                "the ends of one cable differ: {} ({} / {}); {why}",
                what.join(", "),
                a.host,
                b.host
            ),
            format!(
                "{}   # persist it: the MTU of the plan's netplan or networkd output",
                low.join("; ")
            ),
        ));
    }
}

/// Judges the fleet: pairs every host's cable ends, builds cables and the matrix, and runs every
/// cross-host check. Host names must be distinct (the CLI makes them so).
pub fn diagnose(hosts: &[HostInput]) -> FleetReport {
    let mut ends: Vec<End> = Vec::new();
    for (i, h) in hosts.iter().enumerate() {
        ends.extend(ends_of(i, h));
    }
    let mut findings = Vec::new();
    // Ends whose missing far end another finding already explains.
    let mut explained: BTreeSet<usize> = BTreeSet::new();

    // The same address on two hosts, on any physical netdev (a cloned management address is as
    // fatal). Virtual netdevs (docker0, virbr0: host-local bridges with the same default address on
    // every host) and IPv4 link-local addresses (unique per link only) are left out.
    let mut by_addr: BTreeMap<Ipv4Addr, Vec<(usize, String)>> = BTreeMap::new();
    for (i, h) in hosts.iter().enumerate() {
        for n in h
            .model
            .netdevs
            .iter()
            .filter(|n| n.pci.is_some() || !n.rdma.is_empty())
        {
            for a in n.addrs.iter().filter(|a| !a.addr.addr().is_link_local()) {
                by_addr
                    .entry(a.addr.addr())
                    .or_default()
                    .push((i, n.name.clone()));
            }
        }
    }
    let mut duplicated: BTreeSet<Ipv4Addr> = BTreeSet::new();
    for (addr, holders) in &by_addr {
        let hs: BTreeSet<usize> = holders.iter().map(|(i, _)| *i).collect();
        if hs.len() < 2 {
            continue;
        }
        duplicated.insert(*addr);
        let who: Vec<String> = holders
            .iter()
            .map(|(i, n)| format!("{}:{n}", hosts[*i].name))
            .collect();
        for (k, e) in ends.iter().enumerate() {
            if e.addr.addr() == *addr {
                explained.insert(k);
            }
        }
        findings.push(Finding::new(
            Severity::Error,
            check::DUPLICATE_ADDRESS,
            format!("address {addr}"),
            format!(
                "{addr} is assigned on {} hosts: {}; ARP answers from either, and a connection to it reaches \
                 whichever answered (on a cable: neither end has a far end)",
                hs.len(),
                who.join(", ")
            ),
            "give every host its own address (on a cable: one end .1, the other .2 of the /30, as `switchless \
             plan` writes); check hosts installed from one image for copied network configuration",
        ));
    }

    // Paths: every pair of ends on different hosts that face each other.
    let mut paths: Vec<(usize, usize)> = Vec::new();
    #[allow(clippy::needless_range_loop)]
    for i in 0..ends.len() {
        for j in i + 1..ends.len() {
            let (a, b) = (&ends[i], &ends[j]);
            if a.host_idx != b.host_idx && a.addr.addr() != b.addr.addr() && faces(a, b) {
                paths.push(if a.host_idx <= b.host_idx {
                    (i, j)
                } else {
                    (j, i)
                });
            }
        }
    }
    // What the far ends' MACs say (neighbour entries, --probe): a path the evidence contradicts
    // is no cable (its ends face other ports: a swapped cable, a copied address); a path whose far
    // MAC is the other function on the holder's wire is ARP flux.
    let owners = Owners::of(hosts);
    let mut miswired: BTreeMap<(usize, usize), (usize, String, &'static str)> = BTreeMap::new();
    let mut flux: Vec<(usize, usize, String)> = Vec::new();
    paths.retain(|&(i, j)| {
        let (a, b) = (&ends[i], &ends[j]);
        let ab = super::wiring::seen(
            hosts,
            &owners,
            a.host_idx,
            &a.netdev,
            b.addr.addr(),
            b.host_idx,
            &b.netdev,
        );
        let ba = super::wiring::seen(
            hosts,
            &owners,
            b.host_idx,
            &b.netdev,
            a.addr.addr(),
            a.host_idx,
            &a.netdev,
        );
        let by = |e: &End| {
            if hosts[e.host_idx]
                .model
                .neighbours
                .iter()
                .any(|n| n.complete && n.ifname == e.netdev)
            {
                "the MAC that answered"
            } else {
                "--probe"
            }
        };
        let mut keep = true;
        for (me, far, s) in [(i, j, &ab), (j, i, &ba)] {
            match s {
                Seen::Elsewhere((h, n)) => {
                    // A far address held twice explains itself (duplicate-address): no cable fault.
                    if !duplicated.contains(&ends[far].addr.addr()) {
                        miswired
                            .entry((me, far))
                            .or_insert((*h, n.clone(), by(&ends[me])));
                    }
                    keep = false;
                }
                Seen::OtherFunction(n) => flux.push((me, far, n.clone())),
                _ => {}
            }
        }
        keep
    });
    let faced: BTreeSet<usize> = paths
        .iter()
        .flat_map(|(a, b)| [*a, *b])
        .chain(miswired.keys().map(|(me, _)| *me))
        .collect();
    // Cables the evidence shows whose addresses pair their ends elsewhere: (host, wire) pairs.
    let seen_cables: BTreeSet<((usize, String), (usize, String))> = miswired
        .iter()
        .filter_map(|(&(me, _), (h, n, _))| {
            let e = &ends[me];
            let x = (
                e.host_idx,
                format!(
                    "{:?}",
                    super::wiring::cage_of(&hosts[e.host_idx].model, &e.netdev)?
                ),
            );
            let y = (
                *h,
                format!("{:?}", super::wiring::cage_of(&hosts[*h].model, n)?),
            );
            Some(if x <= y { (x, y) } else { (y, x) })
        })
        .collect();
    findings.extend(miswired_findings(hosts, &ends, &miswired));
    findings.extend(flux_findings(&ends, &flux));

    // Cables: paths grouped by (host, cage) at each end.
    type Key = (usize, String, usize, String);
    let mut cable_paths: BTreeMap<Key, Vec<(usize, usize)>> = BTreeMap::new();
    for &(i, j) in &paths {
        let (a, b) = (&ends[i], &ends[j]);
        cable_paths
            .entry((a.host_idx, a.cage.clone(), b.host_idx, b.cage.clone()))
            .or_default()
            .push((i, j));
    }
    let mut cables = Vec::new();
    for ((ha, ca, hb, cb), ps) in &cable_paths {
        let mut pv = Vec::new();
        let (mut ua, mut ub): (Vec<&End>, Vec<&End>) = (Vec::new(), Vec::new());
        for &(i, j) in ps {
            let (a, b) = (&ends[i], &ends[j]);
            let usable = a.up
                && b.up
                && a.kind == b.kind
                && a.kind != EndKind::NoGid
                && a.addr.prefix_len() == b.addr.prefix_len();
            if usable {
                ua.push(a);
                ub.push(b);
            }
            let p = Path {
                a: a.clone(),
                b: b.clone(),
                usable,
            };
            path_checks(&p, &mut findings);
            pv.push(p);
        }
        let side = |h: usize, c: &str, pick: &dyn Fn(&Path) -> &End| CableSide {
            host: hosts[h].name.clone(),
            cage: c.to_string(),
            netdevs: pv
                .iter()
                .map(|p| pick(p).netdev.clone())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
        };
        let speed = side_capacity(&ua).min(side_capacity(&ub));
        cables.push(Cable {
            a: side(*ha, ca, &|p| &p.a),
            b: side(*hb, cb, &|p| &p.b),
            speed_mbps: speed,
            paths: pv,
        });
    }

    cables.sort_by_key(|c| {
        let first = c.paths.iter().map(|p| p.a.addr.addr()).min();
        (
            hosts.iter().position(|h| h.name == c.a.host),
            hosts.iter().position(|h| h.name == c.b.host),
            first,
        )
    });

    // Half-addressed cages: a cable whose one side has ends in its cage facing nothing while the
    // other side has fewer addressed functions in its cage.
    for c in &cables {
        for (me, other) in [(&c.a, &c.b), (&c.b, &c.a)] {
            let in_cage = |s: &CableSide| -> Vec<usize> {
                ends.iter()
                    .enumerate()
                    .filter(|(_, e)| e.host == s.host && e.cage == s.cage)
                    .map(|(k, _)| k)
                    .collect()
            };
            let mine = in_cage(me);
            let theirs = in_cage(other);
            let lonely: Vec<usize> = mine
                .iter()
                .copied()
                .filter(|k| !faced.contains(k) && !explained.contains(k))
                .collect();
            let my_fns: BTreeSet<&str> = mine.iter().map(|k| ends[*k].netdev.as_str()).collect();
            let their_fns: BTreeSet<&str> =
                theirs.iter().map(|k| ends[*k].netdev.as_str()).collect();
            if lonely.is_empty() || my_fns.len() <= their_fns.len() {
                continue;
            }
            let oh = hosts.iter().find(|h| h.name == other.host);
            let idle: Vec<String> = oh
                .map(|h| unaddressed_in_cage(&h.model, &other.cage))
                .unwrap_or_default();
            let lonely_txt: Vec<String> = lonely.iter().map(|k| ends[*k].label()).collect();
            findings.push(Finding::new(
                Severity::Warning,
                check::HALF_ADDRESSED,
                format!(
                    "cable {}:{} — {}:{}",
                    me.host,
                    my_fns.iter().copied().collect::<Vec<_>>().join("+"),
                    other.host,
                    their_fns.iter().copied().collect::<Vec<_>>().join("+")
                ),
                format!(
                    "{} addresses {} functions/halves of this cage, {} only {}: {} faces nothing{}; the cable \
                     carries {} (the addressed pairs) instead of what both ends' functions could",
                    me.host,
                    my_fns.len(),
                    other.host,
                    their_fns.len(),
                    lonely_txt.join(", "),
                    if idle.is_empty() {
                        String::new()
                    } else {
                        format!(" (unaddressed on {}: {})", other.host, idle.join(", "))
                    },
                    gbps(c.speed_mbps)
                ),
                half_remedy(&other.host, &idle, &lonely.iter().map(|k| &ends[*k]).collect::<Vec<_>>()),
            ));
            explained.extend(lonely);
        }
    }

    // Ends that face nothing and no other finding explains.
    for (k, e) in ends.iter().enumerate() {
        if faced.contains(&k) || explained.contains(&k) {
            continue;
        }
        let (sev, state) = if e.up {
            (Severity::Warning, "up")
        } else {
            (Severity::Info, "down (uncabled?)")
        };
        findings.push(Finding::new(
            sev,
            check::NO_FAR_END,
            format!("netdev {}:{}", e.host, e.netdev),
            format!(
                "{} ({state}) is in subnet {}, which no other of the {} hosts holds an address in: the far end \
                 is missing from the fleet, unaddressed, or in another subnet",
                e.label(),
                e.addr.trunc(),
                hosts.len()
            ),
            "capture the far host too, or give the far end an address in this subnet (see `switchless plan`)",
        ));
    }

    // Matrix and non-neighbours.
    let mut matrix = Vec::new();
    let mut non_neighbours = Vec::new();
    let mut failover = Vec::new();
    for i in 0..hosts.len() {
        for j in i + 1..hosts.len() {
            let cs: Vec<&Cable> = cables
                .iter()
                .filter(|c| {
                    (c.a.host == hosts[i].name && c.b.host == hosts[j].name)
                        || (c.a.host == hosts[j].name && c.b.host == hosts[i].name)
                })
                .collect();
            // A cage holds one cable: two "cables" sharing a cage at one end are addresses, not
            // cables; count the cages and never rate them above what the cages carry.
            let cages = |side: &dyn Fn(&Cable) -> (&str, &str)| -> BTreeMap<(String, String), u64> {
                let mut m: BTreeMap<(String, String), u64> = BTreeMap::new();
                for c in &cs {
                    let (h, g) = side(c);
                    let e = m.entry((h.to_string(), g.to_string())).or_default();
                    *e = (*e).max(c.speed_mbps);
                }
                m
            };
            let (ca, cb) = (
                cages(&|c: &Cable| (c.a.host.as_str(), c.a.cage.as_str())),
                cages(&|c: &Cable| (c.b.host.as_str(), c.b.cage.as_str())),
            );
            let as_addressed = ca.len() != cs.len() || cb.len() != cs.len();
            let sum: u64 = cs.iter().map(|c| c.speed_mbps).sum();
            let seen_only = seen_cables
                .iter()
                .filter(|((x, _), (y, _))| (*x, *y) == (i, j) || (*x, *y) == (j, i))
                .count();
            let cell = Cell {
                a: hosts[i].name.clone(),
                b: hosts[j].name.clone(),
                cables: ca.len().min(cb.len()) + seen_only,
                paths: cs.iter().map(|c| c.paths.len()).sum(),
                usable_paths: cs
                    .iter()
                    .map(|c| c.paths.iter().filter(|p| p.usable).count())
                    .sum(),
                speed_mbps: sum.min(ca.values().sum()).min(cb.values().sum()),
                as_addressed,
            };
            if cell.cables == 0 {
                non_neighbours.push((cell.a.clone(), cell.b.clone()));
            }
            if cell.usable_paths > 0 {
                failover.push(failover_finding(&hosts[i].name, &hosts[j].name, &cs));
            }
            matrix.push(cell);
        }
    }
    if !non_neighbours.is_empty() {
        findings.push(non_neighbour_finding(hosts, &non_neighbours, matrix.len()));
    }

    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
    let mut summaries = Vec::new();
    for (i, h) in hosts.iter().enumerate() {
        let devices = h.model.nccl_devices(&|_, _| true, &|_| false);
        let view = super::NcclView::decide(
            &h.model,
            Some(&crate::config::Config::default()),
            devices.clone(),
        );
        let extras = super::Extras {
            facts: h.facts.clone(),
            ..Default::default()
        };
        // The devices the plugin would expose: RoCE, or TCP on a host without a usable RoCE port.
        let n_devices = view.devices.len();
        let r = super::build(&h.model, view, extras, h.discovery.clone());
        summaries.push(HostSummary {
            name: h.name.clone(),
            root: h.model.root.clone(),
            nccl_devices: n_devices,
            ends: ends.iter().filter(|e| e.host_idx == i).count(),
            findings: r.findings,
            exit_status: r.exit_status,
        });
    }
    let status = summaries
        .iter()
        .map(|s| s.exit_status)
        .chain([exit_status(&findings)])
        .max()
        .unwrap_or(0);
    FleetReport {
        schema: SCHEMA,
        hosts: summaries,
        cables,
        matrix,
        non_neighbours,
        findings,
        failover,
        exit_status: status,
    }
}

/// How to address the idle functions of a half-addressed cable on `host`: each lonely far end's
/// subnet gets its other address on the idle function of the same rank (the functions sorted by
/// name at both ends: a GB10's `enP2…` pairs with `enP2…`), with the far end's MTU. Exact for a /30
/// or /31; for a wider subnet the remedy names the subnet.
fn half_remedy(host: &str, idle: &[String], lonely: &[&End]) -> String {
    let mut lonely = lonely.to_vec();
    lonely.sort_by(|a, b| a.netdev.cmp(&b.netdev));
    if idle.is_empty() {
        return format!(
            "on {host}: address every function of the cage in the subnet its far end uses ({})",
            lonely
                .iter()
                .map(|e| e.addr.trunc().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let steps: Vec<String> = lonely
        .iter()
        .zip(idle.iter())
        .map(|(far, nd)| {
            let mtu = far.mtu.unwrap_or(9000);
            match crate::route::point_to_point_peers(far.addr).as_deref() {
                Some([peer]) => format!(
                    "ip link set dev {nd} up mtu {mtu} && ip addr add {peer}/{} dev {nd}",
                    far.addr.prefix_len()
                ),
                _ => format!(
                    "ip link set dev {nd} up mtu {mtu} && ip addr add ADDR/{} dev {nd}   # ADDR: a free address of {} (the far end holds {})",
                    far.addr.prefix_len(),
                    far.addr.trunc(),
                    far.addr.addr()
                ),
            }
        })
        .collect();
    format!("on {host}: {}", steps.join("; "))
}

/// Netdevs of the RDMA ports in `cage` (text form) that hold no address.
fn unaddressed_in_cage(m: &HostModel, cage: &str) -> Vec<String> {
    let mut v: Vec<String> = m
        .ports()
        .filter(|(_, p)| cage_text(&p.cage) == cage)
        .filter_map(|(_, p)| p.netdev.clone())
        .filter(|n| m.netdev(n).is_some_and(|n| n.addrs.is_empty()))
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The addressed netdevs of one cage (a GB10 port's two functions, a CX-8 cage's two halves), joined
/// with `+`.
fn wire_names(h: &HostInput, netdev: &str) -> String {
    let w = super::wiring::cage_of(&h.model, netdev);
    let mut v: Vec<&str> = h
        .model
        .netdevs
        .iter()
        .filter(|n| {
            n.name == netdev || (w.is_some() && super::wiring::cage_of(&h.model, &n.name) == w)
        })
        .filter(|n| n.name == netdev || !n.addrs.is_empty())
        .map(|n| n.name.as_str())
        .collect();
    v.sort_unstable();
    v.join("+")
}

/// One `cable-miswired` per physical cable the evidence shows: an end whose far MAC (or probed wire)
/// is another port than its address pairs it with. Both ends of such a cable make one finding.
fn miswired_findings(
    hosts: &[HostInput],
    ends: &[End],
    mis: &BTreeMap<(usize, usize), (usize, String, &'static str)>,
) -> Vec<Finding> {
    // Physical cable: the (host, wire) of the end and of what it faces, in order.
    let mut cables: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (&(me, far), (h, n, by)) in mis {
        let e = &ends[me];
        let here = format!("{}:{}", e.host, wire_names(&hosts[e.host_idx], &e.netdev));
        let there = format!("{}:{}", hosts[*h].name, wire_names(&hosts[*h], n));
        let key = if here <= there {
            (here.clone(), there.clone())
        } else {
            (there.clone(), here.clone())
        };
        cables.entry(key).or_default().push(format!(
            "{} ({}) is addressed to face {}:{} ({}), but {by} shows {}:{n} on its wire",
            e.label(),
            e.addr.trunc(),
            ends[far].host,
            ends[far].netdev,
            ends[far].addr.addr(),
            hosts[*h].name
        ));
    }
    cables
        .into_iter()
        .map(|((x, y), why)| {
            let blink: Vec<String> = [&x, &y]
                .iter()
                .filter_map(|s| s.split_once(':'))
                .map(|(h, n)| format!("on {h}: ethtool -p {} 10", n.split('+').next().unwrap_or(n)))
                .collect();
            Finding::new(
                Severity::Error,
                check::CABLE_MISWIRED,
                format!("cable {x} — {y}"),
                format!(
                    "this cable joins ports whose addresses pair them with other ports: {}; a cable in the \
                     wrong port (or addresses set for another cabling), so the connections the addresses \
                     promise fail with \"No route to host\" or time out",
                    why.join("; ")
                ),
                format!(
                    "{}   # blinks each end's port LED for 10 s; move the cable to the ports its addresses are \
                     for (doctor --fleet --plan names them), or re-address both ends for this cabling",
                    blink.join("; ")
                ),
            )
        })
        .collect()
}

/// One `arp-flux` per path whose far MAC is the other PCIe function on the holder's wire.
fn flux_findings(ends: &[End], flux: &[(usize, usize, String)]) -> Vec<Finding> {
    flux.iter()
        .map(|(me, far, other)| {
            let (e, f) = (&ends[*me], &ends[*far]);
            Finding::new(
                Severity::Warning,
                check::ARP_FLUX,
                format!("cable {} — {}", e.label(), f.label()),
                format!(
                    "{}:{} reaches {} ({}:{}) through the MAC of {}:{other}, the other PCIe function on that \
                     wire: ARP flux, so RoCE frames for {} land on {other} (the stripe over the cable breaks or \
                     halves)",
                    e.host,
                    e.netdev,
                    f.addr.addr(),
                    f.host,
                    f.netdev,
                    f.host,
                    f.netdev
                ),
                format!(
                    "on {0}: sysctl -w net.ipv4.conf.{1}.arp_ignore=1 net.ipv4.conf.{1}.arp_announce=2 \
                     net.ipv4.conf.{other}.arp_ignore=1 net.ipv4.conf.{other}.arp_announce=2; then on {2}: ip neigh \
                     flush dev {3}   # persist with switchless plan CABLES --format sysctl",
                    f.host, f.netdev, e.host, e.netdev
                ),
            )
        })
        .collect()
}

/// A subnet both hosts have an address in (a management LAN), with the slower netdev speed.
fn shared_subnet(a: &HostModel, b: &HostModel) -> Option<(Ipv4Net, Option<u32>)> {
    for na in &a.netdevs {
        for x in na.addrs.iter().filter(|x| x.addr.prefix_len() < 32) {
            for nb in &b.netdevs {
                if nb.addrs.iter().any(|y| {
                    x.addr.trunc().contains(&y.addr.addr()) && y.addr.addr() != x.addr.addr()
                }) {
                    let speed = match (na.speed_mbps, nb.speed_mbps) {
                        (Some(p), Some(q)) => Some(p.min(q)),
                        (p, q) => p.or(q),
                    };
                    return Some((x.addr.trunc(), speed));
                }
            }
        }
    }
    None
}

/// Which paths between hosts `a` and `b` would fail over to which: per NCCL device of `a`, the
/// usable paths of that device carry a connection on it and the pair's other usable paths stand by
/// (`NCCL_SWITCHLESS_STANDBY`, docs/failover.md).
fn failover_finding(a: &str, b: &str, cables: &[&Cable]) -> Finding {
    // (end at a, end at b) of each usable path.
    let mut paths: Vec<(&End, &End)> = cables
        .iter()
        .flat_map(|c| c.paths.iter().filter(|p| p.usable))
        .map(|p| {
            if p.a.host == a {
                (&p.a, &p.b)
            } else {
                (&p.b, &p.a)
            }
        })
        .collect();
    paths.sort_by(|x, y| (&x.0.nccl_device, &x.0.netdev).cmp(&(&y.0.nccl_device, &y.0.netdev)));
    let text = |v: &[&(&End, &End)]| {
        v.iter()
            .map(|(x, y)| format!("{} {} -> {}", x.netdev, x.addr.addr(), y.addr.addr()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut devs: Vec<&Option<String>> = paths.iter().map(|p| &p.0.nccl_device).collect();
    devs.dedup();
    let lines: Vec<String> = devs
        .iter()
        .map(|d| {
            let (own, other): (Vec<_>, Vec<_>) = paths.iter().partition(|p| &p.0.nccl_device == *d);
            let dev = d.as_deref().unwrap_or("no NCCL device");
            match (own.len(), other.is_empty()) {
                (1, true) => format!("on {dev}: {} carries; nothing to fail over to", text(&own)),
                (_, true) => format!("on {dev}: {} carry and fail over to each other", text(&own)),
                _ => format!("on {dev}: {} carry; standby {}", text(&own), text(&other)),
            }
        })
        .collect();
    let single = paths.len() == 1;
    Finding::new(
        Severity::Info,
        check::FAILOVER_PATHS,
        format!("hosts {a} — {b}"),
        format!(
            "{a} to {b}, {}; a connection {}: {}",
            crate::tools::units::count(paths.len(), "usable path"),
            if single {
                "has nothing to fail over to (a lost cable fails it)"
            } else {
                "carries on its NCCL device's paths and fails over as follows"
            },
            lines.join("; ")
        ),
        if single {
            "a second cable (or the port's other PCIe function / CX-8 half, addressed) gives failover a path"
        } else {
            "nothing; NCCL_SWITCHLESS_STANDBY=0 keeps the standby paths unset"
        },
    )
}

fn non_neighbour_finding(hosts: &[HostInput], nn: &[(String, String)], pairs: usize) -> Finding {
    let model = |n: &str| hosts.iter().find(|h| h.name == n).map(|h| &h.model);
    let list: Vec<String> = nn
        .iter()
        .map(|(a, b)| {
            let via = match (model(a), model(b)) {
                (Some(x), Some(y)) => match shared_subnet(x, y) {
                    Some((net, Some(s))) => {
                        format!(" (shared subnet {net}, {})", gbps(u64::from(s)))
                    }
                    Some((net, None)) => format!(" (shared subnet {net})"),
                    None => " (no shared subnet)".to_string(),
                },
                _ => String::new(),
            };
            format!("{a}–{b}{via}")
        })
        .collect();
    Finding::new(
        Severity::Warning,
        check::NON_NEIGHBOURS,
        "fleet",
        format!(
            "{} of {pairs} host pairs have no cable between them: {}. All-to-all (alltoall, and any ring or \
             tree NCCL builds with these ranks adjacent) connects every pair of ranks; without a cable the \
             plugin fails those connections at once with \"no local link reaches the peer\", or with \
             NCCL_SWITCHLESS_TCP_FALLBACK=1 carries them over the shared subnet at its speed",
            nn.len(),
            list.join(", ")
        ),
        "cable a full mesh for all-to-all; or set NCCL_SWITCHLESS_TCP_FALLBACK=1 on every node and expect the \
         management network's bandwidth for those pairs; or run only neighbour collectives (ring allreduce in \
         cable order)",
    )
}
