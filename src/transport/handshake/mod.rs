//! Connection handshake over TCP.
//!
//! Messages (each behind a 12-byte frame header; see [`wire`] and docs/readme/route.md):
//!
//! 1. connector → acceptor `Hello`: the listener's nonce, the connector's chosen paths (its address,
//!    the acceptor's address, kind) and its per-path [`PathParams`] plus opaque `extra` bytes;
//! 2. acceptor → connector `Reply` with its params for the same paths, or `Reject` with a reason;
//! 3. connector → acceptor `Ready` once the connector's QPs are ready to receive (NCCL IB does the same).
//!
//! The connector knows its params up front ([`Connector::start`]); the acceptor creates its QPs after
//! it sees the hello, so [`Listener::poll`] yields an [`Incoming`] carrying the hello, the caller
//! supplies its params with [`Incoming::respond`], then polls the `Incoming` to completion. Both end
//! with the TCP socket ([`Established`]), nothing read past the handshake.
//!
//! Layout, quinn-proto style: `connector.rs` and `listener.rs` are the state machines, sans-IO (bytes
//! and `now` in; bytes to send, events and `poll_timeout` out), over `frames.rs` (one connection's
//! buffers) and `wire.rs` (the format); `io.rs` is the driver that owns the sockets and the clock.
//! Tests drive the machines with a virtual clock (`tests/handshake.rs`).
#![forbid(unsafe_code)]

mod connector;
mod frames;
mod io;
mod listener;
pub mod wire;

pub use connector::{ConnectEvent, ConnectMachine, TARGET_BUDGET};
pub use frames::Frames;
pub use io::{AcceptPoll, ConnectPoll, Connector, Established, Incoming, Listener};
pub use listener::{
    AcceptEvent, AcceptMachine, AcceptedPath, AcceptorView, ListenMachine, MAX_PENDING,
};
pub use wire::{Hello, Message, PathParams, PathRequest, Reply, SideParams};
