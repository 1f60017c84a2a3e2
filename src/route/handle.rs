//! The listen handle: the ≤ 128-byte blob NCCL copies from `listen` to the connecting rank.
//!
//! It describes the whole listening node, not one port (the connector, not NCCL, picks the links that
//! reach it): every link address with
//! its prefix, kind and compact PCIe-root / physical-port ids, the listener's TCP port and a random
//! per-listener nonce. The connector routes from it (see [`crate::route::select()`]).
//!
//! Written in the smoltcp wire style: [`Handle`] is a checked view over bytes with named field ranges,
//! [`HandleRepr`] is the parsed form with [`HandleRepr::parse`] / [`HandleRepr::emit`].
//!
//! Layout, version 1 (all multi-byte integers big-endian; 128 bytes in all):
//!
//! | bytes    | field     | meaning                                                                |
//! |----------|-----------|------------------------------------------------------------------------|
//! | 0..2     | magic     | `0x53 0x57` ("SW")                                                     |
//! | 2        | version   | 1                                                                      |
//! | 3        | count     | number of link entries used, 0..=16                                    |
//! | 4..12    | nonce     | 8 random bytes chosen per listener; echoed in the connector's hello    |
//! | 12..14   | port      | the listener's TCP port (1..=65535), reachable on every link address   |
//! | 14..18   | control   | fallback control IPv4 address (0.0.0.0 = none)                         |
//! | 18..114  | links     | 16 slots of 6 bytes; slots at index ≥ count are all zero               |
//! | 114..120 | reserved  | zero                                                                   |
//! | 120..128 | scratch   | written as zero, ignored by the decoder: the connecting plugin's own   |
//! |          |           | per-connection state id (NCCL passes the same private handle copy on   |
//! |          |           | every connect retry (`proxy.cc`), as NCCL IB keeps its `stage` there) |
//!
//! A link slot: bytes 0..4 the IPv4 address; byte 4: bit 7 kind (0 RoCE, 1 TCP), bit 6 zero,
//! bits 0..5 the prefix length (1..=32); byte 5: high nibble the PCIe-root index, low nibble the
//! physical-port index. Both indices are handle-local (dense 0..=15 in order of first appearance): they
//! only say which of the listener's addresses share a PCIe root or a cable, which is all a connector
//! needs to balance paths.
#![forbid(unsafe_code)]

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::error::{Error, Result};
use crate::route::types::{LinkKind, LocalLink, RemoteLink};

/// NCCL's `NCCL_NET_HANDLE_MAXSIZE`.
pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;
/// Bytes of a version-1 handle (the whole NCCL handle).
pub const HANDLE_LEN: usize = 128;
/// The handle magic, "SW".
pub const MAGIC: [u8; 2] = *b"SW";
/// The handle version this code writes and reads.
pub const VERSION: u8 = 1;
/// Link entries a handle can carry (a B300 has 8 CX-8 ports × 2 halves).
pub const MAX_LINKS: usize = 16;
/// Bytes of one link entry.
pub const LINK_LEN: usize = 6;

const _: () = assert!(HANDLE_LEN <= NCCL_NET_HANDLE_MAXSIZE);
const _: () = assert!(field::LINKS.start + MAX_LINKS * LINK_LEN <= field::RESERVED.start);
const _: () = assert!(field::SCRATCH.end == HANDLE_LEN);

/// Byte ranges of the handle's fields.
pub mod field {
    /// A range of bytes.
    pub type Field = core::ops::Range<usize>;
    pub const MAGIC: Field = 0..2;
    pub const VERSION: usize = 2;
    pub const COUNT: usize = 3;
    pub const NONCE: Field = 4..12;
    pub const PORT: Field = 12..14;
    pub const CONTROL: Field = 14..18;
    pub const LINKS: Field = 18..114;
    pub const RESERVED: Field = 114..120;
    pub const SCRATCH: Field = 120..128;

