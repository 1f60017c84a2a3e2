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
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use ipnet::Ipv4Net;

use super::report::{SetupSteps, Step};
use super::{PathFactory, PathPlan, Switchless};
use crate::config::{Config, RelayMode, TransportMode};
use crate::error::{Error, Result};
use crate::plugin::CommInfo;
use crate::route::handle::HandleRepr;
use crate::route::types::{LinkKind, LocalLink, point_to_point_peers};
use crate::transport::handshake::PathRequest;
use crate::transport::relay::{
    CommKey, Found, Probe, ProbeState, RelayDialer, RelayLink, Relays, ServiceConfig, Ticket,
    port_for, wire::MAX_TARGETS,
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
    }))
}

/// A communicator's relay service registration, kept by its context until `finalize`.
#[derive(Debug)]
pub struct RelayTicket {
    _ticket: Ticket,
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
    pub(super) steps: SetupSteps,
}

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
    /// `init` of a communicator (ABI v11+): serves relays for it on `port_for(comm id)`, unless
    /// relays are off or another rank of this host serves that port already.
    pub(super) fn serve_relays(&self, info: &CommInfo) -> Result<Option<RelayTicket>> {
        let (Some(relays), Some(id)) = (&self.relays, info.comm_id) else {
            return Ok(None);
        };
        Ok(Some(RelayTicket {
            _ticket: relays.register(id)?,
        }))
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
        for l in p2p_links(&self.view.links) {
            for far in point_to_point_peers(l.addr).unwrap_or_default() {
                if targets.contains(&far) {
                    continue;
                }
                probes.push(Probe::start(
                    l.addr.addr(),
                    SocketAddr::new(IpAddr::V4(far), port),
                    key.clone(),
                    targets.clone(),
                ));
            }
        }
        if probes.is_empty() {
            return Err(why);
        }
        tracing::info!(
            "NET/switchless: connect to {peer}: no cable reaches it; asking {} neighbour relay(s) on port {port}",
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
            steps: *steps,
        }))
    }

    /// Advances the probes; once every neighbour answered, plans the connection over the relays
    /// that reach the peer.
    pub(super) fn poll_probing(&self, mut p: Box<Probing>) -> Result<Probed> {
        let mut found: Vec<Found> = Vec::new();
        let mut failed: Vec<String> = Vec::new();
        for probe in &mut p.probes {
            match probe.poll() {
                ProbeState::Pending => return Ok(Probed::Pending(p)),
                ProbeState::Found(f) => found.push(f.clone()),
                ProbeState::Failed(why) => failed.push(why.clone()),
            }
        }
        p.steps.lap(Step::Route);
        if found.is_empty() {
            let why = std::mem::replace(&mut p.why, Error::Internal(String::new()));
            let e = why.append(format_args!(
                "; no neighbour relays it either ({})",
                failed.join("; ")
            ));
            if self.view.config.relay == RelayMode::Always {
                return Err(e.append("; NCCL_SWITCHLESS_RELAY=always allows no fallback"));
            }
            return Ok(Probed::NoRelay(p, e));
        }
        let plan = self.plan_relayed(&p.repr, &p.peer, &p.key, &found)?;
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
    ) -> Result<RelayedPlan> {
        let control = repr.control.ok_or_else(|| {
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
            "NET/switchless: connect to {peer}: no cable reaches it; {} relayed TCP path(s) through {}",
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
