//! What a [`super::TcpFabric`] shares with the I/O workers that drive its streams: the registrations,
//! and per path the streams' send queues, the send and receive bookkeeping and the completion queue.
//! The workers (`super::pool`) fill it; the fabric's `post_*` and `poll` read and queue.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::frame::HEADER_LEN;
use crate::error::{Error, Result};
use crate::sync::{self, lock};
use crate::sys::rawmem::RawRegion;
use crate::transport::ctrl::AtomicWords;
use crate::transport::fabric::{Completion, WcOpcode, WcStatus};

/// What a registration covers: memory NCCL registered, or control memory the fabric owns.
pub(super) enum RegMem {
    Raw(RawRegion),
    Ctrl(Arc<AtomicWords>),
}

/// One registration, shared by the fabric and the workers copying into or out of it.
pub(super) struct Reg {
    pub(super) mem: RegMem,
    /// `false` once deregistered; copies into or out of the region hold the read lock.
    pub(super) alive: RwLock<bool>,
}

impl Reg {
    /// Held while one chunk is copied: `false` once deregistered.
    pub(super) fn alive(&self) -> Result<RwLockReadGuard<'_, bool>> {
        sync::read(&self.alive, "TCP registration")
    }

    /// Deregisters: waits for the copy in progress (one chunk of at most 1 MiB); after this no I/O
    /// worker touches the memory. Poisoned, it has waited too, and the workers, which find it
    /// poisoned as well, copy nothing more.
    pub(super) fn kill(&self) -> Result<()> {
        *sync::write(&self.alive, "TCP registration")? = false;
        Ok(())
    }

    pub(super) fn contains(&self, addr: u64, len: usize) -> bool {
        match &self.mem {
            RegMem::Raw(r) => r.contains(addr, len),
            RegMem::Ctrl(c) => c.contains(addr, len),
        }
    }
}

pub(super) enum Payload {
    /// Copied when posted (small writes and control-memory sources).
    Bytes(Vec<u8>),
    /// Sent from registered memory by the stream's I/O worker.
    Raw {
        reg: Arc<Reg>,
        addr: u64,
        len: usize,
    },
}

/// A frame queued on a stream: its header bytes and where its payload comes from.
pub(super) struct TxFrame {
    pub(super) hdr: [u8; HEADER_LEN],
    pub(super) payload: Payload,
    /// Index of the work request on its path (completion ordering); [`NO_WR`] for a frame of the
    /// stream's own (a relayed path's acknowledgement).
    pub(super) wr: u64,
}

/// [`TxFrame::wr`] of a frame that belongs to no work request.
pub(super) const NO_WR: u64 = u64::MAX;

impl TxFrame {
    pub(super) fn len(&self) -> usize {
        match &self.payload {
            Payload::Bytes(b) => b.len(),
            Payload::Raw { len, .. } => *len,
        }
    }
}

pub(super) struct WrTrack {
    pub(super) wr_id: u64,
    /// Frames not yet handed to the kernel.
    pub(super) remaining: u32,
    pub(super) signaled: bool,
    /// Per stream that carried a frame of it: the stream's byte count (`StreamShared::written`)
    /// at the frame's end, or on a relayed path its count of write frames
    /// (`StreamShared::frames_out`). The work request completes once the peer acknowledged up to
    /// there on each (see [`PathShared::complete_acked`]).
    pub(super) ends: Vec<(u8, u64)>,
}

#[derive(Default)]
pub(super) struct TxState {
    pub(super) next_seq: u64,
    /// Index of `wrs[0]`.
    pub(super) first_wr: u64,
    pub(super) wrs: VecDeque<WrTrack>,
    pub(super) error: bool,
}

pub(super) struct Effect {
    pub(super) ctrl: Option<(Arc<Reg>, u64, Vec<u8>)>,
    pub(super) imm: Option<(u32, u32)>,
}