    /// Offsets inside one link slot.
    pub mod link {
        use super::Field;
        pub const ADDR: Field = 0..4;
        pub const FLAGS: usize = 4;
        pub const IDS: usize = 5;
    }
}

const KIND_TCP_BIT: u8 = 0x80;
const FLAGS_RESERVED_BIT: u8 = 0x40;
const PREFIX_MASK: u8 = 0x3f;

/// A checked view over the bytes of a listen handle.
#[derive(Debug, Clone)]
pub struct Handle<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Handle<T> {
    /// Wraps a buffer without checking its length; accessors may panic on a short buffer.
    /// Use [`Handle::new_checked`] for untrusted bytes.
    pub const fn new_unchecked(buffer: T) -> Self {
        Handle { buffer }
    }

    /// Wraps a buffer after [`Handle::check_len`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let h = Self::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// The buffer must hold at least [`HANDLE_LEN`] bytes (NCCL always passes 128).
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HANDLE_LEN {
            return Err(Error::InvalidArgument(format!(
                "listen handle is {len} bytes; a switchless handle needs {HANDLE_LEN} bytes"
            )));
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

    pub fn magic(&self) -> [u8; 2] {
        [self.b()[0], self.b()[1]]
    }
    pub fn version(&self) -> u8 {
        self.b()[field::VERSION]
    }
    pub fn count(&self) -> u8 {
        self.b()[field::COUNT]
    }
    pub fn nonce(&self) -> u64 {
        let mut n = [0u8; 8];
        n.copy_from_slice(&self.b()[field::NONCE]);
        u64::from_be_bytes(n)
    }
    pub fn port(&self) -> u16 {
        let p = &self.b()[field::PORT];
        u16::from_be_bytes([p[0], p[1]])
    }
    pub fn control(&self) -> Ipv4Addr {
        let c = &self.b()[field::CONTROL];
        Ipv4Addr::new(c[0], c[1], c[2], c[3])
    }
    /// The raw 6 bytes of link slot `i` (`i < MAX_LINKS`).
    pub fn link_slot(&self, i: usize) -> &[u8] {
        let start = field::LINKS.start + i * LINK_LEN;
        &self.b()[start..start + LINK_LEN]
    }
    pub fn reserved(&self) -> &[u8] {
        &self.b()[field::RESERVED]
    }
    /// The connector's scratch value (see the layout table); not part of [`HandleRepr`].
    pub fn scratch(&self) -> u64 {
        let mut n = [0u8; 8];
        n.copy_from_slice(&self.b()[field::SCRATCH]);
        u64::from_ne_bytes(n)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Handle<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    pub fn set_magic(&mut self, m: [u8; 2]) {
        self.bm()[field::MAGIC].copy_from_slice(&m);
    }
    pub fn set_version(&mut self, v: u8) {
        self.bm()[field::VERSION] = v;
    }
    pub fn set_count(&mut self, c: u8) {
        self.bm()[field::COUNT] = c;
    }
    pub fn set_nonce(&mut self, n: u64) {
        self.bm()[field::NONCE].copy_from_slice(&n.to_be_bytes());
    }
    pub fn set_port(&mut self, p: u16) {
        self.bm()[field::PORT].copy_from_slice(&p.to_be_bytes());
    }
    pub fn set_control(&mut self, a: Ipv4Addr) {
        self.bm()[field::CONTROL].copy_from_slice(&a.octets());
    }
    pub fn link_slot_mut(&mut self, i: usize) -> &mut [u8] {
        let start = field::LINKS.start + i * LINK_LEN;
        &mut self.bm()[start..start + LINK_LEN]
    }
    pub fn clear_reserved(&mut self) {
        self.bm()[field::RESERVED].fill(0);
        self.bm()[field::SCRATCH].fill(0);
    }
    /// Stores the connector's per-connection state id in the handle copy NCCL retries with.
    pub fn set_scratch(&mut self, v: u64) {
        self.bm()[field::SCRATCH].copy_from_slice(&v.to_ne_bytes());
    }
}

/// The parsed listen handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandleRepr {
    /// Random per-listener value; the connector echoes it so a stray connection is recognised.
    pub nonce: u64,
    /// The listener's TCP port.
    pub port: u16,
    /// Fallback control address (`None` when the listener has none).
    pub control: Option<Ipv4Addr>,
    /// The listener's link addresses. `phys_port_id` and `pci_root_id` are handle-local indices (0..=15).
    pub links: Vec<RemoteLink>,
}

impl HandleRepr {
    /// Parses a handle, checking every field. Errors name the field and the accepted values.
    pub fn parse<T: AsRef<[u8]>>(h: &Handle<T>) -> Result<Self> {
        h.check_len()?;
        let bad = |what: String| Error::Remote(format!("peer's listen handle: {what}"));
        if h.magic() != MAGIC {
            return Err(bad(format!(
                "magic is {:02x}{:02x}, expected 5357 (\"SW\"): not a switchless handle (is every rank using NCCL_NET_PLUGIN=switchless?)",
                h.magic()[0],
                h.magic()[1]
            )));
        }
        if h.version() != VERSION {
            return Err(bad(format!(
                "version is {}, this plugin reads version {VERSION} (mixed plugin versions across ranks?)",
                h.version()
            )));
        }
        let count = usize::from(h.count());
        if count > MAX_LINKS {
            return Err(bad(format!(
                "link count is {count}, accepted 0..={MAX_LINKS}"
            )));
        }
        let port = h.port();
        if port == 0 {
            return Err(bad("TCP port is 0, accepted 1..=65535".into()));
        }
        let control = h.control();
        let control = if control.is_unspecified() {
            None
        } else {
            check_unicast(control).map_err(|e| bad(format!("control address: {e}")))?;
            Some(control)
        };
        if h.reserved().iter().any(|&b| b != 0) {
            return Err(bad(format!(
                "reserved bytes {}..{} are not zero (written by a newer plugin?)",
                field::RESERVED.start,
                field::RESERVED.end
            )));
        }
        let mut links = Vec::with_capacity(count);
        for i in 0..MAX_LINKS {
            let slot = h.link_slot(i);
            if i >= count {
                if slot.iter().any(|&b| b != 0) {
                    return Err(bad(format!(
                        "unused link slot {i} (count is {count}) is not zero"
                    )));
                }
                continue;
            }
            let addr = Ipv4Addr::new(slot[0], slot[1], slot[2], slot[3]);
            check_unicast(addr).map_err(|e| bad(format!("link {i}: {e}")))?;
            let flags = slot[field::link::FLAGS];
            if flags & FLAGS_RESERVED_BIT != 0 {
                return Err(bad(format!(
                    "link {i}: reserved flag bit 6 is set, accepted 0"
                )));
            }
            let prefix = flags & PREFIX_MASK;
            if !(1..=32).contains(&prefix) {
                return Err(bad(format!(
                    "link {i} ({addr}): prefix length {prefix}, accepted 1..=32"
                )));
            }
            let net = Ipv4Net::new(addr, prefix)
                .map_err(|e| bad(format!("link {i} ({addr}/{prefix}): {e}")))?;
            if links.iter().any(|l: &RemoteLink| l.addr.addr() == addr) {
                return Err(bad(format!("link {i}: address {addr} appears twice")));
            }
            let kind = if flags & KIND_TCP_BIT != 0 {
                LinkKind::Tcp
            } else {
                LinkKind::Roce
            };
            let ids = slot[field::link::IDS];
            links.push(RemoteLink {
                addr: net,
                phys_port_id: u16::from(ids & 0x0f),
                pci_root_id: u16::from(ids >> 4),
                kind,
            });
        }
        Ok(HandleRepr {
            nonce: h.nonce(),
            port,
            control,
            links,
        })
    }

