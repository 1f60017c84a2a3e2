//! A relay path over verbs, at its ends (A and B): [`Staged`] wraps a connection's [`Fabric`] and
//! turns each write posted on a staged path, whose queue pair is connected to the relay K instead
//! of the peer, into writes through K's staging ring ([`super::staging`]); K's
//! [`super::forward::Forwarder`] writes each on into the peer's memory. The comm protocol sees a
//! path like any other (docs/guide/relay.md, "Verbs legs").
//!
//! * **Completion end to end.** A write completes when K's credit word counts every staging write
//!   it took as forwarded and acknowledged by the peer's NIC, not when K took it: a write K held
//!   when it died never counts as landed, so failover's fence holds as on a direct path.
//! * **Split writes.** A write larger than a slot's payload crosses as several slots, in order;
//!   only the last carries the write's immediate. Since the peer's NIC then reports only the last
//!   slot's length, such a write first sends its whole length to the peer's length ring (one more
//!   slot); the peer's `poll` reports that length, so `byte_len` means what it means on any path.
//! * **No reads.** `post_read` on a staged path is refused: no RDMA read crosses a relay (flush
//!   reads use loopback paths).
//! * **No rebuild.** A failed staged path stays down ([`Revive::Down`]): its queue pair is
//!   connected to K, and a new leg needs K's set-up again.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::transport::fabric::{
    Completion, CtrlMem, Fabric, LocalSeg, ReadWr, RemoteSeg, Revive, WcOpcode, WcStatus, WriteWr,
    forward_fabric,
};

use super::staging::{DESC_LEN, Descriptor, MAX_SLOTS, Sender};

/// Words of the length ring: twice the receives a path keeps posted, so a length written for a
/// write one full round of receives ahead never lands on the one the peer still has to read.
pub const LENGTH_RING: usize = 2 * crate::transport::fabric::RECV_DEPTH;

/// Top byte of the `wr_id` of this wrapper's own writes (the comm's kinds are 1 to 6).
const OWN: u64 = 0xa5 << 56;
/// A length word: the top bit set, the receive count (31 bits) above the length (32 bits).
const LEN_FLAG: u64 = 1 << 63;
const DESC_WORDS: usize = DESC_LEN / 8;
/// Control words per slot: its descriptor, and the source of a length word.
const SLOT_WORDS: usize = DESC_WORDS + 1;

/// The control words of `seq`'s slot: its descriptor, then a length word's source.
fn slot_words(ctrl: &CtrlMem, seq: u64, slots: u32) -> u64 {
    let slot = (seq % u64::from(slots)) as usize;
    ctrl.word(1 + LENGTH_RING + slot * SLOT_WORDS)
}

/// What this end of a staged path gives K and the peer (at set-up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedEnd {
    /// The word K writes its credit into (the count of this end's writes landed at the peer).
    pub credit: RemoteSeg,
    /// The peer's writes larger than a slot send their lengths here ([`LENGTH_RING`] words).
    pub lengths: RemoteSeg,
}

/// What this end of a staged path needs from K and the peer (at set-up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedLink {
    /// K's staging ring for this end's writes: address and key on the link to K.
    pub ring: RemoteSeg,
    /// Its slots and the bytes of each (a descriptor and a payload).
    pub slots: u32,
    pub slot_bytes: usize,
    /// The peer's length ring ([`StagedEnd::lengths`] of the peer).
    pub peer_lengths: RemoteSeg,
}

/// What a staged path has queued: a write through K, or the end of one of the comm's writes.
#[derive(Debug, Clone, Copy)]
enum Item {
    Write(Slotted),
    /// The comm's write `wr_id` is complete once every item before this one is credited.
    Done {
        wr_id: u64,
        signaled: bool,
    },
}

/// One write through K, one slot: a piece of the comm's payload, or a length word for the peer's
/// length ring.
#[derive(Debug, Clone, Copy)]
enum Slotted {
    Piece {
        local: LocalSeg,
        remote: RemoteSeg,
        imm: Option<u32>,
    },
    Length {
        word: u64,
        remote: RemoteSeg,
    },
}

