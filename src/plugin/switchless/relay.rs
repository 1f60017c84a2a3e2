//! Relay paths in the backend (issue 30; design and bounds: docs/guide/relay.md).
//!
//! * The service: [`relays_for`] builds this process's registry of relay services over the host's
//!   point-to-point links; `init` (ABI v11+, with NCCL's communicator id) registers the
//!   communicator (`Switchless::serve_relays`) and `finalize` drops the ticket, which stops the
//!   service with the last communicator of its port. ABI v6–v10 pass no communicator id and have
//!   no `finalize` (a thread of ours would outlive `dlclose`): there the plugin neither serves nor
//!   uses relays, and a peer no cable reaches fails or takes the TCP fallback as before.
//! * The connecting side: when no cable reaches the peer, `Probing` asks the relay of every
//!   neighbour (the far end of each of this host's /30 or /31, on `port_for(comm id)`) which of
//!   the peer's addresses it reaches, without blocking NCCL's thread; each neighbour that answers
//!   gives one relayed TCP path. None: the TCP fallback (`NCCL_SWITCHLESS_TCP_FALLBACK=1`), or
//!   the routing error naming every neighbour asked and its answer.
//! * Two relays away: when no neighbour reaches the peer (and no cable does), `Probing` asks each
//!   neighbour K1 to list the far ends of its other links (`LinkList`), then probes each such K2
//!   through K1 (`Probe::start_chained`); each chain that reaches the peer gives one relayed path
//!   through both. One-hop relays are preferred: chains are asked only when none answers.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ipnet::Ipv4Net;

use super::report::{SetupSteps, Step};
use super::{PathFactory, PathPlan, Switchless};
use crate::config::{Config, RelayMode, TransportMode};
use crate::error::{Error, Result};
use crate::plugin::{CommInfo, NetAttr};
use crate::route::handle::HandleRepr;
use crate::route::types::{LinkKind, LocalLink, point_to_point_peers};
use crate::transport::handshake::PathRequest;
use crate::transport::relay::{
    CommKey, Found, LinkList, ListState, Probe, ProbeState, RelayDialer, RelayLink, Relays,
    ServiceConfig, Ticket, port_for, wire::MAX_TARGETS,
};
use crate::transport::tcp::{RelayVia, TcpConfig};

/// This host's up point-to-point links, one per address (a RoCE port and its netdev are one).
fn p2p_links(links: &[LocalLink]) -> Vec<&LocalLink> {
    let mut out: Vec<&LocalLink> = Vec::new();
    for l in links
        .iter()
        .filter(|l| l.up && crate::route::point_to_point(l.addr))
    {
        if !out.iter().any(|o| o.addr.addr() == l.addr.addr()) {
            out.push(l);
        }
    }
    out
}

/// The relay services of this process over the host's point-to-point links; `None` with
/// `NCCL_SWITCHLESS_RELAY=off`, `NCCL_SWITCHLESS_TRANSPORT=rdma` (relay legs are TCP only), or
/// no such link.
pub fn relays_for(cfg: &Config, links: &[LocalLink]) -> Option<Arc<Relays>> {
    if cfg.relay == RelayMode::Off || cfg.transport == TransportMode::Rdma {
        return None;
    }
    let links: Vec<RelayLink> = p2p_links(links)
        .into_iter()
        .map(|l| RelayLink {
            addr: l.addr,
            netdev: l.netdev.clone(),
            speed_mbps: l.speed_mbps,
        })
        .collect();
    if links.is_empty() {
        return None;
    }
    let reader = crate::host::Reader::new(Path::new("/"));
    Some(Relays::new(ServiceConfig {
        links,
        bounds: Default::default(),
        tcp: TcpConfig {
            connect_timeout: cfg.connect_timeout,
            user_timeout: cfg.tcp_user_timeout,
            ..TcpConfig::default()
        },
        host: crate::plugin::metrics::hostname(),
        link_down: Some(Arc::new(move |netdev: &str| {
            crate::host::links::netdev_link_down(&reader, netdev)
        })),
        // Verbs legs are not wired into the plugin yet (docs/guide/relay.md): TCP legs only.
        verbs: None,
    }))
}

