//! The set-up messages of a verbs relay leg (docs/guide/relay.md, "Verbs legs: the design"; the
//! relay service reads and answers them, no client sends them yet): what A and K say on the door's TCP connection, which stays open as the
//! leg's control channel, to connect A's queue pair to K's on the A-K link and K's on the K-B link
//! to B's. Four fixed-size messages, little endian, each opening with `SWL`, its type, the version
//! and three reserved bytes:
//!
//! | message | from | bytes | content |
//! |---|---|---|---|
//! | offer | A | 60 | A's queue pair on the A-K link (QPN, PSN, GID, MTU); the ring A asks for (slots, slot bytes); A's credit word (address, key) |
//! | ready | K | 104 | K's queue pair on the A-K link and its ring for A's writes (address, key); K's queue pair on the K-B link and its ring for B's writes; the ring granted (at most what was asked) |
//! | peer | A | 52 | B's queue pair on the K-B link and B's credit word, from the handshake's reply |
//! | up | K | 8 | both of K's queue pairs are ready to send |
//!
//! A queue pair end is its QPN and PSN (24 bits each), its GID (16 bytes) and its path MTU (256 to
//! 4096, a power of two), 2 bytes reserved. A window is an address and a key, 4 bytes reserved: a
//! credit word is 8 bytes at its address, a ring `slots × slot bytes`, and neither may wrap the
//! address space. Everything is checked as it is parsed; what decodes encodes to the same bytes;
//! a parse error is an [`Error::Remote`] naming the message and the field.
#![forbid(unsafe_code)]

use std::ops::Range;

use super::staging::{MAX_SLOTS, check_geometry};
use crate::error::{Error, Result};

/// The version this build speaks.
pub const LEG_VERSION: u8 = 1;
/// Bytes of each message.
pub const OFFER_LEN: usize = 60;
pub const READY_LEN: usize = 104;
pub const PEER_LEN: usize = 52;
pub const UP_LEN: usize = 8;

const MAGIC: [u8; 3] = *b"SWL";
const T_OFFER: u8 = 1;
const T_READY: u8 = 2;
const T_PEER: u8 = 3;
const T_UP: u8 = 4;
const HEADER: usize = 8;
const END_LEN: usize = 28;
const WINDOW_LEN: usize = 16;
const GEOMETRY_LEN: usize = 8;

/// One end of a reliable-connected queue pair, as the other end needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpEnd {
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
    pub mtu: u16,
}

/// Registered memory the other end writes into: `addr` under `rkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub addr: u64,
    pub rkey: u32,
}

/// A staging ring's shape: `slots` slots of `slot_bytes` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub slots: u32,
    pub slot_bytes: u32,
}

impl Geometry {
    /// Bytes of the ring.
    pub fn bytes(&self) -> u64 {
        u64::from(self.slots) * u64::from(self.slot_bytes)
    }
}

/// A → K: A's end of the A-K queue pair, the ring it asks for, its credit word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    pub a: QpEnd,
    pub ring: Geometry,
    pub credit: Window,
}

/// K → A: K's two queue pair ends, its two rings (A's writes go into `ring_a`, B's into `ring_b`),
/// and the ring shape granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready {
    pub k_a: QpEnd,
    pub ring_a: Window,
    pub k_b: QpEnd,
    pub ring_b: Window,
    pub ring: Geometry,
}

/// A → K: B's end of the K-B queue pair and B's credit word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub b: QpEnd,
    pub credit: Window,
}

fn bad(msg: &str, what: String) -> Error {
    Error::Remote(format!("relay leg {msg}: {what}"))
}

