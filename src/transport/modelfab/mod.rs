//! A rate-modelled [`Fabric`](crate::transport::fabric::Fabric) in virtual time: the real protocol (`comm`) over paths that have a line
//! rate, a latency, RoCE v2 framing and optional shared PCIe caps, with completions delivered by a
//! discrete-event clock. Runs are deterministic and identical on any machine.
//!
//! * Hosts and connections: [`ModelFab::pair`] connects host `a` to host `b` with the paths of the
//!   [`Topology`] (every pair of hosts alike), or of the [`Mesh`] ([`ModelFab::mesh`]: wires per
//!   host pair, PCIe roots per host, relay paths through a third host). Every connection between
//!   the same two hosts shares the same cables (a second channel adds no capacity); paths tagged
//!   with one PCIe root share that root's cap on each host.
//! * Time: nothing happens while the callers run. Posted work requests wait until
//!   [`ModelFab::advance`], which starts them (in a fixed order: endpoint, path, post order), moves
//!   the clock to the next event and executes every event due then. A caller advances when it has
//!   nothing else to do, so the protocol's own CPU time counts as zero.
//! * A write of `len` bytes on a path crosses the sender's PCIe root (if the path has one: `len`
//!   bytes against the cap), the wire (its wire bytes at the line rate) and the receiver's root at
//!   once (cut through), after its queue pair's previous write. The writes in flight share every
//!   stage max-min fairly (`fluid.rs`), as NIC ports and PCIe links interleave packets. A write's
//!   data lands one latency after its last bit is through (the receive completion, the bytes in
//!   memory); the sender's completion comes one more latency later (the RC acknowledgement, whose
//!   own bytes are not modelled).
//! * A relay path ([`mesh`]) forwards a write in chunks of at most one staging slot: each chunk
//!   crosses the first leg into the relay host's staging memory (its staging root), waits there
//!   until it has all arrived, then crosses the second leg; a slot is free again when the second
//!   leg's write is acknowledged. The write lands when its last chunk does; the sender's
//!   completion comes both legs' latencies later (acknowledged end to end).
//! * Memory is the fabric's, as in [`super::memfab`] (addresses `((region + 1) << 32) | offset`, keys
//!   per path, checked like a NIC would); with [`ModelFabConfig::copy_data`] off, data buffers have no
//!   backing store and only control memory is written.
//! * [`ModelFab::set_rate_at`] changes a path's rate at a virtual time (its nominal speed stays);
//!   [`ModelFab::kill_path_at`] pulls its cable then (uniform topologies).
//! * [`ModelFab::trace`] lists executed events (when tracing); [`ModelFab::trace_hash`] digests them
//!   always, so two runs can be compared.
//!
//! The pure parts (rates, framing, the spec syntax) are in [`link`], the mesh description in
//! [`mesh`], the rate sharing in `fluid.rs`; the endpoint's `Fabric` calls in `endpoint.rs`.
#![forbid(unsafe_code)]

mod endpoint;
mod fluid;
pub mod link;
pub mod mesh;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::transport::fabric::{
    Completion, PathInfo, PathKeys, PathRole, Registration, WcOpcode, WcStatus, WriteWr,
};
pub use link::{Framing, PathModel, Topology};
pub use mesh::{Mesh, MeshPath, MeshRoot, MeshWire, RelayRule, Staging};

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
    /// Payload bytes relay hosts forwarded (second legs done).
    pub relayed_bytes: u64,
    /// Per path index (of the endpoint that posted), what the writes delivered there cost.
    pub paths: Vec<PathStats>,
}

/// What the writes delivered on one path cost: work requests and packets (issue 36: packets are
/// message rate on a NIC, and CPU in a soft-RoCE lab).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PathStats {
    /// Work requests (writes) delivered.
    pub work_requests: u64,
    /// Writes that carried an immediate (each consumed a posted receive).
    pub imm_writes: u64,
    /// Signaled writes (a completion at the poster).
    pub signaled: u64,
    /// Data packets ([`link::Framing::packets`]).
    pub packets: u64,
    /// Acknowledgement packets: one per write, as an RC responder acknowledges a message's last
    /// packet (rxe does; a NIC may coalesce them).
    pub acks: u64,
}

