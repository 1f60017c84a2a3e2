//! Connection state machines, handshake, CTS protocol, striping over paths, requests.
#![forbid(unsafe_code)]
pub mod handshake;
