//! The acceptor's side of the handshake as state machines: [`ListenMachine`] serves any number of
//! incoming connections until one sends a valid hello, which becomes an [`AcceptMachine`]: reply (or
//! reject), then wait for ready.
//!
//! Sans-IO, like the connector: no socket, no clock. The listener keeps each pending connection's
//! driver handle `C` (the socket in `io.rs`, a test's pipe) without touching it, so that the policy
//! of which connections to keep lives here: [`ListenMachine::admit`] for each new connection,
//! `check_hello` for each hello. Every client is a stranger until its hello carries the tag of the
//! listener's nonce (`auth.rs`): before that it learns nothing about this node (a fixed reject), and
//! what it costs is bounded ([`MAX_PENDING`], [`MAX_PENDING_PER_SOURCE`], [`MAX_PENDING_PROCESS`],
//! [`HELLO_TIMEOUT`], at most [`super::wire::MAX_PAYLOAD`] bytes buffered each). When room is
//! needed, the oldest stranger goes, never a connection whose hello is there to be checked: a real
//! connector sends its hello the moment its connection is up, so strangers cannot keep it out by
//! holding every place. Limits are stated in docs/security.md.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::auth::ConnKey;
use super::frames::Frames;
use super::wire::{Hello, Message, PathParams, PathRequest, Reply, SideParams, Tag};
use crate::error::{Error, Result};
use crate::route::handle::HandleRepr;
use crate::route::select::{Reach, check_incoming};
use crate::route::types::{KernelRoute, LinkKind, LocalLink};
use crate::transport::droplog::{self, DropLog};

/// Incoming connections a listener keeps waiting for their hello at once. A new connection that
/// finds it full takes the place of the oldest one that has no complete hello (its bytes are read
/// first: a hello that has arrived is checked, never dropped); only when every one has a hello to
/// check is the newcomer refused. Each waits at most [`HELLO_TIMEOUT`].
pub const MAX_PENDING: usize = 32;
/// Incoming connections waiting for their hello from one source IP address: a new one from an
/// address that has this many takes the place of that address's oldest (so another process on the
/// peer's host cannot lock the real connector out). A real peer has one connection per listener
/// (NCCL accepts one per listen comm), a retry at most a second.
pub const MAX_PENDING_PER_SOURCE: usize = 4;
/// Incoming connections waiting for their hello over every listener of the process
/// ([`PendingBudget::process`]). Past it, a listener makes room among its own (as when full), but
/// may always keep [`PENDING_RESERVE`]: so the process holds at most `MAX_PENDING_PROCESS +
/// PENDING_RESERVE × listeners` such sockets, and a stranger holding every other listener's places
/// still cannot keep a real connector out of this one.
pub const MAX_PENDING_PROCESS: usize = 256;
/// Places every listener keeps whatever the process-wide count ([`MAX_PENDING_PROCESS`]).
pub const PENDING_RESERVE: usize = 2;
/// Longest a connection may take to deliver a valid hello (a real connector sends it as soon as its
/// TCP connection is up): shorter when `NCCL_SWITCHLESS_CONNECT_TIMEOUT` is.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Connector nonces remembered against replays (oldest forgotten first).
pub const MAX_SEEN_NONCES: usize = 1024;

/// What a client that has not shown the listener's nonce is told: nothing about this node.
pub const UNAUTHENTICATED: &str = "hello not authenticated by this listener's nonce (a stale handle, \
                                   or another listener on a reused port)";

/// What the acceptor checks incoming paths against: this node's links and kernel routes.
#[derive(Debug, Clone, Default)]
pub struct AcceptorView {
    pub links: Vec<LocalLink>,
    pub routes: Vec<KernelRoute>,
    /// Whether routed TCP paths are accepted (`NCCL_SWITCHLESS_TCP_FALLBACK=1`, see
    /// [`crate::route::check_incoming`]).
    pub reach: Reach,
    /// Whether hellos with a relayed path (kind byte 2) are refused (`NCCL_SWITCHLESS_RELAY=off`
    /// on this host): this host then neither serves relays nor takes streams through them.
    pub refuse_relayed: bool,
}

