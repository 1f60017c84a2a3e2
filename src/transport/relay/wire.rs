//! The relay door's wire format: what a client (the host that opens a relay path) and the relay
//! host say before the relay joins a stream to its peer. Three fixed-size messages, little endian:
//!
//! | message | from | bytes | content |
//! |---|---|---|---|
//! | challenge | relay, at once on accepting a connection from a host on one of its links | 24 | `SWRC`, version 1, 3 reserved, 16 random bytes |
//! | request | client | 116 | `SWRQ`, version, op (1 probe, 2 open, 3 open to a relay, 4 list links), target count, reserved; the communicator's public id (u64); the target port (u16; of a list: the link's index), 2 reserved; 16 target IPv4 addresses (unused ones zero); a 16-byte client nonce; a 16-byte tag |
//! | verdict | relay | 68 | `SWRV`, version, code, 2 reserved; the target it matched and its own address on that target's link (IPv4); its link's speed (u32, Mb/s); its host name (32 bytes, NUL-padded); a 16-byte tag |
//!
//! An open to a relay (op 3) names a second relay (its address on one of the first relay's links)
//! and the first relay's own port (a communicator's relay door has one port on every host); once
//! joined, the second relay's challenge, request and verdict pass through the first as bytes (a
//! chain A → K1 → K2 → B, docs/guide/relay.md).
//!
//! A list (op 4) names no target and, in the port field, an index below [`MAX_LINKS`]: the relay
//! answers with the far end of its `index`-th point-to-point link other than the client's own (up
//! ones, in its configured order) in the verdict's target and its own address on that link in
//! `via`, or `NotALink` past its last. So a client finds the second relays of its chains (their
//! addresses on the first relay's links) with one request per link.
//!
//! The request's tag is BLAKE3 keyed with a key derived from the communicator id NCCL passes to
//! `init` ([`CommKey`]), over the request and the relay's challenge: it shows the relay that the
//! client belongs to a communicator the relay serves (a filter against strangers, not a secret:
//! the communicator id is no secret from the job's hosts; what protects a path is its end-to-end
//! authentication, the peer's stream challenge, which the relay passes through unread). An `OK`
//! verdict's tag covers the verdict and the request's tag under the same key; a refusal carries
//! none (the relay may not know the communicator).
//!
//! Every view names its bytes once (`mod field`); parse errors are [`Error::Remote`].
#![forbid(unsafe_code)]

use std::net::Ipv4Addr;
use std::ops::Range;

use subtle::ConstantTimeEq;

use crate::error::{Error, Result};

/// The version this build speaks.
pub const VERSION: u8 = 1;
/// Bytes of a challenge.
pub const CHALLENGE_LEN: usize = 24;
/// Bytes of a request.
pub const REQUEST_LEN: usize = field::TAG.end;
/// Bytes of a verdict.
pub const VERDICT_LEN: usize = vfield::TAG.end;
/// Targets a probe may name (the peer's links as its listen handle advertises them).
pub const MAX_TARGETS: usize = 16;
/// Bytes of a nonce or a tag.
pub const NONCE_LEN: usize = 16;
/// Bytes of the host name a verdict carries.
pub const HOST_LEN: usize = 32;
/// Links a list request may ask about (indices `0..MAX_LINKS`): more than a host has NIC ports.
pub const MAX_LINKS: u16 = 16;

const CHALLENGE_MAGIC: [u8; 4] = *b"SWRC";
const REQUEST_MAGIC: [u8; 4] = *b"SWRQ";
const VERDICT_MAGIC: [u8; 4] = *b"SWRV";

/// BLAKE3 `derive_key` contexts.
const KEY_CONTEXT: &str = "switchless 2027-01 relay communicator key v1";
const ID_CONTEXT: &str = "switchless 2027-01 relay communicator id v1";
const PORT_CONTEXT: &str = "switchless 2027-01 relay port v1";

/// The lowest target port an open may name (a path's listener has an unprivileged port).
pub const MIN_TARGET_PORT: u16 = 1024;
/// The first port of the range relay services listen in; below Linux's ephemeral range (32768
/// and up), so a port the kernel hands out for a connection never takes a relay's.
pub const PORT_BASE: u16 = 24576;
/// Ports in the range.
pub const PORT_SPAN: u16 = 8192;

