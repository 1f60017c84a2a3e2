//! RAII wrappers over ibverbs (rdma-sys for classic verbs; newer symbols resolved at run time).
//! With `ffi`, the only module where `unsafe` is allowed; every unsafe block has a `SAFETY:` comment.
#![allow(unsafe_code)]

pub mod rawmem;
