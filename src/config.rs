//! Typed configuration read from the environment at `init`.
#![forbid(unsafe_code)]
