//! The path abstraction: the handful of verbs-level operations the data protocol needs.
//!
//! A [`Fabric`] is **one endpoint of one connection**: an ordered list of paths (numbered from 0),
//! each an RC-like queue pair with its own completion queue, plus CPU access to a few words of
//! *control memory* that the remote side writes into. Three implementations exist:
//!
//! * [`super::memfab`]: an in-process fabric for tests and benchmarks (deterministic, with faults);
//! * ibverbs RC QPs (the adapter over `crate::verbs`): one QP + CQ per path, control memory is a
//!   `Box<[AtomicU64]>` registered with strict ordering (no `IBV_ACCESS_RELAXED_ORDERING`);
//! * a TCP emulation: each path a stream carrying `{remote addr, rkey, len, imm}` headers plus payload,
//!   served by a process-wide pool of I/O worker threads that place the payload and generate
//!   completions.
//!
//! # Contract an implementation must keep (the same guarantees RC queue pairs give)
//!
//! * Work requests posted on one path execute **in order**: when the peer sees the completion of a
//!   write-with-immediate posted on path `p`, every write posted earlier on `p` is visible in its
//!   memory. Writes on *different* paths are not ordered with respect to each other.
//! * A signaled work request produces exactly one completion on the posting side's CQ of that path. An
//!   unsignaled one produces none on success; a work request that fails always produces a completion
//!   with an error status, and the path then fails every later work request with
//!   [`WcStatus::WR_FLUSH_ERR`].
//! * A signaled completion of work request `k` on a path implies that every earlier work request on that
//!   path has completed (so the protocol signals only the last one of a batch).
//! * A write with an immediate consumes one receive posted with [`Fabric::post_recv`] on the same path
//!   at the peer and completes it with [`WcOpcode::RecvRdmaWithImm`], `imm`, and `byte_len` = the
//!   write's length. Without a posted receive the write fails (`RNR_RETRY_EXC_ERR`).
//! * Control memory words written by the peer (by RDMA write) are read by the CPU with
//!   [`Fabric::ctrl_load`]; the protocol asks for `Acquire` on every word whose value publishes other
//!   words (AArch64: the NIC's writes are not ordered for a plain load).
//! * Loopback paths ([`PathRole::Loopback`]) connect an endpoint to itself and exist only to flush
//!   GPU-direct writes with an RDMA read. A fabric without loopback paths declares that data is visible
//!   to the consumer once the completion is seen (`iflush` then never posts anything).
//!
//! # Checklist for the verbs adapter
//!
//! * One RC QP per path; data path `i` connected to the peer's data path `i` (the handshake orders
//!   them); one loopback QP per device for the flush (connected to itself).
//! * Queue sizes: `max_send_wr` ≥ [`SEND_QUEUE_DEPTH`], `max_recv_wr` ≥
//!   [`RECV_DEPTH`], CQ ≥ both together; `max_inline_data` as the device allows
//!   (honour [`WriteWr::inline`] only up to it).
//! * `register`: `IBV_ACCESS_LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ` on every path's PD (paths on
//!   one device may share the MR and keys). Control memory: a `Box<[AtomicU64]>` registered the same
//!   way **without** `IBV_ACCESS_RELAXED_ORDERING`, so a write's bytes land in order per path.
//! * `post_write`: `num_sge = 0` when `len == 0`; `imm_data = htonl(imm)`; flags `SIGNALED` and
//!   `INLINE` as asked. `poll`: map `ibv_wc.status` to [`WcStatus`] as is, `IBV_WC_RECV_RDMA_WITH_IMM`
//!   to [`WcOpcode::RecvRdmaWithImm`] with `imm = ntohl(imm_data)`.
//! * `shutdown`: move every QP to `IBV_QPS_ERR`; dropping the fabric then destroys QPs, CQs, MRs, PD.
#![forbid(unsafe_code)]

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::sys::rawmem::Lent;
use crate::transport::wire::{FIFO_DEPTH, MAX_RECVS, MAX_REQUESTS, MAX_SEND_REQUESTS};

