//! An in-process [`Fabric`] for tests and benchmarks: pairs of endpoints whose paths behave like RC
//! queue pairs, deterministic, with fault injection.
//!
//! * Memory: the fabric owns every byte. [`MemFab::alloc`] returns an address
//!   `((region + 1) << 32) | offset`; tests fill and check it with [`MemFab::write`] / [`MemFab::read`].
//!   Regions are [`AtomicWords`]: an RDMA write stores whole words with `Release` (partial
//!   words with a compare-exchange), and [`Fabric::ctrl_load`] loads with the ordering the protocol
//!   asks for, as a CPU polling NIC-written memory would.
//! * Keys: registration gives every path its own lkey/rkey; a write is checked like a NIC would
//!   (`LOC_PROT_ERR` for a bad local key or range, `REM_ACCESS_ERR` for a bad remote one,
//!   `RNR_RETRY_EXC_ERR` for a write with immediate when no receive is posted). An error puts the path
//!   in the error state: later work requests complete with `WR_FLUSH_ERR`.
//! * Delivery: by default each work request executes when posted. With
//!   [`MemFabConfig::reorder_seed`], work requests queue per path and execute when any endpoint polls,
//!   a few at a time from randomly chosen paths (seeded, so runs repeat): in order within a path, in any
//!   order across paths.
//! * Faults: [`MemFab::fail_next`] (the next work request on a path fails with a status),
//!   [`MemFab::stall`] (an endpoint's work requests stop executing: a peer that stops answering),
//!   [`MemFab::kill_path`] / [`MemFab::kill_after`] (a cable pulled: both ends of a path fail, now or
//!   when a given number of further work requests has executed, optionally with the write under way
//!   half landed), [`MemFab::fault_after`] (the same with a choice of what becomes of the work in
//!   flight on the path, [`InFlight`]: dropped, landed with its completion lost, or held on the
//!   wire and landed later, unless the target's end was sealed first) and
//!   [`MemFab::restore_path`] (the cable is back; each end then rebuilds its queue pair through
//!   [`Fabric::revive_path`]).
//! * Queue pair ends: an end in error fails what it posts; a **sealed** end (its QP moved to the
//!   error state by the comm: [`Fabric::stop_path`], [`Fabric::seal_path`], `shutdown`, or a cable
//!   pulled with [`InFlight::Drop`]) also takes nothing more from the wire, as a verbs QP in the
//!   error state drops what arrives for it; its posted receives flush.
//! * Oracle: [`MemFab::guard`] marks a range (a completed receive's buffer) and records every write
//!   that lands in it until [`MemFab::unguard`] ([`MemFab::violations`]).
//!
//! * Devices: by default every endpoint is its own device (its keys serve only its own paths). An
//!   endpoint made by [`MemFab::pair_on`] with a device id shares that device with every other
//!   endpoint on it, as connections on one RDMA device share its protection domain: data
//!   registrations then go through a [`RegCache`] (one pin and one key pair per page range,
//!   valid on every path of every endpoint of the device), as the verbs fabric does.
//!
//! This file holds the types and the test-facing [`MemFab`] API; `exec.rs` is the NIC (executing queued
//! work requests), `endpoint.rs` the [`Fabric`] calls of one endpoint.
#![forbid(unsafe_code)]

mod endpoint;
mod exec;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::sync::lock;
use crate::sys::rawmem::Lent;
use crate::transport::ctrl::{AtomicWords, Span};
use crate::transport::fabric::{
    Completion, CtrlMem, Fabric, MemKind, PathInfo, PathKeys, PathRole, Pinner, ReadWr,
    Registration, Revive, WcOpcode, WcStatus, WriteWr,
};
use crate::transport::regcache::{CacheKey, CacheStats, Inserted, RegCache, RegKind};

/// Options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemFabConfig {
    /// `None`: execute each work request when posted. `Some(seed)`: queue and execute in a seeded
    /// random interleaving across paths when endpoints poll.
    pub reorder_seed: Option<u64>,
    /// Copy payload bytes into data buffers (`false` only checks keys and ranges; control memory is
    /// always written). `false` isolates the protocol's CPU cost in benchmarks.
    pub copy_data: bool,
    /// Simulated cost of pinning: a registration of data memory sleeps this many nanoseconds per
    /// 4 KiB page before it takes the fabric's lock, as `ibv_reg_mr` pins pages (0: free).
    pub pin_ns_per_page: u64,
}

impl Default for MemFabConfig {
    fn default() -> Self {
        MemFabConfig {
            reorder_seed: None,
            copy_data: true,
            pin_ns_per_page: 0,
        }
    }
}

/// Identifies an endpoint of the fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EpId(pub usize);

/// Counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// RDMA writes executed successfully.
    pub writes: u64,
    /// Writes that carried an immediate.
    pub imm_writes: u64,
    /// RDMA reads executed successfully.
    pub reads: u64,
    /// Payload bytes written by RDMA writes.
    pub bytes: u64,
    /// Writes that carried the inline hint.
    pub inline_writes: u64,
    /// Calls of `post_writes` (doorbells, on verbs).
    pub batches: u64,
    /// Registrations of data memory made (each pins its pages, on verbs).
    pub pins: u64,
    /// Bytes of data memory pinned now: each private registration's bytes plus each cached pin's
    /// whole pages once (what `RLIMIT_MEMLOCK` accounting would count on verbs).
    pub pinned_bytes: u64,
    /// The registration cache of the shared devices ([`MemFab::pair_on`]).
    pub cache: CacheStats,
    /// Endpoints whose loopback flush paths were made ready (verbs creates their QPs then): at the
    /// first GPU registration (`prepare_flush`) or the first read on a loopback path.
    pub flush_preps: u64,
    /// Writes held by an [`InFlight::Delay`] fault that landed later.
    pub late_landed: u64,
    /// Writes held by an [`InFlight::Delay`] fault that were dropped (the target's end sealed,
    /// or a write with an immediate finding no receive).
    pub late_dropped: u64,
    /// Writes that landed although their poster was told they failed ([`InFlight::LandLost`]).
    pub landed_lost: u64,
    /// Calls of [`Fabric::health`] and [`Fabric::path_health`] (each a `read(2)` of the async
    /// event fd on verbs before those were rate-limited: the cost of an idle poll).
    pub health_calls: u64,
    pub path_health_calls: u64,
}

struct Region {
    words: AtomicWords,
    len: usize,
    ctrl: bool,
}

#[derive(Debug, Clone, Copy)]
struct Key {
    /// `Some`: a cached pin's key, valid on every path of every endpoint of that device.
    dev: Option<u64>,
    ep: usize,
    path: usize,
    region: usize,
    start: usize,
    len: usize,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Write(WriteWr),
    Read(ReadWr),
}

#[derive(Default)]
struct Qp {
    queue: VecDeque<Op>,
    cq: VecDeque<Completion>,
    recvs: VecDeque<u64>,
    error: bool,
    fault: Option<WcStatus>,
    /// What [`Fabric::path_note`] reports for this path (set by [`MemFabric::set_path_note`]).
    note: Option<String>,
    bytes: u64,
    /// The cable is out ([`MemFab::kill_path`]): the queue pair cannot be rebuilt.
    carrier_down: bool,
    /// Sealed: nothing lands at this end any more (see the module docs).
    sealed: bool,
    /// Rebuilt by [`Fabric::revive_path`], not yet ready to send (verbs: INIT, receives may be
    /// posted).
    init: bool,
}

/// A path to kill when the fabric has executed `at` work requests in all.
#[derive(Debug, Clone, Copy)]
struct KillAt {
    at: u64,
    ep: usize,
    path: usize,
    partial: bool,
    mode: InFlight,
}

/// What becomes of the work requests queued on a path (in flight on the cable) when its fault
/// strikes ([`MemFab::fault_after`]). Either way both ends' queue pairs are in the error state
/// afterwards (what they post fails) and the cable stays out until [`MemFab::restore_path`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlight {
    /// Never executes: completes with an error at its poster (a cable pulled before it went out).
    /// Both ends are sealed: nothing lands any more.
    Drop,
    /// Lands in the target's memory (writes with an immediate complete its receives), but the
    /// poster's completions are errors: the acknowledgements were lost. The ends are not sealed.
    LandLost,
    /// Held on the wire: completes with an error at its poster now, and lands later, in order,
    /// once `ops` more work requests have executed anywhere or at [`MemFab::deliver_late`],
    /// unless the target's end was sealed first (then it is dropped). The ends are not sealed.
    Delay {
        /// Work requests executed (anywhere) before the held ones land.
        ops: u64,
    },
}

/// A write held on the wire by an [`InFlight::Delay`] fault.
#[derive(Debug, Clone, Copy)]
struct LateWrite {
    ep: usize,
    path: usize,
    wr: WriteWr,
    /// Lands once `executed` reaches this.
    due: u64,
}

/// A range guarded by [`MemFab::guard`].
#[derive(Debug, Clone)]
struct Guard {
    region: usize,
    start: usize,
    len: usize,
    what: String,
}

struct Endpoint {
    peer: usize,
    roles: Vec<PathRole>,
    qps: Vec<Qp>,
    stalled: bool,
    regs: HashMap<u64, Vec<u32>>,
    /// Bytes of the live data registrations (by token), for [`Stats::pinned_bytes`].
    pinned: HashMap<u64, u64>,
    /// The shared device ([`MemFab::pair_on`]); `None`: a device of its own.
    dev: Option<u64>,
    /// Registrations served by the cache (by token): the entry each references.
    cached: HashMap<u64, CacheKey>,
    /// What [`Fabric::health`] fails with (set by [`MemFabric::set_health_error`]).
    health_error: Option<String>,
    /// Deferred paths and what activating them needs (`None`: nothing deferred; boxed, as most
    /// endpoints have none).
    lazy: Option<Box<Lazy>>,
}