impl PathStats {
    /// Adds `o`.
    pub fn add(&mut self, o: &PathStats) {
        self.work_requests += o.work_requests;
        self.imm_writes += o.imm_writes;
        self.signaled += o.signaled;
        self.packets += o.packets;
        self.acks += o.acks;
    }
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
    /// Posted, not yet started.
    pending: VecDeque<WriteWr>,
    cq: VecDeque<Completion>,
    recvs: VecDeque<u64>,
    error: bool,
    /// Work requests started so far (the next one's number).
    seq: u64,
    bytes: u64,
    /// A direct path's write on its way (its number): a queue pair sends its writes one after the
    /// other.
    active: Option<(u64, WriteWr)>,
    relay: RelayQp,
}

/// A relay path's writes on their way, in chunks.
#[derive(Default)]
struct RelayQp {
    /// Writes whose last chunk has not crossed the second leg, oldest first, with their numbers.
    writes: VecDeque<(u64, WriteWr)>,
    /// Chunks not yet on the first leg.
    queued: VecDeque<Chunk>,
    /// On the first leg.
    first: Option<Chunk>,
    /// Through the first leg, within its latency.
    landing: VecDeque<Chunk>,
    /// In the relay host's staging memory, waiting for the second leg.
    staged: VecDeque<Chunk>,
    /// On the second leg.
    second: Option<Chunk>,
    /// Staging slots free.
    free: usize,
}

#[derive(Debug, Clone, Copy)]
struct Chunk {
    len: u64,
    /// The last chunk of its write (it carries the write's immediate).
    last: bool,
    imm: bool,
}

/// One way across: the stages crossed at once, and the latency after.
#[derive(Debug, Clone, Copy)]
struct Hop {
    tx_root: Option<Resource>,
    wire: Resource,
    rx_root: Option<Resource>,
    latency_ps: u64,
}

/// A path of an endpoint, towards its peer.
#[derive(Debug, Clone, Copy)]
enum Route {
    Direct(Hop),
    /// Through relay host `via`, whose staging memory is the end of `first` and the start of
    /// `second`.
    Relay {
        via: usize,
        first: Hop,
        second: Hop,
    },
}

impl Route {
    /// From a write landing to the sender's completion.
    fn ack_ps(&self) -> u64 {
        match self {
            Route::Direct(h) => h.latency_ps,
            Route::Relay { first, second, .. } => first.latency_ps + second.latency_ps,
        }
    }
}

/// What a transfer of the fluid model is part of: (endpoint, path).
#[derive(Debug, Clone, Copy)]
enum Owner {
    Direct(usize, usize),
    First(usize, usize),
    Second(usize, usize),
}

/// Relay steps due at a time: a chunk reaches the staging memory; a slot is free again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    AtRelay(usize, usize),
    SlotFree(usize, usize),
}

