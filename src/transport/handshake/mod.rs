//! Connection handshake over TCP: non-blocking state machines for the connector and the listener.
//!
//! NCCL calls `connect`/`accept` again and again until they return a comm, and never blocks or times
//! out on its own (nccl-net-abi.md §2.2). So every step here is a `poll` that does what the sockets
//! allow right now and returns `Pending` otherwise; each object keeps its state and a deadline.
//!
//! Messages (all behind a 12-byte frame header, see [`wire`] and docs/readme/route.md):
//!
//! 1. connector → acceptor `Hello`: the listener's nonce, the connector's chosen paths (its address,
//!    the acceptor's address, kind) and its per-path [`PathParams`] plus opaque `extra` bytes;
//! 2. acceptor → connector `Reply` with its params for the same paths, or `Reject` with a reason;
//! 3. connector → acceptor `Ready` once the connector's QPs are ready to receive (NCCL IB does the same).
//!
//! API shape: the connector knows its params up front ([`Connector::start`]); the acceptor creates its
//! QPs after it sees the hello, so [`Listener::poll`] yields an [`Incoming`] carrying the hello, the
//! caller supplies its params with [`Incoming::respond`], and then polls the `Incoming` to completion.
//! The TCP socket is returned at the end for out-of-band use by the transport.
#![forbid(unsafe_code)]

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::error::{Error, Result};
use crate::route::handle::HandleRepr;
use crate::route::select::{PathChoice, Reach, check_incoming};
use crate::route::types::{KernelRoute, LocalLink};

pub use wire::{Hello, Message, PathParams, PathRequest, Reply, SideParams};

/// Incoming connections a listener keeps in progress at once; when full, the oldest is closed to make
/// room (a real connector finishes its hello within milliseconds, a stuck or hostile one does not).
pub const MAX_PENDING: usize = 32;

pub mod wire;

/// The established connection: the TCP socket (kept for out-of-band use) and its addresses.
#[derive(Debug)]
pub struct Established {
    pub stream: TcpStream,
    pub local: SocketAddr,
    pub peer: SocketAddr,
}

/// A non-blocking framed TCP connection.
#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    wpos: usize,
}

enum Io<T> {
    Ready(T),
    Pending,
}

impl Conn {
    fn new(stream: TcpStream) -> io::Result<Self> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            rbuf: Vec::new(),
            wbuf: Vec::new(),
            wpos: 0,
        })
    }

    fn queue(&mut self, m: &Message) -> Result<()> {
        let f = m.encode()?;
        self.wbuf.extend_from_slice(&f);
        Ok(())
    }

    /// Writes queued bytes; `Ready(())` when all are written.
    fn flush(&mut self) -> io::Result<Io<()>> {
        while self.wpos < self.wbuf.len() {
            match self.stream.write(&self.wbuf[self.wpos..]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "socket accepted 0 bytes",
                    ));
                }
                Ok(n) => self.wpos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Io::Pending),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.wbuf.clear();
        self.wpos = 0;
        Ok(Io::Ready(()))
    }

    /// Reads one frame, never more bytes than it needs (the socket is handed over afterwards).
    fn read_frame(&mut self) -> std::result::Result<Io<Message>, ReadError> {
        loop {
            let need = if self.rbuf.len() < wire::HEADER_LEN {
                wire::HEADER_LEN
            } else {
                let h = wire::HeaderRepr::parse(&wire::Header::new_unchecked(&self.rbuf[..]))
                    .map_err(ReadError::Malformed)?;
                wire::HEADER_LEN + h.payload_len
            };
            if self.rbuf.len() == need {
                let m = Message::decode(&self.rbuf).map_err(ReadError::Malformed)?;
                self.rbuf.clear();
                return Ok(Io::Ready(m));
            }
            let have = self.rbuf.len();
            self.rbuf.resize(need, 0);
            match self.stream.read(&mut self.rbuf[have..need]) {
                Ok(0) => {
                    self.rbuf.truncate(have);
                    return Err(ReadError::Closed);
                }
                Ok(n) => self.rbuf.truncate(have + n),
                Err(e) => {
                    self.rbuf.truncate(have);
                    match e.kind() {
                        io::ErrorKind::WouldBlock => return Ok(Io::Pending),
                        io::ErrorKind::Interrupted => {}
                        _ => return Err(ReadError::Io(e)),
                    }
                }
            }
        }
    }
}

