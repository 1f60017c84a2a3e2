//! A rate-modelled [`Fabric`](crate::transport::fabric::Fabric) in virtual time: the real protocol (`comm`) over paths that have a line
//! rate, a latency, RoCE v2 framing and optional shared PCIe caps, with completions delivered by a
//! discrete-event clock. Runs are deterministic and identical on any machine.
//!
//! * Hosts and connections: [`ModelFab::pair`] connects host `a` to host `b` with the paths of the
//!   [`Topology`]. Every connection between the same two hosts shares the same cables (a second
//!   channel adds no capacity); paths tagged with one PCIe root share that root's cap on each host.
//! * Time: nothing happens while the callers run. Posted work requests wait until
//!   [`ModelFab::advance`], which schedules them (in a fixed order: endpoint, path, post order), moves
//!   the clock to the next event and executes every event due then. A caller advances when it has
//!   nothing else to do, so the protocol's own CPU time counts as zero.
//! * A write of `len` bytes on path `p` crosses, first come first served, the sender's PCIe root
//!   (if `p` is tagged with one: `len` at the cap), the wire (its wire bytes at the line rate) and
//!   the receiver's root: each stage gives it its service time and it finishes no earlier than
//!   upstream. Its data lands one latency after it leaves (the receive completion, the bytes in
//!   memory); the sender's completion comes one more latency later (the RC acknowledgement, whose
//!   own bytes are not modelled).
//! * Memory is the fabric's, as in [`super::memfab`] (addresses `((region + 1) << 32) | offset`, keys
//!   per path, checked like a NIC would); with [`ModelFabConfig::copy_data`] off, data buffers have no
//!   backing store and only control memory is written.
//! * [`ModelFab::set_rate_at`] changes a path's rate at a virtual time (its nominal speed stays);
//!   [`ModelFab::kill_path_at`] pulls its cable then.
//! * [`ModelFab::trace`] lists executed events (when tracing); [`ModelFab::trace_hash`] digests them
//!   always, so two runs can be compared.
//!
//! The pure parts (rates, framing, the spec syntax) are in [`link`]; the endpoint's `Fabric` calls in
//! `endpoint.rs`.
#![forbid(unsafe_code)]

mod endpoint;
pub mod link;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::transport::fabric::{
    Completion, PathInfo, PathKeys, PathRole, Registration, WcOpcode, WcStatus, WriteWr,
};
pub use link::{Framing, PathModel, Topology};

/// Options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFabConfig {
    /// The paths of every connection.
    pub topology: Topology,
    /// Copy payload bytes (`false`: data buffers have no backing store; control memory is always
    /// written).
    pub copy_data: bool,
    /// Keep every executed event in [`ModelFab::trace`] (the digest is kept either way).
    pub trace: bool,
}

/// What an executed event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A write's bytes landed at the target.
    Deliver,
    /// A completion reached the poster's completion queue.
    Complete,
}

/// Names an endpoint by what the program did, not by which thread got there first: the `serial`-th
/// connection from host `host` to host `peer`, `side` 0 on the connecting host, 1 on the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EpKey {
    pub host: usize,
    pub peer: usize,
    pub serial: u64,
    pub side: u8,
}

/// One executed event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceEvent {
    /// Virtual time, picoseconds.
    pub t_ps: u64,
    pub kind: EventKind,
    /// The posting endpoint and path.
    pub ep: EpKey,
    pub path: usize,
    /// Work request number on that path.
    pub seq: u64,
    /// Payload bytes.
    pub len: u32,
}

/// Counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Writes delivered.
    pub writes: u64,
    /// Payload bytes delivered.
    pub bytes: u64,
    /// Wire bytes (payload and framing) of delivered writes.
    pub wire_bytes: u64,
    /// Events executed.
    pub events: u64,
}

struct Region {
    /// `None`: a data region without backing store (copies off).
    bytes: Option<Vec<u8>>,
    len: usize,
    ctrl: bool,
}

