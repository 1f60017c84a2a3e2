//! The handshake wire format: a 12-byte frame header, then one message. Every count and length is
//! bounded before anything is allocated.
//!
//! The header is a smoltcp-style checked view: [`Header`] names the byte ranges ([`field`]) once for
//! its getters and setters, [`HeaderRepr`] is the parsed form with [`HeaderRepr::parse`] and
//! [`HeaderRepr::emit`]. [`Message`] is the whole frame with [`Message::encode`] and
//! [`Message::decode`]. Every parse error is an [`Error::Remote`] naming the field and what is accepted.
//!
//! Header (all multi-byte integers big-endian): bytes 0..4 magic `SWHS`, 4 version (2), 5 message type
//! (1 hello, 2 reply, 3 reject, 4 ready, 5 refuse: an authenticated reject), 6..8 reserved (zero),
//! 8..12 payload length (at most
//! [`MAX_PAYLOAD`]). The payloads are in docs/guide/routing.md.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::error::{Error, Result};
use crate::route::types::LinkKind;

/// Frame magic, "SWHS".
pub const MAGIC: [u8; 4] = *b"SWHS";
/// Protocol version (2: hellos and replies carry a [`TAG_LEN`]-byte authentication tag instead of
/// the listener's nonce).
pub const VERSION: u8 = 2;
/// Bytes of the authentication tag that ends a hello and a reply (see `auth.rs`).
pub const TAG_LEN: usize = 16;
/// An authentication tag.
pub type Tag = [u8; TAG_LEN];
/// Bytes of the frame header.
pub const HEADER_LEN: usize = field::LEN.end;
/// Largest payload accepted (a full hello is under 4 KiB).
pub const MAX_PAYLOAD: usize = 8192;
/// Paths per connection.
pub const MAX_PATHS: usize = 16;
/// QPs per path (NCCL_IB_QPS_PER_CONNECTION).
pub const MAX_QPS_PER_PATH: usize = 32;
/// Opaque transport bytes per side.
pub const MAX_EXTRA: usize = 1024;
/// Bytes of a reject reason.
pub const MAX_REASON: usize = 1024;

/// Byte ranges of the frame header's fields.
pub mod field {
    /// A range of bytes.
    pub type Field = core::ops::Range<usize>;
    pub const MAGIC: Field = 0..4;
    pub const VERSION: usize = 4;
    pub const TYPE: usize = 5;
    pub const RESERVED: Field = 6..8;
    pub const LEN: Field = 8..12;
}

/// The message a frame carries (the header's type byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgType {
    Hello = 1,
    Reply = 2,
    Reject = 3,
    Ready = 4,
    Refuse = 5,
}

impl MsgType {
    /// The type for a header's type byte.
    pub fn from_byte(b: u8) -> Result<Self> {
        Ok(match b {
            1 => MsgType::Hello,
            2 => MsgType::Reply,
            3 => MsgType::Reject,
            4 => MsgType::Ready,
            5 => MsgType::Refuse,
            _ => {
                return Err(bad(format!(
                    "message type {b}, accepted 1 (hello), 2 (reply), 3 (reject), 4 (ready), 5 (refuse)"
                )));
            }
        })
    }
}

/// Per-path transport parameters (one side of one path).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PathParams {
    /// QP numbers (24-bit), 0..=32 of them.
    pub qpns: Vec<u32>,
    /// Initial packet sequence number (24-bit).
    pub psn: u32,
    /// RoCE GID (IPv4-mapped for RoCE v2).
    pub gid: [u8; 16],
    pub gid_index: u32,
    /// Active MTU in bytes (RoCE: 256..=4096; TCP: the netdev MTU).
    pub mtu: u32,
    /// Memory key and address of the memory the peer writes (e.g. a CTS FIFO).
    pub rkey: u32,
    pub addr: u64,
}

/// One side's parameters: one [`PathParams`] per path plus opaque bytes for the transport.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SideParams {
    pub paths: Vec<PathParams>,
    /// At most [`MAX_EXTRA`] bytes.
    pub extra: Vec<u8>,
}

/// A path as the connector chose it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathRequest {
    /// The connector's link address and prefix.
    pub connector: Ipv4Net,
    /// The acceptor's address on the same subnet.
    pub acceptor: Ipv4Addr,
    pub kind: LinkKind,
    /// A path through a relay host (`transport::relay`): `connector` is then the relay's
    /// address on the acceptor's link. TCP (kind byte 2): the streams come from there, and the
    /// path's writes are acknowledged end to end. RoCE (kind byte 3, a verbs leg: the path's
    /// params name the relay's queue pair on the acceptor's link): defined on the wire, refused
    /// by this build's acceptor (relay paths are TCP until verbs legs are wired).
    pub relayed: bool,
}

