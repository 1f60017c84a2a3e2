//! The real backend: [`Switchless`], generic over the [`PathFactory`] that builds endpoints (RoCE or TCP
//! in production, an in-memory fabric in tests), and that seam: [`PathFactory`], [`Connectable`],
//! [`HostView`], [`PathPlan`], [`ConnOptions`].
//!
//! What it does per NCCL call (nccl-net-abi.md §2.2):
//!
//! * `listen(dev)`: binds a non-blocking TCP listener on `0.0.0.0:0` and writes the listen handle with
//!   **every** local link that is up (address/prefix, PCIe root and cable ids, kind), the nonce, the port
//!   and a control address (the first up TCP-only link, e.g. a management NIC, if any).
//! * `connect(dev, handle)`: decodes the handle (a bad one is an `InvalidArgument` naming the field),
//!   routes with `dev` as a hint (`route::select`; an override is logged at INFO), creates the endpoint
//!   over the chosen paths and a [`SendComm`], and starts the handshake with the per-path parameters and
//!   the send comm's control info in `extra`. It returns `Ok(None)` until the handshake completes.
//!   **Retry state**: NCCL passes the same private handle copy on every retry, so the first call writes a
//!   state id into the handle's scratch bytes (120..128, ignored by the decoder) and parks the
//!   connection in the backend under that id; later calls find it there. On the acceptor's reply the
//!   paths are connected (verbs: RTR with path MTU = min of both active MTUs and the peer's GID, then
//!   RTS with NCCL_IB_TIMEOUT/RETRY_CNT/TC/SL), the peer's control info is installed and `ready` is sent.
//!   The handshake gives up after `NCCL_SWITCHLESS_CONNECT_TIMEOUT` with an error naming the peer and
//!   the step; parked states older than twice that are dropped.
//! * `accept(listen)`: polls the listener; on a valid hello (its paths already checked against this
//!   node's links and routes) creates the endpoint on the requested local links, connects it to the
//!   connector's parameters, builds the [`RecvComm`] (receives posted) and responds; returns the comm when
//!   the connector's `ready` arrives.
//! * One INFO line per connection: peer, and per path the local/remote netdev address, GID index, PCIe
//!   root, MTU and QP numbers.
//! * Data calls delegate to [`SendComm`]/[`RecvComm`]. A request holds a shared reference to its comm
//!   (`test` gets no comm from NCCL); closing a comm stops it, and a request tested afterwards fails.
//!
//! No threads: everything runs on NCCL's calls, so `dlclose` after `finalize` leaves nothing behind.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::config::TransportMode;
use crate::error::{Error, Result};
use crate::host::NcclDevice;
use crate::plugin::{
    Backend, CommInfo, CommMut, FlushBuf, Handle, Properties, PtrSupport, RecvBuf, Region, Slot,
};
use crate::route::handle::{Handle as HandleView, HandleRepr};
use crate::route::select::{KindFilter, PathChoice, Reach, RouteOptions, select};
use crate::route::types::LinkKind;
use crate::route::types::{KernelRoute, LocalLink};
use crate::transport::comm::{self, MemHandle, ProtocolConfig, RecvComm, Registrar, SendComm};
use crate::transport::fabric::Fabric;
use crate::transport::fabric::MemKind;
use crate::transport::handshake::{
    AcceptPoll, AcceptorView, ConnectPoll, Connector, Established, Incoming, Listener, PathParams,
    SideParams,
};
use crate::transport::stripe::StripeParams;
use crate::transport::wire::CtrlInfo;
use crate::verbs::fabric::QpTuning;

// ---- The seam to the NIC: what a factory builds and what the backend asks of an endpoint. ----

/// One path of a connection as the backend planned it (connector: from `route::select`; acceptor: from
/// the hello, checked by `route::check_incoming`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPlan {
    /// This node's link.
    pub local: LocalLink,
    /// The peer's address on the same subnet.
    pub remote: Ipv4Addr,
    /// What the path carries.
    pub kind: LinkKind,
}

/// What a connection needs besides its paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnOptions {
    /// Create loopback paths for the GPU-direct flush (receiving side, device can register GPU memory).
    pub loopback: bool,
    /// QP attributes (traffic class, SL, timeout, retries).
    pub tuning: Option<QpTuning>,
}