/// One path of an incoming connection, resolved on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedPath {
    /// This node's link the connector addressed.
    pub local: LocalLink,
    /// The connector's request (its address, this node's address, kind).
    pub request: PathRequest,
    /// The connector's params for this path.
    pub peer_params: PathParams,
}

/// The count of connections waiting for their hello, shared by listeners: the process's
/// ([`PendingBudget::process`], [`MAX_PENDING_PROCESS`]) or a test's.
#[derive(Debug)]
pub struct PendingBudget {
    held: AtomicUsize,
    cap: usize,
}

impl PendingBudget {
    /// A budget of `cap` connections (tests; the plugin uses [`PendingBudget::process`]).
    pub fn new(cap: usize) -> Arc<PendingBudget> {
        Arc::new(PendingBudget {
            held: AtomicUsize::new(0),
            cap,
        })
    }

    /// The process-wide budget every [`ListenMachine::new`] shares.
    pub fn process() -> Arc<PendingBudget> {
        static PROCESS: OnceLock<Arc<PendingBudget>> = OnceLock::new();
        Arc::clone(PROCESS.get_or_init(|| PendingBudget::new(MAX_PENDING_PROCESS)))
    }

    /// Connections waiting for their hello now, over every listener sharing this budget.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    fn full(&self) -> bool {
        self.held() >= self.cap
    }
}

/// One place of a [`PendingBudget`], given back when the connection leaves the table.
#[derive(Debug)]
struct Place(Arc<PendingBudget>);

impl Place {
    fn take(b: &Arc<PendingBudget>) -> Place {
        b.held.fetch_add(1, Ordering::Relaxed);
        Place(Arc::clone(b))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection that has not sent a valid hello yet.
#[derive(Debug)]
struct Pending<C> {
    io: C,
    peer: SocketAddr,
    frames: Frames,
    deadline: Instant,
    /// Admission order (oldest first when room is needed).
    order: u64,
    /// Set when a reject is queued: send it, then drop the connection.
    rejecting: bool,
    _place: Place,
}

impl<C> Pending<C> {
    /// Whether it must keep its place: its hello is complete and waits to be checked.
    fn has_hello(&self) -> bool {
        !self.rejecting && self.frames.frame_ready()
    }

    /// Whether it can go first: a reject is on its way, or the connection failed.
    fn done(&self) -> bool {
        self.rejecting || self.frames.faulted()
    }
}

/// Which constraint a newcomer hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Room {
    Source,
    Listener,
    Process,
}

enum Advance {
    Keep,
    Drop,
    Hello(Box<Hello>, Vec<AcceptedPath>, ConnKey),
}

/// Why a hello was refused: what the client is told, and what this node logs. Once the hello's
/// tag checked out, the answer is an authenticated reject (`key`).
struct Refusal {
    public: String,
    local: String,
    key: Option<ConnKey>,
}

impl Refusal {
    /// A refusal of the authenticated hello whose connection key is `key`.
    fn both(key: &ConnKey, s: String) -> Refusal {
        Refusal {
            public: s.clone(),
            local: s,
            key: Some(key.clone()),
        }
    }
}

/// The listening side: every connection in progress and the wait for the first valid one.
#[derive(Debug)]
pub struct ListenMachine<C> {
    /// The listening port (for the handle and for errors).
    port: u16,
    nonce: u64,
    view: AcceptorView,
    /// `None`: no deadline on an accepted connection's steps (NCCL has none).
    timeout: Option<Duration>,
    pending: Vec<Pending<C>>,
    /// The next admission's order number.
    admitted: u64,
    budget: Arc<PendingBudget>,
    /// Connector nonces of hellos that were authenticated, newest last.
    seen: VecDeque<u64>,
    /// Where drop warnings are rate-limited: the process's log, or a test's own.
    drops: Arc<std::sync::Mutex<DropLog>>,
    /// Drops this listener noted, and how many of them it logged.
    dropped: u64,
    warned: u64,
}

impl<C> ListenMachine<C> {
    /// A listener on `port` whose handle carries `nonce`; `timeout` (`None`: unlimited) bounds each
    /// step of an accepted connection. A listener itself never times out: it waits for its connector
    /// as long as NCCL keeps calling `accept`. Its connections waiting for their hello count
    /// against the process's [`PendingBudget`], its drop warnings against the process's rate
    /// limit ([`droplog`]).
    pub fn new(
        port: u16,
        nonce: u64,
        view: AcceptorView,
        timeout: impl Into<Option<Duration>>,
    ) -> Self {
        let mut m = Self::with_budget(port, nonce, view, timeout, PendingBudget::process());
        m.drops = droplog::shared();
        m
    }