/// A communicator's relay service registration and its hold on the communicator's `setNetAttr`
/// hint, kept by its context until `finalize`. `_ticket` is `None` when the service could not
/// start (the hint is kept all the same).
#[derive(Debug)]
pub struct RelayTicket {
    _ticket: Option<Ticket>,
    _hints: HintLease,
}

/// The latest `setNetAttr` hint per communicator id (v11+), read by `connect` for the mesh relay
/// policy ([`mesh_relay`]), and how many live contexts (`init` without `finalize` yet) hold each
/// id: the hint goes with the last of them. At most [`super::MAX_HINTED_COMMS`] hints (one is
/// forgotten to make room).
#[derive(Debug, Default)]
pub(super) struct Hints {
    attrs: HashMap<u64, NetAttr>,
    users: HashMap<u64, usize>,
}

impl Hints {
    pub(super) fn get(&self, id: u64) -> Option<NetAttr> {
        self.attrs.get(&id).copied()
    }

    pub(super) fn set(&mut self, id: u64, attr: NetAttr) {
        if self.attrs.len() >= super::MAX_HINTED_COMMS && !self.attrs.contains_key(&id) {
            if let Some(&k) = self.attrs.keys().next() {
                self.attrs.remove(&k);
            }
        }
        self.attrs.insert(id, attr);
    }

    /// Communicators with a hint kept (tests, the bound).
    pub(super) fn len(&self) -> usize {
        self.attrs.len()
    }
}

/// One context's hold on its communicator's hint: the last one dropped (at `finalize`) forgets
/// the hint, so a later communicator that gets the same id starts without one.
#[derive(Debug)]
struct HintLease {
    hints: Arc<Mutex<Hints>>,
    id: u64,
}

impl HintLease {
    fn new(hints: &Arc<Mutex<Hints>>, id: u64) -> Result<HintLease> {
        *crate::sync::lock(hints, "setNetAttr hints")?
            .users
            .entry(id)
            .or_insert(0) += 1;
        Ok(HintLease {
            hints: Arc::clone(hints),
            id,
        })
    }
}

impl Drop for HintLease {
    fn drop(&mut self) {
        // A poisoned lock (a panic elsewhere) leaves the hint: bounded, and harmless but stale.
        let Ok(mut h) = crate::sync::lock(&self.hints, "setNetAttr hints") else {
            return;
        };
        match h.users.get_mut(&self.id) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                h.users.remove(&self.id);
                h.attrs.remove(&self.id);
            }
        }
    }
}

/// A connection whose peer no cable reaches, asking the neighbours' relays.
pub(super) struct Probing {
    pub(super) peer: String,
    pub(super) started: Instant,
    pub(super) polled: Instant,
    pub(super) comm: CommInfo,
    pub(super) dev: usize,
    pub(super) repr: HandleRepr,
    pub(super) peer_key: String,
    /// Why no cable reaches the peer.
    why: Error,
    key: CommKey,
    probes: Vec<Probe>,
    /// Each neighbour asked: this host's link address toward it and its relay door.
    asked: Vec<(Ipv4Addr, SocketAddr)>,
    /// The peer's point-to-point addresses the probes name.
    targets: Vec<Ipv4Addr>,
    /// Past the one-hop probes: the search for chains of two relays.
    chain: Chain,
    pub(super) steps: SetupSteps,
    /// The mesh policy ([`mesh_relay`]): the direct route, to which the relay paths found are
    /// added (none found: the direct paths alone). `None`: no cable reaches the peer.
    pub(super) direct: Option<crate::route::select::Selection>,
}

/// Where the search for chains of two relays (A → K1 → K2 → B) stands; only for a peer no cable
/// reaches, once no neighbour's relay reaches it.
enum Chain {
    /// The one-hop probes are still out (or found relays).
    NotYet,
    /// Each neighbour K1 is asked for the far ends of its other links (the K2s).
    Listing {
        lists: Vec<(Ipv4Addr, SocketAddr, LinkList)>,
        /// Why no neighbour relays the peer itself.
        one_hop: Vec<String>,
    },
    /// Each K2 is probed through its K1.
    Probing {
        probes: Vec<Probe>,
        one_hop: Vec<String>,
    },
}