enum ReadError {
    Closed,
    Io(io::Error),
    Malformed(Error),
}

impl ReadError {
    fn into_error(self, who: &str, step: &str) -> Error {
        match self {
            ReadError::Closed => Error::Remote(format!("{who} closed the connection while {step}")),
            ReadError::Io(e) => Error::io(format!("{who}: {step}"), e),
            ReadError::Malformed(e) => Error::Remote(format!("{who} while {step}: {e}")),
        }
    }
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
enum CState {
    Connecting(Socket),
    SendHello(Conn),
    AwaitReply(Conn),
    AwaitCaller(Conn),
    SendReady(Conn),
    Finished,
}

/// Longest a connector waits for a TCP connection to one target before trying the next one (the
/// last target gets the rest of the timeout). A directly cabled peer answers in well under a
/// millisecond, a soft-RoCE VM under TCG in a few.
pub const TARGET_BUDGET: Duration = Duration::from_secs(5);

/// The connector's side: TCP connect, hello, reply, ready.
#[derive(Debug)]
pub struct Connector {
    state: CState,
    /// Where to connect, in order (routed link address, then the control address), with the source
    /// address to bind for each.
    targets: Vec<(SocketAddrV4, Option<Ipv4Addr>)>,
    target: usize,
    /// When the connection attempt to the current target is given up for the next one (a target
    /// that drops SYNs would otherwise use up the whole timeout); the last target has the deadline.
    target_deadline: Instant,
    failures: Vec<String>,
    hello: Message,
    nonce: u64,
    npaths: usize,
    deadline: Instant,
    timeout: Duration,
    peer: String,
}

impl Connector {
    /// Starts connecting to the listener described by `handle` over `paths` (from
    /// [`crate::route::select()`]), with this side's params (one [`PathParams`] per path).
    /// The TCP connection goes to the first path's peer address (bound to its local address), then, if
    /// that fails or does not answer within [`TARGET_BUDGET`] (at most half the timeout), to the
    /// handle's control address. Fails after `timeout` in all.
    pub fn start(
        handle: &HandleRepr,
        paths: &[PathChoice],
        mine: SideParams,
        timeout: Duration,
    ) -> Result<Self> {
        let first = paths
            .first()
            .ok_or_else(|| Error::InvalidArgument("connector started with no paths".into()))?;
        let mut targets = vec![(
            SocketAddrV4::new(first.remote.addr.addr(), handle.port),
            Some(first.local.addr.addr()),
        )];
        if let Some(c) = handle.control {
            if c != first.remote.addr.addr() {
                targets.push((SocketAddrV4::new(c, handle.port), None));
            }
        }
        let requests: Vec<PathRequest> = paths
            .iter()
            .map(|p| PathRequest {
                connector: p.local.addr,
                acceptor: p.remote.addr.addr(),
                kind: p.kind,
            })
            .collect();
        let peer = format!(
            "peer {} (port {})",
            handle
                .links
                .iter()
                .map(|l| l.addr.addr().to_string())
                .collect::<Vec<_>>()
                .join("/"),
            handle.port
        );
        Self::start_to(targets, handle.nonce, requests, mine, timeout, peer)
    }

