//! Plain values of the verbs API: GIDs, MTUs, port states, GID types, access flags.
//! No `unsafe` here.

use crate::error::{Error, Result};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

/// A 16-byte GID as on the wire (network byte order).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// All zeros: an empty GID table slot.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// In `fe80::/64` (a link-local GID, not routable between subnets).
    pub fn is_link_local(&self) -> bool {
        self.0[..8] == [0xfe, 0x80, 0, 0, 0, 0, 0, 0]
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`, how RoCE v2 encodes IPv4).
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.0).to_ipv4_mapped()
    }

    /// The GID as an IPv6 address.
    pub fn ipv6(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }

    /// The IPv4-mapped GID of `addr`.
    pub fn from_ipv4(addr: Ipv4Addr) -> Gid {
        Gid(addr.to_ipv6_mapped().octets())
    }
}

impl std::fmt::Display for Gid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.ipv4() {
            Some(v4) => write!(f, "::ffff:{v4}"),
            None => write!(f, "{}", self.ipv6()),
        }
    }
}

impl std::fmt::Debug for Gid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// An IB path MTU (`enum ibv_mtu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    Mtu256 = 1,
    Mtu512 = 2,
    Mtu1024 = 3,
    Mtu2048 = 4,
    Mtu4096 = 5,
}

impl Mtu {
    /// From the `ibv_mtu` value; `None` for anything else.
    pub fn from_ibv(v: u32) -> Option<Mtu> {
        Some(match v {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// From a size in bytes (256, 512, 1024, 2048 or 4096).
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        Some(match bytes {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// The `ibv_mtu` value.
    pub fn to_ibv(self) -> u32 {
        self as u32
    }

    /// Size in bytes.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }
}

/// Port state (`enum ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortState {
    Nop,
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
    Unknown(u32),
}

impl PortState {
    pub fn from_ibv(v: u32) -> PortState {
        match v {
            0 => PortState::Nop,
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            other => PortState::Unknown(other),
        }
    }

    /// The state as sysfs and `ibv_devinfo` spell it (`DOWN`, `ACTIVE`, …).
    pub fn name(self) -> String {
        match self {
            PortState::Nop => "NOP".into(),
            PortState::Down => "DOWN".into(),
            PortState::Init => "INIT".into(),
            PortState::Armed => "ARMED".into(),
            PortState::Active => "ACTIVE".into(),
            PortState::ActiveDefer => "ACTIVE_DEFER".into(),
            PortState::Unknown(v) => format!("state {v}"),
        }
    }
}

/// Port link layer (`IBV_LINK_LAYER_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    Unspecified,
    Infiniband,
    Ethernet,
    Unknown(u8),
}

impl LinkLayer {
    pub fn from_ibv(v: u8) -> LinkLayer {
        match v {
            0 => LinkLayer::Unspecified,
            1 => LinkLayer::Infiniband,
            2 => LinkLayer::Ethernet,
            other => LinkLayer::Unknown(other),
        }
    }
}

/// What `ibv_query_port` reports that we use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortInfo {
    pub state: PortState,
    /// `None` if the device reports a value outside `ibv_mtu`.
    pub active_mtu: Option<Mtu>,
    pub max_mtu: Option<Mtu>,
    /// Number of GID table entries.
    pub gid_tbl_len: u32,
    pub link_layer: LinkLayer,
    pub lid: u16,
    /// `ibv_port_attr.active_width` / `active_speed` codes (compat fields).
    pub active_width: u8,
    pub active_speed: u8,
}

/// GID type (`IBV_GID_TYPE_*`, or the sysfs `gid_attrs/types/<i>` text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GidType {
    /// InfiniBand GID (or "IB/RoCE v1" on an IB port).
    Ib,
    /// RoCE v1 (Ethernet L2 only; not routable).
    RoceV1,
    /// RoCE v2 (UDP/IP): what a switchless point-to-point subnet needs.
    RoceV2,
}

impl GidType {
    /// From `ibv_gid_entry.gid_type` (0 IB, 1 RoCE v1, 2 RoCE v2).
    pub fn from_ibv(v: u32) -> Option<GidType> {
        match v {
            0 => Some(GidType::Ib),
            1 => Some(GidType::RoceV1),
            2 => Some(GidType::RoceV2),
            _ => None,
        }
    }

