//! The panic guard every entry point runs in, the error-code mapping, and checked pointer conversions.

use std::any::Any;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::abi::ncclResult_t;
use crate::error::{Error, Result, ResultCode};
use crate::plugin::Object;

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

/// `p` as a `T` of ours: non-NULL, aligned, and carrying `T`'s magic. Returns the pointer; the callers
/// decide which reference to make of it.
///
/// # Safety
/// `p` is NULL or a pointer this library returned for some object, not yet freed, and not written
/// concurrently.
unsafe fn checked<T: Object>(p: *mut c_void, what: &str) -> Result<*mut T> {
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
    // SAFETY: non-NULL, aligned, and by the caller's contract a live object of ours; the shared
    // reference ends here, and the magic check rejects pointers of another kind.
    if !unsafe { &*p }.is_valid() {
        return Err(Error::InvalidArgument(format!(
            "{what} ({p:p}) is not a live {}",
            T::WHAT
        )));
    }
    Ok(p)
}

/// A `void*` NCCL got from this plugin (a comm, mhandle, request or ctx), checked for NULL, alignment and
/// magic.
///
/// # Safety
/// `p` is NULL or a pointer this library returned for some object, not yet freed, and not used concurrently
/// (NCCL serializes calls on one object).
pub unsafe fn object<'a, T: Object>(p: *mut c_void, what: &str) -> Result<&'a mut T> {
    // SAFETY: forwarded contract; `checked` proved it a live `T`, and NCCL uses it from one thread at
    // a time, so this is the only reference.
    unsafe { checked::<T>(p, what).map(|p| &mut *p) }
}

/// A shared reference to an object several NCCL threads may use at once (a ctx: service and progress
/// threads; an mhandle), after the same checks as [`object`].
///
/// # Safety
/// `p` is NULL or a pointer this library returned for some object, not yet freed.
pub unsafe fn shared<'a, T: Object>(p: *mut c_void, what: &str) -> Result<&'a T> {
    // SAFETY: forwarded contract; `checked` proved it a live `T`; only shared access.
    unsafe { checked::<T>(p, what).map(|p| &*p) }
}

/// Takes back ownership of an object to free it, after the same checks as [`object`].
///
/// # Safety
/// As for [`object`]; in addition `p` came from `Box::into_raw` and NCCL will not use it again.
pub unsafe fn take<T: Object>(p: *mut c_void, what: &str) -> Result<Box<T>> {
    // SAFETY: forwarded contract.
    let r: &mut T = unsafe { object(p, what)? };
    // SAFETY: the object was produced by Box::into_raw (contract) and is not referenced elsewhere.
    Ok(unsafe { Box::from_raw(r as *mut T) })
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