/// Receives kept posted per data path on the receiving side (one per buffer that can be in flight).
pub const RECV_DEPTH: usize = MAX_REQUESTS * MAX_RECVS;
/// Send-queue depth a data path needs on the sending side for messages ≤ 1 GiB per path: a data write
/// and a record write per send request, plus the CTS writes of the reverse direction.
pub const SEND_QUEUE_DEPTH: usize = 2 * MAX_SEND_REQUESTS + 2 * FIFO_DEPTH;

/// What a path is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathRole {
    /// Carries data to the peer (an RC QP connected to the peer's path with the same index).
    Data,
    /// Connected to this endpoint itself; used only for the flush read of GPU-direct receives.
    Loopback,
}

/// Static description of one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathInfo {
    /// Human-readable label for logs: netdevs, GIDs, QP numbers (given by whoever built the path).
    pub label: String,
    /// Link speed in Mb/s (megabits per second); the stripe weight. 0 means unknown (weight 1).
    pub speed_mbps: u64,
    /// Data or loopback.
    pub role: PathRole,
}

/// Type of registered memory (NCCL's `NCCL_PTR_HOST` / `NCCL_PTR_CUDA`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemKind {
    /// Host memory.
    Host,
    /// GPU memory (GPU-direct RDMA): received data may need a flush read before the GPU consumes it.
    Cuda,
}

/// Local and remote keys of one registration on one path's device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathKeys {
    /// Key for local scatter/gather entries (`ibv_mr.lkey`).
    pub lkey: u32,
    /// Key the peer uses to write or read this memory (`ibv_mr.rkey`).
    pub rkey: u32,
}

/// A memory registration: keys per path (index = path index, loopback paths included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// Keys per path, `keys.len() == fabric.paths().len()`.
    pub keys: Vec<PathKeys>,
    /// Opaque value the fabric uses to find the registration again in [`Fabric::deregister`].
    pub token: u64,
    /// Paths (bit = path index) whose entry in `keys` is a placeholder: their device was deferred
    /// ([`Fabric::defer_paths`]) when this was registered. [`Fabric::keys_on`] gives their keys
    /// once [`Fabric::activate_path`] registered it there.
    pub missing: u32,
}

impl Registration {
    /// A registration with keys on every path.
    pub fn new(keys: Vec<PathKeys>, token: u64) -> Registration {
        Registration {
            keys,
            token,
            missing: 0,
        }
    }

    /// Whether `keys[path]` is valid.
    pub fn has(&self, path: usize) -> bool {
        path < 32 && self.missing & (1 << path) == 0 && path < self.keys.len()
    }
}

/// A block of control memory owned by the fabric: `words` 64-bit words at `addr` (8-byte aligned),
/// registered on every path for local and remote read/write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtrlMem {
    /// Address of word 0.
    pub addr: u64,
    /// Number of 64-bit words.
    pub words: usize,
    /// The registration (keys per path).
    pub reg: Registration,
}

impl CtrlMem {
    /// Address of word `i`.
    pub fn word(&self, i: usize) -> u64 {
        self.addr + 8 * i as u64
    }
}

/// A local scatter/gather element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalSeg {
    /// Local address.
    pub addr: u64,
    /// Length in bytes (0 allowed: a zero-length write with immediate).
    pub len: u32,
    /// Local key of the registration covering `[addr, addr+len)` on the posting path.
    pub lkey: u32,
}

/// A remote target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteSeg {
    /// Remote address.
    pub addr: u64,
    /// Remote key valid on the posting path.
    pub rkey: u32,
}

/// An RDMA write (`IBV_WR_RDMA_WRITE` or `IBV_WR_RDMA_WRITE_WITH_IMM`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Source.
    pub local: LocalSeg,
    /// Destination.
    pub remote: RemoteSeg,
    /// 32-bit immediate (host order here; the verbs adapter converts to network order and back).
    pub imm: Option<u32>,
    /// Produce a completion on success (`IBV_SEND_SIGNALED`).
    pub signaled: bool,
    /// Hint: the payload is small enough to copy into the work request (`IBV_SEND_INLINE`). A fabric
    /// honours it only up to its own limit (the QP's `max_inline_data`) and may ignore it; the
    /// protocol never reuses a source before the work request has completed either way.
    pub inline: bool,
}

/// An RDMA read (`IBV_WR_RDMA_READ`), always signaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Destination (local).
    pub local: LocalSeg,
    /// Source (remote, or this endpoint's memory on a loopback path).
    pub remote: RemoteSeg,
}

