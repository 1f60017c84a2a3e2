//! The client's side of the relay door (the host that opens a relayed path): [`Door`] (one
//! connection to a relay: its challenge, the request, the verdict), [`Probe`] (which relay reaches
//! the peer: asked once per neighbour before the handshake), [`LinkList`] (the far ends of a
//! neighbour's other links: the second relays of chains through it) and [`RelayDialer`] (each
//! stream of a relayed path opened through the relay, for `tcp::TcpConnector` and the failback's
//! rebuilds).
//! Both also go through a chain of two relays, A → K1 → K2 → B: K1's door opens to K2's
//! ([`Op::OpenRelay`], K2's address on K1's link, the same port), then K2's door exchange runs
//! on the same stream (K1 passes it through), then the path's opening as through one relay.
//! Everything is driven without blocking.
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use super::wire::{
    CHALLENGE_LEN, ChallengeRepr, Code, CommKey, MAX_LINKS, NONCE_LEN, Op, REQUEST_LEN,
    RequestRepr, VERDICT_LEN, VerdictRepr,
};
use crate::error::{Error, Result};
use crate::sys::socket::{self as sock, Fill};
use crate::transport::tcp::{DialStep, Dialed, StreamDialer, connect_start, connect_status};

/// How long a probe keeps trying a relay whose port refuses connections (its rank may not have
/// called `init` yet), and how long a relay may take to answer once connected.
pub const PROBE_WAIT: Duration = Duration::from_secs(10);
/// First wait before trying a refusing relay again; it doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_millis(500);

/// When a door connection that was refused or dropped is opened again: waits doubling from
/// [`RETRY_FIRST`] to [`RETRY_MAX`], within a patience counted from a start.
struct Retry {
    at: Option<Instant>,
    backoff: Duration,
}

impl Retry {
    fn new() -> Retry {
        Retry {
            at: None,
            backoff: RETRY_FIRST,
        }
    }

    /// Schedules the next try one wait after `now` and doubles the wait; `false` (nothing
    /// scheduled) when that try would come more than `wait` after `started`.
    fn schedule(&mut self, now: Instant, started: Instant, wait: Duration) -> bool {
        if now.duration_since(started) + self.backoff > wait {
            return false;
        }
        self.at = Some(now + self.backoff);
        self.backoff = (self.backoff * 2).min(RETRY_MAX);
        true
    }

    /// `Some(true)` once the scheduled try is due (and no longer scheduled), `Some(false)` before;
    /// `None` with none scheduled.
    fn due(&mut self, now: Instant) -> Option<bool> {
        let t = self.at?;
        if now < t {
            return Some(false);
        }
        self.at = None;
        Some(true)
    }
}

/// What one poll of a [`Door`] gave.
#[derive(Debug)]
pub enum DoorPoll {
    /// Call again.
    Pending,
    /// The relay answered `OK` (authenticated); for an open, the stream is joined to the target.
    Done(VerdictRepr, TcpStream),
    /// Nothing listens on the relay's port (no rank of this communicator serves relays there, or
    /// not yet).
    NoService,
    /// The relay ended the connection before its verdict (why, naming it): it drops the oldest
    /// connection that has not sent its request to make room for a newer one, and one that took
    /// too long to send it. Worth asking again.
    Dropped(String),
}

enum DoorState {
    Connecting(Socket),
    Challenge {
        sock: TcpStream,
        buf: [u8; CHALLENGE_LEN],
        got: usize,
    },
    Request {
        sock: TcpStream,
        bytes: [u8; REQUEST_LEN],
        sent: usize,
        tag: [u8; NONCE_LEN],
    },
    Verdict {
        sock: TcpStream,
        buf: [u8; VERDICT_LEN],
        got: usize,
        tag: [u8; NONCE_LEN],
    },
    Gone,
}

/// One connection to a relay's door: connect, read the challenge, send the request, read the
/// verdict.
pub struct Door {
    /// `relay 10.0.0.2:24611`, for errors.
    what: String,
    key: CommKey,
    req: RequestRepr,
    state: DoorState,
    /// The relay's refusal, once it refused.
    refused: Option<Code>,
}

