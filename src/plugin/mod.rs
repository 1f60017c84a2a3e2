//! The core plugin, written once in safe Rust; `ffi` adapts it to every ABI version (and is its only
//! caller in the library). Below it: [`switchless`] (the backend) and [`factory`] (its endpoints),
//! then `route`, `transport`, `verbs` and `host`.
//!
//! * [`Backend`]: what a transport implements (device list, properties, comm operations). The exported
//!   vtables use [`ActiveBackend`] = [`Switchless`] over [`NetFactory`]: routing, the TCP
//!   handshake and the transport protocol over ibverbs RC QPs or TCP streams (see [`switchless`] and [`factory`]).
//! * [`Context`]: one per communicator (ABI v11+: `init(ctx, commId, config, …)`); ABI v6–v10 share one
//!   legacy context. Every context holds the process-wide [`Backend`] through an `Arc`: the backend is opened
//!   by the first `init` and released when the last context (and the last comm) is gone, so NCCL's
//!   `finalize` → `dlclose` leaves nothing running.
//! * [`Listen`], [`Comm`], [`Mr`]: the objects NCCL holds as `void*` between calls (boxed here, converted to
//!   and from raw pointers only in `ffi`). Each starts with a magic word so that `ffi` can reject a pointer
//!   of the wrong kind with `ncclInvalidArgument` instead of misusing it.
//! * Requests are no boxes: each comm leases a fixed [`slab`] of request slots, and NCCL holds a
//!   [`RequestId`] (slab, slot, generation), so the data path allocates nothing.
#![forbid(unsafe_code)]

use std::collections::BTreeSet;
use std::ffi::{CStr, CString};
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex, Weak};

use crate::error::{Error, Result};
use crate::sync::lock;
use crate::sys::rawmem::Lent;

/// Bytes of the opaque connection handle `listen` fills and `connect` receives (`NCCL_NET_HANDLE_MAXSIZE`).
pub const HANDLE_SIZE: usize = 128;
/// Largest `maxP2pBytes`/`maxCollBytes` NCCL accepts (1 TiB).
pub const MAX_NET_SIZE_BYTES: usize = 1 << 40;
/// Largest number of buffers in one grouped receive (`NCCL_PROXY_MAX_SUBS`: the length of `test`'s sizes).
pub const MAX_GROUPED_RECVS: usize = 64;
/// Most physical devices one virtual device may fuse (ABI v12; v9–v11 allow 4).
pub const MAX_VDEVS: usize = 8;

/// `tracing` target of INFO events NCCL should show under `NCCL_DEBUG_SUBSYS=INIT` (and NET); the
/// logger bridge (`ffi::log`) maps targets to NCCL subsystems.
pub const TARGET_INIT: &str = "switchless::init";
/// `tracing` target of INFO events about environment variables (`NCCL_DEBUG_SUBSYS=ENV`, and NET).
pub const TARGET_ENV: &str = "switchless::env";

/// The opaque connection handle (`listen` writes it, NCCL ships it to the peer, `connect` reads it; the
/// copy given to `connect` is private to that connection and passed again on every retry).
pub type Handle = [u8; HANDLE_SIZE];

pub mod attest;
pub mod factory;
pub mod metrics;
pub mod slab;
pub mod switchless;

pub use factory::{mem::MemFactory, net::NetFactory, verbs::VerbsFactory};
pub use slab::{RequestId, RequestKind};
pub use switchless::{
    ConnOptions, Connectable, HostView, PathFactory, PathPlan, QpAttrs, Switchless,
};

/// The backend the exported vtables use: routing + handshake + the transport protocol over ibverbs
/// (RoCE paths) or TCP (point-to-point links without RDMA), see [`factory::net`].
pub type ActiveBackend = Switchless<NetFactory>;

/// Memory kinds a device can register (`ptrSupport` bits, also `regMr`'s `type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PtrSupport(pub u32);

impl PtrSupport {
    /// Host memory (`NCCL_PTR_HOST`).
    pub const HOST: PtrSupport = PtrSupport(0x1);
    /// GPU memory through GPUDirect / peer memory (`NCCL_PTR_CUDA`).
    pub const CUDA: PtrSupport = PtrSupport(0x2);
    /// GPU memory through DMA-BUF (`NCCL_PTR_DMABUF`).
    pub const DMABUF: PtrSupport = PtrSupport(0x4);

    /// Both sets of bits.
    pub const fn union(self, other: PtrSupport) -> PtrSupport {
        PtrSupport(self.0 | other.0)
    }
}

/// Offload type of a device (`ncclNetDeviceType`). switchless reports `Host`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NetDeviceType {
    /// NCCL's proxy thread drives the network (`NCCL_NET_DEVICE_HOST`).
    #[default]
    Host,
    /// Device-side unpack (`NCCL_NET_DEVICE_UNPACK`, version 7).
    Unpack,
}