/// Completion status; the numbering is `enum ibv_wc_status` so the verbs adapter maps it 1:1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WcStatus(pub u32);

impl WcStatus {
    /// `IBV_WC_SUCCESS`.
    pub const SUCCESS: WcStatus = WcStatus(0);
    /// `IBV_WC_LOC_LEN_ERR`.
    pub const LOC_LEN_ERR: WcStatus = WcStatus(1);
    /// `IBV_WC_LOC_QP_OP_ERR`.
    pub const LOC_QP_OP_ERR: WcStatus = WcStatus(2);
    /// `IBV_WC_LOC_PROT_ERR`.
    pub const LOC_PROT_ERR: WcStatus = WcStatus(4);
    /// `IBV_WC_WR_FLUSH_ERR`.
    pub const WR_FLUSH_ERR: WcStatus = WcStatus(5);
    /// `IBV_WC_REM_INV_REQ_ERR`.
    pub const REM_INV_REQ_ERR: WcStatus = WcStatus(9);
    /// `IBV_WC_REM_ACCESS_ERR`.
    pub const REM_ACCESS_ERR: WcStatus = WcStatus(10);
    /// `IBV_WC_REM_OP_ERR`.
    pub const REM_OP_ERR: WcStatus = WcStatus(11);
    /// `IBV_WC_RETRY_EXC_ERR` (the peer does not answer: transport retries exhausted).
    pub const RETRY_EXC_ERR: WcStatus = WcStatus(12);
    /// `IBV_WC_RNR_RETRY_EXC_ERR` (no receive posted at the peer).
    pub const RNR_RETRY_EXC_ERR: WcStatus = WcStatus(13);
    /// `IBV_WC_GENERAL_ERR`.
    pub const GENERAL_ERR: WcStatus = WcStatus(21);

    /// Whether this is success.
    pub fn is_success(self) -> bool {
        self.0 == 0
    }

    /// Whether the status blames the remote side or the link to it (then NCCL gets `ncclRemoteError`;
    /// otherwise `ncclSystemError`).
    pub fn is_remote(self) -> bool {
        matches!(self.0, 9..=13 | 17)
    }

    /// Whether the status blames the work request itself (a bad key, length or range) rather than
    /// the path: sending it again elsewhere would fail the same way, so its request fails even when
    /// the comm fails over (the path is dead all the same: its queue pair is in the error state).
    pub fn blames_request(self) -> bool {
        matches!(self.0, 1 | 4 | 6 | 8 | 9 | 10)
    }

    /// The text `ibv_wc_status_str` gives for this status.
    pub fn text(self) -> &'static str {
        match self.0 {
            0 => "success",
            1 => "local length error",
            2 => "local QP operation error",
            3 => "local EE context operation error",
            4 => "local protection error",
            5 => "Work Request Flushed Error",
            6 => "memory management operation error",
            7 => "bad response error",
            8 => "local access error",
            9 => "remote invalid request error",
            10 => "remote access error",
            11 => "remote operation error",
            12 => "transport retry counter exceeded",
            13 => "RNR retry counter exceeded",
            14 => "local RDD violation error",
            15 => "remote invalid RD request",
            16 => "aborted error",
            17 => "invalid EE context number",
            18 => "invalid EE context state",
            19 => "fatal error",
            20 => "response timeout error",
            21 => "general error",
            _ => "unknown",
        }
    }
}

impl std::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (status {})", self.text(), self.0)
    }
}

/// What completed (`enum ibv_wc_opcode`, reduced to what the protocol posts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A posted RDMA write (with or without immediate) completed at the sender.
    RdmaWrite,
    /// A posted RDMA read completed.
    RdmaRead,
    /// A receive was consumed by the peer's write with immediate.
    RecvRdmaWithImm,
}

/// One completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The `wr_id` of the work request (or of the posted receive).
    pub wr_id: u64,
    /// Status; on error the other fields except `wr_id` are undefined (as in verbs).
    pub status: WcStatus,
    /// Opcode.
    pub opcode: WcOpcode,
    /// Bytes written, for [`WcOpcode::RecvRdmaWithImm`].
    pub byte_len: u32,
    /// The immediate, for [`WcOpcode::RecvRdmaWithImm`].
    pub imm: Option<u32>,
}

