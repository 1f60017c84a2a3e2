//! The sans-IO core of a relay path over verbs (docs/guide/relay.md, "Verbs legs: the design";
//! driven by [`super::staged`] at A and B and [`super::forward`] at K): the [`Descriptor`] A
//! writes ahead of each payload, the staging [`Ring`] at K that takes A's writes in order and says
//! what to forward where, and A's [`Sender`], which picks the slot of the next write and counts
//! writes landed from K's credits.
//!
//! A write crosses as two RDMA writes from A into K's next slot, in order on one queue pair: the
//! descriptor (a plain write at the slot's start), then the payload with an immediate (the write's
//! sequence number, low 32 bits) right after it; and one write out of that slot into B's buffer with B's address, B's key and A's own immediate, if any. K's NIC checks
//! nothing of B's; B's NIC checks the key and bounds, as on any path. K credits A with the number
//! of writes whose forward B's NIC acknowledged, so A counts a write landed only once it is in B's
//! memory: a write K held when it died never counts, as with the TCP relay's acknowledgement
//! frames. A reads the credit word with acquire semantics (the NIC writes it; AArch64 hosts).
//!
//! Everything a peer controls (the immediate, the completion's length, the descriptor, the
//! credit) is checked with checked arithmetic; a violation is an [`Error::Remote`] that ends the
//! leg.
#![forbid(unsafe_code)]

use std::ops::Range;

use crate::error::{Error, Result};

/// Bytes of a descriptor.
pub const DESC_LEN: usize = 32;
/// The descriptor version this build writes and reads.
pub const DESC_VERSION: u8 = 1;
/// Slots a ring may have: enough to cover a leg's bandwidth-delay product with 512 KiB slots,
/// few enough that a client's staging stays bounded.
pub const MAX_SLOTS: u32 = 256;

const DESC_MAGIC: [u8; 4] = *b"SWSD";
/// Flag bit: the write carries an immediate for B.
const HAS_IMM: u8 = 1;

/// The bytes of a descriptor, named once.
mod field {
    use std::ops::Range;
    pub const MAGIC: Range<usize> = 0..4;
    pub const VERSION: usize = 4;
    pub const FLAGS: usize = 5;
    pub const RESERVED_A: Range<usize> = 6..8;
    pub const LEN: Range<usize> = 8..12;
    pub const RKEY: Range<usize> = 12..16;
    pub const ADDR: Range<usize> = 16..24;
    pub const IMM: Range<usize> = 24..28;
    pub const RESERVED_B: Range<usize> = 28..32;
}

/// What A's write asks K to forward: `len` payload bytes to B's `addr` under B's `rkey`, with
/// A's immediate `imm` (`None`: a plain write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    pub len: u32,
    pub addr: u64,
    pub rkey: u32,
    pub imm: Option<u32>,
}

fn bad(what: String) -> Error {
    Error::Remote(format!("relay staging descriptor: {what}"))
}

fn le32(b: &[u8; DESC_LEN], r: Range<usize>) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[r]);
    u32::from_le_bytes(x)
}

impl Descriptor {
    /// Checks magic, version, flags and reserved bytes (zero): what decodes encodes to the same
    /// bytes.
    pub fn parse(b: &[u8; DESC_LEN]) -> Result<Descriptor> {
        if b[field::MAGIC] != DESC_MAGIC {
            return Err(bad(format!(
                "magic {:02x?}, accepted {:02x?} (\"SWSD\")",
                &b[field::MAGIC],
                DESC_MAGIC
            )));
        }
        if b[field::VERSION] != DESC_VERSION {
            return Err(bad(format!(
                "version {}, accepted {DESC_VERSION}",
                b[field::VERSION]
            )));
        }
        let flags = b[field::FLAGS];
        if flags & !HAS_IMM != 0 {
            return Err(bad(format!("flags {flags:#04x}, accepted 0 or 1")));
        }
        if b[field::RESERVED_A]
            .iter()
            .chain(&b[field::RESERVED_B])
            .any(|&x| x != 0)
        {
            return Err(bad("reserved bytes are not zero".into()));
        }
        let imm = le32(b, field::IMM);
        if flags & HAS_IMM == 0 && imm != 0 {
            return Err(bad(format!(
                "an immediate ({imm:#x}) without the flag that says there is one"
            )));
        }
        let mut addr = [0u8; 8];
        addr.copy_from_slice(&b[field::ADDR]);
        Ok(Descriptor {
            len: le32(b, field::LEN),
            addr: u64::from_le_bytes(addr),
            rkey: le32(b, field::RKEY),
            imm: (flags & HAS_IMM != 0).then_some(imm),
        })
    }

