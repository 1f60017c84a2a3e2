//! One stream's set-up, shared by the connection set-up (`super::setup`) and the rebuild of a
//! failed path (`super::revive`): the connector's side of a stream (connect, read the challenge,
//! answer it with the hello, check the acknowledgement) and the acceptor's (send the challenge,
//! read and check the hello). The tags are `super::auth`'s.
#![forbid(unsafe_code)]

use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use super::auth::{StreamKey, StreamNonce, random_nonce};
use super::config::{TcpConfig, apply_options};
use super::frame::{
    ACK_LEN, Ack, AckRepr, CHALLENGE_LEN, ChallengeRepr, HELLO_LEN, Hello, HelloRepr,
};
use crate::error::{Error, Result};
use crate::sys::socket as rawmem;

/// Opens the TCP connection of a stream that does not go straight to its peer: a relayed path's
/// stream reaches a relay host, which joins it to the peer (`transport::relay`). Once joined, the
/// stream opens as any other: the peer's challenge, the hello, its acknowledgement, end to end.
pub trait StreamDialer: Send + Sync {
    /// Starts joining `sock` (bound to the path's local address, non-blocking, options applied)
    /// to the peer's listener `remote`.
    fn dial(&self, sock: Socket, remote: SocketAddr) -> Result<Box<dyn DialStep>>;
}

/// One stream's connection through a [`StreamDialer`], advanced without blocking.
pub trait DialStep: Send + Sync {
    /// Where the stream's connection stands. The error names the relay and what it said.
    fn poll(&mut self) -> Result<Dialed>;
}

/// What one poll of a [`DialStep`] gave.
#[derive(Debug)]
pub enum Dialed {
    /// Call again.
    Pending,
    /// The stream reaches the peer (its challenge comes next on it).
    Joined(TcpStream),
    /// The relay ended the connection before its verdict (why, naming it): a relay drops the
    /// oldest connection that has not sent its request when a newer one needs its place, so a
    /// burst of streams can cost a few. The stream dials again ([`REDIAL_FOR`]).
    Dropped(String),
}

/// How long a relayed stream the relay keeps dropping before its verdict is dialed again, from
/// the first drop; the waits between dials double from 10 ms to 500 ms.
pub const REDIAL_FOR: Duration = Duration::from_secs(30);
const REDIAL_FIRST: Duration = Duration::from_millis(10);
const REDIAL_MAX: Duration = Duration::from_millis(500);

/// A relayed path: its streams go through a relay host (`transport::relay`), and its writes
/// complete on the peer's acknowledgement frames, end to end.
#[derive(Clone)]
pub struct RelayVia {
    /// The relay host as labels and errors name it (its name and address on this link); of a
    /// chain of two relays, both (`first > second`).
    pub name: String,
    /// A chain of two relays (connector only: the acceptor sees the last relay alone).
    pub chained: bool,
    /// Connector: opens each stream through the relay. Acceptor: `None` (the relay connects to
    /// this end's listener from its address on the link, which is the path's peer address).
    pub dialer: Option<std::sync::Arc<dyn StreamDialer>>,
}

impl RelayVia {
    /// How a path label or log line names the relay: `relay node2 (10.0.1.2)`, or for a chain
    /// `relays node2 (10.0.1.2) > node3 (10.0.2.3)`.
    pub fn phrase(&self) -> String {
        let s = if self.chained { "s" } else { "" };
        format!("relay{s} {}", self.name)
    }
}

impl std::fmt::Debug for RelayVia {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayVia")
            .field("name", &self.name)
            .field("chained", &self.chained)
            .field("dials", &self.dialer.is_some())
            .finish()
    }
}

