//! What the bench modes ask about time and about the other ranks: a [`Clock`] (the wall clock, or
//! the model fabric's virtual time) and a [`Group`] (the TCP bootstrap, or ranks that are threads
//! of one process sharing a virtual clock).
//!
//! In virtual time ([`VirtualClock`]) the clock moves only when every rank waits: a rank that found
//! nothing to do calls [`Clock::idle`], and the last one to do so advances the model fabric to its
//! next event and wakes the ranks whose host the events touched (rank `r` is host `r`; the others
//! would find nothing new, so the clock moves on without waking them). Collectives are the clock's
//! own, so a rank leaving one is counted as running again before anyone can advance: each rank's
//! work at a given virtual time sees the same state on every run, and runs repeat exactly.
#![forbid(unsafe_code)]

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use crate::transport::modelfab::ModelFab;

/// Time as the bench modes see it.
pub trait Clock {
    /// Now (stamps for the comms' request timeouts, and the start and end of every timed interval).
    fn now(&self) -> Instant;
    /// Called by a polling loop after each pass; `progressed` says whether the pass changed
    /// anything. The wall clock yields the CPU; the virtual clock returns at once after progress and
    /// otherwise when virtual time has moved.
    fn idle(&self, progressed: bool) -> Result<()>;
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct WallClock;

impl Clock for WallClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn idle(&self, _progressed: bool) -> Result<()> {
        std::thread::yield_now();
        Ok(())
    }
}

/// The ranks of a run, for exchanging blobs (listen handles, per-size results).
pub trait Group {
    /// This rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn nranks(&self) -> usize;
    /// Every rank's blob, in rank order.
    fn allgather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// Returns once every rank has called it.
    fn barrier(&mut self) -> Result<()> {
        self.allgather(&[]).map(|_| ())
    }
}

impl Group for Bootstrap {
    fn rank(&self) -> usize {
        Bootstrap::rank(self)
    }
    fn nranks(&self) -> usize {
        Bootstrap::nranks(self)
    }
    fn allgather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        Bootstrap::allgather(self, mine)
    }
    fn barrier(&mut self) -> Result<()> {
        Bootstrap::barrier(self)
    }
}

#[derive(Default)]
struct State {
    /// Ranks still taking part.
    live: usize,
    /// Ranks running (neither idle nor in a collective).
    running: usize,
    /// Ranks waiting for virtual time to move.
    idle: usize,
    /// Per rank: waiting for virtual time to move.
    waiting: Vec<bool>,
    /// Per rank: woken by an advance that touched its host.
    woken: Vec<bool>,
    /// The collective being gathered.
    blobs: Vec<Option<Vec<u8>>>,
    arrived: usize,
    /// Bumped when a collective completes; its result.
    generation: u64,
    result: Arc<Vec<Vec<u8>>>,
    failed: Option<String>,
}

struct Shared {
    fab: ModelFab,
    base: Instant,
    st: Mutex<State>,
    cv: Condvar,
}

/// Virtual time over a [`ModelFab`] for `nranks` ranks that are threads: one [`VirtualRank`] each.
pub struct VirtualClock {
    shared: Arc<Shared>,
    nranks: usize,
}

/// One rank's handle on a [`VirtualClock`]: its [`Group`], and its [`Clock`] by
/// [`VirtualRank::clock`]. Dropping it takes the rank out of the run.
pub struct VirtualRank {
    shared: Arc<Shared>,
    rank: usize,
    nranks: usize,
    left: bool,
}

/// How long a rank waits in real time for the others before it looks again (a safety net against a
/// bug here; the protocol's own waits are in virtual time).
const POLL: Duration = Duration::from_millis(200);

impl VirtualClock {
    /// A clock at the fabric's current time for `nranks` running ranks.
    pub fn new(fab: ModelFab, nranks: usize) -> VirtualClock {
        VirtualClock {
            shared: Arc::new(Shared {
                fab,
                base: Instant::now(),
                st: Mutex::new(State {
                    live: nranks,
                    running: nranks,
                    blobs: vec![None; nranks],
                    waiting: vec![false; nranks],
                    woken: vec![false; nranks],
                    ..State::default()
                }),
                cv: Condvar::new(),
            }),
            nranks,
        }
    }

    /// The handle of `rank` (each rank takes exactly one).
    pub fn rank(&self, rank: usize) -> VirtualRank {
        VirtualRank {
            shared: self.shared.clone(),
            rank,
            nranks: self.nranks,
            left: false,
        }
    }
}