/// One NCCL device as the plugin reports it, independent of the ABI version.
#[derive(Debug, Clone, PartialEq)]
pub struct Properties {
    /// Unique and stable; NCCL keys its topology XML on it. Interned: the pointer stays valid while the
    /// library is loaded, across backend re-opens.
    pub name: &'static CStr,
    /// `/sys/devices/...` path of the PCI function; `None` = virtual NIC (attached to CPU 0 by NCCL).
    pub pci_path: Option<&'static CStr>,
    /// NIC chip identity; devices with equal guid and port are one physical port to NCCL.
    pub guid: u64,
    /// Registrable memory kinds.
    pub ptr_support: PtrSupport,
    /// Port speed in Mbps (NCCL treats ≤ 0 as 10000 Mbps).
    pub speed_mbps: i32,
    /// Port number.
    pub port: i32,
    /// Network latency in microseconds; 0 = NCCL's default.
    pub latency_us: f32,
    /// Most comms the device supports.
    pub max_comms: i32,
    /// Most buffers in one grouped `irecv` (≥ 1, ≤ [`MAX_GROUPED_RECVS`]).
    pub max_recvs: i32,
    /// Offload type.
    pub net_device_type: NetDeviceType,
    /// Offload version (0 = `NCCL_NET_DEVICE_INVALID_VERSION` for `Host`).
    pub net_device_version: i32,
    /// Registrations are not tied to one comm (v8+).
    pub reg_is_global: bool,
    /// Ask NCCL to `iflush` after every GPU receive (v9+).
    pub force_flush: bool,
    /// Largest single p2p transfer in bytes, in (0, 1 TiB] (v9+).
    pub max_p2p_bytes: usize,
    /// Largest single collnet transfer in bytes, in (0, 1 TiB] (v9+).
    pub max_coll_bytes: usize,
    /// Requests in one multi-request (v11+; unused by NCCL 2.30, report 1).
    pub max_multi_request_size: i32,
    /// Rail (v12); `None` = `NCCL_NET_ID_UNDEF`.
    pub rail_id: Option<i16>,
    /// Plane (v12); `None` = `NCCL_NET_ID_UNDEF`.
    pub plane_id: Option<i16>,
    /// Physical devices fused into this one (v9+); empty = a physical device (reported as `{1, {dev}}`).
    pub vdevs: Vec<i32>,
}

impl Properties {
    /// A host device with the given identity and NCCL IB's defaults for the rest (1 TiB p2p, 512 MiB
    /// collnet, 8 grouped receives, 1 request per multi-request, no rail/plane).
    pub fn host(name: &str, pci_path: Option<&str>, guid: u64) -> Result<Properties> {
        Ok(Properties {
            name: intern(name)?,
            pci_path: pci_path.map(intern).transpose()?,
            guid,
            ptr_support: PtrSupport::HOST,
            speed_mbps: 0,
            port: 1,
            latency_us: 0.0,
            max_comms: 65536,
            max_recvs: 8,
            net_device_type: NetDeviceType::Host,
            net_device_version: 0,
            reg_is_global: false,
            force_flush: false,
            max_p2p_bytes: MAX_NET_SIZE_BYTES,
            max_coll_bytes: 512 << 20,
            max_multi_request_size: 1,
            rail_id: None,
            plane_id: None,
            vdevs: Vec::new(),
        })
    }

    /// Checks the limits NCCL enforces, naming the field and the accepted range.
    pub fn validate(&self, dev: usize) -> Result<()> {
        let bad = |what: String| {
            Err(Error::Internal(format!(
                "device {dev} ({:?}): {what}",
                self.name
            )))
        };
        if self.max_p2p_bytes == 0 || self.max_p2p_bytes > MAX_NET_SIZE_BYTES {
            return bad(format!(
                "max_p2p_bytes {} is outside (0, {MAX_NET_SIZE_BYTES}] bytes",
                self.max_p2p_bytes
            ));
        }
        if self.max_coll_bytes == 0 || self.max_coll_bytes > MAX_NET_SIZE_BYTES {
            return bad(format!(
                "max_coll_bytes {} is outside (0, {MAX_NET_SIZE_BYTES}] bytes",
                self.max_coll_bytes
            ));
        }
        if self.max_recvs < 1 || self.max_recvs as usize > MAX_GROUPED_RECVS {
            return bad(format!(
                "max_recvs {} is outside [1, {MAX_GROUPED_RECVS}]",
                self.max_recvs
            ));
        }
        if self.vdevs.len() > MAX_VDEVS {
            return bad(format!(
                "{} fused devices; at most {MAX_VDEVS} are accepted",
                self.vdevs.len()
            ));
        }
        Ok(())
    }
}