impl PartialEq for RelayVia {
    fn eq(&self, o: &RelayVia) -> bool {
        let same = match (&self.dialer, &o.dialer) {
            (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        self.name == o.name && self.chained == o.chained && same
    }
}

impl Eq for RelayVia {}

/// One TCP path as the route layer chose it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpPathSpec {
    /// The local link address every stream binds to (so the kernel sends over that link's netdev).
    pub local: IpAddr,
    /// Connector: the peer's listener (its link address and port). Acceptor: the peer's link address
    /// (the port is ignored); accepted streams must come from it (an unspecified address is refused).
    pub remote: SocketAddr,
    /// Link speed, Mb/s (0: unknown). Stripe weight and default stream count.
    pub speed_mbps: u64,
    /// Netdev MTU in bytes (0: unknown); below 9000 a warning is logged.
    pub mtu: u32,
    /// Netdev names etc. for logs (may be empty).
    pub label: String,
    /// `Some`: a relayed path (the connector's `remote` is the peer's listener, reached through
    /// the relay; the acceptor's `remote` is the relay's address on this end's link).
    pub relay: Option<RelayVia>,
}

/// One stream of a [`TcpConnector`] (or of a path being rebuilt).
pub(super) struct OutStream {
    /// `TCP path P stream S: connecting from L to R`, for errors.
    what: String,
    /// `TCP path P stream S to R`, for errors after the connect.
    ctx: String,
    key: StreamKey,
    /// The hello without its tag (the tag answers the acceptor's challenge).
    hello: HelloRepr,
    state: OutState,
    /// A relayed stream's means to dial again when the relay drops it (`None`: a direct one).
    redial: Option<Box<Redial>>,
}

/// What a relayed stream needs to dial again, and how its redials went.
struct Redial {
    /// A relayed path's spec: its relay's dialer is what dials again.
    spec: TcpPathSpec,
    cfg: TcpConfig,
    /// The first drop (the [`REDIAL_FOR`] window counts from it), and the drops so far.
    first: Option<Instant>,
    drops: u32,
    backoff: Duration,
}

enum OutState {
    /// The TCP handshake is under way.
    Connecting(Socket),
    /// Joining the peer through a relay host ([`StreamDialer`]).
    Relaying(Box<dyn DialStep>),
    /// The relay dropped the stream's connection; dials again at `at`.
    Redialing { at: Instant },
    /// Connected; `got` bytes of the acceptor's challenge are in.
    Challenge {
        sock: TcpStream,
        buf: [u8; CHALLENGE_LEN],
        got: usize,
    },
    /// The hello answers `challenge`; `sent` bytes of it are out.
    Hello {
        sock: TcpStream,
        challenge: StreamNonce,
        bytes: [u8; HELLO_LEN],
        sent: usize,
    },
    /// The hello is out; `got` bytes of the acknowledgement are in.
    Ack {
        sock: TcpStream,
        challenge: StreamNonce,
        ack: [u8; ACK_LEN],
        got: usize,
    },
    /// Taken (the fabric is built, or a step failed).
    Gone,
}

impl OutStream {
    /// Advances without blocking; `Ok(true)` once acknowledged by the peer (its acknowledgement
    /// proves the connection secret too).
    pub(super) fn poll(&mut self) -> Result<bool> {
        loop {
            match std::mem::replace(&mut self.state, OutState::Gone) {
                OutState::Connecting(sock) => match connect_status(&sock) {
                    Ok(false) => {
                        self.state = OutState::Connecting(sock);
                        return Ok(false);
                    }
                    Ok(true) => {
                        self.state = OutState::Challenge {
                            sock: sock.into(),
                            buf: [0; CHALLENGE_LEN],
                            got: 0,
                        }
                    }
                    Err(e) => return Err(connect_error(&self.what, &e)),
                },
                OutState::Relaying(mut step) => match step.poll() {
                    Ok(Dialed::Pending) => {
                        self.state = OutState::Relaying(step);
                        return Ok(false);
                    }
                    Ok(Dialed::Joined(sock)) => {
                        self.state = OutState::Challenge {
                            sock,
                            buf: [0; CHALLENGE_LEN],
                            got: 0,
                        }
                    }
                    Ok(Dialed::Dropped(why)) => self.dropped(why)?,
                    Err(e) => return Err(e.context(&self.what)),
                },
                OutState::Redialing { at } => {
                    if Instant::now() < at {
                        self.state = OutState::Redialing { at };
                        return Ok(false);
                    }
                    self.state = OutState::Relaying(self.dial_again()?);
                }
                OutState::Challenge {
                    sock,
                    mut buf,
                    mut got,
                } => {
                    let done = read_exact_nb(&sock, &mut buf, &mut got, "its challenge")
                        .map_err(|e| e.context(&self.ctx))?;
                    if !done {
                        self.state = OutState::Challenge { sock, buf, got };
                        return Ok(false);
                    }
                    let c = ChallengeRepr::parse(&buf).map_err(|e| e.context(&self.ctx))?;
                    let hello = self.key.seal(self.hello, &c.nonce);
                    self.hello = hello;
                    self.state = OutState::Hello {
                        sock,
                        challenge: c.nonce,
                        bytes: hello.to_bytes(),
                        sent: 0,
                    };
                }
                OutState::Hello {
                    sock,
                    challenge,
                    bytes,
                    mut sent,
                } => {
                    while sent < HELLO_LEN {
                        match rawmem::send_slice(&sock, &bytes[sent..], false) {
                            Ok(n) => sent += n,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                self.state = OutState::Hello {
                                    sock,
                                    challenge,
                                    bytes,
                                    sent,
                                };
                                return Ok(false);
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => {
                                return Err(Error::io(
                                    format!("{}: sending the stream hello", self.what),
                                    e,
                                ));
                            }
                        }
                    }
                    self.state = OutState::Ack {
                        sock,
                        challenge,
                        ack: [0; ACK_LEN],
                        got: 0,
                    };
                }
                OutState::Ack {
                    sock,
                    challenge,
                    mut ack,
                    mut got,
                } => {
                    let done = read_exact_nb(&sock, &mut ack, &mut got, "its acknowledgement")
                        .map_err(|e| e.context(&self.ctx))?;
                    if done {
                        let a = Ack::new_checked(&ack[..])
                            .and_then(|a| AckRepr::parse(&a))
                            .map_err(|e| e.context(&self.ctx))?;
                        if !self.key.check_ack(&a, &self.hello, &challenge) {
                            return Err(Error::Remote(format!(
                                "{}: the acknowledgement is not authenticated by the connection \
                                 secret (something other than the peer answered)",
                                self.ctx
                            )));
                        }
                    }
                    self.state = OutState::Ack {
                        sock,
                        challenge,
                        ack,
                        got,
                    };
                    return Ok(done);
                }
                OutState::Gone => {
                    return Err(Error::Internal(format!(
                        "{}: stream used after it failed",
                        self.what
                    )));
                }
            }
        }
    }

