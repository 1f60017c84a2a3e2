//! Setting up a TCP connection's streams: listeners, the non-blocking [`TcpConnector`] and
//! [`TcpAcceptor`] (each stream opens with a hello that the acceptor checks and acknowledges), and
//! building the [`TcpFabric`] from the connected streams.
#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use super::TcpFabric;
use super::config::{MAX_STREAMS, TcpConfig, apply_buffers, streams_for_speed};
use super::pool;
use super::state::{PathShared, RxState, Shared, StreamShared, TxQueue, TxState, lock, write_lock};
use crate::error::{Error, Result};
use crate::sys::socket as rawmem;
use crate::transport::fabric::{Fabric, PathInfo, PathRole};

const HELLO_MAGIC: [u8; 4] = *b"SWTS";
const ACK_MAGIC: [u8; 4] = *b"SWTA";
const HELLO_VERSION: u8 = 1;
const HELLO_LEN: usize = 24;

/// One TCP path as the route layer chose it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpPathSpec {
    /// The local link address every stream binds to (so the kernel sends over that link's netdev).
    pub local: IpAddr,
    /// Connector: the peer's listener (its link address and port). Acceptor: the peer's link address
    /// (the port is ignored); accepted streams must come from it unless it is unspecified.
    pub remote: SocketAddr,
    /// Link speed, Mb/s (0: unknown). Stripe weight and default stream count.
    pub speed_mbps: u64,
    /// Netdev MTU in bytes (0: unknown); below 9000 a warning is logged.
    pub mtu: u32,
    /// Netdev names etc. for logs (may be empty).
    pub label: String,
}

/// Binds a listener for one path on `local` (port chosen by the kernel), with the socket buffers of
/// `cfg` already applied (accepted sockets inherit them, which the TCP window scale needs).
pub fn listen(local: IpAddr, speed_mbps: u64, cfg: &TcpConfig) -> Result<TcpListener> {
    listen_at(SocketAddr::new(local, 0), speed_mbps, cfg)
}

/// Like [`listen`] on a chosen port (tools and tests that have no handshake to carry the port).
pub fn listen_at(addr: SocketAddr, speed_mbps: u64, cfg: &TcpConfig) -> Result<TcpListener> {
    cfg.check()?;
    let local = addr.ip();
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .map_err(|e| Error::io(format!("TCP listener socket for {local}"), e))?;
    let streams = cfg.streams.unwrap_or_else(|| streams_for_speed(speed_mbps));
    apply_buffers(&sock, speed_mbps, streams, cfg)?;
    sock.set_reuse_address(true)
        .map_err(|e| Error::io("SO_REUSEADDR", e))?;
    sock.bind(&addr.into())
        .map_err(|e| Error::io(format!("binding a TCP listener to {addr}"), e))?;
    sock.listen(128)
        .map_err(|e| Error::io(format!("listening on {local}"), e))?;
    Ok(sock.into())
}

