//! RAII wrappers over ibverbs (rdma-sys for classic verbs; newer symbols resolved at run time).
//! With `ffi` and `sys`, the only modules where `unsafe` is allowed; every unsafe block has a `SAFETY:` comment.
//!
//! Ownership: every object holds an `Arc` to its parent ([`QueuePair`] → [`ProtectionDomain`] and
//! [`CompletionQueue`]s → [`Context`]; [`MemoryRegion`] → [`ProtectionDomain`]), so destruction
//! always runs children first, whatever order the caller drops them in.
#![allow(unsafe_code)]

pub(crate) mod call;
mod context;
mod cq;
pub mod devices;
pub mod domain;
pub mod events;
pub mod fabric;
mod memory;
mod qp;
pub mod relay_leg;
mod sym;
mod types;

pub use call::system_error;
pub use context::{Context, DeviceCaps, GidTableEntry, device_names, fork_init};
pub use cq::{Completion, CompletionQueue, WcOpcode, WcStatus};
pub use domain::{Domain, Pin};
pub use events::{AsyncEvent, EventScope};
pub use memory::{
    DmabufSupport, MemoryRegion, ProtectionDomain, probe_dmabuf, probe_dmabuf_context,
    probe_dmabuf_device,
};
pub use qp::{
    CHAIN_MAX, MAX_QPN, MAX_SGE, QpCaps, QueuePair, RemoteAddr, RtrParams, RtsParams, SendFlags,
    Sge, WriteReq,
};
pub use sym::{OptionalSymbols, optional_symbols};
pub use types::{
    Access, Gid, GidEntry, GidType, LinkLayer, Mtu, PortInfo, PortState, gid_type_from_sysfs,
};