#[derive(Default)]
pub(super) struct RxState {
    pub(super) next_apply: u64,
    pub(super) pending: BTreeMap<u64, Effect>,
    pub(super) buffered: usize,
    pub(super) recvs: VecDeque<u64>,
    /// Streams that ended with an orderly close frame.
    pub(super) goodbyes: usize,
    /// Every stream ended with a close frame: no frame can come any more.
    pub(super) peer_closed: bool,
    /// Streams of a cut path that drained and aborted.
    pub(super) drained: usize,
    pub(super) error: bool,
}

/// Frames waiting for a stream's worker.
#[derive(Default)]
pub(super) struct TxQueue {
    pub(super) frames: VecDeque<TxFrame>,
    /// The worker found the queue empty and waits to be woken for the next frame.
    pub(super) idle: bool,
}

/// One stream of a path: its socket and its send queue.
pub(super) struct StreamShared {
    pub(super) sock: TcpStream,
    pub(super) q: Mutex<TxQueue>,
    /// Payload bytes queued and not yet handed to the kernel (stream choice: least queued first).
    pub(super) queued: AtomicU64,
    pub(super) sent_bytes: AtomicU64,
    /// A frame was started on this stream and not finished (no close frame may follow it).
    pub(super) mid_frame: AtomicBool,
    /// Bytes (headers and payload) handed to the kernel so far.
    pub(super) written: AtomicU64,
    /// Relayed paths: write frames handed to the kernel so far.
    pub(super) frames_out: AtomicU64,
    /// Relayed paths: write frames of this stream the peer says have landed (its [`OP_ACK`]
    /// frames; never above `frames_out`).
    ///
    /// [`OP_ACK`]: super::frame::OP_ACK
    pub(super) peer_landed: AtomicU64,
}

impl StreamShared {
    /// How far the peer has this stream: on a direct path the bytes its kernel has acknowledged
    /// (a lower bound: `written` is read before the kernel's count; `None` when the socket cannot
    /// tell), on a relayed path the write frames the peer says landed (the relay host's kernel
    /// acknowledging them says nothing about the peer).
    fn acked(&self, relayed: bool) -> Option<u64> {
        if relayed {
            return Some(self.peer_landed.load(Ordering::Acquire));
        }
        let written = self.written.load(Ordering::Acquire);
        let unacked = crate::sys::socket::unacked_bytes(&self.sock).ok()?;
        Some(written.saturating_sub(unacked))
    }
}

impl StreamShared {
    pub(super) fn queue(&self) -> Result<MutexGuard<'_, TxQueue>> {
        lock(&self.q, "TCP stream queue")
    }
}

/// One path: its streams, the bookkeeping of both directions and the completion queue.
pub(super) struct PathShared {
    pub(super) label: String,
    /// The streams go through a relay host (`transport::relay`): writes complete on the peer's
    /// acknowledgement frames, and this end acknowledges what lands.
    pub(super) relayed: bool,
    pub(super) streams: Vec<StreamShared>,
    pub(super) tx: Mutex<TxState>,
    pub(super) rx: Mutex<RxState>,
    pub(super) cq: Mutex<VecDeque<Completion>>,
    /// Sealed ([`PathShared::cut`]): the streams drain what the peer's kernel acknowledged,
    /// then abort.
    pub(super) cut: AtomicBool,
    /// Stopped ([`PathShared::stop`]): nothing more is sent; receiving goes on.
    pub(super) stopped: AtomicBool,
    /// Streams whose receiving direction ended (for any reason): none of them places a byte any
    /// more.
    pub(super) rx_ends: AtomicUsize,
    /// Tests: the workers read nothing of this path (what the peer sends waits in the kernel).
    pub(super) rx_held: AtomicBool,
}