#[derive(Debug, Clone, Copy)]
struct Key {
    ep: usize,
    path: usize,
    region: usize,
    start: usize,
    len: usize,
}

#[derive(Default)]
struct Qp {
    /// Posted, not yet scheduled.
    pending: VecDeque<WriteWr>,
    cq: VecDeque<Completion>,
    recvs: VecDeque<u64>,
    error: bool,
    /// Work requests scheduled so far (the next one's number).
    seq: u64,
    bytes: u64,
}

struct Endpoint {
    key: EpKey,
    host: usize,
    peer: usize,
    qps: Vec<Qp>,
    regs: HashMap<u64, Vec<u32>>,
    gone: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Resource {
    /// The wire from host to host on path index.
    Wire(usize, usize, usize),
    /// A host's PCIe root (index into the topology's caps), sending (DMA read) side.
    RootTx(usize, usize),
    /// A host's PCIe root, receiving (DMA write) side.
    RootRx(usize, usize),
}

#[derive(Debug, Clone, Copy)]
enum Action {
    Deliver(WriteWr),
    Complete(Completion),
}

/// Tie-break among events due at the same time: deliveries before completions, then the posting
/// endpoint, path and work request number (all fixed by the program, not by threads).
type Order = (u8, EpKey, usize, u64);

struct Event {
    t: u64,
    order: Order,
    /// The posting endpoint's index.
    ep: usize,
    action: Action,
}

impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        (self.t, self.order) == (o.t, o.order)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.t, self.order).cmp(&(o.t, o.order))
    }
}

struct Inner {
    topo: Topology,
    root_index: Vec<Option<usize>>,
    cap_bps: Vec<u64>,
    copy_data: bool,
    now: u64,
    events: BinaryHeap<Reverse<Event>>,
    busy: HashMap<Resource, u64>,
    regions: Vec<Region>,
    keys: HashMap<u32, Key>,
    next_key: u32,
    next_token: u64,
    eps: Vec<Endpoint>,
    /// Endpoint indices in [`EpKey`] order (the order posted work is scheduled in).
    by_key: Vec<usize>,
    /// Connections made so far per (host, peer).
    serials: HashMap<(usize, usize), u64>,
    stats: Stats,
    trace: Option<Vec<TraceEvent>>,
    hash: u64,
    /// Hosts whose completion queues or memory an executed event changed since the last advance.
    touched: Vec<usize>,
    /// Rate changes still to come: (virtual time ps, path, new rate b/s; 0: the cable is pulled),
    /// earliest first.
    rate_changes: Vec<(u64, usize, u64)>,
}

/// The fabric: hosts' memory, every endpoint's queues, the event queue and the virtual clock.
/// Cheap to clone (shared).
#[derive(Clone)]
pub struct ModelFab {
    inner: Arc<Mutex<Inner>>,
}

/// One endpoint: implements [`Fabric`](crate::transport::fabric::Fabric).
pub struct ModelEndpoint {
    inner: Arc<Mutex<Inner>>,
    id: usize,
    paths: Vec<PathInfo>,
}

fn lock(m: &Mutex<Inner>) -> Result<MutexGuard<'_, Inner>> {
    crate::sync::lock(m, "model fabric")
}

fn split_addr(addr: u64) -> (usize, usize) {
    (
        ((addr >> 32) as usize).wrapping_sub(1),
        (addr & 0xffff_ffff) as usize,
    )
}

impl Inner {
    fn region_range(&self, addr: u64, len: usize) -> Result<(usize, usize)> {
        let (r, off) = split_addr(addr);
        match self.regions.get(r) {
            Some(reg) if off.checked_add(len).is_some_and(|e| e <= reg.len) => Ok((r, off)),
            _ => Err(Error::InvalidArgument(format!(
                "model fabric address {addr:#x}+{len} bytes is not inside an allocated region"
            ))),
        }
    }