/// Returns a `'static` C string equal to `s`, allocated once per distinct value for the life of the
/// library (device names and PCI paths must outlive every `getProperties` answer).
pub fn intern(s: &str) -> Result<&'static CStr> {
    static STRINGS: Mutex<BTreeSet<&'static CStr>> = Mutex::new(BTreeSet::new());
    let c = CString::new(s)
        .map_err(|_| Error::Internal(format!("device string {s:?} contains a NUL byte")))?;
    let mut set = lock(&STRINGS, "string interner")?;
    if let Some(found) = set.get(c.as_c_str()) {
        return Ok(found);
    }
    let leaked: &'static CStr = Box::leak(c.into_boxed_c_str());
    set.insert(leaked);
    Ok(leaked)
}

/// What NCCL tells a communicator's `init` (v11+) or `connect` (v10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommInfo {
    /// NCCL's communicator hash (v11+); `None` for the legacy (v6–v10) context.
    pub comm_id: Option<u64>,
    /// `ncclNetCommConfig.trafficClass`; `None` = `NCCL_NET_TRAFFIC_CLASS_UNDEF`.
    pub traffic_class: Option<i32>,
}

/// Limits per comm direction in an [`NetAttr`] (`ncclNetCommAttr`); `None` = `NCCL_NET_ATTR_UNDEF`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommAttr {
    /// Most peers communicated with at once.
    pub max_concurrent_peers: Option<i32>,
    /// Fewest peers communicated with at once.
    pub min_concurrent_peers: Option<i32>,
    /// Most flows per peer.
    pub max_flows_per_peer: Option<i32>,
    /// Fewest flows per peer.
    pub min_flows_per_peer: Option<i32>,
}

/// Transfer hints of `setNetAttr` (v11+). NCCL IB ignores them; so may a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NetAttr {
    /// Hints for send comms.
    pub send: CommAttr,
    /// Hints for recv comms.
    pub recv: CommAttr,
    /// Bit set of collective/p2p operations; `None` = undefined.
    pub op: Option<u32>,
    /// Bit set of algorithms; `None` = undefined.
    pub algo: Option<u32>,
    /// Bit set of protocols; `None` = undefined.
    pub proto: Option<u32>,
}

/// A memory range NCCL asks to register: the memory, lent ([`Lent`]: made from NCCL's pointer in
/// `src/ffi`, host or GPU; for DMA-BUF its address is also the iova), and its type. The plugin
/// hands it to the fabric, which keeps it until the registration is released.
#[derive(Debug, Clone)]
pub struct Region {
    /// The memory.
    pub mem: Lent,
    /// `NCCL_PTR_HOST` or `NCCL_PTR_CUDA` (or `NCCL_PTR_DMABUF`).
    pub kind: PtrSupport,
}

/// One buffer of a grouped receive.
#[derive(Debug)]
pub struct RecvBuf<'a, M> {
    /// Address of the buffer.
    pub addr: usize,
    /// Capacity in bytes (a send may be smaller; a larger one is an error).
    pub size: usize,
    /// Tag the matching send carries.
    pub tag: i32,
    /// Registration covering the buffer.
    pub mr: &'a M,
}

// Copy without `M: Copy` (a buffer holds only a reference to its registration): `ffi` builds grouped
// receives in a stack array.
impl<M> Clone for RecvBuf<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M> Copy for RecvBuf<'_, M> {}

/// One buffer of a flush.
#[derive(Debug)]
pub struct FlushBuf<'a, M> {
    /// Address of the buffer.
    pub addr: usize,
    /// Bytes received into it.
    pub size: usize,
    /// Registration covering the buffer.
    pub mr: &'a M,
}

impl<M> Clone for FlushBuf<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M> Copy for FlushBuf<'_, M> {}