/// Everything of one endpoint that its I/O workers touch.
pub(super) struct Shared {
    /// Set by `shutdown`: workers stop driving the streams, posts flush at once.
    pub(super) stop: AtomicBool,
    /// Per path, the current generation of its streams and state: a rebuilt path (failback) gets
    /// a fresh [`PathShared`], so nothing of the old streams (a late frame, a stale completion)
    /// reaches the new one. Workers hold the generation they serve.
    pub(super) paths: Vec<RwLock<Arc<PathShared>>>,
    /// Live registrations by key (the same key is lkey and rkey on every path).
    pub(super) regs: RwLock<HashMap<u32, Arc<Reg>>>,
    /// Whether the peer may write into data registrations (receive buffers). A sending endpoint
    /// clears it ([`super::TcpFabric::refuse_peer_data_writes`]): its data registrations are send
    /// buffers, and the peer writes only its control memory.
    pub(super) peer_data_writes: AtomicBool,
    /// `TCP_USER_TIMEOUT` of the streams (`TcpConfig::user_timeout`), which a stream whose peer
    /// stopped reading suspends (`super::stream`, the window guard).
    pub(super) user_timeout: Option<std::time::Duration>,
}

impl Shared {
    /// Path `p`'s current generation (the caller checked `p`).
    pub(super) fn path(&self, p: usize) -> Result<Arc<PathShared>> {
        let slot = self.paths.get(p).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "TCP path {p}; this endpoint has paths 0..{}",
                self.paths.len()
            ))
        })?;
        Ok(Arc::clone(&*sync::read(slot, "TCP path slot")?))
    }

    /// Every path's current generation, in path order.
    pub(super) fn all_paths(&self) -> Result<Vec<Arc<PathShared>>> {
        (0..self.paths.len()).map(|p| self.path(p)).collect()
    }

    /// Makes `new` path `p`'s current generation; returns the old one.
    pub(super) fn replace_path(&self, p: usize, new: Arc<PathShared>) -> Result<Arc<PathShared>> {
        let slot = self.paths.get(p).ok_or_else(|| {
            Error::Internal(format!("replacing TCP path {p} of {}", self.paths.len()))
        })?;
        Ok(std::mem::replace(
            &mut *sync::write(slot, "TCP path slot")?,
            new,
        ))
    }

    pub(super) fn regs(&self) -> Result<RwLockReadGuard<'_, HashMap<u32, Arc<Reg>>>> {
        sync::read(&self.regs, "TCP registrations")
    }

    pub(super) fn regs_mut(&self) -> Result<RwLockWriteGuard<'_, HashMap<u32, Arc<Reg>>>> {
        sync::write(&self.regs, "TCP registrations")
    }
}

// Poisoned locks fail closed (`crate::sync`): callers that can return an error do; the I/O workers
// and the failure paths below, which cannot, treat the path as broken and close its streams, so both
// ends see their requests fail and NCCL's next call on this endpoint gets the error.
impl PathShared {
    /// A path's state over freshly connected streams: sequence numbers from 0, nothing pending.
    pub(super) fn new(label: String, socks: Vec<TcpStream>, relayed: bool) -> PathShared {
        PathShared {
            label,
            relayed,
            streams: socks
                .into_iter()
                .map(|sock| StreamShared {
                    sock,
                    q: Mutex::new(TxQueue::default()),
                    queued: AtomicU64::new(0),
                    sent_bytes: AtomicU64::new(0),
                    mid_frame: AtomicBool::new(false),
                    written: AtomicU64::new(0),
                    frames_out: AtomicU64::new(0),
                    peer_landed: AtomicU64::new(0),
                })
                .collect(),
            tx: Mutex::new(TxState::default()),
            rx: Mutex::new(RxState::default()),
            cq: Mutex::new(VecDeque::new()),
            cut: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            rx_ends: AtomicUsize::new(0),
            rx_held: AtomicBool::new(false),
        }
    }

    /// The comm failed over from this path (`Fabric::stop_path`): outstanding work requests flush
    /// at once and nothing more is sent; what the peer sends is still received and applied (the
    /// peer may count it complete: its kernel has our acknowledgement) until [`PathShared::cut`].
    pub(super) fn stop(&self, why: &str) {
        self.stopped.store(true, Ordering::SeqCst);
        self.fail_tx(WcStatus::WR_FLUSH_ERR, None, why);
    }