    fn alloc_region(&mut self, len: usize, ctrl: bool) -> Result<usize> {
        if len > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "model fabric region of {len} bytes; at most {} bytes accepted",
                u32::MAX
            )));
        }
        let bytes = (ctrl || self.copy_data).then(|| vec![0u8; len]);
        self.regions.push(Region { bytes, len, ctrl });
        Ok(self.regions.len() - 1)
    }

    fn register(&mut self, ep: usize, region: usize, start: usize, len: usize) -> Registration {
        let npaths = self.eps[ep].qps.len();
        let mut keys = Vec::with_capacity(npaths);
        let mut all = Vec::with_capacity(2 * npaths);
        for path in 0..npaths {
            let mut pk = PathKeys::default();
            for slot in [&mut pk.lkey, &mut pk.rkey] {
                self.next_key = self.next_key.wrapping_add(0x9e37).max(1);
                let key = self.next_key;
                let k = Key {
                    ep,
                    path,
                    region,
                    start,
                    len,
                };
                self.keys.insert(key, k);
                *slot = key;
                all.push(key);
            }
            keys.push(pk);
        }
        self.next_token += 1;
        let token = self.next_token;
        self.eps[ep].regs.insert(token, all);
        Registration::new(keys, token)
    }

    fn check_key(
        &self,
        key: u32,
        ep: usize,
        path: usize,
        addr: u64,
        len: usize,
    ) -> Option<(usize, usize)> {
        let k = self.keys.get(&key)?;
        let (region, off) = split_addr(addr);
        let ok = k.ep == ep
            && k.path == path
            && k.region == region
            && off >= k.start
            && off.checked_add(len).is_some_and(|e| e <= k.start + k.len);
        ok.then_some((region, off))
    }

    fn push(&mut self, t: u64, phase: u8, ep: usize, path: usize, seq: u64, action: Action) {
        let order = (phase, self.eps[ep].key, path, seq);
        self.events.push(Reverse(Event {
            t,
            order,
            ep,
            action,
        }));
    }

    /// Schedules every posted work request, in endpoint key, path, post order.
    fn schedule_pending(&mut self) {
        for k in 0..self.by_key.len() {
            let ep = self.by_key[k];
            for path in 0..self.eps[ep].qps.len() {
                while let Some(wr) = self.eps[ep].qps[path].pending.pop_front() {
                    self.schedule(ep, path, wr);
                }
            }
        }
    }

    fn schedule(&mut self, ep: usize, path: usize, wr: WriteWr) {
        let now = self.now;
        let qp = &mut self.eps[ep].qps[path];
        let seq = qp.seq;
        qp.seq += 1;
        if qp.error {
            let c = Completion::without_data(wr.wr_id, WcStatus::WR_FLUSH_ERR, WcOpcode::RdmaWrite);
            self.push(now, 1, ep, path, seq, Action::Complete(c));
            return;
        }
        let (src, dst) = (self.eps[ep].host, self.eps[self.eps[ep].peer].host);
        let pm = &self.topo.paths[path];
        let len = u64::from(wr.local.len);
        let wire = self.topo.framing.wire_bytes(len, wr.imm.is_some());
        // Stages in the order the bytes cross them: the sender's root (DMA read), the wire, the
        // receiver's root (DMA write). Each is a first-come first-served server: a write takes its
        // own service time from the stage's timeline and finishes no earlier than upstream. (The
        // receiver's root is timed as if the latency were zero; all its inputs are shifted alike.)
        let mut stages = Vec::with_capacity(3);
        let root = self.root_index[path].map(|r| (r, link::serialize_ps(len, self.cap_bps[r])));
        if let Some((r, t)) = root {
            stages.push((Resource::RootTx(src, r), t));
        }
        stages.push((
            Resource::Wire(src, dst, path),
            link::serialize_ps(wire, pm.rate_bps),
        ));
        if let Some((r, t)) = root {
            stages.push((Resource::RootRx(dst, r), t));
        }
        let (mut start, mut end) = (now, now);
        for (res, t) in stages {
            let free = self.busy.entry(res).or_insert(0);
            start = start.max(*free);
            *free = start.saturating_add(t);
            end = end.max(*free);
        }
        let arrive = end.saturating_add(pm.latency_ps);
        self.push(arrive, 0, ep, path, seq, Action::Deliver(wr));
    }

    /// Pulls the cable of `path` (every connection's): queue pairs to the error state, posted work
    /// and receives flushed; writes on the wire fail when they would have landed.
    fn kill(&mut self, path: usize) {
        for ep in 0..self.eps.len() {
            if !self.eps[ep].gone {
                self.kill_end(ep, path);
            }
        }
    }

    /// One end of `path` to the error state: posted work and receives flushed.
    fn kill_end(&mut self, ep: usize, path: usize) {
        {
            let Some(q) = self.eps.get_mut(ep).and_then(|e| e.qps.get_mut(path)) else {
                return;
            };
            q.error = true;
            while let Some(w) = q.pending.pop_front() {
                q.cq.push_back(Completion::without_data(
                    w.wr_id,
                    WcStatus::WR_FLUSH_ERR,
                    WcOpcode::RdmaWrite,
                ));
            }
            while let Some(wr_id) = q.recvs.pop_front() {
                q.cq.push_back(Completion::without_data(
                    wr_id,
                    WcStatus::WR_FLUSH_ERR,
                    WcOpcode::RecvRdmaWithImm,
                ));
            }
        }
    }

    fn fail(&mut self, ep: usize, path: usize, seq: u64, wr_id: u64, status: WcStatus, at: u64) {
        self.eps[ep].qps[path].error = true;
        let c = Completion::without_data(wr_id, status, WcOpcode::RdmaWrite);
        self.push(at, 1, ep, path, seq, Action::Complete(c));
    }

    /// Executes a write's arrival: checks, bytes, the receive completion; schedules the sender's.
    fn deliver(&mut self, ep: usize, path: usize, seq: u64, w: WriteWr) {
        let ack = self.now.saturating_add(self.topo.paths[path].latency_ps);
        let wr_id = w.wr_id;
        if self.eps[ep].qps[path].error {
            return self.fail(ep, path, seq, wr_id, WcStatus::WR_FLUSH_ERR, self.now);
        }
        let t = self.eps[ep].peer;
        if self.eps[t].gone || self.eps[t].qps[path].error {
            return self.fail(ep, path, seq, wr_id, WcStatus::RETRY_EXC_ERR, ack);
        }
        let len = w.local.len as usize;
        let Some((sr, so)) = self.check_key(w.local.lkey, ep, path, w.local.addr, len) else {
            return self.fail(ep, path, seq, wr_id, WcStatus::LOC_PROT_ERR, self.now);
        };
        let Some((dr, doff)) = self.check_key(w.remote.rkey, t, path, w.remote.addr, len) else {
            return self.fail(ep, path, seq, wr_id, WcStatus::REM_ACCESS_ERR, ack);
        };
        let recv = match w.imm {
            Some(_) => match self.eps[t].qps[path].recvs.pop_front() {
                Some(r) => Some(r),
                None => return self.fail(ep, path, seq, wr_id, WcStatus::RNR_RETRY_EXC_ERR, ack),
            },
            None => None,
        };
        if len > 0 && sr != dr {
            // Both backed (copies on, or control memory): copy; a source without backing store
            // (copies off) leaves the destination as it was.
            let (a, b) = if sr < dr {
                let (x, y) = self.regions.split_at_mut(dr);
                (&x[sr], &mut y[0])
            } else {
                let (x, y) = self.regions.split_at_mut(sr);
                (&y[0], &mut x[dr])
            };
            if let (Some(src), Some(dst)) = (a.bytes.as_ref(), b.bytes.as_mut()) {
                dst[doff..doff + len].copy_from_slice(&src[so..so + len]);
            }
        } else if len > 0 {
            if let Some(v) = self.regions[sr].bytes.as_mut() {
                v.copy_within(so..so + len, doff);
            }
        }
        let wire = self.topo.framing.wire_bytes(len as u64, w.imm.is_some());
        self.stats.writes += 1;
        self.stats.bytes += len as u64;
        self.stats.wire_bytes += wire;
        self.eps[ep].qps[path].bytes += len as u64;
        if let (Some(recv_id), Some(imm)) = (recv, w.imm) {
            self.eps[t].qps[path].cq.push_back(Completion {
                wr_id: recv_id,
                status: WcStatus::SUCCESS,
                opcode: WcOpcode::RecvRdmaWithImm,
                byte_len: w.local.len,
                imm: Some(imm),
            });
        }
        if w.signaled {
            let c = Completion::without_data(wr_id, WcStatus::SUCCESS, WcOpcode::RdmaWrite);
            self.push(ack, 1, ep, path, seq, Action::Complete(c));
        }
    }

    fn execute(&mut self, e: Event) {
        let (_, key, path, seq) = e.order;
        let ep = e.ep;
        let (kind, len) = match e.action {
            Action::Deliver(w) => (EventKind::Deliver, w.local.len),
            Action::Complete(_) => (EventKind::Complete, 0),
        };
        let te = TraceEvent {
            t_ps: e.t,
            kind,
            ep: key,
            path,
            seq,
            len,
        };
        self.hash = fold_hash(self.hash, &te);
        if let Some(t) = self.trace.as_mut() {
            t.push(te);
        }
        self.stats.events += 1;
        let host = match e.action {
            Action::Deliver(_) => self.eps[self.eps[ep].peer].host,
            Action::Complete(_) => self.eps[ep].host,
        };
        if !self.touched.contains(&host) {
            self.touched.push(host);
        }
        match e.action {
            Action::Deliver(w) => self.deliver(ep, path, seq, w),
            Action::Complete(c) => {
                if !self.eps[ep].gone {
                    self.eps[ep].qps[path].cq.push_back(c);
                }
            }
        }
    }

    fn advance(&mut self) -> Option<u64> {
        self.touched.clear();
        self.schedule_pending();
        let next_event = self.events.peek().map(|e| e.0.t.max(self.now));
        let next_change = self.rate_changes.first().map(|c| c.0.max(self.now));
        let t = match (next_event, next_change) {
            (Some(e), Some(c)) => e.min(c),
            (e, c) => e.or(c)?,
        };
        self.now = t;
        while self.rate_changes.first().is_some_and(|c| c.0 <= t) {
            let (_, path, rate) = self.rate_changes.remove(0);
            if rate == 0 {
                self.kill(path);
            } else {
                self.topo.paths[path].rate_bps = rate;
            }
        }
        while self.events.peek().is_some_and(|e| e.0.t <= t) {
            if let Some(Reverse(e)) = self.events.pop() {
                self.execute(e);
            }
        }
        Some(t)
    }
}