/// An endpoint's deferred paths ([`Fabric::defer_paths`]; a device of its own only: a shared
/// device's pin serves every path).
#[derive(Default)]
struct Lazy {
    /// Paths whose data registrations wait for [`Fabric::activate_path`] (bit = path).
    deferred: u32,
    /// Per data registration made since (by token): where it is, to key it on a path activated
    /// later.
    ranges: HashMap<u64, (usize, usize, usize)>,
    /// Keys made at activation, by (token, path).
    late_keys: HashMap<(u64, usize), PathKeys>,
}

struct Inner {
    regions: Vec<Region>,
    keys: HashMap<u32, Key>,
    next_key: u32,
    next_token: u64,
    eps: Vec<Endpoint>,
    rng: u64,
    reorder: bool,
    copy_data: bool,
    pin_ns_per_page: u64,
    stats: Stats,
    /// Pins of the shared devices: their key pair and the bytes they cover.
    cache: RegCache<CachedPin>,
    /// Work requests executed so far (for [`MemFab::kill_after`]).
    executed: u64,
    kill_at: Option<KillAt>,
    /// Writes held on the wire ([`InFlight::Delay`]), in the order they land.
    late: VecDeque<LateWrite>,
    guards: Vec<Guard>,
    violations: Vec<String>,
}

/// The fabric: memory, keys and every endpoint's queues. Cheap to clone (shared).
#[derive(Clone)]
pub struct MemFab {
    inner: Arc<Mutex<Inner>>,
}

/// Dropping an endpoint destroys it like closing its QPs and PD would: its registrations' keys are
/// released and its queues emptied (writes that still target it fail on the errored paths).
impl Drop for MemEndpoint {
    fn drop(&mut self) {
        let Ok(mut g) = lock(&self.inner, LOCK) else {
            return; // poisoned: every later call of the fabric fails instead
        };
        let Some(ep) = g.eps.get_mut(self.id) else {
            return;
        };
        let regs = std::mem::take(&mut ep.regs);
        ep.lazy = None;
        let unpinned: u64 = std::mem::take(&mut ep.pinned).into_values().sum();
        let cached = std::mem::take(&mut ep.cached);
        for q in ep.qps.iter_mut() {
            q.error = true;
            q.sealed = true;
            q.queue = VecDeque::new();
            q.cq = VecDeque::new();
            q.recvs = VecDeque::new();
        }
        let id = self.id;
        let late = std::mem::take(&mut g.late);
        g.late = late
            .into_iter()
            .filter(|l| l.ep != id && g.target_of(l.ep, l.path) != id)
            .collect();
        for key in regs.into_values().flatten() {
            g.keys.remove(&key);
        }
        g.stats.pinned_bytes = g.stats.pinned_bytes.saturating_sub(unpinned);
        for key in cached.into_values() {
            g.release_cached(&key);
        }
    }
}

/// One endpoint: implements [`Fabric`].
pub struct MemEndpoint {
    inner: Arc<Mutex<Inner>>,
    id: usize,
    paths: Vec<PathInfo>,
    pin_ns_per_page: u64,
    /// The loopback paths were made ready (counted once in [`Stats::flush_preps`]).
    flush_ready: bool,
}

/// One cached pin of a shared device: its key pair (valid on every path of the device) and bytes.
#[derive(Debug, Clone, Copy)]
struct CachedPin {
    lkey: u32,
    rkey: u32,
    bytes: u64,
}

/// Registers for one endpoint without borrowing it (what [`Fabric::pinner`] returns).
struct MemPinner {
    inner: Arc<Mutex<Inner>>,
    id: usize,
    pin_ns_per_page: u64,
}

impl MemEndpoint {
    fn pinner_of(&self) -> MemPinner {
        MemPinner {
            inner: Arc::clone(&self.inner),
            id: self.id,
            pin_ns_per_page: self.pin_ns_per_page,
        }
    }
}

impl MemPinner {
    fn delay(&self, len: u64) {
        if self.pin_ns_per_page > 0 {
            let pages = len.div_ceil(4096);
            std::thread::sleep(std::time::Duration::from_nanos(
                pages.saturating_mul(self.pin_ns_per_page),
            ));
        }
    }

