//! The backend the exported vtables use: [`Switchless`], generic over the [`PathFactory`] that builds
//! a connection's endpoint (RoCE or TCP in production, `transport::memfab` in tests), and that seam:
//! [`PathFactory`], [`Connectable`], [`HostView`], [`PathPlan`], [`ConnOptions`], [`QpAttrs`]
//! (`plugin::factory` implements it).
//!
//! One file per NCCL call phase: [`connect`] (routing, the handshake across NCCL's retries),
//! [`accept`] (`listen`, `accept`), [`data`] (`regMr`, `isend`/`irecv`/`iflush`/`test`, `close`),
//! [`report`] (a connection's log lines and error text). This file holds the seam, the device
//! properties and the [`Backend`] impl, one line per call.
//!
//! Depends on `route` (path choice, the listen handle), `transport` (handshake, comm protocol),
//! `host` and `config`; nothing from `verbs`. It starts no thread of its own except, with
//! `NCCL_SWITCHLESS_METRICS_DIR` set and NCCL's ABI v11+, the metrics snapshot writer
//! (`plugin::metrics`), joined when `finalize` drops the backend: `dlclose` after `finalize`
//! leaves nothing behind. What each call does, step by step:
//! `docs/guide/backend.md`.
#![forbid(unsafe_code)]

use std::collections::{HashMap, HashSet};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::{Config, PathType};
use crate::error::{Error, Result};
use crate::host::NcclDevice;
use crate::plugin::{
    Backend, CommInfo, CommRef, FlushBuf, Handle, Properties, PtrSupport, RecvBuf, Region, Slot,
};
use crate::route::types::{KernelRoute, LocalLink};
use crate::transport::comm::{FailoverConfig, MemHandle, ProtocolConfig, WeightConfig};
use crate::transport::fabric::Fabric;
use crate::transport::handshake::PathParams;
use crate::transport::stripe::StripeParams;

pub mod accept;
pub mod connect;
pub mod data;
pub mod live;
pub mod plan;
pub mod relay;
pub mod report;

use live::Live;
pub use plan::PathPlan;

// ---- The seam to the NIC: what a factory builds and what the backend asks of an endpoint. ----

/// Queue-pair attributes of a connection (`NCCL_IB_TC`, `NCCL_IB_SL`, `NCCL_IB_TIMEOUT`,
/// `NCCL_IB_RETRY_CNT`, and the communicator's traffic class). A fabric without queue pairs ignores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttrs {
    /// IP traffic class (DSCP and ECN bits) of the RoCE packets.
    pub traffic_class: u8,
    /// Service level, 0..=15.
    pub sl: u8,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout per try.
    pub timeout: u8,
    /// Retries after a timeout before the work request fails.
    pub retry_cnt: u8,
}

impl QpAttrs {
    /// NCCL's precedence: the variable, else the communicator's traffic class (for the SL only a
    /// class of at most 15), else 0.
    pub fn from_config(cfg: &Config, comm_traffic_class: Option<u8>) -> QpAttrs {
        QpAttrs {
            traffic_class: cfg.ib_tc.or(comm_traffic_class).unwrap_or(0),
            sl: cfg
                .ib_sl
                .or(comm_traffic_class.filter(|t| *t <= 15))
                .unwrap_or(0),
            timeout: cfg.ib_timeout,
            retry_cnt: cfg.ib_retry_cnt,
        }
    }
}

impl Default for QpAttrs {
    /// The attributes of the default configuration and no communicator traffic class.
    fn default() -> QpAttrs {
        QpAttrs::from_config(&Config::default(), None)
    }
}

/// What a connection needs besides its paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnOptions {
    /// Create loopback paths for the GPU-direct flush (receiving side, device can register GPU memory).
    pub loopback: bool,
    /// NCCL may register GPU memory on this connection (the device advertises `NCCL_PTR_CUDA` or
    /// `NCCL_PTR_DMABUF` and `NCCL_NET_GDR_LEVEL` does not turn GPU-direct off): a factory refuses
    /// paths that cannot carry it (TCP), so the acceptor rejects such a hello with the reason.
    pub gpu: bool,
    /// Queue-pair attributes.
    pub qp: QpAttrs,
    /// The connection's secret from the handshake (set for `connect_peer`; zero before): the
    /// verbs reconnect mailbox keys its tags with it.
    pub secret: crate::transport::handshake::auth::ConnSecret,
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

    /// Whether the endpoint notices on its own, with nothing in flight, that the peer is gone (TCP:
    /// its streams close). When not, the backend keeps the handshake socket as a liveness channel
    /// ([`live::Live`]).
    fn detects_peer_loss(&self) -> bool {
        false
    }
}

