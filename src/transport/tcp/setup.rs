//! Setting up a TCP connection's streams: listeners, the non-blocking [`TcpConnector`] and
//! [`TcpAcceptor`] (each stream opens with a hello that the acceptor checks and acknowledges), and
//! building the [`TcpFabric`] from the connected streams.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use super::TcpFabric;
use super::auth::{StreamKey, random_secret};
use super::config::{TcpConfig, apply_options, streams_for_speed};
use super::dial::{
    MAX_PENDING_STREAMS, OutStream, PendingHello, TcpPathSpec, drop_warn, make_room, start_stream,
};
use super::frame::{HelloRepr, NONCE_LEN, TAG_LEN};
use super::pool;
use super::revive::Redial;
use super::state::{PathShared, Shared};
use crate::error::{Error, Result};
use crate::transport::fabric::{Fabric, PathInfo, PathRole};
use crate::transport::handshake::auth::ConnSecret;

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
    apply_options(&sock, speed_mbps, streams, cfg)?;
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
        redial: Option<Redial>,
    ) -> Result<TcpFabric> {
        let mut paths = Vec::with_capacity(specs.len());
        let mut shared = Vec::with_capacity(specs.len());
        for (i, (spec, socks)) in specs.iter().zip(streams).enumerate() {
            let peer = socks
                .first()
                .and_then(|s| s.peer_addr().ok())
                .map_or_else(|| spec.remote.to_string(), |a| a.ip().to_string());
            // A relayed path names its relay host; the connector's streams reach the relay, so
            // the peer is the address it asked the relay for.
            let peer = match &spec.relay {
                Some(r) if r.dialer.is_some() => {
                    format!("{} via {}", spec.remote.ip(), r.phrase())
                }
                Some(r) => format!("relay {}", r.name),
                None => peer,
            };
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
                    frame_bytes(cfg, spec)
                );
            }
            paths.push(PathInfo {
                label: label.clone(),
                speed_mbps: spec.speed_mbps,
                role: PathRole::Data,
            });
            shared.push(RwLock::new(Arc::new(PathShared::new(
                label,
                socks,
                spec.relay.is_some(),
            ))));
        }
        let sh = Arc::new(Shared {
            stop: AtomicBool::new(false),
            paths: shared,
            regs: RwLock::new(HashMap::new()),
            peer_data_writes: AtomicBool::new(true),
            user_timeout: cfg.user_timeout,
        });
        let mut fab = TcpFabric {
            sh: Arc::clone(&sh),
            paths,
            io: Vec::new(),
            ctrl: Vec::new(),
            tokens: Arc::default(),
            next_token: Arc::default(),
            frame_bytes: cfg.frame_bytes,
            redial,
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
        TcpFabric::from_streams(specs, none, cfg, "", None, None)
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
        let unused = crate::sync::lock(&self.tokens, "TCP registration tokens")?.is_empty();
        if pre.io.iter().any(|v| !v.is_empty()) || !unused {
            return Err(Error::Internal(
                "TCP adopt: the old endpoint must be unconnected and the new one unused".into(),
            ));
        }
        {
            let mut from = pre.sh.regs_mut()?;
            let mut to = self.sh.regs_mut()?;
            to.extend(from.drain());
        }
        self.ctrl.append(&mut pre.ctrl);
        self.tokens = std::mem::take(&mut pre.tokens);
        self.next_token = std::mem::take(&mut pre.next_token);
        self.sh.peer_data_writes.store(
            pre.sh.peer_data_writes.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        for (old, new) in pre.sh.all_paths()?.iter().zip(self.sh.all_paths()?) {
            let recvs = std::mem::take(&mut old.rx()?.recvs);
            new.rx()?.recvs.extend(recvs);
            let cqes = std::mem::take(&mut *old.cq()?);
            new.cq()?.extend(cqes);
        }
        Ok(())
    }

    /// Connects every path and waits for the acceptor: [`TcpConnector::start`] then
    /// [`TcpConnector::poll`] until done (bounded by [`TcpConfig::connect_timeout`] when set).
    pub fn connect(
        specs: &[TcpPathSpec],
        secret: &ConnSecret,
        cfg: &TcpConfig,
    ) -> Result<TcpFabric> {
        let mut c = TcpConnector::start(specs, secret, cfg)?;
        loop {
            if let Some(f) = c.poll()? {
                return Ok(f);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Accepts every path's streams: [`TcpAcceptor::new`] then [`TcpAcceptor::poll`] until done
    /// (bounded by [`TcpConfig::connect_timeout`] when set).
    pub fn accept(
        listeners: &[TcpListener],
        specs: &[TcpPathSpec],
        secret: &ConnSecret,
        cfg: &TcpConfig,
    ) -> Result<TcpFabric> {
        let mut a = TcpAcceptor::new(listeners, specs, secret, cfg)?;
        loop {
            if let Some(f) = a.poll()? {
                return Ok(f);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The connecting side of a TCP connection set-up, driven without blocking (NCCL calls `connect`
/// again and again): [`TcpConnector::start`] starts a non-blocking TCP connect for every stream (an
/// address that fails at once, unreachable or not configured here, fails here); each
/// [`TcpConnector::poll`] finishes the connects that completed, sends each stream's hello, collects
/// the acceptor's acknowledgements and returns the fabric when all have arrived. No call waits on
/// the network.
pub struct TcpConnector {
    specs: Vec<TcpPathSpec>,
    cfg: TcpConfig,
    /// Per path, per stream.
    socks: Vec<Vec<OutStream>>,
    deadline: Option<Instant>,
    pre: Option<TcpFabric>,
    key: StreamKey,
}

impl TcpConnector {
    /// Starts `streams` TCP connections per path (from [`TcpConfig::streams`] or
    /// [`streams_for_speed`]), each bound to `spec.local` and connecting to `spec.remote` without
    /// waiting; each answers the acceptor's challenge with a hello (the path index, the stream
    /// count) tagged with a key derived from `secret`, the connection's secret from the
    /// authenticated handshake (`super::auth`).
    pub fn start(
        specs: &[TcpPathSpec],
        secret: &ConnSecret,
        cfg: &TcpConfig,
    ) -> Result<TcpConnector> {
        cfg.check()?;
        check_specs(specs)?;
        let key = StreamKey::new(secret);
        let deadline = cfg.connect_timeout.map(|t| Instant::now() + t);
        let mut all = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let n = cfg
                .streams
                .unwrap_or_else(|| streams_for_speed(spec.speed_mbps));
            let mut socks = Vec::with_capacity(n);
            for s in 0..n {
                // Paths and streams are bounded by MAX_PATHS and MAX_STREAMS: each fits its byte.
                let byte = |v: usize| {
                    u8::try_from(v).map_err(|_| {
                        Error::Internal(format!("TCP stream hello: {v} does not fit a byte"))
                    })
                };
                let hello = HelloRepr {
                    npaths: byte(specs.len())?,
                    path: byte(i)?,
                    nstreams: byte(n)?,
                    stream: byte(s)?,
                    generation: 0,
                    conn: 0,
                    nonce: [0; NONCE_LEN],
                    tag: [0; TAG_LEN],
                };
                socks.push(start_stream(spec, &hello, &key, cfg)?);
            }
            all.push(socks);
        }
        Ok(TcpConnector {
            specs: specs.to_vec(),
            cfg: cfg.clone(),
            socks: all,
            deadline,
            pre: None,
            key,
        })
    }

    /// The endpoint [`TcpConnector::poll`] returns takes over `pre` (see [`TcpFabric::unconnected`]).
    pub fn adopting(mut self, pre: TcpFabric) -> TcpConnector {
        self.pre = Some(pre);
        self
    }

    /// Finishes connects, sends hellos and reads the acknowledgements that have arrived;
    /// `Ok(Some(fabric))` once every stream is acknowledged, `Ok(None)` to call again, an error when
    /// a connect failed, the acceptor closed a stream (wrong nonce or path) or the deadline passed.
    pub fn poll(&mut self) -> Result<Option<TcpFabric>> {
        let mut complete = true;
        for st in self.socks.iter_mut().flatten() {
            complete &= st.poll()?;
        }
        if !complete {
            if let Some(d) = self.deadline
                && Instant::now() >= d
            {
                return Err(Error::Timeout(format!(
                    "TCP connect: the acceptor did not acknowledge every stream within {} ms",
                    self.cfg.connect_timeout.unwrap_or_default().as_millis()
                )));
            }
            return Ok(None);
        }
        let socks = std::mem::take(&mut self.socks)
            .into_iter()
            .map(|v| v.into_iter().filter_map(OutStream::into_stream).collect())
            .collect();
        let redial = Redial::new(self.key.clone(), &self.cfg, &self.specs, Vec::new());
        TcpFabric::from_streams(
            &self.specs,
            socks,
            &self.cfg,
            "connector",
            self.pre.take(),
            Some(redial),
        )
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
    key: StreamKey,
    slots: Vec<Vec<Option<TcpStream>>>,
    /// Accepted connections whose hello is still arriving.
    pending: Vec<PendingHello>,
    deadline: Option<Instant>,
    pre: Option<TcpFabric>,
}

impl TcpAcceptor {
    /// Takes one listener per path (from [`listen`]; `listeners[i]` serves path `i`). Streams must
    /// come from the path's peer address `specs[path].remote` (which must be set), answer the
    /// challenge sent on them with a hello tagged with a key derived from `secret` (the
    /// connection's secret from the authenticated handshake) and carry the right path index and
    /// count; anything else is closed and logged (rate-limited), not fatal.
    pub fn new(
        listeners: &[TcpListener],
        specs: &[TcpPathSpec],
        secret: &ConnSecret,
        cfg: &TcpConfig,
    ) -> Result<TcpAcceptor> {
        cfg.check()?;
        check_specs(specs)?;
        if let Some((i, s)) = specs
            .iter()
            .enumerate()
            .find(|(_, s)| s.remote.ip().is_unspecified())
        {
            return Err(Error::InvalidArgument(format!(
                "TCP path {i}: the acceptor's peer address is {}; accepted: the peer's link address (streams from any other source are refused)",
                s.remote.ip()
            )));
        }
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
            key: StreamKey::new(secret),
            slots: (0..specs.len()).map(|_| Vec::new()).collect(),
            pending: Vec::new(),
            deadline: cfg.connect_timeout.map(|t| Instant::now() + t),
            pre: None,
        })
    }

    /// The endpoint [`TcpAcceptor::poll`] returns takes over `pre` (see [`TcpFabric::unconnected`]).
    pub fn adopting(mut self, pre: TcpFabric) -> TcpAcceptor {
        self.pre = Some(pre);
        self
    }

    /// Accepts what has arrived; `Ok(Some(fabric))` when every path is complete, `Ok(None)` to call
    /// again, [`Error::Timeout`] (naming the missing streams) after [`TcpConfig::connect_timeout`]
    /// when one is set.
    pub fn poll(&mut self) -> Result<Option<TcpFabric>> {
        self.accept_new()?;
        let mut k = 0;
        while k < self.pending.len() {
            match self.pending[k].read() {
                None => k += 1,
                Some(verdict) => {
                    let ph = self.pending.swap_remove(k);
                    self.file(ph, verdict);
                }
            }
        }
        let complete = self
            .slots
            .iter()
            .all(|s| !s.is_empty() && s.iter().all(Option::is_some));
        if !complete {
            if let Some(d) = self.deadline
                && Instant::now() >= d
            {
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
                    self.cfg.connect_timeout.unwrap_or_default().as_millis(),
                    missing.join(", ")
                )));
            }
            return Ok(None);
        }
        let streams = std::mem::take(&mut self.slots)
            .into_iter()
            .map(|s| s.into_iter().flatten().collect())
            .collect();
        // The listeners stay open for the connection's lifetime: a failed path is rebuilt through
        // them (failback).
        let listeners = std::mem::take(&mut self.listeners);
        let redial = Redial::new(self.key.clone(), &self.cfg, &self.specs, listeners);
        TcpFabric::from_streams(
            &self.specs,
            streams,
            &self.cfg,
            "acceptor",
            self.pre.take(),
            Some(redial),
        )
        .map(Some)
    }

    /// New connections: checks the peer address, then waits for the hello without blocking. At
    /// most [`MAX_PENDING_STREAMS`] per listener per call (a flood waits in the kernel's queue for
    /// the next call). Running out of fds, buffers or memory on `accept` is logged and retried on
    /// the next poll.
    fn accept_new(&mut self) -> Result<()> {
        let now = Instant::now();
        for (i, l) in self.listeners.iter().enumerate() {
            for _ in 0..MAX_PENDING_STREAMS {
                let (sock, from) = match l.accept() {
                    Ok(x) => x,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                        ) =>
                    {
                        let any = IpAddr::from([0, 0, 0, 0]);
                        drop_warn(now, any, || {
                            format!("accepting on TCP path {i} failed for now, retried: {e}")
                        });
                        break;
                    }
                    Err(e) => return Err(Error::io(format!("accepting on TCP path {i}"), e)),
                };
                let want = self.specs[i].remote.ip();
                let refused = if from.ip() != want {
                    Some(format!("the path's peer is {want}"))
                } else {
                    match make_room(&mut self.pending) {
                        Ok(None) => None,
                        Ok(Some(old)) => {
                            drop_warn(now, old.from.ip(), || {
                                format!(
                                    "TCP path {}: dropped the oldest of {MAX_PENDING_STREAMS} connections that sent no whole hello, for a newer one",
                                    old.path
                                )
                            });
                            None
                        }
                        Err(()) => Some(format!(
                            "{MAX_PENDING_STREAMS} connections wait with their hello to check"
                        )),
                    }
                };
                if let Some(why) = refused {
                    drop_warn(now, from.ip(), || {
                        format!("TCP path {i}: connection from {from} refused: {why}")
                    });
                    continue;
                }
                match PendingHello::challenge(sock, from, i, now) {
                    Ok(ph) => self.pending.push(ph),
                    Err(e) => {
                        drop_warn(now, from.ip(), || {
                            format!("TCP path {i}: connection from {from} dropped: {e}")
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// A connection whose hello has arrived (`verdict`: whole, or why not): checks the hello,
    /// acknowledges the stream and files it in its path's slot. A bad one is logged and closed.
    fn file(&mut self, ph: PendingHello, verdict: Result<()>) {
        let (i, from) = (ph.path, ph.from);
        let checked = verdict
            .and_then(|()| ph.check(&self.key, self.specs.len()))
            .and_then(|(h, ack)| match h.generation {
                0 => Ok((usize::from(h.stream), usize::from(h.nstreams), ack)),
                g => Err(Error::Remote(format!(
                    "stream generation {g} while the connection is being set up (generation 0)"
                ))),
            });
        let (s, n, ack) = match checked {
            Ok(x) => x,
            Err(e) => {
                drop_warn(Instant::now(), from.ip(), || {
                    format!("TCP path {i}: connection from {from} rejected: {e}")
                });
                return;
            }
        };
        let slot = &mut self.slots[i];
        if slot.is_empty() {
            slot.resize_with(n, || None);
        }
        if slot.len() != n || slot[s].is_some() {
            drop_warn(Instant::now(), from.ip(), || {
                format!(
                    "TCP path {i}: stream {s} of {n} from {from} conflicts with streams already accepted; closed"
                )
            });
            return;
        }
        let mut sock = ph.sock;
        // 24 bytes into a socket buffer that holds at most the 24-byte challenge: never blocks.
        let sent = sock.set_nodelay(true).and_then(|()| sock.write_all(&ack));
        if let Err(e) = sent {
            tracing::warn!("NET/switchless: TCP path {i}: acknowledging stream {s} to {from}: {e}");
            return;
        }
        slot[s] = Some(sock);
    }
}

/// The largest frame a path's writes are cut into: a relayed path's fit one slot of the relay's
/// staging memory ([`super::config::RELAY_FRAME_BYTES`]).
pub(super) fn frame_bytes(cfg: &TcpConfig, spec: &TcpPathSpec) -> usize {
    if spec.relay.is_some() {
        cfg.frame_bytes.min(super::config::RELAY_FRAME_BYTES)
    } else {
        cfg.frame_bytes
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
            relay: None,
        });
        acc_specs.push(TcpPathSpec {
            local: lo,
            // Streams must come from here.
            remote: SocketAddr::new(lo, 0),
            speed_mbps: speed,
            mtu: 0,
            label: String::new(),
            relay: None,
        });
    }
    let secret = random_secret()?;
    let c = cfg.clone();
    let t = std::thread::spawn(move || TcpFabric::connect(&conn_specs, &secret, &c));
    let acc = TcpFabric::accept(&listeners, &acc_specs, &secret, cfg);
    let con = t
        .join()
        .map_err(|_| Error::Internal("TCP connect thread panicked".into()))?;
    Ok((con?, acc?))
}
