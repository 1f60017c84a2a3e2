//! One rank's per-size result (its time, failed checks) and the data checks the modes make on
//! their buffers; with checks off (a model run without payload copies) filling and checking bytes
//! are skipped, sizes are still checked.
#![forbid(unsafe_code)]

use super::pattern;
use crate::error::{Error, Result};
use crate::ffi::loader::net::SharedBuf;

/// Per-size results of one rank: time per operation in us (0 if this rank does not time), failed
/// checks, first failure.
pub(crate) struct Local {
    pub(crate) time_us: f64,
    /// Latency mode, on the rank that times its pair: the spread of the one-way times.
    pub(crate) spread: Option<Spread>,
    /// Latency mode with `--breakdown`: where this rank's time went.
    pub(crate) breakdown: Option<super::breakdown::Breakdown>,
    /// Latency against a real plugin: this host's RDMA packets over the timed round trips.
    pub(crate) packets: Option<super::rdma_counters::HostPackets>,
    pub(crate) errors: u64,
    pub(crate) first: Option<String>,
    /// Fill and check payload bytes.
    pub(crate) verify: bool,
}

/// The spread of a latency run's one-way times (half of each ping-pong round trip), us.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Spread {
    pub min: f64,
    /// The median (perftest's `t_typical`).
    pub median: f64,
    pub p99: f64,
    pub max: f64,
}

impl Spread {
    /// The spread of `samples` (unordered), none when empty.
    pub fn of(mut samples: Vec<f64>) -> Option<Spread> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Some(Spread {
            min: samples[0],
            median: at(0.5),
            p99: at(0.99),
            max: samples[samples.len() - 1],
        })
    }
}

impl Local {
    pub(crate) fn new(verify: bool) -> Local {
        Local {
            time_us: 0.0,
            spread: None,
            breakdown: None,
            packets: None,
            errors: 0,
            first: None,
            verify,
        }
    }

    pub(crate) fn check(&mut self, r: Result<()>) {
        if let Err(e) = r {
            self.errors += 1;
            if self.first.is_none() {
                tracing::warn!("{e}");
                self.first = Some(e.to_string());
            }
        }
    }
}

pub(crate) fn fill_region(
    l: &Local,
    buf: &SharedBuf,
    off: usize,
    len: usize,
    seed: u64,
) -> Result<()> {
    if l.verify {
        pattern::fill(&mut buf.lock()?[off..off + len], seed);
    }
    Ok(())
}

/// Counts a mismatch in `l`; a buffer that cannot be read (poisoned lock) ends the run instead.
pub(crate) fn verify_region(
    l: &mut Local,
    buf: &SharedBuf,
    off: usize,
    len: usize,
    seed: u64,
    what: &str,
) -> Result<()> {
    if l.verify {
        l.check(pattern::verify(&buf.lock()?[off..off + len], seed, what));
    }
    Ok(())
}

pub(crate) fn scramble(l: &Local, buf: &SharedBuf, off: usize, len: usize) -> Result<()> {
    if l.verify {
        buf.lock()?[off..off + len].fill(0xa5);
    }
    Ok(())
}

pub(crate) fn check_size(got: usize, want: usize, what: &str) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::Remote(format!(
            "{what}: test reported {got} B received, {want} B were sent"
        )))
    }
}

/// The latency and bandwidth partner of `rank` (0-1, 2-3, ...).
pub(crate) fn partner(rank: usize, nranks: usize) -> Option<usize> {
    let p = rank ^ 1;
    (p < nranks).then_some(p)
}