    /// [`ListenMachine::new`] counting against `budget` instead of the process's, with a drop log
    /// of its own (tests: machines of other tests do not share its limits).
    pub fn with_budget(
        port: u16,
        nonce: u64,
        view: AcceptorView,
        timeout: impl Into<Option<Duration>>,
        budget: Arc<PendingBudget>,
    ) -> Self {
        ListenMachine {
            port,
            nonce,
            view,
            timeout: timeout.into(),
            pending: Vec::new(),
            admitted: 0,
            budget,
            seen: VecDeque::new(),
            drops: Arc::default(),
            dropped: 0,
            warned: 0,
        }
    }

    /// The links this listener advertises and checks paths against.
    pub fn view(&self) -> &AcceptorView {
        &self.view
    }

    /// The handle to publish: the port and nonce, every link of the view that is up, and `control`
    /// as the fallback address. Also returns links that did not fit (log them).
    pub fn handle(&self, control: Option<Ipv4Addr>) -> (HandleRepr, Vec<LocalLink>) {
        HandleRepr::from_local(&self.view.links, self.port, control, self.nonce)
    }

    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    /// The listening port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Incoming connections in progress.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Drops counted but not logged (the rate limit of the drop warnings).
    pub fn unlogged_drops(&self) -> u64 {
        self.dropped - self.warned
    }

    fn hello_timeout(&self) -> Duration {
        self.timeout.map_or(HELLO_TIMEOUT, |t| t.min(HELLO_TIMEOUT))
    }

    fn drop_warn(&mut self, now: Instant, peer: SocketAddr, what: &str) {
        self.dropped += 1;
        if let Some(line) = droplog::note_in(&self.drops, now, peer.ip(), || what.to_string()) {
            self.warned += 1;
            tracing::warn!(%peer, "handshake: {line}");
        }
    }

    /// A new connection from `peer`; `io` is the driver's handle for it. Every connection comes in
    /// here, so the admission rule lives here. When `peer`'s address has
    /// [`MAX_PENDING_PER_SOURCE`] waiting, the listener [`MAX_PENDING`], or the process
    /// [`MAX_PENDING_PROCESS`] (and this listener more than [`PENDING_RESERVE`]), room is made:
    /// connections whose reject is on its way or that failed go first, then the oldest waiting
    /// one, from that address when the address is the limit. `pump` moves a candidate's bytes
    /// first (the driver's, as in its poll): a candidate whose hello has arrived keeps its place.
    /// Only when no connection can go is the new one refused and returned for the driver to close.
    #[must_use = "a refused connection is to be closed"]
    pub fn admit(
        &mut self,
        now: Instant,
        io: C,
        peer: SocketAddr,
        mut pump: impl FnMut(&mut C, &mut Frames),
    ) -> Option<C> {
        while let Some(room) = self.room_needed(peer) {
            let Some(i) = self.victim(room, peer, &mut pump) else {
                let why = match room {
                    Room::Source => format!(
                        "refused a connection: {MAX_PENDING_PER_SOURCE} connections from this address wait with their hello to check"
                    ),
                    Room::Listener | Room::Process => format!(
                        "refused a connection: {} connections wait with their hello to check",
                        self.pending.len()
                    ),
                };
                self.drop_warn(now, peer, &why);
                return Some(io);
            };
            let gone = self.pending.swap_remove(i);
            if !gone.done() {
                let why = match room {
                    Room::Source => format!(
                        "dropped the oldest of {MAX_PENDING_PER_SOURCE} connections from this address that sent no hello, for a newer one"
                    ),
                    Room::Listener => format!(
                        "dropped the oldest of {MAX_PENDING} connections that sent no hello, for a newer one"
                    ),
                    Room::Process => format!(
                        "dropped the oldest connection that sent no hello, for a newer one ({MAX_PENDING_PROCESS} wait over the process's listeners)"
                    ),
                };
                self.drop_warn(now, gone.peer, &why);
            }
        }
        let mut frames = Frames::default();
        frames.expect_frame();
        let deadline = now + self.hello_timeout();
        self.admitted += 1;
        self.pending.push(Pending {
            io,
            peer,
            frames,
            deadline,
            order: self.admitted,
            rejecting: false,
            _place: Place::take(&self.budget),
        });
        None
    }

