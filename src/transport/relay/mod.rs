//! Relay paths: one more path of a connection A → B through a host K cabled to both. A's streams
//! of the path reach K's relay service, which joins each to a stream from K to B and forwards
//! frames both ways, store and forward, never interpreting them; B sees a path whose streams come
//! from K's address on its link. The path is a path like any other to the comm protocol: its
//! writes complete on B's acknowledgements, end to end (`tcp::frame::OP_ACK`), so failover and
//! its fence carry over; a relay host that dies cuts its streams, and the path fails over.
//!
//! * [`wire`]: the relay door (challenge, request, verdict) and the port rule ([`port_for`]).
//! * [`client`]: the connecting host's side: [`Probe`] (which neighbour reaches the peer),
//!   [`LinkList`] (which hosts a neighbour is cabled to: a chain's second relays) and
//!   [`RelayDialer`] (each stream of a relayed path opened through the relay).
//! * [`service`]: the relay host's side: [`RelayService`] (one thread per port) and [`Relays`]
//!   (services started and stopped with the communicators that register).
//! * `leg`: one relayed stream at the relay host.
//! * Verbs legs (not wired into the plugin yet: relay paths are TCP today): [`staging`], the
//!   sans-IO core (descriptor, K's staging ring, A's credits); [`staged`], the path kind at A and
//!   B (a [`Fabric`](crate::transport::fabric::Fabric) wrapper whose staged paths write through
//!   K's ring and complete on K's credits); [`forward`], K's forwarder over its two queue pairs;
//!   [`pump`], K's thread that polls every forwarder; [`leg_setup`], the messages that set a leg
//!   up on the door's connection (door op 5: the service answers them, [`verbs_client`] asks).
//!
//! The design and its bounds: docs/guide/relay.md and docs/security.md.
#![forbid(unsafe_code)]

pub mod client;
pub mod forward;
mod leg;
pub mod leg_setup;
pub mod pump;
pub mod service;
pub mod staged;
pub mod staging;
pub mod verbs_client;
pub mod wire;

pub use client::{Found, Hop, LinkList, ListState, Probe, ProbeState, RelayDialer};
pub use service::{
    Bounds, LegFactory, PendingLeg, RelayLink, RelayService, RelayStats, Relays, ServiceConfig,
    Ticket,
};
pub use wire::{CommKey, port_for};

use crate::error::{Error, Result};

/// 16 random bytes from the OS (a challenge or a client nonce).
fn random_nonce() -> Result<[u8; wire::NONCE_LEN]> {
    let mut n = [0u8; wire::NONCE_LEN];
    getrandom::fill(&mut n)
        .map_err(|e| Error::System(format!("reading random bytes for the relay door: {e}")))?;
    Ok(n)
}
