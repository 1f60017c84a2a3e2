//! The data paths of one comm as the protocol sees them: which are up (failover), when to probe a
//! failed one again (failback), and the stripe weights measured from completions (adaptive
//! weights). Pure bookkeeping on the caller's `now`; the comms do the I/O and the logging.
//!
//! * A path is [`State::Up`] until the comm marks it down (an error completion, a failed post, the
//!   device reporting it dead). The comm never marks its last usable path down: that one keeps
//!   today's behaviour (the request fails with the completion's error).
//! * A down path is probed with doubling backoff `retries` times, then every `probe_interval`
//!   (no clock of our own: a probe happens at the first comm call at or after its time).
//! * Measured throughput: the bytes a path completed between two calls count, with the interval,
//!   only when the path had work outstanding at the first call, so it was busy until that work
//!   completed: the estimate is the path's service rate while it has work (an idle path gives no
//!   sample, not a low one), with the lateness of the caller's polls and one round trip per busy
//!   period as its error. A path without samples for a window drifts back towards its nominal
//!   speed, so one that recovers is offered more load again.
//! * Standby paths (every path to the peer outside NCCL's chosen device) are up but take no new
//!   work while the carrying paths are up: each carrying path that is down lets one up standby
//!   path (in path order) carry in its place, until it is back.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::transport::stripe::MAX_PATHS;

/// Failover and failback knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailoverConfig {
    /// When a path fails, move its work to the surviving paths (`NCCL_SWITCHLESS_FAILOVER`,
    /// default on). Off: a path's error fails the requests on it (the behaviour before failover).
    pub enabled: bool,
    /// Probes of a failed path with doubling backoff before the steady rate (default 5).
    pub retries: u32,
    /// Wait before the first probe; doubles per retry (default 100 ms).
    pub backoff: Duration,
    /// Probe period after the retries (default 5 s).
    pub probe_interval: Duration,
}

impl Default for FailoverConfig {
    fn default() -> Self {
        FailoverConfig {
            enabled: true,
            retries: 5,
            backoff: Duration::from_millis(100),
            probe_interval: Duration::from_secs(5),
        }
    }
}

/// Stripe weight knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightConfig {
    /// Weights follow each path's measured throughput (default); `false`: nominal link speed only.
    pub adaptive: bool,
    /// Smallest weight of a usable path, per mille of the sum of weights (default 20): no path is
    /// starved of the traffic that measures it.
    pub probe_permille: u32,
    /// Span of busy time a measurement averages over (older samples decay exponentially with it).
    pub window: Duration,
}

impl Default for WeightConfig {
    fn default() -> Self {
        WeightConfig {
            adaptive: true,
            probe_permille: 20,
            window: Duration::from_millis(5),
        }
    }
}

/// Where a path stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Up,
    /// Failed; `probes` made so far, the next one due at `next`.
    Down {
        probes: u32,
        next: Instant,
    },
    /// This end is rebuilt (receives posted); waiting for the peer's end.
    Rebuilt {
        next: Instant,
    },
}

#[derive(Debug, Clone, Copy)]
struct Meter {
    /// Nominal speed, Mb/s (0: unknown).
    nominal: u64,
    /// Current estimate, Mb/s.
    est: u64,
    /// Bytes posted, not yet completed.
    outstanding: u64,
    /// Outstanding at the last tick.
    out_last: u64,
    /// Bytes completed since the last tick.
    completed: u64,
    /// Busy-interval samples (decayed over the window): bytes and nanoseconds.
    acc_bytes: u128,
    acc_ns: u128,
    /// Time with no saturated sample since the last drift step, ns.
    idle_ns: u128,
}

/// The data paths of a comm, indexed by data-path index.
pub(super) struct PathSet {
    state: Vec<State>,
    /// Standby paths: no new work unless a carrying path is down.
    standby: Vec<bool>,
    meters: Vec<Meter>,
    weights: WeightConfig,
    failover: FailoverConfig,
    last_tick: Option<Instant>,
}