    fn pin(&self, addr: u64, len: usize, kind: MemKind) -> Result<Registration> {
        let dev = lock(&self.inner, LOCK)?
            .eps
            .get(self.id)
            .and_then(|e| e.dev);
        if let Some(dev) = dev {
            return self.pin_cached(dev, addr, len, kind);
        }
        // The pin happens outside the fabric's lock, as `ibv_reg_mr` runs outside any lock of ours.
        self.delay(len as u64);
        let mut g = lock(&self.inner, LOCK)?;
        let (r, off) = g.region_range(addr, len)?;
        // Paths deferred now (checked under the fabric's lock, as an activation sets them).
        let skip = g.eps[self.id].lazy.as_ref().map_or(0, |l| l.deferred);
        let reg = g.register_on(self.id, r, off, len, skip);
        if let Some(l) = g.eps[self.id].lazy.as_mut() {
            l.ranges.insert(reg.token, (r, off, len));
        }
        g.eps[self.id].pinned.insert(reg.token, len as u64);
        g.stats.pins += 1;
        g.stats.pinned_bytes += len as u64;
        Ok(reg)
    }

    /// A registration on a shared device: a hit takes a reference on the cached pin; a miss pins
    /// (outside the fabric's lock) and files it.
    fn pin_cached(&self, dev: u64, addr: u64, len: usize, kind: MemKind) -> Result<Registration> {
        let rk = match kind {
            MemKind::Host => RegKind::Host,
            MemKind::Cuda => RegKind::Cuda,
        };
        let key = CacheKey::new(dev, addr, len as u64, rk)?;
        let mut g = lock(&self.inner, LOCK)?;
        g.region_range(addr, len)?;
        let pin = match g.cache.acquire(&key) {
            Some(p) => p,
            None => {
                // The whole pages, cut at the end of the allocation (memfab regions need not end
                // on a page).
                let (r, _) = split_addr(key.start);
                let (pstart, plen) = g.page_span(r, &key);
                drop(g);
                self.delay(plen as u64);
                g = lock(&self.inner, LOCK)?;
                let fresh = g.cached_keys(dev, r, pstart, plen);
                match g.cache.insert(key, fresh) {
                    Inserted::Filed(p) => {
                        g.stats.pins += 1;
                        g.stats.pinned_bytes += p.bytes;
                        p
                    }
                    Inserted::Raced { shared, unused } => {
                        g.keys.remove(&unused.lkey);
                        g.keys.remove(&unused.rkey);
                        shared
                    }
                    Inserted::Uncached(p) => {
                        // Past the cache's bounds: a private registration, as without a cache.
                        g.keys.remove(&p.lkey);
                        g.keys.remove(&p.rkey);
                        let (r, off) = g.region_range(addr, len)?;
                        let reg = g.register(self.id, r, off, len);
                        g.eps[self.id].pinned.insert(reg.token, len as u64);
                        g.stats.pins += 1;
                        g.stats.pinned_bytes += len as u64;
                        g.stats.cache = g.cache.stats();
                        return Ok(reg);
                    }
                }
            }
        };
        g.stats.cache = g.cache.stats();
        let npaths = g.eps[self.id].roles.len();
        g.next_token += 1;
        let token = g.next_token;
        g.eps[self.id].cached.insert(token, key);
        Ok(Registration {
            keys: vec![
                PathKeys {
                    lkey: pin.lkey,
                    rkey: pin.rkey,
                };
                npaths
            ],
            token,
            missing: 0,
        })
    }

    fn unpin(&self, reg: &Registration) -> Result<()> {
        let mut g = lock(&self.inner, LOCK)?;
        if let Some(key) = g.eps[self.id].cached.remove(&reg.token) {
            g.release_cached(&key);
            return Ok(());
        }
        let Some(keys) = g.eps[self.id].regs.remove(&reg.token) else {
            return Err(Error::InvalidArgument(format!(
                "deregistration of unknown memfab registration {}",
                reg.token
            )));
        };
        for k in keys {
            g.keys.remove(&k);
        }
        if let Some(l) = g.eps[self.id].lazy.as_mut() {
            l.ranges.remove(&reg.token);
            l.late_keys.retain(|(t, _), _| *t != reg.token);
        }
        if let Some(n) = g.eps[self.id].pinned.remove(&reg.token) {
            g.stats.pinned_bytes = g.stats.pinned_bytes.saturating_sub(n);
        }
        Ok(())
    }
}