    /// The relay dropped the stream's connection before its verdict: dials again after a wait,
    /// within [`REDIAL_FOR`] of the first drop.
    fn dropped(&mut self, why: String) -> Result<()> {
        let Some(r) = self.redial.as_mut() else {
            return Err(Error::Remote(format!("{}: {why}", self.what)));
        };
        let now = Instant::now();
        let first = *r.first.get_or_insert(now);
        r.drops += 1;
        if now.duration_since(first) + r.backoff > REDIAL_FOR {
            return Err(Error::Remote(format!(
                "{}: {why}; the relay dropped this stream's connection {} times in {} s (a relay \
                 drops the oldest connections that have not sent their request when newer ones \
                 need the room)",
                self.what,
                r.drops,
                REDIAL_FOR.as_secs()
            )));
        }
        self.state = OutState::Redialing {
            at: now + r.backoff,
        };
        r.backoff = (r.backoff * 2).min(REDIAL_MAX);
        Ok(())
    }

    /// A fresh socket for the stream, dialed through its relay.
    fn dial_again(&mut self) -> Result<Box<dyn DialStep>> {
        let Some((r, dialer)) = self
            .redial
            .as_ref()
            .and_then(|r| Some((r, r.spec.relay.as_ref()?.dialer.as_ref()?)))
        else {
            return Err(Error::Internal(format!(
                "{}: a direct stream cannot be dialed again",
                self.what
            )));
        };
        let sock = stream_socket(
            &r.spec,
            usize::from(self.hello.nstreams),
            &r.cfg,
            &self.what,
        )?;
        dialer
            .dial(sock, r.spec.remote)
            .map_err(|e| e.context(&self.what))
    }

