//! [`PathPlan`]: one path of a connection as the backend planned it, in a file of its own so that
//! what reads plans (the metrics registry) need not depend on the backend itself.
#![forbid(unsafe_code)]

use std::net::Ipv4Addr;

use crate::route::types::{LinkKind, LocalLink};
use crate::transport::tcp::RelayVia;

/// One path of a connection as the backend planned it (connector: from `route::select`; acceptor: from
/// the hello, checked by `route::check_incoming`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPlan {
    /// This node's link.
    pub local: LocalLink,
    /// The peer's address on the same subnet.
    pub remote: Ipv4Addr,
    /// What the path carries.
    pub kind: LinkKind,
    /// A TCP path through a relay host (`transport::relay`): on the connector `remote` is the
    /// peer's address the relay reaches and the dialer opens each stream through the relay; on
    /// the acceptor `remote` is the relay's address on this link, and there is no dialer.
    pub relay: Option<RelayVia>,
}