impl Door {
    /// Starts a non-blocking connect of `sock` (bound to the local link address) to the relay's
    /// door at `relay`, to ask `req` (sealed with `key` once the challenge is in).
    pub fn start(sock: Socket, relay: SocketAddr, key: CommKey, req: RequestRepr) -> Result<Door> {
        let what = format!("relay {relay}");
        sock.set_nonblocking(true)
            .map_err(|e| Error::io(format!("{what}: making the socket non-blocking"), e))?;
        let state = match connect_start(&sock, relay) {
            Ok(true) => DoorState::Challenge {
                sock: sock.into(),
                buf: [0; CHALLENGE_LEN],
                got: 0,
            },
            Ok(false) => DoorState::Connecting(sock),
            Err(e) => return Err(Error::System(format!("{what}: connecting failed: {e}"))),
        };
        Ok(Door {
            what,
            key,
            req,
            state,
            refused: None,
        })
    }

    /// Goes on through `sock`, a stream a first relay joined to a second relay's door (`what`
    /// names that door for errors): its challenge, `req`, its verdict.
    pub fn through(sock: TcpStream, what: String, key: CommKey, req: RequestRepr) -> Door {
        Door {
            what,
            key,
            req,
            state: DoorState::Challenge {
                sock,
                buf: [0; CHALLENGE_LEN],
                got: 0,
            },
            refused: None,
        }
    }

    /// Advances as far as the socket allows.
    pub fn poll(&mut self) -> Result<DoorPoll> {
        loop {
            match std::mem::replace(&mut self.state, DoorState::Gone) {
                DoorState::Connecting(s) => match connect_status(&s) {
                    Ok(false) => {
                        self.state = DoorState::Connecting(s);
                        return Ok(DoorPoll::Pending);
                    }
                    Ok(true) => {
                        self.state = DoorState::Challenge {
                            sock: s.into(),
                            buf: [0; CHALLENGE_LEN],
                            got: 0,
                        }
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                        return Ok(DoorPoll::NoService);
                    }
                    Err(e) => {
                        return Err(Error::System(format!(
                            "{}: connecting failed: {e}",
                            self.what
                        )));
                    }
                },
                DoorState::Challenge {
                    sock,
                    mut buf,
                    mut got,
                } => {
                    match self.read(&sock, &mut buf, &mut got, "its challenge") {
                        Ok(true) => {}
                        Ok(false) => {
                            self.state = DoorState::Challenge { sock, buf, got };
                            return Ok(DoorPoll::Pending);
                        }
                        Err(why) => return Ok(DoorPoll::Dropped(why)),
                    }
                    let c = ChallengeRepr::parse(&buf).map_err(|e| e.context(&self.what))?;
                    let mut req = self.req.clone();
                    req.nonce = super::random_nonce()?;
                    let req = self.key.seal(req, &c.nonce);
                    self.state = DoorState::Request {
                        sock,
                        bytes: req.to_bytes(),
                        sent: 0,
                        tag: req.tag,
                    };
                }
                DoorState::Request {
                    sock,
                    bytes,
                    mut sent,
                    tag,
                } => {
                    match sock::drain(&sock, &bytes, &mut sent) {
                        Ok(true) => {}
                        Ok(false) => {
                            self.state = DoorState::Request {
                                sock,
                                bytes,
                                sent,
                                tag,
                            };
                            return Ok(DoorPoll::Pending);
                        }
                        Err(e) => {
                            return Ok(DoorPoll::Dropped(format!(
                                "{}: sending the request: {e}",
                                self.what
                            )));
                        }
                    }
                    self.state = DoorState::Verdict {
                        sock,
                        buf: [0; VERDICT_LEN],
                        got: 0,
                        tag,
                    };
                }
                DoorState::Verdict {
                    sock,
                    mut buf,
                    mut got,
                    tag,
                } => {
                    match self.read(&sock, &mut buf, &mut got, "its verdict") {
                        Ok(true) => {}
                        Ok(false) => {
                            self.state = DoorState::Verdict {
                                sock,
                                buf,
                                got,
                                tag,
                            };
                            return Ok(DoorPoll::Pending);
                        }
                        Err(why) => return Ok(DoorPoll::Dropped(why)),
                    }
                    let v = VerdictRepr::parse(&buf).map_err(|e| e.context(&self.what))?;
                    if v.code != Code::Ok {
                        self.refused = Some(v.code);
                        return Err(Error::Remote(format!(
                            "{} refused: {}",
                            self.what,
                            v.code.text()
                        )));
                    }
                    if !self.key.check_verdict(&v, &tag) {
                        return Err(Error::Remote(format!(
                            "{}: its answer is not authenticated by the communicator (something \
                             other than a relay of this communicator answered)",
                            self.what
                        )));
                    }
                    // A list names no target: any far end answers it.
                    if self.req.op != Op::List && !self.req.targets.contains(&v.target) {
                        return Err(Error::Remote(format!(
                            "{}: it answered for {}, which was not asked",
                            self.what, v.target
                        )));
                    }
                    return Ok(DoorPoll::Done(v, sock));
                }
                DoorState::Gone => {
                    return Err(Error::Internal(format!(
                        "{}: used after it failed",
                        self.what
                    )));
                }
            }
        }
    }

