//! The handshake wire format. Every count and length is bounded before anything is allocated.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::error::{Error, Result};
use crate::route::types::LinkKind;

/// Frame magic, "SWHS".
pub const MAGIC: [u8; 4] = *b"SWHS";
/// Protocol version.
pub const VERSION: u8 = 1;
/// Bytes of the frame header.
pub const HEADER_LEN: usize = 12;
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

const T_HELLO: u8 = 1;
const T_REPLY: u8 = 2;
const T_REJECT: u8 = 3;
const T_READY: u8 = 4;

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
}

/// Connector → acceptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Echo of the listener's handle nonce.
    pub nonce: u64,
    pub paths: Vec<PathRequest>,
    /// `params.paths.len() == paths.len()`.
    pub params: SideParams,
}

/// Acceptor → connector on success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub nonce: u64,
    pub params: SideParams,
}

/// A handshake message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Hello(Hello),
    Reply(Reply),
    Reject(String),
    Ready,
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::Remote(format!("malformed handshake message: {what}"))
}

/// Parses a frame header; returns the message type and the payload length.
pub fn parse_header(h: &[u8]) -> Result<(u8, usize)> {
    if h.len() < HEADER_LEN {
        return Err(bad(format!(
            "header is {} bytes, needs {HEADER_LEN}",
            h.len()
        )));
    }
    if h[0..4] != MAGIC {
        return Err(bad(format!(
            "magic {:02x?}, expected {:02x?} (\"SWHS\"): not a switchless connector",
            &h[0..4],
            MAGIC
        )));
    }
    if h[4] != VERSION {
        return Err(bad(format!(
            "version {}, this plugin speaks version {VERSION}",
            h[4]
        )));
    }
    let ty = h[5];
    if !(T_HELLO..=T_READY).contains(&ty) {
        return Err(bad(format!(
            "message type {ty}, accepted 1 (hello), 2 (reply), 3 (reject), 4 (ready)"
        )));
    }
    if h[6] != 0 || h[7] != 0 {
        return Err(bad("reserved header bytes 6..8 are not zero"));
    }
    let len = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(bad(format!(
            "payload length {len} bytes, at most {MAX_PAYLOAD}"
        )));
    }
    Ok((ty, len))
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

fn kind_byte(k: LinkKind) -> u8 {
    match k {
        LinkKind::Roce => 0,
        LinkKind::Tcp => 1,
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

impl Message {
    /// Encodes the message as one frame (header + payload).
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut p = Vec::new();
        let ty = match self {
            Message::Hello(h) => {
                check_paths(h.paths.len())?;
                if h.params.paths.len() != h.paths.len() {
                    return Err(Error::InvalidArgument(format!(
                        "hello has {} paths but {} path params",
                        h.paths.len(),
                        h.params.paths.len()
                    )));
                }
                p.extend_from_slice(&h.nonce.to_be_bytes());
                p.push(h.paths.len() as u8);
                for (req, par) in h.paths.iter().zip(&h.params.paths) {
                    p.extend_from_slice(&req.connector.addr().octets());
                    p.push(req.connector.prefix_len());
                    p.extend_from_slice(&req.acceptor.octets());
                    p.push(kind_byte(req.kind));
                    write_params(&mut p, par)?;
                }
                write_bytes16(&mut p, &h.params.extra, MAX_EXTRA, "extra")?;
                T_HELLO
            }
            Message::Reply(r) => {
                check_paths(r.params.paths.len())?;
                p.extend_from_slice(&r.nonce.to_be_bytes());
                p.push(r.params.paths.len() as u8);
                for par in &r.params.paths {
                    write_params(&mut p, par)?;
                }
                write_bytes16(&mut p, &r.params.extra, MAX_EXTRA, "extra")?;
                T_REPLY
            }
            Message::Reject(reason) => {
                // Truncate on a character boundary rather than fail: the reason is for humans.
                let mut end = reason.len().min(MAX_REASON);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                write_bytes16(&mut p, &reason.as_bytes()[..end], MAX_REASON, "reason")?;
                T_REJECT
            }
            Message::Ready => T_READY,
        };
        if p.len() > MAX_PAYLOAD {
            return Err(Error::Internal(format!(
                "handshake payload {} bytes exceeds {MAX_PAYLOAD}",
                p.len()
            )));
        }
        let mut out = Vec::with_capacity(HEADER_LEN + p.len());
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(ty);
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&(p.len() as u32).to_be_bytes());
        out.extend_from_slice(&p);
        Ok(out)
    }

    /// Decodes exactly one frame (header + payload, nothing after it).
    pub fn decode(frame: &[u8]) -> Result<Message> {
        let (ty, len) = parse_header(frame)?;
        if frame.len() != HEADER_LEN + len {
            return Err(bad(format!(
                "frame is {} bytes, header says {}",
                frame.len(),
                HEADER_LEN + len
            )));
        }
        Self::decode_payload(ty, &frame[HEADER_LEN..])
    }

    /// Decodes a payload of type `ty` (from [`parse_header`]).
    pub fn decode_payload(ty: u8, payload: &[u8]) -> Result<Message> {
        let mut r = Reader { b: payload, pos: 0 };
        let m = match ty {
            T_HELLO => {
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
                    let kind = match r.u8("kind")? {
                        0 => LinkKind::Roce,
                        1 => LinkKind::Tcp,
                        k => {
                            return Err(bad(format!(
                                "path {i}: kind {k}, accepted 0 (RoCE) or 1 (TCP)"
                            )));
                        }
                    };
                    paths.push(PathRequest {
                        connector,
                        acceptor,
                        kind,
                    });
                    params.push(read_params(&mut r, i)?);
                }
                let extra = r.bytes16("extra length", MAX_EXTRA)?.to_vec();
                Message::Hello(Hello {
                    nonce,
                    paths,
                    params: SideParams {
                        paths: params,
                        extra,
                    },
                })
            }
            T_REPLY => {
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
                Message::Reply(Reply {
                    nonce,
                    params: SideParams {
                        paths: params,
                        extra,
                    },
                })
            }
            T_REJECT => {
                let b = r.bytes16("reason length", MAX_REASON)?;
                Message::Reject(String::from_utf8_lossy(b).into_owned())
            }
            T_READY => Message::Ready,
            other => return Err(bad(format!("message type {other}"))),
        };
        r.finish()?;
        Ok(m)
    }
}