impl Completion {
    /// A completion that reports no bytes and no immediate: a send-side completion, or any error
    /// (flushed receives included).
    pub fn without_data(wr_id: u64, status: WcStatus, opcode: WcOpcode) -> Completion {
        Completion {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm: None,
        }
    }
}

/// Registers memory for one endpoint without borrowing the endpoint (see [`Fabric::pinner`]): the
/// same keys and tokens as [`Fabric::register`] / [`Fabric::deregister`] of that endpoint.
pub trait Pinner: Send + Sync {
    /// As [`Fabric::register`].
    fn register(&self, mem: &Lent, kind: MemKind) -> Result<Registration>;
    /// As [`Fabric::register_dmabuf`] (NCCL `regMrDmaBuf`, which registers GPU memory on every
    /// device of the connection: milliseconds or more per device for a large buffer, so it runs
    /// outside the connection's lock too). The default refuses, as the fabric's does.
    fn register_dmabuf(&self, mem: &Lent, offset: u64, fd: BorrowedFd<'_>) -> Result<Registration> {
        let _ = (mem, offset, fd);
        Err(Error::InvalidUsage(
            "this transport cannot register DMA-BUF memory; accepted: host or CUDA pointers via regMr".into(),
        ))
    }
    /// As [`Fabric::deregister`].
    fn deregister(&self, reg: &Registration) -> Result<()>;
}

/// One endpoint of a connection: its paths and the memory they address. See the module docs for the
/// ordering contract. All methods are non-blocking.
pub trait Fabric {
    /// The paths, data paths and loopback paths, in index order. Data path `i` is connected to the
    /// peer's data path `i`.
    fn paths(&self) -> &[PathInfo];

    /// Registers the lent range on every path's device; returns keys per path. A fabric that
    /// touches the memory keeps `mem` (a clone) until the registration is released, and refuses a
    /// [`Lent::simulated`] address; a simulated fabric reads `mem`'s address as its own.
    fn register(&mut self, mem: &Lent, kind: MemKind) -> Result<Registration>;