impl Pinner for MemPinner {
    fn register(&self, mem: &Lent, kind: MemKind) -> Result<Registration> {
        self.pin(mem.addr(), mem.len(), kind)
    }
    /// Memfab has no GPUs: checked like a registration of `mem` as GPU memory.
    fn register_dmabuf(
        &self,
        mem: &Lent,
        _offset: u64,
        _fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<Registration> {
        self.pin(mem.addr(), mem.len(), MemKind::Cuda)
    }
    fn deregister(&self, reg: &Registration) -> Result<()> {
        self.unpin(reg)
    }
}

/// What a poisoned lock names (see [`crate::sync`]: it fails closed; the counters then read 0).
const LOCK: &str = "memfab";

fn split_addr(addr: u64) -> (usize, usize) {
    (
        ((addr >> 32) as usize).wrapping_sub(1),
        (addr & 0xffff_ffff) as usize,
    )
}

impl MemFab {
    /// A new, empty fabric.
    pub fn new(cfg: MemFabConfig) -> MemFab {
        MemFab {
            inner: Arc::new(Mutex::new(Inner {
                regions: Vec::new(),
                keys: HashMap::new(),
                next_key: 0x100,
                next_token: 0,
                eps: Vec::new(),
                rng: cfg.reorder_seed.unwrap_or(1).max(1),
                reorder: cfg.reorder_seed.is_some(),
                copy_data: cfg.copy_data,
                pin_ns_per_page: cfg.pin_ns_per_page,
                stats: Stats::default(),
                cache: RegCache::default(),
                executed: 0,
                kill_at: None,
                late: VecDeque::new(),
                guards: Vec::new(),
                violations: Vec::new(),
            })),
        }
    }

    /// Two connected endpoints with one data path per entry of `speeds_mbps` (Mb/s) and `loopbacks`
    /// loopback paths each (after the data paths).
    pub fn pair(&self, speeds_mbps: &[u64], loopbacks: usize) -> (MemEndpoint, MemEndpoint) {
        self.pair_on(speeds_mbps, loopbacks, None, None)
    }

    /// [`MemFab::pair`] with the endpoints on shared devices `dev_a` and `dev_b` (`None`: a device
    /// of its own): registrations on a shared device are cached, one pin per page range for all
    /// its endpoints (see the module docs).
    pub fn pair_on(
        &self,
        speeds_mbps: &[u64],
        loopbacks: usize,
        dev_a: Option<u64>,
        dev_b: Option<u64>,
    ) -> (MemEndpoint, MemEndpoint) {
        let Ok(mut g) = lock(&self.inner, LOCK) else {
            // Poisoned by an earlier panic: endpoints whose every call fails (each one locks first).
            let dead = || MemEndpoint {
                inner: Arc::clone(&self.inner),
                id: usize::MAX,
                paths: Vec::new(),
                pin_ns_per_page: 0,
                flush_ready: false,
            };
            return (dead(), dead());
        };
        let a = g.eps.len();
        let b = a + 1;
        let mut mk = |me: usize, peer: usize, dev: Option<u64>| {
            let mut paths: Vec<PathInfo> = speeds_mbps
                .iter()
                .enumerate()
                .map(|(i, &s)| PathInfo {
                    label: format!("memfab ep{me} path{i} -> ep{peer}"),
                    speed_mbps: s,
                    role: PathRole::Data,
                })
                .collect();
            for i in 0..loopbacks {
                paths.push(PathInfo {
                    label: format!("memfab ep{me} loopback{i}"),
                    speed_mbps: 0,
                    role: PathRole::Loopback,
                });
            }
            let mut qps = Vec::new();
            qps.resize_with(paths.len(), Qp::default);
            g.eps.push(Endpoint {
                peer,
                roles: paths.iter().map(|p| p.role).collect(),
                qps,
                stalled: false,
                regs: HashMap::new(),
                pinned: HashMap::new(),
                dev,
                cached: HashMap::new(),
                health_error: None,
                lazy: None,
            });
            MemEndpoint {
                inner: Arc::clone(&self.inner),
                id: me,
                paths,
                pin_ns_per_page: g.pin_ns_per_page,
                flush_ready: false,
            }
        };
        let ea = mk(a, b, dev_a);
        let eb = mk(b, a, dev_b);
        (ea, eb)
    }

    /// Allocates `len` zeroed bytes of data memory; returns its address.
    pub fn alloc(&self, len: usize) -> Result<u64> {
        let mut g = lock(&self.inner, LOCK)?;
        let r = g.alloc_region(len, false)?;
        Ok(((r as u64) + 1) << 32)
    }

    /// Writes bytes (as a CPU would).
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        let g = lock(&self.inner, LOCK)?;
        let (r, off) = g.region_range(addr, data.len())?;
        g.regions[r].words.store_bytes(off, data)
    }

    /// Reads bytes (as a CPU would).
    pub fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>> {
        let g = lock(&self.inner, LOCK)?;
        let (r, off) = g.region_range(addr, len)?;
        let mut v = vec![0u8; len];
        g.regions[r].words.load_bytes(off, &mut v)?;
        Ok(v)
    }

    /// The next work request executed on `path` of `ep` fails with `status`; the path then fails
    /// everything after it with `WR_FLUSH_ERR`.
    pub fn fail_next(&self, ep: EpId, path: usize, status: WcStatus) {
        let Ok(mut g) = lock(&self.inner, LOCK) else {
            return;
        };
        if let Some(q) = g.eps.get_mut(ep.0).and_then(|e| e.qps.get_mut(path)) {
            q.fault = Some(status);
        }
    }

