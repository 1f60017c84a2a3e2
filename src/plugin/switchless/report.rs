//! The log and error text of a connection: its one INFO line (`ConnReport`, with the connections
//! per physical cable so far: [`CableCounts`]), the small-MTU warning, the TCP fallback warning
//! ([`fallback_warning`]), the same-host note ([`same_host_note`]), the GPU-direct distance warning
//! ([`gdr_warning`]), the hint for routed paths
//! ([`routed_hint`]) and the prefix of a failed step's error.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use super::{Connectable, PathFactory, PathPlan, Switchless};
use crate::config::PathType;
use crate::error::Error;
use crate::route::select::{Closeness, PathChoice, Selection};
use crate::route::types::{LinkKind, LocalLink};
use crate::sync::lock;
use crate::transport::handshake::PathParams;

/// The connector's [`ConnReport::verb`].
pub(super) const CONNECTED: &str = "connected to";

/// A connection that just became ready, as its INFO line tells it.
pub(super) struct ConnReport<'a, F> {
    /// `connected to` (connector) or `accepted from` (acceptor).
    pub(super) verb: &'static str,
    /// The peer as errors name it (`peer 10.0.1.2/31 (port 40211)`, `connector 10.0.1.2`).
    pub(super) peer: &'a str,
    /// The NCCL device.
    pub(super) dev: usize,
    /// The paths, in path order.
    pub(super) plans: &'a [PathPlan],
    /// This side's parameters per path.
    pub(super) local: &'a [PathParams],
    /// The peer's parameters per path.
    pub(super) remote: &'a [PathParams],
    /// The endpoint (negotiated MTUs, loopback paths).
    pub(super) fab: &'a F,
    /// The handshake's TCP connection (`tcp 10.0.1.1:51234 -> 10.0.1.2:40211`).
    pub(super) tcp: String,
    /// Where the set-up time went.
    pub(super) steps: &'a SetupSteps,
}

/// Where one connection's set-up time went, per step (wall time), for its INFO line: `route`
/// (choosing the paths), `qps` (creating the endpoint: queue pairs, CQs, control memory
/// registration), `rtr_rts` (the queue pairs' transitions to RTR and RTS with the peer's
/// parameters), and the waits: `handshake` (for the peer's reply or `ready`: the peer's own
/// set-up and the network) and `ready` (the endpoint finishing after the handshake).
#[derive(Debug, Clone, Copy)]
pub(super) struct SetupSteps {
    started: std::time::Instant,
    lap: std::time::Instant,
    route: std::time::Duration,
    qps: std::time::Duration,
    rtr_rts: std::time::Duration,
    handshake: std::time::Duration,
    ready: std::time::Duration,
}

/// A step of [`SetupSteps`].
#[derive(Debug, Clone, Copy)]
pub(super) enum Step {
    Route,
    Qps,
    RtrRts,
    Handshake,
    Ready,
}

impl SetupSteps {
    /// Starts the clock now.
    pub(super) fn start() -> SetupSteps {
        let now = std::time::Instant::now();
        SetupSteps {
            started: now,
            lap: now,
            route: std::time::Duration::ZERO,
            qps: std::time::Duration::ZERO,
            rtr_rts: std::time::Duration::ZERO,
            handshake: std::time::Duration::ZERO,
            ready: std::time::Duration::ZERO,
        }
    }

    /// Charges the time since the last lap to `step`.
    pub(super) fn lap(&mut self, step: Step) {
        let now = std::time::Instant::now();
        let d = now.saturating_duration_since(self.lap);
        self.lap = now;
        let slot = match step {
            Step::Route => &mut self.route,
            Step::Qps => &mut self.qps,
            Step::RtrRts => &mut self.rtr_rts,
            Step::Handshake => &mut self.handshake,
            Step::Ready => &mut self.ready,
        };
        *slot += d;
    }