/// Most chains asked for one connection (each is one door connection per probe at K1 and K2).
const MAX_CHAINS: usize = 16;

/// What the probes came to.
pub(super) enum Probed {
    /// Some neighbour has not answered yet.
    Pending(Box<Probing>),
    /// No neighbour relays the peer: why (the routing error and every neighbour's answer).
    NoRelay(Box<Probing>, Error),
    /// The relayed paths to connect over.
    Relayed(Box<Probing>, RelayedPlan),
}

/// A connection over relays, as planned: the paths (each with its dialer), what the hello says
/// of each, and where the handshake goes.
pub(super) struct RelayedPlan {
    pub(super) plans: Vec<PathPlan>,
    pub(super) requests: Vec<PathRequest>,
    pub(super) target: (SocketAddrV4, Option<Ipv4Addr>),
}

impl<P: PathFactory> Switchless<P> {
    /// [`mesh_relay`] for a connection of `comm`: relays served here, a communicator id, and its
    /// latest hint.
    pub(super) fn wants_mesh_relays(&self, comm: &CommInfo) -> bool {
        let (Some(_), Some(id)) = (&self.relays, comm.comm_id) else {
            return false;
        };
        let hint = crate::sync::lock(&self.hints, "setNetAttr hints")
            .ok()
            .and_then(|h| h.get(id));
        mesh_relay(self.view.config.relay, hint.as_ref())
    }

    /// `init` of a communicator (ABI v11+): serves relays for it on `port_for(comm id)`, unless
    /// relays are off or another rank of this host serves that port already.
    pub(super) fn serve_relays(&self, info: &CommInfo) -> Result<Option<RelayTicket>> {
        let (Some(relays), Some(id)) = (&self.relays, info.comm_id) else {
            return Ok(None);
        };
        let hints = HintLease::new(&self.hints, id)?;
        // A relay service that cannot start costs this host's neighbours their relay through it
        // (they try the others, then fall back), never this communicator's init.
        let ticket = relays
            .register(id)
            .map_err(|e| {
                tracing::warn!("NET/switchless: no relay service for communicator {id:#x}: {e}");
            })
            .ok();
        Ok(Some(RelayTicket {
            _ticket: ticket,
            _hints: hints,
        }))
    }

    /// Communicators whose `setNetAttr` hint this backend keeps (for tests).
    pub fn hinted_comms(&self) -> usize {
        crate::sync::lock(&self.hints, "setNetAttr hints").map_or(0, |h| h.len())
    }