#[derive(Debug)]
struct Leg {
    ctrl: CtrlMem,
    lkey: u32,
    link: Option<StagedLink>,
    sender: Option<Sender>,
    /// Writes not yet given a slot.
    queue: VecDeque<Item>,
    /// The comm's writes whose items all have a slot: (writes sent when complete, wr_id, signaled).
    sent: VecDeque<(u64, u64, bool)>,
    /// Writes of this end's that K credited.
    credited: u64,
    /// This end's writes with an immediate so far (index into the peer's length ring).
    imm_sent: u64,
    /// The peer's writes with an immediate this end polled (index into its own length ring).
    imm_seen: u64,
    /// Completions to hand the comm (credited writes, failures).
    done: VecDeque<Completion>,
    /// Set once the leg failed: every later write completes with a flush error.
    failed: Option<WcStatus>,
    /// Why, when this end found the fault itself (a credit or a length word from the relay).
    reason: Option<String>,
}

impl Leg {
    fn credit_word(&self) -> u64 {
        self.ctrl.word(0)
    }

    fn length_word(&self, i: u64) -> u64 {
        self.ctrl.word(1 + (i % LENGTH_RING as u64) as usize)
    }

    /// Every write not complete fails: the first with `status`, the rest flushed.
    fn fail(&mut self, status: WcStatus) {
        if self.failed.is_some() {
            return;
        }
        self.failed = Some(status);
        if let Some(s) = self.sender.as_mut() {
            s.seal();
        }
        let mut st = status;
        let pending =
            self.sent
                .drain(..)
                .map(|(_, id, _)| id)
                .chain(self.queue.drain(..).filter_map(|i| match i {
                    Item::Done { wr_id, .. } => Some(wr_id),
                    _ => None,
                }));
        for wr_id in pending {
            self.done
                .push_back(Completion::without_data(wr_id, st, WcOpcode::RdmaWrite));
            st = WcStatus::WR_FLUSH_ERR;
        }
    }
}

/// A [`Fabric`] whose staged paths cross a relay's staging ring (module docs); every other path
/// and call goes to the wrapped fabric unchanged.
pub struct Staged<F: Fabric> {
    inner: F,
    legs: Vec<Option<Leg>>,
    scratch: Vec<Completion>,
}

