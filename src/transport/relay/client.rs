//! The client's side of the relay door (the host that opens a relayed path): [`Door`] (one
//! connection to a relay: its challenge, the request, the verdict), [`Probe`] (which relay reaches
//! the peer: asked once per neighbour before the handshake) and [`RelayDialer`] (each stream of a
//! relayed path opened through the relay, for `tcp::TcpConnector` and the failback's rebuilds).
//! Everything is driven without blocking.
#![forbid(unsafe_code)]

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use super::wire::{
    CHALLENGE_LEN, ChallengeRepr, Code, CommKey, NONCE_LEN, Op, REQUEST_LEN, RequestRepr,
    VERDICT_LEN, VerdictRepr,
};
use crate::error::{Error, Result};
use crate::sys::socket as sock;
use crate::transport::tcp::{DialStep, StreamDialer, connect_start, connect_status};

/// How long a probe keeps trying a relay whose port refuses connections (its rank may not have
/// called `init` yet), and how long a relay may take to answer once connected.
pub const PROBE_WAIT: Duration = Duration::from_secs(10);
/// First wait before trying a refusing relay again; it doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_millis(500);

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
        })
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
                    if !self.read(&sock, &mut buf, &mut got, "its challenge")? {
                        self.state = DoorState::Challenge { sock, buf, got };
                        return Ok(DoorPoll::Pending);
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
                    while sent < REQUEST_LEN {
                        match sock::send_slice(&sock, &bytes[sent..], false) {
                            Ok(n) => sent += n,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                self.state = DoorState::Request {
                                    sock,
                                    bytes,
                                    sent,
                                    tag,
                                };
                                return Ok(DoorPoll::Pending);
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => {
                                return Err(Error::System(format!(
                                    "{}: sending the request: {e}",
                                    self.what
                                )));
                            }
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
                    if !self.read(&sock, &mut buf, &mut got, "its verdict")? {
                        self.state = DoorState::Verdict {
                            sock,
                            buf,
                            got,
                            tag,
                        };
                        return Ok(DoorPoll::Pending);
                    }
                    let v = VerdictRepr::parse(&buf).map_err(|e| e.context(&self.what))?;
                    if v.code != Code::Ok {
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
                    if !self.req.targets.contains(&v.target) {
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

    /// Reads what has arrived of a fixed-size message; `Ok(true)` once whole.
    fn read(&self, s: &TcpStream, buf: &mut [u8], got: &mut usize, what: &str) -> Result<bool> {
        while *got < buf.len() {
            match sock::recv_slice(s, &mut buf[*got..]) {
                Ok(0) => {
                    return Err(Error::Remote(format!(
                        "{}: closed before sending {what}",
                        self.what
                    )));
                }
                Ok(n) => *got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(Error::Remote(format!("{}: reading {what}: {e}", self.what)));
                }
            }
        }
        Ok(true)
    }
}

/// A relay that reaches the peer, as a probe found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// This host's link address toward the relay.
    pub local: Ipv4Addr,
    /// The relay's door (its address on that link, and the communicator's port).
    pub relay: SocketAddr,
    /// The peer's address the relay reaches, and the relay's own address on that link.
    pub target: Ipv4Addr,
    pub via: Ipv4Addr,
    /// The relay's link speed toward the peer, Mb/s (0: unknown).
    pub speed_mbps: u32,
    /// The relay's host name.
    pub host: String,
}

impl Found {
    /// How logs and path labels name the relay: `node5 (10.0.0.2)`.
    pub fn name(&self) -> String {
        if self.host.is_empty() {
            self.relay.ip().to_string()
        } else {
            format!("{} ({})", self.host, self.relay.ip())
        }
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
    key: CommKey,
    targets: Vec<Ipv4Addr>,
    door: Option<Door>,
    retry_at: Option<Instant>,
    backoff: Duration,
    started: Instant,
    /// How long a refusing or silent relay is given ([`PROBE_WAIT`] unless [`Probe::patience`]).
    wait: Duration,
    state: ProbeState,
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
        let mut p = Probe {
            local,
            relay,
            key,
            targets,
            door: None,
            retry_at: None,
            backoff: RETRY_FIRST,
            started: Instant::now(),
            wait: PROBE_WAIT,
            state: ProbeState::Pending,
        };
        p.open();
        p
    }

    fn open(&mut self) {
        let req = RequestRepr {
            op: Op::Probe,
            comm: 0,
            port: 0,
            targets: self.targets.clone(),
            nonce: [0; NONCE_LEN],
            tag: [0; NONCE_LEN],
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
        if let Some(t) = self.retry_at {
            if now < t {
                return &self.state;
            }
            self.retry_at = None;
            self.open();
        }
        let Some(d) = self.door.as_mut() else {
            return &self.state;
        };
        match d.poll() {
            Ok(DoorPoll::Pending) => {
                if now.duration_since(self.started) > self.wait {
                    self.state = ProbeState::Failed(format!(
                        "relay {} did not answer within {} ms",
                        self.relay,
                        self.wait.as_millis()
                    ));
                }
            }
            Ok(DoorPoll::Done(v, _)) => {
                self.state = ProbeState::Found(Found {
                    local: self.local,
                    relay: self.relay,
                    target: v.target,
                    via: v.via,
                    speed_mbps: v.speed_mbps,
                    host: v.host,
                })
            }
            Ok(DoorPoll::NoService) => {
                self.door = None;
                if now.duration_since(self.started) + self.backoff > self.wait {
                    self.state = ProbeState::Failed(format!(
                        "nothing listens on relay {} (no rank of this communicator serves relays \
                         on that host)",
                        self.relay
                    ));
                } else {
                    self.retry_at = Some(now + self.backoff);
                    self.backoff = (self.backoff * 2).min(RETRY_MAX);
                }
            }
            Err(e) => self.state = ProbeState::Failed(e.to_string()),
        }
        &self.state
    }
}

/// A non-blocking TCP socket bound to `local`.
fn bound_socket(local: Ipv4Addr) -> Result<Socket> {
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))
        .map_err(|e| Error::io("relay door socket", e))?;
    s.set_tcp_nodelay(true)
        .map_err(|e| Error::io("relay door socket: TCP_NODELAY", e))?;
    s.bind(&SocketAddr::new(IpAddr::V4(local), 0).into())
        .map_err(|e| Error::System(format!("binding the relay door socket to {local}: {e}")))?;
    Ok(s)
}

/// Opens each stream of a relayed path through the relay at `relay` ([`StreamDialer`] for the TCP
/// fabric's connector and its failback).
#[derive(Debug)]
pub struct RelayDialer {
    relay: SocketAddr,
    key: CommKey,
    name: String,
}

impl RelayDialer {
    /// A dialer through the relay found by a probe.
    pub fn new(found: &Found, key: CommKey) -> RelayDialer {
        RelayDialer {
            relay: found.relay,
            key,
            name: found.name(),
        }
    }
}

struct OpenStep {
    door: Door,
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
        Ok(Box::new(OpenStep {
            door: Door::start(sock, self.relay, self.key.clone(), req)?,
            name: self.name.clone(),
        }))
    }
}

impl DialStep for OpenStep {
    fn poll(&mut self) -> Result<Option<TcpStream>> {
        match self.door.poll()? {
            DoorPoll::Pending => Ok(None),
            DoorPoll::Done(_, s) => Ok(Some(s)),
            DoorPoll::NoService => Err(Error::System(format!(
                "relay {}: nothing listens on its relay port any more (its rank exited)",
                self.name
            ))),
        }
    }
}
