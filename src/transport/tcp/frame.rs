//! The TCP fabric's wire formats, all little endian: the 40-byte frame header that precedes every
//! payload ([`Frame`], [`FrameRepr`]), and a stream's opening: the acceptor's challenge
//! ([`ChallengeRepr`]), the hello the connector answers it with ([`Hello`], [`HelloRepr`]) and the
//! acceptor's acknowledgement ([`Ack`], [`AckRepr`]); their tags are `super::auth`'s.
//!
//! Each view names the bytes of a field once (`mod field`); its `Repr` parses (validating) and
//! emits. If `new_checked` returned `Ok`, no accessor or setter panics. Parse errors are
//! [`Error::Remote`]: the bytes come from the peer. Reserved bytes are zero when emitted and
//! ignored when parsed.
#![forbid(unsafe_code)]

use std::ops::Range;

use super::config::{MAX_FRAME_BYTES, MAX_STREAMS};
use crate::error::{Error, Result};

type Field = Range<usize>;

/// Copies field `f` (of `N` bytes, which every `mod field` constant guarantees) out of `b`.
fn get<const N: usize>(b: &[u8], f: Field) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[f]);
    a
}

mod field {
    use super::Field;
    pub const MAGIC: Field = 0..2;
    pub const OP: usize = 2;
    pub const FLAGS: usize = 3;
    /// Payload bytes that follow the header.
    pub const LEN: Field = 4..8;
    /// Per-path sequence number: the order in which the receiver applies ordered effects.
    pub const SEQ: Field = 8..16;
    /// Where the payload goes in the receiver's memory.
    pub const ADDR: Field = 16..24;
    pub const RKEY: Field = 24..28;
    pub const IMM: Field = 28..32;
    /// Length of the whole work request (the receive completion's byte count).
    pub const WR_LEN: Field = 32..36;
    pub const RESERVED: Field = 36..40;
}

/// Bytes of a frame header.
pub const HEADER_LEN: usize = field::RESERVED.end;
/// The first two bytes of every frame header.
pub const FRAME_MAGIC: u16 = 0x5754;
/// An RDMA write: `len` payload bytes for `addr` in the registration of `rkey`.
pub const OP_WRITE: u8 = 1;
/// Last frame of a stream, sent by `shutdown`: the sender is going away.
pub const OP_CLOSE: u8 = 2;
/// Relayed paths only (`transport::relay`): how many [`OP_WRITE`] frames of this stream have
/// landed at the sender of the acknowledgement, in `seq` (cumulative; no payload, no flags). A
/// write on a relayed path completes on its peer's acknowledgement of its frames, end to end: the
/// relay host's kernel acknowledging them says nothing about the peer.
pub const OP_ACK: u8 = 3;
/// On [`OP_WRITE`]: the last frame of a write with immediate; `imm` completes a posted receive.
pub const FLAG_IMM: u8 = 1;
/// On [`OP_CLOSE`]: work requests were still outstanding (dropped), the close is not orderly.
pub const FLAG_DIRTY: u8 = 2;