/// A send or recv comm, as given to `regMr`/`deregMr` (NCCL passes either without saying which).
/// Shared: NCCL's service thread registers on a comm while its progress thread sends on it.
pub enum CommRef<'a, B: Backend> {
    /// A comm made by `connect`.
    Send(&'a B::Send),
    /// A comm made by `accept`.
    Recv(&'a B::Recv),
}

impl<B: Backend> Clone for CommRef<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for CommRef<'_, B> {}

/// What a transport implements. One instance per process lives while any [`Context`] or comm lives; it is
/// opened by the first `init` ([`Backend::open`]) and dropped (threads joined, resources freed) when the last
/// context and comm are gone, before NCCL `dlclose`s the library.
///
/// Calls arrive on NCCL's threads: `listen`/`connect`/`accept`/`reg_*`/`close_*`
/// on the proxy service thread, `isend`/`irecv`/`iflush`/`test` on the progress thread; so everything must be
/// `Send`, and the backend itself `Sync`. No call may block.
///
/// Ownership: the core boxes every listen comm, comm and registration the backend returns and NCCL
/// holds the box between calls; a request goes into a slot of its comm's [`slab`] and NCCL holds its
/// [`RequestId`]. A comm is reached by two threads at once (`regMr`/`deregMr` on the service thread,
/// `isend`/`irecv`/`test` on the progress thread), so the backend gets only shared access to it and
/// keeps its mutable state behind its own locks (hence `Send + Sync`); a listen comm is used by one
/// thread at a time and is lent `&mut`, a request `&mut` under its slot's lock; registrations are
/// shared. A comm that needs the backend itself (device tables, an event
/// thread) keeps an `Arc` clone taken in `listen`/`connect`.
pub trait Backend: Sized + Send + Sync + 'static {
    /// A listening endpoint (one per connection; closed after `accept` or on teardown).
    type Listen: Send;
    /// The sending side of a connection.
    type Send: Send + Sync;
    /// The receiving side of a connection.
    type Recv: Send + Sync;
    /// A memory registration.
    type Mr: Send + Sync;
    /// An in-flight send, receive or flush.
    type Request: Send;

    /// The per-process slot that holds the open backend (one `static` per backend type).
    fn slot() -> &'static Slot<Self>;

    /// Opens the backend (device discovery). An error makes `init` fail, so NCCL falls back to its
    /// internal transports; the error's message is logged once as a WARN line.
    fn open() -> Result<Self>;

    /// Opens the backend again after the last context released it, keeping `table` (the devices the
    /// first open reported, which NCCL still holds: it asks for the count once per load of the
    /// library): the same count, order and names, a device that is gone keeping its slot. The
    /// default opens afresh; [`init`] refuses the result if its table differs.
    fn reopen(table: &[Properties]) -> Result<Self> {
        let _ = table;
        Self::open()
    }

    /// The devices, in NCCL device order. Fixed for the life of the backend.
    fn devices(&self) -> &[Properties];

    /// Starts listening on device `dev` for one connection; fills `handle` for the peer.
    fn listen(
        self: &Arc<Self>,
        comm: &CommInfo,
        dev: usize,
        handle: &mut Handle,
    ) -> Result<Self::Listen>;

    /// Connects to the peer described by `handle` (the private, persistent copy: state may be kept in it).
    /// `Ok(None)` = in progress, NCCL calls again with the same handle.
    fn connect(
        self: &Arc<Self>,
        comm: &CommInfo,
        dev: usize,
        handle: &mut Handle,
    ) -> Result<Option<Self::Send>>;

    /// Accepts the connection for `listen`. `Ok(None)` = in progress, NCCL calls again.
    fn accept(listen: &mut Self::Listen) -> Result<Option<Self::Recv>>;

    /// Registers `region` on the device of `comm`.
    fn reg_mr(comm: CommRef<'_, Self>, region: Region) -> Result<Self::Mr>;

    /// Registers a DMA-BUF: `fd` (closed by NCCL right after this call) at `offset`, mapped at `region`.
    fn reg_mr_dmabuf(
        comm: CommRef<'_, Self>,
        region: Region,
        offset: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<Self::Mr>;

    /// Releases a registration.
    fn dereg_mr(comm: CommRef<'_, Self>, mr: Self::Mr) -> Result<()>;

    /// Posts a send of `size` bytes at `addr`. `Ok(None)` = cannot post now, NCCL calls again.
    fn isend(
        comm: &Self::Send,
        addr: usize,
        size: usize,
        tag: i32,
        mr: &Self::Mr,
    ) -> Result<Option<Self::Request>>;

    /// Posts one grouped receive of `bufs.len()` buffers. `Ok(None)` = cannot post now, NCCL calls again.
    fn irecv(comm: &Self::Recv, bufs: &[RecvBuf<'_, Self::Mr>]) -> Result<Option<Self::Request>>;

    /// Makes received GPU data visible. `Ok(None)` = nothing to wait for (NOT a retry).
    fn iflush(comm: &Self::Recv, bufs: &[FlushBuf<'_, Self::Mr>]) -> Result<Option<Self::Request>>;

    /// Polls a request. On `Ok(true)` the request is complete and `sizes` holds the byte counts (one for a
    /// send, one per buffer for a receive, none for a flush); the core then drops it and frees its slot.
    fn test(req: &mut Self::Request, sizes: &mut [usize]) -> Result<bool>;

    /// Closes a send comm (requests may still be in flight on abort).
    fn close_send(comm: Self::Send) -> Result<()>;

    /// Closes a recv comm (requests may still be in flight on abort).
    fn close_recv(comm: Self::Recv) -> Result<()>;

    /// Closes a listen comm (accepted or not).
    fn close_listen(listen: Self::Listen) -> Result<()>;

    /// What this process runs, for the init line (the backend's own attestation; the default
    /// computes it with hashing on).
    fn build(&self) -> crate::transport::metrics::Build {
        attest::build(true)
    }

    /// State a communicator keeps from `init` to `finalize` (ABI v11+; the legacy context of
    /// v6–v10 calls it once with no communicator id), dropped at `finalize`: the relay service.
    /// Default: none.
    fn attach(self: &Arc<Self>, comm: &CommInfo) -> Result<Option<CommGuard>> {
        let _ = comm;
        Ok(None)
    }

    /// Transfer hints (`setNetAttr`, v11+). Default: ignored.
    fn set_net_attr(&self, _comm: &CommInfo, _attr: &NetAttr) -> Result<()> {
        Ok(())
    }
}

/// The per-process home of an open backend: a weak reference, so the backend lives exactly as long as the
/// contexts and comms that hold it; the context shared by the ABI versions without per-communicator
/// init (v6–v10), which lives until the library is unloaded; and the device table of the first open,
/// which every later open keeps ([`Backend::reopen`]) because NCCL keeps it until it unloads the library.
#[derive(Debug)]
pub struct Slot<B: Backend> {
    live: Mutex<Weak<B>>,
    legacy: Mutex<Option<Arc<Context<B>>>>,
    table: Mutex<Option<Vec<Properties>>>,
    /// The request slabs of this backend's comms (they outlive any one open of the backend).
    slabs: slab::Slabs<B>,
}

impl<B: Backend> Slot<B> {
    /// An empty slot (for a `static`).
    pub const fn new() -> Slot<B> {
        Slot {
            live: Mutex::new(Weak::new()),
            legacy: Mutex::new(None),
            table: Mutex::new(None),
            slabs: slab::Slabs::new(),
        }
    }
}

impl<B: Backend> Default for Slot<B> {
    fn default() -> Self {
        Slot::new()
    }
}

/// The open backend, opening it if no context holds one: the first open sets the device table,
/// every later one keeps it.
fn acquire<B: Backend>() -> Result<Arc<B>> {
    let mut live = lock(&B::slot().live, "backend slot")?;
    if let Some(b) = live.upgrade() {
        return Ok(b);
    }
    let mut table = lock(&B::slot().table, "device table")?;
    let b = match table.as_deref() {
        None => {
            let b = B::open()?;
            *table = Some(b.devices().to_vec());
            b
        }
        Some(t) => {
            let b = B::reopen(t)?;
            same_devices(t, b.devices())?;
            b
        }
    };
    let b = Arc::new(b);
    *live = Arc::downgrade(&b);
    Ok(b)
}

/// A re-opened backend must report the devices NCCL already holds: same count, order and names.
fn same_devices(then: &[Properties], now: &[Properties]) -> Result<()> {
    let names = |d: &[Properties]| -> Vec<String> {
        d.iter()
            .map(|p| p.name.to_string_lossy().into_owned())
            .collect()
    };
    if names(then) == names(now) {
        return Ok(());
    }
    Err(Error::Internal(format!(
        "the device table changed since the library was loaded (then [{}], now [{}]); NCCL keeps the first \
         one until it unloads the plugin",
        names(then).join(", "),
        names(now).join(", ")
    )))
}

/// The open backend, if a context or comm holds it (the tuner reads the devices of the net plugin
/// that carries the communicator; it never opens one).
pub fn live_backend<B: Backend>() -> Result<Option<Arc<B>>> {
    current::<B>()
}

/// The backend if a context or comm holds it.
fn current<B: Backend>() -> Result<Option<Arc<B>>> {
    let live = lock(&B::slot().live, "backend slot")?;
    Ok(live.upgrade())
}

/// What a backend keeps per communicator ([`Backend::attach`]), dropped with its context.
pub struct CommGuard {
    _state: Box<dyn std::any::Any + Send + Sync>,
}

impl CommGuard {
    /// Wraps the backend's state.
    pub fn new(state: Box<dyn std::any::Any + Send + Sync>) -> CommGuard {
        CommGuard { _state: state }
    }
}

impl std::fmt::Debug for CommGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommGuard")
    }
}

/// A communicator's plugin state (`void* ctx` of ABI v11+).
#[derive(Debug)]
pub struct Context<B> {
    magic: u64,
    backend: Arc<B>,
    info: CommInfo,
    /// The backend's per-communicator state; dropped before the backend reference.
    guard: Option<CommGuard>,
}

impl<B: Backend> Context<B> {
    /// A context with its magic word.
    fn new(backend: Arc<B>, info: CommInfo, guard: Option<CommGuard>) -> Context<B> {
        Context {
            magic: CTX_MAGIC,
            backend,
            info,
            guard,
        }
    }

    /// Whether the backend keeps state for this communicator (the relay service).
    pub fn has_guard(&self) -> bool {
        self.guard.is_some()
    }

    /// What NCCL said about the communicator.
    pub fn info(&self) -> &CommInfo {
        &self.info
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }
}

/// `init` of ABI v11+: a new context; opens the backend if none is open.
pub fn init<B: Backend>(info: CommInfo) -> Result<Context<B>> {
    let backend = acquire::<B>()?;
    tracing::info!(
        target: TARGET_INIT,
        comm_id = info.comm_id.map(|c| format!("{c:#x}")).unwrap_or_default(),
        devices = backend.devices().len(),
        "NET/switchless: {} initialized",
        backend.build().text()
    );
    let guard = backend.attach(&info)?;
    Ok(Context::new(backend, info, guard))
}

/// `finalize` of ABI v11+: drops the context (and what the backend keeps for the communicator,
/// first); the last one releases the backend.
pub fn finalize<B: Backend>(ctx: Context<B>) -> Result<()> {
    let Context { guard, backend, .. } = ctx;
    drop(guard);
    drop(backend);
    Ok(())
}

/// `init` of ABI v6–v10: opens the backend once and keeps one shared context until the library unloads.
pub fn init_legacy<B: Backend>() -> Result<Arc<Context<B>>> {
    let mut legacy = lock(&B::slot().legacy, "legacy context")?;
    if let Some(c) = legacy.as_ref() {
        return Ok(Arc::clone(c));
    }
    let ctx = Arc::new(init::<B>(CommInfo::default())?);
    *legacy = Some(Arc::clone(&ctx));
    Ok(ctx)
}

/// The legacy context, for the v6–v10 `listen`/`connect`.
pub fn legacy_context<B: Backend>() -> Result<Arc<Context<B>>> {
    let legacy = lock(&B::slot().legacy, "legacy context")?;
    legacy.as_ref().map(Arc::clone).ok_or_else(|| {
        Error::InvalidArgument("listen/connect called before a successful init".into())
    })
}

/// `devices`: 0 while no backend is open (init failed or was never called).
pub fn devices<B: Backend>() -> Result<usize> {
    Ok(current::<B>()?.map_or(0, |b| b.devices().len()))
}

/// `getProperties(dev)`, validated.
pub fn properties<B: Backend>(dev: i32) -> Result<Properties> {
    let backend = current::<B>()?;
    let devs = backend.as_deref().map_or(&[][..], |b| b.devices());
    let i = device_index(dev, devs.len())?;
    let p = devs[i].clone();
    p.validate(i)?;
    Ok(p)
}

fn device_index(dev: i32, n: usize) -> Result<usize> {
    usize::try_from(dev).ok().filter(|&i| i < n).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "device {dev} does not exist; this process has {n} device(s), numbered 0..{n}"
        ))
    })
}

const LISTEN_MAGIC: u64 = 0x5357_4c5f_4c49_5354; // "SWL_LIST"
const COMM_MAGIC: u64 = 0x5357_4c5f_434f_4d4d; // "SWL_COMM"
const MR_MAGIC: u64 = 0x5357_4c5f_4d52_5f5f; // "SWL_MR__"
const CTX_MAGIC: u64 = 0x5357_4c5f_4354_5854; // "SWL_CTXT"

/// A listen comm (`void* listenComm`).
pub struct Listen<B: Backend> {
    magic: u64,
    inner: B::Listen,
}

/// The two ends of a connection, behind one type because `regMr`/`deregMr` get either.
pub enum Endpoint<B: Backend> {
    /// From `connect`.
    Send(B::Send),
    /// From `accept`.
    Recv(B::Recv),
}

/// A send or recv comm (`void* sendComm` / `void* recvComm`), with the slab its requests live in.
pub struct Comm<B: Backend> {
    magic: u64,
    end: Endpoint<B>,
    slab: slab::Lease<B>,
}

/// A registration (`void* mhandle`).
pub struct Mr<B: Backend> {
    magic: u64,
    inner: B::Mr,
}

/// An object NCCL holds as a `void*` between calls, with a magic word checked before every use.
pub trait Object {
    /// What the object is, for error messages.
    const WHAT: &'static str;
    /// The magic word of a live object of this kind (`ffi` files live objects under it).
    const MAGIC: u64;
    /// Whether this object is alive and of this kind.
    fn is_valid(&self) -> bool;
}

macro_rules! checked {
    ($t:ident, $magic:ident, $what:literal) => {
        impl<B: Backend> Object for $t<B> {
            const WHAT: &'static str = $what;
            const MAGIC: u64 = $magic;
            fn is_valid(&self) -> bool {
                self.magic == $magic
            }
        }
    };
}
checked!(Listen, LISTEN_MAGIC, "listen comm");
checked!(Comm, COMM_MAGIC, "send/recv comm");
checked!(Mr, MR_MAGIC, "memory handle");
checked!(Context, CTX_MAGIC, "net context");

impl<B: Backend> Listen<B> {
    /// A boxed listen comm with its magic word.
    fn boxed(inner: B::Listen) -> Box<Listen<B>> {
        Box::new(Listen {
            magic: LISTEN_MAGIC,
            inner,
        })
    }
}

impl<B: Backend> Comm<B> {
    /// A boxed comm with its magic word and a request slab; without a slab the endpoint is closed.
    fn boxed(end: Endpoint<B>) -> Result<Box<Comm<B>>> {
        let slab = match slab::Lease::new() {
            Ok(s) => s,
            Err(e) => {
                // Best effort: the error NCCL sees is the slab's.
                let _ = match end {
                    Endpoint::Send(s) => B::close_send(s),
                    Endpoint::Recv(r) => B::close_recv(r),
                };
                return Err(e);
            }
        };
        Ok(Box::new(Comm {
            magic: COMM_MAGIC,
            end,
            slab,
        }))
    }

    /// The backend's end of the connection.
    pub fn endpoint(&self) -> &Endpoint<B> {
        &self.end
    }

    /// Whether this is the sending end.
    pub fn is_send(&self) -> bool {
        matches!(self.end, Endpoint::Send(_))
    }

    fn comm_ref(&self) -> CommRef<'_, B> {
        match &self.end {
            Endpoint::Send(s) => CommRef::Send(s),
            Endpoint::Recv(r) => CommRef::Recv(r),
        }
    }

    fn send(&self) -> Result<&B::Send> {
        match &self.end {
            Endpoint::Send(s) => Ok(s),
            Endpoint::Recv(_) => Err(Error::InvalidArgument(
                "a recv comm was given where a send comm is required".into(),
            )),
        }
    }

    fn recv(&self) -> Result<&B::Recv> {
        match &self.end {
            Endpoint::Recv(r) => Ok(r),
            Endpoint::Send(_) => Err(Error::InvalidArgument(
                "a send comm was given where a recv comm is required".into(),
            )),
        }
    }
}