    /// Reads what has arrived of a fixed-size message; `Ok(true)` once whole, `Err(why)` when the
    /// relay ended the connection first.
    fn read(
        &self,
        s: &TcpStream,
        buf: &mut [u8],
        got: &mut usize,
        what: &str,
    ) -> std::result::Result<bool, String> {
        match sock::fill(s, buf, got) {
            Ok(Fill::Whole) => Ok(true),
            Ok(Fill::Pending) => Ok(false),
            Ok(Fill::Closed) => Err(format!("{}: closed before sending {what}", self.what)),
            Err(e) => Err(format!("{}: reading {what}: {e}", self.what)),
        }
    }
}

/// A relay that reaches the peer, as a probe found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// This host's link address toward the relay.
    pub local: Ipv4Addr,
    /// The relay's door (its address on that link, and the communicator's port).
    pub relay: SocketAddr,
    /// The peer's address the relay reaches, and the relay's own address on that link (of a
    /// chain: the second relay's; the peer sees the streams come from it).
    pub target: Ipv4Addr,
    pub via: Ipv4Addr,
    /// The relay's link speed toward the peer, Mb/s (0: unknown); of a chain, the slowest of
    /// both relays' links onward.
    pub speed_mbps: u32,
    /// The relay's host name (of a chain: the first relay's).
    pub host: String,
    /// A chain's second relay; `None`: the relay reaches the peer itself.
    pub next: Option<Hop>,
}

/// The second relay of a chain A → K1 → K2 → B, as K1 reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// K2's address on K1's link to it (its door is there, on the same port as K1's).
    pub addr: Ipv4Addr,
    /// K2's host name.
    pub host: String,
}

impl Found {
    /// How logs and path labels name the relay: `node5 (10.0.0.2)`; a chain `node5 (10.0.0.2) >
    /// node6 (10.0.5.2)` (the second relay's address on the first relay's link).
    pub fn name(&self) -> String {
        let one = |host: &str, ip: IpAddr| {
            if host.is_empty() {
                ip.to_string()
            } else {
                format!("{host} ({ip})")
            }
        };
        let first = one(&self.host, self.relay.ip());
        match &self.next {
            None => first,
            Some(h) => format!("{first} > {}", one(&h.host, IpAddr::V4(h.addr))),
        }
    }
}

/// The slower of two link speeds, Mb/s (0: unknown, unless both are).
fn slower(a: u32, b: u32) -> u32 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (a, b) => a.min(b),
    }
}

/// What a [`Probe`] has come to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeState {
    Pending,
    Found(Found),
    /// This relay does not serve the connection; why, for the error if none does.
    Failed(String),
}

/// Asks one neighbour's relay which of the peer's addresses it reaches. A relay whose port
/// refuses connections is asked again (its rank may not be up yet) for [`PROBE_WAIT`].
pub struct Probe {
    local: Ipv4Addr,
    relay: SocketAddr,
    /// A chain's second relay (its address on the first relay's link).
    next: Option<Ipv4Addr>,
    /// A chain's first verdict, once the first relay joined the stream to the second's door.
    first: Option<VerdictRepr>,
    key: CommKey,
    targets: Vec<Ipv4Addr>,
    door: Option<Door>,
    retry: Retry,
    started: Instant,
    /// How long a refusing or silent relay is given ([`PROBE_WAIT`] unless [`Probe::patience`]).
    wait: Duration,
    state: ProbeState,
    /// Whether the (first) relay's door gave a verdict, `OK` or a refusal.
    answered: bool,
}

impl Probe {
    /// Gives the relay `wait` instead of [`PROBE_WAIT`] (a relay path that is only an extra,
    /// next to direct paths, is not worth holding the connection 10 s for).
    pub fn patience(mut self, wait: Duration) -> Probe {
        self.wait = wait;
        self
    }