impl Shared {
    fn lock(&self) -> Result<MutexGuard<'_, State>> {
        crate::sync::lock(&self.st, "virtual clock")
    }

    /// With no rank running: moves the fabric to its next event and wakes the idle ranks, or fails
    /// the run when they wait for nothing.
    fn advance(&self, st: &mut State) {
        if st.running > 0 || st.idle == 0 || st.failed.is_some() {
            return;
        }
        loop {
            match self.fab.advance_touching() {
                Ok(Some((_, hosts))) => {
                    let mut woke = false;
                    for h in hosts {
                        if st.waiting.get(h).copied().unwrap_or(false) {
                            st.waiting[h] = false;
                            st.woken[h] = true;
                            st.idle -= 1;
                            st.running += 1;
                            woke = true;
                        }
                    }
                    if woke {
                        break;
                    }
                }
                Ok(None) => {
                    st.failed = Some(format!(
                        "virtual time: {} rank(s) wait for a transfer and none is in flight, {} in a collective (a deadlock in the protocol or the bench)",
                        st.idle, st.arrived
                    ));
                    break;
                }
                Err(e) => {
                    st.failed = Some(e.to_string());
                    break;
                }
            }
        }
        self.cv.notify_all();
    }

    /// Completes the collective once every live rank is in it: all of them run again before anyone
    /// can advance. Returns whether it completed.
    fn complete(&self, st: &mut State) -> bool {
        if st.arrived == 0 || st.arrived < st.live {
            return false;
        }
        let blobs: Vec<Vec<u8>> = st
            .blobs
            .iter_mut()
            .map(|b| b.take().unwrap_or_default())
            .collect();
        st.result = Arc::new(blobs);
        st.running += st.arrived;
        st.arrived = 0;
        st.generation += 1;
        self.cv.notify_all();
        true
    }

    fn wait<'a>(
        &self,
        mut g: MutexGuard<'a, State>,
        done: impl Fn(&State) -> bool,
    ) -> Result<MutexGuard<'a, State>> {
        loop {
            if let Some(f) = &g.failed {
                return Err(Error::Internal(f.clone()));
            }
            if done(&g) {
                return Ok(g);
            }
            g = match self.cv.wait_timeout(g, POLL) {
                Ok((g, _)) => g,
                Err(_) => return Err(Error::Internal("virtual clock lock poisoned".into())),
            };
        }
    }
}

/// A rank's view of virtual time (the [`Clock`] of [`VirtualRank::clock`]); used only by that
/// rank's thread.
#[derive(Clone)]
pub struct VirtualTime {
    shared: Arc<Shared>,
    rank: usize,
}

impl VirtualRank {
    /// This rank's clock (for its modes and its Net).
    pub fn clock(&self) -> VirtualTime {
        VirtualTime {
            shared: self.shared.clone(),
            rank: self.rank,
        }
    }

    /// Fails the whole run (every rank's next wait returns the error): a rank that hit an error
    /// calls it so that the others do not wait for it.
    pub fn abort(&self, why: &str) {
        if let Ok(mut g) = self.shared.lock() {
            g.failed
                .get_or_insert_with(|| format!("rank {}: {why}", self.rank));
            self.shared.cv.notify_all();
        }
    }
}

impl Drop for VirtualRank {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        self.left = true;
        if let Ok(mut g) = self.shared.lock() {
            g.live = g.live.saturating_sub(1);
            g.running = g.running.saturating_sub(1);
            if !self.shared.complete(&mut g) {
                self.shared.advance(&mut g);
            }
            self.shared.cv.notify_all();
        }
    }
}

impl Clock for VirtualTime {
    fn now(&self) -> Instant {
        let ps = self.shared.fab.now_ps().unwrap_or(0);
        self.shared.base + Duration::from_nanos(ps / 1000)
    }

    fn idle(&self, progressed: bool) -> Result<()> {
        if progressed {
            return Ok(());
        }
        let me = self.rank;
        let mut g = self.shared.lock()?;
        g.running = g.running.saturating_sub(1);
        g.idle += 1;
        g.waiting[me] = true;
        self.shared.advance(&mut g);
        let mut g = self.shared.wait(g, |s| s.woken[me])?;
        g.woken[me] = false;
        Ok(())
    }
}

impl Group for VirtualRank {
    fn rank(&self) -> usize {
        self.rank
    }
    fn nranks(&self) -> usize {
        self.nranks
    }
    fn allgather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut g = self.shared.lock()?;
        let generation = g.generation;
        if g.blobs[self.rank].is_some() {
            return Err(Error::Internal(format!(
                "rank {} entered a collective twice",
                self.rank
            )));
        }
        g.blobs[self.rank] = Some(mine.to_vec());
        g.arrived += 1;
        g.running = g.running.saturating_sub(1);
        if !self.shared.complete(&mut g) {
            self.shared.advance(&mut g);
        }
        let g = self.shared.wait(g, |s| s.generation != generation)?;
        Ok(g.result.as_ref().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::modelfab::{Framing, ModelFabConfig, Topology};

    fn fab() -> ModelFab {
        ModelFab::new(ModelFabConfig {
            topology: Topology::parse("1G", "", Framing::Ideal).unwrap(),
            copy_data: false,
            trace: false,
        })
        .unwrap()
    }

    #[test]
    fn ranks_that_all_wait_for_nothing_fail_instead_of_hanging() {
        let c = VirtualClock::new(fab(), 2);
        let (a, b) = (c.rank(0), c.rank(1));
        let t = std::thread::spawn(move || b.clock().idle(false));
        let e = a.clock().idle(false).unwrap_err().to_string();
        assert!(e.contains("deadlock"), "{e}");
        assert!(t.join().unwrap().is_err());
    }

    #[test]
    fn collectives_gather_in_rank_order() {
        let c = VirtualClock::new(fab(), 3);
        let hs: Vec<_> = (0..3)
            .map(|r| {
                let mut v = c.rank(r);
                std::thread::spawn(move || {
                    let x = v.allgather(&[r as u8]).unwrap();
                    v.barrier().unwrap();
                    x
                })
            })
            .collect();
        for h in hs {
            assert_eq!(h.join().unwrap(), vec![vec![0u8], vec![1], vec![2]]);
        }
    }
}
