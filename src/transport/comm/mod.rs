//! Send and receive comms: the receiver-driven data protocol over any [`Fabric`].
//!
//! See `docs/guide/transport.md` and the [`super`] module docs for the protocol. In short:
//!
//! 1. `irecv` writes a clear-to-send (CTS) entry into the sender's FIFO slot `seq % 32` in one RDMA
//!    write on one path: the word `seq + 1`, a header, the buffers (sizes, tags, rkeys per path)
//!    and a check word. While the sender holds three or more entries unused, a new entry is held
//!    back and goes later with the next ones, consecutive slots in one write.
//! 2. `isend` acquire-loads that word; when the entry is whole it decodes it, matches the tag,
//!    checks the size and writes the data striped over the usable data paths, one piece per path.
//!    Piece 0 ends with the size record written into the receiver's record array with an
//!    immediate; every other piece's last data write carries the immediate. A message of one piece
//!    in one write (small messages) is that write alone, with the immediate: no record, its size is
//!    the write's length. A receive posted first thus costs the sender one write.
//! 3. The receiver marks pieces per buffer in a bitmap (each immediate names its slot, buffer, piece,
//!    piece count and the sequence number); when all arrived it reads the size record (or the
//!    one write's length from its completion).
//!
//! Failover ([`FailoverConfig`], on by default): a data path that fails (an error completion, a
//! failed post, its device reporting it dead) is marked down with one WARN and stopped; its pieces
//! and clear-to-send entries not known landed are parked until the peer, its end of the path
//! sealed, says which it lacks; only those are posted again, on the surviving paths (the fence,
//! `fence.rs`: exactly once, nothing lands in a buffer after its receive completed). The last
//! usable path is never marked down: its error fails the request as before. A down path is probed
//! with [`Fabric::revive_path`] (bounded backoff, then a steady rate) and rejoins with an INFO
//! line. Stripe weights follow each path's measured throughput ([`WeightConfig`]); `paths.rs`
//! has that bookkeeping.
//!
//! The comms read no clock: every call that may start or end a request timeout (`isend`, `irecv`,
//! `iflush`, `test`) takes `now` from the caller, so tests step time instead of sleeping.
//!
//! This file holds what both sides share (`Core`: paths, completions, registration, teardown) and the
//! public types; `send.rs` is the sending side, `recv.rs` the receiving side. The wire layouts are in
//! [`super::wire`], the striping arithmetic in [`super::stripe`].
#![forbid(unsafe_code)]

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::sys::rawmem::Lent;
use crate::transport::fabric::{
    Completion, CtrlMem, Fabric, MemKind, PathRole, Pinner, RECV_DEPTH, Registration, Revive,
    SEND_QUEUE_DEPTH, WcStatus,
};
use crate::transport::metrics::Meter;
use crate::transport::stripe::{MAX_PATHS, StripeParams};
use crate::transport::wire::{self, CtrlInfo, MAX_RECVS};