    /// Starts asking the relay at `relay` (reached from this host's `local` link address) about
    /// `targets` (the peer's addresses, at most [`super::wire::MAX_TARGETS`]).
    pub fn start(
        local: Ipv4Addr,
        relay: SocketAddr,
        key: CommKey,
        targets: Vec<Ipv4Addr>,
    ) -> Probe {
        let mut p = Probe::unstarted(local, relay, key, targets);
        p.open();
        p
    }

    /// Starts asking, through the relay at `relay`, the second relay at `next` (its address on
    /// the first relay's link; its door on the same port) which of `targets` it reaches: a chain
    /// A → K1 → K2 → B. The first relay's refusal or the second's fails the probe, naming it;
    /// but while the first cannot reach the second's door it is asked again, for the probe's
    /// patience, as a neighbour whose door refuses connections is.
    pub fn start_chained(
        local: Ipv4Addr,
        relay: SocketAddr,
        next: Ipv4Addr,
        key: CommKey,
        targets: Vec<Ipv4Addr>,
    ) -> Probe {
        let mut p = Probe::unstarted(local, relay, key, targets);
        p.next = Some(next);
        p.open();
        p
    }

    /// A probe that has not connected yet.
    fn unstarted(
        local: Ipv4Addr,
        relay: SocketAddr,
        key: CommKey,
        targets: Vec<Ipv4Addr>,
    ) -> Probe {
        Probe {
            local,
            relay,
            next: None,
            first: None,
            key,
            targets,
            door: None,
            retry: Retry::new(),
            started: Instant::now(),
            wait: PROBE_WAIT,
            state: ProbeState::Pending,
            answered: false,
        }
    }

    /// Whether the relay's door answered with a verdict (`OK` or a refusal): its service runs, so
    /// it can be asked more (its list of links), unlike one that never listened or answered.
    pub fn answered(&self) -> bool {
        self.answered
    }

    /// The probe itself (to the second relay, of a chain).
    fn probe_req(&self) -> RequestRepr {
        RequestRepr {
            op: Op::Probe,
            comm: 0,
            port: 0,
            targets: self.targets.clone(),
            nonce: [0; NONCE_LEN],
            tag: [0; NONCE_LEN],
        }
    }

    fn open(&mut self) {
        self.first = None;
        let req = match self.next {
            None => self.probe_req(),
            Some(k2) => open_relay(self.relay.port(), k2),
        };
        match bound_socket(self.local)
            .and_then(|s| Door::start(s, self.relay, self.key.clone(), req))
        {
            Ok(d) => self.door = Some(d),
            Err(e) => self.state = ProbeState::Failed(e.to_string()),
        }
    }

    /// Advances; what the probe has come to.
    pub fn poll(&mut self) -> &ProbeState {
        if self.state != ProbeState::Pending {
            return &self.state;
        }
        let now = Instant::now();
        match self.retry.due(now) {
            Some(false) => return &self.state,
            Some(true) => self.open(),
            None => {}
        }
        let Some(d) = self.door.as_mut() else {
            return &self.state;
        };
        let polled = d.poll();
        // A chain's first relay that could not reach the second's door: the second's rank may
        // not be up yet, so it is asked again, as a neighbour whose door refuses is.
        let k2_absent =
            self.next.is_some() && self.first.is_none() && d.refused == Some(Code::Unreachable);
        self.answered |= d.refused.is_some() || matches!(polled, Ok(DoorPoll::Done(..)));
        match polled {
            Ok(DoorPoll::Pending) => {
                if now.duration_since(self.started) > self.wait {
                    self.state = ProbeState::Failed(format!(
                        "relay {} did not answer within {} ms",
                        self.relay,
                        self.wait.as_millis()
                    ));
                }
            }
            Ok(DoorPoll::Done(v, s)) => {
                if let (Some(k2), None) = (self.next, &self.first) {
                    // K1 joined the stream to K2's door: K2's exchange, through K1.
                    let what = format!("relay {k2}:{} through {}", self.relay.port(), self.relay);
                    let req = self.probe_req();
                    self.first = Some(v);
                    self.door = Some(Door::through(s, what, self.key.clone(), req));
                    return self.poll();
                }
                // One relay's verdict, or a chain's second (named with the first's host, and the
                // slower of both relays' links onward).
                let (speed_mbps, host, next) = match (self.next, self.first.take()) {
                    (Some(k2), Some(first)) => (
                        slower(first.speed_mbps, v.speed_mbps),
                        first.host,
                        Some(Hop {
                            addr: k2,
                            host: v.host,
                        }),
                    ),
                    _ => (v.speed_mbps, v.host, None),
                };
                self.state = ProbeState::Found(Found {
                    local: self.local,
                    relay: self.relay,
                    target: v.target,
                    via: v.via,
                    speed_mbps,
                    host,
                    next,
                });
            }
            Ok(DoorPoll::NoService) => {
                self.door = None;
                if !self.retry.schedule(now, self.started, self.wait) {
                    self.state = ProbeState::Failed(format!(
                        "nothing listens on relay {} (no rank of this communicator serves relays \
                         on that host)",
                        self.relay
                    ));
                }
            }
            // A relay busy with many new connections dropped this one: asked again (a chain from
            // its first relay), as long as the probe's patience lasts.
            Ok(DoorPoll::Dropped(why)) => {
                self.door = None;
                if !self.retry.schedule(now, self.started, self.wait) {
                    self.state = ProbeState::Failed(format!(
                        "{why} (asked again for {} ms)",
                        self.wait.as_millis()
                    ));
                }
            }
            Err(_) if k2_absent && self.retry.schedule(now, self.started, self.wait) => {
                self.door = None;
            }
            Err(e) => self.state = ProbeState::Failed(e.to_string()),
        }
        &self.state
    }
}