/// The host as the backend sees it at `init`.
#[derive(Debug, Clone)]
pub struct HostView {
    /// The configuration (`Config::from_env`).
    pub config: Config,
    /// NCCL's devices, in NCCL order.
    pub devices: Vec<NcclDevice>,
    /// Every local link (all devices, and TCP links).
    pub links: Vec<LocalLink>,
    /// The kernel's IPv4 routes.
    pub routes: Vec<KernelRoute>,
}

/// One connection's endpoint before and after the handshake.
pub trait Connectable: Fabric + Send + 'static {
    /// This side's parameters, one per data path, in path order (QPNs, PSN, GID, MTU).
    fn local_params(&self) -> Vec<PathParams>;

    /// Connects every data path to the peer's parameters (verbs: RTR then RTS). Called once.
    fn connect_peer(&self, peer: &[PathParams], opts: &ConnOptions) -> Result<()>;

    /// The negotiated MTU of data path `i` in bytes, for the connection log line.
    fn path_mtu(&self, i: usize, peer: &PathParams) -> u32;

    /// Advances a set-up that finishes after the handshake (TCP: the streams connect once the
    /// connector knows the acceptor's ports) without blocking; `Ok(true)` once the endpoint can carry
    /// traffic. The backend polls it (connector after `connect_peer` and `ready`, acceptor after the
    /// connector's `ready`) and returns "in progress" to NCCL meanwhile. Verbs and memfab are ready
    /// at once.
    fn poll_ready(&mut self) -> Result<bool> {
        Ok(true)
    }
}

/// Builds connection endpoints; one per backend.
pub trait PathFactory: Sized + Send + Sync + 'static {
    /// The endpoint type.
    type Fabric: Connectable;

    /// The per-process slot of the backend over this factory (one `static` per factory type).
    fn slot() -> &'static Slot<Switchless<Self>>;

    /// Opens the factory and describes the host. An error makes `init` fail (NCCL falls back).
    fn open() -> Result<(Self, HostView)>;

    /// Creates the endpoint of one connection over `paths`. `peer` holds the peer's parameters when
    /// they are already known (acceptor side).
    fn create(
        &self,
        paths: &[PathPlan],
        peer: Option<&[PathParams]>,
        opts: &ConnOptions,
    ) -> Result<Self::Fabric>;
}

// ---- The backend. ----

/// A comm shared between its NCCL object and its in-flight requests; `None` once closed.
type Shared<T> = Arc<Mutex<Option<T>>>;

fn lock<T>(m: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    m.lock()
        .map_err(|_| Error::Internal("comm lock poisoned by an earlier panic".into()))
}

/// The backend. See the module docs.
pub struct Switchless<P: PathFactory> {
    factory: P,
    view: HostView,
    props: Vec<Properties>,
    proto: ProtocolConfig,
    connecting: Mutex<HashMap<u64, Box<ConnectState<P::Fabric>>>>,
    id_base: u64,
    next_id: AtomicU64,
    /// The small-MTU warning was given (once per process).
    warned_mtu: AtomicBool,
    /// Peers already warned about the TCP fallback.
    warned_peers: Mutex<std::collections::HashSet<String>>,
}

impl<P: PathFactory> std::fmt::Debug for Switchless<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Switchless")
            .field("devices", &self.props.len())
            .field("links", &self.view.links.len())
            .finish()
    }
}

struct ConnectState<F: Connectable> {
    connector: Connector,
    comm: SendComm<F>,
    plans: Vec<PathPlan>,
    local: Vec<PathParams>,
    remote: Option<Vec<PathParams>>,
    opts: ConnOptions,
    peer: String,
    dev: usize,
    started: Instant,
    /// The handshake finished; the endpoint is finishing its set-up ([`Connectable::poll_ready`]).
    est: Option<Established>,
    /// For a connection over routed paths (the TCP fallback through a gateway): what to check when it
    /// times out or is refused. Empty otherwise.
    routed_hint: String,
}

/// The sending end of a connection (`sendComm`).
pub struct SendEnd<F: Connectable> {
    comm: Shared<SendComm<F>>,
}

/// The receiving end of a connection (`recvComm`).
pub struct RecvEnd<F: Connectable> {
    comm: Shared<RecvComm<F>>,
}

