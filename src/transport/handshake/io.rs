//! The socket driver of the handshake machines: non-blocking TCP sockets, bytes moved between them
//! and the machines, and the clock (the only place the handshake reads it).
//!
//! NCCL calls `connect`/`accept` again and again until they return a comm, and never blocks or times
//! out on its own. So each `poll` here does what the sockets allow right now and returns `Pending`
//! otherwise; the machines keep the state and the deadlines.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use super::connector::{ConnectEvent, ConnectMachine};
use super::frames::Frames;
use super::listener::{AcceptEvent, AcceptMachine, AcceptedPath, AcceptorView, ListenMachine};
use super::wire::{Hello, PathRequest, SideParams};
use crate::error::{Error, Result};
use crate::route::handle::HandleRepr;
use crate::route::select::PathChoice;
use crate::route::types::LocalLink;
use crate::sys::socket::{PeerState, peer_state, set_keepalive};
use crate::transport::droplog;

/// The established connection: the TCP socket (kept for out-of-band use) and its addresses.
#[derive(Debug)]
pub struct Established {
    pub stream: TcpStream,
    pub local: SocketAddr,
    pub peer: SocketAddr,
}

/// Moves bytes between `stream` and `frames`: writes what is queued, reads no more than the frame in
/// progress lacks. Returns whether anything happened (bytes moved, or the connection failed).
fn pump(stream: &mut TcpStream, frames: &mut Frames) -> bool {
    let mut moved = false;
    while !frames.transmit().is_empty() {
        match stream.write(frames.transmit()) {
            Ok(0) => {
                frames.failed(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "socket accepted 0 bytes",
                ));
                return true;
            }
            Ok(n) => {
                frames.sent(n);
                moved = true;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                frames.failed(e);
                return true;
            }
        }
    }
    let mut buf = [0u8; 4096];
    loop {
        let want = frames.want().min(buf.len());
        if want == 0 {
            return moved;
        }
        match stream.read(&mut buf[..want]) {
            Ok(0) => {
                frames.closed();
                return true;
            }
            Ok(n) => {
                frames.received(&buf[..n]);
                moved = true;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return moved,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                frames.failed(e);
                return true;
            }
        }
    }
}

fn configure(stream: &TcpStream) -> io::Result<()> {
    stream.set_nonblocking(true)?;
    stream.set_nodelay(true)
}

// ------------------------------------------------------------------------------------------------
// Connector

/// What [`Connector::poll`] reports.
#[derive(Debug)]
pub enum ConnectPoll {
    /// Not done; call again.
    Pending,
    /// The acceptor's params, reported once. Bring the QPs up, then call [`Connector::ready`].
    Reply(SideParams),
    /// Handshake complete.
    Done(Established),
}

#[derive(Debug)]
enum Sock {
    None,
    Connecting(Socket),
    Open(TcpStream),
}

/// The connector's side over a real socket: [`ConnectMachine`] plus the connection it asks for.
#[derive(Debug)]
pub struct Connector {
    machine: ConnectMachine,
    sock: Sock,
}

impl Connector {
    /// The secret the connection's fabrics get ([`ConnectMachine::fabric_secret`]).
    pub fn fabric_secret(&self) -> super::auth::ConnSecret {
        self.machine.fabric_secret()
    }

    /// Starts connecting to the listener described by `handle` over `paths`; see
    /// [`ConnectMachine::for_handle`]. The first connection is opened here; an error if every target
    /// fails at once.
    pub fn start(
        handle: &HandleRepr,
        paths: &[PathChoice],
        mine: SideParams,
        timeout: impl Into<Option<Duration>>,
    ) -> Result<Self> {
        let now = Instant::now();
        Self::with(
            now,
            ConnectMachine::for_handle(now, handle, paths, mine, timeout)?,
        )
    }

    /// Lower-level start: explicit targets `(address, source address to bind)`.
    pub fn start_to(
        targets: Vec<(SocketAddrV4, Option<Ipv4Addr>)>,
        nonce: u64,
        paths: Vec<PathRequest>,
        mine: SideParams,
        timeout: impl Into<Option<Duration>>,
        peer: String,
    ) -> Result<Self> {
        let now = Instant::now();
        Self::with(
            now,
            ConnectMachine::new(now, targets, nonce, paths, mine, timeout, peer)?,
        )
    }