    /// Registers GPU memory exported as a DMA-BUF (`regMrDmaBuf`): `fd` is valid only during the call
    /// (NCCL closes it right after), `offset` is the offset of `mem`'s address in it. The
    /// registration has kind [`MemKind::Cuda`]. The default refuses: a fabric without DMA-BUF
    /// support.
    fn register_dmabuf(
        &mut self,
        mem: &Lent,
        offset: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<Registration> {
        let _ = (mem, offset, fd);
        Err(Error::InvalidUsage(
            "this transport cannot register DMA-BUF memory; accepted: host or CUDA pointers via regMr".into(),
        ))
    }

    /// Releases a registration made by [`Fabric::register`] or [`Fabric::register_dmabuf`].
    fn deregister(&mut self, reg: &Registration) -> Result<()>;

    /// A handle that registers host and GPU memory for this endpoint without borrowing it, so that
    /// `regMr` (NCCL's service thread) pins pages without holding the connection's lock, which the
    /// data path (NCCL's progress thread) needs on every call. `None` (the default): register
    /// through the endpoint.
    fn pinner(&self) -> Option<Arc<dyn Pinner>> {
        None
    }

    /// Registers data memory on the devices of `paths` (data paths standing by for failover) only
    /// once asked ([`Fabric::activate_path`]): until then a registration leaves their keys
    /// missing ([`Registration::missing`]), and a device whose every path is deferred pins
    /// nothing, so `regMr`'s cost and pinned memory do not grow with standby paths. Called
    /// before the first data registration; control memory is registered everywhere as before.
    /// The default registers on every path at once (nothing deferred).
    fn defer_paths(&mut self, paths: &[usize]) {
        let _ = paths;
    }

    /// `path` is about to be used (failover made a standby path carry): registers every live data
    /// registration on its device if it was deferred, and every later one too. Safe against a
    /// registration being made concurrently through the [`Fabric::pinner`]: it comes back with
    /// `path`'s keys, or is registered there by this call. Idempotent.
    fn activate_path(&mut self, path: usize) -> Result<()> {
        let _ = path;
        Ok(())
    }

    /// Keys of `reg` on `path`: from `reg` itself, or, for a path missing there, from the
    /// registration the fabric made at [`Fabric::activate_path`]. `None` while it has none.
    fn keys_on(&self, reg: &Registration, path: usize) -> Option<PathKeys> {
        reg.has(path).then(|| reg.keys[path])
    }

    /// Allocates `words` zeroed 64-bit words of control memory, registered on every path.
    fn alloc_ctrl(&mut self, words: usize) -> Result<CtrlMem>;

    /// Frees control memory from [`Fabric::alloc_ctrl`].
    fn free_ctrl(&mut self, mem: &CtrlMem) -> Result<()>;

    /// Loads one word of control memory (8-byte aligned `addr`) with the given ordering.
    fn ctrl_load(&self, addr: u64, order: Ordering) -> Result<u64>;

    /// Stores one word of control memory (8-byte aligned `addr`) with the given ordering.
    fn ctrl_store(&self, addr: u64, value: u64, order: Ordering) -> Result<()>;

    /// Loads `out.len()` consecutive words from `addr` with relaxed ordering (after an acquire load of
    /// the word that published them). The default calls [`Fabric::ctrl_load`] per word.
    fn ctrl_read(&self, addr: u64, out: &mut [u64]) -> Result<()> {
        for (i, w) in out.iter_mut().enumerate() {
            *w = self.ctrl_load(addr + 8 * i as u64, Ordering::Relaxed)?;
        }
        Ok(())
    }

    /// Stores consecutive words at `addr` with relaxed ordering (published later by a release store or
    /// by posting a work request). The default calls [`Fabric::ctrl_store`] per word.
    fn ctrl_write(&self, addr: u64, words: &[u64]) -> Result<()> {
        for (i, &w) in words.iter().enumerate() {
            self.ctrl_store(addr + 8 * i as u64, w, Ordering::Relaxed)?;
        }
        Ok(())
    }

    /// Posts an RDMA write on `path`.
    fn post_write(&mut self, path: usize, wr: &WriteWr) -> Result<()>;

    /// Posts several RDMA writes on `path`, in order, as one batch (verbs: one chained
    /// `ibv_post_send`, one doorbell). On error some of them may have been posted, as with verbs'
    /// `bad_wr`. The default posts them one by one.
    fn post_writes(&mut self, path: usize, wrs: &[WriteWr]) -> Result<()> {
        for wr in wrs {
            self.post_write(path, wr)?;
        }
        Ok(())
    }

    /// Posts an RDMA read on `path` (a loopback path, for the flush).
    fn post_read(&mut self, path: usize, wr: &ReadWr) -> Result<()>;

    /// Creates what the loopback paths' flush reads need, once (verbs: the loopback QPs). The comm
    /// calls it at the first GPU registration, so the first `iflush` does not pay for it on the data
    /// path; `post_read` still creates it if it is missing. Default: nothing to create.
    fn prepare_flush(&mut self) -> Result<()> {
        Ok(())
    }

    /// The device `path` is on, as an index (verbs: the RDMA device, whose protection domain its
    /// registrations use): a loopback path flushes the writes of the data paths on its device.
    /// Default: every path on device 0.
    fn path_device(&self, _path: usize) -> usize {
        0
    }

    /// Posts a receive (no scatter list) on `path`, consumed by a write with immediate from the peer.
    fn post_recv(&mut self, path: usize, wr_id: u64) -> Result<()>;

    /// Appends up to `max` completions of `path` to `out`; returns how many were appended.
    fn poll(&mut self, path: usize, max: usize, out: &mut Vec<Completion>) -> Result<usize>;

    /// Stops the paths before teardown: every work request still queued completes with
    /// [`WcStatus::WR_FLUSH_ERR`] or is dropped (verbs: QPs to the error state). Idempotent.
    fn shutdown(&mut self) -> Result<()>;

    /// Checks what the paths' devices reported on their own (verbs: asynchronous events; a fatal one,
    /// or a port down past the RC retry budget, is an error). Called while a request waits with no
    /// completion to poll for (a send waiting for a clear-to-send); cheap when called often.
    fn health(&mut self) -> Result<()> {
        Ok(())
    }

    /// What the device last reported about `path`'s port, for error messages (verbs: the newest
    /// asynchronous port event, e.g. "rxe_eth2 port 1: IBV_EVENT_PORT_ERR (the port went down) 0.12 s
    /// ago"). `None` when there is nothing to add.
    fn path_note(&self, _path: usize) -> Option<String> {
        None
    }

    /// Whether `path` is still usable by what its device reported on its own (verbs: no
    /// `IBV_EVENT_PORT_ERR` outstanding; TCP: the stream is up). An error names what went wrong. The
    /// comm asks only while it waits with nothing to poll, to fail over from a path whose device
    /// reported it dead before any completion did. The default: usable.
    fn path_health(&mut self, _path: usize) -> Result<()> {
        Ok(())
    }

    /// The comm marked data path `path` down (failover): this end sends nothing more on it, and
    /// its work requests not yet complete complete with an error status (`WR_FLUSH_ERR`). A
    /// success completion polled after this still means what it always means: the write landed
    /// at the peer (or will, before the peer's end is sealed). A piece whose completion says
    /// neither is settled by asking the peer (see `docs/failover.md`). Verbs: the queue pair to
    /// the error state (which also seals it); TCP: the sending side fails (the streams stay open:
    /// what the peer sent is still applied until [`Fabric::seal_path`]). Idempotent.
    fn stop_path(&mut self, path: usize) -> Result<()>;

    /// Makes sure that nothing the peer sent on data path `path` lands in this endpoint's memory
    /// any more; `true` once so, with the completion of every write with immediate that did land
    /// queued on the path (its posted receives flush after them). The comm calls it only after the
    /// peer has stopped the path ([`Fabric::stop_path`] at the peer), so whatever the peer was
    /// told completed has landed by then. Verbs: the queue pair in the error state; TCP: each
    /// stream read to its end, then aborted. Idempotent; `false`: call again.
    fn seal_path(&mut self, path: usize) -> Result<bool>;

    /// Tries to bring back data path `path` after it failed (failback): called at the comm's probe
    /// times, never on a usable path. [`Revive::Down`] while the port is still down;
    /// [`Revive::Rebuilt`] once this end has a fresh queue pair (the comm then posts its receives on
    /// it, and calls again); [`Revive::Ready`] once both ends are rebuilt, so work posted from now on
    /// runs. After `Rebuilt` the path's completion queue holds only completions of work posted after
    /// it. The default never revives (a fabric that cannot rebuild a path).
    fn revive_path(&mut self, _path: usize) -> Result<Revive> {
        Ok(Revive::Down)
    }
}

/// What [`Fabric::revive_path`] achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Revive {
    /// The port is still down (or the fabric cannot rebuild paths).
    Down,
    /// This end has a fresh queue pair: post receives, then call again.
    Rebuilt,
    /// This end is rebuilt and waits for the peer's end.
    Pending,
    /// Both ends are rebuilt: the path carries work again.
    Ready,
}

