//! The failover fence: settles what a failed data path had in flight so that every piece and every
//! clear-to-send entry lands exactly once, and nothing lands after the receive it belongs to
//! completed (the argument: `docs/failover.md`, "Exactly once").
//!
//! Per data path `k`, each end of a connection:
//!
//! 1. **Stops** `k` when it marks it down ([`Fabric::stop_path`]: nothing more is sent on it) and
//!    tells the peer: its stop count of `k` (its *epoch*) goes into a `req` word of the peer's
//!    inbox, written over a surviving path. Its own work on `k` that no success completion settled
//!    is **parked**: not sent again yet.
//! 2. On the peer's `req` for `k`: stops `k` too if it had not (one WARN), **seals** its end
//!    ([`Fabric::seal_path`]: nothing the peer sent on `k` lands any more, and what did land has
//!    been taken, its completions polled), takes a snapshot of what it has received (the
//!    receiver: which pieces of which buffers; the sender: which clear-to-send entries), and
//!    **publishes** it, then an `ack` word naming the peer's epoch, over one surviving path.
//! 3. On the peer's `ack` of its epoch: every parked item is looked up in the snapshot before it;
//!    what landed is done, what did not is sent again on a survivor (once: the only copy not on a
//!    sealed path).
//!
//! A path is probed for failback only once both exchanges are through ([`Core::may_revive`]).
//! The words' layout is [`FenceLayout`]; the comms call [`Core::fence_poll`], resolve what it
//! reports acknowledged, then call [`Core::fence_flush`] from their progress.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::Core;
use crate::error::Result;
use crate::transport::fabric::{Completion, CtrlMem, Fabric, LocalSeg, RemoteSeg, WriteWr};
use crate::transport::stripe::MAX_PATHS;
use crate::transport::wire::{self, FenceLayout, WrKind};

/// `wr_id` index bits: what a fence write carries.
const REQ_WRITE: usize = 0;
const PUB_WRITE: usize = 1 << 8;

/// One end's fence state (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Fence {
    /// The inbox in this end's control block (the peer writes it), and its layout.
    inbox: u64,
    lin: Option<FenceLayout>,
    /// This end's outbox (its writes' sources) and layout.
    outbox: Option<CtrlMem>,
    lout: Option<FenceLayout>,
    /// The peer's inbox address and its keys per data path.
    peer: Option<(u64, Vec<u32>)>,
    /// Per data path: stopped by this end (since it was last up).
    stopped: Vec<bool>,
    /// This end's stop epoch.
    mine: Vec<u64>,
    /// The peer acknowledged `mine` and the parked work was settled.
    resolved: Vec<bool>,
    /// This end is sealed (since it was last stopped).
    sealed: Vec<bool>,
    /// The peer's newest stop epoch seen, the one sealed for, and the one whose answer was
    /// delivered (a publish carrying it completed).
    peer_seen: Vec<u64>,
    answer: Vec<u64>,
    answered: Vec<u64>,
    /// `peer_seen` when the path was last up: failback waits for the peer's stop of this period.
    peer_at_up: Vec<u64>,
    /// Receives posted and not yet completed (a receiving comm: sealed only once all are in).
    pub(super) recvs: Vec<usize>,
    /// The `req` words to deliver: their version, the one delivered, the write in flight.
    req_version: u64,
    req_done: u64,
    req_inflight: Option<(usize, u64)>,
    /// The publish in flight: its path and the epochs it answers.
    pub_inflight: Option<(usize, [u64; MAX_PATHS])>,
    /// Outbox areas whose write may still be read by the fabric (until its completion, or the
    /// path's rebuild).
    busy_req: Vec<bool>,
    busy_pub: Vec<bool>,
    /// Paths whose `ack` arrived, with the area it came in: the comm settles their parked work.
    pub(super) acked: Vec<(usize, usize)>,
    pub(super) stats: FenceStats,
}

/// What the failover fence settled so far (one comm).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FenceStats {
    /// Paths this end stopped, and stops of the peer it sealed for and answered.
    pub stops: u64,
    /// Publishes (snapshot and acknowledgements) written.
    pub publishes: u64,
    /// Parked items (pieces, clear-to-send entries) the peer's snapshot showed landed: done
    /// without sending them again.
    pub landed: u64,
    /// Parked items it showed missing: sent again, once.
    pub resent: u64,
    /// Receiving comm: key updates posted (a standby path's keys for a receive posted before
    /// the path's first use). Sending comm: pieces that waited for such a key before posting.
    pub keys: u64,
}

