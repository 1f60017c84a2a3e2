//! Bridge from `tracing` to NCCL's C-variadic logger (`ncclDebugLogger_t`).
//!
//! * One global subscriber ([`Bridge`]) is installed once per loaded copy of the library. It reads the
//!   logger from an atomic slot that every `init` overwrites, so a reload (dlclose → dlopen: fresh statics)
//!   or a later init with another logger pointer both work; the subscriber itself never needs replacing.
//! * Every call uses the fixed format `"%s"` and one preformatted C string: `%` in a message (an IPv6 zone
//!   `fe80::1%eth0`, `100%`) is never interpreted, and an interior NUL is escaped as `\0`, never dropped or
//!   truncating.
//! * Levels: ERROR/WARN → `NCCL_LOG_WARN` with flags `NCCL_ALL`; INFO → `NCCL_LOG_INFO` with `NCCL_NET`, or
//!   `NCCL_INIT | NCCL_NET` for events with target [`TARGET_INIT`], `NCCL_ENV | NCCL_NET` for [`TARGET_ENV`],
//!   `NCCL_INIT | NCCL_TUNING` for the tuner's [`TARGET_TUNING`];
//!   DEBUG/TRACE → `NCCL_LOG_TRACE` with `NCCL_NET`.
//! * With no logger set (before init, or in the CLI) events at or above the stderr level (default WARN) go
//!   to stderr.
//! * Events below the level `NCCL_DEBUG` asks for (read at each init; WARN is always forwarded) are not
//!   formatted at all.

use std::ffi::{CString, c_int, c_ulong};
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::Once;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::span;
use tracing::{Event, Level, Metadata, Subscriber};

use super::abi;

pub use crate::plugin::{TARGET_ENV, TARGET_INIT};
pub use crate::tuner::TARGET_TUNING;

/// The C-variadic logger function NCCL passes to `init`.
pub type LoggerFn = unsafe extern "C" fn(
    abi::ncclDebugLogLevel,
    c_ulong,
    *const std::ffi::c_char,
    c_int,
    *const std::ffi::c_char,
    ...
);

/// NCCL's "every subsystem" flag mask.
pub const FLAGS_ALL: c_ulong = !0;

/// Where the bridge sends events: a logger function pointer, or nothing (stderr).
#[derive(Debug)]
pub struct LoggerSlot {
    func: AtomicPtr<()>,
    /// Most verbose level forwarded (see `level_rank`).
    max: AtomicU8,
    /// Most verbose level printed to stderr while no logger is set.
    stderr_max: AtomicU8,
}

// Ranks: higher = more verbose.
const RANK_WARN: u8 = 1;
const RANK_INFO: u8 = 2;
const RANK_TRACE: u8 = 3;

fn level_rank(level: &Level) -> u8 {
    match *level {
        Level::ERROR | Level::WARN => RANK_WARN,
        Level::INFO => RANK_INFO,
        Level::DEBUG | Level::TRACE => RANK_TRACE,
    }
}

impl LoggerSlot {
    /// An empty slot (stderr at WARN).
    pub const fn new() -> LoggerSlot {
        LoggerSlot {
            func: AtomicPtr::new(std::ptr::null_mut()),
            max: AtomicU8::new(RANK_WARN),
            stderr_max: AtomicU8::new(RANK_WARN),
        }
    }

    /// Sends events to `logger` from now on (`None`: back to stderr), forwarding levels up to what
    /// `nccl_debug` (the value of `NCCL_DEBUG`) asks for.
    pub fn set(&self, logger: Option<LoggerFn>, nccl_debug: Option<&str>) {
        let rank = match nccl_debug.map(str::to_ascii_uppercase).as_deref() {
            Some("TRACE") => RANK_TRACE,
            Some("INFO") => RANK_INFO,
            _ => RANK_WARN,
        };
        self.max.store(rank, Ordering::Relaxed);
        let p = logger.map_or(std::ptr::null_mut(), |f| f as *mut ());
        self.func.store(p, Ordering::Release);
    }

    /// Sets the most verbose level printed to stderr while no logger is set.
    pub fn set_stderr_level(&self, level: Level) {
        self.stderr_max.store(level_rank(&level), Ordering::Relaxed);
    }

    fn logger(&self) -> Option<LoggerFn> {
        let p = self.func.load(Ordering::Acquire);
        if p.is_null() {
            None
        } else {
            // SAFETY: the only non-NULL values stored are `LoggerFn` pointers cast to `*mut ()` (in `set`);
            // function and data pointers have the same size on every target this library builds for.
            Some(unsafe { std::mem::transmute::<*mut (), LoggerFn>(p) })
        }
    }

