//! Turning verbs return conventions (an rc, or NULL plus `errno`) into [`Error::System`] with the
//! call's name, the errno and its text, and a remedy for the errnos users actually hit.

use crate::error::Error;
use std::fmt::Display;
use std::ptr::NonNull;

/// The calling thread's `errno`, read right after a failed call.
pub(crate) fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The errno a verbs rc stands for. libibverbs returns 0 on success and, on failure, either a
/// positive errno (most calls), `-1` with `errno` set (`ibv_post_*` on some providers, legacy paths)
/// or a negative errno (a few providers). `last` is `errno` read right after the call.
pub(crate) fn rc_errno(rc: i32, last: i32) -> i32 {
    match rc {
        r if r > 0 => r,
        -1 => last,
        r => r.saturating_neg(),
    }
}

/// A remedy for errnos that have a well-known cause in RoCE set-ups, or "".
fn hint(call: &str, errno: i32) -> &'static str {
    match (call, errno) {
        (c, libc::ENOMEM)
            if c.contains("reg_mr") || c.contains("create_cq") || c.contains("create_qp") =>
        {
            "; the locked-memory limit is often too low: check `ulimit -l` (should be unlimited) and \
             the container's memlock setting"
        }
        (c, libc::ETIMEDOUT) if c.contains("modify_qp") => {
            "; the destination GID is not reachable from this port (wrong local port or GID for the \
             peer's subnet, or the link is down)"
        }
        (c, libc::EINVAL) if c.contains("modify_qp") => {
            "; an attribute is outside what the device supports (path MTU above the port's active MTU, \
             GID index not in the table, or a bad state transition)"
        }
        (c, libc::EPERM | libc::EACCES) if c.contains("open_device") || c.contains("alloc_pd") => {
            "; no permission on /dev/infiniband/uverbs*"
        }
        _ => "",
    }
}

/// The error for `call` failing with `errno`.
pub fn system_error(call: impl Display, errno: i32) -> Error {
    let text = if errno == 0 {
        "no errno was set".to_string()
    } else {
        // `io::Error`'s text ends with " (os error N)"; keep only the description.
        let full = std::io::Error::from_raw_os_error(errno).to_string();
        match full.rfind(" (os error") {
            Some(i) => full[..i].to_string(),
            None => full,
        }
    };
    let call = call.to_string();
    let hint = hint(&call, errno);
    Error::System(format!("{call} failed: errno {errno} ({text}){hint}"))
}

/// `Ok(())` for rc 0, otherwise the error for `call` (reads `errno` for rc -1, so call this right
/// after the verbs call).
pub(crate) fn check_rc(call: impl Display, rc: i32) -> Result<(), Error> {
    if rc == 0 {
        Ok(())
    } else {
        let last = last_errno();
        Err(system_error(call, rc_errno(rc, last)))
    }
}

/// The non-NULL pointer, or the error for `call` with `errno` (call right after the verbs call).
pub(crate) fn check_ptr<T>(call: impl Display, p: *mut T) -> Result<NonNull<T>, Error> {
    NonNull::new(p).ok_or_else(|| system_error(call, last_errno()))
}