impl PathSet {
    pub(super) fn new(speeds: &[u64], failover: FailoverConfig, weights: WeightConfig) -> PathSet {
        PathSet {
            state: vec![State::Up; speeds.len()],
            standby: vec![false; speeds.len()],
            meters: speeds
                .iter()
                .map(|&s| Meter {
                    nominal: s,
                    est: s,
                    outstanding: 0,
                    out_last: 0,
                    completed: 0,
                    acc_bytes: 0,
                    acc_ns: 0,
                    idle_ns: 0,
                })
                .collect(),
            weights,
            failover,
            last_tick: None,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.state.len()
    }

    pub(super) fn is_up(&self, k: usize) -> bool {
        self.state.get(k) == Some(&State::Up)
    }

    /// Whether `k` is down and not being rebuilt.
    pub(super) fn is_down(&self, k: usize) -> bool {
        matches!(self.state.get(k), Some(State::Down { .. }))
    }

    pub(super) fn up_count(&self) -> usize {
        self.state.iter().filter(|s| **s == State::Up).count()
    }

    pub(super) fn all_up(&self) -> bool {
        self.up_count() == self.state.len()
    }

    /// Marks the paths of `mask` (bit `k`: data path `k`) standby.
    pub(super) fn set_standby(&mut self, mask: u8) {
        for (k, s) in self.standby.iter_mut().enumerate() {
            *s |= k < 8 && mask & (1 << k) != 0;
        }
    }

    pub(super) fn is_standby(&self, k: usize) -> bool {
        self.standby.get(k) == Some(&true)
    }

    /// Whether `k` takes new work: an up carrying path, or an up standby path standing in for a
    /// carrying path that is down (the first up standby paths, one per carrying path down).
    pub(super) fn carries(&self, k: usize) -> bool {
        if !self.is_up(k) {
            return false;
        }
        if !self.is_standby(k) {
            return true;
        }
        let down = (0..self.len())
            .filter(|&j| !self.standby[j] && !self.is_up(j))
            .count();
        let before = (0..k).filter(|&j| self.standby[j] && self.is_up(j)).count();
        before < down
    }

    /// The paths that take new work ([`Self::carries`]).
    pub(super) fn carrying(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len()).filter(|&k| self.carries(k))
    }

    /// The `i`-th path taking new work (modulo their number); `None` when none is.
    pub(super) fn nth_up(&self, i: u64) -> Option<usize> {
        let n = self.carrying().count();
        if n == 0 {
            return None;
        }
        let want = (i % n as u64) as usize;
        self.carrying().nth(want)
    }

    /// Whether path `k` may be marked down: failover on, `k` up, and another path up.
    pub(super) fn can_fail_over(&self, k: usize) -> bool {
        self.failover.enabled && self.is_up(k) && self.up_count() > 1
    }

    pub(super) fn set_down(&mut self, k: usize, now: Instant) {
        self.state[k] = State::Down {
            probes: 0,
            next: now + self.failover.backoff,
        };
        let m = &mut self.meters[k];
        m.outstanding = 0;
        m.out_last = 0;
        m.completed = 0;
    }