/// The methods both comm types share: the fabric, and registration (NCCL `regMr`, `regMrDmaBuf`,
/// `deregMr`), all delegated to [`Core`].
macro_rules! registration_methods {
    () => {
        /// The fabric (e.g. for statistics in tests).
        pub fn fabric(&self) -> &F {
            &self.core.fab
        }

        /// The fabric, mutably (e.g. to finish a transport's connection set-up before first use).
        pub fn fabric_mut(&mut self) -> &mut F {
            &mut self.core.fab
        }

        /// Registers lent memory on every path (NCCL `regMr`).
        pub fn reg_mr(
            &mut self,
            mem: &$crate::sys::rawmem::Lent,
            kind: $crate::transport::fabric::MemKind,
        ) -> $crate::error::Result<$crate::transport::comm::MemHandle> {
            self.core.register(mem, kind, None)
        }

        /// Registers GPU memory exported as DMA-BUF (NCCL `regMrDmaBuf`); `fd` need only live for
        /// the call. The handle has kind [`MemKind::Cuda`].
        ///
        /// [`MemKind::Cuda`]: crate::transport::fabric::MemKind::Cuda
        pub fn reg_mr_dmabuf(
            &mut self,
            mem: &$crate::sys::rawmem::Lent,
            offset: u64,
            fd: ::std::os::fd::BorrowedFd<'_>,
        ) -> $crate::error::Result<$crate::transport::comm::MemHandle> {
            self.core.register(
                mem,
                $crate::transport::fabric::MemKind::Cuda,
                Some((offset, fd)),
            )
        }

        /// Which data paths are usable now (failover marks a failed one down until failback).
        pub fn paths_up(&self) -> Vec<bool> {
            (0..self.core.paths.len())
                .map(|k| self.core.paths.is_up(k))
                .collect()
        }

        /// Which data paths take new work now: the carrying paths that are up, and the standby
        /// paths standing in for carrying paths that are down.
        pub fn paths_carrying(&self) -> Vec<bool> {
            (0..self.core.paths.len())
                .map(|k| self.core.paths.carries(k))
                .collect()
        }

        /// Marks data paths standby (the connector's choice; call before [`Self::local_info`],
        /// which tells the peer): they carry nothing new until a carrying path is down. At least
        /// one path stays carrying.
        pub fn set_standby(&mut self, paths: &[usize]) -> $crate::error::Result<()> {
            let n = self.core.paths.len();
            let mut mask = 0u8;
            for &k in paths {
                if k >= n || k >= 8 {
                    return Err($crate::error::Error::InvalidArgument(format!(
                        "standby path {k}: the connection has {n} data paths"
                    )));
                }
                mask |= 1 << k;
            }
            if mask.count_ones() as usize >= n {
                return Err($crate::error::Error::InvalidArgument(format!(
                    "standby paths {paths:?} leave none of the {n} data paths carrying"
                )));
            }
            self.core.apply_standby(mask);
            self.core.meter_carrying();
            Ok(())
        }

        /// What the failover fence settled so far (see `docs/failover.md`, "Exactly once").
        pub fn fence_stats(&self) -> $crate::transport::comm::FenceStats {
            self.core.fence.stats
        }

        /// Each data path's stripe weight now, Mb/s: its measured throughput (adaptive weights)
        /// or its nominal speed.
        pub fn path_weights(&self) -> Vec<u64> {
            (0..self.core.paths.len())
                .map(|k| self.core.paths.estimate(k))
                .collect()
        }

        /// Releases a registration (NCCL `deregMr`).
        pub fn dereg_mr(
            &mut self,
            mh: $crate::transport::comm::MemHandle,
        ) -> $crate::error::Result<()> {
            self.core.deregister(&mh)
        }

        /// The fabric's [`Pinner`](crate::transport::fabric::Pinner), if it registers without
        /// this comm: then `regMr` pins outside the comm's lock and [`Self::adopt`]s the result.
        pub fn pinner(&self) -> Option<::std::sync::Arc<dyn $crate::transport::fabric::Pinner>> {
            self.core.fab.pinner()
        }

        /// Takes a registration made by [`Self::pinner`] for `[addr, addr+len)`: this comm
        /// releases it on close unless [`Self::forget`] is called first.
        pub fn adopt(
            &mut self,
            addr: u64,
            len: u64,
            kind: $crate::transport::fabric::MemKind,
            reg: $crate::transport::fabric::Registration,
        ) -> $crate::error::Result<$crate::transport::comm::MemHandle> {
            self.core.adopt(addr, len, kind, reg)
        }

        /// Forgets a registration without releasing it (the caller unpins it through the
        /// [`Self::pinner`]); whether this comm held it.
        pub fn forget(&mut self, mh: &$crate::transport::comm::MemHandle) -> bool {
            let held = self.core.regs.remove(&mh.reg.token).is_some();
            if held {
                self.core.meter.registration(mh.len, false);
            }
            held
        }

        /// A reader of this comm's counters (`transport::metrics`), for the exporter.
        pub fn metrics(&self) -> $crate::transport::metrics::MeterView {
            self.core.meter.view()
        }

        /// Counts a request of this comm that failed (the caller saw its error).
        pub fn note_request_error(&mut self) {
            self.core.meter.request_error();
        }
    };
}

/// Implements [`Registrar`] for a comm type through its inherent methods.
macro_rules! impl_registrar {
    ($comm:ident) => {
        impl<F: $crate::transport::fabric::Fabric> $crate::transport::comm::Registrar for $comm<F> {
            fn reg_mr(
                &mut self,
                mem: &$crate::sys::rawmem::Lent,
                kind: $crate::transport::fabric::MemKind,
            ) -> $crate::error::Result<$crate::transport::comm::MemHandle> {
                $comm::reg_mr(self, mem, kind)
            }
            fn reg_mr_dmabuf(
                &mut self,
                mem: &$crate::sys::rawmem::Lent,
                offset: u64,
                fd: ::std::os::fd::BorrowedFd<'_>,
            ) -> $crate::error::Result<$crate::transport::comm::MemHandle> {
                $comm::reg_mr_dmabuf(self, mem, offset, fd)
            }
            fn dereg_mr(
                &mut self,
                mh: $crate::transport::comm::MemHandle,
            ) -> $crate::error::Result<()> {
                $comm::dereg_mr(self, mh)
            }
            fn pinner(&self) -> Option<::std::sync::Arc<dyn $crate::transport::fabric::Pinner>> {
                $comm::pinner(self)
            }
            fn adopt(
                &mut self,
                addr: u64,
                len: u64,
                kind: $crate::transport::fabric::MemKind,
                reg: $crate::transport::fabric::Registration,
            ) -> $crate::error::Result<$crate::transport::comm::MemHandle> {
                $comm::adopt(self, addr, len, kind, reg)
            }
            fn forget(&mut self, mh: &$crate::transport::comm::MemHandle) -> bool {
                $comm::forget(self, mh)
            }
        }
    };
}

// Declared after the macros above, which both files use.
mod fence;
mod paths;
mod recv;
mod send;

pub use fence::FenceStats;
pub use paths::{FailoverConfig, WeightConfig};
pub use recv::{CtsStats, RecvComm};
pub use send::SendComm;

/// Largest single RDMA write the protocol posts (1 GiB; IB allows up to 2 GiB).
pub const MAX_WR_BYTES: u64 = 1 << 30;
/// Largest message (the size record's 48 bits).
pub const MAX_MESSAGE_BYTES: u64 = wire::RECORD_SIZE_MASK;
const POLL_BATCH: usize = 16;
/// How often a comm whose polls keep finding completions still asks about each path's health.
const PATH_CHECK_BUSY: Duration = Duration::from_millis(10);
/// How often a comm whose polls find nothing asks about the devices' and paths' health (verbs:
/// each ask read the async event fd, a system call per idle poll of NCCL's progress loop).
const PATH_CHECK_IDLE: Duration = Duration::from_millis(1);

