//! [`PathPlan`]: one path of a connection as the backend planned it, in a file of its own so that
//! what reads plans (the metrics registry) need not depend on the backend itself.
#![forbid(unsafe_code)]

use std::net::Ipv4Addr;

use crate::route::types::{LinkKind, LocalLink};

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
}