    /// The limit a new connection from `peer` hits, if any.
    fn room_needed(&self, peer: SocketAddr) -> Option<Room> {
        let from_source = self
            .pending
            .iter()
            .filter(|p| p.peer.ip() == peer.ip())
            .count();
        if from_source >= MAX_PENDING_PER_SOURCE {
            Some(Room::Source)
        } else if self.pending.len() >= MAX_PENDING {
            Some(Room::Listener)
        } else if self.budget.full() && self.pending.len() >= PENDING_RESERVE {
            Some(Room::Process)
        } else {
            None
        }
    }

    /// The connection to drop to make `room`: a finished one, else the oldest that still has no
    /// hello once its bytes are moved (`pump`); `None` when every candidate has a hello to check.
    fn victim(
        &mut self,
        room: Room,
        peer: SocketAddr,
        pump: &mut impl FnMut(&mut C, &mut Frames),
    ) -> Option<usize> {
        let candidate = |p: &Pending<C>| room != Room::Source || p.peer.ip() == peer.ip();
        if let Some(i) = self.pending.iter().position(|p| candidate(p) && p.done()) {
            return Some(i);
        }
        let mut order: Vec<(u64, usize)> = self
            .pending
            .iter()
            .enumerate()
            .filter(|(_, p)| candidate(p) && !p.has_hello())
            .map(|(i, p)| (p.order, i))
            .collect();
        order.sort_unstable();
        for (_, i) in order {
            let p = &mut self.pending[i];
            pump(&mut p.io, &mut p.frames);
            if !p.has_hello() {
                return Some(i);
            }
        }
        None
    }

    /// Every connection in progress with its bytes, for the driver to move.
    pub fn connections(&mut self) -> impl Iterator<Item = (&mut C, &mut Frames)> {
        self.pending.iter_mut().map(|p| (&mut p.io, &mut p.frames))
    }

    /// When [`ListenMachine::poll`] must run again even if no byte moves (`None` with nothing in
    /// progress: then only a new connection moves it).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.pending.iter().map(|p| p.deadline).min()
    }

    /// Advances every pending connection. Returns the first whose hello is authenticated and whose
    /// paths all check out, with its driver handle; bad ones are logged (rate-limited) and dropped,
    /// after a reject message when the peer speaks the protocol. Never fails: a stranger's
    /// connection is that connection's problem only.
    pub fn poll(&mut self, now: Instant) -> Result<Option<(C, AcceptMachine)>> {
        let mut i = 0;
        while i < self.pending.len() {
            match self.advance(i, now) {
                Advance::Keep => i += 1,
                Advance::Drop => {
                    self.pending.swap_remove(i);
                }
                Advance::Hello(hello, paths, key) => {
                    let p = self.pending.swap_remove(i);
                    self.remember(hello.nonce);
                    let m =
                        AcceptMachine::new(now, p.peer, p.frames, *hello, paths, key, self.timeout);
                    return Ok(Some((p.io, m)));
                }
            }
        }
        Ok(None)
    }

    fn remember(&mut self, conn_nonce: u64) {
        if self.seen.len() >= MAX_SEEN_NONCES {
            self.seen.pop_front();
        }
        self.seen.push_back(conn_nonce);
    }