impl<F: Fabric> Staged<F> {
    /// No path staged yet.
    pub fn new(inner: F) -> Staged<F> {
        Staged {
            inner,
            legs: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// The wrapped fabric.
    pub fn inner(&self) -> &F {
        &self.inner
    }

    /// Makes data path `path` a staged path (its queue pair connected to K): allocates its credit
    /// word, its length ring and descriptors for up to `max_slots` slots (at most
    /// [`MAX_SLOTS`]), and returns what K and the peer need.
    pub fn stage(&mut self, path: usize, max_slots: u32) -> Result<StagedEnd> {
        if path >= self.inner.paths().len() || path >= 32 {
            return Err(Error::InvalidArgument(format!(
                "staging path {path}; the connection has {} paths",
                self.inner.paths().len()
            )));
        }
        if self.legs.len() <= path {
            self.legs.resize_with(path + 1, || None);
        }
        if self.legs[path].is_some() {
            return Err(Error::InvalidUsage(format!(
                "path {path} is staged already"
            )));
        }
        if max_slots == 0 || max_slots > MAX_SLOTS {
            return Err(Error::InvalidArgument(format!(
                "a relay path staged for {max_slots} slots; accepted 1..={MAX_SLOTS}"
            )));
        }
        let words = 1 + LENGTH_RING + max_slots as usize * SLOT_WORDS;
        let ctrl = self.inner.alloc_ctrl(words)?;
        let keys = self
            .inner
            .keys_on(&ctrl.reg, path)
            .ok_or_else(|| Error::Internal(format!("control memory has no keys on path {path}")))?;
        let end = StagedEnd {
            credit: RemoteSeg {
                addr: ctrl.word(0),
                rkey: keys.rkey,
            },
            lengths: RemoteSeg {
                addr: ctrl.word(1),
                rkey: keys.rkey,
            },
        };
        self.legs[path] = Some(Leg {
            ctrl,
            lkey: keys.lkey,
            link: None,
            sender: None,
            queue: VecDeque::new(),
            sent: VecDeque::new(),
            credited: 0,
            imm_sent: 0,
            imm_seen: 0,
            done: VecDeque::new(),
            failed: None,
            reason: None,
        });
        Ok(end)
    }

    /// K and the peer are ready: this end's writes on `path` go to `link.ring`.
    pub fn attach(&mut self, path: usize, link: StagedLink) -> Result<()> {
        let leg = self.leg_mut(path)?;
        let room = (leg.ctrl.words - 1 - LENGTH_RING) / SLOT_WORDS;
        if link.slots as usize > room {
            return Err(Error::Remote(format!(
                "the relay's staging ring has {} slots; this end prepared descriptors for {room}",
                link.slots
            )));
        }
        leg.sender = Some(Sender::new(link.slots, link.slot_bytes)?);
        leg.link = Some(link);
        Ok(())
    }

    fn leg_mut(&mut self, path: usize) -> Result<&mut Leg> {
        self.legs
            .get_mut(path)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::Internal(format!("path {path} is not staged")))
    }

    fn staged(&self, path: usize) -> bool {
        matches!(self.legs.get(path), Some(Some(_)))
    }

    /// Cuts the comm's write into items (module docs) and queues them.
    fn queue_write(&mut self, path: usize, wr: &WriteWr) -> Result<()> {
        let leg = self.leg_mut(path)?;
        if leg.failed.is_some() {
            leg.done.push_back(Completion::without_data(
                wr.wr_id,
                WcStatus::WR_FLUSH_ERR,
                WcOpcode::RdmaWrite,
            ));
            return Ok(());
        }
        let (Some(link), Some(sender)) = (leg.link, leg.sender.as_ref()) else {
            return Err(Error::InvalidUsage(format!(
                "a write on relay path {path} before its relay is attached"
            )));
        };
        let payload = sender.max_payload();
        let len = wr.local.len as usize;
        let pieces = len.div_ceil(payload).max(1);
        for i in 0..pieces {
            let off = i * payload;
            let n = payload.min(len - off);
            let last = i + 1 == pieces;
            if last && pieces > 1 && wr.imm.is_some() {
                let index = leg.imm_sent;
                let word = LEN_FLAG | ((index & 0x7fff_ffff) << 32) | len as u64;
                leg.queue.push_back(Item::Write(Slotted::Length {
                    word,
                    remote: RemoteSeg {
                        addr: link.peer_lengths.addr + 8 * (index % LENGTH_RING as u64),
                        rkey: link.peer_lengths.rkey,
                    },
                }));
            }
            leg.queue.push_back(Item::Write(Slotted::Piece {
                local: LocalSeg {
                    addr: wr.local.addr + off as u64,
                    len: n as u32,
                    lkey: wr.local.lkey,
                },
                remote: RemoteSeg {
                    addr: wr.remote.addr + off as u64,
                    rkey: wr.remote.rkey,
                },
                imm: if last { wr.imm } else { None },
            }));
        }
        if wr.imm.is_some() {
            leg.imm_sent += 1;
        }
        leg.queue.push_back(Item::Done {
            wr_id: wr.wr_id,
            signaled: wr.signaled,
        });
        self.pump(path)
    }

    /// Gives queued items the free slots: a descriptor write and a payload write with the slot's
    /// immediate each, one doorbell per item.
    fn pump(&mut self, path: usize) -> Result<()> {
        let Some(Some(leg)) = self.legs.get_mut(path) else {
            return Ok(());
        };
        let (Some(link), Some(sender)) = (leg.link, leg.sender.as_mut()) else {
            return Ok(());
        };
        while let Some(&item) = leg.queue.front() {
            let write = match item {
                Item::Done { wr_id, signaled } => {
                    leg.queue.pop_front();
                    leg.sent.push_back((sender.sent(), wr_id, signaled));
                    continue;
                }
                Item::Write(w) => w,
            };
            let len = match write {
                Slotted::Piece { local, .. } => local.len,
                Slotted::Length { .. } => 8,
            };
            let Some(slot) = sender.reserve(len as usize)? else {
                break; // every slot waits for its credit
            };
            leg.queue.pop_front();
            let words = slot_words(&leg.ctrl, slot.seq, link.slots);
            let (local, remote, imm) = match write {
                Slotted::Piece { local, remote, imm } => (local, remote, imm),
                Slotted::Length { word, remote } => {
                    // The slot's own source word: free again once the slot is credited.
                    let src = words + 8 * DESC_WORDS as u64;
                    self.inner.ctrl_store(src, word, Ordering::Relaxed)?;
                    let local = LocalSeg {
                        addr: src,
                        len: 8,
                        lkey: leg.lkey,
                    };
                    (local, remote, None)
                }
            };
            let desc = Descriptor {
                len: local.len,
                addr: remote.addr,
                rkey: remote.rkey,
                imm,
            }
            .to_bytes();
            let mut dw = [0u64; DESC_WORDS];
            for (w, c) in dw.iter_mut().zip(desc.chunks_exact(8)) {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                *w = u64::from_ne_bytes(b);
            }
            // Published by the post below, as the comm's own control writes are.
            self.inner.ctrl_write(words, &dw)?;
            let at = link.ring.addr + slot.offset as u64;
            let wrs = [
                WriteWr {
                    wr_id: OWN | slot.seq,
                    local: LocalSeg {
                        addr: words,
                        len: DESC_LEN as u32,
                        lkey: leg.lkey,
                    },
                    remote: RemoteSeg {
                        addr: at,
                        rkey: link.ring.rkey,
                    },
                    imm: None,
                    signaled: false,
                    inline: true,
                },
                WriteWr {
                    wr_id: OWN | slot.seq,
                    local,
                    remote: RemoteSeg {
                        addr: at + DESC_LEN as u64,
                        rkey: link.ring.rkey,
                    },
                    imm: Some(slot.imm),
                    // Signaled so the send queue drains; the comm's completion waits for K's credit.
                    signaled: true,
                    inline: false,
                },
            ];
            self.inner.post_writes(path, &wrs)?;
        }
        Ok(())
    }

    /// K's credit word as it stands: completes the comm's writes whose every item landed.
    fn take_credit(&mut self, path: usize) -> Result<()> {
        let Some(Some(leg)) = self.legs.get_mut(path) else {
            return Ok(());
        };
        if leg.failed.is_some() {
            return Ok(());
        }
        let word = self.inner.ctrl_load(leg.credit_word(), Ordering::Acquire)?;
        let Some(sender) = leg.sender.as_mut() else {
            return Ok(());
        };
        let n = match sender.credit(word) {
            Ok(n) => n,
            Err(e) => {
                leg.reason = Some(e.to_string());
                leg.fail(WcStatus::REM_OP_ERR);
                return self.inner.stop_path(path);
            }
        };
        leg.credited += n;
        if n == 0 && !leg.sent.is_empty() {
            // Waiting for K: its writes completed at K long ago, so only the device (a cable
            // down) or K's credit says anything more; a dead cable fails what K never credited.
            if let Err(e) = self.inner.path_health(path) {
                leg.reason = Some(format!("the link to the relay: {e}"));
                leg.fail(WcStatus::RETRY_EXC_ERR);
                return self.inner.stop_path(path);
            }
        }
        while let Some(&(end, wr_id, signaled)) = leg.sent.front() {
            if end > leg.credited {
                break;
            }
            leg.sent.pop_front();
            if signaled {
                leg.done.push_back(Completion::without_data(
                    wr_id,
                    WcStatus::SUCCESS,
                    WcOpcode::RdmaWrite,
                ));
            }
        }
        Ok(())
    }

    /// A write with an immediate from the peer, through K: its whole length, if it was split. A
    /// length word that is not this write's fails the path (the completion becomes an error).
    fn fix_length(&mut self, path: usize, c: &mut Completion) -> Result<()> {
        let Some(Some(leg)) = self.legs.get_mut(path) else {
            return Ok(());
        };
        let index = leg.imm_seen;
        leg.imm_seen += 1;
        let at = leg.length_word(index);
        let word = self.inner.ctrl_load(at, Ordering::Acquire)?;
        if word == 0 {
            return Ok(()); // not split: the NIC's length is the write's
        }
        let tag = (word >> 32) & 0x7fff_ffff;
        if word & LEN_FLAG == 0
            || tag != index & 0x7fff_ffff
            || u64::from(c.byte_len) > word & 0xffff_ffff
        {
            leg.reason = Some(format!(
                "relay path {path}: length word {word:#x} for the peer's write {index} (its last \
                 slot {} bytes); expected the flag bit, {} and a length of at least that",
                c.byte_len,
                index & 0x7fff_ffff
            ));
            c.status = WcStatus::REM_OP_ERR;
            leg.fail(WcStatus::REM_OP_ERR);
            return self.inner.stop_path(path);
        }
        c.byte_len = word as u32;
        self.inner.ctrl_store(at, 0, Ordering::Relaxed)
    }
}

impl<F: Fabric> Fabric for Staged<F> {
    forward_fabric!(inner:
        paths, register, register_dmabuf, deregister, pinner, defer_paths, activate_path, keys_on,
        alloc_ctrl, free_ctrl, ctrl_load, ctrl_store, ctrl_read, ctrl_write, prepare_flush,
        path_device, post_recv, health,
    );

