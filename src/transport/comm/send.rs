//! The sending side of a connection (NCCL's `sendComm`): reads the receiver's clear-to-send entries
//! from its FIFO, matches tags and writes the data striped over the paths.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{
    Core, MAX_MESSAGE_BYTES, MAX_WR_BYTES, MemHandle, ProtocolConfig, ReqKind, Request,
    next_generation, timed_out,
};
use crate::error::{Error, Result};
use crate::transport::fabric::{CtrlMem, Fabric, LocalSeg, RemoteSeg, WcOpcode, WriteWr};
use crate::transport::stripe::{Chunk, MAX_PATHS, stripe};
use crate::transport::wire::{
    self, CtrlInfo, CtsElem, FIFO_DEPTH, FenceLayout, Imm, KEY_WORDS, MAX_RECVS, MAX_SEND_REQUESTS,
    RECV_SNAP_WORDS, SEND_SNAP_WORDS, SLOT_HDR, SLOT_IDX, SLOT_WORDS, WrKind,
};

/// One chunk of a send's stripe, and the data path it is (now) posted on.
#[derive(Debug, Clone, Copy, Default)]
struct Piece {
    offset: u64,
    len: u64,
    path: usize,
}

#[derive(Debug, Default)]
struct SendReq {
    in_use: bool,
    generation: u32,
    size: u64,
    tag: u32,
    error: Option<Error>,
    posted: Option<Instant>,
    /// What a piece needs to be posted again on another path (failover).
    data: u64,
    lkeys: [u32; MAX_PATHS],
    raddr: u64,
    rkeys: [u32; MAX_PATHS],
    rec_word: usize,
    imm: Imm,
    npieces: usize,
    pieces: [Piece; MAX_PATHS],
    /// Pieces whose signaled completion arrived, or which the receiver reported landed (bit per
    /// piece).
    done: u8,
    /// Pieces on a path marked down, not known landed: sent again only once the receiver has
    /// said it lacks them (the failover fence, `fence.rs`).
    parked: u8,
    /// The message's FIFO sequence number.
    seq: u64,
    /// Data paths whose key for the receive buffer this request has (bit per data path): the
    /// clear-to-send's, or a key update's (the receiver registers on standby paths at their
    /// first use).
    have: u8,
    /// Pieces not posted yet because their path's key has not come (bit per piece): the
    /// receiver's key update for the slot brings it, or the piece moves to a path with a key.
    keyless: u8,
}

impl SendReq {
    fn all_done(&self) -> bool {
        u32::from(self.done).count_ones() as usize == self.npieces
    }
}

#[derive(Debug, Clone, Copy)]
struct CurSlot {
    seq: u64,
    n: usize,
    elems: [CtsElem; MAX_RECVS],
    matched: u8,
    /// Data paths whose keys the entry lacks (and no key update has brought yet).
    missing: u8,
}

/// The sending side of a connection (NCCL's `sendComm`).
pub struct SendComm<F: Fabric> {
    core: Core<F>,
    fifo: CtrlMem,
    rec_src: CtrlMem,
    peer: Option<CtrlInfo>,
    head: u64,
    cur: Option<CurSlot>,
    reqs: Vec<SendReq>,
    free: Vec<usize>,
    rotate: usize,
    chunks: Vec<Chunk>,
    batch: Vec<WriteWr>,
    stalled_since: Option<Instant>,
    /// Spreads pieces moved off a failed path over the survivors.
    spread: u64,
    /// Per request, the registration of its data (its keys on a standby path come at the path's
    /// first use); empty on a connection without deferred paths.
    tokens: Vec<u64>,
    /// Word offset in the FIFO block of the key area the receiver writes its key updates into.
    keys_off: usize,
    /// Requests with pieces waiting for a key ([`SendReq::keyless`]).
    waiting: Vec<usize>,
    /// Per data path, the smallest message it carries a piece of ([`SendComm::set_min_message`]).
    floors: [u64; MAX_PATHS],
}