    /// Starts asking every neighbour's relay about the peer of `repr`; `Err(why)` (unchanged)
    /// when relays are off, the ABI passes no communicator id, or no neighbour could relay.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_probing(
        &self,
        comm: &CommInfo,
        dev: usize,
        repr: &HandleRepr,
        peer: &str,
        peer_key: &str,
        why: Error,
        steps: &SetupSteps,
        mesh: bool,
    ) -> std::result::Result<Box<Probing>, Error> {
        let Some(id) = comm.comm_id else {
            return Err(why);
        };
        if self.relays.is_none() {
            return Err(why);
        }
        let targets: Vec<Ipv4Addr> = repr
            .links
            .iter()
            .filter(|r| crate::route::point_to_point(r.addr))
            .map(|r| r.addr.addr())
            .take(MAX_TARGETS)
            .collect();
        if targets.is_empty() {
            return Err(why);
        }
        let key = CommKey::new(id);
        let port = port_for(id);
        let mut probes = Vec::new();
        let mut asked = Vec::new();
        for l in p2p_links(&self.view.links) {
            for far in point_to_point_peers(l.addr).unwrap_or_default() {
                if targets.contains(&far) {
                    continue;
                }
                let relay = SocketAddr::new(IpAddr::V4(far), port);
                asked.push((l.addr.addr(), relay));
                let probe = Probe::start(l.addr.addr(), relay, key.clone(), targets.clone());
                // Next to direct paths a relay is an extra: a neighbour without one costs
                // the connection a second at most.
                probes.push(if mesh {
                    probe.patience(MESH_PROBE_WAIT)
                } else {
                    probe
                });
            }
        }
        if probes.is_empty() {
            return Err(why);
        }
        tracing::info!(
            "NET/switchless: connect to {peer}: {}; asking {} neighbour relay(s) on port {port}",
            if mesh {
                "a Ring/Tree hint on a mesh"
            } else {
                "no cable reaches it"
            },
            probes.len()
        );
        Ok(Box::new(Probing {
            peer: peer.to_string(),
            started: Instant::now(),
            polled: Instant::now(),
            comm: *comm,
            dev,
            repr: repr.clone(),
            peer_key: peer_key.to_string(),
            why,
            key,
            probes,
            asked,
            targets,
            chain: Chain::NotYet,
            steps: *steps,
            direct: None,
        }))
    }

    /// Advances the probes; once every neighbour answered, plans the connection over the relays
    /// that reach the peer.
    pub(super) fn poll_probing(&self, mut p: Box<Probing>) -> Result<Probed> {
        match std::mem::replace(&mut p.chain, Chain::NotYet) {
            Chain::NotYet => {}
            Chain::Listing { lists, one_hop } => return self.poll_listing(p, lists, one_hop),
            Chain::Probing { probes, one_hop } => return self.poll_chains(p, probes, one_hop),
        }
        let mut found: Vec<Found> = Vec::new();
        let mut failed: Vec<String> = Vec::new();
        for probe in &mut p.probes {
            match probe.poll() {
                ProbeState::Pending => return Ok(Probed::Pending(p)),
                ProbeState::Found(f) => found.push(f.clone()),
                ProbeState::Failed(why) => failed.push(why.clone()),
            }
        }
        if found.is_empty() && p.direct.is_none() {
            // No neighbour reaches the peer: ask them which hosts they are cabled to, to probe
            // those through them (chains of two relays); only those whose door answered, as one
            // that never listened or answered would cost the connection its patience again.
            let lists = p
                .asked
                .iter()
                .zip(&p.probes)
                .filter(|(_, probe)| probe.answered())
                .map(|(&(local, relay), _)| {
                    (local, relay, LinkList::start(local, relay, p.key.clone()))
                })
                .collect();
            return self.poll_listing(p, lists, failed);
        }
        self.probed(p, found, failed)
    }

    /// The neighbours' lists of links: once all answered, probes each K2 behind its K1.
    fn poll_listing(
        &self,
        mut p: Box<Probing>,
        mut lists: Vec<(Ipv4Addr, SocketAddr, LinkList)>,
        mut one_hop: Vec<String>,
    ) -> Result<Probed> {
        // Every list is advanced (none waits on another's answer).
        let mut pending = false;
        for (_, _, l) in &mut lists {
            pending |= *l.poll() == ListState::Pending;
        }
        if pending {
            p.chain = Chain::Listing { lists, one_hop };
            return Ok(Probed::Pending(p));
        }
        let mine: Vec<Ipv4Addr> = self.view.links.iter().map(|l| l.addr.addr()).collect();
        let mut probes = Vec::new();
        let mut names = Vec::new();
        for (local, relay, l) in &mut lists {
            match l.poll() {
                ListState::Done(far) => {
                    for k2 in far {
                        // The peer itself would have answered the one-hop probe; this host is
                        // no relay of its own connection.
                        if p.targets.contains(k2) || mine.contains(k2) || probes.len() >= MAX_CHAINS
                        {
                            continue;
                        }
                        names.push(format!("{k2} through {}", relay.ip()));
                        probes.push(Probe::start_chained(
                            *local,
                            *relay,
                            *k2,
                            p.key.clone(),
                            p.targets.clone(),
                        ));
                    }
                }
                ListState::Failed(why) => one_hop.push(format!("listing its links: {why}")),
                ListState::Pending => {}
            }
        }
        if probes.is_empty() {
            return self.probed(p, Vec::new(), one_hop);
        }
        tracing::info!(
            "NET/switchless: connect to {}: no neighbour relays it; asking {} relay(s) two hops away ({})",
            p.peer,
            probes.len(),
            names.join(", ")
        );
        self.poll_chains(p, probes, one_hop)
    }

    /// The chained probes: once all answered, plans the connection over the chains that reach
    /// the peer.
    fn poll_chains(
        &self,
        mut p: Box<Probing>,
        mut probes: Vec<Probe>,
        mut failed: Vec<String>,
    ) -> Result<Probed> {
        let mut found = Vec::new();
        let mut chained = Vec::new();
        let mut pending = false;
        // Every probe is advanced (none waits on another's answer).
        for probe in &mut probes {
            match probe.poll() {
                ProbeState::Pending => pending = true,
                ProbeState::Found(f) => found.push(f.clone()),
                ProbeState::Failed(why) => chained.push(why.clone()),
            }
        }
        if pending {
            p.chain = Chain::Probing {
                probes,
                one_hop: failed,
            };
            return Ok(Probed::Pending(p));
        }
        if found.is_empty() {
            failed.extend(chained);
        }
        self.probed(p, found, failed)
    }

    /// Every probe answered: the relayed plan, or why none relays the peer.
    fn probed(
        &self,
        mut p: Box<Probing>,
        found: Vec<Found>,
        failed: Vec<String>,
    ) -> Result<Probed> {
        p.steps.lap(Step::Route);
        if found.is_empty() {
            let why = std::mem::replace(&mut p.why, Error::Internal(String::new()));
            let e = why.append(format_args!(
                "; no neighbour relays it either ({})",
                failed.join("; ")
            ));
            if self.view.config.relay == RelayMode::Always && p.direct.is_none() {
                return Err(e.append("; NCCL_SWITCHLESS_RELAY=always allows no fallback"));
            }
            return Ok(Probed::NoRelay(p, e));
        }
        let plan = self.plan_relayed(&p.repr, &p.peer, &p.key, &found, p.direct.is_some())?;
        Ok(Probed::Relayed(p, plan))
    }

    /// One relayed TCP path per relay found. The handshake goes to the handle's control address
    /// (no cable reaches the peer); each path's streams go through its relay, and the peer
    /// authenticates each end to end with the connection's secret.
    fn plan_relayed(
        &self,
        repr: &HandleRepr,
        peer: &str,
        key: &CommKey,
        found: &[Found],
        mesh: bool,
    ) -> Result<RelayedPlan> {
        // Next to direct paths the handshake goes over them (the target is not used).
        let control = repr.control.or(mesh.then_some(Ipv4Addr::UNSPECIFIED)).ok_or_else(|| {
            Error::InvalidUsage(format!(
                "connect to {peer}: relays {} reach it, but its listen handle has no control address \
                 (a management network) to carry the handshake",
                found.iter().map(Found::name).collect::<Vec<_>>().join(", ")
            ))
        })?;
        let mut plans = Vec::new();
        let mut reqs = Vec::new();
        for f in found.iter().take(
            crate::transport::stripe::MAX_PATHS.min(crate::transport::handshake::wire::MAX_PATHS),
        ) {
            let Some(l) = self
                .view
                .links
                .iter()
                .find(|l| l.addr.addr() == f.local && crate::route::point_to_point(l.addr))
            else {
                continue;
            };
            let mut local = l.clone();
            // The slower leg bounds the path (the relay told its link speed toward the peer).
            if f.speed_mbps != 0 && (local.speed_mbps == 0 || f.speed_mbps < local.speed_mbps) {
                local.speed_mbps = f.speed_mbps;
            }
            let prefix = repr
                .links
                .iter()
                .find(|r| r.addr.addr() == f.target)
                .map_or(30, |r| r.addr.prefix_len());
            let connector = Ipv4Net::new(f.via, prefix).map_err(|_| {
                Error::Internal(format!(
                    "prefix {prefix} of the peer's address {}",
                    f.target
                ))
            })?;
            reqs.push(PathRequest {
                connector,
                acceptor: f.target,
                kind: LinkKind::Tcp,
                relayed: true,
            });
            plans.push(PathPlan {
                local,
                remote: f.target,
                kind: LinkKind::Tcp,
                relay: Some(RelayVia {
                    name: f.name(),
                    chained: f.next.is_some(),
                    dialer: Some(Arc::new(RelayDialer::new(f, key.clone()))),
                }),
            });
        }
        if plans.is_empty() {
            return Err(Error::Internal(format!(
                "connect to {peer}: the relays found answered on links this host does not have"
            )));
        }
        tracing::info!(
            "NET/switchless: connect to {peer}: {}; {} relayed TCP path(s) through {}",
            if mesh {
                "a Ring/Tree hint on a mesh"
            } else {
                "no cable reaches it"
            },
            plans.len(),
            plans
                .iter()
                .filter_map(|p| p.relay.as_ref().map(|r| r.name.clone()))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(RelayedPlan {
            plans,
            requests: reqs,
            target: (SocketAddrV4::new(control, repr.port), None),
        })
    }
}

