//! The C ABI: exported vtables (one thin adapter per version over `plugin`), panic guard, logger bridge,
//! and, apart from the exports, the loader (the importing side, used by `switchless bench`).
//!
//! * [`abi`]: bindgen types from `include/nccl_net_switchless.h` (net ABI v6–v12) and
//!   `include/nccl_tuner_switchless.h` (tuner ABI v1–v6).
//! * [`vtables`]: the exported `ncclNetPlugin_v6` … `ncclNetPlugin_v12` statics; each field is one generic
//!   entry point of `adapters` instantiated for the version's argument shapes ([`props`] converts the
//!   per-version structs).
//! * `guard`: every entry point runs inside [`guard::guard`] (no unwinding into C; errors and panics become a
//!   WARN line and an `ncclResult_t`).
//! * [`log`]: the `tracing` → `ncclDebugLogger_t` bridge.
//! * [`tuner`]: the exported `ncclTunerPlugin_v1` … `ncclTunerPlugin_v6` tables over [`crate::tuner`],
//!   in the same guard and logger.
//!
//! Apart from the exports: [`loader`], the importing side: `dlopen` any ncclNet plugin by path and drive
//! `ncclNetPlugin_v12` through the safe [`loader::Net`] trait (`switchless bench`).
#![allow(unsafe_code)]

pub mod abi;
mod adapters;
pub mod guard;
pub mod log;
pub mod props;
#[doc(hidden)]
pub mod testsupport;
pub mod tuner;
pub mod vtables;

// The importing side (not part of the exported plugin).
pub mod loader;

#[cfg(test)]
mod tests;
