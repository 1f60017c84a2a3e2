//! Routing: pure functions deciding which local links and remote addresses carry a connection.
//! No I/O here; inputs come from the fabric model (local side) and the peer's listen handle (remote side).
#![forbid(unsafe_code)]

pub mod types;