// ---- The mesh policy: relay paths next to the direct ones, by NCCL's hints. ----

/// `ncclNetAttr.op` bits of the collectives (`BIT(ncclFunc_t)`: broadcast, reduce, all-gather,
/// reduce-scatter, all-reduce). Any other bit is point-to-point (send/recv, alltoall, scatter,
/// gather), where a two-hop byte costs two cables.
pub const OP_COLLECTIVES: u32 = 0x1f;
/// `ncclNetAttr.algo` bits: `BIT(NCCL_ALGO_TREE)`, `BIT(NCCL_ALGO_RING)`.
pub const ALGO_TREE_BIT: u32 = 1 << 0;
/// See [`ALGO_TREE_BIT`].
pub const ALGO_RING_BIT: u32 = 1 << 1;
/// `ncclNetAttr.proto` bit of `NCCL_PROTO_SIMPLE`, the protocol of large steps.
pub const PROTO_SIMPLE_BIT: u32 = 1 << 2;
/// Most concurrent peers a connection's hint may name and still get relay paths: a ring has 1
/// each way, a tree at most 2 × (arity − 1) = 4 (NCCL's `NCCL_MAX_TREE_ARITY` is 3); a p2p
/// fan-out names p2p channels × 8.
pub const MESH_MAX_PEERS: i32 = 4;
/// Messages below this many bytes use the direct paths only (`SendComm::set_min_message` on the
/// relay paths): one NCCL Simple step (4 MiB buffer / 8 steps). The model (docs/performance.md)
/// found relays lose on smaller ring steps.
pub const MESH_RELAY_FLOOR: u64 = 512 * 1024;
/// How long a mesh connection waits for a neighbour's relay that refuses or stays silent (a
/// peer no cable reaches waits [`crate::transport::relay::client::PROBE_WAIT`]).
pub const MESH_PROBE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether a connection with a direct route also gets relay paths (issue 30, item 3): relays on,
/// and the communicator's latest `setNetAttr` hint names few concurrent peers and either
///
/// * is the hint NCCL gives right before it connects a **collective** connection (ring, tree,
///   PAT: `populateCommNetAttrs` in NCCL's `transport/net.cc`): `op`, `algo` and `proto`
///   undefined, max concurrent peers min(2 × (tree arity − 1), ranks) = at most 4. NCCL sets
///   `algo` only per transfer, after its connections are made, and a p2p connection's hint names
///   the p2p ops instead; or
/// * says Ring or Tree (and nothing else), only collective operations, and the Simple protocol if
///   any (a transfer hint: the connection is made by something other than NCCL's proxy).
///
/// No hint (ABI v6–v10, or none given yet), no peer count, a p2p op bit or another algorithm: no
/// relay paths.
pub fn mesh_relay(mode: RelayMode, hint: Option<&crate::plugin::NetAttr>) -> bool {
    let Some(h) = hint else {
        return false;
    };
    if mode == RelayMode::Off {
        return false;
    }
    let few = |a: &crate::plugin::CommAttr| {
        a.max_concurrent_peers
            .is_some_and(|n| (1..=MESH_MAX_PEERS).contains(&n))
    };
    if !(few(&h.send) && few(&h.recv)) {
        return false;
    }
    if h.op.is_none() && h.algo.is_none() && h.proto.is_none() {
        return true; // NCCL's connect-time hint of a collective connection
    }
    let ring_or_tree = ALGO_RING_BIT | ALGO_TREE_BIT;
    let algo_ok = matches!(h.algo, Some(a) if a != 0 && a & !ring_or_tree == 0);
    let op_ok = h.op.is_none_or(|o| o & !OP_COLLECTIVES == 0);
    let proto_ok = h.proto.is_none_or(|p| p & PROTO_SIMPLE_BIT != 0);
    algo_ok && op_ok && proto_ok
}