    fn with(now: Instant, machine: ConnectMachine) -> Result<Self> {
        let mut c = Connector {
            machine,
            sock: Sock::None,
        };
        while let ConnectEvent::Open { addr, bind } = c.machine.poll(now)? {
            c.open(addr, bind)?;
        }
        Ok(c)
    }

    /// Connections the acceptor closed (or answered with a reject not authenticated for this
    /// connection) before its reply, each retried with a new one ([`ConnectMachine::retries`]).
    pub fn retries(&self) -> u32 {
        self.machine.retries()
    }

    /// Advances the handshake as far as the sockets allow without blocking. An error ends it.
    pub fn poll(&mut self) -> Result<ConnectPoll> {
        let r = self.poll_at(Instant::now());
        if r.is_err() {
            self.machine.abort();
            self.sock = Sock::None;
        }
        r
    }

    fn poll_at(&mut self, now: Instant) -> Result<ConnectPoll> {
        loop {
            let moved = self.pump()?;
            match self.machine.poll(now)? {
                ConnectEvent::Open { addr, bind } => self.open(addr, bind)?,
                ConnectEvent::Pending if moved => {}
                ConnectEvent::Pending => return Ok(ConnectPoll::Pending),
                ConnectEvent::Reply(p) => return Ok(ConnectPoll::Reply(p)),
                ConnectEvent::Done => return self.established(),
            }
        }
    }

    /// Tells the acceptor this side is ready (after [`ConnectPoll::Reply`]); keep polling until
    /// `Done`. The deadline restarts here.
    pub fn ready(&mut self) -> Result<()> {
        self.machine.ready(Instant::now())
    }

    fn open(&mut self, addr: SocketAddrV4, bind: Option<Ipv4Addr>) -> Result<()> {
        self.sock = Sock::None;
        match open_socket(addr, bind) {
            Ok(OpenResult::Connected(s)) => self.connected(s),
            Ok(OpenResult::InProgress(s)) => {
                self.sock = Sock::Connecting(s);
                Ok(())
            }
            Err(e) => self.machine.connect_failed(e),
        }
    }

    fn connected(&mut self, s: Socket) -> Result<()> {
        let stream: TcpStream = s.into();
        configure(&stream).map_err(|e| {
            Error::io(
                format!("configuring the socket to {}", self.machine.peer()),
                e,
            )
        })?;
        self.sock = Sock::Open(stream);
        self.machine.connected()
    }

    /// Moves what the socket allows; whether anything happened.
    fn pump(&mut self) -> Result<bool> {
        match &mut self.sock {
            Sock::None => Ok(false),
            Sock::Connecting(s) => match connect_status(s) {
                Ok(false) => Ok(false),
                Ok(true) => match std::mem::replace(&mut self.sock, Sock::None) {
                    Sock::Connecting(s) => self.connected(s).map(|()| true),
                    _ => Err(Error::Internal("connector socket changed under it".into())),
                },
                Err(e) => {
                    self.sock = Sock::None;
                    self.machine.connect_failed(e).map(|()| true)
                }
            },
            Sock::Open(stream) => Ok(pump(stream, self.machine.frames())),
        }
    }

    fn established(&mut self) -> Result<ConnectPoll> {
        let Sock::Open(stream) = std::mem::replace(&mut self.sock, Sock::None) else {
            return Err(Error::Internal(
                "connector finished without a connection".into(),
            ));
        };
        let local = stream
            .local_addr()
            .map_err(|e| Error::io("socket address", e))?;
        let peer = stream
            .peer_addr()
            .map_err(|e| Error::io("peer address", e))?;
        Ok(ConnectPoll::Done(Established {
            stream,
            local,
            peer,
        }))
    }
}

enum OpenResult {
    Connected(Socket),
    InProgress(Socket),
}

fn open_socket(addr: SocketAddrV4, bind: Option<Ipv4Addr>) -> io::Result<OpenResult> {
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    s.set_nonblocking(true)?;
    if let Some(b) = bind {
        s.bind(&SocketAddrV4::new(b, 0).into())?;
    }
    match s.connect(&addr.into()) {
        Ok(()) => Ok(OpenResult::Connected(s)),
        Err(e)
            if e.raw_os_error() == Some(libc::EINPROGRESS)
                || e.kind() == io::ErrorKind::WouldBlock =>
        {
            Ok(OpenResult::InProgress(s))
        }
        Err(e) => Err(e),
    }
}