    pub fn to_bytes(&self) -> [u8; DESC_LEN] {
        let mut b = [0u8; DESC_LEN];
        b[field::MAGIC].copy_from_slice(&DESC_MAGIC);
        b[field::VERSION] = DESC_VERSION;
        b[field::FLAGS] = if self.imm.is_some() { HAS_IMM } else { 0 };
        b[field::LEN].copy_from_slice(&self.len.to_le_bytes());
        b[field::RKEY].copy_from_slice(&self.rkey.to_le_bytes());
        b[field::ADDR].copy_from_slice(&self.addr.to_le_bytes());
        b[field::IMM].copy_from_slice(&self.imm.unwrap_or(0).to_le_bytes());
        b
    }
}

/// The geometry both ends agree on at set-up: `slots` slots of `slot_bytes` each (a descriptor
/// and at most `slot_bytes - DESC_LEN` payload bytes).
pub(crate) fn check_geometry(slots: u32, slot_bytes: usize) -> Result<usize> {
    if slots == 0 || slots > MAX_SLOTS {
        return Err(Error::InvalidArgument(format!(
            "relay staging ring of {slots} slots; accepted 1..={MAX_SLOTS}"
        )));
    }
    if slot_bytes <= DESC_LEN || u32::try_from(slot_bytes - DESC_LEN).is_err() {
        return Err(Error::InvalidArgument(format!(
            "relay staging slots of {slot_bytes} bytes; accepted {}..={} (a {DESC_LEN}-byte \
             descriptor and a payload)",
            DESC_LEN + 1,
            u32::MAX as usize + DESC_LEN
        )));
    }
    (slots as usize).checked_mul(slot_bytes).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "relay staging ring of {slots} slots of {slot_bytes} bytes overflows"
        ))
    })
}

/// What K posts for one of A's writes: `len` bytes at `offset` in the ring (the payload, after
/// the descriptor) to B's `addr` under `rkey`, with `imm`; `seq` names it for the credit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forward {
    pub seq: u64,
    pub offset: usize,
    pub len: usize,
    pub addr: u64,
    pub rkey: u32,
    pub imm: Option<u32>,
}

/// One direction of a verbs leg at K: the staging ring A writes into, in order.
#[derive(Debug)]
pub struct Ring {
    slots: u32,
    slot_bytes: usize,
    /// The sequence of A's next write.
    next: u64,
    /// Writes whose forward B's NIC acknowledged (every sequence below it): the credit.
    landed: u64,
}

impl Ring {
    pub fn new(slots: u32, slot_bytes: usize) -> Result<Ring> {
        check_geometry(slots, slot_bytes)?;
        Ok(Ring {
            slots,
            slot_bytes,
            next: 0,
            landed: 0,
        })
    }

    /// Bytes to register for the ring.
    pub fn bytes(&self) -> usize {
        self.slots as usize * self.slot_bytes
    }

    /// Where the descriptor of A's next write lands (K reads it there once the write completes).
    pub fn next_descriptor(&self) -> Range<usize> {
        let at = self.slot_offset(self.next);
        at..at + DESC_LEN
    }

    fn slot_offset(&self, seq: u64) -> usize {
        (seq % u64::from(self.slots)) as usize * self.slot_bytes
    }

    /// A's payload write completed at K with immediate `imm` and `byte_len` bytes; `desc` is what
    /// its descriptor write put at [`Ring::next_descriptor`] before it. Returns what to forward, or
    /// why the leg must end: a write out of order, one past the credits A was given, a descriptor
    /// that does not parse, a length that is not the descriptor's or does not fit a slot.
    pub fn arrived(&mut self, imm: u32, byte_len: u32, desc: &[u8; DESC_LEN]) -> Result<Forward> {
        let seq = self.next;
        if imm != seq as u32 {
            return Err(Error::Remote(format!(
                "relay staging: write {imm} arrived where write {} was due (out of order)",
                seq as u32
            )));
        }
        if seq - self.landed >= u64::from(self.slots) {
            return Err(Error::Remote(format!(
                "relay staging: write {seq} arrived with {} writes not yet credited, in a ring of \
                 {} slots (the client overran its credits)",
                seq - self.landed,
                self.slots
            )));
        }
        let d = Descriptor::parse(desc)?;
        if byte_len != d.len {
            return Err(Error::Remote(format!(
                "relay staging: write {seq} is {byte_len} bytes, its descriptor says {}",
                d.len
            )));
        }
        if byte_len as usize > self.slot_bytes - DESC_LEN {
            return Err(Error::Remote(format!(
                "relay staging: write {seq} is {byte_len} bytes, a slot holds {} after its \
                 descriptor",
                self.slot_bytes - DESC_LEN
            )));
        }
        self.next += 1;
        Ok(Forward {
            seq,
            offset: self.slot_offset(seq) + DESC_LEN,
            len: d.len as usize,
            addr: d.addr,
            rkey: d.rkey,
            imm: d.imm,
        })
    }