/// A frame header over a byte buffer.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// A view with no length check: accessors panic on a buffer shorter than [`HEADER_LEN`].
    pub fn new_unchecked(buffer: T) -> Frame<T> {
        Frame { buffer }
    }

    /// A view of a buffer of at least [`HEADER_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Frame<T>> {
        let f = Frame::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// Whether the buffer holds a whole header.
    pub fn check_len(&self) -> Result<()> {
        let n = self.buffer.as_ref().len();
        if n < HEADER_LEN {
            return Err(Error::Remote(format!(
                "frame header of {n} bytes; {HEADER_LEN} bytes expected"
            )));
        }
        Ok(())
    }

    /// The buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn magic(&self) -> u16 {
        u16::from_le_bytes(get(self.buffer.as_ref(), field::MAGIC))
    }
    pub fn op(&self) -> u8 {
        self.buffer.as_ref()[field::OP]
    }
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    pub fn payload_len(&self) -> u32 {
        u32::from_le_bytes(get(self.buffer.as_ref(), field::LEN))
    }
    pub fn seq(&self) -> u64 {
        u64::from_le_bytes(get(self.buffer.as_ref(), field::SEQ))
    }
    pub fn addr(&self) -> u64 {
        u64::from_le_bytes(get(self.buffer.as_ref(), field::ADDR))
    }
    pub fn rkey(&self) -> u32 {
        u32::from_le_bytes(get(self.buffer.as_ref(), field::RKEY))
    }
    pub fn imm(&self) -> u32 {
        u32::from_le_bytes(get(self.buffer.as_ref(), field::IMM))
    }
    pub fn wr_len(&self) -> u32 {
        u32::from_le_bytes(get(self.buffer.as_ref(), field::WR_LEN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    fn put(&mut self, f: Field, bytes: &[u8]) {
        self.buffer.as_mut()[f].copy_from_slice(bytes);
    }
    pub fn set_magic(&mut self, v: u16) {
        self.put(field::MAGIC, &v.to_le_bytes());
    }
    pub fn set_op(&mut self, v: u8) {
        self.buffer.as_mut()[field::OP] = v;
    }
    pub fn set_flags(&mut self, v: u8) {
        self.buffer.as_mut()[field::FLAGS] = v;
    }
    pub fn set_payload_len(&mut self, v: u32) {
        self.put(field::LEN, &v.to_le_bytes());
    }
    pub fn set_seq(&mut self, v: u64) {
        self.put(field::SEQ, &v.to_le_bytes());
    }
    pub fn set_addr(&mut self, v: u64) {
        self.put(field::ADDR, &v.to_le_bytes());
    }
    pub fn set_rkey(&mut self, v: u32) {
        self.put(field::RKEY, &v.to_le_bytes());
    }
    pub fn set_imm(&mut self, v: u32) {
        self.put(field::IMM, &v.to_le_bytes());
    }
    pub fn set_wr_len(&mut self, v: u32) {
        self.put(field::WR_LEN, &v.to_le_bytes());
    }
    fn clear_reserved(&mut self) {
        self.buffer.as_mut()[field::RESERVED].fill(0);
    }
}

/// A frame header's meaning. Every field travels as is (a frame of a write before its last one
/// carries the write's immediate without [`FLAG_IMM`]), so [`FrameRepr::emit`] of a parsed header
/// gives back its bytes, reserved bytes aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRepr {
    /// [`OP_WRITE`] or [`OP_CLOSE`].
    pub op: u8,
    /// [`FLAG_IMM`] (writes) or [`FLAG_DIRTY`] (closes), or 0.
    pub flags: u8,
    pub len: u32,
    pub seq: u64,
    pub addr: u64,
    pub rkey: u32,
    pub imm: u32,
    pub wr_len: u32,
}

impl FrameRepr {
    /// The close frame `shutdown` sends; `dirty` when work requests were dropped.
    pub fn close(dirty: bool) -> FrameRepr {
        FrameRepr {
            op: OP_CLOSE,
            flags: if dirty { FLAG_DIRTY } else { 0 },
            len: 0,
            seq: 0,
            addr: 0,
            rkey: 0,
            imm: 0,
            wr_len: 0,
        }
    }

    /// Checks a received header: magic, a known operation, its flags, and a payload length the
    /// receiver accepts (none on a close, at most [`MAX_FRAME_BYTES`] on a write).
    pub fn parse<T: AsRef<[u8]>>(frame: &Frame<T>) -> Result<FrameRepr> {
        frame.check_len()?;
        let bad = |m: String| Err(Error::Remote(m));
        if frame.magic() != FRAME_MAGIC {
            return bad(format!(
                "frame magic {:#06x}, expected {FRAME_MAGIC:#06x}",
                frame.magic()
            ));
        }
        let (op, flags) = (frame.op(), frame.flags());
        let allowed = match op {
            OP_WRITE => FLAG_IMM,
            OP_CLOSE => FLAG_DIRTY,
            OP_ACK => 0,
            _ => {
                return bad(format!(
                    "frame operation {op}, accepted: {OP_WRITE} (write), {OP_CLOSE} (close) or \
                     {OP_ACK} (acknowledgement)"
                ));
            }
        };
        if flags & !allowed != 0 {
            return bad(format!(
                "frame flags {flags:#04x} for operation {op}, accepted: 0 or {allowed}"
            ));
        }
        let len = frame.payload_len();
        if op != OP_WRITE && len != 0 {
            return bad(format!(
                "{} frame with {len} payload bytes",
                if op == OP_CLOSE {
                    "close"
                } else {
                    "acknowledgement"
                }
            ));
        }
        if len as usize > MAX_FRAME_BYTES {
            return bad(format!(
                "frame of {len} bytes; at most {MAX_FRAME_BYTES} bytes accepted"
            ));
        }
        Ok(FrameRepr {
            op,
            flags,
            len,
            seq: frame.seq(),
            addr: frame.addr(),
            rkey: frame.rkey(),
            imm: frame.imm(),
            wr_len: frame.wr_len(),
        })
    }

    /// Writes the header into `frame` (a buffer of at least [`HEADER_LEN`] bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, frame: &mut Frame<T>) {
        frame.set_magic(FRAME_MAGIC);
        frame.set_op(self.op);
        frame.set_flags(self.flags);
        frame.set_payload_len(self.len);
        frame.set_seq(self.seq);
        frame.set_addr(self.addr);
        frame.set_rkey(self.rkey);
        frame.set_imm(self.imm);
        frame.set_wr_len(self.wr_len);
        frame.clear_reserved();
    }

    /// The header's bytes.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        self.emit(&mut Frame::new_unchecked(&mut b[..]));
        b
    }

    /// A close frame.
    pub fn is_close(&self) -> bool {
        self.op == OP_CLOSE
    }

    /// The acknowledgement of a relayed path's stream: its `seq` counts the write frames landed.
    pub fn ack(landed: u64) -> FrameRepr {
        FrameRepr {
            op: OP_ACK,
            flags: 0,
            len: 0,
            seq: landed,
            addr: 0,
            rkey: 0,
            imm: 0,
            wr_len: 0,
        }
    }

    /// An acknowledgement frame ([`OP_ACK`]).
    pub fn is_ack(&self) -> bool {
        self.op == OP_ACK
    }

    /// A close frame sent with work requests outstanding.
    pub fn is_dirty(&self) -> bool {
        self.flags & FLAG_DIRTY != 0
    }

    /// The immediate and the write length, on the last frame of a write with immediate.
    pub fn completion(&self) -> Option<(u32, u32)> {
        (self.flags & FLAG_IMM != 0).then_some((self.imm, self.wr_len))
    }
}