    /// Whether nothing the peer sent lands any more: cut, and every stream's receiving direction
    /// has ended (what arrived before is applied, its completions queued).
    pub(super) fn sealed(&self) -> bool {
        self.cut.load(Ordering::SeqCst) && self.rx_ends.load(Ordering::SeqCst) >= self.streams.len()
    }

    /// Seals the path (`Fabric::seal_path`, once the peer has stopped it; or a path set up anew
    /// that failed). Outstanding work requests flush at once. Receiving goes on until each
    /// stream's kernel queue is empty: what the peer's kernel acknowledged, the peer may have
    /// counted complete, so it is applied here; then each stream aborts (`sys::socket::abort`:
    /// our unacknowledged bytes are purged, never delivered late) and, once all have, posted
    /// receives flush.
    pub(super) fn cut(&self, why: &str) {
        if self.cut.swap(true, Ordering::SeqCst) {
            return;
        }
        self.fail_tx(WcStatus::WR_FLUSH_ERR, None, why);
        if self.streams.is_empty() {
            self.fail_rx(why, false);
        }
        for s in &self.streams {
            // The worker reads what is queued, then sees the end of the stream.
            let _ = s.sock.shutdown(std::net::Shutdown::Read);
        }
    }

    /// A stream of a cut path ended: it aborts; the last one flushes the posted receives.
    pub(super) fn drained(&self, s: usize) {
        if let Some(st) = self.streams.get(s) {
            let _ = crate::sys::socket::abort(&st.sock);
        }
        let all = match self.rx() {
            Ok(mut rx) => {
                rx.drained += 1;
                rx.drained >= self.streams.len()
            }
            Err(e) => return self.poisoned(&e),
        };
        if all {
            self.fail_rx("failed over", false);
        }
    }