impl Fence {
    pub(super) fn new(npaths: usize) -> Fence {
        Fence {
            stopped: vec![false; npaths],
            mine: vec![0; npaths],
            resolved: vec![true; npaths],
            sealed: vec![false; npaths],
            peer_seen: vec![0; npaths],
            answer: vec![0; npaths],
            answered: vec![0; npaths],
            peer_at_up: vec![0; npaths],
            recvs: vec![0; npaths],
            busy_req: vec![false; npaths],
            busy_pub: vec![false; npaths],
            ..Fence::default()
        }
    }

    /// Address of word `w` of the snapshot in inbox area `j`.
    pub(super) fn snapshot(&self, j: usize) -> Option<(u64, usize)> {
        let l = self.lin?;
        Some((
            self.inbox + 8 * (l.area(j) + FenceLayout::SNAP) as u64,
            l.snap,
        ))
    }
}

impl<F: Fabric> Core<F> {
    /// Sets where the fence's words are: the inbox inside this end's control block (`lin`: the
    /// peer's snapshot size) and a fresh outbox (`lout`: this end's).
    pub(super) fn fence_init(
        &mut self,
        inbox: u64,
        lin: FenceLayout,
        lout: FenceLayout,
    ) -> Result<()> {
        let outbox = self.alloc(lout.words())?;
        let f = &mut self.fence;
        f.inbox = inbox;
        f.lin = Some(lin);
        f.lout = Some(lout);
        f.outbox = Some(outbox);
        Ok(())
    }

    /// The peer's inbox: `addr` in its control block, reached with `rkeys` per data path.
    pub(super) fn fence_connect(&mut self, addr: u64, rkeys: Vec<u32>) {
        self.fence.peer = Some((addr, rkeys));
    }

    /// Data path `k` is marked down (or stopped by the peer): stop it, tell the peer, park.
    pub(super) fn fence_stop(&mut self, k: usize) {
        let f = &mut self.fence;
        f.stopped[k] = true;
        f.stats.stops += 1;
        f.mine[k] += 1;
        f.resolved[k] = false;
        f.sealed[k] = false;
        f.req_version += 1;
        // Writes in flight on `k` will not complete well: deliver them again elsewhere.
        if f.req_inflight.is_some_and(|(j, _)| j == k) {
            f.req_inflight = None;
        }
        if f.pub_inflight.is_some_and(|(j, _)| j == k) {
            f.pub_inflight = None;
        }
        let path = self.data[k];
        if let Err(e) = self.fab.stop_path(path) {
            tracing::debug!(
                "NET/switchless: stopping path [{k}] {}: {e}",
                self.labels[path]
            );
        }
    }

    /// Whether a fence write is in flight: its completion frees its outbox area and lets the
    /// next `req` or publish go, so a comm with nothing else to poll for must still reap it.
    pub(super) fn fence_writing(&self) -> bool {
        self.fence.req_inflight.is_some() || self.fence.pub_inflight.is_some()
    }

    /// Whether data path `k` may be probed for failback: this end's stop was acknowledged and its
    /// parked work settled, and the peer's stop of this period was sealed for and answered.
    pub(super) fn may_revive(&self, k: usize) -> bool {
        let f = &self.fence;
        f.resolved[k]
            && f.sealed[k]
            && f.peer_seen[k] > f.peer_at_up[k]
            && f.answered[k] >= f.peer_seen[k]
    }

    /// Data path `k`'s end was rebuilt: its old queue pair (and what it was sending) is gone.
    pub(super) fn fence_rebuilt(&mut self, k: usize) {
        let f = &mut self.fence;
        f.busy_req[k] = false;
        f.busy_pub[k] = false;
        f.recvs[k] = 0;
    }

    /// Data path `k` carries again.
    pub(super) fn fence_up(&mut self, k: usize) {
        let f = &mut self.fence;
        f.peer_at_up[k] = f.peer_seen[k];
        f.stopped[k] = false;
        f.sealed[k] = false;
    }