mod hello_field {
    use super::Field;
    pub const MAGIC: Field = 0..4;
    pub const VERSION: usize = 4;
    /// Paths of the connection, and the path this stream belongs to.
    pub const NPATHS: usize = 5;
    pub const PATH: usize = 6;
    /// Streams of the path, and this stream's index among them.
    pub const NSTREAMS: usize = 7;
    pub const STREAM: usize = 8;
    /// The path's stream generation: 0 at set-up, counting up with every rebuild (failback).
    pub const GENERATION: Field = 9..13;
    pub const RESERVED: Field = 13..16;
    /// The connection id (a one-way value of the connection secret: public, it lets nobody in).
    pub const CONN: Field = 16..24;
    /// The connector's random nonce for this stream.
    pub const NONCE: Field = 24..40;
    /// The tag over all of the above and the acceptor's challenge (`super::auth`).
    pub const TAG: Field = 40..56;
}

/// Bytes of a stream hello.
pub const HELLO_LEN: usize = hello_field::TAG.end;
/// The first four bytes of a stream hello.
pub const HELLO_MAGIC: [u8; 4] = *b"SWTS";
/// The stream format this build speaks (2: streams answer a challenge with a tag keyed by the
/// connection secret; 1 carried the connection's nonce in clear).
pub const HELLO_VERSION: u8 = 2;
/// Bytes of a challenge or connector nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a stream tag.
pub const TAG_LEN: usize = 16;

