//! The relay service: one thread per port (communicator) and plugin instance that joins streams
//! of hosts on this host's point-to-point links to hosts on its other links ([`RelayService`]), and
//! the registry that starts and stops services as communicators come and go ([`Relays`]).
//!
//! The door: a connection is taken only on a link's address and only from that link's far end;
//! it gets a challenge at once, then must send one request (`super::wire`) within
//! [`Bounds::request_timeout`]: a probe is answered and closed; an open whose target is the far
//! end of another of this host's links is connected from this host's address on that link, then
//! answered `OK`, and from then on forwarded both ways (`super::leg`); an open to a relay is the
//! same with the target's relay door for target (this service's own port: one communicator, one
//! port), its door exchange passing through first; a list is answered with the far end of one of this
//! host's other links (a chain's second relay) and closed. Every refusal is counted
//! by reason ([`RelayStats::refused`]) and logged through the process-wide rate-limited drop log.
//! Every resource a client can grow is bounded ([`Bounds`], docs/security.md).
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use socket2::{Domain, Protocol, Socket, Type};

use super::leg::{CHAIN_OPENING, Joined, LegError, PATH_OPENING, Staging, Turn};
use super::leg_setup::{Geometry, OFFER_LEN, Offer, PEER_LEN, Peer, Ready, up_bytes};
use super::pump::{Pump, PumpLeg};
use super::staging::MAX_SLOTS;
use super::wire::{
    CHALLENGE_LEN, ChallengeRepr, Code, CommKey, Op, REQUEST_LEN, RequestRepr, VerdictRepr,
    port_for,
};
use crate::error::{Error, Result};
use crate::route::types::point_to_point_peers;
use crate::sync::lock;
use crate::sys::socket::{self as sock, Fill};
use crate::transport::tcp::config::apply_options;
use crate::transport::tcp::{RELAY_FRAME_BYTES, TcpConfig, streams_for_speed};

/// One of this host's point-to-point links, as the relay serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayLink {
    /// The address and its /30 or /31.
    pub addr: Ipv4Net,
    /// The netdev, for the link check and logs.
    pub netdev: String,
    /// Link speed, Mb/s (0: unknown).
    pub speed_mbps: u32,
}

/// What a relay lets a client hold (docs/security.md lists them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounds {
    /// Joined streams (and streams connecting to their target) over every client.
    pub legs: usize,
    /// … from one client address.
    pub legs_per_source: usize,
    /// Connections that have not sent their request yet; past it the oldest is dropped.
    pub pending: usize,
    /// … from one client address; past it that address's oldest is dropped.
    pub pending_per_source: usize,
    /// Verbs legs (set up or forwarding) over every client, and from one client address.
    pub verbs_legs: usize,
    pub verbs_legs_per_source: usize,
    /// Bytes of one verbs leg's staging ring, each direction (registered memory: a leg holds two).
    pub verbs_ring_bytes: u64,
    /// Time from a verbs leg's verdict to A's peer message (A's handshake with B runs between).
    pub verbs_setup_timeout: Duration,
    /// Staging memory of frames in transit, bytes, over every client; a frame waits for memory.
    pub staging_bytes: usize,
    /// … of one client's streams.
    pub staging_per_source: usize,
    /// Time a connection has to send its request.
    pub request_timeout: Duration,
    /// Time the relay gives its connection to the target.
    pub connect_timeout: Duration,
    /// Largest frame forwarded (one staging slot).
    pub max_frame: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            legs: 512,
            legs_per_source: 128,
            // A neighbour's ranks open every stream of their relayed paths at once (NCCL connects
            // its channels together); a dropped one dials again, but a bound below a busy host's
            // burst would make every set-up churn.
            pending: 256,
            pending_per_source: 64,
            staging_bytes: 256 << 20,
            staging_per_source: 64 << 20,
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            max_frame: RELAY_FRAME_BYTES,
            // 32 legs of two 4 MiB rings: at most 256 MiB registered, as the TCP legs' staging.
            verbs_legs: 32,
            verbs_legs_per_source: 8,
            verbs_ring_bytes: 4 << 20,
            verbs_setup_timeout: Duration::from_secs(30),
        }
    }
}

/// How a relay service makes its half of a verbs leg (the plugin: queue pairs on the RDMA devices
/// of the two links; tests: the in-process fabric).
pub trait LegFactory: Send + Sync {
    /// K's queue pair on the link to A (`from`), connected to A's end in `offer`, its queue pair
    /// on the link to B (`to`), and both staging rings of shape `ring` (granted by the service:
    /// at most what A asked and the bounds allow); credits go to A's credit word in `offer`.
    fn create(
        &self,
        from: &RelayLink,
        to: &RelayLink,
        offer: &Offer,
        ring: Geometry,
    ) -> Result<Box<dyn PendingLeg>>;
}

/// K's half of a verbs leg between A's offer and B's end.
pub trait PendingLeg: Send {
    /// K's answer to the offer (its two queue pair ends and rings, the ring granted).
    fn ready(&self) -> Ready;
    /// B's end and credit word (from A's handshake with B): K's queue pair on B's link
    /// connected; the leg, ready to forward.
    fn finish(self: Box<Self>, peer: &Peer) -> Result<Box<dyn PumpLeg>>;
}

/// Reads a netdev's link state: `Some(why)` while it is down.
pub type LinkDown = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// What a relay service is built from.
#[derive(Clone)]
pub struct ServiceConfig {
    /// This host's point-to-point links (up ones; others are ignored).
    pub links: Vec<RelayLink>,
    pub bounds: Bounds,
    /// Socket options of the relay's streams (buffers for the link speed, `TCP_USER_TIMEOUT`).
    pub tcp: TcpConfig,
    /// This host's name, told to clients.
    pub host: String,
    /// The link check (the plugin reads sysfs); `None`: links are taken to be up.
    pub link_down: Option<LinkDown>,
    /// Verbs legs (`wire::Op::OpenVerbs`); `None`: refused with `NoVerbs` (TCP legs only).
    pub verbs: Option<Arc<dyn LegFactory>>,
}

impl std::fmt::Debug for ServiceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceConfig")
            .field("links", &self.links)
            .field("bounds", &self.bounds)
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}

