//! Rate-limited warnings for connections a listener drops: a scanner or a flood must not fill a
//! rank's log. The first drop from a source in an interval is a WARN; the rest of that interval are
//! counted, and the next WARN for that source says how many were not logged. Sources beyond
//! [`MAX_SOURCES`] share one entry. Sans-IO: the caller passes `now`.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// One WARN per source per interval.
pub const INTERVAL: Duration = Duration::from_secs(10);
/// Sources tracked one by one; more fall into one shared entry (so the map stays small).
pub const MAX_SOURCES: usize = 64;

#[derive(Debug, Clone, Copy)]
struct Entry {
    last: Instant,
    suppressed: u64,
}

/// The drop log of one listener.
#[derive(Debug, Default)]
pub struct DropLog {
    by_source: HashMap<Option<IpAddr>, Entry>,
}

impl DropLog {
    /// A drop from `src` at `now`: the line to log at WARN (the caller's `what`, plus how many
    /// drops from that source were not logged), or `None` when this one is only counted.
    pub fn note(&mut self, now: Instant, src: IpAddr, what: &str) -> Option<String> {
        let key = if self.by_source.contains_key(&Some(src)) || self.by_source.len() < MAX_SOURCES {
            Some(src)
        } else {
            None
        };
        match self.by_source.get_mut(&key) {
            Some(e) if now.saturating_duration_since(e.last) < INTERVAL => {
                e.suppressed = e.suppressed.saturating_add(1);
                None
            }
            Some(e) => {
                let n = std::mem::take(&mut e.suppressed);
                e.last = now;
                Some(with_count(what, n, INTERVAL))
            }
            None => {
                self.by_source.insert(
                    key,
                    Entry {
                        last: now,
                        suppressed: 0,
                    },
                );
                Some(what.to_string())
            }
        }
    }

    /// Drops counted but not logged, over every source.
    pub fn suppressed(&self) -> u64 {
        self.by_source.values().map(|e| e.suppressed).sum()
    }
}

fn with_count(what: &str, n: u64, interval: Duration) -> String {
    if n == 0 {
        what.to_string()
    } else {
        format!(
            "{what} (and {n} more from this source not logged since the last such line; at most one per {} s)",
            interval.as_secs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_source_per_interval_with_the_count() {
        let mut d = DropLog::default();
        let t = Instant::now();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        assert_eq!(d.note(t, a, "x").as_deref(), Some("x"));
        for i in 0..999 {
            assert_eq!(d.note(t + Duration::from_millis(i), a, "x"), None);
        }
        assert_eq!(d.note(t, b, "y").as_deref(), Some("y"), "another source");
        assert_eq!(d.suppressed(), 999);
        let line = d.note(t + INTERVAL, a, "x").unwrap();
        assert!(line.contains("and 999 more"), "{line}");
        assert_eq!(d.suppressed(), 0);
    }

    #[test]
    fn many_sources_share_one_entry() {
        let mut d = DropLog::default();
        let t = Instant::now();
        let mut logged = 0;
        let sources = if cfg!(miri) { 200 } else { 10_000u32 };
        for i in 0..sources {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            logged += usize::from(d.note(t, ip, "x").is_some());
        }
        assert_eq!(logged, MAX_SOURCES + 1);
        assert!(d.by_source.len() <= MAX_SOURCES + 1);
    }
}