/// A stream hello over a byte buffer.
#[derive(Debug, Clone)]
pub struct Hello<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Hello<T> {
    /// A view with no length check: accessors panic on a buffer shorter than [`HELLO_LEN`].
    pub fn new_unchecked(buffer: T) -> Hello<T> {
        Hello { buffer }
    }

    /// A view of a buffer of at least [`HELLO_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Hello<T>> {
        let h = Hello::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// Whether the buffer holds a whole hello.
    pub fn check_len(&self) -> Result<()> {
        let n = self.buffer.as_ref().len();
        if n < HELLO_LEN {
            return Err(Error::Remote(format!(
                "stream hello of {n} bytes; {HELLO_LEN} bytes expected"
            )));
        }
        Ok(())
    }

    pub fn magic(&self) -> [u8; 4] {
        get(self.buffer.as_ref(), hello_field::MAGIC)
    }
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[hello_field::VERSION]
    }
    pub fn npaths(&self) -> u8 {
        self.buffer.as_ref()[hello_field::NPATHS]
    }
    pub fn path(&self) -> u8 {
        self.buffer.as_ref()[hello_field::PATH]
    }
    pub fn nstreams(&self) -> u8 {
        self.buffer.as_ref()[hello_field::NSTREAMS]
    }
    pub fn stream(&self) -> u8 {
        self.buffer.as_ref()[hello_field::STREAM]
    }
    pub fn generation(&self) -> u32 {
        u32::from_le_bytes(get(self.buffer.as_ref(), hello_field::GENERATION))
    }
    pub fn conn(&self) -> u64 {
        u64::from_le_bytes(get(self.buffer.as_ref(), hello_field::CONN))
    }
    pub fn nonce(&self) -> [u8; NONCE_LEN] {
        get(self.buffer.as_ref(), hello_field::NONCE)
    }
    pub fn tag(&self) -> [u8; TAG_LEN] {
        get(self.buffer.as_ref(), hello_field::TAG)
    }
}

/// A stream hello's meaning: which stream of which path of which connection this is, and the
/// proof that its sender holds the connection secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloRepr {
    pub npaths: u8,
    pub path: u8,
    /// 1..=[`MAX_STREAMS`].
    pub nstreams: u8,
    /// Below `nstreams`.
    pub stream: u8,
    /// 0: the streams set up with the connection; `g` > 0: a rebuild of the path (its acceptor
    /// takes only a generation above the path's current one).
    pub generation: u32,
    /// The connection id (`super::auth::StreamKey::conn_id`).
    pub conn: u64,
    /// The connector's random nonce for this stream.
    pub nonce: [u8; NONCE_LEN],
    /// Keyed by the connection secret over every field above and the acceptor's challenge.
    pub tag: [u8; TAG_LEN],
}

impl HelloRepr {
    /// Checks a received hello on its own: magic, version and a stream index inside an accepted
    /// count. Whether it belongs to this connection (id, tag, path) is the acceptor's check.
    pub fn parse<T: AsRef<[u8]>>(hello: &Hello<T>) -> Result<HelloRepr> {
        hello.check_len()?;
        if hello.magic() != HELLO_MAGIC {
            return Err(Error::Remote(format!(
                "hello magic {:02x?}, expected \"SWTS\": not a switchless TCP stream",
                hello.magic()
            )));
        }
        if hello.version() != HELLO_VERSION {
            return Err(Error::Remote(format!(
                "hello version {}, this plugin speaks {HELLO_VERSION}",
                hello.version()
            )));
        }
        let (n, s) = (hello.nstreams(), hello.stream());
        if !(1..=MAX_STREAMS).contains(&usize::from(n)) || s >= n {
            return Err(Error::Remote(format!(
                "hello names stream {s} of {n}; accepted: 1..={MAX_STREAMS} streams"
            )));
        }
        Ok(HelloRepr {
            npaths: hello.npaths(),
            path: hello.path(),
            nstreams: n,
            stream: s,
            generation: hello.generation(),
            conn: hello.conn(),
            nonce: hello.nonce(),
            tag: hello.tag(),
        })
    }

