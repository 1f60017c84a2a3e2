//! K's forwarding thread for verbs legs: [`Pump`] owns the [`super::forward::Forwarder`] of every
//! verbs leg of one relay service and polls them in turn, spinning while any moves data (a
//! forward waits for no one else's call, as NCCL's proxy thread polls its queue pairs) and
//! sleeping when all are idle. The relay service's thread adds a leg once its set-up is through
//! and closes it when the client's door connection ends; a leg that ends on its own (a queue pair
//! failed, a write out of order) is reported back with its reason.
//!
//! Bounded: at most `max_legs` legs at once; an add past it is refused, the leg closed.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::sync::lock;
use crate::sys::thread::Joiner;
use crate::transport::fabric::Fabric;

use super::forward::{Forwarder, StagingMem};

/// What the pump needs of a leg.
pub trait PumpLeg: Send {
    /// Moves what completed; an error ends the leg.
    fn poll(&mut self) -> Result<usize>;
    /// Ends the leg (its queue pairs to the error state).
    fn close(&mut self, why: &str);
}

impl<F: Fabric + Send, M: StagingMem + Send> PumpLeg for Forwarder<F, M> {
    fn poll(&mut self) -> Result<usize> {
        Forwarder::poll(self)
    }
    fn close(&mut self, why: &str) {
        Forwarder::close(self, why);
    }
}

/// Polls in a row with nothing moving before the thread sleeps between rounds.
const SPINS: u32 = 2000;
/// The sleep between idle rounds while legs exist (the latency an idle leg adds to its next
/// write), and while none does.
const IDLE_SLEEP: Duration = Duration::from_micros(50);
const EMPTY_SLEEP: Duration = Duration::from_millis(2);

enum Cmd {
    Add(u64, Box<dyn PumpLeg>),
    Close(u64, String),
}

struct Shared {
    inbox: Mutex<Vec<Cmd>>,
    ended: Mutex<Vec<(u64, String)>>,
    stop: AtomicBool,
    /// Legs added and not yet closed or ended.
    legs: AtomicUsize,
    /// Completions the legs moved, in all.
    moved: AtomicU64,
}

/// The forwarding thread of one relay service (module docs).
pub struct Pump {
    sh: Arc<Shared>,
    max_legs: usize,
    thread: Option<Joiner>,
}

impl std::fmt::Debug for Pump {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pump")
            .field("legs", &self.legs())
            .field("max_legs", &self.max_legs)
            .finish()
    }
}

impl Pump {
    /// Starts the thread (`name`, at most 15 bytes kept).
    pub fn start(name: &str, max_legs: usize) -> Result<Pump> {
        let sh = Arc::new(Shared {
            inbox: Mutex::new(Vec::new()),
            ended: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            legs: AtomicUsize::new(0),
            moved: AtomicU64::new(0),
        });
        let inner = Arc::clone(&sh);
        let thread = crate::sys::thread::spawn(name, move || run(&inner))
            .map_err(|e| Error::io("starting the relay's forwarding thread", e))?;
        Ok(Pump {
            sh,
            max_legs,
            thread: Some(thread),
        })
    }

    /// Hands `leg` (named `id`, unique per pump) to the thread. Past `max_legs`, refused: the leg
    /// is closed and the error names the bound.
    pub fn add(&self, id: u64, mut leg: Box<dyn PumpLeg>) -> Result<()> {
        let taken = self
            .sh
            .legs
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_legs).then_some(n + 1)
            });
        if taken.is_err() {
            leg.close("the relay's verbs legs are all taken");
            return Err(Error::InvalidUsage(format!(
                "relay: {} verbs legs already, the most one relay forwards",
                self.max_legs
            )));
        }
        lock(&self.sh.inbox, "relay pump inbox")?.push(Cmd::Add(id, leg));
        Ok(())
    }

    /// Ends leg `id` (its client went away); unknown ids are ignored.
    pub fn close(&self, id: u64, why: &str) -> Result<()> {
        lock(&self.sh.inbox, "relay pump inbox")?.push(Cmd::Close(id, why.to_string()));
        Ok(())
    }

    /// Legs that ended on their own since the last call, with why.
    pub fn take_ended(&self) -> Vec<(u64, String)> {
        lock(&self.sh.ended, "relay pump ended legs")
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }

    /// Legs held now (added, not closed or ended).
    pub fn legs(&self) -> usize {
        self.sh.legs.load(Ordering::Acquire)
    }

    /// Completions moved by every leg so far.
    pub fn moved(&self) -> u64 {
        self.sh.moved.load(Ordering::Relaxed)
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.sh.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            // The thread closes its legs and ends within one sleep.
            t.join();
        }
    }
}

fn run(sh: &Shared) {
    let mut legs: BTreeMap<u64, Box<dyn PumpLeg>> = BTreeMap::new();
    let mut idle = 0u32;
    let mut cmds = Vec::new();
    while !sh.stop.load(Ordering::Acquire) {
        if let Ok(mut inbox) = lock(&sh.inbox, "relay pump inbox") {
            std::mem::swap(&mut *inbox, &mut cmds);
        }
        for cmd in cmds.drain(..) {
            match cmd {
                Cmd::Add(id, leg) => {
                    if let Some(mut old) = legs.insert(id, leg) {
                        old.close("replaced by a leg of the same id");
                        sh.legs.fetch_sub(1, Ordering::AcqRel);
                    }
                }
                Cmd::Close(id, why) => {
                    if let Some(mut leg) = legs.remove(&id) {
                        leg.close(&why);
                        sh.legs.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            }
        }
        let mut moved = 0usize;
        let mut gone = Vec::new();
        for (&id, leg) in legs.iter_mut() {
            match leg.poll() {
                Ok(n) => moved += n,
                Err(e) => gone.push((id, e.to_string())),
            }
        }
        if !gone.is_empty() {
            for (id, _) in &gone {
                legs.remove(id);
                sh.legs.fetch_sub(1, Ordering::AcqRel);
            }
            if let Ok(mut ended) = lock(&sh.ended, "relay pump ended legs") {
                ended.extend(gone);
            }
        }
        if moved > 0 {
            sh.moved.fetch_add(moved as u64, Ordering::Relaxed);
            idle = 0;
            continue;
        }
        idle = idle.saturating_add(1);
        if legs.is_empty() {
            std::thread::sleep(EMPTY_SLEEP);
        } else if idle > SPINS {
            std::thread::sleep(IDLE_SLEEP);
        } else {
            std::hint::spin_loop();
        }
    }
    for (_, mut leg) in legs {
        leg.close("the relay service stopped");
    }
}