    /// Reads the peer's `req` and `ack` words: stops and seals what the peer stopped, and files
    /// in [`Fence::acked`] the paths whose stop the peer acknowledged.
    pub(super) fn fence_poll(&mut self, now: Instant) -> Result<()> {
        let (Some(lin), true) = (self.fence.lin, self.fence.peer.is_some()) else {
            return Ok(());
        };
        let n = self.data.len();
        let mut seen = [0u64; MAX_PATHS];
        let mut w = [0u64; MAX_PATHS];
        for j in 0..n {
            let at = self.fence.inbox + 8 * (lin.area(j) + FenceLayout::REQ) as u64;
            self.fab.ctrl_read(at, &mut w[..n])?;
            for (s, &v) in seen.iter_mut().zip(&w[..n]) {
                *s = (*s).max(v);
            }
        }
        for (k, &v) in seen.iter().enumerate().take(n) {
            if v > self.fence.peer_seen[k] {
                tracing::debug!(
                    "NET/switchless: fence: the peer stopped path [{k}] (its epoch {v})"
                );
                self.fence.peer_seen[k] = v;
                self.peer_stopped(k, now);
            }
        }
        if !self.fence.stopped.contains(&true) {
            // Every path carries (the common case, on every progress call): nothing stopped at
            // this end to seal for or to wait for an answer about.
            return Ok(());
        }
        for k in 0..n {
            let f = &self.fence;
            if !f.stopped[k] || f.peer_seen[k] <= f.answer[k] {
                continue;
            }
            if !f.sealed[k] {
                let sealed = self.fab.seal_path(self.data[k])?;
                self.fence.sealed[k] = sealed && self.fence.recvs[k] == 0;
            }
            if self.fence.sealed[k] {
                tracing::debug!("NET/switchless: fence: path [{k}] sealed");
                self.fence.answer[k] = self.fence.peer_seen[k];
            }
        }
        for k in 0..n {
            let f = &self.fence;
            if !f.stopped[k] || f.resolved[k] {
                continue;
            }
            for j in 0..n {
                let at = f.inbox + 8 * (lin.area(j) + FenceLayout::ACK + k) as u64;
                // Acquire: the snapshot written before this word on the same path is visible.
                if self.fab.ctrl_load(at, Ordering::Acquire)? >= self.fence.mine[k] {
                    tracing::debug!(
                        "NET/switchless: fence: the peer answered the stop of path [{k}] (epoch {}) over path [{j}]",
                        self.fence.mine[k]
                    );
                    self.fence.resolved[k] = true;
                    self.fence.acked.push((k, j));
                    break;
                }
            }
        }
        Ok(())
    }

    /// The peer stopped data path `k` (a newer epoch of it): this end stops it too.
    fn peer_stopped(&mut self, k: usize, now: Instant) {
        if self.paths.is_up(k) {
            if self.mark_down(k, now, "the peer stopped using it") {
                return;
            }
            // The last usable path, or failover off here: stopped all the same (the peer sends
            // nothing more on it; this end's work on it fails as it would without failover).
            self.fence_stop(k);
            return;
        }
        if !self.paths.is_down(k) {
            // Being rebuilt: the peer gave up on this period's rebuild; start over.
            self.paths.set_down(k, now);
            self.newly_down.push(k);
            self.fence_stop(k);
        }
    }

    /// Writes what is due: this end's `req` words, and a publish (`snapshot` fills this end's
    /// snapshot) when a stop of the peer was sealed for and not yet answered.
    pub(super) fn fence_flush(
        &mut self,
        snapshot: impl FnOnce(&F, &mut [u64]) -> Result<()>,
    ) -> Result<()> {
        let f = &self.fence;
        let req_due = f.req_done < f.req_version && f.req_inflight.is_none();
        let pub_due =
            f.pub_inflight.is_none() && f.answer.iter().zip(&f.answered).any(|(a, d)| a > d);
        if !req_due && !pub_due {
            // The common case, on every call: nothing to write, nothing allocated.
            return Ok(());
        }
        let (Some(lout), Some(out)) = (self.fence.lout, self.fence.outbox.clone()) else {
            return Ok(());
        };
        let Some((peer, rkeys)) = self.fence.peer.clone() else {
            return Ok(());
        };
        let n = self.data.len();
        let f = &self.fence;
        if f.req_done < f.req_version && f.req_inflight.is_none() {
            if let Some(j) = self.fence_path(|f, j| !f.busy_req[j]) {
                let base = lout.area(j) + FenceLayout::REQ;
                let words: Vec<u64> = self.fence.mine.clone();
                self.fab.ctrl_write(out.word(base), &words)?;
                let wr = self.fence_write(&out, base, n, peer, rkeys[j], j, REQ_WRITE, true);
                let version = self.fence.req_version;
                if self.post_fence(j, &[wr]) {
                    self.fence.busy_req[j] = true;
                    self.fence.req_inflight = Some((j, version));
                }
            }
        }
        let f = &self.fence;
        let due = (0..n).any(|k| {
            f.answer[k] > f.answered[k] && f.pub_inflight.is_none_or(|(_, a)| a[k] < f.answer[k])
        });
        if due && f.pub_inflight.is_none() {
            if let Some(j) = self.fence_path(|f, j| !f.busy_pub[j]) {
                let area = lout.area(j);
                let mut snap = vec![0u64; lout.snap];
                snapshot(&self.fab, &mut snap)?;
                self.fab
                    .ctrl_write(out.word(area + FenceLayout::SNAP), &snap)?;
                let mut acks = [0u64; MAX_PATHS];
                acks[..n].copy_from_slice(&self.fence.answer);
                self.fab
                    .ctrl_write(out.word(area + FenceLayout::ACK), &acks[..n])?;
                // The snapshot, then the acks on the same path: the peer reads an ack only once
                // the snapshot before it has landed.
                let snap_wr = self.fence_write(
                    &out,
                    area + FenceLayout::SNAP,
                    lout.snap,
                    peer,
                    rkeys[j],
                    j,
                    PUB_WRITE,
                    false,
                );
                let ack_wr = self.fence_write(
                    &out,
                    area + FenceLayout::ACK,
                    n,
                    peer,
                    rkeys[j],
                    j,
                    PUB_WRITE,
                    true,
                );
                if self.post_fence(j, &[snap_wr, ack_wr]) {
                    self.fence.stats.publishes += 1;
                    self.fence.busy_pub[j] = true;
                    self.fence.pub_inflight = Some((j, acks));
                }
            }
        }
        Ok(())
    }