    fn advance(&mut self, i: usize, now: Instant) -> Advance {
        let hello_timeout = self.hello_timeout();
        let p = &mut self.pending[i];
        let peer = p.peer;
        if now >= p.deadline {
            let what = format!(
                "dropped a connection that sent no valid hello within {} ms",
                hello_timeout.as_millis()
            );
            self.drop_warn(now, peer, &what);
            return Advance::Drop;
        }
        if p.rejecting {
            // Sent or failed: either way the connection is done.
            let failed = p.frames.take_fault().is_some();
            return if failed || p.frames.flushed() {
                Advance::Drop
            } else {
                Advance::Keep
            };
        }
        if let Some(f) = p.frames.take_fault() {
            let what = format!(
                "dropped connection: {}",
                f.into_error("connector", "reading its hello")
            );
            self.drop_warn(now, peer, &what);
            return Advance::Drop;
        }
        let hello = match p.frames.take_frame() {
            None => return Advance::Keep,
            Some(Message::Hello(h)) => h,
            Some(other) => {
                let what = format!(
                    "dropped a connection that sent {} instead of a hello",
                    other.name()
                );
                self.drop_warn(now, peer, &what);
                return Advance::Drop;
            }
        };
        match check_hello(self.nonce, &self.view, &self.seen, &hello, peer) {
            Ok((paths, key)) => Advance::Hello(Box::new(hello), paths, key),
            Err(r) => {
                self.drop_warn(now, peer, &format!("rejected connection: {}", r.local));
                let p = &mut self.pending[i];
                let answer = match &r.key {
                    Some(k) => Message::Refuse(k.refuse(&hello.tag, &r.public)),
                    None => Message::Reject(r.public),
                };
                if p.frames.queue(&answer).is_err() {
                    return Advance::Drop;
                }
                p.rejecting = true;
                Advance::Keep
            }
        }
    }
}

/// The RoCE v2 GID of an IPv4 address: `::ffff:a.b.c.d`.
pub fn ipv4_mapped_gid(a: Ipv4Addr) -> [u8; 16] {
    a.to_ipv6_mapped().octets()
}

/// Whether a hello may go on: it is authenticated by `nonce` and not seen before, every path checks
/// out on this node, each RoCE path's GID is its connector address, and the connection comes from
/// where the hello says. Until the tag checks out, the client is told nothing else.
fn check_hello(
    nonce: u64,
    view: &AcceptorView,
    seen: &VecDeque<u64>,
    hello: &Hello,
    peer: SocketAddr,
) -> std::result::Result<(Vec<AcceptedPath>, ConnKey), Refusal> {
    let key = ConnKey::derive(nonce, hello.nonce);
    if !key.check_hello(hello) {
        return Err(Refusal {
            public: UNAUTHENTICATED.to_string(),
            local: format!(
                "hello from {peer} is not authenticated by this listener's nonce (connector nonce {:#x}): a stale handle, another listener on a reused port, or a stranger",
                hello.nonce
            ),
            key: None,
        });
    }
    if seen.contains(&hello.nonce) {
        return Err(Refusal::both(
            &key,
            format!(
                "connector nonce {:#x} was used before: a replayed hello",
                hello.nonce
            ),
        ));
    }
    let mut paths = Vec::with_capacity(hello.paths.len());
    for (n, (req, par)) in hello.paths.iter().zip(&hello.params.paths).enumerate() {
        let what = || format!("path {n} ({} -> {})", req.connector.addr(), req.acceptor);
        if req.relayed && req.kind == LinkKind::Roce {
            return Err(Refusal::both(
                &key,
                format!(
                    "{}: a RoCE path through the relay at {} (a verbs leg); this build carries \
                     relay paths over TCP only",
                    what(),
                    req.connector.addr()
                ),
            ));
        }
        if req.relayed && view.refuse_relayed {
            return Err(Refusal::both(
                &key,
                format!(
                    "{}: a relayed path (through the relay at {}), and NCCL_SWITCHLESS_RELAY=off on \
                     the accepting host refuses relayed paths (auto or always accept them)",
                    what(),
                    req.connector.addr()
                ),
            ));
        }
        let l = check_incoming(
            &view.links,
            &view.routes,
            req.acceptor,
            req.connector.addr(),
            req.kind,
            view.reach,
        )
        .map_err(|reason| Refusal::both(&key, format!("{}: {reason}", what())))?;
        if req.kind == LinkKind::Roce && par.gid != ipv4_mapped_gid(req.connector.addr()) {
            return Err(Refusal::both(
                &key,
                format!(
                    "{}: RoCE GID {} is not the connector address's IPv4-mapped GID ::ffff:{}",
                    what(),
                    std::net::Ipv6Addr::from(par.gid),
                    req.connector.addr()
                ),
            ));
        }
        paths.push(AcceptedPath {
            local: l.clone(),
            request: *req,
            peer_params: par.clone(),
        });
    }
    check_source(view, hello, peer).map_err(|s| Refusal::both(&key, s))?;
    Ok((paths, key))
}