/// What a [`LinkList`] has come to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListState {
    Pending,
    /// The far ends of the relay's other up point-to-point links (its neighbours but this host),
    /// in the relay's order.
    Done(Vec<Ipv4Addr>),
    /// The relay did not list its links; why.
    Failed(String),
}

/// Asks one neighbour's relay for the far ends of its other point-to-point links (the second
/// relays of chains through it): one list request ([`Op::List`]) per link index, until the relay
/// answers `NotALink`. A relay whose port refuses connections is not asked again (the caller
/// asks neighbours whose door answered a probe), and the whole list is given [`PROBE_WAIT`].
pub struct LinkList {
    local: Ipv4Addr,
    relay: SocketAddr,
    key: CommKey,
    index: u16,
    door: Option<Door>,
    /// When a request the relay dropped is asked again.
    retry: Retry,
    found: Vec<Ipv4Addr>,
    started: Instant,
    state: ListState,
}

impl LinkList {
    /// Starts asking the relay at `relay` (reached from this host's `local` link address).
    pub fn start(local: Ipv4Addr, relay: SocketAddr, key: CommKey) -> LinkList {
        let mut l = LinkList {
            local,
            relay,
            key,
            index: 0,
            door: None,
            retry: Retry::new(),
            found: Vec::new(),
            started: Instant::now(),
            state: ListState::Pending,
        };
        l.open();
        l
    }

    fn open(&mut self) {
        let req = RequestRepr {
            op: Op::List,
            comm: 0,
            port: self.index,
            targets: Vec::new(),
            nonce: [0; NONCE_LEN],
            tag: [0; NONCE_LEN],
        };
        match bound_socket(self.local)
            .and_then(|s| Door::start(s, self.relay, self.key.clone(), req))
        {
            Ok(d) => self.door = Some(d),
            Err(e) => self.state = ListState::Failed(e.to_string()),
        }
    }

    /// Advances; what the list has come to.
    pub fn poll(&mut self) -> &ListState {
        while self.state == ListState::Pending {
            match self.retry.due(Instant::now()) {
                Some(false) => break,
                Some(true) => {
                    self.open();
                    continue;
                }
                None => {}
            }
            let Some(d) = self.door.as_mut() else {
                break;
            };
            let polled = d.poll();
            let past_the_last = d.refused == Some(Code::NotALink);
            match polled {
                Ok(DoorPoll::Pending) => {
                    if self.started.elapsed() > PROBE_WAIT {
                        self.state = ListState::Failed(format!(
                            "relay {} did not list its links within {} ms",
                            self.relay,
                            PROBE_WAIT.as_millis()
                        ));
                    }
                    break;
                }
                Ok(DoorPoll::Done(v, _)) => {
                    if !self.found.contains(&v.target) {
                        self.found.push(v.target);
                    }
                    self.index += 1;
                    if self.index >= MAX_LINKS {
                        self.state = ListState::Done(std::mem::take(&mut self.found));
                    } else {
                        self.open();
                    }
                }
                Ok(DoorPoll::NoService) => {
                    self.state = ListState::Failed(format!(
                        "nothing listens on relay {} (no rank of this communicator serves relays \
                         on that host)",
                        self.relay
                    ));
                }
                // Dropped by a relay busy with new connections: the same index again, for the
                // list's patience.
                Ok(DoorPoll::Dropped(why)) => {
                    self.door = None;
                    if !self
                        .retry
                        .schedule(Instant::now(), self.started, PROBE_WAIT)
                    {
                        self.state = ListState::Failed(format!(
                            "{why} (asked again for {} ms)",
                            PROBE_WAIT.as_millis()
                        ));
                    }
                }
                Err(_) if past_the_last => {
                    self.state = ListState::Done(std::mem::take(&mut self.found));
                }
                Err(e) => self.state = ListState::Failed(e.to_string()),
            }
        }
        &self.state
    }
}