impl<B: Backend> Mr<B> {
    /// A boxed registration with its magic word.
    fn boxed(inner: B::Mr) -> Box<Mr<B>> {
        Box::new(Mr {
            magic: MR_MAGIC,
            inner,
        })
    }

    /// The backend's registration.
    pub fn inner(&self) -> &B::Mr {
        &self.inner
    }
}

/// `listen(ctx, dev, handle)`.
pub fn listen<B: Backend>(
    ctx: &Context<B>,
    dev: i32,
    handle: &mut Handle,
) -> Result<Box<Listen<B>>> {
    let i = device_index(dev, ctx.backend.devices().len())?;
    let inner = ctx.backend.listen(&ctx.info, i, handle)?;
    Ok(Listen::boxed(inner))
}

/// `connect(ctx, dev, handle)`; `info` overrides the context's (v10 passes the config per connect).
pub fn connect<B: Backend>(
    ctx: &Context<B>,
    info: Option<CommInfo>,
    dev: i32,
    handle: &mut Handle,
) -> Result<Option<Box<Comm<B>>>> {
    let i = device_index(dev, ctx.backend.devices().len())?;
    let info = info.unwrap_or(ctx.info);
    let send = ctx.backend.connect(&info, i, handle)?;
    send.map(|s| Comm::boxed(Endpoint::Send(s))).transpose()
}

