//! `switchless plan`: cables file + port maps → per-link IP plan, its outputs, and checking a host against it.
#![forbid(unsafe_code)]