/// Reads little-endian fields in order, naming the message in errors.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
    msg: &'static str,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Range<usize> {
        let r = self.at..self.at + n;
        self.at += n;
        r
    }
    fn u16(&mut self) -> u16 {
        let r = self.take(2);
        u16::from_le_bytes([self.b[r.start], self.b[r.start + 1]])
    }
    fn u32(&mut self) -> u32 {
        let r = self.take(4);
        let mut x = [0u8; 4];
        x.copy_from_slice(&self.b[r]);
        u32::from_le_bytes(x)
    }
    fn u64(&mut self) -> u64 {
        let r = self.take(8);
        let mut x = [0u8; 8];
        x.copy_from_slice(&self.b[r]);
        u64::from_le_bytes(x)
    }
    fn zeros(&mut self, n: usize, what: &str) -> Result<()> {
        let r = self.take(n);
        if self.b[r].iter().any(|&x| x != 0) {
            return Err(bad(
                self.msg,
                format!("{what}: reserved bytes are not zero"),
            ));
        }
        Ok(())
    }
    fn header(&mut self, ty: u8) -> Result<()> {
        let r = self.take(HEADER);
        let h = &self.b[r];
        if h[..3] != MAGIC || h[3] != ty {
            return Err(bad(
                self.msg,
                format!(
                    "magic and type {:02x?}, accepted {:02x?} (\"SWL\", {ty})",
                    &h[..4],
                    [MAGIC[0], MAGIC[1], MAGIC[2], ty]
                ),
            ));
        }
        if h[4] != LEG_VERSION {
            return Err(bad(
                self.msg,
                format!("version {}, accepted {LEG_VERSION}", h[4]),
            ));
        }
        if h[5..].iter().any(|&x| x != 0) {
            return Err(bad(self.msg, "header: reserved bytes are not zero".into()));
        }
        Ok(())
    }
    fn end(&mut self, what: &str) -> Result<QpEnd> {
        let qpn = self.u32();
        let psn = self.u32();
        let r = self.take(16);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&self.b[r]);
        let mtu = self.u16();
        self.zeros(2, what)?;
        for (name, v) in [("QPN", qpn), ("PSN", psn)] {
            if v >= 1 << 24 {
                return Err(bad(
                    self.msg,
                    format!("{what}: {name} {v:#x}, accepted below 0x1000000 (24 bits)"),
                ));
            }
        }
        if !(256..=4096).contains(&mtu) || !mtu.is_power_of_two() {
            return Err(bad(
                self.msg,
                format!("{what}: MTU {mtu}, accepted 256, 512, 1024, 2048 or 4096"),
            ));
        }
        Ok(QpEnd { qpn, psn, gid, mtu })
    }
    /// A window of `len` bytes (not wrapping the address space).
    fn window(&mut self, what: &str, len: u64) -> Result<Window> {
        let addr = self.u64();
        let rkey = self.u32();
        self.zeros(4, what)?;
        if addr.checked_add(len).is_none() {
            return Err(bad(
                self.msg,
                format!("{what}: {len} bytes at {addr:#x} wrap the address space"),
            ));
        }
        Ok(Window { addr, rkey })
    }
    fn geometry(&mut self, what: &str) -> Result<Geometry> {
        let slots = self.u32();
        let slot_bytes = self.u32();
        check_geometry(slots, slot_bytes as usize)
            .map_err(|e| bad(self.msg, format!("{what}: {e}")))?;
        Ok(Geometry { slots, slot_bytes })
    }
}

/// Writes fields in order.
struct Writer<'a> {
    b: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, x: &[u8]) {
        self.b[self.at..self.at + x.len()].copy_from_slice(x);
        self.at += x.len();
    }
    fn header(&mut self, ty: u8) {
        self.put(&[MAGIC[0], MAGIC[1], MAGIC[2], ty, LEG_VERSION, 0, 0, 0]);
    }
    fn end(&mut self, e: &QpEnd) {
        self.put(&e.qpn.to_le_bytes());
        self.put(&e.psn.to_le_bytes());
        self.put(&e.gid);
        self.put(&e.mtu.to_le_bytes());
        self.put(&[0, 0]);
    }
    fn window(&mut self, w: &Window) {
        self.put(&w.addr.to_le_bytes());
        self.put(&w.rkey.to_le_bytes());
        self.put(&[0; 4]);
    }
    fn geometry(&mut self, g: &Geometry) {
        self.put(&g.slots.to_le_bytes());
        self.put(&g.slot_bytes.to_le_bytes());
    }
}