    /// Pulls the cable of data path `path` between `ep` and its peer: both ends' queue pairs fail
    /// (queued work and posted receives complete with `WR_FLUSH_ERR`, later work with it too) and
    /// cannot be rebuilt until [`MemFab::restore_path`].
    pub fn kill_path(&self, ep: EpId, path: usize) {
        if let Ok(mut g) = lock(&self.inner, LOCK) {
            g.kill(ep.0, path);
        }
    }

    /// Kills `path` of `ep` (as [`MemFab::kill_path`]) just before the fabric executes its
    /// `ops`-th work request from now, on any path; with `partial`, when that work request is a
    /// write on the killed path, half its bytes land first (a write cut mid-way).
    pub fn kill_after(&self, ep: EpId, path: usize, ops: u64, partial: bool) {
        self.fault_after(ep, path, ops, partial, InFlight::Drop);
    }

    /// [`MemFab::kill_after`] with a choice of what becomes of the work in flight on the path
    /// (queued at either end when the fault strikes): see [`InFlight`].
    pub fn fault_after(&self, ep: EpId, path: usize, ops: u64, partial: bool, mode: InFlight) {
        let Ok(mut g) = lock(&self.inner, LOCK) else {
            return;
        };
        let at = g.executed + ops;
        g.kill_at = Some(KillAt {
            at,
            ep: ep.0,
            path,
            partial,
            mode,
        });
    }

    /// Lands every write an [`InFlight::Delay`] fault still holds, now (those whose target's end
    /// was sealed are dropped).
    pub fn deliver_late(&self) {
        if let Ok(mut g) = lock(&self.inner, LOCK) {
            g.land_late(true);
        }
    }

    /// Writes an [`InFlight::Delay`] fault still holds.
    pub fn late_pending(&self) -> usize {
        lock(&self.inner, LOCK).map_or(0, |g| g.late.len())
    }

    /// Guards `[addr, addr+len)` (a completed receive's buffer, `what` names it): every write that
    /// lands in it from now until [`MemFab::unguard`] is recorded ([`MemFab::violations`]).
    pub fn guard(&self, addr: u64, len: usize, what: &str) {
        let Ok(mut g) = lock(&self.inner, LOCK) else {
            return;
        };
        let (region, start) = split_addr(addr);
        g.guards.push(Guard {
            region,
            start,
            len,
            what: what.to_string(),
        });
    }

    /// Ends the guards that start at `addr` (the buffer is posted again).
    pub fn unguard(&self, addr: u64) {
        let Ok(mut g) = lock(&self.inner, LOCK) else {
            return;
        };
        let (region, start) = split_addr(addr);
        g.guards.retain(|x| x.region != region || x.start != start);
    }

    /// Every write that landed in a guarded range, described.
    pub fn violations(&self) -> Vec<String> {
        lock(&self.inner, LOCK).map_or_else(|_| Vec::new(), |g| g.violations.clone())
    }

    /// Whether a kill from [`MemFab::kill_after`] is still to come.
    pub fn kill_pending(&self) -> bool {
        lock(&self.inner, LOCK).is_ok_and(|g| g.kill_at.is_some())
    }

    /// Puts the cable of `path` between `ep` and its peer back: each end can now rebuild its queue
    /// pair ([`Fabric::revive_path`]).
    pub fn restore_path(&self, ep: EpId, path: usize) {
        let Ok(mut g) = lock(&self.inner, LOCK) else {
            return;
        };
        let Some(peer) = g.eps.get(ep.0).map(|e| e.peer) else {
            return;
        };
        for e in [ep.0, peer] {
            if let Some(q) = g.eps.get_mut(e).and_then(|x| x.qps.get_mut(path)) {
                q.carrier_down = false;
            }
        }
    }

    /// Whether `path` of `ep` is sealed (nothing lands at that end any more).
    pub fn sealed(&self, ep: EpId, path: usize) -> bool {
        lock(&self.inner, LOCK).is_ok_and(|g| {
            g.eps
                .get(ep.0)
                .and_then(|e| e.qps.get(path))
                .is_some_and(|q| q.sealed)
        })
    }

    /// The two endpoints the latest [`MemFab::pair`] made (a test that did not make them itself,
    /// e.g. through the plugin, finds them here to inject faults).
    pub fn newest_pair(&self) -> Option<(EpId, EpId)> {
        let n = lock(&self.inner, LOCK).map_or(0, |g| g.eps.len());
        (n >= 2).then(|| (EpId(n - 2), EpId(n - 1)))
    }