    /// The paths whose probe is due at `now`.
    pub(super) fn due(&self, now: Instant) -> impl Iterator<Item = usize> + '_ {
        self.state
            .iter()
            .enumerate()
            .filter(move |(_, s)| match s {
                State::Up => false,
                State::Down { next, .. } | State::Rebuilt { next } => *next <= now,
            })
            .map(|(k, _)| k)
    }

    /// A probe of `k` found the port still down: schedules the next one.
    pub(super) fn probe_failed(&mut self, k: usize, now: Instant) {
        let probes = match self.state[k] {
            State::Down { probes, .. } => probes.saturating_add(1),
            _ => 1,
        };
        let delay = if probes < self.failover.retries {
            let factor = 1u32.checked_shl(probes).unwrap_or(u32::MAX);
            self.failover
                .backoff
                .saturating_mul(factor)
                .min(self.failover.probe_interval)
        } else {
            self.failover.probe_interval
        };
        self.state[k] = State::Down {
            probes,
            next: now + delay,
        };
    }

    /// This end of `k` is rebuilt; the peer's is not yet.
    pub(super) fn rebuilt(&mut self, k: usize, now: Instant, soon: bool) {
        let next = if soon {
            now
        } else {
            now + self.failover.backoff
        };
        self.state[k] = State::Rebuilt { next };
    }

    /// `k` rejoins with its nominal weight.
    pub(super) fn set_up(&mut self, k: usize) {
        self.state[k] = State::Up;
        let m = &mut self.meters[k];
        m.est = m.nominal;
        (m.acc_bytes, m.acc_ns, m.idle_ns) = (0, 0, 0);
        (m.outstanding, m.out_last, m.completed) = (0, 0, 0);
    }

    pub(super) fn posted(&mut self, k: usize, bytes: u64) {
        self.meters[k].outstanding = self.meters[k].outstanding.saturating_add(bytes);
    }

    /// Work posted on `k` that will never complete there (moved to another path).
    pub(super) fn abandoned(&mut self, k: usize, bytes: u64) {
        self.meters[k].outstanding = self.meters[k].outstanding.saturating_sub(bytes);
    }

    pub(super) fn completed(&mut self, k: usize, bytes: u64) {
        let m = &mut self.meters[k];
        m.outstanding = m.outstanding.saturating_sub(bytes);
        m.completed = m.completed.saturating_add(bytes);
    }

    /// Takes the samples of the interval since the last call (see the module docs).
    pub(super) fn tick(&mut self, now: Instant) {
        let Some(last) = self.last_tick else {
            self.last_tick = Some(now);
            return;
        };
        let dt = now.saturating_duration_since(last).as_nanos();
        if dt == 0 || !self.weights.adaptive {
            return;
        }
        self.last_tick = Some(now);
        let window = self.weights.window.as_nanos().max(1);
        for (k, m) in self.meters.iter_mut().enumerate() {
            if self.state[k] != State::Up {
                continue;
            }
            if m.out_last > 0 {
                // Exponential decay by the sample's own duration (a sample of a whole window
                // replaces the past), so lumpy samples (time without bytes, then bytes at once)
                // weigh what they span.
                let keep = window - dt.min(window);
                m.acc_bytes = m.acc_bytes * keep / window + u128::from(m.completed);
                m.acc_ns = m.acc_ns * keep / window + dt;
                m.idle_ns = 0;
                // Trust the estimate once it spans half a window of busy time.
                if m.acc_ns >= window / 2 {
                    // bytes × 8 / ns = Gb/s; × 1000 = Mb/s.
                    let mbps = m.acc_bytes * 8000 / m.acc_ns;
                    m.est = u64::try_from(mbps).unwrap_or(u64::MAX).max(1);
                }
            } else {
                m.idle_ns += dt;
                if m.idle_ns >= window && m.est < m.nominal {
                    // Not saturated for a window: offer it more, an eighth of the gap at a time.
                    m.est += (m.nominal - m.est).div_ceil(8);
                    m.idle_ns = 0;
                }
            }
            m.out_last = m.outstanding;
            m.completed = 0;
        }
    }

    /// Stripe weights of the paths taking new work: writes `(data-path index, weight)` pairs into `out` and
    /// returns how many. Weights are Mb/s (the measured estimate when adaptive, else nominal).
    pub(super) fn weights(&self, out: &mut [(usize, u64); MAX_PATHS]) -> usize {
        let mut n = 0;
        for (k, m) in self.meters.iter().enumerate().take(MAX_PATHS) {
            if self.carries(k) {
                let w = if self.weights.adaptive {
                    m.est
                } else {
                    m.nominal
                };
                out[n] = (k, w);
                n += 1;
            }
        }
        if self.weights.adaptive && n > 1 {
            let sum: u128 = out[..n].iter().map(|&(_, w)| u128::from(w.max(1))).sum();
            let floor = sum * u128::from(self.weights.probe_permille) / 1000;
            let floor = u64::try_from(floor).unwrap_or(u64::MAX);
            for (_, w) in out[..n].iter_mut() {
                *w = (*w).max(floor);
            }
        }
        n
    }

    /// Sum of the carrying paths' weights, Mb/s (the bandwidth to expect).
    pub(super) fn up_mbps(&self) -> u64 {
        let mut w = [(0usize, 0u64); MAX_PATHS];
        let n = self.weights(&mut w);
        w[..n].iter().map(|&(_, x)| x).sum()
    }

    /// Bytes posted on `k` and not completed yet.
    pub(super) fn outstanding(&self, k: usize) -> u64 {
        self.meters.get(k).map_or(0, |m| m.outstanding)
    }

    /// The measured estimate of `k`, Mb/s (tests, logs).
    pub(super) fn estimate(&self, k: usize) -> u64 {
        self.meters.get(k).map_or(0, |m| m.est)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ns: u64) -> Instant {
        static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *BASE.get_or_init(Instant::now) + Duration::from_nanos(ns)
    }

    #[test]
    fn backoff_doubles_then_settles_at_the_probe_interval() {
        let mut p = PathSet::new(
            &[100, 100],
            FailoverConfig::default(),
            WeightConfig::default(),
        );
        p.set_down(1, t(0));
        assert_eq!(p.due(t(99_999_999)).count(), 0);
        assert_eq!(p.due(t(100_000_000)).collect::<Vec<_>>(), vec![1]);
        let mut now = t(100_000_000);
        let mut gaps = Vec::new();
        for _ in 0..7 {
            p.probe_failed(1, now);
            let State::Down { next, .. } = p.state[1] else {
                panic!()
            };
            gaps.push((next - now).as_millis());
            now = next;
        }
        assert_eq!(gaps, vec![200, 400, 800, 1600, 5000, 5000, 5000]);
    }

    #[test]
    fn the_last_usable_path_is_never_marked_down() {
        let mut p = PathSet::new(&[1, 1], FailoverConfig::default(), WeightConfig::default());
        assert!(p.can_fail_over(0));
        p.set_down(0, t(0));
        assert!(!p.can_fail_over(1));
        assert_eq!(p.nth_up(7), Some(1));
        let off = FailoverConfig {
            enabled: false,
            ..FailoverConfig::default()
        };
        assert!(!PathSet::new(&[1, 1], off, WeightConfig::default()).can_fail_over(0));
    }

    #[test]
    fn a_busy_path_is_measured_an_idle_one_drifts_back_to_nominal() {
        let mut p = PathSet::new(
            &[100_000, 100_000],
            FailoverConfig::default(),
            WeightConfig::default(),
        );
        p.tick(t(0));
        // Path 0 always has work and completes 5 MB per ms (40 Gb/s); path 1 has none.
        p.posted(0, 1_000_000);
        for ms in 1..=20u64 {
            p.posted(0, 5_000_000);
            p.completed(0, 5_000_000);
            p.tick(t(ms * 1_000_000));
        }
        assert!(p.estimate(0).abs_diff(40_000) < 100, "{}", p.estimate(0));
        assert_eq!(p.estimate(1), 100_000);
        let mut w = [(0, 0); MAX_PATHS];
        assert_eq!(p.weights(&mut w), 2);
        assert_eq!(w[1], (1, 100_000));
        // Path 0 goes idle: an eighth of the gap back per window without samples.
        p.completed(0, 1_000_000);
        p.tick(t(21_000_000));
        for ms in 22..=60u64 {
            p.tick(t(ms * 1_000_000));
        }
        let e = p.estimate(0);
        assert!(e > 60_000 && e < 100_000, "{e}");
        // A path measured at a trickle still gets the probe share.
        p.meters[1].est = 1;
        p.weights(&mut w);
        assert!(w[1].1 >= w[0].1 / 50, "{w:?}");
    }

    #[test]
    fn a_standby_path_carries_while_a_carrying_path_is_down() {
        let mut p = PathSet::new(
            &[100, 100, 100, 100],
            FailoverConfig::default(),
            WeightConfig::default(),
        );
        p.set_standby(0b1100);
        let carrying = |p: &PathSet| p.carrying().collect::<Vec<_>>();
        assert_eq!(carrying(&p), vec![0, 1]);
        assert_eq!(p.up_mbps(), 200);
        p.set_down(1, t(0));
        assert_eq!(carrying(&p), vec![0, 2]);
        assert_eq!(p.nth_up(3), Some(2));
        // A standby path down: the next one stands in.
        p.set_down(2, t(0));
        assert_eq!(carrying(&p), vec![0, 3]);
        p.set_down(0, t(0));
        assert_eq!(carrying(&p), vec![3]);
        assert!(!p.can_fail_over(3));
        // The carrying paths come back: the standby path returns to standby.
        p.set_up(0);
        p.set_up(1);
        assert_eq!(carrying(&p), vec![0, 1]);
        let mut w = [(0, 0); MAX_PATHS];
        assert_eq!(p.weights(&mut w), 2);
    }
}