    /// The hello's bytes.
    pub fn to_bytes(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[hello_field::MAGIC].copy_from_slice(&HELLO_MAGIC);
        b[hello_field::VERSION] = HELLO_VERSION;
        b[hello_field::NPATHS] = self.npaths;
        b[hello_field::PATH] = self.path;
        b[hello_field::NSTREAMS] = self.nstreams;
        b[hello_field::STREAM] = self.stream;
        b[hello_field::GENERATION].copy_from_slice(&self.generation.to_le_bytes());
        b[hello_field::RESERVED].fill(0);
        b[hello_field::CONN].copy_from_slice(&self.conn.to_le_bytes());
        b[hello_field::NONCE].copy_from_slice(&self.nonce);
        b[hello_field::TAG].copy_from_slice(&self.tag);
        b
    }
}

mod challenge_field {
    use super::Field;
    pub const MAGIC: Field = 0..4;
    pub const VERSION: usize = 4;
    pub const RESERVED: Field = 5..8;
    pub const NONCE: Field = 8..24;
}

/// Bytes of a challenge.
pub const CHALLENGE_LEN: usize = challenge_field::NONCE.end;
/// The first four bytes of a challenge.
pub const CHALLENGE_MAGIC: [u8; 4] = *b"SWTC";

/// What the acceptor sends first on every stream it accepts from the path's peer: a fresh random
/// value the connector's hello must answer (so a recorded hello answers nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChallengeRepr {
    pub nonce: [u8; NONCE_LEN],
}

impl ChallengeRepr {
    /// Checks a received challenge: length, magic and version.
    pub fn parse(b: &[u8]) -> Result<ChallengeRepr> {
        if b.len() < CHALLENGE_LEN {
            return Err(Error::Remote(format!(
                "stream challenge of {} bytes; {CHALLENGE_LEN} bytes expected",
                b.len()
            )));
        }
        let magic: [u8; 4] = get(b, challenge_field::MAGIC);
        if magic != CHALLENGE_MAGIC {
            return Err(Error::Remote(format!(
                "stream challenge {magic:02x?}, expected \"SWTC\" (the acceptor speaks another \
                 stream version, or is not a switchless listener)"
            )));
        }
        if b[challenge_field::VERSION] != HELLO_VERSION {
            return Err(Error::Remote(format!(
                "stream challenge version {}, this plugin speaks {HELLO_VERSION}",
                b[challenge_field::VERSION]
            )));
        }
        Ok(ChallengeRepr {
            nonce: get(b, challenge_field::NONCE),
        })
    }

    /// The challenge's bytes (reserved bytes zero).
    pub fn to_bytes(&self) -> [u8; CHALLENGE_LEN] {
        let mut b = [0u8; CHALLENGE_LEN];
        b[challenge_field::MAGIC].copy_from_slice(&CHALLENGE_MAGIC);
        b[challenge_field::VERSION] = HELLO_VERSION;
        b[challenge_field::RESERVED].fill(0);
        b[challenge_field::NONCE].copy_from_slice(&self.nonce);
        b
    }
}

mod ack_field {
    use super::Field;
    pub const MAGIC: Field = 0..4;
    pub const RESERVED: Field = 4..8;
    pub const TAG: Field = 8..24;
}

/// Bytes of an acknowledgement.
pub const ACK_LEN: usize = ack_field::TAG.end;
/// The first four bytes of an acknowledgement.
pub const ACK_MAGIC: [u8; 4] = *b"SWTA";

/// The acceptor's acknowledgement of a stream over a byte buffer: its hello was accepted.
#[derive(Debug, Clone)]
pub struct Ack<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ack<T> {
    /// A view of a buffer of at least [`ACK_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Ack<T>> {
        let n = buffer.as_ref().len();
        if n < ACK_LEN {
            return Err(Error::Remote(format!(
                "acknowledgement of {n} bytes; {ACK_LEN} bytes expected"
            )));
        }
        Ok(Ack { buffer })
    }

    pub fn magic(&self) -> [u8; 4] {
        get(self.buffer.as_ref(), ack_field::MAGIC)
    }

    pub fn tag(&self) -> [u8; TAG_LEN] {
        get(self.buffer.as_ref(), ack_field::TAG)
    }
}