/// Protocol knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtocolConfig {
    /// Writes of at most this many bytes are marked [`WriteWr::inline`] (size records, CTS entries,
    /// tiny messages). Default 64 bytes; 0 disables the hint.
    ///
    /// [`WriteWr::inline`]: crate::transport::fabric::WriteWr::inline
    pub inline_max: u32,
    /// Striping (minimum chunk, alignment).
    pub stripe: StripeParams,
    /// A request still pending after this long fails in `test` with [`Error::Timeout`], and an `isend`
    /// that has found no clear-to-send for this long fails likewise. `None` waits forever (NCCL's own
    /// behaviour: a slow peer is not an error).
    pub request_timeout: Option<Duration>,
    /// Failover to the surviving paths and failback (on by default).
    pub failover: FailoverConfig,
    /// Stripe weights: measured throughput (default) or nominal link speed.
    pub weights: WeightConfig,
}

impl Default for ProtocolConfig {
    fn default() -> Self {
        ProtocolConfig {
            inline_max: 64,
            stripe: StripeParams::default(),
            request_timeout: None,
            failover: FailoverConfig::default(),
            weights: WeightConfig::default(),
        }
    }
}

/// A registered buffer (NCCL's `mhandle`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemHandle {
    addr: u64,
    len: u64,
    kind: MemKind,
    reg: Registration,
}

impl MemHandle {
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the registration is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Host or GPU memory.
    pub fn kind(&self) -> MemKind {
        self.kind
    }
    /// Keys per path.
    pub fn registration(&self) -> &Registration {
        &self.reg
    }

    fn check_covers(&self, addr: u64, len: u64, what: &str) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let ok = crate::transport::ctrl::Span::new(self.addr, self.len).contains(addr, len);
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{what} buffer {addr:#x}+{len} bytes is outside its memory registration {:#x}+{} bytes",
                self.addr, self.len
            )))
        }
    }
}

/// A request handle. [`Request::to_raw`] is never 0 nor 1 (`NCCL_NET_OPTIONAL_RECV_COMPLETION`), so the
/// FFI layer may store it in NCCL's `void** request` directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Request(u64);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReqKind {
    Send = 1,
    Recv = 2,
    Flush = 3,
}

impl Request {
    fn new(kind: ReqKind, index: usize, generation: u32) -> Request {
        Request((u64::from(generation) << 32) | ((kind as u64) << 16) | index as u64)
    }
    fn parts(self) -> (u64, usize, u32) {
        (
            (self.0 >> 16) & 0xffff,
            (self.0 & 0xffff) as usize,
            (self.0 >> 32) as u32,
        )
    }
    /// The value to hand to NCCL (≥ 2^32).
    pub fn to_raw(self) -> u64 {
        self.0
    }
    /// Rebuilds a request from [`Request::to_raw`]; the comm checks it in `test`.
    pub fn from_raw(raw: u64) -> Request {
        Request(raw)
    }
}

/// Sizes received by a grouped receive, one per buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sizes {
    n: usize,
    sizes: [u64; MAX_RECVS],
}

impl Sizes {
    /// The sizes, in buffer order (empty for a flush).
    pub fn as_slice(&self) -> &[u64] {
        &self.sizes[..self.n]
    }
}

/// One buffer of a grouped receive.
#[derive(Debug, Clone, Copy)]
pub struct RecvBuf<'a> {
    /// Address.
    pub addr: u64,
    /// Size in bytes (the largest message it accepts).
    pub size: u64,
    /// Tag (NCCL: the sender's rank).
    pub tag: u32,
    /// Registration covering the buffer.
    pub mh: &'a MemHandle,
}

/// One buffer named in a flush.
#[derive(Debug, Clone, Copy)]
pub struct FlushBuf<'a> {
    /// Address.
    pub addr: u64,
    /// Bytes received into it.
    pub size: u64,
    /// Registration covering the buffer.
    pub mh: &'a MemHandle,
}

fn next_generation(g: u32) -> u32 {
    match g.wrapping_add(1) {
        0 => 1,
        x => x,
    }
}

/// State shared by both comm types: the fabric, path tables, completion buffer, warnings.
struct Core<F: Fabric> {
    fab: F,
    cfg: ProtocolConfig,
    /// Fabric indices of the data paths, in data-path order.
    data: Vec<usize>,
    /// Fabric indices of the loopback paths.
    loops: Vec<usize>,
    /// Data-path index of each fabric path (`None` for loopback paths).
    data_of: Vec<Option<usize>>,
    /// Up or down, probing, measured weights, per data path.
    paths: paths::PathSet,
    /// Data paths marked down whose work the comm has not moved yet.
    newly_down: Vec<usize>,
    labels: Vec<String>,
    /// When [`Core::check_paths`] is next due: [`PATH_CHECK_IDLE`] and [`PATH_CHECK_BUSY`] after it
    /// last ran (`None`: due now). Deadlines, so that the call that is not due (nearly every one:
    /// NCCL's progress thread polls in a tight loop) compares two instants and subtracts none.
    paths_due: Option<CheckDue>,
    warned: Vec<bool>,
    cqe: Vec<Completion>,
    ctrl: Vec<CtrlMem>,
    /// Registrations NCCL has not released yet (by token): `close` releases them, so a comm closed
    /// with registrations still live leaks nothing.
    regs: std::collections::HashMap<u64, Registration>,
    closed: bool,
    /// Settles what failed paths had in flight (`fence.rs`).
    fence: fence::Fence,
    /// Bytes, pieces, failovers per data path (`transport::metrics`).
    meter: Meter,
    /// Register on standby paths' devices only at their first use ([`Fabric::defer_paths`]):
    /// both sides (the receiving side hands the keys it makes then to the sender in key updates,
    /// `recv.rs`).
    lazy: bool,
    /// Data paths deferred and not activated yet (bit per data path).
    deferred: u8,
    /// Some deferred path was activated since the comm last looked ([`Core::take_activated`]).
    activated: bool,
}