    /// From the text of `/sys/class/infiniband/<dev>/ports/<p>/gid_attrs/types/<i>`: "IB/RoCE v1"
    /// (IB on an IB port, RoCE v1 on an Ethernet port), "RoCE v1", "RoCE v2".
    pub fn from_sysfs_text(text: &str, link_layer: LinkLayer) -> Option<GidType> {
        match text.trim() {
            "RoCE v2" => Some(GidType::RoceV2),
            "RoCE v1" => Some(GidType::RoceV1),
            "IB/RoCE v1" if link_layer == LinkLayer::Ethernet => Some(GidType::RoceV1),
            "IB/RoCE v1" => Some(GidType::Ib),
            _ => None,
        }
    }
}

/// Reads the GID type from sysfs under `sysfs_root` (normally `/sys`).
pub fn gid_type_from_sysfs(
    sysfs_root: &Path,
    dev: &str,
    port: u8,
    index: u32,
    link_layer: LinkLayer,
) -> Result<GidType> {
    let path = sysfs_root
        .join("class/infiniband")
        .join(dev)
        .join(format!("ports/{port}/gid_attrs/types/{index}"));
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::io(format!("reading the GID type from {}", path.display()), e))?;
    GidType::from_sysfs_text(&text, link_layer).ok_or_else(|| {
        Error::System(format!(
            "{} holds {:?}; expected \"IB/RoCE v1\", \"RoCE v1\" or \"RoCE v2\"",
            path.display(),
            text.trim()
        ))
    })
}

/// One populated GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u32,
    pub gid: Gid,
    /// `None` when neither `_ibv_query_gid_ex` nor sysfs could tell.
    pub gid_type: Option<GidType>,
}

/// Memory-region and QP access flags (`enum ibv_access_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(pub u32);