    /// Parses a handle from raw bytes (at least [`HANDLE_LEN`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        Self::parse(&Handle::new_checked(bytes)?)
    }

    /// Bytes [`HandleRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HANDLE_LEN
    }

    /// Writes the handle into `h` (which must hold [`HANDLE_LEN`] bytes). Fails if the representation
    /// cannot be encoded (too many links, an index above 15, port 0, a bad prefix).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Handle<T>) -> Result<()> {
        h.check_len()?;
        let bad =
            |what: String| Error::InvalidArgument(format!("cannot encode listen handle: {what}"));
        if self.links.len() > MAX_LINKS {
            return Err(bad(format!(
                "{} links, at most {MAX_LINKS} fit",
                self.links.len()
            )));
        }
        if self.port == 0 {
            return Err(bad("TCP port 0".into()));
        }
        h.set_magic(MAGIC);
        h.set_version(VERSION);
        // Fits: checked against MAX_LINKS (16) above.
        h.set_count(self.links.len() as u8);
        h.set_nonce(self.nonce);
        h.set_port(self.port);
        h.set_control(self.control.unwrap_or(Ipv4Addr::UNSPECIFIED));
        h.clear_reserved();
        for i in 0..MAX_LINKS {
            let slot = h.link_slot_mut(i);
            let Some(l) = self.links.get(i) else {
                slot.fill(0);
                continue;
            };
            let prefix = l.addr.prefix_len();
            if !(1..=32).contains(&prefix) {
                return Err(bad(format!(
                    "link {} has prefix /{prefix}, accepted 1..=32",
                    l.addr
                )));
            }
            if l.phys_port_id > 15 || l.pci_root_id > 15 {
                return Err(bad(format!(
                    "link {}: phys_port_id {} / pci_root_id {}; handle indices must be 0..=15 (use HandleRepr::from_local)",
                    l.addr, l.phys_port_id, l.pci_root_id
                )));
            }
            slot[field::link::ADDR].copy_from_slice(&l.addr.addr().octets());
            let kind = if l.kind == LinkKind::Tcp {
                KIND_TCP_BIT
            } else {
                0
            };
            slot[field::link::FLAGS] = kind | prefix;
            slot[field::link::IDS] = ((l.pci_root_id as u8) << 4) | (l.phys_port_id as u8);
        }
        Ok(())
    }

    /// Encodes into a fresh 128-byte array.
    pub fn to_bytes(&self) -> Result<[u8; HANDLE_LEN]> {
        let mut buf = [0u8; HANDLE_LEN];
        self.emit(&mut Handle::new_unchecked(&mut buf[..]))?;
        Ok(buf)
    }

    /// Builds the handle a listener publishes: the links of the node that are up, at most
    /// [`MAX_LINKS`], ranked by use to a switchless mesh ([`advert_rank`]: RoCE on a point-to-point
    /// /30 or /31 first, the cables that face peers; then other RoCE (storage, a second address);
    /// then TCP on point-to-point links; management networks last), in link order within a rank,
    /// with PCIe roots and physical ports renumbered densely in order of first appearance. Returns
    /// the links left out (the caller warns about RoCE ones; doctor reports them).
    pub fn from_local(
        links: &[LocalLink],
        port: u16,
        control: Option<Ipv4Addr>,
        nonce: u64,
    ) -> (Self, Vec<LocalLink>) {
        let mut up: Vec<&LocalLink> = links.iter().filter(|l| l.up).collect();
        // Stable: by rank, otherwise the host model's order.
        up.sort_by_key(|l| advert_rank(l));
        let (kept, rest) = up.split_at(up.len().min(MAX_LINKS));
        let mut roots: Vec<&str> = Vec::new();
        let mut ports: Vec<u16> = Vec::new();
        let index = |v: usize| v as u16;
        let remote = kept
            .iter()
            .map(|l| {
                let r = roots
                    .iter()
                    .position(|x| *x == l.pci_root)
                    .unwrap_or_else(|| {
                        roots.push(&l.pci_root);
                        roots.len() - 1
                    });
                let p = ports
                    .iter()
                    .position(|x| *x == l.phys_port_id)
                    .unwrap_or_else(|| {
                        ports.push(l.phys_port_id);
                        ports.len() - 1
                    });
                RemoteLink {
                    addr: l.addr,
                    phys_port_id: index(p),
                    pci_root_id: index(r),
                    kind: l.kind,
                }
            })
            .collect();
        let mut left_out: Vec<LocalLink> = rest.iter().map(|l| (*l).clone()).collect();
        left_out.extend(links.iter().filter(|l| !l.up).cloned());
        (
            HandleRepr {
                nonce,
                port,
                control,
                links: remote,
            },
            left_out,
        )
    }
}