/// Registration as NCCL sees it (`regMr`, `regMrDmaBuf`, `deregMr`), the same on both comm types, so
/// callers holding either can register through one `&mut dyn Registrar`.
pub trait Registrar {
    /// Registers lent memory on every path (NCCL `regMr`).
    fn reg_mr(&mut self, mem: &Lent, kind: MemKind) -> Result<MemHandle>;
    /// Registers GPU memory exported as DMA-BUF (NCCL `regMrDmaBuf`).
    fn reg_mr_dmabuf(&mut self, mem: &Lent, offset: u64, fd: BorrowedFd<'_>) -> Result<MemHandle>;
    /// Releases a registration (NCCL `deregMr`).
    fn dereg_mr(&mut self, mh: MemHandle) -> Result<()>;
    /// The fabric's registrar that needs no borrow of the comm, if it has one.
    fn pinner(&self) -> Option<std::sync::Arc<dyn Pinner>>;
    /// Takes a registration the [`Registrar::pinner`] made (released on close).
    fn adopt(&mut self, addr: u64, len: u64, kind: MemKind, reg: Registration)
    -> Result<MemHandle>;
    /// Forgets a registration without releasing it; whether the comm held it.
    fn forget(&mut self, mh: &MemHandle) -> bool;
}

/// Checks a registration's range before anything is pinned; its length as `usize`.
pub fn check_range(addr: u64, len: u64) -> Result<usize> {
    let ulen = usize::try_from(len).map_err(|_| {
        Error::InvalidArgument(format!(
            "registration of {len} bytes exceeds the address space"
        ))
    })?;
    addr.checked_add(len).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "registration {addr:#x}+{len} bytes wraps the address space"
        ))
    })?;
    Ok(ulen)
}

impl<F: Fabric> Core<F> {
    fn new(fab: F, cfg: ProtocolConfig) -> Result<Core<F>> {
        let paths = fab.paths();
        let data: Vec<usize> = (0..paths.len())
            .filter(|&i| paths[i].role == PathRole::Data)
            .collect();
        let loops = (0..paths.len())
            .filter(|&i| paths[i].role == PathRole::Loopback)
            .collect();
        if data.is_empty() || data.len() > MAX_PATHS {
            return Err(Error::InvalidArgument(format!(
                "a connection has {} data paths; accepted: 1..={MAX_PATHS}",
                data.len()
            )));
        }
        let speeds: Vec<u64> = data.iter().map(|&i| paths[i].speed_mbps).collect();
        let labels = paths.iter().map(|p| p.label.clone()).collect();
        let mut data_of = vec![None; paths.len()];
        for (k, &p) in data.iter().enumerate() {
            data_of[p] = Some(k);
        }
        let ndata = data.len();
        Ok(Core {
            warned: vec![false; paths.len()],
            paths: paths::PathSet::new(&speeds, cfg.failover, cfg.weights),
            newly_down: Vec::new(),
            data_of,
            fab,
            cfg,
            data,
            loops,
            labels,
            paths_due: None,
            cqe: Vec::with_capacity(POLL_BATCH),
            ctrl: Vec::new(),
            regs: std::collections::HashMap::new(),
            closed: false,
            fence: fence::Fence::new(ndata),
            meter: Meter::new(ndata),
            lazy: false,
            deferred: 0,
            activated: false,
        })
    }

    /// The data paths' labels, for errors about the connection as a whole (a request timeout).
    fn paths_text(&self) -> String {
        let l: Vec<String> = self
            .data
            .iter()
            .enumerate()
            .map(|(i, &p)| match self.fab.path_note(p) {
                Some(n) => format!("[{i}] {} ({n})", self.labels[p]),
                None => format!("[{i}] {}", self.labels[p]),
            })
            .collect();
        l.join(", ")
    }