    pub(super) fn into_stream(self) -> Option<TcpStream> {
        match self.state {
            OutState::Ack { sock, .. } => Some(sock),
            _ => None,
        }
    }
}

/// Reads what has arrived of a fixed-size message from the acceptor into `buf[*got..]`;
/// `Ok(true)` once it is complete. `what` names the message in errors.
fn read_exact_nb(sock: &TcpStream, buf: &mut [u8], got: &mut usize, what: &str) -> Result<bool> {
    while *got < buf.len() {
        match rawmem::recv_slice(sock, &mut buf[*got..]) {
            Ok(0) => {
                return Err(Error::Remote(format!(
                    "the acceptor closed the stream before sending {what} (it did not accept the \
                     stream's source, connection, path or tag; see its log)"
                )));
            }
            Ok(n) => *got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(Error::Remote(format!(
                    "the acceptor did not send {what}: {e}"
                )));
            }
        }
    }
    Ok(true)
}

/// An accepted connection whose hello is still arriving.
pub(super) struct PendingHello {
    pub(super) sock: TcpStream,
    pub(super) from: SocketAddr,
    pub(super) path: usize,
    /// The challenge sent on it: its hello must answer this.
    pub(super) challenge: StreamNonce,
    pub(super) buf: [u8; HELLO_LEN],
    got: usize,
    pub(super) since: Instant,
}

impl PendingHello {
    /// Sends a fresh challenge on `sock`, accepted from `from` for path `path` (the caller checked
    /// the source): a connection that cannot take 24 bytes at once is refused.
    pub(super) fn challenge(
        sock: TcpStream,
        from: SocketAddr,
        path: usize,
        now: Instant,
    ) -> Result<PendingHello> {
        let challenge = random_nonce()?;
        let bytes = ChallengeRepr { nonce: challenge }.to_bytes();
        // 24 bytes into a fresh socket's empty buffer: all or nothing, never blocks.
        match rawmem::send_slice(&sock, &bytes, false) {
            Ok(n) if n == bytes.len() => {}
            Ok(n) => {
                return Err(Error::Remote(format!(
                    "the connection took {n} of {CHALLENGE_LEN} challenge bytes"
                )));
            }
            Err(e) => return Err(Error::io("sending the stream challenge", e)),
        }
        Ok(PendingHello {
            sock,
            from,
            path,
            challenge,
            buf: [0; HELLO_LEN],
            got: 0,
            since: now,
        })
    }

    /// Reads what has arrived of the hello: `None` while it is still coming (for at most
    /// [`HELLO_TIMEOUT`]), else whether it arrived whole.
    pub(super) fn read(&mut self) -> Option<Result<()>> {
        while self.got < HELLO_LEN {
            match rawmem::recv_slice(&self.sock, &mut self.buf[self.got..]) {
                Ok(0) => {
                    return Some(Err(Error::Remote(
                        "closed before its hello was complete".into(),
                    )));
                }
                Ok(n) => self.got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Some(Err(Error::io("reading the stream hello", e))),
            }
        }
        if self.got == HELLO_LEN {
            Some(Ok(()))
        } else if self.since.elapsed() > HELLO_TIMEOUT {
            Some(Err(Error::Timeout(format!(
                "no complete hello within {} s",
                HELLO_TIMEOUT.as_secs()
            ))))
        } else {
            None
        }
    }

    /// Checks the complete hello against this listener's connection (`key`), path `path` of
    /// `npaths_want`; returns it with the acknowledgement to send once the stream is taken.
    pub(super) fn check(
        &self,
        key: &StreamKey,
        npaths_want: usize,
    ) -> Result<(HelloRepr, [u8; ACK_LEN])> {
        let h = HelloRepr::parse(&Hello::new_checked(&self.buf[..])?)?;
        key.check_hello(&h, &self.challenge)?;
        let (npaths, p) = (usize::from(h.npaths), usize::from(h.path));
        if npaths != npaths_want || p != self.path {
            return Err(Error::Remote(format!(
                "hello names path {p} of {npaths}; this listener serves path {} of {npaths_want}",
                self.path
            )));
        }
        Ok((h, key.ack(&h, &self.challenge).to_bytes()))
    }
}

/// A connection a TCP listener dropped or refused: one WARN line, within the process's rate limit
/// (`droplog`; `what` is only formatted when it is logged).
pub(super) fn drop_warn(now: Instant, src: IpAddr, what: impl FnOnce() -> String) {
    if let Some(line) = crate::transport::droplog::note(now, src, what) {
        tracing::warn!("NET/switchless: {line}");
    }
}

/// Connections whose hello has not fully arrived that an acceptor keeps at once. A new one that
/// finds them all taken takes the place of the oldest whose hello has not arrived (read first: a
/// whole hello keeps its place).
pub const MAX_PENDING_STREAMS: usize = 64;