/// Calls a verbs function and converts its result:
///
/// * `verbs_call!(rc v.modify_qp(qp, &mut attr, mask), "RTR on {dev}")` → `Result<()>`,
/// * `verbs_call!(ptr v.alloc_pd(ctx), "on {dev}")` → `Result<NonNull<ibv_pd>>`,
///
/// where `v` is the loaded library (`sym::verbs()`) and the call's name is `ibv_<field>`; a plain
/// function (`verbs_call!(rc f(args))`) is named `f`. The error text is `<function>(<context>)
/// failed: errno N (text)`. Must be used inside an `unsafe` block whose `SAFETY:` comment justifies
/// the call.
macro_rules! verbs_call {
    (rc $v:ident . $f:ident ( $($arg:expr),* $(,)? ), $($ctx:tt)+) => {{
        let rc = ($v.$f)($($arg),*);
        $crate::verbs::call::check_rc(
            $crate::verbs::call::call_name(concat!("ibv_", stringify!($f)), format_args!($($ctx)+)),
            rc,
        )
    }};
    (ptr $v:ident . $f:ident ( $($arg:expr),* $(,)? ), $($ctx:tt)+) => {{
        let p = ($v.$f)($($arg),*);
        $crate::verbs::call::check_ptr(
            $crate::verbs::call::call_name(concat!("ibv_", stringify!($f)), format_args!($($ctx)+)),
            p,
        )
    }};
    (rc $f:ident ( $($arg:expr),* $(,)? )) => {
        $crate::verbs::call::verbs_call!(rc $f($($arg),*), "")
    };
    (rc $f:ident ( $($arg:expr),* $(,)? ), $($ctx:tt)+) => {{
        let rc = $f($($arg),*);
        $crate::verbs::call::check_rc(
            $crate::verbs::call::call_name(stringify!($f), format_args!($($ctx)+)),
            rc,
        )
    }};
    (ptr $f:ident ( $($arg:expr),* $(,)? )) => {
        $crate::verbs::call::verbs_call!(ptr $f($($arg),*), "")
    };
    (ptr $f:ident ( $($arg:expr),* $(,)? ), $($ctx:tt)+) => {{
        let p = $f($($arg),*);
        $crate::verbs::call::check_ptr(
            $crate::verbs::call::call_name(stringify!($f), format_args!($($ctx)+)),
            p,
        )
    }};
}
pub(crate) use verbs_call;

/// `name(context)`, or `name` when the context is empty.
pub(crate) fn call_name(name: &str, ctx: std::fmt::Arguments<'_>) -> String {
    let ctx = ctx.to_string();
    if ctx.is_empty() {
        name.to_string()
    } else {
        format!("{name}({ctx})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rc_conventions() {
        assert_eq!(rc_errno(110, 0), 110);
        assert_eq!(rc_errno(-1, 12), 12);
        assert_eq!(rc_errno(-22, 0), 22);
        assert_eq!(rc_errno(i32::MIN, 0), i32::MAX);
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri's strerror_r shim words errno texts unlike glibc")]
    fn errors_name_call_errno_and_text() {
        let e = system_error("ibv_modify_qp(RTR on rxe0 port 1)", libc::ETIMEDOUT);
        let m = e.to_string();
        assert!(matches!(e, Error::System(_)));
        assert!(
            m.contains(
                "ibv_modify_qp(RTR on rxe0 port 1) failed: errno 110 (Connection timed out)"
            ),
            "{m}"
        );
        assert!(m.contains("not reachable"), "{m}");
        assert!(!m.contains("os error"), "{m}");
        let m = system_error("ibv_reg_mr", libc::ENOMEM).to_string();
        assert!(m.contains("errno 12") && m.contains("ulimit -l"), "{m}");
        let m = system_error("ibv_alloc_pd", 0).to_string();
        assert!(m.contains("no errno was set"), "{m}");
        let m = system_error("ibv_poll_cq", libc::EAGAIN).to_string();
        assert!(m.ends_with("(Resource temporarily unavailable)"), "{m}");
    }

    #[test]
    fn check_helpers() {
        assert!(check_rc("x", 0).is_ok());
        let m = check_rc("ibv_destroy_qp", libc::EBUSY)
            .unwrap_err()
            .to_string();
        assert!(m.contains("errno 16"), "{m}");
        assert!(check_ptr("ibv_alloc_pd", std::ptr::null_mut::<u8>()).is_err());
        let mut v = 5u8;
        assert!(check_ptr("x", &mut v as *mut u8).is_ok());
    }

    fn fake_ok(a: i32, b: i32) -> i32 {
        a - b
    }

    fn fake_null(_: i32) -> *mut u8 {
        std::ptr::null_mut()
    }

    #[test]
    fn macro_names_the_call_and_context() {
        let dev = "rxe0";
        assert!(verbs_call!(rc fake_ok(3, 3)).is_ok());
        let m = verbs_call!(rc fake_ok(3 + 110, 3), "RTR on {dev} port {}", 1)
            .unwrap_err()
            .to_string();
        assert!(
            m.starts_with("system error: fake_ok(RTR on rxe0 port 1) failed: errno 110"),
            "{m}"
        );
        let m = verbs_call!(ptr fake_null(1)).unwrap_err().to_string();
        assert!(m.contains("fake_null failed"), "{m}");
    }
}