    /// Marks data path `k` down if failover allows it (it is up and another path is): one WARN
    /// naming it, why, the survivors and the bandwidth to expect (INFO for a standby path that
    /// was standing by). `false`: the caller fails the
    /// work as before failover.
    fn mark_down(&mut self, k: usize, now: Instant, why: &str) -> bool {
        if !self.paths.can_fail_over(k) {
            return false;
        }
        self.refresh_labels();
        let before = self.paths.up_mbps();
        // A standby path standing by carries nothing: its loss changes no bandwidth, and a cable
        // that is only standby would otherwise WARN once per connection on it (hundreds).
        let idle_standby = self.paths.is_standby(k) && !self.paths.carries(k);
        self.paths.set_down(k, now);
        self.meter.failover(k, now);
        self.meter_carrying();
        self.newly_down.push(k);
        self.fence_stop(k);
        let path = self.data[k];
        self.warned[path] = true;
        self.activate_carrying(now);
        let survivors: Vec<String> = self
            .paths
            .carrying()
            .map(|j| {
                // A standby path that now carries: say so, the log reader looks for it.
                let role = if self.paths.is_standby(j) {
                    "standby "
                } else {
                    ""
                };
                format!("{role}[{j}] {}", self.labels[self.data[j]])
            })
            .collect();
        let kind = if self.paths.is_standby(k) {
            "standby path"
        } else {
            "path"
        };
        let mut msg = format!(
            "{kind} [{k}] {} failed ({why}); failing over to {}: expect about {} Gb/s (was {} Gb/s)",
            self.labels[path],
            survivors.join(", "),
            gbps(self.paths.up_mbps()),
            gbps(before)
        );
        if let Some(n) = self.fab.path_note(path) {
            msg.push_str(&format!("; {n}"));
        }
        if idle_standby {
            tracing::info!(path, label = %self.labels[path], "NET/switchless: {msg}");
        } else {
            tracing::warn!(path, label = %self.labels[path], "NET/switchless: {msg}");
        }
        true
    }

    /// Takes the paths' labels from the fabric again: they change when a path is rebuilt (a new
    /// queue pair) or, for TCP, once the streams are connected after the comm was built.
    fn refresh_labels(&mut self) {
        for (l, p) in self.labels.iter_mut().zip(self.fab.paths()) {
            if *l != p.label {
                l.clone_from(&p.label);
            }
        }
    }

    /// While waiting with nothing to poll: asks the devices what they saw ([`Fabric::health`]),
    /// then about each usable data path, and fails over from those reported dead; at most every
    /// [`PATH_CHECK_IDLE`] of the caller's clock (`isend` is called in a loop while no
    /// clear-to-send has come). A health error
    /// is returned only when no path it could be about was marked down (it concerns the connection).
    fn check_health(&mut self, now: Instant) -> Result<()> {
        if !self.paths_due.is_none_or(|d| d.due(now, false)) {
            return Ok(());
        }
        self.paths_due = Some(CheckDue::after(now));
        let overall = self.fab.health();
        let marked = self.check_paths(now);
        match overall {
            Err(e) if !marked => Err(e),
            _ => Ok(()),
        }
    }

    /// Asks about each usable data path ([`Fabric::path_health`]) and fails over from those
    /// reported dead; `true` when one was marked down. Both comms also call it from their
    /// progress ([`Core::check_paths_busy`]): work on a link that died silently completes
    /// nothing (TCP keeps it in a send queue that retransmits for minutes), so neither a waiting
    /// receiver's clear-to-send nor a sender's pieces would ever move otherwise.
    fn check_paths(&mut self, now: Instant) -> bool {
        let mut marked = false;
        if self.cfg.failover.enabled && self.paths.up_count() > 1 {
            for k in 0..self.paths.len() {
                if !self.paths.is_up(k) {
                    continue;
                }
                if let Err(e) = self.fab.path_health(self.data[k]) {
                    marked |= self.mark_down(k, now, &e.to_string());
                }
            }
        }
        marked
    }

    /// [`Core::check_paths`] from a comm's progress: every [`PATH_CHECK_IDLE`] while polls find
    /// nothing, and every [`PATH_CHECK_BUSY`] while completions keep coming on other paths (a path
    /// whose link died silently completes nothing, while its survivors do). Not on every call:
    /// NCCL's progress thread polls in a tight loop.
    fn check_paths_busy(&mut self, now: Instant, polled: usize) {
        if self.paths_due.is_none_or(|d| d.due(now, polled != 0)) {
            self.paths_due = Some(CheckDue::after(now));
            self.check_paths(now);
        }
    }

    /// Probes the failed paths that are due (failback). Returns the data paths whose end was just
    /// rebuilt (the receiver posts its receives there) in `rebuilt`.
    fn probe(&mut self, now: Instant, rebuilt: &mut Vec<usize>) -> Result<()> {
        if self.paths.all_up() || self.closed {
            return Ok(());
        }
        let mut due = [0usize; MAX_PATHS];
        let mut n = 0;
        for k in self.paths.due(now) {
            // Not before the fence of this failure is through (`fence.rs`).
            if self.may_revive(k) {
                due[n] = k;
                n += 1;
            }
        }
        for &k in &due[..n] {
            let path = self.data[k];
            match self.fab.revive_path(path)? {
                Revive::Down => self.paths.probe_failed(k, now),
                Revive::Rebuilt => {
                    self.fence_rebuilt(k);
                    rebuilt.push(k);
                    self.paths.rebuilt(k, now, true);
                    self.meter.rebuilding(k);
                }
                Revive::Pending => {
                    self.paths.rebuilt(k, now, false);
                    self.meter.rebuilding(k);
                }
                Revive::Ready => {
                    // A rebuilt path has a new label (verbs: its new QP number).
                    self.refresh_labels();
                    let stood_in: Vec<usize> = self.paths.carrying().collect();
                    self.paths.set_up(k);
                    self.meter.failback(k, now);
                    self.meter_carrying();
                    self.fence_up(k);
                    self.warned[path] = false;
                    let back: Vec<String> = stood_in
                        .into_iter()
                        .filter(|&j| !self.paths.carries(j))
                        .map(|j| {
                            format!(
                                "; standby [{j}] {} stands by again",
                                self.labels[self.data[j]]
                            )
                        })
                        .collect();
                    tracing::info!(
                        path,
                        label = %self.labels[path],
                        "NET/switchless: path [{k}] {} is back and carries traffic again: {} paths, about {} Gb/s{}",
                        self.labels[path],
                        self.paths.carrying().count(),
                        gbps(self.paths.up_mbps()),
                        back.concat()
                    );
                }
            }
        }
        Ok(())
    }