    /// Lower-level start: explicit targets `(address, source address to bind)`.
    pub fn start_to(
        targets: Vec<(SocketAddrV4, Option<Ipv4Addr>)>,
        nonce: u64,
        paths: Vec<PathRequest>,
        mine: SideParams,
        timeout: Duration,
        peer: String,
    ) -> Result<Self> {
        if targets.is_empty() {
            return Err(Error::InvalidArgument(
                "connector has no address to connect to".into(),
            ));
        }
        let npaths = paths.len();
        let hello = Message::Hello(Hello {
            nonce,
            paths,
            params: mine,
        });
        hello.encode()?; // validate counts now, not mid-handshake
        let now = Instant::now();
        let mut c = Connector {
            state: CState::Finished,
            targets,
            target: 0,
            target_deadline: now,
            failures: Vec::new(),
            hello,
            nonce,
            npaths,
            deadline: now + timeout,
            timeout,
            peer,
        };
        c.state = c.open_next()?;
        Ok(c)
    }

    /// Opens a socket to the next target; errors when none is left.
    fn open_next(&mut self) -> Result<CState> {
        while let Some(&(addr, bind)) = self.targets.get(self.target) {
            self.target += 1;
            self.target_deadline = if self.target < self.targets.len() {
                Instant::now() + TARGET_BUDGET.min(self.timeout / 2)
            } else {
                self.deadline
            };
            match open_socket(addr, bind) {
                Ok(OpenResult::Connected(s)) => return self.connected(s),
                Ok(OpenResult::InProgress(s)) => return Ok(CState::Connecting(s)),
                Err(e) => self.failures.push(format!("{addr}: {e}")),
            }
        }
        Err(Error::System(format!(
            "cannot open a TCP connection to {}: {}",
            self.peer,
            self.failures.join("; ")
        )))
    }

    fn connected(&mut self, s: Socket) -> Result<CState> {
        let stream: TcpStream = s.into();
        let mut conn = Conn::new(stream)
            .map_err(|e| Error::io(format!("configuring the socket to {}", self.peer), e))?;
        conn.queue(&self.hello)?;
        Ok(CState::SendHello(conn))
    }

    fn step_name(&self) -> &'static str {
        match self.state {
            CState::Connecting(_) => "opening the TCP connection",
            CState::SendHello(_) => "sending the hello",
            CState::AwaitReply(_) => "waiting for the acceptor's reply",
            CState::AwaitCaller(_) => "waiting for the local QPs",
            CState::SendReady(_) => "sending ready",
            CState::Finished => "finished",
        }
    }

    /// Advances the handshake as far as the sockets allow without blocking.
    pub fn poll(&mut self) -> Result<ConnectPoll> {
        let r = self.poll_inner();
        if r.is_err() {
            self.state = CState::Finished;
        }
        r
    }

