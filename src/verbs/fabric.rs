//! [`VerbsFabric`]: the transport's [`Fabric`] over ibverbs RC queue pairs.
//!
//! One endpoint of one connection: one RC QP (with its own CQ, shared by its send and receive queues)
//! per data path, plus, when asked, one loopback QP per RDMA device for the GPU-direct flush (an RC QP
//! connected to itself on the same port and GID, created at the first GPU registration or the first
//! flush). Follows the checklist in `transport::fabric`:
//!
//! * queue sizes: `max_send_wr` = [`SEND_QUEUE_DEPTH`] (576) + 4 (failback's mailbox writes),
//!   `max_recv_wr` = [`RECV_DEPTH`] (256), CQ ≥ both together;
//! * registrations: one MR per RDMA device of the connection, in the device's [`Domain`] (one
//!   protection domain per device shared by every connection of the process, with a registration
//!   cache: the same buffer registered on many connections is one MR), keys per path; data memory
//!   may use relaxed ordering (host, GPU and DMA-BUF alike), control memory never does;
//!   registration runs through a [`Pinner`] too, so `regMr` need not hold the connection's lock;
//! * control memory is a `Box<[AtomicU64]>` registered with strict ordering; `ctrl_load`/`ctrl_store` are
//!   atomic loads and stores with the ordering the protocol asks for (AArch64: the NIC's writes are
//!   observed after an `Acquire` load of the publishing word);
//! * writes: a batch (`post_writes`) is one chained `ibv_post_send` (one doorbell per 8 writes);
//!   `num_sge = 0` for zero-length writes, immediates in network byte order on the wire
//!   (the verbs layer converts in both directions; the trait speaks host order);
//! * `shutdown` moves every QP to ERR; dropping the fabric then destroys QPs, CQs and MRs, in that
//!   order (control memory is freed only after its MRs are gone); a data MR goes with the last
//!   registration of it, the PD with the last connection and the factory.
//!
//! Life cycle: [`VerbsFabric::new`] creates the data QPs and moves them to INIT (receives may be
//! posted); the loopback flush QPs are created at the first GPU registration (`prepare_flush`) or,
//! failing that, at the first flush (a receive comm without GPU memory never has them);
//! [`VerbsFabric::local_ends`] gives what the peer needs; [`VerbsFabric::connect`] moves every data QP
//! to RTR then RTS towards the peer's ends. `NCCL_IB_QPS_PER_CONNECTION` is not folded in: one QP per
//! path (striping over paths already spreads a connection).
//!
//! Failback (`fabric/revive.rs`): a data path whose port is ACTIVE again gets a fresh QP and CQ,
//! agreed with the peer through a mailbox written over a surviving path.
//!
//! [`SEND_QUEUE_DEPTH`]: crate::transport::fabric::SEND_QUEUE_DEPTH
//! [`RECV_DEPTH`]: crate::transport::fabric::RECV_DEPTH
//!
//! The inline hint of [`WriteWr`] is honoured up to the QP's granted `max_inline_data` (128 bytes
//! requested; a device that refuses inline gets QPs without it and SGE writes only): the provider
//! copies the bytes from the SGE at post time.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod revive;

use super::cq::{Completion as VerbsCompletion, CompletionQueue, WcOpcode as VerbsOpcode};
use super::domain::{Domain, Pin};
use super::memory::MemoryRegion;
use super::qp::{
    CHAIN_MAX, QpCaps, QueuePair, RemoteAddr, RtrParams, RtsParams, SendFlags, Sge, WriteReq,
};
use super::types::{Access, Gid, Mtu, PortState};
use crate::error::{Error, Result};
use crate::sync::lock;
use crate::sys::rawmem::Lent;
use crate::transport::fabric::{
    Completion, CtrlMem, Fabric, MemKind, PathInfo, PathKeys, PathRole, Pinner, ReadWr,
    Registration, WcOpcode, WriteWr,
};
use crate::transport::regcache::RegKind;

/// One data path to build: an RDMA device port and the GID to send from.
#[derive(Debug, Clone)]
pub struct VerbsPath {
    /// The device's shared protection domain and registration cache (one per device per process).
    pub domain: Arc<Domain>,
    /// Port number (1-based).
    pub port: u8,
    /// Local GID index (the IPv4 RoCE v2 GID of the link's address, or `NCCL_IB_GID_INDEX`).
    pub gid_index: u32,
    /// Active MTU of the port in bytes (256..=4096).
    pub active_mtu: u32,
    /// Link speed in Mb/s (stripe weight).
    pub speed_mbps: u64,
    /// For logs: netdev, address, device and port.
    pub label: String,
}

/// What the peer needs to connect to one data path of this endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalEnd {
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
    pub gid_index: u32,
    /// Active MTU in bytes.
    pub mtu: u32,
}

/// The peer's end of one data path (from the handshake).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteEnd {
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
    /// The peer's active MTU in bytes.
    pub mtu: u32,
    /// Address and rkey (on this path) of the peer's reconnect mailbox; 0: the peer has none.
    pub mailbox: u64,
    pub mailbox_rkey: u32,
}

/// QP attributes from the configuration and the communicator (NCCL_IB_TC/SL/TIMEOUT/RETRY_CNT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpTuning {
    pub traffic_class: u8,
    pub sl: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
}

impl QpTuning {
    /// NCCL's precedence: the variable, else the communicator's traffic class, else 0.
    pub fn from_config(cfg: &crate::config::Config, comm_traffic_class: Option<u8>) -> QpTuning {
        let rtr = RtrParams::new(1, [1; 16], 0, Mtu::Mtu1024).with_config(cfg, comm_traffic_class);
        QpTuning {
            traffic_class: rtr.traffic_class,
            sl: rtr.sl,
            timeout: cfg.ib_timeout,
            retry_cnt: cfg.ib_retry_cnt,
        }
    }

