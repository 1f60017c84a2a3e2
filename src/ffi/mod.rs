//! The C ABI: exported vtables (one thin adapter per version over `plugin`), panic guard, logger bridge,
//! and the host side (loading an ncclNet plugin by path) used by `switchless bench`.
#![allow(unsafe_code)]
