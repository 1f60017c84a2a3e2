//! A verbs leg at the relay host K: [`Forwarder`] drives the two queue pairs of one relay path
//! (end 0 connected to A's, end 1 to B's) and one staging ring per direction
//! ([`super::staging::Ring`]), blind: it reads only each slot's descriptor, posts the write out
//! of the slot into the far end's memory with the far end's key and immediate, and once that
//! write completed (the far end's NIC acknowledged it) writes the credit into the sender's
//! credit word. Both ends run [`super::staged::Staged`].
//!
//! Generic over [`Fabric`], each end one endpoint with the path's queue pair, so the in-process
//! fabric tests it; nothing here blocks. Any fault (a completion error, a write out of order or
//! past its credits, a descriptor that does not parse) ends the leg: both queue pairs go to the
//! error state, so both ends see their path fail, and the forwarder keeps the reason.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::sys::rawmem::{HostBuffer, Lent};
use crate::transport::fabric::{
    Completion, CtrlMem, Fabric, LocalSeg, MemKind, Registration, RemoteSeg, WcOpcode, WriteWr,
};

use super::staging::{DESC_LEN, Ring};

/// The memory of one staging ring, as K's CPU reads it.
pub trait StagingMem {
    /// The ring's bytes, to register on both ends' devices.
    fn lent(&self) -> Lent;
    /// Copies the descriptor at `offset` (after the completion of the write that follows it).
    fn read_desc(&self, offset: usize) -> Result<[u8; DESC_LEN]>;
}

impl StagingMem for HostBuffer {
    fn lent(&self) -> Lent {
        self.lend()
    }

    fn read_desc(&self, offset: usize) -> Result<[u8; DESC_LEN]> {
        let v = self.read(offset, DESC_LEN)?;
        let mut d = [0u8; DESC_LEN];
        d.copy_from_slice(&v);
        Ok(d)
    }
}

const RECV: u64 = 0xb1 << 56;
const FWD: u64 = 0xb2 << 56;
const CREDIT: u64 = 0xb3 << 56;
const KIND: u64 = 0xff << 56;
/// Completions taken per end and call.
const BATCH: usize = 64;

/// Counters of one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirStats {
    /// Writes forwarded and acknowledged by the far end.
    pub forwarded: u64,
    /// Payload bytes of the writes posted to the far end (acknowledged or not yet).
    pub bytes: u64,
    /// Credit writes posted to the sender.
    pub credits: u64,
}

/// One direction: the ring its sender writes into through end `rx`, forwarded through the other.
struct Dir<M: StagingMem> {
    mem: M,
    base: u64,
    ring: Ring,
    /// Registrations of the ring on end 0 and end 1.
    regs: [Registration; 2],
    /// The sender's credit word (on the sender's side of end `rx`), once known.
    credit_to: Option<RemoteSeg>,
    /// K's source word of the credit write, on end `rx`.
    credit_src: CtrlMem,
    credit_due: u64,
    credit_posted: u64,
    stats: DirStats,
}

/// K's half of one relay path over verbs (module docs).
pub struct Forwarder<F: Fabric, M: StagingMem> {
    ends: [F; 2],
    paths: [usize; 2],
    dirs: [Dir<M>; 2],
    ended: Option<String>,
    got: Vec<Completion>,
}

