//! The receiving side of a connection (NCCL's `recvComm`): posts clear-to-send entries into the
//! sender's FIFO, counts the immediates per buffer and reads the size records; flushes GPU receives.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{
    Core, FlushBuf, ProtocolConfig, RecvBuf, ReqKind, Request, Sizes, next_generation, timed_out,
};
use crate::error::{Error, Result};
use crate::transport::fabric::{
    Completion, CtrlMem, Fabric, LocalSeg, MemKind, RECV_DEPTH, ReadWr, RemoteSeg, WriteWr,
};
use crate::transport::metrics::Meter;
use crate::transport::wire::{
    self, CtrlInfo, CtsElem, FIFO_DEPTH, FenceLayout, Imm, KEY_WORDS, MAX_RECVS, MAX_REQUESTS,
    RECV_SNAP_WORDS, SEND_SNAP_WORDS, SLOT_WORDS, WrKind,
};

#[derive(Debug, Clone, Copy, Default)]
struct ElemState {
    posted: u64,
    /// Pieces expected (0: none seen yet).
    expected: u8,
    /// Pieces seen (bit per piece index): a piece that arrives twice counts once.
    seen: u8,
    done: bool,
    size: u64,
    /// Bytes of the pieces other than the first, as their writes arrived (metrics: the first
    /// piece's immediate rides on the 8-byte size record, so its bytes are the rest of the size).
    others: u64,
    /// Data path the first piece's immediate arrived on.
    first_path: u8,
}

#[derive(Debug, Default)]
struct RecvReq {
    in_use: bool,
    generation: u32,
    seq: u64,
    n: usize,
    elems: [ElemState; MAX_RECVS],
    cts_pending: u8,
    /// Data path the clear-to-send was (last) posted on.
    cts_path: usize,
    /// Its place among the clear-to-send writes posted on that path (a signaled completion of a
    /// later one there says it landed too).
    cts_ticket: u64,
    /// The clear-to-send is on a path marked down, not known landed: posted again only once the
    /// sender says it lacks it (the failover fence, `fence.rs`).
    cts_parked: bool,
    /// The clear-to-send is held back (written to the shadow, not posted): it goes out with the
    /// entries after it in one write ([`RecvComm::flush_held`]). Never on a path until then.
    cts_held: bool,
    /// When the clear-to-send was (last) posted.
    cts_at: Option<Instant>,
    error: Option<Error>,
    posted: Option<Instant>,
    /// The registration of each buffer (by token): its keys on a standby path come at the
    /// path's first use, and go to the sender in a key update.
    tokens: [u64; MAX_RECVS],
    /// Data paths whose keys the clear-to-send lacked and whose key update has not been seen
    /// landed (bit per data path).
    keys_missing: u8,
    /// Data paths with a key update of this receive in flight.
    keys_posted: u8,
}

#[derive(Debug, Default)]
struct FlushReq {
    in_use: bool,
    generation: u32,
    pending: u32,
    /// Reads that completed well (a flush needs one, on every device that still carries).
    ok: u32,
    error: Option<Error>,
    /// The error of a read on a device that is down now: the flush goes on without it, and
    /// fails with this only when no read completed well.
    lost: Option<Error>,
    posted: Option<Instant>,
}

/// The receiving side of a connection (NCCL's `recvComm`).
pub struct RecvComm<F: Fabric> {
    core: Core<F>,
    shadow: CtrlMem,
    records: CtrlMem,
    scratch: CtrlMem,
    peer: Option<CtrlInfo>,
    head: u64,
    slots: Vec<RecvReq>,
    flushes: Vec<FlushReq>,
    flush_free: Vec<usize>,
    /// A failure that concerns every request (a receive queue error, a protocol violation).
    fatal: Option<Error>,
    slot_words: [u64; SLOT_WORDS],
    /// Source words of the key updates, one [`KEY_WORDS`] area per data path and slot.
    keysrc: CtrlMem,
    /// The sender's key area (its address: after its FIFO and fence inbox).
    keys_at: u64,
    /// FIFO slots whose receive lacks keys (bit per slot): scanned for key updates to post.
    keys_open: u32,
    /// Per data path: clear-to-send writes posted on it (the next one's ticket).
    cts_posts: Vec<u64>,
    /// Entries held back, not posted yet: the newest ones, sequences `head - held .. head`.
    held: u64,
    /// Shortest round trip seen: from posting a clear-to-send to its signaled completion, or
    /// to the first data of its receive (each at least the network's round trip, more when
    /// polled late).
    rtt: Option<Duration>,
    /// Clear-to-send entries posted and the writes that carried them.
    cts_stats: CtsStats,
}

/// What a receiving comm's clear-to-send writes carried ([`RecvComm::cts_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CtsStats {
    /// Entries posted (an entry posted again after a failover counts again).
    pub entries: u64,
    /// Writes that carried them (several consecutive entries go in one write when held back).
    pub writes: u64,
}

/// A clear-to-send write is signaled once per this many on its path (and the first): NCCL's
/// "once per FIFO window". The others complete silently; a signaled completion implies them (a
/// path executes in order). Unsignaled ones hold send-queue slots until a later signaled one is
/// polled; every progress call polls, and a signaled write is acknowledged before the sender can
/// have read it and written the data that completes its receive, so about `2 × CTS_SIGNAL_EVERY`
/// are held at a time, within the `2 × FIFO_DEPTH` of [`SEND_QUEUE_DEPTH`] kept for them.
///
/// [`SEND_QUEUE_DEPTH`]: crate::transport::fabric::SEND_QUEUE_DEPTH
const CTS_SIGNAL_EVERY: u64 = FIFO_DEPTH as u64 / 2;