/// The stripe weight (Mb/s) of each relay path next to direct paths of `direct` Mb/s in all and
/// `slowest` Mb/s the slowest, with `relays` relay hosts: the model's ring split, 2/N of the
/// bytes direct and 1/N through each of the N − 2 other hosts, so each relay path weighs half the
/// direct sum; never above its slower leg (`leg`), and below every direct path so that a message
/// too small to split over all paths stays on the direct ones.
pub fn mesh_relay_weight(direct: u64, slowest: u64, leg: u64) -> u64 {
    let mut w = (direct / 2).max(1);
    if leg != 0 {
        w = w.min(leg);
    }
    w.min(slowest.saturating_sub(1).max(1))
}

#[cfg(test)]
mod mesh_tests {
    use super::*;
    use crate::plugin::{CommAttr, NetAttr};

    fn hint(op: u32, algo: Option<u32>, proto: Option<u32>, peers: i32) -> NetAttr {
        let a = CommAttr {
            max_concurrent_peers: Some(peers),
            ..CommAttr::default()
        };
        NetAttr {
            send: a,
            recv: a,
            op: Some(op),
            algo,
            proto,
        }
    }

    #[test]
    fn ring_and_tree_with_few_peers_get_relays_fan_outs_never() {
        let ar = 1 << 4;
        let ring = hint(ar, Some(ALGO_RING_BIT), Some(PROTO_SIMPLE_BIT), 1);
        assert!(mesh_relay(RelayMode::Auto, Some(&ring)));
        assert!(mesh_relay(RelayMode::Always, Some(&ring)));
        assert!(!mesh_relay(RelayMode::Off, Some(&ring)));
        assert!(!mesh_relay(RelayMode::Auto, None));
        let tree = hint(ar, Some(ALGO_TREE_BIT), None, 4);
        assert!(mesh_relay(RelayMode::Auto, Some(&tree)));
        // Too many peers, small steps, other algorithms, undefined algorithm, p2p ops: no.
        assert!(!mesh_relay(
            RelayMode::Auto,
            Some(&hint(ar, Some(ALGO_RING_BIT), None, 5))
        ));
        assert!(!mesh_relay(
            RelayMode::Auto,
            Some(&hint(ar, Some(ALGO_RING_BIT), Some(1), 1))
        ));
        assert!(!mesh_relay(
            RelayMode::Auto,
            Some(&hint(ar, Some(1 << 6), None, 1))
        ));
        assert!(!mesh_relay(RelayMode::Auto, Some(&hint(ar, None, None, 1))));
        // No peer count: not a hint that says how the connection is used.
        let mut no_peers = ring;
        no_peers.send.max_concurrent_peers = None;
        assert!(!mesh_relay(RelayMode::Auto, Some(&no_peers)));
        // NCCL_NET_ATTR_INIT untouched (every field undefined): says nothing, no relays. NCCL's
        // own connect-time hints are checked against this rule in `tools::bench::hints`.
        assert!(!mesh_relay(RelayMode::Auto, Some(&NetAttr::default())));
        for p2p in [1 << 5, 1 << 6, 1 << 7, 1 << 8, 1 << 9, 1 << 10] {
            let h = hint(p2p | ar, Some(ALGO_RING_BIT), None, 1);
            assert!(!mesh_relay(RelayMode::Auto, Some(&h)), "op {p2p:#x}");
        }
    }

    #[test]
    fn relay_weights_follow_the_ring_split_below_every_direct_path() {
        // One 10 Gb/s direct path: half of it, below it.
        assert_eq!(mesh_relay_weight(10_000, 10_000, 10_000), 5_000);
        // Four 400 Gb/s direct paths: half the sum is 800, held below the slowest direct path.
        assert_eq!(mesh_relay_weight(1_600_000, 400_000, 400_000), 399_999);
        // A slower leg bounds it.
        assert_eq!(mesh_relay_weight(10_000, 10_000, 2_000), 2_000);
    }
}