    pub(super) fn tx(&self) -> Result<MutexGuard<'_, TxState>> {
        lock(&self.tx, "TCP send state")
    }

    pub(super) fn rx(&self) -> Result<MutexGuard<'_, RxState>> {
        lock(&self.rx, "TCP receive state")
    }

    pub(super) fn cq(&self) -> Result<MutexGuard<'_, VecDeque<Completion>>> {
        lock(&self.cq, "TCP completion queue")
    }

    /// A lock of this path was found poisoned where no error can be returned: the path is broken.
    pub(super) fn poisoned(&self, e: &Error) {
        tracing::error!(label = %self.label, "NET/switchless: TCP path {}: {e}; closing the path", self.label);
        self.close_streams();
    }

    pub(super) fn complete(&self, c: Completion) {
        match self.cq() {
            Ok(mut cq) => cq.push_back(c),
            Err(e) => self.poisoned(&e),
        }
    }

    pub(super) fn close_streams(&self) {
        // The workers see the hang-up as readiness and end both directions.
        for s in &self.streams {
            let _ = s.sock.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Fails the sending side: the work request with index `culprit` (the oldest outstanding one when
    /// `None`) completes with `status`, every other outstanding one with `WR_FLUSH_ERR` (in posting
    /// order); queued frames are dropped and the path stays in error.
    pub(super) fn fail_tx(&self, status: WcStatus, culprit: Option<u64>, why: &str) {
        match self.tx() {
            Ok(mut tx) => {
                if !tx.error {
                    tx.error = true;
                    if status != WcStatus::WR_FLUSH_ERR && !tx.wrs.is_empty() {
                        tracing::warn!(label = %self.label, "NET/switchless: TCP path {}: {why}", self.label);
                    }
                }
                let culprit = culprit.unwrap_or(tx.first_wr);
                while let Some(w) = tx.wrs.pop_front() {
                    let index = tx.first_wr;
                    tx.first_wr += 1;
                    let st = if index == culprit {
                        status
                    } else {
                        WcStatus::WR_FLUSH_ERR
                    };
                    self.complete(Completion::without_data(w.wr_id, st, WcOpcode::RdmaWrite));
                }
            }
            Err(e) => self.poisoned(&e),
        }
        for s in &self.streams {
            match s.queue() {
                Ok(mut q) => q.frames.clear(),
                Err(e) => self.poisoned(&e),
            }
            s.queued.store(0, Ordering::Relaxed);
        }
    }

    /// Fails the receiving side: posted receives complete with `WR_FLUSH_ERR`, later ones too.
    pub(super) fn fail_rx(&self, why: &str, warn: bool) {
        let mut rx = match self.rx() {
            Ok(rx) => rx,
            Err(e) => return self.poisoned(&e),
        };
        if !rx.error && warn {
            tracing::warn!(label = %self.label, "NET/switchless: TCP path {}: {why}", self.label);
        }
        rx.error = true;
        rx.pending.clear();
        rx.buffered = 0;
        while let Some(wr_id) = rx.recvs.pop_front() {
            self.complete(Completion::without_data(
                wr_id,
                WcStatus::WR_FLUSH_ERR,
                WcOpcode::RecvRdmaWithImm,
            ));
        }
    }

    /// A frame of work request `wr` was handed to the kernel on stream `s`, ending at byte `end`
    /// of that stream (on a relayed path: it is the stream's `end`-th write frame).
    pub(super) fn frame_sent(&self, wr: u64, s: usize, end: u64) {
        let mut tx = match self.tx() {
            Ok(tx) => tx,
            Err(e) => return self.poisoned(&e),
        };
        if tx.error || wr < tx.first_wr {
            return;
        }
        let i = (wr - tx.first_wr) as usize;
        if let Some(w) = tx.wrs.get_mut(i) {
            w.remaining = w.remaining.saturating_sub(1);
            let s = u8::try_from(s).unwrap_or(u8::MAX);
            match w.ends.iter_mut().find(|(t, _)| *t == s) {
                Some((_, e)) => *e = (*e).max(end),
                None => w.ends.push((s, end)),
            }
        }
        self.drain_acked(&mut tx);
    }

    /// Completes the work requests that the peer's kernel holds entirely (called by `poll`).
    /// Completion means acknowledged, as on RC, not merely handed to our kernel: a link that dies
    /// loses what is still in the send queue, and failover moves exactly the work that did not
    /// complete.
    pub(super) fn complete_acked(&self) {
        match self.tx() {
            Ok(mut tx) if !tx.error => self.drain_acked(&mut tx),
            Ok(_) => {}
            Err(e) => self.poisoned(&e),
        }
    }

    fn drain_acked(&self, tx: &mut TxState) {
        // Acknowledged bytes per stream, read once per call.
        let mut acked: [Option<u64>; super::config::MAX_STREAMS] =
            [None; super::config::MAX_STREAMS];
        // Completions of a path come out in posting order: only a finished oldest request completes.
        while let Some(w) = tx.wrs.front() {
            if w.remaining != 0 {
                break;
            }
            let held = w.ends.iter().all(|&(s, end)| {
                let s = usize::from(s);
                let got = match acked.get(s).copied().flatten() {
                    Some(a) => Some(a),
                    None => {
                        let a = self.streams.get(s).and_then(|st| st.acked(self.relayed));
                        if let Some(slot) = acked.get_mut(s) {
                            *slot = a;
                        }
                        a
                    }
                };
                got.is_some_and(|a| a >= end)
            });
            if !held {
                break;
            }
            if let Some(w) = tx.wrs.pop_front() {
                tx.first_wr += 1;
                if w.signaled {
                    self.complete(Completion::without_data(
                        w.wr_id,
                        WcStatus::SUCCESS,
                        WcOpcode::RdmaWrite,
                    ));
                }
            }
        }
    }
}