/// Where a link ranks for a place in the listen handle (lower first): RoCE before TCP, a
/// point-to-point subnet (a cable to one peer, the switchless topology) before a wider one (a
/// storage or management network, reachable otherwise), a link of an NCCL device before one NCCL
/// does not use.
pub fn advert_rank(l: &LocalLink) -> (bool, bool, bool) {
    (
        l.kind != LinkKind::Roce,
        !crate::route::types::point_to_point(l.addr),
        l.nccl_dev.is_none(),
    )
}

/// What a node with `links` advertises to a connector, through the real encoding and decoding
/// (used by `switchless route` to predict a connection between two hosts).
pub fn advertised(links: &[LocalLink]) -> Result<Vec<RemoteLink>> {
    let (repr, _) = HandleRepr::from_local(links, 1, None, 0);
    Ok(HandleRepr::from_bytes(&repr.to_bytes()?)?.links)
}

/// A fresh random nonce from the OS.
pub fn random_nonce() -> Result<u64> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b)
        .map_err(|e| Error::System(format!("reading random bytes for a listen nonce: {e}")))?;
    Ok(u64::from_ne_bytes(b))
}

fn check_unicast(a: Ipv4Addr) -> std::result::Result<(), String> {
    if a.octets()[0] == 0 || a.is_broadcast() || a.is_multicast() {
        return Err(format!("{a} is not a unicast address"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn link(addr: &str, root: &str, port: u16, kind: LinkKind, up: bool) -> LocalLink {
        LocalLink {
            id: 0,
            kind,
            netdev: format!("eth{port}"),
            rdma_dev: None,
            port: 1,
            addr: addr.parse().unwrap(),
            gid_index: Some(3),
            pci_root: root.into(),
            phys_port_id: port,
            nccl_dev: None,
            speed_mbps: 200_000,
            mtu: 9000,
            active_mtu: 4096,
            up,
        }
    }

    #[test]
    fn layout_fits_and_round_trips() {
        let locals: Vec<LocalLink> = (0..16)
            .map(|i| {
                link(
                    &format!("10.{i}.0.1/30"),
                    &format!("pci0000:{:02x}", i / 2),
                    300 + i / 2,
                    LinkKind::Roce,
                    true,
                )
            })
            .collect();
        let (repr, left) =
            HandleRepr::from_local(&locals, 4242, Some("192.0.2.7".parse().unwrap()), 7);
        assert!(left.is_empty());
        let bytes = repr.to_bytes().unwrap();
        assert_eq!(bytes.len(), 128);
        assert_eq!(&bytes[0..2], b"SW");
        assert_eq!(bytes[3], 16);
        assert_eq!(&bytes[12..14], &4242u16.to_be_bytes());
        // Link 3: 10.3.0.1/30, RoCE, root index 1, port index 1.
        assert_eq!(&bytes[18 + 3 * 6..18 + 4 * 6], &[10, 3, 0, 1, 30, 0x11]);
        let back = HandleRepr::from_bytes(&bytes).unwrap();
        assert_eq!(back, repr);
        assert_eq!(back.links[15].pci_root_id, 7);
    }

    #[test]
    fn from_local_orders_roce_first_skips_down_and_truncates() {
        let mut locals = vec![link("192.168.1.5/24", "r0", 1, LinkKind::Tcp, true)];
        locals.push(link("10.0.0.1/31", "r1", 2, LinkKind::Roce, false));
        for i in 0..17 {
            locals.push(link(
                &format!("10.1.{i}.1/30"),
                "r2",
                3,
                LinkKind::Roce,
                true,
            ));
        }
        let (repr, left) = HandleRepr::from_local(&locals, 1, None, 1);
        assert_eq!(repr.links.len(), 16);
        assert!(repr.links.iter().all(|l| l.kind == LinkKind::Roce));
        assert_eq!(left.len(), 3); // one RoCE over the limit, the TCP one, the down one
        assert!(left.iter().any(|l| !l.up));
    }

    /// A full DGX B300 (review N4): 16 mesh cables (8 CX-8, two 400G halves each, on /30s), 4
    /// storage RoCE ports on a /24, 2 secondary addresses on mesh netdevs and 2 management TCP
    /// links: 24 up links. The 16 mesh cables are advertised whatever the model's order; the
    /// storage, secondary and management links are the ones left out.
    #[test]
    fn twenty_four_links_keep_the_sixteen_mesh_cables() {
        let mut locals = Vec::new();
        // The host model orders by netdev name: storage and management sort first.
        for i in 0..2 {
            locals.push(link(
                &format!("192.168.0.{}/24", 10 + i),
                "m",
                90,
                LinkKind::Tcp,
                true,
            ));
        }
        for i in 0..4 {
            let mut l = link(
                &format!("172.16.0.{}/24", 10 + i),
                "s",
                80 + i,
                LinkKind::Roce,
                true,
            );
            l.nccl_dev = Some(16 + i as usize);
            locals.push(l);
        }
        for i in 0..16u16 {
            let mut l = link(
                &format!("10.0.{i}.1/30"),
                &format!("pci{}", i / 2),
                i / 2,
                LinkKind::Roce,
                true,
            );
            l.nccl_dev = Some(usize::from(i));
            locals.push(l);
        }
        for i in 0..2 {
            locals.push(link(
                &format!("10.9.{i}.1/24"),
                "pci0",
                0,
                LinkKind::Roce,
                true,
            ));
        }
        assert_eq!(locals.len(), 24);
        let (repr, left) = HandleRepr::from_local(&locals, 1, None, 1);
        let kept: Vec<String> = repr.links.iter().map(|l| l.addr.to_string()).collect();
        let want: Vec<String> = (0..16).map(|i| format!("10.0.{i}.1/30")).collect();
        assert_eq!(kept, want);
        let mut dropped: Vec<String> = left.iter().map(|l| l.addr.to_string()).collect();
        dropped.sort();
        assert_eq!(
            dropped,
            [
                "10.9.0.1/24",
                "10.9.1.1/24",
                "172.16.0.10/24",
                "172.16.0.11/24",
                "172.16.0.12/24",
                "172.16.0.13/24",
                "192.168.0.10/24",
                "192.168.0.11/24"
            ]
        );
        // Round trip: the 16 kept links with 8 PCIe roots and 8 ports.
        let back = HandleRepr::from_bytes(&repr.to_bytes().unwrap()).unwrap();
        assert_eq!(back, repr);
        // 24 mesh cables: the first 16 in link order stay, the other 8 are named.
        let mesh: Vec<LocalLink> = (0..24u16)
            .map(|i| link(&format!("10.1.{i}.1/31"), "r", i, LinkKind::Roce, true))
            .collect();
        let (repr, left) = HandleRepr::from_local(&mesh, 1, None, 1);
        assert_eq!(repr.links.len(), 16);
        assert_eq!(left.len(), 8);
        assert_eq!(left[0].addr.to_string(), "10.1.16.1/31");
    }

    #[test]
    fn errors_name_field_and_accepted_value() {
        let (repr, _) = HandleRepr::from_local(
            &[link("10.0.0.1/30", "r", 0, LinkKind::Roce, true)],
            9,
            None,
            5,
        );
        let good = repr.to_bytes().unwrap();
        let cases: Vec<(usize, u8, &str)> = vec![
            (0, b'X', "expected 5357"),
            (2, 2, "this plugin reads version 1"),
            (3, 17, "accepted 0..=16"),
            (3, 0, "unused link slot 0"),
            (3, 2, "link 1: 0.0.0.0 is not a unicast"),
            (119, 1, "reserved bytes 114..120"),
            (22, 0x40 | 30, "reserved flag bit 6"),
            (22, 33, "accepted 1..=32"),
            (22, 0, "accepted 1..=32"),
            (18, 0, "not a unicast"),
            (18, 224, "not a unicast"),
        ];
        for (off, val, needle) in cases {
            let mut b = good;
            b[off] = val;
            let e = HandleRepr::from_bytes(&b).unwrap_err();
            assert!(matches!(e, Error::Remote(_)), "{e}");
            assert!(
                e.to_string().contains(needle),
                "offset {off}: {e} lacks {needle:?}"
            );
        }
        let mut b = good;
        b[12] = 0;
        b[13] = 0;
        assert!(
            HandleRepr::from_bytes(&b)
                .unwrap_err()
                .to_string()
                .contains("port is 0")
        );
        let e = HandleRepr::from_bytes(&good[..127]).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("needs 128"),
            "{e}"
        );
        // The scratch bytes belong to the connector: ignored by the decoder, zeroed by emit.
        let mut b = good;
        let mut h = Handle::new_unchecked(&mut b[..]);
        h.set_scratch(0xfeed_beef);
        assert_eq!(h.scratch(), 0xfeed_beef);
        assert_eq!(HandleRepr::from_bytes(&b).unwrap(), repr);
        // Trailing bytes beyond 128 are ignored (NCCL's buffer is exactly 128 anyway).
        let mut long = good.to_vec();
        long.push(0xff);
        assert_eq!(HandleRepr::from_bytes(&long).unwrap(), repr);
    }

    #[test]
    fn duplicate_address_rejected() {
        let l = RemoteLink {
            addr: "10.0.0.1/30".parse().unwrap(),
            phys_port_id: 0,
            pci_root_id: 0,
            kind: LinkKind::Roce,
        };
        let repr = HandleRepr {
            nonce: 1,
            port: 1,
            control: None,
            links: vec![l, l],
        };
        let e = HandleRepr::from_bytes(&repr.to_bytes().unwrap()).unwrap_err();
        assert!(e.to_string().contains("appears twice"), "{e}");
    }

    #[test]
    fn nonce_is_random() {
        assert_ne!(random_nonce().unwrap(), random_nonce().unwrap());
    }

    fn arb_link() -> impl Strategy<Value = RemoteLink> {
        (
            0x0100_0000u32..0xe000_0000,
            1u8..=32,
            0u16..16,
            0u16..16,
            any::<bool>(),
        )
            .prop_map(|(a, p, port, root, tcp)| RemoteLink {
                addr: Ipv4Net::new(Ipv4Addr::from(a), p).unwrap(),
                phys_port_id: port,
                pci_root_id: root,
                kind: if tcp { LinkKind::Tcp } else { LinkKind::Roce },
            })
    }

    proptest! {
        #[test]
        fn round_trip(nonce in any::<u64>(), port in 1u16.., control in proptest::option::of(0x0100_0000u32..0xe000_0000),
                      links in proptest::collection::vec(arb_link(), 0..=16)) {
            let mut links = links;
            let mut seen = std::collections::HashSet::new();
            links.retain(|l| seen.insert(l.addr.addr()));
            let repr = HandleRepr { nonce, port, control: control.map(Ipv4Addr::from), links };
            let bytes = repr.to_bytes().unwrap();
            prop_assert_eq!(HandleRepr::from_bytes(&bytes).unwrap(), repr);
        }

        /// Arbitrary bytes never panic, and whatever parses re-encodes to the same bytes.
        #[test]
        fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(repr) = HandleRepr::from_bytes(&bytes) {
                let again = repr.to_bytes().unwrap();
                prop_assert_eq!(&again[..field::SCRATCH.start], &bytes[..field::SCRATCH.start]);
            }
        }
    }
}