    /// `set-up 12.3 ms: route 0.1, queue pairs 5.0, RTR/RTS 2.0, waits: handshake 4.0, ready 0.2`.
    pub(super) fn text(&self) -> String {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        format!(
            "set-up {:.1} ms: route {:.1}, queue pairs {:.1}, RTR/RTS {:.1}; waits: handshake {:.1}, ready {:.1}",
            ms(self.lap.saturating_duration_since(self.started)),
            ms(self.route),
            ms(self.qps),
            ms(self.rtr_rts),
            ms(self.handshake),
            ms(self.ready)
        )
    }
}

impl<P: PathFactory> Switchless<P> {
    /// Logs a connection that is ready: the small-MTU warning when due, then its INFO line, which
    /// ends with how many connections (NCCL channels) each physical cable carries so far.
    pub(super) fn log_connected<F: Connectable>(&self, r: &ConnReport<'_, F>) {
        self.check_mtu(r);
        let cables = lock(&self.cables, "cable counts")
            .map(|mut c| {
                c.add(r.plans, r.verb == CONNECTED);
                c.summary()
            })
            .unwrap_or_default();
        tracing::info!(
            "NET/switchless: {}; {}; NCCL channels per cable so far (send/recv connections of this process): {cables}",
            self.describe(r),
            r.steps.text()
        );
    }

    /// Warns once per process when a RoCE path runs below a 4096-byte MTU (the interface-MTU-1500 trap).
    fn check_mtu<F: Connectable>(&self, r: &ConnReport<'_, F>) {
        for (i, (p, peer)) in r.plans.iter().zip(r.remote).enumerate() {
            let mtu = r.fab.path_mtu(i, peer);
            if p.kind == LinkKind::Roce
                && mtu < 4096
                && !self.warned_mtu.swap(true, Ordering::Relaxed)
            {
                tracing::warn!(
                    "NET/switchless: path {} -> {} runs with a {mtu}-byte RoCE MTU (local active MTU {} bytes, \
                     peer {} bytes): an interface MTU below 4200 bytes caps RoCE at 1024 or 2048 bytes and \
                     costs bandwidth; set the MTU of both ends to 9000 (see `switchless doctor`)",
                    p.local.netdev,
                    p.remote,
                    p.local.active_mtu,
                    peer.mtu
                );
            }
        }
    }

    /// The one INFO line of a connection: the peer, the device, and per path the local and remote
    /// address, GID index, PCIe root, MTU and QP numbers.
    fn describe<F: Connectable>(&self, r: &ConnReport<'_, F>) -> String {
        let ConnReport {
            verb,
            peer,
            dev,
            plans,
            local,
            remote,
            fab,
            ref tcp,
            steps: _,
        } = *r;
        let routes = &self.view.routes;
        let name = self
            .props
            .get(dev)
            .map(|p| p.name.to_string_lossy().into_owned())
            .unwrap_or_default();
        let loops = fab
            .paths()
            .iter()
            .filter(|p| p.role == crate::transport::fabric::PathRole::Loopback)
            .count();
        let flush = if loops > 0 {
            format!(" + {loops} loopback QP(s) for the GPU flush")
        } else {
            String::new()
        };
        let mut s = format!(
            "{verb} {peer} on NCCL device {dev} ({name}), {} path(s){flush}, {tcp}:",
            plans.len()
        );
        for (i, p) in plans.iter().enumerate() {
            let l = local.get(i);
            let r = remote.get(i);
            let qp = |x: Option<&PathParams>| {
                x.and_then(|x| x.qpns.first())
                    .map_or("-".to_string(), |q| format!("{q:#x}"))
            };
            let mtu = r.map_or(0, |r| fab.path_mtu(i, r));
            // A relayed path names its relay host; a routed fallback path the gateway the
            // kernel sends it to.
            let via = if let Some(r) = &p.relay {
                format!(" via {}", r.phrase())
            } else if p.local.addr.contains(&p.remote) {
                String::new()
            } else {
                match crate::route::kernel_route(routes, p.remote)
                    .first()
                    .and_then(|r| r.gateway)
                {
                    Some(gw) => format!(" via {gw}"),
                    None => " (routed)".to_string(),
                }
            };
            if p.kind == LinkKind::Tcp {
                // A TCP path (also over a RoCE port's netdev, as relay legs and
                // NCCL_SWITCHLESS_TRANSPORT=tcp are): no GID, PCIe root or queue pairs to name.
                let _ = write!(
                    s,
                    " [{i}] {} tcp {} -> {}{via} mtu {mtu};",
                    p.local.netdev, p.local.addr, p.remote,
                );
                continue;
            }
            let _ = write!(
                s,
                " [{i}] {} {} {} -> {}{via} gid {} root {} mtu {mtu} qp {} -> {};",
                p.local.netdev,
                p.local.rdma_dev.as_deref().unwrap_or("tcp"),
                p.local.addr,
                p.remote,
                l.map_or(0, |l| l.gid_index),
                p.local.pci_root,
                qp(l),
                qp(r)
            );
        }
        s.pop();
        s
    }
}