/// Connector → acceptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The connector's own random nonce for this connection (not the listener's secret, which never
    /// travels): with the listener's nonce it derives the connection's key.
    pub nonce: u64,
    pub paths: Vec<PathRequest>,
    /// `params.paths.len() == paths.len()`.
    pub params: SideParams,
    /// Keyed hash of the rest of the payload under the connection's key (see `auth.rs`).
    pub tag: Tag,
}

/// Acceptor → connector on success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Echo of the hello's (connector's) nonce.
    pub nonce: u64,
    pub params: SideParams,
    /// Keyed hash of the hello's tag and the rest of this payload under the connection's key.
    pub tag: Tag,
}

/// Acceptor → connector: an authenticated reject (the acceptor checked the hello and refuses the
/// connection for a reason of its own). The connector acts on no other reject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refuse {
    /// At most [`MAX_REASON`] bytes of UTF-8 ([`truncate_reason`]).
    pub reason: String,
    /// Keyed hash of the hello's tag and the reason under the connection's key.
    pub tag: Tag,
}

/// A handshake message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Hello(Hello),
    Reply(Reply),
    /// A reject without authentication: what a client whose hello is not authenticated gets (a
    /// fixed text). A connector does not act on it.
    Reject(String),
    Ready,
    Refuse(Refuse),
}

/// `reason` cut to at most [`MAX_REASON`] bytes on a character boundary: what a reject carries
/// (and what a refuse's tag covers).
pub fn truncate_reason(reason: &str) -> &str {
    let mut end = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::Remote(format!("malformed handshake message: {what}"))
}

/// A checked view over the bytes of a frame header.
#[derive(Debug, Clone)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Wraps a buffer without checking its length; accessors may panic on a short buffer.
    /// Use [`Header::new_checked`] for bytes from a peer.
    pub const fn new_unchecked(buffer: T) -> Self {
        Header { buffer }
    }

    /// Wraps a buffer after [`Header::check_len`]; then no accessor or setter panics.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let h = Self::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// The buffer must hold at least [`HEADER_LEN`] bytes (a longer one is a header and its payload).
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(bad(format!("header is {len} bytes, needs {HEADER_LEN}")));
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn magic(&self) -> [u8; 4] {
        let m = &self.b()[field::MAGIC];
        [m[0], m[1], m[2], m[3]]
    }
    pub fn version(&self) -> u8 {
        self.b()[field::VERSION]
    }
    /// The raw type byte (see [`MsgType`]).
    pub fn msg_type(&self) -> u8 {
        self.b()[field::TYPE]
    }
    pub fn reserved(&self) -> u16 {
        let r = &self.b()[field::RESERVED];
        u16::from_be_bytes([r[0], r[1]])
    }
    pub fn payload_len(&self) -> u32 {
        let l = &self.b()[field::LEN];
        u32::from_be_bytes([l[0], l[1], l[2], l[3]])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    pub fn set_magic(&mut self, m: [u8; 4]) {
        self.bm()[field::MAGIC].copy_from_slice(&m);
    }
    pub fn set_version(&mut self, v: u8) {
        self.bm()[field::VERSION] = v;
    }
    pub fn set_msg_type(&mut self, t: u8) {
        self.bm()[field::TYPE] = t;
    }
    pub fn set_reserved(&mut self, r: u16) {
        self.bm()[field::RESERVED].copy_from_slice(&r.to_be_bytes());
    }
    pub fn set_payload_len(&mut self, n: u32) {
        self.bm()[field::LEN].copy_from_slice(&n.to_be_bytes());
    }
}

/// The parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderRepr {
    pub msg_type: MsgType,
    /// Bytes after the header, at most [`MAX_PAYLOAD`].
    pub payload_len: usize,
}