/// `accept(listenComm)`.
pub fn accept<B: Backend>(listen: &mut Listen<B>) -> Result<Option<Box<Comm<B>>>> {
    B::accept(&mut listen.inner)?
        .map(|r| Comm::boxed(Endpoint::Recv(r)))
        .transpose()
}

/// `regMr(comm, data, size, type)`.
pub fn reg_mr<B: Backend>(comm: &Comm<B>, region: Region) -> Result<Box<Mr<B>>> {
    let inner = B::reg_mr(comm.comm_ref(), region)?;
    Ok(Mr::boxed(inner))
}

/// `regMrDmaBuf(comm, data, size, type, offset, fd)`.
pub fn reg_mr_dmabuf<B: Backend>(
    comm: &Comm<B>,
    region: Region,
    offset: u64,
    fd: BorrowedFd<'_>,
) -> Result<Box<Mr<B>>> {
    let inner = B::reg_mr_dmabuf(comm.comm_ref(), region, offset, fd)?;
    Ok(Mr::boxed(inner))
}

/// `deregMr(comm, mhandle)`.
pub fn dereg_mr<B: Backend>(comm: &Comm<B>, mr: Mr<B>) -> Result<()> {
    let Mr { inner, .. } = mr;
    B::dereg_mr(comm.comm_ref(), inner)
}