/// What to check when a connection over routed paths fails: each gateway must forward and route back.
/// Empty when no path is routed.
pub fn routed_hint(paths: &[PathChoice]) -> String {
    let mut gws: Vec<String> = Vec::new();
    for p in paths {
        if let Some(gw) = p.via {
            let g = format!(
                "{gw} (for {} -> {})",
                p.local.addr.addr(),
                p.remote.addr.addr()
            );
            if !gws.contains(&g) {
                gws.push(g);
            }
        }
    }
    if gws.is_empty() {
        return String::new();
    }
    format!(
        "the connection goes through the kernel's route via {}: that host must forward (sysctl \
         net.ipv4.ip_forward=1) and route both ways, and the peer needs a route back (see `switchless route --routed`)",
        gws.join(", ")
    )
}

pub(super) fn step_error(e: Error, peer: &str, step: &str) -> Error {
    e.context(format_args!("connection with {peer}: {step}"))
}

/// The one WARN per peer that `NCCL_SWITCHLESS_TCP_FALLBACK=1` carries: which links (and gateways), and
/// the bandwidth to expect.
pub fn fallback_warning(who: &str, sel: &crate::route::select::Selection) -> String {
    let speed = |mbps: u32| {
        if mbps == 0 {
            "link speed unknown".to_string()
        } else {
            format!("{mbps} Mb/s link")
        }
    };
    let paths: Vec<String> = sel
        .paths
        .iter()
        .map(|p| {
            let via = p.via.map(|g| format!(" via {g}")).unwrap_or_default();
            format!(
                "{} {} -> {}{via} ({})",
                p.local.netdev,
                p.local.addr,
                p.remote.addr,
                speed(p.local.speed_mbps)
            )
        })
        .collect();
    let forwarded = if sel.paths.iter().any(|p| p.via.is_some()) {
        "; a routed path is also limited by the forwarding host's CPU and its own traffic on those links"
    } else {
        ""
    };
    let mbps: u64 = sel
        .paths
        .iter()
        .map(|p| u64::from(p.local.speed_mbps))
        .sum();
    let expect = if sel.paths.iter().any(|p| p.local.speed_mbps == 0) {
        format!(
            "expect no more than those links' speed (the kernel reports none for some of them; a 1 Gb/s management port gives about 0.94 Gb/s), shared with whatever else uses that network{forwarded}"
        )
    } else {
        format!(
            "expect at most {:.1} Gb/s ({mbps} Mb/s of link speed, shared with whatever else uses that network{forwarded})",
            mbps as f64 / 1000.0
        )
    };
    format!(
        "{who}: no RoCE or TCP point-to-point link reaches it; NCCL_SWITCHLESS_TCP_FALLBACK=1 carries it over TCP on {}: {expect}, far below a direct link",
        paths.join(", ")
    )
}