impl<F: Fabric> SendComm<F> {
    /// Allocates the CTS FIFO and the record sources. Call [`SendComm::local_info`], exchange, then
    /// [`SendComm::connect`].
    pub fn new(fab: F, cfg: ProtocolConfig) -> Result<SendComm<F>> {
        let mut core = Core::new(fab, cfg)?;
        core.lazy = true;
        let npaths = core.data.len();
        // The receiver writes its fence words after the FIFO (its snapshot: the pieces it has).
        let lin = FenceLayout {
            npaths,
            snap: RECV_SNAP_WORDS,
        };
        // ... then the key area (the receiver's keys for paths its entries lacked).
        let keys_off = FIFO_DEPTH * SLOT_WORDS + lin.words();
        let fifo = core.alloc(keys_off + wire::key_area_words(npaths))?;
        let lout = FenceLayout {
            npaths,
            snap: SEND_SNAP_WORDS,
        };
        core.fence_init(fifo.word(FIFO_DEPTH * SLOT_WORDS), lin, lout)?;
        let rec_src = core.alloc(FIFO_DEPTH * MAX_RECVS)?;
        let mut reqs = Vec::with_capacity(MAX_SEND_REQUESTS);
        reqs.resize_with(MAX_SEND_REQUESTS, || SendReq {
            generation: 1,
            ..SendReq::default()
        });
        Ok(SendComm {
            core,
            fifo,
            rec_src,
            peer: None,
            head: 0,
            cur: None,
            reqs,
            free: (0..MAX_SEND_REQUESTS).rev().collect(),
            rotate: 0,
            chunks: Vec::with_capacity(MAX_PATHS),
            batch: Vec::with_capacity(2),
            stalled_since: None,
            floors: [0; MAX_PATHS],
            spread: 0,
            tokens: Vec::new(),
            keys_off,
            waiting: Vec::new(),
        })
    }

    /// What the receiver needs: the CTS FIFO's address and keys.
    pub fn local_info(&self) -> CtrlInfo {
        self.core.info(&self.fifo)
    }

    /// Accepts the receiver's [`RecvComm::local_info`] (its size-record array).
    ///
    /// [`RecvComm::local_info`]: super::RecvComm::local_info
    pub fn connect(&mut self, peer: CtrlInfo) -> Result<()> {
        // The records, then the fence inbox for this side's words.
        let inbox = FenceLayout {
            npaths: self.core.data.len(),
            snap: SEND_SNAP_WORDS,
        };
        self.core.check_peer(
            &peer,
            FIFO_DEPTH * MAX_RECVS + inbox.words(),
            "size-record array",
        )?;
        self.core.fence_connect(
            peer.addr + 8 * (FIFO_DEPTH * MAX_RECVS) as u64,
            peer.rkeys.clone(),
        );
        self.peer = Some(peer);
        Ok(())
    }

    registration_methods!();