    /// How long an RC sender keeps retrying before its work request fails with "transport retry
    /// counter exceeded": 4.096 µs × 2^timeout per try, `retry_cnt` + 1 tries (IB spec; NCCL's
    /// defaults 20 and 7 give 34.4 s). Saturates instead of overflowing for out-of-range values.
    pub fn retry_budget(&self) -> Duration {
        let per_try_ns = 4096u64.saturating_mul(1u64 << self.timeout.min(31));
        Duration::from_nanos(per_try_ns.saturating_mul(u64::from(self.retry_cnt) + 1))
    }
}

impl Default for QpTuning {
    fn default() -> Self {
        QpTuning::from_config(&crate::config::Config::default(), None)
    }
}

/// A loopback flush path of one device, created at the first GPU registration or flush.
struct LoopSpec {
    /// Index into the fabric's `doms`.
    pd: usize,
    port: u8,
    gid_index: u32,
    active_mtu: u32,
}

/// Control memory: MRs first so they are deregistered before the words are freed.
struct CtrlBlock {
    mrs: Vec<MemoryRegion>,
    words: Box<[AtomicU64]>,
    token: u64,
}

impl CtrlBlock {
    fn base(&self) -> u64 {
        self.words.as_ptr() as u64
    }
}

/// The verbs endpoint of one connection. See the module docs.
pub struct VerbsFabric {
    // Drop order matters: QPs, then control memory (MRs, then words), then this endpoint's
    // references to data MRs, then to the shared PDs.
    qps: Vec<QueuePair>,
    cqs: Vec<Arc<CompletionQueue>>,
    ctrl: Vec<CtrlBlock>,
    /// Failback: the reconnect mailbox and each data path's rebuild (`fabric/revive.rs`).
    fb: revive::Failback,
    /// The loopback flush paths to create at the first GPU registration or flush (after the data
    /// paths, in order).
    loops: Vec<LoopSpec>,
    /// Data registrations (shared with `regMr` callers that register without the fabric).
    pinner: Arc<VerbsPinner>,
    doms: Vec<Arc<Domain>>,
    /// Index into `doms` per path.
    path_pd: Vec<usize>,
    infos: Vec<PathInfo>,
    local: Vec<LocalEnd>,
    /// Tokens of control memory.
    next_token: u64,
    shut: bool,
    scratch: Vec<VerbsCompletion>,
    /// Polls and health calls since the devices' asynchronous events were last drained.
    polls: u32,
    /// When the endpoint was created: older QP/CQ events name objects that no longer exist.
    created: std::time::Instant,
    /// A data path whose port has been down this long (ms) fails the connection: the RC retry
    /// budget of the connection's tuning, at least [`PORT_DOWN_GRACE_MIN`].
    port_grace_ms: AtomicU64,
}

/// The shortest time a port must stay down before its connections fail (a flap shorter than this
/// is left to the RC retries).
pub const PORT_DOWN_GRACE_MIN: Duration = Duration::from_secs(1);

fn port_grace(tuning: &QpTuning) -> Duration {
    tuning.retry_budget().max(PORT_DOWN_GRACE_MIN)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Drain the devices' asynchronous events every this many polls (a non-blocking `read` each time;
/// a busy progress loop gets there within microseconds).
const EVENT_CHECK_EVERY: u32 = 256;

// The raw verbs objects are Send + Sync (see their SAFETY notes); the rest is plain data.
impl std::fmt::Debug for VerbsFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsFabric")
            .field("paths", &self.infos)
            .field("local", &self.local)
            .finish()
    }
}

fn random_psn() -> Result<u32> {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b)
        .map_err(|e| Error::System(format!("reading random bytes for a PSN: {e}")))?;
    Ok(u32::from_le_bytes(b) & super::qp::MAX_QPN)
}

fn path_mtu(a: u32, b: u32) -> Mtu {
    let m = a.min(b);
    [4096, 2048, 1024, 512, 256]
        .into_iter()
        .find(|&x| x <= m)
        .and_then(Mtu::from_bytes)
        .unwrap_or(Mtu::Mtu256)
}

/// Inline payload requested per QP, bytes: the protocol marks data writes of at most 64 bytes
/// inline, and clear-to-send entries of at most 128 (one buffer: 80 bytes, in one write).
const INLINE_BYTES: u32 = 128;

/// What a peer may do through a data QP: the protocol only ever writes to its peer (data, FIFO
/// slots, size records), so remote reads are refused at the QP.
const DATA_QP_ACCESS: Access = Access::REMOTE_WRITE;
/// The loopback flush QP only serves its own RDMA reads of this process's receive buffers.
const FLUSH_QP_ACCESS: Access = Access::REMOTE_READ;

/// One data registration: a pin per device (`None`: a deferred device not used yet), the memory
/// they pin (kept lent until released), and what a later pin on a deferred device needs.
struct PinEntry {
    // Field order: the pins drop before the lent memory and the DMA-BUF fd.
    pins: Vec<Option<Pin>>,
    mem: Lent,
    kind: MemKind,
    /// A DMA-BUF registration with a deferred device: a duplicate of NCCL's fd (NCCL closes its
    /// own after `regMrDmaBuf`) and the offset, until the registration is released.
    dmabuf: Option<(OwnedFd, u64)>,
}

/// The registrations by token, and the devices deferred ([`Fabric::defer_paths`]), under one
/// lock: a registration is filed and a device activated one at a time, so every filed
/// registration has a pin on every active device.
#[derive(Default)]
struct PinTable {
    map: HashMap<u64, PinEntry>,
    deferred: Vec<bool>,
}

/// Registers data memory for one endpoint without borrowing it ([`Fabric::pinner`]): a [`Pin`] in
/// each device's [`Domain`] (the registration cache), keys per path. A deferred device (its every
/// path stands by) is pinned only at [`Fabric::activate_path`].
struct VerbsPinner {
    doms: Vec<Arc<Domain>>,
    /// Index into `doms` per path.
    path_pd: Vec<usize>,
    regs: Mutex<PinTable>,
    next_token: AtomicU64,
}