/// Makes room in `pending` for one more stream when it holds [`MAX_PENDING_STREAMS`]: reads what
/// has arrived and drops the oldest connection whose hello is still incomplete (returned, to log).
/// A connection whose hello is whole keeps its place (the caller checks it next). `Err(())` when
/// every one has its hello: the newcomer is refused.
pub(super) fn make_room(pending: &mut Vec<PendingHello>) -> Result<Option<PendingHello>, ()> {
    if pending.len() < MAX_PENDING_STREAMS {
        return Ok(None);
    }
    let mut order: Vec<(Instant, usize)> = pending
        .iter()
        .enumerate()
        .map(|(i, p)| (p.since, i))
        .collect();
    order.sort_unstable();
    for (_, i) in order {
        // Ends, errors and timeouts show at the next `read`; only a whole hello keeps its place.
        let _ = pending[i].read();
        if pending[i].got < HELLO_LEN {
            return Ok(Some(pending.swap_remove(i)));
        }
    }
    Err(())
}
/// Time a connection gets to deliver its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts one stream of a path: binds `spec.local` and starts a non-blocking connect to
/// `spec.remote`; once connected, the acceptor's challenge is answered with `hello` (which gets a
/// fresh connector nonce here, and its connection id and tag from `key`; [`OutStream::poll`]).
pub(super) fn start_stream(
    spec: &TcpPathSpec,
    hello: &HelloRepr,
    key: &StreamKey,
    cfg: &TcpConfig,
) -> Result<OutStream> {
    let what = format!(
        "TCP path {} stream {}: connecting from {} to {}",
        hello.path, hello.stream, spec.local, spec.remote
    );
    let ctx = format!(
        "TCP path {} stream {} to {}",
        hello.path, hello.stream, spec.remote
    );
    if spec.remote.ip().is_unspecified() || spec.remote.port() == 0 {
        return Err(Error::InvalidArgument(format!(
            "{what}: the peer's address and port must be set"
        )));
    }
    let sock = stream_socket(spec, usize::from(hello.nstreams), cfg, &what)?;
    let mut hello = *hello;
    hello.nonce = random_nonce()?;
    if let Some(d) = spec.relay.as_ref().and_then(|r| r.dialer.as_ref()) {
        let step = d.dial(sock, spec.remote).map_err(|e| e.context(&what))?;
        return Ok(OutStream {
            what,
            ctx,
            key: key.clone(),
            hello,
            state: OutState::Relaying(step),
            redial: Some(Box::new(Redial {
                spec: spec.clone(),
                cfg: cfg.clone(),
                first: None,
                drops: 0,
                backoff: REDIAL_FIRST,
            })),
        });
    }
    let state = match connect_start(&sock, spec.remote) {
        Ok(true) => OutState::Challenge {
            sock: sock.into(),
            buf: [0; CHALLENGE_LEN],
            got: 0,
        },
        Ok(false) => OutState::Connecting(sock),
        Err(e) => return Err(connect_error(&what, &e)),
    };
    Ok(OutStream {
        what,
        ctx,
        key: key.clone(),
        hello,
        state,
        redial: None,
    })
}

/// A stream's socket: `TCP_NODELAY`, the path's buffer options, bound to the local link address,
/// non-blocking.
fn stream_socket(
    spec: &TcpPathSpec,
    nstreams: usize,
    cfg: &TcpConfig,
    what: &str,
) -> Result<Socket> {
    let sock = Socket::new(
        Domain::for_address(spec.remote),
        Type::STREAM,
        Some(Protocol::TCP),
    )
    .map_err(|e| Error::io(what, e))?;
    sock.set_tcp_nodelay(true)
        .map_err(|e| Error::io(format!("{what}: TCP_NODELAY"), e))?;
    apply_options(&sock, spec.speed_mbps, nstreams, cfg)?;
    sock.bind(&SocketAddr::new(spec.local, 0).into())
        .map_err(|e| {
            Error::System(format!(
                "{what}: binding to the local link address failed: {e}; the address must be configured on this host"
            ))
        })?;
    sock.set_nonblocking(true)
        .map_err(|e| Error::io(format!("{what}: making the socket non-blocking"), e))?;
    Ok(sock)
}