const _: () = assert!(OFFER_LEN == HEADER + END_LEN + GEOMETRY_LEN + WINDOW_LEN);
const _: () = assert!(READY_LEN == HEADER + 2 * (END_LEN + WINDOW_LEN) + GEOMETRY_LEN);
const _: () = assert!(PEER_LEN == HEADER + END_LEN + WINDOW_LEN);
const _: () = assert!(MAX_SLOTS < u32::MAX);

impl Offer {
    pub fn parse(b: &[u8; OFFER_LEN]) -> Result<Offer> {
        let mut r = Reader {
            b,
            at: 0,
            msg: "offer",
        };
        r.header(T_OFFER)?;
        let a = r.end("A's queue pair")?;
        let ring = r.geometry("the ring asked for")?;
        let credit = r.window("A's credit word", 8)?;
        Ok(Offer { a, ring, credit })
    }

    pub fn to_bytes(&self) -> [u8; OFFER_LEN] {
        let mut b = [0u8; OFFER_LEN];
        let mut w = Writer { b: &mut b, at: 0 };
        w.header(T_OFFER);
        w.end(&self.a);
        w.geometry(&self.ring);
        w.window(&self.credit);
        b
    }
}

impl Ready {
    pub fn parse(b: &[u8; READY_LEN]) -> Result<Ready> {
        let mut r = Reader {
            b,
            at: 0,
            msg: "ready",
        };
        r.header(T_READY)?;
        let k_a = r.end("K's queue pair toward A")?;
        // The ring's size is known only at the end: the windows are checked against it after.
        let ring_a = r.window("K's ring for A's writes", 0)?;
        let k_b = r.end("K's queue pair toward B")?;
        let ring_b = r.window("K's ring for B's writes", 0)?;
        let ring = r.geometry("the ring granted")?;
        for (what, w) in [
            ("K's ring for A's writes", ring_a),
            ("K's ring for B's writes", ring_b),
        ] {
            if w.addr.checked_add(ring.bytes()).is_none() {
                return Err(bad(
                    "ready",
                    format!(
                        "{what}: {} bytes at {:#x} wrap the address space",
                        ring.bytes(),
                        w.addr
                    ),
                ));
            }
        }
        Ok(Ready {
            k_a,
            ring_a,
            k_b,
            ring_b,
            ring,
        })
    }

    pub fn to_bytes(&self) -> [u8; READY_LEN] {
        let mut b = [0u8; READY_LEN];
        let mut w = Writer { b: &mut b, at: 0 };
        w.header(T_READY);
        w.end(&self.k_a);
        w.window(&self.ring_a);
        w.end(&self.k_b);
        w.window(&self.ring_b);
        w.geometry(&self.ring);
        b
    }

    /// A's check of K's answer to its offer: K may grant fewer or smaller slots, never more.
    pub fn answers(&self, offer: &Offer) -> Result<()> {
        if self.ring.slots > offer.ring.slots || self.ring.slot_bytes > offer.ring.slot_bytes {
            return Err(bad(
                "ready",
                format!(
                    "K granted {} slots of {} bytes; A asked for at most {} of {}",
                    self.ring.slots, self.ring.slot_bytes, offer.ring.slots, offer.ring.slot_bytes
                ),
            ));
        }
        Ok(())
    }
}

impl Peer {
    pub fn parse(b: &[u8; PEER_LEN]) -> Result<Peer> {
        let mut r = Reader {
            b,
            at: 0,
            msg: "peer",
        };
        r.header(T_PEER)?;
        let e = r.end("B's queue pair")?;
        let credit = r.window("B's credit word", 8)?;
        Ok(Peer { b: e, credit })
    }

    pub fn to_bytes(&self) -> [u8; PEER_LEN] {
        let mut b = [0u8; PEER_LEN];
        let mut w = Writer { b: &mut b, at: 0 };
        w.header(T_PEER);
        w.end(&self.b);
        w.window(&self.credit);
        b
    }
}