    fn path_health(&mut self, path: usize) -> Result<()> {
        if let Some(Some(leg)) = self.legs.get(path)
            && leg.failed.is_some()
        {
            return Err(Error::Remote(format!(
                "relay path {path} failed: {}",
                leg.reason
                    .as_deref()
                    .unwrap_or("its queue pair is in the error state")
            )));
        }
        self.inner.path_health(path)
    }

    fn path_note(&self, path: usize) -> Option<String> {
        match self.legs.get(path) {
            Some(Some(Leg {
                reason: Some(r), ..
            })) => Some(r.clone()),
            _ => self.inner.path_note(path),
        }
    }

    fn post_write(&mut self, path: usize, wr: &WriteWr) -> Result<()> {
        if self.staged(path) {
            self.queue_write(path, wr)
        } else {
            self.inner.post_write(path, wr)
        }
    }

    fn post_writes(&mut self, path: usize, wrs: &[WriteWr]) -> Result<()> {
        if !self.staged(path) {
            return self.inner.post_writes(path, wrs);
        }
        for wr in wrs {
            self.queue_write(path, wr)?;
        }
        Ok(())
    }

    fn post_read(&mut self, path: usize, wr: &ReadWr) -> Result<()> {
        if self.staged(path) {
            return Err(Error::InvalidUsage(format!(
                "an RDMA read on relay path {path}: no read crosses a relay (flush reads use \
                 loopback paths)"
            )));
        }
        self.inner.post_read(path, wr)
    }