/// Writes [`Fabric`] methods that hand each call on: `forward_fabric!(field: paths, register, …)`
/// to `self.field`, `forward_fabric!(deref: …)` to `**self`. For wrappers that change a few
/// methods: they name every method they do not write themselves, so that no call falls through
/// to a trait default instead of reaching the wrapped fabric.
macro_rules! forward_fabric {
    ($to:tt: $($m:ident),+ $(,)?) => {
        $( $crate::transport::fabric::forward_fabric!(@m $to $m); )+
    };
    (@to $s:ident deref) => { (**$s) };
    (@to $s:ident $f:ident) => { $s.$f };
    (@m $to:tt paths) => {
        fn paths(&self) -> &[$crate::transport::fabric::PathInfo] {
            $crate::transport::fabric::forward_fabric!(@to self $to).paths()
        }
    };
    (@m $to:tt register) => {
        fn register(
            &mut self,
            mem: &$crate::sys::rawmem::Lent,
            kind: $crate::transport::fabric::MemKind,
        ) -> $crate::error::Result<$crate::transport::fabric::Registration> {
            $crate::transport::fabric::forward_fabric!(@to self $to).register(mem, kind)
        }
    };
    (@m $to:tt register_dmabuf) => {
        fn register_dmabuf(
            &mut self,
            mem: &$crate::sys::rawmem::Lent,
            offset: u64,
            fd: ::std::os::fd::BorrowedFd<'_>,
        ) -> $crate::error::Result<$crate::transport::fabric::Registration> {
            $crate::transport::fabric::forward_fabric!(@to self $to).register_dmabuf(mem, offset, fd)
        }
    };
    (@m $to:tt deregister) => {
        fn deregister(
            &mut self,
            reg: &$crate::transport::fabric::Registration,
        ) -> $crate::error::Result<()> {
            $crate::transport::fabric::forward_fabric!(@to self $to).deregister(reg)
        }
    };
    (@m $to:tt pinner) => {
        fn pinner(&self) -> Option<::std::sync::Arc<dyn $crate::transport::fabric::Pinner>> {
            $crate::transport::fabric::forward_fabric!(@to self $to).pinner()
        }
    };
    (@m $to:tt defer_paths) => {
        fn defer_paths(&mut self, paths: &[usize]) {
            $crate::transport::fabric::forward_fabric!(@to self $to).defer_paths(paths)
        }
    };
    (@m $to:tt activate_path) => {
        fn activate_path(&mut self, path: usize) -> $crate::error::Result<()> {
            $crate::transport::fabric::forward_fabric!(@to self $to).activate_path(path)
        }
    };
    (@m $to:tt keys_on) => {
        fn keys_on(
            &self,
            reg: &$crate::transport::fabric::Registration,
            path: usize,
        ) -> Option<$crate::transport::fabric::PathKeys> {
            $crate::transport::fabric::forward_fabric!(@to self $to).keys_on(reg, path)
        }
    };
    (@m $to:tt alloc_ctrl) => {
        fn alloc_ctrl(
            &mut self,
            words: usize,
        ) -> $crate::error::Result<$crate::transport::fabric::CtrlMem> {
            $crate::transport::fabric::forward_fabric!(@to self $to).alloc_ctrl(words)
        }
    };
    (@m $to:tt free_ctrl) => {
        fn free_ctrl(
            &mut self,
            mem: &$crate::transport::fabric::CtrlMem,
        ) -> $crate::error::Result<()> {
            $crate::transport::fabric::forward_fabric!(@to self $to).free_ctrl(mem)
        }
    };
    (@m $to:tt ctrl_load) => {
        fn ctrl_load(
            &self,
            addr: u64,
            order: ::std::sync::atomic::Ordering,
        ) -> $crate::error::Result<u64> {
            $crate::transport::fabric::forward_fabric!(@to self $to).ctrl_load(addr, order)
        }
    };
    (@m $to:tt ctrl_store) => {
        fn ctrl_store(
            &self,
            addr: u64,
            value: u64,
            order: ::std::sync::atomic::Ordering,
        ) -> $crate::error::Result<()> {
            $crate::transport::fabric::forward_fabric!(@to self $to).ctrl_store(addr, value, order)
        }
    };
    (@m $to:tt ctrl_read) => {
        fn ctrl_read(&self, addr: u64, out: &mut [u64]) -> $crate::error::Result<()> {
            $crate::transport::fabric::forward_fabric!(@to self $to).ctrl_read(addr, out)
        }
    };
    (@m $to:tt ctrl_write) => {
        fn ctrl_write(&self, addr: u64, words: &[u64]) -> $crate::error::Result<()> {
            $crate::transport::fabric::forward_fabric!(@to self $to).ctrl_write(addr, words)
        }
    };
    (@m $to:tt post_write) => {
        fn post_write(
            &mut self,
            path: usize,
            wr: &$crate::transport::fabric::WriteWr,
        ) -> $crate::error::Result<()> {
            $crate::transport::fabric::forward_fabric!(@to self $to).post_write(path, wr)
        }
    };
    (@m $to:tt post_writes) => {
        fn post_writes(
            &mut self,
            path: usize,
            wrs: &[$crate::transport::fabric::WriteWr],
        ) -> $crate::error::Result<()> {
            $crate::transport::fabric::forward_fabric!(@to self $to).post_writes(path, wrs)
        }
    };
    (@m $to:tt post_read) => {
        fn post_read(
            &mut self,
            path: usize,
            wr: &$crate::transport::fabric::ReadWr,
        ) -> $crate::error::Result<()> {
            $crate::transport::fabric::forward_fabric!(@to self $to).post_read(path, wr)
        }
    };
    (@m $to:tt prepare_flush) => {
        fn prepare_flush(&mut self) -> $crate::error::Result<()> {
            $crate::transport::fabric::forward_fabric!(@to self $to).prepare_flush()
        }
    };
    (@m $to:tt path_device) => {
        fn path_device(&self, path: usize) -> usize {
            $crate::transport::fabric::forward_fabric!(@to self $to).path_device(path)
        }
    };
    (@m $to:tt post_recv) => {
        fn post_recv(&mut self, path: usize, wr_id: u64) -> $crate::error::Result<()> {
            $crate::transport::fabric::forward_fabric!(@to self $to).post_recv(path, wr_id)
        }
    };
    (@m $to:tt poll) => {
        fn poll(
            &mut self,
            path: usize,
            max: usize,
            out: &mut Vec<$crate::transport::fabric::Completion>,
        ) -> $crate::error::Result<usize> {
            $crate::transport::fabric::forward_fabric!(@to self $to).poll(path, max, out)
        }
    };
    (@m $to:tt shutdown) => {
        fn shutdown(&mut self) -> $crate::error::Result<()> {
            $crate::transport::fabric::forward_fabric!(@to self $to).shutdown()
        }
    };
    (@m $to:tt health) => {
        fn health(&mut self) -> $crate::error::Result<()> {
            $crate::transport::fabric::forward_fabric!(@to self $to).health()
        }
    };
    (@m $to:tt path_note) => {
        fn path_note(&self, path: usize) -> Option<String> {
            $crate::transport::fabric::forward_fabric!(@to self $to).path_note(path)
        }
    };
    (@m $to:tt path_health) => {
        fn path_health(&mut self, path: usize) -> $crate::error::Result<()> {
            $crate::transport::fabric::forward_fabric!(@to self $to).path_health(path)
        }
    };
    (@m $to:tt stop_path) => {
        fn stop_path(&mut self, path: usize) -> $crate::error::Result<()> {
            $crate::transport::fabric::forward_fabric!(@to self $to).stop_path(path)
        }
    };
    (@m $to:tt seal_path) => {
        fn seal_path(&mut self, path: usize) -> $crate::error::Result<bool> {
            $crate::transport::fabric::forward_fabric!(@to self $to).seal_path(path)
        }
    };
    (@m $to:tt revive_path) => {
        fn revive_path(
            &mut self,
            path: usize,
        ) -> $crate::error::Result<$crate::transport::fabric::Revive> {
            $crate::transport::fabric::forward_fabric!(@to self $to).revive_path(path)
        }
    };
}
pub(crate) use forward_fabric;

