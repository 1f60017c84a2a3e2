//! The [`PathFactory`](super::switchless::PathFactory) implementations: [`net::NetFactory`] in
//! production (RoCE through [`verbs::VerbsFactory`], or TCP), [`mem::MemFactory`] over the in-memory
//! fabric for tests.
#![forbid(unsafe_code)]

pub mod mem;
pub mod net;
pub mod verbs;