    /// Tells the counters which data paths carry now (after a path went down or came back).
    fn meter_carrying(&mut self) {
        for k in 0..self.paths.len() {
            let c = self.paths.carries(k);
            self.meter.carrying(k, c);
            let s = self.paths.is_standby(k);
            self.meter.standby(k, s);
        }
    }

    /// Whether loopback path `lp`'s device has a data path of this connection that is up.
    fn device_up(&self, lp: usize) -> bool {
        let dev = self.fab.path_device(lp);
        (0..self.data.len())
            .any(|k| self.paths.is_up(k) && self.fab.path_device(self.data[k]) == dev)
    }

    /// A flush read on loopback path `lp` failed: every data path of its device that is up is
    /// marked down. `true` when none of them is up any more (the flush goes on without this
    /// device); `false` when one could not be (the last usable path: the flush fails).
    fn device_failed(&mut self, lp: usize, now: Instant, why: &str) -> bool {
        let dev = self.fab.path_device(lp);
        let why = format!("the flush read on its device failed: {why}");
        for k in 0..self.data.len() {
            if self.paths.is_up(k) && self.fab.path_device(self.data[k]) == dev {
                self.mark_down(k, now, &why);
            }
        }
        !self.device_up(lp)
    }

    /// Takes the connector's standby paths (set locally or read from the peer's control
    /// info); on a lazy comm their devices register data memory only at first use.
    fn apply_standby(&mut self, mask: u8) {
        self.paths.set_standby(mask);
        if !self.lazy {
            return;
        }
        let mut fabric_paths = [0usize; MAX_PATHS];
        let mut n = 0;
        for k in 0..self.data.len() {
            if self.paths.is_standby(k) && !self.paths.carries(k) && self.deferred & (1 << k) == 0 {
                self.deferred |= 1 << k;
                fabric_paths[n] = self.data[k];
                n += 1;
            }
        }
        if n > 0 {
            self.fab.defer_paths(&fabric_paths[..n]);
        }
    }

    /// Registers on every deferred path that now carries (failover made a standby path take
    /// over): the fabric registers each live registration there, and this comm's copies take
    /// the new keys. A path whose registration fails is marked down (the next standby path, if
    /// any, takes over instead; the last usable path is not, and its work fails as without it).
    fn activate_carrying(&mut self, now: Instant) {
        for k in 0..self.data.len() {
            if self.deferred & (1 << k) == 0 || !self.paths.carries(k) {
                continue;
            }
            let path = self.data[k];
            match self.fab.activate_path(path) {
                Ok(()) => {
                    self.deferred &= !(1 << k);
                    self.activated = true;
                    let fab = &self.fab;
                    for reg in self.regs.values_mut() {
                        fill_keys(fab, reg, path);
                    }
                    tracing::debug!(
                        "NET/switchless: standby path [{k}] {}: {} registration(s) made at its first use",
                        self.labels[path],
                        self.regs.len()
                    );
                }
                Err(e) => {
                    let why = format!(
                        "registering the connection's memory on it at its first use failed: {e}"
                    );
                    if !self.mark_down(k, now, &why) {
                        tracing::warn!(
                            "NET/switchless: standby path [{k}] {}: {why}",
                            self.labels[path]
                        );
                    }
                }
            }
        }
    }

    /// Whether a deferred path was activated since the last call (the send comm then refreshes
    /// the local keys of its requests in flight).
    fn take_activated(&mut self) -> bool {
        std::mem::take(&mut self.activated)
    }

    /// The local key of registration `reg` (a copy NCCL holds) on fabric path `path`: its own,
    /// or the one this comm filed at the path's activation. 0 while the path is deferred (it
    /// carries nothing then).
    fn lkey(&self, reg: &Registration, path: usize) -> u32 {
        if reg.has(path) {
            return reg.keys[path].lkey;
        }
        self.regs
            .get(&reg.token)
            .filter(|r| r.has(path))
            .map_or(0, |r| r.keys[path].lkey)
    }

    /// The remote key of registration `reg` (a copy NCCL holds) on fabric path `path`: its own,
    /// or the one this comm filed or the fabric made at the path's activation (a loopback path
    /// shares its device's). `None` while the path is deferred.
    fn rkey(&self, reg: &Registration, path: usize) -> Option<u32> {
        if reg.has(path) {
            return Some(reg.keys[path].rkey);
        }
        self.regs
            .get(&reg.token)
            .filter(|r| r.has(path))
            .map(|r| r.keys[path].rkey)
            .or_else(|| self.fab.keys_on(reg, path).map(|k| k.rkey))
    }

    /// Whether loopback path `lp`'s device has a data path of this connection that is up and
    /// registered on (not deferred): the only devices a receive may have written through.
    fn device_live(&self, lp: usize) -> bool {
        let dev = self.fab.path_device(lp);
        (0..self.data.len()).any(|k| {
            self.paths.is_up(k)
                && self.deferred & (1 << k) == 0
                && self.fab.path_device(self.data[k]) == dev
        })
    }

    /// Data-path index of fabric path `path`.
    fn data_index(&self, path: usize) -> Option<usize> {
        self.data_of.get(path).copied().flatten()
    }