impl VerbsPinner {
    fn new(doms: Vec<Arc<Domain>>, path_pd: Vec<usize>) -> VerbsPinner {
        let n = doms.len();
        VerbsPinner {
            doms,
            path_pd,
            regs: Mutex::new(PinTable {
                map: HashMap::new(),
                deferred: vec![false; n],
            }),
            next_token: AtomicU64::new(1),
        }
    }

    /// The devices deferred now.
    fn deferred(&self) -> Result<Vec<bool>> {
        Ok(lock(&self.regs, "verbs registrations")?.deferred.clone())
    }

    /// Pins `mem` on device `d`: the DMA-BUF `fd` at `offset` when given, else host or GPU
    /// memory by address.
    fn pin_one(
        &self,
        d: usize,
        mem: &Lent,
        kind: MemKind,
        dmabuf: Option<(BorrowedFd<'_>, u64)>,
    ) -> Result<Pin> {
        let dom = &self.doms[d];
        if let Some((fd, offset)) = dmabuf {
            return dom.register_dmabuf(mem.addr(), mem.len(), offset, fd);
        }
        let rk = match kind {
            MemKind::Host => RegKind::Host,
            MemKind::Cuda => RegKind::Cuda,
        };
        // SAFETY: `mem` lends process memory (checked by `register` before any pin) that stays
        // allocated and writable until every registration made from it is released (the `Lent`
        // contract); this pin is filed with a clone of `mem` and dropped before it in
        // `deregister`. The NIC touches it only through QPs stopped before teardown.
        unsafe { dom.register(mem.addr(), mem.len(), rk) }.map_err(|e| {
            context(
                e,
                &format!(
                    "registering {} memory",
                    if kind == MemKind::Cuda { "GPU" } else { "host" }
                ),
            )
        })
    }

    /// Files a registration: the pins made (per device), plus, under the lock, a pin on any
    /// device activated since they were made. Its keys per path (missing on deferred devices)
    /// and a fresh token.
    fn file(
        &self,
        mut pins: Vec<Option<Pin>>,
        mem: &Lent,
        kind: MemKind,
        dmabuf: Option<(BorrowedFd<'_>, u64)>,
    ) -> Result<Registration> {
        let mut t = lock(&self.regs, "verbs registrations")?;
        // A DMA-BUF registration keeps a duplicate of the fd for its deferred devices; without
        // one (the fd limit), it is pinned there now, as before lazy registration.
        let mut keep = None;
        if let Some((fd, offset)) = dmabuf.filter(|_| pins.iter().any(Option::is_none)) {
            match fd.try_clone_to_owned() {
                Ok(dup) => keep = Some((dup, offset)),
                Err(e) => tracing::debug!(
                    "NET/switchless: no duplicate of the DMA-BUF fd ({e}): registering on the standby devices now"
                ),
            }
        }
        for (d, p) in pins.iter_mut().enumerate() {
            if p.is_none() && (!t.deferred[d] || (dmabuf.is_some() && keep.is_none())) {
                *p = Some(self.pin_one(d, mem, kind, dmabuf)?);
            }
        }
        let mut missing = 0u32;
        let keys = self
            .path_pd
            .iter()
            .enumerate()
            .map(|(i, &d)| match &pins[d] {
                Some(pin) => {
                    let (lkey, rkey) = pin.keys();
                    PathKeys { lkey, rkey }
                }
                None => {
                    missing |= 1u32 << i.min(31);
                    PathKeys::default()
                }
            })
            .collect();
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        t.map.insert(
            token,
            PinEntry {
                pins,
                mem: mem.clone(),
                kind,
                dmabuf: keep,
            },
        );
        Ok(Registration {
            keys,
            token,
            missing,
        })
    }

    /// Pins every filed registration on the device of `path` if it was deferred, and every later
    /// one there.
    fn activate(&self, path: usize) -> Result<()> {
        let Some(&d) = self.path_pd.get(path) else {
            return Err(Error::InvalidArgument(format!(
                "verbs path {path}: the connection has {} paths",
                self.path_pd.len()
            )));
        };
        let mut t = lock(&self.regs, "verbs registrations")?;
        if !t.deferred[d] {
            return Ok(());
        }
        for e in t.map.values_mut() {
            if e.pins[d].is_some() {
                continue;
            }
            let src = e.dmabuf.as_ref().map(|(fd, off)| (fd.as_fd(), *off));
            e.pins[d] = Some(self.pin_one(d, &e.mem, e.kind, src)?);
        }
        t.deferred[d] = false;
        for e in t.map.values_mut() {
            if e.pins.iter().all(Option::is_some) {
                e.dmabuf = None;
            }
        }
        Ok(())
    }

    /// Defers the devices whose every path is in `paths`.
    fn defer(&self, paths: &[usize]) -> Result<()> {
        let mut t = lock(&self.regs, "verbs registrations")?;
        for d in 0..self.doms.len() {
            let mut on = self.path_pd.iter().enumerate().filter(|(_, pd)| **pd == d);
            if on.clone().next().is_some() && on.all(|(i, _)| paths.contains(&i)) {
                t.deferred[d] = true;
            }
        }
        Ok(())
    }

    fn keys_on(&self, reg: &Registration, path: usize) -> Option<PathKeys> {
        if reg.has(path) {
            return Some(reg.keys[path]);
        }
        let d = *self.path_pd.get(path)?;
        let t = lock(&self.regs, "verbs registrations").ok()?;
        let pin = t.map.get(&reg.token)?.pins.get(d)?.as_ref()?;
        let (lkey, rkey) = pin.keys();
        Some(PathKeys { lkey, rkey })
    }
}

impl Pinner for VerbsPinner {
    fn register_dmabuf(&self, mem: &Lent, offset: u64, fd: BorrowedFd<'_>) -> Result<Registration> {
        let deferred = self.deferred()?;
        let pins = (0..self.doms.len())
            .map(|d| {
                (!deferred[d])
                    .then(|| self.pin_one(d, mem, MemKind::Cuda, Some((fd, offset))))
                    .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        self.file(pins, mem, MemKind::Cuda, Some((fd, offset)))
    }

    fn register(&self, mem: &Lent, kind: MemKind) -> Result<Registration> {
        mem.require_process("a verbs registration")?;
        if mem.is_empty() {
            return Err(Error::InvalidArgument(
                "registration of 0 bytes; accepted: at least 1 byte".into(),
            ));
        }
        let deferred = self.deferred()?;
        let pins = (0..self.doms.len())
            .map(|d| {
                (!deferred[d])
                    .then(|| self.pin_one(d, mem, kind, None))
                    .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        self.file(pins, mem, kind, None)
    }

    fn deregister(&self, reg: &Registration) -> Result<()> {
        let entry = lock(&self.regs, "verbs registrations")?
            .map
            .remove(&reg.token);
        // Dropped outside the lock: the last reference deregisters the MR; the pins drop before the
        // lent memory (struct fields drop in order).
        entry.map(drop).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "deregistration of token {}, which this connection did not register (or already released)",
                reg.token
            ))
        })
    }
}

impl VerbsFabric {
    /// Creates one RC QP per data path (in INIT) and, with `loopback`, one loopback QP per device
    /// brought up to RTS connected to itself.
    pub fn new(paths: &[VerbsPath], loopback: bool) -> Result<VerbsFabric> {
        if paths.is_empty() {
            return Err(Error::InvalidArgument(
                "a verbs fabric needs at least one path".into(),
            ));
        }
        let mut f = VerbsFabric {
            qps: Vec::new(),
            cqs: Vec::new(),
            ctrl: Vec::new(),
            fb: revive::Failback::empty(),
            loops: Vec::new(),
            pinner: Arc::new(VerbsPinner::new(Vec::new(), Vec::new())),
            doms: Vec::new(),
            path_pd: Vec::new(),
            infos: Vec::new(),
            local: Vec::new(),
            next_token: 1,
            shut: false,
            scratch: Vec::with_capacity(32),
            polls: 0,
            created: std::time::Instant::now(),
            port_grace_ms: AtomicU64::new(millis(port_grace(&QpTuning::default()))),
        };
        let caps = revive::data_caps(INLINE_BYTES);
        let cq_depth = revive::DATA_CQ_DEPTH;
        for p in paths {
            let pd = f.pd_for(&p.domain);
            let ctx = p.domain.context();
            let cq = CompletionQueue::new(ctx, cq_depth)?;
            let qp = match QueuePair::new_rc(f.doms[pd].pd(), &cq, &cq, caps) {
                Ok(q) => q,
                // A device that cannot inline: plain SGE writes only.
                Err(_) => QueuePair::new_rc(
                    f.doms[pd].pd(),
                    &cq,
                    &cq,
                    QpCaps {
                        max_inline_data: 0,
                        ..caps
                    },
                )?,
            };
            qp.to_init(p.port, DATA_QP_ACCESS)?;
            let gid = ctx.query_gid(p.port, p.gid_index)?;
            if gid.is_zero() {
                return Err(Error::System(format!(
                    "{}: GID index {} of {} port {} is empty",
                    p.label,
                    p.gid_index,
                    ctx.name(),
                    p.port
                )));
            }
            f.local.push(LocalEnd {
                qpn: qp.qp_num(),
                psn: random_psn()?,
                gid: gid.0,
                gid_index: p.gid_index,
                mtu: p.active_mtu,
            });
            f.infos.push(PathInfo {
                label: format!("{} qp {:#x}", p.label, qp.qp_num()),
                speed_mbps: p.speed_mbps,
                role: PathRole::Data,
            });
            f.path_pd.push(pd);
            f.qps.push(qp);
            f.cqs.push(cq);
        }
        f.alloc_mailbox()?;
        if loopback {
            // The flush QPs are created at the first GPU registration (`prepare_flush`) or flush
            // (`post_read`): a receive comm without GPU memory never has them. Their paths (and
            // keys) exist from the start.
            for p in paths {
                let pd = f.pd_for(&p.domain);
                if f.loops.iter().any(|l| l.pd == pd) {
                    continue;
                }
                f.infos.push(PathInfo {
                    label: format!("loopback {}", p.label),
                    speed_mbps: 0,
                    role: PathRole::Loopback,
                });
                f.path_pd.push(pd);
                f.loops.push(LoopSpec {
                    pd,
                    port: p.port,
                    gid_index: p.gid_index,
                    active_mtu: p.active_mtu,
                });
            }
        }
        f.pinner = Arc::new(VerbsPinner::new(f.doms.clone(), f.path_pd.clone()));
        Ok(f)
    }

    /// Creates the loopback flush QPs (one per device, connected to itself, up to RTS), once.
    fn ensure_loops(&mut self) -> Result<()> {
        if self.qps.len() == self.infos.len() {
            return Ok(());
        }
        for l in &self.loops[self.qps.len() - self.local.len()..] {
            let dom = &self.doms[l.pd];
            let ctx = dom.context();
            let cq = CompletionQueue::new(ctx, 64)?;
            let lcaps = QpCaps {
                max_send_wr: 64,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            };
            let qp = QueuePair::new_rc(dom.pd(), &cq, &cq, lcaps)?;
            qp.to_init(l.port, FLUSH_QP_ACCESS)?;
            let gid: Gid = ctx.query_gid(l.port, l.gid_index)?;
            let psn = random_psn()?;
            let sgid = u8::try_from(l.gid_index).map_err(|_| {
                Error::InvalidArgument(format!("GID index {} exceeds 255", l.gid_index))
            })?;
            let mut rtr = RtrParams::new(
                qp.qp_num(),
                gid.0,
                sgid,
                path_mtu(l.active_mtu, l.active_mtu),
            );
            rtr.remote_psn = psn;
            qp.to_rtr(&rtr)?;
            qp.to_rts(&RtsParams {
                psn,
                ..RtsParams::default()
            })?;
            tracing::debug!(
                "NET/switchless: {}: flush QP {:#x} created (first GPU registration or flush)",
                ctx.name(),
                qp.qp_num()
            );
            self.qps.push(qp);
            self.cqs.push(cq);
        }
        Ok(())
    }

    /// Whether `path` is a loopback path whose QP is not created yet (nothing to poll there).
    fn loop_pending(&self, path: usize) -> bool {
        path >= self.qps.len() && path < self.infos.len()
    }

    /// Drains the asynchronous events of every device this endpoint uses; a fatal one for the
    /// device or for one of this endpoint's QPs or CQs fails the connection (as NCCL's IB transport
    /// does with its default `NCCL_IB_RETURN_ASYNC_EVENTS=1`).
    fn check_events(&self) -> Result<()> {
        // A path the comm wrote off (it probes it for failback) no longer fails the connection.
        let live = |i: &usize| !self.fb.written_off.get(*i).copied().unwrap_or(false);
        // The paths watched, so that an index into `qpns`/`cqs` maps back to its path.
        let watched: Vec<usize> = (0..self.qps.len().min(self.cqs.len()))
            .filter(live)
            .collect();
        let qpns: Vec<u32> = watched.iter().map(|&i| self.qps[i].qp_num()).collect();
        let cqs: Vec<usize> = watched
            .iter()
            .map(|&i| self.cqs[i].as_ptr() as usize)
            .collect();
        for d in &self.doms {
            let ctx = d.context();
            ctx.drain_events();
            if let Some(e) = ctx.fatal_event(&qpns, &cqs, self.created) {
                // The path the event names, with what its port reported.
                let path = e
                    .scope
                    .path_of(&qpns, &cqs)
                    .and_then(|k| watched.get(k).copied());
                let on = path.map_or_else(String::new, |p| {
                    let note = self
                        .path_note(p)
                        .map_or_else(String::new, |n| format!("; {n}"));
                    format!(" on path {p} ({}){note}", self.infos[p].label)
                });
                return Err(Error::System(format!(
                    "asynchronous event {}{on}: this connection cannot continue",
                    e.describe()
                )));
            }
        }
        // A data path whose port went down and stayed down past the RC retry budget: a sender's
        // work requests would have failed by now; a side with nothing in flight would wait forever.
        let grace = Duration::from_millis(self.port_grace_ms.load(Ordering::Relaxed));
        for (i, info) in self.infos.iter().enumerate() {
            if info.role != PathRole::Data || !live(&i) {
                continue;
            }
            let (ctx, port) = (self.cqs[i].context(), self.qps[i].port());
            let Some(since) = ctx.port_down_since(port) else {
                continue;
            };
            let down_for = since.elapsed();
            if down_for < grace {
                continue;
            }
            // Another usable data path whose port is up: the comm fails over from this one when
            // it asks about each path (`path_health`); only a connection left with no path fails.
            let other_up = (0..self.qps.len()).any(|j| {
                j != i
                    && live(&j)
                    && self.infos[j].role == PathRole::Data
                    && self.cqs[j]
                        .context()
                        .port_down_since(self.qps[j].port())
                        .is_none()
            });
            if other_up {
                continue;
            }
            if let Ok(p) = ctx.query_port(port) {
                if p.state != PortState::Active {
                    return Err(Error::System(format!(
                        "path {i} ({}): {} port {port} has been down for {:.1} s (IBV_EVENT_PORT_ERR, \
                         now {}), longer than the RC retry budget of {:.1} s (NCCL_IB_TIMEOUT, \
                         NCCL_IB_RETRY_CNT): the cable or the peer's port is gone; this connection \
                         cannot continue",
                        info.label,
                        ctx.name(),
                        down_for.as_secs_f64(),
                        p.state.name(),
                        grace.as_secs_f64()
                    )));
                }
            }
        }
        Ok(())
    }

    fn pd_for(&mut self, domain: &Arc<Domain>) -> usize {
        if let Some(i) = self.doms.iter().position(|d| Arc::ptr_eq(d, domain)) {
            return i;
        }
        self.doms.push(Arc::clone(domain));
        self.doms.len() - 1
    }

    /// This endpoint's data paths as the peer needs them (QPN, PSN, GID, MTU), in path order.
    pub fn local_ends(&self) -> &[LocalEnd] {
        &self.local
    }

    /// Moves every data QP to RTR towards `peer[i]` (path MTU = min of the two active MTUs), then to
    /// RTS, with the configured timeout, retries, traffic class and SL. `secret` (the connection's,
    /// from the handshake) keys the reconnect messages of failback.
    pub fn connect(
        &self,
        peer: &[RemoteEnd],
        tuning: &QpTuning,
        secret: &crate::transport::handshake::auth::ConnSecret,
    ) -> Result<()> {
        if peer.len() != self.local.len() {
            return Err(Error::Remote(format!(
                "the peer sent parameters for {} paths; this connection has {}",
                peer.len(),
                self.local.len()
            )));
        }
        self.port_grace_ms
            .store(millis(port_grace(tuning)), Ordering::Relaxed);
        for (i, (me, them)) in self.local.iter().zip(peer).enumerate() {
            let qp = &self.qps[i];
            let sgid = u8::try_from(me.gid_index).map_err(|_| {
                Error::InvalidArgument(format!("GID index {} exceeds 255", me.gid_index))
            })?;
            let mut rtr = RtrParams::new(them.qpn, them.gid, sgid, path_mtu(me.mtu, them.mtu));
            rtr.remote_psn = them.psn;
            rtr.traffic_class = tuning.traffic_class;
            rtr.sl = tuning.sl;
            qp.to_rtr(&rtr)
                .map_err(|e| context(e, &format!("path {i} ({})", self.infos[i].label)))?;
            qp.to_rts(&RtsParams {
                psn: me.psn,
                timeout: tuning.timeout,
                retry_cnt: tuning.retry_cnt,
                ..RtsParams::default()
            })
            .map_err(|e| context(e, &format!("path {i} ({})", self.infos[i].label)))?;
        }
        self.remember_peer(peer, tuning, secret);
        Ok(())
    }

    /// The negotiated path MTU of data path `i` with a peer whose active MTU is `peer_mtu` bytes.
    pub fn path_mtu_bytes(&self, i: usize, peer_mtu: u32) -> u32 {
        self.local
            .get(i)
            .map_or(0, |l| path_mtu(l.mtu, peer_mtu).bytes())
    }

    fn check_path(&self, path: usize) -> Result<()> {
        if path < self.qps.len() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "path {path} does not exist; this connection has {} paths",
                self.qps.len()
            )))
        }
    }

    fn keys(&self, mrs: &[MemoryRegion]) -> Vec<PathKeys> {
        self.path_pd
            .iter()
            .map(|&pd| PathKeys {
                lkey: mrs[pd].lkey(),
                rkey: mrs[pd].rkey(),
            })
            .collect()
    }

    fn word(&self, addr: u64) -> Result<&AtomicU64> {
        for b in &self.ctrl {
            let base = b.base();
            let end = base + 8 * b.words.len() as u64;
            if addr >= base && addr < end {
                if (addr - base) % 8 != 0 {
                    break;
                }
                return Ok(&b.words[((addr - base) / 8) as usize]);
            }
        }
        Err(Error::Internal(format!(
            "control word {addr:#x} is not an aligned word of this connection's control memory"
        )))
    }
}