impl HeaderRepr {
    /// Parses a header, checking every field in order (magic, version, type, reserved, length).
    pub fn parse<T: AsRef<[u8]>>(h: &Header<T>) -> Result<Self> {
        h.check_len()?;
        if h.magic() != MAGIC {
            return Err(bad(format!(
                "magic {:02x?}, expected {:02x?} (\"SWHS\"): not a switchless connector",
                h.magic(),
                MAGIC
            )));
        }
        if h.version() != VERSION {
            return Err(bad(format!(
                "version {}, this plugin speaks version {VERSION}",
                h.version()
            )));
        }
        let msg_type = MsgType::from_byte(h.msg_type())?;
        if h.reserved() != 0 {
            return Err(bad(format!(
                "reserved header bytes {}..{} are not zero",
                field::RESERVED.start,
                field::RESERVED.end
            )));
        }
        // Checked as u32 so no length is truncated on the way to usize.
        let len = h.payload_len();
        if len > MAX_PAYLOAD as u32 {
            return Err(bad(format!(
                "payload length {len} bytes, at most {MAX_PAYLOAD}"
            )));
        }
        Ok(HeaderRepr {
            msg_type,
            payload_len: len as usize,
        })
    }

    /// Writes the header into `h` (which must hold [`HEADER_LEN`] bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Header<T>) -> Result<()> {
        if h.buffer.as_ref().len() < HEADER_LEN || self.payload_len > MAX_PAYLOAD {
            return Err(Error::Internal(format!(
                "cannot emit a handshake header for a {}-byte payload into {} bytes (at most {MAX_PAYLOAD}, needs {HEADER_LEN})",
                self.payload_len,
                h.buffer.as_ref().len()
            )));
        }
        h.set_magic(MAGIC);
        h.set_version(VERSION);
        h.set_msg_type(self.msg_type as u8);
        h.set_reserved(0);
        h.set_payload_len(self.payload_len as u32);
        Ok(())
    }
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                bad(format!(
                    "truncated at byte {} reading {what} ({n} bytes)",
                    self.pos
                ))
            })?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        let s = self.take(2, what)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        let s = self.take(4, what)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        let s = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_be_bytes(a))
    }
    fn ipv4(&mut self, what: &str) -> Result<Ipv4Addr> {
        let s = self.take(4, what)?;
        Ok(Ipv4Addr::new(s[0], s[1], s[2], s[3]))
    }
    fn count(&mut self, what: &str, max: usize) -> Result<usize> {
        let n = usize::from(self.u8(what)?);
        if n > max {
            return Err(bad(format!("{what} is {n}, at most {max}")));
        }
        Ok(n)
    }
    fn bytes16(&mut self, what: &str, max: usize) -> Result<&'a [u8]> {
        let n = usize::from(self.u16(what)?);
        if n > max {
            return Err(bad(format!("{what} is {n} bytes, at most {max}")));
        }
        self.take(n, what)
    }
    fn tag(&mut self) -> Result<Tag> {
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(self.take(TAG_LEN, "authentication tag")?);
        Ok(t)
    }
    fn finish(&self) -> Result<()> {
        if self.pos != self.b.len() {
            return Err(bad(format!(
                "{} trailing bytes after the message",
                self.b.len() - self.pos
            )));
        }
        Ok(())
    }
}

fn kind_byte(k: LinkKind, relayed: bool) -> u8 {
    match (k, relayed) {
        (LinkKind::Roce, false) => 0,
        (LinkKind::Tcp, false) => 1,
        (LinkKind::Tcp, true) => 2,
        (LinkKind::Roce, true) => 3,
    }
}

fn read_params(r: &mut Reader<'_>, i: usize) -> Result<PathParams> {
    let nq = r.count(&format!("QP count of path {i}"), MAX_QPS_PER_PATH)?;
    let mut qpns = Vec::with_capacity(nq);
    for q in 0..nq {
        let qpn = r.u32("QP number")?;
        if qpn > 0x00ff_ffff {
            return Err(bad(format!(
                "path {i} QP {q}: QP number {qpn:#x} exceeds 24 bits"
            )));
        }
        qpns.push(qpn);
    }
    let psn = r.u32("PSN")?;
    if psn > 0x00ff_ffff {
        return Err(bad(format!("path {i}: PSN {psn:#x} exceeds 24 bits")));
    }
    let mut gid = [0u8; 16];
    gid.copy_from_slice(r.take(16, "GID")?);
    let gid_index = r.u32("GID index")?;
    if gid_index > 0xffff {
        return Err(bad(format!(
            "path {i}: GID index {gid_index}, at most 65535"
        )));
    }
    let mtu = r.u32("MTU")?;
    if !(256..=65536).contains(&mtu) {
        return Err(bad(format!(
            "path {i}: MTU {mtu} bytes, accepted 256..=65536"
        )));
    }
    let rkey = r.u32("rkey")?;
    let addr = r.u64("address")?;
    Ok(PathParams {
        qpns,
        psn,
        gid,
        gid_index,
        mtu,
        rkey,
        addr,
    })
}

