//! switchless: an NCCL network plugin for RDMA (and Ethernet) fabrics with no switch.
//!
//! An NCCL call flows down the layers (docs/guide/contributing.md draws them):
//!
//! * [`ffi`]: the exported `ncclNetPlugin_v6` … `ncclNetPlugin_v12` vtables, one thin adapter per ABI
//!   version over one core, the panic guard and the bridge from `tracing` to NCCL's logger; apart from
//!   them, [`ffi::loader`] loads a plugin by path for `switchless bench`.
//! * [`tuner`]: beside [`plugin`], the tuner NCCL loads from the same library (`ncclTunerPlugin_v1` …
//!   `v6`, exported by `ffi::tuner`): the cabling-aware choice of Ring or Tree, and host orders.
//! * [`plugin`]: the core plugin, written once, in safe Rust; [`host`] describes the machine to it
//!   (kernel files read through a root directory, the host model, NCCL devices).
//! * [`route`]: pure functions: which local links and remote addresses carry a connection.
//! * [`transport`]: the CTS protocol, wire formats, striping, the sans-IO handshake, the `Fabric`
//!   trait, the in-memory and TCP fabrics.
//! * [`verbs`] (ibverbs RAII wrappers and the verbs fabric) and [`sys`] (raw memory, socket
//!   syscalls): with [`ffi`], the only modules where `unsafe` is allowed.
//!
//! Beside them: [`config`] (the environment), [`error`], [`sync`] (the one lock helper),
//! [`findings`]; and [`tools`], the CLI only (doctor, plan, nccl-tests, bench).
#![deny(unsafe_code)]
// Miri cannot call the C test logger; under Miri the tests use a Rust C-variadic one.
#![cfg_attr(miri, feature(c_variadic))]

pub mod config;
pub mod error;
pub mod ffi;
pub mod findings;
pub mod host;
pub mod plugin;
pub mod route;
pub mod sync;
pub mod sys;
pub mod tools;
pub mod transport;
pub mod tuner;
pub mod verbs;

/// Plugin version (the crate version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit the library was built from (`git rev-parse --short=12 HEAD`; `SWITCHLESS_COMMIT` when
/// set at build time; `unknown` outside git).
pub const COMMIT: &str = env!("SWITCHLESS_COMMIT");

/// The ncclNet ABI versions this library exports, newest first.
pub const ABI_VERSIONS: &[u32] = &[12, 11, 10, 9, 8, 7, 6];

/// The ncclTuner ABI versions this library exports, newest first.
pub const TUNER_ABI_VERSIONS: &[u32] = &[6, 5, 4, 3, 2, 1];
