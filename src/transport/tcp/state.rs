//! What a [`super::TcpFabric`] shares with the I/O workers that drive its streams: the registrations,
//! and per path the streams' send queues, the send and receive bookkeeping and the completion queue.
//! The workers (`super::pool`) fill it; the fabric's `post_*` and `poll` read and queue.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use super::frame::HEADER_LEN;
use crate::sys::rawmem::RawRegion;
use crate::transport::ctrl::AtomicWords;
use crate::transport::fabric::{Completion, WcOpcode, WcStatus};

pub(super) enum RegMem {
    Raw(RawRegion),
    Ctrl(Arc<AtomicWords>),
}

pub(super) struct Reg {
    pub(super) mem: RegMem,
    /// `false` once deregistered; copies into or out of the region hold the read lock.
    pub(super) alive: RwLock<bool>,
}

impl Reg {
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
    /// Index of the work request on its path (completion ordering).
    pub(super) wr: u64,
}

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
    pub(super) remaining: u32,
    pub(super) signaled: bool,
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
    pub(super) error: bool,
}

/// Frames waiting for a stream's worker.
#[derive(Default)]
pub(super) struct TxQueue {
    pub(super) frames: VecDeque<TxFrame>,
    /// The worker found the queue empty and waits to be woken for the next frame.
    pub(super) idle: bool,
}

pub(super) struct StreamShared {
    pub(super) sock: TcpStream,
    pub(super) q: Mutex<TxQueue>,
    pub(super) queued: AtomicU64,
    pub(super) sent_bytes: AtomicU64,
    /// A frame was started on this stream and not finished (no close frame may follow it).
    pub(super) mid_frame: AtomicBool,
}

pub(super) struct PathShared {
    pub(super) label: String,
    pub(super) streams: Vec<StreamShared>,
    pub(super) tx: Mutex<TxState>,
    pub(super) rx: Mutex<RxState>,
    pub(super) cq: Mutex<VecDeque<Completion>>,
}

pub(super) struct Shared {
    pub(super) stop: AtomicBool,
    pub(super) paths: Vec<PathShared>,
    pub(super) regs: RwLock<HashMap<u32, Arc<Reg>>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn read_lock<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn write_lock<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

impl PathShared {
    pub(super) fn complete(&self, c: Completion) {
        lock(&self.cq).push_back(c);
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
        let mut tx = lock(&self.tx);
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
        drop(tx);
        for s in &self.streams {
            lock(&s.q).frames.clear();
            s.queued.store(0, Ordering::Relaxed);
        }
    }

    /// Fails the receiving side: posted receives complete with `WR_FLUSH_ERR`, later ones too.
    pub(super) fn fail_rx(&self, why: &str, warn: bool) {
        let mut rx = lock(&self.rx);
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

    /// A frame of work request `wr` was handed to the kernel.
    pub(super) fn frame_sent(&self, wr: u64) {
        let mut tx = lock(&self.tx);
        if tx.error || wr < tx.first_wr {
            return;
        }
        let i = (wr - tx.first_wr) as usize;
        if let Some(w) = tx.wrs.get_mut(i) {
            w.remaining = w.remaining.saturating_sub(1);
        }
        while tx.wrs.front().is_some_and(|w| w.remaining == 0) {
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