/// The port a relay service for communicator `comm_id` listens on, on every host: in
/// `PORT_BASE..PORT_BASE + PORT_SPAN`, from a hash of the id (the v11+ `init` passes NCCL's
/// communicator hash, equal on every rank; the legacy ABIs use 0). Two communicators may share a
/// port: one service serves both.
pub fn port_for(comm_id: u64) -> u16 {
    let h = blake3::derive_key(PORT_CONTEXT, &comm_id.to_le_bytes());
    PORT_BASE + u16::from_le_bytes([h[0], h[1]]) % PORT_SPAN
}

type Field = Range<usize>;

mod field {
    use super::Field;
    pub const MAGIC: Field = 0..4;
    pub const VERSION: usize = 4;
    pub const OP: usize = 5;
    pub const NTARGETS: usize = 6;
    pub const RESERVED0: usize = 7;
    pub const COMM: Field = 8..16;
    pub const PORT: Field = 16..18;
    pub const RESERVED1: Field = 18..20;
    pub const TARGETS: Field = 20..84;
    pub const NONCE: Field = 84..100;
    pub const TAG: Field = 100..116;
}

mod vfield {
    use super::Field;
    pub const MAGIC: Field = 0..4;
    pub const VERSION: usize = 4;
    pub const CODE: usize = 5;
    pub const RESERVED: Field = 6..8;
    pub const TARGET: Field = 8..12;
    pub const VIA: Field = 12..16;
    pub const SPEED: Field = 16..20;
    pub const HOST: Field = 20..52;
    pub const TAG: Field = 52..68;
}

/// The key of one communicator's relay requests, and its public id (derived from the id NCCL
/// passes to `init`).
#[derive(Clone)]
pub struct CommKey {
    key: [u8; 32],
    id: u64,
}

impl std::fmt::Debug for CommKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material; the id is public.
        write!(f, "CommKey(id {:#018x})", self.id)
    }
}

impl CommKey {
    /// The key of communicator `comm_id`.
    pub fn new(comm_id: u64) -> CommKey {
        let b = comm_id.to_le_bytes();
        let id = blake3::derive_key(ID_CONTEXT, &b);
        let mut c = [0u8; 8];
        c.copy_from_slice(&id[..8]);
        CommKey {
            key: blake3::derive_key(KEY_CONTEXT, &b),
            id: u64::from_le_bytes(c),
        }
    }

    /// The public id a request names (it tells communicators apart; it lets nobody in).
    pub fn id(&self) -> u64 {
        self.id
    }

    fn hash(&self, label: &[u8], parts: &[&[u8]]) -> [u8; NONCE_LEN] {
        let mut m = blake3::Hasher::new_keyed(&self.key);
        m.update(label);
        for p in parts {
            m.update(p);
        }
        let mut t = [0u8; NONCE_LEN];
        t.copy_from_slice(&m.finalize().as_bytes()[..NONCE_LEN]);
        t
    }

    /// `r` with this communicator's id and the tag that answers `challenge`.
    pub fn seal(&self, mut r: RequestRepr, challenge: &[u8; NONCE_LEN]) -> RequestRepr {
        r.comm = self.id;
        let b = r.to_bytes();
        r.tag = self.hash(b"request", &[&b[..field::TAG.start], challenge]);
        r
    }

    /// Whether `r` (naming this communicator) answers `challenge` (constant time).
    pub fn check(&self, r: &RequestRepr, challenge: &[u8; NONCE_LEN]) -> bool {
        let b = r.to_bytes();
        let want = self.hash(b"request", &[&b[..field::TAG.start], challenge]);
        r.comm == self.id && bool::from(want.ct_eq(&r.tag))
    }

    /// `v` (an `OK`) with the tag that answers request tag `req_tag`.
    pub fn seal_verdict(&self, mut v: VerdictRepr, req_tag: &[u8; NONCE_LEN]) -> VerdictRepr {
        let b = v.to_bytes();
        v.tag = self.hash(b"verdict", &[&b[..vfield::TAG.start], req_tag]);
        v
    }

    /// Whether `v` answers the request whose tag was `req_tag` (constant time).
    pub fn check_verdict(&self, v: &VerdictRepr, req_tag: &[u8; NONCE_LEN]) -> bool {
        let b = v.to_bytes();
        let want = self.hash(b"verdict", &[&b[..vfield::TAG.start], req_tag]);
        bool::from(want.ct_eq(&v.tag))
    }
}