    /// A usable data path for a fence write whose outbox area is free: a carrying one first.
    fn fence_path(&self, free: impl Fn(&Fence, usize) -> bool) -> Option<usize> {
        let n = self.data.len();
        let ok = |j: &usize| self.paths.is_up(*j) && free(&self.fence, *j);
        self.paths.carrying().find(ok).or_else(|| (0..n).find(ok))
    }

    /// A write of `words` outbox words at `off` (area of path `j`) to the same place in the peer's
    /// inbox, over path `j`.
    #[allow(clippy::too_many_arguments)]
    fn fence_write(
        &self,
        out: &CtrlMem,
        off: usize,
        words: usize,
        peer: u64,
        rkey: u32,
        j: usize,
        what: usize,
        signaled: bool,
    ) -> WriteWr {
        let path = self.data[j];
        let len = (8 * words) as u32;
        WriteWr {
            wr_id: wire::wr_id(WrKind::Fence, what | j, 0),
            local: LocalSeg {
                addr: out.word(off),
                len,
                lkey: out.reg.keys[path].lkey,
            },
            remote: RemoteSeg {
                addr: peer + 8 * off as u64,
                rkey,
            },
            imm: None,
            signaled,
            inline: len <= self.cfg.inline_max,
        }
    }

    /// Posts fence writes on data path `j`; a failed post marks `j` down (the next flush uses
    /// another path). Whether they were posted.
    fn post_fence(&mut self, j: usize, wrs: &[WriteWr]) -> bool {
        match self.fab.post_writes(self.data[j], wrs) {
            Ok(()) => true,
            Err(e) => {
                let why = format!("posting a failover message: {e}");
                if !self.mark_down(j, Instant::now(), &why) {
                    tracing::debug!("NET/switchless: {why}");
                }
                false
            }
        }
    }

    /// A fence write's completion on fabric path `path`.
    pub(super) fn fence_completion(
        &mut self,
        path: usize,
        c: &Completion,
        idx: usize,
        now: Instant,
    ) {
        let j = idx & 0xff;
        let Some(k) = self.data_index(path).filter(|&k| k == j) else {
            return;
        };
        let f = &mut self.fence;
        if idx & PUB_WRITE != 0 {
            f.busy_pub[j] = false;
            if let Some((_, acks)) = f.pub_inflight.filter(|(p, _)| *p == j) {
                if c.status.is_success() {
                    for (a, &v) in f.answered.iter_mut().zip(&acks) {
                        *a = (*a).max(v);
                    }
                }
                f.pub_inflight = None;
            }
        } else {
            f.busy_req[j] = false;
            if let Some((_, version)) = f.req_inflight.filter(|(p, _)| *p == j) {
                if c.status.is_success() {
                    f.req_done = f.req_done.max(version);
                }
                f.req_inflight = None;
            }
        }
        if !c.status.is_success() && self.paths.is_up(k) {
            let why = format!("failover message write: {}", c.status);
            if !self.mark_down(k, now, &why) {
                tracing::debug!(
                    "NET/switchless: a failover message on the last path failed: {why}"
                );
            }
        }
    }
}
