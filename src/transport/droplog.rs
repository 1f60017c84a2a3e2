//! Rate-limited warnings for connections the listeners drop, one limit per process: a scanner or a
//! flood through every listener of a rank (handshake listeners, TCP set-up and failback listeners,
//! which grow with connections) must not fill its log. At most [`LINES_PER_INTERVAL`] WARN lines
//! per [`INTERVAL`] over the whole process, and one per source address within that; the rest are
//! counted, and the next line that is logged says how many were not. Sans-IO: the caller passes
//! `now`; [`note`] is the process's log, [`DropLog`] one a test can own.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The interval of the limits.
pub const INTERVAL: Duration = Duration::from_secs(10);
/// WARN lines per [`INTERVAL`] over every listener of the process.
pub const LINES_PER_INTERVAL: u32 = 10;
/// Sources remembered one by one (one line per source per [`INTERVAL`]); past it, the sources not
/// seen for an interval are forgotten, and if none is, new ones share one entry.
pub const MAX_SOURCES: usize = 64;

/// A drop log: the process's ([`note`]) or a test's own.
#[derive(Debug, Default)]
pub struct DropLog {
    /// When each source last had a line.
    sources: HashMap<IpAddr, Instant>,
    /// The entry sources beyond [`MAX_SOURCES`] share.
    others: Option<Instant>,
    /// When the current interval began, and the lines logged in it.
    window: Option<(Instant, u32)>,
    /// Drops not logged since the last logged line.
    unlogged: u64,
    /// Drops noted, ever.
    noted: u64,
}

impl DropLog {
    /// A drop from `src` at `now`: the line to log at WARN (`what()`, plus how many drops were not
    /// logged since the last line), or `None` when this one is only counted (`what` is then not
    /// called: a flood costs no formatting).
    pub fn note(
        &mut self,
        now: Instant,
        src: IpAddr,
        what: impl FnOnce() -> String,
    ) -> Option<String> {
        self.noted = self.noted.saturating_add(1);
        let recent = |t: Instant| now.saturating_duration_since(t) < INTERVAL;
        if !self.sources.contains_key(&src) && self.sources.len() >= MAX_SOURCES {
            self.sources.retain(|_, t| recent(*t));
        }
        let known = self.sources.contains_key(&src) || self.sources.len() < MAX_SOURCES;
        let last = if known {
            self.sources.get(&src).copied()
        } else {
            self.others
        };
        let window = match self.window {
            Some((start, lines)) if recent(start) => (start, lines),
            _ => (now, 0),
        };
        if last.is_some_and(recent) || window.1 >= LINES_PER_INTERVAL {
            self.unlogged = self.unlogged.saturating_add(1);
            return None;
        }
        self.window = Some((window.0, window.1 + 1));
        if known {
            self.sources.insert(src, now);
        } else {
            self.others = Some(now);
        }
        let n = std::mem::take(&mut self.unlogged);
        Some(with_count(what(), n))
    }

    /// Drops counted but not logged since the last logged line.
    pub fn suppressed(&self) -> u64 {
        self.unlogged
    }

    /// Drops noted, ever.
    pub fn noted(&self) -> u64 {
        self.noted
    }
}

fn with_count(what: String, n: u64) -> String {
    if n == 0 {
        what
    } else {
        format!(
            "{what} (and {n} more dropped connections not logged since the last such line; at most \
             {LINES_PER_INTERVAL} such lines per {} s per process, one per source)",
            INTERVAL.as_secs()
        )
    }
}

/// The process's drop log, shared by every listener.
pub fn shared() -> Arc<Mutex<DropLog>> {
    static LOG: OnceLock<Arc<Mutex<DropLog>>> = OnceLock::new();
    Arc::clone(LOG.get_or_init(Arc::default))
}

/// Notes a drop in `log`; see [`DropLog::note`]. A poisoned lock (a panic while it was held, which
/// nothing in it does) is taken over: the log is only counts.
pub fn note_in(
    log: &Mutex<DropLog>,
    now: Instant,
    src: IpAddr,
    what: impl FnOnce() -> String,
) -> Option<String> {
    let mut g = log
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    g.note(now, src, what)
}

/// Notes a drop in the process's log ([`shared`]); see [`DropLog::note`].
pub fn note(now: Instant, src: IpAddr, what: impl FnOnce() -> String) -> Option<String> {
    note_in(&shared(), now, src, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(i: u32) -> IpAddr {
        IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i))
    }

    #[test]
    fn one_line_per_source_per_interval_with_the_count_in_the_next_line() {
        let mut d = DropLog::default();
        let t = Instant::now();
        let (a, b) = (ip(1), ip(2));
        assert_eq!(d.note(t, a, || "x".into()).as_deref(), Some("x"));
        for i in 0..999 {
            let called = std::cell::Cell::new(false);
            let line = d.note(t + Duration::from_millis(i), a, || {
                called.set(true);
                "x".into()
            });
            assert_eq!(line, None);
            assert!(!called.get(), "a suppressed line is not formatted");
        }
        // Another source gets its line, which counts what was not logged before it.
        let line = d.note(t, b, || "y".into()).unwrap();
        assert!(line.starts_with("y (and 999 more"), "{line}");
        assert_eq!(d.suppressed(), 0);
        assert_eq!(d.note(t + INTERVAL, a, || "x".into()).as_deref(), Some("x"));
        assert_eq!(d.noted(), 1002);
    }

    #[test]
    fn the_process_gets_at_most_its_lines_per_interval_whatever_the_sources() {
        let mut d = DropLog::default();
        let t = Instant::now();
        let sources = if cfg!(miri) { 200 } else { 10_000u32 };
        let logged = (0..sources)
            .filter(|&i| d.note(t, ip(i), || "x".into()).is_some())
            .count();
        assert_eq!(logged, LINES_PER_INTERVAL as usize);
        assert_eq!(d.suppressed(), u64::from(sources - LINES_PER_INTERVAL));
        assert!(d.sources.len() <= MAX_SOURCES);
        // The next interval: the next line says how many were not logged.
        let line = d.note(t + INTERVAL, ip(5_000_000), || "z".into()).unwrap();
        assert!(
            line.contains(&format!("and {} more", sources - LINES_PER_INTERVAL)),
            "{line}"
        );
        // Sources beyond the table are remembered again once the old ones are an interval old.
        let later = t + INTERVAL * 3;
        assert!(d.note(later, ip(7_000_000), || "w".into()).is_some());
        assert!(d.sources.contains_key(&ip(7_000_000)));
    }
}