    /// Work requests executed so far (to pick a [`MemFab::kill_after`] point).
    pub fn executed(&self) -> u64 {
        lock(&self.inner, LOCK).map_or(0, |g| g.executed)
    }

    /// Makes [`Fabric::health`] of `ep` fail with `error` (what a verbs device reporting a dead port
    /// would cause), or succeed again with `None`.
    pub fn set_health_error(&self, ep: EpId, error: Option<&str>) {
        let Ok(mut g) = lock(&self.inner, LOCK) else {
            return;
        };
        if let Some(e) = g.eps.get_mut(ep.0) {
            e.health_error = error.map(str::to_string);
        }
    }

    /// Makes `path` of `ep` report `note` from [`Fabric::path_note`] (what a verbs device would say
    /// about its port), or nothing with `None`.
    pub fn set_path_note(&self, ep: EpId, path: usize, note: Option<&str>) {
        let Ok(mut g) = lock(&self.inner, LOCK) else {
            return;
        };
        if let Some(q) = g.eps.get_mut(ep.0).and_then(|e| e.qps.get_mut(path)) {
            q.note = note.map(str::to_string);
        }
    }

    /// Stops (or resumes) executing `ep`'s work requests: its peer sees nothing more from it and its
    /// own requests get no completions (a link or peer that stops answering).
    pub fn stall(&self, ep: EpId, stalled: bool) {
        let Ok(mut g) = lock(&self.inner, LOCK) else {
            return;
        };
        if let Some(e) = g.eps.get_mut(ep.0) {
            e.stalled = stalled;
        }
        if !stalled && !g.reorder {
            let n = g.eps.get(ep.0).map_or(0, |e| e.qps.len());
            for p in 0..n {
                g.run_queue(ep.0, p);
            }
        }
    }

    /// Executes every queued work request of non-stalled endpoints.
    pub fn deliver_all(&self) {
        let Ok(mut g) = lock(&self.inner, LOCK) else {
            return;
        };
        for ep in 0..g.eps.len() {
            for p in 0..g.eps[ep].qps.len() {
                g.run_queue(ep, p);
            }
        }
    }

