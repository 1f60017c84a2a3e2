//! The panic guard every entry point runs in, the error-code mapping, and checked pointer conversions
//! (every object handed to NCCL is filed in a registry of live objects until it is taken back;
//! requests are not objects but slab ids, checked by `plugin::slab`).

use std::any::Any;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{RwLock, RwLockReadGuard};

use super::abi::ncclResult_t;
use crate::error::{Error, Result, ResultCode};
use crate::plugin::Object;
use crate::sync::{read, write};

/// The `ncclResult_t` for a crate result code.
pub fn nccl_code(code: ResultCode) -> ncclResult_t {
    ncclResult_t(code as u32)
}

/// Runs one entry point: `Ok` → `ncclSuccess`; `Err(e)` → one WARN line naming the entry point and `e`, and
/// `e.code()`; a panic → one WARN line with the panic message and `ncclInternalError`. Nothing unwinds into
/// C.
pub fn guard(entry: &'static str, f: impl FnOnce() -> Result<()>) -> ncclResult_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => ncclResult_t::ncclSuccess,
        Ok(Err(e)) => {
            report(entry, &e);
            nccl_code(e.code())
        }
        Err(payload) => {
            let e = Error::Internal(format!("panic: {}", panic_text(payload.as_ref())));
            report(entry, &e);
            // A payload whose Drop panics must not escape either.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            ncclResult_t::ncclInternalError
        }
    }
}

fn report(entry: &str, e: &Error) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        tracing::warn!("switchless {entry}: {e}")
    }));
}

fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-text panic payload)".to_owned()
    }
}

/// An out-parameter NCCL must provide.
///
/// # Safety
/// `p` is NULL or valid for writes of `T` for `'a`, with no other live reference to it.
pub unsafe fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T> {
    if p.is_null() {
        return Err(Error::InvalidArgument(format!(
            "{what} is NULL; a valid pointer is required"
        )));
    }
    if !p.is_aligned() {
        return Err(Error::InvalidArgument(format!(
            "{what} ({p:p}) is misaligned"
        )));
    }
    // SAFETY: non-NULL and aligned; validity for writes is the caller's contract.
    Ok(unsafe { &mut *p })
}

/// Every object this library handed to NCCL and has not taken back, by address, with its kind's magic
/// word. A pointer is dereferenced only after it is found here, so a double close, a pointer of the
/// wrong kind (a request id included) or a comm used after close is an error, never a read of freed
/// memory. Best effort against one misuse only: an address freed and then reused for a new object of
/// the same kind passes (as it would in NCCL IB), and a close racing another call on the same object is
/// still the caller's bug.
///
/// A read-write lock, because the data path reads it: `isend`/`irecv`/`iflush` look up their comm and
/// mhandles under one shared guard (no allocation; progress threads do not wait for each other). Only
/// create/close and `regMr`/`deregMr`, on NCCL's service thread, write it, each for one map insert or
/// removal (never across `ibv_reg_mr`). `test` does not touch it.
static LIVE: RwLock<BTreeMap<usize, u64>> = RwLock::new(BTreeMap::new());

