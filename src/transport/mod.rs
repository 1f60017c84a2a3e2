//! Connection state machines, handshake, CTS protocol, striping over paths, requests.
#![forbid(unsafe_code)]
//!
//! # Data path (see `docs/guide/transport.md`)
//!
//! * [`fabric`]: the `Fabric` trait, the verbs-level operations the protocol needs (RDMA write with or
//!   without immediate, RDMA read, receives, completion polling, registration, control memory).
//! * [`comm`]: `SendComm` / `RecvComm`, the receiver-driven protocol (CTS FIFO, tags, sizes, striping,
//!   flush, errors, teardown).
//! * [`stripe`]: pure arithmetic splitting a message over paths by link speed.
//! * [`wire`]: layouts shared by both sides (CTS slot, size record, immediate, `wr_id`, control info).
//! * [`revive`]: the reconnect exchange of failback (fresh queue pairs agreed over a surviving path).
//! * [`droplog`]: warnings for connections the listeners drop, rate-limited per process.
//! * [`ctrl`]: atomic words that software fabrics write for their peer, and the shared range check.
//! * [`metrics`]: a connection's counters (bytes and pieces per path, failovers, waits), written by
//!   its comm without locks and read by the exporter.
//! * [`regcache`]: the ref-counted registration cache (one pin per device and page range).
//! * [`memfab`]: an in-process fabric with fault injection for tests and benchmarks.
//! * [`modelfab`]: an in-process fabric with modelled rates and latencies, in virtual time.
//! * [`tcp`]: a fabric over TCP streams (Ethernet paths without RDMA), same protocol.
//! * [`relay`]: relay paths through a neighbour cabled to both ends (the relay door, the relay
//!   service thread, the client's probe and dialer).

pub mod comm;
pub mod ctrl;
pub mod droplog;
pub mod fabric;
pub mod handshake;
pub mod memfab;
pub mod metrics;
pub mod modelfab;
pub mod regcache;
pub mod relay;
pub mod revive;
pub mod stripe;
pub mod tcp;
pub mod wire;