/// `isend(sendComm, data, size, tag, mhandle)`; `Ok(None)` = retry later.
pub fn isend<B: Backend>(
    comm: &Comm<B>,
    addr: usize,
    size: usize,
    tag: i32,
    mr: &Mr<B>,
) -> Result<Option<RequestId>> {
    let send = comm.send()?;
    comm.slab.post(RequestKind::Send, || {
        B::isend(send, addr, size, tag, &mr.inner)
    })
}

/// `irecv(recvComm, n, data, sizes, tags, mhandles)`; `Ok(None)` = retry later.
pub fn irecv<B: Backend>(comm: &Comm<B>, bufs: &[RecvBuf<'_, B::Mr>]) -> Result<Option<RequestId>> {
    if bufs.is_empty() || bufs.len() > MAX_GROUPED_RECVS {
        return Err(Error::InvalidArgument(format!(
            "irecv of {} buffers; accepted: 1..={MAX_GROUPED_RECVS}",
            bufs.len()
        )));
    }
    let recv = comm.recv()?;
    comm.slab
        .post(RequestKind::Recv(bufs.len()), || B::irecv(recv, bufs))
}

/// `iflush(recvComm, n, data, sizes, mhandles)`; `Ok(None)` = nothing to wait for.
pub fn iflush<B: Backend>(
    comm: &Comm<B>,
    bufs: &[FlushBuf<'_, B::Mr>],
) -> Result<Option<RequestId>> {
    if bufs.is_empty() || bufs.len() > MAX_GROUPED_RECVS {
        return Err(Error::InvalidArgument(format!(
            "iflush of {} buffers; accepted: 1..={MAX_GROUPED_RECVS}",
            bufs.len()
        )));
    }
    let recv = comm.recv()?;
    comm.slab.post(RequestKind::Flush, || B::iflush(recv, bufs))
}

/// `test(request)`: `Ok(Some(n))` when complete, with `n` byte counts in `sizes` (1 for a send, one per
/// buffer for a receive, 0 for a flush); the request is freed then, and `id` is dead. `Ok(None)` while
/// in flight. An `id` that names no live request is an error.
pub fn test<B: Backend>(
    id: RequestId,
    sizes: &mut [usize; MAX_GROUPED_RECVS],
) -> Result<Option<usize>> {
    slab::test::<B>(id, sizes)
}

/// `closeSend(sendComm)`.
pub fn close_send<B: Backend>(comm: Comm<B>) -> Result<()> {
    // The slab goes back after the backend closed the comm (its requests then fail, as on abort).
    match comm.end {
        Endpoint::Send(s) => B::close_send(s),
        Endpoint::Recv(_) => Err(Error::InvalidArgument(
            "closeSend was given a recv comm".into(),
        )),
    }
}

/// `closeRecv(recvComm)`.
pub fn close_recv<B: Backend>(comm: Comm<B>) -> Result<()> {
    match comm.end {
        Endpoint::Recv(r) => B::close_recv(r),
        Endpoint::Send(_) => Err(Error::InvalidArgument(
            "closeRecv was given a send comm".into(),
        )),
    }
}

/// `closeListen(listenComm)`.
pub fn close_listen<B: Backend>(listen: Listen<B>) -> Result<()> {
    B::close_listen(listen.inner)
}

/// `setNetAttr(ctx, attr)` (v11+).
pub fn set_net_attr<B: Backend>(ctx: &Context<B>, attr: &NetAttr) -> Result<()> {
    ctx.backend.set_net_attr(&ctx.info, attr)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn properties_are_validated_against_nccl_limits() {
        let good = Properties::host("d0", None, 1).unwrap();
        good.validate(0).unwrap();
        let mut p = good.clone();
        p.max_p2p_bytes = 0;
        assert!(
            p.validate(0)
                .unwrap_err()
                .to_string()
                .contains("max_p2p_bytes 0")
        );
        p.max_p2p_bytes = MAX_NET_SIZE_BYTES + 1;
        assert!(matches!(p.validate(0), Err(Error::Internal(_))));
        let mut p = good.clone();
        p.max_coll_bytes = 0;
        assert!(p.validate(0).is_err());
        let mut p = good.clone();
        p.max_recvs = 0;
        assert!(
            p.validate(0)
                .unwrap_err()
                .to_string()
                .contains("max_recvs 0")
        );
        let mut p = good;
        p.vdevs = (0..9).collect();
        assert!(
            p.validate(3)
                .unwrap_err()
                .to_string()
                .contains("9 fused devices")
        );
    }

    #[test]
    fn interned_strings_are_shared_and_nul_is_refused() {
        let a = intern("mlx5_0").unwrap();
        let b = intern("mlx5_0").unwrap();
        assert_eq!(a.as_ptr(), b.as_ptr());
        assert_eq!(a, c"mlx5_0");
        assert!(matches!(intern("a\0b"), Err(Error::Internal(_))));
    }

    #[test]
    fn device_indices_are_checked() {
        assert_eq!(device_index(1, 2).unwrap(), 1);
        for bad in [-1, 2, i32::MAX] {
            let e = device_index(bad, 2).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)));
            assert!(e.to_string().contains("2 device(s)"), "{e}");
        }
    }
}
