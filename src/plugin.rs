//! The core plugin, written once in safe Rust; `ffi` adapts it to every ABI version.
#![forbid(unsafe_code)]