/// `Ok(true)` once a non-blocking connect finished, `Ok(false)` while in progress.
fn connect_status(s: &Socket) -> io::Result<bool> {
    if let Some(e) = s.take_error()? {
        return Err(e);
    }
    match s.peer_addr() {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Ok(false),
        Err(e) => Err(e),
    }
}

// ------------------------------------------------------------------------------------------------
// Listener and acceptor

/// Connections [`Listener::poll`] takes from the kernel's accept queue per call: a flood cannot keep
/// one call busy (the rest wait in the queue for the next call).
pub const ACCEPTS_PER_POLL: usize = 64;

/// The listening sockets of one handle serving any number of incoming handshakes, in any order:
/// [`ListenMachine`] over the accepted sockets. The plugin binds one socket per address its handle
/// advertises, all on one port ([`Listener::bind_advertised`]), so no other address of the host
/// reaches it.
#[derive(Debug)]
pub struct Listener {
    sockets: Vec<TcpListener>,
    /// The addresses bound (the handle advertises no other).
    bound: Vec<Ipv4Addr>,
    machine: ListenMachine<TcpStream>,
}

/// Ports tried by [`Listener::bind_advertised`] before it gives up: a port the kernel picked on the
/// first address can be taken on another one.
const BIND_TRIES: usize = 16;

impl Listener {
    /// Binds a non-blocking listening socket on one address (tests; the plugin uses
    /// [`Listener::bind_advertised`]). `nonce` goes into the handle; `timeout` (`None`: unlimited)
    /// bounds each step of an accepted connection; the listener itself never times out.
    pub fn bind(
        addr: SocketAddrV4,
        nonce: u64,
        view: AcceptorView,
        timeout: impl Into<Option<Duration>>,
    ) -> Result<Self> {
        let socket = listen_on(addr).map_err(|e| bind_error(addr, e))?;
        let port = socket
            .local_addr()
            .map_err(|e| Error::io("listening socket address", e))?
            .port();
        Ok(Listener {
            sockets: vec![socket],
            bound: vec![*addr.ip()],
            machine: ListenMachine::new(port, nonce, view, timeout),
        })
    }