/// An acknowledgement's meaning: the stream was accepted, and the acceptor holds the connection
/// secret (the tag, `super::auth::StreamKey::ack`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckRepr {
    pub tag: [u8; TAG_LEN],
}

impl AckRepr {
    /// Checks the magic.
    pub fn parse<T: AsRef<[u8]>>(ack: &Ack<T>) -> Result<AckRepr> {
        if ack.magic() != ACK_MAGIC {
            return Err(Error::Remote(format!(
                "acknowledgement {:02x?}, expected \"SWTA\"",
                ack.magic()
            )));
        }
        Ok(AckRepr { tag: ack.tag() })
    }

    /// The acknowledgement's bytes (reserved bytes zero).
    pub fn to_bytes(self) -> [u8; ACK_LEN] {
        let mut b = [0u8; ACK_LEN];
        b[ack_field::MAGIC].copy_from_slice(&ACK_MAGIC);
        b[ack_field::RESERVED].fill(0);
        b[ack_field::TAG].copy_from_slice(&self.tag);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_header() -> FrameRepr {
        FrameRepr {
            op: OP_WRITE,
            flags: FLAG_IMM,
            len: 1234,
            seq: 99,
            addr: 0xdead_beef_0000,
            rkey: 7,
            imm: 0x1234_5678,
            wr_len: 4321,
        }
    }

    fn parse(b: &[u8]) -> Result<FrameRepr> {
        FrameRepr::parse(&Frame::new_checked(b)?)
    }

    fn err(b: &[u8]) -> String {
        parse(b).unwrap_err().to_string()
    }

    #[test]
    fn headers_round_trip_and_garbage_is_rejected() {
        let h = write_header();
        assert_eq!(parse(&h.to_bytes()).unwrap(), h);
        let mut bad = h.to_bytes();
        bad[0] ^= 1;
        assert!(err(&bad).contains("magic"));
        let mut bad = h.to_bytes();
        bad[2] = 9;
        assert!(err(&bad).contains("operation"));
        let mut bad = h.to_bytes();
        bad[3] = 6;
        assert!(err(&bad).contains("flags"));
        let close = FrameRepr::close(true);
        assert_eq!(
            close,
            FrameRepr {
                op: OP_CLOSE,
                flags: FLAG_DIRTY,
                len: 0,
                seq: 0,
                addr: 0,
                rkey: 0,
                imm: 0,
                wr_len: 0,
            }
        );
        assert_eq!(parse(&close.to_bytes()).unwrap(), close);
        let mut bad = close.to_bytes();
        bad[3] = FLAG_IMM;
        assert!(err(&bad).contains("flags"));
        let mut bad = close.to_bytes();
        bad[4] = 1;
        assert!(err(&bad).contains("close frame"));
        let mut bad = h.to_bytes();
        bad[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(err(&bad).contains("at most"));
        // A relayed path's acknowledgement: a count in `seq`, nothing else.
        let ack = FrameRepr::ack(77);
        assert!(ack.is_ack() && !ack.is_close() && ack.completion().is_none());
        assert_eq!(parse(&ack.to_bytes()).unwrap(), ack);
        let mut bad = ack.to_bytes();
        bad[4] = 1;
        assert!(err(&bad).contains("acknowledgement frame with 1 payload"));
        let mut bad = ack.to_bytes();
        bad[3] = FLAG_IMM;
        assert!(err(&bad).contains("flags"));
    }

    #[test]
    fn the_header_bytes_are_pinned() {
        // The layout every build on the wire speaks: changing it breaks mixed versions.
        let want: [u8; HEADER_LEN] = [
            0x54, 0x57, 1, 1, 0xd2, 0x04, 0, 0, 99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xef, 0xbe, 0xad,
            0xde, 0, 0, 7, 0, 0, 0, 0x78, 0x56, 0x34, 0x12, 0xe1, 0x10, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(write_header().to_bytes(), want);
        let mut close = [0u8; HEADER_LEN];
        close[..4].copy_from_slice(&[0x54, 0x57, 2, 2]);
        assert_eq!(FrameRepr::close(true).to_bytes(), close);
    }

    #[test]
    fn errors_are_remote_and_short_buffers_are_refused() {
        assert!(matches!(parse(&[0; 39]), Err(Error::Remote(_))));
        assert!(matches!(parse(&[0; 40]), Err(Error::Remote(_))));
        assert!(matches!(
            HelloRepr::parse(&Hello::new_unchecked(&[0u8; 55][..])),
            Err(Error::Remote(_))
        ));
        assert!(Ack::new_checked(&[0u8; 7][..]).is_err());
        // Reserved bytes are ignored when parsed and zero when emitted.
        let mut b = write_header().to_bytes();
        b[36..40].fill(0xff);
        assert_eq!(parse(&b).unwrap().to_bytes(), write_header().to_bytes());
    }

    #[test]
    fn hellos_challenges_and_acks_round_trip_and_are_checked() {
        let h = HelloRepr {
            npaths: 3,
            path: 2,
            nstreams: 4,
            stream: 3,
            generation: 0x0a0b_0c0d,
            conn: 0x0102_0304_0506_0708,
            nonce: [0x11; NONCE_LEN],
            tag: [0x22; TAG_LEN],
        };
        let b = h.to_bytes();
        // The layout every build on the wire speaks.
        let mut want = vec![
            b'S', b'W', b'T', b'S', 2, 3, 2, 4, 3, 0x0d, 0x0c, 0x0b, 0x0a, 0, 0, 0, 8, 7, 6, 5, 4,
            3, 2, 1,
        ];
        want.extend_from_slice(&[0x11; 16]);
        want.extend_from_slice(&[0x22; 16]);
        assert_eq!(b.to_vec(), want);
        let parse = |b: &[u8]| HelloRepr::parse(&Hello::new_checked(b)?);
        assert_eq!(parse(&b).unwrap(), h);
        let e = |b: &[u8]| parse(b).unwrap_err().to_string();
        let mut bad = b;
        bad[0] = b'X';
        assert!(e(&bad).contains("not a switchless TCP stream"));
        let mut bad = b;
        bad[4] = 1;
        assert!(e(&bad).contains("version 1"));
        let mut bad = b;
        bad[8] = 4;
        assert!(e(&bad).contains("stream 4 of 4"));
        let mut bad = b;
        bad[7] = 17;
        assert!(e(&bad).contains("1..=16"));
        assert!(e(&b[..HELLO_LEN - 1]).contains("56 bytes expected"));

        let c = ChallengeRepr { nonce: [7; 16] };
        let cb = c.to_bytes();
        assert_eq!(&cb[..8], b"SWTC\x02\0\0\0");
        assert_eq!(ChallengeRepr::parse(&cb), Ok(c));
        let mut bad = cb;
        bad[3] = b'X';
        assert!(ChallengeRepr::parse(&bad).is_err());
        let mut bad = cb;
        bad[4] = 1;
        assert!(
            ChallengeRepr::parse(&bad)
                .unwrap_err()
                .to_string()
                .contains("version 1")
        );
        assert!(ChallengeRepr::parse(&cb[..23]).is_err());
        let mut reserved = cb;
        reserved[5] = 0xff;
        assert_eq!(
            ChallengeRepr::parse(&reserved),
            Ok(c),
            "reserved bytes are ignored"
        );

        let ack = AckRepr { tag: [3; TAG_LEN] };
        let ab = ack.to_bytes();
        assert_eq!(&ab[..8], b"SWTA\0\0\0\0");
        assert_eq!(&ab[8..], &[3; 16]);
        assert_eq!(AckRepr::parse(&Ack::new_checked(&ab[..]).unwrap()), Ok(ack));
        let mut bad = ab;
        bad[3] = b'B';
        let e = AckRepr::parse(&Ack::new_checked(&bad[..]).unwrap()).unwrap_err();
        assert!(matches!(e, Error::Remote(_)) && e.to_string().contains("SWTA"));
        assert!(Ack::new_checked(&ab[..23]).is_err());
    }
}