    fn enabled(&self, level: &Level) -> bool {
        let rank = level_rank(level);
        if self.func.load(Ordering::Relaxed).is_null() {
            rank <= self.stderr_max.load(Ordering::Relaxed)
        } else {
            rank <= self.max.load(Ordering::Relaxed)
        }
    }
}

impl Default for LoggerSlot {
    fn default() -> Self {
        LoggerSlot::new()
    }
}

/// The process-wide slot the exported entry points use.
pub static SLOT: LoggerSlot = LoggerSlot::new();

/// Installs the bridge as the global `tracing` subscriber once, and points it at `logger` (every init calls
/// this; the latest logger wins).
pub fn install(logger: Option<LoggerFn>) {
    let nccl_debug = std::env::var("NCCL_DEBUG").ok();
    SLOT.set(logger, nccl_debug.as_deref());
    install_global();
}

/// Installs the bridge with no logger: events go to stderr at `level` and above (for the CLI).
pub fn install_stderr(level: Level) {
    SLOT.set_stderr_level(level);
    install_global();
}

fn install_global() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Err = another subscriber was set first by the host program (only possible when linked as an rlib);
        // keep that one.
        let _ = tracing::subscriber::set_global_default(Bridge::new(&SLOT));
    });
}

/// The `tracing` subscriber that forwards to a [`LoggerSlot`].
#[derive(Debug)]
pub struct Bridge {
    slot: &'static LoggerSlot,
    next_span: AtomicU64,
}

impl Bridge {
    /// A subscriber reading `slot`.
    pub fn new(slot: &'static LoggerSlot) -> Bridge {
        Bridge {
            slot,
            next_span: AtomicU64::new(1),
        }
    }
}

/// Collects the event's `message` first, then ` key=value` for the other fields.
#[derive(Default)]
struct Text {
    message: String,
    fields: String,
}

impl Visit for Text {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={}", field.name(), value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={:?}", field.name(), value);
        }
    }
}

/// A C string with every interior NUL escaped as the two characters `\0`.
pub fn c_text(s: &str) -> CString {
    let bytes: Vec<u8> = if s.contains('\0') {
        s.replace('\0', "\\0").into_bytes()
    } else {
        s.as_bytes().to_vec()
    };
    // No NUL is left, so this cannot fail; fall back to an empty string rather than panic.
    CString::new(bytes).unwrap_or_default()
}

/// NCCL level and subsystem flags for an event.
pub fn nccl_level(meta: &Metadata<'_>) -> (abi::ncclDebugLogLevel, c_ulong) {
    let net = c_ulong::from(abi::NCCL_NET);
    match *meta.level() {
        Level::ERROR | Level::WARN => (abi::ncclDebugLogLevel::NCCL_LOG_WARN, FLAGS_ALL),
        Level::INFO => {
            let flags = match meta.target() {
                TARGET_INIT => c_ulong::from(abi::NCCL_INIT) | net,
                TARGET_ENV => c_ulong::from(abi::NCCL_ENV) | net,
                // The tuner's lines: NCCL_DEBUG_SUBSYS=TUNING (or INIT) shows them, NET does not.
                TARGET_TUNING => c_ulong::from(abi::NCCL_INIT) | c_ulong::from(abi::NCCL_TUNING),
                _ => net,
            };
            (abi::ncclDebugLogLevel::NCCL_LOG_INFO, flags)
        }
        Level::DEBUG | Level::TRACE => (abi::ncclDebugLogLevel::NCCL_LOG_TRACE, net),
    }
}