/// Reads the bytes a factory's fabric holds pinned on one NCCL device now, by the device's index
/// (0 for an index it does not know). Called by the metrics snapshot (its own thread) while
/// connections register.
pub type PinnedReader = Arc<dyn Fn(usize) -> u64 + Send + Sync>;

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

    /// The reader of the bytes pinned on each of `devices` (NCCL's order): what the device's
    /// registration cache holds (shared ranges once, whole pages) plus pins kept outside it.
    fn pinned_reader(&self, devices: &[NcclDevice]) -> PinnedReader;
}

// ---- The backend. ----

/// Communicators whose latest `setNetAttr` hint the backend keeps (a process has a handful).
pub const MAX_HINTED_COMMS: usize = 64;

/// The backend. See the module docs.
pub struct Switchless<P: PathFactory> {
    factory: P,
    view: HostView,
    props: Vec<Properties>,
    proto: ProtocolConfig,
    connecting: Mutex<HashMap<u64, connect::Parked<P::Fabric>>>,
    id_base: u64,
    next_id: AtomicU64,
    /// The small-MTU warning was given (once per process).
    warned_mtu: AtomicBool,
    /// Peers already warned about the TCP fallback.
    warned_peers: Mutex<HashSet<String>>,
    /// Peers already warned about GPU-direct on links far from NCCL's device.
    warned_gdr: Mutex<HashSet<String>>,
    /// Connections set up per physical cable, for the INFO line (see `report`).
    cables: Mutex<report::CableCounts>,
    /// Every connection's counters (`plugin::metrics`).
    metrics: Arc<crate::plugin::metrics::Registry>,
    /// Bytes pinned per device, for the snapshots.
    pinned: PinnedReader,
    /// What the snapshots say the process runs.
    build: crate::transport::metrics::Build,
    /// The snapshot writer (`NCCL_SWITCHLESS_METRICS_DIR`), started by the first `listen` or
    /// `connect` of a communicator with its own context (see [`Self::start_exporter`]); dropped
    /// with the backend, when it writes the final snapshot and is joined.
    exporter: Mutex<Option<crate::plugin::metrics::Exporter>>,
    /// Whether starting the exporter was settled (started, refused or failed).
    exporter_settled: AtomicBool,
    /// The relay services of this process (`None`: relays off, or no point-to-point link).
    relays: Option<Arc<crate::transport::relay::Relays>>,
    /// The latest `setNetAttr` hint per live communicator (v11+), for the mesh relay policy; each
    /// context's relay ticket holds its id's, and `finalize` of the last forgets it.
    hints: Arc<Mutex<relay::Hints>>,
}

impl<P: PathFactory> std::fmt::Debug for Switchless<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Switchless")
            .field("devices", &self.props.len())
            .field("links", &self.view.links.len())
            .finish()
    }
}

/// NCCL's view of one device.
pub fn properties_of(d: &NcclDevice, cfg: &Config) -> Result<Properties> {
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
    // The rail goes to NCCL only when the user set one. The discovered peer set is not a rail in
    // NCCL's sense: with NCCL_CROSS_NIC=0 NCCL makes a ring enter and leave a node through NICs of one
    // rail, which in a mesh (every cable its own peer set) is the opposite of the cabling. Unset, NCCL
    // compares guid + port instead, as on an IB fabric without rails.
    p.rail_id = rail;
    p.plane_id = plane.or((d.plane_id >= 0).then_some(d.plane_id));
    Ok(p)
}