impl Access {
    pub const NONE: Access = Access(0);
    pub const LOCAL_WRITE: Access = Access(1);
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    pub const REMOTE_READ: Access = Access(1 << 2);
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);
    /// PCIe relaxed ordering (`IBV_ACCESS_RELAXED_ORDERING`, an optional flag: ignored where unsupported).
    pub const RELAXED_ORDERING: Access = Access(1 << 20);

    /// What a data buffer needs: LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ.
    pub const RDMA: Access = Access(1 | (1 << 1) | (1 << 2));

    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_state_names_match_sysfs() {
        assert_eq!(PortState::from_ibv(1).name(), "DOWN");
        assert_eq!(PortState::from_ibv(4).name(), "ACTIVE");
        assert_eq!(PortState::from_ibv(5).name(), "ACTIVE_DEFER");
        assert_eq!(PortState::from_ibv(9).name(), "state 9");
    }

    #[test]
    fn mtu_values() {
        assert_eq!(Mtu::Mtu1024.bytes(), 1024);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        for v in 1..=5 {
            let m = Mtu::from_ibv(v).unwrap();
            assert_eq!(m.to_ibv(), v);
            assert_eq!(Mtu::from_bytes(m.bytes()), Some(m));
        }
        assert_eq!(Mtu::from_ibv(0), None);
        assert_eq!(Mtu::from_ibv(6), None);
        assert_eq!(Mtu::from_bytes(1500), None);
        assert_eq!(Mtu::Mtu1024.min(Mtu::Mtu4096), Mtu::Mtu1024);
        assert_eq!(Mtu::Mtu4096.to_ibv(), rdma_sys::ibv_mtu::IBV_MTU_4096);
    }

    #[test]
    fn gids() {
        let g = Gid::from_ipv4(Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(g.ipv4(), Some(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(g.to_string(), "::ffff:10.0.0.1");
        assert!(!g.is_zero() && !g.is_link_local());
        let ll = Gid("fe80::1".parse::<Ipv6Addr>().unwrap().octets());
        assert!(ll.is_link_local());
        assert_eq!(ll.ipv4(), None);
        assert_eq!(ll.to_string(), "fe80::1");
        assert!(Gid::default().is_zero());
    }

    #[test]
    fn gid_types_from_text() {
        assert_eq!(
            GidType::from_sysfs_text("RoCE v2\n", LinkLayer::Ethernet),
            Some(GidType::RoceV2)
        );
        assert_eq!(
            GidType::from_sysfs_text("IB/RoCE v1", LinkLayer::Ethernet),
            Some(GidType::RoceV1)
        );
        assert_eq!(
            GidType::from_sysfs_text("IB/RoCE v1", LinkLayer::Infiniband),
            Some(GidType::Ib)
        );
        assert_eq!(
            GidType::from_sysfs_text("RoCE v3", LinkLayer::Ethernet),
            None
        );
        assert_eq!(GidType::from_ibv(2), Some(GidType::RoceV2));
        assert_eq!(GidType::from_ibv(7), None);
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "writes a temp dir on the host filesystem; Miri isolates it"
    )]
    fn gid_type_from_sysfs_tree() {
        let root = tempfile::tempdir().unwrap();
        let dir = root
            .path()
            .join("class/infiniband/rxe0/ports/1/gid_attrs/types");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("1"), "RoCE v2\n").unwrap();
        std::fs::write(dir.join("2"), "garbage\n").unwrap();
        assert_eq!(
            gid_type_from_sysfs(root.path(), "rxe0", 1, 1, LinkLayer::Ethernet).unwrap(),
            GidType::RoceV2
        );
        let m = gid_type_from_sysfs(root.path(), "rxe0", 1, 2, LinkLayer::Ethernet)
            .unwrap_err()
            .to_string();
        assert!(m.contains("garbage") && m.contains("RoCE v2"), "{m}");
        let m = gid_type_from_sysfs(root.path(), "rxe0", 1, 9, LinkLayer::Ethernet)
            .unwrap_err()
            .to_string();
        assert!(m.contains("types/9"), "{m}");
    }

    #[test]
    fn access_flags_match_verbs_h() {
        use rdma_sys::ibv_access_flags as F;
        assert_eq!(Access::LOCAL_WRITE.0, F::IBV_ACCESS_LOCAL_WRITE.0);
        assert_eq!(Access::REMOTE_WRITE.0, F::IBV_ACCESS_REMOTE_WRITE.0);
        assert_eq!(Access::REMOTE_READ.0, F::IBV_ACCESS_REMOTE_READ.0);
        assert_eq!(Access::REMOTE_ATOMIC.0, F::IBV_ACCESS_REMOTE_ATOMIC.0);
        assert_eq!(Access::RELAXED_ORDERING.0, F::IBV_ACCESS_RELAXED_ORDERING.0);
        assert_eq!(
            Access::RDMA,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ
        );
        assert!(Access::RDMA.contains(Access::REMOTE_READ));
        assert!(!Access::LOCAL_WRITE.contains(Access::RDMA));
    }

    #[test]
    fn states_and_layers() {
        assert_eq!(
            PortState::from_ibv(rdma_sys::ibv_port_state::IBV_PORT_ACTIVE),
            PortState::Active
        );
        assert_eq!(PortState::from_ibv(99), PortState::Unknown(99));
        assert_eq!(LinkLayer::from_ibv(2), LinkLayer::Ethernet);
        assert_eq!(LinkLayer::from_ibv(9), LinkLayer::Unknown(9));
    }
}