    /// Reorder mode: executes a few queued work requests (what any poll does); no-op otherwise.
    pub fn step(&self) {
        let Ok(mut g) = lock(&self.inner, LOCK) else {
            return;
        };
        if g.reorder {
            g.deliver_some();
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        lock(&self.inner, LOCK).map_or_else(|_| Stats::default(), |g| g.stats.clone())
    }

    /// Bytes of data memory pinned now on shared device `dev` ([`MemFab::pair_on`]): its cached
    /// pins' bytes once each, plus the private registrations of its endpoints (past the cache's
    /// bounds). [`Stats::pinned_bytes`] is the same over every device.
    pub fn pinned_bytes_on(&self, dev: u64) -> u64 {
        lock(&self.inner, LOCK).map_or(0, |g| {
            let cached: u64 = g
                .cache
                .pins()
                .filter(|(k, _)| k.dev == dev)
                .map(|(_, p)| p.bytes)
                .sum();
            let private: u64 = g
                .eps
                .iter()
                .filter(|e| e.dev == Some(dev))
                .flat_map(|e| e.pinned.values())
                .sum();
            cached.saturating_add(private)
        })
    }

    /// Payload bytes written so far by `ep` on `path` (striping checks).
    pub fn path_bytes(&self, ep: EpId, path: usize) -> u64 {
        lock(&self.inner, LOCK).map_or(0, |g| {
            g.eps
                .get(ep.0)
                .and_then(|e| e.qps.get(path))
                .map_or(0, |q| q.bytes)
        })
    }

    /// Number of receives posted and not yet consumed on `path` of `ep`.
    pub fn posted_recvs(&self, ep: EpId, path: usize) -> usize {
        lock(&self.inner, LOCK).map_or(0, |g| {
            g.eps
                .get(ep.0)
                .and_then(|e| e.qps.get(path))
                .map_or(0, |q| q.recvs.len())
        })
    }

    /// Number of live memory keys (leak checks after close).
    pub fn live_keys(&self) -> usize {
        lock(&self.inner, LOCK).map_or(0, |g| g.keys.len())
    }

    /// Data registrations of endpoint `ep` that have keys on its path `path` (control memory
    /// not counted): what a standby path's device would have pinned.
    pub fn registrations_on(&self, ep: EpId, path: usize) -> usize {
        lock(&self.inner, LOCK).map_or(0, |g| {
            g.keys
                .values()
                .filter(|k| k.ep == ep.0 && k.path == path && !g.is_ctrl(k.region))
                .count()
                / 2
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::fabric::{LocalSeg, RemoteSeg};

    fn setup() -> (
        MemFab,
        MemEndpoint,
        MemEndpoint,
        u64,
        Registration,
        u64,
        Registration,
    ) {
        let fab = MemFab::new(MemFabConfig::default());
        let (mut a, mut b) = fab.pair(&[100, 100], 0);
        let src = fab.alloc(64).unwrap();
        let dst = fab.alloc(64).unwrap();
        let ra = a
            .register(&Lent::simulated(src, 64), MemKind::Host)
            .unwrap();
        let rb = b
            .register(&Lent::simulated(dst, 64), MemKind::Host)
            .unwrap();
        (fab, a, b, src, ra, dst, rb)
    }

    fn wr(
        src: u64,
        ra: &Registration,
        dst: u64,
        rb: &Registration,
        path: usize,
        imm: Option<u32>,
    ) -> WriteWr {
        WriteWr {
            wr_id: 7,
            local: LocalSeg {
                addr: src,
                len: 16,
                lkey: ra.keys[path].lkey,
            },
            remote: RemoteSeg {
                addr: dst,
                rkey: rb.keys[path].rkey,
            },
            imm,
            signaled: true,
            inline: false,
        }
    }

    #[test]
    fn write_with_imm_needs_a_posted_receive() {
        let (fab, mut a, mut b, src, ra, dst, rb) = setup();
        fab.write(src, &[9; 16]).unwrap();
        a.post_write(0, &wr(src, &ra, dst, &rb, 0, Some(5)))
            .unwrap();
        let mut out = Vec::new();
        a.poll(0, 8, &mut out).unwrap();
        assert_eq!(out[0].status, WcStatus::RNR_RETRY_EXC_ERR);
        // The path is now in error: later requests are flushed.
        a.post_write(0, &wr(src, &ra, dst, &rb, 0, None)).unwrap();
        out.clear();
        a.poll(0, 8, &mut out).unwrap();
        assert_eq!(out[0].status, WcStatus::WR_FLUSH_ERR);
        // Path 1 still works.
        b.post_recv(1, 42).unwrap();
        a.post_write(1, &wr(src, &ra, dst, &rb, 1, Some(5)))
            .unwrap();
        out.clear();
        b.poll(1, 8, &mut out).unwrap();
        assert_eq!(out[0].imm, Some(5));
        assert_eq!(out[0].wr_id, 42);
        assert_eq!(out[0].byte_len, 16);
        assert_eq!(fab.read(dst, 16).unwrap(), vec![9; 16]);
    }

    #[test]
    fn keys_are_per_path_and_checked() {
        let (_fab, mut a, _b, src, ra, dst, rb) = setup();
        // rkey of path 1 used on path 0.
        let mut w = wr(src, &ra, dst, &rb, 0, None);
        w.remote.rkey = rb.keys[1].rkey;
        a.post_write(0, &w).unwrap();
        let mut out = Vec::new();
        a.poll(0, 8, &mut out).unwrap();
        assert_eq!(out[0].status, WcStatus::REM_ACCESS_ERR);
        // Out of range on path 1.
        let mut w = wr(src, &ra, dst, &rb, 1, None);
        w.remote.addr = dst + 60;
        a.post_write(1, &w).unwrap();
        out.clear();
        a.poll(1, 8, &mut out).unwrap();
        assert_eq!(out[0].status, WcStatus::REM_ACCESS_ERR);
    }

    #[test]
    fn a_poisoned_fabric_fails_every_call_and_drops_quietly() {
        let (fab, mut a, b, src, _ra, _dst, _rb) = setup();
        let inner = Arc::clone(&fab.inner);
        let _ = std::thread::spawn(move || {
            let _g = inner.lock().unwrap();
            panic!("poison the memfab");
        })
        .join();
        let want = Error::Internal("memfab lock poisoned by an earlier panic".into());
        assert_eq!(a.post_recv(0, 1).unwrap_err(), want);
        assert_eq!(a.ctrl_load(src, Ordering::Acquire).unwrap_err(), want);
        assert_eq!(fab.alloc(8).unwrap_err(), want);
        assert_eq!(a.path_note(0), None);
        assert_eq!(fab.stats(), Stats::default());
        let (mut c, _d) = fab.pair(&[100], 0);
        assert!(c.paths().is_empty());
        assert_eq!(
            c.register(&Lent::simulated(src, 8), MemKind::Host)
                .unwrap_err(),
            want
        );
        drop((a, b));
    }

    #[test]
    fn stalled_endpoint_executes_nothing_until_resumed() {
        let (fab, mut a, _b, src, ra, dst, rb) = setup();
        fab.stall(a.id(), true);
        a.post_write(0, &wr(src, &ra, dst, &rb, 0, None)).unwrap();
        let mut out = Vec::new();
        assert_eq!(a.poll(0, 8, &mut out).unwrap(), 0);
        fab.stall(a.id(), false);
        assert_eq!(a.poll(0, 8, &mut out).unwrap(), 1);
        assert!(out[0].status.is_success());
    }
}