/// What a relay service did (cumulative, but `legs` and `staging` which are now).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Connections taken from hosts on this host's links.
    pub accepted: u64,
    /// Probes answered `OK`.
    pub probes: u64,
    /// List requests answered `OK` (one link's far end each).
    pub listed: u64,
    /// Streams joined to their target.
    pub opened: u64,
    /// … of which to a second relay's door (a chain, `wire::Op::OpenRelay`).
    pub chained: u64,
    /// Streams that ended (in order or not).
    pub closed: u64,
    /// Verbs legs set up and handed to the forwarding thread; of them, those that ended on their
    /// own (a queue pair failed, a client broke the protocol); forwarding now.
    pub verbs_opened: u64,
    pub verbs_ended: u64,
    pub verbs_legs: usize,
    /// Refusals and drops by reason: `not a link` (the source), `unknown communicator`, `bad tag`,
    /// `malformed`, `out of order`, `target not on a link`, `not the relay port`, `no such link`, `busy`,
    /// `unreachable`, `timeout`,
    /// `evicted`, `oversized frame`, `bad frame`, `after close`, `link down`, `no verbs`,
    /// `verbs set-up` (a leg's offer or peer message refused, or K's queue pairs failed).
    pub refused: BTreeMap<&'static str, u64>,
    /// Streams joined now.
    pub legs: usize,
    /// Frames and bytes forwarded (both directions, headers included).
    pub frames: u64,
    pub bytes: u64,
    /// Staging memory held now, and the most held at once.
    pub staging: usize,
    pub staging_peak: usize,
    /// CPU time of the service thread, ns.
    pub cpu_ns: u64,
}

impl RelayStats {
    /// Refusals and drops, all reasons.
    pub fn refusals(&self) -> u64 {
        self.refused.values().sum()
    }
}

struct Shared {
    /// Communicators served, by public id: their key and how many registrations hold them.
    comms: Mutex<HashMap<u64, (CommKey, usize)>>,
    stop: AtomicBool,
    stats: Mutex<RelayStats>,
}

/// A running relay service on one port. Dropping it stops the thread (every stream through it is
/// cut: its paths fail over, or their connections fail naming the relay).
pub struct RelayService {
    port: u16,
    addrs: Vec<SocketAddr>,
    sh: Arc<Shared>,
    waker: Arc<Waker>,
    thread: Option<crate::sys::thread::Joiner>,
}

impl std::fmt::Debug for RelayService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayService")
            .field("port", &self.port)
            .field("addrs", &self.addrs)
            .finish_non_exhaustive()
    }
}

const WAKE: Token = Token(0);
const LEG_TOKENS: usize = 1 << 16;
/// The thread looks at deadlines and links at least this often.
const TICK: Duration = Duration::from_millis(50);
/// Connections taken per listener per wake-up.
const ACCEPTS_PER_POLL: usize = 64;