struct Endpoint {
    key: EpKey,
    host: usize,
    peer: usize,
    qps: Vec<Qp>,
    routes: Vec<Route>,
    regs: HashMap<u64, Vec<u32>>,
    gone: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Resource {
    /// The wire from host to host on path index (uniform topology).
    Wire(usize, usize, usize),
    /// Mesh wire, from its end 0 or 1.
    Cable(usize, usize),
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
    /// The mesh, for a fabric made by [`ModelFab::mesh`].
    mesh: Option<Mesh>,
    framing: Framing,
    root_index: Vec<Option<usize>>,
    /// Cap per root (topology or mesh root index), b/s.
    cap_bps: Vec<u64>,
    /// Line rate per topology path or mesh wire, b/s.
    rates: Vec<u64>,
    copy_data: bool,
    now: u64,
    events: BinaryHeap<Reverse<Event>>,
    /// The transfers on their way and their rates.
    fluid: fluid::Fluid<Resource, Owner>,
    /// Relay steps due: (time, order of creation, what).
    timers: BinaryHeap<Reverse<(u64, u64, Timer)>>,
    next_timer: u64,
    /// Payload bytes each host forwarded as a relay.
    relayed: Vec<u64>,
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
    #[allow(clippy::too_many_arguments)]
    fn new(
        topo: Topology,
        mesh: Option<Mesh>,
        root_index: Vec<Option<usize>>,
        cap_bps: Vec<u64>,
        rates: Vec<u64>,
        copy_data: bool,
        trace: bool,
    ) -> Inner {
        let hosts = mesh.as_ref().map_or(0, |m| m.hosts);
        Inner {
            framing: topo.framing,
            topo,
            mesh,
            root_index,
            cap_bps,
            rates,
            copy_data,
            now: 0,
            events: BinaryHeap::new(),
            fluid: fluid::Fluid::default(),
            timers: BinaryHeap::new(),
            next_timer: 0,
            relayed: vec![0; hosts],
            regions: Vec::new(),
            keys: HashMap::new(),
            next_key: 0x100,
            next_token: 0,
            eps: Vec::new(),
            by_key: Vec::new(),
            serials: HashMap::new(),
            stats: Stats::default(),
            trace: trace.then(Vec::new),
            hash: 0xcbf2_9ce4_8422_2325,
            touched: Vec::new(),
            rate_changes: Vec::new(),
        }
    }

    fn uniform_only(&self, what: &str) -> Result<()> {
        match self.mesh {
            Some(_) => Err(Error::InvalidUsage(format!(
                "{what} names a path of every connection; a mesh fabric's connections have paths of their own"
            ))),
            None => Ok(()),
        }
    }

    /// The paths of the `serial`-th connection from `a` to `b`, for each end (index by index the
    /// same cables), with their labels and speeds.
    #[allow(clippy::type_complexity)]
    fn routes(
        &self,
        a: usize,
        b: usize,
        serial: u64,
    ) -> Result<(Vec<(Route, PathInfo)>, Vec<(Route, PathInfo)>)> {
        let Some(m) = &self.mesh else {
            let side = |from: usize, to: usize| -> Vec<(Route, PathInfo)> {
                self.topo
                    .paths
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let hop = Hop {
                            tx_root: self.root_index[i].map(|r| Resource::RootTx(from, r)),
                            wire: Resource::Wire(from, to, i),
                            rx_root: self.root_index[i].map(|r| Resource::RootRx(to, r)),
                            latency_ps: p.latency_ps,
                        };
                        let info = PathInfo {
                            label: format!(
                                "model host{from} path{i} -> host{to} ({}, {})",
                                link::rate_text(p.rate_bps),
                                link::ps_text(p.latency_ps)
                            ),
                            speed_mbps: p.rate_bps / 1_000_000,
                            role: PathRole::Data,
                        };
                        (Route::Direct(hop), info)
                    })
                    .collect()
            };
            return Ok((side(a, b), side(b, a)));
        };
        if a >= m.hosts || b >= m.hosts || a == b {
            return Err(Error::InvalidArgument(format!(
                "model mesh: a connection from host {a} to host {b}; two different hosts of 0..{} accepted",
                m.hosts
            )));
        }
        let hop = |l: &mesh::Leg| Hop {
            tx_root: l.tx_root.map(|r| Resource::RootTx(l.from, r)),
            wire: Resource::Cable(l.wire, l.end),
            rx_root: l.rx_root.map(|r| Resource::RootRx(l.to, r)),
            latency_ps: l.latency_ps,
        };
        let side = |from: usize, to: usize| -> Result<Vec<(Route, PathInfo)>> {
            let rs = m.routes(from, to, serial)?;
            let infos = m.describe(&rs);
            Ok(rs
                .iter()
                .zip(infos)
                .map(|(r, (label, speed_mbps))| {
                    let route = match r {
                        mesh::MeshRoute::Direct(l) => Route::Direct(hop(l)),
                        mesh::MeshRoute::Relay { via, first, second } => Route::Relay {
                            via: *via,
                            first: hop(first),
                            second: hop(second),
                        },
                    };
                    (
                        route,
                        PathInfo {
                            label,
                            speed_mbps,
                            role: PathRole::Data,
                        },
                    )
                })
                .collect())
        };
        Ok((side(a, b)?, side(b, a)?))
    }

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

    /// Starts what was posted on every queue pair that can take it, in endpoint key, path, post
    /// order.
    fn start_ready(&mut self) {
        for k in 0..self.by_key.len() {
            let ep = self.by_key[k];
            for path in 0..self.eps[ep].qps.len() {
                self.start_path(ep, path);
            }
        }
    }

    /// Starts posted writes of one queue pair: a direct path's next one when none is on its way;
    /// every one on a relay path (as chunks queued for the first leg).
    fn start_path(&mut self, ep: usize, path: usize) {
        let now = self.now;
        let route = self.eps[ep].routes[path];
        loop {
            let slot = self
                .mesh
                .as_ref()
                .map_or(u64::MAX, |m| m.staging.slot_bytes);
            let q = &mut self.eps[ep].qps[path];
            if matches!(route, Route::Direct(_)) && q.active.is_some() {
                return;
            }
            let Some(wr) = q.pending.pop_front() else {
                break;
            };
            let seq = q.seq;
            q.seq += 1;
            if q.error {
                let c =
                    Completion::without_data(wr.wr_id, WcStatus::WR_FLUSH_ERR, WcOpcode::RdmaWrite);
                self.push(now, 1, ep, path, seq, Action::Complete(c));
                continue;
            }
            let len = u64::from(wr.local.len);
            match route {
                Route::Direct(hop) => {
                    q.active = Some((seq, wr));
                    self.start_hop(hop, len, wr.imm.is_some(), Owner::Direct(ep, path));
                    return;
                }
                Route::Relay { .. } => {
                    let n = len.div_ceil(slot).max(1);
                    for i in 0..n {
                        let last = i + 1 == n;
                        q.relay.queued.push_back(Chunk {
                            len: if last { len - slot * (n - 1) } else { slot },
                            last,
                            imm: last && wr.imm.is_some(),
                        });
                    }
                    q.relay.writes.push_back((seq, wr));
                }
            }
        }
        self.relay_first(ep, path);
    }

    /// Starts a transfer of `len` payload bytes across `hop`'s stages.
    fn start_hop(&mut self, hop: Hop, len: u64, imm: bool, owner: Owner) {
        let bits = len * 8;
        let mut stages = Vec::with_capacity(3);
        if let Some(r) = hop.tx_root {
            stages.push(fluid::Stage { res: r, bits });
        }
        stages.push(fluid::Stage {
            res: hop.wire,
            bits: self.framing.wire_bytes(len, imm) * 8,
        });
        if let Some(r) = hop.rx_root {
            stages.push(fluid::Stage { res: r, bits });
        }
        let (rates, caps) = (&self.rates, &self.cap_bps);
        self.fluid
            .start(self.now, &stages, owner, &|r| cap_of(rates, caps, r));
    }

    /// Sends a relay path's next chunk on its first leg if the leg is free and the relay host has
    /// a staging slot for it. The first leg also carries the chunk's descriptor for the relay (the
    /// receiver's address, key and immediate): counted as an immediate's bytes.
    fn relay_first(&mut self, ep: usize, path: usize) {
        let Route::Relay { first, .. } = self.eps[ep].routes[path] else {
            return;
        };
        let r = &mut self.eps[ep].qps[path].relay;
        if r.first.is_some() || r.free == 0 {
            return;
        }
        let Some(c) = r.queued.pop_front() else {
            return;
        };
        r.free -= 1;
        r.first = Some(c);
        self.start_hop(first, c.len, true, Owner::First(ep, path));
    }

    /// Sends the next staged chunk on the second leg if the leg is free.
    fn relay_second(&mut self, ep: usize, path: usize) {
        let Route::Relay { second, .. } = self.eps[ep].routes[path] else {
            return;
        };
        let r = &mut self.eps[ep].qps[path].relay;
        if r.second.is_some() {
            return;
        }
        let Some(c) = r.staged.pop_front() else {
            return;
        };
        r.second = Some(c);
        self.start_hop(second, c.len, c.imm, Owner::Second(ep, path));
    }

    fn timer(&mut self, at: u64, what: Timer) {
        self.next_timer += 1;
        self.timers.push(Reverse((at, self.next_timer, what)));
    }

    /// A transfer is through its stages.
    fn transfer_done(&mut self, owner: Owner) {
        let now = self.now;
        match owner {
            Owner::Direct(ep, path) => {
                let lat = self.eps[ep].routes[path].ack_ps();
                if let Some((seq, wr)) = self.eps[ep].qps[path].active.take() {
                    self.push(
                        now.saturating_add(lat),
                        0,
                        ep,
                        path,
                        seq,
                        Action::Deliver(wr),
                    );
                }
                self.start_path(ep, path);
            }
            Owner::First(ep, path) => {
                let Route::Relay { first, .. } = self.eps[ep].routes[path] else {
                    return;
                };
                let r = &mut self.eps[ep].qps[path].relay;
                if let Some(c) = r.first.take() {
                    r.landing.push_back(c);
                    self.timer(
                        now.saturating_add(first.latency_ps),
                        Timer::AtRelay(ep, path),
                    );
                }
                self.relay_first(ep, path);
            }
            Owner::Second(ep, path) => {
                let Route::Relay { via, second, .. } = self.eps[ep].routes[path] else {
                    return;
                };
                let r = &mut self.eps[ep].qps[path].relay;
                if let Some(c) = r.second.take() {
                    let land = if c.last { r.writes.pop_front() } else { None };
                    self.stats.relayed_bytes += c.len;
                    if let Some(x) = self.relayed.get_mut(via) {
                        *x += c.len;
                    }
                    if let Some((seq, wr)) = land {
                        let at = now.saturating_add(second.latency_ps);
                        self.push(at, 0, ep, path, seq, Action::Deliver(wr));
                    }
                    // the slot is free once the relay host has the second leg's acknowledgement
                    let ack = now.saturating_add(2 * second.latency_ps);
                    self.timer(ack, Timer::SlotFree(ep, path));
                }
                self.relay_second(ep, path);
            }
        }
    }

    fn timer_due(&mut self, what: Timer) {
        match what {
            Timer::AtRelay(ep, path) => {
                let r = &mut self.eps[ep].qps[path].relay;
                if let Some(c) = r.landing.pop_front() {
                    r.staged.push_back(c);
                }
                self.relay_second(ep, path);
            }
            Timer::SlotFree(ep, path) => {
                self.eps[ep].qps[path].relay.free += 1;
                self.relay_first(ep, path);
            }
        }
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
        let ack = self.now.saturating_add(self.eps[ep].routes[path].ack_ps());
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
        let wire = self.framing.wire_bytes(len as u64, w.imm.is_some());
        self.stats.writes += 1;
        self.stats.bytes += len as u64;
        self.stats.wire_bytes += wire;
        if self.stats.paths.len() <= path {
            self.stats.paths.resize(path + 1, PathStats::default());
        }
        let ps = &mut self.stats.paths[path];
        ps.work_requests += 1;
        ps.imm_writes += u64::from(w.imm.is_some());
        ps.signaled += u64::from(w.signaled);
        ps.packets += self.framing.packets(len as u64);
        ps.acks += 1;
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

    /// Moves to the next time something visible happens (an event, a rate change) or nothing is
    /// left; transfers and relay steps on the way are worked through.
    fn advance(&mut self) -> Option<u64> {
        self.touched.clear();
        self.start_ready();
        loop {
            let now = self.now;
            let t = [
                self.events.peek().map(|e| e.0.t.max(now)),
                self.fluid.next_end().map(|t| t.max(now)),
                self.timers.peek().map(|e| e.0.0.max(now)),
                self.rate_changes.first().map(|c| c.0.max(now)),
            ]
            .into_iter()
            .flatten()
            .min()?;
            self.now = t;
            let mut seen = false;
            while self.rate_changes.first().is_some_and(|c| c.0 <= t) {
                seen = true;
                let (_, path, rate) = self.rate_changes.remove(0);
                if rate == 0 {
                    self.kill(path);
                } else {
                    self.rates[path] = rate;
                    self.topo.paths[path].rate_bps = rate;
                    let on: Vec<Resource> = self
                        .fluid
                        .stages()
                        .into_iter()
                        .filter(|r| matches!(r, Resource::Wire(_, _, p) if *p == path))
                        .collect();
                    let (rates, caps) = (&self.rates, &self.cap_bps);
                    self.fluid.recompute(t, &on, &|r| cap_of(rates, caps, r));
                }
            }
            // Transfers and relay steps due now (transfers first), then the events.
            loop {
                if self.fluid.next_end().is_some_and(|e| e <= t) {
                    let (rates, caps) = (&self.rates, &self.cap_bps);
                    if let Some(owner) = self.fluid.pop_due(t, &|r| cap_of(rates, caps, r)) {
                        self.transfer_done(owner);
                    }
                    continue;
                }
                if self.timers.peek().is_some_and(|e| e.0.0 <= t) {
                    if let Some(Reverse((_, _, what))) = self.timers.pop() {
                        self.timer_due(what);
                    }
                    continue;
                }
                break;
            }
            while self.events.peek().is_some_and(|e| e.0.t <= t) {
                if let Some(Reverse(e)) = self.events.pop() {
                    seen = true;
                    self.execute(e);
                }
            }
            if seen {
                return Some(t);
            }
        }
    }
}

