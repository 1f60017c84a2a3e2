//! The crate's one lock helper and its poison policy.
//!
//! **Policy: a poisoned lock fails closed.** A panic inside a critical section (caught by the FFI
//! guard or a worker's `catch_unwind`) may have left the protected state half-updated, so whoever
//! finds the lock poisoned gets [`Error::Internal`] naming the lock, and the object it guards (a comm,
//! a path, the backend slot) is unusable from then on. Code that cannot return an error (`Drop`,
//! logging, statistics) skips its work instead. [`read()`] and [`write()`] apply the same policy to a
//! `RwLock`.
#![forbid(unsafe_code)]

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::error::{Error, Result};

/// Locks `m`; a poisoned lock is [`Error::Internal`] "`what` lock poisoned by an earlier panic".
pub fn lock<'a, T>(m: &'a Mutex<T>, what: &str) -> Result<MutexGuard<'a, T>> {
    m.lock()
        .map_err(|_| Error::Internal(format!("{what} lock poisoned by an earlier panic")))
}

/// Takes `m` for reading; poisoned: [`Error::Internal`], as [`lock`].
pub fn read<'a, T>(m: &'a RwLock<T>, what: &str) -> Result<RwLockReadGuard<'a, T>> {
    m.read()
        .map_err(|_| Error::Internal(format!("{what} lock poisoned by an earlier panic")))
}

/// Takes `m` for writing; poisoned: [`Error::Internal`], as [`lock`]. Either way the call has waited
/// for every reader to leave.
pub fn write<'a, T>(m: &'a RwLock<T>, what: &str) -> Result<RwLockWriteGuard<'a, T>> {
    m.write()
        .map_err(|_| Error::Internal(format!("{what} lock poisoned by an earlier panic")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_fails_closed_naming_the_lock() {
        let m = std::sync::Arc::new(Mutex::new(1));
        assert_eq!(*lock(&m, "comm").unwrap(), 1);
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        let e = lock(&m, "comm").unwrap_err();
        assert_eq!(
            e,
            Error::Internal("comm lock poisoned by an earlier panic".into())
        );
    }

    #[test]
    fn a_poisoned_rwlock_fails_closed_for_readers_and_writers() {
        let m = std::sync::Arc::new(RwLock::new(1));
        assert_eq!(*read(&m, "registry").unwrap(), 1);
        *write(&m, "registry").unwrap() = 2;
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.write().unwrap();
            panic!("poison it");
        })
        .join();
        let want = Error::Internal("registry lock poisoned by an earlier panic".into());
        assert_eq!(read(&m, "registry").unwrap_err(), want);
        assert_eq!(write(&m, "registry").unwrap_err(), want);
    }
}