impl TcpFabric {
    /// Builds the endpoint from connected streams (`streams[path]`), one entry of `specs` per path.
    pub(super) fn from_streams(
        specs: &[TcpPathSpec],
        streams: Vec<Vec<TcpStream>>,
        cfg: &TcpConfig,
        role: &str,
        pre: Option<TcpFabric>,
    ) -> Result<TcpFabric> {
        let mut paths = Vec::with_capacity(specs.len());
        let mut shared = Vec::with_capacity(specs.len());
        for (i, (spec, socks)) in specs.iter().zip(streams).enumerate() {
            let peer = socks
                .first()
                .and_then(|s| s.peer_addr().ok())
                .map_or_else(|| spec.remote.to_string(), |a| a.ip().to_string());
            let label = format!(
                "tcp{i} {}{}{} -> {peer} ({} streams, MTU {} bytes)",
                spec.label,
                if spec.label.is_empty() { "" } else { " " },
                spec.local,
                socks.len(),
                spec.mtu
            );
            if role.is_empty() {
                // Not connected yet (`TcpFabric::unconnected`): no log line, no warning.
            } else if spec.mtu != 0 && spec.mtu < 9000 && !spec.local.is_loopback() {
                tracing::warn!(
                    "NET/switchless: TCP path {label}: MTU {} bytes is below 9000; \
                     jumbo frames (ip link set <dev> mtu 9000 on both ends) cut the per-packet CPU cost",
                    spec.mtu
                );
            }
            if !role.is_empty() {
                tracing::info!(
                    "NET/switchless: TCP path {label} ({role}): speed {} Mb/s, frame {} bytes",
                    spec.speed_mbps,
                    cfg.frame_bytes
                );
            }
            paths.push(PathInfo {
                label: label.clone(),
                speed_mbps: spec.speed_mbps,
                role: PathRole::Data,
            });
            shared.push(PathShared {
                label,
                streams: socks
                    .into_iter()
                    .map(|sock| StreamShared {
                        sock,
                        q: Mutex::new(TxQueue::default()),
                        queued: AtomicU64::new(0),
                        sent_bytes: AtomicU64::new(0),
                        mid_frame: AtomicBool::new(false),
                    })
                    .collect(),
                tx: Mutex::new(TxState::default()),
                rx: Mutex::new(RxState::default()),
                cq: Mutex::new(VecDeque::new()),
            });
        }
        let sh = Arc::new(Shared {
            stop: AtomicBool::new(false),
            paths: shared,
            regs: RwLock::new(HashMap::new()),
        });
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.subsec_nanos())
            | 1;
        let mut fab = TcpFabric {
            sh: Arc::clone(&sh),
            paths,
            io: Vec::new(),
            ctrl: Vec::new(),
            tokens: HashMap::new(),
            next_key: seed,
            next_token: 0,
            frame_bytes: cfg.frame_bytes,
            shut: false,
        };
        // Before any receiver runs: the peer may write into adopted memory at once.
        if let Some(pre) = pre {
            fab.adopt(pre)?;
        }
        if let Err(e) = pool::add_streams(&sh, cfg.io_threads, &mut fab.io) {
            let _ = fab.shutdown();
            return Err(e);
        }
        Ok(fab)
    }

    /// An endpoint whose streams are not connected yet: memory can be registered, control memory
    /// allocated and receives posted (what the protocol does before the handshake); nothing can be
    /// sent. Give it to [`TcpConnector::adopting`] / [`TcpAcceptor::adopting`]: the endpoint their
    /// `poll` returns takes all of it over (same addresses and keys) before its streams join the I/O pool.
    pub fn unconnected(specs: &[TcpPathSpec], cfg: &TcpConfig) -> Result<TcpFabric> {
        check_specs(specs)?;
        let none = specs.iter().map(|_| Vec::new()).collect();
        TcpFabric::from_streams(specs, none, cfg, "", None)
    }

    /// Takes over what `pre` (from [`TcpFabric::unconnected`], same paths) holds: registrations
    /// (same keys), control memory (same addresses), posted receives and completions. `self` must be
    /// freshly connected (no registration of its own, no stream in the I/O pool yet).
    fn adopt(&mut self, mut pre: TcpFabric) -> Result<()> {
        if pre.paths.len() != self.paths.len() {
            return Err(Error::Internal(format!(
                "adopting a TCP endpoint of {} paths into one of {}",
                pre.paths.len(),
                self.paths.len()
            )));
        }
        if pre.io.iter().any(|v| !v.is_empty()) || !self.tokens.is_empty() {
            return Err(Error::Internal(
                "TCP adopt: the old endpoint must be unconnected and the new one unused".into(),
            ));
        }
        {
            let mut from = write_lock(&pre.sh.regs);
            let mut to = write_lock(&self.sh.regs);
            to.extend(from.drain());
        }
        self.ctrl.append(&mut pre.ctrl);
        self.tokens = std::mem::take(&mut pre.tokens);
        self.next_key = pre.next_key;
        self.next_token = pre.next_token;
        for (old, new) in pre.sh.paths.iter().zip(&self.sh.paths) {
            let recvs = std::mem::take(&mut lock(&old.rx).recvs);
            lock(&new.rx).recvs.extend(recvs);
            let cqes = std::mem::take(&mut *lock(&old.cq));
            lock(&new.cq).extend(cqes);
        }
        Ok(())
    }

    /// Connects every path and waits for the acceptor: [`TcpConnector::start`] then
    /// [`TcpConnector::poll`] until done (at most [`TcpConfig::connect_timeout`]).
    pub fn connect(specs: &[TcpPathSpec], nonce: u64, cfg: &TcpConfig) -> Result<TcpFabric> {
        let mut c = TcpConnector::start(specs, nonce, cfg)?;
        loop {
            if let Some(f) = c.poll()? {
                return Ok(f);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Accepts every path's streams: [`TcpAcceptor::new`] then [`TcpAcceptor::poll`] until done (at
    /// most [`TcpConfig::connect_timeout`]).
    pub fn accept(
        listeners: &[TcpListener],
        specs: &[TcpPathSpec],
        nonce: u64,
        cfg: &TcpConfig,
    ) -> Result<TcpFabric> {
        let mut a = TcpAcceptor::new(listeners, specs, nonce, cfg)?;
        loop {
            if let Some(f) = a.poll()? {
                return Ok(f);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The connecting side of a TCP connection set-up, driven without blocking (NCCL calls `connect`
/// again and again): [`TcpConnector::start`] opens every stream (the TCP three-way handshake is done
/// by the peer's kernel, so it needs no help from the peer's application; an unreachable peer fails
/// here at once) and sends each stream's hello; [`TcpConnector::poll`] collects the acceptor's
/// acknowledgements and returns the fabric when all have arrived.
pub struct TcpConnector {
    specs: Vec<TcpPathSpec>,
    cfg: TcpConfig,
    socks: Vec<Vec<(TcpStream, [u8; 8], usize)>>,
    deadline: Instant,
    pre: Option<TcpFabric>,
}

impl TcpConnector {
    /// Connects `streams` TCP connections per path (from [`TcpConfig::streams`] or
    /// [`streams_for_speed`]), each bound to `spec.local` and connected to `spec.remote`, and
    /// announces each with `nonce` (the value the acceptor expects, from the handshake), the path
    /// index and the stream count. Blocks only for the TCP handshakes (bounded by
    /// [`TcpConfig::connect_timeout`]).
    pub fn start(specs: &[TcpPathSpec], nonce: u64, cfg: &TcpConfig) -> Result<TcpConnector> {
        cfg.check()?;
        check_specs(specs)?;
        let deadline = Instant::now() + cfg.connect_timeout;
        let mut all = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let n = cfg
                .streams
                .unwrap_or_else(|| streams_for_speed(spec.speed_mbps));
            let mut socks = Vec::with_capacity(n);
            for s in 0..n {
                let sock = connect_stream(spec, i, s, n, specs.len(), nonce, cfg, deadline)?;
                socks.push((sock, [0u8; 8], 0));
            }
            all.push(socks);
        }
        Ok(TcpConnector {
            specs: specs.to_vec(),
            cfg: cfg.clone(),
            socks: all,
            deadline,
            pre: None,
        })
    }

    /// The endpoint [`TcpConnector::poll`] returns takes over `pre` (see [`TcpFabric::unconnected`]).
    pub fn adopting(mut self, pre: TcpFabric) -> TcpConnector {
        self.pre = Some(pre);
        self
    }

    /// Reads the acknowledgements that have arrived; `Ok(Some(fabric))` once every stream is
    /// acknowledged, `Ok(None)` to call again, an error when the acceptor closed a stream (wrong
    /// nonce or path) or the deadline passed.
    pub fn poll(&mut self) -> Result<Option<TcpFabric>> {
        let mut complete = true;
        for (i, socks) in self.socks.iter_mut().enumerate() {
            for (s, (sock, ack, got)) in socks.iter_mut().enumerate() {
                while *got < ack.len() {
                    match rawmem::recv_slice(sock, &mut ack[*got..]) {
                        Ok(0) => {
                            return Err(Error::Remote(format!(
                                "TCP path {i} stream {s} to {}: the acceptor closed the stream before \
                                 acknowledging it (it did not accept our nonce, path index or count; see its log)",
                                self.specs[i].remote
                            )));
                        }
                        Ok(n) => *got += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            return Err(Error::Remote(format!(
                                "TCP path {i} stream {s} to {}: the acceptor did not acknowledge the stream: {e}",
                                self.specs[i].remote
                            )));
                        }
                    }
                }
                if *got < ack.len() {
                    complete = false;
                } else if ack[0..4] != ACK_MAGIC {
                    return Err(Error::Remote(format!(
                        "TCP path {i} stream {s}: acknowledgement {:02x?}, expected \"SWTA\"",
                        &ack[0..4]
                    )));
                }
            }
        }
        if !complete {
            if Instant::now() >= self.deadline {
                return Err(Error::Timeout(format!(
                    "TCP connect: the acceptor did not acknowledge every stream within {} ms",
                    self.cfg.connect_timeout.as_millis()
                )));
            }
            return Ok(None);
        }
        let socks = std::mem::take(&mut self.socks)
            .into_iter()
            .map(|v| v.into_iter().map(|(s, _, _)| s).collect())
            .collect();
        TcpFabric::from_streams(&self.specs, socks, &self.cfg, "connector", self.pre.take())
            .map(Some)
    }
}

/// The accepting side of a TCP connection set-up, driven without blocking (NCCL calls `accept`
/// again and again): every [`TcpAcceptor::poll`] accepts the streams that have arrived on the
/// listeners, checks their hellos and acknowledges them, and returns the fabric once every path has
/// all its streams.
pub struct TcpAcceptor {
    listeners: Vec<TcpListener>,
    specs: Vec<TcpPathSpec>,
    cfg: TcpConfig,
    nonce: u64,
    slots: Vec<Vec<Option<TcpStream>>>,
    /// Accepted connections whose hello is still arriving: (socket, peer, path, bytes, count, since).
    pending: Vec<PendingHello>,
    deadline: Instant,
    pre: Option<TcpFabric>,
}

struct PendingHello {
    sock: TcpStream,
    from: SocketAddr,
    path: usize,
    buf: [u8; HELLO_LEN],
    got: usize,
    since: Instant,
}

/// Connections whose hello has not fully arrived that an acceptor keeps at once; more are closed.
pub const MAX_PENDING_STREAMS: usize = 64;
/// Time a connection gets to deliver its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

impl TcpAcceptor {
    /// Takes one listener per path (from [`listen`]; `listeners[i]` serves path `i`). Streams must
    /// carry `nonce`, the right path index and count and, unless `specs[path].remote` is
    /// unspecified, come from the path's peer address; anything else is closed and logged, not fatal.
    pub fn new(
        listeners: &[TcpListener],
        specs: &[TcpPathSpec],
        nonce: u64,
        cfg: &TcpConfig,
    ) -> Result<TcpAcceptor> {
        cfg.check()?;
        check_specs(specs)?;
        if listeners.len() != specs.len() {
            return Err(Error::InvalidArgument(format!(
                "{} listeners for {} TCP paths; one listener per path is required",
                listeners.len(),
                specs.len()
            )));
        }
        let listeners = listeners
            .iter()
            .map(|l| {
                let l = l
                    .try_clone()
                    .map_err(|e| Error::io("duplicating a TCP listener", e))?;
                l.set_nonblocking(true)
                    .map_err(|e| Error::io("making a TCP listener non-blocking", e))?;
                Ok(l)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(TcpAcceptor {
            listeners,
            specs: specs.to_vec(),
            cfg: cfg.clone(),
            nonce,
            slots: (0..specs.len()).map(|_| Vec::new()).collect(),
            pending: Vec::new(),
            deadline: Instant::now() + cfg.connect_timeout,
            pre: None,
        })
    }

    /// The endpoint [`TcpAcceptor::poll`] returns takes over `pre` (see [`TcpFabric::unconnected`]).
    pub fn adopting(mut self, pre: TcpFabric) -> TcpAcceptor {
        self.pre = Some(pre);
        self
    }

    /// Accepts what has arrived; `Ok(Some(fabric))` when every path is complete, `Ok(None)` to call
    /// again, [`Error::Timeout`] (naming the missing streams) after [`TcpConfig::connect_timeout`].
    pub fn poll(&mut self) -> Result<Option<TcpFabric>> {
        // 1. New connections: check the peer address, then wait for the hello without blocking.
        for (i, l) in self.listeners.iter().enumerate() {
            loop {
                let (sock, from) = match l.accept() {
                    Ok(x) => x,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(Error::io(format!("accepting on TCP path {i}"), e)),
                };
                let want = self.specs[i].remote.ip();
                if !want.is_unspecified() && from.ip() != want {
                    tracing::warn!(
                        "NET/switchless: TCP path {i}: connection from {from} rejected: the path's peer is {want}"
                    );
                    continue;
                }
                if self.pending.len() >= MAX_PENDING_STREAMS {
                    tracing::warn!(
                        "NET/switchless: TCP path {i}: connection from {from} rejected: {MAX_PENDING_STREAMS} connections already wait for their hello"
                    );
                    continue;
                }
                self.pending.push(PendingHello {
                    sock,
                    from,
                    path: i,
                    buf: [0; HELLO_LEN],
                    got: 0,
                    since: Instant::now(),
                });
            }
        }
        // 2. Hellos that have arrived: check, acknowledge, file.
        let mut k = 0;
        while k < self.pending.len() {
            let ph = &mut self.pending[k];
            let mut verdict: Option<std::result::Result<(), String>> = None;
            while ph.got < HELLO_LEN {
                match rawmem::recv_slice(&ph.sock, &mut ph.buf[ph.got..]) {
                    Ok(0) => {
                        verdict = Some(Err("closed before its hello was complete".into()));
                        break;
                    }
                    Ok(n) => ph.got += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        verdict = Some(Err(format!("reading the stream hello: {e}")));
                        break;
                    }
                }
            }
            if verdict.is_none() {
                if ph.got == HELLO_LEN {
                    verdict = Some(Ok(()));
                } else if ph.since.elapsed() > HELLO_TIMEOUT {
                    verdict = Some(Err(format!(
                        "no complete hello within {} s",
                        HELLO_TIMEOUT.as_secs()
                    )));
                }
            }
            let Some(verdict) = verdict else {
                k += 1;
                continue;
            };
            let ph = self.pending.swap_remove(k);
            let (i, from) = (ph.path, ph.from);
            let checked =
                verdict.and_then(|()| check_hello(&ph.buf, i, self.specs.len(), self.nonce));
            let (s, n) = match checked {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(
                        "NET/switchless: TCP path {i}: connection from {from} rejected: {e}"
                    );
                    continue;
                }
            };
            let slot = &mut self.slots[i];
            if slot.is_empty() {
                slot.resize_with(n, || None);
            }
            if slot.len() != n || slot[s].is_some() {
                tracing::warn!(
                    "NET/switchless: TCP path {i}: stream {s} of {n} from {from} conflicts with streams already accepted; closed"
                );
                continue;
            }
            let mut sock = ph.sock;
            let mut ack = [0u8; 8];
            ack[0..4].copy_from_slice(&ACK_MAGIC);
            // 8 bytes into an empty socket buffer: never blocks.
            let sent = sock.set_nodelay(true).and_then(|()| sock.write_all(&ack));
            if let Err(e) = sent {
                tracing::warn!(
                    "NET/switchless: TCP path {i}: acknowledging stream {s} to {from}: {e}"
                );
                continue;
            }
            slot[s] = Some(sock);
        }
        let complete = self
            .slots
            .iter()
            .all(|s| !s.is_empty() && s.iter().all(Option::is_some));
        if !complete {
            if Instant::now() >= self.deadline {
                let missing: Vec<String> = self
                    .slots
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let have = s.iter().filter(|x| x.is_some()).count();
                        format!("path {i}: {have} of {} streams", s.len().max(1))
                    })
                    .collect();
                return Err(Error::Timeout(format!(
                    "accepting TCP streams for {} ms: {}",
                    self.cfg.connect_timeout.as_millis(),
                    missing.join(", ")
                )));
            }
            return Ok(None);
        }
        let streams = std::mem::take(&mut self.slots)
            .into_iter()
            .map(|s| s.into_iter().flatten().collect())
            .collect();
        TcpFabric::from_streams(&self.specs, streams, &self.cfg, "acceptor", self.pre.take())
            .map(Some)
    }
}

fn check_specs(specs: &[TcpPathSpec]) -> Result<()> {
    if specs.is_empty() || specs.len() > crate::transport::stripe::MAX_PATHS {
        return Err(Error::InvalidArgument(format!(
            "{} TCP paths; accepted: 1..={}",
            specs.len(),
            crate::transport::stripe::MAX_PATHS
        )));
    }
    Ok(())
}

fn hello(
    nonce: u64,
    npaths: usize,
    path: usize,
    nstreams: usize,
    stream: usize,
) -> [u8; HELLO_LEN] {
    let mut h = [0u8; HELLO_LEN];
    h[0..4].copy_from_slice(&HELLO_MAGIC);
    h[4] = HELLO_VERSION;
    h[5] = npaths as u8;
    h[6] = path as u8;
    h[7] = nstreams as u8;
    h[8] = stream as u8;
    h[16..24].copy_from_slice(&nonce.to_le_bytes());
    h
}

#[allow(clippy::too_many_arguments)]
fn connect_stream(
    spec: &TcpPathSpec,
    path: usize,
    stream: usize,
    nstreams: usize,
    npaths: usize,
    nonce: u64,
    cfg: &TcpConfig,
    deadline: Instant,
) -> Result<TcpStream> {
    let what = format!(
        "TCP path {path} stream {stream}: connecting from {} to {}",
        spec.local, spec.remote
    );
    let sock = Socket::new(
        Domain::for_address(spec.remote),
        Type::STREAM,
        Some(Protocol::TCP),
    )
    .map_err(|e| Error::io(&what, e))?;
    sock.set_tcp_nodelay(true)
        .map_err(|e| Error::io(format!("{what}: TCP_NODELAY"), e))?;
    apply_buffers(&sock, spec.speed_mbps, nstreams, cfg)?;
    sock.bind(&SocketAddr::new(spec.local, 0).into())
        .map_err(|e| {
            Error::System(format!(
                "{what}: binding to the local link address failed: {e}; the address must be configured on this host"
            ))
        })?;
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Error::Timeout(format!("{what}: connect deadline passed")));
    }
    sock.connect_timeout(&spec.remote.into(), left).map_err(|e| {
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
    })?;
    let mut tcp: TcpStream = sock.into();
    tcp.write_all(&hello(nonce, npaths, path, nstreams, stream))
        .map_err(|e| Error::io(format!("{what}: sending the stream hello"), e))?;
    Ok(tcp)
}

/// Checks a complete stream hello; returns (stream, stream count).
fn check_hello(
    h: &[u8; HELLO_LEN],
    path: usize,
    npaths_want: usize,
    nonce: u64,
) -> std::result::Result<(usize, usize), String> {
    if h[0..4] != HELLO_MAGIC {
        return Err(format!(
            "hello magic {:02x?}, expected \"SWTS\": not a switchless TCP stream",
            &h[0..4]
        ));
    }
    if h[4] != HELLO_VERSION {
        return Err(format!(
            "hello version {}, this plugin speaks {HELLO_VERSION}",
            h[4]
        ));
    }
    let mut nb = [0u8; 8];
    nb.copy_from_slice(&h[16..24]);
    if u64::from_le_bytes(nb) != nonce {
        return Err("hello nonce does not match this connection".into());
    }
    let (npaths, p, n, s) = (h[5] as usize, h[6] as usize, h[7] as usize, h[8] as usize);
    if npaths != npaths_want || p != path {
        return Err(format!(
            "hello names path {p} of {npaths}; this listener serves path {path} of {npaths_want}"
        ));
    }
    if !(1..=MAX_STREAMS).contains(&n) || s >= n {
        return Err(format!(
            "hello names stream {s} of {n}; accepted: 1..={MAX_STREAMS} streams"
        ));
    }
    Ok((s, n))
}

/// Two connected endpoints on 127.0.0.1 with one path per entry of `speeds_mbps` (tests, benchmarks).
pub fn loopback_pair(speeds_mbps: &[u64], cfg: &TcpConfig) -> Result<(TcpFabric, TcpFabric)> {
    let lo = IpAddr::from([127, 0, 0, 1]);
    let listeners = speeds_mbps
        .iter()
        .map(|&s| listen(lo, s, cfg))
        .collect::<Result<Vec<_>>>()?;
    let mut conn_specs = Vec::new();
    let mut acc_specs = Vec::new();
    for (l, &speed) in listeners.iter().zip(speeds_mbps) {
        let port = l
            .local_addr()
            .map_err(|e| Error::io("listener address", e))?
            .port();
        conn_specs.push(TcpPathSpec {
            local: lo,
            remote: SocketAddr::new(lo, port),
            speed_mbps: speed,
            mtu: 0,
            label: String::new(),
        });
        acc_specs.push(TcpPathSpec {
            local: lo,
            remote: SocketAddr::new(lo, 0),
            speed_mbps: speed,
            mtu: 0,
            label: String::new(),
        });
    }
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(7, |d| d.as_nanos() as u64);
    let c = cfg.clone();
    let t = std::thread::spawn(move || TcpFabric::connect(&conn_specs, nonce, &c));
    let acc = TcpFabric::accept(&listeners, &acc_specs, nonce, cfg);
    let con = t
        .join()
        .map_err(|_| Error::Internal("TCP connect thread panicked".into()))?;
    Ok((con?, acc?))
}
