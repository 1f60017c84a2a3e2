//! Safe access to the C test helpers compiled by build.rs (`tests/c/`): a real C-variadic logger and the C
//! compiler's layout table. For tests (unit and integration); nothing in the exported plugin uses it, so the
//! helpers are not linked into the cdylib.
#![doc(hidden)]

use std::ffi::{CStr, c_char};

use super::abi;
use super::log::LoggerFn;

#[repr(C)]
struct RawRow {
    ty: *const c_char,
    field: *const c_char,
    size: usize,
    align: usize,
    offset: usize,
}

// Under Miri only the layout helpers are declared uses (they are not run: Miri cannot call C).
#[cfg_attr(miri, allow(dead_code))]
unsafe extern "C" {
    fn swl_test_logger(
        level: abi::ncclDebugLogLevel,
        flags: std::ffi::c_ulong,
        file: *const c_char,
        line: std::ffi::c_int,
        fmt: *const c_char,
        ...
    );
    fn swl_test_log_take(out: *mut c_char, cap: usize) -> usize;
    fn swl_shared_logger(
        level: abi::ncclDebugLogLevel,
        flags: std::ffi::c_ulong,
        file: *const c_char,
        line: std::ffi::c_int,
        fmt: *const c_char,
        ...
    );
    fn swl_shared_log_pending() -> usize;
    fn swl_shared_log_take(out: *mut c_char, cap: usize, dropped: *mut usize) -> usize;
    fn swl_layout_count() -> usize;
    fn swl_layout_rows() -> *const RawRow;
}

/// The C logger (captures per thread). Under Miri, which cannot call C, a Rust C-variadic logger
/// that captures the same way (the bridge's format is always `"%s"` and one string).
pub fn c_logger() -> LoggerFn {
    #[cfg(not(miri))]
    return swl_test_logger;
    #[cfg(miri)]
    return miri_log::logger;
}

/// The C logger with one process-wide buffer: lines from every thread (`switchless bench` hands
/// it to the plugin, whose TCP I/O threads log too). Under Miri, the per-thread one.
pub fn shared_logger() -> LoggerFn {
    #[cfg(not(miri))]
    return swl_shared_logger;
    #[cfg(miri)]
    return miri_log::logger;
}

/// Takes (and clears) the lines [`shared_logger`] captured on any thread, in order, and how many
/// it had to drop since the last take (its 1 MiB buffer was full).
pub fn take_shared_log() -> (Vec<LogLine>, u64) {
    #[cfg(miri)]
    return (take_log(), 0);
    #[cfg(not(miri))]
    {
        // SAFETY: the helper only reads its locked length.
        if unsafe { swl_shared_log_pending() } == 0 {
            return (Vec::new(), 0);
        }
        let mut buf = vec![0u8; 1 << 20];
        let mut dropped = 0usize;
        // SAFETY: `buf` is writable for `buf.len()` bytes and `dropped` is a valid out pointer; the
        // helper copies at most `buf.len()` bytes.
        let n = unsafe { swl_shared_log_take(buf.as_mut_ptr().cast(), buf.len(), &mut dropped) };
        buf.truncate(n.min(1 << 20));
        (parse_lines(&buf), dropped as u64)
    }
}

#[cfg(miri)]
mod miri_log {
    use std::cell::RefCell;
    use std::ffi::{CStr, c_char, c_int, c_ulong};

    use super::{LogLine, abi};

    thread_local! {
        pub(super) static LINES: RefCell<Vec<LogLine>> = const { RefCell::new(Vec::new()) };
    }

    fn text(p: *const c_char) -> String {
        if p.is_null() {
            return "(null)".into();
        }
        // SAFETY: the bridge passes NUL-terminated strings that live for the call.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// `ncclDebugLogger_t`: records the line; a `"%s"` format takes its one string argument.
    pub(super) unsafe extern "C" fn logger(
        level: abi::ncclDebugLogLevel,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        mut args: ...
    ) {
        let fmt = text(fmt);
        let body = if fmt == "%s" {
            // SAFETY: a "%s" format is followed by one `const char*` (the bridge's only call).
            text(unsafe { args.next_arg::<*const c_char>() })
        } else {
            fmt
        };
        LINES.with(|l| {
            l.borrow_mut().push(LogLine {
                level: level.0 as i32,
                flags: flags as u64,
                file: text(file),
                line,
                text: body,
            })
        });
    }
}

/// One captured logger call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// `ncclDebugLogLevel` value.
    pub level: i32,
    /// Subsystem flags.
    pub flags: u64,
    /// `file` argument.
    pub file: String,
    /// `line` argument.
    pub line: i32,
    /// The text `vsnprintf(fmt, args)` produced.
    pub text: String,
}

/// Takes (and clears) the lines the C logger captured on this thread.
pub fn take_log() -> Vec<LogLine> {
    #[cfg(miri)]
    return miri_log::LINES.with(|l| std::mem::take(&mut *l.borrow_mut()));
    #[cfg(not(miri))]
    take_c_log()
}

#[cfg(not(miri))]
fn take_c_log() -> Vec<LogLine> {
    let mut buf = vec![0u8; 65536];
    // SAFETY: `buf` is writable for `buf.len()` bytes; the helper copies at most that many.
    let n = unsafe { swl_test_log_take(buf.as_mut_ptr().cast(), buf.len()) };
    buf.truncate(n.min(65536));
    parse_lines(&buf)
}

/// The logger's "level|flags|file|line|text" lines.
#[cfg(not(miri))]
fn parse_lines(buf: &[u8]) -> Vec<LogLine> {
    String::from_utf8_lossy(buf)
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(5, '|');
            Some(LogLine {
                level: it.next()?.parse().ok()?,
                flags: u64::from_str_radix(it.next()?, 16).ok()?,
                file: it.next()?.to_owned(),
                line: it.next()?.parse().ok()?,
                text: it.next()?.to_owned(),
            })
        })
        .collect()
}

/// One row of a layout table: a struct (`field` empty) or one of its fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutRow {
    /// Struct name.
    pub ty: &'static str,
    /// Field name, or "" for the struct itself.
    pub field: &'static str,
    /// Size in bytes.
    pub size: usize,
    /// Alignment in bytes.
    pub align: usize,
    /// Offset in bytes (0 for the struct row).
    pub offset: usize,
}

/// The layout as the C compiler computed it.
pub fn c_layout() -> Vec<(String, String, usize, usize, usize)> {
    // SAFETY: the helper returns a static array of `swl_layout_count()` rows whose strings are literals.
    let rows = unsafe { std::slice::from_raw_parts(swl_layout_rows(), swl_layout_count()) };
    rows.iter()
        .map(|r| {
            // SAFETY: both pointers are C string literals from the static table.
            let (ty, field) = unsafe { (CStr::from_ptr(r.ty), CStr::from_ptr(r.field)) };
            (
                ty.to_string_lossy().into_owned(),
                field.to_string_lossy().into_owned(),
                r.size,
                r.align,
                r.offset,
            )
        })
        .collect()
}

fn field_size<T, F>(_: fn(&T) -> &F) -> usize {
    std::mem::size_of::<F>()
}

fn field_align<T, F>(_: fn(&T) -> &F) -> usize {
    std::mem::align_of::<F>()
}

/// The layout as Rust (bindgen's types) computes it, for the same list of structs and fields.
pub fn rust_layout() -> Vec<LayoutRow> {
    include!(concat!(env!("OUT_DIR"), "/layout_fields.rs"))
}