/// A stage's capacity, b/s.
fn cap_of(rates: &[u64], caps: &[u64], r: &Resource) -> u64 {
    match *r {
        Resource::Wire(_, _, i) | Resource::Cable(i, _) => rates.get(i).copied().unwrap_or(1),
        Resource::RootTx(_, i) | Resource::RootRx(_, i) => caps.get(i).copied().unwrap_or(1),
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
        let rates = cfg.topology.paths.iter().map(|p| p.rate_bps).collect();
        Ok(ModelFab::build(Inner::new(
            cfg.topology,
            None,
            root_index,
            cap_bps,
            rates,
            cfg.copy_data,
            cfg.trace,
        )))
    }

    /// A new fabric at virtual time 0 over `mesh` (checked first).
    pub fn mesh(mesh: Mesh, copy_data: bool, trace: bool) -> Result<ModelFab> {
        mesh.validate()?;
        let cap_bps = mesh.roots.iter().map(|r| r.cap_bps).collect();
        let rates = mesh.wires.iter().map(|w| w.rate_bps).collect();
        let topo = Topology {
            framing: mesh.framing,
            ..Topology::default()
        };
        Ok(ModelFab::build(Inner::new(
            topo,
            Some(mesh),
            Vec::new(),
            cap_bps,
            rates,
            copy_data,
            trace,
        )))
    }

    fn build(inner: Inner) -> ModelFab {
        ModelFab {
            inner: Arc::new(Mutex::new(inner)),
        }
    }

    /// Two connected endpoints, on host `a` (first) and host `b`, with the topology's paths, or
    /// the mesh's paths between them (the error says why there are none).
    pub fn pair(&self, a: usize, b: usize) -> Result<(ModelEndpoint, ModelEndpoint)> {
        let mut g = lock(&self.inner)?;
        let serial = g.serials.get(&(a, b)).copied().unwrap_or(0);
        // Both ends' paths, index by index the same cables taken the two ways.
        let (ra, rb) = g.routes(a, b, serial)?;
        g.serials.insert((a, b), serial + 1);
        let (ia, ib) = (g.eps.len(), g.eps.len() + 1);
        let slots = g.mesh.as_ref().map_or(0, |m| m.staging.slots);
        let mut mk = |me: usize, host: usize, peer: usize, routes: Vec<(Route, PathInfo)>| {
            let key = EpKey {
                host: if me == ia { a } else { b },
                peer: if me == ia { b } else { a },
                serial,
                side: u8::from(me != ia),
            };
            let (routes, paths): (Vec<Route>, Vec<PathInfo>) = routes.into_iter().unzip();
            let mut qps = Vec::new();
            qps.resize_with(paths.len(), Qp::default);
            for q in qps.iter_mut() {
                q.relay.free = slots;
            }
            let at = g.by_key.partition_point(|&i| g.eps[i].key < key);
            g.by_key.insert(at, me);
            g.eps.push(Endpoint {
                key,
                host,
                peer,
                qps,
                routes,
                regs: HashMap::new(),
                gone: false,
            });
            ModelEndpoint {
                inner: Arc::clone(&self.inner),
                id: me,
                paths,
            }
        };
        let ea = mk(ia, a, ib, ra);
        let eb = mk(ib, b, ia, rb);
        Ok((ea, eb))
    }

    /// The topology every connection uses (not for a mesh).
    pub fn topology(&self) -> Result<Topology> {
        let g = lock(&self.inner)?;
        if g.mesh.is_some() {
            return Err(Error::InvalidUsage(
                "a mesh fabric has paths per host pair, not one topology".into(),
            ));
        }
        Ok(g.topo.clone())
    }

    /// The mesh, for a fabric made by [`ModelFab::mesh`].
    pub fn mesh_description(&self) -> Result<Option<Mesh>> {
        Ok(lock(&self.inner)?.mesh.clone())
    }

    /// What to report as a device's speed, Mb/s: the topology's paths together, or the most a
    /// mesh host pair's wires carry.
    pub fn nominal_mbps(&self) -> Result<u64> {
        let g = lock(&self.inner)?;
        Ok(match &g.mesh {
            None => g.topo.sum_rate_bps() / 1_000_000,
            Some(m) => {
                let mut best = 0;
                for a in 0..m.hosts {
                    for b in a + 1..m.hosts {
                        let mut wires: Vec<usize> = m
                            .paths_between(a, b)
                            .into_iter()
                            .map(|p| m.paths[p].wire)
                            .collect();
                        wires.dedup();
                        best = best.max(wires.iter().map(|&w| m.wires[w].rate_bps).sum::<u64>());
                    }
                }
                best / 1_000_000
            }
        })
    }

    /// Payload bytes each host forwarded as a relay so far (a mesh's hosts; empty otherwise).
    pub fn relayed_bytes(&self) -> Result<Vec<u64>> {
        Ok(lock(&self.inner)?.relayed.clone())
    }

    /// From virtual time `t_ps` on, `path` runs at `rate_bps` (a congested cable, a link retrained
    /// at a lower width): everything on its wire from then on, the rest of writes already on their
    /// way included, moves at the new rate. [`ModelFab::advance`] stops at `t_ps`. The paths' nominal speed
    /// (what the comms are told) stays.
    pub fn set_rate_at(&self, path: usize, t_ps: u64, rate_bps: u64) -> Result<()> {
        let mut g = lock(&self.inner)?;
        g.uniform_only("a rate change")?;
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
        g.uniform_only("a pulled cable")?;
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

    /// Starts what was posted, moves the clock to the next event and executes every event due
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
            || !g.fluid.is_empty()
            || !g.timers.is_empty()
            || g.eps.iter().any(|e| {
                e.qps
                    .iter()
                    .any(|q| !q.pending.is_empty() || !q.relay.queued.is_empty())
            }))
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
