//! Threads the plugin starts from one of NCCL's threads and joins before `dlclose`.
//!
//! `std::thread::Builder::spawn` reads a thread-local with a destructor (std's spawn-hook list) on
//! the *calling* thread. In a `cdylib` that is the library's own copy of std, so glibc counts a
//! pending TLS destructor against the library, and `dlclose` leaves it mapped until that NCCL thread
//! exits — the main thread, for a service started in `init`, so never. [`spawn`] starts the thread
//! with `pthread_create` and touches nothing thread-local on the caller; what the new thread
//! registers it runs at its own exit, before [`Joiner::join`] returns.

use std::ffi::{CString, c_void};
use std::io;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A thread started by [`spawn`]. Dropping it without [`Joiner::join`] detaches the thread.
#[derive(Debug)]
pub struct Joiner {
    tid: libc::pthread_t,
    joined: bool,
}

/// Starts `f` on a new thread named `name` (the kernel keeps 15 bytes of it). A panic in `f` is
/// caught at the thread's edge (the thread ends; nothing unwinds into C).
pub fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> io::Result<Joiner> {
    let name = CString::new(
        name.as_bytes()
            .iter()
            .copied()
            .take(15)
            .collect::<Vec<u8>>(),
    )
    .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "thread name holds a NUL"))?;
    let arg: Box<(Job, CString)> = Box::new((Box::new(f), name));
    let arg = Box::into_raw(arg).cast::<c_void>();
    let mut tid: libc::pthread_t = 0;
    // SAFETY: `tid` is a valid out pointer; default attributes (NULL); `start` matches the C
    // signature and takes ownership of `arg`, a leaked Box of the type it rebuilds, exactly once.
    let rc = unsafe { libc::pthread_create(&mut tid, std::ptr::null(), start, arg) };
    if rc != 0 {
        // SAFETY: the thread was not created, so `start` never ran: the Box is still ours.
        drop(unsafe { Box::from_raw(arg.cast::<(Job, CString)>()) });
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(Joiner { tid, joined: false })
}

extern "C" fn start(arg: *mut c_void) -> *mut c_void {
    // SAFETY: `arg` is the Box leaked by `spawn` for this thread alone.
    let (job, name) = *unsafe { Box::from_raw(arg.cast::<(Job, CString)>()) };
    // SAFETY: this thread's own handle; `name` is NUL-terminated and at most 15 bytes.
    unsafe { libc::pthread_setname_np(libc::pthread_self(), name.as_ptr()) };
    // A panic must not unwind out of an `extern "C"` function.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    std::ptr::null_mut()
}

impl Joiner {
    /// Waits for the thread to end (its thread-local destructors included).
    pub fn join(mut self) {
        self.joined = true;
        // SAFETY: `tid` names a thread this Joiner started and has neither joined nor detached.
        unsafe { libc::pthread_join(self.tid, std::ptr::null_mut()) };
    }
}

impl Drop for Joiner {
    fn drop(&mut self) {
        if !self.joined {
            // SAFETY: as in `join`: not joined or detached before; the thread's resources are
            // freed when it ends.
            unsafe { libc::pthread_detach(self.tid) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn a_spawned_thread_runs_is_named_and_is_joined() {
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let t = spawn("swl-test-thread-long-name", move || {
            let name = std::fs::read_to_string("/proc/thread-self/comm").unwrap_or_default();
            r.store(name.trim() == "swl-test-thread", Ordering::SeqCst);
        })
        .expect("spawn");
        t.join();
        assert!(
            ran.load(Ordering::SeqCst),
            "the thread ran under its 15-byte name"
        );
    }

    #[test]
    fn a_panic_ends_only_its_thread() {
        spawn("swl-panic", || panic!("caught at the thread's edge"))
            .expect("spawn")
            .join();
    }
}