/// FNV-1a over the event's fields.
fn fold_hash(mut h: u64, e: &TraceEvent) -> u64 {
    let kind = match e.kind {
        EventKind::Deliver => 1u64,
        EventKind::Complete => 2,
    };
    let k = e.ep;
    let fields = [
        e.t_ps,
        kind,
        k.host as u64,
        k.peer as u64,
        k.serial,
        u64::from(k.side),
        e.path as u64,
        e.seq,
        u64::from(e.len),
    ];
    for v in fields {
        for b in v.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

impl ModelFab {
    /// A new fabric at virtual time 0.
    pub fn new(cfg: ModelFabConfig) -> Result<ModelFab> {
        let n = cfg.topology.paths.len();
        if n == 0 || n > crate::transport::stripe::MAX_PATHS {
            return Err(Error::InvalidUsage(format!(
                "a modelled connection has {n} paths; accepted: 1..={}",
                crate::transport::stripe::MAX_PATHS
            )));
        }
        let names: Vec<&String> = cfg.topology.caps.keys().collect();
        let cap_bps = cfg.topology.caps.values().copied().collect();
        let root_index = cfg
            .topology
            .paths
            .iter()
            .map(|p| {
                p.root
                    .as_ref()
                    .and_then(|r| names.iter().position(|n| *n == r))
            })
            .collect();
        Ok(ModelFab {
            inner: Arc::new(Mutex::new(Inner {
                root_index,
                cap_bps,
                topo: cfg.topology,
                copy_data: cfg.copy_data,
                now: 0,
                events: BinaryHeap::new(),
                busy: HashMap::new(),
                regions: Vec::new(),
                keys: HashMap::new(),
                next_key: 0x100,
                next_token: 0,
                eps: Vec::new(),
                by_key: Vec::new(),
                serials: HashMap::new(),
                stats: Stats::default(),
                trace: cfg.trace.then(Vec::new),
                hash: 0xcbf2_9ce4_8422_2325,
                touched: Vec::new(),
                rate_changes: Vec::new(),
            })),
        })
    }

    /// Two connected endpoints, on host `a` (first) and host `b`, with the topology's paths.
    pub fn pair(&self, a: usize, b: usize) -> Result<(ModelEndpoint, ModelEndpoint)> {
        let mut g = lock(&self.inner)?;
        let (ia, ib) = (g.eps.len(), g.eps.len() + 1);
        let serial = {
            let s = g.serials.entry((a, b)).or_insert(0);
            *s += 1;
            *s - 1
        };
        let mut mk = |me: usize, host: usize, peer: usize, peer_host: usize| {
            let key = EpKey {
                host: if me == ia { a } else { b },
                peer: if me == ia { b } else { a },
                serial,
                side: u8::from(me != ia),
            };
            let paths: Vec<PathInfo> = g
                .topo
                .paths
                .iter()
                .enumerate()
                .map(|(i, p)| PathInfo {
                    label: format!(
                        "model host{host} path{i} -> host{peer_host} ({}, {})",
                        link::rate_text(p.rate_bps),
                        link::ps_text(p.latency_ps)
                    ),
                    speed_mbps: p.rate_bps / 1_000_000,
                    role: PathRole::Data,
                })
                .collect();
            let mut qps = Vec::new();
            qps.resize_with(paths.len(), Qp::default);
            let at = g.by_key.partition_point(|&i| g.eps[i].key < key);
            g.by_key.insert(at, me);
            g.eps.push(Endpoint {
                key,
                host,
                peer,
                qps,
                regs: HashMap::new(),
                gone: false,
            });
            ModelEndpoint {
                inner: Arc::clone(&self.inner),
                id: me,
                paths,
            }
        };
        let ea = mk(ia, a, ib, b);
        let eb = mk(ib, b, ia, a);
        Ok((ea, eb))
    }

    /// The topology every connection uses.
    pub fn topology(&self) -> Result<Topology> {
        Ok(lock(&self.inner)?.topo.clone())
    }

    /// From virtual time `t_ps` on, `path` runs at `rate_bps` (a congested cable, a link retrained
    /// at a lower width): writes scheduled from then on cross its wire at the new rate; writes
    /// already on it keep theirs. [`ModelFab::advance`] stops at `t_ps`. The paths' nominal speed
    /// (what the comms are told) stays.
    pub fn set_rate_at(&self, path: usize, t_ps: u64, rate_bps: u64) -> Result<()> {
        let mut g = lock(&self.inner)?;
        if path >= g.topo.paths.len() || rate_bps == 0 {
            return Err(Error::InvalidArgument(format!(
                "rate change of path {path} to {rate_bps} b/s; accepted: paths 0..{}, a rate above 0",
                g.topo.paths.len()
            )));
        }
        let at = g.rate_changes.partition_point(|c| c.0 <= t_ps);
        g.rate_changes.insert(at, (t_ps, path, rate_bps));
        Ok(())
    }

    /// At virtual time `t_ps` the cable of `path` is pulled, for every connection: both ends' queue
    /// pairs fail (posted work and receives complete with `WR_FLUSH_ERR`, writes on the wire fail
    /// when they would have landed). [`ModelFab::advance`] stops at `t_ps`.
    pub fn kill_path_at(&self, path: usize, t_ps: u64) -> Result<()> {
        let mut g = lock(&self.inner)?;
        if path >= g.topo.paths.len() {
            return Err(Error::InvalidArgument(format!(
                "kill of path {path}; accepted: paths 0..{}",
                g.topo.paths.len()
            )));
        }
        let at = g.rate_changes.partition_point(|c| c.0 <= t_ps);
        g.rate_changes.insert(at, (t_ps, path, 0));
        Ok(())
    }

    /// Virtual time now, picoseconds.
    pub fn now_ps(&self) -> Result<u64> {
        Ok(lock(&self.inner)?.now)
    }

    /// Schedules what was posted, moves the clock to the next event and executes every event due
    /// then. Returns the new time, or `None` when nothing is in flight (the clock stays).
    pub fn advance(&self) -> Result<Option<u64>> {
        Ok(lock(&self.inner)?.advance())
    }

    /// Like [`ModelFab::advance`], and the hosts whose completion queues or memory the executed
    /// events changed (a host's polling loop has nothing new to see otherwise), sorted.
    pub fn advance_touching(&self) -> Result<Option<(u64, Vec<usize>)>> {
        let mut g = lock(&self.inner)?;
        Ok(g.advance().map(|t| {
            let mut h = std::mem::take(&mut g.touched);
            h.sort_unstable();
            (t, h)
        }))
    }

    /// Whether anything is posted or in flight.
    pub fn busy(&self) -> Result<bool> {
        let g = lock(&self.inner)?;
        Ok(!g.events.is_empty()
            || g.eps
                .iter()
                .any(|e| e.qps.iter().any(|q| !q.pending.is_empty())))
    }

    /// Allocates `len` zeroed bytes of data memory (no backing store with copies off).
    pub fn alloc(&self, len: usize) -> Result<u64> {
        let mut g = lock(&self.inner)?;
        let r = g.alloc_region(len, false)?;
        Ok(((r as u64) + 1) << 32)
    }

    /// Writes bytes (as a CPU would); a no-op on memory without backing store.
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        let mut g = lock(&self.inner)?;
        let (r, off) = g.region_range(addr, data.len())?;
        if let Some(v) = g.regions[r].bytes.as_mut() {
            v[off..off + data.len()].copy_from_slice(data);
        }
        Ok(())
    }

    /// Reads bytes into `out` (as a CPU would); leaves `out` as it is on memory without backing store.
    pub fn read_into(&self, addr: u64, out: &mut [u8]) -> Result<()> {
        let g = lock(&self.inner)?;
        let (r, off) = g.region_range(addr, out.len())?;
        if let Some(v) = g.regions[r].bytes.as_ref() {
            out.copy_from_slice(&v[off..off + out.len()]);
        }
        Ok(())
    }

    /// Whether payload bytes are copied.
    pub fn copies(&self) -> Result<bool> {
        Ok(lock(&self.inner)?.copy_data)
    }

    /// Counters so far.
    pub fn stats(&self) -> Result<Stats> {
        Ok(lock(&self.inner)?.stats.clone())
    }

    /// Payload bytes delivered so far from endpoint `ep` on `path`.
    pub fn path_bytes(&self, ep: &ModelEndpoint, path: usize) -> Result<u64> {
        let g = lock(&self.inner)?;
        Ok(g.eps[ep.id].qps.get(path).map_or(0, |q| q.bytes))
    }

    /// Executed events, when the fabric traces.
    pub fn trace(&self) -> Result<Vec<TraceEvent>> {
        Ok(lock(&self.inner)?.trace.clone().unwrap_or_default())
    }

    /// Digest of every executed event so far (equal digests: equal traces, with overwhelming odds).
    pub fn trace_hash(&self) -> Result<u64> {
        Ok(lock(&self.inner)?.hash)
    }
}