/// `view` re-numbered to the device table NCCL holds (see [`Backend::reopen`]): each device of
/// `table` keeps its index; one that is gone (port down, function removed) keeps its slot with its
/// old properties and no links, so connections NCCL places on it are routed over the links that
/// reach the peer; a device that was not in the table is left out (its links stay usable, outside
/// NCCL's list). Returns the view and, per device, the properties to report instead of the
/// discovered ones.
pub fn keep_table(mut view: HostView, table: &[Properties]) -> (HostView, Vec<Option<Properties>>) {
    let found: Vec<Option<usize>> = table
        .iter()
        .map(|p| {
            let name = p.name.to_string_lossy();
            view.devices.iter().position(|d| d.name == name)
        })
        .collect();
    for d in &view.devices {
        if !table.iter().any(|p| p.name.to_string_lossy() == d.name) {
            tracing::warn!(
                "NET/switchless: device {} appeared since the library was loaded; NCCL keeps its first \
                 device list, so it is not exposed until NCCL reloads the plugin (its links still carry \
                 re-routed connections)",
                d.name
            );
        }
    }
    let mut devices = Vec::with_capacity(table.len());
    let mut kept = Vec::with_capacity(table.len());
    for (i, (p, f)) in table.iter().zip(&found).enumerate() {
        match f {
            Some(j) => {
                let mut d = view.devices[*j].clone();
                d.index = i;
                devices.push(d);
                kept.push(None);
            }
            None => {
                tracing::warn!(
                    "NET/switchless: device {i} ({}) is gone since the library was loaded (its port is down \
                     or its function removed); it keeps index {i} and its properties, and connections NCCL \
                     places on it are routed over the links that reach each peer",
                    p.name.to_string_lossy()
                );
                devices.push(vanished(i, p));
                kept.push(Some(p.clone()));
            }
        }
    }
    for l in &mut view.links {
        l.nccl_dev = l
            .nccl_dev
            .and_then(|j| found.iter().position(|f| *f == Some(j)));
    }
    view.devices = devices;
    (view, kept)
}

/// The placeholder of a device that is gone: its identity as NCCL knows it, no members, no peers.
fn vanished(index: usize, p: &Properties) -> NcclDevice {
    NcclDevice {
        index,
        name: p.name.to_string_lossy().into_owned(),
        members: Vec::new(),
        pci_path: p
            .pci_path
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default(),
        guid: p.guid,
        speed_mbps: u32::try_from(p.speed_mbps).unwrap_or(0),
        port: u8::try_from(p.port).unwrap_or(1),
        latency_us: p.latency_us,
        max_comms: p.max_comms,
        max_recvs: p.max_recvs,
        ptr_support: p.ptr_support.0,
        max_p2p_bytes: u64::try_from(p.max_p2p_bytes).unwrap_or(1 << 40),
        rail_id: p.rail_id.unwrap_or(-1),
        plane_id: p.plane_id.unwrap_or(-1),
        phys_port_id: u16::MAX,
        peers: Vec::new(),
    }
}

impl<P: PathFactory> Switchless<P> {
    /// Builds the backend over an opened factory and host view (what [`Backend::open`] does after
    /// `P::open`; tests call it directly).
    pub fn from_parts(factory: P, view: HostView) -> Result<Switchless<P>> {
        let n = view.devices.len();
        Self::with_props(factory, view, vec![None; n])
    }