/// The relay's challenge (its 16 random bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChallengeRepr {
    pub nonce: [u8; NONCE_LEN],
}

impl ChallengeRepr {
    /// Checks magic and version.
    pub fn parse(b: &[u8; CHALLENGE_LEN]) -> Result<ChallengeRepr> {
        if b[..4] != CHALLENGE_MAGIC {
            return Err(bad(format!(
                "challenge {:02x?}, expected \"SWRC\" (not a switchless relay)",
                &b[..4]
            )));
        }
        if b[4] != VERSION {
            return Err(bad(format!(
                "relay door version {}, this build speaks {VERSION}",
                b[4]
            )));
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[8..24]);
        Ok(ChallengeRepr { nonce })
    }

    /// The challenge's bytes.
    pub fn to_bytes(self) -> [u8; CHALLENGE_LEN] {
        let mut b = [0u8; CHALLENGE_LEN];
        b[..4].copy_from_slice(&CHALLENGE_MAGIC);
        b[4] = VERSION;
        b[8..24].copy_from_slice(&self.nonce);
        b
    }
}

/// What a request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Which of the targets is the far end of one of the relay's links? (The client then names
    /// that target in its handshake's relayed path.) The relay answers and closes.
    Probe = 1,
    /// Join this connection to the one target at `port`: from the `OK` verdict on, the relay
    /// forwards the stream both ways.
    Open = 2,
    /// Join this connection to the relay door of the one target (a second relay), `port` being
    /// the relay's own door port: from the `OK` verdict on, the relay forwards the stream both
    /// ways, the second relay's door exchange first (a chain A → K1 → K2 → B).
    OpenRelay = 3,
    /// Which host is at the far end of the relay's `port`-th point-to-point link other than the
    /// client's own? No target; the relay answers and closes (`NotALink` past its last link).
    List = 4,
    /// Set up a verbs leg to the one target (port 0: the relay opens no connection to it): after
    /// the `OK` verdict the connection carries the leg's set-up (`super::leg_setup`) and stays
    /// open as its control channel; the leg ends when it closes.
    OpenVerbs = 5,
}

impl Op {
    /// Whether the relay joins the connection to its target (an open of either kind).
    pub fn opens(self) -> bool {
        matches!(self, Op::Open | Op::OpenRelay)
    }
}

/// A request's meaning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRepr {
    pub op: Op,
    /// The communicator's public id ([`CommKey::id`]).
    pub comm: u64,
    /// [`Op::Open`]: the target's listener port; [`Op::OpenRelay`]: the relay door's port;
    /// [`Op::Probe`]: 0; [`Op::List`]: the link's index (below [`MAX_LINKS`]).
    pub port: u16,
    /// 1..=[`MAX_TARGETS`] addresses; exactly one for an open of either kind; none for a list.
    pub targets: Vec<Ipv4Addr>,
    /// The client's random nonce.
    pub nonce: [u8; NONCE_LEN],
    pub tag: [u8; NONCE_LEN],
}

fn bad(what: String) -> Error {
    Error::Remote(format!("relay door: {what}"))
}

