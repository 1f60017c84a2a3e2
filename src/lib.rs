//! switchless: an NCCL network plugin for RDMA (and Ethernet) fabrics with no switch.
//!
//! Data flows through the layers in the order of the module list:
//!
//! * [`ffi`]: the exported `ncclNetPlugin_v6` … `ncclNetPlugin_v12` vtables, one thin adapter per ABI
//!   version over one core, the panic guard and the bridge from `tracing` to NCCL's logger.
//!   Also the host side of the ABI (loading a plugin by path), used by `switchless bench`.
//! * [`plugin`]: the core plugin, written once, in safe Rust.
//! * [`fabric`]: discovery of the host from kernel files (sysfs, procfs) through a root directory,
//!   the host model, NCCL devices that merge multi-host PCIe functions, and `doctor`.
//! * [`route`]: pure functions: which local links and remote addresses carry a connection.
//! * [`transport`]: connection state machines, the handshake, the CTS protocol, striping, requests.
//! * [`verbs`]: RAII wrappers over ibverbs; with [`ffi`] the only place `unsafe` is allowed.
//!
//! Beside the data path: [`config`] (environment), [`plan`] (cables file → IP plan),
//! [`nccltests`] (nccl-tests output parser), [`bench`](mod@bench) (the ABI driver's modes), [`cli`].
#![deny(unsafe_code)]

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
pub mod verbs;

/// Plugin version (the crate version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The ncclNet ABI versions this library exports, newest first.
pub const ABI_VERSIONS: &[u32] = &[12, 11, 10, 9, 8, 7, 6];
