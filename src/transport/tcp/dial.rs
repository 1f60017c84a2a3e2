//! One stream's set-up, shared by the connection set-up (`super::setup`) and the rebuild of a
//! failed path (`super::revive`): the connector's side of a stream (connect, hello, wait for the
//! acknowledgement) and the acceptor's (read and check the hello).
#![forbid(unsafe_code)]

use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use super::config::{TcpConfig, apply_options};
use super::frame::{ACK_LEN, Ack, AckRepr, HELLO_LEN, Hello, HelloRepr};
use crate::error::{Error, Result};
use crate::sys::socket as rawmem;

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
}

/// One stream of a [`TcpConnector`] (or of a path being rebuilt).
pub(super) struct OutStream {
    /// `TCP path P stream S: connecting from L to R`, for errors.
    what: String,
    /// `TCP path P stream S to R`, for errors after the connect.
    ctx: String,
    hello: [u8; HELLO_LEN],
    state: OutState,
}

enum OutState {
    /// The TCP handshake is under way.
    Connecting(Socket),
    /// Connected; `sent` bytes of the hello are out.
    Hello { sock: TcpStream, sent: usize },
    /// The hello is out; `got` bytes of the acknowledgement are in.
    Ack {
        sock: TcpStream,
        ack: [u8; ACK_LEN],
        got: usize,
    },
    /// Taken (the fabric is built, or a step failed).
    Gone,
}

impl OutStream {
    /// Advances without blocking; `Ok(true)` once acknowledged.
    pub(super) fn poll(&mut self) -> Result<bool> {
        loop {
            match std::mem::replace(&mut self.state, OutState::Gone) {
                OutState::Connecting(sock) => match connect_status(&sock) {
                    Ok(false) => {
                        self.state = OutState::Connecting(sock);
                        return Ok(false);
                    }
                    Ok(true) => {
                        self.state = OutState::Hello {
                            sock: sock.into(),
                            sent: 0,
                        }
                    }
                    Err(e) => return Err(connect_error(&self.what, &e)),
                },
                OutState::Hello { sock, mut sent } => {
                    while sent < HELLO_LEN {
                        match rawmem::send_slice(&sock, &self.hello[sent..], false) {
                            Ok(n) => sent += n,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                self.state = OutState::Hello { sock, sent };
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
                        ack: [0; ACK_LEN],
                        got: 0,
                    };
                }
                OutState::Ack {
                    sock,
                    mut ack,
                    mut got,
                } => {
                    let done =
                        read_ack(&sock, &mut ack, &mut got).map_err(|e| e.context(&self.ctx))?;
                    if done {
                        Ack::new_checked(&ack[..])
                            .and_then(|a| AckRepr::parse(&a))
                            .map_err(|e| e.context(&self.ctx))?;
                    }
                    self.state = OutState::Ack { sock, ack, got };
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

    pub(super) fn into_stream(self) -> Option<TcpStream> {
        match self.state {
            OutState::Ack { sock, .. } => Some(sock),
            _ => None,
        }
    }
}

/// Reads what has arrived of a stream's acknowledgement into `ack[*got..]`; `Ok(true)` once it is
/// complete.
fn read_ack(sock: &TcpStream, ack: &mut [u8; ACK_LEN], got: &mut usize) -> Result<bool> {
    while *got < ack.len() {
        match rawmem::recv_slice(sock, &mut ack[*got..]) {
            Ok(0) => {
                return Err(Error::Remote(
                    "the acceptor closed the stream before acknowledging it (it did not accept our \
                     nonce, path index or count; see its log)"
                        .into(),
                ));
            }
            Ok(n) => *got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(Error::Remote(format!(
                    "the acceptor did not acknowledge the stream: {e}"
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
    pub(super) buf: [u8; HELLO_LEN],
    got: usize,
    since: Instant,
}

impl PendingHello {
    pub(super) fn new(
        sock: TcpStream,
        from: SocketAddr,
        path: usize,
        now: Instant,
    ) -> PendingHello {
        PendingHello {
            sock,
            from,
            path,
            buf: [0; HELLO_LEN],
            got: 0,
            since: now,
        }
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
}

/// Connections whose hello has not fully arrived that an acceptor keeps at once; more are closed.
pub const MAX_PENDING_STREAMS: usize = 64;
/// Time a connection gets to deliver its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts one stream of a path: binds `spec.local` and starts a non-blocking connect to
/// `spec.remote`; the hello is sent once it is connected ([`OutStream::poll`]).
pub(super) fn start_stream(
    spec: &TcpPathSpec,
    hello: &HelloRepr,
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
    let sock = Socket::new(
        Domain::for_address(spec.remote),
        Type::STREAM,
        Some(Protocol::TCP),
    )
    .map_err(|e| Error::io(&what, e))?;
    sock.set_tcp_nodelay(true)
        .map_err(|e| Error::io(format!("{what}: TCP_NODELAY"), e))?;
    apply_options(&sock, spec.speed_mbps, usize::from(hello.nstreams), cfg)?;
    sock.bind(&SocketAddr::new(spec.local, 0).into())
        .map_err(|e| {
            Error::System(format!(
                "{what}: binding to the local link address failed: {e}; the address must be configured on this host"
            ))
        })?;
    sock.set_nonblocking(true)
        .map_err(|e| Error::io(format!("{what}: making the socket non-blocking"), e))?;
    let state = match sock.connect(&spec.remote.into()) {
        Ok(()) => OutState::Hello {
            sock: sock.into(),
            sent: 0,
        },
        Err(e)
            if e.raw_os_error() == Some(libc::EINPROGRESS)
                || e.kind() == io::ErrorKind::WouldBlock =>
        {
            OutState::Connecting(sock)
        }
        Err(e) => return Err(connect_error(&what, &e)),
    };
    Ok(OutStream {
        what,
        ctx,
        hello: hello.to_bytes(),
        state,
    })
}

/// `Ok(true)` once a non-blocking connect finished, `Ok(false)` while it is in progress.
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

/// Checks a complete stream hello against this listener (path `path` of `npaths_want`, the
/// connection's `nonce`); returns the hello.
pub(super) fn check_hello(
    buf: &[u8; HELLO_LEN],
    path: usize,
    npaths_want: usize,
    nonce: u64,
) -> Result<HelloRepr> {
    let h = HelloRepr::parse(&Hello::new_checked(&buf[..])?)?;
    if h.nonce != nonce {
        return Err(Error::Remote(
            "hello nonce does not match this connection".into(),
        ));
    }
    let (npaths, p) = (usize::from(h.npaths), usize::from(h.path));
    if npaths != npaths_want || p != path {
        return Err(Error::Remote(format!(
            "hello names path {p} of {npaths}; this listener serves path {path} of {npaths_want}"
        )));
    }
    Ok(h)
}