impl<F: Fabric, M: StagingMem> Forwarder<F, M> {
    /// Registers the rings (`rings[0]` for A's writes, `rings[1]` for B's) on both ends, posts a
    /// receive per slot for each, and allocates the credit source words. `credit_a` is A's
    /// credit word (from A's offer); B's comes with [`Forwarder::peer`].
    pub fn new(
        mut ends: [F; 2],
        paths: [usize; 2],
        rings: [M; 2],
        slots: u32,
        slot_bytes: usize,
        credit_a: RemoteSeg,
    ) -> Result<Forwarder<F, M>> {
        let [m0, m1] = rings;
        let mut dirs = Vec::with_capacity(2);
        for (rx, mem) in [(0usize, m0), (1usize, m1)] {
            let ring = Ring::new(slots, slot_bytes)?;
            let lent = mem.lent();
            if lent.len() < ring.bytes() {
                return Err(Error::InvalidArgument(format!(
                    "a staging ring of {} bytes for {slots} slots of {slot_bytes}",
                    lent.len()
                )));
            }
            let regs = [
                ends[0].register(&lent, MemKind::Host)?,
                ends[1].register(&lent, MemKind::Host)?,
            ];
            let credit_src = ends[rx].alloc_ctrl(1)?;
            for _ in 0..slots {
                ends[rx].post_recv(paths[rx], RECV)?;
            }
            dirs.push(Dir {
                base: lent.addr(),
                mem,
                ring,
                regs,
                credit_to: (rx == 0).then_some(credit_a),
                credit_src,
                credit_due: 0,
                credit_posted: 0,
                stats: DirStats::default(),
            });
        }
        let (Some(d1), Some(d0)) = (dirs.pop(), dirs.pop()) else {
            return Err(Error::Internal("relay forwarder: two directions".into()));
        };
        Ok(Forwarder {
            ends,
            paths,
            dirs: [d0, d1],
            ended: None,
            got: Vec::new(),
        })
    }

    /// Where the sender on end `rx` (0: A, 1: B) writes: the ring's address and its key there.
    pub fn ring(&self, rx: usize) -> Result<RemoteSeg> {
        let d = self.dir(rx)?;
        let keys = self.ends[rx]
            .keys_on(&d.regs[rx], self.paths[rx])
            .ok_or_else(|| Error::Internal(format!("staging ring has no key on end {rx}")))?;
        Ok(RemoteSeg {
            addr: d.base,
            rkey: keys.rkey,
        })
    }

    /// End `i` (0: the queue pair to A, 1: to B), e.g. to connect it once its far end is known.
    pub fn end(&self, i: usize) -> Result<&F> {
        self.ends
            .get(i)
            .ok_or_else(|| Error::InvalidArgument(format!("relay leg end {i}; accepted 0 or 1")))
    }

    /// B's credit word (from B's answer to the hello).
    pub fn peer(&mut self, credit_b: RemoteSeg) -> Result<()> {
        self.dirs[1].credit_to = Some(credit_b);
        self.post_credits()
    }

    fn dir(&self, rx: usize) -> Result<&Dir<M>> {
        self.dirs
            .get(rx)
            .ok_or_else(|| Error::InvalidArgument(format!("relay leg end {rx}; accepted 0 or 1")))
    }

    /// Counters of the direction whose sender is end `rx`.
    pub fn stats(&self, rx: usize) -> DirStats {
        self.dirs.get(rx).map(|d| d.stats).unwrap_or_default()
    }

    /// Why the leg ended, once it did.
    pub fn ended(&self) -> Option<&str> {
        self.ended.as_deref()
    }

    /// Takes what both queue pairs completed and moves each write on; returns how many
    /// completions it handled. An error ends the leg (both queue pairs to the error state) and is
    /// returned by every later call.
    pub fn poll(&mut self) -> Result<usize> {
        if let Some(why) = &self.ended {
            return Err(Error::Remote(why.clone()));
        }
        match self.step() {
            Ok(n) => Ok(n),
            Err(e) => {
                let why = format!("relay leg ended: {e}");
                self.ended = Some(why.clone());
                for end in &mut self.ends {
                    // Both queue pairs in the error state: each end's path fails; a shutdown
                    // that fails too leaves nothing more to do here.
                    let _ = end.shutdown();
                }
                Err(Error::Remote(why))
            }
        }
    }

    /// Ends the leg (K's service stops it, or the client closed the door's connection).
    pub fn close(&mut self, why: &str) {
        if self.ended.is_none() {
            self.ended = Some(format!("relay leg closed: {why}"));
            for end in &mut self.ends {
                let _ = end.shutdown();
            }
        }
    }