/// A non-blocking TCP socket bound to `local`.
pub(super) fn bound_socket(local: Ipv4Addr) -> Result<Socket> {
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))
        .map_err(|e| Error::io("relay door socket", e))?;
    s.set_tcp_nodelay(true)
        .map_err(|e| Error::io("relay door socket: TCP_NODELAY", e))?;
    s.bind(&SocketAddr::new(IpAddr::V4(local), 0).into())
        .map_err(|e| Error::System(format!("binding the relay door socket to {local}: {e}")))?;
    Ok(s)
}

/// An open to the second relay at `k2` (its door on `port`, the first relay's own).
fn open_relay(port: u16, k2: Ipv4Addr) -> RequestRepr {
    RequestRepr {
        op: Op::OpenRelay,
        comm: 0,
        port,
        targets: vec![k2],
        nonce: [0; NONCE_LEN],
        tag: [0; NONCE_LEN],
    }
}

/// Opens each stream of a relayed path through the relay at `relay`, or through a chain of two
/// ([`StreamDialer`] for the TCP fabric's connector and its failback).
#[derive(Debug)]
pub struct RelayDialer {
    relay: SocketAddr,
    /// A chain's second relay (its address on the first relay's link).
    next: Option<Ipv4Addr>,
    key: CommKey,
    name: String,
}

impl RelayDialer {
    /// A dialer through the relay (or the chain) found by a probe.
    pub fn new(found: &Found, key: CommKey) -> RelayDialer {
        RelayDialer {
            relay: found.relay,
            next: found.next.as_ref().map(|h| h.addr),
            key,
            name: found.name(),
        }
    }
}

struct OpenStep {
    door: Door,
    /// A chain's open of the peer, for the second relay's door once the first joined the stream.
    then: Option<(String, RequestRepr)>,
    key: CommKey,
    name: String,
}

impl StreamDialer for RelayDialer {
    fn dial(&self, sock: Socket, remote: SocketAddr) -> Result<Box<dyn DialStep>> {
        let IpAddr::V4(target) = remote.ip() else {
            return Err(Error::InvalidArgument(format!(
                "relayed stream to {remote}: only IPv4 peers are relayed"
            )));
        };
        let req = RequestRepr {
            op: Op::Open,
            comm: 0,
            port: remote.port(),
            targets: vec![target],
            nonce: [0; NONCE_LEN],
            tag: [0; NONCE_LEN],
        };
        let (first, then) = match self.next {
            None => (req, None),
            Some(k2) => {
                let what = format!("relay {k2}:{} through {}", self.relay.port(), self.relay);
                (open_relay(self.relay.port(), k2), Some((what, req)))
            }
        };
        Ok(Box::new(OpenStep {
            door: Door::start(sock, self.relay, self.key.clone(), first)?,
            then,
            key: self.key.clone(),
            name: self.name.clone(),
        }))
    }
}

impl DialStep for OpenStep {
    fn poll(&mut self) -> Result<Dialed> {
        match self.door.poll()? {
            DoorPoll::Pending => Ok(Dialed::Pending),
            DoorPoll::Done(_, s) => match self.then.take() {
                // The first relay joined the stream to the second's door: on to it.
                Some((what, req)) => {
                    self.door = Door::through(s, what, self.key.clone(), req);
                    self.poll()
                }
                None => Ok(Dialed::Joined(s)),
            },
            DoorPoll::Dropped(why) => Ok(Dialed::Dropped(why)),
            DoorPoll::NoService => Err(Error::System(format!(
                "relay {}: nothing listens on its relay port any more (its rank exited)",
                self.name
            ))),
        }
    }
}
