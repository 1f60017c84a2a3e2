//! `connect`: route to the peer's links, create the endpoint and the send comm, run the handshake
//! across NCCL's retries (the state is parked under an id written into the handle's scratch bytes),
//! and [`fold_qps`] for `NCCL_IB_QPS_PER_CONNECTION`.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::data::SendEnd;
use super::live::Live;
use super::relay::{Probed, Probing, RelayedPlan};
use super::report::{
    ConnReport, SetupSteps, Step, fallback_warning, gdr_scope, gdr_warning, level_name,
    routed_hint, same_host_note, step_error,
};
use super::{ConnOptions, Connectable, PathFactory, PathPlan, Switchless};
use crate::config::TransportMode;
use crate::error::{Error, Result};
use crate::plugin::{CommInfo, Handle};
use crate::route::handle::{Handle as HandleView, HandleRepr};
use crate::route::select::{
    Closeness, KindFilter, PathChoice, Reach, RouteOptions, Selection, Skipped, closeness, select,
};
use crate::route::types::{LinkKind, LocalLink, RemoteLink};
use crate::sync::lock;
use crate::transport::comm::SendComm;
use crate::transport::handshake::{
    ConnectPoll, Connector, Established, Liveness, PathParams, PathRequest, SideParams,
};
use crate::transport::wire::CtrlInfo;

/// A connection between `connect` calls.
pub(super) struct ConnectState<F: Connectable> {
    connector: Connector,
    comm: SendComm<Live<F>>,
    plans: Vec<PathPlan>,
    local: Vec<PathParams>,
    remote: Option<Vec<PathParams>>,
    opts: ConnOptions,
    peer: String,
    dev: usize,
    started: Instant,
    /// When NCCL last called `connect` for it (a state NCCL stopped calling for is swept).
    polled: Instant,
    /// The handshake finished; the endpoint is finishing its set-up ([`Connectable::poll_ready`]).
    est: Option<Established>,
    /// For a connection over routed paths (the TCP fallback through a gateway): what to check when it
    /// times out or is refused. Empty otherwise.
    routed_hint: String,
    /// Where the set-up time went (the INFO line of the connection).
    steps: SetupSteps,
}

/// Where a connection stands after one `connect` call.
enum Progress<F: Connectable> {
    Done(SendEnd<Live<F>>),
    Pending(Parked<F>),
}

/// A connection parked between `connect` calls: asking the neighbours' relays about a peer no
/// cable reaches ([`Probing`]), or set up and handshaking.
pub(super) enum Parked<F: Connectable> {
    Probing(Box<Probing>),
    Connecting(Box<ConnectState<F>>),
}

impl<F: Connectable> Parked<F> {
    fn peer(&self) -> &str {
        match self {
            Parked::Probing(p) => &p.peer,
            Parked::Connecting(c) => &c.peer,
        }
    }

    fn started(&self) -> Instant {
        match self {
            Parked::Probing(p) => p.started,
            Parked::Connecting(c) => c.started,
        }
    }

    fn polled_mut(&mut self) -> &mut Instant {
        match self {
            Parked::Probing(p) => &mut p.polled,
            Parked::Connecting(c) => &mut c.polled,
        }
    }

    fn routed_hint(&self) -> String {
        match self {
            Parked::Probing(_) => String::new(),
            Parked::Connecting(c) => c.routed_hint.clone(),
        }
    }
}

/// A parked connection NCCL has not called `connect` for this long is dropped (after an abort, NCCL
/// never comes back for it); with `NCCL_SWITCHLESS_CONNECT_TIMEOUT` set, twice that plus 10 s when
/// longer. NCCL calls a pending connect again on every pass of its service thread, milliseconds apart.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(60);