/// The registry, read-locked: one guard for the several lookups of one call ([`shared_in`]).
pub struct Live(RwLockReadGuard<'static, BTreeMap<usize, u64>>);

/// Takes the registry for reading.
pub fn live() -> Result<Live> {
    read(&LIVE, "live objects").map(Live)
}

/// Stores a boxed object in an out-pointer NCCL holds, filed as live under its kind.
pub fn give<T: Object>(slot: &mut *mut c_void, obj: Box<T>) -> Result<()> {
    let mut live = write(&LIVE, "live objects")?;
    let p = Box::into_raw(obj);
    live.insert(p as usize, T::MAGIC);
    *slot = p.cast();
    Ok(())
}

/// `p` as a `T` of ours: non-NULL, aligned, filed as a live `T`, and carrying `T`'s magic. Returns the
/// pointer; the callers decide which reference to make of it.
///
/// # Safety
/// `p` is NULL or a pointer NCCL got from this library; an object it names is not freed during the
/// call nor written concurrently except through its own locks.
unsafe fn checked<T: Object>(p: *mut c_void, what: &str) -> Result<*mut T> {
    // SAFETY: forwarded contract.
    unsafe { checked_in::<T>(&live()?, p, what) }
}

/// [`checked`] under a guard the caller holds.
///
/// # Safety
/// As for [`checked`].
unsafe fn checked_in<T: Object>(live: &Live, p: *mut c_void, what: &str) -> Result<*mut T> {
    let p = p.cast::<T>();
    if p.is_null() {
        return Err(Error::InvalidArgument(format!(
            "{what} is NULL; expected a {}",
            T::WHAT
        )));
    }
    if !p.is_aligned() {
        return Err(Error::InvalidArgument(format!(
            "{what} ({p:p}) is not a {}",
            T::WHAT
        )));
    }
    if live.0.get(&(p as usize)) != Some(&T::MAGIC) {
        return Err(not_live::<T>(p, what));
    }
    // SAFETY: filed as a live `T` (so not freed: `take` removes it first) and, by the caller's
    // contract, not freed during this call; the shared reference ends here.
    if !unsafe { &*p }.is_valid() {
        return Err(not_live::<T>(p, what));
    }
    Ok(p)
}

fn not_live<T: Object>(p: *mut T, what: &str) -> Error {
    Error::InvalidArgument(format!(
        "{what} ({p:p}) is not a live {} (closed or completed already, or another kind of object)",
        T::WHAT
    ))
}

/// A `void*` NCCL got from this plugin (a listen comm), checked for NULL, alignment, liveness and magic.
///
/// # Safety
/// `p` is NULL or a pointer NCCL got from this library, not used concurrently (NCCL calls a listen
/// comm from its service thread only).
pub unsafe fn object<'a, T: Object>(p: *mut c_void, what: &str) -> Result<&'a mut T> {
    // SAFETY: forwarded contract; `checked` proved it a live `T`, and NCCL uses it from one thread at
    // a time, so this is the only reference.
    unsafe { checked::<T>(p, what).map(|p| &mut *p) }
}

/// A shared reference to an object several NCCL threads use at once (a ctx; a send or recv comm:
/// `regMr` on the service thread while `isend`/`test` run on the progress thread; an mhandle), after
/// the same checks as [`object`]. Such objects keep their mutable state behind their own locks.
///
/// # Safety
/// `p` is NULL or a pointer NCCL got from this library, not freed during the call.
pub unsafe fn shared<'a, T: Object>(p: *mut c_void, what: &str) -> Result<&'a T> {
    // SAFETY: forwarded contract; `checked` proved it a live `T`; only shared access.
    unsafe { checked::<T>(p, what).map(|p| &*p) }
}

/// [`shared`] under a registry guard the caller holds (one guard for a comm and its mhandles).
///
/// # Safety
/// As for [`shared`].
pub unsafe fn shared_in<'a, T: Object>(live: &Live, p: *mut c_void, what: &str) -> Result<&'a T> {
    // SAFETY: forwarded contract; `checked_in` proved it a live `T`; only shared access.
    unsafe { checked_in::<T>(live, p, what).map(|p| &*p) }
}

/// Takes back ownership of an object to free it, after the same checks as [`object`]; from then on
/// the pointer is not live (a second close or test of it is an error).
///
/// # Safety
/// As for [`object`]; in addition no other call uses `p` during this one.
pub unsafe fn take<T: Object>(p: *mut c_void, what: &str) -> Result<Box<T>> {
    // SAFETY: forwarded contract.
    let p: *mut T = unsafe { checked::<T>(p, what)? };
    if write(&LIVE, "live objects")?.remove(&(p as usize)) != Some(T::MAGIC) {
        // Another thread took it between the check and here: the caller's race, refused all the same.
        return Err(not_live::<T>(p, what));
    }
    // SAFETY: filed by `give`, which made it with Box::into_raw, and unfiled just now by this call
    // alone, so nothing else takes it again.
    Ok(unsafe { Box::from_raw(p) })
}

/// A C array of `n` elements (`n` = 0 allows NULL).
///
/// # Safety
/// `p` is NULL or valid for reads of `n` elements for `'a`.
pub unsafe fn array<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() || !p.is_aligned() {
        return Err(Error::InvalidArgument(format!(
            "{what} is NULL or misaligned but {n} elements were announced"
        )));
    }
    // SAFETY: non-NULL, aligned, and valid for `n` reads by contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}
