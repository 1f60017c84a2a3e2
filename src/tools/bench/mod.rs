//! `switchless bench`: the modes of the ABI driver (latency, bandwidth, alltoall, allreduce), verification
//! patterns and result tables. The plugin itself is reached through `ffi::loader`; the modes are written
//! against the [`Net`] trait so that [`loopback`] can run them in-process in tests.
#![forbid(unsafe_code)]

pub mod bootstrap;
pub mod breakdown;
mod checks;
pub mod clock;
mod conns;
pub mod cpu;
pub mod hints;
pub mod inproc;
mod latency;
pub mod loopback;
pub mod mesh;
pub mod model;
pub mod modes;
pub mod nccl;
pub mod pattern;
mod pipeline;
pub mod rdma_counters;
pub mod report;
mod stream;
pub mod summary;

pub use crate::ffi::loader::net::{
    CommRef, HANDLE_SIZE, Handle, Net, PTR_HOST, Properties, RecvBuf, Region, SharedBuf,
};
pub use bootstrap::Bootstrap;
pub use conns::Moved;
pub use hints::NetAttrMode;
pub use modes::{Mode, Options, Report, Row, run};