    /// The forward of write `seq` completed (B's NIC acknowledged it): returns the credit to write
    /// into A's credit word. Forwards complete in order (one RC queue pair); anything else is a
    /// fault of the caller.
    pub fn forwarded(&mut self, seq: u64) -> Result<u64> {
        if seq != self.landed || seq >= self.next {
            return Err(Error::Internal(format!(
                "relay staging: forward {seq} completed; due: {} (of {} arrived)",
                self.landed, self.next
            )));
        }
        self.landed += 1;
        Ok(self.landed)
    }
}

/// Where A's next write goes: K's slot at `offset` in its ring, immediate `imm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub seq: u64,
    pub imm: u32,
    pub offset: usize,
}

/// One direction of a verbs leg at A: which slot each write takes, and which writes K's credits
/// complete.
#[derive(Debug)]
pub struct Sender {
    slots: u32,
    slot_bytes: usize,
    next: u64,
    credited: u64,
}

impl Sender {
    pub fn new(slots: u32, slot_bytes: usize) -> Result<Sender> {
        check_geometry(slots, slot_bytes)?;
        Ok(Sender {
            slots,
            slot_bytes,
            next: 0,
            credited: 0,
        })
    }

    /// The largest payload one write carries.
    pub fn max_payload(&self) -> usize {
        self.slot_bytes - DESC_LEN
    }

    /// Writes given a slot so far.
    pub fn sent(&self) -> u64 {
        self.next
    }

    /// Writes sent and not yet credited.
    pub fn in_flight(&self) -> u64 {
        self.next - self.credited
    }

    /// The slot of the next write of `len` payload bytes; `None` while every slot waits for its
    /// credit (call again after [`Sender::credit`]).
    pub fn reserve(&mut self, len: usize) -> Result<Option<Slot>> {
        if len > self.max_payload() {
            return Err(Error::InvalidArgument(format!(
                "a relayed write of {len} bytes; a staging slot carries at most {}",
                self.max_payload()
            )));
        }
        if self.in_flight() >= u64::from(self.slots) {
            return Ok(None);
        }
        let seq = self.next;
        self.next += 1;
        Ok(Some(Slot {
            seq,
            imm: seq as u32,
            offset: (seq % u64::from(self.slots)) as usize * self.slot_bytes,
        }))
    }

    /// K's credit word as read now: returns how many more writes landed in B's memory (the
    /// oldest first). An older value than one already seen is a stale read (0); one above the
    /// writes sent is a lie, and ends the leg.
    pub fn credit(&mut self, word: u64) -> Result<u64> {
        if word <= self.credited {
            return Ok(0);
        }
        if word > self.next {
            return Err(Error::Remote(format!(
                "relay staging: the relay credited {word} writes; {} were sent",
                self.next
            )));
        }
        let n = word - self.credited;
        self.credited = word;
        Ok(n)
    }