    fn poll_inner(&mut self) -> Result<ConnectPoll> {
        loop {
            if !matches!(self.state, CState::AwaitCaller(_) | CState::Finished)
                && Instant::now() > self.deadline
            {
                return Err(Error::Timeout(format!(
                    "connecting to {}: no progress within {} ms while {} (NCCL_SWITCHLESS_CONNECT_TIMEOUT)",
                    self.peer,
                    self.timeout.as_millis(),
                    self.step_name()
                )));
            }
            let state = std::mem::replace(&mut self.state, CState::Finished);
            self.state = match state {
                CState::Connecting(s) => match connect_status(&s) {
                    Ok(true) => self.connected(s)?,
                    Ok(false) if Instant::now() > self.target_deadline => {
                        let addr = self
                            .targets
                            .get(self.target - 1)
                            .map(|t| t.0.to_string())
                            .unwrap_or_default();
                        self.failures.push(format!(
                            "{addr}: no answer within {} ms",
                            TARGET_BUDGET.min(self.timeout / 2).as_millis()
                        ));
                        drop(s);
                        self.open_next()?
                    }
                    Ok(false) => {
                        self.state = CState::Connecting(s);
                        return Ok(ConnectPoll::Pending);
                    }
                    Err(e) => {
                        let addr = self
                            .targets
                            .get(self.target - 1)
                            .map(|t| t.0.to_string())
                            .unwrap_or_default();
                        self.failures.push(format!("{addr}: {e}"));
                        self.open_next()?
                    }
                },
                CState::SendHello(mut c) => match c.flush() {
                    Ok(Io::Ready(())) => CState::AwaitReply(c),
                    Ok(Io::Pending) => {
                        self.state = CState::SendHello(c);
                        return Ok(ConnectPoll::Pending);
                    }
                    Err(e) => {
                        return Err(Error::io(format!("{}: sending the hello", self.peer), e));
                    }
                },
                CState::AwaitReply(mut c) => match c.read_frame() {
                    Ok(Io::Pending) => {
                        self.state = CState::AwaitReply(c);
                        return Ok(ConnectPoll::Pending);
                    }
                    Ok(Io::Ready(Message::Reply(r))) => {
                        if r.nonce != self.nonce {
                            return Err(Error::Remote(format!(
                                "{} replied with nonce {:#x}, expected {:#x}: a different listener answered",
                                self.peer, r.nonce, self.nonce
                            )));
                        }
                        if r.params.paths.len() != self.npaths {
                            return Err(Error::Remote(format!(
                                "{} replied with params for {} paths, the hello asked for {}",
                                self.peer,
                                r.params.paths.len(),
                                self.npaths
                            )));
                        }
                        self.state = CState::AwaitCaller(c);
                        return Ok(ConnectPoll::Reply(r.params));
                    }
                    Ok(Io::Ready(Message::Reject(reason))) => {
                        return Err(Error::Remote(format!(
                            "{} rejected the connection: {reason}",
                            self.peer
                        )));
                    }
                    Ok(Io::Ready(other)) => {
                        return Err(Error::Remote(format!(
                            "{} sent {} while a reply was expected",
                            self.peer,
                            msg_name(&other)
                        )));
                    }
                    Err(e) => {
                        return Err(e.into_error(&self.peer, "waiting for the acceptor's reply"));
                    }
                },
                CState::AwaitCaller(c) => {
                    self.state = CState::AwaitCaller(c);
                    return Ok(ConnectPoll::Pending);
                }
                CState::SendReady(mut c) => match c.flush() {
                    Ok(Io::Ready(())) => {
                        let local = c
                            .stream
                            .local_addr()
                            .map_err(|e| Error::io("socket address", e))?;
                        let peer = c
                            .stream
                            .peer_addr()
                            .map_err(|e| Error::io("peer address", e))?;
                        return Ok(ConnectPoll::Done(Established {
                            stream: c.stream,
                            local,
                            peer,
                        }));
                    }
                    Ok(Io::Pending) => {
                        self.state = CState::SendReady(c);
                        return Ok(ConnectPoll::Pending);
                    }
                    Err(e) => return Err(Error::io(format!("{}: sending ready", self.peer), e)),
                },
                CState::Finished => {
                    return Err(Error::Internal(
                        "connector polled after it finished or failed".into(),
                    ));
                }
            };
        }
    }

    /// Tells the acceptor this side is ready (after [`ConnectPoll::Reply`]); keep polling until `Done`.
    /// The deadline restarts here.
    pub fn ready(&mut self) -> Result<()> {
        match std::mem::replace(&mut self.state, CState::Finished) {
            CState::AwaitCaller(mut c) => {
                c.queue(&Message::Ready)?;
                self.deadline = Instant::now() + self.timeout;
                self.state = CState::SendReady(c);
                Ok(())
            }
            other => {
                self.state = other;
                Err(Error::Internal(format!(
                    "connector ready() called while {}",
                    self.step_name()
                )))
            }
        }
    }
}