    /// Data paths `paths` carry no piece of a message under `bytes` while another usable path
    /// can take it (a mesh connection's relay paths: a two-hop byte costs two cables, which pays
    /// only on large ring steps). Unlike a larger `min_chunk`, this holds whatever the adaptive
    /// weights do, and leaves the other paths' striping alone.
    pub fn set_min_message(&mut self, paths: &[usize], bytes: u64) -> Result<()> {
        let n = self.core.data.len();
        for &k in paths {
            let f = self.floors.get_mut(k).filter(|_| k < n).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "minimum message on path {k}: the connection has {n} data paths"
                ))
            })?;
            *f = bytes;
        }
        Ok(())
    }

    /// Tries to load the CTS entry at the FIFO head; `false` if it has not arrived whole.
    ///
    /// The entry is one RDMA write whose words may land in any order (and a failed path may leave
    /// part of it): it is taken only when its index names the head and its check word matches
    /// every word read ([`wire::check_slot`]); anything else is "not yet". The index is loaded
    /// with acquire (AArch64: the words after it are read no earlier), and the entry is decoded
    /// from the copies that were checked, never read again.
    fn load_slot(&mut self) -> Result<bool> {
        let slot = (self.head % FIFO_DEPTH as u64) as usize;
        let base = slot * SLOT_WORDS;
        let fab = &self.core.fab;
        let mut w = [0u64; SLOT_WORDS];
        w[SLOT_IDX] = fab.ctrl_load(self.fifo.word(base + SLOT_IDX), Ordering::Acquire)?;
        if w[SLOT_IDX] != self.head.wrapping_add(1) {
            return Ok(false);
        }
        w[SLOT_HDR] = fab.ctrl_load(self.fifo.word(base + SLOT_HDR), Ordering::Acquire)?;
        let len = wire::slot_words_to_read(w[SLOT_HDR]);
        fab.ctrl_read(
            self.fifo.word(base + wire::SLOT_ELEMS),
            &mut w[wire::SLOT_ELEMS..len.max(wire::SLOT_ELEMS)],
        )?;
        let Some(n) = wire::check_slot(&w[..len], self.head, self.core.data.len())? else {
            return Ok(false);
        };
        let mut elems = [CtsElem::default(); MAX_RECVS];
        let ew = &w[wire::SLOT_ELEMS..wire::SLOT_ELEMS + n * wire::ELEM_WORDS];
        for (e, (el, ew)) in elems
            .iter_mut()
            .zip(ew.chunks_exact(wire::ELEM_WORDS))
            .enumerate()
        {
            *el = wire::decode_elem(ew);
            // Every write address below is el.addr + an offset under el.size: checked once here.
            if el.addr.checked_add(el.size).is_none() {
                return Err(Error::Remote(format!(
                    "clear-to-send entry (FIFO sequence {}) names buffer {e} at {:#x} + {} bytes, \
                     which wraps the address space (corrupt or hostile FIFO write)",
                    self.head, el.addr, el.size
                )));
            }
        }
        // Bits past the connection's paths would be a lying peer's: no such path is used.
        let all = ((1u16 << self.core.data.len()) - 1) as u8;
        self.cur = Some(CurSlot {
            seq: self.head,
            n,
            elems,
            matched: 0,
            missing: wire::slot_keys_missing(w[SLOT_HDR]) & all,
        });
        Ok(true)
    }

    /// What the FIFO slot of the head holds, for a timeout's error: nothing yet, an older entry
    /// (the receiver's entry never landed), or the head's entry not whole (a torn write).
    fn head_slot_state(&self) -> String {
        let slot = (self.head % FIFO_DEPTH as u64) as usize;
        let base = slot * SLOT_WORDS;
        let idx = self
            .core
            .fab
            .ctrl_load(self.fifo.word(base + SLOT_IDX), Ordering::Acquire)
            .unwrap_or(0);
        match idx.checked_sub(1) {
            None => format!("slot {slot} never written"),
            Some(seq) if seq == self.head => {
                format!("slot {slot} names it, but the entry is not whole (a write landed in part)")
            }
            Some(seq) => format!("slot {slot} holds sequence {seq}"),
        }
    }

    /// Posts a send of `size` bytes at `data` with `tag` (NCCL `isend`). `Ok(None)` means "call again
    /// later": the receiver's clear-to-send has not arrived, no buffer of it carries `tag` yet, or all
    /// [`MAX_SEND_REQUESTS`] requests are in use. `now` is the current time (the request timeout
    /// counts from it).
    pub fn isend(
        &mut self,
        now: Instant,
        data: u64,
        size: u64,
        tag: u32,
        mh: &MemHandle,
    ) -> Result<Option<Request>> {
        if self.peer.is_none() {
            return Err(Error::InvalidArgument(
                "isend on a send comm that is not connected".into(),
            ));
        }
        if self.core.closed {
            return Err(Error::InvalidArgument("isend on a closed send comm".into()));
        }
        mh.check_covers(data, size, "send")?;
        if size > MAX_MESSAGE_BYTES {
            return Err(Error::InvalidArgument(format!(
                "send of {size} bytes; at most {MAX_MESSAGE_BYTES} bytes accepted"
            )));
        }
        let Some(&idx) = self.free.last() else {
            return Ok(None);
        };
        if self.cur.is_none() && !self.load_slot()? {
            // Nothing to poll for while no clear-to-send arrives: ask the devices what they saw,
            // and settle what failed paths had in flight (the receiver's answer may be waiting).
            self.core.check_health(now)?;
            if self.core.fence_writing() {
                // A fence write in flight: with no request left to test, nothing else would
                // reap its completion, and the next publish (an answer the receiver's parked
                // clear-to-send waits for) would never go.
                self.progress(now)?;
            } else {
                self.settle(now)?;
                let mut rebuilt = Vec::new();
                self.core.probe(now, &mut rebuilt)?;
            }
            let since = *self.stalled_since.get_or_insert(now);
            if let Some(waited) = timed_out(Some(since), self.core.cfg.request_timeout, now) {
                return Err(Error::Timeout(format!(
                    "send of {size} bytes (tag {tag}) made no progress for {} ms (NCCL_SWITCHLESS_REQUEST_TIMEOUT): no clear-to-send from the receiver (FIFO sequence {}; {}) on path(s) {}",
                    waited.as_millis(),
                    self.head,
                    self.head_slot_state(),
                    self.core.paths_text()
                )));
            }
            return Ok(None);
        }
        if let Some(since) = self.stalled_since.take() {
            self.core
                .meter
                .cts_wait(now.saturating_duration_since(since));
        }
        let Some(cur) = self.cur.as_mut() else {
            return Err(Error::Internal("CTS slot vanished".into()));
        };
        let Some(e) = (0..cur.n).find(|&e| cur.matched & (1 << e) == 0 && cur.elems[e].tag == tag)
        else {
            tracing::trace!(
                tag,
                seq = cur.seq,
                "isend: no buffer of the posted receive carries this tag yet"
            );
            return Ok(None);
        };
        let seq = cur.seq;
        let slot = (seq % FIFO_DEPTH as u64) as usize;
        // Keys the entry lacked for paths that carry now: a key update may have brought them.
        let mut want = cur.missing;
        while want != 0 {
            let k = want.trailing_zeros() as usize;
            want &= want - 1;
            if !self.core.paths.carries(k) {
                continue;
            }
            if let Some(words) =
                Self::read_keys(&self.core, &self.fifo, self.keys_off, slot, seq, k)?
            {
                for (i, el) in cur.elems[..cur.n].iter_mut().enumerate() {
                    el.rkeys[k] = wire::decode_key(&words, i);
                }
                cur.missing &= !(1 << k);
            }
        }
        let all = ((1u16 << self.core.data.len()) - 1) as u8;
        let have = all & !cur.missing;
        let el = cur.elems[e];
        if size > el.size {
            return Err(Error::InvalidUsage(format!(
                "send of {size} bytes with tag {tag} exceeds the posted receive buffer of {} bytes \
                 (message truncated); a receive must be at least as large as the send",
                el.size
            )));
        }
        cur.matched |= 1 << e;
        if cur.matched.count_ones() as usize == cur.n {
            self.cur = None;
            self.head += 1;
        }

        let rec_word = slot * MAX_RECVS + e;
        // Stripe over the usable paths, by measured (or nominal) weight.
        let mut w = [(0usize, 0u64); MAX_PATHS];
        let mut nw = self.core.paths.weights(&mut w);
        for &(k, x) in &w[..nw] {
            self.core.meter.weight(k, x);
        }
        // Only on the paths with the buffer's key, while one carries; with none, the pieces wait
        // for the receiver's key update.
        nw = keep_paths(&mut w, nw, |k| have & (1 << k) != 0);
        // Paths with a floor above this message drop out, unless none would be left (the other
        // paths failed: the message goes as it can).
        let floors = self.floors;
        nw = keep_paths(&mut w, nw, |k| floors[k] <= size);
        loop {
            let mut speeds = [0u64; MAX_PATHS];
            for (d, &(_, x)) in speeds.iter_mut().zip(&w[..nw]) {
                *d = x;
            }
            stripe(
                size,
                &speeds[..nw],
                self.core.cfg.stripe,
                self.rotate,
                &mut self.chunks,
            );
            let got = self.chunks.len();
            if got == 0 || got >= nw {
                break;
            }
            // Fewer pieces than paths: on the paths that would finish them soonest (n shrinks).
            nw = self.soonest_paths(size, &mut w, nw, got);
        }
        self.rotate = self.rotate.wrapping_add(1);

        self.free.pop();
        let r = &mut self.reqs[idx];
        r.in_use = true;
        r.size = size;
        r.tag = tag;
        r.error = None;
        r.posted = self.core.cfg.request_timeout.map(|_| now);
        r.data = data;
        if self.core.deferred != 0 && self.tokens.is_empty() {
            // Once per connection with standby paths not used yet.
            self.tokens = vec![0; MAX_SEND_REQUESTS];
        }
        if let Some(t) = self.tokens.get_mut(idx) {
            *t = mh.reg.token;
        }
        for (k, &p) in self.core.data.iter().enumerate() {
            r.lkeys[k] = self.core.lkey(&mh.reg, p);
        }
        r.raddr = el.addr;
        r.rkeys = el.rkeys;
        r.rec_word = rec_word;
        r.npieces = self.chunks.len();
        // One piece in one write: the write's length is the size, no record (one write per message).
        let len_is_size = r.npieces == 1 && size > 0 && size <= MAX_WR_BYTES;
        r.imm = Imm {
            slot,
            elem: e,
            npieces: r.npieces,
            piece: 0,
            seq16: seq as u16,
            len_is_size,
        };
        r.done = 0;
        r.parked = 0;
        r.seq = seq;
        r.have = have;
        r.keyless = 0;
        for (p, c) in r.pieces.iter_mut().zip(&self.chunks) {
            *p = Piece {
                offset: c.offset,
                len: c.len,
                path: w[c.path].0,
            };
        }
        let generation = r.generation;
        if !len_is_size {
            self.core.fab.ctrl_store(
                self.rec_src.word(rec_word),
                wire::encode_record(size, seq),
                Ordering::Release,
            )?;
        }

        for pi in 0..self.reqs[idx].npieces {
            let r = &mut self.reqs[idx];
            if r.have & (1 << r.pieces[pi].path) == 0 {
                // No key for the receive buffer on this path yet (`poll_keys`).
                r.keyless |= 1 << pi;
                self.core.fence.stats.keys += 1;
                continue;
            }
            if let Err(err) = self.post_piece(idx, pi) {
                let k = self.reqs[idx].pieces[pi].path;
                // Failover: the piece is settled with the rest of the path's work (below): a
                // failed batch may have been posted in part.
                if !self.core.mark_down(k, now, &err.to_string()) {
                    self.release(idx);
                    return Err(err);
                }
            }
        }
        if self.reqs[idx].keyless != 0 {
            self.waiting.push(idx);
        }
        self.fail_over();
        if let Some(err) = self.reqs[idx].error.take() {
            self.release(idx);
            return Err(err);
        }
        Ok(Some(Request::new(ReqKind::Send, idx, generation)))
    }

    /// A message too small to give each of the `nw` usable paths in `w` a chunk of at least the
    /// minimum (the stripe made only `k` pieces) goes on the `k` paths that would finish it
    /// soonest: fewest bytes outstanding per unit of weight, counting the message's own share.
    /// Always taking the fastest paths (the stripe's order) would leave the slower ones idle under
    /// a stream of such messages: half of a GB10 port's two functions. Idle paths tie on
    /// outstanding bytes and keep the stripe's order: fastest first, equal speeds in rotation.
    /// Moves the chosen paths to the front of `w`; returns `k`.
    fn soonest_paths(
        &self,
        size: u64,
        w: &mut [(usize, u64); MAX_PATHS],
        nw: usize,
        k: usize,
    ) -> usize {
        let k = k.clamp(1, nw.max(1));
        let share = size / k as u64;
        let rot = self.rotate % nw;
        let paths = &self.core.paths;
        let mut order = [0usize; MAX_PATHS];
        for (j, o) in order.iter_mut().enumerate().take(nw) {
            *o = j;
        }
        order[..nw].sort_unstable_by_key(|&j| {
            let (k, wt) = w[j];
            let busy = u128::from(paths.outstanding(k).saturating_add(share)) << 20;
            (
                busy / u128::from(wt.max(1)),
                std::cmp::Reverse(wt.max(1)),
                (j + nw - rot) % nw,
            )
        });
        let mut chosen = [(0usize, 0u64); MAX_PATHS];
        for (c, &j) in chosen.iter_mut().zip(&order[..k]) {
            *c = w[j];
        }
        // Data-path order among the chosen, as the stripe expects its speeds.
        chosen[..k].sort_unstable_by_key(|&(p, _)| p);
        w[..k].copy_from_slice(&chosen[..k]);
        k
    }

    /// Posts piece `pi` of request `idx` on its path, as one batch (one doorbell on verbs): its
    /// data writes, then, for piece 0 of a message with a size record, the record. The last work
    /// request carries the immediate naming the piece and is the only signaled one.
    fn post_piece(&mut self, idx: usize, pi: usize) -> Result<()> {
        let Some(peer) = self.peer.as_ref() else {
            return Err(Error::Internal("send comm lost its peer".into()));
        };
        let r = &self.reqs[idx];
        let c = r.pieces[pi];
        let path = self.core.data[c.path];
        let id = wire::wr_id_piece(idx, r.generation, pi);
        let imm = Imm { piece: pi, ..r.imm }.encode();
        let carries_record = pi == 0 && !r.imm.len_is_size;
        self.batch.clear();
        let mut off = 0u64;
        while off < c.len {
            let len = (c.len - off).min(MAX_WR_BYTES);
            let with_imm = off + len == c.len && !carries_record;
            self.batch.push(WriteWr {
                wr_id: id,
                local: LocalSeg {
                    addr: r.data + c.offset + off,
                    len: len as u32,
                    lkey: r.lkeys[c.path],
                },
                remote: RemoteSeg {
                    addr: r.raddr + c.offset + off,
                    rkey: r.rkeys[c.path],
                },
                imm: with_imm.then_some(imm),
                signaled: with_imm,
                inline: len <= u64::from(self.core.cfg.inline_max),
            });
            off += len;
        }
        if carries_record {
            self.batch.push(WriteWr {
                wr_id: id,
                local: LocalSeg {
                    addr: self.rec_src.word(r.rec_word),
                    len: 8,
                    lkey: self.rec_src.reg.keys[path].lkey,
                },
                remote: RemoteSeg {
                    addr: peer.addr + 8 * r.rec_word as u64,
                    rkey: peer.rkeys[c.path],
                },
                imm: Some(imm),
                signaled: true,
                inline: 8 <= self.core.cfg.inline_max,
            });
        }
        self.core.fab.post_writes(path, &self.batch)?;
        self.core.paths.posted(c.path, c.len);
        Ok(())
    }

    /// Parks every piece in flight on a path marked down and not known landed: it is sent again
    /// only once the receiver, its end of that path sealed, says it lacks it ([`Self::resolve`]).
    fn fail_over(&mut self) {
        if self.core.take_activated() {
            // A standby path was registered at its first use: the requests in flight take its
            // keys before any piece moves there.
            for (r, t) in self.reqs.iter_mut().zip(&self.tokens) {
                if !r.in_use {
                    continue;
                }
                if let Some(reg) = self.core.regs.get(t) {
                    for (k, &p) in self.core.data.iter().enumerate() {
                        if reg.has(p) {
                            r.lkeys[k] = reg.keys[p].lkey;
                        }
                    }
                }
            }
        }
        while let Some(k) = self.core.newly_down.pop() {
            for r in self.reqs.iter_mut() {
                if !r.in_use || r.error.is_some() {
                    continue;
                }
                for pi in 0..r.npieces {
                    let bit = 1u8 << pi;
                    if r.done & bit != 0
                        || r.parked & bit != 0
                        || r.keyless & bit != 0
                        || r.pieces[pi].path != k
                    {
                        continue; // a keyless piece was never posted: `poll_keys` moves it
                    }
                    r.parked |= bit;
                    self.core.paths.abandoned(k, r.pieces[pi].len);
                }
            }
        }
    }

    /// The receiver acknowledged this end's stop of data path `k` with the snapshot in inbox area
    /// `j` (taken after it sealed `k`): each piece parked on `k` either landed (done) or never
    /// will (sent again, on a survivor).
    fn resolve(&mut self, k: usize, j: usize, now: Instant) -> Result<()> {
        let Some((at, words)) = self.core.fence.snapshot(j) else {
            return Ok(());
        };
        let mut snap = vec![0u64; words];
        self.core.fab.ctrl_read(at, &mut snap)?;
        for idx in 0..self.reqs.len() {
            for pi in 0..MAX_PATHS {
                let r = &mut self.reqs[idx];
                let bit = 1u8 << pi;
                if !r.in_use || r.error.is_some() || r.parked & bit == 0 || r.pieces[pi].path != k {
                    continue;
                }
                r.parked &= !bit;
                let w = snap[r.imm.slot * MAX_RECVS + r.imm.elem];
                match wire::piece_landed(w, r.seq, pi) {
                    Ok(true) => {
                        r.done |= bit;
                        self.core.meter.sent(k, r.pieces[pi].len);
                        self.core.fence.stats.landed += 1;
                    }
                    Ok(false) => {
                        self.core.fence.stats.resent += 1;
                        self.move_piece(idx, pi, now);
                    }
                    Err(e) => {
                        r.error.get_or_insert(e);
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
            // A piece sent again may have failed on its new path: parked there.
            self.fail_over();
        }
        self.poll_keys(now)?;
        // This end's snapshot: which clear-to-send entries landed whole (each FIFO slot's index
        // word, 0 where the entry landed in part: the receiver posts it again).
        let fifo = &self.fifo;
        self.core.fence_flush(|fab, snap| {
            let mut w = [0u64; SLOT_WORDS];
            for (s, out) in snap.iter_mut().enumerate() {
                w[SLOT_IDX] =
                    fab.ctrl_load(fifo.word(s * SLOT_WORDS + SLOT_IDX), Ordering::Acquire)?;
                fab.ctrl_read(fifo.word(s * SLOT_WORDS + SLOT_HDR), &mut w[SLOT_HDR..])?;
                *out = wire::slot_landed(&w);
            }
            Ok(())
        })
    }

    /// Posts piece `pi` of request `idx` again on a path that carries (after the receiver said it
    /// lacks it). A failed post parks it on that path in turn.
    fn move_piece(&mut self, idx: usize, pi: usize, now: Instant) {
        self.spread = self.spread.wrapping_add(1);
        let n = self.core.paths.carrying().count() as u64;
        // A carrying path with the receive buffer's key, if one has it; else the next carrying
        // path, where the piece waits for the key.
        let have = self.reqs[idx].have;
        let keyed = (0..n)
            .filter_map(|i| self.core.paths.nth_up(self.spread.wrapping_add(i)))
            .find(|&j| have & (1 << j) != 0);
        let Some(j) = keyed.or_else(|| self.core.paths.nth_up(self.spread)) else {
            let err = Error::Internal("no usable path left to fail over to".into());
            self.reqs[idx].error.get_or_insert(err);
            return;
        };
        let r = &mut self.reqs[idx];
        r.pieces[pi].path = j;
        if have & (1 << j) == 0 {
            if r.keyless == 0 {
                self.waiting.push(idx);
            }
            if r.keyless & (1 << pi) == 0 {
                self.core.fence.stats.keys += 1;
            }
            r.keyless |= 1 << pi;
            return;
        }
        r.keyless &= !(1 << pi);
        if let Err(err) = self.post_piece(idx, pi) {
            if !self.core.mark_down(j, now, &err.to_string()) {
                self.reqs[idx].error.get_or_insert(err);
            }
        }
    }

    /// The key update for FIFO slot `slot` over data path `k`, if the one for the entry of
    /// sequence `seq` has landed: its key words (buffer `e`'s key: [`wire::decode_key`]). Word
    /// 0 is read before the keys and again after (acquire: the keys landed before it, on the
    /// same path), so the keys are that update's.
    fn read_keys(
        core: &Core<F>,
        fifo: &CtrlMem,
        keys_off: usize,
        slot: usize,
        seq: u64,
        k: usize,
    ) -> Result<Option<[u64; KEY_WORDS - 1]>> {
        let at = keys_off + wire::key_area(k, slot);
        let tag = fifo.word(at);
        if core.fab.ctrl_load(tag, Ordering::Acquire)? != seq + 1 {
            return Ok(None);
        }
        let mut words = [0u64; KEY_WORDS - 1];
        core.fab.ctrl_read(fifo.word(at + 1), &mut words)?;
        if core.fab.ctrl_load(tag, Ordering::Acquire)? != seq + 1 {
            return Ok(None);
        }
        Ok(Some(words))
    }

    /// Posts the pieces that waited for a key: on their path once the receiver's key update for
    /// it landed, or moved to another path when theirs no longer carries (they were never
    /// posted, so moving them needs no fence).
    fn poll_keys(&mut self, now: Instant) -> Result<()> {
        if self.waiting.is_empty() {
            return Ok(());
        }
        let waiting = std::mem::take(&mut self.waiting);
        for &idx in &waiting {
            for pi in 0..MAX_PATHS {
                let r = &self.reqs[idx];
                if !r.in_use || r.error.is_some() || r.keyless & (1 << pi) == 0 {
                    continue;
                }
                let k = r.pieces[pi].path;
                if r.have & (1 << k) == 0 {
                    let (slot, seq, e) = (r.imm.slot, r.seq, r.imm.elem);
                    if let Some(words) =
                        Self::read_keys(&self.core, &self.fifo, self.keys_off, slot, seq, k)?
                    {
                        let r = &mut self.reqs[idx];
                        r.rkeys[k] = wire::decode_key(&words, e);
                        r.have |= 1 << k;
                    }
                }
                let r = &mut self.reqs[idx];
                if r.have & (1 << k) != 0 && self.core.paths.carries(k) {
                    r.keyless &= !(1 << pi);
                    if let Err(err) = self.post_piece(idx, pi) {
                        if !self.core.mark_down(k, now, &err.to_string()) {
                            self.reqs[idx].error.get_or_insert(err);
                        }
                    }
                } else if !self.core.paths.carries(k) {
                    self.move_piece(idx, pi, now);
                }
            }
            let r = &self.reqs[idx];
            if r.in_use && r.error.is_none() && r.keyless != 0 && !self.waiting.contains(&idx) {
                self.waiting.push(idx);
            }
        }
        self.fail_over();
        Ok(())
    }

    fn release(&mut self, idx: usize) {
        let r = &mut self.reqs[idx];
        r.in_use = false;
        r.generation = next_generation(r.generation);
        r.error = None;
        self.free.push(idx);
    }

    fn progress(&mut self, now: Instant) -> Result<()> {
        let reqs = &mut self.reqs;
        let polled = self.core.poll_all(|core, path, c| {
            let Some((kind, idx, generation)) = wire::split_wr_id(c.wr_id) else {
                return Err(Error::Internal(format!(
                    "send comm got a completion with foreign wr_id {:#x} on path {path}",
                    c.wr_id
                )));
            };
            match kind {
                WrKind::Send => {}
                WrKind::Fence => {
                    core.fence_completion(path, &c, idx, now);
                    return Ok(());
                }
                _ => {
                    return Err(Error::Internal(format!(
                        "send comm got a completion with foreign wr_id {:#x} on path {path}",
                        c.wr_id
                    )));
                }
            }
            let pi = wire::wr_piece(c.wr_id);
            let Some(r) = reqs
                .get_mut(idx)
                .filter(|r| r.in_use && r.generation == generation && pi < r.npieces)
            else {
                return Ok(()); // a request already failed and released
            };
            let bit = 1u8 << pi;
            let Some(k) = core.data_index(path).filter(|&k| k == r.pieces[pi].path) else {
                return Ok(()); // the piece was sent again on another path
            };
            if r.done & bit != 0 {
                return Ok(());
            }
            if c.status.is_success() {
                // Landed, whatever became of the path since: a parked piece needs no answer.
                if c.opcode == WcOpcode::RdmaWrite {
                    r.done |= bit;
                    r.parked &= !bit;
                    core.meter.sent(k, r.pieces[pi].len);
                    if core.paths.is_up(k) {
                        core.paths.completed(k, r.pieces[pi].len);
                    }
                }
                return Ok(());
            }
            if !core.paths.is_up(k) {
                return Ok(()); // the path is down: the fence settles its pieces
            }
            let why = c.status.to_string();
            if !core.mark_down(k, now, &why) || c.status.blames_request() {
                let what = format!("send of {} bytes (tag {})", r.size, r.tag);
                let err = core.completion_error(path, &c, &what);
                r.error.get_or_insert(err);
            }
            Ok(())
        })?;
        // A path whose link died silently completes nothing: its work would wait for ever.
        self.core.check_paths_busy(now, polled);
        self.settle(now)?;
        self.core.paths.tick(now);
        let mut rebuilt = Vec::new();
        self.core.probe(now, &mut rebuilt)
    }

    /// Polls completions and reports whether `req` is done: `Some(bytes sent)`. A done or failed
    /// request is released; testing it again is an error. `now` is the current time, against which
    /// the request timeout is checked.
    pub fn test(&mut self, now: Instant, req: Request) -> Result<Option<u64>> {
        let (kind, idx, generation) = req.parts();
        let valid = kind == ReqKind::Send as u64
            && self
                .reqs
                .get(idx)
                .is_some_and(|r| r.in_use && r.generation == generation);
        if !valid {
            return Err(Error::InvalidArgument(format!(
                "test of request {:#x}, which is not an outstanding send of this comm",
                req.0
            )));
        }
        self.progress(now)?;
        let r = &mut self.reqs[idx];
        if let Some(err) = r.error.take() {
            self.release(idx);
            return Err(err);
        }
        if r.all_done() {
            let size = r.size;
            self.core.meter.messages(1, size);
            self.release(idx);
            return Ok(Some(size));
        }
        if let Some(waited) = timed_out(r.posted, self.core.cfg.request_timeout, now) {
            let msg = format!(
                "send of {} bytes (tag {}) made no progress for {} ms (NCCL_SWITCHLESS_REQUEST_TIMEOUT): the peer does not answer on path(s) {}",
                r.size,
                r.tag,
                waited.as_millis(),
                self.core.paths_text()
            );
            self.release(idx);
            return Err(Error::Timeout(msg));
        }
        Ok(None)
    }

    /// Number of send requests outstanding.
    pub fn outstanding(&self) -> usize {
        MAX_SEND_REQUESTS - self.free.len()
    }

    /// Tears down (NCCL `closeSend`), also with requests outstanding: stops the paths, drains their
    /// completions, frees control memory, then drops the fabric.
    pub fn close(mut self) -> Result<()> {
        self.core.close()
    }
}

impl_registrar!(SendComm);

impl<F: Fabric> Drop for SendComm<F> {
    fn drop(&mut self) {
        let _ = self.core.close();
    }
}

/// Keeps, in order, the weights `w[..nw]` of the paths `keep` accepts, unless it accepts none:
/// then all stay. Returns how many are kept.
fn keep_paths(w: &mut [(usize, u64); MAX_PATHS], nw: usize, keep: impl Fn(usize) -> bool) -> usize {
    let kept = w[..nw].iter().filter(|&&(k, _)| keep(k)).count();
    if kept == 0 || kept == nw {
        // None accepted, or all: nothing moves (the common case, one pass).
        return nw;
    }
    let mut m = 0;
    for i in 0..nw {
        if keep(w[i].0) {
            w[m] = w[i];
            m += 1;
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_request_stays_small() {
        // 256 of them per send comm: what failover keeps per request is counted here.
        let n = std::mem::size_of::<SendReq>();
        eprintln!("SendReq: {n} bytes");
        assert!(n <= 448, "{n} bytes");
    }
}