    fn step(&mut self) -> Result<usize> {
        let mut handled = 0;
        let mut got = std::mem::take(&mut self.got);
        for e in 0..2 {
            got.clear();
            self.ends[e].poll(self.paths[e], BATCH, &mut got)?;
            for c in &got {
                handled += 1;
                self.complete(e, c)?;
            }
        }
        self.got = got;
        self.post_credits()?;
        Ok(handled)
    }

    /// One completion on end `e`.
    fn complete(&mut self, e: usize, c: &Completion) -> Result<()> {
        let what = match c.wr_id & KIND {
            RECV => "a write into staging",
            FWD => "a forwarded write",
            CREDIT => "a credit write",
            _ => "an unknown work request",
        };
        if !c.status.is_success() {
            return Err(Error::Remote(format!(
                "{what} on end {e} completed with {}",
                c.status
            )));
        }
        match c.wr_id & KIND {
            RECV if c.opcode == WcOpcode::RecvRdmaWithImm => {
                let imm = c.imm.ok_or_else(|| {
                    Error::Remote(format!("a write into staging on end {e} without immediate"))
                })?;
                let d = &mut self.dirs[e];
                let desc = d.mem.read_desc(d.ring.next_descriptor().start)?;
                let f = d.ring.arrived(imm, c.byte_len, &desc)?;
                let out = 1 - e;
                let lkey = self.ends[out]
                    .keys_on(&d.regs[out], self.paths[out])
                    .ok_or_else(|| {
                        Error::Internal(format!("staging ring has no key on end {out}"))
                    })?
                    .lkey;
                let wr = WriteWr {
                    wr_id: FWD | (e as u64) << 48 | (f.seq & 0xffff_ffff_ffff),
                    local: LocalSeg {
                        addr: d.base + f.offset as u64,
                        len: f.len as u32,
                        lkey,
                    },
                    remote: RemoteSeg {
                        addr: f.addr,
                        rkey: f.rkey,
                    },
                    imm: f.imm,
                    signaled: true,
                    inline: false,
                };
                d.stats.bytes += f.len as u64;
                self.ends[out].post_write(self.paths[out], &wr)?;
                // The slot's receive again: A may write at most `slots` ahead of the credits.
                self.ends[e].post_recv(self.paths[e], RECV)
            }
            FWD => {
                let rx = ((c.wr_id >> 48) & 1) as usize;
                let d = &mut self.dirs[rx];
                // Forwards of one direction complete in order on one queue pair: the oldest.
                let credit = d.ring.forwarded(d.credit_due)?;
                d.credit_due = credit;
                d.stats.forwarded += 1;
                Ok(())
            }
            CREDIT => Ok(()),
            _ => Err(Error::Remote(format!(
                "{what} (wr_id {:#x}, {:?}) on end {e}",
                c.wr_id, c.opcode
            ))),
        }
    }

    /// Writes each direction's credit, if it moved, into its sender's credit word.
    fn post_credits(&mut self) -> Result<()> {
        for rx in 0..2 {
            let d = &mut self.dirs[rx];
            let Some(to) = d.credit_to else { continue };
            if d.credit_due == d.credit_posted {
                continue;
            }
            let src = d.credit_src.word(0);
            let lkey = self.ends[rx]
                .keys_on(&d.credit_src.reg, self.paths[rx])
                .ok_or_else(|| Error::Internal(format!("credit word has no key on end {rx}")))?
                .lkey;
            // A credit write still reading the word may read this newer value: credits only grow,
            // and each counts writes already acknowledged.
            self.ends[rx].ctrl_store(src, d.credit_due, Ordering::Release)?;
            let wr = WriteWr {
                wr_id: CREDIT | d.credit_due & 0xffff_ffff_ffff,
                local: LocalSeg {
                    addr: src,
                    len: 8,
                    lkey,
                },
                remote: to,
                imm: None,
                signaled: true,
                inline: true,
            };
            self.ends[rx].post_write(self.paths[rx], &wr)?;
            d.credit_posted = d.credit_due;
            d.stats.credits += 1;
        }
        Ok(())
    }
}