impl<F: Connectable> std::fmt::Debug for SendEnd<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendEnd")
            .field("paths", &self.path_labels())
            .finish()
    }
}

impl<F: Connectable> std::fmt::Debug for RecvEnd<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvEnd")
            .field("paths", &self.path_labels())
            .finish()
    }
}

impl<F: Connectable> SendEnd<F> {
    /// The labels of the connection's paths (data paths, then loopbacks); empty once closed.
    pub fn path_labels(&self) -> Vec<String> {
        self.comm
            .lock()
            .ok()
            .and_then(|g| {
                g.as_ref()
                    .map(|c| c.fabric().paths().iter().map(|p| p.label.clone()).collect())
            })
            .unwrap_or_default()
    }
}

impl<F: Connectable> RecvEnd<F> {
    /// The labels of the connection's paths (data paths, then loopbacks); empty once closed.
    pub fn path_labels(&self) -> Vec<String> {
        self.comm
            .lock()
            .ok()
            .and_then(|g| {
                g.as_ref()
                    .map(|c| c.fabric().paths().iter().map(|p| p.label.clone()).collect())
            })
            .unwrap_or_default()
    }
}

/// An in-flight request: its comm and the comm's request handle.
pub enum Req<F: Connectable> {
    /// From `isend`.
    Send(Shared<SendComm<F>>, comm::Request),
    /// From `irecv` or `iflush`.
    Recv(Shared<RecvComm<F>>, comm::Request),
}

struct Responding<F: Connectable> {
    inc: Incoming,
    comm: RecvComm<F>,
    plans: Vec<PathPlan>,
    local: Vec<PathParams>,
}

/// The handshake is done; the endpoint finishes its set-up ([`Connectable::poll_ready`]).
struct Finishing<F: Connectable> {
    comm: RecvComm<F>,
    plans: Vec<PathPlan>,
    local: Vec<PathParams>,
    remote: Vec<PathParams>,
    est: Established,
}

enum AcceptState<F: Connectable> {
    Waiting,
    Responding(Box<Responding<F>>),
    Finishing(Box<Finishing<F>>),
    Done,
    Failed,
}

/// Where a connection stands after one `connect` call.
enum Progress<F: Connectable> {
    Done(SendEnd<F>),
    Pending(Box<ConnectState<F>>),
}

/// A listening endpoint (`listenComm`).
pub struct ListenEnd<P: PathFactory> {
    backend: Arc<Switchless<P>>,
    listener: Listener,
    dev: usize,
    comm: CommInfo,
    state: AcceptState<P::Fabric>,
}

/// NCCL's view of one device.
pub fn properties_of(d: &NcclDevice, cfg: &crate::config::Config) -> Result<Properties> {
    let pci = (!d.pci_path.is_empty()).then_some(d.pci_path.as_str());
    let mut p = Properties::host(&d.name, pci, d.guid)?;
    p.speed_mbps = i32::try_from(d.speed_mbps).unwrap_or(i32::MAX);
    p.port = i32::from(d.port);
    p.latency_us = d.latency_us;
    p.max_comms = d.max_comms;
    p.max_recvs = d.max_recvs.min(crate::transport::wire::MAX_RECVS as i32);
    p.ptr_support = PtrSupport(d.ptr_support);
    p.max_p2p_bytes = usize::try_from(d.max_p2p_bytes).unwrap_or(super::MAX_NET_SIZE_BYTES);
    let (rail, plane) = d
        .members
        .first()
        .map_or((None, None), |m| cfg.ib_hca.rail_plane(&m.rdma_dev, m.port));
    p.rail_id = rail.or((d.rail_id >= 0).then_some(d.rail_id));
    p.plane_id = plane.or((d.plane_id >= 0).then_some(d.plane_id));
    Ok(p)
}