fn write_params(out: &mut Vec<u8>, p: &PathParams) -> Result<()> {
    if p.qpns.len() > MAX_QPS_PER_PATH {
        return Err(Error::InvalidArgument(format!(
            "{} QPs on one path, at most {MAX_QPS_PER_PATH}",
            p.qpns.len()
        )));
    }
    out.push(p.qpns.len() as u8);
    for q in &p.qpns {
        out.extend_from_slice(&q.to_be_bytes());
    }
    out.extend_from_slice(&p.psn.to_be_bytes());
    out.extend_from_slice(&p.gid);
    out.extend_from_slice(&p.gid_index.to_be_bytes());
    out.extend_from_slice(&p.mtu.to_be_bytes());
    out.extend_from_slice(&p.rkey.to_be_bytes());
    out.extend_from_slice(&p.addr.to_be_bytes());
    Ok(())
}

fn write_bytes16(out: &mut Vec<u8>, b: &[u8], max: usize, what: &str) -> Result<()> {
    if b.len() > max {
        return Err(Error::InvalidArgument(format!(
            "{what} is {} bytes, at most {max}",
            b.len()
        )));
    }
    out.extend_from_slice(&(b.len() as u16).to_be_bytes());
    out.extend_from_slice(b);
    Ok(())
}

fn check_paths(n: usize) -> Result<()> {
    if n == 0 || n > MAX_PATHS {
        return Err(Error::InvalidArgument(format!(
            "{n} paths, accepted 1..={MAX_PATHS}"
        )));
    }
    Ok(())
}

impl Hello {
    /// The payload the tag covers: everything before it.
    pub fn body(&self) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.write_body(&mut v)?;
        Ok(v)
    }

    fn write_body(&self, p: &mut Vec<u8>) -> Result<()> {
        check_paths(self.paths.len())?;
        if self.params.paths.len() != self.paths.len() {
            return Err(Error::InvalidArgument(format!(
                "hello has {} paths but {} path params",
                self.paths.len(),
                self.params.paths.len()
            )));
        }
        p.extend_from_slice(&self.nonce.to_be_bytes());
        p.push(self.paths.len() as u8);
        for (req, par) in self.paths.iter().zip(&self.params.paths) {
            p.extend_from_slice(&req.connector.addr().octets());
            p.push(req.connector.prefix_len());
            p.extend_from_slice(&req.acceptor.octets());
            p.push(kind_byte(req.kind, req.relayed));
            write_params(p, par)?;
        }
        write_bytes16(p, &self.params.extra, MAX_EXTRA, "extra")
    }
}

impl Reply {
    /// The payload the tag covers: everything before it.
    pub fn body(&self) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.write_body(&mut v)?;
        Ok(v)
    }

    fn write_body(&self, p: &mut Vec<u8>) -> Result<()> {
        check_paths(self.params.paths.len())?;
        p.extend_from_slice(&self.nonce.to_be_bytes());
        p.push(self.params.paths.len() as u8);
        for par in &self.params.paths {
            write_params(p, par)?;
        }
        write_bytes16(p, &self.params.extra, MAX_EXTRA, "extra")
    }
}