impl RelayService {
    /// Starts a service on `port` on every up point-to-point link of `cfg`. `Ok(None)` when the
    /// port is taken on one of them (another rank of this host serves it, or another program
    /// holds it), or there is no link to serve.
    pub fn start(port: u16, cfg: ServiceConfig) -> Result<Option<RelayService>> {
        let links: Vec<RelayLink> = cfg
            .links
            .iter()
            .filter(|l| point_to_point_peers(l.addr).is_some())
            .cloned()
            .collect();
        if links.is_empty() {
            return Ok(None);
        }
        let mut listeners = Vec::with_capacity(links.len());
        for (i, l) in links.iter().enumerate() {
            let at = SocketAddr::new(IpAddr::V4(l.addr.addr()), port);
            match bind(at, l, &cfg.tcp) {
                Ok(t) => listeners.push((t, i)),
                Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => return Ok(None),
                Err(e) => {
                    return Err(Error::System(format!(
                        "relay service: listening on {at} ({}): {e}",
                        l.netdev
                    )));
                }
            }
        }
        let poll = Poll::new().map_err(|e| Error::io("relay service poller (epoll)", e))?;
        let waker = Arc::new(
            Waker::new(poll.registry(), WAKE).map_err(|e| Error::io("relay service waker", e))?,
        );
        for (k, (l, _)) in listeners.iter().enumerate() {
            poll.registry()
                .register(
                    &mut SourceFd(&l.as_raw_fd()),
                    Token(1 + k),
                    Interest::READABLE,
                )
                .map_err(|e| Error::io("registering a relay listener", e))?;
        }
        let addrs = listeners
            .iter()
            .filter_map(|(l, _)| l.local_addr().ok())
            .collect();
        let sh = Arc::new(Shared {
            comms: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            stats: Mutex::new(RelayStats::default()),
        });
        let mut server = Server {
            port,
            cfg: ServiceConfig { links, ..cfg },
            sh: Arc::clone(&sh),
            listeners,
            legs: HashMap::new(),
            next_id: 0,
            run: Vec::new(),
            mem: Budget::default(),
            stats: RelayStats::default(),
            // Read on the service thread itself (`main`): a thread clock read here is the caller's.
            cpu0: None,
            links_read: None,
            down: Vec::new(),
            pump: None,
        };
        // Started from `init`, on NCCL's main thread: not through std, which would keep the
        // library mapped after NCCL's dlclose (crate::sys::thread).
        let thread =
            crate::sys::thread::spawn(&format!("swl-relay{port}"), move || server.main(poll))
                .map_err(|e| Error::io("starting the relay service thread", e))?;
        Ok(Some(RelayService {
            port,
            addrs,
            sh,
            waker,
            thread: Some(thread),
        }))
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The addresses it listens on.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Serves communicator `comm_id` too (counted: as often as added).
    pub fn add_comm(&self, comm_id: u64) -> Result<()> {
        let k = CommKey::new(comm_id);
        let mut m = lock(&self.sh.comms, "relay communicators")?;
        m.entry(k.id()).or_insert((k, 0)).1 += 1;
        Ok(())
    }

    /// Serves communicator `comm_id` once less; `true` when no communicator is left.
    pub fn remove_comm(&self, comm_id: u64) -> Result<bool> {
        let id = CommKey::new(comm_id).id();
        let mut m = lock(&self.sh.comms, "relay communicators")?;
        if let Some(e) = m.get_mut(&id) {
            e.1 = e.1.saturating_sub(1);
            if e.1 == 0 {
                m.remove(&id);
            }
        }
        Ok(m.is_empty())
    }

    /// What it did so far (refreshed every 50 ms, and when it stops).
    pub fn stats(&self) -> RelayStats {
        self.sh.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for RelayService {
    fn drop(&mut self) {
        self.sh.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
        if let Some(t) = self.thread.take() {
            t.join();
        }
    }
}

/// A listening socket for the relay door on `at`, with the link's stream options (accepted
/// streams inherit them).
fn bind(at: SocketAddr, l: &RelayLink, tcp: &TcpConfig) -> io::Result<TcpListener> {
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    let speed = u64::from(l.speed_mbps);
    apply_options(&s, speed, streams_for_speed(speed), tcp)
        .map_err(|e| io::Error::other(e.to_string()))?;
    // Not SO_REUSEPORT: a second process must fail to bind, so that one rank per host serves.
    s.set_reuse_address(true)?;
    s.bind(&at.into())?;
    s.listen(128)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

// ---------------------------------------------------------------------------------------------------
// The thread
// ---------------------------------------------------------------------------------------------------

#[derive(Default)]
struct Budget {
    used: usize,
    peak: usize,
    by_source: HashMap<Ipv4Addr, usize>,
    /// Memory was given back since the legs waiting for it were last run.
    freed: bool,
}

struct ClientMem<'a> {
    b: &'a mut Budget,
    src: Ipv4Addr,
    cap: usize,
    cap_source: usize,
}

impl Staging for ClientMem<'_> {
    fn take(&mut self, n: usize) -> bool {
        let mine = self.b.by_source.get(&self.src).copied().unwrap_or(0);
        if self.b.used + n > self.cap || mine + n > self.cap_source {
            return false;
        }
        self.b.used += n;
        self.b.peak = self.b.peak.max(self.b.used);
        *self.b.by_source.entry(self.src).or_insert(0) += n;
        true
    }

    fn give(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        self.b.used = self.b.used.saturating_sub(n);
        if let Some(m) = self.b.by_source.get_mut(&self.src) {
            *m = m.saturating_sub(n);
            if *m == 0 {
                self.b.by_source.remove(&self.src);
            }
        }
        self.b.freed = true;
    }
}

enum State {
    /// The challenge is out; the request is arriving.
    Request {
        challenge: [u8; 16],
        buf: [u8; REQUEST_LEN],
        got: usize,
    },
    /// Connecting to the target.
    Connecting {
        b: Socket,
        req: RequestRepr,
        key: CommKey,
        link: usize,
    },
    Joined(Box<Joined>),
    /// A verbs leg to the far end of link `to`: the verdict is out, A's offer is arriving.
    VerbsOffer {
        buf: [u8; OFFER_LEN],
        got: usize,
        to: usize,
    },
    /// K's ready is out; A's peer message (B's end, from A's handshake with B) is arriving.
    VerbsPeer {
        pending: Box<dyn PendingLeg>,
        buf: [u8; PEER_LEN],
        got: usize,
    },
    /// The leg forwards on the pump's thread; the connection is its control channel.
    Verbs,
}

impl State {
    fn verbs(&self) -> bool {
        matches!(
            self,
            State::VerbsOffer { .. } | State::VerbsPeer { .. } | State::Verbs
        )
    }
}

struct Leg {
    source: Ipv4Addr,
    /// The client's connection (moved into `Joined` when joined).
    a: Option<TcpStream>,
    state: State,
    since: Instant,
    /// The links the stream comes in on and goes out on (for the link check).
    links: [usize; 2],
    /// In the run list.
    queued: bool,
}

struct Server {
    port: u16,
    cfg: ServiceConfig,
    sh: Arc<Shared>,
    listeners: Vec<(TcpListener, usize)>,
    legs: HashMap<usize, Leg>,
    next_id: usize,
    /// Legs with work left after their turn (the next wait does not block).
    run: Vec<usize>,
    mem: Budget,
    stats: RelayStats,
    cpu0: Option<u64>,
    links_read: Option<Instant>,
    /// Links last read as down.
    down: Vec<usize>,
    /// The forwarding thread of the verbs legs, started with the first.
    pump: Option<Pump>,
}

fn token(id: usize, side: usize) -> Token {
    Token(LEG_TOKENS + 2 * id + side)
}

impl Server {
    fn main(&mut self, mut poll: Poll) {
        self.cpu0 = crate::sys::clock::thread_cpu_ns();
        let mut events = Events::with_capacity(256);
        let mut tick = Instant::now();
        while !self.sh.stop.load(Ordering::SeqCst) {
            let timeout = if self.run.is_empty() {
                TICK
            } else {
                Duration::ZERO
            };
            if let Err(e) = poll.poll(&mut events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(
                        "NET/switchless: relay service on port {}: poll: {e}",
                        self.port
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            for ev in events.iter() {
                let t = ev.token().0;
                if t == 0 {
                    continue;
                }
                if t < LEG_TOKENS {
                    self.accept(&poll, t - 1);
                    continue;
                }
                let (id, side) = ((t - LEG_TOKENS) / 2, (t - LEG_TOKENS) % 2);
                let Some(leg) = self.legs.get_mut(&id) else {
                    continue;
                };
                if let State::Joined(j) = &mut leg.state {
                    if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                        j.rd[side] = true;
                    }
                    if ev.is_writable() || ev.is_write_closed() || ev.is_error() {
                        j.wr[side] = true;
                    }
                }
                if !leg.queued {
                    leg.queued = true;
                    self.run.push(id);
                }
            }
            if std::mem::take(&mut self.mem.freed) {
                // Legs waiting for memory try again.
                for (id, leg) in &mut self.legs {
                    if matches!(leg.state, State::Joined(_)) && !leg.queued {
                        leg.queued = true;
                        self.run.push(*id);
                    }
                }
            }
            for id in std::mem::take(&mut self.run) {
                if let Some(l) = self.legs.get_mut(&id) {
                    l.queued = false;
                }
                self.step(&poll, id);
            }
            let now = Instant::now();
            if now.duration_since(tick) >= TICK {
                tick = now;
                self.housekeeping(&poll, now);
            }
        }
        // Stopping cuts every stream through this host (its paths fail over, or their
        // connections fail naming this relay).
        for id in self.legs.keys().copied().collect::<Vec<_>>() {
            self.close(&poll, id, Some(()));
        }
        self.publish();
        let s = &self.stats;
        tracing::info!(
            "NET/switchless: relay service on port {} stopped: {} streams joined, {} probes answered, \
             {} frames ({:.1} MiB) forwarded, peak staging {:.1} MiB, {} refused or dropped {:?}, CPU {:.3} s",
            self.port,
            s.opened,
            s.probes,
            s.frames,
            s.bytes as f64 / (1 << 20) as f64,
            s.staging_peak as f64 / (1 << 20) as f64,
            s.refusals(),
            s.refused,
            s.cpu_ns as f64 / 1e9
        );
    }

    /// Counts a refusal or drop, logging it within the process's rate limit.
    fn refuse(&mut self, why: &'static str, src: Ipv4Addr, detail: impl FnOnce() -> String) {
        *self.stats.refused.entry(why).or_insert(0) += 1;
        let port = self.port;
        if let Some(line) = crate::transport::droplog::note(Instant::now(), IpAddr::V4(src), || {
            format!("relay on port {port}: {why}: {}", detail())
        }) {
            tracing::warn!("NET/switchless: {line}");
        }
    }

    fn accept(&mut self, poll: &Poll, k: usize) {
        let Some((listener, link)) = self.listeners.get(k) else {
            return;
        };
        let link = *link;
        let mut taken = Vec::new();
        for _ in 0..ACCEPTS_PER_POLL {
            match listener.accept() {
                Ok(x) => taken.push(x),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!("NET/switchless: relay on port {}: accept: {e}", self.port);
                    break;
                }
            }
        }
        for (s, from) in taken {
            self.admit(poll, link, s, from);
        }
    }

    /// A connection accepted on link `link`'s address: from that link's far end only; it gets
    /// the challenge and waits for its request.
    fn admit(&mut self, poll: &Poll, link: usize, s: TcpStream, from: SocketAddr) {
        let l = &self.cfg.links[link];
        let IpAddr::V4(src) = from.ip() else {
            return;
        };
        let far = point_to_point_peers(l.addr).unwrap_or_default();
        if !far.contains(&src) || src == l.addr.addr() {
            let net = l.addr.trunc();
            self.refuse("not a link", src, || {
                format!("connection from {from} on {net}, which is not that link's far end")
            });
            return;
        }
        self.stats.accepted += 1;
        self.make_room(poll, src);
        let Ok(challenge) = super::random_nonce() else {
            return;
        };
        // 24 bytes into a fresh socket's empty buffer: all or nothing, never blocks.
        let sent = s.set_nonblocking(true).and_then(|()| {
            sock::send_slice(&s, &ChallengeRepr { nonce: challenge }.to_bytes(), false)
        });
        if !matches!(sent, Ok(n) if n == CHALLENGE_LEN) {
            return;
        }
        let _ = s.set_nodelay(true);
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1) % (usize::MAX / 4);
        if poll
            .registry()
            .register(
                &mut SourceFd(&s.as_raw_fd()),
                token(id, 0),
                Interest::READABLE | Interest::WRITABLE,
            )
            .is_err()
        {
            return;
        }
        self.legs.insert(
            id,
            Leg {
                source: src,
                a: Some(s),
                state: State::Request {
                    challenge,
                    buf: [0; REQUEST_LEN],
                    got: 0,
                },
                since: Instant::now(),
                links: [link, link],
                queued: true,
            },
        );
        self.run.push(id);
    }

    /// Keeps the connections that have not sent their request within bounds: drops the oldest
    /// of `src`'s, or the oldest of all, to make room for one more.
    fn make_room(&mut self, poll: &Poll, src: Ipv4Addr) {
        let b = self.cfg.bounds.clone();
        let pending: Vec<(Instant, usize, Ipv4Addr)> = self
            .legs
            .iter()
            .filter(|(_, l)| matches!(l.state, State::Request { .. }))
            .map(|(id, l)| (l.since, *id, l.source))
            .collect();
        let mine: Vec<&(Instant, usize, Ipv4Addr)> =
            pending.iter().filter(|p| p.2 == src).collect();
        let victim = if mine.len() >= b.pending_per_source {
            mine.iter().min().map(|p| p.1)
        } else if pending.len() >= b.pending {
            pending.iter().min().map(|p| p.1)
        } else {
            None
        };
        if let Some(id) = victim {
            let s = self.legs.get(&id).map_or(src, |l| l.source);
            self.refuse("evicted", s, || {
                "dropped the oldest connection that sent no request, for a newer one".into()
            });
            self.close(poll, id, None);
        }
    }

    fn step(&mut self, poll: &Poll, id: usize) {
        let Some(leg) = self.legs.get_mut(&id) else {
            return;
        };
        match &mut leg.state {
            State::Request { buf, got, .. } => {
                let Some(a) = leg.a.as_ref() else {
                    return;
                };
                match sock::fill(a, buf, got) {
                    Ok(Fill::Whole) => self.request(poll, id),
                    Ok(Fill::Pending) => {}
                    Ok(Fill::Closed) => {
                        let src = leg.source;
                        self.refuse("malformed", src, || {
                            "closed before its request was whole".into()
                        });
                        self.close(poll, id, None);
                    }
                    Err(_) => self.close(poll, id, None),
                }
            }
            State::Connecting { .. } => self.connecting(poll, id),
            State::VerbsOffer { .. } | State::VerbsPeer { .. } => self.verbs_setup(poll, id),
            State::Verbs => {
                let src = leg.source;
                let Some(a) = leg.a.as_ref() else {
                    return;
                };
                let mut one = [0u8; 1];
                match sock::recv_slice(a, &mut one) {
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                        ) => {}
                    Ok(0) | Err(_) => self.close(poll, id, None),
                    Ok(_) => {
                        self.refuse("verbs set-up", src, || {
                            "bytes on a verbs leg's control channel; leg closed".into()
                        });
                        self.close(poll, id, Some(()));
                    }
                }
            }
            State::Joined(j) => {
                let src = leg.source;
                let mut mem = ClientMem {
                    b: &mut self.mem,
                    src,
                    cap: self.cfg.bounds.staging_bytes,
                    cap_source: self.cfg.bounds.staging_per_source,
                };
                match j.turn(&mut mem) {
                    Ok(Turn::Blocked) => {}
                    Ok(Turn::More) => {
                        leg.queued = true;
                        self.run.push(id);
                    }
                    Ok(Turn::Finished) => self.close(poll, id, None),
                    Err(e) => {
                        if let LegError::Violation(why, detail) = &e {
                            let (why, detail) = (*why, detail.clone());
                            self.refuse(why, src, || format!("{detail}; stream cut"));
                        } else if let LegError::Io(side, e) = &e {
                            tracing::debug!(
                                "NET/switchless: relay on port {}: a stream from {src} ended: {side}: {e}",
                                self.port
                            );
                        }
                        self.close(poll, id, Some(()));
                    }
                }
            }
        }
    }