impl RequestRepr {
    /// Checks magic, version, op, target count and the reserved bytes.
    pub fn parse(b: &[u8; REQUEST_LEN]) -> Result<RequestRepr> {
        if b[field::MAGIC] != REQUEST_MAGIC {
            return Err(bad(format!(
                "request {:02x?}, expected \"SWRQ\"",
                &b[field::MAGIC]
            )));
        }
        if b[field::VERSION] != VERSION {
            return Err(bad(format!(
                "request version {}, this relay speaks {VERSION}",
                b[field::VERSION]
            )));
        }
        let op = match b[field::OP] {
            1 => Op::Probe,
            2 => Op::Open,
            3 => Op::OpenRelay,
            4 => Op::List,
            5 => Op::OpenVerbs,
            o => {
                return Err(bad(format!(
                    "request op {o}, accepted 1 (probe), 2 (open), 3 (open to a relay), 4 \
                     (list links) or 5 (open a verbs leg)"
                )));
            }
        };
        let what = match op {
            Op::Probe => "a probe",
            Op::Open => "an open",
            Op::OpenRelay => "an open to a relay",
            Op::List => "a list",
            Op::OpenVerbs => "a verbs leg",
        };
        let n = usize::from(b[field::NTARGETS]);
        let (min, max) = match op {
            Op::List => (0, 0),
            Op::Probe => (1, MAX_TARGETS),
            Op::Open | Op::OpenRelay | Op::OpenVerbs => (1, 1),
        };
        if n < min || n > max {
            return Err(bad(format!(
                "{n} targets in {what} request, accepted {min}..={max}"
            )));
        }
        if b[field::RESERVED0] != 0 || b[field::RESERVED1] != [0, 0] {
            return Err(bad("reserved request bytes are not zero".into()));
        }
        let mut c = [0u8; 8];
        c.copy_from_slice(&b[field::COMM]);
        let port = u16::from_le_bytes([b[field::PORT][0], b[field::PORT][1]]);
        if op == Op::List {
            if port >= MAX_LINKS {
                return Err(bad(format!(
                    "link index {port} in a list request, accepted 0..{MAX_LINKS}"
                )));
            }
        } else if op.opens() == (port == 0) {
            return Err(bad(format!(
                "port {port} in {what} request (an open names its target's port, a probe and a \
                 verbs leg none)"
            )));
        }
        if op.opens() && port < MIN_TARGET_PORT {
            // A relay never opens a connection to a system service of the target on a client's
            // word: a path's listener is on an unprivileged port (the kernel gives it one), a
            // relay door in `PORT_BASE..` (the relay checks it is its own).
            return Err(bad(format!(
                "target port {port} in {what}, accepted {MIN_TARGET_PORT}..=65535"
            )));
        }
        let t = &b[field::TARGETS];
        let mut targets = Vec::with_capacity(n);
        for k in 0..MAX_TARGETS {
            let a = Ipv4Addr::new(t[4 * k], t[4 * k + 1], t[4 * k + 2], t[4 * k + 3]);
            if k < n {
                targets.push(a);
            } else if !a.is_unspecified() {
                return Err(bad(format!(
                    "target slot {k} holds {a} beyond the {n} targets named"
                )));
            }
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[field::NONCE]);
        let mut tag = [0u8; NONCE_LEN];
        tag.copy_from_slice(&b[field::TAG]);
        Ok(RequestRepr {
            op,
            comm: u64::from_le_bytes(c),
            port,
            targets,
            nonce,
            tag,
        })
    }

    /// The request's bytes (at most [`MAX_TARGETS`] targets are written).
    pub fn to_bytes(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[field::MAGIC].copy_from_slice(&REQUEST_MAGIC);
        b[field::VERSION] = VERSION;
        b[field::OP] = self.op as u8;
        let n = self.targets.len().min(MAX_TARGETS);
        b[field::NTARGETS] = n as u8;
        b[field::COMM].copy_from_slice(&self.comm.to_le_bytes());
        b[field::PORT].copy_from_slice(&self.port.to_le_bytes());
        let t = &mut b[field::TARGETS];
        for (k, a) in self.targets.iter().take(n).enumerate() {
            t[4 * k..4 * k + 4].copy_from_slice(&a.octets());
        }
        b[field::NONCE].copy_from_slice(&self.nonce);
        b[field::TAG].copy_from_slice(&self.tag);
        b
    }
}

/// A relay's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    /// Probe: the target is on one of the relay's links; open: the relay reached it and forwards.
    Ok = 0,
    /// The relay serves no communicator of that id (another job, or a rank of this communicator
    /// does not run on the relay host).
    UnknownComm = 1,
    /// The request's tag does not answer the challenge under the communicator's key.
    BadTag = 2,
    /// No target is the far end of one of the relay's point-to-point links (a list: no link of
    /// that index).
    NotALink = 3,
    /// A bound of the relay is reached (relay connections in all, or from this client).
    Busy = 4,
    /// The relay could not reach the target (refused, timed out, its link down).
    Unreachable = 5,
    /// The request is malformed, or bytes came before the verdict (out of order).
    Malformed = 6,
    /// A verbs leg: the relay has no RDMA device on the links (it relays TCP only).
    NoVerbs = 7,
}

impl Code {
    fn from_byte(b: u8) -> Result<Code> {
        Ok(match b {
            0 => Code::Ok,
            1 => Code::UnknownComm,
            2 => Code::BadTag,
            3 => Code::NotALink,
            4 => Code::Busy,
            5 => Code::Unreachable,
            6 => Code::Malformed,
            7 => Code::NoVerbs,
            c => return Err(bad(format!("verdict code {c}, accepted 0..=7"))),
        })
    }