fn msg_name(m: &Message) -> &'static str {
    match m {
        Message::Hello(_) => "a hello",
        Message::Reply(_) => "a reply",
        Message::Reject(_) => "a reject",
        Message::Ready => "ready",
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

/// What the acceptor checks incoming paths against: this node's links and kernel routes.
#[derive(Debug, Clone, Default)]
pub struct AcceptorView {
    pub links: Vec<LocalLink>,
    pub routes: Vec<KernelRoute>,
    /// Whether routed TCP paths are accepted (`NCCL_SWITCHLESS_TCP_FALLBACK=1`, see
    /// [`crate::route::check_incoming`]).
    pub reach: Reach,
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

#[derive(Debug)]
struct Pending {
    conn: Conn,
    peer: SocketAddr,
    deadline: Instant,
    /// Set when a reject is queued: flush it, then drop.
    rejecting: bool,
}

/// A listening socket serving any number of incoming handshakes, in any order.
#[derive(Debug)]
pub struct Listener {
    socket: TcpListener,
    nonce: u64,
    view: AcceptorView,
    timeout: Duration,
    pending: Vec<Pending>,
    /// Set on the first poll: no valid hello by then is an error.
    deadline: Option<Instant>,
}

impl Listener {
    /// Binds a non-blocking listening socket (use `0.0.0.0:0` in the plugin so every link address
    /// reaches it). `nonce` goes into the handle; `timeout` bounds each incoming handshake and the wait
    /// for the first valid connector (counted from the first [`Listener::poll`]).
    pub fn bind(
        addr: SocketAddrV4,
        nonce: u64,
        view: AcceptorView,
        timeout: Duration,
    ) -> Result<Self> {
        let socket = TcpListener::bind(addr)
            .map_err(|e| Error::io(format!("binding the listening socket {addr}"), e))?;
        socket
            .set_nonblocking(true)
            .map_err(|e| Error::io("making the listening socket non-blocking", e))?;
        Ok(Listener {
            socket,
            nonce,
            view,
            timeout,
            pending: Vec::new(),
            deadline: None,
        })
    }

    /// Binds `0.0.0.0:0` with a fresh random nonce: what the plugin's `listen` does.
    pub fn bind_any(view: AcceptorView, timeout: Duration) -> Result<Self> {
        Self::bind(
            SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
            crate::route::handle::random_nonce()?,
            view,
            timeout,
        )
    }

    /// The handle to publish for this listener: its port and nonce, every link of `view` that is up,
    /// and `control` as the fallback address. Also returns links that did not fit (log them).
    pub fn handle(&self, control: Option<Ipv4Addr>) -> Result<(HandleRepr, Vec<LocalLink>)> {
        let port = self.local_addr()?.port();
        Ok(HandleRepr::from_local(
            &self.view.links,
            port,
            control,
            self.nonce,
        ))
    }

    /// The bound address (its port goes into the handle).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.socket
            .local_addr()
            .map_err(|e| Error::io("listening socket address", e))
    }

    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    /// Incoming connections in progress.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Accepts new connections and advances pending ones without blocking. Returns an [`Incoming`]
    /// whose hello is valid and whose paths all check out; bad ones are logged and dropped (with a
    /// reject message when the peer speaks the protocol). Errors only when the listening socket fails or
    /// no valid hello arrived within the timeout.
    pub fn poll(&mut self) -> Result<Option<Incoming>> {
        let now = Instant::now();
        let deadline = *self.deadline.get_or_insert(now + self.timeout);
        loop {
            match self.socket.accept() {
                Ok((stream, peer)) => {
                    if self.pending.len() >= MAX_PENDING {
                        if let Some(oldest) =
                            (0..self.pending.len()).min_by_key(|&i| self.pending[i].deadline)
                        {
                            let old = self.pending.swap_remove(oldest);
                            tracing::warn!(peer = %old.peer, "handshake: {MAX_PENDING} connections pending; closing the oldest");
                        }
                    }
                    match Conn::new(stream) {
                        Ok(conn) => self.pending.push(Pending {
                            conn,
                            peer,
                            deadline: now + self.timeout,
                            rejecting: false,
                        }),
                        Err(e) => {
                            tracing::warn!(%peer, "handshake: cannot configure accepted socket: {e}")
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    return Err(Error::io(
                        "accepting a connection on the listening socket",
                        e,
                    ));
                }
            }
        }
        let mut i = 0;
        while i < self.pending.len() {
            match self.advance(i, now) {
                Advance::Keep => i += 1,
                Advance::Drop => {
                    self.pending.swap_remove(i);
                }
                Advance::Hello(hello, paths) => {
                    let p = self.pending.swap_remove(i);
                    // Each valid connection restarts the wait for the next one.
                    self.deadline = Some(now + self.timeout);
                    return Ok(Some(Incoming {
                        conn: Some(p.conn),
                        peer: p.peer,
                        hello,
                        paths,
                        state: IState::AwaitCaller,
                        deadline: now + self.timeout,
                        timeout: self.timeout,
                        reject_reason: None,
                    }));
                }
            }
        }
        if now > deadline {
            return Err(Error::Timeout(format!(
                "no valid connection reached listening port {} within {} ms ({} in progress): the peer never connected or could not route here; check its log",
                self.socket.local_addr().map(|a| a.port()).unwrap_or(0),
                self.timeout.as_millis(),
                self.pending.len()
            )));
        }
        Ok(None)
    }

    fn advance(&mut self, i: usize, now: Instant) -> Advance {
        let p = &mut self.pending[i];
        let peer = p.peer;
        if now > p.deadline {
            tracing::warn!(%peer, "handshake: dropped a connection that sent no valid hello within {} ms", self.timeout.as_millis());
            return Advance::Drop;
        }
        if p.rejecting {
            return match p.conn.flush() {
                Ok(Io::Pending) => Advance::Keep,
                _ => Advance::Drop,
            };
        }
        let hello = match p.conn.read_frame() {
            Ok(Io::Pending) => return Advance::Keep,
            Ok(Io::Ready(Message::Hello(h))) => h,
            Ok(Io::Ready(other)) => {
                tracing::warn!(%peer, "handshake: dropped a connection that sent {} instead of a hello", msg_name(&other));
                return Advance::Drop;
            }
            Err(e) => {
                tracing::warn!(%peer, "handshake: dropped connection: {}", e.into_error("connector", "reading its hello"));
                return Advance::Drop;
            }
        };
        let reject = |p: &mut Pending, reason: String| {
            tracing::warn!(%peer, "handshake: rejected connection: {reason}");
            if p.conn.queue(&Message::Reject(reason)).is_err() {
                return Advance::Drop;
            }
            p.rejecting = true;
            match p.conn.flush() {
                Ok(Io::Pending) => Advance::Keep,
                _ => Advance::Drop,
            }
        };
        if hello.nonce != self.nonce {
            return reject(
                p,
                format!(
                    "nonce {:#x} does not match this listener's {:#x} (stale handle or a different listener on a reused port)",
                    hello.nonce, self.nonce
                ),
            );
        }
        let mut paths = Vec::with_capacity(hello.paths.len());
        for (n, (req, par)) in hello.paths.iter().zip(&hello.params.paths).enumerate() {
            match check_incoming(
                &self.view.links,
                &self.view.routes,
                req.acceptor,
                req.connector.addr(),
                req.kind,
                self.view.reach,
            ) {
                Ok(l) => paths.push(AcceptedPath {
                    local: l.clone(),
                    request: *req,
                    peer_params: par.clone(),
                }),
                Err(reason) => {
                    return reject(
                        p,
                        format!(
                            "path {n} ({} -> {}): {reason}",
                            req.connector.addr(),
                            req.acceptor
                        ),
                    );
                }
            }
        }
        Advance::Hello(hello, paths)
    }
}

enum Advance {
    Keep,
    Drop,
    Hello(Hello, Vec<AcceptedPath>),
}

/// What [`Incoming::poll`] reports.
#[derive(Debug)]
pub enum AcceptPoll {
    Pending,
    Done(Established),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IState {
    AwaitCaller,
    SendReply,
    AwaitReady,
    SendReject,
    Finished,
}

/// An incoming connection whose hello checked out. Answer it with [`Incoming::respond`] (or
/// [`Incoming::reject`]) and poll it until `Done`.
#[derive(Debug)]
pub struct Incoming {
    /// Taken when the handshake completes (the socket moves to the caller).
    conn: Option<Conn>,
    peer: SocketAddr,
    hello: Hello,
    paths: Vec<AcceptedPath>,
    state: IState,
    deadline: Instant,
    timeout: Duration,
    reject_reason: Option<String>,
}

impl Incoming {
    fn conn(&mut self) -> Result<&mut Conn> {
        self.conn
            .as_mut()
            .ok_or_else(|| Error::Internal("incoming connection used after it completed".into()))
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

    /// Sends this side's params (one per path, same order). The deadline restarts here.
    pub fn respond(&mut self, mine: SideParams) -> Result<()> {
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
        let nonce = self.hello.nonce;
        self.conn()?.queue(&Message::Reply(Reply {
            nonce,
            params: mine,
        }))?;
        self.state = IState::SendReply;
        self.deadline = Instant::now() + self.timeout;
        Ok(())
    }

    /// Refuses the connection with a reason the connector reports (e.g. QP creation failed here).
    /// Poll until it returns the error carrying the reason.
    pub fn reject(&mut self, reason: &str) -> Result<()> {
        self.conn()?.queue(&Message::Reject(reason.to_string()))?;
        self.reject_reason = Some(reason.to_string());
        self.state = IState::SendReject;
        self.deadline = Instant::now() + self.timeout;
        Ok(())
    }

    /// Advances without blocking.
    pub fn poll(&mut self) -> Result<AcceptPoll> {
        let who = format!("connector {}", self.peer);
        loop {
            if self.state != IState::AwaitCaller
                && self.state != IState::Finished
                && Instant::now() > self.deadline
            {
                let step = match self.state {
                    IState::SendReply => "sending the reply",
                    IState::AwaitReady => "waiting for its ready message",
                    _ => "sending a reject",
                };
                self.state = IState::Finished;
                return Err(Error::Timeout(format!(
                    "accepting from {who}: no progress within {} ms while {step} (NCCL_SWITCHLESS_CONNECT_TIMEOUT)",
                    self.timeout.as_millis()
                )));
            }
            match self.state {
                IState::AwaitCaller => return Ok(AcceptPoll::Pending),
                IState::SendReply | IState::SendReject => match self.conn()?.flush() {
                    Ok(Io::Pending) => return Ok(AcceptPoll::Pending),
                    Ok(Io::Ready(())) if self.state == IState::SendReply => {
                        self.state = IState::AwaitReady
                    }
                    Ok(Io::Ready(())) => {
                        self.state = IState::Finished;
                        let reason = self.reject_reason.take().unwrap_or_default();
                        return Err(Error::System(format!(
                            "refused the connection from {who}: {reason}"
                        )));
                    }
                    Err(e) => {
                        self.state = IState::Finished;
                        return Err(Error::io(format!("{who}: sending the reply"), e));
                    }
                },
                IState::AwaitReady => match self.conn()?.read_frame() {
                    Ok(Io::Pending) => return Ok(AcceptPoll::Pending),
                    Ok(Io::Ready(Message::Ready)) => {
                        self.state = IState::Finished;
                        let conn = self.conn.take().ok_or_else(|| {
                            Error::Internal("incoming socket already taken".into())
                        })?;
                        let stream = conn.stream;
                        let local = stream
                            .local_addr()
                            .map_err(|e| Error::io("socket address", e))?;
                        return Ok(AcceptPoll::Done(Established {
                            stream,
                            local,
                            peer: self.peer,
                        }));
                    }
                    Ok(Io::Ready(other)) => {
                        self.state = IState::Finished;
                        return Err(Error::Remote(format!(
                            "{who} sent {} instead of ready",
                            msg_name(&other)
                        )));
                    }
                    Err(e) => {
                        self.state = IState::Finished;
                        return Err(e.into_error(&who, "waiting for its ready message"));
                    }
                },
                IState::Finished => {
                    return Err(Error::Internal(
                        "incoming connection polled after it finished".into(),
                    ));
                }
            }
        }
    }
}
