//! The operating system below the transports: raw process memory, the few socket syscalls the TCP
//! fabric makes without `std`, and threads that do not pin the library ([`thread`]). With `ffi` and `verbs`, the only module where `unsafe` is allowed; every
//! unsafe block has a `SAFETY:` comment, and every libc call that reports through `errno` goes through
//! `syscall!` (pthread calls return their error).
#![allow(unsafe_code)]

/// Calls `libc::$fn(args…)` and turns a negative return into `Err(io::Error::last_os_error())`
/// (mio's convention). The caller states why the arguments are valid in a `SAFETY:` comment above the
/// macro; the macro adds nothing the caller has not proved.
macro_rules! syscall {
    ($fn:ident ( $($arg:expr),* $(,)? )) => {{
        // SAFETY: see the `SAFETY:` comment at the call site; the arguments are the caller's.
        let res = unsafe { libc::$fn($($arg),*) };
        if res < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(res)
        }
    }};
}

pub mod clock;
pub mod rawmem;
pub mod socket;
pub mod thread;

pub use rawmem::{HostBuffer, Lent, RawRegion, page_size};
pub use socket::{Ready, recv_slice, send_slice, wait_fd};