/// The connection must come from where the hello says: from one of its connector addresses whenever
/// it comes from inside one of this node's link subnets (a cable's far end, or this host); from
/// elsewhere (the handle's control address over a management network) only when the tag is right,
/// which the caller checked first.
fn check_source(
    view: &AcceptorView,
    hello: &Hello,
    peer: SocketAddr,
) -> std::result::Result<(), String> {
    let IpAddr::V4(src) = peer.ip() else {
        return Err(format!(
            "connection from {peer}: only IPv4 connectors are accepted"
        ));
    };
    let claimed: Vec<Ipv4Addr> = hello.paths.iter().map(|p| p.connector.addr()).collect();
    if claimed.contains(&src) {
        return Ok(());
    }
    // A hello whose paths all go through relays names the relays' addresses on this node's
    // links (their streams come from there), and no cable reaches the connector: it comes over
    // the control network, so from any address outside this node's cables. One from a cable's
    // subnet is still bound to what it claims.
    let relayed = hello.paths.iter().all(|p| p.relayed);
    if relayed
        && !view
            .links
            .iter()
            .any(|l| crate::route::point_to_point(l.addr) && l.addr.contains(&src))
        && !src.is_loopback()
        && !src.is_unspecified()
    {
        return Ok(());
    }
    let on_link = view
        .links
        .iter()
        .find(|l| l.addr.contains(&src) || (src.is_loopback() && l.addr.addr().is_loopback()));
    match on_link {
        Some(l) => Err(format!(
            "connection from {src}, inside the subnet of {} {}, but the hello claims connector address(es) {}",
            l.netdev,
            l.addr,
            claimed
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )),
        None if src.is_loopback() || src.is_unspecified() => Err(format!(
            "connection from {src}, which is not a connector address of the hello"
        )),
        None => Ok(()),
    }
}

/// What [`AcceptMachine::poll`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptEvent {
    /// Nothing to do until bytes move or [`AcceptMachine::poll_timeout`] passes.
    Pending,
    /// Ready arrived: the handshake is complete and the connection belongs to the caller.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IState {
    AwaitCaller,
    SendReply,
    AwaitReady,
    SendReject,
    Finished,
}

/// An incoming connection whose hello checked out. Answer it with [`AcceptMachine::respond`] (or
/// [`AcceptMachine::reject`]) and poll it until `Done`.
#[derive(Debug)]
pub struct AcceptMachine {
    peer: SocketAddr,
    /// The connector, as errors name it.
    who: String,
    hello: Hello,
    paths: Vec<AcceptedPath>,
    key: ConnKey,
    frames: Frames,
    state: IState,
    /// `None`: no deadline (the default, as NCCL has none).
    deadline: Option<Instant>,
    timeout: Option<Duration>,
    reject_reason: Option<String>,
}

impl AcceptMachine {
    fn new(
        now: Instant,
        peer: SocketAddr,
        frames: Frames,
        hello: Hello,
        paths: Vec<AcceptedPath>,
        key: ConnKey,
        timeout: Option<Duration>,
    ) -> Self {
        AcceptMachine {
            peer,
            who: format!("connector {peer}"),
            hello,
            paths,
            key,
            frames,
            state: IState::AwaitCaller,
            deadline: timeout.map(|t| now + t),
            timeout,
            reject_reason: None,
        }
    }