/// Connections set up per physical cable (a cage: both PCIe functions of a GB10 port count once;
/// a TCP link without a cage is its netdev), split into send (connect) and receive (accept) sides.
/// NCCL opens one connection per channel and peer in each direction, so this is how NCCL's channels
/// landed on the cabling.
#[derive(Debug, Default)]
pub struct CableCounts {
    cables: BTreeMap<(u16, String), Cable>,
}

#[derive(Debug, Default)]
struct Cable {
    netdevs: Vec<String>,
    send: u32,
    recv: u32,
}

impl CableCounts {
    /// Counts one connection over `plans` (each cable once).
    pub fn add(&mut self, plans: &[PathPlan], send: bool) {
        let mut seen: Vec<(u16, String)> = Vec::new();
        for p in plans {
            let l = &p.local;
            let key = if l.phys_port_id == u16::MAX {
                (u16::MAX, l.netdev.clone())
            } else {
                (l.phys_port_id, String::new())
            };
            let c = self.cables.entry(key.clone()).or_default();
            if !c.netdevs.contains(&l.netdev) {
                c.netdevs.push(l.netdev.clone());
            }
            if seen.contains(&key) {
                continue;
            }
            seen.push(key);
            if send {
                c.send = c.send.saturating_add(1);
            } else {
                c.recv = c.recv.saturating_add(1);
            }
        }
    }

    /// `enp1s0f0np0+enP2p1s0f0np0 3/3, eth2 0/1`: every cable that carried a connection.
    pub fn summary(&self) -> String {
        self.cables
            .values()
            .map(|c| format!("{} {}/{}", c.netdevs.join("+"), c.send, c.recv))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The links allowed for GPU memory around NCCL's device under `NCCL_NET_GDR_LEVEL` (`None`: no
/// limit; NCCL's default `P2C` is `PXB` on hosts without C2C, and this plugin cannot tell C2C apart,
/// so it keeps the stricter reading).
pub fn gdr_scope(level: Option<PathType>) -> Option<Closeness> {
    match level {
        None => Some(Closeness::SameRootPort),
        Some(l) if l < PathType::Pix => None,
        Some(l) if l < PathType::Phb => Some(Closeness::SameRootPort),
        Some(PathType::Phb) => Some(Closeness::SameNuma),
        Some(_) => None,
    }
}

/// `NCCL_NET_GDR_LEVEL` as the logs name it.
pub fn level_name(level: Option<PathType>) -> String {
    level.map_or_else(
        || "P2C (NCCL's default, PXB without C2C)".to_string(),
        |l| l.as_str().to_string(),
    )
}

/// The INFO line of a connection to a rank on this host.
pub fn same_host_note(sel: &Selection) -> String {
    let how = if sel.paths.iter().all(|p| p.kind == LinkKind::Roce) {
        "RoCE to each port's own GID (HCA loopback)"
    } else {
        "TCP to each link's own address"
    };
    let links: Vec<String> = sel
        .paths
        .iter()
        .map(|p| format!("{} {}", p.local.netdev, p.local.addr))
        .collect();
    format!(
        "the peer is this host (its handle advertises only this host's addresses: NCCL connects ranks of one \
         host over the network when P2P and SHM are off or their host hashes differ); loopback over {how} on {}",
        links.join(", ")
    )
}

/// The one WARN per peer when NCCL may put GPU memory on a connection but only links farther than
/// `NCCL_NET_GDR_LEVEL` from NCCL's device reach the peer: which links, how far, what to expect
/// and what to change. `near(root)` is a link's closeness to NCCL's device.
pub fn gdr_warning(
    who: &str,
    dev: usize,
    name: &str,
    level: &str,
    sel: &Selection,
    near: impl Fn(&str) -> Option<Closeness>,
) -> String {
    let paths: Vec<String> = sel
        .paths
        .iter()
        .map(|p| {
            format!(
                "{} {} (PCIe root {}: {})",
                p.local.netdev,
                p.local.addr,
                p.local.pci_root,
                distance(near(&p.local.pci_root))
            )
        })
        .collect();
    format!(
        "{who}: NCCL chose device {dev} ({name}) and may use GPU-direct on it, but no link within \
         NCCL_NET_GDR_LEVEL={level} of that device reaches the peer, so the connection uses {}. NCCL \
         validated GPU-direct for device {dev} only: expect these NICs' reads and writes of GPU memory to run \
         well below the links' rate through a host bridge and lower still across sockets, or to fail where the \
         platform does not route PCIe peer-to-peer between root ports. Remedy: make NCCL choose a NIC cabled \
         to this peer (a NCCL_TOPO_FILE, or NCCL_CROSS_NIC; see the recipes in docs/guide/routing.md), accept \
         the distance with NCCL_NET_GDR_LEVEL=PHB or SYS, or keep NCCL's buffers in host memory with \
         NCCL_NET_GDR_LEVEL=LOC",
        paths.join(", ")
    )
}

/// A link's distance from NCCL's device, as the GPU-direct warnings say it.
fn distance(c: Option<Closeness>) -> &'static str {
    match c {
        Some(Closeness::SameRootPort) => "under the same PCIe root port",
        Some(Closeness::SameNuma) => "through the CPU's host bridge (PHB)",
        _ => "across the CPU interconnect or of unknown distance (SYS)",
    }
}

/// One path of an accepted connection whose end on this node is farther from NCCL's device than
/// `NCCL_NET_GDR_LEVEL` allows for GPU memory ([`accept_gdr_warning`]).
#[derive(Debug, Clone)]
pub struct FarEnd<'a> {
    /// The data path's index in the connection.
    pub index: usize,
    /// A standby path (carries only when failover makes it).
    pub standby: bool,
    /// This node's link of the path.
    pub link: &'a LocalLink,
    /// Its distance from NCCL's device.
    pub closeness: Option<Closeness>,
}