/// A new clear-to-send entry is held back (not posted yet) while the sender holds at least this
/// many entries unused ([`RecvComm::in_hand`]): it has work in hand, and the entry can wait to
/// travel with the next ones in one write. Under that, held entries go at once: the sender
/// could run dry before a later write lands. Three, not two: the receiver learns that the
/// sender took an entry only when its data arrives, so one of those counted may be taken
/// already (with 2, 64 KiB streamed over one 400 Gb/s path lost 0.25% in the model).
const CTS_HOLD_AHEAD: usize = 3;

/// At most this many entries are held back: they go in one write of at most 512 + 472 bytes, one
/// packet at every RoCE MTU from 1024 on. One packet, because the write also rewrites the unused
/// tail of the first entry's slot, which the sender never checks: in one packet it lands with
/// the entry the sender does check, so it cannot land after that slot's next entry (a round trip
/// later, possibly on another path). Across packets it could, after a retransmission on a lossy
/// path, and a longer next entry would then fail its check: a stall.
const CTS_BATCH_MAX: u64 = 2;

/// Keeps in `rtt` the shortest round trip seen: from `posted` (a clear-to-send went out) to `now`
/// (its completion, or its receive's first data).
fn shortest_round_trip(rtt: &mut Option<Duration>, posted: Instant, now: Instant) {
    let d = now.saturating_duration_since(posted);
    *rtt = Some(rtt.map_or(d, |x| x.min(d)));
}

/// Clear-to-send writes of at most this many bytes are marked inline (one buffer: 80 bytes), unless
/// [`ProtocolConfig::inline_max`] is 0 or larger; the fabric inlines up to what the device allows.
const CTS_INLINE_BYTES: u32 = 128;

impl<F: Fabric> RecvComm<F> {
    /// Allocates the CTS shadow, the size records and the flush scratch words, and posts
    /// [`RECV_DEPTH`] receives on every data path.
    pub fn new(fab: F, cfg: ProtocolConfig) -> Result<RecvComm<F>> {
        let mut core = Core::new(fab, cfg)?;
        // Standby paths register at their first use; the keys made then go to the sender in
        // key updates (`post_keys`).
        core.lazy = true;
        let npaths = core.data.len();
        let shadow = core.alloc(FIFO_DEPTH * SLOT_WORDS)?;
        // The sender writes its fence words after the records (its snapshot: the FIFO's state).
        let lin = FenceLayout {
            npaths,
            snap: SEND_SNAP_WORDS,
        };
        let records = core.alloc(FIFO_DEPTH * MAX_RECVS + lin.words())?;
        let lout = FenceLayout {
            npaths,
            snap: RECV_SNAP_WORDS,
        };
        core.fence_init(records.word(FIFO_DEPTH * MAX_RECVS), lin, lout)?;
        let scratch = core.alloc(MAX_REQUESTS)?;
        let keysrc = core.alloc(wire::key_area_words(npaths))?;
        for k in 0..npaths {
            let path = core.data[k];
            for _ in 0..RECV_DEPTH {
                core.fab
                    .post_recv(path, wire::wr_id(WrKind::Recv, path, 0))?;
            }
            core.fence.recvs[k] = RECV_DEPTH;
        }
        let mut slots = Vec::with_capacity(FIFO_DEPTH);
        slots.resize_with(FIFO_DEPTH, || RecvReq {
            generation: 1,
            ..RecvReq::default()
        });
        let mut flushes = Vec::with_capacity(MAX_REQUESTS);
        flushes.resize_with(MAX_REQUESTS, || FlushReq {
            generation: 1,
            ..FlushReq::default()
        });
        Ok(RecvComm {
            core,
            shadow,
            records,
            scratch,
            peer: None,
            head: 0,
            slots,
            flushes,
            flush_free: (0..MAX_REQUESTS).rev().collect(),
            fatal: None,
            slot_words: [0; SLOT_WORDS],
            keysrc,
            keys_at: 0,
            keys_open: 0,
            cts_posts: vec![0; npaths],
            held: 0,
            rtt: None,
            cts_stats: CtsStats::default(),
        })
    }

    /// What the sender needs: the size-record array's address and keys.
    pub fn local_info(&self) -> CtrlInfo {
        self.core.info(&self.records)
    }

    /// Accepts the sender's [`SendComm::local_info`] (its CTS FIFO).
    ///
    /// [`SendComm::local_info`]: super::SendComm::local_info
    pub fn connect(&mut self, peer: CtrlInfo) -> Result<()> {
        // The FIFO, then the fence inbox for this side's words.
        let inbox = FenceLayout {
            npaths: self.core.data.len(),
            snap: RECV_SNAP_WORDS,
        };
        // ... then the key area.
        let npaths = self.core.data.len();
        let keys_off = FIFO_DEPTH * SLOT_WORDS + inbox.words();
        self.core
            .check_peer(&peer, keys_off + wire::key_area_words(npaths), "CTS FIFO")?;
        self.core.fence_connect(
            peer.addr + 8 * (FIFO_DEPTH * SLOT_WORDS) as u64,
            peer.rkeys.clone(),
        );
        self.keys_at = peer.addr + 8 * keys_off as u64;
        self.peer = Some(peer);
        Ok(())
    }

    registration_methods!();