    fn poll(&mut self, path: usize, max: usize, out: &mut Vec<Completion>) -> Result<usize> {
        if !self.staged(path) {
            return self.inner.poll(path, max, out);
        }
        self.take_credit(path)?;
        self.pump(path)?;
        let mut got = std::mem::take(&mut self.scratch);
        got.clear();
        let polled = self.inner.poll(path, max.max(16), &mut got);
        let mut res = polled.map(|_| ());
        for mut c in got.drain(..) {
            if res.is_err() {
                break;
            }
            if c.wr_id & (0xff << 56) == OWN {
                if !c.status.is_success() {
                    let leg = self.leg_mut(path)?;
                    leg.fail(c.status);
                }
                continue;
            }
            if c.status.is_success() && c.opcode == WcOpcode::RecvRdmaWithImm {
                res = self.fix_length(path, &mut c);
            }
            self.leg_mut(path)?.done.push_back(c);
        }
        self.scratch = got;
        res?;
        let leg = self.leg_mut(path)?;
        let n = leg.done.len().min(max);
        out.extend(leg.done.drain(..n));
        Ok(n)
    }

    fn shutdown(&mut self) -> Result<()> {
        for leg in self.legs.iter_mut().flatten() {
            leg.fail(WcStatus::WR_FLUSH_ERR);
        }
        self.inner.shutdown()
    }

    fn stop_path(&mut self, path: usize) -> Result<()> {
        if let Some(Some(leg)) = self.legs.get_mut(path) {
            leg.fail(WcStatus::WR_FLUSH_ERR);
        }
        self.inner.stop_path(path)
    }

    fn seal_path(&mut self, path: usize) -> Result<bool> {
        self.inner.seal_path(path)
    }

    fn revive_path(&mut self, path: usize) -> Result<Revive> {
        if self.staged(path) {
            return Ok(Revive::Down);
        }
        self.inner.revive_path(path)
    }
}