/// The line (one per peer) of an accepting side whose NCCL device may take GPU memory while the
/// connector's paths end here on NICs beyond `NCCL_NET_GDR_LEVEL` of that device: each such cable
/// (netdev, address, RDMA device, PCIe root and distance) and what the connection does with it.
/// The connector chose the paths (from its own locality); this side cannot choose others, so they
/// are used as the connector's side uses far links (with a warning).
pub fn accept_gdr_warning(
    who: &str,
    dev: usize,
    name: &str,
    level: &str,
    far: &[FarEnd<'_>],
) -> String {
    let cable = |e: &FarEnd<'_>| {
        format!(
            "{}path [{}] {} {} (RDMA device {}, PCIe root {}: {})",
            if e.standby { "standby " } else { "" },
            e.index,
            e.link.netdev,
            e.link.addr,
            e.link.rdma_dev.as_deref().unwrap_or("none"),
            e.link.pci_root,
            distance(e.closeness)
        )
    };
    let carrying: Vec<String> = far.iter().filter(|e| !e.standby).map(cable).collect();
    let standby: Vec<String> = far.iter().filter(|e| e.standby).map(cable).collect();
    let mut decided = Vec::new();
    if !carrying.is_empty() {
        decided.push(format!(
            "{} carr{} data: GPU memory NCCL registers on this connection is registered there and \
             written by that NIC",
            carrying.join(", "),
            if carrying.len() == 1 { "ies" } else { "y" }
        ));
    }
    if !standby.is_empty() {
        decided.push(format!(
            "{}: carr{} data only when failover needs it, and the GPU memory NCCL registers on this \
             connection is registered there only then (at the failover)",
            standby.join(", "),
            if standby.len() == 1 { "ies" } else { "y" }
        ));
    }
    format!(
        "{who}: NCCL chose device {dev} ({name}) on this side and may use GPU-direct on it, but the \
         connector's paths end here on NICs farther than NCCL_NET_GDR_LEVEL={level} from that device \
         (the connector chose them from its own side's locality): {}. NCCL validated GPU-direct for \
         device {dev} only: expect these NICs' writes of GPU memory to run well below the links' rate \
         through a host bridge and lower still across sockets, or to fail where the platform does not \
         route PCIe peer-to-peer between root ports. Remedy: make NCCL on this side choose a NIC cabled \
         to this peer (a NCCL_TOPO_FILE, or NCCL_CROSS_NIC; see docs/guide/routing.md), accept the \
         distance with NCCL_NET_GDR_LEVEL=PHB or SYS, or keep NCCL's buffers in host memory with \
         NCCL_NET_GDR_LEVEL=LOC",
        decided.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accept_warning_names_each_far_cable_and_its_role() {
        let link = |id: usize, netdev: &str, addr: &str, root: &str| LocalLink {
            id,
            kind: LinkKind::Roce,
            netdev: netdev.into(),
            rdma_dev: Some(format!("mlx5_{id}")),
            port: 1,
            addr: addr.parse().unwrap_or_else(|_| unreachable!()),
            gid_index: Some(3),
            pci_root: root.into(),
            phys_port_id: id as u16,
            nccl_dev: Some(id),
            speed_mbps: 400_000,
            mtu: 9000,
            active_mtu: 4096,
            up: true,
        };
        let (a, b) = (
            link(4, "enp1", "10.0.4.1/31", "pci0000:80/0000:80:01.0"),
            link(5, "enp2", "10.0.5.1/31", "pci0000:00/0000:00:03.0"),
        );
        let far = [
            FarEnd {
                index: 0,
                standby: false,
                link: &a,
                closeness: Some(Closeness::Farther),
            },
            FarEnd {
                index: 1,
                standby: true,
                link: &b,
                closeness: Some(Closeness::SameNuma),
            },
        ];
        let w = accept_gdr_warning("accept from connector 10.0.4.0", 2, "sl_2", "PXB", &far);
        for want in [
            "accept from connector 10.0.4.0: NCCL chose device 2 (sl_2) on this side",
            "farther than NCCL_NET_GDR_LEVEL=PXB",
            "path [0] enp1 10.0.4.1/31 (RDMA device mlx5_4, PCIe root pci0000:80/0000:80:01.0: across the CPU interconnect",
            "carries data: GPU memory NCCL registers on this connection is registered there",
            "standby path [1] enp2 10.0.5.1/31 (RDMA device mlx5_5, PCIe root pci0000:00/0000:00:03.0: through the CPU's host bridge (PHB)): carries data only when failover needs it",
            "NCCL_NET_GDR_LEVEL=LOC",
        ] {
            assert!(w.contains(want), "{want:?} missing from: {w}");
        }
    }

    #[test]
    fn set_up_laps_go_to_their_step_and_sum_to_the_total() {
        let mut s = SetupSteps::start();
        std::thread::sleep(std::time::Duration::from_millis(2));
        s.lap(Step::Qps);
        s.lap(Step::Route);
        std::thread::sleep(std::time::Duration::from_millis(2));
        s.lap(Step::Handshake);
        assert!(s.qps >= std::time::Duration::from_millis(2), "{s:?}");
        assert!(s.handshake >= std::time::Duration::from_millis(2), "{s:?}");
        assert_eq!(s.rtr_rts + s.ready, std::time::Duration::ZERO);
        let total = s.lap.saturating_duration_since(s.started);
        assert_eq!(total, s.route + s.qps + s.rtr_rts + s.handshake + s.ready);
        let t = s.text();
        assert!(t.starts_with("set-up "), "{t}");
        for w in [
            "route ",
            "queue pairs ",
            "RTR/RTS ",
            "waits: handshake ",
            "ready ",
        ] {
            assert!(t.contains(w), "{t}");
        }
    }
}