impl<F: Fabric + ?Sized> Fabric for Box<F> {
    forward_fabric!(deref: paths, register, register_dmabuf, deregister, pinner, defer_paths,
        activate_path, keys_on, alloc_ctrl, free_ctrl, ctrl_load, ctrl_store, ctrl_read, ctrl_write,
        post_write, post_writes, post_read, prepare_flush, path_device, post_recv, poll, shutdown,
        health, path_note, path_health, stop_path, seal_path, revive_path);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_classes() {
        assert!(WcStatus::SUCCESS.is_success());
        assert!(WcStatus::RETRY_EXC_ERR.is_remote());
        assert!(WcStatus::REM_ACCESS_ERR.is_remote());
        assert!(!WcStatus::WR_FLUSH_ERR.is_remote());
        assert!(!WcStatus::LOC_PROT_ERR.is_remote());
        assert!(WcStatus::LOC_PROT_ERR.blames_request());
        assert!(WcStatus::REM_ACCESS_ERR.blames_request());
        assert!(!WcStatus::RETRY_EXC_ERR.blames_request());
        assert!(!WcStatus::WR_FLUSH_ERR.blames_request());
        assert_eq!(
            WcStatus::RNR_RETRY_EXC_ERR.text(),
            "RNR retry counter exceeded"
        );
        assert_eq!(WcStatus(99).text(), "unknown");
        assert!(WcStatus::RETRY_EXC_ERR.to_string().contains("status 12"));
    }
}