fn context(e: Error, what: &str) -> Error {
    match e {
        Error::System(m) => Error::System(format!("{what}: {m}")),
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{what}: {m}")),
        Error::Remote(m) => Error::Remote(format!("{what}: {m}")),
        other => other,
    }
}

/// What `from_device_barrier` is in this build, for people (`switchless doctor`).
#[cfg(target_arch = "aarch64")]
pub const FROM_DEVICE_BARRIER: &str =
    "Acquire load + dmb oshld (rdma-core's udma_from_device_barrier)";
/// What `from_device_barrier` is in this build, for people (`switchless doctor`).
#[cfg(not(target_arch = "aarch64"))]
pub const FROM_DEVICE_BARRIER: &str = "Acquire load + compiler fence (x86-64 keeps loads in order)";

/// rdma-core's `udma_from_device_barrier`: orders a load of memory a device wrote (DMA) before the
/// loads that follow it. The `Acquire` of an atomic load orders CPU against CPU only; on AArch64 a
/// device's writes need the outer-shareable load barrier too.
#[inline(always)]
fn from_device_barrier() {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dmb oshld` (data memory barrier, outer shareable, loads) touches no register or memory;
    // it only orders loads, as rdma-core's udma_from_device_barrier does on aarch64.
    unsafe {
        std::arch::asm!("dmb oshld", options(nostack, preserves_flags));
    }
    // x86-64 keeps loads in order (TSO, DMA is cache-coherent): the Acquire load is enough.
    #[cfg(not(target_arch = "aarch64"))]
    std::sync::atomic::compiler_fence(Ordering::Acquire);
}

fn load_order(o: Ordering) -> Ordering {
    match o {
        Ordering::Release | Ordering::AcqRel => Ordering::Acquire,
        other => other,
    }
}

fn store_order(o: Ordering) -> Ordering {
    match o {
        Ordering::Acquire | Ordering::AcqRel => Ordering::Release,
        other => other,
    }
}

impl Fabric for VerbsFabric {
    fn paths(&self) -> &[PathInfo] {
        &self.infos
    }

    fn register(&mut self, mem: &Lent, kind: MemKind) -> Result<Registration> {
        self.pinner.register(mem, kind)
    }

    fn register_dmabuf(
        &mut self,
        mem: &Lent,
        offset: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<Registration> {
        self.pinner.register_dmabuf(mem, offset, fd)
    }

    fn deregister(&mut self, reg: &Registration) -> Result<()> {
        self.pinner.deregister(reg)
    }

    fn pinner(&self) -> Option<Arc<dyn Pinner>> {
        Some(Arc::clone(&self.pinner) as Arc<dyn Pinner>)
    }

    fn defer_paths(&mut self, paths: &[usize]) {
        if let Err(e) = self.pinner.defer(paths) {
            tracing::debug!("NET/switchless: deferring standby registrations: {e}");
        }
    }

    fn activate_path(&mut self, path: usize) -> Result<()> {
        self.pinner.activate(path)
    }

    fn keys_on(&self, reg: &Registration, path: usize) -> Option<PathKeys> {
        self.pinner.keys_on(reg, path)
    }

    fn alloc_ctrl(&mut self, words: usize) -> Result<CtrlMem> {
        if words == 0 {
            return Err(Error::InvalidArgument("control memory of 0 words".into()));
        }
        let block: Box<[AtomicU64]> = (0..words).map(|_| AtomicU64::new(0)).collect();
        let ptr = block.as_ptr() as *mut u8;
        let mut mrs = Vec::with_capacity(self.doms.len());
        for d in &self.doms {
            let pd = d.pd();
            // SAFETY: the words live in the CtrlBlock that owns these MRs and are freed only after them
            // (field order); the NIC writes them through the atomics' UnsafeCell storage, and the CPU
            // reads them only with atomic loads. No RELAXED_ORDERING: writes land in order per path.
            mrs.push(unsafe { MemoryRegion::register(pd, ptr, words * 8, Access::RDMA) }?);
        }
        let keys = self.keys(&mrs);
        let token = self.next_token;
        self.next_token += 1;
        let addr = ptr as u64;
        self.ctrl.push(CtrlBlock {
            mrs,
            words: block,
            token,
        });
        Ok(CtrlMem {
            addr,
            words,
            reg: Registration::new(keys, token),
        })
    }

    fn free_ctrl(&mut self, mem: &CtrlMem) -> Result<()> {
        let i = self
            .ctrl
            .iter()
            .position(|b| b.token == mem.reg.token)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "control memory at {:#x} is not allocated by this connection",
                    mem.addr
                ))
            })?;
        let b = self.ctrl.swap_remove(i);
        drop(b.mrs);
        drop(b.words);
        Ok(())
    }

    fn ctrl_load(&self, addr: u64, order: Ordering) -> Result<u64> {
        let order = load_order(order);
        let v = self.word(addr)?.load(order);
        if order != Ordering::Relaxed {
            // The word may have been written by the NIC (the peer's RDMA write): the CPU must not
            // read the bytes it publishes before this load.
            from_device_barrier();
        }
        Ok(v)
    }

    fn ctrl_store(&self, addr: u64, value: u64, order: Ordering) -> Result<()> {
        self.word(addr)?.store(value, store_order(order));
        Ok(())
    }

    fn post_write(&mut self, path: usize, wr: &WriteWr) -> Result<()> {
        self.post_writes(path, std::slice::from_ref(wr))
    }

    fn post_writes(&mut self, path: usize, wrs: &[WriteWr]) -> Result<()> {
        self.check_path(path)?;
        let qp = &self.qps[path];
        let max_inline = qp.caps().max_inline_data;
        let mut reqs = [WriteReq {
            wr_id: 0,
            local: None,
            remote: RemoteAddr { addr: 0, rkey: 0 },
            imm: None,
            flags: SendFlags::UNSIGNALED,
            inline: false,
        }; CHAIN_MAX];
        for chunk in wrs.chunks(CHAIN_MAX) {
            for (r, wr) in reqs.iter_mut().zip(chunk) {
                *r = to_req(wr, max_inline);
            }
            qp.post_rdma_writes(&reqs[..chunk.len()])?;
        }
        Ok(())
    }

    /// The protection domain's index: one per RDMA device of the connection.
    fn path_device(&self, path: usize) -> usize {
        self.path_pd.get(path).copied().unwrap_or(0)
    }

    fn prepare_flush(&mut self) -> Result<()> {
        self.ensure_loops()
    }

    fn post_read(&mut self, path: usize, wr: &ReadWr) -> Result<()> {
        if self.loop_pending(path) {
            self.ensure_loops()?;
        }
        self.check_path(path)?;
        self.qps[path].post_rdma_read(
            wr.wr_id,
            &[Sge {
                addr: wr.local.addr,
                length: wr.local.len,
                lkey: wr.local.lkey,
            }],
            RemoteAddr {
                addr: wr.remote.addr,
                rkey: wr.remote.rkey,
            },
            SendFlags::SIGNALED,
        )
    }

    fn post_recv(&mut self, path: usize, wr_id: u64) -> Result<()> {
        self.check_path(path)?;
        self.qps[path].post_recv(wr_id, &[])
    }

    fn poll(&mut self, path: usize, max: usize, out: &mut Vec<Completion>) -> Result<usize> {
        if self.loop_pending(path) {
            return Ok(0);
        }
        self.check_path(path)?;
        self.health()?;
        let mut kept = 0;
        // Completions reaped while making room for a failback mailbox write come first.
        while kept < max {
            match self.fb.stash.get_mut(path).and_then(VecDeque::pop_front) {
                Some(c) => out.push(c),
                None => break,
            }
            kept += 1;
        }
        self.scratch.clear();
        self.cqs[path].poll(&mut self.scratch, max - kept)?;
        for i in 0..self.scratch.len() {
            let c = self.scratch[i];
            // Reconnect-mailbox writes are the fabric's own; a failed one is rewritten next probe.
            if revive::mail_path(c.wr_id).is_some() {
                self.mail_done(path);
                continue;
            }
            out.push(map_completion(&c)?);
            kept += 1;
        }
        Ok(kept)
    }

    fn health(&mut self) -> Result<()> {
        self.polls += 1;
        if self.polls >= EVENT_CHECK_EVERY {
            self.polls = 0;
            self.check_events()?;
            self.answer_mail()?;
        }
        Ok(())
    }

    fn path_note(&self, path: usize) -> Option<String> {
        let (qp, cq) = (self.qps.get(path)?, self.cqs.get(path)?);
        let (ctx, port) = (cq.context(), qp.port());
        // Whatever arrived since the last periodic drain (the port may have gone down just now).
        ctx.drain_events();
        let mut notes: Vec<String> = ctx.port_note(port).into_iter().collect();
        // The port's state now, which does not wait for the event to be delivered.
        match ctx.query_port(port) {
            Ok(p) if p.state != PortState::Active => {
                notes.push(format!(
                    "{} port {port} is {} now",
                    ctx.name(),
                    p.state.name()
                ));
            }
            _ => {}
        }
        (!notes.is_empty()).then(|| notes.join("; "))
    }

    fn path_health(&mut self, path: usize) -> Result<()> {
        self.data_path_health(path)
    }

    fn revive_path(&mut self, path: usize) -> Result<crate::transport::fabric::Revive> {
        self.revive(path)
    }

    /// The queue pair to the error state: it sends nothing more, and nothing more lands through
    /// it (so this also seals it); its work and receives flush. The path is written off: its port
    /// staying down no longer fails the connection.
    fn stop_path(&mut self, path: usize) -> Result<()> {
        self.write_off(path)
    }

    fn seal_path(&mut self, path: usize) -> Result<bool> {
        self.write_off(path)?;
        Ok(true)
    }

    fn shutdown(&mut self) -> Result<()> {
        if self.shut {
            return Ok(());
        }
        self.shut = true;
        let mut first = None;
        for qp in &self.qps {
            if let Err(e) = qp.to_error() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// The verbs form of one write: zero-length writes carry no SGE (`num_sge = 0`); the inline hint is
/// honoured up to the QP's `max_inline_data`.
fn to_req(wr: &WriteWr, max_inline: u32) -> WriteReq {
    let local = (wr.local.len > 0).then_some(Sge {
        addr: wr.local.addr,
        length: wr.local.len,
        lkey: wr.local.lkey,
    });
    WriteReq {
        wr_id: wr.wr_id,
        local,
        remote: RemoteAddr {
            addr: wr.remote.addr,
            rkey: wr.remote.rkey,
        },
        imm: wr.imm,
        flags: SendFlags {
            signaled: wr.signaled,
            fence: false,
        },
        inline: wr.inline && local.is_some() && wr.local.len <= max_inline,
    }
}

/// Maps a verbs completion onto the transport's (same status numbering; opcodes reduced to what the
/// protocol posts; on error the opcode is undefined, as in verbs).
pub fn map_completion(c: &VerbsCompletion) -> Result<Completion> {
    let status = c.status;
    let opcode = match c.opcode {
        VerbsOpcode::RdmaWrite => WcOpcode::RdmaWrite,
        VerbsOpcode::RdmaRead => WcOpcode::RdmaRead,
        VerbsOpcode::RecvRdmaWithImm => WcOpcode::RecvRdmaWithImm,
        _ if !status.is_success() => WcOpcode::RdmaWrite,
        other => {
            return Err(Error::Internal(format!(
                "completion of work request {} on QP {:#x} has opcode {other:?}, which this transport never posts",
                c.wr_id, c.qp_num
            )));
        }
    };
    Ok(Completion {
        wr_id: c.wr_id,
        status,
        opcode,
        byte_len: c.byte_len,
        imm: c.imm_data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::fabric::WcStatus;

    #[test]
    fn port_down_grace_is_the_rc_retry_budget() {
        let t = |timeout, retry_cnt| QpTuning {
            traffic_class: 0,
            sl: 0,
            timeout,
            retry_cnt,
        };
        // NCCL's defaults: 4.096 us * 2^20 = 4.29 s per try, 8 tries.
        let d = t(20, 7).retry_budget();
        assert!((d.as_secs_f64() - 34.36).abs() < 0.01, "{d:?}");
        assert_eq!(port_grace(&t(20, 7)), d);
        // The lab's fault settings (14, 3): 0.27 s, raised to the 1 s floor.
        assert!((t(14, 3).retry_budget().as_secs_f64() - 0.268).abs() < 0.001);
        assert_eq!(port_grace(&t(14, 3)), PORT_DOWN_GRACE_MIN);
        // Out-of-range values saturate rather than overflow.
        assert!(t(255, 255).retry_budget() > Duration::from_secs(1_000_000));
        assert_eq!(
            port_grace(&QpTuning::default()),
            QpTuning::default().retry_budget()
        );
    }

    fn vc(status: u32, opcode: VerbsOpcode, imm: Option<u32>) -> VerbsCompletion {
        VerbsCompletion {
            wr_id: 9,
            status: WcStatus(status),
            opcode,
            byte_len: 4096,
            imm_data: imm,
            qp_num: 0x42,
            vendor_err: 0,
        }
    }

    #[test]
    fn completions_map_one_to_one() {
        let c = map_completion(&vc(0, VerbsOpcode::RecvRdmaWithImm, Some(0xdead_beef))).unwrap();
        assert_eq!(c.opcode, WcOpcode::RecvRdmaWithImm);
        assert_eq!(c.imm, Some(0xdead_beef));
        assert_eq!(c.byte_len, 4096);
        assert!(c.status.is_success());
        let c = map_completion(&vc(0, VerbsOpcode::RdmaRead, None)).unwrap();
        assert_eq!(c.opcode, WcOpcode::RdmaRead);
        let c = map_completion(&vc(12, VerbsOpcode::Other(99), None)).unwrap();
        assert_eq!(c.status, WcStatus::RETRY_EXC_ERR);
        assert!(c.status.is_remote());
        let e = map_completion(&vc(0, VerbsOpcode::Send, None)).unwrap_err();
        assert!(e.to_string().contains("never posts"), "{e}");
    }

    #[test]
    fn writes_map_to_verbs_requests() {
        use crate::transport::fabric::{LocalSeg, RemoteSeg};
        let wr = WriteWr {
            wr_id: 7,
            local: LocalSeg {
                addr: 0x1000,
                len: 48,
                lkey: 3,
            },
            remote: RemoteSeg {
                addr: 0x2000,
                rkey: 4,
            },
            imm: Some(0xabcd),
            signaled: true,
            inline: true,
        };
        let r = to_req(&wr, 64);
        assert!(r.inline && r.flags.signaled);
        assert_eq!(r.local.unwrap().length, 48);
        assert_eq!(
            (r.remote.addr, r.remote.rkey, r.imm),
            (0x2000, 4, Some(0xabcd))
        );
        assert!(!to_req(&wr, 32).inline, "beyond the QP's inline limit");
        assert!(!to_req(&wr, 0).inline, "a QP without inline");
        let empty = WriteWr {
            local: LocalSeg {
                addr: 0,
                len: 0,
                lkey: 0,
            },
            ..wr
        };
        let r = to_req(&empty, 64);
        assert!(r.local.is_none() && !r.inline, "zero-length: no SGE");
    }

    #[test]
    fn path_mtu_is_the_smaller_valid_ib_mtu() {
        assert_eq!(path_mtu(4096, 1024), Mtu::Mtu1024);
        assert_eq!(path_mtu(4096, 4096), Mtu::Mtu4096);
        assert_eq!(path_mtu(4096, 9000), Mtu::Mtu4096);
        assert_eq!(path_mtu(3000, 4096), Mtu::Mtu2048);
        assert_eq!(path_mtu(0, 4096), Mtu::Mtu256);
    }

    #[test]
    fn orderings_never_panic() {
        let w = AtomicU64::new(5);
        for o in [
            Ordering::Relaxed,
            Ordering::Acquire,
            Ordering::Release,
            Ordering::AcqRel,
            Ordering::SeqCst,
        ] {
            w.store(7, store_order(o));
            assert_eq!(w.load(load_order(o)), 7);
        }
    }

    #[test]
    fn tuning_follows_config_precedence() {
        let cfg = crate::config::Config {
            ib_tc: Some(41),
            ib_timeout: 14,
            ib_retry_cnt: 3,
            ..Default::default()
        };
        let t = QpTuning::from_config(&cfg, Some(3));
        assert_eq!(
            (t.traffic_class, t.sl, t.timeout, t.retry_cnt),
            (41, 3, 14, 3)
        );
        let d = QpTuning::default();
        assert_eq!(
            (d.traffic_class, d.sl, d.timeout, d.retry_cnt),
            (0, 0, 20, 7)
        );
    }
}