impl Subscriber for Bridge {
    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        self.slot.enabled(meta.level())
    }

    fn register_callsite(&self, _: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        // The level can change at every init: ask `enabled` each time (one relaxed load).
        tracing::subscriber::Interest::sometimes()
    }

    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(self.next_span.fetch_add(1, Ordering::Relaxed).max(1))
    }

    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}

    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}

    fn enter(&self, _: &span::Id) {}

    fn exit(&self, _: &span::Id) {}

    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        let mut text = Text::default();
        event.record(&mut text);
        text.message.push_str(&text.fields);
        let file = meta.file().unwrap_or("switchless");
        let line = meta
            .line()
            .map_or(0, |l| c_int::try_from(l).unwrap_or(c_int::MAX));
        match self.slot.logger() {
            Some(log) => {
                let (level, flags) = nccl_level(meta);
                let msg = c_text(&text.message);
                let file = c_text(file);
                // SAFETY: `log` is the logger NCCL (or a test) passed to init, a C-variadic function taking
                // (level, flags, file, line, fmt, ...). The format is the literal "%s" and exactly one
                // argument follows: a NUL-terminated string that lives until the call returns.
                unsafe {
                    log(
                        level,
                        flags,
                        file.as_ptr(),
                        line,
                        c"%s".as_ptr(),
                        msg.as_ptr(),
                    )
                };
            }
            None => {
                let _ = writeln!(
                    std::io::stderr().lock(),
                    "switchless {} {file}:{line} {}",
                    meta.level(),
                    text.message
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::testsupport;

    fn with_logger<R>(f: impl FnOnce() -> R) -> (R, Vec<testsupport::LogLine>) {
        static TEST_SLOT: LoggerSlot = LoggerSlot::new();
        TEST_SLOT.set(Some(testsupport::c_logger()), Some("TRACE"));
        testsupport::take_log();
        let r = tracing::subscriber::with_default(Bridge::new(&TEST_SLOT), f);
        (r, testsupport::take_log())
    }

    #[test]
    fn hostile_text_arrives_literally_at_the_c_logger() {
        let zone = "fe80::1%eth0 100%s %n %d%%";
        let ((), lines) = with_logger(|| tracing::warn!("route {zone} a\0b end"));
        assert_eq!(lines.len(), 1, "{lines:?}");
        let l = &lines[0];
        assert_eq!(l.level, 2);
        assert_eq!(l.flags, !0u64);
        assert!(l.file.ends_with("log.rs"), "{}", l.file);
        assert!(l.line > 0);
        assert_eq!(l.text, "route fe80::1%eth0 100%s %n %d%% a\\0b end");
    }

    #[test]
    fn levels_and_subsystems() {
        let ((), lines) = with_logger(|| {
            tracing::error!("e");
            tracing::info!("i");
            tracing::info!(target: TARGET_INIT, dev = 3, "init");
            tracing::info!(target: TARGET_ENV, "env");
            tracing::info!(target: TARGET_TUNING, "tuning");
            tracing::debug!("d");
            tracing::trace!(x = "y\0", "t");
        });
        let got: Vec<(i32, u64, &str)> = lines
            .iter()
            .map(|l| (l.level, l.flags, l.text.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (2, !0, "e"),
                (3, 0x10, "i"),
                (3, 0x11, "init dev=3"),
                (3, 0x90, "env"),
                (3, 0x41, "tuning"),
                (5, 0x10, "d"),
                (5, 0x10, "t x=y\\0"),
            ]
        );
    }

    #[test]
    fn nccl_debug_level_filters_before_formatting() {
        static SLOT_W: LoggerSlot = LoggerSlot::new();
        SLOT_W.set(Some(testsupport::c_logger()), None);
        testsupport::take_log();
        struct Loud;
        impl std::fmt::Display for Loud {
            fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                panic!("a filtered event was formatted")
            }
        }
        tracing::subscriber::with_default(Bridge::new(&SLOT_W), || {
            tracing::info!("{}", Loud);
            tracing::trace!("{}", Loud);
            tracing::warn!("kept");
        });
        let lines = testsupport::take_log();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0].text, "kept");
        SLOT_W.set(Some(testsupport::c_logger()), Some("info"));
        tracing::subscriber::with_default(Bridge::new(&SLOT_W), || tracing::info!("now"));
        assert_eq!(testsupport::take_log().len(), 1);
    }

    #[test]
    fn a_new_logger_replaces_the_old_one_and_none_means_stderr() {
        static SLOT_R: LoggerSlot = LoggerSlot::new();
        SLOT_R.set(Some(testsupport::c_logger()), None);
        testsupport::take_log();
        tracing::subscriber::with_default(Bridge::new(&SLOT_R), || tracing::warn!("one"));
        assert_eq!(testsupport::take_log().len(), 1);
        SLOT_R.set(None, None);
        tracing::subscriber::with_default(Bridge::new(&SLOT_R), || tracing::warn!("to stderr"));
        assert_eq!(testsupport::take_log().len(), 0);
        assert!(SLOT_R.enabled(&Level::WARN));
        assert!(!SLOT_R.enabled(&Level::INFO));
    }

    #[test]
    fn c_text_escapes_nul() {
        assert_eq!(c_text("a\0b\0").as_bytes(), b"a\\0b\\0");
        assert_eq!(c_text("plain %s").as_bytes(), b"plain %s");
        assert_eq!(FLAGS_ALL, abi::NCCL_ALL as c_ulong);
    }
}