    fn deregister(&mut self, mh: &MemHandle) -> Result<()> {
        if self.regs.remove(&mh.reg.token).is_some() {
            self.meter.registration(mh.len, false);
        }
        self.fab.deregister(&mh.reg)
    }

    fn alloc(&mut self, words: usize) -> Result<CtrlMem> {
        let m = self.fab.alloc_ctrl(words)?;
        self.ctrl.push(m.clone());
        Ok(m)
    }

    fn info(&self, m: &CtrlMem) -> CtrlInfo {
        CtrlInfo {
            addr: m.addr,
            words: m.words as u32,
            rkeys: self.data.iter().map(|&p| m.reg.keys[p].rkey).collect(),
            standby: self.standby_mask(),
        }
    }

    /// The standby data paths as the bit mask [`CtrlInfo::standby`] carries.
    fn standby_mask(&self) -> u8 {
        (0..self.paths.len().min(8))
            .filter(|&k| self.paths.is_standby(k))
            .fold(0, |m, k| m | 1 << k)
    }

    /// Checks the peer's control info and takes its standby paths (either end may have set
    /// them: the connector chose them).
    fn check_peer(&mut self, peer: &CtrlInfo, need_words: usize, what: &str) -> Result<()> {
        if peer.rkeys.len() != self.data.len() {
            return Err(Error::Remote(format!(
                "peer's {what} lists keys for {} data paths; this connection has {}",
                peer.rkeys.len(),
                self.data.len()
            )));
        }
        if (peer.words as usize) < need_words || peer.addr % 8 != 0 {
            return Err(Error::Remote(format!(
                "peer's {what} is {} words at {:#x}; at least {need_words} words, 8-byte aligned, expected",
                peer.words, peer.addr
            )));
        }
        // Every control write goes to peer.addr + 8 × a word under `words`: checked once here.
        if u64::from(peer.words)
            .checked_mul(8)
            .and_then(|b| peer.addr.checked_add(b))
            .is_none()
        {
            return Err(Error::Remote(format!(
                "peer's {what} is {} words at {:#x}, which wraps the address space",
                peer.words, peer.addr
            )));
        }
        self.apply_standby(peer.standby);
        self.meter_carrying();
        Ok(())
    }

    /// Turns an error completion into an error, logging once per path.
    fn completion_error(&mut self, path: usize, c: &Completion, what: &str) -> Error {
        let label = &self.labels[path];
        let mut msg = format!("{what} on path {path} ({label}) failed: {}", c.status);
        if let Some(n) = self.fab.path_note(path) {
            msg.push_str(&format!("; {n}"));
        }
        if !self.warned[path] && c.status != WcStatus::WR_FLUSH_ERR {
            self.warned[path] = true;
            tracing::warn!(path, label = %label, status = %c.status, "NET/switchless: {msg}");
        } else {
            tracing::debug!("NET/switchless: {msg}");
        }
        if c.status.is_remote() {
            Error::Remote(msg)
        } else {
            Error::System(msg)
        }
    }