    /// A whole request: checks it and answers (probe), or connects to the target (open, or open
    /// to a relay).
    fn request(&mut self, poll: &Poll, id: usize) {
        let Some(leg) = self.legs.get(&id) else {
            return;
        };
        let State::Request { challenge, buf, .. } = &leg.state else {
            return;
        };
        let (src, challenge, buf) = (leg.source, *challenge, *buf);
        let req = match RequestRepr::parse(&buf) {
            Ok(r) => r,
            Err(e) => {
                self.refuse("malformed", src, || e.to_string());
                return self.answer(poll, id, VerdictRepr::refusal(Code::Malformed));
            }
        };
        let key = lock(&self.sh.comms, "relay communicators")
            .ok()
            .and_then(|m| m.get(&req.comm).map(|(k, _)| k.clone()));
        let Some(key) = key else {
            let c = req.comm;
            self.refuse("unknown communicator", src, || {
                format!("a request for communicator {c:#018x}, which this relay does not serve")
            });
            return self.answer(poll, id, VerdictRepr::refusal(Code::UnknownComm));
        };
        if !key.check(&req, &challenge) {
            self.refuse("bad tag", src, || {
                "a request not authenticated by its communicator (wrong tag)".into()
            });
            return self.answer(poll, id, VerdictRepr::refusal(Code::BadTag));
        }
        if req.op == Op::OpenRelay && req.port != self.port {
            // A second relay of this communicator listens on this same port (`port_for`): any
            // other port is no relay door of it, and this op may open nothing else.
            let (p, own) = (req.port, self.port);
            self.refuse("not the relay port", src, || {
                format!("an open to a relay on port {p}, not this relay's port {own}")
            });
            return self.answer(poll, id, VerdictRepr::refusal(Code::Malformed));
        }
        if req.op == Op::List {
            return self.list(poll, id, &req, &key, src);
        }
        // The first target at the far end of one of this host's links (not the client's own).
        let found = req.targets.iter().find_map(|t| {
            (*t != src)
                .then(|| {
                    self.cfg.links.iter().position(|l| {
                        point_to_point_peers(l.addr).is_some_and(|p| p.contains(t))
                            && l.addr.addr() != *t
                    })
                })
                .flatten()
                .map(|i| (*t, i))
        });
        let Some((target, link)) = found else {
            let t = req.targets.clone();
            self.refuse("target not on a link", src, || {
                format!(
                    "a request for {t:?}, none at the far end of this host's point-to-point links"
                )
            });
            return self.answer(poll, id, VerdictRepr::refusal(Code::NotALink));
        };
        let l = &self.cfg.links[link];
        let ok = VerdictRepr {
            code: Code::Ok,
            target,
            via: l.addr.addr(),
            speed_mbps: l.speed_mbps,
            host: self.cfg.host.clone(),
            tag: [0; 16],
        };
        if req.op == Op::Probe {
            self.stats.probes += 1;
            let v = key.seal_verdict(ok, &req.tag);
            return self.answer(poll, id, v);
        }
        if req.op == Op::OpenVerbs {
            let v = key.seal_verdict(ok, &req.tag);
            return self.open_verbs(poll, id, v, link);
        }
        // An open: bounds first.
        let b = &self.cfg.bounds;
        let busy: Vec<Ipv4Addr> = self
            .legs
            .values()
            .filter(|l| matches!(l.state, State::Connecting { .. } | State::Joined(_)))
            .map(|l| l.source)
            .collect();
        if busy.len() >= b.legs || busy.iter().filter(|s| **s == src).count() >= b.legs_per_source {
            let (all, per) = (b.legs, b.legs_per_source);
            self.refuse("busy", src, || {
                format!("an open past the bound of {all} relayed streams, {per} per client")
            });
            return self.answer(poll, id, VerdictRepr::refusal(Code::Busy));
        }
        if let Some(why) = self.cfg.link_down.as_ref().and_then(|f| f(&l.netdev)) {
            self.refuse("unreachable", src, || {
                format!("{target}: its link is down: {why}")
            });
            return self.answer(poll, id, VerdictRepr::refusal(Code::Unreachable));
        }
        let from = SocketAddr::new(IpAddr::V4(l.addr.addr()), 0);
        let to = SocketAddr::new(IpAddr::V4(target), req.port);
        let speed = u64::from(l.speed_mbps);
        let started = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).and_then(|s| {
            s.set_tcp_nodelay(true)?;
            apply_options(&s, speed, streams_for_speed(speed), &self.cfg.tcp)
                .map_err(|e| io::Error::other(e.to_string()))?;
            s.bind(&from.into())?;
            s.set_nonblocking(true)?;
            match s.connect(&to.into()) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
                Err(e) => return Err(e),
            }
            Ok(s)
        });
        let b = match started {
            Ok(s) => s,
            Err(e) => {
                self.refuse("unreachable", src, || {
                    format!("connecting {from} -> {to}: {e}")
                });
                return self.answer(poll, id, VerdictRepr::refusal(Code::Unreachable));
            }
        };
        if poll
            .registry()
            .register(
                &mut SourceFd(&b.as_raw_fd()),
                token(id, 1),
                Interest::READABLE | Interest::WRITABLE,
            )
            .is_err()
        {
            return self.answer(poll, id, VerdictRepr::refusal(Code::Unreachable));
        }
        if let Some(leg) = self.legs.get_mut(&id) {
            leg.links[1] = link;
            leg.since = Instant::now();
            leg.state = State::Connecting { b, req, key, link };
        }
    }

    /// A verbs leg to the far end of link `to` (`v`: the sealed `OK` verdict): bounds, then the
    /// verdict, then A's offer is awaited.
    fn open_verbs(&mut self, poll: &Poll, id: usize, v: VerdictRepr, to: usize) {
        let Some(src) = self.legs.get(&id).map(|l| l.source) else {
            return;
        };
        if self.cfg.verbs.is_none() {
            self.refuse("no verbs", src, || {
                "a verbs leg asked of a relay that forwards over TCP only".into()
            });
            return self.answer(poll, id, VerdictRepr::refusal(Code::NoVerbs));
        }
        let b = &self.cfg.bounds;
        let busy: Vec<Ipv4Addr> = self
            .legs
            .values()
            .filter(|l| l.state.verbs())
            .map(|l| l.source)
            .collect();
        if busy.len() >= b.verbs_legs
            || busy.iter().filter(|s| **s == src).count() >= b.verbs_legs_per_source
        {
            let (all, per) = (b.verbs_legs, b.verbs_legs_per_source);
            self.refuse("busy", src, || {
                format!("a verbs leg past the bound of {all} legs, {per} per client")
            });
            return self.answer(poll, id, VerdictRepr::refusal(Code::Busy));
        }
        let l = &self.cfg.links[to];
        if let Some(why) = self.cfg.link_down.as_ref().and_then(|f| f(&l.netdev)) {
            let t = v.target;
            self.refuse("unreachable", src, || {
                format!("{t}: its link is down: {why}")
            });
            return self.answer(poll, id, VerdictRepr::refusal(Code::Unreachable));
        }
        let Some(leg) = self.legs.get_mut(&id) else {
            return;
        };
        let Some(a) = leg.a.as_ref() else {
            return;
        };
        // 68 bytes into a socket that has sent 24: never blocks.
        let bytes = v.to_bytes();
        if !matches!(sock::send_slice(a, &bytes, false), Ok(n) if n == bytes.len()) {
            return self.close(poll, id, None);
        }
        leg.links[1] = to;
        leg.since = Instant::now();
        leg.state = State::VerbsOffer {
            buf: [0; OFFER_LEN],
            got: 0,
            to,
        };
        leg.queued = true;
        self.run.push(id);
    }

    /// Reads A's offer, then its peer message; answers each (ready, then up) and hands the leg
    /// to the forwarding thread.
    fn verbs_setup(&mut self, poll: &Poll, id: usize) {
        let Some(leg) = self.legs.get_mut(&id) else {
            return;
        };
        let src = leg.source;
        let Some(a) = leg.a.as_ref() else {
            return;
        };
        let (buf, got): (&mut [u8], &mut usize) = match &mut leg.state {
            State::VerbsOffer { buf, got, .. } => (buf, got),
            State::VerbsPeer { buf, got, .. } => (buf, got),
            _ => return,
        };
        match sock::fill(a, buf, got) {
            Ok(Fill::Whole) => {}
            Ok(Fill::Pending) => return,
            Ok(Fill::Closed) | Err(_) => return self.close(poll, id, None),
        }
        let from = leg.links[0];
        let state = std::mem::replace(&mut leg.state, State::Verbs);
        let step = match state {
            State::VerbsOffer { buf, to, .. } => self.verbs_offer(&buf, from, to).map(Some),
            State::VerbsPeer { pending, buf, .. } => {
                self.verbs_peer(id, pending, &buf).map(|()| None)
            }
            _ => return,
        };
        let (reply, next): (Vec<u8>, State) = match step {
            Ok(Some(pending)) => (
                pending.ready().to_bytes().to_vec(),
                State::VerbsPeer {
                    pending,
                    buf: [0; PEER_LEN],
                    got: 0,
                },
            ),
            Ok(None) => (up_bytes().to_vec(), State::Verbs),
            Err(e) => {
                self.refuse("verbs set-up", src, || e.to_string());
                return self.close(poll, id, Some(()));
            }
        };
        let Some(leg) = self.legs.get_mut(&id) else {
            return;
        };
        leg.state = next;
        let sent = leg.a.as_ref().map(|a| sock::send_slice(a, &reply, false));
        // At most 104 bytes answering a request the client waits on: a full socket buffer here
        // is a client that does not read.
        if !matches!(sent, Some(Ok(n)) if n == reply.len()) {
            self.close(poll, id, Some(()));
        }
    }

    /// A's offer: the ring granted (at most what A asked, [`MAX_SLOTS`] and the per-leg bound),
    /// and K's half made.
    fn verbs_offer(
        &mut self,
        buf: &[u8; OFFER_LEN],
        from: usize,
        to: usize,
    ) -> Result<Box<dyn PendingLeg>> {
        let offer = Offer::parse(buf)?;
        let cap = self.cfg.bounds.verbs_ring_bytes;
        let slot = u64::from(offer.ring.slot_bytes);
        let fit = cap / slot.max(1);
        if fit == 0 {
            return Err(Error::Remote(format!(
                "a verbs leg asking for slots of {slot} bytes; this relay's ring holds {cap}"
            )));
        }
        let slots = u64::from(offer.ring.slots)
            .min(u64::from(MAX_SLOTS))
            .min(fit);
        let ring = Geometry {
            slots: u32::try_from(slots).unwrap_or(MAX_SLOTS),
            slot_bytes: offer.ring.slot_bytes,
        };
        let factory = self
            .cfg
            .verbs
            .clone()
            .ok_or_else(|| Error::Internal("verbs leg without a factory".into()))?;
        let pending = factory.create(&self.cfg.links[from], &self.cfg.links[to], &offer, ring)?;
        let ready = pending.ready();
        if ready.ring != ring || ready.answers(&offer).is_err() {
            return Err(Error::Internal(format!(
                "the verbs leg factory granted {:?}; the relay granted {ring:?}",
                ready.ring
            )));
        }
        Ok(pending)
    }

    /// A's peer message: K's half finished and handed to the forwarding thread.
    fn verbs_peer(
        &mut self,
        id: usize,
        pending: Box<dyn PendingLeg>,
        buf: &[u8; PEER_LEN],
    ) -> Result<()> {
        let peer = Peer::parse(buf)?;
        let leg = pending.finish(&peer)?;
        if self.pump.is_none() {
            let name = format!("swl-fwd{}", self.port);
            self.pump = Some(Pump::start(&name, self.cfg.bounds.verbs_legs)?);
        }
        let pump = self
            .pump
            .as_ref()
            .ok_or_else(|| Error::Internal("relay forwarding thread".into()))?;
        pump.add(id as u64, leg)?;
        self.stats.verbs_opened += 1;
        Ok(())
    }

    /// A list request: the far end of this host's `req.port`-th up point-to-point link other than
    /// the client's own (in the configured order), or `NotALink` past the last.
    fn list(&mut self, poll: &Poll, id: usize, req: &RequestRepr, key: &CommKey, src: Ipv4Addr) {
        let down = |l: &RelayLink| {
            self.cfg
                .link_down
                .as_ref()
                .is_some_and(|f| f(&l.netdev).is_some())
        };
        let nth = self
            .cfg
            .links
            .iter()
            .filter(|l| !down(l))
            .filter_map(|l| {
                // A /31 has one far end; a /30's is the host address that is not ours.
                let far = point_to_point_peers(l.addr)?.into_iter().next()?;
                (far != src).then_some((far, l))
            })
            .nth(usize::from(req.port));
        let Some((far, l)) = nth else {
            let i = req.port;
            self.refuse("no such link", src, || {
                format!("a list of link {i}, past this host's other up point-to-point links")
            });
            return self.answer(poll, id, VerdictRepr::refusal(Code::NotALink));
        };
        let ok = VerdictRepr {
            code: Code::Ok,
            target: far,
            via: l.addr.addr(),
            speed_mbps: l.speed_mbps,
            host: self.cfg.host.clone(),
            tag: [0; 16],
        };
        self.stats.listed += 1;
        let v = key.seal_verdict(ok, &req.tag);
        self.answer(poll, id, v)
    }

    /// Sends a verdict and ends the connection (a probe's answer, or a refusal).
    fn answer(&mut self, poll: &Poll, id: usize, v: VerdictRepr) {
        if let Some(a) = self.legs.get(&id).and_then(|l| l.a.as_ref()) {
            // 68 bytes into a socket that has sent 24: never blocks.
            let _ = sock::send_slice(a, &v.to_bytes(), false);
            let _ = a.shutdown(std::net::Shutdown::Write);
        }
        self.close(poll, id, None);
    }

    /// Connecting to the target: joined once connected (and the client sent nothing early).
    fn connecting(&mut self, poll: &Poll, id: usize) {
        let Some(leg) = self.legs.get(&id) else {
            return;
        };
        let State::Connecting { b, .. } = &leg.state else {
            return;
        };
        let src = leg.source;
        let status = match b.take_error() {
            Ok(Some(e)) | Err(e) => Err(e),
            Ok(None) => match b.peer_addr() {
                Ok(_) => Ok(true),
                Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Ok(false),
                Err(e) => Err(e),
            },
        };
        match status {
            Ok(false) => {}
            Err(e) => {
                self.refuse("unreachable", src, || {
                    format!("connecting to the target: {e}")
                });
                self.answer(poll, id, VerdictRepr::refusal(Code::Unreachable));
            }
            Ok(true) => {
                let Some(leg) = self.legs.get_mut(&id) else {
                    return;
                };
                let Some(a) = leg.a.take() else {
                    return;
                };
                // The client must wait for the verdict: bytes before it are out of order.
                let mut one = [0u8; 1];
                match a.peek(&mut one) {
                    Ok(0) => {
                        leg.a = Some(a);
                        return self.close(poll, id, None);
                    }
                    Ok(_) => {
                        leg.a = Some(a);
                        self.refuse("out of order", src, || {
                            "bytes sent before the relay's verdict".into()
                        });
                        return self.answer(poll, id, VerdictRepr::refusal(Code::Malformed));
                    }
                    Err(_) => {}
                }
                let State::Connecting { b, req, key, link } = std::mem::replace(
                    &mut leg.state,
                    State::Request {
                        challenge: [0; 16],
                        buf: [0; REQUEST_LEN],
                        got: 0,
                    },
                ) else {
                    return;
                };
                let l = &self.cfg.links[link];
                let v = key.seal_verdict(
                    VerdictRepr {
                        code: Code::Ok,
                        target: req.targets[0],
                        via: l.addr.addr(),
                        speed_mbps: l.speed_mbps,
                        host: self.cfg.host.clone(),
                        tag: [0; 16],
                    },
                    &req.tag,
                );
                // 68 bytes into a socket that has sent 24: never blocks.
                if !matches!(sock::send_slice(&a, &v.to_bytes(), false), Ok(n) if n == v.to_bytes().len())
                {
                    leg.a = Some(a);
                    leg.state = State::Connecting { b, req, key, link };
                    return self.close(poll, id, None);
                }
                let b: TcpStream = b.into();
                let _ = b.set_nodelay(true);
                // A second relay's door exchange passes before the path's opening.
                let chained = req.op == Op::OpenRelay;
                let raw = if chained { CHAIN_OPENING } else { PATH_OPENING };
                leg.state =
                    State::Joined(Box::new(Joined::new(a, b, self.cfg.bounds.max_frame, raw)));
                self.stats.opened += 1;
                self.stats.chained += u64::from(chained);
                leg.queued = true;
                self.run.push(id);
            }
        }
    }

    /// Ends leg `id`: its sockets leave the poller and close (`cut`: reset at once), its staging
    /// memory goes back.
    fn close(&mut self, poll: &Poll, id: usize, cut: Option<()>) {
        let Some(leg) = self.legs.remove(&id) else {
            return;
        };
        let src = leg.source;
        let mut fds = Vec::new();
        if let Some(a) = &leg.a {
            fds.push(a.as_raw_fd());
        }
        match &leg.state {
            State::Connecting { b, .. } => fds.push(b.as_raw_fd()),
            State::Joined(j) => {
                fds.extend(j.socks.iter().map(|s| s.as_raw_fd()));
                let (f, b) = j.moved();
                self.stats.frames += f;
                self.stats.bytes += b;
                self.stats.closed += 1;
                let held = j.held();
                ClientMem {
                    b: &mut self.mem,
                    src,
                    cap: 0,
                    cap_source: 0,
                }
                .give(held);
                if cut.is_some() {
                    for s in &j.socks {
                        let _ = sock::abort(s);
                    }
                }
            }
            State::Verbs => {
                if let Some(p) = &self.pump {
                    // The client's control channel ended (or the service cut it): the leg too.
                    let _ = p.close(id as u64, "its door connection closed");
                }
                if cut.is_some()
                    && let Some(a) = &leg.a
                {
                    let _ = sock::abort(a);
                }
            }
            State::VerbsOffer { .. } | State::VerbsPeer { .. } => {
                if cut.is_some()
                    && let Some(a) = &leg.a
                {
                    let _ = sock::abort(a);
                }
            }
            State::Request { .. } => {}
        }
        for fd in fds {
            let _ = poll.registry().deregister(&mut SourceFd(&fd));
        }
    }

    /// Deadlines, the link check, and the shared statistics.
    fn housekeeping(&mut self, poll: &Poll, now: Instant) {
        let b = self.cfg.bounds.clone();
        let late: Vec<(usize, Ipv4Addr, bool)> = self
            .legs
            .iter()
            .filter_map(|(id, l)| match l.state {
                State::Request { .. } if now.duration_since(l.since) > b.request_timeout => {
                    Some((*id, l.source, false))
                }
                State::Connecting { .. } if now.duration_since(l.since) > b.connect_timeout => {
                    Some((*id, l.source, true))
                }
                State::VerbsOffer { .. } | State::VerbsPeer { .. }
                    if now.duration_since(l.since) > b.verbs_setup_timeout =>
                {
                    Some((*id, l.source, false))
                }
                _ => None,
            })
            .collect();
        for (id, src, connecting) in late {
            if connecting {
                self.refuse("unreachable", src, || {
                    "the target did not answer in time".into()
                });
                self.answer(poll, id, VerdictRepr::refusal(Code::Unreachable));
            } else {
                self.refuse("timeout", src, || "no whole request in time".into());
                self.close(poll, id, None);
            }
        }
        // Verbs legs that ended on their own: their control channel is cut, so A learns it.
        let ended = self.pump.as_ref().map(Pump::take_ended).unwrap_or_default();
        for (id, why) in ended {
            self.stats.verbs_ended += 1;
            tracing::debug!(
                "NET/switchless: relay on port {}: a verbs leg ended: {why}",
                self.port
            );
            // Gone from the pump already: its close there is a no-op.
            self.close(poll, id as usize, Some(()));
        }
        // Connecting legs are looked at here too (a refused connect may report no event).
        let connecting: Vec<usize> = self
            .legs
            .iter()
            .filter(|(_, l)| matches!(l.state, State::Connecting { .. }))
            .map(|(id, _)| *id)
            .collect();
        for id in connecting {
            self.connecting(poll, id);
        }
        if let Some(check) = self.cfg.link_down.clone()
            && self
                .links_read
                .is_none_or(|t| now.duration_since(t) >= Duration::from_millis(100))
        {
            self.links_read = Some(now);
            self.down = (0..self.cfg.links.len())
                .filter(|&i| check(&self.cfg.links[i].netdev).is_some())
                .collect();
            if !self.down.is_empty() {
                let cut: Vec<(usize, Ipv4Addr)> = self
                    .legs
                    .iter()
                    .filter(|(_, l)| {
                        // A verbs leg too: its queue pairs would fail only after the RC retries.
                        (matches!(l.state, State::Joined(_)) || l.state.verbs())
                            && l.links.iter().any(|k| self.down.contains(k))
                    })
                    .map(|(id, l)| (*id, l.source))
                    .collect();
                for (id, src) in cut {
                    self.refuse("link down", src, || {
                        "a relayed stream's or verbs leg's link went down; cut".into()
                    });
                    self.close(poll, id, Some(()));
                }
            }
        }
        self.publish();
    }

    fn publish(&mut self) {
        self.stats.legs = self
            .legs
            .values()
            .filter(|l| matches!(l.state, State::Joined(_)))
            .count();
        self.stats.verbs_legs = self
            .legs
            .values()
            .filter(|l| matches!(l.state, State::Verbs))
            .count();
        self.stats.staging = self.mem.used;
        self.stats.staging_peak = self.mem.peak;
        if let (Some(c0), Some(c)) = (self.cpu0, crate::sys::clock::thread_cpu_ns()) {
            self.stats.cpu_ns = c.saturating_sub(c0);
        }
        let live: (u64, u64) = self
            .legs
            .values()
            .filter_map(|l| match &l.state {
                State::Joined(j) => Some(j.moved()),
                _ => None,
            })
            .fold((0, 0), |a, m| (a.0 + m.0, a.1 + m.1));
        if let Ok(mut s) = self.sh.stats.lock() {
            *s = self.stats.clone();
            s.frames += live.0;
            s.bytes += live.1;
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// The registry
// ---------------------------------------------------------------------------------------------------

enum Entry {
    /// This plugin instance serves the port.
    Serving(RelayService, usize),
    /// The port is taken on this host (another rank serves it): nothing to run here.
    Elsewhere(usize),
}

/// The relay services of one plugin instance: one per port, serving every communicator of that
/// port that registered ([`Relays::register`]); the last registration of a port stops its
/// service.
pub struct Relays {
    cfg: ServiceConfig,
    services: Mutex<HashMap<u16, Entry>>,
}

impl std::fmt::Debug for Relays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relays")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// A communicator's registration; dropping it unregisters.
#[derive(Debug)]
pub struct Ticket {
    relays: Arc<Relays>,
    comm: u64,
    port: u16,
    /// This plugin instance runs the service (not another rank of the host).
    pub serving: bool,
}

impl Relays {
    /// A registry over this host's links.
    pub fn new(cfg: ServiceConfig) -> Arc<Relays> {
        Arc::new(Relays {
            cfg,
            services: Mutex::new(HashMap::new()),
        })
    }

    /// Serves communicator `comm_id`: on its port ([`port_for`]), starting the service there
    /// unless this instance runs it already or the port is taken on this host.
    pub fn register(self: &Arc<Self>, comm_id: u64) -> Result<Ticket> {
        let port = port_for(comm_id);
        let mut m = lock(&self.services, "relay services")?;
        let serving = match m.get_mut(&port) {
            Some(Entry::Serving(s, n)) => {
                s.add_comm(comm_id)?;
                *n += 1;
                true
            }
            Some(Entry::Elsewhere(n)) => {
                *n += 1;
                false
            }
            None => match RelayService::start(port, self.cfg.clone())? {
                Some(s) => {
                    s.add_comm(comm_id)?;
                    tracing::info!(
                        "NET/switchless: relay service for communicator {comm_id:#x} on port {port}: {} link(s) ({})",
                        s.addrs().len(),
                        s.addrs()
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    m.insert(port, Entry::Serving(s, 1));
                    true
                }
                None => {
                    tracing::info!(
                        "NET/switchless: relay port {port} of communicator {comm_id:#x} is taken on this host \
                         (another rank of this host serves it, or another program holds it)"
                    );
                    m.insert(port, Entry::Elsewhere(1));
                    false
                }
            },
        };
        Ok(Ticket {
            relays: Arc::clone(self),
            comm: comm_id,
            port,
            serving,
        })
    }

    /// Statistics of the services this instance runs, by port.
    pub fn stats(&self) -> Vec<(u16, RelayStats)> {
        let Ok(m) = self.services.lock() else {
            return Vec::new();
        };
        let mut v: Vec<(u16, RelayStats)> = m
            .iter()
            .filter_map(|(p, e)| match e {
                Entry::Serving(s, _) => Some((*p, s.stats())),
                Entry::Elsewhere(_) => None,
            })
            .collect();
        v.sort_by_key(|x| x.0);
        v
    }

    fn unregister(&self, comm: u64, port: u16) {
        let stopped = {
            let Ok(mut m) = self.services.lock() else {
                return;
            };
            let last = match m.get_mut(&port) {
                Some(Entry::Serving(s, n)) => {
                    let _ = s.remove_comm(comm);
                    *n -= 1;
                    *n == 0
                }
                Some(Entry::Elsewhere(n)) => {
                    *n -= 1;
                    *n == 0
                }
                None => false,
            };
            if last { m.remove(&port) } else { None }
        };
        // Outside the lock: joins the thread.
        drop(stopped);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.relays.unregister(self.comm, self.port);
    }
}