impl<P: PathFactory> Switchless<P> {
    /// `connect`: starts a connection or takes the parked one the handle names, and advances it.
    pub(super) fn connect_step(
        self: &Arc<Self>,
        comm: &CommInfo,
        dev: usize,
        handle: &mut Handle,
    ) -> Result<Option<SendEnd<Live<P::Fabric>>>> {
        let id = HandleView::new_unchecked(&handle[..]).scratch();
        let (id, s) = if id == 0 {
            let s = self.start_connect(comm, dev, handle)?;
            let id = self.id_base | self.next_id.fetch_add(1, Ordering::Relaxed);
            HandleView::new_unchecked(&mut handle[..]).set_scratch(id);
            (id, s)
        } else {
            let mut map = lock(&self.connecting, "connection states")?;
            let mut s = map.remove(&id).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "connect retried with connection state {id:#x}, which this process does not have \
                     (it failed or timed out earlier, or the handle's scratch bytes 120..128 are not zero)"
                ))
            })?;
            *s.polled_mut() = Instant::now();
            (id, s)
        };
        let hint = s.routed_hint();
        match self.advance(s) {
            Ok(Progress::Done(end)) => {
                HandleView::new_unchecked(&mut handle[..]).set_scratch(0);
                Ok(Some(end))
            }
            Ok(Progress::Pending(s)) => {
                let mut map = lock(&self.connecting, "connection states")?;
                self.sweep(&mut map);
                map.insert(id, s);
                Ok(None)
            }
            Err(e) => {
                HandleView::new_unchecked(&mut handle[..]).set_scratch(0);
                Err(match e {
                    Error::Timeout(x) if !hint.is_empty() => Error::Timeout(format!("{x}; {hint}")),
                    Error::System(x) if !hint.is_empty() => Error::System(format!("{x}; {hint}")),
                    e => e,
                })
            }
        }
    }

    /// Routes to the peer's links: `rdma` = RoCE pairs only; `tcp` = TCP on point-to-point links
    /// ([`crate::route::point_to_point`]: /30 or /31 subnets); `auto` = RoCE first, then TCP as for `tcp` (when no
    /// link is point-to-point, the RoCE error stands). Then, with `NCCL_SWITCHLESS_TCP_FALLBACK=1`
    /// only, TCP over any shared subnet (a management LAN) or kernel route through a gateway (a
    /// forwarding neighbour, the default route: [`Reach::Routed`]), with one WARN per peer.
    ///
    /// TCP paths are chosen whatever the device advertises: NCCL decides GPU-direct per connection
    /// from its own topology (a GB10's GPU has none, although its NIC passes the DMA-BUF probe), and
    /// only a GPU registration on a TCP connection is refused, naming the remedy
    /// ([`crate::transport::tcp::gpu_refusal`]; NCCL registers the connection's buffers right after
    /// connecting). RoCE paths of a device that may register GPU memory stay within
    /// `NCCL_NET_GDR_LEVEL` of NCCL's device when the device is overridden ([`Self::select_roce`]).
    ///
    /// This is the cables only ([`Self::route_fallback`] is the last resort, after relays:
    /// `super::relay`).
    fn route_direct(&self, dev: usize, peer: &[RemoteLink], who: &str) -> Result<Selection> {
        let opts = |kinds| RouteOptions {
            nccl_dev: Some(dev),
            kinds,
            ..RouteOptions::default()
        };
        let (p2p, tcp_peer) = self.tcp_inputs(peer);
        let routes = &self.view.routes;
        match self.view.config.transport {
            TransportMode::Rdma => self.select_roce(dev, peer, who),
            TransportMode::Tcp => select(&p2p, routes, &tcp_peer, &opts(KindFilter::Tcp)),
            TransportMode::Auto => match self.select_roce(dev, peer, who) {
                Ok(s) => Ok(s),
                Err(e) if p2p.is_empty() => Err(e),
                Err(_) => select(&p2p, routes, &tcp_peer, &opts(KindFilter::Tcp)),
            },
        }
    }

    /// `NCCL_SWITCHLESS_TCP_FALLBACK=1`: TCP over any shared subnet or kernel route, one WARN per
    /// peer; without it, `e` (why no cable reaches the peer) stands.
    fn route_fallback(
        &self,
        e: Error,
        dev: usize,
        peer: &[RemoteLink],
        who: &str,
    ) -> Result<Selection> {
        let opts = |kinds| RouteOptions {
            nccl_dev: Some(dev),
            kinds,
            ..RouteOptions::default()
        };
        let (links, routes) = (&self.view.links, &self.view.routes);
        if !self.view.config.tcp_fallback {
            return Err(e);
        }
        let routed = RouteOptions {
            reach: Reach::Routed,
            ..opts(KindFilter::Tcp)
        };
        let sel = select(links, routes, peer, &routed).map_err(|e2| {
            Error::InvalidUsage(format!(
                "{e2}; NCCL_SWITCHLESS_TCP_FALLBACK=1 found no shared IPv4 subnet or kernel route to the peer either"
            ))
        })?;
        let first_time =
            lock(&self.warned_peers, "fallback warnings").map(|mut w| w.insert(who.to_string()))?;
        if first_time {
            tracing::warn!("NET/switchless: {}", fallback_warning(who, &sel));
        }
        Ok(sel)
    }

    /// What TCP routing selects from: the point-to-point links, and the peer's addresses.
    fn tcp_inputs(&self, peer: &[RemoteLink]) -> (Vec<LocalLink>, Vec<RemoteLink>) {
        let p2p: Vec<LocalLink> = self
            .view
            .links
            .iter()
            .filter(|l| crate::route::point_to_point(l.addr))
            .cloned()
            .collect();
        let links = &self.view.links;
        // A rank of this host advertises every link of this host, a management /24 too, which TCP
        // selection leaves out of its local links: leave such addresses out of the peer's list as well,
        // so that routing still sees that every address the peer advertises is this host's.
        let on_p2p = |r: &RemoteLink| p2p.iter().any(|l| l.addr.addr() == r.addr.addr());
        let this_host = peer
            .iter()
            .all(|r| links.iter().any(|l| l.addr.addr() == r.addr.addr()));
        let tcp_peer: Vec<RemoteLink> = if this_host && peer.iter().any(on_p2p) {
            peer.iter().filter(|r| on_p2p(r)).cloned().collect()
        } else {
            peer.to_vec()
        };
        (p2p, tcp_peer)
    }

    /// The standby paths of a connection on NCCL's device `dev` whose carrying paths are `sel`
    /// ([`crate::route::standby`]): of the same kind (RoCE, or TCP on point-to-point links), none
    /// for routed paths; for GPU memory RoCE only and within `NCCL_NET_GDR_LEVEL` of `dev` (the
    /// locality NCCL decided GPU-direct by). None with `NCCL_SWITCHLESS_STANDBY=0` or failover
    /// off.
    pub(super) fn standby_paths(
        &self,
        dev: usize,
        peer: &[RemoteLink],
        sel: &Selection,
    ) -> Vec<PathChoice> {
        let cfg = &self.view.config;
        if !cfg.standby || !cfg.failover || sel.paths.iter().any(|p| p.via.is_some()) {
            return Vec::new();
        }
        let roce = sel.paths.iter().all(|p| p.kind == LinkKind::Roce);
        let gpu = self.gpu_memory(dev) && roce;
        let (mut links, peer) = if roce {
            (self.view.links.clone(), peer.to_vec())
        } else {
            self.tcp_inputs(peer)
        };
        if gpu {
            if let Some(near) = gdr_scope(cfg.net_gdr_level).and_then(|s| self.near_links(dev, s)) {
                links = near;
            }
        }
        let opts = RouteOptions {
            nccl_dev: Some(dev),
            kinds: if roce {
                KindFilter::Roce
            } else {
                KindFilter::Tcp
            },
            ..RouteOptions::default()
        };
        crate::route::standby(&links, &self.view.routes, &peer, &opts, sel)
    }

    /// RoCE pairs to the peer. When NCCL's device does not reach the peer and NCCL may put GPU
    /// memory on the connection, the links within `NCCL_NET_GDR_LEVEL` of that device are preferred
    /// (NCCL decided GPU-direct for that device only); when only farther links reach the peer they
    /// are used, with one WARN per peer ([`gdr_warning`]).
    fn select_roce(&self, dev: usize, peer: &[RemoteLink], who: &str) -> Result<Selection> {
        let opts = RouteOptions {
            nccl_dev: Some(dev),
            kinds: KindFilter::Roce,
            ..RouteOptions::default()
        };
        let (links, routes) = (&self.view.links, &self.view.routes);
        let sel = select(links, routes, peer, &opts)?;
        if sel.dev_override.is_none() || !self.gpu_memory(dev) {
            return Ok(sel);
        }
        let Some(scope) = gdr_scope(self.view.config.net_gdr_level) else {
            return Ok(sel);
        };
        let Some(near) = self.near_links(dev, scope) else {
            return Ok(sel); // the device has no PCI function to measure from
        };
        if sel
            .paths
            .iter()
            .all(|p| near.iter().any(|n| n.id == p.local.id))
        {
            return Ok(sel);
        }
        let level = level_name(self.view.config.net_gdr_level);
        if let Ok(mut s) = select(&near, routes, peer, &opts) {
            for p in sel
                .paths
                .iter()
                .filter(|p| !near.iter().any(|n| n.id == p.local.id))
            {
                s.skipped.push(Skipped {
                    local: format!("{} {}", p.local.netdev, p.local.addr),
                    remote: Some(p.remote.addr.addr()),
                    reason: format!(
                        "usable, but farther from NCCL's device {dev} than NCCL_NET_GDR_LEVEL={level} allows for GPU memory"
                    ),
                });
            }
            return Ok(s);
        }
        let first_time =
            lock(&self.warned_gdr, "GPU-direct warnings").map(|mut w| w.insert(who.to_string()))?;
        if first_time {
            tracing::warn!(
                "NET/switchless: {}",
                gdr_warning(who, dev, &self.dev_name(dev), &level, &sel, |root| self
                    .closeness_to(dev, root))
            );
        }
        Ok(sel)
    }

    /// The NCCL device's name (`sl_...`), or empty.
    pub(super) fn dev_name(&self, dev: usize) -> String {
        self.props
            .get(dev)
            .map(|p| p.name.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The NUMA node of the PCI functions under `root` (from the devices' members).
    fn numa_of(&self, root: &str) -> Option<i32> {
        self.view
            .devices
            .iter()
            .flat_map(|d| &d.members)
            .find(|m| m.pci_root.as_deref() == Some(root))
            .and_then(|m| m.numa_node)
    }

    /// How close a link under PCIe root `root` is to the nearest member of NCCL's device `dev`;
    /// `None` when the device has no member with a known root.
    pub(super) fn closeness_to(&self, dev: usize, root: &str) -> Option<Closeness> {
        let d = self.view.devices.get(dev)?;
        d.members
            .iter()
            .filter_map(|m| m.pci_root.as_deref().map(|r| (r, m.numa_node)))
            .map(|(r, n)| closeness(root, self.numa_of(root), r, n))
            .min()
    }

    /// The links within `scope` of NCCL's device `dev`; `None` when that cannot be judged.
    pub(super) fn near_links(&self, dev: usize, scope: Closeness) -> Option<Vec<LocalLink>> {
        let d = self.view.devices.get(dev)?;
        if !d.members.iter().any(|m| m.pci_root.is_some()) {
            return None;
        }
        Some(
            self.view
                .links
                .iter()
                .filter(|l| {
                    l.nccl_dev == Some(dev)
                        || self
                            .closeness_to(dev, &l.pci_root)
                            .is_some_and(|c| c <= scope)
                })
                .cloned()
                .collect(),
        )
    }

    fn sweep(&self, map: &mut HashMap<u64, Parked<P::Fabric>>) {
        let limit = self.timeout().map_or(ABANDONED_AFTER, |t| {
            (2 * t + Duration::from_secs(10)).max(ABANDONED_AFTER)
        });
        map.retain(|id, s| {
            let polled = *s.polled_mut();
            let keep = polled.elapsed() < limit;
            if !keep {
                tracing::warn!(
                    "NET/switchless: dropping connection {id:#x} to {}: abandoned by NCCL for {} s (started {} s ago)",
                    s.peer(),
                    polled.elapsed().as_secs(),
                    s.started().elapsed().as_secs()
                );
            }
            keep
        });
    }

    /// Sweeps abandoned parked connections (see [`ABANDONED_AFTER`]); `listen`, `accept` and
    /// `closeListen` call it too, so a state NCCL abandoned goes even when no `connect` follows.
    pub(super) fn sweep_parked(&self) {
        if let Ok(mut map) = lock(&self.connecting, "connection states") {
            self.sweep(&mut map);
        }
    }

    /// Makes every parked connection look `by` older to the sweep, as if NCCL had not called
    /// `connect` for it that long: lets a test check the sweep without waiting for its bound.
    #[doc(hidden)]
    pub fn age_parked(&self, by: Duration) {
        if let Ok(mut map) = lock(&self.connecting, "connection states") {
            for s in map.values_mut() {
                let p = s.polled_mut();
                *p = p.checked_sub(by).unwrap_or(*p);
            }
        }
    }

    fn start_connect(
        self: &Arc<Self>,
        comm: &CommInfo,
        dev: usize,
        handle: &Handle,
    ) -> Result<Parked<P::Fabric>> {
        let repr = HandleRepr::from_bytes(&handle[..]).map_err(|e| {
            Error::InvalidArgument(format!(
                "connect on device {dev}: the handle is not a switchless listen handle: {e}"
            ))
        })?;
        let peer = format!(
            "peer {} (port {})",
            repr.links
                .iter()
                .map(|l| l.addr.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            repr.port
        );
        let peer_key = format!(
            "peer {}",
            repr.links
                .iter()
                .map(|l| l.addr.addr().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let steps = SetupSteps::start();
        let sel = match self.route_direct(dev, &repr.links, &peer_key) {
            Ok(sel) => sel,
            Err(e) => {
                match self.start_probing(comm, dev, &repr, &peer, &peer_key, e, &steps, false) {
                    // No cable reaches the peer: the neighbours' relays are asked first.
                    Ok(p) => return Ok(Parked::Probing(p)),
                    Err(e) => self.route_fallback(e, dev, &repr.links, &peer_key)?,
                }
            }
        };
        // The mesh policy: a Ring/Tree hint adds relay paths next to the direct TCP ones (relay
        // legs are TCP; a RoCE route keeps its paths).
        if !sel.same_host
            && sel
                .paths
                .iter()
                .all(|p| p.kind == LinkKind::Tcp && p.via.is_none())
            && self.wants_mesh_relays(comm)
        {
            let none = Error::Internal(String::new());
            if let Ok(mut p) =
                self.start_probing(comm, dev, &repr, &peer, &peer_key, none, &steps, true)
            {
                p.direct = Some(sel);
                return Ok(Parked::Probing(p));
            }
        }
        self.connect_selected(comm, dev, &repr, peer, &peer_key, sel, steps)
            .map(Parked::Connecting)
    }

    /// The connection over the paths `sel` chose: endpoint, send comm, handshake.
    #[allow(clippy::too_many_arguments)]
    fn connect_selected(
        &self,
        comm: &CommInfo,
        dev: usize,
        repr: &HandleRepr,
        peer: String,
        peer_key: &str,
        sel: Selection,
        mut steps: SetupSteps,
    ) -> Result<Box<ConnectState<P::Fabric>>> {
        let _ = peer_key;
        if sel.same_host {
            tracing::info!(
                "NET/switchless: connect to {peer}: {}",
                same_host_note(&sel)
            );
        }
        if let Some(ov) = &sel.dev_override {
            tracing::info!("NET/switchless: connect to {peer}: {}", ov.reason);
        }
        let mut chosen = fold_qps(&sel.paths, self.view.config.ib_qps_per_connection);
        let carrying = chosen.len();
        let mut standby = self.standby_paths(dev, &repr.links, &sel);
        standby.truncate(crate::transport::stripe::MAX_PATHS.saturating_sub(carrying));
        if !standby.is_empty() {
            tracing::info!(
                "NET/switchless: connect to {peer}: {} standby path(s) for failover, one queue pair each: {}",
                standby.len(),
                standby
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        chosen.append(&mut standby);
        let plans: Vec<PathPlan> = chosen
            .iter()
            .map(|p| PathPlan {
                local: p.local.clone(),
                remote: p.remote.addr.addr(),
                kind: p.kind,
                relay: None,
            })
            .collect();
        let routed_hint = routed_hint(&chosen[..carrying]);
        steps.lap(Step::Route);
        let standby: Vec<usize> = (carrying..chosen.len()).collect();
        self.launch(
            comm,
            dev,
            peer,
            plans,
            &standby,
            steps,
            routed_hint,
            None,
            |mine| Connector::start(repr, &chosen, mine, self.timeout()),
        )
    }

    /// Creates the endpoint over `plans` (those at `standby` held back for failover) and the send
    /// comm, and starts the handshake with `start` (given this side's parameters).
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        comm: &CommInfo,
        dev: usize,
        peer: String,
        plans: Vec<PathPlan>,
        standby: &[usize],
        mut steps: SetupSteps,
        routed_hint: String,
        floor: Option<(Vec<usize>, u64)>,
        start: impl FnOnce(SideParams) -> Result<Connector>,
    ) -> Result<Box<ConnectState<P::Fabric>>> {
        let opts = self.opts(comm, dev, false);
        let proto = self.proto;
        let fab = self
            .factory
            .create(&plans, None, &opts)
            .map_err(|e| step_error(e, &peer, "creating the queue pairs"))?;
        let local = fab.local_params();
        let mut sc = SendComm::new(Live::new(fab), proto)?;
        sc.set_standby(standby)?;
        if let Some((paths, bytes)) = &floor {
            sc.set_min_message(paths, *bytes)?;
        }
        let extra = sc.local_info().to_bytes();
        steps.lap(Step::Qps);
        let connector = start(SideParams {
            paths: local.clone(),
            extra,
        })?;
        Ok(Box::new(ConnectState {
            connector,
            comm: sc,
            plans,
            local,
            remote: None,
            opts,
            peer,
            dev,
            started: Instant::now(),
            polled: Instant::now(),
            est: None,
            routed_hint,
            steps,
        }))
    }

    /// Advances a parked connection as far as the sockets allow.
    fn advance(&self, s: Parked<P::Fabric>) -> Result<Progress<P::Fabric>> {
        match s {
            Parked::Connecting(c) => self.advance_conn(c),
            Parked::Probing(p) => match self.poll_probing(p)? {
                Probed::Pending(p) => Ok(Progress::Pending(Parked::Probing(p))),
                Probed::NoRelay(mut p, e) => {
                    let sel = match p.direct.take() {
                        Some(sel) => {
                            tracing::info!(
                                "NET/switchless: connect to {}: no neighbour relays it; direct paths only",
                                p.peer
                            );
                            sel
                        }
                        None => self.route_fallback(e, p.dev, &p.repr.links, &p.peer_key)?,
                    };
                    let c = self.connect_selected(
                        &p.comm,
                        p.dev,
                        &p.repr,
                        p.peer.clone(),
                        &p.peer_key,
                        sel,
                        p.steps,
                    )?;
                    self.advance_conn(c)
                }
                Probed::Relayed(mut p, plan) => {
                    if let Some(sel) = p.direct.take() {
                        let c = self.connect_mesh(&p, sel, plan)?;
                        return self.advance_conn(c);
                    }
                    let RelayedPlan {
                        plans,
                        requests,
                        target,
                    } = plan;
                    let (nonce, timeout, label) = (p.repr.nonce, self.timeout(), p.peer.clone());
                    let c = self.launch(
                        &p.comm,
                        p.dev,
                        p.peer.clone(),
                        plans,
                        &[],
                        p.steps,
                        String::new(),
                        None,
                        |mine| {
                            Connector::start_to(vec![target], nonce, requests, mine, timeout, label)
                        },
                    )?;
                    self.advance_conn(c)
                }
            },
        }
    }

    /// The mesh policy's connection: the direct paths of `sel` and the relay paths of `plan`,
    /// striped by the model's ring split (each relay path half the direct paths' weight, below
    /// every direct path; [`super::relay::mesh_relay_weight`]) and with a smallest chunk that
    /// keeps messages under [`super::relay::MESH_RELAY_FLOOR`] on the direct paths.
    fn connect_mesh(
        &self,
        p: &Probing,
        sel: Selection,
        plan: RelayedPlan,
    ) -> Result<Box<ConnectState<P::Fabric>>> {
        use super::relay::{MESH_RELAY_FLOOR, mesh_relay_weight};
        let direct = fold_qps(&sel.paths, self.view.config.ib_qps_per_connection);
        let total: u64 = direct.iter().map(|c| u64::from(c.local.speed_mbps)).sum();
        let slowest = direct
            .iter()
            .map(|c| u64::from(c.local.speed_mbps))
            .min()
            .unwrap_or(0);
        let mut plans: Vec<PathPlan> = direct
            .iter()
            .map(|c| PathPlan {
                local: c.local.clone(),
                remote: c.remote.addr.addr(),
                kind: c.kind,
                relay: None,
            })
            .collect();
        let mut requests: Vec<PathRequest> = direct
            .iter()
            .map(|c| PathRequest {
                connector: c.local.addr,
                acceptor: c.remote.addr.addr(),
                kind: c.kind,
                relayed: false,
            })
            .collect();
        let room = crate::transport::stripe::MAX_PATHS.saturating_sub(plans.len());
        let (mut relay_min, mut sum) = (u64::MAX, total);
        for (mut rp, rq) in plan.plans.into_iter().zip(plan.requests).take(room) {
            let w = mesh_relay_weight(total, slowest, u64::from(rp.local.speed_mbps));
            rp.local.speed_mbps = u32::try_from(w).unwrap_or(u32::MAX);
            relay_min = relay_min.min(w);
            sum += w;
            plans.push(rp);
            requests.push(rq);
        }
        // The relay paths carry no piece of a message under the floor (the comm's own rule, so
        // it holds as the adaptive weights move).
        let floor = (
            (direct.len()..plans.len()).collect::<Vec<_>>(),
            MESH_RELAY_FLOOR,
        );
        tracing::info!(
            "NET/switchless: connect to {}: {} direct and {} relayed path(s) (a Ring/Tree hint); relay weight {} of {} Mb/s, direct paths only below {} KiB",
            p.peer,
            direct.len(),
            plans.len() - direct.len(),
            relay_min,
            sum,
            MESH_RELAY_FLOOR / 1024
        );
        let first = direct
            .first()
            .ok_or_else(|| Error::Internal("a mesh connection without a direct path".into()))?;
        let mut targets = vec![(
            std::net::SocketAddrV4::new(first.remote.addr.addr(), p.repr.port),
            Some(first.local.addr.addr()),
        )];
        if let Some(c) = p.repr.control.filter(|&c| c != first.remote.addr.addr()) {
            targets.push((std::net::SocketAddrV4::new(c, p.repr.port), None));
        }
        let (nonce, timeout, label) = (p.repr.nonce, self.timeout(), p.peer.clone());
        let hint = routed_hint(&direct);
        self.launch(
            &p.comm,
            p.dev,
            p.peer.clone(),
            plans,
            &[],
            p.steps,
            hint,
            Some(floor),
            |mine| Connector::start_to(targets, nonce, requests, mine, timeout, label),
        )
    }

    /// Advances a connection whose endpoint exists as far as the sockets allow.
    fn advance_conn(&self, mut s: Box<ConnectState<P::Fabric>>) -> Result<Progress<P::Fabric>> {
        loop {
            if let Some(est) = s.est.take() {
                let ready = s
                    .comm
                    .fabric_mut()
                    .poll_ready()
                    .map_err(|e| step_error(e, &s.peer, "connecting the data paths"))?;
                if !ready {
                    s.est = Some(est);
                    return Ok(Progress::Pending(Parked::Connecting(s)));
                }
                s.steps.lap(Step::Ready);
                let remote = s.remote.take().unwrap_or_default();
                let tcp = format!("tcp {} -> {}", est.local, est.peer);
                let peer_ip = est.peer.ip().to_string();
                s.comm.fabric_mut().watch(Liveness::new(est)?);
                self.metrics
                    .add(true, &peer_ip, s.dev, &s.plans, s.comm.metrics())?;
                self.log_connected(&ConnReport {
                    verb: "connected to",
                    peer: &s.peer,
                    dev: s.dev,
                    plans: &s.plans,
                    local: &s.local,
                    remote: &remote,
                    fab: s.comm.fabric(),
                    tcp,
                    steps: &s.steps,
                });
                return Ok(Progress::Done(SendEnd::new(s.comm)));
            }
            match s.connector.poll()? {
                ConnectPoll::Pending => return Ok(Progress::Pending(Parked::Connecting(s))),
                ConnectPoll::Reply(side) => {
                    s.steps.lap(Step::Handshake);
                    let ctrl = CtrlInfo::from_bytes(&side.extra)
                        .map_err(|e| step_error(e, &s.peer, "reading its control info"))?;
                    s.comm
                        .fabric()
                        .connect_peer(
                            &side.paths,
                            &ConnOptions {
                                secret: s.connector.fabric_secret(),
                                ..s.opts
                            },
                        )
                        .map_err(|e| step_error(e, &s.peer, "bringing the QPs to RTR/RTS"))?;
                    s.comm.connect(ctrl)?;
                    s.steps.lap(Step::RtrRts);
                    s.remote = Some(side.paths);
                    s.connector.ready()?;
                }
                ConnectPoll::Done(est) => {
                    s.steps.lap(Step::Handshake);
                    s.est = Some(est);
                }
            }
        }
    }
}

/// `NCCL_IB_QPS_PER_CONNECTION`: each chosen path is carried by `qps` queue pairs (each a path of the
/// transport, sharing the link's speed), capped so a connection has at most
/// [`crate::transport::stripe::MAX_PATHS`] of them. Interleaved (p0, p1, p0, p1, ...) so consecutive
/// paths keep alternating PCIe roots.
pub fn fold_qps(paths: &[PathChoice], qps: u8) -> Vec<PathChoice> {
    let n = paths.len().max(1);
    let k = usize::from(qps.max(1))
        .min(crate::transport::stripe::MAX_PATHS / n)
        .max(1);
    let mut out = Vec::with_capacity(n * k);
    for _ in 0..k {
        for p in paths {
            let mut q = p.clone();
            q.local.speed_mbps /= k as u32;
            out.push(q);
        }
    }
    out
}