    /// Posts a grouped receive of 1..=[`MAX_RECVS`] buffers (NCCL `irecv`). `Ok(None)` means "call
    /// again later": the FIFO slot this receive needs is still held by an older request. `now` is the
    /// current time (the request timeout counts from it, and it dates the clear-to-send).
    ///
    /// The entry is posted at once unless the sender holds three or more entries unused: then it
    /// is held back, to go with the next ones in one write (from here, or from `test` once fewer
    /// are in hand; see `docs/guide/transport.md`).
    pub fn irecv(&mut self, now: Instant, bufs: &[RecvBuf<'_>]) -> Result<Option<Request>> {
        if self.peer.is_none() {
            return Err(Error::InvalidArgument(
                "irecv on a recv comm that is not connected".into(),
            ));
        }
        if self.core.closed {
            return Err(Error::InvalidArgument("irecv on a closed recv comm".into()));
        }
        if let Some(e) = &self.fatal {
            return Err(e.clone());
        }
        let n = bufs.len();
        if n == 0 || n > MAX_RECVS {
            return Err(Error::InvalidArgument(format!(
                "irecv of {n} buffers; accepted: 1..={MAX_RECVS}"
            )));
        }
        for b in bufs {
            b.mh.check_covers(b.addr, b.size, "receive")?;
        }
        let slot = (self.head % FIFO_DEPTH as u64) as usize;
        if self.slots[slot].in_use {
            return Ok(None);
        }
        let npaths = self.core.data.len();
        let mut elems = [CtsElem::default(); MAX_RECVS];
        let mut tokens = [0u64; MAX_RECVS];
        // Paths not registered on yet (standby, deferred): the entry goes without their keys,
        // which a key update brings once failover makes such a path carry.
        let mut missing = 0u8;
        for ((el, t), b) in elems.iter_mut().zip(tokens.iter_mut()).zip(bufs) {
            el.addr = b.addr;
            el.size = b.size;
            el.tag = b.tag;
            *t = b.mh.reg.token;
            for (k, &p) in self.core.data.iter().enumerate() {
                match self.core.rkey(&b.mh.reg, p) {
                    Some(key) => el.rkeys[k] = key,
                    None if self.core.deferred & (1 << k) != 0 => missing |= 1 << k,
                    None => {
                        return Err(Error::InvalidArgument(format!(
                            "receive buffer {:#x}+{} bytes: its registration has no key on data \
                             path {k}, where this connection registered (a handle of another comm?)",
                            b.addr, b.size
                        )));
                    }
                }
            }
        }
        let seq = self.head;
        let base = slot * SLOT_WORDS;
        // The whole entry, index, keyless-path bits and check word included: one write carries it.
        let len =
            wire::encode_slot_lacking(seq, &elems[..n], npaths, missing, &mut self.slot_words);
        self.core
            .fab
            .ctrl_write(self.shadow.word(base), &self.slot_words[..len])?;

        let k = self.core.paths.nth_up(seq).unwrap_or(0);
        let r = &mut self.slots[slot];
        r.cts_path = k;
        r.cts_held = true;
        r.in_use = true;
        r.seq = seq;
        r.n = n;
        for (st, b) in r.elems.iter_mut().zip(bufs) {
            *st = ElemState {
                posted: b.size,
                ..ElemState::default()
            };
        }
        r.cts_pending = 1;
        r.cts_parked = false;
        r.error = None;
        r.posted = self.core.cfg.request_timeout.map(|_| now);
        r.tokens = tokens;
        r.keys_missing = missing;
        r.keys_posted = 0;
        if missing != 0 {
            self.keys_open |= 1 << slot;
        }
        self.head += 1;
        self.held += 1;
        let generation = r.generation;
        // Held back only while the sender has work in hand (it is not waiting for this entry),
        // and at most a batch's worth.
        if self.held >= CTS_BATCH_MAX || self.in_hand(now) < CTS_HOLD_AHEAD {
            if let Err(err) = self.flush_held(now) {
                self.release_slot(slot);
                return Err(err);
            }
        }
        Ok(Some(Request::new(ReqKind::Recv, slot, generation)))
    }

    /// Entries the sender is known to hold unused: posted more than twice the shortest round
    /// trip ago and no data of their receive seen yet. An entry the sender was waiting for
    /// brings data within one round trip (an entry still on its way, or taken with its data on
    /// the way, does not count); the doubled margin absorbs a round trip measured late (at a
    /// poll, not at arrival) and jitter. Parked and held entries do not count.
    fn in_hand(&self, now: Instant) -> usize {
        let Some(rtt) = self.rtt else { return 0 };
        let age = rtt.saturating_mul(2);
        self.slots
            .iter()
            .filter(|r| {
                r.in_use
                    && !r.cts_held
                    && !r.cts_parked
                    && r.error.is_none()
                    && r.cts_at
                        .is_some_and(|t| now.saturating_duration_since(t) > age)
                    && r.elems[..r.n].iter().all(|e| e.seen == 0 && !e.done)
            })
            .count()
    }

    /// Posts every held entry: one write per run of consecutive FIFO slots (split at the wrap),
    /// on the path of the run's first entry. A failed post marks its path down (its entries are
    /// parked like any posted one); on the last usable path the comm fails.
    fn flush_held(&mut self, now: Instant) -> Result<()> {
        if let Some(e) = &self.fatal {
            self.held = 0;
            return Err(e.clone());
        }
        while self.held > 0 {
            let first = self.head - self.held;
            let s0 = (first % FIFO_DEPTH as u64) as usize;
            let run = self.held.min((FIFO_DEPTH - s0) as u64) as usize;
            let k = self.core.paths.nth_up(first).unwrap_or(0);
            for r in &mut self.slots[s0..s0 + run] {
                r.cts_path = k;
                r.cts_held = false;
            }
            self.held -= run as u64;
            if let Err(err) = self.post_cts_run(s0, run, k, now) {
                // A failed batch may have been posted in part: its entries are settled with the
                // rest of the path's work (parked, posted again once the sender says it lacks it).
                if !self.core.mark_down(k, now, &err.to_string()) {
                    // The entries' state at the sender is unknown: this comm can take no more.
                    self.held = 0;
                    self.fatal.get_or_insert(err.clone());
                    return Err(err);
                }
            }
            self.fail_over();
        }
        Ok(())
    }

    /// Posts slot `slot`'s clear-to-send (already in the shadow) on data path `k`: one write of the
    /// whole entry, inline where the device allows; the sender takes it only once every word of it
    /// has landed ([`wire::check_slot`]). Signaled once per [`CTS_SIGNAL_EVERY`] on the path.
    /// Posting it again (failover) writes the same words: the sender has not reused the slot.
    fn post_cts(&mut self, slot: usize, k: usize, now: Instant) -> Result<()> {
        self.post_cts_run(slot, 1, k, now)
    }

    /// Posts the entries of the `run` consecutive slots from `slot` (no wrap) in one write: from
    /// the first slot's start to the last entry's check word, the unused tails of the slots
    /// between included (the shadow's words; the sender reads only an entry's own words, and
    /// judges each entry whole on its own). A slot is written again only after its receive
    /// completed, a round trip after the sender read the entry, long after this write landed.
    fn post_cts_run(&mut self, slot: usize, run: usize, k: usize, now: Instant) -> Result<()> {
        let Some(peer) = self.peer.as_ref() else {
            return Err(Error::Internal("recv comm lost its peer".into()));
        };
        let r = &self.slots[slot];
        let base = slot * SLOT_WORDS;
        let last = &self.slots[slot + run - 1];
        let len = 8 * ((run - 1) * SLOT_WORDS + wire::slot_entry_words(last.n)) as u32;
        let path = self.core.data[k];
        let ticket = self.cts_posts[k];
        // A batch of one (one doorbell; fabrics count batches there).
        self.core.fab.post_writes(
            path,
            &[WriteWr {
                wr_id: wire::wr_id(WrKind::Cts, slot, r.generation),
                local: LocalSeg {
                    addr: self.shadow.word(base),
                    len,
                    lkey: self.shadow.reg.keys[path].lkey,
                },
                remote: RemoteSeg {
                    addr: peer.addr + 8 * base as u64,
                    rkey: peer.rkeys[k],
                },
                imm: None,
                signaled: ticket % CTS_SIGNAL_EVERY == 0,
                // The fabric honours the hint up to what the queue pair allows (verbs: the
                // device's max_inline_data): the entry is small, the NIC need not read it back.
                inline: self.core.cfg.inline_max > 0
                    && len <= self.core.cfg.inline_max.max(CTS_INLINE_BYTES),
            }],
        )?;
        self.cts_posts[k] = ticket + 1;
        for r in &mut self.slots[slot..slot + run] {
            r.cts_ticket = ticket;
            r.cts_at = Some(now);
        }
        self.cts_stats.entries += run as u64;
        self.cts_stats.writes += 1;
        Ok(())
    }

    /// Parks every clear-to-send on a path marked down and not known landed: it is posted again
    /// only once the sender, its end of that path sealed, says it lacks it ([`Self::resolve`]).
    fn fail_over(&mut self) {
        while let Some(k) = self.core.newly_down.pop() {
            for r in self.slots.iter_mut() {
                if r.in_use
                    && r.cts_pending > 0
                    && !r.cts_held
                    && r.cts_path == k
                    && r.error.is_none()
                {
                    r.cts_parked = true;
                }
                // A key update on it may be lost: posted again once the path is back (the same
                // words: the sender takes an update only for the entry it names).
                r.keys_posted &= !(1 << k);
            }
        }
    }

    /// Posts the key updates that are due: for each receive whose clear-to-send lacked a data
    /// path's keys, once this end has registered there (failover made the path carry) and while
    /// the path is up, the buffers' keys on it, over that path into the sender's key area for
    /// the slot: the keys, then word 0 naming the entry's sequence number (in order on one
    /// path). The sender moves no piece of the receive onto the path before it read them.
    fn post_keys(&mut self, now: Instant) {
        if self.keys_open == 0 || self.fatal.is_some() {
            return;
        }
        let mut open = self.keys_open;
        while open != 0 {
            let slot = open.trailing_zeros() as usize;
            open &= open - 1;
            let r = &self.slots[slot];
            if !r.in_use || r.keys_missing == 0 || r.error.is_some() {
                self.keys_open &= !(1 << slot);
                continue;
            }
            if r.cts_held {
                continue; // its update follows the entry
            }
            for k in 0..self.core.data.len() {
                let bit = 1u8 << k;
                let r = &self.slots[slot];
                if r.keys_missing & bit == 0
                    || r.keys_posted & bit != 0
                    || r.error.is_some()
                    || self.core.deferred & bit != 0
                    || !self.core.paths.is_up(k)
                {
                    continue;
                }
                if let Err(err) = self.post_key_update(slot, k) {
                    if !self.core.mark_down(k, now, &err.to_string()) {
                        self.slots[slot].error.get_or_insert(err);
                    }
                    self.fail_over();
                } else {
                    self.slots[slot].keys_posted |= bit;
                    self.core.fence.stats.keys += 1;
                }
            }
        }
    }

    /// Writes slot `slot`'s key update for data path `k` (see [`Self::post_keys`]).
    fn post_key_update(&mut self, slot: usize, k: usize) -> Result<()> {
        let r = &self.slots[slot];
        let path = self.core.data[k];
        let mut rkeys = [0u32; MAX_RECVS];
        for (e, key) in rkeys.iter_mut().enumerate().take(r.n) {
            let Some(reg) = self.core.regs.get(&r.tokens[e]).filter(|g| g.has(path)) else {
                return Err(Error::InvalidUsage(format!(
                    "receive buffer {e} of FIFO sequence {} was deregistered while its receive \
                     was outstanding: no key for data path {k}",
                    r.seq
                )));
            };
            *key = reg.keys[path].rkey;
        }
        let mut words = [0u64; KEY_WORDS];
        wire::encode_keys(r.seq, &rkeys, &mut words);
        let area = wire::key_area(k, slot);
        let src = self.keysrc.word(area);
        self.core.fab.ctrl_write(src, &words)?;
        let Some(peer) = self.peer.as_ref() else {
            return Err(Error::Internal("recv comm lost its peer".into()));
        };
        let lkey = self.keysrc.reg.keys[path].lkey;
        let rkey = peer.rkeys[k];
        let dst = self.keys_at + 8 * area as u64;
        let id = wire::wr_id(WrKind::Keys, k * FIFO_DEPTH + slot, r.generation);
        let inline_max = self.core.cfg.inline_max;
        let body = 8 * (KEY_WORDS - 1) as u32;
        self.core.fab.post_writes(
            path,
            &[
                WriteWr {
                    wr_id: id,
                    local: LocalSeg {
                        addr: src + 8,
                        len: body,
                        lkey,
                    },
                    remote: RemoteSeg {
                        addr: dst + 8,
                        rkey,
                    },
                    imm: None,
                    signaled: false,
                    inline: body <= inline_max,
                },
                WriteWr {
                    wr_id: id,
                    local: LocalSeg {
                        addr: src,
                        len: 8,
                        lkey,
                    },
                    remote: RemoteSeg { addr: dst, rkey },
                    imm: None,
                    signaled: true,
                    inline: 8 <= inline_max,
                },
            ],
        )
    }

    /// The sender acknowledged this end's stop of data path `k` with the snapshot in inbox area
    /// `j` (its FIFO's index words, taken after it sealed `k`): each clear-to-send parked on `k`
    /// either landed (done) or never will (posted again, on a survivor).
    fn resolve(&mut self, k: usize, j: usize, now: Instant) -> Result<()> {
        let Some((at, words)) = self.core.fence.snapshot(j) else {
            return Ok(());
        };
        let mut snap = vec![0u64; words];
        self.core.fab.ctrl_read(at, &mut snap)?;
        for (slot, &idx) in snap.iter().enumerate().take(self.slots.len()) {
            let r = &mut self.slots[slot];
            if !r.in_use || !r.cts_parked || r.cts_path != k || r.error.is_some() {
                continue;
            }
            r.cts_parked = false;
            let want = r.seq + 1;
            if idx == want {
                r.cts_pending = 0;
                self.core.fence.stats.landed += 1;
            } else if idx > want {
                let err = Error::Remote(format!(
                    "the sender's failover snapshot shows FIFO slot {slot} at sequence {}, ahead \
                     of the receive posted there ({}) (corrupt or hostile write)",
                    idx - 1,
                    r.seq
                ));
                r.error.get_or_insert(err);
            } else {
                self.core.fence.stats.resent += 1;
                let seq = r.seq;
                let Some(j2) = self.core.paths.nth_up(seq) else {
                    let err = Error::Internal("no usable path left to fail over to".into());
                    self.slots[slot].error.get_or_insert(err);
                    continue;
                };
                self.slots[slot].cts_path = j2;
                if let Err(err) = self.post_cts(slot, j2, now) {
                    if !self.core.mark_down(j2, now, &err.to_string()) {
                        self.slots[slot].error.get_or_insert(err);
                    }
                }
            }
        }
        Ok(())
    }

    /// Failover's part of progress: the fence's words read and written, parked work settled.
    fn settle(&mut self, now: Instant) -> Result<()> {
        self.core.fence_poll(now)?;
        self.fail_over();
        while let Some((k, j)) = self.core.fence.acked.pop() {
            self.resolve(k, j, now)?;
            self.fail_over();
        }
        if self.fatal.is_some() {
            // A slot released on an error would read as a completed receive: answer nothing.
            return Ok(());
        }
        if self.core.take_activated() {
            // A standby path was registered at its first use: the receives posted before owe
            // the sender its keys.
            tracing::debug!(
                slots = self.keys_open.count_ones(),
                "NET/switchless: key updates due for receives posted before a standby path's first use"
            );
        }
        self.post_keys(now);
        // This end's snapshot: per slot and buffer, the newest sequence and the pieces landed.
        let slots = &self.slots;
        self.core.fence_flush(|_, snap| {
            for (s, r) in slots.iter().enumerate() {
                for e in 0..MAX_RECVS {
                    snap[s * MAX_RECVS + e] = if r.in_use {
                        let st = &r.elems[e];
                        let seen = if e >= r.n {
                            0
                        } else if st.done {
                            0xff
                        } else {
                            st.seen
                        };
                        wire::have_word(r.seq, seen)
                    } else if r.generation > 1 {
                        // Released: its last receive completed (a failed one ends the comm).
                        wire::have_word(r.seq, 0xff)
                    } else {
                        0
                    };
                }
            }
            Ok(())
        })
    }

    /// Flushes GPU-direct receives (NCCL `iflush`): one RDMA read per loopback path from the last
    /// non-empty GPU buffer. `Ok(None)` means "nothing to flush" (no GPU buffer received data, or the
    /// fabric has no loopback path); it is not a retry. More than [`MAX_REQUESTS`] flushes outstanding
    /// is an [`Error::Internal`] (never a silent `None`, which NCCL would take as done). `now` is the
    /// current time (the request timeout counts from it).
    pub fn iflush(&mut self, now: Instant, bufs: &[FlushBuf<'_>]) -> Result<Option<Request>> {
        if self.core.closed {
            return Err(Error::InvalidArgument(
                "iflush on a closed recv comm".into(),
            ));
        }
        let Some(target) = bufs
            .iter()
            .rev()
            .find(|b| b.size > 0 && b.mh.kind == MemKind::Cuda)
        else {
            return Ok(None);
        };
        target.mh.check_covers(target.addr, 1, "flush")?;
        if self.core.loops.is_empty() {
            return Ok(None);
        }
        let Some(idx) = self.flush_free.pop() else {
            return Err(Error::Internal(format!(
                "more than {MAX_REQUESTS} flushes outstanding on one recv comm"
            )));
        };
        let generation = self.flushes[idx].generation;
        let id = wire::wr_id(WrKind::Flush, idx, generation);
        let mut posted = 0;
        let mut lost = None;
        let loops = self.core.loops.clone();
        for lp in loops {
            // Only devices that still have a usable data path of this connection: a dead
            // device's loopback would fail (or hang for the RC retry budget), and failover moved
            // its work to the others.
            // Nor a device this connection never registered on (standby, deferred): no
            // receive wrote through it.
            if !self.core.device_live(lp) {
                continue;
            }
            let Some(rkey) = self.core.rkey(&target.mh.reg, lp) else {
                continue;
            };
            let wr = ReadWr {
                wr_id: id,
                local: LocalSeg {
                    addr: self.scratch.word(idx),
                    len: 1,
                    lkey: self.scratch.reg.keys[lp].lkey,
                },
                remote: RemoteSeg {
                    addr: target.addr,
                    rkey,
                },
            };
            match self.core.fab.post_read(lp, &wr) {
                Ok(()) => posted += 1,
                Err(e) => {
                    let why = format!("posting a flush read: {e}");
                    if !self.core.device_failed(lp, now, &why) {
                        self.flush_free.push(idx);
                        return Err(e);
                    }
                    lost = Some(e);
                }
            }
        }
        if posted == 0 {
            self.flush_free.push(idx);
            return Err(lost.unwrap_or_else(|| {
                Error::Internal(
                    "flush: no device of this connection has both a usable data path and a \
                     loopback path"
                        .into(),
                )
            }));
        }
        let f = &mut self.flushes[idx];
        f.in_use = true;
        f.pending = posted;
        f.ok = 0;
        f.error = None;
        f.lost = lost;
        f.posted = self.core.cfg.request_timeout.map(|_| now);
        Ok(Some(Request::new(ReqKind::Flush, idx, generation)))
    }

    fn release_flush(&mut self, idx: usize) {
        let f = &mut self.flushes[idx];
        f.in_use = false;
        f.generation = next_generation(f.generation);
        f.error = None;
        self.flush_free.push(idx);
    }

    fn release_slot(&mut self, slot: usize) {
        self.keys_open &= !(1 << slot);
        let r = &mut self.slots[slot];
        r.keys_missing = 0;
        r.keys_posted = 0;
        r.in_use = false;
        r.generation = next_generation(r.generation);
        r.error = None;
    }

    /// Posts the held entries once the sender runs short of entries in hand.
    fn flush_due(&mut self, now: Instant) -> Result<()> {
        if self.held > 0 && self.in_hand(now) < CTS_HOLD_AHEAD {
            self.flush_held(now)?;
        }
        Ok(())
    }

    fn progress(&mut self, now: Instant) -> Result<()> {
        self.flush_due(now)?;
        let slots = &mut self.slots;
        let flushes = &mut self.flushes;
        let records = &self.records;
        let fatal = &mut self.fatal;
        let rtt = &mut self.rtt;
        let polled = self.core.poll_all(|core, path, c| {
            let Some((kind, idx, generation)) = wire::split_wr_id(c.wr_id) else {
                return Err(Error::Internal(format!(
                    "recv comm got a completion with foreign wr_id {:#x} on path {path}",
                    c.wr_id
                )));
            };
            let k = core.data_index(path);
            match kind {
                WrKind::Cts => {
                    let Some(r) = slots
                        .get_mut(idx)
                        .filter(|r| r.in_use && r.generation == generation)
                    else {
                        return Ok(());
                    };
                    let Some(k) = k.filter(|&k| k == r.cts_path) else {
                        return Ok(()); // the clear-to-send was posted again on another path
                    };
                    if c.status.is_success() {
                        // A round trip of the network alone (the write and its acknowledgement),
                        // whatever the sender does.
                        if let Some(t) = r.cts_at {
                            shortest_round_trip(rtt, t, now);
                        }
                        // Landed, whatever became of the path since.
                        r.cts_pending = 0;
                        r.cts_parked = false;
                        // So did every entry posted before it on the path (signaled once per
                        // window, executed in order). A parked one is left to the fence: it may
                        // have gone out on the path's queue pair before a rebuild.
                        let ticket = r.cts_ticket;
                        for o in slots.iter_mut() {
                            if o.in_use
                                && o.cts_path == k
                                && o.cts_ticket <= ticket
                                && !o.cts_parked
                                && !o.cts_held
                            {
                                o.cts_pending = 0;
                            }
                        }
                    } else if !core.paths.is_up(k) {
                        // The path is down: the fence settles its entries.
                    } else if !core.mark_down(k, now, &format!("clear-to-send write: {}", c.status))
                        || c.status.blames_request()
                    {
                        let err = core.completion_error(path, &c, "clear-to-send write");
                        r.error.get_or_insert(err);
                    }
                }
                WrKind::Fence => {
                    core.fence_completion(path, &c, idx, now);
                }
                WrKind::Keys => {
                    let (kk, slot) = (idx / FIFO_DEPTH, idx % FIFO_DEPTH);
                    let Some(r) = slots
                        .get_mut(slot)
                        .filter(|r| r.in_use && r.generation == generation)
                    else {
                        return Ok(()); // the receive completed: the sender had what it needed
                    };
                    let bit = 1u8 << (kk & 7);
                    r.keys_posted &= !bit;
                    if c.status.is_success() {
                        // In the sender's key area, whatever became of the path since.
                        r.keys_missing &= !bit;
                    } else if k.is_some_and(|k| core.paths.is_up(k))
                        && !k.is_some_and(|k| {
                            core.mark_down(k, now, &format!("key update write: {}", c.status))
                        })
                    {
                        let err = core.completion_error(path, &c, "key update write");
                        r.error.get_or_insert(err);
                    }
                }
                WrKind::Flush => {
                    let Some(f) = flushes
                        .get_mut(idx)
                        .filter(|f| f.in_use && f.generation == generation)
                    else {
                        return Ok(());
                    };
                    f.pending = f.pending.saturating_sub(1);
                    if c.status.is_success() {
                        f.ok += 1;
                    } else {
                        // A flush error on a dead device marks its data paths down (failover
                        // moves its work); the flush completes on the other devices.
                        let err = core.completion_error(path, &c, "flush read");
                        if core.device_failed(path, now, &c.status.to_string()) {
                            f.lost.get_or_insert(err);
                        } else {
                            f.error.get_or_insert(err);
                        }
                    }
                }
                WrKind::Recv => {
                    if let Some(n) = k.and_then(|k| core.fence.recvs.get_mut(k)) {
                        *n = n.saturating_sub(1);
                    }
                    let up = k.is_some_and(|k| core.paths.is_up(k));
                    if !c.status.is_success() {
                        // A down path's receives are flushed: nothing to do.
                        let why = format!("receive of an immediate: {}", c.status);
                        if up && !k.is_some_and(|k| core.mark_down(k, now, &why)) {
                            let err = core.completion_error(path, &c, "receive of an immediate");
                            fatal.get_or_insert(err);
                        }
                        return Ok(());
                    }
                    if !core.closed && up {
                        core.fab.post_recv(path, c.wr_id)?;
                        if let Some(n) = k.and_then(|k| core.fence.recvs.get_mut(k)) {
                            *n += 1;
                        }
                    }
                    // Data that landed counts whatever became of the path since.
                    let dedupe = core.cfg.failover.enabled;
                    let (fab, meter) = (&core.fab, &mut core.meter);
                    if let Err(err) =
                        Self::on_imm(fab, records, slots, &c, dedupe, (meter, k), (now, rtt))
                    {
                        tracing::warn!(path, label = %core.labels[path], "NET/switchless: {err}");
                        fatal.get_or_insert(err);
                    }
                }
                WrKind::Send => {
                    return Err(Error::Internal(format!(
                        "recv comm got a send completion (wr_id {:#x}) on path {path}",
                        c.wr_id
                    )));
                }
            }
            Ok(())
        })?;
        // A path whose link died silently shows up here, not in a completion.
        self.core.check_paths_busy(now, polled);
        self.settle(now)?;
        let mut rebuilt = Vec::new();
        self.core.probe(now, &mut rebuilt)?;
        for k in rebuilt {
            // A fresh queue pair: its receives, before the peer may write with an immediate.
            let path = self.core.data[k];
            for _ in 0..RECV_DEPTH {
                self.core
                    .fab
                    .post_recv(path, wire::wr_id(WrKind::Recv, path, 0))?;
            }
            self.core.fence.recvs[k] = RECV_DEPTH;
        }
        self.flush_due(now)
    }

    /// Counts one piece's immediate; once every piece of the buffer is in, reads the size record (a
    /// one-write message: takes the write's length).
    /// With `late_ok` (failover on), an immediate of a piece already counted, or of the slot's
    /// previous, completed use, is a piece sent again after its path failed: ignored.
    fn on_imm(
        fab: &F,
        records: &CtrlMem,
        slots: &mut [RecvReq],
        c: &Completion,
        late_ok: bool,
        (meter, k): (&mut Meter, Option<usize>),
        (now, rtt): (Instant, &mut Option<Duration>),
    ) -> Result<()> {
        let Some(v) = c.imm else {
            return Err(Error::Remote(
                "write-with-immediate completion without an immediate".into(),
            ));
        };
        let imm = Imm::decode(v)?;
        let r = &mut slots[imm.slot];
        let current = r.in_use && (r.seq as u16) == imm.seq16;
        if !current {
            // The slot's previous use: the one before this (in use), or the last one (free).
            let previous = if r.in_use {
                r.seq.checked_sub(FIFO_DEPTH as u64)
            } else {
                (r.generation > 1).then_some(r.seq)
            };
            if late_ok && previous.is_some_and(|p| p as u16 == imm.seq16) {
                tracing::debug!(
                    slot = imm.slot,
                    seq16 = imm.seq16,
                    "NET/switchless: late copy of a piece of a completed receive, ignored"
                );
                return Ok(());
            }
        }
        if !current || imm.elem >= r.n {
            return Err(Error::Remote(format!(
                "immediate for slot {} buffer {} sequence {:#x} matches no posted receive",
                imm.slot, imm.elem, imm.seq16
            )));
        }
        if r.cts_held {
            // Held back: the sender cannot have taken it.
            return Err(Error::Remote(format!(
                "immediate for slot {} (FIFO sequence {}) whose clear-to-send was not sent yet",
                imm.slot, r.seq
            )));
        }
        if let Some(t) = r
            .cts_at
            .filter(|_| r.elems[..r.n].iter().all(|e| e.seen == 0))
        {
            shortest_round_trip(rtt, t, now);
        }
        // The sender took the clear-to-send (whole) before it wrote this: it landed, whether or
        // not its own completion was signaled or has come.
        r.cts_pending = 0;
        r.cts_parked = false;
        let st = &mut r.elems[imm.elem];
        if st.expected != 0 && st.expected as usize != imm.npieces {
            return Err(Error::Remote(format!(
                "inconsistent immediates for slot {} buffer {}: {} pieces announced, {} before",
                imm.slot, imm.elem, imm.npieces, st.expected
            )));
        }
        let bit = 1u8 << imm.piece;
        if st.done || st.seen & bit != 0 {
            if late_ok {
                return Ok(()); // the same piece again, over another path
            }
            return Err(Error::Remote(format!(
                "piece {} of slot {} buffer {} arrived twice",
                imm.piece, imm.slot, imm.elem
            )));
        }
        st.expected = imm.npieces as u8;
        st.seen |= bit;
        let k = k.unwrap_or(0);
        if imm.piece == 0 && !imm.len_is_size {
            // The size record's write: the piece's bytes are counted once the size is known.
            st.first_path = k as u8;
            meter.received(k, 0, true);
        } else {
            let len = u64::from(c.byte_len);
            st.others = st.others.saturating_add(len);
            meter.received(k, len, true);
        }
        if st.seen.count_ones() as usize == imm.npieces {
            let size = if imm.len_is_size {
                // The whole message was this write: the completion reports its length.
                u64::from(c.byte_len)
            } else {
                let word = fab.ctrl_load(
                    records.word(imm.slot * MAX_RECVS + imm.elem),
                    Ordering::Acquire,
                )?;
                wire::decode_record(word, r.seq)?
            };
            if size > st.posted {
                return Err(Error::Remote(format!(
                    "peer sent {size} bytes into a receive buffer of {} bytes",
                    st.posted
                )));
            }
            st.size = size;
            st.done = true;
            if !imm.len_is_size {
                meter.received(
                    usize::from(st.first_path),
                    size.saturating_sub(st.others),
                    false,
                );
            }
        }
        Ok(())
    }

    /// Polls completions and reports whether `req` (a receive or a flush) is done: the received sizes
    /// per buffer (empty for a flush). A done or failed request is released; testing it again is an
    /// error. `now` is the current time, against which the request timeout is checked.
    pub fn test(&mut self, now: Instant, req: Request) -> Result<Option<Sizes>> {
        let (kind, idx, generation) = req.parts();
        let valid = match kind {
            k if k == ReqKind::Recv as u64 => self
                .slots
                .get(idx)
                .is_some_and(|r| r.in_use && r.generation == generation),
            k if k == ReqKind::Flush as u64 => self
                .flushes
                .get(idx)
                .is_some_and(|f| f.in_use && f.generation == generation),
            _ => false,
        };
        if !valid {
            return Err(Error::InvalidArgument(format!(
                "test of request {:#x}, which is not an outstanding receive or flush of this comm",
                req.0
            )));
        }
        self.progress(now)?;
        if kind == ReqKind::Flush as u64 {
            let f = &mut self.flushes[idx];
            if let Some(e) = f.error.take() {
                self.release_flush(idx);
                return Err(e);
            }
            if f.pending == 0 {
                let lost = f.lost.take();
                let ok = f.ok > 0;
                self.release_flush(idx);
                return match (ok, lost) {
                    (false, Some(e)) => Err(e),
                    _ => Ok(Some(Sizes::default())),
                };
            }
            if let Some(w) = timed_out(f.posted, self.core.cfg.request_timeout, now) {
                self.release_flush(idx);
                return Err(Error::Timeout(format!(
                    "flush read made no progress for {} ms (NCCL_SWITCHLESS_REQUEST_TIMEOUT)",
                    w.as_millis()
                )));
            }
            return Ok(None);
        }
        let r = &mut self.slots[idx];
        if let Some(e) = r.error.take().or_else(|| self.fatal.clone()) {
            // A released slot tells a failing-over sender that its receive completed (the fence's
            // snapshot): after a failure nothing is released as if it had, the comm is done.
            self.fatal.get_or_insert(e.clone());
            self.release_slot(idx);
            return Err(e);
        }
        if r.cts_pending == 0 && r.elems[..r.n].iter().all(|e| e.done) {
            let mut s = Sizes {
                n: r.n,
                sizes: [0; MAX_RECVS],
            };
            for (d, e) in s.sizes.iter_mut().zip(&r.elems[..r.n]) {
                *d = e.size;
            }
            let bytes = s.sizes[..r.n].iter().sum();
            self.core.meter.messages(r.n as u64, bytes);
            self.release_slot(idx);
            return Ok(Some(s));
        }
        if let Some(w) = timed_out(r.posted, self.core.cfg.request_timeout, now) {
            let state = self.waiting_on(idx, now);
            let r = &self.slots[idx];
            let msg = format!(
                "receive of {} buffers (FIFO sequence {}) made no progress for {} ms (NCCL_SWITCHLESS_REQUEST_TIMEOUT; {state}): the peer does not answer on path(s) {}",
                r.n,
                r.seq,
                w.as_millis(),
                self.core.paths_text()
            );
            // The clear-to-send of this slot may still be live at the sender (at its FIFO head, or
            // in a late write): reusing the slot would let the next receive's entry land beside it
            // and the sender stall on it, or write into a buffer NCCL has reused. The comm is dead.
            self.fatal.get_or_insert(Error::Timeout(msg.clone()));
            self.release_slot(idx);
            return Err(Error::Timeout(msg));
        }
        Ok(None)
    }

    /// Where a receive that timed out stands, for its error: its clear-to-send (held back, on a
    /// path and not known landed, parked at a failover, or landed) and the pieces seen, so a
    /// stall says whether the entry ever left this side or the sender never answered it.
    fn waiting_on(&self, idx: usize, now: Instant) -> String {
        let r = &self.slots[idx];
        let cts = if r.cts_held {
            format!(
                "its clear-to-send is held back with {} other(s), the sender holding {} unused",
                self.held.saturating_sub(1),
                self.in_hand(now)
            )
        } else if r.cts_parked {
            format!(
                "its clear-to-send is parked at a failover of path {}",
                r.cts_path
            )
        } else if r.cts_pending > 0 {
            format!(
                "its clear-to-send went on path {} {} ms ago, not known landed",
                r.cts_path,
                r.cts_at
                    .map_or(0, |t| now.saturating_duration_since(t).as_millis())
            )
        } else {
            format!("its clear-to-send landed on path {}", r.cts_path)
        };
        let seen: u32 = r.elems[..r.n].iter().map(|e| e.seen.count_ones()).sum();
        let expected: u32 = r.elems[..r.n].iter().map(|e| u32::from(e.expected)).sum();
        format!("{cts}; pieces seen {seen} of {expected} expected (0: none announced)")
    }

    /// What the clear-to-send writes carried so far: entries, and the writes that carried them.
    pub fn cts_stats(&self) -> CtsStats {
        self.cts_stats
    }

    /// Number of receive requests outstanding.
    pub fn outstanding(&self) -> usize {
        self.slots.iter().filter(|r| r.in_use).count()
    }

    /// Tears down (NCCL `closeRecv`), also with requests outstanding: stops the paths, drains their
    /// completions, frees control memory, then drops the fabric.
    pub fn close(mut self) -> Result<()> {
        self.core.close()
    }
}

impl_registrar!(RecvComm);

impl<F: Fabric> Drop for RecvComm<F> {
    fn drop(&mut self) {
        let _ = self.core.close();
    }
}