    /// The hello's tag (what the reply's tag is bound to).
    pub fn hello_tag(&self) -> Tag {
        self.hello.tag
    }

    /// The secret the connection's fabrics get (derived from this connection's key).
    pub fn fabric_secret(&self) -> super::auth::ConnSecret {
        self.key.fabric_secret()
    }

    /// The connector's TCP address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }
    pub fn hello(&self) -> &Hello {
        &self.hello
    }
    /// The paths, resolved to this node's links, in the connector's order.
    pub fn paths(&self) -> &[AcceptedPath] {
        &self.paths
    }

    /// The connection's bytes, for the driver to move.
    pub fn frames(&mut self) -> &mut Frames {
        &mut self.frames
    }

    /// Sends this side's params (one per path, same order). The deadline restarts at `now`.
    pub fn respond(&mut self, now: Instant, mine: SideParams) -> Result<()> {
        if self.state != IState::AwaitCaller {
            return Err(Error::Internal(format!(
                "respond() called in state {:?}",
                self.state
            )));
        }
        if mine.paths.len() != self.paths.len() {
            return Err(Error::Internal(format!(
                "respond() with params for {} paths, the connector asked for {}",
                mine.paths.len(),
                self.paths.len()
            )));
        }
        let mut reply = Reply {
            nonce: self.hello.nonce,
            params: mine,
            tag: [0; super::wire::TAG_LEN],
        };
        reply.tag = self.key.reply_tag(&self.hello.tag, &reply)?;
        self.frames.queue(&Message::Reply(reply))?;
        self.state = IState::SendReply;
        self.deadline = self.timeout.map(|t| now + t);
        Ok(())
    }

    /// Refuses the connection with a reason the connector reports (e.g. QP creation failed here).
    /// Poll until it returns the error carrying the reason. The deadline restarts at `now`.
    pub fn reject(&mut self, now: Instant, reason: &str) -> Result<()> {
        if self.state == IState::Finished {
            return Err(Error::Internal(
                "incoming connection used after it completed".into(),
            ));
        }
        let refuse = self.key.refuse(&self.hello.tag, reason);
        self.frames.queue(&Message::Refuse(refuse))?;
        self.reject_reason = Some(reason.to_string());
        self.state = IState::SendReject;
        self.deadline = self.timeout.map(|t| now + t);
        Ok(())
    }