    /// The path failed: the writes never credited (their sequences), which the comm protocol
    /// sends again on another path; no later credit counts.
    pub fn seal(&mut self) -> Range<u64> {
        let lost = self.credited..self.next;
        self.credited = self.next;
        lost
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn d(len: u32, imm: Option<u32>) -> Descriptor {
        Descriptor {
            len,
            addr: 0x7f00_dead_0000 + u64::from(len),
            rkey: 0x1234,
            imm,
        }
    }

    #[test]
    fn descriptors_round_trip_and_refuse_what_they_do_not_define() {
        for x in [d(0, None), d(1, Some(0)), d(512 << 10, Some(u32::MAX))] {
            assert_eq!(Descriptor::parse(&x.to_bytes()).unwrap(), x);
        }
        let good = d(4096, Some(7)).to_bytes();
        let cases: [(usize, u8, &str); 5] = [
            (0, b'X', "magic"),
            (4, 2, "version 2, accepted 1"),
            (5, 3, "flags 0x03, accepted 0 or 1"),
            (7, 1, "reserved bytes"),
            (31, 9, "reserved bytes"),
        ];
        for (at, v, want) in cases {
            let mut b = good;
            b[at] = v;
            let e = Descriptor::parse(&b).unwrap_err();
            assert!(matches!(e, Error::Remote(_)), "{e:?}");
            assert!(e.to_string().contains(want), "{e}");
        }
        let mut b = d(8, None).to_bytes();
        b[24] = 1;
        let e = Descriptor::parse(&b).unwrap_err().to_string();
        assert!(e.contains("without the flag"), "{e}");
    }

    #[test]
    fn geometry_is_bounded_and_named() {
        for (slots, bytes) in [(0, 4096), (MAX_SLOTS + 1, 4096), (4, DESC_LEN), (4, 0)] {
            let e = Ring::new(slots, bytes).unwrap_err().to_string();
            assert!(e.contains("accepted"), "{e}");
            assert!(Sender::new(slots, bytes).is_err());
        }
        let r = Ring::new(8, 4096).unwrap();
        assert_eq!(r.bytes(), 8 * 4096);
    }

    /// A sends, K forwards, B's acknowledgements credit A: many times round a small ring, with
    /// every slot's offset where both ends expect it.
    #[test]
    fn writes_cross_in_order_and_complete_on_the_relays_credit() {
        let (slots, sb) = (4u32, 1024usize);
        let mut a = Sender::new(slots, sb).unwrap();
        let mut k = Ring::new(slots, sb).unwrap();
        let mut landed = 0u64;
        let mut queue = std::collections::VecDeque::new();
        for i in 0..50u32 {
            let len = (i as usize * 37) % a.max_payload();
            let s = loop {
                if let Some(s) = a.reserve(len).unwrap() {
                    break s;
                }
                // Every slot waits: K forwards the oldest and credits it.
                let f: Forward = queue.pop_front().unwrap();
                let credit = k.forwarded(f.seq).unwrap();
                landed += a.credit(credit).unwrap();
            };
            assert_eq!(s.seq, u64::from(i));
            assert_eq!(k.next_descriptor().start, s.offset);
            let desc = d(len as u32, (i % 3 != 0).then_some(i)).to_bytes();
            let f = k.arrived(s.imm, len as u32, &desc).unwrap();
            assert_eq!(f.offset, s.offset + DESC_LEN);
            assert_eq!((f.len, f.imm), (len, (i % 3 != 0).then_some(i)));
            queue.push_back(f);
        }
        while let Some(f) = queue.pop_front() {
            landed += a.credit(k.forwarded(f.seq).unwrap()).unwrap();
        }
        assert_eq!((landed, a.in_flight()), (50, 0));
        // A stale read of the credit word completes nothing.
        assert_eq!(a.credit(10).unwrap(), 0);
    }

    #[test]
    fn the_relay_refuses_writes_out_of_order_past_the_credits_or_of_the_wrong_length() {
        let mut k = Ring::new(2, 256).unwrap();
        let desc = d(100, None).to_bytes();
        let e = k.arrived(1, 100, &desc).unwrap_err().to_string();
        assert!(e.contains("out of order"), "{e}");
        let e = k.arrived(0, 99, &desc).unwrap_err().to_string();
        assert!(e.contains("its descriptor says 100"), "{e}");
        let e = k.arrived(0, 225, &d(225, None).to_bytes()).unwrap_err();
        assert!(e.to_string().contains("a slot holds 224 after"), "{e}");
        k.arrived(0, 224, &d(224, None).to_bytes()).unwrap();
        let mut k = Ring::new(2, 256).unwrap();
        let e = k.arrived(0, 0, &[0; DESC_LEN]).unwrap_err().to_string();
        assert!(e.contains("magic"), "{e}");
        // Two slots: a third write before a credit overran them.
        k.arrived(0, 100, &desc).unwrap();
        k.arrived(1, 100, &desc).unwrap();
        let e = k.arrived(2, 100, &desc).unwrap_err().to_string();
        assert!(e.contains("overran its credits"), "{e}");
        assert_eq!(k.forwarded(0).unwrap(), 1);
        k.arrived(2, 100, &desc).unwrap();
        // Forwards complete in order.
        assert!(k.forwarded(2).is_err());
        assert_eq!(k.forwarded(1).unwrap(), 2);
    }

    #[test]
    fn the_immediate_wraps_with_the_sequence() {
        let mut a = Sender::new(4, 128).unwrap();
        let mut k = Ring::new(4, 128).unwrap();
        let start = u64::from(u32::MAX) - 1;
        (a.next, a.credited, k.next, k.landed) = (start, start, start, start);
        for want in [u32::MAX - 1, u32::MAX, 0, 1] {
            let s = a.reserve(8).unwrap().unwrap();
            assert_eq!(s.imm, want);
            let f = k.arrived(s.imm, 8, &d(8, None).to_bytes()).unwrap();
            assert_eq!(f.seq, s.seq);
        }
        assert_eq!(a.credit(start + 4).unwrap(), 4);
    }

    #[test]
    fn credits_beyond_what_was_sent_end_the_leg_and_a_seal_names_the_lost_writes() {
        let mut a = Sender::new(8, 4096).unwrap();
        for _ in 0..5 {
            a.reserve(4000).unwrap().unwrap();
        }
        assert!(a.reserve(4065).is_err(), "bigger than a slot's payload");
        let e = a.credit(6).unwrap_err().to_string();
        assert!(e.contains("credited 6 writes; 5 were sent"), "{e}");
        assert_eq!(a.credit(2).unwrap(), 2);
        assert_eq!(a.seal(), 2..5);
        assert_eq!(a.credit(5).unwrap(), 0, "no credit counts after the seal");
        assert_eq!(a.in_flight(), 0);
    }
}
