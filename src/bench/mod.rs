//! `switchless bench`: the modes of the ABI driver (latency, bandwidth, alltoall, allreduce), verification
//! patterns and result tables. The plugin itself is reached through `ffi::host`.
#![forbid(unsafe_code)]