impl<P: PathFactory> Switchless<P> {
    /// Builds the backend over an opened factory and host view (what [`Backend::open`] does after
    /// `P::open`; tests call it directly).
    pub fn from_parts(factory: P, view: HostView) -> Result<Switchless<P>> {
        let props = view
            .devices
            .iter()
            .map(|d| properties_of(d, &view.config))
            .collect::<Result<Vec<_>>>()?;
        let proto = ProtocolConfig {
            stripe: StripeParams {
                min_chunk: view.config.min_chunk.max(1),
                ..StripeParams::default()
            },
            request_timeout: view.config.request_timeout,
            ..ProtocolConfig::default()
        };
        let mut b = [0u8; 4];
        getrandom::fill(&mut b)
            .map_err(|e| Error::System(format!("reading random bytes for state ids: {e}")))?;
        Ok(Switchless {
            factory,
            view,
            props,
            proto,
            connecting: Mutex::new(HashMap::new()),
            id_base: u64::from(u32::from_le_bytes(b) | 1) << 32,
            next_id: AtomicU64::new(1),
            warned_mtu: AtomicBool::new(false),
            warned_peers: Mutex::new(std::collections::HashSet::new()),
        })
    }

    /// The factory (tests reach their in-memory fabric through it).
    pub fn factory(&self) -> &P {
        &self.factory
    }

    /// The host view the backend routes with.
    pub fn view(&self) -> &HostView {
        &self.view
    }

    /// Connections in progress (parked between `connect` retries).
    pub fn connecting(&self) -> usize {
        self.connecting.lock().map_or(0, |m| m.len())
    }