    /// What the code means, for the client's errors and the relay's log.
    pub fn text(self) -> &'static str {
        match self {
            Code::Ok => "accepted",
            Code::UnknownComm => {
                "it serves no such communicator (no rank of this communicator runs there, or its \
                 relay is off)"
            }
            Code::BadTag => "the request is not authenticated by the communicator",
            Code::NotALink => "the peer is not at the far end of one of its point-to-point links",
            Code::Busy => "it is at its bound of relay connections",
            Code::Unreachable => "it could not reach the peer",
            Code::Malformed => "the request was malformed or out of order",
            Code::NoVerbs => "it relays over TCP only (no RDMA device on its links)",
        }
    }
}

/// A verdict's meaning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerdictRepr {
    pub code: Code,
    /// The target the relay matched (probe) or reached (open), or the far end of the link asked
    /// about (list); unspecified on a refusal.
    pub target: Ipv4Addr,
    /// The relay's own address on the target's link (the target sees the relay's streams come
    /// from it).
    pub via: Ipv4Addr,
    /// The relay's link speed toward the target, Mb/s (0: unknown).
    pub speed_mbps: u32,
    /// The relay's host name (informative; at most [`HOST_LEN`] bytes, cut on a character
    /// boundary).
    pub host: String,
    pub tag: [u8; NONCE_LEN],
}

impl VerdictRepr {
    /// A refusal (no tag, nothing about the relay).
    pub fn refusal(code: Code) -> VerdictRepr {
        VerdictRepr {
            code,
            target: Ipv4Addr::UNSPECIFIED,
            via: Ipv4Addr::UNSPECIFIED,
            speed_mbps: 0,
            host: String::new(),
            tag: [0; NONCE_LEN],
        }
    }

    /// Checks magic, version, code and the reserved bytes.
    pub fn parse(b: &[u8; VERDICT_LEN]) -> Result<VerdictRepr> {
        if b[vfield::MAGIC] != VERDICT_MAGIC {
            return Err(bad(format!(
                "verdict {:02x?}, expected \"SWRV\" (not a switchless relay)",
                &b[vfield::MAGIC]
            )));
        }
        if b[vfield::VERSION] != VERSION {
            return Err(bad(format!(
                "verdict version {}, this build speaks {VERSION}",
                b[vfield::VERSION]
            )));
        }
        let code = Code::from_byte(b[vfield::CODE])?;
        if b[vfield::RESERVED] != [0, 0] {
            return Err(bad("reserved verdict bytes are not zero".into()));
        }
        let ip =
            |f: Field| Ipv4Addr::new(b[f.start], b[f.start + 1], b[f.start + 2], b[f.start + 3]);
        let s = &b[vfield::SPEED];
        let host = &b[vfield::HOST];
        let end = host.iter().position(|&c| c == 0).unwrap_or(HOST_LEN);
        let mut tag = [0u8; NONCE_LEN];
        tag.copy_from_slice(&b[vfield::TAG]);
        Ok(VerdictRepr {
            code,
            target: ip(vfield::TARGET),
            via: ip(vfield::VIA),
            speed_mbps: u32::from_le_bytes([s[0], s[1], s[2], s[3]]),
            // Shown escaped: a peer's bytes.
            host: String::from_utf8_lossy(&host[..end])
                .escape_debug()
                .to_string(),
            tag,
        })
    }