    /// [`Self::from_parts`], reporting `kept[i]` (when set) for device `i`.
    fn with_props(
        factory: P,
        view: HostView,
        kept: Vec<Option<Properties>>,
    ) -> Result<Switchless<P>> {
        let props = view
            .devices
            .iter()
            .zip(kept)
            .map(|(d, k)| match k {
                Some(p) => Ok(p),
                // `regIsGlobal` stays 0: a handle holds this connection's keys in its path order
                // and is released through this connection, so it must not be used with another
                // (NCCL never does; 2.30.7 and 2.31 read the flag nowhere). Pins are shared per
                // device all the same (the registration cache).
                None => properties_of(d, &view.config),
            })
            .collect::<Result<Vec<_>>>()?;
        let proto = ProtocolConfig {
            stripe: StripeParams {
                min_chunk: view.config.min_chunk.max(1),
                ..StripeParams::default()
            },
            request_timeout: view.config.request_timeout,
            failover: FailoverConfig {
                enabled: view.config.failover,
                retries: u32::from(view.config.failback_retries),
                backoff: view.config.failback_backoff,
                probe_interval: view.config.failback_interval,
            },
            weights: WeightConfig {
                adaptive: view.config.adaptive_weights,
                ..WeightConfig::default()
            },
            ..ProtocolConfig::default()
        };
        let mut b = [0u8; 4];
        getrandom::fill(&mut b)
            .map_err(|e| Error::System(format!("reading random bytes for state ids: {e}")))?;
        let metrics = Arc::new(crate::plugin::metrics::Registry::new());
        let pinned = factory.pinned_reader(&view.devices);
        let build = crate::plugin::attest::build(view.config.attest);
        let relays = relay::relays_for(&view.config, &view.links);
        Ok(Switchless {
            factory,
            view,
            props,
            proto,
            connecting: Mutex::new(HashMap::new()),
            id_base: u64::from(u32::from_le_bytes(b) | 1) << 32,
            next_id: AtomicU64::new(1),
            warned_mtu: AtomicBool::new(false),
            warned_peers: Mutex::new(HashSet::new()),
            warned_gdr: Mutex::new(HashSet::new()),
            cables: Mutex::new(report::CableCounts::default()),
            metrics,
            pinned,
            build,
            exporter: Mutex::new(None),
            exporter_settled: AtomicBool::new(false),
            relays,
            hints: Arc::new(Mutex::new(relay::Hints::default())),
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

    /// Every connection's counters.
    pub fn metrics(&self) -> &crate::plugin::metrics::Registry {
        &self.metrics
    }

    /// A snapshot of the counters now (what the exporter writes).
    pub fn metrics_snapshot(&self) -> crate::transport::metrics::Snapshot {
        let names: Vec<String> = self
            .props
            .iter()
            .map(|p| p.name.to_string_lossy().into_owned())
            .collect();
        self.metrics.snapshot(
            &names,
            &*self.pinned,
            &self.build,
            self.view.config.metrics_interval,
        )
    }

    /// The snapshot file the exporter writes, when it runs.
    pub fn metrics_file(&self) -> Option<std::path::PathBuf> {
        self.exporter
            .lock()
            .ok()?
            .as_ref()
            .map(|e| e.path().to_path_buf())
    }

    /// Starts the snapshot writer (`NCCL_SWITCHLESS_METRICS_DIR`) on the first `listen`/`connect`
    /// of a communicator with its own context (ABI v11+: NCCL calls `finalize`, which drops the
    /// backend and joins the thread before NCCL unloads the library). The shared context of ABI
    /// v6–v10 lives until the library is unloaded, with no call before: a thread of ours would then
    /// run in unmapped code, so there the snapshots stay off (one INFO line says so). A failure to
    /// start is a WARN, never a failed connection.
    fn start_exporter(&self, comm: &CommInfo) {
        use std::sync::atomic::Ordering;
        let Some(dir) = &self.view.config.metrics_dir else {
            return;
        };
        if self.exporter_settled.load(Ordering::Acquire) {
            return;
        }
        let Ok(mut slot) = self.exporter.lock() else {
            return;
        };
        if self.exporter_settled.swap(true, Ordering::AcqRel) {
            return;
        }
        if comm.comm_id.is_none() {
            tracing::info!(
                target: crate::plugin::TARGET_INIT,
                "NET/switchless: NCCL_SWITCHLESS_METRICS_DIR is ignored with this NCCL's net ABI (v10 or older: \
                 no finalize, so a snapshot thread could outlive the library); the counters are kept"
            );
            return;
        }
        let names: Vec<String> = self
            .props
            .iter()
            .map(|p| p.name.to_string_lossy().into_owned())
            .collect();
        let (reg, pinned, b, every) = (
            Arc::clone(&self.metrics),
            Arc::clone(&self.pinned),
            self.build.clone(),
            self.view.config.metrics_interval,
        );
        match crate::plugin::metrics::Exporter::start(std::path::Path::new(dir), every, move || {
            reg.snapshot(&names, &*pinned, &b, every)
        }) {
            Ok(e) => *slot = Some(e),
            Err(e) => tracing::warn!("NET/switchless: metrics snapshots are off: {e}"),
        }
    }

    /// Connections in progress (parked between `connect` retries).
    pub fn connecting(&self) -> usize {
        self.connecting.lock().map_or(0, |m| m.len())
    }

    /// `NCCL_SWITCHLESS_CONNECT_TIMEOUT` (`None`: no deadline, the default).
    fn timeout(&self) -> Option<Duration> {
        self.view.config.connect_timeout
    }

    /// The device advertises GPU memory (`NCCL_PTR_CUDA` or `NCCL_PTR_DMABUF`).
    fn registers_gpu(&self, dev: usize) -> bool {
        let gpu = PtrSupport::CUDA.union(PtrSupport::DMABUF);
        self.props
            .get(dev)
            .is_some_and(|p| p.ptr_support.0 & gpu.0 != 0)
    }

    /// NCCL may put GPU memory on a connection of `dev`: the device advertises it and
    /// `NCCL_NET_GDR_LEVEL` is not below `PIX` (below it, no NIC is close enough and NCCL keeps its
    /// buffers in host memory).
    fn gpu_memory(&self, dev: usize) -> bool {
        self.registers_gpu(dev)
            && self
                .view
                .config
                .net_gdr_level
                .is_none_or(|l| l >= PathType::Pix)
    }

    fn opts(&self, comm: &CommInfo, dev: usize, receiving: bool) -> ConnOptions {
        let tc = comm.traffic_class.and_then(|t| u8::try_from(t).ok());
        ConnOptions {
            // NCCL flushes only GPU-direct receives: below `PIX` it keeps the buffers in host
            // memory, and the receiving side needs no loopback paths (nor their keys).
            loopback: receiving && self.gpu_memory(dev),
            gpu: self.gpu_memory(dev),
            qp: QpAttrs::from_config(&self.view.config, tc),
            secret: Default::default(),
        }
    }
}

impl<P: PathFactory> Backend for Switchless<P> {
    type Listen = accept::ListenEnd<P>;
    type Send = data::SendEnd<Live<P::Fabric>>;
    type Recv = data::RecvEnd<Live<P::Fabric>>;
    type Mr = MemHandle;
    type Request = data::Req<Live<P::Fabric>>;

    fn slot() -> &'static Slot<Self> {
        P::slot()
    }

    fn open() -> Result<Self> {
        let (factory, view) = P::open()?;
        Switchless::from_parts(factory, view)
    }

    fn reopen(table: &[Properties]) -> Result<Self> {
        let (factory, view) = P::open()?;
        let (view, kept) = keep_table(view, table);
        Switchless::with_props(factory, view, kept)
    }

    fn devices(&self) -> &[Properties] {
        &self.props
    }

    fn build(&self) -> crate::transport::metrics::Build {
        self.build.clone()
    }

    fn attach(self: &Arc<Self>, comm: &CommInfo) -> Result<Option<crate::plugin::CommGuard>> {
        // Never fails the communicator's init: a relay service that cannot start is a WARN
        // inside `serve_relays`, and so is this.
        match self.serve_relays(comm) {
            Ok(t) => Ok(t.map(|t| crate::plugin::CommGuard::new(Box::new(t)))),
            Err(e) => {
                tracing::warn!(
                    "NET/switchless: no relay service for communicator {:#x}: {e}",
                    comm.comm_id.unwrap_or_default()
                );
                Ok(None)
            }
        }
    }

    fn set_net_attr(&self, comm: &CommInfo, attr: &crate::plugin::NetAttr) -> Result<()> {
        // The legacy (v6-v10) context has no id and no setNetAttr: nothing to keep.
        // Without relays no hint is read (the mesh policy is their only reader), and no context
        // holds one to drop at `finalize`.
        if let (Some(id), Some(_)) = (comm.comm_id, &self.relays) {
            crate::sync::lock(&self.hints, "setNetAttr hints")?.set(id, *attr);
        }
        Ok(())
    }

    fn listen(
        self: &Arc<Self>,
        comm: &CommInfo,
        dev: usize,
        handle: &mut Handle,
    ) -> Result<Self::Listen> {
        self.start_exporter(comm);
        self.open_listener(comm, dev, handle)
    }

    fn connect(
        self: &Arc<Self>,
        comm: &CommInfo,
        dev: usize,
        handle: &mut Handle,
    ) -> Result<Option<Self::Send>> {
        self.start_exporter(comm);
        self.connect_step(comm, dev, handle)
    }

    fn accept(listen: &mut Self::Listen) -> Result<Option<Self::Recv>> {
        listen.accept()
    }

    fn reg_mr(comm: CommRef<'_, Self>, region: Region) -> Result<MemHandle> {
        Self::register(comm, region)
    }

    fn reg_mr_dmabuf(
        comm: CommRef<'_, Self>,
        region: Region,
        offset: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<MemHandle> {
        Self::register_dmabuf(comm, region, offset, fd)
    }

    fn dereg_mr(comm: CommRef<'_, Self>, mr: MemHandle) -> Result<()> {
        Self::deregister(comm, mr)
    }

    fn isend(
        comm: &Self::Send,
        addr: usize,
        size: usize,
        tag: i32,
        mr: &MemHandle,
    ) -> Result<Option<Self::Request>> {
        comm.isend(addr, size, tag, mr)
    }

    fn irecv(comm: &Self::Recv, bufs: &[RecvBuf<'_, MemHandle>]) -> Result<Option<Self::Request>> {
        comm.irecv(bufs)
    }

    fn iflush(
        comm: &Self::Recv,
        bufs: &[FlushBuf<'_, MemHandle>],
    ) -> Result<Option<Self::Request>> {
        comm.iflush(bufs)
    }

    fn test(req: &mut Self::Request, sizes: &mut [usize]) -> Result<bool> {
        req.test(sizes)
    }

    fn close_send(comm: Self::Send) -> Result<()> {
        comm.close()
    }

    fn close_recv(comm: Self::Recv) -> Result<()> {
        comm.close()
    }

    fn close_listen(listen: Self::Listen) -> Result<()> {
        listen.close();
        Ok(())
    }
}
