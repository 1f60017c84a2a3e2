//! Connection handshake over TCP.
//!
//! Messages (each behind a 12-byte frame header; see [`wire`] and docs/guide/routing.md):
//!
//! 1. connector → acceptor `Hello`: the connector's own nonce, its chosen paths (its address, the
//!    acceptor's address, kind) and its per-path [`PathParams`] plus opaque `extra` bytes, tagged
//!    with a key derived from the listener's nonce and the connector's (`auth.rs`; the listener's
//!    nonce itself never travels);
//! 2. acceptor → connector `Reply` with its params for the same paths (tagged too), or `Refuse` with
//!    a reason (tagged too); a client whose hello is not authenticated gets a fixed `Reject`, which a
//!    connector does not act on (it tries again, and names no text a peer sent);
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

pub mod auth;
mod connector;
mod frames;
mod io;
mod listener;
pub mod wire;

pub use connector::{
    ConnectEvent, ConnectMachine, LAST_TARGET_WAIT, RETRY_BACKOFF, RETRY_BACKOFF_MAX,
    TARGET_BUDGET, UNAUTHENTICATED_GIVE_UP,
};
pub use frames::Frames;
pub use io::{
    ACCEPTS_PER_POLL, AcceptPoll, ConnectPoll, Connector, Established, Incoming,
    LIVENESS_CHECK_EVERY, LIVENESS_GRACE, LIVENESS_KEEPALIVE, Listener, Liveness,
};
pub use listener::{
    AcceptEvent, AcceptMachine, AcceptedPath, AcceptorView, HELLO_TIMEOUT, ListenMachine,
    MAX_PENDING, MAX_PENDING_PER_SOURCE, MAX_PENDING_PROCESS, MAX_SEEN_NONCES, PENDING_RESERVE,
    PendingBudget, UNAUTHENTICATED, ipv4_mapped_gid,
};
pub use wire::{Hello, Message, PathParams, PathRequest, Refuse, Reply, SideParams};