    /// The verdict's bytes.
    pub fn to_bytes(&self) -> [u8; VERDICT_LEN] {
        let mut b = [0u8; VERDICT_LEN];
        b[vfield::MAGIC].copy_from_slice(&VERDICT_MAGIC);
        b[vfield::VERSION] = VERSION;
        b[vfield::CODE] = self.code as u8;
        b[vfield::TARGET].copy_from_slice(&self.target.octets());
        b[vfield::VIA].copy_from_slice(&self.via.octets());
        b[vfield::SPEED].copy_from_slice(&self.speed_mbps.to_le_bytes());
        let mut n = self.host.len().min(HOST_LEN);
        while !self.host.is_char_boundary(n) {
            n -= 1;
        }
        b[vfield::HOST.start..vfield::HOST.start + n].copy_from_slice(&self.host.as_bytes()[..n]);
        b[vfield::TAG].copy_from_slice(&self.tag);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe() -> RequestRepr {
        RequestRepr {
            op: Op::Probe,
            comm: 0,
            port: 0,
            targets: vec![Ipv4Addr::new(10, 0, 1, 2), Ipv4Addr::new(10, 0, 2, 1)],
            nonce: [3; NONCE_LEN],
            tag: [0; NONCE_LEN],
        }
    }

    #[test]
    fn ports_are_in_the_range_and_depend_on_the_communicator() {
        let ports: Vec<u16> = (0..200u64).map(|c| port_for(c * 7919)).collect();
        assert!(
            ports
                .iter()
                .all(|&p| (PORT_BASE..PORT_BASE + PORT_SPAN).contains(&p))
        );
        assert!(ports.windows(2).any(|w| w[0] != w[1]));
        assert_eq!(port_for(42), port_for(42));
    }

    #[test]
    fn requests_round_trip_and_tags_bind_the_challenge_and_every_field() {
        let k = CommKey::new(0x5357_4c42_0000_0004);
        let ch = [9u8; NONCE_LEN];
        let r = k.seal(probe(), &ch);
        assert_eq!(r.comm, k.id());
        let b = r.to_bytes();
        let p = RequestRepr::parse(&b).unwrap();
        assert_eq!(p, r);
        assert!(k.check(&p, &ch));
        assert!(!k.check(&p, &[8; NONCE_LEN]), "another challenge");
        assert!(!CommKey::new(1).check(&p, &ch), "another communicator");
        for byte in 4..field::TAG.start {
            let mut x = b;
            x[byte] ^= 1;
            if let Ok(q) = RequestRepr::parse(&x) {
                assert!(!k.check(&q, &ch), "byte {byte} is not covered by the tag");
            }
        }
        assert_eq!(format!("{k:?}"), format!("CommKey(id {:#018x})", k.id()));
    }

    #[test]
    fn malformed_requests_are_refused_naming_the_field() {
        let b = probe().to_bytes();
        let err = |f: &dyn Fn(&mut [u8; REQUEST_LEN])| {
            let mut x = b;
            f(&mut x);
            let e = RequestRepr::parse(&x).unwrap_err();
            assert!(matches!(e, Error::Remote(_)));
            e.to_string()
        };
        assert!(err(&|x| x[0] = b'X').contains("SWRQ"));
        assert!(err(&|x| x[4] = 9).contains("version 9"));
        assert!(err(&|x| x[5] = 6).contains("op 6"));
        assert!(err(&|x| x[5] = 5).contains("2 targets in a verbs leg"));
        assert!(err(&|x| x[5] = 4).contains("2 targets in a list"));
        assert!(err(&|x| x[5] = 3).contains("2 targets in an open to a relay"));
        assert!(err(&|x| x[6] = 0).contains("0 targets"));
        assert!(err(&|x| x[6] = 17).contains("17 targets"));
        assert!(err(&|x| x[7] = 1).contains("reserved"));
        assert!(err(&|x| x[16] = 1).contains("port 1 in a probe"));
        assert!(err(&|x| x[28] = 1).contains("target slot 2"));
        let mut open = probe();
        open.op = Op::Open;
        open.targets.truncate(1);
        assert!(
            RequestRepr::parse(&open.to_bytes())
                .unwrap_err()
                .to_string()
                .contains("port 0 in an open")
        );
        open.port = 22;
        assert!(
            RequestRepr::parse(&open.to_bytes())
                .unwrap_err()
                .to_string()
                .contains("target port 22")
        );
        open.port = 4000;
        assert_eq!(RequestRepr::parse(&open.to_bytes()).unwrap(), open);
        open.targets.push(Ipv4Addr::new(1, 2, 3, 4));
        assert!(
            RequestRepr::parse(&open.to_bytes())
                .unwrap_err()
                .to_string()
                .contains("2 targets in an open")
        );
        // An open to a relay: one target and a door port, as an open.
        let mut relay = open.clone();
        relay.op = Op::OpenRelay;
        relay.targets.truncate(1);
        relay.port = PORT_BASE;
        assert_eq!(RequestRepr::parse(&relay.to_bytes()).unwrap(), relay);
        relay.port = 0;
        assert!(
            RequestRepr::parse(&relay.to_bytes())
                .unwrap_err()
                .to_string()
                .contains("port 0 in an open to a relay")
        );
        relay.port = 80;
        assert!(
            RequestRepr::parse(&relay.to_bytes())
                .unwrap_err()
                .to_string()
                .contains("target port 80 in an open to a relay")
        );
        // A verbs leg: one target and no port (the relay opens no connection to it).
        let mut verbs = relay.clone();
        verbs.op = Op::OpenVerbs;
        verbs.port = 0;
        assert_eq!(RequestRepr::parse(&verbs.to_bytes()).unwrap(), verbs);
        verbs.port = PORT_BASE;
        assert!(
            RequestRepr::parse(&verbs.to_bytes())
                .unwrap_err()
                .to_string()
                .contains("a probe and a verbs leg none")
        );
        // A list: no target, a link index below MAX_LINKS in the port field (0 included).
        let mut list = relay.clone();
        list.op = Op::List;
        list.targets.clear();
        for i in [0, MAX_LINKS - 1] {
            list.port = i;
            assert_eq!(RequestRepr::parse(&list.to_bytes()).unwrap(), list);
        }
        list.port = MAX_LINKS;
        assert!(
            RequestRepr::parse(&list.to_bytes())
                .unwrap_err()
                .to_string()
                .contains("link index 16 in a list")
        );
        list.port = 0;
        list.targets.push(Ipv4Addr::new(1, 2, 3, 4));
        assert!(
            RequestRepr::parse(&list.to_bytes())
                .unwrap_err()
                .to_string()
                .contains("1 targets in a list request, accepted 0..=0")
        );
        let mut b = list.to_bytes();
        b[field::NTARGETS] = 0;
        assert!(
            RequestRepr::parse(&b)
                .unwrap_err()
                .to_string()
                .contains("target slot 0 holds 1.2.3.4 beyond the 0 targets")
        );
    }

    #[test]
    fn verdicts_round_trip_and_only_ok_ones_are_tagged() {
        let k = CommKey::new(5);
        let req_tag = [4u8; NONCE_LEN];
        let v = k.seal_verdict(
            VerdictRepr {
                code: Code::Ok,
                target: Ipv4Addr::new(10, 0, 2, 2),
                via: Ipv4Addr::new(10, 0, 2, 1),
                speed_mbps: 100_000,
                host: "node-5".into(),
                tag: [0; NONCE_LEN],
            },
            &req_tag,
        );
        let p = VerdictRepr::parse(&v.to_bytes()).unwrap();
        assert_eq!(p, v);
        assert!(k.check_verdict(&p, &req_tag));
        assert!(!k.check_verdict(&p, &[5; NONCE_LEN]));
        let mut forged = p.clone();
        forged.via = Ipv4Addr::new(10, 9, 9, 9);
        assert!(!k.check_verdict(&forged, &req_tag));
        let r = VerdictRepr::parse(&VerdictRepr::refusal(Code::Busy).to_bytes()).unwrap();
        assert_eq!(
            (r.code, r.host.as_str(), r.tag),
            (Code::Busy, "", [0; NONCE_LEN])
        );
        let mut b = v.to_bytes();
        b[5] = 8;
        assert!(
            VerdictRepr::parse(&b)
                .unwrap_err()
                .to_string()
                .contains("code 8")
        );
        // A host name is cut to its field on a character boundary, and shown escaped.
        let long = VerdictRepr {
            host: "é".repeat(20),
            ..VerdictRepr::refusal(Code::Ok)
        };
        assert_eq!(
            VerdictRepr::parse(&long.to_bytes()).unwrap().host,
            "é".repeat(16)
        );
        let mut b = VerdictRepr::refusal(Code::Ok).to_bytes();
        b[20] = b'\n';
        assert_eq!(VerdictRepr::parse(&b).unwrap().host, "\\n");
    }

    #[test]
    fn challenges_round_trip() {
        let c = ChallengeRepr {
            nonce: [7; NONCE_LEN],
        };
        assert_eq!(ChallengeRepr::parse(&c.to_bytes()).unwrap(), c);
        let mut b = c.to_bytes();
        b[4] = 2;
        assert!(
            ChallengeRepr::parse(&b)
                .unwrap_err()
                .to_string()
                .contains("version 2")
        );
    }
}