/// Starts a non-blocking connect of `sock` to `remote`: `Ok(true)` when it connected at once,
/// `Ok(false)` while it is in progress ([`connect_status`] tells when it finished).
pub fn connect_start(sock: &Socket, remote: SocketAddr) -> io::Result<bool> {
    match sock.connect(&remote.into()) {
        Ok(()) => Ok(true),
        Err(e)
            if e.raw_os_error() == Some(libc::EINPROGRESS)
                || e.kind() == io::ErrorKind::WouldBlock =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// `Ok(true)` once a non-blocking connect finished, `Ok(false)` while it is in progress.
pub fn connect_status(s: &Socket) -> io::Result<bool> {
    if let Some(e) = s.take_error()? {
        return Err(e);
    }
    match s.peer_addr() {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The error of a failed stream connect, with what to check.
fn connect_error(what: &str, e: &io::Error) -> Error {
    let hint = match e.raw_os_error() {
        Some(libc::ENETUNREACH) | Some(libc::EHOSTUNREACH) => {
            "; the peer is not on the subnet of the local link (no route): on a switchless mesh \
             only the cable's far end is reachable from a link address"
        }
        Some(libc::ECONNREFUSED) => "; nothing listens there (the peer's listener is closed)",
        _ => "",
    };
    if e.kind() == io::ErrorKind::TimedOut {
        Error::Timeout(format!("{what}: {e}"))
    } else {
        Error::System(format!("{what} failed: {e}{hint}"))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::transport::handshake::auth::ConnSecret;

    /// A relay that drops every connection before its verdict; counts the dials.
    struct Dropping(Arc<AtomicUsize>);
    struct DropStep;

    impl DialStep for DropStep {
        fn poll(&mut self) -> Result<Dialed> {
            Ok(Dialed::Dropped(
                "relay 10.0.0.2:24600: closed before sending its verdict".into(),
            ))
        }
    }

    impl StreamDialer for Dropping {
        fn dial(&self, _sock: Socket, _remote: SocketAddr) -> Result<Box<dyn DialStep>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(Box::new(DropStep))
        }
    }

    #[test]
    fn a_stream_the_relay_keeps_dropping_dials_again_then_fails_naming_the_drops() {
        let dials = Arc::new(AtomicUsize::new(0));
        let spec = TcpPathSpec {
            local: IpAddr::from([127, 0, 0, 1]),
            remote: SocketAddr::from(([127, 0, 0, 1], 9)),
            speed_mbps: 10_000,
            mtu: 0,
            label: String::new(),
            relay: Some(RelayVia {
                name: "k (10.0.0.2)".into(),
                dialer: Some(Arc::new(Dropping(dials.clone()))),
                chained: false,
            }),
        };
        let hello = HelloRepr {
            npaths: 1,
            path: 0,
            nstreams: 1,
            stream: 0,
            generation: 0,
            conn: 7,
            nonce: [0; super::super::frame::NONCE_LEN],
            tag: [0; super::super::frame::TAG_LEN],
        };
        let key = StreamKey::new(&ConnSecret::from_bytes([1; 32]));
        let mut o = start_stream(&spec, &hello, &key, &TcpConfig::default()).unwrap();
        // Dropped connections are dialed again, each on a fresh socket, after short waits.
        let t = Instant::now();
        while dials.load(Ordering::SeqCst) < 4 {
            assert!(!o.poll().unwrap());
            assert!(t.elapsed() < Duration::from_secs(10), "never dialed again");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Past the window, the next drop fails the stream, naming the relay's words and the count.
        if let Some(r) = o.redial.as_mut() {
            r.first = Instant::now().checked_sub(REDIAL_FOR);
        }
        let e = loop {
            match o.poll() {
                Ok(false) => std::thread::sleep(Duration::from_millis(1)),
                Ok(true) => panic!("a stream that was never joined came up"),
                Err(e) => break e.to_string(),
            }
            assert!(t.elapsed() < Duration::from_secs(20), "never gave up");
        };
        assert!(
            e.contains("closed before sending its verdict")
                && e.contains("dropped this stream's connection 5 times in 30 s")
                && e.contains("TCP path 0 stream 0"),
            "{e}"
        );
    }
}