    /// Warns once per process when a RoCE path runs below a 4096-byte MTU (the interface-MTU-1500 trap).
    fn check_mtu<F: Connectable>(&self, plans: &[PathPlan], remote: &[PathParams], fab: &F) {
        for (i, (p, r)) in plans.iter().zip(remote).enumerate() {
            let mtu = fab.path_mtu(i, r);
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
                    r.mtu
                );
            }
        }
    }

    fn timeout(&self) -> Duration {
        self.view.config.connect_timeout
    }

    /// Routes to the peer's links: `rdma` = RoCE pairs only; `tcp` = TCP on point-to-point links
    /// ([`crate::route::point_to_point`]: /30 or /31 subnets); `auto` = RoCE first, then TCP as for `tcp` (when no
    /// link is point-to-point, the RoCE error stands). Then, with `NCCL_SWITCHLESS_TCP_FALLBACK=1`
    /// only, TCP over any shared subnet (a management LAN) or kernel route through a gateway (a
    /// forwarding neighbour, the default route: [`Reach::Routed`]), with one WARN per peer.
    fn route(
        &self,
        dev: usize,
        peer: &[crate::route::types::RemoteLink],
        who: &str,
    ) -> Result<crate::route::select::Selection> {
        let opts = |kinds| RouteOptions {
            nccl_dev: Some(dev),
            kinds,
            ..RouteOptions::default()
        };
        let p2p: Vec<crate::route::types::LocalLink> = self
            .view
            .links
            .iter()
            .filter(|l| crate::route::point_to_point(l.addr))
            .cloned()
            .collect();
        let (links, routes) = (&self.view.links, &self.view.routes);
        let first = match self.view.config.transport {
            TransportMode::Rdma => select(links, routes, peer, &opts(KindFilter::Roce)),
            TransportMode::Tcp => select(&p2p, routes, peer, &opts(KindFilter::Tcp)),
            TransportMode::Auto => match select(links, routes, peer, &opts(KindFilter::Roce)) {
                Ok(s) => Ok(s),
                Err(e) if p2p.is_empty() => Err(e),
                Err(_) => select(&p2p, routes, peer, &opts(KindFilter::Tcp)),
            },
        };
        let e = match first {
            Ok(s) => return Ok(s),
            Err(e) => e,
        };
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
        let first_time = lock(&self.warned_peers).map(|mut w| w.insert(who.to_string()))?;
        if first_time {
            tracing::warn!("NET/switchless: {}", fallback_warning(who, &sel));
        }
        Ok(sel)
    }

    fn opts(&self, comm: &CommInfo, dev: usize, receiving: bool) -> ConnOptions {
        let gpu = PtrSupport(PtrSupport::CUDA.0 | PtrSupport::DMABUF.0);
        let loopback = receiving
            && self
                .props
                .get(dev)
                .is_some_and(|p| p.ptr_support.0 & gpu.0 != 0);
        let tc = comm.traffic_class.and_then(|t| u8::try_from(t).ok());
        ConnOptions {
            loopback,
            tuning: Some(QpTuning::from_config(&self.view.config, tc)),
        }
    }

    fn control_addr(&self) -> Option<Ipv4Addr> {
        self.view
            .links
            .iter()
            .find(|l| l.up && l.kind == LinkKind::Tcp)
            .map(|l| l.addr.addr())
    }

    fn sweep(&self, map: &mut HashMap<u64, Box<ConnectState<P::Fabric>>>) {
        let limit = 2 * self.timeout() + Duration::from_secs(10);
        map.retain(|id, s| {
            let keep = s.started.elapsed() < limit;
            if !keep {
                tracing::warn!(
                    "NET/switchless: dropping connection {id:#x} to {}: abandoned by NCCL for {} s",
                    s.peer,
                    s.started.elapsed().as_secs()
                );
            }
            keep
        });
    }

    fn start_connect(
        self: &Arc<Self>,
        comm: &CommInfo,
        dev: usize,
        handle: &Handle,
    ) -> Result<Box<ConnectState<P::Fabric>>> {
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
        let sel = self.route(dev, &repr.links, &peer_key)?;
        if let Some(ov) = &sel.dev_override {
            tracing::info!("NET/switchless: connect to {peer}: {}", ov.reason);
        }
        let chosen = fold_qps(&sel.paths, self.view.config.ib_qps_per_connection);
        let plans: Vec<PathPlan> = chosen
            .iter()
            .map(|p| PathPlan {
                local: p.local.clone(),
                remote: p.remote.addr.addr(),
                kind: p.kind,
            })
            .collect();
        let routed_hint = routed_hint(&chosen);
        let opts = self.opts(comm, dev, false);
        let fab = self
            .factory
            .create(&plans, None, &opts)
            .map_err(|e| step_error(e, &peer, "creating the queue pairs"))?;
        let local = fab.local_params();
        let sc = SendComm::new(fab, self.proto)?;
        let extra = sc.local_info().to_bytes();
        let connector = Connector::start(
            &repr,
            &chosen,
            SideParams {
                paths: local.clone(),
                extra,
            },
            self.timeout(),
        )?;
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
            est: None,
            routed_hint,
        }))
    }

    /// Advances a connection as far as the sockets allow.
    fn advance(&self, mut s: Box<ConnectState<P::Fabric>>) -> Result<Progress<P::Fabric>> {
        loop {
            if let Some(est) = s.est.take() {
                let ready = s
                    .comm
                    .fabric_mut()
                    .poll_ready()
                    .map_err(|e| step_error(e, &s.peer, "connecting the data paths"))?;
                if !ready {
                    s.est = Some(est);
                    return Ok(Progress::Pending(s));
                }
                let remote = s.remote.take().unwrap_or_default();
                self.check_mtu(&s.plans, &remote, s.comm.fabric());
                tracing::info!(
                    "NET/switchless: {}",
                    describe(
                        "connected to",
                        &s.peer,
                        s.dev,
                        &self.props,
                        &s.plans,
                        &s.local,
                        &remote,
                        s.comm.fabric(),
                        &format!("tcp {} -> {}", est.local, est.peer),
                        &self.view.routes,
                    )
                );
                return Ok(Progress::Done(SendEnd {
                    comm: Arc::new(Mutex::new(Some(s.comm))),
                }));
            }
            match s.connector.poll()? {
                ConnectPoll::Pending => return Ok(Progress::Pending(s)),
                ConnectPoll::Reply(side) => {
                    let ctrl = CtrlInfo::from_bytes(&side.extra)
                        .map_err(|e| step_error(e, &s.peer, "reading its control info"))?;
                    s.comm
                        .fabric()
                        .connect_peer(&side.paths, &s.opts)
                        .map_err(|e| step_error(e, &s.peer, "bringing the QPs to RTR/RTS"))?;
                    s.comm.connect(ctrl)?;
                    s.remote = Some(side.paths);
                    s.connector.ready()?;
                }
                ConnectPoll::Done(est) => s.est = Some(est),
            }
        }
    }

    fn respond(
        &self,
        mut inc: Incoming,
        dev: usize,
        info: &CommInfo,
    ) -> Result<AcceptState<P::Fabric>> {
        let who = format!("connector {}", inc.peer());
        let plans: Vec<PathPlan> = inc
            .paths()
            .iter()
            .map(|p| PathPlan {
                local: p.local.clone(),
                remote: p.request.connector.addr(),
                kind: p.request.kind,
            })
            .collect();
        let peer: Vec<PathParams> = inc.paths().iter().map(|p| p.peer_params.clone()).collect();
        let opts = self.opts(info, dev, true);
        let built = (|| -> Result<(RecvComm<P::Fabric>, Vec<PathParams>)> {
            let fab = self.factory.create(&plans, Some(&peer), &opts)?;
            let mut rc = RecvComm::new(fab, self.proto)?;
            rc.connect(CtrlInfo::from_bytes(&inc.hello().params.extra)?)?;
            rc.fabric().connect_peer(&peer, &opts)?;
            let local = rc.fabric().local_params();
            Ok((rc, local))
        })();
        match built {
            Ok((rc, local)) => {
                inc.respond(SideParams {
                    paths: local.clone(),
                    extra: rc.local_info().to_bytes(),
                })?;
                Ok(AcceptState::Responding(Box::new(Responding {
                    inc,
                    comm: rc,
                    plans,
                    local,
                })))
            }
            Err(e) => {
                let reason = e.to_string();
                if inc.reject(&reason).is_ok() {
                    let _ = inc.poll();
                }
                Err(step_error(e, &who, "setting up the accepted paths"))
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

fn step_error(e: Error, peer: &str, step: &str) -> Error {
    e.context(format_args!("connection with {peer}: {step}"))
}

/// The one INFO line of a connection.
#[allow(clippy::too_many_arguments)]
fn describe<F: Connectable>(
    verb: &str,
    peer: &str,
    dev: usize,
    props: &[Properties],
    plans: &[PathPlan],
    local: &[PathParams],
    remote: &[PathParams],
    fab: &F,
    tcp: &str,
    routes: &[crate::route::types::KernelRoute],
) -> String {
    let name = props
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
        // A routed fallback path: name the gateway the kernel sends it to.
        let via = if p.local.addr.contains(&p.remote) {
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

fn mem_kind(r: &Region) -> MemKind {
    if r.kind.0 & (PtrSupport::CUDA.0 | PtrSupport::DMABUF.0) != 0 {
        MemKind::Cuda
    } else {
        MemKind::Host
    }
}

fn closed(what: &str) -> Error {
    Error::InvalidArgument(format!("{what} on a comm that is already closed"))
}

/// Runs a registration call `what` on either comm, or fails when NCCL already closed it.
fn with_registrar<P: PathFactory, R>(
    comm: CommMut<'_, Switchless<P>>,
    what: &str,
    f: impl FnOnce(&mut dyn Registrar) -> Result<R>,
) -> Result<R> {
    match comm {
        CommMut::Send(s) => f(lock(&s.comm)?.as_mut().ok_or_else(|| closed(what))?),
        CommMut::Recv(r) => f(lock(&r.comm)?.as_mut().ok_or_else(|| closed(what))?),
    }
}

impl<P: PathFactory> Backend for Switchless<P> {
    type Listen = ListenEnd<P>;
    type Send = SendEnd<P::Fabric>;
    type Recv = RecvEnd<P::Fabric>;
    type Mr = MemHandle;
    type Request = Req<P::Fabric>;

    fn slot() -> &'static Slot<Self> {
        P::slot()
    }

    fn open() -> Result<Self> {
        let (factory, view) = P::open()?;
        Switchless::from_parts(factory, view)
    }

    fn devices(&self) -> &[Properties] {
        &self.props
    }

    fn listen(
        self: &Arc<Self>,
        comm: &CommInfo,
        dev: usize,
        handle: &mut Handle,
    ) -> Result<ListenEnd<P>> {
        let view = AcceptorView {
            links: self.view.links.clone(),
            routes: self.view.routes.clone(),
            reach: if self.view.config.tcp_fallback {
                Reach::Routed
            } else {
                Reach::OnLink
            },
        };
        let listener = Listener::bind_any(view, self.timeout())?;
        let (repr, left_out) = listener.handle(self.control_addr())?;
        if repr.links.is_empty() {
            return Err(Error::System(
                "listen: no local link is up; the listen handle would advertise no address".into(),
            ));
        }
        for l in left_out.iter().filter(|l| l.up) {
            tracing::info!(
                "NET/switchless: listen handle has no room for {} {} (at most 16 links are advertised)",
                l.netdev,
                l.addr
            );
        }
        handle.fill(0);
        repr.emit(&mut HandleView::new_unchecked(&mut handle[..]))?;
        Ok(ListenEnd {
            backend: Arc::clone(self),
            listener,
            dev,
            comm: *comm,
            state: AcceptState::Waiting,
        })
    }

    fn connect(
        self: &Arc<Self>,
        comm: &CommInfo,
        dev: usize,
        handle: &mut Handle,
    ) -> Result<Option<SendEnd<P::Fabric>>> {
        let id = HandleView::new_unchecked(&handle[..]).scratch();
        let state = if id == 0 {
            let s = self.start_connect(comm, dev, handle)?;
            let id = self.id_base | self.next_id.fetch_add(1, Ordering::Relaxed);
            HandleView::new_unchecked(&mut handle[..]).set_scratch(id);
            (id, s)
        } else {
            let mut map = lock(&self.connecting)?;
            let s = map.remove(&id).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "connect retried with connection state {id:#x}, which this process does not have \
                     (it failed or timed out earlier, or the handle's scratch bytes 120..128 are not zero)"
                ))
            })?;
            (id, s)
        };
        let (id, s) = state;
        let hint = s.routed_hint.clone();
        match self.advance(s) {
            Ok(Progress::Done(end)) => {
                HandleView::new_unchecked(&mut handle[..]).set_scratch(0);
                Ok(Some(end))
            }
            Ok(Progress::Pending(s)) => {
                let mut map = lock(&self.connecting)?;
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

    fn accept(l: &mut ListenEnd<P>) -> Result<Option<RecvEnd<P::Fabric>>> {
        loop {
            match std::mem::replace(&mut l.state, AcceptState::Failed) {
                AcceptState::Waiting => match l.listener.poll()? {
                    None => {
                        l.state = AcceptState::Waiting;
                        return Ok(None);
                    }
                    Some(inc) => l.state = l.backend.respond(inc, l.dev, &l.comm)?,
                },
                AcceptState::Responding(mut r) => match r.inc.poll()? {
                    AcceptPoll::Pending => {
                        l.state = AcceptState::Responding(r);
                        return Ok(None);
                    }
                    AcceptPoll::Done(est) => {
                        let Responding {
                            inc,
                            comm,
                            plans,
                            local,
                        } = *r;
                        let remote: Vec<PathParams> =
                            inc.paths().iter().map(|p| p.peer_params.clone()).collect();
                        l.state = AcceptState::Finishing(Box::new(Finishing {
                            comm,
                            plans,
                            local,
                            remote,
                            est,
                        }));
                    }
                },
                AcceptState::Finishing(mut f) => {
                    let ready = f.comm.fabric_mut().poll_ready().map_err(|e| {
                        step_error(
                            e,
                            &format!("connector {}", f.est.peer.ip()),
                            "connecting the data paths",
                        )
                    })?;
                    if !ready {
                        l.state = AcceptState::Finishing(f);
                        return Ok(None);
                    }
                    {
                        let Finishing {
                            comm,
                            plans,
                            local,
                            remote,
                            est,
                        } = *f;
                        l.backend.check_mtu(&plans, &remote, comm.fabric());
                        tracing::info!(
                            "NET/switchless: {}",
                            describe(
                                "accepted from",
                                &format!("connector {}", est.peer.ip()),
                                l.dev,
                                &l.backend.props,
                                &plans,
                                &local,
                                &remote,
                                comm.fabric(),
                                &format!("tcp {} <- {}", est.local, est.peer),
                                &l.backend.view.routes,
                            )
                        );
                        l.state = AcceptState::Done;
                        return Ok(Some(RecvEnd {
                            comm: Arc::new(Mutex::new(Some(comm))),
                        }));
                    }
                }
                AcceptState::Done => {
                    l.state = AcceptState::Done;
                    return Err(Error::InvalidArgument(
                        "accept called again on a listen comm that already returned its connection"
                            .into(),
                    ));
                }
                AcceptState::Failed => {
                    return Err(Error::InvalidArgument(
                        "accept called again on a listen comm whose accept failed".into(),
                    ));
                }
            }
        }
    }

    fn reg_mr(comm: CommMut<'_, Self>, region: Region) -> Result<MemHandle> {
        let kind = mem_kind(&region);
        let (addr, len) = (region.addr as u64, region.size as u64);
        with_registrar(comm, "regMr", |r| r.reg_mr(addr, len, kind))
    }

    fn reg_mr_dmabuf(
        comm: CommMut<'_, Self>,
        region: Region,
        offset: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<MemHandle> {
        let (addr, len) = (region.addr as u64, region.size as u64);
        with_registrar(comm, "regMrDmaBuf", |r| {
            r.reg_mr_dmabuf(addr, len, offset, fd)
        })
    }

    fn dereg_mr(comm: CommMut<'_, Self>, mr: MemHandle) -> Result<()> {
        with_registrar(comm, "deregMr", |r| r.dereg_mr(mr))
    }

    fn isend(
        comm: &mut SendEnd<P::Fabric>,
        addr: usize,
        size: usize,
        tag: i32,
        mr: &MemHandle,
    ) -> Result<Option<Req<P::Fabric>>> {
        let mut g = lock(&comm.comm)?;
        let sc = g.as_mut().ok_or_else(|| closed("isend"))?;
        Ok(sc
            .isend(Instant::now(), addr as u64, size as u64, tag as u32, mr)?
            .map(|r| Req::Send(Arc::clone(&comm.comm), r)))
    }

    fn irecv(
        comm: &mut RecvEnd<P::Fabric>,
        bufs: &[RecvBuf<'_, MemHandle>],
    ) -> Result<Option<Req<P::Fabric>>> {
        let v: Vec<comm::RecvBuf<'_>> = bufs
            .iter()
            .map(|b| comm::RecvBuf {
                addr: b.addr as u64,
                size: b.size as u64,
                tag: b.tag as u32,
                mh: b.mr,
            })
            .collect();
        let mut g = lock(&comm.comm)?;
        let rc = g.as_mut().ok_or_else(|| closed("irecv"))?;
        Ok(rc
            .irecv(Instant::now(), &v)?
            .map(|r| Req::Recv(Arc::clone(&comm.comm), r)))
    }

    fn iflush(
        comm: &mut RecvEnd<P::Fabric>,
        bufs: &[FlushBuf<'_, MemHandle>],
    ) -> Result<Option<Req<P::Fabric>>> {
        let v: Vec<comm::FlushBuf<'_>> = bufs
            .iter()
            .map(|b| comm::FlushBuf {
                addr: b.addr as u64,
                size: b.size as u64,
                mh: b.mr,
            })
            .collect();
        let mut g = lock(&comm.comm)?;
        let rc = g.as_mut().ok_or_else(|| closed("iflush"))?;
        Ok(rc
            .iflush(Instant::now(), &v)?
            .map(|r| Req::Recv(Arc::clone(&comm.comm), r)))
    }

    fn test(req: &mut Req<P::Fabric>, sizes: &mut [usize]) -> Result<bool> {
        match req {
            Req::Send(c, r) => {
                let mut g = lock(c)?;
                let sc = g.as_mut().ok_or_else(|| closed("test"))?;
                match sc.test(Instant::now(), *r)? {
                    Some(n) => {
                        if let Some(s) = sizes.first_mut() {
                            *s = n as usize;
                        }
                        Ok(true)
                    }
                    None => Ok(false),
                }
            }
            Req::Recv(c, r) => {
                let mut g = lock(c)?;
                let rc = g.as_mut().ok_or_else(|| closed("test"))?;
                match rc.test(Instant::now(), *r)? {
                    Some(got) => {
                        for (o, s) in sizes.iter_mut().zip(got.as_slice()) {
                            *o = *s as usize;
                        }
                        Ok(true)
                    }
                    None => Ok(false),
                }
            }
        }
    }

    fn close_send(comm: SendEnd<P::Fabric>) -> Result<()> {
        let taken = lock(&comm.comm)?.take();
        taken.map_or(Ok(()), SendComm::close)
    }

    fn close_recv(comm: RecvEnd<P::Fabric>) -> Result<()> {
        let taken = lock(&comm.comm)?.take();
        taken.map_or(Ok(()), RecvComm::close)
    }

    fn close_listen(listen: ListenEnd<P>) -> Result<()> {
        drop(listen);
        Ok(())
    }
}