impl Message {
    /// The message as errors name it ("a hello", ..., "ready").
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello(_) => "a hello",
            Message::Reply(_) => "a reply",
            Message::Reject(_) => "a reject",
            Message::Ready => "ready",
            Message::Refuse(_) => "an authenticated reject",
        }
    }

    /// The header type of this message.
    pub fn msg_type(&self) -> MsgType {
        match self {
            Message::Hello(_) => MsgType::Hello,
            Message::Reply(_) => MsgType::Reply,
            Message::Reject(_) => MsgType::Reject,
            Message::Ready => MsgType::Ready,
            Message::Refuse(_) => MsgType::Refuse,
        }
    }

    /// Encodes the message as one frame (header + payload).
    pub fn encode(&self) -> Result<Vec<u8>> {
        // The payload goes after room for the header, which is emitted once its length is known.
        let mut out = vec![0u8; HEADER_LEN];
        let p = &mut out;
        match self {
            Message::Hello(h) => {
                h.write_body(p)?;
                p.extend_from_slice(&h.tag);
            }
            Message::Reply(r) => {
                r.write_body(p)?;
                p.extend_from_slice(&r.tag);
            }
            Message::Reject(reason) => {
                // Truncate on a character boundary rather than fail: the reason is for humans.
                let r = truncate_reason(reason);
                write_bytes16(p, r.as_bytes(), MAX_REASON, "reason")?;
            }
            Message::Ready => {}
            Message::Refuse(f) => {
                let r = truncate_reason(&f.reason);
                write_bytes16(p, r.as_bytes(), MAX_REASON, "reason")?;
                p.extend_from_slice(&f.tag);
            }
        }
        let payload_len = out.len() - HEADER_LEN;
        if payload_len > MAX_PAYLOAD {
            return Err(Error::Internal(format!(
                "handshake payload {payload_len} bytes exceeds {MAX_PAYLOAD}"
            )));
        }
        HeaderRepr {
            msg_type: self.msg_type(),
            payload_len,
        }
        .emit(&mut Header::new_unchecked(&mut out[..HEADER_LEN]))?;
        Ok(out)
    }

    /// Decodes exactly one frame (header + payload, nothing after it).
    pub fn decode(frame: &[u8]) -> Result<Message> {
        let h = HeaderRepr::parse(&Header::new_checked(frame)?)?;
        if frame.len() != HEADER_LEN + h.payload_len {
            return Err(bad(format!(
                "frame is {} bytes, header says {}",
                frame.len(),
                HEADER_LEN + h.payload_len
            )));
        }
        Self::decode_payload(h.msg_type, &frame[HEADER_LEN..])
    }

    fn decode_payload(ty: MsgType, payload: &[u8]) -> Result<Message> {
        let mut r = Reader { b: payload, pos: 0 };
        let m = match ty {
            MsgType::Hello => {
                let nonce = r.u64("nonce")?;
                let n = r.count("path count", MAX_PATHS)?;
                if n == 0 {
                    return Err(bad("hello with 0 paths, accepted 1..=16"));
                }
                let mut paths = Vec::with_capacity(n);
                let mut params = Vec::with_capacity(n);
                for i in 0..n {
                    let a = r.ipv4("connector address")?;
                    let prefix = r.u8("prefix length")?;
                    let connector = Ipv4Net::new(a, prefix).map_err(|_| {
                        bad(format!("path {i}: prefix length {prefix}, accepted 0..=32"))
                    })?;
                    let acceptor = r.ipv4("acceptor address")?;
                    let (kind, relayed) = match r.u8("kind")? {
                        0 => (LinkKind::Roce, false),
                        1 => (LinkKind::Tcp, false),
                        2 => (LinkKind::Tcp, true),
                        3 => (LinkKind::Roce, true),
                        k => {
                            return Err(bad(format!(
                                "path {i}: kind {k}, accepted 0 (RoCE), 1 (TCP), 2 (TCP through \
                                 a relay) or 3 (RoCE through a relay)"
                            )));
                        }
                    };
                    paths.push(PathRequest {
                        connector,
                        acceptor,
                        kind,
                        relayed,
                    });
                    params.push(read_params(&mut r, i)?);
                }
                let extra = r.bytes16("extra length", MAX_EXTRA)?.to_vec();
                let tag = r.tag()?;
                Message::Hello(Hello {
                    nonce,
                    paths,
                    params: SideParams {
                        paths: params,
                        extra,
                    },
                    tag,
                })
            }
            MsgType::Reply => {
                let nonce = r.u64("nonce")?;
                let n = r.count("path count", MAX_PATHS)?;
                if n == 0 {
                    return Err(bad("reply with 0 paths, accepted 1..=16"));
                }
                let mut params = Vec::with_capacity(n);
                for i in 0..n {
                    params.push(read_params(&mut r, i)?);
                }
                let extra = r.bytes16("extra length", MAX_EXTRA)?.to_vec();
                let tag = r.tag()?;
                Message::Reply(Reply {
                    nonce,
                    params: SideParams {
                        paths: params,
                        extra,
                    },
                    tag,
                })
            }
            MsgType::Reject => {
                let b = r.bytes16("reason length", MAX_REASON)?;
                Message::Reject(String::from_utf8_lossy(b).into_owned())
            }
            MsgType::Ready => Message::Ready,
            MsgType::Refuse => {
                let b = r.bytes16("reason length", MAX_REASON)?;
                let reason = String::from_utf8_lossy(b).into_owned();
                let tag = r.tag()?;
                Message::Refuse(Refuse { reason, tag })
            }
        };
        r.finish()?;
        Ok(m)
    }
}