/// K → A: both of K's queue pairs are ready to send.
pub fn up_bytes() -> [u8; UP_LEN] {
    let mut b = [0u8; UP_LEN];
    Writer { b: &mut b, at: 0 }.header(T_UP);
    b
}

/// Checks an up message.
pub fn parse_up(b: &[u8; UP_LEN]) -> Result<()> {
    Reader {
        b,
        at: 0,
        msg: "up",
    }
    .header(T_UP)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn end(q: u32) -> QpEnd {
        QpEnd {
            qpn: q,
            psn: 0xab_cdef,
            gid: [0xfe; 16],
            mtu: 4096,
        }
    }

    fn offer() -> Offer {
        Offer {
            a: end(0x11),
            ring: Geometry {
                slots: 64,
                slot_bytes: (512 << 10) + 32,
            },
            credit: Window {
                addr: 0x7f00_0000_1000,
                rkey: 7,
            },
        }
    }

    fn ready() -> Ready {
        Ready {
            k_a: end(0x22),
            ring_a: Window {
                addr: 0x5000_0000,
                rkey: 8,
            },
            k_b: end(0x33),
            ring_b: Window {
                addr: 0x6000_0000,
                rkey: 9,
            },
            ring: Geometry {
                slots: 32,
                slot_bytes: (512 << 10) + 32,
            },
        }
    }

    #[test]
    fn every_message_round_trips() {
        let o = offer();
        assert_eq!(Offer::parse(&o.to_bytes()).unwrap(), o);
        let r = ready();
        assert_eq!(Ready::parse(&r.to_bytes()).unwrap(), r);
        r.answers(&o).unwrap();
        let p = Peer {
            b: end(0xff_ffff),
            credit: Window {
                addr: u64::MAX - 8,
                rkey: 0,
            },
        };
        assert_eq!(Peer::parse(&p.to_bytes()).unwrap(), p);
        parse_up(&up_bytes()).unwrap();
    }

    /// One bad field at a time: each refused, naming the message and the field.
    #[test]
    fn bad_fields_are_refused_by_name() {
        let good = offer().to_bytes();
        let set = |at: usize, x: &[u8]| {
            let mut b = good;
            b[at..at + x.len()].copy_from_slice(x);
            Offer::parse(&b).unwrap_err().to_string()
        };
        for (at, x, want) in [
            (0, &b"SWX"[..], "relay leg offer: magic and type"),
            (3, &[T_READY][..], "magic and type"),
            (4, &[2][..], "version 2, accepted 1"),
            (6, &[1][..], "header: reserved"),
            (
                8,
                &0x100_0000u32.to_le_bytes()[..],
                "A's queue pair: QPN 0x1000000",
            ),
            (12, &u32::MAX.to_le_bytes()[..], "A's queue pair: PSN"),
            (32, &1500u16.to_le_bytes()[..], "MTU 1500, accepted 256"),
            (34, &[1][..], "A's queue pair: reserved"),
            (36, &0u32.to_le_bytes()[..], "ring of 0 slots"),
            (40, &32u32.to_le_bytes()[..], "slots of 32 bytes"),
            (
                44,
                &(u64::MAX - 4).to_le_bytes()[..],
                "A's credit word: 8 bytes at",
            ),
            (56, &[0, 0, 0, 1][..], "A's credit word: reserved"),
        ] {
            let e = set(at, x);
            assert!(e.contains(want), "{at}: {e}");
        }
        let mut b = ready().to_bytes();
        b[36..44].copy_from_slice(&(u64::MAX - 100).to_le_bytes());
        let e = Ready::parse(&b).unwrap_err().to_string();
        assert!(
            e.contains("K's ring for A's writes") && e.contains("wrap"),
            "{e}"
        );
        let mut more = ready();
        more.ring.slots = 65;
        let e = more.answers(&offer()).unwrap_err().to_string();
        assert!(e.contains("K granted 65 slots"), "{e}");
        let mut u = up_bytes();
        u[7] = 1;
        assert!(parse_up(&u).is_err());
        assert!(Peer::parse(&[0; PEER_LEN]).is_err());
    }
}