    /// What the plugin's `listen` does: a fresh random nonce, and one listening socket per address
    /// the handle advertises (every up link of `view` that fits the handle, and `control`), all on
    /// one port the kernel picks; never the wildcard address. An address that is not configured
    /// on this host any more is left out of the handle (logged); none bound is an error.
    pub fn bind_advertised(
        view: AcceptorView,
        control: Option<Ipv4Addr>,
        timeout: impl Into<Option<Duration>>,
    ) -> Result<Self> {
        let (repr, _) = HandleRepr::from_local(&view.links, 0, control, 0);
        let mut addrs: Vec<Ipv4Addr> = repr.links.iter().map(|l| l.addr.addr()).collect();
        if let Some(c) = control
            && !addrs.contains(&c)
        {
            addrs.push(c);
        }
        if addrs.is_empty() {
            return Err(Error::System(
                "listen: no local link is up; the listen handle would advertise no address".into(),
            ));
        }
        let mut last = None;
        for _ in 0..BIND_TRIES {
            let mut sockets = Vec::with_capacity(addrs.len());
            let mut bound = Vec::with_capacity(addrs.len());
            let mut port = 0;
            let mut clash = None;
            for &a in &addrs {
                let at = SocketAddrV4::new(a, port);
                match listen_on(at) {
                    Ok(l) => {
                        if port == 0 {
                            port = l
                                .local_addr()
                                .map_err(|e| Error::io("listening socket address", e))?
                                .port();
                        }
                        sockets.push(l);
                        bound.push(a);
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) && port != 0 => {
                        clash = Some(bind_error(at, e));
                        break;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {
                        tracing::info!(
                            "NET/switchless: listen: {a} is not configured on this host any more; the handle leaves it out"
                        );
                    }
                    Err(e) => return Err(bind_error(at, e)),
                }
            }
            if let Some(e) = clash {
                // The port is taken on another address: try another one.
                last = Some(e);
                continue;
            }
            if sockets.is_empty() {
                return Err(Error::System(format!(
                    "listen: none of the addresses to advertise ({}) is configured on this host",
                    addrs
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            return Ok(Listener {
                sockets,
                bound,
                machine: ListenMachine::new(
                    port,
                    crate::route::handle::random_nonce()?,
                    view,
                    timeout,
                ),
            });
        }
        Err(last.unwrap_or_else(|| {
            Error::System(format!(
                "listen: no port free on every advertised address after {BIND_TRIES} tries"
            ))
        }))
    }

    /// The handle to publish for this listener; see [`ListenMachine::handle`]: only addresses a
    /// socket of this listener is bound to (`control` too).
    pub fn handle(&self, control: Option<Ipv4Addr>) -> Result<(HandleRepr, Vec<LocalLink>)> {
        let links: Vec<LocalLink> = self
            .machine
            .view()
            .links
            .iter()
            .filter(|l| self.bound.contains(&l.addr.addr()) || self.wildcard())
            .cloned()
            .collect();
        let control = control.filter(|c| self.bound.contains(c) || self.wildcard());
        Ok(HandleRepr::from_local(
            &links,
            self.machine.port(),
            control,
            self.machine.nonce(),
        ))
    }

    fn wildcard(&self) -> bool {
        self.bound.iter().any(Ipv4Addr::is_unspecified)
    }

    /// The bound address of the first socket (its port goes into the handle).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.sockets
            .first()
            .ok_or_else(|| Error::Internal("listener without a socket".into()))?
            .local_addr()
            .map_err(|e| Error::io("listening socket address", e))
    }

    /// Every address a socket of this listener is bound to (one port).
    pub fn bound(&self) -> &[Ipv4Addr] {
        &self.bound
    }

    pub fn nonce(&self) -> u64 {
        self.machine.nonce()
    }

    /// Incoming connections in progress.
    pub fn pending(&self) -> usize {
        self.machine.pending()
    }

    /// Drops counted but not logged (the drop warnings' rate limit).
    pub fn unlogged_drops(&self) -> u64 {
        self.machine.unlogged_drops()
    }

    /// Advances the connections in progress first (a hello already on its way is read before any
    /// newcomer is admitted), then takes up to [`ACCEPTS_PER_POLL`] new ones over its sockets,
    /// without blocking; see [`ListenMachine::poll`] and [`ListenMachine::admit`]. Errors only when
    /// a listening socket itself fails: running out of file descriptors, buffers or memory
    /// (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`) is logged and retried on the next call.
    pub fn poll(&mut self) -> Result<Option<Incoming>> {
        let now = Instant::now();
        if let Some(inc) = self.advance(now)? {
            return Ok(Some(inc));
        }
        let mut budget = ACCEPTS_PER_POLL;
        for socket in &self.sockets {
            while budget > 0 {
                budget -= 1;
                match socket.accept() {
                    Ok((stream, peer)) => match configure(&stream) {
                        // A refused connection is closed by dropping it.
                        Ok(()) => drop(self.machine.admit(now, stream, peer, |s, f| {
                            pump(s, f);
                        })),
                        Err(e) => {
                            tracing::warn!(%peer, "handshake: cannot configure accepted socket: {e}")
                        }
                    },
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                        ) => {}
                    Err(e) if transient_accept_error(&e) => {
                        let any = std::net::IpAddr::V4(Ipv4Addr::UNSPECIFIED);
                        if let Some(line) = droplog::note(now, any, || {
                            format!(
                                "accepting a connection failed for now, retried on the next accept call: {e}"
                            )
                        }) {
                            tracing::warn!("handshake: {line}");
                        }
                        break;
                    }
                    Err(e) => {
                        return Err(Error::io(
                            "accepting a connection on the listening socket",
                            e,
                        ));
                    }
                }
            }
        }
        self.advance(now)
    }

    fn advance(&mut self, now: Instant) -> Result<Option<Incoming>> {
        loop {
            let mut moved = false;
            for (stream, frames) in self.machine.connections() {
                moved |= pump(stream, frames);
            }
            if let Some((stream, machine)) = self.machine.poll(now)? {
                return Ok(Some(Incoming {
                    machine,
                    stream: Some(stream),
                }));
            }
            if !moved {
                // Send what that poll queued (rejects); the next poll drops those connections.
                for (stream, frames) in self.machine.connections() {
                    pump(stream, frames);
                }
                return Ok(None);
            }
        }
    }
}

/// A non-blocking listening socket on `addr`.
fn listen_on(addr: SocketAddrV4) -> io::Result<TcpListener> {
    let socket = TcpListener::bind(addr)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

fn bind_error(addr: SocketAddrV4, e: io::Error) -> Error {
    Error::io(format!("binding the listening socket {addr}"), e)
}

/// `accept` errors that are about this process or host running short, not about the listener.
fn transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// The handshake's TCP connection kept open after the handshake as a liveness channel: neither
/// side writes to it again, so end of stream or a reset means the peer process is gone, and TCP
/// keepalive ([`LIVENESS_KEEPALIVE`]) turns a vanished host into a reset. [`Liveness::check`] looks
/// without blocking and at most every [`LIVENESS_CHECK_EVERY`].
#[derive(Debug)]
pub struct Liveness {
    stream: TcpStream,
    peer: SocketAddr,
    next_check: Instant,
    /// When end of stream was first seen: a peer that closes its comm in order may close this socket
    /// a moment before this side takes the last completions, so an end of stream fails the comm only
    /// after [`LIVENESS_GRACE`].
    closed_since: Option<Instant>,
    /// The last failure was TCP keepalive giving up: the socket's own link is unreachable, which
    /// says nothing about the peer's other links (see [`Liveness::unreachable`]).
    timed_out: bool,
    /// Unit tests: the error the next check finds instead of asking the socket.
    #[cfg(test)]
    inject: Option<std::io::ErrorKind>,
}

/// How often [`Liveness::check`] looks at the socket (it is called on every poll of a comm).
pub const LIVENESS_CHECK_EVERY: Duration = Duration::from_millis(100);
/// How long an end of stream from the peer is tolerated before the comm fails.
pub const LIVENESS_GRACE: Duration = Duration::from_secs(1);
/// TCP keepalive of the liveness channel, seconds: first probe after `.0` idle, then every `.1`,
/// reset after `.2` unanswered. A peer host that vanishes is seen within `.0 + .1 * .2` = 25 s.
pub const LIVENESS_KEEPALIVE: (u32, u32, u32) = (10, 5, 3);

impl Liveness {
    /// Keeps `est`'s socket as the liveness channel (keepalive on).
    pub fn new(est: Established) -> Result<Liveness> {
        let (idle, intvl, cnt) = LIVENESS_KEEPALIVE;
        set_keepalive(&est.stream, idle, intvl, cnt)
            .map_err(|e| Error::io("TCP keepalive on the handshake socket", e))?;
        Ok(Liveness {
            stream: est.stream,
            peer: est.peer,
            next_check: Instant::now(),
            closed_since: None,
            timed_out: false,
            #[cfg(test)]
            inject: None,
        })
    }

    /// Unit tests: a channel over `stream` whose next check finds `fail` (e.g. `TimedOut`, what
    /// keepalive giving up reports) instead of asking the socket.
    #[cfg(test)]
    pub(crate) fn failing(stream: TcpStream, fail: std::io::ErrorKind) -> Liveness {
        let peer = stream
            .peer_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        Liveness {
            stream,
            peer,
            next_check: Instant::now(),
            closed_since: None,
            timed_out: false,
            inject: Some(fail),
        }
    }

    /// The peer's handshake address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// `Err` once the peer is known to be gone; cheap (a clock read) between checks.
    pub fn check(&mut self) -> Result<()> {
        self.check_at(Instant::now())
    }

    /// [`Liveness::check`] at `now`.
    pub fn check_at(&mut self, now: Instant) -> Result<()> {
        if now < self.next_check {
            return Ok(());
        }
        self.next_check = now + LIVENESS_CHECK_EVERY;
        let gone = |why: String| {
            Err(Error::Remote(format!(
                "the peer at {} is gone: {why} on the connection's handshake socket (its process exited or its host is unreachable)",
                self.peer
            )))
        };
        #[cfg(test)]
        let state = match self.inject.take() {
            Some(kind) => Err(std::io::Error::from(kind)),
            None => peer_state(&self.stream),
        };
        #[cfg(not(test))]
        let state = peer_state(&self.stream);
        match state {
            Ok(PeerState::Quiet) => Ok(()),
            Ok(PeerState::Data) => {
                // Nothing is due on this socket; drop what came so an end of stream behind it shows.
                let mut scratch = [0u8; 512];
                let _ = crate::sys::socket::recv_slice(&self.stream, &mut scratch);
                Ok(())
            }
            Ok(PeerState::Closed) => {
                let since = *self.closed_since.get_or_insert(now);
                if now.saturating_duration_since(since) >= LIVENESS_GRACE {
                    gone("end of stream".into())
                } else {
                    Ok(())
                }
            }
            Err(e) => {
                self.timed_out = e.kind() == std::io::ErrorKind::TimedOut;
                gone(e.to_string())
            }
        }
    }

    /// Whether the last failure of [`Liveness::check`] was keepalive timing out (the socket's link
    /// unreachable) rather than an end of stream or a reset from the peer's host (its process gone).
    pub fn unreachable(&self) -> bool {
        self.timed_out
    }
}

/// What [`Incoming::poll`] reports.
#[derive(Debug)]
pub enum AcceptPoll {
    Pending,
    Done(Established),
}

/// An incoming connection whose hello checked out: [`AcceptMachine`] over its socket. Answer it
/// with [`Incoming::respond`] (or [`Incoming::reject`]) and poll it until `Done`.
#[derive(Debug)]
pub struct Incoming {
    machine: AcceptMachine,
    /// Taken when the handshake completes (the socket moves to the caller).
    stream: Option<TcpStream>,
}

impl Incoming {
    /// The secret the connection's fabrics get ([`AcceptMachine::fabric_secret`]).
    pub fn fabric_secret(&self) -> super::auth::ConnSecret {
        self.machine.fabric_secret()
    }

    /// The connector's TCP address.
    pub fn peer(&self) -> SocketAddr {
        self.machine.peer()
    }
    pub fn hello(&self) -> &Hello {
        self.machine.hello()
    }
    /// The paths, resolved to this node's links, in the connector's order.
    pub fn paths(&self) -> &[AcceptedPath] {
        self.machine.paths()
    }

    /// Sends this side's params (one per path, same order). The deadline restarts here.
    pub fn respond(&mut self, mine: SideParams) -> Result<()> {
        self.machine.respond(Instant::now(), mine)
    }

    /// Refuses the connection with a reason the connector reports (e.g. QP creation failed here).
    /// Poll until it returns the error carrying the reason.
    pub fn reject(&mut self, reason: &str) -> Result<()> {
        self.machine.reject(Instant::now(), reason)
    }

    /// Advances without blocking.
    pub fn poll(&mut self) -> Result<AcceptPoll> {
        let now = Instant::now();
        loop {
            let moved = match self.stream.as_mut() {
                Some(s) => pump(s, self.machine.frames()),
                None => false,
            };
            match self.machine.poll(now)? {
                AcceptEvent::Pending if moved => {}
                AcceptEvent::Pending => return Ok(AcceptPoll::Pending),
                AcceptEvent::Done => {
                    let stream = self
                        .stream
                        .take()
                        .ok_or_else(|| Error::Internal("incoming socket already taken".into()))?;
                    let local = stream
                        .local_addr()
                        .map_err(|e| Error::io("socket address", e))?;
                    return Ok(AcceptPoll::Done(Established {
                        stream,
                        local,
                        peer: self.machine.peer(),
                    }));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Security review finding 16: running out of descriptors, buffers or memory on `accept` was
    /// fatal to the listen comm; it is retried now, other errors still fail it.
    #[test]
    fn out_of_resources_on_accept_is_transient() {
        for e in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            assert!(
                transient_accept_error(&io::Error::from_raw_os_error(e)),
                "{e}"
            );
        }
        for e in [libc::EBADF, libc::EINVAL, libc::ENOTSOCK] {
            assert!(
                !transient_accept_error(&io::Error::from_raw_os_error(e)),
                "{e}"
            );
        }
    }
}