    /// When [`AcceptMachine::poll`] must run again even if no byte moves (`None` while the caller
    /// has to respond, or when finished).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            IState::SendReply | IState::AwaitReady | IState::SendReject => self.deadline,
            IState::AwaitCaller | IState::Finished => None,
        }
    }

    /// Advances as far as the bytes received so far and `now` allow. An error ends it.
    pub fn poll(&mut self, now: Instant) -> Result<AcceptEvent> {
        let r = self.poll_inner(now);
        if r.is_err() {
            self.state = IState::Finished;
        }
        r
    }

    fn poll_inner(&mut self, now: Instant) -> Result<AcceptEvent> {
        loop {
            if let Some(d) = self.poll_timeout()
                && now >= d
            {
                return Err(Error::Timeout(format!(
                    "accepting from {}: no progress within {} ms while {} (NCCL_SWITCHLESS_CONNECT_TIMEOUT)",
                    self.who,
                    self.timeout.unwrap_or_default().as_millis(),
                    self.step_name()
                )));
            }
            // Each state returns an event, or `None` after moving to the next state.
            let event = match self.state {
                IState::AwaitCaller => Some(AcceptEvent::Pending),
                IState::SendReply => self.send_reply()?,
                IState::SendReject => self.send_reject()?,
                IState::AwaitReady => self.await_ready()?,
                IState::Finished => {
                    return Err(Error::Internal(
                        "incoming connection polled after it finished".into(),
                    ));
                }
            };
            if let Some(e) = event {
                return Ok(e);
            }
        }
    }

    fn send_reply(&mut self) -> Result<Option<AcceptEvent>> {
        if let Some(f) = self.frames.take_fault() {
            return Err(f.into_error(&self.who, self.step_name()));
        }
        if !self.frames.flushed() {
            return Ok(Some(AcceptEvent::Pending));
        }
        self.frames.expect_frame();
        self.state = IState::AwaitReady;
        Ok(None)
    }

    fn send_reject(&mut self) -> Result<Option<AcceptEvent>> {
        if let Some(f) = self.frames.take_fault() {
            return Err(f.into_error(&self.who, self.step_name()));
        }
        if !self.frames.flushed() {
            return Ok(Some(AcceptEvent::Pending));
        }
        let reason = self.reject_reason.take().unwrap_or_default();
        Err(Error::System(format!(
            "refused the connection from {}: {reason}",
            self.who
        )))
    }

    fn await_ready(&mut self) -> Result<Option<AcceptEvent>> {
        if let Some(f) = self.frames.take_fault() {
            return Err(f.into_error(&self.who, self.step_name()));
        }
        match self.frames.take_frame() {
            None => Ok(Some(AcceptEvent::Pending)),
            Some(Message::Ready) => {
                self.state = IState::Finished;
                Ok(Some(AcceptEvent::Done))
            }
            Some(other) => Err(Error::Remote(format!(
                "{} sent {} instead of ready",
                self.who,
                other.name()
            ))),
        }
    }

    fn step_name(&self) -> &'static str {
        match self.state {
            IState::AwaitCaller => "waiting for the local QPs",
            IState::SendReply => "sending the reply",
            IState::AwaitReady => "waiting for its ready message",
            IState::SendReject => "sending a reject",
            IState::Finished => "finished",
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn link(addr: &str, netdev: &str) -> LocalLink {
        LocalLink {
            id: 0,
            kind: LinkKind::Tcp,
            netdev: netdev.into(),
            rdma_dev: None,
            port: 0,
            addr: addr.parse().unwrap(),
            gid_index: None,
            pci_root: String::new(),
            phys_port_id: u16::MAX,
            nccl_dev: None,
            speed_mbps: 0,
            mtu: 9000,
            active_mtu: 0,
            up: true,
        }
    }

    fn hello(connector: &str, relayed: bool) -> Hello {
        Hello {
            nonce: 1,
            paths: vec![PathRequest {
                connector: connector.parse().unwrap(),
                acceptor: "10.0.0.1".parse().unwrap(),
                kind: LinkKind::Tcp,
                relayed,
            }],
            params: SideParams::default(),
            tag: [0; 16],
        }
    }

    fn from(ip: &str) -> SocketAddr {
        SocketAddr::new(ip.parse().unwrap(), 40000)
    }

    /// A hello of relayed paths names the relay's address on this node's cable, and comes over
    /// the control network: accepted from there, never from a cable's subnet it does not claim.
    #[test]
    fn relayed_hellos_come_over_the_control_network_only() {
        let view = AcceptorView {
            links: vec![link("10.0.0.1/30", "to2"), link("192.168.9.3/24", "mgmt")],
            routes: Vec::new(),
            reach: Reach::OnLink,
            refuse_relayed: false,
        };
        let relayed = hello("10.0.0.2/30", true);
        check_source(&view, &relayed, from("192.168.9.1")).unwrap();
        check_source(&view, &relayed, from("172.16.0.1")).unwrap();
        // From the relay itself, which it claims: as any path.
        check_source(&view, &relayed, from("10.0.0.2")).unwrap();
        // From inside a cable's subnet it does not claim, or from loopback: refused.
        let e = check_source(&view, &hello("10.0.0.2/30", true), from("10.0.0.1")).unwrap_err();
        assert!(e.contains("inside the subnet of to2"), "{e}");
        check_source(&view, &relayed, from("127.0.0.1")).unwrap_err();
        // A direct path's hello from the control network but another address: refused as before.
        let e = check_source(&view, &hello("10.0.0.2/30", false), from("192.168.9.1")).unwrap_err();
        assert!(e.contains("inside the subnet of mgmt"), "{e}");
    }
}