    fn register(
        &mut self,
        mem: &Lent,
        kind: MemKind,
        dmabuf: Option<(u64, BorrowedFd<'_>)>,
    ) -> Result<MemHandle> {
        let (addr, len) = (mem.addr(), mem.len() as u64);
        check_range(addr, len)?;
        let reg = match dmabuf {
            None => self.fab.register(mem, kind)?,
            Some((offset, fd)) => self.fab.register_dmabuf(mem, offset, fd)?,
        };
        self.adopt(addr, len, kind, reg)
    }

    /// Files a registration of `[addr, addr+len)` (released on close); on a key count that does
    /// not match the paths, releases it and fails.
    fn adopt(
        &mut self,
        addr: u64,
        len: u64,
        kind: MemKind,
        reg: Registration,
    ) -> Result<MemHandle> {
        if reg.keys.len() != self.fab.paths().len() {
            let err = Error::Internal(format!(
                "fabric returned keys for {} paths; it has {}",
                reg.keys.len(),
                self.fab.paths().len()
            ));
            let _ = self.fab.deregister(&reg);
            return Err(err);
        }
        let mut reg = reg;
        for (k, &path) in self.data.iter().enumerate() {
            // Registered while the path was deferred, activated before this filing: the fabric
            // keyed it at the activation.
            if !reg.has(path) && self.deferred & (1 << k) == 0 {
                fill_keys(&self.fab, &mut reg, path);
            }
        }
        self.regs.insert(reg.token, reg.clone());
        self.meter.registration(len, true);
        if kind == MemKind::Cuda {
            // The first GPU registration (NCCL registers a recv comm's buffers right after accept)
            // readies the flush, so the first iflush does not create QPs on the data path. A failure
            // is not this registration's: the first flush tries again and reports it.
            if let Err(e) = self.fab.prepare_flush() {
                tracing::warn!("NET/switchless: flush path not ready at GPU registration: {e}");
            }
        }
        Ok(MemHandle {
            addr,
            len,
            kind,
            reg,
        })
    }

    /// Polls every path once (bounded), handing each completion to `f`.
    fn poll_all(
        &mut self,
        mut f: impl FnMut(&mut Core<F>, usize, Completion) -> Result<()>,
    ) -> Result<usize> {
        // The completion buffer is taken once for the whole sweep (`f` gets the core without it)
        // and put back whatever happened: a sweep that finds nothing moves no vector per path.
        let mut buf = std::mem::take(&mut self.cqe);
        let res = self.poll_sweep(&mut buf, &mut f);
        self.cqe = buf;
        res
    }

    /// [`Core::poll_all`]'s sweep, into `buf`.
    fn poll_sweep(
        &mut self,
        buf: &mut Vec<Completion>,
        f: &mut impl FnMut(&mut Core<F>, usize, Completion) -> Result<()>,
    ) -> Result<usize> {
        let npaths = self.fab.paths().len();
        let mut total = 0;
        for path in 0..npaths {
            // Bounded: at most the queue depth worth of completions per call.
            for _ in 0..(SEND_QUEUE_DEPTH + RECV_DEPTH) / POLL_BATCH + 1 {
                buf.clear();
                let got = self.fab.poll(path, POLL_BATCH, buf)?;
                for c in buf.iter() {
                    // Flushed work after a failure is its consequence, not another error.
                    if !c.status.is_success() && c.status != WcStatus::WR_FLUSH_ERR {
                        if let Some(k) = self.data_index(path) {
                            self.meter.error(k);
                        }
                    }
                    f(self, path, *c)?;
                }
                total += got;
                if got < POLL_BATCH {
                    break;
                }
            }
        }
        Ok(total)
    }

    fn close(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        let mut first: Option<Error> = None;
        // 1. Stop the paths: nothing new is placed in our memory after this.
        if let Err(e) = self.fab.shutdown() {
            first.get_or_insert(e);
        }
        // 2. Drain what completed (flush errors of outstanding requests), bounded.
        let _ = self.poll_all(|_, _, _| Ok(()));
        // 3. Free control memory, newest first.
        while let Some(m) = self.ctrl.pop() {
            if let Err(e) = self.fab.free_ctrl(&m) {
                first.get_or_insert(e);
            }
        }
        // 4. Release registrations NCCL did not deregister before closing.
        self.meter.registrations_cleared();
        for (_, reg) in std::mem::take(&mut self.regs) {
            if let Err(e) = self.fab.deregister(&reg) {
                first.get_or_insert(e);
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Takes `reg`'s keys on fabric path `path` from the fabric when `reg` has none there yet.
fn fill_keys<F: Fabric>(fab: &F, reg: &mut Registration, path: usize) {
    if reg.has(path) {
        return;
    }
    if let Some(k) = fab.keys_on(reg, path) {
        reg.keys[path] = k;
        reg.missing &= !(1u32 << path.min(31));
    }
}

/// Mb/s as Gb/s text with two decimals.
fn gbps(mbps: u64) -> String {
    format!("{}.{:02}", mbps / 1000, (mbps % 1000) / 10)
}

/// When the path checks are next due, from the instant `t` they last ran: `t + PATH_CHECK_IDLE` while
/// polls find nothing, `t + PATH_CHECK_BUSY` while they find completions. `None`: never (`t` plus
/// the period is past what an [`Instant`] holds, so no clock reaches it).
#[derive(Debug, Clone, Copy)]
struct CheckDue {
    idle: Option<Instant>,
    busy: Option<Instant>,
}

impl CheckDue {
    fn after(t: Instant) -> CheckDue {
        CheckDue {
            idle: t.checked_add(PATH_CHECK_IDLE),
            busy: t.checked_add(PATH_CHECK_BUSY),
        }
    }

    /// Whether `now` is at least the period after `t`: the same as
    /// `now.saturating_duration_since(t) >= period` (a `now` before `t` is never due).
    fn due(self, now: Instant, busy: bool) -> bool {
        let at = if busy { self.busy } else { self.idle };
        at.is_some_and(|at| now >= at)
    }
}

/// How long a request posted at `posted` has waited at `now`, if that is past `limit`. Saturating: a
/// `now` before `posted` (a caller's clock that stepped back) counts as no wait.
fn timed_out(posted: Option<Instant>, limit: Option<Duration>, now: Instant) -> Option<Duration> {
    let (t, l) = (posted?, limit?);
    let waited = now.saturating_duration_since(t);
    (waited > l).then_some(waited)
}

/// Builds a connected pair from two fabric endpoints in one process (tests, benchmarks, and any
/// transport whose handshake has already exchanged nothing but the paths).
pub fn connect_pair<F: Fabric, G: Fabric>(
    send_fab: F,
    recv_fab: G,
    cfg: ProtocolConfig,
) -> Result<(SendComm<F>, RecvComm<G>)> {
    let mut s = SendComm::new(send_fab, cfg)?;
    let mut r = RecvComm::new(recv_fab, cfg)?;
    let si = s.local_info();
    let ri = r.local_info();
    s.connect(ri)?;
    r.connect(si)?;
    Ok((s, r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_deadline_is_due_exactly_when_the_period_has_passed() {
        let t = Instant::now() + Duration::from_secs(1);
        let d = CheckDue::after(t);
        for ns in [
            0u64, 1, 999_999, 1_000_000, 1_000_001, 9_999_999, 10_000_000, 10_000_001,
        ] {
            for now in [t + Duration::from_nanos(ns), t - Duration::from_nanos(ns)] {
                for (busy, period) in [(false, PATH_CHECK_IDLE), (true, PATH_CHECK_BUSY)] {
                    assert_eq!(
                        d.due(now, busy),
                        now.saturating_duration_since(t) >= period,
                        "{ns} ns, busy {busy}"
                    );
                }
            }
        }
    }
}
